"""compressed-tensors checkpoints read as dense weights, judged by compressed-tensors itself.

Each case quantizes random weights with compressed-tensors' own qparams (`calculate_qparams`,
`generate_gparam`), compresses them with its own compressor class for the format, saves the compressed
module as a checkpoint folder with a `quantization_config`, and compares lazyweights' dense weight with
the compressor's `decompress`: bit for bit (the arithmetic is the same IEEE operations in the same order).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("compressed_tensors")
pytest.importorskip("safetensors")

from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from lazyweights import DType, load_weights, plan  # noqa: E402
from lazyweights.core.errors import ScaleShapeError, UnsupportedCompressionError  # noqa: E402

MODULE = "model.layers.0.mlp.down_proj"


def _qparams(w: torch.Tensor, args: QuantizationArgs, global_scale=None):
    """compressed-tensors' scale and zero point for `w` under `args` (what its observers compute)."""
    n, k = w.shape
    strategy = str(getattr(args.strategy, "value", args.strategy))
    if strategy in ("group", "tensor_group"):
        g = w.reshape(n, k // args.group_size, args.group_size)
        lo, hi = g.amin(-1), g.amax(-1)
    elif strategy == "channel":
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    elif strategy == "block":
        bh, bw = args.block_structure
        pad = torch.nn.functional.pad(w.float(), (0, -k % bw, 0, -n % bh)).to(w.dtype)
        b = pad.reshape(pad.shape[0] // bh, bh, pad.shape[1] // bw, bw)
        lo, hi = b.amin((1, 3)), b.amax((1, 3))
    else:
        lo, hi = w.amin().reshape(1), w.amax().reshape(1)
    return calculate_qparams(lo, hi, args, global_scale=global_scale)


def _write(folder, fmt: str, scheme: QuantizationScheme, tensors: dict, extra_config: dict | None = None):
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
    qc = {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
          "config_groups": {"group_0": json.loads(scheme.model_dump_json())}, "ignore": ["lm_head"]}
    qc.update(extra_config or {})
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "quantization_config": qc}, fh)
    return folder


def _case(tmp_path, fmt: str, args: QuantizationArgs, shape=(40, 256), dtype=torch.bfloat16, seed=0,
          nvfp4=False):
    """(folder, compressed-tensors' own dense weight)."""
    torch.manual_seed(seed)
    w = (torch.randn(shape) * 0.05).to(dtype)
    w[0, :7] = 0.0  # exact zeros (and a negative zero) exercise the sign handling
    w[1, :3] = -0.0
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    g = generate_gparam(w.amin(), w.amax()) if nvfp4 else None
    scale, zp = _qparams(w, args, global_scale=g)
    sd = {"weight": w, "weight_scale": scale}
    if not args.symmetric:
        sd["weight_zero_point"] = zp
    if g is not None:
        sd["weight_global_scale"] = g
    compressor = BaseCompressor.get_value_from_registry(fmt)
    comp = compressor.compress(sd, scheme)
    want = compressor.decompress(dict(comp), scheme)["weight"]
    tensors = {f"{MODULE}.{k}": v for k, v in comp.items()}
    tensors["model.norm.weight"] = torch.ones(shape[1], dtype=dtype)
    folder = _write(str(tmp_path / fmt), fmt, scheme, tensors)
    return folder, want, tensors


