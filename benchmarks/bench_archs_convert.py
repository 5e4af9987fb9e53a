"""HF -> GGUF conversion time: lazyweights' `export_gguf` against llama.cpp's own `convert_hf_to_gguf.py`, on the
same Hugging Face folders (random float32 models of record-driven families, written once by transformers).

Both write float32 tensors (llama.cpp: `--outtype f32`) and no tokenizer: llama.cpp's converter refuses a BPE
tokenizer whose pre-tokenizer hash it does not know (these folders' tokenizers are trained here), so each
family's `set_vocab` is replaced by a no-op in its own process and ours runs with `tokenizer=False`. Each
contestant runs in a fresh process (timed from process start: both pay their imports), median of `--repeat`
runs; each run's tensors are checked byte-identical to llama.cpp's. (gpt_neox and gpt2 folders as
transformers 5 writes them are not comparable: llama.cpp's converter stops with KeyError 'rotary_pct' /
'n_ctx'.)

    python benchmarks/bench_archs_convert.py --convert /path/to/llama.cpp/convert_hf_to_gguf.py
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_DENSE = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=6, num_attention_heads=16,
              num_key_value_heads=4, max_position_embeddings=2048)
# one folder per kind of work the converter does: plain renames (starcoder2, olmo2), q/k RoPE permutation (llama),
# norm + 1 (gemma3), fused tensors kept (phi3), per-expert tensors stacked (qwen3_moe), fused experts split (gpt_oss),
# a value transform (mamba)
FAMILIES = {
    "starcoder2": ("Starcoder2Config", dict(_DENSE)),
    "olmo2": ("Olmo2Config", dict(_DENSE)),
    "llama": ("LlamaConfig", dict(_DENSE)),
    "gemma3_text": ("Gemma3TextConfig", dict(_DENSE, head_dim=64)),
    "phi3": ("Phi3Config", dict(_DENSE, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(_DENSE, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=512)),
    # fused [E, in, 2 * ff] experts split (even/odd rows) and transposed, attention sinks
    "gpt_oss": ("GptOssConfig", dict(_DENSE, head_dim=64, intermediate_size=1024, num_local_experts=8,
                                     num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"] * 3)),
    # A = -exp(A_log), conv1d squeezed
    "mamba": ("MambaConfig", dict(hidden_size=1024, state_size=16, num_hidden_layers=24, expand=2)),
}

_THEIRS = """
import runpy, sys
sys.path.insert(0, {root!r})
import conversion
_model_class = conversion.get_model_class
# every family's own set_vocab, not only TextModel's, becomes a no-op (LlamaModel reads the tokenizer in its own)


def _no_vocab(name, mmproj=False):
    cls = _model_class(name, mmproj)
    return type(name, (cls,), {{"set_vocab": lambda self: None, "model_arch": cls.model_arch}})


conversion.get_model_class = _no_vocab
sys.argv = ["convert_hf_to_gguf.py", {src!r}, "--outtype", "f32", "--outfile", {out!r}]
runpy.run_path({script!r}, run_name="__main__")
"""
_OURS = """
from lazyweights.adapters import export_gguf
export_gguf({src!r}, {out!r}, tokenizer=False)
"""


def make(name: str, folder: str) -> None:
    import torch
    import transformers

    cls, kw = FAMILIES[name]
    cfg = getattr(transformers, cls)(vocab_size=32000, **kw)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    if name == "gemma3_text":  # llama.cpp's Gemma 3 converter counts the vocabulary in tokenizer.json to trim rows
        with open(os.path.join(folder, "tokenizer.json"), "w") as fh:
            json.dump({"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(32000)}}, "added_tokens": []},
                      fh)


def same_tensors(theirs: str, ours: str) -> tuple[int, int, float]:
    """How many of llama.cpp's tensors lazyweights wrote with the same name, type, shape and bytes (the two
    contestants did the same work), and the largest relative difference among the float tensors that are not
    byte-identical (inf where one is missing or differs in type or shape)."""
    import gguf
    import numpy as np

    mine = {t.name: t for t in gguf.GGUFReader(ours).tensors}
    same, worst = 0, 0.0
    ref = gguf.GGUFReader(theirs).tensors
    for t in ref:
        m = mine.get(t.name)
        if m is None or m.tensor_type != t.tensor_type or list(m.shape) != list(t.shape):
            worst = float("inf")
            continue
        a, b = np.asarray(t.data), np.asarray(m.data)
        if np.array_equal(a.view(np.uint8), b.view(np.uint8)):
            same += 1
        elif a.dtype.kind == "f":
            diff = np.abs(a.astype(np.float64) - b) / np.maximum(np.abs(a.astype(np.float64)), 1e-30)
            worst = max(worst, float(diff.max()))
        else:
            worst = float("inf")
    return same, len(ref), worst


def run(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert", required=True, help="llama.cpp's convert_hf_to_gguf.py")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="families to run (default: all)")
    args = ap.parse_args()
    script = os.path.abspath(args.convert)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or FAMILIES:
            src = os.path.join(tmp, name)
            make(name, src)
            size = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
            theirs, ours = [], []
            their_out, our_out = os.path.join(tmp, "theirs.gguf"), os.path.join(tmp, "ours.gguf")
            for _ in range(args.repeat):
                theirs.append(run(_THEIRS.format(root=os.path.dirname(script), src=src, out=their_out,
                                                 script=script)))
                ours.append(run(_OURS.format(src=src, out=our_out)))
            same, total, worst = same_tensors(their_out, our_out)
            os.remove(their_out)
            os.remove(our_out)
            t, o = statistics.median(theirs), statistics.median(ours)
            print(f"{name}: {size / 1e6:.0f} MB float32; convert_hf_to_gguf.py {t:.2f} s, lazyweights {o:.2f} s, "
                  f"{t / o:.2f}x; tensors identical to llama.cpp's: {same}/{total}"
                  + (f" (the others within {worst:.1e} relative)" if same < total else ""))


if __name__ == "__main__":
    main()
