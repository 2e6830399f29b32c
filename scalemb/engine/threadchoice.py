"""Whether the in-process executor's evaluations use its thread pool: measured during the run.

A second thread does not always pay: on a host whose two vCPUs share a core, the FFT evaluations of a 1.6e4-point
t-SNE layout took as long on two threads as on one, for 1.3-1.6x the CPU, while the exact all-pairs kernel and the
FFT evaluations of 1e5-1e6 points ran 1.4-1.9x faster on two; elsewhere two threads paid at every size measured
(docs/design/engine.md, "Threads that pay").  No size rule fits every host, so ``ThreadChoice`` times the
evaluations themselves: a trial runs evaluations alternately on the pool and on the calling thread alone
(``TRIAL``, in ABBA order), ending after 4, 8 or 12 as soon as its verdict is clear, and the pool is kept while it is
at least ``MIN_SPEEDUP`` times faster (the fastest evaluation each way).  Trials repeat as the run goes on -- an
evaluation's cost changes as the layout grows, and so may the host's load -- the first after ``WARM_UP``
evaluations, the next ``FIRST_GAP`` evaluations after it, each gap twice the last (four times after a clear
verdict, ``CLEAR``): a run of N evaluations spends ~log2(N / FIRST_GAP) trials.  An evaluation gives the same
numbers on one thread or on many (the row-block contract): this changes a run's time and CPU, never its result.
"""
# A trial's evaluations, alternately pooled and alone (ABBA BAAB ABBA: a cost growing steadily with the layout
# weighs on both alike at each stage); it ends after 4 or 8 of them on a clear verdict, else after 12.
TRIAL = ("pool", "alone", "alone", "pool", "alone", "pool", "pool", "alone", "pool", "alone", "alone", "pool")
STAGES = (4, 8, 12)
# The pool is kept while an evaluation on it is at least this much faster than on one thread: below, the second
# thread buys less wall time than the noise of a shared host, for up to twice the CPU.
MIN_SPEEDUP = 1.1
# Speed-ups outside [1 / CLEAR, CLEAR] x MIN_SPEEDUP are clear verdicts: the trial ends at once, and the next one
# waits 4x as long, not 2x.
CLEAR = 1.4
# Evaluations skipped before the first trial (the first compiles kernels and builds caches), and after it the
# evaluations before the next.
WARM_UP = 2
FIRST_GAP = 32


class ThreadChoice:
    """Decides, evaluation by evaluation, whether to use the pool (``pooled()``), learning from ``record``.

    Each way's cost is the fastest of its trial evaluations: a shared host's interference only adds time, and a
    steady load on the other core slows every pooled evaluation alike.  ``history``: one ``(evaluation,
    speed-up, pooled)`` per finished trial."""

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
        """The wall ``seconds`` of the evaluation just run (``pooled``: on the pool).  Ends the trial with its
        verdict at a stage of ``STAGES`` (``_verdict``)."""
        k = self._in_trial()
        self.count += 1
        if k is None:
            return
        self.samples["pool" if pooled else "alone"].append(float(seconds))
        if k + 1 in STAGES:
            self._verdict(last=k + 1 == STAGES[-1])

    def _verdict(self, last: bool) -> None:
        speedup = min(self.samples["alone"]) / max(min(self.samples["pool"]), 1e-12)
        clear = speedup >= CLEAR * MIN_SPEEDUP or speedup <= MIN_SPEEDUP / CLEAR
        if not (clear or last):
            return
        self.use_pool = speedup >= MIN_SPEEDUP
        self.history.append((self.count, speedup, self.use_pool))
        self.next_trial = self.count + self.gap
        self.gap *= 4 if clear else 2
        self.samples = {"pool": [], "alone": []}
