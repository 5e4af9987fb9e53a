"""`Plan.save`: stream a converted checkpoint to disk, sharded, atomically, under a memory budget.

The header of every output file is computed from planned shapes and dtypes before any tensor is read;
then block tasks compute output rows into a per-thread scratch buffer and `pwrite` them at their final
offsets. Working memory is the blocks in flight (bounded by the budget), whatever the checkpoint's size.
Every file is written under a temporary name, fsynced and renamed only when all of them are complete,
and the index last; a failure or an interrupt removes the temporaries, so nothing half-written is ever
left under a final name.

Paths: `out.safetensors` writes one file; any other path is a directory holding `model.safetensors`, or
`model-0000K-of-0000N.safetensors` shards plus `model.safetensors.index.json` when `max_shard_size` splits
it, plus `extra_files` (config.json, tokenizer files: a Hugging Face folder), the whole folder staged under a
temporary sibling name and swapped in only when every file is complete. `out.gguf` writes GGUF, which must
say its `general.architecture` (llama.cpp loads nothing else) unless `require_architecture=False` asks for a
bare tensor container: a `GGUFConfigError` naming the key, raised before any file is created.

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
from typing import Callable, Mapping

from ..compiler.steps import outputs_of
from ..core.errors import ExecutionError, UsageError
from ..core.units import parse_size
from ..formats.gguf_writer import check_gguf_architecture
from ..formats.safetensors_writer import SafetensorsLayout
from ..graph.node import Node
from ..io.atomic import AtomicFile, staging_name, swap_directory, write_file_atomically
from ..run.driver import execute, resolve_scheduler
from ..run.sinks import WriterSink

INDEX_NAME = "model.safetensors.index.json"


def shard_names(outputs: Mapping[str, Node], max_shard_size: int | None) -> list[list[str]]:
    """Output names per shard, in the plan's order, each shard at most `max_shard_size` bytes (a tensor
    larger than that gets a shard of its own, as Hugging Face's sharding does)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, node in outputs.items():
        n = node.nbytes
        if max_shard_size and shards[-1] and size + n > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def save(plan, path, *, format: str = "safetensors", max_shard_size=None, budget=None, scheduler=None,
         progress: bool = False, metadata: Mapping | None = None, workers: int | None = None,
         block_bytes: int | None = None, tensor_meta: Mapping | None = None, alignment: int | None = None,
         extra_files: Mapping[str, bytes] | Callable[[], Mapping[str, bytes]] | None = None,
         require_architecture: bool = True) -> list[str]:
    """Write `plan`'s outputs (a Plan, or name -> node) to `path`; returns the files written (final names).

    `tensor_meta` (GGUF only): name -> what `GGUFLayout.plan` accepts, where a node alone does not say
    the tensor's quantization encoding; `alignment` (GGUF only): the data alignment (default 32);
    `require_architecture` (GGUF only): False writes a file without `general.architecture`.
    `extra_files` (a directory only): name -> bytes (or a callable returning them, called before any tensor is
    computed, so a file that cannot be built, such as the tokenizer of a GGUF that has none, fails without work
    done: tests/tools/test_cli_manners.py) saved beside the shards; the folder is then always staged and
    swapped in whole."""
    path = os.fspath(path)
    outputs = outputs_of(plan)
    fmt = (format or "safetensors").lower()
    if fmt == "gguf" or path.endswith(".gguf"):
        return save_gguf_outputs(outputs, path, metadata=metadata, budget=budget, scheduler=scheduler,
                                 progress=progress, workers=workers, block_bytes=block_bytes,
                                 tensor_meta=tensor_meta, alignment=alignment,
                                 require_architecture=require_architecture)
    if fmt != "safetensors":
        raise UsageError(f"unknown output format {format!r}; use 'safetensors' or 'gguf'")
    max_shard = parse_size(max_shard_size)
    shards = shard_names(outputs, max_shard)
    if path.endswith(".safetensors"):
        if len(shards) > 1:
            raise UsageError(
                f"{path}: max_shard_size={max_shard_size} splits the output into {len(shards)} shards; "
                "give a directory path to write shards and an index"
            )
        directory, files = os.path.dirname(os.path.abspath(path)), [os.path.abspath(path)]
        extra_files = None  # one file: nothing beside it
    else:
        directory = os.path.abspath(path)
        if len(shards) == 1:
            files = [os.path.join(directory, "model.safetensors")]
        else:
            files = [os.path.join(directory, f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
                     for i in range(len(shards))]
    meta = {"format": "pt"} if metadata is None else dict(metadata)
    extra = dict(extra_files() if callable(extra_files) else extra_files or {})
    sched = resolve_scheduler(scheduler)
    if sched == "reference":
        sched = "sync"

    def write_all(work_files: list[str], writers: list) -> None:
        if isinstance(sched, str):
            write_shards(outputs, work_files, shards, writers, metadata=meta, budget=budget, scheduler=sched,
                         workers=workers, progress=progress, block_bytes=block_bytes)
        else:
            write_shards_distributed(outputs, sched, work_files, shards, metadata=meta, budget=budget)

    # A new directory is staged under a temporary sibling name and renamed whole at the end, so a reader
    # never sees some shards without the rest; into an existing directory each file is renamed in turn,
    # the index last. A folder with extra files (a Hugging Face folder: config, tokenizer) is always staged
    # and swapped in whole, replacing an existing one only once complete (tests/api/test_plan_save.py).
    staging = None
    if extra_files is not None or not os.path.isdir(directory):
        staging = staging_name(directory)
        os.makedirs(staging)
    work_files = [os.path.join(staging, os.path.basename(f)) for f in files] if staging else files
    writers: list[AtomicFile] = []
    committed: list[str] = []
    try:
        write_all(work_files, writers)
        for w in writers:
            w.commit()
            committed.append(w.path)
        if len(files) > 1:
            _write_index(staging or directory, _index_doc(outputs, files, shards))
        for name, data in extra.items():
            write_file_atomically(os.path.join(staging or directory, name), data)
        if staging:
            swap_directory(staging, directory)
    except BaseException:
        for w in writers:
            w.abort()
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        else:  # shards already renamed into an existing directory must not stay there without their
            for f in committed:  # index (e.g. the index write hit a full disk): tests/run/test_faults.py
                try:
                    os.unlink(f)
                except OSError:
                    pass  # already gone: the save's own error is the one re-raised
        raise
    return (files + ([os.path.join(directory, INDEX_NAME)] if len(files) > 1 else [])
            + [os.path.join(directory, name) for name in extra])


def write_shards(outputs: Mapping[str, Node], files: list[str], shards: list[list[str]], writers: list, *,
                 metadata: dict, budget=None, scheduler="threads", workers: int | None = None,
                 progress: bool = False, block_bytes: int | None = None) -> None:
    """Compute and write every tensor of `shards` into temporaries (appended to `writers`, for the
    caller to commit or abort)."""
    layouts = [SafetensorsLayout({n: (outputs[n].dtype, outputs[n].shape) for n in names}, metadata)
               for names in shards]
    where: dict[str, list] = {}
    for f, layout in zip(files, layouts):
        w = AtomicFile(f, layout.file_size)
        writers.append(w)
        w.write(0, layout.header_bytes)
        for name in layout.order:
            where[name] = [(w, layout.offsets[name])]
    wanted = {n for names in shards for n in names}
    sub = {n: node for n, node in outputs.items() if n in wanted}
    execute(sub, WriterSink(where), scheduler=scheduler, budget=budget, workers=workers, block_bytes=block_bytes,
            progress=progress)


def _write_shard(path: str, outputs: dict, names: list[str], meta: dict, budget) -> str:
    """On a dask worker: write one whole shard file and commit it (see `write_shards_distributed`)."""
    writers: list = []
    try:
        write_shards(outputs, [path], [names], writers, metadata=meta, budget=budget)
        for w in writers:
            w.commit()
    except BaseException:
        for w in writers:
            w.abort()
        raise
    return path


def write_shards_distributed(outputs: Mapping[str, Node], client, files: list[str], shards: list[list[str]], *,
                             metadata: dict, budget=None) -> None:
    """One dask.distributed task per shard; every shard file is committed (renamed from its temporary) by
    its worker, which re-opens the sources itself. Workers must see the client's paths."""
    futures = []
    for path, names in zip(files, shards):
        part = {n: outputs[n] for n in names}
        futures.append(client.submit(_write_shard, path, part, names, metadata, budget, pure=False))
    try:
        written = client.gather(futures)
    except Exception:
        for path in files:  # a shard that did finish is removed too: the save failed as a whole
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # that shard never got written: nothing to remove
        raise
    missing = [p for p in written if not os.path.exists(p)]
    if missing:
        raise ExecutionError(f"workers reported shards the client cannot see: {missing} (no shared file system?)")


def save_gguf_outputs(outputs: Mapping[str, Node], path, *, metadata: Mapping | None = None, budget=None,
                      scheduler=None, progress: bool = False, workers: int | None = None,
                      block_bytes: int | None = None, alignment: int | None = None,
                      tensor_meta: Mapping | None = None, require_architecture: bool = True) -> list[str]:
    """`Plan.save(path, format="gguf")`: the header from the planned shapes, dtypes and encodings, then
    every tensor's row blocks computed by the fused scheduler (in parallel, under `budget`) and written at
    their offsets; atomic. A dask.distributed Client runs the blocks on local threads (the file is local).
    `metadata` without `general.architecture` is a GGUFConfigError before anything is written, unless
    `require_architecture=False`. Returns `[path]`."""
    from ..formats.gguf_writer import GGUFLayout, GGUFStreamWriter  # (gguf-py loads only for GGUF saves)

    if require_architecture:
        check_gguf_architecture(metadata, path)
    layout = GGUFLayout.plan(dict(tensor_meta) if tensor_meta is not None else outputs, metadata, alignment)
    sched = resolve_scheduler(scheduler)
    if not isinstance(sched, str) or sched == "reference":
        sched = "threads" if not isinstance(sched, str) else "sync"
    with GGUFStreamWriter(path, layout) as writer:
        where = {n: [(writer, layout.slots[n].offset)] for n in outputs}
        execute(outputs, WriterSink(where), scheduler=sched, budget=budget, workers=workers,
                block_bytes=block_bytes, progress=progress)
    return [writer.path]


def _index_doc(outputs, files, shards) -> dict:
    total = sum(outputs[n].nbytes for names in shards for n in names)
    weight_map = {n: os.path.basename(f) for f, names in zip(files, shards) for n in names}
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


def _write_index(directory: str, doc: dict) -> None:
    write_file_atomically(os.path.join(directory, INDEX_NAME), (json.dumps(doc, indent=2) + "\n").encode())
