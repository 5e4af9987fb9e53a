"""GGUF block dequantization on the GPU, equal to the CPU kernels (`lazyweights.quant`) and gguf-py.

Why written twice: as in `cuda_casts.py`, each block type's algorithm is one numpy function
(`_ref_*`, vectorised over output elements: it computes, for arrays of output positions, exactly what one
CUDA thread computes for its position) and, next to it, its CUDA C transcription (`_CUDA_*`), with the
same operations in the same order. The numpy reference is tested bit-exact on the CPU against
`lazyweights.quant.dequantize` and `gguf.quants.dequantize` (`tests/run/test_gpu.py`), which is how the CUDA
code is checked on machines without a GPU. Keep them in lockstep.

Why one thread per output value: every value's inputs (its block's fp16 scales, its sub-block's 6-bit
scale, its packed bits) are a handful of bytes that neighbouring threads share through the L1 cache, the
output writes are perfectly coalesced, and the kernel is then a pure function of the output index, which
the numpy reference mirrors exactly. Dequantization is bound by the float32 writes, not by the
recomputation of scales.

Bit-exactness: ggml (and gguf-py, and the CPU kernels) round every float32 multiply and add separately,
sub-block scale first (`(d * sc) * q - dmin * m`). The CUDA code spells each as `__fmul_rn` / `__fsub_rn` /
`__fadd_rn`, which the compiler never contracts into a fused multiply-add, and the kernels are compiled
with `--fmad=false --ftz=false` as well; fp16 scales are widened with the integer code from
`cuda_casts.py` (payload kept, as `quant/_bits.py`'s `half_to_float`). One documented difference remains:
a block whose fp16 scale is NaN or infinity (no real checkpoint has one) gives NaN values whose payload
bits follow the hardware (x86 keeps the operand's payload; CUDA returns 0x7fffffff). Finite values,
infinities and the NaN positions are identical.

Block types: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K (`DEVICE_DEQUANT`). Others dequantize on
the host. The kernel can also apply a chain of device casts to each value before storing it (a
`dequantize(..., float16)` or a dequantize followed by casts is one kernel).

CuPy is imported only by `dequant_kernel` / `launch`.

Example:
    >>> import numpy as np
    >>> from lazyweights.quant import quantize, dequantize
    >>> from lazyweights.core.quantization import QuantizationEncoding as Q
    >>> from lazyweights.kernels.cuda_dequant import reference_dequantize
    >>> packed = quantize(Q.Q4_0, np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64))
    >>> bool((reference_dequantize(Q.Q4_0, packed) == dequantize(Q.Q4_0, packed)).all())
    True
"""
from __future__ import annotations

import functools

import numpy as np

from ..core.errors import ShapeError
from ..core.quantization import QuantizationEncoding as Q
from .cuda_casts import NVRTC_OPTIONS, U, cuda_chain_expr, cuda_preamble, reference_chain, widen_f16

__all__ = ["DEVICE_DEQUANT", "reference_dequantize", "reference_values", "dequant_kernel", "launch",
           "kernel_source", "module_source"]

F32 = np.float32
I32 = np.int32


# --------------------------------------------------------------------------------------------------------
# Shared helpers. `src` is the flat uint8 buffer, `s` the block's byte offset (int64), `e` the value's index
# inside its block (uint32). The numpy versions take arrays of (s, e); the CUDA versions one pair.

def _b(src, idx):
    """Byte(s) of src at idx, as uint32."""
    return src[idx].astype(U)


def _half(src, s):
    """The little-endian fp16 at byte offset s, as float32 (exact; NaN payload kept, never quieted)."""
    h = _b(src, s) | (_b(src, s + 1) << U(8))
    return widen_f16(h, 0).view(F32)


def _f(x):
    """int -> float32 (exact for the small integers dequantization produces), as `(float)(int)x`."""
    return x.astype(I32).astype(F32)


