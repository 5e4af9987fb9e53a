#!/usr/bin/env python3
"""HTTP/S3 transports, compared: how fast each client downloads a checkpoint's shards INTO MEMORY.

  python benchmarks/bench_transport.py CKPT [--reps 3] [--prime-gb 3] [--only SUBSTR ...] [--no-s3]
                                            [--no-verify] [--json OUT.json]

CKPT is a folder of `*.safetensors` shards (any files do: they are treated as opaque bytes), e.g. the W1
checkpoint. The script starts Debian's nginx (`/usr/sbin/nginx`) on 127.0.0.1 serving CKPT twice: at `/NAME`
(plain HTTP) and at `/models/w1/NAME` (the S3 protocol, path-style: GetObject/HeadObject are plain ranged
GET/HEAD; nginx ignores SigV4 headers and honours Range and If-Match). Not moto: moto's server reads the whole
object for every ranged GET, so it would time moto, not the client (see `bench_remote.run_s3`).

Every contestant runs in a fresh process, `--reps` times (medians reported), round-robin, each run preceded by
a throwaway process that touches and frees `--prime-gb` GB (this VM hands freed memory back to the host and
faulting in fresh pages is 10-40x slower than re-using warm ones; without priming the first contestant
after a quiet spell loses). The server's page cache is warm (one untimed warm-up read of every shard).

A contestant HEADs each shard (size, ETag) and receives every shard into one preallocated buffer per shard
(`np.empty(size, uint8)`, allocated before the clock starts, so its page faults are in every contestant's
time alike). Ranges of all shards go through one pool of N workers. Contestants (name: what it does):

- `urllib-nN-16m` / `urllib-nN-q`: http.client, one keep-alive connection per worker thread, N-way ranged GETs
  of 16 MiB / of 1/N of each shard ("whole-quarter" at N=4), If-Match sent, body received with
  `resp.readinto(memoryview(buf)[s:e])`: no intermediate copy. The candidate floor.
- `requests-nN-*`: a requests.Session with `stream=True`, If-Match, `Accept-Encoding: identity`, the body
  received with `r.raw._fp.readinto(view)` straight into the buffer: what lazyweights/io/remote.py does
  (it goes through a 4 MiB bounce buffer into its file mirror; here the target is the buffer itself).
- `obstore-range-nN-*`: `obstore.get_range(HTTPStore, path, start=, end=)` in N threads, each returned
  `obstore.Bytes` copied into the buffer (`buf[s:e] = memoryview(b)`). No If-Match: get_range takes no
  options.
- `obstore-get-nN-16m`: `obstore.get(store, path, options={"range": (s, e), "if_match": etag}).bytes()`:
  the If-Match-checked equivalent of what lazyweights needs, copied into the buffer.
- `obstore-stream-nN-16m`: the same GET, consumed with `.stream(min_chunk_size=4 MiB)` (each chunk is a
  Python `bytes`), copied chunk by chunk: no 16 MiB Rust allocation per range.
- `obstore-ranges-16m`: `obstore.get_ranges(store, path, starts, ends, coalesce=0)` per shard (obstore's
  own parallelism, up to 10 requests), copied.
- `obstore-async-nN-16m`: `get_range_async` for every range under an asyncio.Semaphore(N), copied.
- `curl-devnull`: `curl -Z` (one process, 3 parallel transfers) of the three shards to /dev/null. Not into
  memory (curl cannot write ranges into a caller's buffer): an upper bound on raw receive speed, not a floor.
- `s3-boto3-n4-*`: boto3 `get_object(Range=, IfMatch=)`, N=4 workers, Body received with
  `Body._raw_stream._fp.readinto(view)` (as lazyweights does).
- `s3-obstore-range-n4-*` / `s3-obstore-get-n4-16m`: obstore `S3Store` (path-style), as for HTTP.
- `s3-s3fs-16m`: `s3fs.S3FileSystem.cat_ranges(paths, starts, ends)` over all 16 MiB ranges, copied.
- `s3-runai`: runai-model-streamer's `SafetensorsStreamer.stream_files` on the three s3:// shards, every
  tensor yielded (it fills its own buffer: it cannot receive into ours; the bytes it delivers are the tensors',
  i.e. a shard less its JSON header).

Reported per contestant (medians): wall seconds of the timed region (HEADs + GETs + copies; the interpreter's
start and imports are outside), its ratio to the fastest `urllib-*` floor, GB/s, the fastest run, the client's CPU
seconds (user+sys of the timed region, `getrusage(RUSAGE_SELF)` in the child, all its threads, plus RUSAGE_CHILDREN
for curl), the whole child process's CPU (`os.wait4` in the parent: includes Python start and imports) and
nginx's CPU (its workers' utime+stime from /proc). The VM has 2 cores which nginx shares, so CPU seconds
matter as much as wall seconds. Unless --no-verify, each run's buffers are compared byte for byte with the
local files after the clock stops.

Needs: numpy, requests, boto3; optional (skipped when missing): obstore, s3fs (+aiohttp), runai-model-streamer
and runai-model-streamer-s3 (+torch), curl.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20
PRIME = "import numpy as np, sys; a = np.empty(int(sys.argv[1]), np.uint8); a[::4096] = 1"
S3_BUCKET, S3_PREFIX = "models", "w1"
S3_CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true", "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"}


# --- helpers used inside a contestant's process -----------------------------------------------------------
def _cuts(size: int, n: int, part: int | None) -> list[tuple[int, int]]:
    """[start, end) ranges covering `size` bytes: of `part` bytes, or n equal pieces when part is None."""
    if part is None:
        c = [size * i // n for i in range(n + 1)]
        return [(a, b) for a, b in zip(c, c[1:]) if b > a]
    return [(s, min(s + part, size)) for s in range(0, size, part)]


def _plan(name: str) -> tuple[int, int | None]:
    """(workers, range size or None for 1/N of each shard) from a name like 'urllib-n4-16m' / 'x-n8-q'."""
    n, part = 4, 16 * MiB
    for tok in name.split("-"):
        if tok.startswith("n") and tok[1:].isdigit():
            n = int(tok[1:])
        elif tok == "q":
            part = None
        elif tok.endswith("m") and tok[:-1].isdigit():
            part = int(tok[:-1]) * MiB
    return n, part


def _pool_run(n: int, jobs) -> None:
    """Run callables on n threads; re-raise the first error."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        for f in [pool.submit(j) for j in jobs]:
            f.result()


