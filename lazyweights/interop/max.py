"""MAX interop: run a lazyweights adapter inside a MAX pipeline, and move values both ways.

MAX (Modular's `max` package, `pip install 'lazyweights[max]'`) is imported only when a function here is
called, so `import lazyweights` never needs it. What is here:

- `as_max_adapter(lazy_adapter)`: a MAX `WeightsAdapter`. MAX calls it as
  `adapter(dict(max_weights.items()), huggingface_config=..., pipeline_config=...)`; it re-opens the same
  checkpoint lazily with `lazyweights.load_weights`, calls the lazy adapter MAX-style on it, materializes
  the whole adapted state dict in ONE fused plan, and returns `dict[str, max.graph.weights.WeightData]`
  with MAX `DType`, MAX `Shape` and MAX `QuantizationEncoding` (GGUF blocks), over MAX `Buffer`s.
- `to_max_state_dict(state_dict)`: the same last step for any lazy state dict (one plan).
- `load_max_module(module, state_dict)`: `max.nn.Module.load_state_dict` fed from a lazy state dict:
  checked against the module's `raw_state_dict()` from metadata first (reading nothing; one error naming
  every offending tensor), then each tensor is materialized exactly once.
- conversions: `to_max_dtype` / `from_max_dtype`, `to_max_encoding` / `from_max_encoding`,
  `to_max_device` / `from_max_device`, `to_max_buffer`, `to_max_weight_data`. The other direction needs
  nothing from here: `DType.parse`, `DeviceRef.parse`, `QuantizationEncoding.parse`, `plan()`,
  `WeightData(...)` and `Weights.allocate(device=...)` accept MAX's objects directly.

How the checkpoint is re-opened (`reopen=`), first that applies:

1. `"paths"` -- the public route: `pipeline_config.model.resolved_weight_paths()`, the files MAX itself
   loaded (when MAX passes `pipeline_config` and the files hold every requested name). Reading goes
   through lazyweights' own readers, in file order.
2. `"private"` -- the documented fallback when no `pipeline_config` is given: the file list of MAX's
   `SafetensorWeights` accessor (its private `_filepaths`; MAX has no public attribute for it). Guarded:
   used only when it is a list of existing files that hold every requested name.
3. `"buffers"` -- always works, public: each accessor's `.data()` (MAX maps the file and returns a
   `Buffer` over it without reading) becomes a zero-copy lazy constant. GGUF files always take this
   route (their blocks come back with their encoding).

Zero copy: outputs that are untouched bytes of a file (pass-through tensors) are handed to MAX as
`Buffer`s over a copy-on-write map of that file, so MAX can neither be refused a read-only export nor
write into the file; computed outputs are handed over without a copy. bf16 and fp8 go through an
unsigned-integer carrier of the same width and `Buffer.view(dtype)`, so the Buffer is labelled right.

NaN payloads: lazyweights converts bf16 -> f16 with ml_dtypes' rule, so a NaN with a payload becomes the
canonical quiet NaN (0x7E00, sign kept); MAX's `WeightData.astype` keeps the mantissa bits (shifted left
by 3: bf16 0x7FC1 -> f16 0x7E08; a signalling 0xFF81 stays signalling, 0xFC08). Every
non-NaN value is identical. `nan_payloads="max"` in `to_max_state_dict` / `as_max_adapter` re-applies
MAX's rule to the f16 outputs of a bf16 -> f16 cast (see `max_nan_payloads`); it reads each such cast's
bf16 source a second time (a zero-copy map view when the source is a file tensor).

Example (runs only where MAX is installed; see tests/interop/test_max.py):

    from lazyweights.tools.demo import convert_safetensor_state_dict
    from lazyweights.interop.max import as_max_adapter
    from max.graph.weights import WeightsFormat
    weight_adapters = {WeightsFormat.safetensors: as_max_adapter(convert_safetensor_state_dict)}
    # SupportedArchitecture(..., weight_adapters=weight_adapters)
"""
from __future__ import annotations

import functools
import logging
import mmap
import os
from typing import Any, Callable, Mapping

import numpy as np

