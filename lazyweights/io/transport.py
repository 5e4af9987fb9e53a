"""One validated ranged GET, from the socket into the caller's memory: HTTP(S) through urllib3
(`io/http_backend.py`, and GCS on it: `io/gcs_backend.py`), S3 through `boto3`; and what they share (body
reads, multi-range parsing, errors).

A backend answers two questions: `identity()`, the object's (length, ETag) (`first_bytes` gives the same
with the object's first bytes, in one request), and `get(start, end, size, etag, out)`, which receives
bytes [start, end) straight into `out` (a writable memoryview: the mirror the kernels read). `get_many` does
the same for many ranges in one multi-range request where the server takes them.

Every reply is checked before its bytes count: status 206 with the requested `Content-Range` and the object's
length, and the ETag the object had when it was opened (HTTP `If-Match`, S3 `IfMatch`; a reply whose own ETag
differs is refused too). A changed object is a `SourceChangedError`; 5xx replies, dropped connections, timeouts
and truncated bodies are `Transient` (the caller retries them); anything else is a `RemoteError` naming the URL.

Why not fsspec or obstore for the bytes: fsspec's HTTP `cat_file` accepts a full 200 reply to a range request,
s3fs cannot send `IfMatch`, and neither receives into the caller's buffer; obstore returns its own buffers
(one more copy of every byte) and was measured against this path in benchmarks/bench_transport.py.

The HTTP(S) backend is `io/http_backend.HTTPBackend`, Google Cloud Storage's `io/gcs_backend.GCSBackend` (an
HTTPBackend pinned to the object's generation); `io/remote.backend(url, options)` picks one for a URL.
"""
from __future__ import annotations

import re
import threading

from ..core.errors import RemoteError, SourceChangedError, UsageError


class Transient(Exception):
    """A failure worth retrying (5xx, dropped connection, timeout, truncated body)."""


def content_range(value: str | None) -> tuple[int, int, int] | None:
    """(start, end, total) of a `Content-Range: bytes a-b/n` value (end exclusive; total -1 for `*`).

    >>> content_range("bytes 0-9/100"), content_range("nonsense")
    ((0, 10, 100), None)
    """
    m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", value or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)) + 1, (int(m.group(3)) if m.group(3) != "*" else -1)


def changed_error(url: str, what: str) -> SourceChangedError:
    """The `SourceChangedError` for an object found changed since it was opened (`what` says how).

    >>> print(changed_error("http://h/m.safetensors", "ETag \\"a\\" became \\"b\\""))
    http://h/m.safetensors: the object changed after it was opened (ETag "a" became "b"). Reload it with load_weights().
    """
    return SourceChangedError(f"{url}: the object changed after it was opened ({what}). Reload it with load_weights().")


class Converting:
    """A destination that converts what arrives instead of keeping it: `convert(piece, offset)` is handed each
    piece of the range's bytes as it arrives (a uint8 memoryview of whole `unit`s, in the receiving thread's
    small warm buffer, reused for the next piece) with its offset in the range, and writes what it makes of it
    wherever it likes (a cast straight into the result: each byte read from the socket into cache and
    written once, converted). `len()` is the range's length, as for a memoryview destination.

    >>> got = []
    >>> dest = Converting(lambda piece, offset: got.append((offset, bytes(piece))), 6, unit=2)
    >>> chunks = iter([b"abc", b"def"])
    >>> read_body(lambda n: next(chunks, b""), dest)
    >>> got  # whole 2-byte units only: "c" waits for "d"
    [(0, b'ab'), (2, b'cdef')]

    `keep`: a writable memoryview of `nbytes` to receive into instead of the thread's buffer. The pieces are
    then handed on from their places in it, and after the body it holds every byte (for the cache's writer,
    `io/cached_receive.py`).

    >>> got, kept, chunks = [], memoryview(bytearray(6)), iter([b"abc", b"def"])
    >>> read_body(lambda n: next(chunks, b""), Converting(lambda p, o: got.append((o, bytes(p))), 6, 2, kept))
    >>> got, bytes(kept)
    ([(0, b'ab'), (2, b'cdef')], b'abcdef')
    """

    def __init__(self, convert, nbytes: int, unit: int = 1, keep: memoryview | None = None):
        self.convert, self.nbytes, self.unit = convert, int(nbytes), max(1, int(unit))
        if keep is not None and len(keep) != self.nbytes:
            raise UsageError(f"a {len(keep)}-byte buffer to keep a {self.nbytes}-byte body")
        self.keep = keep

    def __len__(self) -> int:
        return self.nbytes


