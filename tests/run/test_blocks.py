"""The RoPE row permutation (a gather inside each head) cast block by block gives the reference's bits,
NaN/inf/-0.0 included, whatever the block size."""
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import lazyweights as lw

RNG = np.random.default_rng(11)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _rope_perm(head_dim):
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


@pytest.mark.parametrize("target", [lw.DType.float16, lw.DType.float32, lw.DType.float8_e4m3fn])
@pytest.mark.parametrize("block_bytes", [1, 4096, 1 << 20])
def test_rope_permutation_cast_equals_reference(tmp_path, target, block_bytes):
    heads, head_dim, hidden = 8, 64, 96
    w = (RNG.standard_normal((heads * head_dim, hidden)) * 3).astype(BF16)
    w.reshape(-1)[::97] = np.array([np.nan, np.inf, -0.0], BF16)[np.arange(len(w.reshape(-1)[::97])) % 3]
    save_file({"q": w}, str(tmp_path / "m.safetensors"))
    q = lw.load_weights(tmp_path / "m.safetensors")["q"].data()
    lazy = (q.reshape(heads, head_dim, hidden)[:, _rope_perm(head_dim), :]
            .reshape(heads * head_dim, hidden).astype(target))
    plain3d = q.reshape(heads, head_dim, hidden)[:, _rope_perm(head_dim), :].astype(target)
    p = lw.plan({"q": lazy, "q3": plain3d})
    got = p.materialize(scheduler="sync", block_bytes=block_bytes)
    ref = p.materialize(scheduler="reference")
    want = w.reshape(heads, head_dim, hidden)[:, _rope_perm(head_dim), :].astype(target.to_numpy())
    for name in ("q", "q3"):
        assert got[name].tobytes() == ref[name].tobytes() == want.tobytes(), name
