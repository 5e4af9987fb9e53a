"""Byte ranges: the set a mirror holds, and the requests that fetch a list of them at the least cost.

A plan knows every byte each block reads (`run/fetch.remote_ranges`): a whole tensor is one range, a
tensor-parallel rank's row-parallel slice is one short range per row. `plan_requests` turns those ranges into
HTTP requests with a cost model: a request costs a fixed latency plus its bytes over the bandwidth, so two
ranges separated by a small gap are fetched as one when the gap's bytes cost less than the request (or the
multi-range part) they save. Many small ranges go into one multi-range request where the server takes them.

Example:
    >>> plan_requests([(0, 100), (110, 200), (10_000, 10_100)], gap=1 << 20, multi_range=True)
    [[(0, 200), (10000, 10100)]]
    >>> plan_requests([(0, 100), (110, 200), (10_000, 10_100)], gap=64, multi_range=False)
    [[(0, 200)], [(10000, 10100)]]
"""
from __future__ import annotations

import bisect

# nginx refuses request headers over 8 KB (large_client_header_buffers); ~22 characters a range
RANGE_HEADER_CHARS = 6000
# A part of a multi-range reply carries about 100 bytes of framing (boundary, Content-Type, Content-Range):
# a gap shorter than that costs fewer bytes fetched through than as a part boundary, and saves a part. It is
# the smallest `part_gap` (`RemoteFile`'s cost model: what one more part costs, in bytes).
PART_FRAMING = 128


class RangeSet:
    """Disjoint, sorted, merged half-open byte ranges.

    >>> r = RangeSet(); r.add(0, 10); r.add(20, 30); r.add(10, 15)
    >>> r.ranges, r.missing(5, 25)
    ([(0, 15), (20, 30)], [(15, 20)])
    >>> r.remove(2, 22); r.ranges
    [(0, 2), (22, 30)]
    """

    def __init__(self, ranges=()):
        self.ranges: list[tuple[int, int]] = []
        for s, e in ranges:
            self.add(s, e)

    def add(self, start: int, end: int) -> None:
        """Mark [start, end) held, merging it with the ranges it touches or overlaps; an empty range is ignored."""
        if end <= start:
            return
        i = bisect.bisect_left(self.ranges, (start, start))
        if i and self.ranges[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(self.ranges) and self.ranges[j][0] <= end:
            start, end = min(start, self.ranges[j][0]), max(end, self.ranges[j][1])
            j += 1
        self.ranges[i:j] = [(start, end)]

    def add_many(self, ranges: list[tuple[int, int]]) -> None:
        """Add many ranges in one merge (O(n + m)); `add` one by one would be O(n) each.

        >>> r = RangeSet([(0, 4)]); r.add_many([(10, 12), (2, 6), (12, 14)]); r.ranges
        [(0, 6), (10, 14)]
        """
        self.ranges = merge(self.ranges + [r for r in ranges if r[1] > r[0]])

    def remove(self, start: int, end: int) -> None:
        """Mark [start, end) no longer held (its bytes were released): only the ranges it touches are looked at."""
        if end <= start:
            return
        i = max(0, bisect.bisect_left(self.ranges, (start, start)) - 1)
        j, keep = i, []
        while j < len(self.ranges) and self.ranges[j][0] < end:
            s, e = self.ranges[j]
            if e <= start:
                keep.append((s, e))
            else:
                if s < start:
                    keep.append((s, start))
                if e > end:
                    keep.append((end, e))
            j += 1
        self.ranges[i:j] = keep

    def remove_many(self, ranges: list[tuple[int, int]]) -> None:
        """`remove` for many ranges in one sweep (O(n + m)): a rank's release of thousands of row runs, with
        as many held, was quadratic one `remove` at a time (issue 35: rank 0 of 4 of W1 took minutes).

        >>> r = RangeSet([(0, 10), (20, 30), (40, 50)]); r.remove_many([(45, 60), (5, 25)]); r.ranges
        [(0, 5), (25, 30), (40, 45)]
        """
        cut = merge([r for r in ranges if r[1] > r[0]])
        if cut and self.ranges:
            # what stays held is each held range less the cut: the cut's `missing_many` over the held ranges
            # (the cut is merged already, so it becomes a RangeSet's list as it is)
            released = RangeSet()
            released.ranges = cut
            self.ranges = released.missing_many(self.ranges)

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) not held yet, in order (what a fetch of that range must still get)."""
        return self.missing_many([(start, end)])

    def missing_many(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """`missing` for many sorted ranges in one sweep (O(n + m)).

        >>> RangeSet([(0, 10), (20, 30)]).missing_many([(5, 12), (15, 25), (28, 40)])
        [(10, 12), (15, 20), (30, 40)]
        """
        out, have, i = [], self.ranges, 0
        for start, end in ranges:
            pos = start
            while i < len(have) and have[i][1] <= pos:
                i += 1
            j = i
            while j < len(have) and have[j][0] < end:
                if have[j][0] > pos:
                    out.append((pos, have[j][0]))
                pos = max(pos, have[j][1])
                j += 1
            if pos < end:
                out.append((pos, end))
        return out

    def held_many(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The parts of the sorted `ranges` that are held (the complement of `missing_many` within them).

        >>> RangeSet([(0, 10), (20, 30)]).held_many([(5, 25)])
        [(5, 10), (20, 25)]
        """
        out, have, i = [], self.ranges, 0
        for start, end in ranges:
            while i < len(have) and have[i][1] <= start:
                i += 1
            j = i
            while j < len(have) and have[j][0] < end:
                out.append((max(start, have[j][0]), min(end, have[j][1])))
                j += 1
        return out

    def total(self) -> int:
        """How many bytes are held (the sum of the ranges' lengths)."""
        return sum(e - s for s, e in self.ranges)


