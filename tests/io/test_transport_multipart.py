"""Multi-range replies (`multipart/byteranges`) as `HTTPBackend.get_many` receives and checks them: nginx's real
replies (bytes equal to the file's), and hostile replies from a small HTTP server that frames them wrong (a part
header that lies about its length, a truncated body, an extra part, a part for other bytes, the boundary inside
the payload). Each must be refused with the named error, never copied as if it were the bytes asked for."""
from __future__ import annotations

import http.server
import socket
import threading

import numpy as np
import pytest

import lazyweights as lw
from lazyweights.core.errors import RemoteError, SourceChangedError
from lazyweights.io import http_backend, transport
from lazyweights.io.http_backend import HTTPBackend
from lazyweights.io.remote import RemoteFile
from lazyweights.io.transport import Transient

BOUNDARY = "00000000000000000042"


def _runs(size: int, count: int, run: int, stride: int) -> list[tuple[int, int]]:
    return [(s, s + run) for s in range(64, min(size, 64 + count * stride) - run, stride)][:count]


@pytest.fixture(scope="module")
def blob(nginx):
    data = np.random.default_rng(35).integers(0, 256, 4 << 20, dtype=np.uint8).tobytes()
    (nginx.root / "multipart.bin").write_bytes(data)
    return nginx.url("multipart.bin"), data


@pytest.mark.parametrize("count, run, stride", [(3, 100, 1000), (300, 1024, 4096), (250, 2816, 11264)])
def test_nginx_multi_range_equals_the_file(blob, count, run, stride):
    """Small and large replies (a large one is received with SO_RCVLOWAT batching) equal the file's bytes."""
    url, data = blob
    be = HTTPBackend(url, {})
    size, etag = be.identity()
    ranges = _runs(size, count, run, stride)
    outs = [memoryview(bytearray(e - s)) for s, e in ranges]
    assert be.get_many(ranges, size, etag, outs)
    assert all(bytes(o) == data[s:e] for o, (s, e) in zip(outs, ranges))
    # the connection is reused afterwards with the default low-water mark: a plain ranged GET still works
    out = memoryview(bytearray(10))
    be.get(size - 10, size, size, etag, out)
    assert bytes(out) == data[-10:]


