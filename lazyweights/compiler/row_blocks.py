"""`RowBlocks`: a step's row blocks, `rows` at a time, as a sequence of `range`s made when asked for.

A DeepSeek-V3-sized plan cuts 45,000 steps into ~350,000 blocks. As a list of `range` objects they were 17 MB
and about a third of `steps()`'s time (`benchmarks/bench_scale.py`, benchmarks/RESULTS.md); the executor only
ever walks them once, so they are described by two integers and made one at a time.

Example:
    >>> from lazyweights.compiler.row_blocks import RowBlocks
    >>> b = RowBlocks(10, 4)
    >>> list(b), len(b), b[-1], b.longest
    ([range(0, 4), range(4, 8), range(8, 10)], 3, range(8, 10), 4)
    >>> b == [range(0, 4), range(4, 8), range(8, 10)], b[1:]
    (True, [range(4, 8), range(8, 10)])
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..core.errors import UsageError


class RowBlocks(Sequence):
    """Rows `[0, nrows)` cut into blocks of `rows` (the last one shorter), as `range`s: a read-only sequence
    that compares equal to the list of the same ranges."""

    __slots__ = ("nrows", "rows")

    def __init__(self, nrows: int, rows: int):
        if nrows < 1 or rows < 1:
            raise UsageError(f"RowBlocks needs at least one row and a block of at least one row, got nrows="
                             f"{nrows}, rows={rows}")
        self.nrows, self.rows = nrows, rows

    def __len__(self) -> int:
        return -(-self.nrows // self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"block {i} of {n}")
        start = i * self.rows
        return range(start, min(start + self.rows, self.nrows))

    def __iter__(self) -> Iterator[range]:
        rows, nrows = self.rows, self.nrows
        for start in range(0, nrows, rows):
            yield range(start, min(start + rows, nrows))

    @property
    def longest(self) -> int:
        """Rows in the longest block (the first)."""
        return min(self.rows, self.nrows)

    def __eq__(self, other) -> bool:
        if isinstance(other, (RowBlocks, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    # Equal to a list, which has no hash, so no hash either.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RowBlocks(nrows={self.nrows}, rows={self.rows})"
