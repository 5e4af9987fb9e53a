"""lazyweights.graph.gather: which layout chains are row gathers of a view, and the offsets of their units.

For every qualifying chain, ``windows[offsets]`` must be exactly the chain's value (computed here with
numpy, op by op) for any rows asked for, ranges and index arrays alike; chains that do not qualify must
say so (gather_unit 0), since the executor then computes them the old way.
"""
from __future__ import annotations

import numpy as np
import pytest

from lazyweights.graph import ops
from lazyweights.graph.gather import MIN_UNIT_BYTES, gather_unit, row_gather, table_run
from lazyweights.graph.layout import stand_in


def base_of(node):
    return node.arg.array


def rope_perm(hd):
    return np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])


X = np.arange(16 * 48, dtype=np.float32).reshape(16, 48)  # 48 float32 = 192 bytes per row


def cases():
    """(label, node, numpy value, expected unit in elements)."""
    x = ops.const(X)
    perm = rope_perm(8)
    yield ("rope", ops.reshape(ops.take(ops.reshape(x, (2, 8, 48)), perm, 1), (16, 48)),
           X.reshape(2, 8, 48)[:, perm, :].reshape(16, 48), 48)
    yield "rope_3d", ops.take(ops.reshape(x, (2, 8, 48)), perm, 1), X.reshape(2, 8, 48)[:, perm, :], 48
    idx = [5, 0, 15, 15, 3]
    yield "take_rows", ops.take(x, idx, 0), X[idx], 48
    cols = ops.slice_(x, [(0, 16, 1), (4, 36, 1)])  # a view with a row stride longer than its rows
    yield "take_of_column_slice", ops.take(cols, idx, 0), X[:, 4:36][idx], 32
    rows = ops.slice_(x, [(1, 16, 3), (0, 48, 1)])  # evenly spaced rows
    yield "take_of_row_step", ops.take(rows, [4, 0, 2], 0), X[1::3][[4, 0, 2]], 48
    hf_to_gguf = ops.reshape(ops.permute(ops.reshape(x, (2, 2, 4, 48)), (0, 2, 1, 3)), (16, 48))
    yield "permute_heads", hf_to_gguf, X.reshape(2, 2, 4, 48).transpose(0, 2, 1, 3).reshape(16, 48), 48
    yield ("slice_of_take", ops.slice_(ops.take(x, rope_perm(16), 0), [(1, 16, 2), (0, 48, 1)]),
           X[rope_perm(16)][1::2], 48)
    yield ("halves", ops.reshape(ops.take(x, [3, 1], 0), (4, 24)), X[[3, 1]].reshape(4, 24), 24)
    yield ("take_of_take", ops.take(ops.take(x, rope_perm(16), 0), [15, 0, 7], 0), X[rope_perm(16)][[15, 0, 7]], 48)
    x3 = ops.const(X.reshape(4, 4, 48))
    yield ("take_axis1_no_reshape", ops.take(x3, [3, 0], 1), X.reshape(4, 4, 48)[:, [3, 0]], 48)


@pytest.mark.parametrize("label,node,value,unit", list(cases()), ids=[c[0] for c in cases()])
def test_offsets_give_the_value(label, node, value, unit):
    assert gather_unit(node, base_of) == unit
    n = node.shape[0]
    for rows in (range(0, n), range(1, max(2, n - 1)), np.array([n - 1, 0, n // 2, n // 2]), np.array([], np.int64)):
        g = row_gather(node, rows, base_of)
        want = value[np.asarray(list(rows) if isinstance(rows, range) else rows, np.int64)]
        got = g.windows[g.offsets].reshape(want.shape)
        assert np.array_equal(got, want), (label, rows)
        assert g.offsets.dtype == np.int64 and g.unit == unit


@pytest.mark.parametrize("label,node,value,unit", list(cases()), ids=[c[0] for c in cases()])
def test_the_unit_is_decided_from_shapes_alone(label, node, value, unit):
    # Over stand-in bases (no memory at all), as the compiler would ask.
    assert gather_unit(node, stand_in) == unit


def test_chains_that_are_not_gathers():
    x = ops.const(X)
    assert gather_unit(ops.permute(x, (1, 0)), base_of) == 0  # a view: cast it as one
    assert gather_unit(x, base_of) == 0
    assert gather_unit(ops.take(x, [3, 0, 1], 1), base_of) == 0  # columns: one element per unit
    assert gather_unit(ops.take(ops.permute(x, (1, 0)), [3, 0], 0), base_of) == 0  # rows of a transpose are strided
    cat = ops.concat([ops.take(x, [1, 0], 0), x], 0)
    assert gather_unit(cat, base_of) == 0  # not a layout chain down to one view
    assert gather_unit(ops.cast(ops.take(x, [1, 0], 0), "float16"), base_of) == 0  # value ops are not moved
    over_a_cast = ops.slice_(ops.bitcast(ops.cast(x, "bfloat16"), "uint16"), [(0, 16, 2), (0, 48, 1)])
    assert gather_unit(over_a_cast, base_of) == 0  # found by test_ops' random chains: gcd(0, n) is n
    small = ops.const(np.zeros((8, 4), np.float32))  # 16-byte rows: too short to be worth it
    assert 4 * 4 < MIN_UNIT_BYTES and gather_unit(ops.take(small, [1, 0], 0), base_of) == 0
    assert row_gather(ops.take(small, [1, 0], 0), range(0, 2), base_of) is None


def test_table_run():
    a = np.zeros((4, 6, 8), np.float32)
    assert table_run(a) == 4 * 6 * 8
    assert table_run(a[:, :, :5]) == 5  # rows of 5, evenly spaced
    assert table_run(a[:, :3]) == 24  # (4, 3, 8): rows of 24, 48 apart
    assert table_run(a[::2, ::2]) == 0  # (2, 3, 8): two strides that do not fold into one
    assert table_run(a[:, :, ::2]) == 0  # strided last axis
    assert table_run(a.transpose(1, 0, 2)) == 0
    assert table_run(a[1:2, 2:3]) == 8
    assert table_run(np.zeros((0, 4), np.float32)) == 0


def test_reversed_rows_of_a_view():
    # A gather over a view whose rows run backwards in memory: offsets count from the lowest row.
    backwards = np.ascontiguousarray(X)[::-1]
    v = ops.const(backwards)
    node = ops.take(v, [0, 15, 2], 0)
    g = row_gather(node, range(0, 3), base_of)
    assert np.array_equal(g.windows[g.offsets], backwards[[0, 15, 2]])
