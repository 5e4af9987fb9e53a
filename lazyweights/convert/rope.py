"""RoPE frequency maths both directions share: the factors one writes as a tensor and the other reads back.

Llama 3.1's "llama3" scaling: llama.cpp reads it only from `rope_freqs.weight`, whose values
`llama3_rope_factors` computes as llama.cpp's converter does (HF -> GGUF, `to_gguf`) and `llama3_rope_params`
fits back into a `rope_parameters` dict (GGUF -> HF, `to_hf`). (Phi-3's LongRoPE factors and Gemma 4's
"proportional" RoPE are their records' hooks: `adapters/longrope.py`, `adapters/gemma4.py`.)

Example:
    >>> f = llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    >>> f.shape, llama3_rope_params(f, 500000.0, 128)["factor"]
    ((64,), 8.0)
"""
from __future__ import annotations

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
