"""The seed document's adapters ("Write a weight adapter"), verbatim, run against lazyweights.

    python examples/seed_adapters.py

The four adapters from the seed (strip the `model.` prefix and rename `self_attn.q_proj`; cast float16 to
bfloat16 except biases and scales; drop the FP8 KV-cache `.k_scale`/`.v_scale`; RoPE-permute the q/k rows)
are kept below as the seed's text, with its `max` imports. The only change is the import lines
(`IMPORT_CHANGES`), applied before the text is executed. Indentation is restored (the scraped page lost
it); no other character differs.

The first three are already lazy as written: `value.data()` and `astype` build graph nodes. The fourth
materializes with `np.from_dlpack(weight_data.data)` and rebuilds with `WeightData.from_numpy` - the eager
form. `convert_rope_lazy` is the same adapter with `WeightData` ops (reshape, integer-array row index,
reshape); both must give the same bytes. Finally one lazy adapter does all four at once; its plan is
printed, saved to safetensors, and read back with `safetensors`.

Each result is checked against an independent numpy computation over tensors read with
`safetensors.safe_open`. The checkpoint is a small float16 Llama (Hugging Face names) with FP8 KV scales.

Note: the eager RoPE snippet needs a float16/float32 checkpoint. On bfloat16 (most Hugging Face
checkpoints), `np.from_dlpack` raises, because numpy cannot import bfloat16 through DLPack (a numpy limit;
ml_dtypes' bfloat16 is not a DLPack type numpy knows). The lazy form has no such limit; this example shows
both on a bfloat16 copy of the checkpoint.
"""
from __future__ import annotations

import os
import types
from pathlib import Path

import numpy as np

import _common as C
from _common import check, check_keys

from lazyweights import DType, load_weights, plan

# --- the seed's adapters, verbatim (with the seed's own imports) -----------------------------------------
SEED_RENAME = '''
from max.graph.weights import WeightData, Weights
SAFETENSOR_MAPPING = {
    "model.": "",  # Strip this string
    "self_attn.q_proj": "attention.q_proj",  # Rename this string
}
def convert_safetensor_state_dict(
    state_dict: dict[str, Weights], **unused_kwargs
) -> dict[str, WeightData]:
    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()
    return new_state_dict
'''

SEED_CAST = '''
from max.dtype import DType
from max.graph.weights import WeightData, Weights
def convert_safetensor_state_dict(
    state_dict: dict[str, Weights], **unused_kwargs
) -> dict[str, WeightData]:
    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():  # defined earlier
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()
    # Cast weights to a dtype the kernel supports
    for key, weight_data in new_state_dict.items():
        if weight_data.dtype == DType.float16 and not (
            key.endswith("bias") or key.endswith("scales")
        ):
            new_state_dict[key] = weight_data.astype(DType.bfloat16)
    return new_state_dict
'''

SEED_DROP = '''
from max.graph.weights import WeightData, Weights
UNUSED_SUFFIXES = (".k_scale", ".v_scale")
def convert_safetensor_state_dict(
    state_dict: dict[str, Weights], **unused_kwargs
) -> dict[str, WeightData]:
    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():  # defined earlier
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()
    # Drop FP8 KV-cache scales
    for key in list(new_state_dict):
        if key.endswith(UNUSED_SUFFIXES):
            del new_state_dict[key]
    return new_state_dict
'''

SEED_ROPE = '''
import numpy as np
from max.graph.weights import WeightData, Weights
from transformers import AutoConfig
def convert_safetensor_state_dict(
    state_dict: dict[str, Weights],
    huggingface_config: AutoConfig,
    **unused_kwargs,
) -> dict[str, WeightData]:
    num_heads = huggingface_config.num_attention_heads
    head_dim = huggingface_config.hidden_size // num_heads
    num_kv_heads = getattr(
        huggingface_config, "num_key_value_heads", num_heads
    )
    rope_perm = build_rope_perm(head_dim)  # architecture-specific helper
    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():  # defined earlier
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()
    # Permute weights
    for key, weight_data in new_state_dict.items():
        if key.endswith("q_proj.weight"):
            heads = num_heads
        elif key.endswith("k_proj.weight"):
            heads = num_kv_heads
        else:
            continue
        arr = np.from_dlpack(weight_data.data)
        arr = arr.reshape(heads, head_dim, -1)
        arr = arr[:, rope_perm, :]
        arr = np.ascontiguousarray(arr.reshape(heads * head_dim, -1))
        new_state_dict[key] = WeightData.from_numpy(arr, key)
    return new_state_dict
'''

