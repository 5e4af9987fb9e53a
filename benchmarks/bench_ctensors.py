#!/usr/bin/env python3
"""compressed-tensors checkpoint -> bf16 / Q4_K_M GGUF in one pass, against compressed-tensors' own route.

  python benchmarks/bench_ctensors.py [--schemes W4A16,FP8_BLOCK] [--presets bf16,Q4_K_M] [--threads 2]
                                      [--scratch DIR] [--budget 256MB] [--layers 8]

Checkpoints: a random Llama (hidden 1024, intermediate 2816, 8 layers, 8 heads / 4 kv heads, vocab 8192:
about 111M parameters, 222 MB in bf16), quantized with compressed-tensors' preset scheme (qparams from its own
calculate_qparams), compressed by its ModelCompressor and saved as llm-compressor saves it (W4A16: 92 MB,
FP8_BLOCK: 138 MB). Built once per scratch folder.

one pass    `lazyweights convert LlamaForCausalLM CT_DIR -o out.gguf [--quant Q4_K_M]`: the packed int4 / FP8
            tensors and their scales are read, dequantized, (quantized,) and written in one streaming pass.
two steps   step 1: compressed-tensors' own model-free decompression to disk (`convert_checkpoint` with
            `CompressedTensorsDequantizer(dtype=bfloat16)`, its documented way to dequantize a checkpoint;
            the modules without scales are passed as `ignore`, which FP8 folders need),
            step 2: that bf16 folder -> GGUF with `lazyweights convert` (faster than llama.cpp's
            convert_hf_to_gguf.py, which favours this side).

Each run is a fresh subprocess; wall time and peak RssAnon (private memory, sampled from /proc every 20 ms;
mapped file pages excluded), `sync` before each. The two GGUFs must hold the same tensors (types and bytes):
values equal to compressed-tensors' decompression, through the whole conversion.

Sparse (`--sparse sparse-24-bitmask,sparse-bitmask`; `--schemes none` skips the quantized checkpoints):
`--sparse-weights` bf16 weights of `--sparse-shape` (default 8 of 4096x4096: 256 MB dense), half their values
zero (2:4: two of every four kept; bitmask: each value kept with probability 1/2), written in compressed-tensors
0.14's layout (values in C order, packbits(little) masks, int64 shape, row offsets for sparse-bitmask; as
tests/formats/test_compressed_tensors_sparse.py writes them). compressed-tensors 0.20 can neither read nor write
sparse checkpoints, so there is no peer from it: the contestants are

lazyweights `load_weights(folder)` and `plan(every dense weight).materialize()` into memory (the `scatter` op)
numpy       compressed-tensors' own `bitmask_decompress` algorithm in numpy: `unpackbits` the mask, then
            `dense[mask] = values` into zeros, one weight at a time
floor       a copy of the same stored bytes (values, masks) from a fresh map into fresh memory, then the dense
            bytes written once (a fill of fresh memory): bytes read + bytes written

each in a fresh process, memory warmed right before, interleaved, medians of `--reps`; the time printed is the
child's own, from after its imports (numpy, lazyweights) to the last dense byte (opening the folder included),
and the wall time of the whole process (start-up and imports included) beside it. lazyweights' dense
weights are checked bit-identical to the numpy reference first.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from bench_quantize_pass import measured  # (wall seconds, peak RssAnon) of a subprocess

BUILD = r"""
import sys, torch, transformers
sys.path.insert(0, sys.argv[3])
from test_compressed_tensors import _qparams
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
from compressed_tensors.quantization.utils import generate_gparam
preset, out, layers = sys.argv[1], sys.argv[2], int(sys.argv[4])
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                               num_attention_heads=8, num_key_value_heads=4, vocab_size=8192,
                               max_position_embeddings=2048, tie_word_embeddings=False)
model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
apply_quantization_config(model, QuantizationConfig(
    config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])}, ignore=["lm_head"]))
