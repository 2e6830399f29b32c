"""A done job's quality metrics, a phase of its own (``scalemb.service.runner``'s module docstring): computed once,
on a background thread, by the replica that claims the phase (``JobStore.claim_metrics``), written to the job's
``metrics.json``; ``metrics_state`` records ``running``/``done``/``failed`` and ``metrics_error`` why.  While it
runs, the runner's heartbeat renews its lease (``evaluating``)."""
import logging
import threading

from ..metrics import evaluate_run, to_json
from ..report.page import write_text_atomic
from .jobs import disk_full
from .jsonsafe import dumps, loads

logger = logging.getLogger("scalemb")


class MetricsPhase:
    """The metrics phase of the jobs of one ``JobRunner`` (``runner``: its store, paths, threads and job log)."""

    def __init__(self, runner):
        self.runner = runner
        self._lock = threading.Lock()
        self._evaluating = set()  # done jobs whose metrics this service computes

    def evaluating(self) -> set:
        """The jobs whose metrics this service is computing now (their leases are renewed)."""
        with self._lock:
            return set(self._evaluating)

    def metrics(self, record: dict):
        """The done job's metrics (``metrics.json``), or ``None`` while they are computed (a background thread
        started when the job finished, or here for a job whose evaluator stopped) or when they failed
        (``metrics_state`` 'failed', the reason in ``metrics_error``)."""
        job_id = record["id"]
        path = self.runner.run_dir(job_id) / "metrics.json"
        if path.exists():
            return loads(path.read_text())
        if record.get("metrics_state") != "failed":
            self.start(job_id)
        return None

    def start(self, job_id: str) -> None:
        """Compute the done job's metrics on a thread of their own, unless this or another replica does."""
        with self._lock:
            if job_id in self._evaluating:
                return
        try:
            if not self.runner.store.claim_metrics(job_id, self.runner.owner):
                return
        except self.runner.store._errors as exc:
            logger.warning("job %s: metrics not started (%s)", job_id, str(exc).splitlines()[0])
            return
        with self._lock:
            self._evaluating.add(job_id)
        threading.Thread(target=self._evaluate, args=(job_id,), name=f"scalemb-metrics-{job_id}", daemon=True).start()

    def _evaluate(self, job_id: str) -> None:
        """Write the run's quality metrics to ``metrics.json``: the job's metrics phase.  A failure leaves the
        job done with ``metrics_state`` 'failed' and the reason in ``metrics_error`` and its log (a full disk:
        tried again on the next request for them)."""

        self.runner._current.job = job_id
        self.runner.store.log(job_id, "metrics: computing")
        try:
            metrics = to_json(evaluate_run(self.runner.result_path(job_id), n_threads=self.runner.n_threads))
            write_text_atomic(self.runner.run_dir(job_id) / "metrics.json", dumps(metrics))
            self.runner.store.set_metrics(job_id, "done")
            self.runner.store.log(job_id, "metrics: done")
        except Exception as exc:  # noqa: BLE001 - metrics are a phase of their own: never fail a finished job
            record = self.runner.store.get(job_id)
            message = self.runner.reason(exc, record["params"] if record else {})
            logger.warning("job %s: no metrics (%s)", job_id, message)
            try:
                self.runner.store.set_metrics(job_id, None if disk_full(exc) else "failed", message)
            except self.runner.store._errors + (OSError,):
                pass
        finally:
            self.runner._current.job = None
            with self._lock:
                self._evaluating.discard(job_id)
