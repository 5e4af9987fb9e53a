"""Encoder families as llama.cpp embedding GGUFs, judged by llama.cpp and by transformers.

For each family a tiny random transformers model (hidden 64, 2-3 layers, float32) is saved with a tokenizer of
the kind the family really ships, trained here with the tokenizers library (WordPiece for the BERT-likes,
byte-level BPE for RoBERTa and ModernBERT, Llama 3's byte-level BPE for EuroBERT, Unigram for Jina v3, and for
XLM-RoBERTa a SentencePiece Unigram with its nmt_nfkc charsmap made a fast tokenizer by transformers), and a
sentence-transformers `modules.json` + `1_Pooling/config.json` (mean pooling; CLS for one family, to show the
pooling type follows the folder). Then:

(a) HF -> GGUF (`export_gguf`): the GGUF's architecture, pooling type and causal flag are checked;
(b) llama.cpp tokenizes varied texts to transformers' ids;
(c) llama.cpp's pooled embedding (`Llama(..., embedding=True)`) equals transformers' pooled last hidden state
    (mean over the tokens, or the first token's for CLS): cosine > 0.999 and atol 2e-3, as the MiniLM test, and
    atol 5e-4 (relative to the largest value) since the weights are the same float32 values;
(d) GGUF -> HF (`export_hf_folder`, float32) loads in transformers (`AutoModel`) with the original hidden states,
    and its tokenizer (`AutoTokenizer`, from the GGUF's metadata) gives the original ids.
    A RoBERTa-family GGUF is llama.cpp's `bert` with the position rows before pad_token_id + 1 dropped, so it
    comes back as a BertModel whose positions start at 0: the same hidden states on unpadded input (DistilBERT's
    too, with a zero token-type row: llama.cpp adds none).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402

_CORPUS = ("The quick brown fox jumps over the lazy dog. A sentence about embeddings and similarity. "
           "Café naïve résumé, 1234 numbers! Sentence transformers pool the last hidden states. ") * 20
TEXTS = ["The quick brown fox jumps over the lazy dog.", "A sentence about embeddings and similarity.",
         "Café naïve résumé, 1234 numbers!", "pooling   the hidden  states", "UPPER case, tabs\tand 日本語 🤖",
         "\uff21\uff22\uff23 full-width, no\u00a0break"]
_ENC = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)

# family -> (config class, model class, config kwargs, GGUF architecture, tokenizer kind, pooling)
FAMILIES = {
    "nomic_bert": ("NomicBertConfig", "NomicBertModel", dict(_ENC, max_position_embeddings=128), "nomic-bert",
                   "wordpiece", "mean"),
    "nomic_bert_cls": ("NomicBertConfig", "NomicBertModel", dict(_ENC, max_position_embeddings=128), "nomic-bert",
                       "wordpiece", "cls"),
    "roberta": ("RobertaConfig", "RobertaModel", dict(_ENC, max_position_embeddings=130), "bert", "bpe", "mean"),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", dict(_ENC, max_position_embeddings=130, type_vocab_size=1),
                    "bert", "xlmr-spm", "mean"),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=64, n_layers=2, n_heads=4, hidden_dim=96,
                                                               max_position_embeddings=128), "bert", "wordpiece",
                   "mean"),
    # a 4-token window (local_attention 8: 4 on each side) against longer texts, so a wrong window shows
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(_ENC, num_hidden_layers=3, max_position_embeddings=128,
                                                               local_attention=8, global_attn_every_n_layers=3),
                   "modern-bert", "bpe", "mean"),
    "eurobert": ("EuroBertConfig", "EuroBertModel", dict(_ENC, num_key_value_heads=2, head_dim=16,
                                                         max_position_embeddings=128, mask_token_id=4),
                 "eurobert", "llama-bpe", "mean"),
    "jina_embeddings_v3": ("JinaEmbeddingsV3Config", "JinaEmbeddingsV3Model",
                           dict(_ENC, max_position_embeddings=130, type_vocab_size=1), "jina-bert-v3", "unigram",
                           "mean"),
}
_POOLING_TYPE = {"mean": 1, "cls": 2}
# GGUF -> HF: llama.cpp's `bert` comes back as BERT (RoBERTa's position rows already start at its first position)
_BACK = {"roberta": "bert", "xlm-roberta": "bert", "distilbert": "bert"}


def _wordpiece():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator([_CORPUS], trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def _bpe():
    """RoBERTa's: byte-level BPE, <s> $A </s>, <pad> at id 1 (positions start at 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([_CORPUS], trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>", cls_token="<s>",
                                                sep_token="</s>", mask_token="<mask>")