_CUDA_HELPERS = r"""
__device__ __forceinline__ unsigned int lw_b(const unsigned char* src, long long idx) {
    return (unsigned int)src[idx];
}
__device__ __forceinline__ float lw_half(const unsigned char* src, long long s) {
    unsigned int h = lw_b(src, s) | (lw_b(src, s + 1) << 8u);
    return __uint_as_float(lw_widen_f16(h, 0u));
}
__device__ __forceinline__ float lw_f(unsigned int x) {
    return __int2float_rn((int)x);
}
__device__ __forceinline__ float lw_fi(int x) {
    return __int2float_rn(x);
}
"""


# --------------------------------------------------------------------------------------------------------
# Legacy 32-value blocks.

def _ref_q4_0(src, s, e):
    d = _half(src, s)
    q = _b(src, s + 2 + (e & U(15)))
    q = np.where(e < U(16), q & U(15), q >> U(4))
    return d * _f(q.astype(I32) - I32(8))


_CUDA_Q4_0 = r"""
__device__ __forceinline__ float lw_q4_0(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s);
    unsigned int q = lw_b(src, s + 2 + (e & 15u));
    q = e < 16u ? (q & 15u) : (q >> 4u);
    return __fmul_rn(d, lw_fi((int)q - 8));
}
"""


def _ref_q4_1(src, s, e):
    d = _half(src, s)
    m = _half(src, s + 2)
    q = _b(src, s + 4 + (e & U(15)))
    q = np.where(e < U(16), q & U(15), q >> U(4))
    return d * _f(q) + m


_CUDA_Q4_1 = r"""
__device__ __forceinline__ float lw_q4_1(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s);
    float m = lw_half(src, s + 2);
    unsigned int q = lw_b(src, s + 4 + (e & 15u));
    q = e < 16u ? (q & 15u) : (q >> 4u);
    return __fadd_rn(__fmul_rn(d, lw_f(q)), m);
}
"""


def _ref_q5_0(src, s, e):
    d = _half(src, s)
    h = (_b(src, s + 2 + (e >> U(3))) >> (e & U(7))) & U(1)  # bit e of the little-endian u32 qh
    q = _b(src, s + 6 + (e & U(15)))
    q = np.where(e < U(16), q & U(15), q >> U(4))
    q = q | (h << U(4))
    return d * _f(q.astype(I32) - I32(16))


_CUDA_Q5_0 = r"""
__device__ __forceinline__ float lw_q5_0(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s);
    unsigned int h = (lw_b(src, s + 2 + (e >> 3u)) >> (e & 7u)) & 1u;
    unsigned int q = lw_b(src, s + 6 + (e & 15u));
    q = e < 16u ? (q & 15u) : (q >> 4u);
    q = q | (h << 4u);
    return __fmul_rn(d, lw_fi((int)q - 16));
}
"""


def _ref_q5_1(src, s, e):
    d = _half(src, s)
    m = _half(src, s + 2)
    h = (_b(src, s + 4 + (e >> U(3))) >> (e & U(7))) & U(1)
    q = _b(src, s + 8 + (e & U(15)))
    q = np.where(e < U(16), q & U(15), q >> U(4))
    q = q | (h << U(4))
    return d * _f(q) + m


_CUDA_Q5_1 = r"""
__device__ __forceinline__ float lw_q5_1(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s);
    float m = lw_half(src, s + 2);
    unsigned int h = (lw_b(src, s + 4 + (e >> 3u)) >> (e & 7u)) & 1u;
    unsigned int q = lw_b(src, s + 8 + (e & 15u));
    q = e < 16u ? (q & 15u) : (q >> 4u);
    q = q | (h << 4u);
    return __fadd_rn(__fmul_rn(d, lw_f(q)), m);
}
"""


def _ref_q8_0(src, s, e):
    d = _half(src, s)
    q = _b(src, s + 2 + e)
    return _f((q ^ U(128)).astype(I32) - I32(128)) * d


_CUDA_Q8_0 = r"""
__device__ __forceinline__ float lw_q8_0(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s);
    unsigned int q = lw_b(src, s + 2 + e);
    return __fmul_rn(lw_fi((int)(q ^ 128u) - 128), d);
}
"""


