"""The GPU executor: sources -> pinned host staging -> host-to-device copies on CUDA streams -> device kernels.

`materialize(device="gpu:N")` lands here. Each step of the compiled schedule (one distinct output; tied
outputs are one step, computed once) is split in two:

    host part    the layout sub-chain over the sources (slices, permutes, gathers such as the RoPE row
                 permutation, reshapes, concats), plus any op the device does not implement. Its rows, in
                 the SOURCE dtype (e.g. bf16, or packed GGUF bytes), are written by `write_rows` straight
                 into a pinned (page-locked) staging buffer: one read of the memory map, one write.
    device part  the value ops on top, which `graph.rewrites.sink_casts` has moved above the layout ops:
                 a chain of casts (and same-size bitcasts), optionally starting with a GGUF dequantize.
                 The whole chain is ONE kernel per block (`kernels/cuda_casts.py`, `kernels/cuda_dequant.py`)
                 reading the block's source bytes from a device staging buffer and writing its output rows.

A chain with no device part (pure layout, or ops only the host implements) is a plain host-to-device copy
from the pinned buffer into the output rows.

Pipeline. There are `streams` slots (default: one per host thread); each owns a CUDA stream, an event, a pinned
buffer and (when any step has a device part) a device staging buffer. Blocks take slots round-robin:

    1. wait for the slot's event (its previous block's copy and kernel are done, so both buffers are free);
    2. a host thread (a pool of `host_threads`, default the CPUs clamped to 2..8) fills the pinned buffer with
       the block's rows: one `pread` of the file where the rows are one contiguous range of a local file, a
       copy from the memory map (gathers such as RoPE's, other layouts) otherwise;
    3. the main thread, in block order, enqueues on the slot's stream: the async H2D copy (pinned -> device
       staging, or straight into the output rows), the kernel, copies into extra tied destinations; then
       records the slot's event. It enqueues each block as soon as its fill is done, and waits for fills only
       while `host_threads` are in flight.

So while block i's kernel runs on one stream, block i+1's copy runs on another and blocks i+2.. are being
read on the host: reads, copies and kernels overlap. The slot a new block takes was enqueued `streams` blocks
earlier; with more slots than fills in flight its copy is more surely done when the slot comes round again,
but every slot costs its staging allocation (pinning host memory: ~0.5 ms a MB on the H200 host measured),
and on that host one slot per host thread was the faster trade (`DEFAULT_STREAMS_PER_THREAD`). Only the main
thread calls CUDA (CuPy's current device and stream are per thread); the host threads only run numpy and read
files.

Memory. The budget (default 512 MB) bounds the staging memory: slots x (pinned + device staging) <= budget.
Blocks are cut to at most `block_bytes` (default 8 MB) of source bytes and to what a slot may hold. A step
that must be computed whole and does not fit a slot runs alone with temporary buffers after the pipeline
drains (BudgetError, before any work, if even the whole budget is too small). The output arrays are the
result, not working memory; they are allocated up front, so a device out-of-memory fails before any read.
Host temporaries that a gather needs (block-sized) are not counted, as in the CPU executor. Remote sources
stream through the budget as on the CPU (`run/fetch.RemoteReads`, the budget as the fetch window): a block
counts as read, and its records may be released, only after its slot's event (or a solo block's stream sync)
says its copy and kernel are done (tests/io/test_remote_gpu.py).

dtypes. CuPy has no bfloat16 or fp8 dtype: results in those dtypes are CuPy arrays of uint16 (bf16) or uint8
(fp8/fp4/e8m0) holding the exact encodings (`storage_dtype`). The returned dict (`DeviceArrays`) records each
output's real dtype and converts to PyTorch without a copy through DLPack (`to_torch`), viewing the bits as
torch.bfloat16 / torch.float8_*.

Backends. The pipeline talks to a small backend interface (`activate, empty, pinned, staging, release,
stream, record, synchronize, h2d, d2d, run, flat_bytes, as_destination`). `CupyDevice` is the real one;
the tests run the pipeline on `tests/run/fake_gpu.NumpyDevice`, a fake whose streams defer their work, so a
missing wait shows up as wrong bytes.

CuPy is imported only when a GPU is asked for; without it (or without a CUDA device) the error says how to
install it: ``pip install 'lazyweights[gpu]'`` (which installs cupy-cuda12x).

Example (needs a CUDA GPU and cupy, so not run as a doctest):
    import numpy as np, ml_dtypes
    from lazyweights import WeightData, DType, plan
    w = WeightData.from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    res = materialize_gpu(plan({"t": w.T.astype(DType.bfloat16)}), "gpu:0")
    res["t"].dtype.name, res.dtypes["t"].name   # ('uint16', 'bfloat16'): bf16 is held as uint16 bits
    res["t"].get().view(ml_dtypes.bfloat16).tolist()   # [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
"""
from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Mapping

