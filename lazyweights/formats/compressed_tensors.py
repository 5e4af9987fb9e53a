"""compressed-tensors checkpoints (vLLM / llm-compressor), read as dense weights, lazily.

A folder whose `config.json` has `quantization_config.quant_method == "compressed-tensors"` stores each
quantized module `M` as `M.weight_packed` (or a narrow `M.weight`) plus `M.weight_scale`, maybe
`M.weight_zero_point`, `M.weight_global_scale`, `M.weight_shape`, `M.weight_g_idx`. `decompress_checkpoint`
replaces those tensors by one record `M.weight` whose `node` is a lazy graph giving the dense weight, the
value compressed-tensors' own decompressor computes (its `_dequantize`: `x_q.to(s.dtype)`, minus the zero
point, times the scale, with `scale / global_scale` first; the result in the scale's dtype, bf16 for FP4),
bit for bit: every intermediate is computed in float32 and rounded to the dtype torch would round it to
(a 16-bit product is exact in float32, so one rounding gives torch's result). Nothing is read to build
it but `weight_shape` (two integers) at open and `weight_g_idx` when the weight is first asked for.

Formats (`SUPPORTED_FORMATS`):
    pack-quantized        int1..int8 packed densely, little-endian, in int32 (compressed-tensors'
                          `pack_to_int32`: field j at bit j * B, straddling words), group / channel /
                          tensor scales, zero points packed along rows, actorder `weight_g_idx`
    naive-quantized       (and its aliases int-quantized, float-quantized): int8 or FP8 e4m3 weights with
                          tensor / channel / group / block (e.g. 128x128) scales
    mxfp8-quantized       FP8 e4m3 weights, e8m0 scales (uint8 exponents, 2**(e-127) in bf16) per 32
    nvfp4-pack-quantized  FP4 e2m1 two per byte, fp8 e4m3 scales per 16, divided by the global scale
    mxfp4-pack-quantized  FP4 e2m1 two per byte, e8m0 scales per 32
    mxfp6-pack-quantized  FP6 e2m3 four per three bytes, e8m0 scales per 32
    dense                 weights stored dense: quantization parameters dropped, weights as stored

Sparsity (`quantization_config.sparsity_config.format`, `SPARSITY_FORMATS`), alone or under a naive /
int / float / mxfp8 quantization of the same module (its `weight` is then the sparse one):
    sparse-bitmask        `M.compressed` (the non-zeros, flat, C order), `M.bitmask` (packbits, little),
                          `M.row_offsets`, `M.shape`
    sparse-24-bitmask     `M.compressed` [rows, cols / 2] (2 of every 4 kept), `M.bitmask`, `M.shape`
Both become a `scatter` node (`graph/scatter.py`) under whatever dequantization the module has. Refused by
name (`REFUSED_FORMATS`): marlin-24. Anything this reader does not fully understand (another format, a
weight type, width or strategy it does not know, a `transform_config`, compressed parts no module claims)
is an `UnsupportedCompressionError` at open that names a stored tensor and the value: nothing compressed
is ever passed through as if it were a dense weight (`check_config`).

The nibbles are split without a bit op: the packed bytes become llama.cpp Q4_0 blocks with scale 1.0
(`(nibble - 8) * 1.0`, exact), whose element order (low nibbles, then high nibbles) a `take` puts back.
FP4 codes then go through `uint8 -> float4_e2m1fn` (a bitcast), so -0.0 stays -0.0 as in torch. Other
widths read single bits the same way (`bits`: Q5_0 blocks whose high-bit word is the data) and sum them.

Example:
    >>> sorted(SUPPORTED_FORMATS)[:3]
    ['dense', 'float-quantized', 'int-quantized']
    >>> scheme_for("model.layers.0.mlp.down_proj", {"config_groups": {"g": {"targets": ["Linear"],
    ...     "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}},
    ...     "format": "pack-quantized"}).fmt
    'pack-quantized'
"""
from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..core.dtype import DType
from ..core.errors import FormatError, ScaleShapeError, UnsupportedCompressionError
from ..core.quantization import QuantizationEncoding
from ..graph import ops
from ..graph.elementwise import binary
from ..graph.node import Node
from .checkpoint import Checkpoint
from .json_files import json_beside

SUPPORTED_FORMATS = ("pack-quantized", "naive-quantized", "int-quantized", "float-quantized",
                     "nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp6-pack-quantized", "mxfp8-quantized",
                     "dense")
# `quantization_config.sparsity_config.format`: how a sparse module's weight is stored (see `graph/scatter.py`).
SPARSITY_FORMATS = ("sparse-bitmask", "sparse-24-bitmask", "dense")
# Formats refused by name, with the reason (anything else unknown is refused as unknown).
REFUSED_FORMATS = {
    "marlin-24": "a 2:4-sparse int4 layout for vLLM's Marlin kernel (packed weights, `meta` bits and packed scales "
                 "permuted for the GPU); compressed-tensors itself has no decompressor for it",
}
SUPPORTED_STRATEGIES = ("tensor", "channel", "group", "tensor_group", "block")
PACK_BITS = (1, 2, 3, 4, 5, 6, 7, 8)  # pack-quantized intB, as compressed-tensors' pack_to_int32 writes them
# Parameters of a compressed module that the dense view does not keep.
_WEIGHT_PARAMS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape",
                  "weight_g_idx")
_ACTIVATION_PARAMS = ("input_scale", "input_zero_point", "input_global_scale", "output_scale",
                      "output_zero_point", "output_global_scale")
# Parameters of a sparse module (compressed-tensors' bitmask compressors; `row_offsets` for sparse-bitmask only).
_SPARSE_PARAMS = ("compressed", "bitmask", "shape", "row_offsets")
# Parameters that only exist in compressed modules: one left in the dense view means a module was not understood.
_COMPRESSED_PARAMS = frozenset(_WEIGHT_PARAMS + _SPARSE_PARAMS + ("scale_packed", "meta"))
_KV_PARAMS = ("k_scale", "v_scale", "q_scale", "k_zero_point", "v_zero_point", "q_zero_point")
_F32 = DType.float32


