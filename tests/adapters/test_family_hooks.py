"""Family quirks live on the records (`archs.Arch.hooks`, `family_hooks`), not in the engines: the engine modules
hold no family name as a string (walked with `ast`, docstrings aside), and the hooks agree with transformers'
own models (Falcon's and GPT-BigCode's kv heads as their fused qkv weight is shaped; the config.json each
hook writes back loads into the same layout)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lazyweights.adapters.archs import ARCHS
from lazyweights.adapters.family_hooks import FamilyHooks
from lazyweights.convert.to_gguf import gguf_metadata_from_hf
from lazyweights.convert.to_hf import hf_config_from_gguf
from lazyweights.formats.arch_identity import IDENTITIES

PACKAGE = Path(__file__).resolve().parents[2] / "lazyweights"
ENGINES = tuple(f"convert/{m}" for m in ("hparams.py", "tensors.py", "to_gguf.py", "to_hf.py", "rope.py", "result.py",
                                         "transforms.py", "shape_checks.py"))
ENGINES += ("adapters/names.py",)  # gguf-py's name tables both ways: a family's own spellings are its hooks


def _strings_outside_docstrings(tree: ast.AST) -> list[tuple[int, str]]:
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _family_strings(source: str) -> list[tuple[int, str]]:
    """(line, string) for every `model_type` or GGUF architecture of a record held as a string in `source`."""
    names = {r.model_type for r in IDENTITIES.values()} | {r.gguf for r in IDENTITIES.values()}
    names |= {a.model_type for a in ARCHS.values()} | {a.gguf for a in ARCHS.values()}
    names -= {"mamba"}  # also a layer kind (hybrids' layer_types: "attention" / "mamba" / "mlp"), not a family test
    return [(line, s) for line, s in _strings_outside_docstrings(ast.parse(source)) if s in names]


@pytest.mark.parametrize("module", ENGINES)
def test_engines_name_no_family(module):
    """No `model_type` or GGUF architecture of any record appears as a string in an engine module (the converters
    and `adapters/names.py`)."""
    found = _family_strings((PACKAGE / module).read_text())
    assert not found, f"{module} names families {found}: make the quirk a hook on the record (family_hooks)"


def test_family_branch_fails_the_walk():
    """The walk can fail: names.py with its old Gemma 4 branch (`arch == "gemma4"`) back is reported at that
    line; a family named in a docstring or comment is not."""
    source = (PACKAGE / "adapters" / "names.py").read_text()
    assert not _family_strings(source)
    fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "hf_to_gguf_name")
    line = fn.body[1].lineno  # its first statement after the docstring
    lines = source.splitlines()
    lines.insert(line - 1, '    if arch == "gemma4":  # Gemma 4\n        pass')
    assert _family_strings("\n".join(lines)) == [(line, "gemma4")]


def test_name_hooks_reached_from_the_gguf_architecture():
    """names.py finds Gemma 4's name hooks from the GGUF architecture alone, and they give llama.cpp's names for
    its MoE tensors both ways; a record without them keeps gguf-py's (the same GGUF names are no candidates)."""
    from lazyweights.adapters.names import gguf_to_hf_candidates, hf_to_gguf_name

    g4 = ARCHS["gemma4_text"]
    assert g4.gguf == "gemma4" and g4.hooks.hf_name_to_gguf and g4.hooks.gguf_name_candidates
    assert sum(bool(a.hooks.hf_name_to_gguf or a.hooks.gguf_name_candidates) for a in ARCHS.values()) == 1
    pairs = {"model.layers.3.router.scale": "blk.3.ffn_gate_inp.scale",
             "model.layers.3.router.per_expert_scale": "blk.3.ffn_down_exps.scale",
             "model.layers.3.experts.gate_up_proj": "blk.3.ffn_gate_up_exps.weight",
             "model.layers.3.experts.down_proj": "blk.3.ffn_down_exps.weight"}
    for hf, gg in pairs.items():
        assert hf_to_gguf_name(hf, "gemma4") == gg
        assert gguf_to_hf_candidates(gg, "gemma4") == (hf,)
    assert hf_to_gguf_name("model.layers.3.router.scale", "qwen3moe") is None
    assert "model.layers.3.experts.down_proj" not in gguf_to_hf_candidates("blk.3.ffn_down_exps.weight", "qwen3moe")


