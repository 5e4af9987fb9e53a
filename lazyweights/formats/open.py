"""Open a checkpoint: detect its format, resolve its files, run the reader. Only headers are read.

`open_checkpoint(paths)` accepts what `load_weights` accepts: one or more `.safetensors` files, a
directory, a `model.safetensors.index.json`, or `.gguf` file(s) (split GGUF too), and returns a
`Checkpoint`: every tensor's `TensorRecord` by name, plus file metadata.

Example:
    >>> import numpy as np, tempfile, os
    >>> from safetensors.numpy import save_file
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> save_file({"w": np.ones(2, np.float32)}, path)
    >>> weights_format([path]).value, sorted(open_checkpoint([path]).records)
    ('safetensors', ['w'])
"""
from __future__ import annotations

import os
import struct
from concurrent.futures import Future
from pathlib import Path
from typing import Iterable

from ..core.errors import FormatError, RemoteError, UsageError
from ..core.units import paused_gc
from ..io.remote import (
    FIRST_READAHEAD,
    LISTED_SCHEMES,
    METADATA_READAHEAD,
    RemoteFile,
    current_options,
    is_url,
    list_prefix,
    open_all,
    remote_options,
)
from .checkpoint import Checkpoint, PathLike, WeightsFormat, read_index
from .json_files import beside
from .source import SourceFile, TensorRecord, absolute_location


def _as_paths(paths: PathLike | Iterable[PathLike]) -> list[Path | str]:
    """Local paths as `Path`s; URLs stay strings (a `Path` would fold their '//'), so below a `str` is a URL."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path | str] = [os.fspath(p) if is_url(p) else Path(p) for p in paths]
    if not out:
        raise UsageError("load_weights() was given no paths")
    return out


def _expand(paths: list[Path | str]) -> list[Path | str]:
    """Directories become their checkpoint files (the index if there is one)."""
    out: list[Path | str] = []
    for p in paths:
        if isinstance(p, str):  # a URL (see _as_paths)
            out.extend(_expand_url(p))
            continue
        if p.is_dir():
            index = sorted(p.glob("*.safetensors.index.json"))
            if index:
                out.append(index[0])
                continue
            found = sorted(p.glob("*.safetensors")) or sorted(p.glob("*.gguf"))
            if not found:
                pickles = sorted(q.name for q in p.iterdir()
                                 if q.name.lower().endswith((".bin", ".pt", ".pth", ".ckpt")))
                if pickles:
                    raise FormatError(
                        f"{p}: directory holds no .safetensors, .safetensors.index.json or .gguf files; it has "
                        f"{', '.join(pickles)}: PyTorch pickle(s), refused unless opened with "
                        f"--allow-pickle weights_only (allow_pickle='weights_only'): {p / pickles[0]}")
                raise FormatError(f"{p}: directory holds no .safetensors, .safetensors.index.json or .gguf files")
            out.extend(found)
        else:
            out.append(p)
    return out


def _url_name(url: str) -> str:
    return url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()


def _expand_url(url: str) -> list[str]:
    """A checkpoint file's URL as it is; an `s3://` or `gs://` prefix becomes its index or its checkpoint files."""
    if _url_name(url).endswith((".safetensors", ".json", ".gguf")) or not url.lower().startswith(LISTED_SCHEMES):
        return [url]
    objects = list_prefix(url, current_options()[0])
    names = [o for o in objects if "/" not in o[len(url.rstrip("/")) + 1:]]  # this level only
    index = [o for o in names if o.endswith(".safetensors.index.json")]
    found = index[:1] or [o for o in names if o.endswith(".safetensors")] or [o for o in names if o.endswith(".gguf")]
    if not found:
        raise FormatError(f"{url}: the prefix holds no .safetensors, .safetensors.index.json or .gguf objects "
                          f"({len(objects)} objects listed)")
    return found


def weights_format(paths: PathLike | Iterable[PathLike]) -> WeightsFormat:
    """The format of a checkpoint, from its file names (and magic bytes where the name says nothing).

    Raises FormatError for mixed formats or unrecognised files.
    """
    found = {_format_of(p) for p in _expand(_as_paths(paths))}
    if len(found) != 1:
        raise FormatError(f"mixed checkpoint formats: {sorted(f.value for f in found)}")
    return found.pop()


