"""`Module` and `LayerList`: weights declared in a tree, named by attribute path, loaded from a lazy state dict.

Naming (as MAX does): a weight's full name is the dotted attribute path of the `Module` that
holds it, then the `Weight`'s own `name`. The attribute a `Weight` is bound to does not enter the name.

    class Linear(Module):
        def __init__(self, n, m):
            super().__init__()
            self.weight = Weight("weight", DType.bfloat16, (m, n))     # -> "<path>.weight"

    model.layers[0].attention.q_proj.weight  ->  "layers.0.attention.q_proj.weight"

So `self.q_proj = Weight("q_proj.weight", ...)` directly inside `attention` is also
`attention.q_proj.weight`, while `self.q_proj = Weight("weight", ...)` there is `attention.weight`. Two
different `Weight`s with the same name in one module are an error (the second would silently replace the
first in MAX). A `Weight` whose name is empty takes its attribute's name. Unlike MAX,
loading does not rewrite `Weight.name` to the full name: the full name is the key in
`raw_state_dict()`, and a `Weight` keeps the name it was declared with (so tying it elsewhere later
still names it predictably).

Tied weights: one `Weight` object reachable under two names (assign it to two modules, or use
`set_shared_weight`) is one tensor. `raw_state_dict()` and `state_dict()` list it under every name;
`load_state_dict` needs the value under any one of them (the first declared wins when several are
given) and loads it once. A sub-`Module` object reachable twice is listed once, under its first path.

`load_state_dict(state_dict, *, strict=True, override_quantization_encoding=False, weight_alignment=None)`:

1. validates every entry from metadata only (names, dtypes, shapes, quantization encodings, value types),
   reading no tensor bytes, and raises one `LoadError` (a `ValueError`) naming every offender: missing
   weights (with did-you-mean), unexpected keys, dtype and shape mismatches (cast or reshape in the
   adapter: load_state_dict never converts), encoding mismatches, values that are not arrays.
   `strict=False` tolerates missing and unexpected weights, nothing else;
2. allocates each weight's buffer aligned to `weight_alignment` bytes (or the Weight's `align`, at least
   64), and materializes the whole state dict in one plan straight into those buffers
   (`Plan(...).materialize(out=buffers)`), so nothing is held twice;
3. only then replaces the module's values (a failure while reading leaves the previous values in place).

Example:
    >>> import numpy as np
    >>> from lazyweights import Weight, DType, WeightData
    >>> from lazyweights.interop.module import Module, LayerList
    >>> class Linear(Module):
    ...     def __init__(self, n):
    ...         super().__init__()
    ...         self.weight = Weight("weight", DType.float32, (n, n))
    >>> class Net(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.layers = LayerList([Linear(2) for _ in range(2)])
    >>> net = Net()
    >>> list(net.raw_state_dict())
    ['layers.0.weight', 'layers.1.weight']
    >>> net.load_state_dict({f"layers.{i}.weight": WeightData.from_numpy(np.eye(2, dtype=np.float32), "w")
    ...                      for i in range(2)}).ok
    True
    >>> net.state_dict()["layers.1.weight"].tolist()
    [[1.0, 0.0], [0.0, 1.0]]
"""
from __future__ import annotations

import warnings
from collections import deque
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..core.dtype import DType
from ..core.errors import ArgumentTypeError, LoadError, UsageError
from ..lazy.weight import Weight
from .check import CheckReport, Slot, check, load_error_message, validate

__all__ = ["Module", "LayerList", "aligned_empty"]

DEFAULT_ALIGNMENT = 64  # bytes: a cache line, and enough for every dtype and SIMD width we use


def aligned_empty(shape: Sequence[int], dtype, align: int = DEFAULT_ALIGNMENT) -> np.ndarray:
    """An uninitialised C-contiguous array whose data address is a multiple of `align` bytes."""
    dt = dtype.to_numpy() if isinstance(dtype, DType) else np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + nbytes].view(dt).reshape(shape)


def _check_alignment_arg(weight_alignment) -> None:
    if weight_alignment is None:
        return
    if (isinstance(weight_alignment, bool) or not isinstance(weight_alignment, (int, np.integer))
            or weight_alignment <= 0 or weight_alignment & (weight_alignment - 1)):
        raise LoadError(f"weight_alignment must be a positive power of two (bytes), got {weight_alignment!r}")


