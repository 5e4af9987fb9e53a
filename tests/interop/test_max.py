"""lazyweights inside MAX (Modular's `max` package): runs only where `max` is importable.

Run with the interpreter that has MAX, e.g. `/work/maxenv/bin/python -m pytest tests/interop/test_max.py`.
The pure conversion logic (no MAX needed) is tested in test_max_conversions.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

max_pkg = pytest.importorskip("max")
pytest.importorskip("max.graph.weights")

from max.driver import CPU, Buffer  # noqa: E402
from max.dtype import DType as MaxDType  # noqa: E402
from max.graph import DeviceRef as MaxDeviceRef  # noqa: E402
from max.graph import Graph, Shape, TensorType, ops  # noqa: E402
from max.graph import Weight as MaxWeight  # noqa: E402
from max.graph.quantization import QuantizationEncoding as MaxQ  # noqa: E402
from max.graph.weights import WeightData as MaxWeightData  # noqa: E402
from max.graph.weights import load_weights as max_load_weights  # noqa: E402
from max.nn.layer import Module as MaxModule  # noqa: E402

import lazyweights as lw  # noqa: E402
from lazyweights.interop import max as lwmax  # noqa: E402
from lazyweights.interop.max import as_max_adapter, load_max_module, to_max_state_dict  # noqa: E402
from lazyweights.tools import demo as w1  # noqa: E402


# --- fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def w1_ckpt(tmp_path_factory, llama_checkpoint):  # llama_checkpoint: tests/conftest.py
    """A small W1 checkpoint: 2 layers, fp8 KV scales, sharded into several files with an index (the files
    ../shared/bench/make_ckpt.py writes with --shard-gb 0.0002)."""
    return llama_checkpoint(tmp_path_factory.mktemp("w1"), layers=2, hidden=128, inter=256, heads=4, kv_heads=2,
                            vocab=96, fp8_scales=True, shard_bytes=int(0.0002 * (1 << 30)))


def hf_config(ckpt):
    return types.SimpleNamespace(**json.loads((Path(ckpt) / "config.json").read_text()))


def max_eager_w1(state_dict, huggingface_config, **_):
    """MAX's own eager W1 adapter (as /work/shared/bench/baseline_max.py writes it)."""
    cfg = huggingface_config
    out = {}
    hd = cfg.hidden_size // cfg.num_attention_heads
    perm = w1.rope_perm(hd)
    for k, w in state_dict.items():
        new = w1.adapt_name(k)
        if new is None:
            continue
        d = w.data()
        if new.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in new else cfg.num_key_value_heads
            raw = np.from_dlpack(Buffer.from_dlpack(d.data).view(MaxDType.uint16))
            d = MaxWeightData.from_numpy(
                np.ascontiguousarray(raw.reshape(heads, hd, -1)[:, perm, :].reshape(heads * hd, -1)), new)
            d = MaxWeightData(d.data, new, MaxDType.bfloat16, d.shape)
        target = MaxDType.float32 if "norm" in new else MaxDType.float16
        out[new] = d.astype(target)
    return out


def max_bytes(wd: MaxWeightData) -> bytes:
    buf = Buffer.from_dlpack(wd.data)
    return np.from_dlpack(buf.view(MaxDType.uint8, [buf.num_elements * buf.element_size])).tobytes()


def shards(ckpt):
    return sorted(Path(ckpt).glob("*.safetensors"))


