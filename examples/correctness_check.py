"""The seed's correctness-check workflow, end to end, on a small checkpoint this script writes itself.

    python examples/correctness_check.py            # a correct adapter: prints everything, exits 0
    python examples/correctness_check.py --broken   # a broken adapter: prints the report, exits 1

Steps (as "Write a weight adapter" describes them):
1. print the checkpoint (`load_weights(...).items()`: name, shape, dtype);
2. print the module's `raw_state_dict()` (name, shape, dtype, quantization encoding);
3. run the adapter (rename, cast fp16 -> bf16, drop the FP8 KV-cache scales) and print the plan's keys;
4. `lazyweights.check(adapted, model)`: the bring-up report, reading no tensor bytes;
5. `model.load_state_dict(adapted)`: one plan, straight into the module's buffers; then compare every
   loaded value with the checkpoint read independently by `safetensors`.
Exits non-zero on any mismatch.

The same check from the command line:
    lazyweights check examples/correctness_check.py:convert_safetensor_state_dict CKPT \\
        --module examples/correctness_check.py:TinyLlama
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import ml_dtypes
import numpy as np

from lazyweights import DType, Weight, WeightData, Weights, load_weights, plan
from lazyweights.interop.check import check
from lazyweights.core.errors import LoadError
from lazyweights.interop.module import LayerList, Module

HIDDEN, FFN, VOCAB, LAYERS = 16, 32, 48, 3


# --- the module the adapter targets ------------------------------------------------------------------
class Linear(Module):
    def __init__(self, in_dim: int, out_dim: int, dtype=DType.bfloat16):
        super().__init__()
        self.weight = Weight("weight", dtype, (out_dim, in_dim))


class Embedding(Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.weight = Weight("weight", DType.bfloat16, (vocab, dim))


class RMSNorm(Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = Weight("weight", DType.bfloat16, (dim,))


class Attention(Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, HIDDEN)
        self.v_proj = Linear(HIDDEN, HIDDEN)
        self.o_proj = Linear(HIDDEN, HIDDEN)


class MLP(Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = Linear(HIDDEN, FFN)
        self.up_proj = Linear(HIDDEN, FFN)
        self.down_proj = Linear(FFN, HIDDEN)


class Block(Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.attention = Attention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLP()


class TinyLlama(Module):
    def __init__(self, num_layers: int = LAYERS):
        super().__init__()
        self.embed_tokens = Embedding(VOCAB, HIDDEN)
        self.layers = LayerList([Block() for _ in range(num_layers)])
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = Linear(HIDDEN, VOCAB)


# --- the checkpoint: Hugging Face names, fp16, with FP8 KV-cache scales the module does not use ----------
def write_checkpoint(directory: str, seed: int = 0) -> str:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    t = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
                  p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
                  p + "mlp.down_proj.weight": (HIDDEN, FFN)})
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + f"self_attn.{proj}.weight"] = (HIDDEN, HIDDEN)
        t[p + "self_attn.k_scale"] = ()
        t[p + "self_attn.v_scale"] = ()
    tensors = {k: rng.standard_normal(s).astype(np.float16) if s else np.array(1.0, np.float32) for k, s in t.items()}
    path = os.path.join(directory, "model.safetensors")
    save_file(tensors, path)
    return path


# --- the adapter, in the seed's style --------------------------------------------------------------------
SAFETENSOR_MAPPING = {
    "model.": "",                # strip this string
    "self_attn.": "attention.",  # rename this string
}
UNUSED_SUFFIXES = (".k_scale", ".v_scale")


def convert_safetensor_state_dict(state_dict: dict[str, Weights], **unused_kwargs) -> dict[str, WeightData]:
    new_state_dict: dict[str, WeightData] = {}
    for checkpoint_name, value in state_dict.items():
        max_name = checkpoint_name
        for before, after in SAFETENSOR_MAPPING.items():
            max_name = max_name.replace(before, after)
        new_state_dict[max_name] = value.data()
    # Cast weights to a dtype the kernel supports
    for key, weight_data in new_state_dict.items():
        if weight_data.dtype == DType.float16 and not (key.endswith("bias") or key.endswith("scales")):
            new_state_dict[key] = weight_data.astype(DType.bfloat16)
    # Drop FP8 KV-cache scales
    for key in list(new_state_dict):
        if key.endswith(UNUSED_SUFFIXES):
            del new_state_dict[key]
    return new_state_dict


def broken_adapter(state_dict: dict[str, Weights], **unused_kwargs) -> dict[str, WeightData]:
    """The usual bring-up mistakes: a typo, a forgotten cast, a transposed weight, a lost layer, an extra."""
    out = convert_safetensor_state_dict(state_dict)
    out["layers.0.mlp.up_proj.wieght"] = out.pop("layers.0.mlp.up_proj.weight")  # typo
    out["layers.1.attention.q_proj.weight"] = state_dict["model.layers.1.self_attn.q_proj.weight"].data()  # no cast
    out["layers.2.mlp.down_proj.weight"] = out["layers.2.mlp.down_proj.weight"].transpose()  # wrong layout
    for key in [k for k in out if k.startswith("layers.2.attention.")]:
        del out[key]  # a whole layer's attention lost
    out["rotary_emb.inv_freq"] = WeightData.from_numpy(np.ones(HIDDEN // 2, np.float32), "rotary_emb.inv_freq")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broken", action="store_true", help="use an adapter with the usual mistakes")
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temporary directory)")
    args = ap.parse_args(argv)
    directory = args.dir or tempfile.mkdtemp(prefix="lazyweights-check-")
    path = write_checkpoint(directory)

    weights = load_weights([path])
    print(f"# 1. the checkpoint ({path})")
    for name, weight in weights.items():
        data = weight.data()
        print(f"{name}: {list(int(d) for d in data.shape)} {data.dtype}")

    model = TinyLlama()
    print("\n# 2. the module's raw_state_dict()")
    for name, weight in model.raw_state_dict().items():
        print(f"{name}: {list(weight.shape)} {weight.dtype} {weight.quantization_encoding}")

    adapter = broken_adapter if args.broken else convert_safetensor_state_dict
    adapted = adapter(dict(weights.items()))
    print("\n# 3. the adapted state dict (the plan's keys), and the plan itself")
    for name in sorted(plan(adapted).outputs):
        print(name)
    print(plan(adapted))

    print("\n# 4. lazyweights.check(adapted, model)")
    report = check(adapted, model, checkpoint=weights)
    print(report)
    if not report.ok:
        return 1

    print("\n# 5. model.load_state_dict(adapted), compared with safetensors")
    try:
        model.load_state_dict(adapted)
    except LoadError as e:  # check() said OK, so this would be a bug
        print(e)
        return 1
    from safetensors.numpy import load_file

    reference = load_file(path)
    loaded = model.state_dict()
    bad = []
    for ckpt_name, arr in reference.items():
        name = ckpt_name
        for before, after in SAFETENSOR_MAPPING.items():
            name = name.replace(before, after)
        if name.endswith(UNUSED_SUFFIXES):
            continue
        want = arr.astype(ml_dtypes.bfloat16)
        got = loaded[name]
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            bad.append(name)
    print(f"{len(loaded)} weights loaded; {len(bad)} differ from the checkpoint" + (f": {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
