"""lazyweights.kernels.casts: every fast path is bit-identical to numpy/ml_dtypes astype.

The kernels are the C extension's (`_ccasts.c`); `test_no_compiled_flag` holds numpy's path (compiled casts
switched off) to the same contract. Exhaustive over every bf16, f16 and
8-bit source pattern; for float32 sources about three million patterns that cover every exponent, NaN
payloads, the overflow threshold and subnormal boundary of each destination, and round-to-nearest-even
ties. Results are compared as unsigned integers, so NaN bit patterns, -0.0 and
signed infinities must match exactly.
"""
from __future__ import annotations

import doctest
import os
import subprocess
import sys
import tracemalloc
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from lazyweights.kernels import casts
from lazyweights.kernels.casts import cast, cast_into, has_fast_path

REPO = Path(__file__).resolve().parents[2]
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
HALVES = [BF16, F16]
FLOAT_FAST = [F32, F16, BF16, E4M3, E5M2]
BYTE_FLOATS = list(casts._BYTE_FLOATS)

needs_compiled = pytest.mark.skipif(not casts.HAVE_C, reason="compiled casts switched off (LAZYWEIGHTS_CAST_KERNELS)")


def name(d) -> str:
    return np.dtype(d).name


def reference(src: np.ndarray, dst) -> np.ndarray:
    with np.errstate(all="ignore"):
        return src.astype(dst)


def assert_bits_equal(got: np.ndarray, want: np.ndarray, src: np.ndarray | None = None) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.view(UINT[got.dtype.itemsize]), want.view(UINT[want.dtype.itemsize])
    if np.array_equal(g, w):
        return
    bad = np.flatnonzero((g != w).reshape(-1))
    lines = []
    for i in bad[:8]:
        s = ("" if src is None
             else f"src {int(np.ascontiguousarray(src).reshape(-1).view(UINT[src.dtype.itemsize])[i]):#x} -> ")
        lines.append(f"  [{i}] {s}got {int(g.reshape(-1)[i]):#x}, astype {int(w.reshape(-1)[i]):#x}")
    pytest.fail(f"{bad.size} of {g.size} elements differ ({src.dtype if src is not None else '?'} -> "
                f"{want.dtype}):\n" + "\n".join(lines))


def kernel_cast(src: np.ndarray, dst) -> np.ndarray:
    """Cast through the compiled kernel itself, failing if the pair has no kernel or if the kernel's own
    first-use self-check switched it off (which would otherwise hide a kernel bug behind numpy)."""
    dst = np.dtype(dst)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        kernel = casts._kernel_for(src.dtype, dst)
    assert kernel is not None, casts._disabled.get((src.dtype, dst), f"no kernel for {src.dtype}->{dst}")
    assert has_fast_path(src.dtype, dst)
    out = np.empty(src.shape, dst)
    kernel.run(np.ascontiguousarray(src).reshape(-1), out.reshape(-1))
    return out


