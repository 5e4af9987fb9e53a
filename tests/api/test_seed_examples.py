"""Every code example of the two seed documents (../shared/seeds/), run against lazyweights.

Only the imports change: `from max.graph.weights import X` -> `from lazyweights import X`,
`from max.dtype import DType` -> `from lazyweights import DType`, and `transformers.AutoConfig` becomes a
`types.SimpleNamespace` config. Each example runs on a checkpoint the test writes with
`safetensors.numpy.save_file` (HF Llama-style names, fp16/bf16/f32 tensors, `.bias`, `.scales`,
`.k_scale`/`.v_scale`), and its result must equal, byte for byte, the same computation done eagerly with
numpy/ml_dtypes on tensors read straight from `safetensors.safe_open`.

Seed 000 (the `Weights` protocol) writes its examples against MAX's graph compiler (`Graph`,
`graph.weights()`, `graph.add_weight`), which is not part of a weights library: those lines are replaced
by a `load_weights(...)` object and the Weights-protocol parts run as written (marked `# CHANGED:`).
"""
from __future__ import annotations

import json
import types
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import lazyweights
from lazyweights import DType, WeightData, Weights, load_weights  # was: max.graph.weights / max.dtype

BF16 = np.dtype(ml_dtypes.bfloat16)

HIDDEN, HEADS, KV_HEADS, INTER, VOCAB, LAYERS = 64, 4, 2, 96, 40, 2
HEAD_DIM = HIDDEN // HEADS


