"""Arrays handed to `WeightData` / `from_numpy` from other libraries: each route that fails says why, in the
debug log and, when no route works, in the DTypeError naming the tensor (no failure is swallowed silently)."""
import logging

import numpy as np
import pytest

import lazyweights as lw
from lazyweights.core.errors import DTypeError


class _Refusing:
    """A DLPack producer numpy cannot import, whose .numpy() fails too (a GPU tensor without a driver)."""

    dtype = "float32"

    def __dlpack__(self, *args, **kwargs):
        raise BufferError("device 2 is not the CPU")

    def __dlpack_device__(self):
        return (2, 0)

    def detach(self):
        return self

    def numpy(self):
        raise RuntimeError("can't convert cuda:0 device type tensor to numpy")


def test_no_route_names_the_tensor_and_every_reason(caplog):
    caplog.set_level(logging.DEBUG, logger="lazyweights.lazy.weight_data")
    with pytest.raises(DTypeError) as info:
        lw.WeightData.from_numpy(_Refusing(), "model.embed.weight")
    message = str(info.value)
    assert "'model.embed.weight'" in message and "_Refusing" in message
    assert "BufferError: device 2 is not the CPU" in message
    assert "RuntimeError: can't convert cuda:0" in message
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    logged = [r.getMessage() for r in caplog.records]
    assert any("DLPack" in m and "device 2" in m for m in logged), logged
    assert any(".numpy() failed" in m and "cuda:0" in m for m in logged), logged


def test_bf16_torch_tensor_takes_the_numpy_route():
    """numpy cannot import bf16 through DLPack; the .numpy() route gives the same bits, judged by torch's own
    float32 conversion."""
    torch = pytest.importorskip("torch")
    t = torch.tensor([[1.5, -2.25], [3e38, 1e-40]], dtype=torch.bfloat16)
    w = lw.WeightData.from_numpy(t, "w")
    assert w.dtype is lw.DType.bfloat16 and w.shape == (2, 2)
    np.testing.assert_array_equal(w.astype(lw.DType.float32).to_numpy(), t.float().numpy())
