"""The scheduler: one contract every executor passes, plan structure, saving, budgets and faults."""
import errno
import json
import os
import subprocess
import sys
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import lazyweights as lw
from lazyweights.compiler.steps import compile_steps
from lazyweights.core.units import format_bytes, parse_size
from lazyweights.run.materialize import materialize

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(1234)


def rope_perm(hd):
    return np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A small Llama-shaped bf16 checkpoint in two shards, plus odd tensors for edge cases."""
    d = tmp_path_factory.mktemp("ckpt")
    H, A, K, I = 64, 4, 2, 96
    hd = H // A
    shard1 = {
        "model.embed_tokens.weight": RNG.standard_normal((50, H)).astype(BF16),
        "model.layers.0.self_attn.q_proj.weight": RNG.standard_normal((A * hd, H)).astype(BF16),
        "model.layers.0.self_attn.k_proj.weight": RNG.standard_normal((K * hd, H)).astype(BF16),
        "model.layers.0.self_attn.k_scale": np.asarray(0.5, np.float32),
        "model.layers.0.input_layernorm.weight": RNG.standard_normal(H).astype(BF16),
    }
    shard2 = {
        "model.layers.0.mlp.gate_proj.weight": RNG.standard_normal((I, H)).astype(BF16),
        "model.layers.0.mlp.up_proj.weight": RNG.standard_normal((I, H)).astype(BF16),
        "model.layers.0.mlp.down_proj.weight": RNG.standard_normal((H, I)).astype(BF16),
        "model.norm.weight": RNG.standard_normal(H).astype(BF16),
        "f32.matrix": RNG.standard_normal((33, 17)).astype(np.float32),
        "f8.matrix": RNG.standard_normal((16, 8)).astype(ml_dtypes.float8_e4m3fn),
        "empty": np.zeros((0, 4), np.float32),
    }
    save_file(shard1, str(d / "a.safetensors"))
    save_file(shard2, str(d / "b.safetensors"))
    return d, {**shard1, **shard2}, dict(H=H, A=A, K=K, hd=hd)


def adapters(weights, cfg):
    """Many chains at once: the W1 transformations and every op kind."""
    hd, perm = cfg["hd"], rope_perm(cfg["hd"])
    out = {}
    for name, w in weights.items():
        if name.endswith("_scale"):
            continue
        d = w.data()
        new = name.replace("model.", "").replace("self_attn.", "attention.")
        if new.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["A"] if "q_proj" in new else cfg["K"]
            d = d.reshape(heads, hd, -1)[:, perm, :].reshape(heads * hd, -1)
        if d.dtype == lw.DType.bfloat16:
            d = d.astype(lw.DType.float32 if "norm" in new else lw.DType.float16)
        out[new] = d
    w = weights
    gate, up = w["model.layers.0.mlp.gate_proj.weight"].data(), w["model.layers.0.mlp.up_proj.weight"].data()
    out["fused.gate_up"] = lw.concat([gate, up], axis=0).astype(lw.DType.float16)
    out["fused.stack"] = lw.stack([gate, up], axis=1).T
    q, k = lw.split(lw.concat([gate, up]), [100, 92])
    out["split.q"], out["split.k"] = q.astype(lw.DType.float32), k
    out["transposed"] = w["f32.matrix"].data().T
    out["transposed_cast"] = w["f32.matrix"].data().T.astype(lw.DType.bfloat16)
    out["strided"] = w["f32.matrix"].data()[1:30:3, ::-2]
    out["gathered_rows"] = w["f32.matrix"].data()[[5, 1, 1, 32, 0]].astype(lw.DType.float8_e5m2)
    out["bitcast"] = w["model.norm.weight"].data().view(lw.DType.uint16)
    out["bitcast_wide"] = w["f32.matrix"].data()[:, :16].view(lw.DType.float64)
    out["fp8_up"] = w["f8.matrix"].data().astype(lw.DType.bfloat16)
    out["scalar"] = w["model.layers.0.self_attn.k_scale"].data().astype(lw.DType.float16)
    out["scalar_reshaped"] = w["model.layers.0.self_attn.k_scale"].data().reshape(1, 1)
    out["flat"] = w["model.layers.0.mlp.down_proj.weight"].data().reshape(-1).astype(lw.DType.float32)
    out["reshape_odd"] = w["f32.matrix"].data().reshape(17, 33)
    out["empty_cast"] = w["empty"].data().astype(lw.DType.float16)
    const = RNG.standard_normal((7, 3)).astype(np.float32)
    out["const"] = lw.WeightData.from_numpy(const, "c").astype(lw.DType.bfloat16)
    out["tied_a"] = out["tied_b"] = w["model.embed_tokens.weight"].data().astype(lw.DType.float16)
    return out


def numpy_reference(arrays, cfg):
    """The same outputs computed eagerly with numpy/ml_dtypes from the arrays the test wrote."""
    hd, perm = cfg["hd"], rope_perm(cfg["hd"])
    out = {}
    for name, a in arrays.items():
        if name.endswith("_scale"):
            continue
        new = name.replace("model.", "").replace("self_attn.", "attention.")
        if new.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["A"] if "q_proj" in new else cfg["K"]
            a = a.reshape(heads, hd, -1)[:, perm, :].reshape(heads * hd, -1)
        if a.dtype == BF16:
            a = a.astype(np.float32 if "norm" in new else np.float16)
        out[new] = a
    g, u = arrays["model.layers.0.mlp.gate_proj.weight"], arrays["model.layers.0.mlp.up_proj.weight"]
    out["fused.gate_up"] = np.concatenate([g, u]).astype(np.float16)
    out["fused.stack"] = np.stack([g, u], axis=1).T
    gu = np.concatenate([g, u])
    out["split.q"], out["split.k"] = gu[:100].astype(np.float32), gu[100:]
    m = arrays["f32.matrix"]
    out["transposed"] = m.T
    out["transposed_cast"] = m.T.astype(BF16)
    out["strided"] = m[1:30:3, ::-2]
    out["gathered_rows"] = m[[5, 1, 1, 32, 0]].astype(ml_dtypes.float8_e5m2)
    out["bitcast"] = arrays["model.norm.weight"].view(np.uint16)
    out["bitcast_wide"] = np.ascontiguousarray(m[:, :16]).view(np.float64)
    out["fp8_up"] = arrays["f8.matrix"].astype(BF16)
    out["scalar"] = arrays["model.layers.0.self_attn.k_scale"].astype(np.float16)
    out["scalar_reshaped"] = arrays["model.layers.0.self_attn.k_scale"].reshape(1, 1)
    out["flat"] = arrays["model.layers.0.mlp.down_proj.weight"].reshape(-1).astype(np.float32)
    out["reshape_odd"] = m.reshape(17, 33)
    out["empty_cast"] = arrays["empty"].astype(np.float16)
    return out


EXECUTORS = {
    "reference": dict(scheduler="reference"),
    "sync": dict(scheduler="sync"),
    "threads": dict(scheduler="threads"),
    "threads-tiny-blocks": dict(scheduler="threads", block_bytes=64),
    "sync-small-budget": dict(scheduler="sync", budget=64 << 10, block_bytes=256),
}


def _materialize(plan, **kw):
    return materialize(plan, **kw)


@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_executor_contract(ckpt, executor):
    """Every executor gives the numpy reference's dtype, shape and bytes for every output."""
    d, arrays, cfg = ckpt
    weights = lw.load_weights(d)
    state = adapters(weights, cfg)
    got = _materialize(lw.plan(state), **EXECUTORS[executor])
    want = numpy_reference(arrays, cfg)
    assert set(want) <= set(got)
    for name, ref in want.items():
        arr = got[name]
        assert arr.dtype == ref.dtype and arr.shape == ref.shape, name
        assert np.ascontiguousarray(arr).tobytes() == np.ascontiguousarray(ref).tobytes(), name
    c = got["const"]
    assert c.dtype == BF16 and c.shape == (7, 3)
    assert got["tied_a"] is got["tied_b"], "identical outputs are computed once and shared"


