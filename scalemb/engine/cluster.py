"""Where a run executes: in-process threads, an existing Dask cluster (``scheduler``) or a LocalCluster of
``workers`` processes started for the run (the affinity store the workers read is ``scalemb.run.InputPlan.store``)."""
from contextlib import ExitStack, contextmanager

from ..errors import ScalembError


@contextmanager
def dask_client(scheduler: str | None = None, workers: int | None = None):
    """A ``distributed.Client`` connected to ``scheduler`` (e.g. ``tcp://host:8786``; it gives up after Dask's
    ``distributed.comm.timeouts.connect``, 30 s by default), or to a new ``LocalCluster`` of ``workers``
    processes x 1 thread that is shut down on exit."""
    from distributed import Client, LocalCluster

    if scheduler and workers:
        raise ValueError("give either a scheduler address or a number of local workers, not both")
    with ExitStack() as stack:
        if scheduler:
            try:
                client = stack.enter_context(Client(scheduler))
            except (OSError, TimeoutError) as exc:
                raise ScalembError(f"cannot connect to the Dask scheduler at {scheduler}: {exc}") from None
        else:
            if int(workers) < 1:
                raise ValueError(f"workers must be >= 1, got {workers}")
            cluster = stack.enter_context(LocalCluster(n_workers=int(workers), threads_per_worker=1,
                                                       processes=True, dashboard_address=None))
            client = stack.enter_context(Client(cluster))
        yield client
