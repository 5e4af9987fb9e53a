"""mmproj GGUF -> Hugging Face: a text GGUF and its mmproj become one `...ForConditionalGeneration` folder.

The reverse of `lazyweights.convert.mmproj` (issue 39), driven by the same vision records (`vision_archs`): the
mmproj's `clip.projector_type` picks the record, gguf-py's MMPROJ table (built for `clip.vision.block_count`)
inverted and narrowed to the family's own spelling (`HFFolder.spelling`) names each tower tensor, and each of the
record's transforms is undone lazily: fused qkv rows concatenated back (`VisionArch.qkv`), the two frames of a
temporal patch embedding stacked back into the Conv3d (`temporal_patch`), a norm stored w + 1 shifted back in
float32 (`norm_shift`), the renames undone for the bare parameters that had one (`HFFolder.params`), every tensor
cast to the folder's dtype (default: the mmproj's own float type, `general.file_type`). The text half is the text
direction's (`tensors.gguf_to_hf`, `to_hf.hf_config_from_gguf`), placed under the class's text prefix; config.json
gets the text config as `text_config`, the `clip.*` keys as `vision_config` (each `VParam` row written back to its
first config name, or `HFFolder.config_names`' name), and `preprocessor_config.json` the image mean and std.

Round trip (HF -> our GGUFs -> HF): bit-exact where the forward conversion was lossless, that is every tensor of
a float32 or bfloat16 checkpoint except what llama.cpp's converter rounds: Gemma 3's `mm_input_projection_weight`
(stored float16), its `mm_soft_emb_norm` (stored w + 1 in float32: exact for a bfloat16 source, within 1 ulp of 1
for float32), and on the text side what the text direction rounds (Gemma's norms, likewise stored w + 1).

Bad input is a named error before any tensor is read: an mmproj whose projector no record knows
(`UnknownProjectorError`), an mmproj beside a text model of another architecture or whose
`clip.vision.projection_dim` is not the text model's width (`MmprojMismatchError`), a tower tensor the family's
spelling cannot name (`UnmappedTensorError`).

Example:
    >>> from lazyweights.convert.mmproj_to_hf import hf_folder_for_projector
    >>> rec, folder = hf_folder_for_projector("qwen2.5vl_merger")
    >>> rec.hf_class, folder.vision_model_type
    ('Qwen2_5_VLForConditionalGeneration', 'qwen2_5_vl_vision')
    >>> try:
    ...     hf_folder_for_projector("pixtral")
    ... except ValueError as e:
    ...     print(str(e).split(";")[0])
    mmproj clip.projector_type 'pixtral' has no Hugging Face folder record
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping, NamedTuple, Sequence

from ..adapters.vision_archs import VISION_ARCHS, VisionArch
from ..core.dtype import DType
from ..core.errors import MmprojMismatchError, UnknownProjectorError, UnmappedTensorError
from ..lazy.weight_data import WeightData, as_weight_data

__all__ = ["HFFolder", "HF_FOLDERS", "hf_folder_for_projector", "convert_mmproj_to_hf",
           "export_hf_folder_with_mmproj"]


class HFFolder(NamedTuple):
    """What a vision record needs besides its tensor transforms to write the Hugging Face folder back (one
    comment per field)."""

    text_prefix: str                          # where the text model's names go (Gemma 3: language_model.)
    text_model_type: str                      # text_config.model_type
    vision_model_type: str                    # vision_config.model_type
    spelling: tuple[str, ...]                 # regexes: the family's HF names among gguf-py's candidates
    processor: Mapping[str, Any]              # preprocessor_config.json; "vision.KEY" values from vision_config
    params: tuple[str, ...] = ()              # bare HF parameters the record's renames gave a `.weight`
    config_names: Mapping[str, str] = {}      # clip key -> vision config name, where not the row's first name
    vision: Mapping[str, Any] = {}            # vision config values no clip key holds
    projection: str = ""                      # vision config name of clip.vision.projection_dim
    tokens: Mapping[str, str] = {}            # config.json id keys <- the tokenizer's special token text
    mrope: bool = False                       # text rope_parameters.mrope_section <- {arch}.rope.dimension_sections
    ratios: Mapping[str, tuple[str, int, str]] = {}  # vision config name <- (GGUF tensor, axis, clip key): the
                                                     # tensor's size on that axis over the key's value (no key says)
    sizes: Mapping[str, tuple[str, int]] = {}  # vision config name <- (GGUF tensor, axis): its size there
    rope: Mapping[str, Any] = {}              # text rope_parameters the GGUF architecture implies
    text_archs: tuple[str, ...] = ()          # the text GGUF's general.architecture(s) the class holds
    layout: tuple[tuple[str, str], ...] = ()  # (regex, replacement), the first that matches: the saved layout's
                                              # names for the text_prefix'ed text and the record's tower names


HF_FOLDERS: dict[str, HFFolder] = {
    "gemma3": HFFolder(
        "language_model.", "gemma3_text", "siglip_vision_model",
        (r"^vision_tower\.vision_model\.(embeddings\.(patch|position)_embedding|post_layernorm|encoder\.layers\.\d+\."
         r"(layer_norm[12]|mlp\.fc[12]|self_attn\.(q|k|v|out)_proj))\.", r"^multi_modal_projector\."),
        {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": "vision.image_size",
                                                                 "width": "vision.image_size"}},
        params=("multi_modal_projector.mm_input_projection_weight",),
        config_names={"clip.vision.block_count": "num_hidden_layers"}, vision={"vision_use_head": False},
        tokens={"image_token_index": "<image_soft_token>", "boi_token_index": "<start_of_image>",
                "eoi_token_index": "<end_of_image>"}, text_archs=("gemma3",)),
    "qwen2_5_vl": HFFolder(
        "", "qwen2_5_vl_text", "qwen2_5_vl_vision",
        (r"^visual\.(patch_embed\.proj|blocks\.\d+\.(norm[12]|attn\.(qkv|proj)|mlp\.(gate|up|down)_proj)|"
         r"merger\.(ln_q|mlp\.[02]))\.",),
        {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": "vision.patch_size",
         "merge_size": "vision.spatial_merge_size", "temporal_patch_size": "vision.temporal_patch_size"},
        vision={"in_channels": 3}, projection="out_hidden_size",
        tokens={"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"},
        mrope=True, text_archs=("qwen2vl",)),
    "qwen2_vl": HFFolder(
        "", "qwen2_vl_text", "qwen2_vl_vision",
        (r"^visual\.(patch_embed\.proj|blocks\.\d+\.(norm[12]|attn\.(qkv|proj)|mlp\.fc[12])|merger\.(ln_q|mlp\.[02]))\.",),
        {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": "vision.patch_size",
         "merge_size": "vision.spatial_merge_size", "temporal_patch_size": "vision.temporal_patch_size"},
        vision={"in_channels": 3},
        tokens={"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"},
        mrope=True, ratios={"mlp_ratio": ("v.blk.0.ffn_up.weight", 0, "clip.vision.embedding_length")},
        text_archs=("qwen2vl",)),
    # Qwen3-VL: mergers named by the record's `names` table (inverted), deepstack mergers back to their list index,
    # the learned position grid's size from its tensor; llama.cpp's qwen3vl text model always interleaves M-RoPE
    "qwen3_vl": HFFolder(
        "", "qwen3_vl_text", "qwen3_vl_vision",
        (r"^visual\.(pos_embed|blocks\.\d+\.(norm[12]|attn\.(qkv|proj)|mlp\.linear_fc[12]))\.",),
        {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": "vision.patch_size",
         "merge_size": "vision.spatial_merge_size", "temporal_patch_size": "vision.temporal_patch_size"},
        vision={"in_channels": 3}, projection="out_hidden_size",
        tokens={"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"},
        mrope=True, rope={"mrope_interleaved": True}, sizes={"num_position_embeddings": ("v.position_embd.weight", 0)},
        layout=((r"^model\.", "model.language_model."), (r"^visual\.", "model.visual.")), text_archs=("qwen3vl",)),
}


def hf_folder_for_projector(projector: Any) -> tuple[VisionArch, HFFolder]:
    """The vision record and folder record for an mmproj's `clip.projector_type`; UnknownProjectorError listing
    the projectors that convert back (see the module example)."""
    for mt, folder in HF_FOLDERS.items():
        if VISION_ARCHS[mt].projector == projector:
            return VISION_ARCHS[mt], folder
    known = sorted(VISION_ARCHS[mt].projector for mt in HF_FOLDERS)
    raise UnknownProjectorError(f"mmproj clip.projector_type {projector!r} has no Hugging Face folder record; "
                                f"projectors that convert back: {', '.join(known)}")


def _plain(v: Any) -> Any:
    """A GGUF metadata value as plain Python (arrays as lists)."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if hasattr(v, "value") and not isinstance(v, (int, float, str, bool)):
        return _plain(v.value)
    if isinstance(v, (list, tuple)) or type(v).__name__ == "GGUFArray":
        return [_plain(x) for x in v]
    return v


