"""A `cache=DIR` shared by the processes of one host: each byte of an object version is fetched once.

One object version (URL + ETag + length) has three things in DIR, named by the hash of the URL and of the
version, so a changed object never meets the bytes of the old one:

    <url>-<version>.data     the object's bytes at their offsets (a sparse file)
    <url>-<version>.log      the ranges `.data` holds: "start end" lines, appended once written
    <url>-<version>.claims/  one file per chunk (CLAIM_CHUNK bytes) a process is fetching now

A process that needs bytes nobody holds claims their chunks by creating the chunk's claim file
(`O_CREAT | O_EXCL`: exactly one process wins), fetches them into its own memory, and hands them to this
cache's writer thread, which writes them into `.data`, appends their ranges to `.log`, and only then removes
the claim: so the fetch never waits for the disk. A process that finds a chunk claimed waits for the log to
show the bytes (then copies them from `.data`) or for the claim to go away (then claims it itself).

A claim holds the claimer's host name, pid and start time. It is stale, and is broken, when its process is
gone (same host) or when it is older than `claim_ttl` seconds (another host on a shared folder): a process
killed mid-range does not stall the others. `.log` lines are appended with single `write` calls on an
`O_APPEND` descriptor (atomic for lines this short); a torn last line is ignored until it is complete.

A failing disk (full, read-only, over quota) does not fail the load: the bytes are in memory already. The
writer stops, warns once with a `CacheWriteWarning` that names the cache, and the claims are released.

The writer writes the page-aligned body of each range with direct I/O (`O_DIRECT`: from the process's memory
to the disk, no page cache) and only the partial pages at its ends through the page cache. A buffered write
puts every byte into a fresh page-cache page first: on the 2-core VM measured, 2.2 GB took 2.7-5.7 s of CPU
that way, against 0.06 s of CPU (1.0 s of disk) direct, and that CPU was the load's own. Readers of the cache
see the same bytes either way (the kernel keeps the two coherent); a filesystem without direct I/O, or a
device that wants another alignment, gets buffered writes.

Example:
    >>> import tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> a = HostCache(d, "http://example/model.safetensors", 1000, '"v1"')
    >>> a.claim(0)
    True
    >>> b = HostCache(d, "http://example/model.safetensors", 1000, '"v1"')
    >>> b.claim(0)  # a holds it
    False
    >>> a.publish(memoryview(bytes(range(250)) * 4), [(0, 100)], [0]); a.flush()  # written: True
    True
    >>> b.refresh(); b.held.ranges
    [(0, 100)]
    >>> out = bytearray(100); b.read_into(memoryview(out), 0, 100); bytes(out[:4])
    b'\\x00\\x01\\x02\\x03'
    >>> b.claim(0)  # released once written
    True
"""
from __future__ import annotations

import atexit
import errno
import glob
import hashlib
import logging
import os
import queue
import socket
import threading
import time
import warnings
import weakref

import numpy as np

from ..core.errors import CacheWriteWarning, WriteError
from .ranges import RangeSet

_logger = logging.getLogger(__name__)

CLAIM_CHUNK = 8 << 20
DIRECT_ALIGN = 4096  # offsets, lengths and addresses of direct writes: a page (every device's block divides it)
DIRECT_MIN = 1 << 20  # a range's aligned body smaller than this goes through the page cache with its ends
# Seconds between looks at the log while another process fetches a chunk we need: from the first to the
# longest, doubling (`RemoteFile._fill` and `cached_receive.receive_shared` wait the same way)
LOG_WAIT_FIRST, LOG_WAIT_MAX = 0.001, 0.02
WRITER_LINGER = 0.5  # seconds the writer thread waits for more work before it stops
EXIT_FLUSH_SECONDS = 60.0  # the longest an exiting process waits for its caches' queued writes


# Caches whose writer may have work left: a process that exits right after its load still completes them
# (the writer is a daemon thread, which would be stopped mid-queue; the log would then lack those ranges,
# and the next process fetch them again).
_OPEN: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    # Bounded: a stuck disk (a hung network mount) must not hang the exit; unwritten bytes are only fetched
    # again by the next process.
    deadline = time.monotonic() + EXIT_FLUSH_SECONDS
    for cache in list(_OPEN):
        if not cache.flush(timeout=max(0.0, deadline - time.monotonic())):
            _logger.warning("cache %s: exiting with writes still queued (more than %.0f s); the next process "
                            "fetches those bytes again", cache.directory, EXIT_FLUSH_SECONDS)
            return


