import numpy as np
import pytest

import scalemb
from scalemb.embedding import initial_coords
from scalemb.engine import LocalExecutor
from scalemb.models import get_model
from scalemb.optim import DeltaBarDelta, make_optimizer


def _run(affinity, name, ds, dt, n_iter=300, seed=0, **kw):
    ex = LocalExecutor(affinity, get_model(name), ds, dt)
    coords = initial_coords(affinity.n_points, ds, dt, np.random.default_rng(seed))
    return DeltaBarDelta(**kw).optimize(ex, coords, n_iter)


def test_kl_decreases_after_exaggeration(school_affinity):
    run = _run(school_affinity, "snest", 2, 1, n_iter=600, tol=0)
    h = run.kl_history
    assert h[-1] < h[100] < h[0]
    assert run.iterations == 600 and len(h) == 601


def test_same_seed_same_result(school_affinity):
    a = scalemb.embed("school", model="snest", iterations=200, seed=7)
    b = scalemb.embed("school", model="snest", iterations=200, seed=7)
    c = scalemb.embed("school", model="snest", iterations=200, seed=8)
    assert np.array_equal(a.embedding, b.embedding) and a.kl == b.kl
    assert not np.array_equal(a.embedding, c.embedding)


def test_convergence_test_stops_early(school_affinity):
    run = _run(school_affinity, "sne", 2, 0, n_iter=5000, tol=1e-5)
    assert run.converged and run.iterations < 5000


@pytest.mark.slow
def test_restarts_keep_best(school_affinity):
    res = scalemb.embed("school", model="snest", space_dims=1, time_dims=1, iterations=1500, restarts=3)
    assert len(res.restart_kls) == 3
    assert res.kl == min(res.restart_kls)


def test_blow_up_backs_off_then_gives_up(school_affinity):
    # SNE at a learning rate far above 1/(4 lambda_max(L(P))) blows up; the optimiser halves it and recovers
    run = _run(school_affinity, "sne", 2, 0, n_iter=1500, learning_rate=50.0, tol=0)
    assert run.backoffs >= 1 and np.isfinite(run.kl) and run.kl < 0.6
    with pytest.raises(FloatingPointError, match="halvings"):
        _run(school_affinity, "sne", 2, 0, n_iter=1500, learning_rate=1e6, max_backoffs=1, tol=0)


def test_invalid_learning_rate(school_affinity):
    with pytest.raises(ValueError, match="learning_rate"):
        _run(school_affinity, "tsne", 2, 0, learning_rate=-1.0)


def test_momentum_schedule():
    opt = DeltaBarDelta()
    assert [opt.momentum_at(i) for i in (0, 249, 250, 999, 1000, 4000)] == [0.5, 0.5, 0.8, 0.8, 0.9, 0.9]


def _space_steps(affinity, name, ds, dt, n_iter, **kw):
    """The momentum buffer's space part (the last step taken) after ``n_iter - 1`` iterations."""
    ex = LocalExecutor(affinity, get_model(name), ds, dt)
    coords = initial_coords(affinity.n_points, ds, dt, np.random.default_rng(0))
    states = []
    DeltaBarDelta(tol=0, **kw).optimize(ex, coords, n_iter, checkpoint=lambda it, export: states.append(export()))
    return states[-1].update[:ds]


@pytest.mark.parametrize("name, ds, dt", [("tsne", 2, 0), ("snest", 2, 1)])
def test_max_step_norm_clips_each_points_space_step(school_affinity, name, ds, dt):
    kw = dict(learning_rate=2000.0, exaggeration_iterations=0)
    free = np.linalg.norm(_space_steps(school_affinity, name, ds, dt, 3, **kw), axis=0)
    clipped = np.linalg.norm(_space_steps(school_affinity, name, ds, dt, 3, max_step_norm=0.5, **kw), axis=0)
    assert free.max() > 0.5  # the clip is active in this setting
    assert clipped.max() == pytest.approx(0.5) and np.all(clipped <= 0.5 * (1 + 1e-12))


def test_clip_step_norms_scales_long_columns_only():
    from scalemb.optim.dbd import clip_step_norms

    steps = np.array([[3.0, 0.1, -6.0], [4.0, 0.2, 8.0]])
    clip_step_norms(steps, 5.0)
    assert np.allclose(steps, [[3.0, 0.1, -3.0], [4.0, 0.2, 4.0]])


def test_invalid_max_step_norm():
    with pytest.raises(ValueError, match="max_step_norm"):
        DeltaBarDelta(max_step_norm=0.0)