# --------------------------------------------------------------------------------------------------------
# k-quants: 256-value super-blocks. Value e sits in half h = e >> 7 (Q2_K/Q3_K/Q6_K) or chunk c = e >> 6
# (Q4_K/Q5_K); see quant/kquants.py for the layouts.

def _ref_q2_k(src, s, e):
    d = _half(src, s + 80)
    dmin = _half(src, s + 82)
    h = e >> U(7)
    shift = (e >> U(5)) & U(3)
    ll = e & U(31)
    sc = _b(src, s + (e >> U(4)))
    q = (_b(src, s + 16 + h * U(32) + ll) >> (shift * U(2))) & U(3)
    dl = d * _f(sc & U(15))
    ml = dmin * _f(sc >> U(4))
    return dl * _f(q) - ml


_CUDA_Q2_K = r"""
__device__ __forceinline__ float lw_q2_k(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s + 80);
    float dmin = lw_half(src, s + 82);
    unsigned int h = e >> 7u;
    unsigned int shift = (e >> 5u) & 3u;
    unsigned int ll = e & 31u;
    unsigned int sc = lw_b(src, s + (e >> 4u));
    unsigned int q = (lw_b(src, s + 16 + h * 32u + ll) >> (shift * 2u)) & 3u;
    float dl = __fmul_rn(d, lw_f(sc & 15u));
    float ml = __fmul_rn(dmin, lw_f(sc >> 4u));
    return __fsub_rn(__fmul_rn(dl, lw_f(q)), ml);
}
"""


def _ref_q3_k(src, s, e):
    d = _half(src, s + 108)
    h = e >> U(7)
    shift = (e >> U(5)) & U(3)
    ll = e & U(31)
    g = e >> U(4)
    low = (_b(src, s + 96 + (g & U(7))) >> (U(4) * (g >> U(3)))) & U(15)
    high = (_b(src, s + 104 + (g & U(3))) >> (U(2) * (g >> U(2)))) & U(3)
    scale = (low | (high << U(4))).astype(I32) - I32(32)
    q = (_b(src, s + 32 + h * U(32) + ll) >> (shift * U(2))) & U(3)
    hbit = (_b(src, s + ll) >> (U(4) * h + shift)) & U(1)
    val = q.astype(I32) - ((hbit ^ U(1)) << U(2)).astype(I32)  # a CLEAR hmask bit subtracts 4
    dl = d * scale.astype(F32)
    return dl * val.astype(F32)


_CUDA_Q3_K = r"""
__device__ __forceinline__ float lw_q3_k(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s + 108);
    unsigned int h = e >> 7u;
    unsigned int shift = (e >> 5u) & 3u;
    unsigned int ll = e & 31u;
    unsigned int g = e >> 4u;
    unsigned int low = (lw_b(src, s + 96 + (g & 7u)) >> (4u * (g >> 3u))) & 15u;
    unsigned int high = (lw_b(src, s + 104 + (g & 3u)) >> (2u * (g >> 2u))) & 3u;
    int scale = (int)(low | (high << 4u)) - 32;
    unsigned int q = (lw_b(src, s + 32 + h * 32u + ll) >> (shift * 2u)) & 3u;
    unsigned int hbit = (lw_b(src, s + ll) >> (4u * h + shift)) & 1u;
    int val = (int)q - (int)((hbit ^ 1u) << 2u);
    float dl = __fmul_rn(d, lw_fi(scale));
    return __fmul_rn(dl, lw_fi(val));
}
"""


def _scale_min_k4(src, sb, j):
    """ggml's get_scale_min_k4 for chunk j (0..7): both branches computed, then selected.
    `(j - 4) & 7` keeps the unused branch's index inside the 12 scale bytes."""
    bj = _b(src, sb + j)
    bj4 = _b(src, sb + j + U(4))
    bjm4 = _b(src, sb + ((j - U(4)) & U(7)))
    sc = np.where(j < U(4), bj & U(63), (bj4 & U(15)) | ((bjm4 >> U(6)) << U(4)))
    m = np.where(j < U(4), bj4 & U(63), (bj4 >> U(4)) | ((bj >> U(6)) << U(4)))
    return sc, m


