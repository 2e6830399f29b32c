"""What a metric is (``Metric``: value, standard error, rows used) and how rows are chosen: all rows up to
``EXACT_MAX_ROWS``, a uniform sample of ``DEFAULT_SAMPLE`` rows above (or as asked)."""
import math
from dataclasses import dataclass

import numpy as np

EXACT_MAX_ROWS = 100_000
DEFAULT_SAMPLE = 10_000


@dataclass(frozen=True)
class Metric:
    """One quality figure: ``value`` (a mean over ``n_rows`` rows), ``stderr`` (``None`` when every row was used,
    else the standard error of the sampled mean, finite-population corrected), ``name``."""

    value: float
    stderr: float | None
    n_rows: int
    name: str

    def __float__(self) -> float:
        return float(self.value)

    def __str__(self) -> str:
        error = "" if self.stderr is None else f" ± {self.stderr:.2g}"
        return f"{self.name} = {self.value:.4g}{error}"


def select_rows(n_points: int, sample=None, seed: int = 0) -> np.ndarray:
    """Rows to evaluate: all (``sample=None`` and ``n_points <= EXACT_MAX_ROWS``, or ``sample >= n_points``),
    else ``sample`` (default ``DEFAULT_SAMPLE``) distinct rows drawn uniformly with ``seed``, sorted."""
    if sample is None:
        sample = n_points if n_points <= EXACT_MAX_ROWS else DEFAULT_SAMPLE
    sample = int(sample)
    if sample < 2:
        raise ValueError(f"sample must be at least 2 rows, got {sample}")
    if sample >= n_points:
        return np.arange(n_points, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_points, size=sample, replace=False)).astype(np.int64)


def summarise(name: str, values: np.ndarray, population: int) -> Metric:
    """Mean of per-row ``values``; a standard error unless they are the whole ``population``."""
    values = np.asarray(values, dtype=np.float64)
    m = values.size
    if m == 0:
        return Metric(math.nan, None, 0, name)
    if m >= population:
        return Metric(float(values.mean()), None, int(m), name)
    stderr = float(values.std(ddof=1) / math.sqrt(m) * math.sqrt(max(0.0, 1.0 - m / population)))
    return Metric(float(values.mean()), stderr, int(m), name)


def metrics_table(metrics: dict) -> str:
    """A plain-text table: metric, value, standard error (``exact`` when every row was used), rows."""
    rows = [("metric", "value", "± stderr", "rows")]
    for key, metric in metrics.items():
        error = "exact" if metric.stderr is None else f"± {metric.stderr:.2g}"
        rows.append((key, f"{metric.value:.6g}", error, str(metric.n_rows)))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = ["  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_json(metrics: dict) -> dict:
    """``{key: {"name", "value", "stderr", "n_rows"}}`` (JSON-safe: NaN becomes ``None``)."""
    def number(x):
        return None if x is None or not math.isfinite(x) else float(x)

    return {key: {"name": m.name, "value": number(m.value), "stderr": number(m.stderr), "n_rows": int(m.n_rows)}
            for key, m in metrics.items()}
