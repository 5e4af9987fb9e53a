"""The sliding-window layers' own keys, both ways, for the families whose records carry them as hooks
(`family_hooks.GEMMA3`, `family_hooks.MODERNBERT`), and the two readers Gemma 4's hooks (`adapters/gemma4.py`) and
the engines share: the sliding layers' RoPE base in a config (`swa_theta`) and the default every-Nth-layer-global
layer types (`every_nth`).

Gemma 3: a per-layer `sliding_window_pattern` where `layer_types` is not every 6th layer global (llama.cpp's
default), and `rope.freq_base_swa` where the sliding layers' theta is not 10000; back: `layer_types` from the
pattern and `rope_parameters` {"sliding_attention", "full_attention"}. ModernBERT: `rope.freq_base_swa` <->
`rope_parameters.sliding_attention`.

Example:
    >>> from lazyweights.adapters.archs import ARCHS
    >>> rec = ARCHS["modernbert"]
    >>> md = rec.hooks.sliding_to_gguf({"rope_parameters": {"sliding_attention": {"rope_theta": 1e4}}}, rec)
    >>> md["modern-bert.rope.freq_base_swa"].value  # llama.cpp names the architecture modern-bert
    10000.0
    >>> every_nth(4, 2)
    ['sliding_attention', 'full_attention', 'sliding_attention', 'full_attention']
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ..core.config_access import config_first


def swa_theta(cfg: Mapping[str, Any]):
    """The sliding-window layers' own RoPE base: `rope_parameters.sliding_attention.rope_theta` (transformers 5)
    or the older top-level names (`rope_local_base_freq`: Gemma 3, `local_rope_theta`: ModernBERT); None if
    the config has none.

    >>> swa_theta({"rope_local_base_freq": 10000.0})
    10000.0
    """
    v = config_first(cfg, ("local_rope_theta", "rope_local_base_freq"))
    params = cfg.get("rope_parameters")
    if v is None and isinstance(params, Mapping) and isinstance(params.get("sliding_attention"), Mapping):
        v = params["sliding_attention"].get("rope_theta")
    return v


def every_nth(n: int, period: int) -> list[str]:
    """layer_types with every `period`-th layer global, the rest sliding (Gemma 2: 2, Gemma 3: 6).

    >>> every_nth(3, 3)
    ['sliding_attention', 'sliding_attention', 'full_attention']
    """
    return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n)]


def gemma3_sliding_to_gguf(cfg: Mapping[str, Any], rec: Any) -> dict:
    """Gemma 3's sliding-window keys: the per-layer pattern where layer_types is not every `rec.swa_period`-th
    layer global (llama.cpp's default), and `rope.freq_base_swa` where the sliding layers' theta is not 10000.

    >>> from lazyweights.adapters.archs import ARCHS
    >>> md = gemma3_sliding_to_gguf({"num_hidden_layers": 2, "rope_local_base_freq": 5e3,
    ...     "layer_types": ["full_attention", "sliding_attention"]}, ARCHS["gemma3_text"])
    >>> md["gemma3.attention.sliding_window_pattern"].value, md["gemma3.rope.freq_base_swa"].value
    ([False, True], 5000.0)
    """
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys as K

    from ..formats.gguf_writer import GGUFValue

    a, out = rec.gguf, {}
    types, n = cfg.get("layer_types"), int(cfg.get("num_hidden_layers") or 0)
    if isinstance(types, list) and types != every_nth(n, rec.swa_period):
        out[K.Attention.SLIDING_WINDOW_PATTERN.format(arch=a)] = GGUFValue([t == "sliding_attention" for t in types],
                                                                 T.ARRAY, T.BOOL)
    local = swa_theta(cfg)
    if local is not None and float(local) != 10000.0:
        out[K.Rope.FREQ_BASE_SWA.format(arch=a)] = GGUFValue(float(local), T.FLOAT32)
    return out


def gemma3_sliding_to_hf(cfg: dict, get: Callable[..., Any], rope: dict, rec: Any) -> None:
    """Gemma 3's back, into `cfg`: layer_types from a per-layer pattern (where the GGUF has one; else the engine's
    every-6th default stands) and rope_parameters per layer type (the sliding layers' theta, default 10000).

    >>> cfg = {"layer_types": None}
    >>> gemma3_sliding_to_hf(cfg, {"{arch}.attention.sliding_window_pattern": [True, False]}.get,
    ...                      {"rope_type": "default", "rope_theta": 1e6}, None)
    >>> cfg["layer_types"], cfg["rope_parameters"]["sliding_attention"]["rope_theta"]
    (['sliding_attention', 'full_attention'], 10000.0)
    """
    from gguf.constants import Keys as K

    pattern = get(K.Attention.SLIDING_WINDOW_PATTERN)
    if isinstance(pattern, list):
        cfg["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    cfg["rope_parameters"] = {"sliding_attention": {"rope_type": "default",
                                                    "rope_theta": float(get(K.Rope.FREQ_BASE_SWA, 10000.0))},
                              "full_attention": rope}


def modernbert_sliding_to_gguf(cfg: Mapping[str, Any], rec: Any) -> dict:
    """ModernBERT's sliding layers' own RoPE base as `rope.freq_base_swa` (none where the config has none).

    >>> modernbert_sliding_to_gguf({}, None)
    {}
    """
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys as K

    from ..formats.gguf_writer import GGUFValue

    swa = swa_theta(cfg)
    if swa is None:
        return {}
    return {K.Rope.FREQ_BASE_SWA.format(arch=rec.gguf): GGUFValue(float(swa), T.FLOAT32)}


def modernbert_sliding_to_hf(cfg: dict, get: Callable[..., Any], rope: dict, rec: Any) -> None:
    """ModernBERT's rope_parameters per layer type: the sliding layers' theta from `rope.freq_base_swa` (default:
    the full layers').

    >>> cfg = {}
    >>> modernbert_sliding_to_hf(cfg, {"{arch}.rope.freq_base_swa": 1e4}.get, {"rope_type": "default",
    ...                          "rope_theta": 1.6e5}, None)
    >>> cfg["rope_parameters"]["sliding_attention"]
    {'rope_type': 'default', 'rope_theta': 10000.0}
    """
    from gguf.constants import Keys as K

    swa = dict(rope, rope_theta=float(get(K.Rope.FREQ_BASE_SWA, rope["rope_theta"])))
    cfg["rope_parameters"] = {"full_attention": rope, "sliding_attention": swa}
