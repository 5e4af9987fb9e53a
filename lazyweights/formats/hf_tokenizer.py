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
    gpt2                   byte-level BPE with the file's merges, its pre-tokenizer split regexes chosen by
                           `tokenizer.ggml.pre` (llama-bpe, qwen2, gpt-4o, starcoder, deepseek-v3, ...)
    t5                     Unigram with the file's scores, precompiled charsmap and Metaspace
    bert                   WordPiece: '▁word' -> 'word', 'piece' -> '##piece'; BertNormalizer; [CLS] $A [SEP]

Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added tokens. The
written `tokenizer_config.json` names `PreTrainedTokenizerFast`, so transformers (4.x and 5.x) loads
`tokenizer.json` verbatim instead of re-deriving a pipeline from a model class.

HF -> GGUF (`gguf_tokenizer_metadata`) reads `tokenizer.json` (+ `tokenizer_config.json`) and writes the
keys llama.cpp reads, typed as gguf-py's `GGUFWriter` writes them (tokens STRING[], scores FLOAT32[],
token_type INT32[], merges STRING[], ids UINT32, add_* BOOL, chat template STRING). Everything comes from the
file's structure: `tokenizer.ggml.pre` is the llama.cpp regex set equal to the pre-tokenizer's split regexes
(`BYTE_LEVEL_PRE_TOKENIZERS`), never a hash; a part llama.cpp cannot reproduce is a
TokenizerNotExpressibleError naming it (tests/formats/test_hf_tokenizer_llamacpp.py judges by llama.cpp).

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

import base64
import json
import os
import re
from typing import Any, Mapping, NamedTuple

from ..core.errors import MissingTokenizerError, TokenizerConversionError, TokenizerNotExpressibleError

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
# convert_hf_to_gguf.py `get_vocab_base_pre` writes), for the single-regex names; GGUF -> HF reads the others
# from BYTE_LEVEL_PRE_TOKENIZERS / PRE_ALIASES, and HF -> GGUF names a tokenizer from those tables.
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "pixtral": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    "gpt-4o": _GPT4O_SPLIT, "llama4": _GPT4O_SPLIT,
}
# The tokenizer.ggml.pre names llama.cpp tokenizes with ignore_merges (a word that is a vocabulary token is
# looked up whole before any merge: llama_vocab::impl::load in src/llama-vocab.cpp).
IGNORE_MERGES_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                               "lfm2", "jina-v5-nano", "minicpm5", "youtu", "tekken", "glm4", "glm5",
                               "granite-embed-multi-97m"})
_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})
_NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")


