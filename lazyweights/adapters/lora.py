"""Merge PEFT LoRA adapters into a base state dict, lazily: ``W + scale * (B @ A)`` as one `lora` node per weight.

`merge_lora(state_dict, lora_dir)` reads a PEFT adapter folder (``adapter_config.json`` and
``adapter_model.safetensors``, as ``PeftModel.save_pretrained`` writes them) and returns the state dict with
every targeted weight replaced by a lazy node computing what PEFT's ``merge_and_unload`` computes:

- ``scale = lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora``; ``rank_pattern`` and
  ``alpha_pattern`` override r and alpha per module, matched as PEFT matches them;
- ``fan_in_fan_out`` (GPT-2's Conv1D stores W as [in, out]) transposes the update; PEFT corrects a wrong flag
  from the module's type, here from the shapes (the flag decides only when both orientations fit);
- embedding LoRA (``lora_embedding_A/B``) adds ``(B @ A).T``;
- every other tensor the adapter saved (``modules_to_save`` copies, trained biases, the embedding's
  ``base_layer`` PEFT saves with an embedding target) replaces the base tensor of that name, cast to the base
  tensor's dtype.

Nothing is read: the node is computed by blocks of output rows when the plan runs (`graph/lora.py`), in
float32, rounded once to the base weight's dtype. Several adapters stack (a list, or two calls); each weight
stays one node and is rounded once. Adapters that do not fit the base raise `LoraError` naming the tensor and
both shapes.

Example:
    >>> import json, os, tempfile
    >>> import numpy as np
    >>> from safetensors.numpy import save_file
    >>> from lazyweights import WeightData
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "adapter_config.json"), "w").write(json.dumps(
    ...     {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}))
    >>> save_file({"base_model.model.q_proj.lora_A.weight": np.ones((2, 3), np.float32),
    ...            "base_model.model.q_proj.lora_B.weight": np.ones((4, 2), np.float32)},
    ...           os.path.join(d, "adapter_model.safetensors"))
    >>> base = {"q_proj.weight": WeightData.from_numpy(np.zeros((4, 3), np.float32), "q_proj.weight")}
    >>> merged = merge_lora(base, d)
    >>> merged["q_proj.weight"].to_numpy()[0]   # 0 + (4 / 2) * (1 + 1)
    array([4., 4., 4.], dtype=float32)
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Mapping, NamedTuple, Sequence

from ..core.errors import LoraError, did_you_mean
from ..formats.json_files import read_json
from ..graph.lora import lora_update
from ..lazy.weight_data import WeightData, as_weight_data

_PREFIX = "base_model.model."
_CONFIG = "adapter_config.json"
_WEIGHTS = "adapter_model.safetensors"
# Config keys that change what a merge computes and that this merge does not implement.
_UNSUPPORTED = ("use_dora", "lora_bias", "target_parameters", "use_qalora", "layer_replication",
                "trainable_token_indices")


class LoraConfig(NamedTuple):
    """What `merge_lora` uses of ``adapter_config.json``."""

    r: int
    alpha: float
    rslora: bool
    fan_in_fan_out: bool
    target_modules: Any          # a list of names, a regex string, or None
    rank_pattern: Mapping[str, int]
    alpha_pattern: Mapping[str, float]
    base_model: str | None

    def scale(self, module: str, r_found: int, where: str) -> float:
        """PEFT's scaling for `module`: alpha / r (alpha / sqrt(r) with rslora), patterns applied."""
        r = int(_pattern_value(self.rank_pattern, module, self.r))
        alpha = float(_pattern_value(self.alpha_pattern, module, self.alpha))
        if r != r_found:
            raise LoraError(f"LoRA {module!r} in {where}: lora_A has rank {r_found}, adapter_config.json says "
                            f"r={r}")
        return alpha / math.sqrt(r) if self.rslora else alpha / r


