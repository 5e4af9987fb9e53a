"""The MAX conversions that need no MAX: foreign dtype/device/encoding objects, foreign WeightData,
DLPack exports to legacy consumers, MAX's NaN rule, and the lazy import. Always runs.

MAX's objects are stood in for by look-alikes with the same shape (an enum named like MAX's members, a
device reference with `device_type` and `id`, a dataclass WeightData with `data`, `name`, `dtype`, `shape`,
`quantization_encoding`); tests/interop/test_max.py checks the same paths against real MAX.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib.util
import sys

import ml_dtypes
import numpy as np
import pytest

import lazyweights as lw
from lazyweights.interop import max as lwmax
from lazyweights.lazy.dlpack import export_dlpack


class FakeDType(enum.Enum):  # MAX's max.dtype.DType: members named like ours, other values
    bfloat16 = 80
    float16 = 71
    uint16 = 16
    uint8 = 8
    float6_e2m3fn = 99


class FakeKind(enum.Enum):
    CPU = "cpu"
    GPU = "gpu"


@dataclasses.dataclass
class FakeDeviceRef:  # max.graph.DeviceRef
    device_type: FakeKind
    id: int = 0


class FakeQ(enum.Enum):  # max.graph.quantization.QuantizationEncoding
    Q4_K = "Q4_K"


@dataclasses.dataclass
class FakeWeightData:  # max.graph.weights.WeightData
    data: object
    name: str
    dtype: FakeDType
    shape: list
    quantization_encoding: FakeQ | None = None


def test_foreign_dtype_device_and_encoding_parse():
    assert lw.DType.parse(FakeDType.bfloat16) is lw.DType.bfloat16
    with pytest.raises(lw.DTypeError, match="float6_e2m3fn"):
        lw.DType.parse(FakeDType.float6_e2m3fn)
    assert lw.DeviceRef.parse(FakeDeviceRef(FakeKind.CPU)) == lw.DeviceRef.CPU()
    assert lw.DeviceRef.parse(FakeDeviceRef(FakeKind.GPU, 1)) == lw.DeviceRef.GPU(1)
    assert lw.QuantizationEncoding.parse(FakeQ.Q4_K) is lw.QuantizationEncoding.Q4_K


def test_allocate_takes_a_foreign_device(tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.ones((2, 2), np.float32)}, str(tmp_path / "m.safetensors"))
    w = lw.load_weights([tmp_path / "m.safetensors"]).w.allocate(device=FakeDeviceRef(FakeKind.CPU))
    assert w.device == lw.DeviceRef.CPU()


def test_foreign_weight_data_is_an_array_everywhere():
    vals = np.array([[1.5, -2.0], [3.0, 0.25]], np.float32)
    bits = vals.astype(ml_dtypes.bfloat16).view(np.uint16)
    fake = FakeWeightData(bits.ravel(), "layers.0.w", FakeDType.bfloat16, [2, 2])  # uint16 labelled bf16
    out = lw.plan({"x": fake}).materialize()["x"]
    assert out.dtype == np.dtype(ml_dtypes.bfloat16) and out.shape == (2, 2)
    assert out.astype(np.float32).tolist() == vals.tolist()
    assert lw.WeightData(fake, "y").astype(lw.DType.float32).to_numpy().tolist() == vals.tolist()
    q = FakeWeightData(np.zeros((4, 144), np.uint8), "q", FakeDType.uint8, [4, 144], FakeQ.Q4_K)
    assert lw.plan({"q": q}).tensors["q"].quantization_encoding is lw.QuantizationEncoding.Q4_K
    with pytest.raises(lw.DTypeError, match="'bad'"):
        lw.plan({"bad": FakeWeightData(np.zeros(3, np.uint8), "bad", FakeDType.float16, [3])})
    with pytest.raises(lw.ShapeError, match="'bad'"):
        lw.plan({"bad": FakeWeightData(np.zeros(3, np.uint16), "bad", FakeDType.float16, [2, 2])})


class Producer:
    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kw):
        return export_dlpack(self.arr, **kw)

    def __dlpack_device__(self):
        return (1, 0)


def test_read_only_arrays_export_to_legacy_consumers_as_a_copy():
    arr = np.arange(6, dtype=np.float32)
    arr.setflags(write=False)
    legacy = export_dlpack(arr)  # no max_version: what MAX's Buffer.from_dlpack asks for
    assert legacy is not None
    with pytest.raises(BufferError, match="read-only"):
        export_dlpack(arr, copy=False)
    shared = np.from_dlpack(Producer(arr))  # numpy >= 2 asks for a versioned capsule: shared, read-only
    assert np.shares_memory(shared, arr) and not shared.flags.writeable
    bf = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    bf.setflags(write=False)
    assert export_dlpack(bf) is not None  # bf16 and read-only together


def test_max_nan_rule_bits():
    b = np.array([0x7FC1, 0xFF81, 0x7F80, 0xFF80, 0x3F80, 0x7FFF], np.uint16)
    ours = b.view(ml_dtypes.bfloat16).astype(np.float16).view(np.uint16)
    assert ours.tolist()[:2] == [0x7E00, 0xFE00]  # ml_dtypes: canonical quiet NaN, sign kept
    theirs = lwmax.max_nan_payloads(b, ours)
    assert theirs.tolist() == [0x7E08, 0xFC08, 0x7C00, 0xFC00, 0x3C00, 0x7FF8]


@pytest.mark.skipif(importlib.util.find_spec("max") is not None
                    and importlib.util.find_spec("max.graph") is not None, reason="MAX is installed here")
def test_without_max_the_module_imports_and_says_how_to_install():
    assert "max" not in sys.modules or not hasattr(sys.modules["max"], "graph")
    with pytest.raises(ImportError, match=r"lazyweights\[max\]"):
        lwmax.to_max_dtype(lw.DType.float16)


def test_reopen_keeps_lazyweights_accessors(tmp_path):
    from safetensors.numpy import save_file

    save_file({"a": np.ones(2, np.float32), "b": np.zeros(2, np.float32)}, str(tmp_path / "m.safetensors"))
    sd = dict(lw.load_weights([tmp_path / "m.safetensors"]).items())
    lazy, route = lwmax.reopen_lazily(sd)
    assert route == "lazyweights" and list(lazy) == ["a", "b"]
    with pytest.raises(lw.LazyWeightsError, match="reopen"):
        lwmax.reopen_lazily(sd, reopen="nope")


def test_import_lazyweights_never_imports_max():
    import subprocess

    code = "import sys, lazyweights, lazyweights.interop.max; print('max.graph' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def _legacy_export_address(value) -> int:
    """The data address in a legacy (unversioned) capsule, as MAX's `Buffer.from_dlpack` asks for one."""
    import ctypes

    get = ctypes.pythonapi["PyCapsule_GetPointer"]
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    capsule = value.__dlpack__()
    address = ctypes.c_void_p.from_address(get(capsule, b"dltensor")).value  # DLTensor.data comes first
    del capsule  # unconsumed: numpy's destructor frees it
    return address


