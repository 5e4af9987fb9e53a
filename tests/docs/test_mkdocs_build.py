"""The manual builds with `mkdocs build --strict` (every nav entry and link resolves, every API docstring
renders, the generated tables render), into a temporary folder."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install 'lazyweights[docs]'")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site"
    errors = (site / "errors" / "index.html").read_text()
    assert "<td><code>FormatError</code></td>" in errors        # the generated table, rendered
    api = (site / "api" / "index.html").read_text()
    assert 'id="lazyweights.load_weights"' in api and 'id="lazyweights.Plan"' in api
