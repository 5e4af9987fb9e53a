"""Long fuzzing run of the safetensors and GGUF readers, in a subprocess pool with a memory limit.

    python benchmarks/fuzz_long.py                       # 10,000 cases per format, 2 workers
    python benchmarks/fuzz_long.py --cases 50000 --workers 4 --mem-mb 1024
    python benchmarks/fuzz_long.py --replay gguf 1234    # run one case in this process, print the outcome
    python benchmarks/fuzz_long.py --atheris 20000       # also coverage-guided (atheris/libFuzzer), if installed

Cases come from the mutation engine in `tests/formats/test_fuzz.py` (seeded random driver: case i of a format is
always the same bytes). Each worker process imports lazyweights once, compiles the kernels, then caps its
address space (`RLIMIT_AS` = what it has mapped + `--mem-mb`) and runs cases sent over a pipe. The parent
kills a worker whose case runs past `--timeout` (a hang) and restarts one that dies (a crash: a signal
such as SIGSEGV/SIGBUS, or an abort); both cases are saved under `--crash-dir` for replay.

Outcomes per case: loaded-ok (loaded and every tensor materialized equal to the safetensors package /
gguf-py), LazyWeightsError (refused with the library's error), other exception (a bug), mismatch (a bug:
different values, or a file we accept that the reference refuses), crash, timeout. The table also gives the
slowest case and the largest peak RSS of a worker during one case (VmHWM, reset before every case).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "formats"))
sys.path.insert(0, ROOT)

OUTCOMES = ["loaded-ok", "LazyWeightsError", "other-exception", "mismatch", "crash", "timeout"]


# --- worker ------------------------------------------------------------------------------------------------------
def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def worker_main(mem_mb: int) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import test_fuzz as tf

    workdir = tempfile.mkdtemp(prefix="lw-fuzzw-")
    tf.warm_up(workdir)
    for fmt in tf.MUTATORS:  # build both seeds before the limit (gguf-py writes a temp file)
        tf.MUTATORS[fmt][1]()
    base_rss = tf.peak_rss_mb()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + mem_mb * 2**20, hard))
    out = sys.stdout
    out.write(json.dumps({"ready": True, "base_rss_mb": base_rss}) + "\n")
    out.flush()
    # Self-test hooks (tests/formats/test_fuzz.py checks the pool notices each): LW_FUZZ_INJECT="crash:gguf:3,hang:..."
    inject = {tuple(x.split(":")[1:]): x.split(":")[0] for x in os.environ.get("LW_FUZZ_INJECT", "").split(",") if x}
    for line in sys.stdin:
        fmt, index = line.split()
        kind, blob = tf.random_case(fmt, int(index))
        tf.peak_rss_reset()
        t0 = time.process_time()
        what = inject.get((fmt, index))
        if what == "crash":
            import signal

            os.kill(os.getpid(), signal.SIGSEGV)
        elif what == "hang":
            while True:
                pass
        elif what == "alloc":  # past RLIMIT_AS: must come back as a MemoryError, not kill the machine
            try:
                bytearray((mem_mb + 512) * 2**20)
                res = tf.Outcome("loaded-ok", "allocation beyond the limit succeeded?!")
            except MemoryError as e:
                res = tf.Outcome("other-exception", f"MemoryError: {e}")
        index = int(index)
        if what not in ("alloc",):
            res = tf.check_case(fmt, blob, workdir, block_bytes=64 if index % 2 else None)
        out.write(json.dumps({"fmt": fmt, "index": index, "mutation": kind, "outcome": res.kind,
                              "detail": res.detail, "seconds": res.seconds, "cpu": time.process_time() - t0,
                              "rss_mb": tf.peak_rss_mb()}) + "\n")
        out.flush()


# --- parent ------------------------------------------------------------------------------------------------------
class _Worker:
    def __init__(self, mem_mb: int):
        self.proc = subprocess.Popen([sys.executable, "-W", "ignore", os.path.abspath(__file__), "--worker",
                                      "--mem-mb", str(mem_mb)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        hello = self.proc.stdout.readline()
        if not hello:
            raise RuntimeError(f"fuzz worker failed to start: {self.proc.stderr.read()[-2000:]}")
        self.base_rss = json.loads(hello)["base_rss_mb"]
        self.case = None
        self.started = 0.0

    def send(self, fmt, index):
        self.case = (fmt, index)
        self.started = time.monotonic()
        self.proc.stdin.write(f"{fmt} {index}\n")
        self.proc.stdin.flush()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _save_case(crash_dir, fmt, index, outcome, detail):
    import test_fuzz as tf

    if not crash_dir:
        return None
    os.makedirs(crash_dir, exist_ok=True)
    kind, blob = tf.random_case(fmt, index)
    base = os.path.join(crash_dir, f"{fmt}-{index}-{outcome}")
    with open(base + ".bin", "wb") as fh:
        fh.write(blob)
    with open(base + ".txt", "w") as fh:
        fh.write(f"{fmt} case {index} ({kind}): {outcome}\n{detail}\n")
    return base


def run_pool(formats, cases: int, workers: int = 2, mem_mb: int = 2048, timeout: float = 10.0,
             crash_dir: str | None = None, verbose: bool = False) -> dict:
    """Run `cases` cases of each format; return the table as {fmt: {outcome: count, ..., max_s, max_rss_mb}}."""
    table = {f: {**{o: 0 for o in OUTCOMES}, "cases": 0, "max_s": 0.0, "max_cpu_s": 0.0, "max_rss_mb": 0.0,
                 "base_rss_mb": 0.0, "wall_s": 0.0, "bugs": []} for f in formats}
    pool = [_Worker(mem_mb) for _ in range(workers)]
    sel = selectors.DefaultSelector()
    for w in pool:
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
    todo = [(f, i) for f in formats for i in range(cases)]
    todo.reverse()
    t_start = {f: None for f in formats}
    t_end = {f: 0.0 for f in formats}
    done = 0

    def record(fmt, index, outcome, detail, seconds=0.0, cpu=0.0, rss=0.0, base=0.0):
        nonlocal done
        row = table[fmt]
        row[outcome] += 1
        row["cases"] += 1
        row["max_s"] = max(row["max_s"], seconds)
        row["max_cpu_s"] = max(row["max_cpu_s"], cpu)
        row["max_rss_mb"] = max(row["max_rss_mb"], rss)
        row["base_rss_mb"] = max(row["base_rss_mb"], base)
        t_end[fmt] = time.monotonic()
        done += 1
        if outcome not in ("loaded-ok", "LazyWeightsError") or seconds >= 2.0:
            saved = _save_case(crash_dir, fmt, index, outcome, detail)
            row["bugs"].append((index, outcome, detail[:300], saved))
            print(f"  !! {fmt} case {index}: {outcome} ({seconds:.2f} s): {detail[:300]}", file=sys.stderr)

    def feed(w):
        if todo:
            fmt, index = todo.pop()
            if t_start[fmt] is None:
                t_start[fmt] = time.monotonic()
            w.send(fmt, index)
        else:
            w.case = None

    for w in pool:
        feed(w)
    last_report = time.monotonic()
    while any(w.case for w in pool):
        events = sel.select(timeout=0.25)
        for key, _ in events:
            w = key.data
            line = w.proc.stdout.readline()
            if not line:  # the worker died mid-case: a crash
                rc = w.proc.wait()
                fmt, index = w.case
                err = w.proc.stderr.read()[-1500:]
                record(fmt, index, "crash", f"worker exited with {rc}: {err}")
                sel.unregister(w.proc.stdout)
                nw = _Worker(mem_mb)
                pool[pool.index(w)] = nw
                sel.register(nw.proc.stdout, selectors.EVENT_READ, nw)
                feed(nw)
                continue
            r = json.loads(line)
            record(r["fmt"], r["index"], r["outcome"], f"{r['mutation']}: {r['detail']}", r["seconds"], r["cpu"],
                   r["rss_mb"], w.base_rss)
            feed(w)
        now = time.monotonic()
        for w in list(pool):
            if w.case and now - w.started > timeout:
                fmt, index = w.case
                w.kill()
                record(fmt, index, "timeout", f"killed after {timeout} s", now - w.started)
                sel.unregister(w.proc.stdout)
                nw = _Worker(mem_mb)
                pool[pool.index(w)] = nw
                sel.register(nw.proc.stdout, selectors.EVENT_READ, nw)
                feed(nw)
        if verbose and now - last_report > 15:
            last_report = now
            print(f"  ... {done} cases", file=sys.stderr)
    for w in pool:
        w.proc.stdin.close()
        w.kill()
    for f in formats:
        table[f]["wall_s"] = (t_end[f] - t_start[f]) if t_start[f] else 0.0
    return table


def format_table(table: dict, mem_mb: int, workers: int) -> str:
    head = ["format", "cases", "loaded-ok", "LazyWeightsError", "other exception", "mismatch", "crash", "timeout",
            "max s/case", "max RSS/case (MiB)", "wall s"]
    rows = [head]
    for f, r in table.items():
        rows.append([f, f"{r['cases']:,}", f"{r['loaded-ok']:,}", f"{r['LazyWeightsError']:,}",
                     str(r["other-exception"]), str(r["mismatch"]), str(r["crash"]), str(r["timeout"]),
                     f"{r['max_s']:.3f}", f"{r['max_rss_mb']:.0f} (base {r['base_rss_mb']:.0f})", f"{r['wall_s']:.0f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines.append(f"({workers} worker processes, RLIMIT_AS = mapped at start + {mem_mb} MiB each, "
                 f"per-case kill timeout as given; RSS is the worker's VmHWM during the case)")
    return "\n".join(lines)


# --- atheris (coverage-guided), optional ---------------------------------------------------------------------------
def atheris_child(fmt: str, runs: int, mem_mb: int) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import atheris

    with atheris.instrument_imports(include=["lazyweights"]):
        import lazyweights  # noqa: F401
        import lazyweights.formats.gguf  # noqa: F401
        import lazyweights.formats.safetensors  # noqa: F401
    import test_fuzz as tf

    workdir = tempfile.mkdtemp(prefix="lw-atheris-")
    tf.warm_up(workdir)
    corpus = tempfile.mkdtemp(prefix=f"lw-corpus-{fmt}-")
    with open(os.path.join(corpus, "seed"), "wb") as fh:
        fh.write(tf.MUTATORS[fmt][1]())
    for i in range(50):  # a few structured mutants as extra seeds
        with open(os.path.join(corpus, f"m{i}"), "wb") as fh:
            fh.write(tf.random_case(fmt, 10_000_000 + i)[1])

    def one(data: bytes) -> None:
        out = tf.check_case(fmt, data, workdir)
        if out.kind not in ("loaded-ok", "LazyWeightsError"):
            raise RuntimeError(f"{out.kind}: {out.detail}")
        if out.seconds > tf.CASE_SECONDS:
            raise RuntimeError(f"slow case: {out.seconds:.2f} s")

    atheris.Setup([sys.argv[0], f"-runs={runs}", f"-rss_limit_mb={mem_mb + 1024}", "-timeout=10",
                   "-max_len=16384", f"-artifact_prefix={workdir}/", corpus], one)
    atheris.Fuzz()


def run_atheris(fmt: str, runs: int, mem_mb: int) -> dict:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-W", "ignore", os.path.abspath(__file__), "--atheris-child", fmt,
                        "--atheris", str(runs), "--mem-mb", str(mem_mb)], capture_output=True, text=True)
    text = p.stderr
    done = [line for line in text.splitlines() if line.startswith("Done ")]
    cov = [line for line in text.splitlines() if "cov:" in line]
    return {"format": fmt, "rc": p.returncode, "done": done[-1] if done else "", "last": cov[-1] if cov else "",
            "crashed": p.returncode != 0, "tail": text[-3000:], "wall_s": time.monotonic() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10_000, help="cases per format (default 10,000)")
    ap.add_argument("--formats", default="safetensors,gguf")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mem-mb", type=int, default=2048, help="address space each worker may add (MiB)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds before a case counts as a hang")
    ap.add_argument("--crash-dir", default=os.path.join(tempfile.gettempdir(), "lw-fuzz-crashes"))
    ap.add_argument("--replay", nargs=2, metavar=("FORMAT", "INDEX"))
    ap.add_argument("--atheris", type=int, default=0, help="also run N coverage-guided atheris runs per format")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--atheris-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args.mem_mb)
        return 0
    if args.atheris_child:
        atheris_child(args.atheris_child, args.atheris, args.mem_mb)
        return 0
    if args.replay:
        import test_fuzz as tf

        fmt, index = args.replay[0], int(args.replay[1])
        kind, blob = tf.random_case(fmt, index)
        workdir = tempfile.mkdtemp()
        tf.warm_up(workdir)  # (kernel compilation is not the case's time)
        out = tf.check_case(fmt, blob, workdir, block_bytes=64 if index % 2 else None)
        print(f"{fmt} case {index} ({kind}, {len(blob)} bytes): {out.kind} in {out.seconds:.3f} s\n{out.detail}")
        return 0 if out.kind in ("loaded-ok", "LazyWeightsError") else 1
    formats = [f for f in args.formats.split(",") if f]
    t0 = time.monotonic()
    table = run_pool(formats, args.cases, args.workers, args.mem_mb, args.timeout, args.crash_dir, verbose=True)
    print(format_table(table, args.mem_mb, args.workers))
    print(f"total wall time {time.monotonic() - t0:.0f} s")
    bad = sum(r["other-exception"] + r["mismatch"] + r["crash"] + r["timeout"] for r in table.values())
    for f, r in table.items():
        for index, outcome, detail, saved in r["bugs"][:20]:
            print(f"  {f} case {index}: {outcome}: {detail} -> {saved}")
    if args.atheris:
        try:
            import atheris  # noqa: F401
        except ImportError:
            print("atheris is not installed: coverage-guided run skipped")
        else:
            for f in formats:
                r = run_atheris(f, args.atheris, args.mem_mb)
                print(f"atheris {f}: rc={r['rc']} {r['done']} | {r['last']} ({r['wall_s']:.0f} s)")
                if r["crashed"]:
                    bad += 1
                    print(r["tail"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