def _pattern_value(patterns: Mapping[str, Any], module: str, default):
    # peft.utils.other.get_pattern_key: the first key that matches a dotted suffix of the module's name
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def read_lora_config(lora_dir: str) -> LoraConfig:
    """Parse a PEFT adapter folder's ``adapter_config.json`` (LoraError for a missing file, another PEFT
    method, or an option whose merge is not implemented: DoRA, LoRA biases, parameter targets).

    Example:
        >>> import json, os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = open(os.path.join(d, "adapter_config.json"), "w").write(json.dumps(
        ...     {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "use_rslora": True, "target_modules": ["q_proj"]}))
        >>> cfg = read_lora_config(d)
        >>> cfg.r, cfg.alpha, cfg.rslora, cfg.target_modules
        (8, 16.0, True, ['q_proj'])
    """
    path = os.path.join(lora_dir, _CONFIG)
    doc = read_json(path)  # JSONFileError names the file when it is not a JSON object
    if doc is None:
        raise LoraError(f"{lora_dir!r} is not a PEFT adapter folder: it has no {_CONFIG}")
    kind = doc.get("peft_type", "LORA")
    if kind != "LORA":
        raise LoraError(f"{path}: peft_type is {kind!r}; only LORA adapters can be merged")
    for key in _UNSUPPORTED:
        if doc.get(key):
            raise LoraError(f"{path}: {key}={doc[key]!r} is not supported by merge_lora (plain LoRA, rsLoRA, "
                            f"fan_in_fan_out, embeddings, rank/alpha patterns and modules_to_save are)")
    try:
        r = int(doc["r"])
        alpha = float(doc.get("lora_alpha", 8))
    except (KeyError, TypeError, ValueError):
        raise LoraError(f"{path}: needs an integer 'r' and a number 'lora_alpha', got r={doc.get('r')!r}, "
                        f"lora_alpha={doc.get('lora_alpha')!r}") from None
    return LoraConfig(r, alpha, bool(doc.get("use_rslora", False)), bool(doc.get("fan_in_fan_out", False)),
                      doc.get("target_modules"), doc.get("rank_pattern") or {}, doc.get("alpha_pattern") or {},
                      doc.get("base_model_name_or_path"))


def _targets_match(targets, module: str) -> bool:
    # peft.tuners.tuners_utils.check_target_module_exists, without layers_to_transform
    if isinstance(targets, str):
        return targets == "all-linear" or re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith("." + t) for t in targets)


def merge_lora(state_dict: Mapping[str, Any], lora_dir: str | os.PathLike | Sequence[str | os.PathLike]
               ) -> dict[str, Any]:
    """`state_dict` with the PEFT LoRA adapter(s) in `lora_dir` merged lazily (see the module doc).

    `state_dict` maps the base's Hugging Face names (``model.layers.0.self_attn.q_proj.weight``) to WeightData
    or `Weights` accessors; `lora_dir` is one adapter folder or a list of them, applied in order. Tensors the
    adapters do not touch are returned as they were given.

    Example (two adapters on one weight, from a checkpoint on disk):
        >>> import json, os, tempfile
        >>> import numpy as np
        >>> from safetensors.numpy import save_file
        >>> import lazyweights as lw
        >>> d = tempfile.mkdtemp()
        >>> save_file({"fc.weight": np.ones((4, 3), np.float32)}, os.path.join(d, "model.safetensors"))
        >>> for name, alpha in (("a", 2), ("b", 8)):
        ...     os.makedirs(os.path.join(d, name))
        ...     _ = open(os.path.join(d, name, "adapter_config.json"), "w").write(json.dumps(
        ...         {"r": 1, "lora_alpha": alpha, "use_rslora": False, "target_modules": ["fc"]}))
        ...     save_file({"base_model.model.fc.lora_A.weight": np.ones((1, 3), np.float32),
        ...                "base_model.model.fc.lora_B.weight": np.ones((4, 1), np.float32)},
        ...               os.path.join(d, name, "adapter_model.safetensors"))
        >>> base = dict(lw.load_weights([os.path.join(d, "model.safetensors")]).items())
        >>> merged = merge_lora(base, [os.path.join(d, "a"), os.path.join(d, "b")])
        >>> merged["fc.weight"].node.arg          # one node, both updates: 1 + 2 + 8
        ((2.0, False), (8.0, False))
        >>> lw.plan(merged).materialize()["fc.weight"][0]
        array([11., 11., 11.], dtype=float32)
    """
    dirs = [lora_dir] if isinstance(lora_dir, (str, os.PathLike)) else list(lora_dir)
    out = dict(state_dict)
    for d in dirs:
        out = _merge_one(out, os.fspath(d))
    return out


