"""Output-similarity models.  Add a model by writing one module with ``log_pair``/``pair`` and a ``MODEL``."""
from importlib import import_module

from .base import Model

MODEL_NAMES = ("sne", "tsne", "snest")


def get_model(name: str) -> Model:
    """Return the model called ``name`` (one of ``MODEL_NAMES``)."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    return import_module(f"{__name__}.{name}").MODEL


__all__ = ["Model", "MODEL_NAMES", "get_model"]
