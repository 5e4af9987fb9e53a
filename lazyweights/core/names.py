"""Dotted weight names: layer blocks (`parse_block`, `parse_layer`), splitting out layer numbers, did-you-mean
suggestions that respect them, and folding many names into a few brace patterns
(`layers.{0..21}.mlp.{up,gate}_proj.weight`).

One implementation serves every "did you mean" lazyweights prints: a missing weight in `Weights.data()`,
the bring-up report, `load_state_dict`'s error. A layer index is never "close" to another index
(`layers.1.w` is not offered `layers.11.w`), and a missing or extra prefix (the usual `model.` mistake) is
the best suggestion of all.

Example:
    >>> from lazyweights.core.names import fold_names, suggest, split_numbers
    >>> suggest("layers.1.mlp.wieght", ["layers.1.mlp.weight", "layers.11.mlp.weight"])
    ['layers.1.mlp.weight']
    >>> split_numbers("layers.3.experts.7.w")
    (('layers', None, 'experts', None, 'w'), (3, 7))
    >>> fold_names([f"layers.{i}.experts.{j}.w" for i in range(4) for j in range(8)])
    ['layers.{0..3}.experts.{0..7}.w']
"""
from __future__ import annotations

import difflib
import re
from math import prod
from typing import Hashable, Iterable, Sequence, TypeVar

_NUM = re.compile(r"^\d+$")


def split_numbers(name: str) -> tuple[tuple[str | None, ...], tuple[int, ...]]:
    """(the name with numeric parts as None, the numbers): (("layers", None, "w"), (3,)) for layers.3.w."""
    parts = name.split(".")
    template = tuple(None if _NUM.match(p) else p for p in parts)
    nums = tuple(int(p) for p in parts if _NUM.match(p))
    return template, nums


# --- layer blocks: llama.cpp's `blk.N.` and transformers' `layers.N.` ---------------------------------------
# The one spelling of each layer prefix; every module that asks "which layer is this tensor in" uses these
# (tests/core/test_names_blocks.py holds them against names gguf-py's TensorNameMap writes).
# `GGUF_BLOCK.match` reads the prefix a GGUF tensor name starts with; `GGUF_BLOCK.search` is llama.cpp's
# `std::regex_search(name, blk\.(\d+)\.)` (llama-quantize's `remap_layer`), which also finds `enc.blk.N.`.
GGUF_BLOCK = re.compile(r"blk\.(\d+)\.")
# transformers' decoder layers on a dot boundary: `model.layers.N.`, `backbone.layers.N.`, `layers.N.`
HF_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def parse_block(name: str) -> tuple[int, str] | None:
    """(layer, the rest of the name) for a GGUF tensor in a block (`blk.N.`), None for one outside any block.

    Example:
        >>> parse_block("blk.12.attn_q.weight"), parse_block("output_norm.weight"), parse_block("v.blk.0.ln1.weight")
        ((12, 'attn_q.weight'), None, None)
    """
    m = GGUF_BLOCK.match(name)
    return (int(m[1]), name[m.end():]) if m else None


def block_template(name: str) -> str:
    """A GGUF tensor name with its block number as `{bid}` (gguf-py's and the record tables' spelling); a name
    outside any block as it is.

    Example:
        >>> block_template("blk.3.attn_q.weight"), block_template("token_embd.weight")
        ('blk.{bid}.attn_q.weight', 'token_embd.weight')
    """
    block = parse_block(name)
    return name if block is None else "blk.{bid}." + block[1]


def parse_layer(name: str) -> tuple[str, int, str] | None:
    """(what precedes `layers.`, layer, the rest) for a Hugging Face tensor in a decoder layer, None otherwise.

    Example:
        >>> parse_layer("model.layers.3.mlp.up_proj.weight"), parse_layer("layers.0.w")
        (('model', 3, 'mlp.up_proj.weight'), ('', 0, 'w'))
        >>> parse_layer("model.norm.weight"), parse_layer("model.sublayers.1.w")
        (None, None)
    """
    m = HF_LAYER.search(name)
    if m is None:
        return None
    return name[:m.start()], int(m[1]), name[m.end():]


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