BOUNCE_BYTES = 1 << 20  # a Converting destination's receive buffer: cache-sized, per thread
_BOUNCE = threading.local()


def _receive_some(read, fp, into: memoryview, pos: int, want: int) -> int:
    """Receive at least one byte and at most `len(into)` of a body into `into` (`pos` of `want` came before):
    `readinto` from the socket's file object where there is one, else a chunk from `read`, copied in."""
    if fp is not None:
        n = fp.readinto(into)
    else:
        chunk = read(len(into))
        n = len(chunk)
        into[:n] = chunk
    if not n:
        raise Transient(f"truncated body: {pos} of {want} bytes arrived")
    return n


def _read_converting(read, fp, dest: Converting) -> None:
    """`read_body` into a `Converting` destination: through this thread's warm buffer, a piece at a time,
    handing on whole units (the tail of a unit cut by the socket waits for the rest). The last piece may be a
    partial unit only when the range's length is not a whole number of units."""
    if dest.keep is not None:
        _read_converting_kept(read, fp, dest)
        return
    buf = getattr(_BOUNCE, "buf", None)
    if buf is None:
        buf = _BOUNCE.buf = memoryview(bytearray(BOUNCE_BYTES))
    pos, carry, want, unit = 0, 0, dest.nbytes, dest.unit
    while pos < want:
        n = _receive_some(read, fp, buf[carry:carry + min(len(buf) - carry, want - pos)], pos, want)
        have = carry + n
        whole = have if pos + n == want else have - have % unit
        if whole:
            dest.convert(buf[:whole], pos - carry)
        carry = have - whole
        if carry:
            buf[:carry] = buf[whole:have]
        pos += n


def _read_converting_kept(read, fp, dest: Converting) -> None:
    """`_read_converting` into `dest.keep`: each `BOUNCE_BYTES` piece lands at its place and is handed on from
    there (whole units: a unit the socket cut is handed on with the next piece), so the buffer ends whole."""
    buf, want, unit = dest.keep, dest.nbytes, dest.unit
    assert buf is not None
    pos = done = 0  # bytes received, bytes handed on
    while pos < want:
        pos += _receive_some(read, fp, buf[pos:pos + min(BOUNCE_BYTES, want - pos)], pos, want)
        whole = pos if pos == want else done + (pos - done) // unit * unit
        if whole > done:
            dest.convert(buf[done:whole], done)
            done = whole


def read_body(read, out, stream=None) -> None:
    """Receive exactly `len(out)` body bytes into `out` (a writable memoryview, or a `Converting` destination).

    `stream`: the urllib3 response under it (the HTTP backend's reply, botocore's `Body._raw_stream`). Where it has
    http.client's response underneath and nothing was read yet, the bytes go from the socket into `out` with
    `readinto`: one copy, no allocation. Otherwise `read` returns fresh chunks that are copied in."""
    pos, want = 0, len(out)
    fp = getattr(stream, "_fp", None)
    if not (hasattr(fp, "readinto") and not int(getattr(stream, "_fp_bytes_read", 0) or 0)):
        fp = None  # no socket to read into: `read` gives chunks
    if isinstance(out, Converting):
        _read_converting(read, fp, out)
        return
    if fp is not None:
        while pos < want:
            n = fp.readinto(out[pos:])
            if not n:
                raise Transient(f"truncated body: {pos} of {want} bytes arrived")
            pos += n
        return
    while pos < want:
        chunk = read(min(1 << 20, want - pos))
        if not chunk:
            raise Transient(f"truncated body: {pos} of {want} bytes arrived")
        out[pos:pos + len(chunk)] = chunk
        pos += len(chunk)


