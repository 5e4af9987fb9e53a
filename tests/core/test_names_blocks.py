"""Layer blocks (lazyweights.core.names: parse_block, parse_layer, GGUF_BLOCK, HF_LAYER) against the names gguf-py
itself spells: every GGUF tensor name template in `gguf.TENSOR_NAMES` and every Hugging Face name in
`gguf.tensor_mapping.TensorNameMap`, filled in with a block number, must parse back to that number and the rest
of the name, and names outside a block must not parse.
"""
from __future__ import annotations

import pytest

from lazyweights.core.names import GGUF_BLOCK, HF_LAYER, block_template, parse_block, parse_layer

gguf = pytest.importorskip("gguf")
from gguf.tensor_mapping import TensorNameMap  # noqa: E402

BIDS = (0, 7, 10, 123)


def test_every_gguf_block_name_parses_to_its_block():
    templates = sorted(set(gguf.TENSOR_NAMES.values()))
    top = [t for t in templates if t.startswith("blk.{bid}.")]
    assert len(top) > 100  # gguf-py's decoder tensors: the test is not vacuous
    for t in top:
        for bid in BIDS:
            name = t.format(bid=bid) + ".weight"
            assert parse_block(name) == (bid, t[len("blk.{bid}."):] + ".weight"), name
            assert block_template(name) == t + ".weight"


def test_names_outside_a_top_level_block_do_not_parse():
    templates = sorted(set(gguf.TENSOR_NAMES.values()))
    nested = [t for t in templates if "{bid}" in t and not t.startswith("blk.{bid}.")]  # enc.blk, v.blk, a.blk, ...
    flat = [t for t in templates if "{bid}" not in t]  # token_embd, output_norm, ...
    assert nested and len(flat) > 10
    for t in nested:
        name = t.format(bid=3) + ".weight"
        assert parse_block(name) is None, name
        assert block_template(name) == name
        if "blk.{bid}." in t:  # llama-quantize's regex_search still finds the block inside (remap_layer)
            m = GGUF_BLOCK.search(name)
            assert m is not None and int(m[1]) == 3, name
    for t in flat:
        assert parse_block(t + ".weight") is None, t
    for bad in ("blk.x.attn_q.weight", "blk.3", "blk..attn_q", "blk.-1.attn_q", "xblk.1.a", "blk.1a.w"):
        assert parse_block(bad) is None, bad


def test_hugging_face_layer_names_parse_like_gguf_py_spells_them():
    hf = {n for names in TensorNameMap.block_mappings_cfg.values() for n in names}
    with_layers = sorted(n for n in hf if n.startswith("layers.{bid}.") or ".layers.{bid}." in n)
    assert len(with_layers) > 100
    for t in with_layers:
        for bid in BIDS:
            name = t.format(bid=bid) + ".weight"
            i = t.index("layers.{bid}.")
            head = t[:i].removesuffix(".")
            assert parse_layer(name) == (head, bid, t[i + len("layers.{bid}."):] + ".weight"), name
    # blocks not called `layers` (GPT-2's `h.N`, BERT's `encoder.layer.N`) and look-alikes are not decoder layers
    others = sorted(n for n in hf if "layers" not in n)
    assert others
    for t in others:
        assert parse_layer(t.format(bid=2) + ".weight") is None, t
    for bad in ("model.sublayers.1.w", "model.layers.x.w", "model.layers.2", "model.norm.weight"):
        assert parse_layer(bad) is None, bad


def test_patterns_are_the_parsers_own():
    """The compiled patterns agree with the parsers (call sites that substitute use the patterns)."""
    assert GGUF_BLOCK.sub("blk.{bid}.", "blk.12.attn_q.weight", count=1) == "blk.{bid}.attn_q.weight"
    m = HF_LAYER.search("backbone.layers.4.mixer.A_log")
    assert m is not None and m[1] == "4"
    assert parse_layer("backbone.layers.4.mixer.A_log") == ("backbone", 4, "mixer.A_log")
