"""The `cache=` writer's direct I/O (`io/host_cache.py`): the page-aligned body of each published range goes
around the page cache (`O_DIRECT`), its partial end pages through it. Whatever path each byte takes, the
cache's file holds exactly the published bytes, another process's view of the cache reads them back, and a
device or filesystem that refuses direct I/O gets buffered writes instead of an error."""
from __future__ import annotations

import errno
import mmap
import os
import time

import numpy as np
import pytest

from lazyweights.io import host_cache
from lazyweights.io.host_cache import HostCache

SIZE = 7 << 20
RANGES = [(100, 3_000_001), (3_100_000, 6_000_000), (6_500_000, 6_500_900)]  # unaligned ends; the last small


@pytest.fixture
def mirror():
    """The object's bytes at their offsets in a page-aligned anonymous map, as RemoteFile holds them."""
    m = mmap.mmap(-1, SIZE)
    m[:] = np.random.default_rng(35).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    return memoryview(m)


def _publish(cache: HostCache, mirror, ranges=RANGES) -> None:
    cache.publish(mirror, ranges, [])
    assert cache.flush(timeout=30)
    assert cache.error is None


def _check_file(cache: HostCache, mirror, ranges=RANGES) -> None:
    data = open(cache.stem + ".data", "rb").read()
    for s, e in ranges:
        assert data[s:e] == bytes(mirror[s:e]), (s, e)
    other = HostCache(cache.directory, cache.url, cache.size, '"e"')  # as another process would see it
    assert other.held.ranges == sorted(ranges)
    for s, e in ranges:
        out = bytearray(e - s)
        other.read_into(memoryview(out), s, e)
        assert out == bytes(mirror[s:e]), (s, e)


def _spy_writes(monkeypatch):
    """(fd, offset, length) of every pwrite, made on any thread."""
    calls, real = [], os.pwrite

    def spy(fd, data, offset):
        calls.append((fd, offset, len(data)))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", spy)
    return calls


def test_aligned_bodies_are_written_direct_and_the_ends_through_the_page_cache(tmp_path, mirror, monkeypatch):
    calls = _spy_writes(monkeypatch)
    cache = HostCache(str(tmp_path), "http://x/m", SIZE, '"e"')
    _publish(cache, mirror)
    _check_file(cache, mirror)
    if not cache._direct_ok:
        pytest.skip(f"{tmp_path}'s filesystem has no direct I/O: every byte went through the page cache")
    direct = {fd for fd, _, _ in calls} - {cache._data}
    assert len(direct) == 1, "one direct descriptor, beside the buffered one"
    by_fd = {fd: [(o, n) for f, o, n in calls if f == fd] for fd in (*direct, cache._data)}
    bodies = by_fd[direct.pop()]
    assert bodies and all(o % 4096 == 0 and n % 4096 == 0 for o, n in bodies)
    assert sum(n for _, n in bodies) == (2_998_272 - 4096) + (5_996_544 - 3_100_672)  # the page-aligned bodies
    assert sorted(by_fd[cache._data]) == [(100, 3996), (2_998_272, 1729), (3_100_000, 672),
                                          (5_996_544, 3456), (6_500_000, 900)]
    deadline = time.monotonic() + 10 * host_cache.WRITER_LINGER + 5  # the writer stops when idle ...
    while cache._writer is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cache._writer is None and cache._direct is None  # ... and closes its direct descriptor


def test_a_refused_direct_write_falls_back_to_the_page_cache_for_good(tmp_path, mirror, monkeypatch):
    cache = HostCache(str(tmp_path), "http://x/m", SIZE, '"e"')
    if not cache._direct_ok:
        pytest.skip(f"{tmp_path}'s filesystem has no direct I/O")
    real, refused = os.pwrite, []

    def refuse(fd, data, offset):
        if fd != cache._data:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refuse)
    _publish(cache, mirror)
    assert refused == [4096] and not cache._direct_ok and cache._direct is None  # tried once, then never again
    _check_file(cache, mirror)


@pytest.mark.parametrize("why", ["no O_DIRECT here", "switched off", "unaligned memory"])
def test_without_direct_io_every_byte_goes_through_the_page_cache(tmp_path, mirror, monkeypatch, why):
    if why == "no O_DIRECT here":
        monkeypatch.setattr(host_cache, "_open_direct", lambda path: None)
        source = mirror
    elif why == "switched off":
        monkeypatch.setenv("LAZYWEIGHTS_CACHE_DIRECT", "0")
        source = mirror
    else:  # the same bytes one byte off a page: direct I/O would refuse the address
        backing = bytearray(SIZE + 1)
        backing[1:] = mirror
        source = memoryview(backing)[1:]
    calls = _spy_writes(monkeypatch)
    cache = HostCache(str(tmp_path), "http://x/m", SIZE, '"e"')
    _publish(cache, source)
    assert {fd for fd, _, _ in calls} == {cache._data}
    _check_file(cache, source)


def test_a_disk_error_in_a_direct_write_is_the_caches_write_error(tmp_path, mirror, monkeypatch):
    """ENOSPC from a direct write: the cache stops with its named warning, as for a buffered one."""
    cache = HostCache(str(tmp_path), "http://x/m", SIZE, '"e"')
    if not cache._direct_ok:
        pytest.skip(f"{tmp_path}'s filesystem has no direct I/O")
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")) if fd != cache._data else real(fd, data, offset))
    with pytest.warns(host_cache.CacheWriteWarning, match=r"cache .*No space left"):
        cache.publish(mirror, RANGES, [])
        assert cache.flush(timeout=30)
    assert cache.error is not None and str(tmp_path) in str(cache.error)
    assert HostCache(str(tmp_path), "http://x/m", SIZE, '"e"').held.ranges == []  # nothing logged as held