import numpy as np

from ..compiler.gpu import (
    DEFAULT_GPU_BLOCK_BYTES,
    UINT_OF_SIZE,
    DeviceProgram,
    GpuStep,
    compile_gpu_steps,
    split_chain,
)
from ..compiler.steps import DEFAULT_BUDGET, outputs_of
from ..core.device import DeviceRef
from ..core.dtype import DType
from ..core.errors import (
    DependencyError,
    DeviceError,
    DTypeError,
    ExecutionError,
    LazyWeightsError,
    ShapeError,
    UsageError,
)
from ..core.units import available_cpus, parse_size
from ..graph.layout import view_of
from ..graph.opcodes import GroupOp, Op
from ..kernels.cuda_casts import storage_dtype
from .blocks import write_rows
from .driver import name_error
from .fetch import fetch_step_sources, remote_reads
from .progress import Progress

__all__ = ["materialize_gpu", "DeviceArrays", "PIPELINE_TIMINGS", "DeviceProgram", "split_chain", "to_torch",
           "CupyDevice", "import_cupy", "check_device_destination", "INSTALL_HINT"]

# Slots per host thread. The third H200 lease (benchmarks/RESULTS.md, "GPU"), W1 warm, medians of 5 in one run:
# 8 slots for 8 threads 0.201 s against 16 slots 0.260 s; the extra slots' waits saved (0.009 s against 0.031 s
# of `slot_wait`) cost less than their pinned and device staging (0.071 s against 0.036 s of `staging`).
DEFAULT_STREAMS_PER_THREAD = 1
INSTALL_HINT = "pip install 'lazyweights[gpu]'  (installs cupy-cuda12x; needs an NVIDIA driver for CUDA 12)"



