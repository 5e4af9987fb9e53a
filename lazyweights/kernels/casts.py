"""Dtype casts at memory speed, bit-identical to numpy/ml_dtypes `astype`.

Why this module exists: a checkpoint conversion is mostly casts (bf16 -> f16 for serving, norms to f32), and
the stock casts are far below memory bandwidth. On the 2-core development machine numpy's own
float32 -> float16 runs at about 1.2 GB/s and ml_dtypes' bfloat16 -> float16 at about 2.8 GB/s (bytes read +
written), while a plain copy runs at about 25 GB/s. Both stock casts convert one element at a time through
scalar C code; ml_dtypes also goes through float32 and, for strided input, through numpy's small cast buffers.
The kernels here run the six hot pairs (bf16/f16/f32 among themselves) at 23-32 GB/s on one thread on that
machine, against a 31-35 GB/s copy measured in the same runs (``benchmarks/bench_casts.py``), so a second
thread adds little for large arrays: the memory is already saturated. (That was with AVX-512. On an
AVX2-only host the portable loops are compute-bound, bf16 -> f16 at about 9 GB/s; there it converts with
the F16C instruction instead, about 14 GB/s under load against a 26 GB/s copy: see ``_ccasts.c``.)

The kernels are branch-free loops over contiguous *unsigned integer* views (bf16 and fp8 bits need no
dtype support), which the compiler vectorizes, and they release the GIL, so the threaded executor runs
several at once. They are ``_ccasts.c``, a C extension compiled when lazyweights is installed (with per-CPU
clones for AVX-512 and AVX2; setup.py fails the install when it cannot build them): it loads in about a
millisecond, so every process and every plan, however small, uses it. Its reads are guarded: a source page
lost under a memory map (a file truncated mid-read) raises OSError(EFAULT) instead of SIGBUS, which the
executors report as SourceChangedError.

``LAZYWEIGHTS_CAST_KERNELS=numpy`` turns the compiled casts off (numpy's ``copyto`` does every cast; for
chasing a suspected kernel bug); ``auto`` and ``c`` (the default) use them. `kernel_backend()` says which
one casts are using. The block-quantization kernels are C in every case (``quant/c_kernels.py``).
Strided sources never produce a full-size temporary: blocks of about 512 KB are copied into a scratch
buffer and converted from there, except that rows which are contiguous and nearly adjacent (a column slice
dropping a few columns, broadcast rows) are read in place.

`gather_cast_into(src, rows, out)` casts rows picked by an index array (a RoPE row permutation, any
`take` along axis 0) in the same single pass: the C kernels take the row index themselves and read each
row where it lies, so no gathered copy is made; numpy's path gathers first, with the same bits.

Bit-exactness is the contract, not an approximation: every result, including NaN bit patterns, negative
zero, subnormals and overflow, equals ``src.astype(dst)`` as numpy and ml_dtypes compute it. The reference
behaviours the kernels reproduce (checked exhaustively over every 16-bit and 8-bit source pattern in
``tests/kernels/test_casts.py``):

- rounding is round-to-nearest-even everywhere, subnormals are kept (never flushed);
- numpy float32 <-> float16 keeps a NaN's payload and sign and never sets the quiet bit (its software
  conversion; a NaN whose payload would truncate to zero becomes 0x7c01). A numpy built with F16C in its
  baseline converts in hardware, which quiets NaNs instead; the mode is probed from numpy at first use;
- ml_dtypes' conversions return a canonical quiet NaN that keeps only the sign (bf16 0x7fc0, f16 0x7e00,
  f32 0x7fc00000, float8_e4m3fn 0x7f, float8_e5m2 0x7e), dropping any payload, with one exception:
  bfloat16 -> float32 is a plain 16-bit shift and keeps payloads, signalling NaNs included;
- float8_e4m3fn has no infinity: magnitudes above 464 (464 itself is a tie and rounds to even, 448) and
  +-inf become NaN (0x7f, sign kept); float8_e5m2 overflows to +-inf from 61440 up. Neither saturates.

Because the reference is whatever numpy/ml_dtypes are installed, each compiled path checks itself against
``astype`` once per process, on first use (all 65536 patterns for 16-bit sources, about 25 000 edge patterns
for float32 sources); a path that disagrees is switched off with a RuntimeWarning and numpy is used instead.
One-byte sources (fp8, fp4) use a 256-entry table computed by ml_dtypes itself, exact by construction.

Pairs without a kernel, and every pair when the compiled casts are switched off
(``LAZYWEIGHTS_CAST_KERNELS=numpy``, or `USE_COMPILED` set to False), go through
``np.copyto(out, src, casting="unsafe")``, which uses the same cast loops as ``astype`` and buffers strided
input internally, so it is exact and never allocates a full-size temporary either; it is simply slower.

Example:
    >>> import numpy as np, ml_dtypes
    >>> from lazyweights.kernels.casts import cast, has_fast_path
    >>> x = np.array([1.0, -2.5, 500.0, np.inf], dtype=np.float32)
    >>> cast(x, ml_dtypes.float8_e5m2).astype(np.float32)  # 500 rounds to 512; e5m2 has inf
    array([  1. ,  -2.5, 512. ,   inf], dtype=float32)
    >>> [hex(b) for b in cast(x, ml_dtypes.float8_e4m3fn).view(np.uint8)]  # e4m3fn: past 464 is NaN
    ['0x38', '0xc2', '0x7f', '0x7f']
    >>> has_fast_path(np.float32, np.int8)
    False
"""
from __future__ import annotations

