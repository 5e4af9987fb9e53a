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

import math

from . import ops
from .elementwise import binary, unary
from .layout import strided_layout
from .lora import lora_update
from .lora import rebuild as lora_rebuild
from .node import Node, toposort
from .opcodes import GroupOp, Op, OpTable
from .scatter import rebuild as scatter_rebuild


def sink_casts(root: Node) -> Node:
    """`root` with elementwise casts moved above layout ops (same values, same bytes)."""
    done: dict[Node, Node] = {}
    for n in toposort([root]):
        srcs = tuple(done[s] for s in n.srcs)
        new = n if srcs == n.srcs else _rebuild(n, srcs)
        if new.op in GroupOp.Layout and new.srcs[0].op is Op.CAST:
            inner = new.srcs[0]
            new = ops.cast(_rebuild(new, (inner.srcs[0],)), inner.dtype)
        elif new.op is Op.CONCAT and all(s.op is Op.CAST for s in new.srcs):
            inner_dtypes = {s.srcs[0].dtype for s in new.srcs}
            if len(inner_dtypes) == 1:
                new = ops.cast(ops.concat([s.srcs[0] for s in new.srcs], new.arg), new.dtype)
        done[n] = new
    return done[root]


def sink_slices(root: Node) -> Node:
    """`root` with every slice moved down its chain as far as it goes exactly (same values, same bytes).

    Why: a tensor-parallel rank slices the adapter's output (`lazyweights.shard`), but the adapter has
    already reshaped, permuted and gathered the source (the q/k RoPE row permutation is a reshape, a take
    and a reshape back). A slice left on top reads the whole source and then keeps a quarter; sunk to the
    source it reads only the rank's rows, which over object storage is the whole point. The slice passes:
    a permute (its ranges permuted), a take (its indices sliced; an affine list stays five integers), a cast,
    a unary or binary elementwise op (each operand's box; a broadcast axis stays whole: an FP8 weight times
    its expanded block scales), a dequantize (elementwise per row; its last axis must stay whole), another
    slice (composed), a reshape when only axis 0 is sliced, with step 1, on boundaries that are whole rows of
    the reshape's input, and a LoRA update (W's box, B's rows and A's columns: each output element is the same
    dot product over r).

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> w = ops.const(np.arange(8 * 4, dtype=np.float32).reshape(8, 4))
        >>> heads = ops.reshape(ops.take(ops.reshape(w, (2, 4, 4)), [0, 2, 1, 3], 1), (8, 4))  # a RoPE-like permute
        >>> sunk = sink_slices(ops.slice_(heads, ((0, 4, 1), (0, 4, 1))))
        >>> [n.op for n in toposort([sunk])], sunk.shape
        (['const', 'slice', 'reshape', 'take', 'reshape'], (4, 4))
    """
    done: dict[Node, Node] = {}
    for n in toposort([root]):
        srcs = tuple(done[s] for s in n.srcs)
        new = n if srcs == n.srcs else _rebuild(n, srcs)
        if new.op is Op.SLICE:
            new = _slice_below(new.srcs[0], new.arg)
        done[n] = new
    assert done[root].shape == root.shape and done[root].dtype is root.dtype, (done[root], root)
    return done[root]


def _first_src(x: Node) -> Node:
    """`x`'s first input, or `x` itself for a leaf (the op cases that read it never see a leaf)."""
    return x.srcs[0] if x.srcs else x


def _full(x: Node, axis: int) -> tuple[int, int, int]:
    return (0, x.shape[axis], 1)