def test_hooks_are_family_hooks():
    for a in ARCHS.values():
        assert isinstance(a.hooks, FamilyHooks), a.model_type
    assert sum(a.hooks != FamilyHooks() for a in ARCHS.values()) >= 6


def _qkv_rows(model) -> int:
    for name, p in model.state_dict().items():
        if name.endswith("h.0.self_attention.query_key_value.weight"):
            return int(p.shape[0])
        if name.endswith("h.0.attn.c_attn.weight"):
            return int(p.shape[0])
    raise AssertionError("no fused qkv weight")


@pytest.mark.parametrize("model_type,cls,extra", [
    ("falcon", "FalconConfig", {"new_decoder_architecture": False, "multi_query": True}),
    ("falcon", "FalconConfig", {"new_decoder_architecture": False, "multi_query": False}),
    ("falcon", "FalconConfig", {"new_decoder_architecture": True, "num_kv_heads": 2}),
    ("gpt_bigcode", "GPTBigCodeConfig", {"multi_query": True}),
    ("gpt_bigcode", "GPTBigCodeConfig", {"multi_query": False}),
])
def test_kv_heads_hook_matches_transformers(model_type, cls, extra):
    """The kv head count written to the GGUF is the one transformers' fused qkv weight is built for:
    rows = (heads + 2 * kv) * head_dim."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    sizes = ({"hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 1, "vocab_size": 32}
             if model_type == "falcon" else {"n_embd": 64, "n_head": 8, "n_layer": 1, "vocab_size": 32})
    cfg = getattr(transformers, cls)(**sizes, **extra)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    md = gguf_metadata_from_hf(cfg.to_dict())
    a = ARCHS[model_type].gguf
    kv = int(md[f"{a}.attention.head_count_kv"].value)
    assert _qkv_rows(model) == (8 + 2 * kv) * 8


@pytest.mark.parametrize("names,want", [
    ({"blk.0.attn_norm.weight", "blk.0.attn_qkv.bias"}, {"new_decoder_architecture": False, "multi_query": True,
                                                         "bias": True}),
    ({"blk.0.attn_norm.weight", "blk.0.attn_norm_2.weight"}, {"new_decoder_architecture": True,
                                                              "num_ln_in_parallel_attn": 2, "bias": False}),
])
def test_falcon_config_back_from_tensors(names, want):
    """GGUF -> HF: Falcon's decoder kind and bias flag come from the tensor names, through its hooks."""
    md = {"general.architecture": "falcon", "falcon.context_length": 128, "falcon.embedding_length": 64,
          "falcon.block_count": 1, "falcon.feed_forward_length": 256, "falcon.attention.head_count": 8,
          "falcon.attention.head_count_kv": 1,
          "falcon.attention.layer_norm_epsilon": 1e-5,
          "tokenizer.ggml.tokens": [f"t{i}" for i in range(32)]}
    cfg = hf_config_from_gguf(md, tensor_names=names)
    assert {k: cfg[k] for k in want} == want


def test_granite_hybrid_rope_switch_both_ways():
    """Granite 4.0's RoPE switch: position_embedding_type "rope" <-> rope.scaling.finetuned, through its hooks;
    Bamba (always RoPE, a fixed key) has no such hook."""
    rec = ARCHS["granitemoehybrid"]
    assert rec.hooks.hybrid_to_gguf and rec.hooks.hybrid_to_hf and not ARCHS["bamba"].hooks.hybrid_to_gguf
    for pet, finetuned in (("rope", True), ("nope", False)):
        md = rec.hooks.hybrid_to_gguf({"position_embedding_type": pet}, rec.gguf)
        value = md[f"{rec.gguf}.rope.scaling.finetuned"].value
        assert value is finetuned
        back = rec.hooks.hybrid_to_hf({"{arch}.rope.scaling.finetuned": value}.get)
        assert back == {"position_embedding_type": "rope" if finetuned else None}


