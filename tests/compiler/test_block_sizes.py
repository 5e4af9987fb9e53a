"""Block sizes: a step that streams (its only value op is the last) gets STREAM_BLOCK_BYTES blocks, fewer
tasks, when its blocks are computed in place (materialize); a step with a value op below the root, and
every step of a run whose blocks are read back (a save writes each from a scratch buffer), keeps
DEFAULT_BLOCK_BYTES blocks, which stay in cache; an explicit block_bytes applies to all; the budget still
caps all."""
import numpy as np

from lazyweights.compiler.steps import DEFAULT_BLOCK_BYTES, STREAM_BLOCK_BYTES, compile_steps
from lazyweights.graph import ops
from lazyweights.graph.elementwise import binary

ROWS, COLS = 8192, 4096  # float32: 16 KB a row, 128 MB in all (never allocated: zero strides)
X = ops.const(np.broadcast_to(np.float32(1), (ROWS, COLS)))


def block_rows(node, **kw):
    (step,) = compile_steps({"t": node}, **kw)
    return step, {len(b) for b in step.blocks[:-1]} or {len(step.blocks[0])}


def test_streaming_steps_get_big_blocks():
    perm = np.random.default_rng(0).permutation(ROWS)
    for node in (ops.cast(X, "float16"), ops.cast(ops.take(X, perm, 0), "bfloat16"),
                 ops.cast(ops.permute(ops.reshape(X, (64, 128, COLS)), (1, 0, 2)), "float16")):
        step, rows = block_rows(node)
        assert step.streams, node
        assert rows == {STREAM_BLOCK_BYTES // (step.node.nbytes // step.node.shape[0])}, (node, rows)


def test_steps_with_a_value_op_below_the_root_keep_small_blocks():
    for node in (ops.bitcast(ops.cast(X, "float16"), "uint16"),
                 ops.cast(binary("mul", X, X), "float16")):
        step, rows = block_rows(node)
        assert not step.streams, node
        assert rows == {DEFAULT_BLOCK_BYTES // (COLS * 2)}, (node, rows)


def test_explicit_block_bytes_and_budget_still_rule():
    node = ops.cast(X, "float16")
    assert block_rows(node, block_bytes=1 << 20)[1] == {(1 << 20) // (COLS * 2)}
    step, rows = block_rows(node, budget=8 << 20, workers=2)  # 4 MB per worker
    assert max(rows) * step.work_per_row <= 4 << 20


def test_blocks_that_are_read_back_stay_cache_sized():
    step, rows = block_rows(ops.cast(X, "float16"), in_place=False)
    assert step.streams and rows == {DEFAULT_BLOCK_BYTES // (COLS * 2)}


def test_sinks_say_whether_blocks_stay():
    from lazyweights.run.sinks import MemorySink, WriterSink

    assert MemorySink({}).in_place and not WriterSink({}).in_place
