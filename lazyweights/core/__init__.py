"""Vocabulary every other layer speaks: dtypes, devices, errors, quantization encodings, sizes, names.

Imports nothing else of lazyweights.
"""
