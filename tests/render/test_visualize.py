"""Pictures of a plan: the networkx graph and each file format's structure (.dot, .svg/.png, .mmd, .html)."""
from __future__ import annotations

import doctest
import html
import json
import os
import re
import shutil
import subprocess

import networkx as nx
import numpy as np
import pytest

import lazyweights as lw
from lazyweights import DType, LazyWeightsError, WeightData
from lazyweights.render.explain import build_view

HAVE_DOT = shutil.which("dot") is not None


# tiny_llama (tests/conftest.py) writes the checkpoint; w1_plan (tests/render/conftest.py) adapts it.
@pytest.fixture
def tiny(tmp_path, tiny_llama, w1_plan):
    d = str(tmp_path / "ckpt")
    cfg = tiny_llama(d)
    return w1_plan(d, cfg)


def _tied_plan():
    w = WeightData.from_numpy(np.ones((4, 2), np.float32), "emb")
    return lw.plan({"embed.weight": w.astype(DType.float16), "lm_head.weight": w.astype(DType.bfloat16).T})


# --- networkx ------------------------------------------------------------------------------------------
def test_networkx_structure(tiny):
    g = tiny.to_networkx()
    assert isinstance(g, nx.DiGraph)
    nodes = tiny.nodes()
    assert g.number_of_nodes() == len(nodes) == 28
    assert list(g.nodes) == [f"%{i}" for i in range(len(nodes))]
    assert nx.is_directed_acyclic_graph(g)
    for u, v in g.edges:  # numbered in topological order: inputs first
        assert int(u[1:]) < int(v[1:])
    assert g.number_of_edges() == sum(len(n.srcs) for n in nodes)
    src = g.nodes["%0"]
    assert src["op"] == "source" and src["source_file"] == "model.safetensors"
    assert src["tensor"] == "model.embed_tokens.weight" and src["source_offset"] == 0x398
    assert src["dtype"] == "bfloat16" and src["shape"] == (6, 8) and src["nbytes"] == 96
    assert src["outputs"] == ["embed_tokens.weight"]
    assert os.path.isabs(src["source_path"])
    outs = g.graph["outputs"]
    assert set(outs) == set(tiny.outputs)
    q = outs["layers.0.attention.q_proj.weight"]
    assert g.nodes[q]["op"] == "cast" and g.nodes[q]["arg"] == "f16" and g.nodes[q]["source_file"] is None
    take = [n for n, d in g.nodes(data=True) if d["op"] == "take"][0]
    assert g.nodes[take]["arg"] == "axis=1 [0,2,1,3]"
    # every node that an output needs lists that output
    for name, nid in outs.items():
        for anc in nx.ancestors(g, nid) | {nid}:
            assert name in g.nodes[anc]["outputs"]


def test_networkx_shared_node_lists_every_output():
    g = _tied_plan().to_networkx()
    assert g.nodes["%0"]["outputs"] == ["embed.weight", "lm_head.weight"]
    assert g.nodes["%0"]["op"] == "const" and g.nodes["%0"]["tensor"] is None


def test_concat_of_one_input_twice_keeps_both_positions():
    x = WeightData.from_numpy(np.zeros((2, 2), np.float32), "x")
    g = lw.plan({"c": lw.concat([x, x], axis=0)}).to_networkx()
    assert g.edges["%0", "%1"]["inputs"] == [0, 1]


# --- Graphviz -----------------------------------------------------------------------------------------------
def _dot_statements(text):
    nodes = re.findall(r"^\s*([no]\d+) \[label=", text, re.M)
    edges = re.findall(r"^\s*([no]\d+) -> ([no]\d+);", text, re.M)
    return nodes, edges


