"""GGUF -> Hugging Face tokenizer: `tokenizer.ggml.*` metadata -> `tokenizer.json` + `tokenizer_config.json`.

A GGUF file carries its tokenizer as metadata (llama.cpp's `gguf-py/gguf/vocab.py` writes it); a Hugging Face
folder carries a `tokenizers` serialization. `tokenizer_from_gguf` builds it with Hugging Face's `tokenizers`
library alone (transformers is not needed at run time): the same backend tokenizer transformers builds in its
own GGUF loader (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`), so a folder we write tokenizes
exactly as `AutoTokenizer.from_pretrained(dir, gguf_file=...)` does (tests/adapters/test_hf_export.py holds that):

    tokenizer.ggml.model   pipeline
    llama                  SentencePiece-style BPE with byte fallback, Metaspace pre-tokenizer ("first")
      (dialect gemma)      Gemma's: Replace(" " -> "▁") normalizer, split on spaces; multi-space tokens
                           respelled "▁▁..."; merges derived from token order (Gemma's scores do not
                           follow its merge order)
      (dialect phi3)       Prepend("▁") + Replace normalizer, no pre-tokenizer
    gpt2                   byte-level BPE with the file's merges, its pre-tokenizer split regexes chosen by
                           `tokenizer.ggml.pre` (llama-bpe, qwen2, gpt-4o, starcoder, deepseek-v3, ...)
    t5                     Unigram with the file's scores, precompiled charsmap and Metaspace
    bert                   WordPiece: '▁word' -> 'word', 'piece' -> '##piece'; BertNormalizer; [CLS] $A [SEP]

The dialect is the architecture's (`tokenizer_tables.sentencepiece_dialect`, from the identity table). Control
tokens (type 3) become special added tokens, user-defined ones (type 4) plain added tokens. The written
`tokenizer_config.json` names `PreTrainedTokenizerFast`, so transformers (4.x and 5.x) loads `tokenizer.json`
verbatim instead of re-deriving a pipeline from a model class. The reverse direction is
`lazyweights.formats.tokenizer_to_gguf`.

Example:
    >>> from lazyweights.formats.tokenizer_to_hf import tokenizer_from_gguf
    >>> md = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2",
    ...       "tokenizer.ggml.tokens": ["a", "b", "ab", "<|end|>"], "tokenizer.ggml.token_type": [1, 1, 1, 3],
    ...       "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 3}
    >>> tok, cfg = tokenizer_from_gguf(md)
    >>> tok.encode("abab<|end|>").ids, cfg["eos_token"]
    ([2, 2, 3], '<|end|>')
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..core.errors import TokenizerConversionError
from .tokenizer_tables import (
    BERT_LOWERCASE_KEY,
    BERT_STRIP_ACCENTS_KEY,
    BYTE_LEVEL_PRE_TOKENIZERS,
    CONTROL,
    GPT2_REGEX,
    IGNORE_MERGES_PRE,
    LEGACY_CLS_ID_KEY,
    NORMAL,
    PRE_ALIASES,
    PRE_TOKENIZER_SPLITS,
    UNKNOWN,
    USER_DEFINED,
    sentencepiece_dialect,
    special_token_keys,
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (byte-level BPE spells every token with it).

    >>> table = bytes_to_unicode()
    >>> len(table), table[ord("a")], table[ord(" ")]
    (256, 'a', 'Ġ')
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


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
    dialect = sentencepiece_dialect(arch)  # the identity table's tokenizer column
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
                    else None) for name, key in special_token_keys().items()}
    cfg: dict[str, Any] = {}
    byte_level = model == "gpt2"
    if model == "llama":
        if dialect == "gemma":
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
            if dialect == "phi3":
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
            raise TokenizerConversionError(f"{Keys.Tokenizer.MODEL} is 'gpt2' but the GGUF metadata has no "
                                           f"{Keys.Tokenizer.MERGES}")
        pre_name = metadata.get(Keys.Tokenizer.PRE)
        tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False, ignore_merges=pre_name in IGNORE_MERGES_PRE))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        split = PRE_TOKENIZER_SPLITS.get(str(pre_name))
        regexes = [split] if split is not None else _pre_regexes(pre_name)
        if regexes and regexes != [GPT2_REGEX]:
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
                        if key in metadata else None) for name, key in special_token_keys().items()}
        extra_named = {}
    else:
        raise TokenizerConversionError(
            f"{Keys.Tokenizer.MODEL} = {model!r} is not supported (supported: 'llama' (SentencePiece-style, also "
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
    lower = bool(metadata.get(BERT_LOWERCASE_KEY, True))
    strip = bool(metadata.get(BERT_STRIP_ACCENTS_KEY, lower))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=strip,
                                                lowercase=lower)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _bert_post_processor(tok, metadata: Mapping[str, Any], tokens: list[str], cfg: dict) -> None:
    """`[CLS] $A [SEP]` (llama.cpp's bert tokenizer adds BOS and SEP) and BERT's tokenizer_config names."""
    from gguf.constants import Keys
    from tokenizers import processors

    cls_id = int(metadata.get(Keys.Tokenizer.BOS_ID, metadata.get(LEGACY_CLS_ID_KEY, 101)))
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
    cfg["do_lower_case"] = bool(metadata.get(BERT_LOWERCASE_KEY, True))
    cfg.pop("add_bos_token", None)
    cfg.pop("add_eos_token", None)



def write_tokenizer_files(tokenizer, config: Mapping[str, Any]) -> dict[str, bytes]:
    """`{"tokenizer.json": bytes, "tokenizer_config.json": bytes}` for a built tokenizer and its config (the
    bytes a Hugging Face folder holds: compact tokenizer.json, indented UTF-8 tokenizer_config.json).

    >>> from tokenizers import Tokenizer, models
    >>> files = write_tokenizer_files(Tokenizer(models.BPE({"a": 0}, [])), {"eos_token": "a"})
    >>> sorted(files), files["tokenizer_config.json"].splitlines()
    (['tokenizer.json', 'tokenizer_config.json'], [b'{', b'  "eos_token": "a"', b'}'])
    """
    return {
        "tokenizer.json": tokenizer.to_str(pretty=False).encode("utf-8"),
        "tokenizer_config.json": (json.dumps(dict(config), indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
    }
