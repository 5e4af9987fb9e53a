"""Gemma 4's text model (`gemma4_text` <-> llama.cpp "gemma4"), both ways: the hooks on its record (`archs`,
`family_hooks.GEMMA4`), called by the engines (`lazyweights.convert`) by role.

HF -> GGUF (`gemma4_layers_to_gguf`, `layers_to_gguf`): the full layers' head dim as key/value_length and
rope.dimension_count, the sliding layers' as *_swa, the per-layer pattern, kv heads per layer where the full layers
differ, shared kv layers, the per-layer input width, MoE sizes, double-wide MLP widths, the sliding layers' theta;
the full layers' "proportional" RoPE as the `rope_freqs.weight` tensor (`gemma4_tensors`, `gguf_tensors`: 1 on
rotated pairs, 1e30 on the rest). GGUF -> HF (`gemma4_layers_to_hf`, `layers_to_hf`): config.json's head dims,
kv heads, `per_layer_config`, `layer_types`, both RoPE entries and `attention_k_eq_v`; the per-layer kv head and
feed-forward rows are read here, not by the engine (`per_layer_rows`); the full layers' `partial_rotary_factor`
from the `rope_freqs.weight` tensor (`gemma4_rope_freqs_to_hf`, `rope_freqs_to_hf`). Tensor names, both ways
(`gemma4_hf_name_to_gguf`, `hf_name_to_gguf`; `gemma4_gguf_name_candidates`, `gguf_name_candidates`): the MoE's
router scales as llama.cpp's converter names them (`.scale`) and the bare stacked experts.

Example:
    >>> f = gemma4_rope_freqs({"global_head_dim": 8, "rope_parameters": {"full_attention": {
    ...     "rope_type": "proportional", "partial_rotary_factor": 0.5}}})
    >>> gemma4_partial_rotary(f, {"1": {"head_dim": 8}})
    0.5
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from ..core.config_access import config_first
from ..core.errors import GGUFConfigError
from ..lazy.weight_data import WeightData
from .sliding import swa_theta

PER_LAYER_ROWS = ("attention.head_count_kv", "feed_forward_length")  # the rows `gemma4_config` reads per layer


def gemma4_full(cfg: Mapping[str, Any], key: str, global_key: str):
    """Gemma 4's full-attention layers' `key` (head_dim, num_key_value_heads): `global_key` (global_head_dim,
    num_global_key_value_heads), else the first full layer's entry of per_layer_config, else None."""
    v = cfg.get(global_key)
    types = cfg.get("layer_types") or []
    per_layer = cfg.get("per_layer_config") or {}
    if v is None and isinstance(per_layer, Mapping):
        for i, layer in sorted(per_layer.items(), key=lambda kv: int(kv[0])):
            if int(i) < len(types) and types[int(i)] == "full_attention" and key in layer:
                return layer[key]
    return v


