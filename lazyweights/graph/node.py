"""`Node`: one immutable value in the lazy graph.

A node is `(op, srcs, arg, dtype, shape)`. It is frozen and hashable, and equal nodes are
interchangeable, so two adapters that build the same chain share it and a plan reads it once. dtype and
shape are computed by the op's rule when the node is built (see `ops.py`), never by reading bytes.

Node arguments must be hashable. Arrays (constants from `from_numpy`, integer index lists) are wrapped:
`Const` compares by identity (a constant's bytes are not hashed), `IndexArray` by content.

Example:
    >>> from lazyweights.graph import ops
    >>> import numpy as np
    >>> x = ops.const(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> y = ops.permute(x, (1, 0))
    >>> y.op, y.shape, y.dtype.name
    ('permute', (3, 2), 'float32')
    >>> ops.permute(x, (1, 0)) == y
    True
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..core.dtype import DType
from .opcodes import Op


class Const:
    """A numpy array held by a `const` node. Compared by identity: two from_numpy calls are two values."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __hash__(self):
        return id(self.array)

    def __eq__(self, other):
        return isinstance(other, Const) and other.array is self.array

    def __repr__(self):
        return f"<array {self.array.dtype}{list(self.array.shape)}>"


class IndexArray:
    """A 1-D int64 index list (for `take`), hashable by content so equal permutations are shared."""

    __slots__ = ("array", "_hash")

    def __init__(self, values):
        arr = np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
        arr.setflags(write=False)
        self.array = arr
        self._hash = hash(arr.tobytes())

    def __len__(self):
        return len(self.array)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, IndexArray) and self._hash == other._hash and np.array_equal(self.array, other.array)

    def is_arange(self) -> bool:
        """True when the indices are 0..n-1 in order (a take that changes nothing)."""
        a = self.array
        return bool(len(a) == 0 or (a[0] == 0 and np.all(np.diff(a) == 1)))

    def __repr__(self):
        a = self.array
        if len(a) <= 8:
            return "[" + ",".join(str(int(v)) for v in a) + "]"
        return "[" + ",".join(str(int(v)) for v in a[:4]) + ",...," + str(int(a[-1])) + f"]({len(a)})"


class Importance:
    """An importance matrix for a `quantize` node (llama.cpp's imatrix): float32 weights, one per column
    ([n]), or one row per expert ([n_expert, n]) for stacked MoE tensors. Hashable by content, so equal
    plans built twice are one plan."""

    __slots__ = ("array", "_hash")

    def __init__(self, values):
        arr = np.ascontiguousarray(values, dtype=np.float32)
        if arr.ndim not in (1, 2):
            raise ValueError(f"an importance matrix is [n] or [n_expert, n], got shape {list(arr.shape)}")
        arr.setflags(write=False)
        self.array = arr
        self._hash = hash((arr.shape, arr.tobytes()))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, Importance) and self._hash == other._hash and np.array_equal(self.array, other.array)

    def __repr__(self):
        return f"<imatrix {list(self.array.shape)}>"


class QuantizeArg(NamedTuple):
    """The argument of a `quantize` node: the block type, an optional importance matrix, and why this type
    was chosen when a rule picked it (a llama.cpp preset's per-tensor choice; shown by `explain`)."""

    encoding: Any
    importance: Importance | None = None
    reason: str | None = None


class Node:
    """An immutable graph node. Build nodes with the functions in `lazyweights.graph.ops`."""

    __slots__ = ("op", "srcs", "arg", "dtype", "shape", "_hash")
    # The slots' types, for type checkers (set once in __init__ through object.__setattr__).
    op: Op
    srcs: tuple["Node", ...]
    arg: Any
    dtype: DType
    shape: tuple[int, ...]
    _hash: int

    def __init__(self, op: Op, srcs: tuple["Node", ...], arg: Any, dtype: DType, shape: tuple[int, ...]):
        op = Op(op)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "srcs", tuple(srcs))
        object.__setattr__(self, "arg", arg)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "_hash", hash((op, self.srcs, arg, dtype, self.shape)))

    def __setattr__(self, key, value):
        raise AttributeError("Node is immutable")

    def __reduce__(self):  # rebuilt through __init__ (slots + immutability defeat default pickling)
        return (Node, (self.op, self.srcs, self.arg, self.dtype, self.shape))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self is other:
            return True
        return (
            isinstance(other, Node)
            and self._hash == other._hash
            and self.op == other.op
            and self.dtype == other.dtype
            and self.shape == other.shape
            and self.arg == other.arg
            and self.srcs == other.srcs
        )

    # --- derived facts ----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the node's value (`size * dtype.size_in_bytes`)."""
        return self.size * self.dtype.size_in_bytes

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def toposort(self) -> list["Node"]:
        """This node and everything it depends on, dependencies first, each once."""
        return toposort([self])

    def __repr__(self):
        return f"Node({self.op}, {self.dtype.short}{list(self.shape)}, arg={self.arg!r})"


def toposort(roots) -> list[Node]:
    """All nodes reachable from `roots`, dependencies before users, each once (iterative: deep chains are fine)."""
    order: list[Node] = []
    seen: set[Node] = set()
    for root in roots:
        if root in seen:
            continue
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            for s in reversed(node.srcs):
                if s not in seen:
                    stack.append((s, False))
    return order
