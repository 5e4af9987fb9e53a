"""Ready-made weight adapters: lazy state-dict transforms between checkpoint conventions.

- `gguf_to_hf` / `hf_to_gguf`: llama.cpp GGUF tensor names <-> Hugging Face names for the llama family
  and Gemma, undoing (or applying) llama.cpp's q/k RoPE row permutation and Gemma's +1 norm offset.

Every adapter only builds graph nodes; nothing is read until the result is materialized or saved.
"""
from .gguf_names import (
    gguf_metadata_from_config,
    gguf_name_to_hf,
    gguf_to_hf,
    hf_name_to_gguf,
    hf_to_gguf,
    rope_permute,
    rope_permutation,
    rope_unpermute,
)

__all__ = [
    "gguf_metadata_from_config", "gguf_name_to_hf", "gguf_to_hf", "hf_name_to_gguf", "hf_to_gguf",
    "rope_permute", "rope_permutation", "rope_unpermute",
]
