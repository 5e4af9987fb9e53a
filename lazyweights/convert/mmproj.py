"""HF -> mmproj GGUF: a multimodal checkpoint's vision tower and projector as llama.cpp's second file (issue 39).

llama.cpp's converter writes a multimodal model as two GGUFs: the text model (`convert_hf_to_gguf`) and the
mmproj (`convert_hf_to_gguf.py --mmproj`), which llama.cpp's `mtmd` loads beside it to turn an image into
text-model embeddings. This module is the mmproj engine over the records of `vision_archs`:

- `check_mmproj_config` validates everything a conversion needs before a tensor is looked at: the family has a
  tower (`VisionConfigError`), the image processor's config is there (`MissingPreprocessorConfigError`), and every
  vision config value mtmd's graph hard-codes is what it needs (`VisionConfigError` naming the key and value);
- `convert_hf_to_mmproj` is the adapter (tensors renamed through gguf-py's MMPROJ table, split, shifted and cast
  lazily, as llama.cpp's converter does, plus the `clip.*` metadata); nothing is read;
- `export_gguf_with_mmproj` writes the text model and the mmproj from one lazily opened folder (each source
  byte read once: the two files share no tensor), both validated before either is written.

An audio tower (a record with `modality` audio: Qwen2-Audio's Whisper encoder) is written the same way from the
config's audio_config, with `clip.has_audio_encoder` and `clip.audio.*` keys.

Storage types follow llama.cpp's converter at the source's own float type (its `--outtype` f32, f16 or bf16 for a
float32, float16 or bfloat16 checkpoint): 1-D tensors, norms, position embeddings and a record's `f32` tensors in
float32, the patch embedding in float32 (float16 in a float16 file), a record's `f16` tensors in float16.

Example:
    >>> import json, os, tempfile
    >>> from lazyweights.convert.mmproj import check_mmproj_config
    >>> d = tempfile.mkdtemp()
    >>> cfg = {"model_type": "qwen2_5_vl", "text_config": {"hidden_size": 64},
    ...        "vision_config": {"depth": 4, "window_size": 56, "fullatt_block_indexes": [1, 3]}}
    >>> with open(os.path.join(d, "preprocessor_config.json"), "w") as fh:
    ...     json.dump({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}, fh)
    >>> try:
    ...     check_mmproj_config(cfg, d)
    ... except ValueError as e:
    ...     print(str(e).split(";")[0])
    qwen2_5_vl vision_config.window_size is 56
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, NamedTuple

from ..adapters.vision_archs import BLOCK_KEYS, VisionArch, VParam, vision_arch_for_model_type
from ..core.dtype import DType
from ..core.errors import (
    MissingPreprocessorConfigError,
    MissingTokenizerError,
    ShapeError,
    UnmappedTensorError,
    VisionConfigError,
)
from ..core.names import parse_block
from ..formats.json_files import json_beside, read_json
from ..lazy.weight_data import WeightData, as_weight_data

__all__ = ["MmprojConfig", "check_mmproj_config", "convert_hf_to_mmproj", "save_mmproj", "export_mmproj",
           "export_gguf_with_mmproj"]


class MmprojConfig(NamedTuple):
    """What `check_mmproj_config` found: the record, the outer, vision and text configs, the image processor's
    config and the vision block count."""

    rec: VisionArch
    config: dict
    vision: dict
    text: dict
    pre: dict
    block_count: int
    tokens: Mapping[str, int] = {}  # the token ids of the record's `token_rows`


def _preprocessor_config(folder: str | None) -> dict | None:
    """llama.cpp's merge: preprocessor_config.json (its `media_proc_cfg` lifted), then processor_config.json
    (its `image_processor` lifted) over it; None when neither file exists."""
    out: dict | None = None
    for name, inner in (("preprocessor_config.json", "media_proc_cfg"), ("processor_config.json", "image_processor")):
        cfg = json_beside(folder, name) if folder else None
        if cfg is not None:
            if isinstance(cfg.get(inner), Mapping):
                cfg = {**cfg, **cfg[inner]}
            out = {**(out or {}), **cfg}
    return out


def check_mmproj_config(config: Mapping[str, Any], folder: str | None) -> MmprojConfig:
    """Validate a multimodal config.json (and the image processor's config in `folder`) for an mmproj, reading
    no tensor: VisionConfigError for a family without a vision tower record, a config without its
    `vision_config`, a vision value mtmd's graph cannot compute (`VisionArch.requires`, Qwen2.5-VL's window
    pattern, Gemma 3's pooling); MissingPreprocessorConfigError where the projector needs the image mean and std
    and no preprocessor_config.json is beside the checkpoint (see the module example)."""
    cfg = dict(config)
    mt = cfg.get("model_type")
    rec = vision_arch_for_model_type(mt)
    ckey = f"{rec.modality}_config"  # vision_config, or audio_config for an audio tower
    vision = cfg.get(ckey)
    if not isinstance(vision, Mapping):
        raise VisionConfigError(f"{mt}: config.json has no {ckey} (a text-only checkpoint of the family?); "
                                f"there is no {rec.modality} tower to write as an mmproj")
    vision = dict(vision)
    text = {**cfg, **(cfg.get("text_config") or {})}
    # a nested value by its dotted name too (transformers 5's `rope_parameters.rope_theta`)
    flat = {**vision, **{f"{k}.{k2}": v2 for k, v in vision.items() if isinstance(v, Mapping) for k2, v2 in v.items()}}
    for key, want in rec.requires.items():
        if key in flat and flat[key] not in (want if isinstance(want, tuple) else (want,)):  # a tuple: any
            raise VisionConfigError(f"{mt} {ckey}.{key} is {flat[key]!r}; llama.cpp's mtmd computes "
                                    f"{rec.hf_class}'s {rec.modality} tower only with {key} = "
                                    f"{' or '.join(map(repr, want)) if isinstance(want, tuple) else repr(want)}")
    for key, want in rec.requires_top.items():
        if key in cfg and cfg[key] != want:
            raise VisionConfigError(f"{mt} config.json {key} is {cfg[key]!r}; llama.cpp's mtmd computes "
                                    f"{rec.hf_class}'s projector only with {key} = {want!r}")
    n_block = next((vision[k] for k in BLOCK_KEYS if k in vision), None)
    if not isinstance(n_block, int) or n_block <= 0:
        raise VisionConfigError(f"{mt} {ckey} names no block count (one of {', '.join(BLOCK_KEYS)})")
    pre: dict = {}
    if any(p.where == "pre" and p.hf and p.default is None for p in rec.hparams):
        found = _preprocessor_config(folder)
        if found is None:
            raise MissingPreprocessorConfigError(
                f"{mt}: no preprocessor_config.json (or processor_config.json) in {folder}; the "
                f"{rec.projector} projector needs the image processor's image_mean and image_std")
        pre = found
    out = MmprojConfig(rec, cfg, vision, text, pre, int(n_block), _token_ids(rec, folder))
    _values(out)  # every key's value, so a missing or incomputable one fails here
    return out


def _token_ids(rec: VisionArch, folder: str | None) -> dict[str, int]:
    """The ids of the record's `token_rows` tokens, as llama.cpp's converter finds them (get_token_id): the added
    tokens of tokenizer_config.json, then of tokenizer.json. MissingTokenizerError without either file,
    VisionConfigError naming a token neither holds."""
    if not rec.token_rows:
        return {}
    found: dict[str, int] = {}
    files = [os.path.join(folder or "", n) for n in ("tokenizer_config.json", "tokenizer.json")]
    if not any(os.path.isfile(f) for f in files):
        raise MissingTokenizerError(f"{rec.model_type}: no tokenizer_config.json or tokenizer.json in {folder}; the "
                                    f"mmproj holds the text embedding of {', '.join(t for t, _, _ in rec.token_rows)}")
    for path in files:
        doc = read_json(path)
        if doc is not None:
            added = doc.get("added_tokens_decoder") or {}
            pairs = [(d.get("content"), i) for i, d in added.items()] if isinstance(added, Mapping) else []
            pairs += [(d.get("content"), d.get("id")) for d in doc.get("added_tokens") or []]
            for content, i in pairs:
                if content not in found and str(i).isdigit():
                    found[content] = int(i)
    missing = [t for t, _, _ in rec.token_rows if t not in found]
    if missing:
        raise VisionConfigError(f"{rec.model_type}: the tokenizer in {folder} has no {', '.join(missing)} token; "
                                f"llama.cpp's mtmd needs its embedding ({', '.join(g for _, _, g in rec.token_rows)})")
    return {t: found[t] for t, _, _ in rec.token_rows}


def _source(mc: MmprojConfig, where: str) -> dict:
    return {"vision": mc.vision, "top": mc.config, "text": mc.text, "text_config": mc.config.get("text_config") or {},
            "pre": mc.pre}[where]


def _value(mc: MmprojConfig, p: VParam) -> Any:
    src = _source(mc, p.where)
    name = next((n for n in p.hf if n in src), None)
    if name is not None:
        return _kind_value(mc, p, src[name])
    if p.default is None and not p.optional and p.kind != "pos_grid":
        where = {"vision": f"{mc.rec.modality}_config", "top": "config.json",  # the tower's config
                 "text": "text_config", "text_config": "text_config",
                 "pre": "preprocessor_config.json"}[p.where]
        raise VisionConfigError(f"{mc.rec.model_type}: {where} has none of {', '.join(p.hf)} ({p.key})")
    return p.default


def _kind_value(mc: MmprojConfig, p: VParam, v: Any) -> Any:
    """The value transforms of kinds that need only the value: `first` (a [height, width] pair's first, as
    llama.cpp's InternViT converter reads image and patch size), `inverse` (int(1 / v): InternVL's
    downsample_ratio as the projector's pixel-shuffle factor), `is:X` (True where the value is X, else the row is
    not written: InternVL's hidden_act as clip.use_gelu / clip.use_silu), `positive` (written only above 0)."""
    if p.kind == "first" and isinstance(v, (list, tuple)) and v:
        return v[0]
    if p.kind == "inverse":
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1 or (1.0 / v) % 1:
            raise VisionConfigError(f"{mc.rec.model_type}: {p.hf[0]} is {v!r}; mtmd needs 1 / {p.hf[0]} a whole "
                                    f"number ({p.key})")
        return int(1.0 / v)
    if p.kind.startswith("is:"):
        return True if v == p.kind[3:] else None
    if p.kind == "positive":
        return v if isinstance(v, int) and v > 0 else None
    return v


def _n_wa_pattern(mc: MmprojConfig, idx: Any) -> int:
    """Qwen2.5-VL: full attention every n-th block (llama.cpp's converter: n = first index + 1, each next one n
    further); mtmd cannot compute another pattern."""
    if not isinstance(idx, list) or not idx or not all(isinstance(i, int) for i in idx):
        raise VisionConfigError(f"{mc.rec.model_type} vision_config.fullatt_block_indexes is {idx!r}; llama.cpp's "
                                "mtmd needs a non-empty list of block indices")
    n = idx[0] + 1
    if any(b - a != n for a, b in zip(idx, idx[1:])):
        raise VisionConfigError(f"{mc.rec.model_type} vision_config.fullatt_block_indexes is {idx!r}; llama.cpp's "
                                f"mtmd computes full attention only every {n}th block (each index {n} after the "
                                "last)")
    return n


def _gemma3_scale(mc: MmprojConfig, seq: Any) -> int | None:
    """Gemma 3: the projector pools the patch grid to image_seq_length tokens (llama.cpp writes the per-side factor
    where it is not its default 4); transformers pools to mm_tokens_per_image, so the two must agree."""
    side = int(int(seq) ** 0.5)
    per_side = int(mc.vision["image_size"]) // int(mc.vision["patch_size"])
    tokens = mc.config.get("mm_tokens_per_image")
    if tokens is not None and int(tokens) != int(seq):
        raise VisionConfigError(f"gemma3: preprocessor_config.json image_seq_length is {seq} but config.json "
                                f"mm_tokens_per_image is {tokens}; mtmd pools to the first, transformers to the second")
    scale = per_side // side if side else 0
    if side * side != int(seq) or scale <= 0 or scale * side != per_side:
        raise VisionConfigError(f"gemma3: image_seq_length {seq} is not a square that divides the "
                                f"{per_side}x{per_side} patch grid; mtmd cannot compute the projector's pooling")
    return scale if scale != 4 else None


def _deepstack_layers(mc: MmprojConfig, idx: Any) -> list[bool]:
    """Qwen3-VL: one flag per vision block, true where a deepstack merger reads its output."""
    if not isinstance(idx, list) or not all(isinstance(i, int) and 0 <= i < mc.block_count for i in idx):
        raise VisionConfigError(f"{mc.rec.model_type} vision_config.deepstack_visual_indexes is {idx!r}; each must "
                                f"be a vision block (0 to {mc.block_count - 1})")
    layers = mc.text.get("num_hidden_layers")
    if isinstance(layers, int) and len(idx) >= layers:
        # llama.cpp's qwen3vl graph adds the deepstack features after each of the first len(idx) text layers, the
        # last one after it has kept only the output rows: it aborts unless there are more text layers
        raise VisionConfigError(f"{mc.rec.model_type} vision_config.deepstack_visual_indexes is {idx!r} "
                                f"({len(idx)} deepstack layers) but text_config.num_hidden_layers is {layers}; "
                                "llama.cpp computes deepstack layers only below the last text layer")
    return [i in idx for i in range(mc.block_count)]


def _feature_layers(mc: MmprojConfig, v: Any) -> list[int]:
    """LLaVA: vision_feature_layer (hidden-state indices, 0 the embeddings, negative counted from the end, an int
    or a list) made non-negative, as llama.cpp's legacy converter writes them; mtmd runs the blocks below the
    deepest and concatenates the rest in ascending order, as transformers concatenates them in the config's."""
    layers = [v] if isinstance(v, int) and not isinstance(v, bool) else v
    n = mc.block_count
    if not isinstance(layers, list) or not layers or \
            not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise VisionConfigError(f"{mc.rec.model_type} config.json vision_feature_layer is {v!r}; an int or a list "
                                "of ints is needed")
    out = [i if i >= 0 else n + i + 1 for i in layers]
    if not all(0 <= i <= n for i in out) or max(out) < 1 or out != sorted(set(out)):
        raise VisionConfigError(f"{mc.rec.model_type} config.json vision_feature_layer is {v!r} ({out} of the "
                                f"{n} vision blocks' hidden states); llama.cpp's mtmd reads ascending hidden states "
                                f"0 to {n}, the deepest at least 1")
    return out


def _kept_blocks(mc: MmprojConfig) -> int | None:
    """The block count mtmd runs where the record reads the tower at a feature layer (`feature_depth`), else None."""
    for p in mc.rec.hparams:
        if p.kind == "feature_depth":
            return max(_feature_layers(mc, _value(mc, p)))
    return None


def _values(mc: MmprojConfig) -> list[tuple[VParam, Any]]:
    out = []
    for p in mc.rec.hparams:
        v = _value(mc, p)
        if p.kind == "n_wa_pattern":
            v = _n_wa_pattern(mc, v)
        elif p.kind == "gemma3_scale":
            v = _gemma3_scale(mc, v)
        elif p.kind == "pos_grid" and v is None:  # llama.cpp's Qwen3-VL converter: the learned position grid
            v = int(int(mc.vision.get("num_position_embeddings", 2304)) ** 0.5 * int(mc.vision.get("patch_size", 16)))
        elif p.kind == "deepstack":
            v = _deepstack_layers(mc, v)
        elif p.kind == "feature_layers":
            v = _feature_layers(mc, v)
        elif p.kind == "feature_depth":
            v = max(_feature_layers(mc, v))
        elif p.kind == "longest_edge":  # Idefics3: the image processor's size.longest_edge, else the image size
            v = (v.get("longest_edge") if isinstance(v, Mapping) else None) or mc.vision.get("image_size")
        if v is not None:
            out.append((p, v))
    return out


def _gguf_value(kind: str, v: Any):
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    if kind == "f32s":
        return GGUFValue([float(x) for x in v], T.ARRAY, T.FLOAT32)
    if kind == "deepstack":
        return GGUFValue([bool(x) for x in v], T.ARRAY, T.BOOL)
    if kind == "feature_layers":
        return GGUFValue([int(x) for x in v], T.ARRAY, T.INT32)
    if kind == "f32":
        return GGUFValue(float(v), T.FLOAT32)
    if kind == "bool" or kind.startswith("is:"):
        return GGUFValue(bool(v), T.BOOL)
    if kind == "str":
        return GGUFValue(str(v), T.STRING)
    return GGUFValue(int(v), T.UINT32)


def mmproj_metadata(mc: MmprojConfig, file_type: int, name: str | None = None) -> dict:
    """The mmproj's GGUF keys in llama.cpp's order: `general.*` (architecture clip, type mmproj, the file type,
    quantization version 2 as its converter always writes), `clip.has_vision_encoder`,
    `clip.vision.projection_dim` (the text model's width), then the record's rows."""
    from gguf.constants import GGUFValueType as T

    from ..formats.gguf_writer import GGUFValue

    md: dict[str, Any] = {"general.architecture": GGUFValue("clip", T.STRING),
                          "general.type": GGUFValue("mmproj", T.STRING)}
    nm = name or mc.config.get("_name_or_path")
    if nm:
        md["general.name"] = GGUFValue(str(nm), T.STRING)
    md["general.file_type"] = GGUFValue(int(file_type), T.UINT32)
    md[f"clip.has_{mc.rec.modality}_encoder"] = GGUFValue(True, T.BOOL)
    width = mc.text.get("hidden_size", mc.text.get("n_embd"))
    if not isinstance(width, int) or width <= 0:
        raise VisionConfigError(f"{mc.rec.model_type}: text_config has no hidden_size "
                                f"(clip.{mc.rec.modality}.projection_dim)")
    md[f"clip.{mc.rec.modality}.projection_dim"] = GGUFValue(width, T.UINT32)
    for p, v in _values(mc):
        md[p.key] = _gguf_value(p.kind, v)
    md["general.quantization_version"] = GGUFValue(2, T.UINT32)
    return md


# llama.cpp's file types for the source's float type (its --outtype), and the stored dtype they give a weight
_FILE_TYPE = {DType.float32: 0, DType.float16: 1, DType.bfloat16: 32}


def _canonical_name(rec: VisionArch, name: str, deepstack: list | None = None) -> str | None:
    """`name` in the published layout with the record's renames applied (a deepstack merger's list index made
    its vision block, `deepstack_visual_indexes`), or None when it is not the tower's."""
    for pattern, repl in rec.layouts:
        name = re.sub(pattern, repl, name)
    if not name.startswith(rec.prefixes) or any(d in name for d in rec.dropped):
        return None
    for old, new in rec.renames:
        name = name.replace(old, new)
    if rec.deepstack and name.startswith(rec.deepstack):
        j, _, rest = name[len(rec.deepstack):].partition(".")
        idx = deepstack or []
        if not j.isdigit() or int(j) >= len(idx):
            raise VisionConfigError(f"{name}: deepstack merger {j} but vision_config.deepstack_visual_indexes is "
                                    f"{idx!r}")
        name = f"{rec.deepstack}{idx[int(j)]}.{rest}"
    return name


def _own_name(rec: VisionArch, hf: str) -> str | None:
    """The GGUF name the record's `names` table gives `hf` (None: gguf-py's table names it)."""
    for pattern, repl in rec.names:
        if re.search(pattern, hf):
            return re.sub(pattern, repl, hf)
    return None


def _stored_dtype(rec: VisionArch, hf: str, gguf_name: str, ndim: int, ftype: DType) -> DType:
    """llama.cpp's `prepare_tensors` at file type `ftype`: the record's forced types (and MmprojModel's patch
    embedding), then float32 for 1-D tensors, norms, position embeddings and anything not a `.weight`."""
    forced: DType | None = None
    if any(f in hf for f in rec.f16):
        forced = DType.float16
    elif any(f in hf or f in gguf_name for f in rec.f32):
        forced = DType.float32
    elif ".patch_embd.weight" in gguf_name or ".patch_merger.weight" in gguf_name:
        forced = DType.float16 if ftype == DType.float16 else DType.float32
    if ndim <= 1 or gguf_name.endswith("_norm.weight"):
        return DType.float32
    if forced is not None:
        return forced
    if ".position_embd." in gguf_name or not gguf_name.endswith(".weight"):
        return DType.float32
    return ftype


def _pieces(rec: VisionArch, hf: str, wd: WeightData) -> list[tuple[str, str | None, WeightData]]:
    """(name for gguf-py's table, GGUF name when fixed here, value): fused qkv rows split in three, a temporal
    Conv3d patch embedding split into its two frames."""
    if rec.qkv and rec.qkv in hf:
        rows = wd.shape[0]
        if rows % 3:
            raise ShapeError(f"{hf}: fused qkv has {rows} rows, not a multiple of 3 ({tuple(wd.shape)})")
        c = rows // 3
        return [(hf.replace("qkv", part), None, wd[i * c:(i + 1) * c]) for i, part in enumerate("qkv")]
    if rec.temporal_patch and hf == rec.temporal_patch:
        if wd.ndim != 5 or wd.shape[2] != 2:
            raise ShapeError(f"{hf}: a Conv3d patch embedding [out, in, 2, p, p] is expected (llama.cpp splits its "
                             f"two frames), got {tuple(wd.shape)}")
        return [(hf, "v.patch_embd.weight", wd[:, :, 0]), (hf, "v.patch_embd.weight.1", wd[:, :, 1])]
    if rec.patch_hwc and hf == rec.patch_hwc:
        p = int(round((wd.shape[-1] // 3) ** 0.5)) if wd.ndim == 2 else 0
        if not p or 3 * p * p != wd.shape[1]:
            raise ShapeError(f"{hf}: a linear patch embedding [out, p * p * 3] is expected (llama.cpp makes it a "
                             f"conv [out, 3, p, p]), got {tuple(wd.shape)}")
        return [(hf, None, wd.reshape(wd.shape[0], p, p, 3).permute((0, 3, 1, 2)))]
    return [(hf, None, wd)]


def _file_dtype(tensors: Mapping[str, WeightData]) -> DType:
    """The tower's float type: that of most bytes among its 2+-D float tensors (float32 when none)."""
    weight: dict[DType, int] = {}
    for wd in tensors.values():
        if wd.ndim >= 2 and wd.dtype in _FILE_TYPE:
            weight[wd.dtype] = weight.get(wd.dtype, 0) + int(wd.node.nbytes)
    return max(weight, key=weight.__getitem__) if weight else DType.float32


def mmproj_tensors(mc: MmprojConfig, state: Mapping[str, Any]) -> tuple[dict[str, WeightData], DType]:
    """The mmproj's tensors (lazy) and the file's float type: the tower's tensors of `state` renamed through
    gguf-py's MMPROJ table (built for the vision block count, as llama.cpp's converter builds it), split,
    shifted and stored as llama.cpp's converter does. UnmappedTensorError names a tower tensor the table lacks."""
    import gguf

    from .transforms import add_scalar, rope_permute

    rec = mc.rec
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, mc.block_count)
    mine = {}
    for name, value in state.items():
        hf = _canonical_name(rec, name, mc.vision.get("deepstack_visual_indexes"))
        if hf is not None:
            mine[hf] = (name, as_weight_data(value, name))
    ftype = _file_dtype({k: v for k, (_, v) in mine.items()})
    kept = _kept_blocks(mc)
    out: dict[str, WeightData] = {}
    for hf, (src, wd) in mine.items():
        for key, fixed, part in _pieces(rec, hf, wd):
            new = fixed or _own_name(rec, key) or tmap.get_name(key, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise UnmappedTensorError(
                    f"{src}: no mmproj tensor for it in gguf-py's table ({rec.model_type}, {mc.block_count} "
                    f"{rec.modality} blocks); llama.cpp's converter cannot map it either")
            block = parse_block(new.removeprefix("v."))
            if kept is not None and block is not None and block[0] >= kept:
                continue  # past the deepest feature layer: mtmd never runs it
            if any(f in hf for f in rec.norm_shift):
                part = add_scalar(part.astype(DType.float32), 1.0)  # in float32, as llama.cpp's converter adds
            if any(f in hf for f in rec.rope_permute):
                part = rope_permute(part, int(mc.vision["num_attention_heads"]))
            if new == rec.cls_last:
                part = _cls_row_last(new, part)
            if any(f in hf for f in rec.unsqueeze):
                part = part.reshape(*part.shape, 1)  # [n] -> [n, 1]: llama.cpp's Whisper conv biases
            dtype = _stored_dtype(rec, hf, new, part.ndim, ftype)
            out[new] = _named(part if part.dtype == dtype else part.astype(dtype), new)
    for token, pattern, new in rec.token_rows:
        emb_name = next((n for n in state if re.search(pattern, n)), None)
        if emb_name is None:
            raise VisionConfigError(f"{rec.model_type}: no text embedding ({pattern}) to take {token}'s row from")
        emb = as_weight_data(state[emb_name], emb_name)
        i = mc.tokens[token]
        if emb.ndim != 2 or i >= emb.shape[0]:
            raise ShapeError(f"{emb_name}: {token} is token {i} but the embedding is {tuple(emb.shape)}")
        out[new] = _named(emb[i].astype(DType.float32), new)
    return out, ftype


def _cls_row_last(name: str, wd: WeightData) -> WeightData:
    """A learned position embedding [1, 1 + patches, width] (or [1 + patches, width]) with its first (CLS) row moved
    last, for a graph that appends the CLS token after the patches (`VisionArch.cls_last`)."""
    from ..lazy.weight_data import concat

    axis = wd.ndim - 2
    if axis < 0 or wd.shape[axis] < 2:
        raise ShapeError(f"{name}: a position embedding [1, 1 + patches, width] is expected (its CLS row first), "
                         f"got {tuple(wd.shape)}")
    if axis == 0:
        return concat([wd[1:], wd[:1]], axis=0)
    return concat([wd[:, 1:], wd[:, :1]], axis=1)


def _named(wd: WeightData, name: str) -> WeightData:
    return WeightData.wrap(wd.node, name, wd.quantization_encoding)


def _folder_of(state_dict: Mapping[str, Any]) -> str | None:
    """The folder the first tower-or-not tensor is read from (walking its graph to the file it maps)."""
    for name, value in state_dict.items():
        stack = [as_weight_data(value, name).node]
        while stack:
            n = stack.pop()
            src = getattr(n, "arg", None)
            path = getattr(getattr(src, "file", None), "path", None) or getattr(src, "path", None)
            if isinstance(path, str):
                return os.path.dirname(os.path.abspath(path))
            stack.extend(reversed(n.srcs))
    return None


def _config_of(huggingface_config: Any, folder: str | None) -> dict:
    """config.json as a dict: the one given (a dict or a transformers config), else the folder's."""
    if huggingface_config is None:
        doc = json_beside(folder, "config.json") if folder else None
        if doc is None:
            raise VisionConfigError(f"an mmproj needs the checkpoint's config.json (none in {folder}; pass "
                                    "huggingface_config=...)")
        return doc
    if isinstance(huggingface_config, Mapping):
        return dict(huggingface_config)
    if hasattr(huggingface_config, "to_dict"):
        return dict(huggingface_config.to_dict())
    return dict(vars(huggingface_config))


def convert_hf_to_mmproj(state_dict: Mapping[str, Any], huggingface_config=None, *, folder: str | None = None,
                         **unused_kwargs):
    """The HF -> mmproj adapter: the vision tower and projector of a multimodal checkpoint as llama.cpp's
    `convert_hf_to_gguf.py --mmproj` writes them (tensors lazy, `gguf_metadata` the `clip.*` keys). Validates
    the config first (`check_mmproj_config`); `folder` (config.json, preprocessor_config.json) defaults to the
    checkpoint's. Save with `save_mmproj` (it keeps the file type llama.cpp writes).

    Example:
        >>> from lazyweights import load_weights                                   # doctest: +SKIP
        >>> from lazyweights.convert.mmproj import convert_hf_to_mmproj, save_mmproj  # doctest: +SKIP
        >>> w = load_weights("gemma-3-4b-it/")                                      # doctest: +SKIP
        >>> save_mmproj(convert_hf_to_mmproj(dict(w.items())), "mmproj.gguf")      # doctest: +SKIP
    """
    from .result import ConvertedStateDict

    if folder is None:
        folder = _folder_of(state_dict)
    mc = check_mmproj_config(_config_of(huggingface_config, folder), folder)
    tensors, ftype = mmproj_tensors(mc, state_dict)
    if not tensors:
        raise VisionConfigError(f"{mc.rec.model_type}: the checkpoint holds no {mc.rec.modality} tower tensor "
                                f"(none under {', '.join(mc.rec.prefixes)})")
    out = ConvertedStateDict(tensors)
    out.gguf_metadata = mmproj_metadata(mc, _FILE_TYPE[ftype])
    out.file_type_from_tensors = False  # llama.cpp's mmproj file type is the source's float type (save_mmproj)
    return out


def save_mmproj(adapted, path, **save_kwargs) -> list[str]:
    """Save `convert_hf_to_mmproj`'s result as one GGUF (atomic), its metadata as given (llama.cpp's file type
    is the source's float type, whatever the tensors it forces to float32 weigh). Returns the files written."""
    from ..lazy.plan import Plan

    return list(Plan(dict(adapted)).save(os.fspath(path), format="gguf", metadata=adapted.gguf_metadata,
                                         **save_kwargs) or [])


def export_mmproj(hf_dir, out_path, **save_kwargs) -> list[str]:
    """Convert a multimodal Hugging Face folder's vision tower into an mmproj GGUF.

    Example:
        >>> from lazyweights.convert.mmproj import export_mmproj          # doctest: +SKIP
        >>> export_mmproj("Qwen2.5-VL-3B-Instruct/", "mmproj.gguf")        # doctest: +SKIP
    """
    from ..lazy.weights import load_weights

    hf_dir = os.fspath(hf_dir)
    w = load_weights([hf_dir])
    folder = hf_dir if os.path.isdir(hf_dir) else os.path.dirname(os.path.abspath(hf_dir))
    return save_mmproj(convert_hf_to_mmproj(dict(w.items()), folder=folder), out_path, **save_kwargs)


def export_gguf_with_mmproj(hf_dir, out_path, mmproj_path, *, tokenizer: bool = True, **save_kwargs) -> list[str]:
    """The text model (`export_gguf`'s file) and the mmproj from one lazily opened multimodal folder: both are
    converted (and validated) before either is written; the two share no tensor, so each source byte is read
    once. Returns the files written, the text model's first.

    Example:
        >>> from lazyweights.convert.mmproj import export_gguf_with_mmproj               # doctest: +SKIP
        >>> export_gguf_with_mmproj("gemma-3-4b-it/", "gemma-3-4b.gguf", "mmproj.gguf")   # doctest: +SKIP
    """
    from ..lazy.weights import load_weights
    from .result import save_converted
    from .to_gguf import convert_hf_to_gguf

    hf_dir = os.fspath(hf_dir)
    w = load_weights([hf_dir])
    folder = hf_dir if os.path.isdir(hf_dir) else os.path.dirname(os.path.abspath(hf_dir))
    state = dict(w.items())
    vision = convert_hf_to_mmproj(state, folder=folder)
    text = convert_hf_to_gguf(state, None, tokenizer=tokenizer, folder=folder)
    files = list(save_converted(text, out_path, format="gguf", **save_kwargs) or [])
    return files + save_mmproj(vision, mmproj_path, **save_kwargs)
