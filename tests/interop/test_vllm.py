"""vLLM's `--load-format lazyweights` (lazyweights/tools/vllm.py), judged by vLLM's own default loader.

Tiny random models (hidden 64, 2 layers, head_dim 64: vLLM's CPU attention has no kernel for head_dim 16; a
~320-token byte-level BPE tokenizer trained here) are saved with transformers' `save_pretrained`. Every engine
runs greedy generation of a batch of prompts; lazyweights must give vLLM's default loader's tokens and top-5
logprobs (1e-5) on the same model at the same tensor-parallel size. The engines run in two subprocesses
(`_vllm_runner.py`): all TP=1 engines in one (in-process engines, a few seconds each), TP=2 in the other (two
worker processes, `VLLM_CPU_OMP_THREADS_BIND="0|1"`). Skipped where vLLM is not installed (`.ci/run` gives it
its own environment).
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

_spec = importlib.util.spec_from_file_location(
    "_io_conftest", pathlib.Path(__file__).resolve().parents[1] / "io" / "conftest.py")
_io_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_io_conftest)
nginx = _io_conftest.nginx  # the remote-source tests' nginx on 127.0.0.1, with its byte-counting access log

RUNNER = pathlib.Path(__file__).with_name("_vllm_runner.py")
_CORPUS = ("The quick brown fox jumps over the lazy dog. Café naïve résumé. def f(x): return x ** 2  # code\n"
           " 1234 5678 ") * 10
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=2, head_dim=64, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
               pad_token_id=2, tie_word_embeddings=False)
ARCHS = {"llama": ("LlamaConfig", {}),
         "qwen3": ("Qwen3Config", {}),
         "qwen3moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                         "norm_topk_prob": True})}


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([_CORPUS], trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>", "<pad>", "<unk>"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")


def make_model(arch: str, folder, seed: int = 0):
    """A seeded tiny float32 model of `arch` with its tokenizer, saved into `folder`."""
    cls, extra = ARCHS[arch]
    tok = _tokenizer()
    cfg = getattr(transformers, cls)(**_COMMON, **extra, vocab_size=len(tok))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def run_engines(runs: dict, tmp, env=None) -> dict:
    """Every `LLM(**kw)` of `runs` in one subprocess (see _vllm_runner.py): key -> result."""
    spec, out = tmp / "runs.json", tmp / "out.json"
    spec.write_text(json.dumps(runs))
    e = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, str(RUNNER), str(spec), str(out)], env=e, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def assert_same(ours: dict, ref: dict, atol: float = 1e-5):
    """Same greedy tokens and the same top-5 logprobs (same token ids, values within atol)."""
    assert "error" not in ours, ours
    assert "error" not in ref, ref
    assert ours["tokens"] == ref["tokens"]
    for a_seq, b_seq in zip(ours["logprobs"], ref["logprobs"]):
        for a, b in zip(a_seq, b_seq):
            assert set(a) == set(b)
            np.testing.assert_allclose([a[k] for k in sorted(a)], [b[k] for k in sorted(a)], atol=atol, rtol=0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("vllm-models")
    out = {arch: str(make_model(arch, d / arch)) for arch in ARCHS}
    from lazyweights.adapters import export_gguf, export_hf_folder

    for quant in ("Q8_0", "Q4_K_M"):
        g = d / f"llama-{quant}.gguf"
        export_gguf(out["llama"], g, quant=quant)
        out[f"gguf-{quant}"] = str(g)
        export_hf_folder(g, d / f"llama-{quant}-hf", dtype="float32")
        out[f"gguf-{quant}-hf"] = str(d / f"llama-{quant}-hf")
    # a checkpoint that lacks one tensor vLLM's Llama needs
    broken = d / "broken"
    shutil.copytree(out["llama"], broken)
    from safetensors.numpy import load_file, save_file

    t = load_file(broken / "model.safetensors")
    t.pop("model.layers.1.self_attn.k_proj.weight")
    save_file(t, broken / "model.safetensors", metadata={"format": "pt"})
    out["broken"] = str(broken)
    return out


@pytest.fixture(scope="module")
def lora(models, tmp_path_factory):
    peft = pytest.importorskip("peft")
    d = tmp_path_factory.mktemp("vllm-lora")
    torch.manual_seed(1)
    base = transformers.AutoModelForCausalLM.from_pretrained(models["llama"])
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                      target_modules=["q_proj", "v_proj", "down_proj"]))
    model.save_pretrained(d / "adapter")
    merged = model.merge_and_unload()
    merged.save_pretrained(d / "merged")
    _tokenizer().save_pretrained(d / "merged")
    return str(d / "adapter"), str(d / "merged")


@pytest.fixture(scope="module")
def served(models, nginx):
    """The llama folder under nginx's root: its URL."""
    dst = nginx.root / "llama"
    if not dst.exists():
        shutil.copytree(models["llama"], dst)
    return nginx.url("llama")


