"""Every WeightData op against numpy / ml_dtypes on random data (f32, bf16, float8_e4m3fn and more).

Values are compared bit for bit (dtype, shape and bytes), NaN and inf included. Errors are checked at
build time: type (ShapeError / DTypeError, all LazyWeightsError) and message contents (both shapes).
Hypothesis drives random op chains on random shapes against the same chain evaluated eagerly in numpy.
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyweights as lw
from lazyweights import (
    DType,
    DTypeError,
    LazyWeightsError,
    ShapeError,
    WeightData,
    concat,
    from_numpy,
    split,
    stack,
)

# numpy warns on the overflowing / NaN casts these tests deliberately make
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

BF16 = np.dtype(ml_dtypes.bfloat16)
F8 = np.dtype(ml_dtypes.float8_e4m3fn)

ALL_DTYPES = list(DType)
FLOAT_DTYPES = [d for d in DType if d.is_float]
INT_DTYPES = [d for d in DType if d.is_integral]


# --- helpers ---------------------------------------------------------------------------------------------
def raw(a: np.ndarray) -> np.ndarray:
    """The bytes of `a` in C order (0-d included) as uint8."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_same(actual, expected):
    """Same dtype, same shape, same bytes (NaN payloads and signed zeros included)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.array_equal(raw(actual), raw(expected)), f"bytes differ for {expected.dtype}{list(expected.shape)}"


def rand(shape, dtype, seed=0) -> np.ndarray:
    """Random, never-all-zero data of `dtype` (floats from a normal, ints spread over their range)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    return x.astype(dtype)


def specials_f32() -> np.ndarray:
    """float32 values that exercise rounding, overflow, subnormals, signed zero, inf and NaN payloads."""
    rng = np.random.default_rng(7)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 0.5, 1.5, 2.5, 448.0, 449.0, 464.0,
            480.0, 57344.0, 61440.0, 65504.0, 65520.0, 70000.0, 1e38, 3.4e38, -3.4e38, 1e-8, 1e-40, -1e-45,
            2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 2.0 ** -16, 2.0 ** -17, 2.0 ** -24, 2.0 ** -25, 2.0 ** -126,
            2.0 ** -133, 2.0 ** -149, 1 + 2.0 ** -8, 1 + 2.0 ** -7 + 2.0 ** -9, 6.0, 7.0, 3.25, 0.75]
    x = np.array(vals, dtype=np.float32)
    payload_nans = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x7FBFFFFF, 0x7FE00000],
                            dtype=np.uint32).view(np.float32)
    random_bits = rng.integers(0, 2 ** 32, size=4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(4096) * np.exp2(rng.integers(-30, 30, 4096))).astype(np.float32)
    return np.concatenate([x, payload_nans, random_bits, scaled])


def all_bit_patterns(dtype) -> np.ndarray:
    """Every value of a <=16-bit dtype, as that dtype."""
    dtype = np.dtype(dtype)
    if dtype.itemsize == 1:
        bits = np.arange(256, dtype=np.uint8)
        if dtype == np.dtype(ml_dtypes.float4_e2m1fn):
            bits = np.arange(16, dtype=np.uint8)  # only the low nibble is meaningful
        return bits.view(dtype) if dtype != np.bool_ else bits.astype(bool)
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(dtype)


def castable(a: np.dtype, b: np.dtype) -> bool:
    return bool(np.can_cast(a, b, casting="unsafe"))


