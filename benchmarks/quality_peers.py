import sys, tempfile
from pathlib import Path
sys.path.insert(0, ".")
import quality as q
from scalemb.datasets import school
from scalemb.affinity import coauthorship_affinity
from scalemb.io.coauthor_generator import write_coauthor_edge_list
from scalemb.io.edgelist import read_edge_list
s = school()
q.run_umap(s); q.run_opentsne(s)  # warm-up (compilation), as quality.py's warm_up
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "coauthor.txt"
    write_coauthor_edge_list(path, 100000, seed=0)
    aff = coauthorship_affinity(read_edge_list(path))
name = "generated co-authorship graph, 100000 authors (seed 0)"
for label, run in (("openTSNE", q.run_opentsne), ("UMAP", q.run_umap)):
    Y, sec, extra = q.cached("/work/data/me/qcache", name, label, lambda: run(aff))
    print(label, sec, extra, flush=True)
