"""The manual's generated tables (docs/hooks/generated_tables.py) list every architecture record, every error
class and every exported name, and render each record's facts from the record itself."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import lazyweights
from lazyweights.adapters.archs import ALIASES, ARCHS
from lazyweights.core import errors

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "generated_tables.py"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("generated_tables", HOOK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(table: str) -> dict[str, list[str]]:
    rows = {}
    for line in table.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_architecture_table_lists_every_record(hook):
    table = hook.architecture_table()
    rows = _rows(table)
    assert sorted(rows) == sorted(ARCHS)
    for mt, arch in ARCHS.items():
        assert rows[mt][2] == f"`{arch.hf_class}`" and rows[mt][3] == f"`{arch.gguf}`", mt
    for outer, inner in ALIASES.items():
        assert f"`{outer}`" in rows[inner][1], (outer, inner)
    assert f"{len(ARCHS)} records" in table and f"{len({a.gguf for a in ARCHS.values()})} llama.cpp" in table
    assert "q/k RoPE permutation" in rows["llama"][4] and "norms stored +1" in rows["gemma"][4]


def test_errors_table_lists_every_class_with_its_docstring(hook):
    rows = _rows(hook.errors_table())
    defined = [n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, BaseException)
               and c.__module__ == errors.__name__]
    assert sorted(rows) == sorted(defined)
    assert "`KeyError`" in rows["MissingWeightError"][1]
    assert rows["FormatError"][2].startswith("A checkpoint file is malformed")


def test_api_reference_names_every_export(hook):
    page = hook.api_reference()
    for name in lazyweights.__all__:
        assert f"::: lazyweights.{name}\n" in page, name


def test_markers_are_replaced_and_unknown_ones_fail(hook):
    out = hook.render("before\n<!-- generated: errors -->\nafter")
    assert "| `LazyWeightsError` |" in out and "generated:" not in out
    with pytest.raises(KeyError):
        hook.render("<!-- generated: nothing -->")