from ..core.device import DeviceRef
from ..core.dtype import DType
from ..core.errors import DependencyError, DTypeError, LoadError, UsageError, did_you_mean
from ..core.quantization import QuantizationEncoding
from ..graph.opcodes import Op
from ..io.source import ByteSource
from ..lazy.plan import Plan
from ..lazy.weight_data import WeightData, as_weight_data
from ..lazy.weights import Weights, load_weights

__all__ = [
    "as_max_adapter", "to_max_state_dict", "load_max_module", "check_max_module", "reopen_lazily",
    "to_max_dtype", "from_max_dtype", "to_max_encoding", "from_max_encoding", "to_max_device",
    "from_max_device", "to_max_buffer", "to_max_weight_data", "max_nan_payloads", "MaxAdapter",
]

_log = logging.getLogger(__name__)


# --- importing MAX ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def max_modules():
    """MAX's modules this file uses (imported on first use). ImportError with the install line if absent."""
    try:
        from max import driver, dtype
        from max.graph import DeviceRef as MaxDeviceRef
        from max.graph import Shape, quantization, weights
    except ImportError as e:
        raise DependencyError(
            "lazyweights.interop.max needs Modular's MAX: pip install 'lazyweights[max]' (or pip install max)"
        ) from e
    return _Max(driver.Buffer, dtype.DType, MaxDeviceRef, Shape, quantization.QuantizationEncoding,
                weights.WeightData)


class _Max:
    __slots__ = ("Buffer", "DType", "DeviceRef", "Shape", "QuantizationEncoding", "WeightData")

    def __init__(self, *values):
        for slot, value in zip(self.__slots__, values):
            setattr(self, slot, value)


# --- conversions ----------------------------------------------------------------------------------------
def to_max_dtype(dtype, name: str | None = None):
    """MAX's `DType` for a lazyweights dtype (or anything `DType.parse` accepts)."""
    ours = DType.parse(dtype)
    try:
        return max_modules().DType[ours.name]
    except KeyError:
        about = f" for tensor {name!r}" if name else ""
        raise DTypeError(f"MAX has no dtype {ours.name}{about}") from None


def from_max_dtype(max_dtype) -> DType:
    """lazyweights' `DType` for MAX's (same name). DTypeError for MAX's float6 types, which we lack."""
    return DType.parse(max_dtype)


def to_max_encoding(encoding, name: str | None = None):
    """MAX's `QuantizationEncoding` (None stays None). MAX knows Q4_0, Q4_K, Q5_K, Q6_K and GPTQ; any other
    block type is a DTypeError naming the tensor (dequantize it in the adapter)."""
    ours = QuantizationEncoding.parse(encoding)
    if ours is None:
        return None
    q = max_modules().QuantizationEncoding
    if ours.name in q.__members__:
        return q[ours.name]
    about = f"tensor {name!r} holds {ours.name} blocks, but " if name else f"{ours.name}: "
    raise DTypeError(f"{about}MAX has no QuantizationEncoding for {ours.name} (it knows "
                     f"{', '.join(q.__members__)}); call .dequantize() on it in the adapter")


def from_max_encoding(max_encoding) -> QuantizationEncoding | None:
    """A MAX `QuantizationEncoding` (or its name, or None) as lazyweights' encoding."""
    return QuantizationEncoding.parse(max_encoding)


def to_max_device(device):
    """MAX's `max.graph.DeviceRef` for a lazyweights device (or "cpu", "gpu:1", ...)."""
    dev = DeviceRef.parse(device)
    ref = max_modules().DeviceRef
    return ref.GPU(dev.id) if dev.is_gpu else ref.CPU(dev.id)


def from_max_device(max_device) -> DeviceRef:
    """A MAX `DeviceRef` (or anything with a device kind and id) as lazyweights' `DeviceRef`."""
    return DeviceRef.parse(max_device)


