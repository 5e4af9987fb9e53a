"""Running plans on a dask.distributed cluster (the `distributed` extra).

For conversions that outgrow one machine. The unit of distribution is a group of whole outputs, not a
block: each worker receives plan nodes (which pickle as file paths and offsets, never tensor bytes),
re-opens the source files itself, and runs the local threaded executor on its part. (Saving sends each
output shard to one worker, which writes that shard file itself: `lazy/save.py`.)
Workers must see the same file system paths as the client (a shared or local disk, or a LocalCluster).

Example (not run here: it starts processes):
    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        plan.save("out_dir", max_shard_size="2GB", scheduler=client)
"""
from __future__ import annotations

import numpy as np

from ..compiler.steps import outputs_of
from ..graph.opcodes import Op
from .driver import execute
from .sinks import MemorySink


def groups_by_file(outputs: dict) -> list[dict]:
    """Outputs grouped by the first source file they read, so each worker reads its own files."""
    groups: dict[str, dict] = {}
    for name, node in outputs.items():
        files = sorted({n.arg.file.path for n in node.toposort() if n.op is Op.SOURCE})
        groups.setdefault(files[0] if files else "", {})[name] = node
    return list(groups.values())


def _materialize_part(outputs: dict, budget) -> dict[str, np.ndarray]:
    sink = MemorySink(outputs)
    execute(outputs, sink, scheduler="threads", budget=budget)
    return {k: np.array(v) for k, v in sink.result().items()}  # own the memory: views of a worker's map cannot travel


def materialize_distributed(plan, client, budget=None, out=None) -> dict[str, np.ndarray]:
    """Each worker materializes the outputs of its group of files; the client gathers the arrays."""
    outputs = outputs_of(plan)
    futures = [client.submit(_materialize_part, group, budget, pure=False) for group in groups_by_file(outputs)]
    result: dict[str, np.ndarray] = {}
    for part in client.gather(futures):
        result.update(part)
    if out:
        for name, dst in out.items():
            np.copyto(dst, result[name].reshape(dst.shape))
            result[name] = dst
    return {name: result[name] for name in outputs}
