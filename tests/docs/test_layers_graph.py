"""docs/architecture.md's layers picture is what docs/tools/layers_graph.py draws from the code now, and what it
draws agrees with an independent reading of the imports (a regular-expression scan of the source, not the AST walk
the tool shares with tests/test_architecture.py)."""
from __future__ import annotations

import importlib.util
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("_layers_graph", ROOT / "docs" / "tools" / "layers_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_picture_is_fresh(tool):
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert tool.updated(page) == page, "docs/architecture.md's layers picture is stale: " \
                                       "run python docs/tools/layers_graph.py"
    assert tool.main(["--check"]) == 0


def test_the_check_fails_on_a_stale_picture(tool):
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    stale = page.replace("n_formats -->|", "n_formats -->|1", 1)
    assert stale != page and tool.updated(stale) == page


def _edges_of(text: str) -> dict[tuple[str, str], int]:
    return {(a, b): int(n) for a, n, b in re.findall(r"^\s+n_(\w+) -->\|(\d+)\| n_(\w+)$", text, re.M)}


def _code_only(text: str) -> str:
    """`text` with every string literal (docstrings and their example code included) blanked to spaces."""
    lines = text.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type != tokenize.STRING:
            continue
        (r0, c0), (r1, c1) = tok.start, tok.end
        for r in range(r0, r1 + 1):
            line = lines[r - 1]
            a = c0 if r == r0 else 0
            b = c1 if r == r1 else len(line.rstrip("\n"))
            lines[r - 1] = line[:a] + " " * (b - a) + line[b:]
    return "".join(lines)


def _scanned_folder_pairs(upper: set[str]) -> set[tuple[str, str]]:
    """(from folder, to folder) for every `from ..x`/`from lazyweights.x`/`import lazyweights.x` in the package,
    found by a regular expression over the source text (relative imports resolved by counting dots). A module in
    `upper` (dotted names below the package, the architecture test's `MODULE_LAYERS`: `adapters.builtin`, and
    `adapters` for its `__init__`) counts as its folder's `_upper` node, importer or imported."""
    pkg = ROOT / "lazyweights"
    pairs = set()

    def node(parts: list[str]) -> str:
        if parts and (".".join(parts[:2]) in upper or (len(parts) == 1 and parts[0] in upper)):
            return parts[0] + "_upper"
        return parts[0] if parts else ""
    pattern = re.compile(r"^\s*(?:from\s+(\.+|lazyweights\.?)([\w.]*)\s+import\s+([\w, ()]+)"
                         r"|import\s+lazyweights\.(\w+))", re.M)
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg).with_suffix("").parts
        folder = node([p for p in rel if p != "__init__"]) if len(rel) > 1 else "package_root"
        depth = len(rel) - 1  # folders between the package root and the file
        for dots, mod, names, plain in pattern.findall(_code_only(path.read_text(encoding="utf-8"))):
            first = names.strip("() ").split(",")[0].strip()
            if plain:
                target = plain
            elif dots.startswith("lazyweights"):
                target = node(mod.split(".") + [first] if mod else [first])
            else:
                up = len(dots) - 1  # `.` is the file's own folder
                if up > depth:
                    continue
                here = list(rel[:-1])[: depth - up]
                target = node(here + (mod.split(".") + [first] if mod else [first]))
            target = "package_root" if target in ("__init__", "__main__", "") else target
            if not (pkg / target.removesuffix("_upper")).is_dir() and target != "package_root":
                target = "package_root"  # `from lazyweights import X`: a name of the package root
            if target != folder:
                pairs.add((folder, target))
    return pairs


def test_the_edges_are_the_imports_a_text_scan_finds(tool):
    drawn = _edges_of(tool.mermaid(*tool.folder_edges()))
    assert drawn and all(n > 0 for n in drawn.values())
    upper = {m.removeprefix("lazyweights.") for m in tool._architecture_test().MODULE_LAYERS}
    assert set(drawn) == _scanned_folder_pairs(upper)


def test_every_drawn_edge_goes_down(tool):
    edges, layers = tool.folder_edges()
    up = [(a, b) for a, b in edges if layers[b] > layers[a]]
    assert not up, up
    assert layers["formats"] < layers["compiler"] < layers["run"], "formats/ sits below compiler/ and run/"
