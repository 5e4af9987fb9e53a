"""Pictures of a plan: a networkx graph, Graphviz (.dot/.svg/.png), Mermaid (.mmd) and a self-contained .html.

`to_networkx(plan)` gives every node of the plan (ids `%0`, `%1`, ... in topological order) with its op,
argument, dtype, shape, bytes, source file/offset/name and the outputs that use it.

`visualize(plan, path)` draws the grouped view by default: chains repeated across numbered layers are drawn
once with a count (`x22`), as `explain()` prints them. Each output's chain sits in a dashed box: one fused
step of the scheduler (`fused`, `copy` or `view`). Nodes are coloured by op.

    .dot          Graphviz source (written here; no Python graphviz package needed)
    .svg / .png   rendered by Graphviz's `dot` program, which must be on PATH
    .mmd          a Mermaid flowchart (renders in GitHub markdown inside a ```mermaid block)
    .html         one self-contained file to open offline: inline SVG, CSS and JS (no network), with
                  hover/click details, zoom and pan, search, a legend, and a switch to the ungrouped view

Example:
    >>> import numpy as np, tempfile, os
    >>> from lazyweights import WeightData, DType, plan
    >>> w = WeightData.from_numpy(np.zeros((4, 2), np.float32), "w")
    >>> p = plan({"a": w.astype(DType.float16).T})
    >>> g = p.to_networkx()
    >>> [(n, d["op"]) for n, d in g.nodes(data=True)]
    [('%0', 'const'), ('%1', 'cast'), ('%2', 'permute')]
    >>> path = p.visualize(os.path.join(tempfile.mkdtemp(), "plan.mmd"))
    >>> open(path).read().splitlines()[0]
    'flowchart LR'
"""
from __future__ import annotations

import html as _html
import json
import logging
import math
import os
import re
import shutil
import subprocess
from importlib import resources
from typing import Callable

from ..core.errors import DependencyError, ExecutionError, LazyWeightsError, UsageError
from ..graph.node import Node, toposort
from ..graph.opcodes import Op
from ..io.atomic import commit_file, staging_name, write_file_atomically
from .describe import box_label, op_details, short_name
from .explain import (
    View,
    build_view,
    compile_outputs,
    explain,
    format_bytes,
    name_pattern,
    op_arg,
    op_label,
    plan_stats,
    type_str,
)

__all__ = ["to_networkx", "visualize", "to_dot", "to_mermaid", "to_html", "diff_html", "build_scene", "OP_COLORS",
           "viewer_asset", "write_text"]

# Fill colours by op (ColorBrewer-like, readable with black text).
OP_COLORS = {
    "source": "#9ecae1",
    "const": "#d9d9d9",
    "cast": "#fdae6b",
    "bitcast": "#fdd49e",
    "reshape": "#c7e9c0",
    "permute": "#a1d99b",
    "slice": "#d9f0a3",
    "take": "#bcbddc",
    "concat": "#9e9ac8",
    "dequantize": "#fc9272",
    "quantize": "#fcbba1",
    "output": "#ffffff",
}
_OTHER_COLOR = "#eeeeee"
_log = logging.getLogger(__name__)
KIND_COLORS = {"fused": "#d94801", "copy": "#2171b5", "view": "#238b45", "chain": "#737373"}
_LAYOUT_OPS = frozenset({"reshape", "permute", "slice", "bitcast"})
SUFFIXES = (".dot", ".gv", ".svg", ".png", ".mmd", ".html", ".htm")


# --- networkx -----------------------------------------------------------------------------------------------
def to_networkx(plan):
    """The plan as a `networkx.DiGraph`: nodes `%N` (topological order), edges input -> user.

    Node attributes: op, arg (str), label (the explain line), dtype (name), shape (tuple), nbytes,
    source_file (basename), source_path, source_offset, tensor (stored name), encoding, and outputs (the
    output names whose value depends on the node). Graph attribute `outputs` maps output name -> node id.
    """
    import networkx as nx

    outputs = plan.outputs if hasattr(plan, "outputs") else dict(plan)
    order = toposort(outputs.values())
    ids = {n: f"%{i}" for i, n in enumerate(order)}
    users: dict[Node, list[str]] = {n: [] for n in order}
    for name, root in outputs.items():
        for n in toposort([root]):
            users[n].append(name)
    g = nx.DiGraph(outputs={name: ids[n] for name, n in outputs.items()})
    for n in order:
        rec = n.arg if n.op is Op.SOURCE else None
        srcs = " ".join(ids[s] for s in n.srcs)
        label = f"{ids[n]}:{type_str(n)} = {op_label(n)}"
        if rec is not None:
            label += f" {os.path.basename(rec.file.path)}@{rec.offset:#x} {rec.name!r}"
        if srcs:
            label += " " + srcs
        g.add_node(
            ids[n],
            op=n.op,
            arg=op_arg(n),
            label=label,
            dtype=n.dtype.name,
            shape=tuple(n.shape),
            nbytes=n.nbytes,
            source_file=os.path.basename(rec.file.path) if rec is not None else None,
            source_path=rec.file.path if rec is not None else None,
            source_offset=rec.offset if rec is not None else None,
            tensor=rec.name if rec is not None else None,
            encoding=(rec.encoding.name if rec is not None and getattr(rec, "encoding", None) else None),
            outputs=users[n],
        )
    for n in order:
        for pos, s in enumerate(n.srcs):
            if g.has_edge(ids[s], ids[n]):
                g.edges[ids[s], ids[n]]["inputs"].append(pos)
            else:
                g.add_edge(ids[s], ids[n], inputs=[pos])
    return g