def numpy_cast(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    """ml_dtypes' astype; pairs ml_dtypes lacks (fp8 <-> e8m0) go through float32, as lazyweights does."""
    if castable(x.dtype, dst):
        return x.astype(dst)
    return x.astype(np.float32).astype(dst)


def in_int_range(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    """Finite values of float `x` that convert to integer `dst` without overflow (elsewhere C leaves it undefined)."""
    f = x.astype(np.float64)
    info = np.iinfo(dst)
    return np.isfinite(f) & (np.trunc(f) >= info.min) & (np.trunc(f) <= info.max)


# --- astype ----------------------------------------------------------------------------------------------
SOURCES = {
    "f32-specials": specials_f32,
    "f64-specials": lambda: specials_f32().astype(np.float64),
    "f16-all": lambda: all_bit_patterns(np.float16),
    "bf16-all": lambda: all_bit_patterns(BF16),
    "f8e4m3fn-all": lambda: all_bit_patterns(F8),
    "f8e5m2-all": lambda: all_bit_patterns(ml_dtypes.float8_e5m2),
    "f8e4m3fnuz-all": lambda: all_bit_patterns(ml_dtypes.float8_e4m3fnuz),
    "f8e5m2fnuz-all": lambda: all_bit_patterns(ml_dtypes.float8_e5m2fnuz),
    "f8e8m0fnu-all": lambda: all_bit_patterns(ml_dtypes.float8_e8m0fnu),
    "f4e2m1fn-all": lambda: all_bit_patterns(ml_dtypes.float4_e2m1fn),
    "bool": lambda: rand((512,), np.bool_),
    "i8-all": lambda: np.arange(256, dtype=np.uint8).view(np.int8),
    "u8-all": lambda: np.arange(256, dtype=np.uint8),
    "i16": lambda: rand((2048,), np.int16),
    "u16": lambda: rand((2048,), np.uint16),
    "i32": lambda: rand((2048,), np.int32),
    "u32": lambda: rand((2048,), np.uint32),
    "i64": lambda: rand((2048,), np.int64),
    "u64": lambda: rand((2048,), np.uint64),
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_astype_all_targets_bit_identical_to_ml_dtypes(source):
    x = SOURCES[source]()
    x = x.reshape(-1)
    n = x.size - x.size % 4
    x = x[:n].reshape(4, -1)  # 2-D, so layout-sensitive kernels see rows
    w = from_numpy(x, "x")
    for target in ALL_DTYPES:
        dst = target.to_numpy()
        src = x
        if DType.from_numpy(x.dtype).is_float and target.is_integral:
            if True:
                # float -> int is only defined for in-range finite values; compare on those.
                src = np.where(in_int_range(x, dst), x, np.zeros((), x.dtype))
        expected = numpy_cast(src, dst)
        got = from_numpy(src, "x").astype(target).to_numpy() if src is not x else w.astype(target).to_numpy()
        assert_same(got, expected)


def test_astype_nan_inf_signed_zero_kept_through_every_float():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0], dtype=np.float32)
    w = from_numpy(x, "x")
    for target in FLOAT_DTYPES:
        if target in (DType.float8_e8m0fnu, DType.float4_e2m1fn, DType.float8_e4m3fnuz, DType.float8_e5m2fnuz):
            continue  # one NaN, no -0 (fnuz) or no NaN/inf at all (e8m0, e2m1): covered bit-exactly above
        got = w.astype(target).to_numpy()
        assert_same(got, x.astype(target.to_numpy()))
        back = got.astype(np.float32)
        assert np.isnan(back[0]) and np.isnan(back[1])
        assert np.signbit(back[4]) and not np.signbit(back[5])


@pytest.mark.parametrize("src", [DType.bfloat16, DType.float16, DType.float8_e4m3fn, DType.float8_e5m2,
                                 DType.float32, DType.float8_e4m3fnuz])
def test_cast_chains_equal_stepwise_numpy(src):
    """astype(A).astype(B) == numpy's two-step cast for every float A, B (exercises cast-of-cast folding)."""
    base = all_bit_patterns(src.to_numpy()) if src.size_in_bytes <= 2 else specials_f32().astype(src.to_numpy())
    floats = [DType.float64, DType.float32, DType.float16, DType.bfloat16, DType.float8_e4m3fn,
              DType.float8_e5m2, DType.float8_e4m3fnuz, DType.float8_e8m0fnu, DType.float4_e2m1fn, DType.bool]
    w = from_numpy(base, "x")
    for a in floats:
        mid = numpy_cast(base, a.to_numpy())
        for b in floats:
            expected = numpy_cast(mid, b.to_numpy())
            assert_same(w.astype(a).astype(b).to_numpy(), expected)


def test_cast_without_direct_ml_dtypes_path_goes_through_float32():
    x = all_bit_patterns(F8)
    got = from_numpy(x, "x").astype(DType.float8_e8m0fnu)
    assert got.dtype is DType.float8_e8m0fnu and got.shape == x.shape
    assert_same(got.to_numpy(), x.astype(np.float32).astype(ml_dtypes.float8_e8m0fnu))
    # and the same through an exact intermediate that used to be folded into the missing direct cast
    got2 = from_numpy(x, "x").astype(DType.float16).astype(DType.float8_e8m0fnu)
    assert_same(got2.to_numpy(), x.astype(np.float16).astype(ml_dtypes.float8_e8m0fnu))


def test_astype_accepts_names_and_numpy_dtypes():
    x = rand((3, 5), np.float32)
    w = from_numpy(x, "x")
    for spec in ("bfloat16", "bf16", "DType.bfloat16", BF16, ml_dtypes.bfloat16):
        assert_same(w.astype(spec).to_numpy(), x.astype(BF16))
    with pytest.raises(DTypeError):
        w.astype("complex64")


# --- view / bitcast --------------------------------------------------------------------------------------
@pytest.mark.parametrize("src_dt", [np.float32, BF16, F8])
def test_view_same_and_size_changing(src_dt):
    x = rand((6, 8), src_dt, seed=3)
    w = from_numpy(x, "x")
    for target in [DType.uint8, DType.int8, DType.uint16, DType.int16, DType.bfloat16, DType.float16,
                   DType.float32, DType.uint32, DType.int64, DType.float64, DType.float8_e5m2]:
        nd = target.to_numpy()
        if (x.shape[-1] * x.dtype.itemsize) % nd.itemsize:
            with pytest.raises(ShapeError):
                w.view(target)
            continue
        v = w.view(target)
        assert v.dtype is target
        assert v.shape == x.view(nd).shape
        assert_same(v.to_numpy(), x.view(nd))
        # and back again to the original bits
        assert_same(v.view(DType.from_numpy(x.dtype)).to_numpy(), x)


def test_view_of_non_contiguous_result_uses_logical_order():
    x = rand((4, 6), np.float32, seed=4)
    w = from_numpy(x, "x").T.view(DType.uint8)
    assert w.shape == (6, 16)
    assert_same(w.to_numpy(), np.ascontiguousarray(x.T).view(np.uint8))
    back = from_numpy(x, "x").view(DType.uint8)[:, 4:12].view(DType.float32)
    assert_same(back.to_numpy(), np.ascontiguousarray(x.view(np.uint8)[:, 4:12]).view(np.float32))


@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16])
def test_view_of_1d_results_inside_chains(dt):
    """Bitcasts whose row axis is also the last axis (1-D), after casts / concats / takes (found by the
    random chains below: the row-block executor used to split rows inside one reinterpreted element)."""
    x = rand((6,), dt, 14)
    w = from_numpy(x, "x")
    cases = [
        (w.astype(DType.bfloat16).view(DType.float32), x.astype(BF16).view(np.float32)),
        (w.astype(DType.bfloat16).view(DType.uint8).view(DType.float32),
         x.astype(BF16).view(np.uint8).view(np.float32)),
        (concat([w, w[::-1]]).view(DType.int64), np.concatenate([x, x[::-1]]).view(np.int64)),
        (concat([w[::-1], w]).view(DType.uint8), np.concatenate([x[::-1], x]).view(np.uint8)),
        (w[[1, 0, 3, 2, 5, 4]].view(DType.uint8)[::-1], x[[1, 0, 3, 2, 5, 4]].view(np.uint8)[::-1]),
        (concat([w.view(DType.uint8), w.view(DType.uint8)]).view(DType.float64),
         np.concatenate([x.view(np.uint8), x.view(np.uint8)]).view(np.float64)),
    ]
    for got, expected in cases:
        assert_same(got.to_numpy(), expected)


