"""Mixtral / Qwen-MoE experts: per-expert weights stacked into fused 3-D tensors, and split back.

    python examples/moe_experts.py

Mixtral checkpoints store each expert separately (`model.layers.N.block_sparse_moe.experts.{e}.w1.weight`
[I, H] = gate, `w3` [I, H] = up, `w2` [H, I] = down). Fused MoE kernels (and newer Hugging Face
transformers) want one tensor per layer:

    mlp.experts.gate_up_proj  [E, 2I, H]   expert e's w1 rows, then its w3 rows (concat along dim 1)
    mlp.experts.down_proj     [E, H, I]    the w2s stacked

Forward: `stack` / `concat` (lazy) -> plan printed -> saved as safetensors -> read back with safetensors and
compared with numpy's stack/concatenate of the source tensors. Reverse: the saved fused checkpoint is
opened with lazyweights and cut back into per-expert tensors (index + `split`, lazy), which must equal the
original checkpoint byte for byte (identity). Shapes are Mixtral 8x7B's proportions scaled down
(8 experts, I = 3.5 H, 8 query heads over 2 KV heads).
"""
from __future__ import annotations

import os
import re

import numpy as np

import _common as C
from _common import check, check_keys

from lazyweights import concat, load_weights, plan, split, stack

# Mixtral 8x7B: hidden 4096, intermediate 14336, 8 experts (top-2), 32 heads / 8 KV heads, vocab 32000.
MIXTRAL = dict(hidden_size=128, intermediate_size=448, num_local_experts=8, num_experts_per_tok=2,
               num_attention_heads=8, num_key_value_heads=2, head_dim=16, vocab_size=256,
               num_hidden_layers=2, model_type="mixtral", architectures=["MixtralForCausalLM"])

EXPERT = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")


def mixtral_tensors(cfg=MIXTRAL, seed=0) -> dict[str, np.ndarray]:
    r = C.rng(seed)
    H, I, E, A, K, hd, V = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_local_experts",
                                             "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"))
    t = {"model.embed_tokens.weight": C.normal(r, (V, H), C.bf16)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
        t[p + "self_attn.q_proj.weight"] = C.normal(r, (A * hd, H), C.bf16)
        t[p + "self_attn.k_proj.weight"] = C.normal(r, (K * hd, H), C.bf16)
        t[p + "self_attn.v_proj.weight"] = C.normal(r, (K * hd, H), C.bf16)
        t[p + "self_attn.o_proj.weight"] = C.normal(r, (H, A * hd), C.bf16)
        t[p + "post_attention_layernorm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
        t[p + "block_sparse_moe.gate.weight"] = C.normal(r, (E, H), C.bf16)
        for e in range(E):
            q = f"{p}block_sparse_moe.experts.{e}."
            t[q + "w1.weight"] = C.normal(r, (I, H), C.bf16)
            t[q + "w2.weight"] = C.normal(r, (H, I), C.bf16)
            t[q + "w3.weight"] = C.normal(r, (I, H), C.bf16)
    t["model.norm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
    t["lm_head.weight"] = C.normal(r, (V, H), C.bf16)
    return t


# --- the adapters --------------------------------------------------------------------------------------
def fuse_experts(state_dict, num_experts: int, gate_first: bool = True):
    """Per-expert Mixtral tensors -> gate_up_proj [E, 2I, H] and down_proj [E, H, I]; other names kept."""
    out, experts = {}, {}
    for name, value in state_dict.items():
        m = EXPERT.match(name)
        if m:
            layer, e, w = int(m[1]), int(m[2]), m[3]
            experts.setdefault(layer, {})[(e, w)] = value.data()
        else:
            out[name.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = value.data()
    for layer, ws in sorted(experts.items()):
        p = f"model.layers.{layer}.mlp.experts."
        first, second = ("w1", "w3") if gate_first else ("w3", "w1")
        out[p + "gate_up_proj"] = stack(
            [concat([ws[(e, first)], ws[(e, second)]], axis=0) for e in range(num_experts)], name=p + "gate_up_proj")
        out[p + "down_proj"] = stack([ws[(e, "w2")] for e in range(num_experts)], name=p + "down_proj")
    return out


def split_experts(state_dict):
    """The reverse: fused gate_up_proj / down_proj -> per-expert w1, w3, w2 (Mixtral names)."""
    out = {}
    for name, value in state_dict.items():
        m = re.match(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", name)
        if not m:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = value.data()
            continue
        data = value.data()
        p = f"model.layers.{m[1]}.block_sparse_moe.experts."
        for e in range(data.shape[0]):
            if m[2] == "gate_up_proj":
                w1, w3 = split(data[e], 2, axis=0)
                out[f"{p}{e}.w1.weight"], out[f"{p}{e}.w3.weight"] = w1, w3
            else:
                out[f"{p}{e}.w2.weight"] = data[e]
    return out


def reference_fused(raw: dict[str, np.ndarray], num_experts: int) -> dict[str, np.ndarray]:
    """numpy: the fused checkpoint computed eagerly from the per-expert tensors."""
    out, layers = {}, set()
    for name, a in raw.items():
        m = EXPERT.match(name)
        if m:
            layers.add(int(m[1]))
        else:
            out[name.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = a
    for i in sorted(layers):
        g = f"model.layers.{i}.block_sparse_moe.experts."
        out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([raw[f"{g}{e}.w1.weight"], raw[f"{g}{e}.w3.weight"]], axis=0) for e in range(num_experts)])
        out[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack([raw[f"{g}{e}.w2.weight"] for e in range(num_experts)])
    return out


def verify_fused(got: dict, raw: dict, num_experts: int, title: str = "fused") -> None:
    want = reference_fused(raw, num_experts)
    check_keys(got, want, f"{title}: names")
    for name in sorted(set(got) & set(want)):
        check(f"{title}: {name}", got[name], want[name])


def main() -> int:
    cfg = MIXTRAL
    E, H, I = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    with C.workdir("moe") as d:
        src = C.write_safetensors(os.path.join(d, "mixtral", "model.safetensors"), mixtral_tensors(cfg), cfg)
        raw = C.read_safetensors(src)

        fused = fuse_experts(dict(load_weights([src]).items()), E)
        p = plan(fused)
        C.print_plan(p, "plan: per-expert w1/w3/w2 -> gate_up_proj [E, 2I, H], down_proj [E, H, I]")
        for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"):
            print(f"{name}: {list(fused[name].shape)} {fused[name].dtype}")
        assert fused["model.layers.0.mlp.experts.gate_up_proj"].shape == (E, 2 * I, H)
        out = os.path.join(d, "fused")
        p.save(out, max_shard_size="1MB")
        verify_fused(C.read_saved(out), raw, E, "fused, saved")

        # Reverse, from the saved fused checkpoint: must give back the original tensors (identity).
        back = split_experts(dict(load_weights(out).items()))
        q = plan(back)
        print(f"reverse plan: {len(q)} tensors, {len(q.nodes())} nodes (index + split of the fused tensors)")
        got = q.materialize()
        check_keys(got, raw, "round trip: names")
        for name in sorted(set(got) & set(raw)):
            check(f"round trip: {name}", got[name], raw[name])
    return C.verdict(f"MoE experts: {E} experts stacked to [E, 2I, H] / [E, H, I] and split back (identity)")


if __name__ == "__main__":
    C.run(main)
