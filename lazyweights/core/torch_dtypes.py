"""DType <-> torch dtype, in one table. torch is imported only when one of these is called.

Example:
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> dtype_to_torch(DType.bfloat16), torch_dtype_to_dtype(torch.float16).name
    (torch.bfloat16, 'float16')
"""
from __future__ import annotations

from .dtype import DType
from .errors import DependencyError, DTypeError


def import_torch():
    """Import PyTorch, or raise DependencyError with the install hint (torch is optional)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        raise DependencyError("PyTorch interop needs torch: pip install 'lazyweights[torch]'") from None
    return torch


def torch_dtype_table(torch) -> dict:
    """{torch dtype: DType} for the dtypes this torch build has (uint16..64 and float8 only in newer torch)."""
    table = {
        torch.bool: DType.bool, torch.int8: DType.int8, torch.int16: DType.int16, torch.int32: DType.int32,
        torch.int64: DType.int64, torch.uint8: DType.uint8, torch.float16: DType.float16,
        torch.bfloat16: DType.bfloat16, torch.float32: DType.float32, torch.float64: DType.float64,
    }
    for tname, d in (("uint16", DType.uint16), ("uint32", DType.uint32), ("uint64", DType.uint64),
                     ("float8_e4m3fn", DType.float8_e4m3fn), ("float8_e4m3fnuz", DType.float8_e4m3fnuz),
                     ("float8_e5m2", DType.float8_e5m2), ("float8_e5m2fnuz", DType.float8_e5m2fnuz),
                     ("float8_e8m0fnu", DType.float8_e8m0fnu)):
        t = getattr(torch, tname, None)
        if t is not None:
            table[t] = d
    return table


def torch_dtype_to_dtype(torch_dtype) -> DType | None:
    """The DType of a torch dtype, or None when lazyweights has none (complex, packed fp4, ...)."""
    return torch_dtype_table(import_torch()).get(torch_dtype)


def dtype_to_torch(dtype: DType):
    """The torch dtype of a DType (LazyWeightsError if torch has none)."""
    torch = import_torch()
    for t, d in torch_dtype_table(torch).items():
        if d is dtype:
            return t
    raise DTypeError(f"torch {torch.__version__} has no dtype for {dtype.name}")


