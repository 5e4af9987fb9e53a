"""Fixtures shared by the quantizer tests of this folder.

- `gguf_py_rows`: which rows gguf-py's legacy quantizers cannot code as ggml does (the tests that use gguf-py
  as a reference for lazyweights' quantizers, which are ggml's code, set those rows aside).
"""
from __future__ import annotations

import numpy as np
import pytest


def gguf_py_differs_from_ggml(t: str, x: np.ndarray, imatrix=None) -> np.ndarray:
    """A bool per row of float32 `x` [rows, n]: where gguf-py's `quantize_blocks` for Q4_0/Q4_1/Q5_0/Q5_1
    writes other bytes than ggml's `quantize_row_*_ref`.
    Both start their running extremes differently: ggml from fixed values, gguf-py from the block's first one.

    * Q4_0, Q5_0: a block of zeros whose first value is -0.0. ggml's signed max starts at +0.0 and stays
      there, so d = +0.0 / -8 = -0.0 (fp16 0x8000); gguf-py takes x[0] = -0.0, so d = +0.0.
    * Q4_1, Q5_1: a block of all +inf. ggml's min starts at FLT_MAX and stays there (d = inf); gguf-py's
      min is +inf (d = inf - inf = NaN).

    gguf-py has no importance-matrix path, so rows quantized with one are never set aside."""
    rows = np.zeros(x.shape[0], bool)
    if imatrix is not None or t not in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        return rows
    blocks = x.reshape(x.shape[0], -1, 32)
    if t in ("Q4_1", "Q5_1"):
        return (blocks == np.inf).all(-1).any(-1)
    return ((blocks == 0).all(-1) & np.signbit(blocks[..., 0])).any(-1)


@pytest.fixture(scope="session")
def gguf_py_rows():
    """`gguf_py_differs_from_ggml(t, x, imatrix=None)`: the rows where gguf-py's legacy bytes are not ggml's."""
    return gguf_py_differs_from_ggml
