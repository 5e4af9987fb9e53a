"""Read llama.cpp importance matrices (`llama-imatrix` output, `llama-quantize --imatrix FILE`).

Two formats exist, and `read_imatrix` takes either (a file that starts with the GGUF magic is GGUF):

Legacy `.dat` (little-endian; `save_imatrix_legacy` in tools/imatrix/imatrix.cpp):

    n_entries i32 (>= 1)
    n_entries x ( name_len i32 | name bytes | ncall i32 | nval i32 (>= 1) | nval x f32 )
    optional trailer: chunk_count i32 | dataset_len i32 | dataset bytes

  The stored values are (sum of squared activations / count) * ncall; llama-quantize divides by ncall.

GGUF (the default since 2025; `save_imatrix`): metadata `general.type = "imatrix"`, `imatrix.datasets`
(string array), `imatrix.chunk_count`, `imatrix.chunk_size` (u32), and per weight two F32 tensors,
`NAME.in_sum2` (ne = [n_per_row, n_expert]) and `NAME.counts` (ne = [1, n_expert]). llama-quantize
divides each expert's sums by its count rounded to an integer, and uses 1.0 for an expert with no count.

Either way the result is what llama-quantize hands to `ggml_quantize_chunk`: per tensor name (the GGUF
name, e.g. `blk.0.ffn_down.weight`), float32 weights of length n_per_row * n_expert, computed with the
same float32 division. `Imatrix.for_tensor` checks that length against a tensor's row length and expert
count and raises `ImatrixShapeError` naming the tensor and both numbers, as llama-quantize refuses it.
A truncated or malformed file raises `ImatrixFormatError` naming the file, the entry and the offset.

Example:
    >>> import numpy as np, struct, tempfile, os
    >>> from lazyweights.formats.imatrix import read_imatrix
    >>> path = os.path.join(tempfile.mkdtemp(), "imatrix.dat")
    >>> name = b"blk.0.attn_q.weight"
    >>> body = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 2, 4)
    >>> body += np.array([2, 4, 6, 8], "<f4").tobytes() + struct.pack("<ii", 10, 0)
    >>> _ = open(path, "wb").write(body)
    >>> im = read_imatrix(path)
    >>> im.format, list(im), im["blk.0.attn_q.weight"].tolist(), im.chunk_count
    ('dat', ['blk.0.attn_q.weight'], [1.0, 2.0, 3.0, 4.0], 10)
    >>> im.for_tensor("blk.0.attn_q.weight", 4).shape
    (4,)
    >>> im.for_tensor("blk.0.attn_q.weight", 8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lazyweights.core.errors.ImatrixShapeError: imatrix entry for tensor 'blk.0.attn_q.weight' has 4 values but ...
"""
from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from typing import Iterator

import numpy as np

from ..core.errors import FormatError, ImatrixFormatError, ImatrixShapeError
from .source import TensorRecord

GGUF_MAGIC = b"GGUF"


class Imatrix(Mapping):
    """An importance matrix: tensor name -> float32 per-column weights (n_per_row * n_expert values).

    Attributes: `path`, `format` ("dat" or "gguf"), `datasets` (list of str), `chunk_count`, `chunk_size`
    (0 where the file does not say), and `counts` (name -> per-expert counts as llama.cpp rounds them;
    the single `ncall` for the legacy format).
    """

    def __init__(self, path, fmt, entries, counts, datasets, chunk_count, chunk_size):
        self.path = path
        self.format = fmt
        self._entries = entries
        self.counts = counts
        self.datasets = datasets
        self.chunk_count = chunk_count
        self.chunk_size = chunk_size

    def __getitem__(self, name: str) -> np.ndarray:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Imatrix({self.path!r}, format={self.format!r}, {len(self)} entries, chunk_count={self.chunk_count})"

    def for_tensor(self, name: str, row_length: int, n_expert: int = 1) -> np.ndarray | None:
        """The weights for tensor `name` as `ggml_quantize_chunk` takes them, or None when the file has none.

        `row_length` is the tensor's `ne[0]` (numpy's last dimension), `n_expert` its `ne[2]` for stacked MoE
        expert tensors (1 otherwise). Returns shape (row_length,) or (n_expert, row_length).
        """
        w = self._entries.get(name)
        if w is None:
            return None
        want = row_length * n_expert
        if w.shape[0] != want:
            experts = f"{n_expert} expert" + ("s" if n_expert != 1 else "")
            raise ImatrixShapeError(
                f"imatrix entry for tensor {name!r} has {w.shape[0]} values but the tensor needs {want} "
                f"(row length {row_length} x {experts})"
            )
        return w if n_expert == 1 else w.reshape(n_expert, row_length)


def read_imatrix(path) -> Imatrix:
    """Read a llama.cpp importance matrix, legacy `.dat` or GGUF (see the module docstring)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ImatrixFormatError(f"{path}: cannot open the imatrix file: {e}") from e
    if head == GGUF_MAGIC:
        return _read_gguf(path)
    return _read_dat(path)


class _Reader:
    """Bounds-checked little-endian reads over the file's bytes; every shortfall names the entry."""

    def __init__(self, path: str, data: bytes):
        self.path = path
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ImatrixFormatError(
                f"{self.path}: truncated imatrix file: {what} needs {n} bytes at offset {self.pos}, "
                f"but the file has {len(self.data)} bytes"
            )
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def i32(self, what: str) -> int:
        return struct.unpack("<i", self.take(4, what))[0]

    def left(self) -> int:
        return len(self.data) - self.pos


