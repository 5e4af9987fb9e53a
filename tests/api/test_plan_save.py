"""One save for every output: `lazyweights.plan(result).save(path)` keeps what a converter's result carries.

A tiny random Llama (transformers, float32, a trained byte-level BPE tokenizer) saved with `save_pretrained`:

- HF -> GGUF: `lw.plan(convert_hf_to_gguf(...)).save("x.gguf")` is a GGUF llama.cpp loads (its next-token logits
  equal transformers'); gguf-py reads the metadata `save_converted` writes; the bytes equal the old tensor-at-a-time
  writer's (`write_gguf`) and `save_converted`'s / `save_gguf`'s, which are wrappers now. Plans derived from the
  result (`filter`, `quantize`) keep the metadata; `general.file_type` follows the tensors saved.
- GGUF -> HF: `lw.plan(convert_gguf_state_dict(...)).save(folder)` is a folder transformers loads (same logits,
  same tokenizer ids); its files equal the tensors saved alone plus `extra_files()`, byte for byte.
- A GGUF without `general.architecture` is a GGUFConfigError naming the key, with nothing written, unless
  `require_architecture=False`.
"""
from __future__ import annotations

import filecmp
import json
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import lazyweights as lw  # noqa: E402
from lazyweights.convert.result import save_converted  # noqa: E402
from lazyweights.convert.to_gguf import convert_hf_to_gguf  # noqa: E402
from lazyweights.convert.to_hf import convert_gguf_state_dict  # noqa: E402
from lazyweights.core.errors import GGUFConfigError  # noqa: E402
from lazyweights.lazy.gguf import save_gguf, write_gguf  # noqa: E402

_CORPUS = ("The quick brown fox jumps over the lazy dog. The capital of France is Paris. "
           "def f(x):\n    return x * 2  # numbers 12345 and more words, words, words.\n") * 20
_CONFIG = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=2)
PROMPT = "The capital of France is"


