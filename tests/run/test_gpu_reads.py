"""The GPU executor's read calls: blocks that are one contiguous range of a local file are read with `pread`
into pinned memory (`SourceFile.read_into`), the rest are copied from the map. Same bytes either way (the
pipeline tests in test_gpu.py compare both with the CPU executor); here: which blocks take the read call, and
what a file changed under the plan gets."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from fake_gpu import NumpyDevice
from safetensors.numpy import save_file

import lazyweights as lw
from lazyweights.compiler.gpu import compile_gpu_steps
from lazyweights.compiler.steps import outputs_of
from lazyweights.core.errors import FormatError, SourceChangedError
from lazyweights.formats.source import SourceFile
from lazyweights.run import gpu as G
from lazyweights.run.gpu import materialize_gpu

RNG = np.random.default_rng(40)


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "m.safetensors"
    save_file({"w": RNG.standard_normal((64, 48)).astype(ml_dtypes.bfloat16),
               "q": RNG.standard_normal((32, 16)).astype(np.float32),
               "n": RNG.standard_normal((48,)).astype(np.float32)}, str(p))
    return p


def _spans(plan_dict, block_bytes=512):
    """(output, rows, span) for every block the GPU compiler cuts."""
    compiled = compile_gpu_steps(outputs_of(lw.plan(plan_dict)), budget=None, streams=2, block_bytes=block_bytes)
    return [(g.name, rows, G._source_span(g.host, rows, len(rows) * g.host_row_bytes))
            for g in compiled.steps for rows in g.blocks]


def test_contiguous_rows_are_spans_at_their_file_offsets(model):
    w = lw.load_weights(str(model))
    rec = {k: v.data() for k, v in w.items()}
    spans = _spans({"w16": rec["w"].astype("float16"), "rows": rec["w"][8:40], "flat": rec["q"].reshape(512)})
    whole = SourceFile.open(str(model)).whole_view()
    raw = {k: np.frombuffer(v.data().to_numpy().tobytes(), np.uint8) for k, v in w.items()}
    assert spans and all(s is not None for *_, s in spans)
    for name, rows, (_, offset) in spans:
        n = {"w16": 96, "rows": 96, "flat": 4}[name] * len(rows)  # source bytes per row of each host part
        got = whole[offset:offset + n]
        src = raw["q"] if name == "flat" else raw["w"]
        first = (rows.start + (8 if name == "rows" else 0)) * (4 if name == "flat" else 96)
        assert np.array_equal(got, src[first:first + n]), (name, rows)


def test_layouts_that_are_not_one_range_are_copied_from_the_map(model):
    w = lw.load_weights(str(model))
    x = w["w"].data()
    spans = _spans({"t": x.T, "cols": x[:, 4:20], "perm": x.permute([1, 0]).astype("float32")})
    assert [s for *_, s in spans] == [None] * len(spans)


def test_read_calls_are_taken_and_give_the_maps_bytes(model, monkeypatch):
    w = lw.load_weights(str(model))
    plan = lw.plan({"w": w["w"].data().astype("float16"), "n": w["n"].data(), "wt": w["w"].data().T})
    calls = []
    real = SourceFile.read_into
    monkeypatch.setattr(SourceFile, "read_into", lambda self, off, out, tensor=None: (
        calls.append(tensor), real(self, off, out, tensor))[1])
    want = plan.materialize(scheduler="sync")
    for read_calls in (True, False):
        calls.clear()
        got = materialize_gpu(plan, "gpu:0", backend=NumpyDevice(seed=1), block_bytes=1024, read_calls=read_calls)
        for k in want:
            assert np.asarray(got[k]).tobytes() == np.ascontiguousarray(want[k]).tobytes(), k
        assert sorted(set(calls)) == (["n", "w"] if read_calls else []), calls


def test_read_into_a_shortened_or_replaced_file_is_a_named_error(model):
    f = SourceFile.open(str(model))
    out = np.empty(64, np.uint8)
    f.read_into(f.size - 64, out)
    assert out.tobytes() == open(model, "rb").read()[-64:]
    with pytest.raises(FormatError, match=r"wants bytes \["):
        f.read_into(f.size - 8, out)
    with open(model, "r+b") as fh:
        fh.truncate(f.size - 32)
    with pytest.raises(SourceChangedError, match=r"m\.safetensors.*'w'.*size changed"):
        f.read_into(f.size - 64, out, "w")
    os.replace(model, str(model) + ".old")
    model.write_bytes(b"\0" * f.size)
    with pytest.raises(SourceChangedError, match="replaced by another file"):
        f.read_into(0, out)


def test_timings_say_where_the_calling_thread_waited(model, monkeypatch):
    """`DeviceArrays.timings`: every part named, the parts within the total, and a slow read shows as the
    calling thread waiting for fills (not as device work)."""
    import time

    w = lw.load_weights(str(model))
    plan = lw.plan({"w": w["w"].data().astype("float16"), "n": w["n"].data()})
    real = SourceFile.read_into

    def slow(self, off, out, tensor=None):
        if tensor == "n":
            time.sleep(0.2)
        return real(self, off, out, tensor)

    monkeypatch.setattr(SourceFile, "read_into", slow)
    got = materialize_gpu(plan, "gpu:0", backend=NumpyDevice(), block_bytes=1024, host_threads=2)
    t = got.timings
    assert set(t) == set(G.PIPELINE_TIMINGS) and all(v >= 0 for v in t.values())
    assert sum(v for k, v in t.items() if k != "total") <= t["total"] + 1e-3
    assert t["fill_wait"] >= 0.15 and t["total"] >= t["fill_wait"]
    assert got.blocks == 8  # w: 64 rows of 96 bytes in 1 KB blocks, 10 rows each (7 blocks); n: one


def test_read_into_without_preadv_copies_from_the_map(model, monkeypatch):
    """Where the platform has no `os.preadv` (Windows), the same bytes come from the map, checked first."""
    f = SourceFile.open(str(model))
    want = np.empty(100, np.uint8)
    f.read_into(40, want)
    monkeypatch.delattr(os, "preadv")
    got = np.empty(100, np.uint8)
    f.read_into(40, got)
    assert got.tobytes() == want.tobytes() == open(model, "rb").read()[40:140]
    with open(model, "r+b") as fh:
        fh.truncate(f.size - 1)
    with pytest.raises(SourceChangedError, match="size changed"):
        f.read_into(40, got)


@pytest.mark.parametrize("read_calls", [True, False])
def test_a_checkpoint_shortened_after_load_is_a_named_error_on_either_path(model, read_calls):
    """Read calls and map copies both refuse a file that changed after `load_weights`: a SourceChangedError
    naming the file (never a SIGBUS from the map, never short or mixed bytes), and no staging is left held."""
    w = lw.load_weights(str(model))
    plan = lw.plan({"w": w["w"].data().astype("float16"), "wt": w["w"].data().T})
    with open(model, "r+b") as fh:
        fh.truncate(os.path.getsize(model) - 100)
    backend = NumpyDevice()
    with pytest.raises(SourceChangedError, match=r"m\.safetensors.*(size changed|shortened)"):
        materialize_gpu(plan, "gpu:0", backend=backend, block_bytes=1024, read_calls=read_calls)
    assert backend.held == 0
