"""The row-block steps of the held spectral direction (``optim.descent_held``): each a function of one block's
held rows (a dict of arrays: ``coords``, ``gradient``, the CG vectors, ...) and small parameters, returning that
block's partial sums; ``HeldState.map`` runs them where the rows are, in-process or on the Dask workers, and the
client sums the partials in block order.  The arithmetic is ``optim.descent_steps.DescentRun``'s, restated by rows."""
import numpy as np

from .dbd import clip_step_norms, gains_update


def moved_summary(coords: np.ndarray) -> tuple:
    """The new coordinates' column sums (the re-centring's partial) and their minima and maxima (the extent)."""
    return coords.sum(axis=1), coords.min(axis=1), coords.max(axis=1)


def space_square(rows: dict, ds: int) -> float:
    """The block's ``|g_s|^2`` as ``np.linalg.norm`` of the whole space gradient sums it (``x.dot(x)``)."""
    g = np.ascontiguousarray(rows["gradient"][:ds]).ravel()
    return float(g.dot(g))


def dot_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``pcg``'s per-coordinate inner products ``einsum('kn,kn->k')`` of the block's rows."""
    return np.einsum("kn,kn->k", np.ascontiguousarray(a), np.ascontiguousarray(b))


def squares(a: np.ndarray) -> np.ndarray:
    """``np.linalg.norm(a, axis=1)**2``'s block partial: ``add.reduce(a * a, axis=1)``."""
    return np.add.reduce(a * a, axis=1)


def cg_warm(rows: dict, ds: int, mu: float) -> None:
    """The warm start ``x = previous`` and the preconditioner ``1 / (diag + mu)``."""
    rows["x"][...] = rows["prev"]
    rows["invd"][...] = 1.0 / (rows["diag"] + mu)


def cg1_start(rows: dict, ds: int, mu: float, warm: bool) -> None:
    """``pcg_one_reduction``'s start: ``r = rhs - (L x + mu x)`` (warm; ``w`` holds ``L x``) or ``rhs``
    (``x = 0``), ``u = M r``: the source of the first product."""
    if not warm:
        rows["x"][...] = 0.0
        rows["invd"][...] = 1.0 / (rows["diag"] + mu)
    rhs = -rows["gradient"][:ds]
    rows["r"][...] = rhs - (rows["w"] + mu * rows["x"]) if warm else rhs.copy()
    rows["u"][...] = rows["r"] * rows["invd"][0]


def cg1_product(rows: dict, ds: int, mu: float, start: bool) -> tuple:
    """``w = L u + mu u`` (``w`` holds ``L u``); the block's ``r . u``, ``w . u``, ``|r|^2`` (and at the start
    ``|rhs|^2``): all of an iteration's reductions, after its one product."""
    rows["w"][...] = rows["w"] + mu * rows["u"]
    r = rows["r"]
    sums = dot_rows(r, rows["u"]), dot_rows(rows["w"], rows["u"]), squares(r)
    return (*sums, squares(-rows["gradient"][:ds])) if start else sums


def cg1_step(rows: dict, alpha: np.ndarray, beta: np.ndarray, first: bool) -> tuple:
    """``pcg_one_reduction``'s step: ``p = u + beta p``, ``s = w + beta s`` (``u``, ``w`` on the first), ``x +=
    alpha p``, ``r -= alpha s``, ``u = M r`` (the next product's source); the block's ``|r|^2``."""
    if first:
        rows["p"][...] = rows["u"]
        rows["s"][...] = rows["w"]
    else:
        rows["p"][...] = rows["u"] + beta[:, None] * rows["p"]
        rows["s"][...] = rows["w"] + beta[:, None] * rows["s"]
    rows["x"] += alpha[:, None] * rows["p"]
    rows["r"] -= alpha[:, None] * rows["s"]
    rows["u"][...] = rows["r"] * rows["invd"][0]
    return (squares(rows["r"]),)


def direction(rows: dict, ds: int, geometry, polishing: bool, radius, with_time: bool) -> tuple:
    """The solve's ``x`` kept as the next warm start (zeros inside the polish phase) and, bounded by ``radius``
    (``descent.bounded_direction``), the space direction; partials of ``<g_s, bounded>`` and, with a time step
    kept, ``sum g_t . v_t`` (the time rate's test)."""
    x = rows["x"]
    rows["prev"][...] = 0.0 if polishing else x
    bounded = x.copy()
    if radius is not None:
        clip_step_norms(bounded, radius)
    rows["dir"][:ds] = bounded
    slope = float(np.sum(rows["gradient"][:ds] * bounded)) if radius is not None else 0.0
    time_dot = 0.0
    if with_time and rows["coords"].shape[0] > ds:
        rgrad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
        time_dot = float(np.sum(rgrad[ds:] * rows["ptime"]))
    return slope, time_dot


