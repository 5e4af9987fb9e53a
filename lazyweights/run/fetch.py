"""Before a step's blocks read a remote source, fetch exactly the byte ranges the step reads.

The executors read sources through views of their maps (`blocks.real_base`). A local map has every byte; a
remote object's mirror (`io/remote.RemoteFile`) has only what was fetched. So before the first block of a step
runs, `fetch_step_sources` walks the step's graph: each maximal chain of view ops over a remote source
(slices, reshapes, permutes: a tensor-parallel rank's slice) is replayed on the unfetched mirror, and the bytes
that numpy view covers are fetched, one run per contiguous stretch (a row-parallel slice is one run per row).
A source under anything else is fetched whole. What a step reads is therefore exactly what is fetched
(tests/io/test_remote_slices.py counts it at the server).
"""
from __future__ import annotations

import logging
import os
import threading

import numpy as np

from ..graph.layout import view_of
from ..graph.node import Node
from ..graph.opcodes import GroupOp, Op
from ..io.source import SourceRecord, is_remote

_log = logging.getLogger(__name__)

_DONE = "remote sources fetched"
_LOCK = "remote sources lock"
_READS = "remote reads"


def _usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: every core counts
        return os.cpu_count() or 1


# Steps fetched ahead at once: each thread receives and casts (CPU work), so a core each plus one to cover
# the request gaps, up to 4. W1 over nginx: 4 against 1 (benchmarks/RESULTS.md); on 2 cores 3 against 4 took
# 2.24 s / 2.68 s CPU against 2.34 s / 2.98 s (medians of 8). (3 once exposed a release race, since fixed:
# `RemoteFile._doomed`.)
PREFETCH_THREADS = min(4, _usable_cores() + 1)
RECEIVE = "receive into the output"  # a step cache key: (file, start, end, output bytes, convert, unit)


def _unfetched_base(node: Node) -> np.ndarray:
    return node.arg.array(check=False, fetch=False) if node.op is Op.SOURCE else node.arg.array


def is_remote_record(record: SourceRecord) -> bool:
    """Whether `record`'s bytes come over a network (its file is a remote object)."""
    return is_remote(record.file)


def view_byte_ranges(v: np.ndarray, base: np.ndarray) -> list[tuple[int, int]]:
    """The byte ranges of `base` (a uint8 buffer) that the numpy view `v` of it covers, merged and sorted.

    >>> base = np.arange(64, dtype=np.uint8)
    >>> view_byte_ranges(base.view(np.uint16).reshape(4, 8)[:, 2:4], base)
    [(4, 8), (20, 24), (36, 40), (52, 56)]
    """
    if v.size == 0:
        return []
    start = v.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    dims = sorted(((n, st) for n, st in zip(v.shape, v.strides) if n != 1), key=lambda d: -abs(d[1]))
    lo = start + sum((n - 1) * st for n, st in dims if st < 0)  # a negative stride starts below the pointer
    dims = [(n, abs(st)) for n, st in dims]
    run = v.itemsize
    while dims and dims[-1][1] == run:  # innermost dims laid end to end are one contiguous run
        run *= dims[-1][0]
        dims.pop()
    if not dims:  # one contiguous run (every receive of a whole tensor)
        return [(lo, lo + run)]
    offsets = np.zeros(1, np.int64)
    for n, st in dims:
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64) * st).ravel()
    # sorted, not np.unique: the merge below folds repeats, and np.unique imports numpy.ma (10-20 ms, in the
    # time before a remote load's first request)
    offsets = np.sort(offsets) + lo
    out: list[tuple[int, int]] = []
    for o in offsets.tolist():
        if out and o <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], o + run))
        else:
            out.append((o, o + run))
    return out


