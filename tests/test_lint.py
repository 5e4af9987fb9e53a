"""The package and its tests are lint-clean (ruff: pycodestyle, pyflakes, import order, bugbear) and the package is
type-clean (mypy, unannotated functions included), with the settings in pyproject.toml. Both tools come with the
test extras, so CI runs them on every submission."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _config() -> dict:
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_is_clean():
    r = _run("ruff", "check", "lazyweights", "tests", "--output-format", "concise")
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]


def test_ruff_ignores_long_lines_only_in_named_tables():
    # E501 is waived per file, for data tables only (pyproject.toml says which); nothing else is waived per file.
    ignores = _config()["tool"]["ruff"]["lint"].get("per-file-ignores", {})
    assert all(rules == ["E501"] and path.startswith("tests/") for path, rules in ignores.items()), ignores
    assert "tests/**" not in ignores and "tests/*" not in ignores, ignores


def test_mypy_checks_unannotated_functions():
    # Without it mypy skips the body of every function that has no annotations (issue 38 found five real errors
    # there: None // int, a class attribute typed None, an Optional passed where an array is needed, ...).
    assert _config()["tool"]["mypy"].get("check_untyped_defs") is True


def test_mypy_is_clean():
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    r = _run("mypy")
    assert r.returncode == 0 and "Success" in r.stdout, r.stdout[-5000:] + r.stderr[-2000:]


def test_the_package_is_marked_typed():
    assert (REPO / "lazyweights" / "py.typed").exists()
    assert 'lazyweights = ["py.typed"]' in (REPO / "pyproject.toml").read_text()


def test_ruff_catches_what_it_is_configured_to(tmp_path):
    # The checks can fail: an unused import and an unsorted import block under the same settings.
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed")
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\nx = 1\n")
    r = _run("ruff", "check", "--config", str(REPO / "pyproject.toml"), str(bad), "--output-format", "concise")
    assert r.returncode != 0 and "F401" in r.stdout and "I001" in r.stdout, r.stdout
