"""Receiving a remote range straight into its output while a shared `cache=` directory gets the same bytes.

Without a cache, `RemoteFile.receive` takes a tensor's bytes from the socket into their place in the output
and casts them there (or into a small warm buffer, and casts them from there into the output): each byte is
touched once, as a plain download would.
With `cache=DIR` the bytes must also reach the disk, written by the cache's writer thread off the critical
path. Before, they went through the object's memory map for that: received into 2.2 GB of fresh pages (W1),
which this kind of VM faults in slowly, kept there until written, then cast from there into the outputs. A
first cached run cost 1.15-1.45x an uncached one on loopback, ~0.8 s of it system time for those pages
(benchmarks/RESULTS.md, issue 35).

Now each claim chunk's share of the range is received into a buffer of a small pool (`WriteBuffers`: page
aligned, reused, so warm), cast into the output piece by piece as it arrives (still in the CPU's cache), and
the same buffer is handed to the writer, which writes it with direct I/O and gives it back to the pool. The
map is not touched. What cannot go that way goes through the map as before (`RemoteFile._receive_through_map`):
a unit (an element, or a whole row) cut by a claim chunk's edge, bytes the cache holds only in part, and any
piece for which the pool has no buffer free (a disk slower than the network: the bytes wait in the map, as
they did, rather than the load waiting for the disk).

The claims are the cache's (`io/host_cache.py`): a chunk another process is fetching is waited for and then
copied from the cache, so the processes of one host still fetch each byte once.

Example (the pool):
    >>> pool = WriteBuffers(limit=1)
    >>> a = pool.take(); len(a) >= CHUNK_BUFFER_BYTES, pool.take() is None  # the one buffer is out
    (True, True)
    >>> pool.give(a); pool.take() is a
    True
"""
from __future__ import annotations

import mmap
import threading
import time

import numpy as np

from .host_cache import CLAIM_CHUNK, DIRECT_ALIGN, LOG_WAIT_FIRST, LOG_WAIT_MAX
from .transport import BOUNCE_BYTES, Converting

# A buffer holds one claim chunk's share of a range, placed at the offset's position within a page (so the
# writer's direct writes see page-aligned memory for page-aligned file offsets).
CHUNK_BUFFER_BYTES = CLAIM_CHUNK + DIRECT_ALIGN
# Buffers out at once, in all: those receiving (a receiving thread uses one at a time) and those queued for
# the writer. 24 x 8 MiB: the prefetchers and workers of a run receive at most ~8 ranges at once, and a
# direct write of 8 MiB takes ~10 ms, so the writer's queue stays short unless the disk is slower than the
# network (then pieces go through the map, as before).
POOL_BUFFERS = 24


class WriteBuffers:
    """A bounded pool of page-aligned, reusable buffers of `CHUNK_BUFFER_BYTES`: allocated when first needed,
    kept warm for the next piece, dropped by `trim` once none is out."""

    def __init__(self, limit: int = POOL_BUFFERS):
        self.limit = limit
        self._free: list[memoryview] = []
        self._out = 0
        self._lock = threading.Lock()

    def take(self) -> memoryview | None:
        """A free buffer, or a new one while fewer than `limit` exist; None when all are out (never waits)."""
        with self._lock:
            if self._free:
                self._out += 1
                return self._free.pop()
            if self._out + len(self._free) >= self.limit:
                return None
            self._out += 1
        try:
            return _new_buffer()
        except BaseException:
            with self._lock:
                self._out -= 1
            raise

    def give(self, buf: memoryview) -> None:
        """Return a buffer `take` gave out."""
        with self._lock:
            self._out -= 1
            self._free.append(buf)

    def trim(self) -> None:
        """Drop the free buffers if none is out (a load has ended): their memory goes back to the system."""
        with self._lock:
            if not self._out:
                self._free.clear()


def _new_buffer() -> memoryview:
    """A page-aligned buffer of CHUNK_BUFFER_BYTES, backed by huge pages where the kernel gives them: fresh
    memory is faulted in a page at a time, and this VM's faults are slow (one per 2 MiB, not per 4 KiB)."""
    # private (a shared anonymous map gets no huge pages), page aligned, with room to align to 2 MiB
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    m = mmap.mmap(-1, CHUNK_BUFFER_BYTES + HUGE_PAGE, **({"flags": private} if private else {}))
    base = np.frombuffer(m, np.uint8).ctypes.data
    skip = -base % HUGE_PAGE
    if _MADV_HUGEPAGE is not None:
        try:
            m.madvise(_MADV_HUGEPAGE, skip, len(m) - skip)
        except OSError:  # a hint (THP compiled out): 4 KiB pages
            pass
    return memoryview(m)[skip:skip + CHUNK_BUFFER_BYTES]


HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
WRITE_BUFFERS = WriteBuffers()


