"""The "i-quant" block types: IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M.

These store indices into fixed codebooks instead of plain integers. The codebooks (ggml's `iq2xxs_grid`,
`iq2xs_grid`, `iq2s_grid`, `iq3xxs_grid`, `iq3s_grid`, `iq1s_grid`, the sign table `ksigns_iq2xs` and the
non-linear 4-bit table `kvalues_iq4nl`) are taken from gguf-py's `gguf.quants` at import, not copied, so
they cannot drift from the reference. Layouts (`d` fp16; x[e] is value e of the 256-value super-block,
except IQ4_NL whose block is 32):

    IQ4_NL   18 B: d, qs[16]                  x[a*16 + l] = d * kv[(qs[l] >> 4a) & 15]
    IQ4_XS  136 B: d, scales_h:u16, scales_l[4], qs[128]
                   8 chunks of 32, 6-bit scale ls = low nibble of scales_l | 2 bits of scales_h, minus 32;
                   x[j*32 + a*16 + l] = d*ls_j * kv[(qs[j*16 + l] >> 4a) & 15]
    IQ2_XXS  66 B: d, 8 x (aux0:u32, aux1:u32)   per 32 values: four 8-value grid rows (bytes of aux0),
                   four 7-bit sign indices into ksigns (aux1 bits 0..27), a 4-bit scale (aux1 >> 28):
                   x = d*(0.5 + s)*0.25 * grid[row][k] * (sign bit k ? -1 : 1)
    IQ2_XS   74 B: d, qs:u16[32], scales[8]      each u16: 9-bit grid row (512 rows), 7-bit sign index;
                   16 four-bit scales, one per 16 values
    IQ2_S    82 B: d, qs[32], signs[32], qh[8], scales[8]
                   10-bit grid row (1024 rows) = qs[i] | 2 bits of qh; explicit sign bits
    IQ3_XXS  98 B: d, qs[64], scales:u32[8]      4-value grid rows (256), signs/scale as IQ2_XXS, * 0.5
    IQ3_S   110 B: d, qs[64], qh[8], signs[32], scales[4]
                   9-bit rows (512) = qs[i] | 1 bit of qh; x = d*(1 + 2*s) * grid * sign
    IQ1_S    50 B: d, qs[32], qh:u16[8]          11-bit rows of {-1,0,1} (2048) = qs | 3 bits of qh;
                   per 32 values: scale 2*((qh >> 12) & 7) + 1, delta = qh bit 15 ? -1/8 : +1/8;
                   x = d*scale * (grid + delta)
    IQ1_M    56 B: qs[32], qh[16], scales:u16[4] the fp16 d is split over the top nibbles of the four
                   scales words; 3-bit scales per 16 values; each qh nibble: 3 row bits + a delta sign

Kernels follow ggml's `dequantize_row_iq*` (and gguf-py's float order: `(d * (0.5 + s)) * 0.25`, then
`(db * grid) * sign`), so results equal gguf-py's bit for bit. No quantizers: gguf-py has none for these
types (ggml's need an importance matrix search).

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> block = np.zeros((1, 18), np.uint8)
    >>> block[0, :2] = [0x00, 0x3C]   # d = 1.0
    >>> block[0, 2] = 0xF0            # value 0: code 0 -> -127, value 16: code 15 -> 113
    >>> dequantize(Q.IQ4_NL, block)[0, [0, 16]]
    array([-127.,  113.], dtype=float32)
"""
from __future__ import annotations

import numpy as np
from gguf import quants as _gq
from numba import njit

from ..core.quantization import QuantizationEncoding as Q
from ._bits import flat_runner, load_half, half_to_float
from .registry import register


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def _grid(cls) -> np.ndarray:
    """gguf-py's decoded codebook for a quant class, as a read-only float32 [rows, values] array."""
    cls.init_grid()
    return _frozen(np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape))


KVALUES_IQ4NL = _frozen(np.array(_gq.IQ4_NL.kvalues, dtype=np.float32))
KSIGNS = _frozen(np.frombuffer(_gq.IQ2_XXS.ksigns, dtype=np.uint8))
GRID_IQ2_XXS = _grid(_gq.IQ2_XXS)
GRID_IQ2_XS = _grid(_gq.IQ2_XS)
GRID_IQ2_S = _grid(_gq.IQ2_S)
GRID_IQ3_XXS = _grid(_gq.IQ3_XXS)
GRID_IQ3_S = _grid(_gq.IQ3_S)
GRID_IQ1_S = _grid(_gq.IQ1_S)  # IQ1_M shares it
IQ1_DELTA = np.float32(_gq.IQ1_S.delta)

_F_HALF = np.float32(0.5)
_F_QUARTER = np.float32(0.25)
_F_ONE = np.float32(1.0)


@njit(inline="always", nogil=True, cache=True)
def _u16(src, o):
    return np.int64(src[o]) | (np.int64(src[o + 1]) << 8)


