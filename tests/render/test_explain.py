"""explain(): golden plan text, layer grouping, filters, shared nodes, the summary and the steps section."""
from __future__ import annotations

import doctest
import os

import numpy as np
import pytest

import lazyweights as lw
from lazyweights import DType, LazyWeightsError, QuantizationEncoding, WeightData
from lazyweights.graph import ops
from lazyweights.render.explain import estimate_peak_memory, explain, format_bytes, name_pattern


# tiny_llama (tests/conftest.py) writes the checkpoint; w1_plan (tests/render/conftest.py) adapts it.
@pytest.fixture
def tiny(tmp_path, tiny_llama, w1_plan):
    d = str(tmp_path / "ckpt")
    cfg = tiny_llama(d)
    return w1_plan(d, cfg), d


GOLDEN_GROUPED = """\
plan: 8 tensors, 28 nodes (printed as 5 chains; repeated layers once)
  %0:bf16[6,8] = source model.safetensors@0x398 'model.embed_tokens.weight'
  %1:f16[6,8] = cast[f16] %0
  out 'embed_tokens.weight' = %1

  # x2 layers.{0,1}.input_layernorm.weight: one chain, printed once
  %2:bf16[8] = source model.safetensors 'model.layers.{0,1}.input_layernorm.weight'
  %3:f32[8] = cast[f32] %2
  out 'layers.{0,1}.input_layernorm.weight' = %3

  # x2 layers.{0,1}.attention.q_proj.weight: one chain, printed once
  %4:bf16[8,8] = source model.safetensors 'model.layers.{0,1}.self_attn.q_proj.weight'
  %5:bf16[2,4,8] = reshape %4
  %6:bf16[2,4,8] = take[axis=1 [0,2,1,3]] %5
  %7:bf16[8,8] = reshape %6
  %8:f16[8,8] = cast[f16] %7
  out 'layers.{0,1}.attention.q_proj.weight' = %8

  # x2 layers.{0,1}.attention.k_proj.weight: one chain, printed once
  %9:bf16[4,8] = source model.safetensors 'model.layers.{0,1}.self_attn.k_proj.weight'
  %10:bf16[1,4,8] = reshape %9
  %11:bf16[1,4,8] = take[axis=1 [0,2,1,3]] %10
  %12:bf16[4,8] = reshape %11
  %13:f16[4,8] = cast[f16] %12
  out 'layers.{0,1}.attention.k_proj.weight' = %13

  %14:bf16[8] = source model.safetensors@0x5a0 'model.norm.weight'
  %15:f32[8] = cast[f32] %14
  out 'norm.weight' = %15

summary:
  tensors   8 (0 zero-copy)
  nodes     28
  read      528 B from 8 source tensors in 1 file
  written   576 B
  peak      608 B estimated for the reference executor
"""

GOLDEN_LAYER1_UNGROUPED = """\
plan: 3 tensors, 12 nodes
  %0:bf16[8] = source model.safetensors@0x4cc 'model.layers.1.input_layernorm.weight'
  %1:f32[8] = cast[f32] %0
  out 'layers.1.input_layernorm.weight' = %1

  %2:bf16[8,8] = source model.safetensors@0x4dc 'model.layers.1.self_attn.q_proj.weight'
  %3:bf16[2,4,8] = reshape %2
  %4:bf16[2,4,8] = take[axis=1 [0,2,1,3]] %3
  %5:bf16[8,8] = reshape %4
  %6:f16[8,8] = cast[f16] %5
  out 'layers.1.attention.q_proj.weight' = %6

  %7:bf16[4,8] = source model.safetensors@0x55c 'model.layers.1.self_attn.k_proj.weight'
  %8:bf16[1,4,8] = reshape %7
  %9:bf16[1,4,8] = take[axis=1 [0,2,1,3]] %8
  %10:bf16[4,8] = reshape %9
  %11:f16[4,8] = cast[f16] %10
  out 'layers.1.attention.k_proj.weight' = %11

summary:
  tensors   3 (0 zero-copy)
  nodes     12
  read      208 B from 3 source tensors in 1 file
  written   224 B
  peak      288 B estimated for the reference executor
"""


def test_golden_grouped(tiny):
    p, d = tiny
    text = explain(p, steps=False)
    assert text == GOLDEN_GROUPED
    assert d not in text and os.sep + "tmp" not in text  # basenames only, no temporary paths


def test_golden_filtered_ungrouped(tiny):
    p, _ = tiny
    assert explain(p, filter="layers.1.*", group_layers=False, steps=False) == GOLDEN_LAYER1_UNGROUPED


def test_deterministic_and_plan_methods(tiny):
    p, _ = tiny
    assert explain(p) == explain(p)
    assert str(p) == p.explain()
    assert p.explain(filter="layers.1.*", group_layers=False).startswith("plan: 3 tensors, 12 nodes\n")


def test_filter_matching_nothing_is_an_error(tiny):
    p, _ = tiny
    with pytest.raises(LazyWeightsError, match="matches none"):
        explain(p, filter="nothing.*")


