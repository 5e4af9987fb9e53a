"""GGUF (llama.cpp) tensor names <-> Hugging Face names, lazily, for the llama family and Gemma.

`gguf_to_hf(state, config)` renames a GGUF state dict to the names a Hugging Face `*ForCausalLM` uses and
undoes what llama.cpp's `convert_hf_to_gguf.py` did to the values:

- llama (arch "llama"): q and k projection rows were permuted for llama.cpp's interleaved RoPE
  (`LlamaModel.permute`: `w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)`,
  with `n_head = num_key_value_heads` for k, and `n_head = 1` for q/k norms). We apply the inverse. On
  quantized tensors each row is a whole run of blocks, so the inverse is a row `take` on the packed uint8
  blocks and the data stays quantized; otherwise it is a lazy reshape / swapaxes / reshape.
- gemma, gemma2, gemma3: every `*norm.weight` was stored as `w + 1` (Gemma's RMSNorm multiplies by
  `1 + weight`; llama.cpp folds the 1 in). We subtract 1.

`hf_to_gguf(state, config)` is the reverse, for export (forward permutation, +1, GGUF names; 1-D tensors
become float32 as llama.cpp's converter stores them). Neither reads a byte: both only build graph nodes.

Names (`N` = layer; `.weight`/`.bias` kept):

    token_embd              model.embed_tokens          output_norm     model.norm
    output                  lm_head                     blk.N.attn_norm model.layers.N.input_layernorm
    blk.N.attn_q/k/v        model.layers.N.self_attn.q_proj / k_proj / v_proj
    blk.N.attn_output       model.layers.N.self_attn.o_proj
    blk.N.attn_q_norm/k_norm model.layers.N.self_attn.q_norm / k_norm
    blk.N.ffn_gate/up/down  model.layers.N.mlp.gate_proj / up_proj / down_proj
    blk.N.ffn_norm          model.layers.N.post_attention_layernorm      (llama, qwen, gemma)
                            model.layers.N.pre_feedforward_layernorm     (gemma2, gemma3)
    blk.N.post_attention_norm  model.layers.N.post_attention_layernorm   (gemma2, gemma3)
    blk.N.post_ffw_norm     model.layers.N.post_feedforward_layernorm    (gemma2, gemma3)

`rope_freqs.weight` (llama 3 RoPE scaling factors the converter computes) has no Hugging Face tensor (its values
become config.json's llama3 `rope_scaling`, `hf_export.llama3_rope_params`) and
is dropped.

Example:
    >>> import numpy as np
    >>> from lazyweights import WeightData
    >>> from lazyweights.adapters import gguf_to_hf, hf_to_gguf
    >>> from lazyweights.formats.config import GGUFConfig
    >>> cfg = GGUFConfig({"general.architecture": "llama", "llama.attention.head_count": 2,
    ...                   "llama.attention.head_count_kv": 1, "llama.embedding_length": 8})
    >>> q = WeightData.from_numpy(np.arange(64, dtype=np.float32).reshape(8, 8), "q")
    >>> hf = gguf_to_hf({"blk.0.attn_q.weight": q}, cfg)
    >>> list(hf)
    ['model.layers.0.self_attn.q_proj.weight']
    >>> back = hf_to_gguf(hf, cfg)["blk.0.attn_q.weight"]
    >>> bool((back.to_numpy() == q.to_numpy()).all())
    True
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from ..api.weight_data import WeightData
from ..core.dtype import DType
from ..core.errors import (
    ConfigError,
    DTypeError,
    MissingWeightError,
    ShapeError,
    UnmappedTensorError,
    UnsupportedArchitectureError,
)
from ..graph import ops

# --- name tables ------------------------------------------------------------------------------------------
_LAYER_COMMON: dict[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_GEMMA2: dict[str, str] = {
    **_LAYER_COMMON,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP: dict[str, str] = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_LAYER_PHI3: dict[str, str] = {
    **{k: v for k, v in _LAYER_COMMON.items() if k not in ("attn_q", "attn_k", "attn_v", "ffn_gate")},
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_up": "mlp.gate_up_proj",  # fused [gate; up] rows, as llama.cpp's Phi-3 graph reads them
}
_LAYER_MIXTRAL: dict[str, str] = {**_LAYER_COMMON, "ffn_gate_inp": "block_sparse_moe.gate"}
_LAYER_QWEN_MOE: dict[str, str] = {
    **_LAYER_COMMON,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Stacked expert tensors (GGUF: one [n_expert, rows, cols] tensor) <-> one Hugging Face tensor per expert:
# arch -> (HF prefix inside the layer, {GGUF part: HF projection}).
EXPERTS: dict[str, tuple[str, dict[str, str]]] = {
    "llama": ("block_sparse_moe.experts", {"ffn_gate_exps": "w1", "ffn_down_exps": "w2", "ffn_up_exps": "w3"}),
    "qwen2moe": ("mlp.experts", {"ffn_gate_exps": "gate_proj", "ffn_down_exps": "down_proj", "ffn_up_exps": "up_proj"}),
    "qwen3moe": ("mlp.experts", {"ffn_gate_exps": "gate_proj", "ffn_down_exps": "down_proj", "ffn_up_exps": "up_proj"}),
}
# 1-D in GGUF, [1, n] in Hugging Face.
_ROW_VECTORS = frozenset({"ffn_gate_inp_shexp"})

LAYER_NAMES: dict[str, dict[str, str]] = {
    "llama": _LAYER_MIXTRAL,
    "phi3": _LAYER_PHI3,
    "qwen2moe": _LAYER_QWEN_MOE,
    "qwen3moe": _LAYER_QWEN_MOE,
    "qwen2": _LAYER_COMMON,
    "qwen3": _LAYER_COMMON,
    "gemma": _LAYER_COMMON,
    "gemma2": _LAYER_GEMMA2,
    "gemma3": _LAYER_GEMMA2,
}
# Architectures whose q/k rows llama.cpp's converter permutes (LlamaModel.undo_permute).
ROPE_PERMUTED_ARCHS = frozenset({"llama"})
# Architectures whose norms llama.cpp stores as weight + 1.
NORM_SHIFT_ARCHS = frozenset({"gemma", "gemma2", "gemma3"})
# GGUF-only tensors with no Hugging Face counterpart.
GGUF_ONLY = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})

# Hugging Face model_type -> GGUF architecture.
_MODEL_TYPE_ARCH = {
    "llama": "llama", "mistral": "llama", "mixtral": "llama",
    "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
    "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3",
}

_GGUF_LAYER_RE = re.compile(r"^blk\.(\d+)\.([A-Za-z0-9_]+)\.(weight|bias)$")
_GGUF_TOP_RE = re.compile(r"^([A-Za-z0-9_]+)\.(weight|bias)$")
_HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_HF_TOP_RE = re.compile(r"^(model\.embed_tokens|model\.norm|lm_head)\.(weight|bias)$")


def _check_arch(arch: str) -> dict[str, str]:
    table = LAYER_NAMES.get(arch)
    if table is None:
        raise UnsupportedArchitectureError(
            f"no GGUF <-> Hugging Face name mapping for architecture {arch!r} "
            f"(supported: {', '.join(sorted(LAYER_NAMES))})"
        )
    return table


def gguf_name_to_hf(name: str, arch: str) -> str | None:
    """The Hugging Face name for a GGUF tensor name, or None if it has none."""
    table = _check_arch(arch)
    m = _GGUF_LAYER_RE.match(name)
    if m:
        part = table.get(m[2])
        return None if part is None else f"model.layers.{m[1]}.{part}.{m[3]}"
    m = _GGUF_TOP_RE.match(name)
    if m and m[1] in _TOP:
        return f"{_TOP[m[1]]}.{m[2]}"
    return None


def hf_name_to_gguf(name: str, arch: str) -> str | None:
    """The GGUF tensor name for a Hugging Face name, or None if it has none."""
    table = _check_arch(arch)
    m = _HF_LAYER_RE.match(name)
    if m:
        reverse = {v: k for k, v in table.items()}
        part = reverse.get(m[2])
        return None if part is None else f"blk.{m[1]}.{part}.{m[3]}"
    m = _HF_TOP_RE.match(name)
    if m:
        reverse_top = {v: k for k, v in _TOP.items()}
        return f"{reverse_top[m[1]]}.{m[2]}"
    return None


# --- config facts ------------------------------------------------------------------------------------------
def _arch_of(config, arch: str | None) -> str:
    if arch:
        return arch
    if config is None:
        raise ConfigError("the GGUF <-> HF name mapping needs a config (or arch=...) to know the architecture")
    gguf_arch = _get(config, "architecture")
    if isinstance(gguf_arch, str):
        return gguf_arch
    model_type = _get(config, "model_type")
    if isinstance(model_type, str) and model_type in _MODEL_TYPE_ARCH:
        return _MODEL_TYPE_ARCH[model_type]
    raise ConfigError(
        f"cannot tell the architecture from the config (model_type={model_type!r}); pass arch='llama' or similar"
    )


def _get(config, name: str, default=None):
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(name, default)
    try:
        return getattr(config, name)
    except AttributeError:
        return default


def _text_config(config):
    """Multimodal HF configs (Gemma3ForConditionalGeneration) keep the language model's facts in text_config."""
    inner = _get(config, "text_config")
    return inner if inner is not None and _get(config, "num_attention_heads") is None else config


