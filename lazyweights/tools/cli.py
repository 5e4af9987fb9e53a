"""The `lazyweights` command line (also `python -m lazyweights`).

    lazyweights inspect PATH... [--json] [--filter GLOB]
    lazyweights plan ADAPTER PATH... [--filter GLOB] [--visualize FILE] [--no-group]
    lazyweights convert ADAPTER PATH... -o OUT [--format safetensors|gguf] [--budget 1GB]
                        [--max-shard-size 5GB] [--scheduler sync|threads] [--no-progress]
                        [--quant PRESET [--imatrix FILE] [--tensor-type PATTERN=TYPE ...]
                         [--output-tensor-type TYPE] [--token-embedding-type TYPE] [--pure]
                         [--prune-layers L0,L1,...] [--override-kv KEY=TYPE:VALUE ...] [--dry-run]]
                        [--lora DIR [--lora DIR ...]]
    lazyweights quantize [the same llama-quantize flags] IN.gguf OUT.gguf PRESET
    lazyweights diff A B [--values] [--rtol R] [--atol A] [--filter GLOB]
    lazyweights check ADAPTER PATH... --module MOD:CLASS_OR_FACTORY
    lazyweights verify PATH [--write] [--manifest FILE] [--json] [--scheduler sync|threads] [--budget 1GB]
    lazyweights archs [--json]

Every PATH may be an http(s)://, s3:// or gs:// URL. Each subcommand's `--help` shows its defaults and examples.

ADAPTER is `package.module:function`, `path/to/file.py:function`, a module or file holding a MAX-style
`convert_safetensor_state_dict` / `convert_gguf_state_dict`, or a registered architecture name; it is called
as `fn(dict(weights.items()), huggingface_config=..., weights_format=...)` (see `lazyweights/adapters/loader.py`).

Exit status: 0 success (for `diff`: no differences; for `check`: no problems), 1 failure or differences,
2 bad usage. Errors are one line on stderr (`lazyweights: error: ...`); `--debug` shows the traceback.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import sys
from typing import Mapping, Sequence

from ..core import units
from ..core.errors import DependencyError, LazyWeightsError, ShapeError, UsageError
from ..core.units import format_bytes

PROG = "lazyweights"


# --- argument types ----------------------------------------------------------------------------------------
def parse_size(text) -> int:
    """The library's size parser (`core.units.parse_size`) as an argparse type: ValueError on bad input."""
    try:
        value = units.parse_size(text)
    except LazyWeightsError as e:
        raise ValueError(str(e)) from None
    if value is None:
        raise ValueError(f"invalid size {text!r}")
    return value


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _tolerance(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v >= 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


# --- helpers -----------------------------------------------------------------------------------------------
def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _table(rows: list[list[str]], right: Sequence[int] = ()) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return lines


def _elements(rec) -> int:
    """Values a stored tensor holds (quantized: the values its blocks decode to)."""
    n = 1
    for d in rec.shape:
        n *= d
    enc = getattr(rec, "encoding", None)
    if enc is not None and rec.shape:
        try:
            return n // rec.shape[-1] * enc.elements_per_row_bytes(rec.shape[-1])
        except ShapeError:  # rows that are not whole blocks: a listing shows the stored count; the reader names it
            return n
    return n


def _filter_names(names, pattern):
    return [n for n in names if pattern is None or fnmatch.fnmatchcase(n, pattern)]


def _json_scalar_metadata(meta) -> dict:
    out = {}
    for k, v in (meta or {}).items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[str(k)] = v
    return out


# --- inspect -----------------------------------------------------------------------------------------------
def cmd_inspect(args) -> int:
    """`lazyweights inspect PATH...`: tensors and totals per dtype (reads headers only); returns the exit status."""
    from ..formats.open import open_checkpoint

    ck = open_checkpoint(args.paths, allow_pickle=args.allow_pickle, storage_options=args.storage_options,
                         cache=args.cache)
    names = _filter_names(list(ck.records), args.filter)
    if args.filter and not names:
        raise UsageError(f"--filter {args.filter!r} matches none of the {len(ck.records)} tensors")
    totals: dict[str, list[int]] = {}
    tensors = []
    for name in names:
        r = ck.records[name]
        enc = getattr(r, "encoding", None)
        key = enc.name if enc is not None else r.dtype.name
        tot = totals.setdefault(key, [0, 0, 0])
        tot[0] += 1
        tot[1] += r.nbytes
        tot[2] += _elements(r)
        tensors.append({
            "name": name, "dtype": r.dtype.name, "shape": list(r.shape),
            "quantization": enc.name if enc is not None else None, "nbytes": r.nbytes,
            "elements": _elements(r), "file": os.path.basename(r.file.path), "offset": r.offset,
        })
    all_bytes = sum(t[1] for t in totals.values())
    all_elems = sum(t[2] for t in totals.values())
    if args.json:
        doc = {
            "format": ck.format.value,
            "files": [os.path.abspath(f) for f in ck.files],
            "metadata": _json_scalar_metadata(ck.metadata),
            "tensors": tensors,
            "totals": {
                "by_dtype": {k: {"tensors": v[0], "nbytes": v[1], "elements": v[2]} for k, v in sorted(totals.items())},
                "tensors": len(tensors), "nbytes": all_bytes, "elements": all_elems,
            },
        }
        _out(json.dumps(doc, indent=2))
        return 0
    files = ", ".join(os.path.basename(f) for f in ck.files[:3])
    files += f", ... ({len(ck.files)} files)" if len(ck.files) > 3 else ""
    _out(f"{ck.format.value} checkpoint: {files}: {len(ck.records)} tensors"
         + (f", {len(names)} matching {args.filter!r}" if args.filter else ""))
    rows = [["name", "dtype", "shape", "quant", "size"]]
    for t in tensors:
        rows.append([t["name"], t["dtype"], _shape(t["shape"]), t["quantization"] or "-", format_bytes(t["nbytes"])])
    for line in _table(rows, right=(4,)):
        _out("  " + line)
    _out("")
    _out("totals:")
    trows = [["dtype", "tensors", "size", "bytes", "elements"]]
    for k, v in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        trows.append([k, str(v[0]), format_bytes(v[1]), f"{v[1]:,}", f"{v[2]:,}"])
    trows.append(["all", str(len(tensors)), format_bytes(all_bytes), f"{all_bytes:,}", f"{all_elems:,}"])
    for line in _table(trows, right=(1, 2, 3, 4)):
        _out("  " + line)
    return 0


def _json_object(text: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got a {type(doc).__name__}")
    return doc


# --- plan / convert / check share: open, adapt, plan ------------------------------------------------------------
def _adapted_plan(args):
    from ..adapters.loader import run_adapter
    from ..lazy.plan import Plan

    extra = {}
    if getattr(args, "no_tokenizer", False):
        extra["tokenizer"] = False
    if getattr(args, "allow_pickle", None):
        extra["allow_pickle"] = args.allow_pickle
    if getattr(args, "lora", None):
        extra["lora"] = args.lora
    if getattr(args, "storage_options", None) or getattr(args, "cache", None):
        extra["storage_options"], extra["cache"] = args.storage_options, args.cache
    adapted, weights = run_adapter(args.adapter, args.paths, hf_config=getattr(args, "hf_config", None), **extra)
    p = Plan(adapted)  # keeps what a converter's result carries: GGUF metadata, config/tokenizer files
    pattern = getattr(args, "filter", None)
    if pattern:
        p = p.filter(pattern)
    return p, weights


def cmd_plan(args) -> int:
    """`lazyweights plan ADAPTER PATH...`: print the adapter's plan (and draw it with --visualize); with
    `--diff ADAPTER2 PATH2...`, print how the second plan differs from the first (and draw both, marked)."""
    p, _ = _adapted_plan(args)
    if args.diff is not None:
        return _plan_diff(args, p)
    _out(p.explain(group_layers=not args.no_group).rstrip("\n"))
    if args.visualize:
        path = p.visualize(args.visualize, group_layers=not args.no_group)
        _err(f"{PROG}: wrote {path}")
    return 0


def _diff_labels(a: tuple[str, Sequence[str]], b: tuple[str, Sequence[str]]) -> tuple[str, str]:
    """Short names for the two plans of `plan --diff`: what tells them apart (the checkpoint, the adapter, or both)."""
    def where(paths):
        names = [os.path.basename(str(x).rstrip("/")) or str(x) for x in paths]
        return ", ".join(names[:2]) + (f" (+{len(names) - 2})" if len(names) > 2 else "")

    def who(spec):
        return spec.rsplit(":", 1)[-1] if ":" in spec else os.path.basename(spec.rstrip("/")) or spec

    if a[0] == b[0]:
        la, lb = where(a[1]), where(b[1])
    elif list(a[1]) == list(b[1]):
        la, lb = who(a[0]), who(b[0])
    else:
        la, lb = f"{who(a[0])} on {where(a[1])}", f"{who(b[0])} on {where(b[1])}"
    return (la, lb) if la != lb else (f"{la} (a)", f"{lb} (b)")


def _plan_diff(args, p) -> int:
    """`plan ... --diff ADAPTER2 PATH2...`: the second plan built like the first (same --filter; its own
    --diff-hf-config; no --lora), `Plan.diff` printed, and drawn side by side with --visualize FILE.html."""
    if len(args.diff) < 2:
        raise UsageError(f"--diff needs a second adapter and its checkpoint (--diff ADAPTER2 PATH2 ...), got "
                         f"{' '.join(args.diff) or 'nothing'}")
    if args.visualize and os.path.splitext(args.visualize)[1].lower() not in (".html", ".htm"):
        raise UsageError(f"--diff draws the two plans side by side as .html; --visualize {args.visualize} is not")
    second = argparse.Namespace(**vars(args))
    second.adapter, second.paths = args.diff[0], args.diff[1:]
    second.hf_config, second.lora = args.diff_hf_config, None
    other, _ = _adapted_plan(second)
    la, lb = _diff_labels((args.adapter, args.paths), (second.adapter, second.paths))
    if args.lora:  # (only the first plan merges them)
        if la.endswith(" (a)") and lb.endswith(" (b)"):
            la, lb = la[:-4], lb[:-4]
        la += " + LoRA " + ", ".join(os.path.basename(str(x).rstrip("/")) for x in args.lora)
    d = p.diff(other, labels=(la, lb))
    _out(str(d))
    if args.visualize:
        path = d.visualize(args.visualize, group_layers=not args.no_group)
        _err(f"{PROG}: wrote {path}")
    return 0


# --- llama-quantize's controls (convert --quant, quantize) ------------------------------------------------------
def _tensor_type_arg(text: str) -> tuple[str, str]:
    """llama-quantize's parse_tensor_type: NAME=TYPE, the name lowercased (the type is checked later, by name)."""
    name, sep, ggml_type = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"malformed tensor type {text!r}: expected PATTERN=TYPE")
    if not name:
        raise argparse.ArgumentTypeError(f"missing tensor name in {text!r}")
    if not ggml_type:
        raise argparse.ArgumentTypeError(f"missing quantization type in {text!r}")
    return name.lower(), ggml_type


def _quant_options(args) -> dict:
    """`Plan.quantize`'s keyword arguments from the llama-quantize flags (only those given)."""
    tensor_types = list(args.tensor_type or [])
    for path in args.tensor_type_file or []:
        with open(path, encoding="utf-8") as fh:  # entries separated by spaces or newlines, as llama-quantize reads
            for word in fh.read().split():
                try:
                    tensor_types.append(_tensor_type_arg(word))
                except argparse.ArgumentTypeError as e:
                    raise UsageError(f"--tensor-type-file {path}: {e}") from None
    options = {"tensor_types": tensor_types, "output_tensor_type": args.output_tensor_type,
               "token_embedding_type": args.token_embedding_type, "pure": args.pure,
               "prune_layers": args.prune_layers, "kv_overrides": list(args.override_kv or [])}
    return {k: v for k, v in options.items() if v}


def _quant_flags(p, with_preset: bool = True) -> None:
    if with_preset:
        p.add_argument("--quant", metavar="PRESET", type=str.upper, default=None,
                       help="GGUF output: quantize as llama-quantize does, in the same pass "
                            "(Q8_0 Q6_K Q5_K_M Q5_K_S Q4_K_M Q4_K_S Q3_K_M Q2_K Q4_0; default: none, the "
                            "adapter's types are kept)")
    p.add_argument("--imatrix", metavar="FILE", default=None,
                   help="a llama.cpp importance matrix (.dat or GGUF, from llama-imatrix)")
    p.add_argument("--tensor-type", metavar="PATTERN=TYPE", action="append", type=_tensor_type_arg, default=None,
                   help="quantize tensors whose GGUF name matches this regular expression to TYPE (a ggml type: "
                        "q8_0, q6_k, bf16, ...); repeatable, the first match wins, as llama-quantize's")
    p.add_argument("--tensor-type-file", metavar="FILE", action="append", default=None,
                   help="PATTERN=TYPE entries separated by spaces or newlines")
    p.add_argument("--output-tensor-type", metavar="TYPE", default=None, help="the type of output.weight")
    p.add_argument("--token-embedding-type", metavar="TYPE", default=None, help="the type of token_embd.weight")
    p.add_argument("--pure", action="store_true",
                   help="no k-quant mixture: every quantized tensor gets the preset's type")
    p.add_argument("--prune-layers", metavar="L0,L1,...", default=None,
                   help="drop these blocks; the rest are renumbered and {arch}.block_count fixed")
    p.add_argument("--override-kv", metavar="KEY=TYPE:VALUE", action="append", default=None,
                   help="set a metadata key in the output (TYPE: int, float, bool, str); repeatable")
    p.add_argument("--dry-run", action="store_true",
                   help="print each tensor's type, bytes and bits per weight and the file's size; read and "
                        "write nothing")


def _print_dry_run(tensors, metadata, preset, options, imatrix) -> int:
    from ..formats.gguf_quantize import dry_run_report, quantize_outputs

    outputs = {n: w.node if hasattr(w, "node") else w for n, w in tensors.items()}
    result = _with_warnings(lambda: quantize_outputs(outputs, metadata, preset, imatrix=imatrix, **options))
    _out(dry_run_report(result.outputs, result.metadata, result.types))
    return 0


def _with_warnings(fn):
    """Run fn, printing the warnings it gives (a --tensor-type pattern that matches nothing) as one line each."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn()
        finally:
            for w in caught:
                _err(f"{PROG}: warning: {w.message}")


# --- checks that run before any work (each has a test in tests/tools/test_cli_manners.py showing that no tensor
# was read and no output written when it fails) -------------------------------------------------------------------
def _check_output(output, format, quant=None, dry_run: bool = False) -> str:
    """What OUT will be ("gguf", "safetensors" file or "folder"), checked before anything is read: a GGUF for
    --quant, a local path, and a place that can be written (its nearest existing folder writable, no file where
    a folder must go). The folders it needs are created later, just before the save (`_make_parent`)."""
    from ..io.remote import is_url

    out = os.fspath(output)
    if is_url(out):
        raise UsageError(f"-o {out}: outputs are written to local paths, not URLs")
    fmt = (format or "").lower()
    for suffix, other in ((".gguf", "safetensors"), (".safetensors", "gguf")):
        if fmt == other and out.endswith(suffix):
            raise UsageError(f"-o {out} with --format {fmt}: the name says {suffix[1:]}; give an output ending in "
                             f"{'.gguf' if fmt == 'gguf' else '.safetensors (or a folder)'}, or drop --format")
    kind = "gguf" if fmt == "gguf" or (not fmt and out.endswith(".gguf")) else (
        "safetensors" if out.endswith(".safetensors") else "folder")
    if quant is not None and kind != "gguf":
        raise UsageError(f"--quant {quant} writes GGUF: give an output ending in .gguf or --format gguf "
                         f"(the output is {out})")
    if dry_run:
        return kind
    final = os.path.abspath(out)
    if kind != "folder" and os.path.isdir(final):
        raise UsageError(f"-o {out}: a folder is there; a {kind} output is one file: give a file name "
                         f"(e.g. {os.path.join(out, 'model.' + kind)})")
    if kind == "folder" and os.path.exists(final) and not os.path.isdir(final):
        raise UsageError(f"-o {out}: a file is there; a sharded or Hugging Face output is a folder")
    existing = os.path.dirname(final)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"-o {out}: {existing} is a file, so no folder can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"-o {out}: cannot write in {existing} (permission denied); choose another output")
    return kind


def _make_parent(output) -> None:
    """Create OUT's folder (and the folders above it) now that the checks passed: the save itself stays atomic
    (a hidden temporary beside OUT, renamed into place when complete)."""
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(output))), exist_ok=True)


def _check_quant(preset: str, options: dict, imatrix) -> None:
    """The preset, the --tensor-type / --output-tensor-type / --token-embedding-type names and the --imatrix
    file, checked before the checkpoint is opened (UnknownPresetError leads with the did-you-mean)."""
    from ..core.errors import UnknownPresetError, did_you_mean
    from ..io.remote import is_url
    from ..quant.presets import PRESETS, parse_type, tensor_type_overrides

    if preset not in PRESETS:
        hint = did_you_mean(preset, list(PRESETS)).strip()
        raise UnknownPresetError(f"{hint + ' ' if hint else ''}--quant {preset}: unknown preset; the presets are "
                                 f"{', '.join(PRESETS)}")
    tensor_type_overrides(options.get("tensor_types"))
    for flag, key in (("--output-tensor-type", "output_tensor_type"),
                      ("--token-embedding-type", "token_embedding_type")):
        if options.get(key):
            parse_type(options[key], flag)
    if imatrix is not None and not is_url(os.fspath(imatrix)) and not os.path.isfile(imatrix):
        raise UsageError(f"--imatrix {imatrix}: no such file")


def _build_files_first(p) -> None:
    """A Hugging Face folder's config.json and tokenizer files (GGUF -> HF), built from the GGUF's metadata
    before any tensor is converted, so a GGUF without a tokenizer or with missing config keys fails at once,
    not after the whole conversion; the save then writes these same bytes."""
    build = p.extra_files
    if callable(build):
        built = dict(build())
        p.extra_files = built


def cmd_quantize(args) -> int:
    """`lazyweights quantize IN.gguf OUT.gguf PRESET`: requantize a bf16/f16/f32 GGUF as llama-quantize does, in one
    streaming pass.
    """
    from ..lazy.plan import Plan
    from ..lazy.weights import load_weights

    if not str(args.input).endswith(".gguf"):
        raise UsageError(f"{args.input}: quantize reads a GGUF (.gguf); for a Hugging Face folder use "
                         "`lazyweights convert ... -o OUT.gguf --quant PRESET`")
    if not args.dry_run:
        _check_output(args.output, "gguf", args.preset)
    _check_quant(args.preset, _quant_options(args), args.imatrix)
    weights = load_weights([args.input], storage_options=args.storage_options, cache=args.cache)
    tensors = {name: w.data() for name, w in weights.items()}
    packed = [(n, t.quantization_encoding.name) for n, t in tensors.items() if t.quantization_encoding is not None]
    if packed:
        raise UsageError(f"{args.input}: tensor {packed[0][0]!r} is already quantized ({packed[0][1]}; "
                         f"{len(packed)} such tensors): quantize reads bf16/f16/f32 GGUFs and does not requantize")
    options = _quant_options(args)
    if args.dry_run:
        return _print_dry_run(tensors, weights.metadata, args.preset, options, args.imatrix)
    _make_parent(args.output)
    files = _with_warnings(lambda: Plan(tensors).save(
        args.output, format="gguf", metadata=weights.metadata, quant=args.preset, imatrix=args.imatrix,
        quant_options=options, budget=args.budget, progress=not args.no_progress, workers=args.workers))
    total = sum(os.path.getsize(f) for f in files if os.path.exists(f))
    _out(f"wrote {args.output}: {format_bytes(total)}")
    return 0


def cmd_convert(args) -> int:
    """`lazyweights convert ADAPTER PATH... -o OUT`: run an adapter's plan and save it (quantizing with --quant)."""
    quant: dict = {}
    options = _quant_options(args)
    if args.quant is not None:
        quant = {"quant": args.quant, "imatrix": args.imatrix, "quant_options": options}
    elif args.imatrix is not None:
        raise UsageError("--imatrix is used with --quant PRESET")
    elif options or args.dry_run:
        flags = [f for f, given in (("--tensor-type", args.tensor_type or args.tensor_type_file),
                                    ("--output-tensor-type", args.output_tensor_type),
                                    ("--token-embedding-type", args.token_embedding_type), ("--pure", args.pure),
                                    ("--prune-layers", args.prune_layers), ("--override-kv", args.override_kv),
                                    ("--dry-run", args.dry_run)) if given]
        raise UsageError(f"{', '.join(flags)}: used with --quant PRESET")
    fmt = _check_output(args.output, args.format, args.quant, dry_run=args.dry_run)
    if args.quant is not None:
        _check_quant(args.quant, options, args.imatrix)
    mmproj = getattr(args, "mmproj", None)
    if mmproj is not None and fmt == "folder" and all(str(x).endswith(".gguf") for x in args.paths):
        return _mmproj_to_hf(args, mmproj)
    if mmproj is not None:
        _check_mmproj_output(mmproj, fmt, args)
    p, weights = _adapted_plan(args)
    vision = _mmproj_of(args, weights) if mmproj is not None else None  # validated before anything is written
    if fmt == "folder" and not args.dry_run:
        _build_files_first(p)
    if args.dry_run:
        return _print_dry_run(p.tensors, p.metadata or {}, args.quant, options, args.imatrix)
    _make_parent(args.output)
    files = _with_warnings(lambda: p.save(
        args.output, format=args.format, max_shard_size=args.max_shard_size, budget=args.budget,
        scheduler=args.scheduler, progress=not args.no_progress, workers=args.workers, **quant))
    files = list(files or [])
    if vision is not None:
        from ..convert.mmproj import save_mmproj

        files += _with_warnings(lambda: save_mmproj(vision, mmproj, budget=args.budget, scheduler=args.scheduler,
                                                    progress=not args.no_progress, workers=args.workers))
    total = sum(os.path.getsize(f) for f in files if os.path.exists(f))
    n_tensors = len(p.outputs) + len(vision or ())
    _out(f"wrote {n_tensors} tensors, {format_bytes(total)} in {len(files)} file{'s' if len(files) != 1 else ''}:")
    for f in files:
        _out(f"  {f}")
    return 0


def _check_mmproj_output(mmproj: str, fmt: str, args) -> None:
    """--mmproj: llama.cpp's second file, beside a GGUF text model, unquantized (checked before any work)."""
    if fmt != "gguf" or args.quant is not None or args.dry_run or not str(mmproj).endswith(".gguf"):
        raise UsageError(f"--mmproj {mmproj}: the vision tower is written as a .gguf beside a GGUF text model "
                         "(-o X.gguf), without --quant or --dry-run")


def _mmproj_to_hf(args, mmproj: str) -> int:
    """--mmproj with a text GGUF in and a folder out: both as one `...ForConditionalGeneration` Hugging Face folder
    (`convert.mmproj_to_hf`; the pair checked before anything is written)."""
    from ..convert.mmproj_to_hf import export_hf_folder_with_mmproj

    if len(args.paths) != 1 or args.quant is not None or args.dry_run:
        raise UsageError(f"--mmproj {mmproj}: one text GGUF and its mmproj convert back into one Hugging Face "
                         f"folder (got {len(args.paths)} inputs), without --quant or --dry-run")
    _make_parent(args.output)
    files = _with_warnings(lambda: export_hf_folder_with_mmproj(
        args.paths[0], mmproj, args.output, tokenizer=not args.no_tokenizer, budget=args.budget,
        scheduler=args.scheduler, progress=not args.no_progress, workers=args.workers))
    _out(f"wrote {len(files)} file{'s' if len(files) != 1 else ''}:")
    for f in files:
        _out(f"  {f}")
    return 0


def _mmproj_of(args, weights):
    """--mmproj: the vision tower and projector of the same lazily opened checkpoint (`convert.mmproj`)."""
    from ..convert.mmproj import convert_hf_to_mmproj
    from ..formats.json_files import read_json

    cfg = None
    if getattr(args, "hf_config", None):
        cfg = read_json(args.hf_config)  # JSONFileError names a broken file
        if cfg is None:
            raise UsageError(f"--hf-config {args.hf_config}: no such file")
    return convert_hf_to_mmproj(dict(weights.items()), cfg)


def _instantiate_module(obj, hf_config):
    """A module from 'MOD:CLASS_OR_FACTORY': classes and factories are called (with huggingface_config
    when they take it); anything else (a Module, a dict of Weights, a torch module) is used as is."""
    import inspect

    if isinstance(obj, type) or inspect.isfunction(obj) or inspect.ismethod(obj):
        params: Mapping[str, inspect.Parameter]
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):  # no signature to read (some builtins, C classes): call it bare, below
            params = {}
        if "huggingface_config" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return obj(huggingface_config=hf_config)
        if "config" in params and hf_config is not None:
            return obj(config=hf_config)
        return obj()
    return obj


