"""lazyweights.kernels.casts.gather_cast_into: rows gathered by an index array and cast in one pass.

The contract: ``gather_cast_into(src, rows, out)`` leaves in `out` exactly the bits of
``src[rows].astype(out.dtype)`` (numpy/ml_dtypes are the reference), for every source layout whose rows
are contiguous (read-only memory maps, row and column slices, reversed rows, 3-D rows), on every kernel
path: the C kernels gather in place; numpy's path (compiled casts off) gathers into a temporary first. A negative or
out-of-range row index is an IndexError with the same message on every path, never a stray read.
Results are compared as unsigned integers, so NaN payloads, -0.0 and infinities must match exactly.
"""
from __future__ import annotations

import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

from lazyweights.kernels import casts
from lazyweights.kernels.casts import gather_cast_into

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
BF16, E4M3 = np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn)

# The C kernels, and numpy alone (compiled casts switched off).
BUILDS = (["c"] if casts.HAVE_C else []) + ["numpy"]


@pytest.fixture(autouse=True, scope="module", params=BUILDS)
def build(request):
    """Run the module once with the C kernels and once with numpy's path."""
    saved = casts.USE_COMPILED
    casts.USE_COMPILED = request.param != "numpy"
    assert casts.kernel_backend() == request.param
    yield request.param
    casts.USE_COMPILED = saved


def name(d) -> str:
    return np.dtype(d).name


def reference(src: np.ndarray, dst) -> np.ndarray:
    with np.errstate(all="ignore"):
        return src.astype(dst)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.view(UINT[got.dtype.itemsize]), want.view(UINT[want.dtype.itemsize])
    bad = np.flatnonzero((g != w).reshape(-1))
    assert bad.size == 0, (f"{bad.size} of {g.size} elements differ, first at {int(bad[0])}: got "
                           f"{int(g.reshape(-1)[bad[0]]):#x}, astype {int(w.reshape(-1)[bad[0]]):#x}")


def edge_values(shape, dtype, seed=0) -> np.ndarray:
    """Weight-like values salted with the cases casts get wrong: NaNs with payloads (quiet, signalling,
    negative), +-inf, +-0, subnormals of every format involved, overflow for float16, RNE ties."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    flat = x.reshape(-1).view(np.uint32)
    specials = np.array([0x7FC00000, 0x7F800001, 0xFFC00123, 0x7FA00000, 0x7F800000, 0xFF800000, 0x00000000,
                         0x80000000, 0x00000001, 0x00400000, 0x80012345, 0x33800000, 0x33000000, 0x387FC000,
                         0x477FE000, 0x477FF000, 0x47800000, 0xC77FFFFF, 0x3F808000, 0x3F818000, 0x43E00000,
                         0x43E80000], np.uint32)
    for k, v in enumerate(specials):
        flat[k::len(specials) * 7 + 3] = v
    return reference(x, dtype) if dtype != F32 else x


PAIRS = [(BF16, F16), (BF16, F32), (F32, BF16), (F16, F32), (F32, F16), (F16, BF16), (F32, E4M3), (F64, F16)]


def layouts(base: np.ndarray):
    """Sources whose rows are contiguous, as an adapter's chain hands them over (base is 96 x 136)."""
    yield "contiguous", base
    yield "readonly", _readonly(base)
    yield "column_slice", base[:, 3:-5]  # row stride > row length
    yield "rows_step", base[1::3]
    yield "rows_reversed", base[::-1]  # negative row stride
    yield "3d_rows", base.reshape(48, 2, 136)  # a row is a contiguous (2, 136) block
    yield "heads", base.reshape(6, 16, 136)[2]  # one head of a q_proj


def _readonly(a: np.ndarray) -> np.ndarray:
    r = a.view()
    r.flags.writeable = False
    return r


def indices(n: int, seed=1):
    rng = np.random.default_rng(seed)
    yield "permutation", rng.permutation(n)
    yield "rope", np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)])
    yield "repeats", rng.integers(0, n, size=2 * n + 1)
    yield "single", np.array([n - 1])
    yield "int32", rng.permutation(n).astype(np.int32)  # any integer dtype is accepted


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{name(p[0])}->{name(p[1])}")
def test_matches_astype_of_the_gather(pair):
    src_dtype, dst_dtype = pair
    base = edge_values((96, 136), src_dtype)
    for label, src in layouts(base):
        for how, idx in indices(src.shape[0]):
            out = np.empty((len(idx),) + src.shape[1:], dst_dtype)
            gather_cast_into(src, idx, out)
            want = reference(src[np.asarray(idx, np.int64)], dst_dtype)
            assert_bits_equal(out, want), (label, how)


