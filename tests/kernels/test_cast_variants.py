"""The C extension's CPU-specific loops: bfloat16 -> float16 through F16C where the CPU has AVX2 and F16C,
the portable loop elsewhere (or with LAZYWEIGHTS_CAST_LOOPS=portable). Both must give ml_dtypes' bits for
every one of the 65536 bfloat16 patterns, gathers included."""
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


@pytest.mark.parametrize("forced", [None, "portable"])
def test_bf16_to_f16_loops_match_ml_dtypes(forced, child_env):
    env = dict(child_env)
    env.pop("LAZYWEIGHTS_CAST_LOOPS", None)
    if forced:
        env["LAZYWEIGHTS_CAST_LOOPS"] = forced
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    variant, bad, gathered_bad, tail_bad = r.stdout.split()
    want = "portable" if forced or not (sys.platform.startswith("linux") and cpu_has("avx2", "f16c")) else "f16c"
    if sys.platform.startswith("linux") and __import__("platform").machine() == "x86_64":
        assert variant == want
    assert (bad, gathered_bad, tail_bad) == ("0", "0", "0"), f"{variant}: {bad} of 65536 patterns differ"
