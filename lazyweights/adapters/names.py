"""Tensor names from gguf-py's own tables: Hugging Face -> GGUF through `gguf.get_tensor_name_map(arch, n)`,
GGUF -> Hugging Face as its inverse, chosen among the candidates by the names the Hugging Face model expects.

gguf-py's `TensorNameMap` lists, for every GGUF tensor of an architecture, all the Hugging Face names any
checkpoint family uses for it; the inverse of one GGUF name is therefore a list of candidates
(`blk.0.attn_q` <- `model.layers.0.self_attn.q_proj`, `transformer.h.0.attn.q_proj`, ...). The right one is
the candidate the Hugging Face model class declares, and the names it declares are a record
(`adapters/hf_names.py`: GGUF name -> HF name by model_type, `record_hf_names`), so a conversion takes the same
time and writes the same names whether or not transformers is installed, and never imports it. For a tensor
the record does not list, the record's `hf_prefer` ranking picks. transformers judges the records in tests
(`expected_hf_shapes`, tests/adapters/test_names_from_records.py).

Example:
    >>> from lazyweights.adapters.names import hf_to_gguf_name, gguf_to_hf_candidates
    >>> hf_to_gguf_name("transformer.h.3.attn.c_attn.weight", "gpt2")
    'blk.3.attn_qkv.weight'
    >>> "model.layers.0.self_attn.q_proj.weight" in gguf_to_hf_candidates("blk.0.attn_q.weight", "llama")
    True
"""
from __future__ import annotations

import functools
import re
from typing import Any, Iterable, Mapping

from ..core.errors import UnsupportedArchitectureError
from ..core.names import block_template, parse_block
from .archs import arch_for_gguf
from .family_hooks import FamilyHooks

_SUFFIXES = (".weight", ".bias")


_SCORE_BIAS = ("e_score_correction_bias", "e_score_correction.bias")
_EXPERT_BIAS = ("mlp.expert_bias", "feed_forward.expert_bias")  # AFMoE's, LFM2-MoE's router bias: bare in gguf-py
_LAYER_SCALAR = (".layer_scalar", ".layer_scalar.weight")  # Gemma 4's bare per-layer output scale
_DT_BIAS = (".dt_bias", ".dt_proj.bias")  # Mamba-2's dt_bias: llama.cpp's converter names it dt_proj.bias
_HF_BID = re.compile(r"(?:^|(?<=\.))(\d+)(?=\.)")


@functools.lru_cache(maxsize=64)
def _name_map(arch: str):
    """gguf-py's table for one block (every block is named alike: `{bid}` is the only variable)."""
    import gguf

    for key, name in gguf.MODEL_ARCH_NAMES.items():
        if name == arch:
            return gguf.get_tensor_name_map(key, 1)
    raise UnsupportedArchitectureError(f"gguf-py has no tensor name table for architecture {arch!r}")


@functools.lru_cache(maxsize=64)
def _hooks(arch: str) -> FamilyHooks:
    """The hooks of the record a GGUF file of architecture `arch` is without metadata (`archs.arch_for_gguf`: the
    architecture's default record): a family's own tensor spellings (`hf_name_to_gguf`, `gguf_name_candidates`);
    none for an architecture no record has (gguf-py's tables name more)."""
    try:
        return arch_for_gguf(arch).hooks
    except UnsupportedArchitectureError:  # no record: gguf-py's table alone (its own error, if any, comes later)
        return FamilyHooks()


@functools.lru_cache(maxsize=64)
def _inverse(arch: str) -> dict[str, tuple[str, ...]]:
    inv: dict[str, list[str]] = {}
    for hf, (_, gg) in _name_map(arch).mapping.items():
        if hf != gg:
            inv.setdefault(gg, []).append(hf)
    return {k: tuple(v) for k, v in inv.items()}


