"""Deprecated (kept for one release): the tokenizer converters now live in two modules named for their jobs.

- `lazyweights.formats.tokenizer_to_gguf`: Hugging Face `tokenizer.json` -> GGUF `tokenizer.ggml.*`
  (`gguf_tokenizer_metadata`);
- `lazyweights.formats.tokenizer_to_hf`: GGUF metadata -> `tokenizer.json` + `tokenizer_config.json`
  (`tokenizer_from_gguf`, `write_tokenizer_files`, `generate_merges`, `bytes_to_unicode`);
- `lazyweights.formats.tokenizer_tables`: what both read (token types, llama.cpp's pre-tokenizer tables,
  the special-token keys, each architecture's SentencePiece dialect).

This module only re-exports their public names, so code that imports `lazyweights.formats.hf_tokenizer` keeps
working for one release; import from the modules above instead.

Example:
    >>> from lazyweights.formats import hf_tokenizer, tokenizer_to_hf
    >>> hf_tokenizer.tokenizer_from_gguf is tokenizer_to_hf.tokenizer_from_gguf
    True
"""
from __future__ import annotations

from ..core.errors import MissingTokenizerError, TokenizerConversionError, TokenizerNotExpressibleError
from .tokenizer_tables import (
    BYTE,
    BYTE_LEVEL_PRE_TOKENIZERS,
    CONTROL,
    IGNORE_MERGES_PRE,
    NORMAL,
    PRE_ALIASES,
    PRE_TOKENIZER_SPLITS,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
)
from .tokenizer_to_gguf import gguf_tokenizer_metadata
from .tokenizer_to_hf import bytes_to_unicode, generate_merges, tokenizer_from_gguf, write_tokenizer_files

__all__ = [
    "BYTE", "BYTE_LEVEL_PRE_TOKENIZERS", "CONTROL", "IGNORE_MERGES_PRE", "NORMAL", "PRE_ALIASES",
    "PRE_TOKENIZER_SPLITS", "UNKNOWN", "UNUSED", "USER_DEFINED", "MissingTokenizerError", "TokenizerConversionError",
    "TokenizerNotExpressibleError", "bytes_to_unicode", "generate_merges", "gguf_tokenizer_metadata",
    "tokenizer_from_gguf", "write_tokenizer_files",
]