# --- the W1 adapter inside MAX ------------------------------------------------------------------------------
@pytest.mark.parametrize("reopen", ["auto", "private", "buffers"])
def test_w1_through_as_max_adapter_is_byte_identical_to_max_eager(w1_ckpt, reopen):
    cfg = hf_config(w1_ckpt)
    eager = max_eager_w1(dict(max_load_weights(shards(w1_ckpt)).items()), huggingface_config=cfg)
    adapter = as_max_adapter(w1.convert_safetensor_state_dict, reopen=reopen)
    lazy = adapter(dict(max_load_weights(shards(w1_ckpt)).items()), huggingface_config=cfg, pipeline_config=None)
    assert adapter.last_route == ("private" if reopen == "auto" else reopen)
    assert list(lazy) == list(eager)  # same names, same (MAX's sorted) order
    for name, e in eager.items():
        got = lazy[name]
        assert isinstance(got, MaxWeightData)
        assert isinstance(got.shape, Shape) and got.shape == e.shape, name
        assert got.dtype == e.dtype and isinstance(got.dtype, MaxDType), name
        assert got.quantization_encoding is None and got.name == name
        assert max_bytes(got) == max_bytes(e), name


def test_public_route_through_pipeline_config(w1_ckpt):
    """With a pipeline_config (what MAX's pipelines pass), the files come from resolved_weight_paths()."""
    paths = shards(w1_ckpt)
    pc = types.SimpleNamespace(model=types.SimpleNamespace(resolved_weight_paths=lambda: paths,
                                                           header_only_weights=False))
    adapter = as_max_adapter(w1.convert_safetensor_state_dict)
    out = adapter(dict(max_load_weights(paths).items()), huggingface_config=hf_config(w1_ckpt), pipeline_config=pc)
    assert adapter.last_route == "paths"
    assert len(out) == 2 * 9 + 3


def test_registered_on_a_max_architecture_and_called_the_way_max_pipelines_call_it(w1_ckpt):
    """The runnable example: register the lazy W1 adapter in a MAX SupportedArchitecture (MAX's Llama 3
    entry with its safetensors adapter replaced) and let MAX's own pipeline helper call it."""
    import dataclasses

    try:
        from max.pipelines.architectures.llama3.arch import llama_arch
        from max.pipelines.lib.utils import parse_state_dict_from_weights
    except ImportError as e:  # MAX's pipelines need its serve extras (transformers, pillow, av, ...)
        pytest.skip(f"MAX pipelines not importable: {e} (pip install 'max[serve]')")
    from max.graph.weights import WeightsFormat

    arch = dataclasses.replace(llama_arch, name="LazyW1LlamaForCausalLM", weight_adapters={
        WeightsFormat.safetensors: as_max_adapter(w1.convert_safetensor_state_dict)})
    adapter = arch.weight_adapters[WeightsFormat.safetensors]
    paths = shards(w1_ckpt)
    pc = types.SimpleNamespace(model=types.SimpleNamespace(resolved_weight_paths=lambda: paths,
                                                           header_only_weights=False))
    out = parse_state_dict_from_weights(pc, max_load_weights(paths), adapter, hf_config(w1_ckpt))
    assert adapter.last_route == "paths"
    eager = max_eager_w1(dict(max_load_weights(paths).items()), huggingface_config=hf_config(w1_ckpt))
    assert list(out) == list(eager)
    assert all(max_bytes(out[k]) == max_bytes(e) and out[k].dtype == e.dtype for k, e in eager.items())


def test_whole_state_dict_is_one_plan(w1_ckpt, monkeypatch):
    import lazyweights.lazy.plan as plan_mod

    calls = []
    real = plan_mod.Plan.materialize

    def counting(self, *a, **k):
        calls.append(len(self))
        return real(self, *a, **k)

    monkeypatch.setattr(plan_mod.Plan, "materialize", counting)
    adapter = as_max_adapter(w1.convert_safetensor_state_dict)
    out = adapter(dict(max_load_weights(shards(w1_ckpt)).items()), huggingface_config=hf_config(w1_ckpt))
    assert calls == [len(out)]


