"""DLPack export for materialized host arrays.

numpy exports standard dtypes itself. It refuses bfloat16 and fp8 (they are ml_dtypes' extension types),
so for those we let numpy export the same bytes as an unsigned integer array of the same width and then
relabel the exported tensor's dtype with DLPack's type code (kDLBfloat = 4, and the float8 codes of
DLPack 1.1). numpy's capsule keeps owning the memory and its lifetime, so consumers that understand
those codes (torch for bf16) share the memory without a copy; numpy's own `from_dlpack` still cannot
import them (it raises BufferError/RuntimeError), which is numpy's limit.

Why relabel numpy's capsule instead of building our own DLManagedTensor with ctypes: a capsule
destructor written in Python must not re-reference the capsule being freed and cannot run safely while
the consumer has an exception pending, and getting either wrong crashes the interpreter on every
unconsumed export. Relabelling numpy's own capsule needs no destructor of ours at all
(test_torch_interop.py exercises unconsumed and failed exports).

Read-only arrays (zero-copy views of a checkpoint's memory map) can only be flagged read-only in a
DLPack >= 1.0 capsule. A consumer that asks for a legacy capsule (`__dlpack__()` with no `max_version`,
as MAX's `Buffer.from_dlpack` and older torch do) gets a private copy instead, so it can neither be refused
(numpy's "Cannot export readonly array") nor write into the file's pages; with `copy=False` it gets
BufferError. A versioned consumer (numpy >= 2, torch >= 2.4) shares the map with the read-only flag set.

Example:
    >>> import numpy as np
    >>> from lazyweights.lazy.dlpack import export_dlpack
    >>> np.from_dlpack(type("A", (), {"__dlpack__": lambda s, **k: export_dlpack(np.arange(3.0), **k),
    ...                               "__dlpack_device__": lambda s: (1, 0)})()).tolist()
    [0.0, 1.0, 2.0]
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..core.dtype import DType

# DLPack type codes for the dtypes numpy cannot export.
_DL_CODES = {
    DType.bfloat16: 4,
    DType.float8_e4m3fn: 10,
    DType.float8_e4m3fnuz: 11,
    DType.float8_e5m2: 12,
    DType.float8_e5m2fnuz: 13,
    DType.float8_e8m0fnu: 14,
}
_KDL_UINT = 1

# Private function objects (`pythonapi[name]` makes a new one), so our argtypes never leak into other
# users of ctypes.pythonapi.
_PyCapsule_IsValid = ctypes.pythonapi["PyCapsule_IsValid"]
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_PyCapsule_GetPointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Byte offsets (64-bit): DLManagedTensor starts with its DLTensor; DLManagedTensorVersioned (DLPack >= 1.0)
# has version (8), manager_ctx (8), deleter (8), flags (8) before it. In DLTensor, `dtype` follows
# data (8), device (8) and ndim (4): code (uint8), bits (uint8), lanes (uint16).
_TENSOR_OFFSET = {b"dltensor": 0, b"dltensor_versioned": 32}
_DTYPE_OFFSET = 20


def export_dlpack(arr: np.ndarray, *args, **kwargs):
    """A DLPack capsule for a host array; bf16/fp8 included (see the module docstring).

    Keyword arguments (`max_version`, `dl_device`, `copy`, `stream`) are the consumer's, passed on to
    numpy's exporter.
    """
    shareable = exportable(arr, max_version=kwargs.get("max_version"), copy=kwargs.get("copy"))
    if shareable is not arr:
        arr = shareable
        kwargs.pop("copy", None)  # copied once, in `exportable`
    dtype = DType.from_numpy(arr.dtype)
    if dtype not in _DL_CODES:
        return arr.__dlpack__(*args, **kwargs)
    if ctypes.sizeof(ctypes.c_void_p) != 8:  # pragma: no cover - the offsets above are for 64-bit builds
        raise BufferError("bf16/fp8 DLPack export needs a 64-bit Python")
    bits = 8 * arr.dtype.itemsize
    carrier = np.ascontiguousarray(arr).view(np.dtype(f"uint{bits}"))
    capsule = carrier.__dlpack__(*args, **kwargs)
    for name, offset in _TENSOR_OFFSET.items():
        if _PyCapsule_IsValid(capsule, name):
            tensor = _PyCapsule_GetPointer(capsule, name) + offset
            break
    else:  # pragma: no cover - numpy always names its capsules one of the two
        raise BufferError("unexpected DLPack capsule from numpy")
    code = ctypes.c_uint8.from_address(tensor + _DTYPE_OFFSET)
    width = ctypes.c_uint8.from_address(tensor + _DTYPE_OFFSET + 1)
    if code.value != _KDL_UINT or width.value != bits:  # pragma: no cover - layout guard
        raise BufferError(f"unexpected DLPack dtype (code {code.value}, bits {width.value}) from numpy")
    code.value = _DL_CODES[dtype]
    return capsule


def exportable(arr: np.ndarray, *, max_version=None, copy=None) -> np.ndarray:
    """The array a DLPack export of `arr` hands out: `arr` itself, or a private copy where the consumer asks
    for a legacy capsule (no `max_version`) and `arr` is read-only (a legacy capsule has no read-only flag).

    A caller exporting the same value many times (`WeightData.__dlpack__`) keeps the result, so the copy is
    made once. `copy=False` with a read-only array and a legacy consumer raises BufferError.

    Example:
        >>> import numpy as np
        >>> a = np.arange(3.0); a.flags.writeable = False
        >>> exportable(a, max_version=(1, 0)) is a, exportable(a) is a, exportable(a).flags.writeable
        (True, False, True)
    """
    if arr.flags.writeable or _versioned(max_version):
        return arr
    if copy is False:
        raise BufferError("this array is read-only (a view of a checkpoint's memory map) and a legacy DLPack "
                          "capsule cannot say so; export with copy=True or max_version=(1, 0)")
    return np.array(arr, copy=True, order="C")


def _versioned(max_version) -> bool:
    """Whether the consumer accepts a DLPack >= 1.0 capsule (which has a read-only flag)."""
    try:
        return max_version is not None and int(max_version[0]) >= 1
    except (TypeError, ValueError, IndexError):
        return False