def test_distributed_matches_local(ckpt, tmp_path):
    distributed = pytest.importorskip("distributed")
    d, arrays, cfg = ckpt
    plan = lw.plan(adapters(lw.load_weights(d), cfg))
    plan.tensors.pop("const")  # in-memory constants travel too, but keep the comparison to file-backed work
    local = plan.materialize(scheduler="sync")
    # (the cluster has a `with` of its own: closing a Client does not close a cluster it was handed)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        remote = plan.materialize(scheduler=client)
        for name in local:
            assert remote[name].tobytes() == local[name].tobytes(), name
        files_d = plan.save(tmp_path / "dist", max_shard_size=4000, scheduler=client)
    files_l = plan.save(tmp_path / "local", max_shard_size=4000)
    assert [os.path.basename(f) for f in files_d] == [os.path.basename(f) for f in files_l]
    assert len(files_l) > 2
    for a, b in zip(files_d, files_l):
        assert open(a, "rb").read() == open(b, "rb").read(), a


# --- structure -----------------------------------------------------------------------------------------
def test_permute_cast_chain_is_one_fused_step(ckpt):
    d, _, cfg = ckpt
    w = lw.load_weights(d)
    q = w["model.layers.0.self_attn.q_proj.weight"].data()
    hd = cfg["hd"]
    chain = q.astype(lw.DType.float32).reshape(cfg["A"], hd, -1)[:, rope_perm(hd), :].reshape(cfg["A"] * hd, -1)
    steps = compile_steps(lw.plan({"q": chain.astype(lw.DType.float16)}))
    assert len(steps) == 1
    (step,) = steps
    assert step.kind == "fused"
    ops_in_chain = [n.op for n in step.nodes]
    # Both casts moved above the layout ops, so the gather works on bf16 and the casts on one block.
    # (bf16 -> f32 -> f16 is not folded into bf16 -> f16: NaN payloads would differ from ml_dtypes.)
    assert ops_in_chain == ["source", "reshape", "take", "reshape", "cast", "cast"]
    assert step.node.srcs[0].srcs[0].dtype == lw.DType.bfloat16
    assert [r.name for r in step.sources] == ["model.layers.0.self_attn.q_proj.weight"]


