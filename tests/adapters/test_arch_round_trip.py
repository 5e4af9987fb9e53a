"""Every supported architecture, both ways, on tiny random transformers models.

For each of llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral, qwen2moe and qwen3moe a tiny model
(hidden 64, 2 layers, a ~300-token byte-level BPE tokenizer trained here) is built with
`AutoModelForCausalLM.from_config`, seeded, and saved with `save_pretrained` (float32). Then:

(a) HF -> GGUF (`export_gguf`): gguf-py's `GGUFReader` reads every metadata key back with the type llama.cpp's
    converter writes and the value the config says, and the tensors under llama.cpp's names and shapes
    (fused Phi-3 qkv / gate_up, stacked [n_expert, rows, cols] experts, 1-D float32 norms).
(b) transformers' own GGUF loader (`from_pretrained(dir, gguf_file=...)`) gives the original logits. The GGUF
    holds the float32 weights unchanged (llama.cpp's permutation and Gemma's +1 are exact in float32), so
    the only difference allowed is float32 summation noise: atol 1e-5. Skipped for mixtral, which
    transformers' loader reads as a dense llama (it drops the experts).
(c) GGUF -> HF (`export_hf_folder`) gives the original logits: float32 folder atol 1e-5 (as (b)); the
    default bfloat16 folder equals the original model with its parameters rounded to bfloat16 (atol 1e-4:
    Gemma's `(w + 1) - 1` may round differently from `w`, one bf16 ulp on a norm weight), and its
    tokenizer tokenizes and decodes varied text as the original folder's does.

Config choices follow what llama.cpp can represent: Gemma's query_pre_attn_scalar = head_dim (llama.cpp scales
by 1/sqrt(head_dim)), Qwen3 MoE renormalizes its top-k weights (llama.cpp's qwen3moe always does), and the
sizes transformers' GGUF loader does not read from the file (Qwen3 head_dim, Qwen MoE expert sizes) are
their config defaults so that (b) compares like with like; ours are read from the file in (c) either way.
Sliding windows are 4 tokens against a longer prompt, so a wrong window shows in the logits.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from _hf_reference import TEXTS

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("accelerate")  # transformers' GGUF model loader requires it

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402

T = gguf.GGUFValueType
PROMPT = "The quick brown fox jumps over the lazy dog, 1234 times: def f(x): return x ** 2"
_CORPUS = ("The quick brown fox jumps over the lazy dog. Café naïve résumé. 日本語 中文. "
           "def f(x): return x ** 2  # code\n\tindent   spaces\n\n1234 5678 🤖 emoji. ") * 10
_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=2)

# name -> (config class, extra config, GGUF architecture)
ARCHS = {
    "llama": ("LlamaConfig", {}, "llama"),
    "mistral": ("MistralConfig", {"sliding_window": None}, "llama"),
    "qwen2": ("Qwen2Config", {}, "qwen2"),
    "qwen3": ("Qwen3Config", {"head_dim": 128}, "qwen3"),
    "gemma2": ("Gemma2Config", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4}, "gemma2"),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4}, "gemma3"),
    "phi3": ("Phi3Config", {}, "phi3"),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}, "llama"),
    "qwen2moe": ("Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 1408,
                                    "shared_expert_intermediate_size": 5632}, "qwen2moe"),
    "qwen3moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 768,
                                    "head_dim": 16, "norm_topk_prob": True}, "qwen3moe"),
    # what transformers' GGUF loader does not read, ours must: Llama 3.1 RoPE scaling (llama.cpp keeps it as a
    # rope_freqs tensor), per-layer attention types, softcapping values
    "llama_rope3": ("LlamaConfig", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 32.0, "original_max_position_embeddings": 64}},
                    "llama"),
    "gemma3_layers": ("Gemma3TextConfig", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4,
                                           "layer_types": ["sliding_attention", "full_attention"]}, "gemma3"),
    "gemma2_softcap": ("Gemma2Config", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4,
                                        "final_logit_softcapping": 0.5, "attn_logit_softcapping": 2.0}, "gemma2"),
}
TRANSFORMERS_GGUF_SKIP = {
    "llama_rope3": "transformers' GGUF loader ignores rope_freqs.weight (no RoPE scaling)",
    "mixtral": "transformers' GGUF loader reads a mixtral GGUF as a dense LlamaForCausalLM",
    "gemma3_layers": "transformers' GGUF loader ignores gemma3.attention.sliding_window_pattern",
    "gemma2_softcap": "transformers' GGUF loader ignores the softcapping keys (uses 30/50)",
}


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from lazyweights.formats.tokenizer_tables import PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS["llama-bpe"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>", "<pad>", "<unk>"], show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")


def make_model(name, tokenizer, folder):
    """A seeded tiny float32 model of architecture `name`, saved with its tokenizer into `folder`."""
    cls, extra, _ = ARCHS[name]
    cfg = getattr(transformers, cls)(**_COMMON, **extra)
    cfg.vocab_size = len(tokenizer)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits[0].float().numpy()


def _reader_fields(path):
    r = gguf.GGUFReader(path)
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        types = tuple(f.types)
        if types[0] == T.ARRAY:
            parts = [f.parts[i] for i in f.data]
            val = ([bytes(p).decode("utf-8") for p in parts] if types[-1] == T.STRING
                   else (np.concatenate(parts).tolist() if parts else []))
        else:
            val = f.contents()
        out[k] = (types, val)
    return out, {t.name: tuple(int(x) for x in reversed(t.shape.tolist())) for t in r.tensors}


def _expected_metadata(name, cfg):
    """key -> (types, value) every GGUF of this architecture must hold (value None: type checked only)."""
    a = ARCHS[name][2]
    u, f = (T.UINT32,), (T.FLOAT32,)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    want = {
        "general.architecture": ((T.STRING,), a), "general.file_type": (u, 0), "general.type": ((T.STRING,), "model"),
        f"{a}.context_length": (u, 128), f"{a}.embedding_length": (u, 64), f"{a}.block_count": (u, 2),
        f"{a}.attention.head_count": (u, 4), f"{a}.attention.head_count_kv": (u, 2),
        f"{a}.attention.layer_norm_rms_epsilon": (f, None), f"{a}.rope.freq_base": (f, None),
        "tokenizer.ggml.model": ((T.STRING,), "gpt2"), "tokenizer.ggml.pre": ((T.STRING,), "llama-bpe"),
        "tokenizer.ggml.tokens": ((T.ARRAY, T.STRING), None), "tokenizer.ggml.token_type": ((T.ARRAY, T.INT32), None),
        "tokenizer.ggml.merges": ((T.ARRAY, T.STRING), None), "tokenizer.ggml.bos_token_id": (u, 0),
        "tokenizer.ggml.eos_token_id": (u, 1), "tokenizer.ggml.padding_token_id": (u, 2),
        "tokenizer.ggml.unknown_token_id": (u, 3), "tokenizer.ggml.add_bos_token": ((T.BOOL,), True),
        "tokenizer.ggml.add_eos_token": ((T.BOOL,), False),
    }
    if name not in ("qwen2moe", "qwen3moe"):
        want[f"{a}.feed_forward_length"] = (u, 96)
    if (head_dim != cfg.hidden_size // cfg.num_attention_heads
            or a in ("llama", "qwen3", "qwen3moe", "gemma2", "gemma3")):
        want[f"{a}.attention.key_length"] = (u, head_dim)
        want[f"{a}.attention.value_length"] = (u, head_dim)
    if a == "llama":
        want["llama.rope.dimension_count"] = (u, head_dim)
    if a == "phi3":
        want["phi3.rope.dimension_count"] = (u, head_dim)
    if a in ("gemma2", "gemma3"):
        want[f"{a}.attention.sliding_window"] = (u, 4)
    if a == "gemma2":
        want["gemma2.final_logit_softcapping"] = (f, cfg.final_logit_softcapping)
        want["gemma2.attn_logit_softcapping"] = (f, cfg.attn_logit_softcapping)
    if name == "gemma3_layers":
        want["gemma3.attention.sliding_window_pattern"] = ((T.ARRAY, T.BOOL), [True, False])
    if name in ("mixtral", "qwen2moe", "qwen3moe"):
        want[f"{a}.expert_count"] = (u, 4)
        want[f"{a}.expert_used_count"] = (u, 2)
    if name == "qwen2moe":
        want["qwen2moe.expert_feed_forward_length"] = (u, 1408)
        want["qwen2moe.expert_shared_feed_forward_length"] = (u, 5632)
    if name == "qwen3moe":
        want["qwen3moe.expert_feed_forward_length"] = (u, 768)
    return want


def _expected_tensors(name, cfg):
    """GGUF tensor name -> shape (numpy order) llama.cpp's loader expects for this architecture."""
    name = name.split("_")[0]  # gemma3_layers -> gemma3
    h, v = cfg.hidden_size, cfg.vocab_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    ff = cfg.intermediate_size
    out = {"token_embd.weight": (v, h), "output_norm.weight": (h,)}
    if getattr(cfg, "rope_parameters", {}).get("rope_type") == "llama3":
        out["rope_freqs.weight"] = (hd // 2,)
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (v, h)
    for i in range(2):
        b = f"blk.{i}."
        out.update({b + "attn_norm.weight": (h,), b + "ffn_norm.weight": (h,), b + "attn_output.weight": (h, q)})
        if name == "phi3":
            out.update({b + "attn_qkv.weight": (q + 2 * kv, h), b + "ffn_up.weight": (2 * ff, h),
                        b + "ffn_down.weight": (h, ff)})
            continue
        out.update({b + "attn_q.weight": (q, h), b + "attn_k.weight": (kv, h), b + "attn_v.weight": (kv, h)})
        if name in ("qwen2", "qwen2moe"):
            out.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
        if name in ("qwen3", "qwen3moe", "gemma3"):
            out.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
        if name in ("gemma2", "gemma3"):
            out.update({b + "post_attention_norm.weight": (h,), b + "post_ffw_norm.weight": (h,)})
        if name in ("mixtral", "qwen2moe", "qwen3moe"):
            n = 4
            eff = ff if name == "mixtral" else cfg.moe_intermediate_size
            out.update({b + "ffn_gate_inp.weight": (n, h), b + "ffn_gate_exps.weight": (n, eff, h),
                        b + "ffn_up_exps.weight": (n, eff, h), b + "ffn_down_exps.weight": (n, h, eff)})
            if name == "qwen2moe":
                s = cfg.shared_expert_intermediate_size
                out.update({b + "ffn_gate_inp_shexp.weight": (h,), b + "ffn_gate_shexp.weight": (s, h),
                            b + "ffn_up_shexp.weight": (s, h), b + "ffn_down_shexp.weight": (h, s)})
        else:
            out.update({b + "ffn_gate.weight": (ff, h), b + "ffn_up.weight": (ff, h), b + "ffn_down.weight": (h, ff)})
    return out


@pytest.mark.parametrize("name", list(ARCHS))
def test_architecture_both_ways(name, tokenizer, tmp_path):
    hf = str(tmp_path / "hf")
    model = make_model(name, tokenizer, hf)
    cfg = model.config
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    assert ids.shape[1] > 8  # longer than the 4-token sliding windows
    ref = _logits(model, ids)

    # (a) HF -> GGUF, read back by gguf-py
    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    fields, tensors = _reader_fields(path)
    for key, (types, value) in _expected_metadata(name, cfg).items():
        assert key in fields, f"{name}: GGUF lacks {key}"
        assert fields[key][0] == types, f"{name}: {key} has type {fields[key][0]}, llama.cpp writes {types}"
        if value is not None:
            assert fields[key][1] == value, f"{name}: {key} = {fields[key][1]!r}, want {value!r}"
    a = ARCHS[name][2]
    assert fields[f"{a}.attention.layer_norm_rms_epsilon"][1] == pytest.approx(cfg.rms_norm_eps, rel=1e-6)
    assert fields["tokenizer.ggml.tokens"][1] == [tokenizer.convert_ids_to_tokens(i) for i in range(len(tokenizer))]
    assert tensors == _expected_tensors(name, cfg)

    # (b) transformers' own GGUF loader computes the same model
    if name not in TRANSFORMERS_GGUF_SKIP:
        theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="model.gguf",
                                                                  dtype=torch.float32).eval()
        np.testing.assert_allclose(_logits(theirs, ids), ref, rtol=0, atol=1e-5)

    # (c) GGUF -> HF folder: float32 exact, bfloat16 equal to the bf16-rounded original, same tokenizer
    back32 = str(tmp_path / "back32")
    export_hf_folder(path, back32, dtype="float32")
    m32 = transformers.AutoModelForCausalLM.from_pretrained(back32, dtype=torch.float32).eval()
    # a GGUF says "llama" for Mistral too (llama.cpp's converter does the same): with no sliding window
    # MistralForCausalLM and LlamaForCausalLM compute the same function, and the folder says Llama
    want_cls = "LlamaForCausalLM" if name == "mistral" else type(model).__name__
    if name == "llama_rope3":
        assert m32.config.rope_parameters == cfg.rope_parameters
        freqs = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}["rope_freqs.weight"]
        inv = 1 / (10000.0 ** (np.arange(0, 16, 2) / 16))  # transformers' llama3 scaling, applied to inv_freq
        with torch.no_grad():
            scaled = model.model.rotary_emb.inv_freq.numpy()
        np.testing.assert_allclose(inv / freqs, scaled, rtol=1e-5)
    for key in ("layer_types", "sliding_window", "final_logit_softcapping", "attn_logit_softcapping", "head_dim",
                "num_key_value_heads", "tie_word_embeddings", "num_local_experts", "num_experts_per_tok",
                "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob"):
        if getattr(cfg, key, None) is not None and name != "mistral":
            assert getattr(m32.config, key) == getattr(cfg, key), key
    assert type(m32).__name__ == want_cls
    np.testing.assert_allclose(_logits(m32, ids), ref, rtol=0, atol=1e-5)

    back = str(tmp_path / "back")
    export_hf_folder(path, back)
    mb = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    with open(os.path.join(back, "config.json")) as fh:
        assert json.load(fh)["architectures"] == [want_cls]
    rounded = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    np.testing.assert_allclose(_logits(mb, ids), _logits(rounded, ids), rtol=0, atol=1e-4)
    assert (_logits(mb, ids).argmax(-1) == ref.argmax(-1)).mean() >= 0.9

    mine = transformers.AutoTokenizer.from_pretrained(back)
    orig = transformers.AutoTokenizer.from_pretrained(hf)
    for text in TEXTS + [PROMPT]:
        assert mine(text)["input_ids"] == orig(text)["input_ids"], text
        plain = orig(text, add_special_tokens=False)["input_ids"]
        assert mine(text, add_special_tokens=False)["input_ids"] == plain, text
        assert mine.decode(plain) == orig.decode(plain), text
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(mine, attr) == getattr(orig, attr), attr


