"""render/describe.py: op arguments in words, RoPE gathers recognised, labels that keep a name's layer and module."""
from __future__ import annotations

import re

import numpy as np
import pytest

from lazyweights import DType
from lazyweights.graph import ops
from lazyweights.render.describe import box_label, op_details, rope_gather, short_name

# what a source box of the viewer holds: (NODE_W - 12) / 6.3 px per character (render/visualize.py)
NODE_LABEL_CHARS = 31


def _llama_permute(n_rows: int, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute applied to row numbers, written out here."""
    rows = np.arange(n_rows)
    return rows.reshape(n_head, 2, n_rows // n_head // 2).swapaxes(1, 2).reshape(rows.shape)


@pytest.mark.parametrize("n_head", [1, 4, 8])
def test_rope_gather_recognised_both_ways(n_head):
    x = ops.const(np.zeros((128, 16), np.float32))
    perm = _llama_permute(128, n_head)
    fwd = rope_gather(ops.take(x, perm, 0))
    inv = rope_gather(ops.take(x, np.argsort(perm), 0))
    assert fwd is not None and fwd.direction == "halves -> interleaved" and fwd.axis == 0
    assert inv is not None and inv.direction == "interleaved -> halves"
    assert (fwd.heads, fwd.head_dim) == (inv.heads, inv.head_dim) == (n_head, 128 // n_head)
    assert box_label(ops.take(x, perm, 0)) == "RoPE gather[axis=0]"
    rows = dict(op_details(ops.take(x, np.argsort(perm), 0)))
    assert rows["gather"] == "RoPE row permutation (interleaved -> halves)"
    assert rows["heads"] == f"{n_head} x {128 // n_head} rows"


def test_other_gathers_are_not_rope():
    x = ops.const(np.zeros((64, 4), np.float32))
    rng = np.random.default_rng(0)
    for idx in (rng.permutation(64), np.arange(63, -1, -1), np.arange(0, 64, 2)):
        assert rope_gather(ops.take(x, idx, 0)) is None
    long = ops.take(ops.const(np.zeros((4096, 2), np.float32)), rng.permutation(4096), 0)
    rows = dict(op_details(long))
    assert rows["indices"].endswith("(4096 indices)") and len(rows["indices"]) < 160  # abbreviated
    assert box_label(long) == "take[axis=0, 4096 idx]"


def test_op_details_read_the_node():
    x = ops.const(np.zeros((6, 8), np.float32))
    assert op_details(ops.cast(x, DType.bfloat16)) == [("from", "float32"), ("to", "bfloat16")]
    assert op_details(ops.permute(x, (1, 0))) == [("axes", "(1, 0) (transpose)")]
    s = ops.slice_(x, ((2, 6, 1), (0, 8, 3)))
    ref = np.zeros((6, 8))[2:6, ::3]
    assert s.shape == ref.shape
    assert op_details(s) == [("axis 0", "2:6 of 6 (4 kept)"), ("axis 1", f"0:8:3 of 8 ({ref.shape[1]} kept)")]
    assert op_details(ops.reshape(x, (2, 24))) == [("shape", "[6, 8] -> [2, 24]")]


def _module(name: str) -> str:
    parts = name.split(".")
    return parts[-2] if parts[-1] in ("weight", "bias") else parts[-1]


def _layer(name: str):
    m = re.search(r"(?:^|\.)(layers|blk|h)\.(\d+)\.", name)
    return m.group(0).strip(".") if m else None


def _check_labels(names):
    labels = {}
    for name in names:
        label = short_name(name, NODE_LABEL_CHARS)
        assert len(label) <= NODE_LABEL_CHARS and not label.startswith("…"), (name, label)
        layer = _layer(name)
        if layer is not None:
            assert label.startswith(layer + "."), (name, label)  # the layer survives: never cut at the front
        module = _module(name)
        if len(f"{layer}.…{module}") <= NODE_LABEL_CHARS:
            assert module in label, (name, label)
        labels.setdefault(label, []).append(name)
    clashes = {k: v for k, v in labels.items() if len(v) > 1}
    assert not clashes  # distinct names keep distinct labels


def test_labels_of_real_llama_names():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=12,
                                   num_attention_heads=2, num_key_value_heads=1)
    names = list(transformers.LlamaForCausalLM(cfg).state_dict())
    assert "model.layers.11.self_attn.q_proj.weight" in names
    _check_labels(names)
    assert short_name("model.layers.11.self_attn.q_proj.weight", NODE_LABEL_CHARS) == "layers.11.self_attn.q_proj"


def test_labels_of_real_gemma3_names(gemma3_plans):
    bf16, _ = gemma3_plans
    hf = list(bf16.outputs)
    gguf = [n.arg.name for n in bf16.nodes() if n.op == "source"]
    assert "blk.17.attn_q.weight" in gguf and "model.layers.17.self_attn.q_proj.weight" in hf
    _check_labels(hf)
    _check_labels(gguf)


def test_viewer_labels_keep_the_layer(gemma3_plans, tmp_path):
    """In the drawn (ungrouped) page: every source and output label keeps its layer number."""
    bf16, _ = gemma3_plans
    text = open(bf16.visualize(str(tmp_path / "p.html"), group_layers=True), encoding="utf-8").read()
    full = text[text.index('data-scene="full"'):]
    outs = re.findall(r'data-name="([^"]+)" tabindex="0">.*?class="t1 outname">([^<]*)<', full)
    assert len(outs) == 236
    for name, label in outs:
        layer = _layer(name)
        assert not label.startswith("…") and (layer is None or f"{layer}." in label), (name, label)
    srcs = re.findall(r'class="node op-source".*?class="t2">([^<]*)<', full)
    assert len(srcs) == 236 and all(not s.startswith("…") for s in srcs)
    assert "blk.3.attn_q.weight" in srcs
    # the grouped view folds the layers into the label: blk.{0..17}.attn_q.weight
    grouped = text[text.index('data-scene="grouped"'):text.index('data-scene="full"')]
    assert "blk.{0..17}.attn_q.weight" in grouped and "blk.{0,…}.attn_v" in grouped
