"""Every public function, class and method of the package has a docstring.

Public: a module with no `_`-prefixed part in its path, and in it a top-level function or class, or a method of
such a class, whose name does not start with `_` (property setters share their getter's docstring). The walk reads
the source with `ast`, so it imports nothing and sees what `help()` would miss.

`MISSING` lists the ones still without a docstring: none since 2026-11-25 (there were 103). It can only shrink:
a new undocumented name fails, and so does an entry that has gained its docstring (remove it from the list).
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lazyweights"

MISSING: set[str] = set()


def _is_setter(node: ast.AST) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter")
               for d in getattr(node, "decorator_list", ()))


def undocumented(source: str, module: str) -> tuple[int, list[str]]:
    """(public definitions, those without a docstring as 'module:Class.name') in one module's source."""
    found: list[str] = []
    count = 0

    def visit(body: list[ast.stmt], prefix: str) -> None:
        nonlocal count
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_") or _is_setter(node):
                continue
            count += 1
            if ast.get_docstring(node) is None:
                found.append(f"{module}:{prefix}{node.name}")
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    return count, found


def package_undocumented() -> tuple[int, list[str]]:
    total, found = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if any(p.startswith("_") and p not in ("__init__", "__main__") for p in parts):
            continue
        module = ".".join(p for p in parts if p != "__init__")
        n, missing = undocumented(path.read_text(encoding="utf-8"), module)
        total += n
        found += missing
    return total, found


def test_public_definitions_have_docstrings():
    total, found = package_undocumented()
    assert total > 500, total  # the walk found the package
    new = sorted(set(found) - MISSING)
    assert not new, "public definitions without a docstring (write one; see ARCHITECTURE.md):\n  " + "\n  ".join(new)


def test_the_allowlist_only_shrinks():
    _, found = package_undocumented()
    stale = sorted(MISSING - set(found))
    assert not stale, "these have a docstring now (or are gone); remove them from MISSING:\n  " + "\n  ".join(stale)


def test_the_walk_catches_what_it_should():
    src = '''
def documented():
    """Yes."""

def bare():
    pass

def _private():
    pass

class Box:
    """A box."""

    def method(self):
        return 1

    @property
    def size(self):
        """Its size."""
        return 1

    @size.setter
    def size(self, v):
        pass

    def __len__(self):
        return 1

class Bare:
    def inner(self):
        """Documented."""
'''
    count, found = undocumented(src, "m")
    assert found == ["m:bare", "m:Box.method", "m:Bare"]
    assert count == 7  # documented, bare, Box, Box.method, Box.size, Bare, Bare.inner
