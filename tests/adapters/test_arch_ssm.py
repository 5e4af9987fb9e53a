"""State-space families (Mamba, Falcon Mamba, Mamba-2) and the hybrids llama.cpp and transformers both have
(Granite 4.0 H with and without experts and RoPE, Bamba, Jamba, Nemotron-H, Falcon-H1), each judged by llama.cpp
and by transformers, as in test_arch_breadth: a tiny random transformers model (hidden 64, 2-3 layers, float32,
the shared tiny byte-level BPE tokenizer) saved with `save_pretrained`, then

(a) HF -> GGUF (`export_gguf`); llama.cpp loads the file and its next-token distribution at every position of a
    prompt equals transformers' (max KL < 1e-3, same argmax away from near ties);
(b) GGUF -> HF (`export_hf_folder`, float32) loads in transformers as the same class with the original logits.

The values llama.cpp's converter changes are checked against gguf-py's reader too: A = -exp(A_log), the conv1d
weight squeezed to 2-D, Mamba-2's A/D as [n_head, 1] and its norm as [n_group, d_inner / n_group], the token list
padded to the vocabulary's multiple.
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

from test_arch_breadth import _logits, assert_same_next_token, llama_cpp_logits  # noqa: E402
from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402

_SPECIAL = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
# dt initialised in [0.5, 1] (not [0.001, 0.1]): the state then carries enough of the past that a wrong A moves
# llama.cpp's next-token distribution far beyond the KL bound (A = -A_log instead of -exp(A_log): KL 0.36)
_MAMBA = dict(hidden_size=64, num_hidden_layers=2, state_size=8, time_step_min=0.5, time_step_max=1.0, **_SPECIAL)
_HYBRID = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
               max_position_embeddings=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8,
               mamba_chunk_size=8, **_SPECIAL)
_GRANITE_HYBRID = dict(_HYBRID, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
                       layer_types=["mamba", "attention"],
                       embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=1.0, logits_scaling=4.0,
                       initializer_range=0.2)

_NEMOTRON = dict(_HYBRID, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=8,
                 chunk_size=8, time_step_max=1.0, initializer_range=0.2, num_hidden_layers=3)

# family -> (transformers config class, config kwargs, GGUF architecture, vocabulary multiple llama.cpp pads to)
SSM_FAMILIES = {
    "mamba": ("MambaConfig", dict(_MAMBA), "mamba", 8),
    "falcon_mamba": ("FalconMambaConfig", dict(_MAMBA), "mamba", 8),
    "mamba2": ("Mamba2Config", dict(_MAMBA, num_heads=8, head_dim=16, n_groups=2, chunk_size=8), "mamba2", 16),
    # Granite 4.0: a Mamba-2 layer then an attention layer, MoE with a shared expert, Granite's scales; no RoPE
    # (position_embedding_type None, as the real models) and with it
    "granitemoehybrid": ("GraniteMoeHybridConfig", _GRANITE_HYBRID, "granitehybrid", 8),
    "granitemoehybrid_rope": ("GraniteMoeHybridConfig", dict(_GRANITE_HYBRID, position_embedding_type="rope"),
                              "granitehybrid", 8),
    # a dense Granite 4.0 H (no experts: the shared MLP is llama.cpp's plain MLP)
    "granitemoehybrid_dense": ("GraniteMoeHybridConfig", dict(_GRANITE_HYBRID, num_local_experts=0,
                                                              position_embedding_type="rope"), "granitehybrid", 8),
    # Bamba: Mamba-2 layer then attention layer (attn_layer_indices), RoPE on half of each head, a dense MLP
    "bamba": ("BambaConfig", dict(_HYBRID, attn_layer_indices=[1], initializer_range=0.2), "granitehybrid", 8),
    # Nemotron-H: Mamba-2, attention, relu2 MLP layers; dt initialised up to 1 (transformers clamps dt at
    # time_step_min, llama.cpp does not: that stays at its default 0.001)
    "nemotron_h": ("NemotronHConfig", dict(_NEMOTRON, layers_block_type=["mamba", "attention", "mlp"]), "nemotron_h",
                   8),
    # Falcon-H1: parallel attention and Mamba-2 in each layer; every muP multiplier away from 1 (folded into the
    # weights), RoPE
    "falcon_h1": ("FalconH1Config", dict(_HYBRID, head_dim=24, mamba_d_ssm=128, initializer_range=0.2,
                                         rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                                         lm_head_multiplier=0.5, embedding_multiplier=2.0, mlp_multipliers=[0.8, 1.2],
                                         key_multiplier=1.5, attention_in_multiplier=0.7, attention_out_multiplier=1.3,
                                         ssm_multipliers=[0.9, 1.1, 0.6, 1.4, 0.5], ssm_in_multiplier=1.2,
                                         ssm_out_multiplier=0.9), "falcon-h1", 0),
    "falcon_h1_norm": ("FalconH1Config", dict(_HYBRID, head_dim=16, mamba_d_ssm=128, initializer_range=0.2,
                                              mamba_rms_norm=True, mamba_norm_before_gate=False), "falcon-h1", 0),
    # Nemotron-H with a MoE layer (llama.cpp's nemotron_h_moe): sigmoid router with a score bias, shared expert
    "nemotron_h_moe": ("NemotronHConfig", dict(_NEMOTRON, layers_block_type=["mamba", "attention", "moe"],
                                              n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                              moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
                                              routed_scaling_factor=1.5), "nemotron_h_moe", 8),
    # Jamba: Mamba layer (dense MLP) then attention layer (4 experts), as Jamba's periods and offsets say
    "jamba": ("JambaConfig", dict(_HYBRID, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                                  expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_dt_rank=4,
                                  initializer_range=0.2), "jamba", 0),
}
# where each family keeps its Mamba layer's tensors (layer 0 is a Mamba layer in every family)
# (else backbone.layers.0.mixer.)
_MIXER = {"granitehybrid": "model.layers.0.mamba.", "jamba": "model.layers.0.mamba.",
          "falcon-h1": "model.layers.0.mamba."}


def _vocab(tok, multiple):
    """The tokenizer's size rounded up to `multiple` plus one more block: the model's embedding is larger than the
    token list, as in real Mamba checkpoints (50280 rows for 50277 tokens), so the padding is exercised."""
    if not multiple:  # no padding: the token list as it is
        return len(tok)
    return -(len(tok) // -multiple) * multiple + multiple


def make_ssm_family(name, tok, folder):
    cls, kwargs, _, multiple = SSM_FAMILIES[name]
    cfg = getattr(transformers, cls)(**dict(kwargs))
    cfg.vocab_size = _vocab(tok, multiple)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms, biases, A and D, so a missed transform shows
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def _tensor(reader, name):
    t = next(t for t in reader.tensors if t.name == name)
    return np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)])


@pytest.mark.parametrize("name", list(SSM_FAMILIES))
def test_ssm_family_both_ways(name, tokenizer, tmp_path):  # noqa: F811
    hf = str(tmp_path / "hf")
    model = make_ssm_family(name, tokenizer, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    arch = SSM_FAMILIES[name][2]
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == arch
    assert len(r.fields["tokenizer.ggml.tokens"].data) == model.config.vocab_size
    assert model.config.vocab_size > len(tokenizer) or not SSM_FAMILIES[name][3]  # padded where llama.cpp pads
    from safetensors.numpy import load_file

    sd = load_file(os.path.join(hf, "model.safetensors"))
    mixer = _MIXER.get(arch, "backbone.layers.0.mixer.")
    a = _tensor(r, "blk.0.ssm_a")
    np.testing.assert_allclose(a.reshape(-1), -np.exp(sd[mixer + "A_log"]).reshape(-1), rtol=1e-6)
    assert _tensor(r, "blk.0.ssm_conv1d.weight").tolist() == sd[mixer + "conv1d.weight"][:, 0, :].tolist()
    if arch not in ("mamba", "jamba"):
        assert a.shape == (sd[mixer + "A_log"].shape[0], 1)
        if mixer + "norm.weight" in sd:  # Falcon-H1's gated norm is optional (mamba_rms_norm)
            norm = _tensor(r, "blk.0.ssm_norm.weight")
            assert norm.shape == (2, norm.size // 2)
            assert norm.reshape(-1).tolist() == sd[mixer + "norm.weight"].tolist()
        assert _tensor(r, "blk.0.ssm_dt.bias").tolist() == sd[mixer + "dt_bias"].tolist()
    if arch == "granitehybrid":
        assert r.fields["granitehybrid.attention.head_count_kv"].contents() == [0, 2]
    if name.startswith("granitemoehybrid"):
        rope = bool(r.fields["granitehybrid.rope.scaling.finetuned"].parts[-1][0])
        assert rope is (model.config.position_embedding_type == "rope")
        gate_up = sd["model.layers.1.shared_mlp.input_linear.weight"]
        up = "blk.1.ffn_up.weight" if name.endswith("dense") else "blk.1.ffn_up_shexp.weight"
        assert _tensor(r, up).tolist() == gate_up[48:].tolist()
    if arch == "mamba":
        assert bool(r.fields["mamba.ssm.dt_b_c_rms"].parts[-1][0]) is (name == "falcon_mamba")

    mine = llama_cpp_logits(path, ids)
    assert_same_next_token(ref, mine, name)

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        assert json.load(fh)["model_type"] == model.config.model_type
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert type(m).__name__ == type(model).__name__
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_falcon_h1_norm_before_gate_is_refused(tokenizer, tmp_path):  # noqa: F811
    """llama.cpp's Falcon-H1 graph norms the Mamba output after the gate; a model that norms before it is refused
    by name, and nothing is written."""
    from lazyweights.core.errors import GGUFConfigError

    SSM_FAMILIES["falcon_h1_before_gate"] = ("FalconH1Config", dict(SSM_FAMILIES["falcon_h1_norm"][1],
                                             mamba_norm_before_gate=True), "falcon-h1", 0)
    try:
        make_ssm_family("falcon_h1_before_gate", tokenizer, str(tmp_path / "hf"))
    finally:
        del SSM_FAMILIES["falcon_h1_before_gate"]
    with pytest.raises(GGUFConfigError, match="mamba_norm_before_gate true"):
        export_gguf(str(tmp_path / "hf"), str(tmp_path / "x.gguf"))
    assert sorted(os.listdir(tmp_path)) == ["hf"]
