"""Sizes and machine facts: parsing "512MB", printing bytes, counting the CPUs this process may use.

One parser serves the library (`budget=`, `max_shard_size=`) and the command line, so "5GB" means the same
everywhere: decimal units are powers of 1000 and `i` units powers of 1024, as dask and Hugging Face count.

Example:
    >>> parse_size("512MB"), parse_size("1GiB"), parse_size(4096), parse_size(None)
    (512000000, 1073741824, 4096, None)
    >>> format_bytes(1536), format_bytes(3 * 2**30)
    ('1.5 KiB', '3 GiB')
"""
from __future__ import annotations

import contextlib
import gc
import os
import re

from .errors import UsageError


def parse_size(value) -> int | None:
    """Bytes from an int or a string like '512MB', '1GB', '5GiB', '256k'. None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise UsageError(f"invalid size {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise UsageError(f"size must be positive, got {value}")
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)(b?)\s*", str(value), re.IGNORECASE)
    if not m:
        raise UsageError(f"invalid size {value!r}; use bytes or e.g. '512MB', '1GB', '4GiB'")
    number, unit, binary, _ = m.groups()
    base = 1024 if binary or not unit else 1000
    power = " kmgt".index(unit.lower() or " ")
    size = int(float(number) * base ** power)
    if size <= 0:
        raise UsageError(f"size must be positive, got {value!r}")
    return size


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, 3 significant digits)."""
    n = int(n)
    if abs(n) < 1024:
        return f"{n} B"
    v = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        v /= 1024.0
        if abs(v) < 1024 or unit == "PiB":
            return f"{v:.3g} {unit}" if abs(v) < 1000 else f"{v:.0f} {unit}"
    return f"{n} B"  # pragma: no cover


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def paused_gc():
    """Pause Python's cycle collector for the block (as it was afterwards; nothing is collected late).

    For passes that build hundreds of thousands of acyclic objects (a 90,000-tensor checkpoint's records,
    a plan's steps): each generation-0 collection would walk them again, about a fifth of such a pass
    (benchmarks/bench_scale.py). Reference counting still frees everything as usual.

    Example:
        >>> import gc
        >>> with paused_gc():
        ...     gc.isenabled()
        False
        >>> gc.isenabled()
        True
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
