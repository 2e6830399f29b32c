"""Files in and out, below everything that reads or writes one: the input readers (edge lists in every format,
node ids, the synthetic co-authorship generator) and how any output reaches its place whole (``atomic``: local
directories and files published by one rename, temporaries, locks; ``storage``: object-storage inputs and
outputs; ``markers``: what marks a group as scalemb's).  What scalemb's records hold is ``scalemb.store``'s."""

_MOVED = {"to_anndata": "scalemb.store.to_anndata"}  # names this package held before the records moved to store


def __getattr__(name: str):
    """A name that moved to ``scalemb.store`` says where it went (an AttributeError, as for any missing name; no
    import of ``store`` from here: it sits above ``io``)."""
    if name in _MOVED:
        raise AttributeError(f"scalemb.io.{name} moved to {_MOVED[name]}")
    raise AttributeError(f"module 'scalemb.io' has no attribute {name!r}")
