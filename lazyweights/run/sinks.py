"""Where the blocks of a run go: into memory (`MemorySink`) or into writers at byte offsets (`WriterSink`).

A sink turns compiled steps into `BlockTask`s and runs one task at a time on a worker thread (see
`run/driver.py`). A writer is anything with `write(offset, data, tensor=None)`: the atomic output files of
`formats/` (safetensors, GGUF), or a hash (`tools/verify.py`), which needs its tensor's blocks in order and
so asks for `ordered=True` (one task per tensor, running its blocks in row order).

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> from lazyweights.run.driver import execute
    >>> class Collect:                       # a writer: keeps (offset, bytes) pairs
    ...     def __init__(self): self.parts = []
    ...     def write(self, offset, data, tensor=None): self.parts.append((offset, data.tobytes()))
    >>> node = ops.cast(ops.const(np.arange(4, dtype=np.float32)), "float16")
    >>> w = Collect()
    >>> _ = execute({"x": node}, WriterSink({"x": [(w, 100)]}), scheduler="sync")
    >>> w.parts == [(100, np.arange(4, dtype=np.float16).tobytes())]
    True
"""
from __future__ import annotations

import threading
from typing import Any, Mapping

import numpy as np

from ..compiler.steps import Step
from ..core.errors import DTypeError, ExecutionError, ShapeError, UsageError
from ..graph.node import Node
from .blocks import full_view, pull, write_rows
from .driver import BlockTask
from .fetch import RECEIVE, ViewFetch, fetch_step_sources, fetch_views, is_remote_record, receive_into
from .prefault import prefault_in_background


def check_unchanged_sources(step: Step) -> None:
    """Raise SourceChangedError if a source of `step` changed on disk. Call before touching its pages:
    a truncated map would SIGBUS. (A truncation after this check reaches the C casts as EFAULT, which
    `driver.name_error` reports as SourceChangedError.)"""
    for r in step.sources:
        r.file.check_unchanged(r.name)


class MemorySink:
    """Results in memory: name -> array. Zero-copy views of the sources are returned as they are;
    `out={name: array}` fills the caller's buffers in place (checked before any work)."""

    label = "materialize"
    keep_views = True
    in_place = True  # blocks are computed straight into the results

    def __init__(self, outputs: Mapping[str, Node], out: Mapping[str, np.ndarray] | None = None):
        self.outputs = dict(outputs)
        self.out = dict(out or {})
        for name in self.out:
            if name not in self.outputs:
                raise UsageError(f"destination given for {name!r}, which is not an output of the plan")
        self._result: dict[str, np.ndarray] = {}
        self._views: ViewFetch | None = None  # the views' fetch (`fetch_views`), waited for by `result`

    def tasks(self, steps: list[Step]) -> list[BlockTask]:
        """One task per block of every step; results are allocated (or taken from `out`) before any block runs,
        and view steps are answered at once with a zero-copy view.
        """
        out, tasks, remote_results = self.out, [], []
        # a remote map holds only what was fetched: the views' bytes are fetched all together, kept for good,
        # while the blocks run; `result()` waits for them
        self._views = fetch_views([s for s in steps if s.kind == "view" and not any(n in out for n in s.outputs)])
        for step in steps:
            dsts = [n for n in step.outputs if n in out]
            if step.kind == "view" and not dsts:
                view = full_view(step.node)
                if view is None:  # the compiler makes a "view" step only of what graph.layout.view_of replays
                    raise ExecutionError(f"step for {step.outputs[0]!r} was compiled as a view but is not one",
                                         step.outputs[0])
                for name in step.outputs:
                    self._result[name] = view
                continue
            for name in dsts:
                check_destination(name, self.outputs[name], out[name])
            if dsts:
                primary = out[dsts[0]].reshape(step.node.shape)
            else:
                primary = np.empty(step.node.shape, step.node.dtype.to_numpy())
                if any(map(is_remote_record, step.sources)):
                    remote_results.append(primary)
            # (step.node may have the output's leading axes merged: the same bytes, so a reshape is a view)
            shape = self.outputs[step.outputs[0]].shape
            shaped = primary if primary.shape == shape else primary.reshape(shape)
            for name in step.outputs:
                self._result[name] = out[name] if name in out else shaped
            extra = [out[n].reshape(step.node.shape) for n in dsts[1:]]
            cache: dict = {}  # one per step, shared by its blocks (BlockTask.cache)
            receive_into(step, primary, cache)  # a remote copy or cast: bytes straight into the result
            tasks += [BlockTask(step, rows, (primary, extra), cache) for rows in step.blocks]
        # Results written as remote bytes arrive are faulted in at once, from another thread (`run/prefault`)
        prefault_in_background(remote_results)
        return tasks

    def run_block(self, task: BlockTask) -> int:
        """Compute one block straight into its result rows (and copy it to any extra outputs of the step).
        Returns the bytes written.
        """
        step, rows, (primary, extra), cache = task
        node = step.node
        check_unchanged_sources(step)
        cache = {} if cache is None else cache
        fetch_step_sources(step, cache)
        if RECEIVE in cache:
            pass  # received into the result, cast as it arrived (`run/fetch.receive_into`)
        elif not node.shape:
            tmp = np.empty((), node.dtype.to_numpy())
            write_rows(node, rows, tmp.reshape(()), cache)
            primary[...] = tmp
        else:
            write_rows(node, rows, primary[rows.start:rows.stop], cache)
        for dst in extra:
            dst[rows.start:rows.stop] = primary[rows.start:rows.stop] if node.shape else primary
        return primary[rows.start:rows.stop].nbytes if node.shape else primary.nbytes

    def result(self) -> dict[str, np.ndarray]:
        """{output name: array}, in plan order, once every task has run (and every view's bytes are here)."""
        if self._views is not None:
            views, self._views = self._views, None
            views.wait()
        return {name: self._result[name] for name in self.outputs}


