"""The families whose hyperparameters moved from hand-written code onto their records (issue 27): Phi-3's partial
rotary factor and LongRoPE, Llama 3.1's "llama3" RoPE scaling, Gemma 2/3's keys, each judged by llama.cpp and
transformers as in test_arch_breadth (tiny random model, save_pretrained, the shared tiny tokenizer):

(a) HF -> GGUF (`export_gguf`); llama.cpp's next-token distribution equals transformers' (max KL < 1e-3, same
    argmax away from near ties);
(b) GGUF -> HF (`export_hf_folder`, float32) loads in transformers with the original logits and RoPE parameters.

The GGUF keys of the moved families are pinned to what the hand-written code wrote (key for key, in order), so
the GGUF header bytes did not change.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_arch_breadth import _kl, _logits, llama_cpp_logits  # noqa: E402
from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402
from lazyweights.convert.to_gguf import gguf_metadata_from_hf  # noqa: E402
from lazyweights.convert.to_hf import hf_config_from_gguf  # noqa: E402
from lazyweights.core.errors import ConfigError, GGUFConfigError  # noqa: E402

_TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=2)


_SHARPEN = 6.0  # q/k and output weights scaled up: sharp attention and next-token distributions, so a RoPE
# mistake moves the KL well past the judge's 1e-3 (each test checks that against the model under a wrong config)


def _save(cfg, tok, folder, drop_top_level=()):
    """A random model for `cfg` (1-D weights moved off their init) saved with the tokenizer; `drop_top_level`
    config.json keys are removed, as transformers 5 writes them only inside rope_parameters."""
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
            if n.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight", "lm_head.weight")):
                p.mul_(_SHARPEN)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    path = os.path.join(folder, "config.json")
    with open(path) as fh:
        doc = json.load(fh)
    for k in drop_top_level:
        doc.pop(k, None)
    with open(path, "w") as fh:
        json.dump(doc, fh)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _with_config(model, cfg, ids):
    """Logits of `model`'s weights under another config (a check that the judged difference is visible)."""
    cfg.vocab_size = model.config.vocab_size
    other = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    other.load_state_dict(model.state_dict())
    return _logits(other, ids)


def _judge(ref, mine, ids, what):
    kl = _kl(ref, mine)
    assert kl.max() < 1e-3, f"{what}: llama.cpp's next-token distribution differs, max KL {kl.max():.3g}"
    top2 = np.sort(ref, -1)[:, -2:]
    ties = (top2[:, 1] - top2[:, 0]) < 1e-3
    assert ((mine.argmax(-1) == ref.argmax(-1)) | ties).all(), what
    assert (~ties).sum() >= 0.9 * len(ids)


def _fields(path):
    r = gguf.GGUFReader(path)
    return r, {t.name: np.asarray(t.data) for t in r.tensors}


def _field(r, key):
    f = r.fields[key]
    return f.contents()


def _back(path, tmp_path):
    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        doc = json.load(fh)
    return doc, transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()


