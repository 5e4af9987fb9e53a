"""A Llama-shaped checkpoint (tests/conftest.py's `llama_checkpoint`, the shared benchmark's layout), converted
to GGUF and back through lazyweights: identical tensors for lossless types, gguf-py's values for quantized ones."""
import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from safetensors import safe_open

import lazyweights as lw
from lazyweights.adapters import gguf_to_hf, hf_to_gguf
from lazyweights.convert.tensors import gguf_metadata_from_config


@pytest.fixture(scope="module")
def llama(tmp_path_factory, llama_checkpoint):
    d = llama_checkpoint(tmp_path_factory.mktemp("llama"), layers=2, hidden=256, inter=512, heads=4, kv_heads=2,
                         vocab=320, shard_bytes=int(0.001 * (1 << 30)))
    weights = lw.load_weights(d)
    original = {}
    for name, _ in weights.items():
        path = weights.records[name].file.path
        with safe_open(path, "numpy") as f:  # the independent reader
            original[name] = f.get_tensor(name)
    return d, weights, original


def _export(weights, out, quantize=None):
    cfg = weights.config
    gg = hf_to_gguf(dict(weights.items()), cfg)
    if quantize is not None:  # 2-D weights whose rows are whole blocks become `quantize` blocks
        gg = {k: (v.astype(lw.DType.float32).quantize(quantize)
                  if v.ndim == 2 and v.shape[1] % quantize.block_elements == 0 else v) for k, v in gg.items()}
    lw.plan(gg).save(out, metadata=gguf_metadata_from_config(cfg, arch="llama"))
    return gg


def test_lossless_round_trip_is_identical(llama, tmp_path):
    _, weights, original = llama
    out = str(tmp_path / "llama.gguf")
    _export(weights, out)
    back = lw.load_weights([out])
    hf = gguf_to_hf(dict(back.items()), back.config)
    got = lw.plan(hf).materialize()
    assert set(got) == set(original)
    for name, ref in original.items():
        arr = got[name]
        if ref.ndim == 1:  # norms are stored as float32 in GGUF (llama.cpp's convention): exact widening
            assert arr.dtype == np.float32 and np.array_equal(arr, ref.astype(np.float32)), name
            continue
        assert arr.dtype == ref.dtype and arr.shape == ref.shape, name
        assert arr.tobytes() == ref.tobytes(), name
    # gguf-py reads the same file, and sees llama.cpp's layout: q/k rows permuted, shapes as ne reversed.
    reader = GGUFReader(out)
    names = {t.name for t in reader.tensors}
    assert "blk.0.attn_q.weight" in names and "token_embd.weight" in names


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_export_matches_gguf_py(llama, tmp_path, qtype):
    _, weights, original = llama
    enc = lw.QuantizationEncoding[qtype]
    out = str(tmp_path / f"llama-{qtype}.gguf")
    exported = _export(weights, out, quantize=enc)
    # The reference: gguf-py quantizes the float32 values lazyweights planned to export, and dequantizes
    # its own bytes; lazyweights' file must hold those bytes and dequantize to those values.
    reader = {t.name: t for t in GGUFReader(out).tensors}
    back = lw.load_weights([out])
    checked = 0
    for name, wd in exported.items():
        if wd.quantization_encoding is not enc:
            continue
        src = wd.node.srcs[0]  # the float32 input of the quantize node
        values = lw.plan({"v": lw.WeightData.wrap(src, name)}).materialize()["v"]
        want_bytes = gguf_quantize(values, GGMLQuantizationType[qtype])
        t = reader[name]
        assert t.tensor_type == GGMLQuantizationType[qtype]
        assert np.asarray(t.data).tobytes() == want_bytes.tobytes(), name
        want_values = gguf_dequantize(want_bytes, GGMLQuantizationType[qtype])
        got_values = back[name].data().dequantize(lw.DType.float32).to_numpy()
        np.testing.assert_array_equal(got_values, want_values.reshape(got_values.shape), err_msg=name)
        checked += 1
    assert checked >= 10
    # Back to Hugging Face names: the quantized q/k rows are un-permuted as blocks, values still gguf-py's.
    hf = gguf_to_hf(dict(back.items()), back.config, dequantize_to=lw.DType.float32)
    q = lw.plan({"q": hf["model.layers.0.self_attn.q_proj.weight"]}).materialize()["q"]
    ref = original["model.layers.0.self_attn.q_proj.weight"].astype(np.float32)
    roundtrip = gguf_dequantize(gguf_quantize(ref, GGMLQuantizationType[qtype]), GGMLQuantizationType[qtype])
    np.testing.assert_array_equal(q, roundtrip.reshape(q.shape))
