"""Per-family hooks: the quirks one family alone has, kept on its record (`archs.Arch.hooks`) so the conversion
engines (`lazyweights.convert`: `hparams`, `tensors`, `to_gguf`, `to_hf`) call them by role and hold no family names
(`tests/adapters/test_family_hooks.py` walks them for any).
Each hook is called where the family branch it replaces was, so every key lands where it did before.

A record without a quirk has `FamilyHooks()` (every hook None or False); an engine asks `rec.hooks.kv_heads`,
never `rec.model_type == "falcon"`. The hooks, one job each:

- `kv_heads(get, heads)`: HF -> GGUF and the renaming's q/k row count: the family's own rule for its kv head
  count (`get(name, default)` reads config.json); None falls back to the shared names (`num_key_value_heads`, ...).
- `hf_from_tensors(cfg, get, names)`: GGUF -> HF: config.json entries the family derives from the GGUF's tensor
  names (`names`) and keys (`get(template, default)`, a gguf-py `Keys` template), written into `cfg` in place.
- `hybrid_to_gguf(cfg, a)` / `hybrid_to_hf(get)`: a hybrid's own switches (Granite 4.0's RoPE on or off), as
  GGUF key/values and as config.json entries.
- `ignores_head_dim`: llama.cpp's converter ignores config.json's `head_dim` (Granite).
- `check_config(model_type, cfg, a)`: HF -> GGUF refuses (GGUFConfigError) a config the family's llama.cpp graph
  cannot compute; `weight_scale(hf_name, cfg)`: a factor (or one per row) folded into a weight on its way to
  GGUF; `mamba_to_hf(cfg, get, names)`: a family's own Mamba sizes and flags back (Falcon-H1's muP, all three).
- `rope_to_gguf(cfg, a)` / `rope_to_hf(get)`: a family's own RoPE keys and config.json entries;
  `gguf_tensors(cfg)`: tensors llama.cpp reads that the family makes from config.json; `rope_from_tensors(md,
  arch, factors)`: `rope_parameters` back from them (Phi-3's LongRoPE, `longrope`, all four).
- `late_head_dim(head_dim, default)`: key_length/value_length are written after rope.freq_base, and only where
  this says so (Phi-3: where head_dim is not hidden / heads); None: where config.json has a head_dim.
- `sliding_to_gguf(cfg, rec)` / `sliding_to_hf(cfg, get, rope, rec)`: the sliding layers' own keys and
  config.json entries (Gemma 3's per-layer pattern, its and ModernBERT's RoPE base: `sliding`).
- `layers_to_gguf(cfg, rec, head_dim, n)` / `layers_to_hf(cfg, get, rope, rec, names)`: per-layer head dims,
  kv heads and widths, both ways, with `per_layer_rows` (the rows whose per-layer lists `layers_to_hf` reads
  itself) and `rope_freqs_to_hf(cfg, rope_freqs)`: RoPE entries back from the `rope_freqs.weight` tensor
  (Gemma 4, `gemma4`, all four, with `gguf_tensors`).
- `rope_scaling_to_hf(scaling)`: entries the family adds to a linear / yarn `rope_parameters` read back
  (gpt-oss's `truncate`).
- `hf_name_to_gguf(name, table, shared)` / `gguf_name_candidates(base, candidates)`: tensor names the family
  spells its own way (`adapters/names.py`, looked up from the GGUF architecture): HF -> GGUF in place of the
  shared rules (`table(hf_name)`: gguf-py's table alone; `shared(hf_name)`: the shared rules), and GGUF -> HF
  candidates for `base` (the GGUF name in block 0; `candidates(base)`: gguf-py's, moved to the tensor's block)
  (Gemma 4's MoE router scales and bare stacked experts, `gemma4`).

Example:
    >>> from lazyweights.adapters.archs import ARCHS
    >>> ARCHS["falcon"].hooks.kv_heads({"new_decoder_architecture": False, "multi_query": True}.get, 8)
    1
    >>> ARCHS["llama"].hooks == FamilyHooks()
    True
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from . import gemma4 as _gemma4
from . import longrope as _longrope
from . import sliding as _sliding

Getter = Callable[..., Any]
NameLookup = Callable[[str], str | None]  # a Hugging Face tensor name -> its GGUF name, or None


class FamilyHooks(NamedTuple):
    """One family's quirks, called by the engines by role (see the module docstring)."""

    kv_heads: Callable[[Getter, int], Any] | None = None
    hf_from_tensors: Callable[[dict, Getter, set[str]], None] | None = None
    hybrid_to_gguf: Callable[[Any, str], dict] | None = None
    hybrid_to_hf: Callable[[Getter], dict] | None = None
    ignores_head_dim: bool = False
    check_config: Callable[[str, Any, str], None] | None = None
    weight_scale: Callable[[str, Any], Any] | None = None
    mamba_to_hf: Callable[[dict, Getter, set[str] | None], None] | None = None
    rope_to_gguf: Callable[[Any, str], dict] | None = None
    rope_to_hf: Callable[[Getter], dict] | None = None
    gguf_tensors: Callable[[Any], dict] | None = None
    rope_from_tensors: Callable[[Any, str, Any], dict] | None = None
    late_head_dim: Callable[[int, int], bool] | None = None
    sliding_to_gguf: Callable[[Any, Any], dict] | None = None
    sliding_to_hf: Callable[[dict, Getter, dict, Any], None] | None = None
    layers_to_gguf: Callable[[Any, Any, int, int], dict] | None = None
    layers_to_hf: Callable[[dict, Getter, dict, Any, set[str] | None], None] | None = None
    per_layer_rows: tuple[str, ...] = ()
    rope_freqs_to_hf: Callable[[dict, Any], None] | None = None
    rope_scaling_to_hf: Callable[[dict], dict] | None = None
    hf_name_to_gguf: Callable[[str, NameLookup, NameLookup], str | None] | None = None
    gguf_name_candidates: Callable[[str, Callable[[str], tuple[str, ...]]], tuple[str, ...]] | None = None


