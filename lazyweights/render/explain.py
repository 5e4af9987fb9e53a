"""`explain(plan)`: a plan as readable, jaxpr-like text, one line per node.

    %0:bf16[256,256] = source model.safetensors@0x2b8 'model.layers.0.self_attn.q_proj.weight'
    %1:bf16[4,64,256] = reshape %0
    %2:bf16[4,64,256] = take[axis=1 [0:64:2,1:64:2]] %1
    %3:bf16[256,256] = reshape %2
    %4:f16[256,256] = cast[f16] %3
    out 'layers.0.attention.q_proj.weight' = %4

Nodes are numbered in topological order (inputs first); sources show the file's basename, the byte
offset and the stored name. A model with many layers stays readable: outputs whose names differ only in
integer components (`layers.0`, `layers.1`, ...) and whose chains have the same structure (ops, args,
dtypes, shapes; sources may differ in name, file and offset) are printed once, as
`layers.{0..21}.attention.q_proj.weight`, with a count. A summary gives the bytes read from sources (each
source once), the bytes written (each output), and the peak memory the reference executor would need.
If the scheduler (`lazyweights.compiler.steps.compile_steps`) is available, its fused steps are listed too.

The grouping is shared with `lazyweights.render.visualize` through `build_view`.

Example:
    >>> import numpy as np
    >>> from lazyweights import WeightData, DType, plan
    >>> w = WeightData.from_numpy(np.zeros((2, 4), np.float32), "w")
    >>> print(explain(plan({"a": w.astype(DType.float16).T}), steps=False))  # doctest: +NORMALIZE_WHITESPACE
    plan: 1 tensor, 3 nodes
      %0:f32[2,4] = const
      %1:f16[2,4] = cast[f16] %0
      %2:f16[4,2] = permute[1,0] %1
      out 'a' = %2
    <BLANKLINE>
    summary:
      tensors   1 (0 zero-copy)
      nodes     3
      read      0 B from 0 source tensors in 0 files (+ 32 B of in-memory constants)
      written   16 B
      peak      32 B estimated for the reference executor
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Mapping

from ..compiler.steps import compile_steps
from ..core.errors import UsageError
from ..core.names import name_pattern
from ..core.units import format_bytes
from ..graph.node import Node, toposort
from ..graph.opcodes import Op, OpTable

__all__ = ["explain", "build_view", "View", "ViewNode", "ViewGroup", "name_pattern", "format_bytes",
           "op_label", "estimate_peak_memory"]


# --- small formatting helpers -------------------------------------------------------------------------
def type_str(node: Node) -> str:
    """`f16[2048,2048]`."""
    return f"{node.dtype.short}[{','.join(str(d) for d in node.shape)}]"


def _range_text(start: int, stop: int, step: int, dim: int) -> str:
    if (start, stop, step) == (0, dim, 1):
        return ":"
    s = f"{start}:{stop}"
    return s if step == 1 else f"{s}:{step}"


# The text of each op's argument in a plan listing (`%3:f16[4,4] = cast[f16] %2`); '' prints no brackets.
EXPLAIN = OpTable("explain text")


def op_arg(node: Node) -> str:
    """The bracketed argument of a node's op, without brackets ('' when there is none)."""
    return EXPLAIN[node.op](node)


@EXPLAIN.register(Op.CAST, Op.BITCAST)
def _arg_dtype(node: Node) -> str:
    return node.arg.short


@EXPLAIN.register(Op.PERMUTE)
def _arg_permute(node: Node) -> str:
    return ",".join(str(a) for a in node.arg)


@EXPLAIN.register(Op.SLICE)
def _arg_slice(node: Node) -> str:
    return ",".join(_range_text(a, b, c, d) for (a, b, c), d in zip(node.arg, node.srcs[0].shape))


@EXPLAIN.register(Op.TAKE)
def _arg_take(node: Node) -> str:
    axis, idx = node.arg
    return f"axis={axis} {index_text(idx.array, node.srcs[0].shape[axis])}"


@EXPLAIN.register(Op.CONCAT)
def _arg_concat(node: Node) -> str:
    return f"axis={node.arg}"


@EXPLAIN.register(Op.DEQUANTIZE)
def _arg_dequantize(node: Node) -> str:
    enc, dt = node.arg
    return f"{enc.name}->{dt.short}"


@EXPLAIN.register(Op.QUANTIZE)
def _arg_quantize(node: Node) -> str:
    enc, importance, reason = node.arg
    return enc.name + (" imatrix" if importance is not None else "") + (f"; {reason}" if reason else "")


