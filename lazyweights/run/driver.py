"""Executors: run a compiled schedule. One loop (`run_tasks`) over block tasks, three ways to run them.

    "reference"   the op-at-a-time numpy specification (`reference.py`), for tests and debugging
    "sync"        every task inline, in order, on the calling thread
    "threads"     dask's threaded scheduler (the default): `workers` tasks at once; the kernels release
                  the GIL, so blocks really run in parallel
    Client        a dask.distributed Client: whole steps (or output shards, when saving) go to workers,
                  which read their own sources (see `distributed.py`)

The budget bounds working memory: at most `workers` blocks are in flight and the compiler sized blocks so
that many fit (`schedule.py`). The result arrays themselves are the caller's (or the file's), not working
memory.

`materialize` returns name -> array. Steps of kind "view" return zero-copy views of the memory map.

Example:
    >>> import numpy as np
    >>> from lazyweights import WeightData, DType, plan
    >>> w = WeightData.from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    >>> plan({"t": w.T.astype(DType.float16)}).materialize(scheduler="sync")["t"].tolist()
    [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
"""
from __future__ import annotations

import errno
import threading
from typing import Callable, Mapping, Sequence

import numpy as np

from ..core.device import DeviceRef
from ..core.errors import DTypeError, ExecutionError, LazyWeightsError, ShapeError, SourceChangedError
from .progress import Progress
from .blocks import full_view, write_rows

Task = tuple  # (step, rows)


def resolve_scheduler(scheduler):
    """'sync' | 'threads' | None (threads) | a dask.distributed Client."""
    if scheduler in (None, "threads", "threading"):
        return "threads"
    if scheduler in ("sync", "synchronous", "single-threaded"):
        return "sync"
    if scheduler == "reference":
        return "reference"
    if type(scheduler).__name__ == "Client" and hasattr(scheduler, "submit"):
        return scheduler
    raise LazyWeightsError(f"unknown scheduler {scheduler!r}; use 'sync', 'threads' or a dask.distributed Client")


def run_tasks(tasks: Sequence[Task], run_one: Callable[[Task], int], scheduler="threads",
              workers: int | None = None, progress: Progress | None = None) -> None:
    """Run every task; `run_one` returns the bytes it produced (for progress). The first failure stops
    the rest: tasks not yet started are skipped and the error propagates, naming the tensor."""
    from ..compiler.steps import default_workers

    cancelled = threading.Event()
    # FIX (hardening): dask's get() raises as soon as one task fails, while other tasks may still be running.
    # Their late writes then went to a file descriptor the caller had already closed (abort), or, if the
    # number was reused meanwhile, into an unrelated file. Count running tasks; return only when none are.
    idle = threading.Condition()
    running = [0]

    def guarded(i: int) -> int:
        with idle:
            if cancelled.is_set():
                return 0
            running[0] += 1
        task = tasks[i]
        try:
            try:
                done = run_one(task)
            except BaseException as e:
                cancelled.set()
                named = _name_error(e, task)
                raise named from (None if named is e else e)
        finally:
            with idle:
                running[0] -= 1
                idle.notify_all()
        if progress is not None:
            progress.advance(done)
        return done

    if scheduler == "sync" or len(tasks) <= 1:
        for i in range(len(tasks)):
            guarded(i)
        return
    import dask
    import dask.threaded

    # One key per task, no dependencies: dask's local scheduler keeps at most num_workers running, which
    # is what bounds bytes in flight.
    dsk = {("lw-block", i): (guarded, i) for i in range(len(tasks))}
    try:
        dask.threaded.get(dsk, list(dsk), num_workers=workers or default_workers())
    finally:
        with idle:
            cancelled.set()
            while running[0]:
                idle.wait()


def _name_error(e: BaseException, task: Task) -> BaseException:
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


