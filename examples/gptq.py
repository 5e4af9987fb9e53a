"""GPTQ: `g_idx` -> `perm_idx = argsort(g_idx)` (int32), drop `qzeros` and biases, float16 -> bfloat16.

    python examples/gptq.py

A GPTQ (AutoGPTQ / GPTQModel, 4-bit, act-order `desc_act=True`) checkpoint stores, per quantized linear
layer with `in_features` = Hin and `out_features` = O:

    qweight  int32 [Hin/8, O]          eight 4-bit values packed per int32 along the input dimension
    qzeros   int32 [Hin/group, O/8]    packed zero points
    scales   f16   [Hin/group, O]
    g_idx    int32 [Hin]               the quantization group of each input channel (act-order scrambles it)
    bias     f16   [O]

The seed document: "GPTQ checkpoints store a g_idx permutation that you must convert to the inverse
perm_idx representation expected by the kernel". This adapter (as the seed's other adapters do) strips
`model.`, drops `qzeros` and the biases (the kernel uses symmetric zero points and the module has no
bias), casts float16 to bfloat16 except biases and scales (the seed's cast rule: embeddings, norms and
lm_head become bf16; `scales` stay f16; `qweight` is int32 and untouched), and replaces each `g_idx` with
`perm_idx`.

What is lazy and what is not: `argsort` is not an op of the graph, so it runs eagerly on the small g_idx
(Hin int32 values, read through lazyweights with `.to_numpy()`); its int64 result becomes a `const` node
and the cast to int32 is a lazy `cast` on it. Everything else (renames, drops, casts, the qweight and scales
pass-through) is lazy. `np.argsort(..., kind="stable")`: within a group the channels keep their order, so
the result is deterministic. The check compares with an independent numpy argsort and also verifies the
property the kernel relies on: `perm_idx` is a permutation and `g_idx[perm_idx]` is sorted.
"""
from __future__ import annotations

import os

import numpy as np

import _common as C
from _common import check, check_keys, check_true

from lazyweights import DType, WeightData, load_weights, plan

