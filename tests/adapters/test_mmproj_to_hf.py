"""mmproj GGUF -> Hugging Face (issue 39, the reverse direction): a text GGUF and its mmproj become one
`...ForConditionalGeneration` folder.

For Gemma 3 and Qwen2.5-VL a tiny random transformers model (test_mmproj's FAMILIES, its tokenizer given the
family's image tokens) is saved in the published layout in float32 and bfloat16, converted HF -> (ours) text GGUF
+ mmproj -> (ours) HF folder, and judged by transformers:

(a) the folder loads as the original's class (AutoModelForImageTextToText), with the same config classes;
(b) its tensors equal the original's: bit-exact, except what the forward conversion rounds (float32 Gemma 3: the
    norms llama.cpp stores w + 1, within an ulp of 1; `mm_input_projection_weight`, stored float16);
(c) given an image, its logits (float32) equal the original model's at every position;
(d) llama.cpp's own converter's text GGUF and mmproj (the llama-cpp-python 0.3.36 sdist) convert back to the
    same tensors.

Bad input is a named error before anything is written: an unknown projector, an mmproj made for another text
model's width.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from test_arch_round_trip import tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)
from test_mmproj import CONVERTER, FAMILIES, _image, make_vl, qwen_patches  # noqa: E402

from lazyweights import load_weights  # noqa: E402
from lazyweights.adapters.vision_archs import VISION_ARCHS  # noqa: E402
from lazyweights.convert.mmproj import export_gguf_with_mmproj  # noqa: E402
from lazyweights.convert.mmproj_to_hf import (  # noqa: E402
    HF_FOLDERS,
    convert_mmproj_to_hf,
    export_hf_folder_with_mmproj,
)
from lazyweights.core.errors import MmprojMismatchError, UnknownProjectorError  # noqa: E402

ROUND_TRIP = ["gemma3", "qwen2_5_vl", "qwen2_vl", "qwen3_vl"]
DTYPES = ["float32", "bfloat16"]
# (family, dtype) -> {HF name regex: max abs difference} where the forward conversion rounds
LOSSY = {("gemma3", "float32"): {r"norm\.weight$": 2 ** -23, r"mm_input_projection_weight$": 2e-4}}


@pytest.fixture(scope="module")
def vl_tokenizer(tokenizer):  # noqa: F811
    """The shared tokenizer plus both families' image tokens, as the published tokenizers have them."""
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer.__class__.from_str(
        tokenizer.backend_tokenizer.to_str()), bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    tok.add_tokens(sorted({t for f in HF_FOLDERS.values() for t in f.tokens.values()}), special_tokens=True)
    return tok


def _ids(family: str, tok) -> dict:
    return {k: tok.convert_tokens_to_ids(t) for k, t in HF_FOLDERS[family].tokens.items()}


@pytest.fixture(scope="module")
def round_trips(vl_tokenizer, tmp_path_factory):
    """(family, dtype) -> (original folder, folder converted back from our text GGUF + mmproj)."""
    out = {}
    for family in ROUND_TRIP:
        for dtype in DTYPES:
            d = tmp_path_factory.mktemp(f"{family}-{dtype}")
            hf, back = str(d / "hf"), str(d / "back")
            entry = FAMILIES[family]
            FAMILIES[family] = (*entry[:4], {**entry[4], **_ids(family, vl_tokenizer)}, *entry[5:])
            try:
                make_vl(family, dtype, vl_tokenizer, hf)
            finally:
                FAMILIES[family] = entry
            export_gguf_with_mmproj(hf, d / "text.gguf", d / "mmproj.gguf")
            export_hf_folder_with_mmproj(d / "text.gguf", d / "mmproj.gguf", back, progress=False)
            out[family, dtype] = hf, back
    return out


def _state(folder: str) -> dict:
    return safetensors_torch.load_file(os.path.join(folder, "model.safetensors"))


def assert_same_tensors(family: str, dtype: str, ref: dict, got: dict) -> None:
    import re

    assert sorted(got) == sorted(ref)
    lossy = LOSSY.get((family, dtype), {})
    for name, x in ref.items():
        y = got[name]
        assert (y.dtype, tuple(y.shape)) == (x.dtype, tuple(x.shape)), name
        tol = next((t for p, t in lossy.items() if re.search(p, name)), None)
        if tol is None:
            assert torch.equal(x, y), f"{name}: not bit-exact ({(x.float() - y.float()).abs().max().item():.3g})"
        else:
            assert (x.float() - y.float()).abs().max().item() <= tol, name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ROUND_TRIP)