def chunk_pieces(start: int, ranges: list[tuple[int, int]], unit: int
                 ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """Split `ranges` (inside a receive that starts at byte `start`, each range starting on a unit from it) at
    the cache's claim chunks: ([(first byte, end, chunk)], the rest). A piece lies in one chunk and holds whole
    units; the rest are the units a chunk's edge cuts (they go through the map).

    >>> C = CLAIM_CHUNK
    >>> chunk_pieces(0, [(0, 2 * C)], unit=2)
    ([(0, 8388608, 0), (8388608, 16777216, 1)], [])
    >>> chunk_pieces(1, [(1, C + 9)], unit=4)  # the unit [C - 3, C + 1) is cut by the chunk's edge
    ([(1, 8388605, 0), (8388609, 8388617, 1)], [(8388605, 8388609)])
    """
    pieces: list[tuple[int, int, int]] = []
    rest: list[tuple[int, int]] = []
    for s, e in ranges:
        pos = s
        while pos < e:
            chunk = pos // CLAIM_CHUNK
            edge = min(e, (chunk + 1) * CLAIM_CHUNK)
            whole = edge if edge == e else start + (edge - start) // unit * unit  # the last whole unit's end
            if whole > pos:
                pieces.append((pos, whole, chunk))
            if whole < edge:  # a unit cut by the edge: from `whole` to its end in the next chunk
                cut_end = min(e, whole + unit)
                rest.append((whole, cut_end))
                edge = cut_end
            pos = edge
    return pieces, rest


def receive_shared(file, start: int, ranges: list[tuple[int, int]], convert, unit: int) -> list[tuple[int, int]]:
    """Receive `ranges` of `file` (a `RemoteFile` with a shared cache; bytes from `start` on, see
    `RemoteFile.receive`) through the pool: each piece from the cache when the cache holds it, else fetched
    under its chunk's claim, cast by `convert` as it arrives and handed to the cache's writer. Returns what
    is left for the map path (see the module's docstring)."""
    host = file._host
    todo, rest = chunk_pieces(start, ranges, unit)
    delay = LOG_WAIT_FIRST
    while todo:
        host.refresh()
        waiting = []
        for piece in todo:
            state = _one_piece(file, host, start, piece, convert, unit)
            if state == "claimed elsewhere":
                waiting.append(piece)
            elif state == "through the map":
                rest.append(piece[:2])
            else:
                delay = LOG_WAIT_FIRST
        todo = waiting
        if todo:  # another process is fetching these chunks: wait for its log lines or its claims to go
            time.sleep(delay)
            delay = min(delay * 2, LOG_WAIT_MAX)
    return sorted(rest)


def _one_piece(file, host, start: int, piece: tuple[int, int, int], convert, unit: int) -> str:
    """Bring one piece into the output: from the cache, or from the network under its chunk's claim.
    Returns "done", "claimed elsewhere" (try again later) or "through the map"."""
    s, e, chunk = piece
    held = host.held.held_many([(s, e)])
    if held == [(s, e)]:
        _from_cache(file, host, start, s, e, convert, unit)
        return "done"
    if held:  # partly in the cache (another process's other ranges): the map path sorts out which bytes
        return "through the map"
    if not host.claim(chunk):
        return "claimed elsewhere"
    # Another process may have written and released the chunk between our look and our claim: look again.
    host.refresh()
    held = host.held.held_many([(s, e)])
    if held:
        host.unclaim([chunk])
        return _one_piece(file, host, start, piece, convert, unit)
    buf = WRITE_BUFFERS.take()
    if buf is None:  # the writer is behind (a disk slower than the network): through the map, as before
        host.unclaim([chunk])
        return "through the map"
    at = s % DIRECT_ALIGN
    into = buf[at:at + (e - s)]
    try:
        file._request([(s, e)], lambda a, b: Converting(lambda p, o: convert(p, s - start + o), e - s, unit, into))
    except BaseException:
        host.unclaim([chunk])
        WRITE_BUFFERS.give(buf)
        raise
    # written, logged, its claim released and the buffer given back, all on the writer thread
    host.publish(buf, [(s, e)], [chunk], origin=s - at, done=lambda: WRITE_BUFFERS.give(buf))
    return "done"


def _from_cache(file, host, start: int, s: int, e: int, convert, unit: int) -> None:
    """Copy bytes [s, e), which the cache holds, into `convert`: a 1 MiB piece at a time (whole units) through a
    pool buffer (a plain one when the pool is out)."""
    buf = WRITE_BUFFERS.take()
    scratch = buf if buf is not None else memoryview(bytearray(min(e - s, BOUNCE_BYTES)))
    step = max(unit, BOUNCE_BYTES // unit * unit)  # whole units, and never more than the scratch holds
    try:
        for a in range(s, e, step):  # a piece at a time, cast while it is in the CPU's cache
            b = min(e, a + step)
            host.read_into(scratch[:b - a], a, b)
            convert(scratch[:b - a], a - start)
    finally:
        if buf is not None:
            WRITE_BUFFERS.give(buf)
    with file._lock:
        file.bytes_from_cache += e - s
