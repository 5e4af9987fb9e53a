"""W1 over HTTP with `cache=DIR`, two source trees alternated: the first cached run, then a second on the same
cache, against an uncached run of the second tree, each in a fresh process after memory priming.

    python benchmarks/cache_ab.py CKPT --reps 5 before=/path/to/old/tree after=/path/to/this/tree

Each NAME=TREE runs with `PYTHONPATH=TREE` (a `git worktree` of the older commit, with the compiled kernels
copied in). The uncached contestant runs the last tree. Every round runs every contestant once, in turn, so
a noisy neighbour hits all of them alike. Printed per run: seconds until `materialize()` returned, seconds
until the cache's writer finished, user and system CPU, and peak RSS (`ru_maxrss`). Then the medians.
nginx serves CKPT's parent folder on 127.0.0.1, started as `bench_remote.py` starts it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_remote  # noqa: E402  (its nginx and its memory priming)

CHILD = r'''
import json, os, resource, sys, time, types
t0 = time.perf_counter()
import lazyweights as lw
from lazyweights.tools import demo as w1
url, ckpt, cache = sys.argv[1], sys.argv[2], sys.argv[3] or None
cfg = types.SimpleNamespace(**json.load(open(os.path.join(ckpt, "config.json"))))
sd = w1.convert_safetensor_state_dict(dict(lw.load_weights([url], cache=cache).items()), huggingface_config=cfg)
out = lw.plan(sd).materialize()
t1 = time.perf_counter()
from lazyweights.io.host_cache import _OPEN
for c in list(_OPEN):
    c.flush()
t2 = time.perf_counter()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"returned": t1 - t0, "complete": t2 - t0, "user": ru.ru_utime, "sys": ru.ru_stime,
                  "maxrss_gb": ru.ru_maxrss / 1e6}))
'''


def run(url: str, ckpt: str, tree: str, cache: str) -> dict:
    subprocess.run([sys.executable, "-c", bench_remote.PRIME, str(3 << 30)], check=True)  # warm memory
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run([sys.executable, "-c", CHILD, url, ckpt, cache], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    import json

    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("trees", nargs="+", help="NAME=TREE: a source tree to run with PYTHONPATH")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    ckpt = os.path.abspath(args.ckpt)
    trees = [t.split("=", 1) for t in args.trees]
    proc, port, _ = bench_remote.start_nginx(os.path.dirname(ckpt))
    url = f"http://127.0.0.1:{port}/{os.path.basename(ckpt)}/model.safetensors.index.json"
    rows: dict[str, list] = {"uncached": []}
    rows.update({f"{name} first": [] for name, _ in trees})
    rows.update({f"{name} second": [] for name, _ in trees})
    try:
        for rep in range(args.reps):
            r = run(url, ckpt, trees[-1][1], "")
            rows["uncached"].append(r)
            print(rep, "uncached", r, flush=True)
            for name, tree in trees:
                cache = tempfile.mkdtemp(prefix="cache-ab-", dir=os.path.dirname(ckpt))  # on the disk, not tmpfs
                try:
                    first = run(url, ckpt, tree, cache)
                    second = run(url, ckpt, tree, cache)
                finally:
                    shutil.rmtree(cache)
                rows[f"{name} first"].append(first)
                rows[f"{name} second"].append(second)
                print(rep, name, "first", first, "second", second, flush=True)
    finally:
        bench_remote.stop_nginx(proc)
    base = statistics.median(r["returned"] for r in rows["uncached"])
    print(f"medians of {args.reps}:")
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"  {name:16s} returned {med['returned']:.3f} s ({med['returned'] / base:.2f}x uncached), complete "
              f"{med['complete']:.3f} s, user {med['user']:.2f} s, sys {med['sys']:.2f} s, "
              f"peak RSS {med['maxrss_gb']:.2f} GB")


if __name__ == "__main__":
    main()
