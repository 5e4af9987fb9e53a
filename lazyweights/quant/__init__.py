"""Block-quantization kernels: dequantize every GGUF block type, quantize the legacy, K, IQ4 and ternary types.

The kernels are ggml's own C, compiled when lazyweights is installed (`c_kernels`), registered with
`registry` under backend "c" when this package is imported. They release the GIL, so threads working on
different row ranges run in parallel, and they equal gguf-py's dequantizers and ggml's quantizers bit for
bit (tests/kernels/ holds them to both).

    registry   the (verb, encoding, backend) table and the four entry points below, which check arguments
    c_kernels  dequantize: every GGUF block type (kernels/_ccasts.c, ggml's tables in _ggml_dequant_grids.h)
               quantize: Q4_0..Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 (kernels/_cquant.c; imatrix)
    presets    llama-quantize's presets (Q4_K_M, ...): which type each tensor gets

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize, dequantize, supported_quantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    >>> y = dequantize(Q.Q8_0, quantize(Q.Q8_0, x))
    >>> bool(np.abs(x - y).max() < 0.02)
    True
    >>> print(*sorted(e.name for e in supported_quantize()))
    IQ4_NL IQ4_XS Q2_K Q3_K Q4_0 Q4_1 Q4_K Q5_0 Q5_1 Q5_K Q6_K Q8_0 TQ1_0 TQ2_0
"""
from __future__ import annotations

from . import c_kernels  # noqa: F401  (registers the C kernels)
from .registry import (
    dequantize,
    dequantize_into,
    implementation,
    quantize,
    quantize_into,
    register,
    supported_dequantize,
    supported_quantize,
)

__all__ = [
    "dequantize",
    "dequantize_into",
    "implementation",
    "quantize",
    "quantize_into",
    "register",
    "supported_dequantize",
    "supported_quantize",
]