def test_22_layers_stay_readable(tmp_path, tiny_llama, w1_plan):
    d = str(tmp_path / "big")
    cfg = tiny_llama(d, layers=22)
    p = w1_plan(d, cfg)
    text = explain(p, steps=False)
    assert "out 'layers.{0..21}.attention.q_proj.weight' = %" in text
    assert "# x22 layers.{0..21}.attention.k_proj.weight" in text
    assert "'model.layers.{0..21}.self_attn.q_proj.weight'" in text
    assert len(text.splitlines()) < 45
    assert "plan: 68 tensors" in text
    # ungrouped: every layer printed
    full = explain(p, steps=False, group_layers=False)
    assert "out 'layers.21.attention.q_proj.weight'" in full
    assert len(full.splitlines()) > 200


def test_layers_with_different_chains_are_not_merged():
    ws = {f"layers.{i}.w": WeightData.from_numpy(np.zeros((2, 2), np.float32), f"w{i}") for i in range(4)}
    sd = {k: (v.astype(DType.float16) if k != "layers.2.w" else v.astype(DType.bfloat16)) for k, v in ws.items()}
    text = explain(lw.plan(sd), steps=False)
    assert "out 'layers.{0,1,3}.w' = %" in text
    assert "out 'layers.2.w' = %" in text


def test_shared_source_printed_once_and_read_once():
    w = WeightData.from_numpy(np.ones((4, 2), np.float32), "emb")
    p = lw.plan({"embed.weight": w.astype(DType.float16), "lm_head.weight": w.astype(DType.bfloat16),
                 "tied.weight": w})
    text = explain(p, steps=False)
    lines = text.splitlines()
    assert sum("= const" in ln for ln in lines) == 1
    assert "out 'tied.weight' = %0" in text
    assert "(1 zero-copy)" in text
    assert "+ 32 B of in-memory constants" in text


def test_sources_counted_once(tmp_path, write_safetensors):
    path = str(tmp_path / "m.safetensors")
    write_safetensors(path, {"a": np.ones((4, 4), np.float32), "b": np.ones((2,), np.float32)})
    w = lw.load_weights([path])
    a = w.a.data()
    p = lw.plan({"x": a.astype(DType.float16), "y": a[:2], "z": w.b.data()})
    text = explain(p, steps=False)
    assert "read      72 B from 2 source tensors in 1 file" in text
    assert "slice[0:2,:] %0" in text
    assert "(1 zero-copy)" in text


def test_op_formatting():
    x = WeightData.from_numpy(np.zeros((4, 6), np.float32), "x")
    y = WeightData.from_numpy(np.zeros((2, 6), np.float32), "y")
    sd = {
        "cat": lw.concat([x, y], axis=0),
        "perm": x.transpose(),
        "view": x.view(DType.uint16),
        "rev": x[::-1, 1:5:2],
    }
    text = explain(lw.plan(sd), steps=False, group_layers=False)
    assert "concat[axis=0] %0 %1" in text
    assert "permute[1,0] %0" in text
    assert "u16[4,12] = bitcast[u16] %0" in text
    assert "take[axis=0 [3,2,1,0]]" in text
    assert "slice[:,1:5:2]" in text


def test_quantized_source_and_dequantize(tmp_path):
    from lazyweights.formats.source import SourceFile, TensorRecord

    raw = str(tmp_path / "q.bin")
    np.zeros(2 * 34, np.uint8).tofile(raw)
    rec = TensorRecord(SourceFile.open(raw), "blk.0.w", 0, 68, DType.uint8, (2, 34), QuantizationEncoding.Q8_0)
    wd = WeightData.wrap(ops.source(rec), "blk.0.w", QuantizationEncoding.Q8_0)
    text = explain(lw.plan({"w": wd.dequantize(DType.float16)}), steps=False)
    assert "%0:u8[2,34] = source[Q8_0] q.bin@0x0 'blk.0.w'" in text
    assert "%1:f16[2,32] = dequantize[Q8_0->f16] %0" in text


def test_peak_memory_estimates():
    x = ops.const(np.zeros((4, 8), np.float32))  # 128 bytes, not counted (caller's memory)
    assert estimate_peak_memory({"a": x}) == 0
    assert estimate_peak_memory({"a": ops.cast(x, DType.float16)}) == 64
    # a transposed view is made contiguous at the end: one copy
    assert estimate_peak_memory({"a": ops.permute(x, (1, 0))}) == 128
    # reshape of a non-contiguous view copies; then the output is contiguous
    assert estimate_peak_memory({"a": ops.reshape(ops.permute(x, (1, 0)), (32,))}) == 128
    # intermediates are freed after their last use; outputs are kept
    chain = ops.cast(ops.take(x, [1, 0, 3, 2], 0), DType.float16)  # take: 128, then cast: 64
    assert estimate_peak_memory({"a": chain}) == 192
    assert estimate_peak_memory({"a": chain, "b": ops.cast(x, DType.bfloat16)}) == 192
    assert estimate_peak_memory({"b": ops.cast(x, DType.bfloat16), "a": chain}) == 64 + 192


