"""`_build_step` finds in one walk what the compiler's rules find one at a time.

`compile_steps` builds a step from one walk over its chain (for a 90,000-tensor plan: benchmarks/
bench_scale.py). Each step it returns is held equal, field by field, to the rules applied separately as they
are written: `_rewritten` (the casts and slices sunk, the nodes in order), the step's kind from
`strided_layout`, `WHOLE_INPUT` for every node, `_work_per_row`, the streaming rule (nothing but layout ops and
leaves below the root), and the row blocks `range(r, min(r + rows, n))`. Over every chain shape the library
builds: FP8 block dequantization, casts over views and over takes, slices of casts, concats of casts, 1-D
dequantizations and permutes that need whole inputs, views and copies.
"""
from __future__ import annotations

import numpy as np
import pytest

from lazyweights import DType
from lazyweights.compiler.steps import (
    WHOLE_INPUT,
    Step,
    _rewritten,
    _work_per_row,
    compile_steps,
    outputs_of,
)
from lazyweights.core.quantization import QuantizationEncoding
from lazyweights.graph import ops
from lazyweights.graph.elementwise import binary, unary
from lazyweights.graph.layout import strided_layout
from lazyweights.graph.opcodes import GroupOp


def chains() -> dict:
    f8 = ops.const(np.zeros((300, 520), np.float32).astype(DType.float8_e4m3fn.to_numpy()))
    scale = ops.const(np.ones((3, 5), np.float32))
    fp8 = ops.cast(binary("mul", ops.cast(f8, DType.float32),
                          ops.take(ops.take(scale, np.arange(300) // 128, 0), np.arange(520) // 128, 1)),
                   DType.bfloat16)
    x = ops.const(np.arange(64 * 48, dtype=np.float32).reshape(64, 48))
    q8 = QuantizationEncoding.parse("Q8_0")
    blocks = ops.const(np.zeros((6, 34 * 4), np.uint8))
    return {
        "fp8": fp8,
        "cast_of_transpose": ops.cast(ops.permute(x, (1, 0)), DType.float16),
        "transpose_of_cast": ops.permute(ops.cast(x, DType.float16), (1, 0)),  # sinks
        "slice_of_cast": ops.slice_(ops.cast(x, DType.bfloat16), [(0, 32, 1), (8, 40, 2)]),  # sinks
        "concat_of_casts": ops.concat([ops.cast(x, DType.float16), ops.cast(x, DType.float16)], 0),  # sinks
        "take_of_cast": ops.take(ops.cast(x, DType.float16), np.arange(63, -1, -1), 0),  # sinks
        "cast_of_take": ops.cast(ops.take(x, np.arange(64) // 2, 0), DType.float16),
        "view": ops.reshape(x, (32, 96)),
        "copy": ops.permute(x, (1, 0)),
        "slice_view": ops.slice_(x, [(2, 10, 1), (0, 48, 1)]),
        "dequant_1d": ops.dequantize(ops.reshape(blocks, (6 * 136,)), q8, DType.float32),
        "dequant_2d": ops.dequantize(blocks, q8, DType.float16),
        "permute_3d": ops.permute(ops.reshape(unary("neg", x), (8, 8, 48)), (2, 0, 1)),  # needs whole input
        "permute_3d_of_cast": ops.cast(ops.permute(ops.reshape(ops.cast(x, DType.float16), (8, 8, 48)), (2, 0, 1)),
                                       DType.float32),  # sinks
        "unary_of_reshape_of_cast": unary("neg", ops.reshape(ops.cast(x, DType.float16), (48, 64))),  # sinks
        "leaf": x,
    }


def reference_step(name, node, keep_views: bool) -> Step:
    root, nodes = _rewritten(node)
    view = strided_layout(root, {})
    kind = "fused" if view is None else ("view" if view.c_contiguous and keep_views else "copy")
    step = Step([name], root, kind, nodes)
    step.whole = any(WHOLE_INPUT[n.op](n, {}) for n in nodes)
    step.work_per_row = _work_per_row(step, {})
    step.streams = all(n is root or n.op in GroupOp.Leaf or n.op in GroupOp.Layout for n in nodes)
    return step


@pytest.mark.parametrize("keep_views", [True, False])
@pytest.mark.parametrize("block_bytes", [None, 1000, 1 << 14])
def test_steps_equal_the_rules_applied_one_at_a_time(keep_views, block_bytes):
    plan = chains()
    steps = compile_steps(plan, keep_views=keep_views, block_bytes=block_bytes, merge_rows=False,
                          budget=1 << 30, workers=2)
    assert sorted(s.outputs[0] for s in steps) == sorted(plan)
    sunk = {"transpose_of_cast", "slice_of_cast", "concat_of_casts", "take_of_cast", "permute_3d_of_cast",
            "unary_of_reshape_of_cast"}
    for step in steps:
        name = step.outputs[0]
        want = reference_step(name, outputs_of(plan)[name], keep_views)
        assert (step.node is outputs_of(plan)[name]) == (name not in sunk), name
        assert step.node == want.node, name
        assert step.nodes == want.nodes, name
        assert (step.kind, step.whole, step.streams, step.work_per_row) == \
            (want.kind, want.whole, want.streams, want.work_per_row), name
        n = step.node.shape[0] if step.node.shape else 1
        if step.blocks and step.kind != "view" and not step.whole:
            rows = len(step.blocks[0])
            assert step.blocks == [range(r, min(r + rows, n)) for r in range(0, n, rows)], name
        assert sum(len(b) for b in step.blocks) == n, name
    kinds = {s.outputs[0]: (s.kind, s.whole, s.streams) for s in steps}
    assert kinds["fp8"] == ("fused", False, False)
    assert kinds["dequant_1d"][1] and kinds["permute_3d"][1]  # whole inputs
    assert kinds["cast_of_take"][2] and not kinds["unary_of_reshape_of_cast"][2]
    assert kinds["view"][0] == ("view" if keep_views else "copy") and kinds["copy"][0] == "copy"
