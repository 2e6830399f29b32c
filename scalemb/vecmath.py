"""Vectorisable double-precision exponential and logarithm for numba kernels.

``np.exp`` and ``np.log`` compile to libm calls, which block SIMD vectorisation of the pair loops (6x slower
on the repulsion kernel) and cost ~3/4 of the attraction kernel on a 1e5-point kNN P.

``fast_exp`` uses Cody-Waite range reduction ``x = n ln2 + r``, ``|r| <= ln2/2``, a degree-13 Taylor
polynomial for ``exp(r)`` (truncation < 2e-17) and builds ``2**n`` by writing the exponent bits directly.
Relative error is below 1e-13 on [-708, 709] (checked in tests/test_vecmath.py); inputs are clamped to that
range, so results saturate instead of overflowing to inf.

``fast_log`` reads the exponent e from the bits, ``x = 2^e m`` with ``m`` in ``[sqrt(1/2), sqrt(2))``, and
``log m = 2 atanh(s)``, ``s = (m - 1)/(m + 1)``, ``|s| <= 0.172``, by its odd series to ``s^21`` (truncation
< 1e-17): absolute error below 1e-15 for positive normal x (tests/test_vecmath.py); +inf gives ``1024 ln 2``.

``wide_vectors()``: LLVM vectorises for 256-bit registers on Intel CPUs with AVX-512 unless a function asks for
more (their tuning "prefer-256-bit", against older cores' clock penalty).  The all-pairs kernels ask for 512 bits:
per pair they do some thirty vector operations on registers (``fast_exp``'s polynomial, a division, the forces)
and no gathers, so wider vectors pay where a pair needs an exponential or logarithm (SNEST, CO-SNE); the sparse
kernels, which gather neighbours' rows, gained nothing and keep the target's default (docs/design/repulsion.md).
On a CPU without AVX-512 the call does nothing.  The width changes how sums split into lanes, so results differ
in the last bits between the two (tests/test_bit_identity.py keys its hashes by it).

``scratch`` / ``scratch_row``: buffers for kernels whose results must not depend on where the arrays lie.  With
``fastmath`` LLVM vectorises a sum by splitting it into lanes, so its rounding depends on whether the vector loop
or the scalar fallback runs.  A loop that both sums and stores gets a run-time test on its arrays' addresses and
takes the fallback when a store lies a little above a load (``0 <= store - load < lanes x unroll x 8`` bytes),
which for small arrays depends on where malloc put them: the same call gave sums differing in the last bit now
and then (placement's free phase, rows of 3-7 non-zeros, where a kernel's buffers landed right after P's data).
So a kernel puts every buffer such a loop stores to in the rows of one ``scratch`` block, ``SCRATCH_GAP``
doubles clear of each other and of anything allocated before, and copies there what such a loop reads while it
stores to an array it was given: the test then always passes and the vector loop always runs.  (Summing in a
loop of its own would need no gaps, but adds two passes over every row of the all-pairs kernel.)
"""
import numba
import numpy as np
from llvmlite import binding, ir
from numba import njit, types
from numba.extending import intrinsic

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@intrinsic
def _float64_bits_as_int64(typingctx, x):
    """Reinterpret the 64 bits of a float64 as an int64 (no conversion)."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def _int64_bits_as_float64(typingctx, bits):
    """Reinterpret the 64 bits of an int64 as a float64 (no conversion)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


def _widest_vector_bits(features: str | None = None) -> int | None:
    """512 when the CPU numba compiles for has AVX-512 (``NUMBA_CPU_FEATURES`` if set, else the host's
    features, as numba itself decides), else None (the target's own preference stands)."""
    if features is None:
        features = numba.config.CPU_FEATURES or binding.get_host_cpu_features().flatten()
    return 512 if "+avx512f" in features.split(",") else None


WIDE_VECTOR_BITS = _widest_vector_bits()


@intrinsic
def wide_vectors(typingctx):
    """``wide_vectors()`` at the top of a kernel: LLVM may vectorise its loops with the CPU's widest vectors
    (``WIDE_VECTOR_BITS``; no effect on a CPU without AVX-512).  The module docstring says why.  Read when the
    kernel compiles: the attribute is set on the function the call is compiled into."""
    sig = types.none()

    def codegen(context, builder, signature, args):
        if WIDE_VECTOR_BITS is not None:  # a string attribute: llvmlite's add() knows only the keyword ones
            set.add(builder.function.attributes, f'"prefer-vector-width"="{WIDE_VECTOR_BITS}"')
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", fastmath=True, error_model="numpy")
def fast_exp(x):
    """exp(x) for float64 x, vectorisable; saturates outside [-708, 709]."""
    x = min(max(x, -708.0), 709.0)
    n = np.floor(x * _LOG2E + 0.5)
    r = x - n * _LN2
    p = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (
        1.0 / 120 + r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (
            1.0 / 362880 + r * (1.0 / 3628800 + r * (1.0 / 39916800 + r * (
                1.0 / 479001600 + r * (1.0 / 6227020800)))))))))))))
    return p * _int64_bits_as_float64((np.int64(n) + 1023) << 52)


# Bits of sqrt(1/2): subtracting them before taking the exponent puts the mantissa in [sqrt(1/2), sqrt(2)).
_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD


@njit(inline="always", fastmath=True, error_model="numpy")
def fast_log(x):
    """log(x) for positive normal float64 x, vectorisable (see the module docstring)."""
    bits = _float64_bits_as_int64(x)
    e = (bits - _SQRT_HALF_BITS) >> 52
    m = _int64_bits_as_float64(bits - (e << 52))
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    series = 1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (1.0 / 11 + s2 * (
        1.0 / 13 + s2 * (1.0 / 15 + s2 * (1.0 / 17 + s2 * (1.0 / 19 + s2 * (1.0 / 21))))))))))
    return e * _LN2 + 2.0 * s * series


# Doubles between scratch rows (module docstring): above any vector loop's lanes x unroll (AVX-512: 8 x 4 = 32
# doubles) with room to spare.
SCRATCH_GAP = 128


@njit(inline="always")
def scratch(rows, length):
    """One allocation for ``rows`` scratch rows of ``length`` doubles (``scratch_row``), each ``SCRATCH_GAP``
    doubles clear of the others and the first that far from the allocation's start (module docstring)."""
    return np.empty(SCRATCH_GAP + rows * (length + SCRATCH_GAP))


@njit(inline="always")
def scratch_row(block, k, length):
    """Row ``k`` of a ``scratch`` block: ``length`` contiguous doubles."""
    start = SCRATCH_GAP + k * (length + SCRATCH_GAP)
    return block[start:start + length]