def remote_ranges(node: Node) -> dict:
    """{remote file: [(start, end), ...]}: the bytes of remote sources `node`'s value reads."""
    out: dict = {}
    cache: dict = {}
    seen: set = set()

    def leaf(n: Node) -> Node:
        while n.op in GroupOp.View:
            n = n.srcs[0]
        return n

    def walk(n: Node) -> None:
        if n in seen:
            return
        seen.add(n)
        src = leaf(n)
        if src.op is Op.SOURCE:
            if not is_remote_record(src.arg):
                return
            v = view_of(n, _unfetched_base, cache)
            if v is not None:
                base = src.arg.file.whole_view()
                out.setdefault(src.arg.file, []).extend(view_byte_ranges(v, base))
                return
            if n is src:
                out.setdefault(src.arg.file, []).append((src.arg.offset, src.arg.offset + src.arg.nbytes))
                return
        for s in n.srcs:
            walk(s)

    walk(node)
    return out


def fetch_step_sources(step, cache: dict | None) -> None:
    """Fetch the remote bytes `step` reads, once per step (the blocks of a step share `cache`)."""
    if not any(is_remote_record(r) for r in step.sources):
        return
    if cache is None:
        cache = {}
    if cache.get(_DONE):
        return
    with cache.setdefault(_LOCK, threading.Lock()):  # setdefault is atomic: one lock per step
        if cache.get(_DONE):
            return
        reads = cache.get(_READS)
        receive = cache.get(RECEIVE)
        if receive is not None:
            file, start, end, out, convert, unit = receive
            file.receive(start, end, out, convert, unit)
        elif reads is not None:
            reads.fetch(step)
        else:
            for file, ranges in remote_ranges(step.node).items():
                file.ensure_ranges(sorted(ranges))
        cache[_DONE] = True


class ViewFetch:
    """The fetch `fetch_views` started: `wait()` returns once every view's bytes are present, or raises the
    first failure."""

    def __init__(self, threads: list[threading.Thread], errors: list[BaseException]):
        self._threads, self._errors = threads, errors

    def wait(self) -> None:
        """Block until the views' bytes are fetched; raise the first error."""
        for t in self._threads:
            t.join()
        if self._errors:
            raise self._errors[0]


def fetch_views(steps) -> ViewFetch | None:
    """Start fetching, all at once, the remote bytes of steps whose results are zero-copy views of them (a
    rank's slices, untransformed tensors: `MemorySink` view steps), and keep those bytes for good: the results
    alias them, so no later run may release them. Returns a `ViewFetch` to wait on (None: nothing remote),
    so the views' bytes arrive while the run's blocks compute.

    One `ensure_ranges` per file with every step's ranges: the requests are planned together (small runs
    share multi-range requests, big ones go in parts) and kept in flight together, where fetching step by
    step would wait for each tensor's round trip in turn."""
    by_file: dict = {}
    for step in steps:
        if any(is_remote_record(r) for r in step.sources):
            for file, ranges in remote_ranges(step.node).items():
                by_file.setdefault(file, []).extend(ranges)
    if not by_file:
        return None
    errors: list[BaseException] = []

    def one(file, ranges) -> None:
        try:
            file.ensure_pinned(sorted(ranges))  # pinned under a lease: no other run's release gets between
        except BaseException as e:  # raised below, after every file's fetch has ended
            errors.append(e)

    threads = [threading.Thread(target=one, args=item, name="lazyweights-fetch-views", daemon=True)
               for item in by_file.items()]
    for t in threads:
        t.start()
    return ViewFetch(threads, errors)