def test_dot_structure(tiny, tmp_path):
    path = tiny.visualize(str(tmp_path / "plan.dot"))
    text = open(path).read()
    assert text.startswith("digraph plan {") and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    nodes, edges = _dot_statements(text)
    view = build_view(tiny)
    assert len(nodes) == len(set(nodes)) == len(view.nodes) + len(view.groups) == 16 + 5
    assert len(edges) == sum(len(vn.srcs) for vn in view.nodes) + len(view.groups)
    assert text.count("subgraph cluster_") == 5
    assert "fused ×2" in text and "layers.{0,1}.attention.q_proj.weight" in text
    full = lw.plan(tiny.tensors).visualize(str(tmp_path / "full.gv"), group_layers=False)
    fnodes, _ = _dot_statements(open(full).read())
    assert len(fnodes) == 28 + 8


def test_dot_escapes_labels(tmp_path):
    w = WeightData.from_numpy(np.zeros(2, np.float32), "w")
    text = open(lw.plan({'odd"name\\x': w.astype(DType.float16)}).visualize(str(tmp_path / "p.dot"))).read()
    assert 'odd\\"name\\\\x' in text


@pytest.mark.skipif(not HAVE_DOT, reason="Graphviz dot is not installed")
def test_dot_parses_with_graphviz(tiny, tmp_path):
    path = tiny.visualize(str(tmp_path / "plan.dot"))
    out = subprocess.run(["dot", "-Tplain", path], capture_output=True, text=True, check=True).stdout
    assert sum(1 for ln in out.splitlines() if ln.startswith("node ")) == 21
    assert sum(1 for ln in out.splitlines() if ln.startswith("edge ")) == len(_dot_statements(open(path).read())[1])