# --- the scene: grouped nodes, outputs, step boxes and a layout ------------------------------------------------
NODE_W, NODE_H, COL_GAP, ROW_GAP, BOX_PAD, BAND_GAP, LABEL_H = 210, 50, 30, 10, 8, 10, 16


def _step_info(view: View) -> tuple[dict[str, dict], str | None]:
    """Output name -> its step from the compiler (`compile_steps` at the default budget): kind, position,
    blocks, bytes read and written, the compiled chain's ops. Where the compiler refuses the plan (a
    LazyWeightsError, e.g. a step that cannot fit the default budget), the reason is logged and returned,
    and each output's kind is inferred from its ops instead."""
    error: str | None
    try:
        steps = compile_outputs(view.outputs)
    except LazyWeightsError as e:
        error = f"the compiler refused the plan: {type(e).__name__}: {e}"
        _log.warning("drawing the plan without the compiler's steps: %s", error)
        steps = None
    else:
        error = None if steps is not None else "no compiler available"
    info: dict[str, dict] = {}
    if steps is not None:
        for i, st in enumerate(steps):
            entry = {"kind": str(st.kind), "index": i + 1, "of": len(steps), "blocks": len(st.blocks),
                     "block_bytes": st.block_bytes, "read": st.read_bytes, "nbytes": st.nbytes, "whole": st.whole,
                     "ops": " -> ".join(op_label(n) for n in st.nodes), "outputs": list(st.outputs)}
            for name in st.outputs:
                info[name] = entry
        return info, None
    for name, root in view.outputs.items():
        ops = {n.op for n in toposort([root])} - {"source", "const"}
        kind = "view" if not ops else ("copy" if ops <= _LAYOUT_OPS else "fused")
        info[name] = {"kind": kind, "index": None, "why": error}
    return info, error


def build_scene(plan, group_layers: bool = True, filter: str | None = None, *,
                steps: tuple[dict[str, dict], str | None] | None = None) -> dict:
    """Display data shared by the .dot, .mmd and .html writers: nodes, outputs, edges, boxes, positions.

    `steps`: another scene's `(scene["steps"], scene["steps_error"])` for the same outputs, so the grouped
    and ungrouped scenes of one page compile the plan once."""
    view = build_view(plan, filter=filter, group_layers=group_layers)
    step_info, steps_error = steps if steps is not None else _step_info(view)
    kinds = {name: i["kind"] for name, i in step_info.items()}
    users: dict[int, list[str]] = {vn.id: [] for vn in view.nodes}
    member_names: dict[int, list[str]] = {vn.id: [] for vn in view.nodes}
    for g in view.groups:
        for n in toposort([view.outputs[g.names[0]]]):
            lst = users[view.ids[n]]
            if g.label not in lst:
                lst.append(g.label)
                member_names[view.ids[n]].extend(g.names)

    # Columns: longest path from a leaf; outputs in one last column.
    col: dict[int, int] = {}
    for vn in view.nodes:  # view nodes are numbered inputs-first
        col[vn.id] = 1 + max((col[s] for s in vn.srcs), default=-1)
    out_col = 1 + max(col.values(), default=-1)

    nodes, outs, edges, boxes = [], [], [], []
    y = 0.0
    label_w = max([len(g.label) for g in view.groups] + [10])
    out_w = min(420, max(NODE_W, 16 + 6.6 * label_w))
    for g in view.groups:
        kind = kinds.get(g.names[0], "fused")
        per_col: dict[int, int] = {}
        band_top = y + LABEL_H
        placed = []
        for vid in g.nodes:
            c = col[vid]
            row = per_col.get(c, 0)
            per_col[c] = row + 1
            placed.append((vid, c, row))
        rows = max(per_col.values(), default=1)
        ycenter = {}
        for vid, c, row in placed:
            vn = view.nodes[vid]
            nx_, ny = c * (NODE_W + COL_GAP), band_top + BOX_PAD + row * (NODE_H + ROW_GAP)
            ycenter[vid] = ny
            nodes.append(_scene_node(vn, nx_, ny, g.index, users[vid], kind))
            nodes[-1]["names"] = member_names[vid]
        out_src = g.out_ids[0]
        oy = ycenter.get(out_src, band_top + BOX_PAD)
        ox = out_col * (NODE_W + COL_GAP)
        out_node = view.outputs[g.names[0]]
        outs.append({
            "id": f"o{g.index}", "group": g.index, "name": g.label, "names": g.names, "count": g.count,
            "type": type_str(out_node), "dtype": out_node.dtype.name, "shape": list(out_node.shape),
            "nbytes": out_node.nbytes, "total": out_node.nbytes * g.count, "kind": kind,
            "src": out_src, "x": ox, "y": oy, "w": out_w, "h": NODE_H,
        })
        edges.append({"from": f"n{out_src}", "to": f"o{g.index}"})
        members = [n for n in nodes if n["group"] == g.index and not n["shared"]]
        x0 = min([n["x"] for n in members] + [ox]) - BOX_PAD
        x1 = ox + out_w + BOX_PAD
        y0 = band_top
        y1 = band_top + 2 * BOX_PAD + rows * NODE_H + (rows - 1) * ROW_GAP
        boxes.append({"group": g.index, "kind": kind, "count": g.count, "name": g.label,
                      "x": x0, "y": y0 - LABEL_H, "w": x1 - x0, "h": y1 - y0 + LABEL_H})
        y = y1 + BAND_GAP
    for vn in view.nodes:
        for s in vn.srcs:
            edges.append({"from": f"n{s}", "to": f"n{vn.id}"})
    stats = plan_stats(view.outputs, view.all_nodes)
    width = out_col * (NODE_W + COL_GAP) + out_w + 2 * BOX_PAD
    return {
        "grouped": view.grouped, "nodes": nodes, "outputs": outs, "edges": edges, "boxes": boxes,
        "stats": stats, "from_scheduler": steps_error is None, "steps": step_info, "steps_error": steps_error,
        "width": width + 2 * BOX_PAD, "height": max(y, 1.0), "columns": out_col + 1, "view": view,
    }