def test_view_errors_name_shapes():
    w = from_numpy(rand((3, 5), np.uint8), "w")
    with pytest.raises(ShapeError) as e:
        w.view(DType.float32)
    assert "[3, 5]" in str(e.value) and "float32" in str(e.value)
    with pytest.raises(ShapeError):
        from_numpy(np.float32(1.0).reshape(()), "s").view(DType.uint8)
    assert from_numpy(np.float32(1.5).reshape(()), "s").view(DType.uint32).to_numpy() == np.float32(1.5).view(np.uint32)


# --- layout ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [np.float32, BF16, F8])
def test_reshape(dt):
    x = rand((4, 6, 2), dt, seed=5)
    w = from_numpy(x, "x")
    for shape in [(48,), (-1,), (6, -1), (2, 2, 3, 4), (-1, 4), (4, 6, 2), (1, 48, 1), (2, -1, 3)]:
        assert_same(w.reshape(shape).to_numpy(), x.reshape(shape))
        assert_same(w.reshape(*shape).to_numpy(), x.reshape(*shape))
    # reshape after a transpose follows the logical (C) order, as numpy does
    assert_same(w.transpose(2, 0, 1).reshape(2, -1).to_numpy(), x.transpose(2, 0, 1).reshape(2, -1))


@pytest.mark.parametrize("dt", [np.float32, BF16, F8])
def test_transpose_permute_T_swapaxes(dt):
    x = rand((2, 3, 4), dt, seed=6)
    w = from_numpy(x, "x")
    assert_same(w.T.to_numpy(), x.T)
    assert_same(w.transpose().to_numpy(), x.transpose())
    assert_same(w.transpose(1, 0, 2).to_numpy(), x.transpose(1, 0, 2))
    assert_same(w.transpose((2, 0, 1)).to_numpy(), x.transpose((2, 0, 1)))
    assert_same(w.permute((0, 2, 1)).to_numpy(), x.transpose(0, 2, 1))
    assert_same(w.permute((-1, 0, 1)).to_numpy(), x.transpose(2, 0, 1))
    assert_same(w.swapaxes(0, 2).to_numpy(), x.swapaxes(0, 2))
    assert_same(w.swapaxes(-1, 1).to_numpy(), x.swapaxes(-1, 1))
    # composition of permutes
    assert_same(w.permute((1, 2, 0)).permute((2, 0, 1)).T.to_numpy(), x.transpose(1, 2, 0).transpose(2, 0, 1).T)
    assert w.permute((1, 2, 0)).permute((2, 0, 1)).node is w.node  # identity composes away