with torch.no_grad():
    for _, m in model.named_modules():
        s = getattr(m, "quantization_scheme", None)
        if s is None:
            continue
        g = None
        if hasattr(m, "weight_global_scale"):
            g = generate_gparam(m.weight.amin(), m.weight.amax())
            m.weight_global_scale.data = g.to(m.weight_global_scale.dtype)
        scale, zp = _qparams(m.weight.data, s.weights, global_scale=g)
        m.weight_scale.data = scale.to(m.weight_scale.dtype).reshape(m.weight_scale.shape)
        if hasattr(m, "weight_zero_point"):
            m.weight_zero_point.data = zp.to(m.weight_zero_point.dtype).reshape(m.weight_zero_point.shape)
c = ModelCompressor.from_pretrained_model(model)
c.compress_model(model)
model.save_pretrained(out)
c.update_config(out)
"""

DECOMPRESS = r"""
import sys, torch
from compressed_tensors.entrypoints.convert import convert_checkpoint
from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer
from safetensors import safe_open
src, dst, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(threads)
# Its model-free converter matches the config's targets ("Linear") by name alone, so a float-quantized folder
# needs the unquantized modules (embeddings, norms, lm_head) listed as ignored, or it looks for their scales.
with safe_open(src + "/model.safetensors", "pt") as f:
    names = set(f.keys())
ignore = sorted(n[:-7] for n in names if n.endswith(".weight") and n[:-7] + ".weight_scale" not in names)
convert_checkpoint(src, dst, CompressedTensorsDequantizer(src, ignore=ignore, dtype=torch.bfloat16),
                   max_workers=threads, device="cpu")
"""


def folder_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))


def same_tensors(a, b):
    from lazyweights import load_weights

    ra, rb = load_weights(a).records, load_weights(b).records
    if sorted(ra) != sorted(rb):
        return f"NO: names differ {sorted(set(ra) ^ set(rb))[:3]}"
    import numpy as np

    bad = [n for n in ra if (ra[n].encoding, ra[n].dtype, ra[n].shape) != (rb[n].encoding, rb[n].dtype, rb[n].shape)
           or not np.array_equal(ra[n].array(), rb[n].array())]
    return f"{'yes' if not bad else f'NO: {len(bad)} differ, e.g. {bad[:3]}'} ({len(ra)} tensors)"


SPARSE_CHILD = r"""
import json, sys, time
import numpy as np
kind, folder, out = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "lazyweights":
    from lazyweights import load_weights, plan
t0 = time.perf_counter()
if kind == "lazyweights":
    w = load_weights(folder)
    got = plan({n: w[n].data() for n, _ in w.items()}).materialize()
    touched = sum(a.nbytes for a in got.values())
