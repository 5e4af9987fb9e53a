#!/usr/bin/env python3
"""Base + PEFT LoRA -> Q4_K_M GGUF: lazyweights' one pass against PEFT merge + save + convert + quantize.

  python benchmarks/bench_lora.py [--hidden 768 --ffn 2048 --layers 6 --vocab 8000 --rank 16]
                                  [--reps 3] [--threads 2] [--scratch DIR] [--op-only]

Builds a random float32 transformers Llama of that size and a PEFT LoRA (rsLoRA, random non-zero A and B,
every projection targeted), then, each contestant in a fresh subprocess (wall time and peak RssAnon sampled
from /proc every 20 ms; mmap'd file pages are not RssAnon), `sync` before each, warm memory (1 GiB touched
and freed right before the timer starts):

one pass    `lazyweights convert lazyweights.adapters:convert_hf_to_gguf BASE --lora LORA --quant Q4_K_M`
four steps  (1) PEFT `merge_and_unload` + `save_pretrained` (torch, float32), (2) lazyweights' HF -> f32 GGUF of
            the merged folder, (3) llama.cpp's `llama_model_quantize` to Q4_K_M (llama-cpp-python): the
            time is the sum, the peak the largest of the three.

The two Q4_K_M files must hold the same tensors, byte for byte, or the script says which differ.

The op part (`--op-only` runs just it) times one `lora` node, W [8192, 4096] bf16 + r=16 update -> bf16, on
1 and 2 threads, against a plain copy of W's bytes (the memory floor), and splits one block's time into the
update (the fixed-order kernel, `kernels/_clora.c`, in the 16-row sub-blocks `lora_rows` uses) and the rest,
beside numpy's BLAS doing the same product, scale and add in whatever order its kernel picks.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's lazyweights, here and in the subprocesses
os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
# Warm memory for every contestant (1 GiB touched and freed), then the time its work starts, on stdout.
WARM = ("import time as _t, numpy as _n; _a = _n.ones(1 << 28, _n.float32); del _a; "
        "print('START', _t.time(), flush=True)\n")

PEFT_MERGE = WARM + r"""
import sys, torch, transformers, peft
base, lora, out = sys.argv[1:4]
m = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
m = peft.PeftModel.from_pretrained(m, lora).merge_and_unload()
m.save_pretrained(out, safe_serialization=True)
"""

QUANTIZE = WARM + r"""
import ctypes, sys, llama_cpp
src, dst, threads = sys.argv[1:4]
params = llama_cpp.llama_model_quantize_default_params()
params.nthread = int(threads)
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))
"""

CLI = WARM + r"""
import sys
from lazyweights.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