def test_kl_every_skips_the_kl_but_not_the_trajectory(school_affinity):
    every = _run(school_affinity, "tsne", 2, 0, n_iter=120, tol=0)
    sparse = _run(school_affinity, "tsne", 2, 0, n_iter=120, tol=0, kl_every=10)
    h = sparse.kl_history
    computed = np.flatnonzero(~np.isnan(h))
    assert list(computed) == list(range(0, 120, 10)) + [120]  # and the final KL
    np.testing.assert_allclose(h[computed], every.kl_history[computed], rtol=1e-12)
    np.testing.assert_allclose(sparse.coords, every.coords, rtol=1e-9, atol=1e-12)
    assert sparse.kl == pytest.approx(every.kl, rel=1e-12)


def test_kl_every_still_stops_and_backs_off(school_affinity):
    run = _run(school_affinity, "sne", 2, 0, n_iter=5000, tol=1e-5, kl_every=5)
    assert run.converged and run.iterations < 5000 and run.iterations % 5 == 0
    with pytest.raises(FloatingPointError, match="halvings"):
        _run(school_affinity, "sne", 2, 0, n_iter=1500, learning_rate=1e6, max_backoffs=1, tol=0, kl_every=7)
    with pytest.raises(ValueError, match="kl_every"):
        DeltaBarDelta(kl_every=0)


def test_stalled_reaches_back_over_entries_not_computed():
    from scalemb.optim.base import last_computed, stalled

    history = np.full(31, np.nan)
    history[::10] = [4.0, 3.0, 2.9999, 2.9998]  # 1e-4 per 10 iterations at the end: 3.3e-6 relative each
    assert not stalled(history, 29, 0, 10, 4e-6)  # not computed: no decision
    assert not stalled(history, 10, 0, 10, 4e-6)
    assert stalled(history, 20, 0, 10, 4e-6) and not stalled(history, 20, 0, 10, 3e-6)
    assert stalled(history, 30, 0, 7, 4e-6)  # window 7 reaches back to iteration 20: 10 iterations, not 7
    assert last_computed(history, 29) == 2.9999 and np.isnan(last_computed(np.full(3, np.nan), 2))


def test_auto_optimizer_depends_on_the_input_size():
    """'auto' is the model's default below AUTO_SCALE_MIN_POINTS and its default_optimizer_at_scale from there on:
    t-SNE keeps the spectral direction but with its schedule at scale (x12 momentum exaggeration for 125 steps, 60
    spectral steps bounded to norm 2, then delta-bar-delta polish steps with a spectral step every 25, until the KL
    falls by less than 2e-4 of itself per iteration over 25 iterations, at most 750), SNEST to the same kind of
    schedule with its own exaggeration (x4 for 100 momentum steps, 30 spectral steps, 300 iterations in all; user
    options win); SNE and EE keep their default at every size."""
    from scalemb.models.tsne import SPECTRAL_THEN_POLISH
    from scalemb.optim import (AUTO_SCALE_MIN_POINTS, AutoOptimizer, LineSearchDescent, make_optimizer,
                               resolve_optimizer)

    auto = make_optimizer("auto", "tsne")
    assert isinstance(auto, AutoOptimizer)
    assert resolve_optimizer(auto, AUTO_SCALE_MIN_POINTS - 1).spectral_iterations is None
    big = resolve_optimizer(auto, AUTO_SCALE_MIN_POINTS)
    assert big == LineSearchDescent(**{k: v for k, v in SPECTRAL_THEN_POLISH.items() if k != "optimizer"})
    assert (big.exaggeration, big.exaggeration_iterations, big.exaggeration_steps, big.spectral_iterations,
            big.max_point_step, big.polish_spectral_every, big.max_iterations) == (12.0, 125, "momentum", 60, 3.0,
                                                                                   25, 750)
    assert (big.tol, big.window) == (2e-4, 25)
    assert big.budget(1000) == 750 and big.budget(100) == 100 and LineSearchDescent().budget(1000) == 1000
    from scalemb.models.snest import SPECTRAL_THEN_POLISH as SNEST_AT_SCALE

    snest = make_optimizer("auto", "snest").resolve(10 ** 6)
    assert snest == LineSearchDescent(**{k: v for k, v in SNEST_AT_SCALE.items() if k != "optimizer"})
    assert (snest.exaggeration, snest.exaggeration_iterations, snest.exaggeration_steps, snest.spectral_iterations,
            snest.max_point_step, snest.max_iterations, snest.cg_maxiter) == (4.0, 100, "momentum", 90, 2.0, 300, 5)
    mine = make_optimizer("auto", "tsne", exaggeration=4.0).resolve(10 ** 6)
    assert isinstance(mine, LineSearchDescent) and mine.exaggeration == 4.0 and mine.max_point_step == 3.0
    with pytest.raises(ValueError, match="max_iterations"):
        LineSearchDescent(max_iterations=0)
    # from AUTO_SCHEDULE_MIN_POINTS (below the size at scale) the spectral direction after a momentum
    # exaggeration phase for t-SNE (x12) and SNEST (x6); below it the spectral direction alone
    from scalemb.optim import AUTO_SCHEDULE_MIN_POINTS

    mid = resolve_optimizer(auto, AUTO_SCHEDULE_MIN_POINTS)
    assert (mid.exaggeration, mid.exaggeration_iterations, mid.exaggeration_steps) == (12.0, 125, "momentum")
    assert resolve_optimizer(auto, AUTO_SCHEDULE_MIN_POINTS - 1) == LineSearchDescent()
    snest_mid = make_optimizer("auto", "snest", n_points=5241)
    assert (snest_mid.exaggeration, snest_mid.exaggeration_iterations, snest_mid.exaggeration_momentum) == (6.0, 150,
                                                                                                            0.8)
    assert make_optimizer("auto", "tsne", n_points=5241, exaggeration_iterations=0).exaggeration_iterations == 0
    assert make_optimizer("auto", "sne", n_points=10 ** 6) == DeltaBarDelta()
    assert isinstance(make_optimizer("auto", "ee"), LineSearchDescent)
    assert isinstance(make_optimizer("auto", "ee", n_points=10 ** 6), LineSearchDescent)
    with pytest.raises(ValueError, match="max_step_norm"):
        make_optimizer("auto", "tsne", max_step_norm=-1.0)
    with pytest.raises(ValueError, match="max_point_step"):
        make_optimizer("sd", "tsne", max_point_step=0.0)


