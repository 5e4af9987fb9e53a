"""One small declarative record per architecture: what lazyweights must know beyond gguf-py's name tables.

Tensor names come from gguf-py (`lazyweights.adapters.names`); a record says only

- which Hugging Face `model_type` / class it is and which llama.cpp architecture (`gguf`) it becomes;
- the hyperparameters: `HParam(gguf key, config.json names (current first, then legacy aliases), kind)`;
- the value transforms llama.cpp's converter applies (`lazyweights.adapters.transforms`): the q/k RoPE row
  permutation, norms stored as `w + norm_shift`, Conv1D weights stored transposed, fused qkv rows regrouped
  from `[groups, q_per_group + 2, head_dim]` to `[q; k; v]`;
- Hugging Face tensors llama.cpp has no use for (`dropped`), and the config.json entries the family fixes
  when converting back (`hf_extra`).

Adding an architecture is a record here and a line in the test's table. Three of the first ten families
(gemma2, gemma3, phi3) keep their hand-checked hyperparameter code in `hf_export` both ways (Gemma 2/3 layer
types and attention scale, Phi-3's LongRoPE context); llama, mistral and mixtral write their GGUF keys from
their rows, and a llama GGUF converts back through hand-checked code (`legacy`: Llama 3 RoPE factors from
the `rope_freqs` tensor); their tensor names come from gguf-py like every other family's.

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


class HParam(NamedTuple):
    """One GGUF hyperparameter: `{arch}.{key}` <-> the first of `hf` found in config.json (`hf[0]` is written
    back). `kind`: u32, f32, bool, or `prod`: a u32 that is the product of every name in `hf` (all present),
    derived one way only (its factors are rows of their own)."""

    key: str
    hf: tuple[str, ...]
    kind: str = "u32"


def _p(key: str, *hf: str, kind: str = "u32") -> HParam:
    return HParam(key, hf, kind)


class Arch(NamedTuple):
    """One architecture's record: its Hugging Face model_type and class, the llama.cpp architecture it becomes,
    its hyperparameter rows and the value transforms llama.cpp's converter applies (one comment per field)."""

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
    legacy: bool = False                # config.json back from a GGUF by hf_export's hand-checked code (and,
                                        # with no hparams rows, the GGUF keys too)
    embedding: bool = False             # encoder (llama.cpp embedding GGUF)
    gguf_fixed: Mapping[str, Any] = {}  # GGUF keys llama.cpp needs that the config does not hold
    hf_prefer: tuple[str, ...] = ()     # GGUF -> HF without transformers: gguf-py candidates holding these win
    sliding: bool = False               # sliding-window layers: window + per-layer pattern from layer_types
    fused_gate_up_exps: str = ""        # HF stacked-expert tensor holding [gate; up] rows, split for llama.cpp
    experts: str = ""                   # HF per-expert prefix in a layer ("mlp.experts"), stacked for llama.cpp
    mrope: bool = False                 # M-RoPE: rope.dimension_sections from rope_parameters.mrope_section
    window_flag: str = ""               # config flag saying the sliding_window applies (Qwen: use_sliding_window)
    back_as: str = ""                   # GGUF -> HF as this record's model (a VL model's text part alone)
    mla: bool = False                   # DeepSeek's multi-head latent attention: kv_b_proj split into k_b / v_b
    head_dims: bool = False             # key_length/value_length always, after rope.freq_base (LlamaModel)
    window_always: bool = False         # attention.sliding_window whenever the config sets one (no flag)
    tail: tuple[HParam, ...] = ()       # required rows written after the RoPE keys (Mixtral's expert counts)
    oai_experts: str = ""               # gpt-oss's fused experts under this prefix: gate_up_proj [E, in, 2 * ff]
                                        # (gate/up interleaved), down_proj [E, ff, out], their biases, or the
                                        # MXFP4 `*_blocks`/`*_scales` kept packed; `self_attn.sinks` too
    yarn_truncate: bool | None = None   # config.json's rope_parameters.truncate back from a GGUF (gpt-oss: False)


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
    # the first ten families: tensor names from gguf-py, hyperparameters from hf_export
    # llama, Mistral, Mixtral: HF -> GGUF from the rows; a llama GGUF converts back through hand-checked code
    # (Llama 3 RoPE factors from the rope_freqs tensor, the bias flags)
    Arch("llama", "llama", "LlamaForCausalLM", _LLAMA_LIKE, rope_permute=True, legacy=True, head_dims=True,
         window_always=True),
    Arch("mistral", "llama", "MistralForCausalLM", _LLAMA_LIKE, rope_permute=True, legacy=True, head_dims=True,
         window_always=True),
    Arch("mixtral", "llama", "MixtralForCausalLM", _LLAMA_LIKE, rope_permute=True, legacy=True, head_dims=True,
         window_always=True, tail=(_p("expert_count", "num_local_experts", "num_experts"), _MOE[1])),
    # Qwen: the window only where use_sliding_window says so; MoE expert sizes; Qwen3 MoE always renormalizes
    Arch("qwen2", "qwen2", "Qwen2ForCausalLM", _LLAMA_LIKE, window_flag="use_sliding_window"),
    Arch("qwen3", "qwen3", "Qwen3ForCausalLM", _LLAMA_LIKE, window_flag="use_sliding_window", hf_prefer=_QK_NORM),
    Arch("qwen2_moe", "qwen2moe", "Qwen2MoeForCausalLM",
         (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_feed_forward_length", "shared_expert_intermediate_size")),
         window_flag="use_sliding_window", hf_prefer=(".mlp.gate.",)),
    Arch("qwen3_moe", "qwen3moe", "Qwen3MoeForCausalLM",
         (*_LLAMA_LIKE, *_MOE, _p("expert_feed_forward_length", "moe_intermediate_size")),
         window_flag="use_sliding_window", hf_prefer=(".mlp.gate.", *_QK_NORM),
         hf_extra={"norm_topk_prob": True}),  # llama.cpp's qwen3moe graph always renormalizes the top-k weights
    Arch("gemma2", "gemma2", "Gemma2ForCausalLM", norm_shift=1.0, tied=True, legacy=True),
    Arch("gemma3_text", "gemma3", "Gemma3ForCausalLM", norm_shift=1.0, tied=True, legacy=True, hf_prefer=_QK_NORM),
    Arch("phi3", "phi3", "Phi3ForCausalLM", legacy=True, hf_prefer=(".gate_up_proj.", ".qkv_proj.")),
    # record-driven families
    Arch("gemma", "gemma", "GemmaForCausalLM", (*_LLAMA_LIKE, _p("attention.key_length", "head_dim"),
         _p("attention.value_length", "head_dim")), norm_shift=1.0, tied=True,
         hf_extra={"hidden_act": "gelu_pytorch_tanh"}),
    Arch("granite", "granite", "GraniteForCausalLM",
         (*_LLAMA_LIKE, _p("embedding_scale", "embedding_multiplier", kind="f32"),
          _p("residual_scale", "residual_multiplier", kind="f32"),
          _p("attention.scale", "attention_multiplier", kind="f32"),
          _p("logit_scale", "logits_scaling", kind="f32")), rope_permute=True),
    Arch("granitemoe", "granitemoe", "GraniteMoeForCausalLM",
         (*_LLAMA_LIKE, _p("expert_count", "num_local_experts", "num_experts"), _MOE[1],
          _p("embedding_scale", "embedding_multiplier", kind="f32"),
          _p("residual_scale", "residual_multiplier", kind="f32"),
          _p("attention.scale", "attention_multiplier", kind="f32"),
          _p("logit_scale", "logits_scaling", kind="f32")), rope_permute=True,
         fused_gate_up_exps="block_sparse_moe.input_linear", hf_prefer=(".output_linear.", ".router.layer.")),
    Arch("olmo", "olmo", "OlmoForCausalLM", (*BASE, KV), rope_permute=True,
         gguf_fixed={"attention.layer_norm_epsilon": 1e-5}),  # OLMo's LayerNorm has no eps in its config
    Arch("olmo2", "olmo2", "Olmo2ForCausalLM", _LLAMA_LIKE),
    Arch("starcoder2", "starcoder2", "Starcoder2ForCausalLM", (*BASE, KV, _ln("norm_epsilon")), tied=True,
         hf_extra={"hidden_act": "gelu_pytorch_tanh", "use_bias": True}),
    Arch("stablelm", "stablelm", "StableLmForCausalLM", (*BASE, KV, _ln("layer_norm_eps")), partial_rotary=True,
         hf_extra={"hidden_act": "silu", "use_parallel_residual": False}),
    Arch("phi", "phi2", "PhiForCausalLM", (*BASE, KV, _ln("layer_norm_eps")), partial_rotary=True,
         hf_extra={"hidden_act": "gelu_new"}),
    Arch("gpt2", "gpt2", "GPT2LMHeadModel",
         (_p("context_length", "n_positions", "max_position_embeddings", "n_ctx"),
          _p("embedding_length", "n_embd", "hidden_size"), _p("block_count", "n_layer", "num_hidden_layers"),
          _p("feed_forward_length", "n_inner", "intermediate_size"),
          _p("attention.head_count", "n_head", "num_attention_heads"), _ln("layer_norm_epsilon")),
         transposed=("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"),
         ffn_mult=4, dropped=("attn.bias", "attn.masked_bias"), tied=True,
         hf_extra={"activation_function": "gelu_new"}),
    Arch("gpt_neox", "gptneox", "GPTNeoXForCausalLM", (*BASE, _ln("layer_norm_eps"),
         _p("use_parallel_residual", "use_parallel_residual", kind="bool")), partial_rotary=True,
         qkv_groups="heads", dropped=("attention.bias", "attention.masked_bias"), hf_extra={"hidden_act": "gelu"}),
    Arch("falcon", "falcon", "FalconForCausalLM", (CTX, EMB, BLK, _p("feed_forward_length", "ffn_hidden_size"),
         HEAD, _p("attention.head_count_kv", "num_kv_heads", "n_head_kv"), _ln("layer_norm_epsilon")),
         qkv_groups="kv", ffn_mult=4, tied=True,
         hf_extra={"new_decoder_architecture": True, "parallel_attn": True, "bias": False, "alibi": False,
                   "activation": "gelu"}),
    Arch("gpt_bigcode", "starcoder", "GPTBigCodeForCausalLM",
         (_p("context_length", "n_positions", "max_position_embeddings"),
          _p("embedding_length", "n_embd", "hidden_size"),
          _p("block_count", "n_layer", "num_hidden_layers"), _p("feed_forward_length", "n_inner", "intermediate_size"),
          _p("attention.head_count", "n_head", "num_attention_heads"), KV, _ln("layer_norm_epsilon")),
         ffn_mult=4, tied=True, hf_extra={"activation_function": "gelu_pytorch_tanh"}),
    Arch("bloom", "bloom", "BloomForCausalLM",
         (_p("context_length", "seq_length", "max_position_embeddings"),
          _p("embedding_length", "hidden_size", "n_embed"),
          _p("block_count", "n_layer", "num_hidden_layers"), FFN, _p("attention.head_count", "n_head",
          "num_attention_heads"), KV, _ln("layer_norm_epsilon")),
         qkv_groups="heads", ffn_mult=4, tied=True, gguf_fixed={"context_length": 2048}),
    Arch("nemotron", "nemotron", "NemotronForCausalLM", (*BASE, KV, _ln("norm_eps")), norm_shift=1.0,
         partial_rotary=True, hf_extra={"hidden_act": "relu2"}),
    Arch("seed_oss", "seed_oss", "SeedOssForCausalLM", _LLAMA_LIKE, hf_extra={"attention_out_bias": False}),
    Arch("arcee", "arcee", "ArceeForCausalLM", _LLAMA_LIKE, rope_permute=True, hf_extra={"hidden_act": "relu2"}),
    Arch("olmoe", "olmoe", "OlmoeForCausalLM", (*_LLAMA_LIKE, *_MOE), ),
    Arch("olmo3", "olmo2", "Olmo3ForCausalLM", _LLAMA_LIKE, sliding=True),
    Arch("glm4", "glm4", "Glm4ForCausalLM", _LLAMA_LIKE, partial_rotary=True),
    Arch("hunyuan_v1_dense", "hunyuan-dense", "HunYuanDenseV1ForCausalLM", _LLAMA_LIKE),
    Arch("ernie4_5", "ernie4_5", "Ernie4_5ForCausalLM", _LLAMA_LIKE),
    Arch("smollm3", "smollm3", "SmolLM3ForCausalLM", _LLAMA_LIKE, rope_permute=True),
    Arch("cohere2", "cohere2", "Cohere2ForCausalLM", (*BASE, KV, _ln("layer_norm_eps"),
         _p("logit_scale", "logit_scale", kind="f32")), partial_rotary=True, tied=True, sliding=True),
    Arch("mpt", "mpt", "MptForCausalLM",
         (_p("context_length", "max_seq_len"), _p("embedding_length", "d_model"), _p("block_count", "n_layers"),
          _p("attention.head_count", "n_heads"), _ln("layer_norm_epsilon")), ffn_mult=4,
         gguf_fixed={"attention.max_alibi_bias": 8.0}, tied=True),
    Arch("cohere", "command-r", "CohereForCausalLM", (*BASE, KV, _ln("layer_norm_eps"),
         _p("logit_scale", "logit_scale", kind="f32")), tied=True, hf_extra={"hidden_act": "silu"}),
    Arch("exaone", "exaone", "ExaoneForCausalLM", _LLAMA_LIKE, partial_rotary=True),
    Arch("dots1", "dots1", "Dots1ForCausalLM", (*_LLAMA_LIKE, *_DS_MOE), experts="mlp.experts",
         hf_prefer=(".mlp.gate.", *_QK_NORM), gguf_fixed={"expert_gating_func": 2}),  # sigmoid
    Arch("glm4_moe", "glm4moe", "Glm4MoeForCausalLM", (*_LLAMA_LIKE, *_DS_MOE), partial_rotary=True,
         experts="mlp.experts", hf_prefer=(".mlp.gate.", *_QK_NORM), gguf_fixed={"expert_gating_func": 2}),
    Arch("ernie4_5_moe", "ernie4_5-moe", "Ernie4_5_MoeForCausalLM",
         (*_LLAMA_LIKE, _p("expert_count", "moe_num_experts"), _p("expert_used_count", "moe_k"),
          _p("interleave_moe_layer_step", "moe_layer_interval"),
          _p("leading_dense_block_count", "moe_layer_start_index"),
          _p("expert_feed_forward_length", "moe_intermediate_size"),
          _p("expert_shared_count", "moe_num_shared_experts"),
          _p("expert_shared_feed_forward_length", "moe_intermediate_size", "moe_num_shared_experts", kind="prod")),
         experts="mlp.experts", hf_prefer=(".moe_statics.", ".mlp.gate.")),
    Arch("hunyuan_v1_moe", "hunyuan-moe", "HunYuanMoEV1ForCausalLM",
         (*_LLAMA_LIKE, _p("expert_count", "num_experts", "num_local_experts"), _p("expert_used_count", "moe_topk"),
          _p("expert_feed_forward_length", "moe_intermediate_size", "intermediate_size"),
          _p("expert_shared_count", "num_shared_expert"),
          _p("expert_shared_feed_forward_length", "intermediate_size")),
         experts="mlp.experts", hf_prefer=(".gate.wg.", ".shared_mlp.", "_layernorm.")),
    # MLA: llama.cpp stores it as MQA over the latent (head_count_kv 1, key_length kv_lora_rank + rope dims)
    Arch("deepseek_v2", "deepseek2", "DeepseekV2ForCausalLM", (*BASE, RMS, *_DS_MOE, *_MLA), mla=True,
         experts="mlp.experts", hf_prefer=(".mlp.gate.",), gguf_fixed={"expert_gating_func": 1}),  # softmax
    Arch("deepseek_v3", "deepseek2", "DeepseekV3ForCausalLM", (*BASE, RMS, *_DS_MOE, *_MLA), mla=True,
         experts="mlp.experts", hf_prefer=(".mlp.gate.",), gguf_fixed={"expert_gating_func": 2}),  # sigmoid
    # VL models' text part (the vision tower is llama.cpp's separate mmproj file); GGUF -> HF gives the text model
    # alone as Qwen2, whose plain RoPE is what M-RoPE computes on text (every section at the same position)
    Arch("qwen2_vl_text", "qwen2vl", "Qwen2VLForConditionalGeneration", _LLAMA_LIKE, mrope=True, back_as="qwen2"),
    Arch("qwen2_5_vl_text", "qwen2vl", "Qwen2_5_VLForConditionalGeneration", _LLAMA_LIKE, mrope=True,
         back_as="qwen2"),
    Arch("qwen3_vl_text", "qwen3vl", "Qwen3VLForConditionalGeneration",
         (*_LLAMA_LIKE, _p("n_deepstack_layers", "num_deepstack_layers")), mrope=True, back_as="qwen3",
         hf_prefer=_QK_NORM),
    Arch("exaone4", "exaone4", "Exaone4ForCausalLM", _LLAMA_LIKE, sliding=True, hf_prefer=_QK_NORM),
)
_RECORDS += (
    # encoders: llama.cpp embedding GGUFs, pooling type from the sentence-transformers folder (modules.json)
    Arch("bert", "bert", "BertModel", (CTX, EMB, BLK, FFN, HEAD, _ln("layer_norm_eps")), embedding=True,
         dropped=("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"),
         gguf_fixed={"attention.causal": False}, hf_extra={"hidden_act": "gelu"}),
)
_RECORDS += (  # gpt-oss: MXFP4 experts repacked for ggml (never dequantized), attention sinks, sliding layers
    Arch("gpt_oss", "gpt-oss", "GptOssForCausalLM",
         (*_LLAMA_LIKE, _p("expert_count", "num_local_experts", "num_experts"),
          _p("expert_used_count", "num_experts_per_tok", "experts_per_token"),  # the latter: OpenAI's own name
          _p("expert_feed_forward_length", "intermediate_size")),
         sliding=True, oai_experts="mlp.experts", yarn_truncate=False),
)
ARCHS: dict[str, Arch] = {a.model_type: a for a in _RECORDS}
# multimodal outer configs: the text model inside (Gemma3ForConditionalGeneration, the Qwen VL models)
ALIASES = {"gemma3": "gemma3_text", "qwen2_vl": "qwen2_vl_text", "qwen2_5_vl": "qwen2_5_vl_text",
           "qwen3_vl": "qwen3_vl_text", "mistral3": "mistral"}
