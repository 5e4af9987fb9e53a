"""Per-tensor type choice for llama-quantize presets (`Q4_K_M`, ...): a port of `llama_tensor_get_type`.

llama.cpp (src/llama-quant.cpp) does not quantize every tensor of a `Q4_K_M` file to Q4_K: the output
tensor gets Q6_K, some attention-value and FFN-down layers get Q6_K ("use_more_bits": the first and last
eighth of the layers and every third one between), tensors whose rows are not a multiple of the block
size fall back to a 32-block type (Q4_K -> Q5_0, Q6_K -> Q8_0, ...; F16 when even 32 does not divide), and
norms, 1-D tensors and MoE routers stay as they are. This module reproduces those choices for the presets

    Q8_0  Q6_K  Q5_K_M  Q5_K_S  Q4_K_M  Q4_K_S  Q3_K_M  Q2_K  Q4_0

`tensor_type` is the pure, per-tensor function. llama.cpp itself walks the tensors in a fixed order
(by layer number, then name) and counts attention-value tensors as it goes; `tensor_type` takes the
layer number from the name (`blk.N.`), which is the same count whenever every layer has one attn_v /
attn_qkv / attn_kv_b and one ffn_down, as transformer checkpoints do. `model_tensor_types` does the
whole-model walk with llama.cpp's counters, for the rare model where that does not hold.
`tests/kernels/test_kquant_encode.py` checks both against `llama_model_quantize` itself.

Example:
    >>> from lazyweights.quant.presets import tensor_type
    >>> choice = tensor_type("Q4_K_M", "blk.0.attn_v.weight", (256, 1024), n_layer=16)
    >>> choice.type, choice.reason.split(": ")
    ('Q6_K', ['attn_v', 'layer 0 of 16 is in the first/last eighth or every third (use_more_bits) -> Q6_K'])
    >>> tensor_type("Q4_K_M", "blk.3.attn_q.weight", (1024, 1024), n_layer=16)
    TypeChoice(type='Q4_K', reason=None)
    >>> tensor_type("Q4_K_M", "blk.3.attn_q.weight", (1024, 640), n_layer=16).type  # Gemma 3 270M rows
    'Q5_0'
    >>> tensor_type("Q4_K_M", "output_norm.weight", (1024,), n_layer=16)
    TypeChoice(type='F32', reason='not quantized: 1-D tensor')
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, NamedTuple, Sequence

from ..core.errors import ArgumentTypeError, UnknownPresetError, UnknownTypeError, UsageError
from ..core.names import parse_block
from ..core.quantization import QuantizationEncoding

# preset -> the type llama_ftype_get_default_type gives it
PRESETS: dict[str, str] = {
    "Q8_0": "Q8_0",
    "Q6_K": "Q6_K",
    "Q5_K_M": "Q5_K",
    "Q5_K_S": "Q5_K",
    "Q4_K_M": "Q4_K",
    "Q4_K_S": "Q4_K",
    "Q3_K_M": "Q3_K",
    "Q2_K": "Q2_K",
    "Q4_0": "Q4_0",
}

# ggml_blck_size for the types a preset can produce
_BLOCK = {"Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_0": 32, "Q4_0": 32, "Q4_1": 32,
          "Q5_0": 32, "Q5_1": 32, "F16": 1, "F32": 1, "BF16": 1}

# tensor_type_fallback: a 256-block type whose rows do not fit -> a 32-block type (F16 if that does not fit)
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1",
             "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}
_FLOATS = ("F32", "F16", "BF16")


def _block(ggml_type: str) -> int:
    """ggml_blck_size: 1 for the float types, the encoding's block otherwise."""
    return 1 if ggml_type in _FLOATS else QuantizationEncoding[ggml_type].block_elements


def override_types() -> tuple[str, ...]:
    """The GGML type names a per-tensor override (`--tensor-type`, `--output-tensor-type`,
    `--token-embedding-type`) may give: the float types and every block type lazyweights can quantize to.

    Example:
        >>> from lazyweights.quant.presets import override_types
        >>> "Q8_0" in override_types(), "BF16" in override_types(), "IQ2_XS" in override_types()
        (True, True, False)
    """
    from .registry import supported_quantize

    return _FLOATS + tuple(sorted(e.name for e in supported_quantize()))


