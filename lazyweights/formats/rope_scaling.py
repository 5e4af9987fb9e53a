"""RoPE scaling both ways, in one place: a config.json's scaling as llama.cpp's `{arch}.rope.scaling.*` keys
(`rope_scaling_to_gguf`) and back (`rope_scaling_from_gguf`), and where a config.json states it
(`rope_scaling_of`, `rope_parameters`).

    ============================ =====================================================================
    config.json (rope_parameters) GGUF key (`{arch}` = general.architecture)
    ============================ =====================================================================
    rope_type (linear, yarn)     {arch}.rope.scaling.type
    factor                       {arch}.rope.scaling.factor
    original_max_position_emb.   {arch}.rope.scaling.original_context_length
    beta_fast, beta_slow         {arch}.rope.scaling.yarn_beta_fast, yarn_beta_slow (YaRN)
    extrapolation_factor         {arch}.rope.scaling.yarn_ext_factor (YaRN)
    attention_factor             {arch}.rope.scaling.yarn_attn_factor (YaRN)
    ============================ =====================================================================

Other scalings are the families' own (Llama 3's as the `rope_freqs` tensor, Phi-3's LongRoPE factors).

Example:
    >>> from lazyweights.formats.rope_scaling import rope_scaling_from_gguf, rope_scaling_to_gguf
    >>> md = rope_scaling_to_gguf("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
    ...                                                          "original_max_position_embeddings": 4096}})
    >>> sorted(md)
    ['llama.rope.scaling.factor', 'llama.rope.scaling.original_context_length', 'llama.rope.scaling.type']
    >>> rope_scaling_from_gguf({k: v.value for k, v in md.items()}, "llama")
    {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 4096}
"""
from __future__ import annotations

from typing import Any, Mapping

from ..core.config_access import config_get


def _yarn_keys() -> tuple[tuple[str, str], ...]:
    """YaRN's parameters: rope_parameters name -> llama.cpp's `{arch}.rope.scaling.*` key (gguf.Keys.Rope, imported
    here: this module is imported without gguf)."""
    from gguf.constants import Keys

    r = Keys.Rope
    return (("beta_fast", r.SCALING_YARN_BETA_FAST), ("beta_slow", r.SCALING_YARN_BETA_SLOW),
            ("extrapolation_factor", r.SCALING_YARN_EXT_FACTOR), ("attention_factor", r.SCALING_YARN_ATTN_FACTOR))


def rope_parameters(cfg: Any) -> Mapping[str, Any]:
    """transformers 5's `rope_parameters` (its `full_attention` entry where it has one per layer type), or {}.

    >>> rope_parameters({"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {}}})
    {'rope_theta': 1000000.0}
    """
    params = config_get(cfg, "rope_parameters")
    if isinstance(params, Mapping):
        full = params.get("full_attention")
        return full if isinstance(full, Mapping) else params
    return {}


def rope_scaling_of(cfg: Any) -> Mapping[str, Any] | None:
    """The RoPE scaling a config.json states: `rope_scaling` (transformers 4), else `rope_parameters` (its full
    attention entry) when its rope_type is not "default"; None when it states none.

    >>> rope_scaling_of({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}})["factor"]
    8.0
    >>> rope_scaling_of({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}) is None
    True
    """
    rs = config_get(cfg, "rope_scaling")
    if isinstance(rs, Mapping):
        return rs
    params = rope_parameters(cfg)
    if params.get("rope_type", "default") not in ("default", None):
        return params
    return None


def rope_scaling_to_gguf(arch: str, cfg: Any) -> dict:
    """Linear / YaRN RoPE scaling as llama.cpp's keys (`GGUFValue`s typed as gguf-py's writer types them), {}
    for a config without one (or with another type: those are the families' own).

    >>> rope_scaling_to_gguf("qwen2", {"rope_scaling": {"type": "linear", "factor": 2}})["qwen2.rope.scaling.factor"]
    GGUFValue(value=2.0, type=<GGUFValueType.FLOAT32: 6>, sub_type=None)
    """
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys

    from .gguf_writer import GGUFValue

    rs = rope_scaling_of(cfg) or {}
    kind = rs.get("rope_type") or rs.get("type")
    if kind not in ("linear", "yarn") or rs.get("factor") is None:
        return {}
    r = Keys.Rope
    out = {r.SCALING_TYPE.format(arch=arch): GGUFValue(str(kind), T.STRING),
           r.SCALING_FACTOR.format(arch=arch): GGUFValue(float(rs["factor"]), T.FLOAT32)}
    if rs.get("original_max_position_embeddings") is not None:
        out[r.SCALING_ORIG_CTX_LEN.format(arch=arch)] = GGUFValue(int(rs["original_max_position_embeddings"]),
                                                                 T.UINT32)
    if kind == "yarn":  # as llama.cpp's converter writes them, where the config sets them
        for hf_name, key in _yarn_keys():
            v = rs.get(hf_name, rs.get("attn_factor")) if hf_name == "attention_factor" else rs.get(hf_name)
            if v is not None:
                out[key.format(arch=arch)] = GGUFValue(float(v), T.FLOAT32)
    return out


def rope_scaling_from_gguf(metadata: Mapping[str, Any], arch: str) -> dict | None:
    """config.json's scaling entries from a GGUF's `{arch}.rope.scaling.*` keys (the module's table): None when
    the file has no scaling type (or "none") and no factor; a factor without a type reads as linear.

    >>> rope_scaling_from_gguf({"llama.rope.scaling.factor": 2.0}, "llama")
    {'rope_type': 'linear', 'factor': 2.0}
    """
    from gguf.constants import Keys

    def get(key: str):
        v: Any = metadata.get(key.format(arch=arch))
        return v.tolist() if hasattr(v, "tolist") else v

    r = Keys.Rope
    kind, factor = get(r.SCALING_TYPE), get(r.SCALING_FACTOR)
    if kind in (None, "none") and factor is None:
        return None
    out: dict[str, Any] = {"rope_type": str(kind) if kind not in (None, "none") else "linear"}
    if factor is not None:
        out["factor"] = float(factor)
    orig = get(r.SCALING_ORIG_CTX_LEN)
    if orig is not None:
        out["original_max_position_embeddings"] = int(orig)
    if kind == "yarn":
        for hf_name, key in _yarn_keys():
            v = get(key)
            if v is not None:
                out[hf_name] = float(v)
    return out