def test_max_step_norm_is_one_setting_for_every_optimiser(school_affinity):
    """``max_step_norm`` clips dbd's steps and bounds sd's and gd's (their ``max_point_step``); a value given
    replaces a schedule's; a bad one is refused under its own name, whichever optimiser 'auto' picks."""
    assert make_optimizer("dbd", "tsne", max_step_norm=1.5).max_step_norm == 1.5
    assert make_optimizer("sd", "tsne", max_step_norm=1.5).max_point_step == 1.5
    assert make_optimizer("gd", "tsne", max_step_norm=1.5).max_point_step == 1.5
    assert make_optimizer("auto", "tsne", n_points=10 ** 6).max_point_step == 3.0  # the schedule at scale's
    assert make_optimizer("auto", "tsne", n_points=10 ** 6, max_step_norm=1.5).max_point_step == 1.5
    assert make_optimizer("auto", "snest", max_step_norm=0.5).resolve(10 ** 6).max_point_step == 0.5
    for name in ("sd", "gd", "auto"):
        with pytest.raises(ValueError, match="max_step_norm must be > 0"):
            make_optimizer(name, "tsne", max_step_norm=0.0)
    # through the estimator: each point's spectral step bounded, so the layout stays within the bound's reach
    start = np.random.default_rng(0).normal(size=(school_affinity.n_points, 2)) * 1e-2
    extents = {}
    for bound in (None, 0.05):
        est = scalemb.Embedder(model="tsne", optimizer="sd", max_iter=3, random_state=0, init=start,
                               max_step_norm=bound)
        Y = est.fit_transform(school_affinity)
        moved = Y - start
        extents[bound] = np.linalg.norm(moved - moved.mean(axis=0), axis=1).max()  # the result is centred
        assert est.result_.optimizer.get("max_point_step") == bound
    assert extents[0.05] <= 2 * 3 * 0.05 < 10 * 3 * 0.05 < extents[None]


def test_auto_optimizer_is_resolved_by_fit_and_recorded(tmp_path):
    """A t-SNE fit of a graph above the threshold runs and records the spectral direction with the schedule at
    scale (its own budget recorded too)."""
    from scalemb.affinity import coauthorship_affinity
    from scalemb.io.coauthor_generator import write_coauthor_edge_list
    from scalemb.io.edgelist import read_edge_list
    from scalemb.optim import AUTO_SCALE_MIN_POINTS

    path = write_coauthor_edge_list(tmp_path / "e.txt", 30_000, seed=1)
    affinity = coauthorship_affinity(read_edge_list(path))
    assert affinity.node_ids.size >= AUTO_SCALE_MIN_POINTS
    embedder = scalemb.Embedder(model="tsne", iterations=3, quiet=True).fit(affinity)
    assert embedder.result_.optimizer["optimizer"] == "sd"
    assert embedder.result_.optimizer["exaggeration"] == 12.0 and embedder.result_.optimizer["max_iterations"] == 750
    assert embedder.result_.optimizer["spectral_iterations"] == 60


