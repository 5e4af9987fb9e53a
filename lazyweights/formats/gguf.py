"""Read GGUF files (llama.cpp's format), single or split, validating every header field at open.

Layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), all little-endian:

    magic "GGUF" | version u32 (2 or 3) | tensor_count u64 | kv_count u64
    kv_count x  (key: string, value_type u32, value)      string = u64 length + UTF-8 bytes
    tensor_count x (name: string, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64)
    padding to `general.alignment` (default 32) | tensor data, each tensor at data_start + offset

gguf-py's `GGUFReader` trusts the header; this parser does not. Every count and length is bounded by the
bytes left in the file before anything is allocated (a header claiming 2**60 tensors or a 2**62-byte string
fails at once), sizes are Python ints (a tensor whose dims multiply past int64 is refused), offsets must be
aligned, inside the file and non-overlapping, and every failure is a `FormatError` naming the file and,
where known, the key or tensor.

Shapes are converted once, here, to numpy order: GGUF's `ne` is fastest-varying first, so a llama.cpp
`[4096, 11008]` tensor is a numpy `(11008, 4096)` array. Quantized tensors follow MAX: a
`uint8` record of shape `(*outer, row_bytes)` with `encoding` set, where `row_bytes` is the packed size of
one row of `ne[0]` values.

Metadata values become Python values: numbers, bools, `str` (invalid UTF-8 bytes are kept as surrogate
escapes, so they round-trip), and arrays as `GGUFArray`: a lazy, list-like sequence that decodes on first
use and compares equal to a list (a 262144-entry tokenizer costs one validation walk, not a list of
Python objects, until someone asks for it). `GGUFMetadata.types` keeps each key's GGUF value type so a
writer can carry metadata over unchanged.

Split GGUF (llama.cpp's gguf-split: `name-00001-of-00003.gguf`, keys `split.no`, `split.count`,
`split.tensors.count`): given any part, or all of them, every part is found and loaded; a missing part is a
`FormatError` naming the file that is missing.

Example:
    >>> import numpy as np, tempfile, os, gguf
    >>> from lazyweights.formats.gguf import read_gguf
    >>> path = os.path.join(tempfile.mkdtemp(), "m.gguf")
    >>> w = gguf.GGUFWriter(path, "llama")
    >>> w.add_block_count(1)
    >>> w.add_tensor("blk.0.ffn_up.weight", np.ones((3, 2), np.float32))
    >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    >>> records, meta = read_gguf(path)
    >>> [(r.name, r.dtype.name, r.shape) for r in records], meta["llama.block_count"]
    ([('blk.0.ffn_up.weight', 'float32', (3, 2))], 1)
"""
from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys

from ..core.dtype import DType
from ..core.errors import DTypeError, FormatError, UsageError
from ..core.quantization import QuantizationEncoding
from ..io.remote import HEADER_READAHEAD, RemoteFile, current_options, is_url, open_all
from .source import SourceFile, TensorRecord, absolute_location, location_exists

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8  # ggml itself uses 4 (GGML_MAX_DIMS); we read up to 8, the writer refuses more than 4
MAX_ARRAY_NESTING = 8
INT64_MAX = 2**63 - 1

_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset (empty name, 0 dims)

# Scalar value types: struct format (little-endian) and numpy dtype for arrays.
SCALAR_FORMATS: dict[GGUFValueType, tuple[str, str]] = {
    GGUFValueType.UINT8: ("<B", "<u1"),
    GGUFValueType.INT8: ("<b", "<i1"),
    GGUFValueType.UINT16: ("<H", "<u2"),
    GGUFValueType.INT16: ("<h", "<i2"),
    GGUFValueType.UINT32: ("<I", "<u4"),
    GGUFValueType.INT32: ("<i", "<i4"),
    GGUFValueType.FLOAT32: ("<f", "<f4"),
    GGUFValueType.BOOL: ("<B", "<u1"),
    GGUFValueType.UINT64: ("<Q", "<u8"),
    GGUFValueType.INT64: ("<q", "<i8"),
    GGUFValueType.FLOAT64: ("<d", "<f8"),
}
_SCALAR_SIZE = {t: struct.calcsize(f) for t, (f, _) in SCALAR_FORMATS.items()}
_MIN_ELEMENT_SIZE = {**_SCALAR_SIZE, GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}

