"""Hyperparameters both ways for the record-driven families (`archs.Arch.hparams`).

HF -> GGUF: each `HParam` takes the first of its config.json names present (transformers 5 names first,
then the legacy aliases: `n_embd`, `rotary_pct`, `n_ctx` ...), typed as gguf-py's writer types it. Besides the
rows: `rope.freq_base` (`rope_theta` or `rope_parameters.rope_theta`), `rope.dimension_count` (head_dim, times
`partial_rotary_factor` / `rotary_pct` for partial-rotary families), `key_length`/`value_length` from an
explicit `head_dim`, `vocab_size`.

GGUF -> HF: each row written back under its first name, `rope_parameters`, the record's `hf_extra`, and what
the tensors say (`tie_word_embeddings`, the family's attention-bias flag).

Example:
    >>> from lazyweights.adapters.archs import ARCHS
    >>> md = gguf_hparams(ARCHS["gpt_neox"], {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
    ...     "intermediate_size": 96, "max_position_embeddings": 128, "layer_norm_eps": 1e-5, "rotary_pct": 0.25})
    >>> md["gptneox.rope.dimension_count"].value, md["gptneox.feed_forward_length"].value
    (4, 96)
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..core.errors import GGUFConfigError
from .archs import FFN, KV, Arch, HParam

# the config flag saying attention projections carry biases, per family (GGUF -> HF, from the tensors)
_BIAS_FLAG = {"gpt_neox": "attention_bias", "stablelm": "use_qkv_bias", "starcoder2": "use_bias",
              "falcon": "bias", "olmo": "attention_bias", "olmo2": "attention_bias", "granite": "attention_bias",
              "gemma": "attention_bias", "cohere": "attention_bias", "seed_oss": "attention_bias",
              "arcee": "attention_bias", "nemotron": "attention_bias", "ernie4_5": "use_bias",
              "smollm3": "attention_bias", "glm4_moe": "attention_bias",
              "gpt_oss": "attention_bias"}
_REQUIRED = ("context_length", "embedding_length", "block_count", "attention.head_count")


def _first(cfg: Mapping[str, Any], names: Iterable[str]):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return None


def rope_parameters(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """transformers 5's `rope_parameters` (its `full_attention` entry where it has one per layer type), or {}."""
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping):
        return params.get("full_attention", params) if isinstance(params.get("full_attention"), Mapping) \
            else params
    return {}


def _rotary_factor(cfg: Mapping[str, Any]) -> float:
    v = _first(rope_parameters(cfg), ("partial_rotary_factor",))
    if v is None:
        v = _first(cfg, ("partial_rotary_factor", "rotary_pct"))
    return 1.0 if v is None else float(v)


def _product(cfg: Mapping[str, Any], names: Iterable[str]):
    out = 1
    for n in names:
        v = cfg.get(n)
        if v is None:
            return None
        out *= int(v)
    return out


def _kv_heads(rec: Arch, cfg: Mapping[str, Any], heads: int) -> int:
    if rec.model_type == "gpt_bigcode":
        return 1 if cfg.get("multi_query", True) else heads
    if rec.model_type == "falcon" and not cfg.get("new_decoder_architecture", False):
        return 1 if cfg.get("multi_query", True) else heads
    v = _first(cfg, ("num_key_value_heads", "num_kv_heads", "n_head_kv"))
    return heads if v is None else int(v)


def _value(hp: HParam, v):
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    if hp.kind == "f32":
        return GGUFValue(float(v), T.FLOAT32)
    if hp.kind == "bool":
        return GGUFValue(bool(v), T.BOOL)
    return GGUFValue(int(v), T.UINT32)


