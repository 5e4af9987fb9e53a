"""The value transforms llama.cpp's converter applies, lazily, both ways (each builds graph nodes only).

- `rope_permute` / `rope_unpermute`: llama.cpp's q/k row permutation for its interleaved RoPE
  (`LlamaModel.permute`: `w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)`,
  `n_head = num_key_value_heads` for k, 1 for q/k norms). Quantized rows are whole runs of blocks, so on
  quantized data it is a row `take` and the data stays quantized.
- `add_scalar`: Gemma's norms are stored as `w + 1` (its RMSNorm multiplies by `1 + weight`).
- `qkv_regroup_rows`: fused qkv rows laid out `[groups, q_per_group + 2, head_dim]` (GPT-NeoX: one group per
  head; Falcon: one per kv head) as llama.cpp's `[q; k; v]`, and its inverse.
- `transpose2d`: GPT-2's Conv1D weights are `[in, out]`; llama.cpp stores `[out, in]`.

Example:
    >>> import numpy as np
    >>> from lazyweights.adapters.transforms import qkv_regroup_rows
    >>> qkv_regroup_rows(n_head=2, n_kv=2, head_dim=1).tolist()   # rows q0 k0 v0 q1 k1 v1 -> q0 q1 k0 k1 v0 v1
    [0, 3, 1, 4, 2, 5]
"""
from __future__ import annotations

import numpy as np

from ..api.weight_data import WeightData
from ..core.errors import DTypeError, ShapeError
from ..graph import ops


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


def mup_scale(hf_name: str, cfg) -> float | np.ndarray | None:
    """Falcon-H1's muP multiplier for a Hugging Face weight, as llama.cpp's converter folds it in (None: none):
    gate/down MLP multipliers, attention in (q, k, v; k also times key_multiplier) and out, the Mamba in/out
    multipliers, the embedding and lm_head multipliers, and for `in_proj` one factor per output row (the five
    `ssm_multipliers` over its z, x, B, C and dt rows). `cfg`: config.json's dict.

    Example:
        >>> mup_scale("model.layers.0.self_attn.k_proj.weight", {"key_multiplier": 2.0, "attention_in_multiplier": 0.5})
        1.0
    """
    def g(key: str, default=1.0):
        v = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
        return default if v is None else v

    if hf_name.endswith("mamba.in_proj.weight"):
        inner, gs = int(g("mamba_d_ssm")), int(g("mamba_n_groups")) * int(g("mamba_d_state"))
        m = [float(x) for x in g("ssm_multipliers", [1.0] * 5)]
        heads = int(g("mamba_n_heads"))
        rows = np.concatenate([np.full(n, m[i], np.float64) for i, n in enumerate((inner, inner, gs, gs, heads))])
        return rows * float(g("ssm_in_multiplier"))
    table = (("feed_forward.gate_proj.weight", float(g("mlp_multipliers", [1.0, 1.0])[0])),
             ("feed_forward.down_proj.weight", float(g("mlp_multipliers", [1.0, 1.0])[1])),
             ("self_attn.k_proj.weight", float(g("key_multiplier")) * float(g("attention_in_multiplier"))),
             ("self_attn.q_proj.weight", float(g("attention_in_multiplier"))),
             ("self_attn.v_proj.weight", float(g("attention_in_multiplier"))),
             ("self_attn.o_proj.weight", float(g("attention_out_multiplier"))),
             ("mamba.out_proj.weight", float(g("ssm_out_multiplier"))),
             ("lm_head.weight", float(g("lm_head_multiplier"))),
             ("embed_tokens.weight", float(g("embedding_multiplier"))))
    for suffix, scale in table:
        if hf_name.endswith(suffix):
            return scale
    return None


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
