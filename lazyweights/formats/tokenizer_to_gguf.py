"""Hugging Face -> GGUF tokenizer: `tokenizer.json` (+ `tokenizer_config.json`) -> GGUF `tokenizer.ggml.*` metadata.

`gguf_tokenizer_metadata` writes the keys llama.cpp reads, typed as gguf-py's `GGUFWriter` writes them (tokens
STRING[], scores FLOAT32[], token_type INT32[], merges STRING[], ids UINT32, add_* BOOL, chat template STRING).
Everything comes from the file's structure: `tokenizer.ggml.pre` is the llama.cpp regex set equal to the
pre-tokenizer's split regexes (`tokenizer_tables.BYTE_LEVEL_PRE_TOKENIZERS`), never a hash; a part llama.cpp
cannot reproduce is a TokenizerNotExpressibleError naming it (tests/formats/test_hf_tokenizer_llamacpp.py judges
by llama.cpp). A SentencePiece BPE follows its architecture's dialect (`tokenizer_tables.sentencepiece_dialect`,
from the identity table: Gemma's space runs are user-defined pieces). The reverse direction is
`lazyweights.formats.tokenizer_to_hf`.

Example:
    >>> import os, tempfile
    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> from lazyweights.formats.tokenizer_to_gguf import gguf_tokenizer_metadata
    >>> d = tempfile.mkdtemp()
    >>> t = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    >>> t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    >>> t.save(os.path.join(d, "tokenizer.json"))
    >>> gguf_tokenizer_metadata(d, "llama")["tokenizer.ggml.tokens"].value
    ['a', 'b', 'ab']
"""
from __future__ import annotations

import base64
import json
import os
import re
from typing import Any, Mapping

from ..core.errors import MissingTokenizerError, TokenizerNotExpressibleError
from .json_files import read_json
from .tokenizer_tables import (
    BERT_LOWERCASE_KEY,
    BERT_STRIP_ACCENTS_KEY,
    BYTE,
    BYTE_LEVEL_PRE_TOKENIZERS,
    CONTROL,
    GPT2_REGEX,
    NORMAL,
    SPECIAL_TOKEN_NAMES,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    PreTokenizer,
    sentencepiece_dialect,
    special_token_keys,
)


def _token_str(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None



_CASELESS = re.compile(r"\(\?i:((?:'?[A-Za-z]+\|)*'?[A-Za-z]+)\)")


def _canonical_regex(rx: str) -> str:
    r"""One spelling per regex: `(?i:'s|'t)` as llama.cpp's `(?:'[sS]|'[tT])`, CR/LF characters as `\r`/`\n`.

    >>> _canonical_regex("(?i:'s|'ll)|\\p{N}") == _canonical_regex("(?:'[sS]|'[lL][lL])|\\p{N}")
    True
    """
    def expand(m: re.Match) -> str:
        return "(?:" + "|".join("".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in alt)
                                for alt in m.group(1).split("|")) + ")"

    return _CASELESS.sub(expand, rx.replace("\r", r"\r").replace("\n", r"\n"))


_PRE_BY_REGEXES: dict[tuple[str, ...], list[PreTokenizer]] = {}
for _p in BYTE_LEVEL_PRE_TOKENIZERS:
    _PRE_BY_REGEXES.setdefault(tuple(map(_canonical_regex, _p.regexes)), []).append(_p)


def _flatten(part: Any) -> list[dict]:
    """A (possibly nested) Sequence of normalizers / pre-tokenizers as a flat list of its components."""
    if not isinstance(part, dict):
        return []
    subs = part.get("pretokenizers") if part.get("type") == "Sequence" else None
    if part.get("type") == "Sequence" and subs is None:
        subs = part.get("normalizers")
    if subs is None:
        return [part]
    return [c for s in subs for c in _flatten(s)]


def _not_expressible(path: str, part: str, what: str) -> TokenizerNotExpressibleError:
    return TokenizerNotExpressibleError(f"{path}: {part}: {what}; no GGUF tokenizer setting makes llama.cpp "
                                        "tokenize like it (pass tokenizer=False / --no-tokenizer to write the GGUF "
                                        "without a tokenizer)", part=part)


