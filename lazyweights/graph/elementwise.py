"""Binary elementwise ops (mul, add, sub, div) with numpy broadcasting, for scale-based dequantization.

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
"""
from __future__ import annotations

import numpy as np

from ..core.errors import DTypeError, ShapeError
from . import ops
from .node import Node
from .opcodes import Op

BINARY_OPS = {"mul": np.multiply, "add": np.add, "sub": np.subtract, "div": np.divide}


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
    if a.dtype.name == "bool" or (kind == "div" and not a.dtype.is_float):
        raise DTypeError(f"{kind}: not defined for {a.dtype.name}")
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
