"""Quantize a plan to a llama.cpp preset (`Q4_K_M`, `Q8_0`, ...) in the graph, before it is written.

llama.cpp makes a quantized GGUF in two programs and two full writes (`convert_hf_to_gguf.py` to bf16, then
`llama-quantize`). Here the preset becomes `quantize` nodes on the plan's outputs, so HF bf16 -> Q4_K_M is
one streaming pass: each block of rows is read, cast to float32 and quantized by the same scheduler that
writes it, under the memory budget.

Per tensor, the type is llama.cpp's choice (`quant.presets.model_tensor_types`, a port of
`llama_tensor_get_type`): the output and token_embd rules, the attn_v/ffn_down layers that get more bits,
tied embeddings, MoE experts, and the fallback when a row is not a multiple of 256. Tensors llama.cpp keeps
(norms, 1-D tensors, routers) keep their dtype. The quantizers write the bytes ggml's `ggml_quantize_chunk`
writes (tests/kernels/test_kquant_encode.py), with an importance matrix when one is given.

The result's metadata gets `general.file_type` (the preset's `llama_ftype`) and
`general.quantization_version`, and with an importance matrix the four `quantize.imatrix.*` keys
(`file`, `dataset`, `entries_count`, `chunks_count`), as llama-quantize writes them.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> w = ops.const(np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32))
    >>> n = ops.const(np.ones(256, np.float32))
    >>> meta = {"general.architecture": "llama", "llama.block_count": 1}
    >>> q = quantize_outputs({"blk.0.attn_v.weight": w, "output_norm.weight": n}, meta, "Q4_K_M")
    >>> q.types["blk.0.attn_v.weight"].type, q.outputs["output_norm.weight"] is n, q.metadata["general.file_type"].value
    ('Q6_K', True, 15)
"""
from __future__ import annotations

import os
import warnings
from typing import Iterable, Mapping, NamedTuple

from gguf.constants import GGML_QUANT_VERSION, Keys, LlamaFileType  # gguf_writer imports gguf already

from ..core.dtype import DType
from ..core.errors import ArgumentTypeError, ConfigError, ImatrixShapeError, KVOverrideError, UsageError
from ..core.names import GGUF_BLOCK
from ..core.quantization import QuantizationEncoding
from ..graph import ops
from ..graph.node import Node
from ..quant.presets import (
    PRESETS,
    TypeChoice,
    model_tensor_types,
    not_quantized_reason,
    parse_type,
    tensor_type_overrides,
    weight_order_key,
)
from .gguf_writer import GGUFValue
from .imatrix import read_imatrix

