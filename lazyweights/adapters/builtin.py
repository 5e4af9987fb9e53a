"""Built-in architectures for the registry, so architecture names work from the shell in both directions:

    lazyweights convert Gemma3ForCausalLM gemma.gguf -o gemma-hf/       # GGUF -> complete Hugging Face folder
    lazyweights convert LlamaForCausalLM llama-hf/ -o llama.gguf        # Hugging Face -> GGUF with full metadata

Each registered name (a Hugging Face architecture class) maps GGUF checkpoints to `convert_gguf_state_dict`
and safetensors checkpoints to `convert_hf_to_gguf`; both first check that the checkpoint really is that
architecture (a LlamaForCausalLM adapter refuses a Gemma GGUF, naming both).

Example:
    >>> from lazyweights import registry
    >>> {"LlamaForCausalLM", "GptOssForCausalLM", "MambaForCausalLM", "BertModel"} <= set(registry.architectures())
    True
"""
from __future__ import annotations

from ..core.errors import ConfigError
from ..formats.arch_identity import IDENTITIES, identity_for_config, identity_for_gguf
from ..formats.gguf_keys import arch_key
from .archs import ARCHS, arch_for_gguf
from .vision_archs import VISION_ARCHS


def _accepted_model_types() -> dict[str, tuple[str, ...]]:
    """HF architecture class -> the model_types a config.json of it may say, from the identity table
    (`formats.arch_identity`): for every row listing the class, the row's model_type, the one its config.json
    says and the aliases read as it; then the multimodal classes whose text model is its text_config's own
    family (LLaVA, InternVL, Idefics3, ...: their vision records, `adapters/vision_archs.py`), under their outer
    model_type.

    >>> table = _accepted_model_types()
    >>> table["Gemma3ForConditionalGeneration"], table["NemotronHForCausalLM"], table["LlavaForConditionalGeneration"]
    (('gemma3_text', 'gemma3'), ('nemotron_h', 'nemotron_h_moe'), ('llava',))
    """
    table: dict[str, list[str]] = {}
    for row in IDENTITIES.values():
        for cls in row.hf_classes:
            accepted = table.setdefault(cls, [])
            accepted.extend(n for n in (row.model_type, row.config_model_type, *sorted(row.aliases))
                            if n not in accepted)
    for vision in VISION_ARCHS.values():
        table.setdefault(vision.hf_class, [vision.model_type])
    return {cls: tuple(types) for cls, types in table.items()}


def _taken_as() -> dict[str, tuple[str, ...]]:
    """HF architecture class -> the rows llama.cpp's GGUF files of it are taken for, where that is another
    family's row (`when` None: Mistral's file is a llama file, RoBERTa's a bert one; the record's fixed keys
    decide among an architecture's rows: GLM-4.7-Flash's deepseek2 file is DeepSeek-V3's), so that the class
    converts llama.cpp's files of it back.

    >>> _taken_as()["MistralForCausalLM"], _taken_as()["Glm4MoeLiteForCausalLM"]
    (('llama',), ('deepseek_v3',))
    """
    table: dict[str, tuple[str, ...]] = {}
    for row in IDENTITIES.values():
        if row.when is None:
            fixed = {arch_key(row.gguf, key): v for key, v in ARCHS[row.model_type].gguf_fixed.items()}
            taken = identity_for_gguf(row.gguf, fixed)
            if taken is not None:
                for cls in row.hf_classes:
                    table[cls] = (*table.get(cls, ()), taken.model_type)
    return table


# HF architecture class -> HF model_type(s) it accepts (see to_gguf.SUPPORTED)
BUILTIN: dict[str, tuple[str, ...]] = _accepted_model_types()
# HF architecture class -> the other families' rows its GGUF files read as (checked for GGUF checkpoints only)
GGUF_TAKEN_AS: dict[str, tuple[str, ...]] = _taken_as()


def _model_types(cfg) -> tuple[str | None, ...]:
    """What a checkpoint's config says it is, the name to report first: for a GGUFConfig the family it converts
    back to and the row the file is taken for (a Qwen2-VL text GGUF: written back as qwen2, qwen2_vl_text);
    for config.json its own model_type and the identity row it reads as (`identity_for_config`)."""
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    if hasattr(cfg, "metadata"):  # a GGUFConfig
        rec = arch_for_gguf(get("architecture"), cfg.metadata)
        return rec.identity.read_back().model_type, rec.model_type
    row = identity_for_config(cfg)
    return (get("model_type"),) if row is None else (get("model_type"), row.model_type)


def _checked(name: str, fn):
    accepted = BUILTIN[name]
    from_gguf = (*accepted, *GGUF_TAKEN_AS.get(name, ()))

    def adapter(state_dict, huggingface_config=None, **kwargs):
        says = _model_types(huggingface_config) if huggingface_config is not None else (None,)
        allowed = from_gguf if hasattr(huggingface_config, "metadata") else accepted
        if says[0] is not None and not set(says) & set(allowed):
            raise ConfigError(f"architecture {name!r} expects model_type {' or '.join(map(repr, allowed))}, "
                              f"but the checkpoint's config says {says[0]!r}")
        return fn(state_dict, huggingface_config=huggingface_config, **kwargs)

    adapter.__name__ = f"{fn.__name__}[{name}]"
    adapter.__doc__ = fn.__doc__
    return adapter


def builtin_adapters() -> dict[str, dict]:
    """name -> {WeightsFormat: adapter} for every built-in architecture (`adapters/registry.py` registers
    them on first use; a user registration under the same name wins)."""
    from ..convert.to_gguf import convert_hf_to_gguf
    from ..convert.to_hf import convert_gguf_state_dict
    from ..formats.checkpoint import WeightsFormat

    return {name: {WeightsFormat.gguf: _checked(name, convert_gguf_state_dict),
                   WeightsFormat.safetensors: _checked(name, convert_hf_to_gguf)} for name in BUILTIN}
