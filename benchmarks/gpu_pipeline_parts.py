#!/usr/bin/env python3
"""Where a GPU load's time goes: the W1 load onto the GPU with one cost taken out at a time (needs a GPU).

  python benchmarks/gpu_pipeline_parts.py CKPT [--reps 5] [--json OUT]

The H200 lease (benchmarks/RESULTS.md, "GPU: a lent H200") measured W1 onto the GPU at 0.284 s while plain
`pread`s of the same bytes on 8 threads took 0.054 s and the pinned link 0.040 s. This script splits the
difference in one short run. Each variant is the same `materialize_gpu` call with parts replaced:

  full            as users run it
  no-reads        the host threads' fills do nothing (the pinned buffers keep stale bytes: the RESULT IS
                  WRONG, only the time counts): the load without reading the checkpoint
  kept-staging    pinned and device staging buffers allocated once, before the timings, and reused: the load
                  without `cudaHostAlloc`/`cudaMalloc`/frees of staging
  no-reads+kept   both
  enqueue-only    both, and no kernels: what is left is the calling thread's copies, events and bookkeeping

plus the floors: one pinned copy of the checkpoint's bytes, and pinning 128 MB (16 slots of 8 MB) one buffer
at a time and all at once. Prints each variant's median and `DeviceArrays.timings` of its last run. The page
cache is warm (the checkpoint is read once first); the device pool is emptied between runs, as
`bench_gpu_peers.py` does.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_gpu_peers as peers  # noqa: E402

from lazyweights.run import gpu as G  # noqa: E402


class KeptStaging:
    """Replaces CupyDevice.pinned/staging with buffers handed out from a pool filled once (and never freed
    while the variant runs), so a run pays no staging allocation."""

    def __init__(self):
        self.pinned: dict[int, list] = {}
        self.staging: dict[int, list] = {}
        self.real = (G.CupyDevice.pinned, G.CupyDevice.staging, G.CupyDevice.release)
        self.real_pinned, self.real_staging = self.real[0], self.real[1]

    def install(self):
        kept = self

        def pinned(dev, nbytes):
            pool = kept.pinned.setdefault(nbytes, [])
            return pool.pop() if pool else kept.real_pinned(dev, nbytes)

        def staging(dev, nbytes):
            pool = kept.staging.setdefault(nbytes, [])
            return pool.pop() if pool else kept.real_staging(dev, nbytes)

        def release(dev, buf):  # back to the pool: the next run takes it again
            (kept.pinned if isinstance(buf, peers.np.ndarray) else kept.staging).setdefault(buf.nbytes, []).append(buf)

        G.CupyDevice.pinned, G.CupyDevice.staging, G.CupyDevice.release = pinned, staging, release

    def remove(self):
        G.CupyDevice.pinned, G.CupyDevice.staging, G.CupyDevice.release = self.real


def timed(ckpt: str, reps: int) -> tuple[float, dict, int]:
    files = peers._files(ckpt)
    res = G.materialize_gpu(peers.lazyweights_plan(ckpt), "gpu:0")  # untimed: compile, pools, kernels
    peers._sync()
    del res
    times, parts, blocks = [], {}, 0
    for _ in range(reps):
        peers.warm_cache(files)
        peers.free_gpu()
        t = time.perf_counter()
        res = G.materialize_gpu(peers.lazyweights_plan(ckpt), "gpu:0")
        peers._sync()
        times.append(time.perf_counter() - t)
        parts, blocks = dict(res.timings), res.blocks
        del res
    return statistics.median(times), parts, blocks


def pinning_seconds(slots: int = 16, nbytes: int = 8 << 20) -> tuple[float, float]:
    from cupy.cuda import pinned_memory

    t = time.perf_counter()
    held = [pinned_memory.PinnedMemory(nbytes) for _ in range(slots)]
    one_by_one = time.perf_counter() - t
    del held
    t = time.perf_counter()
    held = [pinned_memory.PinnedMemory(slots * nbytes)]
    at_once = time.perf_counter() - t
    del held
    return one_by_one, at_once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ckpt = str(Path(a.ckpt).resolve())
    size = sum(Path(f).stat().st_size for f in peers._files(ckpt))
    floor = peers.pinned_h2d_seconds(size)
    one, together = pinning_seconds()
    print(f"pinned copy of {size / 1e9:.2f} GB: {floor:.3f} s; pinning 16 x 8 MB: {one:.3f} s one by one, "
          f"{together:.3f} s as one buffer", flush=True)
    real_fill, real_run = G._fill, G.CupyDevice.run
    kept = KeptStaging()
    variants = {
        "full": (False, False, False),
        "no-reads": (True, False, False),
        "kept-staging": (False, True, False),
        "no-reads+kept": (True, True, False),
        "enqueue-only": (True, True, True),
    }
    out = {"gb": size / 1e9, "pinned_s": floor, "pinning_16x8MB_s": one, "pinning_128MB_s": together, "runs": {}}
    for name, (no_reads, keep, no_kernels) in variants.items():
        G._fill = (lambda task, pinned, read_calls=True: None) if no_reads else real_fill
        G.CupyDevice.run = (lambda dev, program, src, dst, stream: None) if no_kernels else real_run
        if keep:
            kept.install()
        try:
            med, parts, blocks = timed(ckpt, a.reps)
        finally:
            if keep:
                kept.remove()
            G._fill, G.CupyDevice.run = real_fill, real_run
        out["runs"][name] = {"median_s": med, "timings": parts, "blocks": blocks}
        print(f"{name:14} {med:7.3f} s  ({blocks} blocks)  " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()),
              flush=True)
    kept.pinned.clear()
    kept.staging.clear()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
