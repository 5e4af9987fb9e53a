"""Tied embeddings: `lm_head.weight` aliases `embed_tokens.weight` - one source tensor, two outputs, one pass.

    python examples/tied_embeddings.py

Models with `tie_word_embeddings: true` (Llama 3.2 1B/3B, Gemma, Qwen2.5 0.5B ...) ship no `lm_head.weight`;
the output projection is the input embedding. A module that declares both gets the same lazy tensor under
two names. Equal graph nodes are one node, so the plan has ONE step for both outputs: the table is read
(and, with a cast, converted) once, and the two materialized arrays are the same memory.

Shown three times: the embedding passed through unchanged (a zero-copy view of the file); cast bf16 -> f16
(a fused step); and cast with lm_head's chain built a second time from the source rather than reusing the
object (graph nodes are values: equal chains are one node). Each time: the plan is printed, `plan.steps()` is checked to hold one step whose outputs
are both names, `materialize()` must return arrays sharing memory, and both must equal numpy's result on
the tensor read with safetensors. The cast plan is also saved and read back (both names present).
"""
from __future__ import annotations

import os

import numpy as np

import _common as C
from _common import check, check_keys, check_true

from lazyweights import DType, load_weights, plan

# Llama 3.2 1B: hidden 2048, intermediate 8192, 32 heads / 8 KV heads, head_dim 64, vocab 128256, tied.
LLAMA_TIED = {**C.LLAMA, "tie_word_embeddings": True, "intermediate_size": 1024}
TIED = ("embed_tokens.weight", "lm_head.weight")


def convert_tied_state_dict(state_dict, huggingface_config, dtype=None, rebuild=False, **unused_kwargs):
    """Strip `model.`; when the config ties embeddings, `lm_head.weight` is the embedding's WeightData.

    `rebuild=True` builds lm_head's chain a second time from the source instead of reusing the object:
    the nodes are equal values, so the plan still shares them."""
    out = {}
    for name, value in state_dict.items():
        data = value.data()
        out[name.replace("model.", "", 1)] = data.astype(dtype) if dtype is not None else data
    if huggingface_config.get("tie_word_embeddings") and "lm_head.weight" not in out:
        if rebuild:
            data = state_dict["model.embed_tokens.weight"].data()
            out["lm_head.weight"] = data.astype(dtype) if dtype is not None else data
        else:
            out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def run_case(title: str, state_dict, raw, cfg, dtype, np_dtype, save_to=None, rebuild=False) -> None:
    adapted = convert_tied_state_dict(state_dict, cfg, dtype, rebuild=rebuild)
    p = plan(adapted)
    C.print_plan(p, f"plan: {title}")
    steps = [s for s in p.steps() if set(s.outputs) & set(TIED)]
    check_true(f"{title}: one step for both", len(steps) == 1 and sorted(steps[0].outputs) == sorted(TIED),
               f"steps for the tied pair: {[(s.kind, s.outputs) for s in steps]}")
    print(f"{title}: {len(steps)} step ({steps[0].kind}) computes {steps[0].outputs}")
    got = p.materialize()
    a, b = got["embed_tokens.weight"], got["lm_head.weight"]
    check_true(f"{title}: one array", a is b or np.shares_memory(a, b),
               "lm_head.weight and embed_tokens.weight were materialized into separate memory")
    print(f"{title}: materialized arrays {'are the same object' if a is b else 'share memory'}")
    want = {k.replace("model.", "", 1): (v.astype(np_dtype) if np_dtype is not None else v) for k, v in raw.items()}
    want["lm_head.weight"] = want["embed_tokens.weight"]
    check_keys(got, want, f"{title}: names")
    for name in sorted(set(got) & set(want)):
        check(f"{title}: {name}", got[name], want[name])
    if save_to:
        p.save(save_to)
        saved = C.read_saved(save_to)
        check_keys(saved, want, f"{title}, saved: names")
        for name in TIED:
            check(f"{title}, saved: {name}", saved.get(name), want[name])


def main() -> int:
    cfg = LLAMA_TIED
    with C.workdir("tied") as d:
        src = C.write_safetensors(os.path.join(d, "llama-tied", "model.safetensors"),
                                  C.llama_tensors(cfg, C.bf16, lm_head=False), cfg)
        raw = C.read_safetensors(src)
        assert "lm_head.weight" not in raw
        state_dict = dict(load_weights([src]).items())
        run_case("tied, unchanged (zero-copy view)", state_dict, raw, cfg, None, None)
        run_case("tied, cast bf16 -> f16 (fused)", state_dict, raw, cfg, DType.float16, np.float16,
                 save_to=os.path.join(d, "f16.safetensors"))
        run_case("tied, cast, lm_head's chain built separately", state_dict, raw, cfg, DType.float16, np.float16,
                 rebuild=True)
    return C.verdict("tied embeddings: lm_head.weight = embed_tokens.weight, one step, one array")


if __name__ == "__main__":
    C.run(main)
