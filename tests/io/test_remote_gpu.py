"""The GPU executor on remote sources and rank slices, on the fake numpy device (no GPU needed).

The GPU path's host side (`run/gpu._fill`) gathers each block's source rows into pinned staging; with a
remote source it must first fetch exactly those ranges, and then not care where the bytes came from. Each
test compares the device result with the CPU executor on the local files, bit for bit, and counts what
nginx sent.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from test_remote import CFG, _checkpoint, _fresh, _watch_held_peak

import lazyweights as lw
from lazyweights import DType
from lazyweights.compiler.gpu import compile_gpu_steps
from lazyweights.compiler.steps import outputs_of
from lazyweights.io.remote import RemoteFile
from lazyweights.run import fetch
from lazyweights.run.gpu import materialize_gpu
from lazyweights.tools import demo as w1


def _fake_gpu():
    """tests/run/fake_gpu.py, loaded by path (it lives beside the GPU tests, another folder)."""
    path = Path(__file__).resolve().parents[1] / "run" / "fake_gpu.py"
    spec = importlib.util.spec_from_file_location("fake_gpu_for_remote", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NumpyDevice = _fake_gpu().NumpyDevice


@pytest.fixture(scope="module")
def served(nginx, write_safetensors):
    folder = nginx.root / "gpu-ckpt"
    _checkpoint(folder, write_safetensors)
    return folder


def _bits(arr, dtype: DType) -> bytes:
    arr = np.asarray(arr)
    return np.ascontiguousarray(arr if arr.dtype == dtype.to_numpy() else arr.view(dtype.to_numpy())).tobytes()


def _adapted(paths, **kw):
    weights = lw.load_weights(paths, **kw)
    sd = w1.convert_safetensor_state_dict(dict(weights.items()), huggingface_config=CFG)
    # bf16 -> f16 on the device for every matrix, as a GPU serving engine would load them
    return {k: (v.astype(DType.float16) if v.dtype is DType.bfloat16 and len(v.shape) == 2 else v)
            for k, v in sd.items()}


def test_gpu_path_on_a_remote_checkpoint_equals_local_cpu(nginx, served):
    """RoPE-permuted, renamed, cast on the device, read over HTTP in small blocks on 3 streams."""
    _fresh()
    want = lw.plan(_adapted([str(served)])).materialize()
    nginx.clear_log()
    plan = lw.plan(_adapted([nginx.url("gpu-ckpt/model.safetensors.index.json")]))
    opened = nginx.bytes_sent()
    backend = NumpyDevice(seed=3)
    got = materialize_gpu(plan, "gpu:0", backend=backend, block_bytes=16 << 10, streams=3)
    assert set(got) == set(want)
    for name, ref in want.items():
        assert got.dtypes[name].to_numpy() == ref.dtype, name
        assert _bits(got[name], got.dtypes[name]) == np.ascontiguousarray(ref).tobytes(), name
    checkpoint = sum(os.path.getsize(p) for p in served.glob("*.safetensors"))
    assert nginx.bytes_sent() - opened <= 1.05 * checkpoint  # each byte fetched once
    assert backend.held == 0


@pytest.mark.parametrize("rank", [0, 3])
def test_gpu_path_on_a_remote_rank_slice(nginx, served, rank):
    """One rank of four on the fake device: its slices equal the same slices of the local CPU result, and the
    server sent only the rank's rows: the shard's slices sink below the adapter's RoPE permutation
    (`graph.rewrites.sink_slices`), so q/k read their heads' rows, not the whole tensors."""
    _fresh()
    world = 4
    local = lw.shard(_adapted([str(served)]), rank, world)
    want = lw.plan(local).materialize()
    weights_url = nginx.url("gpu-ckpt/model.safetensors.index.json")
    sd = _adapted([weights_url], storage_options={"part_cost": 0})  # exactly the bytes asked for: counted below
    nginx.clear_log()
    got = materialize_gpu(lw.plan(lw.shard(sd, rank, world)), "gpu:0", backend=NumpyDevice(), block_bytes=8 << 10)
    assert set(got) == set(want)
    for name, ref in want.items():
        assert _bits(got[name], got.dtypes[name]) == np.ascontiguousarray(ref).tobytes(), name
    # What the rank needs from the source: its slices' bf16 bytes, except k_proj, where a quarter of the 2
    # KV heads is half a head and the RoPE gather reads that whole head; plus each down_proj row's part
    # framing in the multi-range replies. The whole checkpoint would be 3x more.
    share = sum(np.asarray(v).size * (4 if np.asarray(v).dtype == np.float32 else 2) for v in want.values())
    k_rows = sum(np.asarray(v).nbytes for k, v in want.items() if "k_proj" in k)
    framing = 3 * 256 * 128
    checkpoint = sum(os.path.getsize(p) for p in served.glob("*.safetensors"))
    assert nginx.bytes_sent() <= share + k_rows + framing, (nginx.bytes_sent(), share, k_rows)
    assert nginx.bytes_sent() <= 0.35 * checkpoint


