"""Write safetensors files from planned shapes and dtypes, streaming, atomically.

`SafetensorsLayout` computes a whole file's header and every tensor's offset from metadata alone, in
exactly the layout `safetensors.numpy.save_file` produces (tensors sorted by dtype, widest first, then by
name; compact JSON; header padded with spaces to 8 bytes), so a saved file is byte-identical to what the
safetensors package would write for the same tensors. `StreamingFile` writes blocks at their offsets with
`os.pwrite` (from any thread, in any order) into `NAME.tmp-XXXX`, then fsyncs and renames it into place.
Until `commit()`, nothing exists under the final name; `abort()` removes the temporary.

Example:
    >>> import json, os, tempfile, numpy as np
    >>> from safetensors.numpy import load_file
    >>> from lazyweights import DType
    >>> from lazyweights.formats.safetensors_writer import SafetensorsLayout, StreamingFile
    >>> layout = SafetensorsLayout({"w": (DType.float32, (2,))}, {"format": "np"})
    >>> path = os.path.join(tempfile.mkdtemp(), "x.safetensors")
    >>> with StreamingFile(path, layout.file_size) as f:
    ...     f.write(0, layout.header_bytes)
    ...     f.write(layout.offsets["w"], np.array([1.5, 2.5], np.float32).tobytes())
    >>> load_file(path)["w"].tolist()
    [1.5, 2.5]
"""
from __future__ import annotations

import json
import os
import secrets

import numpy as np

from ..core.dtype import DType
from ..core.errors import DTypeError, WriteError
from .safetensors import CODE_OF_DTYPE

# safetensors' Dtype enum order (it sorts tensors by this, descending, then by name).
_RANK = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
         "I32", "U32", "F32", "F64", "I64", "U64"]


class SafetensorsLayout:
    """Header bytes and absolute tensor offsets for one file, from (dtype, shape) per name."""

    def __init__(self, tensors: dict[str, tuple[DType, tuple[int, ...]]], metadata: dict[str, str] | None = None):
        for name, (dtype, _) in tensors.items():
            if dtype not in CODE_OF_DTYPE:
                raise DTypeError(f"tensor {name!r}: safetensors cannot store {dtype.name}")
        order = sorted(tensors, key=lambda n: (-_RANK.index(CODE_OF_DTYPE[tensors[n][0]]), n))
        header: dict = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        offset = 0
        rel: dict[str, tuple[int, int]] = {}
        for name in order:
            dtype, shape = tensors[name]
            n = dtype.size_in_bytes
            for d in shape:
                n *= int(d)
            header[name] = {"dtype": CODE_OF_DTYPE[dtype], "shape": [int(d) for d in shape],
                            "data_offsets": [offset, offset + n]}
            rel[name] = (offset, n)
            offset += n
        raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        self.header_bytes = len(raw).to_bytes(8, "little") + raw
        data_start = len(self.header_bytes)
        self.order = order
        self.offsets = {name: data_start + o for name, (o, _) in rel.items()}
        self.sizes = {name: n for name, (_, n) in rel.items()}
        self.file_size = data_start + offset


class StreamingFile:
    """A file written by offset into a temporary name and renamed into place on commit."""

    def __init__(self, path: str, size: int | None = None):
        self.path = os.path.abspath(path)
        directory = os.path.dirname(self.path)
        self.tmp_path = os.path.join(directory, f".{os.path.basename(self.path)}.tmp-{secrets.token_hex(4)}")
        try:
            self.fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise WriteError(f"{self.path}: cannot create the output: {e.strerror}", path=self.path) from e
        self.size = size
        self.closed = False
        if size:
            try:
                # Reserve the blocks now so a full disk fails here, before any work, where the FS allows it.
                os.posix_fallocate(self.fd, 0, size)
            except (OSError, AttributeError) as e:
                if getattr(e, "errno", None) == 28:  # ENOSPC
                    self.abort()
                    raise WriteError(f"{self.path}: not enough disk space for {size} bytes", path=self.path) from e

    def write(self, offset: int, data, tensor: str | None = None) -> None:
        """Write `data` (bytes or a C-contiguous array) at `offset`. Thread-safe."""
        if isinstance(data, np.ndarray):  # ml_dtypes arrays do not export the buffer protocol: go via uint8
            data = data.reshape(-1).view(np.uint8)
        view = memoryview(data).cast("B")
        try:
            while len(view):
                n = os.pwrite(self.fd, view, offset)
                if n <= 0:
                    raise OSError(28, "short write")
                view, offset = view[n:], offset + n
        except OSError as e:
            about = f" (tensor {tensor!r})" if tensor else ""
            raise WriteError(f"{self.path}: write failed{about}: {e.strerror or e}", path=self.path, tensor=tensor) from e

    def commit(self) -> None:
        """fsync, rename to the final name, fsync the directory."""
        try:
            os.fsync(self.fd)
            os.close(self.fd)
            self.closed = True
            os.replace(self.tmp_path, self.path)
            dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            self.abort()
            raise WriteError(f"{self.path}: could not finish writing: {e.strerror}", path=self.path) from e

    def abort(self) -> None:
        """Close and remove the temporary file (idempotent)."""
        if not self.closed:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.closed = True
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False
