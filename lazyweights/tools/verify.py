"""Stable hashes of every output tensor, and manifests that let a saved checkpoint be verified later.

The hash of a tensor is BLAKE2b (32-byte digest) over

    b"<dtype name>:<d0>,<d1>,...\\n"  followed by the tensor's bytes in C order

(`hash_array` computes it from a numpy array; a 0-d tensor has an empty shape list). It depends only on the
values, never on how they were computed: every executor ("sync", "threads", "reference"), budget and block
size gives the same hash, on every run, and so does reading the saved file back.

`hash_plan` computes it through the block scheduler without materializing whole tensors: each tensor's
row blocks are computed in order into a per-thread scratch buffer (exactly the code path `Plan.save`
writes with) and fed to its hasher; tensors run in parallel (up to `workers` at once, each holding one
block). A dask.distributed Client is accepted and runs the hashing on local threads.

Manifests: `write_manifest(plan_or_checkpoint, path)` writes `lazyweights.verify.json` beside a checkpoint
(in its directory), with each tensor's dtype, shape and hash; `verify(path)` re-reads the checkpoint and
checks every tensor against it, naming each mismatch. `save_and_manifest(plan, path, **save_kwargs)` saves
a plan, writes the manifest from the *plan* (computed from its sources, independently of the file) and, by
default, verifies the written files against it. Command line: `lazyweights verify PATH [--write]`.

Example:
    >>> import os, tempfile, numpy as np
    >>> from lazyweights import WeightData, DType, plan
    >>> from lazyweights.tools.verify import hash_array, hash_plan, save_and_manifest, verify
    >>> w = WeightData.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    >>> p = plan({"w": w.astype(DType.float16)})
    >>> hash_plan(p)["w"] == hash_array(np.arange(6, dtype=np.float16).reshape(2, 3))
    True
    >>> out = os.path.join(tempfile.mkdtemp(), "out.safetensors")
    >>> _ = save_and_manifest(p, out)
    >>> verify(out).ok
    True
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..compiler.steps import outputs_of
from ..core.dtype import DType
from ..core.errors import ExecutionError, UsageError, VerifyError
from ..io.atomic import write_file_atomically
from ..lazy.plan import Plan
from ..lazy.weights import load_weights
from ..run.driver import execute, resolve_scheduler
from ..run.reference import materialize_reference
from ..run.sinks import WriterSink

MANIFEST_NAME = "lazyweights.verify.json"
MANIFEST_FORMAT = "lazyweights.verify/1"
HASH_NAME = "blake2b-256"
HASH_DEFINITION = "BLAKE2b-256 over b'<dtype name>:<comma-separated shape>\\n' + the tensor's C-order bytes"




def _header(dtype_name: str, shape) -> bytes:
    return f"{dtype_name}:{','.join(str(int(d)) for d in shape)}\n".encode()


def hash_array(arr, dtype_name: str | None = None) -> str:
    """The hash of an in-memory array (the definition the scheduler's block-wise hashing must match)."""
    arr = np.asarray(arr)
    name = dtype_name or DType.from_numpy(arr.dtype).name
    h = hashlib.blake2b(_header(name, arr.shape), digest_size=32)
    h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


class _Hasher:
    """A writer for `WriterSink(ordered=True)`: takes one tensor's blocks, in order, into a hash."""

    def __init__(self, node):
        self.h = hashlib.blake2b(_header(node.dtype.name, node.shape), digest_size=32)
        self.pos = 0

    def write(self, offset: int, data, tensor: str | None = None) -> None:
        if offset != self.pos:
            raise ExecutionError(f"verify: tensor {tensor!r}: a block at byte {offset} arrived out of order "
                                 f"(expected byte {self.pos})", tensor=tensor)
        if isinstance(data, np.ndarray):  # ml_dtypes arrays do not export the buffer protocol: go via uint8
            data = data.reshape(-1).view(np.uint8)
        mv = memoryview(data).cast("B")
        self.h.update(mv)  # (hashlib releases the GIL for large buffers: tensors hash in parallel)
        self.pos += len(mv)


def hash_plan(plan, *, scheduler=None, budget=None, workers: int | None = None, block_bytes: int | None = None,
              progress: bool = False) -> dict[str, str]:
    """Output name -> hash (hex) of every output of `plan`, computed block-wise (see the module docs)."""
    sched = resolve_scheduler(scheduler)
    outputs = outputs_of(plan)
    if sched == "reference":  # the specification executor: whole arrays, one op at a time
        arrays = materialize_reference(outputs)
        return {n: hash_array(arrays[n], outputs[n].dtype.name) for n in outputs}
    if not isinstance(sched, str):
        sched = "threads"  # a dask.distributed Client: hashes need every block of a tensor in one place
    # One hasher per tensor, fed its blocks in row order (`ordered=True`). A tied output is computed once and
    # its hash shared. (The hash header uses the output's shape, not the step's: its leading axes may be
    # merged.)
    hashers = {name: _Hasher(node) for name, node in outputs.items()}
    sink = WriterSink({name: [(h, 0)] for name, h in hashers.items()}, ordered=True, label="verify")
    steps = execute(outputs, sink, scheduler=sched, budget=budget, workers=workers, block_bytes=block_bytes,
                    progress=progress)
    digests: dict[str, str] = {}
    for step in steps:
        first = hashers[step.outputs[0]]
        if first.pos != step.node.nbytes:
            raise ExecutionError(f"verify: tensor {step.outputs[0]!r}: hashed {first.pos} of "
                                 f"{step.node.nbytes} bytes", tensor=step.outputs[0])
        for name in step.outputs:
            digests[name] = first.h.hexdigest()
    return {n: digests[n] for n in outputs}


# --- manifests ---------------------------------------------------------------------------------------------------
def _checkpoint_plan(path, remote: Mapping | None = None):
    w = load_weights(path, **dict(remote or {}))
    return Plan({name: acc.data() for name, acc in w.items()}), w


def manifest_path(checkpoint) -> str:
    """Where the manifest of `checkpoint` (a directory, a file or an index) lives: in its directory."""
    p = os.path.abspath(os.fspath(checkpoint))
    return os.path.join(p if os.path.isdir(p) else os.path.dirname(p), MANIFEST_NAME)


def _manifest_doc(plan, hashes: Mapping[str, str], files) -> dict:
    tensors = {}
    for name, node in plan.outputs.items():
        tensors[name] = {"dtype": node.dtype.name, "shape": list(node.shape), "nbytes": node.nbytes,
                         "hash": hashes[name]}
    return {"format": MANIFEST_FORMAT, "hash": HASH_NAME, "definition": HASH_DEFINITION,
            "files": sorted(os.path.basename(f) for f in files), "tensors": dict(sorted(tensors.items()))}


def write_manifest(plan_or_checkpoint, path=None, *, scheduler=None, budget=None, workers: int | None = None,
                   progress: bool = False, storage_options: dict | None = None, cache: str | None = None) -> str:
    """Hash every tensor and write `lazyweights.verify.json` for the checkpoint at `path`.

    `plan_or_checkpoint` is a `Plan` (hashed from its sources; `path` is where it was saved) or a checkpoint
    path (hashed as it is on disk now; `path` defaults to it; a URL is opened with `storage_options` and
    `cache`, as `load_weights` takes them). Returns the manifest's path."""
    if isinstance(plan_or_checkpoint, Plan):
        if path is None:
            raise UsageError("write_manifest(plan, path): give the checkpoint path the plan was saved to")
        plan, files = plan_or_checkpoint, _checkpoint_files(path)
    else:
        path = plan_or_checkpoint if path is None else path
        plan, weights = _checkpoint_plan(plan_or_checkpoint, {"storage_options": storage_options, "cache": cache})
        files = weights.files
    hashes = hash_plan(plan, scheduler=scheduler, budget=budget, workers=workers, progress=progress)
    target = manifest_path(path)
    data = (json.dumps(_manifest_doc(plan, hashes, files), indent=1) + "\n").encode()
    write_file_atomically(target, data)  # a reader never sees half a manifest
    return target


def _checkpoint_files(path) -> list[str]:
    p = os.path.abspath(os.fspath(path))
    if os.path.isdir(p):
        return [os.path.join(p, f) for f in os.listdir(p) if f.endswith((".safetensors", ".gguf", ".json"))
                and f != MANIFEST_NAME]
    return [p]


@dataclass
class VerifyReport:
    """What `verify` found: `ok` when every tensor of the manifest is present with the same hash, dtype and
    shape, and the checkpoint has no tensor the manifest lacks."""

    path: str
    manifest: str
    checked: int = 0
    mismatched: list[str] = field(default_factory=list)    # hash (or dtype/shape) differs
    missing: list[str] = field(default_factory=list)       # in the manifest, not in the checkpoint
    unexpected: list[str] = field(default_factory=list)    # in the checkpoint, not in the manifest
    details: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every tensor matched and none was missing or unexpected."""
        return not (self.mismatched or self.missing or self.unexpected)

    def summary(self) -> str:
        """One line per problem (MISMATCH, MISSING, UNEXPECTED), then the verdict with the counts."""
        lines = []
        for n in self.mismatched:
            lines.append(f"MISMATCH  {n}: {self.details.get(n, '')}")
        for n in self.missing:
            lines.append(f"MISSING   {n}")
        for n in self.unexpected:
            lines.append(f"UNEXPECTED {n}")
        verdict = "OK" if self.ok else "FAILED"
        lines.append(f"{verdict}: {self.checked} tensors checked against {self.manifest}: "
                     f"{len(self.mismatched)} mismatched, {len(self.missing)} missing, {len(self.unexpected)} "
                     "unexpected")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready form of the report (`lazyweights verify --json`)."""
        return {"path": self.path, "manifest": self.manifest, "ok": self.ok, "checked": self.checked,
                "mismatched": self.mismatched, "missing": self.missing, "unexpected": self.unexpected,
                "details": self.details}


def verify(path, manifest=None, *, scheduler=None, budget=None, workers: int | None = None,
           progress: bool = False, storage_options: dict | None = None, cache: str | None = None) -> VerifyReport:
    """Re-read the checkpoint at `path` and check every tensor against its manifest (default: the
    `lazyweights.verify.json` beside it). Returns a `VerifyReport`; a missing/invalid manifest is a VerifyError.
    A URL `path` is opened with `storage_options` and `cache` (as `load_weights` takes them)."""
    mpath = os.path.abspath(manifest) if manifest else manifest_path(path)
    try:
        with open(mpath, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise VerifyError(f"{path}: no manifest at {mpath}; write one with `lazyweights verify --write` "
                          "or lazyweights.tools.verify.write_manifest()") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise VerifyError(f"{mpath}: not a valid manifest: {e}") from None
    tensors = doc.get("tensors") if isinstance(doc, dict) else None
    if doc.get("format") != MANIFEST_FORMAT or not isinstance(tensors, dict):
        raise VerifyError(f"{mpath}: not a {MANIFEST_FORMAT} manifest")
    plan, _ = _checkpoint_plan(path, {"storage_options": storage_options, "cache": cache})
    report = VerifyReport(os.path.abspath(os.fspath(path)), mpath)
    hashes = hash_plan(plan, scheduler=scheduler, budget=budget, workers=workers, progress=progress)
    for name, node in plan.outputs.items():
        want = tensors.get(name)
        if not isinstance(want, dict):
            report.unexpected.append(name)
            continue
        report.checked += 1
        if want.get("dtype") != node.dtype.name or list(want.get("shape", [])) != list(node.shape):
            report.mismatched.append(name)
            report.details[name] = (f"{node.dtype.name}{list(node.shape)} on disk, "
                                    f"{want.get('dtype')}{want.get('shape')} in the manifest")
        elif want.get("hash") != hashes[name]:
            report.mismatched.append(name)
            listed = str(want.get("hash"))[:16]
            report.details[name] = f"hash {hashes[name][:16]}... on disk, {listed}... in the manifest"
    report.missing = sorted(n for n in tensors if n not in plan.outputs)
    return report


def save_and_manifest(plan, path, *, check: bool = True, scheduler=None, budget=None, workers: int | None = None,
                      progress: bool = False, **save_kwargs) -> list[str]:
    """`plan.save(path, **save_kwargs)`, then write the manifest from the plan (hashed from its sources, not
    from the written bytes) and, with `check` (default), verify the written checkpoint against it: a
    VerifyError names every tensor that was not written as planned. Returns the saved files + the manifest."""
    files = plan.save(path, scheduler=scheduler, budget=budget, progress=progress, workers=workers, **save_kwargs)
    target = write_manifest(plan, path, scheduler=scheduler, budget=budget, workers=workers, progress=progress)
    if check:
        report = verify(path, target, scheduler=scheduler, budget=budget, workers=workers, progress=progress)
        if not report.ok:
            raise VerifyError(f"{path}: the saved checkpoint does not match its plan:\n{report.summary()}", report)
    return list(files) + [target]
