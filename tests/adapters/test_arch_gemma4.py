"""Gemma 4's text model (`gemma4_text` <-> llama.cpp "gemma4"), judged like test_arch_breadth's families.

A tiny random Gemma4ForCausalLM (hidden 64, sliding layers with head_dim 16, full layers with head_dim 32 and a
"proportional" RoPE rotating a quarter of it, the shared ~300-token BPE tokenizer) is saved with save_pretrained;
(a) HF -> GGUF: llama.cpp's next-token distribution equals transformers' at every position (max KL < 1e-3, same
argmax off near ties); (b) GGUF -> HF loads in transformers as Gemma4ForCausalLM with the original logits.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
if not hasattr(transformers, "Gemma4TextConfig"):
    pytest.skip("transformers has no Gemma 4", allow_module_level=True)

from test_arch_breadth import _kl, _logits, assert_same_next_token, llama_cpp_logits  # noqa: E402
from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402

_DENSE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, global_head_dim=32, max_position_embeddings=128, sliding_window=8,
              layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=0,
              num_kv_shared_layers=0, final_logit_softcapping=30.0, bos_token_id=0, eos_token_id=1, pad_token_id=2)


# E2B-style: per-layer embeddings, the last two layers reuse earlier layers' kv and have a double-wide MLP
_PER_LAYER = dict(_DENSE, hidden_size_per_layer_input=8, num_kv_shared_layers=2, use_double_wide_mlp=True,
                  num_hidden_layers=6, layer_types=["sliding_attention", "full_attention"] * 3,
                  final_logit_softcapping=None)

# the 26B-A4B's shape: experts (router with input and per-expert scales) beside the dense MLP in every layer
# (and its full layers' k projection doubling as v, with their own kv head count)
_MOE = dict(_DENSE, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
            attention_k_eq_v=True, num_global_key_value_heads=1)


def _make(kwargs, tok, folder):
    cfg = transformers.Gemma4TextConfig(**kwargs)
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norms and layer scalars, so a missed shift or scalar shows
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


@pytest.mark.parametrize("variant", ["dense", "per_layer", "moe"])
def test_gemma4_both_ways(variant, tokenizer, tmp_path):  # noqa: F811
    hf = str(tmp_path / "hf")
    kwargs = {"dense": _DENSE, "per_layer": dict(_PER_LAYER, vocab_size_per_layer_input=len(tokenizer)),
              "moe": _MOE}[variant]
    model = _make(kwargs, tokenizer, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    assert len(ids) > 8  # longer than the sliding window: the window and the layer pattern matter
    ref = _logits(model, ids)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "gemma4"
    freqs = r.get_tensor(next(i for i, t in enumerate(r.tensors) if t.name == "rope_freqs.weight")).data
    assert freqs.tolist() == [1.0] * 4 + [np.float32(1e30)] * 12  # head_dim 32, a quarter rotated
    names = {t.name for t in r.tensors}
    if variant == "per_layer":
        assert {"per_layer_token_embd.weight", "per_layer_model_proj.weight", "blk.5.inp_gate.weight"} <= names
        assert "blk.5.attn_k.weight" not in names  # a kv-sharing layer has no k/v of its own
        assert r.fields["gemma4.feed_forward_length"].contents() == [96] * 4 + [192] * 2
    if variant == "moe":
        assert {"blk.0.ffn_gate_up_exps.weight", "blk.0.ffn_gate_inp.scale", "blk.0.ffn_down_exps.scale"} <= names
        assert "blk.1.attn_v.weight" not in names and "blk.0.attn_v.weight" in names
        assert r.fields["gemma4.attention.head_count_kv"].contents() == [2, 1, 2, 1]

    mine = llama_cpp_logits(path, ids)
    assert_same_next_token(ref, mine, 'gemma4')

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        assert json.load(fh)["model_type"] == "gemma4_text"
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert type(m).__name__ == "Gemma4ForCausalLM"
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_gemma4_conditional_generation_text_part(tokenizer, tmp_path):  # noqa: F811
    """Gemma4ForConditionalGeneration (vision tower included) -> a llama.cpp gemma4 GGUF of its text part, judged
    on text by llama.cpp; GGUF -> HF gives Gemma4ForCausalLM with the same logits."""
    text = dict(_DENSE, vocab_size=len(tokenizer))
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16)
    cfg = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
    hf = str(tmp_path / "hf")
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "gemma4"
    assert not [t.name for t in r.tensors if "vision" in t.name or t.name.startswith("v.")]
    mine = llama_cpp_logits(path, ids)
    kl = _kl(ref, mine)
    assert kl.max() < 1e-3, f"gemma4 (text part): max KL {kl.max():.3g}"
    assert (mine.argmax(-1) == ref.argmax(-1)).mean() >= 0.9

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert type(m).__name__ == "Gemma4ForCausalLM"
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_gemma4_names_without_transformers_match_the_model():
    """GGUF -> HF names chosen without transformers (gguf-py's candidates, the record's `hf_prefer`, Gemma 4's
    bare experts and router scales) are the names Gemma4ForCausalLM declares, per-layer embeddings and MoE
    included."""
    from lazyweights.adapters import names
    from lazyweights.adapters.archs import ARCHS

    a = ARCHS["gemma4_text"]
    cfg = transformers.Gemma4TextConfig(**dict(_MOE, hidden_size_per_layer_input=8, vocab_size_per_layer_input=300,
                                               vocab_size=300))
    with torch.device("meta"):
        keys = set(transformers.Gemma4ForCausalLM(cfg).state_dict())
    for k in sorted(keys):
        g = names.hf_to_gguf_name(k, a.gguf)
        assert g is not None, k
        assert names.gguf_to_hf_name(g, a.gguf, None, a.hf_prefer) == k, (g, k)
        assert names.gguf_to_hf_name(g, a.gguf, keys) == k, (g, k)
    assert {"blk.0.ffn_gate_inp.scale", "blk.0.ffn_down_exps.scale", "blk.0.layer_output_scale.weight"} <= {
        names.hf_to_gguf_name(k, a.gguf) for k in keys}


def test_gemma4_configs_llama_cpp_cannot_run_are_named():
    """A full-attention RoPE other than "proportional" (llama.cpp's converter writes only that one as rope_freqs)
    and a MoE block without its sizes are GGUFConfigErrors naming the config entries."""
    from lazyweights.adapters.archs import ARCHS
    from lazyweights.adapters.gemma4 import gemma4_rope_freqs
    from lazyweights.convert.hparams import gguf_hparams
    from lazyweights.core.errors import GGUFConfigError

    cfg = transformers.Gemma4TextConfig(**_DENSE).to_dict()
    bad = dict(cfg, rope_parameters={**cfg["rope_parameters"], "full_attention": {"rope_type": "default",
                                                                                  "rope_theta": 1e6}})
    with pytest.raises(GGUFConfigError, match="full-attention rope_type 'default'"):
        gemma4_rope_freqs(bad)
    with pytest.raises(GGUFConfigError, match="enable_moe_block without num_experts"):
        gguf_hparams(ARCHS["gemma4_text"], dict(cfg, enable_moe_block=True, num_experts=None))
    md = gguf_hparams(ARCHS["gemma4_text"], cfg)  # the good config: the full layers' head dim, the pattern
    assert md["gemma4.attention.key_length"].value == 32 and md["gemma4.attention.key_length_swa"].value == 16
    assert md["gemma4.attention.sliding_window_pattern"].value == [True, False, True, False]