def _merge_one(state: dict[str, Any], lora_dir: str) -> dict[str, Any]:
    from ..lazy.weights import load_weights

    cfg = read_lora_config(lora_dir)
    path = os.path.join(lora_dir, _WEIGHTS)
    if not os.path.exists(path):
        other = [f for f in ("adapter_model.bin", "adapter_model.pt") if os.path.exists(os.path.join(lora_dir, f))]
        raise LoraError(f"{lora_dir!r} has no {_WEIGHTS}" + (f" (only {other[0]}, a pickle: save the adapter with "
                                                             "safe_serialization=True)" if other else ""))
    adapter = {name: w.data() for name, w in load_weights([path]).items()}
    pairs: dict[str, dict[str, WeightData]] = {}   # module -> {"A": ..., "B": ..., "kind": ...}
    replace: dict[str, WeightData] = {}
    for key, wd in adapter.items():
        name = key.removeprefix(_PREFIX)
        m = re.fullmatch(r"(.+)\.(lora_A|lora_B)\.weight|(.+)\.(lora_embedding_A|lora_embedding_B)", name)
        if m:
            module, part = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            pairs.setdefault(module, {})[part] = wd
        elif ".lora_" in name or name.startswith("lora_"):
            raise LoraError(f"{path}: tensor {key!r} is a LoRA variant merge_lora does not implement "
                            f"(plain lora_A/lora_B and lora_embedding_A/B are)")
        else:
            replace[name.replace(".base_layer.", ".")] = wd
    if not pairs and not replace:
        raise LoraError(f"{path} holds no LoRA tensors")
    _check_fits_base(state, cfg, list(pairs) + [n.rsplit(".", 1)[0] for n in replace], path)
    for name, wd in replace.items():
        base = _base(state, name, path)
        if base.shape != wd.shape:
            raise LoraError(f"{path}: saved tensor {name!r} has shape {list(wd.shape)}, the base tensor "
                            f"{list(base.shape)}; is the adapter for another base model?")
        state[name] = wd if wd.dtype is base.dtype else wd.astype(base.dtype)
    for module, parts in pairs.items():
        linear = "lora_A" in parts or "lora_B" in parts
        a, b = (parts.get("lora_A"), parts.get("lora_B")) if linear else (parts.get("lora_embedding_A"),
                                                                           parts.get("lora_embedding_B"))
        if a is None or b is None:
            raise LoraError(f"{path}: LoRA {module!r} has {sorted(parts)} but needs both A and B")
        wname = module + ".weight"
        base = _base(state, wname, path)
        if base.quantization_encoding is not None:
            base = base.dequantize()
        if a.ndim != 2 or b.ndim != 2 or base.ndim != 2:
            raise LoraError(f"LoRA {module!r} in {path}: A {list(a.shape)}, B {list(b.shape)} and the base tensor "
                            f"{wname!r} {list(base.shape)} must all be 2-D")
        scale = cfg.scale(module, a.shape[0], path)
        transposed = _orientation(module, wname, base.shape, b.shape, a.shape, linear, cfg.fan_in_fan_out, path)
        node = lora_update(base.node, b.node, a.node, scale, transposed)
        state[wname] = WeightData.wrap(node, base.name, None)
    return state


def _base(state: Mapping[str, Any], name: str, where: str) -> WeightData:
    if name not in state:
        raise LoraError(f"{where}: the adapter changes {name!r}, which the base does not have "
                        f"({len(state)} tensors).{did_you_mean(name, state)}")
    return as_weight_data(state[name], name)


def _orientation(module: str, wname: str, w: tuple, b: tuple, a: tuple, linear: bool, fan_in_fan_out: bool,
                 where: str) -> bool:
    """Whether the update is transposed: embeddings always; linear layers by the flag, unless only the other
    orientation fits (PEFT itself overrides the flag from the module's type: Conv1D or Linear)."""
    fits = {False: b[0] == w[0] and a[1] == w[1], True: b[0] == w[1] and a[1] == w[0]}
    if not linear:
        if fits[True]:
            return True
    elif fits[fan_in_fan_out]:
        return fan_in_fan_out
    elif fits[not fan_in_fan_out]:
        return not fan_in_fan_out
    need = f"[{b[0]}, {a[1]}]" if linear and not fan_in_fan_out else f"[{a[1]}, {b[0]}]"
    raise LoraError(f"LoRA {module!r} in {where}: B {list(b)} @ A {list(a)} gives an update of shape {need}, "
                    f"the base tensor {wname!r} is {list(w)}; is the adapter for another base model?")


def _check_fits_base(state: Mapping[str, Any], cfg: LoraConfig, modules: list[str], where: str) -> None:
    """A LoRA for another base: none of its modules in the base, or a target module the base has none of."""
    have = {k.rsplit(".", 1)[0] for k in state}
    found = [m for m in modules if m in have]
    if modules and not found:
        hint = did_you_mean(modules[0], have)
        raise LoraError(f"{where}: none of the adapter's {len(modules)} modules is in the base (e.g. "
                        f"{modules[0]!r}); it was made for base model {cfg.base_model!r}.{hint}")
    targets = cfg.target_modules
    if isinstance(targets, (list, tuple)):
        missing = [t for t in targets if not any(_targets_match([t], m) for m in have)]
        if missing:
            raise LoraError(f"{where}: target_modules {missing} match no module of the base (e.g. "
                            f"{sorted(have)[:3]}); is the adapter for another base model ({cfg.base_model!r})?")