class Module:
    """A tree of weights and sub-modules. Subclass it and assign `Weight`s and `Module`s as attributes."""

    # Set in __init__ through object.__setattr__ (this class's __setattr__ declares weights and sub-modules).
    _sublayers: dict[str, Module]         # attribute -> Module
    _layer_weights: dict[str, Weight]     # declared weight name -> Weight
    _weight_attrs: dict[str, str]         # attribute -> declared weight name
    _shared_weights: set[str]             # declared names loaded elsewhere
    _weight_values: dict[str, Any]        # full name -> array (numpy, or CuPy on a GPU; root module's values)

    def __init__(self):
        # __setattr__ may run before super().__init__() in a subclass; do not reset what it set up.
        if "_sublayers" not in self.__dict__:
            object.__setattr__(self, "_sublayers", {})       # attribute -> Module
            object.__setattr__(self, "_layer_weights", {})   # declared weight name -> Weight
            object.__setattr__(self, "_weight_attrs", {})    # attribute -> declared weight name
            object.__setattr__(self, "_shared_weights", set())  # declared names loaded elsewhere
            object.__setattr__(self, "_weight_values", {})   # full name -> array (root module's values)

    # --- declaring ------------------------------------------------------------------------------------
    def __setattr__(self, name: str, value) -> None:
        if "_sublayers" not in self.__dict__:
            Module.__init__(self)
        self._forget(name)
        if isinstance(value, Module):
            self._sublayers[name] = value
        elif isinstance(value, Weight):
            wname = value.name or name
            if not value.name:
                value.name = name
            holder = self._layer_weights.get(wname)
            if holder is not None and holder is not value:
                other = next((a for a, n in self._weight_attrs.items() if n == wname), "?")
                raise UsageError(
                    f"{type(self).__name__}.{name}: a different Weight named {wname!r} is already declared "
                    f"(attribute {other!r}). A weight's full name is the module path plus the Weight's own "
                    f"name, so give it a distinct name (e.g. Weight({name + '.' + wname!r}, ...)) or put it "
                    "in its own sub-Module."
                )
            self._layer_weights[wname] = value
            self._weight_attrs[name] = wname
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (Module, Weight)) for v in value):
            warnings.warn(
                f"{type(self).__name__}.{name}: a {type(value).__name__} of Modules/Weights is not part of the "
                "weight tree; use LayerList", stacklevel=2)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._forget(name)
        object.__delattr__(self, name)

    def _forget(self, name: str) -> None:
        self._sublayers.pop(name, None)
        wname = self._weight_attrs.pop(name, None)
        if wname is not None and wname not in self._weight_attrs.values():
            self._layer_weights.pop(wname, None)
            self._shared_weights.discard(wname)

    def set_shared_weight(self, name: str, weight: Weight) -> None:
        """Bind `weight` (declared elsewhere) as attribute `name`; it is loaded with its owner, not here."""
        setattr(self, name, weight)
        self._shared_weights.add(self._weight_attrs[name])

    @property
    def sublayers(self) -> dict[str, "Module"]:
        """The direct child modules by attribute name (LayerList entries by index)."""
        return self._sublayers

    @property
    def layer_weights(self) -> dict[str, Weight]:
        """This module's own weights, by declared name (not recursive)."""
        return self._layer_weights

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        """(path, module) for this module and every sub-module, breadth first, each object once."""
        seen: set[int] = set()
        queue: deque[tuple[str, Module]] = deque([(prefix, self)])
        while queue:
            path, mod = queue.popleft()
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            yield path, mod
            for attr, sub in mod._sublayers.items():
                queue.append((f"{path}.{attr}" if path else attr, sub))

    # --- the state dict -----------------------------------------------------------------------------------
    def _named_weights(self) -> list[tuple[str, Weight, bool]]:
        """(full name, Weight, shared) in declaration order; raises on two Weights with one full name."""
        out: list[tuple[str, Weight, bool]] = []
        seen: dict[str, Weight] = {}
        for path, mod in self.named_modules():
            prefix = f"{path}." if path else ""
            for wname, w in mod._layer_weights.items():
                full = prefix + wname
                other = seen.get(full)
                if other is not None and other is not w:
                    raise UsageError(f"two different Weights have the full name {full!r}")
                if other is None:
                    seen[full] = w
                    out.append((full, w, wname in mod._shared_weights))
        return out

    def raw_state_dict(self) -> dict[str, Weight]:
        """Every declared `Weight` by full name (tied weights under each of their names)."""
        return {full: w for full, w, _ in self._named_weights()}

    def _lw_slots(self) -> list[Slot]:
        """One slot per distinct Weight object: canonical name first (non-shared first), aliases after."""
        groups: dict[int, list[tuple[str, Weight, bool]]] = {}
        for full, w, shared in self._named_weights():
            groups.setdefault(id(w), []).append((full, w, shared))
        slots = []
        for entries in groups.values():
            entries.sort(key=lambda e: e[2])  # stable: declared owners before set_shared_weight aliases
            w = entries[0][1]
            slots.append(Slot(tuple(e[0] for e in entries), w.dtype, tuple(w.shape),
                              w.quantization_encoding, w))
        return slots

    def state_dict(self, auto_initialize: bool = True) -> dict[str, np.ndarray]:
        """Every weight's loaded array by full name (tied names share one array).

        Weights never loaded are zero-filled (aligned) when `auto_initialize`, else ValueError."""
        out: dict[str, np.ndarray] = {}
        values = self._weight_values
        for slot in self._lw_slots():
            arr = next((values[n] for n in slot.names if n in values), None)
            if arr is None:
                if not auto_initialize:
                    raise LoadError(f"Weight '{slot.names[0]}' was not initialized.")
                w = slot.target
                arr = aligned_empty(w.shape, w.dtype, max(w.align or 1, DEFAULT_ALIGNMENT))
                arr[...] = 0
            for n in slot.names:
                values[n] = arr
                out[n] = arr
        return {n: out[n] for n in self.raw_state_dict()}

    def check(self, state_dict: Mapping[str, Any], *, override_quantization_encoding: bool = False,
              renames=None, checkpoint=None) -> CheckReport:
        """`lazyweights.check(state_dict, self)`: the bring-up report, reading nothing."""
        return check(state_dict, self, override_quantization_encoding=override_quantization_encoding,
                     renames=renames, checkpoint=checkpoint)

    def load_state_dict(self, state_dict: Mapping[str, Any], *, strict: bool = True,
                        override_quantization_encoding: bool = False, weight_alignment: int | None = None,
                        budget=None, scheduler=None, progress: bool = False) -> CheckReport:
        """Validate everything (reading nothing), then load every weight in one plan into aligned buffers.

        Raises LoadError (a ValueError) naming every problem; see the module docstring. Returns the
        CheckReport (with strict=False, its `missing` / `unexpected` say what was tolerated).
        `budget` / `scheduler` / `progress` are passed to `Plan.materialize`."""
        from ..lazy.plan import Plan

        _check_alignment_arg(weight_alignment)
        report, resolved = validate(self._lw_slots(), state_dict,
                                    override_quantization_encoding=override_quantization_encoding)
        if report.problem_count(strict=strict):
            raise LoadError(load_error_message(report, strict, f"{type(self).__name__}"), report)

        buffers: dict = {}
        sources = {}
        device_sources: dict = {}  # weights declared on a GPU: DeviceRef -> {name: WeightData}
        for r in resolved:
            w = r.slot.target
            canonical = r.slot.names[0]
            if w.device.is_gpu:
                device_sources.setdefault(w.device, {})[canonical] = r.value
                continue
            align = max(int(weight_alignment or w.align or 1), DEFAULT_ALIGNMENT)
            buffers[canonical] = aligned_empty(r.shape, r.dtype, align)
            sources[canonical] = r.value
        if sources:
            Plan(sources).materialize(out=buffers, budget=budget, scheduler=scheduler, progress=progress)
        for device, group in device_sources.items():  # straight onto the device (CuPy arrays)
            buffers.update(Plan(group).materialize(device=device, budget=budget, progress=progress))

        for r in resolved:  # commit only after every byte was read
            w = r.slot.target
            canonical = r.slot.names[0]
            if weight_alignment:
                w.align = int(weight_alignment)
            if r.encoding is not w.quantization_encoding:  # override_quantization_encoding took effect
                w.quantization_encoding = r.encoding
            if r.dtype is not w.dtype or r.shape != w.shape:  # a quantized weight declared by its values
                w.dtype, w.shape = r.dtype, r.shape
            for n in r.slot.names:
                self._weight_values[n] = buffers[canonical]
        return report

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._sublayers)} sub-modules, {len(self._layer_weights)} weights)"


