"""Read local source files ahead of the blocks that copy them: `madvise(MADV_WILLNEED)` a window of bytes ahead.

A block's host thread reads its rows through the memory map. On a cold page cache each first touch of a page
faults, and the kernel reads a readahead window (128 KB by default) and the thread waits for the disk: a few
threads keep only a few small reads queued, so the disk is idle between them. Asking for the next steps' byte
ranges with WILLNEED before they are needed queues large reads, which the disk serves while the threads copy
what has already arrived. On a warm cache the hint finds the pages present and returns (a page-cache lookup per
page, paid on the host threads, not the thread that launches device work).

Only local memory-mapped records are hinted (`SourceFile.prefetch`); remote sources have their own prefetch
(`run/fetch.RemoteReads`). The hint is advisory: a platform without madvise, or a kernel that ignores it,
changes nothing but the speed.

Example:
    >>> import numpy as np, tempfile, os
    >>> from safetensors.numpy import save_file
    >>> import lazyweights as lw
    >>> from lazyweights.compiler.steps import compile_steps, outputs_of
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "m.safetensors")
    >>> save_file({"a": np.ones((64, 64), np.float32), "b": np.ones((64, 64), np.float32)}, p)
    >>> w = lw.load_weights(p)
    >>> steps = compile_steps(outputs_of(lw.plan({"a": w["a"].data(), "b": w["b"].data()})))
    >>> ra = LocalReadahead(steps, window=1)   # one byte: each step hinted when its own read begins
    >>> ra.ahead_of(0), ra.ahead_of(0), ra.ahead_of(1)
    (1, 0, 1)
    >>> LocalReadahead(steps, window=1 << 20).ahead_of(0)   # both steps lie within 1 MB
    2
"""
from __future__ import annotations

import os
import threading
from typing import Sequence

from .fetch import is_remote_record

__all__ = ["LocalReadahead", "DEFAULT_READAHEAD_BYTES", "readahead_bytes"]

# 256 MB: at a fast NVMe's 2-7 GB/s, 40-130 ms of reads queued ahead of the copies; small against the page cache.
DEFAULT_READAHEAD_BYTES = 256 << 20


def readahead_bytes(value: int | None = None) -> int:
    """The window: `value` if given, else `LAZYWEIGHTS_READAHEAD` (bytes; 0 turns the hint off), else 256 MB."""
    if value is not None:
        return max(0, int(value))
    env = os.environ.get("LAZYWEIGHTS_READAHEAD", "").strip()
    if env.isdigit():
        return int(env)
    return DEFAULT_READAHEAD_BYTES


class LocalReadahead:
    """Hints the kernel to read each step's local source ranges once the step is within `window` source bytes
    of the step being read. `ahead_of(k)` is called by the thread about to read step ordinal `k` (the order the
    executor runs them in); it is thread-safe, and each step is hinted once, by whichever thread gets there
    first. Returns how many steps that call hinted."""

    def __init__(self, steps: Sequence, window: int):
        self._steps = list(steps)
        self._window = int(window)
        ends, total = [], 0
        for s in self._steps:  # source bytes up to and including each step, in run order
            total += sum(r.nbytes for r in _local_records(s))
            ends.append(total)
        self._ends = ends
        self._next = 0  # the first step not hinted yet
        self._lock = threading.Lock()

    def ahead_of(self, index: int) -> int:
        """Hint every step not yet hinted that starts within the window after step `index` begins."""
        if self._window <= 0:
            return 0
        with self._lock:  # claim the steps; the madvise calls run outside the lock
            start = self._ends[index - 1] if index > 0 else 0
            first = self._next
            while self._next < len(self._steps) and (
                    self._next <= index or self._ends[self._next - 1] - start < self._window):
                self._next += 1
            claimed = self._steps[first:self._next]
        for step in claimed:
            for r in _local_records(step):
                r.file.prefetch(r.offset, r.nbytes)
        return len(claimed)


def _local_records(step) -> list:
    """The distinct local memory-mapped records a step reads."""
    seen: dict[int, object] = {}
    for r in step.sources:
        if id(r) not in seen and not is_remote_record(r) and hasattr(r.file, "prefetch"):
            seen[id(r)] = r
    return list(seen.values())
