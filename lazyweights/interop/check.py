"""The bring-up report: compare an adapted state dict with what a module expects, reading no tensor bytes.

`check(state_dict, module)` looks only at metadata (names, dtypes, shapes, quantization encodings) and
returns a `CheckReport` listing every missing weight, unexpected weight, dtype / shape / encoding
mismatch, value that is not an array, and (when you pass the adapter's renames) two checkpoint tensors
renamed to the same name. `str(report)` is a table in which layer indices are folded
(`layers.{0..21}.mlp.up_proj.weight`, `{0,2,5..7}`), with did-you-mean hints for missing names.

`module` may be a `lazyweights.Module`, a `{name: Weight}` dict (what `raw_state_dict()` returns), or a
`torch.nn.Module` (its persistent parameters and buffers). `Module.load_state_dict` and
`lazyweights.interop.torch_load.load_into_torch` run exactly this validation before they read anything.
`lazyweights check ADAPTER PATH... --module MOD:CLASS` (`lazyweights/tools/cli.py`) prints `report.table()`.

What "two tensors renamed to the same name" means and what can be detected: an adapter builds a plain
dict, so when two checkpoint names map to one new name the second assignment silently replaces the
first and the dict cannot tell. It is detectable only from the renames themselves: pass them to
`check_unique_renames(pairs)` (raises) or `check(..., renames=pairs)` (reports). Passing the checkpoint
(`check(..., checkpoint=weights)`) also lists every checkpoint tensor that no output reads
(`report.unread_sources`): dropped on purpose, or lost to such a collision.

Example:
    >>> import numpy as np
    >>> from lazyweights import Weight, DType, WeightData
    >>> from lazyweights.interop.check import check
    >>> expected = {f"layers.{i}.w": Weight("w", DType.float32, (2,)) for i in range(4)}
    >>> sd = {f"layers.{i}.w": WeightData.from_numpy(np.zeros(2, np.float32), "w") for i in (0, 3)}
    >>> report = check(sd, expected)
    >>> report.ok, [m.name for m in report.missing]
    (False, ['layers.1.w', 'layers.2.w'])
    >>> print(report.table())  # doctest: +NORMALIZE_WHITESPACE
    check: 4 weights expected, 2 match; 2 problems (2 missing)
    problem  name          expected  actual  hint
    missing  layers.{1,2}.w  f32[2]    -
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..core.dtype import DType
from ..core.errors import ArgumentTypeError, DTypeError, LazyWeightsError, LoadError, ShapeError, UsageError
from ..core.names import fold_names, fold_numbers, fold_words, format_index_set, render, split_digits, suggest_all
from ..core.quantization import QuantizationEncoding
from ..core.torch_dtypes import import_torch, torch_dtype_table
from ..graph.opcodes import Op
from ..lazy.weight_data import WeightData

__all__ = [
    "CheckReport", "Missing", "Unexpected", "Mismatch", "InvalidValue", "RenameCollision", "TensorSpec",
    "check", "check_unique_renames", "find_rename_collisions", "fold_rows",
    "fold_names", "format_index_set",  # lazyweights.core.names', re-exported for the report's callers
]


# --- records ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """dtype, shape and quantization encoding of a weight or a value (no bytes)."""

    dtype: Any  # DType, or a string for a dtype lazyweights has no DType for (e.g. "torch.complex64")
    shape: tuple[int, ...]
    encoding: QuantizationEncoding | None = None

    def __str__(self) -> str:
        dt = self.dtype.short if isinstance(self.dtype, DType) else str(self.dtype)
        enc = f" {self.encoding.name}" if self.encoding is not None else ""
        return f"{dt}{_shape_str(self.shape)}{enc}"

    def to_dict(self) -> dict:
        """JSON-ready form: dtype and encoding by name, shape as a list."""
        return {
            "dtype": self.dtype.name if isinstance(self.dtype, DType) else str(self.dtype),
            "shape": list(self.shape),
            "encoding": self.encoding.name if self.encoding is not None else None,
        }


@dataclass(frozen=True)
class Missing:
    """A weight the module declares that the state dict lacks. `suggestions`: close unexpected names."""

    name: str
    expected: TensorSpec
    suggestions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unexpected:
    """A state-dict key no module weight has. `actual` is None when the value is not an array."""

    name: str
    actual: TensorSpec | None
    type_name: str = ""


@dataclass(frozen=True)
class Mismatch:
    """One property that differs: `expected` / `actual` are DTypes, shape tuples or encodings (or None)."""

    name: str
    expected: Any
    actual: Any


@dataclass(frozen=True)
class InvalidValue:
    """A state-dict value for a module weight that is not an array (a string, a list, a missing accessor)."""

    name: str
    type_name: str
    reason: str


@dataclass(frozen=True)
class RenameCollision:
    """Several checkpoint tensors renamed to one name: all but the last were silently overwritten."""

    target: str
    sources: tuple[str, ...]


@dataclass
class CheckReport:
    """What `check()` found. `ok` is True when there is nothing to fix."""

    missing: list[Missing] = field(default_factory=list)
    unexpected: list[Unexpected] = field(default_factory=list)
    shape_mismatches: list[Mismatch] = field(default_factory=list)
    dtype_mismatches: list[Mismatch] = field(default_factory=list)
    encoding_mismatches: list[Mismatch] = field(default_factory=list)
    invalid_values: list[InvalidValue] = field(default_factory=list)
    rename_collisions: list[RenameCollision] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)  # module weight names whose value fits
    expected_count: int = 0  # module weight names (tied aliases included)
    unread_sources: list[str] = field(default_factory=list)  # informational; needs check(checkpoint=...)

    @property
    def ok(self) -> bool:
        """True when there is no problem at all, strict: unexpected weights count."""
        return self.problem_count(strict=True) == 0

    def problem_count(self, strict: bool = True) -> int:
        """Problems that fail a load. With strict=False, missing and unexpected weights are tolerated."""
        n = (len(self.shape_mismatches) + len(self.dtype_mismatches) + len(self.encoding_mismatches)
             + len(self.invalid_values) + len(self.rename_collisions))
        if strict:
            n += len(self.missing) + len(self.unexpected)
        return n

    def to_dict(self) -> dict:
        """A JSON-serialisable summary (dtypes and encodings by name, shapes as lists)."""
        return {
            "ok": self.ok,
            "expected": self.expected_count,
            "matched": list(self.matched),
            "missing": [{"name": m.name, "expected": m.expected.to_dict(), "suggestions": list(m.suggestions)}
                        for m in self.missing],
            "unexpected": [{"name": u.name, "actual": u.actual.to_dict() if u.actual else None,
                            "type": u.type_name} for u in self.unexpected],
            "shape_mismatches": [{"name": m.name, "expected": list(m.expected), "actual": list(m.actual)}
                                 for m in self.shape_mismatches],
            "dtype_mismatches": [{"name": m.name, "expected": _json_value(m.expected), "actual": _json_value(m.actual)}
                                 for m in self.dtype_mismatches],
            "encoding_mismatches": [{"name": m.name, "expected": _json_value(m.expected),
                                     "actual": _json_value(m.actual)} for m in self.encoding_mismatches],
            "invalid_values": [{"name": v.name, "type": v.type_name, "reason": v.reason} for v in self.invalid_values],
            "rename_collisions": [{"target": c.target, "sources": list(c.sources)} for c in self.rename_collisions],
            "unread_sources": list(self.unread_sources),
        }

    def summary(self) -> str:
        """The one-line summary: expected, matching, and the problems by kind (`check: 4 weights expected, ...`)."""
        parts = []
        for n, word in ((len(self.missing), "missing"), (len(self.unexpected), "unexpected"),
                        (len(self.dtype_mismatches), "dtype"), (len(self.shape_mismatches), "shape"),
                        (len(self.encoding_mismatches), "encoding"), (len(self.invalid_values), "not an array"),
                        (len(self.rename_collisions), "rename collision")):
            if n:
                parts.append(f"{n} {word}")
        total = self.problem_count(strict=True)
        head = f"check: {self.expected_count} weights expected, {len(self.matched)} match"
        if not total:
            return head + "; OK"
        return head + f"; {total} problem{'s' if total != 1 else ''} ({', '.join(parts)})"

    def rows(self, style: str = "table") -> list[tuple[str, str, str, str, str]]:
        """(problem, name, expected, actual, hint) per problem, unfolded. `style`: "table" (bf16, [2,3])
        or "message" (MAX's DType.bfloat16, (2, 3))."""
        long = style == "message"
        dt = (lambda v: _value_str(v) if not isinstance(v, DType) else str(v)) if long else _value_str
        shp = (lambda v: str(tuple(int(d) for d in v))) if long else _shape_str
        out = []
        for c in self.rename_collisions:
            out.append(("collision", c.target, "-", f"{len(c.sources)} sources", "from " + ", ".join(c.sources)))
        for m in self.missing:
            hint = f"did you mean {m.suggestions[0]!r}?" if m.suggestions else ""
            out.append(("missing", m.name, str(m.expected), "-", hint))
        for u in self.unexpected:
            out.append(("unexpected", u.name, "-", str(u.actual) if u.actual is not None else u.type_name, ""))
        for d in self.dtype_mismatches:
            hint = ""
            if isinstance(d.expected, DType) and isinstance(d.actual, DType):
                hint = f"cast it in the adapter: .astype({d.expected})" if long else f".astype({d.expected})"
            out.append(("dtype", d.name, dt(d.expected), dt(d.actual), hint))
        for s in self.shape_mismatches:
            out.append(("shape", s.name, shp(s.expected), shp(s.actual), _shape_hint(s.expected, s.actual, long)))
        for e in self.encoding_mismatches:
            if e.expected is None:
                hint = "call .dequantize() in the adapter" if long else ".dequantize()"
            elif e.actual is not None:
                hint = "or pass override_quantization_encoding=True" if long else "override_quantization_encoding=True"
            else:
                hint = "the value is not quantized"
            out.append(("encoding", e.name, _value_str(e.expected), _value_str(e.actual), hint))
        for v in self.invalid_values:
            out.append(("not array", v.name, "array", v.type_name, v.reason))
        return out

    def table(self, fold: bool = True) -> str:
        """The report as text: a summary line, then one row per problem (layer indices folded)."""
        lines = [self.summary()]
        rows = self.rows()
        if fold:
            rows = fold_rows(rows)
        if rows:
            header = ("problem", "name", "expected", "actual", "hint")
            widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
            for r in [header] + rows:
                cells = [r[i].ljust(widths[i]) for i in range(4)] + [r[4]]
                lines.append("  ".join(cells).rstrip())
        if self.unread_sources:
            lines.append(f"not read by any output ({len(self.unread_sources)}; dropped or overwritten): "
                         + ", ".join(fold_names(self.unread_sources)))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _json_value(v):
    if isinstance(v, (DType, QuantizationEncoding)):
        return v.name
    if isinstance(v, tuple):
        return list(v)
    return v if v is None else str(v)


def _value_str(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, DType):
        return v.short
    if isinstance(v, QuantizationEncoding):
        return v.name
    if isinstance(v, tuple):
        return _shape_str(v)
    return str(v)


def _shape_str(shape) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def _shape_hint(expected, actual, long: bool = False) -> str:
    if len(expected) == 2 and tuple(actual) == tuple(expected)[::-1]:
        return "transposed? use .T in the adapter" if long else "transposed? .T"
    if int(np.prod(expected, dtype=object)) == int(np.prod(actual, dtype=object)):
        return (f"same size: .reshape{tuple(expected)} in the adapter?" if long
                else f"same size: .reshape{tuple(expected)}?")
    return ""


# --- folding layer indices ----------------------------------------------------------------------------------


def fold_rows(rows: Sequence[tuple[str, str, str, str, str]]) -> list[tuple[str, str, str, str, str]]:
    """Merge report rows that differ only in the numbers of their names, then in one word of them.

    Folding is `lazyweights.core.names`' (exact brace patterns); rows fold only when kind, expected, actual
    and hint agree, except that a hint quoting a name with the same numbers folds along with it.

    Example:
        >>> fold_rows([("missing", f"l.{i}.w", "f32[2]", "-", f"did you mean 'l.{i}.W'?") for i in range(3)])
        [('missing', 'l.{0..2}.w', 'f32[2]', '-', "did you mean 'l.{0..2}.W'?")]
    """
    keyed = []
    for kind, name, expected, actual, hint in rows:
        nums = split_digits(name)[1]
        hint_key: Any = hint
        m = re.match(r"^(.*?)'([^']*)'(.*)$", hint)
        if m and nums:
            h_template, h_nums = split_digits(m.group(2))
            if h_nums == nums:
                hint_key = (m.group(1), h_template, m.group(3))
        keyed.append(((kind, expected, actual, hint_key), name))
    out = []
    for (kind, expected, actual, hint_key), name, box in fold_numbers(keyed):
        if isinstance(hint_key, tuple):
            pre, h_template, post = hint_key
            hint = f"{pre}'{render(h_template, box)}'{post}"
        else:
            hint = hint_key
        out.append(((kind, expected, actual, hint), name))
    return [(kind, name, expected, actual, hint) for (kind, expected, actual, hint), name in fold_words(out)]


# --- what the module expects ----------------------------------------------------------------------------------
@dataclass
class Slot:
    """One tensor a module holds: its names (canonical first; tied aliases after), and what it must be.

    `target` is the object loaded into (a `Weight`, a torch tensor); `dtype` is a DType (or a string when
    lazyweights has no DType for it, which nothing can match)."""

    names: tuple[str, ...]
    dtype: Any
    shape: tuple[int, ...]
    encoding: QuantizationEncoding | None = None
    target: Any = None

    @property
    def spec(self) -> TensorSpec:
        """What the slot must hold, as a `TensorSpec` (dtype, shape, encoding)."""
        return TensorSpec(self.dtype, self.shape, self.encoding)


def slots_of(module) -> list[Slot]:
    """The slots of a lazyweights Module, a {name: Weight} mapping, or a torch.nn.Module."""
    if hasattr(module, "_lw_slots"):
        return module._lw_slots()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(module, torch.nn.Module):
        return torch_slots(module)
    if isinstance(module, Mapping):
        return slots_from_weights(module.items())
    raise ArgumentTypeError(
        f"check() needs a lazyweights Module, a {{name: Weight}} dict or a torch.nn.Module, got {type(module).__name__}"
    )


def slots_from_weights(items: Iterable[tuple[str, Any]]) -> list[Slot]:
    """Group (name, Weight) pairs by identity: the same Weight object under two names is one tied slot."""
    by_id: dict[int, Slot] = {}
    slots: list[Slot] = []
    for name, w in items:
        if not hasattr(w, "dtype") or not hasattr(w, "shape"):
            raise ArgumentTypeError(f"expected weight {name!r} is a {type(w).__name__}, not a Weight")
        slot = by_id.get(id(w))
        if slot is not None:
            slot.names = slot.names + (name,)
            continue
        slot = Slot((name,), DType.parse(w.dtype), tuple(int(d) for d in w.shape),
                    QuantizationEncoding.parse(getattr(w, "quantization_encoding", None)), w)
        by_id[id(w)] = slot
        slots.append(slot)
    return slots


# --- values -----------------------------------------------------------------------------------------------------
def as_value(value, name: str) -> WeightData | InvalidValue:
    """A state-dict value as a WeightData (reading nothing), or why it is not an array."""
    if isinstance(value, WeightData):
        return value
    tname = type(value).__name__
    if isinstance(value, (str, bytes, list, tuple, dict, int, float, bool)) or value is None:
        return InvalidValue(name, tname, _USE_ARRAY)
    if hasattr(value, "data") and callable(value.data) and hasattr(value, "exists"):
        try:
            return value.data()  # a Weights accessor: MAX's adapters sometimes forget .data()
        except KeyError as e:
            return InvalidValue(name, tname, f"a Weights accessor for a name the checkpoint lacks: {e}")
    if isinstance(value, np.ndarray) or hasattr(value, "__dlpack__"):
        try:
            return WeightData(value, name)
        except (LazyWeightsError, TypeError, ValueError, BufferError, RuntimeError) as e:
            return InvalidValue(name, tname, f"cannot use it as an array: {e}")
    return InvalidValue(name, tname, _USE_ARRAY)


_USE_ARRAY = "use WeightData, a numpy array or a tensor"


def expected_layout(slot: Slot, encoding: QuantizationEncoding | None) -> tuple[Any, tuple[int, ...]]:
    """(dtype, shape) a value must have to fill `slot` when it carries `encoding`.

    Quantized values are packed uint8 rows (MAX's convention). A slot may declare them packed (uint8,
    last axis in bytes) or logically (its float dtype and element shape); either way the value must be the
    packed form. GPTQ (several tensors, not one block row) is compared as declared."""
    q = QuantizationEncoding
    if encoding is None or encoding is q.GPTQ:
        return slot.dtype, slot.shape
    declared_packed = slot.encoding is not None and slot.encoding is not q.GPTQ and slot.dtype is DType.uint8
    if encoding is slot.encoding and declared_packed:
        return DType.uint8, slot.shape
    if not slot.shape:
        return DType.uint8, slot.shape
    last = slot.shape[-1]
    if declared_packed and slot.encoding is not None:
        last = slot.encoding.elements_per_row_bytes(last)
    return DType.uint8, slot.shape[:-1] + (encoding.row_bytes_for_elements(last),)


@dataclass
class Resolved:
    """A slot matched with its value: what it will be loaded from and the layout it ends up with."""

    slot: Slot
    key: str  # the state-dict key the value came from
    value: WeightData
    dtype: Any
    shape: tuple[int, ...]
    encoding: QuantizationEncoding | None


def validate(slots: Sequence[Slot], state_dict: Mapping[str, Any], *,
             override_quantization_encoding: bool = False,
             cast_to: Any = None) -> tuple[CheckReport, list[Resolved]]:
    """Match every slot with a state-dict value and compare metadata. Reads no tensor bytes.

    `cast_to`: None, or a callable (slot, WeightData) -> WeightData applied before comparing dtypes
    (torch interop's `cast=True`)."""
    if not isinstance(state_dict, Mapping):
        raise LoadError(f"the state dict must be a dict of name -> WeightData, got {type(state_dict).__name__}")
    report = CheckReport()
    resolved: list[Resolved] = []
    used: set[str] = set()
    values: dict[str, WeightData | InvalidValue] = {}

    def value_of(key):
        if key not in values:
            values[key] = as_value(state_dict[key], key)
        return values[key]

    pending_missing: list[Slot] = []
    for slot in slots:
        report.expected_count += len(slot.names)
        present = [n for n in slot.names if n in state_dict]
        if not present:
            pending_missing.append(slot)
            continue
        used.update(present)
        chosen = None
        slot_ok = True
        for key in present:
            v = value_of(key)
            if isinstance(v, InvalidValue):
                report.invalid_values.append(v)
                slot_ok = False
                continue
            r = _compare(slot, key, v, report, override_quantization_encoding, cast_to)
            if r is None:
                slot_ok = False
            elif chosen is None:
                chosen = r
        if slot_ok and chosen is not None:
            resolved.append(chosen)
            report.matched.extend(slot.names)

    unexpected_keys = [k for k in state_dict if k not in used]
    for key in unexpected_keys:
        if not isinstance(key, str):
            report.invalid_values.append(InvalidValue(repr(key), type(key).__name__, "state dict keys must be strings"))
            continue
        v = value_of(key)
        if isinstance(v, InvalidValue):
            report.unexpected.append(Unexpected(key, None, v.type_name))
        else:
            report.unexpected.append(Unexpected(key, TensorSpec(v.dtype, v.shape, v.quantization_encoding)))
    candidates = [k for k in unexpected_keys if isinstance(k, str)]
    hints = suggest_all([n for slot in pending_missing for n in slot.names], candidates)
    for slot in pending_missing:
        for name in slot.names:
            report.missing.append(Missing(name, slot.spec, hints.get(name, ())))
    return report, resolved


def _compare(slot: Slot, key: str, v: WeightData, report: CheckReport, override: bool, cast_to) -> Resolved | None:
    q = QuantizationEncoding
    enc_w, enc_d = slot.encoding, v.quantization_encoding
    encoding = enc_w
    if enc_w is q.GPTQ and enc_d in (None, q.GPTQ):
        # As MAX does: GPTQ weights load as their raw bytes (GPTQ safetensors carry no label).
        if slot.dtype is DType.uint8 and v.dtype is not DType.uint8 and v.shape:
            v = v.view(DType.uint8)
    elif enc_d is not enc_w:
        if override and enc_d is not None:
            encoding = enc_d
        else:
            report.encoding_mismatches.append(Mismatch(key, enc_w, enc_d))
            return None
    try:
        dtype, shape = expected_layout(slot, encoding)
    except ShapeError:
        report.shape_mismatches.append(Mismatch(key, slot.shape, v.shape))
        return None
    if cast_to is not None and encoding is None and isinstance(dtype, DType) and v.dtype is not dtype:
        try:
            v = cast_to(slot, v, dtype)
        except (DTypeError, ShapeError):
            pass  # reported as a dtype mismatch below
    ok = True
    if v.dtype is not dtype:
        report.dtype_mismatches.append(Mismatch(key, dtype, v.dtype))
        ok = False
    if v.shape != tuple(shape):
        report.shape_mismatches.append(Mismatch(key, tuple(shape), v.shape))
        ok = False
    return Resolved(slot, key, v, dtype, tuple(shape), encoding) if ok else None


# --- renames ------------------------------------------------------------------------------------------------------
def _pairs(renames) -> list[tuple[str, str]]:
    if isinstance(renames, Mapping):
        return [(str(a), str(b)) for a, b in renames.items()]
    pairs = []
    for item in renames:
        try:
            a, b = item
        except (TypeError, ValueError):
            raise UsageError(f"renames must be (checkpoint_name, new_name) pairs, got {item!r}") from None
        pairs.append((str(a), str(b)))
    return pairs


def find_rename_collisions(renames) -> list[RenameCollision]:
    """Targets that more than one source name maps to. `renames`: {old: new} or (old, new) pairs."""
    sources: dict[str, list[str]] = {}
    for old, new in _pairs(renames):
        lst = sources.setdefault(new, [])
        if old not in lst:
            lst.append(old)
    return [RenameCollision(t, tuple(s)) for t, s in sources.items() if len(s) > 1]


def check_unique_renames(renames) -> dict[str, str]:
    """Raise LoadError naming every new name that two or more checkpoint names were renamed to.

    `renames`: a {checkpoint_name: new_name} dict or an iterable of (checkpoint_name, new_name) pairs,
    e.g. `((k, rename(k)) for k in weights.keys())`. Returns {new_name: checkpoint_name}.

        >>> check_unique_renames({"model.a.w": "a.w", "a.w": "a.w"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lazyweights.core.errors.LoadError: 1 new name has more than one source (a dict keeps only the last): ...
    """
    pairs = _pairs(renames)
    collisions = find_rename_collisions(pairs)
    if collisions:
        detail = "; ".join(f"{c.target!r} <- " + ", ".join(repr(s) for s in c.sources) for c in collisions)
        n = len(collisions)
        raise LoadError(f"{n} new name{' has' if n == 1 else 's have'} more than one source "
                        f"(a dict keeps only the last): {detail}")
    return {new: old for old, new in pairs}


def unread_sources(state_dict: Mapping[str, Any], checkpoint) -> list[str]:
    """Names of the checkpoint's tensors that no value of `state_dict` reads (by walking the graph)."""
    from ..graph.node import toposort

    roots = [v.node for v in state_dict.values() if isinstance(v, WeightData)]
    read = set()
    for node in toposort(roots):
        if node.op is Op.SOURCE:
            read.add(node.arg.name)
    names = [n for n, _ in checkpoint.items()] if hasattr(checkpoint, "items") else list(checkpoint)
    prefix = checkpoint.name + "." if getattr(checkpoint, "name", "") else ""
    return [n for n in names if prefix + n not in read]


# --- the entry point ---------------------------------------------------------------------------------------------
def check(state_dict: Mapping[str, Any], module, *, override_quantization_encoding: bool = False,
          renames=None, checkpoint=None) -> CheckReport:
    """Compare an adapted state dict with `module` (metadata only; nothing is read).

    `renames`: the adapter's (checkpoint_name, new_name) pairs, to report collisions. `checkpoint`: the
    `Weights` the adapter read, to list tensors no output reads."""
    report, _ = validate(slots_of(module), state_dict, override_quantization_encoding=override_quantization_encoding)
    if renames is not None:
        report.rename_collisions = find_rename_collisions(renames)
    if checkpoint is not None:
        report.unread_sources = unread_sources(state_dict, checkpoint)
    return report


def load_error_message(report: CheckReport, strict: bool, what: str) -> str:
    """The LoadError text: every offender (layer indices folded), in MAX's wording."""
    lines = []
    rows = [r for r in report.rows("message") if strict or r[0] not in ("missing", "unexpected")]
    for kind, name, expected, actual, hint in fold_rows(rows):
        if kind == "missing":
            lines.append(f"Could not find weight '{name}' ({expected})." + (f" D{hint[1:]}" if hint else ""))
        elif kind == "unexpected":
            lines.append(f"Unexpected weight '{name}' ({actual}): the module declares no weight of that name.")
        elif kind in ("dtype", "shape", "encoding"):
            word = {"dtype": "dtype", "shape": "shape", "encoding": "quantization encoding"}[kind]
            lines.append(f"Value provided to weight '{name}' had different {word} (expected={expected}, "
                         f"actual={actual})"
                         + (f"; {hint}." if hint else "."))
        elif kind == "not array":
            lines.append(f"The value of '{name}' is a {actual}, not an array: {hint}.")
        else:
            lines.append(f"{name!r} is the new name of several checkpoint tensors ({hint}); all but the last were "
                         "lost.")
    n = len(rows)
    head = f"load_state_dict: {n} problem{'s' if n != 1 else ''} loading {what}; nothing was read or loaded:"
    tail = []
    if strict and (report.missing or report.unexpected):
        tail.append("Pass strict=False to tolerate missing and unexpected weights.")
    return "\n".join([head] + ["  " + line for line in lines] + tail)


# --- PyTorch modules ----------------------------------------------------------------------------------------------
def _storage_key(t) -> tuple:
    """Two state-dict entries are one tensor (tied) when they are the same object or the same memory view."""
    try:
        if t.device.type == "meta" or t.numel() == 0:  # no memory to compare: only the same object is tied
            return ("id", id(t))
        ptr = t.untyped_storage().data_ptr()
        return ("mem", t.device.type, t.device.index, ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()),
                t.dtype)
    except (RuntimeError, NotImplementedError, AttributeError):
        return ("id", id(t))


def torch_slots(torch_module) -> list[Slot]:
    """One slot per distinct tensor of `torch_module.state_dict(keep_vars=True)` (tied names grouped)."""
    torch = import_torch()
    table = torch_dtype_table(torch)
    slots: dict[tuple, Slot] = {}
    for name, t in torch_module.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            continue  # extra state (get_extra_state): not a tensor to load
        key = _storage_key(t)
        slot = slots.get(key)
        if slot is not None:
            slot.names = slot.names + (name,)
            continue
        slots[key] = Slot((name,), table.get(t.dtype, str(t.dtype)), tuple(int(d) for d in t.shape), None, t)
    return list(slots.values())
