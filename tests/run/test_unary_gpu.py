"""The unary elementwise op in the GPU executor (it runs in the host part, beside `binary`): the pipeline on the
fake device (no GPU needed) and, where CuPy and a CUDA device answer, on a real one, against numpy."""
from __future__ import annotations

import numpy as np
import pytest
from fake_gpu import NumpyDevice

import lazyweights as lw
from lazyweights.graph import ops
from lazyweights.graph.elementwise import unary
from lazyweights.lazy.weight_data import WeightData
from lazyweights.run.gpu import materialize_gpu

RNG = np.random.default_rng(27)


def _gpu_plan():
    x = (RNG.random((64, 48)) * 3).astype(np.float32)
    wd = WeightData.wrap(unary("neg", unary("exp", ops.const(x))), "A", None)
    return lw.plan({"A": wd}), -np.exp(x)


def test_gpu_pipeline_on_the_fake_device():
    plan, want = _gpu_plan()
    got = materialize_gpu(plan, "gpu:0", backend=NumpyDevice(seed=3), block_bytes=256, streams=2)
    assert np.asarray(got["A"]).tobytes() == want.tobytes()


def _cuda_ok() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(not _cuda_ok(), reason="needs cupy and a CUDA device")
def test_gpu_pipeline_on_a_real_device():
    import cupy

    plan, want = _gpu_plan()
    got = materialize_gpu(plan, "gpu:0", block_bytes=1024, streams=2)
    assert cupy.asnumpy(got["A"]).tobytes() == want.tobytes()
