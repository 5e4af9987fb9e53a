"""Float casts for the GPU, bit-identical to the CPU casts (`kernels/casts.py`) and to numpy/ml_dtypes.

Why integer code and not CUDA's own conversions: `__float2half_rn`, `__float2bfloat16` and the fp8
intrinsics disagree with numpy/ml_dtypes on NaNs (payload, quiet bit, sign) and some saturate where
ml_dtypes overflows to NaN or infinity. A GPU result must equal the CPU result byte for byte, so every
conversion here works on bit patterns held in 32-bit unsigned integers, with integer operations only
(no float arithmetic at all, so FTZ/DAZ and fused multiply-adds cannot change a result).

Why each algorithm is written twice, once in numpy and once in CUDA C, side by side: there is no GPU on the
development machines or in CI, so the CUDA source cannot be tested there. The numpy function
(`reference_*`, vectorised over uint32 arrays) is the same algorithm, step for step, in the same order, with
the same constants and the same wrap-around uint32 arithmetic; it is tested bit-exact against ml_dtypes over
every bf16/f16 pattern, every fp8 pattern and millions of f32 patterns (`tests/run/test_gpu.py`). The CUDA
function next to it is a line-by-line transcription (`?:` for `np.where`). Keep them in lockstep: change
one, change the other.

Semantics (the same as `kernels/casts.py`):
- round-to-nearest-even everywhere; subnormals kept, never flushed;
- float32 <-> float16 follows the installed numpy build: by default (software conversion) a NaN keeps its
  payload and sign and is never quieted (a payload that would truncate to zero becomes 0x7c01); a build
  with F16C quiets instead. The mode is probed from numpy once (`half_modes()`) and baked into the kernels;
- every ml_dtypes conversion returns a canonical quiet NaN keeping only the sign (bf16 0x7fc0, f16 0x7e00,
  f32 0x7fc00000, e4m3fn 0x7f, e5m2 0x7e); bf16 -> f32 is a plain widening (payload kept), as ml_dtypes;
- float8_e4m3fn has no infinity: values rounding past 448 and +-inf become NaN 0x7f (sign kept);
  float8_e5m2 overflows to +-inf. Neither saturates.

Pairs on the device (`DEVICE_CASTS`): all directions among bfloat16/float16/float32; float32/bfloat16/float16
to float8_e4m3fn/float8_e5m2 and back; float8_e4m3fn <-> float8_e5m2. Any other cast in a plan runs on the
host (the GPU executor moves it into the host part of the step).

CuPy is imported only by `cast_kernel`, i.e. only when a GPU is used.

Example:
    >>> import numpy as np, ml_dtypes
    >>> from lazyweights.kernels.cuda_casts import reference_cast
    >>> x = np.array([1.0, -2.5, 500.0, np.inf, 1e-8], np.float32)
    >>> got = reference_cast(x, ml_dtypes.float8_e4m3fn).view(np.uint8)
    >>> [hex(b) for b in got]   # 500 rounds past 464 and inf has no code: both NaN 0x7f
    ['0x38', '0xc2', '0x7f', '0x7f', '0x0']
    >>> bool((got == x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)).all())
    True
"""
from __future__ import annotations

import functools

import numpy as np

from ..core.dtype import DType
from ..core.errors import DTypeError

__all__ = [
    "DEVICE_CASTS",
    "CUDA_SOURCE",
    "half_modes",
    "reference_bits",
    "reference_chain",
    "reference_cast",
    "cuda_chain_expr",
    "cuda_preamble",
    "cast_kernel",
    "cast_kernel_parts",
    "storage_dtype",
    "NVRTC_OPTIONS",
]

U = np.uint32  # every constant in the references is a uint32, so numpy never widens to int64

# Compile options for every lazyweights kernel: no fused multiply-add contraction (ggml/numpy round each
# multiply and add separately), denormals kept, IEEE division. The cast kernels use no float ops at all;
# the dequantizers do, and also spell every float op as an explicit __f*_rn intrinsic.
NVRTC_OPTIONS = ("--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")


