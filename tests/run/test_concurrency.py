"""Concurrency: many threads reading, materializing, saving and allocating from one `Weights` at once.

Every test starts its threads together (a barrier), checks each result against a value computed once,
single-threaded, beforehand, and runs under a watchdog: if the threads are not done within WATCHDOG
seconds the test fails with every thread's stack (a deadlock shows where it waits) instead of hanging.

Threads x iterations per test (the numbers quoted in the README's Hardening table):
    test_data_and_to_numpy_from_many_threads          16 x 30  (safetensors and GGUF: 960 reads each)
    test_overlapping_plans_from_many_threads          12 x 6   (sync / threads / default threads, mixed: 72 plans)
    test_concurrent_saves_are_byte_identical            8 x 3   (24 saves of overlapping plans)
    test_allocate_and_allocated_weights_from_many_threads  16 x 40 (640 allocate + 640 allocated_weights)
    test_load_weights_from_many_threads                16 x 10  (160 loads of one file: one shared map)
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import lazyweights as lw

WATCHDOG = 120.0  # seconds: generous for a loaded 2-core CI machine; a deadlock never finishes
RNG = np.random.default_rng(99)
BF16 = ml_dtypes.bfloat16


def run_threads(n: int, fn, *, timeout: float = WATCHDOG) -> list:
    """Run fn(i) in n daemon threads started together; return the results; fail on error or deadlock."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list = []

    def body(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001
            errors.append((i, e, traceback.format_exc()))

    threads = [threading.Thread(target=body, args=(i,), daemon=True, name=f"lw-test-{i}") for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, timeout - (time.monotonic() - t0)))
    alive = [t for t in threads if t.is_alive()]
    if alive:
        frames = sys._current_frames()
        stacks = "\n".join(f"--- {t.name}\n" + "".join(traceback.format_stack(frames[t.ident]))
                           for t in alive if t.ident in frames)
        pytest.fail(f"{len(alive)} of {n} threads still running after {timeout} s (deadlock?):\n{stacks}")
    if errors:
        i, e, tb = errors[0]
        pytest.fail(f"{len(errors)} thread(s) failed; thread {i}: {type(e).__name__}: {e}\n{tb}")
    return results


@pytest.fixture(scope="module")
def st_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("conc")
    arrays = {
        **{f"layers.{i}.w": RNG.standard_normal((96, 64)).astype(BF16) for i in range(6)},
        "embed": RNG.standard_normal((200, 32)).astype(np.float32),
        "norm": RNG.standard_normal(64).astype(np.float16),
        "scale": np.asarray(0.25, np.float32),
    }
    save_file(arrays, str(d / "m.safetensors"))
    return str(d / "m.safetensors"), arrays