def materialize(plan, device=None, budget=None, scheduler=None, progress=False,
                out: Mapping[str, np.ndarray] | None = None, workers: int | None = None,
                block_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Compute every output of `plan`; see `Plan.materialize`."""
    from ..compiler.steps import compile_steps

    device = DeviceRef.parse(device)
    if device.is_gpu:
        from .gpu import materialize_gpu

        return materialize_gpu(plan, device=device, budget=budget, progress=progress, out=out)
    sched = resolve_scheduler(scheduler)
    if sched == "reference":
        from .reference import materialize_reference

        return materialize_reference(plan, out=out)
    if not isinstance(sched, str):
        from .distributed import materialize_distributed

        return materialize_distributed(plan, sched, budget=budget, out=out)
    out = dict(out or {})
    for name in out:
        if name not in plan.outputs:
            raise LazyWeightsError(f"destination given for {name!r}, which is not an output of the plan")
    steps = compile_steps(plan, budget=budget, workers=workers, block_bytes=block_bytes,
                          materialize=True)
    wait_for_kernels = prepare_kernels(steps)
    result: dict[str, np.ndarray] = {}
    fresh: list[np.ndarray] = []
    tasks: list[Task] = []
    for step in steps:
        dsts = [n for n in step.outputs if n in out]
        if step.kind == "view" and not dsts:
            view = full_view(step.node)
            for name in step.outputs:
                result[name] = view
            continue
        for name in dsts:
            _check_destination(name, plan.outputs[name], out[name])
        if dsts:
            primary = out[dsts[0]].reshape(step.node.shape)
        else:
            primary = np.empty(step.node.shape, step.node.dtype.to_numpy())
            fresh.append(primary)
        # (step.node may have the output's leading axes merged: the same bytes, so a reshape is a view)
        shape = plan.outputs[step.outputs[0]].shape
        shaped = primary if primary.shape == shape else primary.reshape(shape)
        for name in step.outputs:
            result[name] = out[name] if name in out else shaped
        extra = [out[n].reshape(step.node.shape) for n in dsts[1:]]
        for rows in step.blocks:
            tasks.append((step, rows, primary, extra))
    if wait_for_kernels:
        from ..kernels import casts

        _prefault(fresh)
        casts.warm_up(wait=True)
    bar = Progress(sum(task_bytes(t) for t in tasks), "materialize") if progress else None
    run_tasks(tasks, _materialize_block, sched, workers, bar)
    if bar:
        bar.close()
    return {name: result[name] for name in plan.outputs}


# With numba's kernels (the C extension not built), plans that cast at least this much wait for them
# (about 0.85 s to load per process, then 30 GB/s); smaller ones cast with numpy (about 3 GB/s per thread)
# and never load numba. Waiting pays early because loading overlaps the first touch of the fresh output
# memory (`_prefault`), which every in-memory result pays anyway: on the 2.2 GB W1 workload,
# numba-with-prefault served in a median 1.55 s against 2.54 s for numpy alone (benchmarks/RESULTS.md).
# The C kernels load in a millisecond, so every plan uses them and nothing is pre-faulted: the worker
# threads first-touch their own output blocks in parallel. Either way the bits are the same.
NUMBA_WAIT_BYTES = 256 << 20


def prepare_kernels(steps) -> bool:
    """Whether the caller should wait for the compiled kernels, doing what it can meanwhile (pre-faulting
    outputs): True only when numba's kernels are still loading and this plan casts enough to be worth
    waiting for them, in which case loading has started. The C kernels are loaded here, at once."""
    from ..kernels import casts

    if casts.HAVE_C:
        casts.warm_up(wait=True)
        return False
    cast_bytes = sum(n.nbytes for s in steps for n in s.nodes if n.op == "cast")
    if cast_bytes < NUMBA_WAIT_BYTES:
        return False
    casts.warm_up(wait=False)
    return True


def _prefault(arrays) -> None:
    """Touch one byte per page of fresh output arrays, so the kernel backs them now (while numba loads on
    the other thread) rather than during the casts. Releases the GIL (a strided numpy store)."""
    for a in arrays:
        if a.nbytes >= (1 << 20):
            a.reshape(-1).view(np.uint8)[::4096] = 0


def task_bytes(task: Task) -> int:
    """Output bytes one block task produces."""
    node, rows = task[0].node, task[1]
    if not node.shape:
        return node.nbytes
    return node.nbytes // max(1, node.shape[0]) * len(rows)


def _materialize_block(task: Task) -> int:
    step, rows, primary, extra = task
    node = step.node
    for r in step.sources:
        # A truncated map would SIGBUS: check identity before touching pages. (A truncation after this check
        # reaches the C casts as EFAULT, which _name_error reports as SourceChangedError; numpy would die.)
        r.file.check_unchanged(r.name)
    cache: dict = {}
    if not node.shape:
        tmp = np.empty((), node.dtype.to_numpy())
        write_rows(node, rows, tmp.reshape(()), cache)
        primary[...] = tmp
    else:
        write_rows(node, rows, primary[rows.start:rows.stop], cache)
    for dst in extra:
        dst[rows.start:rows.stop] = primary[rows.start:rows.stop] if node.shape else primary
    return primary[rows.start:rows.stop].nbytes if node.shape else primary.nbytes


def _check_destination(name, node, dst: np.ndarray) -> None:
    if not isinstance(dst, np.ndarray):
        raise DTypeError(f"destination for {name!r} must be a numpy array, got {type(dst).__name__}")
    if dst.dtype != node.dtype.to_numpy():
        raise DTypeError(f"destination for {name!r} is {dst.dtype}, the plan produces {node.dtype.name}")
    if dst.size != node.size or (dst.shape != node.shape and not dst.flags.c_contiguous):
        raise ShapeError(f"destination for {name!r} has shape {list(dst.shape)}, the plan produces {list(node.shape)}")
    if not dst.flags.writeable:
        raise LazyWeightsError(f"destination for {name!r} is read-only")