def test_untouched_source_is_a_view_and_plans_copy_zero_bytes(ckpt):
    d, arrays, _ = ckpt
    w = lw.load_weights(d)
    plan = lw.plan({"e": w["model.embed_tokens.weight"].data()})
    (step,) = compile_steps(plan)
    assert step.kind == "view" and step.work_per_row * 0 == 0
    arr = plan.materialize()["e"]
    assert not arr.flags.owndata and not arr.flags.writeable  # a view of the read-only map
    assert arr.tobytes() == arrays["model.embed_tokens.weight"].tobytes()


def test_no_full_size_temporary(tmp_path):
    """A 32 MB permute+cast chain materialized into a caller buffer allocates only block-sized memory."""
    a = RNG.standard_normal((2048, 4096), dtype=np.float32).astype(BF16)
    save_file({"w": a}, str(tmp_path / "big.safetensors"))
    w = lw.load_weights(tmp_path / "big.safetensors")["w"].data()
    hd = 64
    chain = w.reshape(32, hd, -1)[:, rope_perm(hd), :].reshape(2048, -1).astype(lw.DType.float16)
    plan = lw.plan({"q": chain})
    dst = np.empty((2048, 4096), np.float16)
    materialize(plan, scheduler="sync", block_bytes=256 << 10)  # warm kernels outside the measurement
    tracemalloc.start()
    result = materialize(plan, scheduler="sync", out={"q": dst}, block_bytes=256 << 10)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result["q"] is dst, "the caller's buffer is filled in place"
    assert peak < 4 << 20, f"peak traced allocation {peak} bytes for a {dst.nbytes}-byte output"
    ref = a.reshape(32, hd, -1)[:, rope_perm(hd), :].reshape(2048, -1).astype(np.float16)
    assert dst.tobytes() == ref.tobytes()


def test_reads_are_ordered_by_file_and_offset(ckpt):
    d, _, cfg = ckpt
    steps = compile_steps(lw.plan(adapters(lw.load_weights(d), cfg)))
    keys = [s.order_key()[:2] for s in steps if s.sources]
    assert keys == sorted(keys)


