"""gpt-oss MXFP4 experts: blocks reshaped to rows of bytes, scales relabelled as float8_e8m0fnu.

    python examples/gpt_oss_mxfp4.py

gpt-oss checkpoints store the MoE expert weights in MXFP4 as two uint8 tensors per projection:

    model.layers.N.mlp.experts.gate_up_proj_blocks  uint8 [E, 2I, G, 16]   G = H/32 blocks of 32 fp4 values
    model.layers.N.mlp.experts.gate_up_proj_scales  uint8 [E, 2I, G]       one e8m0 exponent per block
    model.layers.N.mlp.experts.down_proj_blocks     uint8 [E, H, G', 16]   G' = I/32
    model.layers.N.mlp.experts.down_proj_scales     uint8 [E, H, G']

(plus bf16 `*_bias`, the router, attention with `sinks`, norms and embeddings). An MXFP4 kernel wants
each row's packed bytes contiguous and the scales typed as what they are:

    *_blocks  [E, N, G, 16] -> [E, N, G*16]   (reshape: no bytes move)
    *_scales  uint8 [E, N, G] -> float8_e8m0fnu [E, N, G]   (bit view: a relabel, 2**(s - 127))

Everything else passes through. The plan is printed, saved as safetensors (F8_E8M0 for the scales), read
back and compared with numpy's reshape / `.view(ml_dtypes.float8_e8m0fnu)` of the source; the relabelled
scales are also decoded through ml_dtypes and compared with 2**(s - 127) computed from the raw bytes.
"""
from __future__ import annotations

import os

import numpy as np

import _common as C
from _common import check, check_keys, check_true

from lazyweights import DType, load_weights, plan

# gpt-oss-20b: hidden 2880, intermediate 2880, 32 experts (top-4), 64 heads / 8 KV heads, head_dim 64,
# vocab 201088, 24 layers. Scaled down (H and I stay multiples of 32, the MXFP4 block).
GPT_OSS = dict(hidden_size=256, intermediate_size=256, num_local_experts=4, experts_per_token=2,
               num_attention_heads=8, num_key_value_heads=2, head_dim=32, vocab_size=384, num_hidden_layers=2,
               model_type="gpt_oss", architectures=["GptOssForCausalLM"],
               quantization_config=dict(quant_method="mxfp4",
                                        modules_to_not_convert=["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]))


def gpt_oss_tensors(cfg=GPT_OSS, seed=0) -> dict[str, np.ndarray]:
    r = C.rng(seed)
    H, I, E, A, K, hd, V = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_local_experts",
                                             "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"))
    t = {"model.embed_tokens.weight": C.normal(r, (V, H), C.bf16)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
        for proj, rows in (("q_proj", A * hd), ("k_proj", K * hd), ("v_proj", K * hd)):
            t[p + f"self_attn.{proj}.weight"] = C.normal(r, (rows, H), C.bf16)
            t[p + f"self_attn.{proj}.bias"] = C.normal(r, (rows,), C.bf16)
        t[p + "self_attn.o_proj.weight"] = C.normal(r, (H, A * hd), C.bf16)
        t[p + "self_attn.o_proj.bias"] = C.normal(r, (H,), C.bf16)
        t[p + "self_attn.sinks"] = C.normal(r, (A,), C.bf16, 1.0)
        t[p + "post_attention_layernorm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
        t[p + "mlp.router.weight"] = C.normal(r, (E, H), C.bf16)
        t[p + "mlp.router.bias"] = C.normal(r, (E,), C.bf16)
        x = p + "mlp.experts."
        t[x + "gate_up_proj_blocks"] = r.integers(0, 256, (E, 2 * I, H // 32, 16), dtype=np.uint8)
        t[x + "gate_up_proj_scales"] = r.integers(112, 131, (E, 2 * I, H // 32), dtype=np.uint8)  # 2**-15 .. 2**3
        t[x + "gate_up_proj_bias"] = C.normal(r, (E, 2 * I), C.bf16)
        t[x + "down_proj_blocks"] = r.integers(0, 256, (E, H, I // 32, 16), dtype=np.uint8)
        t[x + "down_proj_scales"] = r.integers(112, 131, (E, H, I // 32), dtype=np.uint8)
        t[x + "down_proj_bias"] = C.normal(r, (E, H), C.bf16)
    t["model.norm.weight"] = C.normal(r, (H,), C.bf16, 1.0)
    t["lm_head.weight"] = C.normal(r, (V, H), C.bf16)
    return t


def convert_gpt_oss_state_dict(state_dict, **unused_kwargs):
    """Blocks -> [E, N, G*16] (reshape); scales -> float8_e8m0fnu (bit view); the rest unchanged."""
    out = {}
    for name, value in state_dict.items():
        data = value.data()
        if name.endswith("_blocks"):
            e, n, g, b = data.shape
            data = data.reshape(e, n, g * b)
        elif name.endswith("_scales"):
            data = data.view(DType.float8_e8m0fnu)
        out[name] = data
    return out


def reference(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, a in raw.items():
        if name.endswith("_blocks"):
            a = a.reshape(a.shape[0], a.shape[1], -1)
        elif name.endswith("_scales"):
            a = a.view(C.e8m0)
        out[name] = a
    return out


def verify(got: dict, raw: dict, title: str) -> None:
    want = reference(raw)
    check_keys(got, want, f"{title}: names")
    for name in sorted(set(got) & set(want)):
        check(f"{title}: {name}", got[name], want[name])
    for name, s in raw.items():  # the relabelled scales decode (ml_dtypes) to 2**(s - 127)
        if name.endswith("_scales") and name in got:
            decoded = np.asarray(got[name]).astype(np.float32)
            expect = np.exp2(s.astype(np.float32) - 127)
            check_true(f"{title}: {name} decodes to 2**(s-127)", np.array_equal(decoded, expect),
                       f"{int((decoded != expect).sum())} scales decode differently")


def main() -> int:
    cfg = GPT_OSS
    with C.workdir("gpt-oss") as d:
        src = C.write_safetensors(os.path.join(d, "gpt-oss", "model.safetensors"), gpt_oss_tensors(cfg), cfg)
        raw = C.read_safetensors(src)
        adapted = convert_gpt_oss_state_dict(dict(load_weights([src]).items()))
        p = plan(adapted)
        C.print_plan(p, "plan: gpt-oss MXFP4 (blocks reshaped, scales relabelled as float8_e8m0fnu)")
        mx = [s for s in p.steps() if s.outputs[0].endswith(("_blocks", "_scales"))]
        check_true("blocks and scales are zero-copy views", bool(mx) and all(s.kind == "view" for s in mx),
                   f"step kinds: {sorted({s.kind for s in mx})}")
        got = p.materialize()
        verify(got, raw, "materialized")
        out = os.path.join(d, "converted.safetensors")
        p.save(out)
        verify(C.read_saved(out), raw, "saved")
        x = "model.layers.0.mlp.experts."
        print(f"{x}gate_up_proj_blocks: {list(raw[x + 'gate_up_proj_blocks'].shape)} uint8 -> "
              f"{list(got[x + 'gate_up_proj_blocks'].shape)} {got[x + 'gate_up_proj_blocks'].dtype}; "
              f"scales -> {got[x + 'gate_up_proj_scales'].dtype}")
    return C.verdict("gpt-oss MXFP4 blocks [E,N,G,16] -> [E,N,G*16], scales uint8 -> float8_e8m0fnu == 2**(s-127)")


if __name__ == "__main__":
    C.run(main)