_DTYPES = {0: DType.float32, 1: DType.float16, 32: DType.bfloat16}


def _check(mm_md: Mapping[str, Any], text_md: Mapping[str, Any]) -> tuple[VisionArch, HFFolder, str]:
    """The records for the pair, or a named error: an unknown projector, a text model of another width."""
    if mm_md.get("general.architecture") != "clip":
        raise UnknownProjectorError(f"mmproj general.architecture is {mm_md.get('general.architecture')!r}, not "
                                    "'clip' (is the text model passed as the mmproj?)")
    rec, folder = hf_folder_for_projector(mm_md.get("clip.projector_type"))
    arch = text_md.get("general.architecture")
    if folder.text_archs and arch not in folder.text_archs:
        raise MmprojMismatchError(f"mmproj clip.projector_type {rec.projector!r} ({rec.hf_class}) needs a text model "
                                  f"of architecture {' or '.join(folder.text_archs)}; the text GGUF's "
                                  f"general.architecture is {arch!r}")
    width = text_md.get(f"{arch}.embedding_length")
    proj = mm_md.get("clip.vision.projection_dim")
    if width is None or proj is None or int(width) != int(proj):
        raise MmprojMismatchError(f"mmproj clip.vision.projection_dim is {proj} but the text model ({arch}) "
                                  f"{arch}.embedding_length is {width}; the mmproj belongs to another text model")
    return rec, folder, str(arch)


