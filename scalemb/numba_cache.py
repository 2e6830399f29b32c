"""On-disk numba cache for kernels compiled from closures (``models.kernels.make_kernels``, CO-SNE's kernels per
``gamma``, ``metrics.ranking``'s kernels per similarity).

``@njit(cache=True)`` keys a closure's cache entries by a pickle of its captured values; a captured numba
function pickles with a random per-process UUID (numba issue #6264), so every process missed the cache,
compiled again and added files.  ``disk_cached(f)`` gives ``f`` numba's own cache with one change: the key is
``fingerprint(f)``, a hash of everything the compiled code is made from, computed the same in every process:
the bytecode, constants and names of ``f`` and, recursively, of every function or numba function it captures
or reads as a global (with the numba functions' compile options), and the values of captured or global numbers,
strings, tuples and arrays (modules by name).  Each fingerprint has its own index and data files (named
``<function>-<lineno>.<fingerprint>.pyXY.nbi`` beside numba's), so closures of different models never share an
index.  As for any numba cache the entries are also dropped when the defining source file changes (its stamp).
What is loaded is the machine code compiled before for the same inputs: results are bit-identical to compiling.
"""
import hashlib
import types

import numpy as np
from numba.core.caching import FunctionCache, IndexDataCacheFile
from numba.core.dispatcher import Dispatcher


def _feed_code(code: types.CodeType, h, seen: set) -> None:
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_argcount,
                   code.co_kwonlyargcount, code.co_flags)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed_code(const, h, seen)
        else:
            _feed(const, h, seen)


def _names(code: types.CodeType):
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _feed_function(obj: types.FunctionType, h, seen: set) -> None:
    """A Python function: its name, and once per hash its code, the globals it names, its closure and
    defaults."""
    h.update(f"function {obj.__module__}.{obj.__qualname__}".encode())
    if id(obj) in seen:
        return
    seen.add(id(obj))
    _feed_code(obj.__code__, h, seen)
    for name in sorted(set(_names(obj.__code__))):
        if name in obj.__globals__:
            h.update(f"global {name}".encode())
            _feed(obj.__globals__[name], h, seen)
    for cell in obj.__closure__ or ():
        _feed(cell.cell_contents, h, seen)
    _feed(obj.__defaults__, h, seen)


def _feed(obj, h, seen: set) -> None:
    """Add what ``obj`` contributes to compiled code to the hash ``h`` (module docstring)."""
    if isinstance(obj, Dispatcher):
        h.update(b"numba function")
        _feed(tuple(sorted(obj.targetoptions.items())), h, seen)
        obj = obj.py_func
    if isinstance(obj, types.FunctionType):
        _feed_function(obj, h, seen)
    elif obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, np.generic)):
        h.update(f"{type(obj).__name__} {obj!r}".encode())
    elif isinstance(obj, (tuple, list)):
        h.update(f"{type(obj).__name__} {len(obj)}".encode())
        for item in obj:
            _feed(item, h, seen)
    elif isinstance(obj, (set, frozenset)):
        _feed(sorted(obj, key=repr), h, seen)
    elif isinstance(obj, dict):
        _feed(sorted(obj.items(), key=lambda kv: repr(kv[0])), h, seen)
    elif isinstance(obj, np.ndarray):
        h.update(f"array {obj.dtype.str} {obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, types.ModuleType):
        h.update(f"module {obj.__name__}".encode())
    else:  # classes, numba types, enums: their identity by name
        h.update(f"{type(obj).__module__}.{type(obj).__qualname__} {getattr(obj, '__qualname__', repr(obj))}"
                 .encode())


def fingerprint(function) -> str:
    """The hex SHA-256 of what the numba function (or Python function) ``function`` compiles from."""
    h = hashlib.sha256()
    _feed(function, h, set())
    return h.hexdigest()


class _FingerprintCache(FunctionCache):
    """numba's per-function cache with the closure part of the key replaced by a stable fingerprint."""

    def __init__(self, py_func, key: str):
        super().__init__(py_func)
        self._fingerprint = key
        base = self._impl.filename_base  # '<module>.<qualname>-<lineno>.pyXY'
        stem, _, python = base.rpartition(".")
        self._cache_file = IndexDataCacheFile(cache_path=self._cache_path, filename_base=f"{stem}.{key[:16]}.{python}",
                                              source_stamp=self._impl.locator.get_source_stamp())

    def _index_key(self, sig, codegen):
        return sig, codegen.magic_tuple(), (hashlib.sha256(self._py_func.__code__.co_code).hexdigest(),
                                            self._fingerprint)


def disk_cached(function):
    """``function`` (a numba dispatcher not yet called) with its compiled code cached on disk under its
    fingerprint (module docstring); returns it."""
    function._cache = _FingerprintCache(function.py_func, fingerprint(function))
    return function
