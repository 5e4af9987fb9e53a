"""`Plan.save`: stream a converted checkpoint to disk, sharded, atomically, under a memory budget.

The header of every output file is computed from planned shapes and dtypes before any tensor is read;
then block tasks compute output rows into a per-thread scratch buffer and `pwrite` them at their final
offsets. Working memory is the blocks in flight (bounded by the budget), whatever the checkpoint's size.
Every file is written under a temporary name, fsynced and renamed only when all of them are complete,
and the index last; a failure or an interrupt removes the temporaries, so nothing half-written is ever
left under a final name.

Paths: `out.safetensors` writes one file; any other path is a directory holding `model.safetensors`, or
`model-0000K-of-0000N.safetensors` shards plus `model.safetensors.index.json` when `max_shard_size` splits
it. `out.gguf` writes GGUF.

Example:
    >>> import numpy as np, tempfile, os
    >>> from safetensors.numpy import load_file
    >>> from lazyweights import WeightData, DType, plan
    >>> w = WeightData.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    >>> out = os.path.join(tempfile.mkdtemp(), "out.safetensors")
    >>> _ = plan({"w": w.astype(DType.float16)}).save(out)
    >>> load_file(out)["w"].tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""
from __future__ import annotations

import json
import os
import shutil
import threading

import numpy as np

from ..core.errors import LazyWeightsError, WriteError
from ..run.driver import prepare_kernels, resolve_scheduler, run_tasks, task_bytes
from ..run.blocks import pull, write_rows
from .safetensors_writer import SafetensorsLayout, StreamingFile
from ..run.progress import Progress
from ..compiler.steps import Outputs, compile_steps
from ..core.units import parse_size

INDEX_NAME = "model.safetensors.index.json"


def shard_names(plan, max_shard_size: int | None) -> list[list[str]]:
    """Output names per shard, in the plan's order, each shard at most `max_shard_size` bytes (a tensor
    larger than that gets a shard of its own, as Hugging Face's sharding does)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, node in plan.outputs.items():
        n = node.nbytes
        if max_shard_size and shards[-1] and size + n > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def save(plan, path, format: str = "safetensors", max_shard_size=None, budget=None, scheduler=None,
         progress: bool = False, metadata: dict | None = None, workers: int | None = None,
         block_bytes: int | None = None) -> list[str]:
    """Write `plan`'s outputs to `path`; returns the files written (final names)."""
    path = os.fspath(path)
    fmt = (format or "safetensors").lower()
    if fmt == "gguf" or path.endswith(".gguf"):
        from .gguf_writer import save_plan_gguf

        return save_plan_gguf(plan, path, metadata=metadata, budget=budget, scheduler=scheduler,
                              progress=progress, workers=workers)
    if fmt != "safetensors":
        raise LazyWeightsError(f"unknown output format {format!r}; use 'safetensors' or 'gguf'")
    max_shard = parse_size(max_shard_size)
    shards = shard_names(plan, max_shard)
    if path.endswith(".safetensors"):
        if len(shards) > 1:
            raise LazyWeightsError(
                f"{path}: max_shard_size={max_shard_size} splits the output into {len(shards)} shards; "
                "give a directory path to write shards and an index"
            )
        directory, files = os.path.dirname(os.path.abspath(path)), [os.path.abspath(path)]
    else:
        directory = os.path.abspath(path)
        if len(shards) == 1:
            files = [os.path.join(directory, "model.safetensors")]
        else:
            files = [os.path.join(directory, f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
                     for i in range(len(shards))]
    meta = {"format": "pt"} if metadata is None else metadata
    sched = resolve_scheduler(scheduler)
    if sched == "reference":
        sched = "sync"

    def write_all(work_files: list[str], writers: list) -> None:
        if isinstance(sched, str):
            write_shards(plan, work_files, shards, meta, budget, sched, workers, progress, block_bytes, writers)
        else:
            from ..run.distributed import write_shards_distributed

            write_shards_distributed(plan, sched, work_files, shards, meta, budget)

    # A new directory is staged under a temporary sibling name and renamed whole at the end, so a reader
    # never sees some shards without the rest; into an existing directory each file is renamed in turn,
    # the index last.
    staging = None
    if not os.path.isdir(directory):
        staging = f"{directory}.tmp-{os.getpid()}-{threading.get_ident() % 10000:04d}"
        os.makedirs(staging)
    work_files = [os.path.join(staging, os.path.basename(f)) for f in files] if staging else files
    writers: list[StreamingFile] = []
    committed: list[str] = []
    try:
        write_all(work_files, writers)
        for w in writers:
            w.commit()
            committed.append(w.path)
        if len(files) > 1:
            _write_index(staging or directory, _index_doc(plan, files, shards))
        if staging:
            os.rename(staging, directory)
            _fsync_dir(os.path.dirname(directory))
    except BaseException:
        for w in writers:
            w.abort()
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        else:  # FIX (hardening): shards already renamed into an existing directory must not stay there
            for f in committed:  # without their index (e.g. the index write hit a full disk)
                try:
                    os.unlink(f)
                except OSError:
                    pass
        raise
    return files + ([os.path.join(directory, INDEX_NAME)] if len(files) > 1 else [])


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_shards(plan, files, shards, meta, budget, sched, workers, progress, block_bytes,
                 writers: list) -> None:
    """Compute and write every tensor of `shards` into temporaries (appended to `writers`)."""
    layouts = [SafetensorsLayout({n: (plan.outputs[n].dtype, plan.outputs[n].shape) for n in names}, meta)
               for names in shards]
    where: dict[str, tuple[StreamingFile, int]] = {}
    for f, layout in zip(files, layouts):
        w = StreamingFile(f, layout.file_size)
        writers.append(w)
        w.write(0, layout.header_bytes)
        for name in layout.order:
            where[name] = (w, layout.offsets[name])
    wanted = {n for names in shards for n in names}
    sub = Outputs({n: plan.outputs[n] for n in plan.outputs if n in wanted})
    steps = compile_steps(sub, budget=budget, workers=workers, block_bytes=block_bytes, materialize=False)
    tasks = [(step, rows, [where[n] for n in step.outputs]) for step in steps for rows in step.blocks]
    if prepare_kernels(steps):
        from ..kernels import casts

        casts.warm_up(wait=True)
    bar = Progress(sum(task_bytes(t) for t in tasks), "save") if progress else None
    run_tasks(tasks, _save_block, sched, workers, bar)
    if bar:
        bar.close()


_scratch = threading.local()


def _scratch_block(nbytes: int) -> np.ndarray:
    """A per-thread reusable byte buffer, so blocks do not allocate (and fault in) fresh memory."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 1), np.uint8)
        _scratch.buf = buf
    return buf[:nbytes]


def _save_block(task) -> int:
    step, rows, targets = task
    node = step.node
    for r in step.sources:
        r.file.check_unchanged(r.name)
    row_bytes = node.nbytes // node.shape[0] if node.shape else node.nbytes
    start = rows.start * row_bytes if node.shape else 0
    block_shape = (len(rows),) + node.shape[1:] if node.shape else ()
    data = None
    if step.kind == "copy":
        view = pull(node, rows, {})
        if view.flags.c_contiguous:
            data = view  # straight from the memory map to the file: no copy in between
    if data is None:
        nbytes = row_bytes * len(rows) if node.shape else node.nbytes
        data = _scratch_block(nbytes).view(node.dtype.to_numpy()).reshape(block_shape)
        write_rows(node, rows, data, {})
    for writer, offset in targets:
        writer.write(offset + start, data, tensor=step.outputs[0])
    return data.nbytes


def _index_doc(plan, files, shards) -> dict:
    total = sum(plan.outputs[n].nbytes for names in shards for n in names)
    weight_map = {n: os.path.basename(f) for f, names in zip(files, shards) for n in names}
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


def _write_index(directory: str, doc: dict) -> None:
    data = (json.dumps(doc, indent=2) + "\n").encode()
    w = StreamingFile(os.path.join(directory, INDEX_NAME), len(data))
    try:
        w.write(0, data)
        w.commit()
    except BaseException:
        w.abort()
        raise
