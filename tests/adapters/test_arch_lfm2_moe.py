"""LFM2-MoE (`archs` record `lfm2_moe`, llama.cpp's "lfm2moe"), judged as test_arch_breadth judges its families: a
tiny random transformers model (the shared ~300-token byte-level BPE tokenizer) saved with `save_pretrained`, then

(a) HF -> GGUF (`export_gguf`): llama.cpp's next-token distribution at every prompt position equals
    transformers' (max KL < 1e-3, same argmax wherever the reference's top two logits are not within 1e-3); the
    GGUF holds the per-expert w1/w2/w3 stacked, the router's selection bias, the dense lead layer count and 0 kv
    heads on conv layers;
(b) GGUF -> HF (`export_hf_folder`, float32) loads in transformers with the original logits (atol 1e-4).
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
if not hasattr(transformers, "Lfm2MoeConfig"):
    pytest.skip("this transformers has no LFM2-MoE", allow_module_level=True)

from test_arch_breadth import _SPECIAL, _kl, _logits, assert_same_next_token, llama_cpp_logits  # noqa: E402
from test_arch_lfm2 import _TYPES  # noqa: E402
from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402

_MOE = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, layer_types=_TYPES,
            conv_L_cache=3, num_experts=4, num_experts_per_tok=2, num_dense_layers=1, **_SPECIAL)
FAMILIES = {"lfm2_moe": ("Lfm2MoeConfig", _MOE)}  # read by test_arch_coverage


def make_lfm2_moe(tok, folder, **over):
    cfg = transformers.Lfm2MoeConfig(**dict(FAMILIES["lfm2_moe"][1], **over))
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms, a router bias that changes the selection, a conv that matters
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
            if n.endswith("conv.conv.weight"):
                p.copy_(torch.randn_like(p))
            if n.endswith(("conv.in_proj.weight", "conv.out_proj.weight")):
                p.mul_(8.0)
            if n.endswith("feed_forward.gate.weight"):
                p.copy_(torch.randn_like(p))
            if ".experts." in n:
                p.mul_(8.0)  # the experts as large as the residual, so which ones are chosen decides the logits
        for layer in model.model.layers:
            if hasattr(layer.feed_forward, "expert_bias"):
                layer.feed_forward.expert_bias.copy_(torch.randn_like(layer.feed_forward.expert_bias))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def _field(r, key):
    f = r.fields[key]
    return [int(f.parts[i][0]) for i in f.data] if len(f.data) > 1 else int(f.parts[f.data[0]][0])


def test_lfm2_moe_both_ways(tokenizer, tmp_path):  # noqa: F811
    hf = str(tmp_path / "hf")
    model = make_lfm2_moe(tokenizer, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "lfm2moe"
    assert _field(r, "lfm2moe.attention.head_count_kv") == [0, 2, 0, 2]
    assert _field(r, "lfm2moe.leading_dense_block_count") == 1
    assert _field(r, "lfm2moe.expert_gating_func") == 2
    assert _field(r, "lfm2moe.expert_feed_forward_length") == 32
    t = {t.name: t for t in r.tensors}
    assert "blk.0.ffn_gate.weight" in t and "blk.0.ffn_gate_exps.weight" not in t
    bias = model.model.layers[2].feed_forward.expert_bias.numpy()
    np.testing.assert_array_equal(np.asarray(t["blk.2.exp_probs_b.bias"].data, np.float32), bias)
    up = np.asarray(t["blk.1.ffn_up_exps.weight"].data, np.float32)
    want = np.stack([model.model.layers[1].feed_forward.experts.gate_up_proj.detach().numpy()[e, 32:]
                     for e in range(4)])  # transformers fuses w1 (gate) then w3 (up) in memory
    np.testing.assert_allclose(up.reshape(want.shape), want, rtol=0, atol=1e-2)

    mine = llama_cpp_logits(path, ids)
    assert_same_next_token(ref, mine, 'lfm2_moe')

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["architectures"] == ["Lfm2MoeForCausalLM"] and cfg["layer_types"] == _TYPES
    assert cfg["num_dense_layers"] == 1 and cfg["num_experts"] == 4
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_lfm2_moe_router_bias_matters(tokenizer, tmp_path):  # noqa: F811
    """The judge can fail: dropping the selection bias after export changes llama.cpp's distribution."""
    hf = str(tmp_path / "hf")
    model = make_lfm2_moe(tokenizer, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.feed_forward, "expert_bias"):
                layer.feed_forward.expert_bias.zero_()
    assert _kl(_logits(model, ids), llama_cpp_logits(path, ids)).max() > 1e-2


def test_lfm2_moe_routed_scale_is_refused(tokenizer, tmp_path):  # noqa: F811
    """llama.cpp's lfm2moe graph applies no routed scale: routed_scaling_factor != 1 is a GGUFConfigError."""
    from lazyweights.core.errors import GGUFConfigError

    hf = str(tmp_path / "hf")
    make_lfm2_moe(tokenizer, hf, routed_scaling_factor=2.5)
    with pytest.raises(GGUFConfigError, match=r"routed_scaling_factor=2.5"):
        export_gguf(hf, str(tmp_path / "x.gguf"))
