"""The rotary share of each attention head a config asks for (partial-rotary families: GPT-NeoX, Phi, Phi-3,
StableLM, GLM, ...), read where transformers 5 writes it and where older configs did.

Example:
    >>> rotary_factor({"rotary_pct": 0.25})
    0.25
"""
from __future__ import annotations

from typing import Any, Mapping

from ..core.config_access import config_first
from ..formats.rope_scaling import rope_parameters


def rotary_factor(cfg: Mapping[str, Any]) -> float:
    """The rotary fraction of each head: `rope_parameters.partial_rotary_factor` (where transformers 5 writes it,
    e.g. Phi-4-mini's 0.75), else the top-level `partial_rotary_factor` / `rotary_pct`, else 1.

    >>> rotary_factor({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75}})
    0.75
    """
    v = config_first(rope_parameters(cfg), ("partial_rotary_factor",))
    if v is None:
        v = config_first(cfg, ("partial_rotary_factor", "rotary_pct"))
    return 1.0 if v is None else float(v)
