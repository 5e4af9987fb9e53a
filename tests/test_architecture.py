"""The package's shape, checked: imports go one way through the layers, and no module takes another's private names.

The layers, lowest first (docs/architecture.md says what each holds). A module may import from its own layer
and the layers below it, never above, and that holds for function-local imports too: a local import is still
a dependency, only a later one. Within a layer, modules must not import each other in a cycle.
"""
from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "lazyweights"

# Layer of each top-level part of the package; equal numbers are one layer.
LAYERS = {
    "core": 0,
    "io": 1,
    "kernels": 1, "quant": 1,
    "graph": 2,
    "formats": 3,
    "compiler": 4,
    "run": 5,
    "render": 6,
    "lazy": 7,
    "interop": 8,
    "adapters": 9,
    "convert": 10,
    "tools": 11,
    "__init__": 12, "__main__": 12,
}
# Modules above their folder's layer. adapters/ holds the records and name tables the conversion engines
# (convert/) read, below them, and the registry of ready-made adapters with the package's public names, which
# name the engines, above them.
MODULE_LAYERS = {
    "lazyweights.adapters": 11,  # re-exports convert's adapters, lazily (see test_no_import_cycles)
    "lazyweights.adapters.builtin": 11, "lazyweights.adapters.registry": 11, "lazyweights.adapters.loader": 11,
}


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


MODULES = _modules()


def _resolve(node: ast.ImportFrom, module: str, path: pathlib.Path) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> list[tuple[str, int, list[str]]]:
    """(imported module, line, names) for every import of a lazyweights module, at any depth of the file."""
    path = MODULES[module]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, path)
            if target.split(".")[0] != "lazyweights":
                continue
            names = [a.name for a in node.names]
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            found += [(s, node.lineno, []) for s in subs]
            attrs = [n for n in names if f"{target}.{n}" not in MODULES]
            if attrs or not subs:
                found.append((target, node.lineno, attrs))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno, []) for a in node.names if a.name.split(".")[0] == "lazyweights"]
    return found


def layer_of(module: str) -> int:
    if module in MODULE_LAYERS:
        return MODULE_LAYERS[module]
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    assert top in LAYERS, f"{module}: add its folder to LAYERS in tests/test_architecture.py (and the docs)"
    return LAYERS[top]


def test_every_part_of_the_package_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_imports_go_down_the_layers():
    bad = []
    for module in MODULES:
        for target, line, _ in imports_of(module):
            if target == "lazyweights":
                target = "lazyweights.__init__"
            if layer_of(target) > layer_of(module):
                bad.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not bad, "imports against the layer direction:\n" + "\n".join(bad)


def lazy_reexport_lines(module: str) -> set[int]:
    """Lines of the imports in a package `__init__`'s module-level `__getattr__` (PEP 562): they run when a name
    is first asked for, after the package has been imported, never while importing one of its modules."""
    path = MODULES[module]
    if path.name != "__init__.py":
        return set()
    return {node.lineno for fn in ast.parse(path.read_text()).body
            if isinstance(fn, ast.FunctionDef) and fn.name == "__getattr__"
            for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}


def test_no_import_cycles():
    graph = defaultdict(set)
    for module in MODULES:
        lazy = lazy_reexport_lines(module)
        for target, line, _ in imports_of(module):
            if line in lazy:
                continue
            # importing a submodule runs its package's __init__ first
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in MODULES and prefix != module and not module.startswith(prefix + "."):
                    graph[module].add(prefix)
    import networkx as nx

    cycles = list(nx.simple_cycles(nx.DiGraph([(a, b) for a, bs in graph.items() for b in bs])))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c + [c[0]]) for c in sorted(cycles, key=len)[:20])


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _extension_module(package: str, name: str) -> bool:
    """A compiled module of the package (`kernels._ccasts`): private to its folder, which imports it."""
    folder = PACKAGE.parent / package.replace(".", "/")
    return folder.is_dir() and any(folder.glob(name + ".c"))


def test_no_private_names_across_modules():
    bad = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = {}
        for target, line, names in imports_of(module):
            bad += [f"{path.relative_to(PACKAGE.parent)}:{line} takes {target}.{n}" for n in names
                    if _private(n) and not _extension_module(target, n)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _resolve(node, module, path).startswith("lazyweights"):
                target = _resolve(node, module, path)
                for a in node.names:
                    if f"{target}.{a.name}" in MODULES:
                        aliases[a.asname or a.name] = f"{target}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("lazyweights") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and _private(node.attr)):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                           f"takes {aliases[node.value.id]}.{node.attr}")
    assert not bad, "private names taken across modules:\n" + "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("module", ["lazyweights.kernels._ccasts", "lazyweights.kernels._cquant"])
def test_private_modules_are_not_imported_from_outside_their_folder(module):
    folder = module.rsplit(".", 1)[0]
    users = [m for m in MODULES if not m.startswith(folder) for t, _, _ in imports_of(m) if t == module]
    assert not users, f"{module} imported from {users}"
