"""Fault in the memory of freshly allocated results early, in a background thread, while the network is slow.

A remote load allocates its results at once (`MemorySink.tasks`) and then writes them over seconds, as the bytes
arrive: each first write of a page faults, and the kernel zeroes the page then. On a host that takes freed
memory back (a VM with free page reporting: these development VMs hand it back about 2 s after a process frees
it), pages touched late cost 10-40x more than pages touched at once, and even elsewhere the zeroing runs on the
threads that receive. `prefault_in_background` asks the kernel to fault the results in from one thread
(`MADV_POPULATE_WRITE`: page tables made writable as if each page were written, the contents untouched), so the
receiving threads find them present. W1 over HTTP in a fresh process, 9 alternated pairs: 2.79 s and 3.76 s of
CPU without, 2.08 s and 2.66 s with (benchmarks/RESULTS.md, issue 35).

A hint: where the kernel (before Linux 5.14) or the platform has no `MADV_POPULATE_WRITE`, nothing happens.
Safe while other threads write the arrays: populating never changes a byte, and a page already present is
skipped. The thread holds the arrays until it is done, so none is freed under it.

Example:
    >>> import numpy as np
    >>> from lazyweights.run.prefault import prefault_in_background
    >>> a = np.empty(1 << 22, np.uint8); a[:4] = [1, 2, 3, 4]
    >>> t = prefault_in_background([a])
    >>> t is None or t.join() is None
    True
    >>> a[:4].tolist()
    [1, 2, 3, 4]
"""
from __future__ import annotations

import mmap
import sys
import threading
from typing import Iterable

import numpy as np

MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14 (Python's mmap module names it from 3.13 only)
PREFAULT_MIN_BYTES = 1 << 20  # smaller results are not worth a system call of their own
# Faulted in this much per call. A call holds the process's memory-map lock for reading, and a thread that
# maps memory (a new thread's stack, a large allocation) waits for it, with every page fault queued behind
# that writer: one call over W1's 131 MB lm_head made `Thread.start` of the first prefetcher take 15-20 ms,
# and 220-270 ms on a busy VM; in 4 MiB calls, the load's thread starts take about 10 ms in all
# (benchmarks/RESULTS.md, issue 35).
PREFAULT_STEP = 4 << 20
_unsupported = False  # set once the kernel refused the advice: not asked again in this process


def _madvise():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def _page_interior(array: np.ndarray) -> tuple[int, int] | None:
    """(address, length) of the whole pages inside `array`'s memory; None when it spans no whole page."""
    start = array.ctypes.data
    lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (start + array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    return (lo, hi - lo) if hi > lo else None


def prefault_in_background(arrays: Iterable[np.ndarray]) -> threading.Thread | None:
    """Start a daemon thread that faults in the pages of `arrays` (each at least `PREFAULT_MIN_BYTES`, owning
    its memory), in the order given; returns it, or None when there is nothing to do or no way to do it."""
    if _unsupported or not sys.platform.startswith("linux"):
        return None
    arrays = list(arrays)
    spans = []
    for a in arrays:
        if a.nbytes >= PREFAULT_MIN_BYTES and a.flags.owndata:
            span = _page_interior(a)
            if span is not None:
                spans.append(span)
    if not spans:
        return None
    keep = arrays  # held until the thread ends: no page is given back under it

    def run() -> None:
        global _unsupported
        import ctypes

        madvise = _madvise()
        try:
            for address, length in spans:
                for at in range(address, address + length, PREFAULT_STEP):
                    if madvise(at, min(PREFAULT_STEP, address + length - at), MADV_POPULATE_WRITE) != 0:
                        if ctypes.get_errno() == 22:  # EINVAL: a kernel without the advice; stop asking
                            _unsupported = True
                        return  # ENOMEM (no memory to fault in) and the like: the writers will fault as usual
        finally:
            keep.clear()

    thread = threading.Thread(target=run, name="lazyweights-prefault", daemon=True)
    thread.start()
    return thread
