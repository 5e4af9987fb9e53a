"""K-quant encoders: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, byte for byte what ggml writes.

Each type has the two paths `ggml_quantize_chunk` takes (and so what llama-quantize writes):

    no importance matrix   quantize_row_q{2..6}_K_ref   (make_qkx2 / make_q3 / make_qx searches,
                                                          scales coded against the largest one)
    importance matrix      quantize_row_q{2..6}_K_impl  (weights qw * sqrt(sigma2 + x^2) or qw itself,
                                                          make_qkx3 / make_qx, scales coded by make_qp /
                                                          make_qx weighted by each sub-block's weight sum)

The arithmetic lives in `_ggml_math` (see its docstring for the float32 rules that make the bytes
identical); this module holds the block loops and the bit packing. The importance matrix is one float32
weight per column (the same for every row), as llama.cpp's imatrix stores it.

Super-block layouts (256 values, little-endian; `d`/`dmin` fp16):

    Q2_K   84 B: scales[16] (low nibble scale, high nibble min), qs[64] (2-bit), d, dmin
    Q3_K  110 B: hmask[32] (bit 2 of each code), qs[64] (low 2 bits), scales[12] (16 x 6-bit), d
    Q4_K  144 B: d, dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128] (4-bit)
    Q5_K  176 B: d, dmin, scales[12], qh[32] (bit 4 of each code), qs[128]
    Q6_K  210 B: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize, dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    >>> packed = quantize(Q.Q4_K, x)
    >>> packed.shape, bool(np.abs(dequantize(Q.Q4_K, packed) - x).max() < 0.3)
    ((2, 144), True)
    >>> weighted = quantize(Q.Q4_K, x, imatrix=np.ones(256, np.float32))
    >>> weighted.shape
    (2, 144)
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..core.quantization import QuantizationEncoding as Q
from ._bits import imatrix_runner
from ._ggml_math import (
    F,
    F0,
    GROUP_MAX_EPS,
    F1,
    i8,
    imax,
    imin,
    make_q3_quants,
    make_qkx_quants,
    make_qp_quants,
    make_qx_quants,
    nearest_int,
    signed_absmax,
    store_fp16,
    u8,
)
from .registry import register

QK_K = 256


# --- shared packing -------------------------------------------------------------------------------------


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _pack_2bit(out, o, L):
    """qs[j/4 + l] = L[j+l] | L[j+l+32] << 2 | L[j+l+64] << 4 | L[j+l+96] << 6, for j = 0, 128."""
    for j in range(0, QK_K, 128):
        for l in range(32):
            out[o + j // 4 + l] = np.uint8(
                u8(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6))
            )


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _pack_scales_k4(out, o, j, ls, lm):
    """Store 6-bit scale `ls` and min `lm` of sub-block j into the 12-byte Q4_K/Q5_K scales (uint8 wraps).
    For j >= 4 the bytes j-4 and j were written at step j-4, so `|=` sees them."""
    if j < 4:
        out[o + j] = np.uint8(u8(ls))
        out[o + j + 4] = np.uint8(u8(lm))
    else:
        out[o + j + 4] = np.uint8(u8((ls & 0xF) | ((lm & 0xF) << 4)))
        out[o + j - 4] = np.uint8(u8(np.int64(out[o + j - 4]) | ((ls >> 4) << 6)))
        out[o + j] = np.uint8(u8(np.int64(out[o + j]) | ((lm >> 4) << 6)))


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _scale_min_k4(out, o, j):
    """get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 bytes at o."""
    if j < 4:
        d = np.int64(out[o + j]) & 63
        m = np.int64(out[o + j + 4]) & 63
    else:
        d = (np.int64(out[o + j + 4]) & 0xF) | ((np.int64(out[o + j - 4]) >> 6) << 4)
        m = (np.int64(out[o + j + 4]) >> 4) | ((np.int64(out[o + j]) >> 6) << 4)
    return d, m


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _requantize_k4(x, xo, out, o_scales, d_all, m_all, L, nmax):
    """The final pass of Q4_K/Q5_K: codes against the stored (fp16, 6-bit) scales and mins."""
    for j in range(QK_K // 32):
        sc, m = _scale_min_k4(out, o_scales, j)
        d = d_all * F(sc)
        if d == F0:
            continue
        dm = m_all * F(m)
        for ii in range(32):
            l = nearest_int((x[xo + 32 * j + ii] + dm) / d)
            L[32 * j + ii] = imax(0, imin(nmax, l))


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _sumsq(x, xo, n):
    s = F0
    for i in range(n):
        s += x[xo + i] * x[xo + i]
    return s


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _impl_weights(x, xo, qw, qo, sigma2, weights, n):
    """The `_impl` sub-block weights qw * sqrt(sigma2 + x^2) into weights[:n]; returns their sum."""
    for l in range(n):
        xv = x[xo + l]
        weights[l] = qw[qo + l] * np.sqrt(sigma2 + xv * xv)
    s = F0
    for l in range(n):
        s += weights[l]
    return s


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _max_from_zero(a, n):
    """The largest of a[:n] and 0 (ggml's running `if (a[j] > max) max = a[j]` from max = 0)."""
    m = F0
    for j in range(n):
        if a[j] > m:
            m = a[j]
    return m


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _requantize_sym16(x, xo, L, j, d, nmax):
    """Codes of the 16 values of sub-block j against its stored scale d (skipped when d is 0):
    nearest_int(x / d) clamped to [-nmax, nmax), stored + nmax."""
    if d == F0:
        return
    for ii in range(16):
        l = nearest_int(x[xo + 16 * j + ii] / d)
        L[16 * j + ii] = imax(-nmax, imin(nmax - 1, l)) + nmax


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _pack_scale_q3(out, os_, j, l):
    """Store 6-bit scale code l (0..63) of sub-block j into the 12-byte Q3_K scales at os_ (zeroed first):
    the low nibble into bytes 0..7, the high 2 bits into bytes 8..11."""
    if j < 8:
        out[os_ + j] = np.uint8(l & 0xF)
    else:
        out[os_ + j - 8] = np.uint8(u8(np.int64(out[os_ + j - 8]) | ((l & 0xF) << 4)))
    l >>= 4
    k = j % 4 + 8
    out[os_ + k] = np.uint8(u8(np.int64(out[os_ + k]) | (l << (2 * (j // 4)))))


# --- Q2_K -----------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True, error_model="numpy")
def _quant_q2_k(x, out, n_per_row, qw):
    use_qw = qw.shape[0] > 0
    L = np.zeros(QK_K, np.int64)
    Laux = np.zeros(16, np.int64)
    weights = np.zeros(16, np.float32)
    mins = np.zeros(16, np.float32)
    scales = np.zeros(16, np.float32)
    sw = np.zeros(16, np.float32)
    Ls = np.zeros(16, np.int64)
    Lm = np.zeros(16, np.int64)
    nb_row = n_per_row // QK_K
    for b in range(x.shape[0] // QK_K):
        xo = b * QK_K
        o = b * 84
        if not use_qw:
            # quantize_row_q2_K_ref
            for j in range(16):
                for l in range(16):
                    weights[l] = abs(x[xo + 16 * j + l])
                scales[j], mins[j] = make_qkx_quants(
                    16, 3, x, xo + 16 * j, weights, 0, L, 16 * j, Laux, F(-0.5), F(0.1), 15, True
                )
            max_scale = _max_from_zero(scales, 16)
            max_min = _max_from_zero(mins, 16)
            if max_scale > F0:
                iscale = F(15.0) / max_scale
                for j in range(16):
                    out[o + j] = np.uint8(u8(nearest_int(iscale * scales[j])))
                d_all = store_fp16(out, o + 80, max_scale / F(15.0))
            else:
                for j in range(16):
                    out[o + j] = 0
                d_all = store_fp16(out, o + 80, F0)
            if max_min > F0:
                iscale = F(15.0) / max_min
                for j in range(16):
                    l = nearest_int(iscale * mins[j])
                    out[o + j] = np.uint8(u8(np.int64(out[o + j]) | (l << 4)))
                m_all = store_fp16(out, o + 82, max_min / F(15.0))
            else:
                m_all = store_fp16(out, o + 82, F0)
        else:
            # quantize_row_q2_K_impl
            qo = (b % nb_row) * QK_K
            sumx2 = _sumsq(x, xo, QK_K)
            sigma2 = sumx2 / F(QK_K)
            for j in range(16):
                sw[j] = _impl_weights(x, xo + 16 * j, qw, qo + 16 * j, sigma2, weights, 16)
                scales[j], mins[j] = make_qkx_quants(
                    16, 3, x, xo + 16 * j, weights, 0, L, 16 * j, Laux, F(-0.9), F(0.05), 36, False
                )
            dm = make_qp_quants(16, 15, scales, Ls, sw)
            mm = make_qp_quants(16, 15, mins, Lm, sw)
            d_all = store_fp16(out, o + 80, dm)
            m_all = store_fp16(out, o + 82, mm)
            for j in range(16):
                out[o + j] = np.uint8(u8(Ls[j] | (Lm[j] << 4)))
        for j in range(16):
            sj = np.int64(out[o + j])
            d = d_all * F(sj & 0xF)
            if d == F0:
                continue
            dmv = m_all * F(sj >> 4)
            for ii in range(16):
                l = nearest_int((x[xo + 16 * j + ii] + dmv) / d)
                L[16 * j + ii] = imax(0, imin(3, l))
        _pack_2bit(out, o + 16, L)


# --- Q3_K -----------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True, error_model="numpy")
def _quant_q3_k(x, out, n_per_row, qw):
    use_qw = qw.shape[0] > 0
    L = np.zeros(QK_K, np.int64)
    scales = np.zeros(16, np.float32)
    weight = np.zeros(16, np.float32)
    sw = np.zeros(16, np.float32)
    Ls = np.zeros(16, np.int64)
    nb_row = n_per_row // QK_K
    for b in range(x.shape[0] // QK_K):
        xo = b * QK_K
        o = b * 110
        os_ = o + 96  # scales[12]
        for k in range(12):
            out[os_ + k] = 0
        if not use_qw:
            # quantize_row_q3_K_ref
            for j in range(16):
                scales[j] = make_q3_quants(16, 4, x, xo + 16 * j, L, 16 * j)
            _, max_scale = signed_absmax(scales, 0, 16)
            if max_scale != F0:
                iscale = F(-32.0) / max_scale
                for j in range(16):
                    l = i8(nearest_int(iscale * scales[j]))  # `int8_t l = nearest_int(...)`
                    _pack_scale_q3(out, os_, j, imax(-32, imin(31, l)) + 32)
                d_all = store_fp16(out, o + 108, F1 / iscale)
            else:
                d_all = store_fp16(out, o + 108, F0)
        else:
            # quantize_row_q3_K_impl
            qo = (b % nb_row) * QK_K
            sumx2 = _sumsq(x, xo, QK_K)
            sigma2 = F(2.0) * sumx2 / F(QK_K)
            for j in range(16):
                sw[j] = _impl_weights(x, xo + 16 * j, qw, qo + 16 * j, sigma2, weight, 16)
                scales[j] = make_qx_quants(16, 4, x, xo + 16 * j, L, 16 * j, weight, 0)
            d_block = make_qx_quants(16, 32, scales, 0, Ls, 0, sw, 0)
            for j in range(16):
                _pack_scale_q3(out, os_, j, Ls[j])
            d_all = store_fp16(out, o + 108, d_block)
        for j in range(16):
            if j < 8:
                sc = np.int64(out[os_ + j]) & 0xF
            else:
                sc = np.int64(out[os_ + j - 8]) >> 4
            sc = i8((sc | (((np.int64(out[os_ + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32)
            _requantize_sym16(x, xo, L, j, d_all * F(sc), 4)
        # hmask: bit k of hmask[m] is bit 2 of code 32*k + m
        for m in range(32):
            out[o + m] = 0
        m = 0
        hm = 1
        for j in range(QK_K):
            if L[j] > 3:
                out[o + m] = np.uint8(np.int64(out[o + m]) | hm)
                L[j] -= 4
            m += 1
            if m == 32:
                m = 0
                hm <<= 1
        _pack_2bit(out, o + 32, L)


# --- Q4_K / Q5_K ----------------------------------------------------------------------------------------


@njit(nogil=True, cache=True, error_model="numpy")
def _quant_q45_k(x, out, n_per_row, qw, nmax, bb):
    """Q4_K (nmax 15, 144-byte blocks) and Q5_K (nmax 31, 176-byte blocks): the same search, different
    code width and packing."""
    use_qw = qw.shape[0] > 0
    L = np.zeros(QK_K, np.int64)
    Laux = np.zeros(32, np.int64)
    weights = np.zeros(32, np.float32)
    mins = np.zeros(8, np.float32)
    scales = np.zeros(8, np.float32)
    sw = np.zeros(8, np.float32)
    Ls = np.zeros(8, np.int64)
    Lm = np.zeros(8, np.int64)
    nb_row = n_per_row // QK_K
    is5 = nmax == 31
    for b in range(x.shape[0] // QK_K):
        xo = b * QK_K
        o = b * bb
        if not use_qw:
            # quantize_row_q{4,5}_K_ref
            for j in range(8):
                sum_x2 = _sumsq(x, xo + 32 * j, 32)
                av_x = np.sqrt(sum_x2 / F(32.0))
                for l in range(32):
                    weights[l] = av_x + abs(x[xo + 32 * j + l])
                if is5:
                    scales[j], mins[j] = make_qkx_quants(
                        32, 31, x, xo + 32 * j, weights, 0, L, 32 * j, Laux, F(-0.5), F(0.1), 15, False
                    )
                else:
                    scales[j], mins[j] = make_qkx_quants(
                        32, 15, x, xo + 32 * j, weights, 0, L, 32 * j, Laux, F(-1.0), F(0.1), 20, False
                    )
            max_scale = _max_from_zero(scales, 8)
            max_min = _max_from_zero(mins, 8)
            inv_scale = F(63.0) / max_scale if max_scale > F0 else F0
            inv_min = F(63.0) / max_min if max_min > F0 else F0
            for j in range(8):
                ls = imin(63, u8(nearest_int(inv_scale * scales[j])))
                lm = imin(63, u8(nearest_int(inv_min * mins[j])))
                _pack_scales_k4(out, o + 4, j, ls, lm)
            d_all = store_fp16(out, o, max_scale / F(63.0))
            m_all = store_fp16(out, o + 2, max_min / F(63.0))
        else:
            # quantize_row_q{4,5}_K_impl
            qo = (b % nb_row) * QK_K
            sum_x2 = _sumsq(x, xo, QK_K)
            sigma2 = F(2.0) * sum_x2 / F(QK_K)
            for j in range(8):
                sw[j] = _impl_weights(x, xo + 32 * j, qw, qo + 32 * j, sigma2, weights, 32)
                scales[j], mins[j] = make_qkx_quants(
                    32, nmax, x, xo + 32 * j, weights, 0, L, 32 * j, Laux, F(-0.9), F(0.05), 36, False
                )
            d_block = make_qp_quants(8, 63, scales, Ls, sw)
            m_block = make_qp_quants(8, 63, mins, Lm, sw)
            for j in range(8):
                ls = Ls[j]
                lm = Lm[j]
                if is5:  # only the Q5_K impl clamps again (Ls is already <= 63 as a uint8)
                    ls = imin(63, ls)
                    lm = imin(63, lm)
                _pack_scales_k4(out, o + 4, j, ls, lm)
            d_all = store_fp16(out, o, d_block)
            m_all = store_fp16(out, o + 2, m_block)
        _requantize_k4(x, xo, out, o + 4, d_all, m_all, L, nmax)
        if is5:
            qh = o + 16
            ql = o + 48
            for j in range(32):
                out[qh + j] = 0
            m1 = 1
            m2 = 2
            for n in range(0, QK_K, 64):
                for j in range(32):
                    l1 = L[n + j]
                    hbits = np.int64(out[qh + j])
                    if l1 > 15:
                        l1 -= 16
                        hbits |= m1
                    l2 = L[n + j + 32]
                    if l2 > 15:
                        l2 -= 16
                        hbits |= m2
                    out[qh + j] = np.uint8(hbits)
                    out[ql + j] = np.uint8(u8(l1 | (l2 << 4)))
                m1 <<= 2
                m2 <<= 2
                ql += 32
        else:
            q = o + 16
            for j in range(0, QK_K, 64):
                for l in range(32):
                    out[q + l] = np.uint8(u8(L[j + l] | (L[j + l + 32] << 4)))
                q += 32


# --- Q6_K -----------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True, error_model="numpy")
def _quant_q6_k(x, out, n_per_row, qw):
    use_qw = qw.shape[0] > 0
    L = np.zeros(QK_K, np.int64)
    scales = np.zeros(16, np.float32)
    w = np.zeros(16, np.float32)
    nb_row = n_per_row // QK_K
    for b in range(x.shape[0] // QK_K):
        xo = b * QK_K
        o = b * 210
        qo = (b % nb_row) * QK_K
        for ib in range(16):
            for l in range(16):
                if use_qw:
                    w[l] = qw[qo + 16 * ib + l]
                else:
                    xv = x[xo + 16 * ib + l]
                    w[l] = xv * xv
            scales[ib] = make_qx_quants(16, 32, x, xo + 16 * ib, L, 16 * ib, w, 0)
        max_abs_scale, max_scale = signed_absmax(scales, 0, 16)
        if max_abs_scale < GROUP_MAX_EPS:
            for k in range(210):
                out[o + k] = 0
            continue
        iscale = F(-128.0) / max_scale
        d_all = store_fp16(out, o + 208, F1 / iscale)
        for ib in range(16):
            out[o + 192 + ib] = np.uint8(u8(imin(127, nearest_int(iscale * scales[ib]))))
        for j in range(16):
            _requantize_sym16(x, xo, L, j, d_all * F(i8(np.int64(out[o + 192 + j]))), 32)
        ql = o
        qh = o + 128
        for j in range(0, QK_K, 128):
            for l in range(32):
                q1 = L[j + l] & 0xF
                q2 = L[j + l + 32] & 0xF
                q3 = L[j + l + 64] & 0xF
                q4 = L[j + l + 96] & 0xF
                out[ql + l] = np.uint8(q1 | (q3 << 4))
                out[ql + l + 32] = np.uint8(q2 | (q4 << 4))
                out[qh + l] = np.uint8(
                    u8((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4)
                       | ((L[j + l + 96] >> 4) << 6))
                )
            ql += 64
            qh += 32


# --- entry points ---------------------------------------------------------------------------------------

# encoding -> (numba kernel, its arguments after `x, out, n_per_row, qw`)
_KERNELS = {
    Q.Q2_K: (_quant_q2_k, ()),
    Q.Q3_K: (_quant_q3_k, ()),
    Q.Q4_K: (_quant_q45_k, (15, 144)),
    Q.Q5_K: (_quant_q45_k, (31, 176)),
    Q.Q6_K: (_quant_q6_k, ()),
}


def _register():
    for enc, (kernel, extra) in _KERNELS.items():
        run = imatrix_runner(kernel, f"quantize_{enc.name.lower()}", *extra)
        register(enc, quantize=run, implementation="numba (ggml quantize_row_*_ref / *_impl port)")


_register()
