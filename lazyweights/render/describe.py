"""What a person debugging an adapter asks of one node: its op's arguments in words, and names short enough to draw.

`op_details(node)` lists a node's argument as (field, value) rows, read from the node itself: a cast's
from/to dtypes, a permutation's axes, a slice's bounds per axis, a gather's axis and indices (abbreviated
when long), and a RoPE row permutation named as such (`rope_gather`), with its axis, heads and pattern.
`box_label(node)` is the short op text drawn inside a node's box. `short_name(name, width)` shortens a
tensor name for a label by dropping what is least distinguishing first (a leading `model.`, a trailing
`.weight`, then middle components), so `model.layers.3.self_attn.q_proj.weight` keeps `layers.3` and
`q_proj` where a cut at the front would lose the layer.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> x = ops.const(np.zeros((2, 16, 4), np.float32))
    >>> g = ops.take(x, list(range(0, 16, 2)) + list(range(1, 16, 2)), 1)
    >>> rope_gather(g)
    RopeGather(axis=1, heads=2, head_dim=16, direction='interleaved -> halves', pattern='[0:16:2,1:16:2]')
    >>> box_label(g)
    'RoPE gather[axis=1]'
    >>> short_name("model.layers.3.self_attn.q_proj.weight", 25)
    'layers.3.self_attn.q_proj'
    >>> short_name("model.layers.{0..17}.mlp.down_proj.weight", 25)
    'layers.{0..17}.…down_proj'
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..core.units import format_bytes
from ..graph.node import IndexArray, Node
from ..graph.opcodes import Op
from .explain import index_text, op_label, type_str

__all__ = ["RopeGather", "rope_gather", "op_details", "box_label", "short_name", "index_summary"]


class RopeGather(NamedTuple):
    """A `take` recognised as llama.cpp's q/k RoPE row permutation (or its inverse).

    `axis`: the gathered axis; `heads`: heads the gathered axis holds (1 when the take runs per head along
    axis 1 of a `[heads, head_dim, ...]` reshape, whose leading axis then counts the heads); `head_dim`: rows per
    head; `direction`: "halves -> interleaved" (Hugging Face -> GGUF, `rope_permute`) or "interleaved -> halves"
    (GGUF -> Hugging Face, `rope_unpermute`); `pattern`: the indices as slices."""

    axis: int
    heads: int
    head_dim: int
    direction: str
    pattern: str


def _rope_forward(n: int, heads: int) -> np.ndarray:
    """llama.cpp's permutation of n rows in `heads` heads (`LlamaModel.permute`): halves -> interleaved."""
    return np.arange(n).reshape(heads, 2, n // heads // 2).swapaxes(1, 2).reshape(-1)


@lru_cache(maxsize=256)
def _rope_match(idx: IndexArray) -> tuple[int, str] | None:
    n = len(idx)
    if n < 4 or n % 2 or n > (1 << 20):
        return None
    arr = idx.array
    for heads in range(1, n // 2 + 1):
        if n % (2 * heads) or n // heads < 4:
            continue
        fwd = _rope_forward(n, heads)
        if np.array_equal(arr, fwd):
            return heads, "halves -> interleaved"
        inv = np.empty_like(fwd)
        inv[fwd] = np.arange(n)
        if np.array_equal(arr, inv):
            return heads, "interleaved -> halves"
    return None


def rope_gather(node: Node) -> RopeGather | None:
    """The RoPE row permutation a `take` node performs, or None when its indices are no such permutation."""
    if node.op is not Op.TAKE:
        return None
    axis, idx = node.arg
    found = _rope_match(idx)
    if found is None:
        return None
    heads, direction = found
    n = len(idx)
    src_shape = node.srcs[0].shape
    if heads == 1 and axis == 1 and len(src_shape) >= 3:
        heads = src_shape[0]  # a per-head take over a [heads, head_dim, ...] reshape
        head_dim = n
    else:
        head_dim = n // heads
    return RopeGather(axis, heads, head_dim, direction, index_text(idx.array, src_shape[axis], limit=64))


def index_summary(idx: IndexArray, dim: int | None = None, limit: int = 120) -> str:
    """Indices as slices where they run, cut after `limit` characters, with their count: `[0:64:2,1:64:2] (64)`."""
    return f"{index_text(idx.array, dim, limit=limit)} ({len(idx)} indices)"


def box_label(node: Node) -> str:
    """The op text drawn in a node's box: `op_label`, except a gather says what it is rather than a cut list."""
    if node.op is Op.TAKE:
        rope = rope_gather(node)
        if rope is not None:
            return f"RoPE gather[axis={rope.axis}]"
        axis, idx = node.arg
        text = op_label(node)
        return text if len(text) <= 24 else f"take[axis={axis}, {len(idx)} idx]"
    return op_label(node)


def _slice_rows(node: Node) -> list[tuple[str, str]]:
    rows = []
    for axis, ((start, stop, step), dim) in enumerate(zip(node.arg, node.srcs[0].shape)):
        if (start, stop, step) == (0, dim, 1):
            continue
        text = f"{start}:{min(stop, dim)}" + (f":{step}" if step != 1 else "")
        rows.append((f"axis {axis}", f"{text} of {dim} ({len(range(start, stop, step))} kept)"))
    return rows or [("bounds", "whole (no axis cut)")]


def op_details(node: Node) -> list[tuple[str, str]]:
    """The node's op and argument as (field, value) rows, read from the node (see the module docstring)."""
    op = node.op
    src = node.srcs[0] if node.srcs else None
    rows: list[tuple[str, str]] = []
    if op is Op.SOURCE:
        rec = node.arg
        rows += [("tensor", rec.name), ("file", rec.file.path),
                 ("offset", f"{rec.offset:#x} ({rec.offset} bytes into {os.path.basename(rec.file.path)})"),
                 ("stored", f"{type_str(node)}, {format_bytes(rec.nbytes)}")]
        if getattr(rec, "encoding", None) is not None:
            rows.append(("encoding", rec.encoding.name))
    elif op is Op.CONST:
        arr = node.arg.array
        rows.append(("constant", f"in memory, {arr.dtype}{list(arr.shape)}"))
        if arr.size <= 8:
            rows.append(("values", np.array2string(arr.reshape(-1), separator=", ")))
    elif op in (Op.CAST, Op.BITCAST):
        assert src is not None
        rows.append(("from", src.dtype.name))
        rows.append(("to", node.dtype.name + (" (bits reinterpreted)" if op is Op.BITCAST else "")))
    elif op is Op.RESHAPE:
        assert src is not None
        rows.append(("shape", f"{list(src.shape)} -> {list(node.shape)}"))
    elif op is Op.PERMUTE:
        axes = tuple(node.arg)
        rows.append(("axes", f"({', '.join(str(a) for a in axes)})"
                     + (" (transpose)" if axes == (1, 0) else "")))
    elif op is Op.SLICE:
        rows += _slice_rows(node)
    elif op is Op.TAKE:
        assert src is not None
        axis, idx = node.arg
        rope = rope_gather(node)
        if rope is not None:
            rows.append(("gather", f"RoPE row permutation ({rope.direction})"))
            rows.append(("heads", f"{rope.heads} x {rope.head_dim} rows"))
        rows.append(("axis", f"{axis} (length {src.shape[axis]})"))
        rows.append(("indices", index_summary(idx, src.shape[axis])))
    elif op is Op.CONCAT:
        rows.append(("axis", str(node.arg)))
        rows.append(("inputs", ", ".join(type_str(s) for s in node.srcs)))
    elif op is Op.DEQUANTIZE:
        enc, dt = node.arg
        rows += [("encoding", enc.name), ("to", dt.name)]
    elif op is Op.QUANTIZE:
        enc, importance, reason = node.arg
        rows.append(("encoding", enc.name))
        if reason:
            rows.append(("why", str(reason)))
        if importance is not None:
            rows.append(("imatrix", "yes"))
    elif op in (Op.BINARY, Op.UNARY):
        rows.append(("function", str(node.arg)))
        for i, s in enumerate(node.srcs):
            if s.op is Op.CONST and s.arg.array.size <= 8:
                rows.append((f"operand {i}", np.array2string(s.arg.array.reshape(-1), separator=", ")))
    elif op is Op.LORA:
        for i, (scale, transposed) in enumerate(node.arg):
            rows.append((f"adapter {i}", f"scale {scale:g}" + (", transposed" if transposed else "")))
    return rows


_COMPONENT = re.compile(r"\{[^}]*\}|[^.]+")


def _components(name: str) -> list[str]:
    """Dot components, keeping a folded `{0..17}` whole."""
    return _COMPONENT.findall(name)


def _is_index(c: str) -> bool:
    return c.isdigit() or (c.startswith("{") and c.endswith("}"))


def _elide(head: list[str], rest: list[str], width: int) -> str:
    """`head` joined with as many of `rest`'s last components as fit in `width` (at least one), `…` between."""
    tail: list[str] = []
    for i in range(len(rest) - 1, -1, -1):
        whole = i == 0  # taking this one leaves nothing out: no `…`
        if tail and len(".".join(head) + ("." if whole else ".…") + ".".join(rest[i:])) > width:
            break
        tail.insert(0, rest[i])
    if len(tail) == len(rest):
        return ".".join(head + tail)
    return ".".join(head) + ".…" + ".".join(tail)


def short_name(name: str, width: int) -> str:
    """`name` in at most `width` characters, keeping its distinguishing parts (see the module docstring)."""
    if len(name) <= width:
        return name
    parts = _components(name)
    idx = next((i for i, c in enumerate(parts) if _is_index(c)), None)
    # 1. drop what comes before the layer list's name (`model.`, `language_model.model.`)
    if idx is not None and idx >= 2:
        parts = parts[idx - 1:]
        idx = 1
    elif idx is None and len(parts) > 2 and parts[0] in ("model", "language_model", "transformer"):
        parts = parts[1:]
    text = ".".join(parts)
    if len(text) <= width:
        return text
    # 2. drop a trailing `.weight`
    if len(parts) >= 2 and parts[-1] == "weight":
        parts = parts[:-1]
        text = ".".join(parts)
        if len(text) <= width:
            return text
    # 3. elide the middle: keep the head (up to the layer number) and as many trailing components as fit
    head = parts[: (idx + 1) if idx is not None else 1]
    text = _elide(head, parts[len(head):], width)
    # 4. a folded layer set too long to leave room for the module: keep its first member (`{0,…}`)
    if len(text) > width and head[-1].startswith("{") and "," in head[-1]:
        text = _elide(head[:-1] + ["{" + head[-1][1:].split(",")[0] + ",…}"], parts[len(head):], width)
    # 5. still too long: cut the end
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"
