"""What marks a Zarr group as scalemb's own output: one of these keys in its root attributes (``zarr.json``).
Local (``io.atomic``) and object-storage (``io.storage``) outputs are recognised by the same keys, so an
``overwrite`` replaces only what scalemb wrote, wherever it is."""

MARKERS = ("scalemb_checkpoint", "scalemb_version", "scalemb")


def has_marker(attrs) -> bool:
    """Whether a group's root attributes ``attrs`` carry a scalemb marker."""
    return isinstance(attrs, dict) and any(key in attrs for key in MARKERS)
