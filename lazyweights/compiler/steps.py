"""The plan compiler: a whole state dict -> fused, ordered, memory-budgeted steps. Pure: it reads no bytes.

Each distinct output node becomes one `Step` (outputs that are the same node, like tied embeddings, share
it and are computed once). A step's chain is rewritten so casts sit above layout ops, then split into
blocks of rows along axis 0; each block is one task that reads its source rows once and writes its output
rows once (see `run/blocks.py`). Where one row is too big for a block (a stacked MoE expert), the step
is computed over the output with its two leading axes merged (`merge_leading_axes`), as often as needed.
Block size comes from the budget: at most `workers` blocks are in flight, each needing about
`work_per_row * rows` bytes, and that product must fit the budget.

Steps are ordered by (source file, offset) so reads sweep each file forward.

    view   the output IS a zero-copy view of the memory map (nothing to compute when materializing)
    copy   a strided view of the map, copied block by block (e.g. a transpose with no cast)
    fused  a chain with value ops (cast, dequantize, gather), computed block by block

Example:
    >>> import numpy as np
    >>> from lazyweights import WeightData, DType, plan
    >>> from lazyweights.compiler.steps import compile_steps
    >>> w = WeightData.from_numpy(np.ones((64, 32), np.float32), "w")
    >>> [(s.kind, s.outputs) for s in compile_steps(plan({"a": w.T.astype(DType.float16), "b": w}))]
    [('fused', ['a']), ('view', ['b'])]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence, cast

from ..core.dtype import DType
from ..core.errors import BudgetError
from ..core.units import available_cpus, parse_size, paused_gc
from ..graph.layout import row_alignment, strided_layout
from ..graph.node import Node, toposort
from ..graph.opcodes import GroupOp, Op, OpTable
from ..graph.rewrites import merge_leading_axes, sink_casts, sink_slices
from ..io.source import SourceRecord
from .row_blocks import RowBlocks

DEFAULT_BUDGET = 512 << 20
DEFAULT_BLOCK_BYTES = 4 << 20  # output bytes per block: big enough to amortise overhead, small enough for L2/L3
# Output bytes per block of a step that streams (its only value op is the last one: a cast over layout
# ops, a dequantize) when its blocks are computed in place (into memory that keeps them): then nothing has
# to stay in cache and a bigger block only means fewer tasks. Each task costs about 30 us of Python and a
# GIL hand-off; on W1 (2.2 GB) 16 MB blocks cut the tasks from 637 to 281 and materialize(out=) by about
# 8%. A writer reads each block back from its scratch buffer (pwrite), so there the block must stay in
# cache: a save with 16 MB blocks was slower in 5 of 7 runs (benchmarks/RESULTS.md).
STREAM_BLOCK_BYTES = 16 << 20


@dataclass(slots=True)
class Step:
    """One output node's fused pass, split into row blocks."""

    outputs: list[str]
    node: Node
    kind: str
    nodes: list[Node]
    blocks: Sequence[range] = field(default_factory=list)  # a list, or `RowBlocks` (made as they are walked)
    work_per_row: int = 0
    whole: bool = False  # the chain needs whole inputs (so it runs as one block)
    streams: bool = False  # no value op below the root: blocks may be STREAM_BLOCK_BYTES

    @property
    def nbytes(self) -> int:
        """Bytes of the step's result (its root node's)."""
        return self.node.nbytes

    @property
    def sources(self) -> list[SourceRecord]:
        """The source records this step reads (one per SOURCE node in its chain, repeats kept)."""
        return [n.arg for n in self.nodes if n.op is Op.SOURCE]

    @property
    def read_bytes(self) -> int:
        """Bytes read from sources, each distinct record once."""
        return sum(r.nbytes for r in {r for r in self.sources})

    @property
    def block_bytes(self) -> int:
        """Working bytes of this step's largest block."""
        blocks = self.blocks
        if not blocks:
            return 0
        if type(blocks) is RowBlocks:
            return blocks.longest * self.work_per_row
        return max(len(b) for b in blocks) * self.work_per_row

    def order_key(self):
        """Sort key that orders steps by where they read: (file, offset of the first source, first output).

        Steps with no sources (constants) sort first, by output name.
        """
        first = None
        for n in self.nodes:
            if n.op is Op.SOURCE:
                where = (n.arg.file.path, n.arg.offset)
                if first is None or where < first:
                    first = where
        if first is None:
            return ("", 0, self.outputs[0])
        return (first[0], first[1], self.outputs[0])


def outputs_of(plan_or_outputs) -> dict[str, Node]:
    """name -> node from a `Plan` (anything with `.outputs`) or from such a mapping itself."""
    outputs = getattr(plan_or_outputs, "outputs", plan_or_outputs)
    return outputs if isinstance(outputs, dict) else dict(outputs)


