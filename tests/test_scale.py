"""The spectral direction at any size (solver='auto', multigrid-preconditioned CG, interruptible set-up) and
repulsion='auto' by predicted cost (issue 22)."""
import os
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

from scalemb.embedding import initial_coords, load_affinity
from scalemb.engine.local import LocalExecutor
from scalemb.store.checkpoint import RunInterrupted, create_store, read_checkpoint
from scalemb.store.checkpointer import Checkpointer
from scalemb.models import get_model
from scalemb.optim import LineSearchDescent
from scalemb.optim.descent import AUTO_LU_MAX_POINTS
from scalemb.engine.factor import FactorizedSolver, MultigridPreconditioner, factorize
from scalemb.optim.solvers import SetupInterrupted, interruptible, pcg
from scalemb.repulsion.fft import near_cells
from scalemb.repulsion.grid import make_grid
from scalemb.repulsion.spec import FFTParams
from scalemb.repulsion.method import AutoRepulsion, Choice, near_pairs


@pytest.fixture(scope="module")
def grqc():
    return load_affinity(None)


def test_auto_solver_is_lu_at_grqc_size_and_jacobi_cg_beyond():
    sd = LineSearchDescent()
    assert sd.solver == "auto"
    assert sd.methods(5241) == ("lu", "lu")  # GrQc keeps its factorisation and its results
    assert sd.methods(AUTO_LU_MAX_POINTS - 1) == ("lu", "lu")
    assert sd.methods(AUTO_LU_MAX_POINTS) == ("cg", "jacobi")
    assert sd.cg_tol == "auto"  # inexact Newton
    assert (sd._cg_maxiter("jacobi"), sd._cg_maxiter("amg"), LineSearchDescent(cg_maxiter=7)._cg_maxiter("jacobi")) \
        == (10, 50, 7)  # truncated with Jacobi
    for bad in (0, 2.5, "many"):
        with pytest.raises(ValueError, match="cg_maxiter"):
            LineSearchDescent(cg_maxiter=bad)
    assert LineSearchDescent(preconditioner="amg").methods(10 ** 6) == ("cg", "amg")
    assert LineSearchDescent(preconditioner="jacobi").methods(10 ** 6) == ("cg", "jacobi")
    assert LineSearchDescent(solver="lu").methods(10 ** 6) == ("lu", "lu")
    assert LineSearchDescent(solver="cg").methods(100) == ("cg", "lu")
    with pytest.raises(ValueError, match="factorization"):
        factorize("qr", sp.identity(3), 1.0)


def test_multigrid_preconditioned_cg_matches_lu_on_grqc(grqc):
    ex = LocalExecutor(grqc, get_model("tsne"), 2, 0, n_blocks=2)
    coords = initial_coords(grqc.n_points, 2, 0, np.random.default_rng(0)) * 1e3
    ex.set_curvature(coords)
    L = ex.curvature_matrix()
    mu = 1e-5 * ex.curvature_diagonal().mean()
    rhs = -ex.evaluate(coords).gradient
    x_lu = FactorizedSolver(L, mu).solve(rhs)
    amg = ex.factorize_curvature(mu, kind="amg")
    assert isinstance(amg, MultigridPreconditioner) and amg.ordering is None
    assert len(amg.hierarchy.levels) > 1  # a real hierarchy, not one direct solve
    cg = pcg(ex.laplacian_matvec, rhs, amg.solve, mu, tol=1e-10, maxiter=200)
    assert cg.relative_residual <= 1e-10
    np.testing.assert_allclose(cg.x, x_lu, rtol=1e-6, atol=1e-7 * np.abs(x_lu).max())
    # a preconditioner, not an exact solve: CG needs more than one step, far fewer than without it
    plain = pcg(ex.laplacian_matvec, rhs, lambda r: r, mu, tol=1e-6, maxiter=2000)
    multigrid = pcg(ex.laplacian_matvec, rhs, amg.solve, mu, tol=1e-6, maxiter=2000)
    assert 1 < multigrid.iterations < plain.iterations / 5


def test_multigrid_descent_decreases_kl(school_affinity):
    ex = LocalExecutor(school_affinity, get_model("tsne"), 2, 0)
    coords = initial_coords(42, 2, 0, np.random.default_rng(1))
    res = LineSearchDescent(solver="cg", preconditioner="amg", tol=0).optimize(ex, coords, 30)
    assert np.all(np.diff(res.kl_history) <= 1e-12) and res.kl < res.kl_history[0] - 0.1


