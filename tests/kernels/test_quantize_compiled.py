"""The C quantizers (kernels/_cquant.c, registered by quant/c_kernels.py), held to ggml's bytes.

References, as in test_kquant_encode.py: the committed `ggml_quantize_chunk` bytes in quant_fixtures/ (every
type, eight input classes, with and without an importance matrix) and, where llama_cpp is importable, live
libggml through ctypes on wider random inputs. Every comparison is of whole byte rows. Also here: the C entry
points' argument checks, the GIL being released, the SIGBUS guard, and the plan path.
"""
from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lazyweights.core.quantization import QuantizationEncoding as Q
from lazyweights.kernels.casts import compiled_quantizers
from lazyweights.quant import c_kernels, implementation, quantize, registry

FIXTURES = Path(__file__).parent / "quant_fixtures"
C = compiled_quantizers()


def _load_make_fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_fixtures"] = module
    spec.loader.exec_module(module)
    return module


mf = _load_make_fixtures()
TYPES = [e.name for e in c_kernels.QUANTIZED]
HAVE_LLAMA = mf.find_libggml_base() is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama_cpp (llama-cpp-python) is not installed")


def test_covers_every_fixture_type():
    assert set(TYPES) == set(mf.TYPES)


def kernel(t: str):
    """The registered quantizer of type t (the C runner), checked to wrap the extension's function."""
    fn = registry.kernel("quantize", Q[t])
    assert implementation(Q[t], "quantize") == "c" and fn.kernel is getattr(C, f"quantize_{t}"), t
    return fn


