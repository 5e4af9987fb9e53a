"""Laziness on a multi-GB checkpoint: opening reads headers only, building an adapter reads nothing, and
materializing one tensor touches only that tensor's pages.

The checkpoint has the shared benchmark's layout and default TinyLlama-1.1B shape (tests/conftest.py's
`llama_checkpoint`, byte for byte what `../shared/bench/make_ckpt.py` writes: 2.2 GB of bf16 in 3 shards),
written once per session into pytest's temp dir and removed afterwards. The W1 adapter is the benchmark's
`workload.py`, restated below (`Workload`) and written with WeightData ops.

Page residency is measured with `mincore(2)` (through ctypes, `_page_cache.py`) on a fresh map of the file after the
file was dropped from the page cache with `posix_fadvise(POSIX_FADV_DONTNEED)`; that part runs in a
subprocess, so nothing this test process touched earlier stays mapped.
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import lazyweights as lw
from lazyweights import DType, load_weights

MB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Workload:
    """The benchmark's W1 definition (../shared/bench/workload.py), restated here as the reference the lazy
    adapter is judged against; deliberately not lazyweights.tools.demo's, the package's own version."""

    @staticmethod
    def adapt_name(k):
        if k.endswith((".k_scale", ".v_scale")):
            return None
        return k.replace("model.", "", 1).replace("self_attn.", "attention.")

    @staticmethod
    def rope_perm(hd):
        return np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])

    @staticmethod
    def target_dtype(name):
        return np.float32 if "norm" in name else np.float16


def _load_workload():
    return Workload


@pytest.fixture(scope="session")
def big_checkpoint(tmp_path_factory, llama_checkpoint):
    """The default benchmark checkpoint (2.2 GB, 3 shards), generated once per session."""
    if shutil.disk_usage(tmp_path_factory.getbasetemp()).free < 8 * (1 << 30):
        pytest.skip("needs ~8 GB of free disk for the 2.2 GB checkpoint")
    out = tmp_path_factory.mktemp("bench_ckpt") / "tinyllama"
    t0 = time.perf_counter()
    llama_checkpoint(out)
    gen_s = time.perf_counter() - t0
    shards = sorted(out.glob("*.safetensors"))
    total = sum(p.stat().st_size for p in shards)
    assert total > 2 * (1 << 30) and len(shards) == 3
    yield types_ns(path=out, shards=shards, total=total, gen_s=gen_s,
                   config=json.loads((out / "config.json").read_text()),
                   index=json.loads((out / "model.safetensors.index.json").read_text()))
    shutil.rmtree(out, ignore_errors=True)


def types_ns(**kw):
    import types

    return types.SimpleNamespace(**kw)


# --- the W1 adapter with WeightData ops ----------------------------------------------------------------------
def w1_adapter(weights, config, workload):
    """workload.py's transformations, lazily: rename, drop k/v scales, RoPE-permute q/k rows within each
    head, cast norms to float32 and everything else to float16."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config["hidden_size"] // heads
    perm = workload.rope_perm(hd)
    out = {}
    for name, acc in weights.items():
        new = workload.adapt_name(name)
        if new is None:
            continue
        w = acc.data()
        if new.endswith(("q_proj.weight", "k_proj.weight")):
            h = heads if new.endswith("q_proj.weight") else kv_heads
            w = w.reshape(h, hd, -1)[:, perm, :].reshape(h * hd, -1)
        out[new] = w.astype(DType.from_numpy(workload.target_dtype(new)))
    return out


# --- (a) load_weights reads headers only ---------------------------------------------------------------------
def test_load_weights_reads_headers_only(big_checkpoint):
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    weights = load_weights(big_checkpoint.path)
    elapsed = time.perf_counter() - t0
    grown = rss_bytes() - before
    names = [n for n, _ in weights.items()]
    assert len(names) == len(big_checkpoint.index["weight_map"]) == 1 + 22 * 9 + 2
    assert grown < 8 * MB, f"RSS grew by {grown / MB:.1f} MB opening a {big_checkpoint.total / 1e9:.1f} GB checkpoint"
    assert elapsed < 1.0, f"load_weights took {elapsed:.2f} s"
    # the same for the shard list and the index file
    for arg in (big_checkpoint.shards, big_checkpoint.path / "model.safetensors.index.json"):
        t0 = time.perf_counter()
        assert len(list(load_weights(arg).items())) == len(names)
        assert time.perf_counter() - t0 < 1.0


# --- (b) building the whole adapter reads no tensor bytes --------------------------------------------------
def test_building_w1_adapter_reads_nothing(big_checkpoint, monkeypatch):
    from lazyweights.formats.source import SourceFile, TensorRecord

    workload = _load_workload()
    weights = load_weights(big_checkpoint.path)
    calls = []
    for cls, meth in ((SourceFile, "view"), (SourceFile, "read"), (TensorRecord, "array")):
        orig = getattr(cls, meth)

        def spy(self, *a, _orig=orig, _m=meth, **k):
            calls.append(_m)
            return _orig(self, *a, **k)

        monkeypatch.setattr(cls, meth, spy)
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    adapted = w1_adapter(weights, big_checkpoint.config, workload)
    plan = lw.plan(adapted)
    nodes = plan.nodes()
    elapsed = time.perf_counter() - t0
    assert calls == [], f"building the adapter touched the checkpoint's maps: {calls[:5]}"
    # Printing the plan may build (page-less) views of the maps to plan its steps, but must read nothing.
    text = plan.explain() if hasattr(plan, "explain") else ""
    grown = rss_bytes() - before
    assert grown < 8 * MB, f"RSS grew by {grown / MB:.1f} MB building and printing the adapter's plan"
    assert elapsed < 5.0
    # the adapter is what workload.py says: 22 layers x 7 matrices/norms + embed, norm, lm_head
    assert len(adapted) == 22 * 9 + 3
    assert adapted["layers.3.attention.q_proj.weight"].dtype is DType.float16
    assert adapted["layers.3.input_layernorm.weight"].dtype is DType.float32
    assert sum(1 for n in nodes if n.op == "source") == len(adapted)
    assert isinstance(text, str)


