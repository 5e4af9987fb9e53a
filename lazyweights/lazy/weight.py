"""`Weight`: a declared parameter (name, dtype, shape, device, quantization encoding).

A `Weight` is what a module declares and what `Weights.allocate()` returns. When it comes from
`allocate()` it also carries the lazy `WeightData` that fills it (`weight.source`).

Example:
    >>> from lazyweights import Weight, DType
    >>> w = Weight("layers.0.q_proj.weight", DType.bfloat16, (64, 64))
    >>> w.shape, w.dtype, w.quantization_encoding
    ((64, 64), <DType.bfloat16: 'bfloat16'>, None)
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ..core.device import DeviceRef
from ..core.dtype import DType
from ..core.quantization import QuantizationEncoding

if TYPE_CHECKING:
    from .weight_data import WeightData


class Weight:
    """A named parameter with a dtype, a static shape, a device and an optional quantization encoding."""

    def __init__(self, name: str, dtype: DType, shape: Sequence[int], device=None,
                 quantization_encoding: QuantizationEncoding | None = None, align: int | None = None):
        self.name = name
        self.dtype = DType.parse(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.device = DeviceRef.parse(device)
        self.quantization_encoding = QuantizationEncoding.parse(quantization_encoding)
        self.align = align
        self.source: "WeightData | None" = None  # set by Weights.allocate()

    @property
    def size(self) -> int:
        """Elements the weight holds (the product of its shape; 1 for a scalar)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the weight holds at its dtype (`size * dtype.size_in_bytes`)."""
        return self.size * self.dtype.size_in_bytes

    def __repr__(self) -> str:
        q = f", {self.quantization_encoding.name}" if self.quantization_encoding else ""
        dev = "" if self.device == DeviceRef.CPU() else f", device={self.device!r}"
        return f"Weight({self.name!r}, {self.dtype}, {list(self.shape)}{q}{dev})"