def step_then_direction(rows: dict, final, ds: int, geometry, polishing: bool, radius, with_time: bool) -> tuple:
    """The solve's last step ``cg1_step(rows, *final)`` (``final`` None: the solve ended on a product) and then
    ``direction``, in one task: a client round trip fewer per spectral step."""
    if final is not None:
        cg1_step(rows, *final)
    return direction(rows, ds, geometry, polishing, radius, with_time)


def gradient_direction(rows: dict, ds: int, radius: float) -> None:
    """``bounded_direction``'s fallback: the negative space gradient, bounded."""
    bounded = -rows["gradient"][:ds]
    clip_step_norms(bounded, radius)
    rows["dir"][:ds] = bounded


def slope_trial(rows: dict, ds: int, geometry, time_rate: float, step: float) -> tuple:
    """The direction's time rows ``-time_rate g_t``, the point kept for the trials, the first trial point; the
    block's ``<g, p>`` and the trial's summary."""
    coords, grad = rows["coords"], rows["gradient"]
    if coords.shape[0] > ds:
        rows["dir"][ds:] = -time_rate * geometry.riemannian_gradient(coords, grad)[ds:]
    rows["base"][...] = coords
    rows["bgrad"][...] = grad
    return (float(np.sum(grad * rows["dir"])),) + trial(rows, geometry, step)


def trial(rows: dict, geometry, step: float) -> tuple:
    rows["coords"][...] = geometry.retract(rows["base"], step * rows["dir"])
    return moved_summary(rows["coords"])


def restore(rows: dict) -> None:
    """Back to the point kept before the move (no step passed, or it diverged)."""
    rows["coords"][...] = rows["base"]
    rows["gradient"][...] = rows["bgrad"]


def time_step(rows: dict, ds: int, step: float) -> None:
    rows["ptime"][...] = step * rows["dir"][ds:]


def keep_gradient(rows: dict) -> None:
    rows["bgrad"][...] = rows["gradient"]


def restore_gradient(rows: dict) -> None:
    rows["gradient"][...] = rows["bgrad"]


def unit_gains(rows: dict) -> None:
    rows["gains"][...] = 1.0


def time_dot(rows: dict, ds: int, geometry) -> float:
    rgrad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
    return float(np.sum(rgrad[ds:] * rows["ptime"]))


def move(rows: dict, ds: int, geometry, update: np.ndarray, radius, time_step) -> tuple:
    """``DescentRun._momentum_move``'s move: the space ``update`` bounded and kept as the momentum buffer, the
    time rows ``time_step``, the point kept (``base``, ``bgrad``) to undo it; the new coordinates' summary."""
    if radius is not None:
        clip_step_norms(update, radius)
    coords = rows["coords"]
    direction = np.empty_like(coords)
    direction[:ds] = update
    direction[ds:] = time_step
    rows["base"][...] = coords
    rows["bgrad"][...] = rows["gradient"]
    rows["prev"][...] = update
    rows["coords"][...] = geometry.retract(coords, direction)
    return moved_summary(rows["coords"])


def momentum(rows: dict, ds: int, geometry, rate: float, momentum: float, with_buffer: bool, radius,
              time_rate: float) -> tuple:
    """An exaggeration-phase momentum step: ``u = -lr g_s (+ m u)``, time ``-time_rate g_t``."""
    rgrad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
    update = rate * rgrad[:ds]
    if with_buffer:
        update += momentum * rows["prev"]
    return move(rows, ds, geometry, update, radius, -time_rate * rgrad[ds:])


def polish(rows: dict, ds: int, geometry, rate: float, momentum: float, with_buffer: bool, radius,
            time_rate: float, time_step) -> tuple:
    """A polish step: delta-bar-delta's gains and ``u = m u - lr gains g_s``; time ``-time_rate g_t`` (no time
    step: ``time_step`` None), ``-rate_t g_t`` (``('first', rate_t)``) or ``m v - rate_t g_t`` (``('momentum',
    m, rate_t)``, ``rate_t`` the time rate times its gain); the time step kept (``ptime``)."""
    rgrad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
    grad = rgrad[:ds]
    if not with_buffer:
        rows["prev"][...] = 0.0
    previous = rows["prev"]
    gains = rows["gains"]
    gains[...] = gains_update(gains, grad, previous)
    update = momentum * previous - rate * gains * grad
    if time_step is None:
        step_t = -time_rate * rgrad[ds:]
    elif time_step[0] == "first":
        step_t = -time_step[1] * rgrad[ds:]
    else:
        step_t = time_step[1] * rows["ptime"] - time_step[2] * rgrad[ds:]
    if time_step is not None:
        rows["ptime"][...] = step_t
    return move(rows, ds, geometry, update, radius, step_t)