def gemma4_layers_to_gguf(cfg: Mapping[str, Any], rec: Any, head_dim: int, n: int) -> dict:
    """Gemma 4's keys as llama.cpp's converter writes them: the full layers' head dim as key/value_length (and
    rope.dimension_count: their partial RoPE is the rope_freqs tensor), the sliding layers' as *_swa, the
    per-layer pattern, kv heads per layer where the full layers differ, shared kv layers, per-layer input width,
    the sliding layers' theta."""
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys as K

    from ..formats.gguf_writer import GGUFValue

    a = rec.gguf
    per_layer_width = int(cfg.get("hidden_size_per_layer_input") or 0)
    pl_vocab = cfg.get("vocab_size_per_layer_input")
    if per_layer_width and pl_vocab is not None and int(pl_vocab) != int(cfg.get("vocab_size") or 0):
        raise GGUFConfigError(f"config.json ({rec.model_type}): vocab_size_per_layer_input {pl_vocab} is not "
                              f"vocab_size {cfg.get('vocab_size')}; llama.cpp's per-layer embedding has n_vocab "
                              "rows", [K.LLM.EMBD_LENGTH_PER_LAYER_INP.format(arch=a)])
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    types = cfg.get("layer_types")
    if not isinstance(types, list) or len(types) != n:
        raise GGUFConfigError(f"config.json ({rec.model_type}): layer_types {types!r} is not a list of {n} layer "
                              "types", [K.Attention.SLIDING_WINDOW_PATTERN.format(arch=a)])
    swa = [t == "sliding_attention" for t in types]
    full = int(gemma4_full(cfg, "head_dim", "global_head_dim") or head_dim)
    out = {K.Attention.KEY_LENGTH.format(arch=a): GGUFValue(full, T.UINT32),
           K.Attention.VALUE_LENGTH.format(arch=a): GGUFValue(full, T.UINT32),
           K.Attention.KEY_LENGTH_SWA.format(arch=a): GGUFValue(head_dim, T.UINT32),
           K.Attention.VALUE_LENGTH_SWA.format(arch=a): GGUFValue(head_dim, T.UINT32),
           K.Attention.SHARED_KV_LAYERS.format(arch=a): GGUFValue(shared, T.UINT32),
           K.LLM.EMBD_LENGTH_PER_LAYER_INP.format(arch=a): GGUFValue(per_layer_width, T.UINT32),
           K.Attention.SLIDING_WINDOW_PATTERN.format(arch=a): GGUFValue(swa, T.ARRAY, T.BOOL),
           K.Rope.DIMENSION_COUNT.format(arch=a): GGUFValue(full, T.UINT32)}
    swa_params = (cfg.get("rope_parameters") or {}).get("sliding_attention") or {}
    out[K.Rope.DIMENSION_COUNT_SWA.format(arch=a)] = GGUFValue(int(head_dim * float(swa_params.get(
        "partial_rotary_factor", 1.0))), T.UINT32)
    kv_full, kv = gemma4_full(cfg, "num_key_value_heads", "num_global_key_value_heads"), cfg.get("num_key_value_heads")
    if kv_full is not None and kv is not None and int(kv_full) != int(kv):
        out[K.Attention.HEAD_COUNT_KV.format(arch=a)] = GGUFValue([int(kv) if s else int(kv_full) for s in swa],
                                                        T.ARRAY, T.UINT32)
    if cfg.get("enable_moe_block"):  # experts beside the dense MLP in every layer
        moe = {K.LLM.EXPERT_COUNT.format(arch=a): cfg.get("num_experts"),
               K.LLM.EXPERT_USED_COUNT.format(arch=a): cfg.get("top_k_experts"),
               K.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=a): config_first(cfg, ("moe_intermediate_size",
                                                                                 "expert_intermediate_size"))}
        lacking = [k for k, v in moe.items() if v is None]
        if lacking:
            raise GGUFConfigError(f"config.json ({rec.model_type}): enable_moe_block without num_experts / "
                                  "top_k_experts / moe_intermediate_size", lacking)
        out.update({k: GGUFValue(int(v), T.UINT32) for k, v in moe.items()})
    if cfg.get("use_double_wide_mlp"):  # the kv-sharing layers' MLP is twice as wide
        ff = int(cfg["intermediate_size"])
        out[K.LLM.FEED_FORWARD_LENGTH.format(arch=a)] = GGUFValue([ff if i < n - shared else 2 * ff for i in range(n)],
                                                    T.ARRAY, T.UINT32)
    local = swa_theta(cfg)
    if local is not None:
        out[K.Rope.FREQ_BASE_SWA.format(arch=a)] = GGUFValue(float(local), T.FLOAT32)
    return out


def gemma4_config(rec: Any, get: Callable[..., Any], rope: Mapping[str, Any]) -> dict:
    """Gemma 4's config.json entries back from its keys: the sliding layers' head dim and kv heads as head_dim /
    num_key_value_heads, the full layers' in per_layer_config, layer_types, both RoPE entries (the full layers'
    partial_rotary_factor comes from the rope_freqs tensor, `gemma4_partial_rotary`)."""
    from gguf.constants import Keys as K

    a = rec.gguf
    pattern = get(K.Attention.SLIDING_WINDOW_PATTERN)
    n = int(get(K.LLM.BLOCK_COUNT))
    if not isinstance(pattern, list) or len(pattern) != n:
        raise GGUFConfigError(f"GGUF ({a}): attention.sliding_window_pattern {pattern!r} is not {n} booleans",
                              [K.Attention.SLIDING_WINDOW_PATTERN.format(arch=a)])
    shared = int(get(K.Attention.SHARED_KV_LAYERS, 0) or 0)
    ff = get(K.LLM.FEED_FORWARD_LENGTH)
    ff_list = ff if isinstance(ff, list) else [ff] * n
    double = [int(ff_list[0]) if i < n - shared else 2 * int(ff_list[0]) for i in range(n)]
    if isinstance(ff, list) and [int(x) for x in ff] not in (double, [int(ff[0])] * n):
        raise GGUFConfigError(f"GGUF ({a}): feed_forward_length {ff} is neither one width nor Gemma 4's double-wide "
                              f"MLP on the last {shared} (kv-sharing) layers",
                              [K.LLM.FEED_FORWARD_LENGTH.format(arch=a)])
    full, swa_dim = int(get(K.Attention.KEY_LENGTH)), int(get(K.Attention.KEY_LENGTH_SWA))
    kv = get(K.Attention.HEAD_COUNT_KV, get(K.Attention.HEAD_COUNT))
    kv_list = kv if isinstance(kv, list) else [kv] * n
    kv_swa = next((int(k) for k, s in zip(kv_list, pattern) if s), int(kv_list[0]))
    per_layer: dict[str, dict[str, int]] = {}
    for i, (k, s) in enumerate(zip(kv_list, pattern)):
        if not s:
            per_layer[str(i)] = {"head_dim": full, **({"num_key_value_heads": int(k)} if int(k) != kv_swa else {})}
    theta_swa = float(get(K.Rope.FREQ_BASE_SWA, 10000.0))
    n_rot_swa = int(get(K.Rope.DIMENSION_COUNT_SWA, swa_dim))
    swa_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta_swa}
    if n_rot_swa != swa_dim:
        swa_rope["partial_rotary_factor"] = n_rot_swa / swa_dim
    return {"head_dim": swa_dim, "num_key_value_heads": kv_swa, "per_layer_config": per_layer,
            "layer_types": ["sliding_attention" if s else "full_attention" for s in pattern],
            "hidden_size_per_layer_input": int(get(K.LLM.EMBD_LENGTH_PER_LAYER_INP, 0) or 0),
            "num_kv_shared_layers": shared, "attention_k_eq_v": False, "intermediate_size": int(ff_list[0]),
            "use_double_wide_mlp": isinstance(ff, list) and ff != [ff[0]] * n,
            "enable_moe_block": bool(get(K.LLM.EXPERT_COUNT)), "num_experts": get(K.LLM.EXPERT_COUNT),
            "top_k_experts": get(K.LLM.EXPERT_USED_COUNT),
            "moe_intermediate_size": get(K.LLM.EXPERT_FEED_FORWARD_LENGTH),
            "rope_parameters": {"sliding_attention": swa_rope,
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 1.0,
                                                   "rope_theta": float(rope["rope_theta"])}}}


