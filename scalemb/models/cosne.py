"""CO-SNE (Guo, Guo & Yu 2022): embedding in the Poincaré ball with a hyperbolic Cauchy output kernel.

Output kernel (the paper's eq. 9 without its constant ``1/(πγ)``, which cancels in ``q = w / Z``)::

    w_ij = γ² / (d_ij² + γ²) = 1 / (1 + d_ij²/γ²),   d_ij = d_B(y_i, y_j) = arcosh(1 + δ_ij),
    δ_ij = 2 |y_i - y_j|² / (α_i α_j),   α_i = 1 - |y_i|²                       (γ = 0.1 by default).

Its logarithmic derivative (chain rule through the distance; the paper's eq. 13 for ``∇d``, which is right; its
eq. 12 is written for the Student-t kernel, and the public code's ``1 - |u|`` for ``α`` is wrong)::

    ∂ log w_ij / ∂y_i = -2 d/(d² + γ²) ∇_i d,   ∇_i d = 4/(α_i α_j √(δ(δ+2))) [(y_i - y_j) + |y_i - y_j|² y_i/α_i]
                     = a_ij [(y_i - y_j) + |y_i - y_j|² y_i / α_i],   a_ij = -8 h(δ) w_ij / (γ² α_i α_j),

with ``h(δ) = arcosh(1+δ)/√(δ(δ+2))`` (smooth, ``h(0) = 1``; its series ``1 - δ/3 + 2δ²/15`` below
``δ = 1e-5``), so nothing is singular when two points meet.  Unlike a Euclidean kernel the derivative with
respect to ``y_j`` is not minus the one with respect to ``y_i``: the radial term ``|Δ|² y/α`` belongs to each end's
own coordinates.  The pair kernels therefore scatter ``a (y_i - y_j)`` with opposite signs and accumulate the
radial scalar ``a |Δ|²`` per point, applied as ``(Σ a |Δ|²) y_p / α_p`` at the end.

The KL part is the engine's ordered-pair KL (``A``, ``R`` as in ``kernels``: gradient ``2 (R/Z - α A)``).  The
objective is the paper's ``λ1 KL + λ2 H`` (eq. 11) with ``H = mean_i (|x_i|² - |y_i|²)²`` (eq. 10; ``|x_i|`` the
per-point target radii, ``affinity.radii``).  Two choices, both because of what the paper actually optimises:

* the paper's gradient of H (eq. 14, ``-4 (|x_i|² - |y_i|²) y_i``, also its code's) is the gradient of the *sum*
  ``N H``, not of the mean: its defaults λ1 = 10, λ2 = 0.01 are tuned for that, so the term we add is
  ``λ2 N H`` (with the mean's own gradient λ2 = 0.01 would do nothing measurable at N = 100);
* we minimise the paper's objective divided by λ1, ``KL + (λ2/λ1) N H``: the same minimiser (the paper itself
  calls λ1 and λ2 learning rates), at the KL scale the engine's step sizes and reports are made for.

``H`` is switched on once the optimiser's ``iteration`` reaches ``warmup`` (the paper's stage-wise training,
500 iterations); an evaluation outside an optimisation (``iteration`` None) includes it.  Reported values:
``Evaluation.kl`` is this objective; ``norm_loss`` gives H alone.

Optimisation (docs/design/optimisation.md): Riemannian delta-bar-delta is the default (``auto``); its
learning rate is t-SNE's ``max(1, N/12)`` times ``learning_rate_scale = 4γ²`` (the kernel's length is γ and the
Poincaré metric at the origin is 2: at N = 1000 the unscaled rate throws the points onto the boundary, where the
Riemannian gradient vanishes, KL 2.73 against 1.06).  ``curvature`` gives the weights of the Laplacian part
``a (y_i - y_j)`` of the attraction (its radial part is left out), which the spectral direction can use; it was
measured worse than delta-bar-delta, so it is not the default.

Every kernel has the signature of ``kernels.make_kernels``' outputs; the time dimensions do not exist
(``has_time=False``), so ``space_dims`` is the number of coordinates.  Coordinates are assumed strictly inside
the ball (the geometry's retraction keeps them there).
"""
import functools
import math

import numpy as np
from numba import njit

from ..geometry import POINCARE
from ..numba_cache import disk_cached
from .base import Model
from .kernels import pair_segment, partners_of, scatter_forces
from ..vecmath import fast_log, scratch, scratch_row, wide_vectors