import importlib
import os
import threading
import warnings
from typing import Any, Iterator, NamedTuple

import ml_dtypes
import numpy as np

from ..core.errors import ArgumentTypeError, DependencyError, DTypeError, ShapeError, UsageError

__all__ = ["cast", "cast_into", "gather_cast_into", "compiled_kernels", "compiled_quantizers", "has_fast_path",
           "warm_up", "kernel_backend", "USE_COMPILED", "HAVE_C"]


def _backend_choice() -> str:
    choice = os.environ.get("LAZYWEIGHTS_CAST_KERNELS", "").strip().lower() or "auto"
    if choice not in ("auto", "c", "numpy"):
        warnings.warn(f"lazyweights: LAZYWEIGHTS_CAST_KERNELS={choice!r} is not one of auto, c, numpy; "
                      "using auto (the C casts)", RuntimeWarning, stacklevel=2)
        choice = "auto"
    return choice


_CHOICE = _backend_choice()
#: Whether casts may use the compiled kernels (``LAZYWEIGHTS_CAST_KERNELS`` is not ``numpy``).
HAVE_C = _CHOICE in ("auto", "c")

_MISSING_BUILD = ("lazyweights.kernels.{name} is not built ({why}): lazyweights' kernels are C compiled at "
                  "install time; reinstall with a C compiler present (`pip install --force-reinstall "
                  "--no-binary lazyweights lazyweights`, or `pip install -e .` in a checkout)")


