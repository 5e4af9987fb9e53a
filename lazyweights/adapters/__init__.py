"""Weight adapters: the records conversion reads, the registry of ready-made adapters, and their public names.

What lives here (the conversion engines themselves live in `lazyweights.convert`):
- `archs` (one record per text family, with its `family_hooks`, `longrope`, `rotary`), `vision_archs`: the records;
- `names` / `hf_names`: tensor names from gguf-py's tables and the Hugging Face side of them;
- `registry`, `builtin`, `loader`: architecture names and `module:function` specs to adapters; `lora`.

The ready-made adapters keep their names here, re-exported from `lazyweights.convert`:
- `gguf_to_hf` / `hf_to_gguf`: llama.cpp GGUF tensor names <-> Hugging Face names for every family in
  `archs.ARCHS`, undoing (or applying) llama.cpp's value transforms (RoPE permutation, norm +1, ...).
- `convert_gguf_state_dict`: the MAX-style GGUF adapter (`adapter(dict(weights.items()),
  huggingface_config=...)`), GGUF to Hugging Face names dequantized to bfloat16.
- `convert_hf_to_gguf`: the MAX-style Hugging Face -> GGUF adapter, carrying the complete GGUF metadata
  built from config.json and tokenizer.json.
- `export_hf_folder(gguf, dir)` / `export_gguf(dir, gguf)`: whole-model conversions in one call.

They are looked up when first asked for (PEP 562), not when the package is imported: the engines read the
records of this package, so importing a record must not import the engines (tests/test_architecture.py).

Every adapter only builds graph nodes; nothing is read until the result is materialized or saved.

Example:
    >>> from lazyweights.adapters import convert_hf_to_gguf, gguf_to_hf
    >>> convert_hf_to_gguf.__module__, gguf_to_hf.__module__
    ('lazyweights.convert.to_gguf', 'lazyweights.convert.tensors')
"""
from __future__ import annotations

from typing import Any

_TO_GGUF = ("convert_hf_to_gguf", "export_gguf")
_TO_HF = ("convert_gguf_state_dict", "export_hf_folder")
_TENSORS = ("gguf_metadata_from_config", "gguf_name_to_hf", "gguf_to_hf", "hf_name_to_gguf", "hf_to_gguf",
            "rope_permute", "rope_permutation", "rope_unpermute")

__all__ = [*_TO_GGUF, *_TO_HF, *_TENSORS]


def __getattr__(name: str) -> Any:
    """A re-exported adapter, imported from `lazyweights.convert` on first use (then kept in this module)."""
    if name in _TO_GGUF:
        from ..convert import to_gguf

        value = getattr(to_gguf, name)
    elif name in _TO_HF:
        from ..convert import to_hf

        value = getattr(to_hf, name)
    elif name in _TENSORS:
        from ..convert import tensors

        value = getattr(tensors, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
