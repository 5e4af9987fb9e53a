"""The reference executor: evaluates nodes one op at a time with numpy, on one thread.

It is the specification every other executor is tested against, so each rule is the plainest numpy that
does the job. `REFERENCE[op](node, *inputs)` computes one node from its inputs' arrays; a source is a
zero-copy view of its memory map, and layout ops stay views where numpy allows.

Example:
    >>> import numpy as np
    >>> from lazyweights.graph import ops
    >>> from lazyweights.run.reference import evaluate
    >>> x = ops.const(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> evaluate([ops.cast(ops.permute(x, (1, 0)), "float16")])[0].tolist()
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ..compiler.steps import outputs_of
from ..core.errors import ExecutionError, LazyWeightsError
from ..graph.node import Node, toposort
from ..graph.opcodes import Op, OpTable

# The specification of each op: its whole value from its inputs' whole values, in numpy/ml_dtypes.
REFERENCE = OpTable("reference implementation")



@REFERENCE.register(Op.SOURCE)
def _source(node: Node) -> np.ndarray:
    return node.arg.array()


@REFERENCE.register(Op.CONST)
def _const(node: Node) -> np.ndarray:
    return node.arg.array


@REFERENCE.register(Op.CAST)
def _cast(node: Node, x: np.ndarray) -> np.ndarray:
    return _astype(x, node.dtype.to_numpy())


def _astype(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    from ..kernels.casts import cast  # bit-identical to numpy/ml_dtypes astype, and fast

    return cast(x, dtype)


@REFERENCE.register(Op.BITCAST)
def _bitcast(node: Node, x: np.ndarray) -> np.ndarray:
    if x.ndim == 0:
        return x.reshape(1).view(node.dtype.to_numpy()).reshape(())
    if x.dtype.itemsize != node.dtype.size_in_bytes and not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)  # numpy can only change the item size over a contiguous last axis
    return x.view(node.dtype.to_numpy())


@REFERENCE.register(Op.RESHAPE)
def _reshape(node: Node, x: np.ndarray) -> np.ndarray:
    return x.reshape(node.shape)


@REFERENCE.register(Op.PERMUTE)
def _permute(node: Node, x: np.ndarray) -> np.ndarray:
    return x.transpose(node.arg)


@REFERENCE.register(Op.SLICE)
def _slice(node: Node, x: np.ndarray) -> np.ndarray:
    return x[tuple(slice(a, b, c) for a, b, c in node.arg)]


@REFERENCE.register(Op.TAKE)
def _take(node: Node, x: np.ndarray) -> np.ndarray:
    axis, idx = node.arg
    return np.take(x, idx.array, axis=axis)


@REFERENCE.register(Op.CONCAT)
def _concat(node: Node, *xs: np.ndarray) -> np.ndarray:
    return np.concatenate(xs, axis=node.arg)


@REFERENCE.register(Op.DEQUANTIZE)
def _dequantize(node: Node, x: np.ndarray) -> np.ndarray:
    from ..quant import dequantize

    encoding, dtype = node.arg
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    values = dequantize(encoding, rows).reshape(node.shape)
    return values if dtype.to_numpy() == values.dtype else _astype(values, dtype.to_numpy())


@REFERENCE.register(Op.QUANTIZE)
def _quantize(node: Node, x: np.ndarray) -> np.ndarray:
    from ..quant import quantize

    enc, importance, _ = node.arg
    if x.dtype != np.float32:
        x = _astype(x, np.dtype(np.float32))
    weights = None if importance is None else importance.array
    if weights is not None and weights.ndim == 2:  # one importance row per expert (axis 0)
        return np.stack([quantize(enc, np.ascontiguousarray(x[e]).reshape(-1, x.shape[-1]), imatrix=weights[e])
                         .reshape(node.shape[1:]) for e in range(x.shape[0])])
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    return quantize(enc, np.ascontiguousarray(rows), imatrix=weights).reshape(node.shape)


@REFERENCE.register(Op.BINARY)
def _binary(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from ..graph.elementwise import numpy_binary

    return numpy_binary(node, a, b)


@REFERENCE.register(Op.UNARY)
def _unary(node: Node, a: np.ndarray) -> np.ndarray:
    from ..graph.elementwise import numpy_unary

    return numpy_unary(node, a)




@REFERENCE.register(Op.SCATTER)
def _scatter(node: Node, values: np.ndarray, mask: np.ndarray, *offsets: np.ndarray) -> np.ndarray:
    from ..graph.scatter import whole

    return whole(node, values, mask, *offsets)


@REFERENCE.register(Op.LORA)
def _lora(node: Node, w: np.ndarray, *factors: np.ndarray) -> np.ndarray:
    from ..graph.lora import lora_rows

    return lora_rows(node, w, [(factors[2 * i], factors[2 * i + 1]) for i in range(len(node.arg))])


def evaluate(roots: Iterable[Node], names: dict[Node, str] | None = None) -> list[np.ndarray]:
    """Compute `roots` (and everything they need), freeing each intermediate after its last use.

    `names` maps nodes to output names for error messages. Errors that are not already a
    LazyWeightsError become an ExecutionError naming the output being computed.
    """
    roots = list(roots)
    order = toposort(roots)
    remaining: dict[Node, int] = {}
    for n in order:
        for s in n.srcs:
            remaining[s] = remaining.get(s, 0) + 1
    for r in roots:
        remaining[r] = remaining.get(r, 0) + 1  # keep roots alive until returned
    values: dict[Node, np.ndarray] = {}
    consumers = _first_output_names(order, roots, names or {})
    for n in order:
        try:
            values[n] = REFERENCE[n.op](n, *(values[s] for s in n.srcs))
        except LazyWeightsError:
            raise
        except Exception as e:  # a bug or resource failure inside a kernel: name the tensor
            who = consumers.get(n, "?")
            raise ExecutionError(f"computing {n.op} for tensor {who!r} failed: {type(e).__name__}: {e}",
                                 tensor=who) from e
        for s in n.srcs:
            remaining[s] -= 1
            if remaining[s] == 0:
                del values[s]
    return [values[r] for r in roots]


def _first_output_names(order: list[Node], roots: list[Node], names: dict[Node, str]) -> dict[Node, str]:
    """For each node, the name of one output that depends on it (for error messages)."""
    owner: dict[Node, str] = {}
    for r in roots:
        stack = [r]
        label = names.get(r, "?")
        while stack:
            n = stack.pop()
            if n in owner:
                continue
            owner[n] = label
            stack.extend(n.srcs)
    return owner


def materialize_reference(plan, out=None) -> dict[str, np.ndarray]:
    """Materialize a whole plan (or name -> node) with `evaluate` (C-contiguous results; `out` arrays are filled)."""
    outputs = outputs_of(plan)
    names = {node: name for name, node in outputs.items()}
    result, by_node = {}, {}
    for (name, node), arr in zip(outputs.items(), evaluate(outputs.values(), names)):
        if out is not None and name in out:
            np.copyto(out[name], arr.reshape(out[name].shape))
            result[name] = out[name]
            continue
        if node not in by_node:  # identical outputs (tied weights) share one array
            by_node[node] = np.ascontiguousarray(arr).reshape(node.shape)  # (ascontiguousarray makes 0-d 1-d)
        result[name] = by_node[node]
    return result