def receive_target(step, out: np.ndarray) -> tuple | None:
    """(file, start, end, rows) when `step`'s remote bytes can be received straight into its output `out`:
    the step is a copy, or a cast between dtypes of one width, of one contiguous run of a remote source's bytes
    (a whole tensor, or a rank's slice of whole rows) that fills `out` exactly (`rows` None), or of a whole
    tensor whose rows reach `out` in another order (`rows`: the output row of each source row; a RoPE q/k
    permutation, `source_row_order`). Then a cast is done as the bytes arrive (`receive_into`) and each byte is
    written once, as a plain download would (with a `cache=` directory, the cache's writer gets them from a
    small pool of buffers, `io/cached_receive.py`). None otherwise (the bytes go through the source's map)."""
    node = step.node
    if not node.shape or not out.flags.c_contiguous or out.nbytes == 0:
        return None
    src = node
    if node.op is Op.CAST:
        src = node.srcs[0]
        if src.dtype.size_in_bytes != node.dtype.size_in_bytes:
            return None
    leaf = src
    while leaf.op in GroupOp.View or leaf.op is Op.TAKE:
        leaf = leaf.srcs[0]
    if leaf.op is not Op.SOURCE or not is_remote_record(leaf.arg) or not hasattr(leaf.arg.file, "receive"):
        return None
    if any(n.op is Op.TAKE for n in _layout_chain(src)):  # not a numpy view: rows in another order, or none
        rows = source_row_order(src)
        if rows is None or leaf.arg.nbytes != out.nbytes or leaf.shape[-1] * src.dtype.size_in_bytes > ROW_MAX:
            return None
        return leaf.arg.file, leaf.arg.offset, leaf.arg.offset + leaf.arg.nbytes, rows
    v = view_of(src, _unfetched_base, {})
    if v is None:
        return None
    ranges = view_byte_ranges(v, leaf.arg.file.whole_view())
    if len(ranges) != 1 or ranges[0][1] - ranges[0][0] != out.nbytes:
        return None
    if v.flags.c_contiguous:
        return leaf.arg.file, ranges[0][0], ranges[0][1], None
    rows = source_row_order(src)
    if rows is None or leaf.shape[-1] * src.dtype.size_in_bytes > ROW_MAX:
        return None
    return leaf.arg.file, ranges[0][0], ranges[0][1], rows


ROW_MAX = 256 << 10  # a row received whole into the receiving thread's 1 MiB buffer (`io/transport.Converting`)


def _layout_chain(node: Node) -> list[Node]:
    """The layout ops from `node` down to its first other op, top first."""
    chain = []
    while node.op in GroupOp.Layout:
        chain.append(node)
        node = node.srcs[0]
    return chain


def source_row_order(node: Node) -> np.ndarray | None:
    """For layout ops over a SOURCE that move whole rows (last-axis runs) and keep every row once, each
    output row's destination: `order[r]` is where source row r (in the source's row-major order) lands in
    `node`'s rows. None when an op moves elements within a row, or rows are dropped or repeated.

    >>> from types import SimpleNamespace
    >>> from lazyweights.graph import ops
    >>> from lazyweights.core.dtype import DType
    >>> from lazyweights.formats.source import TensorRecord
    >>> w = ops.source(TensorRecord(SimpleNamespace(size=24, path="w.bin"), "w", 0, 24, DType.bfloat16, (4, 3)))
    >>> halves = ops.reshape(ops.take(ops.reshape(w, (2, 2, 3)), [1, 0], 1), (4, 3))  # swap the rows of each pair
    >>> source_row_order(halves).tolist()
    [1, 0, 3, 2]
    >>> source_row_order(ops.permute(w, (1, 0))) is None  # a transpose moves elements within rows
    True
    >>> source_row_order(ops.take(w, [0, 2], 0)) is None  # rows dropped
    True
    """
    chain = _layout_chain(node)
    leaf = chain[-1].srcs[0] if chain else node
    if leaf.op is not Op.SOURCE or len(leaf.shape) < 2:
        return None
    width = leaf.shape[-1]
    rows = int(np.prod(leaf.shape[:-1]))
    ids: np.ndarray = np.arange(rows, dtype=np.int64).reshape(leaf.shape[:-1])
    for n in reversed(chain):
        if not n.shape or n.shape[-1] != width:
            return None
        if n.op is Op.RESHAPE:
            ids = ids.reshape(n.shape[:-1])
        elif n.op is Op.PERMUTE:
            if n.arg[-1] != len(n.arg) - 1:
                return None
            ids = ids.transpose(n.arg[:-1])
        elif n.op is Op.TAKE:
            axis, index = n.arg
            if axis >= len(n.shape) - 1:
                return None
            ids = np.take(ids, index.array, axis=axis)
        else:  # a slice drops rows (and may cut into them)
            return None
    ids = ids.reshape(-1)
    if ids.size != rows:  # rows dropped or repeated
        return None
    order = np.full(rows, -1, np.int64)
    order[ids] = np.arange(rows, dtype=np.int64)
    if (order < 0).any():  # some rows repeated, so others missing
        return None
    return order