def _scene_node(vn, x, y, group, used_by, kind) -> dict:
    n = vn.node
    d = {
        "id": f"n{vn.id}", "vid": vn.id, "num": f"%{vn.id}", "op": n.op, "label": op_label(n), "arg": op_arg(n),
        "type": type_str(n), "dtype": n.dtype.name, "shape": list(n.shape), "nbytes": n.nbytes,
        "total": vn.total_nbytes, "count": vn.count, "group": group, "shared": vn.shared,
        "srcs": [f"n{s}" for s in vn.srcs], "line": vn.line(), "outputs": used_by,
        "x": x, "y": y, "w": NODE_W, "h": NODE_H, "box": box_label(n), "vnode": vn,
    }
    if n.op is Op.SOURCE:
        recs = [m.arg for m in vn.members]
        d["file"] = name_pattern(dict.fromkeys(os.path.basename(r.file.path) for r in recs))
        d["tensor"] = name_pattern(r.name for r in recs)
        d["offset"] = f"{recs[0].offset:#x}" if len(recs) == 1 else f"{len(recs)} offsets"
        d["tensors"] = [r.name for r in recs]
        if getattr(recs[0], "encoding", None) is not None:
            d["encoding"] = recs[0].encoding.name
    return d


def _title(stats: dict) -> str:
    t = stats["tensors"]
    return (f"lazyweights plan: {t} tensor{'s' if t != 1 else ''}, {stats['nodes']} nodes; "
            f"read {format_bytes(stats['bytes_read'])}, write {format_bytes(stats['bytes_written'])}, "
            f"peak ~{format_bytes(stats['peak_bytes'])} (reference executor)")


def _box_title(box: dict) -> str:
    count = f" ×{box['count']}" if box["count"] > 1 else ""
    return f"{box['kind']}{count}"


# --- Graphviz ----------------------------------------------------------------------------------------------
def _dot_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node_text(n: dict) -> list[str]:
    count = f"  ×{n['count']}" if n["count"] > 1 else ""
    lines = [f"{n['num']} {n['label']}", f"{n['type']}  {format_bytes(n['nbytes'])}{count}"]
    if n["op"] == "source":
        lines.append(f"{n['file']}" + (f"@{n['offset']}" if n["count"] == 1 else ""))
        lines.append(repr(n["tensor"]))
    return lines


def to_dot(plan, group_layers: bool = True) -> str:
    """Graphviz source for the plan (left to right: sources, ops, outputs; one dashed box per step)."""
    sc = build_scene(plan, group_layers)
    out = [
        "digraph plan {",
        f'  graph [rankdir=LR, fontname="Helvetica", fontsize=12, nodesep=0.12, ranksep=0.3, '
        f"labelloc=t, labeljust=l, newrank=true, label={_dot_str(_title(sc['stats']))}];",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.1,0.04", '
        'penwidth=0.8];',
        '  edge [color="#555555", arrowsize=0.6, penwidth=0.8];',
    ]
    by_group: dict[int, list[dict]] = {}
    for n in sc["nodes"]:
        by_group.setdefault(n["group"], []).append(n)
    # Graphviz stacks a left-to-right graph's clusters bottom-up in the order they are defined: define
    # them last-first so the picture reads top-down in plan order.
    for box, o in reversed(list(zip(sc["boxes"], sc["outputs"]))):
        color = KIND_COLORS.get(box["kind"], "#737373")
        for n in by_group.get(box["group"], []):
            if n["shared"]:
                out.append(_dot_node(n, "  "))
        out.append(f"  subgraph cluster_g{box['group']} {{")
        out.append(f'    label={_dot_str(_box_title(box))}; style="dashed,rounded"; color="{color}"; '
                   f'fontcolor="{color}"; fontsize=9; margin=6;')
        for n in by_group.get(box["group"], []):
            if not n["shared"]:
                out.append(_dot_node(n, "    "))
        count = f"  ×{o['count']}" if o["count"] > 1 else ""
        label = f"{o['name']}\n{o['type']}  {format_bytes(o['nbytes'])}{count}"
        out.append(f"    {o['id']} [label={_dot_str(label)}, shape=box, style=\"filled,bold\", "
                   'fillcolor="#ffffff", color="#333333", fontsize=10];')
        out.append("  }")
    for e in sc["edges"]:
        out.append(f"  {e['from']} -> {e['to']};")
    # One rank per column (sources first, outputs last), so chains line up like the text.
    columns: dict[float, list[str]] = {}
    for n in sc["nodes"]:
        columns.setdefault(n["x"], []).append(n["id"])
    for _, ids in sorted(columns.items()):
        out.append("  { rank=same; " + " ".join(ids) + " }")
    if sc["outputs"]:
        out.append("  { rank=same; " + " ".join(o["id"] for o in sc["outputs"]) + " }")
    out.append("}")
    return "\n".join(out) + "\n"


def _dot_node(n: dict, indent: str) -> str:
    return (f"{indent}{n['id']} [label={_dot_str(chr(10).join(_node_text(n)))}, "
            f"fillcolor=\"{OP_COLORS.get(n['op'], _OTHER_COLOR)}\", tooltip={_dot_str(n['line'])}];")


