"""vLLM's model-loader plugin: `vllm serve SOURCE --load-format lazyweights` (`pip install "lazyweights[vllm]"`).

The `vllm.general_plugins` entry point (pyproject.toml) calls `register()` when vLLM starts, which registers
`LazyWeightsLoader` under the load format `lazyweights`. vLLM is imported only here, and only when vLLM itself
loads the plugin.

How a rank reads only its slice: vLLM's own weight loaders (`ColumnParallelLinear`, `RowParallelLinear`,
`QKVParallelLinear`, `MergedColumnParallelLinear`, `VocabParallelEmbedding`, `FusedMoE`, ...) know each
parameter's partition (`output_dim` / `input_dim`, the tensor-parallel rank and size) and cut the checkpoint
tensor they are handed with `narrow()`. The loader hands them a `LazyTensor`: a torch tensor with the
checkpoint tensor's shape and dtype and no storage, whose `narrow`, `reshape`, `to(dtype)` and indexing build
lazy lazyweights nodes, and whose `copy_` into a parameter is deferred and then computed, with the other
copies of its layer and the layers beside it (whole layers, about `FLUSH_BYTES` or the budget's bytes at a
time), in one fused `materialize(out=...)` straight into the parameters' own memory (numpy views of torch
CPU tensors, their pages faulted in ahead in one call each). So a rank reads exactly the rows and columns
vLLM keeps: from a local map only those pages, from a URL only those byte ranges. Replicated tensors (norms)
are read by every rank, once. Any other op on a `LazyTensor` materializes it first (correct, not sliced).

Sources (`model`): a local Hugging Face folder; an `http(s)://` or `s3://` URL of one (config.json and the
tokenizer files are fetched into a small local folder vLLM reads its config from; weights stay remote and
lazy); a `.gguf` file (local or URL: config.json and tokenizer files are written from its metadata into a small
folder, the weights are dequantized to the model's dtype as they are copied); a compressed-tensors folder
(its stored tensors are handed over as they are, for vLLM's own compressed-tensors kernels).

Options (`--model-loader-extra-config` JSON): `adapter` ("module:function", applied to the lazy state dict,
called as `fn(state_dict, huggingface_config=config)`), `lora` (a PEFT folder or a list of them, merged in the
same pass), `storage_options` and `cache` (object storage, as `load_weights` takes them), `budget` (bytes in
flight, e.g. "512MB"; also how many bytes of deferred copies are computed in one plan), `prefetch` (bool: ask
the kernel to read the next layer of a local map ahead; default true at tensor-parallel size 1). An http(s)
source's requests carry `User-Agent: lazyweights/VERSION vllm-tp-rank/R-of-N` (unless `storage_options`
sets one), so a server's log tells the ranks apart.

Errors, each raised from `load_weights`, before vLLM allocates its KV cache: a tensor the model needs and the
source lacks (`MissingWeightError`, with the nearest names), an adapter that does not import (`AdapterError`),
a GGUF architecture vLLM does not have (`UnsupportedArchitectureError`), an unreachable URL (`RemoteError`).

Example (needs vLLM, `pip install "lazyweights[vllm]"`):
    >>> from vllm import LLM                                                 # doctest: +SKIP
    >>> llm = LLM(model="llama-hf/", load_format="lazyweights",              # doctest: +SKIP
    ...           model_loader_extra_config={"budget": "256MB"})
    >>> llm.generate(["The capital of France is"])                            # doctest: +SKIP

Without vLLM, the option parsing and source classification can be tried:
    >>> parse_options({"budget": "1MB", "lora": "my-lora/"})["lora"]
    ['my-lora/']
    >>> source_kind("http://127.0.0.1:8000/llama/"), source_kind("model.gguf")
    ('remote', 'gguf')
"""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from typing import Any, Iterator, Mapping

import numpy as np