# llama.h's llama_ftype for each preset (what llama-quantize writes as general.file_type): gguf-py's LlamaFileType
FILE_TYPE = {p: int(LlamaFileType[f"MOSTLY_{p}"])
             for p in ("Q4_0", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K")}

_SOURCE_TYPE = {DType.float32: "F32", DType.float16: "F16", DType.bfloat16: "BF16"}
_FLOAT_TYPE = {"F32": DType.float32, "F16": DType.float16, "BF16": DType.bfloat16}


class QuantizedOutputs(NamedTuple):
    """What `quantize_outputs` returns: the nodes to write, the block type of each, llama.cpp's choice and
    reason per tensor, and the metadata to write with them.
    """

    outputs: dict[str, Node]                               # name -> node (quantize nodes where a type applies)
    encodings: dict[str, QuantizationEncoding | None]      # name -> block type written (None: a plain dtype)
    types: dict[str, TypeChoice]                           # name -> llama.cpp's choice and its reason
    metadata: dict                                         # the input metadata + file_type, quantization_version


def _meta_value(metadata: Mapping, key: str, default=None):
    """A metadata value as a plain Python value (a `GGUFValue(value, type)` unwrapped)."""
    v = metadata.get(key, default)
    return v.value if isinstance(v, GGUFValue) else v


def _meta_int(metadata: Mapping, key: str, default: int | None = None) -> int | None:
    v = _meta_value(metadata, key, default)
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):  # a per-layer array (e.g. head_count_kv per layer): take the first
        return int(list(v)[0])


class KVOverride(NamedTuple):
    """One `--override-kv KEY=TYPE:VALUE` (llama.cpp's `llama_model_kv_override`): TYPE is int, float, bool or
    str."""

    key: str
    type: str
    value: int | float | str  # a bool is an int

    def gguf_value(self) -> GGUFValue:
        """What llama-quantize writes for it: int as uint32 of the absolute value (llama.cpp PR 14182), float
        as float32, bool, str."""
        from gguf.constants import GGUFValueType as T

        if self.type == "int":
            return GGUFValue(abs(int(self.value)) & 0xFFFFFFFF, T.UINT32)  # (uint32_t)std::abs(val_i64)
        if self.type == "float":
            return GGUFValue(float(self.value), T.FLOAT32)
        if self.type == "bool":
            return GGUFValue(bool(self.value), T.BOOL)
        return GGUFValue(str(self.value), T.STRING)


_KV_TYPES = ("int", "float", "bool", "str")


def parse_kv_override(text: str) -> KVOverride:
    """`KEY=TYPE:VALUE` as llama.cpp's `string_parse_kv_override` reads it (TYPE: int, float, bool, str; a
    bool is `true` or `false`; a key under 128 bytes, a str value at most 127), stricter where llama.cpp
    reads garbage as 0: a value that is not a number of its TYPE is refused. Raises `KVOverrideError`.

    Example:
        >>> from lazyweights.formats.gguf_quantize import parse_kv_override
        >>> parse_kv_override("tokenizer.ggml.add_bos_token=bool:false")
        KVOverride(key='tokenizer.ggml.add_bos_token', type='bool', value=False)
        >>> parse_kv_override("llama.context_length=int:8192").gguf_value().value
        8192
    """
    if not isinstance(text, str):
        raise ArgumentTypeError(f"a metadata override is a 'KEY=TYPE:VALUE' string, got {text!r}")
    key, sep, rest = text.partition("=")
    if not sep:
        raise KVOverrideError(f"malformed metadata override {text!r}: expected KEY=TYPE:VALUE (no '=')")
    if not key or len(key.encode()) >= 128:
        raise KVOverrideError(f"malformed metadata override {text!r}: the key must be 1 to 127 bytes, "
                              f"got {len(key.encode())}")
    kind, colon, value = rest.partition(":")
    if not colon or kind not in _KV_TYPES:
        raise KVOverrideError(f"metadata override {text!r}: TYPE must be one of {', '.join(_KV_TYPES)} "
                              f"(KEY=TYPE:VALUE), got {rest.split(':')[0]!r}")
    return _checked_override(key, kind, value, text)


def _checked_override(key: str, kind: str, value, text) -> KVOverride:
    def bad(why: str) -> KVOverrideError:
        return KVOverrideError(f"metadata override {text!r}: {value!r} is not a {kind} value ({why})")

    try:
        if kind == "int":
            v: int | float | str = int(value)
        elif kind == "float":
            v = float(value)
        elif kind == "bool":
            v = value if isinstance(value, bool) else value == "true"
        else:
            v = str(value)
    except (TypeError, ValueError) as e:  # int("x"), float(None): Python's own parse errors
        raise bad(str(e)) from e
    if kind == "int" and not -2**63 <= int(v) < 2**63:
        raise bad("outside int64")
    if kind == "bool" and not isinstance(value, bool) and value not in ("true", "false"):
        raise bad("a bool is 'true' or 'false'")
    if kind == "str" and len(str(v).encode("utf-8")) > 127:
        raise bad(f"a str value cannot exceed 127 bytes, got {len(str(v).encode('utf-8'))}")
    return KVOverride(key, kind, v)


def kv_overrides_of(kv_overrides) -> list[KVOverride]:
    """`kv_overrides=` as a list of `KVOverride`: strings `KEY=TYPE:VALUE`, `KVOverride`s, or a dict
    {key: value} whose Python types give TYPE (bool, int, float, str).

    Example:
        >>> [o.type for o in kv_overrides_of({"a.b": 1, "a.c": 0.5, "a.d": True, "a.e": "x"})]
        ['int', 'float', 'bool', 'str']
    """
    if not kv_overrides:
        return []
    if isinstance(kv_overrides, str):
        kv_overrides = [kv_overrides]
    out = []
    if isinstance(kv_overrides, Mapping):
        for key, value in kv_overrides.items():
            kind = ("bool" if isinstance(value, bool) else "int" if isinstance(value, int)
                    else "float" if isinstance(value, float) else "str" if isinstance(value, str) else None)
            if kind is None or not isinstance(key, str) or not key or len(key.encode()) >= 128:
                raise KVOverrideError(f"metadata override {key!r}: {value!r}: keys are 1 to 127 byte strings "
                                      "and values bool, int, float or str")
            out.append(_checked_override(key, kind, value, f"{key}={value!r}"))
        return out
    for item in kv_overrides:
        out.append(item if isinstance(item, KVOverride) else parse_kv_override(item))
    return out


def prune_layer_list(prune_layers) -> list[int]:
    """`--prune-layers 3,5` or a list of ints, sorted and without duplicates (llama-quantize's
    `parse_layer_prune`); a negative or non-integer id is a `UsageError`.

    Example:
        >>> prune_layer_list("5,3,5")
        [3, 5]
    """
    if prune_layers is None:
        return []
    items: Iterable = prune_layers.split(",") if isinstance(prune_layers, str) else prune_layers
    out = set()
    for item in items:
        try:
            n = int(str(item).strip()) if isinstance(item, str) else int(item)
        except (TypeError, ValueError):
            n = -1
        if n < 0 or isinstance(item, float):
            raise UsageError(f"--prune-layers: invalid layer id {item!r} (layer ids are integers >= 0)")
        out.add(n)
    return sorted(out)


def prune_names(names: Iterable[str], prune: list[int]) -> tuple[dict[str, str | None], int | None]:
    """llama.cpp's `remap_layer` over the tensors in its loader's order: tensors of a pruned block map to
    None, later blocks are renumbered down. Returns (old name -> new name or None, the new block count), the
    block count being llama.cpp's `blk_id` (None when nothing is pruned).

    Example:
        >>> m, n = prune_names(["blk.0.a", "blk.1.a", "blk.2.a", "out"], [1])
        >>> m, n
        ({'out': 'out', 'blk.0.a': 'blk.0.a', 'blk.1.a': None, 'blk.2.a': 'blk.1.a'}, 2)
    """
    names = sorted(names, key=weight_order_key)
    if not prune:
        return {n: n for n in names}, None
    mapped: dict[int, str] = {}
    next_id = 0
    out: dict[str, str | None] = {}
    for name in names:
        m = GGUF_BLOCK.search(name)  # llama.cpp's regex_search: enc.blk.N. and dec.blk.N. too
        if m is None:
            out[name] = name
            continue
        blk = int(m.group(1))
        if blk not in mapped:
            if blk in prune:
                mapped[blk] = ""
            elif blk < prune[0]:
                mapped[blk] = str(blk)
                next_id = blk + 1
            else:
                mapped[blk] = str(next_id)
                next_id += 1
        out[name] = name[:m.start(1)] + mapped[blk] + name[m.end(1):] if mapped[blk] else None
    return out, next_id


def _set_last(metadata, key: str, value) -> None:
    """gguf_set_val_*: remove the key, then append it (so overridden keys move to the end, as in llama.cpp)."""
    metadata.pop(key, None)
    metadata[key] = value


def quantize_outputs(outputs: Mapping[str, Node], metadata: Mapping, preset: str, *,
                     imatrix=None, tensor_types=None, output_tensor_type=None, token_embedding_type=None,
                     pure: bool = False, prune_layers=None, kv_overrides=None) -> QuantizedOutputs:
    """The plan's outputs (GGUF tensor names -> nodes) quantized as llama-quantize's `preset` would.

    `metadata`: the GGUF metadata to be written (it must say `general.architecture` and
    `{arch}.block_count`; `{arch}.expert_count`, `{arch}.attention.head_count(_kv)` are used when present).
    `imatrix`: a path to a llama.cpp importance matrix (.dat or GGUF) or an `Imatrix`.
    llama-quantize's per-tensor controls, with its semantics: `tensor_types` ({pattern: type} or
    [(pattern, type)], `--tensor-type`; a pattern that matches no quantized tensor warns), `output_tensor_type`,
    `token_embedding_type`, `pure`, `prune_layers` (drops those blocks, renumbers the rest and sets
    `{arch}.block_count`; the type rules still count the original layers, as llama.cpp's do) and
    `kv_overrides` (`--override-kv`: see `kv_overrides_of`; written after `general.file_type`, so they win).
    Raises UnknownPresetError (listing the presets) for another preset, UnknownTypeError (listing the types)
    for a type name, KVOverrideError for a bad override, ConfigError for missing metadata, ImatrixShapeError
    naming the tensor when the importance matrix does not fit the model.
    """
    overrides = tensor_type_overrides(tensor_types)
    output_tensor_type = (parse_type(output_tensor_type, "--output-tensor-type")
                          if output_tensor_type is not None else None)
    token_embedding_type = (parse_type(token_embedding_type, "--token-embedding-type")
                            if token_embedding_type is not None else None)
    kvs = kv_overrides_of(kv_overrides)
    prune = prune_layer_list(prune_layers)
    # (a GGUFMetadata's copy() keeps each key's GGUF type for the writer)
    metadata = metadata.copy() if hasattr(metadata, "copy") else dict(metadata or {})
    # llama.cpp's loader reads the hyperparameters with the overrides applied
    hparams = dict(metadata)
    hparams.update({o.key: o.value for o in kvs})
    arch = _meta_value(hparams, Keys.General.ARCHITECTURE)
    if not arch:
        raise ConfigError(f"quantizing to a preset needs the GGUF metadata's {Keys.General.ARCHITECTURE}")
    arch = str(arch)
    block_count_key = Keys.LLM.BLOCK_COUNT.format(arch=arch)
    n_layer = _meta_int(hparams, block_count_key)
    if n_layer is None:
        raise ConfigError(f"quantizing to a preset needs {block_count_key} in the GGUF metadata "
                               "(llama.cpp's type rules count layers)")
    n_expert = _meta_int(hparams, Keys.LLM.EXPERT_COUNT.format(arch=arch), 0) or 0
    heads = _meta_int(hparams, Keys.Attention.HEAD_COUNT.format(arch=arch), 1) or 1
    heads_kv = _meta_int(hparams, Keys.Attention.HEAD_COUNT_KV.format(arch=arch), heads) or heads
    im = read_imatrix(imatrix) if isinstance(imatrix, (str, bytes)) or hasattr(imatrix, "__fspath__") else imatrix
    renamed, block_count = prune_names(outputs, prune)
    original = {new_name: old for old, new_name in renamed.items() if new_name is not None}
    kept = {new_name: outputs[old] for old, new_name in ((o, renamed[o]) for o in outputs) if new_name is not None}
    shapes = {name: node.shape for name, node in kept.items()}
    sources = {name: _SOURCE_TYPE.get(node.dtype, "F32") for name, node in kept.items()}
    types = model_tensor_types(str(preset).upper(), shapes, n_layer=n_layer, n_expert=n_expert,
                               has_imatrix=im is not None, n_gqa=max(1, heads // max(1, heads_kv)), arch=arch,
                               is_70b=(arch == "llama" and n_layer == 80), source_types=sources,
                               tensor_types=overrides, output_tensor_type=output_tensor_type,
                               token_embedding_type=token_embedding_type, pure=pure)
    _warn_unmatched(overrides, [n for n in kept if not_quantized_reason(n, shapes[n]) is None])
    new: dict[str, Node] = {}
    encodings: dict[str, QuantizationEncoding | None] = {}
    matched = 0
    for name, node in kept.items():
        choice = types[name]
        if choice.type in _FLOAT_TYPE:
            new[name] = ops.cast(node, _FLOAT_TYPE[choice.type]) if node.dtype.is_float else node
            encodings[name] = None
            continue
        enc = QuantizationEncoding.parse_required(choice.type, f"quantize {name!r}")
        weights = None
        if im is not None:
            experts = node.shape[0] if node.ndim == 3 else 1
            weights = im.for_tensor(original[name], node.shape[-1], experts)  # (remap_imatrix)
            matched += weights is not None
        new[name] = ops.quantize(node, enc, weights, choice.reason)
        encodings[name] = enc
    if im is not None and not matched and any(e is not None for e in encodings.values()):
        raise ImatrixShapeError(f"the importance matrix {getattr(im, 'path', '')!s} has none of this model's "
                                f"tensors (it has e.g. {', '.join(list(im)[:3])}): it is for another model")
    # llama_model_quantize_impl's order: quantization_version, file_type, the overrides (tools/quantize puts the
    # --override-kv ones first, then its imatrix keys), then the pruned block count; each set removes and appends
    from gguf.constants import GGUFValueType as T

    for o in kvs:
        if o.key in (Keys.General.QUANTIZATION_VERSION, Keys.General.FILE_TYPE, Keys.General.ALIGNMENT):
            raise KVOverrideError(f"--override-kv {o.key}: lazyweights writes {o.key} itself; it cannot be "
                                  "overridden")
    _set_last(metadata, Keys.General.QUANTIZATION_VERSION, GGUFValue(GGML_QUANT_VERSION, T.UINT32))
    _set_last(metadata, Keys.General.FILE_TYPE, GGUFValue(FILE_TYPE[str(preset).upper()], T.UINT32))
    for o in kvs:
        _set_last(metadata, o.key, o.gguf_value())
    if im is not None:
        for key, value in imatrix_metadata(im, imatrix).items():
            _set_last(metadata, key, value)
    if block_count is not None:
        _set_last(metadata, block_count_key, GGUFValue(block_count, T.UINT32))
    return QuantizedOutputs(new, encodings, types, metadata)


def _warn_unmatched(overrides, names: list[str]) -> None:
    """A `--tensor-type` pattern that matches none of the tensors that are quantized changes nothing: say so."""
    for o in overrides:
        if not any(o.regex.search(n) for n in names):
            example = ", ".join(names[:3])
            warnings.warn(f"--tensor-type {o.pattern}={o.type}: the pattern matches none of the {len(names)} "
                          f"quantized tensors (e.g. {example}); it changes nothing", UserWarning, stacklevel=3)


def dry_run_report(tensors: Mapping, metadata: Mapping | None = None,
                   types: Mapping[str, TypeChoice] | None = None) -> str:
    """llama-quantize `--dry-run`: each tensor's GGUF type, shape, bytes and bits per weight, then the totals
    and the exact size of the file these `tensors` (name -> WeightData / Node, e.g. `Plan.quantize(...).tensors`)
    and `metadata` make, from the GGUF layout alone: no tensor byte is read. `types` (a `QuantizedOutputs.types`)
    adds why a rule picked a type.

    Example:
        >>> import numpy as np
        >>> from lazyweights.graph import ops
        >>> q = quantize_outputs({"blk.0.attn_q.weight": ops.const(np.ones((4, 256), np.float32))},
        ...                      {"general.architecture": "llama", "llama.block_count": 1}, "Q8_0")
        >>> print(dry_run_report(q.outputs, q.metadata))  # doctest: +NORMALIZE_WHITESPACE
        tensor               type  shape (ggml ne)    bytes  bits/weight
        blk.0.attn_q.weight  Q8_0  [256, 4]         1,088 B     8.50 bpw
        total: 1 tensors, 1,024 weights, 1,088 B of tensor data (1.06 KiB, 8.50 bpw); file ...
    """
    from ..core.units import format_bytes
    from .gguf_writer import GGUFLayout, TensorMeta

    # the layout needs header facts only: dtype, shape, encoding
    layout = GGUFLayout.plan({name: (TensorMeta(w.dtype, tuple(w.shape), w.quantization_encoding)
                                     if hasattr(w, "quantization_encoding") else w)
                              for name, w in tensors.items()}, metadata)
    rows = [("tensor", "type", "shape (ggml ne)", "bytes", "bits/weight", "")]
    total_bytes = total_elements = 0
    for name, slot in layout.slots.items():
        elements = 1
        for d in slot.ne:
            elements *= int(d)
        total_bytes += slot.nbytes
        total_elements += elements
        why = (types or {}).get(name)
        rows.append((name, slot.ggml_type.name, "[" + ", ".join(str(int(d)) for d in slot.ne) + "]",
                     f"{slot.nbytes:,} B", f"{8 * slot.nbytes / max(1, elements):.2f} bpw",
                     f"({why.reason})" if why is not None and why.reason else ""))
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:>{w[3]}}  {r[4]:>{w[4]}}  {r[5]}".rstrip()
             for r in rows]
    lines.append(f"total: {len(layout.slots)} tensors, {total_elements:,} weights, {total_bytes:,} B of tensor data "
                 f"({format_bytes(total_bytes)}, {8 * total_bytes / max(1, total_elements):.2f} bpw); "
                 f"file {layout.total_size:,} B ({format_bytes(layout.total_size)}) with its header")
    return "\n".join(lines)