def test_bounded_direction_scales_long_steps_and_stays_a_descent_direction():
    from scalemb.optim.descent_steps import bounded_direction

    gradient = np.array([[-1.0, -1.0, 1.0], [0.0, 0.0, 0.0]])
    direction = np.array([[3.0, 0.1, -6.0], [4.0, 0.2, 8.0]])
    bounded = bounded_direction(direction, gradient, 5.0)
    assert np.allclose(bounded, [[3.0, 0.1, -3.0], [4.0, 0.2, 4.0]])
    assert np.array_equal(direction, [[3.0, 0.1, -6.0], [4.0, 0.2, 8.0]])  # not modified in place
    # the long column dominated the descent: bounded, the direction ascends; the bounded -gradient is used
    gradient = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    uphill = np.array([[0.4, 0.4, -100.0], [0.0, 0.0, 0.0]])
    assert np.sum(gradient * uphill) < 0 and np.sum(gradient * np.array([[0.4, 0.4, -0.5], [0, 0, 0]])) > 0
    fallback = bounded_direction(uphill, gradient, 0.5)
    assert np.allclose(fallback, [[-0.5, -0.5, -0.5], [0.0, 0.0, 0.0]])


def _descent_moves(affinity, n_iter, **kw):
    """Space moves of every point between successive iterations of a t-SNE sd run from the random start (the
    rigid translation of re-centring removed by taking moves relative to point 0)."""
    from scalemb.optim import LineSearchDescent

    ex = LocalExecutor(affinity, get_model("tsne"), 2, 0)
    coords = initial_coords(affinity.n_points, 2, 0, np.random.default_rng(0))
    states = []
    LineSearchDescent(tol=0, **kw).optimize(ex, coords, n_iter, checkpoint=lambda it, export: states.append(export()))
    moves = np.diff(np.stack([s.coords for s in states]), axis=0)
    return np.linalg.norm(moves - moves[:, :, :1], axis=1)


@pytest.mark.parametrize("solver", ["lu", "cg"])
def test_max_point_step_bounds_every_points_move(school_affinity, solver):
    """Each point moves by at most ``max_point_step`` per iteration (the line search's step is at most 1), so any
    two points' moves differ by at most twice that; unbounded, the first steps are far longer."""
    free = _descent_moves(school_affinity, 6, solver=solver)
    bounded = _descent_moves(school_affinity, 6, solver=solver, max_point_step=0.05)
    assert free.max() > 0.5
    assert bounded.max() <= 2 * 0.05 * (1 + 1e-9) and bounded.max() > 0.05


def test_max_iterations_is_the_schedules_budget_and_continue_lifts_it(school_affinity):
    """``max_iterations`` caps a run whatever ``n_iter`` asks (and the progress total); continuing a finished run
    for n more iterations runs them."""
    from scalemb.embedding import Embedder

    with pytest.raises(ValueError, match="max_iterations"):
        DeltaBarDelta(max_iterations=0)
    embedder = Embedder(model="tsne", iterations=100, optimizer=DeltaBarDelta(max_iterations=30)).fit(school_affinity)
    assert embedder.result_.iterations == 30 and embedder.result_.optimizer["max_iterations"] == 30
    embedder.continue_run(school_affinity, embedder.optimizer_, 20)
    assert embedder.result_.iterations == 50


