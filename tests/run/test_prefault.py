"""`prefault_in_background`: the pages of fresh results are faulted in by another thread, and never a byte of
them changes, even while other threads write them."""
import ctypes
import mmap
import sys
import threading

import numpy as np
import pytest

from lazyweights.run import prefault
from lazyweights.run.prefault import PREFAULT_MIN_BYTES, prefault_in_background

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE and mincore")


def resident_pages(a: np.ndarray) -> tuple[int, int]:
    """(pages of `a`'s whole-page interior the kernel holds, pages in it), by mincore."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    lo = -(-a.ctypes.data // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (a.ctypes.data + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    vec = np.zeros((hi - lo) // mmap.PAGESIZE, np.uint8)
    assert libc.mincore(lo, hi - lo, vec.ctypes.data) == 0, ctypes.get_errno()
    return int((vec & 1).sum()), len(vec)


def give_back(a: np.ndarray) -> None:
    """Drop the pages of `a`'s whole-page interior (MADV_DONTNEED): untouched again, whatever memory np.empty
    reused (in a long test run it may hand out pages an earlier test touched)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    lo = -(-a.ctypes.data // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (a.ctypes.data + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    assert libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0, ctypes.get_errno()


@linux
def test_fresh_arrays_are_faulted_in():
    arrays = [np.empty(n, np.uint8) for n in (8 << 20, 3 << 20)]
    for a in arrays:
        give_back(a)
    assert all(resident_pages(a)[0] == 0 for a in arrays)  # not touched
    thread = prefault_in_background(arrays)
    if thread is None:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
    thread.join(30)
    for a in arrays:
        have, pages = resident_pages(a)
        assert have == pages, (have, pages)


@linux
def test_bytes_written_before_and_during_stay_as_written():
    rng = np.random.default_rng(7)
    want = rng.integers(0, 256, 32 << 20, dtype=np.uint8)
    got = np.empty_like(want)
    got[:1 << 20] = want[:1 << 20]  # before the prefault starts
    start = threading.Event()

    def writer():  # writes the rest while the prefault runs, back to front
        start.wait()
        for hi in range(len(want), 1 << 20, -(1 << 20)):
            got[hi - (1 << 20):hi] = want[hi - (1 << 20):hi]

    w = threading.Thread(target=writer)
    w.start()
    thread = prefault_in_background([got])
    start.set()
    w.join(30)
    if thread is not None:
        thread.join(30)
    assert np.array_equal(got, want)


def test_nothing_to_do_for_small_arrays_and_views():
    small = np.empty(PREFAULT_MIN_BYTES - 1, np.uint8)
    view = np.empty(4 * PREFAULT_MIN_BYTES, np.uint8)[PREFAULT_MIN_BYTES:]
    assert prefault_in_background([small, view]) is None
    assert prefault_in_background([]) is None


@linux
def test_a_kernel_that_refuses_the_advice_is_not_asked_again(monkeypatch):
    calls = []

    def refusing():
        def madvise(address, length, advice):
            calls.append(advice)
            ctypes.set_errno(22)
            return -1
        return madvise

    monkeypatch.setattr(prefault, "_madvise", refusing)
    monkeypatch.setattr(prefault, "_unsupported", False)
    a = np.zeros(4 << 20, np.uint8)  # (zeros may be lazily mapped: the refusal is what is tested)
    b = np.empty(4 << 20, np.uint8)
    prefault_in_background([a, b]).join(30)
    assert calls == [prefault.MADV_POPULATE_WRITE]  # the first refusal stops the thread
    assert prefault_in_background([b]) is None and calls == [prefault.MADV_POPULATE_WRITE]
