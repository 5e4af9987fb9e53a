"""Quantize throughput: lazyweights' encoders against ggml's `ggml_quantize_chunk`, both on one thread.

    python benchmarks/bench_quantize.py [--rows 512] [--cols 4096] [--repeat 3] [--types Q4_K,Q6_K]

For every type, without and with an importance matrix: MB/s of float32 input for lazyweights
(`quantize_into` into a preallocated, pre-touched output: ggml's C, compiled at install) and for ggml (llama-cpp-python's
libggml-base through ctypes, the call llama-quantize makes per chunk), the ratio lazyweights/ggml, and
whether the bytes are identical. Best of --repeat runs each, the two sides taking turns (so that on a
shared machine a busy spell slows both). Without llama_cpp installed only the lazyweights column is printed.

Input: standard normal float32 [rows, cols] (the search loops' cost barely depends on the values).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels" / "quant_fixtures"))

import make_fixtures as mf  # noqa: E402

from lazyweights.quant import implementation, quantize, quantize_into  # noqa: E402
from lazyweights.core.quantization import QuantizationEncoding as Q  # noqa: E402

ALL = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def best(fns, repeat: int) -> list[float]:
    """The best of `repeat` timings of each function, the functions taking turns in every round, so that on a
    shared machine a busy spell slows all of them rather than whichever happened to run then."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [min(ts) for ts in times]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--types", default=",".join(ALL))
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    imatrix = (rng.random(args.cols) + 0.05).astype(np.float32)
    mb = x.nbytes / 1e6
    have_ggml = mf.find_libggml_base() is not None
    kinds = sorted({implementation(t, "quantize") for t in args.types.split(",")})
    print(f"input float32 [{args.rows}, {args.cols}] = {mb:.1f} MB, best of {args.repeat}, one thread each;"
          f" lazyweights kernels: {', '.join(kinds)}; ggml: {mf.find_libggml_base() or 'not installed'}")
    print(f"{'type':8} {'imatrix':8} {'lazyweights MB/s':>17} {'ggml MB/s':>10} {'ratio':>6}  identical")
    for t in args.types.split(","):
        enc = Q[t]
        for w in (None, imatrix):
            out = quantize(t, x[:2], imatrix=w)  # first call outside the timer
            out = np.zeros((args.rows, args.cols // enc.block_elements * enc.block_bytes), np.uint8)
            fns = [lambda: quantize_into(t, x, out, imatrix=w)]
            if have_ggml:
                ref = np.zeros_like(out)
                mf.ggml_quantize(t, x, w, out=ref)  # also warms ggml's tables (ggml_quantize_init)
                fns.append(lambda: mf.ggml_quantize(t, x, w, out=ref))
            lw, *gg = best(fns, args.repeat)
            line = f"{t:8} {'yes' if w is not None else 'no':8} {mb / lw:17.1f}"
            if have_ggml:
                line += f" {mb / gg[0]:10.1f} {gg[0] / lw:6.2f}  {np.array_equal(ref, out)}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