def test_momentum_exaggeration_phase_then_spectral_steps(school_affinity):
    """``exaggeration_steps='momentum'``: the exaggerated phase takes one bounded momentum step (one evaluation) per
    iteration, then the spectral direction with its line search takes over and the KL never rises again."""
    from scalemb.optim import LineSearchDescent

    with pytest.raises(ValueError, match="exaggeration_steps"):
        LineSearchDescent(exaggeration_steps="dbd")
    ex = LocalExecutor(school_affinity, get_model("tsne"), 2, 0)
    coords = initial_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0))
    kw = dict(exaggeration=12.0, exaggeration_iterations=30, exaggeration_steps="momentum", max_point_step=0.5,
              tol=0.0)
    states = []
    phase = LineSearchDescent(**kw).optimize(ex, coords, 30, checkpoint=lambda it, export: states.append(export()))
    assert phase.evaluations == 31  # the start, then one per iteration: no line search
    moves = np.linalg.norm(np.diff(np.stack([s.coords for s in states]), axis=0), axis=1)
    assert moves.max() <= 2 * 0.5 * (1 + 1e-9)
    run = LineSearchDescent(**kw).optimize(ex, coords, 120)
    after = run.kl_history[31:]
    assert np.all(np.diff(after) <= 1e-12) and run.kl < phase.kl_history[-1]


def test_hybrid_spectral_then_polish_steps(school_affinity):
    """``spectral_iterations=k``: after the exaggeration phase, k spectral iterations with their line search, then
    delta-bar-delta momentum steps, one evaluation each, every point's step bounded by ``max_point_step``; the
    polish steps lower the KL further."""
    from scalemb.optim import LineSearchDescent

    for bad in (-1, 2.5):
        with pytest.raises(ValueError, match="spectral_iterations"):
            LineSearchDescent(spectral_iterations=bad)
    with pytest.raises(ValueError, match="polish_momentum"):
        LineSearchDescent(polish_momentum=1.0)
    ex = LocalExecutor(school_affinity, get_model("tsne"), 2, 0)
    coords = initial_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0))
    kw = dict(exaggeration=12.0, exaggeration_iterations=20, exaggeration_steps="momentum", max_point_step=0.5,
              tol=0.0)
    spectral = LineSearchDescent(**kw).optimize(ex, coords, 30)
    states = []
    hybrid = LineSearchDescent(spectral_iterations=10, **kw).optimize(
        ex, coords, 130, checkpoint=lambda it, export: states.append(export()))
    assert np.array_equal(hybrid.kl_history[:31], spectral.kl_history)  # the same run up to the switch
    assert hybrid.evaluations == spectral.evaluations + 100  # then one evaluation per iteration
    at = {state.iteration: state for state in states}  # checkpoints from iteration 1 on
    assert at[30].gains is None and at[31].gains.shape == (2, school_affinity.n_points)
    moves = np.linalg.norm(np.diff(np.stack([at[i].coords for i in range(30, 130)]), axis=0), axis=1)
    assert moves.max() <= 2 * 0.5 * (1 + 1e-9)
    assert hybrid.kl < spectral.kl


def test_auto_takes_the_schedule_at_scale_for_p_from_points_at_every_size():
    """'auto' for t-SNE: the spectral direction on a graph (from 2e4 points with its schedule at scale), and for P
    made from distances between points (features, a kNN pair, a distance matrix) openTSNE's schedule
    (delta-bar-delta) at every size; a budget below the schedule's 750 iterations shortens its exaggeration phase
    and momentum switch in proportion (a third of the budget), so a short run ends on the objective itself."""
    from scalemb.optim import AUTO_SCALE_MIN_POINTS, default_optimizer_name, fitted_schedule, make_optimizer
    from scalemb.models.base import OPENTSNE_SCHEDULE

    assert default_optimizer_name("tsne", 5000) == "sd"
    assert default_optimizer_name("tsne", 5000, from_points=True) == "dbd"
    assert default_optimizer_name("tsne", AUTO_SCALE_MIN_POINTS) == "sd"  # a graph: the spectral schedule
    assert default_optimizer_name("tsne", AUTO_SCALE_MIN_POINTS, from_points=True) == "dbd"
    assert make_optimizer("auto", "tsne", 10 ** 6, from_points=True).max_iterations == 750
    assert default_optimizer_name("sne", 500, from_points=True) == "dbd"  # SNE's default at every size
    short = make_optimizer("auto", "tsne", 500, from_points=True, iterations=300)
    assert (short.exaggeration_iterations, tuple(short.momentum_switch)) == (100, (100,))
    full = make_optimizer("auto", "tsne", 500, from_points=True, iterations=5000)
    assert (full.exaggeration_iterations, full.max_iterations) == (250, 750)
    assert fitted_schedule(OPENTSNE_SCHEDULE, None) == OPENTSNE_SCHEDULE
    # an explicit setting wins over the fitted schedule
    assert make_optimizer("auto", "tsne", 500, from_points=True, iterations=300,
                          exaggeration_iterations=7).exaggeration_iterations == 7