# --- folding: many names as few brace patterns -------------------------------------------------------------
# One implementation serves every place that prints many names at once: `explain`'s groups and source names,
# `visualize`'s labels, and the bring-up report's table (`interop.check`). The folding is exact: every pattern
# expands to names that were given and to nothing else (a ragged set of experts stays two patterns rather than
# one box that claims experts which are not there), and numbers keep their spelling (zero padding included).
_DIGITS = re.compile(r"(\d+)")

K = TypeVar("K", bound=Hashable)
Box = tuple[frozenset[str], ...]


def split_digits(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the text between digit runs, the digit runs): what two names must share to fold into one pattern.

    Unlike `split_numbers` (dot components only, for did-you-mean), every run of digits counts, so shard
    file names fold too.

    Example:
        >>> split_digits("model-00002-of-00003.safetensors")
        (('model-', '-of-', '.safetensors'), ('00002', '00003'))
        >>> split_digits("layers.3.w1")
        (('layers.', '.w', ''), ('3', '1'))
    """
    parts = _DIGITS.split(name)
    return tuple(parts[0::2]), tuple(parts[1::2])


def _num_key(v: str) -> tuple[int, str]:
    return int(v), v


def format_index_set(values: Iterable[int | str]) -> str:
    """A set of numbers as brace text: `{0..21}`, `{0,2,5..7}`, or a bare number for one value.

    Runs of three or more consecutive values become `a..b`. Digit strings keep their zero padding when they
    all have the same width (`{00001..00003}`); mixed spellings (`1` beside `01`) are listed as given.

    Example:
        >>> format_index_set(range(22)), format_index_set([0, 2, 5, 6, 7]), format_index_set([3])
        ('{0..21}', '{0,2,5..7}', '3')
        >>> format_index_set(["00001", "00002", "00003"]), format_index_set([4, 5])
        ('{00001..00003}', '{4,5}')
    """
    vs = sorted({str(v) for v in values}, key=_num_key)
    if len(vs) == 1:
        return vs[0]
    padded = any(len(v) > 1 and v.startswith("0") for v in vs)
    if padded and len({len(v) for v in vs}) > 1:
        return "{" + ",".join(vs) + "}"
    ints = [int(v) for v in vs]
    runs: list[str] = []
    i = 0
    while i < len(ints):
        j = i
        while j + 1 < len(ints) and ints[j + 1] == ints[j] + 1:
            j += 1
        if j - i >= 2:
            runs.append(f"{vs[i]}..{vs[j]}")
        else:
            runs.extend(vs[i:j + 1])
        i = j + 1
    return "{" + ",".join(runs) + "}"


def fold_boxes(tuples: Iterable[tuple[str, ...]]) -> list[Box]:
    """Cover a set of digit tuples exactly with cartesian boxes, merging from the last position to the first.

    Example:
        >>> [[sorted(s) for s in b] for b in fold_boxes([("0", "0"), ("0", "1"), ("1", "0")])]
        [[['0'], ['0', '1']], [['1'], ['0']]]
    """
    boxes = {tuple(frozenset([v]) for v in t) for t in tuples}
    k = len(next(iter(boxes))) if boxes else 0
    for pos in reversed(range(k)):
        groups: dict[tuple, set[str]] = {}
        for b in boxes:
            groups.setdefault(b[:pos] + b[pos + 1:], set()).update(b[pos])
        boxes = {key[:pos] + (frozenset(s),) + key[pos:] for key, s in groups.items()}
    return sorted(boxes, key=lambda b: tuple(min(map(_num_key, s)) for s in b))


def render(template: tuple[str, ...], box: Box) -> str:
    """A template from `split_digits` with each gap filled by `format_index_set` of the box's set there.

    Example:
        >>> render(("layers.", ".w"), (frozenset({"0", "1", "2"}),))
        'layers.{0..2}.w'
    """
    out = [template[0]]
    for text, values in zip(template[1:], box):
        out.append(format_index_set(values))
        out.append(text)
    return "".join(out)


def fold_numbers(items: Iterable[tuple[K, str]]) -> list[tuple[K, str, Box]]:
    """Fold (key, name) pairs whose keys are equal and whose names differ only in digit runs.

    Returns (key, pattern, box) in first-seen order of (key, template); the box is the sets of digit strings
    the pattern stands for, so a caller can render another template that carries the same numbers (the
    bring-up report folds a did-you-mean hint along with its name).

    Example:
        >>> [(k, p) for k, p, _ in fold_numbers([("a", "l.0.w"), ("a", "l.1.w"), ("b", "l.2.w")])]
        [('a', 'l.{0,1}.w'), ('b', 'l.2.w')]
    """
    groups: dict[tuple[K, tuple[str, ...]], list[tuple[str, ...]]] = {}
    for key, name in items:
        template, nums = split_digits(name)
        groups.setdefault((key, template), []).append(nums)
    return [(key, render(template, box), box)
            for (key, template), nums in groups.items() for box in fold_boxes(nums)]


def _split_top(name: str) -> list[str]:
    """Split on dots outside braces ('layers.{0..3}.w' -> ['layers', '{0..3}', 'w'])."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in name:
        if ch == "." and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += (ch == "{") - (ch == "}")
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def _fold_words(rows: list[tuple[K, str, list[int]]]) -> list[tuple[K, str, list[int]]]:
    """`fold_words`, carrying which input rows each output row stands for."""
    if len(rows) < 2:
        return rows
    width = max(len(_split_top(r[1])) for r in rows)
    for pos in reversed(range(width)):
        groups: dict[tuple, list[tuple[tuple[K, str, list[int]], str]]] = {}
        for r in rows:
            parts = _split_top(r[1])
            word = parts[pos] if pos < len(parts) else ""
            if not word or "{" in word or word.isdigit():
                key: tuple = ("<keep>", id(r))
            else:
                key = ("<word>", r[0], tuple(parts[:pos]), tuple(parts[pos + 1:]))
            groups.setdefault(key, []).append((r, word))
        rows = []
        for key, members in groups.items():
            if key[0] == "<keep>" or len(members) == 1:
                rows.extend(m[0] for m in members)
                continue
            words = list(dict.fromkeys(m[1] for m in members))
            parts = _split_top(members[0][0][1])
            parts[pos] = "{" + ",".join(words) + "}"
            rows.append((members[0][0][0], ".".join(parts), [i for m in members for i in m[0][2]]))
    return rows