def _candidates(tmap) -> dict[str, list[str]]:
    inv: dict[str, list[str]] = {}
    for hf, (_, gguf_name) in tmap.mapping.items():
        inv.setdefault(gguf_name, []).append(hf)
    return inv


def _inverted(pattern: str, repl: str) -> tuple[str, str]:
    """A record `names` row (HF regex -> GGUF replacement) turned around: (GGUF regex, HF replacement), each of
    the row's groups carried over in order.

    >>> print(*_inverted(r"^visual\\.merger\\.linear_fc(1|2)\\.", r"mm.\\1."))
    ^mm\\.(1|2)\\. visual.merger.linear_fc\\1.
    """
    groups = re.findall(r"\((.*?)\)", pattern)
    pieces = re.split(r"\\(\d)", repl)
    rev = "^" + "".join(re.escape(p) if i % 2 == 0 else f"({groups[int(p) - 1]})" for i, p in enumerate(pieces))
    body = pattern.removeprefix("^")
    end = body.endswith("$")
    numbers = iter(range(1, len(groups) + 1))
    back = re.sub(r"\((.*?)\)", lambda m: f"\\{next(numbers)}", body.removesuffix("$")).replace("\\.", ".")
    return rev + ("$" if end else ""), back


def _own_hf_name(rec: VisionArch, name: str, deepstack: list[int]) -> str | None:
    """The HF name the record's `names` table gives a GGUF tensor (a deepstack merger's vision block made its list
    index again), or None."""
    for pattern, repl in rec.names:
        rev, back = _inverted(pattern, repl)
        if re.search(rev, name):
            hf = re.sub(rev, back, name)
            if rec.deepstack and hf.startswith(rec.deepstack):
                block, _, rest = hf[len(rec.deepstack):].partition(".")
                if int(block) not in deepstack:
                    raise UnmappedTensorError(f"{name}: a deepstack merger after vision block {block}, but "
                                              f"clip.vision.is_deepstack_layers marks blocks {deepstack}")
                hf = f"{rec.deepstack}{deepstack.index(int(block))}.{rest}"
            return hf
    return None


