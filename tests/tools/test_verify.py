"""`lazyweights.tools.verify`: stable per-tensor hashes (block-wise, through the scheduler), manifests beside
saved checkpoints, and `lazyweights verify PATH [--write]`."""
from __future__ import annotations

import json
import os
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import lazyweights as lw
from lazyweights.tools.verify import (
    MANIFEST_NAME,
    VerifyError,
    hash_array,
    hash_plan,
    manifest_path,
    save_and_manifest,
    verify,
    write_manifest,
)

RNG = np.random.default_rng(3)
BF16 = ml_dtypes.bfloat16


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("vsrc")
    arrays = {
        "embed": RNG.standard_normal((300, 64)).astype(BF16),
        "q": RNG.standard_normal((128, 64)).astype(BF16),
        "k": RNG.standard_normal((64, 64)).astype(np.float32),
        "norm": RNG.standard_normal(64).astype(np.float16),
        "scale": np.asarray(0.5, np.float32),
        "empty": np.zeros((0, 8), np.float32),
        "f8": RNG.standard_normal((32, 16)).astype(ml_dtypes.float8_e4m3fn),
    }
    save_file(arrays, str(d / "m.safetensors"))
    return lw.load_weights(d / "m.safetensors"), arrays


def _plan(w):
    perm = np.concatenate([np.arange(0, 16, 2), np.arange(1, 16, 2)])
    q = w["q"].data()
    return lw.plan({
        "embed": w["embed"].data().astype(lw.DType.float16),
        "lm_head": w["embed"].data().astype(lw.DType.float16),  # tied: one step, two names
        "q": q.reshape(8, 16, 64)[:, perm, :].reshape(128, 64).astype(lw.DType.float32),
        "kT": w["k"].data().T.astype(lw.DType.bfloat16),
        "k_view": w["k"].data(),
        "qk": lw.concat([q, w["k"].data().astype(lw.DType.bfloat16)]),
        "rows": w["embed"].data()[[7, 3, 3, 299]],
        "norm": w["norm"].data().astype(lw.DType.float32),
        "scale": w["scale"].data(),
        "empty": w["empty"].data().astype(lw.DType.float16),
        "f8_up": w["f8"].data().astype(lw.DType.bfloat16),
    })


EXECUTORS = [dict(scheduler="sync"), dict(scheduler="threads"), dict(scheduler="reference"),
             dict(scheduler="threads", block_bytes=256, workers=3),
             dict(scheduler="sync", budget="64kB", block_bytes=512)]


def test_hashes_equal_across_executors_runs_and_the_array_definition(src):
    w, _ = src
    p = _plan(w)
    want = {n: hash_array(a) for n, a in p.materialize(scheduler="reference").items()}
    for kw in EXECUTORS:
        for _ in range(2):  # and across runs
            assert hash_plan(p, **kw) == want, kw
    assert want["embed"] == want["lm_head"] and len(set(want.values())) == len(want) - 1
    # the definition, spelled out
    import hashlib

    arr = p.materialize()["norm"]
    h = hashlib.blake2b(b"float32:64\n" + arr.tobytes(), digest_size=32).hexdigest()
    assert want["norm"] == h
    assert want["scale"] == hashlib.blake2b(b"float32:\n" + np.float32(0.5).tobytes(), digest_size=32).hexdigest()


def test_hash_distinguishes_dtype_and_shape():
    a = np.arange(6, dtype=np.int16)
    assert len({hash_array(a), hash_array(a.reshape(2, 3)), hash_array(a.view(np.float16)),
                hash_array(a.view(np.uint16))}) == 4


