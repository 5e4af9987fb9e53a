"""Fused block evaluation: compute rows [r0, r1) of a node's output, pulling only the rows it needs.

This is how one tensor's whole chain runs as a single pass. A block of output rows asks its input for
exactly the rows it depends on, down to the memory map; layout ops over sources are zero-copy strided
views (`full_view`), and the value op on top (cast, dequantize) writes straight into the destination
block. Temporaries are block-sized, never tensor-sized, so working memory is bounded by the block size.

`rows` is either a `range` (contiguous rows, step 1) or a 1-D int64 array (gathered rows, from a `take`
along axis 0). Every op accepts any row range; block boundaries are chosen (`row_alignment`) so that the
rows a block pulls from its inputs line up with theirs and nothing is read twice.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> from lazyweights.run.blocks import pull
    >>> x = ops.const(np.arange(12, dtype=np.float32).reshape(4, 3))
    >>> pull(ops.cast(ops.permute(x, (1, 0)), "float16"), range(1, 3)).tolist()
    [[1.0, 4.0, 7.0, 10.0], [2.0, 5.0, 8.0, 11.0]]
"""
from __future__ import annotations

from typing import Union

import numpy as np

from ..graph.gather import Gather, row_gather
from ..graph.layout import nrows, row_size, view_of
from ..graph.node import Node
from ..graph.opcodes import GroupOp, Op, OpTable

Rows = Union[range, np.ndarray]

# The fused CPU kernel of each op: rows of its value from rows of its inputs. Leaves are always views.
PULL = OpTable("CPU pull", skip=GroupOp.Leaf)


def real_base(node: Node) -> np.ndarray:
    """A leaf's actual bytes: a source's read-only memory-map view (after its identity check), a constant.

    A remote source's mirror is taken as it is (`fetch=False`): the sinks fetched the step's exact byte
    ranges before its first block (`run/fetch.fetch_step_sources`)."""
    return node.arg.array(fetch=False) if node.op is Op.SOURCE else node.arg.array


def full_view(node: Node, cache: dict | None = None) -> np.ndarray | None:
    """The whole node as a zero-copy numpy view of its source, or None if it needs computation.

    The same replay the compiler decided with (`graph.layout.view_of`), here over the real maps."""
    return view_of(node, real_base, cache)


def gathered(node: Node, rows: Rows, cache: dict | None = None) -> Gather | None:
    """Rows `rows` of `node` as units of a zero-copy view of a source picked by an index (a RoPE row
    permutation over a memory map), or None when `node` is a view itself or not such a gather. The value
    op above reads them in place (`kernels.casts.gather_cast_into`) instead of pulling a gathered copy."""
    return row_gather(node, rows, real_base, cache)


def _select(v: np.ndarray, rows: Rows) -> np.ndarray:
    if v.ndim == 0:
        return v
    if isinstance(rows, range):
        return v[rows.start:rows.stop]
    return v[rows]


# --- pulling rows ----------------------------------------------------------------------------------------
def pull(node: Node, rows: Rows, cache: dict | None = None) -> np.ndarray:
    """Rows `rows` of `node`'s value (axis 0; for 0-d nodes, the whole value)."""
    v = full_view(node, cache)
    if v is not None:
        return _select(v, rows)
    return PULL[node.op](node, rows, cache)


@PULL.register(Op.CAST)
def _pull_cast(node: Node, rows: Rows, cache) -> np.ndarray:
    from ..kernels.casts import cast, gather_cast_into

    g = gathered(node.srcs[0], rows, cache)
    if g is not None:
        out = np.empty((len(rows),) + node.shape[1:], node.dtype.to_numpy())
        gather_cast_into(g.windows, g.offsets, out.reshape(-1, g.unit))
        return out
    return cast(pull(node.srcs[0], rows, cache), node.dtype.to_numpy())