def _heads(config) -> tuple[int, int]:
    config = _text_config(config)
    n_head = _get(config, "num_attention_heads")
    if not isinstance(n_head, int) or n_head <= 0:
        raise ConfigError(
            f"undoing llama.cpp's RoPE permutation needs num_attention_heads from the config, got {n_head!r}"
        )
    n_kv = _get(config, "num_key_value_heads", None)
    if n_kv is None:
        n_kv = n_head
    if not isinstance(n_kv, int) or n_kv <= 0:
        raise ConfigError(
            f"num_key_value_heads must be a positive integer (a per-layer list is not supported here), got {n_kv!r}"
        )
    return n_head, n_kv


# --- value transforms -----------------------------------------------------------------------------------------
def rope_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row indices of llama.cpp's permute: `gguf_rows = hf_rows[rope_permutation(rows, n_head)]`.

    Its inverse (`np.argsort` of it) maps GGUF rows back: `hf_rows = gguf_rows[inverse]`.
    """
    if n_head <= 0 or rows % (2 * n_head):
        raise ShapeError(f"RoPE permutation: {rows} rows are not divisible into {n_head} heads of an even size")
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(-1)


def _rows_perm(wd: WeightData, n_head: int, inverse: bool) -> WeightData:
    if not wd.shape:
        raise ShapeError(f"RoPE permutation of {wd.name!r}: a 0-d tensor has no rows")
    rows = wd.shape[0]
    if rows % (2 * n_head):
        raise ShapeError(
            f"RoPE permutation of {wd.name!r}: {rows} rows are not divisible into {n_head} heads of an even size"
        )
    half = rows // n_head // 2
    rest = wd.shape[1:]
    if wd.quantization_encoding is not None:
        if wd.ndim < 2:
            raise ShapeError(f"RoPE permutation of {wd.name!r}: quantized data needs rows of blocks, got "
                             f"{list(wd.shape)}")
        perm = rope_permutation(rows, n_head)
        return wd[np.argsort(perm) if inverse else perm]
    if inverse:  # gguf -> hf: rows are (head, half, two); swap back to (head, two, half)
        return wd.reshape((n_head, half, 2) + rest).swapaxes(1, 2).reshape(wd.shape)
    return wd.reshape((n_head, 2, half) + rest).swapaxes(1, 2).reshape(wd.shape)


def rope_unpermute(wd: WeightData, n_head: int) -> WeightData:
    """Undo llama.cpp's q/k row permutation (GGUF -> Hugging Face), lazily; quantized stays quantized."""
    return _rows_perm(wd, n_head, inverse=True)


