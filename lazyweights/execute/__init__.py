"""Executors: turn a Plan into arrays. One entry point, `materialize`, picks the executor by `scheduler`.

    "sync"        the single-thread numpy reference (`reference.py`)
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..device import DeviceRef
from ..errors import LazyWeightsError, ShapeError, DTypeError
from .reference import evaluate


def materialize(plan, device=None, budget=None, scheduler=None, progress=False,
                out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Compute every output of `plan`; see `Plan.materialize`."""
    device = DeviceRef.parse(device)
    if device.is_gpu:
        raise LazyWeightsError("GPU materialization is not available in this build")
    if scheduler not in (None, "sync", "threads"):
        raise LazyWeightsError(f"unknown scheduler {scheduler!r}; use 'sync' or 'threads'")
    outputs = plan.outputs
    names = {node: name for name, node in outputs.items()}
    arrays = evaluate(outputs.values(), names)
    result = {}
    for (name, node), arr in zip(outputs.items(), arrays):
        arr = np.ascontiguousarray(arr)
        if out is not None and name in out:
            dst = out[name]
            _check_destination(name, node, dst)
            np.copyto(dst, arr.reshape(dst.shape) if dst.shape != arr.shape else arr)
            arr = dst
        result[name] = arr
    return result


def _check_destination(name, node, dst: np.ndarray) -> None:
    if dst.dtype != node.dtype.to_numpy():
        raise DTypeError(f"destination for {name!r} is {dst.dtype}, the plan produces {node.dtype.name}")
    if dst.size != node.size:
        raise ShapeError(f"destination for {name!r} has shape {list(dst.shape)}, the plan produces {list(node.shape)}")