INDEX_KEYS = [
    1, -1, -3, (0, 1), (-1, -2, -3), (1, 2, 3),
    slice(1, 3), slice(None, None, 2), slice(None, None, -1), slice(-2, None), slice(4, 0, -2),
    slice(10, 20), slice(-100, 100, 3), slice(3, 1),
    (slice(None), slice(1, 4, 2)), (Ellipsis, 0), (Ellipsis, slice(None, None, -1)), (0, Ellipsis),
    (None,), (None, 1, None), (slice(None), None, slice(None)), (Ellipsis, None),
    [0, 2, 1], [-1, 0], np.array([2, 2, 0]), [], (slice(None), [3, 0, 1]), (Ellipsis, [1, 1, 0, 4]),
    np.array([True, False, True]), (slice(None), np.array([True, False, True, True])),
    (Ellipsis, np.array([True, False, True, False, True])),
    (1, [0, 3]), ([2, 0], 1), (slice(None), [0, 2], 1), (0, slice(None), [1, 2]), (0, None, [1, 2]),
    ([0, 1], None, 1), (slice(None, None, -1), [0, 2]), (slice(None, None, -1), slice(None, None, -2), [1, 0]),
    (np.int64(1), slice(None, None, -1)), np.array(2), (slice(1, None), np.array(-1), slice(None, 2)),
    (slice(None, None, -1), 2, slice(3, None, -1)), (),
]


@pytest.mark.parametrize("dt", [np.float32, BF16, F8])
@pytest.mark.parametrize("key", INDEX_KEYS, ids=[repr(k).replace(" ", "") for k in INDEX_KEYS])
def test_getitem_matches_numpy(dt, key):
    x = rand((3, 4, 5), dt, seed=8)
    w = from_numpy(x, "x")
    got = w[key]
    expected = x[key]
    assert got.shape == expected.shape
    assert_same(got.to_numpy(), expected)


@pytest.mark.parametrize("dt", [np.float32, BF16])
def test_getitem_chained_and_after_other_ops(dt):
    x = rand((6, 8), dt, seed=9)
    w = from_numpy(x, "x")
    assert_same(w[1:][::2][:, [7, 0]][::-1].to_numpy(), x[1:][::2][:, [7, 0]][::-1])
    assert_same(w.T[2:5, ::-1].astype(DType.float32).to_numpy(), x.T[2:5, ::-1].astype(np.float32))
    assert_same(w.reshape(2, 3, 8)[:, [2, 0, 1], :].reshape(6, 8).to_numpy(),
                x.reshape(2, 3, 8)[:, [2, 0, 1], :].reshape(6, 8))


