"""Bit-level helpers shared by the block kernels: IEEE half <-> single conversion inside numba code.

numba has no float16 scalar type on the CPU, and every GGUF block stores its scales as fp16. These helpers
do the conversion with integer operations and an LLVM bitcast, so a kernel can read a block's scale
without leaving compiled code. Both directions are exact and follow IEEE round-to-nearest-even, which is
what numpy's `astype(np.float16)` does (and what ggml's `GGML_FP32_TO_FP16` does), so quantized bytes match
gguf-py's bit for bit.

Caching caveat: kernels are compiled with `cache=True`, and numba invalidates a cached kernel only when
the file defining it changes. The helpers here (and those of `_ggml_math`, and `legacy.np_roundf`) are
inlined into kernels in other modules, so after editing them delete the caches
(`find lazyweights/quant -name "*.nb[ic]" -delete`) or the old code keeps running.

Also here: `as_kernel_src`, which gives every kernel the same (read-only, 1-D) argument type so numba
compiles one specialization per kernel instead of one for writable and one for read-only inputs.

Example:
    >>> import numpy as np
    >>> from lazyweights.quant._bits import half_to_float_scalar, float_to_half_scalar
    >>> half_to_float_scalar(0x3C00), float_to_half_scalar(np.float32(1.0)) == 0x3C00
    (1.0, True)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# --- bit reinterpretation (no numba scalar API does this) ----------------------------------------------


@intrinsic
def f32_to_bits(typingctx, x):
    """The uint32 bit pattern of a float32 scalar (an LLVM bitcast; no memory round trip)."""
    if not (isinstance(x, types.Float) and x.bitwidth == 32):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(x), codegen


@intrinsic
def bits_to_f32(typingctx, x):
    """The float32 whose bit pattern is the low 32 bits of integer `x`."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(x), codegen


# --- fp16 -> fp32 -------------------------------------------------------------------------------------

_F32_2POW_M24 = np.float32(2.0**-24)


@njit(inline="always", nogil=True, cache=True)
def half_to_float(h):
    """fp16 bits (an integer 0..65535) -> float32, exactly (numpy's `view(float16).astype(float32)`)."""
    h = np.uint32(h) & np.uint32(0xFFFF)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    if e != 0 and e != 31:
        # normal: rebias the exponent (15 -> 127) and widen the mantissa; the common, branch-predicted path
        return bits_to_f32(sign | (((h & np.uint32(0x7FFF)) << np.uint32(13)) + np.uint32(112 << 23)))
    if e == 0:
        # zero or subnormal: mant * 2^-24 is exact in float32; the sign is applied after so -0.0 stays -0.0
        v = np.float32(h & np.uint32(0x3FF)) * _F32_2POW_M24
        return -v if sign else v
    # inf / nan: keep the payload
    return bits_to_f32(sign | np.uint32(0x7F800000) | ((h & np.uint32(0x3FF)) << np.uint32(13)))


@njit(inline="always", nogil=True, cache=True)
def load_half(src, o):
    """The little-endian fp16 at byte offset `o` of a uint8 array, as float32."""
    return half_to_float(np.uint32(src[o]) | (np.uint32(src[o + 1]) << np.uint32(8)))


# --- fp32 -> fp16 -------------------------------------------------------------------------------------


@njit(inline="always", nogil=True, cache=True)
def float_to_half(x):
    """float32 -> fp16 bits (uint32 holding 0..65535), round-to-nearest-even, overflow to inf.

    The same algorithm as numpy's `npy_floatbits_to_halfbits`, so results equal `astype(np.float16)`.
    """
    f = f32_to_bits(np.float32(x))
    h_sgn = (f & np.uint32(0x80000000)) >> np.uint32(16)
    f_exp = f & np.uint32(0x7F800000)
    if f_exp >= np.uint32(0x47800000):
        # overflow, inf or nan
        if f_exp == np.uint32(0x7F800000):
            f_sig = f & np.uint32(0x007FFFFF)
            if f_sig != 0:
                ret = np.uint32(0x7C00) + (f_sig >> np.uint32(13))
                if ret == np.uint32(0x7C00):  # keep it a nan
                    ret += np.uint32(1)
                return h_sgn + ret
        return h_sgn + np.uint32(0x7C00)
    if f_exp <= np.uint32(0x38000000):
        # underflow: a subnormal half or signed zero
        if f_exp < np.uint32(0x33000000):
            return h_sgn
        e = f_exp >> np.uint32(23)
        f_sig = np.uint32(0x00800000) + (f & np.uint32(0x007FFFFF))
        f_sig = f_sig >> (np.uint32(113) - e)
        # round to nearest even; the bits shifted out above still count as "not exactly half"
        if ((f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000)) or (f & np.uint32(0x7FF)) != 0:
            f_sig += np.uint32(0x1000)
        return h_sgn + (f_sig >> np.uint32(13))
    h_exp = (f_exp - np.uint32(0x38000000)) >> np.uint32(13)
    f_sig = f & np.uint32(0x007FFFFF)
    # round to nearest even: add half an ulp unless it is an exact tie onto an even mantissa
    if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        f_sig += np.uint32(0x1000)
    # a carry out of the mantissa correctly bumps the exponent (and 65520+ overflows to inf)
    return h_sgn + (h_exp + (f_sig >> np.uint32(13)))


