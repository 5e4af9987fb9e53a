"""The package is lint- and type-clean: ruff (pycodestyle, pyflakes, import order, bugbear) and mypy, with the
settings in pyproject.toml. Both come with the test extras, so CI runs them on every submission."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_is_clean():
    r = _run("ruff", "check", "lazyweights", "--output-format", "concise")
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]


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