def hf_to_gguf_name(name: str, arch: str) -> str | None:
    """The GGUF name gguf-py gives a Hugging Face tensor name (`.weight`/`.bias` kept), or None. The first
    number in the name is the block. Names a family spells its own way are its record's hook's
    (`family_hooks`: `hf_name_to_gguf`)."""
    if name.endswith(_SCORE_BIAS[0]):  # DeepSeek-style routers' parameter, a bias in gguf-py's table
        name = name[: -len(_SCORE_BIAS[0])] + _SCORE_BIAS[1]
    if name.endswith(_DT_BIAS[0]):
        name = name[: -len(_DT_BIAS[0])] + _DT_BIAS[1]
    if name.endswith(_LAYER_SCALAR[0]):
        name += ".weight"
    own = _hooks(arch).hf_name_to_gguf
    if own is not None:  # the family's own spellings first (its record's hook), the shared rules for the rest
        return own(name, functools.partial(_hf_to_gguf_name, arch=arch), functools.partial(_shared_rules, arch=arch))
    return _shared_rules(name, arch)


def _shared_rules(name: str, arch: str) -> str | None:
    """`hf_to_gguf_name` after the renamings and a family's own spellings: gguf-py's table, with the prefixes
    some of its entries lack."""
    if name.endswith(_EXPERT_BIAS):
        return _hf_to_gguf_name(name, arch) and f"{_hf_to_gguf_name(name, arch)}.bias"
    got = _hf_to_gguf_name(name, arch)
    if got is None and "." in name.split(".", 1)[1]:  # gguf-py lists some without the outer prefix (BLOOM)
        got = _hf_to_gguf_name(name.split(".", 1)[1], arch)
    if got is None and not name.startswith("model."):  # a head-less base model's keys (LFM2's Lfm2Model)
        got = _hf_to_gguf_name("model." + name, arch)
    return got


def _hf_to_gguf_name(name: str, arch: str) -> str | None:
    m = _HF_BID.search(name)
    if m is None:
        return _name_map(arch).get_name(name, try_suffixes=_SUFFIXES)
    one = name[: m.start(1)] + "0" + name[m.end(1):]
    got = _name_map(arch).get_name(one, try_suffixes=_SUFFIXES)
    if got is None or not got.startswith("blk.0."):
        return got
    return f"blk.{m[1]}." + got[len("blk.0."):]


def gguf_to_hf_candidates(name: str, arch: str) -> tuple[str, ...]:
    """Every Hugging Face name gguf-py maps to this GGUF name, in gguf-py's order (a name with no
    `.weight`/`.bias`, as Mamba's `blk.N.ssm_a`, maps to parameters without one: `mixer.A_log`). Names a family
    spells its own way are its record's hook's (`family_hooks`: `gguf_name_candidates`)."""
    block = parse_block(name)
    base = "blk.0." + block[1] if block else name
    bid = str(block[0]) if block else None
    own = _hooks(arch).gguf_name_candidates
    if own is not None:  # a family's own spellings (its record's hook) pick among, or respell, gguf-py's
        return own(base, functools.partial(_candidates, bid=bid, arch=arch))
    return _candidates(base, bid, arch)


def _candidates(base: str, bid: str | None, arch: str) -> tuple[str, ...]:
    """gguf-py's Hugging Face names for `base` (the GGUF name in block 0), moved to block `bid`."""
    if not base.endswith(_SUFFIXES):
        cands = _inverse(arch).get(base, ())
        return tuple(_HF_BID.sub(bid, c, count=1) for c in cands) if bid is not None else cands
    for suffix in _SUFFIXES:
        if base.endswith(suffix):
            cands = _inverse(arch).get(base[: -len(suffix)], ())
            if bid is not None:
                cands = tuple(_HF_BID.sub(bid, c, count=1) for c in cands)
            out = tuple(c if c.endswith(_EXPERT_BIAS) and suffix == ".bias" else c + suffix for c in cands)
            out = tuple(_hf_spelling(c) for c in out)
            # Mamba-2's bare dt_bias is the same GGUF tensor as Mamba's dt_proj.bias: the model's keys choose
            return out + tuple(c[: -len(_DT_BIAS[1])] + _DT_BIAS[0] for c in out if c.endswith(_DT_BIAS[1]))
    return ()