def _render_with_dot(dot_text: str, path: str, fmt: str) -> None:
    exe = shutil.which("dot")
    if exe is None:
        raise DependencyError(
            f"drawing {os.path.basename(path)} needs Graphviz's `dot` program, which is not on PATH. "
            "Install Graphviz (apt-get install graphviz, conda install graphviz, or brew install graphviz), "
            "or write a .dot, .mmd or .html file instead."
        )
    args = [exe, f"-T{fmt}"]
    if fmt == "png":
        args.append("-Gdpi=110")
    tmp = staging_name(path)  # unique: two renders of one path never share a temporary
    try:
        proc = subprocess.run(args + ["-o", tmp], input=dot_text.encode("utf-8"), capture_output=True, timeout=600)
        if proc.returncode != 0:
            msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise ExecutionError(f"Graphviz dot failed for {path}: "
                                 f"{msg[-1] if msg else 'exit ' + str(proc.returncode)}")
        commit_file(tmp, path)
    except subprocess.TimeoutExpired:
        raise ExecutionError(f"Graphviz dot took over 10 minutes for {path}; "
                             "try the .html view or a --filter") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# --- Mermaid -----------------------------------------------------------------------------------------------
def _mmd_str(s: str) -> str:
    """A Mermaid quoted label: entity codes for the characters Mermaid would otherwise interpret."""
    out = []
    for ch in s:
        if ch in '"#%<>&`':
            out.append(f"#{ord(ch)};")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def to_mermaid(plan, group_layers: bool = True) -> str:
    """A Mermaid flowchart (renders in GitHub markdown inside a ```mermaid fence)."""
    sc = build_scene(plan, group_layers)
    out = ["flowchart LR"]
    used_ops = sorted({n["op"] for n in sc["nodes"]})
    for op in used_ops:
        out.append(f"  classDef op_{op} fill:{OP_COLORS.get(op, _OTHER_COLOR)},stroke:#555,color:#000")
    out.append("  classDef out fill:#fff,stroke:#333,stroke-width:2px,color:#000")
    by_group: dict[int, list[dict]] = {}
    for n in sc["nodes"]:
        by_group.setdefault(n["group"], []).append(n)

    def node_line(n, indent):
        text = "<br/>".join(_mmd_str(t)[1:-1] for t in _node_text(n))
        return f'{indent}{n["id"]}["{text}"]:::op_{n["op"]}'

    # Like Graphviz, Mermaid's layout stacks subgraphs bottom-up in definition order: define them last-first.
    for box, o in reversed(list(zip(sc["boxes"], sc["outputs"]))):
        for n in by_group.get(box["group"], []):
            if n["shared"]:
                out.append(node_line(n, "  "))
        out.append(f"  subgraph g{box['group']}[{_mmd_str(_box_title(box) + ': ' + box['name'])}]")
        out.append("    direction LR")
        for n in by_group.get(box["group"], []):
            if not n["shared"]:
                out.append(node_line(n, "    "))
        count = f"  ×{o['count']}" if o["count"] > 1 else ""
        label = o["type"] + "  " + format_bytes(o["nbytes"]) + count
        text = _mmd_str(o["name"])[1:-1] + "<br/>" + _mmd_str(label)[1:-1]
        out.append(f'    {o["id"]}["{text}"]:::out')
        out.append("  end")
    for e in sc["edges"]:
        out.append(f"  {e['from']} --> {e['to']}")
    return "\n".join(out) + "\n"


# --- HTML --------------------------------------------------------------------------------------------------
# The page's HTML, CSS and JS are package data in lazyweights/render/viewer/ (viewer.html, .css, .js), inlined
# into one file that works offline from file:// (tests/render/test_viewer_browser.py drives it in Chromium).
VIEWER_ASSETS = ("viewer.html", "viewer.css", "viewer.js")
_TEMPLATE_FIELD = re.compile(r"\{\{(\w+)\}\}")


def viewer_asset(name: str) -> str:
    """The text of one of the viewer's files (`viewer.html`, `viewer.css`, `viewer.js`), from the package data.

    Example:
        >>> viewer_asset("viewer.js").startswith("// The lazyweights plan viewer")
        True
    """
    if name not in VIEWER_ASSETS:
        raise UsageError(f"no viewer asset {name!r}; the viewer's files are {', '.join(VIEWER_ASSETS)}")
    return resources.files("lazyweights.render").joinpath("viewer").joinpath(name).read_text(encoding="utf-8")


def _fill(template: str, values: dict[str, str]) -> str:
    """Replace each `{{field}}` once, in one pass: text put in is never scanned again (a tensor named `{{js}}`
    stays as it is)."""
    return _TEMPLATE_FIELD.sub(lambda m: values[m.group(1)], template)


def _esc(s) -> str:
    return _html.escape(str(s), quote=True)


def _fit(text: str, width_px: float, char_px: float = 6.3) -> str:
    n = max(4, int(width_px / char_px))
    return text if len(text) <= n else text[: n - 1] + "…"


def _chars(width_px: float, char_px: float = 6.3) -> int:
    return max(4, int(width_px / char_px))


