"""Compiled, GIL-free array kernels that the executors call on cache-sized blocks.

- `lazyweights.kernels.casts`: dtype casts bit-identical to numpy/ml_dtypes `astype`, at near memory speed.
"""