def _named_keys() -> dict[str, str]:
    """Each of `_NAMED` (tokenizer_config's special tokens) -> the GGUF key of its id (gguf.Keys.Tokenizer)."""
    from gguf.constants import Keys

    k = Keys.Tokenizer
    return {"bos_token": k.BOS_ID, "eos_token": k.EOS_ID, "unk_token": k.UNK_ID, "pad_token": k.PAD_ID}


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
    from gguf.constants import Keys
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    arch = arch or metadata.get(Keys.General.ARCHITECTURE) or ""
    model = metadata.get(Keys.Tokenizer.MODEL)
    if Keys.Tokenizer.LIST not in metadata or model is None:
        missing = [k for k in (Keys.Tokenizer.MODEL, Keys.Tokenizer.LIST) if k not in metadata]
        raise TokenizerConversionError(f"the GGUF metadata has no tokenizer: missing {', '.join(missing)} "
                                       "(pass tokenizer=False / --no-tokenizer to write the folder without one)")
    tokens = [str(t) for t in _as_list(metadata[Keys.Tokenizer.LIST])]
    spelled_as_stored = tokens  # added tokens are matched in the text as the file spells them
    types = _as_list(metadata.get(Keys.Tokenizer.TOKEN_TYPE) or [])
    merges_md = metadata.get(Keys.Tokenizer.MERGES)
    merges = None if merges_md is None else [tuple(m.split(" ", 1)) for m in _as_list(merges_md)]
    names = {name: (tokens[int(metadata[key])]
                    if key in metadata and 0 <= int(metadata[key]) < len(tokens)
                    else None) for name, key in _named_keys().items()}
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
                scores = _as_list(metadata.get(Keys.Tokenizer.SCORES) or [0.0] * len(tokens))
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
        cfg["add_bos_token"] = bool(metadata.get(Keys.Tokenizer.ADD_BOS, True))
    elif byte_level:
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
                 for i, t in enumerate(tokens)}
        if merges is None:
            raise TokenizerConversionError("tokenizer.ggml.model is 'gpt2' but the GGUF metadata has no "
                                           "tokenizer.ggml.merges")
        pre_name = metadata.get(Keys.Tokenizer.PRE)
        tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False, ignore_merges=pre_name in IGNORE_MERGES_PRE))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        split = PRE_TOKENIZER_SPLITS.get(str(pre_name))
        regexes = [split] if split is not None else _pre_regexes(pre_name)
        if regexes and regexes != [_GPT2_REGEX]:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                *(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        extra_named = {}
        if Keys.Tokenizer.ADD_BOS in metadata:
            cfg["add_bos_token"] = bool(metadata[Keys.Tokenizer.ADD_BOS])
    elif model == "t5":
        tok = _unigram_from_gguf(metadata, tokens, types)
        extra_named = {}
        # llama.cpp's defaults for a t5 vocabulary: no BOS, EOS appended
        cfg["add_bos_token"] = bool(metadata.get(Keys.Tokenizer.ADD_BOS, False))
        cfg["add_eos_token"] = bool(metadata.get(Keys.Tokenizer.ADD_EOS, True))
    elif model == "bert":
        tok = _wordpiece_from_gguf(metadata, tokens, types)
        tokens = spelled_as_stored = [_unphantom(t, int(ty)) for t, ty in zip(tokens, types)]
        names = {name: (tokens[int(metadata[key])]
                        if key in metadata else None) for name, key in _named_keys().items()}
        extra_named = {}
    else:
        raise TokenizerConversionError(
            f"tokenizer.ggml.model = {model!r} is not supported (supported: 'llama' (SentencePiece-style, also "
            "Gemma and Phi-3), 'gpt2' (byte-level BPE), 't5' (Unigram), 'bert' (WordPiece)); pass "
            "tokenizer=False / --no-tokenizer to skip it")
    if Keys.Tokenizer.ADD_EOS in metadata:
        cfg["add_eos_token"] = bool(metadata[Keys.Tokenizer.ADD_EOS])

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
    if model == "bert":
        _bert_post_processor(tok, metadata, tokens, cfg)
        cfg["clean_up_tokenization_spaces"] = True
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        return tok, cfg
    bos, eos = cfg.get("bos_token"), cfg.get("eos_token")
    add_bos = bool(cfg.get("add_bos_token")) and bos is not None
    add_eos = bool(cfg.get("add_eos_token")) and eos is not None
    single = " ".join(([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else []))
    pair = " ".join([single] + ([f"{bos}:1"] if add_bos else []) + ["$B:1"] + ([f"{eos}:1"] if add_eos else []))
    specials = ([(str(bos), tok.token_to_id(str(bos)))] if add_bos else []) + \
        ([(str(eos), tok.token_to_id(str(eos)))] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

    cfg["add_bos_token"] = bool(cfg.get("add_bos_token", False))
    cfg["add_eos_token"] = bool(cfg.get("add_eos_token", False))
    template = metadata.get(Keys.Tokenizer.CHAT_TEMPLATE)
    if isinstance(template, str):
        cfg["chat_template"] = template
    cfg["clean_up_tokenization_spaces"] = False
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    return tok, cfg


# Other names llama.cpp's loader accepts for the same regex sets (llama_vocab::impl::load), GGUF -> HF only.
PRE_ALIASES: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano",
                     "glm4", "glm5"), "llama-bpe"),
    **dict.fromkeys(("dbrx", "chatglm-bpe"), "smaug-bpe"),
    **dict.fromkeys(("deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open", "megrez",
                     "grok-2"), "qwen2"),
    **dict.fromkeys(("phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
                     "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4", "jina-v1-en",
                     "jina-v2-code", "roberta-bpe"), "gpt-2"),
    **dict.fromkeys(("refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"), "starcoder"),
    **dict.fromkeys(("llama4", "kanana2", "talkie", "minimax-m2"), "gpt-4o"),
    **dict.fromkeys(("hunyuan-dense", "joyai-llm", "hy_v4"), "deepseek-v3"),
    **dict.fromkeys(("poro-chat", "gpt3-finnish"), "bloom"),
    "cohere2moe": "tiny_aya",
}


