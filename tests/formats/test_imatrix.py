"""lazyweights.formats.imatrix: llama.cpp's legacy .dat and GGUF importance matrices.

The files are written here the way llama.cpp's tools/imatrix/imatrix.cpp writes them (save_imatrix_legacy
byte for byte; save_imatrix through gguf-py with the same names, shapes and keys), and the expected values
are what tools/quantize/quantize.cpp's load_imatrix computes from them.
"""
from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from lazyweights.core.errors import FormatError, ImatrixFormatError, ImatrixShapeError, LazyWeightsError
from lazyweights.formats.imatrix import read_imatrix


def write_dat(path, entries: dict[str, tuple[int, np.ndarray]], chunk_count: int | None = 7,
              dataset: str | None = "wiki.train.raw"):
    """save_imatrix_legacy: entries name -> (ncall, stored values), in sorted name order, then the trailer."""
    body = struct.pack("<i", len(entries))
    for name in sorted(entries):
        ncall, values = entries[name]
        raw = name.encode()
        body += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, len(values))
        body += np.asarray(values, "<f4").tobytes()
    if chunk_count is not None:
        body += struct.pack("<i", chunk_count)
        if dataset is not None:
            body += struct.pack("<i", len(dataset)) + dataset.encode()
    path.write_bytes(body)
    return body


