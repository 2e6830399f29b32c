"""Output-similarity models.  A model is one module here exporting ``MODEL`` or ``make_model(**params)`` (see
``base.Model`` for the contract and ``registry`` for how models are found); ``MODEL_NAMES`` is discovered."""
from .base import Model
from .objective import KL, Objective
from .registry import ModelChoices, ModelRef, get_model, model_names, model_ref, register_model, unregister_model

# The model an embedding uses when none is named (the estimator's, the CLI's and the service's default).
DEFAULT_MODEL = "snest"


def __getattr__(name):
    if name == "MODEL_NAMES":  # computed on access: the package's model modules and the registered models
        return model_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_MODEL", "KL", "MODEL_NAMES", "Model", "ModelChoices", "ModelRef", "Objective", "get_model",
           "model_names", "model_ref", "register_model", "unregister_model"]