# --- kv heads (HF -> GGUF) ----------------------------------------------------------------------------------------
def multi_query_kv_heads(get: Getter, heads: int) -> int:
    """GPT-BigCode: one kv head where `multi_query` (its default), else one per head.

    >>> multi_query_kv_heads({"multi_query": False}.get, 4)
    4
    """
    return 1 if get("multi_query", True) else heads


def falcon_kv_heads(get: Getter, heads: int) -> Any:
    """Falcon: the old decoder (7B/40B's `new_decoder_architecture` False) has one kv head where `multi_query`,
    else one per head; the new one names them `num_kv_heads` (None: the shared names decide).

    >>> falcon_kv_heads({"new_decoder_architecture": True, "num_kv_heads": 8}.get, 64)
    8
    """
    if not get("new_decoder_architecture", False):
        return 1 if get("multi_query", True) else heads
    v = get("num_key_value_heads")
    return v if v is not None else get("num_kv_heads")


# --- config.json from the tensors (GGUF -> HF) --------------------------------------------------------------------
def falcon_from_tensors(cfg: dict, get: Getter, names: set[str]) -> None:
    """Falcon: the new decoder has a second attention norm; one kv head is multi-query.

    >>> cfg = {}
    >>> falcon_from_tensors(cfg, {"{arch}.attention.head_count_kv": 1}.get, {"blk.0.attn_norm.weight"})
    >>> cfg
    {'new_decoder_architecture': False, 'multi_query': True}
    """
    from gguf.constants import Keys as K

    kv = int(get(K.Attention.HEAD_COUNT_KV, 1))
    cfg["new_decoder_architecture"] = "blk.0.attn_norm_2.weight" in names
    cfg["multi_query"] = kv == 1
    if cfg["new_decoder_architecture"]:
        cfg["num_ln_in_parallel_attn"] = 2


def multi_query_from_tensors(cfg: dict, get: Getter, names: set[str]) -> None:
    """GPT-BigCode: `multi_query` where the GGUF has one kv head.

    >>> cfg = {}
    >>> multi_query_from_tensors(cfg, {"{arch}.attention.head_count_kv": 4}.get, set())
    >>> cfg
    {'multi_query': False}
    """
    from gguf.constants import Keys as K

    cfg["multi_query"] = int(get(K.Attention.HEAD_COUNT_KV, 1)) == 1


def qk_norm_from_tensors(cfg: dict, get: Getter, names: set[str]) -> None:
    """Cohere, GLM-4.5: `use_qk_norm` where the GGUF holds q norms.

    >>> cfg = {}
    >>> qk_norm_from_tensors(cfg, {}.get, {"blk.0.attn_q_norm.weight"})
    >>> cfg
    {'use_qk_norm': True}
    """
    cfg["use_qk_norm"] = "blk.0.attn_q_norm.weight" in names