def test_materializing_one_adapted_tensor_is_correct(big_checkpoint):
    """A spot check that the lazy W1 result equals the eager numpy computation (bench baseline style)."""
    from safetensors import safe_open

    workload = _load_workload()
    cfg = big_checkpoint.config
    adapted = w1_adapter(load_weights(big_checkpoint.path), cfg, workload)
    name = "model.layers.7.self_attn.k_proj.weight"
    shard = big_checkpoint.path / big_checkpoint.index["weight_map"][name]
    with safe_open(str(shard), framework="numpy") as fh:
        ref = fh.get_tensor(name)
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"]
    expected = ref.reshape(kv, hd, -1)[:, workload.rope_perm(hd), :].reshape(kv * hd, -1).astype(np.float16)
    got = adapted["layers.7.attention.k_proj.weight"].to_numpy()
    assert got.dtype == np.float16 and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint16), expected.view(np.uint16))


# --- (c) materializing one tensor touches only its pages ---------------------------------------------------
RESIDENCY_SCRIPT = textwrap.dedent(r"""
    import json, os, sys
    import numpy as np
    import lazyweights as lw
    from lazyweights import DType
    ckpt, shard_name, mode, helpers = sys.argv[1:5]
    sys.path.insert(0, helpers)
    from _page_cache import PAGE, drop_from_cache, resident_pages
    shard = os.path.join(ckpt, shard_name)
    # where each tensor of this shard lives (from the header); the target is the mlp.down_proj.weight
    # nearest the middle of the shard, so other tensors lie on both sides of it
    with open(shard, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    regions = {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in header.items()}
    size = os.path.getsize(shard)
    target = min((k for k in regions if k.endswith("mlp.down_proj.weight")),
                 key=lambda k: abs(regions[k][0] - size / 2))
    weights = lw.load_weights(ckpt)              # headers read; their pages may stay cached
    drop_from_cache(shard)
    before = resident_pages(shard)
    data = weights[target].data()
    if mode == "cast":
        arr = data.astype(DType.float32).to_numpy()
    elif mode == "plan":
        arr = lw.plan({"t": data.astype(DType.float16)}).materialize()["t"]
    else:  # a zero-copy view: reading it is the caller's doing
        arr = data.to_numpy(); float(np.asarray(arr, dtype=np.float32).sum())
    after = resident_pages(shard)
    # pages another process (e.g. the pytest process that ran earlier tests) keeps mapped cannot be
    # dropped; only pages that became resident here count
    print(json.dumps({"before": np.flatnonzero(before).tolist(), "page": PAGE, "regions": regions, "target": target,
                      "resident": np.flatnonzero(after & ~before).tolist(), "header_end": 8 + n}))
""")


def readahead_bytes(path: Path) -> int:
    """The kernel's readahead window for the device holding `path` (read_ahead_kb), 128 KB if unknown."""
    dev = os.stat(path).st_dev
    base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for cand in (base / "queue" / "read_ahead_kb", base.parent / "queue" / "read_ahead_kb" if base.exists() else None):
        try:
            return int(cand.read_text()) * 1024
        except (OSError, ValueError, AttributeError):
            continue
    return 128 * 1024


@pytest.mark.parametrize("mode", ["cast", "plan"])
def test_materializing_one_tensor_touches_only_its_pages(big_checkpoint, tmp_path, mode, child_env):
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("needs posix_fadvise")
    shard = big_checkpoint.shards[0]  # 1 GB
    script = tmp_path / "residency.py"
    script.write_text(RESIDENCY_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(big_checkpoint.path), shard.name, mode,
                           str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300, env=child_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    page, target = r["page"], r["target"]
    start, end = r["regions"][target]
    # Page faults on a map read ahead (and around) by up to the device's read_ahead_kb (8 MB on the
    # development machines); two blocks in flight can each do so. Anything further away is a stray read.
    slack = max(4 * MB, 2 * readahead_bytes(shard))
    assert end - start >= 16 * MB and start > slack and end + slack < shard.stat().st_size
    resident = np.array(r["resident"], dtype=np.int64) * page
    inside = (resident >= start - page) & (resident < end)
    near = (resident >= start - slack) & (resident < end + slack)
    header = resident < r["header_end"] + page
    stray = resident[~near & ~header]
    target_pages = (end - start + page - 1) // page
    before = np.array(r["before"], dtype=np.int64) * page
    assert not ((before >= start) & (before < end)).any(), "the target was not dropped from the page cache"
    assert inside.sum() >= 0.9 * target_pages, f"only {inside.sum()} of {target_pages} target pages resident"
    stray_tensors = sorted({k for k, (a, b) in r["regions"].items() for off in stray[:2000] if a <= off < b})
    assert stray.size == 0, (f"{stray.size} pages ({stray.size * page / MB:.1f} MB) outside {target} "
                             f"(+{slack // MB} MB readahead slack) are resident, in: {stray_tensors[:5]}")
    # and the other tensors of the shard are (nearly) untouched: at most the slack on either side
    others = sum(1 for off in resident if not (start <= off < end) and off >= r["header_end"] + page)
    assert others * page <= 2 * slack