from ..core.errors import (
    AdapterError,
    ArgumentTypeError,
    MissingWeightError,
    UnsupportedArchitectureError,
    UsageError,
    did_you_mean,
)
from ..core.names import parse_layer
from ..core.units import parse_size

_log = logging.getLogger(__name__)

LOAD_FORMAT = "lazyweights"
OPTIONS = ("adapter", "lora", "storage_options", "cache", "budget", "prefetch")
# files vLLM reads besides the weights: fetched from a remote folder into the local config folder
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja",
                "preprocessor_config.json")
# Deferred copies are computed, whole layers at a time, once this many bytes of them are pending (or
# `budget`'s bytes when one is given): one fused plan for a small model instead of a plan and a barrier per
# layer (benchmarks/RESULTS.md, "vLLM loader"). Deferred copies hold no memory: a plan writes straight
# into the parameters and holds at most the budget in flight.
FLUSH_BYTES = 512 << 20


def parse_options(extra: Mapping[str, Any] | None) -> dict:
    """`--model-loader-extra-config` as the loader uses it: unknown keys are a `UsageError` naming the known
    ones; `lora` becomes a list of folders."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(OPTIONS) - {"source"})
    if unknown:
        raise UsageError(f"--model-loader-extra-config for load format {LOAD_FORMAT!r}: unknown key(s) "
                         f"{unknown}; known: {list(OPTIONS)}.{did_you_mean(unknown[0], OPTIONS)}")
    lora = extra.get("lora")
    if isinstance(lora, (str, os.PathLike)):
        extra["lora"] = [os.fspath(lora)]
    elif lora is not None and not isinstance(lora, (list, tuple)):
        raise ArgumentTypeError(f"lora must be a folder or a list of folders, got {type(lora).__name__}")
    if extra.get("storage_options") is not None and not isinstance(extra["storage_options"], Mapping):
        raise ArgumentTypeError("storage_options must be a JSON object")
    return extra


def source_kind(source: str) -> str:
    """'gguf' (a .gguf file, local or remote), 'remote' (an http(s)://, s3:// or gs:// folder or file), 'local'."""
    s = os.fspath(source)
    if s.lower().endswith(".gguf"):
        return "gguf"
    if re.match(r"(?i)^(https?|s3|gs)://", s):
        return "remote"
    return "local"


def _is_url(s: str) -> bool:
    return bool(re.match(r"(?i)^(https?|s3|gs)://", s))


def _checkpoint_paths(source: str, storage_options: Mapping | None = None) -> list[str]:
    """What `load_weights` opens for `source`: a local folder or file as it is; an http(s) folder (HTTP has no
    listing) by its `model.safetensors.index.json`, else its `model.safetensors`; an s3:// or gs:// prefix as it
    is (it is listed)."""
    if source_kind(source) == "gguf" or not _is_url(source):
        return [source]
    if source.lower().endswith((".safetensors", ".json")) or source.lower().startswith(("s3://", "gs://")):
        return [source]
    from ..io.remote import remote_options, url_exists

    base = source.rstrip("/")
    index = f"{base}/model.safetensors.index.json"
    with remote_options(dict(storage_options or {})):
        return [index if url_exists(index) else f"{base}/model.safetensors"]


def _fetch_text(url: str, storage_options: Mapping | None) -> bytes:
    """One small object (a config or tokenizer file) beside a remote checkpoint."""
    from ..io.remote import fetch_small, remote_options

    with remote_options(dict(storage_options or {})):
        return fetch_small(url)


def _fetch_config_files(base: str, storage_options: Mapping | None) -> dict[str, bytes]:
    """The `CONFIG_FILES` beside a remote folder that exist, fetched together: one round of requests, not ten one
    after another (on S3 about 10 round trips, most of them 404s for files a model does not ship). A missing
    optional file (403/404) is left out; a missing `config.json`, or any other failure, is raised: the first in
    `CONFIG_FILES` order, the error a sequential fetch would have raised."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> bytes | None:
        try:
            return _fetch_text(f"{base}/{name}", storage_options)
        except OSError as e:  # RemoteError is an OSError
            if name != "config.json" and getattr(e, "status", None) in (403, 404):
                return None
            raise

    with ThreadPoolExecutor(len(CONFIG_FILES), thread_name_prefix="lazyweights-config") as pool:
        futures = [pool.submit(one, name) for name in CONFIG_FILES]
    files: dict[str, bytes] = {}
    for name, future in zip(CONFIG_FILES, futures):
        data = future.result()
        if data is not None:
            files[name] = data
    return files


def prepare_config_folder(source: str, options: Mapping[str, Any] | None = None, *,
                          folder: str | None = None) -> str:
    """A local folder with the config and tokenizer files vLLM needs for `source` (a URL of a Hugging Face
    folder, or a GGUF file): fetched beside the weights, or written from the GGUF's metadata. The weights are
    not copied. Returns the folder (a new temporary one unless `folder` is given)."""
    options = dict(options or {})
    folder = folder or tempfile.mkdtemp(prefix="lazyweights-vllm-")
    os.makedirs(folder, exist_ok=True)
    so, cache = options.get("storage_options"), options.get("cache")
    if source_kind(source) == "gguf":
        from ..convert.to_hf import gguf_extra_files
        from ..lazy.weights import load_weights

        w = load_weights([source], storage_options=so, cache=cache)
        names = dict(w.items())
        emb = names.get("token_embd.weight")
        vocab = emb.data().shape[0] if emb is not None else None
        files: dict[str, bytes] = gguf_extra_files(w.config.metadata, names, vocab_size=vocab)
        cfg = json.loads(files["config.json"])
        _check_vllm_has(cfg, source)
    else:
        base = source.rstrip("/")
        if base.lower().endswith((".safetensors", ".json")):
            base = base.rsplit("/", 1)[0]
        files = _fetch_config_files(base, so)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return folder


def _check_vllm_has(cfg: Mapping[str, Any], source: str) -> None:
    """A GGUF whose architecture vLLM has no model class for is an `UnsupportedArchitectureError` (raised while
    the engine is configured, before anything is loaded)."""
    try:
        from vllm.model_executor.models import ModelRegistry
    except ImportError:  # vLLM absent: nothing to check against
        return
    archs = list(cfg.get("architectures") or [])
    supported = set(ModelRegistry.get_supported_archs())
    if archs and not any(a in supported for a in archs):
        raise UnsupportedArchitectureError(
            f"{source}: its architecture {archs[0]!r} (from the GGUF metadata) has no model class in vLLM "
            f"{_vllm_version()}.{did_you_mean(archs[0], sorted(supported))}")


def _vllm_version() -> str:
    try:
        import vllm

        return vllm.__version__
    except Exception:  # noqa: BLE001 (only for a message)
        return "?"


# --- the lazy tensor handed to vLLM's weight loaders ---------------------------------------------------------------
def _torch():
    from ..core.torch_dtypes import import_torch

    return import_torch()


def _make_lazy_tensor_class():
    torch = _torch()
    from ..core.torch_dtypes import dtype_to_torch, torch_dtype_to_dtype

    meta_funcs = {torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.__len__,
                  torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.device.__get__,
                  torch.Tensor.ndim.__get__, torch.Tensor.is_floating_point, torch.Tensor.element_size,
                  torch.Tensor.layout.__get__, torch.Tensor.requires_grad.__get__, torch.Tensor.is_cuda.__get__,
                  torch.Tensor.is_meta.__get__, torch.Tensor.is_contiguous, torch.Tensor.stride,
                  torch.Tensor.nelement}

    Tensor: Any = torch.Tensor  # torch is imported here, at run time; mypy cannot take a base class from a variable

    class LazyTensor(Tensor):
        """A checkpoint tensor, not yet read: shape and dtype only. `narrow`, `reshape`/`view`, `to(dtype)`,
        `t()` and basic indexing stay lazy; `dst.copy_(lazy)` is handed to the loader's sink; anything else
        materializes it."""

        @staticmethod
        def __new__(cls, wd, sink):
            t = torch.Tensor._make_wrapper_subclass(cls, tuple(wd.shape), dtype=dtype_to_torch(wd.dtype),
                                                    device="cpu")
            t._wd, t._sink = wd, sink
            return t

        def __repr__(self, *, tensor_contents=None):
            return f"LazyTensor({self._wd.name!r}, {self._wd.dtype.name}{list(self._wd.shape)})"

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            def real(a):
                return a._sink.materialize(a) if isinstance(a, LazyTensor) else a
            return func(*[real(a) for a in args], **{k: real(v) for k, v in (kwargs or {}).items()})

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in meta_funcs:
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **kwargs)
            self = args[0] if args else None
            try:
                if (func is torch.Tensor.copy_ and isinstance(args[1], LazyTensor)
                        and not isinstance(self, LazyTensor)):
                    args[1]._sink.copy(self, args[1])
                    return self
                if isinstance(self, LazyTensor):
                    wd = self._wd
                    if func is torch.Tensor.narrow:
                        dim, start, length = (list(args[1:]) + [kwargs.get(k) for k in ("dim", "start", "length")
                                                                  ][len(args) - 1:])[:3]
                        dim, start, length = int(dim) % len(wd.shape), int(start), int(length)
                        index = (slice(None),) * dim + (slice(start, start + length),)
                        return LazyTensor(wd[index], self._sink)
                    if func in (torch.Tensor.reshape, torch.Tensor.view) and len(args) > 1 and not (
                            len(args) == 2 and isinstance(args[1], torch.dtype)):
                        shape = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list, torch.Size)) \
                            else args[1:]
                        return LazyTensor(wd.reshape(tuple(int(s) for s in shape)), self._sink)
                    if func is torch.Tensor.t and len(wd.shape) == 2:
                        return LazyTensor(wd.T, self._sink)
                    if func is torch.Tensor.to and len(args) == 2 and isinstance(args[1], torch.dtype) \
                            and not kwargs:
                        target = torch_dtype_to_dtype(args[1])
                        if target is not None:
                            return LazyTensor(wd.astype(target) if target != wd.dtype else wd, self._sink)
                    if func is torch.Tensor.__getitem__ and _basic_index(args[1]):
                        return LazyTensor(wd[args[1]], self._sink)
            except (ValueError, TypeError, IndexError):
                pass  # an op lazyweights cannot express lazily: fall back to a real tensor below

            def real(a):
                if isinstance(a, LazyTensor):
                    return a._sink.materialize(a)
                if isinstance(a, (list, tuple)):
                    return type(a)(real(x) for x in a)
                return a
            return func(*real(list(args)), **{k: real(v) for k, v in kwargs.items()})

    return LazyTensor


def _basic_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (int, slice)) or i is Ellipsis or i is None for i in items)


_LAZY_TENSOR = None


def lazy_tensor(wd, sink):
    """A `LazyTensor` over the lazy `wd`, whose copies go to `sink` (a `ParameterSink`)."""
    global _LAZY_TENSOR
    if _LAZY_TENSOR is None:
        _LAZY_TENSOR = _make_lazy_tensor_class()
    return _LAZY_TENSOR(wd, sink)


class ParameterSink:
    """Collects `param.copy_(lazy)` calls and computes them in fused plans straight into the parameters'
    memory (`Plan.materialize(out=...)`), one plan per `flush()` (the loader flushes whole layers, about
    `FLUSH_BYTES` of them at a time). A copy into memory that is not a contiguous CPU tensor, or into a tensor
    that is not a model parameter, is computed at once into a temporary and copied (`copy_`). Counts the
    bytes pending (`pending_bytes`) and the bytes its plans produce (`bytes_out`)."""

    def __init__(self, params, budget=None):
        torch = _torch()
        self._torch = torch
        self.budget = budget
        self.pending: dict[str, tuple[Any, Any, Any]] = {}
        self.pending_bytes = 0
        self.bytes_out = 0
        self._ptrs = {p.data.untyped_storage().data_ptr() for p in params}
        self._n = 0

    def copy(self, dst, lazy) -> None:
        """`dst.copy_(lazy)`: deferred when `dst` is a contiguous view of a parameter, else done now."""
        from ..core.torch_dtypes import torch_dtype_to_dtype
        from ..interop.torch_load import numpy_view
        from ..lazy.weight_data import WeightData  # noqa: F401

        if tuple(dst.shape) != tuple(lazy._wd.shape) and dst.numel() != int(np.prod(lazy._wd.shape)):
            raise UsageError(f"{lazy._wd.name}: vLLM copies shape {list(lazy._wd.shape)} into {list(dst.shape)}")
        target = torch_dtype_to_dtype(dst.dtype)
        wd = lazy._wd
        if target is not None and target != wd.dtype:
            wd = wd.astype(target)
        view = numpy_view(dst) if dst.untyped_storage().data_ptr() in self._ptrs else None
        if view is None or not view.flags.c_contiguous or target is None:
            dst.copy_(self.materialize_wd(wd).reshape(dst.shape))
            return
        self._n += 1
        self.pending[f"{wd.name}#{self._n}"] = (wd.reshape(tuple(dst.shape)) if wd.shape != tuple(dst.shape)
                                               else wd, view, dst)
        self.pending_bytes += view.nbytes

    def materialize_wd(self, wd):
        """A real torch tensor with the value of the lazy `wd` (one plan)."""
        from ..core.torch_dtypes import dtype_to_torch
        from ..interop.torch_load import array_to_torch
        from ..lazy.plan import Plan

        arr = Plan({"x": wd}).materialize(budget=self.budget)["x"]
        self.bytes_out += arr.nbytes
        if not arr.flags.writeable:  # a zero-copy view of a read-only map: torch needs its own memory
            arr = np.array(arr)
        return array_to_torch(arr, dtype_to_torch(wd.dtype))

    def materialize(self, lazy):
        """A real torch tensor with `lazy`'s value (for ops the lazy tensor does not keep lazy)."""
        return self.materialize_wd(lazy._wd)

    def flush(self) -> None:
        """Compute every deferred copy in one fused plan, into the parameters (their pages faulted in first,
        `populate_pages`)."""
        if not self.pending:
            return
        from ..lazy.plan import Plan

        pending, self.pending, self.pending_bytes = self.pending, {}, 0
        out = {k: view for k, (_, view, _) in pending.items()}
        populate_pages(out.values())
        Plan({k: wd for k, (wd, _, _) in pending.items()}).materialize(budget=self.budget, out=out)
        self.bytes_out += sum(view.nbytes for view in out.values())


# --- the source as a lazy state dict, in Hugging Face names --------------------------------------------------------
def lazy_state_dict(source: str, options: Mapping[str, Any] | None = None, *, dtype=None):
    """(state dict name -> lazy WeightData in the names vLLM's models load, the opened `Weights`) for `source`
    with the options applied: a GGUF renamed to Hugging Face names and dequantized to `dtype` (a lazyweights
    DType), LoRA folders merged, the adapter applied. Reads headers only."""
    from ..core.dtype import DType
    from ..lazy.weights import load_weights

    options = parse_options(options)
    so = options.get("storage_options")
    w = load_weights(_checkpoint_paths(source, so), storage_options=so, cache=options.get("cache"), decompress=False)
    fmt = getattr(w.format, "value", w.format)
    state: dict = {k: v.data() for k, v in w.items()}
    if fmt == "gguf":
        from ..convert.to_hf import convert_gguf_state_dict

        state = dict(convert_gguf_state_dict(dict(w.items()), w.config, dequantize_to=dtype or DType.bfloat16,
                                             tokenizer=False))
    if options.get("lora"):
        from ..adapters.lora import merge_lora

        state = merge_lora(state, [os.fspath(d) for d in options["lora"]])
    if options.get("adapter"):
        from ..adapters.loader import load_adapter

        try:
            fn = load_adapter(options["adapter"])
        except AdapterError:
            raise
        except Exception as e:  # noqa: BLE001 (whatever the user's module raised while importing)
            raise AdapterError(f"adapter {options['adapter']!r} cannot be loaded: {type(e).__name__}: {e}") from e
        state = fn(state, huggingface_config=getattr(w, "config", None))
        if not isinstance(state, Mapping):
            raise AdapterError(f"adapter {options['adapter']!r} returned {type(state).__name__}, not a state dict")
    from ..lazy.weight_data import as_weight_data

    return {k: as_weight_data(v, k) for k, v in state.items()}, w


def layer_order(names) -> list[list[str]]:
    """Names grouped for streaming: everything outside `layers.N.` first, then one group per layer, in order.

    >>> layer_order(["model.layers.1.a", "model.norm.weight", "model.layers.0.a", "model.layers.10.a"])
    [['model.norm.weight'], ['model.layers.0.a'], ['model.layers.1.a'], ['model.layers.10.a']]
    """
    rest: list[str] = []
    layers: dict[int, list[str]] = {}
    for n in names:
        layer = parse_layer(n)
        (layers.setdefault(layer[1], []) if layer else rest).append(n)
    return ([rest] if rest else []) + [layers[i] for i in sorted(layers)]


def expected_checkpoint_names(model) -> dict[str, list[str]]:
    """vLLM parameter name -> the checkpoint names that load into it, by the model's `packed_modules_mapping`
    (`qkv_proj` <- q/k/v_proj, `gate_up_proj` <- gate/up_proj)."""
    packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
    out = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        cands = [name]
        for i, p in enumerate(parts):
            if p in packed:
                cands = [".".join(parts[:i] + [q] + parts[i + 1:]) for q in packed[p]]
        out[name] = cands
    return out


def partially_missing(model, state) -> set[str]:
    """vLLM parameters fused from several checkpoint tensors (qkv_proj, gate_up_proj) of which the source has
    some but not all: found from names alone, before any byte is read. (A parameter with none of its tensors
    is found after loading, from what vLLM's `load_weights` reports.)"""
    have = set(state)
    out = set()
    for param, cands in expected_checkpoint_names(model).items():
        present = [c in have for c in cands]
        if len(cands) > 1 and any(present) and not all(present):
            out.add(param)
    return out


def missing_error(missing_params, model, source_names, source: str) -> MissingWeightError:
    """The `MissingWeightError` for vLLM parameters no checkpoint tensor was loaded into, naming the checkpoint
    tensors they needed and the nearest names the source has."""
    expected = expected_checkpoint_names(model)
    names = sorted(source_names)
    lines = []
    for p in sorted(missing_params)[:8]:
        wanted = [c for c in expected.get(p, [p]) if c not in source_names] or expected.get(p, [p])
        lines.append(f"  {wanted[0]!r} (for vLLM's {p!r}).{did_you_mean(wanted[0], names)}")
    more = f"\n  ... and {len(missing_params) - 8} more" if len(missing_params) > 8 else ""
    return MissingWeightError(f"{source}: {len(missing_params)} parameter(s) of the vLLM model have no tensor in "
                              f"the checkpoint ({len(names)} tensors):\n" + "\n".join(lines) + more)


# --- the loader ----------------------------------------------------------------------------------------------------
def _loader_class():
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    logger = init_logger("vllm.model_executor.model_loader.lazyweights")

    class LazyWeightsLoader(BaseModelLoader):
        """vLLM's `--load-format lazyweights`: a lazy graph over the checkpoint, each rank's slices read,
        streamed layer by layer into the parameters."""

        def __init__(self, load_config):
            super().__init__(load_config)
            self.options = parse_options(load_config.model_loader_extra_config)
            self.stats: dict[str, Any] = {}

        def download_model(self, model_config) -> None:
            """Nothing to download: the weights are read lazily where they are."""

        def load_weights(self, model, model_config) -> None:
            from ..core.torch_dtypes import torch_dtype_to_dtype

            source = self.options.get("source") or getattr(model_config, "model_weights", "") or model_config.model
            t0 = time.perf_counter()
            quantized = getattr(model_config, "quantization", None) is not None
            dtype = torch_dtype_to_dtype(model_config.dtype)
            tp_size = _tp_size()
            options = rank_options(self.options, source, _tp_rank(), tp_size)
            state, w = lazy_state_dict(source, options, dtype=dtype)
            params = [p for _, p in model.named_parameters()]
            sink = ParameterSink(params, budget=self.options.get("budget"))
            flush_bytes = parse_size(self.options.get("budget")) or FLUSH_BYTES
            prefetch = self.options.get("prefetch", tp_size == 1) and not _is_url(source)

            def weights() -> Iterator:
                groups = layer_order(list(state))
                for i, group in enumerate(groups):
                    if prefetch and i + 1 < len(groups):
                        _prefetch(w, groups[i + 1])
                    for name in group:
                        yield name, lazy_tensor(state[name], sink)
                    if sink.pending_bytes >= flush_bytes:
                        sink.flush()  # whole layers, about `flush_bytes` of them, in one fused plan

            partial = partially_missing(model, state)
            if partial:
                raise missing_error(partial, model, set(state), source)
            loaded = model.load_weights(weights())
            sink.flush()
            t1 = time.perf_counter()
            self.stats = {"seconds": t1 - t0, "bytes_out": sink.bytes_out, "tensors": len(state)}
            logger.info("Loading weights took %.2f seconds (lazyweights: %d tensors, %.1f MB into parameters)",
                        t1 - t0, len(state), sink.bytes_out / 1e6)
            if loaded is not None and not quantized:
                loaded = set(loaded)
                missing = {n for n, _ in model.named_parameters() if n not in loaded}
                if missing:
                    raise missing_error(missing, model, set(state), source)

    return LazyWeightsLoader


def populate_pages(arrays, workers: int | None = None) -> int:
    """Fault in the pages of `arrays` (fresh destination memory) ahead of the copy, one
    `madvise(MADV_POPULATE_WRITE)` call per array on `workers` threads, instead of one page fault per 4 KB
    page taken inside the copy: vLLM's parameters are `torch.empty` memory never touched before the loader
    writes it, and those faults were about half of a float32 copy (benchmarks/RESULTS.md, "vLLM loader").
    Contents are unchanged (pages already present stay as they are). Best effort: Linux 5.14+; returns the
    bytes populated (0 where the call is not available)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return 0
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    import mmap

    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page, populate_write = mmap.PAGESIZE, 23  # MADV_POPULATE_WRITE (Linux 5.14+, every architecture)
    spans = []
    for a in arrays:
        lo = -(-a.ctypes.data // page) * page  # whole pages inside the array
        hi = (a.ctypes.data + a.nbytes) // page * page
        if hi - lo >= 16 * page:
            spans.append((lo, hi - lo))
    if not spans or madvise(spans[0][0], page, populate_write) != 0:  # EINVAL before Linux 5.14
        return 0
    from concurrent.futures import ThreadPoolExecutor

    from ..core.units import available_cpus

    spans.sort(key=lambda span: -span[1])  # largest first: the threads finish together
    with ThreadPoolExecutor(max(1, min(workers or available_cpus(), len(spans)))) as pool:
        list(pool.map(lambda span: madvise(span[0], span[1], populate_write), spans))
    return sum(n for _, n in spans)


def _prefetch(weights, names) -> None:
    """Ask the kernel to read these checkpoint tensors ahead (local maps; best effort)."""
    try:
        for n in names:
            w = weights[n] if hasattr(weights, "__getitem__") else None
            if w is not None and w.exists():
                w.prefetch()
    except Exception as e:  # noqa: BLE001 (a hint only: an adapter's names need not be the checkpoint's)
        _log.debug("prefetch hint skipped: %s", e)


def _tp_size() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_world_size())
    except Exception:  # noqa: BLE001 (not initialized: one rank)
        return 1


def _tp_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001 (not initialized: rank 0)
        return 0


def rank_options(options: Mapping[str, Any], source: str, rank: int, size: int) -> dict:
    """`options` for tensor-parallel rank `rank` of `size`: an http(s) source's requests say which rank
    sent them (`User-Agent: lazyweights/VERSION vllm-tp-rank/RANK-of-SIZE`, unless `storage_options`
    already sets a User-Agent), so a server's access log attributes each rank's bytes
    (tests/interop/test_vllm.py::test_tensor_parallel_2_over_http).

    >>> rank_options({}, "http://h/m/", 1, 2)["storage_options"]["headers"]["User-Agent"].split()[-1]
    'vllm-tp-rank/1-of-2'
    >>> rank_options({}, "local-folder/", 1, 2)
    {}
    """
    options = dict(options)
    if not re.match(r"(?i)^https?://", os.fspath(source)):
        return options
    from ..core.version import __version__

    so = dict(options.get("storage_options") or {})
    headers = dict(so.get("headers") or {})
    if not any(k.lower() == "user-agent" for k in headers):
        headers["User-Agent"] = f"lazyweights/{__version__} vllm-tp-rank/{rank}-of-{size}"
    so["headers"] = headers
    options["storage_options"] = so
    return options


def _patch_engine_args() -> None:
    """Let `vllm serve URL_OR_GGUF --load-format lazyweights` work: before vLLM builds its engine config, a
    source that is not a local folder gets a small local folder of config and tokenizer files (fetched, or
    written from GGUF metadata), vLLM's `model` points at it, and `model_weights` (vLLM's own field, which
    `runai_streamer` uses the same way) keeps the source the loader reads; an s3:// or gs:// source goes in the loader's
    extra config as `source` instead (vLLM refuses an object-storage `model_weights` for other loaders)."""
    from vllm.engine.arg_utils import EngineArgs

    if getattr(EngineArgs.create_engine_config, "_lazyweights", False):
        return
    original = EngineArgs.create_engine_config

    def create_engine_config(self, *args, **kwargs):
        if self.load_format == LOAD_FORMAT and not self.model_weights and source_kind(self.model) != "local":
            source = self.model
            extra = self.model_loader_extra_config or {}
            if isinstance(extra, str):
                extra = json.loads(extra)
            folder = prepare_config_folder(source, parse_options(extra))
            if self.tokenizer in (None, source):
                self.tokenizer = folder
            if not self.served_model_name:
                self.served_model_name = source
            self.model = folder
            if re.match(r"(?i)^https?://", source) or not _is_url(source):
                self.model_weights = source
            else:  # vLLM takes an s3:// or gs:// `model_weights` for its runai_streamer loaders only
                self.model_loader_extra_config = {**extra, "source": source}
        return original(self, *args, **kwargs)

    create_engine_config._lazyweights = True  # type: ignore[attr-defined]
    EngineArgs.create_engine_config = create_engine_config


def register() -> None:
    """The `vllm.general_plugins` entry point: registers `LazyWeightsLoader` as load format `lazyweights`
    (once per process; vLLM calls it in every process it starts)."""
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER, register_model_loader

    if LOAD_FORMAT not in _LOAD_FORMAT_TO_MODEL_LOADER:
        register_model_loader(LOAD_FORMAT)(_loader_class())
    _patch_engine_args()