@dataclass(frozen=True)
class Scheme:
    """What one module's weights are: the compression format and the weight `QuantizationArgs` (as a dict)."""

    fmt: str
    num_bits: int
    type: str
    symmetric: bool
    strategy: str
    group_size: int | None
    block_structure: tuple[int, int] | None
    group: str


def _read_config(files: list[str]) -> dict | None:
    """The config.json beside the first file (a URL's sibling object for remote checkpoints), or None."""
    return json_beside(str(files[0]), "config.json") if files else None


def quantization_config(config: Mapping[str, Any] | None) -> dict | None:
    """The compressed-tensors `quantization_config` of a config.json (dict), or None when it has none.

    Example:
        >>> quantization_config({"quantization_config": {"quant_method": "fp8"}}) is None
        True
        >>> quantization_config({"quantization_config": {"quant_method": "compressed-tensors"}})
        {'quant_method': 'compressed-tensors'}
    """
    if not config:
        return None
    qc = config.get("quantization_config") or config.get("compression_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return None
    return qc


def check_format(fmt: Any, tensor: str, where: str, allowed: tuple[str, ...] = SUPPORTED_FORMATS) -> None:
    """UnsupportedCompressionError naming `tensor` when `fmt` is not one of `allowed` (refused formats say why).

    Example:
        >>> check_format("marlin-24", "fc.weight_packed", "quantization_config.format")
        Traceback (most recent call last):
        ...
        lazyweights.core.errors.UnsupportedCompressionError: fc.weight_packed: compressed-tensors format \
'marlin-24' (quantization_config.format) is refused: a 2:4-sparse int4 layout for vLLM's Marlin kernel \
(packed weights, `meta` bits and packed scales permuted for the GPU); compressed-tensors itself has no \
decompressor for it
    """
    if fmt in allowed:
        return
    if fmt in REFUSED_FORMATS:
        raise UnsupportedCompressionError(f"{tensor}: compressed-tensors format {fmt!r} ({where}) is refused: "
                                          f"{REFUSED_FORMATS[fmt]}")
    raise UnsupportedCompressionError(f"{tensor}: compressed-tensors format {fmt!r} ({where}) is not supported; "
                                      f"supported: {', '.join(allowed)}")


def _matches(target: str, name: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def _is_class_target(target: str) -> bool:
    return not target.startswith("re:") and "." not in target and target[:1].isupper()


def scheme_for(module: str, qc: Mapping[str, Any], stored: frozenset[str] = frozenset()) -> Scheme:
    """The scheme of `module`: the config group whose targets name it (`re:` regexes or exact names) or,
    failing that, the first group targeting a module class (`Linear`) that fits the tensors stored for it.

    UnsupportedCompressionError for a format or strategy this reader does not know, or when no group fits."""
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise UnsupportedCompressionError(f"quantization_config.config_groups must be an object, got {groups!r}")
    named = [(g, v) for g, v in groups.items() if any(_matches(t, module) for t in (v or {}).get("targets") or [])]
    by_class = [(g, v) for g, v in groups.items()
                if any(_is_class_target(t) for t in (v or {}).get("targets") or [])]
    candidates = named or by_class
    errors = []
    for gname, group in candidates:
        try:
            scheme = _scheme(module, gname, group, qc)
        except UnsupportedCompressionError as e:
            errors.append(str(e))
            continue
        packed = scheme.fmt.endswith("pack-quantized")
        if not stored or ("weight_packed" in stored) == packed or scheme.fmt == "dense":
            return scheme
    if errors:
        raise UnsupportedCompressionError(errors[0])
    listed = ", ".join(f"{g}: {(v or {}).get('targets')}" for g, v in groups.items()) or "none"
    raise UnsupportedCompressionError(
        f"{module}: compressed tensors {sorted(stored)} but no quantization_config group targets this module "
        f"(groups: {listed})")


def _scheme(module: str, gname: str, group: Mapping[str, Any], qc: Mapping[str, Any]) -> Scheme:
    fmt = group.get("format") or qc.get("format") or "dense"
    if fmt == "mixed-precision":
        raise UnsupportedCompressionError(f"{module}: group {gname!r} gives no format under a mixed-precision "
                                          "quantization_config")
    check_format(fmt, module, f"group {gname!r}")
    w = group.get("weights") or {}
    strategy = str(w.get("strategy") or ("group" if w.get("group_size") else "tensor")).lower()
    if strategy not in SUPPORTED_STRATEGIES:
        raise UnsupportedCompressionError(
            f"{module}: weight strategy {strategy!r} (group {gname!r}) is not supported; supported: "
            f"{', '.join(SUPPORTED_STRATEGIES)}")
    kind = str(w.get("type") or "int").lower()
    bits = int(w.get("num_bits") or 8)
    if kind not in ("int", "float"):
        raise UnsupportedCompressionError(f"{module}: weight type {kind!r} (group {gname!r}) is not supported; "
                                          "supported: int, float")
    if fmt == "pack-quantized" and (kind != "int" or bits not in PACK_BITS):
        raise UnsupportedCompressionError(
            f"{module}: pack-quantized {kind}{bits} (group {gname!r}) is not supported; supported: "
            f"{', '.join(f'int{b}' for b in PACK_BITS)}")
    need = {"nvfp4-pack-quantized": 4, "mxfp4-pack-quantized": 4, "mxfp6-pack-quantized": 6, "mxfp8-quantized": 8}
    if fmt in need and (kind != "float" or bits != need[fmt]):
        raise UnsupportedCompressionError(f"{module}: {fmt} needs float{need[fmt]} weights, the group {gname!r} "
                                          f"gives {kind}{bits}")
    if fmt in ("naive-quantized", "int-quantized", "float-quantized") and not (
            (kind == "int" and 1 <= bits <= 8) or (kind == "float" and bits == 8)):
        raise UnsupportedCompressionError(f"{module}: {fmt} {kind}{bits} (group {gname!r}) is not supported; "
                                          "supported: int1..int8 (stored as int8), float8 (e4m3)")
    block = w.get("block_structure")
    if isinstance(block, str):  # old configs: "128x128"
        block = [int(p) for p in block.lower().split("x")]
    gs = w.get("group_size")
    return Scheme(fmt, bits, kind, bool(w.get("symmetric", True)), strategy, int(gs) if gs else None,
                  (int(block[0]), int(block[1])) if block else None, gname)


# --- graph pieces -------------------------------------------------------------------------------------
def _rows(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


def _broadcast_const(values: np.ndarray, lead: int, count: int) -> Node:
    """`values` ([width] uint8) repeated into [lead, count, width], as a take of a tiny constant."""
    c = ops.const(values.reshape(1, 1, -1))
    return ops.take(ops.take(c, _rows(lead), 0), _rows(count), 1)


_Q4_0_ONE = np.array([0x00, 0x3C], dtype=np.uint8)  # float16 1.0, little-endian
# Q4_0 gives the low nibbles of a block's 16 bytes first, then the high ones: element 2j is at j, 2j+1 at 16+j.
_NIBBLE_ORDER = np.stack([np.arange(16), np.arange(16) + 16], axis=1).reshape(-1)


def nibbles(data: Node, count: int) -> Node:
    """uint8 [..., B] -> float32 [..., count]: each byte's low nibble then its high nibble, minus 8 (exact).

    Example:
        >>> from lazyweights.run.reference import evaluate
        >>> evaluate([nibbles(ops.const(np.array([[0x1F, 0x80]], np.uint8)), 4)])[0].tolist()
        [[7.0, -7.0, -8.0, 0.0]]
    """
    lead = data.shape[:-1]
    rows = math.prod(lead)
    width = data.shape[-1]
    x = ops.reshape(data, (rows, width))
    pad = -width % 16
    if pad:
        x = ops.concat([x, ops.take(ops.const(np.zeros((1, pad), np.uint8)), _rows(rows), 0)], 1)
    nb = (width + pad) // 16
    blocks = ops.concat([_broadcast_const(_Q4_0_ONE, rows, nb), ops.reshape(x, (rows, nb, 16))], 2)
    values = ops.dequantize(ops.reshape(blocks, (rows, nb * 18)), QuantizationEncoding.Q4_0, _F32)
    values = ops.reshape(ops.take(ops.reshape(values, (rows, nb, 32)), _NIBBLE_ORDER, 2), (rows, nb * 32))
    values = ops.slice_(values, ((0, rows, 1), (0, count, 1)))
    return ops.reshape(values, lead + (count,))


def _scalar(value: float, ndim: int) -> Node:
    return ops.const(np.full((1,) * ndim, value, dtype=np.float32))


_ZEROS16 = np.zeros(16, dtype=np.uint8)


def bits(data: Node, count: int, width: int) -> Node:
    """uint8 [..., B] read as a little-endian bit stream -> float32 [..., count, width] of its first
    `count * width` bits (0.0 / 1.0), field j's bit i being stream bit ``j * width + i``.

    Done without a bit op: every 4 bytes become the high-bit word `qh` of a llama.cpp Q5_0 block whose scale is
    1.0 and whose nibbles are 0, which dequantizes element e to ``(bit_e - 1) * 16`` (exact), in stream order.

    Example:
        >>> from lazyweights.run.reference import evaluate
        >>> evaluate([bits(ops.const(np.array([[0b10110001]], np.uint8)), 2, 3)])[0].tolist()
        [[[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]]
    """
    lead = data.shape[:-1]
    rows = math.prod(lead)
    width_bytes = data.shape[-1]
    x = ops.reshape(data, (rows, width_bytes))
    pad = -width_bytes % 4
    if pad:
        x = ops.concat([x, ops.take(ops.const(np.zeros((1, pad), np.uint8)), _rows(rows), 0)], 1)
    nb = (width_bytes + pad) // 4
    blocks = ops.concat([_broadcast_const(_Q4_0_ONE, rows, nb), ops.reshape(x, (rows, nb, 4)),
                         _broadcast_const(_ZEROS16, rows, nb)], 2)
    values = ops.dequantize(ops.reshape(blocks, (rows, nb * 22)), QuantizationEncoding.Q5_0, _F32)
    values = ops.slice_(values, ((0, rows, 1), (0, count * width, 1)))
    values = binary("add", binary("div", values, _scalar(16.0, 2)), _scalar(1.0, 2))
    return ops.reshape(values, lead + (count, width))


def _field(b: Node, lo: int, hi: int) -> Node:
    """Bits lo..hi-1 of each field of `bits(...)` as one unsigned float32 number [..., count] (exact)."""
    nd = b.ndim
    out = None
    for i in range(lo, hi):
        bit = ops.reshape(ops.slice_(b, tuple((0, d, 1) for d in b.shape[:-1]) + ((i, i + 1, 1),)), b.shape[:-1])
        term = bit if i == lo else binary("mul", bit, _scalar(float(1 << (i - lo)), nd - 1))
        out = term if out is None else binary("add", out, term)
    assert out is not None
    return out


def signed_fields(data: Node, width: int, count: int) -> Node:
    """uint8 [..., B], a little-endian stream of `width`-bit unsigned fields -> float32 [..., count]: each
    field minus ``2 ** (width - 1)``, as compressed-tensors' `unpack_from_int32` gives it (exact).

    Example:
        >>> from lazyweights.run.reference import evaluate
        >>> evaluate([signed_fields(ops.const(np.array([[0b11100100]], np.uint8)), 2, 4)])[0].tolist()
        [[-2.0, -1.0, 0.0, 1.0]]
    """
    if width == 4:
        return nibbles(data, count)
    if width == 8:
        sliced = ops.slice_(data, tuple((0, d, 1) for d in data.shape[:-1]) + ((0, count, 1),))
        return binary("sub", ops.cast(sliced, _F32), _scalar(128.0, data.ndim))
    return binary("sub", _field(bits(data, count, width), 0, width), _scalar(float(1 << (width - 1)), data.ndim))


def fp6_values(packed: Node, count: int) -> Node:
    """uint8 [..., B] of FP6 E2M3 codes, four per three bytes (little-endian, sign in bit 5) -> float32
    [..., count], -0.0 kept (compressed-tensors' `unpack_fp6_from_uint8`). With e = bits 3-4 and m = bits 0-2,
    the magnitude is ``(m + 8 * (e > 0)) / 8 * 2 ** max(e - 1, 0)``, written in products of bits (exact).

    Example:
        >>> from lazyweights.run.reference import evaluate
        >>> codes = [0x01, 0x08, 0x1F, 0x20]  # 1/8, 1.0, 7.5, -0.0
        >>> word = codes[0] | codes[1] << 6 | codes[2] << 12 | codes[3] << 18
        >>> packed = np.array([[word & 255, word >> 8 & 255, word >> 16]], np.uint8)
        >>> evaluate([fp6_values(ops.const(packed), 4)])[0].tolist()
        [[0.125, 1.0, 7.5, -0.0]]
    """
    b = bits(packed, count, 6)
    nd = b.ndim - 1
    m, b3, b4, b5 = _field(b, 0, 3), _field(b, 3, 4), _field(b, 4, 5), _field(b, 5, 6)
    b34 = binary("mul", b3, b4)
    normal = binary("sub", binary("add", b3, b4), b34)                        # e > 0
    power = binary("add", binary("add", _scalar(1.0, nd), b4), binary("mul", b34, _scalar(2.0, nd)))  # 2**max(e-1,0)
    mag = binary("mul", binary("mul", binary("add", m, binary("mul", normal, _scalar(8.0, nd))), power),
                 _scalar(0.125, nd))
    sign = binary("sub", _scalar(1.0, nd), binary("mul", b5, _scalar(2.0, nd)))
    return binary("mul", sign, mag)


def fp4_values(packed: Node, count: int) -> Node:
    """uint8 [..., B] of FP4 e2m1 codes, two per byte (low nibble first) -> float32 [..., count], -0.0 kept.

    Example:
        >>> from lazyweights.run.reference import evaluate
        >>> evaluate([fp4_values(ops.const(np.array([[0x71, 0x08]], np.uint8)), 4)])[0].tolist()
        [[0.5, 6.0, -0.0, 0.0]]
    """
    codes = binary("add", nibbles(packed, count), _scalar(8.0, packed.ndim))
    return ops.cast(ops.bitcast(ops.cast(codes, DType.uint8), DType.float4_e2m1fn), _F32)


def _torch(kind: str, a: Node, b: Node, dtype: DType) -> Node:
    """torch's `a <kind> b` computed in `dtype` (float32 arithmetic rounded to `dtype`, as torch does)."""
    if dtype is DType.float64:
        return binary(kind, ops.cast(a, dtype), ops.cast(b, dtype))
    return ops.cast(binary(kind, ops.cast(a, _F32), ops.cast(b, _F32)), dtype)


def _promote(a: DType, b: DType) -> DType:
    """torch's type promotion between two float tensors."""
    if a is b:
        return a
    if DType.float64 in (a, b):
        return DType.float64
    if {a, b} <= {DType.float16, DType.bfloat16, DType.float32} and DType.float32 not in (a, b):
        return DType.float32  # bf16 with f16
    return DType.float32 if DType.float32 in (a, b) else a


def _expand(scale: Node, weight_shape: tuple[int, ...], scheme: Scheme, g_idx: np.ndarray | None,
            name: str) -> Node:
    """The scale (or zero point) tensor brought to the weight's shape for the strategy (broadcast or taken)."""
    *lead, n, k = weight_shape
    lead_t = tuple(lead)
    s = scale

    def bad(expected) -> ScaleShapeError:
        return ScaleShapeError(f"{name}: shape {list(scale.shape)} does not fit the weight {list(weight_shape)} "
                               f"({scheme.strategy} strategy{_describe(scheme)}: expected {list(expected)})")

    if scheme.strategy == "tensor":
        if s.size != max(1, math.prod(lead_t)) and s.size != 1:
            raise bad(lead_t + (1, 1))
        return ops.reshape(s, (lead_t if s.size > 1 else (1,) * len(lead_t)) + (1, 1))
    if scheme.strategy == "channel":
        if s.size != math.prod(lead_t) * n:
            raise bad(lead_t + (n, 1))
        return ops.reshape(s, lead_t + (n, 1))
    if scheme.strategy in ("group", "tensor_group"):
        gs = scheme.group_size
        if not gs:
            raise UnsupportedCompressionError(f"{name}: {scheme.strategy} strategy without a group_size")
        if g_idx is not None:
            groups = int(g_idx.max()) + 1 if g_idx.size else 0
            if s.shape[-2:] != (n, groups) or s.shape[:-2] != lead_t:
                raise bad(lead_t + (n, groups))
            return ops.take(s, g_idx, len(lead_t) + 1)
        if k % gs:
            raise ScaleShapeError(f"{name}: the weight's {k} columns are not a multiple of group_size {gs}")
        if tuple(s.shape) != lead_t + (n, k // gs):
            raise bad(lead_t + (n, k // gs))
        return ops.reshape(s, lead_t + (n, k // gs, 1))  # broadcast over [.., n, k // gs, gs]
    # block
    if scheme.block_structure is None:
        raise UnsupportedCompressionError(f"{name}: block strategy without a block_structure")
    bh, bw = scheme.block_structure
    want = lead_t + (-(-n // bh), -(-k // bw))
    if tuple(s.shape) != want:
        raise bad(want)
    axis = len(lead_t)
    return ops.take(ops.take(s, np.arange(n) // bh, axis), np.arange(k) // bw, axis + 1)


def _describe(scheme: Scheme) -> str:
    if scheme.strategy == "block":
        return f" {scheme.block_structure}"
    if scheme.group_size:
        return f" group_size {scheme.group_size}"
    return ""


def dequantize(q: Node, scale: Node, zero_point: Node | None, scheme: Scheme, name: str, *,
               global_scale: Node | None = None, out_dtype: DType | None = None,
               g_idx: np.ndarray | None = None) -> Node:
    """compressed-tensors' `dequantize` (forward_helpers._dequantize per strategy) as a lazy chain.

    `q`: the quantized values as float32 (exact) or the stored int8 / fp8 weight; result in `out_dtype`
    (default: the scale's dtype after the global-scale division, as compressed-tensors returns).

    Example:
        >>> from lazyweights.run.reference import evaluate
        >>> q = ops.const(np.array([[-8, 7, 1, 0]], np.int8))
        >>> s = ops.const(np.array([[0.5, 0.25]], np.float32))
        >>> sch = Scheme("naive-quantized", 8, "int", True, "group", 2, None, "g")
        >>> evaluate([dequantize(q, s, None, sch, "w")])[0].tolist()
        [[-4.0, 3.5, 0.25, 0.0]]
    """
    shape = q.shape
    grouped = scheme.strategy in ("group", "tensor_group") and g_idx is None
    s_dtype = scale.dtype
    s = _expand(scale, shape, scheme, g_idx, name + "_scale")
    if global_scale is not None:
        s_dtype = _promote(s_dtype, global_scale.dtype)
        g = ops.reshape(global_scale, (1,) * s.ndim) if global_scale.size == 1 else global_scale
        s = _torch("div", s, g, s_dtype)
    x = ops.cast(q, _F32)
    if grouped:
        gs = scheme.group_size or 1
        x = ops.reshape(x, shape[:-1] + (shape[-1] // gs, gs))
    # `x_q.to(s.dtype)` is exact here (int8 / int4 values, FP8 e4m3 and FP4 e2m1 values all fit bf16, f16 and
    # f32), so x stays float32; the zero-point difference (at most 255) is exact too, but is rounded to the
    # scale's dtype as torch rounds it all the same.
    if zero_point is not None:
        zp = _expand(zero_point, shape, scheme, g_idx, name + "_zero_point")
        x = _torch("sub", x, ops.cast(zp, s_dtype), s_dtype)
    out = _torch("mul", x, s, s_dtype)
    if grouped:
        out = ops.reshape(out, shape)
    return ops.cast(out, out_dtype or s_dtype)


# --- the dense records ----------------------------------------------------------------------------------
class StoredParts:
    """The stored tensors behind one dense weight, standing where a record's `file` stands: `path` and `size`
    are the main tensor's file's; `prefetch` warms every part (`Weights.prefetch`), `check_unchanged` checks
    every part's file."""

    def __init__(self, records: list):
        self.records = records
        self.path = records[0].file.path
        self.size = records[0].file.size

    def prefetch(self, offset: int, length: int) -> None:
        """Bring every stored part's bytes in (remote sources fetch them; local maps ignore it)."""
        for r in self.records:
            r.file.prefetch(r.offset, r.nbytes)

    def check_unchanged(self, tensor: str | None = None) -> None:
        """Raise SourceChangedError if any part's file changed since it was opened."""
        for r in self.records:
            r.file.check_unchanged(r.name)

    def __repr__(self) -> str:
        return f"StoredParts({self.path!r}, {[r.name for r in self.records]})"


@dataclass(eq=False)
class DecompressedRecord:
    """A dense weight computed from a compressed module's stored tensors; `node` builds (once) its graph.

    `file` is the `StoredParts` it is computed from, `offset` the main stored tensor's; `nbytes`, `dtype`,
    `shape` describe the dense weight; `extra` names the format, the scheme and the stored tensors."""

    file: Any
    name: str
    offset: int
    nbytes: int
    dtype: DType
    shape: tuple[int, ...]
    build: Callable[[], Node] = field(repr=False)
    extra: dict = field(default_factory=dict)
    encoding: Any = None
    _node: Node | None = field(default=None, repr=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False)

    @property
    def node(self) -> Node:
        """The dense tensor's graph, built once on first use (thread-safe) and shared after."""
        with self._lock:
            if self._node is None:
                self._node = self.build()
            return self._node


def _small_array(record, what: str) -> np.ndarray:
    arr = np.array(record.array())
    if arr.dtype.kind not in "iu":
        raise FormatError(f"{record.file.path}: {record.name!r} ({what}) must hold integers, got {arr.dtype}")
    return arr


def _mx_scale(scale: Node) -> Node:
    """compressed-tensors' `decompress_mx_scale`: e8m0 exponents (uint8) -> 2 ** (e - 127) in bfloat16."""
    if scale.dtype is DType.uint8:
        scale = ops.bitcast(scale, DType.float8_e8m0fnu)
    return ops.cast(ops.cast(scale, _F32), DType.bfloat16)


class SparseWeight:
    """A sparse module's dense weight (before any dequantization): `records` are its stored tensors
    (`compressed`, `bitmask`, `shape`, maybe `row_offsets`), `node()` the `scatter` that rebuilds it. `shape`
    comes from the stored `shape` tensor (read at open, two integers); everything else is checked against it.
    """

    def __init__(self, module: str, fmt: str, params: Mapping[str, Any]):
        self.module, self.fmt = module, fmt
        need = ("compressed", "bitmask", "shape") + (("row_offsets",) if fmt == "sparse-bitmask" else ())
        missing = [p for p in need if p not in params]
        if missing:
            raise FormatError(f"{module}: a {fmt} module needs {', '.join(module + '.' + p for p in need)}; the "
                              f"checkpoint lacks {', '.join(module + '.' + p for p in missing)}")
        self.compressed, self.bitmask = params["compressed"], params["bitmask"]
        self.row_offsets = params.get("row_offsets") if fmt == "sparse-bitmask" else None
        shape_rec = params["shape"]
        self.records = [r for r in (self.compressed, self.bitmask, shape_rec, self.row_offsets) if r is not None]
        shape = tuple(int(v) for v in _small_array(shape_rec, "shape").reshape(-1))
        if len(shape) != 2 or min(shape) < 0:
            raise ScaleShapeError(f"{module}.shape: {list(shape)} is not the shape of a 2-D weight")
        rows, cols = shape
        c, b = self.compressed, self.bitmask
        if b.dtype is not DType.uint8 or tuple(b.shape) != (rows, -(-cols // 8)):
            raise ScaleShapeError(f"{module}.bitmask: {b.dtype.name}{list(b.shape)} does not fit the weight "
                                  f"{list(shape)} (need uint8{[rows, -(-cols // 8)]})")
        if fmt == "sparse-24-bitmask":
            if cols % 4 or tuple(c.shape) != (rows, cols // 2):
                raise ScaleShapeError(f"{module}.compressed: {c.dtype.name}{list(c.shape)} does not hold 2:4 values "
                                      f"of the weight {list(shape)} (need [{rows}, {cols // 2}])")
        else:
            ro = self.row_offsets
            assert ro is not None
            if len(c.shape) != 1 or c.shape[0] > rows * cols:
                raise ScaleShapeError(f"{module}.compressed: {c.dtype.name}{list(c.shape)} is not the flat values of "
                                      f"the weight {list(shape)} (need [nnz], nnz <= {rows * cols})")
            if tuple(ro.shape) != (rows,) or ro.dtype.name not in ("int32", "int64"):
                raise ScaleShapeError(f"{module}.row_offsets: {ro.dtype.name}{list(ro.shape)} does not fit the weight "
                                      f"{list(shape)} (need int64[{rows}])")
        self.shape, self.dtype = shape, c.dtype
        self.name, self.offset, self.file, self.nbytes = c.name, c.offset, c.file, c.nbytes

    def record(self) -> "DecompressedRecord":
        """The dense weight as a record (a sparse module without quantization)."""
        return DecompressedRecord(StoredParts(self.records), self.module + ".weight", self.offset,
                                  math.prod(self.shape) * self.dtype.size_in_bytes, self.dtype, self.shape, self.node,
                                  {"format": self.fmt, "stored": [r.name for r in self.records]})

    def node(self) -> Node:
        """The dense weight as a `scatter` over the stored tensors (values in their stored dtype)."""
        from ..graph.scatter import scatter

        ro = None if self.row_offsets is None else ops.source(self.row_offsets)
        return scatter(ops.source(self.compressed), ops.source(self.bitmask), self.shape[1], ro)


def check_config(qc: Mapping[str, Any], names: list[str]) -> None:
    """Refuse, before any work, a compressed-tensors config this reader does not fully understand: a quantization
    or sparsity format it does not decompress (marlin-24 by name), a group's weight scheme (type, bits, strategy)
    it does not know, a `transform_config`. The UnsupportedCompressionError names a stored tensor the setting
    governs (one of `names`) and the value.

    Example:
        >>> check_config({"format": "pack-quantized", "sparsity_config": {"format": "sparse-4-of-8"}},
        ...              ["fc.compressed", "fc.bitmask"])
        Traceback (most recent call last):
        ...
        lazyweights.core.errors.UnsupportedCompressionError: fc.compressed: compressed-tensors format \
'sparse-4-of-8' (quantization_config.sparsity_config.format) is not supported; supported: sparse-bitmask, \
sparse-24-bitmask, dense
    """
    def tensor_for(targets) -> str:
        order = ("weight_packed", "compressed", "weight_scale")  # a module's main tensor first
        compressed = sorted((n for n in names if n.rpartition(".")[2] in _COMPRESSED_PARAMS),
                            key=lambda n: order.index(p) if (p := n.rpartition(".")[2]) in order else len(order))
        named = [t for t in (targets or []) if isinstance(t, str) and not _is_class_target(t)]
        hit = [n for n in compressed if any(_matches(t, n.rpartition(".")[0]) for t in named)]
        return (hit or compressed or names or ["(no tensors)"])[0]

    fmt = qc.get("format")
    if fmt is not None and fmt != "mixed-precision":
        check_format(fmt, tensor_for(None), "quantization_config.format")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise UnsupportedCompressionError(f"{tensor_for(None)}: quantization_config.config_groups must be an object, "
                                          f"got {groups!r}")
    for gname, group in groups.items():
        group = group or {}
        tensor = tensor_for(group.get("targets"))
        if group.get("format") is not None:
            check_format(group["format"], tensor, f"quantization_config.config_groups.{gname}.format")
        if group.get("weights") and (group.get("format") or fmt) not in (None, "mixed-precision"):
            _scheme(tensor, gname, group, qc)  # type, bits, strategy: refused here, at open
    sparsity = qc.get("sparsity_config")
    if sparsity:
        if not isinstance(sparsity, dict):
            raise UnsupportedCompressionError(f"{tensor_for(None)}: quantization_config.sparsity_config must be an "
                                              f"object, got {sparsity!r}")
        check_format(sparsity.get("format"), tensor_for(sparsity.get("targets")),
                     "quantization_config.sparsity_config.format", SPARSITY_FORMATS)
    transform = qc.get("transform_config")
    if transform:
        raise UnsupportedCompressionError(
            f"{tensor_for(None)}: quantization_config.transform_config (keys {sorted(transform)}) is not supported: "
            "the stored weights are rotated and need the transforms applied, which this reader does not do")


class _Module:
    """One compressed module: its stored tensors and how to build its dense weight."""

    def __init__(self, name: str, params: dict, scheme: Scheme):
        self.name, self.params, self.scheme = name, params, scheme

    def src(self, param: str) -> Node | None:
        r = self.params.get(param)
        if isinstance(r, SparseWeight):
            return r.node()
        return None if r is None else ops.source(r)

    def stored(self, param: str):
        r = self.params.get(param)
        if r is None:
            raise FormatError(f"{self.name}: a {self.scheme.fmt} module needs {self.name}.{param}; the checkpoint "
                              f"has {', '.join(sorted(self.name + '.' + p for p in self.params))}")
        return r

    def record(self) -> DecompressedRecord:
        sch = self.scheme
        fmt = sch.fmt
        main = self.stored("weight_packed" if fmt.endswith("pack-quantized") else "weight")
        scale = self.stored("weight_scale")
        if fmt == "pack-quantized":
            shape_rec = self.stored("weight_shape")
            shape = tuple(int(v) for v in _small_array(shape_rec, "weight_shape").reshape(-1))
            if len(shape) != len(main.shape):
                raise ScaleShapeError(f"{self.name}.weight_shape: {list(shape)} does not fit "
                                      f"{self.name}.weight_packed {list(main.shape)}")
            dtype = scale.dtype
        elif fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
            shape = tuple(main.shape[:-1]) + (main.shape[-1] * 2,)
            dtype = DType.bfloat16
        elif fmt == "mxfp6-pack-quantized":
            if main.dtype is not DType.uint8 or len(main.shape) != 2 or main.shape[-1] % 3:
                raise ScaleShapeError(f"{self.name}.weight_packed: {main.dtype.name}{list(main.shape)} does not hold "
                                      "FP6 codes four per three bytes (need uint8[rows, 3 * cols / 4])")
            shape = (main.shape[0], main.shape[1] // 3 * 4)
            dtype = DType.bfloat16
        elif fmt == "mxfp8-quantized":
            shape = tuple(main.shape)
            dtype = DType.bfloat16  # decompress_mx_scale gives bfloat16 scales
        else:
            shape = tuple(main.shape)
            dtype = scale.dtype
            gs = self.params.get("weight_global_scale")
            if gs is not None:
                dtype = _promote(dtype, gs.dtype)
        nbytes = math.prod(shape) * dtype.size_in_bytes
        stored = [main] + [r for p, r in sorted(self.params.items()) if r is not main]
        parts = StoredParts([x for r in stored for x in (r.records if isinstance(r, SparseWeight) else [r])])
        return DecompressedRecord(parts, self.name + ".weight", main.offset, nbytes, dtype, shape,
                                  lambda: self.build(shape), {"format": fmt, "scheme": sch,
                                                              "stored": sorted(self.params)})

    def g_idx(self) -> np.ndarray | None:
        r = self.params.get("weight_g_idx")
        if r is None:
            return None
        idx = _small_array(r, "weight_g_idx").reshape(-1).astype(np.int64)
        if idx.size and idx.min() < 0:  # compressed-tensors: a -1 anywhere means no activation order
            return None
        return idx

    def build(self, shape: tuple[int, ...]) -> Node:
        sch, name = self.scheme, self.name + ".weight"
        scale = self.src("weight_scale")
        assert scale is not None
        fmt = sch.fmt
        if fmt == "pack-quantized":
            q = self._unpack(self.stored("weight_packed"), shape)
            zp = None
            if not sch.symmetric and sch.strategy in ("group", "channel"):
                zp = self._unpack_zero_point(shape, scale)
            elif not sch.symmetric:
                zp = self.src("weight_zero_point")
            return dequantize(q, scale, zp, sch, name, g_idx=self.g_idx())
        if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp6-pack-quantized"):
            packed = self.src("weight_packed")
            assert packed is not None
            if fmt == "mxfp6-pack-quantized":  # unpack_fp6_from_uint8 (bfloat16 values), then as MXFP4
                q = ops.cast(fp6_values(packed, shape[-1]), DType.bfloat16)
            else:
                q = fp4_values(packed, shape[-1])
            if fmt != "nvfp4-pack-quantized":
                return dequantize(q, _mx_scale(scale), None, sch, name, out_dtype=DType.bfloat16)
            scale = ops.cast(scale, DType.bfloat16)  # _decompress_scale: scale.to(unpacked.dtype)
            q = ops.cast(q, DType.bfloat16)
            return dequantize(q, scale, None, sch, name, global_scale=self.src("weight_global_scale"),
                              out_dtype=DType.bfloat16)
        # naive / int / float-quantized, mxfp8-quantized (FP8 e4m3 weights, e8m0 scales per 32)
        weight = self.src("weight")
        assert weight is not None
        if fmt == "mxfp8-quantized":
            return dequantize(weight, _mx_scale(scale), None, sch, name)
        zp = None if sch.symmetric else self.src("weight_zero_point")
        return dequantize(weight, scale, zp, sch, name, global_scale=self.src("weight_global_scale"),
                          g_idx=self.g_idx())

    def _unpack(self, packed_rec, shape: tuple[int, ...]) -> Node:
        bits = self.scheme.num_bits
        k = shape[-1]
        words = packed_rec.shape[-1]
        if packed_rec.dtype is not DType.int32 or tuple(packed_rec.shape[:-1]) != shape[:-1] or \
                words != -(-k * bits // 32):
            raise ScaleShapeError(f"{self.name}.weight_packed: {packed_rec.dtype.name}{list(packed_rec.shape)} does "
                                  f"not hold int{bits} values of the weight {list(shape)} (expected int32"
                                  f"{list(shape[:-1]) + [-(-k * bits // 32)]})")
        return signed_fields(ops.bitcast(ops.source(packed_rec), DType.uint8), bits, k)

    def _unpack_zero_point(self, shape: tuple[int, ...], scale: Node) -> Node:
        rec = self.stored("weight_zero_point")
        *lead, n, _ = shape
        groups = scale.shape[-1]
        bits = self.scheme.num_bits
        want = tuple(lead) + (-(-n * bits // 32), groups)
        if rec.dtype is not DType.int32 or tuple(rec.shape) != want:
            raise ScaleShapeError(f"{self.name}.weight_zero_point: {rec.dtype.name}{list(rec.shape)} does not fit "
                                  f"the weight {list(shape)} and scale {list(scale.shape)} (expected int32"
                                  f"{list(want)}, packed along rows)")
        nd = len(want)
        axes = tuple(range(nd - 2)) + (nd - 1, nd - 2)
        raw = ops.bitcast(ops.permute(ops.source(rec), axes), DType.uint8)  # [.., groups, packed rows bytes]
        return ops.permute(signed_fields(raw, bits, n), axes)


def decompress_checkpoint(checkpoint: Checkpoint, config: Mapping[str, Any] | None = None) -> Checkpoint:
    """The checkpoint with every compressed-tensors module replaced by a lazy dense `M.weight` record.

    `config`: the parsed config.json (default: read beside the checkpoint's first file). A checkpoint
    without a compressed-tensors `quantization_config` comes back unchanged. The records dropped: each
    compressed module's `weight_*` parameters and its activation scales (`input_scale`, ...), and the
    attention's `k_scale` / `v_scale` when the config has a `kv_cache_scheme`.

    Example:
        >>> import tempfile, os, json
        >>> from safetensors.numpy import save_file
        >>> from lazyweights.formats.open import open_checkpoint
        >>> d = tempfile.mkdtemp()
        >>> save_file({"fc.weight": np.array([[16, -32]], np.int8), "fc.weight_scale": np.array([[0.5]], np.float32)},
        ...           os.path.join(d, "model.safetensors"))
        >>> group = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}
        >>> qc = {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": group}}
        >>> _ = open(os.path.join(d, "config.json"), "w").write(json.dumps({"quantization_config": qc}))
        >>> ck = open_checkpoint(d)
        >>> list(ck.records), ck.records["fc.weight"].dtype.name
        (['fc.weight'], 'float32')
        >>> from lazyweights.run.reference import evaluate
        >>> evaluate([ck.records["fc.weight"].node])[0].tolist()
        [[8.0, -16.0]]
    """
    if config is None:
        config = _read_config(list(checkpoint.files))
    qc = quantization_config(config)
    if qc is None:
        # compressed-tensors' sparse parts with no config to say so: never handed out as dense weights
        names = checkpoint.records
        parts = [n for n in names if n.endswith(".bitmask") and n[:-8] + ".compressed" in names]
        if parts:
            raise UnsupportedCompressionError(
                f"{parts[0][:-8]}.compressed: a compressed-tensors sparse module ({parts[0][:-8]}.compressed, "
                f"{parts[0]}; {len(parts)} such), but no config.json with a compressed-tensors quantization_config "
                "beside the checkpoint says its format; load_weights(..., decompress=False) gives the stored tensors")
        return checkpoint
    records = checkpoint.records
    check_config(qc, list(records))
    sparsity = (qc.get("sparsity_config") or {}).get("format")
    modules: dict[str, dict] = {}
    for name, rec in records.items():
        module, _, param = name.rpartition(".")
        if param in _WEIGHT_PARAMS or param in _SPARSE_PARAMS:
            modules.setdefault(module, {})[param] = rec
    for module in list(modules):
        params = modules[module]
        if "compressed" in params or "bitmask" in params:
            if sparsity not in ("sparse-bitmask", "sparse-24-bitmask"):
                raise UnsupportedCompressionError(
                    f"{module}.{'compressed' if 'compressed' in params else 'bitmask'}: a sparse module's tensor, but "
                    f"quantization_config.sparsity_config.format is {sparsity!r} (supported: sparse-bitmask, "
                    "sparse-24-bitmask)")
            if "weight_packed" in params or module + ".weight" in records:
                raise UnsupportedCompressionError(
                    f"{module}.compressed: {sparsity} over a packed or dense weight "
                    f"({', '.join(sorted(module + '.' + p for p in params))}) is not supported")
            sparse_weight = SparseWeight(module, sparsity, params)
            for p in _SPARSE_PARAMS:
                params.pop(p, None)
            params["weight"] = sparse_weight
            continue
        for p in ("shape", "row_offsets"):  # names only a sparse module gives meaning to
            params.pop(p, None)
        if module + ".weight" in records:
            params["weight"] = records[module + ".weight"]
        if "weight_scale" not in params:  # e.g. a stray weight_shape: not a compressed module
            del modules[module]
    kv = bool(qc.get("kv_cache_scheme"))
    out: dict = {}
    for name, rec in records.items():
        module, _, param = name.rpartition(".")
        if module in modules and (param in _WEIGHT_PARAMS or param in _ACTIVATION_PARAMS or param == "weight"
                                  or param in _SPARSE_PARAMS):
            key = module + ".weight"
            params = modules[module]
            if param in ("weight_packed", "weight", "compressed") and key not in out:
                weight = params.get("weight")
                scheme = scheme_for(module, qc, frozenset(params)) if "weight_scale" in params else None
                if isinstance(weight, SparseWeight) and scheme is not None and scheme.fmt not in (
                        "naive-quantized", "int-quantized", "float-quantized", "mxfp8-quantized", "dense"):
                    raise UnsupportedCompressionError(f"{module}.compressed: {weight.fmt} with {scheme.fmt} weights is "
                                                      "not supported (sparse weights are stored unpacked)")
                if scheme is None or scheme.fmt == "dense":
                    if isinstance(weight, SparseWeight):
                        out[key] = weight.record()
                    elif weight is not None:
                        out[key] = weight
                    continue
                out[key] = _Module(module, params, scheme).record()
            continue
        if kv and param in _KV_PARAMS:
            continue
        if param in _ACTIVATION_PARAMS and module + ".weight" in records:
            continue
        out[name] = rec
    left = [n for n in out if n.rpartition(".")[2] in _COMPRESSED_PARAMS - {"weight_shape", "shape"}]
    if left:
        raise UnsupportedCompressionError(
            f"{left[0]}: a compressed-tensors parameter that no module this reader understands uses ({len(left)} such "
            f"tensors, e.g. {', '.join(left[:4])}); quantization_config.format {qc.get('format')!r}, "
            f"sparsity_config.format {sparsity!r}. Refusing to pass stored parts through as dense weights")
    return Checkpoint(checkpoint.format, out, {**checkpoint.metadata, "compressed_tensors": qc},
                      list(checkpoint.files))