def gguf_hparams(rec: Arch, cfg: Mapping[str, Any]) -> dict:
    """`{arch}.*` GGUF key/values for a record-driven family's config.json dict. GGUFConfigError lists what a
    GGUF needs and the config lacks."""
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    a = rec.gguf
    md: dict[str, Any] = {}
    rows = (*rec.hparams, *rec.tail)
    found = {hp.key: _product(cfg, hp.hf) if hp.kind == "prod" else _first(cfg, hp.hf) for hp in rows}
    missing = [f"{k} ({' or '.join(hp.hf)})" for hp in rows for k in [hp.key]
               if (k in _REQUIRED or hp in rec.tail) and found[k] is None and k not in rec.gguf_fixed]
    if missing:
        raise GGUFConfigError(f"config.json ({rec.model_type}) lacks {', '.join(missing)}", missing)
    hidden, heads = int(found["embedding_length"]), int(found["attention.head_count"])
    if found.get("feed_forward_length") is None and rec.ffn_mult:
        md[f"{a}.feed_forward_length"] = _value(FFN, rec.ffn_mult * hidden)
    if "attention.head_count_kv" in found:
        found["attention.head_count_kv"] = _kv_heads(rec, cfg, heads)
    md.update(_rows(rec, rec.hparams, found))
    for key, v in rec.gguf_fixed.items():
        if f"{a}.{key}" in md:
            continue  # the config's own value wins
        kind = "bool" if isinstance(v, bool) else "f32" if isinstance(v, float) else "u32"
        md[f"{a}.{key}"] = _value(HParam(key, (), kind), v)
    head_dim = hidden // heads
    if cfg.get("head_dim") is not None and rec.model_type != "granite":  # llama.cpp's Granite ignores head_dim
        head_dim = int(cfg["head_dim"])
        if not rec.head_dims:
            md[f"{a}.attention.key_length"] = GGUFValue(head_dim, T.UINT32)
            md[f"{a}.attention.value_length"] = GGUFValue(head_dim, T.UINT32)
    theta = _first(cfg, ("rope_theta",))
    if theta is None:
        theta = rope_parameters(cfg).get("rope_theta")
    if theta is not None:
        md[f"{a}.rope.freq_base"] = GGUFValue(float(theta), T.FLOAT32)
    if rec.head_dims:
        md[f"{a}.attention.key_length"] = GGUFValue(head_dim, T.UINT32)
        md[f"{a}.attention.value_length"] = GGUFValue(head_dim, T.UINT32)
    if rec.partial_rotary:
        md[f"{a}.rope.dimension_count"] = GGUFValue(int(_rotary_factor(cfg) * head_dim), T.UINT32)
    elif rec.rope_permute:
        md[f"{a}.rope.dimension_count"] = GGUFValue(head_dim, T.UINT32)
    if cfg.get("vocab_size") is not None:
        md[f"{a}.vocab_size"] = GGUFValue(int(cfg["vocab_size"]), T.UINT32)
    window = cfg.get("sliding_window")
    if window and (rec.window_always or (rec.window_flag and cfg.get(rec.window_flag))):
        md[f"{a}.attention.sliding_window"] = GGUFValue(int(window), T.UINT32)
    md.update(_rope_scaling(a, cfg))
    if rec.mla:
        md.update(_mla_hparams(a, cfg))
    if rec.mrope:
        sections = [int(x) for x in (rope_parameters(cfg).get("mrope_section")
                                     or (cfg.get("rope_scaling") or {}).get("mrope_section") or [])]
        if not sections or len(sections) > 4:
            raise GGUFConfigError(f"config.json ({rec.model_type}): M-RoPE needs rope_parameters.mrope_section "
                                  f"(up to 4 sections), got {sections}", [f"{a}.rope.dimension_sections"])
        md[f"{a}.rope.dimension_sections"] = GGUFValue(sections + [0] * (4 - len(sections)), T.ARRAY, T.INT32)
    if rec.sliding and cfg.get("sliding_window") is not None:
        md[f"{a}.attention.sliding_window"] = GGUFValue(int(cfg["sliding_window"]), T.UINT32)
        md[f"{a}.attention.sliding_window_pattern"] = GGUFValue(_sliding_pattern(cfg), T.ARRAY, T.BOOL)
    md.update(_rows(rec, rec.tail, found))
    return md


def _rows(rec: Arch, rows: Iterable[HParam], found: Mapping[str, Any]) -> dict:
    """`{arch}.{key}` values for `rows` from what the config holds (`found`); a per-layer list must repeat one
    value (GGUFConfigError otherwise)."""
    a = rec.gguf
    md: dict[str, Any] = {}
    for hp in rows:
        v = found[hp.key]
        if isinstance(v, list):  # per-layer lists (HunYuan's moe_topk, ...): llama.cpp takes one value
            if not v or any(x != v[0] for x in v):
                raise GGUFConfigError(f"config.json ({rec.model_type}): {' or '.join(hp.hf)} varies per layer "
                                      f"({v}); llama.cpp's {a}.{hp.key} holds one value", [f"{a}.{hp.key}"])
            v = v[0]
        if v is not None:
            md[f"{a}.{hp.key}"] = _value(hp, v)
    return md