@njit(inline="always", nogil=True, cache=True)
def store_half(out, o, x):
    """Write float32 `x` as little-endian fp16 at byte offset `o` of a uint8 array."""
    store_u16(out, o, float_to_half(x))


@njit(inline="always", nogil=True, cache=True)
def store_u16(out, o, h):
    """Write the 16-bit integer `h` (0..65535) little-endian at byte offset `o` of a uint8 array."""
    out[o] = np.uint8(h & 0xFF)
    out[o + 1] = np.uint8(h >> 8)


# --- small test hooks (vectorized wrappers used by the tests) -----------------------------------------


@njit(nogil=True, cache=True)
def _halves_to_floats(h, out):
    for i in range(h.shape[0]):
        out[i] = half_to_float(h[i])


@njit(nogil=True, cache=True)
def _floats_to_halves(x, out):
    for i in range(x.shape[0]):
        out[i] = np.uint16(float_to_half(x[i]))


def on_scalar(kernel, v, in_dtype, out_dtype):
    """Run a vectorized test hook `kernel(values, out)` on the one value `v`; return its result."""
    out = np.empty(1, out_dtype)
    kernel(np.array([v], in_dtype), out)
    return out[0]


def half_to_float_scalar(h: int) -> float:
    """Python-level check of `half_to_float` (tests and doctests)."""
    return float(on_scalar(_halves_to_floats, h, np.uint16, np.float32))


def float_to_half_scalar(x) -> int:
    """Python-level check of `float_to_half` (tests and doctests)."""
    return int(on_scalar(_floats_to_halves, x, np.float32, np.uint16))


def halves_to_floats(h: np.ndarray) -> np.ndarray:
    """Vectorized `half_to_float` over a uint16 array (for tests)."""
    h = np.ascontiguousarray(h, dtype=np.uint16).reshape(-1)
    out = np.empty(h.shape, np.float32)
    _halves_to_floats(h, out)
    return out


def floats_to_halves(x: np.ndarray) -> np.ndarray:
    """Vectorized `float_to_half` over a float32 array (for tests)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(x.shape, np.uint16)
    _floats_to_halves(x, out)
    return out


# --- argument normalization ---------------------------------------------------------------------------


def as_kernel_src(src: np.ndarray) -> np.ndarray:
    """A flat, read-only view of a C-contiguous array (no copy).

    Memory-mapped inputs are read-only and numba types read-only arrays separately; marking every input
    read-only means each kernel is compiled (and cached) once, whichever kind of array it is given.
    """
    flat = src.reshape(-1)
    if flat.flags.writeable:
        flat = flat.view()
        flat.flags.writeable = False
    return flat


def flat_runner(kernel, *extra):
    """Wrap a numba kernel `kernel(src_flat_readonly, out_flat, *extra)` as a registry kernel over 2-D arrays.

    Rows of whole blocks are contiguous in both arrays, so the kernel can walk blocks from start to end
    without knowing about rows; that keeps the loop nest (and what LLVM must vectorize) minimal.
    """

    def run(src: np.ndarray, out: np.ndarray) -> None:
        kernel(as_kernel_src(src), out.reshape(-1), *extra)

    run.__name__ = kernel.__name__.lstrip("_")
    run.__qualname__ = run.__name__
    run.kernel = kernel
    return run


_NO_WEIGHTS = np.zeros(0, np.float32)


def imatrix_runner(kernel, name: str, *extra):
    """Wrap an importance-matrix encoder `kernel(src_flat, out_flat, n_per_row, qw, *extra)` as a registry
    quantizer `run(src, out, imatrix=None)`; an empty `qw` is the kernel's no-imatrix path."""

    def run(src: np.ndarray, out: np.ndarray, imatrix: np.ndarray | None = None) -> None:
        qw = _NO_WEIGHTS if imatrix is None else imatrix
        kernel(as_kernel_src(src), out.reshape(-1), src.shape[1], as_kernel_src(qw), *extra)

    run.__name__ = name
    run.kernel = kernel
    run.takes_imatrix = True
    return run
