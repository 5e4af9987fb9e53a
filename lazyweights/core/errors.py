"""The exception hierarchy. Every error lazyweights raises on bad input derives from `LazyWeightsError`.

Each subclass also derives from the builtin a caller would naturally catch (a missing weight is a
`KeyError`, a mismatch at load is a `ValueError`), so code written against MAX's weights API keeps working.

    LazyWeightsError
    ├── FormatError            (also ValueError) a file is not what it claims (bad magic, header, offsets, truncation)
    │   ├── SourceChangedError a file changed size or identity after it was opened
    │   ├── ImatrixFormatError an importance-matrix file is truncated or malformed
    │   ├── UnsupportedCompressionError a compressed-tensors format or scheme this reader does not know
    │   └── JSONFileError      a JSON file beside a checkpoint (config.json, ...) that is not a JSON object
    ├── MissingWeightError     (also KeyError) a name that is not in the checkpoint / state dict
    ├── UnmappedTensorError    (also KeyError) tensors an adapter has no target name for
    ├── UsageError             (also ValueError) a call whose argument values cannot work
    ├── ArgumentTypeError      (also TypeError) an argument, or an adapter's result, of the wrong Python type
    ├── ShapeError             (also ValueError) an op whose shapes do not fit, found when the node is built
    │   ├── ImatrixShapeError  an importance-matrix entry whose length is not the tensor's row length
    │   └── ScaleShapeError    a compressed-tensors scale / zero point / packed tensor that does not fit its weight
    ├── DTypeError             (also ValueError / TypeError) an unsupported or mismatched dtype
    ├── ConfigError            (also ValueError) a model config (config.json, GGUF metadata) missing or lacking a key
    │   ├── GGUFConfigError    GGUF metadata lacking keys a Hugging Face config needs
    │   └── MmprojMismatchError an mmproj GGUF made for another text model (its projection width)
    ├── UnsupportedArchitectureError (also ValueError) an architecture a conversion does not know
    │   └── UnknownProjectorError an mmproj GGUF whose clip.projector_type no vision record converts back
    ├── UnknownArchitectureError (also KeyError) an architecture name not in the registry
    ├── UnknownGGUFKeyError    (also KeyError) an `{arch}.*` GGUF key neither gguf-py nor llama.cpp defines
    ├── AdapterError           (also ValueError) an adapter cannot be loaded, found or used
    │   └── NoAdapterError     a registered architecture with no adapter for this checkpoint format
    ├── LoadError              (also ValueError) load_state_dict found missing/unexpected/mismatched weights
    │   └── TorchLoadError     (also RuntimeError) the same, loading into a torch.nn.Module
    ├── BudgetError            (also ValueError) a memory budget too small for the plan's largest block
    ├── UnknownPresetError     (also ValueError) a quantization preset name that is not supported
    ├── TokenizerConversionError (also ValueError) a tokenizer llama.cpp's converter could not convert
    │   ├── MissingTokenizerError (also FileNotFoundError) no tokenizer files beside the checkpoint
    │   └── TokenizerNotExpressibleError a tokenizer.json part llama.cpp's tokenizer cannot reproduce
    ├── VerifyError            (also ValueError) a checkpoint that does not match its manifest
    ├── DependencyError        (also ImportError) a package or program this call needs is not installed
    ├── DeviceError            (also RuntimeError) a GPU that cannot be used (no driver, no such device)
    ├── RemoteError            (also OSError) an object-storage read failed: 403/404, a server that ignores
    │                          Range, a truncated body or a timeout after retries; names the URL
    └── ExecutionError         (also RuntimeError) a step failed while running a plan; names the output tensor
        └── WriteError         (also OSError) writing an output failed (disk full, permissions); names the file

Example:
    >>> from lazyweights import LazyWeightsError, MissingWeightError
    >>> issubclass(MissingWeightError, KeyError) and issubclass(MissingWeightError, LazyWeightsError)
    True
"""
from __future__ import annotations

from typing import Iterable

__all__ = [
    "CacheWriteWarning",
    "LazyWeightsError",
    "FormatError",
    "SourceChangedError",
    "ImatrixFormatError",
    "JSONFileError",
    "MissingWeightError",
    "UsageError",
    "ArgumentTypeError",
    "UnmappedTensorError",
    "ConfigError",
    "GGUFConfigError",
    "VisionConfigError",
    "MissingPreprocessorConfigError",
    "UnsupportedArchitectureError",
    "MmprojMismatchError",
    "UnknownProjectorError",
    "UnknownArchitectureError",
    "UnknownGGUFKeyError",
    "AdapterError",
    "NoAdapterError",
    "DependencyError",
    "DeviceError",
    "TokenizerConversionError",
    "MissingTokenizerError",
    "TokenizerNotExpressibleError",
    "VerifyError",
    "ShapeError",
    "ImatrixShapeError",
    "DTypeError",
    "LoadError",
    "TorchLoadError",
    "BudgetError",
    "UnknownPresetError",
    "UnknownTypeError",
    "KVOverrideError",
    "RemoteError",
    "ExecutionError",
    "WriteError",
    "did_you_mean",
]


