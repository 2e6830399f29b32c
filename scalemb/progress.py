"""Progress reporting: a tqdm bar on a terminal, a few log lines otherwise, nothing when quiet."""
import logging
import sys
import time

logger = logging.getLogger("scalemb")


def value_label(model_name: str) -> str:
    """What a run's reported value is called: its model's ``Objective.name`` (KL, E for the elastic embedding);
    'objective' for a model this process does not know (registered elsewhere)."""
    from .models import get_model

    try:
        return get_model(model_name).objective.name.upper()
    except ValueError:
        return "objective"


class Progress:
    """Callable ``(iteration, kl)`` that reports an optimisation run of ``total`` iterations; ``listener(iteration,
    kl)``, if given, is called first at every iteration (e.g. the service's job record).  ``value``: what the
    reported number is called (the model's objective, ``Objective.name``: KL, or E for the elastic embedding)."""

    def __init__(self, total: int, label: str = "", quiet: bool = False, stream=None, listener=None,
                 value: str = "KL"):
        self.listener = listener
        self.value = value
        self.total = total
        self.label = label
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self._bar = None
        self._every = max(1, total // 10)
        if not quiet and getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label or "embed", file=self.stream, unit="it",
                             dynamic_ncols=True, mininterval=0.25)

    def __call__(self, iteration: int, kl: float) -> None:
        if self.listener is not None:
            self.listener(iteration, kl)
        if self._bar is not None:
            self._bar.update(iteration + 1 - self._bar.n)
            if iteration % 10 == 0:
                self._bar.set_postfix_str(f"{self.value} {kl:.4f}", refresh=False)
        elif not self.quiet and (iteration % self._every == 0):
            elapsed = time.perf_counter() - self.start
            # at most: the run may stop earlier at its tolerance
            eta = f"  ETA <= {elapsed / iteration * (self.total - iteration):.0f}s" if iteration > 0 else ""
            logger.info("%s iteration %d/%d  %s %.4f  %.1fs%s", self.label, iteration, self.total, self.value, kl,
                        elapsed, eta)

    def close(self, kl: float | None = None) -> None:
        if self._bar is not None:
            if kl is not None:
                self._bar.set_postfix_str(f"{self.value} {kl:.4f}")
            self._bar.close()
            self._bar = None
        elif not self.quiet and kl is not None:
            logger.info("%s done  %s %.4f  %.1fs", self.label, self.value, kl, time.perf_counter() - self.start)
