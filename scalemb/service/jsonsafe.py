"""The service's one JSON encoding: every non-finite float becomes ``null``, in SQLite and in responses.

JSON has no ``Infinity`` or ``NaN`` (RFC 8259, section 6); Python's ``json`` writes them by default and
Starlette's response refuses them (``allow_nan=False``), so a record holding one (a diverged job's KL history)
answered 500 to every listing.  Here a number is either finite or ``null``: ``finite`` maps the floats,
``dumps`` writes with ``allow_nan=False`` (a non-finite float reaching it is a bug, not output), ``loads`` reads
the ``Infinity``/``NaN`` tokens a record written before this rule may hold as ``null``, and ``JSONResponse`` is
the application's default response class.
"""
import json
import math

from starlette.responses import JSONResponse as _StarletteJSONResponse


def finite(value):
    """``value`` with every non-finite float (Python or NumPy) in it, at any depth of dicts, lists and
    tuples, replaced by ``None``; NumPy scalars become Python numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if hasattr(value, "dtype") and getattr(value, "shape", None) == ():  # a NumPy scalar
        return finite(value.item())
    return value


def dumps(value) -> str:
    return json.dumps(finite(value), allow_nan=False)


def loads(text: str):
    return json.loads(text, parse_constant=lambda token: None)  # 'Infinity', '-Infinity', 'NaN'


class JSONResponse(_StarletteJSONResponse):
    """Starlette's JSON response through ``dumps`` (compact, UTF-8, non-finite floats as ``null``)."""

    def render(self, content) -> bytes:
        return json.dumps(finite(content), ensure_ascii=False, allow_nan=False, indent=None,
                          separators=(",", ":")).encode("utf-8")
