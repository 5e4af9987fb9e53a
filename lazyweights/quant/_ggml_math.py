"""ggml's scalar quantization helpers (ggml/src/ggml-quants.c), ported to numba line for line.

The K-quant and IQ4 encoders search scales with these helpers; a one-ulp difference in any intermediate
changes a code, so each port keeps ggml's exact float32 evaluation:

  * every C `float` is a float32 here, and every `int` that meets a float is converted with `F(...)`
    first (numba would otherwise widen `int * float32` to float64 and round once instead of twice);
  * expressions associate left to right as C parses them (`w*x[i]*l` is `(w*x[i])*l`);
  * no fused multiply-add: ggml-quants.c is part of libggml-base, which llama.cpp builds without any
    `-march` flag, so on x86-64 GCC has no FMA instruction to contract into; numba emits separate
    fmul/fadd without `fastmath`, and LLVM does not fuse those;
  * C's `MAX`/`MIN` macros are `a > b ? a : b` / `a < b ? a : b` (their NaN behaviour differs from
    Python's `max`), and `if (!d)` / `d ? a : b` test `d != 0` (true for NaN);
  * stores into `uint8_t`/`int8_t` C variables wrap (`u8`, `i8`), which matters for the huge-magnitude
    inputs where `nearest_int` returns garbage far outside a code's range.

`nearest_int` is ggml's magic-number rounding (add 1.5 * 2^23, read the mantissa bits): round half to
even, exact for |x| <= 2^22 and a deterministic bit pattern beyond that (ggml only asserts the range in
debug builds). `fp16_bits` is `ggml_compute_fp32_to_fp16`: round to nearest even like numpy, except
that every NaN becomes 0x7E00 with its sign, where numpy would keep payload bits.

Example:
    >>> import numpy as np
    >>> from lazyweights.quant._ggml_math import nearest_int_scalar, fp16_bits_scalar
    >>> [nearest_int_scalar(v) for v in (0.5, 1.5, 2.5, -0.5, -1.5)]
    [0, 2, 2, 0, -2]
    >>> hex(fp16_bits_scalar(np.float32(np.nan))), hex(fp16_bits_scalar(np.float32(1.0)))
    ('0x7e00', '0x3c00')
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ._bits import bits_to_f32, f32_to_bits, half_to_float, on_scalar, store_u16

F = np.float32
F0 = F(0.0)
F1 = F(1.0)
GROUP_MAX_EPS = F(1e-15)
_MAGIC = F(12582912.0)  # 1.5 * 2^23: adding it puts the rounded integer in the low mantissa bits
_TO_INF = F(2.0**112)
_TO_ZERO = F(2.0**-110)

# kvalues_iq4nl (ggml-common.h): the 16 non-linear IQ4 levels, ascending
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def nearest_int(fval):
    """ggml's `nearest_int(float)`: round half to even through the 1.5*2^23 trick (an int64 here)."""
    val = fval + _MAGIC
    i = np.int64(f32_to_bits(val))
    return (i & 0x007FFFFF) - 0x00400000


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def u8(v):
    """C's conversion of an int to `uint8_t` (keep the low byte)."""
    return v & 0xFF


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def i8(v):
    """C's conversion of an int to `int8_t` on GCC (the low byte, two's complement)."""
    return ((v & 0xFF) ^ 0x80) - 0x80


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def imax(a, b):
    return a if a > b else b


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def imin(a, b):
    return a if a < b else b


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def fp16_bits(f):
    """`ggml_compute_fp32_to_fp16(f)` as an int 0..65535 (the same float32 steps as the C)."""
    base = (abs(f) * _TO_INF) * _TO_ZERO
    w = np.int64(f32_to_bits(f))
    shl1_w = (w + w) & 0xFFFFFFFF
    sign = w & 0x80000000
    bias = shl1_w & 0xFF000000
    if bias < 0x71000000:
        bias = 0x71000000
    base = bits_to_f32((bias >> 1) + 0x07800000) + base
    bits = np.int64(f32_to_bits(base))
    exp_bits = (bits >> 13) & 0x7C00
    mantissa_bits = bits & 0xFFF
    nonsign = exp_bits + mantissa_bits
    return (sign >> 16) | (0x7E00 if shl1_w > 0xFF000000 else nonsign)


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def store_fp16(out, o, f):
    """Store `GGML_FP32_TO_FP16(f)` little-endian at byte `o`; return its float32 value
    (`GGML_FP16_TO_FP32` of what was stored, which the encoders reuse)."""
    h = fp16_bits(f)
    store_u16(out, o, h)
    return half_to_float(h)


