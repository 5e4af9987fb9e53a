"""vLLM loader benchmark (issue 36): weight-loading seconds, bytes and peak host memory for vLLM's default
`safetensors` loader, `runai_streamer` (where `runai-model-streamer` is installed) and `--load-format
lazyweights`, on the same local folder; with `--http`, lazyweights from nginx at TP=1 and TP=2 (each rank's
bytes) beside the object-storage issue's network floor (benchmarks/bench_remote.py's `floor` on the same file from
the same nginx); with `--s3`, `runai_streamer` and lazyweights from the same folder in moto's S3 server (vLLM's
default loader reads neither http(s):// nor s3:// sources). Medians of `--reps`; each run is a fresh process,
contestants interleaved.

Run in an environment with vLLM (`pip install "lazyweights[vllm]"`; see .ci/run):

    python benchmarks/bench_vllm.py [--hidden 1024 --layers 8] [--reps 3] [--loaders none] [--http]
        [--s3 [both|moto|direct]] [--s3-reps N]

`--s3` needs `pip install "runai-model-streamer[s3]" "moto[server]"`. moto answers each ranged GET by reading the
whole object, so `--s3 moto` times moto as much as the client (runai_streamer's 2-8 MB requests on the 623 MB
model cost minutes); `--s3 direct` keeps moto's answers (listing, HEAD, ETag, If-Match, Range checks) and sends a
ranged GET's bytes from the file. Bytes over S3 are counted by a wrapper around moto's server (moto logs none).

The model is a random float32 Llama written with transformers' `save_pretrained` (hidden 1024, 8 layers,
intermediate 2816 by default: 156M parameters, 623 MB). Seconds: the loader's `load_weights` call, timed the same
way for every loader (it wraps each loader class's `load_weights`; vLLM's DefaultModelLoader and lazyweights also
log "Loading weights took X seconds", runai_streamer logs nothing comparable), with the CPU seconds the process
spent in it (user + system, all threads: less sensitive than wall time to other work on the machine). Peak RSS is
the process's ru_maxrss, which includes vLLM's own imports and the KV cache (1 GiB, VLLM_CPU_KVCACHE_SPACE=1) and is
the same for every contestant but the weights' handling; the anonymous memory (RssAnon, sampled every 2 ms) the
process gained during `load_weights` at its peak is the parameters' own memory (written for the first time) plus
whatever the loader holds beside them. Over HTTP, bytes are nginx's body bytes sent, told apart per rank by the
User-Agent lazyweights gives each rank's requests.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, resource, sys, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
def main():
    import json
    source, load_format, tp, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    if tp == 1:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import lazyweights.tools.vllm as lv
    lv.register()
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER
    cls = _LOAD_FORMAT_TO_MODEL_LOADER[load_format]
    inner = cls.load_weights
    import threading
    def anon():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))
    def timed(self, *a, **k):
        base, peak, done = anon(), [0], threading.Event()
        def sample():
            while not done.wait(0.002):
                peak[0] = max(peak[0], anon())
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        try:
            return inner(self, *a, **k)
        finally:
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            done.set()
            sampler.join()
            peak[0] = max(peak[0], anon())
            cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
            print("LOAD_WEIGHTS %.4f %.4f %d" % (t1 - t0, cpu, peak[0] - base), flush=True)
    cls.load_weights = timed
    from vllm import LLM
    kw = dict(enforce_eager=True, dtype="float32", max_model_len=128, gpu_memory_utilization=0.3,
              tensor_parallel_size=tp)
    if tp == 1:
        kw["distributed_executor_backend"] = "uni"
    if extra:
        kw["model_loader_extra_config"] = extra
    LLM(model=source, load_format=load_format, **kw)
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
if __name__ == "__main__":
    main()
"""