def measured(cmd):
    """(wall seconds, peak RssAnon bytes) of a subprocess, both from the moment its warm-up ends."""
    subprocess.run(["sync"], check=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    samples = []
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        samples.append((time.time(), int(line.split()[1]) * 1024))
        except OSError:
            pass
        time.sleep(0.02)
    end = time.time()
    out, err = p.communicate()
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    start = float(next(line.split()[1] for line in out.decode().splitlines() if line.startswith("START")))
    return end - start, max([m for t, m in samples if t >= start] or [0])


def build(scratch, a):
    import peft
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                                   num_hidden_layers=a.layers, num_attention_heads=a.hidden // 64,
                                   num_key_value_heads=max(1, a.hidden // 256), max_position_embeddings=2048,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    base, lora = os.path.join(scratch, "base"), os.path.join(scratch, "lora")
    transformers.LlamaForCausalLM(cfg).save_pretrained(base, safe_serialization=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = peft.get_peft_model(model, peft.LoraConfig(r=a.rank, lora_alpha=2 * a.rank, use_rslora=True,
                                                       target_modules=targets, init_lora_weights=False))
    model.save_pretrained(lora)
    return base, lora


def same_tensors(x, y):
    import numpy as np
    from gguf import GGUFReader

    tx = {t.name: t for t in GGUFReader(x).tensors}
    ty = {t.name: t for t in GGUFReader(y).tensors}
    if set(tx) != set(ty):
        return f"tensor names differ: {sorted(set(tx) ^ set(ty))[:5]}"
    bad = [n for n in tx if tx[n].tensor_type != ty[n].tensor_type
           or np.asarray(tx[n].data).tobytes() != np.asarray(ty[n].data).tobytes()]
    return f"{len(bad)} of {len(tx)} tensors differ, e.g. {bad[:3]}" if bad else f"all {len(tx)} tensors identical"


def convert_part(a, scratch):
    base, lora = build(scratch, a)
    size = sum(os.path.getsize(os.path.join(base, f)) for f in os.listdir(base) if f.endswith(".safetensors"))
    print(f"base {size / 1e6:.0f} MB float32 ({a.layers} layers, hidden {a.hidden}, ffn {a.ffn}, vocab {a.vocab}); "
          f"LoRA r={a.rank} on all 7 projections")
    py, conv = sys.executable, ["convert", "lazyweights.adapters:convert_hf_to_gguf", "--no-tokenizer",
                                "--no-progress", "--workers", str(a.threads)]
    ours, base_t = [], []
    for rep in range(a.reps):
        out = os.path.join(scratch, f"ours{rep}.gguf")
        ours.append(measured([py, "-c", CLI] + conv + [base, "--lora", lora, "--quant", "Q4_K_M", "-o", out]))
        merged, f32, ref = (os.path.join(scratch, f"{n}{rep}{ext}") for n, ext in
                            (("merged", ""), ("merged", ".gguf"), ("ref", ".gguf")))
        steps = [measured([py, "-c", PEFT_MERGE, base, lora, merged]),
                 measured([py, "-c", CLI] + conv + [merged, "-o", f32]),
                 measured([py, "-c", QUANTIZE, f32, ref, str(a.threads)])]
        base_t.append((sum(s[0] for s in steps), max(s[1] for s in steps), steps))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    o_t, o_m = med([t for t, _ in ours]), med([m for _, m in ours])
    b_t, b_m = med([t for t, _, _ in base_t]), med([m for _, m, _ in base_t])
    step_t = [med([s[2][i][0] for s in base_t]) for i in range(3)]
    step_m = [med([s[2][i][1] for s in base_t]) for i in range(3)]
    print(f"one pass (lazyweights convert --lora --quant Q4_K_M): {o_t:.2f} s, peak RssAnon {o_m / 1e6:.0f} MB")
    print(f"PEFT merge+save / convert f32 / llama_model_quantize: {b_t:.2f} s ({step_t[0]:.2f} + {step_t[1]:.2f} "
          f"+ {step_t[2]:.2f}), peak RssAnon {b_m / 1e6:.0f} MB ({' / '.join(f'{m / 1e6:.0f}' for m in step_m)})")
    print(f"speed-up {b_t / o_t:.2f}x, peak memory {b_m / max(o_m, 1):.1f}x less; medians of {a.reps}; "
          f"disk written: one pass 1 file, four steps 3 files")
    print("files:", same_tensors(os.path.join(scratch, "ours0.gguf"), os.path.join(scratch, "ref0.gguf")))


def op_part(a):
    import ml_dtypes
    import numpy as np

    import lazyweights as lw
    from lazyweights.graph import ops
    from lazyweights.graph.lora import lora_rows, lora_update

    rng = np.random.default_rng(0)
    rows, cols, r = 8192, 4096, 16
    w = rng.standard_normal((rows, cols), np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((rows, r), np.float32).astype(ml_dtypes.bfloat16)
    am = rng.standard_normal((r, cols), np.float32).astype(ml_dtypes.bfloat16)
    node = lora_update(ops.const(w), ops.const(b), ops.const(am), 0.5)
    p = lw.plan({"w": lw.WeightData.wrap(node, "w", None)})

    def best(fn, n=5):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    out = np.empty_like(w)
    floor = best(lambda: np.copyto(out, w))
    t1 = best(lambda: p.materialize(scheduler="sync"))
    t2 = best(lambda: p.materialize())
    from lazyweights.graph.lora import _SUB_BYTES
    from lazyweights.kernels.casts import compiled_lora

    blk, sub = slice(0, 512), _SUB_BYTES // (4 * cols)   # the sub-blocks lora_rows works in (16 rows here)
    bf, af = b[blk].astype(np.float32), am.astype(np.float32)
    dst = np.empty((512, cols), ml_dtypes.bfloat16)
    acc, delta = np.zeros((sub, cols), np.float32), np.empty((sub, cols), np.float32)
    whole = best(lambda: lora_rows(node, w[blk], [(b[blk], am)], out=dst), 20)

    def kernel():
        for s in range(0, 512, sub):
            compiled_lora().lora_accumulate(acc, bf[s:s + sub], af, sub, cols, r, 0.5)

    def blas():
        for s in range(0, 512, sub):
            np.matmul(bf[s:s + sub], af, out=delta)
            np.multiply(delta, np.float32(0.5), out=delta)
            np.add(acc, delta, out=acc)

    k_t, b_t = best(kernel, 20), best(blas, 20)
    print(f"lora op, W [{rows}, {cols}] bf16 ({w.nbytes / 1e6:.0f} MB) + r={r} -> bf16: 1 thread {t1 * 1e3:.0f} ms, "
          f"threads {t2 * 1e3:.0f} ms ({t1 / t2:.2f}x), copy floor {floor * 1e3:.0f} ms ({t2 / floor:.1f}x the floor)")
    print(f"one 512-row block into its output: {whole * 1e3:.2f} ms; its update in {sub}-row sub-blocks "
          f"(product, scale and add in cache): kernels/_clora.c (fixed order) {k_t * 1e3:.2f} ms "
          f"({100 * k_t / whole:.0f}% of the block), numpy's BLAS product + scale + add (its own order, its own "
          f"threads) {b_t * 1e3:.2f} ms ({b_t / k_t:.2f}x the kernel)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--op-only", action="store_true")
    a = ap.parse_args()
    op_part(a)
    if a.op_only:
        return
    with tempfile.TemporaryDirectory(dir=a.scratch) as scratch:
        convert_part(a, scratch)


if __name__ == "__main__":
    main()
