"""Executors: run the row-block kernels and reduce their partial results."""
from .base import Executor
from .blocks import BlockResult, Evaluation, evaluate_block, reduce_blocks
from .local import LocalExecutor

__all__ = ["BlockResult", "Evaluation", "Executor", "evaluate_block", "reduce_blocks", "LocalExecutor"]