def _bits(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous()
    if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        return t.view(torch.int16).numpy()
    return t.view(torch.int32).numpy()


def _assert_same(folder: str, want: torch.Tensor, scheduler: str = "threads", nonzero: float = 0.5):
    weights = load_weights(folder)
    names = [n for n, _ in weights.items()]
    assert f"{MODULE}.weight" in names and "model.norm.weight" in names
    assert not [n for n in names if n.endswith(("_scale", "_packed", "_shape", "_zero_point"))], names
    data = weights[f"{MODULE}.weight"].data()
    assert data.shape == tuple(want.shape)
    assert data.dtype is {torch.bfloat16: DType.bfloat16, torch.float16: DType.float16,
                          torch.float32: DType.float32}[want.dtype]
    got = plan({"w": data}).materialize(scheduler=scheduler)["w"]
    want_bits = _bits(want)
    got_bits = np.ascontiguousarray(got).view(want_bits.dtype)
    assert np.count_nonzero(want_bits) > want_bits.size * nonzero  # not a test of zeros
    np.testing.assert_array_equal(got_bits, want_bits)


def _int(num_bits, strategy, group_size=None, symmetric=True):
    return QuantizationArgs(num_bits=num_bits, type="int", strategy=strategy, group_size=group_size,
                            symmetric=symmetric)


@pytest.mark.parametrize("num_bits", [4, 8])
@pytest.mark.parametrize("strategy,group_size,symmetric", [
    ("group", 128, True), ("group", 32, False), ("channel", None, True), ("channel", None, False),
    ("tensor", None, True),
])
def test_pack_quantized_equals_compressed_tensors(tmp_path, num_bits, strategy, group_size, symmetric):
    folder, want, _ = _case(tmp_path, "pack-quantized", _int(num_bits, strategy, group_size, symmetric))
    _assert_same(folder, want)


@pytest.mark.parametrize("shape", [(24, 96), (33, 100)])
def test_pack_quantized_odd_shapes(tmp_path, shape):
    """Columns not a multiple of 8 (a partial last int32 word) and rows not a multiple of 8 (the packed
    zero point's partial word)."""
    folder, want, _ = _case(tmp_path, "pack-quantized", _int(4, "channel", None, False), shape=shape)
    _assert_same(folder, want)


@pytest.mark.parametrize("scheduler", ["sync", "reference"])
def test_pack_quantized_every_executor(tmp_path, scheduler):
    folder, want, _ = _case(tmp_path, "pack-quantized", _int(4, "group", 32, False), dtype=torch.float16)
    _assert_same(folder, want, scheduler)


@pytest.mark.parametrize("preset,shape", [("FP8_BLOCK", (300, 200)), ("FP8", (40, 256)), ("FP8_DYNAMIC", (40, 256))])
def test_float_quantized_equals_compressed_tensors(tmp_path, preset, shape):
    """FP8 e4m3 with 128x128 block scales (partial blocks both ways), a per-tensor and a per-channel scale."""
    scheme = preset_name_to_scheme(preset, ["Linear"])
    folder, want, _ = _case(tmp_path, "float-quantized", scheme.weights, shape=shape)
    _assert_same(folder, want)


def test_float_quantized_float32_scales(tmp_path):
    """A float32 model: the scales are float32 and so is the dense weight (two roundings, as in torch)."""
    scheme = preset_name_to_scheme("FP8_BLOCK", ["Linear"])
    folder, want, _ = _case(tmp_path, "float-quantized", scheme.weights, shape=(130, 260), dtype=torch.float32)
    assert want.dtype == torch.float32
    _assert_same(folder, want)


@pytest.mark.parametrize("args", [_int(8, "channel"), _int(8, "group", 64, False), _int(8, "tensor")])
def test_naive_quantized_equals_compressed_tensors(tmp_path, args):
    folder, want, _ = _case(tmp_path, "naive-quantized", args)
    _assert_same(folder, want)


def test_nvfp4_equals_compressed_tensors(tmp_path):
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    folder, want, _ = _case(tmp_path, "nvfp4-pack-quantized", scheme.weights, nvfp4=True)
    _assert_same(folder, want)


def test_mxfp4_equals_compressed_tensors(tmp_path):
    scheme = preset_name_to_scheme("MXFP4A16", ["Linear"])
    folder, want, _ = _case(tmp_path, "mxfp4-pack-quantized", scheme.weights, shape=(40, 96))
    _assert_same(folder, want)


def test_actorder_g_idx(tmp_path):
    """`weight_g_idx` (GPTQ activation order, written by compressed-tensors before 0.20): column k takes the
    scale and zero point of group g_idx[k]. compressed-tensors 0.20 no longer reads it, so the judge is its
    own arithmetic applied per column: its unpacking (`unpack_from_int32`) and `(q - zp) * s` in the scale's
    dtype."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    folder, _, tensors = _case(tmp_path, "pack-quantized", _int(4, "group", 32, False))
    k = 256
    g_idx = torch.randperm(k, generator=torch.Generator().manual_seed(3)) % (k // 32)
    tensors[f"{MODULE}.weight_g_idx"] = g_idx.to(torch.int32)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    shape = tuple(tensors[f"{MODULE}.weight_shape"].tolist())
    q = unpack_from_int32(tensors[f"{MODULE}.weight_packed"], 4, shape)
    scale = tensors[f"{MODULE}.weight_scale"]
    zp = unpack_from_int32(tensors[f"{MODULE}.weight_zero_point"], 4, (shape[0], scale.shape[1]), packed_dim=0)
    want = (q.to(scale.dtype) - zp[:, g_idx].to(scale.dtype)) * scale[:, g_idx]
    _assert_same(folder, want)


def test_dense_weights_feed_plans_lazily(tmp_path):
    """The dense weight is a graph over the stored tensors: nothing but weight_shape is read to build it,
    it casts and saves like any weight, and `decompress=False` gives the stored tensors."""
    folder, want, _ = _case(tmp_path, "pack-quantized", _int(4, "group", 128))
    weights = load_weights(folder)
    data = weights[f"{MODULE}.weight"].data()
    text = plan({"w": data.astype(DType.float32)}).explain()
    assert "weight_packed" in text and "weight_scale" in text and "dequantize[Q4_0" in text
    out = str(tmp_path / "dense")
    plan({n: w.data() for n, w in weights.items()}).save(out)
    from safetensors.numpy import load_file

    saved = load_file(os.path.join(out, "model.safetensors"))
    np.testing.assert_array_equal(saved[f"{MODULE}.weight"].view(np.int16), _bits(want))
    raw = load_weights(folder, decompress=False)
    assert f"{MODULE}.weight_packed" in [n for n, _ in raw.items()]


def test_unknown_format_is_named(tmp_path):
    """Formats and schemes this reader does not decompress are refused at open, naming the tensor and value."""
    folder, _, tensors = _case(tmp_path, "pack-quantized", _int(4, "group", 128))
    scheme = QuantizationScheme(targets=["Linear"], weights=_int(4, "group", 128))
    _write(folder, "marlin-24", scheme, tensors)
    with pytest.raises(UnsupportedCompressionError, match=f"{MODULE}.weight_packed: .*'marlin-24'.* is refused"):
        load_weights(folder)
    _write(folder, "bitpacked-9000", scheme, tensors)
    with pytest.raises(UnsupportedCompressionError,
                       match=f"{MODULE}.weight_packed: .*'bitpacked-9000'.*not supported; supported: pack-quantized"):
        load_weights(folder)
    fp4 = QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=128)
    _write(folder, "pack-quantized", QuantizationScheme(targets=["Linear"], weights=fp4), tensors)
    with pytest.raises(UnsupportedCompressionError, match="pack-quantized float4.*supported: int1, int2"):
        load_weights(folder)


def test_scale_shape_mismatch_is_named(tmp_path):
    folder, _, tensors = _case(tmp_path, "pack-quantized", _int(4, "group", 128))
    tensors[f"{MODULE}.weight_scale"] = tensors[f"{MODULE}.weight_scale"][:, :1].contiguous()
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    weights = load_weights(folder)
    with pytest.raises(ScaleShapeError, match=rf"{MODULE}.weight_scale: shape \[40, 1\] .*weight \[40, 256\]"
                                              rf".*expected \[40, 2\]"):
        weights[f"{MODULE}.weight"].data()


# --- a tiny transformers Llama, compressed by ModelCompressor --------------------------------------------
def _compressed_llama(folder: str, preset: str):
    """A tiny random Llama quantized with `preset` (qparams from compressed-tensors' own calculate_qparams /
    generate_gparam), compressed by ModelCompressor and saved as vLLM loads it; returns compressed-tensors'
    own decompression of the model (ModelCompressor.decompress_model), as a state dict."""
    transformers = pytest.importorskip("transformers")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    qcfg = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
                              ignore=["lm_head"])
    apply_quantization_config(model, qcfg)
    with torch.no_grad():
        for _, m in model.named_modules():
            scheme = getattr(m, "quantization_scheme", None)
            if scheme is None:
                continue
            g = None
            if hasattr(m, "weight_global_scale"):
                g = generate_gparam(m.weight.amin(), m.weight.amax())
                m.weight_global_scale.data = g.to(m.weight_global_scale.dtype)
            scale, zp = _qparams(m.weight.data, scheme.weights, global_scale=g)
            m.weight_scale.data = scale.to(m.weight_scale.dtype).reshape(m.weight_scale.shape)
            if hasattr(m, "weight_zero_point"):
                m.weight_zero_point.data = zp.to(m.weight_zero_point.dtype).reshape(m.weight_zero_point.shape)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(folder)
    compressor.decompress_model(model)
    return {k: v.contiguous() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM", "W8A16", "FP8_BLOCK", "NVFP4A16", "MXFP4A16"])
def test_model_compressor_checkpoint_equals_decompress_model(tmp_path, preset):
    folder = str(tmp_path / preset)
    want = _compressed_llama(folder, preset)
    weights = load_weights(folder)
    names = [n for n, _ in weights.items()]
    # the dense model's tensors, no quantization parameters
    assert sorted(names) == sorted(n for n in want if not n.rsplit(".", 1)[1].startswith("weight_"))
    got = plan({n: weights[n].data() for n in names}).materialize()
    for n in names:
        np.testing.assert_array_equal(np.asarray(got[n]).view(np.int16), want[n].view(torch.int16).numpy(), n)


@pytest.mark.parametrize("preset", ["W4A16", "FP8_BLOCK"])
def test_compressed_checkpoint_to_gguf_in_one_pass(tmp_path, preset):
    """compressed folder -> bf16 GGUF and Q4_K_M GGUF in one pass each: the same tensors and metadata as the
    GGUFs of a plain bf16 folder holding compressed-tensors' decompression."""
    from safetensors.torch import save_file as save_torch

    from lazyweights.adapters import export_gguf

    folder, dense = str(tmp_path / preset), str(tmp_path / "dense")
    want = _compressed_llama(folder, preset)
    os.makedirs(dense)
    keep = {n: t for n, t in want.items() if not n.rsplit(".", 1)[1].startswith("weight_")}
    save_torch(keep, os.path.join(dense, "model.safetensors"))
    with open(os.path.join(folder, "config.json")) as fh:
        cfg = json.load(fh)
    cfg.pop("quantization_config")
    with open(os.path.join(dense, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    for quant in (None, "Q4_K_M"):
        kw = {"quant": quant} if quant else {}
        a, b = str(tmp_path / f"ct-{quant}.gguf"), str(tmp_path / f"dense-{quant}.gguf")
        export_gguf(folder, a, tokenizer=False, **kw)
        export_gguf(dense, b, tokenizer=False, **kw)
        ga, gb = load_weights(a), load_weights(b)
        assert sorted(ga.records) == sorted(gb.records)
        for n, rec in ga.records.items():
            other = gb.records[n]
            assert (rec.encoding, rec.dtype, rec.shape) == (other.encoding, other.dtype, other.shape), n
            np.testing.assert_array_equal(rec.array(), other.array(), n)
        assert {k: str(v) for k, v in ga.metadata.items()} == {k: str(v) for k, v in gb.metadata.items()}
        if quant:
            assert {r.encoding.name for r in ga.records.values() if r.encoding} == {"Q4_K", "Q6_K"}


def test_opening_reads_only_weight_shape(tmp_path, monkeypatch):
    """load_weights and .data() read the two-integer weight_shape tensors and nothing else: no packed bytes,
    no scales (reads counted on the records and on the files' byte ranges)."""
    from lazyweights.formats.source import SourceFile, TensorRecord

    folder, want, _ = _case(tmp_path, "pack-quantized", _int(4, "group", 32, False))
    read: list = []
    real_array, real_view = TensorRecord.array, SourceFile.view
    monkeypatch.setattr(TensorRecord, "array",
                        lambda self, *a, **k: read.append(self.name) or real_array(self, *a, **k))
    monkeypatch.setattr(SourceFile, "view", lambda self, off, n: read.append((off, n)) or real_view(self, off, n))
    weights = load_weights(folder)
    data = weights[f"{MODULE}.weight"].data().astype(DType.float32)
    shape_rec = load_weights(folder, decompress=False).records[f"{MODULE}.weight_shape"]
    assert read == [shape_rec.name, (shape_rec.offset, shape_rec.nbytes)], read
    del read[:]
    weights.prefetch()
    got = plan({"w": data}).materialize()["w"]
    assert read  # materializing does read
    np.testing.assert_array_equal(got, want.float().numpy())


def test_mixed_precision_groups_by_regex(tmp_path):
    """A `mixed-precision` config (as llm-compressor writes when groups differ): each group names its modules
    by `re:` targets and carries its own format; each module gets its group's decompression."""
    fp8 = preset_name_to_scheme("FP8_BLOCK", ["re:.*mlp.*"])
    int4 = QuantizationScheme(targets=["re:.*self_attn.*"], weights=_int(4, "group", 32, False))
    tensors, want = {}, {}
    for module, scheme, fmt in [("model.layers.0.mlp.up_proj", fp8, "float-quantized"),
                                ("model.layers.0.self_attn.q_proj", int4, "pack-quantized")]:
        torch.manual_seed(len(module))
        w = (torch.randn(96, 256) * 0.05).to(torch.bfloat16)
        scale, zp = _qparams(w, scheme.weights)
        sd = {"weight": w, "weight_scale": scale}
        if not scheme.weights.symmetric:
            sd["weight_zero_point"] = zp
        compressor = BaseCompressor.get_value_from_registry(fmt)
        comp = compressor.compress(sd, scheme)
        want[module + ".weight"] = compressor.decompress(dict(comp), scheme)["weight"]
        tensors.update({f"{module}.{k}": v for k, v in comp.items()})
        scheme.format = fmt
    folder = str(tmp_path / "mixed")
    _write(folder, "mixed-precision", fp8, tensors,
           {"config_groups": {"group_0": json.loads(fp8.model_dump_json()),
                              "group_1": json.loads(int4.model_dump_json())}})
    weights = load_weights(folder)
    assert sorted(n for n, _ in weights.items()) == sorted(want)
    for name, ref in want.items():
        got = plan({"w": weights[name].data()}).materialize()["w"]
        np.testing.assert_array_equal(np.asarray(got).view(np.int16), _bits(ref), name)


@pytest.mark.parametrize("symmetric", [True, False])
def test_pack_quantized_stacked_experts(tmp_path, symmetric):
    """A 3-D weight (fused MoE experts, [experts, rows, cols]): compressed-tensors packs each expert's slice,
    zero points along rows; the dense weight equals its decompression."""
    args = _int(4, "group", 32, symmetric)
    torch.manual_seed(1)
    w = (torch.randn(2, 40, 128) * 0.05).to(torch.bfloat16)
    g = w.reshape(2, 40, 4, 32)
    scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
    sd = {"weight": w, "weight_scale": scale}
    if not symmetric:
        sd["weight_zero_point"] = zp
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    compressor = BaseCompressor.get_value_from_registry("pack-quantized")
    comp = compressor.compress(sd, scheme)
    want = compressor.decompress(dict(comp), scheme)["weight"]
    folder = _write(str(tmp_path / "moe"), "pack-quantized", scheme, {f"{MODULE}.{k}": v for k, v in comp.items()})
    got = plan({"w": load_weights(folder)[f"{MODULE}.weight"].data()}).materialize()["w"]
    np.testing.assert_array_equal(np.asarray(got).view(np.int16), _bits(want))


# --- formats added for issue 39: pack-quantized int1..int8, mxfp8-quantized, mxfp6-pack-quantized -----------
@pytest.mark.parametrize("num_bits,strategy,group_size,symmetric", [
    (b, *case) for b in (2, 3, 5, 6, 7)
    for case in (("group", 32, True), ("group", 32, False), ("channel", None, False))
] + [(1, "group", 32, False), (1, "channel", None, False)])  # (symmetric int1 is all zeros)
def test_pack_quantized_any_width_equals_compressed_tensors(tmp_path, num_bits, strategy, group_size, symmetric):
    """intB for every B compressed-tensors packs (dense cross-element packing: fields straddle bytes and int32
    words for B = 3, 5, 6, 7), zero points packed along rows (33 rows: a partial word)."""
    folder, want, _ = _case(tmp_path, "pack-quantized", _int(num_bits, strategy, group_size, symmetric),
                            shape=(33, 96))
    _assert_same(folder, want, nonzero={1: 0.01, 2: 0.3}.get(num_bits, 0.5))  # (few levels: many exact zeros)


@pytest.mark.parametrize("shape", [(40, 256), (24, 100)])
def test_pack_quantized_int3_odd_columns(tmp_path, shape):
    """int3 with columns that end mid-word (100 * 3 bits = 9.4 int32 words)."""
    folder, want, _ = _case(tmp_path, "pack-quantized", _int(3, "channel", None, True), shape=shape)
    _assert_same(folder, want)


def test_mxfp8_equals_compressed_tensors(tmp_path):
    scheme = preset_name_to_scheme("MXFP8A16", ["Linear"])
    folder, want, tensors = _case(tmp_path, "mxfp8-quantized", scheme.weights, shape=(40, 96))
    assert tensors[f"{MODULE}.weight_scale"].dtype == torch.uint8  # e8m0 exponents
    _assert_same(folder, want)


def test_mxfp6_equals_compressed_tensors(tmp_path):
    scheme = preset_name_to_scheme("MXFP6A16", ["Linear"])
    folder, want, tensors = _case(tmp_path, "mxfp6-pack-quantized", scheme.weights, shape=(40, 128))
    assert tuple(tensors[f"{MODULE}.weight_packed"].shape) == (40, 96)  # four codes per three bytes
    _assert_same(folder, want)


@pytest.mark.parametrize("preset", ["MXFP8A16", "MXFP6A16"])
def test_model_compressor_mx_formats(tmp_path, preset):
    """The MX presets through ModelCompressor (it infers the format) and its decompress_model."""
    folder = str(tmp_path / preset)
    want = _compressed_llama(folder, preset)
    with open(os.path.join(folder, "config.json")) as fh:
        fmt = json.load(fh)["quantization_config"]["format"]
    assert fmt == {"MXFP8A16": "mxfp8-quantized", "MXFP6A16": "mxfp6-pack-quantized"}[preset]
    weights = load_weights(folder)
    names = [n for n, _ in weights.items()]
    assert sorted(names) == sorted(n for n in want if not n.rsplit(".", 1)[1].startswith("weight_"))
    got = plan({n: weights[n].data() for n in names}).materialize()
    for n in names:
        np.testing.assert_array_equal(np.asarray(got[n]).view(np.int16), want[n].view(torch.int16).numpy(), n)
