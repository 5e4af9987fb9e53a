"""A VL checkpoint converts its text model under its own class name (issue 39, part 1).

`lazyweights convert Qwen2_5_VLForConditionalGeneration DIR -o model.gguf` (and the Qwen2-VL / Qwen3-VL /
Qwen3-VL MoE classes)
used to be refused: the registry's class check expected the record's text model_type (`qwen2_5_vl_text`) while the
folder's config.json says the outer one (`qwen2_5_vl`, the text config nested under `text_config`). For each
family a tiny random transformers model (vision tower included, saved with `save_pretrained` in the published
layout) is converted through the command line under its class name; the GGUF is bit-identical to the generic
adapter's (`export_gguf`), holds no vision tensor, and llama.cpp's next-token distribution on a prompt equals
transformers' VL model's (max KL < 1e-3); the GGUF converts back to the text model alone (Qwen2, Qwen3, Qwen3 MoE)
with transformers' logits (atol 1e-4).
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_arch_breadth import (  # noqa: E402  (the shared tiny model settings and llama.cpp helpers)
    _LLAMA_LIKE,
    _SPECIAL,
    _VL,
    _kl,
    _logits,
    llama_cpp_logits,
)
from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402
from lazyweights.core.errors import ConfigError  # noqa: E402
from lazyweights.tools.cli import main  # noqa: E402

# Qwen3-VL MoE: Qwen3-VL's tower, a Qwen3 MoE text model (4 experts, 2 used, 24 wide); its outer config says
# untied (text_config: tied) and lm_head.weight is saved: transformers uses it, so must llama.cpp's GGUF
_VL_MOE = {"qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", _VL["qwen3_vl"][2])}
_MOE_TEXT = {"qwen3_vl_moe": dict(moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2)}
QWEN_VL = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"]
_BACK = {"qwen2_vl": "Qwen2ForCausalLM", "qwen2_5_vl": "Qwen2ForCausalLM", "qwen3_vl": "Qwen3ForCausalLM",
         "qwen3_vl_moe": "Qwen3MoeForCausalLM"}


def _make(name, tok, folder):
    cfg_cls, model_cls, vision = {**_VL, **_VL_MOE}[name]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    if name in ("qwen3_vl", "qwen3_vl_moe"):
        rope["mrope_interleaved"] = True
    text = dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, vocab_size=len(tok), rope_parameters=rope,
                **_MOE_TEXT.get(name, {}))
    cfg = getattr(transformers, cfg_cls)(text_config=text, vision_config=vision, **_SPECIAL)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
            if p.ndim == 3:  # stacked experts: weights large enough that a wrong layout shows
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    if name in _VL_MOE:  # the published layout (Qwen/Qwen3-VL-30B-A3B-*): experts [n, hidden, 2 * ff] and
        _published_experts(folder)  # [n, ff, hidden]; transformers 5.24 saves them transposed
        reloaded = getattr(transformers, model_cls).from_pretrained(folder).eval()  # and transposes them on load
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()))
    tok.save_pretrained(folder)
    return model


def _published_experts(folder):
    import os

    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    sd = {k: v.transpose(1, 2).contiguous() if k.endswith((".experts.gate_up_proj", ".experts.down_proj")) else v
          for k, v in load_file(path).items()}
    save_file(sd, path, metadata={"format": "pt"})


def _tensors(path):
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type, np.array(t.data)) for t in r.tensors}


def _fields(path):
    r = gguf.GGUFReader(path)
    return {k: (f.contents() if f.types else None) for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.parametrize("name", QWEN_VL)
def test_vl_class_converts_its_text_model(name, tokenizer, tmp_path):  # noqa: F811
    model = _make(name, tokenizer, str(tmp_path / "hf"))
    cls = {**_VL, **_VL_MOE}[name][1]
    mine = str(tmp_path / "cli.gguf")
    assert main(["convert", cls, str(tmp_path / "hf"), "-o", mine, "--no-progress"]) == 0
    generic = str(tmp_path / "generic.gguf")
    export_gguf(str(tmp_path / "hf"), generic)

    a, b = _tensors(mine), _tensors(generic)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k][0] == b[k][0] and np.array_equal(a[k][1], b[k][1]), k
    assert _fields(mine) == _fields(generic)
    assert not [n for n in a if n.startswith(("v.", "mm.")) or "visual" in n]

    ids = tokenizer(PROMPT)["input_ids"]
    ref, got = _logits(model, ids), llama_cpp_logits(mine, ids)
    kl = _kl(ref, got)
    assert kl.max() < 1e-3, f"{cls}: llama.cpp's next-token distribution differs, max KL {kl.max():.3g}"
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9  # a random model has near ties (test_vl_text_part)

    # GGUF -> HF: the text model alone (Qwen3-VL MoE: Qwen3MoeForCausalLM, its experts in Qwen3 MoE's layout)
    back = str(tmp_path / "back")
    export_hf_folder(mine, back, dtype="float32")
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert type(m).__name__ == _BACK[name]
    np.testing.assert_allclose(_logits(m, ids), ref, rtol=0, atol=1e-4)


def test_vl_class_still_refuses_another_family(tokenizer, tmp_path, capsys):  # noqa: F811
    """The class check still names both sides when the folder is another family (a Qwen2-VL folder under the
    Qwen2.5-VL class): a ConfigError from the adapter, exit status 2 from the command line, nothing written."""
    from lazyweights.adapters.registry import adapt

    _make("qwen2_vl", tokenizer, str(tmp_path / "hf"))
    with pytest.raises(ConfigError, match=r"Qwen2_5_VLForConditionalGeneration.*but the checkpoint's config says "
                                          r"'qwen2_vl'"):
        adapt("Qwen2_5_VLForConditionalGeneration", [str(tmp_path / "hf")],
              huggingface_config={"model_type": "qwen2_vl"})
    assert main(["convert", "Qwen2_5_VLForConditionalGeneration", str(tmp_path / "hf"), "-o",
                 str(tmp_path / "x.gguf"), "--no-progress"]) != 0
    assert "'qwen2_vl'" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


# class -> (config class, vision config, outer config): VL classes whose text model the generic adapter converts
_OWN_TEXT = {
    "LlavaForConditionalGeneration": ("LlavaConfig", dict(model_type="clip_vision_model", hidden_size=32,
                                                          intermediate_size=48, num_hidden_layers=2,
                                                          num_attention_heads=2, image_size=28, patch_size=14,
                                                          projection_dim=32), dict(image_token_index=3)),
    "Mistral3ForConditionalGeneration": ("Mistral3Config", dict(model_type="pixtral", hidden_size=32,
                                                                intermediate_size=48, num_hidden_layers=1,
                                                                num_attention_heads=2, head_dim=16, image_size=32,
                                                                patch_size=8), dict(image_token_index=3,
                                                                                    spatial_merge_size=2)),
    # Idefics3 / SmolVLM: the text model saved under `model.text_model.`, the tower under `model.vision_model.`
    "Idefics3ForConditionalGeneration": ("Idefics3Config", dict(hidden_size=32, intermediate_size=48,
                                                                num_hidden_layers=1, num_attention_heads=2,
                                                                image_size=32, patch_size=8),
                                         dict(image_token_id=3, scale_factor=2)),
    "SmolVLMForConditionalGeneration": ("SmolVLMConfig", dict(hidden_size=32, intermediate_size=48,
                                                              num_hidden_layers=1, num_attention_heads=2,
                                                              image_size=32, patch_size=8),
                                        dict(image_token_id=3, scale_factor=2)),
}


def _make_own_text(cls, tok, folder):
    """A tiny VL model of class `cls` (LLaVA 1.5: CLIP and Llama; Mistral 3: Pixtral and Mistral; Idefics3 and
    SmolVLM: SigLIP and Llama) saved as transformers saves it."""
    cfg_cls, vision, outer = _OWN_TEXT[cls]
    text = dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, vocab_size=len(tok))
    cfg = getattr(transformers, cfg_cls)(text_config=text, vision_config=vision, **outer)
    torch.manual_seed(0)
    model = getattr(transformers, cls)(cfg).eval()
    with torch.no_grad():  # non-trivial norms
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


@pytest.mark.parametrize("cls", list(_OWN_TEXT))
def test_vl_class_converts_its_text_model_generic(cls, tokenizer, tmp_path):  # noqa: F811
    """`lazyweights convert CLASS DIR -o model.gguf` for LLaVA, Mistral 3, Idefics3 and SmolVLM (the class the
    config.json names; the text model under `language_model.` or `model.text_model.`): the generic adapter's GGUF
    (architecture llama), no vision tensor, llama.cpp's next-token distribution equal to transformers' VL model's on
    text."""
    model = _make_own_text(cls, tokenizer, str(tmp_path / "hf"))
    mine, generic = str(tmp_path / "cli.gguf"), str(tmp_path / "generic.gguf")
    assert main(["convert", cls, str(tmp_path / "hf"), "-o", mine, "--no-progress"]) == 0
    export_gguf(str(tmp_path / "hf"), generic)
    a, b = _tensors(mine), _tensors(generic)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k][0] == b[k][0] and np.array_equal(a[k][1], b[k][1]), k
    assert _fields(mine) == _fields(generic)
    assert _fields(mine)["general.architecture"] == "llama"
    assert not [n for n in a if n.startswith(("v.", "mm.")) or "vision" in n]
    ids = tokenizer(PROMPT)["input_ids"]
    kl = _kl(_logits(model, ids), llama_cpp_logits(mine, ids))
    assert kl.max() < 1e-3, f"{cls}: llama.cpp's next-token distribution differs ({kl.max()})"
