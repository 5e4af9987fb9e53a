"""Checkpoint files in object storage (HTTP(S), S3), read by byte range into a sparse local mirror.

A `RemoteFile` has the interface the readers and the executors already use for a local `SourceFile`
(`path`, `size`, `read`, `view`, `prefetch`, `check_unchanged`), so everything above works unchanged on a URL.
Its bytes live in a sparse local file of the object's size, memory-mapped read-only. `view(offset, length)`
first makes sure that exactly those bytes have been fetched: the missing parts of the range (what is neither
fetched nor being fetched by another thread) are cut into parts of at most `part_size` bytes and fetched
concurrently by a bounded pool, with adjacent missing bytes coalesced into one request. A tensor's bytes are
therefore fetched once, by whichever block needs them first; GGUF headers are read ahead in 256 KiB steps.

Every ranged reply is checked before its bytes are used: status 206 with the requested `Content-Range` and
the object's length, and the ETag the object had when it was opened (HTTP `If-Match`, S3 `IfMatch`; a reply
whose own ETag differs is refused too). An object replaced while it is read is a `SourceChangedError`, never
a file of mixed bytes. 5xx replies, dropped connections, timeouts and truncated bodies are retried with
exponential backoff; what still fails is a `RemoteError` naming the URL, the range and the reason.

With `cache=DIR`, the sparse mirror and the list of ranges it holds persist (`DIR/<sha256 of the URL>.data`
and `.json`), keyed by URL + ETag + length: the next run fetches only what is missing, and an object whose
ETag or length changed is fetched anew, never served stale.

HTTP goes through `requests` and S3 through `boto3`: fsspec's HTTP `cat_file` accepts a full 200 reply to a
range request (and reads the whole object), and s3fs cannot send `IfMatch`, so neither can give the checks
above. Options use fsspec's names (`storage_options={"endpoint_url": ..., "key": ..., "secret": ...}`), the
ones dask users already write.

Example (a local HTTP server; nothing here is specific to it):
    >>> import http.server, threading, tempfile, os, functools
    >>> root = tempfile.mkdtemp(); open(os.path.join(root, "blob"), "wb").write(bytes(range(256)) * 64)
    16384
    >>> class Quiet(http.server.SimpleHTTPRequestHandler):
    ...     def log_message(self, *a): pass
    >>> handler = functools.partial(Quiet, directory=root)
    >>> srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    >>> threading.Thread(target=srv.serve_forever, daemon=True).start()
    >>> f = RemoteFile(f"http://127.0.0.1:{srv.server_port}/blob")
    >>> f.size
    16384
    >>> bytes(f.view(250, 8))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lazyweights.core.errors.RemoteError: http://127.0.0.1:.../blob: bytes [250, 258): the server ignored the ...
    >>> srv.shutdown()
"""
from __future__ import annotations

import bisect
import contextlib
import contextvars
import hashlib
import json
import mmap
import os
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np

from ..core.errors import RemoteError, SourceChangedError
from .atomic import write_file_atomically

URL_SCHEMES = ("http://", "https://", "s3://")
HEADER_READAHEAD = 256 << 10
DEFAULT_PART_SIZE = 8 << 20
MULTI_RANGE = 200  # ranges per multi-range request: about 5 KB of Range header, under nginx's 8 KB limit


def is_url(path: Any) -> bool:
    """True for the object-storage URLs lazyweights reads (`http://`, `https://`, `s3://`).

    >>> is_url("s3://bucket/model.safetensors"), is_url("/data/model.safetensors")
    (True, False)
    """
    return isinstance(path, str) and path.lower().startswith(URL_SCHEMES)


# --- options carried from load_weights to every file it opens ------------------------------------------
_OPTIONS: contextvars.ContextVar[tuple[dict, str | None]] = contextvars.ContextVar("lazyweights_remote",
                                                                                  default=({}, None))


