"""Stream a GGUF file to disk: the whole header from planned shapes and types, then tensor data in any order.

Three layers, so a scheduler can drive the writing:

- `GGUFLayout.plan(tensors_meta, metadata, alignment)` computes the complete header (key/values and tensor
  infos) from each tensor's planned dtype, shape and quantization encoding alone, and every tensor's
  absolute byte offset in the file. Nothing is materialized.
- `GGUFStreamWriter(path, layout)` opens `path + ".tmp-<random>"` beside the target, writes the header,
  sizes the file, and accepts data with `write_tensor(name, array_or_bytes)` or, in row chunks and from any
  thread, `write_rows(name, byte_offset_within_tensor, bytes)` (positioned writes: `os.pwrite`).
  `commit()` checks every tensor was written completely, fsyncs, renames atomically to `path` and fsyncs
  the directory; `abort()` removes the temporary file. As a context manager it commits on success and
  aborts on an exception, so a failed conversion never leaves a half-written file under the final name.
- `lazy/save.save_gguf_outputs` drives them from the block scheduler (`Plan.save(..., format="gguf")`);
  `lazy/gguf.py` has the tensor-at-a-time `write_gguf`/`save_gguf` for adapted state dicts.
- `check_gguf_architecture`, `gguf_file_type` and `with_file_type` (below) check and complete the metadata
  a save writes.

Tensors are written in numpy order and converted back to GGUF's `ne` (reversed) here: an unquantized
`float32[11008, 4096]` is `ne=[4096, 11008]`; a quantized `uint8[rows, row_bytes]` with encoding Q4_K is
`ne=[row_bytes / 144 * 256, rows]` of type Q4_K.

Metadata values keep their GGUF types where known: a `GGUFMetadata` read from a GGUF file remembers each
key's type, a `GGUFArray` is copied as stored, and `GGUFValue(value, type)` forces one. Otherwise: bool
-> BOOL, str -> STRING, int -> UINT32 (INT32 if negative; 64-bit when it does not fit), float -> FLOAT32,
numpy scalars by their dtype, lists and numpy arrays -> ARRAY of the inferred element type.

Example:
    >>> import numpy as np, tempfile, os
    >>> from lazyweights.formats.gguf import read_gguf
    >>> path = os.path.join(tempfile.mkdtemp(), "out.gguf")
    >>> w = np.ones((2, 3), np.float32)
    >>> with GGUFStreamWriter(path, GGUFLayout.plan({"w": w}, {"general.architecture": "llama"})) as out:
    ...     out.write_tensor("w", w)
    >>> records, meta = read_gguf(path)
    >>> [(r.name, r.shape, r.extra["ne"]) for r in records], meta["general.architecture"]
    ([('w', (2, 3), (3, 2))], 'llama')
"""
from __future__ import annotations

import bisect
import os
import struct
import threading
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import numpy as np
from gguf.constants import (
    GGML_QUANT_SIZES,
    GGML_QUANT_VERSION,
    GGMLQuantizationType,
    GGUFValueType,
    Keys,
    LlamaFileType,
)

from ..core.dtype import DType
from ..core.errors import (
    ArgumentTypeError,
    DTypeError,
    GGUFConfigError,
    MissingWeightError,
    ShapeError,
    UsageError,
    WriteError,
)
from ..core.quantization import QuantizationEncoding
from ..graph.node import Node
from ..graph.opcodes import Op
from ..io.atomic import AtomicFile
from .gguf import DEFAULT_ALIGNMENT, DTYPE_GGML, ENCODING_GGML, GGUF_MAGIC, SCALAR_FORMATS, SPLIT_KEYS, GGUFArray
from .source import TensorRecord

GGUF_WRITE_VERSION = 3
GGML_MAX_DIMS = 4  # llama.cpp refuses tensors with more dimensions


class GGUFValue(NamedTuple):
    """A metadata value with an explicit GGUF type; `sub_type` is the element type of an ARRAY."""

    value: Any
    type: GGUFValueType
    sub_type: GGUFValueType | None = None