class _Multipart(http.server.BaseHTTPRequestHandler):
    """Answers a multi-range GET with a multipart/byteranges reply framed as `fault` says."""

    protocol_version = "HTTP/1.1"
    body = b""
    fault = ""

    def log_message(self, *a):
        pass

    def do_GET(self):
        ranges = [tuple(int(x) for x in r.split("-")) for r in self.headers["Range"].split("=", 1)[1].split(",")]
        size = len(self.body)
        parts = []
        for i, (s, e) in enumerate(ranges):
            payload = self.body[s:e + 1]
            shown = (s, e)
            if self.fault == "lying-header" and i == 1:
                payload = payload[:len(payload) // 2]  # says [s, e] but sends half of it
            if self.fault == "other-bytes" and i == 1:
                shown = (s + 1, e + 1)
                payload = self.body[s + 1:e + 2]
            parts.append(f"\r\n--{BOUNDARY}\r\nContent-Type: application/octet-stream\r\n"
                         f"Content-Range: bytes {shown[0]}-{shown[1]}/{size}\r\n\r\n".encode() + payload)
        if self.fault == "extra-part":
            s, e = ranges[-1]
            parts.append(f"\r\n--{BOUNDARY}\r\nContent-Type: application/octet-stream\r\n"
                         f"Content-Range: bytes {s}-{e}/{size}\r\n\r\n".encode() + self.body[s:e + 1])
        body = b"".join(parts) + f"\r\n--{BOUNDARY}--\r\n".encode()
        sent = body[:len(body) * 2 // 3] if self.fault == "truncated" else body
        self.send_response(206)
        self.send_header("Content-Type", f"multipart/byteranges; boundary={BOUNDARY}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"v1"')
        self.end_headers()
        self.wfile.write(sent)
        if sent is not body:
            self.close_connection = True


@pytest.fixture
def crafted():
    servers = []

    def start(fault: str, body: bytes) -> str:
        handler = type("H", (_Multipart,), {"body": body, "fault": fault})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.handle_error = lambda request, address: None
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_port}/m.bin"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _payload_with_boundaries(size: int) -> bytes:
    """Bytes full of the reply's own framing: a boundary line with a plausible part header every 500 bytes."""
    fake = f"\r\n--{BOUNDARY}\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes 0-9/{size}\r\n\r\n"
    unit = fake.encode().ljust(500, b"\x00")
    return (unit * (size // len(unit) + 1))[:size]


# many parts (a body over the SO_RCVLOWAT threshold) and a few (below it)
@pytest.mark.parametrize("count", [4, 300])
def test_a_boundary_inside_the_payload_is_payload(crafted, count):
    data = _payload_with_boundaries(1 << 21)
    url = crafted("", data)
    ranges = _runs(len(data), count, 1024, 4096)
    outs = [memoryview(bytearray(e - s)) for s, e in ranges]
    assert HTTPBackend(url, {}).get_many(ranges, len(data), '"v1"', outs)
    assert all(bytes(o) == data[s:e] for o, (s, e) in zip(outs, ranges))


@pytest.mark.parametrize("count", [4, 300])
@pytest.mark.parametrize("fault, error, words", [
    ("lying-header", Transient, "lies about its length"),
    ("truncated", Transient, "truncated body"),
    ("extra-part", Transient, "starts another part"),
    ("other-bytes", SourceChangedError, "came back as"),
])
def test_a_hostile_reply_is_refused(crafted, fault, error, words, count):
    data = _payload_with_boundaries(1 << 21)
    url = crafted(fault, data)
    ranges = _runs(len(data), count, 1024, 4096)
    outs = [memoryview(bytearray(e - s)) for s, e in ranges]
    with pytest.raises(error, match=words) as e:
        HTTPBackend(url, {}).get_many(ranges, len(data), '"v1"', outs)
    if fault == "other-bytes":
        assert f"[{ranges[1][0]}, {ranges[1][1]})" in str(e.value) and url in str(e.value)


def test_a_hostile_reply_is_retried_then_named(crafted):
    """Through the file: a misframed reply is asked again, then a RemoteError names the URL and the fault; no
    byte of it is marked held."""
    data = _payload_with_boundaries(1 << 20)
    url = crafted("lying-header", data)
    f = RemoteFile(url, {"retries": 1, "part_cost": 0}, identity=(len(data), '"v1"'))
    ranges = _runs(len(data), 50, 1024, 4096)
    with pytest.raises(RemoteError, match="lies about its length") as e:
        f.ensure_ranges(ranges)
    assert url in str(e.value) and "after 2 attempts" in str(e.value)
    assert f._have.held_many(ranges) == []


def test_lowat_is_left_at_one_after_a_reply(blob, monkeypatch):
    """A large body is read with the low-water mark set, its last bytes without it, and the mark is put back,
    so the next reply's headers are read as soon as they come."""
    url, data = blob
    marks, during = [], []
    real = transport.receive_batched

    def spy(raw, body):
        sock = raw._fp.fp.raw._sock  # http.client lets go of its file once the body is read
        readinto = raw._fp.readinto

        def watched(b):  # the mark in effect as each piece of the body is read
            during.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
            return readinto(b)

        raw._fp.readinto = watched
        real(raw, body)
        marks.append((sock.gettimeout(), sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)))

    monkeypatch.setattr(http_backend, "receive_batched", spy)
    be = HTTPBackend(url, {})
    size, etag = be.identity()
    ranges = _runs(size, 300, 1024, 4096)
    assert be.get_many(ranges, size, etag, [memoryview(bytearray(e - s)) for s, e in ranges])
    assert marks == [(30.0, 1)]
    assert during[0] == transport.RECEIVE_LOWAT and during[-1] == 1  # batched, then the tail at the default


def test_load_of_a_rank_slice_over_nginx_is_exact(nginx, tmp_path):
    """End to end: a row-parallel slice (one run per row, multi-range parts) equals numpy's slice."""
    from safetensors.numpy import save_file

    w = np.random.default_rng(1).standard_normal((512, 768)).astype(np.float32)
    save_file({"w": w}, str(nginx.root / "rows.safetensors"))
    RemoteFile._cache.clear()
    weights = lw.load_weights([nginx.url("rows.safetensors")], storage_options={"part_cost": 0})
    got = lw.plan({"w": weights.w.data()[:, 192:384]}).materialize()["w"]
    np.testing.assert_array_equal(got, w[:, 192:384])


@pytest.mark.parametrize("observed, exact", [(50e6, True), (10e9, False)])
def test_auto_bandwidth_prices_the_gaps_at_what_the_link_observed(nginx, observed, exact):
    """`bandwidth="auto"`: a row slice's gaps are fetched through on a fast link and skipped on a slow one (the
    host's meter primed as if that bandwidth had been observed); the bytes are the slice's either way."""
    from safetensors.numpy import save_file

    from lazyweights.io.ranges import LinkMeter

    w = np.random.default_rng(2).standard_normal((512, 768)).astype(np.float32)
    save_file({"w": w}, str(nginx.root / "auto.safetensors"))
    RemoteFile._cache.clear()
    url = nginx.url("auto.safetensors")
    meter = LinkMeter.of(url)
    meter.bytes, meter.busy = 1 << 30, (1 << 30) / observed
    try:
        weights = lw.load_weights([url], storage_options={"bandwidth": "auto"})
        nginx.clear_log()
        got = lw.plan({"w": weights.w.data()[:, 192:384]}).materialize()["w"]
        served = nginx.bytes_sent()
    finally:
        LinkMeter._meters.clear()
        RemoteFile._cache.clear()
    np.testing.assert_array_equal(got, w[:, 192:384])
    rows = 512 * 192 * 4  # the slice's bytes: one 768-byte run per 3072-byte row
    if exact:
        assert rows <= served < rows + 512 * 160  # the runs and each part's framing
    else:
        assert served > 3 * rows  # fetched through the gaps