@contextlib.contextmanager
def remote_options(storage_options: dict | None = None, cache: str | None = None) -> Iterator[None]:
    """Within the block, remote files are opened with these `storage_options` and this `cache` directory."""
    token = _OPTIONS.set((dict(storage_options or {}), os.path.expanduser(cache) if cache else None))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def current_options() -> tuple[dict, str | None]:
    """The (storage_options, cache) in force (see `remote_options`)."""
    return _OPTIONS.get()


# --- byte ranges ------------------------------------------------------------------------------------------
class RangeSet:
    """Disjoint, sorted, merged half-open byte ranges.

    >>> r = RangeSet(); r.add(0, 10); r.add(20, 30); r.add(10, 15)
    >>> r.ranges, r.missing(5, 25)
    ([(0, 15), (20, 30)], [(15, 20)])
    """

    def __init__(self, ranges=()):
        self.ranges: list[tuple[int, int]] = []
        for s, e in ranges:
            self.add(s, e)

    def add(self, start: int, end: int) -> None:
        """Mark [start, end) held, merging it with the ranges it touches or overlaps; an empty range is ignored."""
        if end <= start:
            return
        i = bisect.bisect_left(self.ranges, (start, start))
        if i and self.ranges[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(self.ranges) and self.ranges[j][0] <= end:
            start, end = min(start, self.ranges[j][0]), max(end, self.ranges[j][1])
            j += 1
        self.ranges[i:j] = [(start, end)]

    def add_many(self, ranges: list[tuple[int, int]]) -> None:
        """Add many ranges in one merge (O(n + m)); `add` one by one would be O(n) each.

        >>> r = RangeSet([(0, 4)]); r.add_many([(10, 12), (2, 6), (12, 14)]); r.ranges
        [(0, 6), (10, 14)]
        """
        merged: list[tuple[int, int]] = []
        for s, e in sorted(self.ranges + [r for r in ranges if r[1] > r[0]]):
            if merged and s <= merged[-1][1]:
                if e > merged[-1][1]:
                    merged[-1] = (merged[-1][0], e)
            else:
                merged.append((s, e))
        self.ranges = merged

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) not held yet, in order (what a fetch of that range must still get)."""
        out, pos = [], start
        i = max(0, bisect.bisect_right(self.ranges, (start, start)) - 1)
        for s, e in self.ranges[i:]:
            if s >= end:
                break
            if e <= pos:
                continue
            if s > pos:
                out.append((pos, min(s, end)))
            pos = max(pos, e)
        if pos < end:
            out.append((pos, end))
        return out

    def missing_many(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """`missing` for many sorted ranges in one sweep (O(n + m)).

        >>> RangeSet([(0, 10), (20, 30)]).missing_many([(5, 12), (15, 25), (28, 40)])
        [(10, 12), (15, 20), (30, 40)]
        """
        out, have, i = [], self.ranges, 0
        for start, end in ranges:
            pos = start
            while i < len(have) and have[i][1] <= pos:
                i += 1
            j = i
            while j < len(have) and have[j][0] < end:
                if have[j][0] > pos:
                    out.append((pos, have[j][0]))
                pos = max(pos, have[j][1])
                j += 1
            if pos < end:
                out.append((pos, end))
        return out

    def total(self) -> int:
        """How many bytes are held (the sum of the ranges' lengths)."""
        return sum(e - s for s, e in self.ranges)


# --- the two backends: identity (length, ETag) and one validated ranged GET --------------------------------
class _Transient(Exception):
    """A failure worth retrying (5xx, dropped connection, timeout, truncated body)."""


def _content_range(value: str | None) -> tuple[int, int, int] | None:
    m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", value or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)) + 1, (int(m.group(3)) if m.group(3) != "*" else -1)


class _HTTP:
    def __init__(self, url: str, options: dict):
        self.url = url
        self.timeout = float(options.get("timeout", 30))
        self.headers = dict(options.get("headers", {}))
        self._local = threading.local()

    def _session(self):
        import requests

        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
            s.headers.update(self.headers)
        return s

    def _status_error(self, r, what: str) -> RemoteError:
        return RemoteError(f"{self.url}: {what}: HTTP {r.status_code} {r.reason}", url=self.url, status=r.status_code)

    def identity(self) -> tuple[int, str | None]:
        import requests

        try:
            r = self._session().head(self.url, allow_redirects=True, timeout=self.timeout)
        except requests.Timeout:
            raise _Transient(f"timed out after {self.timeout:g} s (storage_options['timeout'])") from None
        except requests.ConnectionError as e:
            raise _Transient(f"connection failed: {e}") from None
        if r.status_code >= 500:
            raise _Transient(f"HTTP {r.status_code} {r.reason}")
        if r.status_code != 200:
            raise self._status_error(r, "cannot open")
        try:
            size = int(r.headers["Content-Length"])
        except (KeyError, ValueError):
            raise RemoteError(f"{self.url}: the server gives no Content-Length, so the object's size is unknown",
                              url=self.url) from None
        return size, r.headers.get("ETag")

    def get(self, start: int, end: int, size: int, etag: str | None, out: _FileSink) -> None:
        import requests
        import urllib3

        headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        if etag and not etag.startswith("W/"):
            headers["If-Match"] = etag
        try:
            with self._session().get(self.url, headers=headers, stream=True, timeout=self.timeout) as r:
                if r.status_code in (412, 416):
                    raise SourceChangedError(
                        f"{self.url}: the object changed after it was opened (HTTP {r.status_code} for bytes "
                        f"[{start}, {end}) of the {size}-byte object with ETag {etag}). Reload it with load_weights().")
                if r.status_code >= 500:
                    raise _Transient(f"HTTP {r.status_code} {r.reason}")
                if r.status_code == 200:
                    if start == 0 and end == size:
                        pass
                    else:
                        raise RemoteError(
                            f"{self.url}: bytes [{start}, {end}): the server ignored the Range header (status 200 "
                            f"with the whole {r.headers.get('Content-Length', '?')}-byte object); serve the "
                            f"checkpoint from a server that supports range requests", url=self.url, status=200)
                elif r.status_code != 206:
                    raise self._status_error(r, f"bytes [{start}, {end})")
                else:
                    got = _content_range(r.headers.get("Content-Range"))
                    if got is None or got[:2] != (start, end):
                        raise RemoteError(f"{self.url}: asked for bytes [{start}, {end}) but the reply's "
                                          f"Content-Range is {r.headers.get('Content-Range')!r}", url=self.url)
                    if got[2] not in (-1, size):
                        raise SourceChangedError(f"{self.url}: the object's length changed from {size} to "
                                                 f"{got[2]} bytes after it was opened. Reload it with load_weights().")
                reply_etag = r.headers.get("ETag")
                if etag and reply_etag and reply_etag != etag:
                    raise SourceChangedError(f"{self.url}: the object changed after it was opened (ETag {etag} "
                                             f"became {reply_etag}). Reload it with load_weights().")
                _read_body(r.raw.read, out, start, end, r.raw)
        except requests.Timeout:
            raise _Transient(f"timed out after {self.timeout:g} s (storage_options['timeout'])") from None
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as e:
            raise _Transient(f"connection dropped: {e}") from None
        except (RemoteError, SourceChangedError):
            raise
        except (OSError, urllib3.exceptions.HTTPError) as e:  # ProtocolError / IncompleteRead: a body cut short
            raise _Transient(f"truncated body: {e}") from None


    def get_many(self, ranges: list[tuple[int, int]], size: int, etag: str | None) -> list[bytes] | None:
        """Several small ranges in one multi-range request (`multipart/byteranges`), each part checked against
        what was asked; None when the server does not do multi-range (the caller then asks one by one)."""
        import requests
        import urllib3

        headers = {"Range": "bytes=" + ",".join(f"{s}-{e - 1}" for s, e in ranges), "Accept-Encoding": "identity"}
        if etag and not etag.startswith("W/"):
            headers["If-Match"] = etag
        try:
            with self._session().get(self.url, headers=headers, stream=True, timeout=self.timeout) as r:
                if r.status_code in (412, 416):
                    raise SourceChangedError(f"{self.url}: the object changed after it was opened (HTTP "
                                             f"{r.status_code}). Reload it with load_weights().")
                if r.status_code >= 500:
                    raise _Transient(f"HTTP {r.status_code} {r.reason}")
                kind = r.headers.get("Content-Type", "")
                if r.status_code != 206 or not kind.startswith("multipart/byteranges"):
                    return None  # a whole object, or only a single range: not multi-range capable
                boundary = kind.split("boundary=", 1)[1].strip().strip('"').encode()
                body = r.raw.read(decode_content=False)
        except requests.Timeout:
            raise _Transient(f"timed out after {self.timeout:g} s (storage_options['timeout'])") from None
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError, OSError,
                urllib3.exceptions.HTTPError) as e:
            raise _Transient(f"multi-range body failed: {e}") from None
        parts: list[bytes] = []
        pos = 0
        for s, stop in ranges:
            head = body.find(b"--" + boundary, pos)
            blank = body.find(b"\r\n\r\n", head)
            if head < 0 or blank < 0:
                raise _Transient(f"truncated multi-range body: {len(parts)} of {len(ranges)} parts arrived")
            got = None
            for line in body[head:blank].split(b"\r\n"):
                if line.lower().startswith(b"content-range:"):
                    got = _content_range(line.split(b":", 1)[1].strip().decode())
            if got is None or got[:2] != (s, stop) or got[2] not in (-1, size):
                raise SourceChangedError(f"{self.url}: a multi-range part for bytes [{s}, {stop}) came back as {got}: "
                                         "the object changed or the server reordered the parts")
            data = body[blank + 4:blank + 4 + (stop - s)]
            if len(data) != stop - s:
                raise _Transient(f"truncated multi-range body: part [{s}, {stop}) has {len(data)} bytes")
            parts.append(data)
            pos = blank + 4 + (stop - s)
        return parts