def check_destination(name: str, node: Node, dst: np.ndarray) -> None:
    """A caller's `out=` buffer must be a writable numpy array of the output's dtype and size."""
    if not isinstance(dst, np.ndarray):
        raise DTypeError(f"destination for {name!r} must be a numpy array, got {type(dst).__name__}")
    if dst.dtype != node.dtype.to_numpy():
        raise DTypeError(f"destination for {name!r} is {dst.dtype}, the plan produces {node.dtype.name}")
    if dst.size != node.size or (dst.shape != node.shape and not dst.flags.c_contiguous):
        raise ShapeError(f"destination for {name!r} has shape {list(dst.shape)}, the plan produces {list(node.shape)}")
    if not dst.flags.writeable:
        raise UsageError(f"destination for {name!r} is read-only")


_scratch = threading.local()


def scratch_block(nbytes: int) -> np.ndarray:
    """A per-thread reusable byte buffer, so blocks do not allocate (and fault in) fresh memory."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 1), np.uint8)
        _scratch.buf = buf
    return buf[:nbytes]


class WriterSink:
    """Blocks written at byte offsets: `targets[name]` is a list of (writer, offset of the tensor's first
    byte). `ordered=True` runs each tensor's blocks in row order within one task (for hashes)."""

    label = "save"
    keep_views = False  # bytes must move anyway: a view of the map is copied block by block
    in_place = False  # each block is computed into a scratch buffer, then written out from it

    def __init__(self, targets: Mapping[str, list[tuple[Any, int]]], *, ordered: bool = False, label: str = "save"):
        self.targets = targets
        self.ordered = ordered
        self.label = label

    def tasks(self, steps: list[Step]) -> list[BlockTask]:
        """One task per block (or, when `ordered`, one per step so each target is written front to back)."""
        if self.ordered:
            return [BlockTask(s, range(0, s.node.shape[0] if s.node.shape else 1), self._targets(s), {})
                    for s in steps]
        tasks = []
        for s in steps:
            targets = self._targets(s)
            cache: dict[Node, Any] = {}  # one cache per step, shared by its blocks
            tasks += [BlockTask(s, rows, targets, cache) for rows in s.blocks]
        return tasks

    def _targets(self, step: Step) -> list[tuple[Any, int]]:
        return [t for name in step.outputs for t in self.targets.get(name, ())]

    def run_block(self, task: BlockTask) -> int:
        """Compute and write one task's rows to every target; returns the bytes produced."""
        if self.ordered:
            return sum(write_block(task._replace(rows=rows)) for rows in task.step.blocks)
        return write_block(task)


def write_block(task: BlockTask) -> int:
    """Compute one block into a per-thread scratch buffer (or take it straight from the map when it is a
    contiguous view) and write it to each of the task's (writer, offset) targets."""
    step, rows, targets, cache = task
    node = step.node
    cache = {} if cache is None else cache
    check_unchanged_sources(step)
    fetch_step_sources(step, cache)
    row_bytes = node.nbytes // node.shape[0] if node.shape else node.nbytes
    start = rows.start * row_bytes if node.shape else 0
    block_shape = (len(rows),) + node.shape[1:] if node.shape else ()
    data = None
    if step.kind == "copy":
        view = pull(node, rows, cache)
        if view.flags.c_contiguous:
            data = view  # straight from the memory map to the file: no copy in between
    if data is None:
        nbytes = row_bytes * len(rows) if node.shape else node.nbytes
        data = scratch_block(nbytes).view(node.dtype.to_numpy()).reshape(block_shape)
        write_rows(node, rows, data, cache)
    for writer, offset in targets:
        writer.write(offset + start, data, tensor=step.outputs[0])
    return data.nbytes
