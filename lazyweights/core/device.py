"""`DeviceRef`: where a materialized weight lives ("cpu" or "gpu:N"), in MAX's spelling.

Example:
    >>> from lazyweights import DeviceRef
    >>> DeviceRef.GPU(0), DeviceRef.CPU(), DeviceRef.parse("gpu:1")
    (DeviceRef.GPU(0), DeviceRef.CPU(), DeviceRef.GPU(1))
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class DeviceRef:
    """A device: `kind` is "cpu" or "gpu"; `id` the device index."""

    kind: str = "cpu"
    id: int = 0

    @staticmethod
    def CPU(id: int = 0) -> "DeviceRef":  # noqa: N802 - MAX's spelling
        """The host (MAX's `DeviceRef.CPU()`).

        Example:
            >>> DeviceRef.CPU().is_gpu
            False
        """
        return DeviceRef("cpu", id)

    @staticmethod
    def GPU(id: int = 0) -> "DeviceRef":  # noqa: N802
        """GPU number `id` (MAX's `DeviceRef.GPU(0)`).

        Example:
            >>> DeviceRef.GPU(1).is_gpu, DeviceRef.GPU(1).id
            (True, 1)
        """
        return DeviceRef("gpu", id)

    @property
    def is_gpu(self) -> bool:
        """True for a GPU device (a property, as in MAX)."""
        return self.kind == "gpu"

    @classmethod
    def parse(cls, value) -> "DeviceRef":
        """Accept None (cpu), a DeviceRef, "cpu", "gpu", "gpu:1", "cuda:1", or another library's device
        reference with `device_type` and `id` (MAX's `max.graph.DeviceRef.CPU()`), read without importing it."""
        if value is None:
            return cls.CPU()
        if isinstance(value, DeviceRef):
            return value
        kind, idx = getattr(value, "device_type", None), getattr(value, "id", None)
        if kind is not None and isinstance(idx, int) and not isinstance(idx, bool):
            kind = getattr(kind, "value", kind)  # MAX: DeviceKind.CPU, whose value is "cpu"
            if isinstance(kind, str):
                return cls.parse(f"{kind}:{idx}")
        if isinstance(value, str):
            kind, _, idx = value.lower().partition(":")
            kind = {"cuda": "gpu"}.get(kind, kind)
            if kind in ("cpu", "gpu") and (idx == "" or idx.isdigit()):
                return cls(kind, int(idx or 0))
        raise UsageError(f"unknown device {value!r}; use 'cpu', 'gpu' or 'gpu:N'")

    def __repr__(self) -> str:
        return f"DeviceRef.{self.kind.upper()}({self.id if self.kind == 'gpu' else ''})"

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"
