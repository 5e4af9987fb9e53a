"""Phi-3: fused `qkv_proj` split into q, k, v (grouped-query: unequal sizes), fused `gate_up_proj` into gate, up.

    python examples/phi3_fused_qkv.py

Phi-3 checkpoints fuse the attention input projections and the MLP's gate and up projections:

    self_attn.qkv_proj.weight  [(A + 2K) * hd, H]  -> q_proj [A*hd, H], k_proj [K*hd, H], v_proj [K*hd, H]
    mlp.gate_up_proj.weight    [2I, H]             -> gate_proj [I, H] (first half), up_proj [I, H]

A module written with Llama's separate projections needs them split. Phi-3-medium uses grouped-query
attention (40 query heads over 10 KV heads, head_dim 128), so q is four times k and v: the split sizes are
unequal. The adapter uses `lazyweights.split` with explicit sizes (lazy slices); the plan is printed, saved
as safetensors, read back with safetensors and compared with numpy slicing of the source tensors.
"""
from __future__ import annotations

import os

import numpy as np

import _common as C
from _common import check, check_keys

from lazyweights import load_weights, plan, split

# Phi-3-medium: hidden 5120, intermediate 17920 (3.5x), 40 heads / 10 KV heads, head_dim 128, vocab 32064.
PHI3 = dict(hidden_size=160, intermediate_size=560, num_attention_heads=10, num_key_value_heads=2,
            vocab_size=320, num_hidden_layers=2, model_type="phi3", architectures=["Phi3ForCausalLM"])


def phi3_tensors(cfg=PHI3, seed=0) -> dict[str, np.ndarray]:
    r = C.rng(seed)
    H, I, A, K, V = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                      "num_key_value_heads", "vocab_size"))
    hd = H // A
    t = {"model.embed_tokens.weight": C.normal(r, (V, H), C.bf16)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
        t[p + "self_attn.qkv_proj.weight"] = C.normal(r, ((A + 2 * K) * hd, H), C.bf16)
        t[p + "self_attn.o_proj.weight"] = C.normal(r, (H, A * hd), C.bf16)
        t[p + "post_attention_layernorm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
        t[p + "mlp.gate_up_proj.weight"] = C.normal(r, (2 * I, H), C.bf16)
        t[p + "mlp.down_proj.weight"] = C.normal(r, (H, I), C.bf16)
    t["model.norm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
    t["lm_head.weight"] = C.normal(r, (V, H), C.bf16)
    return t


def convert_phi3_state_dict(state_dict, huggingface_config, **unused_kwargs):
    """Split the fused projections (lazy): qkv by head counts, gate_up in halves."""
    cfg = huggingface_config
    A, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg["hidden_size"] // A
    out = {}
    for name, value in state_dict.items():
        data = value.data()
        if name.endswith("self_attn.qkv_proj.weight"):
            p = name[: -len("qkv_proj.weight")]
            q, k, v = split(data, [A * hd, K * hd, K * hd], axis=0)
            out[p + "q_proj.weight"], out[p + "k_proj.weight"], out[p + "v_proj.weight"] = q, k, v
        elif name.endswith("mlp.gate_up_proj.weight"):
            p = name[: -len("gate_up_proj.weight")]
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = split(data, 2, axis=0)
        else:
            out[name] = data
    return out


def reference(raw: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    A, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg["hidden_size"] // A
    out = {}
    for name, a in raw.items():
        if name.endswith("qkv_proj.weight"):
            p = name[: -len("qkv_proj.weight")]
            out[p + "q_proj.weight"] = a[: A * hd]
            out[p + "k_proj.weight"] = a[A * hd: (A + K) * hd]
            out[p + "v_proj.weight"] = a[(A + K) * hd:]
        elif name.endswith("gate_up_proj.weight"):
            p = name[: -len("gate_up_proj.weight")]
            half = a.shape[0] // 2
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = a[:half], a[half:]
        else:
            out[name] = a
    return out


def verify(got: dict, raw: dict, cfg, title: str) -> None:
    want = reference(raw, cfg)
    check_keys(got, want, f"{title}: names")
    for name in sorted(set(got) & set(want)):
        check(f"{title}: {name}", got[name], want[name])


def main() -> int:
    cfg = PHI3
    A, K, H = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    hd = H // A
    with C.workdir("phi3") as d:
        src = C.write_safetensors(os.path.join(d, "phi3", "model.safetensors"), phi3_tensors(cfg), cfg)
        raw = C.read_safetensors(src)
        adapted = convert_phi3_state_dict(dict(load_weights([src]).items()), huggingface_config=cfg)
        p = plan(adapted)
        C.print_plan(p, f"plan: qkv_proj [{(A + 2 * K) * hd}, {H}] -> q {A * hd} / k {K * hd} / v {K * hd} rows; "
                        "gate_up_proj -> gate / up")
        out = os.path.join(d, "split.safetensors")
        p.save(out)
        verify(C.read_saved(out), raw, cfg, "saved")
    return C.verdict(f"Phi-3 fused qkv_proj split {A}:{K}:{K} heads (GQA) and gate_up_proj split in halves")


if __name__ == "__main__":
    C.run(main)
