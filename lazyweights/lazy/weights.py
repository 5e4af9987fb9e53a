"""`load_weights` and MAX's `Weights` protocol: hierarchical, lazy access to a checkpoint.

`load_weights(paths)` reads headers only. `weights.model.layers[0].mlp.weight` builds the name
`model.layers.0.mlp.weight`; `.data()` returns a lazy `WeightData`; `.items()` walks the names under a
prefix on dot boundaries (`layers[1]` never matches `layers.10`).

Example:
    >>> import numpy as np, tempfile, os
    >>> from safetensors.numpy import save_file
    >>> from lazyweights import load_weights, DType
    >>> d = tempfile.mkdtemp()
    >>> save_file({"model.layers.0.w": np.ones((2, 2), np.float32),
    ...            "model.layers.10.w": np.zeros((2,), np.float32)}, os.path.join(d, "m.safetensors"))
    >>> weights = load_weights([os.path.join(d, "m.safetensors")])
    >>> [name for name, _ in weights.model.layers[1].items()]
    []
    >>> [name for name, _ in weights.model.layers[0].items()]
    ['w']
    >>> weights.model.layers[0].w.data().astype(DType.float16).shape
    (2, 2)
"""
from __future__ import annotations

import os
import threading
from typing import Iterable, Iterator, Mapping

import numpy as np

from ..core.device import DeviceRef
from ..core.dtype import DType
from ..core.errors import ArgumentTypeError, DTypeError, ShapeError, missing_weight
from ..core.quantization import QuantizationEncoding
from ..formats.checkpoint import Checkpoint, WeightsFormat
from ..formats.open import open_checkpoint
from ..formats.source import TensorRecord, TorchTensorRecord
from ..graph import ops
from .weight import Weight
from .weight_data import WeightData


class _Shared:
    """State every accessor of one loaded checkpoint shares: the records and the allocations."""

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint
        self.names = list(checkpoint.records)
        self.allocated: dict[str, Weight] = {}
        self.materialized: dict[str, np.ndarray] = {}
        # Guards the two dicts above: allocate() and allocated_weights may be called from several threads
        # (test_concurrency.py).
        self.lock = threading.RLock()