def to_max_buffer(array, name: str | None = None):
    """A MAX `Buffer` over `array`: zero copy for writable C-contiguous host arrays (bf16/fp8 through an
    unsigned carrier and `Buffer.view`, so the Buffer carries the right dtype); a read-only array is
    copied (MAX cannot be told it is read-only). Device arrays (CuPy) go through DLPack."""
    m = max_modules()
    if isinstance(array, m.Buffer):
        return array
    if not isinstance(array, np.ndarray):
        return m.Buffer.from_dlpack(array)
    ours = DType.from_numpy(array.dtype)
    if ours is DType.float4_e2m1fn:
        about = f" (tensor {name!r})" if name else ""
        raise DTypeError(f"float4_e2m1fn{about}: numpy holds one value per byte, MAX packs two; "
                         "hand MAX the packed uint8 bytes instead")
    if not array.flags.c_contiguous or not array.flags.writeable:
        array = np.array(array, copy=True, order="C")
    if ours not in _CARRIED:
        return m.Buffer.from_dlpack(array)
    carrier = array.view(np.dtype(f"uint{8 * array.dtype.itemsize}"))
    return m.Buffer.from_dlpack(carrier).view(to_max_dtype(ours, name))


# numpy cannot export these through DLPack (ml_dtypes types): they travel as same-width unsigned bits.
_CARRIED = frozenset(d for d in DType if d.is_float8 or d is DType.bfloat16)


def to_max_weight_data(array, name: str, *, dtype=None, quantization_encoding=None):
    """A MAX `WeightData` (MAX DType, MAX Shape, MAX encoding) over `array` (see `to_max_buffer`)."""
    m = max_modules()
    buf = to_max_buffer(array, name)
    max_dtype = to_max_dtype(dtype, name) if dtype is not None else buf.dtype
    if buf.dtype != max_dtype:
        buf = buf.view(max_dtype)
    return m.WeightData(buf, name, max_dtype, m.Shape(list(buf.shape)),
                        to_max_encoding(quantization_encoding, name))


# --- zero-copy hand-over of pass-through outputs --------------------------------------------------------
class _CopyOnWriteMaps:
    """Copy-on-write maps of the checkpoint files a plan reads, to hand MAX writable zero-copy views."""

    def __init__(self, plan: Plan):
        self.files: dict[str, tuple[ByteSource, int]] = {}  # path -> (file, address of its map)
        for node in plan.nodes():
            if node.op is Op.SOURCE:
                f = node.arg.file
                if f.size and f.path not in self.files:
                    self.files[f.path] = (f, f.view(0, f.size).ctypes.data)
        self.maps: dict[str, np.ndarray] = {}

    def view_of(self, arr: np.ndarray) -> np.ndarray | None:
        """The same bytes as `arr` (a read-only view of a file's map) in a private, writable map."""
        if not arr.flags.c_contiguous or arr.nbytes == 0:
            return None
        addr = arr.ctypes.data
        for path, (f, base) in self.files.items():
            if base <= addr and addr + arr.nbytes <= base + f.size:
                f.check_unchanged()
                cow = self.maps.get(path)
                if cow is None:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        cow = np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_COPY), np.uint8)
                    finally:
                        os.close(fd)
                    self.maps[path] = cow
                off = addr - base
                return cow[off:off + arr.nbytes].view(arr.dtype).reshape(arr.shape)
        return None


# --- the whole state dict, materialized once -------------------------------------------------------------
def to_max_state_dict(state_dict: Mapping[str, Any], *, device=None, budget=None, workers: int | None = None,
                      zero_copy: bool = True, nan_payloads: str = "ml_dtypes") -> dict:
    """Materialize a lazy state dict in ONE fused plan and wrap it as `dict[str, max WeightData]`.

    `device`: None (host) or a GPU (`DeviceRef.GPU(0)`, MAX's `DeviceRef`, "gpu:0"). `zero_copy`: hand
    pass-through tensors over as copy-on-write maps of their files (else a copy). `nan_payloads`:
    "ml_dtypes" (canonical quiet NaN) or "max" (see `max_nan_payloads`)."""
    max_modules()  # fail here, before any work, if MAX is absent
    if nan_payloads not in ("ml_dtypes", "max"):
        raise UsageError(f"nan_payloads must be 'ml_dtypes' or 'max', got {nan_payloads!r}")
    p = Plan(state_dict)
    encodings = {}
    for name, wd in p.tensors.items():  # metadata first: an unsupported encoding fails before any read
        encodings[name] = to_max_encoding(wd.quantization_encoding, name)
        to_max_dtype(wd.dtype, name)
    dev = DeviceRef.parse(device)
    arrays = p.materialize(device=dev if dev.is_gpu else None, budget=budget, workers=workers)
    cow = _CopyOnWriteMaps(p) if zero_copy else None
    m = max_modules()
    out = {}
    for name, wd in p.tensors.items():
        arr = arrays[name]
        if isinstance(arr, np.ndarray):
            if arr.shape != wd.shape:
                arr = arr.reshape(wd.shape)
            if nan_payloads == "max":
                arr = _apply_max_nan_rule(wd, arr)
            if not arr.flags.writeable and cow is not None:
                shared = cow.view_of(arr)
                arr = arr if shared is None else shared
        buf = to_max_buffer(arr, name)
        max_dtype = to_max_dtype(wd.dtype, name)
        if buf.dtype != max_dtype:
            buf = buf.view(max_dtype)
        out[name] = m.WeightData(buf, name, max_dtype, m.Shape(list(wd.shape)), encodings[name])
    return out


