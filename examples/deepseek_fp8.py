"""DeepSeek-V3-style FP8 block-scaled weights dequantized to bfloat16 over 128x128 blocks.

    python examples/deepseek_fp8.py

DeepSeek-V3/R1 checkpoints store most linear weights as float8_e4m3fn with one float32 scale per 128x128
block (`weight_scale_inv`; despite the name, the value to MULTIPLY by):

    model.layers.N.self_attn.q_a_proj.weight            float8_e4m3fn [N, K]
    model.layers.N.self_attn.q_a_proj.weight_scale_inv  float32       [ceil(N/128), ceil(K/128)]

    bf16 = (weight.astype(f32) * repeat(repeat(s, 128, 0), 128, 1)[:N, :K]).astype(bf16)

N and K need not be multiples of 128 (DeepSeek-V3's kv_a_proj_with_mqa has 576 rows, 4.5 blocks); the last
block row/column is partial. The shapes below keep that: every projection has a partial block somewhere.

Lazily: `weight.astype(float32)` is a lazy cast; the scale grid is expanded to [N, K] with two lazy takes
(`s[arange(N) // 128]` then `[:, arange(K) // 128]`: each scale broadcast over its block, partial blocks
included; each take keeps its index list as five integers, not the array: `graph.node.IndexArray`); then a
lazy elementwise multiply (`w32 * scale`), and a lazy cast to bfloat16. The whole chain is one fused step.
`weight_scale_inv` is dropped. At DeepSeek-V3's size (90,427 tensors) see `benchmarks/bench_scale.py`.

Checked against numpy on tensors read with safetensors (FP8 bytes read from the file directly, since
safetensors' numpy loader has no float8), after a save to safetensors.
"""
from __future__ import annotations

import os

import numpy as np

import _common as C
from _common import check, check_keys

from lazyweights import DType, WeightData, load_weights, plan

BLOCK = 128

# DeepSeek-V3: hidden 7168, q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
# v_head_dim 128, 128 heads, intermediate 18432 (dense) / 2048 (experts), first_k_dense_replace 3.
DEEPSEEK = dict(hidden_size=320, q_lora_rank=192, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32,
                v_head_dim=32, num_attention_heads=4, intermediate_size=864, moe_intermediate_size=160,
                n_routed_experts=2, n_shared_experts=1, first_k_dense_replace=1, num_hidden_layers=2,
                vocab_size=256, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
                quantization_config=dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                                         weight_block_size=[BLOCK, BLOCK]))


