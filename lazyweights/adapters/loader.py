"""Find and run a weight adapter named on the command line.

An ADAPTER is one of
    package.module:function      imported (the current directory is searched too)
    path/to/file.py:function     executed from the file (its directory is put on sys.path for its imports)
    package.module or file.py    MAX's function name for the checkpoint's format:
                                 `convert_safetensor_state_dict` or `convert_gguf_state_dict`
    ArchitectureName             an architecture registered with `lazyweights.adapters.registry`

Adapters are called as MAX's pipeline calls them, `fn(dict(weights.items()), **kwargs)`, with
`huggingface_config=` from the `config.json` beside the checkpoint (or, for GGUF, from the file's metadata)
and `weights_format=`. A function without `**kwargs` gets only the keywords it names.

Example:
    >>> fn = load_object("os.path:basename")
    >>> fn("/a/b.txt")
    'b.txt'
    >>> call_adapter(lambda sd, huggingface_config=None: sorted(sd), {"b": 1, "a": 2}, huggingface_config=None,
    ...              weights_format="safetensors")
    ['a', 'b']
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from typing import Any, Callable, Mapping

from ..core.errors import AdapterError, FormatError, LazyWeightsError, UsageError

DEFAULT_FUNCTIONS = {
    "safetensors": "convert_safetensor_state_dict",
    "gguf": "convert_gguf_state_dict",
}


def _looks_like_file(mod: str) -> bool:
    return mod.endswith(".py") or "/" in mod or os.sep in mod


def _import_file(path: str):
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise AdapterError(f"no such file: {path}")
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    name = f"_lazyweights_user_{stem}_{abs(hash(path)) % 10**8}"
    if name in sys.modules:
        return sys.modules[name]
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # so the file can import its neighbours, as when run as a script
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AdapterError(f"cannot load {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise AdapterError(f"{path}:{e.lineno}: syntax error: {e.msg}") from e
    except ImportError as e:
        sys.modules.pop(name, None)
        raise AdapterError(f"{path}: {type(e).__name__}: {e}") from e
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_module(mod: str):
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # a console script does not search the current directory by itself
    try:
        return importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name and (mod == e.name or mod.startswith(e.name + ".")):
            raise AdapterError(f"cannot import {mod!r}: no module named {e.name!r} "
                                   "(give 'package.module:function' or 'path/to/file.py:function')") from e
        raise AdapterError(f"importing {mod!r} failed: {type(e).__name__}: {e}") from e
    except ImportError as e:
        raise AdapterError(f"importing {mod!r} failed: {type(e).__name__}: {e}") from e
    except SyntaxError as e:
        raise AdapterError(f"importing {mod!r} failed: {e.filename}:{e.lineno}: syntax error: {e.msg}") from e


def load_module(mod: str):
    """A module from a dotted name or a .py path."""
    return _import_file(mod) if _looks_like_file(mod) else _import_module(mod)


def _split(spec: str) -> tuple[str, str | None]:
    # Split on the last ':' that is not a Windows drive letter ('C:\\x.py:fn').
    if ":" in spec:
        mod, _, attr = spec.rpartition(":")
        if mod and attr and not (len(mod) == 1 and mod.isalpha()):
            return mod, attr
    return spec, None


def _getattr_path(module, attr: str, spec: str):
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            # Adapters are functions: suggest and list only those (not classes, modules or constants).
            from ..core.errors import did_you_mean

            public = sorted(n for n in dir(module) if not n.startswith("_")
                            and inspect.isfunction(inspect.unwrap(getattr(module, n))))
            more = ", ..." if len(public) > 12 else ""
            listing = f" (its functions: {', '.join(public[:12])}{more})" if public else ""
            hint = did_you_mean(part, public).strip()  # the fix first
            raise AdapterError(f"{hint + ' ' if hint else ''}{spec!r}: {getattr(module, '__name__', module)!s} has "
                               f"no attribute {attr!r}{listing}") from None
    return obj


def load_object(spec: str, what: str = "object"):
    """'module:name' or 'file.py:name' (dotted names allowed after the colon) -> the object."""
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError(f"empty {what} name")
    mod, attr = _split(spec)
    if attr is None:
        raise UsageError(f"{what} {spec!r}: expected 'module:name' or 'path/to/file.py:name'")
    return _getattr_path(load_module(mod), attr, spec)


def _unknown_name(name: str, why: Exception) -> AdapterError:
    """A bare adapter name that is neither registered nor importable: the fix first (the did-you-mean), then
    why, in a few words; the list of names is `lazyweights archs`, not the message."""
    from ..core.errors import did_you_mean
    from . import registry

    known = sorted(registry.architectures())
    hint = did_you_mean(name, known).strip()
    return AdapterError(f"{hint + ' ' if hint else ''}{name!r} is neither a registered architecture ({len(known)} "
                        f"known: `lazyweights archs` lists them) nor an importable module ({why})")


def load_adapter(spec, fmt=None) -> Callable:
    """The adapter function named by `spec` (see the module docstring) for checkpoint format `fmt`."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError("no adapter given")
    fmt_value = getattr(fmt, "value", fmt)
    mod, attr = _split(spec)
    if attr is None:
        # A registered architecture name?
        if not _looks_like_file(mod) and re.fullmatch(r"[A-Za-z_]\w*", mod):
            try:
                from . import registry

                arch = registry.architectures().get(mod)
            except ImportError:
                arch = None
            if arch is not None:
                if fmt is None:
                    raise FormatError(f"architecture {mod!r}: the checkpoint format is unknown")
                return arch.adapter_for(fmt)
            if "." not in mod:
                try:
                    module = load_module(mod)
                except LazyWeightsError as e:
                    raise _unknown_name(mod, e) from None
        module = load_module(mod)
        wanted = DEFAULT_FUNCTIONS.get(fmt_value) if fmt_value else None
        names = [wanted] if wanted else list(DEFAULT_FUNCTIONS.values())
        for name in names:
            fn = getattr(module, name, None)
            if callable(fn):
                return fn
        raise AdapterError(
            f"adapter {spec!r}: no function named {' or '.join(repr(n) for n in names)} in it; "
            f"name one as '{spec}:function'")
    fn = _getattr_path(load_module(mod), attr, spec)
    if not callable(fn):
        raise AdapterError(f"adapter {spec!r} is a {type(fn).__name__}, not a function")
    return fn


