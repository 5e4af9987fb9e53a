"""The block-quantization registry: one table from `QuantizationEncoding` to its kernels.

Each block family lives in its own module (`legacy`, `kquants`, `iquants`, `ternary`, `mxfp4`) and calls
`register` at import; `lazyweights.quant` imports them all. Everything else in lazyweights goes through
the four functions here, which validate shapes and dtypes once so the kernels can trust their inputs.

Conventions (the same as the seed system's and gguf-py's byte view of a quantized tensor):
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

import threading
from typing import Callable

import numpy as np

from ..core.errors import DTypeError, ImatrixShapeError, ShapeError
from ..core.quantization import QuantizationEncoding

# A dequantizer writes float32 [rows, n] from uint8 [rows, row_bytes]; a quantizer the reverse. Both get
# validated, C-contiguous 2-D arrays and return nothing.
Kernel = Callable[[np.ndarray, np.ndarray], None]

_DEQUANTIZE: dict[QuantizationEncoding, Kernel] = {}
_QUANTIZE: dict[QuantizationEncoding, Kernel] = {}
# How each registered function is implemented ("c", "numba" or a short note, e.g. "numba (ggml ... port)").
_IMPLEMENTATION: dict[tuple[str, QuantizationEncoding], str] = {}


def register(
    encoding: QuantizationEncoding,
    *,
    dequantize: Kernel | None = None,
    quantize: Kernel | None = None,
    implementation: str = "numba",
):
    """Register kernels for `encoding`. Usable as a plain call or as a decorator.

    Plain: `register(Q.Q8_0, dequantize=fn, quantize=fn2)`. As a decorator with neither given, the
    decorated function becomes the dequantizer: `@register(Q.Q8_0)`.
    Each kernel is `fn(src, out) -> None` over validated 2-D arrays (see the module docstring).

    Example:
        >>> import numpy as np
        >>> from lazyweights.quant.registry import register, _DEQUANTIZE
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> old, how = _DEQUANTIZE.get(Q.Q8_0), implementation(Q.Q8_0)
        >>> @register(Q.Q8_0)
        ... def fake(src, out):
        ...     out[...] = 0
        >>> _DEQUANTIZE[Q.Q8_0] is fake
        True
        >>> register(Q.Q8_0, dequantize=old, implementation=how)  # put the real one back
    """
    encoding = QuantizationEncoding.parse(encoding)
    if not encoding.is_gguf:
        raise DTypeError(f"{encoding} is not a block type; it cannot have block kernels")
    if dequantize is None and quantize is None:
        def decorator(fn: Kernel) -> Kernel:
            register(encoding, dequantize=fn, implementation=implementation)
            return fn

        return decorator
    if dequantize is not None:
        _DEQUANTIZE[encoding] = dequantize
        _IMPLEMENTATION[("dequantize", encoding)] = implementation
    if quantize is not None:
        _QUANTIZE[encoding] = quantize
        _IMPLEMENTATION[("quantize", encoding)] = implementation
    return None


# The numba kernel modules are imported on first need, not with the package: a plan whose block types the
# ahead-of-time C kernels cover (`quant/compiled.py`) never imports numba (about 0.5 s) nor compiles
# anything. `quant/__init__.py` installs the loader; it imports every numba module (they register on
# import) and then puts the C kernels back in front.
_LOADER = None
_LOADED = False
_LOADING = False
_LOAD_LOCK = threading.RLock()  # the executor's threads may all miss at once; one loads, the rest wait


def set_kernel_loader(loader) -> None:
    """Install the function that imports the numba kernel modules (called once, on the first miss)."""
    global _LOADER
    _LOADER = loader


def _load_all() -> None:
    global _LOADED, _LOADING
    if _LOADED or _LOADER is None:
        return
    with _LOAD_LOCK:  # other threads wait here until the kernels are registered
        if _LOADED or _LOADING:  # (_LOADING: a kernel module looking a kernel up while it loads)
            return
        _LOADING = True
        try:
            _LOADER()
            _LOADED = True
        finally:
            _LOADING = False


def supported_dequantize() -> set[QuantizationEncoding]:
    """Encodings that `dequantize`/`dequantize_into` accept.

    Example:
        >>> from lazyweights.quant import supported_dequantize
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> Q.Q4_K in supported_dequantize()
        True
    """
    _load_all()
    return set(_DEQUANTIZE)


def supported_quantize() -> set[QuantizationEncoding]:
    """Encodings that `quantize`/`quantize_into` accept.

    Example:
        >>> from lazyweights.quant import supported_quantize
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> Q.Q8_0 in supported_quantize(), Q.Q4_K in supported_quantize(), Q.IQ2_XS in supported_quantize()
        (True, True, False)
    """
    _load_all()
    return set(_QUANTIZE)


def registered_dequantizer(encoding: QuantizationEncoding) -> Kernel | None:
    """The dequantize kernel registered for `encoding` now, or None (no loading, no error)."""
    return _DEQUANTIZE.get(QuantizationEncoding.parse(encoding))


def registered_quantizer(encoding: QuantizationEncoding, *, load: bool = True) -> Kernel | None:
    """The quantize kernel registered for `encoding` (for modules that wrap one, e.g. with an imatrix path).

    With `load=False`, the one registered now or None: no numba module is loaded and nothing is raised (what
    `quant/compiled_quantize.py` needs at import, where loading numba is what it exists to avoid)."""
    if not load:
        return _QUANTIZE.get(QuantizationEncoding.parse(encoding))
    return _lookup(_QUANTIZE, encoding, "quantize")[1]


def implementation(encoding: QuantizationEncoding, kind: str = "dequantize") -> str:
    """How a registered kernel is implemented: "c" (the ahead-of-time C kernels), "numba", or a note such as
    "numba (ggml quantize_iq4_nl port)"."""
    encoding = QuantizationEncoding.parse(encoding)
    if (kind, encoding) not in _IMPLEMENTATION:
        _load_all()
    return _IMPLEMENTATION.get((kind, encoding), "unsupported")


def _lookup(table: dict, encoding, verb: str) -> tuple[QuantizationEncoding, Kernel]:
    enc = QuantizationEncoding.parse(encoding)  # DTypeError for unknown names
    if enc is None:
        raise DTypeError(f"cannot {verb}: no quantization encoding given (got None)")
    fn = table.get(enc)
    if fn is None:
        _load_all()
        fn = table.get(enc)
    if fn is None:
        names = ", ".join(sorted(e.name for e in table)) or "none"
        raise DTypeError(f"cannot {verb} {enc.name}: no {verb} kernel is registered for it (supported: {names})")
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
    enc, fn = _lookup(_DEQUANTIZE, encoding, "dequantize")
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
    enc, _ = _lookup(_DEQUANTIZE, encoding, "dequantize")
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

    The bytes equal what ggml's `ggml_quantize_chunk` writes for the type: the C kernels are ggml's code
    (`compiled_quantize`). Without them, numba's ports serve; their legacy types follow gguf-py's
    `gguf.quants.quantize` (ggml's `quantize_row_*_ref` but for two corner cases: a Q4_0/Q5_0 block of zeros
    led by -0.0, a Q4_1/Q5_1 block of +inf). Both arrays C-contiguous; `out` writable. Releases the GIL.

    `imatrix` (K-quants and IQ4 only) is an importance matrix: one float32 weight per column, as llama.cpp's
    imatrix files store them (`lazyweights.formats.imatrix.read_imatrix`); None takes ggml's
    no-importance-matrix path. A length other than n raises `ImatrixShapeError` naming `name` (the tensor).

    Example:
        >>> import numpy as np
        >>> from lazyweights.quant import quantize_into
        >>> from lazyweights.core.quantization import QuantizationEncoding as Q
        >>> out = np.empty((1, 18), np.uint8)
        >>> quantize_into(Q.Q4_0, np.full((1, 32), -8.0, np.float32), out)
        >>> out[0, :4].tolist()  # d = +1.0 as fp16, then codes 0 (= -8 after the +8 offset)
        [0, 60, 0, 0]
    """
    enc, fn = _lookup(_QUANTIZE, encoding, "quantize")
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
    enc, _ = _lookup(_QUANTIZE, encoding, "quantize")
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
