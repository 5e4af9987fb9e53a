"""Module / LayerList naming, load_state_dict validation and loading, compared with safetensors and ml_dtypes."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lazyweights import DType, QuantizationEncoding, Weight, WeightData, load_weights
from lazyweights.core.errors import LazyWeightsError, LoadError, SourceChangedError
from lazyweights.interop.module import LayerList, Module

H, F = 8, 12


class Linear(Module):
    def __init__(self, n_in, n_out, dtype=DType.bfloat16):
        super().__init__()
        self.weight = Weight("weight", dtype, (n_out, n_in))


class Norm(Module):
    def __init__(self, n):
        super().__init__()
        self.weight = Weight("weight", DType.bfloat16, (n,))


class Attention(Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Linear(H, H)
        self.k_proj = Linear(H, H)


class MLP(Module):
    def __init__(self):
        super().__init__()
        self.up_proj = Linear(H, F)
        self.down_proj = Linear(F, H)


class Block(Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.mlp = MLP()
        self.input_layernorm = Norm(H)


class Tiny(Module):
    def __init__(self, n_layers=2):
        super().__init__()
        self.layers = LayerList([Block() for _ in range(n_layers)])
        self.norm = Norm(H)


EXPECTED_NAMES = [
    "norm.weight",
    "layers.0.input_layernorm.weight", "layers.1.input_layernorm.weight",
    "layers.0.attention.q_proj.weight", "layers.0.attention.k_proj.weight",
    "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.1.attention.q_proj.weight", "layers.1.attention.k_proj.weight",
    "layers.1.mlp.up_proj.weight", "layers.1.mlp.down_proj.weight",
]


def _hf_tensors(n_layers=2, seed=0):
    rng = np.random.default_rng(seed)
    t = {"model.norm.weight": (H,)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = (H, H)
        t[p + "self_attn.k_proj.weight"] = (H, H)
        t[p + "mlp.up_proj.weight"] = (F, H)
        t[p + "mlp.down_proj.weight"] = (H, F)
        t[p + "input_layernorm.weight"] = (H,)
        t[p + "self_attn.k_scale"] = ()
    return {k: (rng.standard_normal(s).astype(np.float16) if s else np.array(0.5, np.float32)) for k, s in t.items()}


@pytest.fixture()
def ckpt(tmp_path):
    path = str(tmp_path / "model.safetensors")
    save_file(_hf_tensors(), path)
    return path


# The seed's adapter ("Write a weight adapter"), with only the imports changed.
SAFETENSOR_MAPPING = {
    "model.": "",  # Strip this string
    "self_attn.q_proj": "attention.q_proj",  # Rename this string
    "self_attn.k_proj": "attention.k_proj",
}
UNUSED_SUFFIXES = (".k_scale", ".v_scale")


def convert_safetensor_state_dict(state_dict, **unused_kwargs):
    new_state_dict = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()
    for key, weight_data in new_state_dict.items():
        if weight_data.dtype == DType.float16 and not (key.endswith("bias") or key.endswith("scales")):
            new_state_dict[key] = weight_data.astype(DType.bfloat16)
    for key in list(new_state_dict):
        if key.endswith(UNUSED_SUFFIXES):
            del new_state_dict[key]
    return new_state_dict


def _mapped(name):
    for before, after in SAFETENSOR_MAPPING.items():
        name = name.replace(before, after)
    return name


# --- naming ----------------------------------------------------------------------------------------------
def test_names_are_module_path_plus_weight_name():
    model = Tiny()
    raw = model.raw_state_dict()
    assert sorted(raw) == sorted(EXPECTED_NAMES)
    assert list(raw)[0] == "norm.weight"  # breadth first, declaration order within a module
    w = raw["layers.1.mlp.up_proj.weight"]
    assert (w.dtype, w.shape) == (DType.bfloat16, (F, H))
    assert w is model.layers[1].mlp.up_proj.weight


def test_weight_attribute_directly_and_dotted_weight_names():
    class Attn(Module):
        def __init__(self):
            super().__init__()
            self.q = Weight("q_proj.weight", DType.float32, (2, 2))  # attribute name does not enter the name
            self.scale = Weight("", DType.float32, ())  # an empty name takes the attribute's

    class Top(Module):
        def __init__(self):
            super().__init__()
            self.attention = Attn()
            self.bias = Weight("bias", DType.float32, (2,))

    assert list(Top().raw_state_dict()) == ["bias", "attention.q_proj.weight", "attention.scale"]


def test_two_weights_with_one_name_in_a_module_is_an_error():
    class Bad(Module):
        def __init__(self):
            super().__init__()
            self.q_proj = Weight("weight", DType.float32, (2,))
            self.k_proj = Weight("weight", DType.float32, (2,))

    with pytest.raises(LazyWeightsError, match=r"k_proj: a different Weight named 'weight' is already declared "
                                               r"\(attribute 'q_proj'\)"):
        Bad()


def test_reassigning_an_attribute_replaces_the_weight():
    m = Linear(2, 3)
    m.weight = Weight("weight", DType.float32, (5,))
    assert [(n, w.shape) for n, w in m.raw_state_dict().items()] == [("weight", (5,))]
    del m.weight
    assert m.raw_state_dict() == {}


def test_full_name_collision_between_levels_is_an_error():
    class Top(Module):
        def __init__(self):
            super().__init__()
            self.q_proj = Linear(2, 2)
            self.fused = Weight("q_proj.weight", DType.bfloat16, (2, 2))

    with pytest.raises(LazyWeightsError, match="two different Weights have the full name 'q_proj.weight'"):
        Top().raw_state_dict()


def test_module_without_super_init_and_list_warning():
    class NoInit(Module):
        def __init__(self):
            self.weight = Weight("weight", DType.float32, (1,))

    assert list(NoInit().raw_state_dict()) == ["weight"]

    class Listy(Module):
        def __init__(self):
            super().__init__()
            self.blocks = [Linear(1, 1)]

    with pytest.warns(UserWarning, match="use LayerList"):
        Listy()


def test_layerlist_operations():
    ll = LayerList([Linear(1, 1)])
    ll.append(Linear(1, 2))
    ll.insert(0, Linear(1, 3))
    assert len(ll) == 3 and [m.weight.shape for m in ll] == [(3, 1), (1, 1), (2, 1)]
    assert [(n, w.shape) for n, w in ll.raw_state_dict().items()] == [("0.weight", (3, 1)), ("1.weight", (1, 1)),
                                                                     ("2.weight", (2, 1))]
    with pytest.raises(LazyWeightsError):
        ll.append("not a module")


# --- the seed's correctness check, then a load compared with safetensors -------------------------------------
def test_seed_correctness_check_workflow(ckpt, capsys):
    weights = load_weights([ckpt])
    adapted = convert_safetensor_state_dict(dict(weights.items()))
    for name in sorted(adapted):
        print(name)
    model = Tiny()
    for name, weight in model.raw_state_dict().items():
        print(f"{name}: {weight.shape} {weight.dtype} {weight.quantization_encoding}")
    out = capsys.readouterr().out
    assert "layers.0.attention.q_proj.weight\n" in out
    assert "layers.1.mlp.down_proj.weight: (8, 12) DType.bfloat16 None" in out
    # The comparison the seed asks for: the adapter's keys are exactly the module's.
    assert sorted(adapted) == sorted(model.raw_state_dict())
    assert model.check(adapted).ok

    model.load_state_dict(adapted)
    reference = load_file(ckpt)  # independent reader
    loaded = model.state_dict()
    assert sorted(loaded) == sorted(EXPECTED_NAMES)
    for ckpt_name, arr in reference.items():
        if ckpt_name.endswith(UNUSED_SUFFIXES):
            continue
        got = loaded[_mapped(ckpt_name)]
        want = arr.astype(ml_dtypes.bfloat16)  # ml_dtypes' round-to-nearest-even
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), ckpt_name


def test_buffers_are_aligned_and_numpy_values_accepted():
    class M(Module):
        def __init__(self):
            super().__init__()
            self.a = Weight("a", DType.float32, (3, 5))
            self.b = Weight("b", DType.bfloat16, (7,))

    sd = {"a": np.arange(15, dtype=np.float32).reshape(3, 5),
          "b": WeightData.from_numpy(np.linspace(0, 1, 7, dtype=np.float32), "b").astype(DType.bfloat16)}
    m = M()
    m.load_state_dict(sd)
    state = m.state_dict()
    for arr in state.values():
        assert arr.ctypes.data % 64 == 0 and arr.flags.c_contiguous
    np.testing.assert_array_equal(state["a"], sd["a"])
    assert not np.shares_memory(state["a"], sd["a"])  # the module owns its buffer
    assert state["b"].tobytes() == np.linspace(0, 1, 7, dtype=np.float32).astype(ml_dtypes.bfloat16).tobytes()

    m.load_state_dict(sd, weight_alignment=4096)
    assert all(a.ctypes.data % 4096 == 0 for a in m.state_dict().values())
    assert m.a.align == 4096 and m.b.align == 4096
    assert m.a.name == "a"
    for bad in (0, 3, -64, 1.5, True):
        with pytest.raises(LoadError, match="weight_alignment must be a positive power of two"):
            m.load_state_dict(sd, weight_alignment=bad)


def test_one_plan_fills_the_module_buffers(monkeypatch):
    from lazyweights.lazy.plan import Plan

    calls = []
    real = Plan.materialize

    def spy(self, *args, out=None, **kwargs):
        calls.append((sorted(self.tensors), sorted(out or {})))
        result = real(self, *args, out=out, **kwargs)
        for name, arr in out.items():
            assert result[name] is arr  # filled in place, no other array returned
        return result

    monkeypatch.setattr(Plan, "materialize", spy)
    m = Tiny()
    rng = np.random.default_rng(1)
    sd = {n: WeightData.from_numpy(rng.standard_normal(w.shape).astype(np.float32), n).astype(DType.bfloat16)
          for n, w in m.raw_state_dict().items()}
    m.load_state_dict(sd)
    assert calls == [(sorted(EXPECTED_NAMES), sorted(EXPECTED_NAMES))]


# --- validation ---------------------------------------------------------------------------------------------
def _broken(ckpt):
    adapted = convert_safetensor_state_dict(dict(load_weights([ckpt]).items()))
    adapted["layers.0.mlp.up_proj.wieght"] = adapted.pop("layers.0.mlp.up_proj.weight")  # typo
    for k in [k for k in adapted if k.startswith("layers.1.attention.")]:
        del adapted[k]  # a lost layer
    adapted["rotary_emb.inv_freq"] = WeightData.from_numpy(np.ones(4, np.float32), "inv_freq")  # an extra
    adapted["layers.0.attention.k_proj.weight"] = adapted["layers.0.attention.k_proj.weight"].astype(DType.float16)
    adapted["layers.1.mlp.down_proj.weight"] = adapted["layers.1.mlp.down_proj.weight"].T  # wrong shape
    adapted["norm.weight"] = "model.norm.weight"  # not an array
    return adapted


GOLDEN_LOAD_ERROR = """\
load_state_dict: 8 problems loading Tiny; nothing was read or loaded:
  Could not find weight 'layers.0.mlp.up_proj.weight' (bf16[12,8]). Did you mean 'layers.0.mlp.up_proj.wieght'?
  Could not find weight 'layers.1.attention.{q_proj,k_proj}.weight' (bf16[8,8]).
  Unexpected weight 'layers.0.mlp.up_proj.wieght' (bf16[12,8]): the module declares no weight of that name.
  Unexpected weight 'rotary_emb.inv_freq' (f32[4]): the module declares no weight of that name.
  Value provided to weight 'layers.0.attention.k_proj.weight' had different dtype (expected=DType.bfloat16, actual=DType.float16); cast it in the adapter: .astype(DType.bfloat16).
  Value provided to weight 'layers.1.mlp.down_proj.weight' had different shape (expected=(8, 12), actual=(12, 8)); transposed? use .T in the adapter.
  The value of 'norm.weight' is a str, not an array: use WeightData, a numpy array or a tensor.
