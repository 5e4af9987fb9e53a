"""shard(): each rank's slices equal numpy's slices of the full materialization, the ranks together make the
whole, and bad splits are named errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lazyweights as lw


def _bf(rng, *shape):
    return (rng.standard_normal(shape) + 0.25).astype(np.float32).astype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, write_safetensors):
    """A Llama-named bf16 checkpoint with biases and four per-expert MLPs, plus its full materialization."""
    rng = np.random.default_rng(11)
    h, inter, vocab = 16, 32, 24
    t = {"model.embed_tokens.weight": _bf(rng, vocab, h), "lm_head.weight": _bf(rng, vocab, h),
         "model.norm.weight": _bf(rng, h)}
    p = "model.layers.0."
    for proj, shape in (("q_proj", (h, h)), ("k_proj", (8, h)), ("v_proj", (8, h)), ("o_proj", (h, h))):
        t[p + f"self_attn.{proj}.weight"] = _bf(rng, *shape)
    t[p + "self_attn.q_proj.bias"] = _bf(rng, h)
    t[p + "self_attn.o_proj.bias"] = _bf(rng, h)
    for proj, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        t[p + f"mlp.{proj}.weight"] = _bf(rng, *shape)
    for e in range(4):
        t[f"model.layers.1.mlp.experts.{e}.down_proj.weight"] = _bf(rng, h, inter)
    t["model.layers.1.mlp.gate.weight"] = _bf(rng, 4, h)
    path = tmp_path_factory.mktemp("shard") / "model.safetensors"
    write_safetensors(path, t)
    weights = lw.load_weights([str(path)])
    sd = {k: v.data() for k, v in weights.items()}
    return sd, {k: v.to_numpy() for k, v in sd.items()}


AXIS = {"q_proj.weight": 0, "k_proj.weight": 0, "v_proj.weight": 0, "q_proj.bias": 0, "o_proj.weight": 1,
        "o_proj.bias": None, "gate_proj.weight": 0, "up_proj.weight": 0, "mlp.down_proj.weight": 1,
        "embed_tokens.weight": 0, "lm_head.weight": 0, "norm.weight": None, "gate.weight": None}


def _expected_axis(name):
    for suffix, axis in AXIS.items():
        if name.endswith(suffix):
            return axis
    raise AssertionError(name)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_rank_holds_numpys_slice_and_the_ranks_make_the_whole(checkpoint, world):
    sd, full = checkpoint
    parts = [lw.plan(lw.shard(sd, r, world)).materialize() for r in range(world)]
    for name, value in full.items():
        if ".experts." in name:
            e = int(name.split(".experts.")[1].split(".")[0])
            owners = [r for r in range(world) if name in parts[r]]
            assert owners == [e // (4 // world)], (name, owners)
            np.testing.assert_array_equal(np.asarray(parts[owners[0]][name]).view(np.uint16), value.view(np.uint16))
            continue
        axis = _expected_axis(name)
        got = [np.asarray(p[name]) for p in parts]
        if axis is None:
            for g in got:
                np.testing.assert_array_equal(g.view(np.uint16), value.view(np.uint16), err_msg=name)
            continue
        step = value.shape[axis] // world
        for r, g in enumerate(got):
            want = np.take(value, range(r * step, (r + 1) * step), axis=axis)
            np.testing.assert_array_equal(g.view(np.uint16), want.view(np.uint16), err_msg=f"{name} rank {r}")
        np.testing.assert_array_equal(np.concatenate(got, axis=axis).view(np.uint16), value.view(np.uint16))


def test_custom_rules_come_first_and_strict_names_the_unmatched(checkpoint):
    sd, full = checkpoint
    part = lw.shard(sd, 1, 2, rules={"*norm.weight": 0, "*lm_head.weight": None})
    np.testing.assert_array_equal(part["model.norm.weight"].to_numpy().view(np.uint16),
                                  full["model.norm.weight"][8:].view(np.uint16))
    assert part["lm_head.weight"].shape == full["lm_head.weight"].shape
    with pytest.raises(lw.UsageError, match=r"no rule matches 'model.norm.weight'"):
        lw.shard({"model.norm.weight": sd["model.norm.weight"]}, 0, 2, strict=True)


def test_bad_splits_are_named_errors(checkpoint):
    sd, _ = checkpoint
    with pytest.raises(lw.ShapeError, match=r"'model.layers.0.self_attn.k_proj.weight': axis 0 has size 8, "
                                            r"not divisible by world_size 3"):
        lw.shard({"model.layers.0.self_attn.k_proj.weight": sd["model.layers.0.self_attn.k_proj.weight"]}, 0, 3)
    with pytest.raises(lw.UsageError, match=r"rank must be in 0..3 for world_size 4, got 4"):
        lw.shard(sd, 4, 4)
    with pytest.raises(lw.UsageError, match="world_size must be a positive integer"):
        lw.shard(sd, 0, 0)
    with pytest.raises(lw.ShapeError, match=r"'model.norm.weight' has shape \[16\]: no axis 1"):
        lw.shard({"model.norm.weight": sd["model.norm.weight"]}, 0, 2, rules={"*": 1})
    with pytest.raises(lw.UsageError, match=r"gives axis 'rows'"):
        lw.shard(sd, 0, 2, rules={"*": "rows"})
    with pytest.raises(lw.ShapeError, match="4 experts cannot be split evenly over world_size 3"):
        lw.shard({k: v for k, v in sd.items() if "experts" in k}, 0, 3)


def test_quantized_tensors_split_by_rows_and_never_inside_blocks(tmp_path):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(5)
    values = (rng.standard_normal((8, 128)) + 0.1).astype(np.float32)
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for name in ("blk.0.attn_q.weight", "blk.0.attn_output.weight"):
        w.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    sd = {k: v.data() for k, v in lw.load_weights([str(path)]).items()}
    full = sd["blk.0.attn_q.weight"].dequantize().to_numpy()
    for r in range(4):
        got = lw.shard({"blk.0.attn_q.weight": sd["blk.0.attn_q.weight"]}, r, 4)["blk.0.attn_q.weight"]
        np.testing.assert_array_equal(got.dequantize().to_numpy(), full[r * 2:(r + 1) * 2])
    with pytest.raises(lw.ShapeError, match=r"'blk.0.attn_output.weight' is Q8_0-quantized along axis 1"):
        lw.shard(sd, 0, 4)
    deq = {"blk.0.attn_output.weight": sd["blk.0.attn_output.weight"].dequantize()}
    np.testing.assert_array_equal(lw.shard(deq, 3, 4)["blk.0.attn_output.weight"].to_numpy(), full[:, 96:])