# --- the scale searches ---------------------------------------------------------------------------------


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def signed_absmax(x, xo, n):
    """(amax, mx): the largest |x[xo+i]| and the value that has it (the first on ties); both 0 when every
    value is 0 (or NaN), as ggml's `amax`/`max` loops start from 0."""
    mx = F0
    amax = F0
    for i in range(n):
        ax = abs(x[xo + i])
        if ax > amax:
            amax = ax
            mx = x[xo + i]
    return amax, mx


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def min_max(x, xo, n):
    """(min, max) of x[xo:xo+n] (n >= 1), starting from x[xo] (so NaNs after the first value are skipped)."""
    mn = x[xo]
    mx = x[xo]
    for i in range(1, n):
        v = x[xo + i]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _qx_sums(n, nmax, iscale, x, xo, w, wo, L, lo, store):
    """One trial scale of `make_qx_quants`: sum w*x*l and sum w*l*l over the codes l of x * iscale (and,
    when `store`, the codes + nmax into L)."""
    sumlx = F0
    suml2 = F0
    for i in range(n):
        l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[xo + i])))
        if store:
            L[lo + i] = l + nmax
        wi = w[wo + i]
        fl = F(l)
        sumlx += wi * x[xo + i] * fl
        suml2 += wi * fl * fl
    return sumlx, suml2


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def make_qx_quants(n, nmax, x, xo, L, lo, w, wo):
    """`make_qx_quants(n, nmax, x, L, rmse_type=1, qw)` with the weights always given (ggml's NULL qw
    means w = x*x, which callers precompute: the same float32 product). L gets codes in [0, 2*nmax)."""
    amax, mx = signed_absmax(x, xo, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[lo + i] = 0
        return F0
    sumlx, suml2 = _qx_sums(n, nmax, F(-nmax) / mx, x, xo, w, wo, L, lo, True)
    scale = sumlx / suml2 if suml2 != F0 else F0
    best = scale * sumlx
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        iscale = -(F(nmax) + F(0.1) * F(is_)) / mx
        sumlx, suml2 = _qx_sums(n, nmax, iscale, x, xo, w, wo, L, lo, False)
        if suml2 > F0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[lo + i] = nmax + imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[xo + i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(nogil=True, cache=True, error_model="numpy")
def make_q3_quants(n, nmax, x, xo, L, lo):
    """`make_q3_quants(n, nmax, x, L, do_rmse=true)`: weights x*x and up to 5 rounds of per-element
    improvement. L gets codes in [0, 2*nmax)."""
    amax, mx = signed_absmax(x, xo, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[lo + i] = 0
        return F0
    iscale = F(-nmax) / mx
    sumlx = F0
    suml2 = F0
    for i in range(n):
        l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[xo + i])))
        L[lo + i] = l
        xi = x[xo + i]
        w = xi * xi
        fl = F(l)
        sumlx += w * xi * fl
        suml2 += w * fl * fl
    for _itry in range(5):
        n_changed = 0
        for i in range(n):
            xi = x[xo + i]
            w = xi * xi
            li = L[lo + i]
            fli = F(li)
            slx = sumlx - w * xi * fli
            if slx > F0:
                sl2 = suml2 - w * fli * fli
                new_l = imax(-nmax, imin(nmax - 1, nearest_int(xi * sl2 / slx)))
                if new_l != li:
                    fnl = F(new_l)
                    slx += w * xi * fnl
                    sl2 += w * fnl * fnl
                    if sl2 > F0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[lo + i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[lo + i] += nmax
    return sumlx / suml2 if suml2 > F0 else F0


@njit(nogil=True, cache=True, error_model="numpy")
def make_qkx_quants(n, nmax, x, xo, w, wo, L, lo, Laux, rmin, rdelta, nstep, use_mad):
    """`make_qkx2_quants` / `make_qkx3_quants` (identical given weights: their only difference, `max ==
    min` vs `max <= min`, agrees for every input because max >= min unless a NaN makes both false).
    Returns (scale, the_min); L gets codes in [0, nmax]."""
    mn, mxv = min_max(x, xo, n)
    sum_w = w[wo]
    sum_x = sum_w * x[xo]
    for i in range(1, n):
        wi = w[wo + i]
        sum_w += wi
        sum_x += wi * x[xo + i]
    if mn > F0:
        mn = F0
    if mxv == mn:
        for i in range(n):
            L[lo + i] = 0
        return F0, -mn
    iscale = F(nmax) / (mxv - mn)
    scale = F1 / iscale
    best_error = F0
    for i in range(n):
        xi = x[xo + i]
        l = imax(0, imin(nmax, nearest_int(iscale * (xi - mn))))
        L[lo + i] = l
        diff = scale * F(l) + mn - xi
        diff = abs(diff) if use_mad else diff * diff
        best_error += w[wo + i] * diff
    if nstep < 1:
        return scale, -mn
    for is_ in range(nstep + 1):
        iscale = (rmin + rdelta * F(is_) + F(nmax)) / (mxv - mn)
        sum_l = F0
        sum_l2 = F0
        sum_xl = F0
        for i in range(n):
            xi = x[xo + i]
            l = imax(0, imin(nmax, nearest_int(iscale * (xi - mn))))
            Laux[i] = l
            wi = w[wo + i]
            fl = F(l)
            sum_l += wi * fl
            sum_l2 += wi * fl * fl
            sum_xl += wi * fl * xi
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > F0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > F0:
                this_min = F0
                this_scale = sum_xl / sum_l2
            cur_error = F0
            for i in range(n):
                diff = this_scale * F(Laux[i]) + this_min - x[xo + i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += w[wo + i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[lo + i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(nogil=True, cache=True, error_model="numpy")
def make_qp_quants(n, nmax, x, L, qw):
    """`make_qp_quants(n, nmax, x, L, quant_weights)`: codes for non-negative sub-block scales.
    L is the C `uint8_t` array: every store wraps, and later reads see the wrapped value."""
    mx = F0
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F0
    iscale = F(nmax) / mx
    for i in range(n):
        L[i] = u8(nearest_int(iscale * x[i]))
    scale = F1 / iscale
    best_mse = F0
    for i in range(n):
        diff = x[i] - scale * F(L[i])
        best_mse += qw[i] * diff * diff
    for is_ in range(-4, 5):
        if is_ == 0:
            continue
        iscale_is = (F(0.1) * F(is_) + F(nmax)) / mx
        scale_is = F1 / iscale_is
        mse = F0
        for i in range(n):
            l = imin(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * F(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = F0
    suml2 = F0
    for i in range(n):
        l = imin(nmax, nearest_int(iscale * x[i]))
        L[i] = u8(l)
        wi = qw[i]
        fl = F(l)
        sumlx += wi * x[i] * fl
        suml2 += wi * fl * fl
    for _itry in range(5):
        n_changed = 0
        for i in range(n):
            wi = qw[i]
            li = L[i]
            fli = F(li)
            slx = sumlx - wi * x[i] * fli
            sl2 = suml2 - wi * fli * fli
            if slx > F0 and sl2 > F0:
                new_l = imin(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != li:
                    fnl = F(new_l)
                    slx += wi * x[i] * fnl
                    sl2 += wi * fnl * fnl
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = u8(new_l)
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > F0 else F0


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def best_index_int8(values, x):
    """`best_index_int8(16, values, x)`: the index of the level nearest x (ties to the upper one)."""
    if x <= F(values[0]):
        return 0
    if x >= F(values[15]):
        return 15
    ml = 0
    mu = 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < F(values[mav]):
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - F(values[mu - 1]) < F(values[mu]) - x else mu


# --- test hooks -----------------------------------------------------------------------------------------


@njit(nogil=True, cache=True, error_model="numpy")
def _nearest_many(x, out):
    for i in range(x.shape[0]):
        out[i] = nearest_int(x[i])


@njit(nogil=True, cache=True, error_model="numpy")
def _fp16_many(x, out):
    for i in range(x.shape[0]):
        out[i] = fp16_bits(x[i])


def nearest_int_scalar(v) -> int:
    """Python-level `nearest_int` (doctests and tests)."""
    return int(on_scalar(_nearest_many, v, np.float32, np.int64))


def fp16_bits_scalar(v) -> int:
    """Python-level `GGML_FP32_TO_FP16` bits (doctests and tests)."""
    return int(on_scalar(_fp16_many, v, np.float32, np.int64))