def receive_into(step, out: np.ndarray, cache: dict) -> bool:
    """Arrange for `step`'s bytes to be received straight into `out` (see `receive_target`); True when they
    will. A cast is done as the bytes arrive, on the thread receiving them (`RemoteFile.receive`'s `convert`):
    each piece goes from the socket into its place in `out` and is cast there while in cache (a copy, or a
    cast the kernel may do onto its own input: `_in_place`), or into that thread's cache-sized buffer and is
    cast from there into `out`; either way the blocks of the step have nothing left to do. Rows that land in
    another order are received a whole row at a time and put in their places (`_rows_from_pieces`)."""
    target = receive_target(step, out)
    if target is None:
        return False
    file, start, end, rows = target
    src_dtype = (step.node.srcs[0] if step.node.op is Op.CAST else step.node).dtype.to_numpy()
    if rows is not None:
        convert, unit = _rows_from_pieces(src_dtype, out, rows), out.shape[-1] * out.itemsize
    elif step.node.op is Op.CAST:
        convert, unit = _cast_from_pieces(src_dtype, out), out.itemsize
    else:  # a copy is received in its place (`_copy_from_pieces` then has nothing to do)
        convert, unit = _copy_from_pieces(out), 1
    cache[RECEIVE] = (file, start, end, out.reshape(-1).view(np.uint8).data, convert, unit)
    return True


def _rows_from_pieces(src_dtype: np.dtype, out: np.ndarray, order: np.ndarray):
    """convert(piece, offset) for `RemoteFile.receive`: `piece` holds whole source rows from byte `offset` of
    the tensor; each is cast (or copied) into output row `order[r]`, through a piece-sized scratch."""
    from ..kernels.casts import cast_into

    table = out.reshape(-1, out.shape[-1])
    width = table.shape[1]
    row_bytes = width * np.dtype(src_dtype).itemsize

    def convert(piece, offset: int) -> None:
        first, n = offset // row_bytes, len(piece) // row_bytes
        src = np.frombuffer(piece, src_dtype).reshape(n, width)
        if src.dtype != table.dtype:
            tmp = getattr(_ROWS, "buf", None)
            if tmp is None or tmp.size < src.size or tmp.dtype != table.dtype:
                tmp = _ROWS.buf = np.empty(max(src.size, BOUNCE_ELEMENTS), table.dtype)
            src = tmp[:src.size].reshape(n, width)
            cast_into(np.frombuffer(piece, src_dtype).reshape(n, width), src)
        table[order[first:first + n]] = src

    return convert


_ROWS = threading.local()  # each receiving thread's cast scratch for `_rows_from_pieces` (kept warm)
BOUNCE_ELEMENTS = 1 << 19


def _copy_from_pieces(out: np.ndarray):
    """convert(piece, offset) for `RemoteFile.receive`: `piece` is bytes `offset` onward of `out`, copied in;
    nothing to do when the piece was received in its place (`in_place`, see `_in_place`)."""
    flat = out.reshape(-1).view(np.uint8)
    base = flat.ctypes.data

    def convert(piece, offset: int) -> None:
        src = np.frombuffer(piece, np.uint8)
        if src.ctypes.data != base + offset:
            flat[offset:offset + len(src)] = src

    return _in_place(convert)


def _cast_from_pieces(src_dtype: np.dtype, out: np.ndarray):
    """convert(piece, offset) for `RemoteFile.receive`: the raw source bytes `piece` (whole elements of
    `src_dtype`, the same width as `out`'s) are byte `offset` onward of `out`, cast into place. Where the
    kernel may cast onto its own input (`kernels.casts.casts_in_place`), the pieces are received straight
    into `out` and cast there."""
    from ..kernels.casts import cast_into, casts_in_place

    flat = out.reshape(-1)
    size = flat.itemsize

    def convert(piece, offset: int) -> None:
        src = np.frombuffer(piece, src_dtype)
        first = offset // size
        cast_into(src, flat[first:first + src.size])  # in place when `piece` is its own place in `out`

    return _in_place(convert) if casts_in_place(src_dtype, flat.dtype) else convert


