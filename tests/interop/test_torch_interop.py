"""Loading lazy state dicts into torch modules: checked against torch's own load_state_dict and safetensors."""
from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lazyweights import DType, WeightData, load_weights  # noqa: E402
from lazyweights.core.errors import LoadError  # noqa: E402
from lazyweights.interop.torch_load import IncompatibleKeys, TorchLoadError, load_into_torch  # noqa: E402


def _ptrs(module):
    return {k: v.data_ptr() for k, v in module.state_dict().items()}


def _torch_error(module, sd, strict=True) -> str:
    with pytest.raises(RuntimeError) as info:
        module.load_state_dict(sd, strict=strict)
    return str(info.value)


# --- the real checkpoint: all-MiniLM-L6-v2 into transformers' BertModel -----------------------------------
def test_minilm_into_bert_matches_torch_load_state_dict(minilm_dir):  # tests/conftest.py (skips without it)
    pytest.importorskip("transformers")
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(os.path.join(minilm_dir, "config.json"))
    torch.manual_seed(0)
    ours, reference = BertModel(config).eval(), BertModel(config).eval()
    path = os.path.join(minilm_dir, "model.safetensors")

    weights = load_weights([path])
    names = [name for name, _ in weights.items()]
    # The checkpoint's names are BertModel's own (no "bert." prefix) plus the position_ids buffer, which
    # current transformers registers as non-persistent: torch and lazyweights both call it unexpected.
    assert "embeddings.word_embeddings.weight" in names and not any(n.startswith("bert.") for n in names)
    state = {name: w.data() for name, w in weights.items()}

    torch_sd = load_file(path)
    torch_msg = _torch_error(reference, torch_sd)
    with pytest.raises(TorchLoadError) as info:
        load_into_torch(ours, state)
    assert str(info.value) == torch_msg  # same words as torch
    assert torch_msg == ('Error(s) in loading state_dict for BertModel:\n\t'
                         'Unexpected key(s) in state_dict: "embeddings.position_ids". ')

    before = _ptrs(ours)
    result = load_into_torch(ours, state, strict=False)
    assert result == IncompatibleKeys([], ["embeddings.position_ids"])
    assert _ptrs(ours) == before  # in place: the parameters' own storage was filled

    torch_sd.pop("embeddings.position_ids")
    reference.load_state_dict(torch_sd, strict=True)
    mine, ref = ours.state_dict(), reference.state_dict()
    assert mine.keys() == ref.keys() and len(mine) == 103
    for k in ref:
        assert torch.equal(mine[k], ref[k]), k

    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).last_hidden_state, reference(input_ids=ids).last_hidden_state)


# --- bf16 -----------------------------------------------------------------------------------------------------
def test_bf16_stays_bf16_and_is_filled_in_place(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(1)
    src = torch.nn.Linear(5, 3).to(torch.bfloat16)
    path = str(tmp_path / "bf16.safetensors")
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, path)

    dst = torch.nn.Linear(5, 3).to(torch.bfloat16)
    before = _ptrs(dst)
    weights = load_weights([path])
    assert weights.weight.data().dtype is DType.bfloat16
    load_into_torch(dst, {k: w.data() for k, w in weights.items()})
    assert _ptrs(dst) == before
    ref = load_file(path)
    for k, v in dst.state_dict().items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, ref[k])


def test_fp32_checkpoint_cast_lazily_to_bf16_matches_torch_rounding(tmp_path):
    rng = np.random.default_rng(2)
    w32 = rng.standard_normal((4, 6)).astype(np.float32)
    dst = torch.nn.Linear(6, 4, bias=False).to(torch.bfloat16)
    value = WeightData.from_numpy(w32, "w")

    with pytest.raises(TorchLoadError) as info:
        load_into_torch(dst, {"weight": value})
    assert str(info.value) == (
        "Error(s) in loading state_dict for Linear:\n\tdtype mismatch for weight: copying a param with dtype "
        "torch.float32 from checkpoint, the dtype in current model is torch.bfloat16; cast it in the adapter "
        "(.astype(DType.bfloat16)) or pass cast=True.")

    load_into_torch(dst, {"weight": value.astype(DType.bfloat16)})
    assert torch.equal(dst.weight.detach(), torch.from_numpy(w32).to(torch.bfloat16))  # torch's own rounding
    dst.weight.data.zero_()
    load_into_torch(dst, {"weight": value}, cast=True)
    assert torch.equal(dst.weight.detach(), torch.from_numpy(w32).to(torch.bfloat16))
    raw = dst.weight.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    assert raw.tobytes() == w32.astype(ml_dtypes.bfloat16).tobytes()


def test_bf16_torch_tensors_as_values():
    src = torch.randn(3, 2).to(torch.bfloat16)
    dst = torch.nn.Linear(2, 3, bias=False).to(torch.bfloat16)
    load_into_torch(dst, {"weight": src})
    assert torch.equal(dst.weight.detach(), src)


# --- tied weights, buffers --------------------------------------------------------------------------------------
class TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.lm_head = torch.nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.embed.weight


