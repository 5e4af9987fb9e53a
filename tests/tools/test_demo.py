"""The demo's adapter (MAX's example, lazily): a config without the sizes the RoPE permutation needs is a
ConfigError naming the keys (it was `None // int`, a TypeError, found by mypy's check_untyped_defs), and a
transformers-style config object adapts exactly as the dict does, byte for byte against safetensors + numpy."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import lazyweights as lw
from lazyweights.core.errors import ConfigError
from lazyweights.tools.demo import convert_safetensor_state_dict, eager_reference, write_llama_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo") / "llama-small"
    cfg = write_llama_checkpoint(str(folder), layers=1, hidden_size=64, intermediate_size=96, vocab_size=50)
    return folder, cfg


@pytest.mark.parametrize("missing", [("hidden_size",), ("num_attention_heads",),
                                     ("num_attention_heads", "hidden_size")])
def test_a_config_without_the_sizes_is_a_config_error_naming_them(checkpoint, missing):
    folder, cfg = checkpoint
    state = dict(lw.load_weights(str(folder)).items())
    for config in ({k: v for k, v in cfg.items() if k not in missing},
                   SimpleNamespace(**{k: v for k, v in cfg.items() if k not in missing})):
        with pytest.raises(ConfigError) as ei:
            convert_safetensor_state_dict(state, config)
        assert isinstance(ei.value, ValueError)
        assert f"lacks {', '.join(missing)}:" in str(ei.value), str(ei.value)


def test_an_attribute_config_adapts_as_the_dict_does(checkpoint):
    folder, cfg = checkpoint
    state = dict(lw.load_weights(str(folder)).items())
    got = lw.plan(convert_safetensor_state_dict(state, SimpleNamespace(**cfg))).materialize()
    want = eager_reference(str(folder), cfg)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert np.asarray(got[name]).dtype == value.dtype, name
        assert np.asarray(got[name]).tobytes() == value.tobytes(), name
