"""Importance-matrix paths of the legacy types: Q4_0, Q4_1, Q5_0, Q5_1 (and Q8_0, which ignores it).

With an importance matrix `ggml_quantize_chunk` does not call `quantize_row_q4_0_ref` (what `legacy`
reproduces) but `quantize_row_q{4,5}_{0,1}_impl`: weights `qw * sqrt(sigma2 + x^2)` with sigma2 the mean
square of the whole ROW, and the scale searched by `make_qx_quants` (the `_0` types) or `make_qkx3_quants`
(the `_1` types, which also fit the min). Q8_0's `quantize_q8_0` ignores the matrix. These types appear in
K-quant presets whenever a row is not a multiple of 256 (Gemma 3 270M's 640-wide rows: Q4_K -> Q5_0), so
an imatrix-quantized preset needs them to write llama-quantize's bytes.

This module re-registers the five types with a runner that takes the imatrix path when one is given and
`legacy`'s kernels otherwise. (Where the C extension is built, `compiled_quantize` registers ggml's own C in
front of these; they stay the fallback and the second implementation the tests hold to ggml's bytes.)

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize
    >>> x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    >>> quantize("Q5_0", x, imatrix=np.ones(64, np.float32)).shape
    (2, 44)
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..core.quantization import QuantizationEncoding as Q
from ._bits import as_kernel_src
from ._ggml_math import F, F0, make_qkx_quants, make_qx_quants, store_fp16, u8
from .legacy import QUANTIZERS
from .registry import register


@njit(nogil=True, cache=True, error_model="numpy")
def _quant_legacy_impl(x, out, n_per_row, qw, nmax, with_min, five_bit, bb):
    """quantize_row_{q4_0,q4_1,q5_0,q5_1}_impl over every row of x (32-value blocks of `bb` bytes)."""
    weight = np.zeros(32, np.float32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    nb = n_per_row // 32
    for r in range(x.shape[0] // n_per_row):
        xr = r * n_per_row
        sum_x2 = F0
        for j in range(n_per_row):
            sum_x2 += x[xr + j] * x[xr + j]
        sigma2 = sum_x2 / F(n_per_row)
        for ib in range(nb):
            xb = xr + 32 * ib
            o = (r * nb + ib) * bb
            for j in range(32):
                xv = x[xb + j]
                weight[j] = qw[32 * ib + j] * np.sqrt(sigma2 + xv * xv)
            if with_min:
                d, the_min = make_qkx_quants(32, nmax, x, xb, weight, 0, L, 0, Laux, F(-0.9), F(0.05), 36, False)
                store_fp16(out, o, d)
                store_fp16(out, o + 2, -the_min)
                q = o + 4
            else:
                d = make_qx_quants(32, nmax, x, xb, L, 0, weight, 0)
                store_fp16(out, o, d)
                q = o + 2
            if five_bit:
                qh = 0
                for j in range(16):
                    qh |= ((L[j] & 0x10) >> 4) << j
                    qh |= ((L[j + 16] & 0x10) >> 4) << (j + 16)
                for k in range(4):
                    out[q + k] = np.uint8((qh >> (8 * k)) & 0xFF)
                q += 4
            for j in range(16):
                out[q + j] = np.uint8(u8((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4)))


# encoding -> (nmax, with_min, five_bit); Q8_0 has no entry: quantize_q8_0 ignores the imatrix
_PARAMS = {Q.Q4_0: (8, False, False), Q.Q4_1: (15, True, False), Q.Q5_0: (16, False, True), Q.Q5_1: (31, True, True)}


def _runner(enc, plain):
    params = _PARAMS.get(enc)

    def run(src: np.ndarray, out: np.ndarray, imatrix: np.ndarray | None = None) -> None:
        if imatrix is None or params is None:
            plain(src, out)
        else:
            _quant_legacy_impl(as_kernel_src(src), out.reshape(-1), src.shape[1], as_kernel_src(imatrix), *params,
                               enc.block_bytes)

    run.__name__ = getattr(plain, "__name__", f"quantize_{enc.name.lower()}")
    run.kernel = plain.kernel  # the no-imatrix numba kernel (both are nogil)
    run.imatrix_kernel = _quant_legacy_impl
    run.takes_imatrix = True
    return run


for _enc in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
    register(_enc, quantize=_runner(_enc, QUANTIZERS[_enc]), implementation="numba")
