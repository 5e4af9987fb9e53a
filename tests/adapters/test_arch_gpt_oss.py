"""gpt-oss (transformers `gpt_oss`, llama.cpp "gpt-oss") both ways, judged by llama.cpp and by transformers.

A tiny random GptOssConfig model (hidden 64, 2 layers, 4 experts, sliding window 4 on every other layer, YaRN
RoPE, attention sinks, the shared tiny tokenizer of test_arch_round_trip):

1. saved unquantized (what `from_config` + `save_pretrained` writes: fused `gate_up_proj` [E, hidden, 2 * ff]
   with gate/up interleaved): HF -> GGUF -> llama.cpp's next-token distribution equals transformers' (max KL
   < 1e-3, same argmax); GGUF -> HF loads in transformers with the original logits.
2. the same model with its experts in the published MXFP4 layout (`*_blocks` uint8 [E, rows, n_blocks, 16],
   `*_scales` uint8 [E, rows, n_blocks], `quantization_config: {"quant_method": "mxfp4"}`), written here by an
   independent numpy quantizer: the GGUF keeps the experts as ggml MXFP4 whose bytes equal an independent numpy
   repack of the source bytes (llama.cpp's converter's layout: scale byte, then value j | value j + 16 << 4),
   llama.cpp's logits match transformers' on that checkpoint, and GGUF -> HF writes the packed blocks back
   byte-identical with the quantization_config, which transformers loads with the same logits.
   With the other tensors bf16 as published, biases and the router are float32 in the GGUF (llama.cpp's add_id
   aborts on a bf16 bias) and llama.cpp runs it.
3. a `_blocks` tensor whose shape does not fit its `_scales`: the error names both tensors and shapes; nothing
   is written.
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
safetensors_torch = pytest.importorskip("safetensors.torch")
if not hasattr(transformers, "GptOssConfig"):
    pytest.skip("this transformers has no gpt-oss (4.55 and later do)", allow_module_level=True)

from test_arch_breadth import _kl, _logits, assert_same_next_token, llama_cpp_logits  # noqa: E402
from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402
from lazyweights.core.errors import ShapeError  # noqa: E402

_CONFIG = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
               sliding_window=4, max_position_embeddings=131072, bos_token_id=0, eos_token_id=1, pad_token_id=2)
_FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def make_gpt_oss(tok, folder):
    cfg = transformers.GptOssConfig(**_CONFIG)
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms, biases and sinks, so a missed transform shows
        for n, p in model.named_parameters():
            if p.ndim == 1 or n.endswith("_bias"):
                p.copy_(p + 0.1 * torch.randn_like(p))
            if "experts" in n and not n.endswith("_bias"):
                p.copy_(torch.randn_like(p) * 0.2)  # wide enough for MXFP4 to use many codes
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """OCP MXFP4 of float32 [..., n] along the last axis: (blocks uint8 [..., n/32, 16], scales uint8 [..., n/32]),
    value 2k in byte k's low nibble, 2k + 1 in its high one (the published gpt-oss layout)."""
    g = w.reshape(w.shape[:-1] + (w.shape[-1] // 32, 32)).astype(np.float32)
    amax = np.abs(g).max(-1)
    e = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-30))) - 2, 0).astype(np.int32)  # 6 = 1.5 * 2^2
    x = g / np.exp2(e)[..., None].astype(np.float32)
    mag = np.abs(np.minimum(np.abs(x), 6.0))
    code = np.abs(mag[..., None] - _FP4).argmin(-1).astype(np.uint8) | ((x < 0) << 3).astype(np.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.astype(np.uint8), (e + 127).astype(np.uint8)


def repack_numpy(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The independent reference: OCP blocks/scales as ggml block_mxfp4 rows [..., n_blocks * 17]."""
    lo, hi = blocks & 0x0F, blocks >> 4
    vals = np.stack([lo, hi], -1).reshape(blocks.shape[:-1] + (32,))
    qs = (vals[..., :16] | (vals[..., 16:] << 4)).astype(np.uint8)
    out = np.concatenate([scales[..., None], qs], -1)
    return out.reshape(out.shape[:-2] + (-1,))


def make_mxfp4_folder(src, dst, other=None):
    """The unquantized folder `src` with its experts rewritten in the published MXFP4 layout: `dst` (the other
    tensors, expert biases included, cast to `other`: the published checkpoints' are bf16)."""
    os.makedirs(dst)
    state = safetensors_torch.load_file(os.path.join(src, "model.safetensors"))
    out, raw = {}, {}
    for k, v in state.items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            rows_last = v.float().numpy().transpose(0, 2, 1)  # [E, in, out] -> rows = outputs, as published
            b, s = quantize_mxfp4(np.ascontiguousarray(rows_last))
            out[k + "_blocks"], out[k + "_scales"] = torch.from_numpy(b), torch.from_numpy(s)
            raw[k] = (b, s)
        else:
            out[k] = v if other is None else v.to(other)
    safetensors_torch.save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as fh:
        cfg = json.load(fh)
    if other is not None:
        cfg["dtype"] = str(other).removeprefix("torch.")
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    for f in os.listdir(src):
        if f.startswith("tokenizer") or f == "special_tokens_map.json":
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b2:
                b2.write(a.read())
    return raw


def _load_hf(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _check_llama_cpp(path, ref, ids, what, tie=1e-3, decided=0.9):
    assert_same_next_token(ref, llama_cpp_logits(path, ids), what, tie, decided)


def _field(r, key):
    f = r.fields[key]
    return f.parts[f.data[0]].tolist() if len(f.data) == 1 else [f.parts[i].tolist()[0] for i in f.data]


def test_gpt_oss_unquantized_both_ways(tokenizer, tmp_path):  # noqa: F811
    hf = str(tmp_path / "hf")
    model = make_gpt_oss(tokenizer, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    assert len(ids) > 2 * _CONFIG["sliding_window"]  # the sliding window changes what layer 0 sees
    ref = _logits(model, ids)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "gpt-oss"
    assert _field(r, "gpt-oss.expert_feed_forward_length") == [64]
    assert _field(r, "gpt-oss.attention.sliding_window") == [4]
    assert _field(r, "gpt-oss.attention.sliding_window_pattern") == [True, False]
    assert _field(r, "gpt-oss.rope.scaling.original_context_length") == [4096]
    t = {x.name: x for x in r.tensors}
    gate_up = model.model.layers[1].mlp.experts.gate_up_proj.detach().numpy()  # [E, hidden, 2 * ff]
    np.testing.assert_array_equal(np.asarray(t["blk.1.ffn_up_exps.weight"].data),
                                  gate_up[:, :, 1::2].transpose(0, 2, 1))  # odd columns, [E, ff, hidden]
    _check_llama_cpp(path, ref, ids, "gpt-oss (float32)")

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["model_type"] == "gpt_oss" and "quantization_config" not in cfg
    assert cfg["layer_types"] == model.config.layer_types
    m = _load_hf(back)
    assert type(m).__name__ == "GptOssForCausalLM"
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_gpt_oss_mxfp4_experts_kept_packed(tokenizer, tmp_path):  # noqa: F811
    dense = str(tmp_path / "dense")
    make_gpt_oss(tokenizer, dense)
    hf = str(tmp_path / "mxfp4")
    raw = make_mxfp4_folder(dense, hf)
    ids = tokenizer(PROMPT)["input_ids"]
    ref_model = _load_hf(hf)  # transformers dequantizes the MXFP4 experts on CPU
    ref = _logits(ref_model, ids)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert _field(r, "general.file_type") == [int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)]  # as llama.cpp's converter
    t = {x.name: x for x in r.tensors}
    for layer in range(2):
        b, s = raw[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
        want = {"gate": repack_numpy(b[:, 0::2], s[:, 0::2]), "up": repack_numpy(b[:, 1::2], s[:, 1::2]),
                "down": repack_numpy(*raw[f"model.layers.{layer}.mlp.experts.down_proj"])}
        for part, expect in want.items():
            got = t[f"blk.{layer}.ffn_{part}_exps.weight"]
            assert got.tensor_type == gguf.GGMLQuantizationType.MXFP4, (layer, part, got.tensor_type)
            np.testing.assert_array_equal(np.asarray(got.data).reshape(expect.shape), expect)
    # llama.cpp's CPU MXFP4 dot product rounds the activations to Q8_0 (logits off by ~1e-2 here, KL ~1e-5): a
    # top-two gap under 0.02 counts as a tie (about a third of this random model's positions)
    _check_llama_cpp(path, ref, ids, "gpt-oss (MXFP4 experts)", tie=0.02, decided=0.6)

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        assert json.load(fh)["quantization_config"]["quant_method"] == "mxfp4"
    saved = safetensors_torch.load_file(os.path.join(back, "model.safetensors"))
    for name, (b, s) in raw.items():
        np.testing.assert_array_equal(saved[name + "_blocks"].numpy(), b)
        np.testing.assert_array_equal(saved[name + "_scales"].numpy(), s)
    np.testing.assert_allclose(_logits(_load_hf(back), ids), ref, rtol=0, atol=1e-4)


def test_gpt_oss_bf16_published_layout(tokenizer, tmp_path):  # noqa: F811
    """The published layout: MXFP4 experts, every other tensor bf16. llama.cpp's converter stores every bias and the
    router weight as float32 (llama.cpp's add_id aborts on a bf16 expert bias); the bf16 weights keep their bytes."""
    dense = str(tmp_path / "dense")
    make_gpt_oss(tokenizer, dense)
    hf = str(tmp_path / "mxfp4")
    make_mxfp4_folder(dense, hf, other=torch.bfloat16)
    ids = tokenizer(PROMPT)["input_ids"]
    ref = _logits(_load_hf(hf), ids)
    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    t = {x.name: x for x in gguf.GGUFReader(path).tensors}
    f32 = ("ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias", "ffn_gate_inp.weight", "ffn_gate_inp.bias",
           "attn_q.bias", "attn_sinks.weight", "attn_norm.weight")
    assert {n: t[f"blk.0.{n}"].tensor_type.name for n in f32} == {n: "F32" for n in f32}
    src = safetensors_torch.load_file(os.path.join(hf, "model.safetensors"))
    q = t["blk.0.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.BF16
    np.testing.assert_array_equal(np.asarray(q.data).view(np.uint16).reshape(-1),
                                  src["model.layers.0.self_attn.q_proj.weight"].view(torch.int16).numpy()
                                  .view(np.uint16).reshape(-1))
    np.testing.assert_array_equal(np.asarray(t["blk.0.ffn_up_exps.bias"].data),
                                  src["model.layers.0.mlp.experts.gate_up_proj_bias"].float().numpy()[:, 1::2])
    # llama.cpp multiplies bf16 weights by bf16-rounded activations (transformers in float32 here): a router near a
    # tie may pick another expert at a position, so the distribution is compared at the median position
    kl = _kl(ref, llama_cpp_logits(path, ids))
    assert np.median(kl) < 1e-4, f"median KL {np.median(kl):.3g} (max {kl.max():.3g})"


def test_blocks_not_fitting_scales_names_both(tokenizer, tmp_path):  # noqa: F811
    dense = str(tmp_path / "dense")
    make_gpt_oss(tokenizer, dense)
    hf = str(tmp_path / "mxfp4")
    make_mxfp4_folder(dense, hf)
    st = os.path.join(hf, "model.safetensors")
    state = safetensors_torch.load_file(st)
    name = "model.layers.1.mlp.experts.down_proj_scales"
    state[name] = state[name][:, :, :1].contiguous()  # [4, 64, 2] -> [4, 64, 1]
    safetensors_torch.save_file(state, st, metadata={"format": "pt"})
    out = tmp_path / "x.gguf"
    with pytest.raises(ShapeError, match=r"'model\.layers\.1\.mlp\.experts\.down_proj_blocks' \[4, 64, 2, 16\] "
                                         r"does not fit 'model\.layers\.1\.mlp\.experts\.down_proj_scales' "
                                         r"\[4, 64, 1\]"):
        export_gguf(hf, str(out))
    assert sorted(os.listdir(tmp_path)) == ["dense", "mxfp4"]


def test_blocks_without_scales_names_the_missing_one(tokenizer, tmp_path):  # noqa: F811
    from lazyweights.core.errors import MissingWeightError

    dense = str(tmp_path / "dense")
    make_gpt_oss(tokenizer, dense)
    hf = str(tmp_path / "mxfp4")
    make_mxfp4_folder(dense, hf)
    st = os.path.join(hf, "model.safetensors")
    state = safetensors_torch.load_file(st)
    del state["model.layers.0.mlp.experts.gate_up_proj_scales"]
    safetensors_torch.save_file(state, st, metadata={"format": "pt"})
    with pytest.raises(MissingWeightError, match=r"'model\.layers\.0\.mlp\.experts\.gate_up_proj_blocks' has no "
                                                 r"partner 'model\.layers\.0\.mlp\.experts\.gate_up_proj_scales'"):
        export_gguf(hf, str(tmp_path / "x.gguf"))
    assert sorted(os.listdir(tmp_path)) == ["dense", "mxfp4"]


def test_mxfp4_file_type_whatever_dominates():
    """llama.cpp's converter calls any file with MXFP4 experts MOSTLY_MXFP4_MOE (38): whether the experts hold most
    bytes (the real gpt-oss) or float tensors do (the tiny test model)."""
    from lazyweights import WeightData
    from lazyweights.convert.to_gguf import file_type_of
    from lazyweights.core.quantization import QuantizationEncoding

    def mx(rows):
        return WeightData.wrap(WeightData.from_numpy(np.zeros((rows, 17), np.uint8), "e").node, "e",
                               QuantizationEncoding.MXFP4)

    small = WeightData.from_numpy(np.zeros((8, 8), np.float32), "w")
    assert file_type_of({"e": mx(1000), "w": small}) == (int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE), True)
    assert file_type_of({"e": mx(1), "w": small}) == (int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE), True)
    assert file_type_of({"w": small}) == (int(gguf.LlamaFileType.ALL_F32), False)
