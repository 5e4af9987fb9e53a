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

Pipeline. There are `streams` (default 4) slots; each owns a CUDA stream, an event, a pinned buffer and (when
any step has a device part) a device staging buffer. Blocks take slots round-robin:

    1. wait for the slot's event (its previous block's copy and kernel are done, so both buffers are free);
    2. a host thread (a pool of `host_threads`, default up to 4) fills the pinned buffer with the block's rows;
    3. the main thread, in block order, enqueues on the slot's stream: the async H2D copy (pinned -> device
       staging, or straight into the output rows), the kernel, copies into extra tied destinations; then
       records the slot's event.

So while block i's kernel runs on one stream, block i+1's copy runs on another and blocks i+2.. are being
read on the host: reads, copies and kernels overlap. Only the main thread calls CUDA (CuPy's current device
and stream are per thread); the host threads only run numpy.

Memory. The budget (default 512 MB) bounds the staging memory: slots x (pinned + device staging) <= budget.
Blocks are cut to at most `block_bytes` (default 16 MB) of source bytes and to what a slot may hold. A step
that must be computed whole and does not fit a slot runs alone with temporary buffers after the pipeline
drains (BudgetError, before any work, if even the whole budget is too small). The output arrays are the
result, not working memory; they are allocated up front, so a device out-of-memory fails before any read.
Host temporaries that a gather needs (block-sized) are not counted, as in the CPU executor.

dtypes. CuPy has no bfloat16 or fp8 dtype: results in those dtypes are CuPy arrays of uint16 (bf16) or uint8
(fp8/fp4/e8m0) holding the exact encodings (`storage_dtype`). The returned dict (`DeviceArrays`) records each
output's real dtype and converts to PyTorch without a copy through DLPack (`to_torch`), viewing the bits as
torch.bfloat16 / torch.float8_*.

Backends. The pipeline talks to a small backend interface. `CupyDevice` is the real one. `NumpyDevice` is a
fake GPU for tests on machines without one: numpy "device" arrays, "pinned" buffers that are numpy arrays,
streams that DEFER their work until an event or synchronize (optionally interleaving streams at random),
and kernels that are the numpy references of the CUDA kernels. Deferral is what makes the fake useful: a
pipeline that reused a staging buffer before waiting for its stream would copy the wrong bytes and the
bit-identity tests against the CPU executor would fail. The fake also accounts staging bytes for the
budget tests.

CuPy is imported only when a GPU is asked for; without it (or without a CUDA device) the error says how to
install it: ``pip install 'lazyweights[gpu]'`` (which installs cupy-cuda12x).

