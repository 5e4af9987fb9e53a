"""Validated ranged GETs over HTTP(S) with urllib3, on one connection pool per host shared by every thread.

Why urllib3 and not requests (which sits on it): a ranged GET through a `requests.Session` cost about 1 ms of
CPU before its first body byte (preparing the request, merging the environment's proxies and looking up
~/.netrc on every call), 0.25 ms through urllib3. A W1 load is ~200 GETs on 2 cores, so that was about a tenth
of its CPU (benchmarks/RESULTS.md, issue 35); importing requests also cost ~30 ms more than urllib3 alone.
What requests took from the environment is taken here once per backend, from the same sources, with the
standard library's readers: the proxies (`HTTP(S)_PROXY`, `ALL_PROXY`, `NO_PROXY`), the CA bundle
(`REQUESTS_CA_BUNDLE` / `CURL_CA_BUNDLE`, else certifi's) and ~/.netrc (or `$NETRC`) credentials where no
Authorization header is given. Redirects are followed (a hub's `resolve/` URL answers with its CDN's); an
Authorization header is dropped when a redirect leaves the host, as requests does.

Every reply is checked as `io/transport.py` describes: status, `Content-Range`, length and ETag.

Example (a local HTTP server that ignores Range; nothing here is specific to it):
    >>> import http.server, threading, tempfile, os, functools
    >>> root = tempfile.mkdtemp(); open(os.path.join(root, "blob"), "wb").write(bytes(range(256)) * 64)
    16384
    >>> class Quiet(http.server.SimpleHTTPRequestHandler):
    ...     def log_message(self, *a): pass
    >>> srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
    >>> threading.Thread(target=srv.serve_forever, daemon=True).start()
    >>> blob = HTTPBackend(f"http://127.0.0.1:{srv.server_port}/blob", {})
    >>> blob.identity()[0]
    16384
    >>> blob.get(250, 258, 16384, None, memoryview(bytearray(8)))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lazyweights.core.errors.RemoteError: http://127.0.0.1:.../blob: bytes [250, 258): the server ignored the ...
    >>> srv.shutdown()
"""
from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import RemoteError, SourceChangedError
from .transport import (
    Transient,
    changed_error,
    content_range,
    read_body,
    receive_batched,
    receive_buffer,
    split_parts,
    unreachable_error,
)

POOL_CONNECTIONS = 64  # kept per host: more than any pool of fetch threads, so none is closed on return
REDIRECTS = 10

_managers: dict[tuple, Any] = {}
_managers_lock = threading.Lock()


