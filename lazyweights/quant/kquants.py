"""The k-quant block types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K (256-value super-blocks).

A super-block holds 256 values in sub-blocks of 16 or 32, each with a small integer scale (and, for the
"asymmetric" types, a min) that multiplies the super-block's fp16 `d` (and `dmin`). Layouts, in byte order
(`x[e]` is value e of the super-block; "chunk" = 32 consecutive values):

    Q2_K   84 B: scales[16], qs[64], d, dmin
           16 groups of 16; scales[g] = min<<4 | scale (4 bits each);
           x[h*128 + s*32 + l] = d*(sc&15) * ((qs[h*32+l] >> 2s) & 3) - dmin*(sc>>4),  group = e // 16
    Q3_K  110 B: hmask[32], qs[64], scales[12], d
           16 signed 6-bit scales (low nibbles in bytes 0..7, high 2-bit pairs in bytes 8..11), offset 32;
           2 low bits from qs as in Q2_K, the third bit from hmask[l] bit (e // 32), where a CLEAR bit
           means "subtract 4": x = d*scale * (low - (hbit ? 0 : 4))
    Q4_K  144 B: d, dmin, scales[12], qs[128]
           8 chunks with 6-bit scale and min packed in 12 bytes (ggml's get_scale_min_k4);
           chunk 2c from the low nibbles of qs[32c:32c+32], chunk 2c+1 from the high nibbles;
           x = d*sc * q - dmin*m
    Q5_K  176 B: d, dmin, scales[12], qh[32], qs[128]
           as Q4_K with a fifth bit: bit j of qh[l] for chunk j
    Q6_K  210 B: ql[128], qh[64], scales:int8[16], d
           x[h*128 + s*32 + l] = d*scales[e//16] * (((ql[h*64 + (s&1)*32 + l] >> 4*(s>>1)) & 15
                                                    | ((qh[h*32 + l] >> 2s) & 3) << 4) - 32)
    Q8_K  292 B: d:f32, qs:int8[256], bsums:int16[16]     x = d * qs  (bsums only speed up dot products)

Every kernel computes what ggml's `dequantize_row_*` computes, in the same float32 order (the sub-block
scale first, `d * sc`, then `dl * q - ml` without fused multiply-add), so results equal gguf-py's bit for
bit. gguf-py has no Q8_K dequantizer; ours follows ggml's `dequantize_row_q8_K`.

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> block = np.zeros((1, 144), np.uint8)
    >>> block[0, 0:2] = [0x00, 0x3C]      # d = 1.0
    >>> block[0, 4:8] = 1                 # scale 1 for chunks 0..3 (mins stay 0)
    >>> block[0, 16:48] = 0x21            # chunk 0 codes 1, chunk 1 codes 2
    >>> dequantize(Q.Q4_K, block)[0, [0, 32, 64]]
    array([1., 2., 0.], dtype=float32)
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..core.quantization import QuantizationEncoding as Q
from ._bits import bits_to_f32, flat_runner, load_half
from .registry import register


# The 16-value groups of Q2_K/Q3_K/Q6_K are walked so that each inner iteration reads its packed bytes once
# and writes one value into each of four groups: a 16-long loop writing one group at a time measured 5x
# slower (LLVM vectorizes the four-output form much better), and it is how ggml's own loops run.


@njit(nogil=True, cache=True)
def _dequant_q2_k(src, out):
    for b in range(src.shape[0] // 84):
        s = b * 84
        o = b * 256
        d = load_half(src, s + 80)
        dmin = load_half(src, s + 82)
        for h in range(2):
            for half in range(2):
                # the groups of chunks (h, shift 0..3) that this half-chunk belongs to
                sc0 = np.int32(src[s + h * 8 + half])
                sc1 = np.int32(src[s + h * 8 + 2 + half])
                sc2 = np.int32(src[s + h * 8 + 4 + half])
                sc3 = np.int32(src[s + h * 8 + 6 + half])
                d0 = d * np.float32(sc0 & 15)
                m0 = dmin * np.float32(sc0 >> 4)
                d1 = d * np.float32(sc1 & 15)
                m1 = dmin * np.float32(sc1 >> 4)
                d2 = d * np.float32(sc2 & 15)
                m2 = dmin * np.float32(sc2 >> 4)
                d3 = d * np.float32(sc3 & 15)
                m3 = dmin * np.float32(sc3 >> 4)
                qo = s + 16 + h * 32 + half * 16
                oo = o + h * 128 + half * 16
                for l in range(16):
                    q = np.int32(src[qo + l])
                    out[oo + l] = d0 * np.float32(q & 3) - m0
                    out[oo + 32 + l] = d1 * np.float32((q >> 2) & 3) - m1
                    out[oo + 64 + l] = d2 * np.float32((q >> 4) & 3) - m2
                    out[oo + 96 + l] = d3 * np.float32(q >> 6) - m3


@njit(inline="always", nogil=True, cache=True)
def _q3_scale(src, sb, g):
    """The signed 6-bit scale of 16-value group g (0..15) from the 12 scale bytes at sb."""
    low = (np.int32(src[sb + (g & 7)]) >> (4 * (g >> 3))) & 15
    high = (np.int32(src[sb + 8 + (g & 3)]) >> (2 * (g >> 2))) & 3
    return (low | (high << 4)) - 32


@njit(nogil=True, cache=True)
def _dequant_q3_k(src, out):
    for b in range(src.shape[0] // 110):
        s = b * 110
        o = b * 256
        d = load_half(src, s + 108)
        for h in range(2):
            hb = 4 * h  # hmask bits 4h..4h+3 belong to chunks (h, shift 0..3)
            for half in range(2):
                g = h * 8 + half
                d0 = d * np.float32(_q3_scale(src, s + 96, g))
                d1 = d * np.float32(_q3_scale(src, s + 96, g + 2))
                d2 = d * np.float32(_q3_scale(src, s + 96, g + 4))
                d3 = d * np.float32(_q3_scale(src, s + 96, g + 6))
                qo = s + 32 + h * 32 + half * 16
                mo = s + half * 16
                oo = o + h * 128 + half * 16
                for l in range(16):
                    q = np.int32(src[qo + l])
                    # a CLEAR hmask bit subtracts 4 (ggml: `hm & m ? 0 : 4`)
                    m = (np.int32(src[mo + l]) >> hb) ^ 15
                    out[oo + l] = d0 * np.float32((q & 3) - ((m & 1) << 2))
                    out[oo + 32 + l] = d1 * np.float32(((q >> 2) & 3) - (m & 2) * 2)
                    out[oo + 64 + l] = d2 * np.float32(((q >> 4) & 3) - (m & 4))
                    out[oo + 96 + l] = d3 * np.float32((q >> 6) - ((m & 8) >> 1))


@njit(inline="always", nogil=True, cache=True)
def _scale_min_k4(src, sb, j):
    """ggml's get_scale_min_k4: the 6-bit scale and min of chunk j from the 12 bytes at sb."""
    if j < 4:
        return np.int32(src[sb + j]) & 63, np.int32(src[sb + j + 4]) & 63
    sc = (np.int32(src[sb + j + 4]) & 15) | ((np.int32(src[sb + j - 4]) >> 6) << 4)
    m = (np.int32(src[sb + j + 4]) >> 4) | ((np.int32(src[sb + j]) >> 6) << 4)
    return sc, m


