"""One declarative record per multimodal family's vision tower: what an mmproj GGUF (llama.cpp's `mtmd`) needs.

The text half of a multimodal checkpoint is an `archs.Arch` record; the vision tower and its projector become
llama.cpp's second file, the mmproj (`convert_hf_to_gguf.py --mmproj`, its `MmprojModel` classes;
`lazyweights.convert.mmproj` is the engine). Tensor names come from gguf-py's MMPROJ table (the one llama.cpp's
converter uses); a record says only

- which Hugging Face `model_type` / class it is and its projector (`clip.projector_type`, gguf-py's
  `VisionProjectorType`);
- which tensors are the tower's (`prefixes`, the published layout; `layouts` rewrites other saved layouts, such
  as transformers 5's, to it), what llama.cpp drops (`dropped`) and renames first (`renames`);
- the `clip.*` keys in llama.cpp's order: `VParam(key, config names, where, kind, default)`, `where` saying which
  config holds them: the tower's config, the outer config.json (`top`), the text config (`text`: config.json
  under its text_config; `text_config`: that alone) or the image processor's (`pre`: preprocessor_config.json,
  then processor_config.json), a name-less row being a fixed value;
- the value transforms and storage types llama.cpp's converter applies (norms stored w + 1, fused qkv rows split,
  a temporal Conv3d patch embedding split into two Conv2d, tensors always float16 / float32);
- the vision config values mtmd's graph hard-codes (`requires`): a config saying otherwise cannot be computed.

Adding a family is a record here and a line in the test table (tests/adapters/test_mmproj.py).

Example:
    >>> from lazyweights.adapters.vision_archs import vision_arch_for_model_type
    >>> v = vision_arch_for_model_type("qwen2_5_vl")
    >>> v.hf_class, v.projector, v.requires["window_size"]
    ('Qwen2_5_VLForConditionalGeneration', 'qwen2.5vl_merger', 112)
    >>> try:
    ...     vision_arch_for_model_type("llama")
    ... except ValueError as e:
    ...     print(str(e).split(";")[0])
    Hugging Face model_type 'llama' has no vision tower lazyweights writes as an mmproj
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from ..core.errors import VisionConfigError


class VParam(NamedTuple):
    """One mmproj key: `key` (in full, gguf-py's `Keys`) <- the first of `hf` found in the config `where` says
    (`vision`, `top`: the outer config.json, `text`, `pre`: the image processor's config). `kind`: u32, f32,
    bool, str, f32s (a float32 array), or a derived value (`n_wa_pattern`: Qwen2.5-VL's window-attention period
    from fullatt_block_indexes; `gemma3_scale`: the projector's pooling from image_seq_length, written only where
    it is not mtmd's default 4; `pos_grid`: the image size, else sqrt(num_position_embeddings) * patch_size;
    `deepstack`: one bool per vision block, true at deepstack_visual_indexes; `feature_layers`: LLaVA's
    vision_feature_layer(s) made non-negative, an int32 array; `feature_depth`: the block count mtmd runs, the
    deepest feature layer, the blocks past it left out; `longest_edge`: the image processor's size.longest_edge,
    else the vision image size). `default` stands in where no name is found (None:
    required, unless `optional`: the row is then not written); with no names it is a fixed value."""

    key: str
    hf: tuple[str, ...]
    where: str = "vision"
    kind: str = "u32"
    default: Any = None
    optional: bool = False


class VisionArch(NamedTuple):
    """One vision tower's record (one comment per field)."""

    model_type: str                           # the outer config.json's model_type
    hf_class: str                             # the Hugging Face class holding tower, projector and text model
    projector: str                            # clip.projector_type (gguf-py VisionProjectorType)
    prefixes: tuple[str, ...]                 # HF names (published layout) of the tower and projector
    hparams: tuple[VParam, ...]               # clip.* keys after the common header, in llama.cpp's order
    layouts: tuple[tuple[str, str], ...] = ()  # (regex, replacement): another saved layout to the published one
    renames: tuple[tuple[str, str], ...] = ()  # (old, new) substrings replaced before gguf-py's table
    names: tuple[tuple[str, str], ...] = ()   # (regex, GGUF name): tensors named here, not by gguf-py's table
    deepstack: str = ""                       # HF prefix of per-layer mergers `{prefix}{j}.`: j becomes the vision
                                              # block deepstack_visual_indexes[j] (Qwen3-VL)
    dropped: tuple[str, ...] = ()             # HF name fragments llama.cpp skips
    norm_shift: tuple[str, ...] = ()          # HF name fragments stored as w + 1 (in float32)
    qkv: str = ""                             # HF name fragment of fused [q; k; v] rows, split into three
    temporal_patch: str = ""                  # HF name of a Conv3d [out, in, 2, p, p] patch embedding, stored as
                                              # two Conv2d: v.patch_embd.weight and v.patch_embd.weight.1
    f16: tuple[str, ...] = ()                 # HF name fragments llama.cpp always stores float16
    f32: tuple[str, ...] = ()                 # HF or GGUF name fragments llama.cpp always stores float32
    modality: str = "vision"                  # the tower: vision (vision_config, clip.has_vision_encoder,
                                              # clip.vision.projection_dim) or audio (audio_config, clip.audio.*)
    unsqueeze: tuple[str, ...] = ()           # HF name fragments given a trailing axis of 1 ([n] -> [n, 1]: the
                                              # Whisper conv biases, as llama.cpp stores them)
    patch_hwc: str = ""                       # HF name of a linear patch embedding [out, p * p * 3] over (row,
                                              # column, channel) patches, stored as llama.cpp's conv [out, 3, p, p]
    requires: Mapping[str, Any] = {}          # vision config values mtmd's graph hard-codes (a tuple: any of them)
    cls_last: str = ""                        # GGUF name of a learned position embedding [1, 1 + patches, width]
                                              # whose first (CLS) row mtmd adds after the patches: stored with that
                                              # row moved last (InternVL)
    requires_top: Mapping[str, Any] = {}      # outer config.json values mtmd's graph hard-codes (LLaVA's projector)
    rope_permute: tuple[str, ...] = ()        # HF name fragments whose rows llama.cpp permutes for its RoPE
                                              # (LlamaModel.permute over the vision heads: Pixtral's q/k)
    token_rows: tuple[tuple[str, str, str], ...] = ()  # (token, regex of the text embedding's HF name, GGUF name):
                                              # the embedding row of a tokenizer token the tower writes (Pixtral's
                                              # [IMG_BREAK] as v.token_embd.img_break)


# llama.cpp's MmprojModel.n_block_keys: where a vision config says its block count
BLOCK_KEYS = ("n_layers", "num_hidden_layers", "n_layer", "num_layers", "depth", "layers", "encoder_layers",
              "vt_num_hidden_layers")
MEAN = VParam("clip.vision.image_mean", ("image_mean",), "pre", "f32s")
STD = VParam("clip.vision.image_std", ("image_std",), "pre", "f32s")
# MmprojModel.set_gguf_parameters: the keys every vision tower writes (after has_vision_encoder and
# projection_dim, which the engine writes from the text config)
_SIGLIP_BASE = (VParam("clip.vision.image_size", ("image_size",)), VParam("clip.vision.patch_size", ("patch_size",)),
                VParam("clip.vision.embedding_length", ("hidden_size", "width", "vt_hidden_size")),
                VParam("clip.vision.feed_forward_length", ("intermediate_size", "vt_intermediate_size")),
                VParam("clip.vision.block_count", BLOCK_KEYS),
                VParam("clip.vision.attention.head_count", ("num_attention_heads", "num_heads", "heads",
                                                            "vt_num_attention_heads")), MEAN, STD)


def _qwen_base(embd: str, ff: str) -> tuple[VParam, ...]:
    """Qwen2-VL / 2.5-VL: llama.cpp's converter reads the image size as 560 where the config has none, the
    heads from num_heads, the blocks from depth; Qwen2-VL's width is embed_dim and its feed-forward length the
    config's hidden_size (as llama.cpp writes it)."""
    return (VParam("clip.vision.image_size", ("image_size",), default=560),
            VParam("clip.vision.patch_size", ("patch_size",)), VParam("clip.vision.embedding_length", (embd,)),
            VParam("clip.vision.feed_forward_length", (ff,)), VParam("clip.vision.block_count", ("depth",)),
            VParam("clip.vision.attention.head_count", ("num_heads",)), MEAN, STD)


def _fixed(key: str, value: Any, kind: str) -> VParam:
    return VParam(key, (), "vision", kind, value)


def _record(model_type: str, hf_class: str, projector: str, base: tuple[VParam, ...], own: tuple[VParam, ...],
            **fields: Any) -> VisionArch:
    """A record whose keys are the common header `base`, the projector type, then the family's own rows."""
    return VisionArch(model_type, hf_class, projector, prefixes=fields.pop("prefixes"),
                      hparams=(*base, _fixed("clip.projector_type", projector, "str"), *own), **fields)


# WhisperEncoderModel.set_gguf_parameters (llama.cpp): a Whisper encoder's header; its converter reads d_model,
# encoder_ffn_dim and encoder_attention_heads where the audio config has no hidden_size / intermediate_size
_WHISPER_BASE = (VParam("clip.audio.embedding_length", ("hidden_size", "d_model")),
                 VParam("clip.audio.feed_forward_length", ("intermediate_size", "encoder_ffn_dim")),
                 VParam("clip.audio.block_count", BLOCK_KEYS),
                 VParam("clip.audio.attention.head_count", ("num_attention_heads", "encoder_attention_heads")))
_QWEN_VL = dict(prefixes=("visual.",), layouts=((r"^model\.visual\.", "visual."),), qkv=".attn.qkv.",
                temporal_patch="visual.patch_embed.proj.weight", f32=(".position_embd.",))
_RECORDS: tuple[VisionArch, ...] = (
    # Gemma 3: SigLIP tower, average-pooled to image_seq_length tokens, RMS-normed (w + 1) and projected; llama.cpp
    # keeps the projection float16 and the embeddings float32 (issue 13025); transformers 5 saves the tower
    # without its `vision_model.` level
    _record("gemma3", "Gemma3ForConditionalGeneration", "gemma3", _SIGLIP_BASE,
            (VParam("clip.vision.attention.layer_norm_epsilon", ("layer_norm_eps",), kind="f32", default=1e-6),
             _fixed("clip.use_gelu", True, "bool"),
             VParam("clip.vision.projector.scale_factor", ("image_seq_length",), "pre", "gemma3_scale", 256)),
            prefixes=("multi_modal_projector.", "vision_tower.", "multimodal_projector.", "vision_model."),
            layouts=((r"^model\.", ""), (r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model.")),
            renames=(("_weight", ".weight"),), dropped=("vision_model.head.",), norm_shift=("soft_emb_norm.weight",),
            f16=("input_projection",), f32=(".embeddings.",),
            requires={"hidden_act": "gelu_pytorch_tanh"}),
    # InternVL (transformers' InternVLForConditionalGeneration, the `-hf` checkpoints): an InternViT tower (class
    # embedding, layer scale, LayerNorm) pixel-shuffled by 1 / downsample_ratio into a LayerNorm-linear-GELU-linear
    # projector (mm.model.mlp.{0,1,3}). Saved as `vision_tower.` / `multi_modal_projector.`; gguf-py's table names the
    # `model.`-prefixed layout (Intern-S1's); the projector is named here (gguf-py's `mlp1.{bid}` row needs more
    # than 3 vision blocks for mm.3); llama.cpp's converter appends `.weight` to the layer scales and position
    # embeddings (its InternVisionModel)
    _record("internvl", "InternVLForConditionalGeneration", "internvl",
            (VParam("clip.vision.image_size", ("image_size",), kind="first"),
             VParam("clip.vision.patch_size", ("patch_size",), kind="first"), *_SIGLIP_BASE[2:]),
            (VParam("clip.vision.attention.layer_norm_epsilon", ("layer_norm_eps",), kind="f32"),
             VParam("clip.use_silu", ("hidden_act",), kind="is:silu", optional=True),
             VParam("clip.use_gelu", ("hidden_act",), kind="is:gelu", optional=True),
             VParam("clip.vision.projector.scale_factor", ("downsample_ratio",), "top", "inverse"),
             VParam("clip.vision.preproc_min_tiles", ("min_dynamic_patch",), "top", "positive", optional=True),
             VParam("clip.vision.preproc_max_tiles", ("max_dynamic_patch",), "top", "positive", optional=True)),
            prefixes=("model.vision_tower.", "model.multi_modal_projector."),
            layouts=((r"^(vision_tower|multi_modal_projector)\.", r"model.\1."),),
            renames=((".lambda_1", ".lambda_1.weight"), (".lambda_2", ".lambda_2.weight"),
                     ("embeddings.position_embeddings", "embeddings.position_embeddings.weight")),
            names=((r"^model\.multi_modal_projector\.layer_norm\.", "mm.model.mlp.0."),
                   (r"^model\.multi_modal_projector\.linear_1\.", "mm.model.mlp.1."),
                   (r"^model\.multi_modal_projector\.linear_2\.", "mm.model.mlp.3.")),
            f32=(".position_embd.",),
            # mtmd's internvl graph puts the CLS token after the patches and adds the position rows in stored order;
            # llama.cpp's converter stores them as saved (CLS first), so there every patch gets its left neighbour's
            # position: the CLS row is stored last instead (tests/adapters/test_mmproj.py, test_mmproj_identical_...)
            cls_last="v.position_embd.weight",
            # mtmd: LayerNorm (RMSNorm only for the 6B tower, picked by its shape), a GELU or SiLU MLP; the last
            # layer's patch tokens (CLS dropped) through a GELU projector
            requires={"hidden_act": ("gelu", "silu"), "norm_type": "layer_norm"},
            requires_top={"projector_hidden_act": "gelu", "vision_feature_layer": -1,
                          "vision_feature_select_strategy": "default"}),
    # LFM2-VL: a SigLIP2 NaFlex tower (a linear patch embedding over (row, column, channel), stored as a conv; a
    # 16x16 learned position grid mtmd and transformers resize to the image) read at vision_feature_layer, pixel
    # unshuffled by downsample_factor into a LayerNorm-linear-GELU-linear projector (mm.input_norm, mm.1, mm.2, named
    # here: gguf-py's linear_{bid} row needs more than 2 vision blocks); the image size llama.cpp writes is a fixed
    # 256 (NaFlex has none). Published layout `model.vision_tower.vision_model.`; transformers 5 saves it without
    # `vision_model.`
    _record("lfm2_vl", "Lfm2VlForConditionalGeneration", "lfm2",
            (_fixed("clip.vision.image_size", 256, "u32"), *_SIGLIP_BASE[1:4],
             VParam("clip.vision.block_count", ("vision_feature_layer",), "top", "feature_depth", -1),
             *_SIGLIP_BASE[5:]),
            (VParam("clip.vision.attention.layer_norm_epsilon", ("layer_norm_eps",), kind="f32"),
             VParam("clip.vision.projector.scale_factor", ("downsample_factor",), "top", default=2),
             _fixed("clip.use_gelu", True, "bool")),
            prefixes=("vision_tower.", "multi_modal_projector."),
            layouts=((r"^model\.(vision_tower|multi_modal_projector)\.", r"\1."),
                     (r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model.")),
            names=((r"^multi_modal_projector\.layer_norm\.", "mm.input_norm."),
                   (r"^multi_modal_projector\.linear_1\.", "mm.1."), (r"^multi_modal_projector\.linear_2\.", "mm.2.")),
            dropped=("vision_model.head.",), patch_hwc="vision_tower.vision_model.embeddings.patch_embedding.weight",
            # mtmd: tanh-GELU in the tower, a GELU projector with its LayerNorm and biases
            requires={"hidden_act": "gelu_pytorch_tanh"},
            requires_top={"projector_hidden_act": "gelu", "projector_use_layernorm": True, "projector_bias": True}),
    # Llama 4: a ViT with a class embedding, 2D RoPE and learned positions (`positional_embedding_vlm`), pre/post
    # LayerNorm, pixel shuffled by 1 / pixel_shuffle_ratio into a GELU MLP adapter (mm.model.mlp.1, .2) and one
    # linear projector without bias (mm.model.fc); those three named here (gguf-py's vision_adapter.mlp.fc{bid}
    # row needs more than 2 vision blocks)
    _record("llama4", "Llama4ForConditionalGeneration", "llama4", _SIGLIP_BASE,
            (VParam("clip.vision.attention.layer_norm_epsilon", ("norm_eps",), kind="f32"),
             VParam("clip.vision.projector.scale_factor", ("pixel_shuffle_ratio",), kind="inverse"),
             _fixed("clip.use_gelu", True, "bool")),
            prefixes=("vision_model.", "multi_modal_projector."),
            layouts=((r"^model\.(vision_model|multi_modal_projector)\.", r"\1."),),
            # gguf-py 0.3.36's table lists `vision_model.model.layers.{bid}.post_attention_layernorm` for Llama 4's
            # ln2 and (later, so it wins) for Gemma 4's attn_post_norm: llama.cpp's converter names Llama 4's
            # pre-FFN norm attn_post_norm, and mtmd then normalizes the attention output (without its bias) and not
            # the FFN input; named ln2 here
            names=((r"^vision_model\.model\.layers\.(\d+)\.post_attention_layernorm\.", r"v.blk.\1.ln2."),
                   (r"^vision_model\.positional_embedding_vlm$", "v.position_embd.weight"),
                   (r"^vision_model\.vision_adapter\.mlp\.fc(1|2)\.", r"mm.model.mlp.\1."),
                   (r"^multi_modal_projector\.linear_1\.weight$", "mm.model.fc.weight")),
            # mtmd: a GELU tower and a projector without bias (llama.cpp's converter would name a bias
            # mm.model.fc.weight too)
            requires={"hidden_act": "gelu", "multi_modal_projector_bias": False}),
    # Qwen2.5-VL: window attention every n_wa_pattern-th block full (mtmd's window is 112 pixels), SwiGLU MLP,
    # 2x2 spatial merge (mtmd's default; the converter writes no merge size), two-frame temporal patches
    _record("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2.5vl_merger",
            _qwen_base("hidden_size", "intermediate_size"),
            (_fixed("clip.use_silu", True, "bool"),
             VParam("clip.vision.n_wa_pattern", ("fullatt_block_indexes",), kind="n_wa_pattern"),
             VParam("clip.vision.attention.layer_norm_epsilon", ("rms_norm_eps",), "top", "f32", 1e-6)),
            requires={"window_size": 112, "spatial_merge_size": 2, "temporal_patch_size": 2, "hidden_act": "silu"},
            **_QWEN_VL),
    # Qwen3-VL: learned position embeddings (the image size from their grid), fused qkv kept, tanh-GELU MLP,
    # deepstack mergers after some blocks (v.deepstack.{block}), the merge size written
    _record("qwen3_vl", "Qwen3VLForConditionalGeneration", "qwen3vl_merger",
            (VParam("clip.vision.image_size", ("image_size",), kind="pos_grid"),
             *_qwen_base("hidden_size", "intermediate_size")[1:]),
            (_fixed("clip.use_gelu", True, "bool"),
             VParam("clip.vision.spatial_merge_size", ("spatial_merge_size",), optional=True),
             VParam("clip.vision.attention.layer_norm_epsilon", ("rms_norm_eps",), "text_config", "f32", 1e-6),
             VParam("clip.vision.is_deepstack_layers", ("deepstack_visual_indexes",), kind="deepstack", default=[])),
            prefixes=("visual.",), layouts=((r"^model\.visual\.", "visual."),),
            names=((r"^visual\.deepstack_merger_list\.(\d+)\.linear_fc(1|2)\.", r"v.deepstack.\1.fc\2."),
                   (r"^visual\.deepstack_merger_list\.(\d+)\.norm\.", r"v.deepstack.\1.norm."),
                   (r"^visual\.merger\.linear_fc1\.", "mm.0."), (r"^visual\.merger\.linear_fc2\.", "mm.2."),
                   (r"^visual\.merger\.norm\.", "v.post_ln."),
                   (r"^visual\.patch_embed\.proj\.bias$", "v.patch_embd.bias")),
            deepstack="visual.deepstack_merger_list.", temporal_patch="visual.patch_embed.proj.weight",
            requires={"temporal_patch_size": 2, "hidden_act": "gelu_pytorch_tanh"}),
    # Qwen2-VL: the same converter class; full attention everywhere, LayerNorm and a quick-GELU fc1/fc2 MLP
    _record("qwen2_vl", "Qwen2VLForConditionalGeneration", "qwen2vl_merger", _qwen_base("embed_dim", "hidden_size"),
            (VParam("clip.vision.attention.layer_norm_epsilon", ("rms_norm_eps",), "top", "f32", 1e-6),),
            requires={"spatial_merge_size": 2, "temporal_patch_size": 2, "hidden_act": "quick_gelu"}, **_QWEN_VL),
    # LLaVA (1.5, transformers' LlavaForConditionalGeneration): a CLIP tower (class embedding, pre-LN, quick-GELU)
    # read at vision_feature_layer (mtmd runs the blocks up to it: the later ones and the post-LN are left out, as
    # llama.cpp's legacy convert_image_encoder_to_gguf.py leaves them), the patch tokens (not CLS) through a
    # linear-GELU-linear projector mtmd names mm.0 / mm.2 (gguf-py's table says mm.1 / mm.2); llama.cpp's
    # convert_hf_to_gguf.py refuses this tower ("Unsupported model type: clip_vision_model")
    _record("llava", "LlavaForConditionalGeneration", "mlp",
            tuple(VParam("clip.vision.block_count", ("vision_feature_layer",), "top", "feature_depth", -2)
                  if p.key == "clip.vision.block_count" else p for p in _SIGLIP_BASE),
            (VParam("clip.vision.attention.layer_norm_epsilon", ("layer_norm_eps",), kind="f32", default=1e-5),
             VParam("clip.vision.feature_layer", ("vision_feature_layer",), "top", "feature_layers", -2)),
            prefixes=("multi_modal_projector.", "vision_tower."),
            layouts=((r"^model\.", ""), (r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model.")),
            names=((r"^multi_modal_projector\.linear_1\.", "mm.0."), (r"^multi_modal_projector\.linear_2\.", "mm.2.")),
            dropped=("vision_model.post_layernorm.",),
            requires={"hidden_act": "quick_gelu"},
            requires_top={"projector_hidden_act": "gelu", "vision_feature_select_strategy": "default",
                          "multimodal_projector_bias": True}),
    # Mistral 3 (Mistral Small 3.1 / 3.2): a Pixtral tower (2D RoPE, q/k rows permuted as llama.cpp's converter
    # does; RMS norms; SwiGLU) read at its last layer, an RMS norm and a spatial_merge_size x spatial_merge_size patch
    # merger, a GELU MLP (mm.1 / mm.2); mtmd appends the text model's [IMG_BREAK] embedding after each image row, so
    # the mmproj holds that row (v.token_embd.img_break), which llama.cpp 0.3.36's converter leaves out of a
    # Hugging Face checkpoint's mmproj (mtmd then refuses its file)
    _record("mistral3", "Mistral3ForConditionalGeneration", "pixtral", _SIGLIP_BASE,
            (VParam("clip.vision.attention.layer_norm_epsilon", ("layer_norm_eps",), kind="f32", default=1e-5),
             _fixed("clip.use_silu", True, "bool"),
             VParam("clip.vision.spatial_merge_size", ("spatial_merge_size",), "top", optional=True)),
            prefixes=("multi_modal_projector.", "vision_tower."), layouts=((r"^model\.(?!language_model\.)", ""),),
            rope_permute=(".attention.q_proj.", ".attention.k_proj."),
            token_rows=(("[IMG_BREAK]", r"^(model\.)?language_model\.(model\.)?embed_tokens\.weight$",
                         "v.token_embd.img_break"),),
            # mtmd: RoPE theta 10000 and a GELU projector hard-coded, the tower read at its last layer
            requires={"hidden_act": "silu", "rope_theta": 10000.0, "rope_parameters.rope_theta": 10000.0},
            requires_top={"projector_hidden_act": "gelu", "vision_feature_layer": -1}),
    # Idefics3 / SmolVLM: a SigLIP tower (post-LN kept), its patch grid pixel-unshuffled by scale_factor into one
    # linear projector (mm.model.fc); llama.cpp keeps the embeddings float32 and writes the image processor's
    # longest edge (mtmd resizes and slices to it)
    *(_record(mt, cls, "idefics3", _SIGLIP_BASE,
              (VParam("clip.vision.attention.layer_norm_epsilon", ("layer_norm_eps",), kind="f32", default=1e-5),
               VParam("clip.vision.projector.scale_factor", ("scale_factor",), "top", default=2),
               _fixed("clip.use_gelu", True, "bool"),
               VParam("clip.vision.preproc_image_size", ("size",), "pre", "longest_edge", {})),
              prefixes=("model.vision_model.", "model.connector."), f32=(".embeddings.",),
              requires={"hidden_act": "gelu_pytorch_tanh"})
      for mt, cls in (("idefics3", "Idefics3ForConditionalGeneration"),
                      ("smolvlm", "SmolVLMForConditionalGeneration"))),
    # Qwen2-Audio: a Whisper encoder (two GELU conv1d, learned positions, 2x average pooling, LayerNorm) and one
    # linear projector (its `multi_modal_projector.` llama.cpp prefixes `audio.`); the conv biases stored [n, 1],
    # the conv weights float16; mtmd's graph takes 30-second windows of 3000 mel frames, 1500 positions, erf GELU
    _record("qwen2_audio", "Qwen2AudioForConditionalGeneration", "qwen2a", _WHISPER_BASE,
            (VParam("clip.audio.num_mel_bins", ("num_mel_bins",)),
             VParam("clip.audio.attention.layer_norm_epsilon", ("layer_norm_eps",), kind="f32", default=1e-5)),
            modality="audio", prefixes=("audio_tower.", "audio.multi_modal_projector."),
            layouts=((r"^model\.audio_tower\.", "audio_tower."),
                     (r"^(model\.)?multi_modal_projector\.", "audio.multi_modal_projector.")),
            unsqueeze=("audio_tower.conv1.bias", "audio_tower.conv2.bias"),
            f16=("audio_tower.conv1.weight", "audio_tower.conv2.weight"),
            requires={"max_source_positions": 1500, "activation_function": "gelu"}),
    # Gemma 4 (its vision tower: SigLIP-like blocks with q/k/v norms and sandwich norms, 2-D learned positions,
    # 3x3 average pooling, one projection; the E2B/E4B audio conformer is not written): llama.cpp writes the
    # projector type under clip.vision., a fixed image size (mtmd resizes dynamically), the patch embedding as a
    # conv, the position table float32; mtmd hard-codes the 3x3 pooling (its converter writes no scale factor)
    VisionArch("gemma4", "Gemma4ForConditionalGeneration", "gemma4v",
               prefixes=("vision_model.model.", "model.vision_tower.patch_embedder.", "model.embed_vision."),
               hparams=(_fixed("clip.vision.image_size", 224, "u32"), *_SIGLIP_BASE[1:],
                        _fixed("clip.vision.projector_type", "gemma4v", "str"),
                        VParam("clip.vision.attention.layer_norm_epsilon", ("layer_norm_eps",), kind="f32",
                               default=1e-6)),
               layouts=((r"^model\.vision_tower\.encoder\.", "vision_model.model."),),
               renames=((".linear.weight", ".weight"), ("position_embedding_table", "position_embedding_table.weight")),
               patch_hwc="model.vision_tower.patch_embedder.input_proj.weight", f32=("position_embedding_table",),
               requires={"pooling_kernel_size": 3, "hidden_activation": "gelu_pytorch_tanh"}),
)
# Qwen3-VL MoE: Qwen3-VL's tower and mergers under its own class (only the text model is MoE)
_RECORDS += (next(v for v in _RECORDS if v.model_type == "qwen3_vl")._replace(
    model_type="qwen3_vl_moe", hf_class="Qwen3VLMoeForConditionalGeneration"),)
VISION_ARCHS: dict[str, VisionArch] = {v.model_type: v for v in _RECORDS}


def vision_arch_for_model_type(model_type: Any) -> VisionArch:
    """The vision record for an outer Hugging Face `model_type`; VisionConfigError listing those there are."""
    if isinstance(model_type, str) and model_type in VISION_ARCHS:
        return VISION_ARCHS[model_type]
    raise VisionConfigError(f"Hugging Face model_type {model_type!r} has no vision tower lazyweights writes as an "
                            f"mmproj; families with one: {', '.join(sorted(VISION_ARCHS))}")