def _hf_name(rec: VisionArch, folder: HFFolder, inv: Mapping[str, list[str]], name: str,
             deepstack: list[int]) -> str:
    """The family's HF name for a GGUF tower tensor (a qkv piece named as its fused tensor)."""
    own = _own_hf_name(rec, name, deepstack)
    if own is not None:
        return own
    base, dot, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        base, suffix = name, ""
    hits = []
    for cand in inv.get(base, ()):
        full = f"{cand}.{suffix}" if suffix else cand
        if rec.qkv:
            for part in "qkv":
                piece = rec.qkv.replace("qkv", part)
                if piece in full:
                    full = full.replace(piece, rec.qkv)
        if any(re.search(p, full) for p in folder.spelling):
            hits.append(full)
    hits = list(dict.fromkeys(hits))
    if len(hits) != 1:
        raise UnmappedTensorError(f"{name}: {len(hits)} {rec.model_type} Hugging Face names for it from gguf-py's "
                                  f"MMPROJ table ({', '.join(hits) or 'none'})")
    hf = hits[0]
    for param in folder.params:  # undo the record's renames where the HF name is a bare parameter
        renamed = param
        for old, new in rec.renames:
            renamed = renamed.replace(old, new)
        if renamed == hf:
            return param
    return hf


def vision_tensors(rec: VisionArch, folder: HFFolder, state: Mapping[str, Any], n_block: int,
                   dtype: DType, deepstack: Sequence[int] = ()) -> dict[str, WeightData]:
    """The tower's HF tensors (lazy, in `dtype`) from the mmproj's: each record transform undone (`deepstack`: the
    vision blocks with a deepstack merger)."""
    import gguf

    from .transforms import add_scalar

    inv = _candidates(gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, n_block))
    parts: dict[str, dict[str, WeightData]] = {}
    out: dict[str, WeightData] = {}
    for name, value in state.items():
        wd = as_weight_data(value, name)
        if rec.temporal_patch and name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
            parts.setdefault(rec.temporal_patch, {})[name] = wd
            continue
        hf = _hf_name(rec, folder, inv, name, list(deepstack))
        if any(f in hf for f in rec.norm_shift):
            wd = add_scalar(wd.astype(DType.float32), -1.0)  # stored w + 1 in float32
        if rec.qkv and rec.qkv in hf:
            part = next(p for p in "qkv" if f".attn_{p}." in name)
            parts.setdefault(hf, {})[part] = wd
            continue
        out[hf] = wd
    from ..lazy.weight_data import concat, stack

    for hf, got in parts.items():
        if hf == rec.temporal_patch:
            if len(got) != 2:
                raise UnmappedTensorError(f"v.patch_embd.weight / v.patch_embd.weight.1: the mmproj has only "
                                          f"{sorted(got)}; {hf} needs both frames")
            frames = [got["v.patch_embd.weight"], got["v.patch_embd.weight.1"]]
            out[hf] = stack([f.astype(dtype) for f in frames], axis=2)
        else:
            if sorted(got) != ["k", "q", "v"]:
                raise UnmappedTensorError(f"{hf}: the mmproj has only its {sorted(got)} rows, not q, k and v")
            out[hf] = concat([got[p].astype(dtype) for p in "qkv"], axis=0)
    return {k: WeightData.wrap((v if v.dtype == dtype else v.astype(dtype)).node, k, None) for k, v in out.items()}