def gemma4_layers_to_hf(cfg: dict, get: Callable[..., Any], rope: Mapping[str, Any], rec: Any,
                        names: set[str] | None) -> None:
    """Gemma 4's config.json entries back, into `cfg` (`gemma4_config`), with `vocab_size_per_layer_input` and,
    from the tensor names, `attention_k_eq_v`: the full layers' k projection doubles as v (the 31B's, 26B-A4B's)
    where no full, non-shared layer has an `attn_v`."""
    from gguf.constants import Keys as K

    cfg.update(gemma4_config(rec, get, rope), vocab_size_per_layer_input=cfg["vocab_size"])
    if names is not None:  # the full layers' k projection doubles as v (the 31B's, 26B-A4B's)
        full = [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"
                and i < int(get(K.LLM.BLOCK_COUNT)) - cfg["num_kv_shared_layers"]]
        cfg["attention_k_eq_v"] = bool(full) and all(f"blk.{i}.attn_v.weight" not in names for i in full)


def gemma4_tensors(cfg: Mapping[str, Any]) -> dict[str, WeightData]:
    """The `rope_freqs.weight` tensor llama.cpp's gemma4 graph reads, made from config.json
    (`gemma4_rope_freqs`).

    >>> gemma4_tensors({"head_dim": 4, "rope_parameters": {}})["rope_freqs.weight"].shape
    (2,)
    """
    return {"rope_freqs.weight": WeightData.from_numpy(gemma4_rope_freqs(cfg), "rope_freqs.weight")}


def gemma4_rope_freqs_to_hf(cfg: dict, rope_freqs: Any) -> None:
    """The full layers' `partial_rotary_factor`, into `cfg["rope_parameters"]`, from a GGUF's `rope_freqs.weight`
    (`gemma4_partial_rotary`)."""
    full = cfg["rope_parameters"]["full_attention"]
    full["partial_rotary_factor"] = gemma4_partial_rotary(rope_freqs, cfg["per_layer_config"])


def gemma4_rope_freqs(cfg: Mapping[str, Any]):
    """Gemma 4's "proportional" RoPE of the full-attention layers as llama.cpp's converter writes it: per pair of
    the full head dim, 1 where it rotates (the first `partial_rotary_factor` share) and 1e30 (no rotation) after.

    Example:
        >>> f = gemma4_rope_freqs({"global_head_dim": 16, "rope_parameters": {"full_attention": {
        ...     "rope_type": "proportional", "partial_rotary_factor": 0.25}}})
        >>> f.tolist()[:3], f.dtype.name
        ([1.0, 1.0, 1.0000000150474662e+30], 'float32')
    """
    import numpy as np

    full = (cfg.get("rope_parameters") or {}).get("full_attention") or {}
    if full.get("rope_type", "proportional") != "proportional":
        raise GGUFConfigError(f"config.json (gemma4): full-attention rope_type {full.get('rope_type')!r}; llama.cpp's "
                              "converter writes only the proportional one", ["rope_freqs.weight"])
    head_dim = int(gemma4_full(cfg, "head_dim", "global_head_dim") or cfg["head_dim"])
    n_rot = int(head_dim * float(full.get("partial_rotary_factor", 1.0)) / 2)
    return np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), dtype=np.float32)


