"""A run's written records: the finished result (``results``: embedding, node ids, KL history, the run's
settings and its blocked content hash), the checkpoints of a run in progress and its final state
(``checkpoint``), and the files other tools read (``export``).  ``to_anndata(run)`` opens a result as AnnData.

Why this room stands where it does (each import runs down):

* above ``optim`` and ``engine``: a checkpoint stores and rebuilds the optimiser's state (``optim``'s state
  classes, its configuration) and the rows that the executor's holders write themselves (``engine.held``'s block
  digests and chunking), so the records sit on top of what they record;
* above ``io``, and apart from it: node ids are stored as the input readers checked them (``io.nodeids``), and
  every record is published whole by ``io.atomic`` / ``io.storage``.  Those two stay in ``io``, below
  ``affinity``, because an affinity store is written and published the same way; the input readers never
  import a record;
* below ``run`` and every front (CLI, service, estimator, resume, metrics, placement), which read and write
  records through it.
"""
from .results import to_anndata

__all__ = ["to_anndata"]
