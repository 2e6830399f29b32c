"""Where a run executes: in-process threads, an existing Dask cluster (``scheduler``) or a LocalCluster of
``workers`` processes started for the run (the affinity store the workers read is ``scalemb.run.InputPlan.store``)."""
import logging
from contextlib import ExitStack, contextmanager

from ..errors import ScalembError

DASK_LOGGERS = ("distributed", "dask", "tornado", "bokeh")


def quiet_dask_logs(level: int | None = None) -> None:
    """Dask's own loggers (scheduler, nanny and client chatter: ~45 lines per LocalCluster run) at ``level``:
    WARNING by default, or ``SCALEMB_DASK_LOG_LEVEL`` (e.g. ``INFO`` or ``DEBUG`` to see them again).  Called
    after ``distributed`` is imported, since its import configures those loggers from Dask's config."""
    import os

    if level is None:
        name = os.environ.get("SCALEMB_DASK_LOG_LEVEL", "WARNING").upper()
        level = logging.getLevelName(name)
        if not isinstance(level, int):
            raise ValueError(f"SCALEMB_DASK_LOG_LEVEL must be a logging level name (DEBUG, INFO, WARNING, ERROR), "
                             f"got {name!r}")
    for name in DASK_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(tuple(f"{prefix}." for prefix in DASK_LOGGERS)):
            logger = logging.getLogger(name)
            if logger.level != logging.NOTSET:
                logger.setLevel(level)


def resolve_client(client):
    """The ``distributed.Client`` a caller's ``client=`` names: a running client itself, or, for True, the one
    active in this process (``distributed.get_client()``); ``ValueError`` naming ``client`` otherwise."""
    try:
        from distributed import Client, get_client
    except ImportError:
        raise ValueError("client: Dask's distributed package is not installed (pip install 'scalemb[dask]')") from None
    if client is True:
        try:
            return get_client()
        except ValueError:
            raise ValueError("client=True: no Dask client is active in this process (create one with "
                             "distributed.Client(...))") from None
    if not isinstance(client, Client):
        raise ValueError(f"client: must be a distributed.Client or True (the active one), got {client!r}")
    return client


@contextmanager
def dask_client(scheduler=None, workers: int | None = None):
    """A ``distributed.Client``: ``scheduler`` itself if it is one (the user's own client: used as it is, never
    closed here), a new client connected to ``scheduler`` (an address, e.g. ``tcp://host:8786``; it gives up
    after Dask's ``distributed.comm.timeouts.connect``, 30 s by default) and closed on exit, or one of a new
    ``LocalCluster`` of ``workers`` processes x 1 thread that is shut down on exit."""
    from distributed import Client, LocalCluster

    quiet_dask_logs()
    if scheduler is not None and workers:
        raise ValueError("give either a scheduler address (or client) or a number of local workers, not both")
    if isinstance(scheduler, Client):
        if scheduler.status not in ("running", "connecting", "newly-created"):
            raise ScalembError(f"the Dask client given is {scheduler.status}, not running")
        yield scheduler
        return
    with ExitStack() as stack:
        if scheduler:
            try:
                client = stack.enter_context(Client(scheduler))
            except (OSError, TimeoutError) as exc:
                raise ScalembError(f"cannot connect to the Dask scheduler at {scheduler}: {exc}") from None
            if client.dashboard_link:
                logging.getLogger("scalemb").info("Dask dashboard: %s", client.dashboard_link)
        else:
            if int(workers) < 1:
                raise ValueError(f"workers must be >= 1, got {workers}")
            cluster = stack.enter_context(LocalCluster(n_workers=int(workers), threads_per_worker=1,
                                                       processes=True, dashboard_address=None))
            client = stack.enter_context(Client(cluster))
        yield client