def _byte_level_regexes(path: str, pre: Any) -> list[str]:
    """The regexes a byte-level pre-tokenizer splits with, in order (each Split isolating its matches, as
    llama.cpp's `unicode_regex_split` does); TokenizerNotExpressibleError names any other component."""
    regexes: list[str] = []
    parts = _flatten(pre)
    if not parts or parts[-1].get("type") != "ByteLevel":
        raise _not_expressible(path, "pre_tokenizer", f"{json.dumps(pre)[:200]} does not end in ByteLevel, and "
                               "llama.cpp's BPE ('gpt2') vocabulary is byte-level")
    for i, c in enumerate(parts):
        kind = c.get("type")
        if kind == "Split":
            pattern = c.get("pattern") or {}
            behavior = str(c.get("behavior", "")).lower()
            if "Regex" not in pattern or behavior != "isolated" or c.get("invert"):
                raise _not_expressible(path, "pre_tokenizer", f"Split {json.dumps(pattern)[:120]} with behavior "
                                       f"{c.get('behavior')!r}, invert {c.get('invert')!r} (llama.cpp isolates the "
                                       "matches of a regex, nothing else)")
            regexes.append(pattern["Regex"])
        elif kind == "Digits":
            regexes.append(r"\p{N}" if c.get("individual_digits") else r"\p{N}+")
        elif kind == "ByteLevel" and i == len(parts) - 1:
            if c.get("add_prefix_space"):
                raise _not_expressible(path, "pre_tokenizer", "ByteLevel add_prefix_space=true (llama.cpp's BPE "
                                       "tokenizer adds no space)")
            if c.get("use_regex", True):
                regexes.append(GPT2_REGEX)
        else:
            raise _not_expressible(path, "pre_tokenizer", f"component {kind!r} ({json.dumps(c)[:120]}) has no "
                                   "llama.cpp counterpart")
    return regexes


def _merges_matter(vocab: Mapping[str, int], merges: list[str], added: set[str]) -> list[str]:
    """Vocabulary tokens BPE does not rebuild from their own characters: the words on which ignore_merges
    (look a whole word up before merging) changes the result. Empty when the flag cannot matter. Added tokens
    are matched before the model runs (by tokenizers and llama.cpp alike), so they are not asked."""
    from tokenizers.models import BPE

    pairs = [(a, b) for a, _, b in (m.partition(" ") for m in merges)]
    model = BPE(vocab=dict(vocab), merges=pairs, ignore_merges=False)
    out = []
    for tok in vocab:
        if tok in added:
            continue
        got = [t.value for t in model.tokenize(tok)]
        if got != [tok]:
            out.append(tok)
    return out


def _pick_pre_tokenizer(path: str, model: dict, pre: Any, vocab: Mapping[str, int], merges: list[str],
                        added: set[str]) -> str:
    """`tokenizer.ggml.pre` for a byte-level BPE tokenizer, chosen by its split regexes and ignore_merges."""
    regexes = _byte_level_regexes(path, pre)
    key = tuple(map(_canonical_regex, regexes))
    names = _PRE_BY_REGEXES.get(key)
    if not names:
        known = ", ".join(p.name for p in BYTE_LEVEL_PRE_TOKENIZERS)
        raise _not_expressible(path, "pre_tokenizer", f"the split regexes {[r[:80] for r in regexes]} are not a set "
                               f"llama.cpp's BPE tokenizer implements (its sets are named {known})")
    ignore = bool(model.get("ignore_merges", False))
    if names[0].ignore_merges == ignore:
        return names[0].name
    # The first name is the common one (llama-bpe before smaug-bpe); it is kept when ignore_merges cannot
    # change a result: every vocabulary token is what BPE builds from its own characters (trained vocabularies).
    affected = _merges_matter(vocab, merges, added)
    if not affected:
        return names[0].name
    same = [p for p in names if p.ignore_merges == ignore]
    if same:
        return same[0].name
    raise _not_expressible(path, "model.ignore_merges", f"ignore_merges={ignore} changes how {len(affected)} "
                           f"vocabulary tokens tokenize (e.g. {affected[0]!r}), and llama.cpp's pre-tokenizer(s) "
                           f"with these regexes ({', '.join(p.name for p in names)}) use ignore_merges={not ignore}")


