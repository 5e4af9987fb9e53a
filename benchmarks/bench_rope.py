#!/usr/bin/env python3
"""The q/k RoPE row permutation under a cast: fused row-gather cast vs gather-then-cast vs no permutation.

  python benchmarks/bench_rope.py CKPT [--tensors 8] [--reps 7] [--scheduler threads|sync] [--prime-gb 2]

Takes the first `--tensors` q_proj weights of a Llama-shaped bf16 checkpoint (W1, /work/ckpt/w1_2g: 8 x
[2048, 2048], 64 MB) and materializes, into preallocated and touched float16 buffers (`materialize(out=)`,
load_state_dict's path), each of:

  fused   reshape(heads, hd, n)[:, rope_perm(hd), :].reshape(heads * hd, n).astype(float16): the cast
          kernel takes the row index and reads every row in place (`kernels.casts.gather_cast_into`)
  old     the same plan with the fused path switched off: the rows are gathered into a block-sized
          temporary (np.take along the head axis), then cast (what lazyweights did before)
  plain   .astype(float16) with no permutation: the floor for a cast
  copy    the same source bytes copied (no cast, no permutation) into the same buffers, blocks of 4 MB on
          the same threads: the floor of the memory system

Before each timed run, --prime-gb of memory is touched and freed in this process: on a VM that returns
freed memory to its host (the development VMs), a run that allocates temporaries otherwise meets cold
pages by chance. Modes alternate within each repetition. Prints the median and min..max per mode, and
checks that fused and old give the same bytes.
"""
import argparse, json, os, statistics, sys, time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import lazyweights as lw
from lazyweights.run import blocks


def rope_perm(hd: int) -> np.ndarray:
    return np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])


def prime(nbytes: int) -> None:
    """Touch and free `nbytes`, so the next allocation meets pages the host still backs."""
    if nbytes:
        a = np.empty(nbytes, np.uint8)
        a[::4096] = 1
        del a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--scheduler", default="threads")
    ap.add_argument("--prime-gb", type=float, default=2.0)
    ap.add_argument("--modes", default="fused,old,plain,copy")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.ckpt, "config.json")))
    heads = cfg["num_attention_heads"]
    hd = cfg["hidden_size"] // heads
    weights = lw.load_weights(a.ckpt)
    names = [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(a.tensors)]
    datas = [weights[n].data() for n in names]
    perm = rope_perm(hd)
    permuted = lw.plan({n: d.reshape(heads, hd, -1)[:, perm, :].reshape(heads * hd, -1).astype(lw.DType.float16)
                        for n, d in zip(names, datas)})
    plain = lw.plan({n: d.astype(lw.DType.float16) for n, d in zip(names, datas)})
    outs = {n: np.empty(d.shape, np.float16) for n, d in zip(names, datas)}
    for v in outs.values():
        v.reshape(-1).view(np.uint8)[::4096] = 1
    nbytes = sum(v.nbytes for v in outs.values())
    workers = len(os.sched_getaffinity(0))

    def run_fused():
        permuted.materialize(out=outs, scheduler=a.scheduler)

    def run_old():
        real = getattr(blocks, "gathered", None)  # (None: a lazyweights from before the fused path)
        blocks.gathered = lambda *args, **kw: None
        try:
            permuted.materialize(out=outs, scheduler=a.scheduler)
        finally:
            blocks.gathered = real

    def run_plain():
        plain.materialize(out=outs, scheduler=a.scheduler)

    def run_copy():
        # The same source bytes, straight from the memory maps, into the same buffers, 4 MB at a time.
        views = [blocks.full_view(d.node).reshape(-1).view(np.uint8) for d in datas]
        jobs = [(k, i) for k, v in enumerate(views) for i in range(0, v.size, 4 << 20)]
        dst = [outs[n].reshape(-1).view(np.uint8) for n in names]

        def one(job):
            k, i = job
            np.copyto(dst[k][i:i + (4 << 20)], views[k][i:i + (4 << 20)])

        if a.scheduler == "sync":
            for j in jobs:
                one(j)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(one, jobs))

    modes = {"fused": run_fused, "old": run_old, "plain": run_plain, "copy": run_copy}
    chosen = a.modes.split(",")
    run_fused()  # warm-up: page cache, kernels, first-use checks
    fused_bytes = {n: v.copy() for n, v in outs.items()}
    run_old()
    for n in names:
        assert np.array_equal(fused_bytes[n].view(np.uint16), outs[n].view(np.uint16)), f"{n}: fused != old"
    times = {m: [] for m in chosen}
    for _ in range(a.reps):
        for m in chosen:
            prime(int(a.prime_gb * (1 << 30)))
            t = time.perf_counter()
            modes[m]()
            times[m].append(time.perf_counter() - t)
    print(f"{a.tensors} q_proj {list(datas[0].shape)} bf16 -> f16 ({nbytes / 1e6:.0f} MB out), "
          f"materialize(out=), scheduler {a.scheduler}, {workers} cpus, median of {a.reps}, "
          f"{a.prime_gb:g} GiB primed before each run")
    base = statistics.median(times["copy"]) if "copy" in times else None
    for m in chosen:
        med = statistics.median(times[m])
        ratio = f"  {med / base:5.2f}x copy" if base else ""
        print(f"  {m:6} {med:.4f} s  ({min(times[m]):.4f}..{max(times[m]):.4f})  "
              f"{2 * nbytes / med / 1e9:5.1f} GB/s read+write{ratio}")
    print("fused and old: byte-identical")


if __name__ == "__main__":
    main()
