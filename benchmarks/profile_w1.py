#!/usr/bin/env python3
"""Where the time of W1's `materialize(out=...)` goes, against the copy floor, in one process.

  python benchmarks/profile_w1.py CKPT [--reps 7] [--prime-gb 2]
  python benchmarks/profile_w1.py CKPT --overhead [--reps 25]
  python benchmarks/profile_w1.py CKPT --ablate [--reps 7]

Output buffers are allocated and touched once (load_state_dict's path), so no run pays first-touch.
Three measurements, each the median of --reps, each after touching and freeing --prime-gb of memory:

  floor      the same source bytes copied from the maps into touched buffers, 4 MB chunks on the
             same number of threads (the in-process counterpart of bench_w1's copy floor)
  threads    plan.materialize(out=...), the default scheduler
  sync       the same on one thread, with every stage timed (accumulated per category below); the
             per-thread sums of a threaded run are printed too

Categories: compile (compile_steps), tasks (the sink turning steps into block tasks), source check (the
stat before every block), gather analysis (graph/gather: the row index of a permuted block), kernels by
kind (bf16->f16 contiguous, bf16->f16 gathered, bf16->f32, other), and the rest (driver, pull rules,
Python glue) as the remainder.

--overhead: the cast kernels replaced by no-ops, so a run is nothing but the fixed costs (compile, tasks,
scheduling, checks, gather index work): min and median over --reps, per run and per block, on one thread
and on the default threads. (Works against older trees too: it patches only `casts.cast_into` and, where
it exists, `casts.gather_cast_into`.)

--ablate: materialize(out=) on the default threads with this stop's changes switched off one at a time,
median of --reps, each after priming, alternating: all on; gathered rows copied then cast (the old pull
path); 4 MB blocks for every step; the portable bf16 -> f16 loop instead of F16C's (a child process with
LAZYWEIGHTS_CAST_LOOPS=portable, timed the same way).
"""
import argparse, json, os, statistics, sys, threading, time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from w1_lazy import w1_adapter  # noqa: E402

import lazyweights as lw  # noqa: E402
from lazyweights.kernels import casts  # noqa: E402
from lazyweights.run import blocks, driver, sinks  # noqa: E402

ACC = defaultdict(float)  # wall seconds per category
CPU = defaultdict(float)  # this thread's CPU seconds per category (immune to being descheduled)
COUNT = defaultdict(int)
LOCK = threading.Lock()


def timed(category, fn):
    def wrapper(*args, **kwargs):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            dt, dc = time.perf_counter() - t, time.thread_time() - c
            cat = category(*args) if callable(category) else category
            with LOCK:
                ACC[cat] += dt
                CPU[cat] += dc
                COUNT[cat] += 1
    return wrapper


def cast_kind(src, out):
    pair = f"{np.asarray(src).dtype}->{out.dtype}"
    return f"kernel {pair}" if pair in ("bfloat16->float16", "bfloat16->float32") else "kernel other"


def instrument():
    driver.compile_steps = timed("compile", driver.compile_steps)
    sinks.MemorySink.tasks = timed("tasks", sinks.MemorySink.tasks)
    sinks.check_unchanged_sources = timed("source check", sinks.check_unchanged_sources)
    blocks.gathered = timed("gather analysis", blocks.gathered)
    casts.gather_cast_into = timed(lambda src, rows, out: cast_kind(src, out) + " gathered", casts.gather_cast_into)
    casts.cast_into = timed(cast_kind, casts.cast_into)


def prime(nbytes):
    a = np.empty(nbytes, np.uint8)
    a[::4096] = 1
    del a


def overhead(plan, outs, reps):
    """Fixed costs only: materialize(out=) with no-op cast kernels."""
    from lazyweights.compiler.steps import compile_steps

    casts.cast_into = lambda src, out: None
    if hasattr(casts, "gather_cast_into"):
        casts.gather_cast_into = lambda src, rows, out: None
    n_blocks = sum(len(s.blocks) for s in compile_steps(plan))
    print(f"no-op kernels: {n_blocks} blocks (as compile_steps cuts them for materialize), min / median of {reps}")
    for sched in ("sync", "threads"):
        plan.materialize(out=outs, scheduler=sched)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            plan.materialize(out=outs, scheduler=sched)
            ts.append(time.perf_counter() - t)
        lo, med = min(ts), statistics.median(ts)
        print(f"  {sched:8} {lo * 1e3:6.1f} / {med * 1e3:6.1f} ms a run, {lo / n_blocks * 1e6:5.0f} / "
              f"{med / n_blocks * 1e6:5.0f} us a block")