def _pre_regexes(name: str | None) -> list[str]:
    """The split regexes llama.cpp applies for a byte-level `tokenizer.ggml.pre` name (empty when unknown)."""
    name = PRE_ALIASES.get(str(name), name)
    for p in BYTE_LEVEL_PRE_TOKENIZERS:
        if p.name == name:
            return list(p.regexes)
    return []


def _unigram_from_gguf(metadata: Mapping[str, Any], tokens: list[str], types: list):
    """llama.cpp's `t5` vocabulary (SentencePiece Unigram) as a tokenizers Unigram pipeline."""
    from gguf.constants import Keys
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    scores = _as_list(metadata.get(Keys.Tokenizer.SCORES) or [0.0] * len(tokens))
    unk = metadata.get(Keys.Tokenizer.UNK_ID)
    if unk is None:
        unk = next((i for i, ty in enumerate(types) if int(ty) == UNKNOWN), None)
    tok = Tokenizer(Unigram([(t, float(s)) for t, s in zip(tokens, scores)], unk_id=None if unk is None else int(unk),
                            byte_fallback=False))
    norms: list[Any] = []
    charsmap = metadata.get(Keys.Tokenizer.PRECOMPILED_CHARSMAP)
    if charsmap is not None and len(_as_list(charsmap)):
        norms.append(normalizers.Precompiled(bytes(int(b) & 0xFF for b in _as_list(charsmap))))
    collapse = bool(metadata.get(Keys.Tokenizer.REMOVE_EXTRA_WS, False))
    if collapse:
        norms.append(normalizers.Replace(Regex(" {2,}"), " "))
    tok.normalizer = normalizers.Sequence(norms) if norms else None
    scheme = "always" if bool(metadata.get(Keys.Tokenizer.ADD_PREFIX, True)) else "never"
    meta = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=True)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), meta]) if collapse else meta
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=True)
    return tok


def _unphantom(token: str, kind: int) -> str:
    """A `bert` GGUF token in WordPiece's spelling: '\u2581word' -> 'word', 'piece' -> '##piece'."""
    if kind != NORMAL or (token.startswith("[") and token.endswith("]")):
        return token
    return token[1:] if token.startswith("\u2581") else "##" + token


def _wordpiece_from_gguf(metadata: Mapping[str, Any], tokens: list[str], types: list):
    """llama.cpp's `bert` vocabulary (phantom-space WordPiece) as a tokenizers BERT pipeline."""
    from gguf.constants import Keys
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    spelled = [_unphantom(t, int(ty)) for t, ty in zip(tokens, types)]
    unk = metadata.get(Keys.Tokenizer.UNK_ID)
    unk_token = spelled[int(unk)] if unk is not None else "[UNK]"
    tok = Tokenizer(WordPiece({t: i for i, t in enumerate(spelled)}, unk_token=unk_token,
                              continuing_subword_prefix="##", max_input_chars_per_word=100))
    lower = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", lower))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=strip,
                                                lowercase=lower)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


# llama.cpp's bert vocabulary keys `tokenizer.ggml.normalizer.lowercase` / `.strip_accents` and the legacy
# `tokenizer.ggml.cls_token_id` have no gguf.Keys constant (gguf-py does not write them): they stay strings here.
def _bert_post_processor(tok, metadata: Mapping[str, Any], tokens: list[str], cfg: dict) -> None:
    """`[CLS] $A [SEP]` (llama.cpp's bert tokenizer adds BOS and SEP) and BERT's tokenizer_config names."""
    from gguf.constants import Keys
    from tokenizers import processors

    cls_id = int(metadata.get(Keys.Tokenizer.BOS_ID, metadata.get("tokenizer.ggml.cls_token_id", 101)))
    sep_id = int(metadata.get(Keys.Tokenizer.SEP_ID, 102))
    cls, sep = tokens[cls_id], tokens[sep_id]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)])
    cfg.pop("bos_token", None)
    cfg.pop("eos_token", None)
    cfg["cls_token"], cfg["sep_token"] = cls, sep
    mask = metadata.get(Keys.Tokenizer.MASK_ID)
    if mask is not None:
        cfg["mask_token"] = tokens[int(mask)]
    cfg["do_lower_case"] = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
    cfg.pop("add_bos_token", None)
    cfg.pop("add_eos_token", None)


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


class _Pre(NamedTuple):
    """One `tokenizer.ggml.pre` name: the regexes llama.cpp splits with, in order, and its ignore_merges flag."""

    name: str
    ignore_merges: bool
    regexes: tuple[str, ...]