# Unquantized ggml types and their element dtypes.
GGML_DTYPES: dict[GGMLQuantizationType, DType] = {
    GGMLQuantizationType.F32: DType.float32,
    GGMLQuantizationType.F16: DType.float16,
    GGMLQuantizationType.BF16: DType.bfloat16,
    GGMLQuantizationType.F64: DType.float64,
    GGMLQuantizationType.I8: DType.int8,
    GGMLQuantizationType.I16: DType.int16,
    GGMLQuantizationType.I32: DType.int32,
    GGMLQuantizationType.I64: DType.int64,
}
DTYPE_GGML: dict[DType, GGMLQuantizationType] = {v: k for k, v in GGML_DTYPES.items()}

# Quantized ggml types with a QuantizationEncoding of the same name (and, checked below, the same block sizes).
GGML_ENCODINGS: dict[GGMLQuantizationType, QuantizationEncoding] = {
    t: QuantizationEncoding[t.name]
    for t in GGMLQuantizationType
    if t not in GGML_DTYPES and t.name in QuantizationEncoding.__members__
    and t in GGML_QUANT_SIZES
    and GGML_QUANT_SIZES[t] == (QuantizationEncoding[t.name].block_elements, QuantizationEncoding[t.name].block_bytes)
}
ENCODING_GGML: dict[QuantizationEncoding, GGMLQuantizationType] = {v: k for k, v in GGML_ENCODINGS.items()}

SPLIT_KEYS = (Keys.Split.LLM_KV_SPLIT_NO, Keys.Split.LLM_KV_SPLIT_COUNT, Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
_ALIGNMENT, _SPLIT_NO, _SPLIT_COUNT, _SPLIT_TENSORS = Keys.General.ALIGNMENT, *SPLIT_KEYS
_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def split_part_name(prefix: str, number: int, count: int) -> str:
    """llama.cpp's split file name: `prefix-00001-of-00003.gguf` (`number` counts from 1)."""
    return f"{prefix}-{number:05d}-of-{count:05d}.gguf"


# --- metadata values ------------------------------------------------------------------------------------
class GGUFArray(Sequence):
    """A GGUF metadata array, decoded lazily from the file; list-like, and equal to the equivalent list.

    `type` is the element's `GGUFValueType`; `tolist()` decodes (once, cached); `numpy()` gives numeric
    arrays as a read-only numpy view of the file; `raw()` is the encoded element bytes as stored (what a
    writer copies to carry the array over without decoding it).
    """

    __slots__ = ("type", "_count", "_file", "_offset", "_nbytes", "_cache")

    def __init__(self, type_: GGUFValueType, count: int, file: SourceFile, offset: int, nbytes: int):
        self.type = type_
        self._count = count
        self._file = file
        self._offset = offset  # first element's first byte
        self._nbytes = nbytes  # encoded elements, excluding the (type, count) array header
        self._cache: list | None = None

    def __len__(self) -> int:
        return self._count

    def raw(self) -> memoryview:
        """The stored bytes of the elements (for strings: each u64 length + bytes), zero-copy."""
        self._file.check_unchanged()
        return self._file.view(self._offset, self._nbytes).data

    def numpy(self) -> np.ndarray:
        """Numeric arrays as a read-only numpy view (BOOL as numpy bool). TypeError for strings/arrays."""
        if self.type not in SCALAR_FORMATS:
            raise DTypeError(f"GGUFArray of {self.type.name} ({len(self)} values) has no numpy form; use tolist()")
        self._file.check_unchanged()
        arr = self._file.view(self._offset, self._nbytes).view(np.dtype(SCALAR_FORMATS[self.type][1]))
        return arr != 0 if self.type is GGUFValueType.BOOL else arr

    def tolist(self) -> list:
        """The elements as Python values (strings decoded), read once and cached."""
        if self._cache is None:
            if self.type in SCALAR_FORMATS:
                self._cache = self.numpy().tolist()
            else:
                self._file.check_unchanged()
                buf = self._file.view(self._offset, self._nbytes).data
                self._cache = _decode_elements(buf, self.type, self._count)
        return self._cache

    def __getitem__(self, index):
        if self._cache is None and self.type in SCALAR_FORMATS and isinstance(index, (int, np.integer)):
            return self.numpy()[index].item()
        return self.tolist()[index]

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other):
        if isinstance(other, GGUFArray):
            if self.type is other.type and len(self) == len(other) and bytes(self.raw()) == bytes(other.raw()):
                return True
            return self.tolist() == other.tolist()
        if isinstance(other, np.ndarray):
            other = other.tolist()
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes, bytearray)):
            return len(self) == len(other) and self.tolist() == list(other)
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]  # unhashable like a list; typeshed types object.__hash__ as a method

    def __repr__(self) -> str:
        if self._count <= 6:
            body = ", ".join(repr(v) for v in self.tolist())
        else:
            head = self[:3]
            body = ", ".join(repr(v) for v in head) + f", ... ({self._count} items)"
        return f"GGUFArray({self.type.name}: [{body}])"