def test_hashing_is_blockwise_not_whole_tensors(tmp_path):
    """A 64 MiB tensor hashed under a 4 MiB budget never holds a tensor-sized buffer."""
    path = tmp_path / "big.safetensors"
    save_file({"x": np.ones((4096, 4096), np.float32)}, str(path))
    w = lw.load_weights(path)
    p = lw.plan({"x16": w["x"].data().astype(lw.DType.float16), "xT": w["x"].data().T})
    tracemalloc.start()
    try:
        got = hash_plan(p, budget="4MB", workers=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, peak  # (xT is a strided view of the map, copied block by block: no 64 MiB buffer)
    assert got["x16"] == hash_array(np.ones((4096, 4096), np.float16))


# (the GGUF is a bare tensor container: no converter's general.architecture, so the rule is waived)
@pytest.mark.parametrize("target,kw", [("out.safetensors", {}), ("outdir", {"max_shard_size": "40kB"}),
                                       ("out.gguf", {"require_architecture": False})])
def test_save_and_manifest_then_verify(src, tmp_path, target, kw):
    w, _ = src
    p = _plan(w)
    if target.endswith(".gguf"):
        p = lw.plan({n: t for n, t in p.tensors.items() if n not in ("scale", "empty", "f8_up")})
    files = save_and_manifest(p, tmp_path / target, **kw)
    manifest = files[-1]
    assert manifest == manifest_path(tmp_path / target) and os.path.basename(manifest) == MANIFEST_NAME
    doc = json.loads(open(manifest).read())
    assert set(doc["tensors"]) == set(p.outputs) and doc["hash"] == "blake2b-256"
    assert {n: t["hash"] for n, t in doc["tensors"].items()} == hash_plan(p)
    report = verify(tmp_path / target)
    assert report.ok and report.checked == len(p.outputs), report.summary()


def _flip(path, offset):
    b = bytearray(open(path, "rb").read())
    b[offset] ^= 0x10
    open(path, "wb").write(bytes(b))


# (the GGUF is a bare tensor container: no converter's general.architecture, so the rule is waived)
@pytest.mark.parametrize("target,kw", [("out.safetensors", {}), ("outdir", {"max_shard_size": "40kB"}),
                                       ("out.gguf", {"require_architecture": False})])
def test_flipped_byte_is_detected_and_named(src, tmp_path, target, kw):
    w, _ = src
    p = _plan(w)
    if target.endswith(".gguf"):
        p = lw.plan({n: t for n, t in p.tensors.items() if n not in ("scale", "empty", "f8_up")})
    save_and_manifest(p, tmp_path / target, **kw)
    saved = lw.load_weights(tmp_path / target)
    for victim in ("q", "norm"):  # flip one byte inside the victim's data, in whichever file holds it
        rec = saved.records[victim]
        _flip(rec.file.path, rec.offset + rec.nbytes // 2)
        from lazyweights.formats.source import SourceFile

        SourceFile._cache.pop(rec.file.path, None)
        report = verify(tmp_path / target)
        assert not report.ok and report.mismatched == [victim], report.summary()
        assert victim in report.summary() and "MISMATCH" in report.summary()
        _flip(rec.file.path, rec.offset + rec.nbytes // 2)  # restore
        assert verify(tmp_path / target).ok


def test_missing_and_unexpected_tensors(src, tmp_path):
    w, _ = src
    p = _plan(w)
    out = tmp_path / "o.safetensors"
    save_and_manifest(p, out)
    doc = json.loads(open(manifest_path(out)).read())
    doc["tensors"]["ghost"] = dict(doc["tensors"]["norm"])
    del doc["tensors"]["kT"]
    open(manifest_path(out), "w").write(json.dumps(doc))
    r = verify(out)
    assert r.missing == ["ghost"] and r.unexpected == ["kT"] and not r.ok


def test_manifest_errors(tmp_path):
    out = tmp_path / "o.safetensors"
    lw.plan({"w": lw.WeightData.from_numpy(np.ones(3, np.float32), "w")}).save(out)
    with pytest.raises(VerifyError) as ei:
        verify(out)
    assert "no manifest" in str(ei.value)
    open(manifest_path(out), "w").write("{not json")
    with pytest.raises(VerifyError):
        verify(out)
    open(manifest_path(out), "w").write(json.dumps({"format": "other"}))
    with pytest.raises(VerifyError):
        verify(out)
    with pytest.raises(lw.LazyWeightsError):
        write_manifest(lw.plan({}), None)


def test_write_manifest_from_a_checkpoint_on_disk(src, tmp_path):
    w, arrays = src
    target = write_manifest(w.files[0], tmp_path / "elsewhere.safetensors")  # hash a checkpoint, file it elsewhere
    doc = json.loads(open(target).read())
    assert doc["tensors"]["k"]["hash"] == hash_array(arrays["k"])
    assert doc["tensors"]["embed"]["hash"] == hash_array(arrays["embed"])


def test_save_and_manifest_detects_a_bad_write(src, tmp_path, monkeypatch):
    """The manifest comes from the plan, not the written bytes: a writer that corrupts one block is caught."""
    import lazyweights.io.atomic as sw

    w, _ = src
    p = _plan(w)
    real = sw.AtomicFile.write

    def corrupting(self, offset, data, tensor=None):
        if tensor == "norm":
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8).copy()
            data[0] ^= 1
        return real(self, offset, data, tensor)

    monkeypatch.setattr(sw.AtomicFile, "write", corrupting)
    with pytest.raises(VerifyError) as ei:
        save_and_manifest(p, tmp_path / "o.safetensors")
    assert ei.value.report.mismatched == ["norm"] and "norm" in str(ei.value)


def test_kernel_failure_while_hashing_names_the_tensor(src, monkeypatch):
    import lazyweights.kernels.casts as casts

    w, _ = src
    p = lw.plan({"norm": w["norm"].data().astype(lw.DType.float32)})

    def boom(a, b):
        raise RuntimeError("cast exploded")

    monkeypatch.setattr(casts, "cast_into", boom)
    with pytest.raises(lw.ExecutionError) as ei:
        hash_plan(p, scheduler="threads")
    assert ei.value.tensor == "norm" and "exploded" in str(ei.value)


def test_cli_verify(src, tmp_path, capsys):
    from lazyweights.tools.cli import main

    w, _ = src
    out = tmp_path / "ck"
    _plan(w).save(out, max_shard_size="40kB")
    assert main(["verify", str(out)]) == 1  # no manifest yet
    assert "no manifest" in capsys.readouterr().err
    assert main(["verify", str(out), "--write"]) == 0
    assert MANIFEST_NAME in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    assert capsys.readouterr().out.startswith("OK: 11 tensors")
    rec = lw.load_weights(out).records["kT"]
    _flip(rec.file.path, rec.offset + 3)
    from lazyweights.formats.source import SourceFile

    SourceFile._cache.pop(rec.file.path, None)
    assert main(["verify", str(out), "--scheduler", "sync", "--budget", "64kB"]) == 1
    text = capsys.readouterr().out
    assert "MISMATCH  kT" in text and "FAILED" in text
    assert main(["verify", str(out), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["mismatched"] == ["kT"]