def gemma4_partial_rotary(rope_freqs, per_layer: Mapping[str, Any]) -> float:
    """The full layers' `partial_rotary_factor` a Gemma 4 GGUF's `rope_freqs.weight` stands for: the share of
    leading 1s (rotated pairs) before the 1e30s (unrotated ones); GGUFConfigError for any other values.

    Example:
        >>> gemma4_partial_rotary([1.0, 1.0, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30], {"1": {"head_dim": 16}})
        0.25
    """
    import numpy as np

    r = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
    n_rot = int((r == 1.0).sum())
    head_dim = int(next(iter(per_layer.values()))["head_dim"]) if per_layer else 2 * r.size
    if r.size != head_dim // 2 or not (r[:n_rot] == 1.0).all() or not (r[n_rot:] >= 1e29).all():
        raise GGUFConfigError(f"rope_freqs.weight ({r.size} values, first {r[:4].tolist()}) is not Gemma 4's "
                              f"proportional RoPE for head_dim {head_dim} (1s, then 1e30s)", ["rope_freqs.weight"])
    return 2 * n_rot / head_dim


# --- tensor names (`adapters/names.py` calls these through `hf_name_to_gguf` / `gguf_name_candidates`) -----------
# Gemma 4's MoE: the router's input scale and per-expert output scale as llama.cpp's converter names them (`.scale`
# beside the module's weight), and the bare stacked expert tensors
GEMMA4_SCALES = ((".router.scale", ".router.proj"), (".router.per_expert_scale", ".experts.down_proj"))
GEMMA4_BARE = (".experts.gate_up_proj", ".experts.down_proj")
GEMMA4_MOE = re.compile(r"^model\.layers\.\d+\.(experts|router)\.")  # its spelling among gguf-py's candidates


def gemma4_hf_name_to_gguf(name: str, table: Callable[[str], str | None],
                           shared: Callable[[str], str | None]) -> str | None:
    """The GGUF name of a Gemma 4 Hugging Face tensor: the MoE scales are `.scale` beside the weight of the module
    gguf-py's `table` names (`GEMMA4_SCALES`); the bare stacked experts are looked up with `.weight`; every other
    name goes to the `shared` rules.

    Example:
        >>> from lazyweights.adapters.names import hf_to_gguf_name
        >>> hf_to_gguf_name("model.layers.2.router.scale", "gemma4")
        'blk.2.ffn_gate_inp.scale'
        >>> hf_to_gguf_name("model.layers.2.experts.gate_up_proj", "gemma4")
        'blk.2.ffn_gate_up_exps.weight'
    """
    if name.endswith(GEMMA4_BARE):
        name += ".weight"
    for hf, module in GEMMA4_SCALES:
        if name.endswith(hf):
            got = table(name[: -len(hf)] + module + ".weight")
            return got and got[: -len(".weight")] + ".scale"
    return shared(name)


def gemma4_gguf_name_candidates(base: str, candidates: Callable[[str], tuple[str, ...]]) -> tuple[str, ...]:
    """The Hugging Face names of a Gemma 4 GGUF tensor (`base`: its name in block 0; `candidates(base)`: gguf-py's
    names for it, moved to the tensor's block): the MoE scales (`GEMMA4_SCALES`) from their modules' weights, the
    stacked experts without `.weight`, both among the Gemma 4 spellings (`GEMMA4_MOE`); other names as gguf-py's.

    Example:
        >>> from lazyweights.adapters.names import gguf_to_hf_candidates
        >>> gguf_to_hf_candidates("blk.2.ffn_down_exps.scale", "gemma4")
        ('model.layers.2.router.per_expert_scale',)
        >>> gguf_to_hf_candidates("blk.2.ffn_gate_up_exps.weight", "gemma4")
        ('model.layers.2.experts.gate_up_proj',)
    """
    if base.endswith(".scale"):  # the MoE scales
        stem = base[: -len(".scale")] + ".weight"
        return tuple(c[: -len(module) - len(".weight")] + hf for hf, module in GEMMA4_SCALES
                     for c in candidates(stem) if c.endswith(module + ".weight") and GEMMA4_MOE.match(c))
    if base.endswith("_exps.weight"):  # the stacked experts are bare parameters
        bare = tuple(b + ".weight" for b in GEMMA4_BARE)
        return tuple(c[: -len(".weight")] for c in candidates(base) if c.endswith(bare) and GEMMA4_MOE.match(c))
    return candidates(base)