def merge(ranges: list[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """Sort and merge ranges that overlap or lie at most `gap` bytes apart.

    >>> merge([(10, 20), (0, 5), (22, 30)], gap=2)
    [(0, 5), (10, 30)]
    """
    out: list[tuple[int, int]] = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1] + gap:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def plan_requests(pieces: list[tuple[int, int]], *, gap: int, multi_range: bool, part_size: int = 8 << 20,
                  part_gap: int = PART_FRAMING) -> list[list[tuple[int, int]]]:
    """Group byte ranges into requests: each inner list is one request's ranges (one range: a plain ranged GET;
    more: a multi-range GET).

    Ranges closer than what a separate fetch of the next one costs are merged first. Without `multi_range`
    that is a request: `gap` bytes (the cost model's break-even, latency x bandwidth, see `RemoteFile`).
    With it, small ranges share requests, and a range costs one part: `part_gap` bytes. Ranges longer
    than `part_size` are cut, so a big tensor streams over several connections at once. With `multi_range`,
    the remaining small ranges are packed into multi-range requests of at most `part_size` bytes and a Range
    header nginx accepts; without it, each is its own request.
    """
    if multi_range:
        pieces = merge(pieces, max(PART_FRAMING, part_gap))  # in a multi-range request a range costs a part
    requests: list[list[tuple[int, int]]] = []
    batch: list[tuple[int, int]] = []
    batch_bytes = batch_chars = 0
    for s, e in (pieces if multi_range else merge(pieces, gap)):
        if e - s >= part_size // 2 or not multi_range:
            requests += [[(p, min(p + part_size, e))] for p in range(s, e, part_size)]
            continue
        chars = len(str(s)) + len(str(e)) + 2
        if batch and (batch_bytes + e - s > part_size or batch_chars + chars > RANGE_HEADER_CHARS):
            requests.append(batch)
            batch, batch_bytes, batch_chars = [], 0, 0
        batch.append((s, e))
        batch_bytes += e - s
        batch_chars += chars
    if batch:
        requests.append(batch)
    return requests