@pytest.mark.parametrize("given", ["embed.weight", "lm_head.weight"])
def test_tied_weights_need_either_name(given):
    m = TiedLM()
    value = np.arange(40, dtype=np.float32).reshape(10, 4)
    # torch itself wants both names
    assert "Missing key(s)" in _torch_error(TiedLM(), {given: torch.from_numpy(value)})
    assert load_into_torch(m, {given: WeightData.from_numpy(value, given)}) == IncompatibleKeys([], [])
    assert m.lm_head.weight is m.embed.weight
    assert torch.equal(m.embed.weight.detach(), torch.from_numpy(value))


def test_tied_weights_neither_name_is_missing_both():
    with pytest.raises(TorchLoadError) as info:
        load_into_torch(TiedLM(), {})
    assert str(info.value) == ('Error(s) in loading state_dict for TiedLM:\n\t'
                               'Missing key(s) in state_dict: "embed.weight", "lm_head.weight". ')
    assert load_into_torch(TiedLM(), {}, strict=False) == IncompatibleKeys(["embed.weight", "lm_head.weight"], [])


class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(3)
        self.register_buffer("cache", torch.zeros(2), persistent=False)


def test_persistent_buffers_loaded_non_persistent_ignored():
    m = WithBuffers()
    sd = {k: v.clone() + 1 for k, v in m.state_dict().items()}
    assert "cache" not in sd and "bn.num_batches_tracked" in sd
    load_into_torch(m, {k: v.numpy() for k, v in sd.items()})
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k]), k
    assert m.bn.num_batches_tracked.dtype == torch.int64 and int(m.bn.num_batches_tracked) == 1
    # a key for the non-persistent buffer is unexpected, as in torch
    sd["cache"] = torch.ones(2)
    torch_msg = _torch_error(WithBuffers(), sd)
    with pytest.raises(TorchLoadError) as info:
        load_into_torch(m, sd)
    assert str(info.value) == torch_msg
    assert load_into_torch(m, sd, strict=False).unexpected_keys == ["cache"]
    assert not m.cache.any()


# --- the error text ---------------------------------------------------------------------------------------------
def test_error_text_matches_torch_for_its_cases_and_adds_ours():
    m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    sd = {k: v.detach().clone() for k, v in m.state_dict().items()}
    del sd["0.bias"]
    sd["0.weigth"] = sd.pop("0.weight")
    sd["x"] = torch.zeros(1)
    sd["1.weight"] = torch.zeros(3, 3)
    torch_msg = _torch_error(m, sd)
    with pytest.raises(TorchLoadError) as info:
        load_into_torch(m, sd)
    ours = str(info.value)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, LoadError)
    assert ours.startswith(torch_msg.split("\n\tsize mismatch")[0])  # missing / unexpected lines as torch's
    assert ours == (
        'Error(s) in loading state_dict for Sequential:\n'
        '\tMissing key(s) in state_dict: "0.weight", "0.bias". \n'
        '\tUnexpected key(s) in state_dict: "x", "0.weigth". \n'
        '\tsize mismatch for 1.weight: copying a param with shape torch.Size([3, 3]) from checkpoint, '
        'the shape in current model is torch.Size([2, 3]).\n'
        '\tDid you mean "0.weigth" for missing "0.weight"?')
    assert "size mismatch for 1.weight: copying a param with shape torch.Size([3, 3]) from checkpoint, " \
           "the shape in current model is torch.Size([2, 3])." in torch_msg
    # strict=False: shape mismatches still fail, as in torch
    with pytest.raises(TorchLoadError) as info:
        load_into_torch(m, sd, strict=False)
    assert str(info.value) == _torch_error(m, sd, strict=False)


def test_nothing_is_written_when_validation_fails():
    m = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(TorchLoadError):
        load_into_torch(m, {"weight": np.ones((2, 2), np.float32), "bias": np.ones(3, np.float32)})
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k])


def test_non_contiguous_parameter_is_filled_by_copy():
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(torch.zeros(3, 4).t())  # a transposed view: not contiguous
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    load_into_torch(m, {"w": value})
    assert torch.equal(m.w.detach(), torch.from_numpy(value))


def test_quantized_and_invalid_values_are_reported():
    from lazyweights import QuantizationEncoding

    m = torch.nn.Linear(32, 2, bias=False)
    q = WeightData(np.zeros((2, 34), np.uint8), "w", quantization_encoding=QuantizationEncoding.Q8_0)
    with pytest.raises(TorchLoadError, match=r"quantized value for weight: the checkpoint holds Q8_0 blocks; "
                                             r"call .dequantize\(\) in the adapter"):
        load_into_torch(m, {"weight": q})
    with pytest.raises(TorchLoadError, match=r"value for weight is a str, not a tensor"):
        load_into_torch(m, {"weight": "w"})


def test_torch_module_in_check_report():
    from lazyweights.interop.check import check

    report = check({"embed.weight": np.zeros((10, 4), np.float32)}, TiedLM())
    assert report.ok and report.matched == ["embed.weight", "lm_head.weight"]
    assert json.loads(json.dumps(report.to_dict()))["ok"] is True
