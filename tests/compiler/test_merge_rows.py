"""Merged leading axes: steps whose rows are too big for a block (stacked MoE experts) are computed over the
output viewed as [d0 * d1, ...], so they stream in budget-sized blocks instead of needing a whole expert.

References are numpy's stack/concatenate/astype on the arrays the safetensors package reads back, and the
reference executor (op-at-a-time numpy) on the un-merged chain.
"""
from __future__ import annotations

import os
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import lazyweights as lw
from lazyweights.compiler.steps import compile_steps
from lazyweights.graph import ops
from lazyweights.graph.elementwise import binary
from lazyweights.graph.rewrites import merge_leading_axes
from lazyweights.run.materialize import materialize
from lazyweights.run.reference import materialize_reference
from lazyweights.tools.verify import hash_plan

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(7)
E, I, H = 4, 96, 64  # experts, intermediate, hidden: Mixtral's layout, scaled down


@pytest.fixture(scope="module")
def experts(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    t = {}
    for e in range(E):
        t[f"e{e}.w1"] = RNG.standard_normal((I, H)).astype(BF16)
        t[f"e{e}.w3"] = RNG.standard_normal((I, H)).astype(BF16)
        t[f"e{e}.w2"] = RNG.standard_normal((H, I)).astype(BF16)
    path = d / "experts.safetensors"
    save_file(t, str(path))
    return path, load_file(str(path))


def fused(weights, cast=True):
    """Mixtral's per-expert w1/w3/w2 -> gate_up_proj [E, 2I, H] (f16) and down_proj [E, H, I] (bf16)."""
    gate_up = lw.stack([lw.concat([weights[f"e{e}.w1"].data(), weights[f"e{e}.w3"].data()], axis=0)
                        for e in range(E)])
    down = lw.stack([weights[f"e{e}.w2"].data() for e in range(E)])
    return {"gate_up": gate_up.astype(lw.DType.float16) if cast else gate_up, "down": down}


def numpy_fused(t, cast=True):
    gate_up = np.stack([np.concatenate([t[f"e{e}.w1"], t[f"e{e}.w3"]]) for e in range(E)])
    return {"gate_up": gate_up.astype(np.float16) if cast else gate_up,
            "down": np.stack([t[f"e{e}.w2"] for e in range(E)])}


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


ROW = 2 * I * H * 2  # bytes of one gate_up row (one expert) in float16


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_budget_below_one_expert_streams_in_blocks(experts, scheduler):
    """Before merging, one block of gate_up was one expert: a budget below that was a BudgetError."""
    path, arrays = experts
    plan = lw.plan(fused(lw.load_weights(path)))
    budget = ROW // 4
    steps = {s.outputs[0]: s for s in compile_steps(plan, budget=budget, workers=2)}
    assert steps["gate_up"].node.shape == (E * 2 * I, H)
    assert steps["down"].node.shape == (E * H, I)
    for s in steps.values():
        assert len(s.blocks) > E and s.block_bytes * 2 <= budget
    got = plan.materialize(budget=budget, scheduler=scheduler)
    want = numpy_fused(arrays)
    for name in want:
        assert same(got[name], want[name]), name


def test_unmerged_when_rows_fit(experts):
    path, _ = experts
    steps = {s.outputs[0]: s for s in compile_steps(lw.plan(fused(lw.load_weights(path))))}
    assert steps["gate_up"].node.shape == (E, 2 * I, H) and len(steps["gate_up"].blocks) == 1


def test_save_and_verify_with_merged_rows(experts, tmp_path):
    path, arrays = experts
    plan = lw.plan(fused(lw.load_weights(path)))
    out = tmp_path / "fused.safetensors"
    plan.save(out, budget=ROW // 4)
    back = load_file(str(out))
    want = numpy_fused(arrays)
    assert set(back) == set(want)
    for name in want:
        assert same(back[name], want[name]), name
    assert hash_plan(plan, budget=ROW // 4) == hash_plan(plan), "block boundaries must not change the bytes"


def test_merged_step_fills_caller_buffers_in_place(experts):
    path, arrays = experts
    plan = lw.plan(fused(lw.load_weights(path)))
    want = numpy_fused(arrays)
    dst = {n: np.empty(a.shape, a.dtype) for n, a in want.items()}
    got = materialize(plan, budget=ROW // 4, scheduler="sync", out=dst)
    for name in want:
        assert got[name] is dst[name] and same(dst[name], want[name]), name


def test_merged_step_has_no_expert_sized_temporary(tmp_path):
    """Working memory follows the budget, not the expert: 1 MiB experts streamed with a 128 KiB budget."""
    i, h = 1024, 256
    t = {f"e{e}.{w}": RNG.standard_normal((i, h)).astype(BF16) for e in range(E) for w in ("w1", "w3")}
    save_file(t, str(tmp_path / "big.safetensors"))
    weights = lw.load_weights(tmp_path / "big.safetensors")
    gate_up = lw.stack([lw.concat([weights[f"e{e}.w1"].data(), weights[f"e{e}.w3"].data()], axis=0)
                        for e in range(E)]).astype(lw.DType.float16)
    plan = lw.plan({"gate_up": gate_up})
    dst = np.empty((E, 2 * i, h), np.float16)
    budget = 128 << 10
    materialize(plan, budget=budget, scheduler="sync", out={"gate_up": dst})  # warm up outside the measurement
    tracemalloc.start()
    materialize(plan, budget=budget, scheduler="sync", out={"gate_up": dst})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    expert = 2 * i * h * 2
    assert peak < budget, f"peak traced allocation {peak} bytes; one expert is {expert}, the budget {budget}"
    want = np.stack([np.concatenate([t[f"e{e}.w1"], t[f"e{e}.w3"]]) for e in range(E)]).astype(np.float16)
    assert same(dst, want)


def test_budget_error_when_nothing_can_merge(tmp_path):
    """A chain that must see whole inputs (a transpose of a computed value) still fails before any work."""
    a = RNG.standard_normal((4, 64, 32)).astype(np.float32)
    x = lw.WeightData.from_numpy(a, "x")
    y = (x + x).transpose(0, 2, 1)  # permute over a computed node keeps axis 0: blocks are along it
    plan = lw.plan({"y": y})
    with pytest.raises(lw.BudgetError) as e:
        plan.save(tmp_path / "o.safetensors", budget=1024)
    assert "'y'" in str(e.value) and "1024" in str(e.value)
    assert os.listdir(tmp_path) == []


# --- the rewrite itself, op by op, against the reference executor ------------------------------------------
def _leaf(shape, dtype=np.float32):
    return ops.const(RNG.standard_normal(shape).astype(dtype))


def _computed(shape):
    return ops.cast(_leaf(shape), "float16")  # not a view: forces the rewrite to go through the op


CASES = {
    "stack of casts": lambda: ops.concat([ops.reshape(_computed((6, 5)), (1, 6, 5)) for _ in range(3)], 0),
    "concat axis 0": lambda: ops.concat([_computed((2, 6, 5)), _computed((3, 6, 5))], 0),
    "concat axis 1": lambda: ops.concat([_computed((3, 4, 5)), _computed((3, 2, 5))], 1),
    "concat axis 2": lambda: ops.concat([_computed((3, 4, 5)), _computed((3, 4, 2))], 2),
    "cast of a view": lambda: ops.cast(ops.permute(_leaf((3, 4, 5, 6)), (0, 1, 3, 2)), "bfloat16"),
    "permute keeping 0, 1": lambda: ops.permute(_computed((3, 4, 5, 6)), (0, 1, 3, 2)),
    "slice along axis 0": lambda: ops.slice_(_computed((5, 4, 3)), ((1, 4, 1), (0, 4, 1), (0, 3, 2))),
    "take along axis 2": lambda: ops.take(_computed((3, 4, 6)), [5, 0, 2], 2),
    "binary, same shapes": lambda: binary(
        "add", _computed((3, 4, 5)), _computed((3, 4, 5))),
    "bitcast": lambda: ops.bitcast(_computed((3, 4, 6)), "uint8"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_merge_leading_axes_is_a_reshape(case):
    root = CASES[case]()
    merged = merge_leading_axes(root)
    assert merged is not None and merged.shape == (root.shape[0] * root.shape[1],) + root.shape[2:]
    want = materialize_reference({"r": root})["r"]
    got = materialize_reference({"m": merged})["m"]
    assert same(got, np.ascontiguousarray(want).reshape(merged.shape))
    # and the block executor agrees, in small blocks
    blocks = materialize({"m": merged}, scheduler="sync", block_bytes=64)["m"]
    assert same(blocks, got)


NOT_MERGEABLE = {
    "2-d": lambda: _computed((4, 5)),
    "permute moving axis 0": lambda: ops.permute(_computed((3, 4, 5)), (1, 0, 2)),
    "take along axis 1": lambda: ops.take(_computed((3, 4, 5)), [1, 0], 1),
    "slice along axis 1": lambda: ops.slice_(_computed((3, 4, 5)), ((0, 3, 1), (1, 3, 1), (0, 5, 1))),
    "broadcast binary": lambda: binary(
        "mul", _computed((3, 4, 5)), _computed((1, 4, 5))),
}


@pytest.mark.parametrize("case", sorted(NOT_MERGEABLE))
def test_merge_leading_axes_declines(case):
    assert merge_leading_axes(NOT_MERGEABLE[case]()) is None
