"""The seed's RoPE-permute adapter, rewritten lazily with WeightData ops, against the seed's eager numpy.

The seed materializes each q/k projection (`np.from_dlpack(weight_data.data)`), permutes it with numpy and
wraps it back with `WeightData.from_numpy`. The lazy rewrite does the same with `reshape`, `[:, perm, :]`
and `reshape` on the WeightData itself and reads nothing until materialized. Both must give identical
bytes, on float32 checkpoints and on bfloat16 ones, where the eager reference works on a
`.view(np.uint16)` the way MAX users do (numpy has no bf16 DLPack import).
"""
from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import lazyweights
from lazyweights import DType, WeightData, Weights, load_weights

BF16 = np.dtype(ml_dtypes.bfloat16)

SAFETENSOR_MAPPING = {
    "model.": "",  # Strip this string
    "self_attn.q_proj": "attention.q_proj",  # Rename this string
}


def build_rope_perm(head_dim):
    """Interleaved -> half-split RoPE rows (the benchmark workload's rope_perm)."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def _config(hidden, heads, kv_heads):
    return types.SimpleNamespace(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads)


def _rename(name):
    for before, after in SAFETENSOR_MAPPING.items():
        name = name.replace(before, after)
    return name


# --- the seed's eager adapter (verbatim body; float32 / float16 checkpoints) ------------------------------
def convert_seed_eager(state_dict: dict[str, Weights], huggingface_config, **unused_kwargs) -> dict[str, WeightData]:
    num_heads = huggingface_config.num_attention_heads
    head_dim = huggingface_config.hidden_size // num_heads
    num_kv_heads = getattr(
        huggingface_config, "num_key_value_heads", num_heads
    )
    rope_perm = build_rope_perm(head_dim)  # architecture-specific helper

    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():  # defined earlier
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()

    # Permute weights
    for key, weight_data in new_state_dict.items():
        if key.endswith("q_proj.weight"):
            heads = num_heads
        elif key.endswith("k_proj.weight"):
            heads = num_kv_heads
        else:
            continue
        arr = np.from_dlpack(weight_data.data)
        arr = arr.reshape(heads, head_dim, -1)
        arr = arr[:, rope_perm, :]
        arr = np.ascontiguousarray(arr.reshape(heads * head_dim, -1))
        new_state_dict[key] = WeightData.from_numpy(arr, key)
    return new_state_dict


# --- the same, eager, for bfloat16 the way MAX users do it: bits in a uint16 array ------------------------
def convert_seed_eager_bf16(path, huggingface_config) -> dict[str, WeightData]:
    num_heads = huggingface_config.num_attention_heads
    head_dim = huggingface_config.hidden_size // num_heads
    num_kv_heads = getattr(huggingface_config, "num_key_value_heads", num_heads)
    rope_perm = build_rope_perm(head_dim)
    new_state_dict: dict[str, WeightData] = {}
    with safe_open(str(path), framework="numpy") as fh:
        for checkpoint_name in fh.keys():
            key = _rename(checkpoint_name)
            t = fh.get_tensor(checkpoint_name)
            if t.dtype != BF16 or not key.endswith(("q_proj.weight", "k_proj.weight")):
                new_state_dict[key] = WeightData.from_numpy(t, key)
                continue
            heads = num_heads if key.endswith("q_proj.weight") else num_kv_heads
            arr = t.view(np.uint16)  # numpy has no bfloat16: work on the bits
            arr = arr.reshape(heads, head_dim, -1)
            arr = arr[:, rope_perm, :]
            arr = np.ascontiguousarray(arr.reshape(heads * head_dim, -1))
            new_state_dict[key] = WeightData(arr, key, DType.bfloat16, arr.shape)  # the seed's constructor
    return new_state_dict


# --- the lazy rewrite -------------------------------------------------------------------------------------
def convert_lazy(state_dict: dict[str, Weights], huggingface_config, **unused_kwargs) -> dict[str, WeightData]:
    num_heads = huggingface_config.num_attention_heads
    head_dim = huggingface_config.hidden_size // num_heads
    num_kv_heads = getattr(huggingface_config, "num_key_value_heads", num_heads)
    rope_perm = build_rope_perm(head_dim)

    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        new_state_dict[_rename(checkpoint_name)] = value.data()

    for key, weight_data in new_state_dict.items():
        if key.endswith("q_proj.weight"):
            heads = num_heads
        elif key.endswith("k_proj.weight"):
            heads = num_kv_heads
        else:
            continue
        w = weight_data.reshape(heads, head_dim, -1)
        w = w[:, rope_perm, :]
        new_state_dict[key] = w.reshape(heads * head_dim, -1)
    return new_state_dict


# --- checkpoints ------------------------------------------------------------------------------------------
def write_checkpoint(path, dtype, hidden, heads, kv_heads, layers=2, seed=0):
    rng = np.random.default_rng(seed)
    hd = hidden // heads

    def r(*shape):
        return (rng.standard_normal(shape).astype(np.float32) * 0.05).astype(dtype)

    t = {"model.embed_tokens.weight": r(32, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = r(heads * hd, hidden)
        t[p + "self_attn.k_proj.weight"] = r(kv_heads * hd, hidden)
        t[p + "self_attn.v_proj.weight"] = r(kv_heads * hd, hidden)
        t[p + "self_attn.o_proj.weight"] = r(hidden, heads * hd)
        t[p + "input_layernorm.weight"] = rng.standard_normal(hidden).astype(np.float32)
    t["model.norm.weight"] = rng.standard_normal(hidden).astype(np.float32)
    save_file(t, str(path))
    return t


def raw(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_same_states(lazy: dict, eager: dict):
    assert sorted(lazy) == sorted(eager)
    got = lazyweights.plan(lazy).materialize()
    ref = lazyweights.plan(eager).materialize()
    for k in eager:
        assert lazy[k].dtype is eager[k].dtype and lazy[k].shape == eager[k].shape, k
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape, k
        assert np.array_equal(raw(got[k]), raw(ref[k])), k


SHAPES = [(64, 4, 4), (64, 4, 2), (96, 6, 1), (128, 8, 2)]


@pytest.mark.parametrize("hidden,heads,kv_heads", SHAPES)
def test_lazy_rope_equals_seed_eager_float32(tmp_path, hidden, heads, kv_heads):
    path = tmp_path / "m.safetensors"
    write_checkpoint(path, np.float32, hidden, heads, kv_heads)
    cfg = _config(hidden, heads, kv_heads)
    eager = convert_seed_eager(dict(load_weights([path]).items()), huggingface_config=cfg)
    lazy = convert_lazy(dict(load_weights([path]).items()), huggingface_config=cfg)
    assert_same_states(lazy, eager)


@pytest.mark.parametrize("hidden,heads,kv_heads", SHAPES)
def test_lazy_rope_equals_seed_eager_bfloat16(tmp_path, hidden, heads, kv_heads):
    path = tmp_path / "m.safetensors"
    write_checkpoint(path, BF16, hidden, heads, kv_heads, seed=1)
    cfg = _config(hidden, heads, kv_heads)
    eager = convert_seed_eager_bf16(path, cfg)
    lazy = convert_lazy(dict(load_weights([path]).items()), huggingface_config=cfg)
    assert lazy["layers.0.attention.q_proj.weight"].dtype is DType.bfloat16
    assert_same_states(lazy, eager)


def test_lazy_rope_float16_seed_verbatim_and_cast_after(tmp_path):
    """fp16 goes through the seed's own np.from_dlpack path; a cast after the permute commutes with it."""
    path = tmp_path / "m.safetensors"
    tensors = write_checkpoint(path, np.float16, 64, 4, 2, seed=2)
    cfg = _config(64, 4, 2)
    eager = convert_seed_eager(dict(load_weights([path]).items()), huggingface_config=cfg)
    lazy = convert_lazy(dict(load_weights([path]).items()), huggingface_config=cfg)
    assert_same_states(lazy, eager)
    perm = build_rope_perm(16)
    q = tensors["model.layers.1.self_attn.q_proj.weight"]
    expected = q.reshape(4, 16, -1)[:, perm, :].reshape(64, -1).astype(BF16)
    got = lazy["layers.1.attention.q_proj.weight"].astype(DType.bfloat16).to_numpy()
    assert got.dtype == BF16 and np.array_equal(raw(got), raw(expected))


