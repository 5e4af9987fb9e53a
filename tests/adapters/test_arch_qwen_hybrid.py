"""Qwen's hybrid linear-attention families (`archs` records in the `qwen hybrids` block), judged as
test_arch_breadth judges its families: a tiny random transformers model (the shared ~300-token byte-level BPE
tokenizer) saved with `save_pretrained`, then

(a) HF -> GGUF (`export_gguf`): llama.cpp's next-token distribution at every prompt position equals
    transformers' (max KL < 1e-3, same argmax wherever the reference's top two logits are not within 1e-3);
(b) GGUF -> HF (`export_hf_folder`, float32) loads in transformers with the original logits (atol 1e-4).
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_arch_breadth import _SPECIAL, _kl, _logits, assert_same_next_token, llama_cpp_logits  # noqa: E402
from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402

_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
               linear_conv_kernel_dim=4)
# interleaved M-RoPE sections that fit the tiny model's 8 rotary dims (ggml asserts sum(sections) * 2 <= n_rot)
_MROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1],
              mrope_interleaved=True)
FAMILIES = {
    "qwen3_next": ("Qwen3NextConfig", dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=128, layer_types=_TYPES, intermediate_size=96, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1,
        mlp_only_layers=[], norm_topk_prob=True, **_LINEAR, **_SPECIAL)),
    "qwen3_5_text": ("Qwen3_5TextConfig", dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=128, layer_types=_TYPES, intermediate_size=96, rope_parameters=_MROPE, **_LINEAR,
        **_SPECIAL)),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=128, layer_types=_TYPES, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, rope_parameters=_MROPE, **_LINEAR,
        **_SPECIAL)),
}


def make_hybrid(name, tok, folder):
    cls, kwargs = FAMILIES[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"this transformers has no {cls}")
    cfg = getattr(transformers, cls)(**kwargs)
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms, decays and convolutions, so a wrong layout shows in the logits
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
            if n.endswith("conv1d.weight"):
                p.copy_(0.5 * torch.randn_like(p))
            if n.endswith(("linear_attn.in_proj_qkvz.weight", "linear_attn.out_proj.weight",
                           "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight")):
                p.mul_(4.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def _judge(name, model, tok, tmp_path):
    ids = tok(PROMPT)["input_ids"]
    ref = _logits(model, ids)
    path = str(tmp_path / "model.gguf")
    export_gguf(str(tmp_path / "hf"), path)
    mine = llama_cpp_logits(path, ids)
    assert_same_next_token(ref, mine, name)
    return path, ids, ref


@pytest.mark.parametrize("name", list(FAMILIES))
def test_qwen_hybrid_to_gguf(name, tokenizer, tmp_path):  # noqa: F811
    model = make_hybrid(name, tokenizer, str(tmp_path / "hf"))
    path, _, _ = _judge(name, model, tokenizer, tmp_path)
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    f = r.fields[f"{arch}.attention.recurrent_layers"]
    assert [bool(f.parts[i][0]) for i in f.data] == [t == "linear_attention" for t in _TYPES]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_qwen_hybrid_back_to_hf(name, tokenizer, tmp_path):  # noqa: F811
    model = make_hybrid(name, tokenizer, str(tmp_path / "hf"))
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)
    path = str(tmp_path / "model.gguf")
    export_gguf(str(tmp_path / "hf"), path)
    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen3_5_text"])
def test_qwen_hybrid_v_reorder_matters(name, tokenizer, tmp_path, monkeypatch):  # noqa: F811
    """The judge can fail: the same export without the value-head reorder moves llama.cpp's distribution."""
    import lazyweights.convert.tensors as gn

    model = make_hybrid(name, tokenizer, str(tmp_path / "hf"))
    ids = tokenizer(PROMPT)["input_ids"]
    monkeypatch.setattr(gn, "v_reorder", lambda wd, *a, **k: wd)
    path = str(tmp_path / "model.gguf")
    export_gguf(str(tmp_path / "hf"), path)
    assert _kl(_logits(model, ids), llama_cpp_logits(path, ids)).max() > 1e-2
