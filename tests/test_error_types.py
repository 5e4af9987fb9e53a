"""Every error lazyweights raises has a type: a named class in `core/errors.py` that also derives from the
builtin a caller would catch. Checked on the source (no bare root raised, no error class elsewhere), on the
manual (every class is in docs/errors.md's table, which docs/hooks/generated_tables.py generates from this
module) and on calls (a usage error is a ValueError, a wrong type a
TypeError)."""
from __future__ import annotations

import ast
import builtins
import importlib.util
import inspect
from pathlib import Path

import numpy as np
import pytest

import lazyweights as lw
from lazyweights.core import errors

PACKAGE = Path(lw.__file__).parent
HOOK = PACKAGE.parent / "docs" / "hooks" / "generated_tables.py"
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


# Builtins the package may raise as they are, because a Python protocol asks for exactly that type: attribute
# lookup (`__getattr__` must raise AttributeError for hasattr/copy/pickle to work), DLPack export (BufferError),
# an abstract method, an iterator's end, and the "unreachable" assertion after an exhaustive branch.
PROTOCOL_BUILTINS = {"AttributeError", "BufferError", "NotImplementedError", "StopIteration", "AssertionError"}
# Single sites that keep a builtin, each with its reason. Keyed (path relative to the package, builtin name).
BUILTIN_SITES = {
    # argparse `type=` functions: argparse turns their ValueError into "invalid VALUE" usage text. Owned by the
    # CLI's author; a UsageError (a ValueError) would do the same and name the class.
    ("tools/cli.py", "ValueError"): "argparse type= converters",
    # os.pwrite returning 0: raised inside the `try` that turns every OSError into a WriteError naming the file.
    ("io/atomic.py", "OSError"): "converted to WriteError a few lines below",
    # a cache= data file shorter than its log: an I/O fault of a local cache file, read like any OSError.
    ("io/host_cache.py", "OSError"): "a truncated cache data file",
    # gather_cast_into: a row index out of range is an IndexError, as numpy's take raises (documented doctest).
    ("kernels/casts.py", "IndexError"): "numpy's take convention",
    # RowBlocks is a Sequence: an index out of range is an IndexError, as for the list of ranges it stands for.
    ("compiler/row_blocks.py", "IndexError"): "a Sequence's out-of-range index",
}


def _builtin_raises():
    """(path, line, builtin name) of every `raise Builtin(...)` / `raise Builtin` in the package."""
    names = {c.__name__ for c in BUILTIN_EXCEPTIONS}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                func = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(func, ast.Name) and func.id in names:
                    yield str(path.relative_to(PACKAGE)), node.lineno, func.id


def test_nothing_raises_a_bare_builtin():
    """`raise ValueError(...)` / `raise TypeError(...)` (and any other builtin outside the protocols above) is
    a named class from core/errors.py instead: callers can catch lazyweights' errors apart from numpy's or
    Python's, and `except ValueError` still works because each class derives from the builtin."""
    bare = [f"{path}:{line} {name}" for path, line, name in _builtin_raises()
            if name not in PROTOCOL_BUILTINS and (path, name) not in BUILTIN_SITES]
    assert bare == [], "raise a named class from core/errors.py instead: " + ", ".join(bare)


def test_the_builtin_check_can_fail(tmp_path, monkeypatch):
    """The scan sees a bare builtin raise, in either form, and passes a named one."""
    (tmp_path / "bad.py").write_text("def f(x):\n    if x:\n        raise ValueError(f'bad {x}')\n"
                                     "    raise TypeError\n")
    (tmp_path / "good.py").write_text("from lazyweights.core.errors import UsageError\n"
                                      "def g():\n    raise UsageError('named')\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    assert sorted(_builtin_raises()) == [("bad.py", 3, "ValueError"), ("bad.py", 4, "TypeError")]


# Files whose silent handlers are another author's to annotate (being edited as this was written); each is a
# cleanup after a failure that is re-raised, or a fallback to another route. Remove once commented (none now).
SILENT_HANDLERS_PENDING: set[str] = set()


def _does_nothing(statement: ast.stmt) -> bool:
    """`pass`, `continue`, `return` or `return None`: a handler made only of these drops the exception."""
    if isinstance(statement, ast.Return):
        return statement.value is None or (isinstance(statement.value, ast.Constant) and statement.value.value is None)
    return isinstance(statement, (ast.Pass, ast.Continue))


def _silent_handlers():
    """(path, line) of every `except ...:` whose body only passes, continues or returns None, with no comment on
    any of its lines saying why nothing is done (the reason, or a log call instead, is what a reader debugging
    needs)."""
    for path, tree in _sources():
        lines = path.read_text().splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and all(_does_nothing(s) for s in node.body):
                if not any("#" in lines[n - 1] for n in [node.lineno] + [s.lineno for s in node.body]):
                    yield str(path.relative_to(PACKAGE)), node.lineno


def test_no_exception_is_swallowed_silently():
    silent = [f"{path}:{line}" for path, line in _silent_handlers() if path not in SILENT_HANDLERS_PENDING]
    assert silent == [], "log the exception or say in a comment why it is ignored: " + ", ".join(silent)


def test_the_silent_handler_check_can_fail(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("try:\n    x = 1\nexcept OSError:\n    pass\n"
                                   "try:\n    x = 2\nexcept OSError:\n    pass  # gone already\n"
                                   "def f():\n    try:\n        return 1\n    except KeyError:\n        return None\n"
                                   "def g():\n    try:\n        return 1\n    except KeyError:\n        return\n"
                                   "def h():\n    try:\n        return 1\n    except KeyError as e:\n"
                                   "        log.debug('no key: %s', e)\n        return None\n"
                                   "for i in ():\n    try:\n        x = 3\n    except OSError:\n        continue\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    assert list(_silent_handlers()) == [("m.py", 3), ("m.py", 12), ("m.py", 17), ("m.py", 28)]


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


def test_the_manual_table_lists_every_class():
    spec = importlib.util.spec_from_file_location("generated_tables", HOOK)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    table = hook.errors_table()
    missing = [n for n in errors.__all__ if inspect.isclass(getattr(errors, n)) and f"| `{n}` |" not in table]
    assert missing == [], f"docs/errors.md's generated table lacks {missing}"


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