def test_estimator_on_features_runs_the_schedule_and_on_a_graph_the_spectral_direction():
    import scalemb
    from scalemb.datasets import grqc

    X = np.random.default_rng(0).standard_normal((300, 5))
    est = scalemb.TSNE(max_iter=60, random_state=0).fit(X)
    assert est.result_.optimizer["optimizer"] == "dbd" and est.result_.optimizer["exaggeration_iterations"] == 20
    P = grqc().P
    graph = scalemb.TSNE(max_iter=3, random_state=0, affinity="graph").fit(P)
    assert graph.result_.optimizer["optimizer"] == "sd"


def test_eisenstat_walker_forcing_term():
    """``cg_tol='auto'`` with Jacobi: the first solve at ``EW_MAX``; then ``0.9 (|g_k| / |g_k-1|)^2``, never
    tightened below ``0.9 eta_k-1^2`` while that is above 0.1, clipped to ``[EW_MIN, EW_MAX]``; with another
    preconditioner ``EW_MIN``; a number is used as given."""
    from scalemb.optim import DescentState, LineSearchDescent
    from scalemb.optim.descent import EW_MAX, EW_MIN

    for bad in (0.0, -1.0, "tight", None):
        with pytest.raises(ValueError, match="cg_tol"):
            LineSearchDescent(cg_tol=bad)
    rule = LineSearchDescent(cg_tol="auto")
    state = DescentState.__new__(DescentState)
    state.forcing = state.gradient_norm = None
    g = np.ones((2, 8))
    assert rule._forcing(state, g, "jacobi") == EW_MAX and state.gradient_norm == pytest.approx(4.0)
    assert rule._forcing(state, 0.5 * g, "jacobi") == pytest.approx(max(0.9 * 0.25, 0.9 * EW_MAX ** 2))
    assert rule._forcing(state, 0.05 * g, "jacobi") == pytest.approx(0.9 * 0.01)  # 0.9 * 0.225^2 < 0.1: no safeguard
    state.forcing = 0.5
    assert rule._forcing(state, 0.005 * g, "jacobi") == pytest.approx(0.9 * 0.5 ** 2)  # the safeguard
    state.forcing = 0.01
    assert rule._forcing(state, 1e-6 * g, "jacobi") == EW_MIN  # the floor
    assert rule._forcing(state, 10 * g, "jacobi") == EW_MAX  # the ceiling
    fixed = LineSearchDescent(cg_tol=0.2)
    assert fixed._forcing(state, g, "jacobi") == 0.2
    assert rule._forcing(state, g, "lu") == rule._forcing(state, g, "amg") == EW_MIN


def test_inexact_newton_needs_fewer_cg_products_for_the_same_descent(school_affinity):
    """``cg_tol='auto'`` on the matrix-free solver: the KL falls as with a tight fixed tolerance while CG runs
    fewer Laplacian products per iteration."""
    from scalemb.optim import LineSearchDescent

    results = {}
    for tol in (1e-6, "auto"):
        ex = LocalExecutor(school_affinity, get_model("tsne"), 2, 0)
        calls = [0]
        matvec = ex.laplacian_matvec

        def counted(V, matvec=matvec, calls=calls):
            calls[0] += 1
            return matvec(V)

        ex.laplacian_matvec = counted
        coords = initial_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0))
        run = LineSearchDescent(solver="cg", preconditioner="jacobi", cg_tol=tol, cg_maxiter=200,
                                tol=0.0).optimize(ex, coords, 40)
        results[tol] = (run, calls[0])
    tight, auto = results[1e-6], results["auto"]
    assert np.all(np.diff(auto[0].kl_history) <= 1e-12)
    assert auto[1] < 0.7 * tight[1]
    assert auto[0].kl < tight[0].kl_history[5]


def test_polish_with_a_spectral_step_every_k_iterations(school_affinity):
    """``polish_spectral_every=k``: the hybrid's polish phase, with every k-th iteration a spectral step and its line
    search (the KL not above that step's start); the same run as the hybrid up to the first of them."""
    from scalemb.optim import LineSearchDescent

    with pytest.raises(ValueError, match="polish_spectral_every"):
        LineSearchDescent(polish_spectral_every=0)
    kw = dict(exaggeration=12.0, exaggeration_iterations=20, exaggeration_steps="momentum", max_point_step=0.5,
              spectral_iterations=10, tol=0.0)
    coords = initial_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0))
    runs = {}
    for every in (None, 10):
        ex = LocalExecutor(school_affinity, get_model("tsne"), 2, 0)
        runs[every] = LineSearchDescent(polish_spectral_every=every, **kw).optimize(ex, coords, 80)
    plain, mixed = runs[None], runs[10]
    assert np.array_equal(plain.kl_history[:40], mixed.kl_history[:40])  # iterations 0-39; 40 is the first
    assert not np.array_equal(plain.kl_history[41:], mixed.kl_history[41:])
    for i in (40, 50, 60, 70):  # the spectral steps' line search: the KL does not rise
        assert mixed.kl_history[i + 1] <= mixed.kl_history[i] + 1e-12