class LazyWeightsError(Exception):
    """Root of every error lazyweights raises on bad input."""


class FormatError(LazyWeightsError, ValueError):
    """A checkpoint file is malformed: the message names the file and, where known, the tensor.
    safetensors: a bad header length, invalid JSON, offsets that overlap, leave holes, leave the file or
    disagree with dtype x shape, an unknown dtype code, a tensor in two shards, a missing shard, an index entry
    outside the checkpoint directory. GGUF: a bad magic or version, truncated tensor data, dims whose product
    overflows, offsets outside the file or misaligned, an unknown type, a missing split part. A PyTorch
    pickle (never unpickled)."""


class SourceChangedError(FormatError):
    """A source file was truncated, replaced or modified after `load_weights` opened it (or a remote object
    changed while it was read). Checked before each block touches pages; a truncation *during* a block is
    caught too where the block reads through the compiled casts (their SIGBUS guard) or writes straight from
    the map (EFAULT)."""


class ImatrixFormatError(FormatError):
    """An importance-matrix file (llama.cpp `.dat` or GGUF imatrix) is truncated or malformed; names the
    file, the entry and the byte offset where reading stopped."""


class UnsupportedCompressionError(FormatError):
    """A compressed-tensors checkpoint whose format (`sparse-bitmask`, `marlin-24`, `mxfp6-pack-quantized`,
    ...), strategy or bit width this reader does not decompress, or a module no config group targets; lists
    the supported formats, strategies and widths."""


class JSONFileError(FormatError):
    """A JSON file kept beside a checkpoint (config.json, generation_config.json, preprocessor_config.json,
    tokenizer_config.json, modules.json, ...) that cannot be read, is not UTF-8 JSON, or holds something other
    than an object; `path` names the file, the message also the parser's complaint
    (`formats.json_files.read_json`)."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class MissingWeightError(LazyWeightsError, KeyError):
    """A weight name that does not exist, or a MoE layer missing an expert. Carries close matches as a
    did-you-mean suggestion."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # KeyError would otherwise repr() the message with quotes
        return self.message


class UsageError(LazyWeightsError, ValueError):
    """A call whose argument values cannot work: a rank outside the world, an unknown scheduler, device or
    output format, an invalid size, a destination that is not an output, an empty path list."""


class ArgumentTypeError(LazyWeightsError, TypeError):
    """An argument of the wrong Python type (a list where a state dict goes, a non-string key), or an adapter
    that returned one."""


class UnmappedTensorError(LazyWeightsError, KeyError):
    """Tensors an adapter or name mapping has no target name for; lists them."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(LazyWeightsError, ValueError):
    """A model configuration (config.json, GGUF metadata, `huggingface_config=`) is missing, or lacks or
    contradicts a key the conversion needs; names the key."""


class GGUFConfigError(ConfigError):
    """GGUF metadata lacks keys a Hugging Face config needs; `missing` lists them."""

    def __init__(self, message: str, missing: Iterable[str] = ()):
        super().__init__(message)
        self.missing = list(missing)


class VisionConfigError(ConfigError):
    """A multimodal checkpoint whose vision tower no mmproj file can hold: no tower at all, or a vision config
    value llama.cpp's mtmd cannot compute (names the key, its value and what mtmd needs)."""


class MissingPreprocessorConfigError(VisionConfigError, FileNotFoundError):
    """No preprocessor_config.json (or processor_config.json) beside a checkpoint whose projector needs its image
    mean and std."""


class UnsupportedArchitectureError(LazyWeightsError, ValueError):
    """An architecture (model_type, GGUF general.architecture) a conversion has no mapping for."""


class MmprojMismatchError(ConfigError):
    """An mmproj GGUF beside a text model it was not made for: its `clip.vision.projection_dim` is not the text
    model's embedding width (names both values)."""


class UnknownProjectorError(UnsupportedArchitectureError):
    """An mmproj GGUF whose `clip.projector_type` no vision record converts back to a Hugging Face folder (names
    the projector and those that do)."""