def fold_words(rows: Sequence[tuple[K, str]]) -> list[tuple[K, str]]:
    """Merge (key, name) rows with equal keys whose names differ in one dot component: `{q_proj,k_proj}`.

    Components that already hold a brace pattern or are plain numbers are left alone (fold numbers first).

    Example:
        >>> fold_words([(0, "attn.q_proj.weight"), (0, "attn.k_proj.weight"), (1, "attn.v_proj.weight")])
        [(0, 'attn.{q_proj,k_proj}.weight'), (1, 'attn.v_proj.weight')]
    """
    return [(k, n) for k, n, _ in _fold_words([(k, n, [i]) for i, (k, n) in enumerate(rows)])]


def fold_names(names: Iterable[str]) -> list[str]:
    """Many names as few exact brace patterns: numbers fold first (`layers.{0..21}.w`), then words.

    Example:
        >>> fold_names([f"layers.{i}.attn.{p}.weight" for i in (1, 2, 3) for p in ("q_proj", "k_proj")])
        ['layers.{1..3}.attn.{q_proj,k_proj}.weight']
        >>> fold_names([f"l.0.e.{j}" for j in range(4)] + [f"l.1.e.{j}" for j in range(2)])  # ragged: exact
        ['l.0.e.{0..3}', 'l.1.e.{0,1}']
    """
    return [n for _, n in fold_words([(None, n) for _, n, _ in fold_numbers((None, n) for n in names)])]


def name_pattern(names: Iterable[str]) -> str:
    """One label for many names: their single folded pattern, or the first pattern and how many names remain.

    Example:
        >>> name_pattern([f"layers.{i}.w" for i in range(22)])
        'layers.{0..21}.w'
        >>> name_pattern(["model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"])
        'model-{00001,00003}-of-00003.safetensors'
        >>> name_pattern(["x.w", "y.v", "z.u"])
        'x.w (+2 more)'
    """
    uniq = list(dict.fromkeys(names))
    if len(uniq) <= 1:
        return uniq[0] if uniq else ""
    folded = fold_numbers((None, n) for n in uniq)
    counts = [prod(len(s) for s in box) for _, _, box in folded]
    rows = _fold_words([(None, p, [i]) for i, (_, p, _) in enumerate(folded)])
    if len(rows) == 1:
        return rows[0][1]
    first = sum(counts[i] for i in rows[0][2])
    return f"{rows[0][1]} (+{len(uniq) - first} more)"
