#!/usr/bin/env python3
"""The W1 adapter written with lazyweights, run on one checkpoint in one mode (a subprocess of bench_w1.py).

  w1_lazy.py CKPT serve [--scheduler S]           materialize the adapted state dict, touch every output
  w1_lazy.py CKPT serve-into                       allocate and touch the output buffers first (timed apart),
                                                   then materialize into them (load_state_dict's path)
  w1_lazy.py CKPT alloc-floor                      only allocate and first-touch the output bytes: the cost
                                                   any in-memory result pays on this machine
  w1_lazy.py CKPT copy-floor                       the physical floor of serve: a plain copy of the same
                                                   source bytes from fresh maps into fresh memory, on the
                                                   same number of threads (no cast, no adapter)
  w1_lazy.py CKPT convert OUT [--budget B] ...    stream the adapted checkpoint to OUT
  (--workers N on every mode but the floors: the scheduler's threads; default, the CPUs available)
Prints one JSON line: seconds, peak RssAnon growth (bytes), tensors, checksum.
"""
import argparse, json, os, sys, time

import numpy as np

BENCH = os.environ.get("LAZYWEIGHTS_SHARED_BENCH", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench"))
sys.path.insert(0, BENCH)
from memwatch import PeakMem  # noqa: E402
from workload import adapt_name, rope_perm, target_dtype  # noqa: E402

import lazyweights as lw  # noqa: E402


def w1_adapter(state_dict, huggingface_config, **unused_kwargs):
    """The shared W1 workload as a seed-style lazy adapter."""
    cfg = huggingface_config
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    perm = rope_perm(hd)
    out = {}
    for name, weights in state_dict.items():
        new = adapt_name(name)
        if new is None:
            continue
        data = weights.data()
        if new.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in new else cfg["num_key_value_heads"]
            data = data.reshape(heads, hd, -1)[:, perm, :].reshape(heads * hd, -1)
        out[new] = data.astype(lw.DType.from_numpy(target_dtype(new)))
    return out


def copy_floor(ckpt: str) -> None:
    """Map every shard fresh and copy each tensor's bytes into fresh memory, on as many threads as the
    scheduler uses: what serve cannot beat (it reads and writes at least these bytes)."""
    import glob
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    from safetensors import safe_open

    t = time.perf_counter()
    with PeakMem() as pm:
        jobs = []
        maps = []
        for f in sorted(glob.glob(os.path.join(ckpt, "*.safetensors"))):
            with open(f, "rb") as fh:
                m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            maps.append(m)
            n = int.from_bytes(m[:8], "little")
            header = json.loads(m[8:8 + n])
            buf = np.frombuffer(m, np.uint8)
            for name, info in header.items():
                if name == "__metadata__" or adapt_name(name) is None:
                    continue
                a0, a1 = info["data_offsets"]
                jobs.append(buf[8 + n + a0:8 + n + a1])
        # chunks of ~4 MB, like the scheduler's blocks, spread over its threads
        chunks = [(src, i) for src in jobs for i in range(0, len(src), 4 << 20)]
        outs = [np.empty(len(src), np.uint8) for src in jobs]
        index = {id(src): k for k, src in enumerate(jobs)}

        def copy(job):
            src, i = job
            np.copyto(outs[index[id(src)]][i:i + (4 << 20)], src[i:i + (4 << 20)])

        workers = len(os.sched_getaffinity(0))
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(copy, chunks))
    dt = time.perf_counter() - t
    print(json.dumps({"seconds": dt, "peak_anon_growth": pm.peak_anon - pm.base_anon, "tensors": len(jobs),
                      "checksum": 0}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("mode", choices=["serve", "serve-into", "alloc-floor", "copy-floor", "convert"])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--budget", default=None)
    ap.add_argument("--scheduler", default="threads")
    ap.add_argument("--workers", type=int, default=None, help="scheduler threads (default: the CPUs available)")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.ckpt, "config.json")))
    if a.mode == "copy-floor":
        return copy_floor(a.ckpt)
    t = time.perf_counter()
    with PeakMem() as pm:
        weights = lw.load_weights(a.ckpt)
        adapted = w1_adapter(dict(weights.items()), huggingface_config=cfg)
        plan = lw.plan(adapted)
        if a.mode in ("serve-into", "alloc-floor"):
            outs = {n: np.empty(node.shape, node.dtype.to_numpy()) for n, node in plan.outputs.items()}
            for v in outs.values():
                v.reshape(-1).view(np.uint8)[::4096] = 1  # first touch: the kernel backs every page now
            t_alloc = time.perf_counter() - t
            chk = 0
            if a.mode == "serve-into":
                t = time.perf_counter()
                sd = plan.materialize(budget=a.budget, scheduler=a.scheduler, out=outs, workers=a.workers)
                chk = sum(int(v.view(np.uint8).reshape(-1)[:: max(1, v.nbytes // 64)].sum()) for v in sd.values())
        elif a.mode == "serve":
            sd = plan.materialize(budget=a.budget, scheduler=a.scheduler, workers=a.workers)
            chk = sum(int(v.view(np.uint8).reshape(-1)[:: max(1, v.nbytes // 64)].sum()) for v in sd.values())
        else:
            plan.save(a.out, budget=a.budget, scheduler=a.scheduler, workers=a.workers)
            chk = 0
    dt = time.perf_counter() - t
    if a.mode == "alloc-floor":
        dt = t_alloc
    print(json.dumps({"seconds": dt, "peak_anon_growth": pm.peak_anon - pm.base_anon, "tensors": len(adapted), "checksum": chk}))


if __name__ == "__main__":
    main()
