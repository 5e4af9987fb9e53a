"""Phi-3's LongRoPE, both ways: the hooks on the phi3 record (`archs`, `family_hooks.PHI3`).

HF -> GGUF: the long and short factors become llama.cpp's `rope_factors_long.weight` / `rope_factors_short.weight`
tensors (float32, one per rotary frequency: `longrope_tensors`), the original context `rope.scaling.
original_context_length` and the attention scale `rope.scaling.attn_factor` (`rope_to_gguf`). GGUF -> HF: the
tensors and keys become `rope_parameters` {"rope_type": "longrope", ...} (`longrope_from_gguf`) and
`original_max_position_embeddings` (`rope_to_hf`).

Example:
    >>> cfg = {"max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    ...        "rope_parameters": {"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}
    >>> md = rope_to_gguf(cfg, "phi3")
    >>> md["phi3.rope.scaling.original_context_length"].value, round(md["phi3.rope.scaling.attn_factor"].value, 4)
    (4096, 1.1902)
    >>> rope_to_hf({"{arch}.rope.scaling.original_context_length": 4096}.get)
    {'original_max_position_embeddings': 4096}
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ..core.config_access import config_first, config_get
from ..core.errors import ConfigError, GGUFConfigError
from ..formats.rope_scaling import rope_parameters
from ..lazy.weight_data import WeightData
from .rotary import rotary_factor


def rope_to_gguf(cfg: Mapping[str, Any], a: str) -> dict:
    """Phi-3's RoPE keys beyond the shared ones: the original context (top level or inside `rope_parameters`)
    and, for a LongRoPE config, the attention factor."""
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys as K

    from ..formats.gguf_writer import GGUFValue

    md: dict[str, Any] = {}
    orig = config_first(cfg, ("original_max_position_embeddings",)) or \
        config_first(rope_parameters(cfg), ("original_max_position_embeddings",))
    if orig:
        md[K.Rope.SCALING_ORIG_CTX_LEN.format(arch=a)] = GGUFValue(int(orig), T.UINT32)
    if longrope_parameters(cfg) is not None:
        md[K.Rope.SCALING_ATTN_FACTOR.format(arch=a)] = GGUFValue(longrope_attn_factor(cfg), T.FLOAT32)
    return md


def rope_to_hf(get: Callable[..., Any]) -> dict:
    """config.json's `original_max_position_embeddings` back from the GGUF (`get`: a gguf-py `Keys` template)."""
    from gguf.constants import Keys as K

    orig = get(K.Rope.SCALING_ORIG_CTX_LEN)
    return {"original_max_position_embeddings": int(orig)} if orig else {}


def longrope_parameters(cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The LongRoPE (Phi-3 "longrope", formerly "su") parameters of a config: `rope_scaling` or
    `rope_parameters` when its type says so and it holds long factors, else None.

    >>> longrope_parameters({"rope_scaling": {"type": "su", "long_factor": [2.0], "short_factor": [1.0]}})["type"]
    'su'
    """
    rs = cfg.get("rope_scaling")
    rs = rs if isinstance(rs, Mapping) else rope_parameters(cfg)
    kind = str(rs.get("rope_type") or rs.get("type") or "").lower()
    return rs if kind in ("longrope", "su") and rs.get("long_factor") else None


def longrope_attn_factor(cfg: Mapping[str, Any]) -> float:
    """LongRoPE's attention (cos/sin) scale: the config's `attention_factor`, else as transformers and llama.cpp's
    converter compute it, sqrt(1 + ln(s) / ln(original context)) with s = context / original context (1 if s <= 1).

    >>> round(longrope_attn_factor({"max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    ...     "rope_parameters": {"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}), 4)
    1.1902
    """
    import math

    rs = longrope_parameters(cfg) or {}
    if rs.get("attention_factor") is not None:
        return float(rs["attention_factor"])
    orig = config_first(rs, ("original_max_position_embeddings",)) or \
        config_first(cfg, ("original_max_position_embeddings",))
    ctx = config_first(cfg, ("max_position_embeddings", "n_positions"))
    if not orig or not ctx:
        raise GGUFConfigError(f"config.json ({cfg.get('model_type')}): LongRoPE needs max_position_embeddings and "
                              f"original_max_position_embeddings, got {ctx} and {orig}",
                              ["original_max_position_embeddings"])
    scale = float(ctx) / float(orig)
    return math.sqrt(1 + math.log(scale) / math.log(float(orig))) if scale > 1.0 else 1.0


def longrope_tensors(cfg: Mapping[str, Any]) -> dict[str, WeightData]:
    """Phi-3's LongRoPE factors as llama.cpp's converter stores them: `rope_factors_long.weight` and
    `rope_factors_short.weight`, float32, one per rotary frequency (ConfigError naming both lengths otherwise)."""
    import numpy as np

    rs = longrope_parameters(cfg)
    if rs is None:
        return {}
    heads = int(cfg["num_attention_heads"])
    head_dim = int(config_get(cfg, "head_dim", int(cfg["hidden_size"]) // heads))
    want = int(rotary_factor(cfg) * head_dim) // 2
    out = {}
    for which in ("long", "short"):
        f = np.asarray(rs.get(f"{which}_factor") or [], dtype=np.float32)
        if f.shape != (want,):
            raise ConfigError(f"config.json ({cfg.get('model_type')}): LongRoPE {which}_factor has {f.size} values; "
                              f"the {want * 2} rotary dimensions need {want}")
        out[f"rope_factors_{which}.weight"] = WeightData.from_numpy(f, f"rope_factors_{which}.weight")
    return out


def longrope_from_gguf(md: Mapping[str, Any], arch: str, factors: Mapping[str, Any]) -> dict:
    """`rope_parameters` for Phi-3's LongRoPE from the two factor tensors and the GGUF's original context
    (GGUFConfigError when one tensor or the original context is missing)."""
    import numpy as np
    from gguf.constants import Keys

    orig = md.get(Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch=arch))
    missing = [f"rope_factors_{w}.weight" for w in ("long", "short") if factors.get(w) is None]
    if orig is None:
        missing.append(Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch=arch))
    if missing:
        raise GGUFConfigError(f"GGUF ({arch}) has LongRoPE factors but lacks {', '.join(missing)}", missing)
    out: dict[str, Any] = {"rope_type": "longrope", "original_max_position_embeddings": int(orig or 0)}  # checked above
    for w in ("long", "short"):
        out[f"{w}_factor"] = [float(x) for x in np.asarray(factors[w], dtype=np.float32).reshape(-1)]
    attn = md.get(Keys.Rope.SCALING_ATTN_FACTOR.format(arch=arch))
    if attn is not None:
        out["attention_factor"] = float(attn)
    return out
