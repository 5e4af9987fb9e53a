"""`sink_slices`: a slice moved down through permutes, takes, casts, dequantizes, slices and reshapes gives
the same values (the reference executor, op at a time in numpy, on the chain before and after), and ends
next to the source where that is exact, which is what makes a rank read only its rows."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lazyweights.core.quantization import QuantizationEncoding as Q
from lazyweights.graph import ops
from lazyweights.graph.node import toposort
from lazyweights.graph.rewrites import sink_slices
from lazyweights.quant import quantize
from lazyweights.run.reference import materialize_reference


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _values(root):
    return materialize_reference({"r": root})["r"]


def _source(shape, seed=0):
    return ops.const(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) + 0.25)


def _ops_above_source(node):
    """The op names from the source up (a single chain)."""
    return [n.op for n in toposort([node])]


def test_rope_permute_slice_reads_only_the_heads_rows():
    """W1's q RoPE permutation (reshape to heads, take within each head, reshape back) sliced to rank 1 of 4:
    the slice lands on the source's rows of heads 2..3."""
    heads, head_dim, hidden = 8, 16, 32
    w = _source((heads * head_dim, hidden))
    perm = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    roped = ops.reshape(ops.take(ops.reshape(w, (heads, head_dim, hidden)), perm, 1), (heads * head_dim, hidden))
    rank1 = ops.slice_(ops.cast(roped, "float16"), ((32, 64, 1), (0, hidden, 1)))
    sunk = sink_slices(rank1)
    assert _same(_values(sunk), _values(rank1))
    first_slice = next(n for n in toposort([sunk]) if n.op == "slice")
    assert first_slice.srcs[0] is w and first_slice.arg[0] == (32, 64, 1)


def test_half_a_head_is_a_box_of_the_heads_axis():
    """Rows [0, 8) of [4 * 16, D] reshaped from [4, 16, D]: one index on the head axis, a range inside it."""
    w = _source((64, 8))
    x = ops.reshape(ops.take(ops.reshape(w, (4, 16, 8)), np.arange(16)[::-1].copy(), 1), (64, 8))
    top = ops.slice_(x, ((8, 16, 1), (0, 8, 1)))
    sunk = sink_slices(top)
    assert _same(_values(sunk), _values(top))
    assert _ops_above_source(sunk)[:2] == ["const", "slice"]  # the take reads head 0 only


def test_dequantize_rows_slice_packed_rows():
    packed = quantize(Q.Q8_0, np.random.default_rng(1).standard_normal((12, 64)).astype(np.float32))
    deq = ops.dequantize(ops.const(packed), Q.Q8_0)
    top = ops.slice_(deq, ((3, 9, 1), (0, 64, 1)))
    sunk = sink_slices(top)
    assert _ops_above_source(sunk) == ["const", "slice", "dequantize"]
    assert _same(_values(sunk), _values(top))
    columns = ops.slice_(deq, ((0, 12, 1), (0, 32, 1)))  # a block's columns cannot move below
    assert sink_slices(columns).op == "slice" and _same(_values(sink_slices(columns)), _values(columns))


def test_unaligned_reshape_keeps_the_slice_above():
    w = _source((6, 10))
    top = ops.slice_(ops.reshape(w, (4, 15)), ((1, 3, 1), (0, 15, 1)))  # rows 15..45: not whole source rows
    sunk = sink_slices(top)
    assert sunk.op == "slice" and sunk.srcs[0].op == "reshape"
    assert _same(_values(sunk), _values(top))


@st.composite
def chains(draw):
    """A random chain of layout and value ops over a random source, with a random slice on top."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    node = _source(shape, draw(st.integers(0, 9)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["reshape", "permute", "take", "cast", "slice"]))
        if kind == "reshape":
            size = int(np.prod(node.shape))
            divisors = [d for d in range(1, size + 1) if size % d == 0]
            first = draw(st.sampled_from(divisors))
            node = ops.reshape(node, (first, size // first) if size // first > 1 else (first,))
        elif kind == "permute" and node.ndim > 1:
            node = ops.permute(node, draw(st.permutations(range(node.ndim))))
        elif kind == "take":
            axis = draw(st.integers(0, node.ndim - 1))
            idx = draw(st.lists(st.integers(0, node.shape[axis] - 1), min_size=1, max_size=6))
            node = ops.take(node, np.array(idx), axis)
        elif kind == "cast":
            node = ops.cast(node, draw(st.sampled_from(["float16", "bfloat16", "float32"])))
        elif kind == "slice":
            node = ops.slice_(node, tuple(_draw_range(draw, d) for d in node.shape))
    return ops.slice_(node, tuple(_draw_range(draw, d) for d in node.shape))


def _draw_range(draw, dim):
    start = draw(st.integers(0, dim - 1))
    stop = draw(st.integers(start + 1, dim))
    return (start, stop, draw(st.integers(1, 3)))


@settings(max_examples=300, deadline=None)
@given(chains())
def test_sinking_never_changes_a_value(root):
    sunk = sink_slices(root)
    assert sunk.shape == root.shape and sunk.dtype is root.dtype
    assert _same(_values(sunk), _values(root))
