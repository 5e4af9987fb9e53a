"""The `{arch}.*` keys the converters write are gguf-py's `Keys` constants (`formats.gguf_keys`): every row of
every architecture record, every fixed key, and every key `gguf_metadata_from_hf` writes for a config of each
record is one of gguf-py's templates, walked here independently of the module, except the two llama.cpp keys
gguf-py 0.19 lacks, which llama.cpp's own library (libllama's key table) must name. hparams.py spells no
`{arch}.` key by hand."""
from __future__ import annotations

import glob
import os
import re
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from test_arch_identity import _tiny_config  # noqa: E402

from lazyweights.adapters.archs import ARCHS, HParam  # noqa: E402
from lazyweights.convert.to_gguf import gguf_metadata_from_hf  # noqa: E402
from lazyweights.core.errors import UnknownGGUFKeyError  # noqa: E402
from lazyweights.formats.gguf_keys import LLAMA_CPP_ONLY, arch_key, template, templates  # noqa: E402


def _gguf_py_templates() -> dict[str, str]:
    """Every `{arch}.*` template gguf-py's Keys defines (no second placeholder), suffix -> the constant."""
    out = {}
    for group in vars(gguf.Keys).values():
        if isinstance(group, type):
            for value in vars(group).values():
                if isinstance(value, str) and re.fullmatch(r"\{arch\}\.[a-z0-9_.]+", value):
                    out[value[len("{arch}."):]] = value
    return out


GGUF_PY = _gguf_py_templates()
GLOBAL_KEYS = {v for g in vars(gguf.Keys).values() if isinstance(g, type) for v in vars(g).values()
               if isinstance(v, str) and not v.startswith("{")}


def test_rows_and_fixed_keys_are_gguf_pys_constants():
    for mt, rec in ARCHS.items():
        for hp in (*rec.hparams, *rec.tail, *rec.late):
            want = GGUF_PY.get(hp.key, LLAMA_CPP_ONLY.get(hp.key))
            assert want is not None, f"{mt}: row {hp.key!r} is no GGUF key gguf-py or llama.cpp knows"
            assert hp.template == want, mt
            if hp.key in GGUF_PY:
                assert hp.template is GGUF_PY[hp.key], f"{mt}: {hp.key} is not gguf-py's own constant"
        for key in rec.gguf_fixed:
            assert template(key) == GGUF_PY.get(key, LLAMA_CPP_ONLY.get(key)), f"{mt}: fixed key {key}"


def test_llama_cpp_only_keys_are_what_gguf_py_lacks_and_llama_cpp_reads():
    assert set(LLAMA_CPP_ONLY) == {"attention.recurrent_layers", "hidden_activation"}
    for suffix, tmpl in LLAMA_CPP_ONLY.items():
        # gguf-py's constant wins once the installed release has one (llama.cpp's gguf-py does already)
        assert templates()[suffix] == GGUF_PY.get(suffix, tmpl)
    llama_cpp = pytest.importorskip("llama_cpp")
    libs = glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libllama.so*"))
    if not libs:
        pytest.skip("llama_cpp has no libllama.so here to read the key table from")
    table = Path(libs[0]).read_bytes()
    for tmpl in LLAMA_CPP_ONLY.values():
        assert tmpl.replace("{arch}", "%s").encode() + b"\0" in table, f"libllama does not name {tmpl}"


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_every_key_written_is_gguf_pys(model_type):
    rec = ARCHS[model_type]
    md = gguf_metadata_from_hf(_tiny_config(rec))
    allowed = {t.format(arch=rec.gguf) for t in (*GGUF_PY.values(), *LLAMA_CPP_ONLY.values())}
    stray = [k for k in md if k not in allowed and k not in GLOBAL_KEYS]
    assert not stray, f"{model_type}: keys that are not gguf-py's constants: {stray}"


def test_an_unknown_key_is_named():
    with pytest.raises(UnknownGGUFKeyError, match=r"rope\.freq_bse.*Did you mean 'rope\.freq_base'") as e:
        arch_key("llama", "rope.freq_bse")
    assert isinstance(e.value, KeyError)
    with pytest.raises(UnknownGGUFKeyError):
        _ = HParam("attention.head_cnt", ("num_attention_heads",)).template


def test_hparams_spells_no_arch_key_by_hand():
    import lazyweights.convert.hparams as hparams

    source = Path(hparams.__file__).read_text()
    hand = re.findall(r'f"\{(?:a|arch|rec\.gguf)\}\.[^"]*"', source)
    assert not hand, f"hand-typed {{arch}} keys in hparams.py (use gguf-py's Keys): {hand}"
