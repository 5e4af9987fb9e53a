"""The one driver: compiled steps + a sink + keyword options -> every block run, in parallel, under the budget.

Every way of running a plan is a *sink* handed to `execute` (the way dask's `get_sync` and `threaded.get`
are front-ends over `local.get_async`):

    MemorySink   results in memory (fresh arrays, or the caller's `out=` buffers)     `run/sinks.py`
    WriterSink   blocks `pwrite`n at their offsets in files (safetensors, GGUF), or,  `run/sinks.py`
                 in order, into hashes (verify)

`execute` compiles the outputs into steps (`compiler/steps.py`), asks the sink for its block tasks, makes
sure the cast kernels are loaded (the one place that decides whether to wait for them), and runs the tasks.
`resolve_scheduler` is the one place a `scheduler=` argument is understood:

    "sync"        every task inline, in order, on the calling thread
    "threads"     `workers` threads taking the tasks in order (the default); the kernels release the
                  GIL, so blocks really run in parallel
    "reference"   the op-at-a-time numpy specification (`run/reference.py`); front-ends dispatch it
    Client        a dask.distributed Client; front-ends dispatch it (`run/distributed.py`, `lazy/save.py`)

The budget bounds working memory: at most `workers` blocks are in flight and the compiler sized blocks so
that many fit. The first failing block stops the rest; the error names the tensor (`name_error`).

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> from lazyweights.run.sinks import MemorySink
    >>> x = ops.const(np.arange(6, dtype=np.float32).reshape(3, 2))
    >>> sink = MemorySink({"t": ops.cast(ops.permute(x, (1, 0)), "float16")})
    >>> _ = execute(sink.outputs, sink, scheduler="sync")
    >>> sink.result()["t"].tolist()
    [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
"""
from __future__ import annotations

import errno
import itertools
import threading
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence

from ..compiler.steps import DEFAULT_BUDGET, Step, compile_steps
from ..core.errors import ExecutionError, LazyWeightsError, SourceChangedError, UsageError
from ..core.units import available_cpus, parse_size
from ..graph.node import Node
from ..kernels import casts
from .fetch import remote_reads
from .progress import Progress

SCHEDULERS = ("sync", "threads", "reference")


class BlockTask(NamedTuple):
    """One unit of work: rows `rows` of `step`, going where `target` says (the sink's business). `cache`
    is the pull cache (`run/blocks.pull`) the blocks of one step share: views of the maps and gather
    facts, worked out by the step's first block instead of by every block."""

    step: Step
    rows: range
    target: Any = None
    cache: dict | None = None


class Sink(Protocol):
    """Where a run's blocks go. `execute` calls `tasks`, then `run_block` for every task, on worker threads."""

    label: str
    keep_views: bool  # True: zero-copy views of the sources are results as they are (no block to run)
    in_place: bool  # True: blocks are computed into memory that keeps them (nothing reads them back)

    def tasks(self, steps: list[Step]) -> list[BlockTask]:
        """The blocks to run for these compiled steps (the sink allocates or opens its targets here)."""
        ...

    def run_block(self, task: BlockTask) -> int:
        """Compute one block and deliver it; returns the bytes it produced (for progress)."""
        ...


def resolve_scheduler(scheduler):
    """'sync' | 'threads' | 'reference' | a dask.distributed Client, from what a caller may pass."""
    if scheduler in (None, "threads", "threading"):
        return "threads"
    if scheduler in ("sync", "synchronous", "single-threaded"):
        return "sync"
    if scheduler == "reference":
        return "reference"
    if type(scheduler).__name__ == "Client" and hasattr(scheduler, "submit"):
        return scheduler
    raise UsageError(f"unknown scheduler {scheduler!r}; use 'sync', 'threads' or a dask.distributed Client")


def execute(outputs: Mapping[str, Node], sink: Sink, *, scheduler="threads", budget=None,
            workers: int | None = None, block_bytes: int | None = None, progress: bool = False) -> list[Step]:
    """Compile `outputs` (name -> node), run every block `sink` asks for; returns the compiled steps.

    `scheduler` must resolve to "sync" or "threads" (front-ends dispatch "reference" and Clients first)."""
    sched = resolve_scheduler(scheduler)
    if not isinstance(sched, str) or sched == "reference":
        raise UsageError(f"execute() runs blocks locally; scheduler {scheduler!r} is dispatched by the front-ends")
    steps = compile_steps(outputs, budget=budget, workers=workers, block_bytes=block_bytes,
                          keep_views=sink.keep_views, in_place=sink.in_place)
    return _execute(steps, sink, sched, workers, progress, parse_size(budget) or DEFAULT_BUDGET)