def test_pass_through_tensors_are_zero_copy_and_writes_never_reach_the_file(w1_ckpt):
    weights = max_load_weights(shards(w1_ckpt))
    adapter = as_max_adapter(lambda sd, **_: {k: v.data() for k, v in sd.items() if "norm" in k})
    before = {p: p.read_bytes() for p in shards(w1_ckpt)}
    out = adapter(dict(weights.items()))
    lazy = lw.load_weights(shards(w1_ckpt))
    for name, wd in out.items():
        assert wd.dtype == MaxDType.bfloat16
        arr = np.from_dlpack(wd.data.view(MaxDType.uint16))
        assert arr.flags.writeable  # a private copy-on-write map: MAX may write, the file does not change
        assert arr.tobytes() == lazy[name].data().to_numpy().tobytes()
        arr[...] = 0
    assert {p: p.read_bytes() for p in shards(w1_ckpt)} == before


def test_gguf_blocks_come_back_with_max_encoding(tmp_path):
    vals = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    path = tmp_path / "q.gguf"
    lw.save_gguf(path, {"blk.0.w": lw.from_numpy(np.tile(vals, (1, 4)), "w").quantize(lw.QuantizationEncoding.Q4_K),
                        "blk.0.n": lw.from_numpy(vals[0], "n")}, require_architecture=False)
    max_w = max_load_weights([path])
    expected = {k: v.data() for k, v in max_w.items()}
    adapter = as_max_adapter(lambda sd, **_: {k: v.data() for k, v in sd.items()})
    out = adapter(dict(max_w.items()))
    assert adapter.last_route == "buffers"
    assert out["blk.0.w"].quantization_encoding == MaxQ.Q4_K
    assert out["blk.0.w"].dtype == MaxDType.uint8
    for k, e in expected.items():
        assert out[k].shape == e.shape and out[k].dtype == e.dtype
        assert max_bytes(out[k]) == max_bytes(e)


# --- MAX values into lazyweights ----------------------------------------------------------------------------
def test_max_values_are_accepted_where_lazyweights_takes_an_array(w1_ckpt):
    weights = max_load_weights(shards(w1_ckpt))
    name = "model.layers.0.self_attn.q_proj.weight"
    accessor = getattr(weights, name.split(".")[0])
    for part in name.split(".")[1:]:
        accessor = accessor[part]
    expected = lw.load_weights(shards(w1_ckpt))[name].data().to_numpy()
    # an accessor, a bf16 WeightData, WeightData(...), and a uint16 array labelled bfloat16
    assert lw.plan({"a": accessor}).materialize()["a"].tobytes() == expected.tobytes()
    wd = accessor.data()
    assert wd.dtype == MaxDType.bfloat16
    out = lw.plan({"b": wd}).materialize()["b"]
    assert out.dtype == lw.DType.bfloat16.to_numpy() and out.tobytes() == expected.tobytes()
    assert lw.WeightData(wd, "c").to_numpy().tobytes() == expected.tobytes()
    bits = MaxWeightData.from_numpy(expected.view(np.uint16).copy(), "d")
    labelled = MaxWeightData(bits.data, "d", MaxDType.bfloat16, bits.shape)
    assert lw.plan({"d": labelled}).materialize()["d"].dtype == lw.DType.bfloat16.to_numpy()
    assert lw.DType.parse(MaxDType.bfloat16) is lw.DType.bfloat16
    w = lw.load_weights(shards(w1_ckpt))[name].allocate(device=MaxDeviceRef.CPU())
    assert w.device == lw.DeviceRef.CPU()


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16", "float32", "int8", "bool"])
def test_to_max_buffer_labels_every_dtype(dtype):
    arr = (np.arange(6, dtype=np.float32) % 3).astype(lw.DType[dtype].to_numpy()).reshape(2, 3)
    wd = lwmax.to_max_weight_data(arr, "x")
    assert wd.dtype == MaxDType[dtype] and wd.shape == Shape([2, 3])
    back = lw.WeightData(wd, "x").to_numpy()
    assert back.dtype == arr.dtype and back.tobytes() == arr.tobytes()


