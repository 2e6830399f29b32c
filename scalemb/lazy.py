"""A package's public names imported on first use (PEP 562 module ``__getattr__``).

Why: a process that needs one corner of scalemb should not pay for all of it.  ``import scalemb`` used to import
every front (scikit-learn for the estimators' base, pandas and scipy.stats with it, zarr, dask): 3-4 s of CPU in
every process that touched the package -- each CLI call, each Dask worker unpickling its first task, each service
job process.  A package ``__init__`` names where each public name lives instead; ``from package import name`` and
``package.name`` import that submodule alone, once.  No public name may equal a submodule's name unless it *is*
that submodule: importing the submodule would rebind the package attribute to the module."""
import importlib
import importlib.util
import sys


def lazy_attributes(package: str, where: dict) -> tuple:
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``): ``where`` maps each public name to the
    relative module defining it (``{"Affinity": ".affinity"}``); a name mapped to ``"." + name`` is that
    submodule itself.  Any other submodule is imported when first reached as an attribute."""

    def __getattr__(name: str):
        if name not in where:
            # a submodule reached as an attribute (``scalemb.affinity.knn``), as when the package imported them all
            if name.startswith("_") or importlib.util.find_spec(f"{package}.{name}") is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            return importlib.import_module(f"{package}.{name}")
        module = importlib.import_module(where[name], package)
        value = module if where[name] == "." + name else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
