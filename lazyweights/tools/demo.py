"""The main job on an embedded default: `lazyweights demo` (or `python -m lazyweights.tools.demo`).

It writes a small Llama-shaped bf16 checkpoint (Hugging Face names, two shards with an index, FP8 KV
scales, random values), runs MAX's example adapter on it lazily (strip `model.`, rename
`self_attn.` to `attention.`, drop `.k_scale`/`.v_scale`, RoPE-permute q/k rows, cast norms to float32 and
the rest to float16), prints the plan, streams the converted checkpoint to disk under a memory budget,
and checks every output tensor against the same adapter computed eagerly with numpy. Exit status 0 means
every byte matched.

Example:
    >>> from lazyweights.tools.demo import run_demo
    >>> import tempfile
    >>> run_demo(tempfile.mkdtemp(), layers=1, quiet=True)
    0
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import ml_dtypes
import numpy as np

from ..core.dtype import DType
from ..core.errors import ConfigError

LLAMA_SMALL = dict(hidden_size=256, intermediate_size=688, num_attention_heads=8, num_key_value_heads=2,
                   vocab_size=1000)


def write_llama_checkpoint(directory: str, layers: int = 2, seed: int = 0, fp8_scales: bool = True, **shape) -> dict:
    """A Llama-shaped bf16 checkpoint in two safetensors shards plus index and config.json; returns config."""
    from safetensors.numpy import save_file

    cfg = {**LLAMA_SMALL, **shape, "num_hidden_layers": layers, "model_type": "llama",
           "architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e-5}
    H, I, A, K, V = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                      "num_key_value_heads", "vocab_size"))
    hd = H // A
    rng = np.random.default_rng(seed)

    def t(*s):
        return (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    tensors = {"model.embed_tokens.weight": t(V, H)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": t(H), p + "self_attn.q_proj.weight": t(A * hd, H),
            p + "self_attn.k_proj.weight": t(K * hd, H), p + "self_attn.v_proj.weight": t(K * hd, H),
            p + "self_attn.o_proj.weight": t(H, A * hd), p + "post_attention_layernorm.weight": t(H),
            p + "mlp.gate_proj.weight": t(I, H), p + "mlp.up_proj.weight": t(I, H), p + "mlp.down_proj.weight": t(H, I),
        })
        if fp8_scales:
            tensors[p + "self_attn.k_scale"] = np.asarray(rng.random(), np.float32)
            tensors[p + "self_attn.v_scale"] = np.asarray(rng.random(), np.float32)
    tensors["model.norm.weight"] = t(H)
    tensors["lm_head.weight"] = t(V, H)
    os.makedirs(directory, exist_ok=True)
    names = list(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, os.path.join(directory, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in keys})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        total = sum(v.nbytes for v in tensors.values())
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return cfg


def rope_perm(head_dim: int) -> np.ndarray:
    """Interleaved -> half-split RoPE layout: even rows of each head first, then odd rows.

    >>> rope_perm(6).tolist()
    [0, 2, 4, 1, 3, 5]
    """
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


UNUSED_SUFFIXES = (".k_scale", ".v_scale")


def adapt_name(name: str) -> str | None:
    """The module's name for a checkpoint name (`model.` stripped, `self_attn.` -> `attention.`), or None for a
    tensor to drop (the FP8 KV-cache scales `.k_scale`/`.v_scale`, which the runtime computes itself).

    >>> adapt_name("model.layers.0.self_attn.q_proj.weight"), adapt_name("model.layers.0.self_attn.k_scale")
    ('layers.0.attention.q_proj.weight', None)
    """
    if name.endswith(UNUSED_SUFFIXES):
        return None
    return name.replace("model.", "", 1).replace("self_attn.", "attention.")


def target_dtype(name: str) -> DType:
    """The adapter's cast: norms to float32, every other tensor to float16.

    >>> target_dtype("layers.0.input_layernorm.weight").name, target_dtype("lm_head.weight").name
    ('float32', 'float16')
    """
    return DType.float32 if "norm" in name else DType.float16


def convert_safetensor_state_dict(state_dict, huggingface_config=None, **unused_kwargs):
    """MAX's example adapter, lazily (the demo's workload and the benchmarks'; a Llama-shaped bf16 -> f16
    adapter): every line builds graph nodes, nothing is read here. On a Llama-shaped Hugging Face checkpoint
    (`dict(weights.items())`) it renames (`adapt_name`), drops the FP8 KV scales, permutes q_proj / k_proj rows
    within each head from the interleaved to the half-split RoPE layout (`rope_perm`) and casts
    (`target_dtype`). `huggingface_config` is a dict or an object with `num_attention_heads` and
    `hidden_size` (and optionally `num_key_value_heads`, `head_dim`). From the command line:
    `lazyweights plan lazyweights.tools.demo:convert_safetensor_state_dict CHECKPOINT_DIR`.

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
    cfg = huggingface_config
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    num_heads, hidden_size = get("num_attention_heads"), get("hidden_size")
    if num_heads is None or hidden_size is None:
        missing = [k for k, v in (("num_attention_heads", num_heads), ("hidden_size", hidden_size)) if v is None]
        raise ConfigError(f"huggingface_config lacks {', '.join(missing)}: the adapter needs them for the RoPE "
                          f"row permutation of q_proj and k_proj (put a config.json beside the checkpoint)")
    head_dim = get("head_dim") or hidden_size // num_heads
    num_kv_heads = get("num_key_value_heads") or num_heads
    perm = rope_perm(head_dim)
    new_state_dict = {}
    for checkpoint_name, value in state_dict.items():
        name = adapt_name(checkpoint_name)
        if name is None:
            continue
        data = value.data()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = num_heads if "q_proj" in name else num_kv_heads
            data = data.reshape(heads, head_dim, -1)[:, perm, :].reshape(heads * head_dim, -1)
        new_state_dict[name] = data.astype(target_dtype(name))
    return new_state_dict


