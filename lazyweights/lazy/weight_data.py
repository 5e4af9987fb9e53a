"""`WeightData`: a lazy tensor with a name, dtype, shape and optional quantization encoding.

Every method returns a new `WeightData` over a new graph node without reading a byte; `.data`,
`to_numpy()` and `__dlpack__` materialize. A `WeightData` straight from a checkpoint materializes as a
zero-copy view of the file's memory map.

Example:
    >>> import numpy as np
    >>> from lazyweights import WeightData, DType, concat
    >>> w = WeightData.from_numpy(np.arange(8, dtype=np.float32).reshape(4, 2), "w")
    >>> v = w[[1, 0, 3, 2]].astype(DType.bfloat16).transpose()
    >>> v.name, v.dtype, v.shape
    ('w', <DType.bfloat16: 'bfloat16'>, (2, 4))
    >>> v.to_numpy().astype(np.float32).tolist()
    [[2.0, 0.0, 6.0, 4.0], [3.0, 1.0, 7.0, 5.0]]
    >>> concat([w, w], axis=1).shape
    (4, 4)
"""
from __future__ import annotations

import logging
import numbers
from typing import Sequence

import numpy as np

from ..core.dtype import DType
from ..core.errors import ArgumentTypeError, DTypeError, ShapeError
from ..core.quantization import QuantizationEncoding
from ..graph import ops
from ..graph.elementwise import binary
from ..graph.node import Node
from ..graph.opcodes import Op
from .dlpack import export_dlpack, exportable

_log = logging.getLogger(__name__)