def test_interruptible_returns_raises_and_gives_up_on_stop():
    assert interruptible(lambda: 7, lambda: False) == 7
    assert interruptible(lambda: 8) == 8
    with pytest.raises(ZeroDivisionError):
        interruptible(lambda: 1 / 0, lambda: False)
    release = threading.Event()
    start = time.perf_counter()
    with pytest.raises(SetupInterrupted):
        interruptible(lambda: release.wait(30), lambda: time.perf_counter() - start > 0.2, poll=0.05)
    assert time.perf_counter() - start < 5
    # the abandoned set-up still holds its factor thread: the next one runs on another, not behind it
    started = time.perf_counter()
    assert interruptible(lambda: 9, lambda: False) == 9
    assert time.perf_counter() - started < 2
    release.set()


def test_factors_built_by_interruptible_set_ups_are_freed():
    """SuperLU frees a factor only in the thread that built it: a factor an interruptible set-up built, dropped
    by the caller, must still be freed (it was not, when each set-up had a thread of its own: ~9 MB of L and U per
    factorisation here, +490 MB of resident memory after 40)."""
    n = 20000
    A = sp.diags(np.ones(n - 1), 1) + sp.diags(np.ones(n - 100), 100)
    A = (A + A.T).tocsr()
    L = (sp.diags(np.asarray(A.sum(axis=1)).ravel()) - A).tocsr()

    def resident_mb():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20

    factor = interruptible(lambda: FactorizedSolver(L, 0.1), lambda: False)
    per_factor = (factor._lu.L.nnz + factor._lu.U.nnz) * 12 / 2 ** 20  # its L and U: values and row indices
    del factor
    before = resident_mb()
    for _ in range(40):
        factor = interruptible(lambda: FactorizedSolver(L, 0.1), lambda: False)
        del factor  # dropped on this thread, not the one that built it
    time.sleep(0.2)  # the factor threads' frees run
    assert per_factor > 5
    assert resident_mb() - before < 5 * per_factor


class SlowSetupExecutor:
    """A LocalExecutor whose curvature set-ups block until released, asking for a stop on the 3rd."""

    def __init__(self, inner, checkpointer):
        self._inner, self._checkpointer = inner, checkpointer
        self.setups = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def factorize_curvature(self, mu, ordering=None, kind="lu"):
        self.setups += 1
        if self.setups == 3:
            self._checkpointer.request_stop()
            time.sleep(30)  # abandoned by the optimiser
        return self._inner.factorize_curvature(mu, ordering, kind=kind)


def stop_then_resume(tmp_path, affinity, stopping_executor, run):
    """``run(executor, **kwargs)`` three times on one t-SNE executor: uninterrupted (the reference); wrapped in
    ``stopping_executor(inner, checkpointer)``, which asks for a stop, to a ``RunInterrupted`` with a
    checkpoint at the iteration it reports; resumed from that checkpoint.  Returns ``(the stopping executor,
    reference, resumed)``."""
    with LocalExecutor(affinity, get_model("tsne"), 2, 0) as inner:
        reference = run(inner)
        path = tmp_path / "run.zarr"
        create_store(path, {"optimizer": {"name": "sd"}, "n_points": affinity.n_points, "space_dims": 2,
                            "time_dims": 0})
        checkpointer = Checkpointer(path, every=0, handle_signals=False)
        stopping = stopping_executor(inner, checkpointer)
        with pytest.raises(RunInterrupted) as stopped:
            run(stopping, checkpoint=checkpointer.hook(0, [], None, time.perf_counter()))
        checkpoint = read_checkpoint(path)
        assert checkpoint.iteration == stopped.value.iteration > 0
        resumed = run(inner, state=checkpoint.state)
    return stopping, reference, resumed


@pytest.mark.slow
@pytest.mark.parametrize("preconditioner", ["amg", "lu"])
def test_stop_during_solver_setup_checkpoints_and_resumes_identically(tmp_path, school_affinity, preconditioner):
    def run(executor, **kwargs):
        opt = LineSearchDescent(solver="cg", preconditioner=preconditioner, refactor_every=3, tol=0)
        return opt.optimize(executor, initial_coords(42, 2, 0, np.random.default_rng(2)), 12, **kwargs)

    start = time.perf_counter()
    stopping, reference, resumed = stop_then_resume(tmp_path, school_affinity, SlowSetupExecutor, run)
    assert time.perf_counter() - start < 20  # did not wait for the blocked set-up
    assert stopping.setups == 3
    np.testing.assert_array_equal(resumed.coords, reference.coords)
    np.testing.assert_array_equal(resumed.kl_history, reference.kl_history)


def test_near_pairs_counts_the_near_field_loop():
    rng = np.random.default_rng(0)
    Y = np.concatenate([rng.normal(size=(2, 300)), rng.normal(size=(2, 200)) * 3 + 1e4], axis=1)
    grid = make_grid("tsne", 2, Y.min(axis=1), Y.max(axis=1), FFTParams(max_nodes=2000).resolved("tsne", 2), 500)
    assert grid.capped
    cells = near_cells(grid, Y)
    keys = np.floor((Y - grid.lo[:2, None]) / cells.cell_size).astype(np.int64)
    neighbours = np.all(np.abs(keys[:, :, None] - keys[:, None, :]) <= 1, axis=0)
    assert near_pairs(cells, 2) == int(neighbours.sum())


