"""The value transforms llama.cpp's converter applies, lazily, both ways (each builds graph nodes only).

- `rope_permute` / `rope_unpermute`: llama.cpp's q/k row permutation for its interleaved RoPE
  (`LlamaModel.permute`: `w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)`,
  `n_head = num_key_value_heads` for k, 1 for q/k norms). Quantized rows are whole runs of blocks, so on
  quantized data it is a row `take` and the data stays quantized.
- `add_scalar`: Gemma's norms are stored as `w + 1` (its RMSNorm multiplies by `1 + weight`).
- `qkv_regroup_rows`: fused qkv rows laid out `[groups, q_per_group + 2, head_dim]` (GPT-NeoX: one group per
  head; Falcon: one per kv head) as llama.cpp's `[q; k; v]`, and its inverse.
- `transpose2d`: GPT-2's Conv1D weights are `[in, out]`; llama.cpp stores `[out, in]`.
- `mxfp4_to_ggml` / `mxfp4_from_ggml`: OCP MXFP4 blocks + scales (gpt-oss's published experts) <-> ggml's
  block_mxfp4, a bit-exact nibble repack as llama.cpp's converter does it (never dequantized).

Example:
    >>> import numpy as np
    >>> from lazyweights.convert.transforms import qkv_regroup_rows
    >>> qkv_regroup_rows(n_head=2, n_kv=2, head_dim=1).tolist()   # rows q0 k0 v0 q1 k1 v1 -> q0 q1 k0 k1 v0 v1
    [0, 3, 1, 4, 2, 5]
"""
from __future__ import annotations

import numpy as np

from ..core.dtype import DType
from ..core.errors import DTypeError, ShapeError
from ..graph import ops
from ..lazy.weight_data import WeightData