class LayerList(Module):
    """A list of sub-modules named by index: `layers.0`, `layers.1`, ..."""

    layers: list[Module]  # set in __init__ through object.__setattr__

    def __init__(self, layers: Iterable[Module] = ()):
        super().__init__()
        object.__setattr__(self, "layers", [])
        for layer in layers:
            self.append(layer)

    def _renumber(self) -> None:
        self._sublayers.clear()
        for i, layer in enumerate(self.layers):
            self._sublayers[str(i)] = layer

    def append(self, layer: Module) -> None:
        """Add a layer at the end; it is named by its index (`layers.3`)."""
        if not isinstance(layer, Module):
            raise ArgumentTypeError(f"LayerList holds Modules, got {type(layer).__name__}")
        self.layers.append(layer)
        self._sublayers[str(len(self.layers) - 1)] = layer

    def extend(self, layers: Iterable[Module]) -> None:
        """Append each layer in order."""
        for layer in layers:
            self.append(layer)

    def insert(self, index: int, layer: Module) -> None:
        """Insert a layer at `index`; the layers after it are renumbered."""
        if not isinstance(layer, Module):
            raise ArgumentTypeError(f"LayerList holds Modules, got {type(layer).__name__}")
        self.layers.insert(index, layer)
        self._renumber()

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(self.layers[index])
        return self.layers[index]

    def __setitem__(self, index: int, layer: Module) -> None:
        if not isinstance(layer, Module):
            raise ArgumentTypeError(f"LayerList holds Modules, got {type(layer).__name__}")
        self.layers[index] = layer
        self._renumber()

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.layers)

    def __repr__(self) -> str:
        return f"LayerList({len(self.layers)} layers)"
