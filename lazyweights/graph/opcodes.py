"""The ops of the lazy graph, their named groups, and the per-op rule tables every layer fills.

`Op` names every op a `Node` can hold; `GroupOp` names the families the compiler and executors reason
about (tinygrad's `Ops`/`GroupOp`), so no module keeps its own set of strings. `Op` is a `str` enum whose
members compare and hash like their values (`Op.CAST == "cast"`), so a plan prints the same text it did.

Each layer that needs a rule for every op keeps one `OpTable` and registers a function per op next to the
code it belongs with (the way gguf-py registers each quant type where it is defined):

    graph/rewrites.py   REBUILD      the op with new inputs, through the validating constructors
    graph/layout.py     VIEW         how the op moves a strided view (or: not a view)
                        ROW_ALIGN    the row multiple at which its blocks line up with its inputs'
    compiler/steps.py   WHOLE_INPUT  whether a block of it needs its inputs whole
    run/blocks.py       PULL         rows of its value from rows of its inputs (the fused CPU kernel)
    run/reference.py    REFERENCE    its whole value from its inputs' whole values (the specification)
    run/gpu.py          GPU_SPLIT    whether the device program can run it (else the host part does)
    render/explain.py   EXPLAIN      the text of its argument in a plan listing

A table states the ops it does not apply to (`skip`); `tests/graph/test_opcodes.py` imports every layer and
fails if any table lacks an op. Adding an op means adding it to `Op`, its constructor in `ops.py`, and one
entry per table: the test lists what is missing.

Example:
    >>> Op.CAST == "cast", Op.CAST in GroupOp.Value, str(Op.TAKE)
    (True, True, 'take')
    >>> table = OpTable("demo", skip=GroupOp.Leaf)
    >>> @table.register(Op.CAST, Op.BITCAST)
    ... def rule(node): ...
    >>> sorted(table.missing())[:3]
    ['binary', 'concat', 'dequantize']
"""
from __future__ import annotations

import enum
from typing import Callable, Iterable

from ..core.errors import UsageError


class Op(str, enum.Enum):
    """Every op a graph node can hold (see `graph/ops.py` for what each computes)."""

    SOURCE = "source"          # a stored tensor (arg: TensorRecord)
    CONST = "const"            # an in-memory array (arg: Const)
    CAST = "cast"              # value conversion, round-to-nearest-even (arg: DType)
    BITCAST = "bitcast"        # bit reinterpretation, last dim scaled by the size ratio (arg: DType)
    RESHAPE = "reshape"        # (arg: new shape)
    PERMUTE = "permute"        # axes permutation (arg: axes)
    SLICE = "slice"            # basic slicing (arg: ((start, stop, step), ...), normalised, step > 0)
    TAKE = "take"              # gather along one axis (arg: (axis, IndexArray))
    CONCAT = "concat"          # join along an axis (arg: axis)
    DEQUANTIZE = "dequantize"  # packed blocks -> float (arg: (encoding, DType))
    QUANTIZE = "quantize"      # float -> packed blocks (arg: encoding)
    BINARY = "binary"          # elementwise mul/add/sub/div with broadcasting (arg: kind)
    UNARY = "unary"            # elementwise exp/log/neg on floats (arg: kind)
    LORA = "lora"              # W + sum scale_i * (B_i @ A_i), srcs (W, B1, A1, ...) (arg: ((scale, transposed), ...))
    SCATTER = "scatter"        # values put at a bitmask's set bits, srcs (values, bitmask[, row_offsets]) (arg: cols)

    # Compare, hash and print as the plain string, so `node.op == "cast"` and plan text are unchanged.
    __hash__ = str.__hash__
    __str__ = str.__str__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    __repr__ = str.__repr__


class GroupOp:
    """Named families of ops."""

    Leaf = frozenset({Op.SOURCE, Op.CONST})
    # Ops that only move elements: the cast sinker moves casts above them (`rewrites.sink_casts`).
    Layout = frozenset({Op.RESHAPE, Op.PERMUTE, Op.SLICE, Op.TAKE})
    # Ops that can stay a zero-copy strided view of their input (`layout.strided_layout`).
    View = frozenset({Op.RESHAPE, Op.PERMUTE, Op.SLICE, Op.BITCAST})
    Quant = frozenset({Op.DEQUANTIZE, Op.QUANTIZE})
    # Ops that compute new values (what makes a step "fused" rather than a view or a copy).
    Value = frozenset({Op.CAST, Op.BITCAST, Op.DEQUANTIZE, Op.QUANTIZE, Op.BINARY, Op.UNARY, Op.LORA,
                       Op.SCATTER})


class OpTable(dict):
    """One rule per op, registered where the rule's code lives; `missing()` lists the ops still without one."""

    tables: list["OpTable"] = []  # every table created, for the completeness test

    def __init__(self, rule: str, *, skip: Iterable[Op] = ()):
        super().__init__()
        self.rule = rule
        self.skip = frozenset(skip)
        OpTable.tables.append(self)

    def register(self, *ops: Op) -> Callable:
        """Decorator: `fn` is this table's rule for each of `ops`."""
        def add(fn):
            for op in ops:
                if op in self:
                    raise UsageError(f"{self.rule}: {op} registered twice (each op has one rule per table)")
                self[Op(op)] = fn
            return fn
        return add

    def missing(self) -> set[Op]:
        """Ops with neither an entry nor a declared skip: what a table test reports as forgotten."""
        return set(Op) - set(self) - self.skip

    def __repr__(self) -> str:
        return f"<OpTable {self.rule}: {len(self)} ops>"