def _decode_elements(buf: memoryview, type_: GGUFValueType, count: int) -> list:
    """Decode `count` already-validated elements of `type_` from `buf` (strings and nested arrays)."""
    out: list = []
    pos = 0
    unpack = struct.unpack_from
    if type_ is GGUFValueType.STRING:
        for _ in range(count):
            (n,) = unpack("<Q", buf, pos)
            pos += 8
            out.append(str(buf[pos:pos + n], "utf-8", "surrogateescape"))
            pos += n
        return out
    # nested arrays
    for _ in range(count):
        sub, n = unpack("<IQ", buf, pos)
        pos += 12
        sub = GGUFValueType(sub)
        if sub in SCALAR_FORMATS:
            size = _SCALAR_SIZE[sub] * n
            arr = np.frombuffer(buf[pos:pos + size], dtype=SCALAR_FORMATS[sub][1])
            out.append((arr != 0).tolist() if sub is GGUFValueType.BOOL else arr.tolist())
            pos += size
        else:
            end = _skip_elements(buf, pos, sub, n)
            out.append(_decode_elements(buf[pos:end], sub, n))
            pos = end
    return out


def _skip_elements(buf: memoryview, pos: int, type_: GGUFValueType, count: int) -> int:
    """End position of `count` validated elements starting at `pos` (used only on validated bytes)."""
    if type_ in SCALAR_FORMATS:
        return pos + _SCALAR_SIZE[type_] * count
    unpack = struct.unpack_from
    for _ in range(count):
        if type_ is GGUFValueType.STRING:
            (n,) = unpack("<Q", buf, pos)
            pos += 8 + n
        else:
            sub, n = unpack("<IQ", buf, pos)
            pos = _skip_elements(buf, pos + 12, GGUFValueType(sub), n)
    return pos


