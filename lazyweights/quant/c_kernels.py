"""The "c" kernel backend: ggml's dequantizers and quantizers, compiled when lazyweights is installed.

Two C extensions hold them, both built by setup.py (a failed build is an install error, not a fallback):

- `kernels/_ccasts.c`: ggml's `dequantize_row_*` for every GGUF block type lazyweights reads, beside the
  casts. TQ1_0, TQ2_0, IQ1_S, IQ1_M and Q8_K are copied verbatim from ggml-quants.c; the others are
  restructured there so GCC vectorizes them (the same float operations in ggml's order), all reading ggml's
  tables from `kernels/_ggml_dequant_grids.h`. Equal to gguf-py's `gguf.quants.dequantize` bit for bit.
- `kernels/_cquant.c`: ggml's own ggml-quants.c (llama-cpp-python 0.3.36's vendored copy) for every type
  lazyweights quantizes, with and without an importance matrix. The bytes are ggml's, which
  tests/kernels/test_quantize_compiled.py checks against committed `ggml_quantize_chunk` output and, where
  llama_cpp is installed, against libggml itself.

Both load in a millisecond and release the GIL around their loops, under the SIGBUS guard of `_ccasts` (a
memory-mapped source truncated mid-read raises OSError(EFAULT), which the executors report as
`SourceChangedError`). Importing this module registers every kernel with `quant.registry` as backend "c".

Example:
    >>> from lazyweights.quant import implementation
    >>> from lazyweights.quant.c_kernels import DEQUANTIZED, QUANTIZED
    >>> {implementation(e) for e in DEQUANTIZED}, {implementation(e, "quantize") for e in QUANTIZED}
    ({'c'}, {'c'})
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.quantization import QuantizationEncoding as Q
from ..kernels.casts import compiled_kernels, compiled_quantizers
from .registry import register

#: The block types with a C dequantizer (every GGUF block type lazyweights reads).
DEQUANTIZED = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
               Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_NL, Q.IQ4_XS,
               Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.Q8_K)

#: The block types with a C quantizer: every type llama-quantize writes from float weights without a grid
#: search of its own (the IQ1/IQ2/IQ3 types need ggml's grid initialization and an imatrix; not here).
QUANTIZED = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS,
             Q.TQ1_0, Q.TQ2_0)

#: ggml's dequantizers read these types' fp16/uint16/float fields through typed pointers, so the C entry
#: points take only a source aligned to that many bytes (every block size is a multiple of it). A GGUF's tensor
#: data is aligned (32 bytes by default), so a misaligned source is rare: a hand-made view, or a file written
#: with general.alignment = 1. It is then copied to an aligned buffer first.
SOURCE_ALIGNMENT = {enc: 2 for enc in (Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S,
                                       Q.IQ4_NL, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0)}
SOURCE_ALIGNMENT[Q.Q8_K] = 4


def _dequantizer(enc: Q, fn) -> Any:
    alignment = SOURCE_ALIGNMENT.get(enc, 1)

    def run(src: np.ndarray, out: np.ndarray) -> None:
        src = src.reshape(-1)
        if alignment > 1 and src.ctypes.data % alignment:
            src = src.copy()  # numpy allocates with at least 16-byte alignment
        fn(src, out.reshape(-1))

    run.__name__ = run.__qualname__ = f"dequantize_{enc.name.lower()}"
    kernel: Any = run  # the attributes below are the registry's contract, not part of the function type
    kernel.kernel = fn  # the C function
    return kernel


def _quantizer(enc: Q, fn) -> Any:
    def run(src: np.ndarray, out: np.ndarray, imatrix: np.ndarray | None = None) -> None:
        # The registry hands over C-contiguous arrays. The C side also needs them aligned (float32 loops,
        # fp16 fields in the blocks) and raises ValueError otherwise: an unaligned array (a view at an odd
        # byte offset of a buffer) goes through an aligned copy instead.
        if not src.flags.aligned:
            src = src.copy()
        if out.ctypes.data % 2:
            staged = np.empty_like(out)
            fn(src, staged, src.shape[1], imatrix)
            out[...] = staged
            return
        fn(src, out, src.shape[1], imatrix)

    run.__name__ = run.__qualname__ = f"quantize_{enc.name.lower()}"
    kernel: Any = run
    kernel.kernel = fn  # the C function
    kernel.takes_imatrix = True  # Q8_0, TQ1_0 and TQ2_0 ignore it, as ggml's quantizers do
    return kernel


def register_c_kernels() -> None:
    """Register every C dequantizer and quantizer as backend "c" (done at import; calling again is harmless)."""
    dequantizers, quantizers = compiled_kernels(), compiled_quantizers()
    for enc in DEQUANTIZED:
        register(enc, backend="c", dequantize=_dequantizer(enc, getattr(dequantizers, f"dq_{enc.name}")))
    for enc in QUANTIZED:
        register(enc, backend="c", quantize=_quantizer(enc, getattr(quantizers, f"quantize_{enc.name}")))


register_c_kernels()
