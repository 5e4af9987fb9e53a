"""Every record in `lazyweights.adapters.archs` is judged: its model_type is the config class of at least one
family in the test tables that run llama.cpp and transformers on a tiny model (test_arch_round_trip,
test_arch_breadth, test_arch_more, test_arch_encoders, test_arch_ssm, test_arch_gpt_oss, test_arch_lfm2,
test_arch_gemma4, test_arch_lfm2_moe). Adding an architecture is a record and a test: a record with no table entry
fails here, naming it."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

import test_arch_breadth  # noqa: E402
import test_arch_encoders  # noqa: E402
import test_arch_lfm2  # noqa: E402
import test_arch_lfm2_moe  # noqa: E402
import test_arch_more  # noqa: E402
import test_arch_qwen_hybrid  # noqa: E402
import test_arch_round_trip  # noqa: E402
import test_arch_ssm  # noqa: E402

from lazyweights.adapters.archs import ALIASES, ARCHS  # noqa: E402

# records no transformers config class names (the GGUF architecture llama.cpp's converter picks for a config of
# another record's class, judged by that class's entries), and records judged on a real checkpoint instead
_JUDGED_ELSEWHERE = {"nemotron_h_moe": "test_arch_ssm: NemotronHConfig with MoE layers",
                     "bert": "test_arch_breadth::test_minilm_embedding_equals_transformers (the real MiniLM)",
                     "lfm2_embed": "test_arch_lfm2_embed: Lfm2Config with Lfm2Model (llama.cpp's pooled embedding)",
                     "qwen3_vl_moe_text": "test_vl_text: Qwen3VLMoeForConditionalGeneration's text half, llama.cpp's "
                                          "next-token distribution against transformers' (KL)"}


def _judged_model_types() -> set[str]:
    classes = [entry[0] for table in (test_arch_round_trip.ARCHS, test_arch_breadth.FAMILIES,
                                      test_arch_breadth._VL, test_arch_more.FAMILIES, test_arch_encoders.FAMILIES,
                                      test_arch_ssm.SSM_FAMILIES, test_arch_lfm2.FAMILIES,
                                      test_arch_lfm2_moe.FAMILIES,
                                      test_arch_qwen_hybrid.FAMILIES) for entry in table.values()]
    classes.append("GptOssConfig")  # test_arch_gpt_oss
    classes.append("Gemma4TextConfig")  # test_arch_gemma4
    out = set()
    for name in classes:
        cls = getattr(transformers, name, None)
        if cls is not None:
            mt = cls.model_type
            out.add(ALIASES.get(mt, mt))
    return out


def test_every_record_is_judged():
    judged = _judged_model_types()
    assert len(judged) >= 40
    missing = sorted(set(ARCHS) - judged - set(_JUDGED_ELSEWHERE))
    assert not missing, f"records with no judged tiny model in the test tables: {missing}"
