"""Serving-side interop: `Module`/`load_state_dict`, the bring-up check, loading into PyTorch.
"""