def test_folder_loads_as_the_class_with_the_original_tensors(family, dtype, round_trips):
    hf, back = round_trips[family, dtype]
    model = transformers.AutoModelForImageTextToText.from_pretrained(back, dtype=getattr(torch, dtype))
    assert type(model).__name__ == FAMILIES[family][1]
    orig = transformers.AutoConfig.from_pretrained(hf)
    cfg = model.config
    assert type(cfg.text_config) is type(orig.text_config) and type(cfg.vision_config) is type(orig.vision_config)
    assert_same_tensors(family, dtype, _state(hf), _state(back))
    with open(os.path.join(back, "preprocessor_config.json")) as fh:  # (transformers' image processors need PIL)
        pre = json.load(fh)
    want = FAMILIES[family][5]
    assert set(pre) <= set(want) and {"image_mean", "image_std", "image_processor_type"} <= set(pre)
    for key, value in pre.items():
        assert value == (pytest.approx(want[key]) if key.startswith("image_") else want[key]), key


def _logits(family: str, folder: str, img: np.ndarray, as_stored: bool = False) -> np.ndarray:
    """transformers' logits at every position of `text, the image's tokens, text` with the folder's own ids;
    `as_stored`: the weights the mmproj stores in float16 rounded to it first (the forward conversion's loss)."""
    model = getattr(transformers, FAMILIES[family][1]).from_pretrained(folder, dtype=torch.float32).eval()
    if as_stored:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if any(f in name for f in VISION_ARCHS[family].f16):
                    param.copy_(param.half().float())
    cfg, pre = model.config, FAMILIES[family][5]
    image_id = getattr(cfg, "image_token_id", None) or cfg.image_token_index
    with torch.no_grad():
        if family == "gemma3":
            x = (img.astype(np.float32) / 255.0 - np.float32(pre["image_mean"])) / np.float32(pre["image_std"])
            ids = torch.tensor([[0, 10, 11, cfg.boi_token_index] + [image_id] * cfg.mm_tokens_per_image + [12, 13]])
            out = model(input_ids=ids, pixel_values=torch.from_numpy(x.transpose(2, 0, 1)[None].copy()),
                        token_type_ids=(ids == image_id).long())
        else:
            pixels, grid = qwen_patches(img, pre["image_mean"], pre["image_std"], ps=pre["patch_size"])
            n = grid[1] * grid[2] // 4
            ids = torch.tensor([[0, 10, cfg.vision_start_token_id] + [image_id] * n + [cfg.vision_end_token_id, 12]])
            out = model(input_ids=ids, pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.tensor([grid]),
                        mm_token_type_ids=(ids == image_id).long())
    return out.logits[0].float().numpy()


@pytest.mark.parametrize("family", ROUND_TRIP)
def test_logits_given_an_image_equal_the_original(family, round_trips):
    hf, back = round_trips[family, "float32"]
    img = _image(*FAMILIES[family][6])
    ref, got = _logits(family, hf, img), _logits(family, back, img)
    stored = _logits(family, hf, img, as_stored=True)  # what llama.cpp's converter keeps (Gemma 3: a float16 matrix)
    diff, exact = float(np.abs(ref - got).max()), float(np.abs(stored - got).max())
    moved = float(np.abs(ref - _logits(family, hf, 255 - img)).max())  # the image matters to the logits
    print(f"\n{family}: {ref.shape[0]} positions, max |logit diff| {diff:.3g} against the original, {exact:.3g} "
          f"against it with its float16-stored weights rounded (another image: {moved:.3g}; logits up to "
          f"{np.abs(ref).max():.3g})")
    assert exact < 1e-5 and diff < 1e-2 and moved > 100 * diff, (exact, diff, moved)


# llama.cpp's converter, told that the shared tiny tokenizer (llama-bpe's pre-tokenizer, a vocabulary of its own) is
# llama-bpe: its pre-tokenizer check hashes a fixed text's tokens and knows only published vocabularies
_LLAMA_CPP = """import os, runpy, sys
conv = sys.argv[1]
sys.path[:0] = [os.path.dirname(conv), os.path.join(os.path.dirname(conv), "gguf-py")]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "llama-bpe"
sys.argv = sys.argv[1:]
runpy.run_path(conv, run_name="__main__")
"""


