"""The tensor engine of conversion, both ways: GGUF (llama.cpp) state dicts <-> Hugging Face state dicts, lazily,
for every family that has a record in `lazyweights.adapters.archs`.

`gguf_to_hf(state, config)` renames a GGUF state dict to the names the family's Hugging Face model uses and
undoes what llama.cpp's `convert_hf_to_gguf.py` did to the values; `hf_to_gguf(state, config)` is the reverse,
for export (1-D tensors become float32 as llama.cpp's converter stores them). Neither reads a byte: both only
build graph nodes, so a whole checkpoint converts in one streaming save.

What the engine does is chosen by the record's fields and hooks, never by a family name
(`tests/adapters/test_family_hooks.py` holds it to that):

- names: gguf-py's own tables (`lazyweights.adapters.names`); GGUF -> HF picks, among gguf-py's candidates, the
  name the Hugging Face model declares (`expected_keys`, the records' generated `hf_names` table);
- values (`lazyweights.convert.transforms`): q/k rows permuted for llama.cpp's interleaved RoPE (`rope_permute`:
  `LlamaModel.permute`, inverted as a row `take`, which keeps quantized blocks packed), norms stored as
  `w + norm_shift` (Gemma), Conv1D weights stored transposed (`transposed`), fused qkv regrouped
  (`qkv_groups`), Mamba's A and conv1d (`ssm`), the gated delta-net's fused projections (`gdn`, `v_reorder`),
  multipliers folded in (`hooks.weight_scale`: Falcon-H1's muP);
- layout: per-expert tensors stacked (`experts`, `EXPERTS`), fused gate/up pairs split (`fused_gate_up_exps`,
  `fused_gate_up_shexp`), DeepSeek's kv_b split (`mla`), gpt-oss's MXFP4 experts repacked (`oai_experts`),
  flat and [in, out] expert layouts (`flat_experts`, `experts_in_out`), per-layer scalars kept as metadata
  (`layer_scalars`).

The hyperparameters are `convert/hparams.py`'s; whole models are `convert/to_gguf.py`'s and `convert/to_hf.py`'s.
`rope_freqs.weight` (Llama 3's RoPE factors) has no Hugging Face tensor: its values become config.json's
`rope_scaling` (`rope.llama3_rope_params`), and it is dropped here.

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

from ..adapters import names as _names
from ..adapters.archs import ARCHS, Arch, arch_for_gguf
from ..core.config_access import config_first, config_get, text_config
from ..core.dtype import DType
from ..core.errors import (
    ConfigError,
    MissingWeightError,
    ScaleShapeError,
    ShapeError,
    UnmappedTensorError,
)
from ..core.names import parse_block, parse_layer
from ..lazy.weight_data import WeightData
from .transforms import add_scalar as _add_scalar
from .transforms import (
    mxfp4_from_ggml,
    mxfp4_to_ggml,
    qkvz_rows,
    regroup_qkv,
    rope_permutation,
    rope_permute,
    rope_unpermute,
    scaled,
    ssm_to_gguf,
    ssm_to_hf,
    transpose2d,
    v_reorder,
)

__all__ = ["rope_permutation", "rope_permute", "rope_unpermute", "gguf_to_hf", "hf_to_gguf", "gguf_name_to_hf",
           "hf_name_to_gguf", "gguf_metadata_from_config", "EXPERTS", "GGUF_ONLY", "MXFP4_QUANTIZATION_CONFIG"]

# Stacked expert tensors (GGUF: one [n_expert, rows, cols] tensor) <-> one Hugging Face tensor per expert:
# arch -> (HF prefix inside the layer, {GGUF part: HF projection}), from the records' `experts` / `expert_names`.
EXPERTS: dict[str, tuple[str, dict[str, str]]] = {
    a.gguf: (a.experts, dict(zip(("ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"), a.expert_names)))
    for a in ARCHS.values() if a.experts}
# Weights llama.cpp's converter always stores in float32 (besides 1-D tensors and biases).
_ALWAYS_F32 = frozenset({"ffn_gate_inp", "ffn_gate_inp_shexp"})
# 1-D in GGUF, [1, n] in Hugging Face.
_ROW_VECTORS = frozenset({"ffn_gate_inp_shexp"})
# Architectures whose q/k rows llama.cpp's converter permutes (LlamaModel.permute).
ROPE_PERMUTED_ARCHS = frozenset(a.gguf for a in ARCHS.values() if a.rope_permute)
# Architectures whose norms llama.cpp stores as weight + 1.
NORM_SHIFT_ARCHS = frozenset(a.gguf for a in ARCHS.values() if a.norm_shift)
# GGUF-only tensors with no Hugging Face counterpart.
GGUF_ONLY = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})

_PARAMETRIZED = ".parametrizations.weight.original"
_GGUF_LAYER_RE = re.compile(r"^blk\.(\d+)\.([A-Za-z0-9_]+)\.(weight|bias)$")
# Mamba's layer tensors whose values llama.cpp's converter changes (A and D have no .weight suffix); llama.cpp's
# converter stores them in float32 (ssm_conv1d by name, the rest as 1-D, suffix-less or norm tensors)
_SSM_VALUE_RE = re.compile(r"^blk\.\d+\.(ssm_a|ssm_d|ssm_conv1d\.weight|ssm_norm\.weight)$")


def _ssm_part(gguf_name: str) -> str | None:
    m = _SSM_VALUE_RE.match(gguf_name)
    return m[1].split(".")[0] if m else None


def _check_arch(arch: str) -> Arch:
    return arch_for_gguf(arch)  # UnsupportedArchitectureError naming the nearest ones


def gguf_name_to_hf(name: str, arch: str, expected=None) -> str | None:
    """The Hugging Face name for a GGUF tensor name (gguf-py's table; `expected`: the model's own keys to
    choose among its candidates), or None if it has none."""
    rec = _check_arch(arch)
    if expected is None:
        m = _GGUF_LAYER_RE.match(name)
        expected = _names.default_hf_keys(rec.model_type, rec.hf_class, int(m[1]) + 1 if m else 1)
    return _names.gguf_to_hf_name(name, arch, expected, rec.hf_prefer)


def hf_name_to_gguf(name: str, arch: str) -> str | None:
    """The GGUF tensor name gguf-py's table gives a Hugging Face name, or None if it has none."""
    _check_arch(arch)
    return _names.hf_to_gguf_name(name, arch)