@njit(inline="always", nogil=True, cache=True)
def _u32(src, o):
    return np.int64(src[o]) | (np.int64(src[o + 1]) << 8) | (np.int64(src[o + 2]) << 16) | (np.int64(src[o + 3]) << 24)


@njit(inline="always", nogil=True, cache=True)
def _signed8(out, o, db, grid, row, signs, n8):
    """n8 (= 8) values db * grid[row][k] * (+-1 by bit k of `signs`), in gguf-py's order ((db * g) * sign).

    n8 is a runtime argument on purpose: with a constant 8, LLVM unrolls the loop into scalar code;
    as a loop it is vectorized (measured 10 -> 16 GB/s for IQ2_XXS).
    """
    for k in range(n8):
        sgn = -_F_ONE if (signs >> k) & 1 else _F_ONE
        out[o + k] = db * grid[row, k] * sgn


@njit(inline="always", nogil=True, cache=True)
def _signed4x2(out, o, db, grid, r0, r1, signs):
    """8 values from two 4-value grid rows: db * grid[r][k] * (+-1 by bit k (r0) or k + 4 (r1) of `signs`).

    Constant 4-long loops: unrolled scalar code is the fastest form here (a runtime count, which helps the
    8-long loops of `_signed8`, measured 2.5x slower).
    """
    for k in range(4):
        sgn = -_F_ONE if (signs >> k) & 1 else _F_ONE
        out[o + k] = db * grid[r0, k] * sgn
    for k in range(4):
        sgn = -_F_ONE if (signs >> (k + 4)) & 1 else _F_ONE
        out[o + 4 + k] = db * grid[r1, k] * sgn


@njit(inline="always", nogil=True, cache=True)
def _iq2_db(src, sb, i, d):
    """IQ2_XS/IQ2_S: the scale of 8-value group i, d * (0.5 + 4-bit scale) * 0.25 (scales bytes at sb)."""
    sc = (np.int32(src[sb + (i >> 2)]) >> (4 * ((i >> 1) & 1))) & 15
    return d * (_F_HALF + np.float32(sc)) * _F_QUARTER


