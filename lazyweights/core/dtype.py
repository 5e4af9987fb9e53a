"""`DType`: MAX's element types, with numpy conversion in both directions.

numpy has no bfloat16, fp8 or fp4; `ml_dtypes` supplies them as real numpy dtypes, so a bf16 tensor is a
bf16 numpy array here and nobody needs byte-view tricks.

Example:
    >>> import numpy as np
    >>> from lazyweights import DType
    >>> DType.bfloat16.size_in_bytes, DType.bfloat16.is_float
    (2, True)
    >>> DType.from_numpy(np.dtype("float16"))
    <DType.float16: 'float16'>
    >>> DType.float8_e4m3fn.to_numpy().name
    'float8_e4m3fn'
"""
from __future__ import annotations

import builtins
import enum

import ml_dtypes
import numpy as np

from .errors import DTypeError


class DType(enum.Enum):
    """An element type. Values are the numpy/ml_dtypes names, so `DType("bfloat16")` works."""

    bool = "bool"
    int8 = "int8"
    int16 = "int16"
    int32 = "int32"
    int64 = "int64"
    uint8 = "uint8"
    uint16 = "uint16"
    uint32 = "uint32"
    uint64 = "uint64"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"
    float64 = "float64"
    float8_e4m3fn = "float8_e4m3fn"
    float8_e4m3fnuz = "float8_e4m3fnuz"
    float8_e5m2 = "float8_e5m2"
    float8_e5m2fnuz = "float8_e5m2fnuz"
    float8_e8m0fnu = "float8_e8m0fnu"
    float4_e2m1fn = "float4_e2m1fn"

    # Members are singletons compared by identity, so they hash by identity too: in C, where Enum's own
    # __hash__ is a Python call (a node's hash includes its dtype; a 90,000-tensor plan hashes millions).
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<DType.{self.name}: {self.value!r}>"

    def __str__(self) -> str:  # MAX prints dtypes as "DType.bfloat16"
        return f"DType.{self.name}"

    # --- properties -------------------------------------------------------------------------------
    @property
    def size_in_bytes(self) -> int:
        """Bytes per element in memory (float4_e2m1fn occupies one byte per element in numpy)."""
        return _NUMPY[self].itemsize

    @property
    def bits(self) -> int:
        """Significant bits per element (4 for float4_e2m1fn, 1 for bool as stored: 8)."""
        return 4 if self is DType.float4_e2m1fn else 8 * self.size_in_bytes

    @property
    def is_float(self) -> builtins.bool:
        """True for floating-point types (float16/32/64, bfloat16, the float8 and float4 kinds).

        Example:
            >>> DType.bfloat16.is_float, DType.int8.is_float
            (True, False)
        """
        return self in _FLOATS

    @property
    def is_float8(self) -> builtins.bool:
        """True for the 8-bit float kinds (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0fnu)."""
        return self.name.startswith("float8")

    @property
    def is_half(self) -> builtins.bool:
        """16-bit floats: float16 and bfloat16."""
        return self in (DType.float16, DType.bfloat16)

    @property
    def is_integral(self) -> builtins.bool:
        """True for signed and unsigned integers (bool is not one)."""
        return self.name.startswith(("int", "uint"))

    @property
    def is_signed_integral(self) -> builtins.bool:
        """True for int8..int64."""
        return self.name.startswith("int")

    @property
    def is_unsigned_integral(self) -> builtins.bool:
        """True for uint8..uint64."""
        return self.name.startswith("uint")

    @property
    def short(self) -> str:
        """A compact name for plan text: f16, bf16, f32, f8e4m3, i32, u8, ..."""
        return _SHORT[self]

    # --- numpy conversion -------------------------------------------------------------------------
    def to_numpy(self) -> np.dtype:
        """The numpy dtype (ml_dtypes for bf16, fp8 and fp4)."""
        return _NUMPY[self]

    @classmethod
    def from_numpy(cls, dtype) -> "DType":
        """The DType of a numpy dtype (or anything `np.dtype()` accepts). Raises DTypeError if unsupported."""
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise DTypeError(f"{dtype!r} is not a numpy dtype") from e
        try:
            return _FROM_NUMPY[dt]
        except KeyError:
            raise DTypeError(
                f"numpy dtype {dt} has no lazyweights DType; supported: {', '.join(d.name for d in cls)}"
            ) from None

    @classmethod
    def parse(cls, value) -> "DType":
        """Accept a DType, its name ('bfloat16', 'bf16'), a numpy dtype, or another library's dtype enum
        member of the same name (MAX's `max.dtype.DType.bfloat16`), recognised without importing it."""
        if isinstance(value, DType):
            return value
        if isinstance(value, enum.Enum):
            if value.name in cls.__members__:
                return cls[value.name]
            raise DTypeError(f"unknown dtype {value!r}: lazyweights has no {value.name}; "
                             f"supported: {', '.join(d.name for d in cls)}")
        if isinstance(value, str):
            if value in cls.__members__:
                return cls[value]
            if value.startswith("DType."):
                return cls.parse(value[len("DType."):])
            for member, short in _SHORT.items():
                if short == value:
                    return member
        try:
            return cls.from_numpy(value)
        except DTypeError:
            raise DTypeError(f"unknown dtype {value!r}") from None


_NUMPY: dict[DType, np.dtype] = {
    DType.bool: np.dtype(np.bool_),
    DType.int8: np.dtype(np.int8),
    DType.int16: np.dtype(np.int16),
    DType.int32: np.dtype(np.int32),
    DType.int64: np.dtype(np.int64),
    DType.uint8: np.dtype(np.uint8),
    DType.uint16: np.dtype(np.uint16),
    DType.uint32: np.dtype(np.uint32),
    DType.uint64: np.dtype(np.uint64),
    DType.float16: np.dtype(np.float16),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.float32: np.dtype(np.float32),
    DType.float64: np.dtype(np.float64),
    DType.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.float8_e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DType.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.float8_e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DType.float8_e8m0fnu: np.dtype(ml_dtypes.float8_e8m0fnu),
    DType.float4_e2m1fn: np.dtype(ml_dtypes.float4_e2m1fn),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}
# Bytes per element by DType, for the hot paths that would otherwise go through the `size_in_bytes` property
# (`Node.nbytes`: a DeepSeek-V3-sized plan asks it about a million times while compiling its steps).
ITEMSIZE: dict[DType, int] = {d: t.itemsize for d, t in _NUMPY.items()}
_FLOATS = frozenset(d for d in DType if d.name.startswith(("float", "bfloat")))
_SHORT = {
    DType.bool: "bool", DType.int8: "i8", DType.int16: "i16", DType.int32: "i32", DType.int64: "i64",
    DType.uint8: "u8", DType.uint16: "u16", DType.uint32: "u32", DType.uint64: "u64",
    DType.float16: "f16", DType.bfloat16: "bf16", DType.float32: "f32", DType.float64: "f64",
    DType.float8_e4m3fn: "f8e4m3", DType.float8_e4m3fnuz: "f8e4m3fnuz", DType.float8_e5m2: "f8e5m2",
    DType.float8_e5m2fnuz: "f8e5m2fnuz", DType.float8_e8m0fnu: "f8e8m0", DType.float4_e2m1fn: "f4e2m1",
}