def default_host_threads() -> int:
    """Host threads filling pinned buffers: `LAZYWEIGHTS_GPU_HOST_THREADS` if set, else the available CPUs
    clamped to 2..8. One thread reads 2-3 GB/s from the page cache on the H200 host measured (benchmarks/
    RESULTS.md, "GPU"), so reaching the link's ~55 GB/s takes many; past 8 the gain was within noise."""
    env = os.environ.get("LAZYWEIGHTS_GPU_HOST_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    cpus = available_cpus()
    return max(2, min(8, cpus))


# ==========================================================================================================
# Splitting a chain into host part and device program.

# ==========================================================================================================
# Results.

_TORCH_NAMES = {
    DType.bfloat16: "bfloat16", DType.float8_e4m3fn: "float8_e4m3fn", DType.float8_e5m2: "float8_e5m2",
    DType.float8_e4m3fnuz: "float8_e4m3fnuz", DType.float8_e5m2fnuz: "float8_e5m2fnuz",
    DType.float8_e8m0fnu: "float8_e8m0fnu", DType.float4_e2m1fn: "float4_e2m1fn_x2",
}
_SIGNED = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def to_torch(array, dtype: DType | None = None):
    """A PyTorch tensor sharing `array`'s memory (DLPack, no copy), with the real `dtype` restored:
    uint16 storage of bf16 becomes torch.bfloat16, uint8 storage of fp8 becomes torch.float8_*.
    Works for CuPy arrays (a CUDA tensor) and numpy arrays (a CPU tensor). Needs torch.

    Example:
        >>> import numpy as np, pytest
        >>> torch = pytest.importorskip("torch")
        >>> bits = np.array([0x3F80, 0xC000], np.uint16)            # bf16 1.0, -2.0
        >>> to_torch(bits, DType.bfloat16).tolist()
        [1.0, -2.0]
    """
    import torch

    if isinstance(array, torch.Tensor):  # a torch destination given to `out=`: already the real dtype
        return array
    dtype = DType.parse(dtype) if dtype is not None else None
    stored = np.dtype(array.dtype)
    if dtype is None or dtype not in _TORCH_NAMES:
        return torch.from_dlpack(array)
    if dtype is DType.float4_e2m1fn:
        raise DTypeError("float4_e2m1fn is stored one value per byte here; torch packs two per byte")
    target = getattr(torch, _TORCH_NAMES[dtype], None)
    if target is None:
        raise DTypeError(f"this torch ({torch.__version__}) has no {_TORCH_NAMES[dtype]}")
    # Through the signed integer of the same width: every torch with DLPack imports those (uint16 is new).
    t = torch.from_dlpack(array.view(_SIGNED[stored.itemsize]) if stored.itemsize > 1 else array)
    return t.view(target)


class DeviceArrays(dict):
    """`name -> array` as `materialize(device="gpu:N")` returns it (CuPy arrays; numpy on the fake backend),
    with each output's real dtype in `.dtypes` (bf16/fp8 are stored as unsigned integer bits).

    `to_torch(name)` gives a zero-copy torch tensor of the real dtype; `to_torch()` all of them.
    `timings` says where the calling thread's time went, in seconds (`PIPELINE_TIMINGS`), and `blocks` how
    many blocks ran: what to read first when a load is slower than the link."""

    def __init__(self, arrays=(), dtypes: Mapping[str, DType] | None = None, timings: Mapping[str, float] | None = None,
                 blocks: int = 0):
        super().__init__(arrays)
        self.dtypes: dict[str, DType] = dict(dtypes or {})
        self.timings: dict[str, float] = dict(timings or {})
        self.blocks = blocks

    def to_torch(self, name: str | None = None):
        """One output as a zero-copy torch tensor of its real dtype (bf16/fp8 included), or all of them as a dict."""
        if name is None:
            return {k: to_torch(v, self.dtypes.get(k)) for k, v in self.items()}
        return to_torch(self[name], self.dtypes.get(name))


# ==========================================================================================================
# Backends.

def import_cupy():
    """CuPy, or a LazyWeightsError saying how to get it."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken install failing to load its CUDA libraries
        raise DependencyError(
            f"materialize(device='gpu:N') needs CuPy and CUDA, and CuPy could not be imported "
            f"({type(e).__name__}: {e}). Install it with: {INSTALL_HINT}"
        ) from None
    return cupy


class CupyDevice:
    """The real backend: CuPy arrays, pinned host memory, CUDA streams and events, the CUDA kernels."""

    name = "cupy"

    def __init__(self, device_id: int = 0):
        cupy = import_cupy()
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:
            raise DeviceError(
                f"CuPy is installed but no CUDA device is usable ({type(e).__name__}: {e}); check the NVIDIA "
                f"driver, or install the CuPy build for your CUDA version ({INSTALL_HINT})"
            ) from None
        if not 0 <= device_id < count:
            raise DeviceError(f"gpu:{device_id} requested, but this machine has {count} CUDA device(s)")
        self.cupy = cupy
        self.id = device_id
        self.device = cupy.cuda.Device(device_id)

    def activate(self):
        """The CUDA device as a context manager: work inside it runs on this backend's GPU."""
        return self.device

    # memory
    def empty(self, shape, dtype: np.dtype):
        """An uninitialised device array (an output; from CuPy's pool)."""
        return self.cupy.empty(shape, dtype)

    def pinned(self, nbytes: int) -> np.ndarray:
        """A page-locked host buffer of `nbytes`, as a uint8 numpy array (host rows are staged here)."""
        # Straight from cudaHostAlloc, not CuPy's pinned pool: freed memory goes back to the OS, so the
        # budget really bounds what this run holds.
        from cupy.cuda import pinned_memory

        ptr = pinned_memory.PinnedMemoryPointer(pinned_memory.PinnedMemory(max(1, nbytes)), 0)
        return np.ndarray((nbytes,), np.uint8, buffer=ptr)

    def staging(self, nbytes: int):
        """A device buffer of `nbytes` for one slot's raw source bytes, outside CuPy's pool."""
        mem = self.cupy.cuda.Memory(max(1, nbytes))  # cudaMalloc, outside the pool (freed on release)
        return self.cupy.ndarray((nbytes,), self.cupy.uint8, self.cupy.cuda.MemoryPointer(mem, 0))

    def release(self, buf) -> None:
        """Give a pinned or staging buffer back (CuPy frees it when its last reference goes)."""
        pass  # freed when the last reference goes

    # streams
    def stream(self):
        """A new non-blocking CUDA stream (one per slot)."""
        return self.cupy.cuda.Stream(non_blocking=True)

    def record(self, stream):
        """An event recorded on `stream` now: done when everything enqueued before it is done."""
        ev = self.cupy.cuda.Event(block=False, disable_timing=True)
        ev.record(stream)
        return ev

    def synchronize(self, streams) -> None:
        """Wait until all work enqueued on `streams` has finished."""
        for s in streams:
            s.synchronize()

    # work
    def h2d(self, dst, src: np.ndarray, stream) -> None:
        """Enqueue an async copy of pinned host bytes `src` into device array `dst` on `stream`."""
        # The runtime call, not MemoryPointer.copy_from_host_async, whose pointer argument changed type
        # across CuPy versions. `src` is pinned, so this returns at once and the DMA runs on `stream`.
        if src.nbytes:
            rt = self.cupy.cuda.runtime
            rt.memcpyAsync(dst.data.ptr, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, stream.ptr)

    def d2d(self, dst, src, stream) -> None:
        """Enqueue an async device-to-device copy of `src` into `dst` on `stream`."""
        if src.nbytes:
            rt = self.cupy.cuda.runtime
            rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, rt.memcpyDeviceToDevice, stream.ptr)

    def run(self, program: DeviceProgram, src_u8, dst, stream) -> None:
        """The program's fused kernel: `src_u8` (flat uint8 staging) -> `dst` (flat output elements)."""
        from ..kernels import cuda_casts, cuda_dequant

        out = dst.view(UINT_OF_SIZE[program.out_size])
        if program.dequant is not None:
            cuda_dequant.launch(program.dequant, program.chain, src_u8, out, stream)
            return
        kernel = cuda_casts.cast_kernel(program.chain)
        with stream:
            kernel(src_u8.view(UINT_OF_SIZE[program.src.size_in_bytes]), out)

    # arrays
    def flat_bytes(self, arr):
        """`arr` as a flat uint8 view of its bytes (no copy)."""
        return arr.reshape(-1).view(self.cupy.uint8)

    def as_destination(self, name: str, value, dtype: DType, shape):
        """`value` (a CuPy array, a torch CUDA tensor, or anything CuPy imports by DLPack) as a CuPy array of
        `dtype`'s storage dtype, checked like the CPU executor checks numpy destinations."""
        cupy = self.cupy
        arr = value
        if not isinstance(arr, cupy.ndarray):
            if type(value).__module__.split(".")[0] == "torch":
                tname = str(value.dtype).split(".")[-1]
                if tname != dtype.name and not (tname == "float4_e2m1fn_x2" and dtype is DType.float4_e2m1fn):
                    raise DTypeError(f"destination for {name!r} is torch.{tname}, the plan produces {dtype.name}")
                if value.device.type != "cuda":
                    raise DeviceError(f"destination for {name!r} is on {value.device}, not on gpu:{self.id}")
                import torch

                signed = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()]
                arr = cupy.from_dlpack(value.view(signed) if value.dtype != signed else value)
                arr = arr.view(storage_dtype(dtype))
            elif hasattr(value, "__dlpack__"):
                arr = cupy.from_dlpack(value)
            else:
                raise DTypeError(f"destination for {name!r} must be a CuPy array (or a CUDA DLPack tensor), "
                                 f"got {type(value).__name__}")
        if arr.device.id != self.id:
            raise DeviceError(f"destination for {name!r} is on gpu:{arr.device.id}, not gpu:{self.id}")
        return check_device_destination(name, arr, dtype, shape)