def llama_cpp_convert(hf: str, out: str, outtype: str, *flags: str) -> str:
    if not os.path.isfile(CONVERTER):
        pytest.skip(f"llama.cpp's converter is not at {CONVERTER} (see docs/multimodal.md)")
    r = subprocess.run([sys.executable, "-c", _LLAMA_CPP, CONVERTER, hf, *flags, "--outtype", outtype,
                        "--outfile", out], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ROUND_TRIP)
def test_llama_cpp_converters_files_round_trip(family, dtype, round_trips, tmp_path):
    """llama.cpp's own `convert_hf_to_gguf.py` text GGUF and `--mmproj` file give the same tensors back, and
    its mmproj beside our text GGUF gives the same folder as ours."""
    hf, back = round_trips[family, dtype]
    outtype = {"float32": "f32"}.get(dtype, "bf16")
    mm = llama_cpp_convert(hf, str(tmp_path / "ref-mmproj.gguf"), outtype, "--mmproj")
    text = llama_cpp_convert(hf, str(tmp_path / "ref-text.gguf"), outtype)
    export_hf_folder_with_mmproj(text, mm, tmp_path / "theirs", progress=False)
    assert_same_tensors(family, dtype, _state(hf), _state(str(tmp_path / "theirs")))
    ours = os.path.join(os.path.dirname(back), "text.gguf")
    export_hf_folder_with_mmproj(ours, mm, tmp_path / "mixed", progress=False)
    with open(os.path.join(back, "model.safetensors"), "rb") as a, \
            open(tmp_path / "mixed" / "model.safetensors", "rb") as b:
        assert a.read() == b.read()


@pytest.mark.parametrize("family", ["gemma3", "qwen2_5_vl"])
def test_command_line_writes_the_same_folder(family, round_trips, tmp_path):
    """`lazyweights convert ADAPTER text.gguf --mmproj mmproj.gguf -o DIR/` writes the folder the API writes."""
    from lazyweights.tools.cli import main

    hf, back = round_trips[family, "bfloat16"]
    d = os.path.dirname(back)
    out = str(tmp_path / "out")
    assert main(["convert", "lazyweights.adapters:convert_gguf_state_dict", os.path.join(d, "text.gguf"), "-o", out,
                 "--mmproj", os.path.join(d, "mmproj.gguf"), "--no-progress"]) == 0
    assert sorted(os.listdir(out)) == sorted(os.listdir(back))
    for name in os.listdir(back):
        with open(os.path.join(back, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
            assert a.read() == b.read(), name


# --- bad input ---------------------------------------------------------------------------------------------------
def _pair(round_trips, family="qwen2_5_vl"):
    d = os.path.dirname(round_trips[family, "float32"][1])
    return load_weights([os.path.join(d, "text.gguf")]), load_weights([os.path.join(d, "mmproj.gguf")])


def test_unknown_projector_is_named(round_trips):
    t, m = _pair(round_trips)
    cfg = types.SimpleNamespace(metadata={**m.config.metadata, "clip.projector_type": "pixtral"})
    with pytest.raises(UnknownProjectorError, match=r"clip.projector_type 'pixtral' .*gemma3, qwen2.5vl_merger, "
                                                   r"qwen2vl_merger"):
        convert_mmproj_to_hf(dict(t.items()), t.config, dict(m.items()), cfg)


def test_text_model_of_another_family_is_named(round_trips):
    t, _ = _pair(round_trips, "qwen2_5_vl")
    _, m = _pair(round_trips, "gemma3")
    with pytest.raises(MmprojMismatchError, match=r"'gemma3' \(Gemma3ForConditionalGeneration\) needs a text model of "
                                                  r"architecture gemma3; .* is 'qwen2vl'"):
        convert_mmproj_to_hf(dict(t.items()), t.config, dict(m.items()), m.config)


def test_text_model_of_another_width_is_named(round_trips, tmp_path):
    from lazyweights.tools.cli import main

    t, m = _pair(round_trips)
    cfg = types.SimpleNamespace(metadata={**m.config.metadata, "clip.vision.projection_dim": 128})
    with pytest.raises(MmprojMismatchError, match=r"projection_dim is 128 but .*qwen2vl.embedding_length is 64"):
        convert_mmproj_to_hf(dict(t.items()), t.config, dict(m.items()), cfg)
    # on the command line: the text model passed as the mmproj too is refused, nothing written
    text = os.path.join(os.path.dirname(round_trips["qwen2_5_vl", "float32"][1]), "text.gguf")
    assert main(["convert", "lazyweights.adapters:convert_gguf_state_dict", text, "-o", str(tmp_path / "out"),
                 "--mmproj", text, "--no-progress"]) != 0
    assert os.listdir(tmp_path) == []