@EXPLAIN.register(Op.SOURCE)
def _arg_source(node: Node) -> str:
    return node.arg.encoding.name if getattr(node.arg, "encoding", None) is not None else ""


@EXPLAIN.register(Op.BINARY, Op.UNARY)
def _arg_elementwise(node: Node) -> str:
    return node.arg  # mul, add, sub, div; exp, log, neg


@EXPLAIN.register(Op.LORA)
def _arg_lora(node: Node) -> str:
    return ", ".join(f"{scale:g}{' T' if transposed else ''}" for scale, transposed in node.arg)


@EXPLAIN.register(Op.SCATTER)
def _arg_scatter(node: Node) -> str:
    return f"cols={node.arg}" + (" row_offsets" if len(node.srcs) > 2 else "")


@EXPLAIN.register(Op.CONST, Op.RESHAPE)
def _arg_none(node: Node) -> str:
    return ""  # the result type shows the shape


def index_text(idx, dim: int | None = None, limit: int = 48) -> str:
    """Gather indices as Python slices where they run: a RoPE permutation of 64 is `[0:64:2,1:64:2]`,
    a reversal `[63::-1]`; short lists are written out; long irregular ones are cut (`...(4096)`)."""
    vals = [int(v) for v in idx]
    parts, i, n = [], 0, len(vals)
    while i < n:
        j = i + 1
        if j < n:
            step = vals[j] - vals[i]
            while step != 0 and j + 1 < n and vals[j + 1] - vals[j] == step:
                j += 1
            if step != 0 and j - i + 1 >= 5:
                start, stop = vals[i], vals[j] + (1 if step > 0 else -1)
                if dim is not None and step > 0 and vals[j] + step >= dim:
                    stop = dim  # a run to the end of the axis: 0:64:2 rather than 0:63:2
                stop_s = "" if stop < 0 else str(stop)
                parts.append(f"{start}:{stop_s}" if step == 1 else f"{start}:{stop_s}:{step}")
                i = j + 1
                continue
        parts.append(str(vals[i]))
        i += 1
    text = ",".join(parts)
    if len(text) > limit:
        cut = text[:limit].rsplit(",", 1)[0]
        text = f"{cut},...({n})"
    return f"[{text}]"


def op_label(node: Node) -> str:
    """`cast[f16]`, `reshape`, `take[axis=1 [0,2,...]]`."""
    a = op_arg(node)
    return f"{node.op}[{a}]" if a else node.op


def _template(name: str) -> tuple[str, ...]:
    """Dot components with integer components blanked: 'layers.3.w' -> ('layers', '#', 'w')."""
    return tuple("#" if c.isdigit() else c for c in name.split("."))


# --- the view: numbered, grouped nodes shared by text and pictures ------------------------------------------
@dataclass
class ViewNode:
    """One printed node. In a group it stands for `count` plan nodes (one per member output)."""

    id: int                      # printed number: %id
    node: Node                   # the representative plan node
    members: list[Node]          # every plan node it stands for (len == count)
    srcs: list[int]              # ids of its inputs
    group: int                   # index of the ViewGroup it is printed in
    shared: bool                 # used by more than one output (printed once, not per member)

    @property
    def count(self) -> int:
        """How many plan nodes this printed node stands for."""
        return len(self.members)

    @property
    def op(self) -> str:
        """The op of the representative node (`"cast"`, `"source"`, ...)."""
        return self.node.op

    @property
    def nbytes(self) -> int:
        """Bytes of the representative node (one member)."""
        return self.node.nbytes

    @property
    def total_nbytes(self) -> int:
        """Bytes of all the plan nodes it stands for."""
        return sum(m.nbytes for m in self.members)

    def source_text(self) -> str:
        """For a source: `file@0xOFF 'name'` (patterns over the members when grouped)."""
        recs = [m.arg for m in self.members]
        files = list(dict.fromkeys(os.path.basename(r.file.path) for r in recs))
        fname = name_pattern(files)
        if len(recs) == 1:
            where = f"{fname}@{recs[0].offset:#x}"
        else:
            where = fname
        return f"{where} {name_pattern(r.name for r in recs)!r}"

    def line(self) -> str:
        """`%3:f16[2048,2048] = cast[f16] %2`."""
        rhs = op_label(self.node)
        if self.node.op is Op.SOURCE:
            rhs += " " + self.source_text()
        args = " ".join(f"%{s}" for s in self.srcs)
        return f"%{self.id}:{type_str(self.node)} = {rhs}" + (f" {args}" if args else "")


