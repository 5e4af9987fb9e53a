"""Reference outputs from transformers' own GGUF loader (`from_pretrained(dir, gguf_file=...)`), computed once
per (GGUF file, transformers version) and cached under ~/.cache/lazyweights/test-refs: loading the real Gemma
GGUF through transformers takes about a minute on 2 cores, far over the test budget when repeated. The cache
holds transformers' answers only (token ids, logits, a digest of every weight), never ours.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Café naïve résumé — Ångström, São Paulo, Zürich.",
    "日本語のテキストと中文文本，还有한국어도 있습니다。",
    "Emoji: 🤖🚀👍🏽 and flags 🇫🇷🇯🇵 and a family 👨‍👩‍👧.",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "   leading spaces,    runs of   spaces,\n\n\nnewlines\t\ttabs and trailing   ",
    "<bos>special <eos> tokens<pad> in text <unk>",
    "",
    "1234567890 3.14159 -42 1e-9 0x1F",
]
PROMPT = "The capital of France is"


def cache_dir() -> str:
    d = os.path.join(os.path.expanduser("~"), ".cache", "lazyweights", "test-refs")
    os.makedirs(d, exist_ok=True)
    return d


def file_key(path: str) -> str:
    st = os.stat(path)
    import transformers

    raw = f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}:{transformers.__version__}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def weight_digest(state: dict) -> dict:
    """name -> sha256 of the tensor's float32 bytes (bf16/f16 widen exactly)."""
    import torch

    out = {}
    for name, t in state.items():
        out[name] = hashlib.sha256(t.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()
    return out


def transformers_reference(gguf_path: str, texts=TEXTS, prompt=PROMPT, model: bool = True) -> dict:
    """Token ids (with and without special tokens), decoded text, logits of `prompt` and weight digests from
    transformers' GGUF loader, cached."""
    key = file_key(gguf_path)
    texts_key = hashlib.sha256(json.dumps([texts, prompt, model]).encode()).hexdigest()[:8]
    path = os.path.join(cache_dir(), f"{key}-{texts_key}.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            ref = json.load(fh)
        if "logits" in ref:
            ref["logits"] = np.array(ref["logits"], dtype=np.float32)
        return ref
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    ref: dict = {
        "ids": [tok(t)["input_ids"] for t in texts],
        "ids_plain": [tok(t, add_special_tokens=False)["input_ids"] for t in texts],
        "decoded": [tok.decode(tok(t, add_special_tokens=False)["input_ids"]) for t in texts],
        "special": {k: getattr(tok, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")},
    }
    if model:
        m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
        m.eval()
        ids = torch.tensor([tok(prompt)["input_ids"]])
        with torch.no_grad():
            ref["logits"] = m(ids).logits[0].float().numpy().tolist()
        ref["weights"] = weight_digest(m.state_dict())
        ref["config"] = {k: v for k, v in m.config.to_dict().items() if isinstance(v, (int, float, str, bool, list))}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(ref, fh)
    os.replace(tmp, path)
    if "logits" in ref:
        ref["logits"] = np.array(ref["logits"], dtype=np.float32)
    return ref