def test_the_spectral_schedule_stops_when_the_kl_flattens(school_affinity):
    """t-SNE's schedule at scale ends by its relative-KL rule (``tol`` of the KL per iteration, averaged over
    ``window`` iterations: opt-SNE's), not at its cap, once the polish steps flatten the KL: the run is marked
    converged, the rule holds at its last iteration and at none before it, and without the rule the same run goes on
    to the cap through the same iterates."""
    from scalemb.models.tsne import SPECTRAL_THEN_POLISH
    from scalemb.optim import LineSearchDescent
    from scalemb.optim.base import stalled

    kw = {**{k: v for k, v in SPECTRAL_THEN_POLISH.items() if k not in ("optimizer", "solver", "preconditioner")},
          "exaggeration_iterations": 20, "spectral_iterations": 10, "polish_spectral_every": 6, "window": 10,
          "max_iterations": 300}
    coords = initial_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0))
    ruled = LineSearchDescent(**kw).optimize(LocalExecutor(school_affinity, get_model("tsne"), 2, 0), coords, 1000)
    assert ruled.converged and ruled.iterations < 300
    h, end = ruled.kl_history, ruled.iterations
    assert stalled(h, end, 20, 10, kw["tol"])
    assert not any(stalled(h, it, 20, 10, kw["tol"]) for it in range(end))
    capped = LineSearchDescent(**{**kw, "tol": 0.0}).optimize(LocalExecutor(school_affinity, get_model("tsne"), 2, 0),
                                                               coords, 1000)
    assert capped.iterations == 300 and not capped.converged
    assert np.array_equal(capped.kl_history[:end + 1], h[:end + 1])


def test_spectral_schedule_budget_caps_the_run_and_continue_lifts_it(school_affinity):
    """``LineSearchDescent.max_iterations`` (the spectral schedule at scale's own budget): a run asked for more
    makes at most that many iterations, its config round-trips, and ``continue`` (the runner's
    ``replace(optimizer, max_iterations=None)``) goes on from the state past it."""
    from dataclasses import replace

    from scalemb.optim import LineSearchDescent, optimizer_config, optimizer_from_config

    opt = LineSearchDescent(max_iterations=6, tol=0.0)
    assert optimizer_from_config(optimizer_config(opt)) == opt and opt.params()["max_iterations"] == 6
    assert "max_iterations" not in LineSearchDescent().params()  # results without a budget record as before
    with LocalExecutor(school_affinity, get_model("tsne"), 2, 0) as ex:
        start = initial_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0))
        first = opt.optimize(ex, start, 20)
        assert first.iterations == 6
        more = replace(opt, max_iterations=None).optimize(ex, start, 10, state=first.state)
        assert more.iterations > 6 and more.kl <= first.kl


def test_snest_polish_steps_take_the_starting_time_rate_and_back_off_from_a_blow_up(school_affinity, caplog):
    """SNEST's polish steps (no line search) move time by delta-bar-delta's rule from the starting time rate
    (``LineSearchDescent._time_rate``), not the line search's grown one; a momentum step whose evaluation is not
    finite (time coordinates thrown past ``exp(Δt²)``'s range by a time rate far too large) is undone, the time
    rates halved, and after ``max_failures`` of them in a row the run stops at the last finite point instead of
    raising."""
    from scalemb.optim import LineSearchDescent

    coords = initial_coords(school_affinity.n_points, 2, 1, np.random.default_rng(0))
    states = []
    rule = LineSearchDescent(spectral_iterations=10, tol=0.0)
    run = rule.optimize(LocalExecutor(school_affinity, get_model("snest"), 2, 1), coords, 40,
                        checkpoint=lambda it, export: states.append(export()))
    at = {state.iteration: state for state in states}
    assert at[10].polish_time_rate is None and at[11].polish_time_rate == rule._time_rate(school_affinity.n_points)
    assert at[10].time_rate != at[11].polish_time_rate and np.isfinite(run.kl) and run.iterations == 40
    assert run.kl < at[11].kl
    wild = LineSearchDescent(spectral_iterations=10, tol=0.0, time_rate=1e5, max_failures=4)
    with caplog.at_level("WARNING", logger="scalemb"):
        run = wild.optimize(LocalExecutor(school_affinity, get_model("snest"), 2, 1), coords, 40)
    assert "diverged" in caplog.text and run.iterations < 40 and np.isfinite(run.kl)
    assert np.all(np.isfinite(run.coords))