def rope_permute(wd: WeightData, n_head: int) -> WeightData:
    """Apply llama.cpp's q/k row permutation (Hugging Face -> GGUF), lazily; quantized stays quantized."""
    return _rows_perm(wd, n_head, inverse=False)


def _add_scalar(wd: WeightData, value: float) -> WeightData:
    """`wd + value`, lazily (a broadcast `binary` add with a constant of wd's dtype)."""
    from ..graph.elementwise import binary

    if wd.quantization_encoding is not None or not wd.dtype.is_float:
        raise DTypeError(f"cannot add {value} to {wd.name!r} ({wd.dtype.name}); dequantize it first")
    const = ops.const(np.full((1,) * wd.ndim, value, dtype=wd.dtype.to_numpy()))
    return WeightData.wrap(binary("add", wd.node, const), wd.name, None)


def _as_wd(value, name: str) -> WeightData:
    from ..api.weight_data import as_weight_data

    return as_weight_data(value, name)


# --- the adapters -----------------------------------------------------------------------------------------------
def _name_or_unknown(new: str | None, name: str, strict: bool, unknown: list[str]) -> str | None:
    """The tensor's new name; with none, its own name, or (strict) None after noting it in `unknown`."""
    if new is not None:
        return new
    if strict:
        unknown.append(name)
        return None
    return name


