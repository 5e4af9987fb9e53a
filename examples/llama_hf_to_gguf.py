"""Llama: Hugging Face safetensors -> GGUF (llama.cpp names, q/k RoPE permutation), read back with gguf-py,
and GGUF -> Hugging Face again (identity).

    python examples/llama_hf_to_gguf.py

llama.cpp's `convert_hf_to_gguf.py` renames every tensor (`model.layers.N.self_attn.q_proj.weight` ->
`blk.N.attn_q.weight`, ...), permutes the rows of q_proj and k_proj for its RoPE layout
(`LlamaModel.permute`: rows as (heads, 2, hd/2) -> (heads, hd/2, 2); k uses the KV head count), and stores
1-D tensors (the norms) as float32. `lazyweights.adapters.hf_to_gguf` does all of it lazily; the plan is
printed and streamed to a `.gguf` file (bf16 matrices, f32 norms, llama.cpp's hyperparameter keys).

Checks, all independent of lazyweights' readers:
- gguf-py's `GGUFReader` opens the file; every tensor's name, GGML type and bytes equal llama.cpp's
  conversion computed here with numpy (its `permute` written out) on tensors read with `safetensors`;
  the hyperparameter keys llama.cpp reads are present with the config's values.
- `load_weights(gguf)` + `gguf_to_hf(..., dequantize_to=bfloat16)` gives back exactly the original
  safetensors tensors (names, dtypes, bytes): f32 norms return to bf16 losslessly, the permutation is undone.
"""
from __future__ import annotations

import os

import numpy as np

import _common as C
from _common import check, check_keys, check_true

from lazyweights import DType, load_weights, plan
from lazyweights.adapters import gguf_metadata_from_config, gguf_to_hf, hf_to_gguf

# Llama 3 8B proportions, scaled down (see _common.LLAMA); GQA: 8 query heads over 2 KV heads.
LLAMA = {**C.LLAMA, "rope_theta": 500000.0, "max_position_embeddings": 8192}

# llama.cpp's names for Llama (gguf-py's tensor_mapping), written out independently of lazyweights.
LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def llamacpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py, LlamaModel.permute (verbatim)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def gguf_name(hf: str) -> str:
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_NAMES[module]}.{suffix}"


def reference_gguf(raw: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """What llama.cpp's converter writes, in numpy: GGUF name -> array (numpy order)."""
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = {}
    for name, a in raw.items():
        if name.endswith("q_proj.weight"):
            a = llamacpp_permute(a, n_head, n_head)
        elif name.endswith("k_proj.weight"):
            a = llamacpp_permute(a, n_head, n_kv)
        if a.ndim == 1:
            a = a.astype(np.float32)
        out[gguf_name(name)] = np.ascontiguousarray(a)
    return out


def read_with_gguf_py(path: str):
    """Every tensor of a GGUF file as gguf-py reads it (BF16 comes back as raw bytes: relabel them)."""
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(path)
    tensors, types = {}, {}
    for t in reader.tensors:
        data = np.array(t.data)
        if t.tensor_type == GGMLQuantizationType.BF16:
            data = data.view(C.bf16)
        tensors[t.name] = data.reshape(tuple(int(d) for d in reversed(t.shape)))
        types[t.name] = t.tensor_type.name
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return tensors, types, fields


def main() -> int:
    cfg = LLAMA
    with C.workdir("llama-gguf") as d:
        src = C.write_safetensors(os.path.join(d, "llama", "model.safetensors"), C.llama_tensors(cfg, C.bf16), cfg)
        raw = C.read_safetensors(src)

        # HF -> GGUF, lazily; stream to a .gguf file.
        weights = load_weights([src])
        to_gguf = hf_to_gguf(dict(weights.items()), cfg)
        p = plan(to_gguf)
        C.print_plan(p, "plan: HF Llama -> GGUF (renamed, q/k rows permuted, norms to f32)")
        out = os.path.join(d, "llama-bf16.gguf")
        p.save(out, metadata=gguf_metadata_from_config(cfg, name="llama-small"))

        # Read back with gguf-py; compare with llama.cpp's conversion in numpy.
        got, types, fields = read_with_gguf_py(out)
        want = reference_gguf(raw, cfg)
        check_keys(got, want, "gguf-py: tensor names")
        for name in sorted(set(got) & set(want)):
            check(f"gguf-py: {name}", got[name], want[name])
            expect_type = "F32" if want[name].ndim == 1 else "BF16"
            check_true(f"gguf-py: {name} type", types[name] == expect_type, f"{types[name]} != {expect_type}")
        keys = {"general.architecture": "llama", "llama.attention.head_count": cfg["num_attention_heads"],
                "llama.attention.head_count_kv": cfg["num_key_value_heads"], "llama.embedding_length": cfg["hidden_size"],
                "llama.block_count": cfg["num_hidden_layers"], "llama.feed_forward_length": cfg["intermediate_size"],
                "llama.rope.dimension_count": cfg["head_dim"], "llama.context_length": cfg["max_position_embeddings"]}
        for key, value in keys.items():
            check_true(f"gguf-py: {key}", fields.get(key) == value, f"{fields.get(key)!r} != {value!r}")
        print(f"gguf-py read {len(got)} tensors ({', '.join(sorted(set(types.values())))}) and "
              f"{len(fields)} metadata keys from {os.path.basename(out)}")

        # GGUF -> HF again: identity.
        gw = load_weights([out])
        gcfg = getattr(gw, "config", None)
        if gcfg is None:
            from lazyweights.formats.config import GGUFConfig

            gcfg = GGUFConfig(gw.metadata, [n for n, _ in gw.items()])
        back = gguf_to_hf(dict(gw.items()), gcfg, dequantize_to=DType.bfloat16)
        q = plan(back)
        qstep = next(s for s in q.steps() if "model.layers.0.self_attn.q_proj.weight" in s.outputs)
        print(f"reverse plan (GGUF -> HF): {len(q)} tensors, {len(q.nodes())} nodes; "
              f"q_proj: {' -> '.join(n.op for n in qstep.nodes)}")
        back_np = q.materialize()
        check_keys(back_np, raw, "round trip: names")
        for name in sorted(set(back_np) & set(raw)):
            check(f"round trip: {name}", back_np[name], raw[name])
    return C.verdict("Llama HF -> GGUF (llama.cpp names and q/k permutation, read by gguf-py) -> HF (identity)")


if __name__ == "__main__":
    C.run(main)