def test_read_only_views_export_to_max_buffer_from_dlpack(w1_ckpt):
    """MAX calls __dlpack__() with no max_version: a read-only map view is handed over as a copy."""
    wd = lw.load_weights(shards(w1_ckpt))["model.norm.weight"].data().astype(lw.DType.float32)
    src = lw.load_weights(shards(w1_ckpt))["model.embed_tokens.weight"].data().view(lw.DType.uint16)
    assert not src.to_numpy().flags.writeable
    for value in (src, wd):
        buf = Buffer.from_dlpack(value)
        assert np.from_dlpack(buf).tobytes() == value.to_numpy().tobytes()
    bf = lw.load_weights(shards(w1_ckpt))["model.norm.weight"].data()  # bf16 and read-only
    buf = Buffer.from_dlpack(bf)
    assert buf.dtype == MaxDType.bfloat16
    assert np.from_dlpack(buf.view(MaxDType.uint16)).tobytes() == bf.to_numpy().tobytes()


# --- a MAX module loaded and executed ----------------------------------------------------------------------
class Tiny(MaxModule):
    def __init__(self):
        super().__init__()
        cpu = MaxDeviceRef.CPU()
        self.w_bf16 = MaxWeight("w_bf16", MaxDType.bfloat16, [4, 32], cpu)
        self.w_f16 = MaxWeight("w_f16", MaxDType.float16, [4, 32], cpu)
        self.w_f32 = MaxWeight("w_f32", MaxDType.float32, [4, 32], cpu)
        self.w_q = MaxWeight("w_q", MaxDType.uint8, [4, 18], cpu, quantization_encoding=MaxQ.Q4_0)

    def __call__(self, x):
        a = ops.cast(self.w_bf16, MaxDType.float32) + ops.cast(self.w_f16, MaxDType.float32) + self.w_f32
        return x * (a + ops.dequantize(MaxQ.Q4_0, self.w_q))


def tiny_state_dict():
    vals = np.random.default_rng(0).standard_normal((4, 4, 32)).astype(np.float32)
    return {"w_bf16": lw.from_numpy(vals[0], "a").astype(lw.DType.bfloat16),
            "w_f16": lw.from_numpy(vals[1], "b").astype(lw.DType.float16),
            "w_f32": lw.from_numpy(vals[2], "c"),
            "w_q": lw.from_numpy(vals[3], "d").quantize(lw.QuantizationEncoding.Q4_0)}


def load_tiny(m: Tiny):
    """`m` compiled for MAX's CPU executor, its weights taken from `m.state_dict()`."""
    from max.engine import InferenceSession

    graph = Graph("tiny", forward=m, input_types=[TensorType(MaxDType.float32, [4, 32], MaxDeviceRef.CPU())])
    return InferenceSession(devices=[CPU()]).load(graph, weights_registry=m.state_dict())


def assert_tiny_computes_with(model, sd) -> None:
    """The loaded Tiny model's output is x times the sum of `sd`'s four weights, dequantized by lazyweights."""
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(4, 32)
    got = np.from_dlpack(model.execute(Buffer.from_numpy(x))[0])
    ref = x * sum(sd[k].dequantize(lw.DType.float32).to_numpy() for k in ("w_bf16", "w_f16", "w_f32", "w_q"))
    np.testing.assert_array_equal(got, ref)


def test_tiny_max_module_loads_and_runs_on_cpu_with_lazy_weights():
    sd = tiny_state_dict()
    m = Tiny()
    load_max_module(m, sd)
    assert_tiny_computes_with(load_tiny(m), sd)


@pytest.fixture
def materialized(monkeypatch):
    """The output names of every lazyweights materialization the test triggers, in call order."""
    import lazyweights.run.materialize as mat

    seen = []
    real = mat.materialize

    def counting(outputs, *a, **k):
        seen.extend(outputs)
        return real(outputs, *a, **k)

    monkeypatch.setattr(mat, "materialize", counting)
    return seen