def _tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from lazyweights.formats.tokenizer_tables import PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS["llama-bpe"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>", "<pad>", "<unk>"], show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """(folder, model, tokenizer): the tiny Llama saved as Hugging Face writes it."""
    folder = str(tmp_path_factory.mktemp("plan_save") / "hf")
    tok = _tokenizer()
    cfg = transformers.LlamaConfig(**_CONFIG, vocab_size=len(tok))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norms, so a lost metadata key or a wrong value shows in the logits
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model, tok


def _hf_result(folder):
    w = lw.load_weights([folder])
    return convert_hf_to_gguf(dict(w.items()), None, folder=folder)


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _llama_cpp_logits(path, ids):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def _fields(path) -> dict:
    """gguf-py's reading of every key/value (not the GGUF.* header fields): key -> (types, value)."""
    out = {}
    for k, f in gguf.GGUFReader(str(path)).fields.items():
        if k.startswith("GGUF."):
            continue
        out[k] = (tuple(int(t) for t in f.types), f.contents())
    return out


# --- HF -> GGUF ---------------------------------------------------------------------------------------------------
def test_plan_of_converted_result_saves_a_gguf_llama_cpp_runs(hf_folder, tmp_path):
    folder, model, tok = hf_folder
    result = _hf_result(folder)
    p = lw.plan(result)
    assert p.metadata is result.gguf_metadata  # kept as the converter built it
    path = tmp_path / "x.gguf"
    assert p.save(path) == [str(path)]

    fields = _fields(path)
    assert fields["general.architecture"][1] == "llama"
    assert len(fields) == len(result.gguf_metadata) and len(fields) > 20  # not 3 header fields and 0 keys
    assert fields["tokenizer.ggml.tokens"][1] == [tok.convert_ids_to_tokens(i) for i in range(len(tok))]
    assert fields["llama.block_count"][1] == 2 and fields["general.file_type"][1] == 0  # float32 tensors

    ids = tok(PROMPT)["input_ids"]
    mine, ref = _llama_cpp_logits(path, ids), _logits(model, ids)
    np.testing.assert_allclose(mine, ref, rtol=0, atol=2e-3)


def test_gguf_bytes_equal_every_save_path(hf_folder, tmp_path):
    """`lw.plan(result).save`, `save_converted`, `save_gguf` and the tensor-at-a-time `write_gguf` (its own loop,
    one tensor materialized at a time) write the same bytes, and gguf-py reads the same metadata from them."""
    result = _hf_result(hf_folder[0])
    lw.plan(result).save(tmp_path / "plan.gguf")
    assert save_converted(result, tmp_path / "converted.gguf") == [str(tmp_path / "converted.gguf")]
    assert save_gguf(tmp_path / "save_gguf.gguf", result) == str(tmp_path / "save_gguf.gguf")
    write_gguf(tmp_path / "write_gguf.gguf", result, result.gguf_metadata)
    for other in ("converted", "save_gguf", "write_gguf"):
        assert filecmp.cmp(tmp_path / "plan.gguf", tmp_path / f"{other}.gguf", shallow=False), other
    assert _fields(tmp_path / "plan.gguf") == _fields(tmp_path / "write_gguf.gguf")


def test_derived_plans_keep_the_metadata(hf_folder, tmp_path):
    """`filter` and `quantize` keep the converter's metadata; `general.file_type` says what is saved: the
    preset's type after `quantize`, recomputed from the tensors when the result was changed in place."""
    result = _hf_result(hf_folder[0])
    p = lw.plan(result)
    layer0 = p.filter("blk.0.*")
    assert layer0.metadata is p.metadata
    assert sorted(layer0.outputs) == sorted(k for k in result if k.startswith("blk.0."))

    q = p.quantize("Q8_0")
    assert getattr(q.metadata["general.architecture"], "value", None) == "llama"
    q.save(tmp_path / "q8.gguf")
    fields = _fields(tmp_path / "q8.gguf")
    assert fields["general.file_type"][1] == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    assert fields["tokenizer.ggml.tokens"][1] == list(result.gguf_metadata["tokenizer.ggml.tokens"].value)
    reader = gguf.GGUFReader(str(tmp_path / "q8.gguf"))
    matrices = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1 and t.name != "token_embd.weight"}
    assert matrices == {"Q8_0"}

    name = "blk.0.ffn_up.weight"
    changed = _hf_result(hf_folder[0])
    for k in list(changed):
        if len(changed[k].shape) == 2:
            changed[k] = changed[k].astype(lw.DType.float16)
    lw.plan(changed).save(tmp_path / "f16.gguf")
    assert _fields(tmp_path / "f16.gguf")["general.file_type"][1] == int(gguf.LlamaFileType.MOSTLY_F16)
    assert {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "f16.gguf")).tensors}[name] == "F16"


def test_file_type_rule_is_the_converters(tmp_path):
    """A converter's `general.file_type` is recomputed from the tensors saved (llama.cpp's rule for a model), unless
    its result says its rule is another (`file_type_from_tensors=False`: an mmproj keeps the source's float type);
    metadata given to `save` is written as given."""
    from gguf.constants import GGUFValueType as T

    from lazyweights.convert.result import ConvertedStateDict
    from lazyweights.formats.gguf_writer import GGUFValue

    def result(rule):
        sd = ConvertedStateDict(w=lw.WeightData.from_numpy(np.ones((4, 32), np.float32), "w"))
        sd.gguf_metadata = {"general.architecture": GGUFValue("clip", T.STRING),
                            "general.file_type": GGUFValue(1, T.UINT32)}
        sd.file_type_from_tensors = rule
        return sd

    for rule, want in ((True, 0), (False, 1)):
        lw.plan(result(rule)).save(tmp_path / f"{rule}.gguf")
        assert _fields(tmp_path / f"{rule}.gguf")["general.file_type"][1] == want
    lw.plan(result(True)).save(tmp_path / "given.gguf", metadata=result(True).gguf_metadata)
    assert _fields(tmp_path / "given.gguf")["general.file_type"][1] == 1


def test_cli_convert_with_filter_keeps_the_metadata(hf_folder, tmp_path):
    """`lazyweights convert ... --filter` saves the filtered plan with the converter's metadata (the CLI no longer
    patches the result onto the plan)."""
    from lazyweights.tools.cli import main

    out = tmp_path / "f.gguf"
    rc = main(["convert", "lazyweights.adapters:convert_hf_to_gguf", hf_folder[0], "-o", str(out), "--no-progress",
               "--filter", "blk.*"])
    assert rc == 0
    reader = gguf.GGUFReader(str(out))
    assert all(t.name.startswith("blk.") for t in reader.tensors) and len(reader.tensors) == 18
    assert _fields(out)["general.architecture"][1] == "llama"


