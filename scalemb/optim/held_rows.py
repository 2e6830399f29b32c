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


def cg_cold(rows: dict, ds: int, mu: float) -> tuple:
    rows["x"][...] = 0.0
    rows["invd"][...] = 1.0 / (rows["diag"] + mu)
    return cg_start(rows, ds, mu, False)


def cg_start(rows: dict, ds: int, mu: float, warm: bool) -> tuple:
    """``pcg``'s start: ``r = rhs - (L x + mu x)`` (warm; ``Ap`` holds ``L x``) or ``rhs``, ``z = M r``, ``p = z``
    with ``rhs = -g_s``; partials of ``r . z``, ``|r|^2`` and ``|rhs|^2``."""
    rhs = -rows["gradient"][:ds]
    r = rhs - (rows["Ap"] + mu * rows["x"]) if warm else rhs.copy()
    rows["r"][...] = r
    z = r * rows["invd"][0]
    rows["z"][...] = z
    rows["p"][...] = z
    return dot_rows(r, z), squares(r), squares(rhs)


def cg_direction(rows: dict, beta: np.ndarray) -> None:
    rows["p"][...] = rows["z"] + beta[:, None] * rows["p"]


def cg_product(rows: dict, mu: float) -> np.ndarray:
    """``Ap = L p + mu p`` (``Ap`` holds ``L p``); the block's ``p . Ap``."""
    rows["Ap"][...] = rows["Ap"] + mu * rows["p"]
    return dot_rows(rows["p"], rows["Ap"])


def cg_step(rows: dict, step: np.ndarray) -> tuple:
    rows["x"] += step[:, None] * rows["p"]
    rows["r"] -= step[:, None] * rows["Ap"]
    z = rows["r"] * rows["invd"][0]
    rows["z"][...] = z
    return dot_rows(rows["r"], z), squares(rows["r"])


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
