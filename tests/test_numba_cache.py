"""scalemb.numba_cache: closures' kernels cached on disk under a fingerprint that is the same in every process,
changes with anything the compiled code is made from, and loads code that computes bit-identical results."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit

from scalemb import numba_cache
from scalemb.models import get_model
from scalemb.numba_cache import fingerprint

# A process making a closure kernel over a captured numba function and a captured number, calling it and
# printing its fingerprint, the bytes of its result and its cache hits / misses.
SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    import numpy as np
    from numba import njit

    spec = importlib.util.spec_from_file_location("numba_cache", sys.argv[2])  # without scalemb's imports
    numba_cache = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(numba_cache)
    disk_cached, fingerprint = numba_cache.disk_cached, numba_cache.fingerprint

    @njit(inline="always", fastmath=True)
    def weight(d2):
        return 1.0 / (1.0 + d2)

    def make(scale):
        @njit(nogil=True, fastmath=True)
        def kernel(x, out):
            for i in range(x.shape[0]):
                out[i] = scale * weight(x[i] * x[i])
        return disk_cached(kernel)

    kernel = make(float(sys.argv[1]))
    out = np.empty(1000)
    kernel(np.linspace(-3.0, 3.0, 1000), out)
    print(json.dumps({"fingerprint": fingerprint(kernel), "result": out.tobytes().hex(),
                      "hits": sum(kernel._cache_hits.values()), "misses": sum(kernel._cache_misses.values())}))
""")


def run(script, scale, cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    done = subprocess.run([sys.executable, str(script), str(scale), numba_cache.__file__], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_second_process_loads_the_kernel_and_computes_the_same_bits(tmp_path):
    script = tmp_path / "closure_kernel.py"
    script.write_text(SCRIPT)
    cache = tmp_path / "cache"
    first = run(script, 2.0, cache)
    second = run(script, 2.0, cache)
    other = run(script, 3.0, cache)
    assert (first["hits"], first["misses"]) == (0, 1)
    assert (second["hits"], second["misses"]) == (1, 0)  # numba's own cache=True misses here (new UUIDs)
    assert second["fingerprint"] == first["fingerprint"]
    assert second["result"] == first["result"]
    # another captured value: another fingerprint, its own entry, never the cached code of scale 2
    assert other["fingerprint"] != first["fingerprint"] and (other["hits"], other["misses"]) == (0, 1)
    x = np.linspace(-3.0, 3.0, 1000)
    for scale, done in [(2.0, first), (3.0, other)]:
        assert np.allclose(np.frombuffer(bytes.fromhex(done["result"])), scale / (1.0 + x * x), rtol=1e-14, atol=0)
    assert len(list(cache.rglob("*.nbi"))) == 2


def test_fingerprint_follows_code_globals_options_and_captures():
    def make(inner, value):
        @njit
        def f(x):
            return inner(x) + value
        return f

    @njit(inline="always")
    def a(x):
        return x + 1.0

    @njit(inline="always")
    def b(x):
        return x + 2.0

    @njit(inline="always", fastmath=True)
    def a_fast(x):
        return x + 1.0

    base = fingerprint(make(a, 1.0))
    assert fingerprint(make(a, 1.0)) == base
    assert fingerprint(make(b, 1.0)) != base  # the captured function's constants
    assert fingerprint(make(a, 2.0)) != base  # a captured number
    assert fingerprint(make(a_fast, 1.0)) != base  # the captured function's compile options


def test_model_kernels_fingerprints_differ_per_model_and_are_shared_by_ee():
    names = ["sne", "tsne", "snest"]
    prints = {name: fingerprint(get_model(name).attraction) for name in names}
    assert len(set(prints.values())) == len(names)
    assert get_model("ee", lam=0.5).attraction is get_model("ee", lam=2.0).attraction is get_model("sne").attraction
    assert fingerprint(get_model("cosne", gamma=0.1).repulsion) != fingerprint(get_model("cosne", gamma=0.2).repulsion)
