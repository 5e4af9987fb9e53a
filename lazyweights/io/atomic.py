"""The one way lazyweights writes a file or a folder.

A file: `AtomicFile` writes into a hidden temporary beside the final name (a unique name, never a fixed one),
by offset, from any thread, then fsync + rename + directory fsync on `commit()`. Until then nothing exists under
the final name; `abort()` (or an exception in a `with` block, or the object being collected) removes the
temporary. `write_file_atomically` does that for bytes in memory.

A folder: built under `staging_name(path)`, then put in place by `swap_directory`, which keeps the old folder
whole through any failure.

Every writer builds on it: safetensors shards and their index and sharded folders (`lazy/save.py`), GGUF
(`formats/gguf_writer.GGUFStreamWriter`), Hugging Face folders (`convert/result.save_converted`), plan
pictures (`render/visualize.py`), verify manifests (`tools/verify.py`). It sits in `io`, below them all.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with AtomicFile(path, 8) as f:
    ...     f.write(4, b"5678"); f.write(0, b"1234")
    ...     os.path.exists(path)
    False
    >>> open(path, "rb").read()
    b'12345678'
"""
from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import weakref

import numpy as np

from ..core.errors import WriteError

_log = logging.getLogger(__name__)


def fsync_dir(directory: str) -> None:
    """fsync a directory so a rename into it is durable; file systems that cannot do it are skipped (the
    rename itself is atomic either way).

    Example:
        >>> import tempfile
        >>> fsync_dir(tempfile.mkdtemp())
        >>> fsync_dir("/no/such/folder")  # nothing to make durable: skipped, no error
    """
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError as e:
        _log.debug("fsync_dir: cannot open %r (%s): nothing to make durable", directory, e)
        return
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems (and platforms) cannot fsync a directory; the rename still stands
        _log.debug("fsync_dir: %r cannot be fsynced (%s)", directory, e)
    finally:
        os.close(fd)


def _create_temporary(path: str) -> tuple[int, str]:
    """Create and open a new hidden temporary beside `path`, as `tempfile.mkstemp` does: a random name
    (`staging_name`), created with O_EXCL so it is never shared, another name tried on a collision."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = staging_name(path)
        try:
            return os.open(tmp, flags, 0o644), tmp
        except FileExistsError:  # the random name is taken: draw another, as tempfile.mkstemp does
            continue
        except OSError as e:
            raise WriteError(f"{path}: cannot create the output: {e.strerror}", path=path) from e
    raise WriteError(f"{path}: cannot create the output: no free temporary name beside it", path=path)


def _remove(fd_box: list, tmp: str) -> None:
    fd, fd_box[0] = fd_box[0], None
    if fd is not None:
        try:
            os.close(fd)
        except OSError as e:  # cleaning up after a failure: the failure is what gets raised
            _log.debug("closing the temporary %r failed: %s", tmp, e)
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass  # never created, or already gone: nothing to clean up
    except OSError as e:
        _log.warning("could not remove the temporary %r after a failed write: %s", tmp, e)


class AtomicFile:
    """A file written by offset into a temporary name and renamed into place on commit.

    `size`: the file's size; with `reserve=True` its blocks are allocated up front (a full disk then fails
    here, before any work, where the file system can tell), else the file is sized sparsely and a full disk
    fails at the write that hits it, naming its tensor. `fsync=False` skips the data fsyncs."""

    def __init__(self, path, size: int | None = None, *, fsync: bool = True, reserve: bool = True):
        self.path = os.path.abspath(os.fspath(path))
        self.size = size
        self.fsync = fsync
        fd, self.tmp_path = _create_temporary(self.path)
        self._fd_box: list[int | None] = [fd]
        self.state = "open"
        self._finalizer = weakref.finalize(self, _remove, self._fd_box, self.tmp_path)
        if size and not reserve:
            os.ftruncate(fd, size)
        elif size:
            try:
                os.posix_fallocate(fd, 0, size)
            except (OSError, AttributeError) as e:
                if getattr(e, "errno", None) == errno.ENOSPC:
                    self.abort()
                    raise WriteError(f"{self.path}: not enough disk space for {size} bytes", path=self.path) from e
                os.ftruncate(fd, size)  # file systems without fallocate: the size, at least

    @property
    def closed(self) -> bool:
        """True once the file was committed or aborted."""
        return self.state != "open"

    def _fd(self) -> int:
        fd = self._fd_box[0]
        if fd is None or self.state != "open":
            raise WriteError(f"{self.path}: the output is {self.state}", path=self.path)
        return fd

    def write(self, offset: int, data, tensor: str | None = None) -> None:
        """Write `data` (bytes or a C-contiguous array) at `offset`. Thread-safe; `tensor` labels errors."""
        if isinstance(data, np.ndarray):  # ml_dtypes arrays do not export the buffer protocol: go via uint8
            data = data.reshape(-1).view(np.uint8)
        view = memoryview(data).cast("B")
        fd = self._fd()
        try:
            while len(view):
                n = os.pwrite(fd, view, offset)
                if n <= 0:
                    raise OSError(errno.ENOSPC, "short write")
                view, offset = view[n:], offset + n
        except OSError as e:
            about = f" (tensor {tensor!r})" if tensor else ""
            raise WriteError(f"{self.path}: write failed{about}: {e.strerror or e}", path=self.path,
                             tensor=tensor) from e

    def commit(self) -> str:
        """fsync, rename to the final name, fsync the directory. Returns the final path."""
        if self.state == "committed":
            return self.path
        fd = self._fd()
        try:
            if self.fsync:
                os.fsync(fd)
            os.close(fd)
            self._fd_box[0] = None
            os.replace(self.tmp_path, self.path)
        except OSError as e:
            self.abort()
            raise WriteError(f"{self.path}: could not finish writing: {e.strerror}", path=self.path) from e
        self.state = "committed"
        self._finalizer.detach()
        if self.fsync:
            fsync_dir(os.path.dirname(self.path))
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file (idempotent; nothing after a commit)."""
        if self.state == "committed":
            return
        self.state = "aborted"
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            if self.state == "open":
                self.commit()
        else:
            self.abort()
        return False


