"""IQ4_NL and IQ4_XS encoders: byte for byte what ggml's `quantize_iq4_nl` / `quantize_iq4_xs` write.

Both are `quantize_row_iq4_nl_impl` (ggml-quants.c) over a super-block: each 32-value block gets the
scale that best fits the 16 non-linear levels `kvalues_iq4nl` (15 trial scales around -max/-127, codes
by nearest level), weighted by `x^2` without an importance matrix or by `qw * sqrt(sigma2 + x^2)` with
one. IQ4_NL stores that scale as fp16 per 32 values; IQ4_XS codes the 8 block scales of a 256-value
super-block as 6-bit multiples of `-max_scale/32` and re-picks every level against the coded scale.
`ggml_quantize_chunk` passes `ntry = 7` with and without an importance matrix (the `_ref` row functions,
with `ntry = -1`, are not what llama-quantize writes), so this module follows the chunk path.

Layouts (little-endian): IQ4_NL 18 B: d (fp16), qs[16] (value j in the low nibble of byte j, value
j+16 in the high one). IQ4_XS 136 B: d (fp16), scales_h (u16, 2 high bits per block), scales_l[4]
(4 low bits per block), qs[128] (4 x 32-value blocks laid out as IQ4_NL's).

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize, dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    >>> for enc in (Q.IQ4_NL, Q.IQ4_XS):
    ...     y = dequantize(enc, quantize(enc, x))
    ...     print(enc.name, bool(np.abs(y - x).max() < 0.5))
    IQ4_NL True
    IQ4_XS True
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..core.quantization import QuantizationEncoding as Q
from ._bits import imatrix_runner, store_u16
from ._ggml_math import (
    F,
    F0,
    F1,
    GROUP_MAX_EPS,
    KVALUES_IQ4NL,
    best_index_int8,
    imax,
    imin,
    nearest_int,
    signed_absmax,
    store_fp16,
    u8,
)
from .registry import register

_NTRY = 7  # what ggml_quantize_chunk passes for both types


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _fit_sums(values, x, xb, weight, id_, L, lb, store):
    """One trial inverse scale of a 32-value block: sum w*q*x and sum w*q*q over the nearest levels q of
    x * id_ (and, when `store`, their indices into L)."""
    sumqx = F0
    sumq2 = F0
    for j in range(32):
        xv = x[xb + j]
        l = best_index_int8(values, id_ * xv)
        if store:
            L[lb + j] = l
        q = F(values[l])
        w = weight[j]
        sumqx += w * q * xv
        sumq2 += w * q * q
    return sumqx, sumq2


@njit(nogil=True, cache=True, error_model="numpy")
def _iq4_superblock(x, xo, out, o_d, o_qs, o_sh, o_sl, sbs, scales, weight, L, values, qw, qo, use_qw, ntry):
    """quantize_row_iq4_nl_impl(super_block_size=sbs, block_size=32, ...) for one super-block."""
    sigma2 = F0
    for j in range(sbs):
        sigma2 += x[xo + j] * x[xo + j]
    sigma2 *= F(2.0) / F(sbs)
    for j in range(sbs // 2):
        out[o_qs + j] = 0
    store_fp16(out, o_d, F0)
    max_scale = F0
    amax_scale = F0
    nblk = sbs // 32
    for ib in range(nblk):
        xb = xo + ib * 32
        lb = ib * 32
        if use_qw:
            for j in range(32):
                xv = x[xb + j]
                weight[j] = qw[qo + ib * 32 + j] * np.sqrt(sigma2 + xv * xv)
        else:
            for j in range(32):
                weight[j] = x[xb + j] * x[xb + j]
        amax, mx = signed_absmax(x, xb, 32)
        if amax < GROUP_MAX_EPS:
            scales[ib] = F0
            continue
        d = -mx / F(values[0]) if ntry > 0 else mx / F(values[0])
        sumqx, sumq2 = _fit_sums(values, x, xb, weight, F1 / d, L, lb, True)
        d = sumqx / sumq2 if sumq2 > F0 else F0
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            id_ = F(itry + np.int64(values[0])) / mx
            sumqx, sumq2 = _fit_sums(values, x, xb, weight, id_, L, lb, False)
            if sumq2 > F0 and sumqx * sumqx > best * sumq2:
                d = sumqx / sumq2
                best = d * sumqx
        scales[ib] = d
        abs_d = abs(d)
        if abs_d > amax_scale:
            amax_scale = abs_d
            max_scale = d
    if nblk > 1:
        scales_h = 0
        for k in range(nblk // 2):
            out[o_sl + k] = 0
        d = -max_scale / F(32.0)
        store_fp16(out, o_d, d)
        id_ = F1 / d if d != F0 else F0
        for ib in range(nblk):
            l = imax(-32, imin(31, nearest_int(id_ * scales[ib])))
            dl = d * F(l)
            idl = F1 / dl if dl != F0 else F0
            for j in range(32):
                L[ib * 32 + j] = best_index_int8(values, idl * x[xo + ib * 32 + j])
            l += 32
            l_l = u8(l & 0xF)
            l_h = u8(l >> 4)
            if ib % 2 == 0:
                out[o_sl + ib // 2] = np.uint8(l_l)
            else:
                out[o_sl + ib // 2] = np.uint8(u8(np.int64(out[o_sl + ib // 2]) | (l_l << 4)))
            scales_h |= l_h << (2 * (ib % 8))
        store_u16(out, o_sh, scales_h)  # 8 blocks x 2 bits: 16 bits
    else:
        store_fp16(out, o_d, scales[0])
        if ntry > 0:
            id_ = F1 / scales[0] if scales[0] != F0 else F0
            for j in range(sbs):
                L[j] = best_index_int8(values, id_ * x[xo + j])
    for i in range(sbs // 32):
        for j in range(16):
            out[o_qs + 16 * i + j] = np.uint8(u8(L[32 * i + j] | (L[32 * i + 16 + j] << 4)))


@njit(nogil=True, cache=True, error_model="numpy")
def _quant_iq4(x, out, n_per_row, qw, values, sbs, bb, o_qs, o_sh, o_sl):
    """IQ4_NL (sbs 32, 18-byte blocks: d, qs at 2) and IQ4_XS (sbs 256, 136-byte blocks: d, scales_h at 2,
    scales_l at 4, qs at 8): super-blocks of `sbs` values, `bb` bytes, fields at these offsets."""
    use_qw = qw.shape[0] > 0
    scales = np.zeros(sbs // 32, np.float32)
    weight = np.zeros(32, np.float32)
    L = np.zeros(sbs, np.int64)
    nb_row = n_per_row // sbs
    for b in range(x.shape[0] // sbs):
        o = b * bb
        _iq4_superblock(x, b * sbs, out, o, o + o_qs, o + o_sh, o + o_sl, sbs, scales, weight, L, values, qw,
                        (b % nb_row) * sbs, use_qw, _NTRY)


# values, then (sbs, bb, o_qs, o_sh, o_sl); IQ4_NL has no scales_h / scales_l (one block per super-block)
register(Q.IQ4_NL, quantize=imatrix_runner(_quant_iq4, "quantize_iq4_nl", KVALUES_IQ4NL, 32, 18, 2, 0, 0),
         implementation="numba (ggml quantize_iq4_nl port)")
register(Q.IQ4_XS, quantize=imatrix_runner(_quant_iq4, "quantize_iq4_xs", KVALUES_IQ4NL, 256, 136, 8, 2, 4),
         implementation="numba (ggml quantize_iq4_xs port)")