def _svg(sc: dict, scene_id: str, marks: dict[int, tuple[str, str]] | None = None) -> str:
    """Static SVG for one scene (the JS adds interaction). Positions come from `build_scene`. `marks`: output
    group index -> (css class, badge text) for a diff's changed and one-sided outputs."""
    marks = marks or {}
    maxb = max([n["nbytes"] for n in sc["nodes"]] + [o["nbytes"] for o in sc["outputs"]] + [2])
    lmax = math.log2(maxb + 1)
    w, h = sc["width"] + 24, sc["height"] + 24
    parts = [f'<svg class="plan" id="{scene_id}" xmlns="http://www.w3.org/2000/svg" data-w="{w:.0f}" data-h="{h:.0f}">',
             '<defs><marker id="arr-' + scene_id + '" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>',
             '<g class="viewport" transform="translate(12,12)">']
    for b in sc["boxes"]:
        color = KIND_COLORS.get(b["kind"], "#737373")
        parts.append(f'<g class="box" data-group="{b["group"]}"><rect x="{b["x"]:.1f}" y="{b["y"]:.1f}" '
                     f'width="{b["w"]:.1f}" height="{b["h"]:.1f}" rx="8" fill="{color}" fill-opacity="0.035" '
                     f'stroke="{color}" stroke-dasharray="5 3"/><text x="{b["x"] + 8:.1f}" y="{b["y"] + 12:.1f}" '
                     f'class="boxlabel" fill="{color}">{_esc(_box_title(b))}</text></g>')
    pos = {n["id"]: n for n in sc["nodes"]}
    pos.update({o["id"]: o for o in sc["outputs"]})
    parts.append('<g class="edges">')
    for e in sc["edges"]:
        a, b = pos[e["from"]], pos[e["to"]]
        x1, y1 = a["x"] + a["w"], a["y"] + a["h"] / 2
        x2, y2 = b["x"] - 2, b["y"] + b["h"] / 2
        dx = max(20.0, (x2 - x1) / 2)
        if abs(y2 - y1) < 0.5 and x2 - x1 > NODE_W:  # long straight run to the output column
            d = f"M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}"
        else:
            d = f"M{x1:.1f},{y1:.1f} C{x1 + dx:.1f},{y1:.1f} {x2 - dx:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
        parts.append(f'<path class="edge" data-from="{e["from"]}" data-to="{e["to"]}" d="{d}" '
                     f'marker-end="url(#arr-{scene_id})"/>')
    parts.append("</g>")
    for n in sc["nodes"]:
        frac = math.log2(n["nbytes"] + 1) / lmax if lmax else 0
        fill = OP_COLORS.get(n["op"], _OTHER_COLOR)
        x, y, w, h = n["x"], n["y"], n["w"], n["h"]
        t1 = _fit(f"{n['num']} {n['box']}", w - 16 - (26 if n["count"] > 1 else 0))
        t2 = (short_name(n["tensor"], _chars(w - 12)) if n["op"] == "source"
              else _fit(f"{n['type']} · {format_bytes(n['nbytes'])}", w - 12))
        t3 = f"{n['type']} · {format_bytes(n['nbytes'])}" if n["op"] == "source" else ""
        parts.append(
            f'<g class="node op-{_esc(n["op"])}" id="{scene_id}-{n["id"]}" data-id="{n["id"]}" tabindex="0">'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w}" height="{h}" rx="6" fill="{fill}" '
            f'fill-opacity="{0.45 + 0.55 * frac:.2f}" class="body"/>'
            f'<rect x="{x + 6:.1f}" y="{y + h - 5:.1f}" width="{max(2.0, (w - 12) * frac):.1f}" height="2.5" '
            f'rx="1.2" class="bytebar"/>'
            f'<text x="{x + 8:.1f}" y="{y + 15:.1f}" class="t1">{_esc(t1)}</text>'
            f'<text x="{x + 8:.1f}" y="{y + 28:.1f}" class="t2">{_esc(t2)}</text>'
            + (f'<text x="{x + 8:.1f}" y="{y + 40:.1f}" class="t3">{_esc(_fit(t3, w - 12))}</text>' if t3 else "")
            + (f'<text x="{x + w - 6:.1f}" y="{y + 15:.1f}" class="count">×{n["count"]}</text>'
               if n["count"] > 1 else "")
            + "</g>"
        )
    for o in sc["outputs"]:
        frac = math.log2(o["nbytes"] + 1) / lmax if lmax else 0
        x, y, w, h = o["x"], o["y"], o["w"], o["h"]
        mark = marks.get(o["group"])
        cls = f" {mark[0]}" if mark else ""
        # (drawn just above the box, in its band's top padding, so it never covers the box's own text)
        badge = (f'<text x="{x + w - 4:.1f}" y="{y - 3:.1f}" class="diffbadge">{_esc(mark[1])}</text>'
                 if mark else "")
        name_w = w - 16 - (30 if o["count"] > 1 else 0)
        parts.append(
            f'<g class="node out kind-{_esc(o["kind"])}{cls}" id="{scene_id}-{o["id"]}" data-id="{o["id"]}" '
            f'data-name="{_esc(o["name"])}" tabindex="0">'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" rx="4" class="body outbody"/>'
            f'<rect x="{x + 6:.1f}" y="{y + h - 5:.1f}" width="{max(2.0, (w - 12) * frac):.1f}" height="2.5" '
            f'rx="1.2" class="bytebar"/>'
            f'<text x="{x + 8:.1f}" y="{y + 18:.1f}" class="t1 '
            f'outname">{_esc(short_name(o["name"], _chars(name_w, 6.6)))}</text>'
            f'<text x="{x + 8:.1f}" y="{y + 33:.1f}" '
            f'class="t2">{_esc(o["type"] + " · " + format_bytes(o["nbytes"]))}</text>'
            + (f'<text x="{x + w - 6:.1f}" y="{y + 16:.1f}" class="count">×{o["count"]}</text>'
               if o["count"] > 1 else "")
            + badge + "</g>"
        )
    parts.append("</g></svg>")
    return "".join(parts)


