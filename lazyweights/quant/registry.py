"""The block-quantization registry: one table from (verb, encoding, backend) to a kernel.

A backend module registers its kernels at import (`quant/c_kernels.py`: ggml's C, compiled when lazyweights
is installed); a lookup takes the first backend in `BACKENDS` that has the kernel. Everything else in
lazyweights goes through the four functions here, which validate shapes and dtypes once so the kernels can
trust their inputs.

Conventions (the same as MAX's and gguf-py's byte view of a quantized tensor):
  * packed data is `uint8` of shape `[rows, row_bytes]`, `row_bytes` a whole number of blocks;
  * the float side is `float32` of shape `[rows, row_bytes // block_bytes * block_elements]`;
  * both C-contiguous; the packed side may be a read-only memory map.

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize, dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    >>> packed = quantize(Q.Q8_0, x)
    >>> packed.shape, packed.dtype.name
    ((2, 34), 'uint8')
    >>> bool(np.abs(dequantize(Q.Q8_0, packed) - x).max() < 0.01)
    True
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..core.errors import DTypeError, ImatrixShapeError, ShapeError, UsageError
from ..core.quantization import QuantizationEncoding

# A dequantizer writes float32 [rows, n] from uint8 [rows, row_bytes]; a quantizer the reverse. Both get
# validated, C-contiguous 2-D arrays and return nothing (a quantizer also takes an optional imatrix).
Kernel = Callable[..., None]

#: The kernel backends in order of preference: a lookup takes the first one that has the kernel. One CPU
#: backend today, ggml's C compiled at install time (`quant/c_kernels.py`); the key leaves room for another
#: (a GPU one, a vendor library) without a second table.
BACKENDS: tuple[str, ...] = ("c",)
VERBS = ("dequantize", "quantize")

# (verb, encoding, backend) -> kernel. Filled at import by the backend modules, read by everything else.
_KERNELS: dict[tuple[str, QuantizationEncoding, str], Kernel] = {}


def register(encoding, *, backend: str, dequantize: Kernel | None = None, quantize: Kernel | None = None) -> None:
    """Register `backend`'s kernels for `encoding` (a backend module calls this once per type at import).

    Each kernel is `fn(src, out)` over validated, C-contiguous 2-D arrays (see the module docstring); a
    quantizer that takes an importance matrix is `fn(src, out, imatrix)` and has `takes_imatrix = True`.
    Registering again replaces that backend's kernel; other backends' stay.

    Example:
        >>> from lazyweights.quant.registry import register, kernel
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> fn = kernel("dequantize", Q.Q8_0)
        >>> register(Q.Q8_0, backend="c", dequantize=fn)  # the same kernel again: nothing changes
        >>> kernel("dequantize", Q.Q8_0) is fn
        True
    """
    encoding = QuantizationEncoding.parse(encoding)
    if encoding is None or not encoding.is_gguf:
        raise DTypeError(f"{encoding} is not a block type; it cannot have block kernels")
    if backend not in BACKENDS:
        raise UsageError(f"register {encoding.name}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if dequantize is None and quantize is None:
        raise UsageError(f"register {encoding.name}: give a dequantize or a quantize kernel (got neither)")
    for verb, fn in (("dequantize", dequantize), ("quantize", quantize)):
        if fn is not None:
            _KERNELS[(verb, encoding, backend)] = fn


def _found(verb: str, encoding: QuantizationEncoding) -> tuple[str, Kernel] | None:
    """The preferred backend's (name, kernel) for `verb` of `encoding`, or None."""
    for backend in BACKENDS:
        fn = _KERNELS.get((verb, encoding, backend))
        if fn is not None:
            return backend, fn
    return None


def kernel(verb: str, encoding, backend: str | None = None) -> Kernel:
    """The kernel that `verb` ("dequantize" or "quantize") of `encoding` runs: `backend`'s, or by default
    the first of `BACKENDS` that has one. A `DTypeError` names the supported types when there is none.

    Example:
        >>> from lazyweights.quant.registry import kernel
        >>> kernel("quantize", "Q4_K").__name__
        'quantize_q4_k'
    """
    if verb not in VERBS:
        raise UsageError(f"kernel: verb must be one of {', '.join(VERBS)}, got {verb!r}")
    return _lookup(verb, encoding, backend)[1]


def supported_dequantize() -> set[QuantizationEncoding]:
    """Encodings that `dequantize`/`dequantize_into` accept.

    Example:
        >>> from lazyweights.quant import supported_dequantize
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> Q.Q4_K in supported_dequantize()
        True
    """
    return {enc for verb, enc, _ in _KERNELS if verb == "dequantize"}


def supported_quantize() -> set[QuantizationEncoding]:
    """Encodings that `quantize`/`quantize_into` accept.

    Example:
        >>> from lazyweights.quant import supported_quantize
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> Q.Q8_0 in supported_quantize(), Q.TQ1_0 in supported_quantize(), Q.IQ2_XS in supported_quantize()
        (True, True, False)
    """
    return {enc for verb, enc, _ in _KERNELS if verb == "quantize"}


