"""Running plans on a dask.distributed cluster (the `distributed` extra).

For conversions that outgrow one machine. The unit of distribution is a group of whole outputs, not a
block: each worker receives plan nodes (which pickle as file paths and offsets, never tensor bytes),
re-opens the source files itself, and runs the local threaded executor on its part. Saving sends each
output shard to one worker, which writes that shard file itself; the client writes only the index.
Workers must see the same file system paths as the client (a shared or local disk, or a LocalCluster).

Example (not run here: it starts processes):
    from dask.distributed import Client, LocalCluster
    with Client(LocalCluster(n_workers=2, threads_per_worker=1)) as client:
        plan.save("out_dir", max_shard_size="2GB", scheduler=client)
"""
from __future__ import annotations

import os

import numpy as np

from ..core.errors import LazyWeightsError
from ..compiler.steps import Outputs


def _groups_by_file(plan) -> list[dict]:
    """Outputs grouped by the first source file they read, so each worker reads its own files."""
    groups: dict[str, dict] = {}
    for name, node in plan.outputs.items():
        files = sorted({n.arg.file.path for n in node.toposort() if n.op == "source"})
        groups.setdefault(files[0] if files else "", {})[name] = node
    return list(groups.values())


def _materialize_part(outputs: dict, budget) -> dict[str, np.ndarray]:
    from .driver import materialize

    result = materialize(Outputs(outputs), budget=budget, scheduler="threads")
    return {k: np.array(v) for k, v in result.items()}  # own the memory: views of a worker's map cannot travel


def materialize_distributed(plan, client, budget=None, out=None) -> dict[str, np.ndarray]:
    """Each worker materializes the outputs of its group of files; the client gathers the arrays."""
    futures = [client.submit(_materialize_part, group, budget, pure=False) for group in _groups_by_file(plan)]
    result: dict[str, np.ndarray] = {}
    for part in client.gather(futures):
        result.update(part)
    if out:
        for name, dst in out.items():
            np.copyto(dst, result[name].reshape(dst.shape))
            result[name] = dst
    return {name: result[name] for name in plan.outputs}


def _write_shard(path: str, outputs: dict, names: list[str], meta: dict, budget) -> str:
    from ..formats.save import write_shards

    writers: list = []
    try:
        write_shards(Outputs(outputs), [path], [names], meta, budget, "threads", None, False, None, writers)
        for w in writers:
            w.commit()
    except BaseException:
        for w in writers:
            w.abort()
        raise
    return path


def write_shards_distributed(plan, client, files: list[str], shards: list[list[str]], meta: dict, budget) -> None:
    """One task per shard; every shard file is committed (renamed from its temporary) by its worker."""
    futures = []
    for path, names in zip(files, shards):
        outputs = {n: plan.outputs[n] for n in names}
        futures.append(client.submit(_write_shard, path, outputs, names, meta, budget, pure=False))
    try:
        written = client.gather(futures)
    except Exception:
        for path in files:  # a shard that did finish is removed too: the save failed as a whole
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        raise
    missing = [p for p in written if not os.path.exists(p)]
    if missing:
        raise LazyWeightsError(f"workers reported shards the client cannot see: {missing} (no shared file system?)")
