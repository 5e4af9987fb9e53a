"""GGUF writing for an adapted state dict: `save_gguf` and `write_gguf`.

`save_gguf(path, state_dict, metadata)` is `lazyweights.plan(state_dict).save(path, format="gguf",
metadata=metadata)` (the one save, scheduled and parallel); `write_gguf` writes one tensor after another,
materializing each alone (peak memory about one tensor), or with your own `produce(name, weight_data)`.
Both refuse metadata without `general.architecture` (a `GGUFConfigError`, nothing written) unless
`require_architecture=False`.

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
               fsync: bool = True, *, require_architecture: bool = True) -> str:
    """Write `tensors` (name -> WeightData or Node) to `path` as GGUF, one tensor at a time, in order.

    `produce(name, weight_data)` returns the tensor's array (or bytes); by default each tensor is
    materialized alone with `lazyweights.plan({name: wd}).materialize()`, written, and released, so peak
    memory is about one tensor. The file appears under `path` only when complete. `metadata` without
    `general.architecture` is a GGUFConfigError before anything is written, unless
    `require_architecture=False` (a bare tensor container).
    """
    from ..formats.gguf_writer import GGUFLayout, GGUFStreamWriter, check_gguf_architecture

    if require_architecture:
        check_gguf_architecture(metadata, path)
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
              alignment: int | None = None, *, require_architecture: bool = True, **save_kwargs) -> str:
    """Save `state_dict` (name -> WeightData or Node; a converter's result keeps its own metadata) to the GGUF
    file `path` with `metadata` (default: the result's `gguf_metadata`): `Plan.save(path, format="gguf")`,
    kept for callers of the name; `save_kwargs` are `Plan.save`'s (budget, workers, ...). Returns `path`.
    Example: see the module docstring."""
    wds = {name: _as_weight_data(name, v) for name, v in state_dict.items()}
    carried = plan(state_dict) if not any(isinstance(v, Node) for v in state_dict.values()) else None
    p = carried._derived(wds) if carried is not None else plan(wds)
    return p.save(path, format="gguf", metadata=metadata, alignment=alignment,
                  require_architecture=require_architecture, **save_kwargs)[0]
