"""MkDocs hook: tables generated from the code, so the manual cannot drift from it.

A page asks for a table with a marker on a line of its own:

- `<!-- generated: architectures -->`: one row per record of `lazyweights.adapters.archs.ARCHS` (Hugging Face
  `model_type`, the aliases that map to it, its class, its llama.cpp architecture, what the record's fields
  make the conversion do), preceded by the counts.
- `<!-- generated: errors -->`: one row per exception class of `lazyweights.core.errors` (its name, what else
  it is, its docstring).
- `<!-- generated: api -->`: a mkdocstrings block (`::: lazyweights.NAME`) per name `lazyweights` exports.

`tests/docs/test_generated_tables.py` checks that the tables list every record and every class. The
functions are plain Python, usable without MkDocs:

    >>> "| `llama` |" in architecture_table()
    True
    >>> "| `FormatError` |" in errors_table()
    True
"""
from __future__ import annotations

import inspect
import re

_MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.M)


def _features(a) -> list[str]:
    """What a record's fields make its conversion do, in words (one phrase per field that is set)."""
    f: list[str] = []
    if a.rope_permute:
        f.append("q/k RoPE permutation")
    if a.norm_shift:
        f.append(f"norms stored +{a.norm_shift:g}")
    if a.partial_rotary:
        f.append("partial rotary")
    if a.transposed:
        f.append("Conv1D weights transposed")
    if a.qkv_groups:
        f.append("fused qkv regrouped per " + ("head" if a.qkv_groups == "heads" else "kv group"))
    if a.experts or a.flat_experts:
        f.append("per-expert tensors stacked")
    if a.fused_gate_up_exps or a.experts_in_out or a.oai_experts:
        f.append("fused experts split")
    if a.fused_gate_up_shexp:
        f.append("shared expert [gate; up] split")
    if a.mla:
        f.append("MLA (kv_b_proj split into k_b / v_b)")
    if a.mrope:
        f.append("M-RoPE sections")
    if a.sliding or a.window_always or a.window_flag or a.window_hf:
        f.append("sliding window")
    if a.hooks.sliding_to_gguf:  # Gemma 3's and ModernBERT's, a hook on the record
        f.append("RoPE base for sliding layers")
    if a.rope_freqs:
        f.append("Llama 3 RoPE as `rope_freqs.weight`")
    if a.hooks.rope_from_tensors:  # Phi-3's, a hook on its record (adapters/family_hooks.py)
        f.append("LongRoPE factor tensors")
    if a.ssm:
        f.append(f"Mamba-{a.ssm} layers")
    if a.hybrid:
        f.append("attention + state-space layers")
    if a.shortconv:
        f.append("short-convolution layers")
    if a.gdn:
        f.append("gated delta-net layers")
    if a.v_reorder:
        f.append("value heads tiled")
    if a.hooks.weight_scale:  # Falcon-H1's muP, a hook on its record
        f.append("muP multipliers folded into weights")
    if a.layer_scalars:
        f.append("per-layer scalars as metadata")
    if a.position_offset:
        f.append("position rows offset by pad_token_id + 1")
    if a.embedding:
        f.append("encoder (embedding GGUF)")
    if a.dropped:
        f.append("drops " + ", ".join(f"`{d}`" for d in a.dropped))
    if a.requires:
        f.append("requires " + ", ".join(f"`{k}`" for k in a.requires))
    if a.back_as:
        f.append(f"back as `{a.back_as}`")
    return f


def architecture_table() -> str:
    """The records of `lazyweights.adapters.archs.ARCHS` as a Markdown table, with the counts above it."""
    from lazyweights.adapters.archs import ALIASES, ARCHS

    aliases: dict[str, list[str]] = {}
    for outer, inner in ALIASES.items():
        aliases.setdefault(inner, []).append(outer)
    ggufs = {a.gguf for a in ARCHS.values()}
    lines = [f"{len(ARCHS)} records (Hugging Face `model_type`s, plus {len(ALIASES)} aliases for multimodal "
             f"outer configs) become {len(ggufs)} llama.cpp architectures.", "",
             "| model_type | also read for | Hugging Face class | GGUF architecture | what the conversion does |",
             "| --- | --- | --- | --- | --- |"]
    for mt, a in ARCHS.items():
        also = ", ".join(f"`{x}`" for x in aliases.get(mt, []))
        lines.append(f"| `{mt}` | {also} | `{a.hf_class}` | `{a.gguf}` | {'; '.join(_features(a)) or '-'} |")
    return "\n".join(lines)


def error_classes() -> dict:
    """Every exception or warning class defined in `lazyweights/core/errors.py`, in definition order."""
    from lazyweights.core import errors

    return {name: obj for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__}


def errors_table() -> str:
    """The exception classes of `lazyweights.core.errors` as a Markdown table: name, what else it is (its
    lazyweights parent and the builtins a caller may catch it as), and its docstring."""
    from lazyweights.core import errors

    lines = ["| error | also a | raised for |", "| --- | --- | --- |"]
    for name, cls in error_classes().items():
        also = [b.__name__ for b in cls.__mro__[1:]
                if b not in (Exception, BaseException, object, errors.LazyWeightsError)]
        doc = " ".join((inspect.getdoc(cls) or "").split()).replace("|", "\\|")
        lines.append(f"| `{name}` | {', '.join(f'`{b}`' for b in also) or '-'} | {doc} |")
    return "\n".join(lines)


def api_reference() -> str:
    """One mkdocstrings block per name in `lazyweights.__all__`: the API first, then the error classes."""
    import lazyweights

    errors = set(error_classes())
    names = [n for n in lazyweights.__all__ if n not in errors] + [n for n in lazyweights.__all__ if n in errors]
    out = []
    for i, name in enumerate(names):
        if i == 0 or (name in errors) != (names[i - 1] in errors):
            out.append("## Errors\n" if name in errors else "## Functions and classes\n")
        out.append(f"::: lazyweights.{name}\n    options:\n      show_root_heading: true\n"
                   f"      heading_level: 3\n")
    return "\n".join(out)


TABLES = {"architectures": architecture_table, "errors": errors_table, "api": api_reference}


def render(markdown: str) -> str:
    """`markdown` with every generation marker replaced by its table (an unknown marker is a KeyError)."""
    return _MARKER.sub(lambda m: TABLES[m.group(1)](), markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    """MkDocs' hook: render the markers of each page."""
    return render(markdown)