def _specials_template(path: str, doc: dict) -> tuple[list[int], list[int]] | None:
    """(ids before, ids after) the text in the post-processor's single-sequence template; None without one."""
    pp = doc.get("post_processor")
    if not isinstance(pp, dict):
        return None
    found: tuple[list[int], list[int]] | None = None
    for p in ([pp] if pp.get("type") != "Sequence" else pp.get("processors") or []):
        kind = p.get("type")
        if kind in ("BertProcessing", "RobertaProcessing"):
            found = ([int(p["cls"][1])], [int(p["sep"][1])])
        elif kind == "TemplateProcessing":
            specials = p.get("special_tokens") or {}
            before: list[int] = []
            after: list[int] = []
            seen_text = False
            for item in p.get("single") or []:
                if "Sequence" in item:
                    seen_text = True
                    continue
                name = item["SpecialToken"]["id"]
                ids = (specials.get(name) or {}).get("ids") or []
                (after if seen_text else before).extend(int(i) for i in ids)
            found = (before, after)
        elif kind != "ByteLevel":
            raise _not_expressible(path, "post_processor", f"{kind!r} has no llama.cpp counterpart")
    return found


# SentencePiece's normalizer steps as transformers' converter spells them (convert_slow_tokenizer.py,
# build_tokenizer_from_spm_proto): strip + collapse = remove_extra_whitespaces; ' ' -> '\u2581' = escape_whitespaces;
# '\A\u2581' -> '\u2581\u2581' = the dummy prefix even before a leading space (as llama.cpp adds it).
_SP_STRIP = ({"Regex": "\\A +| +\\z"}, "")
_SP_COLLAPSE = ({"Regex": " {2,}"}, " ")
_SP_ESCAPE = ({"String": " "}, "\u2581")
_SP_PREFIX = ({"Regex": "\\A\u2581"}, "\u2581\u2581")


def _replace_step(n: dict) -> tuple | None:
    return (n.get("pattern"), n.get("content")) if n.get("type") == "Replace" else None


def _precompiled_charsmap(path: str, norm: Any) -> tuple[bytes | None, bool]:
    """(SentencePiece's precompiled charsmap, remove_extra_whitespaces) of a Unigram tokenizer's normalizer."""
    charsmap = None
    collapse = False
    for n in _flatten(norm):
        kind = n.get("type")
        step = _replace_step(n)
        if kind == "Precompiled":
            raw = n.get("precompiled_charsmap") or ""
            charsmap = base64.b64decode(raw) if raw else None
        elif step in (_SP_COLLAPSE, _SP_STRIP):
            collapse = True  # SentencePiece's remove_extra_whitespaces, as transformers converts it
        elif step in (_SP_ESCAPE, _SP_PREFIX):
            pass  # llama.cpp's t5 tokenizer escapes spaces and adds its prefix space this way itself
        elif kind is not None:
            raise _not_expressible(path, "normalizer", f"{kind!r} ({json.dumps(n)[:120]}) next to a Unigram model "
                                   "(llama.cpp's t5 tokenizer knows a precompiled charsmap and collapsing spaces)")
    return charsmap, collapse