def storage_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype of the CuPy array that holds `dtype` on the GPU.

    CuPy has no bfloat16, fp8 or fp4 dtype, so those are held as unsigned integers of the same width
    (bf16 -> uint16, fp8/fp4/e8m0 -> uint8); their bytes are exactly the IEEE/OCP encodings. Everything else
    maps to itself.

    Example:
        >>> from lazyweights import DType
        >>> storage_dtype(DType.bfloat16).name, storage_dtype(DType.float16).name
        ('uint16', 'float16')
    """
    np_dtype = dtype.to_numpy()
    if dtype is DType.bfloat16 or dtype.name.startswith("float8") or dtype.name.startswith("float4"):
        return np.dtype(f"uint{8 * np_dtype.itemsize}")
    return np_dtype


@functools.lru_cache(maxsize=1)
def half_modes() -> tuple[tuple[int, int, int], int]:
    """This numpy build's float32 <-> float16 NaN handling, as the integer constants the kernels use:
    ((nan_base, nan_payload_mask, nan_zero_fix) for narrowing, quiet_bit for widening). Probed from numpy,
    exactly as `kernels/casts.py` does, so CPU and GPU agree on the machine that runs both."""
    from .casts import numpy_half_modes

    narrow, quiet = numpy_half_modes()
    base, payload, zero_fix = (int(v) for v in narrow)
    return (base, payload, zero_fix), (0x400000 if quiet else 0)


# ==========================================================================================================
# The algorithms: numpy reference first, CUDA transcription after. Inputs and outputs are uint32 bit
# patterns (narrow formats in the low bits).

def _log2_floor(m):
    """floor(log2(m)) for 0 < m < 2**16 (0 for m == 0), by a 4-step binary search."""
    p = np.full_like(m, U(0))
    # One line per step, as in the CUDA text it mirrors (tests/run/test_gpu.py compares their literals).
    s = np.where((m >> U(8)) != U(0), U(8), U(0)); m = m >> s; p = p + s  # noqa: E702
    s = np.where((m >> U(4)) != U(0), U(4), U(0)); m = m >> s; p = p + s  # noqa: E702
    s = np.where((m >> U(2)) != U(0), U(2), U(0)); m = m >> s; p = p + s  # noqa: E702
    s = np.where((m >> U(1)) != U(0), U(1), U(0)); p = p + s  # noqa: E702
    return p


_CUDA_LOG2_FLOOR = r"""
__device__ __forceinline__ unsigned int lw_log2_floor(unsigned int m) {
    unsigned int p = 0u, s;
    s = (m >> 8u) != 0u ? 8u : 0u; m = m >> s; p = p + s;
    s = (m >> 4u) != 0u ? 4u : 0u; m = m >> s; p = p + s;
    s = (m >> 2u) != 0u ? 2u : 0u; m = m >> s; p = p + s;
    s = (m >> 1u) != 0u ? 1u : 0u; p = p + s;
    return p;
}
"""


def _widen_finite(a, mant_bits: int, bias: int):
    """Magnitude bits `a` (sign removed) of a finite narrow float -> float32 bits, exactly.
    Subnormals are normalised with an integer leading-bit search (no float multiply)."""
    e = a >> U(mant_bits)
    m = a & U((1 << mant_bits) - 1)
    normal = (a << U(23 - mant_bits)) + U((127 - bias) << 23)
    p = _log2_floor(m)
    sub = ((p + U(128 - bias - mant_bits)) << U(23)) | ((m << (U(23) - p)) & U(0x7FFFFF))
    sub = np.where(m == U(0), U(0), sub)
    return np.where(e == U(0), sub, normal)


_CUDA_WIDEN_FINITE = r"""
__device__ __forceinline__ unsigned int lw_widen_finite(unsigned int a, unsigned int mant_bits, unsigned int bias) {
    unsigned int e = a >> mant_bits;
    unsigned int m = a & ((1u << mant_bits) - 1u);
    unsigned int normal = (a << (23u - mant_bits)) + ((127u - bias) << 23u);
    unsigned int p = lw_log2_floor(m);
    unsigned int sub = ((p + (128u - bias - mant_bits)) << 23u) | ((m << (23u - p)) & 0x7FFFFFu);
    sub = m == 0u ? 0u : sub;
    return e == 0u ? sub : normal;
}
"""


def widen_f16(h, quiet_bit: int):
    """float16 bits -> float32 bits, exact; a NaN keeps its payload, ORed with `quiet_bit`."""
    a = h & U(0x7FFF)
    m = h & U(0x3FF)
    r = _widen_finite(a, 10, 15)
    special = U(0x7F800000) | (m << U(13))
    special = special | np.where(m != U(0), U(quiet_bit), U(0))
    r = np.where((a >> U(10)) == U(31), special, r)
    return r | ((h & U(0x8000)) << U(16))


_CUDA_WIDEN_F16 = r"""
__device__ __forceinline__ unsigned int lw_widen_f16(unsigned int h, unsigned int quiet_bit) {
    unsigned int a = h & 0x7FFFu;
    unsigned int m = h & 0x3FFu;
    unsigned int r = lw_widen_finite(a, 10u, 15u);
    unsigned int special = 0x7F800000u | (m << 13u);
    special = special | (m != 0u ? quiet_bit : 0u);
    r = (a >> 10u) == 31u ? special : r;
    return r | ((h & 0x8000u) << 16u);
}
"""


def _widen_e4m3(b):
    """float8_e4m3fn bits -> float32 bits; 0x7f/0xff (the only NaNs; no infinity) -> canonical quiet NaN."""
    a = b & U(0x7F)
    r = _widen_finite(a, 3, 7)
    r = np.where(a == U(0x7F), U(0x7FC00000), r)
    return r | ((b & U(0x80)) << U(24))


_CUDA_WIDEN_E4M3 = r"""
__device__ __forceinline__ unsigned int lw_widen_e4m3(unsigned int b) {
    unsigned int a = b & 0x7Fu;
    unsigned int r = lw_widen_finite(a, 3u, 7u);
    r = a == 0x7Fu ? 0x7FC00000u : r;
    return r | ((b & 0x80u) << 24u);
}
"""


def _widen_e5m2(b):
    """float8_e5m2 bits -> float32 bits; infinities kept, NaNs -> canonical quiet NaN (sign kept)."""
    a = b & U(0x7F)
    r = _widen_finite(a, 2, 15)
    r = np.where(a == U(0x7C), U(0x7F800000), r)
    r = np.where(a > U(0x7C), U(0x7FC00000), r)
    return r | ((b & U(0x80)) << U(24))


_CUDA_WIDEN_E5M2 = r"""
__device__ __forceinline__ unsigned int lw_widen_e5m2(unsigned int b) {
    unsigned int a = b & 0x7Fu;
    unsigned int r = lw_widen_finite(a, 2u, 15u);
    r = a == 0x7Cu ? 0x7F800000u : r;
    r = a > 0x7Cu ? 0x7FC00000u : r;
    return r | ((b & 0x80u) << 24u);
}
"""


def _narrow(x, mant_bits: int, bias: int, max_code: int, ovf_code: int, sign_shift: int,
            nan_base: int, nan_payload_mask: int, nan_zero_fix: int):
    """float32 bits -> bits of a narrower IEEE-like format, round-to-nearest-even, integer ops only.

    The normal range rounds by adding (half ulp - 1 + lsb) and shifting (a carry correctly bumps the
    exponent); the subnormal range rounds the full 24-bit significand right-shifted by the exponent
    difference the same way (the CPU kernel lets the FPU do this with a "magic number" add; the integer
    form gives the same bits and cannot be changed by FTZ/DAZ). Magnitude codes above `max_code` become
    `ovf_code`. A NaN becomes `nan_base | (payload >> (23 - mant_bits)) & nan_payload_mask`, then
    `| nan_zero_fix` if that is still `nan_base`.
    """
    a = x & U(0x7FFFFFFF)
    shift = 23 - mant_bits
    lsb = (a >> U(shift)) & U(1)
    t = a - U((127 - bias) << 23)
    t = t + U((1 << (shift - 1)) - 1)
    normal = (t + lsb) >> U(shift)
    e = a >> U(23)
    sig = (a & U(0x7FFFFF)) | np.where(e != U(0), U(0x800000), U(0))
    e_eff = np.where(e != U(0), e, U(1))
    sh = U(151 - bias - mant_bits) - e_eff  # >= 24 - mant_bits in the subnormal range; elsewhere unused,
    sh = np.where(sh < U(31), sh, U(31))    # but kept in [1, 31] so that no shift below is undefined in C
    sh = np.where(sh > U(1), sh, U(1))
    sub = (sig + ((U(1) << (sh - U(1))) - U(1)) + ((sig >> sh) & U(1))) >> sh
    r = np.where(a >= U((128 - bias) << 23), normal, sub)
    r = np.where(r > U(max_code), U(ovf_code), r)
    nan = U(nan_base) | ((a >> U(shift)) & U(nan_payload_mask))
    nan = nan | np.where(nan == U(nan_base), U(nan_zero_fix), U(0))
    r = np.where(a > U(0x7F800000), nan, r)
    sign_bit = U(1 << (31 - sign_shift))
    return r | ((x >> U(sign_shift)) & sign_bit)


_CUDA_NARROW = r"""
__device__ __forceinline__ unsigned int lw_narrow(unsigned int x, unsigned int mant_bits, unsigned int bias,
        unsigned int max_code, unsigned int ovf_code, unsigned int sign_shift,
        unsigned int nan_base, unsigned int nan_payload_mask, unsigned int nan_zero_fix) {
    unsigned int a = x & 0x7FFFFFFFu;
    unsigned int shift = 23u - mant_bits;
    unsigned int lsb = (a >> shift) & 1u;
    unsigned int t = a - ((127u - bias) << 23u);
    t = t + ((1u << (shift - 1u)) - 1u);
    unsigned int normal = (t + lsb) >> shift;
    unsigned int e = a >> 23u;
    unsigned int sig = (a & 0x7FFFFFu) | (e != 0u ? 0x800000u : 0u);
    unsigned int e_eff = e != 0u ? e : 1u;
    unsigned int sh = (151u - bias - mant_bits) - e_eff;
    sh = sh < 31u ? sh : 31u;
    sh = sh > 1u ? sh : 1u;
    unsigned int sub = (sig + ((1u << (sh - 1u)) - 1u) + ((sig >> sh) & 1u)) >> sh;
    unsigned int r = a >= ((128u - bias) << 23u) ? normal : sub;
    r = r > max_code ? ovf_code : r;
    unsigned int nan = nan_base | ((a >> shift) & nan_payload_mask);
    nan = nan | (nan == nan_base ? nan_zero_fix : 0u);
    r = a > 0x7F800000u ? nan : r;
    unsigned int sign_bit = 1u << (31u - sign_shift);
    return r | ((x >> sign_shift) & sign_bit);
}
"""


def _narrow_bf16(x):
    """float32 bits -> bfloat16 bits, round-to-nearest-even, NaN -> ml_dtypes' canonical 0x7fc0 | sign."""
    r = ((x + U(0x7FFF)) + ((x >> U(16)) & U(1))) >> U(16)
    nan = ((x >> U(16)) & U(0x8000)) | U(0x7FC0)
    return np.where((x & U(0x7FFFFFFF)) > U(0x7F800000), nan, r)