# --- NaN payloads ------------------------------------------------------------------------------------------
def max_nan_payloads(bf16_bits: np.ndarray, f16_bits: np.ndarray) -> np.ndarray:
    """f16 bits of a bf16 -> f16 conversion with MAX's NaN rule: a NaN keeps its sign and its whole 7-bit
    mantissa shifted into place (mantissa << 3), so the payload and a signalling NaN's missing quiet bit are
    kept (bf16 0x7FC1 -> f16 0x7E08, 0xFF81 -> 0xFC08); non-NaN values are unchanged.
    Both arguments are uint16 bit patterns of equal shape; returns new uint16 bits."""
    b = np.asarray(bf16_bits, dtype=np.uint16)
    out = np.array(f16_bits, dtype=np.uint16, copy=True)
    nan = (b & 0x7F80) == 0x7F80
    nan &= (b & 0x007F) != 0
    if nan.any():
        sign = (b[nan] & 0x8000)
        payload = (b[nan] & 0x007F).astype(np.uint16) << 3
        out[nan] = sign | 0x7C00 | payload
    return out


def _apply_max_nan_rule(wd: WeightData, arr: np.ndarray) -> np.ndarray:
    node = wd.node
    if node.op is not Op.CAST or node.dtype is not DType.float16 or node.srcs[0].dtype is not DType.bfloat16:
        return arr
    src = Plan({"x": WeightData.wrap(node.srcs[0], wd.name)}).materialize()["x"]
    bits = max_nan_payloads(np.asarray(src).view(np.uint16), arr.view(np.uint16))
    return bits.view(np.float16)


# --- checking against a MAX module, then loading it --------------------------------------------------------
def _static_dims(shape) -> list[int | None]:
    dims: list[int | None] = []
    for d in shape:
        try:
            dims.append(int(d))
        except TypeError:
            dims.append(None)  # a symbolic dimension: any length
    return dims


def check_max_module(module, state_dict: Mapping[str, Any], *, strict: bool = True,
                     override_quantization_encoding: bool = False) -> list[str]:
    """Every problem loading `state_dict` into a MAX module would hit, from metadata only (reads nothing):
    missing and unexpected names (with did-you-mean), dtype, shape and encoding mismatches, each naming the
    tensor. The rules are MAX's `Module.load_state_dict`'s."""
    expected = module.raw_state_dict()
    problems = []
    given = {}
    for name, value in state_dict.items():
        given[name] = as_weight_data(value, name)
    for name, weight in expected.items():
        wd = given.get(name)
        if wd is None:
            if strict:
                problems.append(f"{name!r}: missing{did_you_mean(name, given, n=1)}")
            continue
        w_dtype = from_max_dtype(weight.dtype)
        w_enc = from_max_encoding(weight.quantization_encoding)
        if w_enc is QuantizationEncoding.GPTQ:
            continue  # MAX reinterprets GPTQ values as uint8 bytes itself
        if w_dtype is not wd.dtype:
            problems.append(f"{name!r}: dtype {wd.dtype.name}, the module expects {w_dtype.name} "
                            "(cast it in the adapter)")
        w_shape, d_shape = _static_dims(weight.shape), list(wd.shape)
        same = len(w_shape) == len(d_shape) and all(a is None or a == b for a, b in zip(w_shape, d_shape))
        if not (w_enc is not None or same or {len(w_shape), len(d_shape)} == {0, 1} and wd.size == 1
                or (w_dtype is DType.uint8 and wd.dtype is DType.uint8)):
            problems.append(f"{name!r}: shape {d_shape}, the module expects {w_shape}")
        if wd.quantization_encoding is not None and w_enc not in (None, wd.quantization_encoding) \
                and not override_quantization_encoding:
            problems.append(f"{name!r}: {wd.quantization_encoding.name} blocks, the module expects {w_enc.name}")
        try:
            to_max_encoding(wd.quantization_encoding, name)
        except DTypeError as e:
            problems.append(str(e))
    if strict:
        for name in given:
            if name not in expected:
                problems.append(f"{name!r}: not a weight of the module{did_you_mean(name, expected, n=1)}")
    return problems