# --- IQ4 --------------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def _dequant_iq4_nl(src, out, kv):
    for b in range(src.shape[0] // 18):
        s = b * 18
        o = b * 32
        d = load_half(src, s)
        for l in range(16):
            q = np.int32(src[s + 2 + l])
            out[o + l] = d * kv[q & 15]
            out[o + 16 + l] = d * kv[q >> 4]


@njit(nogil=True, cache=True)
def _dequant_iq4_xs(src, out, kv):
    for b in range(src.shape[0] // 136):
        s = b * 136
        o = b * 256
        d = load_half(src, s)
        sh = _u16(src, s + 2)
        for j in range(8):
            ls = ((np.int32(src[s + 4 + (j >> 1)]) >> (4 * (j & 1))) & 15) | (np.int32((sh >> (2 * j)) & 3) << 4)
            dl = d * np.float32(ls - 32)
            for l in range(16):
                q = np.int32(src[s + 8 + j * 16 + l])
                out[o + j * 32 + l] = dl * kv[q & 15]
                out[o + j * 32 + 16 + l] = dl * kv[q >> 4]


# --- IQ2 --------------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def _dequant_iq2_xxs(src, out, grid, ksigns, n8):
    for b in range(src.shape[0] // 66):
        s = b * 66
        o = b * 256
        d = load_half(src, s)
        for ib in range(8):
            q = s + 2 + ib * 8
            aux1 = _u32(src, q + 4)
            db = d * (_F_HALF + np.float32(aux1 >> 28)) * _F_QUARTER
            for l in range(4):
                _signed8(out, o + ib * 32 + l * 8, db, grid, src[q + l], ksigns[(aux1 >> (7 * l)) & 127], n8)


@njit(nogil=True, cache=True)
def _dequant_iq2_xs(src, out, grid, ksigns, n8):
    for b in range(src.shape[0] // 74):
        s = b * 74
        o = b * 256
        d = load_half(src, s)
        for i in range(32):
            db = _iq2_db(src, s + 66, i, d)
            q = _u16(src, s + 2 + 2 * i)
            _signed8(out, o + i * 8, db, grid, q & 511, ksigns[q >> 9], n8)


@njit(nogil=True, cache=True)
def _dequant_iq2_s(src, out, grid, n8):
    for b in range(src.shape[0] // 82):
        s = b * 82
        o = b * 256
        d = load_half(src, s)
        for i in range(32):
            db = _iq2_db(src, s + 74, i, d)
            row = np.int32(src[s + 2 + i]) | (((np.int32(src[s + 66 + (i >> 2)]) >> (2 * (i & 3))) & 3) << 8)
            _signed8(out, o + i * 8, db, grid, row, src[s + 34 + i], n8)


# --- IQ3 --------------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def _dequant_iq3_xxs(src, out, grid, ksigns):
    for b in range(src.shape[0] // 98):
        s = b * 98
        o = b * 256
        d = load_half(src, s)
        for ib in range(8):
            aux = _u32(src, s + 66 + 4 * ib)
            db = d * (_F_HALF + np.float32(aux >> 28)) * _F_HALF
            for l in range(4):
                signs = ksigns[(aux >> (7 * l)) & 127]
                r0 = src[s + 2 + ib * 8 + l * 2]
                r1 = src[s + 2 + ib * 8 + l * 2 + 1]
                oo = o + ib * 32 + l * 8
                _signed4x2(out, oo, db, grid, r0, r1, signs)


@njit(nogil=True, cache=True)
def _dequant_iq3_s(src, out, grid):
    for b in range(src.shape[0] // 110):
        s = b * 110
        o = b * 256
        d = load_half(src, s)
        for j in range(8):
            sc = (np.int32(src[s + 106 + (j >> 1)]) >> (4 * (j & 1))) & 15
            db = d * np.float32(1 + 2 * sc)
            for i8 in range(4):  # 8-value groups: two 4-value grid rows, one sign byte
                g = j * 4 + i8
                signs = src[s + 74 + g]
                qh = np.int32(src[s + 66 + j])
                r0 = np.int32(src[s + 2 + 2 * g]) | (((qh >> (2 * i8)) & 1) << 8)
                r1 = np.int32(src[s + 3 + 2 * g]) | (((qh >> (2 * i8 + 1)) & 1) << 8)
                oo = o + g * 8
                _signed4x2(out, oo, db, grid, r0, r1, signs)


# --- IQ1 --------------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def _dequant_iq1_s(src, out, grid, delta, n8):
    for b in range(src.shape[0] // 50):
        s = b * 50
        o = b * 256
        d = load_half(src, s)
        for ib in range(8):
            qh = _u16(src, s + 34 + 2 * ib)
            dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
            dlt = -delta if qh & 0x8000 else delta
            for l in range(4):
                row = np.int64(src[s + 2 + ib * 4 + l]) | (((qh >> (3 * l)) & 7) << 8)
                oo = o + ib * 32 + l * 8
                for k in range(n8):  # n8 = 8, a runtime count (see _signed8)
                    out[oo + k] = dl * (grid[row, k] + dlt)


@njit(nogil=True, cache=True)
def _dequant_iq1_m(src, out, grid, delta, n8):
    for b in range(src.shape[0] // 56):
        s = b * 56
        o = b * 256
        sc0 = _u16(src, s + 48)
        sc1 = _u16(src, s + 50)
        sc2 = _u16(src, s + 52)
        sc3 = _u16(src, s + 54)
        # the fp16 scale is the top nibble of each of the four scale words
        d = half_to_float((sc0 >> 12) | ((sc1 >> 8) & 0xF0) | ((sc2 >> 4) & 0xF00) | (sc3 & 0xF000))
        for i in range(32):  # 8-value groups
            k16 = i >> 1  # 3-bit scale per 16 values, four per scale word
            if k16 < 4:
                w = sc0
            elif k16 < 8:
                w = sc1
            elif k16 < 12:
                w = sc2
            else:
                w = sc3
            dl = d * np.float32(2 * ((w >> (3 * (k16 & 3))) & 7) + 1)
            nib = (np.int64(src[s + 32 + (i >> 1)]) >> (4 * (i & 1))) & 15
            row = np.int64(src[s + i]) | ((nib & 7) << 8)
            dlt = -delta if nib & 8 else delta
            oo = o + i * 8
            for k in range(n8):
                out[oo + k] = dl * (grid[row, k] + dlt)


# --- registration -----------------------------------------------------------------------------------------


register(Q.IQ4_NL, dequantize=flat_runner(_dequant_iq4_nl, KVALUES_IQ4NL))
register(Q.IQ4_XS, dequantize=flat_runner(_dequant_iq4_xs, KVALUES_IQ4NL))
register(Q.IQ2_XXS, dequantize=flat_runner(_dequant_iq2_xxs, GRID_IQ2_XXS, KSIGNS, 8))
register(Q.IQ2_XS, dequantize=flat_runner(_dequant_iq2_xs, GRID_IQ2_XS, KSIGNS, 8))
register(Q.IQ2_S, dequantize=flat_runner(_dequant_iq2_s, GRID_IQ2_S, 8))
register(Q.IQ3_XXS, dequantize=flat_runner(_dequant_iq3_xxs, GRID_IQ3_XXS, KSIGNS))
register(Q.IQ3_S, dequantize=flat_runner(_dequant_iq3_s, GRID_IQ3_S))
register(Q.IQ1_S, dequantize=flat_runner(_dequant_iq1_s, GRID_IQ1_S, IQ1_DELTA, 8))
register(Q.IQ1_M, dequantize=flat_runner(_dequant_iq1_m, GRID_IQ1_S, IQ1_DELTA, 8))
