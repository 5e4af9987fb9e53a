"""Load a lazy state dict into a `torch.nn.Module` in place (`pip install lazyweights[torch]`).

`load_into_torch(torch_module, state_dict, strict=True)` follows `torch.nn.Module.load_state_dict`:

- the expected names are `torch_module.state_dict(keep_vars=True)`: parameters and persistent buffers
  (non-persistent buffers are not expected; a key for one is unexpected, as in torch);
- everything is validated before any tensor byte is read: missing and unexpected keys (reported, or with
  `strict=False` returned), shape mismatches (always an error, as in torch), dtype mismatches (an error:
  lazyweights never converts behind your back; cast in the adapter, or pass `cast=True` to fuse a cast
  into the plan), quantized values (dequantize in the adapter), values that are not arrays. The error is a
  `TorchLoadError` (a `LoadError`, so a `ValueError`, and a `RuntimeError` like torch's) worded as torch
  words it: `Error(s) in loading state_dict for BertModel:\\n\\tMissing key(s) in state_dict: "a". ...`;
- tied weights (two names, one storage) are loaded once; having either name in the state dict is enough;
- the whole state dict is materialized in one plan straight into numpy views of the parameters' own
  storage (`Plan.materialize(out=...)`): no extra full copy. bf16 stays bf16 (an int16 view of the
  parameter reinterpreted as ml_dtypes' bfloat16); fp8 likewise through uint8. Parameters that are not
  contiguous CPU tensors (e.g. on a GPU) are filled from a host array with one `copy_`;
- module-specific `_load_from_state_dict` overrides and load-state-dict hooks are not run.

Returns `IncompatibleKeys(missing_keys, unexpected_keys)`, as torch does.

Example:
    >>> import numpy as np, torch
    >>> from lazyweights import WeightData
    >>> from lazyweights.interop.torch_load import load_into_torch
    >>> lin = torch.nn.Linear(2, 2, bias=False)
    >>> load_into_torch(lin, {"weight": WeightData.from_numpy(np.eye(2, dtype=np.float32), "w")})
    IncompatibleKeys(missing_keys=[], unexpected_keys=[])
    >>> lin.weight.detach().numpy().tolist()
    [[1.0, 0.0], [0.0, 1.0]]
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, NamedTuple

import numpy as np

from ..core.dtype import DType
from ..core.errors import ArgumentTypeError, TorchLoadError
from ..core.torch_dtypes import dtype_to_torch, import_torch, torch_dtype_table, torch_dtype_to_dtype
from .check import fold_rows, torch_slots, validate

_log = logging.getLogger(__name__)

__all__ = ["load_into_torch", "TorchLoadError", "IncompatibleKeys", "torch_dtype_to_dtype", "dtype_to_torch",
           "torch_slots"]




class IncompatibleKeys(NamedTuple):
    """What `load_into_torch` returns, as torch's `load_state_dict` does: the keys missing and unexpected."""

    missing_keys: list
    unexpected_keys: list


def numpy_view(t) -> np.ndarray | None:
    """A numpy array sharing `t`'s memory (bf16/fp8 through an integer view), or None if impossible."""
    torch = import_torch()
    if t.device.type != "cpu" or not t.is_contiguous() or t.is_conj() or t.is_neg():
        return None
    t = t.detach()
    d = torch_dtype_table(torch).get(t.dtype)
    if d is None:
        return None
    try:
        if d is DType.bfloat16 or d.is_float8:  # ml_dtypes types: numpy cannot take them from torch
            ints = {1: torch.uint8, 2: torch.int16}[d.size_in_bytes]
            return t.view(ints).numpy().view(d.to_numpy())
        return t.numpy()
    except (RuntimeError, TypeError, KeyError) as e:  # None: the caller copies instead
        _log.debug("no numpy view of a %s %s tensor (%s: %s)", t.dtype, tuple(t.shape), type(e).__name__, e)
        return None


def array_to_torch(arr: np.ndarray, torch_dtype):
    """A torch CPU tensor over `arr` (bf16/fp8 through an integer view), of `torch_dtype`."""
    torch = import_torch()
    d = DType.from_numpy(arr.dtype)
    if d is DType.bfloat16 or d.is_float8:
        ints = {1: np.uint8, 2: np.int16}[d.size_in_bytes]
        return torch.from_numpy(np.ascontiguousarray(arr).view(ints)).view(torch_dtype)
    return torch.from_numpy(np.ascontiguousarray(arr))


def _size(shape) -> str:
    return f"torch.Size([{', '.join(str(int(d)) for d in shape)}])"


