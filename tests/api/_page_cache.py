"""Page-cache probes for tests that check which bytes of a file were read: `resident_pages` (mincore) and
`drop_from_cache` (fadvise). Imported by name by the tests beside it (see tests/conftest.py)."""
import ctypes
import mmap
import os

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_pages(path) -> np.ndarray:
    """One uint8 per page of `path`: 1 where the page is in the page cache (mincore), without touching any."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    libc.mincore.restype = ctypes.c_int
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        addr = np.frombuffer(mm, dtype=np.uint8).ctypes.data  # no page is touched
        vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
        if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return np.frombuffer(vec, dtype=np.uint8) & 1
    finally:
        mm.close()


def resident_fraction(path, start: int, stop: int) -> float:
    """The share of the pages holding bytes [start, stop) of `path` that are in the page cache."""
    return float(resident_pages(path)[start // PAGE:(stop + PAGE - 1) // PAGE].mean())


def drop_from_cache(path) -> None:
    """Write back and evict `path`'s pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
