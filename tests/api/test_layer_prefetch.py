"""Per-layer materialization through Weights: the values, and the next layer's bytes prefetched."""
import ctypes
import mmap
import os
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

import lazyweights as lw

PAGE = os.sysconf("SC_PAGE_SIZE")
RNG = np.random.default_rng(21)


def _resident_fraction(path, start, stop):
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    addr = np.frombuffer(mm, np.uint8).ctypes.data  # no page is touched
    n = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(addr), size, vec) == 0
    pages = np.frombuffer(vec, np.uint8)[start // PAGE:(stop + PAGE - 1) // PAGE] & 1
    mm.close()
    return float(pages.mean())


def _drop_from_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


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
    _drop_from_cache(path)
    if _resident_fraction(path, *regions["model.layers.1.mlp.weight"]) > 0.5:
        pytest.skip("this file system keeps the file cached (fadvise DONTNEED had no effect)")
    w.model.layers[0].materialize()
    deadline = time.monotonic() + 5
    while _resident_fraction(path, *regions["model.layers.1.mlp.weight"]) < 0.95 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _resident_fraction(path, *regions["model.layers.1.mlp.weight"]) >= 0.95  # prefetched
    assert _resident_fraction(path, *regions["model.layers.3.mlp.weight"]) < 0.5   # not read ahead of its turn
    _drop_from_cache(path)
    w.model.layers[0].materialize(prefetch_next=False)
    time.sleep(0.3)
    assert _resident_fraction(path, *regions["model.layers.1.mlp.weight"]) < 0.5   # only when asked