def test_time_gains_give_each_points_time_step_its_own_gain(school_affinity):
    """``time_gains=g``: each point's time step in the line-search direction is scaled by its own gain (ones at
    first, ``+0.2`` while its time gradient keeps its sign against the last accepted time step, ``x0.8`` otherwise,
    within ``[0.01, g]``); the space rows and a run without time rows are untouched; SNEST's small-size default
    sets it, the schedule at scale does not."""
    from scalemb.optim import LineSearchDescent, make_optimizer
    from scalemb.optim.descent_steps import time_gains

    for bad in (0.5, "2", -1.0):
        with pytest.raises(ValueError, match="time_gains"):
            LineSearchDescent(time_gains=bad)
    gains = time_gains(None, np.array([[1.0, -1.0, 2.0]]), None, 2.0)
    assert np.array_equal(gains, np.ones((1, 3)))
    gains = time_gains(gains, np.array([[1.0, -1.0, 2.0]]), np.array([[-0.1, -0.1, 0.3]]), 2.0)
    assert np.allclose(gains, [[1.2, 0.8, 0.8]])
    gains = time_gains(np.array([[1.9, 0.011, 1.0]]), np.array([[1.0, 1.0, 1.0]]), np.array([[-1.0, 1.0, 1.0]]),
                       2.0)
    assert np.allclose(gains, [[2.0, 0.01, 0.8]])
    assert make_optimizer("auto", "snest", 5000).time_gains == 2.0
    assert make_optimizer("auto", "snest", 50_000).time_gains is None
    assert "time_gains" not in LineSearchDescent().params() and LineSearchDescent(time_gains=3).params()[
        "time_gains"] == 3

    ex = LocalExecutor(school_affinity, get_model("snest"), 2, 1)
    coords = initial_coords(school_affinity.n_points, 2, 1, np.random.default_rng(0))
    kw = dict(exaggeration=4.0, exaggeration_iterations=10, exaggeration_steps="momentum", tol=0.0)
    states = []
    run = LineSearchDescent(time_gains=2.0, **kw).optimize(ex, coords, 40,
                                                           checkpoint=lambda it, export: states.append(export()))
    plain = LineSearchDescent(**kw).optimize(ex, coords, 40)
    assert np.array_equal(run.kl_history[:11], plain.kl_history[:11])  # the same run through the momentum phase
    at = {state.iteration: state for state in states}
    assert at[10].time_gains is None and at[39].time_gains.shape == (1, school_affinity.n_points)
    assert at[39].time_gains.min() >= 0.01 and at[39].time_gains.max() <= 2.0
    assert np.array_equal(at[11].time_gains, np.ones((1, school_affinity.n_points)))  # the first spectral step's
    assert at[39].time_gains.max() > 1  # grown where the time descent kept its direction
    assert not np.array_equal(run.coords, plain.coords) and np.all(np.isfinite(run.coords))
    tsne = LocalExecutor(school_affinity, get_model("tsne"), 2, 0)
    start = initial_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0))
    assert np.array_equal(LineSearchDescent(time_gains=2.0, **kw).optimize(tsne, start, 20).coords,
                          LineSearchDescent(**kw).optimize(tsne, start, 20).coords)


@pytest.mark.parametrize("optimizer", ["dbd", "sd"])
def test_coordinates_of_the_wrong_shape_are_refused(school_affinity, optimizer):
    """The kernels read rows by index: (5, N) coordinates for an R^{2,1} executor ran before and gave numbers."""
    from scalemb.optim import make_optimizer

    with LocalExecutor(school_affinity, get_model("snest"), 2, 1) as ex:
        for bad in (initial_coords(ex.n_points, 3, 2, np.random.default_rng(0)),
                    initial_coords(ex.n_points - 1, 2, 1, np.random.default_rng(0))):
            with pytest.raises(ValueError, match=r"expects \(3, "):
                make_optimizer(optimizer, "snest", ex.n_points).optimize(ex, bad, 5)
            with pytest.raises(ValueError, match="coordinates of shape"):
                ex.evaluate(bad)
