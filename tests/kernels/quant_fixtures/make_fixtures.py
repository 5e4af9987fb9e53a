"""Regenerate the quantizers' reference bytes from real ggml (llama-cpp-python's libggml-base).

Run from the repository root after `pip install llama-cpp-python`:

    python tests/kernels/quant_fixtures/make_fixtures.py

It calls `ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row, imatrix)` through ctypes, one
thread, on the inputs below (with and without an importance matrix) and writes

    inputs.npz     the float32 input classes and the importance matrix
    expected.npz   "TYPE/CLASS/none" and "TYPE/CLASS/imatrix" -> the uint8 rows ggml wrote
    SOURCE.txt     which llama-cpp-python / ggml produced them

`tests/kernels/test_kquant_encode.py` compares lazyweights' encoders with these files (no llama_cpp needed) and,
where llama_cpp is importable, with live ggml through the same `ggml_quantize` function.

Example (needs llama_cpp):
    >>> import numpy as np, make_fixtures as mf                   # doctest: +SKIP
    >>> mf.ggml_quantize("Q4_K", np.ones((1, 256), np.float32)).shape  # doctest: +SKIP
    (1, 144)
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# ggml_type ids (ggml.h; the same numbers as gguf's GGMLQuantizationType), bytes and values per block
TYPES = {
    "Q2_K": (10, 84, 256),
    "Q3_K": (11, 110, 256),
    "Q4_K": (12, 144, 256),
    "Q5_K": (13, 176, 256),
    "Q6_K": (14, 210, 256),
    "IQ4_NL": (20, 18, 32),
    "IQ4_XS": (23, 136, 256),
    # the legacy types: presets fall back to them for rows that are not a multiple of 256
    "Q4_0": (2, 18, 32),
    "Q4_1": (3, 20, 32),
    "Q5_0": (6, 22, 32),
    "Q5_1": (7, 24, 32),
    "Q8_0": (8, 34, 32),
    # the ternary types (BitNet b1.58 and TriLM checkpoints)
    "TQ1_0": (34, 54, 256),
    "TQ2_0": (35, 66, 256),
}
ROWS, N_PER_ROW = 8, 512
CLASSES = ("normal", "student_t", "zero", "constant", "small", "tiny", "huge", "specials")


def find_libggml_base() -> Path | None:
    """The libggml-base shared library that llama-cpp-python ships, or None when it is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (lib / name).exists():
            return lib / name
    return None


_LIB = None


def _lib():
    global _LIB
    if _LIB is None:
        path = find_libggml_base()
        if path is None:
            raise RuntimeError("llama_cpp (llama-cpp-python) is not installed: no libggml-base to call")
        lib = ctypes.CDLL(str(path))
        fn = lib.ggml_quantize_chunk
        fn.restype = ctypes.c_size_t
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_int64, ctypes.c_void_p]
        _LIB = lib
    return _LIB


def ggml_quantize(type_name: str, x: np.ndarray, imatrix: np.ndarray | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
    """What llama-quantize writes: `ggml_quantize_chunk` over all rows of float32 `x` [rows, n] (into `out`,
    a C-contiguous uint8 array of the packed shape, when given)."""
    tid, block_bytes, block_values = TYPES[type_name]
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    if out is None:
        out = np.zeros((rows, n // block_values * block_bytes), np.uint8)
    assert out.shape == (rows, n // block_values * block_bytes) and out.flags.c_contiguous and out.dtype == np.uint8
    w = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    size = _lib().ggml_quantize_chunk(tid, x.ctypes.data, out.ctypes.data, 0, rows, n,
                                      None if w is None else w.ctypes.data)
    assert size == out.nbytes, (type_name, size, out.nbytes)
    return out


def make_inputs(seed: int = 16) -> dict[str, np.ndarray]:
    """The input classes (float32 [ROWS, N_PER_ROW]) and an importance matrix ("imatrix", N_PER_ROW)."""
    rng = np.random.default_rng(seed)
    shape = (ROWS, N_PER_ROW)
    normal = rng.standard_normal(shape).astype(np.float32)
    specials = rng.standard_normal(shape).astype(np.float32)
    specials[0, 5] = np.nan
    specials[1, :] = np.inf
    specials[2, 7] = -np.inf
    specials[3] = (rng.standard_normal(N_PER_ROW) * 1e-42).astype(np.float32)  # float32 subnormals
    with np.errstate(over="ignore"):  # a few values overflow to inf: that is part of the class
        specials[4] = (rng.standard_normal(N_PER_ROW) * 3e38).astype(np.float32)  # near float32 max
    specials[5, :256] = 0.0
    specials[6] = np.round(specials[6] * 4) / 4                                 # exact rounding ties
    specials[7, ::2] = -0.0
    out = {
        "normal": normal,
        "student_t": rng.standard_t(3, shape).astype(np.float32),
        "zero": np.zeros(shape, np.float32),
        "constant": (np.full(shape, 0.8125, np.float32)
                     * np.where(np.arange(ROWS) % 2, -1, 1)[:, None].astype(np.float32)),
        # 1e-7: scales land in fp16's subnormal range; 1e-30: below GROUP_MAX_EPS, coded as zero blocks
        "small": (rng.standard_normal(shape) * 1e-7).astype(np.float32),
        "tiny": (rng.standard_normal(shape) * 1e-30).astype(np.float32),
        "huge": (rng.standard_normal(shape) * 1e30).astype(np.float32),
        "specials": specials,
    }
    imatrix = rng.gamma(0.7, 1.5, N_PER_ROW).astype(np.float32)
    imatrix[rng.random(N_PER_ROW) < 0.1] = 0.0  # columns no activation reached, as real imatrices have
    out["imatrix"] = imatrix
    return out


def make_expected(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    expected = {}
    with np.errstate(all="ignore"):
        for t in TYPES:
            for c in CLASSES:
                expected[f"{t}/{c}/none"] = ggml_quantize(t, inputs[c])
                expected[f"{t}/{c}/imatrix"] = ggml_quantize(t, inputs[c], inputs["imatrix"])
    return expected


def main() -> int:
    inputs = make_inputs()
    expected = make_expected(inputs)
    np.savez_compressed(HERE / "inputs.npz", **inputs)
    np.savez_compressed(HERE / "expected.npz", **expected)
    import llama_cpp  # noqa: PLC0415  (only for its version string)

    (HERE / "SOURCE.txt").write_text(
        f"llama-cpp-python {llama_cpp.__version__}, {find_libggml_base().name}, ggml_quantize_chunk, one thread\n"
        f"generated by tests/kernels/quant_fixtures/make_fixtures.py on {sys.platform}/{os.uname().machine}\n"
    )
    total = sum((HERE / f).stat().st_size for f in ("inputs.npz", "expected.npz"))
    print(f"wrote {len(expected)} expected arrays, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
