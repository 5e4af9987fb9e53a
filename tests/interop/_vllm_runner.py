"""Run vLLM engines in one process and write what each generated (tests/interop/test_vllm.py, benchmarks/bench_vllm.py).

`python _vllm_runner.py RUNS.json OUT.json`: RUNS maps a key to `LLM(...)` keyword arguments. Each engine runs in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the `uni` executor) unless it asks for tensor_parallel_size > 1,
so one process start (about 30 s of imports on the 2-core VM) serves many engines. For each key OUT holds the
greedy token ids and top-5 logprobs of PROMPTS, the weight-loading seconds the loader reported, or the error
(`{"error": type name, "message": ...}`) when the engine did not start or failed to generate (then only the
tests that use that engine fail, each naming the error).
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time

PROMPTS = ["The quick brown fox", "def f(x): return", "Café naïve résumé", "1234 5678"]


def run_one(kw: dict) -> dict:
    from vllm import LLM, SamplingParams

    kw = dict(dict(dtype="float32", max_model_len=128, enforce_eager=True, seed=0, gpu_memory_utilization=0.3), **kw)
    if kw.get("tensor_parallel_size", 1) == 1:
        kw.setdefault("distributed_executor_backend", "uni")
    t = time.perf_counter()
    try:
        llm = LLM(**kw)
    except Exception as e:  # noqa: BLE001 (reported to the test, which checks the type and message)
        chain, cur = [], e
        while cur is not None:
            chain.append({"error": type(cur).__name__, "message": str(cur)})
            cur = cur.__cause__ or cur.__context__
        return {"error": chain[0]["error"], "message": chain[0]["message"], "chain": chain}
    start = time.perf_counter() - t
    try:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, logprobs=5))
        res = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
               "logprobs": [[{str(k): v.logprob for k, v in lp.items()} for lp in o.outputs[0].logprobs]
                            for o in outs],
               "start_seconds": start}
    except Exception as e:  # noqa: BLE001 (this engine's failure is its own test's, not every other engine's)
        res = {"error": type(e).__name__, "message": f"generating: {e}"[-2000:], "chain": []}
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001
        pass
    del llm
    gc.collect()
    return res


def main() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    runs = json.load(open(sys.argv[1]))
    if all(kw.get("tensor_parallel_size", 1) == 1 for kw in runs.values()):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    out = {key: run_one(kw) for key, kw in runs.items()}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
