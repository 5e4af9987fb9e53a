"""numpy's OpenBLAS held to one thread while a block's small matrix products run (`single_threaded_blas`).

Why: the `lora` op multiplies blocks of [rows, r] by [r, cols] with r around 8-64. OpenBLAS splits any product
above about 2**18 multiply-adds over all its threads, and on the 2-core VM, with the executor's own threads
busy, a 512-row block took 19 ms with OpenBLAS's threads and 2.6 ms with one (`benchmarks/bench_lora.py`):
waking and joining threads costs more than the product. The executor's threads are the parallelism.

The setting is process-wide (OpenBLAS has no per-call control): the first block to enter sets one thread, the
last to leave restores the previous count. Where numpy's BLAS is not OpenBLAS (or its library cannot be found
in /proc/self/maps), this does nothing.

Example:
    >>> import numpy as np
    >>> with single_threaded_blas():
    ...     np.ones((4, 2), np.float32) @ np.ones((2, 3), np.float32)
    array([[2., 2., 2.],
           [2., 2., 2.],
           [2., 2., 2.],
           [2., 2., 2.]], dtype=float32)
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from typing import Any, Iterator

# (set, get) pairs, as numpy's wheels (scipy-openblas, 64-bit ints) and plain OpenBLAS builds name them.
_NAMES = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
          ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
          ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
          ("openblas_set_num_threads", "openblas_get_num_threads"))

_lock = threading.Lock()
_users = 0
_saved = 0


@functools.lru_cache(maxsize=1)
def _openblas() -> tuple[Any, Any] | None:
    import numpy  # noqa: F401  (its BLAS is what must be loaded)

    paths: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                if "openblas" in line.lower() and "/" in line:
                    paths.add(line[line.index("/"):].strip())
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _NAMES:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                return getattr(lib, set_name), getattr(lib, get_name)
    return None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """OpenBLAS on one thread inside the block (nested and concurrent uses are counted)."""
    global _users, _saved
    fns = _openblas()
    if fns is None:
        yield
        return
    set_threads, get_threads = fns
    with _lock:
        if _users == 0:
            _saved = int(get_threads())
            set_threads(1)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                set_threads(_saved)