@dataclass
class ViewGroup:
    """Outputs printed as one chain: one output, or many whose names differ only in integers."""

    index: int
    names: list[str]             # member output names, plan order
    out_ids: list[int]           # printed id of each member's output node (all equal for a group of >1)
    nodes: list[int] = field(default_factory=list)  # ids printed in this group's block

    @property
    def count(self) -> int:
        """How many outputs the group prints as one chain."""
        return len(self.names)

    @property
    def label(self) -> str:
        """The outputs' names folded into one label (`layers.{0..21}.mlp.up_proj.weight`)."""
        return name_pattern(self.names)


@dataclass
class View:
    """A plan numbered and grouped for display."""

    outputs: dict[str, Node]     # the (filtered) outputs, plan order
    nodes: list[ViewNode]
    groups: list[ViewGroup]
    all_nodes: list[Node]        # every plan node the outputs need, topological order
    ids: dict[Node, int]         # plan node -> printed id (only representatives and shared nodes)
    grouped: bool

    def stats(self) -> dict:
        """The plan's counts and bytes (`plan_stats`) over the nodes of this view."""
        return plan_stats(self.outputs, self.all_nodes)


def _arg_key(n: Node):
    """What must agree for two nodes to print as one line: sources agree on everything but where they are."""
    if n.op is Op.SOURCE:
        r = n.arg
        return ("source", r.dtype, r.shape, getattr(r, "encoding", None))
    if n.op is Op.CONST:
        return ("const",)
    return n.arg


def filter_outputs(outputs: Mapping[str, Node], pattern: str | None) -> dict[str, Node]:
    """Outputs whose names match the fnmatch glob `pattern` (all when None). LazyWeightsError if none do."""
    outputs = dict(outputs)
    if pattern is None:
        return outputs
    kept = {k: v for k, v in outputs.items() if fnmatch.fnmatchcase(k, pattern)}
    if not kept and outputs:
        sample = ", ".join(repr(k) for k in list(outputs)[:3])
        raise UsageError(f"filter {pattern!r} matches none of the {len(outputs)} outputs (e.g. {sample})")
    return kept


def build_view(plan_or_outputs, filter: str | None = None, group_layers: bool = True) -> View:
    """Number and group a plan's nodes for display (see the module docstring)."""
    outputs = plan_or_outputs.outputs if hasattr(plan_or_outputs, "outputs") else plan_or_outputs
    outputs = filter_outputs(outputs, filter)
    names = list(outputs)
    chains = {name: toposort([outputs[name]]) for name in names}

    owners: dict[Node, int] = {}
    for name in names:
        for n in chains[name]:
            owners[n] = owners.get(n, 0) + 1
    # Two output names on one node: the node is shared between them.

    def signature(chain: list[Node]):
        local: dict[Node, int] = {}
        sig: list[tuple] = []
        for n in chain:
            key: tuple
            if owners[n] > 1:
                key = ("shared", n)
            else:
                key = (n.op, _arg_key(n), n.dtype, n.shape, tuple(local[s] for s in n.srcs))
            local[n] = len(sig)
            sig.append(key)
        return tuple(sig)

    buckets: dict[tuple, list[str]] = {}
    for name in names:
        key: tuple
        if group_layers and any(c.isdigit() for c in name.split(".")):
            key = ("g", _template(name), signature(chains[name]))
        else:
            key = ("n", name)
        buckets.setdefault(key, []).append(name)

    vnodes: list[ViewNode] = []
    ids: dict[Node, int] = {}
    groups: list[ViewGroup] = []
    for gi, members in enumerate(buckets.values()):
        group = ViewGroup(gi, members, [])
        rep = chains[members[0]]
        member_chains = [chains[m] for m in members]
        for pos, n in enumerate(rep):
            if n in ids:
                continue
            shared = owners[n] > 1
            nodes_for = [n] if shared else [c[pos] for c in member_chains]
            vid = len(vnodes)
            vnodes.append(ViewNode(vid, n, nodes_for, [ids[s] for s in n.srcs], gi, shared))
            ids[n] = vid
            if not shared:
                for m in nodes_for[1:]:
                    ids.setdefault(m, vid)
            group.nodes.append(vid)
        group.out_ids = [ids[outputs[m]] for m in members]
        groups.append(group)
    return View(outputs, vnodes, groups, toposort(outputs.values()), ids, group_layers)


# --- statistics ---------------------------------------------------------------------------------------
_ALLOCATING = frozenset({"cast", "take", "concat", "dequantize", "quantize", "binary", "unary", "lora", "scatter"})