def gguf_tokenizer_metadata(folder, arch: str) -> dict:
    """GGUF `tokenizer.*` key/values (as `GGUFValue`s, typed like gguf-py's GGUFWriter) from a Hugging Face
    folder's `tokenizer.json` and `tokenizer_config.json`, derived from their structure alone.

    | tokenizer.json model             | tokenizer.ggml.model | from                                          |
    |----------------------------------|----------------------|-----------------------------------------------|
    | BPE, ByteLevel pre-tokenizer     | gpt2                 | merges; `pre` named by the split regexes      |
    | BPE with byte_fallback           | llama                | scores from ids (merge rank); Metaspace prefix |
    | Unigram                          | t5                   | scores; precompiled charsmap; Metaspace       |
    | WordPiece                        | bert                 | phantom-space spelling; BertNormalizer flags  |

    Added tokens become control (special) or user-defined tokens; bos/eos/unk/pad ids and add_bos/add_eos come
    from the post-processor's template, then tokenizer_config.json. A part llama.cpp cannot reproduce is a
    TokenizerNotExpressibleError naming it; MissingTokenizerError when the folder has no tokenizer.json;
    JSONFileError when tokenizer.json or tokenizer_config.json is not a JSON object.

    Example:
        >>> import json, os, tempfile
        >>> from tokenizers import Tokenizer, models, pre_tokenizers, decoders
        >>> d = tempfile.mkdtemp()
        >>> t = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
        >>> t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False); t.decoder = decoders.ByteLevel()
        >>> t.save(os.path.join(d, "tokenizer.json"))
        >>> md = gguf_tokenizer_metadata(d, "llama")
        >>> md["tokenizer.ggml.model"].value, md["tokenizer.ggml.pre"].value, md["tokenizer.ggml.merges"].value
        ('gpt2', 'gpt-2', ['a b'])
    """
    from gguf.constants import GGUFValueType as T
    from gguf.constants import Keys

    from .gguf_writer import GGUFValue

    folder = os.fspath(folder)
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        others = [f for f in ("tokenizer.model", "vocab.json", "merges.txt", "tekken.json", "vocab.txt")
                  if os.path.isfile(os.path.join(folder, f))]
        hint = (f" (it has {', '.join(others)}: only tokenizer.json is read; save the tokenizer with a fast "
                "tokenizer to write one)") if others else ""
        raise MissingTokenizerError(f"{folder}: no tokenizer.json{hint}; pass tokenizer=False (--no-tokenizer) "
                                    "to write the GGUF without tokenizer metadata (llama.cpp cannot run it then)")
    doc = read_json(path)
    tcfg = read_json(os.path.join(folder, "tokenizer_config.json")) or {}
    model = doc.get("model") or {}
    kind = model.get("type")
    raw_vocab = model.get("vocab")
    if kind == "Unigram":
        pieces = raw_vocab or []
        vocab = {p[0]: i for i, p in enumerate(pieces)}
    elif kind in ("BPE", "WordPiece"):
        vocab = dict(raw_vocab or {})
    else:
        raise _not_expressible(path, "model", f"type {kind!r} (llama.cpp reads BPE, Unigram and WordPiece)")
    added = sorted(doc.get("added_tokens") or [], key=lambda a: a["id"])
    size = max([*vocab.values(), *(a["id"] for a in added)], default=-1) + 1
    tokens: list[str | None] = [None] * size
    for t, i in vocab.items():
        tokens[i] = t
    types = [NORMAL] * size
    for a in added:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = CONTROL if a.get("special") else USER_DEFINED
    for i in [i for i, t in enumerate(tokens) if t is None]:  # ids no token uses: llama.cpp needs a dense list
        tokens[i] = f"[PAD{i}]"
        types[i] = UNUSED
    md: dict[str, GGUFValue] = {}
    template = _specials_template(path, doc)

    def tcfg_id(name: str) -> int | None:
        tok = _token_str(tcfg.get(name))
        if tok is None:
            return None
        try:
            return tokens.index(tok)
        except ValueError:  # the token is not in the vocabulary: no id, so the GGUF key is left out
            return None

    ids: dict[str, int | None] = {name: tcfg_id(name) for name in SPECIAL_TOKEN_NAMES}
    add_bos, add_eos = _post_processor_adds(doc, tcfg)
    if template is not None:
        before, after = template
        if len(before) > 1 or len(after) > 1:
            raise _not_expressible(path, "post_processor", f"it adds {[tokens[i] for i in before]} before and "
                                   f"{[tokens[i] for i in after]} after the text; llama.cpp adds at most one token "
                                   "on each side")
        if before:
            ids["bos_token"] = before[0]
        if after:
            ids["eos_token"] = after[0]
    normalizer = doc.get("normalizer")
    pre = doc.get("pre_tokenizer")
    if ids["unk_token"] is None and isinstance(model.get("unk_token"), str) and model["unk_token"] in vocab:
        ids["unk_token"] = vocab[model["unk_token"]]
    if kind == "BPE" and model.get("byte_fallback"):
        _check_sentencepiece_parts(path, normalizer, pre)
        _sentencepiece_bpe(md, tokens, types, doc, arch, ids["unk_token"], T, GGUFValue)
    elif kind == "BPE":
        norms = [n.get("type") for n in _flatten(normalizer)]
        if any(n != "NFC" for n in norms):
            # NFC is kept: llama.cpp does not normalize, and text already in NFC (nearly all text) is unchanged.
            raise _not_expressible(path, "normalizer", f"{norms} before a byte-level BPE model (llama.cpp's BPE "
                                   "tokenizer normalizes nothing)")
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
        md[Keys.Tokenizer.MODEL] = GGUFValue("gpt2", T.STRING)
        md[Keys.Tokenizer.PRE] = GGUFValue(_pick_pre_tokenizer(path, model, pre, vocab, merges,
                                                                        {a['content'] for a in added}), T.STRING)
        md[Keys.Tokenizer.LIST] = GGUFValue(tokens, T.ARRAY, T.STRING)
        md[Keys.Tokenizer.TOKEN_TYPE] = GGUFValue(types, T.ARRAY, T.INT32)
        md[Keys.Tokenizer.MERGES] = GGUFValue(merges, T.ARRAY, T.STRING)
    elif kind == "Unigram":
        if model.get("byte_fallback"):
            raise _not_expressible(path, "model.byte_fallback", "a Unigram model with byte_fallback=true "
                                   "(llama.cpp's t5 tokenizer maps unknown characters to the unknown token)")
        unk = model.get("unk_id")
        scores = [0.0] * len(tokens)
        for i, p in enumerate(pieces):
            scores[i] = float(p[1])
        if unk is not None and types[int(unk)] in (NORMAL, CONTROL):
            types[int(unk)] = UNKNOWN
            ids["unk_token"] = int(unk)
        for i, t in enumerate(tokens):
            if types[i] == NORMAL and _is_byte_token(t):
                types[i] = BYTE
        charsmap, collapse = _precompiled_charsmap(path, normalizer)
        prefix, split_ws = True, False
        for c in _flatten(pre):
            if c.get("type") == "Metaspace" and c.get("replacement", "\u2581") == "\u2581":
                prefix = c.get("prepend_scheme", "always") != "never" and c.get("add_prefix_space", True)
            elif c.get("type") == "WhitespaceSplit":
                split_ws = True
            else:
                raise _not_expressible(path, "pre_tokenizer", f"{json.dumps(c)[:120]} next to a Unigram model "
                                       "(llama.cpp's t5 tokenizer escapes spaces as '\u2581' and nothing else)")
        md[Keys.Tokenizer.MODEL] = GGUFValue("t5", T.STRING)
        md[Keys.Tokenizer.LIST] = GGUFValue(tokens, T.ARRAY, T.STRING)
        md[Keys.Tokenizer.SCORES] = GGUFValue(scores, T.ARRAY, T.FLOAT32)
        md[Keys.Tokenizer.TOKEN_TYPE] = GGUFValue(types, T.ARRAY, T.INT32)
        md[Keys.Tokenizer.ADD_PREFIX] = GGUFValue(bool(prefix), T.BOOL)
        md[Keys.Tokenizer.REMOVE_EXTRA_WS] = GGUFValue(bool(collapse or split_ws), T.BOOL)
        if charsmap:
            md[Keys.Tokenizer.PRECOMPILED_CHARSMAP] = GGUFValue(list(charsmap), T.ARRAY, T.UINT8)
    else:  # WordPiece
        _wordpiece(md, path, model, tokens, types, doc, ids, template, T, GGUFValue)
        add_bos, add_eos = True, False
        md[Keys.Tokenizer.ADD_SEP] = GGUFValue(True, T.BOOL)
    for name, key in special_token_keys().items():
        tid = ids[name]
        if tid is not None:
            md[key] = GGUFValue(int(tid), T.UINT32)
    md[Keys.Tokenizer.ADD_BOS] = GGUFValue(bool(add_bos and ids["bos_token"] is not None), T.BOOL)
    md[Keys.Tokenizer.ADD_EOS] = GGUFValue(bool(add_eos and ids["eos_token"] is not None), T.BOOL)
    chat = tcfg.get("chat_template")
    if chat is None:
        jinja = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as fh:
                chat = fh.read()
    if isinstance(chat, list):  # named templates: llama.cpp reads the default one
        chat = next((t.get("template") for t in chat if t.get("name") == "default"), None)
    if isinstance(chat, str):
        md[Keys.Tokenizer.CHAT_TEMPLATE] = GGUFValue(chat, T.STRING)
    return md


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _is_byte_token(t: str | None) -> bool:
    """'<0x0A>': a SentencePiece byte-fallback piece."""
    return t is not None and len(t) == 6 and t.startswith("<0x") and _BYTE_TOKEN.fullmatch(t) is not None