class _FileSink:
    """Where a ranged body goes: the mirror file at the range's offset, written with pwrite."""

    def __init__(self, fd: int, offset: int):
        self.fd, self.offset = fd, offset

    def write(self, pos: int, data: memoryview) -> None:
        done = 0
        while done < len(data):  # pwrite may write less than asked
            done += os.pwrite(self.fd, data[done:], self.offset + pos + done)


_BOUNCE = threading.local()
_BOUNCE_BYTES = 4 << 20


def _bounce_buffer() -> memoryview:
    """This thread's reusable receive buffer: allocated once, so it stays warm (fresh memory is slow here)."""
    buf = getattr(_BOUNCE, "view", None)
    if buf is None:
        buf = _BOUNCE.view = memoryview(bytearray(_BOUNCE_BYTES))
    return buf


def _read_body(read, out: _FileSink, start: int, end: int, stream=None) -> None:
    """Receive a ranged body's `end - start` bytes into `out` (the mirror, at the range's offset).

    `stream`: the urllib3 response under it (requests' `r.raw`, botocore's `Body._raw_stream`). Where it has
    http.client's response underneath, the bytes go from the socket into this thread's warm bounce buffer
    with `readinto` and from there into the file: two copies of each byte and no allocation, where `read`
    makes a fresh bytes object per megabyte (fresh memory, then copied again). Both see the same raw bytes:
    we ask for `Accept-Encoding: identity` and never decode. Why not receive straight into a writable map of
    the mirror: measured on this VM, a store into a file hole costs as much as the pwrite it saves, and a
    full disk would then be a SIGBUS instead of an OSError."""
    pos, want = 0, end - start
    fp = getattr(stream, "_fp", None)
    if fp is None or not hasattr(fp, "readinto") or int(getattr(stream, "_fp_bytes_read", 0) or 0):
        while pos < want:
            chunk = read(min(1 << 20, want - pos))
            if not chunk:
                raise _Transient(f"truncated body: {pos} of {want} bytes arrived")
            out.write(pos, memoryview(chunk))
            pos += len(chunk)
        return
    buf = _bounce_buffer()
    while pos < want:
        fill, room = 0, min(len(buf), want - pos)
        while fill < room:
            n = fp.readinto(buf[fill:room])
            if not n:
                raise _Transient(f"truncated body: {pos + fill} of {want} bytes arrived")
            fill += n
        out.write(pos, buf[:fill])
        pos += fill


