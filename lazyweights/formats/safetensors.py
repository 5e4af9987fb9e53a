"""Read safetensors files: validate the header at open, describe each tensor as a zero-copy `TensorRecord`.

Layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N bytes of
JSON (`{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}}`), then the
data buffer; offsets are relative to the buffer's start. Like the safetensors package, we require the
tensors to tile the buffer exactly (no overlaps, no holes, nothing past the end), so a truncated file or
a polyglot file is rejected before any tensor is read. Every size is computed with Python ints.

Example:
    >>> import numpy as np, tempfile, os
    >>> from safetensors.numpy import save_file
    >>> from lazyweights.formats.safetensors import read_safetensors
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> save_file({"w": np.ones((2, 3), np.float32)}, path, metadata={"format": "np"})
    >>> records, meta = read_safetensors(path)
    >>> [(r.name, r.dtype.name, r.shape) for r in records], meta
    ([('w', 'float32', (2, 3))], {'format': 'np'})
"""
from __future__ import annotations

import json
import struct

from ..core.dtype import DType
from ..core.errors import FormatError
from .source import SourceFile, TensorRecord

# The safetensors package refuses headers over 100 MB; so do we, before reading them.
MAX_HEADER_BYTES = 100_000_000

DTYPE_CODES: dict[str, DType] = {
    "BOOL": DType.bool,
    "U8": DType.uint8, "I8": DType.int8,
    "U16": DType.uint16, "I16": DType.int16,
    "U32": DType.uint32, "I32": DType.int32,
    "U64": DType.uint64, "I64": DType.int64,
    "F16": DType.float16, "BF16": DType.bfloat16, "F32": DType.float32, "F64": DType.float64,
    "F8_E4M3": DType.float8_e4m3fn, "F8_E5M2": DType.float8_e5m2, "F8_E8M0": DType.float8_e8m0fnu,
}
CODE_OF_DTYPE: dict[DType, str] = {v: k for k, v in DTYPE_CODES.items()}


def read_safetensors(path: str) -> tuple[list[TensorRecord], dict[str, str]]:
    """Validate a safetensors file's header and return its tensor records (file order) and metadata.

    Raises FormatError (naming the file and tensor) for any inconsistency.
    """
    f = SourceFile.open(path)
    where = f.path
    if f.size < 8:
        raise FormatError(f"{where}: not a safetensors file: {f.size} bytes is shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", f.read(0, 8))
    if n > MAX_HEADER_BYTES:
        raise FormatError(f"{where}: header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit (corrupt or hostile "
                          "file)")
    if 8 + n > f.size:
        raise FormatError(f"{where}: header length {n} runs past the end of the file ({f.size} bytes): truncated or "
                          "not safetensors")
    raw = f.read(8, n)
    if not raw.lstrip(b" ").startswith(b"{"):
        raise FormatError(f"{where}: header does not start with '{{': not a safetensors file")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as e:
        # json.loads would keep the last of two entries with one name, so a hostile header could describe
        # a tensor twice and have one description ignored: refuse it, naming the tensor.
        raise FormatError(f"{where}: tensor {e.args[0]!r} appears twice in the header") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError too: an integer literal
        # over 4300 digits (sys.int_max_str_digits) is a ValueError, not a JSONDecodeError (test_fuzz.py)
        raise FormatError(f"{where}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{where}: header JSON is a {type(header).__name__}, expected an object")

    metadata = header.pop("__metadata__", None)
    if metadata is None:  # (not `or {}`: a falsy non-object such as [] or "" must be refused below)
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise FormatError(f"{where}: __metadata__ must map strings to strings")

    data_start = 8 + n
    data_len = f.size - data_start
    entries = []
    for name, info in header.items():
        entries.append((name, *_parse_entry(where, name, info)))

    # The tensors must tile the data buffer: sorted by offset, each starting where the previous ended.
    entries.sort(key=lambda e: (e[3][0], e[3][1]))
    expected = 0
    for name, _dtype, _shape, (begin, end) in entries:
        if begin != expected:
            if begin < expected:
                raise FormatError(f"{where}: tensor {name!r} at bytes [{begin}, {end}) overlaps the previous tensor "
                                  f"(which ends at {expected})")
            raise FormatError(f"{where}: hole in the data buffer before tensor {name!r}: bytes [{expected}, {begin}) "
                              "belong to no tensor")
        expected = end
    if expected > data_len:
        last = entries[-1][0]
        raise FormatError(f"{where}: tensor {last!r} ends at data byte {expected} but the file holds only {data_len} "
                          "data bytes: truncated")
    if expected < data_len:
        # (the message now names the last tensor too, as every other layout error does)
        last = f" ({entries[-1][0]!r}, ending at data byte {expected})" if entries else ""
        raise FormatError(f"{where}: {data_len - expected} trailing bytes after the last tensor{last} belong to no "
                          "tensor")

    # Every size was checked above, so the records skip their own checks (`TensorRecord.trusted`).
    make = TensorRecord.trusted
    records = [make(f, name, data_start + begin, end - begin, dtype, shape, None, _EXTRA)
               for name, dtype, shape, (begin, end) in entries]
    return records, metadata