class TensorMeta(NamedTuple):
    """What the layout needs to know about one tensor: its stored dtype, numpy-order shape and encoding."""

    dtype: DType
    shape: tuple
    encoding: QuantizationEncoding | None = None


@dataclass(frozen=True)
class GGUFTensorSlot:
    """One tensor's place in a planned GGUF file."""

    name: str
    ggml_type: GGMLQuantizationType
    ne: tuple[int, ...]          # GGUF order (fastest-varying first)
    dtype: DType                 # what the data must be: the element dtype, or uint8 for quantized blocks
    shape: tuple[int, ...]       # numpy order, as lazyweights reads it back
    encoding: QuantizationEncoding | None
    nbytes: int
    offset: int                  # absolute offset in the file

    @property
    def end(self) -> int:
        """The file offset just past the tensor's bytes (`offset + nbytes`)."""
        return self.offset + self.nbytes


# --- metadata encoding ----------------------------------------------------------------------------------------
def _pack_string(s, what: str) -> bytes:
    if isinstance(s, str):
        b = s.encode("utf-8", "surrogateescape")
    elif isinstance(s, (bytes, bytearray, memoryview)):
        b = bytes(s)
    else:
        raise DTypeError(f"GGUF metadata {what}: expected a string, got {type(s).__name__}")
    return struct.pack("<Q", len(b)) + b


_NUMPY_VALUE_TYPES = {
    np.dtype(np.uint8): GGUFValueType.UINT8, np.dtype(np.int8): GGUFValueType.INT8,
    np.dtype(np.uint16): GGUFValueType.UINT16, np.dtype(np.int16): GGUFValueType.INT16,
    np.dtype(np.uint32): GGUFValueType.UINT32, np.dtype(np.int32): GGUFValueType.INT32,
    np.dtype(np.uint64): GGUFValueType.UINT64, np.dtype(np.int64): GGUFValueType.INT64,
    np.dtype(np.float32): GGUFValueType.FLOAT32, np.dtype(np.float64): GGUFValueType.FLOAT64,
    np.dtype(np.bool_): GGUFValueType.BOOL,
}
_INT_TYPES = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
              GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}
_FLOAT_TYPES = {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}


