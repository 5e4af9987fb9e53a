"""The architecture registry: which weight adapter converts which checkpoint format, as MAX does.

    arch = SupportedArchitecture(
        "LlamaForCausalLM",
        weight_adapters={
            WeightsFormat.safetensors: weight_adapters.convert_safetensor_state_dict,
            WeightsFormat.gguf: weight_adapters.convert_gguf_state_dict,
        },
        example_repo_ids=["meta-llama/Llama-3.1-8B-Instruct"],
    )
    register(arch)
    state_dict = adapt("LlamaForCausalLM", ["/path/to/model.safetensors"], huggingface_config=cfg)

`adapt` detects the format from the files (`weights_format`), opens the checkpoint lazily
(`load_weights`), picks the adapter registered for that format and calls it the way MAX's pipeline
does, `adapter(dict(weights.items()), **kwargs)`, then returns the adapted state dict
(`dict[str, WeightData]`; arrays an adapter returns are wrapped). Nothing is read.

Example:
    >>> import numpy as np, tempfile, os
    >>> from safetensors.numpy import save_file
    >>> from lazyweights import WeightsFormat
    >>> from lazyweights.adapters.registry import SupportedArchitecture, register, adapt, unregister
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> save_file({"model.norm.weight": np.ones(4, np.float32)}, path)
    >>> strip = lambda sd, **_: {k.removeprefix("model."): v.data() for k, v in sd.items()}
    >>> _ = register(SupportedArchitecture("TinyForDocs", weight_adapters={WeightsFormat.safetensors: strip}))
    >>> list(adapt("TinyForDocs", [path]))
    ['norm.weight']
    >>> unregister("TinyForDocs")
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Iterable, Mapping

from ..core.errors import (
    AdapterError,
    ArgumentTypeError,
    JSONFileError,
    NoAdapterError,
    UnknownArchitectureError,
    UsageError,
    did_you_mean,
)
from ..formats.checkpoint import WeightsFormat
from ..formats.json_files import json_beside
from ..formats.open import weights_format
from ..io.remote import is_url

_log = logging.getLogger(__name__)

__all__ = ["SupportedArchitecture", "UnknownArchitectureError", "NoAdapterError", "register", "unregister", "get",
           "architectures", "adapt", "architecture_from_config"]






class SupportedArchitecture:
    """An architecture: its name, its weight adapters by `WeightsFormat`, and descriptive fields.

    `weight_adapters` maps a `WeightsFormat` (or its name, "safetensors" / "gguf") to a function
    `(state_dict: dict[str, Weights], **kwargs) -> dict[str, WeightData]`. `module` may be a factory for
    the module the adapter targets (used by `lazyweights check` when no --module is given). Other
    keyword arguments (MAX's `default_encoding`, `supported_encodings`, `task`, ...) are kept as
    attributes."""

    def __init__(self, name: str, weight_adapters: Mapping[Any, Callable] | None = None, *,
                 example_repo_ids: Iterable[str] = (), default_weights_format: WeightsFormat | str | None = None,
                 module: Callable | None = None, **extra):
        if not isinstance(name, str) or not name:
            raise UsageError(f"an architecture needs a non-empty name, got {name!r}")
        self.name = name
        self.weight_adapters: dict[WeightsFormat, Callable] = {}
        for fmt, fn in (weight_adapters or {}).items():
            try:
                fmt = WeightsFormat(fmt)
            except ValueError:
                raise UsageError(
                    f"architecture {name!r}: {fmt!r} is not a WeightsFormat "
                    f"({', '.join(f.value for f in WeightsFormat)})") from None
            if not callable(fn):
                raise ArgumentTypeError(f"architecture {name!r}: the {fmt.value} adapter is a {type(fn).__name__}, "
                                       "not a function")
            self.weight_adapters[fmt] = fn
        self.example_repo_ids = list(example_repo_ids)
        self.default_weights_format = WeightsFormat(default_weights_format) if default_weights_format else None
        self.module = module
        self.extra = dict(extra)

    def __getattr__(self, key):
        extra = self.__dict__.get("extra", {})
        if key in extra:
            return extra[key]
        raise AttributeError(f"SupportedArchitecture has no attribute {key!r}")

    def adapter_for(self, fmt: WeightsFormat | str) -> Callable:
        """The adapter for `fmt`; NoAdapterError naming the formats that do have one."""
        fmt = WeightsFormat(fmt)
        fn = self.weight_adapters.get(fmt)
        if fn is None:
            have = ", ".join(f.value for f in self.weight_adapters) or "none"
            raise NoAdapterError(
                f"architecture {self.name!r} has no weight adapter for {fmt.value} checkpoints "
                f"(it has adapters for: {have}); add one to weight_adapters={{WeightsFormat.{fmt.value}: ...}}")
        return fn

    def __repr__(self) -> str:
        fmts = ", ".join(f.value for f in self.weight_adapters)
        return f"SupportedArchitecture({self.name!r}, weight_adapters=[{fmts}])"


_REGISTRY: dict[str, SupportedArchitecture] = {}
_LOCK = threading.Lock()


def register(arch: SupportedArchitecture, *, replace: bool = False) -> SupportedArchitecture:
    """Add `arch` to the registry. Registering another architecture under a taken name needs replace=True."""
    if not isinstance(arch, SupportedArchitecture):
        raise ArgumentTypeError(f"register() takes a SupportedArchitecture, got {type(arch).__name__}")
    _ensure_builtins()
    with _LOCK:
        old = _REGISTRY.get(arch.name)
        # A built-in architecture is a default: registering the same name replaces it.
        if old is not None and old is not arch and not replace and not old.extra.get("builtin"):
            raise UsageError(f"an architecture named {arch.name!r} is already registered; "
                                   "pass replace=True to replace it")
        _REGISTRY[arch.name] = arch
    return arch


def unregister(name: str) -> None:
    """Remove an architecture (no error if absent)."""
    with _LOCK:
        _REGISTRY.pop(name, None)


_BUILTINS_LOADED = False


def _ensure_builtins() -> None:
    """The built-in architectures (lazyweights.adapters.builtin), registered on first use."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    with _LOCK:
        if _BUILTINS_LOADED:
            return
        from .builtin import builtin_adapters

        for name, adapters in builtin_adapters().items():
            if name not in _REGISTRY:
                _REGISTRY[name] = SupportedArchitecture(name, weight_adapters=adapters, builtin=True)
        _BUILTINS_LOADED = True


def architectures() -> dict[str, SupportedArchitecture]:
    """A copy of the registry: name -> architecture (the built-in ones included)."""
    _ensure_builtins()
    with _LOCK:
        return dict(_REGISTRY)


def get(name: str) -> SupportedArchitecture:
    """The architecture registered as `name`; UnknownArchitectureError (a KeyError) with a did-you-mean."""
    _ensure_builtins()
    with _LOCK:
        arch = _REGISTRY.get(name)
        known = list(_REGISTRY)
    if arch is None:
        listing = ", ".join(sorted(known)) if known else "none registered"
        raise UnknownArchitectureError(
            f"no architecture named {name!r} is registered (known: {listing}).{did_you_mean(str(name), known)}")
    return arch


def architecture_from_config(paths) -> str | None:
    """The first of `config.json`'s "architectures" next to the checkpoint (Hugging Face layout), or None."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for p in paths:
        if is_url(os.fspath(p)):
            continue  # local folders only, as before: no request is made to guess an adapter
        try:
            doc = json_beside(p, "config.json")
        except JSONFileError as e:  # unreadable, not JSON, not an object: no architecture to name
            _log.debug("no architecture read beside %s (%s)", p, e)
            return None
        if doc is not None:
            archs = doc.get("architectures")
            if isinstance(archs, list) and archs and isinstance(archs[0], str):
                return archs[0]
    return None


def adapt(arch: str | SupportedArchitecture | None, paths, **kwargs) -> dict:
    """Detect the checkpoint format, open it lazily, run the architecture's adapter, return the state dict.

    `arch`: a registered name, a `SupportedArchitecture`, or None to use config.json's "architectures".
    `kwargs` go to the adapter (e.g. `huggingface_config=...`). Reads no tensor bytes."""
    from ..lazy.weight_data import as_weight_data
    from ..lazy.weights import load_weights

    if arch is None:
        name = architecture_from_config(paths)
        if name is None:
            raise UnknownArchitectureError("adapt(None, ...) needs a config.json with \"architectures\" next to the "
                                           "checkpoint; name the architecture instead")
        arch = name
    if isinstance(arch, str):
        arch = get(arch)
    elif not isinstance(arch, SupportedArchitecture):
        raise ArgumentTypeError(f"adapt() takes an architecture name or a SupportedArchitecture, got "
                               f"{type(arch).__name__}")
    fmt = weights_format(paths)
    if fmt is WeightsFormat.pytorch:
        load_weights(paths)  # raises the refusal: pickles are never loaded
    adapter = arch.adapter_for(fmt)
    weights = load_weights(paths)
    adapted = adapter(dict(weights.items()), **kwargs)
    if not isinstance(adapted, Mapping):
        raise AdapterError(f"architecture {arch.name!r}: the {fmt.value} adapter returned a "
                               f"{type(adapted).__name__}, not a dict of name -> WeightData")
    out = {}
    for key, value in adapted.items():
        if not isinstance(key, str):
            raise AdapterError(f"architecture {arch.name!r}: the {fmt.value} adapter returned a non-string key "
                                   f"{key!r}")
        out[key] = as_weight_data(value, key)
    return out