Pass strict=False to tolerate missing and unexpected weights."""  # noqa: E501 (golden text: one line per problem)

GOLDEN_LOAD_ERROR_NONSTRICT = """\
load_state_dict: 3 problems loading Tiny; nothing was read or loaded:
  Value provided to weight 'layers.0.attention.k_proj.weight' had different dtype (expected=DType.bfloat16, actual=DType.float16); cast it in the adapter: .astype(DType.bfloat16).
  Value provided to weight 'layers.1.mlp.down_proj.weight' had different shape (expected=(8, 12), actual=(12, 8)); transposed? use .T in the adapter.
  The value of 'norm.weight' is a str, not an array: use WeightData, a numpy array or a tensor."""  # noqa: E501


def test_load_error_golden_text(ckpt):
    model = Tiny()
    with pytest.raises(LoadError) as info:
        model.load_state_dict(_broken(ckpt))
    assert str(info.value) == GOLDEN_LOAD_ERROR
    assert isinstance(info.value, ValueError) and isinstance(info.value, LazyWeightsError)
    report = info.value.report
    assert [m.name for m in report.missing] == ["layers.0.mlp.up_proj.weight", "layers.1.attention.q_proj.weight",
                                                "layers.1.attention.k_proj.weight"]
    assert report.missing[0].suggestions == ("layers.0.mlp.up_proj.wieght",)
    assert [(m.expected, m.actual) for m in report.dtype_mismatches] == [(DType.bfloat16, DType.float16)]
    assert [(m.expected, m.actual) for m in report.shape_mismatches] == [((8, 12), (12, 8))]
    with pytest.raises(ValueError, match="was not initialized"):
        model.state_dict(auto_initialize=False)  # nothing was loaded

    with pytest.raises(LoadError) as info:
        model.load_state_dict(_broken(ckpt), strict=False)  # mismatches are never tolerated
    assert str(info.value) == GOLDEN_LOAD_ERROR_NONSTRICT


def test_strict_false_tolerates_missing_and_unexpected(ckpt):
    adapted = convert_safetensor_state_dict(dict(load_weights([ckpt]).items()))
    del adapted["layers.1.mlp.up_proj.weight"]
    adapted["extra.weight"] = WeightData.from_numpy(np.ones(2, np.float32), "extra")
    model = Tiny()
    with pytest.raises(LoadError, match=r"Could not find weight 'layers.1.mlp.up_proj.weight' \(bf16\[12,8\]\)\."):
        model.load_state_dict(adapted)
    report = model.load_state_dict(adapted, strict=False)
    assert [m.name for m in report.missing] == ["layers.1.mlp.up_proj.weight"]
    assert [u.name for u in report.unexpected] == ["extra.weight"]
    state = model.state_dict()
    assert not state["layers.1.mlp.up_proj.weight"].any()  # never loaded: zero-initialised, as the seed does
    ref = load_file(ckpt)["model.layers.1.mlp.down_proj.weight"].astype(ml_dtypes.bfloat16)
    assert state["layers.1.mlp.down_proj.weight"].tobytes() == ref.tobytes()


def test_validates_before_reading_any_tensor(ckpt, monkeypatch):
    from lazyweights.formats.source import SourceFile, TensorRecord

    reads = []
    for cls, meth in ((TensorRecord, "array"), (SourceFile, "view"), (SourceFile, "check_unchanged")):
        real = getattr(cls, meth)
        monkeypatch.setattr(cls, meth,
                            lambda self, *a, _real=real, _m=meth, **k: reads.append(_m) or _real(self, *a, **k))

    adapted = convert_safetensor_state_dict(dict(load_weights([ckpt]).items()))
    adapted["layers.1.mlp.up_proj.weight"] = adapted["layers.1.mlp.up_proj.weight"].reshape(F * H)  # one bad entry
    os.remove(ckpt)  # reading any tensor now fails with SourceChangedError
    model = Tiny()
    with pytest.raises(LoadError, match=r"'layers.1.mlp.up_proj.weight' had different shape \(expected=\(12, 8\), "
                                        r"actual=\(96,\)\)"):
        model.load_state_dict(adapted)
    assert reads == []
    # The same state dict without the bad entry does reach the bytes: so the check above is meaningful.
    adapted["layers.1.mlp.up_proj.weight"] = adapted["layers.1.mlp.up_proj.weight"].reshape(F, H)
    with pytest.raises(SourceChangedError):
        model.load_state_dict(adapted)
    assert reads


def test_failed_read_keeps_previous_values(tmp_path):
    path = str(tmp_path / "m.safetensors")
    save_file({"weight": np.full((3, 2), 7, np.float32)}, path)
    m = Linear(2, 3, DType.float32)
    m.load_state_dict({"weight": np.ones((3, 2), np.float32)})
    before = m.state_dict()["weight"]
    sd = {"weight": load_weights([path]).weight.data()}
    with open(path, "ab") as fh:
        fh.write(b"\0" * 8)  # the file changes after it was opened
    with pytest.raises(SourceChangedError):
        m.load_state_dict(sd)
    assert m.state_dict()["weight"] is before and (before == 1).all()


# --- tied weights --------------------------------------------------------------------------------------------
class TiedLM(Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = Linear(4, 6, DType.float32)
        self.lm_head = Linear(4, 6, DType.float32)
        self.lm_head.weight = self.embed_tokens.weight  # one tensor, two names


@pytest.mark.parametrize("given", ["embed_tokens.weight", "lm_head.weight"])
def test_tied_weight_needs_either_name(given):
    m = TiedLM()
    assert list(m.raw_state_dict()) == ["embed_tokens.weight", "lm_head.weight"]
    value = np.arange(24, dtype=np.float32).reshape(6, 4)
    report = m.load_state_dict({given: value})
    assert report.missing == [] and report.unexpected == []
    state = m.state_dict()
    assert state["embed_tokens.weight"] is state["lm_head.weight"]
    np.testing.assert_array_equal(state["lm_head.weight"], value)


def test_tied_weight_both_names_given_and_neither():
    m = TiedLM()
    a, b = np.zeros((6, 4), np.float32), np.ones((6, 4), np.float32)
    m.load_state_dict({"embed_tokens.weight": a, "lm_head.weight": b})  # the first declared name wins
    assert not m.state_dict()["lm_head.weight"].any()
    with pytest.raises(LoadError) as info:
        m.load_state_dict({"lm_head.weight": np.zeros((6, 5), np.float32), "embed_tokens.weight": a})
    assert "'lm_head.weight' had different shape" in str(info.value)
    with pytest.raises(LoadError) as info:
        m.load_state_dict({})
    assert [x.name for x in info.value.report.missing] == ["embed_tokens.weight", "lm_head.weight"]


def test_set_shared_weight_and_shared_submodule():
    class M(Module):
        def __init__(self):
            super().__init__()
            self.lm_head = Linear(2, 2, DType.float32)
            self.embed = Module()
            self.embed.set_shared_weight("weight", self.lm_head.weight)
            self.again = self.lm_head  # the same module object twice is listed once

    m = M()
    assert list(m.raw_state_dict()) == ["lm_head.weight", "embed.weight"]
    m.load_state_dict({"embed.weight": np.eye(2, dtype=np.float32)})
    np.testing.assert_array_equal(m.state_dict()["lm_head.weight"], np.eye(2))


# --- quantization encodings ----------------------------------------------------------------------------------
Q8, Q4 = QuantizationEncoding.Q8_0, QuantizationEncoding.Q4_0


def _q(encoding, shape, fill=3):
    return WeightData(np.full(shape, fill, np.uint8), "w", quantization_encoding=encoding)


def test_quantized_weights_must_match_encoding():
    class Q(Module):
        def __init__(self, enc=Q4, dtype=DType.uint8, shape=(4, 18)):
            super().__init__()
            self.weight = Weight("weight", dtype, shape, quantization_encoding=enc)

    m = Q()
    m.load_state_dict({"weight": _q(Q4, (4, 18))})
    assert (m.state_dict()["weight"] == 3).all()

    with pytest.raises(LoadError, match=r"had different quantization encoding \(expected=Q4_0, actual=Q8_0\); "
                                        r"or pass override_quantization_encoding=True"):
        Q().load_state_dict({"weight": _q(Q8, (4, 34))})
    with pytest.raises(LoadError, match=r"quantization encoding \(expected=Q4_0, actual=none\)"):
        Q().load_state_dict({"weight": np.zeros((4, 18), np.uint8)})
    with pytest.raises(LoadError, match=r"quantization encoding \(expected=none, actual=Q8_0\); "
                                        r"call .dequantize\(\) in the adapter"):
        Q(enc=None, dtype=DType.float32, shape=(4, 32)).load_state_dict({"weight": _q(Q8, (4, 34))})

    # override: the weight takes the value's encoding (4 rows of 32 values: Q4_0 18 bytes -> Q8_0 34 bytes)
    m = Q()
    m.load_state_dict({"weight": _q(Q8, (4, 34))}, override_quantization_encoding=True)
    assert (m.weight.quantization_encoding, m.weight.dtype, m.weight.shape) == (Q8, DType.uint8, (4, 34))
    with pytest.raises(LoadError, match=r"different shape \(expected=\(4, 34\), actual=\(4, 36\)\)"):
        Q().load_state_dict({"weight": _q(Q8, (4, 36))}, override_quantization_encoding=True)

    # a quantized weight declared by its values (float32 [4, 32]) takes the packed bytes
    m = Q(enc=Q8, dtype=DType.float32, shape=(4, 32))
    m.load_state_dict({"weight": _q(Q8, (4, 34))})
    assert (m.weight.dtype, m.weight.shape) == (DType.uint8, (4, 34))
    assert m.state_dict()["weight"].shape == (4, 34)


def test_gptq_loads_unlabelled_int32_as_bytes():
    class G(Module):
        def __init__(self):
            super().__init__()
            self.qweight = Weight("qweight", DType.uint8, (2, 16), quantization_encoding=QuantizationEncoding.GPTQ)

    packed = np.arange(8, dtype=np.int32).reshape(2, 4)  # GPTQ safetensors carry no quantization label
    m = G()
    m.load_state_dict({"qweight": WeightData.from_numpy(packed, "qweight")})
    assert m.state_dict()["qweight"].tobytes() == packed.tobytes()


# --- renames -------------------------------------------------------------------------------------------------
def test_rename_collisions_are_detected_from_the_renames():
    from lazyweights.interop.check import check_unique_renames

    names = ["model.layers.0.w", "layers.0.w", "model.norm.weight"]
    pairs = [(n, n.replace("model.", "")) for n in names]
    with pytest.raises(LoadError) as info:
        check_unique_renames(pairs)
    assert str(info.value) == ("1 new name has more than one source (a dict keeps only the last): "
                               "'layers.0.w' <- 'model.layers.0.w', 'layers.0.w'")
    assert check_unique_renames({"model.norm.weight": "norm.weight"}) == {"norm.weight": "model.norm.weight"}
