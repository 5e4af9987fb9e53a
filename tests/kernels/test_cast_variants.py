"""The C extension's CPU-specific loops: bfloat16 -> float16 through AVX-512 where the CPU has AVX-512 F, BW
and VL, through F16C where it has AVX2 and F16C, the portable loop elsewhere (LAZYWEIGHTS_CAST_LOOPS=f16c or
=portable caps the choice). Each loop this CPU can run must give ml_dtypes' bits for every one of the 65536
bfloat16 patterns, gathers and tails included."""
from __future__ import annotations

import subprocess
import sys

import pytest

from lazyweights.kernels import casts

pytestmark = pytest.mark.skipif(not casts.HAVE_C, reason="the C extension was not built")

CHECK = r"""
import ml_dtypes, numpy as np
from lazyweights.kernels import _ccasts as C
src = np.arange(1 << 16, dtype=np.uint16)
want = src.view(ml_dtypes.bfloat16).astype(np.float16).view(np.uint16)
out = np.empty_like(src)
C.k_bf16_to_f16(src, out, 1, src.size, 0, 0)
bad = np.flatnonzero(out != want)
rows = np.random.default_rng(0).permutation(1024)  # a gather: 1024 rows of 64, in random order
C.k_bf16_to_f16(src, out, rows, 64, 0, 64)
gbad = np.flatnonzero(out.reshape(1024, 64) != want.reshape(1024, 64)[rows])
C.k_bf16_to_f16(src[1:-14], out[:-15], 1, src.size - 15, 0, 0)  # unaligned start, a tail of 15
tbad = np.flatnonzero(out[:-15] != want[1:-14])
print(C.bf16_to_f16_variant(), bad.size, gbad.size, tbad.size)
"""


def cpu_has(*flags) -> bool:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return False
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return all(f in line.split() for f in flags)


def expected_loop(forced: str | None) -> str:
    """The loop `pick_loops` should choose on this CPU under LAZYWEIGHTS_CAST_LOOPS=`forced`."""
    if forced == "portable" or not cpu_has("avx2", "f16c"):
        return "portable"
    if forced != "f16c" and cpu_has("avx512f", "avx512bw", "avx512vl"):
        return "avx512"
    return "f16c"


def _loops_env(child_env: dict, forced: str | None) -> dict:
    """The child's environment with the loop choice capped at `forced` (None: the CPU's best)."""
    env = dict(child_env)
    env.pop("LAZYWEIGHTS_CAST_LOOPS", None)
    if forced:
        env["LAZYWEIGHTS_CAST_LOOPS"] = forced
    return env


@pytest.mark.parametrize("forced", [None, "f16c", "portable"])
def test_bf16_to_f16_loops_match_ml_dtypes(forced, child_env):
    r = subprocess.run([sys.executable, "-c", CHECK], env=_loops_env(child_env, forced), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    variant, bad, gathered_bad, tail_bad = r.stdout.split()
    if sys.platform.startswith("linux") and __import__("platform").machine() == "x86_64":
        assert variant == expected_loop(forced)
    assert (bad, gathered_bad, tail_bad) == ("0", "0", "0"), f"{variant}: {bad} of 65536 patterns differ"


IN_PLACE = r"""
import ml_dtypes, numpy as np
from lazyweights.kernels import casts
src = np.random.default_rng(1).permutation(np.arange(1 << 16, dtype=np.uint16))  # every pattern, shuffled
want = src.view(ml_dtypes.bfloat16).astype(np.float16)
ok = casts.casts_in_place(ml_dtypes.bfloat16, np.float16)
bad = -1
if ok:  # cast onto its own bytes, from an odd element on, with a tail no vector covers
    buf = src.copy()
    view = buf[3:-5]
    casts.cast_into(view.view(ml_dtypes.bfloat16), view.view(np.float16))
    bad = int(np.count_nonzero(buf[3:-5] != want[3:-5].view(np.uint16))
              + np.count_nonzero(buf[:3] != src[:3]) + np.count_nonzero(buf[-5:] != src[-5:]))
print(casts._K.bf16_to_f16_variant(), ok, bad)
"""


@pytest.mark.parametrize("forced", [None, "f16c", "portable"])
def test_bf16_to_f16_cast_in_place(forced, child_env):
    """`casts_in_place` answers True only for the loops without `restrict` (AVX-512, F16C), and a cast onto
    its own bytes there gives ml_dtypes' bits for every pattern and leaves the bytes around it alone."""
    r = subprocess.run([sys.executable, "-c", IN_PLACE], env=_loops_env(child_env, forced), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    variant, ok, bad = r.stdout.split()
    assert ok == str(variant in ("avx512", "f16c")), (variant, ok)
    if ok == "True":
        assert bad == "0", f"{variant}: {bad} elements differ after a cast in place"


def test_casts_in_place_never_for_other_pairs():
    import ml_dtypes
    import numpy as np

    assert casts.casts_in_place(np.float32, np.float32)
    assert not casts.casts_in_place(np.float16, ml_dtypes.bfloat16)  # a `restrict` loop
    assert not casts.casts_in_place(ml_dtypes.bfloat16, np.float32)  # widths differ
    assert not casts.casts_in_place(ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