def test_load_max_module_materializes_each_tensor_once(materialized):
    m = Tiny()
    load_max_module(m, tiny_state_dict())
    assert sorted(materialized) == sorted(m.raw_state_dict())
    assert all(isinstance(v, Buffer) for v in m.state_dict().values())


def test_max_own_load_state_dict_fed_lazy_values_materializes_each_once(materialized):
    # Without load_max_module: MAX's Module.load_state_dict and InferenceSession.load export every value
    # through DLPack three times; a WeightData materializes on the first and shares that array after.
    m = Tiny()
    m.load_state_dict(tiny_state_dict())
    load_tiny(m)
    assert sorted(materialized) == ["a", "b", "c", "d"]


RUN_DIRECTLY_FED = """
import sys
sys.path.insert(0, sys.argv[1])
from test_max import *
sd = tiny_state_dict()
m = Tiny()
m.load_state_dict(sd)
assert_tiny_computes_with(load_tiny(m), sd)
print("same")
"""


def test_max_own_load_state_dict_fed_lazy_values_runs():
    # In a fresh process: MAX 26.7's CPU executor segfaults now and then late in a long process that has
    # run many graphs (seen in MAX's own eager adapter as well, with no lazyweights value involved), and
    # that must not take this file's other tests down with it.
    # (MAX's import sets PYTHONEXECUTABLE to the interpreter it found on PATH; a child given it would start
    # outside this virtualenv, without MAX.)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONEXECUTABLE"}
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", RUN_DIRECTLY_FED, here], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("same"), done.stderr[-3000:]


def test_max_side_mismatches_name_the_tensor():
    sd = tiny_state_dict()
    bad = dict(sd, w_f16=sd["w_f16"].astype(lw.DType.float32), w_f32=sd["w_f32"][:2])
    bad["w_extra"] = sd["w_f32"]
    with pytest.raises(lw.LoadError) as e:
        load_max_module(Tiny(), bad)
    msg = str(e.value)
    assert "'w_f16': dtype float32, the module expects float16" in msg
    assert "'w_f32': shape [2, 32], the module expects [4, 32]" in msg
    assert "'w_extra'" in msg
    # MAX's own check names it as well, given our WeightData
    with pytest.raises(ValueError, match="w_f16"):
        Tiny().load_state_dict(to_max_state_dict(bad))
    # an encoding MAX has no name for
    q8 = dict(sd, w_q=lw.from_numpy(np.ones((4, 32), np.float32), "q").quantize(lw.QuantizationEncoding.Q8_0))
    with pytest.raises(lw.DTypeError, match="'w_q' holds Q8_0 blocks"):
        to_max_state_dict(q8)


def test_nan_payload_rules():
    bits = np.array([0x7FC1, 0xFF81, 0x7F80, 0x3F80], np.uint16)  # payload NaNs, inf, 1.0
    x = lw.from_numpy(bits.view(lw.DType.bfloat16.to_numpy()), "x").astype(lw.DType.float16)
    ours = to_max_state_dict({"x": x})["x"]
    theirs = MaxWeightData(Buffer.from_numpy(bits).view(MaxDType.bfloat16), "x", MaxDType.bfloat16,
                           Shape([4])).astype(MaxDType.float16)
    ours_bits = np.from_dlpack(ours.data).view(np.uint16)
    max_bits = np.from_dlpack(Buffer.from_dlpack(theirs.data)).view(np.uint16)
    assert ours_bits.tolist()[:2] == [0x7E00, 0xFE00]  # ml_dtypes: canonical quiet NaN, sign kept
    assert ours_bits.tolist()[2:] == max_bits.tolist()[2:]
    assert max_bits.tolist()[:2] == [0x7E08, 0xFC08]  # MAX: the mantissa shifted, payload and sNaN kept
    with_max_rule = to_max_state_dict({"x": x}, nan_payloads="max")["x"]
    assert np.from_dlpack(with_max_rule.data).view(np.uint16).tolist() == max_bits.tolist()