GGUF_ARCHS = sorted({a.gguf for a in _RECORDS})


def arch_for_model_type(model_type: Any) -> Arch:
    """The record for a Hugging Face `model_type`; UnsupportedArchitectureError naming the nearest ones."""
    mt = ALIASES.get(model_type, model_type) if isinstance(model_type, str) else model_type
    if isinstance(mt, str) and mt in ARCHS:
        return ARCHS[mt]
    raise unknown_architecture("Hugging Face model_type", model_type, sorted(ARCHS))


def arch_for_gguf(arch: Any, md: Mapping[str, Any] | None = None) -> Arch:
    """The record a GGUF architecture converts back to (llama with experts: mixtral; olmo2 with a sliding
    window: olmo3; deepseek2 by its gating function: softmax deepseek_v2, sigmoid deepseek_v3)."""
    if arch == "llama" and md is not None and int(md.get("llama.expert_count", 0) or 0) > 0:
        return ARCHS["mixtral"]
    matches = [a for a in _RECORDS if a.gguf == arch]
    if len(matches) > 1 and md is not None and f"{arch}.expert_gating_func" in md:  # deepseek2: v2 or v3
        gating = int(md[f"{arch}.expert_gating_func"])
        matches = [a for a in matches if a.gguf_fixed.get("expert_gating_func") == gating] or matches
    if matches and md is not None and f"{arch}.attention.sliding_window" in md:
        matches = [a for a in matches if a.sliding] or matches
    if matches:
        return matches[0]
    raise unknown_architecture("GGUF architecture", arch, GGUF_ARCHS)


def unknown_architecture(what: str, value: Any, known: list[str]) -> UnsupportedArchitectureError:
    """The error for an architecture outside `known`, naming the three nearest (difflib) and listing all."""
    near = difflib.get_close_matches(str(value), known, n=3, cutoff=0.0)
    return UnsupportedArchitectureError(
        f"{what} {value!r} is not supported; nearest supported: {', '.join(near)} (all: {', '.join(known)})")
