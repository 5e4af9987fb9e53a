"""Checkpoint files in object storage (HTTP(S), S3), read by validated byte ranges straight into memory.

A `RemoteFile` has the interface the readers and the executors already use for a local `SourceFile`
(`path`, `size`, `read`, `view`, `prefetch`, `check_unchanged`), so everything above works unchanged on a URL.
Its bytes live in an anonymous memory map of the object's size (reserved, not committed: only pages that
receive bytes take memory). A reply's body goes from the socket into the map at its offset (`readinto`, one
copy), and the kernels read the map; nothing is written to disk first. Once the executors are done with a
step's bytes they `release` them (`run/fetch.RemoteReads`), which hands the pages back, so a checkpoint far
larger than RAM streams through a bounded window.

The map is shared by every run in the process that reads the object, so a reader takes a *lease* on the
ranges it will read (`acquire`) before it looks at what is held, and gives it back with `release`: pages are
handed back only where no lease (and no pin) covers them. A run that finds bytes another run fetched
therefore never reads them after that run released them (issue 35; tests/io/test_remote_memory.py).

`ensure_ranges` is how bytes arrive: what is neither held nor in flight in another thread is claimed, grouped
into requests by a cost model (`io/ranges.plan_requests`: ranges closer than latency x bandwidth are fetched
as one; small ones share multi-range requests where the server takes them), and fetched by a bounded pool.
Every reply is checked (`io/transport.py`): status, `Content-Range`, length, and the ETag the object had when
it was opened. An object replaced while it is read is a `SourceChangedError`, never a map of mixed bytes.

Never a stale model: every `load_weights` revalidates each object it opens (one HEAD: length and ETag). An
unchanged object keeps its map; a changed one gets a new `RemoteFile`. A handle from before the change keeps
the bytes it holds and raises `SourceChangedError` when it must fetch more.

With `cache=DIR` the bytes are also written to disk, by a background thread (`io/host_cache.HostCache`), and
the processes of one host that share DIR fetch each byte once: one claims a chunk and fetches it, the others
copy it from the cache once it is written. The next run copies what DIR holds and fetches only the rest.

Options use fsspec's names (`storage_options={"endpoint_url": ..., "key": ..., "secret": ...}`).

Example (a local HTTP server; nothing here is specific to it):
    >>> import http.server, threading, tempfile, os, functools
    >>> root = tempfile.mkdtemp(); open(os.path.join(root, "blob"), "wb").write(bytes(range(256)) * 512)
    131072
    >>> class Quiet(http.server.SimpleHTTPRequestHandler):
    ...     def log_message(self, *a): pass
    >>> srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
    >>> threading.Thread(target=srv.serve_forever, daemon=True).start()
    >>> f = RemoteFile(f"http://127.0.0.1:{srv.server_port}/blob")  # this server ignores Range
    >>> f.size
    131072
    >>> bytes(f.view(250, 8))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lazyweights.core.errors.RemoteError: http://127.0.0.1:.../blob: bytes [250, 258): the server ignored the ...
    >>> srv.shutdown()
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
import mmap
import os
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np

from ..core.errors import FormatError, RemoteError, SourceChangedError, UsageError
from .cached_receive import WRITE_BUFFERS, receive_shared
from .gcs_backend import GCSBackend
from .host_cache import CLAIM_CHUNK, LOG_WAIT_FIRST, LOG_WAIT_MAX, CacheWriteWarning, HostCache
from .http_backend import HTTPBackend
from .ranges import LinkMeter, RangeSet, merge, page_runs, plan_requests
from .transport import Converting, S3Backend, Transient

_log = logging.getLogger(__name__)

__all__ = ["RemoteFile", "RangeSet", "is_url", "remote_options", "current_options", "list_prefix", "fetch_small",
           "sibling_options", "url_exists", "open_all", "options_of"]

URL_SCHEMES = ("http://", "https://", "s3://", "gs://")
LISTED_SCHEMES = ("s3://", "gs://")  # where a prefix is listed (`list_prefix`); HTTP has no listing
HEADER_READAHEAD = 256 << 10  # GGUF metadata: a few requests, not one per field
FIRST_READAHEAD = 64 << 10  # fetched with the object's identity: most safetensors headers fit
METADATA_READAHEAD = 16 << 20  # a metadata file (an index, a config) in the request that opens it
DEFAULT_PART_SIZE = 128 << 20  # fewer, longer requests: measured on W1 over nginx (benchmarks/RESULTS.md)
PAGE = mmap.PAGESIZE
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def is_url(path: Any) -> bool:
    """True for the object-storage URLs lazyweights reads (`http://`, `https://`, `s3://`, `gs://`).

    >>> is_url("s3://bucket/model.safetensors"), is_url("/data/model.safetensors")
    (True, False)
    """
    return isinstance(path, str) and path.lower().startswith(URL_SCHEMES)


# --- options carried from load_weights to every file it opens ------------------------------------------
# (storage_options, cache, load): `load` is a fresh token per `remote_options` block, so each object is
# revalidated once per load (`RemoteFile.open`), not once per file the readers open.
_OPTIONS: contextvars.ContextVar[tuple[dict, str | None, object]] = contextvars.ContextVar(
    "lazyweights_remote", default=({}, None, None))


@contextlib.contextmanager
def remote_options(storage_options: dict | None = None, cache: str | None = None) -> Iterator[None]:
    """Within the block, remote files are opened with these `storage_options` and this `cache` directory, and
    each is revalidated (a HEAD) the first time it is opened in the block."""
    token = _OPTIONS.set((dict(storage_options or {}), os.path.expanduser(cache) if cache else None, object()))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


@contextlib.contextmanager
def options_of(url: str) -> Iterator[None]:
    """Within the block, remote files are opened with the options `url` was opened with (`sibling_options`):
    how a file beside a checkpoint (its config.json) is read. Inside the load that opened `url` with those
    same options the load's own block stays in force, so what that load opened and revalidated (the
    config.json it fetched beside the shards) is used without another request."""
    options, cache = sibling_options(url)
    current, current_cache, token = _OPTIONS.get()
    if token is not None and options == current and cache == current_cache:
        yield
        return
    with remote_options(options, cache):
        yield


def current_options() -> tuple[dict, str | None]:
    """The (storage_options, cache) in force (see `remote_options`)."""
    options, cache, _ = _OPTIONS.get()
    return options, cache


def list_prefix(url: str, storage_options: dict | None = None) -> list[str]:
    """The objects under an `s3://bucket/prefix` or a `gs://bucket/prefix` (what `load_weights` does with a
    prefix)."""
    if not url.lower().startswith(LISTED_SCHEMES):
        raise UsageError(f"{url}: only s3:// and gs:// prefixes can be listed; name the checkpoint's files or index")
    return backend(url, dict(storage_options or {})).list()


def fetch_small(url: str, limit: int = 64 << 20) -> bytes:
    """The whole object at `url` (an index JSON, a config), refusing objects over `limit` bytes; opened with
    the `remote_options` in force."""
    f = RemoteFile.open(url, *current_options(), readahead=min(limit, METADATA_READAHEAD))
    if f.size > limit:
        raise RemoteError(f"{url}: {f.size} bytes is too large for a metadata file (limit {limit})", url=url)
    return f.read(0, f.size)


def sibling_options(url: str) -> tuple[dict, str | None]:
    """The (storage_options, cache) a file at `url` was opened with, for reading a file beside it later (a
    checkpoint's config.json); the options in force when none was opened."""
    with RemoteFile._cache_lock:
        for f in RemoteFile._cache.values():
            if f.path == url:
                return f.options, f.cache_dir
    return current_options()


def url_exists(url: str) -> bool:
    """Whether an object exists at `url` (a 404/403 is False; other failures raise)."""
    try:
        RemoteFile.open(url, *current_options())
    except RemoteError as e:
        if e.status in (403, 404):
            return False
        raise
    return True


def backend(url: str, options: dict) -> Any:
    """The transport for `url`: S3 (boto3) for `s3://`, GCS (its JSON API over urllib3) for `gs://`, HTTP(S)
    (urllib3) otherwise."""
    scheme = url[:5].lower()
    if scheme == "s3://":
        return S3Backend(url, options)
    if scheme == "gs://":
        return GCSBackend(url, options)
    return HTTPBackend(url, options)


OPEN_CONCURRENCY = 16  # objects opened at once by `open_all` (a checkpoint's shards, a split GGUF's parts)


def open_all(urls: list[str], prepare, concurrency: int = OPEN_CONCURRENCY) -> dict:
    """Start `prepare(url)` for every URL at once (`concurrency` in flight): {url: Future}. The caller takes
    the results in its own order, so the error it raises is the one it would have met opening the objects
    one after another. The threads run in copies of this context: the `remote_options` block (storage
    options, cache, the load's revalidation token) reaches them. One URL runs on this thread: there is
    nothing to overlap."""
    from concurrent.futures import Future

    if not urls:  # (every part of a split already parsed, say): nothing to open, and a pool of 0 is refused
        return {}
    if len(urls) == 1:
        done: Future = Future()
        try:
            done.set_result(prepare(urls[0]))
        except Exception as e:  # raised by the caller, as a pool's future would
            done.set_exception(e)
        return {urls[0]: done}
    pool = ThreadPoolExecutor(min(concurrency, len(urls)), thread_name_prefix="lazyweights-open")
    try:
        return {u: pool.submit(contextvars.copy_context().run, prepare, u) for u in urls}
    finally:
        pool.shutdown(wait=False)  # the workers exit once the queue is done (or cancelled)


def _anonymous_map(size: int) -> mmap.mmap:
    """Address space for `size` bytes that takes memory only where bytes are stored (MAP_NORESERVE: a
    673 GB checkpoint's maps fit any machine's address space and no overcommit rule counts them)."""
    try:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE)
    except OSError:  # strict overcommit (vm.overcommit_memory=2): back the map with a sparse scratch file
        fd, tmp = tempfile.mkstemp(prefix="lazyweights-remote-")
        os.unlink(tmp)
        try:
            os.ftruncate(fd, size)
            return mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)


