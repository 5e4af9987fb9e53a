"""The original ggml block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 values per block).

Block layouts (little-endian, `d`/`m` are fp16; value i of the block is x[i]):

    Q4_0  18 B: d, qs[16]            x[j] = d * ((qs[j] & 15) - 8),  x[j+16] = d * ((qs[j] >> 4) - 8)
    Q4_1  20 B: d, m, qs[16]         x[j] = d * (qs[j] & 15) + m,    x[j+16] = d * (qs[j] >> 4) + m
    Q5_0  22 B: d, qh:u32, qs[16]    like Q4_0 but 5-bit: bit i of qh is bit 4 of code i; offset 16
    Q5_1  24 B: d, m, qh:u32, qs[16] like Q4_1 but 5-bit
    Q8_0  34 B: d, qs:int8[32]       x[i] = qs[i] * d

Dequantization follows ggml's float order of operations (one float32 multiply, plus one float32 add for
the `_1` types; no fused multiply-add), so the results equal gguf-py's bit for bit.

Quantization follows gguf-py's `quantize_blocks` (llama.cpp's `quantize_row_*_ref`) step by step in
float32: the scale from the block's max (or signed absmax), the inverse scale `1/d` (0 for an all-zero
block), codes by truncation after a +0.5 offset (Q4/Q5) or by gguf-py's `np_roundf` (round half away from
zero, Q8_0). Scales are stored as fp16 with round-to-nearest-even, as numpy's `astype(float16)` does.
NaN inputs give unspecified codes (as in gguf-py, where the float->uint8 cast of NaN is platform-defined).

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize, dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> x = np.arange(32, dtype=np.float32).reshape(1, 32) - 16
    >>> dequantize(Q.Q5_0, quantize(Q.Q5_0, x))[0, :4]
    array([-16., -15., -14., -13.], dtype=float32)
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..core.quantization import QuantizationEncoding as Q
from ._bits import flat_runner, load_half, store_half
from ._ggml_math import min_max
from .registry import register

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_F2 = np.float32(2.0)
_HALF = np.float32(0.5)

# --- dequantize -----------------------------------------------------------------------------------------


# Why some kernels take the inner trip count (`half` = 16, `qk` = 32) as an ARGUMENT: with a constant
# count LLVM fully unrolls the short inner loop and then fails to vectorize the unrolled code (scalar
# int->float conversions, ~12 GB/s); a runtime count keeps it a loop that the loop vectorizer turns into
# AVX code (25-37 GB/s here). The Q5 kernels' bodies are big enough that LLVM does not unroll them.


@njit(nogil=True, cache=True)
def _dequant_q4_0(src, out, half):
    for b in range(src.shape[0] // 18):
        s = b * 18
        o = b * 32
        d = load_half(src, s)
        for j in range(half):
            q = np.int32(src[s + 2 + j])
            out[o + j] = d * np.float32((q & 15) - 8)
            out[o + 16 + j] = d * np.float32((q >> 4) - 8)


@njit(nogil=True, cache=True)
def _dequant_q4_1(src, out, half):
    for b in range(src.shape[0] // 20):
        s = b * 20
        o = b * 32
        d = load_half(src, s)
        m = load_half(src, s + 2)
        for j in range(half):
            q = np.int32(src[s + 4 + j])
            # (d * q) + m as two float32 roundings, never an fma: that is what numpy (and ggml) compute
            out[o + j] = d * np.float32(q & 15) + m
            out[o + 16 + j] = d * np.float32(q >> 4) + m


@njit(inline="always", nogil=True, cache=True)
def _load_u32(src, o):
    return (
        np.uint32(src[o])
        | (np.uint32(src[o + 1]) << np.uint32(8))
        | (np.uint32(src[o + 2]) << np.uint32(16))
        | (np.uint32(src[o + 3]) << np.uint32(24))
    )


@njit(nogil=True, cache=True)
def _dequant_q5_0(src, out):
    for b in range(src.shape[0] // 22):
        s = b * 22
        o = b * 32
        d = load_half(src, s)
        qh = np.int64(_load_u32(src, s + 2))
        for j in range(16):
            q = np.int32(src[s + 6 + j])
            lo = (q & 15) | np.int32(((qh >> j) & 1) << 4)
            hi = (q >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
            out[o + j] = d * np.float32(lo - 16)
            out[o + 16 + j] = d * np.float32(hi - 16)


@njit(nogil=True, cache=True)
def _dequant_q5_1(src, out):
    for b in range(src.shape[0] // 24):
        s = b * 24
        o = b * 32
        d = load_half(src, s)
        m = load_half(src, s + 2)
        qh = np.int64(_load_u32(src, s + 4))
        for j in range(16):
            q = np.int32(src[s + 8 + j])
            lo = (q & 15) | np.int32(((qh >> j) & 1) << 4)
            hi = (q >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
            out[o + j] = d * np.float32(lo) + m
            out[o + 16 + j] = d * np.float32(hi) + m


@njit(nogil=True, cache=True)
def _dequant_q8_0(src, out, qk):
    for b in range(src.shape[0] // 34):
        s = b * 34
        o = b * 32
        d = load_half(src, s)
        for j in range(qk):
            # int8 from the raw byte without a branch
            q = (np.int32(src[s + 2 + j]) ^ 128) - 128
            out[o + j] = np.float32(q) * d


# --- quantize -------------------------------------------------------------------------------------------


@njit(inline="always", nogil=True, cache=True)
def _signed_absmax(x, s, n):
    """The value with the largest magnitude in x[s:s+n], the first one on ties (numpy's argmax)."""
    mx = x[s]
    amax = abs(mx)
    for j in range(1, n):
        v = x[s + j]
        a = abs(v)
        if a > amax:
            amax = a
            mx = v
    return mx


@njit(inline="always", nogil=True, cache=True)
def _inverse(d):
    return _F1 / d if d != _F0 else _F0


@njit(inline="always", nogil=True, cache=True)
def _trunc_code(v, top):
    """gguf-py's `np.trunc(v).astype(uint8).clip(0, top)` for v >= 0 (v is always >= 0 here)."""
    q = np.int32(v)
    return top if q > top else q


@njit(inline="always", nogil=True, cache=True)
def _absmax_scale(x, s, out, o, div):
    """The `_0` types' scale d = (signed absmax of the 32 values at s) / div, stored as fp16 at o;
    returns 1/d (0 for an all-zero block)."""
    d = _signed_absmax(x, s, 32) / div
    store_half(out, o, d)
    return _inverse(d)


@njit(inline="always", nogil=True, cache=True)
def _min_scale(x, s, out, o, steps):
    """The `_1` types' d = (max - min) / steps and m = min of the 32 values at s, stored as fp16 at o and
    o + 2; returns (min, 1/d)."""
    mn, mx = min_max(x, s, 32)
    d = (mx - mn) / steps
    store_half(out, o, d)
    store_half(out, o + 2, mn)
    return mn, _inverse(d)


@njit(nogil=True, cache=True)
def _quant_q4_0(x, out):
    for b in range(x.shape[0] // 32):
        s = b * 32
        o = b * 18
        inv = _absmax_scale(x, s, out, o, np.float32(-8.0))
        for j in range(16):
            q0 = _trunc_code(x[s + j] * inv + np.float32(8.5), 15)
            q1 = _trunc_code(x[s + 16 + j] * inv + np.float32(8.5), 15)
            out[o + 2 + j] = np.uint8(q0 | (q1 << 4))


@njit(nogil=True, cache=True)
def _quant_q4_1(x, out):
    for b in range(x.shape[0] // 32):
        s = b * 32
        o = b * 20
        mn, inv = _min_scale(x, s, out, o, np.float32(15.0))
        for j in range(16):
            q0 = _trunc_code((x[s + j] - mn) * inv + _HALF, 15)
            q1 = _trunc_code((x[s + 16 + j] - mn) * inv + _HALF, 15)
            out[o + 4 + j] = np.uint8(q0 | (q1 << 4))


@njit(inline="always", nogil=True, cache=True)
def _store_q5(out, o, codes):
    """Pack 32 five-bit codes: qh (bit i = bit 4 of code i) as a u32 at o, then 16 nibble-pair bytes."""
    qh = np.uint32(0)
    for j in range(32):
        qh |= np.uint32((codes[j] >> 4) & 1) << np.uint32(j)
    out[o] = np.uint8(qh & np.uint32(0xFF))
    out[o + 1] = np.uint8((qh >> np.uint32(8)) & np.uint32(0xFF))
    out[o + 2] = np.uint8((qh >> np.uint32(16)) & np.uint32(0xFF))
    out[o + 3] = np.uint8(qh >> np.uint32(24))
    for j in range(16):
        out[o + 4 + j] = np.uint8((codes[j] & 15) | ((codes[j + 16] & 15) << 4))


@njit(nogil=True, cache=True)
def _quant_q5_0(x, out):
    codes = np.empty(32, np.int32)
    for b in range(x.shape[0] // 32):
        s = b * 32
        o = b * 22
        inv = _absmax_scale(x, s, out, o, np.float32(-16.0))
        for j in range(32):
            codes[j] = _trunc_code(x[s + j] * inv + np.float32(16.5), 31)
        _store_q5(out, o + 2, codes)


@njit(nogil=True, cache=True)
def _quant_q5_1(x, out):
    codes = np.empty(32, np.int32)
    for b in range(x.shape[0] // 32):
        s = b * 32
        o = b * 24
        mn, inv = _min_scale(x, s, out, o, np.float32(31.0))
        for j in range(32):
            codes[j] = _trunc_code((x[s + j] - mn) * inv + _HALF, 31)
        _store_q5(out, o + 4, codes)


@njit(inline="always", nogil=True, cache=True)
def np_roundf(v):
    """gguf-py's `np_roundf`: round half away from zero, computed exactly as it does, in float32."""
    a = abs(v)
    fl = np.floor(a)
    r = fl + np.floor(_F2 * (a - fl))
    return -r if v < _F0 else r


@njit(nogil=True, cache=True)
def _quant_q8_0(x, out):
    for b in range(x.shape[0] // 32):
        s = b * 32
        o = b * 34
        amax = _F0
        for j in range(32):
            a = abs(x[s + j])
            if a > amax:
                amax = a
        d = amax / np.float32(127.0)
        inv = _inverse(d)
        store_half(out, o, d)
        for j in range(32):
            q = np.int32(np_roundf(x[s + j] * inv))
            out[o + 2 + j] = np.uint8(q & 255)


# --- registration ---------------------------------------------------------------------------------------


#: encoding -> this module's quantizer; `legacy_imatrix` wraps these with its importance-matrix path.
QUANTIZERS = {
    Q.Q4_0: flat_runner(_quant_q4_0),
    Q.Q4_1: flat_runner(_quant_q4_1),
    Q.Q5_0: flat_runner(_quant_q5_0),
    Q.Q5_1: flat_runner(_quant_q5_1),
    Q.Q8_0: flat_runner(_quant_q8_0),
}

register(Q.Q4_0, dequantize=flat_runner(_dequant_q4_0, 16), quantize=QUANTIZERS[Q.Q4_0])
register(Q.Q4_1, dequantize=flat_runner(_dequant_q4_1, 16), quantize=QUANTIZERS[Q.Q4_1])
register(Q.Q5_0, dequantize=flat_runner(_dequant_q5_0), quantize=QUANTIZERS[Q.Q5_0])
register(Q.Q5_1, dequantize=flat_runner(_dequant_q5_1), quantize=QUANTIZERS[Q.Q5_1])
register(Q.Q8_0, dequantize=flat_runner(_dequant_q8_0, 32), quantize=QUANTIZERS[Q.Q8_0])
