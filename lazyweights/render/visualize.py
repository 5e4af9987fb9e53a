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
import math
import os
import shutil
import subprocess

from ..core.errors import DependencyError, ExecutionError, UsageError
from ..graph.node import Node, toposort
from ..graph.opcodes import Op
from ..io.atomic import commit_file, staging_name, write_file_atomically
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

__all__ = ["to_networkx", "visualize", "to_dot", "to_mermaid", "to_html", "build_scene", "OP_COLORS"]

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
NODE_W, NODE_H, COL_GAP, ROW_GAP, BOX_PAD, BAND_GAP, LABEL_H = 172, 50, 30, 10, 8, 10, 16


def _step_kinds(view: View, plan) -> tuple[dict[str, str], bool]:
    """Output name -> step kind, from the scheduler when it is available, else inferred from the ops."""
    try:
        steps = compile_outputs(view.outputs)
    except Exception:
        steps = None
    if steps is not None:
        kinds = {}
        for st in steps:
            for name in getattr(st, "outputs", ()):
                kinds[name] = str(getattr(st, "kind", "fused"))
        return kinds, True
    kinds = {}
    for name, root in view.outputs.items():
        ops = {n.op for n in toposort([root])} - {"source", "const"}
        kinds[name] = "view" if not ops else ("copy" if ops <= _LAYOUT_OPS else "fused")
    return kinds, False


def build_scene(plan, group_layers: bool = True, filter: str | None = None) -> dict:
    """Display data shared by the .dot, .mmd and .html writers: nodes, outputs, edges, boxes, positions."""
    view = build_view(plan, filter=filter, group_layers=group_layers)
    kinds, from_scheduler = _step_kinds(view, plan)
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
        "stats": stats, "from_scheduler": from_scheduler, "width": width + 2 * BOX_PAD, "height": max(y, 1.0),
        "columns": out_col + 1, "view": view,
    }


def _scene_node(vn, x, y, group, used_by, kind) -> dict:
    n = vn.node
    d = {
        "id": f"n{vn.id}", "vid": vn.id, "num": f"%{vn.id}", "op": n.op, "label": op_label(n), "arg": op_arg(n),
        "type": type_str(n), "dtype": n.dtype.name, "shape": list(n.shape), "nbytes": n.nbytes,
        "total": vn.total_nbytes, "count": vn.count, "group": group, "shared": vn.shared,
        "srcs": [f"n{s}" for s in vn.srcs], "line": vn.line(), "outputs": used_by,
        "x": x, "y": y, "w": NODE_W, "h": NODE_H,
    }
    if n.op is Op.SOURCE:
        recs = [m.arg for m in vn.members]
        d["file"] = name_pattern(dict.fromkeys(os.path.basename(r.file.path) for r in recs))
        d["tensor"] = name_pattern(r.name for r in recs)
        d["offset"] = f"{recs[0].offset:#x}" if len(recs) == 1 else f"{len(recs)} offsets"
        d["tensors"] = [r.name for r in recs]
        if getattr(recs[0], "encoding", None) is not None:
            d["encoding"] = recs[0].encoding.name
    if n.op is Op.TAKE:
        idx = n.arg[1].array
        shown = ",".join(str(int(i)) for i in idx[:256])
        d["indices"] = f"[{shown}{',…' if len(idx) > 256 else ''}] ({len(idx)} along axis {n.arg[0]})"
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
def _esc(s) -> str:
    return _html.escape(str(s), quote=True)


def _fit(text: str, width_px: float, char_px: float = 6.3, keep_end: bool = False) -> str:
    n = max(4, int(width_px / char_px))
    if len(text) <= n:
        return text
    return ("…" + text[-(n - 1):]) if keep_end else (text[: n - 1] + "…")