def parse_type(name, what: str = "type") -> str:
    """A GGML type name as llama-quantize's `parse_ggml_type` reads it (case-insensitive: `q8_0` is Q8_0).
    Raises `UnknownTypeError` listing the types lazyweights can write; `what` names the option in it.

    Example:
        >>> from lazyweights.quant.presets import parse_type
        >>> parse_type("q6_k")
        'Q6_K'
    """
    valid = override_types()
    text = getattr(name, "name", name)  # a QuantizationEncoding or DType-like member
    key = str(text).strip().upper()
    if key not in valid:
        raise UnknownTypeError(f"{what}: unknown or unsupported GGML type {name!r}; the types lazyweights can "
                               f"write are {', '.join(valid)}")
    return key


class TensorTypeOverride(NamedTuple):
    """One `--tensor-type PATTERN=TYPE`: a regular expression searched in each tensor name, and its type."""

    pattern: str
    regex: re.Pattern
    type: str


def tensor_type_overrides(tensor_types) -> tuple[TensorTypeOverride, ...]:
    """`--tensor-type` overrides from a dict {pattern: type} or pairs [(pattern, type), ...], in order (the
    first pattern that matches a tensor wins, as in llama.cpp). Patterns are regular expressions searched
    anywhere in the GGUF tensor name (`std::regex_search`); unlike llama-quantize's command line, which
    lowercases them, they are used as given (as `llama_model_quantize`'s `tt_overrides` are).

    Example:
        >>> from lazyweights.quant.presets import tensor_type_overrides
        >>> [(o.pattern, o.type) for o in tensor_type_overrides({"attn_q": "q8_0", "ffn_(up|gate)": "Q6_K"})]
        [('attn_q', 'Q8_0'), ('ffn_(up|gate)', 'Q6_K')]
    """
    if not tensor_types:
        return ()
    if isinstance(tensor_types, TensorTypeOverride):
        tensor_types = [tensor_types]
    pairs = list(tensor_types.items()) if isinstance(tensor_types, Mapping) else list(tensor_types)
    out = []
    for pair in pairs:
        if isinstance(pair, TensorTypeOverride):
            out.append(pair)
            continue
        if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ArgumentTypeError(f"tensor_types entries are (pattern, type) pairs, got {pair!r}")
        pattern, ggml_type = pair
        if not isinstance(pattern, str) or not pattern:
            raise ArgumentTypeError(f"a tensor_types pattern is a non-empty string, got {pattern!r}")
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise UsageError(f"--tensor-type pattern {pattern!r} is not a regular expression: {e}") from e
        out.append(TensorTypeOverride(pattern, regex, parse_type(ggml_type, f"--tensor-type {pattern}")))
    return tuple(out)


def _manual_type(name: str, overrides: Sequence[TensorTypeOverride]) -> TensorTypeOverride | None:
    for o in overrides:
        if o.regex.search(name):
            return o
    return None



class TypeChoice(NamedTuple):
    """The GGML type for one tensor, and why it is not the preset's default (None when it is)."""

    type: str
    reason: str | None


def _preset_default(preset: str) -> str:
    p = str(preset).upper()
    if p not in PRESETS:
        raise UnknownPresetError(
            f"unknown quantization preset {preset!r}; the supported presets are {', '.join(PRESETS)}"
        )
    return p


def _category(name: str) -> str:
    """tensor_get_category: the first rule that matches wins (attn_qkv before attn_v before ...)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
                     ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                     ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                     ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def _is_attn_v(cat: str) -> bool:
    return cat in ("attn_v", "attn_qkv", "attn_kv_b")


_NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                  "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                  "indexer.q_proj.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
                  "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
_TIME_MIX = ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2", "decay_w1", "decay_w2",
             "lerp_fused")


def _ggml_n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims over the ggml `ne` (numpy shape reversed): trailing size-1 dims do not count."""
    ne = list(reversed(shape))
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] > 1:
            return i + 1
    return 1