def estimate_peak_memory(outputs: Mapping[str, Node], order: list[Node] | None = None) -> int:
    """Peak bytes of arrays the reference executor (`run.reference.evaluate`) holds at once.

    It evaluates nodes in topological order, frees an intermediate after its last use and keeps every
    output until the end. Sources are views of the memory map (not counted); reshape, permute, slice and
    bitcast are numpy views where numpy allows (a reshape or size-changing bitcast of a non-contiguous
    array copies); cast, take, concat, dequantize and quantize allocate their result. Finally each output
    is made C-contiguous, which copies the non-contiguous ones.
    """
    roots = list(outputs.values())
    order = order if order is not None else toposort(roots)
    remaining: dict[Node, int] = {}
    for n in order:
        for s in n.srcs:
            remaining[s] = remaining.get(s, 0) + 1
    for r in roots:
        remaining[r] = remaining.get(r, 0) + 1
    buffer: dict[Node, Node | None] = {}     # node -> the node owning its memory (None: not counted)
    contiguous: dict[Node, bool] = {}
    refs: dict[Node, int] = {}               # owning node -> live values referring to it
    live = peak = 0

    def hold(owner):
        nonlocal live
        if owner is None:
            return
        if refs.get(owner, 0) == 0:
            live += owner.nbytes
        refs[owner] = refs.get(owner, 0) + 1

    def release(owner):
        nonlocal live
        if owner is None:
            return
        refs[owner] -= 1
        if refs[owner] == 0:
            live -= owner.nbytes

    for n in order:
        op = n.op
        src = n.srcs[0] if n.srcs else n  # a leaf (no inputs) takes the first branch and never reads src
        owner: Node | None
        if op in (Op.SOURCE, Op.CONST):
            owner, contig = None, True
        elif op in _ALLOCATING:
            owner, contig = n, True
        elif op is Op.RESHAPE:
            owner, contig = (buffer[src], True) if contiguous[src] else (n, True)
        elif op is Op.BITCAST:
            same = src.dtype.size_in_bytes == n.dtype.size_in_bytes
            owner, contig = (buffer[src], contiguous[src]) if (same or contiguous[src]) else (n, True)
        elif op is Op.PERMUTE:
            moved = [d for d in n.shape if d != 1]
            owner, contig = buffer[src], contiguous[src] and len(moved) <= 1
        elif op is Op.SLICE:
            owner = buffer[src]
            dims = src.shape
            # contiguous if only the leading sliced axis is cut (step 1) and later axes are whole
            cut = [i for i, ((a, b, c), d) in enumerate(zip(n.arg, dims)) if (a, b, c) != (0, d, 1)]
            contig = contiguous[src] and (not cut or (len(cut) == 1 and n.arg[cut[0]][2] == 1
                                                        and all(dims[j] == 1 for j in range(cut[0]))))
        else:
            owner, contig = n, True
        buffer[n], contiguous[n] = owner, contig
        hold(owner)
        peak = max(peak, live)
        if op is Op.DEQUANTIZE and n.arg[1].size_in_bytes != 4:
            peak = max(peak, live + n.size * 4)  # values are decoded as float32, then cast
        for s in n.srcs:
            remaining[s] -= 1
            if remaining[s] == 0:
                release(buffer[s])
    # materialize(): np.ascontiguousarray of each output, while all outputs are held.
    for r in dict.fromkeys(roots):
        if not contiguous.get(r, True):
            live += r.nbytes
            peak = max(peak, live)
    return peak


def plan_stats(outputs: Mapping[str, Node], nodes: list[Node] | None = None) -> dict:
    """Counts and bytes of a plan: tensors, nodes, bytes read (each source once), written, peak."""
    nodes = nodes if nodes is not None else toposort(outputs.values())
    sources = [n for n in nodes if n.op is Op.SOURCE]
    consts = [n for n in nodes if n.op is Op.CONST]
    files = {n.arg.file.path for n in sources}
    return {
        "tensors": len(outputs),
        "nodes": len(nodes),
        "zero_copy": sum(1 for n in outputs.values() if n.op in (Op.SOURCE, Op.CONST)),
        "sources": len(sources),
        "files": len(files),
        "bytes_read": sum(n.arg.nbytes for n in sources),
        "const_bytes": sum(n.nbytes for n in consts),
        "bytes_written": sum(n.nbytes for n in outputs.values()),
        "peak_bytes": estimate_peak_memory(outputs, nodes),
    }


