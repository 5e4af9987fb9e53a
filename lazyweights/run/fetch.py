"""Before a step's blocks read a remote source, fetch exactly the byte ranges the step reads.

The executors read sources through views of their maps (`blocks.real_base`). A local map has every byte; a
remote object's mirror (`io/remote.RemoteFile`) has only what was fetched. So before the first block of a step
runs, `fetch_step_sources` walks the step's graph: each maximal chain of view ops over a remote source
(slices, reshapes, permutes: a tensor-parallel rank's slice) is replayed on the unfetched mirror, and the bytes
that numpy view covers are fetched, one run per contiguous stretch (a row-parallel slice is one run per row).
A source under anything else is fetched whole. What a step reads is therefore exactly what is fetched
(tests/io/test_remote_slices.py counts it at the server).
"""
from __future__ import annotations

import threading

import numpy as np

from ..graph.layout import view_of
from ..graph.node import Node
from ..graph.opcodes import GroupOp, Op
from ..io.source import SourceRecord, is_remote

_DONE = "remote sources fetched"
_LOCK = "remote sources lock"


def _unfetched_base(node: Node) -> np.ndarray:
    return node.arg.array(check=False, fetch=False) if node.op is Op.SOURCE else node.arg.array


def _is_remote(record: SourceRecord) -> bool:
    return is_remote(record.file)


def view_byte_ranges(v: np.ndarray, base: np.ndarray) -> list[tuple[int, int]]:
    """The byte ranges of `base` (a uint8 buffer) that the numpy view `v` of it covers, merged and sorted.

    >>> base = np.arange(64, dtype=np.uint8)
    >>> view_byte_ranges(base.view(np.uint16).reshape(4, 8)[:, 2:4], base)
    [(4, 8), (20, 24), (36, 40), (52, 56)]
    """
    if v.size == 0:
        return []
    start = v.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    dims = sorted(((n, st) for n, st in zip(v.shape, v.strides) if n != 1), key=lambda d: -abs(d[1]))
    lo = start + sum((n - 1) * st for n, st in dims if st < 0)  # a negative stride starts below the pointer
    dims = [(n, abs(st)) for n, st in dims]
    run = v.itemsize
    while dims and dims[-1][1] == run:  # innermost dims laid end to end are one contiguous run
        run *= dims[-1][0]
        dims.pop()
    offsets = np.zeros(1, np.int64)
    for n, st in dims:
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64) * st).ravel()
    offsets = np.unique(offsets) + lo
    out: list[tuple[int, int]] = []
    for o in offsets.tolist():
        if out and o <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], o + run))
        else:
            out.append((o, o + run))
    return out


def remote_ranges(node: Node) -> dict:
    """{remote file: [(start, end), ...]}: the bytes of remote sources `node`'s value reads."""
    out: dict = {}
    cache: dict = {}
    seen: set = set()

    def leaf(n: Node) -> Node:
        while n.op in GroupOp.View:
            n = n.srcs[0]
        return n

    def walk(n: Node) -> None:
        if n in seen:
            return
        seen.add(n)
        src = leaf(n)
        if src.op is Op.SOURCE:
            if not _is_remote(src.arg):
                return
            v = view_of(n, _unfetched_base, cache)
            if v is not None:
                base = src.arg.file.whole_view()
                out.setdefault(src.arg.file, []).extend(view_byte_ranges(v, base))
                return
            if n is src:
                out.setdefault(src.arg.file, []).append((src.arg.offset, src.arg.offset + src.arg.nbytes))
                return
        for s in n.srcs:
            walk(s)

    walk(node)
    return out


def fetch_step_sources(step, cache: dict | None) -> None:
    """Fetch the remote bytes `step` reads, once per step (the blocks of a step share `cache`)."""
    if not any(_is_remote(r) for r in step.sources):
        return
    if cache is None:
        cache = {}
    if cache.get(_DONE):
        return
    with cache.setdefault(_LOCK, threading.Lock()):  # setdefault is atomic: one lock per step
        if cache.get(_DONE):
            return
        for file, ranges in remote_ranges(step.node).items():
            file.ensure_ranges(sorted(ranges))
        cache[_DONE] = True


def prefetch_remote(steps) -> threading.Event | None:
    """Start fetching, in step order on one background thread, the remote bytes `steps` read, so the network
    stays busy while blocks compute; returns an event that stops it (None when no source is remote).

    The bytes land in the mirrors' sparse files, not in process memory. A block that gets to a step first
    fetches for itself, and waits for ranges the prefetcher has in flight instead of fetching them twice; a
    failure here is left for that block's own fetch to report."""
    remote = [s for s in steps if any(_is_remote(r) for r in s.sources)]
    if not remote:
        return None
    stop = threading.Event()

    def run() -> None:
        for step in remote:
            if stop.is_set():
                return
            try:
                for file, ranges in remote_ranges(step.node).items():
                    file.ensure_ranges(sorted(ranges))
            except BaseException:  # reported by the block that needs these bytes
                return

    threading.Thread(target=run, daemon=True, name="lazyweights-prefetch").start()
    return stop