def stablelm_from_tensors(cfg: dict, get: Getter, names: set[str]) -> None:
    """StableLM: a parallel residual has no FFN norm; llama.cpp's converter keeps no q/k layer norms.

    >>> cfg = {}
    >>> stablelm_from_tensors(cfg, {}.get, {"blk.0.ffn_norm.weight"})
    >>> cfg
    {'use_parallel_residual': False, 'qk_layernorm': False}
    """
    cfg["use_parallel_residual"] = "blk.0.ffn_norm.weight" not in names
    cfg["qk_layernorm"] = False


# --- Granite 4.0's RoPE switch (both ways) ----------------------------------------------------------------------
def granite_rope_to_gguf(cfg: Any, a: str) -> dict:
    """Granite 4.0 (granitehybrid): RoPE only where `position_embedding_type` says "rope"; llama.cpp's switch is
    `rope.scaling.finetuned`.

    >>> md = granite_rope_to_gguf({"position_embedding_type": "nope"}, "granitehybrid")
    >>> md["granitehybrid.rope.scaling.finetuned"].value
    False
    """
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys as K

    from ..formats.gguf_writer import GGUFValue

    return {K.Rope.SCALING_FINETUNED.format(arch=a): GGUFValue(cfg.get("position_embedding_type") == "rope", T.BOOL)}


def granite_rope_to_hf(get: Getter) -> dict:
    """Granite 4.0: `position_embedding_type` back from llama.cpp's `rope.scaling.finetuned` (default: RoPE).

    >>> granite_rope_to_hf({}.get)
    {'position_embedding_type': 'rope'}
    """
    from gguf.constants import Keys as K

    return {"position_embedding_type": "rope" if get(K.Rope.SCALING_FINETUNED, True) else None}


# --- Falcon-H1: muP multipliers folded into the weights (llama.cpp's conversion/falcon_h1.py) --------------------
def falcon_h1_check(model_type: str, cfg: Any, a: str) -> None:
    """llama.cpp's falcon-h1 applies the Mamba gated norm after the gate: a model norming before it is refused.

    >>> try:
    ...     falcon_h1_check("falcon_h1", {"mamba_rms_norm": True}, "falcon-h1")
    ... except ValueError as e:
    ...     print(type(e).__name__, e.args[0].split(";")[0])
    GGUFConfigError config.json (falcon_h1): llama.cpp's falcon-h1 applies the Mamba gated norm after the gate
    """
    from ..core.errors import GGUFConfigError

    if cfg.get("mamba_rms_norm") and cfg.get("mamba_norm_before_gate", True):
        raise GGUFConfigError(f"config.json ({model_type}): llama.cpp's {a} applies the Mamba gated norm after "
                              "the gate; this model norms before it (mamba_norm_before_gate true)",
                              ["mamba_norm_before_gate"])


def falcon_h1_mamba_to_hf(cfg: dict, get: Getter, names: set[str] | None) -> None:
    """Falcon-H1's Mamba head size and flags back from the GGUF (llama.cpp norms after the gate).

    >>> cfg = {}
    >>> falcon_h1_mamba_to_hf(cfg, {"{arch}.ssm.inner_size": 64, "{arch}.ssm.time_step_rank": 4}.get,
    ...                       {"blk.0.ssm_norm.weight"})
    >>> cfg["mamba_d_head"], cfg["mamba_rms_norm"], cfg["mamba_conv_bias"]
    (16, True, False)
    """
    from gguf.constants import Keys as K

    inner = int(get(K.SSM.INNER_SIZE))
    cfg["mamba_d_head"] = inner // int(get(K.SSM.TIME_STEP_RANK))
    if names is not None:
        cfg["mamba_rms_norm"] = any(n.endswith("ssm_norm.weight") for n in names)
        cfg["mamba_norm_before_gate"] = False
        cfg["mamba_conv_bias"] = any(n.endswith("ssm_conv1d.bias") for n in names)
        cfg["mamba_proj_bias"] = any(n.endswith("ssm_in.bias") for n in names)


