"""Tokenizers both ways: GGUF `tokenizer.ggml.*` metadata <-> Hugging Face `tokenizer.json` + `tokenizer_config.json`.

A GGUF file carries its tokenizer as metadata (llama.cpp's `gguf-py/gguf/vocab.py` writes it); a Hugging Face
folder carries a `tokenizers` serialization. This module converts between the two with Hugging Face's
`tokenizers` library alone (transformers is not needed at run time).

GGUF -> HF (`tokenizer_from_gguf`) builds the same backend tokenizer transformers builds in its own GGUF
loader (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`), so a folder we write tokenizes exactly
as `AutoTokenizer.from_pretrained(dir, gguf_file=...)` does (tests/adapters/test_hf_export.py holds that):

    tokenizer.ggml.model   pipeline
    llama                  SentencePiece-style BPE with byte fallback, Metaspace pre-tokenizer ("first")
      (arch gemma*)        Gemma's: Replace(" " -> "▁") normalizer, split on spaces; multi-space tokens
                           respelled "▁▁..."; merges derived from token order (Gemma's scores do not
                           follow its merge order)
      (arch phi3)          Prepend("▁") + Replace normalizer, no pre-tokenizer
    gpt2                   byte-level BPE with the file's merges, its pre-tokenizer split regex chosen by
                           `tokenizer.ggml.pre` (llama-bpe, qwen2, gpt-4o, ...)

Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added tokens. The
written `tokenizer_config.json` names `PreTrainedTokenizerFast`, so transformers (4.x and 5.x) loads
`tokenizer.json` verbatim instead of re-deriving a pipeline from a model class.

HF -> GGUF (`gguf_tokenizer_metadata`) reads `tokenizer.json` (+ `tokenizer_config.json`) and writes the
keys llama.cpp reads, typed as gguf-py's `GGUFWriter` writes them (tokens STRING[], scores FLOAT32[],
token_type INT32[], merges STRING[], ids UINT32, add_* BOOL, chat template STRING).

Example:
    >>> from lazyweights.formats.hf_tokenizer import tokenizer_from_gguf
    >>> md = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2",
    ...       "tokenizer.ggml.tokens": ["a", "b", "ab", "<|end|>"], "tokenizer.ggml.token_type": [1, 1, 1, 3],
    ...       "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 3}
    >>> tok, cfg = tokenizer_from_gguf(md)
    >>> tok.encode("abab<|end|>").ids, cfg["eos_token"]
    ([2, 2, 3], '<|end|>')
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

from ..core.errors import MissingTokenizerError, TokenizerConversionError

# gguf.TokenType values (gguf-py constants): kept literal so this module imports no gguf at GGUF -> HF time.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

TOKENIZER_FILES = ("tokenizer.json",)






# --- shared tables ------------------------------------------------------------------------------------------------
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (byte-level BPE spells every token with it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the split regex its merges were learned under (the names llama.cpp's
# convert_hf_to_gguf.py `get_vocab_base_pre` writes). The first name per regex is the one HF -> GGUF writes.
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "pixtral": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    "gpt-4o": _GPT4O_SPLIT, "llama4": _GPT4O_SPLIT,
}
_SPLIT_TO_PRE = {}
for _name, _rx in PRE_TOKENIZER_SPLITS.items():
    _SPLIT_TO_PRE.setdefault(_rx, _name)

_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})
_NAMED = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
          "pad_token": "padding_token_id"}


def _require_tokenizers():
    try:
        import tokenizers  # noqa: F401
    except ImportError:  # pragma: no cover - a declared dependency
        raise TokenizerConversionError("converting tokenizers needs Hugging Face's `tokenizers` package "
                                       "(pip install tokenizers)") from None
    return tokenizers


def generate_merges(vocab: Mapping[str, int], scores: Mapping[str, float]) -> list[tuple[str, str]]:
    """BPE merges a SentencePiece vocabulary implies: every split of a token into two vocabulary tokens,
    best score first; ties by left then right piece length (shorter last), pieces within a token by id.

    Same order as transformers' `generate_merges(vocab, scores)` (a stable sort, reversed), which the
    equality tests against transformers' GGUF loader depend on.

    >>> generate_merges({"a": 0, "b": 1, "ab": 2, "abb": 3}, {"a": 0, "b": 0, "ab": -1, "abb": -2})
    [('a', 'b'), ('ab', 'b')]
    """
    merges = []
    for piece, score in scores.items():
        local = []
        for i in range(1, len(piece)):
            left, right = piece[:i], piece[i:]
            li = vocab.get(left)
            if li is not None:
                ri = vocab.get(right)
                if ri is not None:
                    local.append((li, ri, left, right, score))
        if len(local) > 1:
            local.sort(key=lambda x: (x[0], x[1]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[4], len(v[2]), len(v[3])), reverse=True)
    return [(v[2], v[3]) for v in merges]


# --- GGUF -> Hugging Face -----------------------------------------------------------------------------------------
def _as_list(value) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


def tokenizer_from_gguf(metadata: Mapping[str, Any], arch: str | None = None):
    """`(tokenizers.Tokenizer, tokenizer_config dict)` from a GGUF file's metadata (see the module docstring).

    `arch` defaults to `general.architecture`. TokenizerConversionError names the missing key or the
    unsupported `tokenizer.ggml.model`.

    Example: see the module docstring.
    """
    _require_tokenizers()
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    arch = arch or metadata.get("general.architecture") or ""
    model = metadata.get("tokenizer.ggml.model")
    if "tokenizer.ggml.tokens" not in metadata or model is None:
        missing = [k for k in ("tokenizer.ggml.model", "tokenizer.ggml.tokens") if k not in metadata]
        raise TokenizerConversionError(f"the GGUF metadata has no tokenizer: missing {', '.join(missing)} "
                                       "(pass tokenizer=False / --no-tokenizer to write the folder without one)")
    tokens = [str(t) for t in _as_list(metadata["tokenizer.ggml.tokens"])]
    spelled_as_stored = tokens  # added tokens are matched in the text as the file spells them
    types = _as_list(metadata.get("tokenizer.ggml.token_type") or [])
    merges_md = metadata.get("tokenizer.ggml.merges")
    merges = None if merges_md is None else [tuple(m.split(" ", 1)) for m in _as_list(merges_md)]
    names = {name: (tokens[int(metadata[f"tokenizer.ggml.{key}"])]
                    if f"tokenizer.ggml.{key}" in metadata and 0 <= int(metadata[f"tokenizer.ggml.{key}"]) < len(tokens)
                    else None) for name, key in _NAMED.items()}
    cfg: dict[str, Any] = {}
    byte_level = model == "gpt2"
    if model == "llama":
        if arch in _GEMMA_ARCHS:
            # Gemma stores runs of spaces as real spaces; its pipeline looks them up as "▁" runs.
            tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
            vocab = {t: i for i, t in enumerate(tokens)}
            if merges is None:
                merges = generate_merges(vocab, {t: -i for i, t in enumerate(tokens)})
            # transformers' GemmaTokenizer builds its BPE with its own default unk spelling.
            tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token="<unk>", dropout=None,
                                byte_fallback=True))
            tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
            tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
            tok.normalizer = normalizers.Replace(" ", "\u2581")
            extra_named = {"mask_token": "<mask>"}  # GemmaTokenizer's default, kept when in the vocabulary
            cfg["padding_side"] = "left"
        else:
            vocab = {t: i for i, t in enumerate(tokens)}
            if merges is None:
                scores = _as_list(metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
                merges = generate_merges(vocab, dict(zip(tokens, (float(s) for s in scores))))
            tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
            if arch == "phi3":
                tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                       normalizers.Replace(" ", "\u2581")])
                tok.pre_tokenizer = None
            else:
                tok.normalizer = None
                tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
            tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(content=" ", left=1)])
            extra_named = {}
            cfg["padding_side"] = "left"
        # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
        cfg["add_bos_token"] = bool(metadata.get("tokenizer.ggml.add_bos_token", True))
    elif byte_level:
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
                 for i, t in enumerate(tokens)}
        if merges is None:
            raise TokenizerConversionError("tokenizer.ggml.model is 'gpt2' but the GGUF metadata has no "
                                           "tokenizer.ggml.merges")
        tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        split = PRE_TOKENIZER_SPLITS.get(metadata.get("tokenizer.ggml.pre"))
        if split is not None:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        extra_named = {}
        if "tokenizer.ggml.add_bos_token" in metadata:
            cfg["add_bos_token"] = bool(metadata["tokenizer.ggml.add_bos_token"])
    else:
        raise TokenizerConversionError(
            f"tokenizer.ggml.model = {model!r} is not supported (supported: 'llama' (SentencePiece-style, also "
            "Gemma and Phi-3), 'gpt2' (byte-level BPE)); pass tokenizer=False / --no-tokenizer to skip it")
    if "tokenizer.ggml.add_eos_token" in metadata:
        cfg["add_eos_token"] = bool(metadata["tokenizer.ggml.add_eos_token"])

    # Control tokens stay whole and are special; user-defined ones stay whole and are not. In a byte-level
    # vocabulary a "control" token outside the byte alphabet is a llama.cpp mislabel, skipped as transformers does.
    spelled = set(bytes_to_unicode().values()) if byte_level else None
    control = [AddedToken(t, normalized=False, special=True) for t, ty in zip(spelled_as_stored, types)
               if int(ty) == CONTROL and (spelled is None or set(t) <= spelled)]
    if control:
        tok.add_special_tokens(control)
    have = tok.get_vocab()
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(spelled_as_stored, types)
            if int(ty) == USER_DEFINED and t in have]
    if user:
        tok.add_tokens(user)
    added = {a.content for a in tok.get_added_tokens_decoder().values()}
    for name, value in list(names.items()) + list(extra_named.items()):
        if value is not None and value not in added and (name not in extra_named or value in have):
            tok.add_special_tokens([AddedToken(value, special=True)])
            added.add(value)
    for name, value in names.items():
        cfg[name] = value
    for name, value in extra_named.items():
        if value in have:
            cfg[name] = value
    bos, eos = cfg.get("bos_token"), cfg.get("eos_token")
    add_bos = bool(cfg.get("add_bos_token")) and bos is not None
    add_eos = bool(cfg.get("add_eos_token")) and eos is not None
    single = " ".join(([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else []))
    pair = " ".join([single] + ([f"{bos}:1"] if add_bos else []) + ["$B:1"] + ([f"{eos}:1"] if add_eos else []))
    specials = ([(bos, tok.token_to_id(bos))] if add_bos else []) + ([(eos, tok.token_to_id(eos))] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

    cfg["add_bos_token"] = bool(cfg.get("add_bos_token", False))
    cfg["add_eos_token"] = bool(cfg.get("add_eos_token", False))
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str):
        cfg["chat_template"] = template
    cfg["clean_up_tokenization_spaces"] = False
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    return tok, cfg


# --- Hugging Face -> GGUF -----------------------------------------------------------------------------------------
def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerConversionError(f"{path}: cannot read it as JSON: {e}") from None
    if not isinstance(doc, dict):
        raise TokenizerConversionError(f"{path}: holds a {type(doc).__name__}, expected a JSON object")
    return doc


def _token_str(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _split_regexes(pre) -> list[str]:
    """Every Split regex inside a (possibly nested) pre-tokenizer description."""
    if not isinstance(pre, dict):
        return []
    found = []
    if pre.get("type") == "Split" and isinstance(pre.get("pattern"), dict) and "Regex" in pre["pattern"]:
        found.append(pre["pattern"]["Regex"])
    for sub in pre.get("pretokenizers", []) or []:
        found += _split_regexes(sub)
    return found


def gguf_tokenizer_metadata(folder, arch: str) -> dict:
    """GGUF `tokenizer.*` key/values (as `GGUFValue`s, typed like gguf-py's GGUFWriter) from a Hugging Face
    folder's `tokenizer.json` and `tokenizer_config.json`.

    Supported models: BPE with byte fallback (SentencePiece-converted: Llama 2, Mistral, Gemma, Phi-3) ->
    `llama`; byte-level BPE (GPT-2 style: Llama 3, Qwen) -> `gpt2` with merges and `tokenizer.ggml.pre`
    named from its split regex. MissingTokenizerError when the folder has no tokenizer.json.

    Example:
        >>> import json, os, tempfile
        >>> from tokenizers import Tokenizer, models, pre_tokenizers, decoders
        >>> d = tempfile.mkdtemp()
        >>> t = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
        >>> t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False); t.decoder = decoders.ByteLevel()
        >>> t.save(os.path.join(d, "tokenizer.json"))
        >>> md = gguf_tokenizer_metadata(d, "llama")
        >>> md["tokenizer.ggml.model"].value, md["tokenizer.ggml.merges"].value
        ('gpt2', ['a b'])
    """
    from gguf.constants import GGUFValueType as T

    from .gguf_writer import GGUFValue

    folder = os.fspath(folder)
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        others = [f for f in ("tokenizer.model", "vocab.json", "merges.txt", "tekken.json")
                  if os.path.isfile(os.path.join(folder, f))]
        hint = (f" (it has {', '.join(others)}: only tokenizer.json is read; save the tokenizer with a fast "
                "tokenizer to write one)") if others else ""
        raise MissingTokenizerError(f"{folder}: no tokenizer.json{hint}; pass tokenizer=False (--no-tokenizer) "
                                    "to write the GGUF without tokenizer metadata (llama.cpp cannot run it then)")
    doc = _read_json(path)
    tcfg_path = os.path.join(folder, "tokenizer_config.json")
    tcfg = _read_json(tcfg_path) if os.path.isfile(tcfg_path) else {}
    model = doc.get("model") or {}
    if model.get("type") != "BPE":
        raise TokenizerConversionError(f"{path}: model type {model.get('type')!r} is not supported for GGUF "
                                       "export (supported: BPE with byte fallback, byte-level BPE)")
    vocab = model.get("vocab") or {}
    added = sorted(doc.get("added_tokens") or [], key=lambda a: a["id"])
    size = max([*vocab.values(), *(a["id"] for a in added)], default=-1) + 1
    tokens: list[str | None] = [None] * size
    for t, i in vocab.items():
        tokens[i] = t
    types = [NORMAL] * size
    for a in added:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = CONTROL if a.get("special") else USER_DEFINED
    holes = [i for i, t in enumerate(tokens) if t is None]
    for i in holes:  # ids no token uses: llama.cpp needs a dense list
        tokens[i] = f"[PAD{i}]"
        types[i] = UNUSED
    raw_merges = model.get("merges") or []
    merges = [m if isinstance(m, str) else " ".join(m) for m in raw_merges]
    md: dict[str, GGUFValue] = {}

    def special_id(name: str):
        tok = _token_str(tcfg.get(name))
        if tok is None:
            return None
        try:
            return tokens.index(tok)
        except ValueError:
            return None

    byte_fallback = bool(model.get("byte_fallback"))
    if byte_fallback:
        md["tokenizer.ggml.model"] = GGUFValue("llama", T.STRING)
        md["tokenizer.ggml.pre"] = GGUFValue("default", T.STRING)
        gemma = arch in _GEMMA_ARCHS
        unk = special_id("unk_token")
        first_normal = None
        scores = []
        for i, t in enumerate(tokens):
            if types[i] == NORMAL and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
                types[i] = BYTE
            if gemma and types[i] == NORMAL and len(t) > 1 and set(t) == {"\u2581"}:
                # Gemma's own spelling of space runs (undone on the way in); like its newline runs, they
                # are user-defined pieces in Gemma's SentencePiece model.
                tokens[i] = " " * len(t)
                types[i] = USER_DEFINED
            if i == unk and not gemma:
                types[i] = UNKNOWN
            if types[i] == NORMAL:
                # SentencePiece scores rank pieces; ids follow that rank in converted vocabularies, so
                # -(id - first) keeps llama.cpp's merge priority equal to the BPE merge order.
                if first_normal is None:
                    first_normal = i
                scores.append(float(-(i - first_normal)))
            else:
                scores.append(0.0 if types[i] == BYTE else -1000.0)
        md["tokenizer.ggml.tokens"] = GGUFValue(tokens, T.ARRAY, T.STRING)
        md["tokenizer.ggml.scores"] = GGUFValue(scores, T.ARRAY, T.FLOAT32)
        md["tokenizer.ggml.token_type"] = GGUFValue(types, T.ARRAY, T.INT32)
        prefix = _metaspace_prefix(doc)
        if prefix is not None:
            md["tokenizer.ggml.add_space_prefix"] = GGUFValue(prefix, T.BOOL)
    else:
        md["tokenizer.ggml.model"] = GGUFValue("gpt2", T.STRING)
        regexes = _split_regexes(doc.get("pre_tokenizer"))
        pre = next((_SPLIT_TO_PRE[r] for r in regexes if r in _SPLIT_TO_PRE), None)
        if pre is None and regexes:
            raise TokenizerConversionError(
                f"{path}: the pre-tokenizer's split regex {regexes[0][:80]!r} is not one llama.cpp knows "
                f"(known: {', '.join(sorted(set(_SPLIT_TO_PRE.values())))})")
        md["tokenizer.ggml.pre"] = GGUFValue(pre or "gpt-2", T.STRING)
        md["tokenizer.ggml.tokens"] = GGUFValue(tokens, T.ARRAY, T.STRING)
        md["tokenizer.ggml.token_type"] = GGUFValue(types, T.ARRAY, T.INT32)
        md["tokenizer.ggml.merges"] = GGUFValue(merges, T.ARRAY, T.STRING)
    for name, key in _NAMED.items():
        i = special_id(name)
        if i is not None:
            md[f"tokenizer.ggml.{key}"] = GGUFValue(i, T.UINT32)
    add_bos, add_eos = _post_processor_adds(doc, tcfg)
    md["tokenizer.ggml.add_bos_token"] = GGUFValue(add_bos, T.BOOL)
    md["tokenizer.ggml.add_eos_token"] = GGUFValue(add_eos, T.BOOL)
    template = tcfg.get("chat_template")
    if template is None:
        jinja = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as fh:
                template = fh.read()
    if isinstance(template, list):  # named templates: llama.cpp reads the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if isinstance(template, str):
        md["tokenizer.chat_template"] = GGUFValue(template, T.STRING)
    return md


def _metaspace_prefix(doc: dict) -> bool | None:
    pre = doc.get("pre_tokenizer")
    if isinstance(pre, dict) and pre.get("type") == "Metaspace":
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
    """(add_bos, add_eos): tokenizer_config.json's flags when given, else what the post-processor inserts."""
    bos, eos = _token_str(tcfg.get("bos_token")), _token_str(tcfg.get("eos_token"))
    pp = doc.get("post_processor") or {}
    single = []
    if pp.get("type") == "TemplateProcessing":
        single = [p["SpecialToken"]["id"] for p in pp.get("single", []) if "SpecialToken" in p]
    elif pp.get("type") == "Sequence":
        for sub in pp.get("processors", []):
            if sub.get("type") == "TemplateProcessing":
                single = [p["SpecialToken"]["id"] for p in sub.get("single", []) if "SpecialToken" in p]
    add_bos = tcfg.get("add_bos_token")
    add_eos = tcfg.get("add_eos_token")
    if add_bos is None:
        add_bos = bool(single) and bos is not None and single[0] == bos
    if add_eos is None:
        add_eos = bool(single) and eos is not None and single[-1] == eos
    return bool(add_bos), bool(add_eos)


def write_tokenizer_files(tokenizer, config: Mapping[str, Any]) -> dict[str, bytes]:
    """`{"tokenizer.json": bytes, "tokenizer_config.json": bytes}` for a built tokenizer and its config."""
    return {
        "tokenizer.json": tokenizer.to_str(pretty=False).encode("utf-8"),
        "tokenizer_config.json": (json.dumps(dict(config), indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
    }
