"""The built-in architecture classes (`adapters.builtin.BUILTIN`) come from the identity table
(`formats.arch_identity`) and the vision records, and the model_type check each class's adapter makes agrees
with its judges: transformers' auto tables (the model_type transformers pairs with a class is accepted by the
class) and llama.cpp's naming (a GGUF of every record, as `gguf_metadata_from_hf` writes it, is accepted by
every class of the record, including the families llama.cpp writes as another: Mistral as llama, RoBERTa as
bert). Also: the config.json picks (`ArchIdentity.config_when`) that `to_gguf._text_part` uses."""
from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")

from test_arch_identity import _tiny_config  # noqa: E402

from lazyweights.adapters import builtin  # noqa: E402
from lazyweights.adapters.archs import ARCHS  # noqa: E402
from lazyweights.adapters.vision_archs import VISION_ARCHS  # noqa: E402
from lazyweights.convert.to_gguf import _text_part, gguf_metadata_from_hf  # noqa: E402
from lazyweights.core.errors import ConfigError  # noqa: E402
from lazyweights.formats.arch_identity import IDENTITIES, identity_for_config  # noqa: E402
from lazyweights.formats.config import GGUFConfig  # noqa: E402

BUILTIN = builtin.BUILTIN


def _accepts(cls: str, config) -> bool:
    adapter = builtin._checked(cls, lambda state_dict, huggingface_config=None, **kw: "converted")
    try:
        return adapter({}, huggingface_config=config) == "converted"
    except ConfigError:
        return False


def test_every_identity_class_and_vision_class_is_built_in():
    for row in IDENTITIES.values():
        for cls in row.hf_classes:
            assert {row.model_type, row.config_model_type, *row.aliases} == set(BUILTIN[cls]) or \
                len({r.model_type for r in IDENTITIES.values() if cls in r.hf_classes}) > 1, (cls, row)
            assert {row.model_type, row.config_model_type, *row.aliases} <= set(BUILTIN[cls]), (cls, row)
    for vision in VISION_ARCHS.values():
        assert vision.hf_class in BUILTIN, vision.model_type
    # nothing else: every class is a row's or a vision record's
    known = {c for row in IDENTITIES.values() for c in row.hf_classes} | {v.hf_class for v in VISION_ARCHS.values()}
    assert set(BUILTIN) == known


def test_transformers_pairs_are_accepted():
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto import modeling_auto

    pairs = set()
    for name, table in vars(modeling_auto).items():
        if name.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            for mt, classes in table.items():
                for cls in (classes,) if isinstance(classes, str) else classes:
                    if cls in BUILTIN:
                        pairs.add((mt, cls))
    assert len(pairs) > 80, transformers.__version__
    refused = {(mt, cls) for mt, cls in pairs if not _accepts(cls, {"model_type": mt, "architectures": [cls]})}
    assert refused <= _NOT_OFFERED, sorted(refused - _NOT_OFFERED)


# (model_type, class) pairs in transformers' auto tables that the class's adapter refuses, each for a reason:
# families lazyweights has no record of, filed by transformers under another family's class
_NOT_OFFERED = {
    ("exaone", "LlamaForCausalLM"), ("internlm3", "LlamaForCausalLM"),  # converted under their own classes
    ("iquestcoder", "LlamaForCausalLM"), ("gpt-sw3", "GPT2LMHeadModel"),  # no record
    ("sarvam_mla", "DeepseekV3ForCausalLM"), ("sarvam_moe", "Glm4MoeForCausalLM"),  # no record
    ("shieldgemma2", "Gemma3ForConditionalGeneration"),  # a classifier around Gemma 3, no record
    # a multimodal outer model_type under its text class: the identity rows have no alias for it (yet)
    ("llama4", "Llama4ForCausalLM"), ("qwen3_5", "Qwen3_5ForCausalLM"), ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
}


def test_the_classes_fixed_by_deriving_accept_their_own_configs():
    # before the table was derived: NemotronHForCausalLM accepted only nemotron_h_moe (two rows share the
    # class; the later one overwrote the first), Lfm2Model only lfm2_embed, which no config.json says;
    # Gemma4ForConditionalGeneration was not registered
    assert _accepts("Gemma4ForConditionalGeneration", {"model_type": "gemma4"})
    assert builtin.GGUF_TAKEN_AS["MistralForCausalLM"] == ("llama",)
    assert builtin.GGUF_TAKEN_AS["RobertaModel"] == ("bert",)
    assert _accepts("NemotronHForCausalLM", {"model_type": "nemotron_h", "hybrid_override_pattern": "M*-"})
    assert _accepts("NemotronHForCausalLM", {"model_type": "nemotron_h", "hybrid_override_pattern": "M*E"})
    assert _accepts("Lfm2Model", {"model_type": "lfm2", "architectures": ["Lfm2Model"]})
    assert not _accepts("LlamaForCausalLM", {"model_type": "gemma3_text"})
    with pytest.raises(ConfigError, match=r"'LlamaForCausalLM' expects model_type 'llama'.*says 'gemma3'"):
        builtin._checked("LlamaForCausalLM", lambda *a, **k: None)({}, huggingface_config={"model_type": "gemma3"})


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_each_class_accepts_llama_cpps_file_of_its_family(model_type):
    rec = ARCHS[model_type]
    md = {k: v.value for k, v in gguf_metadata_from_hf(_tiny_config(rec)).items()}
    cfg = GGUFConfig(md, ["token_embd.weight"])
    for cls in rec.identity.hf_classes:
        assert _accepts(cls, cfg), (cls, model_type)
    if rec.gguf != "llama":
        assert not _accepts("LlamaForCausalLM", cfg), model_type


@pytest.mark.parametrize("config, picked", [
    ({"model_type": "xlm-roberta", "lora_adaptations": ["retrieval.query"]}, "jina_embeddings_v3"),
    ({"model_type": "xlm-roberta", "lora_adaptations": []}, "xlm-roberta"),
    ({"model_type": "nemotron_h", "hybrid_override_pattern": "M*-E"}, "nemotron_h_moe"),
    ({"model_type": "nemotron_h", "layers_block_type": ["mamba", "moe"]}, "nemotron_h_moe"),
    ({"model_type": "nemotron_h", "layers_block_type": ["mamba", "mlp"]}, "nemotron_h"),
    ({"model_type": "lfm2", "architectures": ["Lfm2Model"]}, "lfm2_embed"),
    ({"model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"]}, "lfm2"),
    ({"model_type": "gemma3", "text_config": {"num_attention_heads": 4}}, "gemma3_text"),
])
def test_config_picks(config, picked):
    assert identity_for_config(config).model_type == picked
    assert _text_part(config)["model_type"] == picked