_CUDA_NARROW_BF16 = r"""
__device__ __forceinline__ unsigned int lw_narrow_bf16(unsigned int x) {
    unsigned int r = ((x + 0x7FFFu) + ((x >> 16u) & 1u)) >> 16u;
    unsigned int nan = ((x >> 16u) & 0x8000u) | 0x7FC0u;
    return (x & 0x7FFFFFFFu) > 0x7F800000u ? nan : r;
}
"""


# Target formats for _narrow: (mant_bits, bias, max_code, ovf_code, sign_shift).
_F16 = (10, 15, 0x7BFF, 0x7C00, 16)
_E4M3 = (3, 7, 0x7E, 0x7F, 24)   # no infinity: overflow (and inf) -> NaN 0x7f, never saturate
_E5M2 = (2, 15, 0x7B, 0x7C, 24)  # overflow -> inf 0x7c
_ML_F16_NAN = (0x7E00, 0, 0)     # ml_dtypes' canonical float16 NaN
_E4M3_NAN = (0x7F, 0, 0)
_E5M2_NAN = (0x7E, 0, 0)


def _narrow_f16_numpy(x):
    return _narrow(x, *_F16, *half_modes()[0])


def _narrow_f16_ml(x):
    return _narrow(x, *_F16, *_ML_F16_NAN)


