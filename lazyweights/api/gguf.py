"""Tensor-at-a-time GGUF writing for an adapted state dict: `write_gguf` and `save_gguf`.

The scheduled, parallel path is `Plan.save(path, format="gguf")`; these write one tensor after another,
materializing each alone (peak memory about one tensor), or with your own `produce(name, weight_data)`.

Example:
    >>> import numpy as np, tempfile, os
    >>> from lazyweights import WeightData
    >>> from lazyweights.formats.gguf import read_gguf
    >>> path = os.path.join(tempfile.mkdtemp(), "out.gguf")
    >>> _ = save_gguf(path, {"w": WeightData.from_numpy(np.ones((2, 3), np.float32), "w")},
    ...               {"general.architecture": "llama"})
    >>> records, meta = read_gguf(path)
    >>> [(r.name, r.shape, r.extra["ne"]) for r in records], meta["general.architecture"]
    ([('w', (2, 3), (3, 2))], 'llama')
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ..graph.node import Node
from .plan import plan
from .weight_data import WeightData, as_weight_data


def _as_weight_data(name: str, value) -> WeightData:
    from ..formats.gguf_writer import node_encoding  # (gguf-py loads only when a GGUF is written)

    if isinstance(value, Node):
        return WeightData.wrap(value, name, node_encoding(value))
    return as_weight_data(value, name)


def _materialize_one(name: str, value) -> np.ndarray:
    return plan({name: value}).materialize()[name]


def write_gguf(path, tensors: Mapping[str, Any], metadata: Mapping[str, Any] | None = None,
               produce: Callable[[str, Any], Any] | None = None, alignment: int | None = None,
               fsync: bool = True) -> str:
    """Write `tensors` (name -> WeightData or Node) to `path` as GGUF, one tensor at a time, in order.

    `produce(name, weight_data)` returns the tensor's array (or bytes); by default each tensor is
    materialized alone with `lazyweights.plan({name: wd}).materialize()`, written, and released, so peak
    memory is about one tensor. The file appears under `path` only when complete.
    """
    from ..formats.gguf_writer import GGUFLayout, GGUFStreamWriter

    wds = {name: _as_weight_data(name, v) for name, v in tensors.items()}
    layout = GGUFLayout.plan(wds, metadata, alignment)
    produce = produce or _materialize_one
    with GGUFStreamWriter(path, layout, fsync=fsync) as w:
        for name, wd in wds.items():
            data = produce(name, wd)
            w.write_tensor(name, data)
            del data
    return w.path


def save_gguf(path, state_dict: Mapping[str, Any], metadata: Mapping[str, Any] | None = None,
              alignment: int | None = None) -> str:
    """Eager convenience: stream `state_dict` (name -> WeightData) to a GGUF file with `metadata`."""
    return write_gguf(path, state_dict, metadata, alignment=alignment)
