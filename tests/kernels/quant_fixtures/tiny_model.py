"""Tiny synthetic llama-architecture GGUFs (bf16) and llama.cpp's own quantizer over them.

Used by tests/kernels/test_kquant_encode.py to judge `lazyweights.quant.presets` against `llama_model_quantize`
(which needs llama-cpp-python), and to compare the quantized tensor bytes llama.cpp writes with
lazyweights' encoders on the same inputs.

Example (needs llama_cpp):
    >>> spec = ModelSpec(n_layer=4)                                              # doctest: +SKIP
    >>> path = write_tiny_gguf(spec, "/tmp/tiny.gguf")                           # doctest: +SKIP
    >>> types = llama_quantize_types(path, "/tmp/tiny-q4km.gguf", "Q4_K_M")       # doctest: +SKIP
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ModelSpec:
    n_layer: int = 16
    n_embd: int = 256
    n_ff: int = 256
    n_head: int = 4
    n_head_kv: int = 1
    n_vocab: int = 128
    n_expert: int = 0  # > 0: MoE FFNs (stacked expert tensors + a router)
    tied: bool = False  # no output.weight: token_embd is also the output
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def tensor_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """name -> numpy shape, as convert_hf_to_gguf writes a llama model."""
    e, f, kv = spec.n_embd, spec.n_ff, spec.n_head_kv * spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (spec.n_vocab, e), "output_norm.weight": (e,)}
    if not spec.tied:
        shapes["output.weight"] = (spec.n_vocab, e)
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        shapes[b + "attn_norm.weight"] = (e,)
        shapes[b + "attn_q.weight"] = (e, e)
        shapes[b + "attn_k.weight"] = (kv, e)
        shapes[b + "attn_v.weight"] = (kv, e)
        shapes[b + "attn_output.weight"] = (e, e)
        shapes[b + "ffn_norm.weight"] = (e,)
        if spec.n_expert:
            x = spec.n_expert
            shapes[b + "ffn_gate_inp.weight"] = (x, e)
            shapes[b + "ffn_gate_exps.weight"] = (x, f, e)
            shapes[b + "ffn_up_exps.weight"] = (x, f, e)
            shapes[b + "ffn_down_exps.weight"] = (x, e, f)
        else:
            shapes[b + "ffn_gate.weight"] = (f, e)
            shapes[b + "ffn_up.weight"] = (f, e)
            shapes[b + "ffn_down.weight"] = (e, f)
    return shapes


def tensor_values(spec: ModelSpec) -> dict[str, np.ndarray]:
    """Deterministic float32 values, already rounded to bf16 (what the file stores)."""
    rng = np.random.default_rng(spec.seed)
    out = {}
    for name, shape in tensor_shapes(spec).items():
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(0.05)
        if name.endswith("norm.weight"):
            x = np.ones(shape, np.float32)
        bits = x.view(np.uint32)
        # round to nearest even bf16, so the float32 llama.cpp decodes equals this array
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        out[name] = bits.view(np.float32)
    return out


def write_tiny_gguf(spec: ModelSpec, path: str) -> str:
    import gguf  # noqa: PLC0415

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny")
    w.add_context_length(256)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(spec.n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    if spec.n_expert:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(min(2, spec.n_expert))
    for name, x in tensor_values(spec).items():
        if x.ndim == 1:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, (x.view(np.uint32) >> 16).astype(np.uint16), raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_quantize(src: str, dst: str, preset: str, imatrix: dict[str, np.ndarray] | None = None,
                   nthread: int = 1) -> None:
    """llama.cpp's `llama_model_quantize(src, dst, preset)`, optionally with importance-matrix entries."""
    import llama_cpp  # noqa: PLC0415

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = nthread
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    keep = []
    if imatrix:
        arr = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, w) in enumerate(imatrix.items()):
            w = np.ascontiguousarray(w, np.float32)
            keep.append(w)
            arr[i].name = name.encode()
            arr[i].data = w.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = w.size
        arr[len(imatrix)].name = None
        keep.append(arr)
        params.imatrix = ctypes.cast(arr, type(params.imatrix))
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src}, {preset}) failed with {rc}")


def read_types(path: str) -> dict[str, str]:
    """tensor name -> GGML type name, read back with gguf-py."""
    import gguf  # noqa: PLC0415

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def read_tensor_bytes(path: str) -> dict[str, np.ndarray]:
    import gguf  # noqa: PLC0415

    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
