"""The safetensors source and the `Weights` protocol, checked against the safetensors package.

Covers: one file, a list of shards, a directory, `model.safetensors.index.json` (also through Hugging
Face cache symlinks), metadata; every tensor equal to `safe_open(...).get_tensor`; zero-copy reads;
hostile files (each a FormatError naming the file and, where there is one, the tensor); files changed
after `load_weights` (SourceChangedError, never SIGBUS: run in a subprocess); and the Weights protocol.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

import lazyweights as lw
from lazyweights import (
    DType,
    FormatError,
    LazyWeightsError,
    MissingWeightError,
    ShapeError,
    SourceChangedError,
    WeightData,
    Weights,
    WeightsFormat,
    load_weights,
    weights_format,
)

BF16 = np.dtype(ml_dtypes.bfloat16)


# --- helpers ---------------------------------------------------------------------------------------------
def raw(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_same(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.array_equal(raw(actual), raw(expected))


def rnd(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 0.5 + 0.1).astype(np.float32).astype(dtype)


def llama_tensors(layers=2, hidden=64, heads=4, kv_heads=2, inter=96, vocab=50, seed=0):
    """HF Llama-style names; bf16 matrices, f16 biases, f32 norms, 0-d f32 k/v scales."""
    hd = hidden // heads
    out = {"model.embed_tokens.weight": rnd((vocab, hidden), BF16, seed)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = rnd((hidden,), np.float32, seed + 1 + i)
        out[p + "self_attn.q_proj.weight"] = rnd((heads * hd, hidden), BF16, seed + 2 + i)
        out[p + "self_attn.q_proj.bias"] = rnd((heads * hd,), np.float16, seed + 3 + i)
        out[p + "self_attn.k_proj.weight"] = rnd((kv_heads * hd, hidden), BF16, seed + 4 + i)
        out[p + "self_attn.v_proj.weight"] = rnd((kv_heads * hd, hidden), np.float16, seed + 5 + i)
        out[p + "self_attn.o_proj.weight"] = rnd((hidden, heads * hd), BF16, seed + 6 + i)
        out[p + "self_attn.k_scale"] = np.array(0.5 + i, dtype=np.float32)
        out[p + "self_attn.v_scale"] = np.array(0.25 + i, dtype=np.float32)
        out[p + "mlp.gate_proj.weight"] = rnd((inter, hidden), BF16, seed + 7 + i)
        out[p + "mlp.down_proj.weight"] = rnd((hidden, inter), BF16, seed + 8 + i)
    out["model.norm.weight"] = rnd((hidden,), np.float32, seed + 99)
    out["lm_head.weight"] = rnd((vocab, hidden), BF16, seed + 100)
    return out


def write_sharded(directory: Path, tensors: dict, n_shards: int, index=True, metadata=None) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    groups = [names[i::n_shards] for i in range(n_shards)]
    paths, weight_map = [], {}
    for i, g in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: tensors[k] for k in g}, str(directory / fname), metadata=metadata or {"format": "pt"})
        paths.append(directory / fname)
        weight_map.update({k: fname for k in g})
    if index:
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}))
    return paths


def write_raw(path: Path, header, data: bytes = b"", header_len: int | None = None) -> Path:
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(hb) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", n) + hb + data)
    return path


def reference_tensors(files) -> dict[str, np.ndarray]:
    out = {}
    for f in files:
        with safe_open(str(f), framework="numpy") as fh:
            for k in fh.keys():
                out[k] = fh.get_tensor(k)
    return out


def check_equal_to_safetensors(weights: Weights, files):
    ref = reference_tensors(files)
    names = [n for n, _ in weights.items()]
    assert sorted(names) == sorted(ref) and len(names) == len(set(names))
    for name, accessor in weights.items():
        data = accessor.data()
        assert data.name == name
        assert data.dtype is DType.from_numpy(ref[name].dtype)
        assert data.shape == ref[name].shape
        assert_same(data.to_numpy(), ref[name])


@pytest.fixture(scope="module")
def llama():
    return llama_tensors()


# --- layouts ---------------------------------------------------------------------------------------------
def test_single_file_all_dtypes(tmp_path):
    tensors = {f"t.{np.dtype(d).name}": rnd((3, 5), d, i) for i, d in enumerate(
        [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
         np.float16, BF16, np.float32, np.float64])}
    tensors["scalar"] = np.array(3.5, dtype=np.float32)
    tensors["empty"] = np.zeros((0, 4), np.float16)
    tensors["big.1d"] = rnd((1000,), np.float32, 77)
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "np", "note": "hi"})
    for arg in ([path], [str(path)], str(path), path):
        w = load_weights(arg)
        check_equal_to_safetensors(w, [path])
        assert w.metadata["format"] == "np" and w.metadata["note"] == "hi"
        assert weights_format(arg) is WeightsFormat.safetensors


def test_fp8_tensors_against_torch_reader(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (4, 8), dtype=np.uint8)
    b = rng.integers(0, 256, (16,), dtype=np.uint8)
    header = {"a": {"dtype": "F8_E4M3", "shape": [4, 8], "data_offsets": [0, 32]},
              "b": {"dtype": "F8_E5M2", "shape": [16], "data_offsets": [32, 48]}}
    path = write_raw(tmp_path / "f8.safetensors", header, a.tobytes() + b.tobytes())
    w = load_weights([path])
    with safe_open(str(path), framework="pt") as fh:
        ta, tb = fh.get_tensor("a"), fh.get_tensor("b")
    assert ta.dtype == torch.float8_e4m3fn and tb.dtype == torch.float8_e5m2
    assert w.a.data().dtype is DType.float8_e4m3fn and w.b.data().dtype is DType.float8_e5m2
    assert np.array_equal(raw(w.a.data().to_numpy()), ta.view(torch.uint8).numpy().reshape(-1))
    assert np.array_equal(raw(w.b.data().to_numpy()), tb.view(torch.uint8).numpy().reshape(-1))
    got = w.a.data().astype(DType.float32).to_numpy()
    assert_same(got, a.view(ml_dtypes.float8_e4m3fn).astype(np.float32))


def test_shards_list_directory_and_index(tmp_path, llama):
    files = write_sharded(tmp_path / "ck", llama, 3)
    index = tmp_path / "ck" / "model.safetensors.index.json"
    for arg in (files, [str(f) for f in files], tmp_path / "ck", str(tmp_path / "ck"), [index], index):
        w = load_weights(arg)
        check_equal_to_safetensors(w, files)
        assert weights_format(arg) is WeightsFormat.safetensors
    w = load_weights(index)
    assert w.metadata.get("format") == "pt"
    assert w.metadata["index"]["total_size"] == sum(t.nbytes for t in llama.values())
    # a directory without an index: every .safetensors file in it
    files2 = write_sharded(tmp_path / "noindex", llama, 2, index=False)
    check_equal_to_safetensors(load_weights(tmp_path / "noindex"), files2)


def test_index_through_hf_cache_symlinks(tmp_path, llama):
    """The HF hub cache: snapshots/<rev>/*.safetensors are symlinks to ../../blobs/<hash>."""
    files = write_sharded(tmp_path / "blobsrc", llama, 2)
    blobs = tmp_path / "hub" / "blobs"
    snap = tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(files + [tmp_path / "blobsrc" / "model.safetensors.index.json"]):
        blob = blobs / f"sha{i}"
        os.replace(f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    for arg in (snap, snap / "model.safetensors.index.json", sorted(snap.glob("*.safetensors"))):
        w = load_weights(arg)
        check_equal_to_safetensors(w, sorted(snap.glob("*.safetensors")))


def test_same_shard_through_index_and_relative_path_is_read_once(tmp_path, llama, monkeypatch):
    files = write_sharded(tmp_path / "ck", llama, 2)
    monkeypatch.chdir(tmp_path)
    w = load_weights([Path("ck") / "model.safetensors.index.json", Path("ck") / files[0].name])
    check_equal_to_safetensors(w, files)


def test_closed_checkpoints_are_unmapped(tmp_path):
    import gc

    from lazyweights.formats.source import SourceFile

    path = tmp_path / "m.safetensors"
    save_file({"a": np.arange(8, dtype=np.float32)}, str(path))
    w = load_weights([path])
    arr = w.a.data().to_numpy()
    assert str(path) in SourceFile._cache
    del w
    gc.collect()
    assert str(path) not in SourceFile._cache  # nothing refers to the file: not kept open forever
    assert_same(arr, np.arange(8, dtype=np.float32))  # a zero-copy result keeps its own map alive


def test_index_with_subdirectory_shard(tmp_path, llama):
    d = tmp_path / "ck"
    (d / "sub").mkdir(parents=True)
    save_file(llama, str(d / "sub" / "all.safetensors"))
    index = {"weight_map": {k: "sub/all.safetensors" for k in llama}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    check_equal_to_safetensors(load_weights(d), [d / "sub" / "all.safetensors"])


# --- zero copy -------------------------------------------------------------------------------------------
def test_source_without_ops_is_a_zero_copy_view_of_the_map(tmp_path, llama):
    path = tmp_path / "m.safetensors"
    save_file(llama, str(path))
    w = load_weights([path])
    d = w.model.layers[0].self_attn.q_proj.weight.data()
    a, b = d.to_numpy(), d.to_numpy()
    assert not a.flags.owndata and not a.flags.writeable
    assert np.shares_memory(a, b)
    # also through a second load_weights of the same file, and through a plan
    c = load_weights([path]).model.layers[0].self_attn.q_proj.weight.data().to_numpy()
    assert np.shares_memory(a, c)
    p = lw.plan({"q": d, "e": w.model.embed_tokens.weight.data()}).materialize()
    assert np.shares_memory(p["q"], a) and not p["e"].flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 1  # read-only: nobody can scribble over the checkpoint


# --- hostile files ---------------------------------------------------------------------------------------
GOOD_HEADER = {
    "__metadata__": {"format": "pt"},
    "alpha": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "beta": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]},
}
GOOD_DATA = np.arange(4, dtype=np.float32).tobytes() + np.arange(4, dtype=np.float16).tobytes()


def _hdr(**changes):
    h = json.loads(json.dumps(GOOD_HEADER))
    for name, entry in changes.items():
        if entry is None:
            h.pop(name, None)
        else:
            h[name] = entry
    return h


HOSTILE = {
    # name: (header, data, header_len, words the message must contain besides the file name)
    "header-length-past-eof": (GOOD_HEADER, GOOD_DATA, 10 ** 6, ["1000000"]),
    "header-length-2**63": (GOOD_HEADER, GOOD_DATA, 2 ** 63, [str(2 ** 63)]),
    "header-length-2**64-1": (GOOD_HEADER, GOOD_DATA, 2 ** 64 - 1, []),
    "invalid-json": (b'{"alpha": {"dtype": "F32", ', GOOD_DATA, None, ["JSON"]),
    "json-not-an-object": (b"[1, 2, 3]", b"", None, []),
    "json-string": (b'"hello"', b"", None, []),
    "non-utf8-header": (b'{"\xff\xfe": 1}', b"", None, []),
    "deeply-nested-json": (b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}", b"", None, []),
    "entry-not-an-object": (_hdr(beta=[1, 2]), GOOD_DATA, None, ["beta"]),
    "overlapping-offsets": (_hdr(beta={"dtype": "F16", "shape": [4], "data_offsets": [8, 16]}), GOOD_DATA[:16], None, ["beta", "overlap"]),
    "offsets-leave-file": (_hdr(beta={"dtype": "F16", "shape": [8], "data_offsets": [16, 32]}), GOOD_DATA, None, ["beta"]),
    "offsets-far-past-eof": (_hdr(beta={"dtype": "F16", "shape": [2 ** 40], "data_offsets": [16, 16 + 2 ** 41]}), GOOD_DATA, None, ["beta"]),
    "offsets-disagree-with-shape": (_hdr(beta={"dtype": "F16", "shape": [5], "data_offsets": [16, 24]}), GOOD_DATA, None, ["beta", "F16"]),
    "offsets-disagree-with-dtype": (_hdr(beta={"dtype": "F32", "shape": [4], "data_offsets": [16, 24]}), GOOD_DATA, None, ["beta"]),
    "end-before-begin": (_hdr(beta={"dtype": "F16", "shape": [0], "data_offsets": [24, 16]}), GOOD_DATA, None, ["beta"]),
    "hole": (_hdr(beta={"dtype": "F16", "shape": [4], "data_offsets": [20, 28]}), GOOD_DATA + b"1234", None, ["beta", "hole"]),
    "trailing-bytes": (GOOD_HEADER, GOOD_DATA + b"xxxx", None, ["trailing", "beta"]),
    "unknown-dtype": (_hdr(beta={"dtype": "F12", "shape": [4], "data_offsets": [16, 24]}), GOOD_DATA, None, ["beta", "F12"]),
    "missing-dtype": (_hdr(beta={"shape": [4], "data_offsets": [16, 24]}), GOOD_DATA, None, ["beta"]),
    "negative-dim": (_hdr(beta={"dtype": "F16", "shape": [-4], "data_offsets": [16, 24]}), GOOD_DATA, None, ["beta", "-4"]),
    "float-dim": (_hdr(beta={"dtype": "F16", "shape": [4.0], "data_offsets": [16, 24]}), GOOD_DATA, None, ["beta"]),
    "bool-dim": (_hdr(beta={"dtype": "F16", "shape": [True, 4], "data_offsets": [16, 24]}), GOOD_DATA, None, ["beta"]),
    "string-offsets": (_hdr(beta={"dtype": "F16", "shape": [4], "data_offsets": ["16", "24"]}), GOOD_DATA, None, ["beta"]),
    "negative-offset": (_hdr(beta={"dtype": "F16", "shape": [4], "data_offsets": [-8, 0]}), GOOD_DATA, None, ["beta"]),
    "three-offsets": (_hdr(beta={"dtype": "F16", "shape": [4], "data_offsets": [16, 24, 32]}), GOOD_DATA, None, ["beta"]),
    "shape-not-a-list": (_hdr(beta={"dtype": "F16", "shape": 4, "data_offsets": [16, 24]}), GOOD_DATA, None, ["beta"]),
    "metadata-not-strings": (_hdr(__metadata__={"format": 1}), GOOD_DATA, None, ["__metadata__"]),
    "duplicate-tensor-name": (b'{"alpha": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, '
                              b'"alpha": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', GOOD_DATA[:16], None, ["alpha"]),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_file_is_a_format_error_naming_file_and_tensor(tmp_path, case):
    header, data, header_len, words = HOSTILE[case]
    path = write_raw(tmp_path / f"{case}.safetensors", header, data, header_len)
    with pytest.raises(FormatError) as e:
        load_weights([path])
    assert isinstance(e.value, LazyWeightsError) and isinstance(e.value, ValueError)
    msg = str(e.value)
    assert f"{case}.safetensors" in msg, msg
    for word in words:
        assert word in msg, (word, msg)
    # the safetensors package refuses it too (the reference agrees the file is bad)
    if case not in ("duplicate-tensor-name", "metadata-not-strings", "bool-dim"):
        with pytest.raises(SafetensorError):
            load_file(str(path))


def test_good_header_is_accepted_and_raw_writer_matches_safetensors(tmp_path):
    path = write_raw(tmp_path / "ok.safetensors", GOOD_HEADER, GOOD_DATA)
    check_equal_to_safetensors(load_weights([path]), [path])


def test_truncated_file(tmp_path, llama):
    path = tmp_path / "t.safetensors"
    save_file(llama, str(path))
    full = path.read_bytes()
    path.write_bytes(full[:-7])
    with pytest.raises(FormatError) as e:
        load_weights([path])
    msg = str(e.value)
    assert "t.safetensors" in msg and "truncated" in msg
    # the tensor whose bytes run off the end is named
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    last = max(hdr, key=lambda k: hdr[k]["data_offsets"][1])
    assert repr(last) in msg
    # cut inside the header, and down to fewer than 8 bytes
    path.write_bytes(full[:20])
    with pytest.raises(FormatError, match="t.safetensors"):
        load_weights([path])
    path.write_bytes(full[:5])
    with pytest.raises(FormatError, match="t.safetensors"):
        load_weights([path])


def test_empty_file(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    with pytest.raises(FormatError, match="empty.safetensors"):
        load_weights([path])


def test_missing_file(tmp_path):
    with pytest.raises(FormatError, match="nothere.safetensors"):
        load_weights([tmp_path / "nothere.safetensors"])
    with pytest.raises(LazyWeightsError):
        load_weights([])


def test_tensor_in_two_shards(tmp_path):
    a = tmp_path / "a.safetensors"
    b = tmp_path / "b.safetensors"
    save_file({"x": np.ones(3, np.float32), "y": np.ones(2, np.float32)}, str(a))
    save_file({"x": np.full(3, 2, np.float32)}, str(b))
    with pytest.raises(FormatError) as e:
        load_weights([a, b])
    msg = str(e.value)
    assert "'x'" in msg and "a.safetensors" in msg and "b.safetensors" in msg


def _index_dir(tmp_path, weight_map, files=None):
    d = tmp_path / "ck"
    d.mkdir(exist_ok=True)
    for name, tensors in (files or {}).items():
        save_file(tensors, str(d / name))
    idx = d / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d, idx


def test_index_names_missing_shard(tmp_path):
    d, idx = _index_dir(tmp_path, {"x": "model-1.safetensors", "y": "model-2.safetensors"},
                        {"model-1.safetensors": {"x": np.ones(3, np.float32)}})
    with pytest.raises(FormatError) as e:
        load_weights(d)
    msg = str(e.value)
    assert "model-2.safetensors" in msg and "'y'" in msg and "index.json" in msg


def test_index_names_tensor_the_shard_lacks(tmp_path):
    d, idx = _index_dir(tmp_path, {"x": "model-1.safetensors", "ghost": "model-1.safetensors"},
                        {"model-1.safetensors": {"x": np.ones(3, np.float32)}})
    with pytest.raises(FormatError) as e:
        load_weights(idx)
    assert "'ghost'" in str(e.value) and "model-1.safetensors" in str(e.value)


def test_index_places_tensor_in_wrong_shard(tmp_path):
    d, idx = _index_dir(tmp_path, {"x": "model-2.safetensors", "y": "model-1.safetensors"},
                        {"model-1.safetensors": {"x": np.ones(3, np.float32)},
                         "model-2.safetensors": {"y": np.ones(3, np.float32)}})
    with pytest.raises(FormatError) as e:
        load_weights(idx)
    assert "'x'" in str(e.value) or "'y'" in str(e.value)


@pytest.mark.parametrize("evil", ["../x.safetensors", "sub/../../x.safetensors", "ABS"])
def test_index_entry_outside_checkpoint_directory(tmp_path, evil):
    outside = tmp_path / "x.safetensors"
    save_file({"w": np.ones(3, np.float32)}, str(outside))
    rel = str(outside) if evil == "ABS" else evil
    d, idx = _index_dir(tmp_path, {"w": rel})
    with pytest.raises(FormatError) as e:
        load_weights(d)
    msg = str(e.value)
    assert "outside" in msg and "'w'" in msg and "index.json" in msg


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"weight_map": [1, 2]}', b'{"weight_map": {"a": 3}}',
                                     b"\xff\xfe"])
def test_bad_index_file(tmp_path, content):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "model.safetensors.index.json").write_bytes(content)
    with pytest.raises(FormatError, match="index.json"):
        load_weights(d)


def test_directory_without_checkpoint_and_pickles_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError):
        load_weights(tmp_path / "empty")
    pkl = tmp_path / "pytorch_model.bin"
    pkl.write_bytes(b"\x80\x04not a real pickle")
    assert weights_format([pkl]) is WeightsFormat.pytorch
    with pytest.raises(FormatError, match="pickle"):
        load_weights([pkl])
    st = tmp_path / "a.safetensors"
    save_file({"x": np.ones(2, np.float32)}, str(st))
    with pytest.raises(FormatError, match="mixed"):
        weights_format([st, pkl])
    assert weights_format([tmp_path / "model.gguf"]) is WeightsFormat.gguf
    assert WeightsFormat("safetensors") is WeightsFormat.safetensors


# --- files changed after load_weights (subprocess: a bug here would be a SIGBUS) --------------------------
CHANGE_SCRIPT = textwrap.dedent(r"""
    import os, sys, time, numpy as np
    from safetensors.numpy import save_file
    import lazyweights as lw
    path = os.path.join(sys.argv[1], "m.safetensors")
    mode = sys.argv[2]
    save_file({"a": np.arange(300000, dtype=np.float32), "b": np.ones(300000, np.float32)}, path)
    w = lw.load_weights([path])
    a, b = w.a.data(), w.b.data().astype(lw.DType.float16)
    time.sleep(0.02)
    if mode == "truncate":
        with open(path, "r+b") as f:
            f.truncate(1000)
    elif mode == "grow":
        with open(path, "ab") as f:
            f.write(b"x" * 10)
    elif mode == "modify":
        with open(path, "r+b") as f:
            f.seek(-8, 2); f.write(b"\0" * 8)
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    elif mode == "replace":
        save_file({"a": np.zeros(300000, np.float32), "b": np.ones(300000, np.float32)}, path + ".tmp")
        os.replace(path + ".tmp", path)
    elif mode == "delete":
        os.unlink(path)
    for what, fn in (("to_numpy", lambda: a.to_numpy()), ("cast", lambda: b.to_numpy()),
                     ("plan", lambda: lw.plan({"a": a, "b": b}).materialize())):
        try:
            fn()
        except lw.SourceChangedError as e:
            assert isinstance(e, lw.FormatError) and isinstance(e, lw.LazyWeightsError)
            assert "m.safetensors" in str(e), str(e)
            print(what, "SourceChangedError", str(e)[:200])
        else:
            print(what, "NO ERROR")
""")


@pytest.mark.parametrize("mode", ["truncate", "grow", "modify", "replace", "delete"])
def test_file_changed_after_load_is_source_changed_error_not_sigbus(tmp_path, mode, child_env):
    script = tmp_path / "change.py"
    script.write_text(CHANGE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), mode],
                          capture_output=True, text=True, timeout=120, env=child_env)
    assert proc.returncode == 0, f"exit {proc.returncode} (negative = killed by signal)\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3 and all("SourceChangedError" in line for line in lines), proc.stdout


def test_source_changed_error_is_a_format_error():
    assert issubclass(SourceChangedError, FormatError) and issubclass(SourceChangedError, LazyWeightsError)


def test_unchanged_file_reloads_share_one_source(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": np.arange(6, dtype=np.float32)}, str(path))
    a1 = load_weights([path]).a.data()
    a2 = load_weights([path]).a.data()
    assert a1.node == a2.node  # equal source nodes: a plan reads the tensor once
    # a file rewritten on disk is re-opened by a new load_weights and read fresh
    save_file({"a": np.arange(6, dtype=np.float32) * 2}, str(path))
    os.utime(path, ns=(0, 10 ** 9))
    assert_same(load_weights([path]).a.data().to_numpy(), np.arange(6, dtype=np.float32) * 2)


# --- the Weights protocol --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def protocol_weights(tmp_path_factory):
    d = tmp_path_factory.mktemp("proto")
    tensors = {}
    for i in range(12):
        tensors[f"model.layers.{i}.mlp.weight"] = rnd((4, 3), np.float32, i)
        tensors[f"model.layers.{i}.attention.weight"] = rnd((3, 3), BF16, 100 + i)
    tensors["model.layers.1x.weight"] = rnd((2,), np.float32, 7)
    tensors["model.embeddings.weight"] = rnd((5, 3), np.float16, 8)
    tensors["model"] = rnd((2,), np.float32, 9)  # a tensor whose name is also a prefix
    tensors["model.classifier.weight"] = rnd((2, 3), np.float32, 10)
    path = d / "m.safetensors"
    save_file(tensors, str(path))
    return load_weights([path]), tensors


def test_names_from_attribute_and_index_access(protocol_weights):
    w, _ = protocol_weights
    assert w.name == ""
    assert w.model.name == "model"
    assert w.model.layers[0].name == "model.layers.0"
    assert w.model.layers[0].mlp.weight.name == "model.layers.0.mlp.weight"
    assert w["model"]["layers"][0]["mlp"]["weight"].name == "model.layers.0.mlp.weight"
    assert w.model.layers["10"].name == "model.layers.10"
    assert w.model.layers[np.int64(3)].name == "model.layers.3"
    with pytest.raises(TypeError):
        w.model.layers[1.5]
    with pytest.raises(AttributeError):
        w.model.x = 1


def test_exists(protocol_weights):
    w, _ = protocol_weights
    assert w.model.layers[0].mlp.weight.exists()
    assert w.model.exists()  # "model" is itself a tensor here
    assert not w.model.layers.exists()
    assert not w.model.layers[0].exists()
    assert not w.model.layers[12].mlp.weight.exists()
    assert not w.model.layers[0].mlp.weight.extra.exists()


def test_items_on_dot_boundaries(protocol_weights):
    w, tensors = protocol_weights
    assert sorted(n for n, _ in w.items()) == sorted(tensors)
    got = sorted(n for n, _ in w.model.layers[1].items())
    assert got == ["attention.weight", "mlp.weight"]  # never layers.10 / layers.11 / layers.1x
    assert sorted(n for n, _ in w.model.layers[10].items()) == ["attention.weight", "mlp.weight"]
    under_layers = sorted(n for n, _ in w.model.layers.items())
    assert "1x.weight" in under_layers and len(under_layers) == 25
    assert [n for n, _ in w.model.layers[0].mlp.weight.items()] == []
    assert [n for n, _ in w.nothing.items()] == []
    for name, acc in w.model.layers[2].items():
        assert isinstance(acc, Weights) and acc.name == "model.layers.2." + name and acc.exists()
        assert_same(acc.data().to_numpy(), tensors[acc.name])
    # "model" is a tensor and a prefix: items() under it lists what is below it, not itself
    assert "" not in [n for n, _ in w.model.items()]


def test_data_keyerror_did_you_mean(protocol_weights):
    w, _ = protocol_weights
    with pytest.raises(KeyError) as e:
        w.model.layers[0].mlp.wieght.data()
    assert isinstance(e.value, MissingWeightError) and isinstance(e.value, LazyWeightsError)
    msg = str(e.value)
    assert "model.layers.0.mlp.wieght" in msg and "Did you mean" in msg and "model.layers.0.mlp.weight" in msg
    with pytest.raises(KeyError):
        w.model.layers[0].data()  # a prefix is not a weight


def test_data_metadata_and_lazy_astype(protocol_weights):
    w, tensors = protocol_weights
    d = w.model.embeddings.weight.data()
    assert isinstance(d, WeightData)
    assert d.name == "model.embeddings.weight" and d.dtype is DType.float16 and d.shape == (5, 3)
    assert d.quantization_encoding is None
    assert_same(d.astype(DType.bfloat16).to_numpy(), tensors["model.embeddings.weight"].astype(BF16))


def test_allocate_and_allocated_weights(tmp_path):
    tensors = {"model.a.weight": rnd((6, 4), np.float32, 1), "model.b.weight": rnd((6, 4), BF16, 2),
               "model.c.weight": rnd((3,), np.float16, 3)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    w = load_weights([path])
    assert w.allocated_weights == {}
    plain = w.model.c.weight.allocate()
    assert isinstance(plain, lw.Weight) and plain.name == "model.c.weight"
    assert plain.dtype is DType.float16 and plain.shape == (3,)
    cast = w.model.a.weight.allocate(dtype=DType.bfloat16)
    assert cast.dtype is DType.bfloat16 and cast.shape == (6, 4)
    on_gpu = w.model.b.weight.allocate(dtype=DType.float32, shape=(4, 6), device=lw.DeviceRef.GPU(0))
    assert on_gpu.shape == (4, 6) and on_gpu.dtype is DType.float32 and on_gpu.device == lw.DeviceRef.GPU(0)
    assert_same(on_gpu.source.to_numpy(), tensors["model.b.weight"].astype(np.float32).reshape(4, 6))
    reshaped = w.model.b.weight.allocate(dtype=DType.float32, shape=(4, 6))  # replaces it, on the CPU
    assert reshaped.shape == (4, 6) and reshaped.dtype is DType.float32 and reshaped.device == lw.DeviceRef.CPU()
    with pytest.raises(ShapeError) as e:
        w.model.a.weight.allocate(shape=(5, 5))
    assert "[5, 5]" in str(e.value) and "[6, 4]" in str(e.value)
    with pytest.raises(KeyError):
        w.model.zzz.allocate()
    got = w.allocated_weights
    assert set(got) == {"model.a.weight", "model.b.weight", "model.c.weight"}
    assert_same(got["model.c.weight"], tensors["model.c.weight"])
    assert_same(got["model.a.weight"], tensors["model.a.weight"].astype(BF16))
    assert_same(got["model.b.weight"], tensors["model.b.weight"].astype(np.float32).reshape(4, 6))
    # allocated_weights is shared by every accessor of the checkpoint, and re-allocating replaces
    assert set(w.model.allocated_weights) == set(got)
    w.model.a.weight.allocate(dtype=DType.float16)
    assert_same(w.allocated_weights["model.a.weight"], tensors["model.a.weight"].astype(np.float16))


def test_weights_format_property_files_and_repr(tmp_path, llama):
    files = write_sharded(tmp_path / "ck", llama, 2)
    w = load_weights(tmp_path / "ck")
    assert w.format is WeightsFormat.safetensors
    assert sorted(os.path.basename(f) for f in w.files) == sorted(f.name for f in files)
    assert "model.norm.weight" in w and "model.nope" not in w
    with pytest.raises(TypeError):
        iter(w)
