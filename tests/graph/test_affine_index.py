"""Affine take indices: `arange(n) // 128` (a block-scale broadcast) and its kin are held as five integers.

A DeepSeek-V3 plan has two such takes per FP8 weight; as int64 arrays they were ~73 KB per weight (3.3 GB for
the model's 45,000 weights, benchmarks/bench_scale.py). Here: every affine list is recognised and stored with
no array, its values at any positions equal numpy's, slicing keeps it symbolic, equal lists are one object, and
a block dequantization over a real FP8 safetensors file equals a reference computed independently with
numpy and ml_dtypes, partial blocks and a tensor-parallel slice included.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import struct

import ml_dtypes
import numpy as np
import pytest

from lazyweights import DType, load_weights, plan, shard
from lazyweights.graph import ops
from lazyweights.graph.node import IndexArray
from lazyweights.graph.rewrites import sink_slices
from lazyweights.run.reference import evaluate


def affine_cases():
    rng = random.Random(35)
    yield 2048, 128, 0, 1, 0
    yield 7168, 128, 0, 1, 0
    yield 576, 128, 0, 1, 0  # kv_a_proj_with_mqa: 4.5 blocks
    for _ in range(300):
        div = rng.choice([1, 2, 3, 7, 128, 129])
        yield rng.randrange(0, 700), div, rng.randrange(-4, 5), rng.randrange(-3, 4), rng.randrange(div)


@pytest.mark.parametrize("n, div, offset, scale, phase", list(affine_cases()))
def test_affine_lists_hold_no_array_and_equal_numpy(n, div, offset, scale, phase):
    want = offset + scale * ((np.arange(n) + phase) // div)
    idx = IndexArray(want)
    assert idx.affine is not None and idx._array is None  # five integers, no array
    assert idx is IndexArray.repeat(n, div, offset, scale, phase)  # one canonical form, one object
    assert np.array_equal(idx.array, want) and len(idx) == n
    rows = np.random.default_rng(n).integers(0, max(n, 1), size=9) if n else np.zeros(0, np.int64)
    assert np.array_equal(idx.values(rows), want[rows])
    assert np.array_equal(idx.values(range(n // 3, n)), want[n // 3:])
    for key in (slice(5, None), slice(None, None, -1), slice(1, -1, 3), slice(None, None, 2 * div)):
        assert np.array_equal(idx[key].array, want[key])
        assert idx[key] == IndexArray(want[key])
    assert pickle.loads(pickle.dumps(idx)) is idx


def test_block_scale_broadcast_equals_numpy_gather():
    n, block = 1000, 128
    idx = IndexArray(np.arange(n) // block)
    assert idx.affine == (n, 0, 1, block, 0)
    assert np.array_equal(idx.array, np.arange(n) // block)
    assert repr(idx) == "[0,0,0,0,...,7](1000)"


def test_non_affine_lists_stay_arrays_and_compare_by_content():
    perm = np.concatenate([np.arange(0, 64, 2), np.arange(1, 64, 2)])  # a RoPE permutation
    idx = IndexArray(perm)
    assert idx.affine is None and np.array_equal(idx.array, perm)
    assert perm.flags.writeable and not idx.array.flags.writeable  # a copy: the caller's array is untouched
    assert idx == IndexArray(perm.copy()) and hash(idx) == hash(IndexArray(perm.copy()))
    almost = np.arange(300) // 128
    almost[200] = 0
    assert IndexArray(almost).affine is None and np.array_equal(IndexArray(almost).array, almost)


@pytest.mark.parametrize("axis", [0, 1])
def test_take_with_an_affine_index_equals_numpy(axis):
    s = np.random.default_rng(0).random((3, 5), dtype=np.float32)
    n = 300 if axis == 0 else 600
    index = np.arange(n) // 128
    node = ops.take(ops.const(s), index, axis)
    assert node.arg[1].affine is not None
    want = np.take(s, index, axis=axis)
    assert np.array_equal(evaluate([node])[0], want)
    assert np.array_equal(plan({"x": node_wd(node)}).materialize()["x"], want)


def node_wd(node):
    from lazyweights import WeightData

    return WeightData.wrap(node, "x")


def test_a_slice_sinks_through_an_affine_take_and_stays_symbolic():
    s = np.random.default_rng(1).random((4, 3), dtype=np.float32)
    taken = ops.take(ops.const(s), np.arange(500) // 128, 0)
    sunk = sink_slices(ops.slice_(taken, ((130, 400, 1), (0, 3, 1))))
    assert sunk.op == "take" and sunk.arg[1].affine is not None
    assert np.array_equal(evaluate([sunk])[0], s[np.arange(500) // 128][130:400])


def write_safetensors(path, tensors):
    """A safetensors file written by hand (safetensors' numpy writer has no float8)."""
    header, blobs, offset = {}, [], 0
    for name, (code, a) in tensors.items():
        raw = a.tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_block_fp8_dequantization_equals_an_independent_reference(tmp_path):
    rng = np.random.default_rng(35)
    n, k, block = 300, 200, 128  # partial blocks on both axes, as DeepSeek-V3's kv_a_proj_with_mqa has
    w = rng.normal(size=(n, k)).astype(ml_dtypes.float8_e4m3fn)
    s = (rng.random((-(-n // block), -(-k // block)), dtype=np.float32) * 0.01 + 1e-4).astype(np.float32)
    path = os.path.join(tmp_path, "m.safetensors")
    write_safetensors(path, {"w.weight": ("F8_E4M3", w), "w.weight_scale_inv": ("F32", s)})
    weights = load_weights([path])
    wd, sd = weights["w.weight"].data(), weights["w.weight_scale_inv"].data()
    assert wd.dtype is DType.float8_e4m3fn
    lazy = (wd.astype(DType.float32) * sd[np.arange(n) // block][:, np.arange(k) // block]).astype(DType.bfloat16)
    takes = [x for x in plan({"w": lazy}).nodes() if x.op == "take"]
    assert len(takes) == 2 and all(t.arg[1].affine is not None for t in takes)
    # The reference: numpy and ml_dtypes only, from the arrays written (not read back through lazyweights).
    full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:n, :k]
    want = (w.astype(np.float32) * full).astype(ml_dtypes.bfloat16)
    got = plan({"w": lazy}).materialize()["w"]
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint16), want.view(np.uint16))
    # One tensor-parallel rank's rows: the slice sinks below the takes, which stay affine.
    part = shard({"model.layers.0.mlp.gate_proj.weight": lazy}, rank=1, world_size=2)
    sunk = sink_slices(part["model.layers.0.mlp.gate_proj.weight"].node)
    assert sorted(len(t.arg[1]) for t in sunk.toposort() if t.op == "take") == [n // 2, k]
    assert all(t.arg[1].affine is not None for t in sunk.toposort() if t.op == "take")
    rank1 = plan(part).materialize()["model.layers.0.mlp.gate_proj.weight"]
    assert np.array_equal(rank1.view(np.uint16), want[n // 2:].view(np.uint16))
