"""Output-similarity models.  A model is one module here exporting ``MODEL`` or ``make_model(**params)`` (see
``base.Model`` for the contract and ``registry`` for how models are found); ``MODEL_NAMES`` is discovered."""
from .base import Model
from .objective import KL, Objective
from .registry import ModelChoices, ModelRef, get_model, model_names, model_ref, register_model, unregister_model

# The model an embedding uses when none is named (the CLI's, the service's and scalemb.embed's default: the SNEST
# paper's showcase) and the estimator's (scalemb.Embedder: 2-D t-SNE, what scikit-learn, openTSNE and scanpy
# users expect of an embedding estimator).
DEFAULT_MODEL = "snest"
ESTIMATOR_MODEL = "tsne"


def __getattr__(name):
    if name == "MODEL_NAMES":  # computed on access: the package's model modules and the registered models
        return model_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_MODEL", "ESTIMATOR_MODEL", "KL", "MODEL_NAMES", "Model", "ModelChoices", "ModelRef", "Objective",
           "get_model", "model_names", "model_ref", "register_model", "unregister_model"]
