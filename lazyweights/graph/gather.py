"""Row gathers: a chain of layout ops whose value is whole runs of a strided view's elements, picked by an index.

Why: a RoPE row permutation, ``reshape(take(reshape(x, (heads, hd, n)), perm, 1), (heads * hd, n))``, is
no strided view of `x` (numpy would copy), so computing it used to gather the rows into a temporary and
then cast that: two passes over the bytes. Row for row it is still ``x[idx]`` for an index `idx` that
follows from `perm` and the shapes alone, and a cast kernel that takes a row index reads each row where it
lies, in one pass (`kernels.casts.gather_cast_into`). This module finds that index.

The value of a chain of layout ops is cut into *units*: consecutive runs of `unit` elements in C order.
A chain qualifies when every op in it moves whole units (a `take` along axis k moves runs of
``prod(shape[k+1:])`` elements, a `permute` of the leading axes runs of its untouched trailing axes, a
`reshape` anything, since C order is kept) down to a zero-copy view (`layout.view_of`) that is a table of
evenly spaced contiguous rows. `gather_unit` is the longest such unit (0: the chain does not qualify);
`gather_offsets` gives, for some of the node's rows, the element offset of each of their units in that
view, so that unit u of those rows is ``window[offsets[u]]`` in the view's `windows`. Everything is decided
from shapes, strides and index arrays: like `view_of`, this reads no bytes and works over stand-in bases
as well as over the real maps.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> x = ops.const(np.arange(96, dtype=np.float32).reshape(6, 16))
    >>> rope = ops.reshape(ops.take(ops.reshape(x, (2, 3, 16)), [2, 0, 1], 1), (6, 16))
    >>> g = row_gather(rope, range(0, 6), lambda n: n.arg.array)
    >>> g.unit, g.offsets.tolist()  # rows 2 0 1 of the first head, 5 3 4 of the second
    (16, [32, 0, 16, 80, 48, 64])
    >>> g.windows[g.offsets][1][:4].tolist()  # row 1 of the permuted tensor: row 0 of x
    [0.0, 1.0, 2.0, 3.0]
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Union

import numpy as np

from .layout import row_size, view_of
from .node import Node
from .opcodes import GroupOp, Op, OpTable

Rows = Union[range, np.ndarray]

# Units shorter than this many bytes are not worth a gather (the per-unit loop overhead, and the index
# itself, would rival the bytes moved): such chains are computed as before.
MIN_UNIT_BYTES = 64


class Gather(NamedTuple):
    """Rows of a node as units of a view: unit u is ``windows[offsets[u]]`` (`unit` elements each)."""

    windows: np.ndarray  # 2-D (start element, unit): every run of `unit` elements of the view's span
    offsets: np.ndarray  # int64 element offsets of the units, in the node's C order
    unit: int


# One rule per layout op: (the longest run of output elements it moves as one piece, a function mapping
# output unit ids to input unit ids for a given unit length).
GATHER = OpTable("row gather", skip=GroupOp.Leaf | (frozenset(Op) - GroupOp.Layout))


class Move(NamedTuple):
    """How a gather moves data: in runs of `run` elements, and the function mapping output units to source units."""

    run: int  # every unit must divide this
    source_units: Callable[[Node, np.ndarray, int], np.ndarray]


def _remap(ids: np.ndarray, per_run: int, out_lead: tuple, in_lead: tuple, coords_in) -> np.ndarray:
    """Unit ids of an output whose leading axes `out_lead` map to input leading axes `in_lead` through
    `coords_in` (output coordinates -> input coordinates), `per_run` units of trailing elements moving
    together. (Runs once per block: one- and two-axis leads, the common case, skip numpy's general
    unravel/ravel, which cost 30 us a block.)"""
    lead, within = (ids, None) if per_run == 1 else np.divmod(ids, per_run)
    coords: tuple[np.ndarray, ...]
    if len(out_lead) == 1:
        coords = (lead,)
    elif len(out_lead) == 2:
        coords = np.divmod(lead, out_lead[1])
    else:
        coords = np.unravel_index(lead, out_lead)
    src = coords_in(coords)
    if len(in_lead) == 1:
        lead_in = src[0]
    elif len(in_lead) == 2:
        lead_in = src[0] * in_lead[1] + src[1]
    else:
        lead_in = np.ravel_multi_index(src, in_lead)
    return lead_in if within is None else lead_in * per_run + within


@GATHER.register(Op.RESHAPE)
def _gather_reshape(node: Node) -> Move:
    return Move(max(1, node.size), lambda n, ids, unit: ids)  # C order is kept: the same units


@GATHER.register(Op.TAKE)
def _gather_take(node: Node) -> Move:
    axis, idx = node.arg
    run = math.prod(node.shape[axis + 1:])
    outer = math.prod(node.shape[:axis])
    n_in = node.srcs[0].shape[axis]

    def source_units(n, ids, unit):
        return _remap(ids, run // unit, (outer, len(idx)), (outer, n_in), lambda c: (c[0], idx.values(c[1])))

    return Move(run, source_units)


@GATHER.register(Op.SLICE)
def _gather_slice(node: Node) -> Move:
    src = node.srcs[0]
    k = max(i for i, (r, d) in enumerate(zip(node.arg, src.shape)) if r != (0, d, 1)) + 1  # axes k.. untouched
    run = math.prod(node.shape[k:])
    starts, steps = [a for a, _, _ in node.arg[:k]], [s for _, _, s in node.arg[:k]]

    def source_units(n, ids, unit):
        return _remap(ids, run // unit, node.shape[:k], src.shape[:k],
                      lambda c: tuple(a + s * x for a, s, x in zip(starts, steps, c)))

    return Move(run, source_units)


@GATHER.register(Op.PERMUTE)
def _gather_permute(node: Node) -> Move:
    axes, src = node.arg, node.srcs[0]
    k = max(i for i, a in enumerate(axes) if a != i) + 1  # axes k.. untouched (the identity never gets here)
    run = math.prod(node.shape[k:])

    def coords_in(c):
        out = [None] * k
        for i in range(k):
            out[axes[i]] = c[i]
        return tuple(out)

    def source_units(n, ids, unit):
        return _remap(ids, run // unit, node.shape[:k], src.shape[:k], coords_in)

    return Move(run, source_units)


def table_run(v: np.ndarray) -> int:
    """The row length of `v` seen as a table of evenly spaced contiguous rows, ``v.reshape(-1, run)``
    without copying (the longest such run), or 0 when it is none (its last axis is strided)."""
    if v.ndim == 0 or v.size == 0:
        return 0
    run, axis = 1, v.ndim
    while axis > 0 and (v.shape[axis - 1] == 1 or v.strides[axis - 1] == run * v.itemsize):
        axis -= 1
        run *= v.shape[axis]
    if run == 1 and v.ndim and v.shape[-1] != 1:
        return 0
    lead = [(n, s) for n, s in zip(v.shape[:axis], v.strides[:axis]) if n != 1]
    # The leading axes must fold into one evenly spaced axis of rows.
    for (_, s0), (n1, s1) in zip(lead, lead[1:]):
        if s0 != s1 * n1:
            return 0
    if lead and lead[-1][1] % v.itemsize:
        return 0
    return run


def _memo(cache: dict | None, key: tuple, make: Callable[[], Any]) -> Any:
    """`make()`, remembered in `cache` (the executors share one per step, so blocks after the first skip
    this module's analysis; keys are tuples, which never equal the `Node` keys `view_of` stores)."""
    if cache is None:
        return make()
    try:
        return cache[key]
    except KeyError:
        value = cache[key] = make()
        return value


def _table_run_of(node: Node, base_of, cache) -> int:
    def make():
        v = view_of(node, base_of, cache)
        return table_run(v) if v is not None else 0

    return _memo(cache, ("table run", node), make)


def _max_unit(node: Node, base_of, cache) -> int:
    run = _table_run_of(node, base_of, cache)
    if run:
        return run
    if node.op not in GroupOp.Layout:
        return 0
    below = _max_unit(node.srcs[0], base_of, cache)
    return math.gcd(below, GATHER[node.op](node).run) if below else 0


def gather_unit(node: Node, base_of: Callable[[Node], np.ndarray], cache: dict | None = None) -> int:
    """Elements per unit when `node`'s rows are gathered units of a view (see the module docstring), or 0
    when they are not, or the units would be too short to gain anything, or `node` is a view itself."""
    def make():
        if node.op not in GroupOp.Layout or not node.size or view_of(node, base_of, cache) is not None:
            return 0
        longest = _max_unit(node, base_of, cache)
        unit = math.gcd(longest, row_size(node)) if longest else 0  # (gcd(0, n) is n)
        return unit if unit * node.dtype.size_in_bytes >= MIN_UNIT_BYTES else 0

    return _memo(cache, ("gather unit", node), make)


class _Plan(NamedTuple):
    """What every block of one node's gather shares (worked out by its first block)."""

    unit: int
    per_row: int  # units per row of the node
    moves: tuple  # (node, Move) from the node down to the view, exclusive
    windows: np.ndarray
    rows: int  # rows of the view's table
    step: int  # elements between the table's rows
    units_per_row: int  # units per row of the table
    backwards: bool  # the table's rows run backwards in memory


def _plan(node: Node, base_of, cache) -> _Plan | None:
    def make():
        unit = gather_unit(node, base_of, cache)
        if not unit:
            return None
        moves, n = [], node
        while not _table_run_of(n, base_of, cache):
            moves.append((n, GATHER[n.op](n)))
            n = n.srcs[0]
        view = view_of(n, base_of, cache)
        assert view is not None  # the loop stopped at a table run, and only a view has one (_table_run_of)
        return _Plan(unit, row_size(node) // unit, tuple(moves), *_table(view, unit))

    return _memo(cache, ("gather plan", node), make)


def row_gather(node: Node, rows: Rows, base_of: Callable[[Node], np.ndarray],
               cache: dict | None = None) -> Gather | None:
    """Rows `rows` of `node` as a `Gather` over the view at the bottom of its chain, or None if the chain
    does not qualify (`gather_unit` is 0)."""
    plan = _plan(node, base_of, cache)
    if plan is None:
        return None
    unit, per_row = plan.unit, plan.per_row
    if isinstance(rows, range):
        ids = np.arange(rows.start * per_row, rows.stop * per_row, dtype=np.int64)
    else:
        ids = (np.asarray(rows, np.int64)[:, None] * per_row + np.arange(per_row)).reshape(-1)
    for n, move in plan.moves:
        ids = move.source_units(n, ids, unit)
    row, within = (ids, None) if plan.units_per_row == 1 else np.divmod(ids, plan.units_per_row)
    if plan.backwards:
        row = (plan.rows - 1) - row  # offsets count from the lowest row
    offsets = row * plan.step if within is None else row * plan.step + within * unit
    return Gather(plan.windows, offsets.astype(np.int64, copy=False), unit)


def _table(v: np.ndarray, unit: int) -> tuple[np.ndarray, int, int, int, bool]:
    """The table view `v` (rows of `table_run(v)` elements) cut into units: (every run of `unit` elements
    of its span as a 2-D view, its rows, the distance between rows in elements, units per row, whether its
    rows run backwards in memory)."""
    run = table_run(v)
    table = v.reshape(-1, run)  # a view: table_run said so
    n = table.shape[0]
    row_step = table.strides[0] // table.itemsize if n > 1 else 0
    lowest = table[n - 1] if row_step < 0 else table[0]  # the row at the lowest address
    span_len = (n - 1) * abs(row_step) + run
    # Every run of `unit` elements of the span, one per starting element: a view, nothing is copied.
    windows = np.lib.stride_tricks.as_strided(lowest, shape=(span_len - unit + 1, unit),
                                              strides=(table.itemsize, table.itemsize), writeable=False)
    return windows, n, abs(row_step), run // unit, row_step < 0