def _execute(steps, sink: Sink, sched: str, workers, progress, window: int):
    tasks = sink.tasks(steps)
    # Remote sources: fetched ahead within the budget while blocks compute, released once read
    # (`run/fetch.RemoteReads`), so a remote checkpoint streams through bounded memory.
    reads = remote_reads(tasks, window)
    run_one = sink.run_block
    if reads is not None:
        def run_one(task: BlockTask) -> int:
            done = sink.run_block(task)
            reads.task_done(task)
            return done
    casts.warm_up()  # load and self-check the C casts once, here rather than in the first worker
    bar = Progress(sum(task_bytes(t) for t in tasks), sink.label) if progress else None
    try:
        run_tasks(tasks, run_one, scheduler=sched, workers=workers, progress=bar)
    finally:
        if reads is not None:
            reads.stop()
        if bar:
            bar.close()
    return steps


def run_tasks(tasks: Sequence[BlockTask], run_one: Callable[[BlockTask], int], *, scheduler="threads",
              workers: int | None = None, progress: Progress | None = None) -> None:
    """Run every task; `run_one` returns the bytes it produced (for progress). The first failure stops
    the rest: tasks not yet started are skipped, tasks already running finish, and only then does the
    error propagate, naming the tensor (a late write must never reach a file the caller has closed:
    tests/run/test_faults.py). With "threads", `workers` threads (the calling one among them) take the
    tasks in order, so reads sweep each file forward and at most `workers` blocks are in flight."""
    cancelled = threading.Event()

    def guarded(i: int) -> None:
        if cancelled.is_set():
            return
        task = tasks[i]
        try:
            done = run_one(task)
        except BaseException as e:
            cancelled.set()
            named = name_error(e, task)
            raise named from (None if named is e else e)
        if progress is not None:
            progress.advance(done)

    if scheduler == "sync" or len(tasks) <= 1:
        for i in range(len(tasks)):
            guarded(i)
        return
    # The tasks are independent, so a shared counter is the whole scheduler. It replaced dask's threaded
    # scheduler, whose graph bookkeeping cost about 70 us a block on the 2-core VM (W1's 637 blocks:
    # 45 ms of a 0.5 s run) and whose import cost 0.13 s in a fresh process (benchmarks/RESULTS.md).
    counter = itertools.count()  # next() on it is atomic: it holds the GIL throughout
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while not cancelled.is_set():
                i = next(counter)
                if i >= len(tasks):
                    return
                guarded(i)
        except BaseException as e:  # the first one wins; guarded() has already cancelled the rest
            cancelled.set()
            errors.append(e)

    threads = [threading.Thread(target=worker, name=f"lazyweights-block-{k}", daemon=True)
               for k in range(min(workers or available_cpus(), len(tasks)) - 1)]
    for t in threads:
        t.start()
    interrupted = None
    try:
        worker()
    finally:
        for t in threads:  # wait for every block in flight, even through a ^C
            while t.is_alive():
                try:
                    t.join()
                except KeyboardInterrupt as e:
                    cancelled.set()
                    interrupted = e
    if interrupted is not None:
        raise interrupted
    if errors:
        raise errors[0]


def name_error(e: BaseException, task: BlockTask) -> BaseException:
    """The error to raise for `e`, raised while running `task`: one that names the tensor and rows."""
    step, rows = task[0], task[1]
    name = step.outputs[0]
    changed = source_fault_error(e, step)
    if changed is not None:
        return changed
    if isinstance(e, LazyWeightsError):
        return e
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        return e
    span = f"rows {rows.start}..{rows.stop}" if isinstance(rows, range) else "rows"
    return ExecutionError(f"computing tensor {name!r} ({span}) failed: {type(e).__name__}: {e}", tensor=name)


def source_fault_error(e: BaseException, step) -> SourceChangedError | None:
    """The SourceChangedError to raise instead of `e` if `e` is a read of a memory-mapped source page that
    no longer exists, else None.

    Why: the executors check each source's size and identity before a block, but a file can still be
    truncated while the block reads it. The compiled casts then raise OSError(EFAULT) (their SIGBUS guard,
    `kernels/_ccasts.c`), and so does the kernel for a write() straight from such a page (a save's copy
    steps; it arrives wrapped in the output's WriteError). Either way the output is innocent: name the
    source that changed, as the check before the block would have.
    """
    faults = [x for x in (e, e.__cause__) if isinstance(x, OSError) and x.errno == errno.EFAULT]
    if not faults:
        return None
    cause = faults[0]
    for r in step.sources:
        try:
            r.file.check_unchanged(r.name)
        except SourceChangedError as changed:
            return changed
    sources = ", ".join(sorted({r.file.path for r in step.sources})) or "no file"
    return SourceChangedError(
        f"computing tensor {step.outputs[0]!r}: a page of a memory-mapped source ({sources}) could not be "
        f"read ({cause.strerror}); the file may have been truncated and restored meanwhile. "
        "Reload it with load_weights()."
    )


def task_bytes(task: BlockTask) -> int:
    """Output bytes one block task produces."""
    node, rows = task[0].node, task[1]
    if not node.shape:
        return node.nbytes
    return node.nbytes // max(1, node.shape[0]) * len(rows)
