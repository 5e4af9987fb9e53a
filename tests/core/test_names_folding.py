"""Name folding (lazyweights.core.names): every pattern expands back to exactly the names it was given.

The reference is an independent brace expander written here (shell-style `{a,b}` and `{0..3}` with zero padding),
so a fold that drops a name, invents one (a box over a ragged set), or loses padding fails."""
from __future__ import annotations

import itertools
import random
import re

from lazyweights.core.names import fold_names, format_index_set, name_pattern

_BRACE = re.compile(r"\{([^{}]*)\}")


def _expand(pattern: str) -> set[str]:
    m = _BRACE.search(pattern)
    if m is None:
        return {pattern}
    alts: list[str] = []
    for item in m.group(1).split(","):
        if ".." in item and all(p.isdigit() for p in item.split("..")):
            a, b = item.split("..")
            alts.extend(str(i).zfill(len(a) if a.startswith("0") else 0) for i in range(int(a), int(b) + 1))
        else:
            alts.append(item)
    return set().union(*(_expand(pattern[:m.start()] + alt + pattern[m.end():]) for alt in alts))


def test_fold_names_round_trips_random_sets():
    rng = random.Random(25)
    for _ in range(200):
        names = {f"model.layers.{i}.mlp.experts.{j}.{p}.weight"
                 for i, j, p in itertools.product(range(4), range(6), ("gate_proj", "up_proj"))
                 if rng.random() < 0.6}
        names |= {f"model-{k:05d}-of-00009.safetensors" for k in range(1, 10) if rng.random() < 0.5}
        if not names:
            continue
        patterns = fold_names(sorted(names))
        expanded = [_expand(p) for p in patterns]
        assert set().union(*expanded) == names, patterns
        assert sum(len(e) for e in expanded) == len(names), patterns  # patterns do not overlap
        assert len(patterns) < len(names) or len(names) == 1


def test_known_patterns():
    assert fold_names([f"layers.{i}.experts.{j}.w1" for i in range(4) for j in range(8)]) == \
        ["layers.{0..3}.experts.{0..7}.w1"]
    assert fold_names([f"shard-{k:05d}.bin" for k in (1, 2, 3, 7)]) == ["shard-{00001..00003,00007}.bin"]
    assert format_index_set(["1", "01"]) == "{01,1}"           # two spellings stay two values
    assert name_pattern(["only.one"]) == "only.one" and name_pattern([]) == ""
    assert name_pattern(["a.0.w", "a.0.w", "a.1.w"]) == "a.{0,1}.w"   # duplicates count once
