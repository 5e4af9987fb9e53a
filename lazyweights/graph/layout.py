"""Layout facts about a node, decided from shapes and strides alone: is it a strided view of its source's
bytes, and at which row multiple do its blocks line up with its inputs' rows.

Views. Reshape, permute, slice and bitcast can often be served as a strided numpy view of a source's bytes
(a memory map, or a constant array) instead of being computed. Whether they can is exactly numpy's rule
(e.g. a reshape of a transposed array is a view only when no copy is needed), so `view_of` replays the
chain with numpy on whatever base arrays it is given. The compiler gives it *stand-in* bases: arrays with
the source's shape, dtype and strides over no memory at all, whose views carry only shape, strides and
offset. Nothing is read, no file is mapped or even stat'ed, and `strided_layout` answers the question before
any byte exists. The run layer replays the same function over the real maps (`run/blocks.full_view`), so
the compiler's answer and the executor's view cannot disagree.

Rows. Executors cut a step into blocks of rows along axis 0; `row_alignment` is the row multiple at which a
block's rows pull whole rows from every input (so no input row is read by two blocks).

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> x = ops.const(np.zeros((4, 6), np.float32))
    >>> strided_layout(ops.permute(x, (1, 0))).strides, strided_layout(ops.cast(x, "float16"))
    ((4, 24), None)
    >>> row_alignment(ops.reshape(x, (8, 3)))
    2
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from .node import Node
from .opcodes import GroupOp, Op, OpTable

# Only the ops of GroupOp.View can stay views; every other op is computed.
VIEW = OpTable("strided view", skip=GroupOp.Leaf | (frozenset(Op) - GroupOp.View))
ROW_ALIGN = OpTable("row alignment", skip=GroupOp.Leaf)


def nrows(node: Node) -> int:
    """Rows along axis 0 (1 for a 0-d node)."""
    return node.shape[0] if node.shape else 1


def row_size(node: Node) -> int:
    """Elements per row of axis 0 (the whole tensor for 0-d)."""
    return math.prod(node.shape[1:]) if node.shape else 1


# --- views -----------------------------------------------------------------------------------------------
def view_of(node: Node, base_of: Callable[[Node], np.ndarray], cache: dict | None = None) -> np.ndarray | None:
    """`node` as a numpy view of the arrays `base_of` gives for its leaves, or None if it must be computed."""
    op = node.op
    if op not in GroupOp.View and op not in GroupOp.Leaf:
        return None  # computed: nothing to look up or remember
    if cache is not None and node in cache:
        return cache[node]
    v: np.ndarray | None
    if node.op in GroupOp.Leaf:
        v = base_of(node)
    else:
        v = view_of(node.srcs[0], base_of, cache) if node.op in GroupOp.View else None
        if v is not None:
            v = VIEW[node.op](node, v)
    if cache is not None:
        cache[node] = v
    return v


@VIEW.register(Op.RESHAPE)
def _view_reshape(node: Node, v: np.ndarray):
    try:
        return np.reshape(v, node.shape, copy=False)
    except ValueError:
        return None  # numpy would have to copy: not a view


@VIEW.register(Op.PERMUTE)
def _view_permute(node: Node, v: np.ndarray):
    return v.transpose(node.arg)


@VIEW.register(Op.SLICE)
def _view_slice(node: Node, v: np.ndarray):
    return v[tuple(slice(a, b, c) for a, b, c in node.arg)]


@VIEW.register(Op.BITCAST)
def _view_bitcast(node: Node, v: np.ndarray):
    if v.dtype.itemsize == node.dtype.size_in_bytes:
        return v.view(node.dtype.to_numpy())
    if v.ndim and v.strides[-1] == v.dtype.itemsize and v.flags.c_contiguous:
        return v.view(node.dtype.to_numpy())
    return None


class Layout(NamedTuple):
    """Where a view's elements are: byte `offset` from its leaf's first byte, `shape`, byte `strides`."""

    leaf: Node
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    c_contiguous: bool


# Stand-in bases point here; their views are never read, only their shape/strides/offset are looked at.
_ANCHOR = np.zeros(1, np.uint8)
_UINT = {1: "|u1", 2: "<u2", 4: "<u4", 8: "<u8"}


class _StandIn:
    """An array interface over no memory: numpy computes views of it without touching a byte."""

    def __init__(self, shape, strides, itemsize: int):
        self.__array_interface__ = {"data": (_ANCHOR.ctypes.data, True), "shape": tuple(shape),
                                    "strides": tuple(strides), "typestr": _UINT[itemsize], "version": 3}


def stand_in(node: Node) -> np.ndarray:
    """A leaf's stand-in base: its dtype, shape and strides (C order for sources) over no memory."""
    if node.op is Op.CONST:
        shape, strides = node.arg.array.shape, node.arg.array.strides
    else:
        shape, item = node.shape, node.dtype.size_in_bytes
        strides = tuple(int(math.prod(shape[i + 1:])) * item for i in range(len(shape)))
    return np.asarray(_StandIn(shape, strides, node.dtype.size_in_bytes)).view(node.dtype.to_numpy())


