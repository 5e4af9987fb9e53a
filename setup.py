"""Build hook for the one compiled part of lazyweights: the ahead-of-time cast kernels.

Everything else (metadata, dependencies, scripts) is in pyproject.toml. The extension is optional: without
a C compiler the install still succeeds, and casts use numba's kernels instead (the same bits, plus about
0.85 s of numba start-up per process), or numpy's.
"""
import sys

from setuptools import Extension, setup

# -O3 vectorizes the branch-free loops; -ffp-contract=off keeps the dequantizers' `dl * q - ml` two
# roundings, as ggml computes them (a fused multiply-add would change bits); -fno-trapping-math lets GCC if-convert the selects around the one
# float add (it changes no result, only whether FP exception flags may be raised speculatively). Never
# -ffast-math: the subnormal tricks need IEEE round-to-nearest and subnormals.
flags = [] if sys.platform == "win32" else ["-O3", "-fno-trapping-math", "-ffp-contract=off", "-std=c11"]

setup(
    ext_modules=[
        Extension(
            "lazyweights.kernels._ccasts",
            sources=["lazyweights/kernels/_ccasts.c"],
            extra_compile_args=flags,
            optional=True,
        )
    ]
)