def _check_sentencepiece_parts(path: str, normalizer: Any, pre: Any) -> None:
    """The normalizer / pre-tokenizer parts a SentencePiece-converted BPE may have: llama.cpp's `llama` tokenizer
    escapes spaces as '\u2581', prepends one, and normalizes nothing else. NFC / NFKC are accepted (text already
    normalized is unchanged, as with llama.cpp's own converter); a precompiled charsmap (SentencePiece's nmt_nfkc
    maps no-break spaces, full-width forms, ...) and collapsed spaces are named errors."""
    for n in _flatten(normalizer):
        kind = n.get("type")
        step = _replace_step(n)
        if step in (_SP_ESCAPE, _SP_PREFIX) or kind in ("Prepend", "NFC", "NFKC"):
            continue
        if kind == "Precompiled" and not n.get("precompiled_charsmap"):
            continue  # SentencePiece's identity normalization
        what = {"Precompiled": "a precompiled charsmap (SentencePiece normalization rules)"}.get(
            str(kind), f"{kind} {json.dumps(n)[:120]}")
        raise _not_expressible(path, "normalizer", f"{what} before a SentencePiece BPE (llama.cpp's llama tokenizer "
                               "only replaces ' ' with '\u2581' and prepends one)")
    for c in _flatten(pre):
        kind = c.get("type")
        if kind == "Split" and c.get("pattern") == {"String": " "}:
            continue  # Gemma's: split after each space, which merges never cross anyway
        if kind != "Metaspace":
            raise _not_expressible(path, "pre_tokenizer", f"{kind!r} ({json.dumps(c)[:120]}) before a SentencePiece "
                                   "BPE (llama.cpp's llama tokenizer only escapes spaces as '\u2581')")


