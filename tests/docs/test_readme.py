"""README.md is a front door: the two commands first, short, every link into the repository resolves, and no
internal shorthand a newcomer cannot know."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _prose_lines() -> list[str]:
    out, in_code = [], False
    for line in README.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            out.append(line)
    return out


def test_the_two_commands_come_first():
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```$", README, re.M | re.S)
    assert blocks[0].strip() == "pip install . && lazyweights demo"
    assert blocks[1].strip() == "bash .ci/run"
    assert README.index("pip install . && lazyweights demo") < README.index("\n## ")


def test_short_with_short_lines():
    assert len(README.splitlines()) <= 200
    long = [line for line in _prose_lines() if len(line) > 120]
    assert long == [], long


def test_links_resolve_and_features_point_into_the_docs():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert [link for link in local if not (ROOT / link).exists()] == []
    features = README[README.index("## Features"):README.index("## Performance")]
    items = [i for i in features.split("\n- ")[1:]]
    assert items and all("](docs/" in item for item in items), items


def test_no_internal_shorthand():
    for word in ("the seed", "W1", "8x target", "this stop"):
        assert word not in README, word
