"""Labelled synthetic data: the LiRaM LVQ paper's Three Tip Star (section 3.1) and a scalable variant.

The paper describes the Three Tip Star only in words and a figure: points in R^10, two overlapping classes of
three clusters each, the class information in the first two dimensions, eight dimensions of high-variance
noise, PCA to two dimensions giving about 29 % leave-one-out 1-NN error.  This generator follows that
description: three tips at 90, 210 and 330 degrees; on each tip one cluster per class, elongated along the tip
(standard deviation ``spread`` along, ``width`` across) and side by side across it, ``offset`` apart, so the two
classes overlap near the tip's axis; dimensions 3..10 are independent N(0, ``noise``^2).  The defaults put the
Bayes error of the two informative dimensions near 9 % (``Phi(-offset / (2 width))``) and make the
noise about as large as the star's spread, so PCA's plane mixes the informative plane with noise (its 1-NN error
is 0.25-0.35 depending on the draw, the paper's 29 % within that range).
"""
import numpy as np


def three_tip_star(n_samples: int = 3000, n_features: int = 10, radius: float = 500.0, spread: float = 150.0,
                   width: float = 40.0, offset: float = 107.0, noise: float = 325.0, random_state=0):
    """``(X, y)``: ``n_samples`` points (split evenly over the 6 clusters) in ``R^n_features``, labels 0/1."""
    if n_features < 2:
        raise ValueError(f"n_features must be >= 2, got {n_features}")
    rng = np.random.default_rng(random_state)
    sizes = np.full(6, n_samples // 6)
    sizes[: n_samples - sizes.sum()] += 1
    X = np.empty((n_samples, n_features))
    y = np.empty(n_samples, dtype=np.int64)
    start = 0
    for tip in range(3):
        angle = np.deg2rad(90.0 + 120.0 * tip)
        along = np.array([np.cos(angle), np.sin(angle)])
        across = np.array([-along[1], along[0]])
        for label, side in ((0, -0.5), (1, 0.5)):
            n = sizes[2 * tip + label]
            centre = radius * along + side * offset * across
            pts = (centre + rng.normal(0.0, spread, (n, 1)) * along + rng.normal(0.0, width, (n, 1)) * across)
            X[start:start + n, :2] = pts
            X[start:start + n, 2:] = rng.normal(0.0, noise, (n, n_features - 2))
            y[start:start + n] = label
            start += n
    order = rng.permutation(n_samples)
    return X[order], y[order]
