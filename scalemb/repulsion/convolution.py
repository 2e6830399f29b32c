"""The FFT convolution of the interpolation grid's charges with the kernel (``scalemb.repulsion.fft``'s module
docstring states the method): the kernel's spectrum per FFT length (cached, ``kernel_spectrum``), the whole
convolution in one process (``convolve``) or split into shares among Dask workers (``convolve_share``,
``join_convolution``), single precision on 2-D and 3-D grids (``fft_dtype``).  ``grid`` arguments are
``scalemb.repulsion.grid.Grid`` values, read by attribute."""
import math
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import scipy.fft
from numba import njit

from .threads import thread_count, threads_for

def _offsets(n: int, padded: int, spacing: float) -> np.ndarray:
    """Node-difference coordinates in circular FFT order: ``m h`` at index m and ``(m - M) h`` at the end."""
    off = np.zeros(padded)
    off[:n] = np.arange(n) * spacing
    off[padded - n + 1:] = -np.arange(n - 1, 0, -1) * spacing
    return off


def _kernel_key(grid) -> tuple:
    """What a space kernel's grid depends on: node differences, FFT lengths and node spacing per space dimension,
    sigma.  The differences are those of the most nodes each FFT length holds, ``(M + 1) // 2`` for length ``M``
    (``2 n - 1 <= M``), not of the grid's ``n``: the circulant then holds ``K(m h)`` for every ``|m| <= (M - 1) // 2``,
    which contains the ``|m| < n`` a linear convolution of ``n`` nodes reads (charges are zero beyond node
    ``n - 1`` and potentials beyond it are cropped), so one spectrum serves every node count of the same FFT
    length.  While a layout grows, its box count changes every few evaluations and the FFT length (the next
    5-smooth number, ``Grid.padded``) ~half as often: half the spectra are computed."""
    ds = grid.space_dims
    padded = grid.padded()
    return (tuple((m + 1) // 2 for m in padded), padded,
            tuple(float(grid.box_width[k] / grid.points[k]) for k in range(ds)), float(grid.sigma))


def fft_dtype(space_dims: int):
    """Precision of the convolution's FFTs: single on 2-D and 3-D grids, where it halves their time and memory
    and its rounding (~1e-7 of the largest potential) stays far below the interpolation error (>= 1e-5
    relative; tests/test_fft_repulsion.py measures both against the exact kernel); double on 1-D grids, which
    are cheap and whose converged SNEST R^{1,1} layouts lose accuracy in single (gradient error 4e-4 -> 7e-4).
    Spreading and interpolation accumulate in double."""
    return np.float64 if space_dims == 1 else np.float32


def _kernel_values(kernel, nodes, padded, spacings, sigma) -> np.ndarray:
    """``K(x_m - x_0)`` of a space kernel for every space node difference, zero-padded to the FFT lengths
    (circulant embedding of the Toeplitz node-to-node matrix)."""
    deltas = []
    for k, (n, m, h) in enumerate(zip(nodes, padded, spacings)):
        shape = [1] * len(padded)
        shape[k] = m
        deltas.append(_offsets(n, m, h).reshape(shape))
    return np.ascontiguousarray(np.broadcast_to(kernel(deltas, sigma), padded))


# Kernel spectra kept (``kernel_spectrum``): two grids' worth for t-SNE and SNE (three kernels each), so that an
# optimiser whose trial steps alternate between two box counts reuses both (~33 MB each at N = 7.7e5).
SPECTRUM_CACHE = 6
_spectra: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
_spectra_lock = threading.Lock()


def kernel_spectrum(grid, kernel, workers: int = 1) -> np.ndarray:
    """The FFT of the space kernel's node-difference values (``_kernel_values``; computed in double, kept in
    ``fft_dtype``'s complex type).  Uncapped grids keep their node spacing between evaluations
    (``make_grid``), so the last ``SPECTRUM_CACHE`` spectra are kept, keyed by the kernel and what its values
    depend on (``_kernel_key``: FFT lengths, spacing, sigma), and reused while the FFT lengths are unchanged (two
    of an evaluation's eight FFTs for t-SNE; every trial of a line search that keeps the FFT lengths).
    Not by ``workers``: scipy's transforms give the same values on any number of threads."""
    key = (kernel, *_kernel_key(grid))
    with _spectra_lock:
        if key in _spectra:
            _spectra.move_to_end(key)
            return _spectra[key]
    nodes, padded, spacings, sigma = key[1:]
    values = _kernel_values(kernel, nodes, padded, spacings, sigma)
    spectrum = scipy.fft.rfftn(values, workers=workers).astype(np.result_type(fft_dtype(len(nodes)), np.complex64))
    spectrum.flags.writeable = False
    with _spectra_lock:
        _spectra[key] = spectrum
        while len(_spectra) > SPECTRUM_CACHE:
            _spectra.popitem(last=False)
    return spectrum


def _inverse_cropped(product: np.ndarray, padded: tuple, nodes: tuple, workers: int) -> np.ndarray:
    """``irfftn`` over the leading ``len(padded)`` axes (the space axes; a time axis, if any, trails), cropped
    to the first ``nodes`` entries of each: the complex inverse transforms run axis by axis and drop the rows
    outside the crop before the next axis (half the work of transforming everything and cropping at the end),
    the real one runs last."""
    ds = len(padded)
    x = product
    for k in range(ds - 1):
        x = scipy.fft.ifft(x, axis=k, workers=workers, overwrite_x=True)[(slice(None),) * k + (slice(0, nodes[k]),)]
    x = scipy.fft.irfft(x, n=padded[-1], axis=ds - 1, workers=workers, overwrite_x=True)
    return x[(slice(None),) * (ds - 1) + (slice(0, nodes[ds - 1]),)]


def _forward_padded(charge: np.ndarray, padded: tuple, workers: int) -> np.ndarray:
    """``rfftn(charge, s=padded)`` over the leading ``len(padded)`` axes, pruned: the real transform of the
    last space axis runs on the charge's rows only, before the complex ones zero-pad the other axes (the
    padded rows are zero, so their transforms are skipped: ~1/4 of a 2-D transform's work)."""
    ds = len(padded)
    x = scipy.fft.rfft(charge, n=padded[-1], axis=ds - 1, workers=workers)
    for k in range(ds - 2, -1, -1):
        x = scipy.fft.fft(x, n=padded[k], axis=k, workers=workers, overwrite_x=True)
    return x


def _parseval_node_sum(kernel: np.ndarray, spectrum: np.ndarray, padded: tuple) -> float:
    """``sum_m C_m (K * C)_m`` (circular convolution over the padded grid, which for charges zero outside
    the nodes is the linear one) from the half spectra of a grid without a time axis: ``(1/M) sum_f K^_f
    |C^_f|²``, the rfft axis' interior frequencies counted twice."""
    last = spectrum.shape[-1]
    weights = np.full(last, 2.0)
    weights[0] = 1.0
    if padded[-1] % 2 == 0:
        weights[-1] = 1.0
    total = _weighted_power(np.ascontiguousarray(kernel).reshape(-1, last),
                            np.ascontiguousarray(spectrum).reshape(-1, last), weights)
    return total / math.prod(padded)


@njit(cache=True, nogil=True, error_model="numpy")
def _weighted_power(kernel, spectrum, weights):
    """``sum_rc weights_c Re(kernel_rc) |spectrum_rc|²``, accumulated in double (one pass, no temporaries)."""
    total = 0.0
    for r in range(spectrum.shape[0]):
        row = 0.0
        for c in range(spectrum.shape[1]):
            x = spectrum[r, c]
            row += weights[c] * (np.float64(kernel[r, c].real) * (np.float64(x.real) ** 2 + np.float64(x.imag) ** 2))
        total += row
    return total


class Convolution(NamedTuple):
    """``convolve``'s result: ``potentials`` at the nodes, ``(n_potentials, n_nodes)``, and ``z``, the part of
    Z taken on the grid (``Plan.z_kernel``; 0 when Z is interpolated from an output)."""

    potentials: np.ndarray
    z: float


def convolve(grid, charges: np.ndarray, workers: int = 1) -> Convolution:
    """Potentials at the nodes: ``sum_n K_c(x_m - x_n) C_n`` for each planned space kernel ``K_c`` (run once
    per evaluation, on the summed unit charges): zero-padded FFT convolutions over the space axes in
    ``fft_dtype``, and, if planned, Z's grid part ``sum_m C_m (K_z * C)_m`` (``_parseval_node_sum``; the self
    pairs are removed per row by ``interpolate``).  A time axis' components are convolved alike, one at a
    time on each of ``workers`` threads (one forward and one inverse transform per kernel in flight each).
    The one share of ``convolve_share`` that holds everything."""
    if charges.shape != (grid.n_nodes,):
        raise ValueError(f"charges must have shape {(grid.n_nodes,)}, got {charges.shape}")
    share = convolve_share(grid, charges, 0, 1, workers)
    return Convolution(share.values.reshape(grid.n_potentials, grid.n_nodes), share.z)


class ConvolutionShare(NamedTuple):
    """Share ``share`` of ``shares`` of a convolution (``convolve_share``): without a time axis the potential
    columns ``share, share + shares, ...`` (``values``: ``(columns, n_nodes)``) and Z's grid part in the last
    share (``z``; 0 elsewhere and without one); with one, the time components ``share, share + shares, ...`` of
    every column (``values``: ``(n_potentials, components) + space nodes``)."""

    share: int
    shares: int
    values: np.ndarray
    z: float


def convolution_shares(grid) -> int:
    """Into how many independent shares ``convolve_share`` can split the grid's convolution: its potential
    columns (no time axis; each share transforms the charges forward itself) or its time components."""
    return grid.n_potentials if grid.time_in is None else grid.nodes[0]


# Fewest grid nodes per thread worth a thread of scipy's transforms (a grid without a time axis): below it they
# took more wall time on two threads than on one, for more CPU -- and a t-SNE run's grid grows from ~1e4 nodes,
# so on a 1e4-1e5-point data set most evaluations are below it (docs/design/repulsion.md, "Threads for the grid
# stages").
TRANSFORM_NODES_PER_THREAD = 2 ** 16


def convolve_share(grid, charges: np.ndarray, share: int, shares: int, workers: int = 1) -> ConvolutionShare:
    """Share ``share`` of ``shares`` of ``convolve`` (``ConvolutionShare``): the same transforms, on the same
    numbers, as ``convolve`` runs for those columns or time components, so ``join_convolution`` of all shares is
    ``convolve``'s result bit for bit (scipy's transforms give the same values on any number of threads).

    Why: a Dask evaluation's convolution is one task; split among the workers (each with the summed charges),
    no worker waits for another's whole convolution (``DaskExecutor._halo_partials``).  Without a time axis every
    share repeats the forward transform (~a third of the work for t-SNE R^2: one forward, two inverse), which is
    cheaper than sending its padded spectrum."""
    if not 0 <= share < shares:
        raise ValueError(f"share must be in [0, {shares}), got {share}")
    if grid.time_in is None:
        threads = threads_for(workers, grid.n_nodes, TRANSFORM_NODES_PER_THREAD)  # one per so many nodes
        return _space_share(grid, charges, share, shares, threads)
    return _time_share(grid, charges, share, shares, workers)


def _space_share(grid, charges: np.ndarray, share: int, shares: int, workers: int) -> ConvolutionShare:
    """``convolve_share`` of a grid without a time axis: the potential columns ``share, share + shares, ...``,
    each share transforming the charges forward itself, on ``workers`` threads per transform."""
    ds = grid.space_dims
    padded = grid.padded()
    plan = grid.plan
    columns = list(range(share, grid.n_potentials, shares))
    kernels = [kernel_spectrum(grid, plan.kernels[plan.potentials[c]], workers) for c in columns]
    values = np.empty((len(columns), grid.n_nodes), dtype=fft_dtype(ds))
    z = 0.0
    with_z = plan.z_kernel is not None and share == shares - 1
    if columns or with_z:
        spectrum = _forward_padded(charges.reshape(grid.nodes).astype(fft_dtype(ds)), padded, workers)
        for i, kernel in enumerate(kernels):
            values[i] = _inverse_cropped(kernel * spectrum, padded, grid.nodes, workers).ravel()
        if with_z:
            z = _parseval_node_sum(kernel_spectrum(grid, plan.kernels[plan.z_kernel], workers), spectrum, padded)
    return ConvolutionShare(share, shares, values, z)


def _time_share(grid, charges: np.ndarray, share: int, shares: int, workers: int) -> ConvolutionShare:
    """``convolve_share`` of a grid with a time axis: every column of the time components ``share, share +
    shares, ...``, one component at a time on each of ``workers`` threads."""
    ds = grid.space_dims
    padded = grid.padded()
    plan = grid.plan
    kernels = [kernel_spectrum(grid, plan.kernels[plan.potentials[c]], workers) for c in range(grid.n_potentials)]
    by_component = charges.reshape(grid.nodes)
    components = range(share, grid.nodes[0], shares)
    out = np.empty((grid.n_potentials, len(components)) + grid.space_nodes, dtype=fft_dtype(ds))

    def component(i):
        spectrum = _forward_padded(by_component[components[i]].astype(fft_dtype(ds)), padded, 1)
        product = np.empty_like(spectrum)
        for column, kernel in enumerate(kernels):
            out[column, i] = _inverse_cropped(np.multiply(kernel, spectrum, out=product), padded, grid.space_nodes, 1)

    threads = min(thread_count(workers), len(components))
    if threads <= 1:
        for i in range(len(components)):
            component(i)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(component, range(len(components))))
    return ConvolutionShare(share, shares, out, 0.0)


def join_convolution(grid, shares: list) -> Convolution:
    """``convolve``'s result from all of its shares (``ConvolutionShare``, any order)."""
    if len(shares) == 1 and shares[0].shares == 1:
        return Convolution(shares[0].values.reshape(grid.n_potentials, grid.n_nodes), shares[0].z)
    if sorted(s.share for s in shares) != list(range(len(shares))) or any(s.shares != len(shares) for s in shares):
        raise ValueError(f"need every share of the convolution once, got {[(s.share, s.shares) for s in shares]}")
    potentials = np.empty((grid.n_potentials, grid.n_nodes), dtype=fft_dtype(grid.space_dims))
    z = 0.0
    for s in shares:
        if grid.time_in is None:
            potentials[s.share::s.shares] = s.values
        else:
            potentials.reshape((grid.n_potentials,) + grid.nodes)[:, s.share::s.shares] = s.values
        z = s.z if s.share == s.shares - 1 else z
    return Convolution(potentials, z)
