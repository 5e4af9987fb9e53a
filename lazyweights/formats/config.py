"""Model configs readable like a Hugging Face config: from GGUF metadata, or a checkpoint's config.json.

Adapters written in MAX's style read `huggingface_config.num_attention_heads` and friends. A GGUF file
carries the same facts under llama.cpp's keys (`{arch}.attention.head_count`, ...); `GGUFConfig` exposes
them under the Hugging Face names, so one adapter serves both formats:

    ====================== =====================================================
    HF attribute            GGUF key (`{arch}` = general.architecture)
    ====================== =====================================================
    hidden_size             {arch}.embedding_length
    intermediate_size       {arch}.feed_forward_length
    num_hidden_layers       {arch}.block_count
    num_attention_heads     {arch}.attention.head_count
    num_key_value_heads     {arch}.attention.head_count_kv (default: head_count)
    head_dim                {arch}.attention.key_length (default: hidden_size // heads)
    rms_norm_eps            {arch}.attention.layer_norm_rms_epsilon
    rope_theta              {arch}.rope.freq_base
    max_position_embeddings {arch}.context_length
    vocab_size              {arch}.vocab_size, else len(tokenizer.ggml.tokens)
    sliding_window          {arch}.attention.sliding_window
    model_type/architectures from the architecture's row in `formats.arch_identity`, as the
                            folder export writes them (gemma3 -> gemma3_text / Gemma3ForCausalLM,
                            starcoder -> gpt_bigcode, llama with experts -> mixtral)
    rope_scaling            {arch}.rope.scaling.* (`formats.rope_scaling.rope_scaling_from_gguf`)
    ====================== =====================================================

An attribute the file does not provide raises AttributeError listing the ones it does.

Example:
    >>> from lazyweights.formats.config import GGUFConfig
    >>> cfg = GGUFConfig({"general.architecture": "llama", "llama.attention.head_count": 32,
    ...                   "llama.embedding_length": 4096})
    >>> cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.model_type
    (32, 32, 128, 'llama')
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from ..core.config_access import config_get
from ..core.errors import FormatError
from .arch_identity import config_identity
from .gguf_keys import arch_key
from .json_files import json_beside, read_json
from .rope_scaling import rope_scaling_from_gguf

# HF attribute -> GGUF key suffix after "{arch}."
_ARCH_KEYS: dict[str, str] = {
    "max_position_embeddings": "context_length",
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "layer_norm_eps": "attention.layer_norm_epsilon",
    "rope_theta": "rope.freq_base",
    "head_dim": "attention.key_length",
    "value_head_dim": "attention.value_length",
    "vocab_size": "vocab_size",
    "sliding_window": "attention.sliding_window",
    "rope_dimension_count": "rope.dimension_count",
    "final_logit_softcapping": "final_logit_softcapping",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "num_local_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
    "moe_intermediate_size": "expert_feed_forward_length",
}


class _AttrConfig:
    """Attribute access over a dict of values; missing attributes list what exists."""

    _kind = "config"

    def __init__(self, values: Mapping[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(
            f"{self._kind} has no attribute {name!r}; it has: {', '.join(sorted(values))}"
        )

    def __setattr__(self, name, value):
        self._values[name] = value

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def __dir__(self) -> Iterable[str]:
        return list(super().__dir__()) + list(self._values)

    def get(self, name: str, default=None):
        """`lazyweights.core.config_access.config_get` on this config: `name` may be a dotted path into nested
        configs (`text_config.num_attention_heads`); `default` where it is missing or None."""
        return config_get(object.__getattribute__(self, "_values"), name, default)

    def to_dict(self) -> dict:
        return {k: (v.to_dict() if isinstance(v, _AttrConfig) else v) for k, v in self._values.items()}

    def __eq__(self, other):
        return isinstance(other, _AttrConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self._values.items() if not isinstance(v, _AttrConfig))
        return f"{type(self).__name__}({body})"


class GGUFConfig(_AttrConfig):
    """A GGUF file's hyperparameters under Hugging Face names (see the module docstring's table).

    `architecture` is the GGUF architecture (`general.architecture`); `metadata` the raw key/values.
    `tie_word_embeddings` is known when `tensor_names` is given (no `output.weight` means tied).
    """

    _kind = "GGUFConfig"

    def __init__(self, metadata: Mapping[str, Any], tensor_names: Iterable[str] | None = None):
        from gguf.constants import Keys

        arch = metadata.get(Keys.General.ARCHITECTURE)
        values: dict[str, Any] = {}
        if isinstance(arch, str):
            values["architecture"] = arch
            row = config_identity(arch, metadata)  # the family to_hf.hf_config_from_gguf writes
            values["model_type"] = arch if row is None else row.config_model_type
            values["architectures"] = [] if row is None else [row.hf_class]
            for attr, suffix in _ARCH_KEYS.items():
                key = arch_key(arch, suffix)  # gguf-py's Keys template (formats/gguf_keys.py)
                if key in metadata:
                    v = metadata[key]
                    values[attr] = v.tolist() if hasattr(v, "tolist") and not isinstance(v, (int, float)) else v
            heads = values.get("num_attention_heads")
            if "num_key_value_heads" not in values and heads is not None:
                values["num_key_value_heads"] = heads
            if "head_dim" not in values and isinstance(heads, int) and heads and "hidden_size" in values:
                values["head_dim"] = values["hidden_size"] // heads
            scaling = rope_scaling_from_gguf(metadata, arch)
            if scaling is not None:
                values["rope_scaling"] = scaling
        if "vocab_size" not in values and Keys.Tokenizer.LIST in metadata:
            values["vocab_size"] = len(metadata[Keys.Tokenizer.LIST])
        tok = Keys.Tokenizer
        for attr, key in (("bos_token_id", tok.BOS_ID), ("eos_token_id", tok.EOS_ID), ("pad_token_id", tok.PAD_ID),
                          ("unk_token_id", tok.UNK_ID)):
            if key in metadata:
                values[attr] = metadata[key]
        if Keys.General.NAME in metadata:
            values["name"] = metadata[Keys.General.NAME]
        if tensor_names is not None:
            names = set(tensor_names)
            values["tie_word_embeddings"] = "output.weight" not in names and "token_embd.weight" in names
        super().__init__(values)
        object.__setattr__(self, "metadata", metadata)


class HFConfig(_AttrConfig):
    """A `config.json` as attributes (nested objects, e.g. `text_config`, become HFConfigs too)."""

    _kind = "HFConfig"

    def __init__(self, values: Mapping[str, Any]):
        super().__init__({k: (HFConfig(v) if isinstance(v, dict) else v) for k, v in values.items()})


def load_hf_config(path) -> HFConfig:
    """Read a Hugging Face `config.json` (given the file or its directory) into an `HFConfig`.

    FormatError if it is missing or not a JSON object.
    """
    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    doc = read_json(file)
    if doc is None:
        raise FormatError(f"{file}: no such file (a Hugging Face checkpoint keeps its config.json here)")
    return HFConfig(doc)


def config_from_metadata(fmt, metadata: Mapping[str, Any], files: Iterable[str] | None = None,
                         tensor_names: Iterable[str] | None = None):
    """The config of a loaded checkpoint: a `GGUFConfig` for GGUF; for safetensors, the `config.json`
    beside the first file as an `HFConfig`, or None when there is none."""
    value = getattr(fmt, "value", fmt)
    if value == "gguf":
        return GGUFConfig(metadata, tensor_names)
    files = list(files or [])
    doc = json_beside(files[0], "config.json") if files else None
    return None if doc is None else HFConfig(doc)