def _torch_order(torch_module, report) -> tuple[list[str], list[str]]:
    """Missing and unexpected names in the order torch reports them: by the module that owns the key
    (pre-order, as torch's recursive load visits modules), then in state-dict order."""
    modules: dict[str, int] = {}
    for i, (path, _) in enumerate(torch_module.named_modules(remove_duplicate=False)):
        modules.setdefault(path, i)

    def owner(key: str) -> int:
        parts, path = key.split("."), ""
        for j in range(len(parts) - 1):
            cand = ".".join(parts[:j + 1])
            if cand not in modules:
                break
            path = cand
        return modules.get(path, 0)

    expected = {name: i for i, name in enumerate(torch_module.state_dict(keep_vars=True))}
    missing = sorted((m.name for m in report.missing), key=lambda n: (owner(n), expected.get(n, 0)))
    unexpected = [u.name for u in report.unexpected]
    position = {n: i for i, n in enumerate(unexpected)}
    unexpected.sort(key=lambda n: (owner(n), position[n]))
    return missing, unexpected


def _error_message(report, strict: bool, what: str, cast: bool, missing: list, unexpected: list) -> str:
    """torch's wording, plus lazyweights' extra checks and hints."""
    torch = import_torch()
    msgs = []
    if strict and missing:
        msgs.append("Missing key(s) in state_dict: " + ", ".join(f'"{n}"' for n in missing) + ". ")
    if strict and unexpected:
        msgs.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{n}"' for n in unexpected) + ". ")
    for m in report.shape_mismatches:
        msgs.append(f"size mismatch for {m.name}: copying a param with shape {_size(m.actual)} from checkpoint, "
                    f"the shape in current model is {_size(m.expected)}.")
    table = {v: k for k, v in torch_dtype_table(torch).items()}
    for m in report.dtype_mismatches:
        exp = table.get(m.expected, m.expected)
        act = table.get(m.actual, m.actual)
        fix = f"cast it in the adapter (.astype(DType.{m.expected.name}))" if isinstance(m.expected, DType) else \
            "lazyweights cannot load this dtype"
        msgs.append(f"dtype mismatch for {m.name}: copying a param with dtype {act} from checkpoint, the dtype in "
                    f"current model is {exp}; {fix}" + ("" if cast or not isinstance(m.expected, DType)
                                                        else " or pass cast=True") + ".")
    for m in report.encoding_mismatches:
        msgs.append(f"quantized value for {m.name}: the checkpoint holds {m.actual.name} blocks; "
                    "call .dequantize() in the adapter.")
    for v in report.invalid_values:
        msgs.append(f"value for {v.name} is a {v.type_name}, not a tensor: {v.reason}.")
    if strict:
        hints = [(m.name, m.suggestions[0]) for m in report.missing if m.suggestions]
        for _, name, _, _, hint in fold_rows([("", n, "", "", f"'{s}'") for n, s in hints]):
            msgs.append(f'Did you mean {hint.replace(chr(39), chr(34))} for missing "{name}"?')
    return f"Error(s) in loading state_dict for {what}:\n\t" + "\n\t".join(msgs)


def load_into_torch(torch_module, state_dict: Mapping[str, Any], strict: bool = True, *, cast: bool = False,
                    budget=None, scheduler=None, progress: bool = False) -> IncompatibleKeys:
    """Load a lazy state dict (`{name: WeightData | array | tensor}`) into `torch_module` in place.

    See the module docstring. `cast=True` converts values to each parameter's dtype inside the plan
    (fused, no extra copy) instead of reporting a dtype mismatch. Returns (missing_keys, unexpected_keys)."""
    torch = import_torch()
    if not isinstance(torch_module, torch.nn.Module):
        raise ArgumentTypeError(f"load_into_torch needs a torch.nn.Module, got {type(torch_module).__name__}")
    slots = torch_slots(torch_module)
    for slot in slots:
        if slot.target.device.type == "meta":
            raise TorchLoadError(
                f"Error(s) in loading state_dict for {type(torch_module).__name__}:\n\t{slot.names[0]} is on the "
                "meta device; allocate the module first (e.g. module.to_empty(device='cpu'))")
    caster = (lambda slot, v, dtype: v.astype(dtype)) if cast else None
    report, resolved = validate(slots, state_dict, cast_to=caster)
    missing, unexpected = _torch_order(torch_module, report)
    if report.problem_count(strict=strict):
        raise TorchLoadError(_error_message(report, strict, type(torch_module).__name__, cast, missing, unexpected),
                             report)

    views: dict[str, np.ndarray] = {}
    staged: dict[str, tuple[Any, np.ndarray]] = {}
    sources = {}
    for r in resolved:
        t = r.slot.target
        canonical = r.slot.names[0]
        view = numpy_view(t)
        if view is None:  # not a contiguous CPU tensor: fill a host array, then one copy_ into place
            from .module import aligned_empty

            view = aligned_empty(r.shape, r.dtype)
            staged[canonical] = (t, view)
        views[canonical] = view
        sources[canonical] = r.value
    if sources:
        from ..lazy.plan import Plan

        with torch.no_grad():
            Plan(sources).materialize(out=views, budget=budget, scheduler=scheduler, progress=progress)
            for t, arr in staged.values():
                t.copy_(array_to_torch(arr, t.dtype).reshape(t.shape))
    return IncompatibleKeys(missing, unexpected)
