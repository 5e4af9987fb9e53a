"""MXFP4 (OCP microscaling FP4, as ggml stores it): 32 fp4 (e2m1) values sharing one e8m0 exponent.

Layout, 17 bytes: e:u8, qs[16]. Value a*16 + l is nibble a of qs[l] (low nibble first), decoded through
ggml's `kvalues_mxfp4` table, which holds the e2m1 values DOUBLED so they are integers
(0, 1, 2, 3, 4, 6, 8, 12 and their negatives); the scale is therefore half the e8m0 value
(`ggml_e8m0_to_fp32_half`): 2^(e-128) as a float32 built from its bits, with e = 0 and 1 as subnormals.

    x[a*16 + l] = half_scale(e) * kvalues[(qs[l] >> 4a) & 15]

Only dequantization is provided. gguf-py's quantizer picks the exponent with `floor(np.log2(absmax))`
in float32, whose rounding near powers of two is numpy's SIMD log2 and not reproducible bit for bit here.

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> block = np.zeros((1, 17), np.uint8)
    >>> block[0, 0] = 127          # e8m0 2^(127-127) = 1, halved: 0.5
    >>> block[0, 1] = 0x72         # value 0 = code 2 -> 1.0, value 16 = code 7 -> 6.0
    >>> dequantize(Q.MXFP4, block)[0, [0, 16]]
    array([1., 6.], dtype=float32)
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..core.quantization import QuantizationEncoding as Q
from ._bits import as_kernel_src, bits_to_f32
from .registry import register

# ggml's kvalues_mxfp4 (e2m1 doubled), as float32 so the kernel multiplies without a conversion
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)
KVALUES.flags.writeable = False


@njit(inline="always", nogil=True, cache=True)
def e8m0_to_fp32_half(e):
    """ggml_e8m0_to_fp32_half: 2^(e - 128) from its float32 bits (subnormal for e < 2)."""
    e = np.uint32(e)
    if e < np.uint32(2):
        return bits_to_f32(np.uint32(0x00200000) << e)
    return bits_to_f32((e - np.uint32(1)) << np.uint32(23))


@njit(nogil=True, cache=True)
def _dequant_mxfp4(src, out, kvalues):
    for b in range(src.shape[0] // 17):
        s = b * 17
        o = b * 32
        d = e8m0_to_fp32_half(src[s])
        for l in range(16):
            q = np.int32(src[s + 1 + l])
            out[o + l] = d * kvalues[q & 15]
            out[o + 16 + l] = d * kvalues[q >> 4]


def _run(src: np.ndarray, out: np.ndarray) -> None:
    _dequant_mxfp4(as_kernel_src(src), out.reshape(-1), KVALUES)


_run.kernel = _dequant_mxfp4

register(Q.MXFP4, dequantize=_run)
