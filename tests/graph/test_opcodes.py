"""Every op has every rule: each layer's per-op table (graph/opcodes.py lists them) covers every `Op`."""
import importlib

import numpy as np
import pytest

from lazyweights.graph import ops
from lazyweights.graph.opcodes import GroupOp, Op, OpTable

# The modules that keep a per-op table; importing them registers their rules.
TABLE_MODULES = ["lazyweights.graph.layout", "lazyweights.graph.gather", "lazyweights.graph.rewrites",
                 "lazyweights.compiler.steps", "lazyweights.compiler.gpu", "lazyweights.run.blocks",
                 "lazyweights.run.reference", "lazyweights.render.explain"]
EXPECTED = {"strided view", "row alignment", "row gather", "rebuild", "whole input", "GPU split", "CPU pull",
            "reference implementation", "explain text"}


def _tables():
    for m in TABLE_MODULES:
        importlib.import_module(m)
    return {t.rule: t for t in OpTable.tables if t.rule in EXPECTED}


def test_every_rule_table_exists():
    assert set(_tables()) == EXPECTED


@pytest.mark.parametrize("rule", sorted(EXPECTED))
def test_every_op_has_every_rule(rule):
    table = _tables()[rule]
    assert not table.missing(), f"{rule}: no rule for {sorted(table.missing())}"
    assert not (set(table) - set(Op)), "rules registered for names that are not ops"


def test_ops_compare_and_print_as_their_names():
    x = ops.const(np.zeros((2, 3), np.float32))
    y = ops.permute(ops.cast(x, "float16"), (1, 0))
    assert y.op is Op.PERMUTE and y.op == "permute" and f"{y.op}" == "permute"
    assert {"permute": 1}[y.op] == 1
    assert Op.CAST in GroupOp.Value and Op.TAKE in GroupOp.Layout and Op.SOURCE in GroupOp.Leaf


def test_registering_an_op_twice_is_an_error():
    table = OpTable("scratch")
    table.register(Op.CAST)(lambda n: None)
    with pytest.raises(ValueError, match="registered twice"):
        table.register(Op.CAST)(lambda n: None)
    OpTable.tables.remove(table)