# The only edits: the import lines. (transformers is not needed: the adapter only reads attributes of the
# config, and `AutoConfig` appears only as an annotation.)
IMPORT_CHANGES = {
    "from max.graph.weights import WeightData, Weights": "from lazyweights import WeightData, Weights",
    "from max.dtype import DType": "from lazyweights import DType",
    "from transformers import AutoConfig": "from types import SimpleNamespace as AutoConfig",
}


def build_rope_perm(head_dim: int) -> np.ndarray:
    """The seed's "architecture-specific helper", here for partial RoPE: the first half of each head's
    dimensions rotate and are stored interleaved (x0, y0, x1, y1, ...); the kernel wants them half-split
    (x0, x1, ..., y0, y1, ...). The other half passes through."""
    rot = head_dim // 2
    return np.concatenate([np.arange(0, rot, 2), np.arange(1, rot, 2), np.arange(rot, head_dim)])


def load_seed_adapter(source: str, rope_perm_fn=build_rope_perm):
    """Execute one seed adapter's text with only its imports changed; return its function."""
    namespace = {"build_rope_perm": rope_perm_fn}
    # The later snippets use SAFETENSOR_MAPPING "defined earlier": run the first snippet, then this one.
    for text in (SEED_RENAME, source):
        for before, after in IMPORT_CHANGES.items():
            text = text.replace(before, after)
        assert "from max" not in text and "import max" not in text, "an import from max was not replaced"
        exec(compile(text, "<seed adapter>", "exec"), namespace)
    return namespace["convert_safetensor_state_dict"]


# --- the RoPE adapter, lazily ------------------------------------------------------------------------------
def convert_rope_lazy(state_dict, huggingface_config, rope_perm_fn=build_rope_perm, **unused_kwargs):
    """The seed's RoPE adapter with WeightData ops: nothing is read until the plan runs."""
    num_heads = huggingface_config.num_attention_heads
    head_dim = huggingface_config.hidden_size // num_heads
    num_kv_heads = getattr(huggingface_config, "num_key_value_heads", num_heads)
    rope_perm = rope_perm_fn(head_dim)
    mapping = {"model.": "", "self_attn.q_proj": "attention.q_proj"}
    new_state_dict = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in mapping.items():
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()
    for key, weight_data in new_state_dict.items():
        if key.endswith("q_proj.weight"):
            heads = num_heads
        elif key.endswith("k_proj.weight"):
            heads = num_kv_heads
        else:
            continue
        new_state_dict[key] = (weight_data.reshape(heads, head_dim, -1)[:, rope_perm, :]
                               .reshape(heads * head_dim, -1))
    return new_state_dict


def convert_all_lazy(state_dict, huggingface_config, rope_perm_fn=build_rope_perm, **unused_kwargs):
    """All four seed transformations in one lazy adapter: rename, drop KV scales, RoPE-permute, cast."""
    adapted = convert_rope_lazy(state_dict, huggingface_config, rope_perm_fn)
    out = {}
    for key, weight_data in adapted.items():
        if key.endswith((".k_scale", ".v_scale")):
            continue
        if weight_data.dtype == DType.float16 and not (key.endswith("bias") or key.endswith("scales")):
            weight_data = weight_data.astype(DType.bfloat16)
        out[key] = weight_data
    return out