# The object-storage issue's network floor, as benchmarks/bench_remote.py runs its `floor` contestant: the file
# received into np.empty memory by 4 threads, each on its own keep-alive http.client connection, one ranged GET
# per quarter, `readinto` straight into place (bench_remote._urllib_floor, imported, not copied). Fresh process,
# warm memory, the same RssAnon sampling as the loaders' children.
FLOOR = r"""
import resource, sys, threading, time
sys.path.insert(0, sys.argv[3])
from bench_remote import _urllib_floor
def anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))
base, peak, done = anon(), [0], threading.Event()
def sample():
    while not done.wait(0.002):
        peak[0] = max(peak[0], anon())
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
if sys.argv[4] == "populated":
    # the same download into memory whose pages were faulted in first by madvise(MADV_POPULATE_WRITE) on two
    # threads, as the lazyweights loader does for vLLM's parameters (tools/vllm.populate_pages), inside the timer:
    # _urllib_floor's np.empty buffer otherwise takes one page fault per 4 KB inside readinto
    import ctypes, numpy as np
    from concurrent.futures import ThreadPoolExecutor
    madvise, empty = ctypes.CDLL(None).madvise, np.empty
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    def populated(n, dtype):
        a = empty(n, dtype)
        lo, hi = -(-a.ctypes.data // 4096) * 4096, (a.ctypes.data + a.nbytes) // 4096 * 4096
        mid = (lo + hi) // 2 // 4096 * 4096
        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda s: madvise(s[0], s[1] - s[0], 23), [(lo, mid), (mid, hi)])) == [0, 0]
        return a
    np.empty = populated
r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
bufs = _urllib_floor(sys.argv[1], [sys.argv[2]])
seconds, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
done.set()
sampler.join()
peak[0] = max(peak[0], anon())
print("FLOOR %.4f %.4f %d %d" % (seconds, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, peak[0] - base,
                                 sum(len(b) for b in bufs.values())))
"""

# moto's S3 server (the one tests/interop/test_vllm.py::test_s3_folder reads), wrapped so that each request's
# method, path, status, body bytes sent and User-Agent go to a log: moto itself logs no bytes. moto answers a
# ranged GET by reading the whole object and slicing it (moto 5.2: FakeKey.value, then _handle_range_header), so a
# client is timed on moto's cost per request. With a folder (argv[3], served as /BUCKET/PREFIX/ argv[4]), "direct"
# mode has moto answer a ranged GET of a file there as a HEAD (its status, ETag, If-Match and Range checks) and
# sends the range's bytes from the file: the same protocol and headers, without moto's whole-object read.
S3_SERVER = r"""
import os, re, sys, threading
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
port, log = int(sys.argv[1]), sys.argv[2]
folder, prefix = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
app, lock = DomainDispatcherApplication(create_backend_app), threading.Lock()
def direct(environ, start_response):
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", environ.get("HTTP_RANGE", ""))
    path = environ.get("PATH_INFO", "")
    if not (folder and m and environ["REQUEST_METHOD"] == "GET" and path.startswith(prefix)
            and not environ.get("QUERY_STRING")):
        return None
    local = os.path.join(folder, path[len(prefix):])
    if not os.path.isfile(local):
        return None
    got = []
    head = app(dict(environ, REQUEST_METHOD="HEAD"), lambda s, h, e=None: got.append((s, h)))
    for _ in head:
        pass
    status, headers = got[0]
    if not status.startswith("206"):
        return None
    begin, end = int(m.group(1)), min(int(m.group(2)), os.path.getsize(local) - 1)
    with open(local, "rb") as f:
        body = os.pread(f.fileno(), end - begin + 1, begin)
    headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "content-range")]
    headers += [("Content-Length", str(len(body))),
                ("Content-Range", "bytes %d-%d/%d" % (begin, end, os.path.getsize(local)))]
    start_response(status, headers)
    return [body]
def counted(environ, start_response):
    status = []
    def start(s, headers, exc_info=None):
        status.append(s.split()[0])
        return start_response(s, headers, exc_info)
    body = direct(environ, start)
    if body is None:
        body = app(environ, start)
    sent = 0
    try:
        for chunk in body:
            sent += len(chunk)
            yield chunk
    finally:
        if hasattr(body, "close"):
            body.close()
        with lock, open(log, "a") as f:
            f.write('%s %s %s %d "%s"\n' % (environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                                           status[0] if status else "-", sent, environ.get("HTTP_USER_AGENT", "")))
make_server("127.0.0.1", port, counted, threaded=True, request_handler=MotoRequestHandler).serve_forever()
"""

HERE = os.path.dirname(os.path.abspath(__file__))


