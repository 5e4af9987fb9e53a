"""Whole-model conversions users load with no edits: GGUF -> a Hugging Face folder, and Hugging Face -> GGUF.

GGUF -> HF (`export_hf_folder`, and `lazyweights convert lazyweights.adapters:convert_gguf_state_dict x.gguf -o dir/`)
writes `model.safetensors` (the lazy `gguf_to_hf` adapter, streamed), `config.json` (`hf_config_from_gguf`),
`generation_config.json`, `tokenizer.json` and `tokenizer_config.json` (`lazyweights.formats.tokenizer_to_hf`), into a
temporary folder beside `dir` that replaces it only when every file is complete.

HF -> GGUF (`export_gguf`, and `lazyweights convert lazyweights.adapters:convert_hf_to_gguf dir/ -o x.gguf`)
builds every GGUF key from `config.json` and the tokenizer files alone (`gguf_metadata_from_hf`):
`general.*` with a `general.file_type` computed from the tensors written, `{arch}.*` hyperparameters and
`tokenizer.*`.

Config keys, both ways (`{a}` = the GGUF architecture; HF names as transformers' configs spell them), for every
family from its record (`adapters/archs.py`, turned into keys by `convert/hparams.py`); the common ones:

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
    rope_freqs.weight (tensor)          rope_parameters {"rope_type": "llama3", ...} (llama, `llama3_rope_params`)
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
            rope_freqs.weight (tensor)  rope_parameters.full_attention "proportional" (`gemma4_rope_freqs`)
            {a}.attention.shared_kv_layers / embedding_length_per_layer_input   num_kv_shared_layers /
                                        hidden_size_per_layer_input; feed_forward_length per layer where
                                        use_double_wide_mlp; expert_* from num_experts / top_k_experts /
                                        moe_intermediate_size (enable_moe_block)
    tokenizer.ggml.bos/eos/padding_token_id  bos/eos/pad_token_id
    tie_word_embeddings                 true when the GGUF has no output.weight

A GGUF lacking a required key raises `GGUFConfigError` listing every missing key; an architecture outside
`SUPPORTED` raises `UnsupportedArchitectureError` naming the nearest supported ones; a tensor whose shape
is not what config.json makes it raises `ShapeError` naming it and both shapes, before anything is written.

Example:
    >>> from lazyweights.convert.hf_export import hf_config_from_gguf
    >>> md = {"general.architecture": "qwen2", "qwen2.context_length": 32768, "qwen2.embedding_length": 64,
    ...       "qwen2.block_count": 2, "qwen2.attention.head_count": 4, "qwen2.feed_forward_length": 128}
    >>> cfg = hf_config_from_gguf(md, tensor_names=["token_embd.weight"], vocab_size=100)
    >>> cfg["architectures"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["tie_word_embeddings"]
    (['Qwen2ForCausalLM'], 4, 16, True)
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Mapping

from ..adapters.archs import ARCHS, GGUF_ARCHS, arch_for_gguf, unknown_architecture
from ..core.config_access import config_get, text_config
from ..core.dtype import DType
from ..core.errors import (
    ConfigError,
    FormatError,
    GGUFConfigError,
    LazyWeightsError,
    UnsupportedArchitectureError,
    UsageError,
)
from ..formats.arch_identity import identity_for_config, identity_for_model_type
from ..formats.gguf_keys import arch_key
from ..formats.json_files import json_beside, read_json
from ..formats.rope_scaling import rope_scaling_of
from ..lazy.weight_data import WeightData
from .hparams import REQUIRED_KEYS, gguf_hparams, hf_config
from .shape_checks import check_shapes
from .tensors import gguf_to_hf

# Hugging Face model_type -> (GGUF architecture, HF architecture class), from the identity rows (formats.arch_identity)
SUPPORTED: dict[str, tuple[str, str]] = {mt: (a.gguf, a.hf_class) for mt, a in ARCHS.items()}






def _unsupported(what: str, value) -> UnsupportedArchitectureError:
    return unknown_architecture(what, value, GGUF_ARCHS if what.startswith("GGUF") else sorted(SUPPORTED))


# --- GGUF -> Hugging Face config ----------------------------------------------------------------------------------
def _canonical(model_type: Any) -> Any:
    """A config's `model_type` under the name its record has (an alias resolved); anything else unchanged."""
    row = identity_for_model_type(model_type)
    return model_type if row is None else row.model_type


def model_type_for(arch: str, md: Mapping[str, Any]) -> str:
    """The Hugging Face model_type a GGUF architecture converts back to (llama with experts: mixtral; a VL
    model's text part: its text model alone)."""
    return arch_for_gguf(arch, md).identity.read_back().model_type


