"""Finding models by name: modules of this package, and models registered at run time.

A module ``scalemb/models/<name>.py`` that exports ``MODEL`` (a ``Model``, no parameters) or
``make_model(**params) -> Model`` is a model called ``<name>``: ``MODEL_NAMES`` lists them (found by
``pkgutil``, not written down; every module of the package is imported once to be looked at, so a model
module's import must stay cheap: numba compiles on first call, not at import), ``get_model(name, **params)``
builds one.  ``register_model(model_or_factory)``
adds a model defined elsewhere (a test file, a user's script).

Dask workers rebuild a model from a ``ModelRef`` (``model_ref(model)``): its name, its parameters and, for a
registered model, where it was defined (module name and file).  A worker that does not know the name imports
that module (by name, else from its file), which registers the model again or defines it at module level.
Built models are cached per (name, parameters): the kernels of a ``make_kernels`` closure compile once per
process, not once per task.
"""
import importlib
import importlib.util
import pkgutil
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..repulsion.spec import use_model_registry
from .base import Model
from .objective import Objective

_LOCK = threading.RLock()
_REGISTERED = {}  # name -> (Model or factory, origin)
_CACHE = {}  # (name, params key) -> Model
_DISCOVERED = None  # name -> module name


def _discover() -> dict:
    """``{name: module}`` for the modules of this package that export ``MODEL`` or ``make_model``."""
    global _DISCOVERED
    with _LOCK:
        if _DISCOVERED is None:
            package = sys.modules[__package__]
            found = {}
            for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
                if info.ispkg or info.name.startswith("_"):
                    continue
                module = importlib.import_module(f"{__package__}.{info.name}")
                if hasattr(module, "MODEL") or hasattr(module, "make_model"):
                    found[info.name] = module.__name__
            _DISCOVERED = found
        return _DISCOVERED


def model_names() -> tuple:
    """Every model's name: this package's model modules (sorted), then the registered ones."""
    names = list(_discover())
    return tuple(names + [n for n in _REGISTERED if n not in names])


def _params_key(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def _build(source, name: str, params: dict) -> Model:
    """A ``Model`` from a module, a registered ``Model`` or a factory, with ``params``."""
    model = getattr(source, "MODEL", None) if not isinstance(source, Model) and not callable(source) else None
    factory = source if callable(source) and not isinstance(source, Model) else getattr(source, "make_model", None)
    if isinstance(source, Model):
        model = source
    if factory is not None and (params or model is None):
        built = factory(**params)
    elif params:
        raise ValueError(f"model {name!r} takes no parameters, got {', '.join(sorted(params))}")
    else:
        built = model
    if not isinstance(built, Model):
        raise TypeError(f"model {name!r}: expected a Model, got {type(built).__name__}")
    if built.name != name:
        raise ValueError(f"model registered as {name!r} calls itself {built.name!r}")
    if params and not built.params:
        built = replace(built, params=dict(params))
    return built


def get_model(name: str, **params) -> Model:
    """The model called ``name`` built with ``params`` (cached per process)."""
    key = (name, _params_key(params))
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    if name in _REGISTERED:
        source = _REGISTERED[name][0]
    elif name in _discover():
        source = importlib.import_module(_discover()[name])
    else:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(model_names())}")
    model = _build(source, name, params)
    with _LOCK:
        return _CACHE.setdefault(key, model)