def _read_dat(path: str) -> Imatrix:
    with open(path, "rb") as f:
        r = _Reader(path, f.read())
    n_entries = r.i32("the entry count")
    if n_entries < 1:
        raise ImatrixFormatError(f"{path}: not an imatrix file: entry count {n_entries} (need at least 1)")
    # each entry has at least its three i32 fields: refuse absurd counts before looping over them
    if n_entries > r.left() // 12:
        raise ImatrixFormatError(
            f"{path}: truncated imatrix file: the entry count says {n_entries} but only {r.left()} bytes follow "
            f"(each entry needs at least 12)"
        )
    entries: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}
    for i in range(n_entries):
        where = f"entry {i + 1} of {n_entries}"
        name_len = r.i32(f"{where}: the name length")
        if name_len < 0:
            raise ImatrixFormatError(f"{path}: {where}: negative name length {name_len} at offset {r.pos - 4}")
        raw = r.take(name_len, f"{where}: the name")
        # llama.cpp reads the name as a C string: it ends at the first NUL
        name = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        where = f"entry {i + 1} of {n_entries} ({name!r})"
        ncall = r.i32(f"{where}: ncall")
        nval = r.i32(f"{where}: the value count")
        if nval < 1:
            raise ImatrixFormatError(f"{path}: {where}: value count {nval} at offset {r.pos - 4} (need at least 1)")
        sums = np.frombuffer(r.take(4 * nval, f"{where}: {nval} float32 values"), "<f4").astype(np.float32)
        # quantize.cpp: e[i] = sums[i] / ncall (float / int64 -> float) when ncall > 0, else the sums
        entries[name] = sums / np.float32(ncall) if ncall > 0 else sums
        counts[name] = np.array([ncall], np.int64)
    chunk_count, datasets = 0, []
    if r.left() >= 4:  # the trailer is optional, and llama.cpp ignores a short one
        chunk_count = r.i32("the chunk count")
        if r.left() >= 4:
            n = r.i32("the dataset name length")
            if 0 < n <= r.left():
                datasets.append(r.take(n, "the dataset name").split(b"\0", 1)[0].decode("utf-8", "surrogateescape"))
    return Imatrix(path, "dat", entries, counts, datasets, chunk_count, 0)


def _read_gguf(path: str) -> Imatrix:
    from .gguf import read_gguf  # noqa: PLC0415  (keeps `import lazyweights.formats.imatrix` light)

    try:
        records, meta = read_gguf(path)
    except FormatError as e:
        raise ImatrixFormatError(f"{path}: not a readable GGUF imatrix: {e}") from e
    if not records:
        raise ImatrixFormatError(f"{path}: GGUF imatrix has no tensors")
    missing = [k for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size") if k not in meta]
    if missing:
        # llama-quantize refuses such a file ("missing imatrix metadata")
        raise ImatrixFormatError(f"{path}: GGUF imatrix lacks the metadata key(s) {', '.join(missing)}")
    pairs: dict[str, dict[str, TensorRecord]] = {}
    for rec in records:
        for suffix in (".in_sum2", ".counts"):
            if rec.name.endswith(suffix):
                pairs.setdefault(rec.name[: -len(suffix)], {})[suffix] = rec
    entries: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}
    with open(path, "rb") as f:
        for name in sorted(pairs):
            sums_rec, counts_rec = pairs[name].get(".in_sum2"), pairs[name].get(".counts")
            if sums_rec is None or counts_rec is None:
                raise ImatrixFormatError(f"{path}: imatrix entry {name!r} has only one of .in_sum2 / .counts")
            for rec in (sums_rec, counts_rec):
                if rec.encoding is not None or rec.dtype.name != "float32":
                    raise ImatrixFormatError(f"{path}: imatrix tensor {rec.name!r} must be F32, got {rec.dtype.name}")
            sums = _read_f32(f, path, sums_rec)
            raw_counts = _read_f32(f, path, counts_rec)
            n_expert = raw_counts.shape[0]
            if n_expert == 0 or sums.shape[0] % n_expert:
                raise ImatrixFormatError(
                    f"{path}: imatrix entry {name!r}: {sums.shape[0]} sums do not split over {n_expert} counts"
                )
            # std::lround: half away from zero; a NaN count is refused (lround of NaN is undefined)
            if not np.isfinite(raw_counts).all():
                raise ImatrixFormatError(f"{path}: imatrix entry {name!r} has a non-finite count")
            c = np.array([int(math.copysign(math.floor(abs(float(v)) + 0.5), float(v))) for v in raw_counts], np.int64)
            ne0 = sums.shape[0] // n_expert
            w = np.empty_like(sums)
            for j in range(n_expert):
                count = np.float32(c[j])
                seg = slice(j * ne0, (j + 1) * ne0)
                w[seg] = sums[seg] / count if count > 0 else np.float32(1.0)
            entries[name] = w
            counts[name] = c
    datasets = list(meta.get("imatrix.datasets") or [])
    return Imatrix(path, "gguf", entries, counts, [str(d) for d in datasets],
                   int(meta.get("imatrix.chunk_count", 0)), int(meta.get("imatrix.chunk_size", 0)))


def _read_f32(f, path: str, rec) -> np.ndarray:
    n = rec.nbytes // 4
    f.seek(rec.offset)
    raw = f.read(rec.nbytes)
    if len(raw) != rec.nbytes:
        raise ImatrixFormatError(
            f"{path}: truncated imatrix file: tensor {rec.name!r} needs {rec.nbytes} bytes at offset {rec.offset}"
        )
    return np.frombuffer(raw, "<f4", count=n).astype(np.float32)
