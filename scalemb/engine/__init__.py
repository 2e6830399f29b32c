"""Executors: run the row-block kernels and reduce their partial results.

The names are imported on first use (``scalemb.lazy``): a Dask worker importing the tasks it runs does not load
the in-process executor's store reader (zarr) until it writes a block."""
from ..lazy import lazy_attributes

_WHERE = {"Executor": ".base", "BlockResult": ".blocks", "Evaluation": ".blocks", "evaluate_block": ".blocks",
          "reduce_blocks": ".blocks", "LocalExecutor": ".local"}
__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)

__all__ = [*_WHERE]  # every name of the table, and nothing else
