"""Serving-style loading: stream a checkpoint into a PyTorch module layer by layer (`Plan.stream`).

    python examples/stream_into_torch.py

A serving engine wants layer 0 on its device while later layers are still being read. `plan.stream("layers")`
yields `(name, array)` one layer's group at a time, in order, computed ahead on a background thread within a
prefetch window (here 1 MB: about two layers of this model), so memory held by finished-but-untaken tensors
stays bounded whatever the model's size. Each tensor is copied into the module's parameter as it arrives
(`torch.from_numpy` shares the array's memory; `copy_` puts it where the parameter lives) and dropped.

Checks: every parameter of the torch module equals the checkpoint tensor read with safetensors and cast with
numpy (bf16 -> f16 here), the arrival order is layer by layer, and nothing is left unloaded. Skips (exit 0,
with a note) where torch is not installed.
"""
from __future__ import annotations

import os

import numpy as np

import _common as C
from _common import check, check_true

from lazyweights import DType, load_weights, plan

CFG = {**C.LLAMA, "num_hidden_layers": 4}


def main() -> int:
    with C.workdir("stream") as d:
        tensors = C.llama_tensors(CFG, dtype=C.bf16)
        path = C.write_safetensors(os.path.join(d, "model.safetensors"), tensors, CFG)
        weights = load_weights([path])
        adapted = {name: w.data().astype(DType.float16) for name, w in weights.items()}
        p = plan(adapted)
        C.print_plan(p)
        try:
            import torch
        except ImportError:
            print("OK: stream_into_torch: skipped the loading, torch is not installed")
            return 0

        # A torch module with the checkpoint's names (a real engine's module would be built from the config).
        module = torch.nn.Module()
        params = {}
        for name, arr in tensors.items():
            params[name] = torch.nn.Parameter(torch.empty(arr.shape, dtype=torch.float16), requires_grad=False)
            module.register_parameter(name.replace(".", "__"), params[name])

        arrived = []
        with torch.no_grad():
            for name, array in p.stream("layers", prefetch="1MB"):
                params[name].copy_(torch.from_numpy(array))  # on a GPU engine: .copy_ into device memory
                arrived.append(name)

        read = C.read_safetensors(path)
        for name in tensors:
            check(name, params[name].numpy(), read[name].astype(np.float16))
        layers = [int(n.split(".")[2]) for n in arrived if n.startswith("model.layers.")]
        check_true("arrives layer by layer", layers == sorted(layers), str(layers))
        check_true("every parameter loaded", sorted(arrived) == sorted(tensors))
    return C.verdict("stream_into_torch")


if __name__ == "__main__":
    C.run(main)
