"""Who an architecture is, in one table: its GGUF name, its Hugging Face model_type(s) and classes.

One row per family lazyweights converts (the records in `lazyweights.adapters.archs` take their identity from
here, `GGUFConfig` and the exporters read it through the functions below), so a GGUF file, its `GGUFConfig` and
the config.json an export writes can never name a family differently. A row holds

- `model_type`: the family's key: config.json's `model_type`, or lazyweights' name for a part of one (the text
  model of a VL config, `qwen2_vl_text`; a variant its config marks otherwise, `nemotron_h_moe`);
- `gguf`: llama.cpp's `general.architecture` (a value of gguf-py's `MODEL_ARCH_NAMES`);
- `hf_classes`: the class config.json's `architectures` names first, then the other classes whose configs read
  as this family (the multimodal outer class of an `aliases` model_type);
- `aliases`: other config.json model_types read as this family (`gemma3` -> `gemma3_text`);
- `tokenizer`: the SentencePiece dialect llama.cpp gives the family's "llama" tokenizer (`gemma`: spaces as
  "▁", no pre-tokenizer; `phi3`: a "▁" prefix), "" for the plain one; the tokenizer model itself
  (`tokenizer.ggml.model`) is the checkpoint's own, read from tokenizer.json;
- `hf_model_type`: the model_type config.json says where it is not the key (`nemotron_h_moe` -> `nemotron_h`);
- `back_as`: GGUF -> HF writes this family instead (a VL model's text part as its text model);
- `when`: how a GGUF file of an architecture several families share picks this row: `{}` the architecture's
  default (the first row of it), conditions on its `{arch}.*` keys (all must hold; `PRESENT`, `ABSENT`,
  `NONZERO`, `ZERO` (absent or 0), or a value the key equals), or None: never picked (its files read back as
  another family: Mistral's llama GGUF as llama);
- `config_when`: how a config.json that names another family's model_type picks this row, as llama.cpp's
  converter tells them apart: alternatives, each a mapping of config keys that must all hold (a value the key
  equals, `PRESENT`: set and not empty, or `Contains(x)`: a list or string holding x).

Adding an architecture: a row here (its GGUF name as gguf-py spells it), then its record in `adapters/archs.py`.

Example:
    >>> from lazyweights.formats.arch_identity import identity_for_gguf, identity_for_model_type
    >>> identity_for_model_type("gpt_bigcode").gguf, identity_for_model_type("gemma3").model_type
    ('starcoder', 'gemma3_text')
    >>> identity_for_gguf("llama", {"llama.expert_count": 8}).model_type
    'mixtral'
    >>> back = identity_for_gguf("qwen2vl", {}).read_back()
    >>> back.config_model_type, back.hf_class
    ('qwen2', 'Qwen2ForCausalLM')
    >>> identity_for_config({"model_type": "lfm2", "architectures": ["Lfm2Model"]}).model_type
    'lfm2_embed'
"""
from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple

from ..core.config_access import config_get
from .gguf_keys import arch_key


class Has(enum.Enum):
    """A condition in a row's `when` on one GGUF key: there, not there, above 0, absent or 0."""

    PRESENT = "present"
    ABSENT = "absent"
    NONZERO = "nonzero"
    ZERO = "zero"


PRESENT, ABSENT, NONZERO, ZERO = Has.PRESENT, Has.ABSENT, Has.NONZERO, Has.ZERO


class Contains(NamedTuple):
    """A `config_when` condition: the config value (a list or a string) holds `item`."""

    item: str
_DEFAULT: Mapping[str, Any] = MappingProxyType({})


class ArchIdentity(NamedTuple):
    """One family's identity (the module docstring says what each field holds)."""

    model_type: str
    gguf: str
    hf_classes: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    tokenizer: str = ""
    hf_model_type: str = ""
    back_as: str = ""
    when: Mapping[str, Any] | None = _DEFAULT
    config_when: tuple[Mapping[str, Any], ...] = ()

    @property
    def hf_class(self) -> str:
        """The class config.json's `architectures` names for this family.

        >>> identity_for_model_type("gpt2").hf_class
        'GPT2LMHeadModel'
        """
        return self.hf_classes[0]

    @property
    def config_model_type(self) -> str:
        """The model_type config.json says for this family (`hf_model_type`, else the key).

        >>> identity_for_model_type("nemotron_h_moe").config_model_type
        'nemotron_h'
        """
        return self.hf_model_type or self.model_type

    def read_back(self) -> ArchIdentity:
        """The family a GGUF file picked as this one converts back to (`back_as`, else itself).

        >>> identity_for_model_type("qwen3_vl_text").read_back().model_type
        'qwen3'
        """
        return IDENTITIES[self.back_as] if self.back_as else self

    def picks(self, arch: str, metadata: Mapping[str, Any]) -> bool:
        """Whether GGUF `metadata` of architecture `arch` meets every condition of `when` (False for None).

        >>> identity_for_model_type("mixtral").picks("llama", {"llama.expert_count": 8})
        True
        """
        if self.when is None:
            return False
        return all(_holds(metadata, arch_key(arch, key), want) for key, want in self.when.items())


    def picks_config(self, config: Any) -> bool:
        """Whether a config.json (a dict or a config object) meets one of the `config_when` alternatives.

        >>> identity_for_model_type("nemotron_h_moe").picks_config({"model_type": "nemotron_h",
        ...                                                         "hybrid_override_pattern": "M*E"})
        True
        """
        return any(all(_config_holds(config_get(config, key), want) for key, want in alt.items())
                   for alt in self.config_when)


