#!/usr/bin/env python3
"""Out of core: convert a checkpoint bigger than RAM against `cp -r` + `sync` of the same files, cold cache.

    python benchmarks/bench_out_of_core.py CKPT --scratch DIR [--reps 3] [--budget 512MB] [--workers N] [--no-drop]

CKPT is a W1 checkpoint (`make_ckpt.py OUT --layers 304` writes about 27 GB, more than the 24 GB of the
development VM). Each repetition, alternating the two contestants:

  * `cp -r CKPT DIR/cp && sync`, wall clock;
  * `python w1_lazy.py CKPT convert DIR/lazy --budget B && sync`, wall clock of the whole subprocess
    (interpreter start, imports, the plan, the streaming atomic save, then sync), and the peak growth of its
    RssAnon (private memory; the page cache of the maps and of the written file is not RssAnon).

Before each run: `sync`, then the page cache is dropped (`/proc/sys/vm/drop_caches`, needs root; --no-drop
or no permission: the cache is left as it is and the output says so), so both read the source from disk.
Outputs are deleted after each run (the disk needs room for the source plus one copy).
Prints each run, the medians, the ratio lazyweights / (cp -r + sync) (issue 17's target: <= 1.1) and the
peak RssAnon growth (target: < 300 MB).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def drop_caches(enabled: bool) -> bool:
    subprocess.run(["sync"], check=True)
    if not enabled:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    time.sleep(1.0)
    return True


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def cp_sync(ckpt: str, out: str) -> float:
    t = time.perf_counter()
    subprocess.run(["cp", "-r", ckpt, out], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t


def lazy_sync(ckpt: str, out: str, budget: str, workers: int | None) -> tuple[float, int, float]:
    t = time.perf_counter()
    cmd = [sys.executable, os.path.join(HERE, "w1_lazy.py"), ckpt, "convert", out, "--budget", budget]
    r = subprocess.run(cmd + (["--workers", str(workers)] if workers else []), capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"w1_lazy.py convert failed:\n{r.stdout}\n{r.stderr}")
    subprocess.run(["sync"], check=True)
    wall = time.perf_counter() - t
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return wall, int(d["peak_anon_growth"]), float(d["seconds"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--scratch", required=True, help="where the copies go (deleted after each run)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", default="512MB")
    ap.add_argument("--workers", type=int, default=None, help="lazyweights' threads (default: the CPUs)")
    ap.add_argument("--no-drop", action="store_true", help="do not drop the page cache before each run")
    a = ap.parse_args()

    size = du(a.ckpt)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(f"checkpoint {a.ckpt}: {size / 1e9:.1f} GB on disk; RAM {mem / 1e9:.1f} GB; "
          f"{len(os.sched_getaffinity(0))} CPUs; budget {a.budget}; lazyweights workers {a.workers or 'default'}")
    os.makedirs(a.scratch, exist_ok=True)
    cp_out, lazy_out = os.path.join(a.scratch, "cp"), os.path.join(a.scratch, "lazy")
    cps, lazies, anons = [], [], []
    for rep in range(1, a.reps + 1):
        for who in ("cp", "lazy") if rep % 2 else ("lazy", "cp"):
            shutil.rmtree(cp_out, ignore_errors=True)
            shutil.rmtree(lazy_out, ignore_errors=True)
            cold = drop_caches(not a.no_drop)
            if who == "cp":
                t = cp_sync(a.ckpt, cp_out)
                cps.append(t)
                print(f"rep {rep}: cp -r + sync        {t:7.1f} s  ({size / t / 1e6:.0f} MB/s; cache "
                      f"{'dropped' if cold else 'as is'})", flush=True)
            else:
                t, anon, inner = lazy_sync(a.ckpt, lazy_out, a.budget, a.workers)
                lazies.append(t)
                anons.append(anon)
                print(f"rep {rep}: lazyweights + sync  {t:7.1f} s  (save {inner:.1f} s; peak RssAnon growth "
                      f"{anon / 1e6:.0f} MB; output {du(lazy_out) / 1e9:.1f} GB; cache "
                      f"{'dropped' if cold else 'as is'})", flush=True)
    shutil.rmtree(cp_out, ignore_errors=True)
    shutil.rmtree(lazy_out, ignore_errors=True)
    m_cp, m_lazy = statistics.median(cps), statistics.median(lazies)
    print(f"median: cp -r + sync {m_cp:.1f} s, lazyweights + sync {m_lazy:.1f} s; ratio {m_lazy / m_cp:.2f} "
          f"(target <= 1.1); peak RssAnon growth max {max(anons) / 1e6:.0f} MB (target < 300 MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
