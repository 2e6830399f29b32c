"""``LiRaMLVQ``: GMLVQ (one global matrix) and localized limited-rank matrix LVQ as a scikit-learn estimator.

Training follows Bunte et al. (LiRaM LVQ paper, sections 2.1 and 3): stochastic gradient descent of the GLVQ
cost ``sum_i (d_J - d_K) / (d_J + d_K)`` (``scalemb.lvq.kernels`` has the math) over sweeps through the data in
a fresh random order, prototypes learning from epoch 1 at ``alpha_1(t) = lr_prototypes / (1 + (t - 1)
lr_prototypes_decay)`` and the matrices from epoch ``metric_start = t0`` at ``alpha_2(t) = lr_metric / (1 +
(t - t0) lr_metric_decay)``; after every epoch each ``Omega`` is rescaled to ``trace(Omega^T Omega) = 1`` (the
cost is invariant to the scale of ``Omega``; without it the matrices drift to 0 or infinity).  The defaults are
the paper's Three Tip Star / segmentation / USPS schedule (0.01, 0.001, t0 = 50, 0.001, 0.0001).

Initialisation: prototypes at the centres of a k-means clustering of each class (the class mean for one
prototype per class), so several prototypes per class start in distinct modes; ``Omega`` entries uniform in
[-1, 1], then normalised.

Optional regulariser (Schneider et al.): the cost gets ``- regularization * sum_r ln det(Omega_r Omega_r^T)``,
which keeps every ``Omega_r`` at full rank ``M`` (the plain cost tends to collapse ``Lambda`` to rank 1).  Its
gradient is ``-2 regularization (Omega Omega^T)^{-1} Omega``; as the term is not a sum over points, the
stochastic solver takes its step once per epoch, at ``alpha_2(t)``.

``partitions = P > 1`` splits the rows into ``P`` contiguous blocks (fixed by ``N``, not by threads or
workers); every epoch each block runs its sweep from the same parameters and the parameter changes are summed
(the prototype updates are reduced once per epoch).  ``P = 1`` is the paper's sequential SGD.  Local and Dask
(``scheduler=``) runs with the same ``P`` give the same result.
"""
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, TransformerMixin

from ..affinity.affinity import row_partition
from . import kernels
from .kernels import partition_sweep


def _check_X(X, n_features=None, name="X") -> np.ndarray:
    X = np.asarray(X)
    if X.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold real numbers, got dtype {X.dtype}")
    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{name} must be a 2-D array (points x features) with at least one row and column, "
                         f"got shape {X.shape}")
    finite = np.isfinite(X)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        col = int(np.flatnonzero(~finite[row])[0])
        raise ValueError(f"{name} has a non-finite value ({X[row, col]}) at row {row}, column {col}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{name} has {X.shape[1]} features, the model was fitted with {n_features}")
    return X


def check_labelled(X, y, prototypes_per_class: int, rank: int):
    """Validate training input; returns ``(X, y, classes, y_index)`` or raises one ``ValueError`` naming the
    problem (labels of the wrong length, a single class, non-finite features, a class with fewer points than
    prototypes, a rank above the feature dimension)."""
    X = _check_X(X)
    y = np.asarray(y)
    if y.ndim != 1:
        y = y.reshape(-1) if y.ndim == 2 and 1 in y.shape else y
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"labels have length {y.shape[0]} but X has {X.shape[0]} rows")
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise ValueError(f"labels contain a non-finite value at position {int(np.flatnonzero(~np.isfinite(y))[0])}")
    classes, y_index, counts = np.unique(y, return_inverse=True, return_counts=True)
    if classes.size < 2:
        raise ValueError(f"labels must contain at least 2 classes, got {classes.size}"
                         + (f" ({classes[0].item()!r})" if classes.size else ""))
    ppc = int(prototypes_per_class)
    if ppc < 1:
        raise ValueError(f"prototypes_per_class must be >= 1, got {prototypes_per_class}")
    if counts.min() < ppc:
        c = int(np.argmin(counts))
        raise ValueError(f"class {classes[c].item()!r} has {counts[c]} points, fewer than prototypes_per_class={ppc}")
    if not 1 <= int(rank) <= X.shape[1]:
        raise ValueError(f"rank must be in 1..{X.shape[1]} (the feature dimension), got {rank}")
    return X, y, classes, y_index.astype(np.int64)


