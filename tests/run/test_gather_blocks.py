"""Gathered rows under a cast run through the fused row-gather cast, with the same bytes as without it.

A permuted-and-cast plan (RoPE's q/k rows both ways, a take of rows, a permuted copy without a cast) is
run through every in-memory and on-disk path (`materialize()`, `materialize(out=)`, `save`), with the
fused path and with it switched off (the old gather-then-cast pull, numpy's casts, and a fresh process
with the C kernels disabled), against numpy's own ``x[perm].astype(dtype)``.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import lazyweights as lw
from lazyweights.kernels import casts
from lazyweights.run import blocks

BF16 = np.dtype(ml_dtypes.bfloat16)
HEADS, HD, HIDDEN = 4, 32, 96


def rope_perm(hd):
    return np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])


def edge_weights(shape, seed):
    """bf16 weights salted with NaN payloads, +-inf, -0.0, float16 subnormals and float16 overflow."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    flat = x.reshape(-1).view(np.uint32)
    specials = np.array([0x7FC00000, 0x7F810000, 0xFFC10000, 0x7F800000, 0xFF800000, 0x80000000, 0x33800000,
                         0x00010000, 0x477FE000, 0x47800000, 0xC8000000], np.uint32)
    for k, v in enumerate(specials):
        flat[k::53] = v
    with np.errstate(invalid="ignore"):
        return x.astype(BF16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, write_safetensors):
    d = tmp_path_factory.mktemp("gather")
    arrays = {"q": edge_weights((HEADS * HD, HIDDEN), 1), "k": edge_weights((HD, HIDDEN), 2),
              "e": edge_weights((50, HIDDEN), 3)}
    path = d / "m.safetensors"
    write_safetensors(str(path), arrays)
    return path, arrays


