"""The GPU executor's compiled plan: each step split into a host part and a device program, and cut into
row blocks under the GPU cost model (staging memory), so `run/gpu.py` only runs what it is given.

Cost model. The GPU executor's working memory is staging: per stream slot, a pinned host buffer holding a
block's SOURCE rows (e.g. bf16, or packed GGUF bytes) and, when a device program runs, a device buffer of
the same size. So `streams x (pinned + device)` must fit the budget, and blocks are cut by source bytes,
not by the CPU executor's output-plus-intermediates measure. A block that cannot be cut small enough for a
slot runs alone ("solo") with the whole budget; a BudgetError, before any work, if even that is too small.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> x = ops.const(np.zeros((64, 8), np.float32))
    >>> c = compile_gpu_steps({"y": ops.cast(x, "bfloat16")}, budget=4096, streams=2, block_bytes=1024)
    >>> [len(r) for r in c.steps[0].blocks], str(c.steps[0].program), c.pinned_bytes
    ([32, 32], 'cast[f32->bf16]', 1024)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

import numpy as np

from ..core.dtype import DType
from ..core.errors import BudgetError
from ..core.quantization import QuantizationEncoding
from ..core.units import parse_size
from ..graph.layout import nrows, row_alignment
from ..graph.node import Node
from ..graph.opcodes import Op, OpTable
from ..kernels.cuda_casts import DEVICE_CASTS
from ..kernels.cuda_dequant import DEVICE_DEQUANT
from .steps import DEFAULT_BUDGET, Step, compile_steps

# Source bytes per block: 8 MB copies already run at the link's full speed, and the staging memory (a slot per
# host thread, each a pinned and a device buffer of one block) is pinned afresh by each run, at ~0.5 ms per MB on
# the H200 host measured: 16 MB blocks with 16 slots cost 0.1 s more a load than 8 MB (benchmarks/RESULTS.md).
DEFAULT_GPU_BLOCK_BYTES = 8 << 20

UINT_OF_SIZE: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                                     8: np.dtype(np.uint64)}

# Where each op runs in the GPU executor: "device" ops may join the device program (`split_chain` checks
# dtypes, block types and ranks); every other op is part of the host part, read into pinned memory.
# Listed op by op, not filled by a loop, so a new op without a decision here fails `tests/graph/test_opcodes.py`.
GPU_SPLIT = OpTable("GPU split")
GPU_SPLIT.update({
    Op.SOURCE: "host", Op.CONST: "host",
    Op.RESHAPE: "host", Op.PERMUTE: "host", Op.SLICE: "host", Op.TAKE: "host", Op.CONCAT: "host",
    Op.CAST: "device", Op.BITCAST: "device", Op.DEQUANTIZE: "device",
    Op.QUANTIZE: "host",   # llama.cpp's quantizers run on the CPU
    Op.BINARY: "host",     # arithmetic between tensors (scales, LoRA deltas) stays on the host
    Op.UNARY: "host",      # exp/log/neg of small tensors (Mamba's A) beside the binary arithmetic
    Op.LORA: "host",       # the LoRA update runs in kernels/_clora.c on the host (the same bytes as the CPU path)
    Op.SCATTER: "host",    # a sparse bitmask's values put back in place (graph/scatter.py) before any device cast
})


@dataclass(frozen=True)
class DeviceProgram:
    """The value ops one step runs on the device, bottom-up: an optional GGUF dequantize (to float32), then
    a chain of casts `((src, dst), ...)` on bit patterns (same-size bitcasts just relabel the bits).
    One kernel per block."""

    src: DType                      # dtype of the host part's rows (uint8 for a dequantize)
    dequant: QuantizationEncoding | None = None
    chain: tuple = ()               # ((DType, DType), ...)
    out: DType = DType.float32      # dtype the kernel stores (the step's dtype, up to a same-size bitcast)

    @property
    def out_size(self) -> int:
        """Bytes per element the kernel stores (the size of `out`)."""
        return self.out.size_in_bytes

    def __str__(self) -> str:
        parts = [f"dequantize[{self.dequant.name}]"] if self.dequant is not None else []
        parts += [f"cast[{a.short}->{b.short}]" for a, b in self.chain]
        return " + ".join(parts) or "copy"

    def reference(self, src_u8: np.ndarray) -> np.ndarray:
        """What the kernel stores for packed/source bytes `src_u8`, computed with the numpy references:
        a flat array of unsigned ints of the output width."""
        from ..kernels.cuda_casts import reference_chain
        from ..kernels.cuda_dequant import reference_dequantize

        if self.dequant is not None:
            bits = reference_dequantize(self.dequant, src_u8).reshape(-1).view(np.uint32)
        else:
            bits = src_u8.view(UINT_OF_SIZE[self.src.size_in_bytes]).astype(np.uint32)
        if self.chain:
            bits = reference_chain(bits, self.chain)
        return bits.astype(UINT_OF_SIZE[self.out_size])


def split_chain(root: Node) -> tuple[Node, DeviceProgram | None]:
    """(host node, device program) for a step's (cast-sunk) root.

    Walks down from the root while the op is one the device runs: a cast in `DEVICE_CASTS`, a bitcast
    between same-size dtypes, or (at the bottom) a dequantize of a block type in `DEVICE_DEQUANT` on a
    tensor of 2+ dimensions (so output rows are input rows) whose target is float32 or reachable by a device
    cast. Everything below is the host part. Bitcasts directly over the host part stay on the host (a
    bitcast of a view is a view). No cast or dequantize on the device -> no program (a plain copy).

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> x = ops.const(np.zeros((4, 8), np.float32))
        >>> host, prog = split_chain(ops.cast(ops.permute(x, (1, 0)), "bfloat16"))
        >>> host.op, str(prog)
        ('permute', 'cast[f32->bf16]')
        >>> split_chain(ops.cast(x, "float64"))[1] is None   # not a device cast: all on the host
        True
    """
    walked: list[tuple[str, Node]] = []
    n = root
    while GPU_SPLIT[n.op] == "device":
        if n.op is Op.CAST and (n.srcs[0].dtype, n.dtype) in DEVICE_CASTS:
            walked.append(("cast", n))
            n = n.srcs[0]
            continue
        if (n.op is Op.BITCAST and n.srcs[0].dtype.size_in_bytes == n.dtype.size_in_bytes
                and n.srcs[0].shape == n.shape):
            walked.append(("bitcast", n))
            n = n.srcs[0]
            continue
        if n.op is Op.DEQUANTIZE and n.ndim >= 2 and n.srcs[0].ndim >= 2:
            encoding, dtype = n.arg
            if encoding in DEVICE_DEQUANT and (dtype is DType.float32 or (DType.float32, dtype) in DEVICE_CASTS):
                walked.append(("dequantize", n))
                n = n.srcs[0]
        break
    walked.reverse()  # bottom-up
    while walked and walked[0][0] == "bitcast":
        n = walked.pop(0)[1]
    if not any(kind != "bitcast" for kind, _ in walked):
        return root, None
    dequant, chain = None, []
    for kind, node in walked:
        if kind == "dequantize":
            dequant, dtype = node.arg
            if dtype is not DType.float32:
                chain.append((DType.float32, dtype))
        elif kind == "cast":
            chain.append((node.srcs[0].dtype, node.dtype))
    out = chain[-1][1] if chain else DType.float32
    return n, DeviceProgram(src=n.dtype, dequant=dequant, chain=tuple(chain), out=out)


@dataclass
class GpuStep:
    """One compiled step as the GPU executor runs it."""

    step: Step
    host: Node                      # the host part: its rows, in the source dtype, go to pinned memory
    program: DeviceProgram | None   # the device part (None: a plain host-to-device copy)
    host_row_bytes: int
    out_row_bytes: int
    blocks: list = field(default_factory=list)   # list[range]
    solo: set = field(default_factory=set)       # indices of blocks too big for a slot

    @property
    def name(self) -> str:
        """The step's first output name, which labels it in errors and progress."""
        return self.step.outputs[0]