# One `extra` for every safetensors record (read-only by convention: nothing writes a record's extra).
_EXTRA = {"format": "safetensors"}


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs):
    out = dict(pairs)  # (in C: this hook runs once per JSON object, ~90,000 times for DeepSeek-V3)
    if len(out) != len(pairs):
        seen: set = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def _parse_entry(where: str, name: str, info) -> tuple[DType, tuple[int, ...], tuple[int, int]]:
    if type(info) is dict and len(info) == 3:  # the common entry, checked in fewer steps (same checks)
        code, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        dtype = DTYPE_CODES.get(code) if type(code) is str else None
        if (dtype is not None and type(shape) is list and type(offs) is list and len(offs) == 2
                and type(offs[0]) is int and type(offs[1]) is int and 0 <= offs[0] <= offs[1]):
            elements, span = 1, 1
            for d in shape:
                if type(d) is not int or d < 0:
                    break
                elements *= d
                span *= d or 1
            else:
                if elements * dtype.size_in_bytes == offs[1] - offs[0] and len(shape) <= 32 and span <= 2**60:
                    return dtype, tuple(shape), (offs[0], offs[1])
    if not isinstance(info, dict):
        raise FormatError(f"{where}: tensor {name!r}: header entry is a {type(info).__name__}, expected an object")
    code = info.get("dtype")
    if not isinstance(code, str) or code not in DTYPE_CODES:  # (a list/dict code is unhashable: check str first)
        raise FormatError(f"{where}: tensor {name!r}: unknown or unsupported dtype code {code!r} (known: "
                          f"{', '.join(DTYPE_CODES)})")
    dtype = DTYPE_CODES[code]
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise FormatError(f"{where}: tensor {name!r}: shape {shape!r} must be a list of non-negative integers")
    offs = info.get("data_offsets")
    if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int and o >= 0 for o in offs)):
        raise FormatError(f"{where}: tensor {name!r}: data_offsets {offs!r} must be two non-negative integers")
    begin, end = offs
    if end < begin:
        raise FormatError(f"{where}: tensor {name!r}: data_offsets end {end} is before begin {begin}")
    elements, span = 1, 1
    for d in shape:
        elements *= d
        span *= d or 1
    if len(shape) > 32 or span > 2**60:  # (what `TensorRecord` refuses: the records are made trusted)
        raise FormatError(
            f"{where}: tensor {name!r}: shape {list(shape)} cannot be represented "
            f"(more than 32 dimensions, or non-zero dims multiplying past 2**60 values)"
        )
    if elements * dtype.size_in_bytes != end - begin:
        raise FormatError(
            f"{where}: tensor {name!r}: {code}{shape} needs {elements * dtype.size_in_bytes} bytes "
            f"but data_offsets [{begin}, {end}) span {end - begin}"
        )
    return dtype, tuple(shape), (begin, end)