def test_getitem_errors():
    w = from_numpy(rand((3, 4), np.float32), "w")
    with pytest.raises(ShapeError) as e:
        w[3]
    assert "index 3" in str(e.value) and "size 3" in str(e.value) and "[3, 4]" in str(e.value)
    with pytest.raises(ShapeError) as e:
        w[:, -5]
    assert "-5" in str(e.value) and "size 4" in str(e.value) and "[3, 4]" in str(e.value)
    with pytest.raises(ShapeError) as e:
        w[[0, 3]]
    assert "3" in str(e.value) and "[3, 4]" in str(e.value)
    with pytest.raises(ShapeError):
        w[:, [0, 4]]
    with pytest.raises(ShapeError):
        w[0, 0, 0]
    with pytest.raises(ShapeError):
        w[..., ...]
    with pytest.raises(ShapeError):
        w[np.array([True, False])]  # mask of the wrong length
    with pytest.raises(ShapeError):
        w[np.zeros((2, 2), np.int64)]  # 2-D index arrays are not supported
    with pytest.raises(ShapeError):
        w[[0, 1], [0, 1]]  # two array indices broadcast together in numpy: refused, never silently different
    with pytest.raises(LazyWeightsError):
        w[[0.5, 1.0]]


# --- concat / stack / split ------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [np.float32, BF16, F8])
def test_concat_stack_split(dt):
    a, b, c = rand((2, 5), dt, 1), rand((3, 5), dt, 2), rand((1, 5), dt, 3)
    wa, wb, wc = (from_numpy(v, n) for v, n in ((a, "a"), (b, "b"), (c, "c")))
    cat = concat([wa, wb, wc])
    assert cat.name == "a"
    assert_same(cat.to_numpy(), np.concatenate([a, b, c]))
    assert_same(concat([wa.T, wb.T], axis=1).to_numpy(), np.concatenate([a.T, b.T], axis=1))
    assert_same(concat([wa.T, wb.T], axis=-1, name="q").to_numpy(), np.concatenate([a.T, b.T], axis=-1))
    assert concat([wa, wb], name="fused").name == "fused"
    assert_same(concat([wa]).to_numpy(), a)

    s1, s2 = rand((2, 3), dt, 4), rand((2, 3), dt, 5)
    for axis in (0, 1, 2, -1, -3):
        assert_same(stack([from_numpy(s1, "s"), from_numpy(s2, "t")], axis=axis).to_numpy(),
                    np.stack([s1, s2], axis=axis))

    fused = rand((10, 4), dt, 6)
    wf = from_numpy(fused, "qkv")
    parts = split(wf, [6, 2, 2])
    for got, exp in zip(parts, np.split(fused, [6, 8])):
        assert_same(got.to_numpy(), exp)
    parts = split(wf, [1, 0, 9])
    for got, exp in zip(parts, np.split(fused, [1, 1])):
        assert_same(got.to_numpy(), exp)
    parts = split(wf, 2, axis=1)
    for got, exp in zip(parts, np.split(fused, 2, axis=1)):
        assert_same(got.to_numpy(), exp)
    parts = split(wf.T, [3, 7], axis=-1)
    for got, exp in zip(parts, np.split(fused.T, [3], axis=-1)):
        assert_same(got.to_numpy(), exp)
    assert [p.name for p in parts] == ["qkv", "qkv"]
    # split then concat back is the identity
    assert_same(concat(split(wf, [3, 3, 4])).to_numpy(), fused)


def test_concat_stack_split_errors():
    a = from_numpy(rand((2, 5), np.float32), "a")
    b = from_numpy(rand((3, 4), np.float32), "b")
    with pytest.raises(ShapeError) as e:
        concat([a, b])
    assert "[2, 5]" in str(e.value) and "[3, 4]" in str(e.value)
    with pytest.raises(ShapeError):
        concat([a, a.reshape(10)])
    with pytest.raises(ShapeError):
        concat([a, a], axis=2)
    with pytest.raises(ShapeError):
        concat([])
    with pytest.raises(DTypeError) as e:
        concat([a, a.astype(DType.bfloat16)])
    assert "float32" in str(e.value) and "bfloat16" in str(e.value)
    with pytest.raises(ShapeError) as e:
        stack([a, b])
    assert "[2, 5]" in str(e.value) and "[3, 4]" in str(e.value)
    with pytest.raises(ShapeError):
        stack([a, a], axis=3)
    with pytest.raises(ShapeError) as e:
        split(a, [1, 2])
    assert "[1, 2]" in str(e.value) and "3" in str(e.value) and "length 2" in str(e.value) and "[2, 5]" in str(e.value)
    with pytest.raises(ShapeError) as e:
        split(a, 3, axis=1)
    assert "length 5" in str(e.value) and "3" in str(e.value) and "[2, 5]" in str(e.value)
    with pytest.raises(ShapeError):
        split(a, [3, -1])
    with pytest.raises(ShapeError):
        split(a, 2, axis=2)


