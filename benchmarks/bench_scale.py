#!/usr/bin/env python3
"""A DeepSeek-V3-shaped plan at scale: open, adapt and compile 90,427 tensors, locally or over HTTP (issue 35).

  python benchmarks/bench_scale.py [--dir DIR] [--reps 3] [--http] [--layers 3-4]
  python benchmarks/bench_scale.py --dir DIR --http --open-only [--as-is] [--before CHECKOUT] [--latency-ms MS]

Builds (or reuses, in DIR) a checkpoint with DeepSeek-V3's Hugging Face names and shapes, written as *sparse*
files: every safetensors header is real, then the file is `ftruncate`d to its full size, so the data are
holes (zeros) and the 158 shards (~680 GB apparent) take a few MB of disk. 61 layers (3 dense MLP, 58 MoE
with 256 routed experts + 1 shared expert and a sigmoid router with `e_score_correction_bias`), MLA attention,
float8_e4m3fn linear weights each with a float32 `weight_scale_inv` of 128x128 block scales, bf16 norms,
embedding and lm_head: 90,427 tensors, the count of deepseek-ai/DeepSeek-V3's `model.safetensors.index.json`
without its multi-token-prediction layer 61 (which adds 1,564 more). Plus that index and a `config.json`.

Each repetition runs in a fresh process and measures, one after the other:

- open: `load_weights(DIR)` (every header read and validated);
- adapter: `examples/deepseek_fp8.py`'s `convert_fp8_state_dict` (each FP8 weight dequantized to bf16 with its
  block scales expanded by two takes, `s[arange(N) // 128][:, arange(K) // 128]`; scales dropped);
- steps: `plan(adapted).steps()` (the fused, ordered, budgeted steps; nothing is read);

and prints seconds, microseconds per tensor (wall clock, and the process's CPU time, which a machine shared
with other work inflates less: time spent waiting for a core is not counted), RssAnon growth per tensor over
the three (what the plan holds, measured after the steps exist), the process's peak RSS, and the seconds
Python's cycle collector ran during the adapter (`gc.callbacks`: the adapter is user code, where the library
cannot pause it as it does for its open and its steps). Prints medians.

`--http` serves DIR with Debian's nginx on 127.0.0.1 and measures, each in a fresh process: the open over HTTP
(requests counted from nginx's access log, seconds), the adapter + steps over it (seconds, RssAnon per
node), and rank 0 of 8 (`lw.shard(..., rank=0, world_size=8)`) of the adapted layers `--layers` materialized:
bytes served (the log's `$body_bytes_sent`) and seconds.

Set PYTHONPATH to another checkout to measure it (the "before" figures in benchmarks/RESULTS.md: `git archive`
of the earlier commit, its compiled kernels copied in).

`--open-only` measures the open alone (`load_weights`, locally and, with `--http`, over nginx: requests, requests
per shard, bytes served, seconds); no adapter, steps or rank 0. `--as-is` opens DIR's checkpoint as it is (any
sharded folder with an index, W1 for instance) instead of writing the DeepSeek-shaped one there.
`--before CHECKOUT` runs each repetition twice, first with CHECKOUT on PYTHONPATH ("before"), then this
checkout ("after"), alternating, and prints both medians and their ratio (taken within the one run).
`--latency-ms MS` puts a proxy in front of nginx that holds each chunk a client sends (a request) MS
milliseconds before passing it on: a network's round trip, which loopback does not have.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")

# deepseek-ai/DeepSeek-V3 config.json (the fields the shapes come from)
CONFIG = dict(
    architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, first_k_dense_replace=3, n_routed_experts=256,
    n_shared_experts=1, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
    qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, vocab_size=129280, num_experts_per_tok=8,
    n_group=8, topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
    routed_scaling_factor=2.5, rms_norm_eps=1e-6, max_position_embeddings=163840, rope_theta=10000,
    num_nextn_predict_layers=1, torch_dtype="bfloat16", tie_word_embeddings=False,
    quantization_config=dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                             weight_block_size=[128, 128]))
SHARDS = 158
BLOCK = 128
CODE = {"bf16": ("BF16", 2), "f32": ("F32", 4), "fp8": ("F8_E4M3", 1)}


def deepseek_v3_tensors(cfg: dict = CONFIG) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype key, shape) for every tensor, in checkpoint order (layer by layer)."""
    H, A = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    out = [("model.embed_tokens.weight", "bf16", (cfg["vocab_size"], H))]

    def fp8(name, n, k):
        out.append((name + ".weight", "fp8", (n, k)))
        out.append((name + ".weight_scale_inv", "f32", (-(-n // BLOCK), -(-k // BLOCK))))

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", "bf16", (H,)))
        out.append((p + "post_attention_layernorm.weight", "bf16", (H,)))
        fp8(p + "self_attn.q_a_proj", cfg["q_lora_rank"], H)
        out.append((p + "self_attn.q_a_layernorm.weight", "bf16", (cfg["q_lora_rank"],)))
        fp8(p + "self_attn.q_b_proj", A * (nope + rope), cfg["q_lora_rank"])
        fp8(p + "self_attn.kv_a_proj_with_mqa", cfg["kv_lora_rank"] + rope, H)
        out.append((p + "self_attn.kv_a_layernorm.weight", "bf16", (cfg["kv_lora_rank"],)))
        fp8(p + "self_attn.kv_b_proj", A * (nope + v), cfg["kv_lora_rank"])
        fp8(p + "self_attn.o_proj", H, A * v)
        if i < cfg["first_k_dense_replace"]:
            I = cfg["intermediate_size"]
            fp8(p + "mlp.gate_proj", I, H)
            fp8(p + "mlp.up_proj", I, H)
            fp8(p + "mlp.down_proj", H, I)
            continue
        I = cfg["moe_intermediate_size"]
        out.append((p + "mlp.gate.weight", "bf16", (cfg["n_routed_experts"], H)))
        out.append((p + "mlp.gate.e_score_correction_bias", "f32", (cfg["n_routed_experts"],)))
        for e in [f"mlp.experts.{e}." for e in range(cfg["n_routed_experts"])] + ["mlp.shared_experts."]:
            width = I * (cfg["n_shared_experts"] if e.startswith("mlp.shared") else 1)
            fp8(p + e + "gate_proj", width, H)
            fp8(p + e + "up_proj", width, H)
            fp8(p + e + "down_proj", H, width)
    out.append(("model.norm.weight", "bf16", (H,)))
    out.append(("lm_head.weight", "bf16", (cfg["vocab_size"], H)))
    return out


def write_checkpoint(folder: str) -> dict:
    """Write the sparse checkpoint into `folder` (reused when its index is already there). Returns facts."""
    index_path = os.path.join(folder, "model.safetensors.index.json")
    tensors = deepseek_v3_tensors()
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        if len(index["weight_map"]) == len(tensors):
            return {"tensors": len(tensors), "shards": len(set(index["weight_map"].values())),
                    "apparent_bytes": index["metadata"]["total_size"]}
    os.makedirs(folder, exist_ok=True)
    sizes = [math.prod(shape) * CODE[dt][1] for _, dt, shape in tensors]
    total = sum(sizes)
    groups: list[list[int]] = [[] for _ in range(SHARDS)]
    start = 0
    for i, n in enumerate(sizes):  # a tensor goes to the shard its first byte falls in, by cumulative bytes
        groups[min(SHARDS - 1, start * SHARDS // total)].append(i)
        start += n
    groups = [g for g in groups if g]
    weight_map = {}
    for s, group in enumerate(groups):
        fname = f"model-{s + 1:05d}-of-{len(groups):06d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for i in group:
            name, dt, shape = tensors[i]
            header[name] = {"dtype": CODE[dt][0], "shape": list(shape), "data_offsets": [offset, offset + sizes[i]]}
            offset += sizes[i]
            weight_map[name] = fname
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(os.path.join(folder, fname), "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # the data: one hole
    with open(index_path, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    return {"tensors": len(tensors), "shards": len(groups), "apparent_bytes": total}


# --- contestants (each in a fresh process: `bench_scale.py --contestant NAME SOURCE`) --------------------------
def _rss() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "VmHWM:", "VmRSS:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def _adapter():
    import lazyweights  # noqa: F401  (first: examples/_common.py puts this checkout on sys.path otherwise)

    sys.path.insert(0, EXAMPLES)
    from deepseek_fp8 import convert_fp8_state_dict

    return convert_fp8_state_dict


def contestant(name: str, source: str, layers: str) -> dict:
    import gc

    if name == "open":  # the open alone (--open-only)
        import lazyweights as lw

        c0, t0 = time.process_time(), time.perf_counter()
        weights = lw.load_weights([source])
        c1, t1 = time.process_time(), time.perf_counter()
        return {"lazyweights": os.path.dirname(lw.__file__), "tensors": len(weights.records), "open_s": t1 - t0,
                "open_cpu_s": c1 - c0}
    convert = _adapter()
    import lazyweights as lw

    collector = {"s": 0.0, "since": 0.0}  # seconds in Python's cycle collector, from gc.callbacks

    def on_gc(phase, info):
        if phase == "start":
            collector["since"] = time.perf_counter()
        else:
            collector["s"] += time.perf_counter() - collector["since"]

    gc.callbacks.append(on_gc)
    base = _rss()["RssAnon"]
    c0, t0 = time.process_time(), time.perf_counter()
    weights = lw.load_weights([source])
    c1, t1 = time.process_time(), time.perf_counter()
    g1 = collector["s"]
    adapted = convert(dict(weights.items()))
    c2, t2 = time.process_time(), time.perf_counter()
    g2 = collector["s"]
    plan = lw.plan(adapted)
    steps = plan.steps()
    c3, t3 = time.process_time(), time.perf_counter()
    mem = _rss()
    n_tensors = len(weights.records)
    n_nodes = len(plan.nodes())
    out = {"lazyweights": os.path.dirname(lw.__file__), "tensors": n_tensors, "outputs": len(adapted),
           "nodes": n_nodes, "steps": len(steps), "open_s": t1 - t0, "adapter_s": t2 - t1, "steps_s": t3 - t2,
           "us_per_tensor": (t3 - t0) / n_tensors * 1e6, "open_cpu_s": c1 - c0, "adapter_cpu_s": c2 - c1,
           "steps_cpu_s": c3 - c2, "cpu_us_per_tensor": (c3 - c0) / n_tensors * 1e6,
           "anon_bytes": mem["RssAnon"] - base,
           "bytes_per_tensor": (mem["RssAnon"] - base) / n_tensors,
           "bytes_per_node": (mem["RssAnon"] - base) / n_nodes, "peak_rss": mem["VmHWM"],
           "adapter_gc_s": g2 - g1, "gc_s": collector["s"]}
    if name == "rank0":
        first, last = (int(x) for x in layers.split("-"))
        keep = tuple(f"model.layers.{i}." for i in range(first, last + 1))
        part = lw.shard({k: v for k, v in adapted.items() if k.startswith(keep)}, rank=0, world_size=8)
        log = os.environ.get("BENCH_SCALE_LOG")
        before = log_lines(log) if log else []
        t4 = time.perf_counter()
        arrays = lw.plan(part).materialize()
        out["rank0_s"] = time.perf_counter() - t4
        after = log_lines(log)[len(before):] if log else []
        out["rank0_served"] = sum(int(x[3]) for x in after if x[0] == "GET")
        out["rank0_requests"] = len(after)
        out["rank0_tensors"] = len(arrays)
        out["rank0_out_bytes"] = sum(a.nbytes for a in arrays.values())
        out["rank0_nonzero"] = int(sum(bool(a.view("uint8").any()) for a in arrays.values()))
    return out


# --- nginx: bench_remote.py's (the same server, config and access-log format) --------------------------------
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_remote import start_nginx, stop_nginx  # noqa: E402


def log_lines(log: str) -> list[list[str]]:
    with open(log) as f:
        return [line.split() for line in f if line.strip()]


# --- the driver ---------------------------------------------------------------------------------------------
def once(name: str, source: str, layers: str, timeout: float, pythonpath: str | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--contestant", name, source, "--layers", layers]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode:
        raise SystemExit(f"{name} failed:\n{r.stdout}\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], key: str):
    return statistics.median(r[key] for r in runs)


def report(title: str, runs: list[dict]) -> None:
    print(f"\n{title} (median of {len(runs)}; lazyweights from {runs[0]['lazyweights']})")
    print(f"  tensors {runs[0]['tensors']}, outputs {runs[0]['outputs']}, nodes {runs[0]['nodes']}, "
          f"steps {runs[0]['steps']}")
    for key, unit in [("open_s", "s"), ("adapter_s", "s"), ("adapter_gc_s", "s"), ("steps_s", "s"),
                      ("us_per_tensor", "us"), ("open_cpu_s", "s"), ("adapter_cpu_s", "s"), ("steps_cpu_s", "s"),
                      ("cpu_us_per_tensor", "us"),
                      ("bytes_per_tensor", "B"), ("bytes_per_node", "B"), ("anon_bytes", "B"), ("peak_rss", "B")]:
        vals = [r[key] for r in runs]
        fmt = (lambda x: f"{x:.2f}") if unit == "s" else (lambda x: f"{x:,.0f}")
        print(f"  {key:18s} {fmt(statistics.median(vals)):>16s} {unit}   runs: {', '.join(fmt(v) for v in vals)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="where the sparse checkpoint is (or is written); default: a temporary folder")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--http", action="store_true", help="also over HTTP from nginx on 127.0.0.1")
    ap.add_argument("--layers", default="3-4", help="layers (inclusive range) rank 0 of 8 materializes over HTTP")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--open-only", action="store_true", help="measure the open alone (load_weights)")
    ap.add_argument("--as-is", action="store_true", help="open DIR's sharded checkpoint as it is (do not write one)")
    ap.add_argument("--before", metavar="CHECKOUT", help="with --open-only: alternate runs of CHECKOUT (first on "
                                                         "PYTHONPATH) and this checkout, and print their ratio")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="with --open-only --http: add this much latency "
                                                                   "to each request (a proxy before nginx)")
    ap.add_argument("--contestant", nargs=2, metavar=("NAME", "SOURCE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.contestant:
        print(json.dumps(contestant(*args.contestant, args.layers)))
        return 0
    if args.as_is and not args.dir:
        ap.error("--as-is needs --dir")
    if args.open_only:
        return open_only(args)
    folder = args.dir or tempfile.mkdtemp(prefix="bench-scale-")
    try:
        t = time.perf_counter()
        facts = write_checkpoint(folder)
        used = sum(os.stat(os.path.join(folder, f)).st_blocks * 512 for f in os.listdir(folder))
        print(f"checkpoint {folder}: {facts['tensors']} tensors in {facts['shards']} shards, "
              f"{facts['apparent_bytes'] / 1e9:.1f} GB apparent, {used / 1e6:.1f} MB on disk "
              f"({time.perf_counter() - t:.1f} s)")
        runs = [once("local", folder, args.layers, args.timeout) for _ in range(args.reps)]
        report("local: open + deepseek_fp8 adapter + steps", runs)
        if args.http:
            proc, port, log = start_nginx(folder)
            try:
                url = f"http://127.0.0.1:{port}/model.safetensors.index.json"
                http_runs = []
                for _ in range(args.reps):
                    open(log, "w").close()
                    r = once("local", url, args.layers, args.timeout)
                    lines = log_lines(log)
                    r["requests"] = len(lines)
                    r["requests_per_shard"] = len(lines) / facts["shards"]
                    r["served_bytes"] = sum(int(x[3]) for x in lines if x[0] == "GET")
                    http_runs.append(r)
                report("HTTP (nginx on 127.0.0.1): open + adapter + steps", http_runs)
                for key in ("requests", "requests_per_shard", "served_bytes"):
                    print(f"  {key:18s} {_median(http_runs, key):>16,.1f}   runs: "
                          f"{', '.join(str(r[key]) for r in http_runs)}")
                rank_runs = []
                for _ in range(args.reps):
                    open(log, "w").close()
                    os.environ["BENCH_SCALE_LOG"] = log
                    rank_runs.append(once("rank0", url, args.layers, args.timeout))
                print(f"\nHTTP rank 0 of 8, layers {args.layers} materialized (median of {len(rank_runs)}; "
                      "bytes and requests of the materialize alone)")
                for key in ("rank0_s", "rank0_served", "rank0_requests", "rank0_tensors", "rank0_out_bytes",
                            "rank0_nonzero", "open_s"):
                    vals = [r[key] for r in rank_runs]
                    print(f"  {key:18s} {statistics.median(vals):>16,.2f}   runs: {', '.join(str(v) for v in vals)}")
            finally:
                stop_nginx(proc)
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def open_only(args) -> int:
    """`--open-only`: the open alone, locally and (with --http) over nginx, before and after when asked."""
    folder = args.dir or tempfile.mkdtemp(prefix="bench-scale-")
    try:
        if args.as_is:
            with open(os.path.join(folder, "model.safetensors.index.json")) as f:
                weight_map = json.load(f)["weight_map"]
            facts = {"tensors": len(weight_map), "shards": len(set(weight_map.values()))}
        else:
            facts = write_checkpoint(folder)
        print(f"checkpoint {folder}: {facts['tensors']} tensors in {facts['shards']} shards")
        who = [("before", args.before), ("after", None)] if args.before else [("this checkout", None)]
        # as an installed package is: compiled once (with PYTHONDONTWRITEBYTECODE set, as on the development VMs,
        # a checkout without fresh .pyc files would compile the modules the open imports inside its timer)
        for checkout in [os.path.dirname(HERE)] + ([args.before] if args.before else []):
            subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(checkout, "lazyweights")],
                           check=False, env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
        proc = port = log = proxy = None
        if args.http:
            proc, port, log = start_nginx(folder)
            if args.latency_ms:
                proxy, port = start_delay_proxy(port, args.latency_ms / 1000), None
                port = proxy.port
        try:
            for where in ["local"] + ([f"HTTP (+{args.latency_ms:g} ms a request)" if args.latency_ms else "HTTP"]
                                      if args.http else []):
                source = folder if where == "local" else f"http://127.0.0.1:{port}/model.safetensors.index.json"
                runs: dict[str, list[dict]] = {label: [] for label, _ in who}
                for _ in range(args.reps):
                    for label, path in who:  # alternated: before, after, before, ...
                        if log:
                            open(log, "w").close()
                        r = once("open", source, args.layers, args.timeout, pythonpath=path)
                        if where != "local":
                            time.sleep(0.2)  # nginx writes a request's log line after its reply
                            lines = log_lines(log)
                            r["requests"] = len(lines)
                            r["requests_per_shard"] = len(lines) / facts["shards"]
                            r["served_bytes"] = sum(int(x[3]) for x in lines if x[0] == "GET")
                        runs[label].append(r)
                print(f"\n{where}: open (load_weights) in a fresh process, median of {args.reps}")
                keys = ["open_s", "open_cpu_s"] + (["requests", "requests_per_shard", "served_bytes"]
                                                   if where != "local" else [])
                for label, _ in who:
                    print(f"  {label} (lazyweights from {runs[label][0]['lazyweights']})")
                    for key in keys:
                        vals = [r[key] for r in runs[label]]
                        print(f"    {key:18s} {statistics.median(vals):>14,.3f}   runs: "
                              f"{', '.join(f'{v:,.3f}' for v in vals)}")
                if args.before:
                    b, a = (statistics.median(r["open_s"] for r in runs[label]) for label in ("before", "after"))
                    print(f"  open_s after/before {a / b:.3f} ({b / a:.2f}x faster)")
        finally:
            if proxy is not None:
                proxy.stop()
            if proc is not None:
                stop_nginx(proc)
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def start_delay_proxy(target_port: int, delay: float):
    """A TCP proxy on 127.0.0.1 (`.port`, `.stop()`) in front of `target_port` that holds each chunk a client
    sends for `delay` seconds before passing it on (replies pass at once): one request, one round trip."""
    import asyncio
    import threading
    import types

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict = {}

    async def pump(reader, writer, hold: float):
        try:
            while data := await reader.read(1 << 16):
                if hold:
                    await asyncio.sleep(hold)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, server_w, delay), pump(server_r, client_w, 0.0))

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        box["port"] = server.sockets[0].getsockname()[1]
        ready.set()
        async with server:
            try:
                await server.serve_forever()
            except asyncio.CancelledError:  # stop()
                pass

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    ready.wait(10)

    def stop():
        for task in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(5)

    return types.SimpleNamespace(port=box["port"], stop=stop)


if __name__ == "__main__":
    sys.exit(main())
