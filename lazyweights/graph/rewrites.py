"""Rewrites: pure functions from nodes to equivalent nodes that execute better.

`sink_casts` moves value casts above layout ops (`permute(cast(x))` -> `cast(permute(x))`), which is
exact because a cast is elementwise. Afterwards every chain is "layout ops over sources, value ops on
top", so the layout part is a zero-copy strided view of the memory map and the fused executor reads each
source byte once and converts it straight into the output block. Slicing and gathering before the cast
also means converting only the elements that survive.

(Cast-of-cast folding, identity removal and permute/reshape composition happen when nodes are built, in
`ops.py`.)

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> from lazyweights.graph.rewrites import sink_casts
    >>> x = ops.const(np.zeros((2, 3), np.float32))
    >>> sink_casts(ops.permute(ops.cast(x, "float16"), (1, 0))).op
    'cast'
"""
from __future__ import annotations

from .node import Node, toposort
from . import ops

_LAYOUT = ("reshape", "permute", "slice", "take")
_ELEMENTWISE = ("cast",)


def sink_casts(root: Node) -> Node:
    """`root` with elementwise casts moved above layout ops (same values, same bytes)."""
    done: dict[Node, Node] = {}
    for n in toposort([root]):
        srcs = tuple(done[s] for s in n.srcs)
        new = n if srcs == n.srcs else _rebuild(n, srcs)
        if new.op in _LAYOUT and new.srcs[0].op in _ELEMENTWISE:
            inner = new.srcs[0]
            new = ops.cast(_rebuild(new, (inner.srcs[0],)), inner.dtype)
        elif new.op == "concat" and all(s.op == "cast" for s in new.srcs):
            inner_dtypes = {s.srcs[0].dtype for s in new.srcs}
            if len(inner_dtypes) == 1:
                new = ops.cast(ops.concat([s.srcs[0] for s in new.srcs], new.arg), new.dtype)
        done[n] = new
    return done[root]


def _rebuild(n: Node, srcs: tuple[Node, ...]) -> Node:
    """The same op with new inputs (of the same dtype/shape role), through the validating constructors."""
    op, arg = n.op, n.arg
    if op == "reshape":
        return ops.reshape(srcs[0], arg)
    if op == "permute":
        return ops.permute(srcs[0], arg)
    if op == "slice":
        return ops.slice_(srcs[0], arg)
    if op == "take":
        axis, idx = arg
        return ops.take(srcs[0], idx.array, axis)
    if op == "cast":
        return ops.cast(srcs[0], arg)
    if op == "bitcast":
        return ops.bitcast(srcs[0], arg)
    if op == "concat":
        return ops.concat(list(srcs), arg)
    if op == "dequantize":
        return ops.dequantize(srcs[0], *arg)
    if op == "quantize":
        return ops.quantize(srcs[0], arg)
    if op == "binary":
        from .elementwise import binary

        return binary(arg, srcs[0], srcs[1])
    return Node(op, srcs, arg, n.dtype, n.shape)
