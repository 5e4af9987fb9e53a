"""The record-driven families (`lazyweights.adapters.archs`), each judged by llama.cpp and by transformers.

For each family a tiny random transformers model (hidden 64, 2 layers, float32, the ~300-token byte-level BPE
tokenizer of test_arch_round_trip) is saved with `save_pretrained`, then:

(a) HF -> GGUF (`export_gguf`); llama.cpp (llama-cpp-python) loads the file and its next-token distribution at
    every position of a prompt equals transformers' (max KL < 1e-3, same argmax wherever the reference's top two
    logits are not within 1e-3 of each other);
(b) GGUF -> HF (`export_hf_folder`, float32) loads in transformers as the same class with the original logits
    (atol 1e-4: the weights are bit-identical, only float32 summation order may differ).

Bad input: an unknown model_type names the nearest supported ones; a checkpoint whose tensor does not fit its
config names the tensor and both shapes, and nothing is written.
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

from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402
from lazyweights.core.errors import (  # noqa: E402
    ShapeError,
    TokenizerConversionError,
    UnsupportedArchitectureError,
)

_SPECIAL = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
_LLAMA_LIKE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   max_position_embeddings=128, **_SPECIAL)
_MLA = dict(_LLAMA_LIKE, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=12, head_dim=8)

# family -> (transformers config class, config kwargs, GGUF architecture)
FAMILIES = {
    "gemma": ("GemmaConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16), "gemma"),
    "granite": ("GraniteConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, embedding_multiplier=2.0,
                                      residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0),
                "granite"),
    "granitemoe": ("GraniteMoeConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, num_local_experts=4,
                                            num_experts_per_tok=2, embedding_multiplier=2.0, residual_multiplier=0.5,
                                            attention_multiplier=0.1, logits_scaling=4.0), "granitemoe"),
    "olmo": ("OlmoConfig", dict(_LLAMA_LIKE, num_key_value_heads=2), "olmo"),
    "olmo2": ("Olmo2Config", dict(_LLAMA_LIKE, num_key_value_heads=2), "olmo2"),
    "starcoder2": ("Starcoder2Config", dict(_LLAMA_LIKE, num_key_value_heads=2, sliding_window=None), "starcoder2"),
    "stablelm": ("StableLmConfig", dict(_LLAMA_LIKE, num_key_value_heads=2), "stablelm"),
    "phi": ("PhiConfig", dict(_LLAMA_LIKE), "phi2"),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, **_SPECIAL), "gpt2"),
    "gpt_neox": ("GPTNeoXConfig", dict(_LLAMA_LIKE), "gptneox"),
    "falcon": ("FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
                                    new_decoder_architecture=True, max_position_embeddings=128, **_SPECIAL),
               "falcon"),
    "falcon_7b_layout": ("FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                              new_decoder_architecture=False, multi_query=True, parallel_attn=True,
                                              max_position_embeddings=128, **_SPECIAL), "falcon"),
    "gpt_bigcode": ("GPTBigCodeConfig", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, **_SPECIAL),
                    "starcoder"),
    "bloom": ("BloomConfig", dict(hidden_size=64, n_layer=2, n_head=4, **_SPECIAL), "bloom"),
    "nemotron": ("NemotronConfig", dict(_LLAMA_LIKE, num_key_value_heads=2), "nemotron"),
    "seed_oss": ("SeedOssConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16), "seed_oss"),
    "arcee": ("ArceeConfig", dict(_LLAMA_LIKE, num_key_value_heads=2), "arcee"),
    "olmo3": ("Olmo3Config", dict(_LLAMA_LIKE, num_key_value_heads=2, sliding_window=4,
                                  layer_types=["sliding_attention", "full_attention"]), "olmo2"),
    "glm4": ("Glm4Config", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16), "glm4"),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16),
                         "hunyuan-dense"),
    "olmoe": ("OlmoeConfig", dict(_LLAMA_LIKE, num_key_value_heads=4, num_experts=4, num_experts_per_tok=2),
              "olmoe"),
    "ernie4_5": ("Ernie4_5Config", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16), "ernie4_5"),
    "smollm3": ("SmolLM3Config", dict(_LLAMA_LIKE, num_key_value_heads=2), "smollm3"),
    "mpt": ("MptConfig", dict(d_model=64, n_layers=2, n_heads=4, max_seq_len=128, **_SPECIAL), "mpt"),
    "cohere2": ("Cohere2Config", dict(_LLAMA_LIKE, num_key_value_heads=2, logit_scale=0.25, sliding_window=4),
                "cohere2"),
    "cohere": ("CohereConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, logit_scale=0.25), "command-r"),
    "exaone": ("ExaoneConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16), "exaone"),
    # llama.cpp sizes dots1's k and v by n_head (the real model has as many kv heads as heads)
    "dots1": ("Dots1Config", dict(_LLAMA_LIKE, num_key_value_heads=4, head_dim=16, n_routed_experts=4,
                                  n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                                  first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=1.5,
                                  layer_types=["full_attention"] * 2), "dots1"),
    "glm4_moe": ("Glm4MoeConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, n_routed_experts=4,
                                       n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                                       first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=1.5,
                                       num_nextn_predict_layers=0, attention_bias=True, use_qk_norm=True),
                 "glm4moe"),  # GLM-4.5's own choices: q/k/v biases and qk norms
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, moe_num_experts=4,
                                                moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=2,
                                                moe_layer_start_index=1, moe_layer_interval=1), "ernie4_5-moe"),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, num_experts=4,
                                                  moe_topk=2, num_shared_expert=1), "hunyuan-moe"),
    # MLA (q through a LoRA rank: llama.cpp's 2-layer DeepSeek is not a "lite" one), a dense first layer
    "deepseek_v2": ("DeepseekV2Config", dict(_MLA, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                             moe_intermediate_size=32, first_k_dense_replace=1, topk_method="greedy",
                                             routed_scaling_factor=1.5), "deepseek2"),
    # V2-Lite's plain q_proj: llama.cpp reads no q LoRA rank only at 26 or 27 layers
    "deepseek_v2_lite": ("DeepseekV2Config", dict(_MLA, q_lora_rank=None, num_hidden_layers=26, n_routed_experts=4,
                                                  n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                                                  first_k_dense_replace=1, topk_method="greedy"), "deepseek2"),
    "deepseek_v3": ("DeepseekV3Config", dict(_MLA, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                             moe_intermediate_size=32, first_k_dense_replace=1, n_group=2,
                                             topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=True,
                                             num_nextn_predict_layers=0), "deepseek2"),
    # llama.cpp honours EXAONE 4's sliding window (and NoPE global layers) only at 64 layers (the 32B)
    "exaone4": ("Exaone4Config", dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, sliding_window=None,
                                      layer_types=["full_attention"] * 2), "exaone4"),
}


def make_family(name, tok, folder):
    cls, kwargs, _ = FAMILIES[name]
    cfg = getattr(transformers, cls)(**kwargs)
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a missed +1, transpose or regrouping shows
        for n, p in model.named_parameters():
            if p.ndim == 1 or n.endswith("e_score_correction_bias"):  # ERNIE's router bias is [1, n_expert]
                p.copy_(p + 0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _kl(p_logits, q_logits):
    p = np.exp(p_logits - p_logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    lq = q_logits - q_logits.max(-1, keepdims=True)
    lq = lq - np.log(np.exp(lq).sum(-1, keepdims=True))
    lp = np.log(p)
    return (p * (lp - lq)).sum(-1)


def llama_cpp_logits(path, ids):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out



def assert_same_next_token(ref, mine, what, tie=1e-3, decided=0.9):
    """llama.cpp's next-token distribution (`mine`) equals transformers' (`ref`) at every position: max KL < 1e-3,
    and the same argmax wherever the reference's top two logits are more than `tie` apart (a near tie in a random
    model: float32 noise may flip it), at `decided` of the positions at least (so the argmax check is not
    vacuous)."""
    kl = _kl(ref, mine)
    assert kl.max() < 1e-3, f"{what}: llama.cpp's next-token distribution differs, max KL {kl.max():.3g}"
    top2 = np.sort(ref, -1)[:, -2:]
    ties = (top2[:, 1] - top2[:, 0]) < tie
    assert ((mine.argmax(-1) == ref.argmax(-1)) | ties).all(), what
    assert (~ties).sum() >= decided * len(ref), what


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_both_ways(name, tokenizer, tmp_path):  # noqa: F811
    hf = str(tmp_path / "hf")
    model = make_family(name, tokenizer, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == FAMILIES[name][2]

    mine = llama_cpp_logits(path, ids)
    assert_same_next_token(ref, mine, name)

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        assert json.load(fh)["model_type"] == model.config.model_type
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert type(m).__name__ == type(model).__name__
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_unknown_model_type_names_nearest():
    from lazyweights.convert.to_gguf import gguf_metadata_from_hf

    with pytest.raises(UnsupportedArchitectureError, match="'gpt-2' is not supported; nearest supported: gpt2"):
        gguf_metadata_from_hf({"model_type": "gpt-2"})


def test_tensor_not_fitting_config_names_tensor_and_shapes(tokenizer, tmp_path):  # noqa: F811
    hf = tmp_path / "hf"
    make_family("gpt_neox", tokenizer, str(hf))
    cfg = json.loads((hf / "config.json").read_text())
    cfg["intermediate_size"] = 128  # the checkpoint's MLP is 96 wide
    (hf / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "x.gguf"
    with pytest.raises(ShapeError, match=r"'gpt_neox\.layers\.0\.mlp\.dense_\w+\.weight' \(GGUF 'blk\.0\.ffn_\w+"
                                         r"\.weight'\): the checkpoint holds shape \[[0-9, ]*96[0-9, ]*\] "
                                         r"\(as llama.cpp stores it\), config.json \(gpt_neox\) makes it "
                                         r"\[[0-9, ]*128"):
        export_gguf(str(hf), str(out))
    assert os.listdir(tmp_path) == ["hf"]


def test_minilm_embedding_equals_transformers(minilm_dir, tmp_path):  # minilm_dir: tests/conftest.py
    """The real all-MiniLM-L6-v2 (BERT) -> a llama.cpp embedding GGUF with its mean pooling: llama.cpp's pooled
    embedding of varied texts equals transformers' mean-pooled last hidden state (cosine > 0.999)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    folder = minilm_dir  # read-only: the GGUF goes to tmp_path
    path = str(tmp_path / "minilm.gguf")
    try:
        export_gguf(str(folder), path)
    except TokenizerConversionError as e:  # the WordPiece -> GGUF tokenizer: formats/tokenizer_to_gguf's bert support
        pytest.skip(f"this checkout's tokenizer conversion has no WordPiece: {e}")
    r = gguf.GGUFReader(path)
    assert int(r.fields["bert.pooling_type"].parts[-1][0]) == int(gguf.PoolingType.MEAN)
    assert bool(r.fields["bert.attention.causal"].parts[-1][0]) is False

    texts = ["The quick brown fox jumps over the lazy dog.", "A sentence about embeddings and similarity.",
             "Café naïve résumé, 1234 numbers!"]
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    llm = llama_cpp.Llama(model_path=path, embedding=True, verbose=False, n_threads=2, n_ctx=128)
    try:
        for text in texts:
            enc = tok(text, return_tensors="pt")
            with torch.no_grad():
                hidden = model(**enc).last_hidden_state[0].numpy()
            ref = hidden.mean(0)
            got = np.asarray(llm.embed(text, normalize=False), dtype=np.float32).reshape(-1)
            cos = float(ref @ got / np.linalg.norm(ref) / np.linalg.norm(got))
            assert cos > 0.999, (text, cos)
            np.testing.assert_allclose(got, ref, rtol=0, atol=2e-3)
    finally:
        llm.close()

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32", tokenizer=False)
    m = transformers.AutoModel.from_pretrained(back, dtype=torch.float32).eval()
    enc = tok(texts[0], return_tensors="pt")
    with torch.no_grad():
        np.testing.assert_allclose(m(**enc).last_hidden_state.numpy(), model(**enc).last_hidden_state.numpy(),
                                   rtol=0, atol=1e-4)