def quantize_with(fn, t: str, x: np.ndarray, imatrix=None) -> np.ndarray:
    enc = Q[t]
    out = np.full((x.shape[0], x.shape[1] // enc.block_elements * enc.block_bytes), 0xA5, np.uint8)
    with np.errstate(all="ignore"):
        if imatrix is None:
            fn(np.ascontiguousarray(x, np.float32), out)
        else:
            fn(np.ascontiguousarray(x, np.float32), out, np.ascontiguousarray(imatrix, np.float32))
    return out


def differing_rows(got: np.ndarray, want: np.ndarray, allowed: np.ndarray) -> list[int]:
    assert got.shape == want.shape and got.dtype == want.dtype == np.uint8
    return [int(r) for r in np.nonzero((got != want).any(1) & ~allowed)[0]]


# --- the committed ggml bytes ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixtures():
    return np.load(FIXTURES / "inputs.npz"), np.load(FIXTURES / "expected.npz")


@pytest.mark.parametrize("mode", ["none", "imatrix"])
@pytest.mark.parametrize("t", TYPES)
def test_bytes_equal_ggml_fixtures(fixtures, t, mode):
    inputs, expected = fixtures
    fn = kernel(t)
    imatrix = inputs["imatrix"] if mode == "imatrix" else None
    failures = {}
    for cls in mf.CLASSES:
        x, want = inputs[cls], expected[f"{t}/{cls}/{mode}"]
        if cls in ("normal", "student_t", "small"):  # ggml wrote real data here, not zero blocks
            assert np.count_nonzero(want) > want.size // 4, (t, cls, mode)
        got = quantize_with(fn, t, x, imatrix)
        bad = differing_rows(got, want, np.zeros(x.shape[0], bool))
        if bad:
            failures[cls] = bad[:4]
    assert not failures, f"{t} ({mode}) differs from ggml_quantize_chunk in rows {failures}"


def test_c_kernels_equal_ggml_where_gguf_py_does_not(fixtures, gguf_py_rows):
    # The corner cases where gguf-py's legacy quantizers are not ggml's: C writes ggml's bytes there. (The
    # committed fixtures have the all +inf blocks; a block of zeros led by -0.0 is spelled out here.)
    inputs, expected = fixtures
    x = inputs["specials"]
    for t in ("Q4_1", "Q5_1"):
        assert gguf_py_rows(t, x).any()
        assert np.array_equal(quantize_with(kernel(t), t, x), expected[f"{t}/specials/none"]), t
    z = np.zeros((2, 64), np.float32)
    z[0, :32:3] = -0.0  # block 0 of row 0 is led by -0.0
    for t, block_bytes in (("Q4_0", 18), ("Q5_0", 22)):
        assert gguf_py_rows(t, z).tolist() == [True, False]
        got = quantize_with(kernel(t), t, z)
        assert got[0, :2].tolist() == [0x00, 0x80], t  # d = +0.0 / -8 = -0.0, as ggml_compute_fp32_to_fp16 gives
        assert got[0, block_bytes:block_bytes + 2].tolist() == [0x00, 0x80] and got[1, :2].tolist() == [0x00, 0x80]
        if HAVE_LLAMA:
            assert np.array_equal(got, mf.ggml_quantize(t, z)), t


# --- live ggml, wider inputs --------------------------------------------------------------------------------


def _wide_inputs(t: str, seed: int):
    """(x, imatrices): rows of 1..8 blocks' width at magnitudes 1e-9..1e9, heavy tails, exact ties, zero and
    constant blocks; imatrices of several shapes (None, random, with zero columns, spiky)."""
    rng = np.random.default_rng(seed)
    be = Q[t].block_elements
    n = be * int(rng.integers(1, 9 if be == 32 else 5))
    rows = 48
    x = rng.standard_normal((rows, n)) * 10.0 ** rng.uniform(-9, 9, (rows, 1))
    x[::5] = rng.standard_t(2, (len(x[::5]), n))
    x[1::7] = np.round(x[1::7] * 8) / 8
    x[2::9, :be] = 0.0
    x[3::11, : be // 2] = 0.375
    x = x.astype(np.float32)
    w = rng.gamma(0.7, 1.5, n).astype(np.float32)
    w_zeros = w * (rng.random(n) > 0.3)
    spiky = (rng.pareto(1.0, n) * (rng.random(n) < 0.5)).astype(np.float32)
    return x, [None, w, w_zeros.astype(np.float32), spiky]


@needs_llama
@pytest.mark.parametrize("t", TYPES)
def test_bytes_equal_live_ggml_on_wide_random_inputs(t):
    fn = kernel(t)
    failures = []
    for seed in range(6):
        x, imatrices = _wide_inputs(t, 1000 * seed + TYPES.index(t))
        for k, w in enumerate(imatrices):
            with np.errstate(all="ignore"):
                want = mf.ggml_quantize(t, x, w)
            bad = differing_rows(quantize_with(fn, t, x, w), want, np.zeros(x.shape[0], bool))
            if bad:
                failures.append((seed, x.shape[1], k, bad[:3]))
    assert not failures, f"{t} differs from live ggml (seed, n, imatrix kind, rows): {failures}"


def _rows_with_specials(t: str, seed: int) -> np.ndarray:
    """Random rows with NaN, +-inf and -0.0 at every position of a block, one, two or a whole block of them."""
    rng = np.random.default_rng(seed)
    be = Q[t].block_elements
    x = (rng.standard_normal((64, 4 * max(be, 64))) * 10.0 ** rng.uniform(-3, 3, (64, 1))).astype(np.float32)
    blocks = x.reshape(-1, 32)  # 32-value blocks (the K types' sub-blocks are 16 or 32 values)
    for i in range(len(blocks)):
        kind = i % 6
        p, q = i % 32, (7 * i + 3) % 32
        if kind == 0:
            blocks[i, p] = np.nan
        elif kind == 1:
            blocks[i, [p, q]] = np.nan
        elif kind == 2:
            blocks[i, p] = np.inf if i % 4 else -np.inf
        elif kind == 3:
            blocks[i, p] = np.nan
            blocks[i, q] = blocks[i].max() * 4  # the block's largest value before or after its NaN
        elif kind == 4:
            blocks[i, :] = -0.0
            blocks[i, p] = np.nan if i % 4 else 0.0
    return x


def test_c_q8_0_lanes_equal_ggml_sequential_amax():
    # quantize_Q8_0 finds each block's amax in eight lanes and falls back to ggml's chain for a block with a
    # NaN (_cquant.c, quantize_q8_0_lanes): every block must equal ggml's quantize_q8_0 as written.
    for seed in range(4):
        x = _rows_with_specials("Q8_0", seed)
        x[5] = np.random.default_rng(seed).standard_normal(x.shape[1]).astype(np.float32)  # no specials at all
        got, want = (np.zeros((x.shape[0], x.shape[1] // 32 * 34), np.uint8) for _ in range(2))
        with np.errstate(all="ignore"):
            C.quantize_Q8_0(x, got, x.shape[1])
            C.quantize_Q8_0_sequential(x, want, x.shape[1])
        assert np.array_equal(got, want), seed
        assert np.isnan(x).any() and want[5].any()


@needs_llama
@pytest.mark.parametrize("t", TYPES)
def test_c_bytes_equal_live_ggml_with_nan_and_inf_everywhere(t):
    # ggml's code in C codes NaN and inf as ggml does.
    fn = kernel(t)
    rng = np.random.default_rng(3)
    for seed in range(3):
        x = _rows_with_specials(t, seed)
        for w in (None, rng.random(x.shape[1]).astype(np.float32)):
            with np.errstate(all="ignore"):
                want = mf.ggml_quantize(t, x, w)
            bad = differing_rows(quantize_with(fn, t, x, w), want, np.zeros(x.shape[0], bool))
            assert not bad, (t, seed, w is None, bad[:4])


# --- the C entry points' checks -----------------------------------------------------------------------------


def test_c_entry_points_check_their_buffers():
    f = C.quantize_Q4_K
    x = np.ones((2, 256), np.float32)
    out = np.zeros((2, 144), np.uint8)
    w = np.ones(256, np.float32)
    f(x, out, 256)
    f(x, out, 256, None)
    f(x, out, 256, w)
    assert out.any()
    cases = [
        (TypeError, r"src must be float32, got buffer format 'd'", (x.astype(np.float64), out, 256)),
        (TypeError, r"out must be uint8, got buffer format 'h'", (x, np.zeros((2, 72), np.int16), 256)),
        (TypeError, r"imatrix must be float32", (x, out, 256, w.astype(np.float16))),
        (TypeError, r"src must be a C-contiguous float32 buffer \(got list", ([1.0] * 512, out, 256)),
        (ValueError, r"out must be a writable, C-contiguous uint8 buffer \(got bytes", (x, bytes(288), 256)),
        (TypeError, r"n_per_row must be an integer", (x, out, "256")),
        (TypeError, r"takes src, out, n_per_row and optionally imatrix \(got 2 arguments\)", (x, out)),
        (ValueError, r"src must be C-contiguous", (np.ones((256, 2), np.float32).T, out, 256)),
        (ValueError, r"out must be C-contiguous", (x, np.zeros((144, 2), np.uint8).T, 256)),
        (ValueError, r"positive multiple of 256 values \(at most 2\*\*30\), got 100", (x, out, 100)),
        (ValueError, r"positive multiple of 256 values .* got 0", (x, out, 0)),
        (ValueError, r"src holds 512 values, not whole rows of n_per_row = 768", (x, out, 768)),
        (ValueError, r"2 rows of 256 values need an output of 2 x 144 = 288 bytes .* got 287 bytes",
         (x, np.zeros(287, np.uint8), 256)),
        (ValueError, r"2 rows of 256 values need .* got 432 bytes", (x, np.zeros((3, 144), np.uint8), 256)),
        (ValueError, r"importance matrix has 255 values but rows have n_per_row = 256", (x, out, 256, w[:255])),
        (ValueError, r"src is not aligned to 4 bytes", (np.frombuffer(bytearray(2050), np.float32, 512, 2), out, 256)),
        (ValueError, r"out is not aligned to 2 bytes", (x, np.zeros(289, np.uint8)[1:], 256)),
    ]
    ro = np.zeros((2, 144), np.uint8)
    ro.flags.writeable = False
    cases.append((ValueError, r"out must be a writable, C-contiguous uint8 buffer \(got numpy.ndarray: .*read-only",
                  (x, ro, 256)))
    for exc, pattern, args in cases:
        before = out.copy()
        with pytest.raises(exc, match=pattern):
            f(*args)
        assert np.array_equal(out, before)  # nothing written on a refused call
    # every type's name is in its messages
    with pytest.raises(ValueError, match="quantize_IQ4_XS: n_per_row"):
        C.quantize_IQ4_XS(x, np.zeros((2, 136), np.uint8), 32)
    # zero rows: nothing to do, no error
    C.quantize_Q8_0(np.zeros((0, 32), np.float32), np.zeros((0, 34), np.uint8), 32)


def test_runner_stages_unaligned_arrays():
    # The registry accepts any C-contiguous array; the C side refuses unaligned ones, so the runner copies.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    w = rng.random(256).astype(np.float32)
    want = quantize("Q3_K", x, imatrix=w)
    raw = bytearray(x.nbytes + 1)
    src = np.frombuffer(raw, np.float32, x.size, 1).reshape(x.shape)  # at an odd address
    src[...] = x
    assert not src.flags.aligned
    out_raw = np.zeros(want.nbytes + 1, np.uint8)
    out = out_raw[1:].reshape(want.shape)
    assert out.ctypes.data % 2 == 1 and out.flags.c_contiguous
    kernel("Q3_K")(src, out, w)
    assert np.array_equal(out, want)


def test_c_quantizers_hold_no_fused_multiply_add():
    # ggml's bytes need each float32 product rounded before its sum: no FMA in any clone (_cquant.c builds an
    # AVX2 clone of each function; the "avx2" target excludes FMA and setup.py passes -ffp-contract=off).
    import shutil

    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    asm = subprocess.run([objdump, "-d", "--no-show-raw-insn", C.__file__], capture_output=True, text=True,
                         timeout=120).stdout
    assert "mulss" in asm  # the float32 code was disassembled (symbols may be stripped)
    assert not any(op in asm for op in ("vfmadd", "vfmsub", "vfnmadd", "vfnmsub")), "FMA instructions in _cquant"


# --- threads, faults, imports -------------------------------------------------------------------------------


def test_c_kernels_release_the_gil():
    # While one thread runs a long quantize, the main thread keeps running Python. With the GIL held for the
    # whole call, the main thread would stop for the whole call once the worker took the GIL (a few ms after
    # it starts): one gap between its clock readings as long as the call.
    x = np.random.default_rng(0).standard_normal((512, 4096)).astype(np.float32)
    w = np.ones(4096, np.float32)
    out = np.empty((512, 4096 // 256 * 144), np.uint8)
    t0 = time.perf_counter()
    C.quantize_Q4_K(x, out, 4096, w)
    call = time.perf_counter() - t0
    assert call > 0.05, call  # long enough for a stall to stand out (about 0.25 s here)
    worker = threading.Thread(target=C.quantize_Q4_K, args=(x, out, 4096, w))
    ticks = [time.perf_counter()]
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    longest = float(np.diff(ticks).max())
    assert longest < call / 2, (longest, call)


GUARD_SCRIPT = r"""
import mmap, os, sys, numpy as np
from lazyweights.kernels import _cquant as K
path = sys.argv[1]
np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32).tofile(path)
fd = os.open(path, os.O_RDONLY)
src = np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), np.float32)
os.close(fd)
out = np.empty((1 << 20) // 256 * 144, np.uint8)
K.quantize_Q4_K(src, out, 4096)
os.truncate(path, 4096)
try:
    K.quantize_Q4_K(src, out, 4096)
    print("NO ERROR")
except OSError as e:
    print("caught", e.errno)
K.quantize_Q4_K(src[:1024], out[:1024 // 256 * 144], 1024)  # the first page still exists
print("first page ok")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGBUS"), reason="no SIGBUS on this platform")
def test_c_kernels_turn_sigbus_into_oserror(tmp_path, child_env):
    # A memory-mapped source truncated mid-read: OSError(EFAULT) from the call, as the casts and dequantizers
    # give (through the one guard of _ccasts), not a dead process.
    import errno

    script = tmp_path / "guard.py"
    script.write_text(GUARD_SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "src.bin")], capture_output=True, text=True,
                       env=child_env, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["caught", str(errno.EFAULT), "first", "page", "ok"], r.stdout


def test_every_type_quantizes_through_a_plan():
    # What a save with a preset runs: quantize nodes in a plan, with and without an importance matrix, equal
    # to the registry's own call.
    import lazyweights as lw

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    w = rng.random(512).astype(np.float32)
    for enc in c_kernels.QUANTIZED:
        assert quantize(enc, x).shape == quantize(enc, x, imatrix=w).shape, enc
    wd = lw.WeightData.from_numpy(x.astype(np.float16), "w")
    for t in ("Q4_K", "TQ1_0"):
        got = lw.plan({"w": wd.astype(lw.DType.float32).quantize(lw.QuantizationEncoding[t])}).materialize()["w"]
        want = quantize(t, x.astype(np.float16).astype(np.float32))
        assert np.array_equal(np.asarray(got).reshape(want.shape), want), t
