"""Ready-made weight adapters: lazy state-dict transforms between checkpoint conventions.

- `gguf_to_hf` / `hf_to_gguf`: llama.cpp GGUF tensor names <-> Hugging Face names for every family in
  `archs.ARCHS`, undoing (or applying) llama.cpp's value transforms (RoPE permutation, norm +1, ...).
- `convert_gguf_state_dict`: the MAX-style GGUF adapter (`adapter(dict(weights.items()),
  huggingface_config=...)`), GGUF to Hugging Face names dequantized to bfloat16.

- `convert_hf_to_gguf`: the MAX-style Hugging Face -> GGUF adapter, carrying the complete GGUF metadata
  built from config.json and tokenizer.json (`lazyweights.adapters.hf_export`).
- `export_hf_folder(gguf, dir)` / `export_gguf(dir, gguf)`: whole-model conversions in one call.

One module per concern: `archs` (one record per family), `names` (tensor names from gguf-py's tables),
`transforms` (llama.cpp's value transforms), `hparams` (config.json <-> GGUF keys), `hf_export` (folders and
files), `gguf_names` (the state-dict adapters over them).

Every adapter only builds graph nodes; nothing is read until the result is materialized or saved.
"""
from .gguf_names import (
    gguf_metadata_from_config,
    gguf_name_to_hf,
    gguf_to_hf,
    hf_name_to_gguf,
    hf_to_gguf,
    rope_permutation,
    rope_permute,
    rope_unpermute,
)
from .hf_export import convert_gguf_state_dict, convert_hf_to_gguf, export_gguf, export_hf_folder

__all__ = [
    "convert_hf_to_gguf", "export_gguf", "export_hf_folder",
    "convert_gguf_state_dict", "gguf_metadata_from_config", "gguf_name_to_hf", "gguf_to_hf", "hf_name_to_gguf",
    "hf_to_gguf",
    "rope_permute", "rope_permutation", "rope_unpermute",
]
