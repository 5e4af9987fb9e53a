"""HF -> GGUF conversion time: lazyweights' `export_gguf` against llama.cpp's own `convert_hf_to_gguf.py`, on the
same Hugging Face folders (random float32 models of record-driven families, written once by transformers).

Both write float32 tensors (llama.cpp: `--outtype f32`) and no tokenizer: llama.cpp's converter refuses a BPE
tokenizer whose pre-tokenizer hash it does not know (these folders' tokenizers are trained here), so its
`set_vocab` is replaced by a no-op in its own process and ours runs with `tokenizer=False`. Each contestant runs in
a fresh process (timed from process start: both pay their imports), median of `--repeat` runs. (gpt_neox
and gpt2 folders as transformers 5 writes them are not comparable: llama.cpp's converter stops with KeyError
'rotary_pct' / 'n_ctx'.)

    python benchmarks/bench_archs_convert.py --convert /path/to/llama.cpp/convert_hf_to_gguf.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

FAMILIES = {
    "starcoder2": ("Starcoder2Config", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=6,
                                            num_attention_heads=16, num_key_value_heads=4,
                                            max_position_embeddings=2048)),
    "olmo2": ("Olmo2Config", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=6,
                                  num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)),
}

_THEIRS = """
import runpy, sys
sys.path.insert(0, {root!r})
from conversion.base import TextModel
TextModel.set_vocab = lambda self: None
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


def run(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert", required=True, help="llama.cpp's convert_hf_to_gguf.py")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    script = os.path.abspath(args.convert)
    with tempfile.TemporaryDirectory() as tmp:
        for name in FAMILIES:
            src = os.path.join(tmp, name)
            make(name, src)
            size = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
            theirs, ours = [], []
            for _ in range(args.repeat):
                out = os.path.join(tmp, "theirs.gguf")
                theirs.append(run(_THEIRS.format(root=os.path.dirname(script), src=src, out=out, script=script)))
                os.remove(out)
                out = os.path.join(tmp, "ours.gguf")
                ours.append(run(_OURS.format(src=src, out=out)))
                os.remove(out)
            t, o = statistics.median(theirs), statistics.median(ours)
            print(f"{name}: {size / 1e6:.0f} MB float32; convert_hf_to_gguf.py {t:.2f} s, lazyweights {o:.2f} s, "
                  f"{t / o:.2f}x")


if __name__ == "__main__":
    main()