# --- checkpoint and references ---------------------------------------------------------------------------
def _rnd(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.05 + 0.01
    return x.astype(dtype)


def llama_checkpoint(dtype_matrices=np.float16):
    """HF Llama names. Matrices in `dtype_matrices` (fp16 by default), bf16 MLP, f32 norms,
    fp16 `.bias` and `.scales`, 0-d f32 `.k_scale` / `.v_scale`."""
    t = {"model.embed_tokens.weight": _rnd((VOCAB, HIDDEN), dtype_matrices, 1)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        s = 100 * (i + 1)
        t[p + "input_layernorm.weight"] = _rnd((HIDDEN,), np.float32, s + 1)
        t[p + "self_attn.q_proj.weight"] = _rnd((HEADS * HEAD_DIM, HIDDEN), dtype_matrices, s + 2)
        t[p + "self_attn.q_proj.bias"] = _rnd((HEADS * HEAD_DIM,), np.float16, s + 3)
        t[p + "self_attn.k_proj.weight"] = _rnd((KV_HEADS * HEAD_DIM, HIDDEN), dtype_matrices, s + 4)
        t[p + "self_attn.k_proj.bias"] = _rnd((KV_HEADS * HEAD_DIM,), np.float16, s + 5)
        t[p + "self_attn.v_proj.weight"] = _rnd((KV_HEADS * HEAD_DIM, HIDDEN), dtype_matrices, s + 6)
        t[p + "self_attn.o_proj.weight"] = _rnd((HIDDEN, HEADS * HEAD_DIM), dtype_matrices, s + 7)
        t[p + "self_attn.k_scale"] = np.array(0.5 + i, dtype=np.float32)
        t[p + "self_attn.v_scale"] = np.array(0.25 + i, dtype=np.float32)
        t[p + "post_attention_layernorm.weight"] = _rnd((HIDDEN,), np.float32, s + 8)
        t[p + "mlp.gate_proj.weight"] = _rnd((INTER, HIDDEN), BF16, s + 9)
        t[p + "mlp.gate_proj.scales"] = _rnd((INTER, HIDDEN // 32), np.float16, s + 10)
        t[p + "mlp.up_proj.weight"] = _rnd((INTER, HIDDEN), dtype_matrices, s + 11)
        t[p + "mlp.down_proj.weight"] = _rnd((HIDDEN, INTER), dtype_matrices, s + 12)
    t["model.norm.weight"] = _rnd((HIDDEN,), np.float32, 2)
    t["lm_head.weight"] = _rnd((VOCAB, HIDDEN), dtype_matrices, 3)
    return t


@pytest.fixture(scope="module", params=["single", "sharded"])
def checkpoint(request, tmp_path_factory) -> list[Path]:
    """The checkpoint as the list of paths the seed passes to load_weights."""
    d = tmp_path_factory.mktemp("seed_ckpt")
    tensors = llama_checkpoint()
    if request.param == "single":
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        return [d / "model.safetensors"]
    names = list(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, group in enumerate((names[:half], names[half:])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in group}, str(d / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in group})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return [d / "model.safetensors.index.json"]


def eager_state_dict(paths) -> dict[str, np.ndarray]:
    """Every tensor read eagerly with safetensors.safe_open (the independent reference)."""
    files = []
    for p in paths:
        p = Path(p)
        if p.name.endswith(".index.json"):
            files += sorted({p.parent / f for f in json.loads(p.read_text())["weight_map"].values()})
        else:
            files.append(p)
    out = {}
    for f in files:
        with safe_open(str(f), framework="numpy") as fh:
            for k in fh.keys():
                out[k] = fh.get_tensor(k)
    return out


def raw(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_same_state(adapted: dict, expected: dict[str, np.ndarray]):
    """adapted (name -> WeightData) materializes to exactly `expected` (names, dtypes, shapes, bytes)."""
    assert sorted(adapted) == sorted(expected)
    for name, value in adapted.items():
        assert isinstance(value, WeightData), (name, type(value))
    got = lazyweights.plan(adapted).materialize()
    for name, exp in expected.items():
        exp = np.asarray(exp)
        wd = adapted[name]
        assert wd.dtype is DType.from_numpy(exp.dtype), name
        assert wd.shape == exp.shape, name
        arr = np.asarray(got[name])
        assert arr.dtype == exp.dtype, name
        assert arr.shape == exp.shape, (name, arr.shape, exp.shape)
        assert np.array_equal(raw(arr), raw(exp)), name
        # and each one on its own, through .data (the seed's materialization)
        one = np.asarray(wd.data)
        assert one.shape == exp.shape and np.array_equal(raw(one), raw(exp)), name


# =========================================================================================================
# Seed 001: "Write a weight adapter"
# =========================================================================================================

# ---- "Print the checkpoint" ------------------------------------------------------------------------------
def test_seed_print_the_checkpoint(checkpoint, capsys):
    # from pathlib import Path                       (unchanged)
    # from max.graph.weights import load_weights     -> from lazyweights import load_weights (module top)
    weights = load_weights(checkpoint)  # was: [Path("/path/to/model.safetensors")]
    for name, weight in weights.items():
        data = weight.data()
        shape = list(int(d) for d in data.shape)
        print(f"{name}: {shape} {data.dtype}")

    lines = capsys.readouterr().out.strip().splitlines()
    ref = eager_state_dict(checkpoint)
    expected = {f"{k}: {list(v.shape)} DType.{DType.from_numpy(v.dtype).name}" for k, v in ref.items()}
    assert set(lines) == expected and len(lines) == len(ref)
    assert "model.embed_tokens.weight: [40, 64] DType.float16" in lines
    assert "model.layers.0.mlp.gate_proj.weight: [96, 64] DType.bfloat16" in lines
    assert "model.layers.0.self_attn.k_scale: [] DType.float32" in lines


# ---- "Print the module state dictionary" -----------------------------------------------------------------
def test_seed_print_module_raw_state_dict(capsys):
    Module, LayerList = lazyweights.Module, lazyweights.LayerList  # the seed's own names, always exported
    Weight = lazyweights.Weight

    class Attention(Module):
        def __init__(self):
            super().__init__()
            self.q_proj = Module()
            self.q_proj.weight = Weight("weight", DType.bfloat16, (HIDDEN, HIDDEN))

    class Block(Module):
        def __init__(self):
            super().__init__()
            self.fc1 = Module()
            self.fc1.weight = Weight("weight", DType.bfloat16, (INTER, HIDDEN))
            self.fc2 = Module()
            self.fc2.weight = Weight("weight", DType.bfloat16, (HIDDEN, INTER))
            self.attention = Attention()

    class Model(Module):
        def __init__(self):
            super().__init__()
            self.layers = LayerList([Block() for _ in range(LAYERS)])

    model = Model()
    for name, weight in model.raw_state_dict().items():
        print(f"{name}: {weight.shape} {weight.dtype} {weight.quantization_encoding}")

    out = capsys.readouterr().out
    for i in range(LAYERS):
        assert f"layers.{i}.fc1.weight: " in out and f"layers.{i}.attention.q_proj.weight: " in out
    assert "DType.bfloat16 None" in out


# ---- "Name mapping" --------------------------------------------------------------------------------------
# from max.graph.weights import WeightData, Weights  -> from lazyweights import WeightData, Weights (top)

SAFETENSOR_MAPPING = {
    "model.": "",  # Strip this string
    "self_attn.q_proj": "attention.q_proj",  # Rename this string
}


def convert_safetensor_state_dict_names(
    state_dict: dict[str, Weights], **unused_kwargs
) -> dict[str, WeightData]:
    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()
    return new_state_dict


def _eager_rename(ref):
    out = {}
    for k, v in ref.items():
        name = k
        for before, after in SAFETENSOR_MAPPING.items():
            name = name.replace(before, after)
        out[name] = v
    return out


def test_seed_name_mapping(checkpoint):
    weights = load_weights(checkpoint)
    adapted = convert_safetensor_state_dict_names(dict(weights.items()))
    assert "layers.0.attention.q_proj.weight" in adapted and "embed_tokens.weight" in adapted
    assert not any(k.startswith("model.") for k in adapted)
    assert_same_state(adapted, _eager_rename(eager_state_dict(checkpoint)))


# ---- "Dtype casting" -------------------------------------------------------------------------------------
# from max.dtype import DType                        -> from lazyweights import DType (top)
# from max.graph.weights import WeightData, Weights  -> from lazyweights import WeightData, Weights (top)

def convert_safetensor_state_dict_cast(
    state_dict: dict[str, Weights], **unused_kwargs
) -> dict[str, WeightData]:
    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():  # defined earlier
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()

    # Cast weights to a dtype the kernel supports
    for key, weight_data in new_state_dict.items():
        if weight_data.dtype == DType.float16 and not (
            key.endswith("bias") or key.endswith("scales")
        ):
            new_state_dict[key] = weight_data.astype(DType.bfloat16)
    return new_state_dict


def test_seed_dtype_casting(checkpoint):
    weights = load_weights(checkpoint)
    adapted = convert_safetensor_state_dict_cast(dict(weights.items()))
    expected = {}
    for k, v in _eager_rename(eager_state_dict(checkpoint)).items():
        if v.dtype == np.float16 and not (k.endswith("bias") or k.endswith("scales")):
            v = v.astype(BF16)  # ml_dtypes: round to nearest even
        expected[k] = v
    # the seed's intent, spelled out: fp16 matrices became bf16, biases/scales/f32 norms are untouched
    assert adapted["layers.0.attention.q_proj.weight"].dtype is DType.bfloat16
    assert adapted["layers.0.attention.q_proj.bias"].dtype is DType.float16
    assert adapted["layers.0.mlp.gate_proj.scales"].dtype is DType.float16
    assert adapted["layers.0.input_layernorm.weight"].dtype is DType.float32
    assert_same_state(adapted, expected)


# ---- "Remove unused weights" -----------------------------------------------------------------------------
UNUSED_SUFFIXES = (".k_scale", ".v_scale")


def convert_safetensor_state_dict_drop(
    state_dict: dict[str, Weights], **unused_kwargs
) -> dict[str, WeightData]:
    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():  # defined earlier
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()

    # Drop FP8 KV-cache scales
    for key in list(new_state_dict):
        if key.endswith(UNUSED_SUFFIXES):
            del new_state_dict[key]
    return new_state_dict


def test_seed_remove_unused_weights(checkpoint):
    weights = load_weights(checkpoint)
    adapted = convert_safetensor_state_dict_drop(dict(weights.items()))
    expected = {k: v for k, v in _eager_rename(eager_state_dict(checkpoint)).items() if not k.endswith(UNUSED_SUFFIXES)}
    assert not any(k.endswith(UNUSED_SUFFIXES) for k in adapted)
    assert_same_state(adapted, expected)


def test_seed_dropped_scales_are_never_read(checkpoint):
    """Dropping happens before anything is read: the k/v scales are not in the plan at all."""
    weights = load_weights(checkpoint)
    adapted = convert_safetensor_state_dict_drop(dict(weights.items()))
    plan = lazyweights.plan(adapted)
    sources = {n.arg.name for n in plan.nodes() if n.op == "source"}
    assert not any(s.endswith(UNUSED_SUFFIXES) for s in sources)
    assert len(sources) == len(adapted)


# ---- "Tensor transformations": the RoPE permutation ------------------------------------------------------
def build_rope_perm(head_dim):
    """The architecture-specific helper the seed leaves undefined: interleaved -> half-split RoPE rows
    (the benchmark workload's `rope_perm`)."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


# import numpy as np                                  (unchanged)
# from max.graph.weights import WeightData, Weights   -> from lazyweights import WeightData, Weights (top)
# from transformers import AutoConfig                 -> AutoConfig = types.SimpleNamespace
AutoConfig = types.SimpleNamespace


def convert_safetensor_state_dict(
    state_dict: dict[str, Weights],
    huggingface_config: AutoConfig,
    **unused_kwargs,
) -> dict[str, WeightData]:
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


def hf_config(**overrides):
    cfg = dict(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
               intermediate_size=INTER, num_hidden_layers=LAYERS, vocab_size=VOCAB)
    cfg.update(overrides)
    return types.SimpleNamespace(**cfg)


def _eager_rope(ref, num_heads, num_kv_heads):
    perm = build_rope_perm(HIDDEN // num_heads)
    out = {}
    for k, v in _eager_rename(ref).items():
        if k.endswith("q_proj.weight") or k.endswith("k_proj.weight"):
            heads = num_heads if k.endswith("q_proj.weight") else num_kv_heads
            v = v.reshape(heads, HIDDEN // num_heads, -1)[:, perm, :].reshape(heads * (HIDDEN // num_heads), -1)
        out[k] = v
    return out


def test_seed_rope_permutation(checkpoint):
    weights = load_weights(checkpoint)
    adapted = convert_safetensor_state_dict(dict(weights.items()), huggingface_config=hf_config())
    expected = _eager_rope(eager_state_dict(checkpoint), HEADS, KV_HEADS)
    assert_same_state(adapted, expected)
    # the permutation really moved rows (the test data is not symmetric)
    ref = eager_state_dict(checkpoint)["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(raw(expected["layers.0.attention.q_proj.weight"]), raw(ref))


def test_seed_rope_permutation_without_num_key_value_heads(checkpoint):
    cfg = hf_config()
    del cfg.num_key_value_heads  # getattr(..., num_heads) fallback: MHA
    d = Path(checkpoint[0]).parent
    mha = llama_checkpoint()
    for k in list(mha):
        if k.endswith("k_proj.weight"):
            mha[k] = _rnd((HEADS * HEAD_DIM, HIDDEN), np.float16, hash(k) % 1000)
    path = d.parent / (d.name + "_mha.safetensors")
    save_file(mha, str(path))
    adapted = convert_safetensor_state_dict(dict(load_weights([path]).items()), huggingface_config=cfg)
    assert_same_state(adapted, _eager_rope(eager_state_dict([path]), HEADS, HEADS))


# ---- "Correctness checks" --------------------------------------------------------------------------------
def test_seed_correctness_checks(checkpoint, capsys):
    # from pathlib import Path                                       (unchanged)
    # from max.graph.weights import load_weights                     -> from lazyweights import load_weights
    # from transformers import AutoConfig                            -> SimpleNamespace config
    # from my_arch.weight_adapters import convert_safetensor_state_dict  -> defined above in this file
    weights = load_weights(checkpoint)  # was: [Path("/path/to/model.safetensors")]
    hf_config_ = hf_config()  # was: AutoConfig.from_pretrained("org/model-id")
    adapted = convert_safetensor_state_dict(
        dict(weights.items()),
        huggingface_config=hf_config_,
    )
    for name in sorted(adapted):
        print(name)

    printed = capsys.readouterr().out.strip().splitlines()
    expected = _eager_rope(eager_state_dict(checkpoint), HEADS, KV_HEADS)
    assert printed == sorted(expected)
    assert_same_state(adapted, expected)


# ---- registration: weight_adapters keyed by WeightsFormat ------------------------------------------------
def test_seed_weight_adapters_registration(checkpoint):
    from lazyweights import WeightsFormat, weights_format  # was: from max.graph.weights import ...

    def convert_gguf_state_dict(state_dict, **unused_kwargs):  # the seed names it; GGUF is not tested here
        return {k: v.data() for k, v in state_dict.items()}

    weight_adapters = types.SimpleNamespace(
        convert_safetensor_state_dict=convert_safetensor_state_dict,
        convert_gguf_state_dict=convert_gguf_state_dict,
    )
    arch = dict(
        weight_adapters={
            WeightsFormat.safetensors: weight_adapters.convert_safetensor_state_dict,
            WeightsFormat.gguf: weight_adapters.convert_gguf_state_dict,
        },
    )
    # "MAX identifies the checkpoint format, selects the corresponding adapter, and provides it"
    fmt = weights_format(checkpoint)
    assert fmt is WeightsFormat.safetensors
    adapter = arch["weight_adapters"][fmt]
    adapted = adapter(dict(load_weights(checkpoint).items()), huggingface_config=hf_config())
    assert_same_state(adapted, _eager_rope(eager_state_dict(checkpoint), HEADS, KV_HEADS))


def test_seed_all_adapters_compose_lazily(checkpoint):
    """The seed's transformations together, without materializing: rename + cast + drop, lazily."""
    weights = load_weights(checkpoint)
    adapted = convert_safetensor_state_dict_drop(dict(weights.items()))
    for key, weight_data in list(adapted.items()):
        if weight_data.dtype == DType.float16 and not (key.endswith("bias") or key.endswith("scales")):
            adapted[key] = weight_data.astype(DType.bfloat16)
    expected = {}
    for k, v in _eager_rename(eager_state_dict(checkpoint)).items():
        if k.endswith(UNUSED_SUFFIXES):
            continue
        if v.dtype == np.float16 and not (k.endswith("bias") or k.endswith("scales")):
            v = v.astype(BF16)
        expected[k] = v
    assert_same_state(adapted, expected)


# =========================================================================================================
# Seed 000: the Weights protocol
# =========================================================================================================
@pytest.fixture
def transformer_ckpt(tmp_path):
    """Names the seed-000 examples use, with the shapes they allocate."""
    t = {
        "transformer.layers.0.attention.weight": _rnd((768, 768), np.float32, 1),
        "transformer.layers.0.mlp.weight": _rnd((768, 3072), np.float32, 2),
        "transformer.layers.1.attention.weight": _rnd((768, 768), np.float32, 3),
        "transformer.layers.10.attention.weight": _rnd((8,), np.float32, 4),
        "model.layers.0.weight": _rnd((768, 768), np.float32, 5),
        "model.embeddings.weight": _rnd((100, 768), BF16, 6),
        "model.classifier.weight": _rnd((10, 768), np.float32, 7),
    }
    path = tmp_path / "model.safetensors"
    save_file(t, str(path))
    return path, t


def test_seed_weights_class_example(transformer_ckpt):
    path, t = transformer_ckpt
    # from max.graph import Graph      -> CHANGED: no Graph: weights come from load_weights
    # from max.dtype import DType      -> from lazyweights import DType (top)
    # graph = Graph("my_model")        -> CHANGED: not run (MAX graph compiler)
    weights = load_weights([path])  # CHANGED: was graph.weights()

    # Allocate weights with hierarchical naming
    attn_weight = weights.transformer.layers[0].attention.weight.allocate(
        dtype=DType.float32,
        shape=(768, 768)
    )
    # Creates weight named "transformer.layers.0.attention.weight"
    assert attn_weight.name == "transformer.layers.0.attention.weight"
    assert attn_weight.dtype is DType.float32 and attn_weight.shape == (768, 768)

    # Check if a weight exists before allocating
    mlp_weight = None
    if weights.transformer.layers[0].mlp.weight.exists():
        mlp_weight = weights.transformer.layers[0].mlp.weight.allocate(
            dtype=DType.float16,
            shape=(768, 3072)
        )
    assert mlp_weight is not None and mlp_weight.dtype is DType.float16 and mlp_weight.shape == (768, 3072)

    alloc = weights.allocated_weights
    assert set(alloc) == {"transformer.layers.0.attention.weight", "transformer.layers.0.mlp.weight"}
    with safe_open(str(path), framework="numpy") as fh:
        ref_attn = fh.get_tensor("transformer.layers.0.attention.weight")
        ref_mlp = fh.get_tensor("transformer.layers.0.mlp.weight")
    assert np.array_equal(raw(alloc["transformer.layers.0.attention.weight"]), raw(ref_attn))
    got_mlp = np.asarray(alloc["transformer.layers.0.mlp.weight"])
    assert got_mlp.dtype == np.float16 and got_mlp.shape == (768, 3072)
    assert np.array_equal(raw(got_mlp), raw(ref_mlp.astype(np.float16)))


def test_seed_allocate_example(transformer_ckpt):
    from lazyweights import DeviceRef  # was: from max.graph import DeviceRef
    path, t = transformer_ckpt
    weights = load_weights([path])  # CHANGED: was graph.weights()

    # Allocate a weight with specific configuration
    weight = weights.model.layers[0].weight.allocate(
        dtype=DType.float16,  # Convert to half precision
        shape=(768, 768),
        device=DeviceRef.GPU(0)  # Place on first GPU
    )

    # Add to graph
    # with graph:                                    CHANGED: not run (MAX graph compiler)
    #     weight_tensor = graph.add_weight(weight)
    assert weight.name == "model.layers.0.weight" and weight.dtype is DType.float16
    assert weight.shape == (768, 768) and weight.device == DeviceRef.GPU(0)
    assert weight.quantization_encoding is None
    # The values (checked on the host through the allocation's lazy source; `allocated_weights` would
    # materialize a GPU allocation on the GPU, which this test does not assume exists).
    got = weight.source.to_numpy()
    assert np.array_equal(raw(got), raw(t["model.layers.0.weight"].astype(np.float16)))
    cpu = weights.model.layers[0].weight.allocate(dtype=DType.float16, shape=(768, 768))
    assert np.array_equal(raw(weights.allocated_weights[cpu.name]), raw(got))


def test_seed_allocated_weights_only_explicit(transformer_ckpt):
    path, t = transformer_ckpt
    weights = load_weights([path])
    weights.model.classifier.weight.allocate()
    # "This only includes weights that were explicitly allocated using Weights.allocate()"
    assert list(weights.allocated_weights) == ["model.classifier.weight"]
    assert np.array_equal(raw(weights.allocated_weights["model.classifier.weight"]), raw(t["model.classifier.weight"]))


def test_seed_data_example(transformer_ckpt, capsys):
    path, t = transformer_ckpt
    weights = load_weights([path])

    weight_data = weights.model.embeddings.weight.data()
    print(f"Shape: {weight_data.shape}")
    print(f"Dtype: {weight_data.dtype}")

    # Convert to different dtype
    fp16_data = weight_data.astype(DType.float16)

    out = capsys.readouterr().out
    assert "Shape: (100, 768)" in out and "Dtype: DType.bfloat16" in out
    assert weight_data.name == "model.embeddings.weight" and weight_data.quantization_encoding is None
    assert fp16_data.dtype is DType.float16
    assert np.array_equal(raw(fp16_data.data), raw(t["model.embeddings.weight"].astype(np.float16)))
    # "Raises: KeyError - If no weight exists at the current hierarchical name."
    with pytest.raises(KeyError):
        weights.model.embedding.weight.data()


@pytest.mark.parametrize("present", [True, False])
def test_seed_exists_example(tmp_path, transformer_ckpt, capsys, present):
    path, t = transformer_ckpt
    if not present:
        t = {k: v for k, v in t.items() if k != "model.classifier.weight"}
        path = tmp_path / "noclassifier.safetensors"
        save_file(t, str(path))
    weights = load_weights([path])

    classifier = None
    if weights.model.classifier.weight.exists():
        classifier = weights.model.classifier.weight.allocate()  # CHANGED: the seed's `allocate(...)` placeholder
    else:
        print("Classifier weight not found")

    if present:
        assert classifier is not None and classifier.shape == (10, 768)
        assert capsys.readouterr().out == ""
    else:
        assert classifier is None and capsys.readouterr().out == "Classifier weight not found\n"


def test_seed_items_example(transformer_ckpt, capsys):
    path, t = transformer_ckpt
    weights = load_weights([path])

    # Iterate through all weights in a specific layer
    for name, weight in weights.transformer.layers[0].items():  # noqa: B007 - the seed's example, verbatim
        print(f"Found weight: {name}")

    out = capsys.readouterr().out.strip().splitlines()
    assert sorted(out) == ["Found weight: attention.weight", "Found weight: mlp.weight"]
    # on dot boundaries: layers[1] is not layers.10
    assert [n for n, _ in weights.transformer.layers[1].items()] == ["attention.weight"]


def test_seed_name_property(transformer_ckpt):
    path, _ = transformer_ckpt
    weights = load_weights([path])
    assert weights.model.layers[0].name == "model.layers.0"
    assert weights.transformer.layers[0].attention.weight.name == "transformer.layers.0.attention.weight"
