"""What a Dask run raises when its cluster goes away (the CLI exits 4 on both; the last checkpoint is intact)."""
from ..errors import ScalembError


class SchedulerLostError(ScalembError):
    """The Dask scheduler went away during a run."""


class WorkersLostError(SchedulerLostError):
    """The Dask workers holding the run's partitions were lost and the partitions could not be held again within
    the recovery deadline (``DaskExecutor.recovery_timeout``); like a lost scheduler, the run stops (``scalemb``
    exits 4) and its last checkpoint stays intact."""


class WorkerLeft(Exception):
    """A partition holder left -- or, under load, the scheduler could not be asked -- while a call waited
    (``DaskExecutor._wait_for``): recovered like any worker loss (held rows: a rewind)."""