def test_transformers5_names_and_legacy_aliases_give_the_same_keys():
    """Configs as transformers 5 writes them (rope_parameters, n_positions) and their legacy spellings
    (rotary_pct, rope_theta, n_ctx) give the same GGUF keys; llama.cpp's own converter fails on the former."""
    from lazyweights.adapters.archs import ARCHS
    from lazyweights.convert.hparams import gguf_hparams

    def values(md):
        return {k: v.value for k, v in md.items()}

    base = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96,
                max_position_embeddings=128, layer_norm_eps=1e-5)
    new = values(gguf_hparams(ARCHS["gpt_neox"], dict(base, rope_parameters={
        "rope_theta": 500.0, "partial_rotary_factor": 0.5, "rope_type": "default"})))
    old = values(gguf_hparams(ARCHS["gpt_neox"], dict(base, rotary_pct=0.5, rope_theta=500.0)))
    assert new == old and new["gptneox.rope.dimension_count"] == 8 and new["gptneox.rope.freq_base"] == 500.0
    gpt2 = dict(n_embd=64, n_head=4, n_layer=2, layer_norm_epsilon=1e-5)
    a = values(gguf_hparams(ARCHS["gpt2"], dict(gpt2, n_positions=128)))
    b = values(gguf_hparams(ARCHS["gpt2"], dict(gpt2, n_ctx=128)))
    assert a == b and a["gpt2.context_length"] == 128 and a["gpt2.feed_forward_length"] == 256


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma2", "gemma3_text",
                                        "phi3"])