def _format_of(p) -> WeightsFormat:
    name = _url_name(p) if is_url(p) else p.name.lower()
    if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
        return WeightsFormat.safetensors
    if name.endswith(".gguf"):
        return WeightsFormat.gguf
    if name.endswith((".bin", ".pt", ".pth", ".ckpt")):
        return WeightsFormat.pytorch
    if is_url(p):
        f = SourceFile.open(p)
        head = f.read(0, min(9, f.size))
        if head[:4] == b"GGUF":
            return WeightsFormat.gguf
        if len(head) == 9 and head[8:9] == b"{":
            return WeightsFormat.safetensors
        raise FormatError(f"{p}: not a recognised checkpoint (expected .safetensors, .safetensors.index.json or "
                          f".gguf; the object starts with {head!r})")
    try:
        with open(p, "rb") as fh:
            head = fh.read(9)
    except OSError as e:
        raise FormatError(f"{p}: cannot open: {e.strerror}") from None
    if head[:4] == b"GGUF":
        return WeightsFormat.gguf
    if len(head) == 9 and head[8:9] == b"{":
        return WeightsFormat.safetensors
    raise FormatError(f"{p}: not a recognised checkpoint (expected .safetensors, .safetensors.index.json or .gguf)")


def open_checkpoint(paths: PathLike | Iterable[PathLike], allow_pickle=None, *, storage_options: dict | None = None,
                    cache: str | None = None, decompress: bool = True) -> Checkpoint:
    """Resolve `paths` to files, validate every header, and collect the tensor records.

    Any path may be a URL (`http(s)://`, `s3://`, `gs://`; an `s3://` or `gs://` prefix is listed), opened with
    `storage_options` and, with `cache=DIR`, a persistent range cache (`io/remote.py`). Pickle checkpoints are
    refused unless `allow_pickle="weights_only"` (torch's restricted unpickler, see `formats/torch_pickle.py`).

    A compressed-tensors folder (config.json's `quantization_config`) comes back as lazy dense weights
    (`formats/compressed_tensors.py`) unless `decompress=False`."""
    with remote_options(storage_options, cache):  # (one block: config.json, fetched with the shards, is read
        checkpoint = _open_checkpoint(paths, allow_pickle)  # by the decompression check without a request)
        if decompress and checkpoint.format is WeightsFormat.safetensors:
            from .compressed_tensors import decompress_checkpoint

            checkpoint = decompress_checkpoint(checkpoint)
    return checkpoint


def _open_checkpoint(paths, allow_pickle) -> Checkpoint:
    from .torch_pickle import is_pickle_checkpoint, pickle_allowed, read_torch_checkpoint

    given = _as_paths(paths)
    local = [p for p in given if isinstance(p, Path)]  # URLs are strings (_as_paths)
    if pickle_allowed(allow_pickle) and len(local) == len(given) and is_pickle_checkpoint(local):
        return read_torch_checkpoint(local)
    files = _expand(_as_paths(paths))
    fmt = weights_format(files)
    if fmt is WeightsFormat.pytorch:
        raise FormatError(
            f"{files[0]}: PyTorch pickle checkpoints are refused: unpickling runs arbitrary code. "
            "Convert it to safetensors with a trusted tool first, or pass allow_pickle='weights_only' "
            "(--allow-pickle weights_only on the command line) to load it with torch's restricted unpickler."
        )
    if fmt is WeightsFormat.gguf:
        from .gguf import read_gguf_checkpoint  # imported lazily: gguf support is its own module

        return read_gguf_checkpoint([str(f) for f in files])
    with paused_gc():  # (90,000 records and their headers' dicts: see core/units.paused_gc)
        return _open_safetensors(files)


# A remote checkpoint's shards are opened in one round of concurrent requests (issue 35; `io/remote.open_all`).
# Header bytes a tensor takes beyond its name: 72-78 in compact JSON (DeepSeek-V3's and W1's shards), so 128
# leaves room for spaced JSON and 12-digit offsets; plus the 8-byte length and 4 KiB for `__metadata__`.
HEADER_BYTES_PER_TENSOR = 128
HEADER_GUESS_CAP = 8 << 20