class GGUFMetadata(dict):
    """GGUF key/value metadata as a dict of Python values, remembering each key's GGUF value type.

    `types[key]` is the `GGUFValueType` the file stored (`ARRAY` for arrays; the element type is the
    `GGUFArray`'s `.type`). The streaming writer uses it to write keys back with the same types.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.types: dict[str, GGUFValueType] = {}

    def copy(self) -> "GGUFMetadata":
        """A copy (values and their recorded GGUF types) that can be edited without touching this one."""
        new = GGUFMetadata(self)
        new.types = {k: t for k, t in self.types.items() if k in new}
        return new

    def plain(self) -> dict:
        """A plain dict with arrays as lists (e.g. for json.dumps)."""
        return {k: (v.tolist() if isinstance(v, GGUFArray) else v) for k, v in self.items()}


# --- the header parser -----------------------------------------------------------------------------------
class _Cursor:
    """Bounds-checked little-endian reads over a file's bytes. Every length is checked against what is left."""

    __slots__ = ("file", "where", "buf", "pos", "size", "fetch")

    def __init__(self, file: SourceFile):
        self.file = file
        self.where = file.path
        # The whole file's bytes, unread: a local map, or a remote object's sparse mirror whose header bytes
        # `fetch` brings in before they are parsed (None for local files, where every byte is present).
        self.buf = file.whole_view().data
        self.pos = 0
        self.size = file.size
        self.fetch = getattr(file, "ensure_header", None)

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise FormatError(
                f"{self.where}: truncated header: {what} needs {n} bytes at offset {self.pos} "
                f"but only {self.size - self.pos} remain in the file ({self.size} bytes)"
            )
        if self.fetch is not None:
            self.fetch(self.pos, n)

    def unpack(self, fmt: str, size: int, what: str):
        self.need(size, what)
        vals = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return vals

    def u32(self, what: str) -> int:
        return self.unpack("<I", 4, what)[0]

    def u64(self, what: str) -> int:
        return self.unpack("<Q", 8, what)[0]

    def raw_string(self, what: str) -> memoryview:
        n = self.u64(f"the length of {what}")
        if n > self.size - self.pos:
            raise FormatError(
                f"{self.where}: {what} claims {n} bytes at offset {self.pos} but only "
                f"{self.size - self.pos} remain in the file: corrupt or truncated header"
            )
        if self.fetch is not None:
            self.fetch(self.pos, n)
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def name(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{self.where}: {what} is not valid UTF-8: {e}") from None


def _value_type(cur: _Cursor, raw: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        known = ", ".join(f"{t.value}={t.name}" for t in GGUFValueType)
        raise FormatError(f"{cur.where}: {what} has unknown value type {raw} (known: {known})") from None


def _read_value(cur: _Cursor, type_: GGUFValueType, what: str):
    if type_ in SCALAR_FORMATS:
        fmt, _ = SCALAR_FORMATS[type_]
        (v,) = cur.unpack(fmt, _SCALAR_SIZE[type_], what)
        return bool(v) if type_ is GGUFValueType.BOOL else v
    if type_ is GGUFValueType.STRING:
        return str(cur.raw_string(what), "utf-8", "surrogateescape")
    return _read_array(cur, what, depth=0)


def _read_array(cur: _Cursor, what: str, depth: int) -> GGUFArray:
    """Validate an array's (type, count, elements) at the cursor and return it lazily."""
    if depth >= MAX_ARRAY_NESTING:
        raise FormatError(f"{cur.where}: {what}: arrays nested deeper than {MAX_ARRAY_NESTING} levels")
    sub = _value_type(cur, cur.u32(f"the element type of {what}"), f"{what}'s elements")
    count = cur.u64(f"the length of {what}")
    min_size = _MIN_ELEMENT_SIZE[sub]
    if count > cur.left() // min_size:
        raise FormatError(
            f"{cur.where}: {what} claims {count} {sub.name} elements (at least {min_size} bytes each) at offset "
            f"{cur.pos} but only {cur.left()} bytes remain in the file: corrupt or truncated header"
        )
    start = cur.pos
    if sub in SCALAR_FORMATS:
        cur.pos += count * min_size  # bounded above
    elif sub is GGUFValueType.STRING:
        buf, pos, size, fetch = cur.buf, cur.pos, cur.size, cur.fetch
        unpack = struct.unpack_from
        for i in range(count):
            if pos + 8 > size:
                cur.pos = pos
                cur.need(8, f"the length of element {i} of {what}")
            if fetch is not None:
                fetch(pos, 8)
            (n,) = unpack("<Q", buf, pos)
            pos += 8
            if n > size - pos:
                raise FormatError(
                    f"{cur.where}: element {i} of {what} claims {n} bytes at offset {pos} but only "
                    f"{size - pos} remain in the file: corrupt or truncated header"
                )
            pos += n
        cur.pos = pos
    else:  # nested arrays
        for i in range(count):
            _read_array(cur, f"element {i} of {what}", depth + 1)
    return GGUFArray(sub, count, cur.file, start, cur.pos - start)


class _Info:
    __slots__ = ("name", "ne", "ggml_type", "offset")

    def __init__(self, name, ne, ggml_type, offset):
        self.name, self.ne, self.ggml_type, self.offset = name, ne, ggml_type, offset


def read_gguf(path: str) -> tuple[list[TensorRecord], GGUFMetadata]:
    """Validate one GGUF file and return its tensor records (file order) and metadata.

    Raises FormatError (naming the file and, where known, the key or tensor) for any inconsistency.
    """
    f = SourceFile.open(path)
    where = f.path
    if f.size < 4 or f.read(0, 4) != GGUF_MAGIC:
        head = f.read(0, min(4, f.size))
        raise FormatError(f"{where}: not a GGUF file: magic is {head!r}, expected {GGUF_MAGIC!r}")
    cur = _Cursor(f)
    cur.pos = 4
    version = cur.u32("the version")
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS:
            raise FormatError(f"{where}: big-endian GGUF (version {swapped}) is not supported")
        if version == 1:
            raise FormatError(f"{where}: GGUF version 1 is obsolete (32-bit counts); only versions 2 and 3 are "
                              "supported")
        raise FormatError(f"{where}: unsupported GGUF version {version} (supported: 2, 3)")
    tensor_count = cur.u64("the tensor count")
    kv_count = cur.u64("the metadata key/value count")
    left = cur.left()
    if tensor_count > left // _MIN_TENSOR_INFO_BYTES or kv_count > left // _MIN_KV_BYTES or (
        tensor_count * _MIN_TENSOR_INFO_BYTES + kv_count * _MIN_KV_BYTES > left
    ):
        raise FormatError(
            f"{where}: header claims {tensor_count} tensors and {kv_count} metadata keys, which cannot fit in "
            f"the {left} bytes left in the file: corrupt or truncated header"
        )

    # --- key/values
    meta = GGUFMetadata()
    for i in range(kv_count):
        key = cur.name(f"metadata key #{i}")
        if key in meta:
            raise FormatError(f"{where}: metadata key {key!r} appears twice")
        vtype = _value_type(cur, cur.u32(f"the value type of metadata key {key!r}"), f"metadata key {key!r}")
        meta[key] = _read_value(cur, vtype, f"metadata key {key!r}")
        meta.types[key] = vtype

    alignment = DEFAULT_ALIGNMENT
    if _ALIGNMENT in meta:
        alignment = meta[_ALIGNMENT]
        if meta.types[_ALIGNMENT] is not GGUFValueType.UINT32:
            raise FormatError(f"{where}: {_ALIGNMENT} must be a UINT32, not {meta.types[_ALIGNMENT].name}")
        if alignment == 0 or alignment & (alignment - 1):
            raise FormatError(f"{where}: {_ALIGNMENT} {alignment} is not a power of two")

    # --- tensor infos
    infos: list[_Info] = []
    seen: set[str] = set()
    for i in range(tensor_count):
        name = cur.name(f"the name of tensor #{i}")
        if name in seen:
            raise FormatError(f"{where}: tensor {name!r} appears twice")
        seen.add(name)
        what = f"tensor {name!r}"
        n_dims = cur.u32(f"the number of dimensions of {what}")
        if n_dims > MAX_DIMS:
            raise FormatError(f"{where}: {what} has {n_dims} dimensions (at most {MAX_DIMS} supported)")
        ne = cur.unpack(f"<{n_dims}Q", 8 * n_dims, f"the dimensions of {what}") if n_dims else ()
        raw_type = cur.u32(f"the type of {what}")
        offset = cur.u64(f"the data offset of {what}")
        try:
            ggml_type = GGMLQuantizationType(raw_type)
        except ValueError:
            raise FormatError(f"{where}: {what} has unknown ggml type id {raw_type}") from None
        infos.append(_Info(name, tuple(ne), ggml_type, offset))

    data_start = -(-cur.pos // alignment) * alignment
    records = [_record(f, info, data_start, alignment) for info in infos]

    # No two tensors may share bytes.
    spans = sorted((r.offset, r.offset + r.nbytes, r.name) for r in records if r.nbytes)
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise FormatError(
                f"{where}: tensor {bn!r} at bytes [{b0}, {b1}) overlaps tensor {an!r} at bytes [{a0}, {a1})"
            )
    return records, meta


def _record(f: SourceFile, info: _Info, data_start: int, alignment: int) -> TensorRecord:
    where, name, ne, t = f.path, info.name, info.ne, info.ggml_type
    what = f"tensor {name!r}"
    for d in ne:
        if d > INT64_MAX:
            raise FormatError(f"{where}: {what}: dimension {d} in ne={list(ne)} exceeds int64")
    elements = 1
    for d in ne:
        elements *= d
    if elements > INT64_MAX:
        raise FormatError(
            f"{where}: {what}: dims ne={list(ne)} multiply to {elements} elements, which overflows int64"
        )
    if t not in GGML_QUANT_SIZES:
        raise FormatError(f"{where}: {what} has ggml type {t.name} whose block size is unknown")
    block, type_size = GGML_QUANT_SIZES[t]
    dtype = GGML_DTYPES.get(t)
    encoding = None
    if dtype is None:
        encoding = GGML_ENCODINGS.get(t)
        if encoding is None:
            raise FormatError(f"{where}: {what} has ggml type {t.name}, which lazyweights does not support")
        if not ne:
            raise FormatError(f"{where}: {what}: a quantized ({t.name}) tensor needs at least one dimension")
        if ne[0] % block:
            raise FormatError(
                f"{where}: {what}: {t.name} packs {block} values per block but the row length ne[0]={ne[0]} "
                f"is not a multiple of it"
            )
        dtype = DType.uint8
        shape = tuple(reversed(ne[1:])) + (ne[0] // block * type_size,)
    else:
        shape = tuple(reversed(ne))
    nbytes = elements // block * type_size
    if info.offset % alignment:
        raise FormatError(f"{where}: {what}: data offset {info.offset} is not a multiple of the alignment {alignment}")
    start = data_start + info.offset
    if start + nbytes > f.size:
        raise FormatError(
            f"{where}: {what}: {t.name} ne={list(ne)} needs bytes [{start}, {start + nbytes}) but the file has "
            f"{f.size} bytes: truncated tensor data or an offset outside the file"
        )
    extra = {"format": "gguf", "ggml_type": int(t), "ne": ne}
    return TensorRecord(f, name, start, nbytes, dtype, shape, encoding, extra=extra)


# --- checkpoints (single and split) --------------------------------------------------------------------------
def _open_part(url: str) -> None:
    """Open a remote part of a split GGUF with its metadata's first `HEADER_READAHEAD` bytes."""
    RemoteFile.open(url, *current_options(), readahead=HEADER_READAHEAD)


def _split_siblings(path: str) -> list[str] | None:
    """All part paths for a split-named file, or None when the name is not `...-0000k-of-0000n.gguf`."""
    d, base = (path.rsplit("/", 1) if is_url(path) else os.path.split(os.path.abspath(path)))
    m = _SPLIT_NAME.match(base)
    if not m:
        return None
    count = int(m["count"])
    if count < 1 or not 1 <= int(m["no"]) <= count:
        return None
    ext = base[-5:]  # keep the extension's spelling
    join = (lambda a, b: f"{a}/{b}") if is_url(path) else os.path.join
    return [join(d, split_part_name(m["prefix"], i, count)[:-5] + ext) for i in range(1, count + 1)]


def read_gguf_checkpoint(files: list[str]):
    """Read one GGUF file, every part of a split GGUF (given any part or all), or several GGUF files.

    Returns a `Checkpoint` with the tensors of all parts in split order, the metadata of the first part
    (without the `split.*` keys), and the part files in order.
    """
    from .checkpoint import Checkpoint, WeightsFormat

    if not files:
        raise UsageError("no GGUF files given")
    # Parse what was given; a part of a split (split.count > 1) pulls in its siblings by llama.cpp's naming.
    parsed: dict[str, tuple[list[TensorRecord], GGUFMetadata]] = {}
    for p in [absolute_location(x) for x in files]:
        if p not in parsed:
            parsed[p] = read_gguf(p)
        count = parsed[p][1].get(_SPLIT_COUNT)
        if not isinstance(count, int) or count <= 1:
            continue
        siblings = _split_siblings(p)
        if not siblings or len(siblings) != count:
            continue  # not named like gguf-split's output: every part must be given (checked below)
        # parts behind URLs are opened (identity and the metadata's first bytes) all at once, then parsed in
        # order: a failed open is left for that part's own turn, which names it as before
        opening = open_all([s for s in siblings if s not in parsed and is_url(s)], _open_part) \
            if any(is_url(s) for s in siblings) else {}
        for i, sib in enumerate(siblings):
            if sib in parsed:
                continue
            if sib in opening:
                opening[sib].exception()  # waited for; its error (if any) comes from the calls below
            if not location_exists(sib):
                raise FormatError(f"{sib}: missing part {i + 1} of {count} of the split GGUF {p}")
            parsed[sib] = read_gguf(sib)
    parts = [(p, recs, meta) for p, (recs, meta) in parsed.items()]

    # Validate split keys: every part of one split agrees on the count and numbers are 0..count-1.
    split_parts = [(p, m) for p, _, m in parts if _SPLIT_COUNT in m]
    if split_parts:
        counts = {int(m[_SPLIT_COUNT]) for _, m in split_parts}
        if len(counts) != 1 or len(split_parts) != len(parts):
            raise FormatError(
                "GGUF files from different splits (or split and unsplit files) were given together: "
                + ", ".join(f"{p} ({_SPLIT_COUNT}={m.get(_SPLIT_COUNT)})" for p, _, m in parts)
            )
        count = counts.pop()
        by_no: dict[int, tuple] = {}
        for part in parts:
            p, _, m = part
            no = m.get(_SPLIT_NO)
            if not isinstance(no, int) or not 0 <= no < count:
                raise FormatError(f"{p}: {_SPLIT_NO}={no!r} is not a part number below {_SPLIT_COUNT}={count}")
            if no in by_no:
                raise FormatError(f"{p}: split part {no + 1} of {count} given twice (also {by_no[no][0]})")
            by_no[no] = part
        if len(by_no) != count:
            missing = [i + 1 for i in range(count) if i not in by_no]
            first = by_no[min(by_no)][0]
            guess = _split_siblings(first)
            if not guess or len(guess) != count:
                guess = None
            names = ", ".join(guess[i - 1] if guess else f"part {i}" for i in missing)
            raise FormatError(f"{first}: split GGUF has {count} parts but part(s) {missing} are missing: {names}")
        parts = [by_no[i] for i in range(count)]
        total = sum(len(r) for _, r, _ in parts)
        declared = parts[0][2].get(_SPLIT_TENSORS)
        if isinstance(declared, int) and declared != total:
            raise FormatError(
                f"{parts[0][0]}: {_SPLIT_TENSORS} says {declared} tensors but the {count} parts hold {total}"
            )

    records: dict[str, TensorRecord] = {}
    for p, recs, _ in parts:
        for r in recs:
            if r.name in records:
                raise FormatError(
                    f"tensor {r.name!r} appears in two GGUF files: {records[r.name].file.path} and {p} "
                    "(separate models, e.g. two quantizations in one directory? pass the one file you want)"
                )
            records[r.name] = r
    metadata = parts[0][2].copy()
    if split_parts:
        for k in SPLIT_KEYS:
            metadata.pop(k, None)
            metadata.types.pop(k, None)
    return Checkpoint(WeightsFormat.gguf, records, metadata, [p for p, _, _ in parts])
