"""The HTTP(S) transport on urllib3 (`lazyweights/io/http_backend.py`): what it takes from the environment as
requests did (proxies, NO_PROXY, ~/.netrc), redirects, and keep-alive connections shared across threads and
files. Each case runs against a real HTTP/1.1 server on 127.0.0.1 that records what reached it: the request
line (a proxied request carries the absolute URL), the headers, and how many TCP connections it accepted.
"""
from __future__ import annotations

import base64
import http.server
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from lazyweights.core.errors import RemoteError
from lazyweights.io import http_backend
from lazyweights.io.http_backend import HTTPBackend, environment_proxy

DATA = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()


class RecordingServer:
    """Serves DATA at any path (GET with one Range, HEAD, an ETag). `redirects` maps a path to a URL answered
    with a 302; `password` asks every request for HTTP Basic credentials `user:password`."""

    def __init__(self, redirects: dict | None = None, password: str | None = None):
        self.requests: list[tuple[str, dict]] = []  # (request line target, headers)
        self.connections = 0
        self.redirects, self.password = dict(redirects or {}), password
        owner, lock = self, threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def setup(self):
                super().setup()
                with lock:
                    owner.connections += 1

            def do_HEAD(self):
                self._serve(False)

            def do_GET(self):
                self._serve(True)

            def _reply(self, status: int, headers: dict, body: bytes = b""):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(body)

            def _serve(self, body: bool):
                with lock:
                    owner.requests.append((self.path, dict(self.headers)))
                path = re.sub(r"^https?://[^/]+", "", self.path)
                if path in owner.redirects:
                    return self._reply(302, {"Location": owner.redirects[path]})
                if owner.password is not None:
                    want = "Basic " + base64.b64encode(f"user:{owner.password}".encode()).decode()
                    if self.headers.get("Authorization") != want:
                        return self._reply(401, {"WWW-Authenticate": 'Basic realm="models"'})
                start, end, status = 0, len(DATA), 200
                m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
                headers = {"ETag": '"v1"'}
                if m:
                    start, end, status = int(m.group(1)), int(m.group(2)) + 1, 206
                    headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(DATA)}"
                if body:
                    return self._reply(status, headers, DATA[start:end])
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(end - start))
                self.end_headers()

        cls = type("Server", (http.server.ThreadingHTTPServer,), {"daemon_threads": True, "request_queue_size": 64})
        self.httpd = cls(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str = "/m.safetensors") -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}{path}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = RecordingServer()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No proxy or netrc from the machine running the tests, and fresh pools for each case."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setattr(http_backend, "_managers", {})


def _get(backend: HTTPBackend, start: int, end: int) -> bytes:
    out = memoryview(bytearray(end - start))
    backend.get(start, end, len(DATA), '"v1"', out)
    return bytes(out)


def test_ranged_gets_share_keep_alive_connections_across_threads_and_files(server):
    """200 ranged GETs from 8 threads over two files of one host: every byte right, and the host sees at most
    one connection per thread (none opened per request, none per file)."""
    files = [HTTPBackend(server.url("/a.safetensors"), {}), HTTPBackend(server.url("/b.safetensors"), {})]
    spans = [(k * 4099 % (len(DATA) - 5000), k * 4099 % (len(DATA) - 5000) + 5000) for k in range(200)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda k: _get(files[k % 2], *spans[k]), range(200)))
    assert got == [DATA[s:e] for s, e in spans]
    assert len(server.requests) == 200
    assert 1 <= server.connections <= 8


def test_heads_reuse_one_connection(server):
    """A reload revalidates every shard with a HEAD: 50 of them, one after another, over one connection (a
    HEAD's reply has no body, so nothing is left to drain). Closing after each HEAD fails it (50)."""
    for k in range(50):
        assert HTTPBackend(server.url(f"/model-{k:05d}.safetensors"), {}).identity() == (len(DATA), '"v1"')
    assert len(server.requests) == 50
    assert server.connections == 1
    assert _get(HTTPBackend(server.url(), {}), 10, 20) == DATA[10:20]  # and a GET after them on it
    assert server.connections == 1


def test_a_redirect_is_followed_and_credentials_stay_with_their_host(server):
    """A hub's resolve/ URL answers 302 with its CDN's: the bytes come from the target, and an Authorization
    header meant for the first host is not sent to the second (as requests does)."""
    hub = RecordingServer(redirects={"/resolve/m.safetensors": server.url("/cdn/m.safetensors")})
    try:
        b = HTTPBackend(hub.url("/resolve/m.safetensors"), {"headers": {"Authorization": "Bearer hub-token"}})
        assert b.identity() == (len(DATA), '"v1"')
        assert _get(b, 1000, 3000) == DATA[1000:3000]
        assert hub.requests[0][1].get("Authorization") == "Bearer hub-token"
        assert server.requests and all("Authorization" not in h for _, h in server.requests)
    finally:
        hub.close()


def test_a_redirect_loop_is_a_named_error():
    loop = RecordingServer()
    loop.redirects["/a"] = loop.url("/b")
    loop.redirects["/b"] = loop.url("/a")
    try:
        with pytest.raises(RemoteError, match=r"/a: .*redirect"):
            HTTPBackend(loop.url("/a"), {}).identity()
    finally:
        loop.close()


def test_the_environment_proxy_carries_the_requests(server, monkeypatch):
    """HTTP_PROXY is used as requests used it: the proxy (here the recording server) gets the absolute URL of
    a host that does not even resolve, and answers it."""
    monkeypatch.setenv("HTTP_PROXY", server.url(""))
    b = HTTPBackend("http://models.invalid/m.safetensors", {})
    assert _get(b, 10, 20) == DATA[10:20]
    assert server.requests[-1][0] == "http://models.invalid/m.safetensors"


def test_no_proxy_goes_direct(server, monkeypatch):
    """NO_PROXY naming the host skips the proxy (here a port where nothing listens)."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert environment_proxy(server.url()) is None
    assert _get(HTTPBackend(server.url(), {}), 0, 64) == DATA[:64]
    assert server.requests[-1][0] == "/m.safetensors"


def test_netrc_credentials_are_sent_where_no_header_is_given(tmp_path, monkeypatch):
    """~/.netrc (here $NETRC) supplies Basic credentials for its host; without them the server's 401 is a
    RemoteError with the status; an explicit Authorization header wins over the netrc."""
    locked = RecordingServer(password="s3cret")
    try:
        url = locked.url()
        with pytest.raises(RemoteError, match="HTTP 401") as info:
            HTTPBackend(url, {}).identity()
        assert info.value.status == 401
        netrc = tmp_path / "netrc"
        netrc.write_text("machine 127.0.0.1 login user password s3cret\n")
        netrc.chmod(0o600)
        monkeypatch.setenv("NETRC", str(netrc))
        assert _get(HTTPBackend(url, {}), 5, 9) == DATA[5:9]
        with pytest.raises(RemoteError, match="HTTP 401"):
            HTTPBackend(url, {"headers": {"Authorization": "Basic d3Jvbmc6d3Jvbmc="}}).identity()
    finally:
        locked.close()