class ScriptedCosts(AutoRepulsion):
    def __init__(self, ratios):
        super().__init__("tsne", 2, 0, FFTParams().resolved("tsne", 2))
        self._ratios = iter(ratios)

    def predict(self, coords):
        return Choice("fft", 1.0, next(self._ratios))  # fft seconds / exact seconds


def test_auto_repulsion_switches_with_hysteresis():
    ratios = [0.5, 0.9, 1.4, 1.6, 1.2, 0.7, 0.6, 1.0]
    auto = ScriptedCosts(ratios)
    for _ in ratios:
        auto.choose(None)
    assert auto.history == ["fft", "fft", "fft", "exact", "exact", "exact", "fft", "fft"]
    assert ScriptedCosts([1.2]).choose(None).method == "exact"  # the first choice takes the cheaper


def test_auto_repulsion_prefers_fft_on_a_compact_layout_and_exact_when_the_near_field_dominates():
    rng = np.random.default_rng(1)
    n = 20000
    auto = AutoRepulsion("tsne", 2, 0, FFTParams().resolved("tsne", 2))
    compact = auto.predict(rng.normal(size=(2, n)) * 5)
    assert not compact.grid.capped and compact.fft_seconds < compact.exact_seconds / 5
    # most points in one dense clump, a few flung far away: the capped grid's near field is ~all pairs
    flown = np.concatenate([rng.normal(size=(2, n - 20)), rng.uniform(-1e7, 1e7, size=(2, 20))], axis=1)
    choice = auto.predict(flown)
    assert choice.grid.capped and choice.near_pairs > 0.5 * (n - 20) ** 2
    assert AutoRepulsion("tsne", 2, 0, FFTParams().resolved("tsne", 2)).choose(flown).method == "exact"


def test_executor_auto_repulsion_is_exact_below_the_floor_and_decides_per_evaluation_above(grqc):
    ex = LocalExecutor(grqc, get_model("tsne"), 2, 0, repulsion="auto")
    assert ex.repulsion == "exact" and ex.auto_repulsion is None  # GrQc's default results are unchanged
    rng = np.random.default_rng(3)
    n = 12000
    rows = np.arange(n)
    P = sp.coo_matrix((np.full(n, 0.5 / n), (rows, (rows + 1) % n)), shape=(n, n)).tocsr()
    from scalemb.affinity.affinity import Affinity

    P = (P + P.T).tocsr()
    affinity = Affinity(P, np.arange(n))
    with LocalExecutor(affinity, get_model("tsne"), 2, 0, repulsion="auto") as auto, \
            LocalExecutor(affinity, get_model("tsne"), 2, 0, repulsion="fft") as fft:
        assert auto.repulsion == "auto"
        compact = rng.normal(size=(2, n)) * 2  # an uncapped grid: fft predicted far cheaper
        np.testing.assert_array_equal(auto.evaluate(compact).gradient, fft.evaluate(compact).gradient)
        assert auto.auto_repulsion.history == ["fft"]


def test_auto_repulsion_sends_a_blown_up_layout_to_the_cheap_nan_path():
    auto = AutoRepulsion("tsne", 2, 0, FFTParams().resolved("tsne", 2))
    Y = np.zeros((2, 50000))
    Y[0, 3] = np.nan
    assert auto.choose(Y).method == "fft"  # not an O(N²) exact pass that only finds NaN


class StopInCGExecutor(SlowSetupExecutor):
    """Asks for a stop in the middle of the 4th CG solve (jacobi: no set-up to interrupt)."""

    def __init__(self, inner, checkpointer):
        super().__init__(inner, checkpointer)
        self.products = 0

    def laplacian_matvec(self, V):
        self.products += 1
        if self.products == 25:
            self._checkpointer.request_stop()
        return self._inner.laplacian_matvec(V)


def test_stop_during_cg_checkpoints_and_resumes_identically(tmp_path, school_affinity):
    def run(executor, **kwargs):
        opt = LineSearchDescent(solver="cg", preconditioner="jacobi", cg_tol=1e-9, tol=0)
        return opt.optimize(executor, initial_coords(42, 2, 0, np.random.default_rng(4)), 10, **kwargs)

    stopping, reference, resumed = stop_then_resume(tmp_path, school_affinity, StopInCGExecutor, run)
    assert stopping.products == 25  # no further product after the stop request
    np.testing.assert_array_equal(resumed.coords, reference.coords)
