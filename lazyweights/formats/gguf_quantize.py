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
    >>> q.types["blk.0.attn_v.weight"].type, q.outputs["output_norm.weight"] is n, q.metadata["general.file_type"]
    ('Q6_K', True, 15)
"""
from __future__ import annotations

import os
from typing import Mapping, NamedTuple

from ..core.dtype import DType
from ..core.errors import ConfigError, ImatrixShapeError
from ..core.quantization import QuantizationEncoding
from ..graph import ops
from ..graph.node import Node
from ..quant.presets import PRESETS, TypeChoice, model_tensor_types
from .gguf_writer import GGUFValue
from .imatrix import read_imatrix

# llama.h's llama_ftype for each preset (what llama-quantize writes as general.file_type)
FILE_TYPE = {"Q4_0": 2, "Q8_0": 7, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
             "Q5_K_M": 17, "Q6_K": 18}
GGML_QNT_VERSION = 2  # general.quantization_version

_SOURCE_TYPE = {DType.float32: "F32", DType.float16: "F16", DType.bfloat16: "BF16"}
_FLOAT_TYPE = {"F32": DType.float32, "F16": DType.float16, "BF16": DType.bfloat16}


class QuantizedOutputs(NamedTuple):
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


def quantize_outputs(outputs: Mapping[str, Node], metadata: Mapping, preset: str, *,
                     imatrix=None) -> QuantizedOutputs:
    """The plan's outputs (GGUF tensor names -> nodes) quantized as llama-quantize's `preset` would.

    `metadata`: the GGUF metadata to be written (it must say `general.architecture` and
    `{arch}.block_count`; `{arch}.expert_count`, `{arch}.attention.head_count(_kv)` are used when present).
    `imatrix`: a path to a llama.cpp importance matrix (.dat or GGUF) or an `Imatrix`.
    Raises UnknownPresetError (listing the presets) for another preset, LazyWeightsError for missing
    metadata, ImatrixShapeError naming the tensor when the importance matrix does not fit the model.
    """
    # (a GGUFMetadata's copy() keeps each key's GGUF type for the writer)
    metadata = metadata.copy() if hasattr(metadata, "copy") else dict(metadata or {})
    arch = _meta_value(metadata, "general.architecture")
    if not arch:
        raise ConfigError("quantizing to a preset needs the GGUF metadata's general.architecture")
    arch = str(arch)
    n_layer = _meta_int(metadata, f"{arch}.block_count")
    if n_layer is None:
        raise ConfigError(f"quantizing to a preset needs {arch}.block_count in the GGUF metadata "
                               "(llama.cpp's type rules count layers)")
    n_expert = _meta_int(metadata, f"{arch}.expert_count", 0) or 0
    heads = _meta_int(metadata, f"{arch}.attention.head_count", 1) or 1
    heads_kv = _meta_int(metadata, f"{arch}.attention.head_count_kv", heads) or heads
    im = read_imatrix(imatrix) if isinstance(imatrix, (str, bytes)) or hasattr(imatrix, "__fspath__") else imatrix
    shapes = {name: node.shape for name, node in outputs.items()}
    sources = {name: _SOURCE_TYPE.get(node.dtype, "F32") for name, node in outputs.items()}
    types = model_tensor_types(str(preset).upper(), shapes, n_layer=n_layer, n_expert=n_expert,
                               has_imatrix=im is not None, n_gqa=max(1, heads // max(1, heads_kv)), arch=arch,
                               is_70b=(arch == "llama" and n_layer == 80), source_types=sources)
    new: dict[str, Node] = {}
    encodings: dict[str, QuantizationEncoding | None] = {}
    matched = 0
    for name, node in outputs.items():
        choice = types[name]
        if choice.type in _FLOAT_TYPE:
            new[name] = ops.cast(node, _FLOAT_TYPE[choice.type]) if node.dtype.is_float else node
            encodings[name] = None
            continue
        enc = QuantizationEncoding.parse(choice.type)
        weights = None
        if im is not None:
            experts = node.shape[0] if node.ndim == 3 else 1
            weights = im.for_tensor(name, node.shape[-1], experts)
            matched += weights is not None
        new[name] = ops.quantize(node, enc, weights, choice.reason)
        encodings[name] = enc
    if im is not None and not matched and any(e is not None for e in encodings.values()):
        raise ImatrixShapeError(f"the importance matrix {getattr(im, 'path', '')!s} has none of this model's "
                                f"tensors (it has e.g. {', '.join(list(im)[:3])}): it is for another model")
    metadata["general.file_type"] = FILE_TYPE[str(preset).upper()]
    metadata["general.quantization_version"] = GGML_QNT_VERSION
    if im is not None:
        metadata.update(imatrix_metadata(im, imatrix))
    return QuantizedOutputs(new, encodings, types, metadata)


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
    meta = {"quantize.imatrix.file": GGUFValue(_c_string(os.fsdecode(name) if name else ""), GGUFValueType.STRING)}
    datasets = list(getattr(im, "datasets", None) or [])
    if datasets:
        meta["quantize.imatrix.dataset"] = GGUFValue(_c_string(datasets[0]), GGUFValueType.STRING)
    meta["quantize.imatrix.entries_count"] = GGUFValue(len(im), GGUFValueType.UINT32)
    chunks = int(getattr(im, "chunk_count", 0) or 0)
    if chunks > 0:
        meta["quantize.imatrix.chunks_count"] = GGUFValue(chunks, GGUFValueType.UINT32)
    return meta


__all__ = ["FILE_TYPE", "PRESETS", "QuantizedOutputs", "imatrix_metadata", "quantize_outputs"]
