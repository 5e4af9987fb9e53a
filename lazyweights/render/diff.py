"""`diff_plans(a, b)`: how two plans differ, output by output (what `Plan.diff` returns).

Two plans are compared by output name. An output in only one of them is listed as such; an output in both
is *changed* when its chain differs: the chain is written as numbered lines, inputs first, the way
`explain()` prints it, except that a source is named by its stored tensor name, type and encoding, not by
its file and offset (two checkpoints of one model differ in where each tensor lies, not in what it is):

    %0:u8[256,440] = source[Q5_0] 'blk.0.attn_k.weight'
    %1:bf16[256,640] = dequantize[Q5_0->bf16] %0

So a renamed source, an added, removed or re-argued op (a cast to f16 instead of bf16, another permutation),
and a changed dtype or shape all show, as lines removed and added. `str(diff)` folds outputs that differ
the same way in every numbered layer into one entry (`model.layers.{0..17}.mlp.up_proj.weight`, x18);
`diff.to_html()` draws both plans side by side in the viewer with the differing outputs marked.

Example:
    >>> import numpy as np
    >>> from lazyweights import WeightData, DType, plan
    >>> w = WeightData.from_numpy(np.zeros((4, 2), np.float32), "w")
    >>> d = plan({"a": w.astype(DType.float16), "b": w}).diff(plan({"a": w.astype(DType.bfloat16), "c": w}))
    >>> d.only_a, d.only_b, list(d.changed), d.same
    (['b'], ['c'], ['a'], [])
    >>> print(d)
    plan diff: a has 2 outputs, b has 2; 1 only in a, 1 only in b, 1 changed, 0 the same
    only in a (1):
      - b
    only in b (1):
      + c
    changed (1):
      ~ a  (type f16[4,2] -> bf16[4,2]; ops)
          %0:f32[4,2] = const [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        - %1:f16[4,2] = cast[f16] %0
        + %1:bf16[4,2] = cast[bf16] %0
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..core.errors import ArgumentTypeError, UsageError
from ..core.names import name_pattern
from ..graph.node import Node, toposort
from ..graph.opcodes import Op
from .explain import op_label, type_str

__all__ = ["PlanDiff", "ChainChange", "diff_plans", "chain_lines"]


def chain_lines(root: Node) -> list[str]:
    """An output's chain as comparable lines (see the module docstring): numbered inputs first, sources by
    stored name, small constants by value.

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> chain_lines(ops.permute(ops.const(np.zeros((2, 3), np.float32)), (1, 0)))
        ['%0:f32[2,3] = const [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]', '%1:f32[3,2] = permute[1,0] %0']
    """
    ids: dict[Node, int] = {}
    lines = []
    for n in toposort([root]):
        ids[n] = len(ids)
        rhs = op_label(n)
        if n.op is Op.SOURCE:
            rhs += f" {n.arg.name!r}"
        elif n.op is Op.CONST and n.arg.array.size <= 8:
            rhs += " " + repr([float(v) if np.issubdtype(n.arg.array.dtype, np.floating) else int(v)
                               for v in n.arg.array.reshape(-1)])
        args = " ".join(f"%{ids[s]}" for s in n.srcs)
        lines.append(f"%{ids[n]}:{type_str(n)} = {rhs}" + (f" {args}" if args else ""))
    return lines


@dataclass
class ChainChange:
    """How one output's chain differs between the two plans.

    `a`, `b`: its chain lines in each plan; `lines`: the comparison, one line each, prefixed `"  "` (in
    both), `"- "` (only in a) or `"+ "` (only in b); `what`: which parts differ, among "type" (the output's
    dtype or shape), "source" (a stored tensor's name, type or encoding) and "ops" (ops or their arguments)."""

    name: str
    a: list[str]
    b: list[str]
    lines: list[str]
    what: list[str]

    def summary(self) -> str:
        """`type f16[4,2] -> bf16[4,2]; ops`: what differs, in a few words."""
        parts = []
        for w in self.what:
            if w == "type":
                parts.append(f"type {self.a[-1].split(' = ')[0].split(':', 1)[1]} -> "
                             f"{self.b[-1].split(' = ')[0].split(':', 1)[1]}")
            else:
                parts.append(w)
        return "; ".join(parts)


def _compare(name: str, a: list[str], b: list[str]) -> ChainChange:
    lines = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            lines += ["  " + x for x in a[i1:i2]]
        else:
            lines += ["- " + x for x in a[i1:i2]]
            lines += ["+ " + x for x in b[j1:j2]]
    what = []
    if a[-1].split(" = ")[0].split(":", 1)[1] != b[-1].split(" = ")[0].split(":", 1)[1]:
        what.append("type")
    a_src = [x.split(" = ", 1)[1] for x in a if " = source" in x]
    b_src = [x.split(" = ", 1)[1] for x in b if " = source" in x]
    if a_src != b_src or [x.split(" = ")[0] for x in a if " = source" in x] != \
            [x.split(" = ")[0] for x in b if " = source" in x]:
        what.append("source")

    def ops(lines_):
        return [x.split(" = ", 1)[1].split(" ")[0] for x in lines_ if " = source" not in x]

    if ops(a) != ops(b):
        what.append("ops")
    if not what:  # same types, sources and op texts: the wiring or an input type differs
        what.append("ops")
    return ChainChange(name, a, b, lines, what)


_NUMBERED = re.compile(r"(?<=\.)\d+(?=\.)|(?<=^)\d+(?=\.)")


def _fold_key(line: str) -> str:
    """A diff line with the layer numbers of the names in it blanked, so equal changes in every layer fold."""
    return re.sub(r"'[^']*'", lambda m: _NUMBERED.sub("#", m.group()), line)


@dataclass
class PlanDiff:
    """The difference between two plans (`Plan.diff`), output by output.

    `only_a` / `only_b`: output names in one plan only (each plan's order); `changed`: name -> `ChainChange`
    for outputs in both whose chains differ; `same`: names whose chains are equal. True when anything
    differs. `str()` is the text report; `to_html()` / `visualize(path)` the two plans side by side in the
    viewer with the differing outputs marked."""

    a: object
    b: object
    only_a: list[str]
    only_b: list[str]
    changed: dict[str, ChainChange]
    same: list[str]
    labels: tuple[str, str] = ("a", "b")
    _groups: list = field(default_factory=list, repr=False)

    def __bool__(self) -> bool:
        return bool(self.only_a or self.only_b or self.changed)

    def groups(self) -> list[tuple[list[str], ChainChange]]:
        """Changed outputs folded: outputs whose names differ only in layer numbers and whose chains changed the
        same way are one entry, (names, the first one's change)."""
        if not self._groups:
            buckets: dict[tuple, list[str]] = {}
            for name, ch in self.changed.items():
                key = (tuple("#" if c.isdigit() else c for c in name.split(".")),
                       tuple(_fold_key(x) for x in ch.lines))
                buckets.setdefault(key, []).append(name)
            self._groups = [(names, self.changed[names[0]]) for names in buckets.values()]
        return self._groups

    def __str__(self) -> str:
        la, lb = self.labels
        both = len(self.changed) + len(self.same)
        na, nb = len(self.only_a) + both, len(self.only_b) + both
        out = [f"plan diff: {la} has {na} outputs, {lb} has {nb}; {len(self.only_a)} only in {la}, "
               f"{len(self.only_b)} only in {lb}, {len(self.changed)} changed, {len(self.same)} the same"]
        for label, names, sign in ((la, self.only_a, "-"), (lb, self.only_b, "+")):
            if names:
                out.append(f"only in {label} ({len(names)}):")
                out += [f"  {sign} {name}" for name in names]
        if self.changed:
            out.append(f"changed ({len(self.changed)}):")
            for names, ch in self.groups():
                count = f" (x{len(names)})" if len(names) > 1 else ""
                out.append(f"  ~ {name_pattern(names)}{count}  ({ch.summary()})")
                out += ["    " + x for x in ch.lines]
        return "\n".join(out)

    def __repr__(self) -> str:
        return (f"<PlanDiff: {len(self.only_a)} only in {self.labels[0]}, {len(self.only_b)} only in "
                f"{self.labels[1]}, {len(self.changed)} changed, {len(self.same)} the same>")

    def to_html(self, group_layers: bool = True) -> str:
        """The viewer page with both plans side by side, differing outputs marked (see `render/visualize.py`)."""
        from .visualize import diff_html

        return diff_html(self, group_layers=group_layers)

    def visualize(self, path, group_layers: bool = True) -> str:
        """Write `to_html()` to `path` (an .html file, written atomically). Returns the path."""
        from .visualize import write_text

        path = os.fspath(path)
        if os.path.splitext(path)[1].lower() not in (".html", ".htm"):
            raise UsageError(f"a plan diff is drawn as .html, not {os.path.basename(path)!r}")
        write_text(path, self.to_html(group_layers=group_layers))
        return path


def _outputs(p, which: str) -> dict[str, Node]:
    outputs = getattr(p, "outputs", p)
    if not isinstance(outputs, Mapping) or not all(isinstance(v, Node) for v in outputs.values()):
        raise ArgumentTypeError(f"Plan.diff: plan {which} must be a Plan (or a dict of name -> graph node), got "
                                f"{type(p).__name__}")
    return dict(outputs)


def diff_plans(a, b, labels: tuple[str, str] = ("a", "b")) -> PlanDiff:
    """Compare two plans output by output (see the module docstring). `a`, `b`: Plans (anything with
    `.outputs`) or dicts of name -> node; `labels`: their names in the report."""
    oa, ob = _outputs(a, labels[0]), _outputs(b, labels[1])
    only_a = [n for n in oa if n not in ob]
    only_b = [n for n in ob if n not in oa]
    changed: dict[str, ChainChange] = {}
    same: list[str] = []
    cache: dict[Node, list[str]] = {}

    def lines(node):
        got = cache.get(node)
        if got is None:
            got = cache[node] = chain_lines(node)
        return got

    for name, node in oa.items():
        if name not in ob:
            continue
        la, lb = lines(node), lines(ob[name])
        if la == lb:
            same.append(name)
        else:
            changed[name] = _compare(name, la, lb)
    return PlanDiff(a, b, only_a, only_b, changed, same, tuple(labels))  # type: ignore[arg-type]
