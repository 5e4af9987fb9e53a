"""Throughput of `lazyweights.kernels.casts.cast_into` against numpy/ml_dtypes `astype`.

For each hot cast pair: a source of --size-mb (default 256 MB) of weight-like values (normal, std 0.02, with a
sprinkling of zeros, subnormal-range values, infinities and NaNs), median of --runs (default 5) timings, in
GB/s counting bytes read + bytes written. Columns:

- astype: ``src.astype(dst)`` (allocates its output, as an eager adapter does);
- 1 thread: ``cast_into(src, out)`` into a preallocated, already-touched output;
- 2 threads: the same, split in halves over a ThreadPoolExecutor (the kernels release the GIL).

A same-dtype ``np.copyto`` of the same source is printed first as the memory-bandwidth floor, then what
the C kernels cost a fresh process before its first cast (import, load, first-use self-check).
``--backend`` picks the kernels the throughput table uses: c (the default) or numpy (compiled casts off).
``--strided`` adds bf16 -> f16 from non-contiguous views of a 2-D source (copied in blocks, except the
nearly adjacent rows of cols[:, :n-64], read in place), against ``np.copyto(out, view, casting="unsafe")`` (astype of a transpose would keep
its Fortran order and so skip the transposition).

    python benchmarks/bench_casts.py [--size-mb 256] [--runs 5] [--pairs bf16:f16,f32:f16] [--strided]
                                     [--backend c|numpy]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lazyweights.kernels import casts  # noqa: E402

NAMES = {"bf16": np.dtype(ml_dtypes.bfloat16), "f16": np.dtype(np.float16), "f32": np.dtype(np.float32),
         "f8e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "f8e5m2": np.dtype(ml_dtypes.float8_e5m2)}
HOT = ["bf16:f16", "bf16:f32", "f32:f16", "f16:f32", "f32:bf16", "f16:bf16"]


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_source(dtype: np.dtype, nbytes: int, rng: np.random.Generator) -> np.ndarray:
    n = nbytes // dtype.itemsize
    values = rng.standard_normal(n, dtype=np.float32)
    values *= np.float32(0.02)
    values[::1001] = 0.0
    values[1::1009] = np.float32(3e-6)  # subnormal in float16
    values[2::100_003] = np.inf
    values[3::100_019] = np.nan
    with np.errstate(all="ignore"):
        return values if dtype == np.float32 else values.astype(dtype)


def memcpy_floor(nbytes: int, runs: int, rng: np.random.Generator) -> float:
    src = make_source(np.dtype(np.float32), nbytes, rng)
    out = np.zeros_like(src)
    out.fill(1)  # touch the pages
    return 2 * nbytes / median_time(lambda: np.copyto(out, src), runs) / 1e9


def bench_pair(s_dt: np.dtype, d_dt: np.dtype, nbytes: int, runs: int, rng: np.random.Generator,
               pool: ThreadPoolExecutor) -> tuple[float, float, float]:
    """GB/s of astype, cast_into on one thread, and cast_into on two threads over halves."""
    src = make_source(s_dt, nbytes, rng)
    out = np.empty(src.shape, d_dt)
    out.view(np.uint8).fill(0)  # touch the pages so that page faults are not timed
    moved = src.nbytes + out.nbytes
    casts.cast_into(src[:4096], out[:4096])  # compile or load from cache; run the first-use self-check

    with np.errstate(all="ignore"):
        ref = src.astype(d_dt)
        t_astype = median_time(lambda: src.astype(d_dt), runs)
    t_one = median_time(lambda: casts.cast_into(src, out), runs)
    bits = casts._UINT[d_dt.itemsize]
    if not np.array_equal(out.view(bits), ref.view(bits)):
        raise SystemExit(f"{s_dt}->{d_dt}: cast_into differs from astype")
    del ref
    half = src.size // 2

    def two_threads():
        jobs = [pool.submit(casts.cast_into, src[:half], out[:half]),
                pool.submit(casts.cast_into, src[half:], out[half:])]
        for job in jobs:
            job.result()

    t_two = median_time(two_threads, runs)
    return moved / t_astype / 1e9, moved / t_one / 1e9, moved / t_two / 1e9


STARTUP = """
import time; t = time.perf_counter()
import numpy as np
from lazyweights.kernels import casts
casts.cast_into(np.ones(1 << 16, np.float32), np.empty(1 << 16, np.float16))
assert casts.kernel_backend() == "{backend}", casts.kernel_backend()
print(time.perf_counter() - t)
"""


def startup_seconds(backend: str, runs: int) -> float:
    """Median seconds a fresh process takes to import the casts and finish its first compiled cast."""
    env = dict(os.environ, LAZYWEIGHTS_CAST_KERNELS=backend,
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", STARTUP.format(backend=backend)], env=env, check=True,
                             capture_output=True, text=True).stdout
        times.append(float(out))
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256, help="source size in MB (default 256)")
    parser.add_argument("--runs", type=int, default=5, help="timings per figure; the median is reported")
    parser.add_argument("--pairs", default=",".join(HOT), help=f"src:dst list from {sorted(NAMES)}")
    parser.add_argument("--strided", action="store_true", help="also time strided bf16->f16 sources")
    parser.add_argument("--backend", choices=["c", "numpy"], default=None,
                        help="kernels for the throughput table (default: what a plain process uses)")
    args = parser.parse_args(argv)
    nbytes = args.size_mb << 20
    rng = np.random.default_rng(0)

    if args.backend == "numpy":
        casts.USE_COMPILED = False
    print(f"kernels in use: {casts.kernel_backend()}; source {args.size_mb} MB; median of {args.runs}; "
          "GB/s = (bytes read + bytes written) / s")
    if casts.HAVE_C:
        print(f"fresh process, import to first C cast done: {startup_seconds('c', args.runs):.3f} s")
    # Other work on the machine skews the figures, the 2-thread column most: say how busy it was.
    print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"memcpy floor (np.copyto, same dtype): {memcpy_floor(nbytes, args.runs, rng):.1f} GB/s\n")

    header = f"| {'pair':<12} | {'astype':>8} | {'1 thread':>8} | {'2 threads':>9} | {'1T/astype':>9} | {'2T/astype':>9} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    with ThreadPoolExecutor(2) as pool:
        for pair in args.pairs.split(","):
            s_name, d_name = pair.split(":")
            g_astype, g_one, g_two = bench_pair(NAMES[s_name], NAMES[d_name], nbytes, args.runs, rng, pool)
            print(f"| {s_name + '->' + d_name:<12} | {g_astype:8.1f} | {g_one:8.1f} | {g_two:9.1f} | "
                  f"{g_one / g_astype:8.1f}x | {g_two / g_astype:8.1f}x |")
    if args.strided:
        strided(nbytes, args.runs, rng)
    print("load average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def strided(nbytes: int, runs: int, rng: np.random.Generator) -> None:
    side = int((nbytes // 2) ** 0.5) // 128 * 128
    base = make_source(NAMES["bf16"], 2 * side * side, rng).reshape(side, side)
    views = {"rows[::2]": base[::2], "cols[:, :n/2]": base[:, : side // 2], "cols[:, :n-64]": base[:, :-64],
             "heads permuted": base.reshape(side // 128, 128, side).transpose(1, 0, 2),
             "transposed": base[: side // 2, : side // 2].T}
    print(f"\nstrided bf16->f16 sources (views of a {side}x{side} bf16 matrix), 1 thread, GB/s")
    print(f"| {'view':<16} | {'numpy copyto':>12} | {'cast_into':>9} | {'ratio':>6} |")
    print("|------------------|--------------|-----------|--------|")
    for label, view in views.items():
        out = np.zeros(view.shape, NAMES["f16"])
        moved = view.nbytes + out.nbytes
        with np.errstate(all="ignore"):
            t_np = median_time(lambda: np.copyto(out, view, casting="unsafe"), runs)
        t_k = median_time(lambda: casts.cast_into(view, out), runs)
        print(f"| {label:<16} | {moved / t_np / 1e9:12.1f} | {moved / t_k / 1e9:9.1f} | {t_np / t_k:5.1f}x |")


if __name__ == "__main__":
    main()