# --- construction ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [np.float32, BF16, F8, np.int32, np.bool_])
def test_from_numpy_roundtrip_and_metadata(dt):
    x = rand((3, 7), dt, 11)
    for w in (from_numpy(x, "w"), WeightData.from_numpy(x, "w"), lw.WeightData(x, "w")):
        assert w.name == "w" and w.shape == (3, 7) and w.dtype is DType.from_numpy(x.dtype)
        assert w.quantization_encoding is None and w.ndim == 2 and len(w) == 3
        assert w.size == 21 and w.nbytes == x.nbytes
        assert_same(w.to_numpy(), x)
        assert_same(np.asarray(w), x)
        assert_same(w.data, x)


def test_from_numpy_non_native_byte_order_and_non_contiguous():
    be = np.arange(-3, 9, dtype=">f4").reshape(3, 4)
    assert_same(from_numpy(be, "be").to_numpy(), be.astype("<f4"))
    assert_same(from_numpy(be, "be").astype(DType.bfloat16).to_numpy(), be.astype("<f4").astype(BF16))
    x = rand((4, 6), np.float32, 15)
    assert_same(from_numpy(x.T, "t").reshape(-1).to_numpy(), x.T.reshape(-1))
    f = np.asfortranarray(x)
    assert_same(from_numpy(f, "f").reshape(6, 4).to_numpy(), f.reshape(6, 4))
    assert_same(from_numpy(x[::2, 1::3], "s").to_numpy(), x[::2, 1::3])
    assert_same(from_numpy([[1.0, 2.0]], "l").to_numpy(), np.array([[1.0, 2.0]]))


def test_seed_style_constructor_uint16_as_bfloat16():
    vals = rand((4, 6), np.float32, 12).astype(BF16)
    u16 = vals.view(np.uint16).reshape(-1)  # what MAX users hold: bf16 bits in a uint16 array, flat
    w = WeightData(u16, "layers.0.w", DType.bfloat16, (4, 6))
    assert w.name == "layers.0.w" and w.dtype is DType.bfloat16 and w.shape == (4, 6)
    assert_same(w.to_numpy(), vals)
    assert_same(w.astype(DType.float32).to_numpy(), vals.astype(np.float32))
    w2 = WeightData(u16, "w", DType.bfloat16, [4, 6], quantization_encoding=None)
    assert_same(w2.to_numpy(), vals)
    with pytest.raises(DTypeError):
        WeightData(u16, "w", DType.float32, (4, 6))  # different item size: not a relabelling
    with pytest.raises(ShapeError):
        WeightData(u16, "w", DType.bfloat16, (5, 5))


def test_ops_are_lazy_and_return_new_weightdata():
    x = rand((4, 4), np.float32)
    w = from_numpy(x, "w")
    for v in (w.astype(DType.float16), w.view(DType.uint32), w.reshape(16), w.T, w[::2], w[[1, 0]],
              concat([w, w]), stack([w, w]), split(w, 2)[0], w.swapaxes(0, 1), w.permute((1, 0))):
        assert isinstance(v, WeightData) and v is not w and v.name == "w"
    assert w.dtype is DType.float32 and w.shape == (4, 4)  # the original is unchanged


# --- build-time errors -----------------------------------------------------------------------------------
def test_reshape_and_permute_errors_at_build_time_with_both_shapes():
    w = from_numpy(rand((4, 6), BF16), "w")
    with pytest.raises(ShapeError) as e:
        w.reshape(5, 5)
    msg = str(e.value)
    assert "[4, 6]" in msg and "[5, 5]" in msg and "bfloat16" in msg
    with pytest.raises(ShapeError) as e:
        w.reshape(-1, 7)
    assert "7" in str(e.value) and "24" in str(e.value)
    with pytest.raises(ShapeError):
        w.reshape(-1, -1)
    with pytest.raises(ShapeError):
        w.reshape(2.5, 4)
    with pytest.raises(ShapeError) as e:
        w.permute((0, 0))
    assert "[0, 0]" in str(e.value) and "[4, 6]" in str(e.value)
    with pytest.raises(ShapeError) as e:
        w.transpose(1, 0, 2)
    assert "[4, 6]" in str(e.value)
    with pytest.raises(ShapeError):
        w.swapaxes(0, 5)
    for err in (ShapeError, DTypeError):
        assert issubclass(err, LazyWeightsError)
    assert issubclass(ShapeError, ValueError)