def implementation(encoding, kind: str = "dequantize") -> str:
    """Which backend serves `kind` ("dequantize" or "quantize") of `encoding`: a name from `BACKENDS`
    ("c"), or "unsupported".

    Example:
        >>> from lazyweights.quant import implementation
        >>> implementation("Q4_K"), implementation("Q4_K", "quantize"), implementation("IQ2_XS", "quantize")
        ('c', 'c', 'unsupported')
    """
    enc = QuantizationEncoding.parse(encoding)
    found = _found(kind, enc) if enc is not None else None
    return found[0] if found else "unsupported"


def _lookup(verb: str, encoding, backend: str | None = None) -> tuple[QuantizationEncoding, Kernel]:
    enc = QuantizationEncoding.parse(encoding)  # DTypeError for unknown names
    if enc is None:
        raise DTypeError(f"cannot {verb}: no quantization encoding given (got None)")
    if backend is None:
        found = _found(verb, enc)
        fn = found[1] if found else None
    else:
        fn = _KERNELS.get((verb, enc, backend))
    if fn is None:
        names = ", ".join(sorted({e.name for v, e, b in _KERNELS if v == verb and backend in (None, b)})) or "none"
        where = f" in backend {backend!r}" if backend else ""
        raise DTypeError(f"cannot {verb} {enc.name}: no {verb} kernel is registered for it{where} "
                         f"(supported: {names})")
    return enc, fn


