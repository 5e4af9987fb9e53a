"""One small declarative record per architecture: what lazyweights must know beyond gguf-py's name tables.

Tensor names come from gguf-py (`lazyweights.adapters.names`); who a family is (its `model_type`, Hugging Face
class, llama.cpp architecture `gguf`, `back_as`) is its row in `lazyweights.formats.arch_identity`, which the
record copies when it is built (`_arch`); a record says only

- the hyperparameters: `HParam(gguf key, config.json names (current first, then legacy aliases), kind)`;
- the value transforms llama.cpp's converter applies (`lazyweights.convert.transforms`): the q/k RoPE row
  permutation, norms stored as `w + norm_shift`, Conv1D weights stored transposed, fused qkv rows regrouped
  from `[groups, q_per_group + 2, head_dim]` to `[q; k; v]`;
- Hugging Face tensors llama.cpp has no use for (`dropped`), and the config.json entries the family fixes
  when converting back (`hf_extra`);
- state-space layers (`ssm`: Mamba's A = -exp(A_log), squeezed conv1d, Mamba-2's per-head shapes) and hybrids
  (`hybrid`: which config.json key marks the attention layers; llama.cpp reads 0 kv heads as a Mamba layer).

Adding an architecture is a row in `formats/arch_identity.py`, a record here and a line in the test's table. Every
family is a record both ways, the first ten included: a fact only some families have is a field (Llama 3's
`rope_freqs` tensor, Gemma's `qpas_27b` attention scale, `swa_period` layer types, `late` softcapping rows), and
`hparams` turns them into keys. A quirk one family alone has (Falcon's and GPT-BigCode's kv heads, StableLM's
residual read back from the tensors, Granite 4.0's RoPE switch, Falcon-H1's muP, Phi-3's LongRoPE and head dim
keys, Gemma 3's and ModernBERT's sliding-layer keys, Gemma 4's per-layer sizes, gpt-oss's YaRN `truncate`) is a
hook on its record (`hooks`: `family_hooks.FamilyHooks`), which the engines call by role: no engine names a
family, and no boolean field of `Arch` is set by one record alone (`tests/adapters/test_family_hooks.py`).

Example:
    >>> from lazyweights.adapters.archs import arch_for_model_type
    >>> a = arch_for_model_type("gpt_neox")
    >>> a.gguf, a.hf_class, a.qkv_groups
    ('gptneox', 'GPTNeoXForCausalLM', 'heads')
    >>> try:
    ...     arch_for_model_type("lama")
    ... except ValueError as e:
    ...     print(str(e).split(",")[0])
    Hugging Face model_type 'lama' is not supported; nearest supported: llama
"""
from __future__ import annotations

import difflib
from typing import Any, Mapping, NamedTuple

from ..core.errors import UnsupportedArchitectureError
from ..formats.arch_identity import GGUF_ARCHS as _IDENTITY_GGUF_ARCHS
from ..formats.arch_identity import IDENTITIES, MODEL_TYPE_ALIASES, ArchIdentity
from ..formats.arch_identity import identity_for_gguf as _identity_for_gguf
from ..formats.arch_identity import identity_for_model_type as _identity_for_model_type
from ..formats.gguf_keys import template as _gguf_template
from . import family_hooks as _hooks
from .family_hooks import FamilyHooks


class HParam(NamedTuple):
    """One GGUF hyperparameter: `{arch}.{key}` <-> the first of `hf` found in config.json (`hf[0]` is written
    back). `kind`: u32, f32, bool, `prod`: a u32 that is the product of every name in `hf` (all present),
    derived one way only (its factors are rows of their own), `f32n`: an f32 whose 0 stands for null (DBRX's
    clip_qkv: llama.cpp clamps only above 0), `sum`: a u32 that is the sum of every name in `hf`
    (all present), `hf[0]` written back as the value less the others (rows of their own), or `lead`: a u32
    written back under `hf[0]`
    whose source may also be a per-layer MLP type list, counted as its leading "dense" entries."""

    key: str
    hf: tuple[str, ...]
    kind: str = "u32"

    @property
    def template(self) -> str:
        """gguf-py's `Keys` template of this row's key (`{arch}.` + key; `formats.gguf_keys.template`).

        >>> CTX.template
        '{arch}.context_length'
        """
        return _gguf_template(self.key)


def _p(key: str, *hf: str, kind: str = "u32") -> HParam:
    return HParam(key, hf, kind)


