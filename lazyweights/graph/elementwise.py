"""Elementwise ops: binary (mul, add, sub, div) with numpy broadcasting, for scale-based dequantization, and
unary (exp, log, neg) on floats, for value transforms such as Mamba's `A = -exp(A_log)` and its inverse.

FP8 block-scaled checkpoints (DeepSeek's `weight_scale_inv`), per-channel scales and the like need
`weight * scale`. Both operands must have the same dtype (cast explicitly first: an implicit promotion
would hide a precision decision in an adapter). Shapes broadcast as in numpy; the lower-rank operand is
reshaped with leading 1s when the node is built, so executors only see equal ranks.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> from lazyweights.graph.elementwise import binary
    >>> w = ops.const(np.ones((4, 6), np.float32))
    >>> s = ops.const(np.full((1, 6), 2.0, np.float32))
    >>> binary("mul", w, s).shape
    (4, 6)
    >>> unary("neg", unary("exp", w)).dtype.name
    'float32'
"""
from __future__ import annotations

import numpy as np

from ..core.dtype import DType
from ..core.errors import DTypeError, ShapeError
from . import ops
from .node import Node
from .opcodes import Op

BINARY_OPS = {"mul": np.multiply, "add": np.add, "sub": np.subtract, "div": np.divide}
# float-only: numpy computes them in float32 for narrower floats (bf16/fp8 through ml_dtypes), then rounds back
UNARY_OPS = {"exp": np.exp, "log": np.log, "neg": np.negative}


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...], what: str) -> tuple[int, ...]:
    """numpy's broadcast of two shapes, or a ShapeError naming `what` and both shapes.

    Example:
        >>> broadcast_shape((4, 1), (3,), "mul")
        (4, 3)
    """
    try:
        return tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise ShapeError(f"{what}: shapes {list(a)} and {list(b)} do not broadcast") from None


def binary(kind: str, a: Node, b: Node) -> Node:
    """`a <kind> b` elementwise with broadcasting; same dtype required."""
    if kind not in BINARY_OPS:
        raise ShapeError(f"unknown elementwise op {kind!r}; known: {', '.join(BINARY_OPS)}")
    if a.dtype is not b.dtype:
        raise DTypeError(f"{kind}: dtypes differ ({a.dtype.name} and {b.dtype.name}); cast one operand first")
    if a.dtype is DType.bool or (kind == "div" and not a.dtype.is_float):
        raise DTypeError(f"{kind}: not defined for {a.dtype.name}")
    if a.shape == b.shape:  # (the common case: nothing to broadcast)
        return Node(Op.BINARY, (a, b), kind, a.dtype, a.shape)
    shape = broadcast_shape(a.shape, b.shape, kind)
    nd = len(shape)
    if a.ndim < nd:
        a = ops.reshape(a, (1,) * (nd - a.ndim) + a.shape)
    if b.ndim < nd:
        b = ops.reshape(b, (1,) * (nd - b.ndim) + b.shape)
    return Node(Op.BINARY, (a, b), kind, a.dtype, shape)


def numpy_binary(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Reference implementation (numpy/ml_dtypes arithmetic, result in the operands' dtype)."""
    out = BINARY_OPS[node.arg](a, b)
    return out.astype(node.dtype.to_numpy(), copy=False)


def unary(kind: str, a: Node) -> Node:
    """`kind(a)` elementwise (exp, log, neg); float dtypes only (DTypeError otherwise), same dtype and shape out.

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> unary("log", ops.const(np.ones((2, 3), np.float32))).shape
        (2, 3)
    """
    if kind not in UNARY_OPS:
        raise ShapeError(f"unknown unary elementwise op {kind!r}; known: {', '.join(UNARY_OPS)}")
    if not a.dtype.is_float:
        raise DTypeError(f"{kind}: defined for float dtypes only, got {a.dtype.name} {list(a.shape)}")
    return Node(Op.UNARY, (a,), kind, a.dtype, a.shape)


def numpy_unary(node: Node, a: np.ndarray) -> np.ndarray:
    """Reference implementation: float16/32/64 natively, narrower floats (bf16, fp8) through float32, the result
    rounded to the operand's dtype."""
    x = a if a.dtype.kind == "f" else a.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # log(0) = -inf, log(-1) = nan, as numpy
        out = UNARY_OPS[node.arg](x)
    return out.astype(node.dtype.to_numpy(), copy=False)