def test_gpu_dequantizes_a_remote_gguf(nginx):
    """Packed GGUF blocks fetched over HTTP, dequantized (and cast to f16) by the device kernels' numpy
    twins: equal to the CPU executor and to gguf-py's dequantizer."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(11)
    values = (rng.standard_normal((64, 512)) + 0.2).astype(np.float32)
    path = nginx.root / "gpu-q.gguf"
    packed = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", packed, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _fresh()
    nginx.clear_log()
    remote = lw.load_weights([nginx.url("gpu-q.gguf")])
    plan = lw.plan({"f32": remote["w"].data().dequantize(),
                    "f16": remote["w"].data()[8:40].dequantize(DType.float16)})
    got = materialize_gpu(plan, "gpu:0", backend=NumpyDevice(seed=1), block_bytes=4 << 10, streams=2)
    reference = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(np.asarray(got["f32"]), reference)
    np.testing.assert_array_equal(np.asarray(got["f16"]).view(np.float16), reference[8:40].astype(np.float16))
    assert nginx.bytes_sent() <= path.stat().st_size


# --- bounded memory: the GPU executor streams a remote checkpoint through the budget ------------------------
@pytest.fixture(scope="module")
def big(nginx, write_safetensors):
    """Tensors far larger than what opening a shard fetches (64 KiB): 5.5 MB in all, the embedding 2 MB."""
    folder = nginx.root / "gpu-big"
    _checkpoint(folder, write_safetensors, layers=2, hidden=512, vocab=2000)
    return folder


def _remote_files():
    return list(RemoteFile._cache.values())


def _held_beyond_headers(folder: Path) -> dict:
    """{object: bytes held} for each remote shard holding more than its header (8 + header length: what
    opening keeps); empty when every tensor's bytes were released."""
    out = {}
    for f in _remote_files():
        name = f.path.rsplit("/", 1)[-1]
        if name.endswith(".safetensors"):
            with open(folder / name, "rb") as local:
                header = 8 + int.from_bytes(local.read(8), "little")
            if f.held_bytes() > header:
                out[name] = (f.held_bytes(), header)
    return out


def _release_only_after_the_copy(monkeypatch, want: dict) -> list:
    """Make every `RemoteReads.task_done(block)` (the call that may release the block's remote bytes) first
    check that the block's rows already hold their final bytes `want[name]` on the device; returns the list
    of tensors checked. The fake device runs a copy only when an event or sync asks for it, so a release
    right after the host fill finds the rows unwritten."""
    checked: list = []
    real_done = fetch.RemoteReads.task_done

    def done_after_copy(self, task):
        step, rows, g = task[0], task[1], task[2]
        name = step.outputs[0]
        ref = np.ascontiguousarray(want[name])
        got = np.asarray(g.primary)
        if ref.shape:
            ref, got = ref[rows.start:rows.stop], got[rows.start:rows.stop]
        assert got.tobytes() == ref.tobytes(), f"{name} rows {rows} released before their copy ran"
        checked.append(name)
        real_done(self, task)

    monkeypatch.setattr(fetch.RemoteReads, "task_done", done_after_copy)
    return checked


def test_gpu_load_of_a_remote_checkpoint_holds_at_most_the_budget(nginx, big, monkeypatch):
    """A GPU materialize from a URL with a 1 MB budget never holds more than the budget plus one step (the
    2 MB embedding) of fetched bytes, holds none of the tensors' bytes once done, and equals the CPU executor
    on the local files bit for bit; no block's remote bytes are released before its copy to the device ran."""
    want = lw.plan(_adapted([str(big)])).materialize()
    _fresh()
    plan = lw.plan(_adapted([nginx.url("gpu-big/model.safetensors.index.json")]))
    peak = _watch_held_peak(monkeypatch)
    checked = _release_only_after_the_copy(monkeypatch, want)
    budget = 1 << 20
    backend = NumpyDevice(seed=5)
    got = materialize_gpu(plan, "gpu:0", backend=backend, budget=budget, streams=3)
    largest = 2000 * 512 * 2  # the embedding, the biggest single step
    assert 0 < peak[0] <= budget + largest + 4 * (64 << 10), peak[0]
    checkpoint = sum(os.path.getsize(p) for p in big.glob("*.safetensors"))
    assert peak[0] < 0.75 * checkpoint  # without the releases it would be the whole checkpoint
    assert len(_remote_files()) == 4 and not _held_beyond_headers(big), _held_beyond_headers(big)
    assert set(checked) >= {n for n in want if np.asarray(want[n]).nbytes > 64 << 10}
    assert set(got) == set(want)
    for name, ref in want.items():
        assert _bits(got[name], got.dtypes[name]) == np.ascontiguousarray(ref).tobytes(), name
    assert backend.held == 0