def cmd_check(args) -> int:
    """`lazyweights check ADAPTER PATH... --module MOD:CLASS`: the bring-up report; exit status 1 on problems."""
    from ..adapters.loader import load_config, load_object

    try:
        from ..interop.check import check
    except ImportError:
        raise DependencyError("this build of lazyweights has no lazyweights.interop.check") from None
    p, weights = _adapted_plan(args)
    module_obj = load_object(args.module, what="module")
    module = _instantiate_module(module_obj, load_config(weights, args.paths, args.hf_config))
    adapted = dict(p.tensors)
    if args.keys and not args.json:
        for name in sorted(adapted):
            _out(name)
    report = check(adapted, module, checkpoint=weights)
    if args.json and hasattr(report, "to_dict"):
        _out(json.dumps(report.to_dict(), indent=2))
    elif hasattr(report, "table"):
        _out(report.table(fold=not args.no_fold).rstrip("\n"))
    else:
        _out(str(report).rstrip("\n"))
    ok = getattr(report, "ok", True)
    return 0 if ok else 1


# --- diff ------------------------------------------------------------------------------------------------------
def _desc(rec) -> str:
    enc = getattr(rec, "encoding", None)
    return f"{rec.dtype.short}{_shape(rec.shape)}" + (f" {enc.name}" if enc is not None else "")