def _sentencepiece_bpe(md: dict, tokens: list, types: list, doc: dict, arch: str, unk: int | None, T, GGUFValue):
    """A BPE model with byte fallback (SentencePiece converted: Llama 2, Mistral, Gemma, Phi-3) as `llama`."""
    from gguf.constants import Keys

    md[Keys.Tokenizer.MODEL] = GGUFValue("llama", T.STRING)
    md[Keys.Tokenizer.PRE] = GGUFValue("default", T.STRING)
    gemma = sentencepiece_dialect(arch) == "gemma"  # the identity table's tokenizer column
    first_normal = None
    scores = []
    for i, t in enumerate(tokens):
        if types[i] == NORMAL and _is_byte_token(t):
            types[i] = BYTE
        if gemma and types[i] == NORMAL and len(t) > 1 and set(t) == {"\u2581"}:
            # Gemma's own spelling of space runs (undone on the way in); like its newline runs, they
            # are user-defined pieces in Gemma's SentencePiece model.
            tokens[i] = " " * len(t)
            types[i] = USER_DEFINED
        if i == unk and not gemma:
            types[i] = UNKNOWN
        if types[i] == NORMAL:
            # SentencePiece scores rank pieces; ids follow that rank in converted vocabularies (and merge
            # order in trained ones), so -(id - first) keeps llama.cpp's merge priority the BPE merge order.
            if first_normal is None:
                first_normal = i
            scores.append(float(-(i - first_normal)))
        else:
            scores.append(0.0 if types[i] == BYTE else -1000.0)
    md[Keys.Tokenizer.LIST] = GGUFValue(tokens, T.ARRAY, T.STRING)
    md[Keys.Tokenizer.SCORES] = GGUFValue(scores, T.ARRAY, T.FLOAT32)
    md[Keys.Tokenizer.TOKEN_TYPE] = GGUFValue(types, T.ARRAY, T.INT32)
    prefix = _metaspace_prefix(doc)
    if prefix is not None:
        md[Keys.Tokenizer.ADD_PREFIX] = GGUFValue(prefix, T.BOOL)