def _fill_from(view, readinto) -> None:
    """Receive len(view) bytes into view with readinto (no intermediate buffer)."""
    pos, want = 0, len(view)
    while pos < want:
        k = readinto(view[pos:])
        if not k:
            raise IOError(f"short body: {pos} of {want} bytes")
        pos += k


def run_contestant(name: str, base: str, endpoint: str, shards: list[str]) -> dict:
    """Download every shard into its own preallocated buffer; return timings (and buffers for verification)."""
    import resource

    import numpy as np

    n, part = _plan(name)
    out: dict[str, np.ndarray] = {}
    delivered = 0

    def cpu() -> float:
        a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime

    # imports happen before the clock
    if name.startswith("urllib"):
        import http.client
        import urllib.parse
    elif name.startswith("requests"):
        import requests
    elif name.startswith("s3-boto3"):
        import boto3
        from botocore.config import Config
    elif "obstore" in name:
        import obstore as obs
        from obstore.store import HTTPStore, S3Store
    elif name.startswith("s3-s3fs"):
        import s3fs
    elif name.startswith("s3-runai"):
        from runai_model_streamer import SafetensorsStreamer

    c0, t0 = cpu(), time.perf_counter()
    if name.startswith("urllib"):
        host = urllib.parse.urlsplit(base)
        local = threading.local()

        def conn():
            c = getattr(local, "c", None)
            if c is None:
                c = local.c = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
            return c

        def head(shard):
            c = conn()
            c.request("HEAD", f"{host.path}/{shard}")
            r = c.getresponse()
            r.read()
            return int(r.getheader("Content-Length")), r.getheader("ETag")

        metas = {s: head(s) for s in shards}
        for s, (size, _) in metas.items():
            out[s] = np.empty(size, np.uint8)  # lazily mapped: its page faults fall in the timed region

        def job(shard, s, e):
            def go():
                c = conn()
                c.request("GET", f"{host.path}/{shard}", headers={
                    "Range": f"bytes={s}-{e - 1}", "If-Match": metas[shard][1], "Accept-Encoding": "identity"})
                r = c.getresponse()
                if r.status != 206 or r.getheader("Content-Range") != f"bytes {s}-{e - 1}/{metas[shard][0]}":
                    raise IOError(f"{shard} [{s}, {e}): HTTP {r.status} {r.getheader('Content-Range')}")
                _fill_from(memoryview(out[shard])[s:e], r.readinto)
                r.read()  # nothing left; lets the connection be reused
            return go

        _pool_run(n, [job(sh, s, e) for sh in shards for s, e in _cuts(metas[sh][0], n, part)])
    elif name.startswith("requests"):
        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=max(n, 10))
        session.mount("http://", adapter)
        metas = {}
        for sh in shards:
            r = session.head(f"{base}/{sh}")
            metas[sh] = (int(r.headers["Content-Length"]), r.headers.get("ETag"))
            out[sh] = np.empty(metas[sh][0], np.uint8)

        def job(shard, s, e):
            def go():
                headers = {"Range": f"bytes={s}-{e - 1}", "Accept-Encoding": "identity", "If-Match": metas[shard][1]}
                with session.get(f"{base}/{shard}", headers=headers, stream=True, timeout=60) as r:
                    if r.status_code != 206 or r.headers.get("Content-Range") != f"bytes {s}-{e - 1}/{metas[shard][0]}":
                        raise IOError(f"{shard} [{s}, {e}): HTTP {r.status_code}")
                    _fill_from(memoryview(out[shard])[s:e], r.raw._fp.readinto)
            return go

        _pool_run(n, [job(sh, s, e) for sh in shards for s, e in _cuts(metas[sh][0], n, part)])
    elif name.startswith("curl"):
        cmd = ["curl", "-sS", "--no-progress-meter", "--fail", "-Z", "--parallel-max", str(len(shards))]
        for sh in shards:
            cmd += ["-o", "/dev/null", f"{base}/{sh}"]
        subprocess.run(cmd, check=True)
    elif "obstore" in name:
        if name.startswith("s3-"):
            store = S3Store(S3_BUCKET, prefix=S3_PREFIX, endpoint=endpoint, access_key_id="testing",
                            secret_access_key="testing", region="us-east-1", virtual_hosted_style_request=False,
                            client_options={"allow_http": True, "timeout": "120s"})
        else:
            store = HTTPStore.from_url(base, client_options={"allow_http": True, "timeout": "120s"})
        metas = {}
        for sh in shards:
            m = obs.head(store, sh)
            metas[sh] = (m["size"], m["e_tag"])
            out[sh] = np.empty(m["size"], np.uint8)
        ranges = [(sh, s, e) for sh in shards for s, e in _cuts(metas[sh][0], n, part)]
        kind = name.removeprefix("s3-").split("-")[1]
        if kind == "range":
            def job(sh, s, e):
                def go():
                    b = obs.get_range(store, sh, start=s, end=e)
                    out[sh][s:e] = memoryview(b)
                return go
            _pool_run(n, [job(*r) for r in ranges])
        elif kind == "get":
            def job(sh, s, e):
                def go():
                    r = obs.get(store, sh, options={"range": (s, e), "if_match": metas[sh][1]})
                    if tuple(r.range) != (s, e):
                        raise IOError(f"{sh}: asked [{s}, {e}) got {r.range}")
                    out[sh][s:e] = memoryview(r.bytes())
                return go
            _pool_run(n, [job(*r) for r in ranges])
        elif kind == "stream":
            def job(sh, s, e):
                def go():
                    r = obs.get(store, sh, options={"range": (s, e), "if_match": metas[sh][1]})
                    pos = s
                    for chunk in r.stream(min_chunk_size=4 * MiB):
                        out[sh][pos:pos + len(chunk)] = memoryview(chunk)
                        pos += len(chunk)
                    if pos != e:
                        raise IOError(f"{sh}: short stream {pos} != {e}")
                return go
            _pool_run(n, [job(*r) for r in ranges])
        elif kind == "ranges":
            for sh in shards:
                rs = [(s, e) for s2, s, e in ranges if s2 == sh]
                bufs = obs.get_ranges(store, sh, starts=[s for s, _ in rs], ends=[e for _, e in rs], coalesce=0)
                for (s, e), b in zip(rs, bufs):
                    out[sh][s:e] = memoryview(b)
        elif kind == "async":
            import asyncio

            async def main():
                sem = asyncio.Semaphore(n)

                async def one(sh, s, e):
                    async with sem:
                        b = await obs.get_range_async(store, sh, start=s, end=e)
                    out[sh][s:e] = memoryview(b)
                await asyncio.gather(*(one(*r) for r in ranges))
            asyncio.run(main())
        else:
            raise SystemExit(f"unknown obstore contestant {name}")
    elif name.startswith("s3-boto3"):
        client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, config=Config(max_pool_connections=max(n, 10), retries={"max_attempts": 1}))
        metas = {}
        for sh in shards:
            h = client.head_object(Bucket=S3_BUCKET, Key=f"{S3_PREFIX}/{sh}")
            metas[sh] = (int(h["ContentLength"]), h["ETag"])
            out[sh] = np.empty(metas[sh][0], np.uint8)

        def job(sh, s, e):
            def go():
                r = client.get_object(Bucket=S3_BUCKET, Key=f"{S3_PREFIX}/{sh}", Range=f"bytes={s}-{e - 1}",
                                      IfMatch=metas[sh][1])
                raw = r["Body"]._raw_stream
                try:
                    _fill_from(memoryview(out[sh])[s:e], raw._fp.readinto)
                finally:
                    r["Body"].close()
            return go

        _pool_run(n, [job(sh, s, e) for sh in shards for s, e in _cuts(metas[sh][0], n, part)])
    elif name.startswith("s3-s3fs"):
        fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=endpoint,
                               client_kwargs={"region_name": "us-east-1"}, config_kwargs={"max_pool_connections": 16})
        paths = [f"{S3_BUCKET}/{S3_PREFIX}/{sh}" for sh in shards]
        for sh, p in zip(shards, paths):
            out[sh] = np.empty(fs.info(p)["size"], np.uint8)
        ranges = [(sh, p, s, e) for sh, p in zip(shards, paths) for s, e in _cuts(len(out[sh]), n, part)]
        bufs = fs.cat_ranges([p for _, p, _, _ in ranges], [s for *_, s, _ in ranges], [e for *_, e in ranges])
        for (sh, _, s, e), b in zip(ranges, bufs):
            out[sh][s:e] = np.frombuffer(b, np.uint8)
    elif name.startswith("s3-runai"):
        with SafetensorsStreamer() as streamer:
            streamer.stream_files([f"s3://{S3_BUCKET}/{S3_PREFIX}/{sh}" for sh in shards])
            for _, t in streamer.get_tensors():
                delivered += t.untyped_storage().nbytes() if t.numel() else 0
        out = {}
    else:
        raise SystemExit(f"unknown contestant {name}")
    seconds, cpu_s = time.perf_counter() - t0, cpu() - c0
    if name.startswith("curl"):
        delivered = None
    elif not name.startswith("s3-runai"):
        delivered = sum(v.nbytes for v in out.values())
    return {"seconds": seconds, "cpu": cpu_s, "bytes": delivered, "buffers": out}