_CUDA_SCALE_MIN_K4 = r"""
__device__ __forceinline__ void lw_scale_min_k4(const unsigned char* src, long long sb, unsigned int j,
                                                unsigned int* sc, unsigned int* m) {
    unsigned int bj = lw_b(src, sb + j);
    unsigned int bj4 = lw_b(src, sb + j + 4u);
    unsigned int bjm4 = lw_b(src, sb + ((j - 4u) & 7u));
    *sc = j < 4u ? (bj & 63u) : ((bj4 & 15u) | ((bjm4 >> 6u) << 4u));
    *m = j < 4u ? (bj4 & 63u) : ((bj4 >> 4u) | ((bj >> 6u) << 4u));
}
"""


def _ref_q4_k(src, s, e):
    d = _half(src, s)
    dmin = _half(src, s + 2)
    c = e >> U(6)
    hi = (e >> U(5)) & U(1)
    ll = e & U(31)
    j = c * U(2) + hi
    sc, m = _scale_min_k4(src, s + 4, j)
    q = _b(src, s + 16 + c * U(32) + ll)
    q = np.where(hi != U(0), q >> U(4), q & U(15))
    dl = d * _f(sc)
    ml = dmin * _f(m)
    return dl * _f(q) - ml


_CUDA_Q4_K = r"""
__device__ __forceinline__ float lw_q4_k(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s);
    float dmin = lw_half(src, s + 2);
    unsigned int c = e >> 6u;
    unsigned int hi = (e >> 5u) & 1u;
    unsigned int ll = e & 31u;
    unsigned int j = c * 2u + hi;
    unsigned int sc, m;
    lw_scale_min_k4(src, s + 4, j, &sc, &m);
    unsigned int q = lw_b(src, s + 16 + c * 32u + ll);
    q = hi != 0u ? (q >> 4u) : (q & 15u);
    float dl = __fmul_rn(d, lw_f(sc));
    float ml = __fmul_rn(dmin, lw_f(m));
    return __fsub_rn(__fmul_rn(dl, lw_f(q)), ml);
}
"""


def _ref_q5_k(src, s, e):
    d = _half(src, s)
    dmin = _half(src, s + 2)
    c = e >> U(6)
    hi = (e >> U(5)) & U(1)
    ll = e & U(31)
    j = c * U(2) + hi
    sc, m = _scale_min_k4(src, s + 4, j)
    q = _b(src, s + 48 + c * U(32) + ll)
    q = np.where(hi != U(0), q >> U(4), q & U(15))
    q = q | (((_b(src, s + 16 + ll) >> j) & U(1)) << U(4))
    dl = d * _f(sc)
    ml = dmin * _f(m)
    return dl * _f(q) - ml


_CUDA_Q5_K = r"""
__device__ __forceinline__ float lw_q5_k(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s);
    float dmin = lw_half(src, s + 2);
    unsigned int c = e >> 6u;
    unsigned int hi = (e >> 5u) & 1u;
    unsigned int ll = e & 31u;
    unsigned int j = c * 2u + hi;
    unsigned int sc, m;
    lw_scale_min_k4(src, s + 4, j, &sc, &m);
    unsigned int q = lw_b(src, s + 48 + c * 32u + ll);
    q = hi != 0u ? (q >> 4u) : (q & 15u);
    q = q | (((lw_b(src, s + 16 + ll) >> j) & 1u) << 4u);
    float dl = __fmul_rn(d, lw_f(sc));
    float ml = __fmul_rn(dmin, lw_f(m));
    return __fsub_rn(__fmul_rn(dl, lw_f(q)), ml);
}
"""


