"""`Plan`: a whole adapted state dict as one graph, ready to be printed, checked, materialized or saved.

`plan(state_dict)` takes what an adapter returns (`dict[str, WeightData]`) and builds nothing new: it
collects the output nodes. Equal nodes are one node, so a tensor used twice (tied embeddings) is read
once. Execution lives in `lazyweights.run.driver`; a plan can be inspected without running anything.

A converter's result carries more than tensors (`convert.result.ConvertedStateDict`): GGUF metadata,
or the files of a Hugging Face folder (config.json, tokenizer). The plan keeps them (`Plan.metadata`,
`Plan.extra_files`), every plan derived from it (`filter`, `quantize`) keeps them too, and `Plan.save` writes
them: `lazyweights.plan(convert_hf_to_gguf(sd, cfg)).save("x.gguf")` is a GGUF llama.cpp loads.

Example:
    >>> import numpy as np
    >>> from lazyweights import WeightData, DType, plan
    >>> w = WeightData.from_numpy(np.arange(4, dtype=np.float32), "w")
    >>> p = plan({"a": w.astype(DType.float16), "b": w})
    >>> sorted(p.outputs), p.materialize()["a"].dtype.name
    (['a', 'b'], 'float16')
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..core.errors import ArgumentTypeError, UsageError
from ..graph.node import Node, toposort
from .weight_data import WeightData, as_weight_data


class Plan:
    """The outputs of an adapter, by name, as graph nodes, with what a complete output needs besides them.

    Attributes:
        tensors: output name -> `WeightData`.
        metadata: GGUF key/values to save with the tensors (a converter's `gguf_metadata`, e.g.
            `convert_hf_to_gguf`'s), or None. A `.gguf` save writes them; where they came from the
            converter's result, `general.file_type` is recomputed from the tensors saved.
        extra_files: files a folder save writes beside the shards (a converter's `extra_files`, e.g.
            `convert_gguf_state_dict`'s config.json, generation_config.json and tokenizer files): name -> bytes,
            or a callable returning them, called only when saving; or None.

    `Plan(state_dict)` takes both from a converter's result (its `gguf_metadata` / `extra_files` attributes,
    or a Plan's); `metadata=` / `extra_files=` given here win.

    Example:
        >>> import numpy as np
        >>> from lazyweights import WeightData, plan
        >>> from lazyweights.convert.result import ConvertedStateDict
        >>> sd = ConvertedStateDict(w=WeightData.from_numpy(np.ones((2, 2), np.float32), "w"))
        >>> sd.gguf_metadata = {"general.architecture": "llama"}
        >>> p = plan(sd)
        >>> p.metadata, p.filter("w").metadata
        ({'general.architecture': 'llama'}, {'general.architecture': 'llama'})
    """

    def __init__(self, state_dict: Mapping[str, object], *, metadata: Mapping | None = None,
                 extra_files: Mapping[str, bytes] | Callable[[], Mapping[str, bytes]] | None = None):
        carried = state_dict
        if isinstance(state_dict, Plan):
            state_dict = state_dict.tensors
        if not isinstance(state_dict, Mapping):
            raise ArgumentTypeError(f"plan() needs a dict of name -> WeightData, got {type(state_dict).__name__}")
        self.tensors: dict[str, WeightData] = {}
        for name, value in state_dict.items():
            if not isinstance(name, str):
                raise ArgumentTypeError(f"state dict keys must be strings, got {name!r}")
            self.tensors[name] = as_weight_data(value, name)
        own_md = getattr(carried, "metadata" if isinstance(carried, Plan) else "gguf_metadata", None)
        # kept as given: a GGUF file's metadata mapping also carries each key's stored type
        self.metadata: Mapping | None = metadata if metadata is not None else \
            (own_md if isinstance(own_md, Mapping) else None)
        # general.file_type is recomputed on save where the metadata is a converter's, built before its tensors
        # may have changed (quantized in place); not where the caller or `quantize` set it (a preset's own type)
        self._retype: bool = metadata is None and (carried._retype if isinstance(carried, Plan) else (
            self.metadata is not None and bool(getattr(carried, "file_type_from_tensors", True))))
        own_files = getattr(carried, "extra_files", None)
        self.extra_files = extra_files if extra_files is not None else \
            (own_files if isinstance(own_files, Mapping) or callable(own_files) else None)

    def _derived(self, tensors: Mapping[str, object], metadata: Mapping | None = None) -> "Plan":
        """A plan over `tensors` that keeps this plan's metadata (or `metadata`) and extra files."""
        out = Plan(tensors, metadata=metadata if metadata is not None else self.metadata,
                   extra_files=self.extra_files)
        out._retype = self._retype if metadata is None else False
        return out

    def filter(self, pattern: str) -> "Plan":
        """The plan of the outputs whose names match the glob `pattern` (fnmatch, case-sensitive), with this
        plan's metadata and extra files; UsageError naming the pattern when none match.

        Example:
            >>> import numpy as np
            >>> from lazyweights import WeightData, plan
            >>> w = WeightData.from_numpy(np.ones(2, np.float32), "w")
            >>> sorted(plan({"layers.0.w": w, "layers.1.w": w, "norm": w}).filter("layers.*").outputs)
            ['layers.0.w', 'layers.1.w']
        """
        from ..render.explain import filter_outputs

        kept = filter_outputs(self.outputs, pattern)
        return self._derived({k: self.tensors[k] for k in kept})

    @property
    def outputs(self) -> dict[str, Node]:
        """Output name -> node."""
        return {k: v.node for k, v in self.tensors.items()}

    def nodes(self) -> list[Node]:
        """Every node the outputs need, dependencies first, each once."""
        return toposort(self.outputs.values())

    def materialize(self, device=None, budget=None, scheduler=None, progress: bool = False,
                    out: Mapping[str, np.ndarray] | None = None, *, workers: int | None = None,
                    block_bytes: int | None = None) -> dict[str, np.ndarray]:
        """Compute every output: name -> array (C-contiguous; untouched sources are zero-copy map views).

        `scheduler`: "sync", "threads" (default) or a dask.distributed Client. `budget`: bytes in
        flight (int, or a string like "512MB"). `out`: caller-provided destination arrays to fill.
        `workers` (threads) and `block_bytes` (output bytes per block) tune the executor.
        """
        from ..run.materialize import materialize  # (run, compiler, render load on first use: light import)

        return materialize(self.outputs, device=device, budget=budget, scheduler=scheduler, progress=progress, out=out,
                           workers=workers, block_bytes=block_bytes)

    def save(self, path, format: str | None = None, max_shard_size=None, budget=None, scheduler=None,
             progress: bool = False, metadata: Mapping | None = None, *, quant: str | None = None, imatrix=None,
             quant_options: Mapping | None = None, workers: int | None = None,
             block_bytes: int | None = None, alignment: int | None = None,
             require_architecture: bool = True) -> list[str]:
        """Stream the outputs to `path` (see `lazyweights.lazy.save`), the one save every output goes
        through; atomic; returns the files written.

        - `x.safetensors`: one file (`metadata`: its string header metadata).
        - `x.gguf` (or `format="gguf"`): GGUF with `metadata` or else the plan's own (`Plan.metadata`, its
          `general.file_type` recomputed from the tensors); without a `general.architecture` it is a
          `GGUFConfigError` naming the key before anything is written, unless `require_architecture=False`
          (a bare tensor container llama.cpp will not load). `alignment`: the data alignment (default 32).
        - any other path: a folder, `model.safetensors` or shards with an index when `max_shard_size` splits
          it, plus the plan's `extra_files` (a Hugging Face folder: config.json, tokenizer files), staged
          and swapped in whole.

        `quant` (GGUF): a llama.cpp preset ("Q4_K_M", "Q8_0", ...; see `Plan.quantize`), applied in the
        same pass; `imatrix`: an importance matrix file for it; `quant_options`: `Plan.quantize`'s
        llama-quantize controls as a dict (`{"tensor_types": {"attn_v": "Q8_0"}, "pure": True}`, ...).

        Example:
            >>> import numpy as np, os, tempfile
            >>> from lazyweights import WeightData, plan
            >>> from lazyweights.formats.gguf import read_gguf
            >>> p = plan({"w": WeightData.from_numpy(np.ones((2, 3), np.float32), "w")},
            ...          metadata={"general.architecture": "llama"})
            >>> out = os.path.join(tempfile.mkdtemp(), "x.gguf")
            >>> p.save(out) == [out], read_gguf(out)[1]["general.architecture"]
            (True, 'llama')
        """
        is_gguf = (format or "").lower() == "gguf" or str(path).endswith(".gguf")
        if quant_options and quant is None:
            raise UsageError(f"quant_options={dict(quant_options)!r} are used with quant=PRESET")
        if quant is not None:
            if not is_gguf:
                raise UsageError(f"quant={quant!r} writes GGUF: give a .gguf path or format='gguf'")
            quantized = self.quantize(quant, self._gguf_metadata(metadata), imatrix=imatrix,
                                      **dict(quant_options or {}))
            return quantized.save(path, format="gguf", budget=budget, scheduler=scheduler, progress=progress,
                                  workers=workers, block_bytes=block_bytes, alignment=alignment,
                                  require_architecture=require_architecture)
        from ..formats.gguf_writer import TensorMeta
        from .save import save

        meta = {n: TensorMeta(w.dtype, w.shape, w.quantization_encoding) for n, w in self.tensors.items()}
        return save(self.outputs, path, format=format or ("gguf" if is_gguf else "safetensors"), tensor_meta=meta,
                    max_shard_size=max_shard_size, budget=budget, scheduler=scheduler, progress=progress,
                    metadata=self._gguf_metadata(metadata) if is_gguf else metadata, workers=workers,
                    block_bytes=block_bytes, alignment=alignment, require_architecture=require_architecture,
                    extra_files=None if is_gguf else self.extra_files)

    def _gguf_metadata(self, metadata: Mapping | None) -> Mapping | None:
        """The GGUF metadata a save writes: the caller's, else the plan's (a converter's: its
        `general.file_type` recomputed from the tensors, `formats.gguf_writer.with_file_type`)."""
        if metadata is not None:
            return metadata
        if self.metadata is None or not self._retype:
            return self.metadata
        from gguf.constants import Keys  # a GGUF save: gguf is imported by its writer anyway

        if Keys.General.FILE_TYPE in self.metadata:
            from ..formats.gguf_writer import with_file_type

            return with_file_type(self.metadata, self.tensors)
        return self.metadata

    def stream(self, order=None, *, prefetch="1GB", budget=None, scheduler=None, workers: int | None = None):
        """Yield `(name, array)` in `order` (names, or groups of names computed together; default: every
        output in plan order; `"layers"`: one group per layer, the rest first), computed ahead on a background
        thread within `prefetch` bytes of finished tensors the caller has not taken yet. For serving: load
        layer 0 onto the device while later layers are still being read (see `run/stream.py`).

        Example:
            >>> import numpy as np
            >>> from lazyweights import WeightData, DType, plan
            >>> p = plan({f"layers.{i}.w": WeightData.from_numpy(np.full(4, i, np.float32), "w").astype(DType.float16)
            ...           for i in range(3)})
            >>> [name for name, array in p.stream("layers", prefetch="1KB")]
            ['layers.0.w', 'layers.1.w', 'layers.2.w']
        """
        from ..run.stream import layer_groups, stream

        if isinstance(order, str) and order == "layers":
            order = layer_groups(list(self.outputs))
        return stream(self.outputs, order, prefetch=prefetch, budget=budget, scheduler=scheduler, workers=workers)

    def quantize(self, preset: str, metadata=None, *, imatrix=None, with_metadata: bool = False, tensor_types=None,
                 output_tensor_type: str | None = None, token_embedding_type: str | None = None,
                 pure: bool = False, prune_layers=None, kv_overrides=None):
        """This plan with its tensors quantized the way llama.cpp's `llama-quantize` does for `preset`
        (Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, Q3_K_M, Q2_K, Q4_0): per tensor, llama.cpp's type choice,
        as lazy `quantize` nodes (`explain()` shows each type and why a rule picked it). Outputs must have
        GGUF names (e.g. from `lazyweights.adapters.hf_to_gguf`); `metadata` is the GGUF metadata to write
        (default: the plan's own, `Plan.metadata`). The quantized plan carries the metadata with
        `general.file_type` set to the preset's; `with_metadata=True` returns (plan, that metadata) instead.

        llama-quantize's per-tensor controls, same names and semantics:
        `tensor_types` (`--tensor-type PATTERN=TYPE`): {pattern: type} or [(pattern, type), ...], a regular
        expression searched in each GGUF name, first match wins, over the preset's rules (a pattern that matches
        no quantized tensor warns); `output_tensor_type` / `token_embedding_type` (`--output-tensor-type`,
        `--token-embedding-type`); `pure` (`--pure`: every quantized tensor gets the preset's type);
        `prune_layers` (`--prune-layers`: block numbers to drop, the rest renumbered, `{arch}.block_count`
        fixed); `kv_overrides` (`--override-kv`: "KEY=TYPE:VALUE" strings or {key: value}). Type names are
        ggml's (case-insensitive); an unknown one is an UnknownTypeError listing the valid ones.

        Example:
            >>> import numpy as np
            >>> from lazyweights import WeightData, plan
            >>> w = WeightData.from_numpy(np.ones((32, 640), np.float32), "w")
            >>> q = plan({"blk.0.attn_q.weight": w}).quantize(
            ...     "Q4_K_M", {"general.architecture": "gemma3", "gemma3.block_count": 1})
            >>> q.tensors["blk.0.attn_q.weight"].quantization_encoding.name
            'Q5_0'
            >>> meta = {"general.architecture": "gemma3", "gemma3.block_count": 1}
            >>> q = plan({"blk.0.attn_q.weight": w}).quantize("Q4_K_M", meta, tensor_types={"attn_q": "q8_0"})
            >>> q.tensors["blk.0.attn_q.weight"].quantization_encoding.name
            'Q8_0'
        """
        from ..formats.gguf_quantize import quantize_outputs

        if metadata is None:
            metadata = self._gguf_metadata(None)
        result = quantize_outputs(self.outputs, metadata, preset, imatrix=imatrix, tensor_types=tensor_types,
                                  output_tensor_type=output_tensor_type, token_embedding_type=token_embedding_type,
                                  pure=pure, prune_layers=prune_layers, kv_overrides=kv_overrides)
        tensors = {name: (WeightData.wrap(node, name, result.encodings[name]) if result.encodings[name] is not None
                          else (self.tensors[name] if name in self.tensors and node is self.outputs[name]
                                else WeightData.wrap(node, name)))
                   for name, node in result.outputs.items()}
        quantized = self._derived(tensors, metadata=result.metadata)
        return (quantized, result.metadata) if with_metadata else quantized

    def steps(self, budget=None):
        """The fused, ordered steps the scheduler will run (see `lazyweights.compiler.steps`)."""
        from ..compiler.steps import compile_steps

        return compile_steps(self, budget=budget)

    # --- seeing the plan (lazyweights/explain.py, lazyweights/visualize.py) ---------------------------------
    def explain(self, filter: str | None = None, group_layers: bool = True) -> str:
        """Readable text: one line per node (`%3:f16[2048,2048] = cast[f16] %2`), sources with file and
        offset, output names, fused steps and a byte/memory summary. `filter` is a glob on output names."""
        from ..render.explain import explain

        return explain(self, filter=filter, group_layers=group_layers)

    def __str__(self) -> str:
        return self.explain()

    def to_networkx(self):
        """A networkx DiGraph of the plan with op, dtype, shape, bytes, source file and output names."""
        from ..render.visualize import to_networkx

        return to_networkx(self)

    def visualize(self, path, group_layers: bool = True) -> str:
        """Draw the plan to `path`: .dot, .svg/.png (graphviz), .mmd (Mermaid) or a self-contained .html."""
        from ..render.visualize import visualize

        return visualize(self, path, group_layers=group_layers)

    def diff(self, other: "Plan", labels: tuple[str, str] = ("a", "b")):
        """How `other` differs from this plan, output by output: a `lazyweights.render.diff.PlanDiff` with the
        outputs only in one plan (`only_a`, `only_b`), those whose chains differ (`changed`: source, ops and
        their arguments, dtype or shape; sources compared by stored name and type, not file or offset) and
        `same`. `str()` is a text report; `.visualize("diff.html")` draws both plans side by side in the viewer
        with the differing outputs marked. `labels`: the two plans' names in the report.

        Example:
            >>> import numpy as np
            >>> from lazyweights import WeightData, DType, plan
            >>> w = WeightData.from_numpy(np.zeros((4, 2), np.float32), "w")
            >>> d = plan({"a": w.astype(DType.float16)}).diff(plan({"a": w.astype(DType.bfloat16)}))
            >>> list(d.changed), d.changed["a"].what
            (['a'], ['type', 'ops'])
        """
        from ..render.diff import diff_plans

        return diff_plans(self, other, labels)

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return f"<Plan: {len(self.tensors)} outputs, {len(self.nodes())} nodes>"


def plan(state_dict: Mapping[str, object], *, metadata: Mapping | None = None,
         extra_files: Mapping[str, bytes] | Callable[[], Mapping[str, bytes]] | None = None) -> Plan:
    """Build the plan for an adapted state dict (`dict[str, WeightData]`, or a converter's result, whose GGUF
    metadata and extra files the plan keeps: see `Plan`). Reads nothing."""
    return Plan(state_dict, metadata=metadata, extra_files=extra_files)