def _c_string(text: str) -> str:
    """What llama-quantize stores for a string: `strncpy` into a 128-byte key-value override, so at most 127
    bytes (a UTF-8 character cut in two is dropped)."""
    return str(text).encode("utf-8", "surrogateescape")[:127].decode("utf-8", "ignore")


def imatrix_metadata(im, given=None) -> dict:
    """The `quantize.imatrix.*` keys llama-quantize (tools/quantize/quantize.cpp) adds when it quantizes with an
    importance matrix: the file as named on the command line (`given`, else the path it was read from), the
    first dataset, the number of entries and the number of chunks (when known), each as its key-value
    override writes it (strings cut at 127 bytes, counts as uint32).

    Example:
        >>> meta = imatrix_metadata(type("I", (), {"path": "m.dat", "datasets": ["wiki"], "chunk_count": 8,
        ...                                         "__len__": lambda self: 3})())
        >>> for k, v in meta.items():
        ...     print(k, v.value)
        quantize.imatrix.file m.dat
        quantize.imatrix.dataset wiki
        quantize.imatrix.entries_count 3
        quantize.imatrix.chunks_count 8
    """
    from gguf.constants import GGUFValueType

    name = given if isinstance(given, str) or hasattr(given, "__fspath__") else getattr(im, "path", "")
    # llama-quantize's own keys (LLM_KV_QUANTIZE_IMATRIX_* in tools/quantize): gguf-py has no constants for them
    meta = {"quantize.imatrix.file": GGUFValue(_c_string(os.fsdecode(name) if name else ""), GGUFValueType.STRING)}
    datasets = list(getattr(im, "datasets", None) or [])
    if datasets:
        meta["quantize.imatrix.dataset"] = GGUFValue(_c_string(datasets[0]), GGUFValueType.STRING)
    meta["quantize.imatrix.entries_count"] = GGUFValue(len(im), GGUFValueType.UINT32)
    chunks = int(getattr(im, "chunk_count", 0) or 0)
    if chunks > 0:
        meta["quantize.imatrix.chunks_count"] = GGUFValue(chunks, GGUFValueType.UINT32)
    return meta


__all__ = ["FILE_TYPE", "KVOverride", "PRESETS", "QuantizedOutputs", "dry_run_report", "imatrix_metadata",
           "kv_overrides_of", "parse_kv_override", "prune_layer_list", "prune_names", "quantize_outputs"]
