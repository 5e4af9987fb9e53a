"""Dtype casts at memory speed, bit-identical to numpy/ml_dtypes `astype`.

Why this module exists: a checkpoint conversion is mostly casts (bf16 -> f16 for serving, norms to f32), and
the stock casts are far below memory bandwidth. On the 2-core development machine numpy's own
float32 -> float16 runs at about 1.2 GB/s and ml_dtypes' bfloat16 -> float16 at about 2.8 GB/s (bytes read +
written), while a plain copy runs at about 25 GB/s. Both stock casts convert one element at a time through
scalar C code; ml_dtypes also goes through float32 and, for strided input, through numpy's small cast buffers.
The kernels here run the six hot pairs (bf16/f16/f32 among themselves) at 23-32 GB/s on one thread on that
machine, against a 31-35 GB/s copy measured in the same runs (``benchmarks/bench_casts.py``), so a second
thread adds little for large arrays: the memory is already saturated.

The kernels here are numba loops over contiguous *unsigned integer* views (bf16 and fp8 bits need no
dtype support from numba), written without branches so LLVM vectorizes them. They are compiled with
``nogil=True`` so the threaded executor runs several at once, and with ``cache=True`` so the compile cost
(0.1 to 0.5 s per kernel, about 5 s for all of them) is paid once per machine rather than once per process;
with the cache warm, the first cast of a process costs about 0.4 s of numba start-up.
Strided sources never produce a full-size temporary: blocks of about 512 KB are copied into a scratch
buffer and converted from there, except that rows which are contiguous and nearly adjacent (a column slice
dropping a few columns, broadcast rows) are read in place.

Bit-exactness is the contract, not an approximation: every result, including NaN bit patterns, negative
zero, subnormals and overflow, equals ``src.astype(dst)`` as numpy and ml_dtypes compute it. The reference
behaviours the kernels reproduce (checked exhaustively over every 16-bit and 8-bit source pattern in
``tests/test_casts.py``):

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

Pairs without a kernel, and every pair when numba is missing or ``LAZYWEIGHTS_NO_NUMBA=1`` is set (or
`USE_NUMBA` is set to False), go through ``np.copyto(out, src, casting="unsafe")``, which uses the same cast
loops as ``astype`` and buffers strided input internally, so it is exact and never allocates a full-size
temporary either; it is simply slower.

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

import os
import threading
import warnings
from typing import Any, Iterator, NamedTuple

import ml_dtypes
import numpy as np

from ..errors import DTypeError, ShapeError

__all__ = ["cast", "cast_into", "has_fast_path", "USE_NUMBA", "HAVE_NUMBA"]

try:  # numba is a hard dependency, but a broken or absent install must cost speed, never correctness
    if os.environ.get("LAZYWEIGHTS_NO_NUMBA", "").strip() not in ("", "0"):
        raise ImportError("disabled by LAZYWEIGHTS_NO_NUMBA")
    from llvmlite import ir as _ir
    from numba import njit, types as _nbtypes
    from numba.extending import intrinsic

    HAVE_NUMBA = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_NUMBA = False

    def njit(*args, **kwargs):  # the kernels below are then plain (never called) Python functions
        return args[0] if args and callable(args[0]) else (lambda f: f)

    def intrinsic(f):
        return f

#: Whether cast_into uses the compiled kernels. Tests (and users chasing a suspected kernel bug) may set it
#: to False at runtime to force the numpy path.
USE_NUMBA: bool = HAVE_NUMBA

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
_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


# --------------------------------------------------------------------------------------------------------
# Kernels. All arithmetic is on float32 bit patterns held in uint32. What keeps LLVM's vectorizer at full
# width (each measured on 64K-element blocks in cache):
# - every intermediate is wrapped in _U32(...): numba widens all integer arithmetic to 64 bits, and the
#   truncations let LLVM narrow it back to 32-bit lanes (2x);
# - format parameters are literal constants in each kernel (runtime parameters in the loop cost up to 3x;
#   _k_f32_to_f16's NaN arguments are the measured exception);
# - helpers are written as selects, never branches, and inlined at numba level (inline="always").

_U32 = np.uint32


@intrinsic
def _as_f32(typingctx, bits):
    """Reinterpret uint32 bits as float32 (no numba builtin does this for scalars)."""
    sig = _nbtypes.float32(_nbtypes.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _ir.FloatType())

    return sig, codegen


@intrinsic
def _as_u32(typingctx, value):
    """Reinterpret float32 as its uint32 bits."""
    sig = _nbtypes.uint32(_nbtypes.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _ir.IntType(32))

    return sig, codegen


@njit(inline="always", cache=True)
def _widen_f16(h, quiet_bit):
    """float16 bits -> float32 bits; exact. `quiet_bit` (0 or 0x400000) is ORed into NaNs."""
    h = _U32(h)
    m = _U32(h & _U32(0x3FF))
    e = _U32(h & _U32(0x7C00))
    normal = _U32(_U32(_U32(h & _U32(0x7FFF)) << _U32(13)) + _U32(112 << 23))
    # m * 2**-24 is exact and a normal float32, so the FPU does the renormalization.
    subnormal = _as_u32(np.float32(m) * np.float32(2.0**-24))
    special = _U32(_U32(0x7F800000) | _U32(m << _U32(13)))
    special = _U32(special | (_U32(quiet_bit) if m != _U32(0) else _U32(0)))
    r = subnormal if e == _U32(0) else normal
    r = special if e == _U32(0x7C00) else r
    return _U32(r | _U32(_U32(h & _U32(0x8000)) << _U32(16)))


@njit(inline="always", cache=True)
def _narrow(x, mant_bits, bias, max_code, ovf_code, sign_shift, nan_base, nan_payload_mask, nan_zero_fix):
    """float32 bits -> bits of a narrower IEEE-like format (float16, fp8), round-to-nearest-even.

    Magnitude codes above `max_code` become `ovf_code`. A NaN becomes
    ``nan_base | (payload >> (23 - mant_bits)) & nan_payload_mask``, then ``| nan_zero_fix`` if that is
    still `nan_base` (how numpy keeps a float16 NaN from turning into infinity).
    """
    x = _U32(x)
    a = _U32(x & _U32(0x7FFFFFFF))
    shift = _U32(23 - mant_bits)
    lsb = _U32(_U32(a >> shift) & _U32(1))
    t = _U32(a - _U32((127 - bias) << 23))
    t = _U32(t + _U32(_U32(_U32(1) << _U32(shift - _U32(1))) - _U32(1)))
    normal = _U32(_U32(t + lsb) >> shift)
    # Below the smallest normal, adding a "magic" power of two whose ulp is the target's subnormal step
    # makes the FPU's own round-to-nearest-even round the subnormal (the classic float_to_half trick).
    # Immune to FTZ/DAZ: the sum is a normal number, and inputs DAZ would zero round to zero anyway. It does
    # rely on the default round-to-nearest mode, which nothing in a numpy process changes.
    magic = _U32(((127 - bias) + shift + 1) << 23)
    subnormal = _U32(_as_u32(_as_f32(a) + _as_f32(magic)) - magic)
    r = normal if a >= _U32((128 - bias) << 23) else subnormal
    r = _U32(ovf_code) if r > _U32(max_code) else r
    nan = _U32(_U32(nan_base) | _U32(_U32(a >> shift) & _U32(nan_payload_mask)))
    nan = _U32(nan | (_U32(nan_zero_fix) if nan == _U32(nan_base) else _U32(0)))
    r = nan if a > _U32(0x7F800000) else r
    sign_bit = _U32(_U32(1) << _U32(31 - sign_shift))
    return _U32(r | _U32(_U32(x >> _U32(sign_shift)) & sign_bit))


@njit(inline="always", cache=True)
def _narrow_bf16(x):
    """float32 bits -> bfloat16 bits, round-to-nearest-even, NaN -> ml_dtypes' canonical 0x7fc0 | sign."""
    x = _U32(x)
    r = _U32(_U32(_U32(x + _U32(0x7FFF)) + _U32(_U32(x >> _U32(16)) & _U32(1))) >> _U32(16))
    nan = _U32(_U32(_U32(x >> _U32(16)) & _U32(0x8000)) | _U32(0x7FC0))
    return nan if _U32(x & _U32(0x7FFFFFFF)) > _U32(0x7F800000) else r


