#!/usr/bin/env python3
"""W1 onto the GPU: lazyweights against every loader people use to put safetensors on a GPU, in one run.

  python benchmarks/bench_gpu_peers.py CKPT [--reps 3] [--cache warm|cold|both] [--only a,b] [--json OUT]
  python benchmarks/bench_gpu_peers.py --gguf FILE.gguf [--reps 3] [--cache ...]   (every tensor dequantized)

CKPT is a Llama-shaped bf16 safetensors checkpoint with config.json (`../shared/bench/make_ckpt.py` makes the
2.2 GB TinyLlama shape). Every contestant ends with the *W1-adapted* state dict resident on the GPU (renamed,
q/k rows RoPE-permuted per head, norms float32, everything else float16), and each result is checked bit for
bit against lazyweights' (torch.equal on the device) once, outside the timings:

  pinned      the floor: one cudaMemcpyAsync of the checkpoint's byte count from a pinned host buffer
              (best of 5). No loader can beat it: every byte must cross the link once.
  naive       per tensor: read it with safetensors on the host, `torch.as_tensor(...).cuda()` (a pageable copy),
              then permute and cast on the device with torch ops.
  safetensors `safe_open(f, framework="pt", device="cuda:0")` per file, W1 on the device with torch ops.
  fastsafetensors  `fastsafe_open(files, device="cuda:0", nogds=True)` (no GPUDirect Storage here), W1 with torch.
  runai       runai-model-streamer's `SafetensorsStreamer` (its default concurrency), each tensor `.to("cuda")`
              as vLLM does, W1 with torch.
  instanttensor  `instanttensor.safe_open(files, device=0)` (its default backend), W1 with torch.
  lazyweights `plan.materialize(device="gpu:0")`: pinned staging, several streams, one fused cast kernel per block.

With --gguf (default contestants: gguf-py, lazyweights-host, lazyweights) the result is every tensor of a GGUF
file as float32 on the GPU: `gguf-py` reads with GGUFReader and dequantizes with gguf.quants.dequantize on the
host, then uploads; `lazyweights-host` materializes on the CPU executor, then uploads; `lazyweights` dequantizes
on the device (the raw blocks cross the link, not the float32). None of the safetensors loaders reads GGUF.

Cache: `warm` reads the checkpoint once before timing; `cold` writes `3` to /proc/sys/vm/drop_caches (root) before
every timed run, falling back to posix_fadvise(DONTNEED) on each file. Medians of --reps; every timing ends with a
device synchronize. The contestants' GPU memory is freed between runs. Each contestant runs once untimed first
(CUDA context, kernel compilation, library warm-up stay out of the figures).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
BENCH = os.environ.get("LAZYWEIGHTS_SHARED_BENCH", str(Path(__file__).resolve().parents[2] / "shared" / "bench"))
sys.path.insert(0, BENCH)

import lazyweights as lw  # noqa: E402


def _config(ckpt: str):
    return types.SimpleNamespace(**json.load(open(os.path.join(ckpt, "config.json"))))


def _files(ckpt: str) -> list[str]:
    return sorted(str(p) for p in Path(ckpt).glob("*.safetensors"))


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


class W1Torch:
    """The W1 transform on device tensors with torch ops: what a loader's user writes after loading."""

    def __init__(self, ckpt: str):
        import torch
        from workload import adapt_name, rope_perm

        cfg = _config(ckpt)
        self.heads = cfg.num_attention_heads
        self.kv = getattr(cfg, "num_key_value_heads", self.heads)
        self.hd = cfg.hidden_size // self.heads
        self.perm = torch.as_tensor(rope_perm(self.hd), device="cuda")
        self.adapt_name = adapt_name

    def __call__(self, name: str, t):
        import torch

        n = self.adapt_name(name)
        if n is None:
            return None, None
        if n.endswith(("q_proj.weight", "k_proj.weight")):
            h = self.heads if "q_proj" in n else self.kv
            t = t.reshape(h, self.hd, -1).index_select(1, self.perm).reshape(h * self.hd, -1)
        return n, t.to(torch.float32 if "norm" in n else torch.float16)


def _safe_open_w1(ckpt: str, w1: W1Torch, device: str | None) -> dict:
    """Every tensor through safetensors' `safe_open` (onto `device`, or the host and then `.cuda()`), W1 on it."""
    from safetensors import safe_open

    out = {}
    for f in _files(ckpt):
        with safe_open(f, framework="pt", **({"device": device} if device else {})) as fh:
            for k in fh.keys():
                t = fh.get_tensor(k)
                n, t = w1(k, t if device else t.cuda())
                if n is not None:
                    out[n] = t
    return out


