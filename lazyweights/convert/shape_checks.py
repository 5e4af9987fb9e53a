"""The shapes llama.cpp's loader requires of a converted GGUF's tensors, checked before anything is written.

HF -> GGUF converts lazily: nothing is read until the save, so a checkpoint whose tensors do not fit its
config.json would otherwise fail inside llama.cpp (`check_tensor_dims`) long after the file is written.
`expected_gguf_shapes(md, arch)` says, from the GGUF hyperparameters, the (rows, cols) of the per-layer parts every
family shapes alike (attention, the dense MLP, the embeddings); `check_shapes` raises `ShapeError` naming the
first tensor (its Hugging Face and GGUF names) that differs, with both shapes. `to_gguf.convert_hf_to_gguf`
calls it on the adapted state dict.

Example:
    >>> md = {"llama.embedding_length": 64, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
    ...       "llama.feed_forward_length": 96}
    >>> want = expected_gguf_shapes(md, "llama")
    >>> want["attn_k"], want["ffn_down"]
    ((32, 64), (64, 96))
    >>> import numpy as np
    >>> from lazyweights import WeightData
    >>> k = WeightData.from_numpy(np.zeros((64, 64), np.float32), "k")
    >>> try:
    ...     check_shapes({"blk.0.attn_k.weight": k}, md, "llama", {}, "llama")
    ... except ValueError as e:
    ...     print(type(e).__name__, str(e).split("), ")[-1])
    ShapeError config.json (llama) makes it [32, 64]
"""
from __future__ import annotations

from typing import Any, Mapping

from ..adapters.archs import ARCHS


def expected_gguf_shapes(md: Mapping[str, Any], arch: str) -> dict[str, tuple[int, ...]]:
    """Per-layer GGUF tensor part -> the shape (rows, cols) llama.cpp's loader requires from the hyperparameters
    (`check_tensor_dims`), for the parts every family shapes alike; the rest (fused gate_up, norms, experts)
    are left to llama.cpp."""
    from gguf.constants import Keys as K

    def get(key: str):  # key: gguf-py's template (Keys.*)
        v = md.get(key.format(arch=arch))
        v = getattr(v, "value", v)
        if isinstance(v, list) and v:  # a hybrid's per-layer kv heads (0 on Mamba layers): the attention layers'
            v = max(v)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    embd, heads = get(K.LLM.EMBEDDING_LENGTH), get(K.Attention.HEAD_COUNT)
    if not embd or not heads:
        return {}
    kv = get(K.Attention.HEAD_COUNT_KV) or heads
    kd = get(K.Attention.KEY_LENGTH) or embd // heads
    vd = get(K.Attention.VALUE_LENGTH) or kd
    if get(K.Attention.KEY_LENGTH_MLA):  # MLA: the per-head sizes of q and the output
        kv, kd, vd = heads, get(K.Attention.KEY_LENGTH_MLA), get(K.Attention.VALUE_LENGTH_MLA) or kd
    out: dict[str, tuple[int, ...]] = {"attn_q": (heads * kd, embd), "attn_k": (kv * kd, embd),
                                       "attn_v": (kv * vd, embd), "attn_output": (embd, heads * vd),
                                       "attn_qkv": (heads * kd + kv * kd + kv * vd, embd)}
    if any(a.gdn and a.gguf == arch for a in ARCHS.values()):  # Qwen's gated attention: q_proj holds q and gate;
        out["attn_q"] = (2 * heads * kd, embd)                 # attn_qkv is the gated delta-net's
        del out["attn_qkv"]
    ff = get(K.LLM.FEED_FORWARD_LENGTH)
    if ff:
        out.update(ffn_gate=(ff, embd), ffn_down=(embd, ff))
    if get(K.Attention.KEY_LENGTH_SWA):  # Gemma 4: head dims / MLP widths per layer; llama.cpp checks these
        out = {}
    vocab = get(K.LLM.VOCAB_SIZE)
    if vocab:
        out.update(token_embd=(vocab, embd), output=(vocab, embd))
    return out


def check_shapes(adapted: Mapping[str, Any], md: Mapping[str, Any], arch: str, source_names: Mapping[str, str],
                 model_type: str) -> None:
    """ShapeError naming the first tensor (its Hugging Face and GGUF names) whose shape is not what the config
    makes it, with both shapes; raised before anything is written."""
    from ..core.errors import ShapeError

    want = expected_gguf_shapes(md, arch)
    for g, wd in adapted.items():
        parts = g.split(".")
        if parts[-1] != "weight":
            continue
        part = parts[2] if parts[0] == "blk" and len(parts) == 4 else parts[0] if len(parts) == 2 else None
        exp = want.get(part or "")
        shape = tuple(int(d) for d in wd.shape)
        if exp is not None and len(shape) == 2 and shape != exp:
            raise ShapeError(f"{source_names.get(g, g)!r} (GGUF {g!r}): the checkpoint holds shape {list(shape)} "
                             f"(as llama.cpp stores it), config.json ({model_type}) makes it {list(exp)}")
