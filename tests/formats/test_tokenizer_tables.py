"""The tokenizer converters' shared tables (formats/tokenizer_tables.py).

The SentencePiece dialect of each GGUF architecture comes from the identity table's `tokenizer` column; these
tests hold it to transformers' own GGUF tokenizer loader (an independent table of the same fact), show that the
dialect reaches both converters' output.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")

from lazyweights.formats import arch_identity, tokenizer_tables, tokenizer_to_gguf, tokenizer_to_hf  # noqa: E402
from lazyweights.formats.tokenizer_tables import (  # noqa: E402
    UNROWED_DIALECTS,
    sentencepiece_dialect,
    special_token_keys,
)


def test_every_row_dialect_is_read_from_the_identity_table():
    rows = list(arch_identity.IDENTITIES.values())
    by_gguf: dict[str, set[str]] = {}
    for row in rows:
        by_gguf.setdefault(row.gguf, set()).add(row.tokenizer)
    for arch, dialects in by_gguf.items():
        # rows sharing a GGUF architecture must agree: a GGUF file names the architecture, not the row
        assert len(dialects - {""}) <= 1, (arch, dialects)
        assert sentencepiece_dialect(arch) == max(dialects), arch
    assert {a for a, d in by_gguf.items() if "gemma" in d} == {"gemma", "gemma2", "gemma3"}
    assert {a for a, d in by_gguf.items() if "phi3" in d} == {"phi3"}


def test_unrowed_dialects_are_llamacpp_archs_without_a_row():
    archs = set(gguf.MODEL_ARCH_NAMES.values())
    rowed = {row.gguf for row in arch_identity.IDENTITIES.values()}
    for arch, dialect in UNROWED_DIALECTS.items():
        assert arch in archs, arch  # a name llama.cpp writes
        # once arch_identity has a row for it, the row's column is the one place: drop the entry here
        assert arch not in rowed, f"{arch} has an identity row now: remove it from UNROWED_DIALECTS"
        assert sentencepiece_dialect(arch) == dialect
    # the set the converters kept by hand before the table (gemma3n: llama.cpp's Gemma3NModel uses Gemma 3's vocab)
    assert {a for a in archs if sentencepiece_dialect(a) == "gemma"} == {"gemma", "gemma2", "gemma3", "gemma3n"}
    assert sentencepiece_dialect(None) == sentencepiece_dialect("") == sentencepiece_dialect("llama") == ""


def test_dialects_agree_with_transformers_gguf_loader():
    """transformers builds a GGUF `llama` tokenizer per architecture from its own table; every architecture it
    names there and a row of ours has gets the same dialect from ours."""
    pytest.importorskip("transformers")
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_SENTENCEPIECE_BUILDERS
    except ImportError:
        pytest.skip("this transformers has no GGUF_SENTENCEPIECE_BUILDERS table")
    rowed = {row.gguf for row in arch_identity.IDENTITIES.values()}
    theirs = {arch: builder.__name__.removesuffix("_tokenizer")
              for arch, builder in GGUF_SENTENCEPIECE_BUILDERS.items()}
    assert theirs, "transformers' table is empty"
    for arch, dialect in theirs.items():
        if arch in rowed:
            assert sentencepiece_dialect(arch) == dialect, (arch, dialect)
    for arch in rowed:
        if sentencepiece_dialect(arch):
            assert arch in theirs, arch  # we give it a dialect transformers' loader does not


def test_special_token_keys_are_gguf_constants():
    k = gguf.Keys.Tokenizer
    assert special_token_keys() == {"bos_token": k.BOS_ID, "eos_token": k.EOS_ID, "unk_token": k.UNK_ID,
                                    "pad_token": k.PAD_ID}
    keys = {v for v in vars(k).values() if isinstance(v, str)}
    # the three keys spelled by hand are exactly those gguf-py has no constant for
    for key in (tokenizer_tables.BERT_LOWERCASE_KEY, tokenizer_tables.BERT_STRIP_ACCENTS_KEY,
                tokenizer_tables.LEGACY_CLS_ID_KEY):
        assert key.startswith("tokenizer.ggml.") and key not in keys


def _gemma_style_folder(tmp_path):
    """A SentencePiece-converted BPE whose vocabulary has a run of "▁▁" (Gemma spells space runs that way)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{i:02X}>": 3 + i for i in range(256)}}
    for piece in ("\u2581", "a", "b", "\u2581a", "ab", "\u2581\u2581"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [("\u2581", "a"), ("a", "b"), ("\u2581", "\u2581")], byte_fallback=True,
                               unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return tmp_path, vocab["\u2581\u2581"]


@pytest.mark.parametrize("arch", ["gemma3", "gemma3n", "llama", "phi3"])
def test_the_dialect_reaches_both_directions(tmp_path, arch):
    """HF -> GGUF: only the gemma dialect stores the "▁▁" piece as two real spaces, user-defined (llama.cpp's
    Gemma vocabulary). GGUF -> HF: gemma gets Gemma's normalizer + split, phi3 a Prepend normalizer, plain
    SentencePiece a Metaspace pre-tokenizer."""
    folder, run_id = _gemma_style_folder(tmp_path)
    md = tokenizer_to_gguf.gguf_tokenizer_metadata(folder, arch)
    tokens = md[gguf.Keys.Tokenizer.LIST].value
    types = md[gguf.Keys.Tokenizer.TOKEN_TYPE].value
    gemma = sentencepiece_dialect(arch) == "gemma"
    assert (tokens[run_id], types[run_id]) == (("  ", tokenizer_tables.USER_DEFINED) if gemma
                                               else ("\u2581\u2581", tokenizer_tables.NORMAL))
    back, _ = tokenizer_to_hf.tokenizer_from_gguf({"general.architecture": arch,
                                                   **{k: v.value for k, v in md.items()}})
    spec = json.loads(back.to_str())
    normalizer = spec["normalizer"] or {}
    pre = spec["pre_tokenizer"] or {}
    if gemma:
        assert normalizer["type"] == "Replace" and pre["type"] == "Split"
    elif arch == "phi3":
        assert [n["type"] for n in normalizer["normalizers"]] == ["Prepend", "Replace"] and not pre
    else:
        assert not normalizer and pre["type"] == "Metaspace"
    assert back.encode("ab a").tokens[:1] == (["ab"] if gemma else ["\u2581a"])