def _hf_spelling(name: str) -> str:
    """gguf-py's module-style name for a bare parameter (`gate.e_score_correction.bias`) as the Hugging Face
    parameter (`gate.e_score_correction_bias`)."""
    for hf, gg in (_SCORE_BIAS, _LAYER_SCALAR):
        if name.endswith(gg):
            return name[: -len(gg)] + hf
    return name


def gguf_to_hf_name(name: str, arch: str, expected: Iterable[str] | None = None,
                    prefer: tuple[str, ...] = ()) -> str | None:
    """The Hugging Face name for a GGUF tensor: the candidate in `expected` (the model's own keys) if given;
    otherwise (no transformers) a candidate holding one of `prefer` (the record's `hf_prefer`, earlier first;
    among equals, the one holding more of them), then the first of transformers' llama-style names
    (`model.layers.N.self_attn...`) in gguf-py's order."""
    cands = gguf_to_hf_candidates(name, arch)
    if not cands:
        return None
    if expected is not None:
        exp = expected if isinstance(expected, (set, frozenset)) else frozenset(expected)
        hits = [c for c in cands if c in exp]
        if not hits:  # a bias the config turned off (attention_bias): the module's weight is expected
            hits = [c for c in cands if c.endswith(".bias") and c[: -len(".bias")] + ".weight" in exp]
        if not hits:  # gguf-py lists some names without the model's outer prefix (BLOOM's `h.N.`)
            hits = sorted({k for c in cands for k in exp if k.endswith("." + c)})
            hits = hits if len(hits) == 1 else []
        if not hits:  # a head-less base model (LFM2's Lfm2Model): its keys are the candidates without `model.`
            hits = [c[len("model."):] for c in cands if c.startswith("model.") and c[len("model."):] in exp]
        if not hits:  # transformers 5 renames a base prefix in memory only (Nemotron-H: saved backbone.*, model.*)
            tails = {k.split(".", 1)[1] for k in exp if "." in k}
            hits = [c for c in cands if "." in c and c.split(".", 1)[1] in tails]
        if hits:
            return hits[0]
        # none declared: transformers 5 renames some parameters inside the model (fused MoE experts) and maps
        # the saved names to them on load, so the saved-name candidates below are what a folder holds
    return min(cands, key=lambda c: (_prefer_rank(c, prefer), -sum(p in c for p in prefer), _llama_style_rank(c),
                                     cands.index(c)))


def _prefer_rank(name: str, prefer: tuple[str, ...]) -> int:
    """The index of the first of `prefer` in `name` (earlier wins), len(prefer) for none."""
    return next((i for i, p in enumerate(prefer) if p in name), len(prefer))


_LLAMA_STYLE = re.compile(r"^(model\.layers\.\d+\.(self_attn|mlp|block_sparse_moe|[a-z_]*layernorm)\.?"
                          r"|model\.(embed_tokens|norm)\.|lm_head\.)")


def _llama_style_rank(name: str) -> int:
    """0 for transformers' llama-style names, 1 for other `model.` names, 2 otherwise (stable in gguf-py's order)."""
    return 0 if _LLAMA_STYLE.match(name) else 1 if name.startswith("model.") else 2


def _variant(model_type: Any, gguf_names: Iterable[str] | None) -> dict[str, str] | None:
    """The record's GGUF -> HF name table for `model_type` (`adapters/hf_names.py`) that fits `gguf_names`: of a
    family's layouts (Falcon's old and new decoder), the one naming the most of them, then the one listing the
    fewest names absent from them."""
    from .hf_names import HF_NAMES

    variants = HF_NAMES.get(model_type) if isinstance(model_type, str) else None
    if not variants:
        return None
    if gguf_names is None or len(variants) == 1:
        return variants[0]
    present = {block_template(n) for n in gguf_names}
    return max(variants, key=lambda v: (len(present & v.keys()), -len(v.keys() - present)))