@pytest.fixture(scope="module")
def tp1(models, lora, served, nginx, tmp_path_factory):
    """All TP=1 engines, in one process."""
    lw = {"load_format": "lazyweights"}
    runs = {
        "llama": {"model": models["llama"]},
        "llama-lw": {"model": models["llama"], **lw},
        "llama-http": {"model": served, **lw},
        "qwen3": {"model": models["qwen3"]},
        "qwen3-lw": {"model": models["qwen3"], **lw},
        "qwen3moe": {"model": models["qwen3moe"]},
        "qwen3moe-lw": {"model": models["qwen3moe"], **lw},
        "lora-ref": {"model": lora[1]},
        "lora-lw": {"model": models["llama"], **lw, "model_loader_extra_config": {"lora": lora[0]}},
        "missing": {"model": models["broken"], **lw},
        "bad-adapter": {"model": models["llama"], **lw,
                        "model_loader_extra_config": {"adapter": "no_such_module_xyz:convert"}},
        "unreachable": {"model": nginx.url("nothing-here/"), **lw},
    }
    for quant in ("Q8_0", "Q4_K_M"):
        runs[f"gguf-{quant}-ref"] = {"model": models[f"gguf-{quant}-hf"]}
        runs[f"gguf-{quant}-lw"] = {"model": models[f"gguf-{quant}"], **lw}
    nginx.clear_log()
    res = run_engines(runs, tmp_path_factory.mktemp("tp1"))
    res["_bytes"] = nginx.bytes_sent()
    return res


def test_local_folder(tp1):
    assert_same(tp1["llama-lw"], tp1["llama"])


def test_http_folder(tp1, models):
    assert_same(tp1["llama-http"], tp1["llama"])
    size = os.path.getsize(os.path.join(models["llama"], "model.safetensors"))
    # the weights once, plus the config/tokenizer files and the other URLs of this run (the unreachable one)
    assert tp1["_bytes"] < size + 200_000


@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
def test_other_architectures(tp1, arch):
    assert_same(tp1[f"{arch}-lw"], tp1[arch])


def test_lora_merged_at_load(tp1):
    assert_same(tp1["lora-lw"], tp1["lora-ref"])


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M"])
def test_gguf(tp1, quant):
    assert_same(tp1[f"gguf-{quant}-lw"], tp1[f"gguf-{quant}-ref"])


def _chain(res):
    return " | ".join(f"{c['error']}: {c['message']}" for c in res.get("chain", []))


def test_missing_tensor_named_with_nearest(tp1):
    chain = _chain(tp1["missing"])
    assert "MissingWeightError" in chain, chain
    assert "'model.layers.1.self_attn.k_proj.weight'" in chain and "Did you mean" in chain, chain


def test_adapter_that_does_not_import(tp1):
    chain = _chain(tp1["bad-adapter"])
    assert "AdapterError" in chain and "no_such_module_xyz" in chain, chain


def test_unreachable_url(tp1):
    chain = _chain(tp1["unreachable"])
    assert "RemoteError" in chain and "nothing-here" in chain, chain


def test_gguf_architecture_vllm_lacks():
    from lazyweights.core.errors import UnsupportedArchitectureError
    from lazyweights.tools.vllm import _check_vllm_has

    with pytest.raises(UnsupportedArchitectureError, match="NoSuchNetForCausalLM"):
        _check_vllm_has({"architectures": ["NoSuchNetForCausalLM"]}, "x.gguf")
    _check_vllm_has({"architectures": ["LlamaForCausalLM"]}, "x.gguf")


def _split_bytes(folder: str) -> tuple[int, int]:
    """(bytes of tensors vLLM splits over ranks, bytes of replicated tensors) of a Llama folder."""
    from safetensors import safe_open

    split = repl = 0
    with safe_open(os.path.join(folder, "model.safetensors"), "np") as f:
        for k in f.keys():
            n = f.get_tensor(k).nbytes
            if k.endswith("norm.weight"):
                repl += n
            else:
                split += n
    return split, repl


def test_tensor_parallel_2_over_http(models, served, nginx, tmp_path_factory):
    """TP=2 from nginx: the default loader's tokens at TP=2, and the two ranks together fetched the split
    tensors once and the replicated ones twice (each rank its half plus the norms), not the checkpoint twice."""
    nginx.clear_log()
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    res = run_engines({"ref": {"model": models["llama"], "tensor_parallel_size": 2},
                       "lw": {"model": served, "load_format": "lazyweights", "tensor_parallel_size": 2}},
                      tmp_path_factory.mktemp("tp2"), env)
    fetched = nginx.bytes_sent()
    assert_same(res["lw"], res["ref"])
    split, repl = _split_bytes(models["llama"])
    headers = 64_000  # safetensors header + config + tokenizer files, per rank and for the engine config
    assert fetched <= split + 2 * repl + 3 * headers, (fetched, split, repl)
    assert fetched < 1.5 * (split + repl), (fetched, split, repl)
