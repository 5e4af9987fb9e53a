#!/usr/bin/env python3
"""mmproj GGUF from a multimodal Hugging Face folder (issue 39): lazyweights against llama.cpp's own converter.

    python benchmarks/bench_mmproj.py [--reps 3] [--only gemma3 qwen2_5_vl ...] [--width 512] [--blocks 6]
                                      [--no-reverse] [--scratch DIR]

Checkpoints: for each family `lazyweights.adapters.vision_archs` converts, a seeded random transformers model
whose vision tower (Qwen2-Audio: its Whisper encoder) is widened to `--width` (intermediate 4x, 8 heads) and
`--blocks` deep (default 512 x 6: about 19M tower parameters, 38 MB in bf16) beside a tiny text model, saved in
bfloat16 in the published layout with its preprocessor_config.json (Qwen2-Audio: none, as published) and a small
BPE tokenizer (the configs are a copy of tests/adapters/test_mmproj.py's FAMILIES and AUDIO_FAMILIES with the
tower's sizes overridden).

Contestants, each in a fresh process (timed from process start: every one pays its imports), interleaved within
each repetition, the medians of `--reps` runs printed, memory warmed (a few GiB touched and freed) right before
each timer starts, peak RssAnon (private memory sampled from /proc every 20 ms, mapped file pages excluded):

llama.cpp   `convert_hf_to_gguf.py HF --mmproj --outtype bf16` from the llama-cpp-python 0.3.36 sdist
            ($LLAMA_CPP_SDIST or /tmp/lcp-sdist/llama_cpp_python-0.3.36) with the sdist's own gguf-py first on
            sys.path (the wheel's gguf package is older than its converter); InternVL from the Intern-S1 layout
            it reads (the same tensors under `model.`)
mmproj      lazyweights `export_mmproj(HF, out)`
text+mmproj lazyweights `export_gguf_with_mmproj(HF, text, mmproj, tokenizer=False)`: both files, one open
floor       a plain copy of the source bytes of the tensors the mmproj holds (read from the safetensors file into
            fresh memory, written to a file), in a fresh process
reverse     lazyweights `export_hf_folder_with_mmproj(text, mmproj, out, tokenizer=False)` (GGUF -> HF: no peer)

The two mmproj files must hold the same tensors (names, types, shapes, bytes) and metadata except general.name /
general.size_label (llama.cpp derives them from the folder's name) and where tests/adapters/test_mmproj.py holds
that llama.cpp's converter is wrong (Mistral 3's v.token_embd.img_break, left out of its file; InternVL's CLS
position row, stored last in ours). LLaVA: llama.cpp's converter refuses the checkpoint ("Unsupported model
type: clip_vision_model"), so ours is timed against the floor only.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SDIST = os.environ.get("LLAMA_CPP_SDIST", "/tmp/lcp-sdist/llama_cpp_python-0.3.36")
CONVERTER = os.path.join(SDIST, "vendor", "llama.cpp", "convert_hf_to_gguf.py")

# --- the families: a copy of tests/adapters/test_mmproj.py's FAMILIES (a benchmark does not import tests/) --------
_SPECIAL = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
_TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=256, **_SPECIAL)
_QWEN_PRE = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
             "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": 12845056}
_MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
_HALF = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
_CLIP = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}

# family -> (config class, model class, text config, vision config, outer config, preprocessor config)
FAMILIES = {
    "gemma3": ("Gemma3Config", "Gemma3ForConditionalGeneration", dict(_TEXT, query_pre_attn_scalar=16),
               dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, image_size=64,
                    patch_size=8, layer_norm_eps=1e-6, vision_use_head=False),
               dict(mm_tokens_per_image=16, image_token_index=3, boi_token_index=4, eoi_token_index=5),
               dict(_HALF, image_processor_type="Gemma3ImageProcessor", size={"height": 64, "width": 64},
                    image_seq_length=16)),
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", dict(_TEXT, rope_parameters=_MROPE),
                 dict(depth=3, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2),
                 dict(_SPECIAL, image_token_id=3), dict(_QWEN_PRE, image_processor_type="Qwen2VLImageProcessor")),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", dict(_TEXT, rope_parameters=_MROPE),
                   dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=14,
                        spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1, 3]),
                   dict(_SPECIAL, image_token_id=3), dict(_QWEN_PRE, image_processor_type="Qwen2VLImageProcessor")),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
                 dict(_TEXT, num_hidden_layers=3, rope_parameters=dict(_MROPE, mrope_interleaved=True)),
                 dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=16,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[0, 2]),
                 dict(_SPECIAL, image_token_id=3),
                 dict(_QWEN_PRE, patch_size=16, image_processor_type="Qwen2VLImageProcessor")),
    "gemma4": ("Gemma4Config", "Gemma4ForConditionalGeneration",
               dict(_TEXT, global_head_dim=32, layer_types=["sliding_attention", "full_attention"], sliding_window=128,
                    hidden_size_per_layer_input=0, num_kv_shared_layers=0),
               dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=16, patch_size=8, position_embedding_size=64,
                    pooling_kernel_size=3),
               dict(image_token_id=3, boi_token_id=4, eoi_token_id=5, audio_config=None),
               {"image_processor_type": "Gemma4ImageProcessor", "image_mean": [0.0] * 3, "image_std": [1.0] * 3,
                "patch_size": 8, "pooling_kernel_size": 3, "do_normalize": False}),
    "internvl": ("InternVLConfig", "InternVLForConditionalGeneration", dict(_TEXT),
                 dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
                      image_size=[64, 64], patch_size=[8, 8], attention_bias=True),
                 dict(image_token_id=3, downsample_ratio=0.5),
                 {"image_processor_type": "GotOcr2ImageProcessorFast", "image_mean": [0.485, 0.456, 0.406],
                  "image_std": [0.229, 0.224, 0.225], "size": {"height": 64, "width": 64}}),
    "lfm2_vl": ("Lfm2VlConfig", "Lfm2VlForConditionalGeneration",
                dict(_TEXT, model_type="lfm2", layer_types=["conv", "full_attention"]),
                dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2, num_patches=256,
                     patch_size=16, vision_use_head=False),
                dict(image_token_id=3, projector_hidden_size=64, downsample_factor=2),
                dict(_HALF, image_processor_type="Lfm2VlImageProcessorFast")),
    "llama4": ("Llama4Config", "Llama4ForConditionalGeneration",
               dict(_TEXT, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=4, num_local_experts=4,
                    num_experts_per_tok=1, interleave_moe_layer_step=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
               dict(hidden_size=32, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2, image_size=56,
                    patch_size=14, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64,
                    pixel_shuffle_ratio=0.5),
               dict(image_token_index=3),
               dict(_HALF, image_processor_type="Llama4ImageProcessorFast")),
    "mistral3": ("Mistral3Config", "Mistral3ForConditionalGeneration", dict(_TEXT, model_type="mistral"),
                 dict(model_type="pixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=2, head_dim=16, image_size=64, patch_size=8, hidden_act="silu",
                      rope_theta=10000.0),
                 dict(image_token_index=300, spatial_merge_size=2, projector_hidden_act="gelu",
                      vision_feature_layer=-1),
                 dict(_CLIP, image_processor_type="PixtralImageProcessor", patch_size=8, size={"longest_edge": 64})),
    "idefics3": ("Idefics3Config", "Idefics3ForConditionalGeneration", dict(_TEXT),
                 dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2, image_size=64,
                      patch_size=8),
                 dict(image_token_id=300, scale_factor=2),
                 dict(_HALF, image_processor_type="Idefics3ImageProcessor", size={"longest_edge": 64},
                      max_image_size={"longest_edge": 64})),
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration", dict(_TEXT),
              dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                   num_attention_heads=2, image_size=56, patch_size=14, projection_dim=32, hidden_act="quick_gelu",
                   layer_norm_eps=1e-5),
              dict(image_token_index=3, projector_hidden_act="gelu", vision_feature_layer=-2,
                   vision_feature_select_strategy="default", image_seq_length=16),
              dict(_CLIP, image_processor_type="CLIPImageProcessor", crop_size={"height": 56, "width": 56},
                   size={"shortest_edge": 56})),
}
# Qwen2-Audio's Whisper encoder (an audio config, no preprocessor_config.json: the published layout)
FAMILIES["qwen2_audio"] = ("Qwen2AudioConfig", "Qwen2AudioForConditionalGeneration", dict(_TEXT, model_type="qwen2"),
                           dict(d_model=32, encoder_layers=3, encoder_attention_heads=2, encoder_ffn_dim=48,
                                num_mel_bins=128, max_source_positions=1500),
                           dict(audio_token_index=3), None)
AUDIO = ("qwen2_audio",)
SPECIAL_TOKENS = {"mistral3": ["[IMG]", "[IMG_BREAK]", "[IMG_END]"],
                  "idefics3": ["<image>", "<fake_token_around_image>", "<global-img>", "<row_1_col_1>", "\n\n"]}
CONVERTER_REFUSES = {"llava": "Unsupported model type: clip_vision_model"}
# where llama.cpp's converter is wrong (tests/adapters/test_mmproj.py holds both): a tensor it leaves out, and
# InternVL's position table whose CLS row ours stores last
CONVERTER_OMITS = {"mistral3": ("v.token_embd.img_break",)}
CLS_ROW_LAST = {"internvl": "v.position_embd.weight"}
# Llama 4 towers of more than 3 blocks: llama.cpp's converter names each block's post_attention_layernorm
# v.blk.N.attn_post_norm (gguf-py maps vision_model.model.layers.{bid}.post_attention_layernorm to both Llama 4's
# ln2 and Gemma 4's attn_post_norm), which mtmd's Llama 4 graph does not read as ln2; ours writes v.blk.N.ln2 (as
# llama.cpp's converter does for 3 blocks, tests/adapters/test_mmproj.py). Compared with their name mapped to ours.
CONVERTER_RENAMES = {"llama4": (re.compile(r"^(v\.blk\.\d+\.)attn_post_norm\."), r"\1ln2.")}
# the families whose mmproj export_hf_folder_with_mmproj converts back (the others raise UnknownProjectorError)
REVERSE = ("gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# the tensors an mmproj holds: everything but the text model (the names each family's checkpoint uses)
VISION = re.compile(r"^(model\.)?(vision_tower|visual|vision_model|multi_modal_projector|embed_vision|connector|"
                    r"mlp1|audio_tower)\.")


def tower(family: str, width: int, blocks: int) -> dict:
    """The vision config overrides that make `family`'s tower `width` wide (intermediate 4x, 8 heads of
    width / 8) and `blocks` deep, keeping each family's constraints (Qwen2.5-VL's full-attention blocks,
    Qwen3-VL's deepstack layers, Llama 4's adapter at twice the width)."""
    heads = 8
    common = dict(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=blocks, num_attention_heads=heads)
    qwen = dict(depth=blocks, num_heads=heads)
    return {
        "gemma3": common,
        "qwen2_vl": dict(qwen, embed_dim=width, mlp_ratio=4),
        "qwen2_5_vl": dict(qwen, hidden_size=width, intermediate_size=4 * width,
                           fullatt_block_indexes=list(range(blocks // 2 - 1, blocks, blocks // 2))),
        "qwen3_vl": dict(qwen, hidden_size=width, intermediate_size=4 * width,
                         deepstack_visual_indexes=[0, blocks // 2]),
        "gemma4": dict(common, num_key_value_heads=heads, head_dim=width // heads),
        "internvl": common,
        "lfm2_vl": common,
        "llama4": dict(common, vision_output_dim=2 * width, projector_input_dim=2 * width),
        "mistral3": dict(common, head_dim=width // heads),
        "idefics3": common,
        "llava": dict(common, projection_dim=width),
        "qwen2_audio": dict(d_model=width, encoder_ffn_dim=4 * width, encoder_layers=blocks,
                            encoder_attention_heads=heads),
    }[family]


def tokenizer():
    """A small byte-level BPE (300 tokens, llama-bpe's pre-tokenizer), as the tests' shared tokenizer."""
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from lazyweights.formats.tokenizer_tables import PRE_TOKENIZER_SPLITS

    corpus = ("The quick brown fox jumps over the lazy dog. Café naïve résumé. 日本語 中文. "
              "def f(x): return x ** 2  # code\n\tindent   spaces\n\n1234 5678 🤖 emoji. ") * 10
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS["llama-bpe"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>", "<pad>", "<unk>"], show_progress=False)
    tok.train_from_iterator([corpus], trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")


def make(family: str, tok, folder: str, width: int, blocks: int) -> None:
    """The seeded bf16 model of `family` in the published layout, with its tokenizer and preprocessor config."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    if family in SPECIAL_TOKENS:
        tok = copy.deepcopy(tok)
        tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[family]})
    cfg_cls, model_cls, text, vision, outer, pre = FAMILIES[family]
    tower_key = "audio_config" if family in AUDIO else "vision_config"
    cfg = getattr(transformers, cfg_cls)(text_config=dict(text, vocab_size=len(tok)),
                                         **{tower_key: dict(vision, **tower(family, width, blocks))}, **outer)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim > 1 else 0.05) + (0.1 if p.ndim == 1 else 0.0))
    model.to(torch.bfloat16).save_pretrained(folder)
    del model
    if family in ("gemma3", "llava", "lfm2_vl"):  # the published layout: the tower under vision_tower.vision_model.
        path = os.path.join(folder, "model.safetensors")
        sd = {re.sub(r"^(model\.)?vision_tower\.(?!vision_model\.)", r"\1vision_tower.vision_model.", k): v
              for k, v in load_file(path).items()}
        save_file(sd, path, metadata={"format": "pt"})
    tok.save_pretrained(folder)
    if pre is not None:
        with open(os.path.join(folder, "preprocessor_config.json"), "w") as fh:
            json.dump(pre, fh)


