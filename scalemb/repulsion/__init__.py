"""All-pairs repulsion approximated by FFT-accelerated polynomial interpolation (``scalemb.repulsion.fft``),
and the choice between it and the exact kernel (``scalemb.repulsion.method``)."""
from .convolution import Convolution, convolve
from .fft import fft_repulsion, interpolate, spread
from .grid import Grid, block_extent, grid_for, make_grid
from .spec import DEFAULT_INTERPOLATION, FFTParams, FFTSpec, check_supported, fft_spec
from .method import AUTO_FFT_MIN_POINTS, REPULSION_METHODS, resolve_repulsion

__all__ = ["AUTO_FFT_MIN_POINTS", "Convolution", "DEFAULT_INTERPOLATION", "FFTParams", "FFTSpec", "Grid",
           "REPULSION_METHODS", "block_extent", "check_supported", "convolve", "fft_repulsion", "fft_spec",
           "grid_for", "interpolate", "make_grid", "resolve_repulsion", "spread"]
