"""Hyperparameters both ways for every family, from its record (`archs.Arch.hparams` and the record's flags).

HF -> GGUF: each `HParam` takes the first of its config.json names present (transformers 5 names first,
then the legacy aliases: `n_embd`, `rotary_pct`, `n_ctx` ...), typed as gguf-py's writer types it. Besides the
rows: `rope.freq_base` (`rope_theta` or `rope_parameters.rope_theta`; legacy `global_rope_theta`,
`rotary_emb_base`), `rope.dimension_count` (head_dim, times
`partial_rotary_factor` / `rotary_pct` for partial-rotary families), `key_length`/`value_length` from an
explicit `head_dim`, `vocab_size`, and what a record's flags add (Phi-3's original context and LongRoPE attention
factor, Gemma's per-layer pattern, sliding-window RoPE base and softcapping rows; RoBERTa's context shortened
by pad_token_id + 1; ModernBERT's window under `local_attention` and its sliding layers' RoPE base), and `str`
rows (ModernBERT's `hidden_activation`).

GGUF -> HF: each row written back under its first name, `rope_parameters`, the record's `hf_extra`, and what
the tensors say (`tie_word_embeddings`, the record's `bias_flag`).

Config keys, both ways (`{a}` = the GGUF architecture; HF names as transformers' configs spell them), for every
family from its record (`adapters/archs.py`, turned into keys here); the common ones:

    {a}.context_length                  max_position_embeddings        (required)
    {a}.embedding_length                hidden_size                    (required)
    {a}.block_count                     num_hidden_layers              (required)
    {a}.attention.head_count            num_attention_heads            (required)
    {a}.feed_forward_length             intermediate_size              (required except for MoE)
    {a}.attention.head_count_kv         num_key_value_heads            default: head_count
    {a}.attention.key_length            head_dim                       default: embedding_length / head_count
    {a}.attention.layer_norm_rms_epsilon rms_norm_eps
    {a}.rope.freq_base                  rope_parameters.rope_theta (or rope_theta)
    {a}.rope.dimension_count            head_dim x rope_parameters.partial_rotary_factor (phi3, partial rotary)
    {a}.rope.scaling.type/factor/original_context_length   rope_parameters (linear, yarn)
    rope_freqs.weight (tensor)          rope_parameters {"rope_type": "llama3", ...} (llama, `rope.llama3_rope_params`)
    rope_factors_long/short.weight, {a}.rope.scaling.attn_factor   rope_parameters {"rope_type": "longrope"}
                                        (phi3), with {a}.rope.scaling.original_context_length
    {a}.attention.sliding_window        sliding_window
    {a}.attention.sliding_window_pattern layer_types (gemma3 where not every 6th layer global; olmo3, cohere2)
    {a}.rope.freq_base_swa              rope_parameters.sliding_attention.rope_theta (gemma3)
    {a}.final_logit_softcapping / attn_logit_softcapping    same names (gemma2; gemma3 the first)
    {a}.expert_count / expert_used_count                    num_local_experts / num_experts_per_tok (mixtral)
    gemma4: {a}.attention.key_length / key_length_swa (and value_*), rope.dimension_count / _swa   the full
                                        layers' head dim (global_head_dim or per_layer_config) / head_dim
            {a}.attention.head_count_kv (per layer)  num_key_value_heads, and the full layers' own count
            rope_freqs.weight (tensor)  rope_parameters.full_attention "proportional" (all four: the gemma4
                                        record's hooks, `adapters/gemma4.py`)
            {a}.attention.shared_kv_layers / embedding_length_per_layer_input   num_kv_shared_layers /
                                        hidden_size_per_layer_input; feed_forward_length per layer where
                                        use_double_wide_mlp; expert_* from num_experts / top_k_experts /
                                        moe_intermediate_size (enable_moe_block)
    tokenizer.ggml.bos/eos/padding_token_id  bos/eos/pad_token_id
    tie_word_embeddings                 true when the GGUF has no output.weight

What one family alone does is a hook on its record (`family_hooks`: Falcon's kv heads, Granite 4.0's RoPE
switch, ...), called here by role; this module names no family.

Example:
    >>> from lazyweights.adapters.archs import ARCHS
    >>> md = gguf_hparams(ARCHS["gpt_neox"], {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
    ...     "intermediate_size": 96, "max_position_embeddings": 128, "layer_norm_eps": 1e-5, "rotary_pct": 0.25})
    >>> md["gptneox.rope.dimension_count"].value, md["gptneox.feed_forward_length"].value
    (4, 96)
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from ..adapters.archs import CTX, FFN, KV, Arch, HParam
from ..adapters.rotary import rotary_factor
from ..adapters.sliding import every_nth
from ..core.config_access import config_first
from ..core.errors import GGUFConfigError
from ..formats.gguf_keys import arch_key, template
from ..formats.rope_scaling import rope_parameters, rope_scaling_from_gguf, rope_scaling_to_gguf

# the `{arch}.*` keys every GGUF needs (HF -> GGUF refuses a config without them, GGUF -> HF a file)
REQUIRED_KEYS = ("context_length", "embedding_length", "block_count", "attention.head_count")


def _put(cfg: dict, name: str, value) -> None:
    """config.json's `name` = value (`a.b`: into the nested dict a)."""
    if "." in name:
        outer, inner = name.split(".", 1)
        cfg.setdefault(outer, {})[inner] = value
    else:
        cfg[name] = value


