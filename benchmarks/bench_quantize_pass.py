#!/usr/bin/env python3
"""HF bf16 folder -> quantized GGUF: lazyweights' one pass against llama.cpp's two steps, in one run.

  python benchmarks/bench_quantize_pass.py HF_DIR [--presets Q4_K_M,Q8_0] [--threads 2] [--reps 1]
                                           [--scratch DIR] [--budget 256MB] [--arch LlamaForCausalLM]

one pass    `lazyweights convert ARCH HF_DIR -o out.gguf --quant PRESET`: read bf16, cast, quantize and write
            in one streaming pass (threads = the scheduler's workers).
two steps   step 1: HF -> bf16 GGUF (`lazyweights convert`, since llama.cpp's convert_hf_to_gguf.py is not in
            the pip package; it is faster than that script, which favours the two-step side), then step 2:
            llama.cpp's `llama_model_quantize` (llama-cpp-python) with the same thread count.

Each run is a fresh subprocess; its wall time and peak RssAnon (private memory, sampled from /proc every
20 ms; mmap'd file pages excluded) are reported, with `sync` before each run so none pays for another's
writeback. The two outputs must be equal tensor for tensor (types and bytes), or the script says where not.
A folder without tokenizer files is converted with --no-tokenizer; a config.json lacking
max_position_embeddings (the shared synthetic checkpoint) is given 2048 in a scratch copy.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

QUANTIZE = r"""
import ctypes, sys, llama_cpp
src, dst, preset, threads = sys.argv[1:5]
params = llama_cpp.llama_model_quantize_default_params()
params.nthread = int(threads)
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + preset)
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
sys.exit(rc)
"""


def measured(cmd, env=None):
    """(wall seconds, peak RssAnon bytes) of a subprocess."""
    subprocess.run(["sync"], check=True)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-3000:]}")
    return wall, peak


def prepared(hf_dir, scratch):
    """The folder as the converter needs it (a scratch copy with symlinked shards if config.json is patched)."""
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    if "max_position_embeddings" in cfg:
        return hf_dir
    out = os.path.join(scratch, "hf")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(hf_dir):
        if f != "config.json" and not os.path.exists(os.path.join(out, f)):
            os.symlink(os.path.abspath(os.path.join(hf_dir, f)), os.path.join(out, f))
    cfg["max_position_embeddings"] = 2048
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    return out


def tensors(path):
    from gguf import GGUFReader

    return {t.name: (t.tensor_type.name, t.data) for t in GGUFReader(path).tensors}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--presets", default="Q4_K_M,Q8_0")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--budget", default="256MB")
    ap.add_argument("--arch", default=None)
    a = ap.parse_args()
    scratch = a.scratch or tempfile.mkdtemp(prefix="lw-qpass-")
    os.makedirs(scratch, exist_ok=True)
    hf = prepared(a.hf_dir, scratch)
    arch = a.arch or json.load(open(os.path.join(hf, "config.json")))["architectures"][0]
    tok = [] if any(os.path.exists(os.path.join(hf, f)) for f in ("tokenizer.json", "tokenizer.model")) else ["--no-tokenizer"]
    lw = [sys.executable, "-m", "lazyweights", "convert", arch, hf, "--no-progress", "--budget", a.budget,
          "--workers", str(a.threads)] + tok
    env = None
    size = sum(os.path.getsize(os.path.join(hf, f)) for f in os.listdir(hf) if f.endswith(".safetensors"))
    print(f"{a.hf_dir}: {size / 1e9:.2f} GB of safetensors, {a.threads} threads, budget {a.budget}, reps {a.reps}")
    print(f"{'preset':8} {'one pass s':>10} {'peak':>9} | {'step1 s':>8} {'step2 s':>8} {'total s':>8} {'peak':>9} | "
          f"{'speedup':>7} identical")
    for preset in a.presets.split(","):
        one, two1, two2, pk1, pk2 = [], [], [], 0, 0
        bf16, ref, ours = (os.path.join(scratch, n) for n in ("bf16.gguf", f"ref-{preset}.gguf", f"ours-{preset}.gguf"))
        for _ in range(a.reps):
            for f in (bf16, ref, ours):
                if os.path.exists(f):
                    os.unlink(f)
            w, p = measured(lw + ["-o", ours, "--quant", preset], env)
            one.append(w); pk1 = max(pk1, p)
            w1, p1 = measured(lw + ["-o", bf16], env)
            w2, p2 = measured([sys.executable, "-c", QUANTIZE, bf16, ref, preset, str(a.threads)])
            two1.append(w1); two2.append(w2); pk2 = max(pk2, p1, p2)
        r, o = tensors(ref), tensors(ours)
        differ = [n for n in r if n not in o or r[n][0] != o[n][0] or r[n][1].tobytes() != o[n][1].tobytes()]
        m1, s1, s2 = statistics.median(one), statistics.median(two1), statistics.median(two2)
        print(f"{preset:8} {m1:10.2f} {pk1 / 2**20:7.0f}MB | {s1:8.2f} {s2:8.2f} {s1 + s2:8.2f} {pk2 / 2**20:7.0f}MB | "
              f"{(s1 + s2) / m1:6.2f}x {'yes' if not differ else f'NO: {len(differ)} of {len(r)} differ, e.g. {differ[:3]}'}"
              f" ({len(r)} tensors)")
    if not a.scratch:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