@pytest.mark.skipif(not HAVE_DOT, reason="Graphviz dot is not installed")
def test_svg_and_png(tiny, tmp_path):
    svg = tiny.visualize(str(tmp_path / "plan.svg"))
    head = open(svg, encoding="utf-8").read(4000)
    assert "<svg" in head
    png = tiny.visualize(tmp_path / "plan.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_svg_without_graphviz_gives_an_install_hint(tiny, tmp_path, monkeypatch):
    import lazyweights.render.visualize as vis

    monkeypatch.setattr(vis.shutil, "which", lambda name: None)
    for suffix in ("svg", "png"):
        with pytest.raises(LazyWeightsError) as e:
            tiny.visualize(str(tmp_path / f"plan.{suffix}"))
        msg = str(e.value)
        assert "apt-get install graphviz" in msg and "conda install graphviz" in msg
        assert not os.path.exists(tmp_path / f"plan.{suffix}")


def test_unknown_suffix(tiny, tmp_path):
    with pytest.raises(LazyWeightsError, match=r"\.dot, \.svg, \.png"):
        tiny.visualize(str(tmp_path / "plan.jpg"))


# --- Mermaid ----------------------------------------------------------------------------------------------
def test_mermaid_structure(tiny, tmp_path):
    text = open(tiny.visualize(str(tmp_path / "plan.mmd"))).read()
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    defined = re.findall(r'^\s*([no]\d+)\["', text, re.M)
    assert len(defined) == len(set(defined)) == 21
    for a, b in re.findall(r"^\s*([no]\d+) --> ([no]\d+)$", text, re.M):
        assert a in defined and b in defined
    assert text.count("subgraph ") == text.count("\n  end") == 5
    assert "layers.{0,1}.attention.q_proj.weight" in text
    assert "#37;8 cast[f16]" in text  # '%' is written as an entity code


def test_mermaid_escapes_labels(tmp_path):
    w = WeightData.from_numpy(np.zeros(2, np.float32), "w")
    text = open(lw.plan({'a"b<c>#1': w.astype(DType.float16)}).visualize(str(tmp_path / "p.mmd"))).read()
    for m in re.finditer(r'\["(.*?)"\]', text):
        assert '"' not in m.group(1) and "<c>" not in m.group(1)
    assert "a#34;b#60;c#62;#35;1" in text


# --- HTML -------------------------------------------------------------------------------------------------
def test_html_is_self_contained(tiny, tmp_path):
    path = tiny.visualize(str(tmp_path / "plan.html"))
    text = open(path, encoding="utf-8").read()
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert not re.search(r"<(script|img|iframe)[^>]*\bsrc\s*=", text, re.I)
    assert not re.search(r"<link\b", text, re.I)
    assert "@import" not in text and "url(http" not in text
    # labels: ops, output patterns, stored names
    for label in ("cast[f16]", "take[axis=1", "layers.{0,1}.attention.q_proj.weight", "embed_tokens.weight"):
        assert html.escape(label, quote=True) in text or label in text
    # the details the JS needs are valid JSON, for both the grouped and the ungrouped view
    m = re.search(r'<script id="plan-data" type="application/json">(.*?)</script>', text, re.S)
    data = json.loads(m.group(1))
    scenes = data["panes"][0]["scenes"]
    assert set(scenes) == {"grouped", "full"} and data["first"] == "grouped" and data["diff"] is None
    assert len(scenes["grouped"]) == 16 + 5 and len(scenes["full"]) == 28 + 8
    assert scenes["grouped"]["n8"]["title"] == "%8 cast"
    assert 'class="scene" data-scene="full" hidden' in text
    assert text.count("<svg") == 2
    assert "plan as text" in text


def test_html_ungrouped_only(tiny, tmp_path):
    text = open(tiny.visualize(str(tmp_path / "p.html"), group_layers=False), encoding="utf-8").read()
    m = re.search(r'<script id="plan-data" type="application/json">(.*?)</script>', text, re.S)
    assert list(json.loads(m.group(1))["panes"][0]["scenes"]) == ["full"]


def test_html_escapes_script_breakers(tmp_path):
    w = WeightData.from_numpy(np.zeros(2, np.float32), "w")
    name = "</script><script>alert(1)</script>"
    text = open(lw.plan({name: w.astype(DType.float16)}).visualize(str(tmp_path / "p.html")), encoding="utf-8").read()
    assert name not in text
    assert text.count("</script>") == 2  # the data block and the code block only


def test_shared_node_drawn_once(tmp_path):
    text = open(_tied_plan().visualize(str(tmp_path / "p.dot"))).read()
    nodes, edges = _dot_statements(text)
    assert nodes.count("n0") == 1
    assert ("n0", "n1") in edges and ("n0", "n2") in edges


def test_doctests():
    import lazyweights.render.visualize

    assert doctest.testmod(lazyweights.render.visualize).failed == 0


def test_html_when_the_compiler_refuses_the_plan(tmp_path, monkeypatch, caplog):
    """A compiler error (here a BudgetError) is logged and named on the page; kinds are inferred from the ops."""
    import logging

    import lazyweights.render.visualize as viz
    from lazyweights.core.errors import BudgetError

    def refuse(outputs):
        raise BudgetError("tensor 'a' must be computed whole and needs 9 bytes, more than the budget of 8 bytes")

    monkeypatch.setattr(viz, "compile_outputs", refuse)
    w = WeightData.from_numpy(np.zeros((4, 2), np.float32), "w")
    with caplog.at_level(logging.WARNING, logger="lazyweights.render.visualize"):
        page = lw.plan({"a": w.astype(DType.float16)}).visualize(str(tmp_path / "p.html"))
        text = open(page, encoding="utf-8").read()
    assert any("BudgetError" in r.getMessage() and "'a'" in r.getMessage() for r in caplog.records)
    assert "steps inferred per output chain: the compiler refused the plan: BudgetError: tensor &#x27;a&#x27;" in text
    m = re.search(r'<script id="plan-data" type="application/json">(.*?)</script>', text, re.S)
    rows = dict(json.loads(m.group(1))["panes"][0]["scenes"]["grouped"]["o0"]["rows"])
    assert rows["step"].startswith("fused (inferred from the ops: the compiler refused the plan: BudgetError")