def naive(ckpt: str, w1: W1Torch) -> dict:
    return _safe_open_w1(ckpt, w1, None)


def safetensors_cuda(ckpt: str, w1: W1Torch) -> dict:
    return _safe_open_w1(ckpt, w1, "cuda:0")


def fastsafetensors(ckpt: str, w1: W1Torch) -> dict:
    from fastsafetensors import fastsafe_open

    out = {}
    with fastsafe_open(_files(ckpt), framework="pt", device="cuda:0", nogds=True) as f:
        for k in f.keys():
            n, t = w1(k, f.get_tensor(k))
            if n is not None:
                out[n] = t
    return out


def runai(ckpt: str, w1: W1Torch) -> dict:
    from runai_model_streamer import SafetensorsStreamer

    out = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(_files(ckpt))
        for k, t in streamer.get_tensors():
            n, d = w1(k, t.to("cuda"))
            if n is not None:
                out[n] = d
    return out


def instanttensor(ckpt: str, w1: W1Torch) -> dict:
    from instanttensor import safe_open

    out = {}
    with safe_open(_files(ckpt), framework="pt", device=0) as f:
        for k, t in f.tensors():
            n, d = w1(k, t)
            if n is not None:
                out[n] = d
    return out


def lazyweights_plan(ckpt: str):
    from lazyweights.tools.demo import convert_safetensor_state_dict

    weights = lw.load_weights(ckpt)
    return lw.plan(convert_safetensor_state_dict(dict(weights.items()), huggingface_config=_config(ckpt)))


LW_OPTIONS: dict = {}  # --lw-streams / --lw-host-threads: materialize_gpu's knobs, for a sweep
_LW_KNOBS = {"s": "streams", "h": "host_threads", "b": "block_bytes", "p": "read_calls"}


def lazyweights_gpu(ckpt: str, w1: W1Torch) -> dict:
    if LW_OPTIONS:
        from lazyweights.run.gpu import materialize_gpu

        return materialize_gpu(lazyweights_plan(ckpt), "gpu:0", **LW_OPTIONS)
    return lazyweights_plan(ckpt).materialize(device="gpu:0")


def lazyweights_variant(spec: str):
    """A lazyweights contestant with materialize_gpu's knobs set: "s8h16b32p0" is 8 streams, 16 host
    threads, 32 MB blocks, copies from the map instead of pread (any subset, in any order)."""
    import re

    opts = {}
    for key, num in re.findall(r"(s|h|b|p)(\d+)", spec):
        opts[_LW_KNOBS[key]] = int(num) << 20 if key == "b" else bool(int(num)) if key == "p" else int(num)

    def run(ckpt: str, w1: W1Torch) -> dict:
        from lazyweights.run.gpu import materialize_gpu

        return materialize_gpu(lazyweights_plan(ckpt), "gpu:0", **opts)
    return run


def plan_seconds(ckpt: str, reps: int = 5) -> float:
    """lazyweights' part before any byte is read: open the files, adapt the names, build the plan (median)."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        lazyweights_plan(ckpt)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def host_to_pinned_seconds(files: list[str], threads: int, reps: int = 3, fresh_maps: bool = False) -> float:
    """The host side's floor: the checkpoint's bytes copied from memory maps (page cache warm) into one pinned
    buffer by `threads` threads, no device involved (best of reps). A loader reading from the page cache
    cannot put the bytes on the link faster than this. `fresh_maps`: the files are mapped again inside each
    timing, so the page faults of a first read are in it (what a loader that maps the files pays)."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    from cupy.cuda import pinned_memory

    def open_maps():
        out = []
        for p in files:
            with open(p, "rb") as fh:
                out.append(np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), np.uint8))
        return out

    maps = open_maps()
    total = sum(m.size for m in maps)
    mem = pinned_memory.PinnedMemory(total)
    host = np.ndarray((total,), np.uint8, buffer=pinned_memory.PinnedMemoryPointer(mem, 0))
    host[::4096] = 1
    jobs, at, chunk = [], 0, 64 << 20
    for m in maps:
        for s in range(0, m.size, chunk):
            n = min(chunk, m.size - s)
            jobs.append((m, s, at, n))
            at += n
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(reps):
            t = time.perf_counter()
            if fresh_maps:
                index = {id(m): k for k, m in enumerate(maps)}
                new = open_maps()
                run = [(new[index[id(j[0])]],) + j[1:] for j in jobs]
            else:
                run = jobs
            list(pool.map(lambda j: np.copyto(host[j[2]:j[2] + j[3]], j[0][j[1]:j[1] + j[3]]), run))
            best = min(best, time.perf_counter() - t)
    return best  # the pinned buffer is freed with `mem` on return


