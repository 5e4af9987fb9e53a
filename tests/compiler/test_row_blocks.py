"""`RowBlocks` behaves as the list of `range`s it stands for (the executor, the GPU compiler and the viewer
walk, index, slice and count a step's blocks)."""
import numpy as np
import pytest

from lazyweights import DType, WeightData, plan
from lazyweights.compiler.row_blocks import RowBlocks
from lazyweights.compiler.steps import compile_steps
from lazyweights.core.errors import UsageError


def as_list(nrows: int, rows: int) -> list[range]:
    return [range(s, min(s + rows, nrows)) for s in range(0, nrows, rows)]


@pytest.mark.parametrize("nrows,rows", [(1, 1), (1, 5), (10, 3), (12, 4), (7, 7), (1000, 999), (2**40, 2**38)])
def test_same_as_the_list(nrows, rows):
    b = RowBlocks(nrows, rows)
    if nrows < 10**6:
        want = as_list(nrows, rows)
        assert list(b) == want and b == want and want == b
        assert [b[i] for i in range(-len(want), len(want))] == want + want
        assert b[1:] == want[1:] and b[::-2] == want[::-2]
        assert b.longest == max(len(r) for r in want)
    assert len(b) == -(-nrows // rows)
    assert b[-1].stop == nrows and b[0].start == 0
    with pytest.raises(IndexError):
        b[len(b)]
    with pytest.raises(IndexError):
        b[-len(b) - 1]


def test_not_equal_to_other_cuts():
    assert RowBlocks(10, 3) != RowBlocks(10, 4)
    assert RowBlocks(10, 3) != as_list(10, 4)
    assert RowBlocks(10, 3) == RowBlocks(10, 3)


@pytest.mark.parametrize("nrows,rows", [(0, 1), (5, 0), (-1, 2)])
def test_refuses_empty_cuts(nrows, rows):
    with pytest.raises(UsageError, match="at least one row"):
        RowBlocks(nrows, rows)


def test_compiled_steps_cover_every_row_once():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1000, 256)).astype(np.float32)
    p = plan({"a": WeightData.from_numpy(a, "w").astype(DType.float16)})
    (step,) = compile_steps(p, block_bytes=64 << 10)
    assert isinstance(step.blocks, RowBlocks) and len(step.blocks) > 1
    assert [r for block in step.blocks for r in block] == list(range(1000))
    assert step.block_bytes == max(len(b) for b in list(step.blocks)) * step.work_per_row
    np.testing.assert_array_equal(p.materialize()["a"], a.astype(np.float16))