GIVE_BACK_GAP = 1 << 20  # released runs this close are given back as one span of pages (`_unneeded_pages`)
HUGE_PAGE = 2 << 20  # x86-64's and arm64's transparent huge page (with 4 KB base pages)
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def _huge_interiors(base: int, spans: list[tuple[int, int]], huge: int = HUGE_PAGE) -> list[tuple[int, int]]:
    """The parts of `spans` (offsets into a map at address `base`) made of whole `huge`-aligned pages of the
    address space: where a huge page may back them without taking memory for a byte outside them.

    >>> _huge_interiors(4096, [(0, 10 << 20), (0, 1 << 20)])
    [(2093056, 10481664)]
    """
    out = []
    for s, e in spans:
        lo = -(-(base + s) // huge) * huge - base
        hi = (base + e) // huge * huge - base
        if hi > lo:
            out.append((lo, hi))
    return out


def _clip(spans: list[tuple[int, int]], within: list[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """The parts of `spans` (any order) inside `within` (sorted, disjoint); nothing without `within`.

    >>> _clip([(50, 120), (0, 10)], [(5, 60), (100, 200)])
    [(5, 10), (50, 60), (100, 120)]
    """
    if not within or not spans:
        return []
    return RangeSet(merge(within)).held_many(merge(spans))


def _grouped(pieces: list[tuple[int, int]], fence: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """`pieces` (sorted) split by the `fence` span (sorted, disjoint) each lies in.

    >>> _grouped([(0, 5), (8, 9), (20, 30)], [(0, 10), (20, 40)])
    [[(0, 5), (8, 9)], [(20, 30)]]
    """
    groups: dict[int, list[tuple[int, int]]] = {}
    i = 0
    for s, e in pieces:
        while fence[i][1] <= s:
            i += 1
        groups.setdefault(i, []).append((s, e))
    return list(groups.values())


def _pages_around(ranges: list[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """Every page each of `ranges` touches, as merged page-aligned runs; runs at most `gap` bytes apart become
    one, the pages between them included.

    >>> P = PAGE; _pages_around([(1, 10), (4 * P + 5, 4 * P + 6), (P - 1, P + 1)]) == [(0, 2 * P), (4 * P, 5 * P)]
    True
    >>> _pages_around([(1, 10), (4 * P + 5, 4 * P + 6)], gap=4 * P) == [(0, 5 * P)]
    True
    """
    if not ranges:
        return []
    return page_runs(ranges, PAGE, gap)


def _free_pages(pages: list[tuple[int, int]], busy: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `pages` (page-aligned runs: `_pages_around` of what was released) on no page that a range of
    `busy` touches.

    A page that holds nothing anyone needs may go back whole even where no released range covers it: a rank's
    exact row runs (1-3 KB, one in each page of a row-parallel matrix) never cover a page, so without this
    none went back until the file was closed (0.5 GB of W1's rank 0 of 4 at 1 Gbit/s).

    >>> P = PAGE
    >>> pages = _pages_around([(10, 20), (P + 10, P + 20), (3 * P, 3 * P + 1)])
    >>> _free_pages(pages, [(P + 100, P + 101)]) == [(0, P), (3 * P, 4 * P)]
    True
    """
    if busy and pages:
        return RangeSet(_pages_around(busy)).missing_many(pages)
    return pages


def _copy_into(out: memoryview, piece, offset: int) -> None:
    """`receive`'s `convert` for a plain copy into `out`."""
    out[offset:offset + len(piece)] = piece


def _retrying(call, url: str, what: str, retries: int, *args):
    """`call(*args)`, retried with exponential backoff on `Transient` failures; then a `RemoteError`."""
    delay = 0.1
    for attempt in range(retries + 1):
        try:
            return call(*args)
        except Transient as e:
            if attempt == retries:
                raise RemoteError(f"{url}: {what}: {e} (after {retries + 1} attempts)", url=url) from None
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


# --- the file ---------------------------------------------------------------------------------------------
class RemoteFile:
    """One remote object, read by validated byte ranges into an anonymous memory map of its size.

    Options (`storage_options`, fsspec's names where they exist): `endpoint_url`, `key`, `secret`, `token`,
    `region_name`, `anon`, `client_kwargs` (S3); `token`, `endpoint_url`, `anon` (GCS, `io/gcs_backend.py`);
    `headers` (HTTP, GCS); `timeout` (seconds per request, 30),
    `retries` (5), `max_concurrency` (requests in flight, 8), `part_size` (bytes per request, 128 MiB), and the
    cost model: `request_latency` (seconds a request costs beyond its bytes; 0.5 ms for HTTP, 5 ms for S3 and
    GCS),
    `part_cost` (seconds one more part of a multi-range request costs, 20 us; 0 fetches exactly the bytes
    asked for) and `bandwidth` (bytes per second, 1 GB/s; `"auto"`: what this host's fetches observe, once
    16 MiB came, `io/ranges.LinkMeter`): a gap between two needed ranges is fetched through when its bytes
    cost less than another request or part; `claim_ttl` (seconds after which another host's
    claim in a shared `cache=` is broken, 60).
    """

    _cache: dict[tuple, RemoteFile] = {}
    _cache_lock = threading.Lock()

    def __init__(self, url: str, storage_options: dict | None = None, cache: str | None = None,
                 identity: tuple[int, str | None] | None = None, readahead: int = FIRST_READAHEAD):
        self.path = url
        self.options = dict(storage_options or {})
        self.cache_dir = cache
        self.retries = int(self.options.get("retries", 5))
        self.part_size = max(1 << 16, int(self.options.get("part_size", DEFAULT_PART_SIZE)))
        self.max_concurrency = max(1, int(self.options.get("max_concurrency", 8)))
        self._backend = backend(url, self.options)
        latency = float(self.options.get("request_latency", self._backend.request_latency))
        auto = self.options.get("bandwidth") == "auto"  # priced at what this host's fetches observe
        self.bandwidth = 1e9 if auto else float(self.options.get("bandwidth", 1e9))
        self._latency, self._part_cost = latency, float(self.options.get("part_cost", 20e-6))
        self.gap, self.part_gap = self._gaps(self.bandwidth)
        self._link = LinkMeter.of(url) if auto else None
        head = None
        if identity is not None:
            self.size, self.etag = identity
        elif cache:  # the header's bytes may be in the cache already: a HEAD for the version is enough
            self.size, self.etag = self._retrying(self._backend.identity, "cannot open")
        else:  # one GET gives the length, the ETag and the header's bytes (`readahead` of them)
            self.size, self.etag, head = self._retrying(self._backend.first_bytes, "cannot open", max(1, readahead))
        self.bytes_fetched = 0  # from the network
        self.bytes_from_cache = 0  # copied from a cache= directory
        self.requests = 0
        self._token: object = None  # the load that last revalidated this object (`open`)
        self._lock = threading.Lock()
        # the counters' own lock: a receiving thread that counts its request must not wait for `_lock`, which
        # a release of a rank's thousands of row runs holds for milliseconds (benchmarks/RESULTS.md, issue 35)
        self._counts_lock = threading.Lock()
        self._have = RangeSet()
        self._releasing = RangeSet()  # released, but the cache writer still has to write them
        self._unwritten = RangeSet()  # fetched through a gap, held by no one, not yet in the cache's file
        self._pinned = RangeSet()  # handed out by `view`: a caller's array aliases them, never released
        # (start, end) -> how many leases readers hold on it (`acquire`): no release drops a leased byte
        self._leases: dict[tuple[int, int], int] = {}
        self._union: RangeSet | None = None  # their union, merged (`_lease_union`)
        # released by a run while another reader's lease kept them: dropped when that lease ends (`_leased`)
        self._doomed = RangeSet()
        self._inflight: list[tuple[int, int, threading.Event]] = []
        self._prefix_end = 0  # bytes [0, _prefix_end) are known to be present
        # S3 and GCS have no multi-range GET; an HTTP server may turn out not to either
        self._multi_range = self._backend.multi_range
        self._pool: ThreadPoolExecutor | None = None
        self._map = _anonymous_map(self.size) if self.size else None
        self._buffer = np.frombuffer(self._map, np.uint8) if self._map is not None else np.empty(0, np.uint8)
        self._view = self._buffer.view()
        self._view.flags.writeable = False  # what readers and kernels get
        self._mem = memoryview(self._map) if self._map is not None else memoryview(b"")
        self._host = None
        if cache and self.etag is not None and self.size:  # without an ETag a cached byte could be stale
            try:
                self._host = HostCache(cache, url, self.size, self.etag, float(self.options.get("claim_ttl", 60)),
                                       on_idle=WRITE_BUFFERS.trim)
            except OSError as e:
                warnings.warn(f"cache {cache}: cannot use it for {url} ({e.strerror or e}); the load goes on from "
                              "memory without the cache", CacheWriteWarning, stacklevel=2)
        if head:
            self._mem[:len(head)] = head
            self._have.add(0, len(head))
            self._prefix_end = len(head)
            self.bytes_fetched, self.requests = len(head), 1

    @classmethod
    def open(cls, url: str, storage_options: dict | None = None, cache: str | None = None,
             header: bool = True, readahead: int = FIRST_READAHEAD) -> RemoteFile:
        """The shared RemoteFile for `url` with these options, revalidated once per load (`remote_options`
        block): an object whose length or ETag changed since it was opened is opened anew. A first open
        fetches the object's first `readahead` bytes (64 KiB) with its identity unless `header=False` (then a
        HEAD); a caller that expects a longer header asks for it here, so the header comes in that one request
        (`formats/open.py` sizes it from the index; tests/io/test_parallel_open.py)."""
        key = (url, json.dumps(storage_options or {}, sort_keys=True, default=str), cache)
        token = _OPTIONS.get()[2]
        with cls._cache_lock:
            f = cls._cache.get(key)
        if f is not None and token is not None and f._token is token:
            return f
        if f is not None:
            identity = f._retrying(f._backend.identity, "cannot open")
            if identity == (f.size, f.etag) and f.etag is not None:
                f._token = token
                return f
            fresh = cls(url, storage_options, cache, identity)
        elif not header:
            options = dict(storage_options or {})
            identity = _retrying(backend(url, options).identity, url, "cannot open", int(options.get("retries", 5)))
            fresh = cls(url, storage_options, cache, identity)
        else:
            fresh = cls(url, storage_options, cache, readahead=readahead)
        fresh._token = token
        with cls._cache_lock:
            cls._cache[key] = fresh
        return fresh

    @classmethod
    def reopen(cls, url: str, storage_options: dict | None, cache: str | None, size: int, etag: str | None):
        """The RemoteFile for `url` in another process (a dask worker), which must be the same object version
        the handle was made from: else `SourceChangedError`."""
        f = cls.open(url, storage_options, cache, header=False)
        if (f.size, f.etag) != (size, etag):
            raise SourceChangedError(f"{url}: the object changed after it was opened (length {size}, ETag {etag} "
                                     f"became {f.size}, {f.etag}). Reload it with load_weights().")
        return f

    # --- fetching ----------------------------------------------------------------------------------------
    def _retrying(self, call, what: str, *args):
        return _retrying(call, self.path, what, self.retries, *args)

    def ensure(self, offset: int, length: int) -> None:
        """Make bytes [offset, offset+length) present, fetching only what is missing."""
        self.ensure_ranges([(offset, min(self.size, offset + length))])

    def ensure_ranges(self, ranges: list[tuple[int, int]], within: list[tuple[int, int]] | None = None) -> None:
        """Make many sorted byte ranges present (a rank's strided slice: one run per row). What is missing and
        not in flight in another thread is claimed and fetched (`_fill`); pieces another thread is fetching
        are waited for, then looked at again.

        `within`: sorted spans the caller holds a lease on (the source records it reads). The gaps the cost
        model fetched through inside them count as held too, so a strided slice fetched through its gaps is
        held (and released with its record) as whole pages, not as thousands of runs no page lies inside."""
        ranges = [(s, min(e, self.size)) for s, e in ranges if min(e, self.size) > s]
        while True:
            with self._lock:
                if self._releasing:  # wanted again before the writer dropped them: keep them
                    for s, e in self._releasing.held_many(ranges):
                        self._releasing.remove(s, e)
                missing = self._have.missing_many(ranges)
                if not missing:
                    return
                # Claims are hulls (first byte, last byte) of what one caller fetches, so a rank slice's
                # thousands of runs are one claim and the overlap test stays cheap (a few claims at a time).
                # A hull is conservative: a piece inside another caller's hull waits, then is re-checked.
                free: list[tuple[int, int]] = []
                waiting: set[threading.Event] = set()
                lo, hi = missing[0][0], missing[-1][1]
                if not any(c[0] < hi and c[1] > lo for c in self._inflight):
                    free = missing  # nothing in flight overlaps: no test run by run
                else:
                    for s, e in missing:
                        busy = [c for c in self._inflight if c[0] < e and c[1] > s]
                        if busy:
                            waiting.update(c[2] for c in busy)
                        else:
                            free.append((s, e))
                mine = (free[0][0], free[-1][1], threading.Event()) if free else None
                if mine is not None:
                    self._inflight.append(mine)
            try:
                if mine is not None:
                    self._fill(free, within, mine)
            finally:
                if mine is not None:
                    with self._lock:
                        self._inflight.remove(mine)
                        mine[2].set()
            for ev in waiting:
                ev.wait()

    def _fill(self, pieces: list[tuple[int, int]], within: list[tuple[int, int]] | None = None,
              claim: tuple | None = None) -> None:
        """Bring `pieces` (claimed in this process) into the map: from the network, or, with a shared cache,
        from whichever of the cache and the network has them first (see `io/host_cache.py`). What else was
        fetched inside the leased spans `within` (`ensure_ranges`) is held as well."""
        host = self._host
        if host is None:
            fetched = self._fetch(pieces)
            self._mark_held(pieces, fetched=_clip(fetched, within))
            return
        delay = LOG_WAIT_FIRST
        while pieces:
            host.refresh()
            cached = host.held.held_many(pieces)
            for s, e in cached:
                host.read_into(self._mem[s:e], s, e)
            if cached:
                self._mark_held(cached, from_cache=True)
            pieces = host.held.missing_many(pieces)
            if not pieces:
                return
            chunks = sorted({c for s, e in pieces for c in range(s // CLAIM_CHUNK, (e - 1) // CLAIM_CHUNK + 1)})
            claimed = [c for c in chunks if host.claim(c)]
            if claimed:
                # Another process may have written and released a chunk between our look at the log and our
                # claim: look again, so a byte written meanwhile is copied, not fetched twice.
                host.refresh()
                span = RangeSet([(c * CLAIM_CHUNK, (c + 1) * CLAIM_CHUNK) for c in claimed])
                ours = span.held_many(host.held.missing_many(pieces))
                if not ours:
                    host.unclaim(claimed)
                    continue
                try:
                    # Never through a gap into a chunk we did not claim (another process is fetching it), nor
                    # into bytes the cache holds already (W1 by 4 processes: 0.38% of it fetched twice).
                    fetched = self._fetch(ours, fence=host.held.missing_many(span.ranges))
                except BaseException:
                    host.unclaim(claimed)
                    raise
                held_gaps = _clip(fetched, within)
                self._mark_held(ours, fetched=held_gaps)
                # Everything fetched goes to the cache, the gaps too: a byte in our gap may be what another
                # process waits for. The gaps nobody here holds keep their pages until they are written.
                unheld = RangeSet(merge(ours + held_gaps)).missing_many(merge(fetched))
                if unheld:
                    with self._lock:
                        self._unwritten.add_many(unheld)
                host.publish(self._mem, merge(fetched), claimed)  # written and logged off the critical path
                if unheld:
                    host.after_writes(functools.partial(self._written, unheld, claim))
                pieces = span.missing_many(pieces)
                delay = LOG_WAIT_FIRST
            else:  # every chunk we need is being fetched by another process: wait for its log lines
                time.sleep(delay)
                delay = min(delay * 2, LOG_WAIT_MAX)

    def _written(self, unheld: list[tuple[int, int]], claim: tuple | None) -> None:
        """The cache writer wrote `unheld` (gap bytes no one here holds): their pages may go back now. `claim`,
        the in-flight entry of the fill that fetched them, may still be listed (the writer can be that quick):
        it does not keep them, as what that fill fetches later lies in other claim chunks, so other pages."""
        with self._lock:
            self._unwritten.remove_many(unheld)
            self._give_back_pages(unheld, claim)

    def _mark_held(self, ranges: list[tuple[int, int]], from_cache: bool = False,
                   fetched: list[tuple[int, int]] | None = None) -> None:
        new = merge(list(ranges) + list(fetched)) if fetched else ranges  # merged before the lock is taken
        with self._lock:
            self._have.add_many(new)
            if from_cache:
                self.bytes_from_cache += sum(e - s for s, e in ranges)

    def _gaps(self, bandwidth: float) -> tuple[int, int]:
        """The break-even gaps at `bandwidth` (bytes/s): a gap's bytes against one more request, and against
        one more part of a multi-range request (server and client work per part: ~20 us of wall a part on one
        connection against nginx on loopback, nginx 6-17 us of CPU, the client ~10 us; benchmarks/RESULTS.md,
        issue 35)."""
        return int(self._latency * bandwidth), int(self._part_cost * bandwidth)

    def footprint(self, ranges: list[tuple[int, int]]) -> int:
        """Bytes a fetch of the sorted `ranges` brings into the map: the ranges and the gaps the cost model
        would fetch through between them (held with their records until released, see `ensure_ranges`).
        What a run's fetch window counts for them: a rank's row-parallel slice fetched through its gaps holds
        its whole matrix, four times its runs' bytes at 4 ranks.

        >>> f = RemoteFile.__new__(RemoteFile)  # a rank's three 2 KB runs, 6 KB apart
        >>> f._link, f.gap, f._multi_range, f.part_size, f.part_gap = None, 500_000, True, 128 << 20, 20_000
        >>> f.footprint([(0, 2048), (8192, 10240), (16384, 18432)])  # a part costs more: through the gaps
        18432
        >>> f.part_gap = 0  # `part_cost=0`: exactly the runs
        >>> f.footprint([(0, 2048), (8192, 10240), (16384, 18432)])
        6144
        """
        if len(ranges) < 2:
            return sum(e - s for s, e in ranges)
        gap, part_gap = self._current_gaps()
        requests = plan_requests(ranges, gap=gap, multi_range=self._multi_range, part_size=self.part_size,
                                 part_gap=part_gap)
        return sum(e - s for request in requests for s, e in request)

    def _current_gaps(self) -> tuple[int, int]:
        """The break-even gaps in force: at the observed bandwidth where it is measured (`"auto"`)."""
        observed = self._link.bandwidth() if self._link is not None else None
        return self._gaps(observed) if observed else (self.gap, self.part_gap)

    def _fetch(self, pieces: list[tuple[int, int]], fence: list[tuple[int, int]] | None = None
               ) -> list[tuple[int, int]]:
        """Fetch `pieces` from the network into the map: requests planned by cost, many in flight. Returns the
        spans fetched (the pieces and the gaps fetched through). The caller marks the pieces held, and of the
        gaps only those inside a record it leases (`_fill`'s `within`): a gap's bytes may belong to a record
        no run leases, which no release would ever give back.

        `fence`: sorted, disjoint spans holding every piece; no gap fetched through leaves the span it is in
        (a shared cache's claimed chunks)."""
        gap, part_gap = self._current_gaps()
        requests = []
        for group in (_grouped(pieces, fence) if fence else [pieces]):
            requests += plan_requests(group, gap=gap, multi_range=self._multi_range, part_size=self.part_size,
                                      part_gap=part_gap)
        spans = [r for request in requests for r in request]
        self._advise_huge(spans)
        if len(requests) == 1:
            self._request(requests[0])
        else:
            self._run_all(self._request, requests)
        return spans

    def _advise_huge(self, spans: list[tuple[int, int]]) -> None:
        """Let huge pages back the whole 2 MB pages of the address space inside `spans`, about to be fetched
        into the map: one fault and one page clear per 2 MB instead of 512 (a rank's strided slices fetched
        through their gaps, W1 rank 0 of 4: 3.1 s of CPU became 2.1 s, benchmarks/RESULTS.md). Only whole
        pages inside the spans, so a small read never takes a huge page of memory (a header, a norm), and
        the release (`_drop`) hands back what it covers as before (the kernel splits a partly released
        huge page). A hint: refused (no THP, a file-backed map), nothing changes."""
        if _MADV_HUGEPAGE is None or self._map is None:
            return
        base = self._buffer.ctypes.data
        for lo, hi in _huge_interiors(base, [(s, e) for s, e in spans if e - s >= 2 * HUGE_PAGE]):
            try:
                self._map.madvise(_MADV_HUGEPAGE, lo, hi - lo)
            except OSError:  # a hint the kernel may refuse (THP compiled out, a shared file map): 4 KB pages
                return

    def _run_all(self, call, requests: list) -> None:
        """`call(request)` for every request on the fetch pool (`max_concurrency` in flight); every one is
        waited for, then the first failure is raised."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="lazyweights-fetch")
        futures = [self._pool.submit(call, r) for r in requests]
        error = None
        for f in futures:
            try:
                f.result()
            except BaseException as e:  # wait for every request in flight, then raise the first failure
                error = error or e
        if error is not None:
            raise error

    def receive(self, start: int, end: int, out: memoryview, convert=None, unit: int = 1) -> None:
        """Fetch bytes [start, end) straight into `out` (the caller's memory: an output), bypassing the map:
        the bytes are touched once. Bytes the map holds are copied from it.

        `convert(piece, offset)`, where given, takes the bytes instead of `out` (which then only gives the
        length): each piece as it arrives (whole `unit`s, in the receiving thread's warm buffer; see
        `io/transport.Converting`), with its offset from `start`. A cast writes them into the result
        converted, so no byte is read back from memory to be cast. A convert marked `in_place` (a copy, a
        cast the kernel may do onto its own input: `run/fetch._in_place`) gets each piece received straight
        into its place in `out` instead, and converts it there while it is in cache.

        With a shared `cache=`, the bytes reach the cache too: through a small pool of buffers the cache's
        writer writes from, not through the map (`io/cached_receive.py`); bytes the cache holds are copied
        from it."""
        if len(out) != end - start:
            raise UsageError(f"receive: bytes [{start}, {end}) of {self.path} ({end - start} bytes) into a "
                             f"{len(out)}-byte buffer")
        unit = max(1, int(unit)) if convert is not None else 1
        with self._leased([(start, end)]):  # another run's release must not drop what we copy from the map
            with self._lock:
                held = self._have.held_many([(start, end)])
            # whole units only (the object's first bytes, held since it was opened, may end inside one):
            # the rest is fetched again, so every piece handed to `convert` starts on a unit
            held = [(a, b) for a, b in ((start + -(-(s - start) // unit) * unit, start + (e - start) // unit * unit)
                                        for s, e in held) if b > a]
            for s, e in held:
                if convert is None:
                    out[s - start:e - start] = self._mem[s:e]
                else:
                    convert(self._mem[s:e], s - start)
        missing = RangeSet(held).missing_many([(start, end)])
        if not missing:
            return
        if self._host is not None and self._host.error is None:  # the cache gets the bytes too
            if convert is None:
                convert, unit = functools.partial(_copy_into, out), 1
            rest = receive_shared(self, start, missing, convert, unit)
            if rest:
                self._receive_through_map(start, end, rest, convert, unit)
            return
        part_size = max(unit, self.part_size // unit * unit)  # parts start on a unit too
        requests = plan_requests(missing, gap=0, multi_range=False, part_size=part_size)

        # A convert that works in place (`in_place`: a copy, or a cast between dtypes of one width) has the
        # bytes received straight into their place in `out`, then converted there a piece at a time while the
        # piece is in cache; any other receives into the thread's warm buffer and converts from there.
        in_place = convert is not None and getattr(convert, "in_place", False)

        def into(s: int, e: int):
            if convert is None:
                return out[s - start:e - start]
            keep = out[s - start:e - start] if in_place else None
            return Converting(lambda piece, offset: convert(piece, s - start + offset), e - s, unit, keep)

        def one(request: list[tuple[int, int]]) -> None:
            self._request(request, into)

        if len(requests) == 1:
            one(requests[0])
            return
        self._run_all(one, requests)

    def _receive_through_map(self, start: int, end: int, ranges: list[tuple[int, int]], convert, unit: int) -> None:
        """The pieces of a shared-cache `receive` that `receive_shared` leaves (units a claim chunk's edge
        cuts, bytes the cache holds in part, pieces with no pool buffer free): brought into the map the way a
        block's reads are (`ensure_ranges`: cache, claims, the writer), whole units, handed to `convert`, then
        released."""
        units = merge([(start + (s - start) // unit * unit, min(end, start + -(-(e - start) // unit) * unit))
                       for s, e in ranges])
        self.acquire(units)
        try:
            self.ensure_ranges(units)
            for s, e in units:
                convert(self._mem[s:e], s - start)
        finally:
            self.release(units)

    def _request(self, ranges: list[tuple[int, int]], into=None) -> None:
        if self._link is None:
            self._request_unmetered(ranges, into)
            return
        self._link.start()
        got = 0
        try:
            self._request_unmetered(ranges, into)
            got = sum(e - s for s, e in ranges)
        finally:
            self._link.done(got)

    def _request_unmetered(self, ranges: list[tuple[int, int]], into=None) -> None:
        # a failed attempt may leave some bytes received, but ranges are marked held only after success
        into = into or (lambda s, e: self._mem[s:e])
        if len(ranges) > 1 and self._multi_range:
            outs = [into(s, e) for s, e in ranges]
            what = f"{len(ranges)} ranges from byte {ranges[0][0]}"
            if self._retrying(self._backend.get_many, what, ranges, self.size, self.etag, outs):
                self._count(ranges)
                return
            self._multi_range = False  # the server answered with one range or the whole object
            for request in plan_requests(ranges, gap=self.gap, multi_range=False, part_size=self.part_size):
                self._request(request, into)
            return
        for s, e in ranges:
            self._retrying(self._backend.get, f"bytes [{s}, {e})", s, e, self.size, self.etag, into(s, e))
            self._count([(s, e)])

    def _count(self, ranges: list[tuple[int, int]]) -> None:
        with self._counts_lock:
            self.bytes_fetched += sum(e - s for s, e in ranges)
            self.requests += 1

    def acquire(self, ranges: list[tuple[int, int]]) -> None:
        """Take a lease on each of `ranges` before reading them (before `ensure_ranges` looks at what is held):
        until it is given back (`release`), no release by any run drops those bytes. Leases count: two runs
        that lease the same range both give it back before its pages go.

        >>> f = RemoteFile.__new__(RemoteFile); f._lock, f._leases = threading.Lock(), {}
        >>> f.acquire([(0, 10), (0, 10), (20, 30)]); sorted(f._leases.items())
        [((0, 10), 2), ((20, 30), 1)]
        """
        with self._lock:
            for r in ranges:
                if r[1] > r[0]:
                    n = self._leases.get(r, 0)
                    self._leases[r] = n + 1
                    if not n:
                        self._union = None

    def _unlease(self, ranges: list[tuple[int, int]]) -> None:
        """Give back one lease on each of `ranges` (one not leased gives back nothing); under `_lock`."""
        for r in ranges:
            n = self._leases.get(r)
            if n is None:
                continue
            if n > 1:
                self._leases[r] = n - 1
            else:
                del self._leases[r]
                self._union = None

    def _lease_union(self) -> RangeSet:
        """The bytes some lease covers, merged (under `_lock`; read it, never change it). Kept until a lease
        comes or goes: a release of a rank's row runs asked for it twice, each time merging every lease of
        every step in flight, thousands of runs (benchmarks/RESULTS.md, issue 35)."""
        union = getattr(self, "_union", None)
        if union is None:
            union = self._union = RangeSet()
            union.add_many(list(self._leases))
        return union

    @contextlib.contextmanager
    def _leased(self, ranges: list[tuple[int, int]]) -> Iterator[None]:
        """A lease for the length of the block (a `read`, a `view`, a `receive`), given back without dropping
        anything: what the block fetched stays held, unleased, as a hint for the next reader."""
        self.acquire(ranges)
        try:
            yield
        finally:
            with self._lock:
                self._unlease(ranges)
                doomed = self._doomed.held_many(merge(ranges)) if self._doomed else []
            if doomed:  # a run released them while this block read: they are no one's hint any more
                self._drop(doomed)

    def leased_bytes(self) -> int:
        """Bytes of the object some reader holds a lease on (0 once every run has ended, failed ones too)."""
        with self._lock:
            return self._lease_union().total()

    def release(self, ranges: list[tuple[int, int]]) -> None:
        """Give back the leases taken on `ranges` with `acquire` (a range never leased gives back nothing), and
        hand back the pages of the bytes in them that no other lease and no pin covers (they are fetched again
        if needed). With a shared cache, after the cache writer has written them."""
        if not ranges:
            return
        with self._lock:
            self._unlease(ranges)
        if self._map is None:
            return
        if self._host is None:
            self._drop(ranges)
            return
        # The cache writer may still have to write them: it drops them after the writes queued before
        # (never blocking the block that released them). Bytes wanted again meanwhile are kept (`ensure_ranges`
        # takes them out of `_releasing`).
        ranges = sorted(ranges)
        with self._lock:
            self._releasing.add_many(ranges)

        def drop() -> None:
            with self._lock:
                still = self._releasing.held_many(ranges)
                for s, e in still:
                    self._releasing.remove(s, e)
            self._drop(still)

        self._host.after_writes(drop)

    def _drop(self, ranges: list[tuple[int, int]]) -> None:
        """Hand back the pages of what is held in `ranges` and neither leased nor pinned. Only held bytes: a
        piece another thread is fetching into is not held yet, and its pages must not be zeroed under it."""
        if self._map is None:
            return
        ranges = merge(ranges)  # before the lock is taken
        with self._lock:
            ranges = self._have.held_many(ranges)
            if self._pinned:
                ranges = self._pinned.missing_many(ranges)
            if self._leases and ranges:
                union = self._lease_union()
                # Kept for a reader's lease: a run's lease goes back through here again, but a block's
                # (`_leased`: a receive, a read) does not, so it drops them when it ends. Else a record
                # released while another run received from it stayed held for good.
                self._doomed.add_many(union.held_many(ranges))
                ranges = union.missing_many(ranges)
            if self._doomed and ranges:
                self._doomed.remove_many(ranges)
            self._have.remove_many(ranges)  # one sweep: thousands of row runs may be held and released
            self._give_back_pages(ranges)
            first = self._have.first() or (0, 0)
            self._prefix_end = first[1] if first[0] == 0 else 0

    def _give_back_pages(self, released: list[tuple[int, int]], done: tuple | None = None) -> None:
        """Hand the kernel back the pages around `released` that nothing needs (`_unneeded_pages`; under
        `_lock`)."""
        if self._map is None:
            return
        for lo, hi in self._unneeded_pages(released, done):
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def _unneeded_pages(self, released: list[tuple[int, int]], done: tuple | None = None) -> list[tuple[int, int]]:
        """The pages around `released` (just removed from what is held) that hold no byte still held, leased,
        pinned or being fetched (an in-flight claim's hull: its bytes land after this look, under no lock), so
        giving them back loses nothing anyone needs (under `_lock`)."""
        # The released runs of one record as one span of pages, the pages between them too: a rank's row
        # runs (one every 4-11 KB) gave thousands of spans, each a madvise, all under `_lock` (17 ms a release
        # of W1's rank 0 of 4, its exact rows; benchmarks/RESULTS.md). A page between them that holds
        # nothing anyone needs has nothing to lose; one that does is busy below.
        pages = _pages_around(released, GIVE_BACK_GAP)
        if not pages:
            return []
        busy = self._have.held_many(pages)
        if self._leases:
            busy += self._lease_union().held_many(pages)
        if self._pinned:
            busy += self._pinned.held_many(pages)
        if self._unwritten:
            busy += self._unwritten.held_many(pages)
        busy += [(c[0], c[1]) for c in self._inflight if c is not done]
        return _free_pages(pages, busy)

    def held_bytes(self) -> int:
        """Bytes of the object now in memory (fetched or copied from the cache, not yet released)."""
        with self._lock:
            return self._have.total()

    def ensure_header(self, offset: int, length: int) -> None:
        """`ensure` for a parser that reads many small fields (GGUF's metadata): reads ahead to the next
        256 KiB boundary, so a header costs a few requests, not one per field."""
        if offset + length <= self._prefix_end:  # the common case while a header is parsed: no lock
            return
        if self._have.missing(offset, min(self.size, offset + length)):
            end = min(self.size, -(-(offset + length) // HEADER_READAHEAD) * HEADER_READAHEAD)
            self.ensure(offset, end - offset)
        with self._lock:
            first = self._have.first() or (0, 0)
            self._prefix_end = first[1] if first[0] == 0 else 0

    # --- the SourceFile interface ------------------------------------------------------------------------
    def whole_view(self) -> np.ndarray:
        """The whole map (read-only), holes included: only for readers that `ensure` or `ensure_header` each
        range first (header parsers; the executors, which fetch each step's exact ranges: `run/fetch.py`)."""
        return self._view

    def read(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) as a copy (the object's first 64 KiB came with its identity, so
        a header that fits costs no request)."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(f"{self.path}: wants bytes [{offset}, {offset + length}) but the object has {self.size} "
                              "bytes")
        with self._leased([(offset, offset + length)]):  # no other run's release drops them before the copy
            self.ensure(offset, length)
            return bytes(self._buffer[offset:offset + length])

    def view(self, offset: int, length: int) -> np.ndarray:
        """A read-only uint8 view of [offset, offset+length), fetched first if missing. The bytes stay in memory
        for as long as the file does: the caller's array aliases them (`release` skips them)."""
        self.ensure_pinned([(offset, offset + length)])
        return self._view[offset:offset + length]

    def ensure_pinned(self, ranges: list[tuple[int, int]]) -> None:
        """`ensure_ranges`, then `pin`, under a lease: another run's release cannot drop the bytes between the
        fetch and the pin (sorted `ranges`; what `view` and the executors' zero-copy results use)."""
        with self._leased(ranges):
            self.ensure_ranges(ranges)
            self.pin(ranges)

    def pin(self, ranges: list[tuple[int, int]]) -> None:
        """Never release these bytes: an array handed to a caller (a view, a zero-copy result) aliases them."""
        with self._lock:
            self._pinned.add_many(ranges)

    def prefetch(self, offset: int, length: int) -> None:
        """Start fetching [offset, offset+length) in the background; returns at once. (Its own thread: the
        fetch pool's workers never wait on the fetch pool.)"""
        threading.Thread(target=self._quiet_ensure, args=(offset, length), daemon=True,
                         name="lazyweights-prefetch").start()

    def _quiet_ensure(self, offset: int, length: int) -> None:
        try:
            self.ensure(offset, length)
        except Exception as e:  # a hint only: the read that needs these bytes reports the failure
            _log.debug("prefetch of %s bytes [%d, %d) failed: %s", self.path, offset, offset + length, e)

    def changed(self) -> str | None:
        """Always None: every fetch is checked against the ETag and length the object had when opened."""
        return None

    def check_unchanged(self, tensor: str | None = None) -> None:
        """Nothing to do up front: each ranged reply is validated (If-Match, Content-Range) as it arrives."""

    def __repr__(self) -> str:
        return f"RemoteFile({self.path!r}, {self.size} bytes, {self.bytes_fetched} fetched)"

    def __reduce__(self):  # dask.distributed: a worker opens its own map, of the same object version
        return (RemoteFile.reopen, (self.path, self.options, self.cache_dir, self.size, self.etag))