def _wordpiece(md: dict, path: str, model: dict, tokens: list, types: list, doc: dict, ids: dict,
               template, T, GGUFValue) -> None:
    """A WordPiece model (BERT) as llama.cpp's `bert` vocabulary: word-initial pieces spelled with a leading
    phantom space '\u2581', continuation pieces without their prefix ('##'), bracketed tokens as they are."""
    from gguf.constants import Keys

    norm = [n for n in _flatten(doc.get("normalizer"))]
    lowercase = strip = False
    for n in norm:
        if n.get("type") != "BertNormalizer":
            raise _not_expressible(path, "normalizer", f"{n.get('type')!r} next to a WordPiece model (llama.cpp's "
                                   "bert tokenizer implements BertNormalizer only)")
        if not n.get("clean_text", True) or not n.get("handle_chinese_chars", True):
            raise _not_expressible(path, "normalizer", f"BertNormalizer clean_text={n.get('clean_text')}, "
                                   f"handle_chinese_chars={n.get('handle_chinese_chars')} (llama.cpp always "
                                   "cleans text and splits CJK characters)")
        lowercase = bool(n.get("lowercase", True))
        s = n.get("strip_accents")
        strip = lowercase if s is None else bool(s)
    for c in _flatten(doc.get("pre_tokenizer")):
        if c.get("type") != "BertPreTokenizer":
            raise _not_expressible(path, "pre_tokenizer", f"{c.get('type')!r} next to a WordPiece model (llama.cpp "
                                   "splits words as BertPreTokenizer does, nothing else)")
    if template is None or len(template[0]) != 1 or len(template[1]) != 1:
        raise _not_expressible(path, "post_processor", f"template {template} (llama.cpp's bert tokenizer always adds "
                               "one token before the text (CLS) and one after (SEP))")
    prefix = model.get("continuing_subword_prefix") or "##"
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if types[i] == NORMAL and not (t.startswith("[") and t.endswith("]")):
            tokens[i] = t[len(prefix):] if t.startswith(prefix) else "\u2581" + t
        if tokens[i] in seen:
            raise _not_expressible(path, "model.vocab", f"tokens {seen[tokens[i]]} and {i} are both spelled "
                                   f"{tokens[i]!r} in llama.cpp's phantom-space vocabulary")
        seen[tokens[i]] = i
    unk = model.get("unk_token")
    if isinstance(unk, str) and unk in seen:
        ids["unk_token"] = seen[unk]
    ids["bos_token"], sep = template[0][0], template[1][0]
    ids["eos_token"] = None
    md[Keys.Tokenizer.MODEL] = GGUFValue("bert", T.STRING)
    md[Keys.Tokenizer.PRE] = GGUFValue("default", T.STRING)
    md[Keys.Tokenizer.LIST] = GGUFValue(tokens, T.ARRAY, T.STRING)
    md[Keys.Tokenizer.TOKEN_TYPE] = GGUFValue(types, T.ARRAY, T.INT32)
    md[Keys.Tokenizer.SEP_ID] = GGUFValue(int(sep), T.UINT32)  # llama.cpp's spelling
    md[BERT_LOWERCASE_KEY] = GGUFValue(lowercase, T.BOOL)
    md[BERT_STRIP_ACCENTS_KEY] = GGUFValue(strip, T.BOOL)
    mask = next((i for i, t in enumerate(tokens) if t == "[MASK]" and types[i] == CONTROL), None)
    if mask is not None:
        md[Keys.Tokenizer.MASK_ID] = GGUFValue(mask, T.UINT32)


def _metaspace_prefix(doc: dict) -> bool | None:
    for pre in _flatten(doc.get("pre_tokenizer")):
        if pre.get("type") == "Metaspace":
            return pre.get("prepend_scheme", "always") != "never"
    norm = doc.get("normalizer")
    if isinstance(norm, dict):
        subs = norm.get("normalizers", [norm])
        if any(n.get("type") == "Prepend" for n in subs if isinstance(n, dict)):
            return True
        if any(n.get("type") == "Replace" for n in subs if isinstance(n, dict)):
            return False
    return None


def _post_processor_adds(doc: dict, tcfg: dict) -> tuple[bool, bool]:
    """(add_bos, add_eos): tokenizer_config.json's flags when given, else whether the post-processor's template
    puts a token before / after the text."""
    template = _specials_template("tokenizer.json", doc)
    add_bos = tcfg.get("add_bos_token")
    add_eos = tcfg.get("add_eos_token")
    if add_bos is None:
        add_bos = template is not None and bool(template[0])
    if add_eos is None:
        add_eos = template is not None and bool(template[1])
    return bool(add_bos), bool(add_eos)

