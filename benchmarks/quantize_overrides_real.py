"""llama-quantize's per-tensor controls on a real checkpoint, judged by llama.cpp.

    python benchmarks/quantize_overrides_real.py HF_DIR --arch Gemma3ForCausalLM --scratch DIR

For each setting: lazyweights' one pass (`lazyweights convert ARCH HF_DIR -o ours.gguf --quant P FLAGS`, a
subprocess, timed) against llama-cpp-python's `llama_model_quantize` given the same settings in its params
struct over the bf16 GGUF of the same folder (`lazyweights convert` without --quant; timed alone), then every
tensor (name, type, bytes) and every metadata key (order, type, value) compared. Also times `--dry-run`.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time

SETTINGS = {
    "tensor-type": ("Q4_K_M", ["--tensor-type", r"attn_v=q8_0", "--tensor-type", r"blk\.(0|1|2)\.ffn_down=q6_k"],
                    dict(tensor_types=[("attn_v", "Q8_0"), (r"blk\.(0|1|2)\.ffn_down", "Q6_K")])),
    "token-embedding-type, pure": ("Q8_0", ["--token-embedding-type", "q4_0", "--pure"],
                                          dict(token_embedding_type="Q4_0", pure=True)),
    "prune-layers, override-kv": ("Q8_0", ["--prune-layers", "3,7", "--override-kv", "general.name=str:pruned"],
                                  dict(prune_layers=[3, 7], kv_overrides=[("general.name", "str", "pruned")])),
}


def llama_quantize(src, dst, preset, tensor_types=(), output_tensor_type=None, token_embedding_type=None,
                   pure=False, prune_layers=(), kv_overrides=(), nthread=2):
    import llama_cpp
    from gguf import GGMLQuantizationType

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = nthread
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    keep = []
    if tensor_types:
        arr = (llama_cpp.llama_model_tensor_override * (len(tensor_types) + 1))()
        for o, (pattern, t) in zip(arr, tensor_types):
            keep.append(pattern.encode())
            o.pattern, o.type = keep[-1], GGMLQuantizationType[t].value
        params.tt_overrides = ctypes.cast(arr, type(params.tt_overrides))
        keep.append(arr)
    if output_tensor_type:
        params.output_tensor_type = GGMLQuantizationType[output_tensor_type].value
    if token_embedding_type:
        params.token_embedding_type = GGMLQuantizationType[token_embedding_type].value
    params.pure = pure
    if prune_layers:
        ids = (ctypes.c_int32 * (len(prune_layers) + 1))(*prune_layers, -1)
        params.prune_layers = ctypes.cast(ids, type(params.prune_layers))
        keep.append(ids)
    if kv_overrides:
        arr = (llama_cpp.llama_model_kv_override * (len(kv_overrides) + 1))()
        for o, (key, kind, value) in zip(arr, kv_overrides):
            assert kind == "str"
            o.key, o.tag = key.encode(), llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR
            o.value.val_str = value.encode()
        params.kv_overrides = ctypes.cast(arr, type(params.kv_overrides))
        keep.append(arr)
    t0 = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, rc
    return time.perf_counter() - t0


def compare(ours, ref) -> tuple[int, int, bool]:
    import numpy as np
    from gguf import GGUFReader

    a, b = GGUFReader(ours), GGUFReader(ref)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    same = sum(1 for n, t in tb.items() if n in ta and ta[n].tensor_type == t.tensor_type
               and np.asarray(ta[n].data).tobytes() == np.asarray(t.data).tobytes())

    def fields(r):
        return [(k, tuple(f.types), b"".join(bytes(f.parts[i]) for i in f.data))
                for k, f in r.fields.items() if not k.startswith("GGUF.")]
    return same, max(len(ta), len(tb)), fields(a) == fields(b)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--arch", default="Gemma3ForCausalLM")
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.scratch, exist_ok=True)
    cli = [sys.executable, "-m", "lazyweights", "convert", args.arch, args.hf_dir, "--no-progress",
           "--workers", str(args.workers), "--budget", "256MB"]
    bf16 = os.path.join(args.scratch, "bf16.gguf")
    t0 = time.perf_counter()
    subprocess.run(cli + ["-o", bf16], check=True, capture_output=True)
    t_bf16 = time.perf_counter() - t0
    print(f"bf16 GGUF (the reference's input): {t_bf16:.1f} s")
    for name, (preset, flags, settings) in SETTINGS.items():
        ours, ref = os.path.join(args.scratch, "ours.gguf"), os.path.join(args.scratch, "ref.gguf")
        t0 = time.perf_counter()
        dry = subprocess.run(cli + ["-o", ours, "--quant", preset, *flags, "--dry-run"], check=True,
                             capture_output=True, text=True)
        t_dry = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run(cli + ["-o", ours, "--quant", preset, *flags], check=True, capture_output=True)
        t_ours = time.perf_counter() - t0
        t_ref = llama_quantize(bf16, ref, preset, nthread=args.workers, **settings)
        same, n, meta = compare(ours, ref)
        print(f"{name} ({preset} {' '.join(flags)}): one pass {t_ours:.1f} s; bf16 + llama_model_quantize "
              f"{t_bf16:.1f} + {t_ref:.1f} s; tensors identical {same}/{n}; metadata identical {meta}; "
              f"--dry-run {t_dry:.2f} s ({dry.stdout.strip().splitlines()[-1]})")
        os.remove(ours)
        os.remove(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
