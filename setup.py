"""Build hook for the compiled parts of lazyweights: the ahead-of-time kernels.

- `lazyweights.kernels._ccasts`: the cast kernels and the GGUF dequantizers of every block type (with ggml's grid
  tables, `_ggml_dequant_grids.h`);
- `lazyweights.kernels._cquant`: ggml's GGUF quantizers (Q4_0..Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0);
- `lazyweights.kernels._clora`: the LoRA update ``W + scale * (B @ A)`` in one fixed order of float32 operations.

Everything else (metadata, dependencies, scripts) is in pyproject.toml. The extensions are required: they are
lazyweights' only CPU kernels, so building needs a C compiler, as numpy and safetensors do from source. A
failed build stops the install with a message saying what to install, instead of an install that fails later.
"""
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HOW_TO_FIX = (
    "lazyweights compiles its kernels (lazyweights/kernels/_ccasts.c, _cquant.c and _clora.c) when it is installed, "
    "and this build failed: {error}\nInstall a C compiler and Python's headers, then install again: on Debian/Ubuntu "
    "`apt install gcc python3-dev`, on Fedora `dnf install gcc python3-devel`, on macOS `xcode-select --install`."
)


class BuildKernels(build_ext):
    """build_ext whose failure says what to install (setuptools' own message is a compiler's stderr)."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all (DistutilsPlatformError), or one that fails
            raise SystemExit(HOW_TO_FIX.format(error=e)) from e

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # CompileError, LinkError: the compiler's own output is above this message
            raise SystemExit(HOW_TO_FIX.format(error=f"{ext.name}: {e}")) from e


# -O3 vectorizes the branch-free loops; -ffp-contract=off keeps the dequantizers' `dl * q - ml` and the
# quantizers' `w*x*l` sums as two roundings each, as ggml computes them (llama.cpp builds ggml-quants.c with no
# -march, so no FMA; a fused multiply-add would change bits); -fno-trapping-math lets GCC if-convert the selects
# around the one float add (it changes no result, only whether FP exception flags may be raised speculatively).
# Never -ffast-math: the subnormal tricks need IEEE round-to-nearest and subnormals, and the quantizers ggml's
# exact order of float32 operations.
flags = [] if sys.platform == "win32" else ["-O3", "-fno-trapping-math", "-ffp-contract=off", "-std=c11"]
# Every extension undoes the -fwrapv that CPython's CFLAGS add (llama.cpp builds ggml without it): with it GCC must
# allow for wrapping `int` indices and addresses loops element by element (the Q4_1 quantizer ran at 0.6x
# ggml's speed). Neither ggml's code nor the casts rely on signed overflow.
quant_flags = flags + ([] if sys.platform == "win32" else ["-fno-wrapv"])

setup(
    ext_modules=[
        Extension("lazyweights.kernels._ccasts", sources=["lazyweights/kernels/_ccasts.c"], extra_compile_args=quant_flags,
                  depends=["lazyweights/kernels/_ggml_dequant_grids.h", "lazyweights/kernels/_guard_api.h"]),
        Extension("lazyweights.kernels._cquant", sources=["lazyweights/kernels/_cquant.c"],
                  extra_compile_args=quant_flags, depends=["lazyweights/kernels/_guard_api.h"]),
        # libm: the baseline clone calls fmaf (the FMA clones use the instruction)
        Extension("lazyweights.kernels._clora", sources=["lazyweights/kernels/_clora.c"],
                  extra_compile_args=quant_flags, libraries=[] if sys.platform == "win32" else ["m"],
                  depends=["lazyweights/kernels/_guard_api.h"]),
    ],
    cmdclass={"build_ext": BuildKernels},
)
