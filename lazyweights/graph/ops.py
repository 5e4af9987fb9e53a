"""The op table: one constructor per op, each computing dtype and shape and validating its inputs.

Every op fails here, when the node is built, with both shapes (or dtypes) in the message; nothing fails
later while bytes are being read. Constructors also canonicalise, which is where the cheap rewrites live:
a cast to the same dtype, an identity permute, a full slice and a reshape to the same shape return the
input node itself; permute-of-permute and reshape-of-reshape compose into one node; cast-of-cast folds
when that is bit-exact, NaN payloads included (e.g. f16 -> f32 -> bf16 is f16 -> bf16; see `_FOLDABLE`).
So a plan never carries no-ops.

Ops:
    source      a stored tensor (arg: TensorRecord)
    const       an in-memory array (arg: Const)
    cast        value conversion, round-to-nearest-even (arg: DType)
    bitcast     bit reinterpretation, last dim scaled by the size ratio (arg: DType)
    reshape     (arg: new shape)
    permute     axes permutation (arg: axes)
    slice       basic slicing (arg: ((start, stop, step), ...) per axis, normalised, step > 0)
    take        gather along one axis (arg: (axis, IndexArray))
    concat      join along an axis (arg: axis)
    dequantize  packed blocks [.., row_bytes] uint8 -> float [.., row_values] (arg: (encoding, DType))
    quantize    float [.., row_values] -> packed blocks uint8 [.., row_bytes] (arg: encoding)

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> from lazyweights import DType
    >>> x = ops.const(np.zeros((4, 6), np.float32))
    >>> ops.reshape(x, (3, 8)).shape
    (3, 8)
    >>> ops.reshape(x, (5, 5))
    Traceback (most recent call last):
    ...
    lazyweights.core.errors.ShapeError: reshape: cannot reshape float32[4, 6] (24 elements) to [5, 5] (25 elements)
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from ..core.dtype import DType
from ..core.errors import DTypeError, ShapeError
from ..core.quantization import QuantizationEncoding
from .node import Const, Importance, IndexArray, Node, QuantizeArg
from .opcodes import Op

_INT64 = np.dtype(np.int64)

# Cast-of-cast folds only for the (source, intermediate) -> target triples where it is bit-exact: astype
# must equal ml_dtypes' stepwise astype bit for bit, and a value-exact first cast is not enough
# (conversions quiet signalling NaNs and keep different payload bits: bf16 -> f32 -> bf16 gives 0x7FC0 for
# 0x7F81; into integer targets out-of-range values differ). The table was measured exhaustively over every
# bit pattern for the <=16-bit sources, and over 500k random bit patterns plus NaN payloads for float32;
# test_ops.py::test_cast_chains_equal_stepwise_numpy re-checks it.
_FP8_FP4 = frozenset({DType.float8_e4m3fn, DType.float8_e4m3fnuz, DType.float8_e5m2, DType.float8_e5m2fnuz,
                      DType.float4_e2m1fn})
_NARROW = _FP8_FP4 | {DType.bool, DType.float8_e8m0fnu}
_FOLDABLE: dict[tuple[DType, DType], frozenset[DType]] = {
    (DType.bfloat16, DType.float32): _NARROW | {DType.float64},
    (DType.bfloat16, DType.float64): _NARROW,
    (DType.float16, DType.float32): _NARROW | {DType.float16, DType.bfloat16},
    (DType.float16, DType.float64): _NARROW | {DType.float16, DType.bfloat16},
    (DType.float32, DType.float64): _NARROW | {DType.bfloat16},
    (DType.float8_e4m3fn, DType.bfloat16): _FP8_FP4 | {DType.bool, DType.float16, DType.float32, DType.float64},
    (DType.float8_e4m3fn, DType.float16): _FP8_FP4 | {DType.bool, DType.bfloat16, DType.float32, DType.float64},
    (DType.float8_e4m3fn, DType.float32): _FP8_FP4 | {DType.bool, DType.float16, DType.bfloat16, DType.float64},
    (DType.float8_e4m3fn, DType.float64): _FP8_FP4 | {DType.bool, DType.float16, DType.bfloat16, DType.float32},
    (DType.float8_e5m2, DType.float16): (_FP8_FP4 - {DType.float8_e5m2})
    | {DType.bool, DType.bfloat16, DType.float32, DType.float64},
    (DType.float8_e5m2, DType.float32): (_FP8_FP4 - {DType.float8_e5m2})
    | {DType.bool, DType.float16, DType.bfloat16, DType.float64},
    (DType.float8_e5m2, DType.float64): (_FP8_FP4 - {DType.float8_e5m2})
    | {DType.bool, DType.float16, DType.bfloat16, DType.float32},
}


def _fmt(dtype: DType, shape) -> str:
    return f"{dtype.name}{list(shape)}"


# --- leaves -----------------------------------------------------------------------------------------
def source(record) -> Node:
    """A stored tensor. `record` is an `io.source.SourceRecord` (the readers' `formats.source.TensorRecord`)."""
    return Node(Op.SOURCE, (), record, record.dtype, record.shape)


def const(array: np.ndarray) -> Node:
    """An in-memory array (kept by reference; the caller must not mutate it afterwards)."""
    arr = np.asarray(array)
    if not arr.dtype.isnative:
        # A non-native byte order ('>f4' from a big-endian source) holds fine values: convert them to native
        # order (a copy, made once, here), so every executor sees native arrays.
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return Node(Op.CONST, (), Const(arr), DType.from_numpy(arr.dtype), arr.shape)


# --- element type -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def castable(a: DType, b: DType) -> bool:
    """Whether numpy/ml_dtypes convert `a` to `b` directly (ml_dtypes has no fp8/fp4 <-> float8_e8m0fnu)."""
    return a is b or bool(np.can_cast(a.to_numpy(), b.to_numpy(), casting="unsafe"))


def cast(x: Node, dtype: DType) -> Node:
    """Convert values to `dtype` (round-to-nearest-even, NaN and inf kept), as numpy/ml_dtypes do."""
    if type(dtype) is not DType:
        dtype = DType.parse(dtype)
    if x.dtype is dtype:
        return x
    # Fold cast-of-cast only when the folded, direct conversion exists (f8e4m3fn -> f16 -> f8e8m0fnu is two
    # valid casts, but ml_dtypes has no f8e4m3fn -> f8e8m0fnu): every node built here can execute.
    if x.op is Op.CAST and dtype in _FOLDABLE.get((x.srcs[0].dtype, x.dtype), ()) and castable(x.srcs[0].dtype, dtype):
        return cast(x.srcs[0], dtype)
    if not castable(x.dtype, dtype):
        # No direct conversion: go through float32, which holds every fp8/fp4/e8m0 value exactly, so the
        # result is the correctly rounded conversion (and equals ml_dtypes' two-step astype).
        f32 = DType.float32
        if castable(x.dtype, f32) and castable(f32, dtype):
            mid = Node(Op.CAST, (x,), f32, f32, x.shape)
            return Node(Op.CAST, (mid,), dtype, dtype, x.shape)
        raise DTypeError(f"cast: no conversion from {_fmt(x.dtype, x.shape)} to {dtype.name}")
    return Node(Op.CAST, (x,), dtype, dtype, x.shape)


def bitcast(x: Node, dtype: DType) -> Node:
    """Reinterpret bits as `dtype`; like numpy's `view`, the last dimension scales by the size ratio."""
    dtype = DType.parse(dtype)
    if x.dtype is dtype:
        return x
    a, b = x.dtype.size_in_bytes, dtype.size_in_bytes
    if a == b:
        shape = x.shape
    else:
        if not x.shape:
            raise ShapeError(f"view: cannot reinterpret a 0-d {x.dtype.name} as {dtype.name} (sizes differ)")
        last = x.shape[-1] * a
        if last % b:
            raise ShapeError(
                f"view: last dimension of {_fmt(x.dtype, x.shape)} is {last} bytes, not a multiple of "
                f"{dtype.name}'s {b} bytes"
            )
        shape = x.shape[:-1] + (last // b,)
    if x.op is Op.BITCAST:
        return bitcast(x.srcs[0], dtype)
    return Node(Op.BITCAST, (x,), dtype, dtype, shape)


# --- layout -----------------------------------------------------------------------------------------
def normalize_shape(shape: Sequence[int], size: int, what: str) -> tuple[int, ...]:
    """Resolve one -1 and check every dimension is a non-negative int."""
    shape = tuple(shape)
    dims = []
    for d in shape:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise ShapeError(f"{what}: dimension {d!r} in {list(shape)} is not an integer")
        dims.append(int(d))
    if dims.count(-1) > 1:
        raise ShapeError(f"{what}: at most one -1 allowed in {dims}")
    if any(d < -1 for d in dims):
        raise ShapeError(f"{what}: negative dimension in {dims}")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise ShapeError(f"{what}: cannot infer -1 in {dims} for {size} elements")
        dims[dims.index(-1)] = size // known
    return tuple(dims)


def reshape(x: Node, shape: Sequence[int]) -> Node:
    """Same elements in C order, new shape (one -1 allowed)."""
    shape = normalize_shape(shape, x.size, "reshape")
    if math.prod(shape) != x.size:
        raise ShapeError(
            f"reshape: cannot reshape {_fmt(x.dtype, x.shape)} ({x.size} elements) to {list(shape)} "
            f"({math.prod(shape)} elements)"
        )
    if shape == x.shape:
        return x
    if x.op is Op.RESHAPE:
        return reshape(x.srcs[0], shape)
    return Node(Op.RESHAPE, (x,), shape, x.dtype, shape)


def permute(x: Node, axes: Sequence[int]) -> Node:
    """Reorder axes: output axis i is input axis axes[i] (numpy's transpose)."""
    n = x.ndim
    try:
        axes = tuple(int(a) + n if int(a) < 0 else int(a) for a in axes)
    except (TypeError, ValueError):
        raise ShapeError(f"permute: axes {axes!r} must be integers") from None
    if sorted(axes) != list(range(n)):
        raise ShapeError(f"permute: axes {list(axes)} are not a permutation of the {n} axes of "
                         f"{_fmt(x.dtype, x.shape)}")
    if axes == tuple(range(n)):
        return x
    if x.op is Op.PERMUTE:
        inner = x.arg
        return permute(x.srcs[0], tuple(inner[a] for a in axes))
    shape = tuple(x.shape[a] for a in axes)
    return Node(Op.PERMUTE, (x,), axes, x.dtype, shape)


def slice_(x: Node, slices: Sequence[tuple[int, int, int]]) -> Node:
    """Basic slicing with one (start, stop, step) per axis; steps must be positive."""
    if len(slices) != x.ndim:
        raise ShapeError(f"slice: {len(slices)} ranges for {x.ndim}-d {_fmt(x.dtype, x.shape)}")
    ranges: list[tuple[int, int, int]] = []
    shape = []
    for dim, (start, stop, step) in zip(x.shape, slices):
        if step <= 0:
            raise ShapeError(f"slice: step {step} must be positive (negative steps: use take with reversed indices)")
        start, stop, step = slice(start, stop, step).indices(dim)
        n = max(0, (stop - start + step - 1) // step)
        stop = start + n * step if n else start
        ranges.append((start, stop, step))
        shape.append(n)
    norm = tuple(ranges)
    if all(r == (0, d, 1) for r, d in zip(norm, x.shape)):
        return x
    return Node(Op.SLICE, (x,), norm, x.dtype, tuple(shape))


def take(x: Node, indices, axis: int) -> Node:
    """Gather positions `indices` (1-D ints, negatives allowed) along `axis`, e.g. a RoPE row permutation."""
    xshape = x.shape
    ndim = len(xshape)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"take: axis {axis} out of range for {_fmt(x.dtype, x.shape)}")
    axis %= ndim
    dim = xshape[axis]
    if isinstance(indices, IndexArray):  # (rewrites pass a node's own list on: no array is made)
        ia = indices
    elif type(indices) is np.ndarray and indices.ndim == 1 and indices.dtype is _INT64:
        ia = IndexArray(indices)  # the common case (`arange(n) // 128`): nothing to convert or check
    else:
        idx = np.asarray(indices)
        if idx.dtype.kind == "b":
            if idx.shape != (x.shape[axis],):
                raise ShapeError(f"take: boolean mask of shape {list(idx.shape)} for axis {axis} of length "
                                 f"{x.shape[axis]}")
            idx = np.flatnonzero(idx)
        if idx.ndim != 1 or not (idx.size == 0 or idx.dtype.kind in "iu"):
            raise ShapeError(f"take: indices must be a 1-D integer array, got {idx.dtype}{list(idx.shape)}")
        # An affine list (`arange(n) // 128`) is recognised here and kept as five integers (`IndexArray`).
        ia = IndexArray(idx)
    affine = ia.affine
    if affine is not None:
        # An affine list already checked against this axis length: its shared argument, no checks again.
        arg = _TAKE_ARGS.get((axis, ia, dim))
        if arg is not None:
            return Node(Op.TAKE, (x,), arg, x.dtype, xshape[:axis] + (affine[0],) + xshape[axis + 1:])
    lo, hi = ia.bounds()
    if lo < -dim or hi >= dim:
        arr = ia.array
        bad = int(arr[(arr < -dim) | (arr >= dim)][0])
        raise ShapeError(f"take: index {bad} is out of bounds for axis {axis} of {_fmt(x.dtype, x.shape)}")
    if lo < 0:
        arr = ia.array
        ia = IndexArray(np.where(arr < 0, arr + dim, arr))
    if len(ia) == dim and ia.is_arange():
        return x
    shape = xshape[:axis] + (len(ia),) + xshape[axis + 1:]
    arg = (axis, ia)
    if ia.affine is not None and lo >= 0:  # one shared argument per (axis, affine list, axis length)
        if len(_TAKE_ARGS) >= 4096:
            _TAKE_ARGS.clear()
        arg = _TAKE_ARGS.setdefault((axis, ia, dim), arg)
    return Node(Op.TAKE, (x,), arg, x.dtype, shape)


# (axis, affine list, axis length) -> the argument `(axis, list)` of a take that was checked in bounds and
# is not an identity; equal arguments are one tuple. Bounded: cleared when full.
_TAKE_ARGS: dict[tuple, tuple] = {}


def concat(xs: Sequence[Node], axis: int = 0) -> Node:
    """Join along `axis`; every other dimension and the dtype must agree."""
    xs = list(xs)
    if not xs:
        raise ShapeError("concat: nothing to concatenate")
    first = xs[0]
    if first.ndim == 0:
        raise ShapeError("concat: cannot concatenate 0-d tensors (use stack)")
    if not -first.ndim <= axis < first.ndim:
        raise ShapeError(f"concat: axis {axis} out of range for {_fmt(first.dtype, first.shape)}")
    axis %= first.ndim
    for x in xs[1:]:
        if x.dtype is not first.dtype:
            raise DTypeError(f"concat: dtypes differ: {first.dtype.name} and {x.dtype.name} (cast first)")
        if x.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != axis):
            raise ShapeError(
                f"concat along axis {axis}: shapes {list(first.shape)} and {list(x.shape)} differ off that axis"
            )
    if len(xs) == 1:
        return first
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return Node(Op.CONCAT, tuple(xs), axis, first.dtype, tuple(shape))


# --- quantization -----------------------------------------------------------------------------------
def dequantize(x: Node, encoding: QuantizationEncoding, dtype: DType = DType.float32) -> Node:
    """Packed uint8 blocks [..., row_bytes] -> `dtype` [..., row_values]."""
    dtype = DType.parse(dtype)
    if x.dtype is not DType.uint8:
        raise DTypeError(f"dequantize: {encoding.name} data must be uint8 blocks, got {x.dtype.name}")
    if not dtype.is_float:
        raise DTypeError(f"dequantize: target dtype must be a float type, got {dtype.name}")
    if not x.shape:
        raise ShapeError(f"dequantize: {encoding.name} data must have at least one dimension")
    values = encoding.elements_per_row_bytes(x.shape[-1])
    return Node(Op.DEQUANTIZE, (x,), (encoding, dtype), dtype, x.shape[:-1] + (values,))


def quantize(x: Node, encoding: QuantizationEncoding, importance=None, reason: str | None = None) -> Node:
    """Float [..., row_values] -> packed uint8 blocks [..., row_bytes] (for writing GGUF).

    `importance`: llama.cpp's importance matrix for this tensor, one weight per column ([row_values]), or
    per expert ([shape[0], row_values]) for a stacked MoE tensor. `reason`: why this type (for `explain`).
    """
    if not x.dtype.is_float:
        raise DTypeError(f"quantize: {encoding.name} needs float input, got {x.dtype.name}")
    if not x.shape:
        raise ShapeError(f"quantize: {encoding.name} input must have at least one dimension")
    row_bytes = encoding.row_bytes_for_elements(x.shape[-1])
    if importance is not None and not isinstance(importance, Importance):
        importance = Importance(importance)
    if importance is not None:
        want = (x.shape[-1],) if importance.array.ndim == 1 else (x.shape[0], x.shape[-1])
        if importance.array.shape != want or (importance.array.ndim == 2 and x.ndim < 3):
            raise ShapeError(f"quantize: the importance matrix has shape {list(importance.array.shape)}; "
                             f"{_fmt(x.dtype, x.shape)} needs {list(want)}")
    return Node(Op.QUANTIZE, (x,), QuantizeArg(encoding, importance, reason), DType.uint8,
                x.shape[:-1] + (row_bytes,))