class WeightData:
    """A lazy tensor. Build it with `Weights.data()`, `WeightData.from_numpy`, or MAX's constructor.

    MAX's constructor `WeightData(data, name, dtype, shape, quantization_encoding=None)` wraps an
    in-memory array; when `dtype` differs from the array's dtype but has the same item size (a uint16
    array labelled bfloat16, say) the bits are reinterpreted, as MAX does.
    """

    # `_exported`: the array the first `__dlpack__` materialized, kept for later exports (see there).
    __slots__ = ("node", "name", "quantization_encoding", "_exported")
    node: Node
    name: str
    quantization_encoding: QuantizationEncoding | None
    _exported: np.ndarray | None

    def __init__(self, data, name: str, dtype: DType | None = None, shape=None,
                 quantization_encoding: QuantizationEncoding | None = None):
        if isinstance(data, Node):
            node = data
        elif isinstance(data, WeightData):
            node = data.node
        else:
            node = ops.const(_to_host_array(data, name))
        if dtype is not None:
            dtype = DType.parse(dtype)
            if dtype is not node.dtype:
                if dtype.size_in_bytes != node.dtype.size_in_bytes:
                    raise DTypeError(
                        f"WeightData {name!r}: data is {node.dtype.name} but dtype={dtype.name} has a different item "
                        "size"
                    )
                node = ops.bitcast(node, dtype)
        if shape is not None:
            shape = tuple(int(d) for d in shape)
            if shape != node.shape:
                try:
                    node = ops.reshape(node, shape)
                except ShapeError as e:
                    raise ShapeError(f"WeightData {name!r}: {e}") from None
        self.node = node
        self.name = name
        self.quantization_encoding = QuantizationEncoding.parse(quantization_encoding)
        self._exported = None

    @classmethod
    def wrap(cls, node: Node, name: str, encoding: QuantizationEncoding | None = None) -> "WeightData":
        """A WeightData over an existing graph node, reading nothing: how ops and readers build results.

        Example:
            >>> import numpy as np
            >>> w = WeightData.from_numpy(np.zeros((2, 3), np.float32), "w")
            >>> WeightData.wrap(w.node, "alias").name, WeightData.wrap(w.node, "alias").shape
            ('alias', (2, 3))
        """
        if cls is WeightData:
            return _wrap(node, name, encoding)
        obj = cls.__new__(cls)
        obj.node, obj.name, obj.quantization_encoding, obj._exported = node, name, encoding, None
        return obj

    @classmethod
    def from_numpy(cls, arr, name: str) -> "WeightData":
        """Wrap an in-memory array (held by reference: do not mutate it afterwards)."""
        return cls.wrap(ops.const(_to_host_array(arr, name)), name)

    # --- metadata -----------------------------------------------------------------------------------
    @property
    def dtype(self) -> DType:
        """The element type of the result (a `DType`), known without reading."""
        return self.node.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the result, known without reading."""
        return self.node.shape

    @property
    def ndim(self) -> int:
        """Number of dimensions (`len(shape)`)."""
        return self.node.ndim

    @property
    def size(self) -> int:
        """Number of elements (the product of `shape`)."""
        return self.node.size

    @property
    def nbytes(self) -> int:
        """Bytes of the materialized result (`size * dtype.size_in_bytes`; packed block bytes when quantized)."""
        return self.node.nbytes

    def __len__(self) -> int:
        if not self.shape:
            raise ArgumentTypeError(f"len() of a 0-d WeightData {self.name!r} (shape [])")
        return self.shape[0]

    def __repr__(self) -> str:
        q = f", {self.quantization_encoding.name}" if self.quantization_encoding else ""
        return f"WeightData({self.name!r}, {self.dtype.name}{list(self.shape)}{q}, op={self.node.op})"

    def _derive(self, node: Node, keep_encoding: bool = True) -> "WeightData":
        return _wrap(node, self.name, self.quantization_encoding if keep_encoding else None)

    def _check_not_quantized(self, what: str) -> None:
        if self.quantization_encoding is not None:
            raise DTypeError(
                f"{what} on {self.name!r}: it holds {self.quantization_encoding.name} blocks "
                f"(uint8{list(self.shape)}), not values; call .dequantize() first"
            )

    def _check_block_axis_kept(self, what: str, new_last: int | None) -> None:
        # Packed blocks may be re-laid-out along their leading axes only; the byte axis must stay last.
        if self.quantization_encoding is not None and new_last != self.shape[-1]:
            raise ShapeError(
                f"{what} on {self.name!r} would break its {self.quantization_encoding.name} block rows "
                f"(last axis of {self.shape[-1]} bytes must stay last and whole); call .dequantize() first"
            )

    # --- element type -------------------------------------------------------------------------------
    def astype(self, dtype: DType) -> "WeightData":
        """Convert values to `dtype`: round-to-nearest-even, NaN and inf kept, as ml_dtypes does."""
        if self.quantization_encoding is not None:
            self._check_not_quantized("astype")
        return _wrap(ops.cast(self.node, dtype if type(dtype) is DType else DType.parse(dtype)), self.name, None)

    def view(self, dtype: DType) -> "WeightData":
        """Reinterpret the bits as `dtype` (numpy's `view`: the last axis scales by the size ratio)."""
        self._check_not_quantized("view")
        return self._derive(ops.bitcast(self.node, DType.parse(dtype)))

    def dequantize(self, dtype: DType = DType.float32) -> "WeightData":
        """Quantized blocks -> values of `dtype` (float32, float16, bfloat16). Unquantized: a cast."""
        dtype = DType.parse(dtype)
        if self.quantization_encoding is None:
            return self._derive(ops.cast(self.node, dtype))
        return self._derive(ops.dequantize(self.node, self.quantization_encoding, dtype), keep_encoding=False)

    def quantize(self, encoding: QuantizationEncoding) -> "WeightData":
        """Values -> packed `encoding` blocks (uint8, last axis in bytes), e.g. for writing GGUF."""
        self._check_not_quantized("quantize")
        enc = QuantizationEncoding.parse_required(encoding, f"quantize {self.name!r}")
        return WeightData.wrap(ops.quantize(self.node, enc), self.name, enc)

    # --- arithmetic (for scale-based dequantization: weight * scale) ----------------------------------
    def _binary(self, kind: str, other, reflected: bool = False) -> "WeightData":
        if self.quantization_encoding is not None:
            self._check_not_quantized(kind)
        if type(other) is not WeightData:
            if not isinstance(other, WeightData):
                if isinstance(other, (numbers.Number, np.number)):
                    other = np.asarray(other, dtype=self.dtype.to_numpy())
                other = WeightData.from_numpy(_to_host_array(other, f"{self.name}.{kind}"), f"{self.name}.{kind}")
        if other.quantization_encoding is not None:
            other._check_not_quantized(kind)
        a, b = (other.node, self.node) if reflected else (self.node, other.node)
        return _wrap(binary(kind, a, b), self.name, None)

    def __mul__(self, other) -> "WeightData":
        """Elementwise product with numpy broadcasting; both operands must share a dtype (cast first)."""
        return self._binary("mul", other)

    def __rmul__(self, other) -> "WeightData":
        return self._binary("mul", other, reflected=True)

    def __add__(self, other) -> "WeightData":
        return self._binary("add", other)

    def __radd__(self, other) -> "WeightData":
        return self._binary("add", other, reflected=True)

    def __sub__(self, other) -> "WeightData":
        return self._binary("sub", other)

    def __rsub__(self, other) -> "WeightData":
        return self._binary("sub", other, reflected=True)

    def __truediv__(self, other) -> "WeightData":
        return self._binary("div", other)

    def __rtruediv__(self, other) -> "WeightData":
        return self._binary("div", other, reflected=True)

    # --- layout -------------------------------------------------------------------------------------
    def reshape(self, *shape) -> "WeightData":
        """New shape, same elements in C order; one -1 allowed. `reshape(2, 3)` or `reshape((2, 3))`."""
        if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
            shape = tuple(shape[0])
        node = ops.reshape(self.node, shape)
        if self.quantization_encoding is not None:
            self._check_block_axis_kept("reshape", node.shape[-1] if node.shape else None)
        return self._derive(node)

    def permute(self, axes: Sequence[int]) -> "WeightData":
        """Reorder axes: output axis i is input axis `axes[i]`."""
        node = ops.permute(self.node, tuple(axes))
        if self.quantization_encoding is not None and node.op is Op.PERMUTE and node.arg[-1] != self.ndim - 1:
            self._check_block_axis_kept("permute", None)
        return self._derive(node)

    def transpose(self, *axes) -> "WeightData":
        """numpy's transpose: no arguments reverses the axes; otherwise a full permutation."""
        if not axes:
            axes = tuple(reversed(range(self.ndim)))
        elif len(axes) == 1 and not isinstance(axes[0], numbers.Integral):
            axes = tuple(axes[0])
        return self.permute(axes)

    @property
    def T(self) -> "WeightData":  # noqa: N802 - numpy's spelling
        """The transpose, lazily (numpy's `.T`: axes reversed).

        Example:
            >>> import numpy as np
            >>> WeightData.from_numpy(np.zeros((2, 3), np.float32), "w").T.shape
            (3, 2)
        """
        return self.transpose()

    def swapaxes(self, a: int, b: int) -> "WeightData":
        """Exchange two axes (torch's `transpose(a, b)`)."""
        axes = list(range(self.ndim))
        try:
            axes[a], axes[b] = axes[b], axes[a]
        except IndexError:
            raise ShapeError(f"swapaxes({a}, {b}) on {self.ndim}-d {self.name!r}") from None
        return self.permute(axes)

    def __getitem__(self, key) -> "WeightData":
        """Basic slices, integers, `None`, `...`, and one 1-D integer (or boolean) array, as numpy indexes."""
        node = _index(self.node, key, self.name)
        if self.quantization_encoding is not None:
            self._check_block_axis_kept("indexing", node.shape[-1] if node.shape else None)
        return _wrap(node, self.name, self.quantization_encoding)

    # --- materialization ----------------------------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """Materialize: a numpy array (bf16/fp8 as ml_dtypes arrays; a source with no ops is a zero-copy view)."""
        from ..run.materialize import materialize  # (loads the run layer on first use)

        arr = materialize({self.name: self.node})[self.name]
        # The declared shape, always: a 0-d result (a k_scale) is a scalar, never [x] (tests/graph/test_ops.py).
        return arr if arr.shape == self.shape else arr.reshape(self.shape)

    @property
    def data(self) -> np.ndarray:
        """The materialized array (DLPack-capable), as MAX's `WeightData.data`."""
        return self.to_numpy()

    def __array__(self, dtype=None, copy=None):
        arr = self.to_numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __dlpack__(self, *args, **kwargs):
        """Export through DLPack, materializing at most once per `WeightData`.

        The first export materializes; the array is kept, and later exports share it. A consumer may export
        one value several times: MAX's `Module.load_state_dict` does so three times per value (shape check,
        alignment check, then the inference session's load), which would otherwise be three
        materializations. Like MAX's eager `WeightData`, the object then holds its array: drop it to free
        the memory. A read-only view exported to a legacy consumer is copied once, here (see
        `lazy.dlpack.exportable`)."""
        arr = self._exported if self._exported is not None else self.to_numpy()
        arr = exportable(arr, max_version=kwargs.get("max_version"), copy=kwargs.get("copy"))
        self._exported = arr
        return export_dlpack(arr, *args, **kwargs)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


# --- module functions -----------------------------------------------------------------------------------
def concat(xs: Sequence[WeightData], axis: int = 0, name: str | None = None) -> WeightData:
    """Join tensors along `axis` (named after the first unless `name` is given)."""
    xs = list(xs)
    if not xs:
        raise ShapeError("concat: nothing to concatenate")
    _check_same_encoding(xs, "concat")
    node = ops.concat([x.node for x in xs], axis)
    return WeightData.wrap(node, name or xs[0].name, xs[0].quantization_encoding)


def stack(xs: Sequence[WeightData], axis: int = 0, name: str | None = None) -> WeightData:
    """Join tensors of one shape along a new axis (e.g. per-expert weights into [E, ...])."""
    xs = list(xs)
    if not xs:
        raise ShapeError("stack: nothing to stack")
    shape = xs[0].shape
    for x in xs[1:]:
        if x.shape != shape:
            raise ShapeError(f"stack: shapes differ: {xs[0].name!r} is {list(shape)}, {x.name!r} is {list(x.shape)}")
    nd = len(shape) + 1
    if not -nd <= axis < nd:
        raise ShapeError(f"stack: axis {axis} out of range for {nd}-d result")
    axis %= nd
    expanded = [ops.reshape(x.node, shape[:axis] + (1,) + shape[axis:]) for x in xs]
    _check_same_encoding(xs, "stack")
    return WeightData.wrap(ops.concat(expanded, axis), name or xs[0].name, xs[0].quantization_encoding)


def split(x: WeightData, sizes: Sequence[int] | int, axis: int = 0) -> list[WeightData]:
    """Cut `x` along `axis`: a list gives each part's size (summing to the axis length); an int n gives
    n equal parts (numpy's `np.split`). E.g. a fused qkv_proj into q, k, v of unequal sizes."""
    if not x.shape:
        raise ShapeError(f"split: {x.name!r} is 0-d")
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"split: axis {axis} out of range for {x.ndim}-d {x.name!r}")
    axis %= x.ndim
    length = x.shape[axis]
    if isinstance(sizes, (int, numbers.Integral)):  # np.integer too
        n = int(sizes)
        if n <= 0 or length % n:
            raise ShapeError(f"split: axis {axis} of {x.name!r} (shape {list(x.shape)}) has length {length}, "
                             f"not divisible into {n} equal parts")
        lengths = [length // n] * n
    else:
        lengths = [int(s) for s in sizes]
    if any(s < 0 for s in lengths) or sum(lengths) != length:
        raise ShapeError(f"split: sizes {lengths} sum to {sum(lengths)} but axis {axis} of {x.name!r} "
                         f"(shape {list(x.shape)}) has length {length}")
    parts, start = [], 0
    for s in lengths:
        ranges = [(0, d, 1) for d in x.shape]
        ranges[axis] = (start, start + s, 1)
        parts.append(x._derive(ops.slice_(x.node, ranges)))
        start += s
    return parts


def from_numpy(arr, name: str) -> WeightData:
    """Module-level spelling of `WeightData.from_numpy`."""
    return WeightData.from_numpy(arr, name)


def _check_same_encoding(xs: Sequence[WeightData], what: str) -> None:
    encs = {x.quantization_encoding for x in xs}
    if len(encs) > 1:
        raise DTypeError(f"{what}: mixed quantization encodings {sorted(str(e) for e in encs)}")


def _to_host_array(data, name: str = "") -> np.ndarray:
    """numpy arrays, DLPack producers, array-likes -> numpy array (no copy where possible). `name` labels errors."""
    if isinstance(data, np.ndarray):
        return data
    if isinstance(data, WeightData):
        return data.to_numpy()
    if is_foreign_weight_data(data):
        return _foreign_weight_data(data).to_numpy()
    why = ""
    if hasattr(data, "__dlpack__") and not isinstance(data, (list, tuple)):
        try:
            return np.from_dlpack(data)
        except (BufferError, TypeError, RuntimeError) as e:
            # e.g. bf16 torch tensors: numpy cannot import them through DLPack; the routes below can
            why = f"DLPack: {type(e).__name__}: {e}"
            _log.debug("%s: numpy cannot import it through DLPack (%s); trying its .numpy()",
                       type(data).__name__, e)
        carried = _through_carrier_view(data)
        if carried is not None:
            return carried
        if hasattr(data, "numpy"):
            try:
                return _torch_to_numpy(data)
            except (ImportError, AttributeError, TypeError, RuntimeError) as e:
                # torch absent, a tensor on a GPU, a dtype numpy lacks (torch's float8): np.asarray below, or
                # the DTypeError, which carries both reasons
                why += f"; .numpy(): {type(e).__name__}: {e}"
                _log.debug("%s: .numpy() failed (%s)", type(data).__name__, e)
    if isinstance(data, (list, tuple, numbers.Number)) or hasattr(data, "__array__"):
        return np.asarray(data)
    raise DTypeError(f"cannot make an array{f' for {name!r}' if name else ''} from {type(data).__name__}"
                     + (f" ({why.lstrip('; ')})" if why else ""))


def is_foreign_weight_data(value) -> bool:
    """Another library's WeightData (MAX's `max.graph.weights.WeightData`): a record with the array in a
    `data` attribute (not a method) and `name`, `dtype`, `shape` labels. Recognised without importing it."""
    if isinstance(value, WeightData) or not all(
            hasattr(value, a) for a in ("data", "name", "dtype", "shape", "quantization_encoding")):
        return False
    data = value.data
    return data is not value and not callable(data) and hasattr(data, "__dlpack__")


def _foreign_weight_data(wd, name: str | None = None) -> "WeightData":
    """A foreign WeightData as ours: its array (zero copy) with its `dtype` and `shape` labels applied by
    our constructor (a uint16 array labelled bfloat16 stands for bf16 bits, as MAX has it)."""
    return WeightData(_to_host_array(wd.data), str(getattr(wd, "name", None) or name), wd.dtype, wd.shape,
                      getattr(wd, "quantization_encoding", None))


def _through_carrier_view(data) -> np.ndarray | None:
    """A DLPack producer numpy cannot import because of its dtype (a MAX bf16/fp8 `Buffer`): if it offers
    `view(dtype)` and its dtype enum has the unsigned integer of the same width, import that view and label
    the numpy array back (zero copy). None if that does not apply."""
    dt = getattr(data, "dtype", None)
    view = getattr(data, "view", None)
    if dt is None or not callable(view):
        return None
    try:
        ours = DType.parse(dt)
        carrier = type(dt)[f"uint{8 * ours.size_in_bytes}"]
        return np.from_dlpack(view(carrier)).view(ours.to_numpy())
    except (DTypeError, KeyError, TypeError, BufferError, RuntimeError, ValueError) as e:
        _log.debug("%s: no integer carrier view for DLPack (%s: %s)", type(data).__name__, type(e).__name__, e)
        return None


def _torch_to_numpy(t) -> np.ndarray:
    """A torch CPU tensor (bf16 too) as a numpy array sharing its memory."""
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(DType.bfloat16.to_numpy())
    return t.numpy()


def _wrap(node: Node, name: str, encoding: QuantizationEncoding | None) -> WeightData:
    """`WeightData.wrap` with its slots stored directly: each op of an adapter makes one (a DeepSeek-V3
    adapter, 315,000: benchmarks/bench_scale.py)."""
    obj = _new(WeightData)
    obj.node = node
    obj.name = name
    obj.quantization_encoding = encoding
    obj._exported = None
    return obj


_new = object.__new__


# --- numpy-style indexing -----------------------------------------------------------------------------


def _index(node: Node, key, name: str) -> Node:
    """Lower a numpy index expression to slice / take / reshape (/ permute) nodes.

    Supports ints (also 0-d integer arrays), slices of any step, `None`, `...`, and at most one 1-D
    integer or boolean array. Negative-step slices become takes with descending indices (any number of
    them, one per axis). As numpy does, when the array index and integer indices are not adjacent
    (separated by a slice or `None`), the array's axis moves to the front of the result.
    """
    if not isinstance(key, tuple):
        key = (key,)
    # The common gather, `x[idx]` or `x[:, idx]` with one 1-D array and full slices before it, is one take
    # (a block-scale broadcast `s[arange(n) // 128][:, arange(k) // 128]` indexes so twice per FP8 weight).
    last = key[-1] if key else None
    if type(last) is np.ndarray and last.ndim == 1 and len(key) <= len(node.shape):
        for k in key[:-1]:
            if type(k) is not slice or k.start is not None or k.stop is not None or k.step is not None:
                break
        else:
            return ops.take(node, last, len(key) - 1)
    # A 0-d integer array indexes like a Python int (numpy's rule).
    key = tuple(
        int(k) if isinstance(k, np.ndarray) and k.ndim == 0 and np.issubdtype(k.dtype, np.integer) else k
        for k in key
    )
    # Expand the ellipsis into full slices.
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise ShapeError(f"indexing {name!r}: an index can only have a single ellipsis")
    if n_real > node.ndim:
        raise ShapeError(f"indexing {name!r}: {n_real} indices for a {node.ndim}-d tensor of shape {list(node.shape)}")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (node.ndim - n_real))
        else:
            expanded.append(k)
    expanded.extend([slice(None)] * (node.ndim - sum(1 for k in expanded if k is not None)))

    ranges, takes = [], []
    out_shape_plan: list[tuple[str, int | None]] = []  # ("new", None) or ("keep", axis of the sliced node)
    array_axis: int | None = None
    axis = 0
    kinds = []  # one entry per index element, None included (it separates advanced indices in numpy)
    for k in expanded:
        if k is None:
            out_shape_plan.append(("new", None))
            kinds.append("new")
            continue
        dim = node.shape[axis]
        if isinstance(k, slice):
            start, stop, step = k.indices(dim)
            if step < 0:
                # A reversed slice is a take with descending indices; any number of these (one per axis)
                # may appear, together with an array index.
                takes.append((axis, np.arange(start, stop, step)))
                ranges.append((0, dim, 1))
            else:
                ranges.append((start, stop, step))
            out_shape_plan.append(("keep", axis))
            kinds.append("slice")
        elif isinstance(k, (numbers.Integral, np.integer)) and not isinstance(k, (bool, np.bool_)):
            i = int(k)
            if not -dim <= i < dim:
                raise ShapeError(f"indexing {name!r}: index {i} is out of bounds for axis {axis} with size {dim} "
                                 f"(shape {list(node.shape)})")
            i %= dim
            ranges.append((i, i + 1, 1))
            kinds.append("int")
        else:
            arr = np.asarray(k)
            if arr.ndim != 1:
                raise ShapeError(f"indexing {name!r}: array indices must be 1-D, got shape {list(arr.shape)}")
            if array_axis is not None:
                raise ShapeError(f"indexing {name!r}: only one array index per indexing expression is supported; index "
                                 "twice")
            array_axis = axis
            takes.append((axis, arr))
            ranges.append((0, dim, 1))
            out_shape_plan.append(("keep", axis))
            kinds.append("array")
        axis += 1
    # numpy moves the array index's axis to the front when it and the integer indices (which then count
    # as advanced indices too) are not adjacent, and `None` separates them as well (x[0, None, [1, 2]]:
    # test_ops.py compares every such index with numpy).
    move_to_front = False
    if array_axis is not None and "int" in kinds:
        positions = [i for i, k in enumerate(kinds) if k in ("int", "array")]
        move_to_front = positions != list(range(positions[0], positions[0] + len(positions)))

    out = ops.slice_(node, ranges)
    for ax, idx in takes:
        out = ops.take(out, idx, ax)
    new_shape = [1 if ax is None else out.shape[ax] for _, ax in out_shape_plan]
    out = ops.reshape(out, tuple(new_shape))
    if move_to_front and array_axis is not None:
        p = out_shape_plan.index(("keep", array_axis))
        out = ops.permute(out, (p,) + tuple(i for i in range(len(new_shape)) if i != p))
    return out


def as_weight_data(value, name: str) -> WeightData:
    """Accept WeightData, a Weights accessor (its `.data()`), or an array (wrapped with from_numpy)."""
    if isinstance(value, WeightData):
        return value
    if hasattr(value, "data") and callable(value.data) and hasattr(value, "exists"):
        data = value.data()  # a Weights accessor, ours or another library's (MAX's)
        return data if isinstance(data, WeightData) else as_weight_data(data, name)
    if is_foreign_weight_data(value):  # MAX's WeightData: its bytes (zero copy), labels and block encoding
        return _foreign_weight_data(value, name)
    if isinstance(value, np.ndarray) or hasattr(value, "__dlpack__"):
        return WeightData(value, name)
    raise ArgumentTypeError(
        f"state dict value for {name!r} is a {type(value).__name__}; expected WeightData (or an array)"
    )
