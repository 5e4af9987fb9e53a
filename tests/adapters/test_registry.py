"""The architecture registry: registration, lookup errors, format detection and adapter dispatch."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lazyweights import DType, WeightData, WeightsFormat
from lazyweights.adapters.registry import (
    NoAdapterError,
    SupportedArchitecture,
    UnknownArchitectureError,
    adapt,
    architectures,
    get,
    register,
    unregister,
)
from lazyweights.core.errors import FormatError, LazyWeightsError


@pytest.fixture(autouse=True)
def clean_registry():
    """Leave the registry as each test found it: added names removed, replaced built-ins put back."""
    before = architectures()
    yield
    for name, arch in architectures().items():
        if name not in before:
            unregister(name)
        elif arch is not before[name]:
            register(before[name], replace=True)


def strip_model_prefix(state_dict, **kwargs):
    out = {k.replace("model.", ""): v.data() for k, v in state_dict.items()}
    for k, v in out.items():
        if v.dtype == DType.float16:
            out[k] = v.astype(DType.bfloat16)
    return out


def gguf_adapter(state_dict, **kwargs):
    return {f"gguf.{k}": v.data() for k, v in state_dict.items()}


@pytest.fixture()
def st_ckpt(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"model.layers.0.w": np.arange(6, dtype=np.float16).reshape(2, 3),
               "model.norm.weight": np.ones(3, np.float32)}, str(path))
    return path


def test_register_and_get():
    arch = SupportedArchitecture("TinyForCausalLM", weight_adapters={WeightsFormat.safetensors: strip_model_prefix},
                                 example_repo_ids=["org/tiny"], task="generate")
    assert register(arch) is arch
    assert get("TinyForCausalLM") is arch
    assert arch.example_repo_ids == ["org/tiny"] and arch.task == "generate"  # extra fields kept
    assert "TinyForCausalLM" in architectures()
    register(arch)  # the same object again is fine
    with pytest.raises(LazyWeightsError, match="already registered; pass replace=True"):
        register(SupportedArchitecture("TinyForCausalLM"))
    other = SupportedArchitecture("TinyForCausalLM")
    assert register(other, replace=True) is other and get("TinyForCausalLM") is other


def test_unknown_architecture_error():
    register(SupportedArchitecture("LlamaForCausalLM", weight_adapters={"safetensors": strip_model_prefix}))
    with pytest.raises(UnknownArchitectureError) as info:
        get("LlamaForCausalLn")
    assert isinstance(info.value, KeyError) and isinstance(info.value, LazyWeightsError)
    assert "no architecture named 'LlamaForCausalLn' is registered" in str(info.value)
    assert "Did you mean 'LlamaForCausalLM'" in str(info.value)  # the built-in names may follow it


def test_bad_definitions():
    with pytest.raises(LazyWeightsError, match="'onnx' is not a WeightsFormat"):
        SupportedArchitecture("X", weight_adapters={"onnx": strip_model_prefix})
    with pytest.raises(LazyWeightsError, match="not a function"):
        SupportedArchitecture("X", weight_adapters={WeightsFormat.gguf: "convert"})
    with pytest.raises(LazyWeightsError, match="non-empty name"):
        SupportedArchitecture("")
    with pytest.raises(LazyWeightsError, match="takes a SupportedArchitecture"):
        register("X")


def test_adapt_safetensors_picks_the_adapter_and_passes_kwargs(st_ckpt):
    seen = {}

    def adapter(state_dict, huggingface_config=None, **unused):
        seen["keys"] = sorted(state_dict)
        seen["config"] = huggingface_config
        seen["types"] = {type(v).__name__ for v in state_dict.values()}
        return strip_model_prefix(state_dict)

    register(SupportedArchitecture("Tiny", weight_adapters={WeightsFormat.safetensors: adapter,
                                                            WeightsFormat.gguf: gguf_adapter}))
    out = adapt("Tiny", [st_ckpt], huggingface_config={"hidden_size": 3})
    assert seen == {"keys": ["model.layers.0.w", "model.norm.weight"], "config": {"hidden_size": 3},
                    "types": {"Weights"}}  # the seed's call: adapter(dict(weights.items()), **kwargs)
    assert sorted(out) == ["layers.0.w", "norm.weight"]
    assert all(isinstance(v, WeightData) for v in out.values())
    assert out["layers.0.w"].dtype is DType.bfloat16 and out["layers.0.w"].node.op == "cast"  # lazy
    ref = load_file(str(st_ckpt))["model.layers.0.w"]
    np.testing.assert_array_equal(out["layers.0.w"].to_numpy().astype(np.float32), ref.astype(np.float32))
    # the same through the object, and with the directory instead of the file
    assert sorted(adapt(get("Tiny"), str(st_ckpt.parent))) == ["layers.0.w", "norm.weight"]


def test_adapt_without_an_adapter_for_the_format(st_ckpt):
    register(SupportedArchitecture("GgufOnly", weight_adapters={WeightsFormat.gguf: gguf_adapter}))
    with pytest.raises(NoAdapterError) as info:
        adapt("GgufOnly", [st_ckpt])
    assert str(info.value) == ("architecture 'GgufOnly' has no weight adapter for safetensors checkpoints (it has "
                               "adapters for: gguf); add one to weight_adapters={WeightsFormat.safetensors: ...}")
    assert isinstance(info.value, ValueError)
    register(SupportedArchitecture("Nothing"))
    with pytest.raises(NoAdapterError, match=r"\(it has adapters for: none\)"):
        adapt("Nothing", [st_ckpt])


def test_adapt_gguf_dispatches_to_the_gguf_adapter(tmp_path):
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("lazyweights.formats.gguf")
    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    register(SupportedArchitecture("Both", weight_adapters={WeightsFormat.safetensors: strip_model_prefix,
                                                            WeightsFormat.gguf: gguf_adapter}))
    out = adapt("Both", [path])
    assert list(out) == ["gguf.blk.0.attn_q.weight"]
    np.testing.assert_array_equal(out["gguf.blk.0.attn_q.weight"].to_numpy(),
                                  np.arange(8, dtype=np.float32).reshape(2, 4))


def test_adapt_from_config_json(st_ckpt):
    (st_ckpt.parent / "config.json").write_text(json.dumps({"architectures": ["TinyFromConfig"]}))
    register(SupportedArchitecture("TinyFromConfig", weight_adapters={"safetensors": strip_model_prefix}))
    assert sorted(adapt(None, [st_ckpt])) == ["layers.0.w", "norm.weight"]


def test_adapt_refuses_pickles_and_bad_adapter_results(tmp_path, st_ckpt):
    register(SupportedArchitecture("Bad", weight_adapters={"safetensors": lambda sd, **k: list(sd)}))
    with pytest.raises(LazyWeightsError, match="returned a list, not a dict"):
        adapt("Bad", [st_ckpt])
    register(SupportedArchitecture("Strings", weight_adapters={"safetensors": lambda sd, **k: {"a": "b"}}))
    with pytest.raises(LazyWeightsError, match="state dict value for 'a' is a str"):
        adapt("Strings", [st_ckpt])
    register(SupportedArchitecture("Arrays", weight_adapters={"safetensors": lambda sd, **k: {"a": np.zeros(2)}}))
    assert isinstance(adapt("Arrays", [st_ckpt])["a"], WeightData)
    pickle = tmp_path / "pytorch_model.bin"
    pickle.write_bytes(b"\x80\x02not really")
    register(SupportedArchitecture("Pt", weight_adapters={"safetensors": strip_model_prefix}))
    with pytest.raises(FormatError, match="pickle checkpoints are refused"):
        adapt("Pt", [pickle])
    with pytest.raises(UnknownArchitectureError):
        adapt("NoSuchArch", [st_ckpt])