def _ref_q6_k(src, s, e):
    d = _half(src, s + 208)
    h = e >> U(7)
    g = (e >> U(5)) & U(3)
    ll = e & U(31)
    a = _b(src, s + h * U(64) + (g & U(1)) * U(32) + ll)
    nib = (a >> (U(4) * (g >> U(1)))) & U(15)
    hi2 = (_b(src, s + 128 + h * U(32) + ll) >> (U(2) * g)) & U(3)
    q = (nib | (hi2 << U(4))).astype(I32) - I32(32)
    sc = (_b(src, s + 192 + (e >> U(4))) ^ U(128)).astype(I32) - I32(128)  # int8 scales
    dl = d * sc.astype(F32)
    return dl * q.astype(F32)


_CUDA_Q6_K = r"""
__device__ __forceinline__ float lw_q6_k(const unsigned char* src, long long s, unsigned int e) {
    float d = lw_half(src, s + 208);
    unsigned int h = e >> 7u;
    unsigned int g = (e >> 5u) & 3u;
    unsigned int ll = e & 31u;
    unsigned int a = lw_b(src, s + h * 64u + (g & 1u) * 32u + ll);
    unsigned int nib = (a >> (4u * (g >> 1u))) & 15u;
    unsigned int hi2 = (lw_b(src, s + 128 + h * 32u + ll) >> (2u * g)) & 3u;
    int q = (int)(nib | (hi2 << 4u)) - 32;
    int sc = (int)(lw_b(src, s + 192 + (e >> 4u)) ^ 128u) - 128;
    float dl = __fmul_rn(d, lw_fi(sc));
    return __fmul_rn(dl, lw_fi(q));
}
"""


# encoding -> (numpy reference, CUDA source, CUDA function name)
_KERNELS = {
    Q.Q4_0: (_ref_q4_0, _CUDA_Q4_0, "lw_q4_0"),
    Q.Q4_1: (_ref_q4_1, _CUDA_Q4_1, "lw_q4_1"),
    Q.Q5_0: (_ref_q5_0, _CUDA_Q5_0, "lw_q5_0"),
    Q.Q5_1: (_ref_q5_1, _CUDA_Q5_1, "lw_q5_1"),
    Q.Q8_0: (_ref_q8_0, _CUDA_Q8_0, "lw_q8_0"),
    Q.Q2_K: (_ref_q2_k, _CUDA_Q2_K, "lw_q2_k"),
    Q.Q3_K: (_ref_q3_k, _CUDA_Q3_K, "lw_q3_k"),
    Q.Q4_K: (_ref_q4_k, _CUDA_Q4_K, "lw_q4_k"),
    Q.Q5_K: (_ref_q5_k, _CUDA_Q5_K, "lw_q5_k"),
    Q.Q6_K: (_ref_q6_k, _CUDA_Q6_K, "lw_q6_k"),
}

#: Block types the GPU dequantizes on the device.
DEVICE_DEQUANT = frozenset(_KERNELS)


