"""Opt-in, restricted loading of PyTorch pickle checkpoints (`.bin`, `.pt`, `.pth`, `.ckpt`).

lazyweights never unpickles by default: `load_weights("pytorch_model.bin")` is a `FormatError` before a byte
is read, because unpickling runs whatever code the file names. `load_weights(paths,
allow_pickle="weights_only")` opts in to *torch's restricted unpickler* only:

    torch.load(path, weights_only=True, mmap=True, map_location="cpu")

which accepts tensors, primitive containers and numbers and refuses any other global (a `__reduce__` that
calls `os.system` is an `UnpicklingError` before anything runs). There is no way to ask for full
unpickling (`allow_pickle=True` is an error). PyTorch is needed only for this path; without it the error
says so.

The file is memory-mapped by torch (`mmap=True`, zip-format checkpoints, torch >= 1.6), and every tensor
becomes a zero-copy, read-only numpy view of that map held by a `const` node: bf16 through an int16 view
(-> ml_dtypes bfloat16), fp8 through a uint8 view (-> ml_dtypes float8). Tensors that are views of one
storage with the same layout (tied weights) share one node, so a plan computes them once. Nested dicts
are flattened with dots (`{"model": {"w": t}}` -> `model.w`); numbers and strings become metadata.

Accepted paths: the files, a directory holding them (or a `pytorch_model.bin.index.json`), or that index
(whose shard names must stay inside its directory, as for safetensors).

Example:
    >>> import os, tempfile, torch, lazyweights as lw
    >>> path = os.path.join(tempfile.mkdtemp(), "pytorch_model.bin")
    >>> torch.save({"w": torch.arange(4, dtype=torch.bfloat16)}, path)
    >>> lw.load_weights(path, allow_pickle="weights_only")["w"].data().astype(lw.DType.float32).to_numpy().tolist()
    [0.0, 1.0, 2.0, 3.0]
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

import numpy as np

from ..core.dtype import DType
from ..core.errors import DependencyError, DTypeError, FormatError, UsageError
from .source import PickleFile, TorchTensorRecord

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
INDEX_SUFFIX = ".bin.index.json"
WEIGHTS_ONLY = "weights_only"


def pickle_allowed(allow_pickle) -> bool:
    """True for the opt-in `"weights_only"`, False for None/False; anything else is an error."""
    if allow_pickle is None or allow_pickle is False:
        return False
    if isinstance(allow_pickle, str) and allow_pickle == WEIGHTS_ONLY:
        return True
    raise UsageError(
        f"allow_pickle={allow_pickle!r}: the only opt-in is allow_pickle='weights_only' (torch's restricted "
        "unpickler); full unpickling runs arbitrary code and lazyweights never does it"
    )


def _is_pickle_file(p: Path) -> bool:
    return p.name.lower().endswith(PICKLE_SUFFIXES) or p.name.lower().endswith(INDEX_SUFFIX)


def is_pickle_checkpoint(paths: Iterable[Path]) -> bool:
    """Whether `paths` name a pickle checkpoint: pickle files, a pytorch index, or a directory with pickles
    and no safetensors/GGUF files (those win, as they are safe)."""
    for p in paths:
        if p.is_dir():
            if any(p.glob("*.safetensors")) or any(p.glob("*.safetensors.index.json")) or any(p.glob("*.gguf")):
                return False
            if any(_is_pickle_file(c) for c in p.iterdir()):
                return True
        elif _is_pickle_file(p):
            return True
    return False


def _expand(paths: list[Path]) -> list[Path]:
    from .checkpoint import read_index

    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            index = sorted(p.glob("*" + INDEX_SUFFIX))
            if index:
                p = index[0]
            else:
                found = sorted(c for c in p.iterdir() if c.is_file() and c.name.lower().endswith(PICKLE_SUFFIXES))
                if not found:
                    raise FormatError(f"{p}: directory holds no .bin/.pt/.pth/.ckpt files")
                out.extend(found)
                continue
        if p.name.lower().endswith(INDEX_SUFFIX):
            shards, _, _ = read_index(p)  # shard names confined to the index's directory (Paths: p is local)
            out.extend(Path(s) for s in shards)
        else:
            out.append(p)
    return list(dict.fromkeys(Path(os.path.abspath(p)) for p in out))


def _torch_dtypes(torch) -> dict:
    table = {
        torch.float32: (DType.float32, None), torch.float16: (DType.float16, None),
        torch.float64: (DType.float64, None),
        torch.bfloat16: (DType.bfloat16, torch.int16), torch.bool: (DType.bool, None),
        torch.uint8: (DType.uint8, None), torch.int8: (DType.int8, None), torch.int16: (DType.int16, None),
        torch.int32: (DType.int32, None), torch.int64: (DType.int64, None),
    }
    for tname, dname in [("uint16", "uint16"), ("uint32", "uint32"), ("uint64", "uint64")]:
        if hasattr(torch, tname):
            table[getattr(torch, tname)] = (DType[dname], None)
    for tname in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
        if hasattr(torch, tname) and tname in DType.__members__:
            table[getattr(torch, tname)] = (DType[tname], torch.uint8)
    return table


def _to_numpy(torch, t, name: str, where: str, dtypes: dict) -> tuple[np.ndarray, DType]:
    if t.layout != torch.strided or t.is_quantized or t.device.type != "cpu":
        raise FormatError(f"{where}: tensor {name!r}: {t.layout} / quantized / {t.device} tensors are not supported")
    if t.dtype not in dtypes:
        raise DTypeError(f"{where}: tensor {name!r}: torch dtype {t.dtype} has no lazyweights DType")
    dtype, via = dtypes[t.dtype]
    t = t.detach()
    arr = (t.view(via).numpy() if via is not None else t.numpy())  # zero-copy: shares torch's mmap
    arr = arr.view(dtype.to_numpy())
    arr.flags.writeable = False
    return arr, dtype


def _flatten(obj, prefix: str, tensors: dict, meta: dict, torch) -> None:
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), tensors, meta, torch)
    elif isinstance(obj, (list, tuple)) and any(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in obj):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}.{i}" if prefix else str(i), tensors, meta, torch)
    elif isinstance(obj, (str, int, float, bool)) or obj is None:
        if prefix:
            meta[prefix] = obj


def _load_one(torch, path: Path):
    try:
        return torch.load(str(path), weights_only=True, mmap=True, map_location="cpu")
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except Exception as e:  # noqa: BLE001 - every refusal of the restricted unpickler, corrupt zips, ...
        text = str(e)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        # torch's own first line advises re-running with weights_only=False: keep only the actual reason.
        why = [ln for ln in lines if re.search(r"unsupported|GLOBAL|blocked|WeightsUnpickler", ln, re.I)]
        rest = [ln for ln in lines if "weights_only" not in ln]
        reason = (why or rest or [type(e).__name__])[0]
        if "mmap can only be used" in text:
            reason = "a legacy (pre-zip) torch checkpoint: mmap needs the zip format of torch >= 1.6"
        raise FormatError(
            f"{path}: refused by torch's weights-only unpickler ({type(e).__name__}: {reason}). "
            "lazyweights never unpickles anything else; convert the checkpoint with a trusted tool."
        ) from None


def read_torch_checkpoint(paths: list[Path]):
    """Load pickle checkpoint files with torch's restricted unpickler into a `Checkpoint` of const records."""
    from ..graph import ops
    from .checkpoint import Checkpoint, WeightsFormat

    try:
        import torch
    except ImportError:
        raise DependencyError(
            "allow_pickle='weights_only' needs PyTorch (its restricted unpickler reads the file): pip install torch"
        ) from None
    dtypes = _torch_dtypes(torch)
    files = _expand([Path(p) for p in paths])
    records: dict[str, TorchTensorRecord] = {}
    metadata: dict = {"format": "pytorch"}
    shared: dict = {}  # (storage pointer, offset, shape, strides, dtype) -> node: tied tensors are one node
    for f in files:
        where = os.path.abspath(f)
        obj = _load_one(torch, f)
        tensors: dict = {}
        _flatten(obj, "", tensors, metadata, torch)
        pf = PickleFile(where, os.path.getsize(where))
        for name, t in tensors.items():
            if name in records:
                raise FormatError(f"tensor {name!r} appears in two checkpoint files: {records[name].file.path} and "
                                  f"{where}")
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            node = shared.get(key)
            if node is None:
                arr, _ = _to_numpy(torch, t, name, where, dtypes)
                node = shared[key] = ops.const(arr)
            records[name] = TorchTensorRecord(pf, name, node.nbytes, node.dtype, node.shape, node,
                                              extra={"format": "pytorch", "torch_dtype": str(t.dtype)})
    return Checkpoint(WeightsFormat.pytorch, records, metadata, [str(f) for f in files])