def _step_text(info: dict | None, count: int = 1) -> list[list[str]]:
    """Rows about the compiler's step for one output (`_step_info`)."""
    if not info:
        return []
    if info.get("index") is None:
        return [["step", f"{info['kind']} (inferred from the ops: {info.get('why', 'the compiler did not run')})"]]
    each = " each" if count > 1 else ""
    rows = [["step", f"{info['kind']}, compiler step {info['index']} of {info['of']}"
             + (f" (and {count - 1} more like it)" if count > 1 else "")],
            ["blocks", f"{info['blocks']} block{'s' if info['blocks'] != 1 else ''}{each}"
             + (f", largest {format_bytes(info['block_bytes'])} of working memory" if info["block_bytes"] else "")
             + (" (computed whole)" if info["whole"] else "")],
            ["read", f"{format_bytes(info['read'])}{each} from sources"],
            ["written", f"{format_bytes(info['nbytes'])}{each}"],
            ["compiled", info["ops"]]]
    if len(info["outputs"]) > 1:
        rows.append(["same step", ", ".join(info["outputs"])])
    return rows


def _node_rows(n: dict, steps: dict) -> list[list[str]]:
    vn = n["vnode"]
    node = vn.node
    rows: list[list[str]] = [["op", n["label"]]]
    if node.op is Op.SOURCE and vn.count > 1:
        recs = [m.arg for m in vn.members]
        rows.append(["tensor", n["tensor"]])
        rows.append(["tensors", ", ".join(r.name for r in recs[:8]) + (" …" if len(recs) > 8 else "")])
        files = list(dict.fromkeys(r.file.path for r in recs))
        rows.append(["file", ", ".join(files)])
        rows.append(["offsets", ", ".join(f"{r.offset:#x}" for r in recs[:8]) + (" …" if len(recs) > 8 else "")])
        rows.append(["stored", f"{n['type']} each"])
        if n.get("encoding"):
            rows.append(["encoding", n["encoding"]])
    else:
        rows += [[k, v] for k, v in op_details(node)]
    if node.srcs:
        rows.append(["in", ", ".join(type_str(s) for s in node.srcs)])
    rows.append(["out", f"{n['type']} ({node.dtype.name})"])
    rows.append(["bytes", format_bytes(n["nbytes"]) + (f" each, {format_bytes(n['total'])} for all {n['count']}"
                                                       if n["count"] > 1 else "")])
    runs = [steps[o] for o in n.get("names") or n["outputs"] if o in steps]
    if runs and runs[0].get("index") is not None:
        first = runs[0]
        distinct = {id(r) for r in runs}
        rows.append(["runs in", f"{first['kind']} step {first['index']} of {first['of']}, {first['blocks']} block"
                     f"{'s' if first['blocks'] != 1 else ''}"
                     + (f" (and {len(distinct) - 1} more steps)" if len(distinct) > 1 else "")])
    elif runs:
        rows.append(["runs in", f"a {runs[0]['kind']} step (inferred)"])
    rows.append(["used by", ", ".join(n["outputs"][:12]) + (" …" if len(n["outputs"]) > 12 else "")])
    if n["shared"]:
        rows.append(["shared", "read once, used by several outputs"])
    return rows


def _chain_summary(vn) -> str:
    """One line of what a chain entry does, for the output's chain list in the side panel."""
    if vn.node.op is Op.SOURCE and vn.count > 1:
        recs = [m.arg for m in vn.members]
        return (f"{vn.count} tensors, {name_pattern(r.name for r in recs)}, offsets "
                + ", ".join(f"{r.offset:#x}" for r in recs[:4]) + (" …" if len(recs) > 4 else ""))
    return "; ".join(f"{k} {v}" for k, v in op_details(vn.node) if k not in ("file", "stored"))


def _details(sc: dict, diff_lines: dict[int, list[str]] | None = None) -> dict:
    """Per-node details for the JS (tooltips, the side panel, highlighting). `diff_lines`: output group
    index -> the lines that say how it differs in a diff."""
    det = {}
    preds: dict[str, list[str]] = {}
    succs: dict[str, list[str]] = {}
    for e in sc["edges"]:
        preds.setdefault(e["to"], []).append(e["from"])
        succs.setdefault(e["from"], []).append(e["to"])
    steps = sc["steps"]
    view = sc["view"]
    for n in sc["nodes"]:
        det[n["id"]] = {"title": n["num"] + " " + n["op"], "line": n["line"], "rows": _node_rows(n, steps),
                        "preds": preds.get(n["id"], []), "succs": succs.get(n["id"], []),
                        "search": " ".join(n.get("names") or n["outputs"]) + " " + " ".join(n.get("tensors", []))}
    for o in sc["outputs"]:
        g = view.groups[o["group"]]
        rows = [["output", o["name"]], ["type", f"{o['type']} ({o['dtype']})"],
                ["bytes", format_bytes(o["nbytes"]) + (f" each, {format_bytes(o['total'])} for all {o['count']}"
                                                       if o["count"] > 1 else "")]]
        if o["count"] > 1:
            rows.append(["names", ", ".join(o["names"][:6]) + (" …" if len(o["names"]) > 6 else "")])
        rows += _step_text(steps.get(o["names"][0]), o["count"])
        # The chain: the group's nodes that this output depends on, inputs first.
        needed = set()
        stack = [o["src"]]
        while stack:
            vid = stack.pop()
            if vid not in needed:
                needed.add(vid)
                stack.extend(view.nodes[vid].srcs)
        chain = [[f"n{vid}", view.nodes[vid].line(), _chain_summary(view.nodes[vid])]
                 for vid in sorted(needed)]
        det[o["id"]] = {"title": "output", "line": f"out {o['name']!r} = %{o['src']}", "rows": rows,
                        "chain": chain, "names": o["names"], "preds": preds.get(o["id"], []), "succs": [],
                        "search": " ".join(o["names"])}
        if diff_lines and g.index in diff_lines:
            det[o["id"]]["diff"] = diff_lines[g.index]
    return det