def not_quantized_reason(name: str, shape: tuple[int, ...]) -> str | None:
    """tensor_allows_quantization, inverted: why this tensor keeps its type (None when it is quantized).

    Example:
        >>> not_quantized_reason("blk.0.attn_norm.weight", (4096,)), not_quantized_reason("blk.0.attn_q.weight", (8, 8))
        ('not quantized: 1-D tensor', None)
    """
    if _ggml_n_dims(shape) < 2:
        return "not quantized: 1-D tensor"
    if not name.endswith("weight"):
        return "not quantized: name does not end in 'weight'"
    for key in _NOT_QUANTIZED:
        if key in name:
            return f"not quantized: {key!r} tensors are kept"
    if name in ("position_embd.weight", "token_types.weight"):
        return f"not quantized: {name} is kept"
    for suffix in _TIME_MIX:
        if f"time_mix_{suffix}.weight" in name:
            return "not quantized: small RWKV time-mix tensor"
    return None


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    # C integer division and remainder (truncating toward zero): `//` and `%` agree for the non-negative
    # values here except (i - n/8) % 3 with i < n/8, where C gives a non-positive result and Python a
    # positive one; the first clause already returns True for every such i.
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or _c_mod(i_layer - n_layers // 8, 3) == 2


def _c_mod(a: int, b: int) -> int:
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def tensor_type(
    preset: str,
    name: str,
    shape: Iterable[int],
    *,
    n_layer: int,
    n_expert: int = 0,
    tied_embeddings: bool = False,
    has_imatrix: bool = False,
    n_gqa: int = 1,
    arch: str = "llama",
    is_70b: bool = False,
    source_type: str = "F32",
    attn_v_index: int | None = None,
    n_attn_v: int | None = None,
    ffn_index: int | None = None,
    tensor_types=(),
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    pure: bool = False,
) -> TypeChoice:
    """The GGML type llama-quantize gives tensor `name` under `preset`, with the reason when a rule applied.

    `shape` is numpy order (a llama.cpp `ne = [4096, 11008]` tensor is `(11008, 4096)`; stacked experts are
    `(n_expert, rows, row_length)`). `n_layer` is the model's block count, `n_expert` its expert count (0 or 1
    for dense models), `tied_embeddings` True when the file has no `output.weight` (token_embd is then also
    the output and is quantized like it), `has_imatrix` whether an importance matrix is given, `n_gqa` the
    query heads per KV head. Tensors llama.cpp keeps unquantized return `source_type`.

    `attn_v_index` / `n_attn_v` / `ffn_index` override llama.cpp's running counters (default: the layer
    number from the name, and `n_layer`); `model_tensor_types` computes them for a whole model.

    llama-quantize's per-tensor controls, in its order (`llama_tensor_get_type`): `token_embedding_type` and
    `output_tensor_type` give token_embd / output.weight that type as is; else the first of `tensor_types`
    (see `tensor_type_overrides`) whose pattern is found in the name gives its type; else `pure` keeps the
    preset's type; else the preset's rules apply (a tied token_embd takes `output_tensor_type` there). The
    32-block fallback applies to all but the first two.

    Raises `UnknownPresetError` (listing the presets) for any other preset.

    Example:
        >>> from lazyweights.quant.presets import tensor_type
        >>> tensor_type("Q4_K_M", "token_embd.weight", (262144, 640), n_layer=18, tied_embeddings=True)
        TypeChoice(type='Q8_0', reason='tied token_embd (is the output): 640 columns not a multiple of 256 -> Q8_0')
        >>> tensor_type("Q4_K_M", "blk.0.attn_v.weight", (256, 1024), n_layer=16, tensor_types=[("attn_v", "Q8_0")])
        TypeChoice(type='Q8_0', reason="--tensor-type 'attn_v'=Q8_0")
    """
    default = PRESETS[_preset_default(preset)]
    preset = str(preset).upper()
    shape = tuple(int(d) for d in shape)
    why_not = not_quantized_reason(name, shape)
    if why_not is not None:
        return TypeChoice(source_type, why_not)
    overrides = tensor_type_overrides(tensor_types)
    if output_tensor_type is not None:
        output_tensor_type = parse_type(output_tensor_type, "--output-tensor-type")
    if token_embedding_type is not None:
        token_embedding_type = parse_type(token_embedding_type, "--token-embedding-type")
    ncols = shape[-1]
    cat = _category(name)
    if token_embedding_type is not None and cat == "token_embd":
        # per_layer_token_embd follows --token-embedding-type unless a --tensor-type pattern names it
        if name != "per_layer_token_embd.weight" or _manual_type(name, overrides) is None:
            return TypeChoice(token_embedding_type, f"token_embd: --token-embedding-type {token_embedding_type}")
    if output_tensor_type is not None and cat == "output":
        return TypeChoice(output_tensor_type, f"output: --output-tensor-type {output_tensor_type}")
    in_block = parse_block(name)
    layer = in_block[0] if in_block else None
    falcon = arch == "falcon"
    new, reason = default, None
    manual = _manual_type(name, overrides)
    if manual is not None:
        new, reason = manual.type, f"--tensor-type {manual.pattern!r}={manual.type}"
    rules = manual is None and not pure

    def layer_info(counter: int | None) -> tuple[int, int]:
        # with experts llama.cpp parses the layer from the name; otherwise it uses its running counter,
        # which equals the layer number when each layer has one such tensor
        if max(1, n_expert) > 1 or counter is None:
            if layer is None:
                raise UsageError(f"cannot determine the layer of tensor {name!r} (expected 'blk.N.'; "
                                 f"n_expert={n_expert})")
            return layer, n_layer
        return counter, n_layer

    if not rules:
        pass
    elif cat == "output" or (tied_embeddings and cat == "token_embd"):
        what = "output" if cat == "output" else "tied token_embd (is the output)"
        if output_tensor_type is not None:
            new, reason = output_tensor_type, f"{what}: --output-tensor-type {output_tensor_type}"
        elif falcon or ncols % _BLOCK[default] != 0:
            new = "Q8_0"
            reason = (f"{what}: {ncols} columns not a multiple of {_BLOCK[default]} -> Q8_0" if not falcon
                      else f"{what}: falcon -> Q8_0")
        elif new != "Q8_0":
            new = "Q6_K"
            reason = f"{what} -> Q6_K"
    elif cat == "token_embd":
        pass  # none of these presets changes an untied token_embd
    elif _is_attn_v(cat):
        i_v = attn_v_index if attn_v_index is not None else (layer if layer is not None else 0)
        n_v = n_attn_v if n_attn_v is not None else n_layer
        if preset == "Q2_K":
            new = "Q4_K" if n_gqa >= 4 else "Q3_K"
            reason = f"{cat}: Q2_K preset, n_gqa {n_gqa} -> {new}"
        elif preset == "Q3_K_M":
            new = "Q5_K" if i_v < 2 else "Q4_K"
            reason = f"{cat}: Q3_K_M, attention-value tensor {i_v} -> {new}"
        elif preset in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i_v, n_v):
            new = "Q6_K"
            reason = f"{cat}: layer {i_v} of {n_v} is in the first/last eighth or every third (use_more_bits) -> Q6_K"
        elif preset == "Q4_K_S" and i_v < 4:
            new = "Q5_K"
            reason = f"{cat}: Q4_K_S, attention-value tensor {i_v} < 4 -> Q5_K"
        if is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
            reason = f"{cat}: 70B model (8 heads share attn_v) -> Q5_K"
        if n_expert == 8:
            new = "Q8_0"
            reason = f"{cat}: 8-expert model -> Q8_0"
    elif cat == "attn_k":
        if n_expert == 8:
            new, reason = "Q8_0", "attn_k: 8-expert model -> Q8_0"
    elif cat == "attn_q":
        pass
    elif cat == "ffn_down":
        i_layer, n_l = layer_info(ffn_index if ffn_index is not None else layer)
        if preset == "Q2_K":
            new, reason = "Q3_K", "ffn_down: Q2_K preset -> Q3_K"
        elif preset == "Q3_K_M":
            if i_layer < _c_div(n_l, 16):
                new = "Q5_K"
            elif not falcon or _use_more_bits(i_layer, n_l):
                new = "Q4_K"
            else:
                new = "Q3_K"
            if new != default:
                reason = f"ffn_down: Q3_K_M, layer {i_layer} of {n_l} -> {new}"
        elif preset == "Q4_K_M":
            if falcon:
                new = "Q6_K" if i_layer < _c_div(n_l, 16) else "Q5_K" if _use_more_bits(i_layer, n_l) else "Q4_K"
            elif _use_more_bits(i_layer, n_l):
                new = "Q6_K"
            if new != default:
                reason = (f"ffn_down: layer {i_layer} of {n_l} is in the first/last eighth or every third "
                          f"(use_more_bits) -> {new}")
        elif preset == "Q5_K_M" and _use_more_bits(i_layer, n_l):
            new = "Q6_K"
            reason = (f"ffn_down: layer {i_layer} of {n_l} is in the first/last eighth or every third "
                      "(use_more_bits) -> Q6_K")
        elif preset == "Q4_K_S" and not falcon and i_layer < _c_div(n_l, 8):
            new = "Q5_K"
            reason = f"ffn_down: Q4_K_S, layer {i_layer} in the first eighth of {n_l} -> Q5_K"
        elif preset == "Q4_0" and has_imatrix and i_layer < _c_div(n_l, 8):
            new = "Q4_1"
            reason = f"ffn_down: Q4_0 with an imatrix, layer {i_layer} in the first eighth of {n_l} -> Q4_1"
    elif cat == "attn_output":
        if not falcon:
            if n_expert == 8:
                if preset in ("Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M"):
                    new, reason = "Q5_K", "attn_output: 8-expert model -> Q5_K"
            elif preset == "Q2_K":
                new, reason = "Q3_K", "attn_output: Q2_K preset -> Q3_K"
            elif preset == "Q3_K_M":
                new, reason = "Q4_K", "attn_output: Q3_K_M preset -> Q4_K"
    elif cat == "attn_qkv":  # unreachable: attn_qkv is an attention-value category above (as in llama.cpp)
        pass

    # tensor_type_fallback: rows that are not a whole number of blocks
    block = _block(new)
    if ncols % block != 0:
        chosen = new
        fb = _FALLBACK.get(new, new)  # 32-block types have no smaller block: F16 below if 32 does not fit
        if ncols % _block(fb) != 0:
            fb = "F16"
        new = fb
        reason = (reason + "; " if reason else "") + f"{ncols} columns not a multiple of {block} (for {chosen}) -> {fb}"
    return TypeChoice(new, reason)