def adapted(path):
    """name -> (lazy WeightData, numpy function of the source arrays giving the expected value)."""
    w = lw.load_weights(path)
    q, k, e = (w[n].data() for n in ("q", "k", "e"))
    perm = rope_perm(HD)
    pairs = np.argsort(perm)  # the inverse: half-split -> interleaved
    rows = np.array([7, 0, 49, 3, 3, 12])
    f16, f32 = lw.DType.float16, lw.DType.float32

    def rope(x, heads):
        return x.reshape(heads, HD, -1)[:, perm, :].reshape(heads * HD, -1)

    def gguf_rope(x, heads):  # llama.cpp's direction, as a permute of the leading axes
        return x.reshape(heads, 2, HD // 2, -1).swapaxes(1, 2).reshape(heads * HD, -1)

    return {
        "q16": (rope(q, HEADS).astype(f16), lambda a: rope(a["q"], HEADS).astype(np.float16)),
        "k32": (rope(k, 1).astype(f32), lambda a: rope(a["k"], 1).astype(np.float32)),
        "q_gguf": (gguf_rope(q, HEADS).astype(f16), lambda a: gguf_rope(a["q"], HEADS).astype(np.float16)),
        "q_back": (q.reshape(HEADS, HD, -1)[:, pairs, :].reshape(HEADS * HD, -1).astype(f16),
                   lambda a: a["q"].reshape(HEADS, HD, -1)[:, pairs, :].reshape(HEADS * HD, -1).astype(np.float16)),
        "rows": (e[rows].astype(f32), lambda a: a["e"][rows].astype(np.float32)),
        "q_copy": (rope(q, HEADS), lambda a: rope(a["q"], HEADS)),  # no cast: a gather straight into place
    }


def run_all_ways(path, tmp_path, tag):
    """Bytes of every output through materialize(), materialize(out=) and save, small blocks."""
    plan_map = {n: d for n, (d, _) in adapted(path).items()}
    p = lw.plan(plan_map)
    got = {}
    fresh = p.materialize(block_bytes=4096)
    outs = {n: np.empty(d.shape, d.dtype.to_numpy()) for n, d in plan_map.items()}
    into = p.materialize(out=outs, block_bytes=4096, scheduler="sync")
    p.save(tmp_path / f"{tag}.safetensors")
    saved = lw.load_weights(tmp_path / f"{tag}.safetensors")
    for n in plan_map:
        got[n] = (fresh[n].tobytes(), into[n].tobytes(), saved[n].data().to_numpy().tobytes())
    return got


def expected(path, arrays):
    return {n: f(arrays).tobytes() for n, (_, f) in adapted(path).items()}


def test_fused_path_equals_numpy(ckpt, tmp_path):
    path, arrays = ckpt
    want = expected(path, arrays)
    for n, ways in run_all_ways(path, tmp_path, "fused").items():
        for how, b in zip(("materialize", "materialize(out=)", "save"), ways):
            assert b == want[n], f"{n} via {how}"


@pytest.mark.parametrize("off", ["no_gather_pull", "numpy_casts"])
def test_without_the_fused_path_the_same_bytes(ckpt, tmp_path, monkeypatch, off):
    path, arrays = ckpt
    with_fused = run_all_ways(path, tmp_path, "a")
    if off == "no_gather_pull":  # the old path: pull a gathered copy, then cast it
        monkeypatch.setattr(blocks, "gathered", lambda *a, **k: None)
    else:  # gather_cast_into's own fallback: gather, then numpy's cast loops
        monkeypatch.setattr(casts, "USE_COMPILED", False)
    assert run_all_ways(path, tmp_path, "b") == with_fused


@pytest.mark.skipif(not casts.HAVE_C, reason="the C extension was not built")
def test_gathered_rows_are_never_copied_first(ckpt, monkeypatch):
    """With the C kernels, no permuted cast goes through gather-then-cast: cast_into (the second pass of
    the old path) is never called, in either executor path."""
    path, arrays = ckpt
    assert casts.kernel_backend() == "c"
    plan_map = {n: d for n, (d, _) in adapted(path).items() if n != "q_copy"}
    p = lw.plan(plan_map)
    want = expected(path, arrays)

    def second_pass(*a, **k):
        raise AssertionError("a gathered block was copied, then cast")

    monkeypatch.setattr(casts, "cast_into", second_pass)
    got = p.materialize(block_bytes=4096)
    outs = {n: np.empty(d.shape, d.dtype.to_numpy()) for n, d in plan_map.items()}
    into = p.materialize(out=outs, scheduler="sync")
    for n in plan_map:
        assert got[n].tobytes() == into[n].tobytes() == want[n], n


def test_gathered_pull_under_another_op(ckpt):
    """A gathered cast pulled by an op above it (here a bitcast) goes through the pull rule's fused path."""
    path, arrays = ckpt
    q = lw.load_weights(path)["q"].data()
    lazy = q[rope_perm(HD)].astype(lw.DType.float16).view(lw.DType.uint16)
    got = lw.plan({"x": lazy}).materialize(block_bytes=4096)["x"]
    assert got.tobytes() == arrays["q"][rope_perm(HD)].astype(np.float16).tobytes()


CHILD = r"""
import hashlib, sys
sys.path.insert(0, {tests!r})
from test_gather_blocks import adapted
import lazyweights as lw
from lazyweights.kernels import casts
p = lw.plan({{n: d for n, (d, _) in adapted({path!r}).items()}})
out = p.materialize(block_bytes=4096)
print(casts.kernel_backend(), hashlib.sha256(b"".join(out[n].tobytes() for n in sorted(out))).hexdigest())
"""


def test_a_process_with_numpy_casts_gives_the_same_bytes(ckpt, child_env):
    path, arrays = ckpt
    want = expected(path, arrays)
    digest = hashlib.sha256(b"".join(want[n] for n in sorted(want))).hexdigest()
    code = CHILD.format(tests=str(__import__("pathlib").Path(__file__).parent), path=str(path))
    env = dict(child_env, LAZYWEIGHTS_CAST_KERNELS="numpy")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    used, got = r.stdout.split()
    assert used == "numpy" and got == digest, used