def _refuse_unknown(unknown: list[str], what: str, kept_under: str) -> None:
    """Raise for the tensors a strict rename found no name for (the first eight named)."""
    if unknown:
        raise UnmappedTensorError(
            f"{what} for {len(unknown)} tensor(s): "
            f"{', '.join(repr(u) for u in unknown[:8])}{' ...' if len(unknown) > 8 else ''} "
            f"(pass strict=False to keep them under {kept_under})"
        )


def gguf_to_hf(state: Mapping[str, Any], config=None, dequantize_to: DType | None = None, *,
               arch: str | None = None, rope_permuted: bool | None = None,
               strict: bool = True) -> dict[str, WeightData]:
    """Rename a GGUF state dict (name -> Weights or WeightData) to Hugging Face names, lazily.

    `config`: a `GGUFConfig` (`weights.config`), an HF config, or anything with `num_attention_heads`,
    `num_key_value_heads` and `architecture`/`model_type`; `arch` overrides the architecture.
    `dequantize_to`: None keeps quantized tensors quantized (uint8 blocks with their encoding); a dtype
    dequantizes every quantized tensor to it and casts every other float tensor to it.
    `rope_permuted`: whether q/k rows carry llama.cpp's permutation (default: arch == "llama"; False for
    GGUFs converted from Mistral's native format). `strict`: unknown names raise; otherwise they pass
    through under their GGUF names.
    """
    arch = _arch_of(config, arch)
    _check_arch(arch)
    if dequantize_to is not None:
        dequantize_to = DType.parse(dequantize_to)
    permuted = (arch in ROPE_PERMUTED_ARCHS) if rope_permuted is None else rope_permuted
    heads = _heads(config) if permuted else None
    out: dict[str, WeightData] = {}
    unknown: list[str] = []
    for name, value in state.items():
        if name in GGUF_ONLY:
            continue
        experts = _split_experts(name, value, arch, dequantize_to)
        if experts is not None:
            out.update(experts)
            continue
        hf = gguf_name_to_hf(name, arch)
        wd = _as_wd(value, name)
        if hf is not None and _part(name) in _ROW_VECTORS and wd.ndim == 1:
            wd = wd.reshape((1, wd.shape[0]))
        hf = _name_or_unknown(hf, name, strict, unknown)
        if hf is None:
            continue
        if permuted and (n := _rope_heads(hf, heads)):
            wd = rope_unpermute(wd, n)
        if arch in NORM_SHIFT_ARCHS and hf.endswith("norm.weight"):
            wd = _add_scalar(wd if wd.quantization_encoding is None else wd.dequantize(), -1.0)
        if dequantize_to is not None:
            if wd.quantization_encoding is not None:
                wd = wd.dequantize(dequantize_to)
            elif wd.dtype.is_float:
                wd = wd.astype(dequantize_to)
        out[hf] = _renamed(wd, hf)
    _refuse_unknown(unknown, f"gguf_to_hf ({arch}): no Hugging Face name", "their GGUF names")
    return out