def load_max_module(module, state_dict: Mapping[str, Any], *, strict: bool = True,
                    override_quantization_encoding: bool = False, weight_alignment: int | None = None,
                    device=None, budget=None, workers: int | None = None):
    """`module.load_state_dict` of a MAX `max.nn.Module` from a lazy state dict, each tensor read once.

    Checks everything first from metadata (`check_max_module`; LoadError naming every tensor at fault),
    then materializes the state dict in one plan (`to_max_state_dict`) and hands MAX its own WeightData.
    Handing lazy WeightData to MAX directly also works, but MAX then converts each value through DLPack
    several times (shape check, alignment check, load), each a one-tensor plan."""
    problems = check_max_module(module, state_dict, strict=strict,
                                override_quantization_encoding=override_quantization_encoding)
    if problems:
        raise LoadError(f"cannot load {type(module).__name__}: {len(problems)} problem(s):\n  "
                        + "\n  ".join(problems))
    expected = module.raw_state_dict()
    wanted = {k: v for k, v in state_dict.items() if k in expected}
    values = to_max_state_dict(wanted, device=device, budget=budget, workers=workers)
    module.load_state_dict(values, strict=strict, override_quantization_encoding=override_quantization_encoding,
                           weight_alignment=weight_alignment)
    return values


# --- re-opening MAX's accessors lazily, and the adapter ------------------------------------------------------
def _paths_from_pipeline(pipeline_config) -> list[str] | None:
    model = getattr(pipeline_config, "model", None) or getattr(pipeline_config, "model_config", None)
    resolve = getattr(model, "resolved_weight_paths", None)
    if resolve is None or getattr(model, "header_only_weights", False):
        return None
    try:
        paths = [os.fspath(p) for p in resolve()]
    except Exception as e:  # noqa: BLE001 - whatever MAX or the hub raises offline: use another route
        _log.debug("the pipeline config's weight paths do not resolve (%s: %s); trying another route",
                   type(e).__name__, e)
        return None
    return paths or None


def _paths_from_accessor(accessor) -> list[str] | None:
    # Documented fallback: MAX's SafetensorWeights keeps its files only in the private `_filepaths`.
    paths = getattr(accessor, "_filepaths", None)
    if not isinstance(paths, (list, tuple)) or not paths:
        return None
    paths = [os.fspath(p) for p in paths]
    return paths if all(p.endswith(".safetensors") and os.path.isfile(p) for p in paths) else None


def _names_hold(weights: Weights, names) -> bool:
    return all(n in weights for n in names)


def reopen_lazily(state_dict: Mapping[str, Any], pipeline_config=None, *, reopen: str = "auto"):
    """MAX's `dict(weights.items())` -> `(dict of lazy accessors in the same order, route taken)`.

    `reopen`: "auto" (paths, then private, then buffers), or one of "paths", "private", "buffers"."""
    if reopen not in ("auto", "paths", "private", "buffers"):
        raise UsageError(f"reopen must be 'auto', 'paths', 'private' or 'buffers', got {reopen!r}")
    names = list(state_dict)
    if all(isinstance(v, Weights) for v in state_dict.values()):
        return dict(state_dict), "lazyweights"
    routes = ["paths", "private", "buffers"] if reopen == "auto" else [reopen]
    for route in routes:
        paths = None
        if route == "paths" and pipeline_config is not None:
            paths = _paths_from_pipeline(pipeline_config)
        elif route == "private" and state_dict:
            paths = _paths_from_accessor(next(iter(state_dict.values())))
        elif route == "buffers":
            return {n: _BufferAccessor(n, v) for n, v in state_dict.items()}, "buffers"
        if paths:
            weights = load_weights(paths)
            if _names_hold(weights, names):
                return {n: weights[n] for n in names}, route
        if reopen != "auto":
            raise UsageError(f"reopen={route!r}: cannot find MAX's checkpoint files that way")
    raise AssertionError("unreachable")  # pragma: no cover - "buffers" always returns


