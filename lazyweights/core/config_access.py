"""One way to read a model config, whatever holds it: a config.json dict, a transformers `PretrainedConfig`,
a `GGUFConfig` / `HFConfig`, or any object with attributes.

`config_get(cfg, "a.b", default)` reads key-or-attribute `a`, then `b` inside it (DBRX's `attn_config.kv_n_heads`),
and gives `default` where any step is missing or the value is None (transformers writes unset entries as null).
`config_first` is the first of several names that is set (current name first, then legacy aliases).
`text_config` is the language model's own config inside a multimodal one (`text_config`), else the config itself.

Example:
    >>> from lazyweights.core.config_access import config_first, config_get, text_config
    >>> cfg = {"model_type": "gemma3", "text_config": {"num_attention_heads": 8, "head_dim": None}}
    >>> config_get(cfg, "text_config.num_attention_heads"), config_get(cfg, "text_config.head_dim", 256)
    (8, 256)
    >>> config_first({"n_embd": 64}, ("hidden_size", "n_embd")), text_config(cfg)["num_attention_heads"]
    (64, 8)
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping


def config_get(cfg: Any, path: str, default: Any = None) -> Any:
    """`path`'s value in `cfg` (dots step into nested configs; each step a key of a mapping, else an attribute),
    or `default` where a step is missing or the value is None.

    >>> class Cfg: hidden_size = 64
    >>> config_get(Cfg(), "hidden_size"), config_get(Cfg(), "vocab_size", 0), config_get(None, "x", 1)
    (64, 0, 1)
    """
    value = cfg
    for part in path.split("."):
        if value is None:
            return default
        value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
    return default if value is None else value


def config_first(cfg: Any, names: Iterable[str], default: Any = None) -> Any:
    """The value of the first of `names` (each a `config_get` path) that `cfg` sets, else `default`.

    >>> config_first({"ffn_config": {"moe_num_experts": 16}}, ("num_experts", "ffn_config.moe_num_experts"))
    16
    """
    for name in names:
        v = config_get(cfg, name)
        if v is not None:
            return v
    return default


def text_config(cfg: Any) -> Any:
    """The language model's config: a multimodal config's `text_config` where the outer config has no
    `num_attention_heads` of its own (Gemma3ForConditionalGeneration, the Qwen VL models), else `cfg`.

    >>> text_config({"num_attention_heads": 4, "text_config": {"num_attention_heads": 8}})["num_attention_heads"]
    4
    """
    inner = config_get(cfg, "text_config")
    return inner if inner is not None and config_get(cfg, "num_attention_heads") is None else cfg