def deepseek_tensors(cfg: dict = DEEPSEEK, seed: int = 0) -> dict[str, np.ndarray]:
    """DeepSeek-V3 tensor names and proportions: MLA attention, a dense first layer, then MoE layers.
    Linear weights are float8_e4m3fn with float32 `weight_scale_inv` over 128x128 blocks; norms, the
    embedding, the router and lm_head stay bf16, as in the published checkpoint."""
    r = C.rng(seed)
    H, A = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": C.normal(r, (cfg["vocab_size"], H), C.bf16)}

    def fp8_linear(name: str, n: int, k: int) -> None:
        tensors[name + ".weight"] = C.normal(r, (n, k), C.f8e4m3, scale=1.0)
        grid = (-(-n // BLOCK), -(-k // BLOCK))
        tensors[name + ".weight_scale_inv"] = (r.random(grid, dtype=np.float32) * 0.01 + 1e-4).astype(np.float32)

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = C.normal(r, (H,), C.bf16, scale=1.0)
        tensors[p + "post_attention_layernorm.weight"] = C.normal(r, (H,), C.bf16, scale=1.0)
        fp8_linear(p + "self_attn.q_a_proj", cfg["q_lora_rank"], H)
        tensors[p + "self_attn.q_a_layernorm.weight"] = C.normal(r, (cfg["q_lora_rank"],), C.bf16, scale=1.0)
        fp8_linear(p + "self_attn.q_b_proj", A * (nope + rope), cfg["q_lora_rank"])
        fp8_linear(p + "self_attn.kv_a_proj_with_mqa", cfg["kv_lora_rank"] + rope, H)
        tensors[p + "self_attn.kv_a_layernorm.weight"] = C.normal(r, (cfg["kv_lora_rank"],), C.bf16, scale=1.0)
        fp8_linear(p + "self_attn.kv_b_proj", A * (nope + v), cfg["kv_lora_rank"])
        fp8_linear(p + "self_attn.o_proj", H, A * v)
        if i < cfg["first_k_dense_replace"]:
            for proj, (n, k) in {"gate_proj": (cfg["intermediate_size"], H), "up_proj": (cfg["intermediate_size"], H),
                                 "down_proj": (H, cfg["intermediate_size"])}.items():
                fp8_linear(p + "mlp." + proj, n, k)
            continue
        I = cfg["moe_intermediate_size"]
        tensors[p + "mlp.gate.weight"] = C.normal(r, (cfg["n_routed_experts"], H), C.bf16)
        experts = [f"mlp.experts.{e}." for e in range(cfg["n_routed_experts"])] + ["mlp.shared_experts."]
        for e in experts:
            width = I * (cfg["n_shared_experts"] if e.startswith("mlp.shared") else 1)
            fp8_linear(p + e + "gate_proj", width, H)
            fp8_linear(p + e + "up_proj", width, H)
            fp8_linear(p + e + "down_proj", H, width)
    tensors["model.norm.weight"] = C.normal(r, (H,), C.bf16, scale=1.0)
    tensors["lm_head.weight"] = C.normal(r, (cfg["vocab_size"], H), C.bf16)
    return tensors


def expand_scales(s: WeightData, n: int, k: int, block: int = BLOCK) -> WeightData:
    """[ceil(n/block), ceil(k/block)] -> [n, k], each scale repeated over its block (two lazy takes)."""
    return s[np.arange(n) // block][:, np.arange(k) // block]


def dequantize_block_fp8(w: WeightData, s: WeightData, block: int = BLOCK) -> WeightData:
    n, k = w.shape
    return (w.astype(DType.float32) * expand_scales(s, n, k, block)).astype(DType.bfloat16)


def convert_fp8_state_dict(state_dict, block: int = BLOCK, **unused_kwargs):
    out = {}
    for name, value in state_dict.items():
        if name.endswith(".weight_scale_inv"):
            continue
        data = value.data()
        scale_name = name + "_scale_inv"
        if data.dtype == DType.float8_e4m3fn and scale_name in state_dict:
            data = dequantize_block_fp8(data, state_dict[scale_name].data(), block)
        out[name] = data
    return out


def reference(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, a in raw.items():
        if name.endswith(".weight_scale_inv"):
            continue
        if a.dtype == C.f8e4m3:
            s = raw[name + "_scale_inv"]
            n, k = a.shape
            full = np.repeat(np.repeat(s, BLOCK, axis=0), BLOCK, axis=1)[:n, :k]
            a = (a.astype(np.float32) * full).astype(C.bf16)
        out[name] = a
    return out


def verify(got: dict, raw: dict, title: str) -> None:
    want = reference(raw)
    check_keys(got, want, f"{title}: names")
    for name in sorted(set(got) & set(want)):
        check(f"{title}: {name}", got[name], want[name])


def main() -> int:
    with C.workdir("deepseek") as d:
        src = C.write_safetensors(os.path.join(d, "deepseek-v3", "model.safetensors"), deepseek_tensors(), DEEPSEEK)
        raw = C.read_safetensors(src)
        weights = load_weights([src])
        state_dict = dict(weights.items())

        # What is lazy, on one tensor (the partial-block kv_a_proj_with_mqa): the operands of the multiply.
        kv = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
        w = state_dict[kv].data()
        C.print_plan(plan({kv + " (f32)": w.astype(DType.float32),
                           kv + " (scales expanded)": expand_scales(state_dict[kv + "_scale_inv"].data(), *w.shape)}),
                     f"plan: the lazy operands for {kv} {list(w.shape)}")

        adapted = convert_fp8_state_dict(state_dict)
        p = plan(adapted)
        C.print_plan(p, "plan: FP8 (e4m3) x 128x128 block scales -> bf16")
        out = os.path.join(d, "bf16")
        p.save(out)
        verify(C.read_saved(out), raw, "saved")
    return C.verdict("DeepSeek FP8 128x128 block dequantization to bf16 lazily, partial blocks included")


if __name__ == "__main__":
    C.run(main)
