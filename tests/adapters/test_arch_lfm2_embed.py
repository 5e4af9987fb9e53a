"""LFM2's embedding models (`Lfm2Model`, `archs` record `lfm2_embed`, llama.cpp's `lfm2` with a pooling type), judged
as test_arch_encoders judges its encoders: a tiny random Lfm2Model (the shared byte-level BPE tokenizer) in a
sentence-transformers folder (mean pooling); llama.cpp's pooled embedding equals transformers' mean of the last
hidden state (cosine > 0.999, atol 5e-4 relative to the largest value), and the GGUF converted back loads as
Lfm2Model with the original hidden states (atol 1e-4)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
if not hasattr(transformers, "Lfm2Model"):
    pytest.skip("this transformers has no LFM2", allow_module_level=True)

from test_arch_breadth import _SPECIAL  # noqa: E402
from test_arch_encoders import _hidden, _pooling_folder, assert_same_embeddings  # noqa: E402
from test_arch_lfm2 import _TYPES, perturb_lfm2  # noqa: E402
from test_arch_round_trip import PROMPT, tokenizer  # noqa: E402,F401  (the shared tiny tokenizer fixture)

from lazyweights.adapters import export_gguf, export_hf_folder  # noqa: E402

FAMILIES = {"lfm2_embed": ("Lfm2Config", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                                num_attention_heads=4, num_key_value_heads=2,
                                                max_position_embeddings=128, layer_types=_TYPES, conv_L_cache=3,
                                                block_auto_adjust_ff_dim=False, **_SPECIAL))}
TEXTS = [PROMPT, "the quick brown fox", "hello world, again and again"]


def test_lfm2_embedding_both_ways(tokenizer, tmp_path):  # noqa: F811
    cfg = transformers.Lfm2Config(**FAMILIES["lfm2_embed"][1])
    cfg.vocab_size = len(tokenizer)
    torch.manual_seed(0)
    model = perturb_lfm2(transformers.Lfm2Model(cfg).eval())
    hf = str(tmp_path / "hf")
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    _pooling_folder(hf, "mean", 64)

    path = str(tmp_path / "model.gguf")
    export_gguf(hf, path)
    r = gguf.GGUFReader(path)
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "lfm2"
    assert int(r.fields["lfm2.pooling_type"].parts[-1][0]) == 1  # mean

    assert_same_embeddings(path, model, tokenizer, TEXTS, "mean", "lfm2_embed", minilm_bound=False)

    back = str(tmp_path / "back")
    export_hf_folder(path, back, dtype="float32")
    with open(os.path.join(back, "config.json")) as fh:
        back_cfg = json.load(fh)
    assert back_cfg["model_type"] == "lfm2" and back_cfg["architectures"] == ["Lfm2Model"]
    m = transformers.AutoModel.from_pretrained(back, dtype=torch.float32).eval()
    assert type(m).__name__ == "Lfm2Model"
    ids = tokenizer(PROMPT)["input_ids"]
    np.testing.assert_allclose(_hidden(m, ids), _hidden(model, ids), rtol=0, atol=1e-4)