def _lonely_flags(cls, records) -> dict[str, list[str]]:
    """The boolean fields of the NamedTuple `cls` (bool or bool | None) that fewer than two of `records` set away
    from the field's default, each with the model_types that do."""
    from typing import get_type_hints

    hints = get_type_hints(cls)
    lonely = {}
    for f in cls._fields:
        if hints[f] not in (bool, bool | None):
            continue
        default = cls._field_defaults.get(f)
        users = sorted(r.model_type for r in records if getattr(r, f) != default)
        if len(users) < 2:
            lonely[f] = users
    return lonely


def test_no_boolean_field_of_arch_is_one_familys_switch():
    """Every boolean field of `Arch` is set by at least two records: a switch one family alone turns on is a
    branch on that family inside the engines, which issue 38 makes a hook on its record instead."""
    from lazyweights.adapters.archs import Arch

    lonely = _lonely_flags(Arch, ARCHS.values())
    assert not lonely, (f"boolean fields of Arch set by one record alone: {lonely}; write a hook on FamilyHooks "
                        "(adapters/family_hooks.py) that the engines call by role, and remove the field")


def test_one_record_flag_fails_the_check():
    """The check above can fail: a record type with a boolean only one record sets (the way `Arch.gemma4` was)
    is reported with that record; one two records set, or a non-boolean field, is not."""
    from typing import NamedTuple

    class _Rec(NamedTuple):
        model_type: str
        shared: bool = False
        lonely: bool = False
        maybe: bool | None = None
        data: str = ""

    recs = [_Rec("a", shared=True, lonely=True, maybe=False, data="x"), _Rec("b", shared=True), _Rec("c")]
    assert _lonely_flags(_Rec, recs) == {"lonely": ["a"], "maybe": ["a"]}


def test_moved_hooks_agree_with_their_families():
    """The hooks issue 38 made from one-family flags: Phi-3 writes key_length late and only for an odd head dim,
    gpt-oss reads YaRN back with truncate False, Gemma 3 and ModernBERT read the sliding layers' RoPE base back per
    layer type, Gemma 4 makes and reads back its rope_freqs tensor; records without them have none."""
    oss = ARCHS["gpt_oss"]
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 96,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 1e4, "vocab_size": 32}
    keys = list(gguf_metadata_from_hf({**base, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}))
    assert "phi3.attention.key_length" not in keys
    keys = list(gguf_metadata_from_hf({**base, "head_dim": 8, "model_type": "phi3",
                                       "architectures": ["Phi3ForCausalLM"]}))
    assert keys.index("phi3.attention.key_length") > keys.index("phi3.rope.freq_base")
    assert oss.hooks.rope_scaling_to_hf({"rope_type": "yarn"}) == {"truncate": False}
    for mt in ("gemma3_text", "modernbert"):
        assert ARCHS[mt].hooks.sliding_to_gguf and ARCHS[mt].hooks.sliding_to_hf
    g4 = ARCHS["gemma4_text"].hooks
    cfg = {"head_dim": 8, "global_head_dim": 16, "layer_types": ["sliding_attention", "full_attention"],
           "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25}}}
    freqs = g4.gguf_tensors(cfg)["rope_freqs.weight"].data
    back = {"rope_parameters": {"full_attention": {}}, "per_layer_config": {"1": {"head_dim": 16}}}
    g4.rope_freqs_to_hf(back, freqs)
    assert back["rope_parameters"]["full_attention"]["partial_rotary_factor"] == 0.25
    assert not any((ARCHS["llama"].hooks.late_head_dim, ARCHS["llama"].hooks.sliding_to_gguf,
                    ARCHS["llama"].hooks.layers_to_gguf, ARCHS["llama"].hooks.rope_scaling_to_hf))
