"""RangeSet and plan_requests against a byte mask (numpy bool per byte), on random inputs small enough for the
Python sweeps and large enough for the vectorized ones (`NUMPY_FROM`), through random sequences of updates."""
from __future__ import annotations

import random

import numpy as np
import pytest

from lazyweights.io import ranges as R
from lazyweights.io.ranges import RangeSet, merge, plan_requests

SPAN = 20_000


def _runs(mask: np.ndarray, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
    """The maximal runs of True in mask[lo:hi], as absolute (start, end) pairs."""
    m = np.concatenate([[False], mask[lo:hi], [False]]).astype(np.int8)
    d = np.flatnonzero(np.diff(m))
    return [(lo + int(a), lo + int(b)) for a, b in zip(d[::2], d[1::2])]


def _random_ranges(rng: random.Random, n: int) -> list[tuple[int, int]]:
    out = []
    for _ in range(n):
        s = rng.randrange(SPAN - 100)
        out.append((s, s + rng.randrange(0, 100)))
    return sorted(out)


@pytest.mark.parametrize("numpy_from", [10**9, 0, R.NUMPY_FROM])
@pytest.mark.parametrize("seed", range(4))
def test_rangeset_equals_a_byte_mask(monkeypatch, numpy_from, seed):
    monkeypatch.setattr(R, "NUMPY_FROM", numpy_from)
    rng = random.Random(seed)
    held, mask = RangeSet(), np.zeros(SPAN, bool)
    for _ in range(60):
        op = rng.choice(["add", "add_many", "remove", "remove_many", "query"])
        many = _random_ranges(rng, rng.randrange(0, 600))
        if op == "add":
            s, e = many[0] if many else (5, 9)
            held.add(s, e)
            mask[s:e] = True
        elif op == "add_many":
            held.add_many(many)
            for s, e in many:
                mask[s:e] = True
        elif op == "remove":
            s, e = many[0] if many else (5, 9)
            held.remove(s, e)
            mask[s:e] = False
        elif op == "remove_many":
            held.remove_many(many)
            for s, e in many:
                mask[s:e] = False
        else:
            assert held.missing_many(many) == [r for s, e in many for r in _runs(~mask, s, e)]
            assert [r for r in held.held_many(many) if r[1] > r[0]] == [r for s, e in many for r in _runs(mask, s, e)]
        assert held.ranges == _runs(mask)
        assert held.total() == int(mask.sum())
        assert all(type(x) is int for r in held.ranges for x in r)


@pytest.mark.parametrize("numpy_from", [10**9, 0])
def test_merge_equals_a_byte_mask(monkeypatch, numpy_from):
    monkeypatch.setattr(R, "NUMPY_FROM", numpy_from)
    rng = random.Random(7)
    for gap in (0, 1, 40):
        many = [r for r in _random_ranges(rng, 500) if r[1] > r[0]]
        rng.shuffle(many)
        mask = np.zeros(SPAN + 200, bool)
        for s, e in many:
            mask[s:e + gap] = True  # a gap of up to `gap` bytes after a range joins it to the next
        # each run of the mask is one merged range, ending `gap` bytes after its last range ends
        assert merge(many, gap) == [(s, e - gap) for s, e in _runs(mask)]


def test_a_rank_of_row_runs_is_planned_into_small_multi_range_requests():
    """90,112-style row runs: each request's ranges fit a Range header nginx takes and MULTI_RANGE_BYTES; a
    range worth its own request (longer than `gap`) is fetched alone; nothing is lost or duplicated."""
    rows = [(1000 + r * 11264, 1000 + r * 11264 + 2816) for r in range(4096)]
    big = [(rows[-1][1] + 10_000, rows[-1][1] + 10_000 + (3 << 20))]
    requests = plan_requests(rows + big, gap=500_000, multi_range=True, part_size=128 << 20, part_gap=0)
    assert [big[0]] in requests
    multi = [r for r in requests if r != [big[0]]]
    assert all(sum(e - s for s, e in r) <= R.MULTI_RANGE_BYTES for r in multi)
    assert all(sum(len(f"{s}-{e - 1}") + 1 for s, e in r) <= R.RANGE_HEADER_CHARS for r in multi)
    assert sorted(x for r in multi for x in r) == rows


def test_link_meter_counts_bytes_over_busy_time(monkeypatch):
    """Overlapping requests count their common time once; idle time between them not at all."""
    from lazyweights.io.ranges import LinkMeter

    now = [0.0]
    monkeypatch.setattr(R.time, "perf_counter", lambda: now[0])
    m = LinkMeter()
    m.start()  # t=0
    now[0] = 1.0
    m.start()  # a second request overlaps the first
    now[0] = 2.0
    m.done(10 << 20)
    m.done(10 << 20)  # busy [0, 2]
    now[0] = 10.0  # idle
    m.start()
    now[0] = 12.0
    m.done(12 << 20)  # busy [10, 12]: 32 MiB over 4 s
    assert m.bandwidth() == (32 << 20) / 4
    m.start()
    now[0] = 13.0
    assert m.bandwidth() == (32 << 20) / 5  # a request in flight counts its time so far
    assert LinkMeter().bandwidth() is None


@pytest.mark.parametrize("cut", [[(0, 5)], [(995, 2000)], [(35, 38)], [(12, 13), (55, 61)], [(0, 2000)],
                                 [(10, 20), (30, 40)], [(19, 31)]])
def test_a_sweep_removal_cuts_only_what_its_span_touches(monkeypatch, cut):
    """`remove_many` on the vectorized path cuts the held ranges inside the cut's span and keeps those
    before and after it as they are: a cut before, after or between every held range, inside one, across
    several, over all."""
    monkeypatch.setattr(R, "NUMPY_FROM", 0)
    start = [(10, 20), (30, 40), (50, 60), (900, 990)]
    held, mask = RangeSet(start), np.zeros(2100, bool)
    for s, e in start:
        mask[s:e] = True
    held.remove_many(cut)
    for s, e in cut:
        mask[s:e] = False
    assert held.ranges == _runs(mask)
