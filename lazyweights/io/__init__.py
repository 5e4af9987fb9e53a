"""Bytes, wherever they live: the byte-range source protocol (local memory maps, HTTP, S3) and atomic files.

This layer knows bytes, not tensors: a source is (identity, length, read ranges), so the layers above never
ask where the bytes live. It imports only `core`.
"""