def _combined(cfg: Mapping[str, Any], names: Iterable[str], kind: str) -> int | None:
    """A `prod` or `sum` row's value: the product or sum of every name in `names`, None unless all are present."""
    raw = [cfg.get(n) for n in names]
    if any(v is None for v in raw):
        return None
    values = [int(v) for v in raw if v is not None]
    return math.prod(values) if kind == "prod" else sum(values)


def _row_value(cfg: Mapping[str, Any], hp: HParam):
    """What config.json says for one row (None if nothing): the first of its names, or for `prod` / `sum` rows
    the combination of all of them, for `lead` rows the count of leading dense layers."""
    if hp.kind in ("prod", "sum"):
        return _combined(cfg, hp.hf, hp.kind)
    v = config_first(cfg, hp.hf)
    return _leading_dense(v) if hp.kind == "lead" else v


def _leading_dense(v):
    """A `lead` row's value: an int as is, a per-layer MLP type list (`mlp_layer_types`) as its count of leading
    "dense" entries."""
    if isinstance(v, list):
        return next((i for i, t in enumerate(v) if t != "dense"), len(v))
    return v


def _kv_heads(rec: Arch, cfg: Mapping[str, Any], heads: int) -> int:
    own = rec.hooks.kv_heads(cfg.get, heads) if rec.hooks.kv_heads else None  # GPT-BigCode's, Falcon's rule
    if own is not None:
        return int(own)
    names = next((hp.hf for hp in rec.hparams if hp.key == KV.key), KV.hf)  # the record's own (DBRX's nested)
    v = config_first(cfg, ("num_key_value_heads", "num_kv_heads", "n_head_kv", *names))
    return heads if v is None else int(v)


def _value(hp: HParam, v):
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    if hp.kind in ("f32", "f32n"):
        return GGUFValue(float(v), T.FLOAT32)
    if hp.kind == "bool":
        return GGUFValue(bool(v), T.BOOL)
    if hp.kind == "str":
        return GGUFValue(str(v), T.STRING)
    return GGUFValue(int(v), T.UINT32)