def _infer_scalar_type(v, what: str) -> GGUFValueType:
    if isinstance(v, GGUFValue):
        return v.type
    if isinstance(v, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(v, np.generic):
        t = _NUMPY_VALUE_TYPES.get(v.dtype)
        if t is None:
            raise DTypeError(f"GGUF metadata {what}: numpy {v.dtype} has no GGUF value type")
        return t
    if isinstance(v, int):
        if 0 <= v < 2**32:
            return GGUFValueType.UINT32
        if -(2**31) <= v < 0:
            return GGUFValueType.INT32
        if -(2**63) <= v < 2**63:
            return GGUFValueType.INT64
        if 0 <= v < 2**64:
            return GGUFValueType.UINT64
        raise DTypeError(f"GGUF metadata {what}: integer {v} does not fit in 64 bits")
    if isinstance(v, float):
        return GGUFValueType.FLOAT32
    if isinstance(v, (str, bytes, bytearray)):
        return GGUFValueType.STRING
    if isinstance(v, (list, tuple, np.ndarray, GGUFArray)):
        return GGUFValueType.ARRAY
    raise DTypeError(f"GGUF metadata {what}: cannot store a {type(v).__name__} (use GGUFValue(value, type))")


def _infer_element_type(items, what: str) -> GGUFValueType:
    if isinstance(items, np.ndarray):
        if items.dtype.kind in "US":
            return GGUFValueType.STRING
        t = _NUMPY_VALUE_TYPES.get(items.dtype)
        if t is None:
            raise DTypeError(f"GGUF metadata {what}: numpy {items.dtype} arrays have no GGUF element type")
        return t
    if isinstance(items, GGUFArray):
        return items.type
    if not items:
        return GGUFValueType.INT32  # an empty array's element type is arbitrary; gguf-py uses INT32 too
    kinds = {_infer_scalar_type(v, what) for v in items}
    if kinds <= {GGUFValueType.UINT32, GGUFValueType.INT32}:
        return GGUFValueType.INT32 if all(-(2**31) <= v < 2**31 for v in items) else GGUFValueType.INT64
    if kinds <= {GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.INT64}:
        return GGUFValueType.INT64
    if kinds <= {GGUFValueType.FLOAT32, GGUFValueType.UINT32, GGUFValueType.INT32} and GGUFValueType.FLOAT32 in kinds:
        return GGUFValueType.FLOAT32
    if len(kinds) == 1:
        return kinds.pop()
    raise DTypeError(f"GGUF metadata {what}: array mixes {sorted(k.name for k in kinds)}; GGUF arrays hold one type")


def _pack_scalar(v, t: GGUFValueType, what: str) -> bytes:
    if t is GGUFValueType.STRING:
        return _pack_string(v, what)
    fmt = SCALAR_FORMATS[t][0]
    try:
        if t is GGUFValueType.BOOL:
            return struct.pack(fmt, 1 if bool(v) else 0)
        if t in _INT_TYPES:
            if isinstance(v, (float, np.floating)) and not float(v).is_integer():
                raise struct.error("not an integer")
            return struct.pack(fmt, int(v))
        return struct.pack(fmt, float(v))
    except (struct.error, TypeError, ValueError, OverflowError) as e:
        raise DTypeError(f"GGUF metadata {what}: {v!r} cannot be stored as {t.name} ({e})") from None


def _pack_array(items, sub: GGUFValueType | None, what: str) -> bytes:
    if isinstance(items, GGUFArray) and (sub is None or sub is items.type):
        return struct.pack("<IQ", items.type, len(items)) + bytes(items.raw())
    if sub is None:
        sub = _infer_element_type(items, what)
    if sub in SCALAR_FORMATS and isinstance(items, np.ndarray) and items.dtype.kind in "biuf":
        arr = items.reshape(-1)
        if sub is GGUFValueType.BOOL:
            arr = arr != 0
        body = np.ascontiguousarray(arr.astype(SCALAR_FORMATS[sub][1], copy=False)).tobytes()
        return struct.pack("<IQ", sub, arr.size) + body
    items = items.tolist() if isinstance(items, (np.ndarray, GGUFArray)) else list(items)
    parts = [struct.pack("<IQ", sub, len(items))]
    if sub is GGUFValueType.ARRAY:
        parts.extend(_pack_array(v, None, f"{what}[{i}]") for i, v in enumerate(items))
    elif sub is GGUFValueType.STRING:
        parts.extend(_pack_string(v, f"{what}[{i}]") for i, v in enumerate(items))
    else:
        if sub is not GGUFValueType.BOOL and sub in _INT_TYPES and any(isinstance(v, float) for v in items):
            raise DTypeError(f"GGUF metadata {what}: float values in a {sub.name} array")
        try:
            parts.append(np.asarray(items, dtype=SCALAR_FORMATS[sub][1] if sub is not GGUFValueType.BOOL else np.bool_)
                         .astype(SCALAR_FORMATS[sub][1]).tobytes())
        except (OverflowError, ValueError, TypeError) as e:
            raise DTypeError(f"GGUF metadata {what}: values cannot be stored as {sub.name} ({e})") from None
    return b"".join(parts)


def encode_kv(key: str, value, known_type: GGUFValueType | None = None) -> bytes:
    """One metadata entry's bytes: key string, value type, value. `known_type` (e.g. from GGUFMetadata.types)
    is used when the value fits it; otherwise the type is inferred."""
    what = f"key {key!r}"
    t: GGUFValueType
    sub: GGUFValueType | None = None
    if isinstance(value, GGUFValue):
        value, t, sub = value
    elif known_type is not None and _fits(value, known_type):
        t = known_type
    else:
        t = _infer_scalar_type(value, what)
    if t is GGUFValueType.ARRAY:
        body = _pack_array(value, sub, what)
    else:
        body = _pack_scalar(value, t, what)
    return _pack_string(key, "key") + struct.pack("<I", t) + body


def _fits(value, t: GGUFValueType) -> bool:
    if t is GGUFValueType.ARRAY:
        return isinstance(value, (list, tuple, np.ndarray, GGUFArray))
    if t is GGUFValueType.STRING:
        return isinstance(value, (str, bytes))
    if t is GGUFValueType.BOOL:
        return isinstance(value, (bool, np.bool_))
    if t in _INT_TYPES:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            return False
        try:
            struct.pack(SCALAR_FORMATS[t][0], int(value))
            return True
        except struct.error:
            return False
    return isinstance(value, (float, int, np.floating)) and not isinstance(value, (bool, np.bool_))


# --- the layout -------------------------------------------------------------------------------------------------
def _tensor_meta(name: str, value) -> TensorMeta:
    """dtype, numpy shape and encoding of a TensorMeta, Node, TensorRecord, array, (dtype, shape[, encoding]),
    or anything with `dtype`, `shape` and `quantization_encoding` (a WeightData; a Weights accessor's `.data()`)."""
    if isinstance(value, TensorMeta):
        return TensorMeta(DType.parse(value.dtype), tuple(value.shape), QuantizationEncoding.parse(value.encoding))
    # `exists` first: getattr(WeightData, "data") would compute the tensor (its `.data` is the values)
    if hasattr(value, "exists") and callable(getattr(value, "data", None)):  # a Weights accessor
        value = value.data()
    if hasattr(value, "quantization_encoding"):  # a WeightData
        return TensorMeta(DType.parse(value.dtype), tuple(value.shape), value.quantization_encoding)
    if isinstance(value, Node):
        return TensorMeta(value.dtype, tuple(value.shape), node_encoding(value))
    if isinstance(value, TensorRecord):
        return TensorMeta(value.dtype, tuple(value.shape), value.encoding)
    if isinstance(value, np.ndarray):
        return TensorMeta(DType.from_numpy(value.dtype), value.shape, None)
    if isinstance(value, tuple) and len(value) in (2, 3):
        enc = value[2] if len(value) == 3 else None
        return TensorMeta(DType.parse(value[0]), tuple(value[1]), QuantizationEncoding.parse(enc))
    raise ArgumentTypeError(f"GGUF layout: tensor {name!r}: cannot tell dtype/shape of a {type(value).__name__}")


def node_encoding(node) -> QuantizationEncoding | None:
    """The quantization encoding a bare Node carries (through layout ops that keep whole block rows)."""
    while True:
        if node.op is Op.QUANTIZE:
            return node.arg.encoding
        if node.op is Op.SOURCE:
            return node.arg.encoding
        if node.op in (Op.RESHAPE, Op.PERMUTE, Op.SLICE, Op.TAKE, Op.CONCAT) and node.srcs:
            node = node.srcs[0]
            continue
        return None


def _slot_type(name: str, meta: TensorMeta) -> tuple[GGMLQuantizationType, tuple[int, ...]]:
    """The ggml type and `ne` (GGUF order) for a tensor's planned dtype/shape/encoding."""
    shape = tuple(int(d) for d in meta.shape)
    if len(shape) > GGML_MAX_DIMS:
        raise ShapeError(
            f"GGUF tensor {name!r}: shape {list(shape)} has {len(shape)} dimensions; GGUF/ggml allow at most "
            f"{GGML_MAX_DIMS} (reshape it first)"
        )
    if meta.encoding is not None:
        gt = ENCODING_GGML.get(meta.encoding)
        if gt is None:
            raise DTypeError(f"GGUF tensor {name!r}: {meta.encoding.name} is not a GGUF block type")
        if meta.dtype is not DType.uint8 or not shape:
            raise DTypeError(
                f"GGUF tensor {name!r}: {meta.encoding.name} data must be uint8 blocks [..., row_bytes], "
                f"got {meta.dtype.name}{list(shape)}"
            )
        row_values = meta.encoding.elements_per_row_bytes(shape[-1])
        return gt, (row_values,) + tuple(reversed(shape[:-1]))
    gt = DTYPE_GGML.get(meta.dtype)
    if gt is None:
        raise DTypeError(
            f"GGUF tensor {name!r}: GGUF has no type for {meta.dtype.name} "
            f"(supported: {', '.join(d.name for d in DTYPE_GGML)}); cast it (e.g. .astype(DType.float16)) "
            "or quantize it first"
        )
    return gt, tuple(reversed(shape))


class GGUFLayout:
    """A planned GGUF file: header bytes, and each tensor's slot (type, ne, absolute offset, size)."""

    def __init__(self, header: bytes, slots: dict[str, GGUFTensorSlot], data_start: int, alignment: int,
                 total_size: int):
        self.header = header
        self.slots = slots
        self.data_start = data_start
        self.alignment = alignment
        self.total_size = total_size

    @classmethod
    def plan(cls, tensors_meta: Mapping[str, Any], metadata: Mapping[str, Any] | None = None,
             alignment: int | None = None) -> "GGUFLayout":
        """Lay out a GGUF file for `tensors_meta` (name -> WeightData / Node / TensorRecord / TensorMeta /
        (dtype, shape[, encoding])), in the mapping's order, with `metadata` as its key/values.

        `alignment` defaults to the metadata's `general.alignment`, else 32. Keys `split.*` are dropped (this
        writes one file). Reads no tensor data.
        """
        types = dict(getattr(metadata, "types", None) or {})
        return cls._plan(tensors_meta, dict(metadata or {}), types, alignment)

    @classmethod
    def _plan(cls, tensors_meta, metadata: dict, types: Mapping, alignment: int | None) -> "GGUFLayout":
        if alignment is None:
            md_align = metadata.get(Keys.General.ALIGNMENT)
            if isinstance(md_align, GGUFValue):
                md_align = md_align.value
            alignment = int(md_align) if md_align is not None else DEFAULT_ALIGNMENT
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1) or alignment >= 2**32:
            raise UsageError(f"GGUF alignment must be a power of two below 2**32, got {alignment!r}")
        for k in SPLIT_KEYS:
            metadata.pop(k, None)
        if alignment != DEFAULT_ALIGNMENT or Keys.General.ALIGNMENT in metadata:
            metadata[Keys.General.ALIGNMENT] = GGUFValue(alignment, GGUFValueType.UINT32)

        kv_parts = []
        for key, value in metadata.items():
            if not isinstance(key, str):
                raise ArgumentTypeError(f"GGUF metadata keys must be strings, got {key!r}")
            kv_parts.append(encode_kv(key, value, types.get(key)))

        planned = []
        rel = 0
        info_parts = []
        for name, value in tensors_meta.items():
            if not isinstance(name, str):
                raise ArgumentTypeError(f"GGUF tensor names must be strings, got {name!r}")
            meta = _tensor_meta(name, value)
            gt, ne = _slot_type(name, meta)
            block, type_size = GGML_QUANT_SIZES[gt]
            elements = 1
            for d in ne:
                elements *= d
            nbytes = elements // block * type_size
            info_parts.append(
                _pack_string(name, f"tensor name {name!r}")
                + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, int(gt), rel)
            )
            stored_shape = tuple(int(d) for d in meta.shape)
            planned.append((name, gt, ne, meta, stored_shape, nbytes, rel))
            rel += -(-nbytes // alignment) * alignment

        header = b"".join(
            [GGUF_MAGIC, struct.pack("<IQQ", GGUF_WRITE_VERSION, len(planned), len(kv_parts))] + kv_parts + info_parts
        )
        data_start = -(-len(header) // alignment) * alignment
        header += b"\0" * (data_start - len(header))
        slots = {
            name: GGUFTensorSlot(name, gt, ne, meta.dtype if meta.encoding is None else DType.uint8,
                                 stored_shape, meta.encoding, nbytes, data_start + r)
            for name, gt, ne, meta, stored_shape, nbytes, r in planned
        }
        return cls(header, slots, data_start, alignment, data_start + rel)

    def __repr__(self) -> str:
        return (f"<GGUFLayout: {len(self.slots)} tensors, header {self.data_start} bytes, "
                f"{self.total_size} bytes in all, alignment {self.alignment}>")


# --- the writer -----------------------------------------------------------------------------------------------
def _as_bytes(name: str, slot: GGUFTensorSlot, data) -> memoryview:
    if isinstance(data, np.ndarray):
        want = slot.dtype.to_numpy()
        if data.dtype != want:
            raise DTypeError(
                f"GGUF tensor {name!r}: data is {data.dtype}{list(data.shape)} but the layout planned "
                f"{slot.dtype.name}{list(slot.shape)}" + (f" ({slot.encoding.name} blocks)" if slot.encoding else "")
            )
        arr = np.ascontiguousarray(data).reshape(-1)
        return arr.view(np.uint8).data
    try:
        mv = memoryview(data)
    except TypeError:
        raise DTypeError(f"GGUF tensor {name!r}: cannot write a {type(data).__name__}; "
                         "give an array or bytes") from None
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


class GGUFStreamWriter:
    """Write a planned GGUF file: header at open, tensor bytes at their offsets in any order, atomic commit.

    Thread-safe: `write_rows` may be called concurrently for different (or the same) tensors.
    """

    def __init__(self, path, layout: GGUFLayout, fsync: bool = True):
        self.layout = layout
        self._lock = threading.Lock()
        self._written: dict[str, list[list[int]]] = {name: [] for name in layout.slots}
        self._starts: tuple[list[int], list[GGUFTensorSlot]] | None = None
        # The planned size from the start, sparse: a full disk fails at the write that hits it, naming the
        # tensor (tests/run/test_faults.py::test_real_full_tmpfs).
        self.file = AtomicFile(path, layout.total_size, fsync=fsync, reserve=False)
        self.path, self.tmp_path = self.file.path, self.file.tmp_path
        try:
            self.file.write(0, layout.header)
        except BaseException:
            self.abort()
            raise

    def _pwrite(self, mv: memoryview, offset: int, tensor: str | None) -> None:
        self.file.write(offset, mv, tensor=tensor)

    def _slot(self, name: str) -> GGUFTensorSlot:
        slot = self.layout.slots.get(name)
        if slot is None:
            raise MissingWeightError(f"{self.path}: tensor {name!r} is not in the GGUF layout")
        return slot

    def write_tensor(self, name: str, data) -> None:
        """Write a whole tensor: an array of the planned dtype (any shape of the right size) or raw bytes."""
        slot = self._slot(name)
        mv = _as_bytes(name, slot, data)
        if len(mv) != slot.nbytes:
            raise ShapeError(
                f"GGUF tensor {name!r}: got {len(mv)} bytes but the layout planned {slot.nbytes} "
                f"({slot.dtype.name}{list(slot.shape)}{', ' + slot.encoding.name if slot.encoding else ''})"
            )
        self._write_span(name, slot, 0, mv)

    def write_rows(self, name: str, byte_offset: int, data) -> None:
        """Write `data` (bytes or an array of the planned dtype) at `byte_offset` within tensor `name`."""
        slot = self._slot(name)
        mv = _as_bytes(name, slot, data)
        if byte_offset < 0 or byte_offset + len(mv) > slot.nbytes:
            raise ShapeError(
                f"GGUF tensor {name!r}: bytes [{byte_offset}, {byte_offset + len(mv)}) fall outside its "
                f"{slot.nbytes} bytes"
            )
        self._write_span(name, slot, byte_offset, mv)

    def write(self, offset: int, data, tensor: str | None = None) -> None:
        """Write `data` at absolute file `offset`, which must lie inside one tensor's bytes (the interface
        the fused save scheduler uses; `tensor` only labels errors)."""
        slot = self._slot_at(offset)
        if slot is None:
            raise ShapeError(f"{self.path}: offset {offset} is not inside any tensor of the GGUF layout"
                             + (f" (writing {tensor!r})" if tensor else ""))
        self.write_rows(slot.name, offset - slot.offset, data)

    def _slot_at(self, offset: int) -> GGUFTensorSlot | None:
        if self._starts is None:
            ordered = sorted(self.layout.slots.values(), key=lambda sl: sl.offset)
            self._starts = ([sl.offset for sl in ordered], ordered)
        starts, ordered = self._starts
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            return None
        slot = ordered[i]
        return slot if offset < slot.end or (slot.nbytes == 0 and offset == slot.offset) else None

    def _write_span(self, name: str, slot: GGUFTensorSlot, start: int, mv: memoryview) -> None:
        if not len(mv):
            return
        self._pwrite(mv, slot.offset + start, name)
        with self._lock:
            _add_interval(self._written[name], start, start + len(mv))

    def missing(self) -> dict[str, int]:
        """Tensors not yet completely written: name -> bytes still missing."""
        out = {}
        with self._lock:
            for name, slot in self.layout.slots.items():
                done = sum(b - a for a, b in self._written[name])
                if done != slot.nbytes:
                    out[name] = slot.nbytes - done
        return out

    # --- finishing --------------------------------------------------------------------------------------------
    def commit(self) -> str:
        """Check completeness, fsync, rename to the final path, fsync the directory. Returns the path."""
        if self.file.state == "committed":
            return self.path
        missing = self.missing()
        if missing:
            self.abort()
            shown = ", ".join(f"{n!r} ({b} bytes)" for n, b in list(missing.items())[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise WriteError(f"{self.path}: not committed: tensors not completely written: {shown}{more}",
                             path=self.path, tensor=next(iter(missing)))
        return self.file.commit()

    def abort(self) -> None:
        """Discard the temporary file (idempotent; does nothing after a commit)."""
        self.file.abort()

    def __enter__(self) -> "GGUFStreamWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self.file.state == "open":
            self.commit()


def _add_interval(spans: list[list[int]], a: int, b: int) -> None:
    """Insert [a, b) into a sorted list of disjoint intervals, merging overlaps and neighbours."""
    # Fast path: appending in order (the usual case for row chunks).
    if not spans or a > spans[-1][1]:
        spans.append([a, b])
        return
    if a >= spans[-1][0]:
        spans[-1][1] = max(spans[-1][1], b)
        return
    spans.append([a, b])
    spans.sort()
    merged = [spans[0]]
    for s in spans[1:]:
        if s[0] <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], s[1])
        else:
            merged.append(s)
    spans[:] = merged


def check_gguf_architecture(metadata: Mapping | None, path) -> None:
    """GGUFConfigError naming `path` and the key unless `metadata` holds a `general.architecture` string (as a
    value or a `GGUFValue`): llama.cpp refuses a GGUF without one, so writing it is a mistake, found before a
    byte is written.

    Example:
        >>> check_gguf_architecture({"general.architecture": "llama"}, "x.gguf")
        >>> try:
        ...     check_gguf_architecture({"general.name": "x"}, "x.gguf")
        ... except ValueError as e:
        ...     print(str(e).split(";")[0])
        x.gguf: the GGUF metadata has no general.architecture (its 1 keys: general.name)
    """
    key = Keys.General.ARCHITECTURE
    value = (metadata or {}).get(key)
    value = getattr(value, "value", value)
    if isinstance(value, str) and value:
        return
    keys = sorted(metadata or {})
    shown = ", ".join(keys[:6]) + (" ..." if len(keys) > 6 else "")
    raise GGUFConfigError(
        f"{os.fspath(path)}: the GGUF metadata has no {key} (its {len(keys)} keys: {shown or 'none'}"
        f"{'' if value is None else f'; {key}={value!r}'}); llama.cpp cannot load such a file. "
        "Save a converter's result (lazyweights.plan(convert_hf_to_gguf(...)).save) or pass metadata=, or "
        "require_architecture=False for a bare tensor container", [key])


def _file_types() -> tuple[dict[str, int], dict[str, int]]:
    """gguf-py's LlamaFileType (llama.cpp's `llama_ftype`) for the type most 2-D tensors have: by quantization
    encoding (a K-quant as its preset's _M, as llama.cpp's converter and llama-quantize write them) and by dtype.
    Built on first use."""
    F = LlamaFileType
    by_encoding = {"Q4_0": F.MOSTLY_Q4_0, "Q4_1": F.MOSTLY_Q4_1, "Q8_0": F.MOSTLY_Q8_0, "Q5_0": F.MOSTLY_Q5_0,
                   "Q5_1": F.MOSTLY_Q5_1, "Q2_K": F.MOSTLY_Q2_K, "Q3_K": F.MOSTLY_Q3_K_M, "Q4_K": F.MOSTLY_Q4_K_M,
                   "Q5_K": F.MOSTLY_Q5_K_M, "Q6_K": F.MOSTLY_Q6_K, "IQ4_NL": F.MOSTLY_IQ4_NL,
                   "IQ4_XS": F.MOSTLY_IQ4_XS, "MXFP4": F.MOSTLY_MXFP4_MOE}
    by_dtype = {"float32": F.ALL_F32, "float16": F.MOSTLY_F16, "bfloat16": F.MOSTLY_BF16}
    return {k: int(v) for k, v in by_encoding.items()}, {k: int(v) for k, v in by_dtype.items()}


def gguf_file_type(tensors: Mapping[str, Any]) -> tuple[int, bool]:
    """(`general.file_type`, any tensor quantized) for the tensors a GGUF will hold (name -> anything with
    `dtype`, `shape`, `quantization_encoding` and `node.nbytes`, e.g. WeightData): the type of the most bytes
    among tensors of 2+ dimensions (1-D norms are float32 whatever the file type, as in llama.cpp).

    >>> import numpy as np; from lazyweights import WeightData, DType
    >>> gguf_file_type({"w": WeightData.from_numpy(np.zeros((4, 4), np.float32), "w").astype(DType.bfloat16)})
    (32, False)
    """
    weight: dict[str, int] = {}
    quantized = False
    for _name, wd in tensors.items():
        enc = getattr(wd, "quantization_encoding", None)
        quantized = quantized or enc is not None
        if len(wd.shape) < 2:
            continue
        key = enc.name if enc is not None else wd.dtype.name
        weight[key] = weight.get(key, 0) + int(wd.node.nbytes)
    by_encoding, by_dtype = _file_types()
    if not weight:
        return by_dtype["float32"], quantized
    top = max(weight, key=weight.__getitem__)
    if "MXFP4" in weight and top in by_dtype:
        return by_encoding["MXFP4"], quantized  # llama.cpp's converter: MXFP4 experts make the file MXFP4_MOE
    if top in by_encoding:
        return by_encoding[top], quantized
    if top in by_dtype:
        return by_dtype[top], quantized
    raise DTypeError(f"no llama.cpp file type for tensors stored as {top} (2-D tensors by bytes: {weight})")


def with_file_type(metadata: Mapping, tensors: Mapping[str, Any]) -> dict:
    """`metadata` with `general.file_type` (and `general.quantization_version`) saying what `tensors` are
    (`gguf_file_type`), as llama.cpp's converter writes them: a converter's metadata, saved after its tensors
    changed, still tells the truth."""
    ftype, quantized = gguf_file_type(tensors)
    out = dict(metadata)
    out[Keys.General.FILE_TYPE] = GGUFValue(int(ftype), GGUFValueType.UINT32)
    if quantized:
        out[Keys.General.QUANTIZATION_VERSION] = GGUFValue(GGML_QUANT_VERSION, GGUFValueType.UINT32)
    else:
        out.pop(Keys.General.QUANTIZATION_VERSION, None)
    return out
