"""Run the public CO-SNE code (github.com/yunhuiguo/CO-SNE, PyTorch; not a scalemb dependency) on one data set.

Usage (in an environment with torch; the repository unpacked at PUBLIC):
    python benchmarks/cosne_public.py PUBLIC X.npy OUT.npy [n_iter]
with the settings of the repository's main.py (learning rate 5, H weight 0.1, perplexity 20, gamma 0.1, exact
method, 1000 iterations of which the first 250 without H).  Shims only adapt it to the installed scikit-learn
(removed private helpers); its numerics are untouched.  Prints the wall time of the fit.
"""
import sys
import time

import numpy as np
import sklearn.utils.validation as validation
from sklearn.utils import check_array

if not hasattr(validation, "_deprecate_positional_args"):  # removed in scikit-learn 1.3
    validation._deprecate_positional_args = lambda f: f


def main():
    public, source, out = sys.argv[1:4]
    n_iter = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    sys.path.insert(0, public)
    import hyptorch.pmath as pmath
    import torch
    from htsne_impl import TSNE

    if not hasattr(TSNE, "_validate_data"):  # removed in scikit-learn 1.6
        TSNE._validate_data = lambda self, X, **kw: check_array(X, **{k: v for k, v in kw.items()
                                                                     if k in ("accept_sparse", "dtype")})
    X = np.load(source)
    co_sne = TSNE(n_components=2, verbose=0, method="exact", square_distances=True, metric="precomputed",
                  learning_rate_for_h_loss=0.1, student_t_gamma=0.1, learning_rate=5.0, n_iter=n_iter,
                  perplexity=20, early_exaggeration=1.0, init="random", random_state=0)
    tic = time.perf_counter()
    embs = torch.from_numpy(X)
    dists = pmath.dist_matrix(embs, embs, c=1).numpy()
    Y = co_sne.fit_transform(dists, embs.numpy())
    print(f"fit {time.perf_counter() - tic:.3f} s")
    np.save(out, np.asarray(Y, dtype=np.float64))


if __name__ == "__main__":
    main()