def ablate(plan, outs, reps, prime_gb, ckpt):
    import subprocess

    variants = {
        "all on": lambda: plan.materialize(out=outs),
        "gathered rows copied, then cast": lambda: plan.materialize(out=outs),
        "4 MB blocks everywhere": lambda: plan.materialize(out=outs, block_bytes=4 << 20),
    }
    real = blocks.gathered
    times = defaultdict(list)
    for fn in variants.values():
        fn()
    for _ in range(reps):
        for name, fn in variants.items():
            blocks.gathered = (lambda *a, **k: None) if name.startswith("gathered") else real
            prime(int(prime_gb * (1 << 30)))
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    blocks.gathered = real
    env = dict(os.environ, LAZYWEIGHTS_CAST_LOOPS="portable")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), ckpt, "--ablate-child", "--reps", str(reps),
                          "--prime-gb", str(prime_gb)], env=env, capture_output=True, text=True, check=True).stdout
    times["portable bf16 -> f16 loop"] = json.loads(out.strip().splitlines()[-1])
    base = statistics.median(times["all on"])
    print(f"materialize(out=), threads, median of {reps} ({prime_gb:g} GiB primed before each run):")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:34} {med * 1e3:6.1f} ms  {med / base:5.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--prime-gb", type=float, default=2.0)
    ap.add_argument("--overhead", action="store_true", help="no-op kernels: the fixed costs alone")
    ap.add_argument("--ablate", action="store_true", help="switch this stop's changes off one at a time")
    ap.add_argument("--ablate-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.ckpt, "config.json")))
    weights = lw.load_weights(a.ckpt)
    plan = lw.plan(w1_adapter(dict(weights.items()), huggingface_config=cfg))
    outs = {n: np.empty(node.shape, node.dtype.to_numpy()) for n, node in plan.outputs.items()}
    for v in outs.values():
        v.reshape(-1).view(np.uint8)[::4096] = 1
    if a.overhead:
        return overhead(plan, outs, a.reps)
    if a.ablate:
        return ablate(plan, outs, a.reps, a.prime_gb, a.ckpt)
    if a.ablate_child:  # (the parent's environment chose the kernels)
        plan.materialize(out=outs)
        ts = []
        for _ in range(a.reps):
            prime(int(a.prime_gb * (1 << 30)))
            t = time.perf_counter()
            plan.materialize(out=outs)
            ts.append(time.perf_counter() - t)
        return print(json.dumps(ts))
    out_bytes = sum(v.nbytes for v in outs.values())

    # The floor: every source byte of the plan, copied into touched memory in 4 MB chunks.
    srcs = {}
    for node in plan.outputs.values():
        for n in node.toposort():
            if n.op == "source":
                srcs[n] = blocks.full_view(n).reshape(-1).view(np.uint8)
    views = list(srcs.values())
    dsts = [np.empty(v.size, np.uint8) for v in views]
    for d in dsts:
        d[::4096] = 1
    jobs = [(k, i) for k, v in enumerate(views) for i in range(0, v.size, 4 << 20)]
    workers = len(os.sched_getaffinity(0))
    src_bytes = sum(v.size for v in views)

    def floor():
        def one(job):
            k, i = job
            np.copyto(dsts[k][i:i + (4 << 20)], views[k][i:i + (4 << 20)])
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, jobs))

    def serve(scheduler):
        plan.materialize(out=outs, scheduler=scheduler)

    serve("threads")  # warm-up: kernels, page cache
    floor()
    times = defaultdict(list)
    for _ in range(a.reps):
        for name, fn in (("floor", floor), ("threads", lambda: serve("threads"))):
            prime(int(a.prime_gb * (1 << 30)))
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    instrument()
    per_run = {}
    for sched in ("sync", "threads"):
        ACC.clear()
        CPU.clear()
        COUNT.clear()
        walls, cpus = [], []
        for _ in range(a.reps):
            prime(int(a.prime_gb * (1 << 30)))
            t, c = time.perf_counter(), time.process_time()
            serve(sched)
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        times[sched + " (timed)"] = walls
        # Means throughout (the categories are sums over the runs): the remainder is then consistent.
        per_run[sched] = ({k: v / a.reps for k, v in ACC.items()}, {k: v / a.reps for k, v in CPU.items()},
                          {k: c // a.reps for k, c in COUNT.items()}, sum(walls) / a.reps, sum(cpus) / a.reps)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"W1 {a.ckpt}: {len(plan.outputs)} tensors, {src_bytes / 1e9:.2f} GB read, {out_bytes / 1e9:.2f} GB "
          f"written, {workers} cpus, median of {a.reps}, {a.prime_gb:g} GiB primed before each run")
    print(f"  copy floor (same source bytes, touched memory, {workers} threads): {med['floor']:.3f} s")
    print(f"  materialize(out=), threads: {med['threads']:.3f} s = {med['threads'] / med['floor']:.2f}x the floor")
    print(f"  materialize(out=), sync, instrumented: {med['sync (timed)']:.3f} s")
    for sched in ("sync", "threads"):
        acc, cpu, count, wall, cpu_total = per_run[sched]
        sums = "" if sched == "sync" else ", categories summed over threads"
        print(f"\n{sched}: mean wall {wall * 1e3:.0f} ms, process CPU {cpu_total * 1e3:.0f} ms{sums}")
        print(f"  {'category':34} {'calls':>6} {'wall ms':>8} {'%':>6} {'CPU ms':>8} {'%':>6}")
        for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
            print(f"  {k:34} {count[k]:6d} {v * 1e3:8.1f} {100 * v / wall:5.1f}% {cpu[k] * 1e3:8.1f} "
                  f"{100 * cpu[k] / cpu_total:5.1f}%")
        if sched == "sync":
            rest, rest_cpu = wall - sum(acc.values()), cpu_total - sum(cpu.values())
            print(f"  {'rest (driver, pull rules, glue)':34} {'':6} {rest * 1e3:8.1f} {100 * rest / wall:5.1f}% "
                  f"{rest_cpu * 1e3:8.1f} {100 * rest_cpu / cpu_total:5.1f}%")


if __name__ == "__main__":
    main()
