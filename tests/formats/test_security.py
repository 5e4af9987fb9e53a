"""Security: nothing is ever unpickled by default, the opt-in is torch's restricted unpickler only, index
files cannot name paths outside their directory, metadata is never evaluated, and the package has no
eval/exec/pickle.load anywhere.

A "malicious pickle" here is a checkpoint whose pickle has a `__reduce__` that would create a marker file
when unpickled. Every test asserts the marker was never created.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import struct
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

import lazyweights as lw
from lazyweights import FormatError, LazyWeightsError

PACKAGE = os.path.dirname(os.path.abspath(lw.__file__))


class _Evil:
    """Unpickling this runs `touch MARKER` (it must never happen)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def marker(tmp_path):
    m = tmp_path / "PWNED"
    yield m
    assert not m.exists(), "the malicious pickle was executed"


def _raw_pickle(path, marker):
    path.write_bytes(pickle.dumps({"w": _Evil(marker)}))
    return path


def _torch_pickle(path, marker):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2), "evil": _Evil(marker)}, str(path))
    return path


# --- never unpickle by default --------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
@pytest.mark.parametrize("kind", ["raw", "torch-zip"])
def test_malicious_pickle_refused_by_default(tmp_path, marker, suffix, kind):
    path = (_raw_pickle if kind == "raw" else _torch_pickle)(tmp_path / f"pytorch_model{suffix}", marker)
    with pytest.raises(FormatError) as ei:
        lw.load_weights(path)
    assert "refused" in str(ei.value) and str(path) in str(ei.value)
    assert "allow_pickle='weights_only'" in str(ei.value)
    assert lw.weights_format(path) is lw.WeightsFormat.pytorch
    with pytest.raises(FormatError):
        lw.load_weights(tmp_path)  # a directory holding only pickles


@pytest.mark.parametrize("name", ["model.safetensors", "model.gguf", "model"])
def test_pickle_under_another_name_is_a_format_error(tmp_path, marker, name):
    path = _raw_pickle(tmp_path / name, marker)
    with pytest.raises(FormatError):
        lw.load_weights(path)
    with pytest.raises(FormatError):
        lw.load_weights(path, allow_pickle="weights_only")  # a .safetensors/.gguf name is never a pickle


@pytest.mark.parametrize("kind", ["raw", "torch-zip"])
def test_malicious_pickle_refused_under_weights_only(tmp_path, marker, kind):
    pytest.importorskip("torch")
    path = (_raw_pickle if kind == "raw" else _torch_pickle)(tmp_path / "pytorch_model.bin", marker)
    with pytest.raises(FormatError) as ei:
        lw.load_weights(path, allow_pickle="weights_only")
    msg = str(ei.value)
    assert str(path) in msg and "weights-only unpickler" in msg
    assert "weights_only=False" not in msg and "weights_only` set to `False" not in msg  # no bad advice
    if kind == "torch-zip":
        assert "system" in msg  # names the global it refused


@pytest.mark.parametrize("value", [True, "yes", "full", 1, "WEIGHTS_ONLY"])
def test_allow_pickle_accepts_only_weights_only(tmp_path, marker, value):
    path = _raw_pickle(tmp_path / "pytorch_model.bin", marker)
    with pytest.raises(LazyWeightsError) as ei:
        lw.load_weights(path, allow_pickle=value)
    assert "weights_only" in str(ei.value)


def test_weights_only_without_torch_is_a_clear_error(tmp_path, monkeypatch, marker):
    path = _raw_pickle(tmp_path / "pytorch_model.bin", marker)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(LazyWeightsError) as ei:
        lw.load_weights(path, allow_pickle="weights_only")
    assert "needs PyTorch" in str(ei.value)