@pytest.fixture(scope="module")
def gguf_ckpt(tmp_path_factory):
    gguf = pytest.importorskip("gguf")
    path = str(tmp_path_factory.mktemp("concg") / "m.gguf")
    w = gguf.GGUFWriter(path, "llama")
    ref = {}
    for i in range(4):
        x = RNG.standard_normal((16, 256)).astype(np.float32)
        q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.q", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        ref[f"blk.{i}.q"] = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
        ref[f"blk.{i}.f"] = RNG.standard_normal((8, 32)).astype(np.float32)
        w.add_tensor(f"blk.{i}.f", ref[f"blk.{i}.f"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, ref


def _adapter(w):
    """An adapter whose outputs share sources and sub-chains (so concurrent plans overlap)."""
    out = {}
    for i in range(6):
        d = w[f"layers.{i}.w"].data()
        out[f"l{i}.f16"] = d.astype(lw.DType.float16)
        out[f"l{i}.T"] = d.T.astype(lw.DType.float32)
        out[f"l{i}.rows"] = d[[5, 1, 1, 90]]
    out["gate_up"] = lw.concat([w["layers.0.w"].data(), w["layers.1.w"].data()]).astype(lw.DType.float16)
    out["embed"] = w["embed"].data().astype(lw.DType.bfloat16)
    out["tied"] = w["embed"].data().astype(lw.DType.bfloat16)
    out["norm"] = w["norm"].data().astype(lw.DType.float32)
    out["scale"] = w["scale"].data()
    return out


def _expected(arrays):
    out = {}
    for i in range(6):
        a = arrays[f"layers.{i}.w"]
        out[f"l{i}.f16"] = a.astype(np.float16)
        out[f"l{i}.T"] = a.T.astype(np.float32)
        out[f"l{i}.rows"] = a[[5, 1, 1, 90]]
    out["gate_up"] = np.concatenate([arrays["layers.0.w"], arrays["layers.1.w"]]).astype(np.float16)
    out["embed"] = out["tied"] = arrays["embed"].astype(BF16)
    out["norm"] = arrays["norm"].astype(np.float32)
    out["scale"] = arrays["scale"]
    return out


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# --- reading -------------------------------------------------------------------------------------------------
def test_data_and_to_numpy_from_many_threads(st_ckpt, gguf_ckpt):
    """16 threads x 30 iterations of data()/to_numpy()/astype/dequantize on one shared Weights per format."""
    path, arrays = st_ckpt
    w = lw.load_weights(path)
    names = list(arrays)
    gpath, gref = gguf_ckpt
    g = lw.load_weights(gpath)
    gnames = list(gref)

    def work(i):
        rng = np.random.default_rng(i)
        for _ in range(30):
            n = names[rng.integers(len(names))]
            assert _same(w[n].data().to_numpy(), arrays[n]), n
            assert _same(w[n].data().astype(lw.DType.float32).to_numpy(), arrays[n].astype(np.float32)), n
            gn = gnames[rng.integers(len(gnames))]
            d = g[gn].data()
            got = d.dequantize().to_numpy() if d.quantization_encoding else d.to_numpy()
            assert _same(got, gref[gn]), gn
        return True

    assert all(run_threads(16, work))


def test_overlapping_plans_from_many_threads(st_ckpt):
    """12 threads x 6 plans each: overlapping subsets of one adapter's outputs, materialized with the sync
    scheduler, the threads scheduler (2 workers) and the default (threads, one per CPU), all at once."""
    path, arrays = st_ckpt
    w = lw.load_weights(path)
    adapted = _adapter(w)
    expected = _expected(arrays)
    names = sorted(adapted)
    kinds = [dict(scheduler="sync"), dict(scheduler="threads", workers=2), dict(), dict(block_bytes=512)]

    def work(i):
        rng = np.random.default_rng(100 + i)
        for it in range(6):
            subset = [n for n in names if rng.random() < 0.6] or names[:1]
            got = lw.plan({n: adapted[n] for n in subset}).materialize(**kinds[(i + it) % len(kinds)])
            for n in subset:
                assert _same(got[n], expected[n]), (n, kinds[(i + it) % len(kinds)])
        return True

    assert all(run_threads(12, work))


def test_concurrent_saves_are_byte_identical(st_ckpt, tmp_path):
    """8 threads x 3 saves of overlapping plans (safetensors, sharded, GGUF): every file equals the one a
    lone save writes."""
    path, _ = st_ckpt
    w = lw.load_weights(path)
    adapted = _adapter(w)
    plain = {n: v for n, v in adapted.items() if n != "scale"}
    single = tmp_path / "single"
    single.mkdir()
    plans = {
        "a.safetensors": lw.plan(adapted),
        "b.safetensors": lw.plan({n: adapted[n] for n in sorted(adapted)[::2]}),
        "c.gguf": lw.plan(plain),
    }
    # c.gguf holds bare tensors (no converter's metadata): a tensor container, saved with the opt-out
    extra = {"c.gguf": {"require_architecture": False}}
    ref = {}
    for name, p in plans.items():
        p.save(single / name, scheduler="sync", **extra.get(name, {}))
        ref[name] = (single / name).read_bytes()

    def work(i):
        d = tmp_path / f"t{i}"
        d.mkdir()
        for it, (name, p) in enumerate(plans.items()):
            p.save(d / name, scheduler=["threads", "sync"][(i + it) % 2], block_bytes=[None, 1024][i % 2],
                   **extra.get(name, {}))
            assert (d / name).read_bytes() == ref[name], (i, name)
        assert sorted(os.listdir(d)) == sorted(plans), os.listdir(d)  # no temporaries left behind
        return True

    assert all(run_threads(8, work))


# --- allocation --------------------------------------------------------------------------------------------------
def test_allocate_and_allocated_weights_from_many_threads(st_ckpt):
    """16 threads x 40 iterations, each allocating (overlapping names, the same dtype per name) and reading
    allocated_weights. Regression: allocated_weights iterated the shared dict while other threads inserted
    into it ('dictionary changed size during iteration') and could miss a just-allocated name (KeyError)."""
    path, arrays = st_ckpt
    w = lw.load_weights(path)
    names = [n for n in arrays if n.startswith("layers.")] + ["embed", "norm"]
    want = {n: lw.DType.float16 if i % 2 else lw.DType.float32 for i, n in enumerate(names)}

    def work(i):
        rng = np.random.default_rng(200 + i)
        for _ in range(40):
            n = names[rng.integers(len(names))]
            weight = w[n].allocate(want[n])
            assert weight.name == n and weight.dtype is want[n]
            got = w.allocated_weights
            assert n in got
            for k, v in got.items():
                assert _same(v, arrays[k].astype(want[k].to_numpy())), k
        return True

    assert all(run_threads(16, work))
    final = w.allocated_weights
    assert set(final) <= set(names)
    for k, v in final.items():
        assert _same(v, arrays[k].astype(want[k].to_numpy()))


def test_load_weights_from_many_threads(st_ckpt):
    """16 threads x 10 loads of the same file: one shared map (SourceFile cache under its lock), equal nodes."""
    path, arrays = st_ckpt
    keep = lw.load_weights(path)

    def work(i):
        files = set()
        for _ in range(10):
            w = lw.load_weights(path)
            files.add(id(w.records["embed"].file))
            assert w["embed"].data().node == keep["embed"].data().node
        return files

    ids = set().union(*run_threads(16, work))
    assert ids == {id(keep.records["embed"].file)}
