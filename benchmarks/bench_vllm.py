"""vLLM loader benchmark (issue 36): weight-loading seconds as vLLM reports them, and peak host memory, for vLLM's
default `safetensors` loader, `runai_streamer` (where `runai-model-streamer` is installed) and `--load-format
lazyweights`, on the same local folder. Medians of 3; each run is a fresh process (one in-process engine,
`VLLM_ENABLE_V1_MULTIPROCESSING=0`), contestants interleaved.

Run in an environment with vLLM (`pip install "lazyweights[vllm]"`; see .ci/run):

    python benchmarks/bench_vllm.py [--hidden 1024 --layers 8] [--reps 3]

The model is a random float32 Llama written with transformers' `save_pretrained` (hidden 1024, 8 layers,
intermediate 2816 by default: 120M parameters, 480 MB). "Loading weights took X seconds" is vLLM's own log line
(DefaultModelLoader) or ours (the same words, from lazyweights/tools/vllm.py); peak RSS is the process's
ru_maxrss, which includes vLLM's own imports and the KV cache (1 GiB, VLLM_CPU_KVCACHE_SPACE=1) and is the same
for every contestant but the weights' handling. TP=2 per-rank bytes over HTTP are measured by
tests/interop/test_vllm.py::test_tensor_parallel_2_over_http (nginx's access log).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import os, resource, sys, json
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
def main():
    from vllm import LLM
    llm = LLM(model=sys.argv[1], load_format=sys.argv[2], dtype="float32", max_model_len=128, enforce_eager=True,
              distributed_executor_backend="uni", gpu_memory_utilization=0.3)
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
if __name__ == "__main__":
    main()
"""


def make_model(folder: str, hidden: int, layers: int) -> None:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=int(hidden * 2.75), num_hidden_layers=layers,
                                   num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
                                   head_dim=64, vocab_size=32000, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    # vLLM needs a tokenizer only to start: a trivial byte-level one
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.add_tokens([chr(i) for i in range(256)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)


def run(folder: str, load_format: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, folder, load_format], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    m = re.search(r"Loading weights took ([0-9.]+) seconds", text)
    rss = re.search(r"PEAK_RSS_KB (\d+)", text)
    if proc.returncode or not m or not rss:
        return {"error": text[-2000:]}
    return {"seconds": float(m.group(1)), "peak_rss_mb": int(rss.group(1)) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    try:
        import runai_model_streamer  # noqa: F401

        loaders = ["safetensors", "runai_streamer", "lazyweights"]
    except ImportError:
        loaders = ["safetensors", "lazyweights"]
        print("runai_streamer: runai-model-streamer is not installed; skipped")
    with tempfile.TemporaryDirectory() as d:
        folder = os.path.join(d, "llama")
        make_model(folder, args.hidden, args.layers)
        size = os.path.getsize(os.path.join(folder, "model.safetensors"))
        print(f"model: {size / 1e6:.0f} MB float32 safetensors, hidden {args.hidden}, {args.layers} layers")
        results: dict[str, list] = {name: [] for name in loaders}
        for _ in range(args.reps):
            for name in loaders:
                results[name].append(run(folder, name))
        summary = {}
        for name, rs in results.items():
            ok = [r for r in rs if "error" not in r]
            if not ok:
                print(f"{name}: failed: {rs[0]['error'][-600:]}")
                continue
            summary[name] = {"seconds": statistics.median(r["seconds"] for r in ok),
                             "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in ok), "runs": len(ok)}
            print(f"{name:>15}: loading weights {summary[name]['seconds']:.2f} s (median of {len(ok)}), "
                  f"peak RSS {summary[name]['peak_rss_mb']:.0f} MB")
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
