"""One identity per architecture (`lazyweights.formats.arch_identity`), and everything that names a family agrees
with it: for every record in `adapters.archs`, a GGUF file of its architecture (written by gguf-py's GGUFWriter
from the metadata the HF -> GGUF side writes for a config of the record, read back by lazyweights) gives the same
`model_type` and class through `GGUFConfig` as `hf_config_from_gguf` writes into config.json, and both are the
family llama.cpp's file reads back as (written out below, not derived). The names are checked against their
owners: gguf-py's `MODEL_ARCH_NAMES` for GGUF architectures, transformers' auto-class tables for model_types
and classes.

Also here: the one config accessor (`core.config_access`) and RoPE scaling both ways (`formats.rope_scaling`),
against hand-written configs and the values transformers' own configs hold.
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import lazyweights as lw  # noqa: E402
from lazyweights.adapters.archs import ALIASES, ARCHS, arch_for_gguf, arch_for_model_type  # noqa: E402
from lazyweights.convert.to_gguf import gguf_metadata_from_hf  # noqa: E402
from lazyweights.convert.to_hf import hf_config_from_gguf  # noqa: E402
from lazyweights.core.config_access import config_first, config_get, text_config  # noqa: E402
from lazyweights.formats.arch_identity import (  # noqa: E402
    GGUF_ARCHS,
    GGUF_READ_AS,
    IDENTITIES,
    config_identity,
    identity_for_gguf,
)
from lazyweights.formats.config import GGUFConfig, HFConfig  # noqa: E402
from lazyweights.formats.gguf_writer import GGUFValue  # noqa: E402
from lazyweights.formats.rope_scaling import rope_scaling_from_gguf, rope_scaling_to_gguf  # noqa: E402

# Families whose llama.cpp GGUF converts back to another family's config.json (record -> (model_type, class)
# written), from llama.cpp's converters: Mistral and InternLM3 become llama GGUFs, the RoBERTa family bert, the
# Qwen VL text parts their text model, GLM-4.7-Flash a DeepSeek-V3 deepseek2, Solar Open a GLM-4.5 glm4moe;
# Nemotron-H MoE and the LFM2 embedding models keep their class under their config's model_type.
READS_BACK_AS = {
    "mistral": ("llama", "LlamaForCausalLM"),
    "internlm3": ("llama", "LlamaForCausalLM"),
    "roberta": ("bert", "BertModel"),
    "xlm-roberta": ("bert", "BertModel"),
    "distilbert": ("bert", "BertModel"),
    "qwen2_vl_text": ("qwen2", "Qwen2ForCausalLM"),
    "qwen2_5_vl_text": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3_vl_text": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3_vl_moe_text": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "glm4_moe_lite": ("deepseek_v3", "DeepseekV3ForCausalLM"),
    "solar_open": ("glm4_moe", "Glm4MoeForCausalLM"),
    "nemotron_h_moe": ("nemotron_h", "NemotronHForCausalLM"),
    "lfm2_embed": ("lfm2", "Lfm2Model"),
}
# the GGUF names issue 38 found GGUFConfig disagreeing on (its hand table said starcoder and qwen2moe)
_REVIEWED = {"starcoder": "gpt_bigcode", "qwen2moe": "qwen2_moe", "gemma3": "gemma3_text", "phi2": "phi"}
# record classes transformers maps to Llama (the Hub's remote-code config.json files name these classes)
_REMOTE_CODE_CLASSES = {"exaone": "ExaoneForCausalLM", "internlm3": "InternLM3ForCausalLM"}

_SIZES = {"context_length": 256, "embedding_length": 64, "block_count": 4, "feed_forward_length": 96,
          "attention.head_count": 4, "attention.head_count_kv": 2, "expert_count": 4, "expert_used_count": 2,
          "expert_feed_forward_length": 32, "expert_shared_feed_forward_length": 32, "expert_shared_count": 1,
          "leading_dense_block_count": 1, "expert_group_count": 1, "expert_group_used_count": 1,
          "attention.q_lora_rank": 32, "attention.kv_lora_rank": 16, "ssm.conv_kernel": 4, "ssm.state_size": 8,
          "ssm.time_step_rank": 4, "ssm.group_count": 1, "ssm.inner_size": 128, "shortconv.l_cache": 3,
          "interleave_moe_layer_step": 1, "n_deepstack_layers": 1}
_HYBRID_LAYERS = {"attn_layer_indices": [1, 3], "attn_layer_period": 2}


def _tiny_config(rec) -> dict:
    """A config.json for the record: each of its rows under its first name (nested `a.b` names nested), the
    values llama.cpp's graph requires, and the layer lists a hybrid / MLA / M-RoPE family needs."""
    cfg: dict = {"model_type": rec.model_type, "vocab_size": 100}
    for hp in (*rec.hparams, *rec.tail):
        if hp.kind in ("prod", "sum"):
            for n in hp.hf:
                cfg.setdefault(n, 2)
            continue
        v = {"f32": 1e-5 if "eps" in hp.key else 1.0, "f32n": 1.0, "bool": True, "str": "gelu"}.get(
            hp.kind, _SIZES.get(hp.key, 2))
        outer, _, inner = hp.hf[0].rpartition(".")
        (cfg.setdefault(outer, {}) if outer else cfg)[inner] = v
    cfg.update(rec.requires)
    if rec.shortconv:
        cfg.setdefault("intermediate_size", 96)
    if rec.mla:
        cfg.update(qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    if rec.mrope:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]}
    if rec.hybrid:
        kinds = (["full_attention", "linear_attention"] * 2 if rec.gdn else ["conv", "full_attention"] * 2
                 if rec.shortconv else ["mamba", "attention", "moe" if rec.experts else "mlp", "mamba"]
                 if rec.hybrid == "layers_block_type" else ["attention", "mamba"] * 2)
        cfg[rec.hybrid] = _HYBRID_LAYERS.get(rec.hybrid, kinds)
        if rec.hybrid == "attn_layer_period":
            cfg.update(attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1)
    if rec.hooks.layers_to_gguf:  # Gemma 4: a layer_types list of block_count entries
        cfg["layer_types"] = ["sliding_attention"] * 3 + ["full_attention"]
    if rec.sliding:
        cfg[rec.window_hf or "sliding_window"] = 8
    return cfg