class Weights:
    """Hierarchical access to a checkpoint's tensors (MAX's `Weights` protocol, lazy)."""

    __slots__ = ("_shared", "_prefix")
    _shared: _Shared  # set through object.__setattr__ (__setattr__ refuses assignment)
    _prefix: str

    def __init__(self, shared: _Shared, prefix: str = ""):
        object.__setattr__(self, "_shared", shared)
        object.__setattr__(self, "_prefix", prefix)

    # --- naming ---------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The current weight name or prefix, e.g. 'model.layers.0' for `weights.model.layers[0]`."""
        return self._prefix

    def _child(self, part: str) -> "Weights":
        return _accessor(self._shared, f"{self._prefix}.{part}" if self._prefix else part)

    def __getattr__(self, attr: str) -> "Weights":
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # keep copy/pickle/numpy protocol probes from becoming names
        return self._child(attr)

    def __getitem__(self, key) -> "Weights":
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return self._child(str(int(key)))
        if isinstance(key, str):
            return self._child(key)
        raise ArgumentTypeError(f"Weights index must be an int or str, not {type(key).__name__} {key!r} "
                                f"(under {self._prefix or 'the root'!r})")

    def __setattr__(self, key, value):
        raise AttributeError("Weights is read-only; build a new state dict instead")

    def __repr__(self) -> str:
        return f"Weights({self._prefix!r})"

    # --- the protocol -----------------------------------------------------------------------------------
    def exists(self) -> bool:
        """True if a tensor with exactly this name exists."""
        return self._prefix in self._shared.checkpoint.records

    def items(self) -> Iterator[tuple[str, "Weights"]]:
        """(name relative to this prefix, accessor) for every tensor under it, in file order."""
        prefix = self._prefix
        if not prefix:
            shared = self._shared
            for name in shared.names:
                yield name, _accessor(shared, name)
            return
        dotted = prefix + "."
        cut = len(dotted)
        for name in self._shared.names:
            if name.startswith(dotted):
                yield name[cut:], _accessor(self._shared, name)

    def keys(self) -> Iterator[str]:
        """Names under this prefix, relative to it (as `items()` yields them), reading nothing."""
        for name, _ in self.items():
            yield name

    def data(self) -> WeightData:
        """The lazy tensor at this name. KeyError (MissingWeightError) with a did-you-mean if absent."""
        record = self._shared.checkpoint.records.get(self._prefix)
        if record is None:
            raise missing_weight(self._prefix, self._shared.names)
        # pickle checkpoints (allow_pickle): a const node over torch's map (no lookup for the common record)
        node = None if type(record) is TensorRecord else getattr(record, "node", None)
        return WeightData.wrap(node if node is not None else ops.source(record), self._prefix, record.encoding)

    def prefetch(self) -> int:
        """Start reading every tensor under this prefix into the page cache in the background (a hint to the
        kernel; nothing is read here). Returns the bytes asked for."""
        total = 0
        for _, accessor in self.items():
            record = self._shared.checkpoint.records.get(accessor._prefix)
            if record is not None and hasattr(record, "file"):
                record.file.prefetch(record.offset, record.nbytes)
                total += record.nbytes
        return total

    def materialize(self, *, prefetch_next: bool = True, budget=None, scheduler=None,
                    workers: int | None = None) -> dict[str, np.ndarray]:
        """Every tensor under this prefix, computed in one fused plan: name (relative, as `items()` gives it)
        -> array. Layer by layer (`weights.model.layers[i].materialize()`), the next layer's bytes are
        prefetched into the page cache while this one is read, so a serving loop over layers finds them there.

        Example:
            >>> import numpy as np, tempfile, os
            >>> from safetensors.numpy import save_file
            >>> from lazyweights import load_weights
            >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
            >>> save_file({f"layers.{i}.w": np.full(4, i, np.float32) for i in range(3)}, path)
            >>> w = load_weights([path])
            >>> {k: v.tolist() for k, v in w.layers[1].materialize().items()}
            {'w': [1.0, 1.0, 1.0, 1.0]}
        """
        from .plan import Plan

        if prefetch_next:
            head, _, last = self._prefix.rpartition(".")
            if last.isdigit():
                Weights(self._shared, f"{head}.{int(last) + 1}" if head else str(int(last) + 1)).prefetch()
        named = list(self.items())
        if not named and self.exists():
            named = [("", self)]
        arrays = Plan({name or self._prefix: acc.data() for name, acc in named}).materialize(
            budget=budget, scheduler=scheduler, workers=workers)
        return arrays

    def allocate(self, dtype: DType | None = None, shape: Iterable[int] | None = None,
                 quantization_encoding: QuantizationEncoding | None = None, device=DeviceRef.CPU()) -> Weight:
        """A `Weight` for this tensor. A different dtype becomes a lazy cast, a different shape a lazy
        reshape (same element count, else ShapeError). Remembered in `allocated_weights`."""
        data = self.data()
        encoding = QuantizationEncoding.parse(quantization_encoding)
        if encoding is not None and data.quantization_encoding not in (None, encoding):
            raise DTypeError(
                f"allocate {self._prefix!r}: the checkpoint stores {data.quantization_encoding.name} blocks, "
                f"not {encoding.name}"
            )
        encoding = encoding or data.quantization_encoding
        if dtype is not None:
            dtype = DType.parse(dtype)
            if dtype is not data.dtype:
                data = data.astype(dtype)
        if shape is not None:
            shape = tuple(int(d) for d in shape)
            if shape != data.shape:
                if int(np.prod(shape, dtype=object)) != data.size:
                    raise ShapeError(
                        f"allocate {self._prefix!r}: shape {list(shape)} has {int(np.prod(shape, dtype=object))} "
                        f"elements but the checkpoint's {list(data.shape)} has {data.size}"
                    )
                data = data.reshape(shape)
        weight = Weight(self._prefix, data.dtype, data.shape, device=device, quantization_encoding=encoding)
        weight.source = data
        with self._shared.lock:
            self._shared.allocated[self._prefix] = weight
            self._shared.materialized.pop(self._prefix, None)
        return weight

    @property
    def allocated_weights(self) -> dict[str, np.ndarray]:
        """Every weight allocated through `allocate()` so far, materialized (one fused plan per device)."""
        shared = self._shared
        with shared.lock:
            pending = {n: w for n, w in shared.allocated.items() if n not in shared.materialized}
            if pending:
                from .plan import Plan

                # One fused plan per device: GPU allocations (DeviceRef.GPU(i)) come back as CuPy arrays.
                for device in {w.device for w in pending.values()}:
                    group = {n: w.source for n, w in pending.items() if w.device == device}
                    shared.materialized.update(Plan(group).materialize(device=device if device.is_gpu else None))
            return {n: shared.materialized[n] for n in shared.allocated}

    # --- checkpoint facts -------------------------------------------------------------------------------
    @property
    def format(self) -> WeightsFormat:
        """The checkpoint's format (`WeightsFormat.safetensors`, `.gguf` or `.pytorch`)."""
        return self._shared.checkpoint.format

    @property
    def metadata(self) -> dict:
        """File metadata (safetensors `__metadata__`, GGUF key/values)."""
        return self._shared.checkpoint.metadata

    @property
    def config(self):
        """A Hugging Face-style config: `GGUFConfig` from GGUF metadata (`cfg.num_attention_heads`, ...),
        or for safetensors the `config.json` beside the files (`HFConfig`); None if there is none."""
        from ..formats.config import config_from_metadata

        return config_from_metadata(self.format, self.metadata, self.files, self._shared.names)

    @property
    def records(self) -> Mapping[str, TensorRecord | TorchTensorRecord]:
        """Every stored tensor's `TensorRecord` (file, offset, bytes, dtype, shape, encoding), by full name (a
        pickle checkpoint's records hold torch's map instead of an offset)."""
        return self._shared.checkpoint.records

    @property
    def files(self) -> list[str]:
        """The checkpoint's files, in the order they were opened (shards in index order)."""
        return list(self._shared.checkpoint.files)

    def __contains__(self, name: str) -> bool:
        return name in self._shared.checkpoint.records

    def __iter__(self):
        raise ArgumentTypeError(f"iterate over Weights.items() (as MAX's Weights protocol does), not the Weights "
                                f"object {self._prefix or '(root)'!r}")