DEGREE_RADIUS_SCALE = 0.5  # c of degree_radii (measured on GrQc: docs/design/inputs.md)
SERIES_BELOW = 1e-5  # δ below which h(δ) = 1 - δ/3 + 2δ²/15 (truncation ~δ³/16 < 1e-16)
DEFAULTS = {"gamma": 0.1, "lambda1": 10.0, "lambda2": 0.01, "warmup": 500}
# gamma's range: six orders of magnitude either side of the default keep gamma², 1/gamma² (times the 1/alpha² of
# points near the boundary, up to 1e32) and the learning-rate scale 4 gamma² inside float64's range (1e-200 made
# 1/gamma² overflow, 1e300 made gamma² overflow); nothing useful lies outside (the ball's distances are < 75).
GAMMA_RANGE = (1e-6, 1e6)


def degree_radii(degree, scale: float = DEGREE_RADIUS_SCALE) -> np.ndarray:
    """CO-SNE's target radii for a graph, hubs inside: ``tanh(c log(k_max/k))`` from node degrees k.  The
    hyperbolic radius ``ρ = 2c log(k_max/k)`` is the hyperbolic random-graph relation ``ρ ≈ R - 2 log k``
    (Krioukov et al. 2010) shifted so that the largest hub sits at the centre and scaled by ``c``; the ball's
    Euclidean radius is ``tanh(ρ/2)``.  ``c`` was chosen by measurement on GrQc (docs/design/inputs.md).  Degree 0
    (an isolated node) counts as 1."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    degree = np.maximum(np.asarray(degree, dtype=np.float64), 1.0)
    return np.tanh(scale * np.log(degree.max() / degree))


def target_radii(affinity) -> np.ndarray:
    """CO-SNE's target radii for ``affinity`` (an ``Affinity`` or ``AffinityStore``): its stored ``radii`` (the
    input points' norms), else ``degree_radii`` of the non-zeros per row of P (P has a zero diagonal)."""
    radii = getattr(affinity, "radii", None)
    if radii is not None:
        return radii
    indptr = affinity.P.indptr if hasattr(affinity, "P") else affinity.indptr
    return degree_radii(np.diff(indptr))


@njit(inline="always", fastmath=True, error_model="numpy")
def pair_terms(d2, ia_i, ia_j, inv_g2):
    """``(log w, w, a)`` for one pair from ``d2 = |y_i - y_j|²`` and ``ia = 1/α`` (module docstring)."""
    delta = 2.0 * d2 * ia_i * ia_j
    s = math.sqrt(delta * (delta + 2.0))
    series = 1.0 - delta * (1.0 / 3.0 - delta * (2.0 / 15.0))
    dist_log = fast_log(1.0 + delta + s)
    small = delta < SERIES_BELOW
    h = series if small else dist_log / max(s, 1e-300)
    dist = series * s if small else dist_log
    u = dist * dist * inv_g2
    w = 1.0 / (1.0 + u)
    return -fast_log(1.0 + u), w, -8.0 * h * w * inv_g2 * ia_i * ia_j


def hyperboloid(Y) -> np.ndarray:
    """Rows of ``Y`` (N x d, inside the unit ball) lifted to the hyperboloid, ``(2y, 1 + |y|²)/(1 - |y|²)``
    (N x (d+1), the last column the "time" coordinate x0).  There ``|Δx|² - Δx0² = 2 (cosh d_B - 1)``."""
    Y = np.asarray(Y, dtype=np.float64)
    n2 = np.sum(Y * Y, axis=1, keepdims=True)
    return np.hstack([2.0 * Y, 1.0 + n2]) / (1.0 - n2)


@njit(inline="always")
def similarity(d2s, d2t):
    """``-(|Δx|² - Δx0²) = -2 (cosh d_B - 1)`` on hyperboloid coordinates (``hyperboloid``, x0 as the time
    column): strictly decreasing in the Poincaré distance, the neighbour order of ``scalemb.metrics``."""
    return d2t - d2s


@njit(inline="always")
def _inverse_alpha(Y, p):
    n2 = 0.0
    for k in range(Y.shape[0]):
        n2 += Y[k, p] * Y[k, p]
    return 1.0 / (1.0 - n2)


@functools.lru_cache(maxsize=None)
def make_kernels(gamma: float):
    """The four row-block kernels (``kernels.make_kernels`` signatures) for scale ``gamma`` (compiled once per
    value in a process, cached on disk as ``kernels.make_kernels``' are)."""
    inv_g2 = 1.0 / (gamma * gamma)
    kernels = (_attraction(inv_g2), _repulsion(inv_g2), _curvature(inv_g2), _cross_repulsion(inv_g2))
    return tuple(disk_cached(kernel) for kernel in kernels)


@njit(inline="always")
def _inverse_alphas(Y, out):
    """``out[p] = 1 / (1 - |y_p|²)`` for every column of ``Y``."""
    for p in range(Y.shape[1]):
        out[p] = _inverse_alpha(Y, p)


@njit(inline="always")
def _add_radial(R, radial, ia, Y):
    """The radial parts of the all-pairs forces, ``R[:, p] += radial_p / alpha_p y_p``, added once per point."""
    for p in range(Y.shape[1]):
        if radial[p] != 0.0:
            s = radial[p] * ia[p]
            for k in range(Y.shape[0]):
                R[k, p] += s * Y[k, p]