FULL_VIEW_LIMIT = 4000  # nodes; beyond this the ungrouped view is left out of the html (too heavy to draw)


def _scenes(plan, group_layers: bool) -> tuple[list[tuple[str, dict]], str]:
    main = build_scene(plan, group_layers)
    scenes = [("grouped" if group_layers else "full", main)]
    note = ""
    if group_layers:
        n_all = main["stats"]["nodes"]
        if n_all <= FULL_VIEW_LIMIT:
            scenes.append(("full", build_scene(plan, False, steps=(main["steps"], main["steps_error"]))))
        else:
            note = f"(the ungrouped view of {n_all} nodes is too large to draw here)"
    return scenes, note


def _summary(stats: dict) -> str:
    return (f"{stats['tensors']} tensors · {stats['nodes']} nodes · read {format_bytes(stats['bytes_read'])} "
            f"from {stats['sources']} sources in {stats['files']} file{'s' if stats['files'] != 1 else ''} · "
            f"write {format_bytes(stats['bytes_written'])} · peak ~{format_bytes(stats['peak_bytes'])} "
            f"(reference executor)")


_HELP = ("<h2>Plan</h2><p>Sources (left) are tensors in the checkpoint files; each dashed box is one output's "
         "compiler step: <b>fused</b> (computed in one pass), <b>copy</b> (bytes moved, no arithmetic) or "
         "<b>view</b> (zero-copy). Outputs are on the right. Hover a node to highlight it and its edges; click it "
         "for its details: the full stored name, file and byte offset of a source, each op's arguments, types "
         "along the chain, bytes, and the step that runs it.</p>")


Marker = Callable[[dict], "tuple[dict[int, tuple[str, str]], dict[int, list[str]]]"]


def _page(panes: list[tuple[str, tuple[list[tuple[str, dict]], str], Marker | None]], group_layers: bool, title: str,
          summary: str, help_html: str, diff: dict | None = None) -> str:
    """The viewer page over one or more plans drawn side by side. Each pane: (title, `_scenes(plan)`, marker),
    where `marker(scene)` gives the scene's output marks (group index -> (css class, badge)) and diff lines
    (group index -> lines) for a diff, or is None."""
    pane_html: list[str] = []
    pane_data: list[dict] = []
    used_ops: set[str] = set()
    notes: list[str] = []
    errors: list[str] = []
    first = "grouped" if group_layers else "full"
    keys = None
    for pi, (ptitle, (scenes, note), marker) in enumerate(panes):
        if note:
            notes.append(note)
        keys = [k for k, _ in scenes] if keys is None else [k for k in keys if k in dict(scenes)]
        svgs, details = [], {}
        for key, sc in scenes:
            marks, lines = marker(sc) if marker is not None else ({}, {})
            svgs.append(f'<div class="scene" data-scene="{key}"' + ("" if key == first else " hidden") + ">"
                        + _svg(sc, f"s{pi}-{key}", marks) + "</div>")
            details[key] = _details(sc, lines)
            used_ops.update(n["op"] for n in sc["nodes"])
            if sc["steps_error"]:
                errors.append(sc["steps_error"])
        label, _, detail = ptitle.partition(": ")
        pane_html.append(f'<section class="pane" data-pane="{pi}">'
                         + (f'<div class="pane-title" title="{_esc(ptitle)}">{_esc(label)}'
                            f'<span class="note">{_esc(": " + detail if detail else "")}</span></div>'
                            if len(panes) > 1 else "")
                         + f'<div class="canvas" tabindex="0">{"".join(svgs)}</div></section>')
        pane_data.append({"title": label, "scenes": details})
    legend_ops = "".join(f'<span class="sw" style="background:{OP_COLORS.get(op, _OTHER_COLOR)}"></span>'
                         f'<span class="lg">{_esc(op)}</span>' for op in sorted(used_ops))
    legend_kinds = "".join(f'<span class="kb" style="border-color:{KIND_COLORS[k]};color:{KIND_COLORS[k]}">{k}</span>'
                           for k in ("fused", "copy", "view"))
    legend_diff = ""
    if diff is not None:
        legend_diff = ('<span class="lg">&nbsp;outputs:</span>'
                       '<span class="lgd" style="border-color:#d62728">changed</span>'
                       '<span class="lgd" style="border-color:#6a51a3">only in one plan</span>')
    steps_note = ("steps from lazyweights.compiler.steps" if not errors
                  else "steps inferred per output chain: " + errors[0])
    toggle = ""
    if keys is not None and len(keys) > 1:
        toggle = '<label class="ctl"><input type="checkbox" id="grouped" checked> group repeated layers</label>'
    elif notes:
        toggle = f'<span class="note">{_esc(notes[0])}</span>'
    data = {"panes": pane_data, "first": first, "diff": diff}
    text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")
    text = text.replace("&", "\\u0026")
    return _fill(viewer_asset("viewer.html"), {
        "title": _esc(title), "summary": _esc(summary), "toggle": toggle, "legend_ops": legend_ops,
        "legend_kinds": legend_kinds, "legend_diff": legend_diff, "steps_note": _esc(steps_note),
        "panes": "".join(pane_html), "help": help_html, "data": text,
        "body_class": "diff" if diff is not None else "plan",
        "css": viewer_asset("viewer.css"), "js": viewer_asset("viewer.js"),
    })