def _slice_below(x: Node, slices: tuple) -> Node:
    """`ops.slice_(x, slices)` (normalized ranges), built with the slice as close to the sources as it goes."""
    slices = tuple(slices)
    if all(r == _full(x, i) for i, r in enumerate(slices)):
        return x
    op, src = x.op, _first_src(x)
    if op is Op.PERMUTE:
        unpermuted: list = [None] * x.ndim
        for out_axis, in_axis in enumerate(x.arg):
            unpermuted[in_axis] = slices[out_axis]
        return ops.permute(_slice_below(src, tuple(unpermuted)), x.arg)
    if op is Op.TAKE:
        axis, index = x.arg
        start, stop, step = slices[axis]
        whole_axis = slices[:axis] + (_full(src, axis),) + slices[axis + 1:]
        return ops.take(_slice_below(src, whole_axis), index[start:stop:step], axis)
    if op is Op.CAST:
        return ops.cast(_slice_below(src, slices), x.dtype)
    if op is Op.UNARY:  # elementwise: the same box of its input
        return unary(x.arg, _slice_below(src, slices))
    if op is Op.BINARY:  # elementwise: each operand's box (operands have the output's rank), a broadcast axis whole
        return binary(x.arg, *(_slice_below(s, tuple(r if d == x.shape[i] else _full(s, i)
                                                      for i, (r, d) in enumerate(zip(slices, s.shape))))
                               for s in x.srcs))
    if op is Op.DEQUANTIZE and slices[-1] == _full(x, x.ndim - 1):
        return ops.dequantize(_slice_below(src, slices[:-1] + (_full(src, src.ndim - 1),)), *x.arg)
    if op is Op.SLICE:
        composed = []
        for (s0, _, st0), (s1, e1, st1) in zip(x.arg, slices):
            count = len(range(s1, e1, st1))
            start = s0 + s1 * st0
            composed.append((start, start + count * st0 * st1, st0 * st1))
        return _slice_below(src, tuple(composed))
    if op is Op.RESHAPE and x.ndim and src.ndim and slices[0][2] == 1 and all(
            r == _full(x, i) for i, r in enumerate(slices) if i):
        inner = _reshape_box(src.shape, slices[0][0] * math.prod(x.shape[1:]), slices[0][1] * math.prod(x.shape[1:]))
        if inner is not None:
            return ops.reshape(_slice_below(src, inner), (slices[0][1] - slices[0][0],) + x.shape[1:])
    if op is Op.LORA:  # W's box, B's rows and A's columns under it (swapped for a transposed update)
        rows, cols = slices
        out = _slice_below(src, slices)
        for i, (scale, transposed) in enumerate(x.arg):
            b, a = x.srcs[1 + 2 * i], x.srcs[2 + 2 * i]
            b_rows, a_cols = (cols, rows) if transposed else (rows, cols)
            out = lora_update(out, _slice_below(b, (b_rows, _full(b, 1))), _slice_below(a, (_full(a, 0), a_cols)),
                              scale, transposed)
        return out
    return ops.slice_(x, slices)


