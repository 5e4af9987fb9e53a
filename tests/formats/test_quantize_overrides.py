"""llama-quantize's per-tensor controls (`--tensor-type`, `--output-tensor-type`, `--token-embedding-type`,
`--pure`, `--prune-layers`, `--override-kv`) in `Plan.quantize` and `lazyweights convert`, and `--dry-run`.

The judge is llama.cpp itself: `llama_model_quantize` (through llama-cpp-python's ctypes binding) given the same
settings in its params struct (`tt_overrides`, `output_tensor_type`, `token_embedding_type`, `pure`,
`prune_layers`, `kv_overrides`) over a bf16 GGUF of the same weights must write the file lazyweights writes in
one pass: the same tensors (names, types, bytes) and the same metadata (keys in order, types, values).
Bad input: an unknown type name, a malformed override, a pattern that matches nothing.
"""
import ctypes
import importlib.util
import os

import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.constants import GGUFValueType

import lazyweights as lw
from lazyweights.core.errors import KVOverrideError, LazyWeightsError, UnknownTypeError, UsageError
from lazyweights.formats.gguf_quantize import dry_run_report, parse_kv_override, prune_names
from lazyweights.formats.gguf_writer import GGUFValue

N_LAYER, FFN = 4, 512


def _model(hidden=256, tied=False, seed=11):
    """GGUF-named bf16 tensors of a tiny llama (f32 norms), random values."""
    rng = np.random.default_rng(seed)
    bf = lambda *s: (rng.standard_normal(s) * 0.05).astype(ml_dtypes.bfloat16)  # noqa: E731
    t = {"token_embd.weight": bf(320, hidden)}
    if not tied:
        t["output.weight"] = bf(320, hidden)
    t["output_norm.weight"] = (1 + rng.standard_normal(hidden) * 0.1).astype(np.float32)
    for i in range(N_LAYER):
        for n, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden // 2, hidden)),
                         ("attn_v", (hidden // 2, hidden)), ("attn_output", (hidden, hidden)),
                         ("ffn_gate", (FFN, hidden)), ("ffn_up", (FFN, hidden)), ("ffn_down", (hidden, FFN))):
            t[f"blk.{i}.{n}.weight"] = bf(*shape)
        t[f"blk.{i}.attn_norm.weight"] = (1 + rng.standard_normal(hidden) * 0.1).astype(np.float32)
    return t


def _meta(hidden=256):
    return {"general.architecture": "llama", "general.name": "tiny", "llama.block_count": N_LAYER,
            "llama.context_length": 128, "llama.embedding_length": hidden, "llama.feed_forward_length": FFN,
            "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
            "llama.rope.dimension_count": hidden // 4,
            "llama.attention.layer_norm_rms_epsilon": GGUFValue(1e-5, GGUFValueType.FLOAT32)}


def _plan(tensors):
    return lw.plan({n: lw.WeightData.from_numpy(a, n) for n, a in tensors.items()})


def _llama_quantize(src, dst, preset, *, tensor_types=(), output_tensor_type=None, token_embedding_type=None,
                    pure=False, prune_layers=(), kv_overrides=(), imatrix=None):
    """llama_model_quantize with the params tools/quantize/quantize.cpp fills for the same flags. `imatrix`:
    (path, {name: weights}, chunks, dataset) of a legacy .dat written with ncall 1; its four key-value overrides
    follow the --override-kv ones, as tools/quantize appends them."""
    llama_cpp = pytest.importorskip("llama_cpp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    keep = []
    if imatrix is not None:
        path, entries, chunks, dataset = imatrix
        data = (llama_cpp.llama_model_imatrix_data * (len(entries) + 1))()
        for i, (name, w) in enumerate(entries.items()):
            arr = np.ascontiguousarray(w, dtype=np.float32)
            keep += [arr, name.encode()]
            data[i].name, data[i].size = keep[-1], arr.size
            data[i].data = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        params.imatrix = ctypes.cast(data, type(params.imatrix))
        keep.append(data)
        kv_overrides = list(kv_overrides) + [f"quantize.imatrix.file=str:{path}",
                                             f"quantize.imatrix.dataset=str:{dataset}",
                                             f"quantize.imatrix.entries_count=int:{len(entries)}",
                                             f"quantize.imatrix.chunks_count=int:{chunks}"]
    if tensor_types:
        arr = (llama_cpp.llama_model_tensor_override * (len(tensor_types) + 1))()
        for o, (pattern, t) in zip(arr, tensor_types):
            keep.append(pattern.encode())
            o.pattern, o.type = keep[-1], GGMLQuantizationType[t.upper()].value
        arr[len(tensor_types)].pattern = None  # terminator
        params.tt_overrides = ctypes.cast(arr, type(params.tt_overrides))
        keep.append(arr)
    if output_tensor_type:
        params.output_tensor_type = GGMLQuantizationType[output_tensor_type].value
    if token_embedding_type:
        params.token_embedding_type = GGMLQuantizationType[token_embedding_type].value
    params.pure = pure
    if prune_layers:
        ids = (ctypes.c_int32 * (len(prune_layers) + 1))(*sorted(set(prune_layers)), -1)
        params.prune_layers = ctypes.cast(ids, type(params.prune_layers))
        keep.append(ids)
    if kv_overrides:
        arr = (llama_cpp.llama_model_kv_override * (len(kv_overrides) + 1))()
        tags = {"int": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, "float": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT,
                "bool": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL, "str": llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR}
        for o, text in zip(arr, kv_overrides):  # string_parse_kv_override, by hand
            key, rest = text.split("=", 1)
            kind, value = rest.split(":", 1)
            o.key, o.tag = key.encode(), tags[kind]
            if kind == "int":
                o.value.val_i64 = int(value)
            elif kind == "float":
                o.value.val_f64 = float(value)
            elif kind == "bool":
                o.value.val_bool = value == "true"
            else:
                o.value.val_str = value.encode()
        arr[len(kv_overrides)].key = b""  # terminator
        params.kv_overrides = ctypes.cast(arr, type(params.kv_overrides))
        keep.append(arr)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed with {rc}"


def _fields(reader):
    """Every metadata key in file order with its types and its value bytes (the header's own fields left out)."""
    return [(name, tuple(f.types), b"".join(bytes(f.parts[i]) for i in f.data))
            for name, f in reader.fields.items() if not name.startswith("GGUF.")]


def _assert_same_file(ours_path, ref_path):
    ours_r, ref_r = GGUFReader(str(ours_path)), GGUFReader(str(ref_path))
    ours = {t.name: t for t in ours_r.tensors}
    ref = {t.name: t for t in ref_r.tensors}
    assert sorted(ours) == sorted(ref)
    for name, t in ref.items():
        assert ours[name].tensor_type == t.tensor_type, (name, ours[name].tensor_type.name, t.tensor_type.name)
        assert [int(d) for d in ours[name].shape] == [int(d) for d in t.shape], name
        assert np.asarray(ours[name].data).tobytes() == np.asarray(t.data).tobytes(), name
    assert _fields(ours_r) == _fields(ref_r)
    return ours_r, ours


# Each case: (model kwargs, preset, settings). Every setting changes the file (checked below against the same
# preset without it), so a setting that is ignored fails.
CASES = {
    # blk.0's attn_v and ffn_down by hand: llama.cpp's running counters skip them, so blk.2's attn_v is no longer
    # "every third" (Q4_K, not Q6_K); a float type; an alternation; the first matching pattern wins
    "tensor-type": ({}, "Q4_K_M", dict(tensor_types=[(r"blk\.0\.attn_v", "q8_0"), (r"blk\.0\.ffn_down", "Q5_0"),
                                                     ("attn_q", "bf16"), ("ffn_(up|gate)", "Q4_0"),
                                                     ("blk.1.ffn_up", "Q8_0")])),
    "tensor-type-fallback": (dict(hidden=320, tied=True), "Q4_K_M",
                             dict(tensor_types=[("attn_output", "Q6_K"), ("token_embd", "Q4_K")])),
    # every other block type lazyweights writes, each by a pattern; then on 320-wide rows, their fallbacks
    "tensor-type-every-encoding": ({}, "Q6_K",
                                   dict(tensor_types=[("attn_q", "IQ4_XS"), ("attn_k", "TQ1_0"), ("attn_v", "TQ2_0"),
                                                      ("attn_output", "IQ4_NL"), ("ffn_up", "Q4_1"),
                                                      ("ffn_gate", "Q5_1"), ("ffn_down", "Q2_K"),
                                                      ("token_embd", "F16")])),
    "tensor-type-encoding-fallbacks": (dict(hidden=320), "Q4_K_M",
                                       dict(tensor_types=[("attn_q", "IQ4_XS"), ("attn_k", "TQ1_0"),
                                                          ("attn_v", "TQ2_0"), ("ffn_up", "Q3_K")])),
    "output-tensor-type": ({}, "Q4_K_M", dict(output_tensor_type="Q4_0")),
    "output-tensor-type-tied": (dict(tied=True), "Q3_K_M", dict(output_tensor_type="Q5_K")),
    "token-embedding-type": ({}, "Q4_K_M", dict(token_embedding_type="Q8_0")),
    "both-types-tied": (dict(tied=True), "Q4_K_M", dict(output_tensor_type="Q5_0", token_embedding_type="F16")),
    "pure": ({}, "Q4_K_M", dict(pure=True)),
    "pure-with-tensor-type": (dict(tied=True), "Q3_K_M", dict(pure=True, tensor_types=[("attn_v", "Q6_K")])),
    "prune-layers": ({}, "Q4_K_M", dict(prune_layers=[1])),
    "prune-first-and-last": ({}, "Q3_K_M", dict(prune_layers=[0, 3])),
    "override-kv": ({}, "Q8_0", dict(kv_overrides=["llama.context_length=int:4096", "general.name=str:renamed",
                                                    "tiny.flag=bool:true", "tiny.scale=float:0.125",
                                                    "tiny.neg=int:-7"])),
    # the loader reads hyperparameters through the overrides: 1 KV head makes n_gqa 4, so Q2_K's attn_v is Q4_K
    "override-kv-hparams": ({}, "Q2_K", dict(kv_overrides=["llama.attention.head_count_kv=int:1"])),
    "all-together": ({}, "Q4_K_M", dict(tensor_types=[("ffn_down", "Q6_K")], output_tensor_type="Q8_0",
                                        token_embedding_type="Q4_K", prune_layers=[2],
                                        kv_overrides=["general.name=str:pruned"])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_override_equals_llama_model_quantize(tmp_path, case):
    pytest.importorskip("llama_cpp")
    model_kw, preset, settings = CASES[case]
    tensors = _model(**model_kw)
    meta = _meta(model_kw.get("hidden", 256))
    bf16 = tmp_path / "bf16.gguf"
    _plan(tensors).save(bf16, metadata=meta)
    ref_settings = dict(settings)
    ref_settings["tensor_types"] = list(settings.get("tensor_types", ()))
    _llama_quantize(bf16, tmp_path / "ref.gguf", preset, **ref_settings)
    _plan(tensors).save(tmp_path / "ours.gguf", metadata=meta, quant=preset, quant_options=settings)
    reader, ours = _assert_same_file(tmp_path / "ours.gguf", tmp_path / "ref.gguf")
    # the setting mattered: without it the file differs (a setting that is ignored cannot pass)
    _plan(tensors).save(tmp_path / "plain.gguf", metadata=meta, quant=preset)
    plain_r = GGUFReader(str(tmp_path / "plain.gguf"))
    plain = {t.name: (t.tensor_type, np.asarray(t.data).tobytes()) for t in plain_r.tensors}
    assert ({n: (t.tensor_type, np.asarray(t.data).tobytes()) for n, t in ours.items()} != plain
            or _fields(reader) != _fields(plain_r)), case


def test_prune_renumbers_blocks_and_fixes_block_count(tmp_path):
    tensors = _model()
    q, meta = _plan(tensors).quantize("Q8_0", _meta(), prune_layers="1", with_metadata=True)
    assert meta["llama.block_count"].value == 3 and list(meta)[-1] == "llama.block_count"
    assert "blk.3.attn_q.weight" not in q.tensors
    # blk.2 became blk.1: its values, quantized
    got = q.tensors["blk.1.attn_q.weight"].dequantize().to_numpy()
    assert np.allclose(got, tensors["blk.2.attn_q.weight"].astype(np.float32), atol=2e-3)
    assert not np.allclose(got, tensors["blk.1.attn_q.weight"].astype(np.float32), atol=2e-3)
    names, count = prune_names(["blk.0.a", "blk.1.a", "blk.2.a", "blk.3.a", "x"], [0, 2])
    assert names == {"x": "x", "blk.0.a": None, "blk.1.a": "blk.0.a", "blk.2.a": None, "blk.3.a": "blk.1.a"}
    assert count == 2


def test_bad_input_is_named(tmp_path):
    p = _plan(_model())
    meta = _meta()
    with pytest.raises(UnknownTypeError, match=r"q9_k.*Q4_K.*Q8_0") as e:
        p.quantize("Q4_K_M", meta, tensor_types={"attn_q": "q9_k"})
    assert isinstance(e.value, ValueError) and isinstance(e.value, LazyWeightsError)
    assert "attn_q" in str(e.value)
    with pytest.raises(UnknownTypeError, match="--output-tensor-type"):
        p.quantize("Q4_K_M", meta, output_tensor_type="Q4_K_Z")
    with pytest.raises(UnknownTypeError, match="--token-embedding-type.*IQ2_XS"):
        p.quantize("Q4_K_M", meta, token_embedding_type="IQ2_XS")  # a real ggml type lazyweights cannot write
    with pytest.raises(UsageError, match=r"\(attn"):
        p.quantize("Q4_K_M", meta, tensor_types={"(attn": "Q8_0"})
    for bad, why in (("no-equals", "no '='"), ("k=integer:5", "TYPE must be"), ("k=int:five", "not a int"),
                     ("k=bool:yes", "not a bool"), ("=int:1", "1 to 127"), ("k" * 128 + "=int:1", "1 to 127"),
                     ("k=str:" + "x" * 128, "127")):
        with pytest.raises(KVOverrideError, match=why):
            parse_kv_override(bad)
        with pytest.raises(KVOverrideError):
            p.quantize("Q4_K_M", meta, kv_overrides=[bad])
    with pytest.raises(KVOverrideError, match="general.file_type"):
        p.quantize("Q4_K_M", meta, kv_overrides=["general.file_type=int:1"])
    with pytest.raises(UsageError, match="-1"):
        p.quantize("Q4_K_M", meta, prune_layers="1,-1")
    with pytest.warns(UserWarning, match=r"--tensor-type attn_z=Q8_0: the pattern matches none"):
        q = p.quantize("Q4_K_M", meta, tensor_types={"attn_z": "Q8_0"})
    assert q.tensors["blk.0.attn_q.weight"].quantization_encoding.name == "Q4_K"
    with pytest.warns(UserWarning, match="output_norm"):  # a norm is never quantized: its pattern changes nothing
        p.quantize("Q4_K_M", meta, tensor_types={"output_norm": "Q8_0"})
    with pytest.raises(UsageError, match="quant=PRESET"):
        p.save(tmp_path / "x.gguf", metadata=meta, quant_options={"pure": True})
    assert not os.listdir(tmp_path)


def test_dry_run_reads_nothing_and_sizes_the_file(tmp_path):
    tensors = _model()
    src = tmp_path / "bf16.gguf"
    _plan(tensors).save(src, metadata=_meta())
    w = lw.load_weights([str(src)])
    q, meta = lw.plan({n: w[n].data() for n, _ in w.items()}).quantize(
        "Q4_K_M", _meta(), tensor_types={"attn_q": "Q8_0"}, with_metadata=True)
    os.truncate(src, 0)  # nothing may be read: the report comes from the header alone
    report = dry_run_report(q.tensors, meta)
    lines = report.splitlines()
    row = next(ln for ln in lines if ln.startswith("blk.0.attn_q.weight"))
    assert row.split()[1:4] == ["Q8_0", "[256,", "256]"] and "69,632 B" in row and "8.50 bpw" in row
    row = next(ln for ln in lines if ln.startswith("output_norm.weight"))
    assert "F32" in row and "1,024 B" in row and "32.00 bpw" in row
    # the total is the size of the file Plan.save writes
    src.unlink()
    _plan(tensors).save(tmp_path / "q.gguf", metadata=_meta(), quant="Q4_K_M",
                        quant_options={"tensor_types": {"attn_q": "Q8_0"}})
    size = os.path.getsize(tmp_path / "q.gguf")
    assert f"file {size:,} B" in lines[-1]
    data = sum(int(t.n_bytes) for t in GGUFReader(str(tmp_path / "q.gguf")).tensors)
    assert f"{data:,} B of tensor data" in lines[-1]


# --- the command line ------------------------------------------------------------------------------------------
def test_quantize_command_equals_llama_quantize(tmp_path, capsys):
    # `lazyweights quantize` with llama-quantize's flags; its pattern lowercased as llama-quantize's parser does
    pytest.importorskip("llama_cpp")
    from lazyweights.tools.cli import main

    src = tmp_path / "bf16.gguf"
    _plan(_model(tied=True)).save(src, metadata=_meta())
    (tmp_path / "types.txt").write_text("blk\\.3\\.attn_v=q5_0\n  ffn_up=Q4_1\n")
    flags = ["--tensor-type", r"BLK\.[01]\.ATTN_V=q8_0", "--tensor-type-file", str(tmp_path / "types.txt"),
             "--token-embedding-type", "q6_k", "--prune-layers", "2", "--override-kv", "llama.context_length=int:64"]
    assert main(["quantize", *flags, "--no-progress", str(src), str(tmp_path / "ours.gguf"), "q4_k_m"]) == 0
    _llama_quantize(src, tmp_path / "ref.gguf", "Q4_K_M",
                    tensor_types=[(r"blk\.[01]\.attn_v", "Q8_0"), (r"blk\.3\.attn_v", "Q5_0"), ("ffn_up", "Q4_1")],
                    token_embedding_type="Q6_K", prune_layers=[2], kv_overrides=["llama.context_length=int:64"])
    _, ours = _assert_same_file(tmp_path / "ours.gguf", tmp_path / "ref.gguf")
    assert ours["blk.0.attn_v.weight"].tensor_type.name == "Q8_0" and "blk.3.attn_q.weight" not in ours
    capsys.readouterr()
    assert main(["quantize", *flags, "--dry-run", str(src), str(tmp_path / "dry.gguf"), "Q4_K_M"]) == 0
    printed = capsys.readouterr()
    # patterns see the renumbered names, in llama.cpp as here: after pruning block 2 there is no blk.3
    assert "blk.2.attn_v.weight" in printed.out and "=Q5_0" not in printed.out
    assert r"warning: --tensor-type blk\.3\.attn_v=Q5_0: the pattern matches none" in printed.err
    out = printed.out
    assert f"file {os.path.getsize(tmp_path / 'ours.gguf'):,} B" in out
    assert not (tmp_path / "dry.gguf").exists()
    assert main(["quantize", str(tmp_path / "ours.gguf"), str(tmp_path / "again.gguf"), "Q8_0"]) == 1
    assert "'token_embd.weight' is already quantized (Q6_K" in capsys.readouterr().err
    assert main(["quantize", str(tmp_path / "types.txt"), str(tmp_path / "again.gguf"), "Q8_0"]) == 1
    assert "reads a GGUF" in capsys.readouterr().err
    assert not (tmp_path / "again.gguf").exists()


def test_convert_flags_and_their_errors(tmp_path, capsys, child_env):
    from lazyweights.tools.cli import main

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=320, max_position_embeddings=64)
    torch.manual_seed(3)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    base = ["convert", "lazyweights.adapters:convert_hf_to_gguf", str(tmp_path / "hf"), "--no-tokenizer",
            "--no-progress"]
    flags = ["--tensor-type", "attn_k=bf16", "--output-tensor-type", "Q8_0", "--pure", "--override-kv",
             "general.name=str:tiny-pure"]
    assert main(base + ["-o", str(tmp_path / "ours.gguf"), "--quant", "Q4_K_M", *flags]) == 0
    _, ours = _read_tensors(tmp_path / "ours.gguf")
    assert ours["blk.1.attn_k.weight"].tensor_type.name == "BF16" and ours["output.weight"].tensor_type.name == "Q8_0"
    assert ours["blk.0.attn_v.weight"].tensor_type.name == "Q4_K"  # --pure: no Q6_K for the first layer
    if importlib.util.find_spec("llama_cpp") is not None:  # the rest runs without llama.cpp
        assert main(base + ["-o", str(tmp_path / "bf16.gguf")]) == 0
        _llama_quantize(tmp_path / "bf16.gguf", tmp_path / "ref.gguf", "Q4_K_M", tensor_types=[("attn_k", "BF16")],
                        output_tensor_type="Q8_0", pure=True, kv_overrides=["general.name=str:tiny-pure"])
        _assert_same_file(tmp_path / "ours.gguf", tmp_path / "ref.gguf")
    capsys.readouterr()
    assert main(base + ["-o", str(tmp_path / "dry.gguf"), "--quant", "Q4_K_M", *flags, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "blk.1.attn_k.weight" in out and "BF16" in out and "total: " in out
    assert not (tmp_path / "dry.gguf").exists()
    for extra, message in ((["--pure"], "--pure: used with --quant"),
                           (["--quant", "Q4_K_M", "--tensor-type", "attn_k=Q7_K"], "Q4_K, Q5_0"),
                           (["--quant", "Q4_K_M", "--override-kv", "general.name=string:x"], "TYPE must be"),
                           (["--quant", "Q4_K_M", "--prune-layers", "a"], "invalid layer id")):
        assert main(base + ["-o", str(tmp_path / "x.gguf"), *extra]) == 1, extra
        assert message in capsys.readouterr().err, extra
    assert main(base + ["-o", str(tmp_path / "w.gguf"), "--quant", "Q8_0", "--tensor-type", "nothing=Q4_0"]) == 0
    assert "warning: --tensor-type nothing=Q4_0: the pattern matches none" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def _read_tensors(path):
    r = GGUFReader(str(path))
    return r, {t.name: t for t in r.tensors}


def test_gguf_layout_of_weight_data_reads_nothing(tmp_path):
    # GGUFLayout.plan used to probe `value.data` first, and a WeightData's `.data` is its values: every tensor was
    # computed just to lay out the header
    from lazyweights.formats.gguf_writer import GGUFLayout

    src = tmp_path / "bf16.gguf"
    _plan(_model()).save(src, metadata=_meta())
    w = lw.load_weights([str(src)])
    tensors = {n: w[n].data().astype(lw.DType.float16) for n, _ in w.items()}
    os.truncate(src, 0)  # a read now fails (SourceChangedError)
    layout = GGUFLayout.plan(tensors, _meta())
    assert layout.slots["blk.0.attn_q.weight"].nbytes == 256 * 256 * 2


def _write_imatrix_dat(path, entries, chunks, dataset):
    """llama.cpp's legacy imatrix (save_imatrix_legacy), ncall 1: entries, then chunks and the dataset name."""
    import struct

    body = struct.pack("<i", len(entries))
    for name, w in entries.items():
        b = name.encode()
        body += struct.pack("<i", len(b)) + b + struct.pack("<ii", 1, len(w)) + np.asarray(w, "<f4").tobytes()
    d = dataset.encode()
    path.write_bytes(body + struct.pack("<ii", chunks, len(d)) + d)


def test_imatrix_with_prune_and_overrides_equals_llama_quantize(tmp_path):
    # the importance matrix is looked up by the names before pruning (llama.cpp's remap_imatrix), and its
    # quantize.imatrix.* keys follow the --override-kv ones
    pytest.importorskip("llama_cpp")
    tensors = _model()
    rng = np.random.default_rng(5)
    entries = {n: (np.abs(rng.standard_normal(a.shape[-1])) + 0.05).astype(np.float32)
               for n, a in tensors.items() if a.ndim == 2 and n != "token_embd.weight"}
    path = tmp_path / "imatrix.dat"
    _write_imatrix_dat(path, entries, 9, "calib.txt")
    src = tmp_path / "bf16.gguf"
    _plan(tensors).save(src, metadata=_meta())
    settings = dict(prune_layers=[1], tensor_types=[("attn_q", "Q4_0")], kv_overrides=["general.name=str:im"])
    _llama_quantize(src, tmp_path / "ref.gguf", "Q4_K_M", imatrix=(str(path), entries, 9, "calib.txt"), **settings)
    _plan(tensors).save(tmp_path / "ours.gguf", metadata=_meta(), quant="Q4_K_M", imatrix=str(path),
                        quant_options=settings)
    reader, ours = _assert_same_file(tmp_path / "ours.gguf", tmp_path / "ref.gguf")
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert keys[-6:] == ["general.name", "quantize.imatrix.file", "quantize.imatrix.dataset",
                         "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count", "llama.block_count"]
    # blk.1 (formerly blk.2) was quantized with blk.2's importance: with blk.1's the bytes differ
    from lazyweights.core.quantization import QuantizationEncoding as Q
    from lazyweights.quant import quantize as quantize_rows

    rows = tensors["blk.2.ffn_up.weight"].astype(np.float32)
    got = np.asarray(ours["blk.1.ffn_up.weight"].data).tobytes()
    assert got == quantize_rows(Q.Q4_K, rows, imatrix=entries["blk.2.ffn_up.weight"]).tobytes()
    assert got != quantize_rows(Q.Q4_K, rows, imatrix=entries["blk.1.ffn_up.weight"]).tobytes()