def test_peak_memory_matches_reference_executor(tiny):
    import tracemalloc

    p, _ = tiny
    big = {k: WeightData.from_numpy(np.ones((256, 256), np.float32), k) for k in ("a", "b")}
    sd = {"a": big["a"].astype(DType.float16).T, "b": big["b"][[3, 2, 1, 0]].astype(DType.bfloat16)}
    plan = lw.plan(sd)
    est = estimate_peak_memory(plan.outputs)
    plan.materialize(scheduler="reference")
    tracemalloc.start()
    try:
        plan.materialize(scheduler="reference")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the f16 result (128 KiB) and its contiguous copy at the end (the output is a transposed view),
    # plus the bf16 rows of "b" (2 KiB); the gathered f32 rows of "b" were freed before the copy.
    assert est == 2 * 256 * 256 * 2 + 4 * 256 * 2
    assert 0.9 * est <= peak <= 1.2 * est + 65536


# --- the steps section ----------------------------------------------------------------------------------
def test_steps_section_from_a_scheduler(tiny, monkeypatch):
    p, _ = tiny

    class Step:
        def __init__(self, outputs, nodes, kind):
            self.outputs, self.nodes, self.kind = outputs, nodes, kind

    def compile_steps(plan):
        return [Step([name], node.toposort(), "fused") for name, node in plan.items()]

    import lazyweights.render.explain as explain_module

    monkeypatch.setattr(explain_module, "compile_steps", compile_steps)
    text = explain(p)
    assert "\nsteps: 8 (8 fused)\n" in text
    assert "  fused   x2 layers.{0,1}.attention.q_proj.weight: source -> reshape -> take -> reshape -> cast" in text
    assert "  fused      norm.weight: source -> cast" in text
    assert explain(p, steps=False) == GOLDEN_GROUPED

    monkeypatch.setattr(explain_module, "compile_steps", None)  # no compiler: no section
    assert "steps:" not in explain(p)

    def broken(plan):
        raise RuntimeError("boom")

    monkeypatch.setattr(explain_module, "compile_steps", broken)
    assert "steps: unavailable: the scheduler failed: RuntimeError: boom" in explain(p)


def test_steps_section_with_the_real_scheduler(tiny):
    pytest.importorskip("lazyweights.compiler.steps")
    from lazyweights.compiler import steps as schedule

    if not hasattr(schedule, "compile_steps"):
        pytest.skip("scheduler without compile_steps")
    p, _ = tiny
    text = p.explain()
    assert "\nsteps: " in text
    assert "layers.{0,1}.attention.q_proj.weight" in text.split("\nsteps: ")[1]


# --- helpers ---------------------------------------------------------------------------------------------
def test_name_pattern_and_bytes():
    assert name_pattern([f"layers.{i}.w" for i in range(22)]) == "layers.{0..21}.w"
    assert name_pattern(["a.0.w", "a.1.w"]) == "a.{0,1}.w"
    assert name_pattern(["a.0.w", "a.2.w", "a.3.w", "a.4.w"]) == "a.{0,2..4}.w"
    assert name_pattern(["l.0.e.1", "l.1.e.1"]) == "l.{0,1}.e.1"
    assert name_pattern(["m-00001-of-00003", "m-00003-of-00003"]) == "m-{00001,00003}-of-00003"
    # names that differ in one word fold to an exact pattern (core.names, shared with the bring-up report)
    assert name_pattern(["x.w", "y.w"]) == "{x,y}.w"
    assert name_pattern(["x.w", "y.v", "z.u"]) == "x.w (+2 more)"
    # a ragged set is never shown as a box that claims names that are not there (l.1.e.{2,3} is absent)
    ragged = [f"l.0.e.{j}" for j in range(4)] + ["l.1.e.0", "l.1.e.1"]
    assert name_pattern(ragged) == "l.0.e.{0..3} (+2 more)"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 2**30) == "3 GiB"


def test_doctests():
    import lazyweights.render.explain
    import lazyweights.tools.demo

    for mod in (lazyweights.render.explain, lazyweights.tools.demo):
        res = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert res.failed == 0, mod.__name__


def test_gather_indices_written_as_slices():
    from lazyweights.render.explain import index_text

    rope = np.concatenate([np.arange(0, 64, 2), np.arange(1, 64, 2)])
    assert index_text(rope, 64) == "[0:64:2,1:64:2]"
    assert index_text(rope) == "[0:63:2,1:64:2]"
    assert index_text(np.arange(9, -1, -1)) == "[9::-1]"
    assert index_text([0, 2, 1, 3]) == "[0,2,1,3]"
    assert index_text(list(range(10)) + [42], 50) == "[0:10,42]"
    long = index_text(np.random.default_rng(0).permutation(1000))
    assert long.endswith(",...(1000)]") and len(long) < 64
    x = WeightData.from_numpy(np.zeros((2, 64, 3), np.float32), "x")
    assert "take[axis=1 [0:64:2,1:64:2]] %0" in explain(lw.plan({"y": x[:, rope, :]}), steps=False)