def gguf_hparams(rec: Arch, cfg: Mapping[str, Any]) -> dict:
    """`{arch}.*` GGUF key/values for a record-driven family's config.json dict. GGUFConfigError lists what a
    GGUF needs and the config lacks."""
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys as K

    from ..formats.gguf_writer import GGUFValue

    a = rec.gguf
    md: dict[str, Any] = {}
    rows = (*rec.hparams, *rec.tail)
    kinds = cfg.get(rec.hybrid) if rec.hybrid else None
    if isinstance(kinds, list) and cfg.get("num_hidden_layers") is None:  # Nemotron-H: the layer list's length
        cfg = {**cfg, "num_hidden_layers": len(kinds)}
    found: dict[str, Any] = {hp.key: _row_value(cfg, hp) for hp in rows}
    missing = [f"{k} ({' or '.join(hp.hf)})" for hp in rows for k in [hp.key]
               if (k in REQUIRED_KEYS or hp in rec.tail) and found[k] is None and k not in rec.gguf_fixed]
    if missing:
        raise GGUFConfigError(f"config.json ({rec.model_type}) lacks {', '.join(missing)}", missing)
    if _pure_ssm(rec):
        return _ssm_hparams(rec, cfg, found)
    if rec.hooks.check_config:  # what the family's llama.cpp graph cannot compute (Falcon-H1's norm before the gate)
        rec.hooks.check_config(rec.model_type, cfg, a)
    wrong = [f"{k}={cfg.get(k)!r}" for k, v in rec.requires.items() if cfg.get(k) != v]
    if wrong:
        raise GGUFConfigError(f"config.json ({rec.model_type}) has {', '.join(wrong)}; llama.cpp's {a} graph "
                              f"computes only {dict(rec.requires)}", list(rec.requires))
    hidden, heads = int(found["embedding_length"]), int(found["attention.head_count"])
    if found.get("feed_forward_length") is None and rec.ffn_mult:
        md[K.LLM.FEED_FORWARD_LENGTH.format(arch=a)] = _value(FFN, rec.ffn_mult * hidden)
    if "attention.head_count_kv" in found:
        found["attention.head_count_kv"] = _kv_heads(rec, cfg, heads)
    if rec.position_offset and found.get("context_length") is not None and cfg.get("pad_token_id") is not None:
        found["context_length"] = int(found["context_length"]) - int(cfg["pad_token_id"]) - 1  # RoBERTa's offset
    md.update(_rows(rec, rec.hparams, found))
    for key, v in rec.gguf_fixed.items():
        if arch_key(a, key) in md:
            continue  # the config's own value wins
        kind = "bool" if isinstance(v, bool) else "f32" if isinstance(v, float) else "u32"
        md[arch_key(a, key)] = _value(HParam(key, (), kind), v)
    head_dim = hidden // heads
    if cfg.get("head_dim") is not None and not rec.hooks.ignores_head_dim:  # llama.cpp's Granite ignores head_dim
        head_dim = int(cfg["head_dim"])
        # a row's own value wins (MiniCPM3); a `late_head_dim` hook's family writes them later, where it says
        if not rec.head_dims and not rec.hooks.late_head_dim and K.Attention.KEY_LENGTH.format(arch=a) not in md:
            md[K.Attention.KEY_LENGTH.format(arch=a)] = GGUFValue(head_dim, T.UINT32)
            md[K.Attention.VALUE_LENGTH.format(arch=a)] = GGUFValue(head_dim, T.UINT32)
    theta = config_first(cfg, ("rope_theta", "global_rope_theta"))
    if theta is None:
        theta = rope_parameters(cfg).get("rope_theta")
    if theta is None:
        theta = cfg.get("rotary_emb_base")  # remote-code spelling (nomic-bert, old GPT-NeoX configs)
    if theta is not None:
        md[K.Rope.FREQ_BASE.format(arch=a)] = GGUFValue(float(theta), T.FLOAT32)
    if rec.head_dims or (rec.hooks.late_head_dim and rec.hooks.late_head_dim(head_dim, hidden // heads)):
        md[K.Attention.KEY_LENGTH.format(arch=a)] = GGUFValue(head_dim, T.UINT32)
        md[K.Attention.VALUE_LENGTH.format(arch=a)] = GGUFValue(head_dim, T.UINT32)
    if rec.partial_rotary:
        md[K.Rope.DIMENSION_COUNT.format(arch=a)] = GGUFValue(int(rotary_factor(cfg) * head_dim), T.UINT32)
    elif rec.rope_permute:
        md[K.Rope.DIMENSION_COUNT.format(arch=a)] = GGUFValue(head_dim, T.UINT32)
    if rec.hooks.rope_to_gguf:  # the family's own RoPE keys (Phi-3's original context, LongRoPE's attn factor)
        md.update(rec.hooks.rope_to_gguf(cfg, a))
    if rec.qpas_27b:
        _check_attention_scale(rec, cfg, hidden, heads, head_dim)
    if cfg.get("vocab_size") is not None and not rec.no_vocab:
        md[K.LLM.VOCAB_SIZE.format(arch=a)] = GGUFValue(int(cfg["vocab_size"]), T.UINT32)
    window = cfg.get("sliding_window")
    if window and (rec.window_always or (rec.window_flag and cfg.get(rec.window_flag))):
        md[K.Attention.SLIDING_WINDOW.format(arch=a)] = GGUFValue(int(window), T.UINT32)
    md.update(rope_scaling_to_gguf(a, cfg))
    if rec.mla:
        md.update(_mla_hparams(a, cfg))
    if rec.mrope:
        sections = [int(x) for x in (rope_parameters(cfg).get("mrope_section")
                                     or (cfg.get("rope_scaling") or {}).get("mrope_section")
                                     or ([11, 11, 10, 0] if rec.gdn else []))]  # llama.cpp's Qwen3.5 default
        if not sections or len(sections) > 4:
            raise GGUFConfigError(f"config.json ({rec.model_type}): M-RoPE needs rope_parameters.mrope_section "
                                  f"(up to 4 sections), got {sections}", [K.Rope.DIMENSION_SECTIONS.format(arch=a)])
        md[K.Rope.DIMENSION_SECTIONS.format(arch=a)] = GGUFValue(sections + [0] * (4 - len(sections)), T.ARRAY, T.INT32)
    window_hf = rec.window_hf or "sliding_window"
    if rec.sliding and cfg.get(window_hf) is not None:
        md[K.Attention.SLIDING_WINDOW.format(arch=a)] = GGUFValue(int(cfg[window_hf]), T.UINT32)
        md[K.Attention.SLIDING_WINDOW_PATTERN.format(arch=a)] = GGUFValue(_sliding_pattern(cfg), T.ARRAY, T.BOOL)
    if rec.hooks.sliding_to_gguf:  # the sliding layers' own keys (Gemma 3's pattern, its and ModernBERT's RoPE base)
        md.update(rec.hooks.sliding_to_gguf(cfg, rec))
    if rec.hooks.layers_to_gguf:  # per-layer head dims, kv heads, widths (Gemma 4's)
        md.update(rec.hooks.layers_to_gguf(cfg, rec, head_dim, int(found["block_count"])))
    md.update(_rows(rec, rec.late, {hp.key: config_first(cfg, hp.hf) for hp in rec.late}))
    md.update(_rows(rec, rec.tail, found))
    if rec.hybrid:
        md.update(_hybrid_hparams(rec, cfg, found))
    if rec.shortconv:
        md[K.LLM.FEED_FORWARD_LENGTH.format(arch=a)] = _value(FFN, lfm2_feed_forward_length(cfg))
    if rec.fused_gate_up_shexp and rec.hybrid and not found.get("expert_count"):  # dense Granite 4.0 H: the MLP
        for key in (K.LLM.EXPERT_COUNT, K.LLM.EXPERT_USED_COUNT, K.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH):
            md.pop(key.format(arch=a), None)
        shared = found.get("expert_shared_feed_forward_length")
        if shared:
            md[K.LLM.FEED_FORWARD_LENGTH.format(arch=a)] = _value(FFN, shared)
    return md


_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}  # Nemotron-H's hybrid_override_pattern


def layer_kinds(cfg: Mapping[str, Any], n: int) -> list[str]:
    """Per layer of a hybrid, "attention", "mamba" or "mlp": from `layer_types` / `layers_block_type`
    ("attention" / "full_attention", "mamba" / "linear_attention", "mlp"), Nemotron-H's `hybrid_override_pattern`
    ("M*-"), else `attn_layer_indices`, else every `attn_layer_period`-th layer from `attn_layer_offset` (Bamba's
    and Jamba's spellings, as llama.cpp's converter reads them; the rest are Mamba layers)."""
    for key in ("layer_types", "layers_block_type", "hybrid_override_pattern"):
        types = cfg.get(key)
        if isinstance(types, (list, str)) and len(types) == n:
            kinds = [_PATTERN.get(t, t) if isinstance(types, str) else t for t in types]
            return ["attention" if t in ("attention", "full_attention") else "mlp" if t == "mlp" else
                    "moe" if t == "moe" else "mamba" for t in kinds]
    idx = cfg.get("attn_layer_indices")
    if isinstance(idx, list):
        return ["attention" if i in idx else "mamba" for i in range(n)]
    period, offset = cfg.get("attn_layer_period"), cfg.get("attn_layer_offset")
    if period and offset is not None:
        return ["attention" if i % int(period) == int(offset) else "mamba" for i in range(n)]
    raise GGUFConfigError(f"config.json ({cfg.get('model_type')}): a hybrid needs layer_types, attn_layer_indices "
                          f"or attn_layer_period/offset to tell attention from Mamba layers",
                          ["attention.head_count_kv"])


def _hybrid_hparams(rec: Arch, cfg: Mapping[str, Any], found: Mapping[str, Any]) -> dict:
    """A hybrid's per-layer kv head count (0 marks a Mamba layer, as llama.cpp reads it) and Granite's RoPE
    switch."""
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys as K

    from ..formats.gguf_writer import GGUFValue

    a = rec.gguf
    n = int(found["block_count"])
    heads = int(found["attention.head_count"])
    kv = _kv_heads(rec, cfg, heads)
    kinds = layer_kinds(cfg, n)
    if "moe" in kinds and not found.get("expert_count"):
        raise GGUFConfigError(f"config.json ({rec.model_type}): MoE layers in {kinds} but no expert count",
                              [K.LLM.EXPERT_COUNT.format(arch=a)])
    kv_key = K.Attention.HEAD_COUNT_KV.format(arch=a)
    out = {kv_key: GGUFValue([kv if k == "attention" else 0 for k in kinds], T.ARRAY, T.INT32)}
    if rec.gdn:  # Qwen's gated delta-net layers, as llama.cpp's converter marks them (kv heads: one count; the
        out[kv_key] = GGUFValue(kv, T.UINT32)  # loader sizes attn_k by layer 0's)
        out[arch_key(a, "attention.recurrent_layers")] = GGUFValue([k == "mamba" for k in kinds], T.ARRAY, T.BOOL)
        out[K.LLM.FULL_ATTENTION_INTERVAL.format(arch=a)] = GGUFValue(int(cfg.get("full_attention_interval") or 4),
                                                                     T.UINT32)
    if "mlp" in kinds or "moe" in kinds:  # Nemotron-H: MLP or MoE layers; no kv heads and no MLP: a Mamba layer
        ff = int(found.get("feed_forward_length") or 0)
        moe = int(found.get("expert_feed_forward_length") or 0)
        out[K.LLM.FEED_FORWARD_LENGTH.format(arch=a)] = GGUFValue(
            [ff if k == "mlp" else moe if k == "moe" else 0 for k in kinds], T.ARRAY, T.INT32)
    if rec.hooks.hybrid_to_gguf:  # Granite 4.0's RoPE switch
        out.update(rec.hooks.hybrid_to_gguf(cfg, a))
    return out


def _period(flags: list[bool], what: str) -> dict:
    """`{what}_period` / `{what}_offset` (Jamba's spelling) for a per-layer pattern: the smallest period whose
    `i % period == offset` marks exactly the flagged layers."""
    n = len(flags)
    for period in range(1, n + 1):
        for offset in range(period):
            if all(f == (i % period == offset) for i, f in enumerate(flags)):
                return {f"{what}_period": period, f"{what}_offset": offset}
    raise GGUFConfigError(f"the {what.split('_')[0]} layers {[i for i, f in enumerate(flags) if f]} of {n} are not "
                          f"every period-th layer from an offset, as config.json's {what}_period/offset says",
                          [f"{what}_period"])


def lfm2_feed_forward_length(cfg: Mapping[str, Any]) -> int:
    """LFM2's MLP width as its modeling code computes it: `intermediate_size` (or `block_ff_dim`), and with
    `block_auto_adjust_ff_dim` two thirds of it, times `block_ffn_dim_multiplier`, rounded up to a multiple of
    `block_multiple_of` (llama.cpp's converter writes the result).

    Example:
        >>> lfm2_feed_forward_length({"intermediate_size": 12288, "block_auto_adjust_ff_dim": True,
        ...                           "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256})
        8192
    """
    ff = config_first(cfg, ("intermediate_size", "block_ff_dim"))
    if ff is None:
        raise GGUFConfigError(f"config.json ({cfg.get('model_type')}) lacks feed_forward_length (intermediate_size "
                              f"or block_ff_dim)", ["feed_forward_length"])
    ff = int(ff)
    if cfg.get("block_auto_adjust_ff_dim"):
        ff = int(2 * ff / 3)
        if cfg.get("block_ffn_dim_multiplier") is not None:
            ff = int(float(cfg["block_ffn_dim_multiplier"]) * ff)
        multiple = int(cfg.get("block_multiple_of") or 1)
        ff = multiple * ((ff + multiple - 1) // multiple)
    return ff


def _hybrid_config(rec: Arch, get, names: set[str] | None) -> dict:
    """config.json's hybrid facts back: which layers attend (in the record's spelling) from the per-layer kv
    counts, the Mamba sizes, Granite's RoPE switch; LFM2's conv layers and its MLP width as written."""
    from gguf.constants import Keys as K

    kv = get(K.Attention.HEAD_COUNT_KV)
    kv = kv if isinstance(kv, list) else [kv] * int(get(K.LLM.BLOCK_COUNT))
    if rec.shortconv:
        return {"num_key_value_heads": max(int(k) for k in kv),
                "layer_types": ["full_attention" if int(k) else "conv" for k in kv],
                "intermediate_size": int(get(K.LLM.FEED_FORWARD_LENGTH)), "block_auto_adjust_ff_dim": False}
    hidden, inner = int(get(K.LLM.EMBEDDING_LENGTH)), int(get(K.SSM.INNER_SIZE))
    if rec.gdn:  # Qwen's gated delta-net layers from recurrent_layers (else every full_attention_interval-th attends)
        rec_layers = get(template("attention.recurrent_layers"))
        if not isinstance(rec_layers, list):
            every = int(get(K.LLM.FULL_ATTENTION_INTERVAL) or 4)
            rec_layers = [(i + 1) % every != 0 for i in range(len(kv))]
        return {"num_key_value_heads": max(int(k) for k in kv),
                "layer_types": ["linear_attention" if r else "full_attention" for r in rec_layers],
                "linear_value_head_dim": inner // int(get(K.SSM.TIME_STEP_RANK))}
    cfg: dict[str, Any] = {"num_key_value_heads": max(int(k) for k in kv)}
    if rec.hybrid == "layers_block_type":  # Nemotron-H: MLP layers from the per-layer feed-forward sizes
        ff = get(K.LLM.FEED_FORWARD_LENGTH)
        ff = ff if isinstance(ff, list) else [0] * len(kv)
        cfg["intermediate_size"] = max([int(f) for f in ff] + [0])
        cfg["mamba_head_dim"] = inner // int(get(K.SSM.TIME_STEP_RANK))
        mlp = "moe" if get(K.LLM.EXPERT_COUNT) else "mlp"
        cfg["layers_block_type"] = ["full_attention" if k else mlp if f else "linear_attention"
                                    for k, f in zip(kv, ff)]
        return cfg
    cfg["mamba_expand"] = inner // hidden
    if rec.ssm == 2:
        cfg["mamba_d_head"] = inner // int(get(K.SSM.TIME_STEP_RANK))
    if rec.hybrid == "attn_layer_indices":  # Bamba: its layer_types is a read-only property over these
        cfg["attn_layer_indices"] = [i for i, k in enumerate(kv) if k]
    elif rec.hybrid == "attn_layer_period":  # Jamba: attention and expert layers as period and offset
        cfg.update(_period([bool(k) for k in kv], "attn_layer"))
        if names is not None and get(K.LLM.EXPERT_COUNT):
            cfg.update(_period([f"blk.{i}.ffn_gate_inp.weight" in names for i in range(len(kv))], "expert_layer"))
    else:
        cfg["layer_types"] = ["attention" if k else "mamba" for k in kv]
    if rec.hooks.hybrid_to_hf:  # Granite 4.0's RoPE switch
        cfg.update(rec.hooks.hybrid_to_hf(get))
    if rec.fused_gate_up_shexp and rec.hybrid and not get(K.LLM.EXPERT_COUNT):  # dense: the MLP back as the shared one
        cfg.update(num_local_experts=0, shared_intermediate_size=int(get(K.LLM.FEED_FORWARD_LENGTH)))
    if names is not None:
        cfg["mamba_conv_bias"] = any(n.endswith("ssm_conv1d.bias") for n in names)
        cfg["mamba_proj_bias"] = any(n.endswith("ssm_in.bias") for n in names)
    return cfg


def _pure_ssm(rec: Arch) -> bool:
    """A Mamba model without attention (llama.cpp's mamba / mamba2: no head count)."""
    return bool(rec.ssm) and not rec.hybrid and rec.gguf_fixed.get("attention.head_count") == 0


def _ssm_hparams(rec: Arch, cfg: Mapping[str, Any], found: dict[str, Any]) -> dict:
    """Mamba's keys: the rows, with llama.cpp's converter's defaults where the config has none (d_conv 4,
    d_state 16 (Mamba-2: 128), d_inner 2 x hidden, Mamba's dt_rank ceil(hidden / 16), Mamba-2's heads
    d_inner / head_dim (64), one group, eps 1e-5), then the fixed keys (no context length or heads)."""
    hidden = int(found["embedding_length"])
    inner = found.get("ssm.inner_size") or 2 * hidden
    head_dim = int(config_first(cfg, ("mamba_d_head", "head_dim")) or 64)
    defaults = {"ssm.conv_kernel": 4, "ssm.state_size": 16 if rec.ssm == 1 else 128, "ssm.inner_size": inner,
                "ssm.time_step_rank": -(hidden // -16) if rec.ssm == 1 else int(inner) // head_dim,
                "attention.layer_norm_rms_epsilon": 1e-5}
    if rec.ssm == 2:
        defaults["ssm.group_count"] = 1
    full = {k: (defaults.get(k) if v is None else v) for k, v in found.items()}
    md = _rows(rec, rec.hparams, full)
    for key, v in rec.gguf_fixed.items():
        kind = "bool" if isinstance(v, bool) else "f32" if isinstance(v, float) else "u32"
        md[arch_key(rec.gguf, key)] = _value(HParam(key, (), kind), v)
    return md


def _ssm_config(rec: Arch, get, names: set[str] | None) -> dict:
    """config.json's Mamba sizes back from the GGUF keys (`expand` and, for Mamba-2, `head_dim` derived)."""
    from gguf.constants import Keys as K

    hidden, inner = int(get(K.LLM.EMBEDDING_LENGTH)), int(get(K.SSM.INNER_SIZE))
    cfg: dict[str, Any] = {"expand": inner // hidden}
    if rec.ssm == 2:
        heads = int(get(K.SSM.TIME_STEP_RANK))
        cfg.update(num_heads=heads, head_dim=inner // heads)
    else:
        cfg["intermediate_size"] = inner
    if names is not None:
        cfg["use_conv_bias"] = "blk.0.ssm_conv1d.bias" in names
        cfg["use_bias"] = "blk.0.ssm_in.bias" in names
    return cfg


def _check_attention_scale(rec: Arch, cfg: Mapping[str, Any], hidden: int, heads: int, head_dim: int) -> None:
    """Warn where config.json's query_pre_attn_scalar is not the scale llama.cpp computes for a Gemma model:
    1/sqrt(head_dim), or 1/sqrt(hidden / heads) at the 27B block count (`Arch.qpas_27b`)."""
    qpas = cfg.get("query_pre_attn_scalar")
    want = hidden // heads if int(cfg.get("num_hidden_layers") or 0) == rec.qpas_27b else head_dim
    if qpas is not None and int(qpas) != want:
        import warnings

        warnings.warn(f"config.json ({rec.model_type}): query_pre_attn_scalar {qpas} is not what llama.cpp uses "
                      f"for this model ({want}); the GGUF will compute a different attention scale", stacklevel=3)


def _rows(rec: Arch, rows: Iterable[HParam], found: Mapping[str, Any]) -> dict:
    """The rows' keys (gguf-py's templates, `HParam.template`) and values from what the config holds (`found`);
    a per-layer list must repeat one value (GGUFConfigError otherwise)."""
    a = rec.gguf
    md: dict[str, Any] = {}
    for hp in rows:
        v, key = found[hp.key], hp.template.format(arch=a)
        if isinstance(v, list):  # per-layer lists (HunYuan's moe_topk, ...): llama.cpp takes one value
            if not v or any(x != v[0] for x in v):
                raise GGUFConfigError(f"config.json ({rec.model_type}): {' or '.join(hp.hf)} varies per layer "
                                      f"({v}); llama.cpp's {key} holds one value", [key])
            v = v[0]
        if v is not None:
            md[key] = _value(hp, v)
    return md


_MLA_KEYS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")


def _mla_hparams(a: str, cfg: Mapping[str, Any]) -> dict:
    """DeepSeek's MLA as llama.cpp runs it: MQA over the compressed latent (one kv head whose key is
    `kv_lora_rank + qk_rope_head_dim` wide, value `kv_lora_rank`), the per-head sizes as the `_mla` keys."""
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys as K

    from ..formats.gguf_writer import GGUFValue

    missing = [k for k in _MLA_KEYS if cfg.get(k) is None]
    if missing:
        raise GGUFConfigError(f"config.json ({cfg.get('model_type')}) lacks {', '.join(missing)} (MLA)", missing)
    nope, rope, v, r = (int(cfg[k]) for k in _MLA_KEYS)
    vals = {K.Attention.HEAD_COUNT_KV: 1, K.Attention.KEY_LENGTH: r + rope, K.Attention.VALUE_LENGTH: r,
            K.Attention.KEY_LENGTH_MLA: nope + rope, K.Attention.VALUE_LENGTH_MLA: v, K.Rope.DIMENSION_COUNT: rope}
    return {k.format(arch=a): GGUFValue(x, T.UINT32) for k, x in vals.items()}


def _mla_config(get) -> dict:
    """config.json's MLA sizes back from the GGUF keys `_mla_hparams` writes."""
    from gguf.constants import Keys as K

    rope = int(get(K.Rope.DIMENSION_COUNT))
    return {"qk_rope_head_dim": rope, "qk_nope_head_dim": int(get(K.Attention.KEY_LENGTH_MLA)) - rope,
            "v_head_dim": int(get(K.Attention.VALUE_LENGTH_MLA)), "head_dim": rope,
            "q_lora_rank": None if get(K.Attention.Q_LORA_RANK) is None else int(get(K.Attention.Q_LORA_RANK))}


def _sliding_pattern(cfg: Mapping[str, Any]) -> list[bool]:
    """Per layer, true = sliding-window attention: from layer_types, else every `sliding_window_pattern`-th
    layer (default 4, as llama.cpp's converter assumes for OLMo 3) attends globally."""
    n = int(config_first(cfg, ("num_hidden_layers", "n_layer")) or 0)
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return [t == "sliding_attention" for t in types]
    if cfg.get("global_attn_every_n_layers"):  # ModernBERT's legacy spelling: layer 0 and every n-th global
        return [i % int(cfg["global_attn_every_n_layers"]) != 0 for i in range(n)]
    p = cfg.get("sliding_window_pattern", 4)
    if isinstance(p, str):  # "LLLG"
        return [p[i % len(p)] == "L" for i in range(n)]
    return [(i + 1) % int(p) != 0 for i in range(n)]


def hf_config(rec: Arch, md: Mapping[str, Any], names: set[str] | None, vocab: int, arch: str | None = None) -> dict:
    """config.json for a record-driven family from GGUF metadata (`names`: the GGUF tensor names; `arch`: the
    GGUF architecture when it is not the record's, as for a VL model's text part read back as its text model)."""
    from gguf.constants import Keys as K

    a = arch or rec.gguf

    def get(key: str, default=None):  # key: gguf-py's template (Keys.*)
        v = md.get(key.format(arch=a), default)
        return v.tolist() if hasattr(v, "tolist") else v

    cfg: dict[str, Any] = {"architectures": [rec.hf_class], "model_type": rec.identity.config_model_type,
                           "vocab_size": int(vocab)}
    for hp in (*rec.hparams, *rec.tail):
        v = get(hp.template)
        if isinstance(v, list) and rec.hybrid:  # a hybrid's per-layer kv heads / MLP sizes: `_hybrid_config`
            continue
        if isinstance(v, list) and hp.key in rec.hooks.per_layer_rows:  # per-layer: the `layers_to_hf` hook's
            continue
        if isinstance(v, list):  # per-layer values (head_count_kv): one config.json value when all are equal
            if not v or any(x != v[0] for x in v):
                key = hp.template.format(arch=a)
                raise GGUFConfigError(f"{key} varies per layer ({v}); config.json's {hp.hf[0]} holds one value",
                                      [key])
            v = v[0]
        if v is not None and hp.kind not in ("prod", "sum"):
            _put(cfg, hp.hf[0], float(v) if hp.kind == "f32" else None if hp.kind == "f32n" and not v
                 else float(v) if hp.kind == "f32n" else bool(v) if hp.kind == "bool"
                 else str(v) if hp.kind == "str" else int(v))
    for hp in rec.hparams:
        if hp.kind == "sum" and get(hp.template) is not None and all(cfg.get(n) is not None for n in hp.hf[1:]):
            cfg[hp.hf[0]] = int(get(hp.template)) - sum(int(cfg[n]) for n in hp.hf[1:])
    if _pure_ssm(rec):
        cfg.update(_ssm_config(rec, get, names), **rec.hf_extra)
        if names is not None:
            cfg["tie_word_embeddings"] = "output.weight" not in names
        return cfg
    hidden, heads = int(get(K.LLM.EMBEDDING_LENGTH)), int(get(K.Attention.HEAD_COUNT))
    head_dim = int(get(K.Attention.KEY_LENGTH, hidden // heads))
    gqa = KV in rec.hparams  # llama-style configs (Falcon's head_dim is a read-only property)
    if gqa and get(K.Attention.HEAD_COUNT_KV) is None:  # llama.cpp's default; transformers' may differ (Qwen2: 32)
        cfg[KV.hf[0]] = heads
    if get(K.Attention.KEY_LENGTH) is not None or gqa:  # explicit: Qwen3's config defaults head_dim to 128
        cfg["head_dim"] = head_dim
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(get(K.Rope.FREQ_BASE, 10000.0))}
    if rec.partial_rotary:
        rope["partial_rotary_factor"] = int(get(K.Rope.DIMENSION_COUNT, head_dim)) / head_dim
    scaling = rope_scaling_from_gguf(md, a)
    if scaling is not None and scaling["rope_type"] in ("linear", "yarn") and "factor" in scaling:
        rope.update(scaling)
        if rec.hooks.rope_scaling_to_hf:  # the family's own entries (gpt-oss's YaRN truncate)
            rope.update(rec.hooks.rope_scaling_to_hf(scaling))
    if rec.window_flag:
        window = get(K.Attention.SLIDING_WINDOW)
        cfg[rec.window_flag] = bool(window)
        if window:
            cfg["sliding_window"] = int(window)
    if rec.sliding:
        window = get(K.Attention.SLIDING_WINDOW)
        cfg[rec.window_hf or "sliding_window"] = int(window) if window else None
        pattern = get(K.Attention.SLIDING_WINDOW_PATTERN)
        if isinstance(pattern, list):
            cfg["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        elif not window:  # no window: every layer global (EXAONE 4 would otherwise derive a pattern from 0)
            cfg["layer_types"] = ["full_attention"] * int(get(K.LLM.BLOCK_COUNT))
    if rec.window_always:
        window = get(K.Attention.SLIDING_WINDOW)
        cfg["sliding_window"] = int(window) if window else None
    if rec.hooks.rope_to_hf:  # the family's own RoPE entries (Phi-3's original context)
        cfg.update(rec.hooks.rope_to_hf(get))
    if rec.qpas_27b:  # the scale llama.cpp computes (see _check_attention_scale)
        cfg["query_pre_attn_scalar"] = hidden // heads if int(get(K.LLM.BLOCK_COUNT)) == rec.qpas_27b else head_dim
    if rec.swa_period:
        cfg["layer_types"] = every_nth(int(get(K.LLM.BLOCK_COUNT)), rec.swa_period)  # a pattern: `sliding_to_hf`
    for hp in rec.late:
        v = get(hp.template)
        cfg[hp.hf[0]] = float(v) if v else None
    if rec.mla:
        cfg.update(_mla_config(get), num_key_value_heads=heads)
    if rec.hybrid:
        cfg.update(_hybrid_config(rec, get, names))
    if rec.hooks.mamba_to_hf:  # a family's own Mamba sizes and flags (Falcon-H1's)
        rec.hooks.mamba_to_hf(cfg, get, names)
    if rec.embedding:
        cfg["type_vocab_size"] = int(md.get("tokenizer.ggml.token_type_count", 2))
        pad = md.get("tokenizer.ggml.padding_token_id")
        if rec.position_offset and pad is not None and get(K.LLM.CONTEXT_LENGTH) is not None:
            cfg[CTX.hf[0]] = int(get(K.LLM.CONTEXT_LENGTH)) + int(pad) + 1  # RoBERTa's positions from pad + 1
    if not rec.embedding or get(K.Rope.FREQ_BASE) is not None:  # encoders with RoPE (nomic-bert) too
        cfg["rope_parameters"] = rope
    if rec.hooks.sliding_to_hf:  # rope_parameters per layer type (Gemma 3's pattern too, ModernBERT's)
        rec.hooks.sliding_to_hf(cfg, get, rope, rec)
    if rec.hooks.layers_to_hf:  # per-layer head dims, kv heads, widths (Gemma 4's)
        rec.hooks.layers_to_hf(cfg, get, rope, rec, names)
    cfg.update(rec.hf_extra, **rec.requires)
    if names is not None:
        cfg["tie_word_embeddings"] = "output.weight" not in names
        if rec.bias_flag:
            cfg[rec.bias_flag] = bool({"blk.0.attn_q.bias", "blk.0.attn_qkv.bias"} & names)
        if rec.hooks.hf_from_tensors:  # the family's own (Falcon's decoder kind, StableLM's residual, ...)
            rec.hooks.hf_from_tensors(cfg, get, names)
    return cfg
