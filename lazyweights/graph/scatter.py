"""The bitmask scatter op: stored non-zero values put back at a bitmask's set bits, zeros elsewhere.

Sparse checkpoints (compressed-tensors' `sparse-bitmask` and `sparse-24-bitmask`) store a weight
``[rows, cols]`` as its kept values in C order plus one bit per element (`numpy.packbits(...,
bitorder="little")` along each row, ``ceil(cols / 8)`` bytes a row). A `scatter` node's inputs are
``(values, bitmask)`` or ``(values, bitmask, row_offsets)`` and its argument ``cols``:

    values [rows, k], no offsets      every row keeps exactly k values (2:4 sparsity keeps cols / 2):
                                      row r's values are ``values[r]``
    values [nnz], row_offsets [rows]  row r's values are ``values[row_offsets[r]:row_offsets[r + 1]]``
                                      (the last row's run ends at nnz)

Output row r is zeros with its set bits' positions filled, in order, from row r's values; the dtype is the
values' (bf16, fp8 e4m3 bytes, ...), so a dequantize chain on top runs in the same fused pass. Zeros are
all-zero bit patterns (+0.0), as `torch.zeros` gives. A block of output rows reads only those rows of the
bitmask and of the values (for the flat form: the run between its first and one-past-last row offsets), so
the op is row-parallel like a cast. compressed-tensors decompresses with ``dense[mask] = values.flatten()``
(one C-order fill over the whole tensor); filling row by row gives the same tensor exactly when each row's
set bits count its values, which the kernel checks (`FormatError` naming the stored tensor, the row and both
counts) instead of shifting every later value into the wrong place.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> from lazyweights.run.reference import evaluate
    >>> values = ops.const(np.array([[1, 2], [3, 4]], np.float32))
    >>> mask = ops.const(np.packbits([[1, 0, 0, 1], [0, 1, 1, 0]], axis=-1, bitorder="little"))
    >>> n = scatter(values, mask, 4)
    >>> n.op, n.shape, n.dtype.name
    ('scatter', (2, 4), 'float32')
    >>> evaluate([n])[0].tolist()
    [[1.0, 0.0, 0.0, 2.0], [0.0, 3.0, 4.0, 0.0]]
    >>> scatter(values, mask, 17)
    Traceback (most recent call last):
    ...
    lazyweights.core.errors.ShapeError: scatter: bitmask uint8[2, 1] does not fit 17 columns (need uint8[2, 3])
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.dtype import DType
from ..core.errors import DTypeError, FormatError, ShapeError
from .node import Node
from .opcodes import Op

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_POPCOUNT = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).sum(axis=1).astype(np.uint8)


def _fmt(n: Node) -> str:
    return f"{n.dtype.name}{list(n.shape)}"


def label(n: Node) -> str:
    """The stored tensor's name behind `n` (through layout ops), else its type."""
    while n.op is not Op.SOURCE and n.srcs:
        n = n.srcs[0]
    return repr(n.arg.name) if n.op is Op.SOURCE else _fmt(n)