def write_file_atomically(path, data: bytes, *, fsync: bool = True) -> str:
    """Write a small file whole (an index, a manifest, a picture): a reader sees the old file or all of the
    new one, and a failure leaves the old file and no temporary. Returns the final (absolute) path.
    `fsync=False` skips the fsyncs (a cache's bookkeeping, where atomic is enough and durable is not needed).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "index.json")
        >>> write_file_atomically(path, b"{}") == path, open(path, "rb").read()
        (True, b'{}')
        >>> _ = write_file_atomically(path, b'{"a": 1}')
        >>> open(path, "rb").read(), os.listdir(os.path.dirname(path))
        (b'{"a": 1}', ['index.json'])
    """
    with AtomicFile(path, len(data), fsync=fsync) as f:
        f.write(0, data)
    return f.path


def swap_directory(staging: str, target: str) -> None:
    """Put the folder `staging` in place of `target` (which may not exist yet), so that `target` is always
    either the old folder, whole, or the new one, whole; then fsync the parent directory.

    POSIX renames one folder over another only when the second is empty, so an existing `target` is first
    renamed to a unique hidden backup beside it, then `staging` to `target`, then the backup is removed. If
    the second rename fails, the backup is renamed back before the error propagates: the old folder survives
    any failure, and no backup is left behind. `staging` must be on the same file system (a sibling). A
    failed rename is a `WriteError` naming `target` (and, if even the renaming back failed, where the old
    folder is).

    Example:
        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> for name, text in (("out", "old"), ("new", "fresh")):
        ...     os.makedirs(os.path.join(root, name))
        ...     with open(os.path.join(root, name, "f.txt"), "w") as f:
        ...         _ = f.write(text)
        >>> swap_directory(os.path.join(root, "new"), os.path.join(root, "out"))
        >>> open(os.path.join(root, "out", "f.txt")).read(), sorted(os.listdir(root))
        ('fresh', ['out'])
    """
    target = os.path.abspath(target)
    parent = os.path.dirname(target)
    fsync_dir(staging)  # the staged folder's own entries are durable before it takes the name
    backup = None
    if os.path.lexists(target):
        if not os.path.isdir(target) or os.path.islink(target):
            raise WriteError(f"{target} exists and is not a folder; cannot put a folder there", path=target)
        backup = staging_name(target, "old")
        try:
            os.rename(target, backup)
        except OSError as e:  # nothing moved: the old folder is still in place
            raise WriteError(f"{target}: cannot move the old folder aside: {e.strerror or e}", path=target) from e
    try:
        os.rename(staging, target)
    except BaseException as e:
        if backup is not None:
            try:
                os.rename(backup, target)  # the old folder back under its name
            except OSError as e2:
                raise WriteError(f"{target}: the new folder could not be put in place ({e}) nor the old one "
                                 f"back ({e2.strerror or e2}); the old folder is whole at {backup}",
                                 path=target) from e
        if isinstance(e, OSError):
            raise WriteError(f"{target}: cannot put the new folder in place: {e.strerror or e}", path=target) from e
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
    fsync_dir(parent)


def staging_name(path: str, kind: str = "tmp") -> str:
    """A unique hidden sibling name for building `path` in place (`.name.tmp-1a2b3c4d`): never a fixed name,
    so two writers of the same path never share a temporary.

    Example:
        >>> a, b = staging_name("/data/out.svg"), staging_name("/data/out.svg")
        >>> a.startswith("/data/.out.svg.tmp-") and a != b
        True
    """
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{tail}.{kind}-{secrets.token_hex(4)}")


def commit_file(tmp: str, path: str) -> str:
    """Finish a file another program wrote under `tmp` (a `staging_name(path)`): fsync it, rename it to `path`,
    fsync the directory. Returns `path`. For writers that cannot write through `AtomicFile` (Graphviz's `dot`
    writes its own output file). A failure is a `WriteError`, and `tmp` is then the caller's to remove.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "plan.svg")
        >>> tmp = staging_name(path)
        >>> with open(tmp, "w") as f:
        ...     _ = f.write("<svg/>")
        >>> commit_file(tmp, path) == path, os.path.exists(tmp), open(path).read()
        (True, False, '<svg/>')
    """
    try:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        raise WriteError(f"{path}: could not finish writing: {e.strerror or e}", path=path) from e
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    return path