def _unigram():
    """XLM-RoBERTa's: SentencePiece Unigram with a Metaspace prefix, <s> $A </s>, <pad> at id 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([_CORPUS], trainers.UnigramTrainer(
        vocab_size=200, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>", cls_token="<s>",
                                                sep_token="</s>")


def _llama_bpe():
    """EuroBERT's: Llama 3's byte-level BPE (its split regex), <s> $A </s>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from lazyweights.formats.tokenizer_tables import PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS["llama-bpe"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([_CORPUS], trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>", "<pad>", "<unk>", "<mask>"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")


def _xlmr_sentencepiece(folder):
    """XLM-RoBERTa's real pipeline: a SentencePiece Unigram model (nmt_nfkc charsmap, whitespace collapsed, dummy
    prefix) trained by sentencepiece, made a fast tokenizer by transformers' XLMRobertaTokenizer (fairseq ids:
    <s> 0, <pad> 1, </s> 2, <unk> 3, pieces shifted by one); the tokenizers-trained Unigram without sentencepiece."""
    try:
        import sentencepiece as spm
    except ImportError:
        return _unigram()
    os.makedirs(folder, exist_ok=True)
    text = os.path.join(folder, "train.txt")
    with open(text, "w", encoding="utf-8") as fh:
        fh.write("\n".join([_CORPUS[:200]] * 50 + ["UPPER case, tabs and 日本語 中文"]))
    spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(folder, "sentencepiece.bpe"),
                                   vocab_size=150, model_type="unigram", character_coverage=1.0,
                                   hard_vocab_limit=False, minloglevel=2)
    os.remove(text)
    return transformers.XLMRobertaTokenizer.from_pretrained(folder)


_TOKENIZERS = {"wordpiece": _wordpiece, "bpe": _bpe, "unigram": _unigram, "llama-bpe": _llama_bpe}


@pytest.fixture(scope="module")
def tokenizers_by_kind(tmp_path_factory):
    out = {k: f() for k, f in _TOKENIZERS.items()}
    out["xlmr-spm"] = _xlmr_sentencepiece(str(tmp_path_factory.mktemp("xlmr_spm")))
    return out