# Llama-2-7B-GPTQ: hidden 4096, intermediate 11008, group_size 128, 4 bits, desc_act. Scaled down here.
LLAMA_GPTQ = dict(hidden_size=256, intermediate_size=768, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=32, vocab_size=512, num_hidden_layers=2, model_type="llama",
                  architectures=["LlamaForCausalLM"],
                  quantization_config=dict(quant_method="gptq", bits=4, group_size=64, desc_act=True, sym=True))
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def gptq_linear(r, prefix: str, n_in: int, n_out: int, group: int) -> dict[str, np.ndarray]:
    perm = r.permutation(n_in)  # act-order: channels quantized in this order, `group` at a time
    g_idx = np.empty(n_in, np.int32)
    g_idx[perm] = np.arange(n_in) // group
    return {
        prefix + ".qweight": r.integers(-2**31, 2**31, (n_in // 8, n_out), dtype=np.int64).astype(np.int32),
        prefix + ".qzeros": np.full((n_in // group, n_out // 8), 0x77777777, np.int32),  # sym: all 7s (8 - 1)
        prefix + ".scales": (r.random((n_in // group, n_out), dtype=np.float32) * 0.01 + 1e-3).astype(np.float16),
        prefix + ".g_idx": g_idx,
        prefix + ".bias": np.zeros(n_out, np.float16),  # AutoGPTQ writes a (zero) bias for every linear
    }


def gptq_tensors(cfg=LLAMA_GPTQ, seed=0) -> dict[str, np.ndarray]:
    r = C.rng(seed)
    H, I, A, K, hd, V = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                          "num_key_value_heads", "head_dim", "vocab_size"))
    group = cfg["quantization_config"]["group_size"]
    dims = {"self_attn.q_proj": (H, A * hd), "self_attn.k_proj": (H, K * hd), "self_attn.v_proj": (H, K * hd),
            "self_attn.o_proj": (A * hd, H), "mlp.gate_proj": (H, I), "mlp.up_proj": (H, I), "mlp.down_proj": (I, H)}
    t = {"model.embed_tokens.weight": C.normal(r, (V, H), np.float16)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = C.normal(r, (H,), np.float16, 1.0)
        t[p + "post_attention_layernorm.weight"] = C.normal(r, (H,), np.float16, 1.0)
        for lin in LINEARS:
            t.update(gptq_linear(r, p + lin, *dims[lin], group))
    t["model.norm.weight"] = C.normal(r, (H,), np.float16, 1.0)
    t["lm_head.weight"] = C.normal(r, (V, H), np.float16)
    return t


DROP_SUFFIXES = (".qzeros", ".bias")


def convert_gptq_state_dict(state_dict, argsort=lambda g: np.argsort(g, kind="stable"), **unused_kwargs):
    """The GPTQ adapter. `argsort` is a parameter only so the negative test can break it."""
    new_state_dict = {}
    for checkpoint_name, value in state_dict.items():
        name = checkpoint_name.replace("model.", "", 1)
        if name.endswith(DROP_SUFFIXES):
            continue
        data = value.data()
        if name.endswith(".g_idx"):
            # EAGER: argsort reads the small g_idx and becomes a const; the int32 cast stays lazy.
            perm = argsort(data.to_numpy())
            name = name[: -len("g_idx")] + "perm_idx"
            data = WeightData.from_numpy(perm, name).astype(DType.int32)
        elif data.dtype == DType.float16 and not (name.endswith("bias") or name.endswith("scales")):
            data = data.astype(DType.bfloat16)
        new_state_dict[name] = data
    return new_state_dict


def reference(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for k, a in raw.items():
        name = k.replace("model.", "", 1)
        if name.endswith(DROP_SUFFIXES):
            continue
        if name.endswith(".g_idx"):
            out[name[: -len("g_idx")] + "perm_idx"] = np.argsort(a, kind="stable").astype(np.int32)
        elif a.dtype == np.float16 and not name.endswith(("bias", "scales")):
            out[name] = a.astype(C.bf16)
        else:
            out[name] = a
    return out


def verify(got: dict, raw: dict, title: str) -> None:
    want = reference(raw)
    check_keys(got, want, f"{title}: names")
    for name in sorted(set(got) & set(want)):
        check(f"{title}: {name}", got[name], want[name])
    for name, a in raw.items():  # the property the kernel needs, independent of any argsort
        if name.endswith(".g_idx"):
            key = name.replace("model.", "", 1)[: -len("g_idx")] + "perm_idx"
            if key in got:
                perm = np.asarray(got[key])
                ok = np.array_equal(np.sort(perm), np.arange(a.size)) and bool(np.all(np.diff(a[perm]) >= 0))
                check_true(f"{title}: {key} sorts g_idx", ok, "perm_idx is not a permutation sorting g_idx")


def main() -> int:
    cfg = LLAMA_GPTQ
    with C.workdir("gptq") as d:
        src = C.write_safetensors(os.path.join(d, "llama-gptq", "model.safetensors"), gptq_tensors(cfg), cfg)
        raw = C.read_safetensors(src)
        adapted = convert_gptq_state_dict(dict(load_weights([src]).items()))
        print("note: argsort(g_idx) computed eagerly (no argsort op in the graph); it is a const node, "
              "cast to int32 lazily")
        p = plan(adapted)
        C.print_plan(p, "plan: GPTQ (drop qzeros/bias, g_idx -> perm_idx, f16 -> bf16 except scales)")
        out = os.path.join(d, "converted")
        p.save(out)
        verify(C.read_saved(out), raw, "saved")
        q = adapted["layers.0.self_attn.q_proj.qweight"]
        print(f"layers.0.self_attn.q_proj: qweight {q.dtype.name}{list(q.shape)}, "
              f"scales {adapted['layers.0.self_attn.q_proj.scales'].dtype.name}, "
              f"perm_idx {adapted['layers.0.self_attn.q_proj.perm_idx'].dtype.name}")
    return C.verdict("GPTQ g_idx -> perm_idx (int32), qzeros and biases dropped, f16 -> bf16 except scales")


if __name__ == "__main__":
    C.run(main)