class UnknownArchitectureError(LazyWeightsError, KeyError):
    """An architecture name that is not registered; lists the known ones."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownGGUFKeyError(LazyWeightsError, KeyError):
    """An `{arch}.*` GGUF key suffix (an architecture record's row, a fixed key) that neither gguf-py's `Keys`
    nor llama.cpp's key table defines (`formats.gguf_keys.template`); names the suffix and the closest keys."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class AdapterError(LazyWeightsError, ValueError):
    """An adapter that cannot be loaded (no such file or module, a syntax or import error in it), found (no
    such function) or used (it returned something other than a state dict)."""


class NoAdapterError(AdapterError):
    """A registered architecture has no adapter for this checkpoint's format."""


class DependencyError(LazyWeightsError, ImportError):
    """A package or program this call needs is not installed (CuPy, torch, Graphviz's dot); says how to get it."""


class DeviceError(LazyWeightsError, RuntimeError):
    """A GPU that cannot be used: no usable driver, no such device, an array on another device."""


class TokenizerConversionError(LazyWeightsError, ValueError):
    """A tokenizer that llama.cpp's converter could not convert either (it names the file and the reason)."""


class MissingTokenizerError(TokenizerConversionError, FileNotFoundError):
    """No tokenizer files beside the checkpoint (llama.cpp cannot run a GGUF without a tokenizer)."""


class TokenizerNotExpressibleError(TokenizerConversionError):
    """A part of tokenizer.json (`part`: model, normalizer, pre_tokenizer, post_processor, added_tokens) that no
    GGUF tokenizer setting makes llama.cpp reproduce; the message names the file, the part and its value."""

    def __init__(self, message: str, part: str = ""):
        super().__init__(message)
        self.part = part


class VerifyError(LazyWeightsError, ValueError):
    """A checkpoint that does not match its manifest (or has none); `report` holds the details."""

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


class ShapeError(LazyWeightsError, ValueError):
    """An op whose shapes do not fit; raised when the node is built, with both shapes in the message."""


class ImatrixShapeError(ShapeError):
    """An importance-matrix entry has a different length than the tensor's rows; names both numbers."""


class ScaleShapeError(ShapeError):
    """A compressed-tensors scale, zero point or packed tensor whose shape does not fit its weight; names the
    tensor, its shape and the weight's."""


class LoraError(LazyWeightsError, ValueError):
    """A PEFT LoRA adapter that does not fit the base: an update whose shape is not the base tensor's, a module
    or target the base lacks (an adapter for another base), a rank that disagrees with `r`, an adapter kind
    lazyweights cannot merge (DoRA, LoRA biases, parameter targets), a folder without `adapter_config.json`
    or `adapter_model.safetensors`; names the tensor and both shapes."""


class DTypeError(LazyWeightsError, TypeError, ValueError):
    """An unsupported or mismatched dtype, or an op the dtype does not allow (casting packed quantized blocks,
    adding to a quantized tensor, a block type MAX has no name for)."""


class LoadError(LazyWeightsError, ValueError):
    """`load_state_dict` found missing, unexpected or mismatched weights (all are listed in one message).
    `report` is the `CheckReport` behind the message, when there is one."""

    def __init__(self, message: str, report: object | None = None):
        super().__init__(message)
        self.report = report


class TorchLoadError(LoadError, RuntimeError):
    """`load_into_torch` found missing, unexpected or mismatched weights (a RuntimeError, as torch's own
    `load_state_dict` raises). `report` is the `CheckReport` behind the message, when there is one."""


class BudgetError(LazyWeightsError, ValueError):
    """The memory budget is smaller than some tensor's smallest block; raised before any work."""


class UnknownPresetError(LazyWeightsError, ValueError):
    """A quantization preset (`Q4_K_M`, ...) that lazyweights does not know; lists the known ones."""


class UnknownTypeError(LazyWeightsError, ValueError):
    """A GGML type name (`--tensor-type`, `--output-tensor-type`, `--token-embedding-type`) that lazyweights
    cannot write; lists the ones it can."""


class KVOverrideError(LazyWeightsError, ValueError):
    """A metadata override (`--override-kv KEY=TYPE:VALUE`, `kv_overrides=`) that is malformed: no `=`, a key
    of 128+ bytes, an unknown TYPE, a value that is not one, or a key lazyweights writes itself
    (`general.file_type`, `general.quantization_version`, `general.alignment`); names it and says why."""


class RemoteError(LazyWeightsError, OSError):
    """Reading a checkpoint from object storage failed: 403/404, a server that ignores Range, a truncated body
    or a timeout after retries. `url` names the object, `status` the HTTP status."""

    def __init__(self, message: str, url: str | None = None, status: int | None = None):
        super().__init__(message)
        self.url = url
        self.status = status

    def __str__(self) -> str:
        return str(self.args[0])


class ExecutionError(LazyWeightsError, RuntimeError):
    """A step failed while running a plan (inside a kernel, or a tool such as Graphviz's `dot`); the other
    tasks stop. `tensor` names the output being computed."""

    def __init__(self, message: str, tensor: str | None = None):
        super().__init__(message)
        self.tensor = tensor


class CacheWriteWarning(LazyWeightsError, UserWarning):
    """Warned, not raised: a `cache=` directory could not be written (full disk, read-only, a file-size limit),
    and the load goes on from memory without it. The message names the cache and the object."""


class WriteError(ExecutionError, OSError):
    """Writing an output failed (disk full, permissions, a file where a folder goes). The partial output has
    been removed; `path` names it."""

    def __init__(self, message: str, path: str | None = None, tensor: str | None = None):
        ExecutionError.__init__(self, message, tensor)
        self.path = path


def did_you_mean(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """A ' Did you mean ...?' suffix naming the closest candidates, or '' when none are close."""
    from .names import suggest  # layer-number aware: layers.1.w is never offered layers.11.w

    close = suggest(name, list(candidates), n=n)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def missing_weight(name: str, candidates: Iterable[str], where: str = "the checkpoint") -> MissingWeightError:
    """Build the error for a missing weight, with a did-you-mean suggestion."""
    candidates = list(candidates)
    return MissingWeightError(
        f"No weight named {name!r} in {where} ({len(candidates)} weights).{did_you_mean(name, candidates)}"
    )