def _attraction(inv_g2):
    """The attraction kernel for ``1 / gamma²`` = ``inv_g2``."""

    @njit(nogil=True, fastmath=True, error_model="numpy")
    def attraction(indptr, indices, data, r0, Yt, space_dims, A, with_kl):
        dims = Yt.shape[1]
        n_rows = indptr.shape[0] - 1
        plogw = 0.0
        for row in range(n_rows):
            i = r0 + row
            ni = 0.0
            for k in range(dims):
                ni += Yt[i, k] * Yt[i, k]
            ia_i = 1.0 / (1.0 - ni)
            radial = 0.0
            for idx in range(indptr[row], indptr[row + 1]):
                j = indices[idx]
                d2 = 0.0
                nj = 0.0
                for k in range(dims):
                    x = Yt[i, k] - Yt[j, k]
                    d2 += x * x
                    nj += Yt[j, k] * Yt[j, k]
                logw, w, a = pair_terms(d2, ia_i, 1.0 / (1.0 - nj), inv_g2)
                p = data[idx]
                if with_kl:
                    plogw += p * logw
                c = p * a
                radial += c * d2
                for k in range(dims):
                    A[row, k] += c * (Yt[i, k] - Yt[j, k])
            for k in range(dims):
                A[row, k] += radial * ia_i * Yt[i, k]
        return plogw

    return attraction


def _curvature(inv_g2):
    """The curvature kernel for ``1 / gamma²`` = ``inv_g2``."""

    @njit(nogil=True, error_model="numpy")
    def curvature(indptr, indices, data, r0, Yt, space_dims, out):
        # weights of the Laplacian part -a (y_i - y_j) of the attractive term (its radial part is left out)
        dims = Yt.shape[1]
        for row in range(indptr.shape[0] - 1):
            i = r0 + row
            ni = 0.0
            for k in range(dims):
                ni += Yt[i, k] * Yt[i, k]
            for idx in range(indptr[row], indptr[row + 1]):
                j = indices[idx]
                d2 = 0.0
                nj = 0.0
                for k in range(dims):
                    x = Yt[i, k] - Yt[j, k]
                    d2 += x * x
                    nj += Yt[j, k] * Yt[j, k]
                a = pair_terms(d2, 1.0 / (1.0 - ni), 1.0 / (1.0 - nj), inv_g2)[2]
                out[idx] = -2.0 * a * data[idx]

    return curvature


def _repulsion(inv_g2):
    """The all-pairs repulsion kernel for ``1 / gamma²`` = ``inv_g2``."""

    @njit(nogil=True, fastmath=True, boundscheck=False, error_model="numpy")
    def repulsion(Y, space_dims, r0, r1, R):
        wide_vectors()
        dims, n_points = Y.shape
        half = (n_points - 1) // 2
        # the pair loops store while summing: scratch rows and a copy of Y (kernels' module docstring)
        block = scratch(4 + dims, n_points)
        ia = scratch_row(block, 0, n_points)
        _inverse_alphas(Y, ia)
        radial = scratch_row(block, 1, n_points)
        radial[:] = 0.0
        d2 = scratch_row(block, 2, n_points)
        c = scratch_row(block, 3, n_points)
        for k in range(dims):
            scratch_row(block, 4 + k, n_points)[:] = Y[k]
        z = 0.0
        for i in range(r0, r1):
            partners = partners_of(i, n_points, half)
            ia_i = ia[i]
            rad_i = 0.0
            for segment in range(2):
                a, b = pair_segment(i, partners, n_points, segment)
                n = b - a
                if n <= 0:
                    continue
                bd = d2[:n]
                bd[:] = 0.0
                for k in range(dims):
                    yk = scratch_row(block, 4 + k, n_points)[a:b]
                    yik = Y[k, i]
                    for jj in range(n):
                        x = yik - yk[jj]
                        bd[jj] += x * x
                bc = c[:n]
                iaj = ia[a:b]
                radj = radial[a:b]
                for jj in range(n):
                    w, cw = pair_terms(bd[jj], ia_i, iaj[jj], inv_g2)[1:]
                    z += w
                    cw *= w
                    bc[jj] = cw
                    rd = cw * bd[jj]
                    rad_i += rd
                    radj[jj] += rd
                for k in range(dims):
                    scatter_forces(bc, scratch_row(block, 4 + k, n_points)[a:b], Y[k, i], R[k], i, a, b)
            radial[i] += rad_i
        _add_radial(R, radial, ia, Y)
        return 2.0 * z

    return repulsion