def test_phi3_partial_rotary_inside_rope_parameters(tokenizer, tmp_path):  # noqa: F811
    """transformers 5 writes Phi-3's partial_rotary_factor inside rope_parameters (Phi-4-mini: 0.75); the GGUF's
    rope.dimension_count is 0.75 * head_dim, not the whole head (the hand-written code read only the top-level
    key and gave 16 here)."""
    hf = str(tmp_path / "hf")
    cfg = transformers.Phi3Config(**_TINY, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                            "partial_rotary_factor": 0.75})
    model = _save(cfg, tokenizer, hf, drop_top_level=("partial_rotary_factor",))
    with open(os.path.join(hf, "config.json")) as fh:
        doc = json.load(fh)
    assert "partial_rotary_factor" not in doc and doc["rope_parameters"]["partial_rotary_factor"] == 0.75
    assert model.model.rotary_emb.inv_freq.numel() == 6  # transformers rotates 12 of the 16 dims
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)
    assert _kl(ref, _with_config(model, transformers.Phi3Config(**_TINY), ids)).max() > 1e-2  # all 16 dims: fails

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r, _ = _fields(path)
    assert _field(r, "phi3.rope.dimension_count") == 12
    _judge(ref, llama_cpp_logits(path, ids), ids, "phi3 partial rotary")

    doc, m = _back(path, tmp_path)
    assert doc["rope_parameters"]["partial_rotary_factor"] == 0.75
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_phi3_longrope_both_ways(tokenizer, tmp_path):  # noqa: F811
    """Phi-3 LongRoPE (rope_type "longrope", short/long factors, original_max_position_embeddings): the factors
    become llama.cpp's rope_factors_{long,short}.weight and rope.scaling.attn_factor as its converter writes them.
    llama.cpp picks the factors by its context size (128 here, past the original 64: the long ones), transformers
    by the sequence's length, so llama.cpp is judged against transformers computing past the original context
    (the long factors and the attention factor); GGUF -> HF gives the same rope_parameters and logits back."""
    rng = np.random.default_rng(0)
    short = [float(x) for x in np.round(1 + rng.random(8), 3)]
    long = [float(x) for x in np.round(2 + 4 * rng.random(8), 3)]
    params = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long,
              "original_max_position_embeddings": 64}
    hf = str(tmp_path / "hf")
    cfg = transformers.Phi3Config(**_TINY, rope_parameters=params, original_max_position_embeddings=64)
    model = _save(cfg, tokenizer, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)  # a short prompt: transformers uses the short factors

    def under(**changes):
        return _with_config(model, transformers.Phi3Config(**_TINY, original_max_position_embeddings=64,
                                                           rope_parameters=dict(params, **changes)), ids)

    ref_long = under(short_factor=long)  # transformers past the original context
    assert _kl(ref_long, ref).max() > 1e-2  # which factors: visible
    assert _kl(ref_long, under(short_factor=long, attention_factor=1.0)).max() > 1e-2  # the attention factor too
    assert _kl(ref_long, _with_config(model, transformers.Phi3Config(**_TINY), ids)).max() > 1e-2  # LongRoPE at all

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r, tensors = _fields(path)
    np.testing.assert_array_equal(tensors["rope_factors_long.weight"], np.float32(long))
    np.testing.assert_array_equal(tensors["rope_factors_short.weight"], np.float32(short))
    assert _field(r, "phi3.rope.scaling.original_context_length") == 64
    assert _field(r, "phi3.rope.scaling.attn_factor") == pytest.approx(math.sqrt(1 + math.log(2) / math.log(64)))
    _judge(ref_long, llama_cpp_logits(path, ids), ids, "phi3 longrope")

    doc, m = _back(path, tmp_path)
    got = doc["rope_parameters"]
    assert (got["rope_type"], got["original_max_position_embeddings"]) == ("longrope", 64)
    np.testing.assert_array_equal(np.float32(got["short_factor"]), np.float32(short))
    np.testing.assert_array_equal(np.float32(got["long_factor"]), np.float32(long))
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_phi3_longrope_factor_count_is_checked(tokenizer, tmp_path):  # noqa: F811
    hf = str(tmp_path / "hf")
    cfg = transformers.Phi3Config(**_TINY, original_max_position_embeddings=64, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
        "original_max_position_embeddings": 64})
    _save(cfg, tokenizer, hf)
    with open(os.path.join(hf, "config.json")) as fh:
        doc = json.load(fh)
    doc["rope_parameters"]["long_factor"] = [2.0] * 7
    with open(os.path.join(hf, "config.json"), "w") as fh:
        json.dump(doc, fh)
    with pytest.raises(ConfigError, match="long_factor has 7 values; the 16 rotary dimensions need 8"):
        export_gguf(hf, str(tmp_path / "x.gguf"))
    assert not (tmp_path / "x.gguf").exists()


