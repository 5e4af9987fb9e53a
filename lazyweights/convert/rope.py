"""RoPE frequency maths both directions share: the factors one writes as a tensor and the other reads back.

Llama 3.1's "llama3" scaling: llama.cpp reads it only from `rope_freqs.weight`, whose values
`llama3_rope_factors` computes as llama.cpp's converter does (HF -> GGUF, `to_gguf`) and `llama3_rope_params`
fits back into a `rope_parameters` dict (GGUF -> HF, `to_hf`). Gemma 4's "proportional" RoPE of its
full-attention layers, the same way: `gemma4_rope_freqs` writes it, `gemma4_partial_rotary` reads it back.
(Phi-3's LongRoPE factors are its record's hooks: `adapters/longrope.py`.)

Example:
    >>> f = llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    >>> f.shape, llama3_rope_params(f, 500000.0, 128)["factor"]
    ((64,), 8.0)
"""
from __future__ import annotations

from typing import Any, Mapping

from ..core.errors import GGUFConfigError


def llama3_rope_factors(theta: float, head_dim: int, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max_position_embeddings: float):
    """The per-frequency RoPE factors of Llama 3.1's "llama3" scaling, as llama.cpp's converter computes them
    into `rope_freqs.weight` (float32 frequencies, float64 arithmetic, stored as float32)."""
    import numpy as np

    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    low_wl = original_max_position_embeddings / low_freq_factor
    high_wl = original_max_position_embeddings / high_freq_factor
    out = []
    for f in freqs.astype(np.float64):
        wl = 2 * np.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (original_max_position_embeddings / wl - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def gemma4_rope_freqs(cfg: Mapping[str, Any]):
    """Gemma 4's "proportional" RoPE of the full-attention layers as llama.cpp's converter writes it: per pair of
    the full head dim, 1 where it rotates (the first `partial_rotary_factor` share) and 1e30 (no rotation) after.

    Example:
        >>> f = gemma4_rope_freqs({"global_head_dim": 16, "rope_parameters": {"full_attention": {
        ...     "rope_type": "proportional", "partial_rotary_factor": 0.25}}})
        >>> f.tolist()[:3], f.dtype.name
        ([1.0, 1.0, 1.0000000150474662e+30], 'float32')
    """
    import numpy as np

    from .hparams import gemma4_full

    full = (cfg.get("rope_parameters") or {}).get("full_attention") or {}
    if full.get("rope_type", "proportional") != "proportional":
        raise GGUFConfigError(f"config.json (gemma4): full-attention rope_type {full.get('rope_type')!r}; llama.cpp's "
                              "converter writes only the proportional one", ["rope_freqs.weight"])
    head_dim = int(gemma4_full(cfg, "head_dim", "global_head_dim") or cfg["head_dim"])
    n_rot = int(head_dim * float(full.get("partial_rotary_factor", 1.0)) / 2)
    return np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), dtype=np.float32)


def gemma4_partial_rotary(rope_freqs, per_layer: Mapping[str, Any]) -> float:
    """The full layers' `partial_rotary_factor` a Gemma 4 GGUF's `rope_freqs.weight` stands for: the share of
    leading 1s (rotated pairs) before the 1e30s (unrotated ones); GGUFConfigError for any other values.

    Example:
        >>> gemma4_partial_rotary([1.0, 1.0, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30], {"1": {"head_dim": 16}})
        0.25
    """
    import numpy as np

    r = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
    n_rot = int((r == 1.0).sum())
    head_dim = int(next(iter(per_layer.values()))["head_dim"]) if per_layer else 2 * r.size
    if r.size != head_dim // 2 or not (r[:n_rot] == 1.0).all() or not (r[n_rot:] >= 1e29).all():
        raise GGUFConfigError(f"rope_freqs.weight ({r.size} values, first {r[:4].tolist()}) is not Gemma 4's "
                              f"proportional RoPE for head_dim {head_dim} (1s, then 1e30s)", ["rope_freqs.weight"])
    return 2 * n_rot / head_dim


def llama3_rope_params(rope_freqs, theta: float, head_dim: int) -> dict | None:
    """The Hugging Face `rope_scaling` ({"rope_type": "llama3", factor, low/high_freq_factor,
    original_max_position_embeddings}) whose factors equal `rope_freqs` (a GGUF's `rope_freqs.weight`).

    The factors depend on the two wavelength thresholds original/low and original/high only, so Llama 3.1's
    own values (8192, 1, 4) are tried first; otherwise low_freq_factor = 1 and the thresholds are fitted to
    the smoothly scaled frequencies. GGUFConfigError if no llama3 scaling reproduces the tensor.

    >>> f = llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    >>> llama3_rope_params(f, 500000.0, 128)["original_max_position_embeddings"]
    8192
    """
    import numpy as np

    r = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
    if r.size != head_dim // 2:
        raise GGUFConfigError(f"rope_freqs.weight has {r.size} values; head_dim {head_dim} needs {head_dim // 2}")
    factor = float(np.float32(r.max()))
    if np.allclose(r, 1.0):
        return None

    def fits(p):
        try:
            got = llama3_rope_factors(theta, head_dim, p["factor"], p["low_freq_factor"], p["high_freq_factor"],
                                      p["original_max_position_embeddings"])
        except (ZeroDivisionError, FloatingPointError):
            return False
        return bool(np.allclose(got, r, rtol=1e-5, atol=0))

    cand = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    if fits(cand):
        return cand
    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    wl = 2 * np.pi / freqs.astype(np.float64)
    ones, full = np.isclose(r, 1.0, rtol=1e-5), np.isclose(r, factor, rtol=1e-5)
    smooth = ~ones & ~full
    s = (1 / r[smooth] - 1 / factor) / (1 - 1 / factor)  # = low_wl / (wl (low_wl / high_wl - 1)) - 1 / (...)
    lo_bound = wl[ones].max() if ones.any() else 0.0
    hi_bound = wl[full].min() if full.any() else np.inf
    if smooth.sum() >= 2:  # s = A / wl - B, A = orig / (high - low), B = low / (high - low)
        A, negB = np.linalg.lstsq(np.stack([1 / wl[smooth], np.ones(int(smooth.sum()))], 1), s, rcond=None)[0]
        B = -negB
        low_wl, high_wl = A / B, A / (1 + B)
    elif smooth.sum() == 1:
        w, sv = wl[smooth][0], s[0]
        high_wl = np.sqrt(max(lo_bound, w / 2) * w)
        low_wl = (1 - sv) / (1 / w - sv / high_wl)
    else:
        high_wl = np.sqrt(lo_bound * hi_bound) if np.isfinite(hi_bound) and lo_bound else (lo_bound * 2 or hi_bound / 2)
        low_wl = high_wl * (1 + 1e-9)
    orig = float(low_wl)
    if abs(orig - round(orig)) < 1e-3 * max(1.0, orig):
        orig = int(round(orig))
    cand = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": float(low_wl / high_wl),
            "original_max_position_embeddings": orig}
    if fits(cand):
        nice = dict(cand, high_freq_factor=float(f"{cand['high_freq_factor']:.4g}"))
        return nice if fits(nice) else cand
    raise GGUFConfigError("rope_freqs.weight holds RoPE factors no llama3 rope_scaling reproduces "
                          f"(first values {r[:4].tolist()})", ["rope_freqs.weight"])