def _narrow_e4m3(x):
    return _narrow(x, *_E4M3, *_E4M3_NAN)


def _narrow_e5m2(x):
    return _narrow(x, *_E5M2, *_E5M2_NAN)


_CUDA_TARGETS = r"""
__device__ __forceinline__ unsigned int lw_narrow_f16_numpy(unsigned int x) {
    return lw_narrow(x, 10u, 15u, 0x7BFFu, 0x7C00u, 16u, LW_F16_NAN_BASE, LW_F16_NAN_MASK, LW_F16_NAN_FIX);
}
__device__ __forceinline__ unsigned int lw_narrow_f16_ml(unsigned int x) {
    return lw_narrow(x, 10u, 15u, 0x7BFFu, 0x7C00u, 16u, 0x7E00u, 0u, 0u);
}
__device__ __forceinline__ unsigned int lw_narrow_e4m3(unsigned int x) {
    return lw_narrow(x, 3u, 7u, 0x7Eu, 0x7Fu, 24u, 0x7Fu, 0u, 0u);
}
__device__ __forceinline__ unsigned int lw_narrow_e5m2(unsigned int x) {
    return lw_narrow(x, 2u, 15u, 0x7Bu, 0x7Cu, 24u, 0x7Eu, 0u, 0u);
}
"""


