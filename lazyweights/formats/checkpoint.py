"""What every reader returns: a `Checkpoint` (tensor records by name, file metadata) of a `WeightsFormat`,
and the safetensors index reader the readers share. (`formats/open.py` picks the reader.)

Example:
    >>> from lazyweights.formats.checkpoint import WeightsFormat
    >>> WeightsFormat("safetensors") is WeightsFormat.safetensors
    True
"""
from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Union

from ..core.errors import FormatError
from ..io.remote import is_url
from .source import TensorRecord, TorchTensorRecord

PathLike = Union[str, os.PathLike]


class WeightsFormat(str, enum.Enum):
    """A checkpoint file format, as MAX names them."""

    safetensors = "safetensors"
    gguf = "gguf"
    pytorch = "pytorch"  # recognised only to refuse it: pickles are never loaded


@dataclass
class Checkpoint:
    """Every tensor of a checkpoint (by name, in file order) and its metadata."""

    format: WeightsFormat
    records: Mapping[str, TensorRecord | TorchTensorRecord]  # name -> record, file order (pickles: torch's map)
    metadata: dict = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def read_index(index: Path | str) -> tuple[list[Path | str], dict[str, Path | str], dict]:
    """Parse model.safetensors.index.json; every shard must exist inside the index's directory.

    A URL index names its shards relative to the index's URL (as the Hugging Face hub lays them out), and
    they come back as URL strings; a local index's shards come back as `Path`s."""
    if is_url(index):
        return _read_remote_index(str(index))
    index = Path(index)
    try:
        doc = json.loads(index.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(f"{index}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{index}: not a valid index file: {e}") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise FormatError(f"{index}: 'weight_map' must be an object mapping tensor names to shard file names")
    # Containment is checked on the lexical path (normpath, no symlink resolution), so the Hugging Face hub
    # cache layout works (snapshots/<rev>/model-0000x.safetensors are symlinks to ../../blobs/<sha>). What
    # the index names ('../x', '/abs', 'a/../../x') is confined to the index's directory; symlinks placed
    # there by the local filesystem are trusted (test_security.py).
    root = Path(os.path.abspath(index.parent))
    shards: dict[str, Path | str] = {}
    mapping: dict[str, Path | str] = {}
    for name, rel in weight_map.items():
        if rel not in shards:
            target = Path(os.path.normpath(os.path.join(root, rel)))
            if os.path.isabs(rel) or root not in target.parents:
                raise FormatError(f"{index}: tensor {name!r} names shard {rel!r}, which lies outside the checkpoint "
                                  f"directory {root}")
            if not target.is_file():
                raise FormatError(f"{index}: shard {rel!r} (holding tensor {name!r}) is missing from {root}")
            shards[rel] = target
        mapping[name] = shards[rel]
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return list(shards.values()), mapping, meta


def _read_remote_index(url: str) -> tuple[list[Path | str], dict[str, Path | str], dict]:
    from ..io.remote import fetch_small

    try:
        doc = json.loads(fetch_small(url).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{url}: not a valid index file: {e}") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise FormatError(f"{url}: 'weight_map' must be an object mapping tensor names to shard file names")
    base = url.split("?", 1)[0].rsplit("/", 1)[0]
    shards: dict[str, Path | str] = {}
    mapping: dict[str, Path | str] = {}
    for name, rel in weight_map.items():
        if rel not in shards:
            # the same confinement as for local indexes: no '..', no absolute names, no other host
            if rel.startswith("/") or "://" in rel or any(part in ("..", "") for part in rel.split("/")):
                raise FormatError(f"{url}: tensor {name!r} names shard {rel!r}, which lies outside the checkpoint's "
                                  f"prefix {base}/")
            shards[rel] = f"{base}/{rel}"
        mapping[name] = shards[rel]
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return list(shards.values()), mapping, meta