def hf_config_from_gguf(metadata: Mapping[str, Any], tensor_names: Iterable[str] | None = None,
                        vocab_size: int | None = None, rope_freqs=None, rope_factors=None) -> dict:
    """The `config.json` dict for a GGUF file's metadata (see the module docstring's table).

    `tensor_names` (the GGUF tensor names) decides `tie_word_embeddings`; `vocab_size` is used when the
    metadata has neither `{arch}.vocab_size` nor a token list (e.g. the embedding's row count);
    `rope_freqs` (the values of a `rope_freqs.weight` tensor) gives a llama3 `rope_parameters`;
    `rope_factors` ({"long": values, "short": values} of `rope_factors_{long,short}.weight`) Phi-3's LongRoPE.
    GGUFConfigError lists every missing required key. Example: see the module docstring.
    """
    from gguf.constants import Keys

    md = metadata
    arch = md.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str):
        raise GGUFConfigError(f"GGUF metadata has no {Keys.General.ARCHITECTURE}", [Keys.General.ARCHITECTURE])
    model_type = model_type_for(arch, md)
    missing = [arch_key(arch, k) for k in REQUIRED_KEYS if arch_key(arch, k) not in md]
    moe = int(md.get(Keys.LLM.EXPERT_COUNT.format(arch=arch), 0) or 0) > 0
    ff = Keys.LLM.FEED_FORWARD_LENGTH.format(arch=arch)
    expert_ff = Keys.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch)
    if ff not in md and not (moe and expert_ff in md):
        missing.append(ff)
    vocab = md.get(Keys.LLM.VOCAB_SIZE.format(arch=arch))
    if vocab is None and Keys.Tokenizer.LIST in md:
        vocab = len(md[Keys.Tokenizer.LIST])
    if vocab is None:
        vocab = vocab_size
    if vocab is None:
        missing.append(f"{Keys.LLM.VOCAB_SIZE.format(arch=arch)} (or {Keys.Tokenizer.LIST})")
    if missing:
        raise GGUFConfigError(f"GGUF metadata ({arch}) lacks what a Hugging Face config needs: "
                              f"{', '.join(missing)}", missing)
    n_vocab = int(vocab or 0)  # not None: checked above

    names = set(tensor_names) if tensor_names is not None else None
    rec = ARCHS[model_type]
    out = hf_config(rec, md, names, n_vocab, arch)
    rope = out.get("rope_parameters", {})
    if rec.rope_freqs and rope_freqs is not None and rope.get("rope_type") == "default":
        scaling = llama3_rope_params(rope_freqs, rope["rope_theta"], out["head_dim"])
        if scaling is not None:
            rope.update(scaling)
    if rec.hooks.rope_from_tensors and rope_factors:  # Phi-3's LongRoPE factor tensors
        rope.update(rec.hooks.rope_from_tensors(md, arch, rope_factors))
    if rec.gemma4 and rope_freqs is not None:
        full = out["rope_parameters"]["full_attention"]
        full["partial_rotary_factor"] = gemma4_partial_rotary(rope_freqs, out["per_layer_config"])
    for attr, key in (("bos_token_id", Keys.Tokenizer.BOS_ID), ("eos_token_id", Keys.Tokenizer.EOS_ID),
                      ("pad_token_id", Keys.Tokenizer.PAD_ID)):
        if key in md:
            out[attr] = int(md[key])
    if Keys.General.NAME in md:
        out["_name_or_path"] = str(md[Keys.General.NAME])
    return out


