"""The compiled cast kernels (numba), kept apart from `casts.py` so that importing numba and loading its
kernel cache (about 1.5 s per process on the development machine: 0.7 s to import numba, 0.9 s for its
CPU target to load the cached machine code) happens on a background thread while the first casts of a
process run through numpy. See `casts.py` for the contract every kernel here meets (bit-identical to
numpy/ml_dtypes astype) and how each one is checked on first use.
"""
from __future__ import annotations

import os

import numpy as np

if os.environ.get("LAZYWEIGHTS_NO_NUMBA", "").strip() not in ("", "0"):
    raise ImportError("numba disabled by LAZYWEIGHTS_NO_NUMBA")
from llvmlite import ir as _ir  # noqa: E402
from numba import njit, types as _nbtypes  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

# --------------------------------------------------------------------------------------------------------
# Kernels. All arithmetic is on float32 bit patterns held in uint32. What keeps LLVM's vectorizer at full
# width (each measured on 64K-element blocks in cache):
# - every intermediate is wrapped in _U32(...): numba widens all integer arithmetic to 64 bits, and the
#   truncations let LLVM narrow it back to 32-bit lanes (2x);
# - format parameters are literal constants in each kernel (runtime parameters in the loop cost up to 3x;
#   k_f32_to_f16's NaN arguments are the measured exception);
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
def k_bf16_to_f32(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _U32(_U32(s[c]) << _U32(16))


@njit(nogil=True, cache=True)
def k_f16_to_f32(src, out, rows, cols, first, stride, quiet_nans):
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
def k_f32_to_bf16(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_bf16(s[c])


@njit(nogil=True, cache=True)
def k_f16_to_bf16(src, out, rows, cols, first, stride):
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
def k_f32_to_f16(src, out, rows, cols, first, stride, nan_base, nan_mask, nan_fix):
    # Unlike k_f16_to_f32, runtime NaN arguments measure faster here than one loop per mode with literals.
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_f16(s[c], nan_base, nan_mask, nan_fix)


@njit(nogil=True, cache=True)
def k_bf16_to_f16(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_f16(_U32(_U32(s[c]) << _U32(16)), 0x7E00, 0, 0)  # ml_dtypes' canonical NaN


@njit(nogil=True, cache=True)
def k_f32_to_e4m3(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e4m3(s[c])


@njit(nogil=True, cache=True)
def k_f32_to_e5m2(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e5m2(s[c])


@njit(nogil=True, cache=True)
def k_bf16_to_e4m3(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e4m3(_U32(_U32(s[c]) << _U32(16)))


@njit(nogil=True, cache=True)
def k_bf16_to_e5m2(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e5m2(_U32(_U32(s[c]) << _U32(16)))


@njit(nogil=True, cache=True)
def k_f16_to_e4m3(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e4m3(_widen_f16(s[c], _U32(0)))


@njit(nogil=True, cache=True)
def k_f16_to_e5m2(src, out, rows, cols, first, stride):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = _narrow_e5m2(_widen_f16(s[c], _U32(0)))


@njit(nogil=True, cache=True)
def k_lut(src, out, rows, cols, first, stride, table):
    for r in range(rows):
        s, o = src[first + r * stride:first + r * stride + cols], out[r * cols:(r + 1) * cols]
        for c in range(cols):
            o[c] = table[s[c]]