def hf_to_gguf(state: Mapping[str, Any], config=None, *, arch: str | None = None,
               rope_permuted: bool | None = None, norm_dtype: DType | None = DType.float32,
               strict: bool = True) -> dict[str, WeightData]:
    """Rename a Hugging Face state dict to GGUF names for export, applying llama.cpp's conversions lazily:
    the q/k RoPE row permutation (llama), +1 on Gemma norms, and 1-D tensors cast to `norm_dtype`
    (float32, as llama.cpp stores them; None keeps their dtype)."""
    arch = _arch_of(config, arch)
    _check_arch(arch)
    permuted = (arch in ROPE_PERMUTED_ARCHS) if rope_permuted is None else rope_permuted
    heads = _heads(config) if permuted else None
    if norm_dtype is not None:
        norm_dtype = DType.parse(norm_dtype)
    out: dict[str, WeightData] = {}
    unknown: list[str] = []
    state = _stack_experts(state, arch)
    for name, value in state.items():
        g = hf_name_to_gguf(name, arch)
        if g is None and isinstance(value, WeightData) and _GGUF_LAYER_RE.match(name):
            g = name  # already stacked under its GGUF name by _stack_experts
        wd = _as_wd(value, name)
        if g is not None and _part(g) in _ROW_VECTORS and wd.ndim == 2 and wd.shape[0] == 1:
            wd = wd.reshape((wd.shape[1],))
        if g is None and name.endswith("rotary_emb.inv_freq"):
            continue  # computed at run time; llama.cpp's converter skips it too
        g = _name_or_unknown(g, name, strict, unknown)
        if g is None:
            continue
        if permuted and (n := _rope_heads(name, heads)):
            wd = rope_permute(wd, n)
        if norm_dtype is not None and wd.ndim == 1 and wd.quantization_encoding is None and wd.dtype.is_float:
            wd = wd.astype(norm_dtype)
        if arch in NORM_SHIFT_ARCHS and name.endswith("norm.weight"):
            wd = _add_scalar(wd, 1.0)
        out[g] = _renamed(wd, g)
    _refuse_unknown(unknown, f"hf_to_gguf ({arch}): no GGUF name", "their own names")
    return out


def _part(gguf_name: str) -> str | None:
    m = _GGUF_LAYER_RE.match(gguf_name)
    return m[2] if m else None


def _split_experts(name: str, value, arch: str, dequantize_to) -> dict[str, WeightData] | None:
    """A stacked GGUF expert tensor as one Hugging Face tensor per expert (lazy index on the leading axis;
    quantized experts are dequantized first, as the per-expert slices must be whole tensors)."""
    m = _GGUF_LAYER_RE.match(name)
    spec = EXPERTS.get(arch)
    if not m or spec is None or m[2] not in spec[1]:
        return None
    wd = _as_wd(value, name)
    if wd.ndim != 3:
        raise ShapeError(f"{name!r}: stacked experts must be 3-D [n_expert, rows, cols], got {list(wd.shape)}")
    if wd.quantization_encoding is not None:
        wd = wd.dequantize(dequantize_to or DType.float32)
    elif dequantize_to is not None and wd.dtype.is_float:
        wd = wd.astype(dequantize_to)
    prefix, parts = spec
    out = {}
    for e in range(wd.shape[0]):
        hf = f"model.layers.{m[1]}.{prefix}.{e}.{parts[m[2]]}.{m[3]}"
        out[hf] = _renamed(wd[e], hf)
    return out


_HF_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(\d+)\.([A-Za-z0-9_]+)\.(weight|bias)$")


