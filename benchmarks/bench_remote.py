#!/usr/bin/env python3
"""W1 over HTTP from nginx: lazyweights against the fastest plain download into memory, and safetensors + fsspec.

  python benchmarks/bench_remote.py CKPT [--reps 3] [--prime-gb 3] [--s3] [--only NAME,NAME]

CKPT is a W1 checkpoint folder (`../shared/bench/make_ckpt.py`). The script starts Debian's nginx on
127.0.0.1 serving it, then runs each contestant in a fresh process, with warm memory (a throwaway process
touches and frees --prime-gb right before each) and a warm page cache on the server side. Every contestant is
timed the same way: from before its own imports until its bytes are in memory (the whole process, start to
exit, is reported beside it); its memory is sampled by this process from /proc/PID/status, never by a thread
inside it (`NAME+sampler` runs NAME with such a thread, to show what it costs):

- `floor`: every shard received into a preallocated buffer by 4 threads, each on its own keep-alive
  http.client connection, one ranged GET per quarter of each shard, `readinto` straight into place: the
  fastest plain download into memory measured here (benchmarks/bench_transport.py: the least CPU of every
  recipe, the wall time of the best; requests, obstore and 8-way variants were no faster).
- `floor-bounce`: the same, but each thread receives into its own 1 MiB buffer and copies each piece into
  place (the path lazyweights' casts take): on this VM faster than `readinto` straight into the large buffer.
- `floor-prefault`: `floor` with one more thread faulting the buffers in at once (`MADV_POPULATE_WRITE`),
  as lazyweights faults in its results: on these VMs, which take freed memory back about 2 s after a
  process frees it, memory touched early is much cheaper than memory touched late. The ratios are taken
  against the fastest of the three floors.
- `floor-cast`: `floor-bounce` that also casts each piece bfloat16 -> float16 on its way into place, with
  lazyweights' C loop: the plain download doing W1's conversion (W1 casts every byte but its norms'). Not one
  of the floors the ratios are taken against; printed beside them, to show what of the gap is the cast.
- `floor-cast-inplace`: `floor` that receives each 1 MiB piece straight into place and casts it there, in place,
  while it is in cache (what lazyweights does where the cast kernel may work on its own input); on the 2-core
  Intel VM 1.13 s against `floor-cast`'s 1.28 s.
- `curl`: `curl --parallel` of the three shards to /dev/null: what the network moves with no memory to fill.
- `lazyweights`: `load_weights(index URL)` + the W1 adapter + `plan(...).materialize()`.
- `fsspec`: safetensors + fsspec, as people do it: each shard read whole through `fsspec.open(url)`, parsed
  with `safetensors.torch.load` (safetensors.numpy has no bf16), then the W1 transform in numpy/ml_dtypes.
- `rank0of4`: `shard(..., rank=0, world_size=4)` of the same checkpoint, materialized: its slices must equal
  the same slices of the local checkpoint, and the server's bytes are its share.
- `rank0of4-w1`: rank 0 of 4 of the W1-adapted plan (renames, RoPE permutation, casts): the shard's slices
  sink below the permutation (`graph.rewrites.sink_slices`), so the rank still fetches only its rows.
- `floor-file`, `floor-file-map`, `floor-file-direct`: `floor`, the bytes also put in a file per shard: `pwrite`
  from the buffer every 8 MiB as they arrive, received into a `MAP_SHARED` map of the file (the page cache
  itself) and copied into place, or `pwrite` around the page cache (`O_DIRECT`, as lazyweights' cache writer
  does). The fastest of the three is the floor of a first run with `cache=`, which writes every byte too.
- `lazyweights-cached`: twice with `cache=DIR` (empty before the first); the first run's time against
  the faster file floor, and the second run's bytes from the server, are reported. The first run is timed
  twice: when `materialize()` returns (what the caller waits for; the cache is written off that path) and
  when the cache's writer has every byte in the file.
- `convert`: the W1 conversion saved to safetensors files with `budget="256MB"`, straight from the URL: the
  peak private memory shows a remote checkpoint streams through the budget (the output is hashed against a
  local save of the same plan).
- `4proc-cache`: four `lazyweights` processes started together with one empty `cache=DIR`, as the ranks of
  one host would be: the wall time until the last finishes, and the bytes the server sent to all four.
- `replay:NAME` (NAME a rank contestant, e.g. `replay:rank0of4@part_cost=0`): the floor of NAME's own plan. NAME
  runs once first, untimed, and nginx logs every GET it makes with its `Range` header; each timed run is then a
  fresh process that sends exactly those requests with plain `http.client` on 4 keep-alive connections (the
  floor's) and receives each reply whole into a warm buffer, parsing nothing: the same requests, parts and bytes,
  with no work beside receiving them. A rank's time against it (`x plan`) is what lazyweights adds to its plan;
  the replay against the full checkpoint's floor is what the plan itself costs on this server (a multi-range
  part costs nginx and the kernel CPU that a byte does not).
- `NAME@KEY=VALUE:KEY=VALUE`: a lazyweights contestant (`lazyweights`, `rank0of4`, `rank0of4-w1`) with these
  `storage_options`, e.g. `rank0of4@part_cost=0` (exactly the slices' bytes), `rank0of4@bandwidth=3e8` (the
  cost model priced for a 300 MB/s link) or `rank0of4@bandwidth=auto` (priced at what the fetches observe).

`--link-rate RATE` (tc's units: `2500mbit`) runs the whole benchmark in a network namespace of its own
(`unshare -rn`: no privilege needed, nothing outside it is slowed) whose loopback is limited to RATE by a
token bucket (`tc qdisc ... tbf`): server and client as they would be across a network of that bandwidth
(without its latency).

With `--s3`, the same checkpoint is also read through the S3 protocol (path-style GetObject/HeadObject, served
by nginx on 127.0.0.1; see `run_s3` for why not moto) by:
`s3-download4` (boto3, 4 concurrent ranged GETs per shard: the floor on that server), `s3-lazyweights`,
`s3-runai` (runai-model-streamer's `SafetensorsStreamer` on the s3:// shards, then the W1 transform in
numpy, as `fsspec` does; runai reads S3, GCS and Azure, not plain HTTP) and `s3-fsspec` (s3fs + safetensors).

With `--gcs`, the same checkpoint is also read through GCS's JSON API (object metadata and ranged media
downloads, served by nginx on 127.0.0.1; see `run_gcs`) by `gs-floor` (`floor` on the media URLs) and
`gs-lazyweights` (`load_weights("gs://models/w1/...")`, each object pinned to its generation).

Needs, beyond lazyweights[remote]: Debian's nginx and curl, `pip install aiohttp` (fsspec's HTTP filesystem)
and, for --s3, `pip install s3fs runai-model-streamer runai-model-streamer-s3`.

Each contestant also reports the CPU its process used until its timer stopped (`CPU s`: user and system
seconds of all its threads), which on a 2-core VM says more than its wall time when server and client share
the cores. Bytes are counted by nginx (its access log's `$body_bytes_sent`), not by the client. Every contestant's
output is hashed tensor by tensor and must equal a local lazyweights materialization. Prints medians.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.environ.get("LAZYWEIGHTS_SHARED_BENCH", os.path.join(HERE, "..", "..", "shared", "bench"))
PRIME = "import numpy as np, sys; a = np.empty(int(sys.argv[1]), np.uint8); a[::4096] = 1"


# --- contestants (each runs in its own process: `bench_remote.py --contestant NAME URL CKPT`) -------------
def _digest(arrays) -> dict:
    import numpy as np

    # hashed in place (no `tobytes()` copy), so the parent's memory samples see only the contestant's result
    return {k: hashlib.sha256(memoryview(np.ascontiguousarray(v).reshape(-1).view(np.uint8))).hexdigest()[:16]
            for k, v in sorted(arrays.items())}


def _s3_endpoint() -> str:
    return os.environ["BENCH_S3_ENDPOINT"]


def _s3_boto_options() -> dict:
    return {"endpoint_url": _s3_endpoint(), "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "region_name": "us-east-1"}


def _s3_fsspec_options() -> dict:
    return {"endpoint_url": _s3_endpoint(), "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"}}


def _w1_numpy(tensors, ckpt) -> dict:
    """The W1 transform as people write it by hand: renames, q/k RoPE row permutation, dtype casts, in
    numpy/ml_dtypes over (name, torch tensor) pairs."""
    import ml_dtypes
    import torch

    if BENCH not in sys.path:  # the shared workload's names (a contestant runs in its own process)
        sys.path.insert(0, BENCH)
    from workload import adapt_name, rope_perm, target_dtype

    cfg = _config(ckpt)
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    hd = cfg.hidden_size // heads
    perm = rope_perm(hd)
    out = {}
    for k, tt in tensors:
        v = tt.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if tt.dtype == torch.bfloat16 else tt.numpy()
        n = adapt_name(k)
        if n is None:
            continue
        if n.endswith(("q_proj.weight", "k_proj.weight")):
            h = heads if "q_proj" in n else kv
            v = v.reshape(h, hd, -1)[:, perm, :].reshape(h * hd, -1)
        out[n] = v.astype(target_dtype(n))
    return out


def _config(ckpt):
    import types

    with open(os.path.join(ckpt, "config.json")) as f:
        return types.SimpleNamespace(**json.load(f))


def _download4(shards, size_of, fetch_part) -> dict:
    """The floor: each shard fetched into memory as 4 ranged requests in parallel. `size_of(shard)` is its
    length; `fetch_part(shard, buf, start, end)` fills buf[start:end]."""
    from concurrent.futures import ThreadPoolExecutor

    out = {}
    with ThreadPoolExecutor(4) as pool:
        for shard in shards:
            size = size_of(shard)
            buf = bytearray(size)
            cuts = [size * i // 4 for i in range(5)]
            list(pool.map(lambda se, shard=shard, buf=buf: fetch_part(shard, buf, *se), zip(cuts, cuts[1:])))
            out[shard] = buf
    return out


def _cast_loop():
    """lazyweights' bf16 -> f16 C loop (bits in, bits out: `loop(src_u16, out_u16, 1, n, 0, 0)`), loaded from
    the compiled extension alone: importing `lazyweights.kernels` would import the whole package inside the
    floor's timer (about 0.1 s), and a slow floor flatters the contestant."""
    import glob
    import importlib.util

    (path,) = glob.glob(os.path.join(HERE, "..", "lazyweights", "kernels", "_ccasts*.so"))
    spec = importlib.util.spec_from_file_location("lazyweights.kernels._ccasts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.k_bf16_to_f16


def _urllib_floor(base_url: str, shards, ways: int = 4, part: int | None = None, bounce: int = 0,
                  prefault: bool = False, into_dir: str | None = None, file_map: bool = False,
                  file_direct: bool = False, cast: bool = False) -> dict:
    """The floor: every shard into a preallocated buffer, by `ways` threads each on its own keep-alive
    http.client connection, taking ranges (`part` bytes; default a `ways`-th of each shard) from a shared
    list and receiving each body with `readinto` straight into its place (one copy from the socket).
    `bounce`: receive into the thread's own `bounce`-byte buffer instead, and copy each piece into place
    (what lazyweights does with a cast: measured faster than readinto straight into a large buffer).
    `prefault`: one more thread faults the buffers in at once (`MADV_POPULATE_WRITE`) while the others
    receive, as lazyweights does with its results (`lazyweights/run/prefault.py`).
    `into_dir`: the bytes go to a file per shard there as well (the floor of a first run with `cache=`, which
    writes every byte to disk too), in one of two ways, neither always the faster on this VM: each piece
    `pwrite` from the buffer every 8 MiB as it arrives, or (`file_map`) received into a `MAP_SHARED` map of
    the file (the page cache itself) and then copied into the buffer. `file_direct`: the `pwrite`s go around
    the page cache (`O_DIRECT`, from page-aligned buffers; the partial pages at each range's ends buffered),
    made by one writer thread while the receivers go on, as lazyweights' cache writer does; timed until it
    has written every byte.
    `cast` (with `bounce`): each piece is cast from bfloat16 to float16 on its way into place, by lazyweights'
    own C loop (AVX-512, F16C or portable; ml_dtypes' `astype` is slower), the extension loaded alone:
    W1's conversion, done the plainest fast way."""
    import http.client
    import mmap
    import queue
    import threading
    import urllib.parse

    import numpy as np

    u = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port)
    bufs, jobs = {}, []
    for shard in shards:
        path = f"{u.path}/{shard}"
        conn.request("HEAD", path)
        r = conn.getresponse()
        r.read()
        size = int(r.headers["Content-Length"])
        # not bytearray(size): that zero-fills every page first; a page-aligned map where direct I/O reads it
        bufs[shard] = memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if file_direct
                                 else np.empty(size, np.uint8))
        step = part or -(-size // ways)
        jobs += [(path, shard, s, min(s + step, size)) for s in range(0, size, step)]
    conn.close()
    jobs.reverse()
    lock = threading.Lock()
    kernel = None
    if cast:  # every range and piece starts on a whole 2-byte element (the shards' sizes are even)
        kernel = _cast_loop()
        jobs = [(path, shard, s - s % 2, e if e == len(bufs[shard]) else e - e % 2)
                for path, shard, s, e in jobs]
    populate = None
    files, maps, direct = {}, {}, {}
    writes: queue.Queue = queue.Queue()  # (shard, range start, received so far, last piece): `file_direct`'s writer
    for shard in shards if into_dir else ():
        fd = os.open(os.path.join(into_dir, shard), os.O_RDWR | os.O_CREAT, 0o644)
        if file_direct:
            direct[shard] = os.open(os.path.join(into_dir, shard), os.O_WRONLY | os.O_DIRECT)
        if file_map:
            os.ftruncate(fd, len(bufs[shard]))
            maps[shard] = np.frombuffer(mmap.mmap(fd, len(bufs[shard]), mmap.MAP_SHARED), np.uint8)
            os.close(fd)  # (the map keeps the file)
        else:
            files[shard] = fd
    if prefault:
        import ctypes

        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        addresses = [(np.frombuffer(b, np.uint8).ctypes.data, len(b)) for b in bufs.values()]

        def fault_in():
            for address, length in addresses:
                lo = -(-address // 4096) * 4096
                madvise(lo, (address + length) // 4096 * 4096 - lo, 23)  # MADV_POPULATE_WRITE

        populate = threading.Thread(target=fault_in)
        populate.start()

    def worker():
        c = http.client.HTTPConnection(u.hostname, u.port)
        buf = memoryview(bytearray(bounce)) if bounce else None
        while True:
            with lock:
                if not jobs:
                    break
                path, shard, s, e = jobs.pop()
            c.request("GET", path, headers={"Range": f"bytes={s}-{e - 1}"})
            r = c.getresponse()
            assert r.status == 206, r.status
            view, done, written = (memoryview(maps[shard])[s:e] if maps else bufs[shard][s:e]), 0, 0
            cast_to = 0  # `cast_inplace`: bytes of `view` cast so far
            while done < e - s:
                if buf is None and kernel is not None:  # into place, then cast there while the piece is in cache
                    n = r.readinto(view[done:done + min(1 << 20, e - s - done)])
                    upto = (done + n) // 2 * 2
                    if upto > cast_to:
                        piece = np.frombuffer(view[cast_to:upto], np.uint16)
                        kernel(piece, piece, 1, piece.size, 0, 0)
                        cast_to = upto
                elif buf is None:
                    n = r.readinto(view[done:])
                elif kernel is not None:  # whole elements only: an odd byte waits for the next piece
                    n = r.readinto(buf[:min(bounce, e - s - done)])
                    while n % 2:
                        more = r.readinto(buf[n:n + 1])
                        assert more, "short read"
                        n += more
                    src = np.frombuffer(buf[:n], np.uint16)
                    kernel(src, np.frombuffer(view[done:done + n], np.uint16), 1, src.size, 0, 0)
                else:
                    n = r.readinto(buf[:min(bounce, e - s - done)])
                    view[done:done + n] = buf[:n]
                assert n, "short read"
                done += n
                if direct and (done - written >= 8 << 20 or done == e - s):
                    writes.put((shard, view, s, done, done == e - s))  # the writer writes what arrived
                    written = done
                elif files and (done - written >= 8 << 20 or done == e - s):
                    while written < done:
                        written += os.pwrite(files[shard], view[written:done], s + written)
            if maps:  # in the file's pages; then into memory
                bufs[shard][s:e] = view
        c.close()

    def writer():  # `file_direct`: writes each range's bytes in arrival order, tracking how far it got
        reached: dict = {}
        while (item := writes.get()) is not None:
            shard, view, s, done, last = item
            reached[shard, s] = _write_direct(files[shard], direct[shard], view, s, reached.get((shard, s), 0),
                                              done, last)

    threads = [threading.Thread(target=worker) for _ in range(ways)]
    writing = threading.Thread(target=writer) if direct else None
    for t in threads + ([writing] if writing else []):
        t.start()
    for t in threads + ([populate] if populate else []):
        t.join()
    if writing:
        writes.put(None)
        writing.join()
    for fd in list(files.values()) + list(direct.values()):
        os.close(fd)
    return bufs


def _write_direct(fd: int, direct_fd: int, view, start: int, written: int, done: int, last: bool) -> int:
    """Write `view[written:done]` (a range received from file offset `start`) to the file: whole pages with
    direct I/O, the partial page before the first page boundary through the page cache, and, on the `last`
    call, the partial page after the last boundary too. Returns how far it wrote."""
    pos, upto = start + written, start + done
    head = min(-(-pos // 4096) * 4096, upto)
    while pos < head:
        pos += os.pwrite(fd, view[pos - start:head - start], pos)
    body = upto // 4096 * 4096
    while pos < body:
        pos += os.pwrite(direct_fd, view[pos - start:body - start], pos)
    while last and pos < upto:
        pos += os.pwrite(fd, view[pos - start:upto - start], pos)
    return pos - start


def _replay(base_url: str, requests_file: str, ways: int = 4) -> int:
    """`replay:NAME`: send the logged (path, Range) GETs of `requests_file` on `ways` keep-alive `http.client`
    connections, each reply received whole into the thread's warm buffer (nothing parsed, nothing kept).
    Returns the body bytes received; a reply that is not a 200/206 or comes short stops the run."""
    import http.client
    import threading

    u = urllib.parse.urlsplit(base_url)
    with open(requests_file) as f:
        jobs = [tuple(job) for job in json.load(f)]
    jobs.reverse()
    lock = threading.Lock()
    received = [0]
    errors: list = []

    def worker():
        c = http.client.HTTPConnection(u.hostname, u.port)
        buf = memoryview(bytearray(MULTI_BODY_MAX))
        try:
            while True:
                with lock:
                    if not jobs:
                        return
                    path, ranges = jobs.pop()
                c.request("GET", path, headers={"Range": ranges} if ranges else {})
                r = c.getresponse()
                if r.status not in (200, 206):
                    raise RuntimeError(f"replay: {path} {ranges[:40]}: HTTP {r.status}")
                want, got = int(r.headers["Content-Length"]), 0
                while got < want:
                    n = r.readinto(buf[:min(len(buf), want - got)])
                    if not n:
                        raise RuntimeError(f"replay: {path}: {got} of {want} bytes")
                    got += n
                with lock:
                    received[0] += got
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(ways)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return received[0]


MULTI_BODY_MAX = 16 << 20  # a replay thread's receive buffer (a multi-range reply is at most ~8 MiB and framing)


def logged_requests(log: str, prefix: str) -> list[tuple[str, str]]:
    """The (path, Range header) of every GET in nginx's access log (`start_nginx`'s format), in order, for paths
    under `prefix` (the checkpoint's folder)."""
    out = []
    with open(log) as f:
        for line in f:
            method, uri, _status, _nbytes, rng = line.rstrip("\n").split(" ", 4)
            rng = rng.strip('"')
            if method == "GET" and uri.startswith(prefix):
                out.append((uri, "" if rng == "-" else rng))
    return out


def _rss_anon(pid: int | str = "self") -> int:
    """RssAnon of a process (private memory, not the file pages of maps), in bytes; 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _Unsampled:
    """The contestant's memory as the parent samples it (`_run_sampled`): only the private memory it had when
    its timer started, so that the parent's peak can be told as growth. No thread in the contestant."""

    peak_anon = None

    def __enter__(self):
        self.base_anon = _rss_anon()
        return self

    def __exit__(self, *exc):
        return False


def _mem(mem) -> dict:
    """The contestant's memory, and the CPU its process has used so far (taken when its timer stops: user and
    system seconds of every thread, the kernel's receive copies and page faults included)."""
    peak = None if mem.peak_anon is None else mem.peak_anon - mem.base_anon
    used = resource.getrusage(resource.RUSAGE_SELF)
    return {"base_anon": mem.base_anon, "peak_anon": peak, "cpu_user": used.ru_utime, "cpu_sys": used.ru_stime}


def _number(v: str):
    """A storage option's value from the command line: a number where it is one (`3e8`), else the text (`auto`)."""
    try:
        return float(v)
    except ValueError:
        return v


def contestant(name: str, base_url: str, ckpt: str, cache: str | None, inproc_sampler: bool = False) -> dict:
    """Run one contestant in this (fresh) process; its timer starts before the contestant's own imports
    (numpy for the floor, lazyweights for lazyweights) and stops once its bytes are in memory. Memory is sampled
    from outside by the parent (`_run_sampled`); `inproc_sampler` runs the old in-process sampler instead (a
    Python thread reading /proc/self/status every 5 ms), kept only to show what it costs."""
    index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    out = None
    name, _, opts = name.partition("@")
    options = {k: _number(v) for k, v in (kv.split("=", 1) for kv in opts.split(":") if kv)} or None
    if inproc_sampler:
        sys.path.insert(0, BENCH)
        from memwatch import PeakMem

        sampler = PeakMem()
    else:
        sampler = _Unsampled()
    with sampler as mem:
        t = time.perf_counter()
        if name == "gs-floor":  # `floor` on the media download URLs of the GCS side (`run_gcs`)
            name, base_url = "floor", os.environ["BENCH_GCS_MEDIA"]
        if name in ("floor", "floor-bounce", "floor-prefault", "floor-cast", "floor-cast-inplace", "floor-file",
                    "floor-file-map", "floor-file-direct"):
            _urllib_floor(base_url, shards, bounce=(1 << 20) if name in ("floor-bounce", "floor-cast") else 0,
                          cast=name in ("floor-cast", "floor-cast-inplace"),
                          prefault=name == "floor-prefault", into_dir=cache if name.startswith("floor-file") else None,
                          file_map=name == "floor-file-map", file_direct=name == "floor-file-direct")
            seconds = time.perf_counter() - t
            return {"seconds": seconds, **_mem(mem), "digest": None}
        if name == "replay":  # --url is the server's root, --cache the logged requests' file
            received = _replay(base_url, cache)
            seconds = time.perf_counter() - t
            return {"seconds": seconds, **_mem(mem), "digest": None, "received": received}
        if name == "download4":
            import requests

            def part(shard, buf, s, e):
                url = f"{base_url}/{shard}"
                with requests.get(url, headers={"Range": f"bytes={s}-{e - 1}"}, stream=True) as r:
                    assert r.status_code == 206
                    r.raw.readinto(memoryview(buf)[s:e])

            def size(shard):
                return int(requests.head(f"{base_url}/{shard}").headers["Content-Length"])

            _download4(shards, size, part)
            seconds = time.perf_counter() - t
            return {"seconds": seconds, **_mem(mem), "digest": None}
        if name == "rank0of4":
            import lazyweights as lw

            weights = lw.load_weights([f"{base_url}/model.safetensors.index.json"], storage_options=options)
            out = lw.plan(lw.shard({k: v.data() for k, v in weights.items()}, 0, 4)).materialize()
        elif name == "rank0of4-w1":
            import lazyweights as lw
            from lazyweights.tools import demo as w1

            weights = lw.load_weights([f"{base_url}/model.safetensors.index.json"], storage_options=options)
            sd = w1.convert_safetensor_state_dict(dict(weights.items()), huggingface_config=_config(ckpt))
            out = lw.plan(lw.shard(sd, 0, 4)).materialize()
        elif name == "convert":
            import lazyweights as lw
            from lazyweights.tools import demo as w1

            weights = lw.load_weights([f"{base_url}/model.safetensors.index.json"])
            sd = w1.convert_safetensor_state_dict(dict(weights.items()), huggingface_config=_config(ckpt))
            folder = tempfile.mkdtemp(prefix="bench-convert-")
            try:
                files = lw.plan(sd).save(folder, budget="256MB", max_shard_size="1GB")
                seconds = time.perf_counter() - t
                spent = _mem(mem)  # before the hashing below
                digest = hashlib.sha256()
                for f in sorted(files):
                    with open(f, "rb") as fh:
                        for chunk in iter(lambda: fh.read(1 << 24), b""):
                            digest.update(chunk)
            finally:
                shutil.rmtree(folder)
            return {"seconds": seconds, **spent, "digest": digest.hexdigest()}
        elif name.startswith(("lazyweights", "s3-lazyweights", "gs-lazyweights")):
            import lazyweights as lw
            from lazyweights.tools import demo as w1

            if name.startswith("s3-"):
                options = _s3_fsspec_options()
            elif name.startswith("gs-"):
                options = {"endpoint_url": os.environ["BENCH_GCS_ENDPOINT"]}
            weights = lw.load_weights([f"{base_url}/model.safetensors.index.json"], cache=cache,
                                      storage_options=options)
            sd = w1.convert_safetensor_state_dict(dict(weights.items()), huggingface_config=_config(ckpt))
            out = lw.plan(sd).materialize()
            returned = time.perf_counter() - t  # what the caller waits for: the outputs are in memory
            if cache:  # timed until the cache holds every byte too, as floor-file's are in its files
                from lazyweights.io.remote import RemoteFile

                for f in list(RemoteFile._cache.values()):
                    if f._host is not None:
                        f._host.flush()
        elif name in ("fsspec", "s3-fsspec"):
            import fsspec
            from safetensors.torch import load  # safetensors.numpy cannot hold bf16

            opts = _s3_fsspec_options() if name == "s3-fsspec" else {}
            out = {}
            for shard in shards:
                with fsspec.open(f"{base_url}/{shard}", "rb", **opts) as f:
                    out.update(_w1_numpy(load(f.read()).items(), ckpt))
        elif name == "s3-runai":
            from runai_model_streamer import SafetensorsStreamer

            out = {}
            with SafetensorsStreamer() as streamer:
                streamer.stream_files([f"{base_url}/{shard}" for shard in shards])
                out.update(_w1_numpy(streamer.get_tensors(), ckpt))
        elif name == "s3-download4":
            import boto3

            bucket, prefix = base_url[len("s3://"):].split("/", 1)
            client = boto3.client("s3", **_s3_boto_options())

            def s3_part(shard, buf, s, e):
                key = f"{prefix}/{shard}"
                body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={s}-{e - 1}")["Body"]
                view, done = memoryview(buf)[s:e], 0
                while done < e - s:
                    n = body._raw_stream.readinto(view[done:])
                    assert n, "short read"
                    done += n

            def s3_size(shard):
                return client.head_object(Bucket=bucket, Key=f"{prefix}/{shard}")["ContentLength"]

            _download4(shards, s3_size, s3_part)
            seconds = time.perf_counter() - t
            return {"seconds": seconds, **_mem(mem), "digest": None}
        seconds = time.perf_counter() - t
    if name.startswith("lazyweights") and cache:
        return {"seconds": seconds, "returned_seconds": returned, **_mem(mem), "digest": _digest(out)}
    return {"seconds": seconds, **_mem(mem), "digest": _digest(out)}


# --- the driver ---------------------------------------------------------------------------------------------
def _run_sampled(commands: list[list[str]], env=None, every: float = 0.005) -> tuple[float, list[dict]]:
    """Start `commands` together and wait for all: (seconds from the first start until the last exit, and per
    process its returncode, stdout, stderr and peak RssAnon). Memory is sampled from here, every `every`
    seconds, reading /proc/PID/status: a sampler inside the contestant would be a Python thread sharing its GIL
    (the old in-process one cost lazyweights 0.6-0.8 s in two of four runs and nothing in the other two, the
    floor nothing: benchmarks/RESULTS.md, issue 35), so nothing of the harness runs inside a contestant."""
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in commands]
    t = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=o, stderr=e, text=True, env=env) for c, (o, e) in zip(commands, files)]
    peaks = [0] * len(procs)
    while True:
        alive = False
        for i, p in enumerate(procs):
            if p.poll() is None:
                alive = True
                peaks[i] = max(peaks[i], _rss_anon(p.pid))
        if not alive:
            break
        time.sleep(every)
    seconds = time.perf_counter() - t
    runs = []
    for p, (o, e), peak in zip(procs, files, peaks):
        o.seek(0)
        e.seek(0)
        runs.append({"returncode": p.returncode, "stdout": o.read(), "stderr": e.read(), "peak": peak})
        o.close()
        e.close()
    return seconds, runs


def start_nginx(root: str, server: str = ""):
    """Debian's nginx on 127.0.0.1 serving `root` (plus `server`: more directives for its server block):
    (process, port, access log)."""
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    base = tempfile.mkdtemp(prefix="bench-nginx-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    user = "user root root;" if os.geteuid() == 0 else ""
    with open(os.path.join(base, "nginx.conf"), "w") as f:
        f.write(f"""{user}
daemon off; worker_processes 2; pid {base}/nginx.pid; error_log {base}/error.log warn;
events {{ worker_connections 512; }}
http {{ log_format counted '$request_method $uri $status $body_bytes_sent "$http_range"';
  access_log {base}/access.log counted; sendfile on;
  client_body_temp_path {base}/b; proxy_temp_path {base}/p; fastcgi_temp_path {base}/f; uwsgi_temp_path {base}/u;
  scgi_temp_path {base}/s;
  server {{ listen 127.0.0.1:{port}; root {root}; {server} }} }}
""")
    proc = subprocess.Popen([exe, "-c", f"{base}/nginx.conf", "-p", base])
    proc.folder = base  # its config, log and pid file: removed by stop_nginx
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, port, os.path.join(base, "access.log")


def stop_nginx(proc) -> None:
    """Stop a server from `start_nginx` and remove its folder."""
    proc.terminate()
    proc.wait(timeout=30)
    shutil.rmtree(proc.folder, ignore_errors=True)


def served_bytes(log: str) -> int:
    with open(log) as f:
        return sum(int(line.split()[3]) for line in f if line.startswith("GET"))


def run_s3(ckpt: str, once, reference: dict, reps: int) -> dict:
    """Serve the checkpoint to S3 clients and run the S3 contestants; their outputs must equal `reference`.

    The endpoint is nginx answering S3's path-style GetObject/HeadObject (`GET /bucket/key` with Range,
    `HEAD`, ETag and If-Match are plain HTTP; nginx ignores the SigV4 headers), serving bucket `models`, key
    prefix `w1/` from a folder of symlinks to the checkpoint. Not moto: moto's server reads the whole object for
    every ranged GET, so a client that fetches in parts (runai, lazyweights) would be timed on moto's cost, not
    its own (moto stays the S3 server of the correctness tests, `tests/io/`)."""
    root = tempfile.mkdtemp(prefix="bench-s3-")
    os.makedirs(os.path.join(root, "models", "w1"))
    for f in os.listdir(ckpt):
        os.symlink(os.path.join(ckpt, f), os.path.join(root, "models", "w1", f))
    proc, port, _ = start_nginx(root)
    endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ, BENCH_S3_ENDPOINT=endpoint, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
               RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0")
    return _run_side(("s3-download4", "s3-lazyweights", "s3-runai", "s3-fsspec"), "s3://models/w1", env, once,
                     reference, reps, proc, root)


def _run_side(names, base: str, env: dict, once, reference: dict, reps: int, proc, root: str) -> dict:
    """Run `names` `reps` times each (round-robin) against `base` with `env`, each output checked against
    `reference`; then stop the side's server `proc` and remove its folder `root`."""
    try:
        results: dict[str, list] = {}
        for _ in range(reps):
            for name in names:
                r = once(name, base=base, env=env)
                if r["digest"] is not None and r["digest"] != reference:
                    raise SystemExit(f"{name}: output differs from the local materialization")
                results.setdefault(name, []).append(r)
        return results
    finally:
        stop_nginx(proc)
        shutil.rmtree(root)


def run_gcs(ckpt: str, once, reference: dict, reps: int) -> dict:
    """Serve the checkpoint to GCS clients and run the GCS contestants; their outputs must equal `reference`.

    The endpoint is nginx answering what lazyweights' gs:// reader asks of GCS's JSON API: each object's
    metadata (`GET /storage/v1/b/BUCKET/o/NAME`: a static JSON file of its size and generation) and its media
    (`GET /download/storage/v1/b/BUCKET/o/NAME?alt=media` with Range: the file, `X-Goog-Generation` added to
    every reply). nginx decodes the `%2F` of an object name into a path. Not fake-gcs-server (the emulator the
    tests use): it holds objects in its own memory and would time its copies, not the client's. `gs-floor` is
    `floor` on the same media URLs."""
    root = tempfile.mkdtemp(prefix="bench-gcs-")
    media = os.path.join(root, "download", "storage", "v1", "b", "models", "o", "w1")
    meta = os.path.join(root, "storage", "v1", "b", "models", "o", "w1")
    os.makedirs(media)
    os.makedirs(meta)
    for f in os.listdir(ckpt):
        os.symlink(os.path.join(ckpt, f), os.path.join(media, f))
        with open(os.path.join(meta, f), "w") as out:
            json.dump({"size": str(os.path.getsize(os.path.join(ckpt, f))), "generation": "1"}, out)
    proc, port, _ = start_nginx(root, "add_header X-Goog-Generation 1 always;")
    endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ, BENCH_GCS_ENDPOINT=endpoint,
               BENCH_GCS_MEDIA=f"{endpoint}/download/storage/v1/b/models/o/w1")
    env.pop("STORAGE_EMULATOR_HOST", None)
    return _run_side(("gs-floor", "gs-lazyweights"), "gs://models/w1", env, once, reference, reps, proc, root)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prime-gb", type=float, default=3.0)
    ap.add_argument("--contestant", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--inproc-sampler", action="store_true",
                    help="sample memory with a thread inside each contestant (the old harness, kept for the A/B; "
                         "see NAME+sampler)")
    ap.add_argument("--s3", action="store_true", help="also run the S3 contestants (S3 protocol served by nginx)")
    ap.add_argument("--gcs", action="store_true", help="also run the GCS contestants (GCS's JSON API served by nginx)")
    ap.add_argument("--only", help="comma-separated contestants to run (default: all but the S3 ones); NAME+sampler "
                                   "runs NAME with the in-process sampler, beside NAME without it")
    ap.add_argument("--link-rate", help="run in a network namespace whose loopback is limited to this rate (tc's "
                                        "units, e.g. 2500mbit)")
    args = ap.parse_args()
    ckpt = os.path.abspath(args.ckpt)
    if args.link_rate:
        argv = [a for i, a in enumerate(sys.argv) if a != "--link-rate" and sys.argv[i - 1] != "--link-rate"
                and not a.startswith("--link-rate=")]
        shaped = (f"ip link set lo up && tc qdisc add dev lo root tbf rate {args.link_rate} burst 1mb latency 100ms "
                  f"&& LAZYWEIGHTS_BENCH_LINK={args.link_rate} exec {sys.executable} "
                  + " ".join(f"'{a}'" for a in argv))
        os.execvp("unshare", ["unshare", "-rn", "sh", "-c", shaped])
    if args.contestant:
        start = time.perf_counter()
        r = contestant(args.contestant, args.url, ckpt, args.cache, args.inproc_sampler)
        # what ran after the timer stopped (hashing the output), left out of the parent's process seconds
        r["after_seconds"] = time.perf_counter() - start - r["seconds"]
        print(json.dumps(r))
        return
    every = ["floor", "floor-bounce", "floor-prefault", "floor-cast", "curl", "lazyweights", "fsspec", "rank0of4",
             "rank0of4-w1", "convert", "floor-file", "floor-file-map", "floor-file-direct", "lazyweights-cached",
             "4proc-cache"]
    chosen = args.only.split(",") if args.only else every

    # as an installed package is: compiled once (pip compiles on install; with PYTHONDONTWRITEBYTECODE set, as on
    # the development VMs, every contestant would compile lazyweights' edited modules again inside its timer)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(HERE, "..", "lazyweights")],
                   check=False, stdout=subprocess.DEVNULL)
    root = os.path.dirname(ckpt)
    proc, port, log = start_nginx(root)
    url = f"http://127.0.0.1:{port}/{os.path.basename(ckpt)}"
    total = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    subprocess.run(["sh", "-c", f"cat {ckpt}/*.safetensors > /dev/null"], check=True)  # server's page cache warm
    shard_urls = [f"{url}/{f}" for f in sorted(os.listdir(ckpt)) if f.endswith(".safetensors")]

    def prime():
        subprocess.run([sys.executable, "-c", PRIME, str(int(args.prime_gb * 2**30))], check=True)

    def command(name, base, cache):
        inproc = args.inproc_sampler or name.endswith("+sampler")  # `floor+sampler`: the floor, sampled inside
        return ([sys.executable, __file__, ckpt, "--contestant", name.removesuffix("+sampler"), "--url", base]
                + (["--cache", cache] if cache else []) + (["--inproc-sampler"] if inproc else []))

    def result(run, process_seconds):
        """A contestant's report, with the peak the parent sampled (growth from the timer's start) unless it
        sampled itself (--inproc-sampler), and the whole process's seconds (interpreter start and exit too)."""
        r = json.loads(run["stdout"].strip().splitlines()[-1])
        if r.get("peak_anon") is None:
            r["peak_anon"] = max(0, run["peak"] - r.get("base_anon", 0))
        r["process_seconds"] = process_seconds - r.get("after_seconds", 0.0)
        return r

    def once(name, cache=None, base=url, env=None):
        prime()
        open(log, "w").close()
        process_seconds, (run,) = _run_sampled([command(name, base, cache)], env=env)
        if run["returncode"]:
            raise SystemExit(f"{name}: failed:\n{run['stderr'][-3000:]}")
        r = result(run, process_seconds)
        r["served"] = served_bytes(log)
        return r

    def curl():
        prime()
        open(log, "w").close()
        seconds, (run,) = _run_sampled([["curl", "-s", "--parallel", "--parallel-max", "3"]
                                        + sum((["-o", "/dev/null", u] for u in shard_urls), [])])
        if run["returncode"]:
            raise SystemExit(f"curl: failed:\n{run['stderr'][-3000:]}")
        return {"seconds": seconds, "process_seconds": seconds, "peak_anon": run["peak"], "digest": None,
                "served": served_bytes(log)}

    def processes(n):
        """n lazyweights processes started together on one empty cache (the ranks of one host)."""
        cache = tempfile.mkdtemp(prefix="bench-cache-")
        prime()
        open(log, "w").close()
        seconds, runs = _run_sampled([command("lazyweights-cached", url, cache) for _ in range(n)])
        shutil.rmtree(cache)
        for run in runs:
            if run["returncode"]:
                raise SystemExit(f"{n}proc-cache: a process failed:\n{run['stderr'][-3000:]}")
        rs = [result(run, seconds) for run in runs]
        if any(r["digest"] != reference for r in rs):
            raise SystemExit(f"{n}proc-cache: a process's output differs from the local materialization")
        return {"seconds": seconds, "process_seconds": seconds, "peak_anon": max(r["peak_anon"] for r in rs),
                "digest": None, "served": served_bytes(log)}

    replays: dict[str, str] = {}
    try:
        import lazyweights as lw
        from lazyweights.tools import demo as w1

        local = lw.plan(w1.convert_safetensor_state_dict(dict(lw.load_weights([ckpt]).items()),
                                                         huggingface_config=_config(ckpt))).materialize()
        reference = _digest(local)
        del local
        results: dict[str, list] = {}
        references = {}
        if "convert" in chosen:
            folder = tempfile.mkdtemp(prefix="bench-convert-")
            files = lw.plan(w1.convert_safetensor_state_dict(dict(lw.load_weights([ckpt]).items()),
                                                             huggingface_config=_config(ckpt))).save(
                folder, budget="256MB", max_shard_size="1GB")
            digest = hashlib.sha256()
            for f in sorted(files):
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 24), b""):
                        digest.update(chunk)
            references["convert"] = digest.hexdigest()
            shutil.rmtree(folder)
        if any(n.partition("@")[0] == "rank0of4" for n in chosen):
            references["rank0of4"] = _digest(lw.plan(lw.shard({k: v.data() for k, v in lw.load_weights([ckpt]).items()},
                                                              0, 4)).materialize())
        if any(n.partition("@")[0] == "rank0of4-w1" for n in chosen):
            references["rank0of4-w1"] = _digest(lw.plan(lw.shard(w1.convert_safetensor_state_dict(
                dict(lw.load_weights([ckpt]).items()), huggingface_config=_config(ckpt)), 0, 4)).materialize())
        for name in chosen:  # replay:NAME: the file of NAME's logged requests, captured in one untimed run first
            if name.startswith("replay:"):
                once(name.partition(":")[2])
                requests = logged_requests(log, urllib.parse.urlsplit(url).path + "/")
                fd, replays[name] = tempfile.mkstemp(prefix="bench-replay-", suffix=".json")
                with os.fdopen(fd, "w") as f:
                    json.dump(requests, f)
        cached = []
        for _ in range(args.reps):  # interleaved, so a noisy minute hurts every contestant alike
            for name in chosen:
                if name == "curl":
                    r = curl()
                elif name in replays:
                    r = once("replay", replays[name])
                elif name == "4proc-cache":
                    r = processes(4)
                elif name == "lazyweights-cached":  # a first run on an empty cache, then a second on it
                    cache = tempfile.mkdtemp(prefix="bench-cache-")
                    first, second = once(name, cache), once(name, cache)
                    shutil.rmtree(cache)
                    if first["digest"] != reference or second["digest"] != reference:
                        raise SystemExit(f"{name}: output differs from the local materialization")
                    cached.append((first, second))
                    print(f"  {name}: {first['seconds']:.3f} s, then {second['seconds']:.3f} s, load average "
                          f"{os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
                    continue
                elif name.startswith("floor-file"):
                    folder = tempfile.mkdtemp(prefix="bench-floor-file-")
                    r = once(name, folder)
                    shutil.rmtree(folder)
                else:
                    r = once(name)
                want = references.get(name.partition("@")[0], reference)
                if r["digest"] is not None and r["digest"] != want:
                    raise SystemExit(f"{name}: output differs from the local materialization")
                results.setdefault(name, []).append(r)
                print(f"  {name}: {r['seconds']:.3f} s (process {r['process_seconds']:.3f} s), load average "
                      f"{os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        if args.s3:
            s3_results = run_s3(ckpt, once, reference, args.reps)
        if args.gcs:
            gcs_results = run_gcs(ckpt, once, reference, args.reps)
    finally:
        stop_nginx(proc)
        for file in replays.values():
            os.remove(file)

    # the floor is the fastest of the plain downloads (readinto straight into place, through a buffer, or
    # with the buffers faulted in by another thread)
    floors = {n: statistics.median(r["seconds"] for r in results[n])
              for n in ("floor", "floor-bounce", "floor-prefault") if n in results}
    floor_name = min(floors, key=floors.__getitem__) if floors else None
    floor = floors[floor_name] if floor_name else float("nan")
    full = statistics.median(r["seconds"] for r in results["lazyweights"]) if "lazyweights" in results else None
    link = os.environ.get("LAZYWEIGHTS_BENCH_LINK")
    link = f", loopback limited to {link}" if link else ""
    print(f"W1 over HTTP (nginx on 127.0.0.1{link}), {total / 1e9:.2f} GB in shards, medians of {args.reps}, "
          "warm memory; "
          f"'x floor' against {floor_name} (the faster plain download)")
    floor_process = (statistics.median(r["process_seconds"] for r in results[floor_name]) if floor_name
                     else float("nan"))
    print("timed: in the contestant, from before its imports until its bytes are in memory; 'process s': the whole")
    print("process from its start to its exit, timed by the parent, less the hashing of its output; memory sampled")
    print("by the parent (--inproc-sampler: by a thread in the contestant); 'CPU s': the contestant's user and system")
    print("seconds when its timer stopped (every thread; the kernel's receive copies and page faults included)")
    print(f"{'contestant':<28}{'wall s':>9}{'x floor':>9}{'x full':>8}{'process s':>11}{'x floor':>9}{'CPU s':>7}"
          f"{'served/ckpt':>13}{'peak RssAnon GB':>17}  runs s")
    for name, rs in results.items():
        s = statistics.median(r["seconds"] for r in rs)
        ps = statistics.median(r["process_seconds"] for r in rs)
        served = statistics.median(r["served"] for r in rs)
        peak = statistics.median(r["peak_anon"] for r in rs) / 1e9
        rel = f"{s / full:>8.2f}" if full else f"{'':>8}"
        runs = ", ".join(f"{r['seconds']:.2f}" for r in rs)
        cpu = [r["cpu_user"] + r["cpu_sys"] for r in rs if r.get("cpu_user") is not None]
        cpu_s = f"{statistics.median(cpu):>7.2f}" if cpu else f"{'':>7}"
        print(f"{name:<28}{s:>9.3f}{s / floor:>9.2f}{rel}{ps:>11.3f}{ps / floor_process:>9.2f}{cpu_s}"
              f"{served / total:>13.4f}{peak:>17.2f}  {runs}")
    print("every output identical to the local materialization (rank 0: to the same slices of it)")
    for name in (n for n in results if n.startswith("replay:")):
        plan_floor = statistics.median(r["seconds"] for r in results[name])
        of = name.partition(":")[2]
        mine = (f"; {of} took {statistics.median(r['seconds'] for r in results[of]) / plan_floor:.2f}x it"
                if of in results else "")
        against_full = f", {plan_floor / full:.2f}x the full lazyweights load" if full else ""
        print(f"{name}: {of}'s own requests, replayed by a plain client, {plan_floor:.3f} s: "
              f"{plan_floor / floor:.2f}x the floor of the whole checkpoint{against_full}{mine}")
    if full and "floor-cast" in results:
        cast_s = statistics.median(r["seconds"] for r in results["floor-cast"])
        print(f"lazyweights against floor-cast (the plain download casting bf16 -> f16 as it receives): "
              f"{full / cast_s:.2f}x; the cast alone costs the plain download {cast_s / floor:.2f}x")
    if cached:
        first_s = statistics.median(f["seconds"] for f, _ in cached)
        returned_s = statistics.median(f["returned_seconds"] for f, _ in cached)
        second_s = statistics.median(s["seconds"] for _, s in cached)
        file_floors = {n: statistics.median(r["seconds"] for r in results[n])
                       for n in ("floor-file", "floor-file-map", "floor-file-direct") if n in results}
        file_name = min(file_floors, key=file_floors.__getitem__) if file_floors else None
        file_floor = (f", {first_s / file_floors[file_name]:.2f}x {file_name}, which writes the bytes to a file as "
                      "well" if file_name else "")
        served = max(f["served"] for f, _ in cached) / total
        print(f"cache (medians of {len(cached)}): a first run served {served:.4f}x the checkpoint in {first_s:.3f} s "
              f"({first_s / floor:.2f}x the floor{file_floor}), a second "
              f"{max(s['served'] for _, s in cached)} bytes in {second_s:.3f} s")
        uncached = f", {returned_s / full:.2f}x the uncached lazyweights run" if full else ""
        print(f"  the first run's materialize() returned at {returned_s:.3f} s ({returned_s / floor:.2f}x the floor"
              f"{uncached}); the rest is the cache's writer finishing")
        peaks = [statistics.median(run[k]["peak_anon"] for run in cached) / 1e9 for k in (0, 1)]
        print(f"  peak RssAnon: the first run {peaks[0]:.2f} GB, the second {peaks[1]:.2f} GB")
    if args.s3:
        _print_side("W1 over the S3 protocol (path-style GET/HEAD served by nginx on 127.0.0.1)", s3_results,
                    "s3-download4", args.reps)
    if args.gcs:
        _print_side("W1 over GCS's JSON API (media downloads served by nginx on 127.0.0.1)", gcs_results,
                    "gs-floor", args.reps)


def _print_side(title: str, results: dict, floor_name: str, reps: int) -> None:
    """The table of an S3 or GCS side: each contestant's median wall time against the side's own floor, its CPU
    seconds and its peak private memory."""
    floor = statistics.median(r["seconds"] for r in results[floor_name])
    print(f"\n{title}, medians of {reps}, warm memory")
    print(f"{'contestant':<22}{'wall s':>9}{'x floor':>9}{'CPU s':>7}{'peak RssAnon GB':>17}  identical")
    for name, rs in results.items():
        s = statistics.median(r["seconds"] for r in rs)
        cpu = [r["cpu_user"] + r["cpu_sys"] for r in rs if r.get("cpu_user") is not None]
        cpu_s = f"{statistics.median(cpu):>7.2f}" if cpu else f"{'':>7}"
        peak = statistics.median(r["peak_anon"] for r in rs) / 1e9
        print(f"{name:<22}{s:>9.3f}{s / floor:>9.2f}{cpu_s}{peak:>17.2f}  {'floor' if name == floor_name else 'yes'}")


if __name__ == "__main__":
    main()
