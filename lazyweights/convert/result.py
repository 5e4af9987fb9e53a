"""A converter's result, whichever direction: the tensors with what a complete output needs besides them.

`ConvertedStateDict` carries the GGUF metadata (HF -> GGUF) or the folder's other files (GGUF -> HF), and
`save_converted` writes it completely, through `lazyweights.plan(...).save`, as both `to_gguf` and `to_hf`
(and the mmproj converters) do.

Example:
    >>> import numpy as np
    >>> from lazyweights import WeightData
    >>> out = ConvertedStateDict(w=WeightData.from_numpy(np.ones(2, np.float32), "w"))
    >>> out.gguf_metadata = {}
    >>> sorted(out), out.file_type_from_tensors
    (['w'], True)
"""
from __future__ import annotations

from typing import Callable


class ConvertedStateDict(dict):
    """An adapted state dict that carries what a complete output needs besides tensors: `gguf_metadata`
    (HF -> GGUF) or `extra_files()` (GGUF -> HF: name -> bytes, built only when saving). `lazyweights.plan`
    keeps both (`Plan.metadata`, `Plan.extra_files`), so `lazyweights.plan(result).save(path)` writes the
    complete file or folder. `file_type_from_tensors`: whether a save recomputes `general.file_type` from
    the tensors saved (`file_type_of`, llama.cpp's rule for a model; False where the converter's rule is
    another, as an mmproj's source float type)."""

    gguf_metadata: dict | None = None
    extra_files: Callable[[], dict[str, bytes]] | None = None
    file_type_from_tensors: bool = True


def save_converted(adapted, path, *, format: str | None = None, **save_kwargs) -> list[str]:
    """Save an adapter's output completely: `lazyweights.plan(adapted).save(path, ...)` (see `Plan.save`),
    kept for callers of the name. A GGUF gets the result's `gguf_metadata` (its `general.file_type` recomputed
    from the tensors saved); a folder gets the `extra_files()` (config.json, tokenizer files) beside the
    weights, the whole folder staged under a temporary name beside `path` and swapped in only when every file
    is complete, so a failure leaves the old folder (or none), never a half-written one. Returns the files
    written.

    Example:
        >>> import numpy as np, os, tempfile
        >>> from lazyweights import WeightData
        >>> sd = ConvertedStateDict(w=WeightData.from_numpy(np.ones((2, 2), np.float32), "w"))
        >>> sd.extra_files = lambda: {"config.json": b"{}"}
        >>> files = save_converted(sd, os.path.join(tempfile.mkdtemp(), "out"))
        >>> [os.path.basename(f) for f in files]
        ['model.safetensors', 'config.json']
    """
    from ..lazy.plan import plan

    return plan(adapted).save(path, format=format, **save_kwargs)