class _BufferAccessor:
    """A `Weights`-protocol accessor over one MAX accessor: `.data()` is a lazy, zero-copy constant over the
    Buffer MAX maps from the file (MAX reads nothing to make it)."""

    __slots__ = ("name", "accessor")

    def __init__(self, name: str, accessor):
        self.name, self.accessor = name, accessor

    def exists(self) -> bool:
        return bool(self.accessor.exists())

    def data(self) -> WeightData:
        return as_weight_data(self.accessor.data(), self.name)

    def __repr__(self) -> str:
        return f"<MAX accessor {self.name!r}, lazy>"


def as_max_adapter(lazy_adapter: Callable[..., Mapping[str, Any]], *, reopen: str = "auto", device=None,
                   budget=None, workers: int | None = None, zero_copy: bool = True,
                   nan_payloads: str = "ml_dtypes") -> MaxAdapter:
    """Wrap a lazy, MAX-style adapter as a MAX `WeightsAdapter`.

    The result is called by MAX as `adapter(state_dict, huggingface_config=..., pipeline_config=...)`
    with `state_dict = dict(max_weights.items())`; it re-opens the checkpoint lazily (`reopen_lazily`),
    calls `lazy_adapter(lazy_state_dict, huggingface_config=..., pipeline_config=..., **kwargs)`, and
    returns `to_max_state_dict(...)` of its result: one fused plan, MAX WeightData out.
    `device`: None (host, as MAX's own adapters return), a GPU, or "pipeline" (the pipeline's first
    device). The route taken is in `adapter.last_route` after a call."""

    return MaxAdapter(lazy_adapter, reopen=reopen, device=device, budget=budget, workers=workers,
                      zero_copy=zero_copy, nan_payloads=nan_payloads)


class MaxAdapter:
    """What `as_max_adapter` returns: a MAX `WeightsAdapter` (a callable) that also keeps `lazy_adapter` and
    the route its last call took (`last_route`: "private", "paths" or "buffers"; None before a call).

    It wraps the lazy adapter (`functools.update_wrapper`), so its name and docstring are the adapter's.
    """

    def __init__(self, lazy_adapter: Callable[..., Mapping[str, Any]], *, reopen: str, device, budget,
                 workers: int | None, zero_copy: bool, nan_payloads: str):
        self.lazy_adapter = lazy_adapter
        self.last_route: str | None = None
        self.reopen, self.device, self.budget, self.workers = reopen, device, budget, workers
        self.zero_copy, self.nan_payloads = zero_copy, nan_payloads
        functools.update_wrapper(self, lazy_adapter)

    def __call__(self, state_dict, huggingface_config=None, pipeline_config=None, **kwargs) -> dict:
        lazy_in, route = reopen_lazily(state_dict, pipeline_config, reopen=self.reopen)
        self.last_route = route
        out = self.lazy_adapter(lazy_in, huggingface_config=huggingface_config, pipeline_config=pipeline_config,
                                **kwargs)
        dev = _pipeline_device(pipeline_config) if self.device == "pipeline" else self.device
        return to_max_state_dict(out, device=dev, budget=self.budget, workers=self.workers,
                                 zero_copy=self.zero_copy, nan_payloads=self.nan_payloads)


def _pipeline_device(pipeline_config):
    model = getattr(pipeline_config, "model", None) or getattr(pipeline_config, "model_config", None)
    specs = getattr(model, "device_specs", None) or []
    for spec in specs:
        if str(getattr(spec, "device_type", "cpu")) == "gpu":
            return DeviceRef.GPU(int(getattr(spec, "id", 0)))
    return None
