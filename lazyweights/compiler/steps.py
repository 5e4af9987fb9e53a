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

from dataclasses import dataclass, field

from ..core.errors import BudgetError
from ..core.units import available_cpus, parse_size, paused_gc
from ..graph.layout import row_alignment, strided_layout
from ..graph.node import Node, toposort
from ..graph.opcodes import GroupOp, Op, OpTable
from ..graph.rewrites import merge_leading_axes, sink_casts, sink_slices
from ..io.source import SourceRecord

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
    blocks: list[range] = field(default_factory=list)
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
        if not self.blocks:
            return 0
        return max(len(b) for b in self.blocks) * self.work_per_row

    def order_key(self):
        """Sort key that orders steps by where they read: (file, offset of the first source, first output).

        Steps with no sources (constants) sort first, by output name.
        """
        srcs = self.sources
        if not srcs:
            return ("", 0, self.outputs[0])
        first = min(srcs, key=lambda r: (r.file.path, r.offset))
        return (first.file.path, first.offset, self.outputs[0])


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
        step = _build_step([name], *_rewritten(node), view_cache, keep_views)
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
    one walk finds that, and its order is the step's (a 90,000-tensor plan walked each chain four times)."""
    nodes = toposort([node])
    for n in nodes:
        if n.srcs and ((n.op is Op.SLICE and n.srcs[0].op not in GroupOp.Leaf)
                       or (n.op in GroupOp.Layout and n.srcs[0].op is Op.CAST)
                       or (n.op is Op.CONCAT and all(s.op is Op.CAST for s in n.srcs))):
            root = sink_slices(sink_casts(node))
            return root, toposort([root])
    return node, nodes


def _build_step(outputs: list[str], root: Node, nodes: list[Node] | None, view_cache: dict,
                keep_views: bool) -> Step:
    view = strided_layout(root, view_cache)
    if view is not None:
        kind = "view" if (view.c_contiguous and keep_views) else "copy"
    else:
        kind = "fused"
    step = Step(outputs, root, kind, nodes if nodes is not None else toposort([root]))
    step.whole = any(WHOLE_INPUT[n.op](n, view_cache) for n in step.nodes)
    step.work_per_row = _work_per_row(step, view_cache)
    step.streams = all(n is root or n.op in GroupOp.Leaf or n.op in GroupOp.Layout for n in step.nodes)
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
    step.blocks = [range(r, min(r + rows, nrows)) for r in range(0, nrows, rows)]


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
WHOLE_INPUT.register(Op.SOURCE, Op.CONST, Op.CAST, Op.BITCAST, Op.SLICE, Op.TAKE, Op.CONCAT, Op.BINARY,
                      Op.UNARY)(
    lambda n, views: False)
WHOLE_INPUT.register(Op.LORA)(lambda n, views: False)  # rows of W (and B); A is read whole by every block
WHOLE_INPUT.register(Op.SCATTER)(lambda n, views: False)  # the block's mask rows and the values under them