# --- steps from the scheduler -------------------------------------------------------------------------------
def compile_outputs(outputs: Mapping[str, Node]):
    """The compiler's steps for these outputs (name -> node); None where no compiler is set (tests)."""
    if compile_steps is None:
        return None
    return compile_steps(outputs)


def _steps_header(steps) -> str:
    kinds: dict[str, int] = {}
    for st in steps:
        k = str(getattr(st, "kind", "?"))
        kinds[k] = kinds.get(k, 0) + 1
    head = f"steps: {len(steps)} (" + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")"
    blocks = [b for b in (getattr(st, "blocks", None) for st in steps) if b is not None]
    if steps and len(blocks) == len(steps):
        nblocks = sum(len(b) for b in blocks)
        largest = max((getattr(st, "block_bytes", 0) or 0) for st in steps)
        head += f", {nblocks} block{'s' if nblocks != 1 else ''} at the default budget"
        if largest:
            head += f", largest block {format_bytes(largest)}"
    return head


def _step_lines(steps, view: View) -> list[str]:
    group_of = {}
    for g in view.groups:
        for name in g.names:
            group_of[name] = g.index
    buckets: dict[tuple, list] = {}
    for step in steps:
        outs = list(getattr(step, "outputs", ()))
        nodes = list(getattr(step, "nodes", ()))
        kind = str(getattr(step, "kind", "?"))
        chain = tuple(n.op for n in nodes)
        key = (kind, chain, tuple(_template(o) for o in outs),
               tuple(group_of.get(o, -1) for o in outs) if view.grouped else tuple(outs))
        buckets.setdefault(key, []).append(outs)
    lines = []
    width = max((len(k[0]) for k in buckets), default=5)
    for (kind, chain, _, _), members in buckets.items():
        per_pos = list(zip(*members)) if members and members[0] else []
        names = ", ".join(name_pattern(col) for col in per_pos) or "(no outputs)"
        count = f"x{len(members)}" if len(members) > 1 else ""
        ops_text = " -> ".join(chain) if chain else "-"
        lines.append(f"  {kind:<{width}} {count:>4} {names}: {ops_text}")
    return lines


# --- the text ----------------------------------------------------------------------------------------------
def explain(plan, filter: str | None = None, group_layers: bool = True, steps: bool | None = None) -> str:
    """The plan as text: numbered nodes, outputs, optional fused steps, and a summary.

    `filter`: an fnmatch glob on output names; only the nodes those outputs need are shown.
    `group_layers`: print chains repeated across numbered layers once (`layers.{0..21}.w`).
    `steps`: include the scheduler's fused steps; None (default) includes them when
    `lazyweights.compiler.steps.compile_steps` is importable.
    """
    view = build_view(plan, filter=filter, group_layers=group_layers)
    st = view.stats()
    t = st["tensors"]
    head = f"plan: {t} tensor{'s' if t != 1 else ''}, {st['nodes']} node{'s' if st['nodes'] != 1 else ''}"
    if view.grouped and len(view.groups) < t:
        head += f" (printed as {len(view.groups)} chains; repeated layers once)"
    lines = [head]
    for g in view.groups:
        if g.index:
            lines.append("")
        if g.count > 1:
            lines.append(f"  # x{g.count} {g.label}: one chain, printed once")
        for vid in g.nodes:
            lines.append("  " + view.nodes[vid].line())
        if g.count > 1:
            lines.append(f"  out {g.label!r} = %{g.out_ids[0]}")
        else:
            lines.append(f"  out {g.names[0]!r} = %{g.out_ids[0]}")

    if steps is not False:
        try:
            compiled = compile_outputs(view.outputs)
        except Exception as e:  # a scheduler bug must not hide the plan itself
            lines += ["", f"steps: unavailable: the scheduler failed: {type(e).__name__}: {e}"]
        else:
            if compiled is not None:
                lines += ["", _steps_header(compiled)]
                lines += _step_lines(compiled, view)

    read = f"{format_bytes(st['bytes_read'])} from {st['sources']} source tensor{'s' if st['sources'] != 1 else ''}" \
           f" in {st['files']} file{'s' if st['files'] != 1 else ''}"
    if st["const_bytes"]:
        read += f" (+ {format_bytes(st['const_bytes'])} of in-memory constants)"
    lines += [
        "",
        "summary:",
        f"  tensors   {st['tensors']} ({st['zero_copy']} zero-copy)",
        f"  nodes     {st['nodes']}",
        f"  read      {read}",
        f"  written   {format_bytes(st['bytes_written'])}",
        f"  peak      {format_bytes(st['peak_bytes'])} estimated for the reference executor",
    ]
    return "\n".join(lines) + "\n"