class Arch(NamedTuple):
    """One architecture's record: its Hugging Face model_type and class, the llama.cpp architecture it becomes
    (copied from its `formats.arch_identity` row by `_arch`), its hyperparameter rows and the value transforms
    llama.cpp's converter applies (one comment per field)."""

    model_type: str
    gguf: str
    hf_class: str
    hparams: tuple[HParam, ...] = ()
    rope_permute: bool = False          # llama.cpp's converter permutes q/k rows (LlamaModel.permute)
    norm_shift: float = 0.0             # norms stored as w + norm_shift (Gemma: 1)
    partial_rotary: bool = False        # rope.dimension_count = head_dim * partial_rotary_factor
    transposed: tuple[str, ...] = ()    # HF weight suffixes stored [in, out] (GPT-2's Conv1D)
    qkv_groups: str | None = None       # fused qkv rows grouped: "heads" ([n_head, 3, hd]) or "kv" (falcon)
    ffn_mult: int = 0                   # feed_forward_length = ffn_mult * hidden when the config has none
    dropped: tuple[str, ...] = ()       # HF tensor suffixes llama.cpp has no use for
    hf_extra: Mapping[str, Any] = {}    # config.json entries this family fixes (GGUF -> HF)
    tied: bool = False                  # config.json's tie_word_embeddings default
    embedding: bool = False             # encoder (llama.cpp embedding GGUF)
    gguf_fixed: Mapping[str, Any] = {}  # GGUF keys llama.cpp needs that the config does not hold
    hf_prefer: tuple[str, ...] = ()     # GGUF -> HF without transformers: gguf-py candidates holding these win
    sliding: bool = False               # sliding-window layers: window + per-layer pattern from layer_types
    fused_gate_up_exps: str = ""        # HF stacked-expert tensor holding [gate; up] rows, split for llama.cpp
    experts: str = ""                   # HF per-expert prefix in a layer ("mlp.experts"), stacked for llama.cpp
    mrope: bool = False                 # M-RoPE: rope.dimension_sections from rope_parameters.mrope_section
    window_flag: str = ""               # config flag saying the sliding_window applies (Qwen: use_sliding_window)
    back_as: str = ""                   # GGUF -> HF as this record's model (a VL model's text part alone): from
                                        # the identity row, as model_type, gguf and hf_class are
    mla: bool = False                   # DeepSeek's multi-head latent attention: kv_b_proj split into k_b / v_b
    head_dims: bool = False             # key_length/value_length always, after rope.freq_base (LlamaModel)
    window_always: bool = False         # attention.sliding_window whenever the config sets one (no flag)
    tail: tuple[HParam, ...] = ()       # required rows written after the RoPE keys (Mixtral's expert counts)
    no_vocab: bool = False              # no {arch}.vocab_size key (llama.cpp's Gemma 2/3 converter writes none)
    rope_freqs: bool = False            # Llama 3's "llama3" RoPE scaling as the rope_freqs.weight tensor, both ways
    qpas_27b: int = 0                   # Gemma: query_pre_attn_scalar is head_dim, or hidden / heads at this block
                                        # count (llama.cpp's 27B); a config saying otherwise warns
    swa_period: int = 0                 # Gemma: layer_types back from a GGUF = every Nth layer global
    late: tuple[HParam, ...] = ()       # optional rows written last, None back when absent (Gemma's softcapping)
    fused_gate_up_shexp: str = ""       # HF shared-expert tensor holding [gate; up] rows (GraniteMoeShared's
                                        # shared_mlp.input_linear), split into ffn_gate_shexp / ffn_up_shexp
    expert_names: tuple[str, str, str] = ("gate_proj", "down_proj", "up_proj")  # HF per-expert gate, down, up
                                        # projection names under `experts` (MiniMax-M2: w1, w2, w3)
    layer_scalars: tuple[tuple[str, str, int], ...] = ()  # (HF per-layer scalar tensor suffix, GGUF per-layer
                                        # array key in full, its HF ndim): values llama.cpp keeps as metadata
                                        # (xIELU's, under the global keys xielu.*)
    flat_experts: str = ""              # HF experts stored flat, one [n_expert * ff, hidden] tensor per projection
                                        # (`expert_names`; down transposed per expert) under this prefix, `{bid}`
                                        # the layer (DBRX), <-> llama.cpp's stacked [n_expert, rows, cols]
    experts_in_out: str = ""            # HF prefix in a layer holding gate_up_proj [n_expert, hidden, 2 * ff] and
                                        # down_proj [n_expert, ff, hidden] ([in, out]: Llama 4), transposed (and
                                        # the gate/up halves split) for llama.cpp, joined back
    requires: Mapping[str, Any] = {}    # config.json values llama.cpp's graph hard-codes (AFMoE's muP embedding
                                        # scale): HF -> GGUF refuses a config without them, GGUF -> HF writes them
    position_offset: bool = False       # RoBERTa: position rows start at pad_token_id + 1; llama.cpp's converter
                                        # drops the rows before (and the context length shrinks by as many)
    window_hf: str = ""                 # config.json's name of the sliding window (ModernBERT: local_attention)
    oai_experts: str = ""               # gpt-oss's fused experts under this prefix: gate_up_proj [E, in, 2 * ff]
                                        # (gate/up interleaved), down_proj [E, ff, out], their biases, or the
                                        # MXFP4 `*_blocks`/`*_scales` kept packed; `self_attn.sinks` too
    ssm: int = 0                        # Mamba state-space layers, generation 1 or 2 (`transforms.ssm_to_gguf`):
                                        # A stored as -exp(A_log), conv1d squeezed to 2-D; 2: A/D as [n_head, 1],
                                        # the gated norm as [n_group, d_inner / n_group]
    pad_vocab: int = 0                  # token list padded to a multiple of this (Mamba's pad_vocab_size_multiple)
    hybrid: str = ""                    # attention and Mamba layers (head_count_kv per layer, 0 on Mamba layers),
                                        # config.json naming the attention layers: layer_types, attn_layer_indices
                                        # attn_layer_period (with _offset) or layers_block_type (Nemotron-H's
                                        # attention / mlp / mamba layers)
    shortconv: bool = False             # LFM2's gated short-convolution layers (layer_types "conv"; 0 kv heads
                                        # for llama.cpp): conv weight [d, 1, L] stored [d, L] in float32, the
                                        # feed-forward width after LFM2's auto-adjust (2/3, multiplier, multiple_of)
    gdn: bool = False                   # Qwen's gated delta-net layers (layer_types "linear_attention"): A as
                                        # -exp(A_log), conv1d squeezed, in_proj_qkvz split into llama.cpp's
                                        # attn_qkv ([q; k; v] over heads) and attn_gate (z), recurrent_layers;
                                        # norms +1 except the gated delta-net's own (`transforms.gdn_to_gguf`)
    v_reorder: bool = False             # Qwen3.5: value heads regrouped to llama.cpp's tiled order where there are
                                        # more value than key heads (`transforms.v_reorder`), both ways
    bias_flag: str = ""                 # config.json's flag saying the q/k/v projections carry biases (GGUF -> HF,
                                        # from the tensors: attention_bias, use_qkv_bias, use_bias, bias)
    hooks: FamilyHooks = FamilyHooks()  # the quirks this family alone has, called by role (`family_hooks`)

    @property
    def identity(self) -> ArchIdentity:
        """The record's row in `formats.arch_identity` (its GGUF name, model_types, classes).

        >>> from lazyweights.adapters.archs import ARCHS
        >>> ARCHS["nemotron_h_moe"].identity.config_model_type
        'nemotron_h'
        """
        return IDENTITIES[self.model_type]


def _arch(model_type: str, *fields: Any, **named: Any) -> Arch:
    """A record whose identity (gguf, hf_class, back_as) is its `formats.arch_identity` row's."""
    row = IDENTITIES[model_type]
    return Arch(model_type, row.gguf, row.hf_class, *fields, **named)._replace(back_as=row.back_as)


# --- shared hyperparameter rows (transformers 5 names first) ---------------------------------------------------
CTX = _p("context_length", "max_position_embeddings", "n_positions", "n_ctx")
EMB = _p("embedding_length", "hidden_size", "n_embd")
BLK = _p("block_count", "num_hidden_layers", "n_layer")
FFN = _p("feed_forward_length", "intermediate_size", "n_inner", "ffn_hidden_size")
HEAD = _p("attention.head_count", "num_attention_heads", "n_head")
KV = _p("attention.head_count_kv", "num_key_value_heads", "num_kv_heads", "n_head_kv")
RMS = _p("attention.layer_norm_rms_epsilon", "rms_norm_eps", kind="f32")
BASE = (CTX, EMB, BLK, FFN, HEAD)