def weight_order_key(name: str):
    """llama_model_loader's weight_name_comparer: by layer (`blk.N.`, -1 without one), then by name.

    Example:
        >>> sorted(["blk.10.a", "output.weight", "blk.2.b", "blk.2.a"], key=weight_order_key)
        ['output.weight', 'blk.2.a', 'blk.2.b', 'blk.10.a']
    """
    block = parse_block(name)
    return (block[0] if block else -1, name.encode())


def model_tensor_types(
    preset: str,
    tensors: Mapping[str, Iterable[int]],
    *,
    n_layer: int,
    n_expert: int = 0,
    has_imatrix: bool = False,
    n_gqa: int = 1,
    arch: str = "llama",
    is_70b: bool = False,
    source_types: Mapping[str, str] | None = None,
    tensor_types=(),
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    pure: bool = False,
) -> dict[str, TypeChoice]:
    """`tensor_type` for every tensor of a model (name -> numpy shape), with llama.cpp's running counters.

    Tied embeddings are inferred as llama.cpp does: tied unless there is an `output.weight`. The counters
    advance only for tensors the preset's rules decide (not for those a `tensor_types` pattern or `pure`
    decides), as in llama.cpp.

    Example:
        >>> from lazyweights.quant.presets import model_tensor_types
        >>> shapes = {f"blk.{i}.attn_v.weight": (256, 1024) for i in range(8)}
        >>> shapes["token_embd.weight"] = (32000, 1024)
        >>> types = model_tensor_types("Q4_K_M", shapes, n_layer=8)  # more bits: i < 1, i >= 7, (i - 1) % 3 == 2
        >>> [types[f"blk.{i}.attn_v.weight"].type for i in range(8)], types["token_embd.weight"].type
        (['Q6_K', 'Q4_K', 'Q4_K', 'Q6_K', 'Q4_K', 'Q4_K', 'Q6_K', 'Q6_K'], 'Q6_K')
    """
    _preset_default(preset)
    overrides = tensor_type_overrides(tensor_types)
    names = sorted(tensors, key=weight_order_key)
    tied = "output.weight" not in tensors
    n_attn_v = sum(1 for n in names if _is_attn_v(_category(n)))
    i_attn_v = i_ffn_down = 0
    out: dict[str, TypeChoice] = {}
    for name in names:
        shape = tuple(tensors[name])
        src = (source_types or {}).get(name, "F32")
        cat = _category(name)
        quantized = not_quantized_reason(name, shape) is None
        out[name] = tensor_type(
            preset, name, shape, n_layer=n_layer, n_expert=n_expert, tied_embeddings=tied, has_imatrix=has_imatrix,
            n_gqa=n_gqa, arch=arch, is_70b=is_70b, source_type=src, attn_v_index=i_attn_v, n_attn_v=n_attn_v,
            ffn_index=i_ffn_down, tensor_types=overrides, output_tensor_type=output_tensor_type,
            token_embedding_type=token_embedding_type, pure=pure,
        )
        # llama.cpp advances its counters only for tensors that reach the type rules
        rules = not pure and _manual_type(name, overrides) is None
        if quantized and rules and not (tied and cat == "token_embd"):
            if _is_attn_v(cat):
                i_attn_v += 1
            elif cat == "ffn_down":
                i_ffn_down += 1
    return out