def all_patterns(dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    return np.arange(1 << (8 * dtype.itemsize), dtype=UINT[dtype.itemsize]).view(dtype)


def f32_patterns() -> np.ndarray:
    """About three million float32 bit patterns aimed at every rule a narrowing cast has."""
    rng = np.random.default_rng(20240607)
    parts = [rng.integers(0, 1 << 32, size=1_000_000, dtype=np.uint32)]
    exps = np.arange(256, dtype=np.uint32) << np.uint32(23)
    # Every exponent, with mantissas at, just below and just above the tie of each destination's rounding
    # (f16 drops 13 bits, bf16 16, e4m3 20, e5m2 21), with both parities of the kept part.
    mants = []
    for shift in (13, 16, 20, 21):
        kept = rng.integers(0, 1 << (23 - shift), size=24, dtype=np.uint32)
        kept = np.concatenate([kept, np.array([0, 1, 2, 3, (1 << (23 - shift)) - 1], np.uint32)])
        half = np.uint32(1 << (shift - 1))
        low = rng.integers(0, 1 << (shift - 1), size=kept.size, dtype=np.uint32)
        for offset in (half - 1, half, half + 1, np.uint32(0), np.uint32((1 << shift) - 1)):
            mants.append((kept << np.uint32(shift)) + offset)
        mants.append((kept << np.uint32(shift)) + half + low)
        mants.append((kept << np.uint32(shift)) + low)
    mants = np.unique(np.concatenate(mants) & np.uint32(0x7FFFFF))
    parts.append((exps[:, None] | mants[None, :]).reshape(-1))
    # Dense sweeps of consecutive patterns around each destination's overflow threshold, largest finite
    # value, smallest normal, smallest subnormal and half of it (where rounding to zero begins).
    points = [65504.0, 65520.0, 448.0, 464.0, 480.0, 57344.0, 61440.0, 2.0**-14, 2.0**-24, 2.0**-25,
              2.0**-6, 2.0**-9, 2.0**-10, 2.0**-16, 2.0**-17, 2.0**-126, 2.0**-149, 1.0,
              float(np.finfo(np.float32).max), 3.3895313892515355e38]  # bf16 max
    for p in points:
        centre = int(np.array(p, np.float32).view(np.uint32))
        parts.append(np.arange(max(centre - 40_000, 0), min(centre + 40_000, 0x7F800001), dtype=np.uint32))
    # f32 subnormals, infinities, and NaNs with random payloads (quiet and signalling).
    parts.append(np.arange(0, 50_000, dtype=np.uint32))
    parts.append(np.arange(0x7F800000 - 1000, 0x7F800000 + 50_000, dtype=np.uint32))
    parts.append(np.uint32(0x7F800000) | rng.integers(1, 1 << 23, size=100_000, dtype=np.uint32))
    parts.append(np.array([0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FBFFFFF, 0x7F802000, 0x7F801FFF,
                           0x7FC00001, 0x7F800000, 0], np.uint32))
    pos = np.concatenate(parts) & np.uint32(0x7FFFFFFF)
    return np.concatenate([pos, pos | np.uint32(0x80000000)]).view(np.float32)


@pytest.fixture(scope="module")
def f32_src() -> np.ndarray:
    return f32_patterns()


# --- exhaustive and large-sample bit-exactness of each kernel ------------------------------------------

@needs_compiled
@pytest.mark.parametrize("src_dtype,dst_dtype", [(s, d) for s in HALVES for d in FLOAT_FAST if s != d],
                         ids=lambda d: name(d))
def test_every_16bit_pattern(src_dtype, dst_dtype):
    src = all_patterns(src_dtype)
    assert_bits_equal(kernel_cast(src, dst_dtype), reference(src, dst_dtype), src)


@needs_compiled
@pytest.mark.parametrize("dst_dtype", [F16, BF16, E4M3, E5M2], ids=name)
def test_float32_patterns(f32_src, dst_dtype):
    assert f32_src.size > 2_000_000
    assert_bits_equal(kernel_cast(f32_src, dst_dtype), reference(f32_src, dst_dtype), f32_src)


@needs_compiled
@pytest.mark.parametrize("src_dtype", BYTE_FLOATS, ids=name)
def test_every_8bit_pattern(src_dtype):
    src = all_patterns(src_dtype)
    for dst_dtype in [F32, F16, BF16, F64] + BYTE_FLOATS:
        if dst_dtype == src_dtype:
            continue
        if not np.can_cast(src_dtype, dst_dtype, casting="unsafe"):  # ml_dtypes: e8m0 <-> other fp8
            assert not has_fast_path(src_dtype, dst_dtype)
            with pytest.raises(TypeError, match="no cast"):
                cast(src, dst_dtype)
            continue
        assert_bits_equal(kernel_cast(src, dst_dtype), reference(src, dst_dtype), src)


@needs_compiled
def test_fast_path_table():
    pairs = [(s, d) for s in [F32, F16, BF16] for d in FLOAT_FAST if s != d]
    pairs += [(s, d) for s in [E4M3, E5M2] for d in [F32, F16, BF16]]
    for s, d in pairs:
        assert has_fast_path(s, d), (s, d)
        assert has_fast_path(name(s), name(d))
    for s, d in [(F64, F16), (F32, np.int8), (np.int32, F32), (F32, np.dtype(ml_dtypes.float8_e4m3fnuz)),
                 (np.dtype(">f4"), F16)]:
        assert not has_fast_path(s, d), (s, d)
    assert has_fast_path(F64, F64)


def test_has_fast_path_accepts_dtype_enum():
    from lazyweights.core.dtype import DType

    assert has_fast_path(DType.bfloat16, DType.float16) == casts.USE_COMPILED
    assert cast(np.array([1.5], np.float32), DType.bfloat16).dtype == BF16


# --- cast_into: layouts ----------------------------------------------------------------------------------

def random_values(shape, dtype, seed=0) -> np.ndarray:
    """Weight-like values plus zeros, -0.0, inf and NaN, as `dtype`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(0.05)
    flat = x.reshape(-1)
    flat[::97] = np.float32(3e-6)
    flat[1::89] = -0.0
    flat[2::1013] = np.inf
    flat[3::1019] = np.nan
    return reference(x, dtype)


def views(base: np.ndarray):
    """Non-contiguous views of the kind an adapter hands to a cast (base is 64 x 520)."""
    # Last axis contiguous: rows close together are converted in place (all of them with the tiny_chunk
    # settings of test_strided_sources), one kernel call per run of equally spaced rows; others are copied.
    yield "rows_step", base[::3]
    yield "column_slice", base[:, 5:-7]
    yield "rows_reversed", base[::-2, 8:]
    yield "rows_broadcast", np.broadcast_to(base[3], (7, base.shape[1]))
    yield "3d_collapsible", base.reshape(8, 8, 520)[:, ::2]
    yield "3d_rows_permuted", base.reshape(8, 8, 520).transpose(1, 0, 2)  # one call per leading index
    # Last axis strided: copied into a contiguous buffer block by block.
    yield "transposed", base.T
    yield "reversed", base[::-1, ::-2]
    yield "rows_gathered", base[[4, 0, 9, 9, 2]][:, ::2]  # fancy indexing copies; then a strided view
    yield "3d_permuted", base.reshape(base.shape[0], -1, 4).transpose(2, 0, 1)
    yield "1d_strided", base.reshape(-1)[::7]
    yield "short_rows", base[:, :10]


@pytest.mark.parametrize("pair", [(BF16, F16), (BF16, F32), (F32, F16), (F16, F32), (F32, BF16),
                                  (F16, BF16), (F32, E4M3), (BF16, E5M2), (E4M3, BF16), (F64, F16)],
                         ids=lambda p: f"{name(p[0])}->{name(p[1])}")
@pytest.mark.parametrize("chunk_bytes", [None, 1000], ids=["default_chunk", "tiny_chunk"])
def test_strided_sources(pair, chunk_bytes, monkeypatch):
    if chunk_bytes:  # many blocks, and in-place row calls down to tiny ones
        monkeypatch.setattr(casts, "_CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(casts, "_MIN_ROW", 4)
        monkeypatch.setattr(casts, "_MIN_CALL", 16)
        monkeypatch.setattr(casts, "_MAX_GAP", 1 << 30)
    src_dtype, dst_dtype = pair
    base = random_values((64, 520), src_dtype)
    for label, view in views(base):
        out = np.empty(view.shape, dst_dtype)
        cast_into(view, out)
        try:
            assert_bits_equal(out, reference(view, dst_dtype), view)
        except AssertionError as e:  # say which view (strided, reversed, ...) differed
            raise AssertionError(f"{label}: {e}") from None


@needs_compiled
def test_rows_are_read_in_place():
    # A column slice dropping a few columns: no scratch copy, no temporary of any size.
    src = random_values((1024, 1024), BF16)[:, 100:1000]
    out = np.empty(src.shape, F16)
    cast_into(src, out)  # once untraced: the first large call starts the kernels' thread pool (run alone, ~260 KB)
    tracemalloc.start()
    try:
        cast_into(src, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10, peak
    assert_bits_equal(out, reference(src, F16), src)


def test_readonly_memmap_transposed(tmp_path):
    path = tmp_path / "w.bin"
    base = random_values((128, 96), BF16)
    base.tofile(path)
    mm = np.memmap(path, dtype=BF16, mode="r", shape=base.shape)
    assert not mm.flags.writeable
    for view in (mm, mm.T, mm[::2, 1:]):
        assert_bits_equal(cast(view, F16), reference(np.asarray(view), F16))
    del mm


def test_misaligned_source():
    raw = bytearray(4001)
    raw[1:] = random_values(1000, F32).tobytes()
    src = np.frombuffer(raw, dtype=np.uint8, offset=1).view(np.float32)
    assert not src.flags.aligned
    assert_bits_equal(cast(src, F16), reference(src, F16), src)


@pytest.mark.parametrize("dst_dtype", [F16, BF16, E4M3, F32], ids=name)
def test_zero_d_and_empty(dst_dtype):
    src = np.array(3.14159, dtype=BF16)
    assert cast(src, dst_dtype).shape == ()
    assert_bits_equal(cast(src, dst_dtype), reference(src, dst_dtype))
    out = np.empty((), dst_dtype)
    cast_into(np.float32(-0.0).reshape(()), out)
    assert_bits_equal(out, reference(np.array(-0.0, np.float32), dst_dtype))
    for shape in [(0,), (0, 5), (3, 0, 2)]:
        got = cast(np.empty(shape, BF16), dst_dtype)
        assert got.shape == shape and got.dtype == dst_dtype


def test_same_dtype_is_a_copy():
    src = random_values((10, 12), BF16)
    got = cast(src.T, BF16)
    assert got.flags.c_contiguous and not np.shares_memory(got, src)
    assert_bits_equal(got, np.ascontiguousarray(src.T))


def test_non_contiguous_output_still_exact():
    src = random_values((20, 30), F32)
    out = np.zeros((30, 20), F16).T  # Fortran-ordered output: numpy path
    cast_into(src, out)
    assert_bits_equal(np.ascontiguousarray(out), reference(src, F16))


def test_bad_outputs():
    from lazyweights.core.errors import LazyWeightsError

    src = np.zeros((2, 3), F32)
    with pytest.raises(ValueError) as e:
        cast_into(src, np.empty((3, 2), F16))
    assert isinstance(e.value, LazyWeightsError) and "(2, 3)" in str(e.value) and "(3, 2)" in str(e.value)
    ro = np.empty((2, 3), F16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        cast_into(src, ro)
    with pytest.raises(TypeError):
        cast_into(src, [[0, 0, 0], [0, 0, 0]])


# --- numpy fallback, threads, memory -----------------------------------------------------------------------

@pytest.mark.parametrize("pair", [(F64, BF16), (F32, np.dtype(ml_dtypes.float8_e4m3fnuz)), (BF16, F64),
                                  (np.dtype(np.int32), BF16), (BF16, np.dtype(np.int8)),
                                  (F16, np.dtype(ml_dtypes.float8_e8m0fnu)), (F32, np.dtype(ml_dtypes.float4_e2m1fn)),
                                  (np.dtype(">f4"), F16), (F16, np.dtype(">f4"))],
                         ids=lambda p: f"{p[0].str}->{p[1].str}")
def test_fallback_pairs_match_astype(pair):
    src_dtype, dst_dtype = pair
    assert not has_fast_path(src_dtype, dst_dtype)
    if src_dtype.kind in "iu":
        base = np.random.default_rng(1).integers(-300, 300, size=(40, 50)).astype(src_dtype)
    else:
        base = random_values((40, 50), src_dtype)
    for view in (base, base.T, base[::2, 3:]):
        assert_bits_equal(cast(view, dst_dtype), reference(view, dst_dtype), view)


def test_no_compiled_flag(monkeypatch, f32_src):
    monkeypatch.setattr(casts, "USE_COMPILED", False)
    assert not has_fast_path(BF16, F16) and has_fast_path(F16, F16)
    assert casts.kernel_backend() == "numpy"
    for src in (all_patterns(BF16), all_patterns(F16), f32_src[:200_000], all_patterns(E4M3)):
        for dst in FLOAT_FAST:
            if dst != src.dtype:
                assert_bits_equal(cast(src, dst), reference(src, dst), src)
    base = random_values((30, 40), BF16)
    assert_bits_equal(cast(base.T, F16), reference(base.T, F16))


def run_fresh(code: str, **env) -> str:
    env = dict(os.environ, **env,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_numpy_only_env_var():
    code = (
        "import sys, numpy as np, ml_dtypes\n"
        "from lazyweights.kernels import casts\n"
        "assert not casts.HAVE_C and not casts.USE_COMPILED\n"
        "assert not casts.has_fast_path(ml_dtypes.bfloat16, np.float16)\n"
        "x = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(256, 256).T\n"
        "with np.errstate(all='ignore'):\n"
        "    ref = x.astype(np.float16)\n"
        "assert np.array_equal(casts.cast(x, np.float16).view(np.uint16), ref.view(np.uint16))\n"
        "print(casts.kernel_backend())\n"
    )
    assert run_fresh(code, LAZYWEIGHTS_CAST_KERNELS="numpy") == "numpy"
    # A value from before numba was removed (or a typo) warns and keeps the C casts.
    for value in ("numba", "fortran"):
        with_bad = run_fresh("import warnings; warnings.simplefilter('error')\n"
                             "try:\n    from lazyweights.kernels import casts\nexcept RuntimeWarning as e:\n"
                             "    print(e)", LAZYWEIGHTS_CAST_KERNELS=value)
        assert f"LAZYWEIGHTS_CAST_KERNELS={value!r} is not one of auto, c, numpy; using auto" in with_bad
    assert run_fresh("from lazyweights.kernels import casts; print(casts.kernel_backend())",
                     LAZYWEIGHTS_CAST_KERNELS="numba") == "c"


def test_a_plan_casts_with_c_and_imports_no_jit():
    # A fresh process casts at full speed with the C kernels, and nothing imports numba (no longer a
    # dependency: a leftover import would be an ImportError on a clean install).
    code = (
        "import sys, numpy as np, ml_dtypes, lazyweights as lw\n"
        "x = (np.arange(1 << 22, dtype=np.float32) * np.float32(1e-3)).reshape(2048, 2048)\n"
        "wd = lw.WeightData.from_numpy(x.astype(ml_dtypes.bfloat16), 'w').T.astype(lw.DType.float16)\n"
        "got = lw.plan({'w': wd}).materialize()['w']\n"
        "ref = x.astype(ml_dtypes.bfloat16).T.astype(np.float16)\n"
        "assert np.array_equal(got.view(np.uint16), ref.view(np.uint16))\n"
        "from lazyweights.kernels import casts\n"
        "print(casts.kernel_backend(), 'numba' in sys.modules)\n"
    )
    assert run_fresh(code) == "c False"


def test_a_missing_build_is_a_dependency_error(monkeypatch):
    # The extensions are required (setup.py fails the install without a compiler); an install whose .so was
    # removed gets a DependencyError that says how to rebuild, not a bare ImportError deep in a plan.
    from lazyweights.core.errors import DependencyError

    monkeypatch.setitem(sys.modules, "lazyweights.kernels._ccasts", None)  # import then raises ImportError
    with pytest.raises(DependencyError, match=r"_ccasts is not built .*reinstall with a C compiler"):
        casts.compiled_kernels()


@pytest.mark.skipif(not casts.HAVE_C, reason="the C extension was not built")
def test_c_kernels_check_their_arguments():
    # The C kernels check every range themselves: a bad call is a ValueError, never a read or write outside
    # the buffers.
    from lazyweights.kernels import _ccasts as C

    src = np.arange(100, dtype=np.uint16)
    out = np.zeros(100, np.uint16)
    C.k_bf16_to_f16(src, out, 10, 10, 0, 10)
    assert_bits_equal(out.view(F16), reference(src.view(BF16), F16))
    C.k_bf16_to_f16(src, out, 10, 10, 90, -10)  # rows in reverse order
    assert_bits_equal(out.view(F16), reference(src.view(BF16).reshape(10, 10)[::-1], F16).reshape(-1))
    bad = [((11, 10, 0, 10), "output buffer is too small"), ((10, 10, 1, 10), "row lies outside"),
           ((2, 10, 0, 100), "outside the source"), ((2, 10, 5, -10), "row lies outside"),
           ((-1, 10, 0, 0), "must not be negative"), ((1, 101, 0, 0), "too small"),
           ((1, 10, 95, 0), "row lies outside"),
           # products that would overflow 64 bits if multiplied before being bounded
           ((1 << 40, 1 << 40, 0, 0), "too small"), ((2, 10, 0, 1 << 62), "outside the source"),
           ((10, 10, 0, -(1 << 62)), "outside the source")]
    for (rows, cols, first, stride), message in bad:
        with pytest.raises(ValueError, match=message):
            C.k_bf16_to_f16(src, out, rows, cols, first, stride)
    with pytest.raises(ValueError, match="not aligned"):
        C.k_bf16_to_f16(np.frombuffer(bytes(201), np.uint8)[1:].view(np.uint16), out, 1, 10, 0, 0)
    with pytest.raises((BufferError, TypeError, ValueError)):
        C.k_bf16_to_f16(src, bytes(200), 1, 10, 0, 0)  # a read-only output
    with pytest.raises(ValueError, match="256 aligned entries"):
        C.k_lut(np.zeros(4, np.uint8), np.zeros(4, np.uint16), 1, 4, 0, 0, np.zeros(255, np.uint16))
    with pytest.raises(TypeError, match="takes src, out"):
        C.k_bf16_to_f16(src, out, 1, 10)
    with pytest.raises(ValueError, match="nan_base"):
        C.k_f32_to_f16(np.zeros(4, np.uint32), np.zeros(4, np.uint16), 1, 4, 0, 0, -1, 0, 0)


@needs_compiled
def test_disagreeing_kernel_is_switched_off(monkeypatch):
    # Simulate an ml_dtypes/numpy whose behaviour the kernel does not reproduce: wire bf16->f32's kernel
    # (a plain shift) to the f16->f32 pair. The self-check must catch it and numpy must take over.
    casts._kernel_for(BF16, F32)
    table = dict(casts._table)
    table[(F16, F32)] = table[(BF16, F32)]
    monkeypatch.setattr(casts, "_table", table)
    monkeypatch.setattr(casts, "_disabled", {})
    monkeypatch.setattr(casts, "_verified", set())
    src = all_patterns(F16)
    with pytest.warns(RuntimeWarning, match="float16->float32 cast disagrees"):
        got = cast(src, F32)
    assert_bits_equal(got, reference(src, F32), src)
    assert not has_fast_path(F16, F32)


def test_two_threads_match():
    src = random_values((512, 1024), BF16)
    out = np.empty(src.shape, F16)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda s: cast_into(src[s], out[s]), [slice(0, 256), slice(256, None)]))
    assert_bits_equal(out, reference(src, F16), src)


@pytest.mark.parametrize("use_compiled", [True, False], ids=["compiled", "numpy"])
def test_strided_cast_allocates_no_full_size_temporary(monkeypatch, use_compiled):
    if use_compiled and not casts.HAVE_C:
        pytest.skip("no compiled kernels")
    monkeypatch.setattr(casts, "USE_COMPILED", use_compiled)
    src = random_values((2048, 2048), BF16).T  # 8 MB, transposed
    out = np.empty(src.shape, F16)
    cast_into(src[:8], out[:8])  # compile and self-check outside the measurement
    tracemalloc.start()
    try:
        cast_into(src, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * casts._CHUNK_BYTES + (256 << 10), peak
    assert_bits_equal(out, reference(src, F16))


def test_docstring_examples():
    result = doctest.testmod(casts, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 4 and result.failed == 0


def test_gather_same_dtype_strided():
    """A same-dtype row gather from an overlapping strided view (what a RoPE permute of a bf16 q/k becomes)
    gives numpy's rows without copying the whole view first (np.take did: a 1 GB copy for a 1024x1024 k_proj)."""
    import time

    import ml_dtypes

    from lazyweights.kernels.casts import gather_cast_into

    base = (np.arange(1024 * 1024 + 1024) % 251).astype(ml_dtypes.bfloat16)
    src = np.lib.stride_tricks.as_strided(base, (1023 * 1024 + 1, 1024), (2, 2))
    idx = np.arange(1024)[::-1] * 1024
    out = np.empty((1024, 1024), ml_dtypes.bfloat16)
    t = time.perf_counter()
    gather_cast_into(src, idx, out)
    elapsed = time.perf_counter() - t
    np.testing.assert_array_equal(out.view(np.uint16), src[idx].view(np.uint16))
    assert elapsed < 0.5, f"{elapsed:.2f} s: the whole strided source was copied"