# --------------------------------------------------------------------------------------------------------
# The pair table: (src, dst) -> (numpy reference on uint32 bits, CUDA expression template with {x}).
# Each mirrors the matching CPU kernel in casts.py (or, for one-byte sources, ml_dtypes' own table).

def _pairs():
    bf16, f16, f32 = DType.bfloat16, DType.float16, DType.float32
    e4, e5 = DType.float8_e4m3fn, DType.float8_e5m2

    def quiet():
        return half_modes()[1]

    table = {
        (bf16, f32): (lambda x: x << U(16), "({x} << 16u)"),
        (f16, f32): (lambda x: widen_f16(x, quiet()), "lw_widen_f16({x}, LW_F16_QUIET)"),
        (f32, bf16): (_narrow_bf16, "lw_narrow_bf16({x})"),
        (f16, bf16): (lambda x: _narrow_bf16(widen_f16(x, 0)), "lw_narrow_bf16(lw_widen_f16({x}, 0u))"),
        (f32, f16): (_narrow_f16_numpy, "lw_narrow_f16_numpy({x})"),
        (bf16, f16): (lambda x: _narrow_f16_ml(x << U(16)), "lw_narrow_f16_ml({x} << 16u)"),
        (f32, e4): (_narrow_e4m3, "lw_narrow_e4m3({x})"),
        (f32, e5): (_narrow_e5m2, "lw_narrow_e5m2({x})"),
        (bf16, e4): (lambda x: _narrow_e4m3(x << U(16)), "lw_narrow_e4m3({x} << 16u)"),
        (bf16, e5): (lambda x: _narrow_e5m2(x << U(16)), "lw_narrow_e5m2({x} << 16u)"),
        (f16, e4): (lambda x: _narrow_e4m3(widen_f16(x, 0)), "lw_narrow_e4m3(lw_widen_f16({x}, 0u))"),
        (f16, e5): (lambda x: _narrow_e5m2(widen_f16(x, 0)), "lw_narrow_e5m2(lw_widen_f16({x}, 0u))"),
        (e4, f32): (_widen_e4m3, "lw_widen_e4m3({x})"),
        (e5, f32): (_widen_e5m2, "lw_widen_e5m2({x})"),
        (e4, f16): (lambda x: _narrow_f16_ml(_widen_e4m3(x)), "lw_narrow_f16_ml(lw_widen_e4m3({x}))"),
        (e5, f16): (lambda x: _narrow_f16_ml(_widen_e5m2(x)), "lw_narrow_f16_ml(lw_widen_e5m2({x}))"),
        (e4, bf16): (lambda x: _narrow_bf16(_widen_e4m3(x)), "lw_narrow_bf16(lw_widen_e4m3({x}))"),
        (e5, bf16): (lambda x: _narrow_bf16(_widen_e5m2(x)), "lw_narrow_bf16(lw_widen_e5m2({x}))"),
        (e4, e5): (lambda x: _narrow_e5m2(_widen_e4m3(x)), "lw_narrow_e5m2(lw_widen_e4m3({x}))"),
        (e5, e4): (lambda x: _narrow_e4m3(_widen_e5m2(x)), "lw_narrow_e4m3(lw_widen_e5m2({x}))"),
    }
    return table


_PAIRS = _pairs()

#: (src DType, dst DType) pairs the GPU converts on the device.
DEVICE_CASTS = frozenset(_PAIRS)

CUDA_SOURCE = (_CUDA_LOG2_FLOOR + _CUDA_WIDEN_FINITE + _CUDA_WIDEN_F16 + _CUDA_WIDEN_E4M3 + _CUDA_WIDEN_E5M2
               + _CUDA_NARROW + _CUDA_NARROW_BF16 + _CUDA_TARGETS)


