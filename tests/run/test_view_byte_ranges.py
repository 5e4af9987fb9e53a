"""`run.fetch.view_byte_ranges`: the bytes a numpy view covers, against every element's bytes counted one by one."""
from __future__ import annotations

import numpy as np
import pytest

from lazyweights.run.fetch import view_byte_ranges

BASE = np.arange(4096, dtype=np.uint8)
TABLE = BASE.view(np.uint16).reshape(32, 64)


def element_bytes(v: np.ndarray) -> list[tuple[int, int]]:
    """Every byte of every element of `v`, as sorted runs of adjacent bytes (the slow, obvious way)."""
    start = v.__array_interface__["data"][0] - BASE.__array_interface__["data"][0]
    covered = set()
    for index in np.ndindex(*v.shape):
        at = start + sum(i * s for i, s in zip(index, v.strides))
        covered.update(range(at, at + v.itemsize))
    runs: list[tuple[int, int]] = []
    for b in sorted(covered):
        if runs and b == runs[-1][1]:
            runs[-1] = (runs[-1][0], b + 1)
        else:
            runs.append((b, b + 1))
    return runs


@pytest.mark.parametrize("view", [
    TABLE, TABLE[5:6], TABLE[3:9].reshape(-1),  # contiguous: one run
    TABLE[:, 3:9], TABLE[::-1, ::2], TABLE.T, TABLE[:, ::-3],  # strided, reversed, transposed
    np.broadcast_to(TABLE[:1, :4], (5, 4)),  # a stride of 0: the same bytes five times
    np.lib.stride_tricks.as_strided(TABLE, (3, 4), (6, 2)),  # rows that overlap
], ids=["whole", "row", "rows-flat", "columns", "reversed", "transposed", "step-3", "broadcast", "overlapping"])
def test_view_byte_ranges_are_the_elements_bytes(view):
    assert view_byte_ranges(view, BASE) == element_bytes(view)