def check_adapter_spec(spec) -> None:
    """Fail now, before any checkpoint is opened, if `spec` cannot name an adapter for any format: a module or
    file that does not import, a function it lacks, or a bare name that is neither a registered architecture
    nor a module (with a did-you-mean). What depends on the checkpoint's format is left to `load_adapter`.

    Example:
        >>> check_adapter_spec("lazyweights.tools.demo:convert_safetensor_state_dict")
        >>> try:
        ...     check_adapter_spec("LlamaForCasualLM")
        ... except AdapterError as e:
        ...     print(str(e).split(" or ")[0])  # the closest first (the rest depends on what is registered)
        Did you mean 'LlamaForCausalLM'
    """
    if callable(spec):
        return
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError("no adapter given")
    mod, attr = _split(spec)
    if attr is not None:
        _getattr_path(load_module(mod), attr, spec)
        return
    if not _looks_like_file(mod) and re.fullmatch(r"[A-Za-z_]\w*", mod):
        from . import registry

        if mod in registry.architectures():
            return
        if "." not in mod:
            try:
                load_module(mod)
            except LazyWeightsError as e:
                raise _unknown_name(mod, e) from None
            return
    load_module(mod)


# --- calling an adapter MAX's way ---------------------------------------------------------------------
def load_config(weights, paths=None, hf_config: str | None = None):
    """The `huggingface_config` for a checkpoint: `hf_config` (a config.json path) if given, else the
    config.json beside the checkpoint, else (GGUF) one built from the file's metadata; None if none."""
    from ..formats.config import config_from_metadata, load_hf_config

    if hf_config:
        return load_hf_config(hf_config)
    files = list(getattr(weights, "files", []) or [])
    fmt = getattr(weights, "format", None)
    names = [n for n, _ in weights.items()] if hasattr(weights, "items") else None
    return config_from_metadata(fmt, getattr(weights, "metadata", {}) or {}, files, names)


def call_adapter(fn: Callable, state_dict: Mapping[str, Any], **kwargs):
    """`fn(state_dict, **kwargs)`, passing only the keywords `fn` accepts unless it takes `**kwargs`."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn(state_dict, **kwargs)
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn(state_dict, **kwargs)
    accepted = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                       inspect.Parameter.KEYWORD_ONLY)}
    return fn(state_dict, **{k: v for k, v in kwargs.items() if k in accepted})


def run_adapter(spec, paths, hf_config: str | None = None, **extra_kwargs):
    """Open the checkpoint at `paths` lazily, run the adapter on it, return (adapted state dict, weights)."""
    from ..lazy.weights import load_weights

    allow_pickle = extra_kwargs.pop("allow_pickle", None)  # loader options, not adapter keywords
    remote = {k: extra_kwargs.pop(k) for k in ("storage_options", "cache") if k in extra_kwargs}
    lora = extra_kwargs.pop("lora", None)  # PEFT adapter folders merged into the checkpoint before the adapter
    check_adapter_spec(spec)  # a mistyped adapter fails before the checkpoint is opened (a URL: no request)
    weights = load_weights(paths, allow_pickle=allow_pickle, **remote)
    fn = load_adapter(spec, weights.format)
    kwargs = {"huggingface_config": load_config(weights, paths, hf_config), "weights_format": weights.format}
    kwargs.update(extra_kwargs)
    state = dict(weights.items())
    if lora:
        from .lora import merge_lora

        state = merge_lora(state, lora)
    adapted = call_adapter(fn, state, **kwargs)
    if not isinstance(adapted, Mapping):
        raise AdapterError(
            f"the adapter {spec if isinstance(spec, str) else getattr(spec, '__name__', spec)!r} returned a "
            f"{type(adapted).__name__}, expected a dict of name -> WeightData")
    # A dict subclass keeps what it carries besides tensors (result.ConvertedStateDict's metadata/files).
    return (adapted if isinstance(adapted, dict) else dict(adapted)), weights