# --- hypothesis: random op chains vs numpy ---------------------------------------------------------------
CHAIN_FLOATS = [DType.float32, DType.bfloat16, DType.float16, DType.float8_e4m3fn, DType.float8_e5m2,
                DType.float64]
CHAIN_INTS = [DType.int8, DType.uint8, DType.int16, DType.uint16, DType.int32, DType.int64]
VIEWABLE = [DType.uint8, DType.int8, DType.uint16, DType.int16, DType.float16, DType.bfloat16, DType.float32,
            DType.uint32, DType.int32, DType.float64, DType.int64, DType.float8_e4m3fn, DType.float8_e5m2]


def _factorizations(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def op_chain_case(draw):
    start_dt = draw(st.sampled_from([DType.float32, DType.bfloat16, DType.float8_e4m3fn, DType.float16]))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    seed = draw(st.integers(0, 2 ** 16))
    x = rand(shape, start_dt.to_numpy(), seed)
    w = from_numpy(x, "x")
    ops_done = []
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["astype", "view", "reshape", "permute", "index", "concat", "split", "stack"]))
        dt = DType.from_numpy(x.dtype)
        if kind == "astype":
            choices = CHAIN_FLOATS + (CHAIN_INTS if dt.is_integral else [])
            t = draw(st.sampled_from(choices))
            x, w = numpy_cast(x, t.to_numpy()), w.astype(t)
        elif kind == "view":
            t = draw(st.sampled_from(VIEWABLE))
            if x.ndim == 0 or (x.shape[-1] * x.dtype.itemsize) % t.size_in_bytes:
                continue
            x, w = np.ascontiguousarray(x).view(t.to_numpy()), w.view(t)
        elif kind == "reshape":
            n = x.size
            if n == 0:
                x, w = x.reshape(0, 1), w.reshape(0, 1)
                ops_done.append(kind)
                continue
            a = draw(st.sampled_from(_factorizations(n)))
            b = draw(st.sampled_from(_factorizations(n // a)))
            new = list(draw(st.permutations([a, b, n // a // b])))
            if draw(st.booleans()):
                new[draw(st.integers(0, 2))] = -1
            x, w = x.reshape(new), w.reshape(new)
        elif kind == "permute":
            axes = draw(st.permutations(list(range(x.ndim))))
            x, w = x.transpose(axes), w.permute(axes)
        elif kind == "index":
            if x.ndim == 0:
                continue
            key = []
            used_array = False
            for d in x.shape:
                c = draw(st.sampled_from(["slice", "int", "array", "full", "none"] if d else ["slice", "full", "none"]))
                if c == "slice":
                    step = draw(st.sampled_from([1, 2, 3, -1, -2]))
                    start = draw(st.one_of(st.none(), st.integers(-d - 1, d + 1)))
                    stop = draw(st.one_of(st.none(), st.integers(-d - 1, d + 1)))
                    key.append(slice(start, stop, step))
                elif c == "int":
                    key.append(draw(st.integers(-d, d - 1)))
                elif c == "array" and not used_array:
                    used_array = True
                    key.append(draw(st.lists(st.integers(-d, d - 1), min_size=0, max_size=6)))
                elif c == "none":
                    key.append(None)
                    key.append(slice(None))
                else:
                    key.append(slice(None))
            if all(isinstance(k, int) for k in key):
                key.append(None)  # keep results >= 1-d here; 0-d results have their own test
            key = tuple(key)
            x, w = np.asarray(x[key]), w[key]
        elif kind == "concat":
            if x.ndim == 0:
                continue
            axis = draw(st.integers(-x.ndim, x.ndim - 1))
            x, w = np.concatenate([x, x[::-1]], axis=axis), concat([w, w[::-1]], axis=axis)
        elif kind == "split":
            if x.ndim == 0:
                continue
            axis = draw(st.integers(0, x.ndim - 1))
            length = x.shape[axis]
            cut = draw(st.integers(0, length))
            part = draw(st.integers(0, 1))
            parts_np = np.split(x, [cut], axis=axis)
            parts_lw = split(w, [cut, length - cut], axis=axis)
            x, w = parts_np[part], parts_lw[part]
        elif kind == "stack":
            axis = draw(st.integers(0, x.ndim))
            x, w = np.stack([x, x], axis=axis), stack([w, w], axis=axis)
        ops_done.append(kind)
        assert w.shape == x.shape, (ops_done, w.shape, x.shape)
        assert w.dtype is DType.from_numpy(x.dtype), ops_done
        if x.size > 20000:
            break
    return w, x


@settings(max_examples=150, deadline=None, derandomize=True, report_multiple_bugs=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(op_chain_case())
def test_random_op_chains_equal_numpy(case):
    w, expected = case
    assert_same(w.to_numpy(), expected)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_random_reshape_permute_roundtrip(shape, data):
    x = rand(tuple(shape), BF16, 1)
    axes = data.draw(st.permutations(list(range(len(shape)))))
    inv = list(np.argsort(axes))
    w = from_numpy(x, "x").permute(axes).reshape(-1).reshape(x.transpose(axes).shape).permute(inv)
    assert_same(w.to_numpy(), x)


@pytest.mark.parametrize("dt", [np.float32, BF16, F8])
def test_zero_d_results_materialize_as_zero_d(dt):
    """A scalar (e.g. a k_scale, or x[i, j]) materializes with shape (), as safetensors and numpy give it."""
    x = rand((3, 4), dt, 13)
    w = from_numpy(x, "x")
    for got, expected in ((w[1, 2], x[1, 2]), (w[-1][0], x[-1][0]),
                          (w.reshape(12)[5].astype(DType.float32), x.reshape(12)[5].astype(np.float32)),
                          (from_numpy(np.asarray(x[0, 0]), "s"), np.asarray(x[0, 0]))):
        assert got.shape == ()
        assert_same(got.to_numpy(), np.asarray(expected))


def test_plan_materialize_keeps_zero_d_shape():
    x = np.array(0.125, dtype=np.float32)
    out = lw.plan({"s": from_numpy(x, "s"), "t": from_numpy(x, "t").astype(DType.bfloat16),
                   "u": from_numpy(np.arange(3, dtype=np.float32), "u")[1]}).materialize()
    assert out["s"].shape == () and out["t"].shape == () and out["u"].shape == ()
    assert_same(out["t"], x.astype(BF16))


def test_messages_match_seed_style():
    # Weight names appear in the errors indexing raises, so an adapter author knows which tensor.
    w = from_numpy(rand((2, 2), np.float32), "layers.3.q_proj.weight")
    with pytest.raises(ShapeError, match=re.escape("'layers.3.q_proj.weight'")):
        w[5]


# --- DLPack ------------------------------------------------------------------------------------------------
DLPACK_SCRIPT = r"""
import gc, sys, numpy as np, ml_dtypes
import lazyweights as lw
x = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5)
for dt in ("float32", "float16", "int32", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
    w = lw.from_numpy(x.astype(lw.DType(dt).to_numpy()), "w")
    cap = w.__dlpack__(); del cap; gc.collect()          # an unconsumed capsule must free cleanly
    try:
        got = np.from_dlpack(w)
        assert got.dtype == np.dtype(dt)
        assert np.array_equal(got.astype(np.float32), x.astype(lw.DType(dt).to_numpy()).astype(np.float32))
        print(dt, "numpy ok")
    except (BufferError, RuntimeError, TypeError) as e:  # numpy cannot import bf16/fp8: an error, not a crash
        print(dt, "numpy refused")
    gc.collect()
try:
    import torch
except ImportError:
    print("no torch"); sys.exit(0)
for dt, tdt in (("bfloat16", torch.bfloat16), ("float8_e4m3fn", torch.float8_e4m3fn), ("float16", torch.float16)):
    arr = x.astype(lw.DType(dt).to_numpy())
    t = torch.from_dlpack(lw.from_numpy(arr, "w"))
    assert t.dtype == tdt and tuple(t.shape) == arr.shape
    assert t.data_ptr() == arr.ctypes.data  # zero copy
    assert np.array_equal(t.float().numpy(), arr.astype(np.float32))
    del t; gc.collect()
    print(dt, "torch ok")
"""


def test_dlpack_export_bf16_fp8_no_crash(tmp_path, child_env):
    import subprocess
    import sys
    script = tmp_path / "dl.py"
    script.write_text(DLPACK_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=child_env)
    assert proc.returncode == 0, f"exit {proc.returncode} (negative: killed by a signal)\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout
    for dt in ("float32", "float16", "int32"):
        assert f"{dt} numpy ok" in out
    if "no torch" not in out:
        assert "bfloat16 torch ok" in out and "float8_e4m3fn torch ok" in out