def mup_scale(hf_name: str, cfg) -> float | np.ndarray | None:
    """Falcon-H1's muP multiplier for a Hugging Face weight, as llama.cpp's converter folds it in (None: none):
    gate/down MLP multipliers, attention in (q, k, v; k also times key_multiplier) and out, the Mamba in/out
    multipliers, the embedding and lm_head multipliers, and for `in_proj` one factor per output row (the five
    `ssm_multipliers` over its z, x, B, C and dt rows). `cfg`: config.json's dict.

    Example:
        >>> mup_scale("model.layers.0.self_attn.k_proj.weight", {"key_multiplier": 2.0, "attention_in_multiplier": 0.5})
        1.0
    """
    def g(key: str, default=1.0):
        v = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
        return default if v is None else v

    if hf_name.endswith("mamba.in_proj.weight"):
        inner, gs = int(g("mamba_d_ssm")), int(g("mamba_n_groups")) * int(g("mamba_d_state"))
        m = [float(x) for x in g("ssm_multipliers", [1.0] * 5)]
        heads = int(g("mamba_n_heads"))
        rows = np.concatenate([np.full(n, m[i], np.float64) for i, n in enumerate((inner, inner, gs, gs, heads))])
        return rows * float(g("ssm_in_multiplier"))
    table = (("feed_forward.gate_proj.weight", float(g("mlp_multipliers", [1.0, 1.0])[0])),
             ("feed_forward.down_proj.weight", float(g("mlp_multipliers", [1.0, 1.0])[1])),
             ("self_attn.k_proj.weight", float(g("key_multiplier")) * float(g("attention_in_multiplier"))),
             ("self_attn.q_proj.weight", float(g("attention_in_multiplier"))),
             ("self_attn.v_proj.weight", float(g("attention_in_multiplier"))),
             ("self_attn.o_proj.weight", float(g("attention_out_multiplier"))),
             ("mamba.out_proj.weight", float(g("ssm_out_multiplier"))),
             ("lm_head.weight", float(g("lm_head_multiplier"))),
             ("embed_tokens.weight", float(g("embedding_multiplier"))))
    for suffix, scale in table:
        if hf_name.endswith(suffix):
            return scale
    return None


# --- Phi-3's head dim keys, gpt-oss's YaRN entry ------------------------------------------------------------------
def odd_head_dim(head_dim: int, default: int) -> bool:
    """Phi-3: llama.cpp's converter writes key_length/value_length (after rope.freq_base) only where head_dim
    is not hidden / heads.

    >>> odd_head_dim(96, 96), odd_head_dim(64, 96)
    (False, True)
    """
    return head_dim != default


def yarn_truncate(scaling: dict) -> dict:
    """gpt-oss: config.json's rope_parameters.truncate (False) beside a YaRN scaling read back from a GGUF.

    >>> yarn_truncate({"rope_type": "yarn", "factor": 32.0}), yarn_truncate({"rope_type": "linear"})
    ({'truncate': False}, {})
    """
    return {"truncate": False} if scaling["rope_type"] == "yarn" else {}


FALCON = FamilyHooks(kv_heads=falcon_kv_heads, hf_from_tensors=falcon_from_tensors)
GPT_BIGCODE = FamilyHooks(kv_heads=multi_query_kv_heads, hf_from_tensors=multi_query_from_tensors)
QK_NORM = FamilyHooks(hf_from_tensors=qk_norm_from_tensors)
STABLELM = FamilyHooks(hf_from_tensors=stablelm_from_tensors)
GRANITE = FamilyHooks(ignores_head_dim=True)
GRANITE_HYBRID = FamilyHooks(hybrid_to_gguf=granite_rope_to_gguf, hybrid_to_hf=granite_rope_to_hf)
FALCON_H1 = FamilyHooks(check_config=falcon_h1_check, weight_scale=mup_scale, mamba_to_hf=falcon_h1_mamba_to_hf)
PHI3 = FamilyHooks(rope_to_gguf=_longrope.rope_to_gguf, rope_to_hf=_longrope.rope_to_hf,
                   gguf_tensors=_longrope.longrope_tensors, rope_from_tensors=_longrope.longrope_from_gguf,
                   late_head_dim=odd_head_dim)
GEMMA3 = FamilyHooks(sliding_to_gguf=_sliding.gemma3_sliding_to_gguf, sliding_to_hf=_sliding.gemma3_sliding_to_hf)
MODERNBERT = FamilyHooks(sliding_to_gguf=_sliding.modernbert_sliding_to_gguf,
                         sliding_to_hf=_sliding.modernbert_sliding_to_hf)
GEMMA4 = FamilyHooks(layers_to_gguf=_gemma4.gemma4_layers_to_gguf, layers_to_hf=_gemma4.gemma4_layers_to_hf,
                     per_layer_rows=_gemma4.PER_LAYER_ROWS, gguf_tensors=_gemma4.gemma4_tensors,
                     rope_freqs_to_hf=_gemma4.gemma4_rope_freqs_to_hf,
                     hf_name_to_gguf=_gemma4.gemma4_hf_name_to_gguf,
                     gguf_name_candidates=_gemma4.gemma4_gguf_name_candidates)
GPT_OSS = FamilyHooks(rope_scaling_to_hf=yarn_truncate)