@njit(inline="always", cache=True)
def _narrow_f16(x, nan_base, nan_mask, nan_fix):
    return _narrow(x, 10, 15, 0x7BFF, 0x7C00, 16, nan_base, nan_mask, nan_fix)


@njit(inline="always", cache=True)
def _narrow_e4m3(x):
    # No infinity: overflow (and inf) become NaN 0x7f, never saturate to 448.
    return _narrow(x, 3, 7, 0x7E, 0x7F, 24, 0x7F, 0, 0)


@njit(inline="always", cache=True)
def _narrow_e5m2(x):
    # Overflow becomes inf 0x7c; ml_dtypes' NaN is 0x7e.
    return _narrow(x, 2, 15, 0x7B, 0x7C, 24, 0x7E, 0, 0)


# Every kernel has the same shape: `rows` rows of `cols` elements, row r of the source starting at element
# ``first + r * stride`` of the 1-D contiguous `src` (stride may be negative or larger than cols), written
# densely into `out`. A contiguous array is one row. Rows are sliced rather than indexed: slices of a
# contiguous array stay contiguous to numba, so the inner loop vectorizes (indexing ``src[base + c]`` runs
# 9x slower).

@njit(nogil=True, cache=True)
def _k_bf16_to_f32(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _U32(_U32(s[c]) << _U32(16))


@njit(nogil=True, cache=True)
def _k_f16_to_f32(src, out, rows, cols, first, stride, quiet_nans):
    # One loop per NaN mode with the quiet bit as a literal: as a runtime value it costs a third of the speed.
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        if quiet_nans:
            for c in range(cols):
                o[c] = _widen_f16(s[c], _U32(0x400000))
        else:
            for c in range(cols):
                o[c] = _widen_f16(s[c], _U32(0))


@njit(nogil=True, cache=True)
def _k_f32_to_bf16(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_bf16(s[c])


@njit(nogil=True, cache=True)
def _k_f16_to_bf16(src, out, rows, cols, first, stride):
    # Direct rather than _narrow_bf16(_widen_f16(h)): 35% faster. For a normal float16 the float32 bits are
    # (a + (112 << 10)) << 13, and dropping 16 of them with round-to-nearest-even is dropping 3 here.
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            h = _U32(s[c])
            a = _U32(h & _U32(0x7FFF))
            biased = _U32(a + _U32(112 << 10))
            normal = _U32(_U32(_U32(biased + _U32(3)) + _U32(_U32(biased >> _U32(3)) & _U32(1))) >> _U32(3))
            subnormal = _narrow_bf16(_as_u32(np.float32(a) * np.float32(2.0**-24)))  # a < 0x400: exact
            v = subnormal if a < _U32(0x400) else normal
            v = _U32(0x7F80) if a == _U32(0x7C00) else v
            v = _U32(0x7FC0) if a > _U32(0x7C00) else v  # ml_dtypes' canonical NaN
            o[c] = _U32(v | _U32(h & _U32(0x8000)))


@njit(nogil=True, cache=True)
def _k_f32_to_f16(src, out, rows, cols, first, stride, nan_base, nan_mask, nan_fix):
    # Unlike _k_f16_to_f32, runtime NaN arguments measure faster here than one loop per mode with literals.
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_f16(s[c], nan_base, nan_mask, nan_fix)


@njit(nogil=True, cache=True)
def _k_bf16_to_f16(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_f16(_U32(_U32(s[c]) << _U32(16)), 0x7E00, 0, 0)  # ml_dtypes' canonical NaN


@njit(nogil=True, cache=True)
def _k_f32_to_e4m3(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e4m3(s[c])


@njit(nogil=True, cache=True)
def _k_f32_to_e5m2(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e5m2(s[c])


@njit(nogil=True, cache=True)
def _k_bf16_to_e4m3(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e4m3(_U32(_U32(s[c]) << _U32(16)))


@njit(nogil=True, cache=True)
def _k_bf16_to_e5m2(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e5m2(_U32(_U32(s[c]) << _U32(16)))


@njit(nogil=True, cache=True)
def _k_f16_to_e4m3(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e4m3(_widen_f16(s[c], _U32(0)))


@njit(nogil=True, cache=True)
def _k_f16_to_e5m2(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e5m2(_widen_f16(s[c], _U32(0)))


@njit(nogil=True, cache=True)
def _k_lut(src, out, rows, cols, first, stride, table):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = table[s[c]]


# --------------------------------------------------------------------------------------------------------
# The pair table.

class _Kernel(NamedTuple):
    fn: Any
    src_view: np.dtype  # unsigned integer views the kernel sees
    dst_view: np.dtype
    args: tuple
    check: str  # "f16bits": verify on all 65536 patterns; "f32bits": on the edge set; "": exact by design

    def run(self, src: np.ndarray, out_flat: np.ndarray, rows: int = 1, cols: int = -1, first: int = 0,
            stride: int = 0) -> None:
        """Convert `rows` rows of `cols` elements of the 1-D contiguous `src`, row r starting at element
        ``first + r * stride``, into `out_flat`. By default all of `src` is one row."""
        s = src.view(self.src_view)
        # One compiled specialization per kernel: numba types read-only and writable arrays differently,
        # and sources are usually read-only memory maps.
        s.flags.writeable = False
        if cols < 0:
            cols = s.size
        self.fn(s, out_flat.view(self.dst_view), int(rows), int(cols), int(first), int(stride), *self.args)


_lock = threading.Lock()
_table: dict[tuple[np.dtype, np.dtype], _Kernel] | None = None
_disabled: dict[tuple[np.dtype, np.dtype], str] = {}  # pair -> why its kernel was switched off
_verified: set[tuple[np.dtype, np.dtype]] = set()


def _numpy_half_modes() -> tuple[tuple[int, int, int], bool]:
    """How this numpy build treats NaNs in float32 <-> float16: software (payload kept, never quieted,
    the default) or hardware F16C (quieted). Returns (_narrow's NaN arguments, whether widening quiets)."""
    with np.errstate(all="ignore"):
        narrowed = int(np.array([0x7F800001], np.uint32).view(np.float32).astype(np.float16).view(np.uint16)[0])
        widened = int(np.array([0x7C01], np.uint16).view(np.float16).astype(np.float32).view(np.uint32)[0])
    narrow_nan = (0x7E00, 0x3FF, 0) if narrowed == 0x7E00 else (0x7C00, 0x3FF, 1)
    return narrow_nan, widened == 0x7FC02000


def _build_table() -> dict[tuple[np.dtype, np.dtype], _Kernel]:
    u8, u16, u32 = _UINT[1], _UINT[2], _UINT[4]
    f16_nan, f16_quiet = _numpy_half_modes()
    table = {
        (_BF16, _F32): _Kernel(_k_bf16_to_f32, u16, u32, (), "f16bits"),
        (_F16, _F32): _Kernel(_k_f16_to_f32, u16, u32, (f16_quiet,), "f16bits"),
        (_F32, _BF16): _Kernel(_k_f32_to_bf16, u32, u16, (), "f32bits"),
        (_F16, _BF16): _Kernel(_k_f16_to_bf16, u16, u16, (), "f16bits"),
        (_F32, _F16): _Kernel(_k_f32_to_f16, u32, u16, f16_nan, "f32bits"),
        (_BF16, _F16): _Kernel(_k_bf16_to_f16, u16, u16, (), "f16bits"),
        (_F32, _E4M3): _Kernel(_k_f32_to_e4m3, u32, u8, (), "f32bits"),
        (_F32, _E5M2): _Kernel(_k_f32_to_e5m2, u32, u8, (), "f32bits"),
        (_BF16, _E4M3): _Kernel(_k_bf16_to_e4m3, u16, u8, (), "f16bits"),
        (_BF16, _E5M2): _Kernel(_k_bf16_to_e5m2, u16, u8, (), "f16bits"),
        (_F16, _E4M3): _Kernel(_k_f16_to_e4m3, u16, u8, (), "f16bits"),
        (_F16, _E5M2): _Kernel(_k_f16_to_e5m2, u16, u8, (), "f16bits"),
    }
    for src in _BYTE_FLOATS:
        for dst in (_F32, _F16, _BF16, _F64) + _BYTE_FLOATS:
            if dst != src and np.can_cast(src, dst, casting="unsafe"):  # e8m0 <-> fp8 has no cast
                table[(src, dst)] = _Kernel(_k_lut, u8, _UINT[dst.itemsize], None, "")  # table made lazily
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


def _kernel_for(src_dtype: np.dtype, dst_dtype: np.dtype) -> _Kernel | None:
    """The verified kernel for a pair, or None. Builds tables and verifies on first use (thread-safe)."""
    global _table
    key = (src_dtype, dst_dtype)
    if _table is None:
        with _lock:
            if _table is None:
                _table = _build_table()
    kernel = _table.get(key)
    if kernel is None or key in _disabled:
        return None
    if key in _verified:
        return kernel
    with _lock:
        if key in _disabled:
            return None
        if key in _verified:
            return _table[key]
        if kernel.fn is _k_lut and kernel.args is None:
            codes = np.arange(256, dtype=np.uint8).view(src_dtype)
            with np.errstate(all="ignore"):
                lut = np.ascontiguousarray(codes.astype(dst_dtype).view(kernel.dst_view))
            kernel = kernel._replace(args=(lut,))
            _table[key] = kernel
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
    to float32/float16/bfloat16/float64 or another one-byte float), while numba is in use. Other pairs still
    cast correctly, through numpy. Accepts numpy dtypes, anything ``np.dtype()`` accepts, or `DType`.
    Never compiles anything; a kernel that later fails its first-use self-check turns this False.

    Example:
        >>> import numpy as np, ml_dtypes
        >>> from lazyweights.kernels.casts import has_fast_path, USE_NUMBA
        >>> has_fast_path(ml_dtypes.bfloat16, np.float16) == USE_NUMBA
        True
        >>> has_fast_path("float32", "float32"), has_fast_path(np.float64, np.float16)
        (True, False)
    """
    src, dst = _as_dtype(src_dtype), _as_dtype(dst_dtype)
    if src == dst:
        return True
    if not (USE_NUMBA and HAVE_NUMBA):
        return False
    global _table
    if _table is None:
        with _lock:
            if _table is None:
                _table = _build_table()
    return (src, dst) in _table and (src, dst) not in _disabled


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
    rows = src.view()
    try:
        rows.shape = (-1, src.shape[-1])  # unlike reshape(), assigning a shape never copies
    except AttributeError:
        return None
    row_stride, row_bytes = rows.strides[0], rows.shape[1] * rows.itemsize
    if rows.shape[0] > 1 and (row_stride % rows.itemsize or abs(row_stride) - row_bytes > _MAX_GAP):
        return None
    return rows


def _run_rows(kernel: _Kernel, rows: np.ndarray, out_flat: np.ndarray) -> None:
    """Convert a 2-D view with contiguous rows and any row stride with one kernel call, reading it in place."""
    n_rows, cols = rows.shape
    step = rows.strides[0] // rows.itemsize if n_rows > 1 else 0
    lowest = rows[n_rows - 1] if step < 0 else rows[0]  # the row at the lowest address
    # A 1-D view from the lowest to the highest element: all of it lies inside the array's own buffer.
    span = np.lib.stride_tricks.as_strided(lowest, shape=((n_rows - 1) * abs(step) + cols,),
                                           strides=(rows.itemsize,), writeable=False)
    first = (n_rows - 1) * -step if step < 0 else 0
    kernel.run(span, out_flat, n_rows, cols, first, step)


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
        raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
    src = np.asanyarray(src)
    if src.shape != out.shape:
        raise ShapeError(f"cast_into: source shape {src.shape} != output shape {out.shape}")
    if not out.flags.writeable:
        raise ValueError("cast_into: the output array is read-only")
    if out.size == 0:
        return
    dst_dtype = out.dtype
    if src.dtype == dst_dtype:
        np.copyto(out, src)
        return
    kernel = _kernel_for(src.dtype, dst_dtype) if USE_NUMBA and HAVE_NUMBA else None
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
