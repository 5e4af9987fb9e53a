"""Dotted weight names: splitting out layer numbers, and did-you-mean suggestions that respect them.

One implementation serves every "did you mean" lazyweights prints: a missing weight in `Weights.data()`,
the bring-up report, `load_state_dict`'s error. A layer index is never "close" to another index
(`layers.1.w` is not offered `layers.11.w`), and a missing or extra prefix (the usual `model.` mistake) is
the best suggestion of all.

Example:
    >>> from lazyweights.core.names import suggest, split_numbers
    >>> suggest("layers.1.mlp.wieght", ["layers.1.mlp.weight", "layers.11.mlp.weight"])
    ['layers.1.mlp.weight']
    >>> split_numbers("layers.3.experts.7.w")
    (('layers', None, 'experts', None, 'w'), (3, 7))
"""
from __future__ import annotations

import difflib
import re
from typing import Sequence

_NUM = re.compile(r"^\d+$")


def split_numbers(name: str) -> tuple[tuple[str | None, ...], tuple[int, ...]]:
    """(the name with numeric parts as None, the numbers): (("layers", None, "w"), (3,)) for layers.3.w."""
    parts = name.split(".")
    template = tuple(None if _NUM.match(p) else p for p in parts)
    nums = tuple(int(p) for p in parts if _NUM.match(p))
    return template, nums


def _candidates(name: str, candidates: Sequence[str], by_nums: dict) -> list[tuple[float, str]]:
    """(score, candidate) pairs worth suggesting for `name`: a prefix/suffix fix scores 2 (the usual
    'model.' mistake); otherwise difflib's ratio among candidates with the same layer numbers."""
    fix = [c for c in candidates if c.endswith("." + name) or name.endswith("." + c)]
    if fix:
        return [(2.0 - len(c) * 1e-6, c) for c in fix]
    same = by_nums.get(split_numbers(name)[1], [])
    close = difflib.get_close_matches(name, same, n=3, cutoff=0.6)
    return [(difflib.SequenceMatcher(None, name, c).ratio(), c) for c in close]


def suggest_all(names: Sequence[str], candidates: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """A did-you-mean for each of `names` among `candidates`, paired one to one (best pairs first), so
    one typo'd key is not offered for every missing weight near it; layers.1.x never suggests layers.11.x."""
    if not candidates:
        return {}
    by_nums: dict[tuple, list[str]] = {}
    for c in candidates:
        by_nums.setdefault(split_numbers(c)[1], []).append(c)
    pairs = []
    for i, name in enumerate(names):
        for score, c in _candidates(name, candidates, by_nums):
            pairs.append((-score, i, name, c))
    pairs.sort()
    out: dict[str, tuple[str, ...]] = {}
    taken: set[str] = set()
    for _, _, name, c in pairs:
        if name in out or c in taken:
            continue
        out[name] = (c,)
        taken.add(c)
    return out


def suggest(name: str, candidates: Sequence[str], n: int = 3) -> list[str]:
    """Close candidates for one name, best first."""
    by_nums: dict[tuple, list[str]] = {}
    for c in candidates:
        by_nums.setdefault(split_numbers(c)[1], []).append(c)
    return [c for _, c in sorted(_candidates(name, candidates, by_nums), reverse=True)][:n]