# --- config facts ------------------------------------------------------------------------------------------
def _arch_of(config, arch: str | None) -> str:
    if arch:
        return arch
    if config is None:
        raise ConfigError("the GGUF <-> HF name mapping needs a config (or arch=...) to know the architecture")
    gguf_arch = config_get(config, "architecture")
    if isinstance(gguf_arch, str):
        return gguf_arch
    model_type = config_get(config, "model_type")
    if isinstance(model_type, str) and model_type in ARCHS:
        return ARCHS[model_type].gguf
    raise ConfigError(
        f"cannot tell the architecture from the config (model_type={model_type!r}); pass arch='llama' or similar"
    )


def _heads(config) -> tuple[int, int]:
    config = text_config(config)
    n_head = config_get(config, "num_attention_heads")
    if n_head is None:
        n_head = config_get(config, "n_head")  # GPT-2-style configs (BLOOM, GPT-BigCode) as config.json spells them
    if not isinstance(n_head, int) or n_head <= 0:
        raise ConfigError(
            f"undoing llama.cpp's RoPE permutation needs num_attention_heads from the config, got {n_head!r}"
        )
    n_kv = config_get(config, "num_key_value_heads", None)
    mt = config_get(config, "model_type")
    hook = ARCHS[mt].hooks.kv_heads if isinstance(mt, str) and mt in ARCHS else None
    if hook is not None and n_kv is None:  # a Hugging Face config saying it its own way (Falcon, GPT-BigCode)
        n_kv = hook(lambda name, default=None: config_get(config, name, default), n_head)
    if n_kv is None:
        n_kv = n_head
    if hasattr(n_kv, "tolist"):
        n_kv = n_kv.tolist()
    if isinstance(n_kv, list) and n_kv and len({int(k) for k in n_kv if k}) == 1:
        n_kv = max(int(k) for k in n_kv)  # a hybrid's attention layers (0 marks its Mamba layers)
    if not isinstance(n_kv, int) or n_kv <= 0:
        raise ConfigError(
            f"num_key_value_heads must be a positive integer (a per-layer list is not supported here), got {n_kv!r}"
        )
    return n_head, n_kv