@PULL.register(Op.BITCAST)
def _pull_bitcast(node: Node, rows: Rows, cache) -> np.ndarray:
    src = node.srcs[0]
    a, b = src.dtype.size_in_bytes, node.dtype.size_in_bytes
    if node.ndim == 1 and a != b:
        # The only axis is both the row axis and the reinterpreted one: output rows are byte ranges of
        # the input, so pull the input elements covering those bytes and cut.
        if not isinstance(rows, range):
            lo, hi = int(rows.min()), int(rows.max()) + 1
            return _pull_bitcast(node, range(lo, hi), cache)[rows - lo]
        b0, b1 = rows.start * b, rows.stop * b
        i0, i1 = b0 // a, -(-b1 // a)
        raw = np.ascontiguousarray(pull(src, range(i0, i1), cache)).view(np.uint8)
        return raw[b0 - i0 * a:b1 - i0 * a].view(node.dtype.to_numpy())
    x = pull(src, rows, cache)
    x = np.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes 0-d 1-d)
    if x.ndim == 0:
        return x.reshape(1).view(node.dtype.to_numpy()).reshape(())
    return x.view(node.dtype.to_numpy())


@PULL.register(Op.RESHAPE)
def _pull_reshape(node: Node, rows: Rows, cache) -> np.ndarray:
    src = node.srcs[0]
    r_out, r_in = row_size(node), row_size(src)
    out_tail = node.shape[1:]
    if not node.shape or not src.shape:
        return np.ascontiguousarray(pull(src, range(0, nrows(src)), cache)).reshape(node.shape)
    if isinstance(rows, range):
        f0, f1 = rows.start * r_out, rows.stop * r_out
        if r_in == 0:
            return np.empty((len(rows),) + out_tail, node.dtype.to_numpy())
        i0, i1 = f0 // r_in, -(-f1 // r_in)
        block = np.ascontiguousarray(pull(src, range(i0, i1), cache)).reshape(-1)
        start = f0 - i0 * r_in
        return block[start:start + (f1 - f0)].reshape((len(rows),) + out_tail)
    # Gathered rows: whole input rows per output row, or whole output rows per input row.
    if r_in and r_out % r_in == 0:
        k = r_out // r_in
        in_rows = (rows[:, None] * k + np.arange(k)[None, :]).reshape(-1)
        return np.ascontiguousarray(pull(src, in_rows, cache)).reshape((len(rows),) + out_tail)
    if r_out and r_in % r_out == 0:
        k = r_in // r_out
        per_row = np.ascontiguousarray(pull(src, rows // k, cache)).reshape(len(rows), k, r_out)
        return per_row[np.arange(len(rows)), rows % k].reshape((len(rows),) + out_tail)
    lo, hi = int(rows.min()), int(rows.max()) + 1
    return _pull_reshape(node, range(lo, hi), cache)[rows - lo]


@PULL.register(Op.PERMUTE)
def _pull_permute(node: Node, rows: Rows, cache) -> np.ndarray:
    axes = node.arg
    src = node.srcs[0]
    if axes[0] == 0:
        return pull(src, rows, cache).transpose(axes)
    # Output rows come from a non-leading input axis: take all input rows, select along that axis.
    whole = pull(src, range(0, nrows(src)), cache)
    picked = whole.transpose(axes)
    return _select(picked, rows)


@PULL.register(Op.SLICE)
def _pull_slice(node: Node, rows: Rows, cache) -> np.ndarray:
    src = node.srcs[0]
    (a, _, step), rest = node.arg[0], node.arg[1:]
    if isinstance(rows, range):
        if step == 1:
            block = pull(src, range(a + rows.start, a + rows.stop), cache)
        elif len(rows) == 0:
            block = pull(src, range(a, a), cache)
        else:
            first, last = a + rows.start * step, a + (rows.stop - 1) * step
            block = pull(src, range(first, last + 1), cache)[::step]
    else:
        block = pull(src, a + rows * step, cache)
    return block[(slice(None),) + tuple(slice(x, y, z) for x, y, z in rest)]


@PULL.register(Op.TAKE)
def _pull_take(node: Node, rows: Rows, cache) -> np.ndarray:
    axis, idx = node.arg
    src = node.srcs[0]
    if axis == 0:
        return pull(src, idx.values(rows), cache)
    # Every block takes the whole list along `axis`: an affine one (a block-scale broadcast) is made once per
    # step, in the step's cache, and freed with it.
    full = idx.array if idx.affine is None or cache is None else cache.get(("take index", node))
    if full is None:
        full = cache[("take index", node)] = idx.array
    return np.take(pull(src, rows, cache), full, axis=axis)


@PULL.register(Op.CONCAT)
def _pull_concat(node: Node, rows: Rows, cache) -> np.ndarray:
    axis = node.arg
    if axis != 0:
        return np.concatenate([pull(s, rows, cache) for s in node.srcs], axis=axis)
    parts, start = [], 0
    want = np.arange(rows.start, rows.stop) if isinstance(rows, range) else rows
    for s in node.srcs:
        n = s.shape[0]
        mask = (want >= start) & (want < start + n)
        if mask.any():
            local: Rows = want[mask] - start
            if isinstance(rows, range):
                local = range(int(local[0]), int(local[-1]) + 1)
            parts.append(pull(s, local, cache))
        start += n
    if not parts:
        return np.empty((0,) + node.shape[1:], node.dtype.to_numpy())
    if isinstance(rows, range):
        return np.concatenate(parts, axis=0)
    # Gathered rows may interleave pieces: each piece gave its rows in request order; put them back.
    positions, base, start = np.empty(len(want), np.int64), 0, 0
    for s in node.srcs:
        mask = (want >= start) & (want < start + s.shape[0])
        count = int(mask.sum())
        positions[mask] = base + np.arange(count)
        base += count
        start += s.shape[0]
    return np.concatenate(parts, axis=0)[positions]


def _quant_row_pull(node: Node, rows: Rows, cache, row_op) -> np.ndarray:
    """Dequantize/quantize work on whole rows of blocks; 1-D tensors are one row of blocks."""
    src = node.srcs[0]
    if node.ndim >= 2:
        block = np.ascontiguousarray(pull(src, rows, cache))
        return row_op(block.reshape(-1, block.shape[-1])).reshape((len(rows),) + node.shape[1:])
    whole = np.ascontiguousarray(pull(src, range(0, nrows(src)), cache))
    return _select(row_op(whole.reshape(1, -1)).reshape(node.shape), rows)


@PULL.register(Op.DEQUANTIZE)
def _pull_dequantize(node: Node, rows: Rows, cache) -> np.ndarray:
    from ..kernels.casts import cast
    from ..quant import dequantize

    encoding, dtype = node.arg

    def op(block):
        values = dequantize(encoding, block)
        return values if values.dtype == dtype.to_numpy() else cast(values, dtype.to_numpy())

    return _quant_row_pull(node, rows, cache, op)


@PULL.register(Op.QUANTIZE)
def _pull_quantize(node: Node, rows: Rows, cache) -> np.ndarray:
    from ..kernels.casts import cast
    from ..quant import quantize

    enc, importance, _ = node.arg
    weights = None if importance is None else importance.array
    if weights is not None and weights.ndim == 2:
        # One importance row per expert: axis 0 is the expert, so each output row has its own weights.
        block = pull(node.srcs[0], rows, cache)
        if block.dtype != np.float32:
            block = cast(block, np.dtype(np.float32))
        experts = range(rows.start, rows.stop) if isinstance(rows, range) else rows
        out = np.empty((len(experts),) + node.shape[1:], np.uint8)
        for i, e in enumerate(experts):
            part = np.ascontiguousarray(block[i]).reshape(-1, block.shape[-1])
            out[i] = quantize(enc, part, imatrix=weights[int(e)]).reshape(node.shape[1:])
        return out

    def op(block):
        if block.dtype != np.float32:
            block = cast(block, np.dtype(np.float32))
        return quantize(enc, np.ascontiguousarray(block), imatrix=weights)

    return _quant_row_pull(node, rows, cache, op)


@PULL.register(Op.BINARY)
def _pull_binary(node: Node, rows: Rows, cache) -> np.ndarray:
    from ..graph.elementwise import numpy_binary

    def operand(src):
        # A broadcast operand (leading dim 1 where the output has more) gives its single row to every row.
        if node.shape and src.shape and src.shape[0] == 1 and node.shape[0] != 1:
            return pull(src, range(0, 1), cache)
        return pull(src, rows, cache)

    a, b = (operand(s) for s in node.srcs)
    return numpy_binary(node, a, b)


@PULL.register(Op.UNARY)
def _pull_unary(node: Node, rows: Rows, cache) -> np.ndarray:
    from ..graph.elementwise import numpy_unary

    return numpy_unary(node, pull(node.srcs[0], rows, cache))



def _lora_inputs(node: Node, rows: Rows, cache) -> tuple[np.ndarray, list]:
    factors = []
    for i, (_, transposed) in enumerate(node.arg):
        b, a = node.srcs[1 + 2 * i], node.srcs[2 + 2 * i]
        if transposed:  # output rows are W's input features: all of B, A's columns for the block
            factors.append((pull(b, range(0, b.shape[0]), cache),
                            _select(pull(a, range(0, a.shape[0]), cache).T, rows).T))
        else:           # the block's rows of B, all of A
            factors.append((pull(b, rows, cache), pull(a, range(0, a.shape[0]), cache)))
    return pull(node.srcs[0], rows, cache), factors


@PULL.register(Op.LORA)
def _pull_lora(node: Node, rows: Rows, cache) -> np.ndarray:
    from ..graph.lora import lora_rows

    return lora_rows(node, *_lora_inputs(node, rows, cache))


@PULL.register(Op.SCATTER)
def _pull_scatter(node: Node, rows: Rows, cache) -> np.ndarray:
    from ..graph.scatter import fill_rows

    if not isinstance(rows, range):  # gathered rows: the run that covers them, then pick
        lo, hi = (int(rows.min()), int(rows.max()) + 1) if len(rows) else (0, 0)
        return _pull_scatter(node, range(lo, hi), cache)[rows - lo]
    values, mask = node.srcs[0], node.srcs[1]
    if len(node.srcs) == 2:
        return fill_rows(node, rows.start, pull(mask, rows, cache), pull(values, rows, cache))
    if not len(rows):
        return np.empty((0,) + node.shape[1:], node.dtype.to_numpy())
    # Flat values: the block's run lies between its first row's offset and the next row's (or the end).
    offsets = node.srcs[2]
    last = rows.stop >= nrows(offsets)
    starts = np.asarray(pull(offsets, range(rows.start, rows.stop if last else rows.stop + 1), cache), np.int64)
    if last:
        starts = np.append(starts, values.shape[0])
    if starts[0] < 0 or starts[-1] > values.shape[0] or np.any(np.diff(starts) < 0):
        from ..core.errors import FormatError
        from ..graph.scatter import label

        raise FormatError(f"{label(offsets)}: row offsets {starts[:8].tolist()} (rows {rows.start}..{rows.stop - 1}) "
                          f"do not increase within the {values.shape[0]} values")
    run = pull(values, range(int(starts[0]), int(starts[-1])), cache)
    return fill_rows(node, rows.start, pull(mask, rows, cache), run, starts)


def write_rows(node: Node, rows: range, dst: np.ndarray, cache: dict | None = None) -> None:
    """Compute rows `rows` of `node` straight into `dst` (shape `(len(rows),) + node.shape[1:]`).

    The value op on top writes into `dst` itself, so a source -> layout -> cast chain costs one read of
    each source byte and one write of each output byte, gathered rows (`gathered`) included.
    """
    from ..kernels.casts import cast_into, gather_cast_into

    # A gather under the cast (or a bare gather) goes straight from the map into `dst`, with no gathered
    # copy in between. (`dst` must be contiguous: reshaping it must give a view, not a copy.)
    if node.op in GroupOp.Layout or node.op is Op.CAST:
        g = gathered(node.srcs[0] if node.op is Op.CAST else node, rows, cache) if dst.flags.c_contiguous else None
        if g is not None:
            gather_cast_into(g.windows, g.offsets, dst.reshape(-1, g.unit))
            return
    if node.op is Op.CAST:
        cast_into(pull(node.srcs[0], rows, cache), dst)
        return
    if node.op is Op.DEQUANTIZE and node.ndim >= 2 and node.dtype.to_numpy() == np.float32:
        from ..quant import dequantize_into

        block = np.ascontiguousarray(pull(node.srcs[0], rows, cache))
        dequantize_into(node.arg[0], block.reshape(-1, block.shape[-1]), dst.reshape(-1, dst.shape[-1]))
        return
    if node.op is Op.LORA and dst.flags.c_contiguous:
        from ..graph.lora import lora_rows

        lora_rows(node, *_lora_inputs(node, rows, cache), out=dst.reshape(len(rows), -1))
        return
    np.copyto(dst, pull(node, rows, cache).reshape(dst.shape), casting="no")