def kmeans_centres(Xc: np.ndarray, k: int, rng: np.random.Generator, restarts: int = 5,
                   iterations: int = 100) -> np.ndarray:
    """``k`` centres of ``Xc`` by Lloyd's k-means from k-means++ seeds, best of ``restarts`` by inertia
    (plain NumPy: cheap at prototype counts and free of thread-pool start-up; ``k = 1`` gives the mean)."""
    if k == 1:
        return Xc.mean(axis=0, keepdims=True)
    best, best_inertia = None, np.inf
    for _ in range(restarts):
        C = Xc[[rng.integers(Xc.shape[0])]]
        for _ in range(1, k):  # k-means++: next seed with probability ~ squared distance to the nearest
            d2 = squared_distances(Xc, C).min(axis=1)
            p = d2 / d2.sum() if d2.sum() > 0 else None
            C = np.vstack([C, Xc[rng.choice(Xc.shape[0], p=p)]])
        for _ in range(iterations):
            assign = squared_distances(Xc, C).argmin(axis=1)
            C_new = np.array([Xc[assign == c].mean(axis=0) if np.any(assign == c) else C[c] for c in range(k)])
            if np.array_equal(C_new, C):
                break
            C = C_new
        inertia = squared_distances(Xc, C).min(axis=1).sum()
        if inertia < best_inertia:
            best, best_inertia = C, inertia
    return best


def normalize_trace(omegas: np.ndarray) -> np.ndarray:
    """Scale every ``Omega_r`` to ``trace(Omega_r^T Omega_r) = sum of squares = 1`` (in place; returned)."""
    norms = np.sqrt(np.einsum("rab,rab->r", omegas, omegas))
    if np.any(norms == 0) or not np.all(np.isfinite(norms)):
        raise FloatingPointError("a metric matrix became zero or non-finite; lower lr_metric")
    omegas /= norms[:, None, None]
    return omegas


def logdet_regularizer(omegas: np.ndarray, weight: float):
    """``(R, dR/dOmega)`` for ``R = -weight * sum_r ln det(Omega_r Omega_r^T)``."""
    value = 0.0
    grad = np.zeros_like(omegas)
    for r, omega in enumerate(omegas):
        gram = omega @ omega.T
        sign, logdet = np.linalg.slogdet(gram)
        if sign <= 0:
            raise FloatingPointError(f"metric matrix {r} lost rank: det(Omega Omega^T) = 0")
        value -= weight * logdet
        grad[r] = -2.0 * weight * np.linalg.solve(gram, omega)
    return value, grad