def rope_permutation(rows: int, n_head: int, rot: int | None = None) -> np.ndarray:
    """Row indices of llama.cpp's permute: `gguf_rows = hf_rows[rope_permutation(rows, n_head)]`.

    Its inverse (`np.argsort` of it) maps GGUF rows back: `hf_rows = gguf_rows[inverse]`. `rot`: rotary
    dimensions per head when RoPE covers only the first `rot` of each head (partial rotary): only those rows are
    interleaved, as llama.cpp's RoPE then rotates pairs (2j, 2j + 1) of the first `rot` and Hugging Face's
    rotate_half pairs (j, j + rot / 2).

    Example:
        >>> rope_permutation(8, 1).tolist(), rope_permutation(8, 1, rot=4).tolist()
        ([0, 4, 1, 5, 2, 6, 3, 7], [0, 2, 1, 3, 4, 5, 6, 7])
    """
    if n_head <= 0 or rows % (2 * n_head):
        raise ShapeError(f"RoPE permutation: {rows} rows are not divisible into {n_head} heads of an even size")
    head_dim = rows // n_head
    if rot is None or rot >= head_dim:
        return np.arange(rows).reshape(n_head, 2, head_dim // 2).swapaxes(1, 2).reshape(-1)
    if rot <= 0 or rot % 2:
        raise ShapeError(f"RoPE permutation: {rot} rotary dimensions of a {head_dim}-row head are not a positive even "
                         "count")
    one = np.concatenate([np.arange(rot).reshape(2, rot // 2).T.reshape(-1), np.arange(rot, head_dim)])
    return (np.arange(n_head)[:, None] * head_dim + one[None, :]).reshape(-1)


def _rows_perm(wd: WeightData, n_head: int, inverse: bool, rot: int | None = None) -> WeightData:
    if not wd.shape:
        raise ShapeError(f"RoPE permutation of {wd.name!r}: a 0-d tensor has no rows")
    rows = wd.shape[0]
    if rot is not None and n_head > 0 and rows % n_head == 0 and rot < rows // n_head:  # partial rotary: a row take
        perm = rope_permutation(rows, n_head, rot)
        return wd[np.argsort(perm) if inverse else perm]
    if rows % (2 * n_head):
        raise ShapeError(
            f"RoPE permutation of {wd.name!r}: {rows} rows are not divisible into {n_head} heads of an even size"
        )
    half = rows // n_head // 2
    rest = wd.shape[1:]
    if wd.quantization_encoding is not None:
        if wd.ndim < 2:
            raise ShapeError(f"RoPE permutation of {wd.name!r}: quantized data needs rows of blocks, got "
                             f"{list(wd.shape)}")
        perm = rope_permutation(rows, n_head)
        return wd[np.argsort(perm) if inverse else perm]
    if inverse:  # gguf -> hf: rows are (head, half, two); swap back to (head, two, half)
        return wd.reshape((n_head, half, 2) + rest).swapaxes(1, 2).reshape(wd.shape)
    return wd.reshape((n_head, 2, half) + rest).swapaxes(1, 2).reshape(wd.shape)


def rope_unpermute(wd: WeightData, n_head: int, rot: int | None = None) -> WeightData:
    """Undo llama.cpp's q/k row permutation (GGUF -> Hugging Face), lazily; quantized stays quantized. `rot`: the
    rotary dimensions per head under partial rotary (`rope_permutation`)."""
    return _rows_perm(wd, n_head, inverse=True, rot=rot)


def rope_permute(wd: WeightData, n_head: int, rot: int | None = None) -> WeightData:
    """Apply llama.cpp's q/k row permutation (Hugging Face -> GGUF), lazily; quantized stays quantized. `rot`: the
    rotary dimensions per head under partial rotary (`rope_permutation`)."""
    return _rows_perm(wd, n_head, inverse=False, rot=rot)


def add_scalar(wd: WeightData, value: float) -> WeightData:
    """`wd + value`, lazily (a broadcast `binary` add with a constant of wd's dtype)."""
    from ..graph.elementwise import binary

    if wd.quantization_encoding is not None or not wd.dtype.is_float:
        raise DTypeError(f"cannot add {value} to {wd.name!r} ({wd.dtype.name}); dequantize it first")
    const = ops.const(np.full((1,) * wd.ndim, value, dtype=wd.dtype.to_numpy()))
    return WeightData.wrap(binary("add", wd.node, const), wd.name, None)


def qkv_regroup_rows(n_head: int, n_kv: int, head_dim: int) -> np.ndarray:
    """Row indices taking fused qkv rows grouped `[n_kv, n_head // n_kv + 2, head_dim]` (each group: its
    query heads, one key head, one value head) to llama.cpp's `[q (n_head); k (n_kv); v (n_kv)]`."""
    if n_kv <= 0 or n_head % n_kv:
        raise ShapeError(f"fused qkv: {n_head} query heads do not split into {n_kv} kv groups")
    per = n_head // n_kv
    idx = np.arange(n_kv * (per + 2) * head_dim).reshape(n_kv, per + 2, head_dim)
    q = idx[:, :per].reshape(-1)
    k = idx[:, per].reshape(-1)
    v = idx[:, per + 1].reshape(-1)
    return np.concatenate([q, k, v])


def regroup_qkv(wd: WeightData, n_head: int, n_kv: int, inverse: bool = False) -> WeightData:
    """Fused qkv weight or bias rows regrouped for llama.cpp (`inverse`: back to the Hugging Face layout)."""
    rows = wd.shape[0] if wd.shape else 0
    width = n_head + 2 * n_kv
    if rows % width:
        raise ShapeError(f"fused qkv {wd.name!r}: {rows} rows do not hold {n_head} query + 2 x {n_kv} kv heads")
    perm = qkv_regroup_rows(n_head, n_kv, rows // width)
    return wd[np.argsort(perm) if inverse else perm]


def transpose2d(wd: WeightData) -> WeightData:
    """A 2-D weight transposed (Conv1D `[in, out]` <-> `[out, in]`)."""
    if wd.ndim != 2:
        raise ShapeError(f"transposing {wd.name!r}: expected a 2-D weight, got shape {list(wd.shape)}")
    return wd.transpose((1, 0))


# --- MXFP4: OCP blocks (gpt-oss's `*_blocks` / `*_scales`) <-> ggml's block_mxfp4, a byte repack -------------------
# OCP MXFP4 (the published gpt-oss checkpoints): per 32 values one e8m0 scale byte in `*_scales` and 16 bytes in
# `*_blocks`, byte k holding value 2k in its low nibble and 2k+1 in its high one. ggml's block_mxfp4 (17 bytes):
# the same scale byte, then 16 bytes, byte j holding value j (low nibble) and j + 16 (high). The 4-bit codes and
# the scale are the same on both sides (llama.cpp's converter moves bits only), so the repack is a nibble shuffle.
# The graph has no bitwise ops: the nibbles are unpacked by ggml's Q4_1 dequantizer with scale 1 and minimum 0
# (the codes themselves, exact in float32, cast back to uint8) and joined as `lo + 16 * hi` in uint8 (at most
# 15 + 240), so no value rounding can touch them: tests/adapters/test_arch_gpt_oss.py checks the bytes against
# an independent numpy repack.
_Q4_1_IDENTITY = np.array([0x00, 0x3C, 0x00, 0x00], dtype=np.uint8)  # float16 d = 1.0, m = 0.0, little-endian
_NIBBLE_POS = np.array([k // 2 + 16 * (k % 2) for k in range(32)])  # OCP value k in Q4_1's order (lows, highs)
_TO_GGML = (_NIBBLE_POS[:16], _NIBBLE_POS[16:])         # ggml byte j: values j, j + 16
_FROM_GGML = (np.arange(0, 32, 2), np.arange(1, 32, 2))  # Q4_1 order of ggml bytes is value order; OCP: 2k, 2k+1


def _shuffle_nibbles(x, order):
    """uint8 [..., 16] -> uint8 [..., 16]: byte i = nibble order[0][i] | nibble order[1][i] << 4, nibbles
    numbered as Q4_1 unpacks them (the 16 low nibbles, then the 16 high ones)."""
    from ..core.quantization import QuantizationEncoding
    from ..graph.elementwise import binary

    lead = x.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    head = ops.take(ops.const(_Q4_1_IDENTITY.reshape(1, 1, 4)), np.zeros(rows, dtype=np.int64), 0)
    blocks = ops.reshape(ops.concat([head, ops.reshape(x, (rows, 1, 16))], 2), (rows, 20))
    codes = ops.cast(ops.dequantize(blocks, QuantizationEncoding.Q4_1, DType.float32), DType.uint8)
    lo, hi = ops.take(codes, order[0], 1), ops.take(codes, order[1], 1)
    joined = binary("add", lo, binary("mul", hi, ops.const(np.full((1, 1), 16, np.uint8))))
    return ops.reshape(joined, lead + (16,))


def mxfp4_to_ggml(blocks: WeightData, scales: WeightData, name: str) -> WeightData:
    """OCP MXFP4 `blocks` uint8 [..., n_blocks, 16] and `scales` uint8 [..., n_blocks] as ggml MXFP4 rows
    (uint8 [..., n_blocks * 17], encoding MXFP4), lazily and bit for bit (no value is dequantized).

    Example:
        >>> import numpy as np
        >>> from lazyweights import WeightData
        >>> b = WeightData.from_numpy(np.array([[[0x21] + [0] * 15]], np.uint8), "b")
        >>> s = WeightData.from_numpy(np.array([[127]], np.uint8), "s")
        >>> mxfp4_to_ggml(b, s, "w").to_numpy()[0, :3].tolist()   # scale; value 0 = 1, value 1 = 2 -> byte 1
        [127, 1, 2]
    """
    from ..core.errors import ScaleShapeError
    from ..core.quantization import QuantizationEncoding

    if blocks.dtype is not DType.uint8 or scales.dtype is not DType.uint8:
        raise DTypeError(f"MXFP4 {blocks.name!r} ({blocks.dtype.name}) and {scales.name!r} ({scales.dtype.name}): "
                         "blocks and scales must both be uint8")
    if blocks.ndim < 2 or blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ScaleShapeError(f"MXFP4 {blocks.name!r} {list(blocks.shape)} does not fit its scales {scales.name!r} "
                              f"{list(scales.shape)}: blocks must be [..., n_blocks, 16] over scales [..., n_blocks]")
    qs = _shuffle_nibbles(blocks.node, _TO_GGML)
    s = ops.reshape(scales.node, tuple(scales.shape) + (1,))
    packed = ops.concat([s, qs], blocks.ndim - 1)
    out = ops.reshape(packed, tuple(blocks.shape[:-2]) + (blocks.shape[-2] * 17,))
    return WeightData.wrap(out, name, QuantizationEncoding.MXFP4)


def mxfp4_from_ggml(wd: WeightData, name: str) -> tuple[WeightData, WeightData]:
    """ggml MXFP4 rows (uint8 [..., n_blocks * 17]) as OCP (`{name}_blocks` [..., n_blocks, 16],
    `{name}_scales` [..., n_blocks]): the inverse of `mxfp4_to_ggml`, bit for bit.

    Example:
        >>> import numpy as np
        >>> from lazyweights import WeightData
        >>> from lazyweights.core.quantization import QuantizationEncoding
        >>> row = np.array([[127, 0x21] + [0] * 15], np.uint8)   # scale, value 0 = 1, value 16 = 2
        >>> b, s = mxfp4_from_ggml(WeightData.wrap(WeightData.from_numpy(row, "g").node, "g",
        ...                                        QuantizationEncoding.MXFP4), "w")
        >>> b.name, b.to_numpy()[0, 0, :1].tolist(), b.to_numpy()[0, 0, 8:9].tolist(), s.to_numpy().tolist()
        ('w_blocks', [1], [2], [[127]])
    """
    if wd.quantization_encoding is None or wd.quantization_encoding.name != "MXFP4" or wd.shape[-1] % 17:
        raise DTypeError(f"{wd.name!r}: expected ggml MXFP4 rows [..., n_blocks * 17], got "
                         f"{getattr(wd.quantization_encoding, 'name', wd.dtype.name)} {list(wd.shape)}")
    lead, nb = tuple(wd.shape[:-1]), wd.shape[-1] // 17
    x = ops.reshape(wd.node, lead + (nb, 17))
    full = tuple((0, d, 1) for d in lead + (nb,))
    scales = ops.reshape(ops.slice_(x, full + ((0, 1, 1),)), lead + (nb,))
    blocks = _shuffle_nibbles(ops.slice_(x, full + ((1, 17, 1),)), _FROM_GGML)
    return (WeightData.wrap(blocks, f"{name}_blocks", None), WeightData.wrap(scales, f"{name}_scales", None))


def _unary(wd: WeightData, *kinds: str) -> WeightData:
    from ..graph.elementwise import unary

    if wd.quantization_encoding is not None:
        wd = wd.dequantize()
    node = wd.node
    for kind in kinds:
        node = unary(kind, node)
    return WeightData.wrap(node, wd.name, None)


def ssm_to_gguf(wd: WeightData, part: str, generation: int, n_group: int = 1) -> WeightData:
    """A Mamba layer tensor (Hugging Face -> GGUF, `part`: its GGUF name's layer part) as llama.cpp's converter
    stores it: `A = -exp(A_log)`, the conv1d weight `[d_inner, 1, d_conv]` squeezed to `[d_inner, d_conv]`;
    Mamba-2's per-head A and D as `[n_head, 1]` and its gated norm as `[n_group, d_inner / n_group]`.

    Example:
        >>> import numpy as np
        >>> a_log = WeightData.from_numpy(np.log(np.arange(1, 5, dtype=np.float32)), "A_log")
        >>> ssm_to_gguf(a_log, "ssm_a", 2).to_numpy().ravel().tolist()
        [-1.0, -2.0, -3.0, -4.0]
    """
    if part == "ssm_a":
        wd = _unary(wd, "exp", "neg")
    if part == "ssm_conv1d" and wd.ndim == 3 and wd.shape[1] == 1:
        return wd.reshape((wd.shape[0], wd.shape[2]))
    if generation == 2 and part in ("ssm_a", "ssm_d") and wd.ndim == 1:
        return wd.reshape((wd.shape[0], 1))
    if generation == 2 and part == "ssm_norm" and wd.ndim == 1:
        if n_group <= 0 or wd.shape[0] % n_group:
            raise ShapeError(f"Mamba-2 norm {wd.name!r}: {wd.shape[0]} values do not split into {n_group} groups")
        return wd.reshape((n_group, wd.shape[0] // n_group))
    return wd


def ssm_to_hf(wd: WeightData, part: str, generation: int) -> WeightData:
    """The inverse of `ssm_to_gguf` (GGUF -> Hugging Face): `A_log = log(-A)`, conv1d `[d_inner, 1, d_conv]`,
    Mamba-2's A, D and norm flat again.

    Example:
        >>> import numpy as np
        >>> a = WeightData.from_numpy(-np.exp(np.ones((2, 1), np.float32)), "A")
        >>> [round(x, 6) for x in ssm_to_hf(a, "ssm_a", 2).to_numpy().tolist()]
        [1.0, 1.0]
    """
    if part == "ssm_a":
        wd = _unary(wd, "neg", "log")
    if part == "ssm_conv1d" and wd.ndim == 2:
        if wd.quantization_encoding is not None:
            wd = wd.dequantize()
        return wd.reshape((wd.shape[0], 1, wd.shape[1]))
    if generation == 2 and part in ("ssm_a", "ssm_d", "ssm_norm") and wd.ndim == 2:
        if wd.quantization_encoding is not None:
            wd = wd.dequantize()
        return wd.reshape((wd.shape[0] * wd.shape[1],))
    return wd


def scaled(wd: WeightData, scale: float | np.ndarray) -> WeightData:
    """`wd` times a scalar, or one factor per row (a vector as long as its first axis), lazily, in its dtype."""
    from ..graph.elementwise import binary

    if wd.quantization_encoding is not None or not wd.dtype.is_float:
        raise DTypeError(f"cannot scale {wd.name!r} ({wd.dtype.name}); dequantize it first")
    arr = np.asarray(scale, dtype=np.float64)
    if arr.ndim:
        if wd.ndim < 1 or arr.shape[0] != wd.shape[0]:
            raise ShapeError(f"scaling {wd.name!r} {list(wd.shape)}: {arr.shape[0]} row factors")
        arr = arr.reshape((arr.shape[0],) + (1,) * (wd.ndim - 1))
    else:
        arr = arr.reshape((1,) * wd.ndim)
    const = ops.const(arr.astype(wd.dtype.to_numpy()))
    return WeightData.wrap(binary("mul", wd.node, const), wd.name, None)


def qkvz_rows(n_k: int, head_k: int, v_per_head: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-Next's fused `in_proj_qkvz` rows (per key head `[q, k, v, z]`, v and z `v_per_head` rows each) as
    llama.cpp's converter splits them: the row order of attn_qkv (all q, all k, all v) and of attn_gate (all z).

    Example:
        >>> [r.tolist() for r in qkvz_rows(2, 1, 1)]
        [[0, 4, 1, 5, 2, 6], [3, 7]]
    """
    per = 2 * head_k + 2 * v_per_head
    base = np.arange(n_k)[:, None] * per
    spans = ((0, head_k), (head_k, 2 * head_k), (2 * head_k, 2 * head_k + v_per_head),
             (2 * head_k + v_per_head, per))
    q, k, v, z = ((base + np.arange(a, b)[None, :]).ravel() for a, b in spans)
    return np.concatenate([q, k, v]), z


def gdn_to_gguf(wd: WeightData, part: str) -> WeightData:
    """A gated delta-net layer tensor (Hugging Face -> GGUF, `part`: its GGUF name's layer part) as llama.cpp's
    converter stores it: `A = -exp(A_log)`, the conv1d weight `[d, 1, L]` squeezed to `[d, L]`.

    Example:
        >>> a_log = WeightData.from_numpy(np.log(np.arange(1, 3, dtype=np.float32)), "A_log")
        >>> gdn_to_gguf(a_log, "ssm_a").to_numpy().tolist()
        [-1.0, -2.0]
    """
    return ssm_to_gguf(wd, part, 1)


def gdn_to_hf(wd: WeightData, part: str) -> WeightData:
    """The inverse of `gdn_to_gguf`: `A_log = log(-A)`, conv1d `[d, 1, L]`.

    Example:
        >>> a = WeightData.from_numpy(-np.exp(np.ones(2, np.float32)), "A")
        >>> [round(x, 6) for x in gdn_to_hf(a, "ssm_a").to_numpy().tolist()]
        [1.0, 1.0]
    """
    return ssm_to_hf(wd, part, 1)


def v_head_order(n_k: int, v_per_k: int, head_dim: int) -> np.ndarray:
    """llama.cpp's Qwen3.5 value-head reorder (`_LinearAttentionVReorderBase`): rows grouped by key head
    `[k0: v0..v(r-1), k1: ...]` to tiled `[v0: k0, k1, ..., v1: ...]`, so ggml's broadcast repeats key heads.
    New row i is old row `order[i]`.

    Example:
        >>> v_head_order(2, 2, 1).tolist()
        [0, 2, 1, 3]
    """
    return np.arange(n_k * v_per_k * head_dim).reshape(n_k, v_per_k, head_dim).transpose(1, 0, 2).ravel()


def v_reorder(wd: WeightData, hf_name: str, dims: tuple[int, int, int, int], inverse: bool = False) -> WeightData:
    """A Qwen3.5 gated delta-net tensor with its value heads in llama.cpp's tiled order (`inverse`: back to the
    Hugging Face grouped order); `dims`: key heads, value heads, key head size, value head size. Tensors
    without value heads come back unchanged.

    Example:
        >>> a = WeightData.from_numpy(np.arange(4, dtype=np.float32), "model.layers.0.linear_attn.A_log")
        >>> v_reorder(a, a.name, (2, 4, 8, 8)).to_numpy().tolist()
        [0.0, 2.0, 1.0, 3.0]
    """
    n_k, n_v, hk, hv = dims
    if n_k <= 0 or n_v == n_k or n_v % n_k or ".linear_attn." not in hf_name:
        return wd
    r = n_v // n_k
    keep, hd, cols = 0, hv, False
    if hf_name.endswith("in_proj_qkv.weight"):
        keep = 2 * n_k * hk
    elif hf_name.endswith(("conv1d.weight", "conv1d.bias")):
        keep = 2 * n_k * hk
    elif hf_name.endswith(("in_proj_a.weight", "in_proj_b.weight", ".A_log", ".dt_bias", "dt_proj.bias")):
        hd = 1
    elif hf_name.endswith("out_proj.weight"):
        cols = True
    elif not hf_name.endswith("in_proj_z.weight"):
        return wd
    order = v_head_order(n_k, r, hd)
    if inverse:
        order = np.argsort(order)
    perm = np.concatenate([np.arange(keep), keep + order])
    if wd.quantization_encoding is not None:
        wd = wd.dequantize()
    n = wd.shape[1] if cols else wd.shape[0]
    if n != len(perm):
        raise ShapeError(f"{hf_name!r} {list(wd.shape)}: expected {len(perm)} value-head "
                         f"{'columns' if cols else 'rows'} ({n_k} key heads, {n_v} value heads)")
    if cols:
        return transpose2d(transpose2d(wd)[perm])
    return wd[perm]
