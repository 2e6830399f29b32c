"""Progress reporting: each phase of a run with its time, and the optimisation as a bar with an ETA.

A run's phases -- reading the input, the kNN search, the perplexity calibration, the initialisation, the
optimisation -- each report once when they start and once with their time when they end (``phase``), through the
``scalemb`` logger at INFO; an interrupted phase says so ("kNN interrupted after 12.3 s").  Reports are on
inside ``reporting(True)`` (the estimator's ``verbose=True``, the CLI unless ``--quiet``): there the logger
passes INFO and, if nothing would show its records (no handler configured, as in a fresh Python session or a
notebook), writes them to stderr for the duration.  The phases run on the caller's thread (a Dask run's workers
report nothing), so a context variable carries the switch to the code that reads and builds P.

The optimisation is a ``tqdm.auto`` bar (a widget in a notebook, text on a terminal; a few log lines on a
non-terminal stream).  Its total is the iteration count the run is *expected* to make, not the budget: a run
stops once its KL fell by less than ``tol`` (relative, per iteration, averaged over ``window`` iterations; the
optimisers' ``stalled`` rule) and that happens long before ``--iterations`` in practice.  The expected stop is
extrapolated from the KL so far: the relative decrease per iteration over the last window, ``r(t)``, measured at
the current iteration ``t`` and half-way back to the rule's first window, fitted by a power law ``r ~ t^-b``
(``t`` counted from the rule's start, e.g. the end of early exaggeration, a window's mean placed at its middle);
the run is expected to stop where that law reaches ``tol``, capped by the budget.  Before that (e.g. during
early exaggeration), or when ``r`` does not fall, the total is the budget and the log says "<=".
"""
import contextvars
import logging
import math
import sys
import time
from contextlib import contextmanager

logger = logging.getLogger("scalemb")

LOG_SECONDS = 30.0  # without a bar: a log line every tenth of the expected iterations, at least this often
_REPORTING = contextvars.ContextVar("scalemb_reporting", default=False)
SIGNALS: list[int] = []  # SIGINT/SIGTERM received by the CLI's handler in this process (``note_signal``)


def note_signal(signum: int) -> None:
    """Record that ``signum`` arrived (the CLI's handler calls this before raising KeyboardInterrupt), so that a
    phase which then ends normally -- the KeyboardInterrupt raised inside a C callback and swallowed there, as
    llvmlite's ctypes callbacks do while numba compiles ("Exception ignored on calling ctypes callback function") --
    is still ended as interrupted (``phase``)."""
    SIGNALS.append(signum)


def value_label(model_name: str) -> str:
    """What a run's reported value is called: its model's ``Objective.name`` (KL, E for the elastic embedding);
    'objective' for a model this process does not know (registered elsewhere)."""
    from .models import get_model

    try:
        return get_model(model_name).objective.name.upper()
    except ValueError:
        return "objective"


def reporting_on() -> bool:
    """True inside ``reporting(True)``."""
    return _REPORTING.get()


@contextmanager
def reporting(enabled: bool = True, stream=None):
    """Phase reports and the optimisation's progress on (``enabled``) or off within the block.  On: the
    ``scalemb`` logger passes INFO, and if no handler would show its records, a handler writing ``scalemb
    MESSAGE`` lines to ``stream`` (default stderr) is attached for the block.  Nested blocks keep the outer
    block's handler."""
    token = _REPORTING.set(bool(enabled))
    handler, level = None, logger.level
    try:
        if enabled:
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
            if not _shown(logger):
                handler = logging.StreamHandler(stream or sys.stderr)
                handler.setFormatter(logging.Formatter("scalemb %(message)s"))
                logger.addHandler(handler)
        yield
    finally:
        if handler is not None:
            logger.removeHandler(handler)
        logger.setLevel(level)
        _REPORTING.reset(token)