def scatter(values: Node, bitmask: Node, cols: int, row_offsets: Node | None = None) -> Node:
    """Dense ``[rows, cols]`` from kept `values` and a packed `bitmask`; see the module docstring.

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> from lazyweights.run.reference import evaluate
        >>> flat = ops.const(np.array([5, 6, 7], np.int8))
        >>> mask = ops.const(np.packbits([[0, 1, 1], [1, 0, 0]], axis=-1, bitorder="little"))
        >>> evaluate([scatter(flat, mask, 3, ops.const(np.array([0, 2])))])[0].tolist()
        [[0, 5, 6], [7, 0, 0]]
    """
    cols = int(cols)
    if bitmask.dtype is not DType.uint8 or bitmask.ndim != 2 or bitmask.shape[1] != -(-cols // 8):
        raise ShapeError(f"scatter: bitmask {_fmt(bitmask)} does not fit {cols} columns (need uint8"
                         f"[{bitmask.shape[0] if bitmask.ndim else '?'}, {-(-cols // 8)}])")
    rows = bitmask.shape[0]
    if values.dtype.size_in_bytes not in _UINT:
        raise DTypeError(f"scatter: values {_fmt(values)} are not whole elements of 1, 2, 4 or 8 bytes")
    if row_offsets is None:
        if values.ndim != 2 or values.shape[0] != rows or values.shape[1] > cols:
            raise ShapeError(f"scatter: values {_fmt(values)} do not fit bitmask {_fmt(bitmask)} (need [{rows}, k] "
                             f"with k <= {cols}, or flat values with row offsets)")
        srcs: tuple[Node, ...] = (values, bitmask)
    else:
        if values.ndim != 1 or values.shape[0] > rows * cols:
            raise ShapeError(f"scatter: flat values {_fmt(values)} do not fit bitmask {_fmt(bitmask)} "
                             f"({rows} x {cols} elements at most)")
        if row_offsets.ndim != 1 or row_offsets.shape[0] != rows or row_offsets.dtype.name not in (
                "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
            raise ShapeError(f"scatter: row offsets {_fmt(row_offsets)} must be {rows} integers, one per bitmask row")
        srcs = (values, bitmask, row_offsets)
    return Node(Op.SCATTER, srcs, cols, values.dtype, (rows, cols))


def rebuild(node: Node, srcs: Sequence[Node]) -> Node:
    """`node`'s op over new inputs (through `scatter`, so every shape is checked again)."""
    return scatter(srcs[0], srcs[1], node.arg, srcs[2] if len(srcs) > 2 else None)


def fill_rows(node: Node, first: int, mask_bytes: np.ndarray, values: np.ndarray,
              starts: np.ndarray | None = None) -> np.ndarray:
    """Rows ``first .. first + len(mask_bytes)`` of `node`: `mask_bytes` their packed bitmask rows, `values`
    their kept values ([n, k] or, with `starts`, the flat run that begins at ``starts[0]``; `starts` has one
    more entry than rows: where each row's run starts and where the last one ends). Checks every row's count.

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> n = scatter(ops.const(np.zeros((2, 1), np.uint8)), ops.const(np.zeros((2, 1), np.uint8)), 3)
        >>> fill_rows(n, 0, np.array([[4], [1]], np.uint8), np.array([[9], [8]], np.uint8)).tolist()
        [[0, 0, 9], [8, 0, 0]]
    """
    cols = node.arg
    n = mask_bytes.shape[0]
    mask_bytes = np.ascontiguousarray(mask_bytes)
    if cols % 8:  # pad bits past the last column are not elements (unpackbits(count=cols) ignores them too)
        mask_bytes = mask_bytes.copy()
        mask_bytes[:, -1] &= (1 << (cols % 8)) - 1
    counts = _POPCOUNT[mask_bytes].sum(axis=1, dtype=np.int64)
    want = np.diff(starts) if starts is not None else np.full(n, values.shape[1] if values.ndim == 2 else 0)
    bad = np.flatnonzero(counts != want)
    if bad.size:
        r = int(bad[0])
        raise FormatError(f"{label(node.srcs[1])}: row {first + r} has {int(counts[r])} set bits but "
                          f"{label(node.srcs[0])} holds {int(want[r])} values for it (rows {first}.."
                          f"{first + n - 1} checked)")
    itemsize = node.dtype.size_in_bytes
    out = np.zeros((n, cols), _UINT[itemsize])
    # The set bits' flat positions, in C order, take the values in order (10x faster than `out[mask] = values`;
    # flatnonzero of a bool view, 10x faster than of the uint8 bits).
    where = np.flatnonzero(np.unpackbits(mask_bytes, axis=-1, count=cols, bitorder="little").view(bool))
    out.reshape(-1)[where] = np.ascontiguousarray(values).reshape(-1).view(_UINT[itemsize])
    return out.view(node.dtype.to_numpy())


def whole(node: Node, values: np.ndarray, mask_bytes: np.ndarray, row_offsets: np.ndarray | None = None
          ) -> np.ndarray:
    """The whole value (the reference rule): every row at once, offsets checked against the values' length."""
    starts = None
    if row_offsets is not None:
        starts = np.append(np.asarray(row_offsets, np.int64), values.shape[0])
        if starts.size > 1 and (starts[0] != 0 or np.any(np.diff(starts) < 0)):
            raise FormatError(f"{label(node.srcs[2])}: row offsets must start at 0 and not decrease, got "
                              f"{starts[:8].tolist()}... for {values.shape[0]} values")
    return fill_rows(node, 0, mask_bytes, values, starts)