class _S3:
    def __init__(self, url: str, options: dict):
        import boto3
        import botocore
        from botocore.config import Config

        self.url = url
        self.bucket, _, self.key = url[len("s3://"):].partition("/")
        client_kwargs = dict(options.get("client_kwargs", {}))
        for ours, theirs in (("endpoint_url", "endpoint_url"), ("key", "aws_access_key_id"),
                             ("secret", "aws_secret_access_key"), ("token", "aws_session_token"),
                             ("region_name", "region_name")):
            if ours in options:
                client_kwargs[theirs] = options[ours]
        timeout = float(options.get("timeout", 30))
        config = Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1},
                        max_pool_connections=32,
                        **({"signature_version": botocore.UNSIGNED} if options.get("anon") else {}))
        self.client = boto3.session.Session().client("s3", config=config, **client_kwargs)

    def _error(self, e, what: str):
        from botocore.exceptions import ClientError

        if isinstance(e, ClientError):
            code = e.response.get("Error", {}).get("Code", "")
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "InvalidRange") or status in (412, 416):
                return SourceChangedError(f"{self.url}: the object changed after it was opened ({what}: {code}). "
                                          "Reload it with load_weights().")
            if status and status >= 500:
                return _Transient(f"S3 {status} {code}")
            return RemoteError(f"{self.url}: {what}: S3 {status} {code}", url=self.url, status=status)
        return _Transient(f"{type(e).__name__}: {e}")

    def identity(self) -> tuple[int, str | None]:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key)
        except Exception as e:  # botocore raises ClientError and a family of connection errors
            raise self._error(e, "cannot open") from None
        return int(head["ContentLength"]), head.get("ETag")

    def get(self, start: int, end: int, size: int, etag: str | None, out: _FileSink) -> None:
        kwargs = {"IfMatch": etag} if etag else {}
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={start}-{end - 1}", **kwargs)
        except Exception as e:
            raise self._error(e, f"bytes [{start}, {end})") from None
        got = _content_range(r.get("ContentRange"))
        if got is None and not (start == 0 and end == size):
            raise RemoteError(f"{self.url}: bytes [{start}, {end}): the reply has no Content-Range", url=self.url)
        if got is not None and (got[:2] != (start, end) or got[2] not in (-1, size)):
            raise SourceChangedError(f"{self.url}: asked for bytes [{start}, {end}) of {size} but got "
                                     f"{r.get('ContentRange')!r}: the object changed. Reload it with load_weights().")
        if etag and r.get("ETag") and r["ETag"] != etag:
            raise SourceChangedError(f"{self.url}: the object changed after it was opened (ETag {etag} became "
                                     f"{r['ETag']})")
        try:
            _read_body(r["Body"].read, out, start, end, getattr(r["Body"], "_raw_stream", None))
        except OSError as e:
            raise _Transient(f"reading the body failed: {e}") from None
        finally:
            r["Body"].close()

    def list(self) -> list[str]:
        """The object URLs under this prefix (sorted)."""
        prefix = self.key.rstrip("/") + "/" if self.key else ""
        out = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                out += [f"s3://{self.bucket}/{o['Key']}" for o in page.get("Contents", [])]
        except Exception as e:
            raise self._error(e, "cannot list the prefix") from None
        return sorted(out)


