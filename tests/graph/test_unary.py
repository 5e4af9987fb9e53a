"""The unary elementwise op (exp, log, neg): built with its dtype and shape, refused on non-floats, and computed
like numpy by every CPU executor (op-at-a-time reference, CPU blocks in tiny blocks), through slicing and
row-merging rewrites. The GPU executor's path: tests/run/test_unary_gpu.py."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lazyweights as lw
from lazyweights.core.errors import DTypeError, ShapeError
from lazyweights.graph import ops
from lazyweights.graph.elementwise import unary
from lazyweights.graph.rewrites import merge_leading_axes, sink_slices
from lazyweights.lazy.weight_data import WeightData
from lazyweights.run.materialize import materialize
from lazyweights.run.reference import materialize_reference

RNG = np.random.default_rng(27)
BF16 = ml_dtypes.bfloat16
NUMPY = {"exp": np.exp, "log": np.log, "neg": np.negative}


def _positive(shape, dtype=np.float32):
    return (RNG.random(shape) * 3 + 0.05).astype(dtype)


@pytest.mark.parametrize("kind", list(NUMPY))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_unary_matches_numpy_in_every_cpu_executor(kind, dtype):
    x = _positive((37, 19), dtype)
    node = unary(kind, ops.const(x))
    assert node.dtype.to_numpy() == np.dtype(dtype) and node.shape == x.shape
    want = NUMPY[kind](x)
    ref = materialize_reference({"y": node})["y"]
    assert ref.dtype == want.dtype and ref.tobytes() == want.tobytes()
    got = materialize({"y": node}, scheduler="sync", block_bytes=64)["y"]  # many small row blocks
    assert got.tobytes() == want.tobytes()
    got = materialize({"y": node}, scheduler="threads", block_bytes=128)["y"]
    assert got.tobytes() == want.tobytes()


def test_bfloat16_goes_through_float32():
    x = _positive((8, 16), BF16)
    node = unary("log", ops.const(x))
    want = np.log(x.astype(np.float32)).astype(BF16)
    got = materialize({"y": node}, scheduler="sync")["y"]
    assert got.dtype == BF16 and got.view(np.uint16).tolist() == want.view(np.uint16).tolist()


def test_mamba_a_round_trip_is_exact_enough():
    """`A = -exp(A_log)` and back `A_log = log(-A)`: the composition llama.cpp's converter and its inverse use."""
    a_log = np.log(np.tile(np.arange(1, 17, dtype=np.float32), (24, 1)))  # Mamba's own initialisation
    a = unary("neg", unary("exp", ops.const(a_log)))
    back = unary("log", unary("neg", a))
    got_a, got_back = (materialize({"a": a, "b": back}, scheduler="sync")[k] for k in "ab")
    assert got_a.tobytes() == (-np.exp(a_log)).tobytes()
    np.testing.assert_allclose(got_back, a_log, rtol=0, atol=1e-6)
    assert (got_back != 0).any()


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "bool"])
def test_non_float_is_refused(dtype):
    x = ops.const(np.zeros((2, 3), np.dtype(dtype)))
    with pytest.raises(DTypeError, match=rf"exp: defined for float dtypes only, got {dtype} \[2, 3\]"):
        unary("exp", x)


def test_unknown_kind_is_refused():
    with pytest.raises(ShapeError, match="unknown unary elementwise op 'sqrt'; known: exp, log, neg"):
        unary("sqrt", ops.const(np.ones(3, np.float32)))


def test_slices_sink_below_unary_and_rows_merge():
    x = _positive((4, 6, 5))
    node = unary("exp", ops.const(x))
    sliced = ops.slice_(node, ((1, 3, 1), (0, 6, 2), (0, 5, 1)))
    sunk = sink_slices(sliced)
    assert sunk.op == "unary" and sunk.srcs[0].op != "unary"
    want = np.exp(x)[1:3, ::2]
    assert materialize_reference({"s": sunk})["s"].tobytes() == want.tobytes()
    merged = merge_leading_axes(unary("neg", ops.cast(ops.const(x), "float16")))
    assert merged is not None and merged.shape == (24, 5)
    got = materialize({"m": merged}, scheduler="sync", block_bytes=32)["m"]
    assert got.tobytes() == (-x.astype(np.float16)).reshape(24, 5).tobytes()


def test_plan_text_names_the_op():
    wd = WeightData.wrap(unary("neg", unary("exp", ops.const(_positive((3, 4))))), "A", None)
    text = lw.plan({"A": wd}).explain()
    assert "unary[exp]" in text and "unary[neg]" in text, text