def _ca_bundle() -> str | None:
    """The CA bundle requests would use: `REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE`, else certifi's (None: the
    system's, when certifi is not installed)."""
    path = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if path:
        return path
    try:
        import certifi
    except ImportError:
        return None  # urllib3 then verifies against the system's CA store
    return certifi.where()


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`), None where there is
    none or `NO_PROXY` covers the host: the standard library's reading of those variables, as requests uses.

    >>> import os; old = dict(os.environ)
    >>> os.environ.update(HTTP_PROXY="http://proxy:3128", NO_PROXY="internal.example")
    >>> environment_proxy("http://models.example/m.safetensors"), environment_proxy("http://internal.example/m")
    ('http://proxy:3128', None)
    >>> os.environ.clear(); os.environ.update(old)
    """
    import urllib.request

    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _netrc_authorization(url: str) -> str | None:
    """A Basic Authorization header from ~/.netrc (or `$NETRC`) for `url`'s host, as requests sends; None
    without one (a missing or unreadable netrc is no error)."""
    import base64
    import netrc

    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not os.path.exists(path):
        return None
    try:
        found = netrc.netrc(path).authenticators(urlsplit(url).hostname or "")
    except (netrc.NetrcParseError, OSError):
        return None  # as requests does: a netrc it cannot read gives no credentials, and no error
    if not found:
        return None
    login, _, password = found
    return "Basic " + base64.b64encode(f"{login or ''}:{password or ''}".encode()).decode()


def _manager(proxy: str | None):
    """The process's shared pool manager for `proxy` (None: direct): connections are reused across threads,
    files and loads."""
    with _managers_lock:
        got = _managers.get((proxy,))
        if got is None:
            import urllib3

            ca = _ca_bundle()
            got = (urllib3.ProxyManager(proxy, num_pools=32, maxsize=POOL_CONNECTIONS, ca_certs=ca,
                                        cert_reqs="CERT_REQUIRED") if proxy else
                   urllib3.PoolManager(num_pools=32, maxsize=POOL_CONNECTIONS, ca_certs=ca, cert_reqs="CERT_REQUIRED"))
            _managers[(proxy,)] = got
        return got


class HTTPBackend:
    """Ranged GETs over HTTP(S): `identity`, `first_bytes`, `get` and `get_many` (see `io/transport.py`).

    Options (`storage_options`): `headers` (sent with every request), `timeout` (seconds to connect and
    between bytes, 30)."""

    def __init__(self, url: str, options: dict):
        import urllib3

        self.url = url
        self.name = url  # what messages call the object (a subclass may request another URL for it)
        self.timeout = float(options.get("timeout", 30))
        self.headers = dict(options.get("headers", {}))
        if not any(k.lower() == "authorization" for k in self.headers):
            auth = _netrc_authorization(url)
            if auth:
                self.headers["Authorization"] = auth
        self._pool = _manager(environment_proxy(url))
        self._timeout = urllib3.Timeout(connect=self.timeout, read=self.timeout)
        # connection failures raise at once (the caller's retry loop owns retrying); redirects are followed
        self._retries = urllib3.Retry(total=None, connect=0, read=False, status=0, other=0, redirect=REDIRECTS,
                                      raise_on_redirect=True, raise_on_status=False)

    multi_range = True  # may take several ranges in one request (`get_many`); a server may turn out not to
    request_latency = 0.0005  # seconds a request costs beyond its bytes (the cost model's default)

    def _send(self, method: str, headers: dict, url: str | None = None):
        """The reply to one request (to `self.url` unless `url`), its body not yet read (the caller closes it:
        `_finish` / `_discard`)."""
        import urllib3

        try:
            return self._pool.request(method, url or self.url, headers={**self.headers, **headers},
                                      retries=self._retries, timeout=self._timeout, preload_content=False,
                                      decode_content=False)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            reason = e.reason if isinstance(e, urllib3.exceptions.MaxRetryError) else e
            if isinstance(reason, urllib3.exceptions.ResponseError):  # too many redirects
                raise RemoteError(f"{self.name}: {reason}", url=self.name) from None
            unreachable = unreachable_error(url or self.url, e)  # named by where nothing listens
            if unreachable is not None:
                if self.name != self.url:  # an object named otherwise (gs://): which one, then where
                    raise RemoteError(f"{self.name}: {unreachable}", url=self.name) from None
                raise unreachable from None
            # (urllib3's NewConnectionError is a ConnectTimeoutError too: a refused connection is not a timeout)
            if isinstance(reason, (urllib3.exceptions.TimeoutError, TimeoutError)) and \
                    not isinstance(reason, urllib3.exceptions.NewConnectionError):
                raise Transient(f"timed out after {self.timeout:g} s (storage_options['timeout'])") from None
            raise Transient(f"connection failed: {reason}") from None

    @staticmethod
    def _finish(r) -> None:
        """The whole body was read: the connection goes back to the pool for the next request."""
        r.release_conn()

    @staticmethod
    def _discard(r) -> None:
        """The body was not (wholly) read: close the connection (draining an unread body could mean reading a
        whole object) and hand its slot back to the pool."""
        r.close()
        r.release_conn()

    def _status_error(self, r, what: str) -> RemoteError:
        return RemoteError(f"{self.name}: {what}: HTTP {r.status} {r.reason}", url=self.name, status=r.status)

    def identity(self) -> tuple[int, str | None]:
        """(length, ETag) from a HEAD request."""
        r = self._send("HEAD", {})
        try:
            if r.status >= 500:
                raise Transient(f"HTTP {r.status} {r.reason}")
            if r.status != 200:
                raise self._status_error(r, "cannot open")
            try:
                size = int(r.headers["Content-Length"])
            except (KeyError, ValueError):
                raise RemoteError(f"{self.name}: the server gives no Content-Length, so the object's size is "
                                  "unknown", url=self.name) from None
            return size, self._version(r)
        finally:
            # A reply to HEAD has no body (RFC 9110 9.3.2; http.client reads none): reading it marks the reply
            # complete and the connection goes back to the pool. A reload revalidates each of a checkpoint's
            # shards (158 for DeepSeek-V3) with a HEAD: one connection for all of them, not one each.
            r.drain_conn()
            self._finish(r)

    def first_bytes(self, length: int) -> tuple[int, str | None, bytes | None]:
        """(object length, ETag, its first `length` bytes) from one ranged GET: opening a checkpoint costs one
        request, not a HEAD and then a read of its header. The bytes are None where the server ignored the
        Range header with an object larger than `length` (its body is not read; ranged reads will refuse it)."""
        r = self._send("GET", {"Range": f"bytes=0-{length - 1}", "Accept-Encoding": "identity"})
        done = False
        try:
            if r.status >= 500:
                raise Transient(f"HTTP {r.status} {r.reason}")
            etag = self._version(r)
            if r.status == 416:  # an empty object has no byte 0
                return 0, etag, b""
            if r.status == 206:
                got = content_range(r.headers.get("Content-Range"))
                if got is None or got[0] != 0 or got[2] < 0:
                    raise RemoteError(f"{self.name}: asked for bytes [0, {length}) but the reply's Content-Range "
                                      f"is {r.headers.get('Content-Range')!r}", url=self.name)
                size, want = got[2], got[1]
            elif r.status == 200:
                try:
                    size = want = int(r.headers["Content-Length"])
                except (KeyError, ValueError):
                    raise RemoteError(f"{self.name}: the server gives no Content-Length, so the object's size "
                                      "is unknown", url=self.name) from None
                if size > length:
                    return size, etag, None
            else:
                raise self._status_error(r, "cannot open")
            buf = bytearray(want)
            self._read(r, memoryview(buf))
            done = _whole(r, want)
            return size, etag, bytes(buf)
        finally:
            (self._finish if done else self._discard)(r)

    def _read(self, r, out) -> None:
        """Receive the reply's body into `out`; a body cut short or a dropped connection is `Transient`."""
        import urllib3

        try:
            read_body(r.read, out, r)
        except (Transient, RemoteError, SourceChangedError):
            raise
        except (OSError, urllib3.exceptions.HTTPError, ValueError) as e:  # IncompleteRead, reset, timeout
            raise Transient(f"truncated body: {e}") from None

    def _check_common(self, r, etag: str | None, what: str) -> None:
        if r.status in (412, 416):
            raise changed_error(self.name, f"HTTP {r.status} for {what}, {self.version_name} {etag}")
        if r.status >= 500:
            raise Transient(f"HTTP {r.status} {r.reason}")
        reply_etag = self._version(r)
        if etag and reply_etag and reply_etag != etag:
            raise changed_error(self.name, f"{self.version_name} {etag} became {reply_etag}")

    version_name = "ETag"  # what `_version` reads, as messages call it

    @staticmethod
    def _version(r) -> str | None:
        """The object version a reply names (its ETag): what `identity` returns and every ranged GET must match."""
        return r.headers.get("ETag")

    def _ranged(self, ranges: str, etag: str | None):
        """A GET of `ranges` (`a-b,c-d`) on condition that the object is still version `etag` (`If-Match`)."""
        headers = {"Range": "bytes=" + ranges, "Accept-Encoding": "identity"}
        if etag and not etag.startswith("W/"):
            headers["If-Match"] = etag
        return self._send("GET", headers)

    def get(self, start: int, end: int, size: int, etag: str | None, out) -> None:
        """Bytes [start, end) of the `size`-byte object with `etag`, received into `out` (a memoryview, or a
        `Converting` destination)."""
        what = f"bytes [{start}, {end})"
        r = self._ranged(f"{start}-{end - 1}", etag)
        done = False
        try:
            self._check_common(r, etag, f"{what} of the {size}-byte object")
            if r.status == 200:
                if not (start == 0 and end == size):
                    raise RemoteError(
                        f"{self.name}: {what}: the server ignored the Range header (status 200 with the whole "
                        f"{r.headers.get('Content-Length', '?')}-byte object); serve the checkpoint from a "
                        "server that supports range requests", url=self.name, status=200)
            elif r.status != 206:
                raise self._status_error(r, what)
            else:
                got = content_range(r.headers.get("Content-Range"))
                if got is None or got[:2] != (start, end):
                    raise RemoteError(f"{self.name}: asked for {what} but the reply's Content-Range is "
                                      f"{r.headers.get('Content-Range')!r}", url=self.name)
                if got[2] not in (-1, size):
                    raise changed_error(self.name, f"its length changed from {size} to {got[2]} bytes")
            self._read(r, out)
            done = _whole(r, len(out))
        finally:
            (self._finish if done else self._discard)(r)

    def get_many(self, ranges: list[tuple[int, int]], size: int, etag: str | None, outs: list[memoryview]) -> bool:
        """Several ranges in one multi-range request (`multipart/byteranges`), each part checked against what
        was asked and received into its `outs` entry. False (nothing received) when the server does not do
        multi-range: the caller then asks range by range."""
        import urllib3

        r = self._ranged(",".join(f"{s}-{e - 1}" for s, e in ranges), etag)
        done = False
        try:
            self._check_common(r, etag, f"{len(ranges)} ranges")
            kind = r.headers.get("Content-Type", "")
            if r.status != 206 or not kind.startswith("multipart/byteranges"):
                return False  # a whole object, or only a single range: not multi-range capable
            boundary = b"--" + kind.split("boundary=", 1)[1].strip().strip('"').encode()
            try:
                self._read_parts(r, boundary, ranges, size, outs)
            except (Transient, RemoteError, SourceChangedError):
                raise
            except (OSError, urllib3.exceptions.HTTPError, ValueError) as e:
                raise Transient(f"multi-range body failed: {e}") from None
            done = True
            return True
        finally:
            (self._finish if done else self._discard)(r)

    def _read_parts(self, raw, boundary: bytes, ranges, size: int, outs) -> None:
        # The whole reply is received into this thread's warm buffer (`receive_batched`: a wake-up per 64 KiB,
        # not per part), then split by position: every part header of one reply is the same bytes but for
        # its Content-Range numbers, so the header expected for each asked range is built and compared where
        # the previous part ended (`split_parts`). Per-line parsing (readline per header) cost ~65 us a
        # part, a regex search per part and a socket wake-up per part ~19 us (benchmarks/RESULTS.md).
        fp = getattr(raw, "_fp", None)
        length = getattr(fp, "length", None)
        if fp is None or not hasattr(fp, "readinto") or length is None:
            raise Transient("multi-range reply without a length or a readable stream")
        body = receive_buffer(length)
        receive_batched(raw, body)
        split_parts(self.name, body, boundary, ranges, size, outs)


def _whole(r, nbytes: int) -> bool:
    """Whether the reply had exactly `nbytes` of body, all read (so its connection can serve the next request):
    a Content-Length of `nbytes` and no chunked framing."""
    return r.headers.get("Content-Length") == str(nbytes) and not r.headers.get("Transfer-Encoding")
