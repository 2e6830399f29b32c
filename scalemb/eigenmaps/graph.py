"""The graph Laplacian eigenmap solver moved to ``scalemb.engine.eigenmap`` (the spectral start and the
eigenmaps share it); this module keeps the old import path working."""
from ..engine import eigenmap as _solver
from ..engine.eigenmap import *  # noqa: F401,F403

globals().update({name: value for name, value in vars(_solver).items() if not name.startswith("__")})