def _cross_repulsion(inv_g2):
    """The cross repulsion kernel for ``1 / gamma²`` = ``inv_g2``."""

    @njit(nogil=True, fastmath=True, boundscheck=False, error_model="numpy")
    def cross_repulsion(Yq, r0, r1, Ys, space_dims, skip_self, R):
        wide_vectors()
        dims, n_sources = Ys.shape
        block = scratch(3, n_sources)  # the pair loop stores to c while summing (kernels' module docstring)
        ia = scratch_row(block, 0, n_sources)
        _inverse_alphas(Ys, ia)
        d2 = scratch_row(block, 1, n_sources)
        c = scratch_row(block, 2, n_sources)
        z = 0.0
        for i in range(r0, r1):
            ia_i = _inverse_alpha(Yq, i)
            d2[:] = 0.0
            for k in range(dims):
                yk = Ys[k]
                yik = Yq[k, i]
                for j in range(n_sources):
                    x = yik - yk[j]
                    d2[j] += x * x
            zi = 0.0
            rad = 0.0
            for j in range(n_sources):
                w, cw = pair_terms(d2[j], ia_i, ia[j], inv_g2)[1:]
                zi += w
                c[j] = cw * w
                rad += c[j] * d2[j]
            if skip_self:  # the pair (i, i): weight 1, zero force
                zi -= 1.0
            z += zi
            for k in range(dims):
                yk = Ys[k]
                yik = Yq[k, i]
                acc = rad * ia_i * yik
                for j in range(n_sources):
                    acc += c[j] * (yik - yk[j])
                R[k, i - r0] += acc
        return z

    return cross_repulsion


def norm_loss(coords: np.ndarray, radii: np.ndarray):
    """``(H, ∂H/∂Y)``: ``H = mean_i (r_i² - |y_i|²)²`` for ``coords`` (d, N) and target radii ``r`` (N,)."""
    n2 = np.einsum("kn,kn->n", coords, coords)
    gap = np.asarray(radii, dtype=np.float64) ** 2 - n2
    n = coords.shape[1]
    return float(np.mean(gap * gap)), (-4.0 / n) * gap * coords


def check_params(gamma, lambda1, lambda2, warmup) -> dict:
    """The validated parameters as a dict (ValueError naming the bad one)."""
    values = {"gamma": gamma, "lambda1": lambda1, "lambda2": lambda2}
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"cosne: {name} must be a finite number, got {value!r}")
    low, high = GAMMA_RANGE
    if gamma <= 0:
        raise ValueError(f"cosne: gamma must be > 0, got {gamma}")
    if not low <= gamma <= high:
        raise ValueError(f"cosne: gamma must be in [{low:g}, {high:g}], got {gamma}")
    if lambda1 <= 0:
        raise ValueError(f"cosne: lambda1 must be > 0 (it scales the KL term), got {lambda1}")
    if lambda2 < 0:
        raise ValueError(f"cosne: lambda2 must be >= 0, got {lambda2}")
    if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)) or warmup < 0:
        raise ValueError(f"cosne: warmup must be an integer >= 0, got {warmup!r}")
    return {"gamma": float(gamma), "lambda1": float(lambda1), "lambda2": float(lambda2), "warmup": int(warmup)}


def make_point_term(lambda1: float, lambda2: float, warmup: int):
    """The model's ``point_term(coords, iteration, affinity)``: ``(λ2/λ1) N H`` and its gradient once
    ``iteration >= warmup`` or outside an optimisation (``iteration`` None), zero before.  The targets are
    ``target_radii(affinity)``: the input norms, or for a graph radii from the degree."""
    weight = lambda2 / lambda1

    def point_term(coords, iteration, affinity):
        if weight == 0.0 or (iteration is not None and iteration < warmup):
            return 0.0, np.zeros_like(coords)
        value, grad = norm_loss(coords, target_radii(affinity))
        n = coords.shape[1]
        return weight * n * value, (weight * n) * grad

    return point_term


def make_model(gamma: float = DEFAULTS["gamma"], lambda1: float = DEFAULTS["lambda1"],
               lambda2: float = DEFAULTS["lambda2"], warmup: int = DEFAULTS["warmup"]) -> Model:
    """CO-SNE with output scale ``gamma``, weights ``lambda1`` (KL) and ``lambda2`` (norm loss H) and the
    iteration ``warmup`` after which H is added (module docstring)."""
    params = check_params(gamma, lambda1, lambda2, warmup)
    return Model("cosne", f"CO-SNE, Poincaré ball, hyperbolic Cauchy kernel (gamma={params['gamma']:g})", False,
                 *make_kernels(params["gamma"]), similarity=similarity, ranking_coords=hyperboloid,
                 geometry=POINCARE,
                 point_term=make_point_term(params["lambda1"], params["lambda2"], params["warmup"]),
                 default_optimizer="dbd", learning_rate_scale=4.0 * params["gamma"] ** 2, params=params)