def _verify(ckpt: str, buffers: dict) -> None:
    import numpy as np

    for sh, buf in buffers.items():
        ref = np.memmap(os.path.join(ckpt, sh), np.uint8, "r")
        if ref.shape != buf.shape:
            raise SystemExit(f"{sh}: {buf.shape} bytes, expected {ref.shape}")
        for s in range(0, len(ref), 64 * MiB):
            if not np.array_equal(ref[s:s + 64 * MiB], buf[s:s + 64 * MiB]):
                raise SystemExit(f"{sh}: bytes differ in [{s}, {s + 64 * MiB})")


# --- the driver ---------------------------------------------------------------------------------------------
def start_nginx(ckpt: str):
    """nginx on 127.0.0.1 serving CKPT's files at /NAME and /models/w1/NAME (symlinks); returns (proc, port)."""
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    base = tempfile.mkdtemp(prefix="bench-transport-")
    root = os.path.join(base, "root")
    os.makedirs(os.path.join(root, S3_BUCKET, S3_PREFIX))
    for f in os.listdir(ckpt):
        os.symlink(os.path.abspath(os.path.join(ckpt, f)), os.path.join(root, f))
        os.symlink(os.path.abspath(os.path.join(ckpt, f)), os.path.join(root, S3_BUCKET, S3_PREFIX, f))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # as root, nginx's workers would drop to 'nobody', who may not read the checkpoint (its shards are 0600)
    user = "user root root;" if os.geteuid() == 0 else ""
    with open(os.path.join(base, "nginx.conf"), "w") as f:
        f.write(f"""{user}
daemon off; worker_processes 2; pid {base}/nginx.pid; error_log {base}/error.log warn;
events {{ worker_connections 512; }}
http {{ log_format counted '$request_method $uri $status $body_bytes_sent';
  access_log {base}/access.log counted; sendfile on; keepalive_requests 100000;
  client_body_temp_path {base}/b; proxy_temp_path {base}/p; fastcgi_temp_path {base}/f; uwsgi_temp_path {base}/u;
  scgi_temp_path {base}/s;
  server {{ listen 127.0.0.1:{port}; root {root}; }} }}
""")
    proc = subprocess.Popen([exe, "-c", f"{base}/nginx.conf", "-p", base])
    proc.folder = base
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise SystemExit("nginx did not start")
    return proc, port


