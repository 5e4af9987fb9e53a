"""The benchmark adapter (Llama-shaped, bf16 -> f16, the shared benchmark's workload), written lazily in MAX's style.

On a Llama-shaped Hugging Face checkpoint:
- strip the `model.` prefix and rename `self_attn.` -> `attention.`
- drop `.k_scale` / `.v_scale` (FP8 KV-cache scales the runtime computes itself)
- permute q_proj / k_proj rows within each head from the interleaved to the half-split RoPE layout
  (`rope_perm(hd) = concat(arange(0, hd, 2), arange(1, hd, 2))`)
- cast norms to float32 and everything else to float16

Nothing is read: every step builds a graph node. Use it from the command line as
`lazyweights plan lazyweights.adapters.w1:convert_safetensor_state_dict CHECKPOINT_DIR`.

Example:
    >>> import numpy as np, tempfile, os, types
    >>> from safetensors.numpy import save_file
    >>> import lazyweights as lw
    >>> d = tempfile.mkdtemp()
    >>> save_file({"model.layers.0.self_attn.q_proj.weight": np.arange(8, dtype=np.float32).reshape(4, 2),
    ...            "model.layers.0.self_attn.k_scale": np.ones((), np.float32)}, os.path.join(d, "m.safetensors"))
    >>> cfg = types.SimpleNamespace(num_attention_heads=1, hidden_size=4)
    >>> out = convert_safetensor_state_dict(dict(lw.load_weights([d]).items()), huggingface_config=cfg)
    >>> list(out), out["layers.0.attention.q_proj.weight"].to_numpy()[:, 0].tolist()
    (['layers.0.attention.q_proj.weight'], [0.0, 4.0, 2.0, 6.0])
"""
from __future__ import annotations

import numpy as np

from ..core.dtype import DType
from ..core.errors import ConfigError

UNUSED_SUFFIXES = (".k_scale", ".v_scale")


def adapt_name(name: str) -> str | None:
    """The module's name for a checkpoint name, or None for a tensor to drop."""
    if name.endswith(UNUSED_SUFFIXES):
        return None
    return name.replace("model.", "", 1).replace("self_attn.", "attention.")


def rope_perm(head_dim: int) -> np.ndarray:
    """Interleaved -> half-split rotary layout: even rows of each head first, then odd rows."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def target_dtype(name: str) -> DType:
    """W1's cast: norms to float32, every other tensor to float16."""
    return DType.float32 if "norm" in name else DType.float16


def convert_safetensor_state_dict(state_dict, huggingface_config=None, **unused_kwargs):
    """The W1 transform of a checkpoint state dict (`dict(weights.items())`) -> dict of lazy WeightData."""
    cfg = huggingface_config
    if cfg is None:
        raise ConfigError("the W1 adapter needs huggingface_config (num_attention_heads, hidden_size); "
                               "put a config.json beside the checkpoint")
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    perm = rope_perm(head_dim)
    out = {}
    for checkpoint_name, value in state_dict.items():
        name = adapt_name(checkpoint_name)
        if name is None:
            continue
        w = value.data()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            h = heads if "q_proj" in name else kv_heads
            w = w.reshape(h, head_dim, -1)[:, perm, :].reshape(h * head_dim, -1)
        out[name] = w.astype(target_dtype(name))
    return out


convert = convert_safetensor_state_dict