# A part header after its boundary line's `--boundary`: any headers, one of them Content-Range. One pattern for
# every boundary (nginx picks a new boundary for every reply: a pattern per boundary was compiled per request)
_PART_HEADER = re.compile(rb"\r\n(?:[^\r\n]*\r\n)*?Content-Range: *bytes (\d+)-(\d+)/(\d+|\*)\r\n"
                          rb"(?:[^\r\n]*\r\n)*?\r\n", re.IGNORECASE)
PREAMBLE_BYTES = 1 << 16  # how far into a multi-range body its first boundary is looked for


def unreachable_error(url: str, e: BaseException) -> RemoteError | None:
    """A RemoteError for a connection no retry can fix: refused (nothing listens at the host and port) or a host
    name that does not resolve; None for anything else (a dropped or timed-out connection is retried).
    Refused connections fail on the first attempt: waiting seconds for a server that is not there helps nobody.

    >>> import socket
    >>> err = OSError("wrapped"); err.__cause__ = ConnectionRefusedError(111, "Connection refused")
    >>> print(unreachable_error("http://127.0.0.1:9/m", err))  # doctest: +ELLIPSIS
    http://127.0.0.1:9/m: connection refused: nothing listens on 127.0.0.1:9; start the server or fix the host ...
    >>> unreachable_error("http://h/m", TimeoutError()) is None
    True
    """
    import socket
    from urllib.parse import urlsplit

    seen: set[int] = set()
    stack: list = [e]
    while stack:
        c = stack.pop()
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        parts = urlsplit(url)
        if isinstance(c, ConnectionRefusedError):
            where = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
            return RemoteError(f"{url}: connection refused: nothing listens on {where}; start the server or fix "
                               "the host and port in the URL", url=url)
        if isinstance(c, socket.gaierror) and c.errno != socket.EAI_AGAIN:  # EAI_AGAIN: DNS may come back
            return RemoteError(f"{url}: cannot resolve the host name {parts.hostname!r}; fix the host in the URL",
                               url=url)
        stack.extend([c.__cause__, c.__context__, getattr(c, "reason", None)])
        stack.extend(a for a in getattr(c, "args", ()) if isinstance(a, BaseException))
    return None