def compile_steps(plan, *, budget=None, workers: int | None = None, block_bytes: int | None = None,
                  keep_views: bool = True, merge_rows: bool = True, in_place: bool = True) -> list[Step]:
    """Fuse each distinct output into one step and cut it into budget-sized row blocks.

    `plan`: a Plan, or name -> node. Raises BudgetError (before any work) if one
    block of some step cannot fit in the budget.
    `keep_views`: an output that is a C-contiguous view of a source is a result as it is (a "view" step,
    nothing to run: materializing). False when the bytes must move anyway (saving, hashing): such outputs
    become "copy" steps, copied block by block.
    `merge_rows`: where one row of axis 0 is too big for a block, compute the step over the output with
    its leading axes merged (`Step.node` then has that shape; see `_merge_big_rows`).
    `in_place`: blocks are computed where they stay (in memory), so steps that stream get
    STREAM_BLOCK_BYTES blocks; False (a writer re-reads every block) keeps every block cache-sized.
    """
    with paused_gc():  # (a plan of 45,000 steps builds a million objects: see core/units.paused_gc)
        return _compile_steps(plan, budget, workers, block_bytes, keep_views, merge_rows, in_place)


def _compile_steps(plan, budget, workers, block_bytes, keep_views, merge_rows, in_place) -> list[Step]:
    outputs = outputs_of(plan)
    budget = parse_size(budget) or DEFAULT_BUDGET
    workers = workers or available_cpus()
    target = block_bytes or DEFAULT_BLOCK_BYTES
    # Each of `workers` blocks in flight may use work_per_row * rows bytes.
    per_worker = max(1, budget // workers)
    by_node: dict[Node, Step] = {}
    view_cache: dict = {}
    for name, node in outputs.items():
        if node in by_node:
            by_node[node].outputs.append(name)
            continue
        step_or_none = _walk_step([name], node, toposort([node]), view_cache, keep_views, sink=True)
        if step_or_none is not None:
            step = step_or_none
        else:  # casts or slices to sink first (the rewrites); most chains have none
            root = sink_slices(sink_casts(node))
            step = _build_step([name], root, toposort([root]), view_cache, keep_views)
        if merge_rows:
            step = _merge_big_rows(step, per_worker, target, view_cache, keep_views)
        by_node[node] = step
    steps = sorted(by_node.values(), key=Step.order_key)
    for step in steps:
        big = in_place and step.streams
        _cut_blocks(step, per_worker, block_bytes or (STREAM_BLOCK_BYTES if big else target), budget)
    return steps


def _rewritten(node: Node) -> tuple[Node, list[Node]]:
    """`node` with its casts and slices sunk (`sink_casts`, `sink_slices`), and its nodes in order.

    Most chains have nothing to sink (a cast or dequantize over a source, an FP8 block dequantization):
    one walk finds that (`_compile_steps` does it inside `_build_step`'s walk)."""
    nodes = toposort([node])
    if any(_needs_sinking(n) for n in nodes):
        root = sink_slices(sink_casts(node))
        return root, toposort([root])
    return node, nodes


def _needs_sinking(n: Node) -> bool:
    """Whether `_rewritten` would rewrite at `n`: a slice over a computed node, a layout op over a cast,
    a concat of casts."""
    op, srcs = n.op, n.srcs
    return bool(srcs) and ((op is Op.SLICE and srcs[0].op not in GroupOp.Leaf)
                           or (op in GroupOp.Layout and srcs[0].op is Op.CAST)
                           or (op is Op.CONCAT and all(s.op is Op.CAST for s in srcs)))


def _build_step(outputs: list[str], root: Node, nodes: list[Node] | None, view_cache: dict,
                keep_views: bool) -> Step:
    """The step of `root` over `nodes` (its toposort; None: made here)."""
    return cast(Step, _walk_step(outputs, root, nodes, view_cache, keep_views, sink=False))


def _walk_step(outputs: list[str], root: Node, nodes: list[Node] | None, view_cache: dict,
               keep_views: bool, sink: bool) -> Step | None:
    """The step of `root` over `nodes` (its toposort). With `sink`, None when `_rewritten` would change
    the chain (the caller rewrites it and builds again).

    One walk over the nodes finds what `_rewritten`, `WHOLE_INPUT`, `_work_per_row` and the streaming
    rule would each find in their own (a 90,000-tensor plan has 45,000 steps: benchmarks/bench_scale.py;
    tests/compiler/test_build_step.py holds the walk equal to those rules)."""
    if nodes is None:
        nodes = toposort([root])
    op = root.op
    view = strided_layout(root, view_cache) if (op in GroupOp.View or op in GroupOp.Leaf) else None
    if view is not None:
        kind = "view" if (view.c_contiguous and keep_views) else "copy"
    else:
        kind = "fused"
    whole, streams, total = False, True, 0
    leaf, layout, views, never_whole = GroupOp.Leaf, GroupOp.Layout, GroupOp.View, _NEVER_WHOLE
    for n in nodes:
        op = n.op
        if op in leaf:
            continue  # (no inputs: nothing to sink, never whole, streams, no working bytes)
        if sink and op in _SINK_OPS and _needs_sinking(n):
            return None
        if not whole and op not in never_whole and WHOLE_INPUT[op](n, view_cache):
            whole = True
        if n is not root:
            if op not in layout:
                streams = False
            if op in views and strided_layout(n, view_cache) is not None:
                continue  # a view inside the chain holds no bytes of its own
        total += math.prod(n.shape) * _ITEMSIZE[n.dtype]
    step = Step(outputs, root, kind, nodes)
    step.whole = whole
    step.streams = streams
    nrows = root.shape[0] if root.shape else 1
    if kind != "fused":
        total = root.nbytes  # a copy block holds its output rows once
    step.work_per_row = max(1, -(-total // max(1, nrows)))
    return step


# A step whose smallest block would exceed a worker's share of the budget, or this many times the target
# block size, has its two leading axes merged (see `merge_leading_axes`), as often as that is possible.
BIG_ROW_FACTOR = 4


def _merge_big_rows(step: Step, per_worker: int, target: int, view_cache: dict, keep_views: bool) -> Step:
    """`step` computed over ``reshape(node, (d0 * d1,) + rest)`` when its rows are too big for good
    blocks (a stacked MoE expert is one 235 MB row). `step.node` then has the merged shape: the executors
    fill the output's memory viewed in that shape, which holds the same bytes in the same order."""
    while step.kind != "view" and not step.whole and step.node.ndim >= 3 and step.node.nbytes:
        node = step.node
        align = row_alignment(node)
        out_row = node.nbytes // node.shape[0]
        if step.work_per_row * align <= per_worker and out_row * align <= BIG_ROW_FACTOR * target:
            break
        merged = merge_leading_axes(node, view_cache)
        if merged is None:
            break
        candidate = _build_step(step.outputs, merged, None, view_cache, keep_views)
        if candidate.whole:
            break
        step = candidate
    return step


def _cut_blocks(step: Step, per_worker: int, target: int, budget: int) -> None:
    node = step.node
    nrows = node.shape[0] if node.shape else 1
    if step.kind == "view" or nrows == 0:
        step.blocks = [range(0, nrows)] if nrows else []
        return
    if node.nbytes == 0:  # one block: an empty [2**60, 0] tensor must not be cut into 2**38 blocks of nothing
        step.blocks = [range(0, nrows)]
        return
    if step.whole or not node.shape:
        step.blocks = [range(0, nrows)]
        need = step.work_per_row * nrows
        if need > budget:
            raise BudgetError(
                f"tensor {step.outputs[0]!r} ({node.dtype.name}{list(node.shape)}) must be computed whole and "
                f"needs {need} bytes of working memory, more than the budget of {budget} bytes"
            )
        return
    align = row_alignment(node)
    out_row = max(1, node.nbytes // nrows)
    min_need = step.work_per_row * align
    if min_need > budget:
        raise BudgetError(
            f"tensor {step.outputs[0]!r} ({node.dtype.name}{list(node.shape)}): its smallest block ({align} row(s)) "
            f"needs {min_need} bytes of working memory, more than the budget of {budget} bytes"
        )
    rows = max(1, min(target // out_row, per_worker // max(1, step.work_per_row)))
    rows = max(align, rows // align * align)
    step.blocks = RowBlocks(nrows, rows)


def _work_per_row(step: Step, view_cache) -> int:
    """Bytes a block needs per output row: the output row plus every computed intermediate's rows."""
    node = step.node
    nrows = node.shape[0] if node.shape else 1
    total = 0
    for n in step.nodes:
        op = n.op
        if op in GroupOp.Leaf or (op in GroupOp.View and n is not node and strided_layout(n, view_cache) is not None):
            continue  # (only the ops of GroupOp.View can be views)
        total += n.nbytes
    if step.kind != "fused":
        total = node.nbytes  # a copy block holds its output rows once
    return max(1, -(-total // max(1, nrows)))


# Whether a block of the op needs its inputs whole, not just the rows under the block.
WHOLE_INPUT = OpTable("whole input")
WHOLE_INPUT.register(Op.PERMUTE)(
    lambda n, views: n.arg[0] != 0 and strided_layout(n, views) is None)  # output rows from a later input axis
WHOLE_INPUT.register(Op.DEQUANTIZE, Op.QUANTIZE)(lambda n, views: n.ndim < 2)  # 1-D: one row of blocks
WHOLE_INPUT.register(Op.RESHAPE)(lambda n, views: not n.shape or not n.srcs[0].shape)


def _never_whole(n: Node, views: dict) -> bool:
    return False


WHOLE_INPUT.register(Op.SOURCE, Op.CONST, Op.CAST, Op.BITCAST, Op.SLICE, Op.TAKE, Op.CONCAT, Op.BINARY,
                      Op.UNARY)(_never_whole)
WHOLE_INPUT.register(Op.LORA)(_never_whole)  # rows of W (and B); A is read whole by every block
WHOLE_INPUT.register(Op.SCATTER)(_never_whole)  # the block's mask rows and the values under them
# The ops whose rule is `_never_whole`: `_build_step` does not call it for them.
_NEVER_WHOLE = frozenset(op for op, rule in WHOLE_INPUT.items() if rule is _never_whole)
# The ops `_needs_sinking` can say yes to.
_SINK_OPS = GroupOp.Layout | {Op.CONCAT}
_ITEMSIZE = {d: d.size_in_bytes for d in DType}