def nginx_cpu(master_pid: int) -> float:
    """utime+stime (s) of the master's worker processes."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master_pid:  # ppid
            total += int(fields[11]) + int(fields[12])
    return total / tick


HTTP_NAMES = ([f"urllib-n{n}-{p}" for n in (2, 4, 8) for p in ("16m", "q")]
              + ["requests-n4-16m", "requests-n4-q", "requests-n8-16m",
                 "obstore-range-n4-16m", "obstore-range-n4-q", "obstore-range-n8-16m",
                 "obstore-get-n4-16m", "obstore-stream-n4-16m", "obstore-ranges-16m", "obstore-async-n4-16m",
                 "curl-devnull"])
S3_NAMES = ["s3-boto3-n4-16m", "s3-boto3-n4-q", "s3-obstore-range-n4-16m", "s3-obstore-range-n4-q",
            "s3-obstore-get-n4-16m", "s3-s3fs-16m", "s3-runai"]


def available(name: str) -> bool:
    import importlib.util

    need = {"obstore": "obstore", "s3fs": "s3fs", "runai": "runai_model_streamer", "boto3": "boto3"}
    for key, mod in need.items():
        if key in name and importlib.util.find_spec(mod) is None:
            return False
    return not name.startswith("curl") or shutil.which("curl") is not None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prime-gb", type=float, default=3)
    ap.add_argument("--only", nargs="*", help="run only contestants whose name contains one of these")
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--contestant", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--verify", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shards = sorted(f for f in os.listdir(args.ckpt) if f.endswith(".safetensors"))
    if args.contestant:
        r = run_contestant(args.contestant, args.base, args.endpoint, shards)
        if args.verify and r["buffers"]:
            _verify(args.ckpt, r.pop("buffers"))
        r.pop("buffers", None)
        print("RESULT " + json.dumps(r), flush=True)
        return

    names = HTTP_NAMES + ([] if args.no_s3 else S3_NAMES)
    if args.only:  # substrings of the standard names, or full names of other N / range sizes (urllib-n16-8m)
        names = [n for n in names if any(o in n for o in args.only)] + [
            o for o in args.only if o.count("-") >= 1 and o not in names and not any(o in n for n in names)]
    skipped = [n for n in names if not available(n)]
    names = [n for n in names if n not in skipped]
    if skipped:
        print("skipped (not installed):", ", ".join(skipped))
    total = sum(os.path.getsize(os.path.join(args.ckpt, s)) for s in shards)
    proc, port = start_nginx(args.ckpt)
    endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, **S3_CREDS)
    results: dict[str, list[dict]] = {}
    try:
        for sh in shards:  # warm the server's page cache (and check the server works)
            subprocess.run(["curl", "-sS", "--fail", "-o", "/dev/null", f"{endpoint}/{sh}"], check=True)
        for rep in range(args.reps):
            for name in names:
                subprocess.run([sys.executable, "-c", PRIME, str(int(args.prime_gb * (1 << 30)))], check=True)
                cmd = [sys.executable, os.path.abspath(__file__), args.ckpt, "--contestant", name,
                       "--base", endpoint, "--endpoint", endpoint] + ([] if args.no_verify else ["--verify"])
                n0 = nginx_cpu(proc.pid)
                child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
                text = child.stdout.read()
                _, status, ru = os.wait4(child.pid, 0)
                child.returncode = os.waitstatus_to_exitcode(status)
                n1 = nginx_cpu(proc.pid)
                line = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
                if child.returncode or not line:
                    print(f"  {name}: FAILED (exit {child.returncode})\n{text[-2000:]}", flush=True)
                    continue
                r = json.loads(line[-1][7:])
                r.update(child_cpu=ru.ru_utime + ru.ru_stime, nginx_cpu=n1 - n0)
                results.setdefault(name, []).append(r)
                print(f"  rep {rep + 1} {name:<26} {r['seconds']:7.3f} s  cpu {r['cpu']:6.2f} s  "
                      f"child {r['child_cpu']:6.2f} s  nginx {r['nginx_cpu']:5.2f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(proc.folder, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)

    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "cpu", "child_cpu", "nginx_cpu")}
           for n, rs in results.items()}
    best = {n: min(r["seconds"] for r in rs) for n, rs in results.items()}
    floors = [n for n in med if n.startswith("urllib")]
    floor = min(floors, key=lambda n: med[n]["seconds"]) if floors else min(med, key=lambda n: med[n]["seconds"])
    fs = med[floor]["seconds"]
    print(f"\n{total / 1e9:.2f} GB in {len(shards)} shards from nginx on 127.0.0.1, into memory; medians of "
          f"{args.reps} fresh processes, memory primed ({args.prime_gb:g} GB); floor = {floor}")
    print(f"{'contestant':<26}{'wall s':>8}{'x floor':>9}{'GB/s':>7}{'min s':>7}{'cpu s':>8}{'x floor':>9}"
          f"{'child cpu':>10}{'nginx cpu':>10}{'runs':>6}")
    for n in names:
        if n not in med:
            print(f"{n:<26}  FAILED")
            continue
        m = med[n]
        nbytes = results[n][0]["bytes"] or total
        print(f"{n:<26}{m['seconds']:>8.3f}{m['seconds'] / fs:>9.2f}{nbytes / m['seconds'] / 1e9:>7.2f}"
              f"{best[n]:>7.2f}{m['cpu']:>8.2f}{m['cpu'] / med[floor]['cpu']:>9.2f}"
              f"{m['child_cpu']:>10.2f}{m['nginx_cpu']:>10.2f}"
              f"{len(results[n]):>6}")


if __name__ == "__main__":
    main()