# --- the independent eager reference (safetensors + numpy) ------------------------------------------------
def reference(raw: dict[str, np.ndarray], cfg, *, cast=False, drop=False, rope=False, perm=None):
    heads_q = cfg.num_attention_heads
    hd = cfg.hidden_size // heads_q
    perm = build_rope_perm(hd) if perm is None else perm
    out = {}
    for k, a in raw.items():
        name = k.replace("model.", "").replace("self_attn.q_proj", "attention.q_proj")
        if drop and name.endswith((".k_scale", ".v_scale")):
            continue
        if rope and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = heads_q if name.endswith("q_proj.weight") else cfg.num_key_value_heads
            a = np.ascontiguousarray(a.reshape(heads, hd, -1)[:, perm, :].reshape(heads * hd, -1))
        if cast and a.dtype == np.float16 and not name.endswith(("bias", "scales")):
            a = a.astype(C.bf16)
        out[name] = a
    return out


def compare(title: str, got: dict, want: dict) -> None:
    check_keys(got, want, f"{title}: names")
    for name in sorted(set(got) & set(want)):
        check(f"{title}: {name}", got[name], want[name])


def main() -> int:
    cfg_dict = dict(C.LLAMA)
    cfg = types.SimpleNamespace(**cfg_dict)
    with C.workdir("seed") as d:
        path = C.write_safetensors(os.path.join(d, "llama-f16", "model.safetensors"),
                                   C.llama_tensors(cfg_dict, np.float16, fp8_kv_scales=True), cfg_dict)
        raw = C.read_safetensors(path)  # independent of lazyweights

        # The seed's "Print the checkpoint" snippet (the path replaced).
        weights = load_weights([Path(path)])  # or .gguf
        for name, weight in weights.items():
            data = weight.data()
            shape = list(int(d) for d in data.shape)
            print(f"{name}: {shape} {data.dtype}")

        state_dict = dict(weights.items())
        seed = {
            "rename": (SEED_RENAME, {}),
            "cast": (SEED_CAST, {"cast": True}),
            "drop": (SEED_DROP, {"drop": True}),
            "rope (eager numpy)": (SEED_ROPE, {"rope": True}),
        }
        eager_rope = None
        for title, (source, what) in seed.items():
            adapter = load_seed_adapter(source)
            adapted = adapter(dict(state_dict), huggingface_config=cfg)
            got = plan(adapted).materialize()
            compare(f"seed {title}", got, reference(raw, cfg, **what))
            if what.get("rope"):
                eager_rope = got
            print(f"seed adapter {title}: {len(got)} tensors")

        # The lazy RoPE form: same bytes as the seed's eager form.
        lazy_rope = convert_rope_lazy(dict(state_dict), cfg)
        p = plan(lazy_rope)
        C.print_plan(p, "plan: the seed's RoPE adapter, lazy (q/k: reshape -> take -> reshape)")
        compare("lazy rope vs seed eager rope", p.materialize(), eager_rope)

        # All four at once, lazily, saved and read back with safetensors.
        adapted = convert_all_lazy(dict(state_dict), cfg)
        p = plan(adapted)
        C.print_plan(p, "plan: rename + drop KV scales + RoPE permute + f16->bf16, lazy")
        out = os.path.join(d, "converted.safetensors")
        p.save(out)
        compare("all four, saved", C.read_saved(out), reference(raw, cfg, cast=True, drop=True, rope=True))

        # bfloat16: the eager snippet cannot run (numpy's DLPack has no bfloat16); the lazy form can.
        bpath = C.write_safetensors(os.path.join(d, "llama-bf16", "model.safetensors"),
                                    {k: (v.astype(C.bf16) if v.dtype == np.float16 else v) for k, v in raw.items()})
        bweights = load_weights([bpath])
        try:
            load_seed_adapter(SEED_ROPE)(dict(bweights.items()), huggingface_config=cfg)
            print("note: the seed's eager RoPE snippet ran on bfloat16 too")
        except (BufferError, RuntimeError, TypeError) as e:
            print(f"note: the seed's eager RoPE snippet cannot run on bfloat16 (numpy's DLPack: {type(e).__name__}: "
                  f"{e}); the lazy form below can")
        got = plan(convert_rope_lazy(dict(bweights.items()), cfg)).materialize()
        compare("lazy rope on bf16", got, reference(C.read_safetensors(bpath), cfg, rope=True))
    return C.verdict("seed adapters (rename, cast, drop KV scales, RoPE) eager == lazy == numpy")


if __name__ == "__main__":
    C.run(main)
