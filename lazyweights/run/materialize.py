"""`materialize(outputs, ...)`: every output computed into memory, on the executor the arguments choose.

The front-end `Plan.materialize` calls. It only dispatches: a GPU device goes to `run/gpu.py`, the
"reference" scheduler to `run/reference.py`, a dask.distributed Client to `run/distributed.py`, and
everything else through the one driver (`run/driver.execute`) into a `MemorySink`.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> x = ops.const(np.arange(6, dtype=np.float32).reshape(3, 2))
    >>> materialize({"t": ops.cast(ops.permute(x, (1, 0)), "float16")}, scheduler="sync")["t"].tolist()
    [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..compiler.steps import outputs_of
from ..core.device import DeviceRef
from ..graph.node import Node
from .driver import execute, resolve_scheduler
from .sinks import MemorySink


def materialize(outputs: Mapping[str, Node], *, device=None, budget=None, scheduler=None, progress: bool = False,
                out: Mapping[str, np.ndarray] | None = None, workers: int | None = None,
                block_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Compute every output (name -> node, or a Plan): name -> array. See `Plan.materialize`."""
    outputs = outputs_of(outputs)
    device = DeviceRef.parse(device)
    if device.is_gpu:
        from .gpu import materialize_gpu

        return materialize_gpu(outputs, device=device, budget=budget, progress=progress, out=out)
    sched = resolve_scheduler(scheduler)
    if sched == "reference":
        from .reference import materialize_reference

        return materialize_reference(outputs, out=out)
    if not isinstance(sched, str):
        from .distributed import materialize_distributed

        return materialize_distributed(outputs, sched, budget=budget, out=out)
    return materialize_local(outputs, scheduler=sched, budget=budget, progress=progress, out=out,
                             workers=workers, block_bytes=block_bytes)


def materialize_local(outputs: Mapping[str, Node], *, scheduler="threads", budget=None, progress: bool = False,
                      out: Mapping[str, np.ndarray] | None = None, workers: int | None = None,
                      block_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Compute every output on this machine's threads (or inline with scheduler="sync")."""
    sink = MemorySink(outputs, out)
    execute(outputs, sink, scheduler=scheduler, budget=budget, workers=workers, block_bytes=block_bytes,
            progress=progress)
    return sink.result()