def _values(weights, name):
    """The tensor as a flat numpy array of values (quantized blocks decoded), lazily where possible."""
    wd = weights[name].data()
    if wd.quantization_encoding is not None:
        wd = wd.dequantize()
    return wd


def _compare(a, b, rtol: float, atol: float, chunk: int = 1 << 21) -> dict:
    """Compare two same-shape arrays in chunks as float64: mismatches, max abs and max rel error."""
    import numpy as np

    fa, fb = a.reshape(-1), b.reshape(-1)
    n = fa.size
    mism = 0
    max_abs = 0.0
    max_rel = 0.0
    same_bits = a.dtype == b.dtype
    for i in range(0, n, chunk):
        xa, xb = fa[i:i + chunk], fb[i:i + chunk]
        if same_bits and np.array_equal(xa.view(np.uint8), xb.view(np.uint8)):
            continue
        if a.dtype.kind in "iub" and b.dtype.kind in "iub":
            da = xa.astype(np.int64 if a.dtype.kind != "u" else np.uint64)
            db = xb.astype(np.int64 if b.dtype.kind != "u" else np.uint64)
            da, db = da.astype(np.float64), db.astype(np.float64)
        else:
            da, db = xa.astype(np.float64), xb.astype(np.float64)
        both_nan = np.isnan(da) & np.isnan(db)
        equal = (da == db) | both_nan
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(equal, 0.0, np.abs(da - db))
        diff = np.where(np.isnan(diff), np.inf, diff)
        close = diff <= atol + rtol * np.abs(db)
        mism += int(np.count_nonzero(~close))
        if diff.size:
            max_abs = max(max_abs, float(diff.max()))
            nz = np.abs(db) > 0
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(nz, diff / np.where(nz, np.abs(db), 1.0), np.where(diff > 0, np.inf, 0.0))
            max_rel = max(max_rel, float(rel.max()))
    return {"elements": n, "mismatched": mism, "max_abs": max_abs, "max_rel": max_rel}


