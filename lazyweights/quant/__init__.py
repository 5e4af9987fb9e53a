"""Block-quantization kernels: dequantize every GGUF block type, quantize the K-quants, IQ4 and legacy types.

Each block family is one module that registers its kernels with `registry` at import. The kernels are numba
loops over blocks (`nogil`, so threads working on different row ranges run in parallel) that reproduce
gguf-py's `gguf.quants` results (and ggml's quantizers) bit for bit. Every dequantizer and every quantizer
but TQ1_0/TQ2_0's also exists ahead of time, in C extensions (`compiled`: the dequantizers of every block
type; `compiled_quantize`: ggml's own quantizers of Q4_0..Q8_0, Q2_K..Q6_K, IQ4_NL and IQ4_XS): those are
registered when this package is imported, and the numba modules are imported only when a kernel they alone
have is first asked for (or a listing of every kernel), so reading any GGUF, or quantizing to any preset,
needs no numba at all; numba is the fallback for a machine without a compiler.

    compiled  every GGUF block type           dequantize (C; ggml's tables in kernels/_ggml_dequant_grids.h)
    compiled_quantize  Q4_0..Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS   quantize (C, ggml's code; optional imatrix)
    legacy    Q4_0 Q4_1 Q5_0 Q5_1 Q8_0        dequantize + quantize
    legacy_imatrix  the same five             quantize with an importance matrix (ggml's *_impl)
    kquants   Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K   dequantize
    kquants_encode  Q2_K Q3_K Q4_K Q5_K Q6_K  quantize (ggml's bytes; optional importance matrix)
    iquants   IQ4_NL IQ4_XS IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M   dequantize
    iq4_encode      IQ4_NL IQ4_XS             quantize (ggml's bytes; optional importance matrix)
    ternary   TQ1_0 TQ2_0                     dequantize + quantize
    mxfp4     MXFP4                           dequantize

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize, dequantize, supported_quantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    >>> y = dequantize(Q.Q8_0, quantize(Q.Q8_0, x))
    >>> bool(np.abs(x - y).max() < 0.02), sorted(e.name for e in supported_quantize())
    (True, ['IQ4_NL', 'IQ4_XS', 'Q2_K', 'Q3_K', 'Q4_0', 'Q4_1', 'Q4_K', 'Q5_0', 'Q5_1', 'Q5_K', 'Q6_K', 'Q8_0', 'TQ1_0', 'TQ2_0'])
"""
from __future__ import annotations

from . import compiled, compiled_quantize
from .registry import set_kernel_loader
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


def _import_numba_kernels() -> None:
    """Import the numba kernel modules (they register on import), then put the C kernels back in front."""
    from . import iq4_encode, iquants, kquants, kquants_encode, legacy, legacy_imatrix, mxfp4, ternary  # noqa: F401

    compiled.register_compiled()
    compiled_quantize.register_compiled_quantizers()


set_kernel_loader(_import_numba_kernels)
compiled.register_compiled()
compiled_quantize.register_compiled_quantizers()

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
