"""Every error lazyweights raises has a type: a named class in `core/errors.py` that also derives from the
builtin a caller would catch. Checked on the source (no bare root raised, no error class elsewhere), on the
README (every class is in its errors table) and on calls (a usage error is a ValueError, a wrong type a
TypeError)."""
from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import numpy as np
import pytest

import lazyweights as lw
from lazyweights.core import errors

PACKAGE = Path(lw.__file__).parent
README = PACKAGE.parent / "README.md"
BUILTIN_EXCEPTIONS = {c for c in vars(builtins).values() if isinstance(c, type) and issubclass(c, BaseException)}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_nothing_raises_the_bare_root():
    bare = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id == "LazyWeightsError":
                    bare.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert bare == [], "raise a named class from core/errors.py instead: " + ", ".join(bare)


def test_every_error_class_lives_in_core_errors():
    elsewhere = []
    names = set(errors.__all__)
    for path, tree in _sources():
        if path.name == "errors.py" and path.parent.name == "core":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & names or any(b.endswith("Error") for b in bases):
                    elsewhere.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert elsewhere == []


def test_every_class_also_derives_from_a_builtin():
    for name in errors.__all__:
        cls = getattr(errors, name)
        if not inspect.isclass(cls) or cls is errors.LazyWeightsError:
            continue
        assert issubclass(cls, errors.LazyWeightsError), name
        builtin = [b for b in cls.__mro__ if b in BUILTIN_EXCEPTIONS and b not in (Exception, BaseException)]
        assert builtin, f"{name} derives from no builtin a caller would catch"
        assert getattr(lw, name) is cls, f"lazyweights.{name} is not exported"


def test_the_readme_table_lists_every_class():
    text = README.read_text()
    table = text[text.index("## Errors"):]
    table = table[:table.index("\n## ", 5)]
    missing = [n for n in errors.__all__ if inspect.isclass(getattr(errors, n)) and f"`{n}`" not in table]
    assert missing == [], f"README's errors table lacks {missing}"


@pytest.mark.parametrize("call,builtin,cls", [
    (lambda: lw.load_weights([]), ValueError, errors.UsageError),
    (lambda: lw.plan([np.zeros(2)]), TypeError, errors.ArgumentTypeError),
    (lambda: lw.plan({1: np.zeros(2)}), TypeError, errors.ArgumentTypeError),
    (lambda: lw.plan({"w": np.zeros(2, np.float32)}).materialize(scheduler="fast"), ValueError, errors.UsageError),
    (lambda: lw.DeviceRef.parse("tpu"), ValueError, errors.UsageError),
], ids=["no-paths", "plan-of-a-list", "non-string-key", "unknown-scheduler", "unknown-device"])
def test_callers_catch_errors_as_builtins(call, builtin, cls):
    with pytest.raises(builtin) as info:
        call()
    assert type(info.value) is cls