def _reshape_box(shape: tuple, flat_start: int, flat_stop: int) -> tuple | None:
    """The slice of an array of `shape` holding exactly its C-order elements [flat_start, flat_stop), or
    None if they are not one box: one index on the leading axes, a range on one axis, the rest whole
    (rows [0, 32) of a [128, D] reshape of [2, 64, D] are head 0's rows [0, 32))."""
    if flat_stop <= flat_start:
        return None
    for j in range(len(shape)):
        inner = math.prod(shape[j + 1:])
        outer = inner * shape[j]
        if inner == 0 or flat_start % inner or flat_stop % inner or flat_start // outer != (flat_stop - 1) // outer:
            continue
        lead, rest = [], flat_start // outer
        for dim in reversed(shape[:j]):
            rest, index = divmod(rest, dim)
            lead.append((index, index + 1, 1))
        first = (flat_start // inner) % shape[j]
        axis_j = (first, first + (flat_stop - flat_start) // inner, 1)
        return tuple(reversed(lead)) + (axis_j,) + tuple((0, d, 1) for d in shape[j + 1:])
    return None


# Each op rebuilt over new inputs through its validating constructor (so rewrites keep every build-time check).
REBUILD = OpTable("rebuild", skip=GroupOp.Leaf)
REBUILD.register(Op.RESHAPE)(lambda n, srcs: ops.reshape(srcs[0], n.arg))
REBUILD.register(Op.PERMUTE)(lambda n, srcs: ops.permute(srcs[0], n.arg))
REBUILD.register(Op.SLICE)(lambda n, srcs: ops.slice_(srcs[0], n.arg))
REBUILD.register(Op.TAKE)(lambda n, srcs: ops.take(srcs[0], n.arg[1], n.arg[0]))
REBUILD.register(Op.CAST)(lambda n, srcs: ops.cast(srcs[0], n.arg))
REBUILD.register(Op.BITCAST)(lambda n, srcs: ops.bitcast(srcs[0], n.arg))
REBUILD.register(Op.CONCAT)(lambda n, srcs: ops.concat(list(srcs), n.arg))
REBUILD.register(Op.DEQUANTIZE)(lambda n, srcs: ops.dequantize(srcs[0], *n.arg))
REBUILD.register(Op.QUANTIZE)(lambda n, srcs: ops.quantize(srcs[0], *n.arg))
REBUILD.register(Op.BINARY)(lambda n, srcs: binary(n.arg, srcs[0], srcs[1]))
REBUILD.register(Op.UNARY)(lambda n, srcs: unary(n.arg, srcs[0]))
REBUILD.register(Op.LORA)(lora_rebuild)
REBUILD.register(Op.SCATTER)(scatter_rebuild)


def _rebuild(n: Node, srcs: tuple[Node, ...]) -> Node:
    """The same op with new inputs (of the same dtype/shape role), through the validating constructors."""
    return REBUILD[n.op](n, srcs)


def merge_leading_axes(root: Node, view_cache: dict | None = None) -> Node | None:
    """An equivalent of ``reshape(root, (d0 * d1,) + rest)`` built so that its rows come from its inputs'
    rows, or None where some op in the chain does not allow that. `view_cache` is `strided_layout`'s.

    Why: blocks are cut along axis 0, and a block holds at least one row. For a stacked MoE tensor
    (``stack([concat([w1_e, w3_e]) for e])``, [8, 28672, 4096] bf16 in Mixtral 8x7B) one row is one expert,
    235 MB, so a step needed about 700 MB of working memory and a budget below that was a BudgetError.
    Merging the two leading axes pushes the reshape down to the sources (a stack becomes a concat of its
    parts' rows, a concat along axis 1 an interleave of row slices), so rows are [rest] sized again. The
    result has the same bytes in the same C order: only the shape seen by the executor changes.

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> parts = [ops.const(np.full((2, 3), e, np.float32)) for e in range(4)]
        >>> stacked = ops.concat([ops.reshape(p, (1, 2, 3)) for p in parts], 0)  # stack: [4, 2, 3]
        >>> merged = merge_leading_axes(ops.cast(stacked, "float16"))
        >>> merged.shape, merged.op, merged.srcs[0].op
        ((8, 3), 'cast', 'concat')
    """
    merged = _merge(root, {}, {} if view_cache is None else view_cache)
    assert merged is None or (merged.shape == _merged_shape(root) and merged.dtype is root.dtype), (merged, root)
    return merged


def _merged_shape(n: Node) -> tuple[int, ...]:
    return (n.shape[0] * n.shape[1],) + n.shape[2:]


def _merge(n: Node, memo: dict, views: dict) -> Node | None:
    if n not in memo:
        memo[n] = _merge_one(n, memo, views)
    return memo[n]


def _merge_one(n: Node, memo: dict, views: dict) -> Node | None:
    if n.ndim < 3:
        return None
    target = _merged_shape(n)
    if strided_layout(n, views) is not None:
        merged = ops.reshape(n, target)  # a strided view that cannot merge stays whole
        return merged if strided_layout(merged, views) is not None else None
    op, src = n.op, _first_src(n)
    if op is Op.RESHAPE:
        if src.shape == target:  # e.g. stack's [1, R, C] over an [R, C] part
            return src
        if src.ndim >= 3 and _merged_shape(src) == target:
            return _merge(src, memo, views)
        return None
    if op is Op.CAST:
        m = _merge(src, memo, views)
        return None if m is None else ops.cast(m, n.dtype)
    if op is Op.UNARY:
        m = _merge(src, memo, views)
        return None if m is None else unary(n.arg, m)
    if op is Op.BITCAST:
        m = _merge(src, memo, views) if src.ndim == n.ndim else None
        return None if m is None else ops.bitcast(m, n.dtype)
    if op is Op.QUANTIZE and n.arg.importance is not None and n.arg.importance.array.ndim == 2:
        return None  # per-expert importance: the expert axis must stay axis 0
    if op in (Op.DEQUANTIZE, Op.QUANTIZE):
        m = _merge(src, memo, views)
        if m is None:
            return None
        return ops.dequantize(m, *n.arg) if op is Op.DEQUANTIZE else ops.quantize(m, *n.arg)
    if op is Op.PERMUTE:
        axes = n.arg
        if axes[:2] != (0, 1):
            return None
        m = _merge(src, memo, views)
        return None if m is None else ops.permute(m, (0,) + tuple(a - 1 for a in axes[2:]))
    if op is Op.SLICE:
        (a, b, step), (a1, b1, step1) = n.arg[0], n.arg[1]
        d1 = src.shape[1]
        if step != 1 or (a1, b1, step1) != (0, d1, 1):
            return None
        m = _merge(src, memo, views)
        return None if m is None else ops.slice_(m, ((a * d1, b * d1, 1),) + tuple(n.arg[2:]))
    if op is Op.TAKE:
        axis, idx = n.arg
        if axis < 2:
            return None
        m = _merge(src, memo, views)
        return None if m is None else ops.take(m, idx, axis - 1)
    if op is Op.BINARY:
        if any(s.shape != n.shape for s in n.srcs):
            return None  # broadcasting along the merged axes
        a, b = (_merge(s, memo, views) for s in n.srcs)
        if a is None or b is None:
            return None
        return binary(n.arg, a, b)
    if op is Op.CONCAT:
        maybe = [_merge(s, memo, views) for s in n.srcs]
        parts = [p for p in maybe if p is not None]
        if len(parts) != len(maybe):
            return None
        if n.arg == 0:
            return ops.concat(parts, 0)
        if n.arg >= 2:
            return ops.concat(parts, n.arg - 1)
        # Along axis 1: for each leading index e, every part's rows for e, in order.
        pieces = []
        for e in range(n.shape[0]):
            for s, p in zip(n.srcs, parts):
                r = s.shape[1]
                pieces.append(ops.slice_(p, ((e * r, (e + 1) * r, 1),) + tuple((0, d, 1) for d in p.shape[1:])))
        return ops.concat(pieces, 0)
    return None
