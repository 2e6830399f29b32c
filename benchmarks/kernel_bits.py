"""Bit-reproducible kernels: what the padded scratch rows cost (``scalemb.vecmath``, "scratch").

The t-SNE all-pairs repulsion kernel in three forms, compiled in this process and timed in rotated rounds on
the same coordinates:

* ``plain``: the kernel before the fix, each buffer its own ``np.empty`` and the coordinates read from ``Y``
  (its sums took LLVM's scalar fallback when small arrays lay close together);
* ``split``: every sum in a loop of its own (the first fix tried: no aliasing test at all);
* ``scratch``: the shipped kernel (``get_model("tsne").repulsion``): buffers in the rows of one padded
  ``vecmath.scratch`` block and the coordinates copied there.

That the shipped kernels give the same bits wherever the arrays lie is tested
(``tests/test_determinism.py::test_kernels_give_the_same_bits_wherever_malloc_puts_their_arrays``).

``python benchmarks/kernel_bits.py --rounds 21 --out benchmarks/results/kernel_bits.md``
"""
import argparse

import numpy as np
from numba import njit

from common import Report, markdown_table

from scalemb.models import get_model
from scalemb.models.tsne import pair


def _repulsion(split: bool):
    @njit(nogil=True, fastmath=True, boundscheck=False, error_model="numpy")
    def repulsion(Y, space_dims, r0, r1, R):
        dims, n_points = Y.shape
        half = (n_points - 1) // 2
        d2s, d2t = np.empty(n_points), np.empty(n_points)
        cs, ct = np.empty(n_points), np.empty(n_points)
        z = 0.0
        for i in range(r0, r1):
            partners = half + 1 if (n_points % 2 == 0 and i < n_points // 2) else half
            for segment in range(2):
                a, b = (i + 1, min(i + 1 + partners, n_points)) if segment == 0 else (0, i + 1 + partners - n_points)
                n = b - a
                if n <= 0:
                    continue
                d2s[:n] = 0.0
                d2t[:n] = 0.0
                for k in range(dims):
                    d2 = d2s[:n] if k < space_dims else d2t[:n]
                    yk = Y[k, a:b]
                    for jj in range(n):
                        x = Y[k, i] - yk[jj]
                        d2[jj] += x * x
                bs, bt, c1, c2 = d2s[:n], d2t[:n], cs[:n], ct[:n]
                for jj in range(n):
                    w, ca, cb = pair(bs[jj], bt[jj])
                    if split:
                        bs[jj] = w
                    else:
                        z += w
                    c1[jj] = ca
                    c2[jj] = cb
                if split:
                    for jj in range(n):
                        z += bs[jj]
                for k in range(dims):
                    c = cs[:n] if k < space_dims else ct[:n]
                    yk, rk, yik = Y[k, a:b], R[k, a:b], Y[k, i]
                    acc = 0.0
                    for jj in range(n):
                        f = c[jj] * (yik - yk[jj])
                        if split:
                            bs[jj] = f
                        else:
                            acc += f
                        rk[jj] -= f
                    if split:
                        for jj in range(n):
                            acc += bs[jj]
                    R[k, i] += acc
        return 2.0 * z

    return repulsion


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5241,20000")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import time

    report = Report.start("Bit-reproducible kernels: the cost of the padded scratch rows",
                          f"command: `python benchmarks/kernel_bits.py --sizes {args.sizes} --rounds {args.rounds}`")
    shipped = get_model("tsne")
    forms = {"plain": _repulsion(False), "split": _repulsion(True), "scratch": shipped.repulsion}
    rows = []
    for N in (int(s) for s in args.sizes.split(",")):
        Y = np.ascontiguousarray(np.random.default_rng(0).normal(size=(2, N)) * 30)
        times = {name: [] for name in forms}
        values = {}
        for name, kernel in forms.items():  # compile and check the three agree to rounding
            R = np.zeros_like(Y)
            values[name] = (kernel(Y, 2, 0, N, R), R)
        for r in range(args.rounds):
            order = list(forms)[r % 3:] + list(forms)[:r % 3]
            for name in order:
                R = np.zeros_like(Y)
                t = time.perf_counter()
                forms[name](Y, 2, 0, N, R)
                times[name].append(time.perf_counter() - t)
        med = {name: float(np.median(t)) for name, t in times.items()}
        agree = max(np.abs(values[name][1] - values["plain"][1]).max() / np.abs(values["plain"][1]).max()
                    for name in forms)
        rows.append([N, *(f"{1e3 * med[name]:.2f}" for name in forms), f"{med['split'] / med['plain']:.3f}",
                     f"{med['scratch'] / med['plain']:.3f}", f"{agree:.1e}"])
    report(f"## All-pairs repulsion, t-SNE R^2, one thread: median ms per call over {args.rounds} rotated rounds")
    report()
    report(markdown_table(["N", "plain ms", "split ms", "scratch ms", "split / plain", "scratch / plain",
                           "max rel. force difference"], rows))
    report()
    report.save(args.out)


if __name__ == "__main__":
    main()