def _svg(sc: dict, scene_id: str) -> str:
    """Static SVG for one scene (the JS adds interaction). Positions come from `build_scene`."""
    maxb = max([n["nbytes"] for n in sc["nodes"]] + [o["nbytes"] for o in sc["outputs"]] + [2])
    lmax = math.log2(maxb + 1)
    parts = [f'<svg class="plan" id="{scene_id}" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="-12 -12 {sc["width"] + 24:.0f} {sc["height"] + 24:.0f}" '
             f'width="{sc["width"] + 24:.0f}" height="{sc["height"] + 24:.0f}">',
             '<defs><marker id="arr-' + scene_id + '" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>',
             '<g class="viewport">']
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
        t1 = _fit(f"{n['num']} {n['label']}", w - 16 - (26 if n["count"] > 1 else 0))
        t2 = (_fit(n["tensor"], w - 12, keep_end=True) if n["op"] == "source"
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
        parts.append(
            f'<g class="node out kind-{_esc(o["kind"])}" id="{scene_id}-{o["id"]}" data-id="{o["id"]}" tabindex="0">'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" rx="4" class="body outbody"/>'
            f'<rect x="{x + 6:.1f}" y="{y + h - 5:.1f}" width="{max(2.0, (w - 12) * frac):.1f}" height="2.5" '
            f'rx="1.2" class="bytebar"/>'
            f'<text x="{x + 8:.1f}" y="{y + 18:.1f}" class="t1 '
            f'outname">{_esc(_fit(o["name"], w - 16 - (30 if o["count"] > 1 else 0), 6.6))}</text>'
            f'<text x="{x + 8:.1f}" y="{y + 33:.1f}" '
            f'class="t2">{_esc(o["type"] + " · " + format_bytes(o["nbytes"]))}</text>'
            + (f'<text x="{x + w - 6:.1f}" y="{y + 16:.1f}" class="count">×{o["count"]}</text>'
               if o["count"] > 1 else "")
            + "</g>"
        )
    parts.append("</g></svg>")
    return "".join(parts)


def _details(sc: dict) -> dict:
    """Per-node details for the JS (tooltips, the side panel, highlighting)."""
    det = {}
    preds: dict[str, list[str]] = {}
    succs: dict[str, list[str]] = {}
    for e in sc["edges"]:
        preds.setdefault(e["to"], []).append(e["from"])
        succs.setdefault(e["from"], []).append(e["to"])
    for n in sc["nodes"]:
        rows = [["op", n["label"]], ["type", n["type"]], ["bytes", format_bytes(n["nbytes"])]]
        if n["count"] > 1:
            rows.append(["stands for", f"{n['count']} nodes, {format_bytes(n['total'])} in all"])
        if n["op"] == "source":
            rows += [["file", n["file"]], ["offset", n["offset"]], ["tensor", n["tensor"]]]
            if n.get("encoding"):
                rows.append(["encoding", n["encoding"]])
        if n.get("indices") is not None:
            rows.append(["indices", n["indices"]])
        rows.append(["used by", ", ".join(n["outputs"][:12]) + (" …" if len(n["outputs"]) > 12 else "")])
        if n["shared"]:
            rows.append(["shared", "read once, used by several outputs"])
        det[n["id"]] = {"title": n["num"] + " " + n["op"], "line": n["line"], "rows": rows,
                        "preds": preds.get(n["id"], []), "succs": succs.get(n["id"], []),
                        "search": " ".join(n.get("names") or n["outputs"]) + " " + " ".join(n.get("tensors", []))}
    for o in sc["outputs"]:
        rows = [["output", o["name"]], ["type", o["type"]], ["bytes", format_bytes(o["nbytes"])],
                ["step", o["kind"] + ("" if o["count"] == 1 else f" (×{o['count']})")]]
        if o["count"] > 1:
            rows.append(["tensors", f"{o['count']}, {format_bytes(o['total'])} in all"])
            rows.append(["names", ", ".join(o["names"][:6]) + (" …" if len(o["names"]) > 6 else "")])
        det[o["id"]] = {"title": "output", "line": f"out {o['name']!r} = %{o['src']}", "rows": rows,
                        "preds": preds.get(o["id"], []), "succs": [], "search": " ".join(o["names"])}
    return det


FULL_VIEW_LIMIT = 4000  # nodes; beyond this the ungrouped view is left out of the html (too heavy to draw)


def to_html(plan, group_layers: bool = True) -> str:
    """One self-contained HTML page (no network): the plan drawn as inline SVG, with interaction."""
    scenes = []
    main = build_scene(plan, group_layers)
    scenes.append(("grouped" if group_layers else "full", main))
    other_note = ""
    if group_layers:
        n_all = main["stats"]["nodes"]
        if n_all <= FULL_VIEW_LIMIT:
            scenes.append(("full", build_scene(plan, False)))
        else:
            other_note = f"(the ungrouped view of {n_all} nodes is too large to draw here)"
    stats = main["stats"]
    svgs, details = [], {}
    for key, sc in scenes:
        svgs.append(f'<div class="scene" data-scene="{key}"' + ("" if key == scenes[0][0] else " hidden") + ">"
                    + _svg(sc, f"s-{key}") + "</div>")
        details[key] = _details(sc)
    text = explain(plan, group_layers=group_layers)
    used_ops = sorted({n["op"] for _, sc in scenes for n in sc["nodes"]})
    legend_ops = "".join(f'<span class="sw" style="background:{OP_COLORS.get(op, _OTHER_COLOR)}"></span>'
                         f'<span class="lg">{_esc(op)}</span>' for op in used_ops)
    legend_kinds = "".join(f'<span class="kb" style="border-color:{KIND_COLORS[k]};color:{KIND_COLORS[k]}">{k}</span>'
                           for k in ("fused", "copy", "view"))
    source_of_steps = ("steps from lazyweights.compiler.steps" if main["from_scheduler"]
                       else "steps inferred per output chain (scheduler not available)")
    data = json.dumps(details, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")
    toggle = ""
    if len(scenes) > 1:
        toggle = ('<label class="ctl"><input type="checkbox" id="grouped" checked> group repeated layers</label>')
    elif other_note:
        toggle = f'<span class="note">{_esc(other_note)}</span>'
    summary = (f"{stats['tensors']} tensors · {stats['nodes']} nodes · read {format_bytes(stats['bytes_read'])} "
               f"from {stats['sources']} sources in {stats['files']} file{'s' if stats['files'] != 1 else ''} · "
               f"write {format_bytes(stats['bytes_written'])} · peak ~{format_bytes(stats['peak_bytes'])} "
               f"(reference executor)")
    return _HTML_TEMPLATE.format(
        title=_esc(f"lazyweights plan: {stats['tensors']} tensors"),
        summary=_esc(summary),
        toggle=toggle,
        legend_ops=legend_ops,
        legend_kinds=legend_kinds,
        steps_note=_esc(source_of_steps),
        scenes="".join(svgs),
        text=_esc(text),
        data=data,
        css=_CSS,
        js=_JS,
    )


_CSS = """
*{box-sizing:border-box}
body{margin:0;font:13px/1.35 -apple-system,BlinkMacSystemFont,"Segoe
UI",Helvetica,Arial,sans-serif;color:#222;background:#fafafa}
header{padding:10px 16px 6px;background:#fff;border-bottom:1px solid #ddd;position:sticky;top:0;z-index:3}
h1{font-size:16px;margin:0 0 2px}
.summary{color:#555}
.bar{display:flex;flex-wrap:wrap;gap:14px;align-items:center;margin-top:6px}
.ctl{user-select:none;cursor:pointer}
#search{width:260px;padding:3px 6px;border:1px solid #bbb;border-radius:4px;font:inherit}
button{font:inherit;padding:2px 8px;border:1px solid #bbb;border-radius:4px;background:#f4f4f4;cursor:pointer}
.legend{display:flex;flex-wrap:wrap;gap:4px 8px;align-items:center;color:#444;margin-top:6px}
.sw{display:inline-block;width:14px;height:12px;border:1px solid #888;border-radius:3px;vertical-align:middle}
.lg{margin-right:6px}
.kb{border:1.5px dashed;border-radius:4px;padding:0 5px;font-size:11px}
.barsw{display:inline-block;width:26px;height:4px;background:#333;border-radius:2px;vertical-align:middle}
.note{color:#777}
main{display:flex;height:calc(100vh - 118px)}
#canvas{flex:1;overflow:hidden;position:relative;background:#fff;cursor:grab}
#canvas.dragging{cursor:grabbing}
.scene{position:absolute;inset:0}
.scene[hidden]{display:none}
svg.plan{display:block;width:100%;height:100%}
aside{width:300px;border-left:1px solid #ddd;background:#fff;overflow:auto;padding:10px 12px}
aside h2{font-size:14px;margin:0 0 6px}
aside table{border-collapse:collapse;width:100%}
aside td{vertical-align:top;padding:2px 4px;border-bottom:1px solid #eee;word-break:break-all}
aside td:first-child{color:#666;white-space:nowrap;word-break:normal}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.line{background:#f6f6f6;padding:4px 6px;border-radius:4px;word-break:break-all;margin:6px 0}
details{margin-top:12px}
pre{white-space:pre;overflow:auto;background:#f6f6f6;padding:6px;border-radius:4px;max-height:50vh}
.node{cursor:pointer}
.node .body{stroke:#555;stroke-width:.8}
.node .outbody{fill:#fff;stroke:#333;stroke-width:1.6}
.node
text{font-size:11px;fill:#111;pointer-events:none;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.node .t1{font-weight:600}
.node .t2,.node .t3{fill:#333;font-size:10.5px}
.node .outname{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;font-size:12px}
.node .count{text-anchor:end;font-weight:700;fill:#08519c}
.bytebar{fill:#000;fill-opacity:.45}
.node:hover .body,.node.sel .body{stroke:#000;stroke-width:2.2}
.edge{fill:none;stroke:#888;stroke-width:1.1}
.boxlabel{font-size:10.5px;font-weight:600}
.dim{opacity:.16}
.hit .body{stroke:#e6550d;stroke-width:2.4}
# tip{position:fixed;pointer-events:none;background:rgba(30,30,30,.94);color:#fff;padding:6px
# 8px;border-radius:5px;max-width:520px;font-size:12px;z-index:9;display:none}
#tip code{color:#ffe9a8;word-break:break-all}
"""

_JS = r"""
(function(){
  const DATA = JSON.parse(document.getElementById('plan-data').textContent);
  const canvas = document.getElementById('canvas');
  const tip = document.getElementById('tip');
  const panel = document.getElementById('info');
  let scene = document.querySelector('.scene:not([hidden])');
  const views = {};
  function esc(s){return
  String(s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));}
  function key(){return scene.dataset.scene;}
  function det(id){return DATA[key()][id];}
  // --- zoom and pan (per scene, by viewBox) ---
  function vb(svg){const v=svg.viewBox.baseVal;return v;}
  function initView(s){
    const svg=s.querySelector('svg'); if(views[s.dataset.scene]) return;
    const full=[vb(svg).x,vb(svg).y,vb(svg).width,vb(svg).height];
    views[s.dataset.scene]={svg:svg,full:full};
    svg.removeAttribute('width'); svg.removeAttribute('height');
    fit(s.dataset.scene);
  }
  function fit(k){
    const v=views[k], r=canvas.getBoundingClientRect();
    const [x,y,w,h]=v.full; const aspect=r.width/Math.max(1,r.height);
    // fit width, but never zoom out so far that text is unreadable: show the top of the plan instead
    let W=Math.max(w, h*aspect), H=W/aspect;
    const minScale=0.8; if(r.width/W<minScale){W=r.width/minScale;H=W/aspect;}
    set(v,x,y,W,H);
  }
  function set(v,x,y,w,h){v.svg.setAttribute('viewBox',x+' '+y+' '+w+' '+h);}
  canvas.addEventListener('wheel',e=>{
    e.preventDefault(); const v=views[key()], b=vb(v.svg), r=canvas.getBoundingClientRect();
    const f=Math.exp(e.deltaY*0.0015), px=b.x+(e.clientX-r.left)/r.width*b.width,
    py=b.y+(e.clientY-r.top)/r.height*b.height;
    set(v,px-(px-b.x)*f,py-(py-b.y)*f,b.width*f,b.height*f);
  },{passive:false});
  let drag=null;
  canvas.addEventListener('mousedown',e=>{if(e.button!==0)return;const
  b=vb(views[key()].svg);drag={x:e.clientX,y:e.clientY,bx:b.x,by:b.y,moved:false};canvas.classList.add('dragging');});
  window.addEventListener('mousemove',e=>{
    if(!drag)return; const v=views[key()], b=vb(v.svg), r=canvas.getBoundingClientRect();
    const dx=(e.clientX-drag.x)*b.width/r.width, dy=(e.clientY-drag.y)*b.height/r.height;
    if(Math.abs(e.clientX-drag.x)+Math.abs(e.clientY-drag.y)>3)drag.moved=true;
    set(v,drag.bx-dx,drag.by-dy,b.width,b.height);
  });
  window.addEventListener('mouseup',()=>{setTimeout(()=>{drag=null;},0);canvas.classList.remove('dragging');});
  // --- tooltips and the details panel ---
  function rowsHtml(d){return
  '<table>'+d.rows.map(r=>'<tr><td>'+esc(r[0])+'</td><td>'+esc(r[1])+'</td></tr>').join('')+'</table>';}
  canvas.addEventListener('mousemove',e=>{
    const g=e.target.closest&&e.target.closest('.node');
    if(!g||drag&&drag.moved){tip.style.display='none';return;}
    const d=det(g.dataset.id); if(!d)return;
    tip.innerHTML='<b>'+esc(d.title)+'</b><br><code>'+esc(d.line)+'</code>';
    tip.style.display='block';
    const x=Math.min(e.clientX+14, window.innerWidth-tip.offsetWidth-8), y=Math.min(e.clientY+14,
    window.innerHeight-tip.offsetHeight-8);
    tip.style.left=x+'px'; tip.style.top=y+'px';
  });
  canvas.addEventListener('mouseleave',()=>{tip.style.display='none';});
  function closure(id,dir,acc){acc=acc||new Set();if(acc.has(id))return acc;acc.add(id);for(const n of
  det(id)[dir])closure(n,dir,acc);return acc;}
  function clearMarks(){scene.querySelectorAll('.dim,.sel,.hit').forEach(el=>el.classList.remove('dim','sel','hit'));}
  function highlight(ids){
    scene.querySelectorAll('.node').forEach(g=>{if(!ids.has(g.dataset.id))g.classList.add('dim');});
    scene.querySelectorAll('.edge').forEach(p=>{if(!(ids.has(p.dataset.from)&&ids.has(p.dataset.to)))p.classList.add('dim');});
    scene.querySelectorAll('.box').forEach(b=>b.classList.add('dim'));
  }
  function select(id){
    clearMarks(); const d=det(id); if(!d)return;
    const ids=new Set([...closure(id,'preds'),...closure(id,'succs')]);
    highlight(ids);
    document.getElementById(scene.querySelector('svg').id+'-'+id).classList.add('sel');
    panel.innerHTML='<h2>'+esc(d.title)+'</h2><div class="line"><code>'+esc(d.line)+'</code></div>'+rowsHtml(d)+
      '<p class="note">Highlighted: everything this node depends on and everything that uses it. Click empty space to
      clear.</p>';
  }
  canvas.addEventListener('click',e=>{
    if(drag&&drag.moved)return;
    const g=e.target.closest&&e.target.closest('.node');
    if(g)select(g.dataset.id); else {clearMarks(); panel.innerHTML=document.getElementById('help').innerHTML;}
  });
  canvas.addEventListener('keydown',e=>{const g=e.target.closest&&e.target.closest('.node');
  if(g&&(e.key==='Enter'||e.key===' ')){select(g.dataset.id);e.preventDefault();}});
  // --- search: outputs and stored names (glob * ? or substring) ---
  const search=document.getElementById('search');
  function runSearch(){
    clearMarks(); const q=search.value.trim(); if(!q)return;
    let re; try{re=new
    RegExp(q.includes('*')||q.includes('?')?('^'+q.replace(/[.+^${}()|[\]\\]/g,'\\$&').replace(/\*/g,'.*').replace(/\?/g,'.')+'$'):q.replace(/[.*+?^${}()|[\]\\]/g,'\\$&'));}catch(err){return;}
    const ids=new Set();
    for(const [id,d] of Object.entries(DATA[key()])){ if(d.search.split(' ').some(s=>re.test(s))){ids.add(id);} }
    const all=new Set(); ids.forEach(id=>{closure(id,'preds',all);});
    highlight(all); let first=null;
    ids.forEach(id=>{const el=document.getElementById(scene.querySelector('svg').id+'-'+id);
    if(el){el.classList.add('hit'); if(!first)first=el;}});
    if(first){ // bring the first match into view, keeping the zoom
      const v=views[key()], b=vb(v.svg), r=first.querySelector('rect').getBBox();
      if(r.y<b.y||r.y+r.height>b.y+b.height||r.x<b.x||r.x+r.width>b.x+b.width)
      set(v,Math.max(v.full[0],r.x-40),r.y-40,b.width,b.height);
    }
    document.getElementById('hits').textContent=ids.size?ids.size+' match'+(ids.size>1?'es':''):'no match';
  }
  search.addEventListener('input',runSearch);
  document.getElementById('fit').addEventListener('click',()=>fit(key()));
  const toggle=document.getElementById('grouped');
  if(toggle)toggle.addEventListener('change',()=>{
    document.querySelectorAll('.scene').forEach(s=>{s.hidden=(s.dataset.scene!==(toggle.checked?'grouped':'full'));});
    scene=document.querySelector('.scene:not([hidden])'); initView(scene); runSearch();
  });
  initView(scene);
  panel.innerHTML=document.getElementById('help').innerHTML;
  // plan.html#select=n21 or #search=layers.*.q_proj* (shareable links; also used for screenshots)
  const h=new URLSearchParams(location.hash.slice(1));
  if(h.get('full')!==null&&toggle){toggle.checked=false;toggle.dispatchEvent(new Event('change'));}
  if(h.get('search')){search.value=h.get('search');runSearch();}
  if(h.get('select')&&det(h.get('select')))select(h.get('select'));
})();
"""

_HTML_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style></head>
<body>
<header>
<h1>{title}</h1>
<div class="summary">{summary}</div>
<div class="bar">
{toggle}
<input id="search" type="search" placeholder="search names, e.g. layers.*.q_proj*" aria-label="search">
<span id="hits" class="note"></span>
<button id="fit" type="button">fit</button>
<span class="note">wheel: zoom · drag: pan · click a node: details</span>
</div>
<div class="legend">{legend_ops}
<span class="lg">&nbsp;boxes = one step each:</span>{legend_kinds}
<span class="lg">&nbsp;<span class="barsw"></span> bar and shade: bytes (log scale)</span>
<span class="lg">&nbsp;<b style="color:#08519c">×N</b>: N identical layers drawn once</span>
<span class="note">&nbsp;({steps_note})</span>
</div>
</header>
<main>
<div id="canvas" tabindex="0">{scenes}</div>
<aside id="info"></aside>
</main>
<div id="tip"></div>
<template id="help"><h2>Plan</h2><p>Sources (left) are tensors in the checkpoint files; each box is one output's
step: <b>fused</b> (computed in one pass), <b>copy</b> (bytes moved, no arithmetic) or <b>view</b> (zero-copy).
Outputs are on the right. Hover for the node's line, click for details.</p>
<details><summary>plan as text</summary><pre>{text}</pre></details></template>
<script id="plan-data" type="application/json">{data}</script>
<script>{js}</script>
</body></html>
"""


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
        _write_text(path, to_dot(plan, group_layers))
    elif suffix in (".svg", ".png"):
        _render_with_dot(to_dot(plan, group_layers), path, suffix[1:])
    elif suffix == ".mmd":
        _write_text(path, to_mermaid(plan, group_layers))
    else:
        _write_text(path, to_html(plan, group_layers))
    return path


def _write_text(path: str, text: str) -> None:
    """Write atomically: a partial picture never replaces a good one."""
    write_file_atomically(path, text.encode("utf-8"))