def test_gpu_load_from_a_url_equals_the_gpu_load_of_the_local_file(nginx, big, monkeypatch):
    """The same GPU pipeline on the URL and on the local files, with a budget so small that the RoPE-permuted
    q/k blocks (a head's rows, 128 KiB) exceed a slot and run alone (`_run_solo`): the same bytes, output by
    output, each block's bytes released only after its copy ran, none held afterwards."""
    _fresh()
    budget = 256 << 10
    local = materialize_gpu(lw.plan(_adapted([str(big)])), "gpu:0", backend=NumpyDevice(), budget=budget)
    solo = [g.name for g in compile_gpu_steps(outputs_of(lw.plan(_adapted([str(big)]))), budget=budget).steps
            if g.solo]
    assert len(solo) == 4, solo  # q and k of both layers
    checked = _release_only_after_the_copy(monkeypatch, local)
    remote = materialize_gpu(lw.plan(_adapted([nginx.url("gpu-big/model.safetensors.index.json")])), "gpu:0",
                             backend=NumpyDevice(seed=2), budget=budget)
    assert set(local) == set(remote)
    for name in local:
        assert np.asarray(remote[name]).tobytes() == np.asarray(local[name]).tobytes(), name
    assert set(solo) <= set(checked)
    assert not _held_beyond_headers(big), _held_beyond_headers(big)


class _FailingDevice(NumpyDevice):
    """The fake device whose third kernel launch fails, as a device error would."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.launched = 0

    def run(self, program, src_u8, dst, stream):
        self.launched += 1
        if self.launched == 3:
            raise RuntimeError("the fake device failed this kernel")
        super().run(program, src_u8, dst, stream)


def _run_threads() -> set:
    """The live threads a GPU run starts: its prefetchers and its host readers. (A remote file's own fetch
    pool is the file's, kept while it is cached, and idle between requests.)"""
    return {t for t in threading.enumerate()
            if t.name.startswith(("lazyweights-prefetch-", "lazyweights-gpu-read")) and t.is_alive()}


def test_a_failing_block_stops_the_prefetch_threads(nginx, big):
    """A block that fails mid-run: the error names the tensor, and no thread the run started is left running
    (with a small window the prefetchers would otherwise wait forever for bytes that are never released)."""
    _fresh()
    before = _run_threads()
    plan = lw.plan(_adapted([nginx.url("gpu-big/model.safetensors.index.json")]))
    with pytest.raises(lw.ExecutionError, match=r"computing tensor '.+' \(rows \d+\.\.\d+\) failed: RuntimeError: "
                                                r"the fake device failed this kernel"):
        materialize_gpu(plan, "gpu:0", backend=_FailingDevice(), budget=512 << 10, streams=2)
    assert not _run_threads() - before, _run_threads() - before


@pytest.fixture(scope="module")
def burst(nginx, write_safetensors):
    """A 2 MB bf16 tensor (more than a 1 MB window) first, then eight of 128 KiB, the size of one block on 4
    streams with a 1 MB budget."""
    rng = np.random.default_rng(5)

    def bf(rows):
        return (rng.standard_normal((rows, 512)) + 0.5).astype(np.float32).astype(ml_dtypes.bfloat16)

    path = nginx.root / "gpu-burst.safetensors"
    write_safetensors(path, {"a_big": bf(2048), **{f"b{i}": bf(128) for i in range(8)}})
    return path


def test_the_blocks_in_flight_fetch_within_the_window_too(nginx, burst, monkeypatch):
    """The blocks in flight must not each fetch a tensor beyond the window. The 2 MB tensor (larger than
    the 1 MB window) is released only once its last blocks' copies ran, and the next tensors' first blocks
    are filled (and fetched) while those copies are in flight: without `RemoteReads.admit` they would fetch
    on top of it. Admission drains the blocks in flight first when the window is full, so the big tensor
    and a small one are never held together. The prefetch threads are off here, so the blocks' own fetches
    are all there is and the bound is exact."""
    _fresh()
    remote = lw.load_weights([nginx.url("gpu-burst.safetensors")])
    peak = _watch_held_peak(monkeypatch)
    monkeypatch.setattr(fetch.RemoteReads, "start_prefetch", lambda self, threads=0: None)
    big = 2048 * 512 * 2
    header = 8 + int.from_bytes(burst.read_bytes()[:8], "little")
    plan = lw.plan({name: w.data().astype(DType.float16) for name, w in remote.items()})
    got = materialize_gpu(plan, "gpu:0", backend=NumpyDevice(seed=9), budget=1 << 20, streams=4)
    assert 0 < peak[0] <= header + big, (peak[0], header + big)
    assert [f.held_bytes() for f in _remote_files()] == [header]
    for name, w in lw.load_weights([str(burst)]).items():
        want = w.data().to_numpy().astype(np.float16)
        assert np.asarray(got[name]).tobytes() == want.tobytes(), name