def make_model(folder: str, hidden: int, layers: int) -> None:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=int(hidden * 2.75), num_hidden_layers=layers,
                                   num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
                                   head_dim=64, vocab_size=32000, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    # vLLM needs a tokenizer only to start: a trivial byte-level one
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.add_tokens([chr(i) for i in range(256)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)


def warm_memory(gib: int = 2) -> None:
    """Touch and free a few GiB so the contestant's fresh memory is not the host's cold memory
    (docs: these VMs hand freed memory back to their host about 2 s after a process frees it)."""
    b = bytearray(gib << 30)
    for i in range(0, len(b), 1 << 12):
        b[i] = 1
    del b


def run(source: str, load_format: str, tp: int = 1, extra: dict | None = None, env: dict | None = None) -> dict:
    warm_memory()
    env = dict(env or os.environ)
    if tp > 1:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(tp)))
    proc = subprocess.run([sys.executable, "-c", CHILD, source, load_format, str(tp), json.dumps(extra or {})],
                          capture_output=True, text=True, env=env)
    text = proc.stdout + proc.stderr
    timed = re.findall(r"LOAD_WEIGHTS ([0-9.]+) ([0-9.]+) (\d+)", text)
    logged = [float(x) for x in re.findall(r"Loading weights took ([0-9.]+) seconds", text)]
    rss = re.search(r"PEAK_RSS_KB (\d+)", text)
    if proc.returncode or not (timed or logged) or not rss:
        return {"error": text[-2000:]}
    # at TP > 1 the loaders run in vLLM's worker processes, where only their own log line times them
    return {"seconds": max(float(t[0]) for t in timed) if timed else max(logged),
            "cpu_seconds": max(float(t[1]) for t in timed) if timed else None,
            "anon_growth_mb": max(int(t[2]) for t in timed) / 1024 if timed else None,
            "logged_seconds": max(logged) if logged else None, "peak_rss_mb": int(rss.group(1)) / 1024}


def median(rs: list[dict], key: str):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def report(name: str, rs: list[dict], what: str = "load_weights") -> dict | None:
    ok = [r for r in rs if "error" not in r]
    if len(ok) < len(rs):
        print(f"{name}: {len(rs) - len(ok)} of {len(rs)} runs failed; the last: "
              f"{[r for r in rs if 'error' in r][-1]['error'][-1500:]}")
    if not ok:
        return None
    out = {k: median(ok, k) for k in ok[0] if k != "runs"}
    out["runs"] = len(ok)
    out["all_seconds"] = [round(r["seconds"], 3) for r in ok]
    extra = ", ".join(f"{k} {v:,.0f}" for k, v in out.items() if k.endswith(("bytes", "gets")) and v is not None)
    cpu = f", {out['cpu_seconds']:.2f} CPU s" if out.get("cpu_seconds") is not None else ""
    print(f"{name:>24}: {what} {out['seconds']:.2f} s (median of {len(ok)}: {out['all_seconds']}){cpu}"
          + (f", logged {out['logged_seconds']}, peak RSS {out['peak_rss_mb']:.0f} MB (engine process)"
             if "peak_rss_mb" in out else "")
          + (f", anonymous memory +{out['anon_growth_mb']:.0f} MB at its peak during {what}"
             if out.get("anon_growth_mb") is not None else "")
          + (f", {extra}" if extra else ""))
    return out