def cmd_diff(args) -> int:
    """`lazyweights diff A B`: tensors added, removed and changed between two checkpoints; 1 when they differ."""
    from ..lazy.weights import load_weights

    opts = {"allow_pickle": args.allow_pickle, "storage_options": args.storage_options, "cache": args.cache}
    wa, wb = load_weights([args.a], **opts), load_weights([args.b], **opts)
    ra, rb = wa.records, wb.records
    na, nb = _filter_names(list(ra), args.filter), _filter_names(list(rb), args.filter)
    sa, sb = set(na), set(nb)
    removed = [n for n in na if n not in sb]
    added = [n for n in nb if n not in sa]
    common = [n for n in na if n in sb]
    changed = [n for n in common if (ra[n].dtype, ra[n].shape, getattr(ra[n], "encoding", None))
               != (rb[n].dtype, rb[n].shape, getattr(rb[n], "encoding", None))]
    _out(f"--- {args.a} ({len(na)} tensors)")
    _out(f"+++ {args.b} ({len(nb)} tensors)")
    for n in removed:
        _out(f"- {n}  {_desc(ra[n])}")
    for n in added:
        _out(f"+ {n}  {_desc(rb[n])}")
    for n in changed:
        _out(f"~ {n}  {_desc(ra[n])} -> {_desc(rb[n])}")
    differing = 0
    compared = 0
    skipped = []
    if args.values:
        for n in common:
            va, vb = _values(wa, n), _values(wb, n)
            if va.shape != vb.shape:
                skipped.append(n)
                continue
            compared += 1
            res = _compare(va.to_numpy(), vb.to_numpy(), args.rtol, args.atol)
            if res["mismatched"]:
                differing += 1
                _out(f"~ {n}  values: max abs err {res['max_abs']:.3g}, max rel err {res['max_rel']:.3g}, "
                     f"{res['mismatched']:,} of {res['elements']:,} elements beyond rtol={args.rtol:g} "
                     f"atol={args.atol:g}")
            elif n in changed:
                _out(f"= {n}  values equal within rtol={args.rtol:g} atol={args.atol:g} "
                     f"(max abs err {res['max_abs']:.3g}, max rel err {res['max_rel']:.3g})")
        for n in skipped:
            _out(f"? {n}  values not compared: shapes differ")
    parts = [f"{len(added)} added", f"{len(removed)} removed", f"{len(changed)} changed dtype/shape"]
    if args.values:
        same = compared - differing
        parts += [f"{differing} differ in values", f"{same} equal in values"]
    else:
        parts.append(f"{len(common) - len(changed)} same dtype and shape (values not compared; add --values)")
    _out("summary: " + ", ".join(parts))
    different = bool(added or removed or changed or differing)
    if args.values and changed and not differing and not (added or removed) and not skipped:
        # dtype changed but every value is equal within tolerance: still a difference in the files
        different = True
    return 1 if different else 0