def _config_holds(value: Any, want: Any) -> bool:
    if want is PRESENT:
        return value is not None and value != [] and value != {} and value != ""
    if isinstance(want, Contains):
        return isinstance(value, (list, tuple, str)) and want.item in value
    return value == want


def _holds(md: Mapping[str, Any], key: str, want: Any) -> bool:
    if want is PRESENT:
        return key in md
    if want is ABSENT:
        return key not in md
    if want is NONZERO or want is ZERO:
        return (int(md.get(key, 0) or 0) > 0) == (want is NONZERO)
    return key in md and type(want)(md[key]) == want


def _i(model_type: str, gguf: str, hf_classes: tuple[str, ...], **fields: Any) -> ArchIdentity:
    return ArchIdentity(model_type, gguf, hf_classes, **fields)


# Rows in the order arch_for_gguf has always tried them: the first row of a GGUF architecture is its default.
_ROWS: tuple[ArchIdentity, ...] = (
    _i("llama", "llama", ("LlamaForCausalLM",)),
    _i("mistral", "llama", ("MistralForCausalLM", "Mistral3ForConditionalGeneration"), aliases=("mistral3",),
       when=None),
    _i("mixtral", "llama", ("MixtralForCausalLM",), when={"expert_count": NONZERO}),
    _i("qwen2", "qwen2", ("Qwen2ForCausalLM",)),
    _i("qwen3", "qwen3", ("Qwen3ForCausalLM",)),
    _i("qwen2_moe", "qwen2moe", ("Qwen2MoeForCausalLM",)),
    _i("qwen3_moe", "qwen3moe", ("Qwen3MoeForCausalLM",)),
    _i("gemma2", "gemma2", ("Gemma2ForCausalLM",), tokenizer="gemma"),
    _i("gemma3_text", "gemma3", ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"), aliases=("gemma3",),
       tokenizer="gemma"),
    _i("phi3", "phi3", ("Phi3ForCausalLM",), tokenizer="phi3"),
    _i("gemma", "gemma", ("GemmaForCausalLM",), tokenizer="gemma"),
    _i("granite", "granite", ("GraniteForCausalLM",)),
    _i("granitemoe", "granitemoe", ("GraniteMoeForCausalLM",)),
    _i("olmo", "olmo", ("OlmoForCausalLM",)),
    _i("olmo2", "olmo2", ("Olmo2ForCausalLM",)),
    _i("starcoder2", "starcoder2", ("Starcoder2ForCausalLM",)),
    _i("stablelm", "stablelm", ("StableLmForCausalLM",)),
    _i("phi", "phi2", ("PhiForCausalLM",)),
    _i("gpt2", "gpt2", ("GPT2LMHeadModel",)),
    _i("gpt_neox", "gptneox", ("GPTNeoXForCausalLM",)),
    _i("falcon", "falcon", ("FalconForCausalLM",)),
    _i("gpt_bigcode", "starcoder", ("GPTBigCodeForCausalLM",)),
    _i("bloom", "bloom", ("BloomForCausalLM",)),
    _i("nemotron", "nemotron", ("NemotronForCausalLM",)),
    _i("seed_oss", "seed_oss", ("SeedOssForCausalLM",)),
    _i("arcee", "arcee", ("ArceeForCausalLM",)),
    _i("olmoe", "olmoe", ("OlmoeForCausalLM",)),
    _i("olmo3", "olmo2", ("Olmo3ForCausalLM",), when={"attention.sliding_window": PRESENT}),
    _i("glm4", "glm4", ("Glm4ForCausalLM",)),
    _i("hunyuan_v1_dense", "hunyuan-dense", ("HunYuanDenseV1ForCausalLM",)),
    _i("ernie4_5", "ernie4_5", ("Ernie4_5ForCausalLM",)),
    _i("smollm3", "smollm3", ("SmolLM3ForCausalLM",)),
    _i("cohere2", "cohere2", ("Cohere2ForCausalLM",)),
    _i("mpt", "mpt", ("MptForCausalLM",)),
    _i("cohere", "command-r", ("CohereForCausalLM",)),
    _i("exaone", "exaone", ("ExaoneForCausalLM",)),
    _i("dots1", "dots1", ("Dots1ForCausalLM",)),
    _i("glm4_moe", "glm4moe", ("Glm4MoeForCausalLM",)),
    _i("ernie4_5_moe", "ernie4_5-moe", ("Ernie4_5_MoeForCausalLM",)),
    _i("hunyuan_v1_moe", "hunyuan-moe", ("HunYuanMoEV1ForCausalLM",)),
    _i("deepseek_v2", "deepseek2", ("DeepseekV2ForCausalLM",)),  # softmax gating (expert_gating_func 1)
    _i("deepseek_v3", "deepseek2", ("DeepseekV3ForCausalLM",), when={"expert_gating_func": 2}),  # sigmoid
    _i("qwen2_vl_text", "qwen2vl", ("Qwen2VLForConditionalGeneration",), aliases=("qwen2_vl",), back_as="qwen2"),
    _i("qwen2_5_vl_text", "qwen2vl", ("Qwen2_5_VLForConditionalGeneration",), aliases=("qwen2_5_vl",),
       back_as="qwen2", when=None),
    _i("qwen3_vl_text", "qwen3vl", ("Qwen3VLForConditionalGeneration",), aliases=("qwen3_vl",), back_as="qwen3"),
    _i("qwen3_vl_moe_text", "qwen3vlmoe", ("Qwen3VLMoeForConditionalGeneration",), aliases=("qwen3_vl_moe",),
       back_as="qwen3_moe"),
    _i("exaone4", "exaone4", ("Exaone4ForCausalLM",)),
    _i("bert", "bert", ("BertModel",)),
    _i("internlm3", "llama", ("InternLM3ForCausalLM",), when=None),
    _i("glm", "chatglm", ("GlmForCausalLM",)),
    _i("granitemoeshared", "granitemoe", ("GraniteMoeSharedForCausalLM",),
       when={"expert_shared_feed_forward_length": PRESENT}),
    _i("exaone_moe", "exaone-moe", ("ExaoneMoeForCausalLM",)),
    _i("glm4_moe_lite", "deepseek2", ("Glm4MoeLiteForCausalLM",), when=None),  # back as deepseek_v3
    _i("solar_open", "glm4moe", ("SolarOpenForCausalLM",), when=None),  # back as glm4_moe
    _i("afmoe", "afmoe", ("AfmoeForCausalLM",)),
    _i("minimax_m2", "minimax-m2", ("MiniMaxM2ForCausalLM",)),
    _i("apertus", "apertus", ("ApertusForCausalLM",)),
    _i("minicpm3", "minicpm3", ("MiniCPM3ForCausalLM",)),
    _i("dbrx", "dbrx", ("DbrxForCausalLM",)),
    _i("llama4_text", "llama4", ("Llama4ForCausalLM",)),
    _i("nomic_bert", "nomic-bert", ("NomicBertModel",)),
    _i("roberta", "bert", ("RobertaModel",), when=None),
    _i("xlm-roberta", "bert", ("XLMRobertaModel",), when=None),
    _i("distilbert", "bert", ("DistilBertModel",), when=None),
    _i("modernbert", "modern-bert", ("ModernBertModel",)),
    _i("eurobert", "eurobert", ("EuroBertModel",)),
    # jina-embeddings-v3's remote-code config says xlm-roberta; llama.cpp's converter: jina-bert-v3 when it lists
    # LoRA tasks
    _i("jina_embeddings_v3", "jina-bert-v3", ("JinaEmbeddingsV3Model",),
       config_when=({"model_type": "xlm-roberta", "lora_adaptations": PRESENT},)),
    _i("gpt_oss", "gpt-oss", ("GptOssForCausalLM",)),
    _i("mamba", "mamba", ("MambaForCausalLM",)),
    _i("falcon_mamba", "mamba", ("FalconMambaForCausalLM",), when={"ssm.dt_b_c_rms": True}),
    _i("mamba2", "mamba2", ("Mamba2ForCausalLM",)),
    _i("granitemoehybrid", "granitehybrid", ("GraniteMoeHybridForCausalLM",)),
    _i("bamba", "granitehybrid", ("BambaForCausalLM",), when={"expert_count": ZERO, "embedding_scale": ABSENT}),
    _i("nemotron_h", "nemotron_h", ("NemotronHForCausalLM",)),
    _i("falcon_h1", "falcon-h1", ("FalconH1ForCausalLM",)),
    # llama.cpp's converter: nemotron_h_moe for a Nemotron-H config with MoE layers
    _i("nemotron_h_moe", "nemotron_h_moe", ("NemotronHForCausalLM",), hf_model_type="nemotron_h",
       config_when=({"model_type": "nemotron_h", "layers_block_type": Contains("moe")},
                    {"model_type": "nemotron_h", "hybrid_override_pattern": Contains("E")})),
    _i("jamba", "jamba", ("JambaForCausalLM",)),
    _i("lfm2", "lfm2", ("Lfm2ForCausalLM",)),
    _i("gemma4_text", "gemma4", ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"), aliases=("gemma4",)),
    _i("lfm2_moe", "lfm2moe", ("Lfm2MoeForCausalLM",)),
    # LFM2's embedding models (llama.cpp's LFM2ColBertModel): an lfm2 config whose class is Lfm2Model
    _i("lfm2_embed", "lfm2", ("Lfm2Model",), hf_model_type="lfm2", when={"pooling_type": PRESENT},
       config_when=({"model_type": "lfm2", "architectures": Contains("Lfm2Model")},)),
    _i("qwen3_next", "qwen3next", ("Qwen3NextForCausalLM",)),
    _i("qwen3_5_text", "qwen35", ("Qwen3_5ForCausalLM",)),
    _i("qwen3_5_moe_text", "qwen35moe", ("Qwen3_5MoeForCausalLM",)),
)

IDENTITIES: dict[str, ArchIdentity] = {row.model_type: row for row in _ROWS}
# config.json model_types read as another row's (multimodal outer configs: the text model inside)
MODEL_TYPE_ALIASES: dict[str, str] = {alias: row.model_type for row in _ROWS for alias in row.aliases}
GGUF_ARCHS: list[str] = sorted({row.gguf for row in _ROWS})
_CONFIG_PICKED = tuple(row for row in _ROWS if row.config_when)
# GGUF architectures no row converts that GGUFConfig still names (llama.cpp's mistral3: a Mistral text model)
GGUF_READ_AS: dict[str, str] = {"mistral3": "mistral"}


def identity_for_model_type(model_type: Any) -> ArchIdentity | None:
    """The row for a config.json `model_type` (an alias resolved), None when no row has it.

    >>> identity_for_model_type("qwen2_5_vl").model_type
    'qwen2_5_vl_text'
    """
    if not isinstance(model_type, str):
        return None
    return IDENTITIES.get(MODEL_TYPE_ALIASES.get(model_type, model_type))


def identity_for_config(config: Any) -> ArchIdentity | None:
    """The row a config.json (a dict or a config object) is: a row whose `config_when` it meets, else the row of
    its `model_type` (`identity_for_model_type`); None when no row has it.

    >>> identity_for_config({"model_type": "xlm-roberta", "lora_adaptations": ["query"]}).model_type
    'jina_embeddings_v3'
    >>> identity_for_config({"model_type": "xlm-roberta"}).model_type
    'xlm-roberta'
    """
    picked = next((row for row in _CONFIG_PICKED if row.picks_config(config)), None)
    return picked or identity_for_model_type(config_get(config, "model_type"))


def identity_for_gguf(arch: Any, metadata: Mapping[str, Any] | None = None) -> ArchIdentity | None:
    """The row a GGUF file of architecture `arch` is: the first row of `arch` whose `when` the metadata meets,
    else the architecture's default (its first row, also without metadata); None when no row has `arch`.

    >>> identity_for_gguf("deepseek2", {"deepseek2.expert_gating_func": 2}).model_type
    'deepseek_v3'
    >>> identity_for_gguf("deepseek2").model_type, identity_for_gguf("gguf-arch-nobody-has") is None
    ('deepseek_v2', True)
    """
    rows = [r for r in _ROWS if r.gguf == arch and r.when is not None]
    if not rows:
        return None
    if metadata is not None:
        for row in rows[1:]:
            if row.picks(arch, metadata):
                return row
    return rows[0]


def config_identity(arch: Any, metadata: Mapping[str, Any] | None = None) -> ArchIdentity | None:
    """The row whose config.json a GGUF file of `arch` converts back to (`identity_for_gguf`, then `back_as`;
    `GGUF_READ_AS` for an architecture no row converts), None when the architecture is unknown.

    >>> config_identity("qwen2moe").config_model_type, config_identity("mistral3").hf_class
    ('qwen2_moe', 'MistralForCausalLM')
    """
    row = identity_for_gguf(arch, metadata)
    if row is None and isinstance(arch, str) and arch in GGUF_READ_AS:
        row = IDENTITIES[GGUF_READ_AS[arch]]
    return None if row is None else row.read_back()
