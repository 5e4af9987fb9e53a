"""`QuantizationEncoding`: block-quantized storage formats (every GGUF block type, plus GPTQ and MXFP4).

A quantized tensor is stored as packed blocks. Following MAX, lazyweights exposes it as a
`uint8` tensor whose last dimension is the byte length of one row of blocks, with `quantization_encoding`
set; `WeightData.dequantize()` turns it into floats lazily.

Example:
    >>> from lazyweights import QuantizationEncoding
    >>> q = QuantizationEncoding.Q4_K
    >>> q.block_elements, q.block_bytes, q.elements_per_row_bytes(144 * 4)
    (256, 144, 1024)
"""
from __future__ import annotations

import enum

from .errors import DTypeError, ShapeError


class QuantizationEncoding(enum.Enum):
    """A block quantization scheme. `block_elements` values pack into `block_bytes` bytes."""

    Q4_0 = "Q4_0"
    Q4_1 = "Q4_1"
    Q5_0 = "Q5_0"
    Q5_1 = "Q5_1"
    Q8_0 = "Q8_0"
    Q8_1 = "Q8_1"
    Q2_K = "Q2_K"
    Q3_K = "Q3_K"
    Q4_K = "Q4_K"
    Q5_K = "Q5_K"
    Q6_K = "Q6_K"
    Q8_K = "Q8_K"
    IQ2_XXS = "IQ2_XXS"
    IQ2_XS = "IQ2_XS"
    IQ2_S = "IQ2_S"
    IQ3_XXS = "IQ3_XXS"
    IQ3_S = "IQ3_S"
    IQ1_S = "IQ1_S"
    IQ1_M = "IQ1_M"
    IQ4_NL = "IQ4_NL"
    IQ4_XS = "IQ4_XS"
    TQ1_0 = "TQ1_0"
    TQ2_0 = "TQ2_0"
    MXFP4 = "MXFP4"
    GPTQ = "GPTQ"

    def __repr__(self) -> str:
        return f"<QuantizationEncoding.{self.name}>"

    def __str__(self) -> str:
        return f"QuantizationEncoding.{self.name}"

    @property
    def block_elements(self) -> int:
        """Values per block."""
        return _BLOCKS[self][0]

    @property
    def block_bytes(self) -> int:
        """Bytes per block."""
        return _BLOCKS[self][1]

    @property
    def is_gguf(self) -> bool:
        """Whether this is a GGUF/ggml block type (GPTQ is not: it is several tensors, not one block)."""
        return self is not QuantizationEncoding.GPTQ

    def elements_per_row_bytes(self, row_bytes: int) -> int:
        """How many values a row of `row_bytes` packed bytes holds. ShapeError if not whole blocks."""
        if row_bytes % self.block_bytes:
            raise ShapeError(
                f"{self.name}: a row of {row_bytes} bytes is not a whole number of {self.block_bytes}-byte blocks"
            )
        return row_bytes // self.block_bytes * self.block_elements

    def row_bytes_for_elements(self, elements: int) -> int:
        """Packed bytes for a row of `elements` values. ShapeError if not whole blocks."""
        if elements % self.block_elements:
            raise ShapeError(
                f"{self.name}: a row of {elements} values is not a whole number of "
                f"{self.block_elements}-value blocks"
            )
        return elements // self.block_elements * self.block_bytes

    @classmethod
    def parse(cls, value) -> "QuantizationEncoding | None":
        """An encoding from a member, its name in any case (`"q4_k"`, `"QuantizationEncoding.Q4_K"`), another library's
        enum member of the same name (MAX's), or None (no encoding). Anything else is a DTypeError.

        Example:
            >>> QuantizationEncoding.parse("q8_0"), QuantizationEncoding.parse(None)
            (<QuantizationEncoding.Q8_0>, None)
        """
        if value is None or isinstance(value, QuantizationEncoding):
            return value
        if isinstance(value, enum.Enum):  # another library's member of the same name (MAX's Q4_K)
            value = value.name
        if isinstance(value, str):
            key = value.split(".")[-1].upper()
            if key in cls.__members__:
                return cls[key]
        raise DTypeError(f"unknown quantization encoding {value!r}; known: {', '.join(cls.__members__)}")

    @classmethod
    def parse_required(cls, value, what: str = "quantization encoding") -> "QuantizationEncoding":
        """`parse`, where None is an error too: for code that has an encoding by contract (a kernel's).

        Example:
            >>> QuantizationEncoding.parse_required("q4_k").block_bytes
            144
        """
        enc = cls.parse(value)
        if enc is None:
            raise DTypeError(f"{what}: an encoding is needed here, got None")
        return enc


# (values per block, bytes per block), as llama.cpp's ggml-common.h defines them. GPTQ packs 8 int4 values
# into one int32 along the input dimension; its "block" here is that int32.
_BLOCKS: dict[QuantizationEncoding, tuple[int, int]] = {
    QuantizationEncoding.Q4_0: (32, 18),
    QuantizationEncoding.Q4_1: (32, 20),
    QuantizationEncoding.Q5_0: (32, 22),
    QuantizationEncoding.Q5_1: (32, 24),
    QuantizationEncoding.Q8_0: (32, 34),
    QuantizationEncoding.Q8_1: (32, 40),
    QuantizationEncoding.Q2_K: (256, 84),
    QuantizationEncoding.Q3_K: (256, 110),
    QuantizationEncoding.Q4_K: (256, 144),
    QuantizationEncoding.Q5_K: (256, 176),
    QuantizationEncoding.Q6_K: (256, 210),
    QuantizationEncoding.Q8_K: (256, 292),
    QuantizationEncoding.IQ2_XXS: (256, 66),
    QuantizationEncoding.IQ2_XS: (256, 74),
    QuantizationEncoding.IQ2_S: (256, 82),
    QuantizationEncoding.IQ3_XXS: (256, 98),
    QuantizationEncoding.IQ3_S: (256, 110),
    QuantizationEncoding.IQ1_S: (256, 50),
    QuantizationEncoding.IQ1_M: (256, 56),
    QuantizationEncoding.IQ4_NL: (32, 18),
    QuantizationEncoding.IQ4_XS: (256, 136),
    QuantizationEncoding.TQ1_0: (256, 54),
    QuantizationEncoding.TQ2_0: (256, 66),
    QuantizationEncoding.MXFP4: (32, 17),
    QuantizationEncoding.GPTQ: (8, 4),
}