def _gguf_state(path: str):
    weights = lw.load_weights(path)
    state = {}
    for name, w in weights.items():
        d = w.data()
        state[name] = d.dequantize() if d.quantization_encoding is not None else d.astype(lw.DType.float32)
    return lw.plan(state)


def gguf_py(path: str, _w1) -> dict:
    import gguf
    import torch

    out = {}
    for t in gguf.GGUFReader(path).tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        out[t.name] = torch.as_tensor(a.reshape(tuple(reversed([int(x) for x in t.shape])))).cuda()
    return out


def gguf_lazy_host(path: str, _w1) -> dict:
    import torch

    return {k: torch.as_tensor(np.ascontiguousarray(v)).cuda() for k, v in _gguf_state(path).materialize().items()}


def gguf_lazy_gpu(path: str, _w1) -> dict:
    return _gguf_state(path).materialize(device="gpu:0")


GGUF_CONTESTANTS = {"gguf-py": gguf_py, "lazyweights-host": gguf_lazy_host, "lazyweights": gguf_lazy_gpu}
CONTESTANTS = {"naive": naive, "safetensors": safetensors_cuda, "fastsafetensors": fastsafetensors, "runai": runai,
               "instanttensor": instanttensor, "lazyweights": lazyweights_gpu}


def pinned_h2d_seconds(nbytes: int) -> float:
    """Seconds of one cudaMemcpyAsync of nbytes from pinned host memory to the device (best of 5)."""
    from bench_gpu import pinned_h2d_bandwidth

    return nbytes / pinned_h2d_bandwidth(nbytes)


def drop_cache(files: list[str]) -> str:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


def warm_cache(files: list[str]) -> None:
    for p in files:
        with open(p, "rb") as fh:
            while fh.read(64 << 20):
                pass


def free_gpu() -> None:
    import cupy
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()


