"""The typed interface a SOURCE node's argument has, wherever its bytes live.

`compiler/` and `run/` read sources only through these Protocols, so they never import `formats/` (above them)
and never ask where the bytes are: a local memory map (`formats/source.SourceFile`) and a remote object's
mirror (`io/remote.RemoteFile`) are both a `ByteSource`; the readers' `TensorRecord` is a `SourceRecord`.

Example:
    >>> import numpy as np, tempfile, os
    >>> from lazyweights.formats.source import SourceFile, TensorRecord
    >>> from lazyweights import DType
    >>> path = os.path.join(tempfile.mkdtemp(), "raw.bin")
    >>> np.arange(4, dtype=np.float32).tofile(path)
    >>> f = SourceFile.open(path)
    >>> isinstance(f, ByteSource), isinstance(TensorRecord(f, "x", 0, 16, DType.float32, (4,)), SourceRecord)
    (True, True)
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class ByteSource(Protocol):
    """One file or object: its identity (`path`, `size`) and its bytes by range."""

    path: str
    size: int

    def read(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) as a copy (headers)."""

    def view(self, offset: int, length: int) -> np.ndarray:
        """A read-only uint8 view of [offset, offset+length), its bytes present."""

    def whole_view(self) -> np.ndarray:
        """The whole source as a uint8 view, bytes not yet fetched included (readers that fetch first)."""

    def prefetch(self, offset: int, length: int) -> None:
        """A hint: start bringing [offset, offset+length) in; returns at once."""

    def changed(self) -> str | None:
        """None while the source is the one opened; else what changed."""

    def check_unchanged(self, tensor: str | None = None) -> None:
        """Raise SourceChangedError if the source changed since it was opened."""


@runtime_checkable
class SourceRecord(Protocol):
    """Where one stored tensor's bytes are (`file`, `offset`, `nbytes`) and what they mean."""

    file: Any  # a ByteSource
    name: str
    offset: int
    nbytes: int
    dtype: Any  # core.dtype.DType
    shape: tuple[int, ...]

    def array(self, check: bool = True, fetch: bool = True) -> np.ndarray:
        """The tensor as a read-only numpy view of its source (`fetch=False`: a remote mirror as it is)."""


def is_remote(source: ByteSource) -> bool:
    """Whether a source fetches its bytes by range (then the executors fetch a step's ranges first)."""
    return hasattr(source, "ensure_ranges")
