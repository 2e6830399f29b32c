"""The mixture fit of `users.py` (its 16000 x 50 split) for one estimator with its defaults, after a warm-up: the
fit's in-process CPU and wall seconds.  Alternate it for paired rounds:
``for r in 1 2 3 4; do for w in scalemb opentsne; do python users_mixture_pairs.py $w; done; done``.
argv[1]: scalemb | opentsne."""
import os
import sys
import time
import warnings

from sklearn.model_selection import train_test_split

from users import gaussian_mixture, load

warnings.filterwarnings("ignore")
which = sys.argv[1]
X, y = load("mixture")
X_fit, _, _, _ = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
if which == "scalemb":
    import scalemb
    from scalemb.affinity.knn import knn_graph
    X0, _ = load("digits")
    scalemb.TSNE(random_state=0).fit_transform(X0[:300])
    knn_graph(gaussian_mixture(5000)[0], 15, algorithm="nndescent")
    est = scalemb.TSNE(random_state=0)
else:
    from openTSNE.sklearn import TSNE
    X0, _ = load("digits")
    TSNE(random_state=0).fit_transform(X0[:300])
    est = TSNE(random_state=0)
c, w = time.process_time(), time.perf_counter()
est.fit_transform(X_fit)
c, w = time.process_time() - c, time.perf_counter() - w
print(f"{which} fit CPU {c:.2f} s wall {w:.2f} s load {os.getloadavg()[0]:.2f}", flush=True)
