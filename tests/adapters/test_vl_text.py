"""A VL checkpoint converts its text model under its own class name (issue 39, part 1).

`lazyweights convert Qwen2_5_VLForConditionalGeneration DIR -o model.gguf` (and the Qwen2-VL / Qwen3-VL classes)
used to be refused: the registry's class check expected the record's text model_type (`qwen2_5_vl_text`) while the
folder's config.json says the outer one (`qwen2_5_vl`, the text config nested under `text_config`). For each
family a tiny random transformers model (vision tower included, saved with `save_pretrained` in the published
layout) is converted through the command line under its class name; the GGUF is bit-identical to the generic
adapter's (`export_gguf`), holds no vision tensor, and llama.cpp's next-token distribution on a prompt equals
transformers' VL model's (max KL < 1e-3).
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

from lazyweights.adapters import export_gguf  # noqa: E402
from lazyweights.core.errors import ConfigError  # noqa: E402
from lazyweights.tools.cli import main  # noqa: E402

QWEN_VL = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


def _make(name, tok, folder):
    cfg_cls, model_cls, vision = _VL[name]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    if name == "qwen3_vl":
        rope["mrope_interleaved"] = True
    text = dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, vocab_size=len(tok), rope_parameters=rope)
    cfg = getattr(transformers, cfg_cls)(text_config=text, vision_config=vision, **_SPECIAL)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def _tensors(path):
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type, np.array(t.data)) for t in r.tensors}


def _fields(path):
    r = gguf.GGUFReader(path)
    return {k: (f.contents() if f.types else None) for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.parametrize("name", QWEN_VL)
def test_vl_class_converts_its_text_model(name, tokenizer, tmp_path):  # noqa: F811
    model = _make(name, tokenizer, str(tmp_path / "hf"))
    cls = _VL[name][1]
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