def intern_s1_layout(hf: str) -> str:
    """InternVL as llama.cpp's converter reads it (its InternVisionModel keeps only `model.vision_tower.` /
    `model.multi_modal_projector.`): a copy with the `model.` prefix and the vision config naming that class."""
    from safetensors.torch import load_file, save_file

    out = hf.rstrip("/") + "-intern-s1"
    shutil.copytree(hf, out)
    path = os.path.join(out, "model.safetensors")
    sd = {re.sub(r"^(vision_tower|multi_modal_projector)\.", r"model.\1.", k): v for k, v in load_file(path).items()}
    save_file(sd, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as fh:
        cfg = json.load(fh)
    cfg["vision_config"]["architectures"] = ["InternVisionModel"]
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    return out


# --- the contestants ----------------------------------------------------------------------------------------------
_THEIRS = """
import runpy, sys
sys.path[:0] = [{gguf_py!r}, {root!r}]
sys.argv = ["convert_hf_to_gguf.py", {src!r}, "--mmproj", "--outtype", "bf16", "--outfile", {out!r}]
runpy.run_path({script!r}, run_name="__main__")
"""
_MMPROJ = """
from lazyweights.convert.mmproj import export_mmproj
export_mmproj({src!r}, {out!r})
"""
_BOTH = """
from lazyweights.convert.mmproj import export_gguf_with_mmproj
export_gguf_with_mmproj({src!r}, {text!r}, {out!r}, tokenizer=False)
"""
_REVERSE = """
from lazyweights.convert.mmproj_to_hf import export_hf_folder_with_mmproj
export_hf_folder_with_mmproj({text!r}, {mmproj!r}, {out!r}, tokenizer=False)
"""
# the floor: the source bytes of the tower's tensors, read from the file into fresh memory and written out
_FLOOR = """
import json, re, struct
src, out = {src!r}, {out!r}
pat = re.compile({pat!r})
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    spans = sorted(v["data_offsets"] for k, v in head.items() if k != "__metadata__" and pat.match(k))
    with open(out, "wb") as g:
        for a, b in spans:
            f.seek(8 + n + a)
            g.write(f.read(b - a))
"""


def warm_memory(gib: int = 2) -> None:
    """Touch and free a few GiB so the contestant's fresh memory is not the host's cold memory
    (ARCHITECTURE.md: these VMs hand freed memory back to their host about 2 s after a process frees it)."""
    b = bytearray(gib << 30)
    for i in range(0, len(b), 1 << 12):
        b[i] = 1
    del b


def measured(code: str) -> tuple[float, int]:
    """(wall seconds, peak RssAnon bytes) of `python -c code` in a fresh process, memory warmed first."""
    warm_memory()
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
    if p.returncode:
        raise RuntimeError(f"failed ({p.returncode}):\n{err[-3000:]}")
    return wall, peak


def _tensors(path: str) -> dict:
    import gguf
    import numpy as np

    return {t.name: (t.tensor_type.name, [int(x) for x in t.shape], np.asarray(t.data).view(np.uint8).tobytes())
            for t in gguf.GGUFReader(path).tensors}


def _fields(path: str) -> dict:
    import gguf

    return {k: ([t.name for t in f.types], f.contents()) for k, f in gguf.GGUFReader(path).fields.items()
            if not k.startswith("GGUF.") and k not in ("general.name", "general.size_label")}


def identical(family: str, ours: str, theirs: str) -> str:
    """'yes (N tensors)' when the two mmproj files hold the same tensors and metadata (general.name / size_label
    and the converter's known errors aside), else what differs."""
    import numpy as np

    mine, ref = _tensors(ours), _tensors(theirs)
    note = ""
    if family in CONVERTER_RENAMES:
        pat, repl = CONVERTER_RENAMES[family]
        renamed = {pat.sub(repl, k): v for k, v in ref.items()}
        if renamed.keys() != ref.keys():
            note = f", {sum(1 for k in ref if pat.match(k))} of llama.cpp's named attn_post_norm (ours: ln2)"
        ref = renamed
    for name in CONVERTER_OMITS.get(family, ()):
        if name in mine and name not in ref:
            del mine[name]
    if family in CLS_ROW_LAST and CLS_ROW_LAST[family] in ref and CLS_ROW_LAST[family] in mine:
        name = CLS_ROW_LAST[family]
        a, b = (np.frombuffer(t[name][2], np.uint8).reshape(int(ref[name][1][1]), -1) for t in (mine, ref))
        if np.array_equal(a, np.roll(b, -1, axis=0)):
            mine[name] = ref[name]
    if sorted(mine) != sorted(ref):
        return f"NO: names differ {sorted(set(mine) ^ set(ref))[:3]}"
    bad = [n for n in ref if mine[n] != ref[n]]
    if bad:
        return f"NO: {len(bad)} tensors differ, e.g. {bad[:3]}"
    if _fields(ours) != _fields(theirs):
        return "NO: metadata differs"
    return f"yes ({len(ref)} tensors{note})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="families to run (default: all)")
    ap.add_argument("--width", type=int, default=512, help="vision tower width (intermediate 4x, 8 heads)")
    ap.add_argument("--blocks", type=int, default=6, help="vision tower blocks")
    ap.add_argument("--no-reverse", action="store_true", help="skip export_hf_folder_with_mmproj")
    ap.add_argument("--scratch", default=None)
    a = ap.parse_args()
    have_peer = os.path.isfile(CONVERTER)
    if not have_peer:
        print(f"llama.cpp's converter is not at {CONVERTER}: timing lazyweights against the floor only")
    gguf_py = os.path.join(os.path.dirname(CONVERTER), "gguf-py")
    scratch = a.scratch or tempfile.mkdtemp(prefix="lw-mmproj-")
    tok = tokenizer()
    print(f"vision towers {a.width} wide x {a.blocks} blocks, bf16; medians of {a.reps} (fresh process each)")
    hdr = (f"{'family':11} {'tower MB':>8} | {'llama.cpp s':>11} {'peak':>7} | {'mmproj s':>8} {'peak':>7} | "
           f"{'ratio':>6} | {'text+mm s':>9} {'peak':>7} | {'floor s':>7} | {'reverse s':>9} {'peak':>7} | identical")
    print(hdr, flush=True)
    for family in a.only or FAMILIES:
        d = os.path.join(scratch, family)
        hf = os.path.join(d, "hf")
        shutil.rmtree(d, ignore_errors=True)
        make(family, tok, hf, a.width, a.blocks)
        peer = have_peer and family not in CONVERTER_REFUSES
        their_src = intern_s1_layout(hf) if peer and family == "internvl" else hf
        p = {n: os.path.join(d, n) for n in ("theirs.gguf", "ours.gguf", "both-mm.gguf", "text.gguf", "floor.bin",
                                            "back")}
        runs: dict[str, list[tuple[float, int]]] = {k: [] for k in ("theirs", "ours", "both", "floor", "reverse")}
        codes = {"theirs": _THEIRS.format(gguf_py=gguf_py, root=os.path.dirname(CONVERTER), src=their_src,
                                          out=p["theirs.gguf"], script=CONVERTER),
                 "ours": _MMPROJ.format(src=hf, out=p["ours.gguf"]),
                 "both": _BOTH.format(src=hf, text=p["text.gguf"], out=p["both-mm.gguf"]),
                 "floor": _FLOOR.format(src=os.path.join(hf, "model.safetensors"), out=p["floor.bin"],
                                        pat=VISION.pattern),
                 "reverse": _REVERSE.format(text=p["text.gguf"], mmproj=p["both-mm.gguf"], out=p["back"])}
        reverse = family in REVERSE and not a.no_reverse
        order = [k for k in codes if (k != "theirs" or peer) and (k != "reverse" or reverse)]
        errs = []
        for _ in range(a.reps):
            for k in list(order):
                if k == "reverse":
                    shutil.rmtree(p["back"], ignore_errors=True)
                try:
                    runs[k].append(measured(codes[k]))
                except RuntimeError as e:
                    errs.append(f"{k}: {str(e).strip().splitlines()[-1]}")
                    order.remove(k)
        med = {k: (statistics.median(w for w, _ in v), max(m for _, m in v)) for k, v in runs.items() if v}
        same = identical(family, p["ours.gguf"], p["theirs.gguf"]) if "theirs" in med and "ours" in med else \
            CONVERTER_REFUSES.get(family, "no peer")
        if "ours" in med and "both" in med and _tensors(p["ours.gguf"]) != _tensors(p["both-mm.gguf"]):
            same += "; text+mmproj's mmproj DIFFERS from export_mmproj's"
        size = os.path.getsize(p["floor.bin"]) if os.path.exists(p["floor.bin"]) else 0

        def cell(k: str, width: int = 7, med: dict = med) -> str:
            return f"{med[k][0]:{width}.2f} {med[k][1] / 2**20:5.0f}MB" if k in med else f"{'-':>{width}} {'-':>7}"

        ratio = f"{med['theirs'][0] / med['ours'][0]:5.2f}x" if "theirs" in med and "ours" in med else f"{'-':>6}"
        floor = f"{med['floor'][0]:7.2f}" if "floor" in med else f"{'-':>7}"
        print(f"{family:11} {size / 1e6:8.1f} | {cell('theirs', 11)} | {cell('ours', 8)} | {ratio} | "
              f"{cell('both', 9)} | {floor} | {cell('reverse', 9)} | {same}", flush=True)
        for e in errs:
            print(f"  {family} {e}", flush=True)
        shutil.rmtree(d, ignore_errors=True)
    if not a.scratch:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