def split_parts(url: str, body, boundary: bytes, ranges, size: int, outs) -> None:
    r"""Check a whole `multipart/byteranges` body against the `ranges` asked for, in order, and copy each
    part's payload into its `outs` entry.

    Parts are found by position, never by searching payload bytes (a payload may hold the boundary): the
    first part's header is parsed, the others must start exactly where the previous payload ended with
    that header's bytes and their own Content-Range; a header that differs in anything else is parsed on
    its own. After the last part the closing delimiter must follow. A part for other bytes (or another
    object length) is a `SourceChangedError`; a misframed body (a part cut short or too long, an extra
    part, no closing delimiter) is `Transient`, so it is asked again.

    >>> b = b"--XY"
    >>> body = (b"\r\n--XY\r\nContent-Type: a/b\r\nContent-Range: bytes 0-2/10\r\n\r\nabc"
    ...         b"\r\n--XY\r\nContent-Type: a/b\r\nContent-Range: bytes 5-6/10\r\n\r\nfg\r\n--XY--\r\n")
    >>> outs = [memoryview(bytearray(3)), memoryview(bytearray(2))]
    >>> split_parts("u", memoryview(body), b, [(0, 3), (5, 7)], 10, outs)
    >>> bytes(outs[0]), bytes(outs[1])
    (b'abc', b'fg')
    >>> split_parts("u", memoryview(body), b, [(0, 3)], 10, outs[:1])
    Traceback (most recent call last):
    ...
    lazyweights.io.transport.Transient: malformed multi-range body: 1 part asked for, but byte 61 starts another part
    """
    pos, pre, mid, line = 0, b"", b"", b"\r\n" + boundary
    for i, ((s, e), out) in enumerate(zip(ranges, outs)):
        expected = b"%s%d-%d%s" % (pre, s, e - 1, mid) if i else b""
        if i and body[pos:pos + len(expected)] == expected:
            start = pos + len(expected)
        else:
            if i == 0:  # the first part may follow a preamble
                at = bytes(body[:PREAMBLE_BYTES]).find(boundary)
                m = _PART_HEADER.match(body, at + len(boundary)) if at >= 0 else None
            else:
                m = (_PART_HEADER.match(body, pos + len(line)) if body[pos:pos + len(line)] == line else None)
            if m is None:
                if i and pos >= len(body) - len(boundary):
                    raise Transient(f"truncated multi-range body: no part for bytes [{s}, {e})")
                raise Transient(f"malformed multi-range body: the part for bytes [{s}, {e}) does not start at byte "
                                f"{pos}, where the part before it ended (a part header that lies about its length)")
            got = (int(m.group(1)), int(m.group(2)) + 1, int(m.group(3)) if m.group(3) != b"*" else -1)
            if got[:2] != (s, e) or got[2] not in (-1, size):
                raise changed_error(url, f"a multi-range part for bytes [{s}, {e}) came back as {got}")
            if i == 0:  # the template of every next part: the same header but for its first and last byte
                pre = line + bytes(body[m.start():m.start(1)])
                mid = bytes(body[m.end(2):m.end()])
            start = m.end()
        stop = start + (e - s)
        if stop > len(body):
            raise Transient(f"truncated multi-range body: part [{s}, {e}) is cut short")
        out[:] = body[start:stop]
        pos = stop
    closing = b"\r\n" + boundary + b"--"
    if body[pos:pos + len(closing)] != closing:
        if body[pos:pos + len(closing) - 2] == closing[:-2]:
            raise Transient(f"malformed multi-range body: {len(ranges)} part{'s' if len(ranges) != 1 else ''} "
                            f"asked for, but byte {pos} starts another part")
        raise Transient(f"malformed multi-range body: the part for bytes [{ranges[-1][0]}, {ranges[-1][1]}) is "
                        f"not followed by the closing boundary at byte {pos} (a part header that lies about its "
                        "length)")


RECEIVE_LOWAT = 64 << 10  # a multi-range body is received a wake-up per this many bytes (SO_RCVLOWAT)


def receive_batched(raw, body) -> None:
    """`read_body` of a whole reply into `body`, asking the kernel (SO_RCVLOWAT) to wake the receiving thread
    once `RECEIVE_LOWAT` bytes are queued instead of per TCP segment: a multi-range reply arrives a small part
    per segment, and a wake-up per part cost more CPU than the parsing (benchmarks/RESULTS.md, issue 35).

    Only on a plain TCP socket with a timeout (its waits go through poll(), which also wakes under memory
    pressure), and never for the reply's last bytes: the kernel must always be owed at least the low-water
    mark, or the wait would last until the timeout. The bytes the file object may already buffer are counted
    as owed. Not under TLS: OpenSSL's own buffering would make what the kernel is owed unknowable."""
    import io
    import socket

    fp = getattr(raw, "_fp", None)
    sock = getattr(getattr(getattr(fp, "fp", None), "raw", None), "_sock", None)
    want = len(body)
    margin = max(io.DEFAULT_BUFFER_SIZE, 8192) + RECEIVE_LOWAT  # what the file object may hold, + the mark
    if (fp is None or type(sock) is not socket.socket or not sock.gettimeout() or want <= 2 * margin
            or not hasattr(socket, "SO_RCVLOWAT")):
        read_body(None, body, raw)
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RECEIVE_LOWAT)
        read_body(None, body[:want - margin], raw)
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
    read_body(None, body[want - margin:], raw)  # the last bytes at the default mark


