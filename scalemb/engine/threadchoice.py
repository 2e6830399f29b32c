"""Whether the in-process executor's evaluations use its thread pool: measured during the run.

A second thread does not always pay: on a host whose two vCPUs share a core, the FFT evaluations of a 1.6e4-point
t-SNE layout took as long on two threads as on one, for 1.3-1.6x the CPU, while the exact all-pairs kernel and the
FFT evaluations of 1e5-1e6 points ran 1.4-1.9x faster on two; elsewhere two threads paid at every size measured
(docs/design/engine.md, "Threads that pay").  No size rule fits every host, so ``ThreadChoice`` times the
evaluations themselves: a trial runs the evaluations of ``TRIAL`` alternately on the pool and on the calling
thread alone (ABBA order: a cost growing steadily with the layout weighs on both alike), and the pool is kept while
it is at least ``MIN_SPEEDUP`` times faster (median against median).  Trials repeat as the run goes on -- an
evaluation's cost changes as the layout grows, and so may the host's load -- the first after ``WARM_UP``
evaluations, the next ``FIRST_GAP`` evaluations after it, each gap twice the last (four times after a clear
verdict, ``CLEAR``): a run of N evaluations spends ~log2(N / FIRST_GAP) trials.  An evaluation gives the same
numbers on one thread or on many (the row-block contract): this changes a run's time and CPU, never its result.
"""
import statistics

# Evaluations per trial, alternately pooled and alone (ABBA ...): half of them each way.
TRIAL = ("pool", "alone", "alone", "pool", "pool", "alone")
# The pool is kept while an evaluation on it is at least this much faster than on one thread: below, the second
# thread buys less wall time than the noise of a shared host, for up to twice the CPU.
MIN_SPEEDUP = 1.1
# Speed-ups outside [1 / CLEAR, CLEAR] x MIN_SPEEDUP are clear verdicts: the next trial waits 4x as long, not 2x.
CLEAR = 1.4
# Evaluations skipped before the first trial (the first compiles kernels and builds caches), and after it the
# evaluations before the next.
WARM_UP = 2
FIRST_GAP = 32


class ThreadChoice:
    """Decides, evaluation by evaluation, whether to use the pool (``pooled()``), learning from ``record``.

    ``history``: one ``(evaluation, speed-up, pooled)`` per finished trial."""

    def __init__(self):
        self.count = 0  # evaluations recorded
        self.use_pool = True
        self.next_trial = WARM_UP
        self.gap = FIRST_GAP
        self.samples = {"pool": [], "alone": []}
        self.history = []

    def _in_trial(self) -> int | None:
        """The position of the next evaluation in the current trial, None outside one."""
        k = self.count - self.next_trial
        return k if 0 <= k < len(TRIAL) else None

    def pooled(self) -> bool:
        """Whether the next evaluation runs on the pool."""
        k = self._in_trial()
        return self.use_pool if k is None else TRIAL[k] == "pool"

    def record(self, pooled: bool, seconds: float) -> None:
        """The wall ``seconds`` of the evaluation just run (``pooled``: on the pool).  Closes a trial with its
        verdict once all of its evaluations are in."""
        k = self._in_trial()
        self.count += 1
        if k is None:
            return
        self.samples["pool" if pooled else "alone"].append(float(seconds))
        if k < len(TRIAL) - 1:
            return
        speedup = statistics.median(self.samples["alone"]) / max(statistics.median(self.samples["pool"]), 1e-12)
        self.use_pool = speedup >= MIN_SPEEDUP
        self.history.append((self.count, speedup, self.use_pool))
        clear = speedup >= CLEAR * MIN_SPEEDUP or speedup <= MIN_SPEEDUP / CLEAR
        self.next_trial = self.count + self.gap
        self.gap *= 4 if clear else 2
        self.samples = {"pool": [], "alone": []}
