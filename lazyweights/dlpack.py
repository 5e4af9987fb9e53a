"""DLPack export for materialized host arrays.

numpy exports standard dtypes itself. It refuses bfloat16 and fp8 (they are ml_dtypes' extension types),
so for those we build the DLManagedTensor ourselves with ctypes, using DLPack's type codes (kDLBfloat = 4,
and the float8 codes of DLPack 1.1). Consumers that understand those codes (torch for bf16) then share the
memory without a copy; numpy's own `from_dlpack` still cannot import them, which is numpy's limit.

Example:
    >>> import numpy as np
    >>> from lazyweights.dlpack import export_dlpack
    >>> np.from_dlpack(type("A", (), {"__dlpack__": lambda s, **k: export_dlpack(np.arange(3.0)),
    ...                               "__dlpack_device__": lambda s: (1, 0)})()).tolist()
    [0.0, 1.0, 2.0]
"""
from __future__ import annotations

import ctypes

import numpy as np

from .dtype import DType

# DLPack type codes for the dtypes numpy cannot export.
_DL_CODES = {
    DType.bfloat16: 4,
    DType.float8_e4m3fn: 10,
    DType.float8_e4m3fnuz: 11,
    DType.float8_e5m2: 12,
    DType.float8_e5m2fnuz: 13,
    DType.float8_e8m0fnu: 14,
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

# Exports alive until their consumer (or the capsule's destructor) calls the deleter: address -> objects.
_LIVE: dict[int, tuple] = {}


@_Deleter
def _delete(ptr):
    _LIVE.pop(ctypes.addressof(ptr.contents), None)


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.py_object)
_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


@_CapsuleDestructor
def _capsule_destructor(capsule):
    # An unconsumed capsule still carries the name "dltensor": free its tensor. A consumed one was
    # renamed "used_dltensor" and its consumer owns the deleter call.
    if _PyCapsule_IsValid(capsule, b"dltensor"):
        addr = _PyCapsule_GetPointer(capsule, b"dltensor")
        _LIVE.pop(addr, None)


def export_dlpack(arr: np.ndarray, *args, **kwargs):
    """A DLPack capsule for a host array; bf16/fp8 included (see the module docstring)."""
    dtype = DType.from_numpy(arr.dtype)
    if dtype not in _DL_CODES:
        return arr.__dlpack__(*args, **kwargs)
    arr = np.ascontiguousarray(arr)
    ndim = arr.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*arr.shape)
    managed = _DLManagedTensor()
    managed.dl_tensor.data = arr.ctypes.data if arr.size else 0
    managed.dl_tensor.device = _DLDevice(1, 0)  # kDLCPU
    managed.dl_tensor.ndim = ndim
    managed.dl_tensor.dtype = _DLDataType(_DL_CODES[dtype], 8 * arr.dtype.itemsize, 1)
    managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = None  # C-contiguous
    managed.dl_tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _delete
    addr = ctypes.addressof(managed)
    _LIVE[addr] = (managed, shape, arr)
    return _PyCapsule_New(addr, b"dltensor", ctypes.cast(_capsule_destructor, ctypes.c_void_p))