def _ln(name: str) -> HParam:
    others = [n for n in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon") if n != name]
    return _p("attention.layer_norm_epsilon", name, *others, kind="f32")


_LLAMA_LIKE = (*BASE, KV, RMS)
_QK_NORM = (".q_norm.", ".k_norm.")
_MOE = (_p("expert_count", "num_experts", "num_local_experts"), _p("expert_used_count", "num_experts_per_tok"))
_SOFTCAP = (_p("final_logit_softcapping", "final_logit_softcapping", kind="f32"),
            _p("attn_logit_softcapping", "attn_logit_softcapping", kind="f32"))
_ROTARY_BUFFERS = ("rotary_emb.inv_freq",)
_MLA = (_p("attention.q_lora_rank", "q_lora_rank"), _p("attention.kv_lora_rank", "kv_lora_rank"))
# DeepSeek-style MoE: routed experts, shared experts, dense leading layers, scaled (optionally normalised) weights
_DS_MOE = (_p("expert_count", "n_routed_experts", "num_experts"), _MOE[1],
           _p("expert_feed_forward_length", "moe_intermediate_size"),
           _p("expert_shared_count", "n_shared_experts"),
           _p("leading_dense_block_count", "first_k_dense_replace"),
           _p("expert_weights_scale", "routed_scaling_factor", kind="f32"),
           _p("expert_weights_norm", "norm_topk_prob", kind="bool"),
           _p("expert_group_count", "n_group"), _p("expert_group_used_count", "topk_group"))

_RECORDS: tuple[Arch, ...] = (
    # llama, Mistral, Mixtral (a llama GGUF): the window whenever set, Llama 3 RoPE factors as a tensor
    _arch("llama", _LLAMA_LIKE, rope_permute=True, head_dims=True, window_always=True,
         rope_freqs=True, hf_extra={"mlp_bias": False}, bias_flag="attention_bias"),
    _arch("mistral", _LLAMA_LIKE, rope_permute=True, head_dims=True,
         window_always=True, rope_freqs=True, bias_flag="attention_bias"),
    _arch("mixtral", _LLAMA_LIKE, rope_permute=True, head_dims=True,
         window_always=True, rope_freqs=True, tail=(_p("expert_count", "num_local_experts", "num_experts"), _MOE[1]),
         bias_flag="attention_bias", experts="block_sparse_moe.experts", expert_names=("w1", "w2", "w3")),
    # Qwen: the window only where use_sliding_window says so; MoE expert sizes; Qwen3 MoE always renormalizes
    _arch("qwen2", _LLAMA_LIKE, window_flag="use_sliding_window"),
    _arch("qwen3", _LLAMA_LIKE, window_flag="use_sliding_window", hf_prefer=_QK_NORM),
    _arch("qwen2_moe",
         (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_feed_forward_length", "shared_expert_intermediate_size")),
         window_flag="use_sliding_window", hf_prefer=(".mlp.gate.",), experts="mlp.experts"),
    _arch("qwen3_moe",
         (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size")),
         window_flag="use_sliding_window", hf_prefer=(".mlp.gate.", *_QK_NORM),
         experts="mlp.experts",
         hf_extra={"norm_topk_prob": True}),  # llama.cpp's qwen3moe graph always renormalizes the top-k weights
    # Gemma 2/3: key_length always, no vocab_size key, llama.cpp's attention scale, alternating (Gemma 2) or every
    # 6th layer global (Gemma 3: else a per-layer pattern, and the sliding layers' own theta), softcapping
    _arch("gemma2", _LLAMA_LIKE, norm_shift=1.0, tied=True, head_dims=True,
         window_always=True, no_vocab=True, qpas_27b=46, swa_period=2, late=_SOFTCAP,
         hf_extra={"hidden_activation": "gelu_pytorch_tanh"}),
    _arch("gemma3_text", _LLAMA_LIKE, norm_shift=1.0, tied=True, head_dims=True,
         window_always=True, no_vocab=True, qpas_27b=62, swa_period=6, late=_SOFTCAP[:1],
         hf_prefer=_QK_NORM, hf_extra={"hidden_activation": "gelu_pytorch_tanh"}, hooks=_hooks.GEMMA3),
    # Phi-3: partial rotary (transformers 5 writes the factor inside rope_parameters), LongRoPE (factor tensors,
    # original context, attention factor), key_length only for an odd head dim: its hooks
    _arch("phi3", _LLAMA_LIKE, partial_rotary=True,
         window_always=True, hf_prefer=(".gate_up_proj.", ".qkv_proj."), hooks=_hooks.PHI3,
         hf_extra={"hidden_act": "silu"}),
    # record-driven families
    _arch("gemma", (*_LLAMA_LIKE, _p("attention.key_length", "head_dim"),
         _p("attention.value_length", "head_dim")), norm_shift=1.0, tied=True,
         hf_extra={"hidden_act": "gelu_pytorch_tanh"}, bias_flag="attention_bias"),
    _arch("granite",
         (*_LLAMA_LIKE, _p("embedding_scale", "embedding_multiplier", kind="f32"),
          _p("residual_scale", "residual_multiplier", kind="f32"),
          _p("attention.scale", "attention_multiplier", kind="f32"),
          _p("logit_scale", "logits_scaling", kind="f32")), rope_permute=True,
          bias_flag="attention_bias", hooks=_hooks.GRANITE),
    _arch("granitemoe",
         (*_LLAMA_LIKE, _p("expert_count", "num_local_experts", "num_experts"), _MOE[1],
          _p("embedding_scale", "embedding_multiplier", kind="f32"),
          _p("residual_scale", "residual_multiplier", kind="f32"),
          _p("attention.scale", "attention_multiplier", kind="f32"),
          _p("logit_scale", "logits_scaling", kind="f32")), rope_permute=True,
         fused_gate_up_exps="block_sparse_moe.input_linear", hf_prefer=(".output_linear.", ".router.layer.")),
    _arch("olmo", (*BASE, KV), rope_permute=True,
         gguf_fixed={"attention.layer_norm_epsilon": 1e-5},
         bias_flag="attention_bias"),  # OLMo's LayerNorm has no eps in its config
    _arch("olmo2", _LLAMA_LIKE, bias_flag="attention_bias"),
    _arch("starcoder2", (*BASE, KV, _ln("norm_epsilon")), tied=True,
         hf_extra={"hidden_act": "gelu_pytorch_tanh", "use_bias": True}, bias_flag="use_bias"),
    _arch("stablelm", (*BASE, KV, _ln("layer_norm_eps")), partial_rotary=True,
         hf_extra={"hidden_act": "silu", "use_parallel_residual": False},
         bias_flag="use_qkv_bias", hooks=_hooks.STABLELM),
    _arch("phi", (*BASE, KV, _ln("layer_norm_eps")), partial_rotary=True,
         hf_extra={"hidden_act": "gelu_new"}),
    _arch("gpt2",
         (_p("context_length", "n_positions", "max_position_embeddings", "n_ctx"),
          _p("embedding_length", "n_embd", "hidden_size"), _p("block_count", "n_layer", "num_hidden_layers"),
          _p("feed_forward_length", "n_inner", "intermediate_size"),
          _p("attention.head_count", "n_head", "num_attention_heads"), _ln("layer_norm_epsilon")),
         transposed=("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"),
         ffn_mult=4, dropped=("attn.bias", "attn.masked_bias"), tied=True,
         hf_extra={"activation_function": "gelu_new"}),
    _arch("gpt_neox", (*BASE, _ln("layer_norm_eps"),
         _p("use_parallel_residual", "use_parallel_residual", kind="bool")), partial_rotary=True,
         qkv_groups="heads", dropped=("attention.bias", "attention.masked_bias"), hf_extra={"hidden_act": "gelu"},
         bias_flag="attention_bias"),
    _arch("falcon", (CTX, EMB, BLK, _p("feed_forward_length", "ffn_hidden_size"),
         HEAD, _p("attention.head_count_kv", "num_kv_heads", "n_head_kv"), _ln("layer_norm_epsilon")),
         qkv_groups="kv", ffn_mult=4, tied=True,
         hf_extra={"new_decoder_architecture": True, "parallel_attn": True, "bias": False, "alibi": False,
                   "activation": "gelu"}, bias_flag="bias", hooks=_hooks.FALCON),
    _arch("gpt_bigcode",
         (_p("context_length", "n_positions", "max_position_embeddings"),
          _p("embedding_length", "n_embd", "hidden_size"),
          _p("block_count", "n_layer", "num_hidden_layers"), _p("feed_forward_length", "n_inner", "intermediate_size"),
          _p("attention.head_count", "n_head", "num_attention_heads"), KV, _ln("layer_norm_epsilon")),
         ffn_mult=4, tied=True, hf_extra={"activation_function": "gelu_pytorch_tanh"}, hooks=_hooks.GPT_BIGCODE),
    _arch("bloom",
         (_p("context_length", "seq_length", "max_position_embeddings"),
          _p("embedding_length", "hidden_size", "n_embed"),
          _p("block_count", "n_layer", "num_hidden_layers"), FFN, _p("attention.head_count", "n_head",
          "num_attention_heads"), KV, _ln("layer_norm_epsilon")),
         qkv_groups="heads", ffn_mult=4, tied=True, gguf_fixed={"context_length": 2048}),
    _arch("nemotron", (*BASE, KV, _ln("norm_eps")), norm_shift=1.0,
         partial_rotary=True, hf_extra={"hidden_act": "relu2"}, bias_flag="attention_bias"),
    _arch("seed_oss", _LLAMA_LIKE, hf_extra={"attention_out_bias": False}, bias_flag="attention_bias"),
    _arch("arcee", _LLAMA_LIKE, rope_permute=True, hf_extra={"hidden_act": "relu2"}, bias_flag="attention_bias"),
    _arch("olmoe", (*_LLAMA_LIKE, *_MOE), experts="mlp.experts"),
    _arch("olmo3", _LLAMA_LIKE, sliding=True),
    _arch("glm4", _LLAMA_LIKE, partial_rotary=True),
    _arch("hunyuan_v1_dense", _LLAMA_LIKE),
    _arch("ernie4_5", _LLAMA_LIKE, bias_flag="use_bias"),
    _arch("smollm3", _LLAMA_LIKE, rope_permute=True, bias_flag="attention_bias"),
    _arch("cohere2", (*BASE, KV, _ln("layer_norm_eps"),
         _p("logit_scale", "logit_scale", kind="f32")), partial_rotary=True, tied=True, sliding=True),
    _arch("mpt",
         (_p("context_length", "max_seq_len"), _p("embedding_length", "d_model"), _p("block_count", "n_layers"),
          _p("attention.head_count", "n_heads"), _ln("layer_norm_epsilon")), ffn_mult=4,
         gguf_fixed={"attention.max_alibi_bias": 8.0}, tied=True),
    _arch("cohere", (*BASE, KV, _ln("layer_norm_eps"),
         _p("logit_scale", "logit_scale", kind="f32")), tied=True, hf_extra={"hidden_act": "silu"},
         bias_flag="attention_bias", hooks=_hooks.QK_NORM),
    _arch("exaone", _LLAMA_LIKE, partial_rotary=True),
    _arch("dots1", (*_LLAMA_LIKE, *_DS_MOE), experts="mlp.experts",
         hf_prefer=(".mlp.gate.", *_QK_NORM), gguf_fixed={"expert_gating_func": 2}),  # sigmoid
    _arch("glm4_moe", (*_LLAMA_LIKE, *_DS_MOE), partial_rotary=True,
         experts="mlp.experts", hf_prefer=(".mlp.gate.", *_QK_NORM), gguf_fixed={"expert_gating_func": 2},
         bias_flag="attention_bias", hooks=_hooks.QK_NORM),
    _arch("ernie4_5_moe",
         (*_LLAMA_LIKE, _p("expert_count", "moe_num_experts"), _p("expert_used_count", "moe_k"),
          _p("interleave_moe_layer_step", "moe_layer_interval"),
          _p("leading_dense_block_count", "moe_layer_start_index"),
          _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_count", "moe_num_shared_experts"),
          _p("expert_shared_feed_forward_length", "moe_intermediate_size", "moe_num_shared_experts", kind="prod")),
         experts="mlp.experts", hf_prefer=(".moe_statics.", ".mlp.gate.")),
    _arch("hunyuan_v1_moe",
         (*_LLAMA_LIKE, _p("expert_count", "num_experts", "num_local_experts"), _p("expert_used_count", "moe_topk"),
          _p("expert_feed_forward_length", "moe_intermediate_size", "intermediate_size"),
          _p("expert_shared_count", "num_shared_expert"),
          _p("expert_shared_feed_forward_length", "intermediate_size")),
         experts="mlp.experts", hf_prefer=(".gate.wg.", ".shared_mlp.", "_layernorm.")),
    # MLA: llama.cpp stores it as MQA over the latent (head_count_kv 1, key_length kv_lora_rank + rope dims)
    _arch("deepseek_v2", (*BASE, RMS, *_DS_MOE, *_MLA), mla=True,
         experts="mlp.experts", hf_prefer=(".mlp.gate.",), gguf_fixed={"expert_gating_func": 1}),  # softmax
    _arch("deepseek_v3", (*BASE, RMS, *_DS_MOE, *_MLA), mla=True,
         experts="mlp.experts", hf_prefer=(".mlp.gate.",), gguf_fixed={"expert_gating_func": 2}),  # sigmoid
    # VL models' text part (the vision tower is llama.cpp's separate mmproj file); GGUF -> HF gives the text model
    # alone as Qwen2, whose plain RoPE is what M-RoPE computes on text (every section at the same position)
    _arch("qwen2_vl_text", _LLAMA_LIKE, mrope=True),
    _arch("qwen2_5_vl_text", _LLAMA_LIKE, mrope=True),
    _arch("qwen3_vl_text", (*_LLAMA_LIKE, _p("n_deepstack_layers", "num_deepstack_layers")), mrope=True,
          hf_prefer=_QK_NORM),
    # Qwen3-VL MoE: Qwen3 MoE's layers (llama.cpp's qwen3vlmoe) with the deepstack count; experts published as
    # gate_up_proj [n_expert, hidden, 2 * ff] / down_proj [n_expert, ff, hidden], Llama 4's [in, out] layout
    _arch("qwen3_vl_moe_text",
          (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size"),
           _p("n_deepstack_layers", "num_deepstack_layers")),
          mrope=True, experts="mlp.experts", experts_in_out="mlp.experts", hf_prefer=(".mlp.gate.", *_QK_NORM)),
    _arch("exaone4", _LLAMA_LIKE, sliding=True, hf_prefer=_QK_NORM),
)
_RECORDS += (
    # encoders: llama.cpp embedding GGUFs, pooling type from the sentence-transformers folder (modules.json)
    _arch("bert", (CTX, EMB, BLK, FFN, HEAD, _ln("layer_norm_eps")), embedding=True,
         dropped=("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"),
         gguf_fixed={"attention.causal": False}, hf_extra={"hidden_act": "gelu"}),
)
_RECORDS += (  # decoders
    # InternLM3: llama.cpp's converter writes a llama GGUF (its rope dimension from head_dim); back as llama
    _arch("internlm3", _LLAMA_LIKE, rope_permute=True, head_dims=True),
    # GLM (GLM-4 9B, transformers' GlmForCausalLM): llama.cpp's chatglm, [gate; up] kept fused as ffn_up, half rotary
    _arch("glm", _LLAMA_LIKE, partial_rotary=True, bias_flag="attention_bias"),
    # GraniteMoeShared: granitemoe plus a shared expert whose fused [gate; up] llama.cpp stores split
    _arch("granitemoeshared",
         (*_LLAMA_LIKE, _p("expert_count", "num_local_experts", "num_experts"), _MOE[1],
          _p("embedding_scale", "embedding_multiplier", kind="f32"),
          _p("residual_scale", "residual_multiplier", kind="f32"),
          _p("attention.scale", "attention_multiplier", kind="f32"),
          _p("logit_scale", "logits_scaling", kind="f32"),
          _p("expert_shared_feed_forward_length", "shared_intermediate_size")), rope_permute=True,
         fused_gate_up_exps="block_sparse_moe.input_linear", fused_gate_up_shexp="shared_mlp.input_linear",
         hf_prefer=(".output_linear.", ".router.layer.")),
    # EXAONE MoE (K-EXAONE): DeepSeek-V3-style sigmoid router with a score bias, shared experts, qk norms,
    # sliding-window layers (the global ones without RoPE in both)
    _arch("exaone_moe",
         (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_count", "num_shared_experts"),
          _p("expert_shared_feed_forward_length", "moe_intermediate_size", "num_shared_experts", kind="prod"),
          _p("expert_weights_scale", "routed_scaling_factor", kind="f32"),
          _p("expert_weights_norm", "norm_topk_prob", kind="bool"),
          _p("leading_dense_block_count", "first_k_dense_replace")),
         sliding=True, experts="mlp.experts", hf_prefer=(".mlp.gate.", *_QK_NORM),
         gguf_fixed={"expert_gating_func": 2}),  # sigmoid
    # GLM-4.7-Flash: DeepSeek-V3's MLA and sigmoid-routed experts (a deepseek2 GGUF, back as deepseek_v3); its
    # config may say the dense lead layers only as mlp_layer_types
    _arch("glm4_moe_lite",
         (*BASE, RMS, *(hp if hp.key != "leading_dense_block_count" else
                        _p(hp.key, "first_k_dense_replace", "mlp_layer_types", kind="lead") for hp in _DS_MOE), *_MLA),
         mla=True, experts="mlp.experts", hf_prefer=(".mlp.gate.",), gguf_fixed={"expert_gating_func": 2}),
    # Solar Open: llama.cpp's converter writes it as GLM-4.5 (glm4moe; back as glm4_moe), full rotary, every
    # layer MoE (its config has no first_k_dense_replace; GLM-4.5's defaults to 1)
    _arch("solar_open", (*_LLAMA_LIKE, *_DS_MOE), experts="mlp.experts",
         hf_prefer=(".mlp.gate.", *_QK_NORM), gguf_fixed={"expert_gating_func": 2, "leading_dense_block_count": 0}),
    # AFMoE (Arcee Trinity): gated attention, qk norms, pre/post norms, sigmoid router with a bias, shared experts,
    # sliding-window layers (RoPE on those only: llama.cpp skips it every 4th layer, the real models' global ones);
    # llama.cpp always renormalizes the top-k weights and scales the embeddings by sqrt(hidden) (muP)
    _arch("afmoe",
         (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_count", "num_shared_experts"), _p("leading_dense_block_count", "num_dense_layers"),
          _p("expert_weights_scale", "route_scale", kind="f32")),
         sliding=True, experts="mlp.experts", hf_prefer=(".router.gate.", *_QK_NORM),
         gguf_fixed={"expert_weights_norm": True, "expert_gating_func": 2}, requires={"mup_enabled": True}),
    # MiniMax-M2: Mixtral-style experts (w1/w2/w3) under a sigmoid router with a score bias, whole-width qk norms,
    # partial rotary; llama.cpp's graph always renormalizes the top-k weights, as transformers does
    _arch("minimax_m2",
         (*_LLAMA_LIKE, _p("expert_count", "num_local_experts", "num_experts"), _MOE[1],
          _p("expert_feed_forward_length", "intermediate_size")), partial_rotary=True,
         experts="block_sparse_moe.experts", expert_names=("w1", "w2", "w3"),
         hf_prefer=(".block_sparse_moe.gate.", *_QK_NORM), gguf_fixed={"expert_gating_func": 2}),
    # Apertus: qk norms, an up/down MLP with the xIELU activation, whose four per-layer scalars llama.cpp keeps as
    # metadata arrays (the raw parameters; its kernel applies the softplus as transformers does)
    _arch("apertus", _LLAMA_LIKE, head_dims=True, hf_prefer=_QK_NORM,
         layer_scalars=(("mlp.act_fn.alpha_n", "xielu.alpha_n", 1), ("mlp.act_fn.alpha_p", "xielu.alpha_p", 1),
                        ("mlp.act_fn.beta", "xielu.beta", 0), ("mlp.act_fn.eps", "xielu.eps", 0))),
    # MiniCPM3: DeepSeek-style low-rank q and kv (kv_b kept whole), key = nope + rope dims; llama.cpp's graph
    # hard-codes the muP scales of the released 4B
    _arch("minicpm3",
         (*_LLAMA_LIKE, *_MLA, _p("attention.key_length", "qk_nope_head_dim", "qk_rope_head_dim", kind="sum"),
          _p("attention.value_length", "v_head_dim"), _p("rope.dimension_count", "qk_rope_head_dim")), tied=True,
         requires={"scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256}),
    # DBRX: nested attn_config / ffn_config, fused [q; k; v], bias-free LayerNorms (eps 1e-5, fixed in both), flat
    # experts (gate w1, up v1, down w2 transposed per expert), qkv clamp (none: 0)
    _arch("dbrx",
         (_p("context_length", "max_seq_len"), _p("embedding_length", "d_model"),
          _p("embedding_length", "ffn_config.hidden_size", "d_model"), _p("block_count", "n_layers"),
          _p("feed_forward_length", "ffn_config.ffn_hidden_size"), _p("attention.head_count", "n_heads"),
          _p("attention.head_count_kv", "attn_config.kv_n_heads", "num_key_value_heads"),
          _p("rope.freq_base", "attn_config.rope_theta", "rope_theta", kind="f32"),
          _p("attention.clamp_kqv", "attn_config.clip_qkv", kind="f32n"),
          _p("expert_count", "ffn_config.moe_num_experts"), _p("expert_used_count", "ffn_config.moe_top_k")),
         flat_experts="transformer.blocks.{bid}.ffn.experts.mlp", expert_names=("w1", "w2", "v1"),
         gguf_fixed={"attention.layer_norm_epsilon": 1e-5, "attention.clamp_kqv": 0.0}),
    # Llama 4's text model: MoE every interleave_moe_layer_step-th layer (top-k sigmoid weights on the input, a
    # shared expert), [in, out] fused experts, RoPE-free every 4th layer with temperature tuning, L2 qk norms
    _arch("llama4_text",
         (CTX, EMB, BLK, _p("feed_forward_length", "intermediate_size_mlp"), HEAD, KV, RMS,
          _p("expert_count", "num_local_experts"), _MOE[1], _p("expert_feed_forward_length", "intermediate_size"),
          _p("interleave_moe_layer_step", "interleave_moe_layer_step")), head_dims=True,
         experts_in_out="feed_forward.experts", hf_prefer=(".feed_forward.",)),
)
_RECORDS += (  # encoders (nomic-bert, RoBERTa family, ...): llama.cpp embedding GGUFs, pooling from modules.json
    # the remote-code config.json names (n_embd, n_positions 8192 ...) are the legacy aliases; its trained context
    # (max_trained_positions) is what llama.cpp's converter writes, as transformers 5's max_position_embeddings
    _arch("nomic_bert",
         (_p("context_length", "max_position_embeddings", "max_trained_positions", "n_positions"), EMB, BLK, FFN,
          HEAD, _ln("layer_norm_eps")),
         embedding=True, gguf_fixed={"attention.causal": False}, hf_extra={"hidden_act": "silu"},
         hf_prefer=("encoder.layers.", "emb_ln")),
    _arch("roberta", (CTX, EMB, BLK, FFN, HEAD, _ln("layer_norm_eps")), embedding=True,
         dropped=("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"), position_offset=True,
         gguf_fixed={"attention.causal": False}, hf_extra={"hidden_act": "gelu"}),
    _arch("xlm-roberta", (CTX, EMB, BLK, FFN, HEAD, _ln("layer_norm_eps")),
         embedding=True, dropped=("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"),
         position_offset=True, gguf_fixed={"attention.causal": False}, hf_extra={"hidden_act": "gelu"}),
    # DistilBERT: BERT without token types (llama.cpp's bert adds none; back as BertModel with a zero row) and
    # LayerNorm eps fixed at 1e-12
    _arch("distilbert",
         (CTX, _p("embedding_length", "dim", "hidden_size"), _p("block_count", "n_layers", "num_hidden_layers"),
          _p("feed_forward_length", "hidden_dim", "intermediate_size"),
          _p("attention.head_count", "n_heads", "num_attention_heads")), embedding=True,
         dropped=("embeddings.position_ids",),
         gguf_fixed={"attention.causal": False, "attention.layer_norm_epsilon": 1e-12}),
    # ModernBERT: symmetric sliding window (local_attention) on all layers but every n-th, a GLU FFN (Wi holds
    # [up; gate]) whose activation llama.cpp reads from hidden_activation, a RoPE base per layer type
    _arch("modernbert",
         (CTX, EMB, BLK, FFN, HEAD, _ln("norm_eps"), _p("hidden_activation", "hidden_activation", "hidden_act",
                                                       kind="str")),
         embedding=True, sliding=True, window_hf="local_attention",
         gguf_fixed={"attention.causal": False}, hooks=_hooks.MODERNBERT),
    # EuroBERT: a bidirectional Llama (GQA, RMSNorm, SwiGLU, RoPE without llama.cpp's q/k permutation)
    _arch("eurobert", _LLAMA_LIKE, embedding=True,
         gguf_fixed={"attention.causal": False}, hf_extra={"hidden_act": "silu"}),
    # jina-embeddings-v3: XLM-RoBERTa with RoPE and fused qkv (llama.cpp: XLMRobertaModel's converter, so the
    # context shrinks by pad_token_id + 1 too). Its remote-code folders say model_type xlm-roberta with
    # lora_adaptations (to_gguf reads them as this record) and hold parametrized weights; their LoRA task
    # adapters (llama.cpp: separate adapter GGUFs; not part of transformers' JinaEmbeddingsV3Model) are dropped
    _arch("jina_embeddings_v3",
         (CTX, EMB, BLK, FFN, HEAD, _ln("layer_norm_eps")), embedding=True, position_offset=True,
         dropped=("pooler.dense.weight", "pooler.dense.bias", "0.lora_A", "0.lora_B"),
         gguf_fixed={"attention.causal": False},
         hf_extra={"hidden_act": "gelu"}, hf_prefer=("encoder.layers.", "emb_ln", ".mixer.", ".mlp.fc1.", ".mlp.fc2.")),
)
_RECORDS += (  # gpt-oss: MXFP4 experts repacked for ggml (never dequantized), attention sinks, sliding layers
    _arch("gpt_oss",
         (*_LLAMA_LIKE, _p("expert_count", "num_local_experts", "num_experts"),
          _p("expert_used_count", "num_experts_per_tok", "experts_per_token"),  # the latter: OpenAI's own name
          _p("expert_feed_forward_length", "intermediate_size")),
         sliding=True, oai_experts="mlp.experts", bias_flag="attention_bias",
         hooks=_hooks.GPT_OSS),  # rope_parameters.truncate False back from a GGUF
)
_SSM = (_p("embedding_length", "hidden_size", "d_model"), BLK, _p("ssm.conv_kernel", "conv_kernel", "d_conv"),
        _p("ssm.state_size", "state_size", "d_state"),
        _p("attention.layer_norm_rms_epsilon", "layer_norm_epsilon", "rms_norm_eps", kind="f32"))
# llama.cpp reads no context length, feed-forward size or head count for Mamba, but its loader wants the keys
_SSM_FIXED = {"context_length": 1 << 20, "feed_forward_length": 0, "attention.head_count": 0}
_RECORDS += (  # state-space models (llama.cpp's conversion/mamba.py)
    _arch("mamba",
         (*_SSM, _p("ssm.inner_size", "intermediate_size", "d_inner"), _p("ssm.time_step_rank", "time_step_rank",
                                                                            "dt_rank")),
         ssm=1, pad_vocab=8, tied=True, gguf_fixed={**_SSM_FIXED, "ssm.dt_b_c_rms": False}),
    # Falcon Mamba: RMS norms (no weight) on dt, B and C; llama.cpp takes their eps from the layer norms'
    _arch("falcon_mamba",
         (*_SSM, _p("ssm.inner_size", "intermediate_size", "d_inner"), _p("ssm.time_step_rank", "time_step_rank",
                                                                            "dt_rank")),
         ssm=1, pad_vocab=8, tied=True, gguf_fixed={**_SSM_FIXED, "ssm.dt_b_c_rms": True}),
    # Mamba-2: one dt / A / D per head (time_step_rank = heads), B and C in n_groups groups, a grouped gated norm
    _arch("mamba2",
         (*_SSM, _p("ssm.inner_size", "expand", "hidden_size", kind="prod"), _p("ssm.time_step_rank", "num_heads"),
          _p("ssm.group_count", "n_groups")),
         ssm=2, pad_vocab=16, gguf_fixed=_SSM_FIXED),
)
_GRANITE_SCALES = (_p("embedding_scale", "embedding_multiplier", kind="f32"),
                   _p("residual_scale", "residual_multiplier", kind="f32"),
                   _p("attention.scale", "attention_multiplier", kind="f32"),
                   _p("logit_scale", "logits_scaling", kind="f32"))
_HYBRID_SSM = (_p("ssm.conv_kernel", "mamba_d_conv", "conv_kernel"),
               _p("ssm.state_size", "mamba_d_state", "state_size"),
               _p("ssm.group_count", "mamba_n_groups", "n_groups"),
               _p("ssm.inner_size", "mamba_expand", "hidden_size", kind="prod"),
               _p("ssm.time_step_rank", "mamba_n_heads", "num_heads"))
_RECORDS += (  # hybrids: attention and Mamba-2 layers (llama.cpp's conversion/granite.py GraniteHybridModel)
    # Granite 4.0: RoPE only where position_embedding_type says so (rope.scaling.finetuned is llama.cpp's switch)
    _arch("granitemoehybrid",
         (*_LLAMA_LIKE, _p("expert_count", "num_local_experts", "num_experts"), _MOE[1], *_GRANITE_SCALES,
          _p("expert_shared_feed_forward_length", "shared_intermediate_size"), *_HYBRID_SSM),
         rope_permute=True, ssm=2, hybrid="layer_types", pad_vocab=8,
         fused_gate_up_exps="block_sparse_moe.input_linear",
         fused_gate_up_shexp="shared_mlp.input_linear", hf_prefer=(".output_linear.", ".router.layer."),
         hooks=_hooks.GRANITE_HYBRID),
    # Bamba: the same converter; always RoPE, partial (rope_parameters.partial_rotary_factor), a dense MLP
    _arch("bamba", (*_LLAMA_LIKE, *_HYBRID_SSM), rope_permute=True,
         partial_rotary=True, ssm=2, hybrid="attn_layer_indices", pad_vocab=8,
         gguf_fixed={"rope.scaling.finetuned": True}),
    # Nemotron-H: each layer one of Mamba-2, attention (no RoPE) or a relu2 MLP (layers_block_type); llama.cpp
    # marks Mamba layers by no kv heads and no MLP (conversion/nemotron.py); its eps is a LayerNorm key
    _arch("nemotron_h",
         (CTX, EMB, BLK, FFN, HEAD, KV, _ln("layer_norm_epsilon"), _p("ssm.conv_kernel", "conv_kernel"),
          _p("ssm.state_size", "ssm_state_size"), _p("ssm.group_count", "n_groups"),
          _p("ssm.inner_size", "mamba_num_heads", "mamba_head_dim", kind="prod"),
          _p("ssm.time_step_rank", "mamba_num_heads")),
         ssm=2, hybrid="layers_block_type", pad_vocab=8,
         hf_prefer=("backbone.",)),  # without transformers: the saved names (its memory says model.*)
    # Falcon-H1: attention and Mamba-2 in parallel in every layer, then an MLP; muP multipliers folded into the
    # weights as llama.cpp's conversion/falcon_h1.py does (config.json back: every multiplier 1)
    _arch("falcon_h1",
         (*_LLAMA_LIKE, _p("ssm.conv_kernel", "mamba_d_conv"), _p("ssm.inner_size", "mamba_d_ssm"),
          _p("ssm.state_size", "mamba_d_state"), _p("ssm.time_step_rank", "mamba_n_heads"),
          _p("ssm.group_count", "mamba_n_groups")),
         ssm=2, hooks=_hooks.FALCON_H1, hf_extra={"lm_head_multiplier": 1.0, "embedding_multiplier": 1.0,
                                    "mlp_multipliers": [1.0, 1.0], "key_multiplier": 1.0,
                                    "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0,
                                    "ssm_multipliers": [1.0] * 5, "ssm_in_multiplier": 1.0,
                                    "ssm_out_multiplier": 1.0}),
    # Nemotron-H with MoE layers ("moe" in layers_block_type): llama.cpp's nemotron_h_moe (sigmoid router with a
    # score bias, relu2 experts without a gate, a shared expert); to_gguf reads such a config as this record
    _arch("nemotron_h_moe",
         (CTX, EMB, BLK, HEAD, KV, _ln("layer_norm_epsilon"), _p("ssm.conv_kernel", "conv_kernel"),
          _p("ssm.state_size", "ssm_state_size"), _p("ssm.group_count", "n_groups"),
          _p("ssm.inner_size", "mamba_num_heads", "mamba_head_dim", kind="prod"),
          _p("ssm.time_step_rank", "mamba_num_heads"), _p("expert_count", "n_routed_experts"), _MOE[1],
          _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_feed_forward_length", "moe_shared_expert_intermediate_size"),
          _p("expert_shared_count", "n_shared_experts"), _p("expert_weights_norm", "norm_topk_prob", kind="bool"),
          _p("expert_weights_scale", "routed_scaling_factor", kind="f32"), _p("expert_group_count", "n_group")),
         ssm=2, hybrid="layers_block_type", pad_vocab=8, experts="mixer.experts", hf_prefer=("backbone.",)),
    # Jamba: Mamba (1) layers with RMS norms on dt, B and C, attention without RoPE every attn_layer_period-th
    # layer, per-expert MoE every expert_layer_period-th layer (dense MLP elsewhere); llama.cpp's conversion/jamba.py
    _arch("jamba",
         (*_LLAMA_LIKE, _p("expert_count", "num_experts", "num_local_experts"), _MOE[1],
          _p("ssm.conv_kernel", "mamba_d_conv"), _p("ssm.inner_size", "mamba_expand", "hidden_size", kind="prod"),
          _p("ssm.state_size", "mamba_d_state"), _p("ssm.time_step_rank", "mamba_dt_rank")),
         ssm=1, hybrid="attn_layer_period", experts="feed_forward.experts", hf_prefer=(".feed_forward.",)),
)
_RECORDS += (  # LFM2 (Liquid AI): short-convolution and attention layers (llama.cpp's conversion/lfm2.py)
    _arch("lfm2",
         (CTX, EMB, BLK, HEAD, KV, _p("attention.layer_norm_rms_epsilon", "norm_eps", "rms_norm_eps", kind="f32"),
          _p("shortconv.l_cache", "conv_L_cache")), tied=True, hybrid="layer_types", shortconv=True,
         hf_prefer=("feed_forward.",), requires={"conv_bias": False}),  # llama.cpp's lfm2 graph has no conv biases
)
_RECORDS += (  # gemma4
    # Gemma 4 (dense, E2B-style per-layer embeddings, MoE): no norm shift, attention scale 1, full layers with
    # their own head dim / kv heads and a "proportional" RoPE (llama.cpp: the rope_freqs tensor), the per-layer
    # output scalar; the rest in its hooks (`adapters/gemma4.py`)
    _arch("gemma4_text", _LLAMA_LIKE, tied=True, window_always=True, no_vocab=True,
         swa_period=0, late=_SOFTCAP[:1], hf_prefer=(".router.proj.", *_QK_NORM),
         hf_extra={"hidden_activation": "gelu_pytorch_tanh"}, hooks=_hooks.GEMMA4),
)
_RECORDS += (  # lfm2: LFM2-MoE (llama.cpp's conversion/lfm2.py LFM2MoeModel): LFM2's conv / attention layers, dense
    # lead layers, then per-expert w1/w2/w3 stacked under a sigmoid router with a selection bias (expert_bias);
    # llama.cpp's graph always renormalizes the top-k weights and applies no routed scale
    _arch("lfm2_moe",
         (CTX, EMB, BLK, HEAD, KV, _p("attention.layer_norm_rms_epsilon", "norm_eps", "rms_norm_eps", kind="f32"),
          _p("shortconv.l_cache", "conv_L_cache"), *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("leading_dense_block_count", "num_dense_layers")), tied=True, hybrid="layer_types", shortconv=True,
         experts="feed_forward.experts", expert_names=("w1", "w2", "w3"), hf_prefer=("feed_forward.",),
         gguf_fixed={"expert_gating_func": 2},  # sigmoid
         requires={"conv_bias": False, "use_expert_bias": True, "norm_topk_prob": True,
                   "routed_scaling_factor": 1.0}),
    # LFM2's embedding models (Lfm2Model, causal): llama.cpp's lfm2 with a pooling type from modules.json; config.json
    # says model_type lfm2 with architectures Lfm2Model (to_gguf reads it as this record)
    _arch("lfm2_embed",
         (CTX, EMB, BLK, HEAD, KV, _p("attention.layer_norm_rms_epsilon", "norm_eps", "rms_norm_eps", kind="f32"),
          _p("shortconv.l_cache", "conv_L_cache")), tied=True, hybrid="layer_types", shortconv=True, embedding=True,
         hf_prefer=("feed_forward.",), requires={"conv_bias": False}),
)
_GDN = (_p("ssm.conv_kernel", "linear_conv_kernel_dim"), _p("ssm.state_size", "linear_key_head_dim"),
        _p("ssm.group_count", "linear_num_key_heads"), _p("ssm.time_step_rank", "linear_num_value_heads"),
        _p("ssm.inner_size", "linear_value_head_dim", "linear_num_value_heads", kind="prod"))
_RECORDS += (  # qwen hybrids: gated delta-net and gated full attention (llama.cpp's conversion/qwen.py)
    # Qwen3-Next: MoE with a gated shared expert on every layer, zero-centred norms (+1), q_proj holding the gate
    _arch("qwen3_next",
         (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_feed_forward_length", "shared_expert_intermediate_size"), *_GDN),
         norm_shift=1.0, partial_rotary=True, hybrid="layer_types", gdn=True, experts="mlp.experts",
         hf_prefer=(".mlp.gate.", *_QK_NORM)),
    # Qwen3.5: separate in_proj_qkv / z / a / b, value heads tiled for llama.cpp, interleaved M-RoPE (the
    # converter's default sections [11, 11, 10, 0] where the config has none); a dense MLP
    _arch("qwen3_5_text", (*_LLAMA_LIKE, *_GDN), norm_shift=1.0, partial_rotary=True,
         hybrid="layer_types", gdn=True, v_reorder=True, mrope=True, hf_prefer=_QK_NORM),
    # Qwen3.5 MoE: qwen35's layers with Qwen3-Next's MoE (a gated shared expert)
    _arch("qwen3_5_moe_text",
         (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_feed_forward_length", "shared_expert_intermediate_size"), *_GDN),
         norm_shift=1.0, partial_rotary=True, hybrid="layer_types", gdn=True, v_reorder=True, mrope=True,
         experts="mlp.experts", hf_prefer=(".mlp.gate.", *_QK_NORM)),
)
ARCHS: dict[str, Arch] = {a.model_type: a for a in _RECORDS}
# multimodal outer configs: the text model inside (Gemma3ForConditionalGeneration, the Qwen VL models)
ALIASES = MODEL_TYPE_ALIASES
GGUF_ARCHS = _IDENTITY_GGUF_ARCHS
# one record per identity row: tests/adapters/test_arch_identity.py::test_one_record_per_identity_row


def arch_for_model_type(model_type: Any) -> Arch:
    """The record for a Hugging Face `model_type`; UnsupportedArchitectureError naming the nearest ones."""
    row = _identity_for_model_type(model_type)
    if row is not None:
        return ARCHS[row.model_type]
    raise unknown_architecture("Hugging Face model_type", model_type, sorted(ARCHS))


def arch_for_gguf(arch: Any, md: Mapping[str, Any] | None = None) -> Arch:
    """The record a GGUF file of architecture `arch` is, its metadata `md` choosing among the records one
    architecture holds (`formats.arch_identity.identity_for_gguf`: llama with experts is mixtral, olmo2 with a
    sliding window olmo3, deepseek2 by its gating function deepseek_v2 or deepseek_v3, ...)."""
    row = _identity_for_gguf(arch, md)
    if row is not None:
        return ARCHS[row.model_type]
    raise unknown_architecture("GGUF architecture", arch, GGUF_ARCHS)


def unknown_architecture(what: str, value: Any, known: list[str]) -> UnsupportedArchitectureError:
    """The error for an architecture outside `known`, naming the three nearest (difflib) and listing all."""
    near = difflib.get_close_matches(str(value), known, n=3, cutoff=0.0)
    return UnsupportedArchitectureError(
        f"{what} {value!r} is not supported; nearest supported: {', '.join(near)} (all: {', '.join(known)})")