def _in_place(convert):
    """Mark `convert` as one `RemoteFile.receive` may hand pieces received straight into their places in the
    output (a copy, or an element-wise cast between dtypes of one width): the bytes then go from the socket
    into the output, and a cast is done over each 1 MiB piece there while it is in cache. On the 2-core Intel
    VM (issue 35, benchmarks/RESULTS.md) a plain download casting in place took 1.13 s for W1 against 1.28 s
    through a warm 1 MiB buffer, and copying through that buffer cost 1.77x receiving into place."""
    convert.in_place = True
    return convert


def _footprint(file, ranges: list[tuple[int, int]]) -> int:
    """Bytes fetching `ranges` of `file` holds: its `footprint` (the gaps it fetches through count); a source
    without a cost model holds exactly what it is asked for."""
    footprint = getattr(file, "footprint", None)
    return footprint(ranges) if footprint is not None else sum(e - s for s, e in ranges)


class RemoteReads:
    """The remote bytes a run's block tasks read: fetched ahead in step order within `window` bytes, and
    released (`RemoteFile.release`) as soon as no unfinished task reads them, so a remote checkpoint of any
    size streams through bounded memory.

    A source record's bytes are released when the last step reading it has run all its tasks. A step with
    no task (a zero-copy view result, `MemorySink`) never finishes: the result IS those bytes, so they stay.
    The prefetcher runs one thread ahead of the workers, and waits while the bytes held for steps not yet
    done and the next step's would pass `window` (unless nothing is held: a step larger than the window
    still runs). A block that gets to a step first fetches for itself; the prefetcher's failures are left
    for that block's own fetch to report.

    The file's map is shared with every other run in the process (issue 35), so "held" is not "ours": before
    its first fetch of a record the run takes a lease on it (`RemoteFile.acquire`), and "release" gives the
    lease back (`RemoteFile.release`), which hands back only pages no other run leases. A run that finds a
    record another run fetched reads it under its own lease, so the other run's release leaves it alone.
    `stop` (every exit, failures included) gives back the leases the run still holds, so a failed run
    leaves nothing held that it fetched (tests/io/test_remote_memory.py).
    """

    def __init__(self, tasks, window: int):
        self.window = max(1, int(window))
        self._cond = threading.Condition()
        self._left: dict[int, int] = {}
        self._steps: list = []
        for task in tasks:
            step = task[0]
            if id(step) not in self._left:
                self._left[id(step)] = 0
                self._steps.append(step)
            self._left[id(step)] += 1
        self._uses: dict[tuple, int] = {}
        self._records: dict[int, list[tuple]] = {}
        for step in self._steps:
            records = sorted({(r.file, r.offset, r.offset + r.nbytes) for r in step.sources if is_remote_record(r)},
                             key=lambda x: (id(x[0]), x[1]))
            self._records[id(step)] = records
            for rec in records:
                self._uses[rec] = self._uses.get(rec, 0) + 1
        self._ranges: dict[int, dict] = {}
        self._needs: dict[int, int] = {}  # step -> map bytes its fetch holds (`_step_need`)
        self._held: dict[int, int] = {}  # step -> remote bytes fetched for it and not yet released
        self._started: set[int] = set()  # steps a worker has begun fetching: the prefetcher leaves them
        self._leased: set[tuple] = set()  # records this run holds a lease on (`RemoteFile.acquire`)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def attach(self, tasks) -> None:
        """Let each task's fetch (`fetch_step_sources`) go through this run's accounting."""
        self._caches: dict[int, dict] = {}
        for task in tasks:
            if task[3] is not None and id(task[0]) in self._left:
                task[3][_READS] = self
                self._caches[id(task[0])] = task[3]

    def _step_ranges(self, step) -> dict:
        got = self._ranges.get(id(step))
        if got is None:
            got = self._ranges[id(step)] = {f: sorted(r) for f, r in remote_ranges(step.node).items()}
        return got

    def fetch(self, step) -> None:
        """Make `step`'s remote bytes present (a worker's call; it never waits for the window)."""
        with self._cond:
            self._started.add(id(step))
            self._lease(step)
        ranges = self._step_ranges(step)
        for file, rs in ranges.items():
            file.ensure_ranges(rs, within=self._leased_spans(step, file))
        self._account(step)

    def _leased_spans(self, step, file) -> list[tuple[int, int]]:
        """The records of `file` that `step` reads and this run leases (sorted): the gaps fetched through
        inside them are held with them and go back with their release (`RemoteFile.ensure_ranges`)."""
        with self._cond:
            return [(s, e) for f, s, e in self._records.get(id(step), ()) if f is file and (f, s, e) in self._leased]

    def _lease(self, step) -> None:
        """Lease the records `step` reads that this run does not lease yet, before any is fetched or looked
        at: from here on no other run's release drops them. Under `_cond` (so `_unuse` and `stop` see it)."""
        for rec in self._records.get(id(step), ()):
            if rec not in self._leased and self._uses.get(rec, 0) > 0 and not self._stop.is_set():
                self._leased.add(rec)
                rec[0].acquire([(rec[1], rec[2])])

    def admit(self, step, drain) -> None:
        """Before the first block of `step` is read, on an executor whose blocks count as done only later
        (the GPU's, after their copy's event): reserve `step`'s bytes in the window unless a prefetcher has
        already taken it, calling `drain()` once first if they do not fit. `drain` must finish the blocks in
        flight (their `task_done` releases what they read). After it, what is held is the prefetchers'
        reservations (within the window), so the run holds at most the window plus this step. A worker's
        `fetch` never waits, so without this the blocks in flight would each add a step beyond the window."""
        with self._cond:
            if self._stop.is_set() or self._left.get(id(step), 0) == 0 or id(step) in self._held \
                    or id(step) in self._started:
                return
        need = self._step_need(step)
        with self._cond:
            full = bool(self._held) and sum(self._held.values()) + need > self.window
        if full:
            drain()
        with self._cond:
            if id(step) in self._held or id(step) in self._started:
                return  # a prefetcher took it meanwhile
            self._started.add(id(step))  # the prefetchers leave it: the block fetches for itself
            self._held[id(step)] = need

    def _step_need(self, step) -> int:
        """The map bytes fetching `step` holds (`RemoteFile.footprint`: its ranges and the gaps fetched through
        between them), computed once."""
        need = self._needs.get(id(step))
        if need is None:
            need = self._needs[id(step)] = sum(_footprint(f, rs) for f, rs in self._step_ranges(step).items())
        return need

    def _account(self, step) -> None:
        with self._cond:
            if id(step) not in self._held and self._left.get(id(step), 0) > 0:
                self._held[id(step)] = self._step_need(step)

    def task_done(self, task) -> None:
        """One of `task`'s step's tasks finished; after its last, release what no other step still reads."""
        step = task[0]
        with self._cond:
            left = self._left.get(id(step))
            if left is None:
                return
            self._left[id(step)] = left - 1
            if left > 1:
                return
        self._unuse(step)
        with self._cond:
            self._held.pop(id(step), None)
            self._cond.notify_all()

    def _unuse(self, step) -> None:
        """Drop one use of each record `step` reads; release those no one uses any more."""
        with self._cond:
            free = []
            for rec in self._records.get(id(step), ()):
                self._uses[rec] -= 1
                if self._uses[rec] == 0 and rec in self._leased:  # never leased: never fetched into the map
                    self._leased.discard(rec)                    # by this run (a step received into its output)
                    free.append(rec)
        self._give_back(free)

    def _give_back(self, free) -> None:
        """Give back this run's leases on the records `free` (`RemoteFile.release`, one call per file)."""
        by_file: dict = {}
        for file, s, e in free:
            by_file.setdefault(file, []).append((s, e))
        for file, ranges in by_file.items():
            file.release(sorted(ranges))

    def prefetch_order(self) -> list:
        """The steps in the order the prefetchers take them: step order, except that the steps received
        straight into their outputs (no map bytes, so no window to keep) fill their places largest first.
        Longest first keeps the streams busy to the end: in step order W1's 131 MB lm_head came last and was
        fetched alone, 0.14 s of a 1.9-2.9 s load with one request in flight (benchmarks/RESULTS.md).

        >>> from types import SimpleNamespace as NS
        >>> steps = [NS(name=n, node=NS(nbytes=b)) for n, b in [("a", 1), ("m", 9), ("b", 5), ("c", 3)]]
        >>> reads = RemoteReads.__new__(RemoteReads)
        >>> reads._steps = steps
        >>> reads._caches = {id(st): ({} if st.name == "m" else {RECEIVE: ()}) for st in steps}
        >>> [st.name for st in reads.prefetch_order()]
        ['b', 'm', 'c', 'a']
        """
        caches = getattr(self, "_caches", {})
        received = [i for i, st in enumerate(self._steps) if RECEIVE in caches.get(id(st), ())]
        order = list(self._steps)
        for i, st in zip(received, sorted((self._steps[i] for i in received), key=lambda st: -st.node.nbytes)):
            order[i] = st
        return order

    def start_prefetch(self, threads: int = PREFETCH_THREADS) -> None:
        """Fetch ahead, in `prefetch_order`, on `threads` background threads taking the steps in turn
        (stopped by `stop`): most tensors are one request, so one thread would keep one request in flight."""
        if self._steps:
            order = iter(self.prefetch_order())  # next() on it is atomic under the GIL: each step goes to one thread
            for k in range(max(1, min(threads, len(self._steps)))):
                t = threading.Thread(target=self._prefetch, args=(order,), daemon=True,
                                     name=f"lazyweights-prefetch-{k}")
                t.start()
                self._threads.append(t)

    def _prefetch(self, order) -> None:
        for step in order:
            if self._stop.is_set():
                return
            cache = self._caches.get(id(step))
            if cache is not None and RECEIVE in cache:  # straight into the output: no map bytes to hold
                try:
                    fetch_step_sources(step, cache)
                except Exception as e:  # reported by the block that needs these bytes
                    _log.debug("prefetch of %s stopped: %s", step.outputs, e)
                    return
                continue
            try:
                ranges = self._step_ranges(step)
                need = self._step_need(step)
                with self._cond:
                    while (not self._stop.is_set() and self._left.get(id(step), 0) > 0 and self._held
                           and sum(self._held.values()) + need > self.window):
                        self._cond.wait(0.05)
                    if self._stop.is_set() or id(step) in self._started:
                        continue  # a worker got there first: it fetches for itself
                    self._held[id(step)] = need  # reserved before the fetch: the other prefetchers see it
                    for rec in self._records[id(step)]:  # held while we fetch: a finished step's release
                        self._uses[rec] += 1             # must not drop what we are bringing in
                    self._lease(step)
            except Exception as e:  # the block that needs these ranges computes them again and raises
                _log.debug("prefetch of %s stopped: %s", step.outputs, e)
                return
            try:
                for file, rs in ranges.items():
                    file.ensure_ranges(rs, within=self._leased_spans(step, file))
                self._account(step)
            except Exception as e:  # reported by the block that needs these bytes
                _log.debug("prefetch of %s stopped: %s", step.outputs, e)
                return
            finally:
                self._unuse(step)

    def stop(self) -> None:
        """Stop the prefetchers (the run ended or failed) and wait for the fetch each has in hand: nothing
        may still be received into a result after the run returns (or raises) to its caller. Then give back
        every lease the run still holds (after a failure: the records of steps fetched but not finished), so
        the bytes it fetched that no other run leases are released."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        with self._cond:
            left = sorted(self._leased, key=lambda r: (id(r[0]), r[1]))
            self._leased.clear()
        self._give_back(left)


def remote_reads(tasks, window: int) -> RemoteReads | None:
    """A `RemoteReads` for these block tasks, attached and prefetching; None when no source is remote."""
    if not any(is_remote_record(r) for task in tasks for r in task[0].sources):
        return None
    reads = RemoteReads([t for t in tasks if any(is_remote_record(r) for r in t[0].sources)], window)
    reads.attach(tasks)
    reads.start_prefetch()
    return reads