# llama.cpp's byte-level pre-tokenizers (src/llama-vocab.cpp, `llm_tokenizer_bpe`: regex_exprs per pre type;
# `llama_vocab::impl::load`: the names and their ignore_merges), one name per distinct (regexes, ignore_merges).
# Regexes are spelled as tokenizer.json spells them (llama.cpp's "original regex" comments) where llama.cpp
# rewrote them; `_canonical_regex` makes the two spellings equal. A tokenizer matches a name by structure alone:
# no hash of its output is ever consulted.
BYTE_LEVEL_PRE_TOKENIZERS: tuple[_Pre, ...] = (
    _Pre("gpt-2", False, (
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    )),
    _Pre("llama-bpe", True, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n"
        r"]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("smaug-bpe", False, (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("qwen2", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s"
        r"*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("qwen35", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}"
        r"]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("tekken", True, (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}"
        r"\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}"
        r"]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("gpt-4o", False, (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'r"
        r"e|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}"
        r"\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s"
        r"+(?!\S)|\s+",
    )),
    _Pre("starcoder", False, (
        r"\p{N}",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    )),
    _Pre("deepseek-llm", False, (
        r"[\r\n]",
        r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕ"
        r"ἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛ"
        r"Ꜣ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+",
    )),
    _Pre("deepseek-coder", False, (
        r"[\r\n]",
        r"\s?\p{L}+",
        r"\s?\p{P}+",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}",
    )),
    _Pre("deepseek-v3", False, (
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?['
        r"\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("spark2_5", False, (
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?['
        r"\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
        r"\p{N}",
    )),
    _Pre("youtu", True, (
        r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[t"
        r"T]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{L"
        r"o}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'["
        r"dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("falcon", False, (
        r"[\p{P}\$\+<=>\^~\|`]+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        r"[0-9][0-9][0-9]",
    )),
    _Pre("jais-2", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n"
        r"]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}"
        r"(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
    )),
    _Pre("bloom", False, (
        r" ?[^(\s|.,!?…。，、।۔،)]+",
    )),
    _Pre("viking", False, (
        r" ?[^(\s|.,!?…。，、।۔،)]+",
        r"\p{N}",
    )),
    _Pre("tiny_aya", False, (
        r"\d{1,3}(?=(?:\d{3})*\b)",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'r"
        r"e|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}"
        r"\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s"
        r"+(?!\S)|\s+",
    )),
    _Pre("seed-coder", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s"
        r"*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("ufakzeka", False, (
        r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("laguna", False, (
        r"[^\n]+|[\n]+",
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("exaone-moe", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| "
        r"?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
    )),
    _Pre("minicpm5", True, (
        r"\p{N}{1,3}",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    _Pre("default", False, (
        r"[\p{P}\$\+<=>\^~\|]+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        r"\p{N}+",
        r"[0-9][0-9][0-9]",
    )),
)
_GPT2_REGEX = BYTE_LEVEL_PRE_TOKENIZERS[0].regexes[0]
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


_PRE_BY_REGEXES: dict[tuple[str, ...], list[_Pre]] = {}
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
                regexes.append(_GPT2_REGEX)
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
    TokenizerNotExpressibleError naming it; MissingTokenizerError when the folder has no tokenizer.json.

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
    doc = _read_json(path)
    tcfg_path = os.path.join(folder, "tokenizer_config.json")
    tcfg = _read_json(tcfg_path) if os.path.isfile(tcfg_path) else {}
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

    ids: dict[str, int | None] = {name: tcfg_id(name) for name in _NAMED}
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
    for name, key in _named_keys().items():
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
    gemma = arch in _GEMMA_ARCHS
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
    md["tokenizer.ggml.normalizer.lowercase"] = GGUFValue(lowercase, T.BOOL)
    md["tokenizer.ggml.normalizer.strip_accents"] = GGUFValue(strip, T.BOOL)
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


def write_tokenizer_files(tokenizer, config: Mapping[str, Any]) -> dict[str, bytes]:
    """`{"tokenizer.json": bytes, "tokenizer_config.json": bytes}` for a built tokenizer and its config."""
    return {
        "tokenizer.json": tokenizer.to_str(pretty=False).encode("utf-8"),
        "tokenizer_config.json": (json.dumps(dict(config), indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
    }
