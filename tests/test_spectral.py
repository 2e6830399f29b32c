"""Spectral direction: Laplacian row blocks, both solvers, line search."""
import numpy as np
import pytest
import scipy.sparse as sp

import scalemb
from scalemb.embedding import initial_coords
from scalemb.engine import LocalExecutor
from scalemb.models import get_model
from scalemb.optim.descent import LineSearchDescent
from scalemb.optim.linesearch import armijo
from scalemb.engine.factor import FactorizedSolver
from scalemb.optim.solvers import jacobi_preconditioner, pcg


def _executor(affinity, name="tsne", ds=2, dt=0, n_blocks=None):
    return LocalExecutor(affinity, get_model(name), ds, dt, n_threads=2, n_blocks=n_blocks)


@pytest.mark.parametrize("fixed", [True, False])
def test_curvature_weights_and_laplacian_products(school_affinity, fixed):
    ex = _executor(school_affinity, n_blocks=3)
    coords = np.random.default_rng(0).normal(size=(2, 42))
    ex.set_curvature(coords, exaggeration=2.0, fixed=fixed)
    P = school_affinity.P.toarray()
    d2 = ((coords[:, :, None] - coords[:, None, :]) ** 2).sum(0)
    C = 4 * 2.0 * P * (1.0 if fixed else 1 / (1 + d2))
    L = np.diag(C.sum(1)) - C
    np.testing.assert_allclose(ex.curvature_matrix().toarray(), L, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ex.curvature_diagonal(), np.diag(L), rtol=1e-12)
    V = np.random.default_rng(1).normal(size=(2, 42))
    np.testing.assert_allclose(ex.laplacian_matvec(V), V @ L.T, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name,ds,dt", [("sne", 2, 0), ("tsne", 3, 0), ("snest", 2, 1)])
def test_laplacian_is_the_attractive_gradient(school_affinity, name, ds, dt):
    """L(C) S equals the attractive (P) part of dKL/dS: the partial Hessian is exact on that term."""
    ex = _executor(school_affinity, name, ds, dt)
    coords = np.random.default_rng(2).normal(size=(ds + dt, 42))
    ex.set_curvature(coords)
    g1, g2 = ex.evaluate(coords, 1.0).gradient, ex.evaluate(coords, 2.0).gradient
    attractive = (g2 - g1)[:ds]  # grad = 2(R/Z - alpha A): one extra alpha gives the P term
    np.testing.assert_allclose(ex.laplacian_matvec(coords[:ds]), attractive, rtol=1e-9, atol=1e-13)


def test_solvers_agree_and_meet_tolerance(school_affinity):
    ex = _executor(school_affinity, n_blocks=2)
    coords = np.random.default_rng(3).normal(size=(2, 42))
    ex.set_curvature(coords)
    L = ex.curvature_matrix()
    diag = ex.curvature_diagonal()
    mu = 1e-5 * diag.mean()
    rhs = -ex.evaluate(coords).gradient
    B = (L + mu * sp.identity(42)).toarray()
    x_lu = FactorizedSolver(L, mu).solve(rhs)
    assert np.linalg.norm(x_lu @ B.T - rhs) <= 1e-10 * np.linalg.norm(rhs)
    cg = pcg(ex.laplacian_matvec, rhs, jacobi_preconditioner(diag, mu), mu, tol=1e-10, maxiter=500)
    assert cg.relative_residual <= 1e-10
    for k in range(2):
        assert np.linalg.norm(B @ cg.x[k] - rhs[k]) <= 1e-10 * np.linalg.norm(rhs[k])
    np.testing.assert_allclose(cg.x, x_lu, rtol=1e-6, atol=1e-8 * np.abs(x_lu).max())
    warm = pcg(ex.laplacian_matvec, rhs, jacobi_preconditioner(diag, mu), mu, x0=cg.x, tol=1e-8, maxiter=500)
    lu_pre = pcg(ex.laplacian_matvec, rhs, FactorizedSolver(L, mu).solve, mu, tol=1e-10, maxiter=500)
    assert lu_pre.iterations <= 2 and lu_pre.relative_residual <= 1e-10
    assert warm.iterations == 0


@pytest.mark.parametrize("warm", [False, True])
def test_one_reduction_cg_takes_pcgs_iterates(school_affinity, warm):
    """Chronopoulos-Gear CG (``pcg_one_reduction``): PCG's iterates in exact arithmetic, so after every number of
    iterations its x agrees with PCG's to rounding; the same stop rule (tolerance or ``maxiter``); a system whose
    right-hand side is zero stays at its start (its coefficients are guarded to 0), the others converge."""
    from scalemb.optim.solvers import pcg_one_reduction

    ex = _executor(school_affinity, n_blocks=2)
    coords = np.random.default_rng(3).normal(size=(2, 42))
    ex.set_curvature(coords)
    diag = ex.curvature_diagonal()
    mu = 1e-3 * diag.mean()
    rhs = -ex.evaluate(coords).gradient
    x0 = np.random.default_rng(4).normal(size=rhs.shape) * 1e-2 if warm else None
    M = jacobi_preconditioner(diag, mu)
    for k in (1, 2, 5, 12):
        a = pcg(ex.laplacian_matvec, rhs, M, mu, x0=x0, tol=0.0, maxiter=k)
        b = pcg_one_reduction(ex.laplacian_matvec, rhs, M, mu, x0=x0, tol=0.0, maxiter=k)
        assert a.iterations == b.iterations == k
        np.testing.assert_allclose(b.x, a.x, rtol=1e-8, atol=1e-10 * np.abs(a.x).max())
    tight = pcg_one_reduction(ex.laplacian_matvec, rhs, M, mu, x0=x0, tol=1e-9, maxiter=500)
    reference = pcg(ex.laplacian_matvec, rhs, M, mu, x0=x0, tol=1e-9, maxiter=500)
    assert tight.relative_residual <= 1e-9 and abs(tight.iterations - reference.iterations) <= 1
    again = pcg_one_reduction(ex.laplacian_matvec, rhs, M, mu, x0=tight.x, tol=1e-8, maxiter=500)
    assert again.iterations == 0 and np.array_equal(again.x, tight.x)
    half = rhs.copy()
    half[1] = 0.0
    part = pcg_one_reduction(ex.laplacian_matvec, half, M, mu, tol=1e-9, maxiter=500)
    assert np.all(np.isfinite(part.x)) and np.all(part.x[1] == 0.0)
    x_lu = FactorizedSolver(ex.curvature_matrix(), mu).solve(rhs)
    np.testing.assert_allclose(part.x[0], x_lu[0], rtol=1e-6, atol=1e-8 * np.abs(x_lu[0]).max())


def test_line_search_refuses_ascent_and_never_increases(school_affinity):
    ex = _executor(school_affinity)
    coords = initial_coords(42, 2, 0, np.random.default_rng(0)) * 1e3
    ev = ex.evaluate(coords)
    uphill = armijo(ex.evaluate, coords, ev.gradient, ev, 1.0)
    assert not uphill.accepted and uphill.coords is coords
    down = armijo(ex.evaluate, coords, -ev.gradient, ev, 1e6)
    assert down.accepted and down.trials > 1 and down.evaluation.kl < ev.kl


@pytest.mark.parametrize("direction,solver,curvature", [("spectral", "cg", "iterate"), ("spectral", "lu", "fixed"),
                                                        ("spectral", "lu", "iterate"), ("gradient", "cg", "iterate")])
def test_descent_is_monotone(school_affinity, direction, solver, curvature):
    ex = _executor(school_affinity, "snest", 2, 1)
    opt = LineSearchDescent(direction=direction, solver=solver, curvature=curvature, tol=0)
    run = opt.optimize(ex, initial_coords(42, 2, 1, np.random.default_rng(0)), 150)
    assert np.all(np.diff(run.kl_history) <= 1e-12)
    assert run.kl < run.kl_history[0] - 0.5


def test_bad_options():
    with pytest.raises(ValueError, match="solver"):
        LineSearchDescent(solver="qr")
    with pytest.raises(ValueError, match="curvature"):
        LineSearchDescent(curvature="exact")


def test_factorisation_with_reused_ordering(school_affinity):
    ex = _executor(school_affinity)
    rng = np.random.default_rng(5)
    ex.set_curvature(rng.normal(size=(2, 42)))
    first = FactorizedSolver(ex.curvature_matrix(), 1e-6)
    ex.set_curvature(rng.normal(size=(2, 42)))  # new weights, same pattern
    L = ex.curvature_matrix()
    reused = FactorizedSolver(L, 1e-6, first.ordering)
    rhs = rng.normal(size=(2, 42))
    x = reused.solve(rhs)
    B = (L + 1e-6 * sp.identity(42)).toarray()
    assert np.linalg.norm(x @ B.T - rhs) <= 1e-9 * np.linalg.norm(rhs)


def _scipys_way(C, mu, ordering, relabel=None):
    """``(L(C) + mu I)[ordering][:, ordering]`` in CSC as ``FactorizedSolver`` gets it from the executor's matrix,
    sorted as ``splu`` sorts it."""
    from scalemb.engine.laplacian import laplacian_matrix

    L = laplacian_matrix(C)
    if relabel is not None:
        L = L[relabel][:, relabel].tocsr()
    B = (L + mu * sp.identity(C.shape[0])).tocsc()
    B = B[ordering][:, ordering].tocsc()
    B.sort_indices()
    return B


@pytest.mark.parametrize("relabel", [False, True])
def test_the_assembly_is_scipys_matrix_bit_for_bit(relabel):
    """``Assembly`` gathers ``(L(C) + mu I)`` in the factor's ordering from C's weights: the same structure and
    values as SciPy's way (sorted, as ``splu`` sorts its input), for new weights on the same pattern, however
    often; patterns or weights SciPy would change are refused."""
    from scalemb.engine.factor import Assembly

    rng = np.random.default_rng(3)
    n = 60
    A = sp.random(n, n, density=0.1, random_state=4, format="csr")
    A = (A + A.T + sp.diags(np.ones(n - 1), 1) + sp.diags(np.ones(n - 1), -1)).tocsr()  # no empty row
    A.setdiag(0)
    A.eliminate_zeros()
    indptr, indices = A.indptr, A.indices[np.concatenate([rng.permutation(np.arange(a, b))  # unsorted rows
                                                           for a, b in zip(A.indptr[:-1], A.indptr[1:])])]
    ordering, rank = rng.permutation(n), (rng.permutation(n) if relabel else None)
    assembly = Assembly.build(indptr, indices, ordering, rank)
    for mu in (0.3, 1e-6, 2.5):
        weights = rng.normal(size=indices.size)  # of either sign, as SNEST's and EE's curvatures are
        C = sp.csr_matrix((weights, indices, indptr), shape=(n, n))
        expected, got = _scipys_way(C, mu, ordering, rank), assembly.matrix(weights, mu)
        assert np.array_equal(got.indptr, expected.indptr) and np.array_equal(got.indices, expected.indices)
        assert got.data.tobytes() == expected.data.tobytes()
        rhs = rng.normal(size=(2, n))
        L = C if rank is None else C[rank][:, rank]
        x = FactorizedSolver.ordered(got, ordering).solve(rhs)
        B = (sp.diags(np.asarray(L.sum(axis=1)).ravel()) - L + mu * sp.identity(n)).toarray()
        assert np.linalg.norm(x @ B.T - rhs) <= 1e-8 * np.linalg.norm(rhs) * np.linalg.cond(B)
    assert assembly.fits(indptr, indices, ordering, rank)
    assert not assembly.fits(indptr, indices, ordering[::-1].copy(), rank)
    zero = rng.normal(size=indices.size)
    zero[5] = 0.0
    assert assembly.matrix(zero, 0.3) is None  # SciPy drops that entry: its way, not the gather
    with_diagonal = A.copy()
    with_diagonal.setdiag(1.0)
    assert Assembly.build(with_diagonal.indptr, with_diagonal.indices, ordering) is None
    empty = sp.csr_matrix((np.ones(2), [1, 0], [0, 1, 2, 2]), shape=(3, 3))
    assert Assembly.build(empty.indptr, empty.indices, np.arange(3)) is None


def test_a_run_factorising_every_iteration_is_the_run_through_scipys_way(school_affinity, monkeypatch):
    """The executor's LU with a known ordering comes from its ``Assembly``: a run with the assembly switched off
    (every factorisation through SciPy's way) ends at the same bits."""
    import scalemb.engine.local as local

    def fit():
        return scalemb.Embedder(model="snest", random_state=0, max_iter=60, solver="lu").fit(school_affinity)

    gathered = []
    matrix = local.Assembly.matrix
    monkeypatch.setattr(local.Assembly, "matrix", lambda self, *args: gathered.append(1) or matrix(self, *args))
    with_assembly = fit()
    assert len(gathered) > 10  # the LU took the assembly's way
    monkeypatch.setattr(local.Assembly, "build", classmethod(lambda cls, *args: None))
    without = fit()
    assert with_assembly.embedding_.tobytes() == without.embedding_.tobytes()
    assert with_assembly.kl_divergence_ == without.kl_divergence_


def test_optimizer_names_and_auto():
    from scalemb.optim import DeltaBarDelta, make_optimizer

    assert isinstance(make_optimizer("auto", "sne"), DeltaBarDelta)
    assert make_optimizer("auto", "tsne").resolve(5241).name == "sd"
    gd = make_optimizer("gd", solver="cg")
    assert gd.name == "gd" and gd.direction == "gradient" and gd.solver == "cg"
    assert make_optimizer("dbd", learning_rate=3.0).learning_rate == 3.0
    # an option the named optimiser has no use for is refused, naming it (never dropped silently)
    with pytest.raises(ValueError, match="learning_rate: not a setting of the gd optimiser"):
        make_optimizer("gd", learning_rate=3.0, solver="cg")
    with pytest.raises(ValueError, match="solver: not a setting of the dbd optimiser"):
        make_optimizer("dbd", solver="cg", learning_rate=3.0)
    with pytest.warns(UserWarning, match="kl_every: not a setting of the sd optimiser that 'auto' chose"):
        assert make_optimizer("auto", "tsne", 100, kl_every=5).name == "sd"
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("adam")


def test_api_records_optimizer():
    res = scalemb.embed("school", model="tsne", iterations=50, optimizer="sd")
    assert res.optimizer["optimizer"] == "sd" and res.seconds.shape == res.kl_history.shape