def register_model(model_or_factory, name: str | None = None):
    """Make a model defined outside this package available by name (``get_model``, ``MODEL_NAMES``, the CLI's
    ``--model`` choices, Dask workers).  ``model_or_factory``: a ``Model``, or ``make_model(**params) -> Model``
    (its name is that of ``make_model()`` unless ``name`` is given).  Registering the same name again replaces
    it; a name of this package's modules cannot be taken.  Returns ``model_or_factory`` (usable as a
    decorator)."""
    if isinstance(model_or_factory, Model):
        name = name or model_or_factory.name
    elif callable(model_or_factory):
        name = name or model_or_factory().name
    else:
        raise TypeError(f"register_model takes a Model or a factory, got {type(model_or_factory).__name__}")
    if name in _discover():
        raise ValueError(f"model name {name!r} is taken by scalemb.models.{name}")
    caller = sys._getframe(1).f_globals
    attr = None if isinstance(model_or_factory, Model) else getattr(model_or_factory, "__qualname__", None)
    origin = (caller.get("__name__"), caller.get("__file__"), attr if attr and "<" not in attr else None)
    with _LOCK:
        _REGISTERED[name] = (model_or_factory, origin)
        for key in [k for k in _CACHE if k[0] == name]:
            del _CACHE[key]
    return model_or_factory


def unregister_model(name: str) -> None:
    """Forget a model registered with ``register_model`` (a test's toy model, after the test)."""
    with _LOCK:
        _REGISTERED.pop(name, None)
        for key in [k for k in _CACHE if k[0] == name]:
            del _CACHE[key]


class ModelChoices(Sequence):
    """The model names as a sequence read at each use (``model_names()``): registered models included."""

    def __getitem__(self, index):
        return model_names()[index]

    def __len__(self):
        return len(model_names())

    def __contains__(self, name):
        return name in model_names()

    def __repr__(self):
        return repr(model_names())


@dataclass(frozen=True)
class ModelRef:
    """What a Dask task carries instead of a model: ``name``, ``params`` (sorted items) and, for a registered
    model, ``origin`` = (module name, file, factory's name or None) of the code that registered it.
    ``model()`` rebuilds it."""

    name: str
    params: tuple = ()
    origin: tuple | None = None

    def model(self) -> Model:
        if self.name not in _REGISTERED and self.origin is not None and self.name not in _discover():
            _import_origin(self.name, *self.origin)
        return get_model(self.name, **dict(self.params))


def model_ref(model: Model) -> ModelRef:
    """The ``ModelRef`` of ``model`` (a model of this package or a registered one)."""
    origin = _REGISTERED[model.name][1] if model.name in _REGISTERED else None
    if origin is None and model.name not in _discover():
        raise ValueError(f"model {model.name!r} is neither in scalemb.models nor registered (register_model): "
                         "Dask workers could not rebuild it")
    return ModelRef(model.name, tuple(sorted(model.params.items())), origin)


def _import_origin(name: str, module_name: str | None, path: str | None, attr: str | None) -> None:
    """Import the module that registered model ``name`` (on a worker): by name if importable, else from its file;
    then, if importing did not register it, register the factory ``attr`` of that module or its module-level
    ``Model`` called ``name``."""
    module = sys.modules.get(module_name) if module_name else None
    if module is None and module_name:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
    if module is None:
        if not path:
            raise ValueError(f"cannot find the module {module_name!r} that registered a model")
        spec = importlib.util.spec_from_file_location(module_name or "_scalemb_registered", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    if name in _REGISTERED:
        return
    found = None
    if attr is not None:
        found = module
        for part in attr.split("."):
            found = getattr(found, part)
    else:
        found = next((v for v in vars(module).values() if isinstance(v, Model) and v.name == name), None)
    if found is None:
        raise ValueError(f"module {module.__name__!r} defines no model {name!r}")
    with _LOCK:
        _REGISTERED[name] = (found, (module_name, path, attr))


def model_of(result):
    """The model of a stored run (``scalemb.embedding.EmbeddingResult``) with its parameters, or None for a run of
    another method (the spectral eigenmaps, ``scalemb.eigenmaps``: no output kernel, no objective)."""
    if result.model not in model_names():
        return None
    return get_model(result.model, **(getattr(result, "model_params", None) or {}))


def objective_of(result) -> Objective:
    """The objective of a stored run: its model's, or the unnamed ``Objective()`` for a run without a model."""
    model = model_of(result)
    return Objective() if model is None else model.objective


use_model_registry(get_model, model_names)  # model names stand for models in scalemb.repulsion too