def test_safetensors_directory_wins_over_pickles(tmp_path, marker):
    """A Hugging Face repo with both formats: the safe one is read, the pickle is never opened."""
    _raw_pickle(tmp_path / "pytorch_model.bin", marker)
    save_file({"w": np.arange(3, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    w = lw.load_weights(tmp_path, allow_pickle="weights_only")
    assert w.format is lw.WeightsFormat.safetensors and w["w"].data().to_numpy().tolist() == [0, 1, 2]


# --- the opt-in: torch's restricted unpickler, zero-copy ---------------------------------------------------------
@pytest.fixture
def torch_ckpt(tmp_path):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(64, 32, generator=g)
    sd = {
        "model": {
            "embed.weight": emb,
            "lm_head.weight": emb,  # tied
            "layers.0.w": torch.randn(48, 32, generator=g).to(torch.bfloat16),
            "layers.0.f8": torch.randn(16, generator=g).to(torch.float8_e4m3fn),
            "layers.0.i": torch.arange(10, dtype=torch.int64),
            "layers.0.half": torch.randn(8, 4, generator=g).half(),
            "layers.0.strided": emb[:, ::2],  # a non-contiguous view of another tensor's storage
        },
        "epoch": 3,
        "note": "__import__('os').system('touch /tmp/x')",
    }
    path = tmp_path / "pytorch_model.bin"
    torch.save(sd, str(path))
    return torch, path, sd


def _mapped_ranges(path):
    """Address ranges of this process's mappings of `path` (from /proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            if line.rstrip().endswith(str(path)):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                out.append((lo, hi))
    return out


def test_weights_only_loads_tensors_zero_copy(torch_ckpt):
    torch, path, sd = torch_ckpt
    w = lw.load_weights(path, allow_pickle="weights_only")
    assert w.format is lw.WeightsFormat.pytorch
    names = [n for n, _ in w.items()]
    assert names == [f"model.{k}" for k in sd["model"]]
    assert w.metadata["epoch"] == 3 and w.metadata["note"] == sd["note"]  # strings stay strings
    for k, t in sd["model"].items():
        got = w[f"model.{k}"].data().to_numpy()
        if t.dtype == torch.bfloat16:
            ref = t.view(torch.int16).numpy().view(lw.DType.bfloat16.to_numpy())
        elif t.dtype == torch.float8_e4m3fn:
            ref = t.view(torch.uint8).numpy().view(lw.DType.float8_e4m3fn.to_numpy())
        else:
            ref = t.numpy()
        assert got.dtype == ref.dtype and got.shape == ref.shape and got.tobytes() == ref.tobytes(), k
        if t.is_contiguous():  # (a strided view is copied once, into a contiguous result)
            assert not got.flags.writeable
            ranges = _mapped_ranges(path)
            assert ranges and any(lo <= got.ctypes.data < hi for lo, hi in ranges), f"{k} is not a view of the file map"
    # tied tensors are one node (computed once); casts work on bf16/fp8
    assert w["model.embed.weight"].data().node is w["model.lm_head.weight"].data().node
    f32 = w["model.layers.0.w"].data().astype(lw.DType.float32).to_numpy()
    np.testing.assert_array_equal(f32, sd["model"]["layers.0.w"].float().numpy())


def test_weights_only_prefetch_and_materialize(torch_ckpt):
    # Weights.prefetch asks each record's file for a read-ahead; torch's map has nothing to ask, and the call
    # raised AttributeError ('_PickleFile' had no 'prefetch') until mypy saw the record union (issue 25).
    torch, path, sd = torch_ckpt
    w = lw.load_weights(path, allow_pickle="weights_only")
    assert w.model.prefetch() == sum(t.numel() * t.element_size() for t in sd["model"].values())
    got = w.model.materialize()
    ref = sd["model"]["layers.0.w"]
    assert ref.dtype == torch.bfloat16 and got["layers.0.w"].tobytes() == ref.view(torch.int16).numpy().tobytes()


def test_weights_only_checkpoint_converts_to_safetensors(torch_ckpt, tmp_path):
    from safetensors.torch import load_file

    torch, path, sd = torch_ckpt
    w = lw.load_weights(path, allow_pickle="weights_only")
    out = tmp_path / "out.safetensors"
    lw.plan({n: a.data() for n, a in w.items()}).save(out)
    back = load_file(str(out))
    for k, t in sd["model"].items():
        assert torch.equal(back[f"model.{k}"].view(torch.uint8), t.contiguous().view(torch.uint8)), k


def test_weights_only_sharded_index_and_containment(tmp_path, marker):
    torch = pytest.importorskip("torch")
    torch.save({"a": torch.ones(3)}, str(tmp_path / "pytorch_model-00001-of-00002.bin"))
    torch.save({"b": torch.zeros(2)}, str(tmp_path / "pytorch_model-00002-of-00002.bin"))
    index = tmp_path / "pytorch_model.bin.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "pytorch_model-00001-of-00002.bin",
                                                "b": "pytorch_model-00002-of-00002.bin"}}))
    for given in (tmp_path, index):
        w = lw.load_weights(given, allow_pickle="weights_only")
        assert sorted(n for n, _ in w.items()) == ["a", "b"] and w["a"].data().to_numpy().tolist() == [1, 1, 1]
    outside = tmp_path.parent / f"{tmp_path.name}-outside.bin"
    _raw_pickle(outside, marker)
    for evil in (str(outside), f"../{outside.name}", f"sub/../../{outside.name}"):
        index.write_text(json.dumps({"weight_map": {"a": evil}}))
        with pytest.raises(FormatError) as ei:
            lw.load_weights(index, allow_pickle="weights_only")
        assert "outside the checkpoint directory" in str(ei.value)


# --- index files cannot point outside the checkpoint directory -------------------------------------------------
@pytest.mark.parametrize("evil", ["ABS", "../victim.safetensors", "a/../../victim.safetensors",
                                  "./../victim.safetensors", "a/b/../../../victim.safetensors"])
def test_safetensors_index_cannot_escape(tmp_path, evil):
    ck = tmp_path / "ck"
    ck.mkdir()
    victim = tmp_path / "victim.safetensors"
    save_file({"secret": np.ones(2, np.float32)}, str(victim))
    rel = str(victim) if evil == "ABS" else evil
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"secret": rel}}))
    with pytest.raises(FormatError) as ei:
        lw.load_weights(ck)
    assert "outside the checkpoint directory" in str(ei.value)


def test_symlink_in_checkpoint_directory_is_followed_but_still_validated(tmp_path):
    """The index names paths inside its directory only. Symlinks already in that directory are the local
    file system's (the Hugging Face hub cache links every shard to ../../blobs/), so they are followed,
    but what they point to is validated like any shard: /etc/passwd is a FormatError, never bytes."""
    ck = tmp_path / "ck"
    ck.mkdir()
    os.symlink("/etc/passwd", ck / "model-00001-of-00001.safetensors")
    (ck / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    with pytest.raises(FormatError):
        lw.load_weights(ck)


# --- metadata is data, never code ---------------------------------------------------------------------------------
CODE = "__import__('os').system('touch {m}')"


def test_safetensors_metadata_strings_are_never_evaluated(tmp_path, marker):
    code = CODE.format(m=marker)
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(path), metadata={"format": "pt", "config": code, "eval": code})
    w = lw.load_weights(path)
    assert w.metadata["config"] == code and w.metadata["eval"] == code
    # the metadata's "config" string is not a config: with no config.json beside the file there is none
    assert w.config is None and not marker.exists()
    lw.plan({"w": w["w"].data()}).save(tmp_path / "o.safetensors", metadata=dict(w.metadata))
    assert lw.load_weights(tmp_path / "o.safetensors").metadata["config"] == code
    # a config.json beside it holding the same string: read as data, the string kept verbatim, nothing run
    (tmp_path / "config.json").write_text(json.dumps({"model_type": code, "hidden_size": 8}))
    cfg = lw.load_weights(path).config
    assert cfg.model_type == code and cfg.hidden_size == 8 and not marker.exists()


def test_gguf_metadata_strings_are_never_evaluated(tmp_path, marker):
    gguf = pytest.importorskip("gguf")
    code = CODE.format(m=marker)
    path = tmp_path / "m.gguf"
    g = gguf.GGUFWriter(str(path), "llama")
    g.add_string("general.name", code)
    g.add_string("tokenizer.chat_template", "{{ " + code + " }}")
    g.add_array("tokenizer.ggml.tokens", [code, "a"])
    g.add_uint32("llama.block_count", 1)
    g.add_tensor("blk.0.ffn_up.weight", np.ones((2, 2), np.float32))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    w = lw.load_weights(path)
    assert w.metadata["general.name"] == code and list(w.metadata["tokenizer.ggml.tokens"]) == [code, "a"]
    cfg = w.config  # builds a config from metadata: reads values, evaluates nothing
    assert cfg is not None
    lw.plan({n: a.data() for n, a in w.items()}).save(tmp_path / "o.gguf", metadata=w.metadata)
    assert lw.load_weights(tmp_path / "o.gguf").metadata["general.name"] == code


def test_cli_inspect_prints_metadata_verbatim(tmp_path, marker, capsys):
    from lazyweights.tools.cli import main

    code = CODE.format(m=marker)
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(path), metadata={"x": code})
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"]["x"] == code


# --- the package has no way to run code from a file -----------------------------------------------------------------
_FORBIDDEN_CALLS = {"eval", "exec", "__import__", "compile", "pickle.load", "pickle.loads", "pickle.Unpickler",
                    "marshal.load", "marshal.loads", "yaml.load", "yaml.unsafe_load", "np.load", "numpy.load",
                    "os.system", "os.popen", "dill.load", "dill.loads", "cloudpickle.load", "cloudpickle.loads",
                    "shelve.open", "torch.load"}
_FORBIDDEN_IMPORTS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal"}


def _package_sources():
    for root, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                with open(path, encoding="utf-8") as fh:
                    yield os.path.relpath(path, PACKAGE), fh.read()


def _dotted(node) -> str:
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _calls_and_imports(text):
    import ast

    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield "call", _dotted(node.func), node
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield "import", a.name.split(".")[0], node
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield "import", node.module.split(".")[0], node


def test_package_has_no_eval_exec_or_unpickling():
    """grep (code lines, comments stripped) and the AST agree: no eval/exec/pickle.load anywhere; the only
    torch.load is torch_pickle.py's weights-only one; subprocess only runs graphviz's `dot` (visualize.py)."""
    hits = []
    for rel, text in _package_sources():
        for i, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            for token in ("eval(", "exec(", "pickle.load"):
                if re.search(r"(?<![\w.])" + re.escape(token), code):  # (model.eval() is a method, fine)
                    hits.append(f"{rel}:{i}: {line.strip()}")
        for kind, name, node in _calls_and_imports(text):
            if kind == "call" and name in _FORBIDDEN_CALLS:
                if name == "torch.load" and rel == os.path.join("formats", "torch_pickle.py"):
                    continue
                hits.append(f"{rel}:{node.lineno}: calls {name}")
            if kind == "import" and name in _FORBIDDEN_IMPORTS:
                hits.append(f"{rel}:{node.lineno}: imports {name}")
            if kind == "import" and name == "subprocess" and rel != os.path.join("render", "visualize.py"):
                hits.append(f"{rel}:{node.lineno}: imports subprocess")
    assert hits == [], "\n".join(hits)


def test_torch_load_only_in_torch_pickle_and_only_weights_only():
    import ast

    calls = []
    for rel, text in _package_sources():
        for kind, name, node in _calls_and_imports(text):
            if kind == "call" and name == "torch.load":
                kw = {k.arg: k.value for k in node.keywords}
                calls.append(rel)
                assert rel == os.path.join("formats", "torch_pickle.py"), rel
                for key, want in (("weights_only", True), ("mmap", True)):
                    assert isinstance(kw.get(key), ast.Constant) and kw[key].value is want, (rel, key)
    assert calls == [os.path.join("formats", "torch_pickle.py")]


def test_adapter_code_runs_only_from_the_adapter_loader():
    """Running Python from a file is the adapter loader's job (the adapter is the user's own code); no
    other module imports code from paths."""
    for rel, text in _package_sources():
        if re.search(r"exec_module|spec_from_file_location|runpy\.", text):
            assert rel in (os.path.join("adapters", "loader.py"),), rel


def test_safetensors_header_json_is_parsed_not_evaluated(tmp_path, marker):
    """A header whose JSON is Python (not JSON) is a FormatError, not executed."""
    raw = f"{{'a': {CODE.format(m=marker)}}}".encode()
    p = tmp_path / "m.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(FormatError):
        lw.load_weights(p)
