"""The in-process executor measures whether its thread pool pays (``scalemb.engine.threadchoice``): the verdicts
follow the timings, the trials become rare, and no evaluation's numbers depend on them."""
import numpy as np
import pytest

from scalemb.datasets import school
from scalemb.engine import LocalExecutor
from scalemb.engine import threadchoice
from scalemb.engine.threadchoice import ThreadChoice
from scalemb.models import get_model


def drive(choice: ThreadChoice, n: int, seconds) -> list:
    """Run ``n`` evaluations through ``choice`` with ``seconds(pooled, i)`` as their timings; the modes used."""
    modes = []
    for i in range(n):
        pooled = choice.pooled()
        modes.append(pooled)
        choice.record(pooled, seconds(pooled, i))
    return modes


def test_a_pool_that_pays_is_kept_and_trials_become_rare():
    choice = ThreadChoice()
    modes = drive(choice, 2000, lambda pooled, i: 0.010 if pooled else 0.018)
    assert choice.use_pool and all(pooled for _, _, pooled in choice.history)
    assert [round(s, 3) for _, s, _ in choice.history][0] == 1.8
    alone = modes.count(False)
    assert alone == 2 * len(choice.history)  # a clear verdict after 4 evaluations, half of them alone
    assert len(choice.history) <= 5  # gaps 32, 128, 512, ...: a clear verdict waits 4x as long
    assert modes[:threadchoice.WARM_UP] == [True] * threadchoice.WARM_UP


def test_a_pool_that_does_not_pay_is_left():
    choice = ThreadChoice()
    modes = drive(choice, 500, lambda pooled, i: 0.021 if pooled else 0.020)
    assert not choice.use_pool
    assert modes.count(True) == 6 * len(choice.history) + threadchoice.WARM_UP  # 12 per trial: no clear verdict
    assert all(not pooled for _, _, pooled in choice.history)


def test_the_verdict_follows_a_change_of_cost():
    """Early on the pool does not pay (small layouts), later it does: a later trial takes it back."""
    choice = ThreadChoice()
    drive(choice, 1000, lambda pooled, i: (0.010 if pooled else 0.009) if i < 100 else (0.010 if pooled else 0.019))
    verdicts = [pooled for _, _, pooled in choice.history]
    assert verdicts[0] is False and verdicts[-1] is True and choice.use_pool


def test_an_aba_order_balances_a_steadily_growing_cost():
    """Costs rising by 2 % per evaluation, the pool exactly as fast as one thread: no false verdict for it (the
    fastest evaluation each way, the first of each in the trial: one evaluation's growth apart)."""
    choice = ThreadChoice()
    drive(choice, 40, lambda pooled, i: 0.01 * 1.02 ** i)
    speedup = choice.history[0][1]
    assert speedup == pytest.approx(1.0, abs=0.03) and not choice.use_pool


@pytest.mark.parametrize("model,ds,dt", [("tsne", 2, 0), ("snest", 2, 1)])
def test_measured_threads_change_no_bit(model, ds, dt):
    """Evaluations on the pool and alone, as the trials alternate them, equal the one-thread executor's bit for
    bit, exact and FFT repulsion alike."""
    affinity = school()
    Y = np.random.default_rng(5).normal(0, 3.0, (ds + dt, affinity.n_points))
    for repulsion in ("exact", "fft"):
        with LocalExecutor(affinity, get_model(model), ds, dt, n_threads=1, n_blocks=4, repulsion=repulsion) as one:
            want = one.evaluate(Y)
        assert one.thread_choice is None
        with LocalExecutor(affinity, get_model(model), ds, dt, n_threads=2, n_blocks=4, repulsion=repulsion) as ex:
            used = []
            for _ in range(threadchoice.WARM_UP + len(threadchoice.TRIAL) + 2):
                used.append(ex.thread_choice.pooled())
                got = ex.evaluate(Y)
                np.testing.assert_array_equal(got.gradient, want.gradient)
                assert got.kl == want.kl and got.objective == want.objective
            assert set(used) == {True, False} and len(ex.thread_choice.history) == 1
            assert not ex._alone  # the pool is back for the other operations
        with LocalExecutor(affinity, get_model(model), ds, dt, n_threads=2, n_blocks=4, repulsion=repulsion,
                           measure_threads=False) as fixed:
            assert fixed.thread_choice is None
            np.testing.assert_array_equal(fixed.evaluate(Y).gradient, want.gradient)


def test_one_slow_evaluation_does_not_turn_the_verdict():
    """A shared host's interference only adds time: a pooled evaluation slowed 5x in the trial still leaves the
    pool's fastest evaluation the measure."""
    choice = ThreadChoice()
    spike = threadchoice.WARM_UP  # the trial's first pooled evaluation
    drive(choice, 20, lambda pooled, i: (0.05 if i == spike else 0.010) if pooled else 0.018)
    assert choice.history[0][2] is True and choice.use_pool
