"""Memory-mapped source files and the tensor records readers produce.

A reader (safetensors, GGUF) validates a file's header and yields `TensorRecord`s: where a tensor's bytes
are (file, absolute offset, byte length) and what they mean (dtype, shape, quantization). Records are
frozen and hashable: they are the argument of a graph `source` node.

`SourceFile` owns one read-only memory map per file. It remembers the file's size and identity (device,
inode, mtime) when opened and re-checks them before any tensor bytes are touched, so a file truncated or
replaced after `load_weights` gives a `SourceChangedError` instead of a SIGBUS.

Example:
    >>> import numpy as np, tempfile, os
    >>> from lazyweights.formats.source import SourceFile, TensorRecord
    >>> from lazyweights import DType
    >>> path = os.path.join(tempfile.mkdtemp(), "raw.bin")
    >>> np.arange(6, dtype=np.float32).tofile(path)
    >>> f = SourceFile.open(path)
    >>> rec = TensorRecord(f, "x", 0, 24, DType.float32, (2, 3))
    >>> rec.array().tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""
from __future__ import annotations

import mmap
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.dtype import DType
from ..core.errors import FormatError, SourceChangedError
from ..core.quantization import QuantizationEncoding
from ..io.remote import RemoteFile, current_options, is_url, url_exists


def absolute_location(path) -> str:
    """A path made absolute, or a URL as it is: the key files are known by."""
    return path if is_url(path) else os.path.abspath(os.fspath(path))


def location_exists(path) -> bool:
    """Whether a local file or a remote object exists."""
    return url_exists(path) if is_url(path) else os.path.exists(path)


class SourceFile:
    """One opened checkpoint file: a read-only mmap plus the identity it had when opened.

    Files are shared: opening the same path twice returns the same object (per process), so the same
    file's tensors share one map and equal source nodes compare equal.
    """

    # A weak cache: records hold their SourceFile strongly and numpy views hold the mmap, so a file stays
    # mapped exactly as long as something can still read it, and no longer (a mapping kept for the life of
    # the process would keep every touched page in its page tables; test_laziness.py).
    _cache: "weakref.WeakValueDictionary[str, SourceFile]" = weakref.WeakValueDictionary()
    _cache_lock = threading.Lock()

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise FormatError(f"{path}: no such file") from None
        except OSError as e:
            raise FormatError(f"{path}: cannot open: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            self.size = st.st_size
            self._identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            # mmap of an empty file is an error on Linux; such a file fails header validation anyway.
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self.size else None
        finally:
            os.close(fd)
        self._buffer = np.frombuffer(self._map, dtype=np.uint8) if self._map is not None else np.empty(0, np.uint8)

    @classmethod
    def open(cls, path: str) -> "SourceFile":
        """The shared SourceFile for `path`, re-opened if the file on disk changed since it was cached.

        A URL (`http(s)://`, `s3://`, `gs://`) opens a `RemoteFile` instead, with the `storage_options` and cache
        of the `io.remote.remote_options` block in force (`load_weights` sets them): same interface."""
        if is_url(path):
            return RemoteFile.open(path, *current_options())  # type: ignore[return-value]
        key = os.path.abspath(path)
        with cls._cache_lock:
            f = cls._cache.get(key)
            if f is not None and f.changed() is None:
                return f
            f = cls(key)
            cls._cache[key] = f
            return f

    # --- identity ---------------------------------------------------------------------------------
    def changed(self) -> str | None:
        """None if the file on disk is the one we mapped; otherwise a description of what changed."""
        try:
            st = os.stat(self.path)
        except OSError as e:
            return f"it can no longer be read ({e.strerror})"
        now = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if now == self._identity:
            return None
        if now[:2] != self._identity[:2]:
            return "it was replaced by another file"
        if st.st_size != self.size:
            return f"its size changed from {self.size} to {st.st_size} bytes"
        return "it was modified"

    def check_unchanged(self, tensor: str | None = None) -> None:
        """Raise SourceChangedError if the file changed since it was opened. Call before touching pages."""
        what = self.changed()
        if what is not None:
            about = f" while reading tensor {tensor!r}" if tensor else ""
            raise SourceChangedError(
                f"{self.path}: the file changed after it was opened{about}: {what}. "
                "Reload it with load_weights()."
            )

    # --- bytes --------------------------------------------------------------------------------------
    def read(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) as a copy; for headers. FormatError if past the end."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(
                f"{self.path}: wants bytes [{offset}, {offset + length}) but the file has {self.size} bytes"
            )
        return bytes(self._buffer[offset:offset + length])

    def prefetch(self, offset: int, length: int) -> None:
        """Ask the kernel to start reading [offset, offset+length) into the page cache in the background
        (madvise WILLNEED on the map); returns at once and reads nothing itself."""
        if self._map is None or length <= 0:
            return
        page = mmap.PAGESIZE
        start = max(0, offset // page * page)
        end = min(self.size, offset + length)
        try:
            self._map.madvise(mmap.MADV_WILLNEED, start, end - start)
        except (AttributeError, OSError, ValueError):
            pass  # a platform without madvise: prefetching is only a hint

    def read_into(self, offset: int, out: np.ndarray, tensor: str | None = None) -> None:
        """Fill `out` (a C-contiguous array) with the file's bytes from `offset` by `pread`, not through the map.

        Why: a copy from the map faults every page of a fresh mapping in, and on a cold page cache each
        fault waits for one small readahead, so a few threads keep only a few small reads queued. One read
        call per block asks the kernel for the whole range (large reads) and costs no page-table work. The
        descriptor is checked to be the file that was mapped (SourceChangedError otherwise), and a file
        shortened under us gives a SourceChangedError naming the bytes, never a SIGBUS.

        Example:
            >>> import tempfile, os, numpy as np
            >>> p = os.path.join(tempfile.mkdtemp(), "f.bin"); open(p, "wb").write(bytes(range(16)))
            16
            >>> out = np.empty(4, np.uint8); SourceFile.open(p).read_into(6, out); out.tolist()
            [6, 7, 8, 9]
        """
        flat = out.reshape(-1).view(np.uint8)  # a view: `out` must be C-contiguous
        if offset < 0 or offset + flat.size > self.size:
            raise FormatError(f"{self.path}: wants bytes [{offset}, {offset + flat.size}) but the file has "
                              f"{self.size} bytes")
        if not hasattr(os, "preadv"):  # Windows: no positioned read into a buffer; copy from the map
            self.check_unchanged(tensor)
            np.copyto(flat, self._buffer[offset:offset + flat.size])
            return
        about = f" while reading tensor {tensor!r}" if tensor else ""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise SourceChangedError(f"{self.path}: the file can no longer be opened{about} ({e.strerror}). "
                                     "Reload it with load_weights().") from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self._identity:
                self.check_unchanged(tensor)  # names what changed
                raise SourceChangedError(f"{self.path}: the file changed after it was opened{about}. "
                                         "Reload it with load_weights().")
            done, into = 0, flat.data  # the array's buffer, written in place
            while done < flat.size:
                n = os.preadv(fd, [into[done:]], offset + done)
                if n <= 0:
                    raise SourceChangedError(
                        f"{self.path}: the file ended at byte {offset + done} while reading bytes [{offset}, "
                        f"{offset + flat.size}){about}: it was shortened after it was opened. Reload it with "
                        "load_weights().")
                done += n
        finally:
            os.close(fd)

    def view(self, offset: int, length: int) -> np.ndarray:
        """A zero-copy, read-only uint8 view of [offset, offset+length) of the map."""
        return self._buffer[offset:offset + length]

    def whole_view(self) -> np.ndarray:
        """The whole map (header parsers index it directly)."""
        return self._buffer

    def __repr__(self) -> str:
        return f"SourceFile({self.path!r}, {self.size} bytes)"

    def __reduce__(self):  # pickled for dask.distributed: workers re-open the file themselves
        return (SourceFile.open, (self.path,))


@dataclass(frozen=True, eq=False, slots=True)
class TensorRecord:
    """Where one stored tensor's bytes are and what they mean.

    `dtype` and `shape` describe the stored array: for quantized tensors the dtype is uint8 and the last
    dimension is the byte length of one row of blocks (MAX's convention), with `encoding` set.
    `offset` is absolute within the file.
    """

    file: SourceFile
    name: str
    offset: int
    nbytes: int
    dtype: DType
    shape: tuple[int, ...]
    encoding: QuantizationEncoding | None = None
    extra: Any = field(default=None, compare=False)  # format-specific details (e.g. GGUF type id)

    def __post_init__(self):
        # Refuse shapes numpy cannot hold even when they have no elements: numpy multiplies the non-zero
        # dims by the item size and refuses past 2**63 (`[2**62, 0]` F32, `[2**31, 2**31, 0]` U8 once cast).
        # The non-zero dims (in values, for quantized rows) may multiply to at most 2**60, so any cast or
        # dequantization fits too (test_fuzz.py).
        span, last = 1, len(self.shape) - 1
        for i, d in enumerate(self.shape):
            if i == last and self.encoding is not None and d:
                d = d // self.encoding.block_bytes * self.encoding.block_elements
            span *= d or 1
        if len(self.shape) > 32 or span > 2**60:
            raise FormatError(
                f"{self.file.path}: tensor {self.name!r}: shape {list(self.shape)} cannot be represented "
                f"(more than 32 dimensions, or non-zero dims multiplying past 2**60 values)"
            )
        elements = 1
        for d in self.shape:
            elements *= int(d)
        expected = elements * self.dtype.size_in_bytes
        if expected != self.nbytes:
            raise FormatError(
                f"{self.file.path}: tensor {self.name!r}: {self.dtype.name}{list(self.shape)} needs "
                f"{expected} bytes but the header gives {self.nbytes}"
            )
        if self.offset < 0 or self.offset + self.nbytes > self.file.size:
            raise FormatError(
                f"{self.file.path}: tensor {self.name!r}: bytes [{self.offset}, {self.offset + self.nbytes}) "
                f"lie outside the file ({self.file.size} bytes)"
            )

    @classmethod
    def trusted(cls, file, name: str, offset: int, nbytes: int, dtype: DType, shape: tuple[int, ...],
                encoding: QuantizationEncoding | None = None, extra: Any = None) -> "TensorRecord":
        """A record whose facts a reader has already checked (every check of `__post_init__`: the shape
        representable, dtype x shape == nbytes, the bytes inside the file), made without checking them
        again: a 90,000-tensor checkpoint opens in a third less time (benchmarks/bench_scale.py).

        Example:
            >>> import numpy as np, tempfile, os
            >>> path = os.path.join(tempfile.mkdtemp(), "raw.bin")
            >>> np.arange(4, dtype=np.float32).tofile(path)
            >>> TensorRecord.trusted(SourceFile.open(path), "x", 0, 16, DType.float32, (4,)).array().tolist()
            [0.0, 1.0, 2.0, 3.0]
        """
        self = object.__new__(cls)
        _set_file(self, file)
        _set_name(self, name)
        _set_offset(self, offset)
        _set_nbytes(self, nbytes)
        _set_dtype(self, dtype)
        _set_shape(self, shape)
        _set_encoding(self, encoding)
        _set_extra(self, extra)
        return self

    # Records compare by location and meaning, so equal source nodes built twice are one node.
    def _key(self):
        return (self.file.path, self.offset, self.nbytes, self.dtype, self.shape, self.encoding, self.name)

    def __eq__(self, other):
        return isinstance(other, TensorRecord) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def array(self, check: bool = True, fetch: bool = True) -> np.ndarray:
        """The tensor as a zero-copy, read-only numpy view of the map (after an identity check).

        For a remote file the bytes are fetched first; `fetch=False` skips that and gives the mirror as it
        is, holes included: only for the executors, which fetch each step's exact byte ranges beforehand
        (`run/fetch.py`), so a rank reads only its slice."""
        if check:
            self.file.check_unchanged(self.name)
        if not fetch:
            raw = self.file.whole_view()[self.offset:self.offset + self.nbytes]
            return raw.view(self.dtype.to_numpy()).reshape(self.shape)
        raw = self.file.view(self.offset, self.nbytes)
        return raw.view(self.dtype.to_numpy()).reshape(self.shape)


# The slots' setters (a frozen dataclass refuses plain assignment): `TensorRecord.trusted` calls them.
_set_file, _set_name, _set_offset, _set_nbytes = (vars(TensorRecord)[k].__set__
                                                  for k in ("file", "name", "offset", "nbytes"))
_set_dtype, _set_shape, _set_encoding, _set_extra = (vars(TensorRecord)[k].__set__
                                                      for k in ("dtype", "shape", "encoding", "extra"))


@dataclass(frozen=True)
class PickleFile:
    """The file of a pickle checkpoint (`formats/torch_pickle.py`): torch owns its map, so there is nothing to
    check or prefetch; it has the `SourceFile` calls records' users make."""

    path: str
    size: int

    def check_unchanged(self, tensor: str | None = None) -> None:
        """Nothing to check: torch owns the map, which cannot change under it."""
        return None

    def prefetch(self, offset: int, length: int) -> None:
        """Nothing to ask for: torch's map of a local file (`Weights.prefetch` calls it on every record's file)."""
        return None


@dataclass(frozen=True, eq=False)
class TorchTensorRecord:
    """A tensor of a pickle checkpoint: like `TensorRecord`, but its bytes are torch's map, held by `node`
    (a `const` node over a read-only numpy view). `offset` is unknown (None). Made by
    `formats/torch_pickle.py`; defined here, beside `TensorRecord`, so `Checkpoint` can name both."""

    file: PickleFile
    name: str
    nbytes: int
    dtype: DType
    shape: tuple[int, ...]
    node: Any
    encoding: Any = None
    offset: Any = None
    extra: Any = field(default=None)

    def array(self, check: bool = True, fetch: bool = True) -> np.ndarray:  # local: always present
        """The tensor's bytes as a read-only numpy view of torch's map (always present: the file is local)."""
        return self.node.arg.array
