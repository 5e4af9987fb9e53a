"""GGUF -> a Hugging Face folder, a whole model: `convert_gguf_state_dict` (the MAX-style adapter) and
`export_hf_folder`.

`lazyweights convert lazyweights.adapters:convert_gguf_state_dict x.gguf -o dir/` (or an architecture name)
writes `model.safetensors` (the lazy `tensors.gguf_to_hf` adapter, streamed), `config.json`
(`hf_config_from_gguf`: the key table in `convert/hparams.py`'s docstring), `generation_config.json`,
`tokenizer.json` and `tokenizer_config.json` (`lazyweights.formats.tokenizer_to_hf`), into a temporary folder
beside `dir` that replaces it only when every file is complete (`result.save_converted`).

A GGUF lacking a required key raises `GGUFConfigError` listing every missing key; an architecture no record
has raises `UnsupportedArchitectureError` naming the nearest ones.

Example:
    >>> md = {"general.architecture": "qwen2", "qwen2.context_length": 32768, "qwen2.embedding_length": 64,
    ...       "qwen2.block_count": 2, "qwen2.attention.head_count": 4, "qwen2.feed_forward_length": 128}
    >>> cfg = hf_config_from_gguf(md, tensor_names=["token_embd.weight"], vocab_size=100)
    >>> cfg["architectures"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["tie_word_embeddings"]
    (['Qwen2ForCausalLM'], 4, 16, True)
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

from ..adapters.archs import ARCHS, arch_for_gguf
from ..core.dtype import DType
from ..core.errors import ConfigError, FormatError, GGUFConfigError, LazyWeightsError
from ..formats.gguf_keys import arch_key
from ..lazy.weight_data import WeightData
from .hparams import REQUIRED_KEYS, hf_config
from .result import ConvertedStateDict, save_converted
from .rope import llama3_rope_params
from .tensors import gguf_to_hf


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
    if rec.hooks.rope_freqs_to_hf and rope_freqs is not None:  # the family's own reading (Gemma 4's partial RoPE)
        rec.hooks.rope_freqs_to_hf(out, rope_freqs)
    for attr, key in (("bos_token_id", Keys.Tokenizer.BOS_ID), ("eos_token_id", Keys.Tokenizer.EOS_ID),
                      ("pad_token_id", Keys.Tokenizer.PAD_ID)):
        if key in md:
            out[attr] = int(md[key])
    if Keys.General.NAME in md:
        out["_name_or_path"] = str(md[Keys.General.NAME])
    return out


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

    # gpt-oss experts kept as MXFP4 `*_blocks` / `*_scales` (tensors._oai_experts_to_hf) need the config to say so
    qcfg = MXFP4_QUANTIZATION_CONFIG if any(k.endswith("_proj_blocks") for k in adapted) else None
    out.extra_files = lambda: gguf_extra_files(metadata, names, tokenizer=tokenizer, vocab_size=vocab,
                                               rope_freqs=freqs, rope_factors=factors, quantization_config=qcfg)
    return out


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


def convert_gguf_state_dict(state_dict: Mapping[str, Any], huggingface_config=None,
                            dequantize_to: DType | None = DType.bfloat16, **unused_kwargs) -> dict[str, WeightData]:
    """The MAX-style GGUF adapter (`WeightsFormat.gguf`): GGUF names to Hugging Face names, dequantized
    to bfloat16 (pass `dequantize_to=None` to keep quantized blocks). `huggingface_config` is the GGUF
    file's own config (`weights.config`) when none is given by the caller, as `lazyweights convert` does.
    Saved to a folder (`lazyweights.convert.result.save_converted`, as `convert` does), the result is a complete
    Hugging Face folder: config.json, generation_config.json and (unless `tokenizer=False`) the tokenizer.

    Example (the command line, on a GGUF file):
        lazyweights convert lazyweights.adapters:convert_gguf_state_dict model.gguf -o model-hf/
    """
    if huggingface_config is None:
        raise ConfigError("convert_gguf_state_dict needs huggingface_config (e.g. weights.config of the GGUF)")
    adapted = gguf_to_hf(state_dict, huggingface_config, dequantize_to=dequantize_to,
                         expected_keys=expected_keys_for(huggingface_config, state_dict))
    return with_hf_files(adapted, huggingface_config, state_dict, tokenizer=unused_kwargs.get("tokenizer", True))