def test_budget_sizes_blocks():
    w = lw.WeightData.from_numpy(RNG.standard_normal((1000, 256)).astype(np.float32), "w").astype(lw.DType.float16)
    (big,) = compile_steps(lw.plan({"w": w}), budget="1MB", workers=2)
    (small,) = compile_steps(lw.plan({"w": w}), budget="64KB", workers=2)
    assert len(small.blocks) > len(big.blocks)
    assert small.block_bytes * 2 <= parse_size("64KB")


def test_budget_too_small_fails_before_any_work(tmp_path):
    w = lw.WeightData.from_numpy(RNG.standard_normal((4, 100000)).astype(np.float32), "wide").astype(lw.DType.float16)
    with pytest.raises(lw.BudgetError) as e:
        lw.plan({"wide": w}).save(tmp_path / "out.safetensors", budget=1000)
    assert "'wide'" in str(e.value) and "1000" in str(e.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("text,value", [("512MB", 512_000_000), ("1GB", 10**9), ("4GiB", 4 << 30), ("256k", 256_000),
                                        (1234, 1234)])
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_parse_size_rejects_garbage():
    for bad in ("lots", "-1MB", 0, "1XB"):
        with pytest.raises(lw.LazyWeightsError):
            parse_size(bad)


# --- saving ----------------------------------------------------------------------------------------------
def test_save_is_byte_identical_to_safetensors(ckpt, tmp_path):
    d, arrays, cfg = ckpt
    state = adapters(lw.load_weights(d), cfg)
    # safetensors' numpy API cannot build fp8 arrays (it looks them up on numpy); keep those out here.
    state = {k: v for k, v in state.items() if not v.dtype.is_float8}
    plan = lw.plan(state)
    ref = plan.materialize(scheduler="reference")
    (path,) = plan.save(tmp_path / "out.safetensors", block_bytes=None)
    save_file({k: v.copy() for k, v in ref.items()}, str(tmp_path / "ref.safetensors"), metadata={"format": "pt"})
    assert open(path, "rb").read() == open(tmp_path / "ref.safetensors", "rb").read()


def test_sharded_save_with_index(ckpt, tmp_path):
    d, _, cfg = ckpt
    plan = lw.plan(adapters(lw.load_weights(d), cfg))
    files = plan.save(tmp_path / "sharded", max_shard_size="8kB", progress=False)
    index = json.load(open(tmp_path / "sharded" / "model.safetensors.index.json"))
    shards = sorted(f for f in os.listdir(tmp_path / "sharded") if f.endswith(".safetensors"))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"]) == set(plan.outputs)
    assert index["metadata"]["total_size"] == sum(n.nbytes for n in plan.outputs.values())
    ref = plan.materialize()
    back = lw.load_weights(tmp_path / "sharded" / "model.safetensors.index.json")
    for name, shard in index["weight_map"].items():
        assert back[name].data().to_numpy().tobytes() == np.ascontiguousarray(ref[name]).tobytes(), name
        if plan.outputs[name].dtype.is_float8:
            continue  # safetensors' numpy API cannot build fp8 arrays
        with safe_open(str(tmp_path / "sharded" / shard), "numpy") as f:
            assert f.get_tensor(name).tobytes() == np.ascontiguousarray(ref[name]).tobytes(), name
    assert len(files) == len(shards) + 1


def test_progress_bar(ckpt, tmp_path, capsys):
    d, _, cfg = ckpt
    plan = lw.plan(adapters(lw.load_weights(d), cfg))
    plan.save(tmp_path / "p.safetensors", progress=True)
    err = capsys.readouterr().err
    # the bar counts the bytes computed: each distinct node once (tied_a and tied_b share embed_tokens' node,
    # computed once and written three times), and its last redraw reaches the total: "<total> / <total>"
    total = sum(n.nbytes for n in set(plan.outputs.values()))
    assert "save [" in err and "/s" in err
    assert "KiB" in err or "MiB" in err
    assert f"{format_bytes(total)} / {format_bytes(total)}" in err, err[-300:]


# --- faults ----------------------------------------------------------------------------------------------
def _leftovers(directory):
    return sorted(os.listdir(directory))


def test_exception_in_a_kernel_stops_and_names_the_tensor(ckpt, tmp_path, monkeypatch):
    d, _, cfg = ckpt
    plan = lw.plan(adapters(lw.load_weights(d), cfg))
    import lazyweights.kernels.casts as casts
    import lazyweights.run.blocks as blocks

    real = blocks.PULL["take"]
    calls = []

    def boom(*args):
        calls.append(1)
        raise MemoryError("injected")

    monkeypatch.setitem(blocks.PULL, "take", boom)
    monkeypatch.setattr(casts, "gather_cast_into", boom)  # the q/k permutations' kernel (a row-gather cast)
    with pytest.raises(lw.ExecutionError) as e:
        plan.save(tmp_path / "out", scheduler="threads", block_bytes=64)
    assert "layers.0.attention" in str(e.value) and "injected" in str(e.value)
    assert e.value.tensor.startswith("layers.0.attention")
    assert _leftovers(tmp_path) == [], "no partial output, no temporaries"
    monkeypatch.setitem(blocks.PULL, "take", real)


def test_failing_write_removes_partial_output(ckpt, tmp_path, monkeypatch):
    d, _, cfg = ckpt
    plan = lw.plan(adapters(lw.load_weights(d), cfg))
    real = os.pwrite
    count = [0]

    def flaky(fd, data, offset):
        count[0] += 1
        if count[0] > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", flaky)
    out = tmp_path / "full.safetensors"
    with pytest.raises(lw.WriteError) as e:
        plan.save(out, scheduler="sync")
    assert "full.safetensors" in str(e.value) and "No space left" in str(e.value)
    assert _leftovers(tmp_path) == []


def test_keyboard_interrupt_leaves_nothing(ckpt, tmp_path, monkeypatch):
    d, _, cfg = ckpt
    plan = lw.plan(adapters(lw.load_weights(d), cfg))
    import lazyweights.run.sinks as save_mod

    real = save_mod.write_block
    n = [0]

    def interrupted(task):
        n[0] += 1
        if n[0] == 3:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(save_mod, "write_block", interrupted)
    with pytest.raises(KeyboardInterrupt):
        plan.save(tmp_path / "dir_out", scheduler="sync", max_shard_size="8kB")
    assert _leftovers(tmp_path) == []


def test_existing_output_directory_keeps_other_files(ckpt, tmp_path):
    d, _, cfg = ckpt
    out = tmp_path / "existing"
    out.mkdir()
    (out / "README").write_text("keep me")
    lw.plan(adapters(lw.load_weights(d), cfg)).save(out)
    assert sorted(os.listdir(out)) == ["README", "model.safetensors"]


SOURCE_CHANGED = r"""
import os, sys, numpy as np
import lazyweights as lw
from safetensors.numpy import save_file
path = sys.argv[1]
save_file({"a": np.ones((256, 256), np.float32), "b": np.ones((256, 256), np.float32)}, path)
w = lw.load_weights(path)
plan = lw.plan({"b": w["b"].data().astype(lw.DType.float16)})
mode = sys.argv[2]
if mode == "truncate":
    os.truncate(path, 1000)
else:
    os.replace(path, path + ".old")
    save_file({"a": np.zeros((256, 256), np.float32), "b": np.zeros((256, 256), np.float32)}, path)
try:
    plan.materialize()
except lw.SourceChangedError as e:
    print("OK", e)
"""


@pytest.mark.parametrize("mode", ["truncate", "replace"])
def test_source_changed_after_load(tmp_path, mode):
    """A file truncated or replaced after load_weights: a clear error, never SIGBUS or stale data."""
    script = tmp_path / "s.py"
    script.write_text(SOURCE_CHANGED)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "m.safetensors"), mode],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK") and "m.safetensors" in r.stdout and "'b'" in r.stdout
    assert ("size changed" in r.stdout) if mode == "truncate" else ("replaced" in r.stdout)
