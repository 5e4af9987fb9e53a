"""The ternary block types TQ1_0 and TQ2_0 (256 values in {-1, 0, +1} times one fp16 scale).

Layouts (x[e] is value e of the block, `d` fp16 at the end):

    TQ2_0  66 B: qs[64], d        2 bits per value, code c -> c - 1:
                                  x[h*128 + s*32 + l] = d * (((qs[h*32 + l] >> 2s) & 3) - 1)
    TQ1_0  54 B: qs[48], qh[4], d five base-3 digits per byte, stored as ceil(v * 256 / 243) so a digit
                                  is read by "multiply by 3^s (mod 256), then (x * 3) >> 8":
                                  values   0..159 from qs[0:32]  (x[s*32 + l],       digit s of qs[l])
                                  values 160..239 from qs[32:48] (x[160 + s*16 + l], digit s of qs[32+l])
                                  values 240..255 from qh[0:4]   (x[240 + s*4 + l],  digit s of qh[l])

Quantization follows gguf-py (`d` = the block's absmax, codes = np_roundf(x / d) + 1), byte for byte.

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize, dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> x = np.tile(np.array([-2.0, 0.0, 2.0, 0.5], np.float32), 64).reshape(1, 256)
    >>> for enc in (Q.TQ1_0, Q.TQ2_0):
    ...     print(enc.name, dequantize(enc, quantize(enc, x))[0, :4])
    TQ1_0 [-2.  0.  2.  0.]
    TQ2_0 [-2.  0.  2.  0.]
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..core.quantization import QuantizationEncoding as Q
from ._bits import flat_runner, load_half, store_half
from .legacy import np_roundf
from .registry import register

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)


@njit(nogil=True, cache=True)
def _dequant_tq2_0(src, out):
    for b in range(src.shape[0] // 66):
        s = b * 66
        o = b * 256
        d = load_half(src, s + 64)
        for h in range(2):
            for l in range(32):
                q = np.int32(src[s + h * 32 + l])
                oo = o + h * 128 + l
                out[oo] = d * np.float32((q & 3) - 1)
                out[oo + 32] = d * np.float32(((q >> 2) & 3) - 1)
                out[oo + 64] = d * np.float32(((q >> 4) & 3) - 1)
                out[oo + 96] = d * np.float32((q >> 6) - 1)


@njit(inline="always", nogil=True, cache=True)
def _trit(byte, pow3):
    """Digit of a TQ1_0 byte: rotate the wanted digit to the top by `* 3^s mod 256`, then read it."""
    return (((np.int32(byte) * pow3) & 255) * 3 >> 8) - 1


@njit(inline="always", nogil=True, cache=True)
def _put_trits(out, o, step, d, q, n):
    """The first n digits of TQ1_0 byte q, times d, at out[o], out[o + step], ... (digit k at o + k*step)."""
    pow3 = 1
    for k in range(n):
        out[o + k * step] = d * np.float32(_trit(q, pow3))
        pow3 *= 3


@njit(nogil=True, cache=True)
def _dequant_tq1_0(src, out):
    for b in range(src.shape[0] // 54):
        s = b * 54
        o = b * 256
        d = load_half(src, s + 52)
        for l in range(32):
            _put_trits(out, o + l, 32, d, src[s + l], 5)
        for l in range(16):
            _put_trits(out, o + 160 + l, 16, d, src[s + 32 + l], 5)
        for l in range(4):
            _put_trits(out, o + 240 + l, 4, d, src[s + 48 + l], 4)


@njit(inline="always", nogil=True, cache=True)
def _ternary_codes(x, s, codes):
    """codes[i] = np_roundf(x[s+i] / absmax) + 1 (0, 1 or 2), as gguf-py; returns absmax (the scale)."""
    d = _F0
    for j in range(256):
        a = abs(x[s + j])
        if a > d:
            d = a
    inv = _F1 / d if d != _F0 else _F0
    for j in range(256):
        codes[j] = np.int32(np_roundf(x[s + j] * inv)) + 1
    return d


@njit(nogil=True, cache=True)
def _quant_tq2_0(x, out):
    codes = np.empty(256, np.int32)
    for b in range(x.shape[0] // 256):
        s = b * 256
        o = b * 66
        d = _ternary_codes(x, s, codes)
        for h in range(2):
            for l in range(32):
                c = h * 128 + l
                out[o + h * 32 + l] = np.uint8(
                    codes[c] | (codes[c + 32] << 2) | (codes[c + 64] << 4) | (codes[c + 96] << 6)
                )
        store_half(out, o + 64, d)


@njit(inline="always", nogil=True, cache=True)
def _pack_trits(codes, c, step, n):
    """The TQ1_0 byte of the n digits codes[c], codes[c + step], ... (most significant first; with n < 5 the
    low digit slots stay 0): v = sum codes[c + k*step] * 3^(4-k), stored as ceil(v * 256 / 243), which is
    gguf-py's `(v * 256 + 242) // 243`."""
    v = 0
    pow3 = 81
    for k in range(n):
        v += codes[c + k * step] * pow3
        pow3 //= 3
    return np.uint8((v * 256 + 242) // 243)


@njit(nogil=True, cache=True)
def _quant_tq1_0(x, out):
    codes = np.empty(256, np.int32)
    for b in range(x.shape[0] // 256):
        s = b * 256
        o = b * 54
        d = _ternary_codes(x, s, codes)
        for l in range(32):
            out[o + l] = _pack_trits(codes, l, 32, 5)
        for l in range(16):
            out[o + 32 + l] = _pack_trits(codes, 160 + l, 16, 5)
        for l in range(4):
            out[o + 48 + l] = _pack_trits(codes, 240 + l, 4, 4)  # four digits: the lowest slot stays 0
        store_half(out, o + 52, d)


register(Q.TQ1_0, dequantize=flat_runner(_dequant_tq1_0), quantize=flat_runner(_quant_tq1_0))
register(Q.TQ2_0, dequantize=flat_runner(_dequant_tq2_0), quantize=flat_runner(_quant_tq2_0))