def to_html(plan, group_layers: bool = True) -> str:
    """One self-contained HTML page (no network): the plan drawn as inline SVG, with interaction.

    Example:
        >>> import numpy as np
        >>> from lazyweights import WeightData, DType, plan
        >>> page = to_html(plan({"a": WeightData.from_numpy(np.zeros(4, np.float32), "w").astype(DType.float16)}))
        >>> page.startswith("<!DOCTYPE html>"), "{{" in page
        (True, False)
    """
    scenes = _scenes(plan, group_layers)
    stats = scenes[0][0][1]["stats"]
    text = explain(plan, group_layers=group_layers)
    help_html = _HELP + f"<details><summary>plan as text</summary><pre>{_esc(text)}</pre></details>"
    return _page([("plan", scenes, None)], group_layers, f"lazyweights plan: {stats['tensors']} tensors",
                 _summary(stats), help_html)


def _diff_marker(changed: dict, only: list[str]) -> Marker:
    """Marks for one side of a diff: an output group is marked when any of its members changed or is here only."""
    only_set = set(only)

    def marker(sc: dict):
        marks: dict[int, tuple[str, str]] = {}
        lines: dict[int, list[str]] = {}
        for g in sc["view"].groups:
            ch = [n for n in g.names if n in changed]
            on = [n for n in g.names if n in only_set]
            if on:
                marks[g.index] = ("diff-only", "only here" + (f" {len(on)}/{g.count}" if g.count > 1 else ""))
                lines[g.index] = [f"only in this plan: {name_pattern(on)}"]
            elif ch:
                marks[g.index] = ("diff-changed", "changed" + (f" {len(ch)}/{g.count}" if g.count > 1 else ""))
                first = changed[ch[0]]
                lines[g.index] = ([f"{name_pattern(ch)}: {first.summary()}"] if len(ch) > 1 else []) + first.lines
        return marks, lines

    return marker


def diff_html(diff, group_layers: bool = True) -> str:
    """The viewer page for a `PlanDiff` (`Plan.diff`): both plans side by side, their differing outputs marked
    (red: changed, purple: in one plan only), each marked output's details listing how its chain differs."""
    la, lb = diff.labels
    scenes_a, scenes_b = _scenes(diff.a, group_layers), _scenes(diff.b, group_layers)
    sa, sb = scenes_a[0][0][1]["stats"], scenes_b[0][0][1]["stats"]
    items = []
    for names in ([[n] for n in diff.only_a] + [[n] for n in diff.only_b]):
        side = la if names[0] in diff.only_a else lb
        items.append(f'<li><a class="go" data-name="{_esc(names[0])}">{_esc(names[0])}</a> '
                     f'<span class="note">only in {_esc(side)}</span></li>')
    for names, ch in diff.groups():
        count = f" ×{len(names)}" if len(names) > 1 else ""
        items.append(f'<li><a class="go" data-name="{_esc(names[0])}">{_esc(name_pattern(names))}</a>{count} '
                     f'<span class="note">{_esc(ch.summary())}</span></li>')
    listing = f'<ul class="difflist">{"".join(items)}</ul>' if items else "<p>The plans are the same.</p>"
    help_html = (f"<h2>Plan diff</h2><p><b>{_esc(la)}</b> (left) against <b>{_esc(lb)}</b> (right). Outputs outlined "
                 "red changed (source, ops and arguments, dtype or shape); purple ones are in one plan only. Click "
                 "an output for its chain and the lines that differ; click a name below to find it.</p>"
                 + listing + f"<details><summary>diff as text</summary><pre>{_esc(str(diff))}</pre></details>")
    summary = (f"{la}: {sa['tensors']} tensors, {lb}: {sb['tensors']} tensors · {len(diff.changed)} changed · "
               f"{len(diff.only_a)} only in {la} · {len(diff.only_b)} only in {lb} · {len(diff.same)} the same")
    data = {"labels": [la, lb], "changed": list(diff.changed), "only": [diff.only_a, diff.only_b]}
    return _page([(f"{la}: {_summary(sa)}", scenes_a, _diff_marker(diff.changed, diff.only_a)),
                  (f"{lb}: {_summary(sb)}", scenes_b, _diff_marker(diff.changed, diff.only_b))],
                 group_layers, f"lazyweights plan diff: {la} vs {lb}", summary, help_html, diff=data)


# --- entry point ------------------------------------------------------------------------------------------
def visualize(plan, path, group_layers: bool = True) -> str:
    """Draw `plan` to `path`; the format comes from the suffix (.dot/.gv, .svg, .png, .mmd, .html). Returns the path."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise UsageError(
            f"cannot draw a plan as {suffix or 'a file without a suffix'!r} ({path}); "
            "use .dot, .svg, .png (Graphviz), .mmd (Mermaid) or .html"
        )
    if suffix in (".dot", ".gv"):
        write_text(path, to_dot(plan, group_layers))
    elif suffix in (".svg", ".png"):
        _render_with_dot(to_dot(plan, group_layers), path, suffix[1:])
    elif suffix == ".mmd":
        write_text(path, to_mermaid(plan, group_layers))
    else:
        write_text(path, to_html(plan, group_layers))
    return path


def write_text(path: str, text: str) -> None:
    """Write `text` to `path` atomically (UTF-8): a partial picture never replaces a good one."""
    write_file_atomically(path, text.encode("utf-8"))