def llama3_rope_factors(theta: float, head_dim: int, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max_position_embeddings: float):
    """The per-frequency RoPE factors of Llama 3.1's "llama3" scaling, as llama.cpp's converter computes them
    into `rope_freqs.weight` (float32 frequencies, float64 arithmetic, stored as float32)."""
    import numpy as np

    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    low_wl = original_max_position_embeddings / low_freq_factor
    high_wl = original_max_position_embeddings / high_freq_factor
    out = []
    for f in freqs.astype(np.float64):
        wl = 2 * np.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (original_max_position_embeddings / wl - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


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

    from .hparams import gemma4_full

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


def llama3_rope_params(rope_freqs, theta: float, head_dim: int) -> dict | None:
    """The Hugging Face `rope_scaling` ({"rope_type": "llama3", factor, low/high_freq_factor,
    original_max_position_embeddings}) whose factors equal `rope_freqs` (a GGUF's `rope_freqs.weight`).

    The factors depend on the two wavelength thresholds original/low and original/high only, so Llama 3.1's
    own values (8192, 1, 4) are tried first; otherwise low_freq_factor = 1 and the thresholds are fitted to
    the smoothly scaled frequencies. GGUFConfigError if no llama3 scaling reproduces the tensor.

    >>> f = llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    >>> llama3_rope_params(f, 500000.0, 128)["original_max_position_embeddings"]
    8192
    """
    import numpy as np

    r = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
    if r.size != head_dim // 2:
        raise GGUFConfigError(f"rope_freqs.weight has {r.size} values; head_dim {head_dim} needs {head_dim // 2}")
    factor = float(np.float32(r.max()))
    if np.allclose(r, 1.0):
        return None

    def fits(p):
        try:
            got = llama3_rope_factors(theta, head_dim, p["factor"], p["low_freq_factor"], p["high_freq_factor"],
                                      p["original_max_position_embeddings"])
        except (ZeroDivisionError, FloatingPointError):
            return False
        return bool(np.allclose(got, r, rtol=1e-5, atol=0))

    cand = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    if fits(cand):
        return cand
    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    wl = 2 * np.pi / freqs.astype(np.float64)
    ones, full = np.isclose(r, 1.0, rtol=1e-5), np.isclose(r, factor, rtol=1e-5)
    smooth = ~ones & ~full
    s = (1 / r[smooth] - 1 / factor) / (1 - 1 / factor)  # = low_wl / (wl (low_wl / high_wl - 1)) - 1 / (...)
    lo_bound = wl[ones].max() if ones.any() else 0.0
    hi_bound = wl[full].min() if full.any() else np.inf
    if smooth.sum() >= 2:  # s = A / wl - B, A = orig / (high - low), B = low / (high - low)
        A, negB = np.linalg.lstsq(np.stack([1 / wl[smooth], np.ones(int(smooth.sum()))], 1), s, rcond=None)[0]
        B = -negB
        low_wl, high_wl = A / B, A / (1 + B)
    elif smooth.sum() == 1:
        w, sv = wl[smooth][0], s[0]
        high_wl = np.sqrt(max(lo_bound, w / 2) * w)
        low_wl = (1 - sv) / (1 / w - sv / high_wl)
    else:
        high_wl = np.sqrt(lo_bound * hi_bound) if np.isfinite(hi_bound) and lo_bound else (lo_bound * 2 or hi_bound / 2)
        low_wl = high_wl * (1 + 1e-9)
    orig = float(low_wl)
    if abs(orig - round(orig)) < 1e-3 * max(1.0, orig):
        orig = int(round(orig))
    cand = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": float(low_wl / high_wl),
            "original_max_position_embeddings": orig}
    if fits(cand):
        nice = dict(cand, high_freq_factor=float(f"{cand['high_freq_factor']:.4g}"))
        return nice if fits(nice) else cand
    raise GGUFConfigError("rope_freqs.weight holds RoPE factors no llama3 rope_scaling reproduces "
                          f"(first values {r[:4].tolist()})", ["rope_freqs.weight"])


def generation_config_from_gguf(metadata: Mapping[str, Any]) -> dict:
    """`generation_config.json`: the special ids llama.cpp stops and pads with (eos plus eot/eom when distinct)."""
    from gguf.constants import Keys

    out: dict[str, Any] = {"_from_model_config": True}
    for attr, key in (("bos_token_id", Keys.Tokenizer.BOS_ID), ("pad_token_id", Keys.Tokenizer.PAD_ID)):
        if key in metadata:
            out[attr] = int(metadata[key])
    eos = [int(metadata[k]) for k in (Keys.Tokenizer.EOS_ID, Keys.Tokenizer.EOT_ID, Keys.Tokenizer.EOM_ID)
           if k in metadata]
    eos = list(dict.fromkeys(eos))
    if eos:
        out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return out


