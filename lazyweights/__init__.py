"""lazyweights: lazy model weight adapters over memory-mapped safetensors and GGUF.

Write an adapter the way MAX's adapter guide does; every op builds a graph node and nothing is read until
`.data`, `to_numpy()`, `Plan.materialize()`, `allocated_weights` or a save.

Example:
    >>> import numpy as np, tempfile, os
    >>> from safetensors.numpy import save_file
    >>> import lazyweights as lw
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> save_file({"model.norm.weight": np.ones(4, np.float32)}, path)
    >>> weights = lw.load_weights([path])
    >>> adapted = {k.replace("model.", ""): w.data().astype(lw.DType.bfloat16) for k, w in weights.items()}
    >>> lw.plan(adapted).materialize()["norm.weight"].dtype.name
    'bfloat16'
"""
from .adapters import registry
from .adapters.registry import SupportedArchitecture
from .core import errors as _errors
from .core.device import DeviceRef
from .core.dtype import DType
from .core.errors import *  # noqa: F401,F403  (every error class; core/errors.__all__ lists them)
from .core.quantization import QuantizationEncoding
from .core.version import __version__ as __version__
from .formats.checkpoint import WeightsFormat
from .formats.config import GGUFConfig, HFConfig, load_hf_config
from .formats.open import weights_format
from .interop.check import CheckReport, check, check_unique_renames
from .interop.module import LayerList, Module
from .interop.torch_load import load_into_torch  # imports torch only when called
from .lazy.gguf import save_gguf
from .lazy.plan import Plan, plan
from .lazy.shard import shard
from .lazy.weight import Weight
from .lazy.weight_data import WeightData, concat, from_numpy, split, stack
from .lazy.weights import Weights, load_weights

__all__ = [name for name in _errors.__all__ if name != "did_you_mean"] + [
    "DeviceRef", "DType", "Plan", "QuantizationEncoding", "shard",
    "Weight", "WeightData", "Weights", "WeightsFormat", "concat", "from_numpy", "load_weights",
    "plan", "split", "stack", "weights_format", "Module", "LayerList", "CheckReport", "check",
    "check_unique_renames", "load_into_torch", "SupportedArchitecture", "registry",
    "GGUFConfig", "HFConfig", "load_hf_config", "save_gguf",
]
