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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="W4A16,FP8_BLOCK")
    ap.add_argument("--presets", default="bf16,Q4_K_M")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--budget", default="256MB")
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    scratch = a.scratch or tempfile.mkdtemp(prefix="lw-ct-")
    os.makedirs(scratch, exist_ok=True)
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "formats")
    lw = [sys.executable, "-m", "lazyweights", "convert", "LlamaForCausalLM"]
    opts = ["--no-progress", "--no-tokenizer", "--budget", a.budget, "--workers", str(a.threads), "--format", "gguf"]
    print(f"{a.threads} threads, budget {a.budget}")
    print(f"{'checkpoint':22} {'preset':7} {'one pass s':>10} {'peak':>8} | {'decompress s':>12} {'convert s':>9} "
          f"{'total s':>8} {'peak':>8} | {'speedup':>7} identical")
    for scheme in a.schemes.split(","):
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