def check_device_destination(name: str, arr, dtype: DType, shape):
    """A caller-given device array checked as the CPU executor checks numpy ones: the storage dtype of
    `dtype`, C-contiguous, as many elements as `shape`; named `DTypeError`/`ShapeError` otherwise. Returns it
    reshaped to `shape` (a view)."""
    want = storage_dtype(dtype)
    if np.dtype(arr.dtype) != want:
        note = f" ({dtype.name} is held as {want.name} on the GPU)" if want != dtype.to_numpy() else ""
        raise DTypeError(f"destination for {name!r} is {np.dtype(arr.dtype).name}, the plan produces "
                         f"{dtype.name}{note}")
    size = int(np.prod(shape, dtype=np.int64))
    if arr.size != size or (tuple(arr.shape) != tuple(shape) and not arr.flags.c_contiguous):
        raise ShapeError(f"destination for {name!r} has shape {list(arr.shape)}, the plan produces {list(shape)}")
    if not arr.flags.c_contiguous:
        raise ShapeError(f"destination for {name!r} must be C-contiguous (blocks are copied as byte ranges)")
    return arr.reshape(shape)


# ==========================================================================================================
# The pipeline.

# What `DeviceArrays.timings` holds: the calling thread's seconds in each part of a run (they add up to about
# `total`; the host threads' reads overlap them and show as `fill_wait` where the calling thread waited).
PIPELINE_TIMINGS = {
    "compile": "cutting the plan into GPU steps and blocks (compiler/gpu.py)",
    "outputs": "allocating the output arrays on the device",
    "staging": "allocating the slots' pinned and device staging buffers",
    "fill_wait": "waiting for host threads to finish reading a block",
    "slot_wait": "waiting for a slot's previous copy and kernel (the device behind)",
    "enqueue": "enqueueing copies and kernels, recording events",
    "finish": "waiting for the last blocks on the device",
    "release": "stopping the host threads, freeing the staging buffers",
    "total": "the whole call",
}