class LiRaMLVQ(ClassifierMixin, TransformerMixin, BaseEstimator):
    """Localized limited-rank matrix LVQ (``localized=True``) or GMLVQ with one global matrix.

    Parameters
    ----------
    prototypes_per_class : prototypes of every class (k-means centres of the class at the start).
    rank : ``M``, rows of every ``Omega`` (``1 <= M <= D``); ``transform`` gives ``M`` coordinates.
    localized : one matrix per prototype (LiRaM LVQ) or one shared matrix (GMLVQ).
    epochs, lr_prototypes, lr_prototypes_decay, lr_metric, lr_metric_decay, metric_start : the schedule above.
    regularization : weight of ``-ln det(Omega Omega^T)`` (0: off).
    partitions : row blocks whose epoch updates are summed (1: sequential SGD).
    scheduler : Dask scheduler address; the partitions' sweeps then run on its workers.
    random_state : seed of the initialisation and the sample orders (results are reproducible from it).

    Attributes after ``fit``: ``classes_``, ``prototypes_`` (``m x D``), ``prototype_labels_``, ``omegas_``
    (``R x M x D``), ``omega_of_`` (prototype -> matrix), ``cost_history_`` (mean ``mu`` per epoch plus the
    regulariser), ``n_features_in_``.
    """

    def __init__(self, prototypes_per_class: int = 1, rank: int = 2, localized: bool = True, epochs: int = 500,
                 lr_prototypes: float = 0.01, lr_prototypes_decay: float = 0.001, lr_metric: float = 0.001,
                 lr_metric_decay: float = 0.0001, metric_start: int = 50, regularization: float = 0.0,
                 partitions: int = 1, scheduler: str | None = None, random_state: int | None = 0):
        self.prototypes_per_class = prototypes_per_class
        self.rank = rank
        self.localized = localized
        self.epochs = epochs
        self.lr_prototypes = lr_prototypes
        self.lr_prototypes_decay = lr_prototypes_decay
        self.lr_metric = lr_metric
        self.lr_metric_decay = lr_metric_decay
        self.metric_start = metric_start
        self.regularization = regularization
        self.partitions = partitions
        self.scheduler = scheduler
        self.random_state = random_state

    # ------------------------------------------------------------------------------------------ training

    def _check_params(self):
        if int(self.epochs) < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        for name in ("lr_prototypes", "lr_prototypes_decay", "lr_metric", "lr_metric_decay", "regularization"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if int(self.metric_start) < 1:
            raise ValueError(f"metric_start must be >= 1 (epochs count from 1), got {self.metric_start}")
        if int(self.partitions) < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")

    def learning_rates(self, t: int):
        """``(alpha_1(t), alpha_2(t))`` at epoch ``t >= 1`` (``alpha_2 = 0`` before ``metric_start``)."""
        a1 = self.lr_prototypes / (1.0 + (t - 1) * self.lr_prototypes_decay)
        t0 = int(self.metric_start)
        a2 = 0.0 if t < t0 else self.lr_metric / (1.0 + (t - t0) * self.lr_metric_decay)
        return a1, a2

    def _initialize(self, X, y_index, n_classes, rng):
        ppc, D, M = int(self.prototypes_per_class), X.shape[1], int(self.rank)
        W = np.concatenate([kmeans_centres(X[y_index == c], ppc, rng)
                            for c in range(n_classes)])
        proto_labels = np.repeat(np.arange(n_classes, dtype=np.int64), ppc)
        m = W.shape[0]
        n_mat = m if self.localized else 1
        omegas = normalize_trace(rng.uniform(-1.0, 1.0, size=(n_mat, M, D)))
        omega_of = np.arange(m, dtype=np.int64) if self.localized else np.zeros(m, dtype=np.int64)
        return np.ascontiguousarray(W), proto_labels, omegas, omega_of

    def fit(self, X, y):
        """Learn prototypes and matrices from ``X`` (``N x D``) and labels ``y`` (``N``)."""
        self._check_params()
        X, y, classes, y_index = check_labelled(X, y, self.prototypes_per_class, self.rank)
        rng = np.random.default_rng(self.random_state)
        W, proto_labels, omegas, omega_of = self._initialize(X, y_index, classes.size, rng)
        blocks = row_partition(X.shape[0], int(self.partitions))
        runner = _LocalRunner(X, y_index, blocks) if self.scheduler is None else \
            _dask_runner(self.scheduler, X, y_index, blocks)
        history = np.empty(int(self.epochs))
        try:
            for t in range(1, int(self.epochs) + 1):
                a1, a2 = self.learning_rates(t)
                orders = [rng.permutation(r1 - r0) for r0, r1 in blocks]
                cost, dW, dO = runner.epoch(orders, W, proto_labels, omegas, omega_of, a1, a2)
                W += dW
                omegas += dO
                reg = 0.0
                if self.regularization > 0:
                    reg, g = logdet_regularizer(omegas, self.regularization)
                    if a2 > 0:
                        omegas -= a2 * g
                normalize_trace(omegas)
                if not np.all(np.isfinite(W)):
                    raise FloatingPointError("prototypes became non-finite; lower lr_prototypes")
                history[t - 1] = cost / X.shape[0] + reg
        finally:
            runner.close()
        self.classes_ = classes
        self.prototypes_ = W
        self.prototype_labels_ = classes[proto_labels]
        self._proto_index = proto_labels
        self.omegas_ = omegas
        self.omega_of_ = omega_of
        self.cost_history_ = history
        self.n_features_in_ = X.shape[1]
        return self

    # ------------------------------------------------------------------------------------------ using it

    def _fitted(self):
        if not hasattr(self, "omegas_"):
            raise AttributeError("this LiRaMLVQ is not fitted yet; call fit(X, y) first")

    @property
    def lambdas_(self) -> np.ndarray:
        """``Lambda_j = Omega_j^T Omega_j`` per prototype (``m x D x D``)."""
        self._fitted()
        O = self.omegas_[self.omega_of_]  # noqa: E741 - the paper's Omega
        return np.einsum("jai,jak->jik", O, O)

    def prototype_distances(self, X) -> np.ndarray:
        """``d_j(x_i)`` for every point and prototype (``N x m``)."""
        self._fitted()
        X = _check_X(X, self.n_features_in_)
        return kernels.prototype_distances(X, self.prototypes_, self.omegas_, self.omega_of_)

    def winners(self, X) -> np.ndarray:
        """Index of the closest prototype (under its own metric) of every row of ``X``."""
        return np.argmin(self.prototype_distances(X), axis=1)

    def predict(self, X) -> np.ndarray:
        return self.prototype_labels_[self.winners(X)]

    def transform(self, X) -> np.ndarray:
        """Eq. (4): ``x -> Omega_j x`` with ``j`` the winner of ``x`` (``N x M``)."""
        self._fitted()
        X = _check_X(X, self.n_features_in_)
        return kernels.winner_projections(X, self.prototypes_, self.omegas_, self.omega_of_)[1]

    def cost(self, X, y) -> float:
        """The fitted model's cost on ``(X, y)``: mean ``mu`` plus the regulariser."""
        self._fitted()
        X = _check_X(X, self.n_features_in_)
        y_index = np.searchsorted(self.classes_, np.asarray(y)).astype(np.int64)
        total = kernels.batch_gradient(X, y_index, 0, X.shape[0], self.prototypes_, self._proto_index,
                                       self.omegas_, self.omega_of_, 1)[0]
        reg = logdet_regularizer(self.omegas_, self.regularization)[0] if self.regularization > 0 else 0.0
        return total / X.shape[0] + reg

    def dissimilarity(self, X, Y=None, symmetric: bool = False) -> np.ndarray:
        """Eq. (5): ``d(x_i, y_k) = (x_i - y_k)^T Lambda_j (x_i - y_k)`` with ``j`` the winner of ``x_i``
        (``N x N'``; ``Y`` defaults to ``X``).  Asymmetric; ``symmetric=True`` (only with ``Y=None``) returns
        ``(d(x_i, x_k) + d(x_k, x_i)) / 2``."""
        self._fitted()
        X = _check_X(X, self.n_features_in_)
        same = Y is None
        Y = X if same else _check_X(Y, self.n_features_in_, "Y")
        win = self.winners(X)
        out = np.empty((X.shape[0], Y.shape[0]))
        for j in np.unique(win):
            rows = np.flatnonzero(win == j)
            omega = self.omegas_[self.omega_of_[j]]
            out[rows] = squared_distances(X[rows] @ omega.T, Y @ omega.T)
        if symmetric:
            if not same:
                raise ValueError("symmetric=True needs Y=None (a square dissimilarity)")
            out = 0.5 * (out + out.T)
        return out

    # ------------------------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict:
        """The fitted model as JSON-safe data (stored in an affinity store's provenance)."""
        self._fitted()
        classes = self.classes_.tolist()
        return {"kind": "liram_lvq", "params": {k: v for k, v in self.get_params().items() if k != "scheduler"},
                "classes": classes, "prototypes": self.prototypes_.tolist(),
                "prototype_labels": self._proto_index.tolist(), "omegas": self.omegas_.tolist(),
                "omega_of": self.omega_of_.tolist(), "final_cost": float(self.cost_history_[-1])}

    @classmethod
    def from_dict(cls, data: dict) -> "LiRaMLVQ":
        if data.get("kind") != "liram_lvq":
            raise ValueError("not a stored LiRaM LVQ model (kind != 'liram_lvq')")
        model = cls(**data["params"])
        model.classes_ = np.asarray(data["classes"])
        model.prototypes_ = np.asarray(data["prototypes"], dtype=np.float64)
        model._proto_index = np.asarray(data["prototype_labels"], dtype=np.int64)
        model.prototype_labels_ = model.classes_[model._proto_index]
        model.omegas_ = np.asarray(data["omegas"], dtype=np.float64)
        model.omega_of_ = np.asarray(data["omega_of"], dtype=np.int64)
        model.cost_history_ = np.asarray([data.get("final_cost", np.nan)])
        model.n_features_in_ = model.prototypes_.shape[1]
        return model


def squared_distances(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``|a_i - b_k|^2`` (clipped at 0 against rounding)."""
    out = (A * A).sum(axis=1)[:, None] + (B * B).sum(axis=1)[None, :] - 2.0 * A @ B.T
    return np.maximum(out, 0.0, out=out)


class _LocalRunner:
    """Runs every partition's sweep in this process, in partition order."""

    def __init__(self, X, y, blocks):
        self.X, self.y, self.blocks = X, y, blocks

    def epoch(self, orders, W, proto_labels, omegas, omega_of, a1, a2):
        if len(self.blocks) == 1:  # the paper's sequential SGD, in place
            W1, O1 = W.copy(), omegas.copy()
            cost = kernels.sgd_sweep(self.X, self.y, orders[0], W1, proto_labels, O1, omega_of, a1, a2)
            return cost, W1 - W, O1 - omegas
        total, dW, dO = 0.0, np.zeros_like(W), np.zeros_like(omegas)
        for (r0, r1), order in zip(self.blocks, orders):
            c, w, o = partition_sweep(self.X[r0:r1], self.y[r0:r1], order, W, proto_labels, omegas, omega_of,
                                      a1, a2)
            total, dW, dO = total + c, dW + w, dO + o
        return total, dW, dO

    def close(self):
        pass


def _dask_runner(scheduler, X, y, blocks):
    from .distributed import DaskRunner

    return DaskRunner(scheduler, X, y, blocks)