def eager_reference(ckpt_dir: str, cfg: dict) -> dict[str, np.ndarray]:
    """The same adapter computed eagerly with safetensors + numpy, as adapter authors write it today."""
    from safetensors import safe_open

    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    out = {}
    for fname in sorted(os.listdir(ckpt_dir)):
        if not fname.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(ckpt_dir, fname), "numpy") as f:
            for k in f.keys():
                if k.endswith(UNUSED_SUFFIXES):
                    continue
                a = f.get_tensor(k)
                name = k.replace("model.", "", 1).replace("self_attn.", "attention.")
                if name.endswith(("q_proj.weight", "k_proj.weight")):
                    heads = cfg["num_attention_heads"] if "q_proj" in name else cfg["num_key_value_heads"]
                    a = np.ascontiguousarray(a.reshape(heads, hd, -1)[:, rope_perm(hd), :].reshape(heads * hd, -1))
                out[name] = a.astype(np.float32 if "norm" in name else np.float16)
    return out


def run_demo(workdir: str | None = None, layers: int = 2, budget: str = "64MB", quiet: bool = False) -> int:
    """Make the checkpoint, adapt it lazily, print the plan, save it, verify it. Returns an exit status."""
    from ..lazy.plan import plan
    from ..lazy.weights import load_weights

    workdir = workdir or tempfile.mkdtemp(prefix="lazyweights-demo-")
    ckpt, out_dir = os.path.join(workdir, "llama-small"), os.path.join(workdir, "converted")
    say = (lambda *a: None) if quiet else print
    cfg = write_llama_checkpoint(ckpt, layers=layers)
    weights = load_weights(ckpt)  # headers only
    adapted = convert_safetensor_state_dict(dict(weights.items()), huggingface_config=cfg)
    p = plan(adapted)
    if not quiet:
        try:
            say(p.explain())
        except ImportError:  # explain() is optional in minimal installs
            say(repr(p))
    files = p.save(out_dir, budget=budget, max_shard_size="2MB", progress=not quiet)
    # config.json and a verify manifest beside the output, so `lazyweights plan/verify` work on it as they
    # would on any checkpoint (the manifest hashes what is on disk now; `verify` re-reads it later).
    from .verify import write_manifest

    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    manifest = write_manifest(out_dir)
    say(f"source checkpoint: {ckpt}")
    say(f"wrote {len(files)} files to {out_dir} (+ config.json, {os.path.basename(manifest)})")
    say(f"next: lazyweights plan lazyweights.tools.demo:convert_safetensor_state_dict {ckpt}")
    say(f"      lazyweights verify {out_dir}")
    want = eager_reference(ckpt, cfg)
    got = load_weights(out_dir)
    bad = [n for n, a in want.items()
           if not got[n].exists() or got[n].data().to_numpy().tobytes() != a.tobytes()
           or got[n].data().dtype.to_numpy() != a.dtype]
    names = {n for n, _ in got.items()}
    if bad or names != set(want):
        say(f"MISMATCH: {sorted(bad) or sorted(names ^ set(want))}")
        return 1
    say(f"verified: all {len(want)} tensors byte-identical to the eager numpy adapter")
    return 0


def main(argv=None) -> int:
    """`python -m lazyweights.tools.demo [--workdir DIR] [--layers N] [--budget SIZE]`; returns the exit status."""
    ap = argparse.ArgumentParser(prog="lazyweights demo", description=__doc__.split("\n\n")[1])
    ap.add_argument("--workdir", default=None, help="where to write the checkpoint and the output (default: a temp "
                                                    "dir)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--budget", default="64MB")
    a = ap.parse_args(argv)
    return run_demo(a.workdir, a.layers, a.budget)


if __name__ == "__main__":
    sys.exit(main())