def test_names_without_transformers_match_the_model(model_type):
    """GGUF -> HF names where transformers is missing (gguf-py's candidates, the record's `hf_prefer`) are the
    names the Hugging Face model declares, for the families whose folders convert without transformers."""
    from lazyweights.adapters import names
    from lazyweights.adapters.archs import ARCHS

    a = ARCHS[model_type]
    keys = names.default_hf_keys(a.model_type, a.hf_class, 2)
    checked = 0
    for k in sorted(keys):
        g = names.hf_to_gguf_name(k, a.gguf)
        if g is None or not names.gguf_to_hf_candidates(g, a.gguf):
            continue  # per-expert tensors: stacked by convert.tensors.EXPERTS
        assert names.gguf_to_hf_name(g, a.gguf, None, a.hf_prefer) == k, (g, k)
        assert names.gguf_to_hf_name(g, a.gguf, keys) == k, (g, k)
        checked += 1
    assert checked >= 9


_VL = {  # model_type -> (transformers config class, model class); the text part judged, the vision tower dropped
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration",
                 dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=1)),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                   dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
                 dict(depth=2, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64,
                      deepstack_visual_indexes=[0, 1])),
    "mistral3": ("Mistral3Config", "Mistral3ForConditionalGeneration",
                 dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=16)),
}
_VL_BACK = {"qwen2_vl": ("qwen2vl", "Qwen2ForCausalLM"), "qwen2_5_vl": ("qwen2vl", "Qwen2ForCausalLM"),
            "qwen3_vl": ("qwen3vl", "Qwen3ForCausalLM"),
            "mistral3": ("llama", "LlamaForCausalLM")}  # Mistral Small 3.1: a Mistral text model, a llama GGUF


