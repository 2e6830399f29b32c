"""An optimiser's per-point state, held where P's row blocks are.

Delta-bar-delta's per-point arrays (coordinates, gradient, gains, increments, best iterate) are ``(d, N)``
arrays split by the executor's row blocks.  An optimiser that keeps them as a ``HeldState`` touches them only
through

* ``map(fn, *args) -> [fn(rows_k, *args) for every block k]`` in block order: ``rows_k`` maps each array's name
  to its ``(d, r1 - r0)`` rows of block k, which ``fn`` changes in place; ``fn`` returns something small (partial
  sums), reduced by the caller in block order;
* ``evaluate(exaggeration, with_kl, iteration, defer) -> Evaluation`` at the held ``coords``: the gradient's rows
  are held as ``gradient`` (``Evaluation.gradient`` is None) and ``Evaluation.finite`` says whether all are finite;
  with ``defer`` the rows may be formed by the next ``map``, in its tasks (one round trip fewer on Dask):
  ``finite`` is then None and ``gradient_finite`` tells after that ``map``;
* ``shift(vector)``: subtract ``vector`` (one number per coordinate) from every point's coordinates, applied to
  each block before its next use;
* ``gather(*names) -> {name: (d, N)}`` in the input's point order (checkpoints and the result only);
* ``extent_hint(lo, hi)``: the coordinates' extent as the optimiser knows it after its last step (per coordinate,
  min and max over all points, after the pending shift), which saves a round of the workers reporting it.

``LocalHeld`` keeps whole arrays in this process (blocks are column views: the executor's row blocks, or one
block); ``scalemb.engine.held_dask.DaskHeld`` keeps each partition's rows on the Dask worker that holds the
partition, so per iteration the client sends and receives scalars and small vectors only.  Both run the same
block functions on the same rows and reduce in block order, so they agree bit for bit.
"""
import numpy as np


class HeldRowsLost(Exception):
    """Held rows were lost with a worker (a marker mixed into the executor's own worker-loss error): an optimiser
    can rewind to a state it exported (``StepRun.rewind``) and ``HeldState.recover`` from it."""


def hold(executor, arrays: dict):
    """The ``HeldState`` of ``arrays`` (``{name: (d, N)}``, input order, ``coords`` among them) for
    ``executor``: its own ``hold`` if it has one, else ``LocalHeld``."""
    own = getattr(executor, "hold", None)
    return own(arrays) if own is not None else LocalHeld(executor, arrays)


def shift_rows(rows: dict, shift) -> None:
    """Apply a pending ``shift`` to a block's coordinates (in place)."""
    if shift is not None:
        rows["coords"] -= shift[:, None]


class LocalHeld:
    """Whole arrays in this process; blocks are column ranges (``executor.bounds``, or all points as one)."""

    def __init__(self, executor, arrays: dict):
        self.executor = executor
        self.arrays = {name: np.array(a, dtype=np.float64, order="C") for name, a in arrays.items()}
        n = self.arrays["coords"].shape[1]
        bounds = getattr(executor, "bounds", None)
        if getattr(executor, "point_order", "given") != "given" or not bounds:
            bounds = [(0, n)]  # a renumbered executor's blocks are not column ranges of the input's order
        self.bounds = [(int(a), int(b)) for a, b in bounds]
        self.n_points = n
        self._shift = None
        self.gradient_finite = None

    def _flush(self) -> None:
        if self._shift is not None:
            for r0, r1 in self.bounds:
                shift_rows({"coords": self.arrays["coords"][:, r0:r1]}, self._shift)
            self._shift = None

    def map(self, fn, *args) -> list:
        self._flush()
        return [fn({name: a[:, r0:r1] for name, a in self.arrays.items()}, *args) for r0, r1 in self.bounds]

    def shift(self, vector: np.ndarray) -> None:
        self._flush()
        self._shift = np.asarray(vector, dtype=np.float64)

    def extent_hint(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Not needed here: the executor reads the extent from the coordinates it is given."""

    def evaluate(self, exaggeration: float, with_kl: bool, iteration: int | None = None, defer: bool = False):
        """(``defer`` changes nothing here: the executor returns the whole gradient.)"""
        self._flush()
        ev = self.executor.evaluate(self.arrays["coords"], exaggeration, with_kl=with_kl, iteration=iteration)
        self.arrays["gradient"] = np.ascontiguousarray(ev.gradient, dtype=np.float64)
        ev.finite = self.gradient_finite = bool(np.isfinite(self.arrays["gradient"]).all())
        ev.gradient = None
        return ev

    def gather(self, *names) -> dict:
        self._flush()
        return {name: self.arrays[name].copy() for name in names}

    def put(self, name: str, array: np.ndarray) -> None:
        self._flush()
        self.arrays[name] = np.array(array, dtype=np.float64, order="C")

    def recover(self, arrays: dict) -> None:
        """Hold ``arrays`` again (nothing is lost in this process: kept for the interface)."""
        self.arrays = {name: np.array(a, dtype=np.float64, order="C") for name, a in arrays.items()}
        self._shift = None

    def close(self) -> None:
        self.arrays = {}
