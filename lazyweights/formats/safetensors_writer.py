"""Write safetensors files from planned shapes and dtypes, streaming, atomically.

`SafetensorsLayout` computes a whole file's header and every tensor's offset from metadata alone, in
exactly the layout `safetensors.numpy.save_file` produces (tensors sorted by dtype, widest first, then by
name; compact JSON; header padded with spaces to 8 bytes), so a saved file is byte-identical to what the
safetensors package would write for the same tensors. The bytes go through `io.atomic.AtomicFile`:
written by offset from any thread, renamed into place only when complete.

Example:
    >>> import json, os, tempfile, numpy as np
    >>> from safetensors.numpy import load_file
    >>> from lazyweights import DType
    >>> from lazyweights.io.atomic import AtomicFile
    >>> from lazyweights.formats.safetensors_writer import SafetensorsLayout
    >>> layout = SafetensorsLayout({"w": (DType.float32, (2,))}, {"format": "np"})
    >>> path = os.path.join(tempfile.mkdtemp(), "x.safetensors")
    >>> with AtomicFile(path, layout.file_size) as f:
    ...     f.write(0, layout.header_bytes)
    ...     f.write(layout.offsets["w"], np.array([1.5, 2.5], np.float32).tobytes())
    >>> load_file(path)["w"].tolist()
    [1.5, 2.5]
"""
from __future__ import annotations

import json

from ..core.dtype import DType
from ..core.errors import DTypeError
from .safetensors import CODE_OF_DTYPE

# safetensors' Dtype enum order (it sorts tensors by this, descending, then by name).
_RANK = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
         "I32", "U32", "F32", "F64", "I64", "U64"]


class SafetensorsLayout:
    """Header bytes and absolute tensor offsets for one file, from (dtype, shape) per name."""

    def __init__(self, tensors: dict[str, tuple[DType, tuple[int, ...]]], metadata: dict[str, str] | None = None):
        for name, (dtype, _) in tensors.items():
            if dtype not in CODE_OF_DTYPE:
                raise DTypeError(f"tensor {name!r}: safetensors cannot store {dtype.name}")
        order = sorted(tensors, key=lambda n: (-_RANK.index(CODE_OF_DTYPE[tensors[n][0]]), n))
        header: dict = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        offset = 0
        rel: dict[str, tuple[int, int]] = {}
        for name in order:
            dtype, shape = tensors[name]
            n = dtype.size_in_bytes
            for d in shape:
                n *= int(d)
            header[name] = {"dtype": CODE_OF_DTYPE[dtype], "shape": [int(d) for d in shape],
                            "data_offsets": [offset, offset + n]}
            rel[name] = (offset, n)
            offset += n
        raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        self.header_bytes = len(raw).to_bytes(8, "little") + raw
        data_start = len(self.header_bytes)
        self.order = order
        self.offsets = {name: data_start + o for name, (o, _) in rel.items()}
        self.sizes = {name: n for name, (_, n) in rel.items()}
        self.file_size = data_start + offset