def _extension(name: str):
    """Import one of the compiled extensions of this folder; a `DependencyError` says how to rebuild it when
    it is missing (an install whose build was skipped or removed)."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError as e:
        raise DependencyError(_MISSING_BUILD.format(name=name, why=e)) from e


def compiled_kernels():
    """The compiled extension with the casts and every GGUF dequantizer (`_ccasts`).

    Example:
        >>> from lazyweights.kernels.casts import compiled_kernels
        >>> hasattr(compiled_kernels(), "dq_Q4_K")
        True
    """
    return _extension("_ccasts")


def compiled_quantizers():
    """The compiled extension with ggml's GGUF quantizers (`_cquant`).

    Example:
        >>> from lazyweights.kernels.casts import compiled_quantizers
        >>> hasattr(compiled_quantizers(), "quantize_TQ1_0")
        True
    """
    return _extension("_cquant")


def compiled_lora():
    """The compiled extension with the LoRA update in one fixed order of float32 operations (`_clora`).

    Example:
        >>> import numpy as np
        >>> from lazyweights.kernels.casts import compiled_lora
        >>> acc = np.ones((2, 3), np.float32)
        >>> compiled_lora().lora_accumulate(acc, np.full((2, 1), 2, np.float32), np.ones((1, 3), np.float32),
        ...                                 2, 3, 1, 0.5)
        >>> acc
        array([[2., 2., 2.],
               [2., 2., 2.]], dtype=float32)
    """
    return _extension("_clora")

#: Whether cast_into uses the compiled kernels. Tests (and users chasing a suspected kernel bug) may set it
#: to False at runtime to force the numpy path.
USE_COMPILED: bool = HAVE_C

# Bytes of a strided source copied into a contiguous buffer at a time: large enough that the per-block
# Python overhead (a few microseconds) is small, about L2-sized so the kernel reads the copy from cache.
_CHUNK_BYTES = 512 * 1024

_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_F64 = np.dtype(np.float64)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_E5M2 = np.dtype(ml_dtypes.float8_e5m2)
# One-byte float formats: any cast from them is a 256-entry table lookup.
_BYTE_FLOATS = tuple(
    np.dtype(getattr(ml_dtypes, name))
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
                 "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float4_e2m1fn", "float6_e2m3fn",
                 "float6_e3m2fn")
    if hasattr(ml_dtypes, name)
)
_UINT: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                              8: np.dtype(np.uint64)}


# --------------------------------------------------------------------------------------------------------
# The pair table.

class _Kernel(NamedTuple):
    fn: Any
    src_view: np.dtype  # unsigned integer views the kernel sees
    dst_view: np.dtype
    args: tuple
    # "f16bits": verify on all 65536 patterns; "f32bits": on the edge set; "": exact by design; "lut": a lookup
    # table kernel whose table `_resolve` makes on first use (then it is exact by design)
    check: str

    def run(self, src: np.ndarray, out_flat: np.ndarray, rows: int | np.ndarray = 1, cols: int = -1,
            first: int = 0, stride: int = 0) -> None:
        """Convert `rows` rows of `cols` elements of the 1-D contiguous `src`, row r starting at element
        ``first + r * stride``, into `out_flat`. By default all of `src` is one row. `rows` may be an
        int64 row index instead (1-D: output row i is source row rows[i]; (2, n): output row rows[1, k] is
        source row rows[0, k]; see `_ccasts.c`)."""
        s = src.view(self.src_view)
        if cols < 0:
            cols = s.size
        rows = rows if isinstance(rows, np.ndarray) else int(rows)
        self.fn(s, out_flat.view(self.dst_view), rows, int(cols), int(first), int(stride), *self.args)


_lock = threading.Lock()
_table: dict[tuple[np.dtype, np.dtype], _Kernel] | None = None
_disabled: dict[tuple[np.dtype, np.dtype], str] = {}  # pair -> why its kernel was switched off
_verified: set[tuple[np.dtype, np.dtype]] = set()


def numpy_half_modes() -> tuple[tuple[int, int, int], bool]:
    """How this numpy build treats NaNs in float32 <-> float16: software (payload kept, never quieted,
    the default) or hardware F16C (quieted). Returns (_narrow's NaN arguments, whether widening quiets)."""
    with np.errstate(all="ignore"):
        narrowed = int(np.array([0x7F800001], np.uint32).view(np.float32).astype(np.float16).view(np.uint16)[0])
        widened = int(np.array([0x7C01], np.uint16).view(np.float16).astype(np.float32).view(np.uint32)[0])
    narrow_nan = (0x7E00, 0x3FF, 0) if narrowed == 0x7E00 else (0x7C00, 0x3FF, 1)
    return narrow_nan, widened == 0x7FC02000


def _build_table(K) -> dict[tuple[np.dtype, np.dtype], _Kernel]:
    u8, u16, u32 = _UINT[1], _UINT[2], _UINT[4]
    f16_nan, f16_quiet = numpy_half_modes()
    table = {
        (_BF16, _F32): _Kernel(K.k_bf16_to_f32, u16, u32, (), "f16bits"),
        (_F16, _F32): _Kernel(K.k_f16_to_f32, u16, u32, (f16_quiet,), "f16bits"),
        (_F32, _BF16): _Kernel(K.k_f32_to_bf16, u32, u16, (), "f32bits"),
        (_F16, _BF16): _Kernel(K.k_f16_to_bf16, u16, u16, (), "f16bits"),
        (_F32, _F16): _Kernel(K.k_f32_to_f16, u32, u16, f16_nan, "f32bits"),
        (_BF16, _F16): _Kernel(K.k_bf16_to_f16, u16, u16, (), "f16bits"),
        (_F32, _E4M3): _Kernel(K.k_f32_to_e4m3, u32, u8, (), "f32bits"),
        (_F32, _E5M2): _Kernel(K.k_f32_to_e5m2, u32, u8, (), "f32bits"),
        (_BF16, _E4M3): _Kernel(K.k_bf16_to_e4m3, u16, u8, (), "f16bits"),
        (_BF16, _E5M2): _Kernel(K.k_bf16_to_e5m2, u16, u8, (), "f16bits"),
        (_F16, _E4M3): _Kernel(K.k_f16_to_e4m3, u16, u8, (), "f16bits"),
        (_F16, _E5M2): _Kernel(K.k_f16_to_e5m2, u16, u8, (), "f16bits"),
    }
    for src in _BYTE_FLOATS:
        for dst in (_F32, _F16, _BF16, _F64) + _BYTE_FLOATS:
            if dst != src and np.can_cast(src, dst, casting="unsafe"):  # e8m0 <-> fp8 has no cast
                table[(src, dst)] = _Kernel(K.k_lut, u8, _UINT[dst.itemsize], (), "lut")  # table made lazily
    return table


def _f32_edge_patterns() -> np.ndarray:
    """float32 bit patterns that exercise every rounding, overflow, subnormal and NaN rule of the kernels:
    every exponent and sign, with mantissas at and around the round-to-nearest-even ties of each target."""
    mants = {0, 1, 2, 3, 0x7FFFFF, 0x7FFFFE, 0x400000, 0x3FFFFF, 0x400001, 0x200000, 0x2AAAAA, 0x555555}
    for shift in (13, 16, 20, 21):  # float16, bfloat16, float8_e4m3fn, float8_e5m2
        half = 1 << (shift - 1)
        for base in (0, 1 << shift, 0x7FFFFF & ~((1 << shift) - 1), 0x155555 & ~((1 << shift) - 1)):
            for m in (base + half - 1, base + half, base + half + 1, base + (1 << shift) - 1, base | 1):
                mants.add(m & 0x7FFFFF)
    mants_arr = np.array(sorted(mants), np.uint32)
    exps = np.arange(256, dtype=np.uint32) << np.uint32(23)
    pos = (exps[:, None] | mants_arr[None, :]).reshape(-1)
    return np.concatenate([pos, pos | np.uint32(0x80000000)])


def _check_patterns(kind: str, src_dtype: np.dtype) -> np.ndarray:
    if kind == "f16bits":
        return np.arange(1 << 16, dtype=np.uint16).view(src_dtype)
    return _f32_edge_patterns().view(src_dtype)


def _verify(key, kernel: _Kernel) -> _Kernel | None:
    """Run the kernel once against astype; switch it off (with a warning) if they differ anywhere."""
    src_dtype, dst_dtype = key
    if not kernel.check:
        return kernel
    src = _check_patterns(kernel.check, src_dtype)
    with np.errstate(all="ignore"):
        expected = src.astype(dst_dtype).view(kernel.dst_view)
    got = np.empty(src.shape, dst_dtype)
    kernel.run(src, got)
    bad = np.flatnonzero(got.view(kernel.dst_view) != expected)
    if bad.size == 0:
        return kernel
    i = int(bad[0])
    width = 2 * dst_dtype.itemsize
    why = (
        f"compiled {src_dtype}->{dst_dtype} cast disagrees with numpy/ml_dtypes astype on {bad.size} of "
        f"{src.size} check patterns (first: {int(src.view(kernel.src_view)[i]):#x} -> "
        f"{int(got.view(kernel.dst_view)[i]):#0{width + 2}x}, astype gives {int(expected[i]):#0{width + 2}x}); "
        "using numpy for this pair"
    )
    _disabled[key] = why
    warnings.warn(f"lazyweights: {why}", RuntimeWarning, stacklevel=4)
    return None


# The six pairs a checkpoint conversion spends its time in: loaded and checked by the warm-up thread.
_HOT = ((_BF16, _F16), (_BF16, _F32), (_F32, _F16), (_F16, _F32), (_F32, _BF16), (_F16, _BF16))

_K = None  # the kernel module (_ccasts), once loaded
_ready = threading.Event()  # set when loading finished (successfully or not)
_load_once = threading.Lock()  # serializes the load
_load_error: BaseException | None = None


def _load_kernels() -> None:
    """Import the C kernels, build the pair table, load and check the hot pairs. Runs once per process."""
    global _K, _table, _load_error
    try:
        K = compiled_kernels()
        table = _build_table(K)
        with _lock:
            _K, _table = K, table
        for src, dst in _HOT:
            _resolve((src, dst))
    except Exception as e:  # a check failed to run: numpy does every cast, correctly
        _load_error = e
        with _lock:
            if _table is None:
                _table = {}
    finally:
        _ready.set()


def kernel_backend() -> str:
    """Which kernels casts use right now: "c" (ahead-of-time compiled) or "numpy" (switched off by
    ``LAZYWEIGHTS_CAST_KERNELS=numpy`` or `USE_COMPILED`, or the kernels failed to load).

    Example:
        >>> from lazyweights.kernels.casts import kernel_backend
        >>> kernel_backend() in ("c", "numpy")
        True
    """
    return "c" if warm_up() else "numpy"


def warm_up() -> bool:
    """Load the compiled casts (once per process: about a millisecond, plus checking the hot pairs against
    astype). Returns whether they are in use.

    Example:
        >>> from lazyweights.kernels.casts import warm_up, USE_COMPILED, HAVE_C
        >>> warm_up() == (USE_COMPILED and HAVE_C)
        True
    """
    if not (USE_COMPILED and HAVE_C):
        return False
    if not _ready.is_set():
        with _load_once:
            if not _ready.is_set():
                _load_kernels()
    return _load_error is None


def _kernel_for(src_dtype: np.dtype, dst_dtype: np.dtype) -> _Kernel | None:
    """The verified kernel for a pair, or None (numpy does the cast)."""
    if not _ready.is_set():
        warm_up()
    return _resolve((src_dtype, dst_dtype))


def _resolve(key) -> _Kernel | None:
    """Look a pair up in the table; on its first use check it against astype (thread-safe)."""
    table = _table
    kernel = table.get(key) if table is not None else None
    if table is None or kernel is None or key in _disabled:
        return None
    if key in _verified:
        return kernel
    with _lock:
        if key in _disabled:
            return None
        if key in _verified:
            return table[key]
        if kernel.check == "lut":
            src_dtype, dst_dtype = key
            codes = np.arange(256, dtype=np.uint8).view(src_dtype)
            with np.errstate(all="ignore"):
                lut = np.ascontiguousarray(codes.astype(dst_dtype).view(kernel.dst_view))
            kernel = kernel._replace(args=(lut,), check="")
            table[key] = kernel
        if _verify(key, kernel) is None:
            return None
        _verified.add(key)
        return kernel


# --------------------------------------------------------------------------------------------------------
# Public API.

def _as_dtype(dtype) -> np.dtype:
    if hasattr(dtype, "to_numpy"):  # lazyweights.DType, without importing it here
        dtype = dtype.to_numpy()
    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(f"{dtype!r} is not a dtype") from e


def has_fast_path(src_dtype, dst_dtype) -> bool:
    """Whether `cast_into` converts `src_dtype` to `dst_dtype` at near memory speed without the GIL.

    True for a same-dtype copy and for every pair with a compiled kernel (all directions among bfloat16,
    float16 and float32; float32/bfloat16/float16 to float8_e4m3fn and float8_e5m2; any one-byte float format
    to float32/float16/bfloat16/float64 or another one-byte float), while compiled kernels are in use.
    Other pairs still cast correctly, through numpy. Accepts numpy dtypes, anything ``np.dtype()`` accepts,
    or `DType`. Loads the compiled kernels if needed; a kernel that fails its first-use self-check turns
    this False.

    Example:
        >>> import numpy as np, ml_dtypes
        >>> from lazyweights.kernels.casts import has_fast_path, USE_COMPILED, HAVE_C
        >>> has_fast_path(ml_dtypes.bfloat16, np.float16) == (USE_COMPILED and HAVE_C)
        True
        >>> has_fast_path("float32", "float32"), has_fast_path(np.float64, np.float16)
        (True, False)
    """
    src, dst = _as_dtype(src_dtype), _as_dtype(dst_dtype)
    if src == dst:
        return True
    if not warm_up():
        return False
    return _table is not None and (src, dst) in _table and (src, dst) not in _disabled


def casts_in_place(src_dtype, dst_dtype) -> bool:
    """Whether `cast_into(src, out)` is well defined when `src` is `out`'s own bytes viewed as `src_dtype` (a
    cast done where the bytes already lie: `RemoteFile.receive` receives a tensor straight into its result and
    casts each piece there while it is in cache).

    True for a same-dtype copy (nothing to do), and for bfloat16 -> float16 where the kernel in use is the
    AVX-512 or F16C loop: they read each vector before writing it back and make no no-aliasing promise to the
    compiler. The other kernels are compiled with `restrict` pointers, under which a cast onto its own input is
    undefined in C even where it happens to work; for them the answer is False and the caller casts from a
    separate buffer.

    Example:
        >>> import numpy as np, ml_dtypes
        >>> from lazyweights.kernels.casts import casts_in_place
        >>> casts_in_place(np.float16, np.float16), casts_in_place(np.float32, np.float16)
        (True, False)
    """
    src, dst = _as_dtype(src_dtype), _as_dtype(dst_dtype)
    if src == dst:
        return True
    if (src, dst) != (_BF16, _F16) or not has_fast_path(src, dst):
        return False
    return _K is not None and _K.bf16_to_f16_variant() in ("avx512", "f16c")


def _blocks(shape: tuple[int, ...], chunk: int) -> Iterator[tuple[Any, int]]:
    """Split an array of `shape` into consecutive C-order blocks of at most `chunk` elements (but at least
    one element), each addressable by basic indexing. Yields (index, number of elements)."""
    inner, axis = 1, len(shape)
    while axis > 0 and inner * shape[axis - 1] <= chunk:
        axis -= 1
        inner *= shape[axis]
    if axis == 0:
        yield ..., inner
        return
    axis -= 1  # the axis split into runs; axes before it are iterated one index at a time
    step = max(1, chunk // inner)
    for outer in np.ndindex(*shape[:axis]):
        for start in range(0, shape[axis], step):
            stop = min(start + step, shape[axis])
            yield outer + (slice(start, stop),), (stop - start) * inner


# A strided source whose rows (last axis) are contiguous and nearly adjacent (a column slice that drops a
# few columns, broadcast rows) is converted in place, one kernel call for all rows that share one stride.
# Rows further apart are copied in blocks instead: measured on 256 MB sources, the kernel reading scattered
# 23 KB rows straight from memory ran at 7-14 GB/s, copy-then-convert at 16-19 GB/s, while rows 128 bytes
# apart read in place ran at 29 GB/s against 21 GB/s copied (numpy's copy keeps more loads in flight than
# the prefetchers do for a loop that also computes). Shorter rows, or fewer elements per call, are copied too.
_MAX_GAP = 4096  # bytes between the end of one row and the start of the next
_MIN_ROW = 64
_MIN_CALL = 1 << 16


def _as_rows(src: np.ndarray) -> np.ndarray | None:
    """`src` as a 2-D (rows, last axis) view without copying, or None if its rows have no common stride or
    lie too far apart to be read in place (see _MAX_GAP)."""
    try:
        rows = _reshape_without_copy(src, (-1, src.shape[-1]))
    except (AttributeError, ValueError):  # not viewable as rows without a copy: None, as documented
        return None
    row_stride, row_bytes = rows.strides[0], rows.shape[1] * rows.itemsize
    if rows.shape[0] > 1 and (row_stride % rows.itemsize or abs(row_stride) - row_bytes > _MAX_GAP):
        return None
    return rows


def _run_rows(kernel: _Kernel, rows: np.ndarray, out_flat: np.ndarray, index: np.ndarray | None = None) -> None:
    """Convert a 2-D view with contiguous rows and any row stride with one kernel call, reading it in place:
    every row, or (C kernels only) the rows `index` names: 1-D, source rows in output order; (2, n),
    (source row, output row) pairs."""
    n_rows, cols = rows.shape
    step = rows.strides[0] // rows.itemsize if n_rows > 1 else 0
    lowest = rows[n_rows - 1] if step < 0 else rows[0]  # the row at the lowest address
    # A 1-D view from the lowest to the highest element: all of it lies inside the array's own buffer.
    span = np.lib.stride_tricks.as_strided(lowest, shape=((n_rows - 1) * abs(step) + cols,),
                                           strides=(rows.itemsize,), writeable=False)
    first = (n_rows - 1) * -step if step < 0 else 0
    kernel.run(span, out_flat, n_rows if index is None else index, cols, first, step)


def _run_strided(kernel: _Kernel, src: np.ndarray, out_flat: np.ndarray) -> None:
    """Convert a source that is not C-contiguous (or is misaligned)."""
    if src.ndim >= 2 and src.strides[-1] == src.itemsize and src.shape[-1] >= _MIN_ROW and src.flags.aligned:
        rows = _as_rows(src)
        if rows is not None:
            _run_rows(kernel, rows, out_flat)
            return
        per_call = src.size // src.shape[0]
        if per_call >= _MIN_CALL and src.ndim > 2 and _as_rows(src[0]) is not None:
            # e.g. a permuted 3-D view whose slabs are row slices: one call per leading index
            for i in range(src.shape[0]):
                _run_strided(kernel, src[i], out_flat[i * per_call:(i + 1) * per_call])
            return
    _run_blocked(kernel, src, out_flat)


def _run_blocked(kernel: _Kernel, src: np.ndarray, out_flat: np.ndarray) -> None:
    """Copy a strided source into a contiguous buffer one cache-sized block at a time, converting each."""
    chunk = max(1, _CHUNK_BYTES // src.itemsize)
    scratch = np.empty(min(chunk, src.size), src.dtype)
    # Views made once, not per block: each costs about a microsecond, a block about thirty.
    scratch_bits = scratch.view(kernel.src_view)
    scratch_bits.flags.writeable = False
    out_bits = out_flat.view(kernel.dst_view)
    fn, args = kernel.fn, kernel.args
    offset = 0
    for index, n in _blocks(src.shape, chunk):
        part = src[index]
        np.copyto(scratch[:n].reshape(part.shape), part)
        fn(scratch_bits[:n], out_bits[offset:offset + n], 1, n, 0, 0, *args)
        offset += n


def cast_into(src: np.ndarray, out: np.ndarray) -> None:
    """Write `src` converted to ``out.dtype`` into `out`, bit-identical to ``src.astype(out.dtype)``.

    `src` may have any number of dimensions and any strides (a transposed or sliced view of a read-only
    memory map is typical); `out` must have the same shape and be writable, and should be C-contiguous
    (anything else takes the slower numpy path). No full-size temporary is ever allocated: a strided
    source is copied into a scratch buffer in blocks of about 512 KB (nearly adjacent contiguous rows are
    read in place). The compiled kernels release the GIL, so threads casting different parts of an array run in
    parallel. numpy's floating-point warnings (overflow, invalid) are not raised: a cast is a value
    mapping, not arithmetic. Raises ShapeError (a ValueError) on a shape mismatch, ValueError for a
    read-only `out`, DTypeError (a TypeError) for a pair numpy cannot cast at all.

    Example:
        >>> import numpy as np, ml_dtypes
        >>> from lazyweights.kernels.casts import cast_into
        >>> src = np.array([[1.0, 3.0], [-0.0, 70000.0]], dtype=ml_dtypes.bfloat16)
        >>> out = np.empty((2, 2), np.float16)
        >>> cast_into(src.T, out)  # a transposed (strided) source; 70000 overflows float16
        >>> out
        array([[ 1., -0.],
               [ 3., inf]], dtype=float16)
    """
    if not isinstance(out, np.ndarray):
        raise ArgumentTypeError(f"out must be a numpy array, not {type(out).__name__}")
    src = np.asanyarray(src)
    if src.shape != out.shape:
        raise ShapeError(f"cast_into: source shape {src.shape} != output shape {out.shape}")
    if not out.flags.writeable:
        raise UsageError(f"cast_into: the output array ({out.dtype}{list(out.shape)}) is read-only")
    if out.size == 0:
        return
    dst_dtype = out.dtype
    if src.dtype == dst_dtype:
        np.copyto(out, src)
        return
    # Tiny casts are not worth a kernel call.
    kernel = _kernel_for(src.dtype, dst_dtype) if USE_COMPILED and HAVE_C and out.size >= 4096 else None
    if kernel is None or not (out.flags.c_contiguous and out.flags.aligned):
        if not np.can_cast(src.dtype, dst_dtype, casting="unsafe"):
            raise DTypeError(f"cast_into: numpy has no cast from {src.dtype} to {dst_dtype}")
        # Same cast loops as astype (so the same bits); numpy buffers strided input in small blocks.
        with np.errstate(all="ignore"):
            np.copyto(out, src, casting="unsafe")
        return
    out_flat = out.reshape(-1)
    if src.flags.c_contiguous and src.flags.aligned:
        kernel.run(src.reshape(-1), out_flat)
    else:
        _run_strided(kernel, src, out_flat)


def cast(src: np.ndarray, dtype) -> np.ndarray:
    """Return `src` converted to `dtype` as a new C-contiguous array; ``cast_into`` into a fresh array.

    `dtype` is a numpy dtype, anything ``np.dtype()`` accepts (``"bfloat16"``), or a `DType`.

    Example:
        >>> import numpy as np
        >>> from lazyweights.kernels.casts import cast
        >>> cast(np.array([1.0, 65520.0, np.nan], np.float32), "float16")
        array([ 1., inf, nan], dtype=float16)
        >>> cast(np.float32(0.1), "bfloat16").view(np.uint16)  # 0-d works too
        array(15821, dtype=uint16)
    """
    src = np.asanyarray(src)
    out = np.empty(src.shape, _as_dtype(dtype))
    cast_into(src, out)
    return out


# --------------------------------------------------------------------------------------------------------
# Row gathers.

def _reshape_without_copy(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`a` reshaped as a view, or ValueError where that needs a copy (plain reshape() would copy silently)."""
    try:
        return a.reshape(shape, copy=False)
    except TypeError:  # numpy < 2.1 has no copy= keyword; assigning a shape (deprecated in 2.5) never copies
        view = a.view()
        view.shape = shape
        return view


def _row_table(src: np.ndarray) -> np.ndarray | None:
    """`src` as a 2-D (rows, elements per row) view whose rows are contiguous and evenly spaced, without
    copying; None if it is not one (or is misaligned)."""
    try:
        table = _reshape_without_copy(src, (src.shape[0], -1))
    except (AttributeError, ValueError):  # a copy would be needed; (0, -1) is ambiguous
        return None
    if table.shape[1] > 1 and table.strides[1] != table.itemsize:
        return None
    if table.shape[0] > 1 and table.strides[0] % table.itemsize:
        return None
    return table if table.flags.aligned else None


def _check_row_index(idx: np.ndarray, n: int) -> None:
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        i = int(np.flatnonzero((idx < 0) | (idx >= n))[0])
        why = "negative" if idx[i] < 0 else "out of range"
        raise IndexError(f"gather_cast_into: row index {int(idx[i])} (at position {i} of {idx.size}) is {why}: "
                         f"the source holds rows 0..{n - 1}")


def gather_cast_into(src: np.ndarray, rows, out: np.ndarray) -> None:
    """Write rows `rows` of `src`, converted to ``out.dtype``, into consecutive rows of `out`:
    ``out[i] = src[rows[i]]``, bit-identical to ``src[rows].astype(out.dtype)``.

    Why: a row permutation under a cast (RoPE's q/k rows, any `take` along axis 0) used to gather the rows
    into a temporary and then cast it, two passes over the bytes. Here the C kernels read each row where
    it lies (a read-only memory-map view, a row slice) and convert it straight into `out`: one call, one
    pass, the GIL released. `src`: any array whose rows (axis 0) are each contiguous and evenly spaced;
    `rows`: 1-D integers in ``[0, len(src))`` (negative ones are an IndexError, not counted from the end
    as numpy would); `out`: C-contiguous, writable, shape ``(len(rows),) + src.shape[1:]``.
    Where the C kernels are switched off (numpy's casts), for pairs without a kernel, and for
    sources whose rows are not contiguous, the rows are gathered first and cast with `cast_into`: the same
    bits, one more pass. Same-dtype gathers are ``np.take(..., out=out)``, one pass too.

    Example:
        >>> import numpy as np, ml_dtypes
        >>> from lazyweights.kernels.casts import gather_cast_into
        >>> src = np.arange(8, dtype=np.float32).reshape(4, 2).astype(ml_dtypes.bfloat16)
        >>> out = np.empty((3, 2), np.float16)
        >>> gather_cast_into(src, [3, 0, 2], out)
        >>> out
        array([[6., 7.],
               [0., 1.],
               [4., 5.]], dtype=float16)
        >>> gather_cast_into(src, [4, 0, 1], out)
        Traceback (most recent call last):
        ...
        IndexError: gather_cast_into: row index 4 (at position 0 of 3) is out of range: the source holds rows 0..3
    """
    if not isinstance(out, np.ndarray):
        raise ArgumentTypeError(f"out must be a numpy array, not {type(out).__name__}")
    src = np.asanyarray(src)
    idx = np.asarray(rows)
    if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise ShapeError(f"gather_cast_into: rows must be a 1-D integer array, got {idx.dtype}{list(idx.shape)}")
    if src.ndim == 0:
        raise ShapeError("gather_cast_into: the source has no rows (it is 0-d)")
    if out.shape != (idx.size,) + src.shape[1:]:
        raise ShapeError(f"gather_cast_into: {idx.size} rows of source shape {src.shape} do not fit output "
                         f"shape {out.shape}")
    if not out.flags.writeable:
        raise UsageError(f"gather_cast_into: the output array ({out.dtype}{list(out.shape)}) is read-only")
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    kernel = table = None
    if USE_COMPILED and HAVE_C and idx.size and out.size and out.flags.c_contiguous and out.flags.aligned \
            and src.dtype != out.dtype:
        kernel = _kernel_for(src.dtype, out.dtype)
        if kernel is not None:
            table = _row_table(src)
    if table is None or kernel is None:
        _check_row_index(idx, src.shape[0])
        if out.size == 0:
            return
        if src.dtype == out.dtype:
            # Moved as unsigned integers of the same size: numpy's take and fancy indexing on a user dtype
            # (ml_dtypes' bfloat16, the float8s) go element by element through the dtype's hooks (7x slower).
            bits = _UINT.get(src.dtype.itemsize)
            if bits is not None and src.dtype.kind not in "biuf":
                src, out = src.view(bits), out.view(bits)
            if src.flags.c_contiguous:
                np.take(src, idx, axis=0, out=out, mode="clip")  # checked above; "raise" would buffer `out`
            else:
                # np.take copies a non-contiguous source whole first: for the overlapping row view of a RoPE
                # gather that is the whole tensor many times over (1 GB for a 1024x1024 bf16 k_proj, seconds;
                # 1.9 s per q_proj on the H100 host, where W1 onto the GPU took 80 s instead of a fraction of
                # one). Fancy indexing reads only the rows asked for (test_casts.py::test_gather_same_dtype_strided).
                out[...] = src[idx]
        else:
            cast_into(src[idx], out)
        return
    index = idx
    if idx.size > 1 and bool((idx[1:] < idx[:-1]).any()):
        # Visit the source rows in ascending order, each written to its place: read in permuted order, rows
        # cost the hardware prefetchers their stream (+20% on RoPE's q/k rows; see _ccasts.c).
        order = np.argsort(idx, kind="stable")
        index = np.stack([idx[order], order])
    try:
        _run_rows(kernel, table, out.reshape(-1), index)  # the kernel checks every index before reading
        return
    except IndexError as e:
        error = e
    _check_row_index(idx, src.shape[0])  # the same message on every path (outside `except`: no chained context)
    raise error