else:
    with open(folder + "/model.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
    mm = np.memmap(folder + "/model.safetensors", np.uint8, "r", offset=8 + n)
    part = {k: mm[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}
    modules = sorted(k[:-8] for k in part if k.endswith(".bitmask"))
    touched = 0
    for m in modules:
        shape = tuple(int(x) for x in part[m + ".shape"].view(np.int64).reshape(-1))
        if kind == "floor":  # the stored bytes copied into fresh memory, the dense bytes written once
            stored = [np.array(part[m + s]) for s in (".compressed", ".bitmask")]
            dense = np.empty(shape[0] * shape[1] * 2, np.uint8)
            dense.fill(1)
        else:  # compressed-tensors' bitmask_decompress, in numpy
            mask = np.unpackbits(np.array(part[m + ".bitmask"]).reshape(shape[0], -1), axis=-1, count=shape[1],
                                 bitorder="little").astype(bool)
            dense = np.zeros(shape, np.uint16)
            dense[mask] = part[m + ".compressed"].view(np.uint16)
        touched += dense.nbytes
with open(out, "w") as fh:
    fh.write(f"{time.perf_counter() - t0} {touched}")
"""


def write_sparse(folder, fmt, count, rows, cols, seed=0):
    """`count` bf16 weights [rows, cols], half zero, in compressed-tensors 0.14's sparse layout (written by hand:
    safetensors.numpy has no bfloat16). Returns (stored bytes, dense bytes)."""
    import json

    import numpy as np

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    header, blobs, off = {}, [], 0

    def add(name, dtype, arr):
        nonlocal off
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)

    for i in range(count):
        m = f"model.layers.{i}.mlp.up_proj"
        if fmt == "sparse-24-bitmask":  # one of the six 2-of-4 patterns per group of four
            patterns = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1], [0, 1, 1, 0], [0, 1, 0, 1], [0, 0, 1, 1]],
                                bool)
            mask = patterns[rng.integers(0, 6, rows * cols // 4)].reshape(rows, cols)
        else:
            mask = rng.random((rows, cols), np.float32) < 0.5
        n = int(mask.sum())
        bits = (rng.standard_normal(n, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        bits[(bits & 0x7FFF) == 0] = 0x3F80  # no stored zero: the mask alone says which values are kept
        if fmt == "sparse-24-bitmask":
            add(m + ".compressed", "BF16", bits.reshape(rows, cols // 2))
            add(m + ".shape", "I64", np.array([rows, cols], np.int64).reshape(-1, 1))
        else:
            counts = mask.sum(1)
            add(m + ".compressed", "BF16", bits)
            add(m + ".row_offsets", "I64", (np.cumsum(counts) - counts).astype(np.int64))
            add(m + ".shape", "I64", np.array([rows, cols], np.int64))
        add(m + ".bitmask", "U8", np.packbits(mask, axis=-1, bitorder="little"))
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as fh:
        fh.write(len(head).to_bytes(8, "little"))
        fh.write(head)
        for b in blobs:
            fh.write(b)
    qc = {"quant_method": "compressed-tensors", "sparsity_config": {"format": fmt, "targets": ["Linear"]}}
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"quantization_config": qc}, fh)
    stored = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
                 if k.endswith((".compressed", ".bitmask")))
    return stored, count * rows * cols * 2


def sparse_identical(folder):
    """lazyweights' dense weights against compressed-tensors' bitmask_decompress algorithm in numpy, bit for bit."""
    import json

    import numpy as np

    from lazyweights import load_weights, plan

    w = load_weights(folder)
    got = plan({n: w[n].data() for n, _ in w.items()}).materialize()
    with open(folder + "/model.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
    mm = np.memmap(folder + "/model.safetensors", np.uint8, "r", offset=8 + n)
    part = {k: mm[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}
    bad = []
    for m in sorted(k[:-8] for k in part if k.endswith(".bitmask")):
        shape = tuple(int(x) for x in part[m + ".shape"].view(np.int64).reshape(-1))
        mask = np.unpackbits(np.array(part[m + ".bitmask"]).reshape(shape[0], -1), axis=-1, count=shape[1],
                             bitorder="little").astype(bool)
        want = np.zeros(shape, np.uint16)
        want[mask] = part[m + ".compressed"].view(np.uint16)
        mine = got[m + ".weight"]
        if mine.dtype.itemsize != 2 or not np.array_equal(np.ascontiguousarray(mine).view(np.uint16), want):
            bad.append(m)
    return f"{'yes' if not bad else f'NO: {len(bad)} differ, e.g. {bad[:2]}'} ({len(got)} weights)"


def warm_memory(gib=2):
    """Touch and free a few GiB so the contestant's fresh memory is not the host's cold memory
    (ARCHITECTURE.md: these VMs hand freed memory back to their host about 2 s after a process frees it)."""
    b = bytearray(gib << 30)
    for i in range(0, len(b), 1 << 12):
        b[i] = 1
    del b


def sparse_section(a, scratch):
    import statistics

    rows, cols = (int(x) for x in a.sparse_shape.lower().split("x"))
    print(f"sparse: {a.sparse_weights} bf16 weights of {rows}x{cols}, half zero; medians of {a.reps} "
          "(child's own seconds after start-up; wall seconds of the whole process in brackets)")
    print(f"{'format':18} {'stored MB':>9} {'dense MB':>8} | {'lazyweights s':>19} {'peak':>7} | "
          f"{'numpy (ct) s':>19} {'peak':>7} | {'floor s':>17} | {'vs numpy':>8} {'vs floor':>8} | identical")
    for fmt in a.sparse.split(","):
        folder = os.path.join(scratch, f"sparse-{fmt}")
        stored, dense = write_sparse(folder, fmt, a.sparse_weights, rows, cols)
        same = sparse_identical(folder)
        runs = {k: [] for k in ("lazyweights", "numpy", "floor")}
        res = os.path.join(scratch, "sparse-child.txt")
        for _ in range(a.reps):
            for k in runs:
                warm_memory()
                wall, peak = measured([sys.executable, "-c", SPARSE_CHILD, k, folder, res])
                with open(res) as fh:
                    inner, touched = fh.read().split()
                assert int(touched) == dense, (k, touched, dense)
                runs[k].append((float(inner), wall, peak))
        med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v), max(r[2] for r in v))
               for k, v in runs.items()}

        def cell(k, med=med):
            return f"{med[k][0]:7.3f} [{med[k][1]:5.2f}] {med[k][2] / 2**20:5.0f}MB"

        lw, npy, fl = med["lazyweights"][0], med["numpy"][0], med["floor"][0]
        print(f"{fmt:18} {stored / 1e6:9.0f} {dense / 1e6:8.0f} | {cell('lazyweights'):>27} | "
              f"{cell('numpy'):>27} | {fl:7.3f} [{med['floor'][1]:5.2f}] | {npy / lw:7.2f}x {lw / fl:7.2f}x | {same}",
              flush=True)
        shutil.rmtree(folder, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="W4A16,FP8_BLOCK")
    ap.add_argument("--presets", default="bf16,Q4_K_M")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--budget", default="256MB")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--sparse", default="", help="sparse formats to time, e.g. sparse-24-bitmask,sparse-bitmask")
    ap.add_argument("--sparse-shape", default="4096x4096")
    ap.add_argument("--sparse-weights", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the sparse contestants")
    a = ap.parse_args()
    scratch = a.scratch or tempfile.mkdtemp(prefix="lw-ct-")
    os.makedirs(scratch, exist_ok=True)
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "formats")
    lw = [sys.executable, "-m", "lazyweights", "convert", "LlamaForCausalLM"]
    opts = ["--no-progress", "--no-tokenizer", "--budget", a.budget, "--workers", str(a.threads), "--format", "gguf"]
    if a.sparse:
        sparse_section(a, scratch)
    if a.schemes != "none":
        print(f"{a.threads} threads, budget {a.budget}")
        print(f"{'checkpoint':22} {'preset':7} {'one pass s':>10} {'peak':>8} | {'decompress s':>12} "
              f"{'convert s':>9} {'total s':>8} {'peak':>8} | {'speedup':>7} identical")
    for scheme in [] if a.schemes == "none" else a.schemes.split(","):
        ct = os.path.join(scratch, f"ct-{scheme}")
        if not os.path.exists(os.path.join(ct, "config.json")):
            subprocess.run([sys.executable, "-c", BUILD, scheme, ct, tests, str(a.layers)], check=True,
                           stderr=subprocess.DEVNULL)
        size = folder_bytes(ct)
        for preset in a.presets.split(","):
            quant = [] if preset == "bf16" else ["--quant", preset]
            ours, dense, ref = (os.path.join(scratch, f"{n}-{scheme}-{preset}") for n in ("ours", "dense", "ref"))
            for path in (ours + ".gguf", ref + ".gguf"):
                if os.path.exists(path):
                    os.unlink(path)
            shutil.rmtree(dense, ignore_errors=True)
            w1, p1 = measured(lw + [ct, "-o", ours + ".gguf"] + opts + quant)
            d, pd = measured([sys.executable, "-c", DECOMPRESS, ct, dense, str(a.threads)])
            c, pc = measured(lw + [dense, "-o", ref + ".gguf"] + opts + quant)
            name = f"{scheme} {size / 1e6:.0f} MB"
            print(f"{name:22} {preset:7} {w1:10.2f} {p1 / 2**20:6.0f}MB | {d:12.2f} {c:9.2f} {d + c:8.2f} "
                  f"{max(pd, pc) / 2**20:6.0f}MB | {(d + c) / w1:6.2f}x {same_tensors(ours + '.gguf', ref + '.gguf')}",
                  flush=True)
            shutil.rmtree(dense, ignore_errors=True)
    if not a.scratch:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
