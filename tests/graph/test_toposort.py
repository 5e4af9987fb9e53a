"""`toposort`: every node reachable from the roots once, dependencies first, first input first.

`toposort` walks chains without a stack and recurses at nodes with several inputs, handing very deep
nestings to an explicit stack (benchmarks/bench_scale.py: a DeepSeek-V3-sized plan's steps walk half a
million nodes). Its order is held equal to a plain recursive depth-first post-order written here (first
input first, equal nodes once) over random graphs with shared and equal-but-distinct parts, and its
properties over sums 10,000 terms deep on either side. Nodes stay immutable however they are built.
"""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from lazyweights import DType
from lazyweights.graph import ops
from lazyweights.graph.elementwise import binary, unary
from lazyweights.graph.node import Node, toposort
from lazyweights.graph.opcodes import Op


def reference_order(roots) -> list:
    """Depth-first post-order, first input first, each node (by equality) once: the specification."""
    order, seen = [], set()

    def visit(node):
        if node in seen:
            return
        seen.add(node)
        for s in node.srcs:
            visit(s)
        order.append(node)

    for root in roots:
        visit(root)
    return order


def random_graph(rng: random.Random, n_leaves: int, n_ops: int) -> list[Node]:
    """Nodes over float32 [4, 6] constants: casts, unary ops, binaries, concats, takes and reshapes, each
    over nodes picked from those built so far (so parts are shared), some built twice (equal, not the same)."""
    leaves = [ops.const(np.full((4, 6), i, np.float32)) for i in range(n_leaves)]
    pool = list(leaves)
    for _ in range(n_ops):
        kind = rng.choice(["cast", "unary", "binary", "binary", "concat", "take", "reshape", "again"])
        a, b = rng.choice(pool), rng.choice(pool)
        if kind == "cast":
            node = ops.cast(ops.cast(a, DType.float16), DType.float32)
        elif kind == "unary":
            node = unary("neg", a)
        elif kind == "binary":
            node = binary(rng.choice(["mul", "add"]), a, b)
        elif kind == "concat":
            node = ops.take(ops.concat([a, b, rng.choice(pool)], axis=0), np.arange(4) + rng.randrange(8), 0)
        elif kind == "take":
            node = ops.take(a, np.array([3, 1, 2, 0]), 0)
        elif kind == "reshape":
            node = ops.reshape(ops.reshape(a, (24,)), (4, 6))
        else:  # the same op over the same inputs, built again: an equal node, another object
            node = binary("add", a, b)
            twin = binary("add", a, b)
            assert node == twin and node is not twin
            pool.append(twin)
        pool.append(node)
    return pool


@pytest.mark.parametrize("seed", range(40))
def test_order_equals_recursive_post_order(seed):
    rng = random.Random(seed)
    pool = random_graph(rng, rng.randrange(1, 5), rng.randrange(1, 40))
    roots = rng.sample(pool, rng.randrange(1, min(6, len(pool)) + 1))
    got = toposort(roots)
    assert got == reference_order(roots)
    assert [id(n) for n in got] == [id(n) for n in reference_order(roots)]  # the same objects, not just equal
    assert len(set(got)) == len(got)


def _check_order(order, roots):
    position = {}
    for i, node in enumerate(order):
        assert node not in position, "a node listed twice"
        position[node] = i
    for node in order:
        for s in node.srcs:
            assert position[s] < position[node], "an input listed after its user"
    reachable, todo = set(), list(roots)
    while todo:
        node = todo.pop()
        if node not in reachable:
            reachable.add(node)
            todo.extend(node.srcs)
    assert set(order) == reachable


@pytest.mark.parametrize("side", ["left", "right"])
def test_deep_sum(side):
    terms = [ops.const(np.full((2,), i, np.float32)) for i in range(10_000)]
    total = terms[0]
    for t in terms[1:]:
        total = binary("add", total, t) if side == "left" else binary("add", t, total)
    order = toposort([total])
    assert len(order) == 2 * len(terms) - 1
    assert order[-1] is total
    _check_order(order, [total])
    if side == "left":  # the first input first: the leaves in the order they were added
        leaves = [n for n in order if n.op is Op.CONST]
        assert [int(n.arg.array[0]) for n in leaves] == list(range(10_000))


def test_deep_chain_and_a_shared_root():
    x = ops.const(np.zeros((3,), np.float32))
    node = x
    for _ in range(20_000):
        node = unary("neg", node)
    order = toposort([node, node, x])
    assert len(order) == 20_001 and order[0] is x and order[-1] is node
    _check_order(order, [node])


def test_node_is_immutable():
    x = ops.const(np.zeros((2, 3), np.float32))
    y = ops.cast(x, DType.float16)
    assert type(y) is Node and isinstance(y, Node)
    for field in ("op", "srcs", "arg", "dtype", "shape", "_hash"):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(y, field, None)
    with pytest.raises(AttributeError):
        y.other = 1
    assert (y.op, y.srcs, y.arg, y.dtype, y.shape) == (Op.CAST, (x,), DType.float16, DType.float16, (2, 3))
    z = Node("cast", [x], DType.float16, DType.float16, [2, 3])  # coerced like any other call
    assert z == y and hash(z) == hash(y) and z.op is Op.CAST and z.shape == (2, 3)
    source = ops.reshape(ops.take(ops.const(np.zeros((4,), np.float32)), np.arange(4) // 2, 0), (2, 2))
    back = pickle.loads(pickle.dumps(source.srcs[0].arg))  # a node's argument pickles
    assert back == source.srcs[0].arg
