"""Fixtures of the render tests (explain, visualize)."""
from __future__ import annotations

import pytest

import lazyweights as lw


def _w1_plan(d, cfg):
    from lazyweights.adapters.w1 import convert_safetensor_state_dict

    weights = lw.load_weights([d])
    return lw.plan(convert_safetensor_state_dict(dict(weights.items()), huggingface_config=cfg))


@pytest.fixture(scope="session")
def w1_plan():
    """`w1_plan(d, cfg) -> Plan`: the W1 adapter over the checkpoint in folder `d` (see `tiny_llama`)."""
    return _w1_plan