# --- Hugging Face config -> GGUF metadata -------------------------------------------------------------------------
def _text_part(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config the text model converts from: under its identity row's model_type where the row is told apart
    by more than the model_type (`ArchIdentity.config_when`: jina-embeddings-v3, Nemotron-H MoE, LFM2's
    embedding models), a multimodal config's `text_config` (its model_type defaulting to the outer one's row),
    else `doc` itself."""
    row = identity_for_config(doc)
    if row is not None and row.config_when and row.picks_config(doc):
        return dict(doc, model_type=row.model_type)
    inner = text_config(doc)
    if inner is not doc and isinstance(inner, Mapping):
        merged = dict(inner)
        merged.setdefault("model_type", _canonical(doc.get("model_type")))
        vision = doc.get("vision_config")
        if isinstance(vision, Mapping) and isinstance(vision.get("deepstack_visual_indexes"), list):
            # Qwen3-VL: the text model takes this many vision layers' features (llama.cpp's n_deepstack_layers)
            merged.setdefault("num_deepstack_layers", len(vision["deepstack_visual_indexes"]))
        return merged
    return doc


def _rope_theta(cfg: Mapping[str, Any], which: str = "full_attention") -> float | None:
    if cfg.get("rope_theta") is not None:
        return float(cfg["rope_theta"])
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping):
        if which in params and isinstance(params[which], Mapping):
            params = params[which]
        if params.get("rope_theta") is not None:
            return float(params["rope_theta"])
    return None


def gguf_metadata_from_hf(config: Mapping[str, Any], *, name: str | None = None, file_type: int | None = None,
                          quantized: bool = False) -> dict:
    """GGUF `general.*` and `{arch}.*` key/values (`GGUFValue`s typed as gguf-py's GGUFWriter writes them)
    for a Hugging Face config.json dict. UnsupportedArchitectureError for other model types.

    Example:
        >>> md = gguf_metadata_from_hf({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        ...     "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 256,
        ...     "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 100})
        >>> [md[k].value for k in ("general.architecture", "llama.rope.dimension_count",
        ...                        "llama.attention.head_count_kv")]
        ['llama', 16, 4]
    """
    from gguf.constants import GGML_QUANT_VERSION, Keys
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    cfg = _text_part(dict(config))
    mt = _canonical(cfg.get("model_type"))
    if mt not in SUPPORTED:
        raise _unsupported("Hugging Face model_type", mt)
    arch = SUPPORTED[mt][0]
    md: dict[str, GGUFValue] = {Keys.General.ARCHITECTURE: GGUFValue(arch, T.STRING),
                                Keys.General.TYPE: GGUFValue("model", T.STRING)}
    nm = name or cfg.get("_name_or_path") or config.get("_name_or_path")
    if nm:
        md[Keys.General.NAME] = GGUFValue(str(nm), T.STRING)
    if quantized:
        md[Keys.General.QUANTIZATION_VERSION] = GGUFValue(GGML_QUANT_VERSION, T.UINT32)
    if file_type is not None:
        md[Keys.General.FILE_TYPE] = GGUFValue(int(file_type), T.UINT32)
    md.update(gguf_hparams(ARCHS[mt], cfg))
    return md


def file_type_of(state: Mapping[str, Any]) -> tuple[int, bool]:
    """(`general.file_type`, any tensor quantized) for the tensors a GGUF will hold: the type of the most
    bytes among tensors of 2+ dimensions (1-D norms are float32 whatever the file type, as in llama.cpp);
    `lazyweights.formats.gguf_writer.gguf_file_type`, which `Plan.save` applies to a converter's metadata.

    >>> import numpy as np; from lazyweights import WeightData, DType
    >>> w = WeightData.from_numpy(np.zeros((4, 4), np.float32), "w").astype(DType.bfloat16)
    >>> file_type_of({"w": w})
    (32, False)
    """
    from ..formats.gguf_writer import gguf_file_type

    return gguf_file_type(state)


# --- adapters ---------------------------------------------------------------------------------------------------
class ConvertedStateDict(dict):
    """An adapted state dict that carries what a complete output needs besides tensors: `gguf_metadata`
    (HF -> GGUF) or `extra_files()` (GGUF -> HF: name -> bytes, built only when saving). `lazyweights.plan`
    keeps both (`Plan.metadata`, `Plan.extra_files`), so `lazyweights.plan(result).save(path)` writes the
    complete file or folder. `file_type_from_tensors`: whether a save recomputes `general.file_type` from
    the tensors saved (`file_type_of`, llama.cpp's rule for a model; False where the converter's rule is
    another, as an mmproj's source float type)."""

    gguf_metadata: dict | None = None
    extra_files: Callable[[], dict[str, bytes]] | None = None
    file_type_from_tensors: bool = True


def pad_token_list(md: dict, vocab_size: int, multiple: int) -> None:
    """Pad the GGUF token list (in place) with unused `[PAD{i}]` tokens up to `vocab_size` rounded up to a
    multiple of `multiple`, as llama.cpp's Mamba converter does (its embedding has that many rows).

    Example:
        >>> from gguf.constants import GGUFValueType as T
        >>> from lazyweights.formats.gguf_writer import GGUFValue
        >>> md = {"tokenizer.ggml.tokens": GGUFValue(["a", "b", "c"], T.ARRAY, T.STRING),
        ...       "tokenizer.ggml.token_type": GGUFValue([1, 1, 1], T.ARRAY, T.INT32)}
        >>> pad_token_list(md, 3, 4)
        >>> md["tokenizer.ggml.tokens"].value, md["tokenizer.ggml.token_type"].value
        (['a', 'b', 'c', '[PAD3]'], [1, 1, 1, 5])
    """
    from gguf.constants import Keys, TokenType

    from ..formats.gguf_writer import GGUFValue

    tokens = md.get(Keys.Tokenizer.LIST)
    if tokens is None or multiple <= 0:
        return
    n = len(tokens.value)
    target = -(max(vocab_size, n) // -multiple) * multiple
    if target == n:
        return
    extra = range(n, target)
    md[Keys.Tokenizer.LIST] = GGUFValue(list(tokens.value) + [f"[PAD{i}]" for i in extra], *tokens[1:])
    for key, fill in ((Keys.Tokenizer.TOKEN_TYPE, int(TokenType.UNUSED)), (Keys.Tokenizer.SCORES, 0.0)):
        v = md.get(key)
        if v is not None:
            md[key] = GGUFValue(list(v.value) + [fill] * len(extra), *v[1:])


def convert_hf_to_gguf(state_dict: Mapping[str, Any], huggingface_config=None, *, tokenizer: bool = True,
                       folder: str | None = None, **unused_kwargs) -> ConvertedStateDict:
    """The MAX-style HF -> GGUF adapter: GGUF tensor names and llama.cpp's value conventions (`hf_to_gguf`),
    plus the complete GGUF metadata from config.json and the tokenizer files (`gguf_metadata`).

    `folder` (where config.json and tokenizer.json live) defaults to the checkpoint's folder; `tokenizer=False`
    writes no `tokenizer.*` keys (llama.cpp cannot run such a file, other readers can).

    Example (the command line):
        lazyweights convert lazyweights.adapters:convert_hf_to_gguf model-hf/ -o model.gguf
    """
    from ..formats.tokenizer_to_gguf import gguf_tokenizer_metadata
    from .tensors import hf_to_gguf

    if folder is None:
        folder = _source_folder(state_dict)
    cfg = _config_dict(huggingface_config, folder)
    cfg_text = _text_part(cfg)
    mt = _canonical(cfg_text.get("model_type"))
    if mt not in SUPPORTED:
        raise _unsupported("Hugging Face model_type", mt)
    arch = SUPPORTED[mt][0]
    state = {k.removeprefix("language_model."): v for k, v in state_dict.items()
             if not k.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                  "model.multi_modal_projector.", "visual.", "model.visual.",
                                  "model.embed_vision.", "model.embed_audio.", "model.audio_tower.", "audio_tower.",
                                  "vision_model.", "model.vision_model."))}  # Llama 4's tower
    state = {("model." + k.removeprefix("model.language_model.") if k.startswith("model.language_model.") else k): v
             for k, v in state.items()}
    # Idefics3 / SmolVLM: the text model under `model.text_model.`, beside `model.vision_model.` and `model.connector.`
    state = {("model." + k.removeprefix("model.text_model.") if k.startswith("model.text_model.") else k): v
             for k, v in state.items() if not k.startswith(("model.vision_model.", "model.connector."))}
    adapted = hf_to_gguf(state, _AttrDict(cfg_text), arch=arch)
    rs = rope_scaling_of(cfg_text)
    if ARCHS[mt].rope_freqs and rs is not None and (rs.get("rope_type") or rs.get("type")) == "llama3":
        # llama.cpp reads Llama 3.1's scaling only from this tensor, as its converter writes it
        heads = int(cfg_text["num_attention_heads"])
        head_dim = int(config_get(cfg_text, "head_dim", int(cfg_text["hidden_size"]) // heads))
        theta = _rope_theta(cfg_text) or 10000.0
        factors = llama3_rope_factors(theta, head_dim, float(rs.get("factor", 8.0)),
                                      float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0)),
                                      float(rs.get("original_max_position_embeddings", 8192)))
        adapted["rope_freqs.weight"] = WeightData.from_numpy(factors, "rope_freqs.weight")
    made = ARCHS[mt].hooks.gguf_tensors  # tensors the family's llama.cpp graph reads, made from config.json
    if made is not None:
        adapted.update(made(cfg_text))
    if ARCHS[mt].gemma4:
        adapted["rope_freqs.weight"] = WeightData.from_numpy(gemma4_rope_freqs(cfg_text), "rope_freqs.weight")
    # tied as transformers ties: a multimodal class reads its own (outer) config's value before its text_config's
    # (Qwen3-VL MoE: text_config true, the outer config false, lm_head.weight saved and used)
    if cfg.get("tie_word_embeddings", cfg_text.get("tie_word_embeddings", ARCHS[mt].tied)):
        adapted.pop("output.weight", None)  # tied: llama.cpp reuses token_embd
    ftype, quantized = file_type_of(adapted)
    try:
        md = gguf_metadata_from_hf(cfg, file_type=ftype, quantized=quantized)
    except GGUFConfigError as e:  # one error naming everything to add, not one try per missing thing
        raise _what_to_add(e, folder, huggingface_config is None, tokenizer) from None
    from ..adapters.names import hf_to_gguf_name

    sources = {g: n for n in state if (g := hf_to_gguf_name(n, arch)) is not None}
    check_shapes(adapted, md, arch, sources, mt)
    if ARCHS[mt].layer_scalars:  # per-layer scalars llama.cpp keeps as metadata (Apertus's xIELU)
        from .tensors import scalars_to_metadata

        md.update(scalars_to_metadata(ARCHS[mt], state, arch))
    if ARCHS[mt].embedding:
        md.update(_embedding_metadata(arch, cfg_text, folder))
    if tokenizer:
        if folder is None:
            raise UsageError("convert_hf_to_gguf: cannot tell the checkpoint folder to read tokenizer.json "
                                   "from; pass folder=... (or tokenizer=False)")
        md.update(gguf_tokenizer_metadata(folder, arch))
        if ARCHS[mt].pad_vocab:
            pad_token_list(md, int(cfg_text.get("vocab_size") or 0), int(
                cfg_text.get("pad_vocab_size_multiple") or ARCHS[mt].pad_vocab))
    out = ConvertedStateDict(adapted)
    out.gguf_metadata = md
    return out


def _what_to_add(e: GGUFConfigError, folder: str | None, from_folder: bool, tokenizer: bool) -> GGUFConfigError:
    """`e` (config.json lacks keys) with the exact fix: each key to add to which config.json and, when the folder
    has no tokenizer.json either, that too, so a checkpoint missing both is fixed in one try.

    >>> e = GGUFConfigError("config.json lacks context_length (max_position_embeddings or n_ctx)",
    ...                     ["context_length (max_position_embeddings or n_ctx)"])
    >>> print(_what_to_add(e, None, False, False).args[0].split(": ", 1)[1])
    add "max_position_embeddings": N (the model's values) to the config
    """
    import re

    names = [m.group(1) for k in e.missing if (m := re.search(r"\((\w+)", k))]
    beside = os.path.join(folder, "config.json") if folder else None
    where = beside if beside and (from_folder or os.path.isfile(beside)) else "the config"
    text = str(e)
    if names:
        text += f": add {', '.join(json.dumps(n) + ': N' for n in names)} (the model's values) to {where}"
    if tokenizer and folder and not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        text += (f"; {folder} has no tokenizer.json either: add the model's tokenizer.json, or pass tokenizer=False "
                 "(--no-tokenizer) to write a GGUF without one")
    return GGUFConfigError(text, e.missing)


# sentence-transformers' pooling modes (the Pooling module's flags, or its one `pooling_mode` name) -> the names of
# gguf-py's PoolingType members (llama.cpp's LLAMA_POOLING_TYPE_*)
_POOLING = {"pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS", "pooling_mode_lasttoken": "LAST"}
_POOLING_NAMES = {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}


def _embedding_metadata(arch: str, cfg: Mapping[str, Any], folder: str | None) -> dict:
    """An encoder's extra GGUF keys: `{arch}.pooling_type` from the sentence-transformers folder's Pooling
    module (modules.json -> its config.json), as llama.cpp's converter reads it, and the token type count."""
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys, PoolingType

    from ..formats.gguf_writer import GGUFValue

    md: dict[str, Any] = {Keys.Tokenizer.TOKEN_TYPE_COUNT: GGUFValue(int(cfg.get("type_vocab_size", 1)), T.UINT32)}
    mods = read_json(os.path.join(folder, "modules.json"), expect=list) if folder else None
    for mod in mods or ():
        if str(mod.get("type", "")).endswith("Pooling"):
            pooling_file = os.path.join(folder or "", mod["path"], "config.json")
            pooling = read_json(pooling_file)
            if pooling is None:
                raise ConfigError(f"{folder}: modules.json names a Pooling module whose {pooling_file} is missing")
            kind = next((v for k, v in _POOLING.items() if pooling.get(k)),
                        _POOLING_NAMES.get(pooling.get("pooling_mode", "")))
            if kind is None:
                raise ConfigError(f"{folder}: pooling config {pooling} names no mode llama.cpp has "
                                  f"(mean, cls, lasttoken)")
            md[Keys.LLM.POOLING_TYPE.format(arch=arch)] = GGUFValue(int(PoolingType[kind]), T.UINT32)
    return md


def expected_keys_for(config, state: Mapping[str, Any]):
    """The state-dict keys of the Hugging Face model a GGUF's metadata describes (its model_type from
    `hf_config_from_gguf`, its keys from the record's name table: `names.expected_hf_keys`, no transformers),
    which pick gguf-py's candidate names; None when that cannot be known."""
    from ..adapters.names import expected_hf_keys, layer_count

    md = getattr(config, "metadata", None)
    if not isinstance(md, Mapping):
        return None
    try:
        cfg = hf_config_from_gguf(md, tensor_names=list(state))
    except LazyWeightsError:  # metadata no Hugging Face config is read from: None, and gguf-py's first names stand
        return None
    return expected_hf_keys(cfg, layer_count(state), gguf_names=list(state))


class _AttrDict(dict):
    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None


def _source_folder(state_dict: Mapping[str, Any]) -> str | None:
    """The folder most tensors read from first (a loaded checkpoint's own folder: with a merged LoRA adapter
    (`adapters.lora.merge_lora`) some tensors come from the adapter's folder, the majority from the base's)."""
    from collections import Counter

    from ..lazy.weight_data import as_weight_data

    folders: Counter[str] = Counter()
    for name, value in state_dict.items():
        try:
            node = as_weight_data(value, name).node
        except LazyWeightsError:  # a value that is not a tensor casts no vote for a folder
            continue
        stack = [node]
        while stack:
            n = stack.pop()
            src = getattr(n, "arg", None)
            path = getattr(getattr(src, "file", None), "path", None) or getattr(src, "path", None)
            if isinstance(path, str):
                folders[os.path.dirname(os.path.abspath(path))] += 1
                break
            stack.extend(reversed(n.srcs))  # the first input first: a LoRA node's base weight
    return folders.most_common(1)[0][0] if folders else None


def _config_dict(huggingface_config, folder: str | None) -> dict:
    if huggingface_config is None:
        doc = json_beside(folder, "config.json") if folder else None
        if doc is not None:
            return doc
        raise ConfigError("convert_hf_to_gguf needs the checkpoint's config.json (none beside it; "
                               "pass --hf-config FILE)")
    if isinstance(huggingface_config, Mapping):
        return dict(huggingface_config)
    if hasattr(huggingface_config, "to_dict"):
        return huggingface_config.to_dict()
    return dict(vars(huggingface_config))


def gguf_extra_files(metadata: Mapping[str, Any], tensor_names: Iterable[str], *, tokenizer: bool = True,
                     vocab_size: int | None = None, rope_freqs=None, rope_factors=None,
                     quantization_config: Mapping[str, Any] | None = None) -> dict[str, bytes]:
    """The files a Hugging Face folder needs besides the weights, from GGUF metadata: config.json (with
    `quantization_config` when given: gpt-oss's experts written back as MXFP4 blocks), generation_config.json
    and (unless tokenizer=False) tokenizer.json + tokenizer_config.json."""
    from ..formats.tokenizer_to_hf import tokenizer_from_gguf, write_tokenizer_files

    cfg = hf_config_from_gguf(metadata, tensor_names, vocab_size=vocab_size,
                              rope_freqs=rope_freqs() if callable(rope_freqs) else rope_freqs,
                              rope_factors=rope_factors() if callable(rope_factors) else rope_factors)
    if quantization_config is not None:
        cfg["quantization_config"] = dict(quantization_config)
    files = {
        "config.json": (json.dumps(cfg, indent=2) + "\n").encode(),
        "generation_config.json": (json.dumps(generation_config_from_gguf(metadata), indent=2) + "\n").encode(),
    }
    if tokenizer:
        tok, tcfg = tokenizer_from_gguf(metadata)
        tcfg.setdefault("model_max_length", cfg.get("max_position_embeddings", cfg.get("n_positions")))
        files.update(write_tokenizer_files(tok, tcfg))
    return files


def with_hf_files(adapted: Mapping[str, Any], gguf_config, tensor_names: Iterable[str], *,
                  tokenizer: bool = True) -> ConvertedStateDict:
    """`adapted` (a GGUF -> HF state dict) with `extra_files()` that build config/tokenizer files on save."""
    metadata = getattr(gguf_config, "metadata", None)
    out = ConvertedStateDict(adapted)
    if metadata is None:
        return out
    names = list(tensor_names)
    emb = adapted.get("model.embed_tokens.weight")
    vocab = emb.shape[0] if emb is not None and getattr(emb, "shape", None) else None
    freqs = factors = None
    if isinstance(tensor_names, Mapping):  # the RoPE factor tensors, read on save
        from ..lazy.weight_data import as_weight_data

        def read(name):
            return as_weight_data(tensor_names[name], name).to_numpy()

        if "rope_freqs.weight" in names:
            freqs = lambda: read("rope_freqs.weight")  # noqa: E731
        if {"rope_factors_long.weight", "rope_factors_short.weight"} & set(names):
            factors = lambda: {w: read(f"rope_factors_{w}.weight") if f"rope_factors_{w}.weight" in names  # noqa: E731
                               else None for w in ("long", "short")}
    from .tensors import MXFP4_QUANTIZATION_CONFIG

    # gpt-oss experts kept as MXFP4 `*_blocks` / `*_scales` (gguf_names._oai_experts_to_hf) need the config to say so
    qcfg = MXFP4_QUANTIZATION_CONFIG if any(k.endswith("_proj_blocks") for k in adapted) else None
    out.extra_files = lambda: gguf_extra_files(metadata, names, tokenizer=tokenizer, vocab_size=vocab,
                                               rope_freqs=freqs, rope_factors=factors, quantization_config=qcfg)
    return out


# --- saving ---------------------------------------------------------------------------------------------------------
def save_converted(adapted, path, *, format: str | None = None, **save_kwargs) -> list[str]:
    """Save an adapter's output completely: `lazyweights.plan(adapted).save(path, ...)` (see `Plan.save`),
    kept for callers of the name. A GGUF gets the result's `gguf_metadata` (its `general.file_type` recomputed
    from the tensors saved); a folder gets the `extra_files()` (config.json, tokenizer files) beside the
    weights, the whole folder staged under a temporary name beside `path` and swapped in only when every file
    is complete, so a failure leaves the old folder (or none), never a half-written one. Returns the files
    written.

    Example:
        >>> import numpy as np, os, tempfile
        >>> from lazyweights import WeightData
        >>> sd = ConvertedStateDict(w=WeightData.from_numpy(np.ones((2, 2), np.float32), "w"))
        >>> sd.extra_files = lambda: {"config.json": b"{}"}
        >>> files = save_converted(sd, os.path.join(tempfile.mkdtemp(), "out"))
        >>> [os.path.basename(f) for f in files]
        ['model.safetensors', 'config.json']
    """
    from ..lazy.plan import plan

    return plan(adapted).save(path, format=format, **save_kwargs)


# --- the API ---------------------------------------------------------------------------------------------------
def export_hf_folder(gguf_path, out_dir, *, dtype="bfloat16", tokenizer: bool = True, **save_kwargs) -> list[str]:
    """Convert a GGUF file into a complete Hugging Face folder (weights dequantized to `dtype`, config,
    generation config, tokenizer) that `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(out_dir)`
    load with no edits. Atomic (see `save_converted`); returns the files written.

    Example:
        >>> from lazyweights.adapters import export_hf_folder           # doctest: +SKIP
        >>> export_hf_folder("gemma-3-270m-q4_k_m.gguf", "gemma-hf/")   # doctest: +SKIP
    """
    from ..lazy.weights import load_weights
    from .tensors import gguf_to_hf

    w = load_weights([os.fspath(gguf_path)] if isinstance(gguf_path, (str, os.PathLike)) else gguf_path)
    if getattr(w.format, "value", w.format) != "gguf":
        raise FormatError(f"{gguf_path}: export_hf_folder reads GGUF files, this is {w.format.value}")
    state = dict(w.items())
    adapted = gguf_to_hf(state, w.config, dequantize_to=dtype, expected_keys=expected_keys_for(w.config, state))
    out = with_hf_files(adapted, w.config, state, tokenizer=tokenizer)
    return save_converted(out, out_dir, **save_kwargs)


def export_gguf(hf_dir, out_path, *, tokenizer: bool = True, **save_kwargs) -> list[str]:
    """Convert a Hugging Face folder (safetensors + config.json + tokenizer.json) into one GGUF file with
    complete metadata (`convert_hf_to_gguf`). Atomic; returns the files written.

    Example:
        >>> from lazyweights.adapters import export_gguf                # doctest: +SKIP
        >>> export_gguf("gemma-hf/", "gemma.gguf")                      # doctest: +SKIP
    """
    from ..lazy.weights import load_weights

    hf_dir = os.fspath(hf_dir)
    w = load_weights([hf_dir])
    folder = hf_dir if os.path.isdir(hf_dir) else os.path.dirname(os.path.abspath(hf_dir))
    adapted = convert_hf_to_gguf(dict(w.items()), None, tokenizer=tokenizer, folder=folder)
    return save_converted(adapted, out_path, format="gguf", **save_kwargs)


def convert_gguf_state_dict(state_dict: Mapping[str, Any], huggingface_config=None,
                            dequantize_to: DType | None = DType.bfloat16, **unused_kwargs) -> dict[str, WeightData]:
    """The MAX-style GGUF adapter (`WeightsFormat.gguf`): GGUF names to Hugging Face names, dequantized
    to bfloat16 (pass `dequantize_to=None` to keep quantized blocks). `huggingface_config` is the GGUF
    file's own config (`weights.config`) when none is given by the caller, as `lazyweights convert` does.
    Saved to a folder (`lazyweights.convert.hf_export.save_converted`, as `convert` does), the result is a complete
    Hugging Face folder: config.json, generation_config.json and (unless `tokenizer=False`) the tokenizer.

    Example (the command line, on a GGUF file):
        lazyweights convert lazyweights.adapters:convert_gguf_state_dict model.gguf -o model-hf/
    """
    if huggingface_config is None:
        raise ConfigError("convert_gguf_state_dict needs huggingface_config (e.g. weights.config of the GGUF)")
    adapted = gguf_to_hf(state_dict, huggingface_config, dequantize_to=dequantize_to,
                         expected_keys=expected_keys_for(huggingface_config, state_dict))
    return with_hf_files(adapted, huggingface_config, state_dict, tokenizer=unused_kwargs.get("tokenizer", True))