Example (on the fake backend; on a machine with a GPU, drop `backend=` to use CuPy):
    >>> import numpy as np, ml_dtypes
    >>> from lazyweights import WeightData, DType, plan
    >>> from lazyweights.run.gpu import materialize_gpu, NumpyDevice
    >>> w = WeightData.from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    >>> res = materialize_gpu(plan({"t": w.T.astype(DType.bfloat16)}), "gpu:0", backend=NumpyDevice())
    >>> res["t"].dtype.name, res.dtypes["t"].name   # bf16 is held as uint16 bits on the device
    ('uint16', 'bfloat16')
    >>> res["t"].view(ml_dtypes.bfloat16).tolist()
    [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
"""
from __future__ import annotations

import os
import random
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..core.device import DeviceRef
from ..core.dtype import DType
from ..core.errors import BudgetError, DTypeError, ExecutionError, LazyWeightsError, ShapeError
from ..core.units import available_cpus, parse_size
from ..graph.node import Node
from ..kernels.cuda_casts import DEVICE_CASTS, storage_dtype
from ..kernels.cuda_dequant import DEVICE_DEQUANT
from .blocks import row_alignment, write_rows

__all__ = ["materialize_gpu", "DeviceArrays", "DeviceProgram", "split_chain", "to_torch", "CupyDevice",
           "NumpyDevice", "import_cupy", "INSTALL_HINT"]

DEFAULT_STREAMS = 4
DEFAULT_GPU_BLOCK_BYTES = 16 << 20  # source bytes per block: large enough for full PCIe speed per copy
INSTALL_HINT = "pip install 'lazyweights[gpu]'  (installs cupy-cuda12x; needs an NVIDIA driver for CUDA 12)"

_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def default_host_threads() -> int:
    env = os.environ.get("LAZYWEIGHTS_GPU_HOST_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    cpus = available_cpus()
    return max(2, min(4, cpus))


# ==========================================================================================================
# Splitting a chain into host part and device program.

@dataclass(frozen=True)
class DeviceProgram:
    """The value ops one step runs on the device, bottom-up: an optional GGUF dequantize (to float32), then
    a chain of casts `((src, dst), ...)` on bit patterns (same-size bitcasts just relabel the bits).
    One kernel per block."""

    src: DType                      # dtype of the host part's rows (uint8 for a dequantize)
    dequant: object = None          # QuantizationEncoding or None
    chain: tuple = ()               # ((DType, DType), ...)
    out: DType = DType.float32      # dtype the kernel stores (the step's dtype, up to a same-size bitcast)

    @property
    def out_size(self) -> int:
        return self.out.size_in_bytes

    def __str__(self) -> str:
        parts = [f"dequantize[{self.dequant.name}]"] if self.dequant is not None else []
        parts += [f"cast[{a.short}->{b.short}]" for a, b in self.chain]
        return " + ".join(parts) or "copy"

    def reference(self, src_u8: np.ndarray) -> np.ndarray:
        """What the kernel stores for packed/source bytes `src_u8`, computed with the numpy references:
        a flat array of unsigned ints of the output width."""
        from ..kernels.cuda_casts import reference_chain
        from ..kernels.cuda_dequant import reference_dequantize

        if self.dequant is not None:
            bits = reference_dequantize(self.dequant, src_u8).reshape(-1).view(np.uint32)
        else:
            bits = src_u8.view(_UINT[self.src.size_in_bytes]).astype(np.uint32)
        if self.chain:
            bits = reference_chain(bits, self.chain)
        return bits.astype(_UINT[self.out_size])


def split_chain(root: Node) -> tuple[Node, DeviceProgram | None]:
    """(host node, device program) for a step's (cast-sunk) root.

    Walks down from the root while the op is one the device runs: a cast in `DEVICE_CASTS`, a bitcast
    between same-size dtypes, or (at the bottom) a dequantize of a block type in `DEVICE_DEQUANT` on a
    tensor of 2+ dimensions (so output rows are input rows) whose target is float32 or reachable by a device
    cast. Everything below is the host part. Bitcasts directly over the host part stay on the host (a
    bitcast of a view is a view). No cast or dequantize on the device -> no program (a plain copy).

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> x = ops.const(np.zeros((4, 8), np.float32))
        >>> host, prog = split_chain(ops.cast(ops.permute(x, (1, 0)), "bfloat16"))
        >>> host.op, str(prog)
        ('permute', 'cast[f32->bf16]')
        >>> split_chain(ops.cast(x, "float64"))[1] is None   # not a device cast: all on the host
        True
    """
    walked: list[tuple[str, Node]] = []
    n = root
    while True:
        if n.op == "cast" and (n.srcs[0].dtype, n.dtype) in DEVICE_CASTS:
            walked.append(("cast", n))
            n = n.srcs[0]
            continue
        if (n.op == "bitcast" and n.srcs[0].dtype.size_in_bytes == n.dtype.size_in_bytes
                and n.srcs[0].shape == n.shape):
            walked.append(("bitcast", n))
            n = n.srcs[0]
            continue
        if n.op == "dequantize" and n.ndim >= 2 and n.srcs[0].ndim >= 2:
            encoding, dtype = n.arg
            if encoding in DEVICE_DEQUANT and (dtype is DType.float32 or (DType.float32, dtype) in DEVICE_CASTS):
                walked.append(("dequantize", n))
                n = n.srcs[0]
        break
    walked.reverse()  # bottom-up
    while walked and walked[0][0] == "bitcast":
        n = walked.pop(0)[1]
    if not any(kind != "bitcast" for kind, _ in walked):
        return root, None
    dequant, chain = None, []
    for kind, node in walked:
        if kind == "dequantize":
            dequant, dtype = node.arg
            if dtype is not DType.float32:
                chain.append((DType.float32, dtype))
        elif kind == "cast":
            chain.append((node.srcs[0].dtype, node.dtype))
    out = chain[-1][1] if chain else DType.float32
    return n, DeviceProgram(src=n.dtype, dequant=dequant, chain=tuple(chain), out=out)


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

    `to_torch(name)` gives a zero-copy torch tensor of the real dtype; `to_torch()` all of them."""

    def __init__(self, arrays=(), dtypes: Mapping[str, DType] | None = None):
        super().__init__(arrays)
        self.dtypes: dict[str, DType] = dict(dtypes or {})

    def to_torch(self, name: str | None = None):
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
        raise LazyWeightsError(
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
            raise LazyWeightsError(
                f"CuPy is installed but no CUDA device is usable ({type(e).__name__}: {e}); check the NVIDIA "
                f"driver, or install the CuPy build for your CUDA version ({INSTALL_HINT})"
            ) from None
        if not 0 <= device_id < count:
            raise LazyWeightsError(f"gpu:{device_id} requested, but this machine has {count} CUDA device(s)")
        self.cupy = cupy
        self.id = device_id
        self.device = cupy.cuda.Device(device_id)

    def activate(self):
        return self.device

    # memory
    def empty(self, shape, dtype: np.dtype):
        return self.cupy.empty(shape, dtype)

    def pinned(self, nbytes: int) -> np.ndarray:
        # Straight from cudaHostAlloc, not CuPy's pinned pool: freed memory goes back to the OS, so the
        # budget really bounds what this run holds.
        from cupy.cuda import pinned_memory

        ptr = pinned_memory.PinnedMemoryPointer(pinned_memory.PinnedMemory(max(1, nbytes)), 0)
        return np.ndarray((nbytes,), np.uint8, buffer=ptr)

    def staging(self, nbytes: int):
        mem = self.cupy.cuda.Memory(max(1, nbytes))  # cudaMalloc, outside the pool (freed on release)
        return self.cupy.ndarray((nbytes,), self.cupy.uint8, self.cupy.cuda.MemoryPointer(mem, 0))

    def release(self, buf) -> None:
        pass  # freed when the last reference goes

    # streams
    def stream(self):
        return self.cupy.cuda.Stream(non_blocking=True)

    def record(self, stream):
        ev = self.cupy.cuda.Event(block=False, disable_timing=True)
        ev.record(stream)
        return ev

    def synchronize(self, streams) -> None:
        for s in streams:
            s.synchronize()

    # work
    def h2d(self, dst, src: np.ndarray, stream) -> None:
        # The runtime call, not MemoryPointer.copy_from_host_async, whose pointer argument changed type
        # across CuPy versions. `src` is pinned, so this returns at once and the DMA runs on `stream`.
        if src.nbytes:
            rt = self.cupy.cuda.runtime
            rt.memcpyAsync(dst.data.ptr, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, stream.ptr)

    def d2d(self, dst, src, stream) -> None:
        if src.nbytes:
            rt = self.cupy.cuda.runtime
            rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, rt.memcpyDeviceToDevice, stream.ptr)

    def run(self, program: DeviceProgram, src_u8, dst, stream) -> None:
        """The program's fused kernel: `src_u8` (flat uint8 staging) -> `dst` (flat output elements)."""
        from ..kernels import cuda_casts, cuda_dequant

        out = dst.view(_UINT[program.out_size])
        if program.dequant is not None:
            cuda_dequant.launch(program.dequant, program.chain, src_u8, out, stream)
            return
        kernel = cuda_casts.cast_kernel(program.chain)
        with stream:
            kernel(src_u8.view(_UINT[program.src.size_in_bytes]), out)

    # arrays
    def flat_bytes(self, arr):
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
                    raise LazyWeightsError(f"destination for {name!r} is on {value.device}, not on gpu:{self.id}")
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
            raise LazyWeightsError(f"destination for {name!r} is on gpu:{arr.device.id}, not gpu:{self.id}")
        return _check_destination(name, arr, dtype, shape)


class _FakeStream:
    """A queue of deferred operations: they run when an event recorded after them is waited on, at
    synchronize, or (with a seed) at random moments, never before their predecessors on the stream."""

    def __init__(self, index: int):
        self.index = index
        self.queue: deque = deque()
        self.done = 0    # operations executed
        self.issued = 0  # operations enqueued

    def enqueue(self, fn) -> None:
        self.queue.append(fn)
        self.issued += 1

    def run_until(self, position: int) -> None:
        while self.done < position:
            self.queue.popleft()()
            self.done += 1

    # `with stream:` as CuPy allows (unused by the pipeline, here for symmetry)
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _FakeEvent:
    def __init__(self, stream: _FakeStream):
        self.stream, self.position = stream, stream.issued

    def synchronize(self) -> None:
        self.stream.run_until(self.position)

    def done(self) -> bool:
        return self.stream.done >= self.position


class NumpyDevice:
    """A fake GPU on the CPU, for testing the pipeline without CUDA (see the module docstring).

    `deferred=False` runs every operation at once (a fully synchronous device). With `deferred=True` (the
    default) stream work waits until an event or synchronize asks for it; `seed` additionally runs pending
    work of random streams at random moments, exploring other interleavings. Records the peak of staging
    bytes held (`peak_staging`) and every operation (`log`) for tests.
    """

    name = "numpy"

    def __init__(self, deferred: bool = True, seed: int | None = None, device_id: int = 0):
        self.deferred = deferred
        self.rng = random.Random(seed) if seed is not None else None
        self.id = device_id
        self.streams: list[_FakeStream] = []
        self.held = 0
        self.peak_staging = 0
        self.log: list[tuple] = []
        self._sizes: dict[int, int] = {}

    def activate(self):
        return _FakeStream(-1)  # any context manager

    def empty(self, shape, dtype: np.dtype) -> np.ndarray:
        arr = np.empty(shape, dtype)
        arr.reshape(-1).view(np.uint8)[...] = 0xA5  # garbage, so an unwritten row shows
        return arr

    def _hold(self, buf: np.ndarray) -> np.ndarray:
        self._sizes[id(buf)] = buf.nbytes
        self.held += buf.nbytes
        self.peak_staging = max(self.peak_staging, self.held)
        return buf

    def pinned(self, nbytes: int) -> np.ndarray:
        return self._hold(np.full(nbytes, 0x5A, np.uint8))

    def staging(self, nbytes: int) -> np.ndarray:
        return self._hold(np.full(nbytes, 0x3C, np.uint8))

    def release(self, buf) -> None:
        self.held -= self._sizes.pop(id(buf), 0)

    def stream(self) -> _FakeStream:
        s = _FakeStream(len(self.streams))
        self.streams.append(s)
        return s

    def record(self, stream: _FakeStream) -> _FakeEvent:
        return _FakeEvent(stream)

    def synchronize(self, streams) -> None:
        for s in streams:
            s.run_until(s.issued)

    def _submit(self, stream: _FakeStream, what: tuple, fn) -> None:
        self.log.append((what[0], stream.index) + what[1:])
        stream.enqueue(fn)
        if not self.deferred:
            stream.run_until(stream.issued)
        elif self.rng is not None:
            for s in self.streams:
                if s.done < s.issued and self.rng.random() < 0.3:
                    s.run_until(self.rng.randint(s.done, s.issued))

    def h2d(self, dst: np.ndarray, src: np.ndarray, stream) -> None:
        def copy():
            dst[...] = src  # reads the pinned buffer when the copy RUNS, as DMA does

        self._submit(stream, ("h2d", src.nbytes), copy)

    def d2d(self, dst: np.ndarray, src: np.ndarray, stream) -> None:
        def copy():
            dst[...] = src

        self._submit(stream, ("d2d", src.nbytes), copy)

    def run(self, program: DeviceProgram, src_u8: np.ndarray, dst: np.ndarray, stream) -> None:
        def kernel():
            dst.view(_UINT[program.out_size])[...] = program.reference(src_u8)

        self._submit(stream, ("kernel", str(program), src_u8.nbytes), kernel)

    def flat_bytes(self, arr: np.ndarray) -> np.ndarray:
        return arr.reshape(-1).view(np.uint8)

    def as_destination(self, name: str, value, dtype: DType, shape):
        if not isinstance(value, np.ndarray):
            raise DTypeError(f"destination for {name!r} must be an array on the (fake) device, "
                             f"got {type(value).__name__}")
        arr = value
        if arr.dtype == dtype.to_numpy() and arr.dtype != storage_dtype(dtype):
            arr = arr.view(storage_dtype(dtype))  # the fake also accepts ml_dtypes arrays of the real dtype
        if not arr.flags.writeable:
            raise LazyWeightsError(f"destination for {name!r} is read-only")
        return _check_destination(name, arr, dtype, shape)


def _check_destination(name: str, arr, dtype: DType, shape):
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

@dataclass
class _GpuStep:
    step: object                    # schedule.Step
    host: Node
    program: DeviceProgram | None
    host_row_bytes: int
    out_row_bytes: int
    blocks: list = field(default_factory=list)   # list[range]
    solo: set = field(default_factory=set)       # indices of blocks too big for a slot
    primary: object = None
    extras: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.step.outputs[0]


class _Slot:
    def __init__(self, backend, index: int):
        self.backend = backend
        self.index = index
        self.stream = backend.stream()
        self.event = None
        self.pinned = None
        self.dev = None

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
            self.event = None

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


def _nrows(node: Node) -> int:
    return node.shape[0] if node.shape else 1


def _cut(gs: _GpuStep, limit: int, target: int, budget: int) -> None:
    """Cut a step into row blocks of at most min(target, limit) source bytes (aligned so no row is read
    twice); blocks that cannot be that small run alone ("solo") if they fit the whole budget."""
    node, step = gs.step.node, gs.step
    nrows = _nrows(node)
    if node.size == 0:
        gs.blocks = []
        return
    factor = 2 if gs.program is not None else 1
    row = max(1, gs.host_row_bytes)
    if step.whole or not node.shape:
        gs.blocks = [range(0, nrows)]
    else:
        align = row_alignment(node)
        rows = max(1, min(target, limit) // row)
        rows = max(align, rows // align * align)
        gs.blocks = [range(r, min(r + rows, nrows)) for r in range(0, nrows, rows)]
    for i, rows in enumerate(gs.blocks):
        need = len(rows) * gs.host_row_bytes
        if need > limit:
            if need * factor > budget:
                what = "must be computed whole and" if len(rows) == nrows else f"in blocks of {len(rows)} row(s)"
                raise BudgetError(
                    f"tensor {gs.name!r} ({node.dtype.name}{list(node.shape)}) {what} needs "
                    f"{need * factor} bytes of pinned{' + device' if factor == 2 else ''} staging memory, more "
                    f"than the budget of {budget} bytes"
                )
            gs.solo.add(i)


def materialize_gpu(plan, device="gpu:0", budget=None, progress=False, out=None, *, backend=None,
                    streams: int = DEFAULT_STREAMS, host_threads: int | None = None,
                    block_bytes: int | None = None) -> DeviceArrays:
    """Compute every output of `plan` on a GPU: name -> CuPy array (see the module docstring).

    `device`: "gpu:N" or DeviceRef.GPU(N). `budget`: bytes of pinned + device staging memory (int or
    "512MB"). `out`: name -> destination (CuPy arrays, torch CUDA tensors, or other CUDA DLPack arrays; bf16
    destinations may be uint16 CuPy arrays or torch.bfloat16 tensors). `streams`: CUDA streams (= staging
    slots). `host_threads`: threads reading sources into pinned memory. `block_bytes`: source bytes per
    block. `backend`: a `NumpyDevice` to run the pipeline without a GPU (tests).
    Results in bf16/fp8 are unsigned integer arrays of the same bits; `.dtypes` has the real dtypes.
    """
    from .progress import Progress
    from ..compiler.steps import DEFAULT_BUDGET, compile_steps
    from .driver import _name_error

    device = DeviceRef.parse(device)
    if backend is None:
        if not device.is_gpu:
            raise LazyWeightsError(f"materialize_gpu needs a GPU device, got {device}")
        backend = CupyDevice(device.id)
    budget = parse_size(budget) or DEFAULT_BUDGET
    streams = max(1, int(streams))
    target = int(block_bytes or DEFAULT_GPU_BLOCK_BYTES)
    out = dict(out or {})
    for name in out:
        if name not in plan.outputs:
            raise LazyWeightsError(f"destination given for {name!r}, which is not an output of the plan")

    # compile_steps fuses, orders by (file, offset) and shares tied outputs. Its blocks and budget check
    # are the CPU executor's (output + intermediates per row, per worker); this executor's working memory is
    # staging (pinned + device copies of the SOURCE rows), so blocks are re-cut and the budget checked below,
    # still before any work. Hence an unlimited budget here, and no merged rows (its blocks are re-cut by
    # source rows of the output node as the plan has it).
    steps = compile_steps(plan, budget=1 << 62, workers=1, materialize=False, merge_rows=False)
    gsteps: list[_GpuStep] = []
    for step in steps:
        host, program = split_chain(step.node)
        nrows = _nrows(step.node)
        gsteps.append(_GpuStep(step, host, program, host.nbytes // max(1, nrows), step.node.nbytes // max(1, nrows)))
    has_program = any(g.program is not None for g in gsteps)
    slot_budget = budget // streams
    limit = max(1, slot_budget // (2 if has_program else 1))  # source bytes one slot's block may hold
    for g in gsteps:
        _cut(g, limit, target, budget)
    pinned_bytes = max((len(r) * g.host_row_bytes for g in gsteps for i, r in enumerate(g.blocks)
                        if i not in g.solo), default=0)
    dev_bytes = max((len(r) * g.host_row_bytes for g in gsteps if g.program is not None
                     for i, r in enumerate(g.blocks) if i not in g.solo), default=0)

    result: dict = {}
    dtypes = {name: node.dtype for name, node in plan.outputs.items()}
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

        tasks = [(g.step, rows, g, i) for g in gsteps for i, rows in enumerate(g.blocks)]
        bar = Progress(sum(len(t[1]) * t[2].out_row_bytes for t in tasks), "materialize gpu") if progress else None
        slots = [_Slot(backend, i) for i in range(streams)]
        pool = ThreadPoolExecutor(max_workers=host_threads or default_host_threads(),
                                  thread_name_prefix="lazyweights-gpu-read")
        pending: deque = deque()
        try:
            turn = 0
            for task in tasks:
                g, index = task[2], task[3]
                if index in g.solo:
                    while pending:
                        _launch(backend, pending.popleft(), bar)
                    for slot in slots:
                        slot.wait()
                        slot.free()  # make room: a solo block may use the whole budget
                    _run_solo(backend, task, slots[0], bar)
                    continue
                slot = slots[turn]
                turn = (turn + 1) % streams
                while len(pending) >= streams:
                    _launch(backend, pending.popleft(), bar)
                slot.wait()  # its previous block's copy and kernel are done: the buffers are free
                slot.ensure(pinned_bytes, dev_bytes)
                pending.append((task, slot, pool.submit(_fill, task, slot.pinned)))
            while pending:
                _launch(backend, pending.popleft(), bar)
            backend.synchronize([s.stream for s in slots])
        except BaseException as e:
            for _, _, fut in pending:
                fut.cancel()
            pool.shutdown(wait=True)  # no host thread may still be writing a buffer we free
            backend.synchronize([s.stream for s in slots])  # no copy may still be reading one
            failed = getattr(e, "_lw_task", None)
            if failed is not None and not isinstance(e, (KeyboardInterrupt, SystemExit)):
                named = _name_error(e, failed)
                raise named from (None if named is e else e)
            raise
        finally:
            pool.shutdown(wait=True)
            for slot in slots:
                slot.free()
        if bar:
            bar.close()
    return DeviceArrays({name: result[name] for name in plan.outputs}, dtypes)


def _fill(task, pinned: np.ndarray) -> None:
    """Host thread: write the block's host-part rows (source dtype) into the pinned buffer."""
    step, rows, g = task[0], task[1], task[2]
    try:
        for r in step.sources:
            r.file.check_unchanged(r.name)  # a truncated map would SIGBUS: check before touching pages
        host = g.host
        nbytes = len(rows) * g.host_row_bytes
        buf = pinned[:nbytes].view(host.dtype.to_numpy())
        if not host.shape:
            write_rows(host, rows, buf.reshape(()), {})
        else:
            write_rows(host, rows, buf.reshape((len(rows),) + host.shape[1:]), {})
    except BaseException as e:
        e._lw_task = task
        raise


def _launch(backend, entry, bar) -> None:
    """Main thread: once the block's host rows are in pinned memory, enqueue its copy and kernel."""
    task, slot, fut = entry
    fut.result()  # re-raises the host thread's error (tagged with its task)
    try:
        _enqueue(backend, task, slot.pinned, slot.dev, slot.stream)
        slot.event = backend.record(slot.stream)
    except BaseException as e:
        e._lw_task = task
        raise
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
        backend.run(g.program, dev[:n_src], out_bytes[o0:o1].view(_UINT[size]), stream)
    for extra in g.extras:  # further destinations of tied outputs: device-to-device, same stream
        backend.d2d(backend.flat_bytes(extra)[o0:o1], out_bytes[o0:o1], stream)


def _run_solo(backend, task, slot: _Slot, bar) -> None:
    """A block too big for a slot: temporary buffers of its own size, filled and run alone."""
    g, rows = task[2], task[1]
    n_src = len(rows) * g.host_row_bytes
    pinned = backend.pinned(n_src)
    dev = backend.staging(n_src) if g.program is not None else None
    try:
        _fill(task, pinned)
        try:
            _enqueue(backend, task, pinned, dev, slot.stream)
        except BaseException as e:
            e._lw_task = task
            raise
        backend.synchronize([slot.stream])
    finally:
        backend.synchronize([slot.stream])
        backend.release(pinned)
        if dev is not None:
            backend.release(dev)
    if bar:
        bar.advance(len(rows) * g.out_row_bytes)