class _Clock(dict):
    """Seconds per part of a run (`PIPELINE_TIMINGS`), on the calling thread: `t = clock.add(name, t)` adds the
    time since `t` to `name` and returns now, so consecutive parts chain without a gap."""

    def __init__(self):
        super().__init__((k, 0.0) for k in PIPELINE_TIMINGS)

    def add(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self[name] += now - since
        return now


@dataclass
class _Running(GpuStep):
    """A compiled GPU step plus its output arrays on the device."""

    primary: object = None
    extras: list = field(default_factory=list)


class _Slot:
    def __init__(self, backend, index: int, on_done=None):
        self.backend = backend
        self.index = index
        self.stream = backend.stream()
        self.event = None
        self.task = None  # the block whose copy and kernel `event` follows
        self.on_done = on_done  # called with that block once its event is done (remote bytes released)
        self.pinned: np.ndarray | None = None
        self.dev = None

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        task, self.task = self.task, None
        if task is not None and self.on_done is not None:
            self.on_done(task)

    def ensure(self, pinned_bytes: int, dev_bytes: int) -> None:
        if self.pinned is None and pinned_bytes:
            self.pinned = self.backend.pinned(pinned_bytes)
        if self.dev is None and dev_bytes:
            self.dev = self.backend.staging(dev_bytes)

    def free(self) -> None:
        for buf in (self.pinned, self.dev):
            if buf is not None:
                self.backend.release(buf)
        self.pinned = self.dev = None


def materialize_gpu(plan, device="gpu:0", budget=None, progress=False, out=None, *, backend=None,
                    streams: int | None = None, host_threads: int | None = None,
                    block_bytes: int | None = None, read_calls: bool = True) -> DeviceArrays:
    """Compute every output of `plan` on a GPU: name -> CuPy array (see the module docstring).

    `device`: "gpu:N" or DeviceRef.GPU(N). `budget`: bytes of pinned + device staging memory (int or
    "512MB"). `out`: name -> destination (CuPy arrays, torch CUDA tensors, or other CUDA DLPack arrays; bf16
    destinations may be uint16 CuPy arrays or torch.bfloat16 tensors). `streams`: CUDA streams (= staging
    slots). `host_threads`: threads reading sources into pinned memory. `block_bytes`: source bytes per
    block. `read_calls`: read blocks that are one contiguous range of a local file with `pread` (default)
    rather than copying them from the map.
    `backend`: a `NumpyDevice` to run the pipeline without a GPU (tests).
    Results in bf16/fp8 are unsigned integer arrays of the same bits; `.dtypes` has the real dtypes.
    """

    clock, started = _Clock(), time.perf_counter()
    device = DeviceRef.parse(device)
    if backend is None:
        if not device.is_gpu:
            raise UsageError(f"materialize_gpu needs a GPU device, got {device}")
        backend = CupyDevice(device.id)
    outputs = outputs_of(plan)
    threads = max(1, int(host_threads or default_host_threads()))
    # One slot per host thread by default (`DEFAULT_STREAMS_PER_THREAD`: staging is the dearer cost).
    streams = max(1, int(streams or DEFAULT_STREAMS_PER_THREAD * threads))
    fills = min(threads, streams)  # blocks being filled at once (never more than the slots)
    target = int(block_bytes or DEFAULT_GPU_BLOCK_BYTES)
    out = dict(out or {})
    for name in out:
        if name not in outputs:
            raise UsageError(f"destination given for {name!r}, which is not an output of the plan")

    # The compiler cuts blocks by this executor's cost model: staging (pinned + device copies of the
    # SOURCE rows) per slot, checked against the budget before any work (`compiler/gpu.py`).
    t = time.perf_counter()
    compiled = compile_gpu_steps(outputs, budget=budget, streams=streams, block_bytes=target)
    gsteps = [_Running(**{f.name: getattr(g, f.name) for f in fields(GpuStep)}) for g in compiled.steps]
    pinned_bytes, dev_bytes = compiled.pinned_bytes, compiled.device_bytes
    t = clock.add("compile", t)

    result: dict = {}
    dtypes = {name: node.dtype for name, node in outputs.items()}
    with backend.activate():
        # Outputs first: a device out-of-memory fails here, before anything is read.
        for g in gsteps:
            node = g.step.node
            dsts = [n for n in g.step.outputs if n in out]
            arrays = [backend.as_destination(n, out[n], node.dtype, node.shape) for n in dsts]
            if arrays:
                g.primary, g.extras = arrays[0], arrays[1:]
            else:
                try:
                    g.primary = backend.empty(node.shape, storage_dtype(node.dtype))
                except Exception as e:
                    if isinstance(e, LazyWeightsError):
                        raise
                    raise ExecutionError(
                        f"allocating {g.name!r} ({node.dtype.name}{list(node.shape)}, {node.nbytes} bytes) on "
                        f"gpu:{device.id} failed: {type(e).__name__}: {e}", tensor=g.name) from e
            for name in g.step.outputs:  # a destination is returned as the caller gave it, now filled
                result[name] = out[name] if name in out else g.primary
        clock.add("outputs", t)

        # (step, rows, GpuStep, the step's fetch cache, block index): `run/driver.BlockTask`'s first fields, so
        # `run/fetch.RemoteReads` accounts these blocks as it does the CPU executor's.
        caches: dict = {}
        tasks = [(g.step, rows, g, caches.setdefault(id(g.step), {}), i)
                 for g in gsteps for i, rows in enumerate(g.blocks)]
        bar = Progress(sum(len(t[1]) * t[2].out_row_bytes for t in tasks), "materialize gpu") if progress else None
        # Remote sources: fetched ahead in step order within the budget, and a record's bytes released once
        # the last block reading it is on the device: `_Slot.wait` calls `reads.task_done` only after the
        # block's event (its copy and kernel) is done, `_run_solo` after its stream sync.
        # A block's step not yet prefetched is admitted into the window first (`RemoteReads.admit`), which
        # drains the blocks in flight when it is full (tests/io/test_remote_gpu.py holds the bound).
        reads = remote_reads(tasks, parse_size(budget) or DEFAULT_BUDGET)
        done = reads.task_done if reads is not None else None
        slots = [_Slot(backend, i, done) for i in range(streams)]
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lazyweights-gpu-read")
        pending: deque = deque()

        def drain() -> None:  # finish every block in flight: their remote bytes are released
            while pending:
                _launch(backend, pending.popleft(), bar, clock)
            for slot in slots:
                slot.wait()

        try:
            turn = 0
            for task in tasks:
                g, index = task[2], task[4]
                if reads is not None:
                    reads.admit(task[0], drain)  # the window bounds what the blocks in flight fetch, too
                if index in g.solo:
                    while pending:
                        _launch(backend, pending.popleft(), bar, clock)
                    for slot in slots:
                        slot.wait()
                        slot.free()  # make room: a solo block may use the whole budget
                    _run_solo(backend, task, slots[0], bar, read_calls)
                    if done is not None:
                        done(task)
                    continue
                slot = slots[turn]
                turn = (turn + 1) % streams
                # Enqueue the copies of blocks already filled (in order), and wait for fills while `fills`
                # are in flight. Then no block in `pending` uses `slot` (fewer than `fills` <= `streams`).
                while pending and (len(pending) >= fills or pending[0][2].done()):
                    _launch(backend, pending.popleft(), bar, clock)
                t = time.perf_counter()
                slot.wait()  # its previous block's copy and kernel are done: the buffers are free
                t = clock.add("slot_wait", t)
                slot.ensure(pinned_bytes, dev_bytes)
                clock.add("staging", t)
                pending.append((task, slot, pool.submit(_fill, task, slot.pinned, read_calls)))
            while pending:
                _launch(backend, pending.popleft(), bar, clock)
            t = time.perf_counter()
            backend.synchronize([s.stream for s in slots])
            for slot in slots:
                slot.wait()  # every event is done now: release the last blocks' remote bytes
            clock.add("finish", t)
        except BaseException as e:
            for _, _, fut in pending:
                fut.cancel()
            pool.shutdown(wait=True)  # no host thread may still be writing a buffer we free
            backend.synchronize([s.stream for s in slots])  # no copy may still be reading one
            failed = getattr(e, "_lw_task", None)
            if failed is not None and not isinstance(e, (KeyboardInterrupt, SystemExit)):
                named = name_error(e, failed)
                raise named from (None if named is e else e)
            raise
        finally:
            t = time.perf_counter()
            pool.shutdown(wait=True)
            if reads is not None:
                reads.stop()  # every exit: no prefetch thread outlives the run (nor fetches into a map after it)
            for slot in slots:
                slot.free()
            clock.add("release", t)
        if bar:
            bar.close()
    clock.add("total", started)
    return DeviceArrays({name: result[name] for name in outputs}, dtypes, clock, len(tasks))


def _tag(e: BaseException, task) -> None:
    """Attach the failing block to its exception, so the main thread can name the tensor (`name_error`)."""
    setattr(e, "_lw_task", task)  # noqa: B010 (an attribute exceptions do not declare)


def _fill(task, pinned: np.ndarray | None, read_calls: bool = True) -> None:
    """Host thread: write the block's host-part rows (source dtype) into the pinned buffer. Rows that are one
    contiguous range of a local file are read with `pread` (`read_calls`), others are copied from the memory
    map (`write_rows`)."""
    step, rows, g = task[0], task[1], task[2]
    try:
        if pinned is None:  # compile_gpu_steps gives every block with host rows its staging
            raise ExecutionError(f"{g.name!r}: a block with host rows has no pinned staging buffer", tensor=g.name)
        host = g.host
        nbytes = len(rows) * g.host_row_bytes
        span = _source_span(host, rows, nbytes) if read_calls else None
        if span is not None:  # one contiguous range of a local file: one read call, which checks the file itself
            span[0].read_into(span[1], pinned[:nbytes], g.name)
            return
        for r in step.sources:
            r.file.check_unchanged(r.name)  # a truncated map would SIGBUS: check before touching pages
        fetch_step_sources(step, task[3])  # a remote mirror holds only what was fetched: the step's ranges first
        buf = pinned[:nbytes].view(host.dtype.to_numpy())
        if not host.shape:
            write_rows(host, rows, buf.reshape(()), {})
        else:
            write_rows(host, rows, buf.reshape((len(rows),) + host.shape[1:]), {})
    except BaseException as e:
        _tag(e, task)
        raise


def _source_span(host, rows: range, nbytes: int):
    """(local SourceFile, byte offset) if rows `rows` of `host` are `nbytes` contiguous bytes of one local
    file (a source, or views of one: reshape, row slice, bitcast), else None. Only addresses are computed:
    no page of the map is touched."""
    leaf = host
    while leaf.op in GroupOp.View:
        leaf = leaf.srcs[0]
    if leaf.op is not Op.SOURCE or not host.shape or not hasattr(getattr(leaf.arg, "file", None), "read_into"):
        return None
    base = leaf.arg.array(check=False, fetch=False)
    view = view_of(host, lambda _: base)
    if view is None:
        return None
    view = view[rows.start:rows.stop]
    if view.nbytes != nbytes or not view.flags.c_contiguous:
        return None
    whole = leaf.arg.file.whole_view()
    return leaf.arg.file, view.__array_interface__["data"][0] - whole.__array_interface__["data"][0]


def _launch(backend, entry, bar, clock: _Clock) -> None:
    """Main thread: once the block's host rows are in pinned memory, enqueue its copy and kernel."""
    task, slot, fut = entry
    t = time.perf_counter()
    fut.result()  # re-raises the host thread's error (tagged with its task)
    t = clock.add("fill_wait", t)
    try:
        _enqueue(backend, task, slot.pinned, slot.dev, slot.stream)
        slot.event = backend.record(slot.stream)
        slot.task = task
    except BaseException as e:
        _tag(e, task)
        raise
    clock.add("enqueue", t)
    if bar:
        bar.advance(len(task[1]) * task[2].out_row_bytes)


def _enqueue(backend, task, pinned, dev, stream) -> None:
    _, rows, g = task[0], task[1], task[2]
    n_src = len(rows) * g.host_row_bytes
    o0, o1 = rows.start * g.out_row_bytes, rows.stop * g.out_row_bytes
    out_bytes = backend.flat_bytes(g.primary)
    if g.program is None:
        backend.h2d(out_bytes[o0:o1], pinned[:n_src], stream)
    else:
        backend.h2d(dev[:n_src], pinned[:n_src], stream)
        size = g.program.out_size
        backend.run(g.program, dev[:n_src], out_bytes[o0:o1].view(UINT_OF_SIZE[size]), stream)
    for extra in g.extras:  # further destinations of tied outputs: device-to-device, same stream
        backend.d2d(backend.flat_bytes(extra)[o0:o1], out_bytes[o0:o1], stream)


def _run_solo(backend, task, slot: _Slot, bar, read_calls: bool = True) -> None:
    """A block too big for a slot: temporary buffers of its own size, filled and run alone."""
    g, rows = task[2], task[1]
    n_src = len(rows) * g.host_row_bytes
    pinned = backend.pinned(n_src)
    dev = backend.staging(n_src) if g.program is not None else None
    try:
        _fill(task, pinned, read_calls)
        try:
            _enqueue(backend, task, pinned, dev, slot.stream)
        except BaseException as e:
            _tag(e, task)
            raise
        backend.synchronize([slot.stream])
    finally:
        backend.synchronize([slot.stream])
        backend.release(pinned)
        if dev is not None:
            backend.release(dev)
    if bar:
        bar.advance(len(rows) * g.out_row_bytes)