def _write_gguf(path, metadata) -> None:
    """A real GGUF file (gguf-py's writer) holding `metadata` (GGUFValues), 100 tokens and a token embedding."""
    w = gguf.GGUFWriter(str(path), metadata["general.architecture"].value)
    for key, v in metadata.items():
        if key != "general.architecture":
            w.add_key_value(key, v.value, v.type, sub_type=v.sub_type)
    w.add_token_list([f"t{i}" for i in range(100)])
    w.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_one_record_per_identity_row():
    assert list(ARCHS) == list(IDENTITIES)  # same families, same order (the order picks each GGUF's default)
    for mt, rec in ARCHS.items():
        row = IDENTITIES[mt]
        assert (rec.model_type, rec.gguf, rec.hf_class, rec.back_as) == \
            (row.model_type, row.gguf, row.hf_class, row.back_as), mt
        assert rec.identity is row
        assert "model_type" not in rec.hf_extra, f"{mt}: its config.json model_type is the identity's"
    assert len(ARCHS) == 84


def test_gguf_names_are_gguf_pys():
    names = set(gguf.MODEL_ARCH_NAMES.values())
    unknown = sorted({row.gguf for row in IDENTITIES.values()} - names)
    assert not unknown, f"GGUF architectures gguf-py does not name: {unknown}"
    assert set(GGUF_READ_AS) <= names
    assert GGUF_ARCHS == sorted({rec.gguf for rec in ARCHS.values()})


def test_each_gguf_architecture_has_one_default_row():
    for arch in GGUF_ARCHS:
        rows = [r for r in IDENTITIES.values() if r.gguf == arch]
        assert rows[0].when == {}, f"{arch}: its first row {rows[0].model_type} is its default"
        assert all(r.when != {} for r in rows[1:]), f"{arch}: one default only: {[r.model_type for r in rows]}"
        assert identity_for_gguf(arch) is rows[0]
        assert arch_for_gguf(arch) is ARCHS[rows[0].model_type]


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_gguf_config_and_exporter_agree_with_the_record(model_type, tmp_path):
    rec = ARCHS[model_type]
    md = gguf_metadata_from_hf(_tiny_config(rec))
    assert md["general.architecture"].value == rec.gguf
    if rec.embedding:  # what convert_hf_to_gguf adds from a sentence-transformers folder's Pooling module
        md[f"{rec.gguf}.pooling_type"] = GGUFValue(1, gguf.GGUFValueType.UINT32)
    path = tmp_path / "model.gguf"
    _write_gguf(path, md)
    weights = lw.load_weights([str(path)])
    cfg = weights.config
    assert isinstance(cfg, GGUFConfig) and cfg.architecture == rec.gguf
    exported = hf_config_from_gguf(weights.metadata)
    want_type, want_class = READS_BACK_AS.get(model_type, (model_type, rec.hf_class))
    assert (cfg.model_type, cfg.architectures) == (want_type, [want_class])
    assert (exported["model_type"], exported["architectures"]) == (want_type, [want_class])
    # the record the file is taken for (tensor names, value transforms): the record itself where llama.cpp
    # keeps the family apart in the file's metadata
    if model_type not in READS_BACK_AS or READS_BACK_AS[model_type][1] == rec.hf_class:
        assert arch_for_gguf(rec.gguf, weights.metadata) is rec


def test_the_reviewed_gguf_names_read_as_their_records():
    for arch, model_type in _REVIEWED.items():
        cfg = GGUFConfig({"general.architecture": arch})
        assert cfg.model_type == model_type and cfg.architectures == [ARCHS[model_type].hf_class]
    cfg = GGUFConfig({"general.architecture": "mistral3"})  # no converter record; GGUFConfig still names it
    assert (cfg.model_type, cfg.architectures) == ("mistral", ["MistralForCausalLM"])
    cfg = GGUFConfig({"general.architecture": "no-such-arch"})
    assert (cfg.model_type, cfg.architectures) == ("no-such-arch", [])
    assert config_identity("no-such-arch") is None