def _vision_config(rec: VisionArch, folder: HFFolder, md: Mapping[str, Any],
                   state: Mapping[str, Any]) -> tuple[dict, dict, dict]:
    """(vision_config, outer config additions, preprocessor_config.json) from the clip.* keys (and, for
    `HFFolder.ratios`, the tensors' shapes)."""
    vision: dict[str, Any] = {"model_type": folder.vision_model_type, **rec.requires, **folder.vision}
    for name, (tensor, axis, key) in folder.ratios.items():
        if tensor not in state:
            raise UnmappedTensorError(f"{tensor}: the mmproj lacks it; vision_config.{name} is its shape[{axis}] "
                                      f"over {key}")
        size = as_weight_data(state[tensor], tensor).shape[axis]
        vision[name] = size // int(_plain(md[key])) if size % int(_plain(md[key])) == 0 else size / int(_plain(md[key]))
    for name, (tensor, axis) in folder.sizes.items():
        if tensor not in state:
            raise UnmappedTensorError(f"{tensor}: the mmproj lacks it; vision_config.{name} is its shape[{axis}]")
        vision[name] = as_weight_data(state[tensor], tensor).shape[axis]
    outer: dict[str, Any] = {}
    pre: dict[str, Any] = {}
    for p in rec.hparams:
        if p.key not in md:
            continue
        v = _plain(md[p.key])
        name = folder.config_names.get(p.key, p.hf[0] if p.hf else "")
        if not name:
            continue
        if p.kind == "pos_grid":  # the image size is the position grid's (HFFolder.sizes)
            continue
        if p.kind == "deepstack":
            v = [i for i, flag in enumerate(v) if flag]
        if p.kind == "n_wa_pattern":  # full attention every n-th block
            vision[name] = [i for i in range(int(md["clip.vision.block_count"])) if (i + 1) % int(v) == 0]
        elif p.kind == "gemma3_scale":
            continue
        elif p.where == "pre":
            pre[name] = [float(x) for x in v] if p.kind == "f32s" else v
        elif p.where == "vision":
            vision[name] = v
    if rec.model_type == "gemma3" or any(p.kind == "gemma3_scale" for p in rec.hparams):
        scale = int(_plain(md.get("clip.vision.projector.scale_factor", 4)))
        side = int(vision["image_size"]) // int(vision["patch_size"]) // scale
        outer["mm_tokens_per_image"] = pre["image_seq_length"] = side * side
    if folder.projection:
        vision[folder.projection] = int(md["clip.vision.projection_dim"])
    for key, spec in folder.processor.items():
        pre[key] = ({k: vision[s[7:]] for k, s in spec.items()} if isinstance(spec, Mapping)
                    else vision[spec[7:]] if isinstance(spec, str) and spec.startswith("vision.") else spec)
    return vision, outer, pre


