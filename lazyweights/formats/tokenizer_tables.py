"""llama.cpp's tokenizer vocabulary, as both tokenizer converters read it: token types, the byte-level
pre-tokenizer regex sets and their names, the special-token id keys, and each architecture's SentencePiece dialect.

`lazyweights.formats.tokenizer_to_gguf` (Hugging Face `tokenizer.json` -> GGUF `tokenizer.ggml.*`) and
`lazyweights.formats.tokenizer_to_hf` (the reverse) share these tables, so a `tokenizer.ggml.pre` name written
one way is read back the same way (tests/formats/test_hf_tokenizer_llamacpp.py checks the tables against each
other and against llama.cpp). The dialect comes from the identity table (`formats/arch_identity.py`,
its `tokenizer` column), never from a list kept here.

Example:
    >>> from lazyweights.formats.tokenizer_tables import BYTE_LEVEL_PRE_TOKENIZERS, PRE_ALIASES, sentencepiece_dialect
    >>> PRE_ALIASES["llama3"], [p.ignore_merges for p in BYTE_LEVEL_PRE_TOKENIZERS if p.name == "llama-bpe"]
    ('llama-bpe', [True])
    >>> sentencepiece_dialect("gemma3"), sentencepiece_dialect("phi3"), sentencepiece_dialect("qwen2")
    ('gemma', 'phi3', '')
"""
from __future__ import annotations

from typing import NamedTuple

from .arch_identity import IDENTITIES

# gguf.TokenType values (gguf-py constants): kept literal so the converters import no gguf at GGUF -> HF time.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6



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


class PreTokenizer(NamedTuple):
    """One `tokenizer.ggml.pre` name: the regexes llama.cpp splits with, in order, and its ignore_merges flag.

    >>> BYTE_LEVEL_PRE_TOKENIZERS[0].name, len(BYTE_LEVEL_PRE_TOKENIZERS[0].regexes)
    ('gpt-2', 1)
    """

    name: str
    ignore_merges: bool
    regexes: tuple[str, ...]


# llama.cpp's byte-level pre-tokenizers (src/llama-vocab.cpp, `llm_tokenizer_bpe`: regex_exprs per pre type;
# `llama_vocab::impl::load`: the names and their ignore_merges), one name per distinct (regexes, ignore_merges).
# Regexes are spelled as tokenizer.json spells them (llama.cpp's "original regex" comments) where llama.cpp
# rewrote them; `tokenizer_to_gguf._canonical_regex` makes the two spellings equal. A tokenizer matches a name by
# structure alone: no hash of its output is ever consulted.
BYTE_LEVEL_PRE_TOKENIZERS: tuple[PreTokenizer, ...] = (
    PreTokenizer("gpt-2", False, (
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    )),
    PreTokenizer("llama-bpe", True, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n"
        r"]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("smaug-bpe", False, (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("qwen2", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s"
        r"*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("qwen35", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}"
        r"]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("tekken", True, (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}"
        r"\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}"
        r"]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("gpt-4o", False, (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'r"
        r"e|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}"
        r"\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s"
        r"+(?!\S)|\s+",
    )),
    PreTokenizer("starcoder", False, (
        r"\p{N}",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    )),
    PreTokenizer("deepseek-llm", False, (
        r"[\r\n]",
        r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕ"
        r"ἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛ"
        r"Ꜣ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+",
    )),
    PreTokenizer("deepseek-coder", False, (
        r"[\r\n]",
        r"\s?\p{L}+",
        r"\s?\p{P}+",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}",
    )),
    PreTokenizer("deepseek-v3", False, (
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?['
        r"\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("spark2_5", False, (
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?['
        r"\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
        r"\p{N}",
    )),
    PreTokenizer("youtu", True, (
        r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[t"
        r"T]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{L"
        r"o}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'["
        r"dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("falcon", False, (
        r"[\p{P}\$\+<=>\^~\|`]+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        r"[0-9][0-9][0-9]",
    )),
    PreTokenizer("jais-2", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n"
        r"]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}"
        r"(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
    )),
    PreTokenizer("bloom", False, (
        r" ?[^(\s|.,!?…。，、।۔،)]+",
    )),
    PreTokenizer("viking", False, (
        r" ?[^(\s|.,!?…。，、।۔،)]+",
        r"\p{N}",
    )),
    PreTokenizer("tiny_aya", False, (
        r"\d{1,3}(?=(?:\d{3})*\b)",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'r"
        r"e|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}"
        r"\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s"
        r"+(?!\S)|\s+",
    )),
    PreTokenizer("seed-coder", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s"
        r"*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("ufakzeka", False, (
        r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("laguna", False, (
        r"[^\n]+|[\n]+",
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("exaone-moe", False, (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| "
        r"?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
    )),
    PreTokenizer("minicpm5", True, (
        r"\p{N}{1,3}",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+",
    )),
    PreTokenizer("default", False, (
        r"[\p{P}\$\+<=>\^~\|]+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        r"\p{N}+",
        r"[0-9][0-9][0-9]",
    )),
)
GPT2_REGEX = BYTE_LEVEL_PRE_TOKENIZERS[0].regexes[0]

# The special tokens tokenizer_config.json names, each with the GGUF key of its id (special_token_keys).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# llama.cpp's bert vocabulary keys and the legacy CLS id key have no gguf.Keys constant (gguf-py does not write
# them): they are spelled here, once.
BERT_LOWERCASE_KEY = "tokenizer.ggml.normalizer.lowercase"
BERT_STRIP_ACCENTS_KEY = "tokenizer.ggml.normalizer.strip_accents"
LEGACY_CLS_ID_KEY = "tokenizer.ggml.cls_token_id"


def special_token_keys() -> dict[str, str]:
    """Each of `SPECIAL_TOKEN_NAMES` (tokenizer_config's special tokens) -> the GGUF key of its id (gguf.Keys).

    >>> special_token_keys()["eos_token"]
    'tokenizer.ggml.eos_token_id'
    """
    from gguf.constants import Keys

    k = Keys.Tokenizer
    return {"bos_token": k.BOS_ID, "eos_token": k.EOS_ID, "unk_token": k.UNK_ID, "pad_token": k.PAD_ID}


# GGUF architectures llama.cpp gives a SentencePiece dialect that no identity row has yet (no record converts
# them). A row in arch_identity with the same `tokenizer` makes its entry here redundant (and
# tests/formats/test_tokenizer_tables.py fails until it is removed).
UNROWED_DIALECTS: dict[str, str] = {"gemma3n": "gemma"}
_DIALECTS: dict[str, str] = {
    **UNROWED_DIALECTS, **{row.gguf: row.tokenizer for row in IDENTITIES.values() if row.tokenizer}}


def sentencepiece_dialect(arch: str | None) -> str:
    """The SentencePiece dialect llama.cpp gives GGUF architecture `arch`'s `llama` tokenizer: "gemma" (spaces
    as "▁" by a normalizer, split on spaces, space runs as user-defined pieces), "phi3" (a "▁" prefix by a
    normalizer, no pre-tokenizer), or "" (the plain Metaspace one, also for an unknown or missing `arch`).

    From the `tokenizer` column of `formats/arch_identity.py` (plus `UNROWED_DIALECTS`).

    >>> sentencepiece_dialect("gemma"), sentencepiece_dialect(None), sentencepiece_dialect("no-such-arch")
    ('gemma', '', '')
    """
    return _DIALECTS.get(arch or "", "")