def _close_descriptors(stem: str, fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError as e:  # closed already: nothing left to lose
            _logger.debug("cache %s: close failed: %s", stem, e)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_direct(path: str) -> int | None:
    """A write descriptor of `path` with O_DIRECT, or None where the platform or filesystem has none, or where
    `LAZYWEIGHTS_CACHE_DIRECT=0` asks for page-cache writes (a next run on the same boot then reads the cache
    from memory rather than the disk, at the first run's CPU cost)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or os.environ.get("LAZYWEIGHTS_CACHE_DIRECT", "").strip() == "0":
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:  # EINVAL: a filesystem without direct I/O (tmpfs before Linux 6.6, some FUSE ones)
        return None


def _address(buffer: memoryview, offset: int) -> int:
    """The memory address of `buffer[offset]` (direct I/O wants page-aligned memory as well as offsets)."""
    return int(np.frombuffer(buffer, np.uint8, count=1, offset=offset).__array_interface__["data"][0])


def _pwrite_all(fd: int, buffer: memoryview, start: int, end: int, origin: int = 0) -> int:
    """Write the object's bytes [start, end) at file offset `start`, from `buffer`, which holds the object's
    bytes from byte `origin` on. Returns `end`; a write that makes no progress is an ENOSPC (the cache's write
    error), not a loop."""
    while start < end:
        n = os.pwrite(fd, buffer[start - origin:end - origin], start)
        if n <= 0:
            raise OSError(errno.ENOSPC, "short write")
        start += n
    return end


class HostCache:
    """The on-disk bytes of one object version, shared by every process that opens it with the same DIR."""

    def __init__(self, directory: str, url: str, size: int, etag: str | None, claim_ttl: float = 60.0,
                 on_idle=None):
        self.directory = directory
        self._on_idle = on_idle  # called when the writer thread stops for want of work
        self.url = url
        self.size = size
        self.claim_ttl = claim_ttl
        os.makedirs(directory, exist_ok=True)
        key = hashlib.sha256(url.encode()).hexdigest()[:32]
        version = hashlib.sha256(f"{etag}\0{size}".encode()).hexdigest()[:12]
        self.stem = os.path.join(directory, f"{key}-{version}")
        self._drop_other_versions(key)
        self._data = os.open(self.stem + ".data", os.O_RDWR | os.O_CREAT, 0o644)  # grows sparse as written
        # The same file written around the page cache: whether this filesystem takes it (probed once), and
        # the descriptor, open only while the writer thread runs (no descriptor more at rest, per shard).
        probe = _open_direct(self.stem + ".data")
        self._direct_ok = probe is not None
        if probe is not None:
            os.close(probe)
        self._direct: int | None = None
        self._log = os.open(self.stem + ".log", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        # The owner (a RemoteFile) has no close of its own: the descriptors go when this object does. The
        # writer thread holds the object only while it has work, so that is soon after the last publish.
        self._close_files = weakref.finalize(self, _close_descriptors, self.stem, (self._data, self._log))
        self._close_files.atexit = False  # at exit the writer may still need them (`_flush_at_exit`)
        _OPEN.add(self)
        self._claims = self.stem + ".claims"
        os.makedirs(self._claims, exist_ok=True)
        self.held = RangeSet()
        self._log_pos = 0
        self._lock = threading.Lock()
        self._host = socket.gethostname()
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self._claims_lock = threading.Lock()
        self._mine: dict[int, int] = {}  # chunk -> holds on its claim in this process (`claim`, `unclaim`)
        self.error: WriteError | None = None
        self.refresh()

    def _drop_other_versions(self, key: str) -> None:
        # an older version of the object: its bytes can never be served again (a process still reading
        # it keeps its open descriptors; unlinking does not disturb them)
        for path in glob.glob(os.path.join(self.directory, key + "*")):
            if not path.startswith(self.stem):
                try:
                    if os.path.isdir(path):
                        for f in os.listdir(path):
                            os.unlink(os.path.join(path, f))
                        os.rmdir(path)
                    else:
                        os.unlink(path)
                except OSError as e:  # another process's files, or gone already: the old version stays unused
                    _logger.debug("cache %s: cannot remove an older version %r: %s", self.directory, path, e)

    # --- what the cache holds -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the ranges other processes (and our writer) appended to the log since the last look."""
        with self._lock:
            end = os.fstat(self._log).st_size
            if end <= self._log_pos:
                return
            text = os.pread(self._log, end - self._log_pos, self._log_pos)
            complete = text.rfind(b"\n") + 1  # a line still being appended is read next time
            lines = text[:complete].split()
            self._log_pos += complete
        got = []
        for i in range(0, len(lines) - 1, 2):
            s, e = int(lines[i]), int(lines[i + 1])
            if 0 <= s < e <= self.size:
                got.append((s, e))
        with self._lock:
            self.held.add_many(got)

    def read_into(self, out: memoryview, start: int, end: int) -> None:
        """Copy bytes [start, end), which the log shows held, from `.data` into `out`."""
        pos = 0
        while pos < end - start:
            n = os.preadv(self._data, [out[pos:end - start]], start + pos)
            if n <= 0:
                raise OSError(f"{self.stem}.data ends at byte {start + pos}, before its log says")
            pos += n

    # --- claims ---------------------------------------------------------------------------------------
    def _claim_path(self, chunk: int) -> str:
        return os.path.join(self._claims, str(chunk))

    def claim(self, chunk: int) -> bool:
        """Try to become the one process fetching chunk `chunk` (bytes [chunk, chunk+1) x CLAIM_CHUNK).

        A chunk this cache already claimed is claimed again at once (counted; `unclaim` releases it when the
        last holder has): threads of one process fetch different bytes of one chunk side by side (the
        process's own in-flight bookkeeping keeps them apart), where waiting for each other would make the
        whole load wait for the cache's disk writes."""
        if self.error is not None:
            return True  # the cache is broken: fetch for ourselves, share nothing
        with self._claims_lock:
            if chunk in self._mine:
                self._mine[chunk] += 1
                return True
            won = self._claim_file(chunk)
            if won and self.error is None:
                self._mine[chunk] = 1
            return won

    def _claim_file(self, chunk: int) -> bool:
        path = self._claim_path(chunk)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not self._break_if_stale(path):
                    return False
                continue
            except FileNotFoundError:  # a newer version of the object removed this one's folder: share nothing
                self.error = WriteError(f"cache {self.directory}: {self.url} changed; this version is not cached",
                                        path=self.directory)
                return True
            except OSError as e:
                self._fail(e)
                return True
            try:
                os.write(fd, f"{self._host} {os.getpid()} {time.time():.3f}\n".encode())
            finally:
                os.close(fd)
            return True
        return False

    def _break_if_stale(self, path: str) -> bool:
        try:
            with open(path) as f:
                host, pid, started = f.read().split()
            stale = (host == self._host and not _alive(int(pid))) or time.time() - float(started) > self.claim_ttl
        except FileNotFoundError:
            return True  # released meanwhile
        except (OSError, ValueError):
            try:  # a claim being written right now has no content yet: judge it by its age
                stale = time.time() - os.stat(path).st_mtime > self.claim_ttl
            except FileNotFoundError:
                return True
        if not stale:
            return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # another process broke the stale claim first: it is free either way
        return True

    def unclaim(self, chunks) -> None:
        """Give back one hold on each of `chunks` (the writer does, once their bytes are written; a failed
        fetch does at once). A chunk's claim file goes when its last holder here gives it back: then another
        process may claim it. Chunks this cache does not hold (a broken cache's) are left alone."""
        with self._claims_lock:
            for c in chunks:
                held = self._mine.get(c, 0)
                if held > 1:
                    self._mine[c] = held - 1
                    continue
                if not held:
                    continue
                del self._mine[c]
                try:
                    os.unlink(self._claim_path(c))
                except OSError as e:  # gone already; otherwise the claim goes stale after claim_ttl seconds
                    _logger.debug("cache %s: cannot release the claim on chunk %d: %s", self.stem, c, e)

    # --- the writer -------------------------------------------------------------------------------------
    def publish(self, mirror: memoryview, ranges: list[tuple[int, int]], chunks, origin: int = 0,
                done=None) -> None:
        """Write `ranges` of `mirror` (the object's bytes from byte `origin` on) into the cache in the
        background, then log them, release `chunks`' claims and call `done()` (the mirror is then free for
        other bytes). `flush` waits for it."""
        self._enqueue((mirror, ranges, list(chunks), origin, done))

    def after_writes(self, call) -> None:
        """Run `call()` on the writer thread once everything published so far is written (or given up)."""
        self._enqueue(call)

    def _enqueue(self, item) -> None:
        # Put and start under the lock the writer takes to decide it may stop: an item is never left queued
        # with no writer.
        with self._lock:
            self._pending += 1
            self._queue.put(item)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, daemon=True, name="lazyweights-cache")
                self._writer.start()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything published so far is written (or the writer has given up); at most `timeout`
        seconds if given. Returns whether it was."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def _write_loop(self) -> None:
        # The writer stops after WRITER_LINGER idle seconds (the next publish starts another): a thread kept
        # for ever would keep this cache, its queue and its descriptors alive for the life of the process.
        while True:
            try:
                item = self._queue.get(timeout=WRITER_LINGER)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._writer = None
                        self._close_direct()
                        if self._on_idle is not None:
                            self._on_idle()
                        return
                continue
            if callable(item):
                try:
                    item()
                finally:
                    with self._idle:
                        self._pending -= 1
                        self._idle.notify_all()
                continue
            mirror, ranges, chunks, origin, done = item
            try:
                if self.error is None:
                    for s, e in ranges:
                        self._write_range(mirror, s, e, origin)
                    os.write(self._log, "".join(f"{s} {e}\n" for s, e in ranges).encode())
                    with self._lock:
                        self.held.add_many(ranges)
            except OSError as e:
                self._fail(e)
            finally:
                self.unclaim(chunks)
                if done is not None:
                    done()
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _write_range(self, mirror: memoryview, start: int, end: int, origin: int = 0) -> None:
        """Write the object's bytes [start, end) at `start`, from `mirror` (which holds them from byte `origin`
        on): the whole pages inside with direct I/O where it works and the range is large, the partial pages
        at the ends (and everything else) through the page cache."""
        body = (-(-start // DIRECT_ALIGN) * DIRECT_ALIGN, end // DIRECT_ALIGN * DIRECT_ALIGN)
        if (not self._direct_ok or body[1] - body[0] < DIRECT_MIN
                or _address(mirror, body[0] - origin) % DIRECT_ALIGN):
            _pwrite_all(self._data, mirror, start, end, origin)
            return
        if self._direct is None:
            self._direct = _open_direct(self.stem + ".data")
            if self._direct is None:  # refused now (a flag changed, a descriptor limit): buffered for good
                self._direct_ok = False
                _pwrite_all(self._data, mirror, start, end, origin)
                return
        _pwrite_all(self._data, mirror, start, body[0], origin)
        pos = body[0]
        try:
            pos = _pwrite_all(self._direct, mirror, pos, body[1], origin)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # The device or filesystem refuses this alignment (or direct I/O itself, found only on a write):
            # buffered from here on, for this range and every later one.
            _logger.debug("cache %s: direct writes refused (%s); writing through the page cache", self.stem, e)
            self._direct_ok = False
            self._close_direct()
        _pwrite_all(self._data, mirror, pos, end, origin)

    def _close_direct(self) -> None:
        """Close the direct-I/O descriptor (the writer thread's; it reopens one when it next needs it)."""
        fd, self._direct = self._direct, None
        if fd is not None:
            os.close(fd)

    def _fail(self, e: OSError) -> None:
        if self.error is None:
            self.error = WriteError(f"cache {self.directory}: cannot write {self.url}'s bytes ({e.strerror or e}); "
                                    "the load goes on from memory without the cache", path=self.directory)
            warnings.warn(str(self.error), CacheWriteWarning, stacklevel=2)

    def close(self) -> None:
        """Wait for the writer, then close the files (done anyway when the cache is garbage collected)."""
        self.flush()
        self._close_files()
