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
import itertools
import threading
import time

import numpy as np

# nginx refuses request headers over 8 KB (large_client_header_buffers); ~22 characters a range
RANGE_HEADER_CHARS = 6000
# A part of a multi-range reply carries about 100 bytes of framing (boundary, Content-Type, Content-Range):
# a gap shorter than that costs fewer bytes fetched through than as a part boundary, and saves a part. It is
# the smallest `part_gap` (`RemoteFile`'s cost model: what one more part costs, in bytes).
PART_FRAMING = 128
# A multi-range reply is received whole into the receiving thread's buffer, then its parts are copied into
# place (io/transport.py): its bytes are kept small, so that buffer stays small and warm and several such
# requests are in flight at once. A range worth a request of its own (`gap` bytes: a request's latency at the
# bandwidth) is fetched alone, straight into place. Before, hulls of 8-23 MB shared 128 MB multi-range
# requests: one connection each, every byte copied twice (W1 rank 0 of 4: 4 such requests, 2.9 s of wall).
MULTI_RANGE_BYTES = 8 << 20
# From this many ranges (asked plus held) on, the sweeps run in numpy: a rank's row-parallel slices are a
# range per row (W1 rank 0 of 4: 90,112), and the Python sweeps cost ~1 us a range under the file's lock,
# 1.1 s of a 3.4 s rank load (benchmarks/RESULTS.md, issue 35)
NUMPY_FROM = 256
_FAR = 1 << 62  # past any object's last byte


def _array(ranges) -> np.ndarray:
    """(n, 2) int64 starts and ends of a list of (start, end) pairs."""
    return np.fromiter(itertools.chain.from_iterable(ranges), np.int64, 2 * len(ranges)).reshape(-1, 2)


def _pairs(a: np.ndarray) -> list[tuple[int, int]]:
    """The list of (start, end) pairs of an (n, 2) array."""
    return list(zip(a[:, 0].tolist(), a[:, 1].tolist()))


