"""The ahead-of-time compiled quantizers (the `_cquant` C extension), registered in front of numba's.

`kernels/_cquant.c` is ggml's own ggml-quants.c (llama-cpp-python 0.3.36's vendored copy, the library that
wrote the test fixtures) for every type lazyweights quantizes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K,
IQ4_NL and IQ4_XS, with and without an importance matrix, built at install time. It loads in a millisecond
where the numba ports (`legacy`, `legacy_imatrix`, `kquants_encode`, `iq4_encode`) cost about 49 s of
compilation on a fresh machine, and it runs at ggml's speed (benchmarks/RESULTS.md). Quantizing these types
never imports numba (tests/kernels/test_quantize_compiled.py runs that in a fresh process).

Each registered runner keeps the contract of the numba ones it displaces: `run(src, out, imatrix=None)` over
validated 2-D arrays, `takes_imatrix = True` (for Q8_0 too, whose ggml quantizer ignores the matrix), and
`kernel`, the C function. The bytes are ggml's everywhere, also where the numba legacy kernels follow
gguf-py instead (a Q4_1/Q5_1 block of all +inf; see tests/kernels/test_kquant_encode.py). Without the
extension (no compiler at install time, or LAZYWEIGHTS_CAST_KERNELS=numba), nothing is registered here and
numba's kernels serve.

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import implementation, quantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> implementation(Q.Q4_K, "quantize") in ("c", "numba (ggml quantize_row_*_ref / *_impl port)")
    True
    >>> x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 256)
    >>> quantize(Q.Q4_K, x).shape, quantize(Q.Q4_K, x, imatrix=np.ones(256, np.float32)).shape
    ((1, 144), (1, 144))
"""
from __future__ import annotations

import numpy as np

from ..core.quantization import QuantizationEncoding as Q
from ..kernels.casts import compiled_quantizers
from .registry import register, registered_quantizer

#: encoding -> the quantizer the C one displaced (numba's), kept so tests can hold both to ggml's bytes.
DISPLACED: dict = {}

COMPILED = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS)


def _runner(enc: Q, fn):
    name = f"quantize_{enc.name.lower()}"

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

    run.__name__ = run.__qualname__ = name
    run.kernel = fn  # the C function: it releases the GIL around its loops
    run.takes_imatrix = True
    return run


def register_compiled_quantizers() -> None:
    """Register the C quantizers that the built extension has (none without it), keeping what they displace."""
    module = compiled_quantizers()
    if module is None:
        return
    for enc in COMPILED:
        fn = getattr(module, f"quantize_{enc.name}", None)
        if fn is None:
            continue
        previous = registered_quantizer(enc, load=False)
        if previous is not None and getattr(previous, "kernel", None) is not fn:
            DISPLACED[enc] = previous
        register(enc, quantize=_runner(enc, fn), implementation="c")