def cuda_preamble() -> str:
    """The device functions, with this numpy build's float16 NaN mode as macros."""
    (base, mask, fix), quiet = half_modes()
    return (f"#define LW_F16_NAN_BASE {base}u\n#define LW_F16_NAN_MASK {mask}u\n#define LW_F16_NAN_FIX {fix}u\n"
            f"#define LW_F16_QUIET {quiet}u\n" + CUDA_SOURCE)


# --------------------------------------------------------------------------------------------------------
# Chains: a sequence of pairs applied to bits, e.g. ((bf16, f32), (f32, f8e4m3)). One kernel per chain.

Chain = tuple  # tuple[tuple[DType, DType], ...]


def _check_chain(chain: Chain) -> None:
    for i, pair in enumerate(chain):
        if pair not in _PAIRS:
            raise DTypeError(f"no device cast {pair[0].name} -> {pair[1].name} (chain step {i})")
        if i and chain[i - 1][1].size_in_bytes != pair[0].size_in_bytes:
            raise DTypeError(f"chain step {i} reads {pair[0].name} after a {chain[i - 1][1].name} result")


def reference_bits(bits: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """One device cast on uint32 bit patterns (narrow formats in the low bits) -> uint32 bit patterns."""
    return _PAIRS[(src, dst)][0](np.asarray(bits, dtype=U))


def reference_chain(bits: np.ndarray, chain: Chain) -> np.ndarray:
    """A chain of device casts on uint32 bit patterns, as the fused kernel computes it."""
    _check_chain(chain)
    x = np.asarray(bits, dtype=U)
    for src, dst in chain:
        x = _PAIRS[(src, dst)][0](x)
    return x


def cuda_chain_expr(chain: Chain, x: str = "x") -> str:
    """The CUDA expression (on `unsigned int` bits named `x`) that a fused chain kernel evaluates."""
    _check_chain(chain)
    expr = x
    for pair in chain:
        expr = _PAIRS[pair][1].format(x=f"({expr})")
    return expr


_UINT: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}


def reference_cast(x: np.ndarray, dtype) -> np.ndarray:
    """`x.astype(dtype)` computed with the device algorithm (numpy), for a pair in `DEVICE_CASTS`.

    Example:
        >>> import numpy as np
        >>> reference_cast(np.array([1.0, 65520.0], np.float32), np.float16).tolist()
        [1.0, inf]
    """
    src, dst = DType.from_numpy(x.dtype), DType.parse(dtype)
    bits = np.ascontiguousarray(x).view(_UINT[src.size_in_bytes]).astype(U)
    out = reference_bits(bits, src, dst)
    return out.astype(_UINT[dst.size_in_bytes]).view(dst.to_numpy()).reshape(np.shape(x))


_C_UINT = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int"}
_CUPY_UINT = {1: "uint8", 2: "uint16", 4: "uint32"}


def cast_kernel_parts(chain: Chain) -> tuple[str, str, str, str, str]:
    """(in_params, out_params, operation, name, preamble): the ElementwiseKernel arguments `cast_kernel`
    gives CuPy for `chain` (`kernels/cuda_units.py` renders them into the unit CuPy compiles).

    Example:
        >>> from lazyweights.core.dtype import DType
        >>> cast_kernel_parts(((DType.bfloat16, DType.float32),))[:4]
        ('uint16 x', 'uint32 y', 'y = (unsigned int)(((((unsigned int)x)) << 16u));', 'lw_cast_bf16_f32')
    """
    _check_chain(chain)
    src_size, dst_size = chain[0][0].size_in_bytes, chain[-1][1].size_in_bytes
    name = "lw_cast_" + "_".join(f"{a.short}_{b.short}" for a, b in chain)
    body = f"y = ({_C_UINT[dst_size]})({cuda_chain_expr(chain, '((unsigned int)x)')});"
    return f"{_CUPY_UINT[src_size]} x", f"{_CUPY_UINT[dst_size]} y", body, name, cuda_preamble()


@functools.lru_cache(maxsize=None)
def cast_kernel(chain: Chain):
    """A CuPy ElementwiseKernel `k(x, y)` converting the storage-dtype array `x` (unsigned ints of the
    chain's source width) into `y` (unsigned ints of its result width) with the whole chain fused.
    Imports CuPy (call only when a GPU is in use)."""
    import cupy

    in_params, out_params, body, name, preamble = cast_kernel_parts(chain)
    return cupy.ElementwiseKernel(in_params, out_params, body, name, preamble=preamble, options=NVRTC_OPTIONS)
