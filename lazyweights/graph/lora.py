"""The LoRA update op: ``W + scale * (B @ A)``, computed by blocks of output rows.

A `lora` node's inputs are ``(W, B1, A1, B2, A2, ...)`` and its argument one ``(scale, transposed)`` pair per
adapter. For an adapter that is not transposed, W is ``[out, in]``, B ``[out, r]`` and A ``[r, in]``, and a
block of output rows reads those rows of W and of B and all of A (A is small: r rows), so the working memory
of a block is its rows plus A, whatever the size of W. ``transposed`` is PEFT's ``fan_in_fan_out`` (GPT-2's
Conv1D stores W as ``[in, out]``) and its embedding LoRA: the update is ``(B @ A).T``, and a block reads those
columns of A and all of B.

Arithmetic: W, B and A are read in float32, each adapter's ``(B @ A) * scale`` is computed as PEFT's
``get_delta_weight`` computes it (the product, then the scale) and added in float32, and the sum is rounded once,
to nearest even, to W's dtype. Applying a LoRA to a `lora` node adds one more pair to the same node (the
constructor composes them), so stacked adapters also round once. Each element's r products are summed in one
fixed order, a fused multiply-add per k from zero (``kernels/_clora.c``), never through a BLAS whose kernel and
order depend on the block's shape: the bytes are the same for every budget, block size, executor and thread
count. It is a BLAS micro-kernel's order, so it matches torch's float32 ``B @ A`` wherever torch sums that way
(every element of the tests' merges here); the tests hold it to float32's rounding bound for an r-term sum.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> w = ops.const(np.zeros((4, 6), np.float32))
    >>> b, a = ops.const(np.ones((4, 2), np.float32)), ops.const(np.ones((2, 6), np.float32))
    >>> n = lora_update(w, b, a, 0.5)
    >>> n.op, n.shape, n.arg
    ('lora', (4, 6), ((0.5, False),))
    >>> lora_update(n, b, a, 2.0).arg   # stacked adapters: one node, rounded once
    ((0.5, False), (2.0, False))
    >>> lora_update(w, a, b, 1.0)
    Traceback (most recent call last):
    ...
    lazyweights.core.errors.ShapeError: lora: B float32[2, 6] and A float32[4, 2] do not fit W float32[4, 6] \
(need B [4, r] and A [r, 6])
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .node import Node
from .opcodes import Op


def _fmt(n: Node) -> str:
    return f"{n.dtype.name}{list(n.shape)}"


def lora_update(w: Node, b: Node, a: Node, scale: float, transposed: bool = False) -> Node:
    """``W + scale * (B @ A)`` (``(B @ A).T`` when `transposed`), W's dtype, W's shape; see the module doc."""
    for what, n in (("W", w), ("B", b), ("A", a)):
        if n.ndim != 2:
            raise ShapeError(f"lora: {what} must be 2-D, got {_fmt(n)}")
        if not n.dtype.is_float:
            raise DTypeError(f"lora: {what} must be a float tensor, got {_fmt(n)}")
    out_dim, in_dim = (w.shape[1], w.shape[0]) if transposed else w.shape
    r = a.shape[0]
    if b.shape != (out_dim, r) or a.shape != (r, in_dim):
        raise ShapeError(f"lora: B {_fmt(b)} and A {_fmt(a)} do not fit W {_fmt(w)}"
                         f"{' (fan_in_fan_out)' if transposed else ''} (need B [{out_dim}, r] and A [r, {in_dim}])")
    pair = ((float(scale), bool(transposed)),)
    if w.op is Op.LORA:  # compose: one node, one rounding
        return Node(Op.LORA, w.srcs + (b, a), w.arg + pair, w.dtype, w.shape)
    return Node(Op.LORA, (w, b, a), pair, w.dtype, w.shape)


def rebuild(node: Node, srcs: Sequence[Node]) -> Node:
    """`node`'s op over new inputs (through `lora_update`, so every shape is checked again)."""
    out = srcs[0]
    for i, (scale, transposed) in enumerate(node.arg):
        out = lora_update(out, srcs[1 + 2 * i], srcs[2 + 2 * i], scale, transposed)
    return out


def _f32(x: np.ndarray) -> np.ndarray:
    """`x` as a C-contiguous float32 array (itself when it already is one), for the update kernel."""
    if x.dtype == np.float32:
        return np.ascontiguousarray(x)
    from ..kernels.casts import cast

    return cast(x, np.dtype(np.float32))


# Rows per sub-block: about 256 KiB of float32 per scratch buffer, so W's rows and the sum stay in cache, and no
# block allocates fresh (page-faulting) memory beyond its output.
_SUB_BYTES = 256 * 1024


def lora_rows(node: Node, w: np.ndarray, factors: Sequence[tuple[np.ndarray, np.ndarray]],
              out: np.ndarray | None = None) -> np.ndarray:
    """Rows of `node` from the same rows of W and, per adapter, ``(B, A)`` already cut to the block: B's rows
    and all of A, or (transposed) all of B and A's columns for the block. Written into `out` (a C-contiguous
    array of the block's shape and node's dtype) when given.

    Sub-blocks of rows are computed in a float32 scratch buffer that fits in cache: W's rows cast in, each
    adapter's ``scale * (B @ A)`` added by the `_clora` kernel, the sum cast out once. The kernel sums each
    element's products in one fixed order (``kernels/_clora.c``), so a row's bytes do not depend on which block,
    thread or executor computes it; it releases the GIL, so blocks on several threads run in parallel.
    `benchmarks/bench_lora.py` measures it."""
    n, cols = w.shape
    if out is None:
        out = np.empty((n, cols), node.dtype.to_numpy())
    sub = max(1, min(n, _SUB_BYTES // max(1, 4 * cols)))
    acc_buf = None if out.dtype == np.float32 else np.empty((sub, cols), np.float32)
    # The update's right-hand factor, [r, cols], is used by every sub-block: made float32 once per block.
    # Rows of (B @ A).T are A[:, rows].T @ B.T, so a transposed update's right-hand factor is B.T.
    bases = [_f32(b.T if transposed else a) for (_, transposed), (b, a) in zip(node.arg, factors)]
    _sub_blocks(node, w, factors, bases, out, acc_buf, sub)
    return out


def _sub_blocks(node: Node, w: np.ndarray, factors: Sequence[tuple[np.ndarray, np.ndarray]],
                bases: list[np.ndarray], out: np.ndarray, acc_buf: np.ndarray | None, sub: int) -> None:
    from ..kernels.casts import cast_into, compiled_lora

    accumulate = compiled_lora().lora_accumulate
    n, cols = w.shape
    for start in range(0, n, sub):
        stop = min(n, start + sub)
        k = stop - start
        acc = out[start:stop] if acc_buf is None else acc_buf[:k]
        cast_into(w[start:stop], acc)
        for (scale, transposed), (b, a), basis in zip(node.arg, factors, bases):
            coef = _f32(a[:, start:stop].T if transposed else b[start:stop])
            accumulate(acc, coef, basis, k, cols, basis.shape[0], scale)
        if acc_buf is not None:
            cast_into(acc, out[start:stop])