@pytest.mark.parametrize("name", list(_VL))
def test_vl_text_part(name, tokenizer, tmp_path):  # noqa: F811
    """A VL checkpoint (vision tower included) -> a llama.cpp GGUF of its text part (Qwen: with the M-RoPE
    sections); llama.cpp's next-token distribution on text equals transformers' VL model's; GGUF -> HF
    gives the text model alone (Qwen2ForCausalLM, Qwen3ForCausalLM) with the same logits."""
    cfg_cls, model_cls, vision = _VL[name]
    arch, back_class = _VL_BACK[name]
    text = dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, vocab_size=len(tokenizer),
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    if name == "qwen3_vl":
        text["rope_parameters"]["mrope_interleaved"] = True
    if name == "mistral3":
        text = dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, vocab_size=len(tokenizer))
    cfg = getattr(transformers, cfg_cls)(text_config=text, vision_config=vision, **_SPECIAL)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
    hf = str(tmp_path / "hf")
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(model, ids)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == arch
    if name.startswith("qwen"):
        assert list(r.fields[f"{arch}.rope.dimension_sections"].contents()) == [2, 3, 3, 0]
    if name == "qwen3_vl":
        assert r.fields["qwen3vl.n_deepstack_layers"].contents() == 2
    assert not [t.name for t in r.tensors if "visual" in t.name or "vision" in t.name or t.name.startswith("v.")]
    mine = llama_cpp_logits(path, ids)
    kl = _kl(ref, mine)
    assert kl.max() < 1e-3, f"{name}: llama.cpp's next-token distribution differs, max KL {kl.max():.3g}"
    assert (mine.argmax(-1) == ref.argmax(-1)).mean() >= 0.9

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert type(m).__name__ == back_class
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_record_rope_scaling_and_per_layer_lists():
    """Linear / YaRN RoPE scaling goes into llama.cpp's keys and back into rope_parameters for any record; a
    per-layer list hyperparameter (HunYuan's moe_topk) is taken when its values agree and refused by name
    when they vary (llama.cpp holds one value)."""
    from lazyweights.adapters.archs import ARCHS
    from lazyweights.convert.hparams import gguf_hparams, hf_config
    from lazyweights.core.errors import GGUFConfigError

    base = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                intermediate_size=96, max_position_embeddings=128, rms_norm_eps=1e-6)
    yarn = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32}
    md = {k: v.value for k, v in gguf_hparams(ARCHS["qwen3"], dict(base, rope_parameters=yarn)).items()}
    assert (md["qwen3.rope.scaling.type"], md["qwen3.rope.scaling.factor"],
            md["qwen3.rope.scaling.original_context_length"]) == ("yarn", 4.0, 32)
    back = hf_config(ARCHS["qwen3"], md, {"blk.0.attn_q.weight"}, 300)
    assert back["rope_parameters"] == yarn and back["num_key_value_heads"] == 2 and back["head_dim"] == 16
    assert back["use_sliding_window"] is False

    moe = dict(base, num_experts=4, num_shared_expert=[1, 1])
    md = gguf_hparams(ARCHS["hunyuan_v1_moe"], dict(moe, moe_topk=[2, 2]))
    assert md["hunyuan-moe.expert_used_count"].value == 2 and md["hunyuan-moe.expert_shared_count"].value == 1
    with pytest.raises(GGUFConfigError, match=r"moe_topk varies per layer \(\[2, 3\]\)"):
        gguf_hparams(ARCHS["hunyuan_v1_moe"], dict(moe, moe_topk=[2, 3]))