def test_gguf_without_architecture_is_refused_and_nothing_written(tmp_path):
    w = lw.WeightData.from_numpy(np.ones((2, 3), np.float32), "w")
    for save in (lambda p: lw.plan({"w": w}).save(p),
                 lambda p: lw.plan({"w": w}).save(p, metadata={"general.name": "x", "x.n": 3}),
                 lambda p: save_gguf(p, {"w": w}, {"general.architecture": ""}),
                 lambda p: write_gguf(p, {"w": w}, {})):
        with pytest.raises(GGUFConfigError) as ei:
            save(tmp_path / "x.gguf")
        assert "general.architecture" in str(ei.value) and "x.gguf" in str(ei.value)
        assert ei.value.missing == ["general.architecture"] and isinstance(ei.value, ValueError)
        assert os.listdir(tmp_path) == []
    lw.plan({"w": w}).save(tmp_path / "raw.gguf", require_architecture=False)  # a bare tensor container, asked for
    reader = gguf.GGUFReader(str(tmp_path / "raw.gguf"))
    assert [t.name for t in reader.tensors] == ["w"] and "general.architecture" not in reader.fields


# --- GGUF -> HF ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gguf_file(hf_folder, tmp_path_factory):
    path = tmp_path_factory.mktemp("plan_save_gguf") / "m.gguf"
    lw.plan(_hf_result(hf_folder[0])).save(path)
    return str(path)


def _gguf_result(path):
    w = lw.load_weights([path])
    return convert_gguf_state_dict(dict(w.items()), w.config, dequantize_to=lw.DType.float32)


def test_plan_of_gguf_result_saves_a_folder_transformers_loads(hf_folder, gguf_file, tmp_path):
    _, model, tok = hf_folder
    result = _gguf_result(gguf_file)
    p = lw.plan(result)
    assert p.extra_files is result.extra_files
    out = tmp_path / "back"
    out.mkdir()
    (out / "stale.txt").write_text("an old folder is replaced whole")
    files = p.save(out)
    assert sorted(os.path.basename(f) for f in files) == sorted(
        ["model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"])
    assert sorted(os.listdir(out)) == sorted(os.path.basename(f) for f in files)
    assert sorted(os.listdir(tmp_path)) == ["back"]  # no staging folder left beside it

    m = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(m).__name__ == "LlamaForCausalLM"
    ids = tok(PROMPT)["input_ids"]
    np.testing.assert_allclose(_logits(m, ids), _logits(model, ids), rtol=0, atol=1e-4)
    back_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert back_tok(PROMPT)["input_ids"] == ids


def test_folder_bytes_equal_the_tensors_plus_extra_files(gguf_file, tmp_path):
    """The folder `Plan.save` writes is the tensors saved alone plus the result's `extra_files()`, byte for byte,
    sharded too; `save_converted` writes the same folder."""
    result = _gguf_result(gguf_file)
    files = lw.plan(result).save(tmp_path / "plan", max_shard_size="40kB")
    assert save_converted(result, tmp_path / "converted", max_shard_size="40kB") == [
        f.replace(os.sep + "plan" + os.sep, os.sep + "converted" + os.sep) for f in files]
    lw.plan(dict(result)).save(tmp_path / "tensors", max_shard_size="40kB")
    extra = result.extra_files()
    names = sorted(os.listdir(tmp_path / "plan"))
    assert names == sorted(os.listdir(tmp_path / "tensors") + list(extra))
    assert sum(n.startswith("model-") for n in names) > 1 and "model.safetensors.index.json" in names
    for n in names:
        data = (tmp_path / "plan" / n).read_bytes()
        assert data == (extra[n] if n in extra else (tmp_path / "tensors" / n).read_bytes()), n
        assert data == (tmp_path / "converted" / n).read_bytes(), n
    assert json.loads(extra["config.json"])["architectures"] == ["LlamaForCausalLM"]