def _check_2d(arr, what: str, enc: QuantizationEncoding, dtype: np.dtype, verb: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise DTypeError(f"{verb} {enc.name}: {what} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != dtype:
        raise DTypeError(f"{verb} {enc.name}: {what} must be {dtype.name}, got {arr.dtype.name} {arr.shape}")
    if arr.ndim != 2:
        raise ShapeError(f"{verb} {enc.name}: {what} must be 2-D [rows, columns], got shape {arr.shape}")
    return arr


def _check_into(enc: QuantizationEncoding, verb: str, src, src_dtype, src_block: int, src_unit: str,
                out, out_dtype, out_block: int) -> None:
    """Validate a `*_into` call: both 2-D of their dtypes, src rows whole blocks (`src_block` `src_unit`
    each), out [rows, src blocks * out_block], both C-contiguous and out writable."""
    _check_2d(src, "src", enc, np.dtype(src_dtype), verb)
    _check_2d(out, "out", enc, np.dtype(out_dtype), verb)
    rows, n = src.shape
    if n % src_block:
        raise ShapeError(
            f"{verb} {enc.name}: src shape {src.shape} has rows of {n} {src_unit}, not a whole number "
            f"of {src_block}-{src_unit[:-1]} blocks (out shape {out.shape})"
        )
    want = (rows, n // src_block * out_block)
    if out.shape != want:
        raise ShapeError(f"{verb} {enc.name}: src shape {src.shape} needs out shape {want}, got out shape {out.shape}")
    if not src.flags.c_contiguous:
        raise ShapeError(f"{verb} {enc.name}: src shape {src.shape} must be C-contiguous")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ShapeError(f"{verb} {enc.name}: out shape {out.shape} must be C-contiguous and writable")


def dequantize_into(encoding, src: np.ndarray, out: np.ndarray) -> None:
    """Dequantize packed blocks `src` (uint8 [rows, row_bytes]) into `out` (float32 [rows, n]).

    `n` must be `row_bytes // block_bytes * block_elements`. `src` may be a read-only memory map; `out`
    must be writable. Both must be C-contiguous (a slice of whole rows of a C-contiguous array is).
    Values equal gguf-py's `gguf.quants.dequantize` bit for bit. The kernel releases the GIL, so threads
    dequantizing different row ranges run in parallel.

    Example:
        >>> import numpy as np
        >>> from lazyweights.quant import dequantize_into
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> blocks = np.zeros((1, 34), np.uint8); blocks[0, :2] = [0x00, 0x3C]  # d = 1.0 (fp16)
        >>> blocks[0, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
        >>> out = np.empty((1, 32), np.float32)
        >>> dequantize_into(Q.Q8_0, blocks, out)
        >>> out[0, :4]
        array([0., 1., 2., 3.], dtype=float32)
    """
    enc, fn = _lookup("dequantize", encoding)
    _check_into(enc, "dequantize", src, np.uint8, enc.block_bytes, "bytes", out, np.float32, enc.block_elements)
    if src.size == 0:
        return
    fn(src, out)


def dequantize(encoding, src: np.ndarray) -> np.ndarray:
    """Dequantize packed blocks to a new float32 array. `src` is uint8 [rows, row_bytes] (1-D is one row).

    Example:
        >>> import numpy as np
        >>> from lazyweights.quant import dequantize
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> dequantize(Q.Q4_0, np.zeros((3, 18 * 2), np.uint8)).shape
        (3, 64)
    """
    enc, _ = _lookup("dequantize", encoding)
    if isinstance(src, np.ndarray) and src.ndim == 1:
        return dequantize(enc, src.reshape(1, -1)).reshape(-1)
    _check_2d(src, "src", enc, np.dtype(np.uint8), "dequantize")
    if src.shape[1] % enc.block_bytes:
        raise ShapeError(
            f"dequantize {enc.name}: src shape {src.shape} has rows of {src.shape[1]} bytes, not a whole "
            f"number of {enc.block_bytes}-byte blocks"
        )
    src = np.ascontiguousarray(src)
    out = np.empty((src.shape[0], src.shape[1] // enc.block_bytes * enc.block_elements), np.float32)
    dequantize_into(enc, src, out)
    return out


def quantize_into(encoding, src: np.ndarray, out: np.ndarray, *, imatrix=None, name: str | None = None) -> None:
    """Quantize float32 `src` [rows, n] into packed blocks `out` (uint8 [rows, n // block_elements * block_bytes]).

    The bytes equal what ggml's `ggml_quantize_chunk` writes for the type: the kernels are ggml's own C
    (`quant/c_kernels.py`). Both arrays C-contiguous; `out` writable. Releases the GIL.

    `imatrix` is an importance matrix: one float32 weight per column, as llama.cpp's imatrix files store them
    (`lazyweights.formats.imatrix.read_imatrix`); None takes ggml's no-importance-matrix path. ggml's Q8_0,
    TQ1_0 and TQ2_0 quantizers ignore it, as here. A length other than n raises `ImatrixShapeError` naming
    `name` (the tensor).

    Example:
        >>> import numpy as np
        >>> from lazyweights.quant import quantize_into
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> out = np.empty((1, 18), np.uint8)
        >>> quantize_into(Q.Q4_0, np.full((1, 32), -8.0, np.float32), out)
        >>> out[0, :4].tolist()  # d = +1.0 as fp16, then codes 0 (= -8 after the +8 offset)
        [0, 60, 0, 0]
    """
    enc, fn = _lookup("quantize", encoding)
    _check_into(enc, "quantize", src, np.float32, enc.block_elements, "values", out, np.uint8, enc.block_bytes)
    n = src.shape[1]
    weights = None
    if imatrix is not None:
        weights = _check_imatrix(enc, fn, n, imatrix, name)
    if src.size == 0:
        return
    if weights is None:
        fn(src, out)
    else:
        fn(src, out, weights)


def _check_imatrix(enc: QuantizationEncoding, fn: Kernel, n: int, imatrix, name: str | None) -> np.ndarray:
    """The importance matrix as a contiguous float32 vector of length n (one weight per column)."""
    if not getattr(fn, "takes_imatrix", False):
        raise DTypeError(f"quantize {enc.name}: this type has no importance-matrix quantizer (got an imatrix)")
    w = np.ascontiguousarray(np.asarray(imatrix), dtype=np.float32).reshape(-1)
    if w.shape[0] != n:
        who = f"tensor {name!r}" if name else "the tensor"
        raise ImatrixShapeError(
            f"quantize {enc.name}: the importance matrix for {who} has {w.shape[0]} entries "
            f"but its rows have {n} values"
        )
    return w


def quantize(encoding, src: np.ndarray, *, imatrix=None, name: str | None = None) -> np.ndarray:
    """Quantize to a new uint8 array of packed blocks. `src` is any float array [rows, n] (1-D is one row);
    it is converted to float32 first, as gguf-py does. `imatrix` and `name`: see `quantize_into`.

    Example:
        >>> import numpy as np
        >>> from lazyweights.quant import quantize
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> quantize(Q.Q5_0, np.ones((4, 64), np.float32)).shape
        (4, 44)
    """
    enc, _ = _lookup("quantize", encoding)
    if not isinstance(src, np.ndarray):
        raise DTypeError(f"quantize {enc.name}: src must be a numpy array, got {type(src).__name__}")
    if src.ndim == 1:
        return quantize(enc, src.reshape(1, -1), imatrix=imatrix, name=name).reshape(-1)
    if src.dtype.kind != "f" and not src.dtype.name.startswith(("bfloat16", "float")):  # ml_dtypes floats too
        raise DTypeError(f"quantize {enc.name}: src must be floating point, got {src.dtype.name} {src.shape}")
    if src.ndim != 2:
        raise ShapeError(f"quantize {enc.name}: src must be 2-D [rows, n], got shape {src.shape}")
    if src.shape[1] % enc.block_elements:
        raise ShapeError(
            f"quantize {enc.name}: src shape {src.shape} has rows of {src.shape[1]} values, not a whole "
            f"number of {enc.block_elements}-value blocks"
        )
    src = np.ascontiguousarray(src, dtype=np.float32)
    out = np.empty((src.shape[0], src.shape[1] // enc.block_elements * enc.block_bytes), np.uint8)
    quantize_into(enc, src, out, imatrix=imatrix, name=name)
    return out