def test_lazy_rope_reads_nothing_until_materialized(tmp_path, monkeypatch):
    from lazyweights.formats.source import SourceFile, TensorRecord

    path = tmp_path / "m.safetensors"
    write_checkpoint(path, BF16, 64, 4, 2)
    weights = load_weights([path])
    calls = []
    orig_view, orig_array = SourceFile.view, TensorRecord.array
    monkeypatch.setattr(SourceFile, "view", lambda self, *a, **k: calls.append("view") or orig_view(self, *a, **k))
    monkeypatch.setattr(TensorRecord, "array", lambda self, *a, **k: calls.append("array") or orig_array(self, *a, **k))
    lazy = convert_lazy(dict(weights.items()), huggingface_config=_config(64, 4, 2))
    plan = lazyweights.plan(lazy)
    ops = {n.op for n in plan.nodes()}
    assert calls == []
    assert "const" not in ops and ops <= {"source", "reshape", "take", "permute", "slice"}
    # one gather per projection, on the head_dim axis, with the RoPE permutation
    takes = [n for n in plan.nodes() if n.op == "take"]
    assert len(takes) == 4 and all(list(n.arg[1].array) == list(build_rope_perm(16)) for n in takes)
    plan.materialize()
    assert calls  # and now it did read


def test_rope_permutation_is_really_a_permutation(tmp_path):
    """The permuted rows are the original rows, reordered within each head (checked row by row)."""
    path = tmp_path / "m.safetensors"
    tensors = write_checkpoint(path, np.float32, 64, 4, 2, seed=3)
    lazy = convert_lazy(dict(load_weights([path]).items()), huggingface_config=_config(64, 4, 2))
    k = tensors["model.layers.0.self_attn.k_proj.weight"]
    got = lazy["layers.0.self_attn.k_proj.weight"].to_numpy()
    perm = build_rope_perm(16)
    for h in range(2):
        for i, src_row in enumerate(perm):
            assert np.array_equal(got[h * 16 + i], k[h * 16 + src_row])