# A Weights accessor made with its two slots stored through their descriptors (`__setattr__` refuses):
# `items()` makes one per tensor, 90,427 for DeepSeek-V3 (benchmarks/bench_scale.py).
_new = object.__new__
_set_shared, _set_prefix = (vars(Weights)[k].__set__ for k in ("_shared", "_prefix"))


def _accessor(shared: _Shared, prefix: str) -> Weights:
    obj = _new(Weights)
    _set_shared(obj, shared)
    _set_prefix(obj, prefix)
    return obj


def load_weights(paths, *, allow_pickle=None, storage_options: dict | None = None, cache: str | None = None,
                 decompress: bool = True) -> Weights:
    """Open a checkpoint lazily: `.safetensors` file(s), a directory, a `model.safetensors.index.json`,
    or `.gguf` file(s) (split GGUF too). Reads and validates headers only.

    Any of them may be a URL: `http(s)://`, `s3://` or `gs://` (an `s3://` or `gs://` prefix is listed).
    `storage_options` (fsspec's names: `endpoint_url`, `key`, `secret`, `token`, `anon`, `headers`, `timeout`,
    `retries`, ...) reach the object store; `cache="~/.cache/lazyweights"` keeps fetched byte ranges for the next
    run, keyed by URL, ETag (a GCS generation) and length. Tensor bytes are fetched by exact byte range when a
    plan first needs them.

    Pickle checkpoints (`.bin`, `.pt`, `.pth`) are refused unless `allow_pickle="weights_only"`: then torch's
    restricted unpickler loads them (`torch.load(weights_only=True, mmap=True)`), zero-copy.

    A compressed-tensors checkpoint (vLLM / llm-compressor: int4/int8 packed, FP8, NVFP4, MXFP4) gives its
    dense weights, each a lazy chain over the packed tensors and scales; `decompress=False` gives the stored
    tensors instead."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return Weights(_Shared(open_checkpoint(list(paths), allow_pickle=allow_pickle, storage_options=storage_options,
                                           cache=cache, decompress=decompress)))
