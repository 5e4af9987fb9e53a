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

import math
from typing import Any, NamedTuple

import numpy as np

from ..core.dtype import ITEMSIZE, DType
from ..core.errors import ArgumentTypeError, ImatrixShapeError, UsageError
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
    """A 1-D int64 index list (for `take`), hashable by content so equal index lists are shared.

    Indices that follow ``offset + scale * ((i + phase) // div)`` for i in range(n) are held as those five
    integers and no array (`affine`): an arange, a reversal, a stride, and each value repeated `div` times,
    as in a block-scale broadcast ``arange(n) // 128`` (DeepSeek-V3's FP8 `weight_scale_inv`), which would
    otherwise keep n int64 per take node. The constructor recognises them in any int array; `repeat` builds
    one directly. Such a list is materialized only where it is used: `values(rows)` gives the indices at some
    positions (what one executor block needs), `array` all of them. Every list has exactly one form (an
    affine list is never held as an array, and its five integers are canonical), so lists compare and hash
    by content either way.

    Example:
        >>> import numpy as np
        >>> idx = IndexArray(np.arange(300) // 128)
        >>> idx.affine, len(idx), idx.values(range(126, 131)).tolist()
        ((300, 0, 1, 128, 0), 300, [0, 0, 1, 1, 1])
        >>> idx == IndexArray.repeat(300, 128), idx[129:].affine, idx
        (True, (171, 1, 1, 127, 0), [0,0,0,0,...,2](300))
        >>> IndexArray([2, 0, 1]).affine is None, IndexArray(range(9, -1, -1)).affine
        (True, (10, 9, -1, 1, 0))
    """

    __slots__ = ("_array", "affine", "_hash")
    # (typed Any: exactly one of the two is None, which the methods test before use)
    _array: Any  # the indices (a read-only int64 array), for a list that is not affine
    affine: Any  # (n, offset, scale, div, phase), for one that is
    _hash: int
    # Affine lists this long or shorter keep their values' bytes in `_PATTERNS`, so recognising the next
    # equal list is one byte comparison.
    _PATTERN_MAX = 1 << 16

    def __new__(cls, values):
        arr = np.asarray(values)
        if arr.dtype is not _INT64:
            arr = arr.astype(_INT64)
        if arr.ndim != 1:
            arr = arr.reshape(-1)
        n = len(arr)
        if n > 2:
            # The affine list last recognised with this length and these ends is the likely answer (every
            # expert of a layer broadcasts its scales with the same, freshly built `arange(k) // 128`): one
            # byte comparison confirms it, and the list is the interned one.
            ends = (n, arr.item(0), arr.item(-1))
            seen = _SEEN.get(ends)
            if seen is not None and arr.tobytes() == seen[0]:
                return seen[1]
        affine = _recognise(arr)
        if affine is not None:
            got = _affine(affine)
            if 2 < n <= cls._PATTERN_MAX:
                if len(_SEEN) >= 256:
                    _SEEN.clear()
                _SEEN[ends] = (arr.tobytes(), got)
            return got
        self = object.__new__(cls)
        arr = np.array(arr, dtype=_INT64, copy=True)  # our own copy: the caller's array stays writeable
        arr.setflags(write=False)
        self._array, self.affine, self._hash = arr, None, hash(arr.tobytes())
        return self

    @classmethod
    def repeat(cls, n: int, div: int = 1, offset: int = 0, scale: int = 1, phase: int = 0) -> "IndexArray":
        """The affine list ``offset + scale * ((i + phase) // div)`` for i in range(n), held as five integers.

        `repeat(n, 128)` is ``arange(n) // 128``; `repeat(n)` is ``arange(n)``.

        Example:
            >>> IndexArray.repeat(5, 2, offset=3).array.tolist()
            [3, 3, 4, 4, 5]
        """
        if div < 1 or not 0 <= phase < div or n < 0:
            raise UsageError(f"IndexArray.repeat: need n >= 0, div >= 1 and 0 <= phase < div, got n={n}, "
                             f"div={div}, phase={phase}")
        return _affine(_canonical(int(n), int(offset), int(scale), int(div), int(phase)))

    @property
    def array(self) -> np.ndarray:
        """Every index as a read-only int64 array (for an affine list: computed now, not kept)."""
        if self._array is not None:
            return self._array
        arr = _affine_values(self.affine, 0, self.affine[0])
        arr.setflags(write=False)
        return arr

    def values(self, rows) -> np.ndarray:
        """The indices at positions `rows` (a step-1 `range` or an int array), as int64: one block's share."""
        if self._array is not None:
            return self._array[rows.start:rows.stop] if isinstance(rows, range) else self._array[rows]
        if isinstance(rows, range):
            return _affine_values(self.affine, rows.start, rows.stop)
        _, offset, scale, div, phase = self.affine
        pos = np.asarray(rows, np.int64)
        return offset + scale * ((pos + phase) // div if div != 1 else pos + phase)

    def bounds(self) -> tuple[int, int]:
        """(smallest, largest) index; (0, -1) when empty."""
        if self._array is not None:
            return (int(self._array.min()), int(self._array.max())) if len(self._array) else (0, -1)
        n, offset, scale, div, phase = self.affine
        if n == 0:
            return 0, -1
        first, last = offset, offset + scale * ((n - 1 + phase) // div)
        return min(first, last), max(first, last)

    def __getitem__(self, key: slice) -> "IndexArray":
        """A slice of the list (positive or negative step), affine when this one is and the step allows."""
        if not isinstance(key, slice):
            raise ArgumentTypeError(f"IndexArray slices only, got {type(key).__name__} {key!r}; use values(rows) for "
                                    "positions")
        if self._array is not None:
            return IndexArray(self._array[key])
        n, offset, scale, div, phase = self.affine
        start, stop, step = key.indices(n)
        count = len(range(start, stop, step))
        if count and step == 1:
            return _affine(_canonical(count, offset + scale * ((start + phase) // div), scale, div,
                                      (start + phase) % div))
        # A step of whole runs: (start + phase + i * step) // div == (start + phase) // div + i * (step // div).
        if step % div == 0 or count <= 1:
            first = offset + scale * ((start + phase) // div)
            return _affine(_canonical(count, first, scale * (step // div), 1, 0))
        return IndexArray(self.values(np.arange(start, stop, step)))

    def __len__(self):
        return len(self._array) if self._array is not None else self.affine[0]

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, IndexArray) or self._hash != other._hash:
            return False
        if self.affine is not None or other.affine is not None:
            return self.affine == other.affine
        return np.array_equal(self._array, other._array)

    def __reduce__(self):
        return (_affine, (self.affine,)) if self.affine is not None else (IndexArray, (self._array,))

    def is_arange(self) -> bool:
        """True when the indices are 0..n-1 in order (a take that changes nothing)."""
        if self.affine is not None:
            n, offset, scale, div, phase = self.affine
            return n <= 1 and offset == 0 or (offset, scale, div, phase) == (0, 1, 1, 0)
        a = self._array
        return bool(len(a) == 0 or (a[0] == 0 and np.all(np.diff(a) == 1)))

    def __repr__(self):
        n = len(self)
        if n <= 8:
            return "[" + ",".join(str(int(v)) for v in self.values(range(0, n))) + "]"
        head = self.values(range(0, 4))
        last = int(self.values(range(n - 1, n))[0])
        return "[" + ",".join(str(int(v)) for v in head) + f",...,{last}]({n})"


def _canonical(n: int, offset: int, scale: int, div: int, phase: int) -> tuple[int, int, int, int, int]:
    """The one (n, offset, scale, div, phase) of an affine list's values: a list is runs of `div` equal
    values (the first `div - phase` long, the last cut by n), so when it has no run between its first and
    last, `div` is taken as the longer of those two; a constant list is (n, value, 0, 1, 0)."""
    if n <= 0:
        return (0, 0, 0, 1, 0)
    first = min(n, div - phase)
    if scale == 0 or first == n:
        return (n, offset, 0, 1, 0)
    rest = n - first
    if rest > div:
        return (n, offset, scale, div, phase)
    d = max(first, rest)
    return (n, offset, scale, d, d - first)


def _affine_values(affine: tuple, start: int, stop: int) -> np.ndarray:
    """Positions [start, stop) of an affine list, as int64."""
    _, offset, scale, div, phase = affine
    pos = np.arange(start + phase, stop + phase, dtype=np.int64)
    if div != 1:
        pos //= div
    if scale != 1:
        pos *= scale
    if offset:
        pos += offset
    return pos


# Affine lists seen, by their five integers: equal lists are one object, and short ones keep their values'
# bytes so that recognising the next equal array is one comparison. Bounded: cleared when full.
_AFFINE: dict[tuple, IndexArray] = {}
_PATTERNS: dict[tuple, bytes] = {}
# (n, first value, last value) -> (the values' bytes, the affine list) last recognised with them.
_SEEN: dict[tuple, tuple[bytes, "IndexArray"]] = {}
_INT64 = np.dtype(np.int64)
_AFFINE_MAX = 4096


def _affine(affine: tuple) -> IndexArray:
    got = _AFFINE.get(affine)
    if got is None:
        if len(_AFFINE) >= _AFFINE_MAX:
            _AFFINE.clear()
        got = object.__new__(IndexArray)
        got._array, got.affine, got._hash = None, affine, hash(affine)
        _AFFINE[affine] = got
    return got


def _run_end(arr: np.ndarray, start: int, value: int) -> int:
    """The first position from `start` whose value is not `value` (len(arr) if none), looking at windows
    that double from 256 values, so a run of 128 costs one short comparison, not one over the whole list."""
    n, size = len(arr), 256
    while start < n:
        window = arr[start:start + size]
        hit = int((window != value).argmax())
        if hit or window[0] != value:
            return start + hit
        start += len(window)
        size *= 4
    return n


def _recognise(arr: np.ndarray) -> tuple | None:
    """`arr`'s canonical affine form (see `IndexArray`), or None when its values are not affine: the first
    two runs give the candidate (short searches), then one byte comparison with its values decides."""
    n = len(arr)
    if n <= 2:
        v = [int(x) for x in arr]
        if n < 2:
            return _canonical(n, v[0] if n else 0, 0, 1, 0)
        return _canonical(2, v[0], v[1] - v[0], 1, 0)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    c0 = int(arr[0])
    first = _run_end(arr, 1, c0)
    if first == n:  # every value equal
        return (n, c0, 0, 1, 0)
    c1 = int(arr[first])
    second = _run_end(arr, first + 1, c1) - first
    if first + second == n:  # two runs
        div = max(first, second)
    else:
        div = second
        if first > div:
            return None
    affine = _canonical(n, c0, c1 - c0, div, div - first)
    # The candidate's values, once per distinct short list; compared as bytes (one memcmp).
    want = _PATTERNS.get(affine) if n <= IndexArray._PATTERN_MAX else None
    if want is None:
        want = _affine_values(affine, 0, n).tobytes()
        if n <= IndexArray._PATTERN_MAX:
            if len(_PATTERNS) >= 256:
                _PATTERNS.clear()
            _PATTERNS[affine] = want
    if arr.tobytes() != want:
        return None
    return affine


class Importance:
    """An importance matrix for a `quantize` node (llama.cpp's imatrix): float32 weights, one per column
    ([n]), or one row per expert ([n_expert, n]) for stacked MoE tensors. Hashable by content, so equal
    plans built twice are one plan."""

    __slots__ = ("array", "_hash")

    def __init__(self, values):
        arr = np.ascontiguousarray(values, dtype=np.float32)
        if arr.ndim not in (1, 2):
            raise ImatrixShapeError(f"an importance matrix is [n] or [n_expert, n], got shape {list(arr.shape)}")
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


class _NodeSlots:
    """The fields of a `Node`. `_NewNode` fills them with plain slot stores, then the object becomes a `Node`
    (whose `__setattr__` refuses): a third of what setting each through `object.__setattr__` or a slot
    descriptor costs, for the ~315,000 nodes of a DeepSeek-V3-sized plan (benchmarks/bench_scale.py)."""

    __slots__ = ("op", "srcs", "arg", "dtype", "shape", "_hash")
    # The slots' types, for type checkers (set once, in `Node.__new__`).
    op: Op
    srcs: tuple["Node", ...]
    arg: Any
    dtype: DType
    shape: tuple[int, ...]
    _hash: int


class _NewNode(_NodeSlots):
    """A node being built: the same layout as `Node`, with plain attribute stores (never seen outside `__new__`)."""

    __slots__ = ()


class Node(_NodeSlots):
    """An immutable graph node. Build nodes with the functions in `lazyweights.graph.ops`."""

    __slots__ = ()

    def __new__(cls, op: Op, srcs: tuple["Node", ...], arg: Any, dtype: DType, shape: tuple[int, ...]):
        if type(op) is not Op:
            op = Op(op)
        if type(srcs) is not tuple:
            srcs = tuple(srcs)
        interned = _SHAPES.get(shape) if type(shape) is tuple else None
        shape = interned if interned is not None else _intern_shape(shape)
        self = _new(_NewNode)
        self.op = op
        self.srcs = srcs
        self.arg = arg
        self.dtype = dtype
        self.shape = shape
        self._hash = hash((op, srcs, arg, dtype, shape))
        # Immutable from here on (tests/graph/test_toposort.py::test_node_is_immutable).
        self.__class__ = cls  # type: ignore[assignment]
        return self

    def __setattr__(self, key, value):
        raise AttributeError("Node is immutable")

    def __reduce__(self):  # rebuilt through __new__ (slots + immutability defeat default pickling)
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
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the node's value (`size * dtype.size_in_bytes`)."""
        return math.prod(self.shape) * ITEMSIZE[self.dtype]

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def toposort(self) -> list["Node"]:
        """This node and everything it depends on, dependencies first, each once."""
        return toposort([self])

    def __repr__(self):
        return f"Node({self.op}, {self.dtype.short}{list(self.shape)}, arg={self.arg!r})"


_new = object.__new__

# Shapes are interned: the nodes of a plan share a few hundred distinct shapes (every expert of a layer has
# the same), so each node points at one tuple instead of holding its own. Bounded: cleared when full.
_SHAPES: dict[tuple, tuple] = {}


def _intern_shape(shape) -> tuple[int, ...]:
    shape = tuple(map(int, shape))
    got = _SHAPES.get(shape)
    if got is None:
        if len(_SHAPES) >= 1 << 16:
            _SHAPES.clear()
        got = _SHAPES[shape] = shape
    return got


def toposort(roots) -> list[Node]:
    """All nodes reachable from `roots`, dependencies before users, each once (deep chains are fine)."""
    order: list[Node] = []
    seen: set[Node] = set()
    for root in roots:
        _visit(root, order, seen, 0)
    return order


# How many multi-input nodes deep `_visit` recurses before it hands the rest to the explicit stack of
# `_toposort_from` (a sum of 10,000 terms is that deep: tests/graph/test_toposort.py).
_RECURSION = 64


def _visit(node: Node, order: list[Node], seen: set, depth: int) -> None:
    """Append `node` and its unseen dependencies to `order`, first input first (`_toposort_from`'s order).

    A chain (one input per node) is walked down and reversed, with no stack; a node with several inputs
    visits them in turn. Each node is hashed once (`seen` grows or it was there): a 90,000-tensor plan's
    steps walk half a million nodes (benchmarks/bench_scale.py)."""
    chain = []
    while True:
        size = len(seen)
        seen.add(node)
        if len(seen) == size:  # visited (and, in a DAG, already in `order`)
            break
        srcs = node.srcs
        if len(srcs) == 1:
            chain.append(node)
            node = srcs[0]
            continue
        if srcs:
            if depth < _RECURSION:
                for s in srcs:
                    _visit(s, order, seen, depth + 1)
            else:
                seen.discard(node)
                _toposort_from(node, order, seen)
                break
        order.append(node)
        break
    if chain:
        chain.reverse()
        order.extend(chain)


def _toposort_from(root: Node, order: list[Node], seen: set) -> None:
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