def convert_mmproj_to_hf(text_state: Mapping[str, Any], text_config, mm_state: Mapping[str, Any], mm_config, *,
                         dtype: Any = None, tokenizer: bool = True):
    """The GGUF -> HF adapter for a text model and its mmproj: one `...ForConditionalGeneration` state dict (lazy)
    whose `extra_files()` are config.json (text_config + vision_config), generation_config.json, the tokenizer
    and preprocessor_config.json. `text_config` / `mm_config` are the two files' `Weights.config`; `dtype`
    defaults to the mmproj's float type. Checks the pair first (module docstring) and reads no tensor.

    Example:
        >>> from lazyweights import load_weights, plan                               # doctest: +SKIP
        >>> t, m = load_weights(["model.gguf"]), load_weights(["mmproj.gguf"])      # doctest: +SKIP
        >>> sd = convert_mmproj_to_hf(dict(t.items()), t.config, dict(m.items()), m.config)  # doctest: +SKIP
        >>> plan(sd).save("model-hf/")                                              # doctest: +SKIP
    """
    from .result import ConvertedStateDict
    from .tensors import gguf_to_hf
    from .to_hf import expected_keys_for, with_hf_files

    mm_md, text_md = mm_config.metadata, text_config.metadata
    rec, folder, arch = _check(mm_md, text_md)
    want = DType.parse(dtype) if dtype is not None else _DTYPES.get(int(_plain(mm_md.get("general.file_type", 0))),
                                                                     DType.float32)
    flags = _plain(mm_md.get("clip.vision.is_deepstack_layers", []))
    vision = vision_tensors(rec, folder, mm_state, int(_plain(mm_md["clip.vision.block_count"])), want,
                            [i for i, flag in enumerate(flags) if flag])
    text = gguf_to_hf(text_state, text_config, dequantize_to=want,
                      expected_keys=expected_keys_for(text_config, text_state))
    text = {k: (v if v.dtype == want else v.astype(want)) for k, v in text.items()}
    inner = with_hf_files(text, text_config, text_state, tokenizer=tokenizer)
    def saved(name: str) -> str:
        return next((re.sub(p, r, name) for p, r in folder.layout if re.search(p, name)), name)

    both = {**{folder.text_prefix + k: v for k, v in text.items()}, **vision}
    out = ConvertedStateDict({saved(k): WeightData.wrap(v.node, saved(k), None) for k, v in both.items()})
    vcfg, outer, pre = _vision_config(rec, folder, mm_md, mm_state)
    tokens = [str(t) for t in _plain(text_md.get("tokenizer.ggml.tokens", []))]
    ids = {key: tokens.index(tok) for key, tok in folder.tokens.items() if tok in tokens}
    sections = _plain(text_md.get(f"{arch}.rope.dimension_sections"))
    build = inner.extra_files

    def extra_files() -> dict[str, bytes]:
        files = dict(build()) if build is not None else {}
        tcfg = json.loads(files["config.json"]) if "config.json" in files else {}
        tcfg.pop("architectures", None)
        tcfg["model_type"] = folder.text_model_type
        if folder.mrope and sections:
            tcfg.setdefault("rope_parameters", {})["mrope_section"] = [int(s) for s in sections if int(s)][:3]
        tcfg.setdefault("rope_parameters", {}).update(folder.rope)
        cfg = {"architectures": [rec.hf_class], "model_type": rec.model_type,
               **{k: tcfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in tcfg},
               "tie_word_embeddings": bool(tcfg.get("tie_word_embeddings", False)), **outer, **ids,
               "text_config": tcfg, "vision_config": vcfg}
        files["config.json"] = (json.dumps(cfg, indent=2) + "\n").encode()
        files["preprocessor_config.json"] = (json.dumps(pre, indent=2) + "\n").encode()
        return files

    out.extra_files = extra_files
    return out


def export_hf_folder_with_mmproj(text_gguf, mmproj, out_dir, *, dtype: Any = None, tokenizer: bool = True,
                                 **save_kwargs) -> list[str]:
    """Write one Hugging Face folder (`...ForConditionalGeneration`) from a text GGUF and its mmproj GGUF, both
    checked before anything is written (atomic, as `Plan.save`). Returns the files written.

    Example:
        >>> from lazyweights.convert.mmproj_to_hf import export_hf_folder_with_mmproj           # doctest: +SKIP
        >>> export_hf_folder_with_mmproj("gemma-3-4b.gguf", "mmproj.gguf", "gemma-3-4b-hf/")  # doctest: +SKIP
    """
    from ..lazy.plan import plan
    from ..lazy.weights import load_weights

    t = load_weights([os.fspath(text_gguf)])
    m = load_weights([os.fspath(mmproj)])
    out = convert_mmproj_to_hf(dict(t.items()), t.config, dict(m.items()), m.config, dtype=dtype,
                               tokenizer=tokenizer)
    return plan(out).save(os.fspath(out_dir), **save_kwargs)
