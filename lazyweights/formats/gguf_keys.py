"""The `{arch}.*` GGUF keys, as gguf-py's `Keys` templates: one place that turns a key's suffix (the name an
architecture record's rows use, `attention.head_count_kv`) into the template gguf-py defines for it
(`Keys.Attention.HEAD_COUNT_KV` = "{arch}.attention.head_count_kv"), so that every key the converters write is
gguf-py's constant where gguf-py has one.

Two keys llama.cpp's loader reads (both are in libllama's key table) are not in gguf-py 0.19's `Keys`: they are
`LLAMA_CPP_ONLY`, and resolve to gguf-py's constant once the installed release defines it (llama.cpp's own
gguf-py names them `Keys.LLM.HIDDEN_ACT` and `Keys.Attention.RECURRENT_LAYERS`).

gguf-py is imported on the first lookup, not with this module (`import lazyweights` stays free of it).

Example:
    >>> from lazyweights.formats.gguf_keys import arch_key, template
    >>> from gguf.constants import Keys
    >>> template("attention.head_count_kv") is Keys.Attention.HEAD_COUNT_KV
    True
    >>> arch_key("qwen35", "attention.recurrent_layers"), arch_key("llama", "rope.freq_base")
    ('qwen35.attention.recurrent_layers', 'llama.rope.freq_base')
"""
from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Mapping

from ..core.errors import UnknownGGUFKeyError, did_you_mean

_PREFIX = "{arch}."
# suffix -> (the gguf-py `Keys` group and name in releases that have it, the template until then)
_LLAMA_CPP_ONLY: dict[str, tuple[str, str, str]] = {
    # Qwen3.5 / Qwen3-Next's per-layer "is a gated delta-net layer" flags (llama.cpp's qwen35 graph)
    "attention.recurrent_layers": ("Attention", "RECURRENT_LAYERS", "{arch}.attention.recurrent_layers"),
    # ModernBERT's MLP activation name (llama.cpp's modern-bert graph: GeGLU unless it says otherwise)
    "hidden_activation": ("LLM", "HIDDEN_ACT", "{arch}.hidden_activation"),
}
LLAMA_CPP_ONLY: Mapping[str, str] = MappingProxyType({k: v[2] for k, v in _LLAMA_CPP_ONLY.items()})


def _newer(suffix: str) -> str:
    """A `_LLAMA_CPP_ONLY` key's template: gguf-py's constant where the installed release defines it."""
    from gguf.constants import Keys

    group, name, fallback = _LLAMA_CPP_ONLY[suffix]
    value = getattr(getattr(Keys, group, None), name, None)
    return value if isinstance(value, str) else fallback


@functools.cache
def templates() -> Mapping[str, str]:
    """Every `{arch}.*` key suffix -> its template: gguf-py's `Keys` (all groups), then `LLAMA_CPP_ONLY`.

    >>> templates()["rope.scaling.original_context_length"]
    '{arch}.rope.scaling.original_context_length'
    """
    from gguf.constants import Keys

    out: dict[str, str] = {}
    for group in vars(Keys).values():
        if isinstance(group, type):
            for value in vars(group).values():
                if isinstance(value, str) and value.startswith(_PREFIX) and "{" not in value[len(_PREFIX):]:
                    out.setdefault(value[len(_PREFIX):], value)
    for suffix in _LLAMA_CPP_ONLY:
        out.setdefault(suffix, _newer(suffix))
    return MappingProxyType(out)


def template(suffix: str) -> str:
    """The template of the `{arch}.*` key `suffix`; UnknownGGUFKeyError (naming the suffix and the closest
    keys) when neither gguf-py nor llama.cpp has it.

    >>> template("rope.freq_base")
    '{arch}.rope.freq_base'
    """
    table = templates()
    if suffix not in table:
        raise UnknownGGUFKeyError(f"no GGUF key {_PREFIX}{suffix} in gguf-py's Keys or llama.cpp's "
                                  f"({len(table)} known).{did_you_mean(suffix, list(table))}")
    return table[suffix]


def arch_key(arch: str, suffix: str) -> str:
    """The key `{arch}.{suffix}` for the architecture `arch`, from its template (see `template`).

    >>> arch_key("gemma3", "attention.sliding_window")
    'gemma3.attention.sliding_window'
    """
    return template(suffix).format(arch=arch)

