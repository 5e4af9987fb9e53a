"""Hugging Face -> GGUF, a whole model: `convert_hf_to_gguf` (the MAX-style adapter) and `export_gguf`.

`lazyweights convert lazyweights.adapters:convert_hf_to_gguf dir/ -o x.gguf` (or an architecture name) builds
every GGUF key from `config.json` and the tokenizer files alone (`gguf_metadata_from_hf`): `general.*` with a
`general.file_type` computed from the tensors written (`file_type_of`), `{arch}.*` hyperparameters
(`hparams.gguf_hparams`, the key table in `convert/hparams.py`'s docstring), `tokenizer.*`
(`formats.tokenizer_to_gguf`), an encoder's pooling type from its sentence-transformers folder; the tensors
are `tensors.hf_to_gguf`'s, plus the RoPE factor tensors llama.cpp reads (`rope`, the records' hooks).

Bad input is a named error before anything is written: a model_type no record has (UnsupportedArchitectureError
naming the nearest), a config lacking keys (GGUFConfigError naming each key to add and where, and a missing
tokenizer.json in the same message), a tensor whose shape is not what config.json makes it (ShapeError,
`shape_checks`).

Example:
    >>> md = gguf_metadata_from_hf({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
    ...     "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 256})
    >>> md["general.architecture"].value, md["qwen2.attention.head_count_kv"].value
    ('qwen2', 4)
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from ..adapters.archs import ARCHS, GGUF_ARCHS, unknown_architecture
from ..core.config_access import config_get, text_config
from ..core.errors import ConfigError, GGUFConfigError, LazyWeightsError, UnsupportedArchitectureError, UsageError
from ..formats.arch_identity import identity_for_config, identity_for_model_type
from ..formats.json_files import json_beside, read_json
from ..formats.rope_scaling import rope_scaling_of
from ..lazy.weight_data import WeightData
from .hparams import gguf_hparams
from .result import ConvertedStateDict, save_converted
from .rope import llama3_rope_factors
from .shape_checks import check_shapes

# Hugging Face model_type -> (GGUF architecture, HF architecture class), from the identity rows (formats.arch_identity)
SUPPORTED: dict[str, tuple[str, str]] = {mt: (a.gguf, a.hf_class) for mt, a in ARCHS.items()}


def _unsupported(what: str, value) -> UnsupportedArchitectureError:
    return unknown_architecture(what, value, GGUF_ARCHS if what.startswith("GGUF") else sorted(SUPPORTED))


def _canonical(model_type: Any) -> Any:
    """A config's `model_type` under the name its record has (an alias resolved); anything else unchanged."""
    row = identity_for_model_type(model_type)
    return model_type if row is None else row.model_type


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
    if made is not None:  # (Phi-3's LongRoPE factors, Gemma 4's rope_freqs)
        adapted.update(made(cfg_text))
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