_RECEIVE = threading.local()


def receive_buffer(nbytes: int) -> memoryview:
    """This thread's reusable receive buffer, at least `nbytes` long: allocated once and grown rarely, so it
    stays warm (fresh memory is slow to fault in on some VMs)."""
    buf = getattr(_RECEIVE, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _RECEIVE.buf = bytearray(max(nbytes, 1 << 20))
    return memoryview(buf)[:nbytes]


class S3Backend:
    """Ranged GetObject with boto3 (fsspec's option names: endpoint_url, key, secret, token, region_name, anon)."""

    multi_range = False  # S3 answers a multi-range GET with the whole object
    request_latency = 0.005  # seconds a request costs beyond its bytes (the cost model's default)

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
                return changed_error(self.url, f"{what}: {code}")
            if status and status >= 500:
                return Transient(f"S3 {status} {code}")
            return RemoteError(f"{self.url}: {what}: S3 {status} {code}", url=self.url, status=status)
        endpoint = self.client.meta.endpoint_url
        unreachable = unreachable_error(endpoint, e)
        if unreachable is not None:  # named by the endpoint's URL, which is where nothing listens
            return RemoteError(f"{self.url}: {what}: {unreachable} (storage_options['endpoint_url'])", url=self.url)
        return Transient(f"{type(e).__name__}: {e}")

    def identity(self) -> tuple[int, str | None]:
        """(length, ETag) from HeadObject."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key)
        except Exception as e:  # botocore raises ClientError and a family of connection errors
            raise self._error(e, "cannot open") from None
        return int(head["ContentLength"]), head.get("ETag")

    def first_bytes(self, length: int) -> tuple[int, str | None, bytes | None]:
        """(object length, ETag, its first `length` bytes) from one ranged GetObject (see HTTPBackend)."""
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes=0-{length - 1}")
        except Exception as e:
            from botocore.exceptions import ClientError

            if isinstance(e, ClientError) and e.response.get("Error", {}).get("Code") == "InvalidRange":
                return self.identity() + (b"",)  # an empty object has no byte 0
            raise self._error(e, "cannot open") from None
        try:
            got = content_range(r.get("ContentRange"))
            size = got[2] if got is not None and got[2] >= 0 else int(r["ContentLength"])
            want = min(size, length)
            if got is None and size > length:
                return size, r.get("ETag"), None
            buf = bytearray(want)
            read_body(r["Body"].read, memoryview(buf), getattr(r["Body"], "_raw_stream", None))
            return size, r.get("ETag"), bytes(buf)
        except OSError as e:
            raise Transient(f"reading the body failed: {e}") from None
        finally:
            r["Body"].close()

    def get(self, start: int, end: int, size: int, etag: str | None, out) -> None:
        """Bytes [start, end) of the `size`-byte object with `etag`, received into `out` (a memoryview, or a
        `Converting` destination)."""
        kwargs = {"IfMatch": etag} if etag else {}
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={start}-{end - 1}", **kwargs)
        except Exception as e:
            raise self._error(e, f"bytes [{start}, {end})") from None
        try:
            got = content_range(r.get("ContentRange"))
            if got is None and not (start == 0 and end == size):
                raise RemoteError(f"{self.url}: bytes [{start}, {end}): the reply has no Content-Range", url=self.url)
            if got is not None and (got[:2] != (start, end) or got[2] not in (-1, size)):
                raise changed_error(self.url, f"asked for bytes [{start}, {end}) of {size} but got "
                                         f"{r.get('ContentRange')!r}")
            if etag and r.get("ETag") and r["ETag"] != etag:
                raise changed_error(self.url, f"ETag {etag} became {r['ETag']}")
            read_body(r["Body"].read, out, getattr(r["Body"], "_raw_stream", None))
        except OSError as e:
            raise Transient(f"reading the body failed: {e}") from None
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
