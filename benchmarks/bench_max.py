#!/usr/bin/env python3
"""W1 inside MAX: `as_max_adapter(lazyweights.tools.demo.convert_safetensor_state_dict)` against MAX's own eager adapter, in one run.

    /work/maxenv/bin/python benchmarks/bench_max.py /work/ckpt/w1_2g [--reps 3] [--routes private,paths,buffers]

Each measurement runs in a fresh subprocess (after a `sync`) and does what a MAX pipeline does:
`load_weights(shards)`, then `adapter(dict(weights.items()), huggingface_config=..., pipeline_config=...)`,
then touches every output byte through `Buffer.from_dlpack` (so both sides pay for their outputs). The
MAX side is /work/shared/bench/baseline_max.py's adapter (casts with `WeightData.astype`, RoPE permute in
numpy on a uint16 view). Timing stops there; then each child hashes every output (name, MAX dtype, shape,
sha256 of the bytes) and the parent checks the lazyweights outputs are byte-identical to MAX's.
Routes: how `as_max_adapter` re-opens MAX's accessors ("private": MAX's `_filepaths`, the default when no
pipeline_config is passed; "paths": a pipeline_config's `model.resolved_weight_paths()`; "buffers":
MAX's own mapped Buffers as zero-copy constants).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve()
BENCH = Path(os.environ.get("LW_SHARED_BENCH", HERE.parents[2] / "shared" / "bench"))
if not BENCH.exists():
    BENCH = Path("/work/shared/bench")


def child(kind: str, ckpt: str, out_json: str) -> None:
    import numpy as np
    from max.driver import Buffer
    from max.dtype import DType
    from max.graph.weights import load_weights

    sys.path.insert(0, str(BENCH))
    from memwatch import PeakMem

    cfg_dict = json.load(open(os.path.join(ckpt, "config.json")))
    cfg = types.SimpleNamespace(**cfg_dict)
    shards = [Path(p) for p in sorted(glob.glob(os.path.join(ckpt, "*.safetensors")))]

    if kind == "max":
        from baseline_max import adapter as max_eager  # MAX's own W1 adapter, exactly as the baseline runs it

        def adapter(state_dict, huggingface_config=None, **_):
            return max_eager(state_dict, vars(huggingface_config))
        pipeline_config = None
    else:
        from lazyweights.tools import demo as w1
        from lazyweights.interop.max import as_max_adapter

        route = kind.split(":")[1]
        adapter = as_max_adapter(w1.convert_safetensor_state_dict, reopen="auto" if route == "paths" else route)
        pipeline_config = None
        if route == "paths":
            pipeline_config = types.SimpleNamespace(model=types.SimpleNamespace(
                resolved_weight_paths=lambda: shards, header_only_weights=False))

    t0 = time.perf_counter()
    with PeakMem() as pm:
        weights = load_weights(shards)
        sd = adapter(dict(weights.items()), huggingface_config=cfg, pipeline_config=pipeline_config)
        chk = 0
        for v in sd.values():
            buf = Buffer.from_dlpack(v.data)
            a = np.from_dlpack(buf.view(DType.uint8, [buf.num_elements * buf.element_size]))
            chk += int(a[:: max(1, a.nbytes // 64)].sum())
    seconds = time.perf_counter() - t0
    digests = {}
    for name, v in sd.items():
        buf = Buffer.from_dlpack(v.data)
        a = np.from_dlpack(buf.view(DType.uint8, [buf.num_elements * buf.element_size]))
        digests[name] = [str(v.dtype), [int(d) for d in v.shape], str(v.quantization_encoding),
                         hashlib.sha256(a).hexdigest()]
    route = getattr(adapter, "last_route", None)
    json.dump({"seconds": seconds, "peak_anon": pm.peak_anon, "n": len(sd), "route": route,
               "digests": digests}, open(out_json, "w"))


def run(kind: str, ckpt: str, tmp: str) -> dict:
    subprocess.run(["sync"])
    out = os.path.join(tmp, kind.replace(":", "_") + ".json")
    subprocess.run([sys.executable, __file__, "--child", kind, ckpt, out], check=True)
    return json.load(open(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", nargs="?")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--routes", default="private,paths,buffers")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "CKPT", "OUT"))
    args, _ = ap.parse_known_args()
    if args.child:
        return child(*args.child)
    import tempfile

    import max as _max_pkg  # noqa: F401 - fail early without MAX
    kinds = ["max"] + [f"lazy:{r}" for r in args.routes.split(",")]
    times = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        run("max", args.ckpt, tmp)  # warm-up: MAX compiles its cast graphs once (cached afterwards)
        reference = None
        for rep in range(args.reps):
            line = []
            for k in kinds:
                r = run(k, args.ckpt, tmp)
                times[k].append(r["seconds"])
                if k == "max":
                    reference = r["digests"]
                    ident = ""
                else:
                    same = r["digests"] == reference and list(r["digests"]) == list(reference)
                    ident = f", {'identical' if same else 'DIFFERENT'} {r['n']}/{len(reference)}"
                    if not same:
                        bad = [n for n in reference if r["digests"].get(n) != reference[n]]
                        print("  differing:", bad[:5], file=sys.stderr)
                route = f" [{r['route']}]" if r.get("route") else ""
                line.append(f"{k}{route} {r['seconds']:.2f}s (peak RssAnon {r['peak_anon']/1e9:.2f} GB{ident})")
            print(f"rep {rep + 1}: " + "; ".join(line), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("medians: " + ", ".join(f"{k} {v:.2f}s" for k, v in med.items()))
    print("MAX / lazyweights: " + ", ".join(f"{k} {med['max'] / med[k]:.1f}x" for k in kinds if k != "max"))


if __name__ == "__main__":
    main()
