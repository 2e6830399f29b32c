"""``scalemb serve``: an HTTP JSON API running embedding jobs in-process or on a Dask cluster."""
from .app import ServiceConfig, create_app, serve

__all__ = ["ServiceConfig", "create_app", "serve"]
