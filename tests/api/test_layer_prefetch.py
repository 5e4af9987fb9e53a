"""Per-layer materialization through Weights: the values, and the next layer's bytes prefetched."""
import time

import numpy as np
import pytest
from _page_cache import drop_from_cache, resident_fraction
from safetensors.numpy import save_file

import lazyweights as lw

RNG = np.random.default_rng(21)


@pytest.fixture
def layered(tmp_path):
    tensors = {f"model.layers.{i}.mlp.weight": RNG.standard_normal((1024, 1024)).astype(np.float32) for i in range(5)}
    tensors["model.norm.weight"] = RNG.standard_normal(1024).astype(np.float32)
    path = str(tmp_path / "m.safetensors")
    save_file(tensors, path)
    return path, tensors


def test_layer_values(layered):
    path, tensors = layered
    w = lw.load_weights(path)
    got = w.model.layers[2].materialize()
    assert list(got) == ["mlp.weight"]
    assert np.array_equal(got["mlp.weight"], tensors["model.layers.2.mlp.weight"])
    assert np.array_equal(w.model.norm.weight.materialize()["model.norm.weight"], tensors["model.norm.weight"])


def test_next_layer_is_prefetched(layered):
    path, _ = layered
    w = lw.load_weights(path)
    regions = {n: (r.offset, r.offset + r.nbytes) for n, r in w.records.items()}
    drop_from_cache(path)
    if resident_fraction(path, *regions["model.layers.1.mlp.weight"]) > 0.5:
        pytest.skip("this file system keeps the file cached (fadvise DONTNEED had no effect)")
    w.model.layers[0].materialize()
    deadline = time.monotonic() + 5
    while resident_fraction(path, *regions["model.layers.1.mlp.weight"]) < 0.95 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert resident_fraction(path, *regions["model.layers.1.mlp.weight"]) >= 0.95  # prefetched
    assert resident_fraction(path, *regions["model.layers.3.mlp.weight"]) < 0.5   # not read ahead of its turn
    drop_from_cache(path)
    w.model.layers[0].materialize(prefetch_next=False)
    time.sleep(0.3)
    assert resident_fraction(path, *regions["model.layers.1.mlp.weight"]) < 0.5   # only when asked