@pytest.mark.parametrize("name", ["llama", "phi3", "qwen2moe", "qwen3moe"])
def test_quantized_gguf_to_hf_matches_transformers(name, tokenizer, tmp_path):
    """A GGUF whose 2-D tensors are Q8_0 (llama: RoPE-permuted rows of packed blocks; MoE: stacked quantized
    experts; phi3: fused qkv / gate_up) -> HF folder (float32): the logits equal transformers' own GGUF loader,
    which dequantizes with gguf-py (same values, same float32 graph: atol 1e-5)."""
    from lazyweights import load_weights
    from lazyweights.adapters import convert_hf_to_gguf
    from lazyweights.convert.result import save_converted
    from lazyweights.core.quantization import QuantizationEncoding

    hf = str(tmp_path / "hf")
    make_model(name, tokenizer, hf)
    adapted = convert_hf_to_gguf(dict(load_weights([hf]).items()), None, folder=hf)
    for k, v in list(adapted.items()):
        if len(v.shape) >= 2 and v.shape[-1] % 32 == 0 and k != "token_embd.weight":
            adapted[k] = v.quantize(QuantizationEncoding.Q8_0)
    save_converted(adapted, str(tmp_path / "q.gguf"))
    fields, _ = _reader_fields(str(tmp_path / "q.gguf"))
    assert fields["general.file_type"] == ((T.UINT32,), int(gguf.LlamaFileType.MOSTLY_Q8_0))
    assert fields["general.quantization_version"] == ((T.UINT32,), 2)
    export_hf_folder(str(tmp_path / "q.gguf"), str(tmp_path / "back"), dtype="float32")
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    mine = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back"), dtype=torch.float32).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q.gguf",
                                                              dtype=torch.float32).eval()
    np.testing.assert_allclose(_logits(mine, ids), _logits(theirs, ids), rtol=0, atol=1e-5)
