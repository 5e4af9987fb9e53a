"""Stream a plan's tensors in the caller's order, computed ahead within a bounded prefetch window.

For serving: an engine can put layer 0 on its device while layers 1, 2, ... are still being read. The caller
gives an order (names, or groups of names such as one layer's tensors); each group is computed as one fused,
parallel, budgeted run of the driver (`run/driver.execute`) on a background thread, which stays at most
`prefetch` bytes of finished-but-not-yet-taken tensors ahead of the caller. Tensors are yielded as
`(name, array)` in the given order, each as soon as its group is done. The arrays are the caller's: once a
tensor is handed over, its memory no longer counts against the window (drop it, or copy it to the device).

Closing the generator early (a `break`, an exception in the caller) stops the producer after the group it is
computing; an error computing a group is raised from the generator at that group's turn, naming the tensor.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> outs = {f"l{i}.w": ops.cast(ops.const(np.full((4, 4), i, np.float32)), "float16") for i in range(3)}
    >>> [(n, float(a[0, 0])) for n, a in stream(outs, [["l2.w"], ["l0.w", "l1.w"]], prefetch=64)]
    [('l2.w', 2.0), ('l0.w', 0.0), ('l1.w', 1.0)]
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..core.errors import UsageError, did_you_mean
from ..core.units import parse_size
from ..graph.node import Node
from .driver import execute, resolve_scheduler
from .sinks import MemorySink

DEFAULT_PREFETCH = 1 << 30


def _groups(outputs: Mapping[str, Node], order) -> list[list[str]]:
    if order is None:
        return [[name] for name in outputs]
    groups = [[g] if isinstance(g, str) else list(g) for g in order]
    seen: set[str] = set()
    for group in groups:
        for name in group:
            if name not in outputs:
                raise UsageError(f"stream order names {name!r}, which is not an output of the plan."
                                       f"{did_you_mean(name, list(outputs))}")
            if name in seen:
                raise UsageError(f"stream order names {name!r} twice")
            seen.add(name)
    return groups


@dataclass
class _State:
    """What `stream`'s producer thread and its caller share, under one condition variable."""

    ahead: int = 0                                   # bytes computed and not yet handed out
    error: tuple[int, BaseException] | None = None   # (group index, what its computation raised)
    stop: bool = False                               # the caller has gone: produce nothing more
    next: int = 0                                    # the group the caller waits for


def stream(outputs: Mapping[str, Node], order: Iterable | None = None, *, prefetch=DEFAULT_PREFETCH, budget=None,
           scheduler=None, workers: int | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Yield `(name, array)` for the outputs named by `order` (names or groups of names; default: every
    output, one at a time, in plan order), computing ahead within `prefetch` bytes (int or "1GB")."""
    groups = _groups(outputs, order)
    window = parse_size(prefetch) or DEFAULT_PREFETCH
    sched = resolve_scheduler(scheduler)
    if not isinstance(sched, str) or sched == "reference":
        sched = "threads" if not isinstance(sched, str) else "sync"
    sizes = [sum(outputs[n].nbytes for n in g) for g in groups]
    done: dict[int, dict] = {}
    state = _State()
    cond = threading.Condition()

    def produce() -> None:
        for i, group in enumerate(groups):
            with cond:
                # at least the group the caller waits for; more only while the window has room
                while not state.stop and i > state.next and state.ahead + sizes[i] > window:
                    cond.wait()
                if state.stop:
                    return
            try:
                part = {n: outputs[n] for n in group}
                sink = MemorySink(part)
                execute(part, sink, scheduler=sched, budget=budget, workers=workers)
                result = sink.result()
            except BaseException as e:  # handed to the caller at this group's turn
                with cond:
                    state.error = (i, e)
                    cond.notify_all()
                return
            with cond:
                done[i] = result
                state.ahead += sizes[i]
                cond.notify_all()

    producer = threading.Thread(target=produce, name="lazyweights-stream", daemon=True)
    producer.start()
    try:
        for i, group in enumerate(groups):
            with cond:
                while i not in done and not (state.error is not None and state.error[0] <= i):
                    cond.wait()
                if i not in done and state.error is not None:
                    raise state.error[1]
                result = done.pop(i)
            for name in group:
                yield name, result.pop(name)
            with cond:
                state.ahead -= sizes[i]
                state.next = i + 1
                cond.notify_all()
    finally:
        with cond:
            state.stop = True
            cond.notify_all()
        producer.join()


def layer_groups(names: Sequence[str]) -> list[list[str]]:
    """Group output names by layer (`...layers.N.` or `blk.N.`), layers in numeric order, the rest first:
    the order a serving engine loads a model in.

    Example:
        >>> layer_groups(["lm_head.weight", "model.layers.1.w", "model.layers.0.w", "model.layers.10.w",
        ...               "model.layers.0.b"])
        [['lm_head.weight'], ['model.layers.0.w', 'model.layers.0.b'], ['model.layers.1.w'], ['model.layers.10.w']]
    """
    import re

    other: list[str] = []
    layers: dict[int, list[str]] = {}
    for name in names:
        m = re.search(r"(?:^|\.)(?:layers|blk|h|block|blocks)\.(\d+)\.", name)
        if m:
            layers.setdefault(int(m.group(1)), []).append(name)
        else:
            other.append(name)
    return ([other] if other else []) + [layers[k] for k in sorted(layers)]