def _rope_scaling(a: str, cfg: Mapping[str, Any]) -> dict:
    """Linear / YaRN RoPE scaling as llama.cpp's keys (`rope.scaling.type`, `factor`, `original_context_length`),
    from `rope_parameters` (transformers 5) or `rope_scaling`; other types (Llama 3's) are the families' own."""
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    rs = cfg.get("rope_scaling")
    rs = rs if isinstance(rs, Mapping) else rope_parameters(cfg)
    kind = rs.get("rope_type") or rs.get("type")
    if kind not in ("linear", "yarn") or rs.get("factor") is None:
        return {}
    out = {f"{a}.rope.scaling.type": GGUFValue(str(kind), T.STRING),
           f"{a}.rope.scaling.factor": GGUFValue(float(rs["factor"]), T.FLOAT32)}
    if rs.get("original_max_position_embeddings") is not None:
        out[f"{a}.rope.scaling.original_context_length"] = GGUFValue(int(rs["original_max_position_embeddings"]),
                                                                      T.UINT32)
    if kind == "yarn":  # as llama.cpp's converter writes them, where the config sets them
        for hf_name, key in _YARN_KEYS:
            v = rs.get(hf_name, rs.get("attn_factor")) if hf_name == "attention_factor" else rs.get(hf_name)
            if v is not None:
                out[f"{a}.rope.scaling.{key}"] = GGUFValue(float(v), T.FLOAT32)
    return out


# YaRN's parameters: rope_parameters name -> llama.cpp's `rope.scaling.*` key
_YARN_KEYS = (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"),
              ("extrapolation_factor", "yarn_ext_factor"), ("attention_factor", "yarn_attn_factor"))


_MLA_KEYS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")


def _mla_hparams(a: str, cfg: Mapping[str, Any]) -> dict:
    """DeepSeek's MLA as llama.cpp runs it: MQA over the compressed latent (one kv head whose key is
    `kv_lora_rank + qk_rope_head_dim` wide, value `kv_lora_rank`), the per-head sizes as the `_mla` keys."""
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    missing = [k for k in _MLA_KEYS if cfg.get(k) is None]
    if missing:
        raise GGUFConfigError(f"config.json ({cfg.get('model_type')}) lacks {', '.join(missing)} (MLA)", missing)
    nope, rope, v, r = (int(cfg[k]) for k in _MLA_KEYS)
    vals = {"attention.head_count_kv": 1, "attention.key_length": r + rope, "attention.value_length": r,
            "attention.key_length_mla": nope + rope, "attention.value_length_mla": v, "rope.dimension_count": rope}
    return {f"{a}.{k}": GGUFValue(x, T.UINT32) for k, x in vals.items()}


def _mla_config(get) -> dict:
    """config.json's MLA sizes back from the GGUF keys `_mla_hparams` writes."""
    rope = int(get("rope.dimension_count"))
    return {"qk_rope_head_dim": rope, "qk_nope_head_dim": int(get("attention.key_length_mla")) - rope,
            "v_head_dim": int(get("attention.value_length_mla")), "head_dim": rope,
            "q_lora_rank": None if get("attention.q_lora_rank") is None else int(get("attention.q_lora_rank"))}


def _sliding_pattern(cfg: Mapping[str, Any]) -> list[bool]:
    """Per layer, true = sliding-window attention: from layer_types, else every `sliding_window_pattern`-th
    layer (default 4, as llama.cpp's converter assumes for OLMo 3) attends globally."""
    n = int(_first(cfg, ("num_hidden_layers", "n_layer")) or 0)
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return [t == "sliding_attention" for t in types]
    p = cfg.get("sliding_window_pattern", 4)
    if isinstance(p, str):  # "LLLG"
        return [p[i % len(p)] == "L" for i in range(n)]
    return [(i + 1) % int(p) != 0 for i in range(n)]


