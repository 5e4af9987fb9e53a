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
from .archs import ALIASES, ARCHS

# HF architecture class -> HF model_type(s) it accepts (see hf_export.SUPPORTED)
BUILTIN: dict[str, tuple[str, ...]] = {
    "LlamaForCausalLM": ("llama",),
    "MistralForCausalLM": ("mistral", "llama"),
    "MixtralForCausalLM": ("mixtral",),
    # InternVL (transformers' class): the text model is its text_config's family (Qwen2 or Qwen3), generic adapter
    "InternVLForConditionalGeneration": ("internvl",),
    # LFM2-VL: the text model is an LFM2 (its text_config), converted by the generic adapter
    "Lfm2VlForConditionalGeneration": ("lfm2_vl",),
    # Llama 4: the text model is its text_config's llama4_text (MoE), converted by the generic adapter
    "Llama4ForConditionalGeneration": ("llama4",),
    "Qwen2ForCausalLM": ("qwen2",),
    "Qwen3ForCausalLM": ("qwen3",),
    "Qwen2MoeForCausalLM": ("qwen2_moe",),
    "Qwen3MoeForCausalLM": ("qwen3_moe",),
    "Gemma2ForCausalLM": ("gemma2",),
    "Gemma3ForCausalLM": ("gemma3_text",),
    "Gemma3ForConditionalGeneration": ("gemma3_text", "gemma3"),
    # LLaVA: the text model is its text_config's family (llava-1.5: llama), converted by the generic adapter
    "LlavaForConditionalGeneration": ("llava",),
    # Mistral 3 (Mistral Small 3.1): a Mistral text model, the generic adapter's (its GGUF converts back under
    # MistralForCausalLM)
    "Mistral3ForConditionalGeneration": ("mistral3",),
    # Idefics3 / SmolVLM: a Llama text model under `model.text_model.` (hf_export), the generic adapter's
    "Idefics3ForConditionalGeneration": ("idefics3",),
    "SmolVLMForConditionalGeneration": ("smolvlm",),
    # Qwen2-Audio: a Qwen2 text model (its text_config) beside a Whisper encoder (`audio_tower.`, left out)
    "Qwen2AudioForConditionalGeneration": ("qwen2_audio",),
    "Phi3ForCausalLM": ("phi3",),
}
# every other family's class from its record (adapters/archs.py); a multimodal class (a VL model whose record
# is its text part, `qwen2_5_vl_text`) also accepts the outer config's own model_type (`qwen2_5_vl`, ALIASES)
BUILTIN.update({a.hf_class: (a.model_type, *sorted(k for k, v in ALIASES.items() if v == a.model_type))
                for a in ARCHS.values() if a.hf_class not in BUILTIN})


def _model_type(cfg) -> str | None:
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    mt = get("model_type")
    if hasattr(cfg, "metadata"):  # a GGUFConfig: derive the HF model type as the folder export would
        from .hf_export import model_type_for

        return model_type_for(get("architecture"), cfg.metadata)
    return mt


def _checked(name: str, fn):
    accepted = BUILTIN[name]

    def adapter(state_dict, huggingface_config=None, **kwargs):
        mt = _model_type(huggingface_config) if huggingface_config is not None else None
        if mt is not None and mt not in accepted:
            raise ConfigError(f"architecture {name!r} expects model_type {' or '.join(map(repr, accepted))}, "
                                   f"but the checkpoint's config says {mt!r}")
        return fn(state_dict, huggingface_config=huggingface_config, **kwargs)

    adapter.__name__ = f"{fn.__name__}[{name}]"
    adapter.__doc__ = fn.__doc__
    return adapter


def builtin_adapters() -> dict[str, dict]:
    """name -> {WeightsFormat: adapter} for every built-in architecture (`adapters/registry.py` registers
    them on first use; a user registration under the same name wins)."""
    from ..formats.checkpoint import WeightsFormat
    from .hf_export import convert_gguf_state_dict, convert_hf_to_gguf

    return {name: {WeightsFormat.gguf: _checked(name, convert_gguf_state_dict),
                   WeightsFormat.safetensors: _checked(name, convert_hf_to_gguf)} for name in BUILTIN}
