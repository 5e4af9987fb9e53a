"""`Plan.diff`: outputs only in one plan, outputs whose chains differ, the text report, and `plan --diff` on the CLI."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import lazyweights as lw
from lazyweights import ArgumentTypeError, DType, UsageError, WeightData

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
W1 = "lazyweights.tools.demo:convert_safetensor_state_dict"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, tiny_llama):
    root = tmp_path_factory.mktemp("diff")
    two, three = str(root / "two"), str(root / "three")
    cfg2 = tiny_llama(two, layers=2, hidden=32, heads=2, kv=1)
    cfg3 = tiny_llama(three, layers=3, hidden=32, heads=2, kv=1)
    copy = str(root / "copy")
    shutil.copytree(two, copy)
    return (two, cfg2), (three, cfg3), (copy, cfg2)


def test_same_plan_and_same_checkpoint_elsewhere_are_the_same(ckpts, w1_plan):
    (two, cfg), _, (copy, _) = ckpts
    a, b = w1_plan(two, cfg), w1_plan(copy, cfg)
    assert a.outputs["norm.weight"].srcs[0].arg.file.path != b.outputs["norm.weight"].srcs[0].arg.file.path
    d = a.diff(b)
    assert not d and d.only_a == d.only_b == [] and d.changed == {} and d.same == list(a.outputs)
    assert str(d).splitlines() == [f"plan diff: a has {len(a)} outputs, b has {len(b)}; 0 only in a, 0 only in b, "
                                   f"0 changed, {len(a)} the same"]


def test_another_checkpoint_adds_a_layer(ckpts, w1_plan):
    (two, cfg2), (three, cfg3), _ = ckpts
    d = w1_plan(two, cfg2).diff(w1_plan(three, cfg3), labels=("2 layers", "3 layers"))
    assert d and d.only_a == [] and d.changed == {}
    assert d.only_b == ["layers.2.input_layernorm.weight", "layers.2.attention.q_proj.weight",
                        "layers.2.attention.k_proj.weight"]
    text = str(d)
    assert "only in 3 layers (3):\n  + layers.2.input_layernorm.weight" in text


def test_adapter_change_shows_the_lines_that_differ(ckpts, w1_plan):
    (two, cfg), _, _ = ckpts
    a = w1_plan(two, cfg)
    weights = lw.load_weights([two])
    b = lw.plan({k: (v if "q_proj" not in k else
                     WeightData.wrap(v.node.srcs[0], k).astype(DType.float32)) for k, v in a.tensors.items()})
    d = a.diff(b)
    assert sorted(d.changed) == ["layers.0.attention.q_proj.weight", "layers.1.attention.q_proj.weight"]
    ch = d.changed["layers.1.attention.q_proj.weight"]
    assert ch.what == ["type", "ops"]
    src = weights.model.layers[1].self_attn.q_proj.weight.data()
    assert ch.lines[0] == f"  %0:bf16[32,32] = source {src.name!r}"
    assert ch.lines[-2:] == ["- %4:f16[32,32] = cast[f16] %3", "+ %4:f32[32,32] = cast[f32] %3"]
    # the two layers changed the same way: one entry in the report, with a count
    assert len(d.groups()) == 1 and "~ layers.{0,1}.attention.q_proj.weight (x2)" in str(d)


def test_a_different_source_is_a_source_change():
    x = WeightData.from_numpy(np.zeros((2, 2), np.float32), "x")
    f = lw.plan({"o": x.astype(DType.float16)})
    g = lw.plan({"o": x.T.astype(DType.float16)})
    assert f.diff(g).changed["o"].what == ["ops"]
    assert f.diff(f).same == ["o"]


def test_bad_input_is_named():
    x = lw.plan({"o": WeightData.from_numpy(np.zeros(2, np.float32), "x")})
    with pytest.raises(ArgumentTypeError, match="plan b must be a Plan .* got int"):
        x.diff(3)
    with pytest.raises(UsageError, match="drawn as .html, not 'd.svg'"):
        x.diff(x).visualize("d.svg")


def test_gemma3_bf16_against_f16_real_plan(gemma3_plans):
    a, b = gemma3_plans
    d = a.diff(b, labels=("bf16", "f16"))
    assert not d.only_a and not d.only_b and not d.same and len(d.changed) == len(a) == 236
    assert all(ch.what[0] == "type" for ch in d.changed.values())
    q = d.changed["model.layers.3.self_attn.q_proj.weight"]
    assert q.lines == ["  %0:u8[1024,440] = source[Q5_0] 'blk.3.attn_q.weight'",
                       "- %1:bf16[1024,640] = dequantize[Q5_0->bf16] %0",
                       "+ %1:f16[1024,640] = dequantize[Q5_0->f16] %0"]
    # folded as explain() folds the plan: one entry per chain it prints
    chains = int(a.explain().splitlines()[0].split("printed as ")[1].split()[0])
    assert len(d.groups()) == chains


def test_cli_plan_diff(ckpts, tmp_path):
    (two, _), (three, _), _ = ckpts
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "lazyweights", "plan", *args], capture_output=True, text=True,
                              env=env, timeout=300)

    html = str(tmp_path / "diff.html")
    proc = run(W1, two, "--diff", W1, three, "--visualize", html)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("plan diff: two has 8 outputs, three has 11; 0 only in two, 3 only in three")
    assert "  + layers.2.attention.q_proj.weight" in proc.stdout
    assert proc.stderr.strip() == f"lazyweights: wrote {html}"
    page = open(html, encoding="utf-8").read()
    assert page.count('class="pane"') == 2 and page.count("diff-only") >= 3
    proc = run(W1, two, "--diff", W1)
    assert proc.returncode == 1 and "--diff needs a second adapter and its checkpoint" in proc.stderr
    proc = run(W1, two, "--diff", W1, three, "--visualize", str(tmp_path / "d.png"))
    assert proc.returncode == 1 and "side by side as .html" in proc.stderr