class Nginx:
    """nginx on 127.0.0.1 serving `root`, logging each GET's body bytes and User-Agent."""

    def __init__(self, root: str):
        exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        if exe is None:
            raise RuntimeError("nginx is not installed")
        self.base = tempfile.mkdtemp(prefix="bench-vllm-nginx-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = os.path.join(self.base, "access.log")
        user = "user root root;" if os.geteuid() == 0 else ""
        b = self.base
        with open(os.path.join(b, "nginx.conf"), "w") as f:
            f.write(f"""{user}
daemon off; worker_processes 2; pid {b}/nginx.pid; error_log {b}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format counted '$request_method $uri $status $body_bytes_sent "$http_user_agent"';
    access_log {self.log} counted;
    client_body_temp_path {b}/body; proxy_temp_path {b}/proxy; fastcgi_temp_path {b}/fcgi;
    uwsgi_temp_path {b}/uwsgi; scgi_temp_path {b}/scgi;
    types {{ application/octet-stream safetensors; application/json json; }}
    server {{ listen 127.0.0.1:{self.port}; root {root}; }}
}}
""")
        self.proc = subprocess.Popen([exe, "-c", os.path.join(b, "nginx.conf"), "-p", b],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def clear(self) -> None:
        open(self.log, "w").close()

    def by_agent(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with open(self.log) as f:
            for line in f:
                head, _, agent = line.rstrip("\n").partition(' "')
                method, _, _, sent = head.split()
                if method == "GET":
                    out[agent.rstrip('"')] = out.get(agent.rstrip('"'), 0) + int(sent)
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)


def floor_run(url: str, name: str, populated: bool = False) -> dict:
    """bench_remote.py's network floor for `url`/`name` in a fresh process, warm memory; `populated`: its buffer's
    pages faulted in first (FLOOR)."""
    warm_memory()
    proc = subprocess.run([sys.executable, "-c", FLOOR, url.rstrip("/"), name, HERE,
                           "populated" if populated else "plain"], capture_output=True, text=True)
    m = re.search(r"FLOOR ([0-9.]+) ([0-9.]+) (\d+) (\d+)", proc.stdout)
    if proc.returncode or not m:
        return {"error": (proc.stdout + proc.stderr)[-2000:]}
    return {"seconds": float(m.group(1)), "cpu_seconds": float(m.group(2)), "anon_growth_mb": int(m.group(3)) / 1024,
            "received_bytes": int(m.group(4))}


def http_runs(folder: str, reps: int, summary: dict, tp2_runs: bool = True) -> None:
    """From nginx, interleaved in each repetition: the network floor (bench_remote.py's `floor` on the same
    file), lazyweights at TP=1 (bytes fetched) and at TP=2 (each rank's bytes); medians of `reps`."""
    root = tempfile.mkdtemp(prefix="bench-vllm-root-")
    os.symlink(folder, os.path.join(root, "llama"))
    server = Nginx(root)
    try:
        url = server.url("llama/")
        subprocess.run(["sh", "-c", f"cat {folder}/*.safetensors > /dev/null"], check=True)  # server's page cache
        floor, floor_pop, tp1, tp2 = [], [], [], []
        for _ in range(reps):
            for populated, rows in ((False, floor), (True, floor_pop)):
                server.clear()
                r = floor_run(url, "model.safetensors", populated)
                r["fetched_bytes"] = sum(server.by_agent().values())
                rows.append(r)
            server.clear()
            r = run(url, "lazyweights")
            r["fetched_bytes"] = sum(server.by_agent().values())
            tp1.append(r)
            if not tp2_runs:
                print(f"  HTTP: floor {floor[-1].get('seconds', 'failed')}, populated "
                      f"{floor_pop[-1].get('seconds', 'failed')}, TP=1 {r.get('seconds', 'failed')}", flush=True)
                continue
            server.clear()
            r = run(url, "lazyweights", tp=2)
            agents = server.by_agent()
            for rank in range(2):
                r[f"rank{rank}_bytes"] = sum(b for a, b in agents.items() if f"vllm-tp-rank/{rank}-of-2" in a)
            r["engine_bytes"] = sum(agents.values()) - r["rank0_bytes"] - r["rank1_bytes"]
            tp2.append(r)
            print(f"  HTTP: floor {floor[-1].get('seconds', 'failed')}, populated "
                  f"{floor_pop[-1].get('seconds', 'failed')}, TP=1 {tp1[-1].get('seconds', 'failed')}, "
                  f"TP=2 {r.get('seconds', 'failed')}", flush=True)
        f = summary["http-floor"] = report("floor (bench_remote)", floor, "download")
        fp = summary["http-floor-populated"] = report("floor, pages populated", floor_pop, "download")
        t = summary["lazyweights-http"] = report("lazyweights over HTTP", tp1)
        if tp2_runs:
            summary["lazyweights-http-tp2"] = report("lazyweights HTTP TP=2", tp2)
        for label, fl in (("floor", f), ("populated floor", fp)):
            if fl and t:
                summary[f"http_ratio_to_{label.replace(' ', '_')}"] = t["seconds"] / fl["seconds"]
                print(f"{'lazyweights / ' + label:>30}: {t['seconds'] / fl['seconds']:.2f}x (goal: at most 1.3x)")
        print("vLLM's default loader reads no http(s):// source (vLLM takes one for a Hugging Face repo id)")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def s3_runs(folder: str, reps: int, summary: dict, direct: bool = False) -> None:
    """The same folder in moto's S3 (path-style, s3://models/llama/), interleaved in each repetition:
    `runai_streamer` (model s3://...) and lazyweights (model s3://..., storage_options); medians of `reps`. Bytes
    are the body bytes the counting wrapper around moto's server saw, GETs of .safetensors objects apart from the
    rest (config, tokenizer, listings). `direct`: ranged GETs of the folder's files answered from the file after
    moto's checks (S3_SERVER), so that the clients, not moto's whole-object reads, are timed."""
    import boto3

    base = tempfile.mkdtemp(prefix="bench-vllm-s3-")
    log = os.path.join(base, "s3.log")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", S3_SERVER, str(port), log]
                            + ([folder, "/models/llama/"] if direct else []),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        creds = dict(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
        client = boto3.client("s3", endpoint_url=endpoint, **creds)
        client.create_bucket(Bucket="models")
        for f in sorted(os.listdir(folder)):
            client.upload_file(os.path.join(folder, f), "models", f"llama/{f}")
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, RUNAI_STREAMER_S3_ENDPOINT=endpoint,
                   AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true", RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0")
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing", "region_name": "us-east-1"}
        model = "s3://models/llama/"
        contestants = {"runai_streamer": ("runai_streamer", None), "lazyweights": ("lazyweights",
                                                                                   {"storage_options": options})}
        results: dict[str, list] = {name: [] for name in contestants}

        def served() -> tuple[int, int, int]:
            weights = other = gets = 0
            with open(log) as f:
                for line in f:
                    method, path, _status, sent = line.split(" ", 4)[:4]
                    if method == "GET" and path.endswith(".safetensors"):
                        weights, gets = weights + int(sent), gets + 1
                    elif method == "GET":
                        other += int(sent)
            return weights, gets, other

        for _ in range(reps):
            for name, (load_format, extra) in contestants.items():
                open(log, "w").close()
                r = run(model, load_format, extra=extra, env=env)
                r["weights_bytes"], r["weights_gets"], r["other_bytes"] = served()
                results[name].append(r)
                print(f"  {name} ({'direct' if direct else 'moto'}): {r.get('seconds', 'failed')}", flush=True)
        for name, rs in results.items():
            label = "S3 direct" if direct else "S3 (moto)"
            summary[f"s3{'-direct' if direct else ''}-{name}"] = report(f"{name} {label}", rs)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--http", action="store_true", help="also lazyweights from nginx at TP=1 and TP=2, beside "
                    "bench_remote.py's network floor")
    ap.add_argument("--s3", choices=("both", "moto", "direct"), nargs="?", const="both",
                    help="also runai_streamer and lazyweights from moto's S3 server: as moto answers ranged GETs "
                    "(moto), with ranged GETs of the weights answered from the file (direct), or both")
    ap.add_argument("--no-tp2", action="store_true", help="with --http, leave out the TP=2 runs")
    ap.add_argument("--s3-reps", type=int, help="repetitions of the S3 runs (default --reps)")
    ap.add_argument("--loaders", default="safetensors,runai_streamer,lazyweights",
                    help="loaders on the local folder, comma-separated, or 'none'")
    ap.add_argument("--model", help="an existing model folder (default: a new random Llama)")
    args = ap.parse_args()
    loaders = [] if args.loaders == "none" else args.loaders.split(",")
    if "runai_streamer" in loaders or args.s3:
        try:
            import runai_model_streamer  # noqa: F401
        except ImportError as e:
            loaders = [name for name in loaders if name != "runai_streamer"]
            print("runai_streamer: runai-model-streamer is not installed; skipped")
            if args.s3:
                raise SystemExit("--s3 needs runai-model-streamer[s3] (and moto[server])") from e
    with tempfile.TemporaryDirectory() as d:
        folder = args.model or os.path.join(d, "llama")
        if not args.model:
            make_model(folder, args.hidden, args.layers)
        size = os.path.getsize(os.path.join(folder, "model.safetensors"))
        print(f"model: {size / 1e6:.0f} MB safetensors ({folder})")
        # as an installed package is: compiled once (pip compiles on install; with PYTHONDONTWRITEBYTECODE set,
        # as on the development VMs, each run would compile lazyweights' modules again inside its load)
        import lazyweights

        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(lazyweights.__file__)],
                       check=False)
        results: dict[str, list] = {name: [] for name in loaders}
        for _ in range(args.reps):
            for name in loaders:
                results[name].append(run(folder, name))
        summary: dict = {"checkpoint_bytes": size}
        for name, rs in results.items():
            summary[name] = report(name, rs)
        if args.http:
            http_runs(folder, args.reps, summary, tp2_runs=not args.no_tp2)
        if args.s3 in ("both", "direct"):
            s3_runs(folder, args.s3_reps or args.reps, summary, direct=True)
        if args.s3 in ("both", "moto"):
            s3_runs(folder, args.s3_reps or args.reps, summary)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