def test_repeated_dlpack_exports_materialize_once_and_share_one_array(tmp_path, monkeypatch):
    # MAX's load_state_dict exports each value three times (shape check, alignment check, session load).
    import safetensors.numpy

    import lazyweights.run.materialize as mat

    seen = []
    real = mat.materialize
    monkeypatch.setattr(mat, "materialize", lambda outputs, *a, **k: (seen.extend(outputs), real(outputs, *a, **k))[1])
    x = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    computed = lw.from_numpy(x, "w").astype(lw.DType.bfloat16)
    addresses = {_legacy_export_address(computed) for _ in range(3)}
    assert seen == ["w"] and len(addresses) == 1
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.from_dlpack(computed.astype(lw.DType.float32)).tobytes() == want.tobytes()

    # A read-only view of a file, exported to a legacy consumer: one private copy, reused, never the map.
    safetensors.numpy.save_file({"v": x}, str(tmp_path / "m.safetensors"))
    view = lw.load_weights(tmp_path / "m.safetensors")["v"].data()
    mapped = view.to_numpy()
    addresses = {_legacy_export_address(view) for _ in range(3)}
    assert len(addresses) == 1 and addresses != {mapped.ctypes.data}
    assert np.from_dlpack(view).tobytes() == x.tobytes()
    # a new WeightData over the same node materializes afresh (the kept array belongs to the object)
    seen.clear()
    _legacy_export_address(computed.astype(lw.DType.bfloat16))
    assert seen == ["w"]