def _backend(url: str, options: dict):
    return _S3(url, options) if url.lower().startswith("s3://") else _HTTP(url, options)


def list_prefix(url: str, storage_options: dict | None = None) -> list[str]:
    """The objects under an `s3://bucket/prefix` (what `load_weights` does with a prefix)."""
    return _S3(url, dict(storage_options or {})).list()


def fetch_small(url: str, limit: int = 64 << 20) -> bytes:
    """The whole object at `url` (an index JSON, a config), refusing objects over `limit` bytes; opened with
    the `remote_options` in force."""
    f = RemoteFile.open(url, *current_options())
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


# --- the file ---------------------------------------------------------------------------------------------
class RemoteFile:
    """One remote object, read by validated byte ranges into a sparse, memory-mapped local mirror.

    Options (`storage_options`, fsspec's names where they exist): `endpoint_url`, `key`, `secret`, `token`,
    `region_name`, `anon`, `client_kwargs` (S3); `headers` (HTTP); `timeout` (seconds per request, 30),
    `retries` (5), `max_concurrency` (parallel requests, 8), `part_size` (bytes per request, 8 MiB).
    """

    _cache: dict[tuple, RemoteFile] = {}
    _cache_lock = threading.Lock()

    def __init__(self, url: str, storage_options: dict | None = None, cache: str | None = None):
        self.path = url
        self.options = dict(storage_options or {})
        self.cache_dir = cache
        self.retries = int(self.options.get("retries", 5))
        self.part_size = max(1 << 16, int(self.options.get("part_size", DEFAULT_PART_SIZE)))
        self.max_concurrency = max(1, int(self.options.get("max_concurrency", 8)))
        self._backend = _backend(url, self.options)
        self.size, self.etag = self._retrying(self._backend.identity, "cannot open")
        self.bytes_fetched = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._have = RangeSet()
        self._inflight: list[tuple[int, int, threading.Event]] = []
        self._prefix_end = 0  # bytes [0, _prefix_end) are known to be present
        self._multi_range = True  # until the server answers a multi-range request with something else
        self._pool: ThreadPoolExecutor | None = None
        self._open_mirror()

    @classmethod
    def open(cls, url: str, storage_options: dict | None = None, cache: str | None = None) -> RemoteFile:
        """The shared RemoteFile for `url` with these options (one mirror per process)."""
        key = (url, json.dumps(storage_options or {}, sort_keys=True, default=str), cache)
        with cls._cache_lock:
            f = cls._cache.get(key)
            if f is None:
                f = cls._cache[key] = cls(url, storage_options, cache)
            return f

    # --- the mirror --------------------------------------------------------------------------------------
    def _open_mirror(self) -> None:
        self._meta_path = None
        if self.cache_dir:
            os.makedirs(self.cache_dir, exist_ok=True)
            stem = os.path.join(self.cache_dir, hashlib.sha256(self.path.encode()).hexdigest()[:32])
            self._meta_path = stem + ".json"
            try:
                with open(self._meta_path) as fh:
                    meta = json.load(fh)
            except (OSError, ValueError):
                meta = None
            fresh = not (isinstance(meta, dict) and meta.get("url") == self.path and meta.get("size") == self.size
                         and meta.get("etag") == self.etag and self.etag is not None)
            fd = os.open(stem + ".data", os.O_RDWR | os.O_CREAT, 0o644)
            if fresh:  # a changed object (or no ETag to tell): nothing held is trusted
                os.ftruncate(fd, 0)
            else:
                self._have = RangeSet(tuple(r) for r in meta.get("ranges", []))
        else:
            fd, tmp = tempfile.mkstemp(prefix="lazyweights-remote-", dir=self.options.get("scratch_dir"))
            os.unlink(tmp)  # anonymous: gone with the process
        os.ftruncate(fd, self.size)  # sparse: holes cost no disk
        self._fd = fd
        self._map = mmap.mmap(fd, self.size, access=mmap.ACCESS_READ) if self.size else None
        self._buffer = np.frombuffer(self._map, np.uint8) if self._map is not None else np.empty(0, np.uint8)

    def _save_meta(self) -> None:
        if self._meta_path is None:
            return
        doc = {"url": self.path, "size": self.size, "etag": self.etag, "ranges": self._have.ranges}
        # atomic (a reader never sees half of it), not durable: the .data beside it is not fsynced either,
        # and a lost or stale record only costs a re-fetch
        write_file_atomically(self._meta_path, json.dumps(doc).encode(), fsync=False)

    # --- fetching ----------------------------------------------------------------------------------------
    def _retrying(self, call, what: str, *args):
        delay = 0.1
        for attempt in range(self.retries + 1):
            try:
                return call(*args)
            except _Transient as e:
                if attempt == self.retries:
                    raise RemoteError(f"{self.path}: {what}: {e} (after {self.retries + 1} attempts)",
                                      url=self.path) from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _fetch_part(self, start: int, end: int) -> None:
        # a failed attempt may leave some bytes written, but the range is marked held only after success
        self._retrying(self._backend.get, f"bytes [{start}, {end})", start, end, self.size, self.etag,
                       _FileSink(self._fd, start))
        with self._lock:
            self.bytes_fetched += end - start
            self.requests += 1

    def ensure(self, offset: int, length: int) -> None:
        """Make bytes [offset, offset+length) present in the mirror, fetching only what is missing."""
        end = min(self.size, offset + length)
        while offset < end:
            with self._lock:
                missing = self._have.missing(offset, end)
                if not missing:
                    return
                waiting = [ev for s, e, ev in self._inflight if s < end and e > offset]
                mine = []
                for s, e in missing:  # claim what nobody is fetching
                    for a, b, _ in self._inflight:
                        if a < e and b > s:
                            break
                    else:
                        ev = threading.Event()
                        self._inflight.append((s, e, ev))
                        mine.append((s, e, ev))
            if mine:
                try:
                    self._fetch_ranges([(s, e) for s, e, _ in mine])
                    with self._lock:
                        for s, e, _ in mine:
                            self._have.add(s, e)
                        self._save_meta()
                finally:
                    with self._lock:
                        for item in mine:
                            self._inflight.remove(item)
                            item[2].set()
            else:
                for ev in waiting:
                    ev.wait()

    def _fetch_ranges(self, ranges: list[tuple[int, int]]) -> None:
        parts = [(p, min(p + self.part_size, e)) for s, e in ranges for p in range(s, e, self.part_size)]
        if len(parts) == 1:
            self._fetch_part(*parts[0])
            return
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="lazyweights-fetch")
        futures = [self._pool.submit(self._fetch_part, s, e) for s, e in parts]
        error = None
        for f in futures:
            try:
                f.result()
            except BaseException as e:  # wait for every part in flight, then raise the first failure
                error = error or e
        if error is not None:
            raise error

    def ensure_ranges(self, ranges: list[tuple[int, int]], small: int = 256 << 10) -> None:
        """Make many sorted byte ranges present (a rank's strided slice: one run per row). What is missing and not
        in flight elsewhere is claimed, then fetched: large pieces in `part_size` parts, small ones with
        multi-range requests of up to `MULTI_RANGE` ranges where the server does multi-range (nginx does; S3
        does not), else one request each, concurrently. Pieces another thread is fetching are waited for."""
        while True:
            with self._lock:
                missing = self._have.missing_many([(s, min(e, self.size)) for s, e in ranges])
                if not missing:
                    return
                # Claims are hulls (first byte, last byte) of what one caller fetches, so a rank slice's
                # thousands of runs are one claim, and the overlap test stays cheap (a few claims at a time).
                # A hull is conservative: a piece inside another caller's hull waits, then is re-checked.
                claims = sorted(self._inflight)
                free: list[tuple[int, int]] = []
                waiting: set[threading.Event] = set()
                for s, e in missing:
                    i = bisect.bisect_left(claims, (e,))
                    busy = [c for c in claims[max(0, i - len(claims)):i] if c[1] > s]
                    if busy:
                        waiting.update(c[2] for c in busy)
                    else:
                        free.append((s, e))
                mine = (free[0][0], free[-1][1], threading.Event()) if free else None
                if mine is not None:
                    self._inflight.append(mine)
            try:
                if mine is not None:
                    self._fetch_claimed(free, small)
            finally:
                if mine is not None:
                    with self._lock:
                        self._inflight.remove(mine)
                        mine[2].set()
            for ev in waiting:
                ev.wait()

    def _fetch_claimed(self, pieces: list[tuple[int, int]], small: int) -> None:
        big = [(s, e) for s, e in pieces if e - s >= small]
        little = [(s, e) for s, e in pieces if e - s < small]
        if big:
            self._fetch_ranges(big)
            with self._lock:
                self._have.add_many(big)
                self._save_meta()
        if not little:
            return
        batches = [little[i:i + MULTI_RANGE] for i in range(0, len(little), MULTI_RANGE)]
        if len(batches) == 1:
            self._fetch_batch(batches[0])
            return
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="lazyweights-fetch")
        futures = [self._pool.submit(self._fetch_batch, b) for b in batches]
        error = None
        for f in futures:
            try:
                f.result()
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def _fetch_batch(self, batch: list[tuple[int, int]]) -> None:
        get_many = getattr(self._backend, "get_many", None)
        parts = None
        if get_many is not None and self._multi_range and len(batch) > 1:
            what = f"{len(batch)} ranges from byte {batch[0][0]}"
            parts = self._retrying(get_many, what, batch, self.size, self.etag)
            if parts is None:
                self._multi_range = False
        if parts is None:
            for s, e in batch:
                self._fetch_part(s, e)
        else:
            for (s, _end), data in zip(batch, parts):
                os.pwrite(self._fd, data, s)
        with self._lock:
            self._have.add_many(batch)
            if parts is not None:
                self.bytes_fetched += sum(e - s for s, e in batch)
                self.requests += 1
        with self._lock:
            self._save_meta()

    def ensure_header(self, offset: int, length: int) -> None:
        """`ensure` for a parser that reads many small fields (GGUF's metadata): reads ahead to the next
        256 KiB boundary, so a header costs a few requests, not one per field."""
        if offset + length <= self._prefix_end:  # the common case while a header is parsed: no lock
            return
        if self._have.missing(offset, min(self.size, offset + length)):
            end = min(self.size, -(-(offset + length) // HEADER_READAHEAD) * HEADER_READAHEAD)
            self.ensure(offset, end - offset)
        with self._lock:
            first = self._have.ranges[0] if self._have.ranges else (0, 0)
            self._prefix_end = first[1] if first[0] == 0 else 0

    # --- the SourceFile interface ------------------------------------------------------------------------
    def whole_view(self) -> np.ndarray:
        """The whole mirror, holes included: only for readers that `ensure` or `ensure_header` each range first
        (header parsers; the executors, which fetch each step's exact ranges first: `run/fetch.py`)."""
        return self._buffer

    def read(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) as a copy (fetched exactly: a safetensors header is two reads)."""
        from ..core.errors import FormatError

        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(f"{self.path}: wants bytes [{offset}, {offset + length}) but the object has {self.size} "
                              "bytes")
        self.ensure(offset, length)
        return bytes(self._buffer[offset:offset + length])

    def view(self, offset: int, length: int) -> np.ndarray:
        """A read-only uint8 view of [offset, offset+length), fetched first if missing."""
        self.ensure(offset, length)
        return self._buffer[offset:offset + length]

    def prefetch(self, offset: int, length: int) -> None:
        """Start fetching [offset, offset+length) in the background; returns at once. (Its own thread: the
        fetch pool's workers never wait on the fetch pool.)"""
        threading.Thread(target=self._quiet_ensure, args=(offset, length), daemon=True,
                         name="lazyweights-prefetch").start()

    def _quiet_ensure(self, offset: int, length: int) -> None:
        try:
            self.ensure(offset, length)
        except BaseException:  # a hint only: the read that needs these bytes reports the failure
            pass

    def changed(self) -> str | None:
        """Always None: every fetch is checked against the ETag and length the object had when opened."""
        return None

    def check_unchanged(self, tensor: str | None = None) -> None:
        """Nothing to do up front: each ranged reply is validated (If-Match, Content-Range) as it arrives."""

    def __repr__(self) -> str:
        return f"RemoteFile({self.path!r}, {self.size} bytes, {self.bytes_fetched} fetched)"

    def __reduce__(self):  # dask.distributed: a worker opens its own mirror
        return (RemoteFile.open, (self.path, self.options, self.cache_dir))