def _stack_experts(state: Mapping[str, Any], arch: str) -> dict:
    """Per-expert Hugging Face tensors stacked into llama.cpp's [n_expert, rows, cols] tensors, under their
    GGUF names; experts must be numbered 0..n-1 with no gaps (KeyError-style error naming the missing one)."""
    from ..api.weight_data import stack

    spec = EXPERTS.get(arch)
    if spec is None:
        return dict(state)
    prefix, parts = spec
    reverse = {v: k for k, v in parts.items()}
    groups: dict[tuple[str, str, str], dict[int, Any]] = {}
    rest = {}
    for name, value in state.items():
        m = _HF_EXPERT_RE.match(name)
        if m and m[2] == prefix and m[4] in reverse:
            groups.setdefault((m[1], reverse[m[4]], m[5]), {})[int(m[3])] = (name, value)
        else:
            rest[name] = value
    for (layer, part, kind), members in sorted(groups.items()):
        n = max(members) + 1
        gaps = [e for e in range(n) if e not in members]
        if gaps:
            raise MissingWeightError(f"layer {layer}: expert tensor {part} has no expert {gaps[0]} "
                                   f"(experts present: {sorted(members)})")
        g = f"blk.{layer}.{part}.{kind}"
        rest[g] = stack([_as_wd(members[e][1], members[e][0]) for e in range(n)])
    return rest


def _rope_heads(hf_name: str, heads: tuple[int, int] | None) -> int:
    """How many heads the RoPE permutation uses for this (HF-named) tensor, or 0 if it is not permuted."""
    if heads is None:
        return 0
    n_head, n_kv = heads
    if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        return n_head
    if hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
        return n_kv
    if hf_name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
        return 1
    return 0


def _renamed(wd: WeightData, name: str) -> WeightData:
    return WeightData.wrap(wd.node, name, wd.quantization_encoding)


# --- export metadata --------------------------------------------------------------------------------------------
def gguf_metadata_from_config(config, arch: str | None = None, name: str | None = None) -> dict:
    """GGUF key/values for a Hugging Face config (the hyperparameters llama.cpp reads), typed as llama.cpp
    expects. Tokenizer keys are not included: copy them from an existing GGUF if you have one."""
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    arch = _arch_of(config, arch)
    cfg = _text_config(config)
    md: dict[str, Any] = {"general.architecture": GGUFValue(arch, T.STRING)}
    if name or _get(cfg, "_name_or_path"):
        md["general.name"] = GGUFValue(name or _get(cfg, "_name_or_path"), T.STRING)

    def put(key, attr, t, default=None):
        v = _get(cfg, attr, default)
        if v is not None:
            md[f"{arch}.{key}"] = GGUFValue(v, t)

    put("context_length", "max_position_embeddings", T.UINT32)
    put("embedding_length", "hidden_size", T.UINT32)
    put("block_count", "num_hidden_layers", T.UINT32)
    put("feed_forward_length", "intermediate_size", T.UINT32)
    put("attention.head_count", "num_attention_heads", T.UINT32)
    put("attention.head_count_kv", "num_key_value_heads", T.UINT32)
    put("attention.layer_norm_rms_epsilon", "rms_norm_eps", T.FLOAT32)
    put("rope.freq_base", "rope_theta", T.FLOAT32)
    put("attention.sliding_window", "sliding_window", T.UINT32)
    put("vocab_size", "vocab_size", T.UINT32)
    head_dim = _get(cfg, "head_dim")
    if head_dim is None and _get(cfg, "hidden_size") and _get(cfg, "num_attention_heads"):
        head_dim = _get(cfg, "hidden_size") // _get(cfg, "num_attention_heads")
    if head_dim is not None:
        md[f"{arch}.attention.key_length"] = GGUFValue(head_dim, T.UINT32)
        md[f"{arch}.attention.value_length"] = GGUFValue(head_dim, T.UINT32)
        if arch in ROPE_PERMUTED_ARCHS:
            md[f"{arch}.rope.dimension_count"] = GGUFValue(head_dim, T.UINT32)
    return md
