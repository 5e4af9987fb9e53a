"""The K-quant / IQ4 encoders and the preset port against ggml and llama.cpp themselves.

Independent references:
  * tests/kernels/quant_fixtures/expected.npz: bytes written by llama-cpp-python's `ggml_quantize_chunk`
    (tests/kernels/quant_fixtures/make_fixtures.py), checked in so these run without llama_cpp;
  * live ggml through the same ctypes call, on fresh inputs, where llama_cpp is importable;
  * gguf-py's `gguf.quants.dequantize` for the round trip;
  * `llama_model_quantize` on tiny bf16 GGUFs (tests/kernels/quant_fixtures/tiny_model.py) for the preset
    choices and, in the same files, the bytes of every quantized tensor.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize

from lazyweights.core.errors import DTypeError, ImatrixShapeError, LazyWeightsError, UnknownPresetError
from lazyweights.core.quantization import QuantizationEncoding as Q
from lazyweights.quant import dequantize, implementation, quantize, quantize_into, supported_quantize
from lazyweights.quant.presets import PRESETS, TypeChoice, model_tensor_types, tensor_type

FIXTURES = Path(__file__).parent / "quant_fixtures"


def _load_fixture_module(name: str):
    """A helper script of quant_fixtures/, imported from its file (no sys.path edit)."""
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


mf = _load_fixture_module("make_fixtures")
tm = _load_fixture_module("tiny_model")

NEW_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
TERNARY = ["TQ1_0", "TQ2_0"]
HAVE_LLAMA = mf.find_libggml_base() is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama_cpp (llama-cpp-python) is not installed")


@pytest.fixture(scope="module")
def fixtures():
    return np.load(FIXTURES / "inputs.npz"), np.load(FIXTURES / "expected.npz")


def _compare(t: str, x: np.ndarray, imatrix, want: np.ndarray) -> list[str]:
    with np.errstate(all="ignore"):
        got = quantize(t, x, imatrix=imatrix)
    assert got.shape == want.shape and got.dtype == np.uint8
    bad = (got != want).any(1)
    return [f"row {r}: first differing byte {int(np.argmax(got[r] != want[r]))}" for r in np.nonzero(bad)[0]]


# --- bit identity against the committed ggml bytes -----------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "imatrix"])
@pytest.mark.parametrize("t", NEW_TYPES + LEGACY + TERNARY)
def test_bytes_equal_ggml_fixtures(fixtures, t, mode):
    inputs, expected = fixtures
    imatrix = inputs["imatrix"] if mode == "imatrix" else None
    failures = {}
    for cls in mf.CLASSES:
        want = expected[f"{t}/{cls}/{mode}"]
        # a meaningful comparison: ggml wrote more than zeros (a constant row may be mostly zero codes)
        # (1e-30 is below ggml's GROUP_MAX_EPS of 1e-15, and at 1e30 Q6_K's x*x weights overflow so every
        # scale is NaN: ggml codes those blocks as zeros, and so must we)
        if cls in ("normal", "student_t", "small"):
            assert np.count_nonzero(want) > want.size // 4, (t, cls, mode)
        elif cls in ("constant", "specials"):
            assert np.count_nonzero(want) > 0, (t, cls, mode)
        bad = _compare(t, inputs[cls], imatrix, want)
        if bad:
            failures[cls] = bad[:3]
    assert not failures, f"{t} ({mode}) differs from ggml_quantize_chunk: {failures}"


def test_fixtures_cover_every_type_class_and_mode(fixtures):
    _, expected = fixtures
    want = {f"{t}/{c}/{m}" for t in NEW_TYPES + LEGACY + TERNARY for c in mf.CLASSES for m in ("none", "imatrix")}
    assert set(expected.files) == want
    total = sum(p.stat().st_size for p in FIXTURES.iterdir() if p.is_file())
    assert total < 1_000_000


def test_imatrix_changes_the_bytes(fixtures):
    # the two paths really differ (otherwise the imatrix fixtures would test nothing new)
    inputs, expected = fixtures
    for t in NEW_TYPES + ["Q4_0", "Q4_1", "Q5_0", "Q5_1"]:
        assert not np.array_equal(expected[f"{t}/normal/none"], expected[f"{t}/normal/imatrix"]), t
    # ...except Q8_0, whose quantize_q8_0 ignores the importance matrix
    assert np.array_equal(expected["Q8_0/normal/none"], expected["Q8_0/normal/imatrix"])


# --- live ggml --------------------------------------------------------------------------------------------


@needs_llama
@pytest.mark.parametrize("t", NEW_TYPES + LEGACY)
def test_bytes_equal_live_ggml(t):
    inputs = mf.make_inputs(seed=1234)  # other values than the committed fixtures
    rng = np.random.default_rng(99)
    imatrices = {
        "none": None,
        "imatrix": inputs["imatrix"],
        "uniform": np.ones(mf.N_PER_ROW, np.float32),
        "spiky": (rng.pareto(1.0, mf.N_PER_ROW) * (rng.random(mf.N_PER_ROW) < 0.5)).astype(np.float32),
    }
    failures = {}
    for cls in mf.CLASSES:
        for name, w in imatrices.items():
            with np.errstate(all="ignore"):
                want = mf.ggml_quantize(t, inputs[cls], w)
            bad = _compare(t, inputs[cls], w, want)
            if bad:
                failures[f"{cls}/{name}"] = bad[:3]
    assert not failures, f"{t} differs from live ggml: {failures}"


@needs_llama
def test_bytes_equal_live_ggml_many_shapes():
    # row lengths of 1..6 super-blocks, single rows and many, scales from 1e-8 to 1e8
    rng = np.random.default_rng(5)
    for t in NEW_TYPES:
        be = Q[t].block_elements
        for n_blocks in (1, 3, 6):
            n = 256 * n_blocks if be == 256 else 32 * n_blocks
            x = (rng.standard_normal((5, n)) * 10.0 ** rng.uniform(-8, 8, (5, 1))).astype(np.float32)
            w = rng.random(n).astype(np.float32)
            for im in (None, w):
                assert np.array_equal(quantize(t, x, imatrix=im), mf.ggml_quantize(t, x, im)), (t, n, im is None)


# --- round trip through gguf-py's dequantizer -------------------------------------------------------------

# RMS error / RMS value on standard normal data, with and without an importance matrix (measured values,
# about 20% below these bounds): the bits per weight set the scale (Q2_K 2.6 ... Q6_K 6.6)
RELATIVE_RMSE = {"Q2_K": 0.36, "Q3_K": 0.19, "Q4_K": 0.09, "Q5_K": 0.045, "Q6_K": 0.022, "IQ4_NL": 0.095,
                 "IQ4_XS": 0.095}


@pytest.mark.parametrize("t", NEW_TYPES)
def test_round_trip_through_gguf_py(t):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 1024)).astype(np.float32)
    for im in (None, (rng.random(1024) + 0.1).astype(np.float32)):
        packed = quantize(t, x, imatrix=im)
        y = gguf_dequantize(packed, GT[t]).reshape(x.shape)
        assert np.array_equal(y, dequantize(t, packed))  # the two dequantizers agree on these bytes
        rel = float(np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x**2)))
        assert 0.001 < rel < RELATIVE_RMSE[t], (t, im is None, rel)


def test_round_trip_of_zero_and_constant_rows():
    for t in NEW_TYPES:
        z = np.zeros((2, 256), np.float32)
        assert np.array_equal(gguf_dequantize(quantize(t, z), GT[t]).reshape(z.shape), z)
        c = np.full((2, 256), 0.5, np.float32)
        y = gguf_dequantize(quantize(t, c), GT[t]).reshape(c.shape)
        assert np.abs(y - c).max() < 0.05, t


# --- the API around the kernels --------------------------------------------------------------------------


def test_registered_and_take_an_imatrix():
    # Every type takes an importance matrix (Q8_0 ignores it, as ggml's quantizer does); the C kernels
    # release the GIL around their loops (test_quantize_compiled.py measures it).
    assert {Q[t] for t in NEW_TYPES + LEGACY} <= supported_quantize()
    from lazyweights.quant import registry

    for t in NEW_TYPES + LEGACY:
        fn = registry.kernel("quantize", Q[t])
        assert fn.takes_imatrix and implementation(t, "quantize") == "c", t


@pytest.mark.parametrize("t", NEW_TYPES)
def test_quantizing_quantized_data_raises_dtype_error(t):
    packed = quantize(t, np.ones((2, 256), np.float32))
    with pytest.raises(DTypeError, match=f"{t}.*uint8"):
        quantize(t, packed)
    with pytest.raises(DTypeError, match="uint8"):
        quantize_into(t, packed, np.empty_like(packed))


def test_quantize_into_and_1d_rows_agree():
    x = np.random.default_rng(4).standard_normal((3, 512)).astype(np.float32)
    w = np.random.default_rng(5).random(512).astype(np.float32)
    for t in NEW_TYPES:
        want = quantize(t, x, imatrix=w)
        out = np.zeros_like(want)
        quantize_into(t, x, out, imatrix=w)
        assert np.array_equal(out, want)
        assert np.array_equal(quantize(t, x[1], imatrix=w), want[1])
        # float64 / float16 inputs are converted to float32 first
        assert np.array_equal(quantize(t, x.astype(np.float64), imatrix=w), want)


def test_imatrix_length_mismatch_names_tensor_and_both_lengths():
    x = np.zeros((2, 512), np.float32)
    with pytest.raises(ImatrixShapeError, match=r"'blk\.3\.ffn_down\.weight' has 256 entries but its rows have 512"):
        quantize("Q4_K", x, imatrix=np.ones(256, np.float32), name="blk.3.ffn_down.weight")
    assert issubclass(ImatrixShapeError, LazyWeightsError) and issubclass(ImatrixShapeError, ValueError)
    # ggml's TQ1_0 quantizer takes and ignores an importance matrix (as llama-quantize does with --imatrix)
    x = np.random.default_rng(2).standard_normal((2, 256)).astype(np.float32)
    assert np.array_equal(quantize("TQ1_0", x, imatrix=np.ones(256, np.float32)), quantize("TQ1_0", x))
    with pytest.raises(ImatrixShapeError, match="TQ1_0"):  # but its length is still checked
        quantize("TQ1_0", x, imatrix=np.ones(255, np.float32))


def test_shape_errors_name_the_shapes():
    with pytest.raises(LazyWeightsError, match=r"\(2, 100\)"):
        quantize("Q4_K", np.zeros((2, 100), np.float32))


# --- presets: the pure port -------------------------------------------------------------------------------


def _dense_types(preset, **kw):
    spec = tm.ModelSpec(**kw)
    return spec, model_tensor_types(preset, tm.tensor_shapes(spec), n_layer=spec.n_layer, n_expert=spec.n_expert,
                                    n_gqa=spec.n_head // spec.n_head_kv,
                                    source_types={n: "F32" for n in tm.tensor_shapes(spec)})


def test_preset_q4_k_m_on_a_16_layer_model():
    spec, types = _dense_types("Q4_K_M")
    # use_more_bits(i, 16): i < 2, i >= 14, or (i - 2) % 3 == 2
    more = {0, 1, 4, 7, 10, 13, 14, 15}
    for i in range(16):
        want = "Q6_K" if i in more else "Q4_K"
        assert types[f"blk.{i}.attn_v.weight"].type == want, i
        assert types[f"blk.{i}.ffn_down.weight"].type == want, i
        assert types[f"blk.{i}.attn_q.weight"] == TypeChoice("Q4_K", None)
        assert types[f"blk.{i}.attn_norm.weight"].type == "F32"
    assert types["output.weight"] == TypeChoice("Q6_K", "output -> Q6_K")
    assert types["token_embd.weight"] == TypeChoice("Q4_K", None)  # untied: the preset's type
    assert "use_more_bits" in types["blk.0.attn_v.weight"].reason


def test_preset_tied_embeddings_quantize_token_embd_as_the_output():
    _, types = _dense_types("Q4_K_M", tied=True)
    assert "output.weight" not in types
    assert types["token_embd.weight"] == TypeChoice("Q6_K", "tied token_embd (is the output) -> Q6_K")
    _, types = _dense_types("Q8_0", tied=True)
    assert types["token_embd.weight"] == TypeChoice("Q8_0", None)


def test_preset_other_rules():
    _, q2 = _dense_types("Q2_K")  # n_gqa = 4
    assert q2["blk.5.attn_v.weight"].type == "Q4_K" and q2["blk.5.ffn_down.weight"].type == "Q3_K"
    assert q2["blk.5.attn_output.weight"].type == "Q3_K" and q2["blk.5.attn_q.weight"].type == "Q2_K"
    _, q2 = _dense_types("Q2_K", n_head_kv=4)  # n_gqa = 1
    assert q2["blk.5.attn_v.weight"].type == "Q3_K"
    _, q3 = _dense_types("Q3_K_M")
    assert [q3[f"blk.{i}.attn_v.weight"].type for i in (0, 1, 2)] == ["Q5_K", "Q5_K", "Q4_K"]
    assert [q3[f"blk.{i}.ffn_down.weight"].type for i in (0, 1)] == ["Q5_K", "Q4_K"]  # 16 layers: n/16 = 1
    _, q4s = _dense_types("Q4_K_S")
    assert [q4s[f"blk.{i}.attn_v.weight"].type for i in (3, 4)] == ["Q5_K", "Q4_K"]
    assert [q4s[f"blk.{i}.ffn_down.weight"].type for i in (1, 2)] == ["Q5_K", "Q4_K"]
    assert tensor_type("Q4_0", "blk.0.ffn_down.weight", (256, 256), n_layer=16, has_imatrix=True).type == "Q4_1"
    assert tensor_type("Q4_0", "blk.0.ffn_down.weight", (256, 256), n_layer=16).type == "Q4_0"


def test_preset_moe_expert_tensors():
    spec = tm.ModelSpec(n_layer=8, n_expert=8, n_head_kv=4)
    shapes = tm.tensor_shapes(spec)
    types = model_tensor_types("Q4_K_M", shapes, n_layer=8, n_expert=8)
    assert types["blk.0.ffn_gate_inp.weight"].reason.startswith("not quantized")
    assert types["blk.3.attn_v.weight"] == TypeChoice("Q8_0", "attn_v: 8-expert model -> Q8_0")
    assert types["blk.3.attn_k.weight"].type == "Q8_0" and types["blk.3.attn_output.weight"].type == "Q5_K"
    assert types["blk.0.ffn_down_exps.weight"].type == "Q6_K" and types["blk.2.ffn_down_exps.weight"].type == "Q4_K"
    assert types["blk.2.ffn_up_exps.weight"].type == "Q4_K"


# Gemma 3 270M: 640-wide rows. llama.cpp's fallback table for the rows that are not a multiple of 256.
@pytest.mark.parametrize(
    "preset,want",
    [("Q2_K", "Q4_0"), ("Q3_K_M", "Q4_0"), ("Q4_K_M", "Q5_0"), ("Q4_K_S", "Q5_0"), ("Q5_K_M", "Q5_1"),
     ("Q5_K_S", "Q5_1"), ("Q6_K", "Q8_0"), ("Q8_0", "Q8_0"), ("Q4_0", "Q4_0")],
)
def test_preset_fallback_for_640_wide_rows(preset, want):
    got = tensor_type(preset, "blk.5.attn_q.weight", (1024, 640), n_layer=18)
    assert got.type == want
    if want != PRESETS[preset]:
        assert "640 columns not a multiple of 256" in got.reason
    # rows that are not even a multiple of 32 fall back to F16
    assert tensor_type(preset, "blk.5.attn_q.weight", (64, 100), n_layer=18) == TypeChoice(
        "F16", f"100 columns not a multiple of {32 if PRESETS[preset] in ('Q8_0', 'Q4_0') else 256} "
        f"(for {PRESETS[preset]}) -> F16")
    # the tied token_embd is the output: Q8_0 when its rows are not whole blocks of the preset's type
    emb = tensor_type(preset, "token_embd.weight", (262144, 640), n_layer=18, tied_embeddings=True)
    # (256-block presets: 640 % 256 -> Q8_0 directly; Q4_0: Q6_K, whose fallback is Q8_0; Q8_0 stays)
    assert emb.type == "Q8_0"


def test_unknown_preset_lists_the_presets():
    with pytest.raises(UnknownPresetError,
                       match="Q4_K_XL.*Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, Q3_K_M, Q2_K, Q4_0"):
        tensor_type("Q4_K_XL", "blk.0.attn_q.weight", (256, 256), n_layer=1)
    assert issubclass(UnknownPresetError, LazyWeightsError) and issubclass(UnknownPresetError, ValueError)
    assert tensor_type("q4_k_m", "blk.0.attn_q.weight", (256, 256), n_layer=1).type == "Q4_K"


# --- presets and bytes against llama.cpp itself ----------------------------------------------------------

LIVE_MODELS = {
    "dense16": tm.ModelSpec(),
    "tied640": tm.ModelSpec(n_layer=8, n_embd=640, n_ff=512, n_head=4, n_head_kv=1, tied=True),
    "moe4": tm.ModelSpec(n_layer=8, n_expert=4, n_ff=256),
    "moe8": tm.ModelSpec(n_layer=8, n_expert=8, n_ff=256, n_head_kv=4),
}


def _imatrix_for(spec: tm.ModelSpec) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    out = {}
    for name, shape in tm.tensor_shapes(spec).items():
        if len(shape) >= 2:
            n = shape[-1] * (shape[0] if len(shape) == 3 else 1)
            out[name] = np.abs(rng.standard_normal(n)).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {k: tm.write_tiny_gguf(s, str(d / f"{k}.gguf")) for k, s in LIVE_MODELS.items()}


@needs_llama
@pytest.mark.parametrize("model", list(LIVE_MODELS))
@pytest.mark.parametrize("has_imatrix", [False, True])
def test_preset_types_equal_llama_model_quantize(tiny_models, tmp_path, model, has_imatrix):
    spec = LIVE_MODELS[model]
    shapes = tm.tensor_shapes(spec)
    sources = {n: ("F32" if len(s) == 1 else "BF16") for n, s in shapes.items()}
    imatrix = _imatrix_for(spec) if has_imatrix else None
    mismatches = {}
    for preset in PRESETS:
        dst = str(tmp_path / f"{preset}.gguf")
        tm.llama_quantize(tiny_models[model], dst, preset, imatrix=imatrix)
        theirs = tm.read_types(dst)
        walk = model_tensor_types(preset, shapes, n_layer=spec.n_layer, n_expert=spec.n_expert,
                                  has_imatrix=has_imatrix, n_gqa=spec.n_head // spec.n_head_kv, source_types=sources)
        assert set(theirs) == set(walk)
        for name, t in theirs.items():
            pure = tensor_type(preset, name, shapes[name], n_layer=spec.n_layer, n_expert=spec.n_expert,
                               tied_embeddings=spec.tied, has_imatrix=has_imatrix, n_gqa=spec.n_head // spec.n_head_kv,
                               source_type=sources[name])
            if walk[name].type != t or pure.type != t:
                mismatches[f"{preset}/{name}"] = (t, walk[name].type, pure.type)
        if preset in ("Q4_K_M", "Q3_K_M", "Q2_K"):
            # a meaningful comparison: the preset mixes several quantized types in this model
            assert len({t for t in theirs.values() if t not in ("F32", "BF16")}) >= 2, (preset, model)
    assert not mismatches, mismatches


@needs_llama
@pytest.mark.parametrize("model", ["dense16", "tied640", "moe4"])
@pytest.mark.parametrize("preset", ["Q4_K_M", "Q3_K_M", "Q2_K"])
def test_llama_quantize_bytes_equal_lazyweights(tiny_models, tmp_path, model, preset):
    # every quantized tensor llama-quantize writes, with an importance matrix (per expert for stacked experts)
    spec = LIVE_MODELS[model]
    values = tm.tensor_values(spec)
    imatrix = _imatrix_for(spec)
    dst = str(tmp_path / "out.gguf")
    tm.llama_quantize(tiny_models[model], dst, preset, imatrix=imatrix, nthread=2)
    types, data = tm.read_types(dst), tm.read_tensor_bytes(dst)
    checked = 0
    for name, t in types.items():
        if t in ("F32", "BF16", "F16"):
            continue
        x, w = values[name], imatrix[name]
        if x.ndim == 3:
            w = w.reshape(x.shape[0], -1)
            ours = np.concatenate([quantize(t, x[e], imatrix=w[e], name=name) for e in range(x.shape[0])])
        else:
            ours = quantize(t, x, imatrix=w, name=name)
        assert np.array_equal(ours, data[name].reshape(ours.shape)), (name, t)
        checked += 1
    assert checked >= len(types) // 2


def test_doctests_of_the_new_modules():
    import doctest

    from lazyweights.formats import imatrix
    from lazyweights.quant import c_kernels, presets, registry

    for mod in (c_kernels, presets, registry, imatrix):
        res = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert res.failed == 0 and res.attempted > 0, mod.__name__