def test_readonly_memmap_source(tmp_path):
    path = tmp_path / "w.bin"
    base = edge_values((256, 192), BF16)
    base.tofile(path)
    mm = np.memmap(path, dtype=BF16, mode="r", shape=(256, 192))
    perm = np.concatenate([np.arange(0, 64, 2), np.arange(1, 64, 2)])
    idx = (np.arange(4)[:, None] * 64 + perm[None, :]).reshape(-1)  # a RoPE permutation in 4 heads
    out = np.empty((256, 192), F16)
    gather_cast_into(mm, idx, out)
    assert_bits_equal(out, reference(base[idx], F16))


def test_same_dtype_is_a_gather():
    base = edge_values((40, 72), BF16)
    idx = np.arange(40)[::-1]
    out = np.empty((40, 68), BF16)
    gather_cast_into(base[:, 4:], idx, out)
    assert_bits_equal(out, base[:, 4:][idx])
    with pytest.raises(IndexError, match="row index -2"):
        gather_cast_into(base, [0, -2], np.empty((2, 72), BF16))  # not counted from the end, as numpy would


@pytest.mark.parametrize("dst", [F16, F32, BF16])
def test_empty_index(dst):
    """No rows asked for: nothing written, no error; an empty index for a one-row output is a shape error
    that writes nothing."""
    base = edge_values((8, 16), BF16)
    out = np.empty((0, 16), dst)
    for src, rows in ((base, np.array([], np.int64)), (base[:0], []), (base, np.array([], np.int32))):
        assert gather_cast_into(src, rows, out) is None
        assert out.shape == (0, 16) and out.dtype == dst
    one_row = np.full((1, 16), 7, dst)
    with pytest.raises((ValueError, IndexError), match="0|1"):
        gather_cast_into(base, np.array([], np.int64), one_row)
    assert (one_row == 7).all()


@pytest.mark.parametrize("bad,why", [([3, -1], "-1 \\(at position 1 of 2\\) is negative"),
                                     ([8], "8 \\(at position 0 of 1\\) is out of range"),
                                     ([0, 1 << 62], "4611686018427387904 \\(at position 1 of 2\\) is out of range"),
                                     ([-(1 << 62)], "-4611686018427387904 \\(at position 0 of 1\\) is negative")])
@pytest.mark.parametrize("src_kind", ["contiguous", "column_slice", "rows_reversed"])
def test_bad_index_is_a_clear_error(bad, why, src_kind):
    base = edge_values((8, 136), BF16)
    base = {"contiguous": base, "column_slice": base[:, 3:-5], "rows_reversed": base[::-1]}[src_kind]
    out = np.full((len(bad), base.shape[1]), 7, F16)
    with pytest.raises(IndexError, match=f"row index {why}: the source holds rows 0..7"):
        gather_cast_into(base, np.array(bad, np.int64), out)
    with pytest.raises(IndexError, match="the source holds rows 0..-1"):
        gather_cast_into(base[:0], np.array([0]), out[:1])


def test_bad_arguments():
    base = edge_values((8, 16), BF16)
    with pytest.raises(ValueError, match="do not fit output shape"):
        gather_cast_into(base, [0, 1], np.empty((3, 16), F16))
    with pytest.raises(ValueError, match="1-D integer array"):
        gather_cast_into(base, np.array([[0, 1]]), np.empty((2, 16), F16))
    with pytest.raises(ValueError, match="1-D integer array"):
        gather_cast_into(base, np.array([0.0, 1.0]), np.empty((2, 16), F16))
    with pytest.raises(ValueError, match="read-only"):
        gather_cast_into(base, [0], _readonly(np.empty((1, 16), F16)))
    with pytest.raises(ValueError, match="0-d"):
        gather_cast_into(base[0, 0], [0], np.empty((1,), F16))


def test_non_contiguous_rows_still_exact():
    # Rows that are not contiguous (a transposed source) cannot be read in place: gathered, then cast.
    base = edge_values((64, 48), BF16)
    src = base.T
    idx = np.array([5, 0, 47, 3])
    out = np.empty((4, 64), F16)
    gather_cast_into(src, idx, out)
    assert_bits_equal(out, reference(src[idx], F16))


def test_two_threads_match():
    base = edge_values((512, 1024), BF16)
    idx = np.random.default_rng(3).permutation(512)
    out = np.empty(base.shape, F16)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda s: gather_cast_into(base, idx[s], out[s]), [slice(0, 256), slice(256, None)]))
    assert_bits_equal(out, reference(base[idx], F16))