def _intersect(asked: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The non-empty pieces of each `asked` range (in order) inside the disjoint sorted intervals
    [starts[i], ends[i]), each range's pieces in order: the sweeps below, vectorized."""
    lo = np.searchsorted(ends, asked[:, 0], side="right")  # the first interval ending after the range starts
    hi = np.searchsorted(starts, asked[:, 1], side="left")  # ... up to the last starting before it ends
    count = np.maximum(hi - lo, 0)
    which = np.repeat(np.arange(len(asked)), count)
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    interval = lo[which] + within
    out = np.stack([np.maximum(asked[which, 0], starts[interval]), np.minimum(asked[which, 1], ends[interval])], 1)
    return out[out[:, 1] > out[:, 0]]


def _gaps_between(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The starts and ends of the intervals between the disjoint sorted ranges of `a` ((n, 2), n >= 0), the
    one before the first and the one after the last included: what `a` does not cover."""
    return np.concatenate([[-_FAR], a[:, 1]]), np.concatenate([a[:, 0], [_FAR]])


def _merged(a: np.ndarray, gap: int = 0) -> np.ndarray:
    """`merge` of an (n, 2) array (n > 0), as an array."""
    a = a[np.lexsort((a[:, 1], a[:, 0]))]
    reach = np.maximum.accumulate(a[:, 1])  # the end of the merged range so far
    first = np.flatnonzero(np.concatenate([[True], a[1:, 0] > reach[:-1] + gap]))
    last = np.concatenate([first[1:] - 1, [len(a) - 1]])
    return np.stack([a[first, 0], reach[last]], 1)


class RangeSet:
    """Disjoint, sorted, merged half-open byte ranges.

    Kept as a list of pairs (`ranges`) and, once a sweep over many has run, as an (n, 2) array too: a rank
    holds thousands of row runs, and converting them for every sweep cost more than the sweep.

    >>> r = RangeSet(); r.add(0, 10); r.add(20, 30); r.add(10, 15)
    >>> r.ranges, r.missing(5, 25)
    ([(0, 15), (20, 30)], [(15, 20)])
    >>> r.remove(2, 22); r.ranges
    [(0, 2), (22, 30)]
    """

    def __init__(self, ranges=()):
        self._list: list[tuple[int, int]] | None = []
        self._arr: np.ndarray | None = None
        for s, e in ranges:
            self.add(s, e)

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The ranges as a sorted list of (start, end) pairs (do not modify it)."""
        if self._list is None:
            assert self._arr is not None
            self._list = _pairs(self._arr)
        return self._list

    @ranges.setter
    def ranges(self, value: list[tuple[int, int]]) -> None:
        self._list, self._arr = value, None

    def _count(self) -> int:
        return len(self._list) if self._list is not None else len(self._arr)  # type: ignore[arg-type]

    def _covers(self, start: int, end: int) -> bool:
        """Whether one held range contains all of [start, end) (a binary search, no conversion)."""
        if self._list is not None:
            i = bisect.bisect_right(self._list, (start, _FAR)) - 1
            return i >= 0 and self._list[i][1] >= end
        a = self._arr
        assert a is not None
        i = int(np.searchsorted(a[:, 0], start, side="right")) - 1
        return i >= 0 and int(a[i, 1]) >= end

    def _touches(self, start: int, end: int) -> bool:
        """Whether any held range overlaps [start, end) (a binary search, no conversion)."""
        if self._list is not None:
            i = bisect.bisect_left(self._list, (end, end))  # the ranges before i start before `end`
            # sorted and disjoint: of the ranges starting before `end`, only the last can reach past `start`
            return i > 0 and self._list[i - 1][1] > start
        a = self._arr
        assert a is not None
        i = int(np.searchsorted(a[:, 0], end, side="left"))
        return i > 0 and int(a[i - 1, 1]) > start

    def __len__(self) -> int:
        """How many disjoint ranges are held, in whichever form they are (a rank's slice holds thousands of
        row runs: turning the array into a list of pairs just to test for emptiness cost more than the sweeps).

        >>> r = RangeSet([(0, 4), (8, 9)]); len(r), bool(RangeSet())
        (2, False)
        """
        return self._count()

    def first(self) -> tuple[int, int] | None:
        """The lowest range, or None when nothing is held (without converting the other ranges).

        >>> r = RangeSet(); r.add_many([(30, 40), (5, 10)]); r.first(), RangeSet().first()
        ((5, 10), None)
        """
        if self._list is not None:
            return self._list[0] if self._list else None
        a = self._arr
        assert a is not None
        return (int(a[0, 0]), int(a[0, 1])) if len(a) else None

    def _array(self) -> np.ndarray:
        if self._arr is None:
            self._arr = _array(self.ranges)
        return self._arr

    def _set_array(self, a: np.ndarray) -> None:
        self._arr, self._list = a, None

    def add(self, start: int, end: int) -> None:
        """Mark [start, end) held, merging it with the ranges it touches or overlaps; an empty range is ignored."""
        if end <= start:
            return
        ranges = self.ranges
        self._arr = None
        i = bisect.bisect_left(ranges, (start, start))
        if i and ranges[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(ranges) and ranges[j][0] <= end:
            start, end = min(start, ranges[j][0]), max(end, ranges[j][1])
            j += 1
        ranges[i:j] = [(start, end)]

    def add_many(self, ranges: list[tuple[int, int]]) -> None:
        """Add many ranges in one merge (O(n + m)); `add` one by one would be O(n) each.

        >>> r = RangeSet([(0, 4)]); r.add_many([(10, 12), (2, 6), (12, 14)]); r.ranges
        [(0, 6), (10, 14)]
        """
        if len(ranges) + self._count() >= NUMPY_FROM and ranges:
            new = _array(ranges)
            new = new[new[:, 1] > new[:, 0]]
            if len(new):
                self._set_array(_merged(np.concatenate([self._array(), new]) if self._count() else new))
            return
        self.ranges = merge(self.ranges + [r for r in ranges if r[1] > r[0]])

    def remove(self, start: int, end: int) -> None:
        """Mark [start, end) no longer held (its bytes were released): only the ranges it touches are looked at."""
        if end <= start:
            return
        ranges = self.ranges
        self._arr = None
        i = max(0, bisect.bisect_left(ranges, (start, start)) - 1)
        j, keep = i, []
        while j < len(ranges) and ranges[j][0] < end:
            s, e = ranges[j]
            if e <= start:
                keep.append((s, e))
            else:
                if s < start:
                    keep.append((s, start))
                if e > end:
                    keep.append((end, e))
            j += 1
        ranges[i:j] = keep

    def remove_many(self, ranges: list[tuple[int, int]]) -> None:
        """`remove` for many ranges in one sweep (O(n + m)): a rank's release of thousands of row runs, with
        as many held, was quadratic one `remove` at a time (issue 35: rank 0 of 4 of W1 took minutes).

        >>> r = RangeSet([(0, 10), (20, 30), (40, 50)]); r.remove_many([(45, 60), (5, 25)]); r.ranges
        [(0, 5), (25, 30), (40, 45)]
        """
        if not self._count():
            return
        if len(ranges) + self._count() >= NUMPY_FROM and ranges:
            cut = _array(ranges)
            cut = cut[cut[:, 1] > cut[:, 0]]
            if len(cut):  # what stays held: the held ranges' pieces in the gaps of the (merged) cut
                cut = _merged(cut)
                held = self._array()
                # only the held ranges the cut's span touches are cut (a release is one record's runs, the
                # held set every run in flight); those before and after are kept as they are
                lo = int(np.searchsorted(held[:, 1], cut[0, 0], side="right"))
                hi = int(np.searchsorted(held[:, 0], cut[-1, 1], side="left"))
                self._set_array(np.concatenate([held[:lo], _intersect(held[lo:hi], *_gaps_between(cut)),
                                                held[hi:]]))
            return
        cut_list = merge([r for r in ranges if r[1] > r[0]])
        if cut_list:
            # what stays held is each held range less the cut: the cut's `missing_many` over the held ranges
            # (the cut is merged already, so it becomes a RangeSet's list as it is)
            released = RangeSet()
            released.ranges = cut_list
            self.ranges = released.missing_many(self.ranges)

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) not held yet, in order (what a fetch of that range must still get)."""
        return self.missing_many([(start, end)])

    def missing_many(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """`missing` for many sorted ranges in one sweep (O(n + m)).

        >>> RangeSet([(0, 10), (20, 30)]).missing_many([(5, 12), (15, 25), (28, 40)])
        [(10, 12), (15, 20), (30, 40)]
        """
        if ranges and self._covers(ranges[0][0], ranges[-1][1]):
            return []  # the common look before a fetch: a rank's thousands of runs, all held in one span
        if ranges and not self._touches(ranges[0][0], ranges[-1][1]):
            return [r for r in ranges if r[1] > r[0]]  # the first look: none of it held yet
        if len(ranges) + self._count() >= NUMPY_FROM and ranges:
            held = self._array() if self._count() else np.zeros((0, 2), np.int64)
            # what is missing is what lies in the gaps between held ranges (and before and after them)
            return _pairs(_intersect(_array(ranges), *_gaps_between(held)))
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
        if ranges and self._covers(ranges[0][0], ranges[-1][1]):
            return [r for r in ranges if r[1] > r[0]]
        if len(ranges) + self._count() >= NUMPY_FROM and ranges and self._count():
            held = self._array()
            return _pairs(_intersect(_array(ranges), held[:, 0], held[:, 1]))
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
        if self._list is None:
            return int((self._arr[:, 1] - self._arr[:, 0]).sum())  # type: ignore[index]
        return sum(e - s for s, e in self._list)


def page_runs(ranges: list[tuple[int, int]], page: int, gap: int = 0) -> list[tuple[int, int]]:
    """The `page`-aligned runs that cover `ranges` (non-empty), merged where at most `gap` bytes apart: in numpy,
    without a list of pairs between the steps (a rank releases thousands of row runs at once).

    >>> page_runs([(5000, 5001), (1, 10), (9000, 9100)], 4096)
    [(0, 12288)]
    >>> page_runs([(1, 10), (20000, 20001)], 4096), page_runs([(1, 10), (20000, 20001)], 4096, gap=16384)
    ([(0, 4096), (16384, 20480)], [(0, 20480)])
    """
    a = _array(ranges)
    a = np.stack([a[:, 0] // page * page, -(-a[:, 1] // page) * page], 1)
    return _pairs(_merged(a, gap))


def merge(ranges: list[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """Sort and merge ranges that overlap or lie at most `gap` bytes apart.

    >>> merge([(10, 20), (0, 5), (22, 30)], gap=2)
    [(0, 5), (10, 30)]
    """
    if len(ranges) >= NUMPY_FROM and ranges:
        return _pairs(_merged(_array(ranges), gap))
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
    the remaining small ranges (shorter than `gap`) are packed into multi-range requests of at most
    `MULTI_RANGE_BYTES` and a Range header nginx accepts; without it, each is its own request.

    >>> plan_requests([(0, 100), (500, 600), (1000, 3000)], gap=1000, multi_range=True, part_gap=0)
    [[(1000, 3000)], [(0, 100), (500, 600)]]
    """
    if multi_range:
        pieces = merge(pieces, max(PART_FRAMING, part_gap))  # in a multi-range request a range costs a part
    requests: list[list[tuple[int, int]]] = []
    batch: list[tuple[int, int]] = []
    batch_bytes = batch_chars = 0
    alone = max(PART_FRAMING, min(gap, part_size // 2))  # a range this long pays for its own request
    batch_limit = min(part_size, MULTI_RANGE_BYTES)
    for s, e in (pieces if multi_range else merge(pieces, gap)):
        if e - s >= alone or not multi_range:
            requests += [[(p, min(p + part_size, e))] for p in range(s, e, part_size)]
            continue
        chars = len(str(s)) + len(str(e)) + 2
        if batch and (batch_bytes + e - s > batch_limit or batch_chars + chars > RANGE_HEADER_CHARS):
            requests.append(batch)
            batch, batch_bytes, batch_chars = [], 0, 0
        batch.append((s, e))
        batch_bytes += e - s
        batch_chars += chars
    if batch:
        requests.append(batch)
    return requests


class LinkMeter:
    """The bandwidth one host's fetches observe in this process: bytes received over the time at least one
    request to it was in flight (a request's latency is counted with its bytes: what a gap fetched through
    costs in practice). `RemoteFile` prices gaps and multi-range parts with it under
    `storage_options={"bandwidth": "auto"}`: on a network slower than the CPU, a rank then fetches exactly
    its row runs once the link was measured. Not the default: where the client is CPU-bound (loopback,
    2 cores shared with the server) what it observes is the CPU's pace, not the link's, and parts cost CPU
    too (benchmarks/RESULTS.md, issue 35).

    >>> m = LinkMeter(); m.start(); m.done(2 << 20); m.bandwidth() is None  # too little seen to trust
    True
    """

    MIN_BYTES = 16 << 20  # seen before the estimate is used
    _meters: dict[str, LinkMeter] = {}
    _meters_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight = 0
        self._since = 0.0
        self.busy = 0.0  # seconds with a request in flight, up to the last time none was
        self.bytes = 0

    @classmethod
    def of(cls, url: str) -> LinkMeter:
        """The meter of `url`'s host (scheme, host and port), shared by every object on it."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        key = f"{parts.scheme}://{parts.netloc}".lower()
        with cls._meters_lock:
            meter = cls._meters.get(key)
            if meter is None:
                meter = cls._meters[key] = cls()
            return meter

    def start(self) -> None:
        """A request to the host begins."""
        with self._lock:
            if not self._inflight:
                self._since = time.perf_counter()
            self._inflight += 1

    def done(self, nbytes: int) -> None:
        """A request ends, having received `nbytes` (0 for a failed one)."""
        with self._lock:
            self._inflight -= 1
            self.bytes += nbytes
            if not self._inflight:
                self.busy += time.perf_counter() - self._since

    def bandwidth(self) -> float | None:
        """Bytes per second observed, or None until `MIN_BYTES` were received."""
        with self._lock:
            busy = self.busy + (time.perf_counter() - self._since if self._inflight else 0.0)
            return self.bytes / busy if self.bytes >= self.MIN_BYTES and busy > 0 else None