def as_torch(d: dict) -> dict:
    import torch

    return {k: (v if isinstance(v, torch.Tensor) else torch.from_dlpack(v)) for k, v in d.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", nargs="?")
    ap.add_argument("--gguf", default=None, help="benchmark this GGUF file (every tensor to float32) instead")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache", choices=["warm", "cold", "both"], default="both")
    ap.add_argument("--only", default=None, help="comma-separated contestants (default: all)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--lw-streams", type=int, default=None, help="lazyweights' CUDA streams (default: its own)")
    ap.add_argument("--lw-host-threads", type=int, default=None, help="lazyweights' host threads (default: its own)")
    ap.add_argument("--lw-variants", default="", help="extra lazyweights contestants with knobs set, comma-separated: "
                    "s<streams>h<host threads>b<block MB>p<0: copy from the map, not pread>, e.g. s8h8,s16h8b4p0")
    a = ap.parse_args()
    if a.lw_streams:
        LW_OPTIONS["streams"] = a.lw_streams
    if a.lw_host_threads:
        LW_OPTIONS["host_threads"] = a.lw_host_threads
    import torch

    if a.gguf:
        ckpt, files, table, w1 = os.path.abspath(a.gguf), [os.path.abspath(a.gguf)], GGUF_CONTESTANTS, None
    else:
        ckpt, table = os.path.abspath(a.ckpt), CONTESTANTS
        files = _files(ckpt)
        w1 = W1Torch(ckpt)
    size = sum(os.path.getsize(f) for f in files)
    names = a.only.split(",") if a.only else list(table)
    for spec in filter(None, a.lw_variants.split(",")):
        table = dict(table, **{f"lw-{spec}": lazyweights_variant(spec)})
        names.append(f"lw-{spec}")
    print(f"device {torch.cuda.get_device_name(0)}, {os.cpu_count()} cpus; {ckpt}: {size / 1e9:.2f} GB "
          f"in {len(files)} files", flush=True)
    floor = pinned_h2d_seconds(size)
    print(f"pinned H2D floor: {floor:.3f} s for {size / 1e9:.2f} GB = {size / floor / 1e9:.1f} GB/s", flush=True)

    warm_cache(files)
    host_floor = host_to_pinned_seconds(files, os.cpu_count() or 1)
    print(f"host floor: page cache -> pinned memory on {os.cpu_count()} threads {host_floor:.3f} s = "
          f"{size / host_floor / 1e9:.1f} GB/s", flush=True)
    host_fresh = host_to_pinned_seconds(files, os.cpu_count() or 1, fresh_maps=True)
    print(f"host floor, files mapped inside the timing: {host_fresh:.3f} s = {size / host_fresh / 1e9:.1f} GB/s",
          flush=True)
    if not a.gguf:
        print(f"lazyweights before the first read (open, adapt, plan): {plan_seconds(ckpt):.4f} s", flush=True)
    try:
        reference = as_torch(table["lazyweights"](ckpt, w1))
    except Exception:  # still measure the peers, against the first one that runs
        import traceback

        traceback.print_exc()
        print("lazyweights failed: the peers are checked against the first of them instead", flush=True)
        reference = as_torch(table[names[0] if names[0] != "lazyweights" else names[1]](ckpt, w1))
    ref_names = sorted(reference)
    results: dict = {"device": torch.cuda.get_device_name(0), "gb": size / 1e9, "pinned_s": floor,
                     "host_floor_s": host_floor, "host_floor_fresh_maps_s": host_fresh, "lw_options": LW_OPTIONS,
                     "runs": {}}
    identical = {}
    for name in names:
        fn = table[name]
        try:
            warm_cache(files)
            got = as_torch(fn(ckpt, w1))  # untimed first run, also the identity check
            _sync()
            same = sorted(got) == ref_names and all(
                got[k].dtype == reference[k].dtype and got[k].shape == reference[k].shape
                and torch.equal(got[k], reference[k]) for k in ref_names)
            identical[name] = same
            del got
            free_gpu()
        except Exception as e:  # a peer that cannot run here is reported, not fatal
            import traceback

            traceback.print_exc(limit=-4)
            print(f"{name}: cannot run ({type(e).__name__}: {e})", flush=True)
            identical[name] = None
            continue
        for cache in (["warm", "cold"] if a.cache == "both" else [a.cache]):
            times, how = [], "warm"
            for _ in range(a.reps):
                if cache == "cold":
                    how = drop_cache(files)
                else:
                    warm_cache(files)
                t = time.perf_counter()
                try:
                    got = fn(ckpt, w1)
                    _sync()
                except Exception as e:
                    print(f"{name} {cache}: failed ({type(e).__name__}: {e})", flush=True)
                    break
                times.append(time.perf_counter() - t)
                del got
                free_gpu()
            if not times:
                continue
            med = statistics.median(times)
            results["runs"][f"{name}/{cache}"] = dict(median_s=med, runs=times, cache=how, identical=identical[name])
            print(f"{name:16} {cache:4} ({how}) {med:7.3f} s  {size / med / 1e9:6.1f} GB/s  "
                  f"{floor / med:5.0%} of pinned  identical={identical[name]}  runs={['%.3f' % x for x in times]}",
                  flush=True)
    for name in [n for n in names if n == "lazyweights" or n.startswith("lw-")]:
        warm_cache(files)  # one more warm run: where its calling thread's time went (DeviceArrays.timings)
        res = table[name](ckpt, w1)
        _sync()
        parts = getattr(res, "timings", {})
        print(f"{name}, one warm run, {getattr(res, 'blocks', '?')} blocks: "
              + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()), flush=True)
        results.setdefault("timings", {})[name] = parts
        del res
        free_gpu()
    what = "GGUF dequantized" if a.gguf else "W1"
    print(f"\n{what} onto the GPU, {size / 1e9:.2f} GB, medians of {a.reps}; pinned floor {floor:.3f} s")
    print(f"host floor (page cache -> pinned, {os.cpu_count()} threads) {host_floor:.3f} s, "
          f"{host_fresh:.3f} s with fresh maps; "
          f"lazyweights options {LW_OPTIONS or 'default'}")
    print(f"{'contestant':16} {'warm s':>8} {'x floor':>8} {'cold s':>8} {'x floor':>8}  identical")
    for name in names:
        w, c = results["runs"].get(f"{name}/warm"), results["runs"].get(f"{name}/cold")
        ws = f"{w['median_s']:8.3f} {w['median_s'] / floor:8.2f}" if w else f"{'-':>8} {'-':>8}"
        cs = f"{c['median_s']:8.3f} {c['median_s'] / floor:8.2f}" if c else f"{'-':>8} {'-':>8}"
        print(f"{name:16} {ws} {cs}  {identical.get(name)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