class GpuPlan(NamedTuple):
    """A plan's steps for the GPU executor and the per-slot buffers it needs (pinned host, device staging)."""

    steps: list[GpuStep]
    pinned_bytes: int   # one slot's pinned buffer
    device_bytes: int   # one slot's device staging buffer (0 when no step runs a program)


def compile_gpu_steps(outputs: Mapping[str, Node], *, budget=None, streams: int = 4,
                      block_bytes: int = DEFAULT_GPU_BLOCK_BYTES) -> GpuPlan:
    """Fuse, order and share tied outputs as `compile_steps` does, then split and cut for the GPU."""
    budget = parse_size(budget) or DEFAULT_BUDGET
    # compile_steps' own blocks follow the CPU cost model; only its fusing, ordering and sharing are used
    # here (no merged rows: blocks are cut by source rows of the output node as the plan has it).
    steps = compile_steps(outputs, budget=1 << 62, workers=1, keep_views=False, merge_rows=False)
    gsteps = []
    for step in steps:
        host, program = split_chain(step.node)
        rows = nrows(step.node)
        gsteps.append(GpuStep(step, host, program, host.nbytes // max(1, rows), step.node.nbytes // max(1, rows)))
    has_program = any(g.program is not None for g in gsteps)
    limit = max(1, (budget // max(1, streams)) // (2 if has_program else 1))  # source bytes a slot's block may hold
    for g in gsteps:
        _cut(g, limit, int(block_bytes), budget)
    pinned = max((len(r) * g.host_row_bytes for g in gsteps for i, r in enumerate(g.blocks) if i not in g.solo),
                 default=0)
    device = max((len(r) * g.host_row_bytes for g in gsteps if g.program is not None
                  for i, r in enumerate(g.blocks) if i not in g.solo), default=0)
    return GpuPlan(gsteps, pinned, device)


def _cut(gs: GpuStep, limit: int, target: int, budget: int) -> None:
    """Cut a step into row blocks of at most min(target, limit) source bytes (aligned so no row is read
    twice); blocks that cannot be that small run alone ("solo") if they fit the whole budget."""
    node, step = gs.step.node, gs.step
    n_rows = nrows(node)
    if node.size == 0:
        gs.blocks = []
        return
    factor = 2 if gs.program is not None else 1
    row = max(1, gs.host_row_bytes)
    if step.whole or not node.shape:
        gs.blocks = [range(0, n_rows)]
    else:
        align = row_alignment(node)
        rows = max(1, min(target, limit) // row)
        rows = max(align, rows // align * align)
        gs.blocks = [range(r, min(r + rows, n_rows)) for r in range(0, n_rows, rows)]
    for i, rows in enumerate(gs.blocks):
        need = len(rows) * gs.host_row_bytes
        if need > limit:
            if need * factor > budget:
                what = "must be computed whole and" if len(rows) == n_rows else f"in blocks of {len(rows)} row(s)"
                raise BudgetError(
                    f"tensor {gs.name!r} ({node.dtype.name}{list(node.shape)}) {what} needs "
                    f"{need * factor} bytes of pinned{' + device' if factor == 2 else ''} staging memory, more "
                    f"than the budget of {budget} bytes"
                )
            gs.solo.add(i)