@njit(inline="always", nogil=True, cache=True)
def _chunk_pair_scales(src, s, d, dmin, j0):
    """Q4_K/Q5_K chunks j0 and j0 + 1 of the super-block at s: (d*sc0, dmin*m0, d*sc1, dmin*m1)."""
    sc0, m0 = _scale_min_k4(src, s + 4, j0)
    sc1, m1 = _scale_min_k4(src, s + 4, j0 + 1)
    return d * np.float32(sc0), dmin * np.float32(m0), d * np.float32(sc1), dmin * np.float32(m1)


@njit(nogil=True, cache=True)
def _dequant_q4_k(src, out):
    for b in range(src.shape[0] // 144):
        s = b * 144
        o = b * 256
        d = load_half(src, s)
        dmin = load_half(src, s + 2)
        for c in range(4):
            d0, n0, d1, n1 = _chunk_pair_scales(src, s, d, dmin, 2 * c)
            qo = s + 16 + c * 32
            oo = o + c * 64
            for l in range(32):
                q = np.int32(src[qo + l])
                out[oo + l] = d0 * np.float32(q & 15) - n0
                out[oo + 32 + l] = d1 * np.float32(q >> 4) - n1


@njit(nogil=True, cache=True)
def _dequant_q5_k(src, out):
    for b in range(src.shape[0] // 176):
        s = b * 176
        o = b * 256
        d = load_half(src, s)
        dmin = load_half(src, s + 2)
        for c in range(4):
            j0 = 2 * c
            d0, n0, d1, n1 = _chunk_pair_scales(src, s, d, dmin, j0)
            qo = s + 48 + c * 32
            oo = o + c * 64
            for l in range(32):
                q = np.int32(src[qo + l])
                hb = np.int32(src[s + 16 + l])
                q0 = (q & 15) | (((hb >> j0) & 1) << 4)
                q1 = (q >> 4) | (((hb >> (j0 + 1)) & 1) << 4)
                out[oo + l] = d0 * np.float32(q0) - n0
                out[oo + 32 + l] = d1 * np.float32(q1) - n1


@njit(nogil=True, cache=True)
def _dequant_q6_k(src, out):
    for b in range(src.shape[0] // 210):
        s = b * 210
        o = b * 256
        d = load_half(src, s + 208)
        for h in range(2):
            g0 = s + 192 + h * 8
            lo = s + h * 64
            hi = s + 128 + h * 32
            oo = o + h * 128
            for half in range(2):
                d0 = d * np.float32((np.int32(src[g0 + half]) ^ 128) - 128)  # int8 scales
                d1 = d * np.float32((np.int32(src[g0 + 2 + half]) ^ 128) - 128)
                d2 = d * np.float32((np.int32(src[g0 + 4 + half]) ^ 128) - 128)
                d3 = d * np.float32((np.int32(src[g0 + 6 + half]) ^ 128) - 128)
                for ll in range(16):
                    l = half * 16 + ll
                    a = np.int32(src[lo + l])
                    c = np.int32(src[lo + 32 + l])
                    q = np.int32(src[hi + l])
                    out[oo + l] = d0 * np.float32(((a & 15) | ((q & 3) << 4)) - 32)
                    out[oo + 32 + l] = d1 * np.float32(((c & 15) | (((q >> 2) & 3) << 4)) - 32)
                    out[oo + 64 + l] = d2 * np.float32(((a >> 4) | (((q >> 4) & 3) << 4)) - 32)
                    out[oo + 96 + l] = d3 * np.float32(((c >> 4) | (((q >> 6) & 3) << 4)) - 32)


@njit(nogil=True, cache=True)
def _dequant_q8_k(src, out):
    for b in range(src.shape[0] // 292):
        s = b * 292
        o = b * 256
        d = bits_to_f32(
            np.uint32(src[s])
            | (np.uint32(src[s + 1]) << np.uint32(8))
            | (np.uint32(src[s + 2]) << np.uint32(16))
            | (np.uint32(src[s + 3]) << np.uint32(24))
        )
        for j in range(256):
            out[o + j] = d * np.float32((np.int32(src[s + 4 + j]) ^ 128) - 128)


register(Q.Q2_K, dequantize=flat_runner(_dequant_q2_k))
register(Q.Q3_K, dequantize=flat_runner(_dequant_q3_k))
register(Q.Q4_K, dequantize=flat_runner(_dequant_q4_k))
register(Q.Q5_K, dequantize=flat_runner(_dequant_q5_k))
register(Q.Q6_K, dequantize=flat_runner(_dequant_q6_k))
register(Q.Q8_K, dequantize=flat_runner(_dequant_q8_k))