def hf_config(rec: Arch, md: Mapping[str, Any], names: set[str] | None, vocab: int, arch: str | None = None) -> dict:
    """config.json for a record-driven family from GGUF metadata (`names`: the GGUF tensor names; `arch`: the
    GGUF architecture when it is not the record's, as for a VL model's text part read back as its text model)."""
    a = arch or rec.gguf

    def get(key, default=None):
        v = md.get(f"{a}.{key}", default)
        return v.tolist() if hasattr(v, "tolist") else v

    cfg: dict[str, Any] = {"architectures": [rec.hf_class], "model_type": rec.model_type, "vocab_size": int(vocab)}
    for hp in (*rec.hparams, *rec.tail):
        v = get(hp.key)
        if v is not None and hp.kind != "prod":
            cfg[hp.hf[0]] = float(v) if hp.kind == "f32" else bool(v) if hp.kind == "bool" else int(v)
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    gqa = KV in rec.hparams  # llama-style configs (Falcon's head_dim is a read-only property)
    if gqa and get("attention.head_count_kv") is None:  # llama.cpp's default; transformers' may differ (Qwen2: 32)
        cfg[KV.hf[0]] = heads
    if get("attention.key_length") is not None or gqa:  # explicit: Qwen3's config defaults head_dim to 128
        cfg["head_dim"] = head_dim
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", 10000.0))}
    if rec.partial_rotary:
        rope["partial_rotary_factor"] = int(get("rope.dimension_count", head_dim)) / head_dim
    kind = get("rope.scaling.type")
    if kind in ("linear", "yarn") and get("rope.scaling.factor") is not None:
        rope.update(rope_type=str(kind), factor=float(get("rope.scaling.factor")))
        if get("rope.scaling.original_context_length") is not None:
            rope["original_max_position_embeddings"] = int(get("rope.scaling.original_context_length"))
        if kind == "yarn":
            for hf_name, key in _YARN_KEYS:
                if get(f"rope.scaling.{key}") is not None:
                    rope[hf_name] = float(get(f"rope.scaling.{key}"))
            if rec.yarn_truncate is not None:
                rope["truncate"] = rec.yarn_truncate
    if rec.window_flag:
        window = get("attention.sliding_window")
        cfg[rec.window_flag] = bool(window)
        if window:
            cfg["sliding_window"] = int(window)
    if rec.sliding:
        window = get("attention.sliding_window")
        cfg["sliding_window"] = int(window) if window else None
        pattern = get("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            cfg["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        elif not window:  # no window: every layer global (EXAONE 4 would otherwise derive a pattern from 0)
            cfg["layer_types"] = ["full_attention"] * int(get("block_count"))
    if rec.mla:
        cfg.update(_mla_config(get), num_key_value_heads=heads)
    if rec.embedding:
        cfg["type_vocab_size"] = int(md.get("tokenizer.ggml.token_type_count", 2))
    else:
        cfg["rope_parameters"] = rope
    cfg.update(rec.hf_extra)
    if names is not None:
        cfg["tie_word_embeddings"] = "output.weight" not in names
        flag = _BIAS_FLAG.get(rec.model_type)
        if flag:
            cfg[flag] = bool({"blk.0.attn_q.bias", "blk.0.attn_qkv.bias"} & names)
        if rec.model_type == "falcon":
            kv = int(get("attention.head_count_kv", 1))
            cfg["new_decoder_architecture"] = "blk.0.attn_norm_2.weight" in names
            cfg["multi_query"] = kv == 1
            if cfg["new_decoder_architecture"]:
                cfg["num_ln_in_parallel_attn"] = 2
        if rec.model_type == "gpt_bigcode":
            cfg["multi_query"] = int(get("attention.head_count_kv", 1)) == 1
        if rec.model_type in ("cohere", "glm4_moe"):
            cfg["use_qk_norm"] = "blk.0.attn_q_norm.weight" in names
        if rec.model_type == "stablelm":
            cfg["use_parallel_residual"] = "blk.0.ffn_norm.weight" not in names
            cfg["qk_layernorm"] = False
    return cfg


def expected_gguf_shapes(md: Mapping[str, Any], arch: str) -> dict[str, tuple[int, ...]]:
    """Per-layer GGUF tensor part -> the shape (rows, cols) llama.cpp's loader requires from the hyperparameters
    (`check_tensor_dims`), for the parts every family shapes alike; the rest (fused gate_up, norms, experts)
    are left to llama.cpp."""
    def get(key):
        v = md.get(f"{arch}.{key}")
        v = getattr(v, "value", v)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    embd, heads = get("embedding_length"), get("attention.head_count")
    if not embd or not heads:
        return {}
    kv = get("attention.head_count_kv") or heads
    kd = get("attention.key_length") or embd // heads
    vd = get("attention.value_length") or kd
    if get("attention.key_length_mla"):  # MLA: the per-head sizes of q and the output
        kv, kd, vd = heads, get("attention.key_length_mla"), get("attention.value_length_mla") or kd
    out: dict[str, tuple[int, ...]] = {"attn_q": (heads * kd, embd), "attn_k": (kv * kd, embd),
                                       "attn_v": (kv * vd, embd), "attn_output": (embd, heads * vd),
                                       "attn_qkv": (heads * kd + kv * kd + kv * vd, embd)}
    ff = get("feed_forward_length")
    if ff:
        out.update(ffn_gate=(ff, embd), ffn_down=(embd, ff))
    vocab = get("vocab_size")
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
