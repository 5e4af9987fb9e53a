"""One tensor-parallel rank's slice of a state dict, lazily: `shard(state_dict, rank, world_size)`.

Each weight is split along the axis its layer is parallel on, Megatron/vLLM style, and the rank keeps its
contiguous part; nothing is read. Because every slice is a view node over the checkpoint, a rank's plan reads
only that rank's bytes: from a local map only those pages are touched, and from object storage only those
byte ranges are fetched (`run/fetch.py`: a row-parallel slice is one run per row, sent as multi-range
requests where the server takes them).

Built-in rules (first match wins; custom `rules` come before them):

- column-parallel, axis 0: Hugging Face `q_proj k_proj v_proj gate_proj up_proj` (+ bias); MAX-style `wq wk wv`,
  `feed_forward.w1 w3`, `attention.q_proj ...`; GGUF `attn_q attn_k attn_v ffn_gate ffn_up`.
- row-parallel, axis 1: Hugging Face `o_proj down_proj` (bias replicated); MAX-style `wo`, `feed_forward.w2`;
  GGUF `attn_output ffn_down`.
- vocab-parallel, axis 0: Hugging Face `embed_tokens lm_head`; MAX-style `tok_embeddings output`; GGUF
  `token_embd output`.
- stacked experts, axis 0 (expert-parallel): Hugging Face `experts.*` of rank >= 3; GGUF `ffn_*_exps`.
- per-expert: Hugging Face `experts.E.*`: expert E on rank E // (experts / world_size).
- everything else (norms, routers, scalars): replicated.

Example:
    >>> import numpy as np
    >>> from lazyweights import from_numpy
    >>> sd = {"model.layers.0.self_attn.q_proj.weight": from_numpy(np.arange(32.0).reshape(8, 4), "q"),
    ...       "model.layers.0.self_attn.o_proj.weight": from_numpy(np.arange(32.0).reshape(4, 8), "o"),
    ...       "model.norm.weight": from_numpy(np.ones(4), "n")}
    >>> part = shard(sd, rank=1, world_size=2)
    >>> {k.split(".")[-2]: v.shape for k, v in part.items()}
    {'q_proj': (4, 4), 'o_proj': (4, 4), 'norm': (4,)}
    >>> part["model.layers.0.self_attn.o_proj.weight"].to_numpy()[0].tolist()
    [4.0, 5.0, 6.0, 7.0]
"""
from __future__ import annotations

import fnmatch
import re
from typing import Mapping

from ..core.errors import ShapeError, UsageError

# (glob over the full name, axis or None), first match wins.
LLAMA_RULES: list[tuple[str, int | None]] = [
    # stacked MoE experts ([n_experts, ...]): expert-parallel
    ("*.ffn_gate_exps.*", 0), ("*.ffn_up_exps.*", 0), ("*.ffn_down_exps.*", 0),
    # row-parallel: split the input features; their biases are added once, after the all-reduce
    ("*o_proj.bias", None), ("*down_proj.bias", None), ("*.wo.bias", None), ("*.w2.bias", None),
    ("*o_proj.weight", 1), ("*down_proj.weight", 1), ("*.attention.wo.weight", 1), ("*.feed_forward.w2.weight", 1),
    ("*.attn_output.weight", 1), ("*.ffn_down.weight", 1),
    # column-parallel: split the output features (and their biases)
    ("*q_proj.*", 0), ("*k_proj.*", 0), ("*v_proj.*", 0), ("*gate_proj.*", 0), ("*up_proj.*", 0),
    ("*.attention.wq.*", 0), ("*.attention.wk.*", 0), ("*.attention.wv.*", 0),
    ("*.feed_forward.w1.*", 0), ("*.feed_forward.w3.*", 0),
    ("*.attn_q.*", 0), ("*.attn_k.*", 0), ("*.attn_v.*", 0), ("*.ffn_gate.*", 0), ("*.ffn_up.*", 0),
    # vocab-parallel
    ("*embed_tokens.weight", 0), ("lm_head.weight", 0), ("*.lm_head.weight", 0), ("tok_embeddings.weight", 0),
    ("token_embd.weight", 0), ("output.weight", 0),
]

_EXPERT = re.compile(r"(^|\.)experts\.(\d+)\.")


def _rule(name: str, rules) -> tuple[bool, int | None]:
    for pattern, axis in rules:
        if fnmatch.fnmatchcase(name, pattern):
            return True, axis
    return False, None


def shard(state_dict: Mapping, rank: int, world_size: int, rules: Mapping[str, int | None] | None = None, *,
          defaults: bool = True, strict: bool = False) -> dict:
    """The lazy slices of `state_dict` (name -> WeightData) that tensor-parallel rank `rank` of `world_size`
    holds. `rules` ({glob: axis or None}, tried in order, before the built-in llama-family rules unless
    `defaults=False`) say which axis a weight is split on; None replicates it. Per-expert weights
    (`...experts.E....`) go whole to the rank owning expert E. With `strict=True`, a weight no rule matches is
    an error instead of replicated. A split axis whose size is not divisible by `world_size` is a ShapeError
    naming the tensor (as vLLM requires); a quantized tensor splits along its rows, not inside its blocks."""
    if not isinstance(world_size, int) or world_size < 1:
        raise UsageError(f"shard(): world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise UsageError(f"shard(): rank must be in 0..{world_size - 1} for world_size {world_size}, got {rank!r}")
    custom = list((rules or {}).items())
    for pattern, axis in custom:
        if axis is not None and not isinstance(axis, int):
            raise UsageError(f"shard(): the rule {pattern!r} gives axis {axis!r}; expected an int or None")
    table = custom + (LLAMA_RULES if defaults else [])
    experts = [int(m.group(2)) for n in state_dict for m in [_EXPERT.search(n)] if m]
    n_experts = max(experts) + 1 if experts else 0
    out = {}
    for name, wd in state_dict.items():
        matched, axis = _rule(name, table)
        m = _EXPERT.search(name)
        if m and not (matched and any(fnmatch.fnmatchcase(name, p) for p, _ in custom)):
            if n_experts % world_size:
                raise ShapeError(f"shard(): {name!r}: {n_experts} experts cannot be split evenly over world_size "
                                 f"{world_size}")
            if int(m.group(2)) // (n_experts // world_size) == rank:
                out[name] = wd
            continue
        if not matched and strict:
            raise UsageError(f"shard(): no rule matches {name!r} (strict=True); give it one in rules=, e.g. "
                             f"{{{name!r}: None}} to replicate it")
        out[name] = wd if axis is None else _slice(name, wd, axis, rank, world_size)
    return out


def _slice(name: str, wd, axis: int, rank: int, world_size: int):
    shape = tuple(wd.shape)
    if not -len(shape) <= axis < len(shape) or not shape:
        raise ShapeError(f"shard(): {name!r} has shape {list(shape)}: no axis {axis} to split")
    axis %= len(shape)
    size = shape[axis]
    enc = getattr(wd, "quantization_encoding", None)  # quantized: the last axis is bytes of blocks
    if enc is not None and axis == len(shape) - 1:
        raise ShapeError(f"shard(): {name!r} is {enc.name}-quantized along axis {axis} (its block rows), which "
                         f"cannot be split in place; dequantize it first (wd.dequantize()), or give it axis 0 or "
                         f"None in rules=")
    elif size % world_size:
        raise ShapeError(f"shard(): {name!r}: axis {axis} has size {size}, not divisible by world_size "
                         f"{world_size} (shape {list(shape)})")
    step = size // world_size
    index = tuple(slice(None) for _ in range(axis)) + (slice(rank * step, (rank + 1) * step),)
    return wd[index]
