#!/usr/bin/env python3
"""Everything that needs a GPU, in one command, for a machine that has one.

  python benchmarks/gpu_check.py [CKPT] [--layers 22] [--reps 3] [--budget 512MB] [--out DIR] [--tests-only]

1. Environment: python, numpy, cupy, CUDA runtime/driver versions and the device. Without a working cupy it
   stops with the install hint (`pip install 'lazyweights[gpu]'`, i.e. cupy-cuda12x).
2. `pytest tests/run/test_gpu.py`: the whole file (the CPU-side checks too), then `-m gpu` alone, which must
   run every GPU test and skip none (a skip here means the GPU was not usable: a failure).
3. The benchmark (`bench_gpu.py`) on CKPT, or on a synthetic Llama-shaped bf16 checkpoint written first
   with `../shared/bench/make_ckpt.py --layers N` (22 layers: the 2.2 GB TinyLlama shape) into --out
   (default: a temporary directory, removed afterwards).

Exit status 0 only if every step passed and the benchmark verified bit identity. The benchmark's targets
(>= 3x over the naive path, >= 70% of pinned H2D bandwidth) are reported, not enforced: they depend on
the machine. Results also go to DIR/gpu_results.json when --out is given.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_BENCH = Path(os.environ.get("LAZYWEIGHTS_SHARED_BENCH", ROOT.parent / "shared" / "bench"))


def step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    sys.stdout.write(r.stdout[-20000:])
    sys.stdout.write(r.stderr[-5000:])
    sys.stdout.flush()
    return r


def environment() -> None:
    step("environment")
    import numpy

    print(f"python {platform.python_version()}, numpy {numpy.__version__}, {os.cpu_count()} cpus")
    try:
        import cupy
    except Exception as e:
        raise SystemExit(f"cupy cannot be imported ({type(e).__name__}: {e}); install it with: "
                         f"pip install 'lazyweights[gpu]'  (cupy-cuda12x)")
    rt = cupy.cuda.runtime
    n = rt.getDeviceCount()
    print(f"cupy {cupy.__version__}, CUDA runtime {rt.runtimeGetVersion()}, driver {rt.driverGetVersion()}, "
          f"{n} device(s)")
    for i in range(n):
        p = rt.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
        print(f"  gpu:{i} {name}, {p['totalGlobalMem'] / 2**30:.0f} GiB, compute {p['major']}.{p['minor']}")
    if n == 0:
        raise SystemExit("no CUDA device")


def tests() -> bool:
    step("tests/run/test_gpu.py (all)")
    ok = run([sys.executable, "-m", "pytest", "tests/run/test_gpu.py", "-q", "-rs", "-p", "no:cacheprovider"]).returncode == 0
    step("tests/run/test_gpu.py -m gpu (none may skip)")
    r = run([sys.executable, "-m", "pytest", "tests/run/test_gpu.py", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"])
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if "skipped" in tail or "passed" not in tail:
        print("GPU tests were skipped or did not run: the GPU is not usable from pytest")
        ok = False
    return ok and r.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", nargs="?", help="a Llama-shaped safetensors checkpoint with config.json")
    ap.add_argument("--layers", type=int, default=22, help="layers of the synthetic checkpoint (no CKPT)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", default="512MB")
    ap.add_argument("--out", default=None, help="keep the synthetic checkpoint and results here")
    ap.add_argument("--tests-only", action="store_true")
    a = ap.parse_args()

    environment()
    ok = tests()
    if a.tests_only:
        raise SystemExit(0 if ok else 1)

    tmp = None
    ckpt = a.ckpt
    out_dir = Path(a.out) if a.out else None
    if ckpt is None:
        base = out_dir or Path(tmp := tempfile.mkdtemp(prefix="lw_gpu_"))
        ckpt = str(base / f"llama_{a.layers}l")
        step(f"synthetic checkpoint ({a.layers} layers) -> {ckpt}")
        r = run([sys.executable, str(SHARED_BENCH / "make_ckpt.py"), ckpt, "--layers", str(a.layers)])
        if r.returncode:
            raise SystemExit("make_ckpt.py failed")
    try:
        step("benchmark")
        cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), ckpt, "--reps", str(a.reps),
               "--budget", a.budget]
        if out_dir:
            out_dir.mkdir(parents=True, exist_ok=True)
            cmd += ["--json", str(out_dir / "gpu_results.json")]
        ok = run(cmd).returncode == 0 and ok
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    step("result")
    print("ALL PASSED" if ok else "FAILED (see above)")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
