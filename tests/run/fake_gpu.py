"""A fake GPU for the GPU executor's tests on machines without one (moved out of the library: it is a test double).

`NumpyDevice` implements `run/gpu.py`'s backend interface with numpy "device" arrays, "pinned" buffers that
are numpy arrays, streams that DEFER their work until an event or synchronize (optionally interleaving
streams at random), and kernels that are the numpy references of the CUDA kernels. Deferral is what makes
the fake useful: a pipeline that reused a staging buffer before waiting for its stream would copy the wrong
bytes and the bit-identity tests against the CPU executor would fail. It also accounts staging bytes for the
budget tests.
"""
from __future__ import annotations

import random
from collections import deque

import numpy as np

from lazyweights.compiler.gpu import UINT_OF_SIZE, DeviceProgram
from lazyweights.core.dtype import DType
from lazyweights.core.errors import DTypeError, LazyWeightsError
from lazyweights.kernels.cuda_casts import storage_dtype
from lazyweights.run.gpu import check_device_destination


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
            dst.view(UINT_OF_SIZE[program.out_size])[...] = program.reference(src_u8)

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
        return check_device_destination(name, arr, dtype, shape)