def _shown(log: logging.Logger) -> bool:
    """Whether some handler on ``log``'s path to the root takes INFO records (the last-resort handler does not)."""
    current = log
    while current is not None:
        if any(h.level <= logging.INFO for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


@contextmanager
def phase(name: str, detail: str = ""):
    """Report phase ``name`` (``detail``: e.g. the input's size) when it starts and with its time when it ends,
    inside ``reporting(True)``; Ctrl-C is reported as the phase's interruption (an error is left to its own
    one-line message) and re-raised.  A signal noted (``note_signal``) while the phase ran whose KeyboardInterrupt
    never reached here -- swallowed inside a C callback -- interrupts the phase at its end: the run does not go on
    as if nothing had been asked."""
    signals = len(SIGNALS)
    start = time.perf_counter()
    try:
        if _REPORTING.get():
            logger.info("%s%s ...", name, f" ({detail})" if detail else "")
        yield
        if len(SIGNALS) > signals:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        if _REPORTING.get():
            logger.info("%s interrupted after %.1f s", name, time.perf_counter() - start)
        raise
    if _REPORTING.get():
        logger.info("%s done in %.1f s", name, time.perf_counter() - start)


def _in_notebook() -> bool:
    """Running in a Jupyter kernel (where ``tqdm.auto`` draws a widget)."""
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
    except Exception:  # noqa: BLE001 - IPython present but unusable: not a notebook
        return False
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def expected_iterations(history: list, budget: int, start: int = 0, window: int = 0, tol: float = 0.0) -> int:
    """The iteration count a run stopping by the ``stalled`` rule (``tol``, ``window``, after ``start``) is expected
    to make, from its KL ``history`` so far (NaN entries: not computed); ``budget`` when it cannot be told yet
    (module docstring: a power law through the mean relative decrease at ``t`` and ``t / 2``)."""
    t = len(history) - 1
    if tol <= 0 or window < 1 or t < start + window:
        return budget
    half = start + window + (t - start - window) // 2  # the earlier measurement: within the rule's span

    def rate(it):
        back = it - window
        while back >= 0 and not math.isfinite(history[back]):
            back -= 1
        now = history[it]
        if back < 0 or not math.isfinite(now) or now == 0:
            return None
        return (history[back] - now) / ((it - back) * abs(now))

    late = rate(t)
    if late is not None and 0 <= late < tol:
        return min(budget, t + 1)
    early = rate(half) if t - half >= 10 else None
    if late is None or early is None or late <= 0 or early <= late:
        return budget
    # a window's mean rate is the rate at its middle, w / 2 back
    steps_late, steps_early = t - start - window / 2, half - start - window / 2
    b = math.log(early / late) / math.log(steps_late / steps_early)
    expected = start + window / 2 + steps_late * (late / tol) ** (1.0 / b)
    return int(min(budget, max(t + 1, math.ceil(expected))))


class Progress:
    """Callable ``(iteration, kl)`` that reports an optimisation run of at most ``total`` iterations; ``listener(
    iteration, kl)``, if given, is called first at every iteration (e.g. the service's job record).  ``value``:
    what the reported number is called (the model's objective, ``Objective.name``: KL, or E for the elastic
    embedding).  ``stop_rule``: ``(start, window, tol)`` of the optimiser's stalled rule, from which the expected
    iteration count (the bar's total and the ETA's) is estimated (module docstring); None: the total is
    ``total``.  ``quiet``: nothing is shown (the listener is still called)."""

    def __init__(self, total: int, label: str = "", quiet: bool = False, stream=None, listener=None,
                 value: str = "KL", stop_rule=None):
        self.listener = listener
        self.value = value
        self.total = int(total)
        self.label = label
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.stop_rule = stop_rule
        self.history = []
        self.expected = self.total
        self._bar = None
        self._every = max(1, self.total // 10)
        self._next_log = 0
        self._logged = self.start
        self._first = None  # when iteration 1 was reported
        if not quiet:
            logger.info("%s optimisation ... (at most %d iterations)", label or "embed", self.total)
            if _in_notebook() or getattr(self.stream, "isatty", lambda: False)():
                from tqdm.auto import tqdm

                self._bar = tqdm(total=self.total, desc=label or "embed", file=self.stream, unit="it",
                                 dynamic_ncols=True, mininterval=0.25)

    def __call__(self, iteration: int, kl: float) -> None:
        if self.listener is not None:
            self.listener(iteration, kl)
        if self.quiet:
            return
        if iteration == 1 or (self._first is None and iteration > 1):
            self._first = time.perf_counter()
        del self.history[iteration:]  # a line search or restart reports an iteration again: keep the last
        self.history.extend([math.nan] * (iteration - len(self.history)))
        self.history.append(float(kl))
        if self.stop_rule is not None and iteration % 10 == 0:
            start, window, tol = self.stop_rule
            self.expected = expected_iterations(self.history, self.total, start, window, tol)
        if self._bar is not None:
            if self._bar.total != self.expected:
                self._bar.total = self.expected
            self._bar.update(iteration + 1 - self._bar.n)
            if iteration % 10 == 0:
                self._bar.set_postfix_str(f"{self.value} {kl:.4f}", refresh=False)
        elif iteration >= self._next_log or time.perf_counter() - self._logged >= LOG_SECONDS:
            self._next_log = iteration + max(1, self.expected // 10)
            self._logged = time.perf_counter()
            elapsed = self._logged - self.start
            expected = f"~{self.expected}" if self.expected < self.total else f"<={self.total}"
            # the rate from iteration 1 on: the first holds one-off costs (compilation, the grid's set-up)
            eta = f"  ETA {(self._logged - self._first) / (iteration - 1) * (self.expected - iteration):.0f}s" \
                if iteration > 1 and self._first is not None else ""
            logger.info("%s iteration %d/%s  %s %.4f  %.1fs%s", self.label, iteration, expected, self.value, kl,
                        elapsed, eta)

    def close(self, kl: float | None = None, interrupted: BaseException | None = None) -> None:
        """End the report: the run's time, iterations and final value; ``interrupted``: the exception that ended
        the run early (reported as such)."""
        if self.quiet:
            return
        if self._bar is not None:
            if interrupted is None:
                self._bar.total = self._bar.n  # the run made this many: the bar ends full
            if kl is not None:
                self._bar.set_postfix_str(f"{self.value} {kl:.4f}")
            self._bar.close()
            self._bar = None
        done = len(self.history)
        elapsed = time.perf_counter() - self.start
        if interrupted is not None:
            how = "interrupted" if isinstance(interrupted, KeyboardInterrupt) or \
                type(interrupted).__name__ == "RunInterrupted" else "failed"
            logger.info("%s optimisation %s after %.1f s (%d iterations)", self.label or "embed", how, elapsed, done)
            return
        final = kl if kl is not None else (self.history[-1] if self.history else None)
        logger.info("%s optimisation done in %.1f s (%d iterations%s)", self.label or "embed", elapsed, done,
                    "" if final is None else f", {self.value} {final:.4f}")