def test_c_kernel_gathers_in_place(build, monkeypatch):
    """With the C kernels there is no gathered copy: no temporary bigger than the index, and the two-pass
    fallback (`cast_into` of ``src[rows]``) is never called."""
    if build != "c":
        pytest.skip("only the C kernels gather in place")
    base = edge_values((2048, 1024), BF16)  # 4 MB
    idx = np.random.default_rng(4).permutation(2048)
    out = np.empty(base.shape, F16)

    def no_fallback(*a, **k):
        raise AssertionError("gather_cast_into fell back to gather-then-cast")

    monkeypatch.setattr(casts, "cast_into", no_fallback)
    gather_cast_into(base, idx[:8], out[:8])
    tracemalloc.start()
    try:
        gather_cast_into(base, idx, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10, peak  # the index and its sort order (48 KB), never the 4 MB of gathered rows
    assert_bits_equal(out, reference(base[idx], F16))


def test_c_kernel_checks_its_index(build):
    """The kernel itself (not only casts.py) rejects bad indexes: never a read outside the source."""
    if build != "c":
        pytest.skip("the C kernels only")
    from lazyweights.kernels import _ccasts as C

    src = np.arange(100, dtype=np.uint16)
    out = np.zeros(30, np.uint16)
    C.k_bf16_to_f16(src, out, np.array([9, 0, 4]), 10, 0, 10)
    assert_bits_equal(out.view(F16), reference(src.view(BF16).reshape(10, 10)[[9, 0, 4]], F16).reshape(-1))
    C.k_bf16_to_f16(src, out, np.array([9, 0, 4]), 10, 90, -10)  # rows numbered from the end
    assert_bits_equal(out.view(F16), reference(src.view(BF16).reshape(10, 10)[::-1][[9, 0, 4]], F16).reshape(-1))
    C.k_bf16_to_f16(src, out, np.array([], np.int64), 10, 0, 10)
    for index, first, stride, match in [([10], 0, 10, "10 .* out of range: the source holds rows 0..9"),
                                        ([-1], 0, 10, "negative"), ([0, 1 << 62], 0, 10, "out of range"),
                                        ([9], 5, 10, "holds rows 0..8"), ([0], 95, 0, "holds rows 0..-1"),
                                        ([0], 95, -10, "holds rows 1..9"),
                                        ([1 << 62], 0, -(1 << 62), "holds rows 0..0")]:
        with pytest.raises(IndexError, match=match):
            C.k_bf16_to_f16(src, out, np.array(index, np.int64), 10, first, stride)
    with pytest.raises(ValueError, match="output buffer is too small"):
        C.k_bf16_to_f16(src, out, np.array([0, 1, 2, 3]), 10, 0, 10)
    with pytest.raises(TypeError, match="int64 array"):
        C.k_bf16_to_f16(src, out, np.array([0, 1], np.int32), 10, 0, 10)
    with pytest.raises(TypeError, match="int64 array"):
        C.k_bf16_to_f16(src, out, np.array([0, 1], np.uint64), 10, 0, 10)
    with pytest.raises((BufferError, ValueError)):
        C.k_bf16_to_f16(src, out, np.arange(6)[::2], 10, 0, 10)  # a strided index
    C.k_bf16_to_f16(src, out, np.int64(3), 10, 0, 10)  # a numpy integer is still a row count
    lut = np.arange(256, dtype=np.uint16)
    C.k_lut(np.arange(40, dtype=np.uint8), out, np.array([3, 1]), 10, 0, 10, lut)
    assert out[:20].tolist() == list(range(30, 40)) + list(range(10, 20))


def test_c_kernel_pairs(build):
    """(2, n) pairs: output row pairs[1, k] is source row pairs[0, k] (source rows visited in the given
    order); both halves are checked, the output rows against the output buffer."""
    if build != "c":
        pytest.skip("the C kernels only")
    from lazyweights.kernels import _ccasts as C

    src = np.arange(100, dtype=np.uint16)
    out = np.zeros(30, np.uint16)
    C.k_bf16_to_f16(src, out, np.array([[0, 4, 9], [1, 2, 0]]), 10, 0, 10)
    want = reference(src.view(BF16).reshape(10, 10)[[9, 0, 4]], F16)
    assert_bits_equal(out.view(F16), want.reshape(-1))
    C.k_bf16_to_f16(src, out, np.zeros((2, 0), np.int64), 10, 0, 10)
    C.k_bf16_to_f16(src, out, np.array([[1, 1, 1, 1], [0, 0, 1, 2]]), 10, 0, 10)  # more pairs than rows out
    for pairs, match in [([[10], [0]], "row index 10 .* the source holds rows 0..9"),
                         ([[0, -1], [0, 1]], "row index -1 .* negative"),
                         ([[0], [3]], "output row index 3 .* the output holds rows 0..2"),
                         ([[0, 0], [0, -2]], "output row index -2 \\(at position 1 of 2\\) is negative")]:
        with pytest.raises(IndexError, match=match):
            C.k_bf16_to_f16(src, out, np.array(pairs, np.int64), 10, 0, 10)
    with pytest.raises(TypeError):
        C.k_bf16_to_f16(src, out, np.zeros((3, 2), np.int64), 10, 0, 10)  # neither 1-D nor (2, n)