def _pooling_folder(folder, mode, dim):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    with open(os.path.join(folder, "modules.json"), "w") as fh:
        json.dump(modules, fh)
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as fh:
        json.dump({"word_embedding_dimension": dim, "pooling_mode_cls_token": mode == "cls",
                   "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False}, fh)


def make_encoder(name, tok, folder):
    cfg_cls, model_cls, kwargs, _, _, pooling = FAMILIES[name]
    special = {"pad_token_id": tok.pad_token_id}
    if tok.bos_token_id is not None:
        special.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg = getattr(transformers, cfg_cls)(**kwargs, **special, vocab_size=len(tok))
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, and matrices large enough for peaked attention, so a
        for p in model.parameters():  # missed transform or a wrong attention window shows
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
            else:
                p.mul_(5.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    _pooling_folder(folder, pooling, model.config.hidden_size)
    return model


def _hidden(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0].float().numpy()


def assert_same_embeddings(path, model, tok, texts, pooling, what, minilm_bound=True):
    """llama.cpp (`embedding=True`) tokenizes each text as `tok` does, and its pooled embedding (`pooling`: mean,
    or cls = the first token) equals the transformers model's pooled last hidden state: cosine > 0.999, within
    5e-4 of the largest value (the same float32 weights: only summation order and ggml's GELU table differ, ~2e-4;
    a window 8x as wide differs by more), and within the MiniLM test's 2e-3 where `minilm_bound`."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, embedding=True, verbose=False, n_threads=2, n_ctx=128)
    try:
        for text in texts:
            ids = tok(text)["input_ids"]
            assert llm.tokenize(text.encode(), add_bos=True, special=False) == ids, (what, text)
            hidden = _hidden(model, ids)
            ref = hidden.mean(0) if pooling == "mean" else hidden[0]
            got = np.asarray(llm.embed(text, normalize=False), dtype=np.float32).reshape(-1)
            cos = float(ref @ got / np.linalg.norm(ref) / np.linalg.norm(got))
            assert cos > 0.999, (what, text, cos)
            if minilm_bound:
                np.testing.assert_allclose(got, ref, rtol=0, atol=2e-3)
            np.testing.assert_allclose(got, ref, rtol=0, atol=5e-4 * max(1.0, float(np.abs(ref).max())))
    finally:
        llm.close()


def _field(r, key):
    f = r.fields[key]
    return f.contents() if hasattr(f, "contents") else f.parts[-1][0]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_encoder_both_ways(name, tokenizers_by_kind, tmp_path):
    pytest.importorskip("llama_cpp")
    _, _, _, arch, kind, pooling = FAMILIES[name]
    tok = tokenizers_by_kind[kind]
    hf = str(tmp_path / "hf")
    model = make_encoder(name, tok, hf)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert _field(r, "general.architecture") == arch
    assert int(_field(r, f"{arch}.pooling_type")) == _POOLING_TYPE[pooling]
    assert bool(_field(r, f"{arch}.attention.causal")) is False

    assert_same_embeddings(path, model, tok, TEXTS, pooling, name)

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        back_cfg = json.load(fh)
    assert back_cfg["model_type"] == _BACK.get(model.config.model_type, model.config.model_type)
    offset = model.config.pad_token_id + 1 if model.config.model_type in ("roberta", "xlm-roberta") else 0
    assert back_cfg["max_position_embeddings"] == model.config.max_position_embeddings - offset
    m = transformers.AutoModel.from_pretrained(back, dtype=torch.float32).eval()
    ids = tok(TEXTS[0])["input_ids"]
    np.testing.assert_allclose(_hidden(m, ids), _hidden(model, ids), rtol=0, atol=1e-4)
    back_tok = transformers.AutoTokenizer.from_pretrained(back)
    for text in TEXTS:
        assert back_tok(text)["input_ids"] == tok(text)["input_ids"], (name, text)


def test_modernbert_legacy_config_names_give_the_same_keys():
    """ModernBERT's configs before transformers 5 (global_rope_theta, local_rope_theta, global_attn_every_n_layers)
    and transformers 5's (rope_parameters per layer type, layer_types) give the same GGUF keys."""
    from lazyweights.adapters.archs import ARCHS
    from lazyweights.convert.hparams import gguf_hparams

    base = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=4, intermediate_size=96, norm_eps=1e-5,
                max_position_embeddings=128, local_attention=8, hidden_activation="gelu")
    new = gguf_hparams(ARCHS["modernbert"], dict(base, layer_types=["full_attention", "sliding_attention",
                                                                    "sliding_attention", "full_attention"],
                                                 rope_parameters={"full_attention": {"rope_theta": 160000.0},
                                                                  "sliding_attention": {"rope_theta": 10000.0}}))
    old = gguf_hparams(ARCHS["modernbert"], dict(base, global_attn_every_n_layers=3, global_rope_theta=160000.0,
                                                 local_rope_theta=10000.0))
    values = {k: v.value for k, v in new.items()}
    assert values == {k: v.value for k, v in old.items()}
    assert values["modern-bert.attention.sliding_window_pattern"] == [False, True, True, False]
    assert (values["modern-bert.rope.freq_base"], values["modern-bert.rope.freq_base_swa"]) == (160000.0, 10000.0)
    assert values["modern-bert.hidden_activation"] == "gelu" and values["modern-bert.attention.causal"] is False


def test_roberta_position_rows_short_of_the_offset_name_the_tensor():
    """RoBERTa's positions start at pad_token_id + 1: a position table with no row past it is refused by name."""
    from lazyweights import WeightData
    from lazyweights.convert.tensors import hf_to_gguf
    from lazyweights.core.errors import ShapeError

    pos = WeightData.from_numpy(np.zeros((2, 8), np.float32), "embeddings.position_embeddings.weight")
    with pytest.raises(ShapeError, match=r"'embeddings.position_embeddings.weight': 2 position rows, but positions "
                                         r"start at pad_token_id \+ 1 = 2"):
        hf_to_gguf({"embeddings.position_embeddings.weight": pos}, {"model_type": "roberta", "pad_token_id": 1})
    out = hf_to_gguf({"embeddings.position_embeddings.weight": pos}, {"model_type": "roberta", "pad_token_id": 0})
    assert out["position_embd.weight"].shape == (1, 8)


def test_nomic_remote_code_config_gives_the_keys_of_transformers5():
    """nomic-embed-text-v1.5's config.json as its remote code spells it (n_embd, n_positions 8192 with
    max_trained_positions 2048, rotary_emb_base, layer_norm_epsilon) gives the GGUF keys transformers 5's native
    NomicBertConfig gives; the context is the trained 2048, as llama.cpp's converter writes it."""
    from lazyweights.adapters.archs import ARCHS
    from lazyweights.convert.hparams import gguf_hparams

    remote = {"model_type": "nomic_bert", "n_embd": 768, "n_head": 12, "n_inner": 3072, "n_layer": 12,
              "n_positions": 8192, "max_trained_positions": 2048, "rotary_emb_base": 1000,
              "layer_norm_epsilon": 1e-12, "activation_function": "swiglu", "type_vocab_size": 2, "vocab_size": 30528}
    native = transformers.NomicBertConfig().to_dict()
    a = {k: v.value for k, v in gguf_hparams(ARCHS["nomic_bert"], remote).items()}
    b = {k: v.value for k, v in gguf_hparams(ARCHS["nomic_bert"], native).items()}
    # transformers 5 also spells out head_dim (hidden / heads, llama.cpp's default)
    assert (b.pop("nomic-bert.attention.key_length"), b.pop("nomic-bert.attention.value_length")) == (64, 64)
    assert a == b
    assert (a["nomic-bert.context_length"], a["nomic-bert.rope.freq_base"]) == (2048, 1000.0)


def test_jina_v3_remote_code_folder(tokenizers_by_kind, tmp_path):
    """A jina-embeddings-v3 folder as its remote code writes it (model_type xlm-roberta with lora_adaptations,
    `roberta.`-prefixed names, parametrized Linear weights with their LoRA task tensors, rotary_emb_base) -> the
    same jina-bert-v3 GGUF as transformers' native model, LoRA tensors left out: llama.cpp's embedding equals the
    native model's."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from safetensors.numpy import load_file, save_file

    tok = tokenizers_by_kind["unigram"]
    native = str(tmp_path / "native")
    model = make_encoder("jina_embeddings_v3", tok, native)
    remote = tmp_path / "remote"
    remote.mkdir()
    rng = np.random.default_rng(0)
    tensors = {}
    for k, v in load_file(os.path.join(native, "model.safetensors")).items():
        if k.endswith(".weight") and v.ndim == 2 and "embeddings" not in k:
            base = "roberta." + k[: -len(".weight")] + ".parametrizations.weight"
            tensors[base + ".original"] = v
            tensors[base + ".0.lora_A"] = rng.standard_normal((3, 4, v.shape[1])).astype(np.float32)
            tensors[base + ".0.lora_B"] = rng.standard_normal((3, v.shape[0], 4)).astype(np.float32)
        else:
            tensors["roberta." + k] = v
    save_file(tensors, str(remote / "model.safetensors"))
    with open(os.path.join(native, "config.json")) as fh:
        cfg = json.load(fh)
    theta = cfg.pop("rope_parameters")["rope_theta"]
    cfg.update(model_type="xlm-roberta", architectures=["XLMRobertaLoRA"], rotary_emb_base=theta,
               position_embedding_type="rotary", lora_adaptations=["retrieval.query", "retrieval.passage", "x"])
    (remote / "config.json").write_text(json.dumps(cfg))
    for f in os.listdir(native):
        if f not in ("model.safetensors", "config.json") and os.path.isfile(os.path.join(native, f)):
            (remote / f).write_bytes(open(os.path.join(native, f), "rb").read())
    os.makedirs(remote / "1_Pooling")
    (remote / "1_Pooling" / "config.json").write_bytes(open(os.path.join(native, "1_Pooling", "config.json"),
                                                            "rb").read())

    a, b = str(tmp_path / "native.gguf"), str(tmp_path / "remote.gguf")
    export_gguf(native, a)
    export_gguf(str(remote), b)
    ra, rb = gguf.GGUFReader(a), gguf.GGUFReader(b)
    assert _field(rb, "general.architecture") == "jina-bert-v3"
    assert sorted(t.name for t in rb.tensors) == sorted(t.name for t in ra.tensors)
    assert not [t.name for t in rb.tensors if "lora" in t.name]
    llm = llama_cpp.Llama(model_path=b, embedding=True, verbose=False, n_threads=2, n_ctx=128)
    try:
        ids = tok(TEXTS[0])["input_ids"]
        ref = _hidden(model, ids).mean(0)
        got = np.asarray(llm.embed(TEXTS[0], normalize=False), dtype=np.float32).reshape(-1)
        np.testing.assert_allclose(got, ref, rtol=0, atol=5e-4 * max(1.0, float(np.abs(ref).max())))
    finally:
        llm.close()