# --- the parser ----------------------------------------------------------------------------------------------
class _Help(argparse.HelpFormatter):
    """Example epilogs as written (descriptions wrapped as usual); each option's default shown where it has one
    and its help does not already say it (`ArgumentDefaultsHelpFormatter` would print `(default: None)` for
    unset ones)."""

    def _fill_text(self, text, width, indent):
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if ("default" in text or d is None or d is False or d is argparse.SUPPRESS or d == []
                or not action.option_strings):
            return text
        return f"{text} (default: {d})"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2 (argparse's own format, without the usage dump)
        self.exit(2, f"{self.prog.split()[0]}: error: {message} (see '{self.prog} --help')\n")


# Two or three real command lines per subcommand, shown by its --help (tests/tools/test_cli_manners.py parses
# every one with this parser, and runs the local ones on a real checkpoint).
EXAMPLES: dict[str, list[str]] = {
    "": ["lazyweights demo                                   # the whole job on a built-in checkpoint",
         "lazyweights inspect llama-hf/",
         "lazyweights convert LlamaForCausalLM llama-hf/ -o llama-q4_k_m.gguf --quant Q4_K_M",
         "lazyweights archs                                  # the architecture names convert takes"],
    "inspect": ["lazyweights inspect llama-hf/",
                "lazyweights inspect model.gguf --json --filter 'blk.0.*'",
                "lazyweights inspect https://example.org/llama/model.safetensors.index.json"],
    "plan": ["lazyweights plan lazyweights.tools.demo:convert_safetensor_state_dict llama-hf/",
             "lazyweights plan LlamaForCausalLM llama-hf/ --filter '*.0.*' --visualize plan.html"],
    "convert": ["lazyweights convert LlamaForCausalLM llama-hf/ -o llama.gguf            # HF -> GGUF",
                "lazyweights convert LlamaForCausalLM llama-hf/ -o out/llama-q4_k_m.gguf --quant Q4_K_M",
                "lazyweights convert Gemma3ForCausalLM gemma.gguf -o gemma-hf/          # GGUF -> HF folder",
                "lazyweights convert lazyweights.tools.demo:convert_safetensor_state_dict llama-hf/ -o out/ "
                "--max-shard-size 5GB"],
    "quantize": ["lazyweights quantize model-bf16.gguf model-q4_k_m.gguf Q4_K_M",
                 "lazyweights quantize model-bf16.gguf model-q4_k_m.gguf Q4_K_M --imatrix imatrix.gguf "
                 "--tensor-type attn_v=q8_0",
                 "lazyweights quantize model-bf16.gguf model-q4_k_m.gguf Q4_K_M --dry-run"],
    "diff": ["lazyweights diff llama-hf/ converted/",
             "lazyweights diff a.safetensors b.safetensors --values --rtol 1e-3 --atol 1e-5",
             "lazyweights diff https://example.org/llama/model.safetensors.index.json llama-hf/"],
    "check": ["lazyweights check LlamaForCausalLM llama-hf/ --module mymodel:build_model",
              "lazyweights check lazyweights.tools.demo:convert_safetensor_state_dict llama-hf/ "
              "--module mymodel:Model --json"],
    "verify": ["lazyweights verify converted/ --write     # hash every tensor into lazyweights.verify.json",
               "lazyweights verify converted/             # check them again (exit 1 on a mismatch)",
               "lazyweights verify https://example.org/converted/model.safetensors"],
    "demo": ["lazyweights demo",
             "lazyweights demo --workdir /tmp/lw-demo --layers 4"],
    "archs": ["lazyweights archs",
              "lazyweights archs --json"],
}


def _epilog(command: str) -> str:
    return "examples:\n" + "\n".join("  " + line for line in EXAMPLES[command])


def build_parser() -> argparse.ArgumentParser:
    """The `lazyweights` argument parser with every subcommand.

    Example:
        >>> build_parser().parse_args(["inspect", "model.safetensors"]).command
        'inspect'
    """
    from ..compiler.steps import DEFAULT_BUDGET
    from ..core.version import __version__

    budget_help = f"working memory, e.g. 1GB (default: {format_bytes(DEFAULT_BUDGET)})"

    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback on errors")
    parser = _Parser(prog=PROG, description="Lazy weight adapters: inspect checkpoints, print and draw adapter "
                                            "plans, convert, diff and check.", parents=[common],
                     epilog=_epilog("") + f"\n\n'{PROG} COMMAND --help' shows a command's options, defaults and "
                                          "examples.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def _pickle_arg(p):
        p.add_argument("--allow-pickle", choices=("weights_only",), default=None,
                       help="open .bin/.pt/.pth pickle checkpoints with torch's restricted unpickler "
                            "(torch.load(weights_only=True)); refused without it")
        _remote_arg(p)

    def _remote_arg(p):
        p.add_argument("--storage-options", metavar="JSON", type=_json_object, default=None,
                       help="for http(s)://, s3:// and gs:// paths: options as fsspec names them, e.g. "
                            "'{\"endpoint_url\": \"http://127.0.0.1:9000\", \"anon\": true}'")
        p.add_argument("--cache", metavar="DIR", default=None,
                       help="keep byte ranges fetched from http(s)://, s3:// and gs:// paths here for the next run")

    p = sub.add_parser("inspect", parents=[common], help="list a checkpoint's tensors (reads headers only)",
                       description="List names, dtypes, shapes, quantization and sizes, with totals per dtype.")
    p.add_argument("paths", nargs="+", metavar="PATH", help=".safetensors / .gguf files, a directory, or an index.json")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--filter", metavar="GLOB", help="only tensors whose names match this glob")
    _pickle_arg(p)
    p.set_defaults(func=cmd_inspect)

    def adapter_args(p):
        p.add_argument("adapter", metavar="ADAPTER",
                       help="'package.module:function', 'path/file.py:function', or an architecture name")
        p.add_argument("paths", nargs="+", metavar="PATH", help="the checkpoint: files, a directory or an index.json")
        p.add_argument("--hf-config", metavar="FILE", default=None,
                       help="config.json to pass as huggingface_config (default: the one beside the checkpoint)")
        _pickle_arg(p)
        p.add_argument("--lora", action="append", default=None, metavar="DIR",
                       help="a PEFT LoRA adapter folder to merge into the checkpoint first, lazily (repeatable: "
                            "adapters stack in order)")

    p = sub.add_parser("plan", parents=[common], help="print (and draw) what an adapter will do, reading nothing",
                       description="Run ADAPTER on the checkpoint lazily and print the plan.")
    adapter_args(p)
    p.add_argument("--filter", metavar="GLOB", help="only outputs whose names match this glob")
    p.add_argument("--visualize", metavar="FILE", help="also draw it: .html, .dot, .svg, .png or .mmd")
    p.add_argument("--no-group", action="store_true", help="print every layer (no grouping of repeated layers)")
    p.add_argument("--diff", nargs="+", metavar=("ADAPTER2", "PATH2"), default=None,
                   help="compare with a second plan (another adapter and/or checkpoint): print the outputs only in "
                        "one plan and those whose chains differ (source, ops and arguments, dtype/shape); with "
                        "--visualize FILE.html, draw both side by side with the differences marked")
    p.add_argument("--diff-hf-config", metavar="FILE", default=None,
                   help="config.json for the --diff plan (default: the one beside its checkpoint)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("convert", parents=[common], help="run an adapter and write the converted checkpoint",
                       description="Stream the adapted checkpoint to OUT under a memory budget.")
    adapter_args(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="a .safetensors file, a directory (shards + index), or a .gguf file")
    p.add_argument("--format", choices=("safetensors", "gguf"), default=None,
                   help="output format (default: from OUT's suffix, else safetensors)")
    p.add_argument("--budget", type=_size_arg, default=None, metavar="SIZE", help=budget_help)
    p.add_argument("--max-shard-size", type=_size_arg, default=None, metavar="SIZE",
                   help="split a folder output into shards of at most SIZE with an index, e.g. 5GB (default: one "
                        "shard)")
    p.add_argument("--scheduler", choices=("sync", "threads"), default=None, help="default: threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--filter", metavar="GLOB", help="only convert outputs whose names match this glob")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="write no tokenizer (GGUF -> HF: no tokenizer files; HF -> GGUF: no tokenizer.* keys)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="threads computing blocks (default: the CPUs this process may use)")
    p.add_argument("--mmproj", metavar="MMPROJ.gguf", default=None,
                   help="also write a multimodal checkpoint's vision tower and projector as llama.cpp's mmproj "
                        "file (Gemma 3, Qwen2-VL, Qwen2.5-VL, Qwen3-VL), from the same lazily opened source; "
                        "with a text GGUF in and -o FOLDER, read this mmproj and write one "
                        "...ForConditionalGeneration folder (Gemma 3, Qwen2-VL, Qwen2.5-VL, Qwen3-VL)")
    _quant_flags(p)
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("quantize", parents=[common], help="quantize a GGUF as llama-quantize does",
                       description="llama-quantize's job and flags, lazily: read IN.gguf (bf16/f16/f32), write "
                                   "OUT.gguf quantized to PRESET in one streaming pass.")
    p.add_argument("input", metavar="IN.gguf")
    p.add_argument("output", metavar="OUT.gguf")
    p.add_argument("preset", metavar="PRESET", type=str.upper,
                   help="Q8_0 Q6_K Q5_K_M Q5_K_S Q4_K_M Q4_K_S Q3_K_M Q2_K Q4_0")
    _quant_flags(p, with_preset=False)
    p.add_argument("--budget", type=_size_arg, default=None, metavar="SIZE", help=budget_help)
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="threads computing blocks (default: the CPUs this process may use)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _remote_arg(p)
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("diff", parents=[common], help="compare two checkpoints",
                       description="Tensors added, removed, or changed in dtype or shape; with --values, "
                                   "compare the data too. Exit 1 if they differ.")
    p.add_argument("a", metavar="A", help="first checkpoint (file, directory, index.json or URL)")
    p.add_argument("b", metavar="B", help="second checkpoint (file, directory, index.json or URL)")
    p.add_argument("--values", action="store_true", help="compare values (as float64; quantized data decoded)")
    p.add_argument("--rtol", type=_tolerance, default=0.0, metavar="R", help="relative tolerance (default 0)")
    p.add_argument("--atol", type=_tolerance, default=0.0, metavar="A", help="absolute tolerance (default 0)")
    p.add_argument("--filter", metavar="GLOB", help="only tensors whose names match this glob")
    _pickle_arg(p)
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("check", parents=[common], help="check an adapter's output against a module",
                       description="Compare the adapted names, dtypes and shapes with a module's weights "
                                   "(reads no tensor bytes). Exit 1 if there are problems.")
    adapter_args(p)
    p.add_argument("--module", required=True, metavar="MOD:CLASS_OR_FACTORY",
                   help="a Module (or class/factory making one), a dict of Weights, or a torch module")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--keys", action="store_true", help="print the adapted names first")
    p.add_argument("--no-fold", action="store_true", help="one row per weight (no folded layer indices)")
    p.set_defaults(func=cmd_check, filter=None)

    p = sub.add_parser("verify", parents=[common], help="hash every tensor; check a checkpoint against its manifest",
                       description="Without --write: re-read PATH and check every tensor against the "
                                   "lazyweights.verify.json beside it (exit 1 on any mismatch, naming it). With "
                                   "--write: hash PATH as it is now and write that manifest.")
    p.add_argument("path", metavar="PATH",
                   help="a checkpoint: .safetensors / .gguf file, directory, index.json, or a URL of one")
    p.add_argument("--write", action="store_true", help="write the manifest instead of checking it")
    p.add_argument("--manifest", metavar="FILE", default=None,
                   help="the manifest to check against, or (--write) to write (default: lazyweights.verify.json "
                        "beside PATH; a URL's is fetched from beside it, and --write needs FILE)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--scheduler", choices=("sync", "threads"), default=None, help="default: threads")
    p.add_argument("--budget", type=_size_arg, default=None, metavar="SIZE", help=budget_help)
    _remote_arg(p)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("archs", parents=[common], help="the architecture names convert takes, both ways",
                       description="Every built-in architecture: Hugging Face class and model_type -> llama.cpp's "
                                   "GGUF architecture, and GGUF architecture -> the classes that convert it back. "
                                   "Any of these class names is an ADAPTER for plan, convert and check.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_archs)

    p = sub.add_parser("demo", parents=[common], help="the main job on an embedded default checkpoint",
                       description="Write a small Llama-shaped checkpoint, adapt it lazily "
                                   "(a Llama-shaped bf16->f16 adapter), print the plan, save the result and verify "
                                   "every byte against numpy.")
    p.add_argument("--workdir", default=None,
                   help="where to write the checkpoint and the output (default: a temporary folder)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers in the demo checkpoint")
    p.add_argument("--budget", type=_size_arg, default="64MB", metavar="SIZE", help="working memory")
    p.set_defaults(func=cmd_demo)
    for name, subparser in sub.choices.items():
        if name in EXAMPLES and not subparser.epilog:
            subparser.epilog = _epilog(name)
    return parser


def cmd_verify(args) -> int:
    """`lazyweights verify PATH`: check a checkpoint against its manifest (or write one with --write)."""
    from ..io.remote import is_url
    from .verify import verify, write_manifest

    if is_url(args.path):
        return _verify_url(args)
    if not os.path.exists(args.path):
        raise UsageError(f"{args.path}: no such file or directory")
    if args.write and args.manifest:
        return _write_manifest_to(args)
    if args.write:
        target = write_manifest(args.path, scheduler=args.scheduler, budget=args.budget)
        with open(target, encoding="utf-8") as fh:
            n = len(json.load(fh)["tensors"])
        _out(f"wrote {target}: {n} tensors hashed")
        return 0
    report = verify(args.path, args.manifest, scheduler=args.scheduler, budget=args.budget)
    _out(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1


def _write_manifest_to(args) -> int:
    """`verify PATH --write --manifest FILE`: hash PATH (a local path or a URL) and write the manifest to FILE."""
    import shutil
    import tempfile

    from ..io.atomic import write_file_atomically
    from .verify import MANIFEST_NAME, write_manifest

    tmp = tempfile.mkdtemp(prefix="lazyweights-verify-")
    try:
        written = write_manifest(args.path, os.path.join(tmp, MANIFEST_NAME), scheduler=args.scheduler,
                                 budget=args.budget, storage_options=args.storage_options, cache=args.cache)
        with open(written, "rb") as fh:
            data = fh.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _make_parent(args.manifest)
    write_file_atomically(os.path.abspath(args.manifest), data)
    _out(f"wrote {args.manifest}: {len(json.loads(data)['tensors'])} tensors hashed")
    return 0


def _verify_url(args) -> int:
    """`verify URL`: the manifest beside the URL (fetched) or --manifest FILE; `--write` writes --manifest FILE."""
    import shutil
    import tempfile

    from ..io.remote import fetch_small, is_url, remote_options
    from .verify import MANIFEST_NAME, verify

    url = args.path
    folder_url = url.rstrip("/") if not url.endswith((".safetensors", ".gguf", ".json")) else url.rsplit("/", 1)[0]
    tmp = tempfile.mkdtemp(prefix="lazyweights-verify-")
    try:
        if args.write:
            if not args.manifest or is_url(args.manifest):
                raise UsageError(f"verify --write {url}: a manifest cannot be written beside a URL; give "
                                 "--manifest FILE (a local path), then upload it beside the checkpoint")
            return _write_manifest_to(args)
        manifest = args.manifest
        source = manifest or f"{folder_url}/{MANIFEST_NAME}"
        if manifest is None or is_url(manifest):
            manifest = os.path.join(tmp, MANIFEST_NAME)
            with remote_options(args.storage_options, args.cache), open(manifest, "wb") as fh:
                fh.write(fetch_small(source))
        report = verify(url, manifest, scheduler=args.scheduler, budget=args.budget,
                        storage_options=args.storage_options, cache=args.cache)
        report.path, report.manifest = url, source
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _out(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1


def arch_tables() -> dict:
    """The architectures `convert` takes, both ways, from the records in `adapters/archs.py` and the registry:
    `hf_to_gguf` rows (HF class, the model_types it accepts, the GGUF architecture each becomes), `gguf_to_hf`
    (GGUF architecture -> the classes whose adapter converts such a file back, with the model_type written), and
    `registered` (names added with `lazyweights.registry.register`, with their formats).

    Example:
        >>> t = arch_tables()
        >>> [r["gguf"] for r in t["hf_to_gguf"] if r["hf_class"] == "LlamaForCausalLM"]
        ['llama']
        >>> [c["hf_class"] for c in t["gguf_to_hf"]["gemma3"]]
        ['Gemma3ForCausalLM', 'Gemma3ForConditionalGeneration']
    """
    from ..adapters import registry
    from ..adapters.archs import ALIASES, ARCHS
    from ..adapters.builtin import BUILTIN

    def record(mt):
        return ARCHS.get(ALIASES.get(mt, mt))

    to_gguf = [{"hf_class": cls, "model_type": mt, "gguf": rec.gguf}
               for cls, types in sorted(BUILTIN.items(), key=lambda kv: kv[0].lower()) for mt in types
               if (rec := record(mt)) is not None]
    back: dict[str, list[dict]] = {}
    for rec in ARCHS.values():
        written = rec.back_as or rec.model_type  # the model_type a file of this record converts back to
        for cls, types in sorted(BUILTIN.items(), key=lambda kv: kv[0].lower()):
            entry = {"hf_class": cls, "model_type": written}
            if written in types and entry not in back.setdefault(rec.gguf, []):
                back[rec.gguf].append(entry)
    others = {name: sorted(f.value for f in a.weight_adapters)
              for name, a in sorted(registry.architectures().items()) if name not in BUILTIN}
    return {"hf_to_gguf": to_gguf, "gguf_to_hf": dict(sorted(back.items())), "registered": others}


def cmd_archs(args) -> int:
    """`lazyweights archs`: the architecture names `convert` takes, HF -> GGUF and GGUF -> HF."""
    t = arch_tables()
    if args.json:
        _out(json.dumps(t, indent=2))
        return 0
    _out(f"Hugging Face -> GGUF ({len(t['hf_to_gguf'])}): {PROG} convert HF_CLASS hf-folder/ -o out.gguf")
    rows = [["HF class", "model_type", "GGUF arch"]]
    rows += [[r["hf_class"], r["model_type"], r["gguf"]] for r in t["hf_to_gguf"]]
    for line in _table(rows):
        _out("  " + line)
    _out("")
    _out(f"GGUF -> Hugging Face ({len(t['gguf_to_hf'])}): {PROG} convert HF_CLASS model.gguf -o hf-folder/")
    rows = [["GGUF arch", "HF class (model_type written)"]]
    rows += [[g, ", ".join(f"{c['hf_class']} ({c['model_type']})" for c in classes)]
             for g, classes in t["gguf_to_hf"].items()]
    for line in _table(rows):
        _out("  " + line)
    _out("  (where one GGUF arch holds several model types, the file's metadata picks one: llama with experts is "
         "mixtral)")
    if t["registered"]:
        _out("")
        _out("registered in code (lazyweights.registry.register):")
        for name, fmts in t["registered"].items():
            _out(f"  {name}: {', '.join(fmts) or 'no adapters'}")
    return 0


def cmd_demo(args) -> int:
    """`lazyweights demo`: write a small Llama-shaped checkpoint, adapt it lazily, print the plan, save the result
    and verify every byte against numpy.
    """
    from .demo import run_demo

    return run_demo(args.workdir, layers=args.layers, budget=args.budget)


# The library's messages name its keyword arguments; on the command line the same fix is a flag.
_CLI_WORDS = [
    (re.compile(r"quant='?(\w+)'? writes GGUF: give a \.gguf path or format='gguf'"),
     r"--quant \1 writes GGUF: give an output ending in .gguf or --format gguf"),
    (re.compile(r"pass tokenizer=False \(--no-tokenizer\)"), "pass --no-tokenizer"),
    (re.compile(r"pass tokenizer=False / --no-tokenizer"), "pass --no-tokenizer"),
    (re.compile(r"tokenizer=False \(--no-tokenizer\)"), "--no-tokenizer"),
    (re.compile(r"format='(\w+)'"), r"--format \1"),
    (re.compile(r"quant=PRESET"), "--quant PRESET"),
    (re.compile(r"storage_options\['(\w+)'\]"), r"""--storage-options '{"\1": ...}'"""),
]


def cli_words(text: str) -> str:
    """A library message with its keyword-argument advice in command-line words.

    Example:
        >>> cli_words("quant='Q4_K_M' writes GGUF: give a .gguf path or format='gguf'")
        '--quant Q4_K_M writes GGUF: give an output ending in .gguf or --format gguf'
    """
    for pattern, replacement in _CLI_WORDS:
        text = pattern.sub(replacement, text)
    return text


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and not isinstance(e, LazyWeightsError) and e.strerror:
        where = e.filename if e.filename is not None else ""
        return f"{where}: {e.strerror}" if where else e.strerror
    if isinstance(e, KeyError) and not isinstance(e, LazyWeightsError) and e.args:
        return str(e.args[0])
    text = str(e) or type(e).__name__
    if not isinstance(e, (LazyWeightsError, OSError, KeyError, ValueError)):
        text = f"{type(e).__name__}: {text} (run with --debug for the traceback)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        _err(f"{PROG}: interrupted")
        return 130
    except BrokenPipeError:
        # e.g. `lazyweights plan ... | head`: stop quietly
        try:  # the standard recipe: point stdout at /dev/null so the exit-time flush cannot fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass  # no /dev/null to point stdout at: the exit-time flush may complain, the exit status stands
        return 1
    except Exception as e:  # noqa: BLE001 - the command line never shows a traceback unless --debug
        if debug:
            raise
        _err(f"{PROG}: error: {cli_words(_message(e))}")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