def write_gguf(path, entries: dict[str, tuple[np.ndarray, np.ndarray]], metadata: bool = True,
               only_sums: str | None = None):
    """save_imatrix: NAME.in_sum2 (numpy shape (n_expert, n_per_row)) and NAME.counts ((n_expert, 1)), F32."""
    w = gguf.GGUFWriter(str(path), arch="imatrix")  # gguf-py insists on an arch key; llama.cpp ignores it
    w.add_type("imatrix")
    if metadata:
        w.add_array("imatrix.datasets", ["wiki.train.raw", "code.txt"])
        w.add_uint32("imatrix.chunk_count", 12)
        w.add_uint32("imatrix.chunk_size", 512)
    for name in sorted(entries):
        sums, counts = entries[name]
        w.add_tensor(f"{name}.in_sum2", np.asarray(sums, np.float32))
        if name != only_sums:
            w.add_tensor(f"{name}.counts", np.asarray(counts, np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --- legacy .dat ------------------------------------------------------------------------------------------


def test_dat_values_are_divided_by_ncall(tmp_path):
    rng = np.random.default_rng(0)
    stored = {"blk.0.attn_q.weight": (3, rng.random(256).astype(np.float32) * 100),
              "blk.0.ffn_down.weight": (1, rng.random(512).astype(np.float32)),
              "output.weight": (0, np.arange(256, dtype=np.float32))}  # ncall 0: kept as stored
    write_dat(tmp_path / "m.dat", stored)
    im = read_imatrix(tmp_path / "m.dat")
    assert im.format == "dat" and im.chunk_count == 7 and im.datasets == ["wiki.train.raw"] and len(im) == 3
    assert np.array_equal(im["blk.0.attn_q.weight"], stored["blk.0.attn_q.weight"][1] / np.float32(3))
    assert im["blk.0.attn_q.weight"].dtype == np.float32
    assert np.array_equal(im["blk.0.ffn_down.weight"], stored["blk.0.ffn_down.weight"][1])
    assert np.array_equal(im["output.weight"], stored["output.weight"][1])
    assert im.counts["blk.0.attn_q.weight"].tolist() == [3]
    assert im.for_tensor("blk.0.attn_q.weight", 256).shape == (256,)
    assert im.for_tensor("blk.9.attn_q.weight", 256) is None  # llama-quantize quantizes it without one


def test_dat_trailer_is_optional(tmp_path):
    write_dat(tmp_path / "a.dat", {"x.weight": (2, np.ones(32))}, chunk_count=None)
    im = read_imatrix(tmp_path / "a.dat")
    assert im.chunk_count == 0 and im.datasets == [] and im["x.weight"].tolist() == [0.5] * 32


def test_dat_truncated_anywhere_is_a_named_error(tmp_path):
    full = write_dat(tmp_path / "full.dat",
                     {"blk.0.attn_k.weight": (4, np.ones(64)), "blk.1.attn_k.weight": (4, np.ones(64))},
                     chunk_count=None)
    for cut in range(len(full)):
        p = tmp_path / "cut.dat"
        p.write_bytes(full[:cut])
        with pytest.raises(ImatrixFormatError) as e:
            read_imatrix(p)
        msg = str(e.value)
        assert str(p) in msg, msg
        if 4 <= cut:
            assert "entry" in msg and ("offset" in msg or "bytes follow" in msg), msg
    assert issubclass(ImatrixFormatError, FormatError) and issubclass(ImatrixFormatError, LazyWeightsError)


def test_dat_truncated_values_name_the_entry_and_offset(tmp_path):
    full = write_dat(tmp_path / "full.dat", {"blk.0.attn_k.weight": (4, np.ones(64))}, chunk_count=None)
    p = tmp_path / "cut.dat"
    p.write_bytes(full[:-10])
    name_end = 4 + 4 + len("blk.0.attn_k.weight") + 8
    with pytest.raises(ImatrixFormatError,
                       match=rf"'blk\.0\.attn_k\.weight'.*64 float32 values.*256 bytes at offset {name_end}"):
        read_imatrix(p)


@pytest.mark.parametrize("body,match", [
    (struct.pack("<i", 0), "entry count 0"),
    (struct.pack("<i", -3), "entry count -3"),
    (struct.pack("<i", 1000) + b"\0" * 40, "entry count says 1000"),
    (struct.pack("<i", 1) + struct.pack("<i", 1) + b"a" + struct.pack("<ii", 1, 0), "value count 0"),
    (struct.pack("<i", 1) + struct.pack("<i", -5) + b"\0" * 20, "negative name length"),
])
def test_dat_malformed(tmp_path, body, match):
    p = tmp_path / "bad.dat"
    p.write_bytes(body)
    with pytest.raises(ImatrixFormatError, match=match):
        read_imatrix(p)


# --- GGUF -------------------------------------------------------------------------------------------------


def test_gguf_sums_divided_by_rounded_counts_per_expert(tmp_path):
    rng = np.random.default_rng(1)
    sums = (rng.random((4, 64)) * 50).astype(np.float32)
    counts = np.array([3.0, 0.0, 2.5, 7.4999], np.float32)  # lround: 3, 0 (-> weights 1.0), 3, 7
    dense = (rng.random((1, 256)) * 9).astype(np.float32)
    write_gguf(tmp_path / "im.gguf", {"blk.0.ffn_up_exps.weight": (sums, counts),
                                      "blk.0.attn_q.weight": (dense, np.array([5.0]))})
    im = read_imatrix(tmp_path / "im.gguf")
    assert im.format == "gguf" and im.chunk_count == 12 and im.chunk_size == 512
    assert im.datasets == ["wiki.train.raw", "code.txt"]
    assert im.counts["blk.0.ffn_up_exps.weight"].tolist() == [3, 0, 3, 7]
    w = im.for_tensor("blk.0.ffn_up_exps.weight", 64, n_expert=4)
    assert w.shape == (4, 64)
    assert np.array_equal(w[0], sums[0] / np.float32(3)) and np.array_equal(w[1], np.ones(64, np.float32))
    assert np.array_equal(w[2], sums[2] / np.float32(3)) and np.array_equal(w[3], sums[3] / np.float32(7))
    assert np.array_equal(im["blk.0.attn_q.weight"], dense[0] / np.float32(5))


def test_length_mismatch_names_tensor_and_both_numbers(tmp_path):
    write_gguf(tmp_path / "im.gguf", {"blk.2.ffn_down.weight": (np.ones((1, 512)), np.array([1.0]))})
    im = read_imatrix(tmp_path / "im.gguf")
    with pytest.raises(ImatrixShapeError, match=r"'blk\.2\.ffn_down\.weight' has 512 values but the tensor needs 640 "
                                                r"\(row length 640 x 1 expert\)"):
        im.for_tensor("blk.2.ffn_down.weight", 640)
    with pytest.raises(ImatrixShapeError, match=r"needs 2048 \(row length 256 x 8 experts\)"):
        im.for_tensor("blk.2.ffn_down.weight", 256, n_expert=8)
    assert issubclass(ImatrixShapeError, ValueError)


def test_gguf_without_imatrix_metadata_is_refused(tmp_path):
    # llama-quantize: "missing imatrix metadata"
    write_gguf(tmp_path / "im.gguf", {"a.weight": (np.ones((1, 32)), np.array([1.0]))}, metadata=False)
    with pytest.raises(ImatrixFormatError, match="imatrix.datasets"):
        read_imatrix(tmp_path / "im.gguf")


def test_gguf_sums_without_counts_is_refused(tmp_path):
    write_gguf(tmp_path / "im.gguf", {"a.weight": (np.ones((1, 32)), np.array([1.0]))}, only_sums="a.weight")
    with pytest.raises(ImatrixFormatError, match=r"'a\.weight' has only one of"):
        read_imatrix(tmp_path / "im.gguf")


def test_gguf_truncated_is_a_named_error(tmp_path):
    write_gguf(tmp_path / "im.gguf", {"blk.0.attn_q.weight": (np.ones((1, 256)), np.array([2.0]))})
    full = (tmp_path / "im.gguf").read_bytes()
    last = max(t.data_offset for t in gguf.GGUFReader(str(tmp_path / "im.gguf")).tensors)  # the 4-byte counts
    for cut in (last + 2, last - 600, 40, 5):
        p = tmp_path / "cut.gguf"
        p.write_bytes(full[:cut])
        with pytest.raises(ImatrixFormatError, match=str(p)):
            read_imatrix(p)


def test_missing_file_is_a_named_error(tmp_path):
    with pytest.raises(ImatrixFormatError, match="cannot open"):
        read_imatrix(tmp_path / "nope.dat")