def test_llama31_rope_parameters_both_ways(tokenizer, tmp_path):  # noqa: F811
    """Llama 3.1-style rope_parameters (rope_type "llama3"): llama.cpp reads the scaling from rope_freqs.weight
    only, and computes transformers' distribution; GGUF -> HF recovers rope_parameters from that tensor."""
    params = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    hf = str(tmp_path / "hf")
    model = _save(transformers.LlamaConfig(**_TINY, rope_parameters=params), tokenizer, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)
    plain = transformers.LlamaConfig(**_TINY, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    assert _kl(ref, _with_config(model, plain, ids)).max() > 1e-2  # the scaling matters
    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    _, tensors = _fields(path)
    freqs = tensors["rope_freqs.weight"]
    assert (freqs != 1).any() and (freqs == 1).any()  # some frequencies scaled, some not
    _judge(ref, llama_cpp_logits(path, ids), ids, "llama3 rope")

    doc, m = _back(path, tmp_path)
    assert doc["rope_parameters"] == params
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


# the keys the hand-written code wrote for these configs (recorded from main at 0d6bb11, before the move)
_PINNED = {
    "phi3": (dict(model_type="phi3", original_max_position_embeddings=4096, sliding_window=32, rope_theta=5e5),
             [("context_length", 128), ("embedding_length", 64), ("block_count", 8), ("feed_forward_length", 96),
              ("attention.head_count", 4), ("attention.head_count_kv", 2), ("attention.layer_norm_rms_epsilon", 1e-5),
              ("rope.freq_base", 5e5), ("rope.dimension_count", 16), ("rope.scaling.original_context_length", 4096),
              ("vocab_size", 100), ("attention.sliding_window", 32)]),
    "phi3_odd_head": (dict(model_type="phi3", partial_rotary_factor=0.5, head_dim=32),
                      [("context_length", 128), ("embedding_length", 64), ("block_count", 8),
                       ("feed_forward_length", 96), ("attention.head_count", 4), ("attention.head_count_kv", 2),
                       ("attention.layer_norm_rms_epsilon", 1e-5), ("attention.key_length", 32),
                       ("attention.value_length", 32), ("rope.dimension_count", 16),
                       ("vocab_size", 100)]),
    "gemma2": (dict(model_type="gemma2", head_dim=16, sliding_window=4, final_logit_softcapping=0.5,
                    attn_logit_softcapping=2.0, rms_norm_eps=1e-6, rope_theta=10000.0),
               [("context_length", 128), ("embedding_length", 64), ("block_count", 8), ("feed_forward_length", 96),
                ("attention.head_count", 4), ("attention.head_count_kv", 2),
                ("attention.layer_norm_rms_epsilon", 1e-6), ("rope.freq_base", 10000.0),
                ("attention.key_length", 16), ("attention.value_length", 16), ("attention.sliding_window", 4),
                ("final_logit_softcapping", 0.5), ("attn_logit_softcapping", 2.0)]),
    "gemma3": (dict(model_type="gemma3_text", head_dim=32, sliding_window=4096, rms_norm_eps=1e-6,
                    final_logit_softcapping=None,
                    layer_types=["sliding_attention", "full_attention"] * 4,
                    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
                                     "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}),
               [("context_length", 128), ("embedding_length", 64), ("block_count", 8), ("feed_forward_length", 96),
                ("attention.head_count", 4), ("attention.head_count_kv", 2),
                ("attention.layer_norm_rms_epsilon", 1e-6), ("rope.freq_base", 1e6),
                ("attention.key_length", 32), ("attention.value_length", 32), ("attention.sliding_window", 4096),
                ("rope.scaling.type", "linear"), ("rope.scaling.factor", 8.0),
                ("attention.sliding_window_pattern", [True, False] * 4), ("rope.freq_base_swa", 20000.0)]),
}


@pytest.mark.parametrize("name", list(_PINNED))
def test_moved_families_keep_the_hand_written_keys(name):
    """gemma2, gemma3 and phi3 write the same GGUF keys, values and order from their records as the hand-written
    code did (so the header bytes are unchanged), and read them back into an equivalent config.json."""
    extra, want = _PINNED[name]
    cfg = {**dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=8,
                  intermediate_size=96, vocab_size=100, max_position_embeddings=128, rms_norm_eps=1e-5), **extra}
    md = gguf_metadata_from_hf(cfg)
    arch = md["general.architecture"].value
    got = [(k.split(".", 1)[1], v.value) for k, v in md.items() if k.startswith(arch + ".")]
    assert got == want
    back = hf_config_from_gguf({k: v.value for k, v in md.items()}, vocab_size=100, tensor_names=["token_embd.weight"])
    for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "intermediate_size",
              "sliding_window", "final_logit_softcapping", "attn_logit_softcapping", "layer_types"):
        if cfg.get(k) is not None:
            assert back[k] == cfg[k], k
    if name == "gemma3":
        assert back["rope_parameters"] == {"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
                                           "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}
        assert back["query_pre_attn_scalar"] == 32


def test_per_layer_kv_heads_back_to_one_value():
    """A GGUF may hold head_count_kv per layer: equal values give config.json's one number (as the hand-written
    code did), differing ones a GGUFConfigError naming the key and the values."""
    md = {"general.architecture": "llama", "llama.context_length": 128, "llama.embedding_length": 64,
          "llama.block_count": 2, "llama.attention.head_count": 4, "llama.feed_forward_length": 96,
          "llama.attention.head_count_kv": np.array([2, 2], np.uint32)}
    assert hf_config_from_gguf(md, vocab_size=10)["num_key_value_heads"] == 2
    md["llama.attention.head_count_kv"] = np.array([2, 4], np.uint32)
    with pytest.raises(GGUFConfigError, match=r"llama.attention.head_count_kv varies per layer \(\[2, 4\]\)"):
        hf_config_from_gguf(md, vocab_size=10)