def strided_layout(node: Node, cache: dict | None = None) -> Layout | None:
    """Where `node`'s elements lie in its leaf's bytes if it is a zero-copy view of them, else None. Pure."""
    v = view_of(node, stand_in, cache)
    if v is None:
        return None
    leaf = node
    while leaf.op not in GroupOp.Leaf:
        leaf = leaf.srcs[0]
    offset = v.__array_interface__["data"][0] - _ANCHOR.ctypes.data
    return Layout(leaf, offset, v.shape, v.strides, bool(v.flags.c_contiguous))


# --- row alignment -----------------------------------------------------------------------------------------
def row_alignment(node: Node) -> int:
    """The row multiple at which `node`'s blocks line up with every input's rows (so no row is read twice)."""
    if node.op in GroupOp.Leaf or not node.shape:
        return 1
    return ROW_ALIGN[node.op](node)


@ROW_ALIGN.register(Op.RESHAPE)
def _align_reshape(node: Node) -> int:
    src = node.srcs[0]
    if not src.shape:
        return 1
    r_out, r_in = row_size(node), row_size(src)
    if r_out == 0 or r_in == 0:
        return 1
    unit = r_in * row_alignment(src)
    return unit // math.gcd(r_out, unit)


@ROW_ALIGN.register(Op.SLICE)
def _align_slice(node: Node) -> int:
    a, _, step = node.arg[0]
    g = row_alignment(node.srcs[0])
    return g if (step == 1 and a % g == 0) else 1


@ROW_ALIGN.register(Op.BINARY, Op.UNARY)
def _align_all_inputs(node: Node) -> int:
    return math.lcm(*[row_alignment(s) for s in node.srcs])


@ROW_ALIGN.register(Op.LORA)
def _align_lora(node: Node) -> int:
    # W's rows and, for an adapter that is not transposed, B's rows follow the output rows; A is read whole.
    pairs = [node.srcs[1 + 2 * i] for i, (_, transposed) in enumerate(node.arg) if not transposed]
    return math.lcm(*[row_alignment(s) for s in [node.srcs[0], *pairs]])


@ROW_ALIGN.register(Op.SCATTER)
def _align_scatter(node: Node) -> int:
    # The bitmask's rows (and [rows, k] values' rows) follow the output rows; flat values are cut at row offsets.
    return math.lcm(*[row_alignment(s) for s in node.srcs if s.ndim == 2])


@ROW_ALIGN.register(Op.BITCAST)
def _align_bitcast(node: Node) -> int:
    src = node.srcs[0]
    a, b = src.dtype.size_in_bytes, node.dtype.size_in_bytes
    if node.ndim == 1 and a != b:
        return a // math.gcd(a, b)  # output rows whose bytes start on an input element boundary
    return row_alignment(src)


@ROW_ALIGN.register(Op.CAST, Op.DEQUANTIZE, Op.QUANTIZE)
def _align_rowwise(node: Node) -> int:
    return row_alignment(node.srcs[0])


@ROW_ALIGN.register(Op.TAKE)
def _align_take(node: Node) -> int:
    return 1 if node.arg[0] == 0 else row_alignment(node.srcs[0])


@ROW_ALIGN.register(Op.PERMUTE)
def _align_permute(node: Node) -> int:
    return row_alignment(node.srcs[0]) if node.arg[0] == 0 else 1


@ROW_ALIGN.register(Op.CONCAT)
def _align_concat(node: Node) -> int:
    return math.lcm(*[row_alignment(s) for s in node.srcs]) if node.arg != 0 else 1