def _header_guesses(index_map: dict[str, Path | str]) -> dict[str, int]:
    """Bytes to read ahead when opening each remote shard the index names: its expected header (the names
    the index places there, plus `HEADER_BYTES_PER_TENSOR` each), at least `FIRST_READAHEAD`, at most
    `HEADER_GUESS_CAP`. A guess too small costs a second request, as without one.

    >>> _header_guesses({"a.weight": "http://h/1.safetensors", "b" * 600: "http://h/2.safetensors"})
    {'http://h/1.safetensors': 65536, 'http://h/2.safetensors': 65536}
    >>> _header_guesses({f"layers.{i}.weight": "s3://b/m.safetensors" for i in range(1000)})
    {'s3://b/m.safetensors': 148994}
    """
    sizes: dict[str, int] = {}
    for name, where in index_map.items():
        if isinstance(where, str):  # a URL (local shards are `Path`s: read_index)
            sizes[where] = sizes.get(where, 8 + 4096) + len(name) + HEADER_BYTES_PER_TENSOR
    return {url: min(HEADER_GUESS_CAP, max(FIRST_READAHEAD, n)) for url, n in sizes.items()}


def _fetch_header(url: str, readahead: int) -> None:
    """Open a remote shard and bring its whole safetensors header into memory (what `read_safetensors` then
    parses without a request). A length it cannot use is left for `read_safetensors` to refuse."""
    from .safetensors import MAX_HEADER_BYTES

    f = RemoteFile.open(url, *current_options(), readahead=readahead)
    if f.size >= 8:
        (n,) = struct.unpack("<Q", f.read(0, 8))
        if n <= MAX_HEADER_BYTES and 8 + n <= f.size:
            f.ensure(8, n)


def _open_remote(urls: list[str], guesses: dict[str, int]) -> dict[str, Future]:
    """Start opening every remote shard at once (`io/remote.open_all`), each with its header guess, and the
    config.json beside them in the same round (the compressed-tensors check reads it right after the open;
    `_fetch_beside`)."""
    beside_first = beside(urls[0], "config.json")
    return open_all(urls + [beside_first], lambda u: _fetch_beside(u) if u == beside_first else
                    _fetch_header(u, guesses.get(u, FIRST_READAHEAD)))


def _fetch_beside(url: str) -> None:
    """Open a small file beside the shards with its bytes (`METADATA_READAHEAD`). A failure here is no
    error: the file may not exist, and whoever reads it later (`formats/json_files.read_json`) reports
    what it meets then."""
    try:
        RemoteFile.open(url, *current_options(), readahead=METADATA_READAHEAD)
    except RemoteError:
        pass  # absent or refused: read_json meets it again when (and if) the file is read, and says so


def _open_safetensors(files: list[Path | str]) -> Checkpoint:
    from .safetensors import read_safetensors

    shard_files: list[Path | str] = []
    index_map: dict[str, Path | str] | None = None
    index_meta: dict = {}
    for f in files:
        if (_url_name(f) if isinstance(f, str) else f.name).endswith(".index.json"):
            idx_shards, idx_map, index_meta = read_index(f)
            shard_files.extend(idx_shards)
            index_map = {**(index_map or {}), **idx_map}
        else:
            shard_files.append(f)

    records: dict[str, TensorRecord] = {}
    metadata: dict = {"index": index_meta} if index_meta else {}
    seen_files: list[str] = []
    # de-duplicated by absolute path, order kept: a shard named both through the index and by its own
    # (relative) path is read once.
    shards = list(dict.fromkeys(absolute_location(f) for f in shard_files))
    urls = [s for s in shards if is_url(s)]
    opening = _open_remote(urls, _header_guesses(index_map) if index_map else {}) if urls else {}
    try:
        for shard in shards:
            if shard in opening:
                opening[shard].result()  # this shard's open error, if any: the first in index order wins
            recs, meta = read_safetensors(shard)
            seen_files.append(recs[0].file.path if recs else shard)
            if meta:
                metadata.setdefault("files", {})[str(shard)] = meta
                for k, v in meta.items():
                    metadata.setdefault(k, v)
            for r in recs:
                if r.name in records:
                    raise FormatError(
                        f"tensor {r.name!r} appears in two shards: {records[r.name].file.path} and {r.file.path}"
                    )
                records[r.name] = r
    finally:
        for pending in opening.values():  # after an error: the shards not yet started are not opened
            pending.cancel()
    if index_map is not None:
        located: dict = {}  # a shard's location, worked out once (not once per tensor)
        for name, where in index_map.items():
            rec = records.get(name)
            if rec is None:
                raise FormatError(f"{where}: the index names tensor {name!r} in this shard but the shard does not "
                                  "contain it")
            path = located.get(where)
            if path is None:
                path = located[where] = absolute_location(where)
            if rec.file.path != path:
                raise FormatError(
                    f"tensor {name!r}: the index places it in {where} but it is in {rec.file.path}"
                )
    return Checkpoint(WeightsFormat.safetensors, records, metadata, seen_files)