def _as_wd(value, name: str) -> WeightData:
    from ..lazy.weight_data import as_weight_data

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
               strict: bool = True, expected_keys=None) -> dict[str, WeightData]:
    """Rename a GGUF state dict (name -> Weights or WeightData) to Hugging Face names, lazily.

    `config`: a `GGUFConfig` (`weights.config`), an HF config, or anything with `num_attention_heads`,
    `num_key_value_heads` and `architecture`/`model_type`; `arch` overrides the architecture.
    `dequantize_to`: None keeps quantized tensors quantized (uint8 blocks with their encoding); a dtype
    dequantizes every quantized tensor to it and casts every other float tensor to it.
    `rope_permuted`: whether q/k rows carry llama.cpp's permutation (default: the family's record; False for
    GGUFs converted from Mistral's native format). `strict`: unknown names raise; otherwise they pass
    through under their GGUF names. `expected_keys`: the Hugging Face model's state-dict keys, which choose
    among gguf-py's candidate names (`names.expected_hf_keys`; `to_hf` passes the model the GGUF metadata
    describes); by default those of the family's model with transformers' default config.
    """
    arch = _arch_of(config, arch)
    md = getattr(config, "metadata", None)  # a GGUFConfig: its keys pick among records of one architecture
    rec = arch_for_gguf(arch, md if md is not None and hasattr(md, "get") else None)
    if rec.back_as in ARCHS:  # written back as another family (a VL model's text part): that family's HF layout
        rec = ARCHS[rec.back_as]  # (Qwen3-VL MoE's experts as Qwen3 MoE's, not its own [in, out] ones)
    if dequantize_to is not None:
        dequantize_to = DType.parse(dequantize_to)
    permuted = rec.rope_permute if rope_permuted is None else rope_permuted
    heads = _heads(config) if (permuted or rec.qkv_groups) else None
    if expected_keys is None:
        mt = config_get(text_config(config), "model_type")
        rec_mt = ARCHS[mt] if isinstance(mt, str) and mt in ARCHS and ARCHS[mt].gguf == arch else rec
        expected_keys = _names.default_hf_keys(rec_mt.model_type, rec_mt.hf_class, _names.layer_count(state))
    out: dict[str, WeightData] = {}
    unknown: list[str] = []
    if rec.fused_gate_up_exps:
        state = _join_pair(state, ("ffn_gate_exps", "ffn_up_exps"), rec.fused_gate_up_exps, axis=1)
    if rec.mla:
        state = _join_kv_b(state)
    if rec.gdn and not rec.v_reorder:  # Qwen3-Next's fused in_proj_qkvz (Qwen3.5 keeps in_proj_qkv and _z)
        state = _join_qkvz(state, md, arch)
    if rec.fused_gate_up_shexp:
        if rec.hybrid and not any(n.endswith("ffn_gate_inp.weight") for n in state):
            # a dense Granite 4.0 H: llama.cpp's plain MLP is the Hugging Face shared MLP
            state = {re.sub(r"\.ffn_(gate|up|down)\.weight$", r".ffn_\1_shexp.weight", n): v for n, v in state.items()}
        state = _join_pair(state, ("ffn_gate_shexp", "ffn_up_shexp"), rec.fused_gate_up_shexp)
    if rec.experts_in_out:
        state = _experts_in_out_from_gguf(state, rec.experts_in_out)
    if rec.oai_experts:
        state, ready = _oai_experts_to_hf(state, rec.oai_experts, dequantize_to)
        out.update(ready)
    for name, value in state.items():
        if name in GGUF_ONLY:
            continue
        if (rec.experts_in_out and name.startswith("model.layers.")) or \
                (rec.fused_gate_up_exps and name.endswith(rec.fused_gate_up_exps + ".weight")) or \
                (rec.mla and name.endswith("self_attn.kv_b_proj.weight")) or \
                (rec.gdn and name.endswith("linear_attn.in_proj_qkvz.weight")) or \
                (rec.fused_gate_up_shexp and name.endswith(rec.fused_gate_up_shexp + ".weight")):
            wd = _as_wd(value, name)
            if dequantize_to is not None and wd.dtype.is_float:
                wd = wd.astype(dequantize_to)
            out[name] = _renamed(wd, name)
            continue
        if rec.flat_experts and (m := _GGUF_LAYER_RE.match(name)) and m[2] in _FLAT_PARTS:
            flat_hf = f"{rec.flat_experts.format(bid=m[1])}.{rec.expert_names[_FLAT_PARTS.index(m[2])]}"
            wd = _as_wd(value, name)
            wd = wd.dequantize(dequantize_to or DType.float32) if wd.quantization_encoding is not None else \
                wd.astype(dequantize_to) if dequantize_to is not None else wd
            if wd.ndim != 3:
                raise ShapeError(f"{name!r}: stacked experts must be 3-D [n_expert, rows, cols], got {list(wd.shape)}")
            if m[2] == "ffn_down_exps":
                wd = wd.transpose((0, 2, 1))
            out[flat_hf] = _renamed(wd.reshape((wd.shape[0] * wd.shape[1], wd.shape[2])), flat_hf)
            continue
        experts = _split_experts(name, value, arch, dequantize_to)
        if experts is not None:
            out.update(experts)
            continue
        hf = gguf_name_to_hf(name, arch, expected_keys)
        wd = _as_wd(value, name)
        if hf is not None and _part(name) in _ROW_VECTORS and wd.ndim == 1:
            wd = wd.reshape((1, wd.shape[0]))
        hf = _name_or_unknown(hf, name, strict, unknown)
        if hf is None:
            continue
        if permuted and (n := _rope_heads(hf, heads)):
            wd = rope_unpermute(wd, n, _rotary_dims(config, arch, wd.shape[0] // n) if rec.partial_rotary else None)
        if rec.qkv_groups and heads and _part(name) == "attn_qkv":
            wd = regroup_qkv(wd, heads[0], heads[1] if rec.qkv_groups == "kv" else heads[0], inverse=True)
        if rec.transposed and hf.endswith(rec.transposed):
            wd = transpose2d(wd if wd.quantization_encoding is None else wd.dequantize())
        if rec.norm_shift and hf.endswith("norm.weight") and not (rec.gdn and hf.endswith("linear_attn.norm.weight")):
            wd = _add_scalar(wd if wd.quantization_encoding is None else wd.dequantize(), -rec.norm_shift)
        if (rec.ssm or rec.gdn) and (ssm := _ssm_part(name)):
            wd = ssm_to_hf(wd, ssm, rec.ssm or 1)
        if rec.shortconv and name.endswith(".shortconv.conv.weight") and wd.ndim == 2:
            wd = wd.reshape((wd.shape[0], 1, wd.shape[1]))  # LFM2's Conv1d weight [d, 1, L]
        if rec.v_reorder:
            wd = v_reorder(wd, hf, _v_dims_gguf(md, arch), inverse=True)
        if dequantize_to is not None:
            if wd.quantization_encoding is not None:
                wd = wd.dequantize(dequantize_to)
            elif wd.dtype.is_float:
                wd = wd.astype(dequantize_to)
        out[hf] = _renamed(wd, hf)
    if rec.layer_scalars and isinstance(md, Mapping):
        out.update(scalars_from_metadata(rec, md, arch, _names.layer_count(state), dequantize_to))
    if rec.embedding and "token_types.weight" not in state and "token_embd.weight" in state:
        out.update(_zero_token_types(state["token_embd.weight"], arch, expected_keys, dequantize_to))
    _refuse_unknown(unknown, f"gguf_to_hf ({arch}): no Hugging Face name", "their GGUF names")
    return out


def scalars_to_metadata(rec: Arch, state: Mapping[str, Any], arch: str) -> dict:
    """The GGUF per-layer arrays (float32, under the record's full keys) of a record's `layer_scalars`, read from
    the Hugging Face state dict (one scalar tensor per layer; a few bytes each). MissingWeightError naming a
    missing layer."""
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    md: dict[str, Any] = {}
    for suffix, key, _ in rec.layer_scalars:
        found: dict[int, float] = {}
        for name, value in state.items():
            layer = parse_layer(name)
            if layer is not None and layer[0] == "model" and layer[2] == suffix:
                arr = _as_wd(value, name).to_numpy().astype("float32").reshape(-1)
                if arr.size != 1:
                    raise ShapeError(f"{name!r}: a per-layer scalar ({key}) must hold one value, got "
                                     f"shape {list(arr.shape)}")
                found[layer[1]] = float(arr[0])
        if not found:
            continue
        gaps = [i for i in range(max(found) + 1) if i not in found]
        if gaps:
            raise MissingWeightError(f"model.layers.{gaps[0]}.{suffix} is missing ({key} needs one value "
                                     f"per layer; layers present: {sorted(found)})")
        md[key] = GGUFValue([found[i] for i in range(len(found))], T.ARRAY, T.FLOAT32)
    return md


def scalars_from_metadata(rec: Arch, md: Mapping[str, Any], arch: str, n_layers: int,
                          dtype: DType | None = None) -> dict[str, WeightData]:
    """The Hugging Face per-layer scalar tensors of a record's `layer_scalars` from the GGUF arrays (a single
    value is every layer's, as llama.cpp's `get_key_or_arr` reads it)."""
    import numpy as np

    out: dict[str, WeightData] = {}
    for suffix, key, ndim in rec.layer_scalars:
        v = md.get(key)
        if v is None:
            continue
        vals = [float(x) for x in np.asarray(v, dtype=np.float64).reshape(-1)]
        if len(vals) == 1:
            vals = vals * n_layers
        if len(vals) != n_layers:
            raise ShapeError(f"GGUF {key} ({arch}) holds {len(vals)} values for {n_layers} layers")
        for i, x in enumerate(vals):
            name = f"model.layers.{i}.{suffix}"
            wd = WeightData.from_numpy(np.full((1,) * ndim, x, dtype=np.float32), name)
            out[name] = wd if dtype is None else _renamed(wd.astype(dtype), name)
    return out


def hf_to_gguf(state: Mapping[str, Any], config=None, *, arch: str | None = None,
               rope_permuted: bool | None = None, norm_dtype: DType | None = DType.float32,
               strict: bool = True) -> dict[str, WeightData]:
    """Rename a Hugging Face state dict to GGUF names (gguf-py's table) for export, applying llama.cpp's
    conversions lazily as the family's record says: q/k RoPE row permutation, norm shift (Gemma +1), Conv1D
    transposes, fused qkv regrouping; 1-D tensors, biases of any rank (gpt-oss's expert biases: llama.cpp's
    add_id needs them float32) and router weights (`ffn_gate_inp`) cast to `norm_dtype` (float32, as llama.cpp stores
    them; None keeps their dtype)."""
    arch = _arch_of(config, arch)
    rec = _check_arch(arch)
    mt = config_get(text_config(config), "model_type")
    if isinstance(mt, str) and mt in ARCHS and ARCHS[mt].gguf == arch:
        rec = ARCHS[mt]
    permuted = rec.rope_permute if rope_permuted is None else rope_permuted
    heads = _heads(config) if (permuted or rec.qkv_groups) else None
    if norm_dtype is not None:
        norm_dtype = DType.parse(norm_dtype)
    out: dict[str, WeightData] = {}
    unknown: list[str] = []
    state = _stack_experts(state, arch)
    if rec.oai_experts:
        state = _oai_experts_to_gguf(state, rec.oai_experts)
    for name, value in state.items():
        if name.endswith(_PARAMETRIZED):  # torch.nn.utils.parametrize's saved name (jina-embeddings-v3's LoRA)
            name = name[: -len(_PARAMETRIZED)] + ".weight"
        dropped = rec.dropped + ("rotary_emb.inv_freq",) + tuple(sc[0] for sc in rec.layer_scalars)
        if name in dropped or name.endswith(tuple("." + d for d in dropped)):
            continue  # buffers, computed at run time; llama.cpp's converter skips them too
        if rec.fused_gate_up_exps and name.endswith(rec.fused_gate_up_exps + ".weight"):
            out.update(_split_pair(name, _as_wd(value, name), ("ffn_gate_exps", "ffn_up_exps"), axis=1))
            continue
        if rec.gdn and name.startswith("mtp."):
            continue  # multi-token-prediction layers: llama.cpp's converter drops them
        if rec.gdn and name.endswith("linear_attn.in_proj_qkvz.weight"):
            out.update(_split_qkvz(name, _as_wd(value, name), text_config(config)))
            continue
        if rec.mla and name.endswith("self_attn.kv_b_proj.weight"):
            out.update(_split_kv_b(name, _as_wd(value, name), config))
            continue
        if rec.fused_gate_up_shexp and name.endswith(rec.fused_gate_up_shexp + ".weight"):
            dense = rec.hybrid and not config_get(config, "num_local_experts")  # dense Granite 4.0 H: the plain MLP
            parts = ("ffn_gate", "ffn_up") if dense else ("ffn_gate_shexp", "ffn_up_shexp")
            out.update(_split_pair(name, _as_wd(value, name), parts))
            continue
        if rec.experts_in_out and name.startswith("model.layers.") and \
                name.endswith((f".{rec.experts_in_out}.gate_up_proj", f".{rec.experts_in_out}.down_proj")):
            out.update(_experts_in_out_to_gguf(name, _as_wd(value, name)))
            continue
        if rec.flat_experts and (flat := _flat_expert_part(rec, name)) is not None:
            flat_g = f"blk.{flat[0]}.{flat[1]}.weight"
            out[flat_g] = _renamed(_unflatten_experts(rec, name, _as_wd(value, name), flat[1], config), flat_g)
            continue
        g = hf_name_to_gguf(name, arch)
        if g is None and isinstance(value, WeightData) and _GGUF_LAYER_RE.match(name):
            g = name  # already stacked under its GGUF name by _stack_experts
        wd = _as_wd(value, name)
        if g is not None and _part(g) in _ROW_VECTORS and wd.ndim == 2 and wd.shape[0] == 1:
            wd = wd.reshape((wd.shape[1],))
        if rec.fused_gate_up_shexp and rec.hybrid and g is not None and g.endswith("ffn_down_shexp.weight") and \
                not config_get(config, "num_local_experts"):
            g = g.replace("ffn_down_shexp", "ffn_down")  # dense Granite 4.0 H: the shared MLP is the MLP
        g = _name_or_unknown(g, name, strict, unknown)
        if g is None:
            continue
        if rec.v_reorder:
            wd = v_reorder(wd, name, _v_dims_hf(text_config(config)))
        if permuted and (n := _rope_heads(name, heads)):
            wd = rope_permute(wd, n, _rotary_dims(config, arch, wd.shape[0] // n) if rec.partial_rotary else None)
        if rec.transposed and name.endswith(rec.transposed):
            wd = transpose2d(wd)
        if rec.position_offset and g == "position_embd.weight":
            wd = wd[position_offset(config, name, wd.shape[0]):]
        if rec.qkv_groups and heads and _part(g) == "attn_qkv":
            wd = regroup_qkv(wd, heads[0], heads[1] if rec.qkv_groups == "kv" else heads[0])
        if rec.hooks.weight_scale and (mup := rec.hooks.weight_scale(name, text_config(config))) is not None and \
                (isinstance(mup, np.ndarray) or mup != 1.0):  # Falcon-H1's muP multipliers folded in
            wd = scaled(wd, mup)
        ssm = _ssm_part(g) if rec.ssm or rec.gdn else None
        if ssm:
            cfg = text_config(config)
            wd = ssm_to_gguf(wd, ssm, rec.ssm or 1, int(config_first(cfg, ("n_groups", "mamba_n_groups"), 1)))
        conv = rec.shortconv and g.endswith(".shortconv.conv.weight")
        if conv and wd.ndim == 3 and wd.shape[1] == 1:  # LFM2's depthwise conv: llama.cpp's ssm_conv takes [d, L]
            wd = wd.reshape((wd.shape[0], wd.shape[2]))
        f32 = wd.ndim == 1 or ssm or conv or g.endswith(".bias") or _part(g) in _ALWAYS_F32
        if norm_dtype is not None and f32 and wd.quantization_encoding is None and wd.dtype.is_float:
            wd = wd.astype(norm_dtype)  # llama.cpp's converter: 1-D tensors, every bias, router weights, Mamba's
        gdn_norm = rec.gdn and name.endswith("linear_attn.norm.weight")  # the gated delta-net's: not zero-centred
        if rec.norm_shift and name.endswith("norm.weight") and not gdn_norm:
            wd = _add_scalar(wd, rec.norm_shift)
        out[g] = _renamed(wd, g)
    _refuse_unknown(unknown, f"hf_to_gguf ({arch}): no GGUF name", "their own names")
    return out


def _qkvz_dims(cfg) -> tuple[int, int, int]:
    n_k, n_v = int(config_get(cfg, "linear_num_key_heads")), int(config_get(cfg, "linear_num_value_heads"))
    return n_k, int(config_get(cfg, "linear_key_head_dim")), n_v // n_k * int(config_get(cfg, "linear_value_head_dim"))


def _split_qkvz(name: str, wd: WeightData, cfg) -> dict[str, WeightData]:
    """Qwen3-Next's `in_proj_qkvz` ([q, k, v, z] per key head) as llama.cpp's attn_qkv ([q; k; v]) and attn_gate."""
    n_k, hk, vz = _qkvz_dims(cfg)
    m = re.search(r"\.(\d+)\.", name)
    if m is None or wd.ndim != 2 or wd.shape[0] != n_k * (2 * hk + 2 * vz):
        raise ShapeError(f"{name!r}: expected [{n_k} x (2 x {hk} + 2 x {vz}), hidden] rows, got {list(wd.shape)}")
    qkv, z = qkvz_rows(n_k, hk, vz)
    a, b = f"blk.{m[1]}.attn_qkv.weight", f"blk.{m[1]}.attn_gate.weight"
    return {a: _renamed(wd[qkv], a), b: _renamed(wd[z], b)}


def _v_dims_hf(cfg) -> tuple[int, int, int, int]:
    """Key heads, value heads, key and value head sizes of a gated delta-net from config.json."""
    return tuple(int(config_get(cfg, k) or 0) for k in ("linear_num_key_heads", "linear_num_value_heads",  # type: ignore
                                                  "linear_key_head_dim", "linear_value_head_dim"))


def _v_dims_gguf(md, arch: str) -> tuple[int, int, int, int]:
    """`_v_dims_hf` from a GGUF's metadata (llama.cpp's ssm.* keys)."""
    from gguf.constants import Keys

    def get(key: str) -> int:
        v = md.get(key.format(arch=arch)) if md is not None else None
        return int(getattr(v, "value", v) or 0)

    ssm = Keys.SSM
    n_v = get(ssm.TIME_STEP_RANK)
    return get(ssm.GROUP_COUNT), n_v, get(ssm.STATE_SIZE), get(ssm.INNER_SIZE) // n_v if n_v else 0


def _join_qkvz(state: Mapping[str, Any], md, arch: str) -> dict[str, Any]:
    """llama.cpp's attn_qkv and attn_gate of a gated delta-net layer joined back into Qwen3-Next's in_proj_qkvz
    ([q, k, v, z] per key head); the key head count from `{arch}.ssm.group_count`."""
    from gguf.constants import Keys

    from ..lazy.weight_data import concat

    out = dict(state)
    for name in list(state):
        block = parse_block(name)
        if block is None or block[1] != "attn_gate.weight":
            continue
        qkv_name = f"blk.{block[0]}.attn_qkv.weight"
        if qkv_name not in state:
            continue
        n_k = md.get(Keys.SSM.GROUP_COUNT.format(arch=arch)) if md is not None else None
        n_k = int(getattr(n_k, "value", n_k) or 0)
        qkv, z = _as_wd(out.pop(qkv_name), qkv_name), _as_wd(out.pop(name), name)
        if qkv.quantization_encoding is not None:
            qkv, z = qkv.dequantize(), z.dequantize()
        key_rows = (qkv.shape[0] - z.shape[0]) // 2
        if n_k <= 0 or key_rows % n_k or z.shape[0] % n_k:
            raise ShapeError(f"{qkv_name!r} {list(qkv.shape)} / {name!r} {list(z.shape)}: "
                             f"no split into {n_k} key heads")
        fwd = np.concatenate(qkvz_rows(n_k, key_rows // n_k, z.shape[0] // n_k))
        hf = f"model.layers.{block[0]}.linear_attn.in_proj_qkvz.weight"
        out[hf] = _renamed(concat([qkv, z], axis=0)[np.argsort(fwd)], hf)
    return out


def _zero_token_types(embd, arch: str, expected_keys, dtype) -> dict[str, WeightData]:
    """An encoder GGUF without `token_types` (DistilBERT's): llama.cpp adds nothing, so the Hugging Face model
    (BERT always adds token type 0's row) gets one zero row."""
    import numpy as np

    hf = gguf_name_to_hf("token_types.weight", arch, expected_keys)
    wd = _as_wd(embd, "token_embd.weight")
    if hf is None or wd.ndim != 2:
        return {}
    np_dtype = (DType.parse(dtype) if dtype is not None else DType.float32).to_numpy()
    return {hf: WeightData.from_numpy(np.zeros((1, wd.shape[1]), dtype=np_dtype), hf)}


def position_offset(config, name: str = "embeddings.position_embeddings.weight", rows: int | None = None) -> int:
    """RoBERTa's first used position row, `pad_token_id + 1` (llama.cpp's converter drops the rows before it);
    0 without a pad_token_id. ShapeError when `rows` leaves none."""
    pad = config_get(text_config(config), "pad_token_id")
    off = 0 if pad is None else int(pad) + 1
    if rows is not None and off >= rows:
        raise ShapeError(f"{name!r}: {rows} position rows, but positions start at pad_token_id + 1 = {off}")
    return off


# --- gpt-oss: fused experts ([E, in, out], gate/up rows interleaved) or OCP MXFP4 blocks kept packed ---------------
# config.json's quantization_config for experts written back as `*_blocks` / `*_scales` (the published checkpoints')
MXFP4_QUANTIZATION_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
_OAI_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(gate_up_proj|down_proj)(_blocks|_scales|_bias)?$")
_GGUF_OAI_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.(weight|bias)$")


def _oai_experts_to_gguf(state: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """gpt-oss's expert tensors and attention sinks under llama.cpp's names, as its converter writes them: gate_up
    split into its even (gate) and odd (up) output rows, weights `[E, out, in]`; MXFP4 `*_blocks` / `*_scales`
    repacked into ggml MXFP4 bit for bit (`transforms.mxfp4_to_ggml`), never dequantized. Other tensors pass."""
    out: dict[str, Any] = {}
    packed: dict[tuple[str, str], dict[str, tuple[str, Any]]] = {}
    for name, value in state.items():
        m = _OAI_RE.match(name)
        if m and m[2] == prefix:
            layer, proj, kind = m[1], m[3], m[4] or ""
            if kind in ("_blocks", "_scales"):
                packed.setdefault((layer, proj), {})[kind] = (name, value)
                continue
            out.update(_oai_dense(layer, proj, kind, _as_wd(value, name)))
            continue
        sinks = parse_layer(name)
        if sinks is not None and sinks[0] == "model" and sinks[2] == "self_attn.sinks":
            g = f"blk.{sinks[1]}.attn_sinks.weight"
            out[g] = _renamed(_as_wd(value, name), g)
            continue
        out[name] = value
    for (layer, proj), parts in sorted(packed.items()):
        if len(parts) != 2:
            have = next(iter(parts.values()))[0]
            lacking = "_scales" if "_blocks" in parts else "_blocks"
            raise MissingWeightError(f"MXFP4 {have!r} has no partner {have.rsplit('_', 1)[0] + lacking!r}")
        (bn, bv), (sn, sv) = parts["_blocks"], parts["_scales"]
        b, s = _as_wd(bv, bn), _as_wd(sv, sn)
        if b.ndim != 4 or b.shape[-1] != 16 or tuple(b.shape[:-1]) != tuple(s.shape):
            raise ScaleShapeError(f"MXFP4 {bn!r} {list(b.shape)} does not fit {sn!r} {list(s.shape)}: blocks must be "
                                  f"[n_expert, rows, n_blocks, 16] over scales [n_expert, rows, n_blocks]")
        if proj == "down_proj":
            g = f"blk.{layer}.ffn_down_exps.weight"
            out[g] = mxfp4_to_ggml(b, s, g)
            continue
        if b.shape[1] % 2:
            raise ShapeError(f"{bn!r} {list(b.shape)}: gate_up rows must be interleaved gate/up pairs (an even count)")
        for part, first in (("gate", 0), ("up", 1)):
            g = f"blk.{layer}.ffn_{part}_exps.weight"
            out[g] = mxfp4_to_ggml(b[:, first::2], s[:, first::2], g)
    return out


def _oai_dense(layer: str, proj: str, kind: str, wd: WeightData) -> dict[str, WeightData]:
    """One unquantized gpt-oss expert tensor (or bias) as llama.cpp's stacked-expert tensors."""
    what = "bias" if kind else "weight"
    want = 2 if kind else 3
    if wd.ndim != want:
        raise ShapeError(f"'model.layers.{layer}.mlp.experts.{proj}{kind}': expected {want} dimensions "
                         f"([n_expert, {'out' if kind else 'in, out'}]), got {list(wd.shape)}")
    if not kind:
        wd = wd.transpose((0, 2, 1))  # [E, in, out] -> llama.cpp's [E, out, in]
    if proj == "down_proj":
        g = f"blk.{layer}.ffn_down_exps.{what}"
        return {g: _renamed(wd, g)}
    if wd.shape[1] % 2:
        raise ShapeError(f"'model.layers.{layer}.mlp.experts.gate_up_proj{kind}' {list(wd.shape)}: gate/up rows must "
                         "come in interleaved pairs (an even count)")
    gate, up = f"blk.{layer}.ffn_gate_exps.{what}", f"blk.{layer}.ffn_up_exps.{what}"
    return {gate: _renamed(wd[:, 0::2], gate), up: _renamed(wd[:, 1::2], up)}


def _oai_experts_to_hf(state: Mapping[str, Any], prefix: str, dequantize_to) -> tuple[dict, dict[str, WeightData]]:
    """The inverse of `_oai_experts_to_gguf`: (the other tensors, the Hugging Face expert and sink tensors).
    ggml MXFP4 gate and up go back as OCP `*_blocks` / `*_scales` (rows re-interleaved, bit for bit); other
    quantized experts are dequantized (to `dequantize_to`, float32 by default)."""
    from ..lazy.weight_data import stack

    rest: dict[str, Any] = {}
    found: dict[tuple[str, str, str], WeightData] = {}
    ready: dict[str, WeightData] = {}

    def fl(w: WeightData) -> WeightData:
        if w.quantization_encoding is not None:
            return w.dequantize(dequantize_to or DType.float32)
        return w.astype(dequantize_to) if dequantize_to is not None and w.dtype.is_float else w

    for name, value in state.items():
        m, block = _GGUF_OAI_RE.match(name), parse_block(name)
        if m:
            found[(m[1], m[2], m[3])] = _as_wd(value, name)
        elif block is not None and block[1] == "attn_sinks.weight":
            hf = f"model.layers.{block[0]}.self_attn.sinks"
            ready[hf] = _renamed(fl(_as_wd(value, name)), hf)
        else:
            rest[name] = value
    for layer in sorted({k[0] for k in found}, key=int):
        base = f"model.layers.{layer}.{prefix}"
        parts = {(p, w): found.get((layer, p, w)) for p in ("gate", "up", "down") for w in ("weight", "bias")}
        lacking = [f"blk.{layer}.ffn_{p}_exps.{w}" for (p, w), v in parts.items() if v is None and w == "weight"]
        if lacking:
            raise MissingWeightError(f"gpt-oss layer {layer}: no {', '.join(lacking)}")
        gate, up, down = parts[("gate", "weight")], parts[("up", "weight")], parts[("down", "weight")]
        assert gate is not None and up is not None and down is not None
        mx = [w.quantization_encoding is not None and w.quantization_encoding.name == "MXFP4" for w in (gate, up)]
        if all(mx):
            (gb, gs), (ub, us) = mxfp4_from_ggml(gate, "gate"), mxfp4_from_ggml(up, "up")
            e, f = gb.shape[0], gb.shape[1]
            blocks = stack([gb, ub], axis=2).reshape((e, 2 * f) + tuple(gb.shape[2:]))
            scales = stack([gs, us], axis=2).reshape((e, 2 * f) + tuple(gs.shape[2:]))
            ready[f"{base}.gate_up_proj_blocks"] = _renamed(blocks, f"{base}.gate_up_proj_blocks")
            ready[f"{base}.gate_up_proj_scales"] = _renamed(scales, f"{base}.gate_up_proj_scales")
        else:
            g, u = fl(gate), fl(up)
            fused = stack([g, u], axis=2).reshape((g.shape[0], 2 * g.shape[1], g.shape[2])).transpose((0, 2, 1))
            ready[f"{base}.gate_up_proj"] = _renamed(fused, f"{base}.gate_up_proj")
        if down.quantization_encoding is not None and down.quantization_encoding.name == "MXFP4" and all(mx):
            db, ds = mxfp4_from_ggml(down, f"{base}.down_proj")
            ready[db.name], ready[ds.name] = db, ds
        else:
            ready[f"{base}.down_proj"] = _renamed(fl(down).transpose((0, 2, 1)), f"{base}.down_proj")
        gb_, ub_, db_ = parts[("gate", "bias")], parts[("up", "bias")], parts[("down", "bias")]
        if gb_ is not None and ub_ is not None:
            g, u = fl(gb_), fl(ub_)
            ready[f"{base}.gate_up_proj_bias"] = _renamed(
                stack([g, u], axis=2).reshape((g.shape[0], 2 * g.shape[1])), f"{base}.gate_up_proj_bias")
        if db_ is not None:
            ready[f"{base}.down_proj_bias"] = _renamed(fl(db_), f"{base}.down_proj_bias")
    return rest, ready



def _experts_in_out_to_gguf(name: str, wd: WeightData) -> dict[str, WeightData]:
    """Llama 4's [n_expert, in, out] experts as llama.cpp's [n_expert, out, in] stacks (gate_up split in halves)."""
    from ..lazy.weight_data import split

    layer = parse_layer(name)
    if layer is None or layer[0] != "model" or wd.ndim != 3 or (
            name.endswith("gate_up_proj") and wd.shape[2] % 2):
        raise ShapeError(f"{name!r}: [in, out] experts must be [n_expert, in, out] (gate_up: an even out), got "
                         f"{list(wd.shape)}")
    wd = wd.transpose((0, 2, 1))
    if name.endswith("down_proj"):
        g = f"blk.{layer[1]}.ffn_down_exps.weight"
        return {g: _renamed(wd, g)}
    gate, up = split(wd, 2, axis=1)
    g, u = f"blk.{layer[1]}.ffn_gate_exps.weight", f"blk.{layer[1]}.ffn_up_exps.weight"
    return {g: _renamed(gate, g), u: _renamed(up, u)}


def _experts_in_out_from_gguf(state: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """llama.cpp's stacked expert tensors back as Llama 4's [n_expert, in, out] gate_up_proj / down_proj."""
    from ..lazy.weight_data import concat

    def plain(n: str) -> WeightData:
        wd = _as_wd(out.pop(n), n)
        return wd.dequantize() if wd.quantization_encoding is not None else wd

    out = dict(state)
    for name in list(state):
        block = parse_block(name)
        if block is None or block[1] != "ffn_gate_exps.weight":
            continue
        up, down = f"blk.{block[0]}.ffn_up_exps.weight", f"blk.{block[0]}.ffn_down_exps.weight"
        if up not in state or down not in state:
            continue
        gate_up = concat([plain(name), plain(up)], axis=1).transpose((0, 2, 1))
        hf_gu, hf_d = f"model.layers.{block[0]}.{prefix}.gate_up_proj", f"model.layers.{block[0]}.{prefix}.down_proj"
        out[hf_gu] = _renamed(gate_up, hf_gu)
        out[hf_d] = _renamed(plain(down).transpose((0, 2, 1)), hf_d)
    return out


_FLAT_PARTS = ("ffn_gate_exps", "ffn_down_exps", "ffn_up_exps")  # in `Arch.expert_names` order


def _flat_expert_part(rec: Arch, name: str) -> tuple[str, str] | None:
    """(layer, GGUF part) for a Hugging Face flat-expert tensor of `rec.flat_experts`, else None."""
    pattern = re.escape(rec.flat_experts).replace(re.escape("{bid}"), r"(\d+)")
    m = re.match(rf"^{pattern}\.([A-Za-z0-9_]+)$", name)
    if m is None or m[2] not in rec.expert_names:
        return None
    return m[1], _FLAT_PARTS[rec.expert_names.index(m[2])]


def _unflatten_experts(rec: Arch, name: str, wd: WeightData, part: str, config) -> WeightData:
    """A flat [n_expert * ff, hidden] expert tensor as llama.cpp's [n_expert, ff, hidden] (down: [n_expert,
    hidden, ff], each expert's block transposed), n_expert from the record's expert_count row."""
    rows = next((hp.hf for hp in rec.hparams if hp.key == "expert_count"), ())
    n = config_first(config, rows)
    if not isinstance(n, int) or n <= 0 or wd.ndim != 2 or wd.shape[0] % n:
        raise ShapeError(f"{name!r}: flat experts {list(wd.shape)} do not split into {n!r} experts "
                         f"({' or '.join(rows)})")
    wd = wd.reshape((n, wd.shape[0] // n, wd.shape[1]))
    return wd.transpose((0, 2, 1)) if part == "ffn_down_exps" else wd


def _split_pair(name: str, wd: WeightData, parts: tuple[str, str], axis: int = 0) -> dict[str, WeightData]:
    """A Hugging Face fused [first; second] tensor as llama.cpp's two tensors `blk.N.{parts[0]}` /
    `blk.N.{parts[1]}`, halves along `axis`: 0 for a 2-D [2 * ff, hidden] (GraniteMoeShared's shared [gate; up]),
    1 for stacked experts [n_expert, 2 * ff, hidden] (GraniteMoE's input_linear)."""
    from ..lazy.weight_data import split

    m = re.search(r"\.(\d+)\.", name)
    if m is None or wd.ndim != axis + 2 or wd.shape[axis] % 2:
        raise ShapeError(f"{name!r}: a fused [{parts[0]}; {parts[1]}] tensor must be {axis + 2}-D with an even size "
                         f"on axis {axis}, got {list(wd.shape)}")
    a, b = split(wd, 2, axis=axis)
    ga, gb = f"blk.{m[1]}.{parts[0]}.weight", f"blk.{m[1]}.{parts[1]}.weight"
    return {ga: _renamed(a, ga), gb: _renamed(b, gb)}


def _join_pair(state: Mapping[str, Any], parts: tuple[str, str], hf_part: str, axis: int = 0) -> dict[str, Any]:
    """llama.cpp's `blk.N.{parts[0]}` / `blk.N.{parts[1]}` joined back along `axis` into the Hugging Face tensor
    `model.layers.N.{hf_part}.weight` (the inverse of `_split_pair`)."""
    from ..lazy.weight_data import concat

    out = dict(state)
    for name in list(state):
        block = parse_block(name)
        if block is None or block[1] != f"{parts[0]}.weight":
            continue
        second = f"blk.{block[0]}.{parts[1]}.weight"
        if second not in state:
            continue
        a, b = _as_wd(out.pop(name), name), _as_wd(out.pop(second), second)
        if a.quantization_encoding is not None or b.quantization_encoding is not None:
            a, b = a.dequantize(), b.dequantize()
        hf = f"model.layers.{block[0]}.{hf_part}.weight"
        out[hf] = _renamed(concat([a, b], axis=axis), hf)
    return out


def _split_kv_b(name: str, wd: WeightData, config) -> dict[str, WeightData]:
    """DeepSeek's kv_b_proj `[n_head * (qk_nope + v), kv_lora_rank]` as llama.cpp's MLA pair: `attn_k_b`
    `[n_head, kv_lora_rank, qk_nope]` (each head's key part transposed) and `attn_v_b` `[n_head, v, kv_lora_rank]`."""
    cfg = text_config(config)
    n_head, nope, v = (config_get(cfg, k) for k in ("num_attention_heads", "qk_nope_head_dim", "v_head_dim"))
    if not all(isinstance(x, int) and x > 0 for x in (n_head, nope, v)):
        raise ConfigError(f"splitting {name!r} needs num_attention_heads, qk_nope_head_dim and v_head_dim from the "
                          f"config, got {n_head!r}, {nope!r}, {v!r}")
    if wd.quantization_encoding is not None:
        wd = wd.dequantize()
    if wd.ndim != 2 or wd.shape[0] != n_head * (nope + v):
        raise ShapeError(f"{name!r}: MLA kv_b_proj must be [{n_head} heads x ({nope} + {v}), kv_lora_rank], got "
                         f"{list(wd.shape)}")
    m = re.search(r"\.(\d+)\.", name)
    kv = wd.reshape((n_head, nope + v, wd.shape[1]))
    k_b, v_b = f"blk.{m[1] if m else 0}.attn_k_b.weight", f"blk.{m[1] if m else 0}.attn_v_b.weight"
    return {k_b: _renamed(kv[:, :nope, :].transpose((0, 2, 1)), k_b), v_b: _renamed(kv[:, nope:, :], v_b)}


def _join_kv_b(state: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's attn_k_b / attn_v_b joined back into DeepSeek's kv_b_proj (the inverse of `_split_kv_b`)."""
    from ..lazy.weight_data import concat

    out = dict(state)
    for name in list(state):
        block = parse_block(name)
        if block is None or block[1] != "attn_k_b.weight":
            continue
        v_name = f"blk.{block[0]}.attn_v_b.weight"
        if v_name not in state:
            continue
        k_b, v_b = _as_wd(out.pop(name), name), _as_wd(out.pop(v_name), v_name)
        if k_b.quantization_encoding is not None:
            k_b = k_b.dequantize()
        if v_b.quantization_encoding is not None:
            v_b = v_b.dequantize()
        if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[:2] != (v_b.shape[0], v_b.shape[2]):
            raise ShapeError(f"{name!r} {list(k_b.shape)} and {v_name!r} {list(v_b.shape)}: not an MLA pair "
                             f"[n_head, kv_lora_rank, qk_nope] / [n_head, v, kv_lora_rank]")
        n_head, r = k_b.shape[0], k_b.shape[1]
        joined = concat([k_b.transpose((0, 2, 1)), v_b], axis=1)
        hf = f"model.layers.{block[0]}.self_attn.kv_b_proj.weight"
        out[hf] = _renamed(joined.reshape((n_head * joined.shape[1], r)), hf)
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


_HF_EXPERT_RE = re.compile(r"^(?:model|backbone)\.layers\.(\d+)\.(.+)\.(\d+)\.([A-Za-z0-9_]+)\.(weight|bias)$")


def _stack_experts(state: Mapping[str, Any], arch: str) -> dict:
    """Per-expert Hugging Face tensors stacked into llama.cpp's [n_expert, rows, cols] tensors, under their
    GGUF names; experts must be numbered 0..n-1 with no gaps (KeyError-style error naming the missing one)."""
    from ..lazy.weight_data import stack

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


def _rotary_dims(config, arch: str, head_dim: int) -> int | None:
    """Rotary dimensions per head of a partial-rotary family: the GGUF's `rope.dimension_count`, else the
    config's partial_rotary_factor (rope_parameters first) times `head_dim`; None: the whole head."""
    md = config_get(config, "metadata")  # a GGUFConfig's raw key/values (any mapping-like reader)
    if md is not None and hasattr(md, "get"):
        from gguf.constants import Keys

        rotary = md.get(Keys.Rope.DIMENSION_COUNT.format(arch=arch))
        if rotary is not None:
            return int(rotary)
    cfg = text_config(config)
    params = config_get(cfg, "rope_parameters")
    factor = params.get("partial_rotary_factor") if isinstance(params, Mapping) else None
    if factor is None:
        factor = config_get(cfg, "partial_rotary_factor")
    return None if factor is None else int(float(factor) * head_dim)


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
    from gguf.constants import Keys

    from ..formats.gguf_writer import GGUFValue

    arch = _arch_of(config, arch)
    cfg = text_config(config)
    md: dict[str, Any] = {Keys.General.ARCHITECTURE: GGUFValue(arch, T.STRING)}
    if name or config_get(cfg, "_name_or_path"):
        md[Keys.General.NAME] = GGUFValue(name or config_get(cfg, "_name_or_path"), T.STRING)

    def put(key: str, attr, t, default=None):
        v = config_get(cfg, attr, default)
        if v is not None:
            md[key.format(arch=arch)] = GGUFValue(v, t)

    llm, attn = Keys.LLM, Keys.Attention
    put(llm.CONTEXT_LENGTH, "max_position_embeddings", T.UINT32)
    put(llm.EMBEDDING_LENGTH, "hidden_size", T.UINT32)
    put(llm.BLOCK_COUNT, "num_hidden_layers", T.UINT32)
    put(llm.FEED_FORWARD_LENGTH, "intermediate_size", T.UINT32)
    put(attn.HEAD_COUNT, "num_attention_heads", T.UINT32)
    put(attn.HEAD_COUNT_KV, "num_key_value_heads", T.UINT32)
    put(attn.LAYERNORM_RMS_EPS, "rms_norm_eps", T.FLOAT32)
    put(Keys.Rope.FREQ_BASE, "rope_theta", T.FLOAT32)
    put(attn.SLIDING_WINDOW, "sliding_window", T.UINT32)
    put(llm.VOCAB_SIZE, "vocab_size", T.UINT32)
    head_dim = config_get(cfg, "head_dim")
    if head_dim is None and config_get(cfg, "hidden_size") and config_get(cfg, "num_attention_heads"):
        head_dim = config_get(cfg, "hidden_size") // config_get(cfg, "num_attention_heads")
    if head_dim is not None:
        md[attn.KEY_LENGTH.format(arch=arch)] = GGUFValue(head_dim, T.UINT32)
        md[attn.VALUE_LENGTH.format(arch=arch)] = GGUFValue(head_dim, T.UINT32)
        if arch in ROPE_PERMUTED_ARCHS:
            md[Keys.Rope.DIMENSION_COUNT.format(arch=arch)] = GGUFValue(head_dim, T.UINT32)
    return md