def reference_values(encoding, src: np.ndarray, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Values [start, stop) of the flat dequantized stream of packed bytes `src`, computed the way the CUDA
    kernel's threads compute them (one output index each). float32, 1-D."""
    enc = Q.parse_required(encoding, "reference_values")
    ref = _KERNELS[enc][0]
    src = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
    n = src.size // enc.block_bytes * enc.block_elements
    stop = n if stop is None else stop
    i = np.arange(start, stop, dtype=np.int64)
    b = i // enc.block_elements
    e = (i - b * enc.block_elements).astype(U)
    with np.errstate(all="ignore"):
        return ref(src, b * enc.block_bytes, e).astype(F32, copy=False)


def reference_dequantize(encoding, src: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
    """Dequantize packed blocks uint8 [rows, row_bytes] (or 1-D) with the device algorithm, in numpy:
    float32 [rows, row_values], like `lazyweights.quant.dequantize`. Works in chunks of `chunk` values."""
    enc = Q.parse_required(encoding, "reference_dequantize")
    src = np.ascontiguousarray(src)
    flat = src.reshape(-1)
    n = flat.size // enc.block_bytes * enc.block_elements
    out = np.empty(n, F32)
    for a in range(0, n, chunk):
        out[a:a + chunk] = reference_values(enc, flat, a, min(n, a + chunk))
    if src.ndim <= 1:
        return out
    return out.reshape(src.shape[:-1] + (src.shape[-1] // enc.block_bytes * enc.block_elements,))


def reference_dequantize_chain(encoding, src: np.ndarray, chain) -> np.ndarray:
    """The fused kernel's stored bits: dequantize, then a chain of device casts on the float32 bits
    (uint32 bits out, or float32 values when the chain is empty)."""
    values = reference_dequantize(encoding, src).reshape(-1)
    if not chain:
        return values
    return reference_chain(values.view(U), chain)


# --------------------------------------------------------------------------------------------------------
# CUDA.

_C_UINT = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int"}


def _wrapper(enc, chain) -> tuple[str, str]:
    """The `__global__` kernel (grid-stride loop, one output value per iteration) and its name."""
    out_size = chain[-1][1].size_in_bytes if chain else 4
    store = cuda_chain_expr(tuple(chain), "__float_as_uint(v)") if chain else "__float_as_uint(v)"
    name = f"lw_dequant_{enc.name.lower()}" + "".join(f"_{b.short}" for _, b in chain)
    fn = _KERNELS[enc][2]
    text = f"""
extern "C" __global__ void {name}(const unsigned char* __restrict__ src, {_C_UINT[out_size]}* __restrict__ out,
                                  long long n) {{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
        long long b = i / {enc.block_elements}LL;
        unsigned int e = (unsigned int)(i - b * {enc.block_elements}LL);
        float v = {fn}(src, b * {enc.block_bytes}LL, e);
        out[i] = ({_C_UINT[out_size]})({store});
    }}
}}
"""
    return text, name


def module_source(specs) -> tuple[str, list[str]]:
    """One translation unit holding the kernels for every (encoding, chain) in `specs`, and their names.
    (The tests compile this as host C++ to run the exact CUDA text on the CPU.)"""
    specs = [(Q.parse(e), tuple(c)) for e, c in specs]
    encs = sorted({e for e, _ in specs}, key=lambda e: e.name)
    wrappers = [_wrapper(e, c) for e, c in specs]
    text = (cuda_preamble() + _CUDA_HELPERS + _CUDA_SCALE_MIN_K4 + "".join(_KERNELS[e][1] for e in encs)
            + "".join(w for w, _ in wrappers))
    return text, [n for _, n in wrappers]


def kernel_source(encoding, chain=()) -> tuple[str, str]:
    """(CUDA source, kernel name) of the fused dequantize(+casts) kernel for `encoding`."""
    text, names = module_source([(encoding, chain)])
    return text, names[0]


@functools.lru_cache(maxsize=None)
def dequant_kernel(encoding, chain=()):
    """The CuPy RawKernel for `encoding` followed by the device cast `chain` (imports CuPy)."""
    import cupy

    src, name = kernel_source(encoding, chain)
    return cupy.RawKernel(src, name, options=NVRTC_OPTIONS)


_THREADS = 256
_MAX_BLOCKS = 1 << 16  # grid-stride loop beyond this


def launch(encoding, chain, src, out, stream=None) -> None:
    """Dequantize the packed bytes `src` (a flat uint8 CuPy array of whole blocks) into `out` (a flat
    CuPy array of the chain's result width, or float32) on `stream`."""
    import cupy

    enc = Q.parse_required(encoding, "launch")
    n = src.size // enc.block_bytes * enc.block_elements
    if out.size != n:
        raise ShapeError(f"dequantize {enc.name}: {src.size} packed bytes give {n} values, output has {out.size}")
    if n == 0:
        return
    kernel = dequant_kernel(enc, tuple(chain))
    blocks = min(_MAX_BLOCKS, -(-n // _THREADS))
    with stream if stream is not None else cupy.cuda.get_current_stream():
        kernel((blocks,), (_THREADS,), (src, out, np.int64(n)))