def test_identity_names_are_transformers():
    pytest.importorskip("transformers")
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    classes: dict[str, set[str]] = {}
    for name in dir(modeling_auto):
        table = getattr(modeling_auto, name)
        if name.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            for mt, cls in table.items():
                classes.setdefault(mt, set()).update(cls if isinstance(cls, (tuple, list)) else (cls,))
    for mt, row in IDENTITIES.items():
        types = (row.config_model_type, *row.aliases)
        assert any(t in CONFIG_MAPPING_NAMES for t in types), f"{mt}: transformers has no config for {types}"
        known = set().union(*(classes.get(t, set()) for t in types))
        for cls in row.hf_classes:
            if _REMOTE_CODE_CLASSES.get(mt) == cls:
                assert "LlamaForCausalLM" in known, mt
                continue
            assert cls in known, f"{mt}: transformers maps {types} to {sorted(known)}, not {cls}"
    for alias, mt in ALIASES.items():
        assert alias in CONFIG_MAPPING_NAMES and arch_for_model_type(alias) is ARCHS[mt]


def test_gguf_selection_by_metadata():
    def pick(arch, **keys):
        return identity_for_gguf(arch, {f"{arch}.{k.replace('__', '.')}": v for k, v in keys.items()}).model_type

    assert pick("llama") == "llama" and pick("llama", expert_count=8) == "mixtral"
    assert pick("llama", expert_count=0) == "llama"
    assert pick("deepseek2", expert_gating_func=1) == "deepseek_v2"
    assert pick("deepseek2", expert_gating_func=2) == "deepseek_v3"
    assert pick("deepseek2", expert_gating_func=3) == "deepseek_v2"  # unknown gating: the default
    assert pick("granitemoe", expert_shared_feed_forward_length=64) == "granitemoeshared"
    assert pick("granitehybrid") == "bamba"
    assert pick("granitehybrid", expert_count=4) == pick("granitehybrid", embedding_scale=12.0) == \
        "granitemoehybrid"
    assert pick("mamba", ssm__dt_b_c_rms=True) == "falcon_mamba"
    assert pick("mamba", ssm__dt_b_c_rms=False) == "mamba"
    assert pick("lfm2", pooling_type=1) == "lfm2_embed"
    assert pick("olmo2", attention__sliding_window=4096) == "olmo3"
    assert identity_for_gguf("granitehybrid").model_type == "granitemoehybrid"  # no metadata: the default


# --- the config accessor --------------------------------------------------------------------------------------
def test_config_get_reads_keys_attributes_and_paths():
    transformers = pytest.importorskip("transformers")
    tc = transformers.Gemma3Config(text_config={"num_attention_heads": 8, "hidden_size": 256, "head_dim": 32})
    assert config_get(tc, "text_config.num_attention_heads") == 8
    assert config_get(tc.to_dict(), "text_config.num_attention_heads") == 8
    assert config_get(HFConfig(tc.to_dict()), "text_config.hidden_size") == 256
    assert HFConfig(tc.to_dict()).get("text_config.head_dim") == 32
    assert config_get(tc, "text_config.no_such_entry", 7) == 7
    assert config_get({"head_dim": None}, "head_dim", 64) == 64  # transformers' unset entries are null
    assert config_get({"a": 3}, "a.b", "d") == "d" and config_get(None, "a", "d") == "d"
    assert config_first({"n_embd": 48}, ("hidden_size", "n_embd")) == 48
    assert config_first({}, ("hidden_size", "n_embd"), 0) == 0
    assert text_config(tc) is tc.text_config
    assert text_config(tc.to_dict())["hidden_size"] == 256
    llama = transformers.LlamaConfig(num_attention_heads=4)
    assert text_config(llama) is llama


# --- RoPE scaling both ways --------------------------------------------------------------------------------------
@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
     "beta_slow": 1.0},
])
def test_rope_scaling_round_trips(scaling):
    cfg = {"rope_parameters": {"rope_theta": 10000.0, **scaling}}
    md = {k: v.value for k, v in rope_scaling_to_gguf("qwen2", cfg).items()}
    assert md["qwen2.rope.scaling.type"] == scaling["rope_type"]
    assert np.float32(md["qwen2.rope.scaling.factor"]) == np.float32(scaling["factor"])
    assert rope_scaling_from_gguf(md, "qwen2") == scaling
    assert GGUFConfig({"general.architecture": "qwen2", **md}).rope_scaling == scaling


def test_rope_scaling_other_types_are_the_families_own():
    cfg = {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}}
    assert rope_scaling_to_gguf("llama", cfg) == {}
    assert rope_scaling_to_gguf("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}) == {}
    assert rope_scaling_from_gguf({"llama.rope.scaling.type": "none"}, "llama") is None
