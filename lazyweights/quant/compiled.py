"""The ahead-of-time compiled dequantizers (the `_ccasts` C extension), registered in front of numba's.

`kernels/_ccasts.c` holds ggml's `dequantize_row_*` for every GGUF block type lazyweights reads, in C, built at
install time with the casts: TQ1_0, TQ2_0, IQ1_S, IQ1_M and Q8_K copied verbatim from ggml-quants.c, the others
restructured there so GCC vectorizes them (the same float operations in ggml's order), all reading ggml's
tables from `kernels/_ggml_dequant_grids.h`. They load in a millisecond where numba needs about 0.5 s to import
and, on a fresh machine, seconds to compile: the first GGUF conversion after an install is then as fast as
the later ones. Same bits as the numba kernels and gguf-py (tests/kernels/test_quant_kernels.py runs every
registered implementation against gguf-py). Without the extension (no compiler at install time, or
LAZYWEIGHTS_CAST_KERNELS=numba), nothing is registered here and numba's kernels serve.

Example:
    >>> from lazyweights.quant import implementation
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> implementation(Q.Q4_K) in ("c", "numba")
    True
"""
from __future__ import annotations

import numpy as np

from ..core.quantization import QuantizationEncoding as Q
from ..kernels.casts import compiled_kernels
from .registry import register, registered_dequantizer

#: encoding -> the kernel the C one displaced (numba's), kept so tests can hold both to gguf-py.
DISPLACED: dict = {}

COMPILED = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
            Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_NL, Q.IQ4_XS,
            Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.Q8_K)

#: ggml's functions read these types' fp16/uint16/float fields through typed pointers, so the C entry points
#: take only a source aligned to that many bytes (every block size is a multiple of it). A GGUF's tensor data
#: is aligned (32 bytes by default), so a misaligned source is rare: a hand-made view, or a file written
#: with general.alignment = 1. It is then copied to an aligned buffer first.
SOURCE_ALIGNMENT = {enc: 2 for enc in (Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S,
                                       Q.IQ4_NL, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0)}
SOURCE_ALIGNMENT[Q.Q8_K] = 4


def _runner(fn, alignment: int = 1):
    def run(src: np.ndarray, out: np.ndarray) -> None:
        src = src.reshape(-1)
        if alignment > 1 and src.ctypes.data % alignment:
            src = src.copy()  # numpy allocates with at least 16-byte alignment
        fn(src, out.reshape(-1))

    run.__name__ = fn.__name__
    return run


def register_compiled() -> None:
    """Register the C dequantizers that the built extension has (none without it)."""
    module = compiled_kernels()
    if module is None:
        return
    for enc in COMPILED:
        fn = getattr(module, f"dq_{enc.name}", None)
        if fn is None:
            continue
        previous = registered_dequantizer(enc)
        if previous is not None and getattr(previous, "__name__", "") != fn.__name__:
            DISPLACED[enc] = previous
        register(enc, dequantize=_runner(fn, SOURCE_ALIGNMENT.get(enc, 1)), implementation="c")
