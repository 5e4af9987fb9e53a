"""Every code example in README.md and docs/ runs as written.

Each page's fenced blocks run in order in one namespace, in a fresh folder holding the small checkpoints the
page's code names (`conftest.Checkpoints`): ```python blocks with `exec`, ```bash blocks line by line in a
shell (the `lazyweights` command of this environment first on PATH). ```console and ```text blocks are shown,
not run: commands on checkpoints the tests cannot make cheaply (a 2 GB checkpoint, a URL, Graphviz), and
program output.

A block preceded by `<!-- docs-test: skip (REASON) -->` is not run; REASON must say what is absent. The pages
use it only for blocks that need MAX (an 800 MB wheel and a MAX pipeline), a CUDA GPU, a remote server
(an HTTP server with Range support and an S3 endpoint), or a multimodal checkpoint; tests/io/,
tests/run/test_gpu.py and tests/adapters/test_mmproj.py run those calls against nginx, moto, a fake device and
tiny vision-language models. `test_block_counts` prints how many blocks run and how many are
skipped, with the reasons, and fails if a skip has no reason.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
RUN = {"python", "bash"}
SHOWN = {"console", "text", "mermaid", ""}  # mermaid: a drawing (docs/architecture.md's layers)
_FENCE = re.compile(r"^(?P<skip><!-- docs-test: skip(?P<reason>[^\n]*?)-->\n)?"
                    r"```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)^```$", re.M | re.S)


def blocks(page: Path) -> list[tuple[str, str, str | None, int]]:
    """(language, code, skip reason or None, line) of each fenced block of `page`, in order."""
    text = page.read_text()
    out = []
    for m in _FENCE.finditer(text):
        reason = None
        if m.group("skip"):
            reason = m.group("reason").strip().strip("()").strip()
        out.append((m.group("lang"), m.group("body"), reason, text.count("\n", 0, m.start("lang")) + 1))
    return out


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_block_counts():
    run = skipped = shown = 0
    reasons = []
    for page in PAGES:
        for lang, _, reason, line in blocks(page):
            assert lang in RUN | SHOWN, f"{_page_id(page)}:{line}: unknown code block language {lang!r}"
            if reason is not None:
                assert reason, f"{_page_id(page)}:{line}: a skipped block must say why"
                skipped += 1
                reasons.append(f"{_page_id(page)}:{line}: {reason}")
            elif lang in RUN:
                run += 1
            else:
                shown += 1
    print(f"\ncode blocks: {run} run, {skipped} skipped, {shown} shown (console/text)")
    print("\n".join("  skipped " + r for r in reasons))
    assert run >= 25, f"only {run} code blocks run"
    assert skipped <= 5, reasons


@pytest.mark.parametrize("page", [p for p in PAGES
                                  if any(lang in RUN and reason is None for lang, _, reason, _ in blocks(p))],
                         ids=_page_id)
def test_page_examples_run(page, docs_checkpoints, tmp_path, monkeypatch, capsys):
    todo = [(lang, code, line) for lang, code, reason, line in blocks(page) if lang in RUN and reason is None]
    docs_checkpoints.link("\n".join(code for _, code, _ in todo), tmp_path)
    monkeypatch.chdir(tmp_path)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    namespace: dict = {"__name__": "__docs__"}
    for lang, code, line in todo:
        where = f"{_page_id(page)}:{line}"
        if lang == "python":
            try:
                exec(compile(code, where, "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"the block at {where} failed: {type(e).__name__}: {e}") from e
        else:
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, f"the block at {where} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    with capsys.disabled():
        print(f"\n{_page_id(page)}: {len(todo)} code blocks run")