def record_hf_names(model_type: Any, gguf_names: Iterable[str]) -> dict[str, str] | None:
    """GGUF name -> Hugging Face name, for the `gguf_names` the record of `model_type` lists (its table in
    `adapters/hf_names.py`: the names transformers' model declares, `{bid}` the block); None for a model
    type with no table. Imports nothing.

    Example:
        >>> names = record_hf_names("llama", ["blk.1.attn_q.weight", "token_embd.weight", "blk.0.unknown.weight"])
        >>> names["blk.1.attn_q.weight"], names["token_embd.weight"], len(names)
        ('model.layers.1.self_attn.q_proj.weight', 'model.embed_tokens.weight', 2)
    """
    names = list(gguf_names)
    table = _variant(model_type, names)
    if table is None:
        return None
    out = {}
    for name in names:
        block = parse_block(name)
        hf = table.get(block_template(name))
        if hf is not None:
            out[name] = hf.replace("{bid}", str(block[0])) if block else hf
    return out


def record_hf_keys(model_type: Any, n_layers: int, gguf_names: Iterable[str] | None = None) -> frozenset[str] | None:
    """The Hugging Face keys the record of `model_type` gives the GGUF tensors `gguf_names` (`record_hf_names`), or,
    without them, every key its table lists for `n_layers` blocks; None for a model type with no table."""
    if gguf_names is not None:
        named = record_hf_names(model_type, list(gguf_names) + ["token_types.weight"])
        return None if named is None else frozenset(named.values())
    table = _variant(model_type, None)
    if table is None:
        return None
    return frozenset(hf.replace("{bid}", str(b)) for hf in table.values()
                     for b in (range(max(int(n_layers), 1)) if "{bid}" in hf else (0,)))


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")


def expected_hf_keys(hf_config: Mapping[str, Any], n_layers: int | None = None,
                     gguf_names: Iterable[str] | None = None) -> frozenset[str] | None:
    """The state-dict keys of the Hugging Face model `hf_config` (a config.json dict) describes that the GGUF
    tensors `gguf_names` become, from its model_type's record (`record_hf_keys`; without `gguf_names`, every
    key for `n_layers`, default the config's layer count). None where no record lists the model type.
    Imports nothing (transformers' own answer: `expected_hf_shapes`)."""
    if n_layers is None:
        n_layers = next((int(hf_config[k]) for k in _LAYER_KEYS if isinstance(hf_config.get(k), int)), 1)
    return record_hf_keys(hf_config.get("model_type"), n_layers, gguf_names)


def expected_hf_shapes(hf_config: Mapping[str, Any]) -> dict[str, tuple[int, ...]] | None:
    """name -> shape of every state-dict entry of the Hugging Face model `hf_config` (a config.json dict)
    describes, from transformers' model built on PyTorch's meta device (no memory). None where torch or
    transformers is missing or the installed transformers does not know the model type. The judge of the
    record tables in tests: no conversion calls it (it imports transformers, seconds on a cold start)."""
    try:
        import torch
        import transformers
    except ImportError:  # optional: without them there is no judge, and None says so (as documented)
        return None
    try:
        cfg = transformers.AutoConfig.for_model(**dict(hf_config))
        cls = getattr(transformers, str((hf_config.get("architectures") or [""])[0]), None)
        with torch.device("meta"):
            if cls is None:
                model = transformers.AutoModelForCausalLM.from_config(cfg)
            else:
                model = cls._from_config(cfg)
    except (ValueError, KeyError, TypeError, AttributeError):  # this transformers cannot build the config: None
        return None
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@functools.lru_cache(maxsize=32)
def default_hf_keys(model_type: str, hf_class: str, n_layers: int) -> frozenset[str] | None:
    """The state-dict keys of `model_type`'s Hugging Face model (`hf_class`) with `n_layers` layers, for GGUF
    files whose metadata alone does not make a config: its record's (`record_hf_keys`); None for a model type
    with no table. Imports nothing."""
    return record_hf_keys(model_type, n_layers)


def layer_count(names: Iterable[str]) -> int:
    """Blocks in a GGUF state dict (1 + the highest `blk.N`)."""
    n = 0
    for name in names:
        block = parse_block(name)
        if block:
            n = max(n, block[0] + 1)
    return n
