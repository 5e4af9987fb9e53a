"""Write the golden sparse compressed-tensors checkpoints under tests/formats/data/ct_* (run with 0.14).

compressed-tensors 0.20 can no longer write or read sparse checkpoints (`sparse-bitmask`, `sparse-24-bitmask`,
`marlin-24`; "not longer supported as of compressed-tensors>0.14.0"), so these are written by 0.14.0, the last
version that does, and each folder carries 0.14's own decompression as `golden.st`:

    ct_sparse_bitmask/        sparse-bitmask (unstructured), bf16
    ct_sparse24_bitmask/      sparse-24-bitmask, bf16
    ct_sparse24_fp8/          sparse-24-bitmask over FP8 e4m3 weights (float-quantized, per-tensor scales)
    ct_sparse_bitmask_fp8/    sparse-bitmask over FP8 e4m3 weights (float-quantized, per-channel scales)
    ct_marlin24/              marlin-24 (int4 2:4, group 128): no golden, 0.14 cannot decompress it either

Each folder: model.safetensors and config.json as `ModelCompressor.compress_model` + `save` +
`update_config` write them, and golden.st = `ModelCompressor.decompress_model`'s state dict (a safetensors
file, named so that loading the folder does not pick it up as a shard).
Scales come from compressed-tensors' own `calculate_qparams` over each weight's min and max.

Regenerate (a clean venv, not the project's: 0.14 needs transformers < 5):

    python -m venv /tmp/venv-ct14
    /tmp/venv-ct14/bin/pip install torch==2.13.0 numpy safetensors "transformers<5" pydantic loguru psutil
    /tmp/venv-ct14/bin/pip install --no-deps compressed-tensors==0.14.0
    /tmp/venv-ct14/bin/python tests/formats/data/ct_make_sparse.py
"""
from __future__ import annotations

import json
import os
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
# Everything else is imported when the script runs, not when pytest's --doctest-modules imports this file (the
# project's environment has compressed-tensors 0.20, which cannot write these).


def _model(seed: int, unstructured: bool):
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj = torch.nn.Linear(72, 32, bias=False)    # [32, 72]: 9 mask bytes a row
            self.down_proj = torch.nn.Linear(36, 20, bias=False)  # [20, 36]: a partial mask byte (4 pad bits) a row

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = Mlp()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer()])
            self.norm = torch.nn.LayerNorm(72)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()

    torch.manual_seed(seed)
    m = Tiny().to(torch.bfloat16)
    with torch.no_grad():
        for lin in (m.model.layers[0].mlp.up_proj, m.model.layers[0].mlp.down_proj):
            w = torch.randn(lin.weight.shape) * 0.05
            if unstructured:
                w[torch.rand(w.shape) < 0.55] = 0.0  # about half the weights pruned, unevenly per row
                w[0, :] = 0.0                        # an empty row
                w[1, 5] = -0.0
            lin.weight.data = w.to(torch.bfloat16)
    return m


def _calibrate(model) -> None:
    """Scales from compressed-tensors' own calculate_qparams (what its observers compute from min and max)."""
    import torch
    from compressed_tensors.quantization.utils import calculate_qparams

    with torch.no_grad():
        for _, mod in model.named_modules():
            scheme = getattr(mod, "quantization_scheme", None)
            if scheme is None:
                continue
            w, args = mod.weight.data, scheme.weights
            if str(getattr(args.strategy, "value", args.strategy)) == "channel":
                lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
            else:
                lo, hi = w.amin().reshape(1), w.amax().reshape(1)
            scale, _ = calculate_qparams(lo, hi, args)
            mod.weight_scale.data = scale.to(mod.weight_scale.dtype).reshape(mod.weight_scale.shape)
            if hasattr(mod, "input_scale"):  # static activation scales start uninitialized: make the files repeatable
                mod.input_scale.data.fill_(1.0)


def write_case(name: str, sparsity: str, preset: str | None, unstructured: bool, seed: int) -> None:
    import compressed_tensors
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.config import SparsityCompressionConfig
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from safetensors.torch import save_file

    folder = os.path.join(HERE, name)
    os.makedirs(folder, exist_ok=True)
    model = _model(seed, unstructured)
    if preset:
        apply_quantization_config(model, QuantizationConfig(
            config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])}, ignore=["lm_head"]))
        _calibrate(model)
    sc = SparsityCompressionConfig.load_from_registry(sparsity, targets=["Linear"], ignore=["lm_head"])
    compressor = ModelCompressor.from_pretrained_model(model, sparsity_config_or_format=sc)
    compressor.compress_model(model)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, fh)
    compressor.update_config(folder)
    compressor.decompress_model(model)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "golden.st"),
              metadata={"written_by": f"compressed-tensors {compressed_tensors.__version__} decompress_model"})


def write_marlin24() -> None:
    """A marlin-24 checkpoint (int4, group 128, 2:4), written by 0.14's Marlin24Compressor."""
    import compressed_tensors
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import save_file

    folder = os.path.join(HERE, "ct_marlin24")
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(5)
    prefix = "model.layers.0.mlp.down_proj"
    w = torch.randn(128, 128) * 0.05
    w = w.reshape(-1, 4)
    keep = w.abs().topk(2, dim=1).indices
    mask = torch.zeros_like(w, dtype=torch.bool).scatter_(1, keep, True)
    w = (w * mask).reshape(128, 128).to(torch.float16)
    scheme = QuantizationScheme(targets=["Linear"], weights=preset_name_to_scheme("W4A16", ["Linear"]).weights)
    g = w.float().reshape(128, 1, 128)
    scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights)
    compressor = BaseCompressor.load_from_registry("marlin-24")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        out = compressor.compress({f"{prefix}.weight": w, f"{prefix}.weight_scale": scale.to(torch.float16)},
                                  names_to_scheme={prefix: scheme})
    out["model.norm.weight"] = torch.ones(128, dtype=torch.float16)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(folder, "model.safetensors"))
    qc = {"quant_method": "compressed-tensors", "format": "marlin-24", "quantization_status": "compressed",
          "version": compressed_tensors.__version__, "sparsity_config": {},
          "config_groups": {"group_0": json.loads(scheme.model_dump_json())}, "ignore": ["lm_head"]}
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "quantization_config": qc}, fh,
                  indent=2, sort_keys=True)


if __name__ == "__main__":
    import compressed_tensors

    assert compressed_tensors.__version__.startswith("0.14"), compressed_tensors.__version__
    write_case("ct_sparse_bitmask", "sparse-bitmask", None, True, 0)
    write_case("ct_sparse24_bitmask", "sparse-24-bitmask", None, False, 1)
    write_case("ct_sparse24_fp8", "sparse-24-bitmask", "FP8", False, 2)
    write_case("ct_sparse_bitmask_fp8", "sparse-bitmask", "FP8_DYNAMIC", True, 3)
    write_marlin24()
    folders = [os.path.join(HERE, d) for d in os.listdir(HERE) if d.startswith("ct_")]
    total = sum(os.path.getsize(os.path.join(d, f)) for d in folders if os.path.isdir(d) for f in os.listdir(d))
    print(f"written by compressed-tensors {compressed_tensors.__version__}: {total} bytes")
