"""Quantizing to llama.cpp presets in the plan (`Plan.quantize`, `Plan.save(quant=...)`, `convert --quant`).

The per-tensor type choice is judged by `quant.presets` (itself checked against llama.cpp in
tests/kernels/test_kquant_encode.py) and the bytes by the quantizers (byte-identical to ggml's); here the
plan-level plumbing is checked: each written tensor is exactly `quant.quantize` of the float32 values, with
its importance-matrix row, in one pass; the metadata says the preset; bad input is refused by name. Where
llama-cpp-python is installed, llama.cpp itself is the judge: our one-pass Q4_K_M/Q8_0/... file must equal,
tensor for tensor, `llama_model_quantize` of a bf16 GGUF of the same weights.
"""
import ctypes
import os
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from gguf import GGUFReader

import lazyweights as lw
from lazyweights.core.errors import DTypeError, ImatrixShapeError, LazyWeightsError, UnknownPresetError
from lazyweights.core.quantization import QuantizationEncoding as Q
from lazyweights.quant import quantize as quantize_rows
from lazyweights.quant.presets import model_tensor_types

RNG = np.random.default_rng(7)
N_LAYER, HIDDEN, FFN = 4, 256, 512


def _model(hidden=HIDDEN, ffn=FFN, tied=False):
    """GGUF-named bf16 tensors of a tiny llama, f32 norms, random (never zeros)."""
    t = {}
    bf = lambda *s: (RNG.standard_normal(s) * 0.05).astype(ml_dtypes.bfloat16)  # noqa: E731
    t["token_embd.weight"] = bf(320, hidden)
    if not tied:
        t["output.weight"] = bf(320, hidden)
    t["output_norm.weight"] = (1 + RNG.standard_normal(hidden) * 0.1).astype(np.float32)
    for i in range(N_LAYER):
        for n, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden // 2, hidden)),
                         ("attn_v", (hidden // 2, hidden)), ("attn_output", (hidden, hidden)),
                         ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
            t[f"blk.{i}.{n}.weight"] = bf(*shape)
        t[f"blk.{i}.attn_norm.weight"] = (1 + RNG.standard_normal(hidden) * 0.1).astype(np.float32)
    return t


META = {"general.architecture": "llama", "llama.block_count": N_LAYER, "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2, "llama.embedding_length": HIDDEN, "llama.context_length": 128}


def _plan(tensors):
    return lw.plan({n: lw.WeightData.from_numpy(a, n) for n, a in tensors.items()})


def _read(path):
    r = GGUFReader(str(path))
    return r, {t.name: t for t in r.tensors}


@pytest.mark.parametrize("preset", ["Q4_K_M", "Q8_0", "Q2_K", "Q6_K", "Q5_K_S"])
def test_saved_tensors_are_the_quantized_values_with_llamacpp_types(tmp_path, preset):
    tensors = _model()
    out = tmp_path / "m.gguf"
    _plan(tensors).save(out, metadata=META, quant=preset)
    reader, got = _read(out)
    want_types = model_tensor_types(preset, {n: a.shape for n, a in tensors.items()}, n_layer=N_LAYER,
                                    n_gqa=2, source_types={n: "BF16" if a.dtype != np.float32 else "F32"
                                                           for n, a in tensors.items()})
    assert set(got) == set(tensors)
    for name, arr in tensors.items():
        t, choice = got[name], want_types[name]
        assert t.tensor_type.name == choice.type, (name, t.tensor_type.name, choice)
        if choice.type in ("F32", "BF16", "F16"):
            continue
        rows = arr.astype(np.float32).reshape(-1, arr.shape[-1])
        want = quantize_rows(Q[choice.type], rows)
        assert np.array_equal(np.asarray(t.data).reshape(-1), want.reshape(-1)), name
    assert int(reader.fields["general.file_type"].parts[-1][0]) == {"Q4_K_M": 15, "Q8_0": 7, "Q2_K": 10,
                                                                     "Q6_K": 18, "Q5_K_S": 16}[preset]
    assert int(reader.fields["general.quantization_version"].parts[-1][0]) == 2


def test_explain_shows_each_type_and_why(tmp_path):
    tensors = _model(hidden=640, ffn=1280, tied=True)  # Gemma 3 270M's 640-wide rows: the fallback applies
    q = _plan(tensors).quantize("Q4_K_M", {**META, "llama.embedding_length": 640})
    text = q.explain(group_layers=False)
    assert "quantize[Q5_0; " in text and "256" in text  # 640 is not a multiple of 256: fallback, with why
    assert q.tensors["token_embd.weight"].quantization_encoding is not None  # tied: token_embd is the output
    assert q.tensors["output_norm.weight"].dtype is lw.DType.float32  # norms are kept


def test_importance_matrix_rows_reach_the_quantizer(tmp_path):
    tensors = _model()
    imatrix = {n: np.abs(RNG.standard_normal(a.shape[-1])).astype(np.float32) + 0.1
               for n, a in tensors.items() if a.ndim == 2}
    path = tmp_path / "imatrix.dat"
    _write_imatrix_dat(path, imatrix)
    out = tmp_path / "m.gguf"
    _plan(tensors).save(out, metadata=META, quant="Q4_K_M", imatrix=str(path))
    _, got = _read(out)
    name = "blk.1.ffn_up.weight"
    rows = tensors[name].astype(np.float32)
    with_w = quantize_rows(Q.Q4_K, rows, imatrix=imatrix[name])
    without = quantize_rows(Q.Q4_K, rows)
    assert not np.array_equal(with_w, without)  # the matrix matters for these rows...
    assert np.array_equal(np.asarray(got[name].data).reshape(-1), with_w.reshape(-1))  # ...and was used


def test_per_expert_importance_for_stacked_experts():
    experts = (RNG.standard_normal((3, 8, 256)) * 0.1).astype(np.float32)
    weights = np.abs(RNG.standard_normal((3, 256))).astype(np.float32) + 0.1
    wd = lw.WeightData.from_numpy(experts, "e").quantize(Q.Q4_K)
    node = lw.graph.ops.quantize(lw.WeightData.from_numpy(experts, "e").node, Q.Q4_K, weights)
    got = lw.plan({"e": lw.WeightData.wrap(node, "e", Q.Q4_K)}).materialize(block_bytes=1)["e"]
    ref = lw.plan({"e": lw.WeightData.wrap(node, "e", Q.Q4_K)}).materialize(scheduler="reference")["e"]
    for e in range(3):
        assert np.array_equal(got[e].reshape(-1), quantize_rows(Q.Q4_K, experts[e], imatrix=weights[e]).reshape(-1))
    assert np.array_equal(got, ref)
    assert not np.array_equal(got, wd.to_numpy())


def test_bad_input_is_refused_by_name(tmp_path):
    tensors = _model()
    p = _plan(tensors)
    with pytest.raises(UnknownPresetError, match="Q4_K_M") as e:
        p.quantize("Q4_K_X", META)
    assert isinstance(e.value, LazyWeightsError)
    wrong = {"blk.0.attn_q.weight": np.ones(100, np.float32)}  # a row length this model does not have
    path = tmp_path / "wrong.dat"
    _write_imatrix_dat(path, wrong)
    with pytest.raises(ImatrixShapeError, match=r"blk\.0\.attn_q\.weight.*100"):
        p.save(tmp_path / "x.gguf", metadata=META, quant="Q4_K_M", imatrix=str(path))
    _write_imatrix_dat(path, {"blk.0.other.weight": np.ones(HIDDEN, np.float32)})
    with pytest.raises(ImatrixShapeError, match="another model"):
        p.save(tmp_path / "x.gguf", metadata=META, quant="Q4_K_M", imatrix=str(path))
    with pytest.raises(LazyWeightsError, match="GGUF"):
        p.save(tmp_path / "x.safetensors", quant="Q4_K_M", metadata=META)
    with pytest.raises(LazyWeightsError, match="block_count"):
        p.quantize("Q4_K_M", {"general.architecture": "llama"})
    q = p.quantize("Q8_0", META)
    with pytest.raises(DTypeError):  # already quantized blocks are not values
        q.tensors["blk.0.attn_q.weight"].quantize(Q.Q4_K)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".gguf") or ".tmp" in f]


def _write_imatrix_dat(path, entries):
    """llama.cpp's legacy imatrix format (tools/imatrix: save_imatrix_legacy), ncall = 1."""
    import struct

    body = struct.pack("<i", len(entries))
    for name, w in entries.items():
        b = name.encode()
        body += struct.pack("<i", len(b)) + b + struct.pack("<ii", 1, len(w)) + np.asarray(w, "<f4").tobytes()
    body += struct.pack("<ii", 1, 0)
    path.write_bytes(body)


# --- llama.cpp as the judge -------------------------------------------------------------------------------------
def _llama_quantize(src, dst, preset):
    llama_cpp = pytest.importorskip("llama_cpp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed with {rc}"


@pytest.mark.parametrize("preset", ["Q4_K_M", "Q8_0", "Q3_K_M", "Q4_0"])
def test_one_pass_equals_llamacpp_two_steps(tmp_path, preset, child_env):
    pytest.importorskip("llama_cpp")
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                                   max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    cli = [sys.executable, "-m", "lazyweights", "convert", "lazyweights.adapters:convert_hf_to_gguf",
           str(tmp_path / "hf"), "--no-tokenizer", "--no-progress", "-o"]
    subprocess.run(cli + [str(tmp_path / "bf16.gguf")], check=True, env=child_env, capture_output=True)
    _llama_quantize(tmp_path / "bf16.gguf", tmp_path / "ref.gguf", preset)
    subprocess.run(cli + [str(tmp_path / "ours.gguf"), "--quant", preset], check=True, env=child_env,
                   capture_output=True)
    (ref_r, ref), (our_r, ours) = _read(tmp_path / "ref.gguf"), _read(tmp_path / "ours.gguf")
    assert set(ref) == set(ours)
    for name in ref:
        assert ours[name].tensor_type == ref[name].tensor_type, name
        assert np.asarray(ours[name].data).tobytes() == np.asarray(ref[name].data).tobytes(), name
    for key in ("general.file_type", "general.quantization_version"):
        assert list(our_r.fields[key].parts[-1]) == list(ref_r.fields[key].parts[-1]), key


def test_command_line_quant_flags(tmp_path, capsys):
    from lazyweights.tools.cli import main

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=96, max_position_embeddings=64)
    torch.manual_seed(1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    base = ["convert", "lazyweights.adapters:convert_hf_to_gguf", str(tmp_path / "hf"), "--no-tokenizer",
            "--no-progress"]
    assert main(base + ["-o", str(tmp_path / "q.gguf"), "--quant", "q8_0"]) == 0
    _, got = _read(tmp_path / "q.gguf")
    assert got["blk.0.attn_q.weight"].tensor_type.name == "Q8_0"
    assert main(base + ["-o", str(tmp_path / "x.gguf"), "--quant", "Q4_K_X"]) == 1
    assert "Q4_K_M" in capsys.readouterr().err  # the error lists the presets
    assert main(base + ["-o", str(tmp_path / "x.gguf"), "--imatrix", "f.dat"]) == 1
    assert "--quant" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def _write_imatrix_dat_full(path, entries, ncall, chunks, dataset):
    """llama.cpp's legacy imatrix (save_imatrix_legacy): per entry the sums times ncall, then the trailer."""
    body = struct.pack("<i", len(entries))
    for name, w in entries.items():
        b = name.encode()
        body += struct.pack("<i", len(b)) + b + struct.pack("<ii", ncall, len(w))
        body += (np.asarray(w, "<f4") * ncall).astype("<f4").tobytes()
    d = dataset.encode()
    path.write_bytes(body + struct.pack("<ii", chunks, len(d)) + d)


def _llama_quantize_with_imatrix(llama_cpp, src, dst, preset, path, entries, ncall, chunks, dataset):
    """llama_model_quantize as tools/quantize/quantize.cpp calls it with --imatrix: the entries divided by
    ncall (load_imatrix, legacy format), plus its four quantize.imatrix.* key-value overrides."""
    keep = []
    data = (llama_cpp.llama_model_imatrix_data * (len(entries) + 1))()
    for i, (name, w) in enumerate(entries.items()):
        stored = (np.asarray(w, "<f4") * ncall).astype(np.float32)
        arr = np.ascontiguousarray(stored / np.float32(ncall), dtype=np.float32)
        keep += [arr, name.encode()]
        data[i].name, data[i].size = keep[-1], arr.size
        data[i].data = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    overrides = (llama_cpp.llama_model_kv_override * 5)()
    for o, (key, tag, value) in zip(overrides, [
            ("quantize.imatrix.file", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, str(path)),
            ("quantize.imatrix.dataset", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, dataset),
            ("quantize.imatrix.entries_count", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, len(entries)),
            ("quantize.imatrix.chunks_count", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, chunks)]):
        o.key, o.tag = key.encode(), tag
        if tag == llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR:
            o.value.val_str = value.encode()[:127]
        else:
            o.value.val_i64 = value
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    params.imatrix = ctypes.cast(data, type(params.imatrix))
    params.kv_overrides = ctypes.cast(overrides, type(params.kv_overrides))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed with {rc}"


@pytest.mark.parametrize("preset", ["Q4_K_M", "Q2_K"])
def test_one_pass_with_imatrix_equals_llama_quantize(tmp_path, preset):
    # llama-quantize --imatrix: same tensors (types and bytes) and the same quantize.imatrix.* keys.
    llama_cpp = pytest.importorskip("llama_cpp")
    from gguf.constants import GGUFValueType

    from lazyweights.formats.gguf_writer import GGUFValue

    tensors = _model()
    meta = dict(META, **{"llama.feed_forward_length": FFN, "llama.rope.dimension_count": HIDDEN // 4,
                         "llama.attention.layer_norm_rms_epsilon": GGUFValue(1e-5, GGUFValueType.FLOAT32)})
    bf16 = tmp_path / "bf16.gguf"
    _plan(tensors).save(bf16, metadata=meta)
    entries = {n: (np.abs(RNG.standard_normal(a.shape[-1])) + 0.05).astype(np.float32)
               for n, a in tensors.items() if a.ndim == 2 and n != "token_embd.weight"}
    ncall, chunks, dataset = 3, 7, "wiki.train.raw"
    path = tmp_path / "imatrix.dat"
    _write_imatrix_dat_full(path, entries, ncall, chunks, dataset)
    _llama_quantize_with_imatrix(llama_cpp, bf16, tmp_path / "ref.gguf", preset, path, entries, ncall, chunks, dataset)
    _plan(tensors).save(tmp_path / "ours.gguf", metadata=meta, quant=preset, imatrix=str(path))
    (ref_r, ref), (our_r, ours) = _read(tmp_path / "ref.gguf"), _read(tmp_path / "ours.gguf")
    assert set(ref) == set(ours)
    for name in ref:
        assert ours[name].tensor_type == ref[name].tensor_type, name
        assert np.asarray(ours[name].data).tobytes() == np.asarray(ref[name].data).tobytes(), name
    keys = ("general.file_type", "general.quantization_version", "quantize.imatrix.file", "quantize.imatrix.dataset",
            "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count")
    for key in keys:
        assert our_r.fields[key].types == ref_r.fields[key].types, key
        assert bytes(our_r.fields[key].parts[-1]) == bytes(ref_r.fields[key].parts[-1]), key
    assert bytes(our_r.fields["quantize.imatrix.dataset"].parts[-1]) == b"wiki.train.raw"
