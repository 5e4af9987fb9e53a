"""A remote load with `cache=DIR` receives each tensor straight into its result, through a small pool of
buffers that the cache's writer writes from (`io/cached_receive.py`), not through the object's map. Judged by
local reads of the same checkpoint (numpy), nginx's byte count and the cache's own files."""
from __future__ import annotations

import json
import os
import time
import types

import ml_dtypes
import numpy as np
import pytest

import lazyweights as lw
from lazyweights.io import cached_receive
from lazyweights.io.cached_receive import WriteBuffers, chunk_pieces
from lazyweights.io.host_cache import _OPEN, CLAIM_CHUNK, HostCache
from lazyweights.io.remote import RemoteFile
from lazyweights.io.transport import Converting, Transient, read_body
from lazyweights.tools import demo as w1

# head_dim 128: q and k are received a row at a time in their RoPE order (a unit of 3072 bytes), and the
# embedding (12 MB) and q (4.7 MB) cross claim-chunk edges at offsets no row boundary meets
CFG = types.SimpleNamespace(num_attention_heads=12, num_key_value_heads=6, hidden_size=1536)


@pytest.fixture(scope="module")
def wide(nginx, write_safetensors):
    """One shard of a Llama-named bf16 checkpoint whose tensors cross the cache's 8 MiB claim chunks."""
    folder = nginx.root / "wide"
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(35)

    def bf(*shape):
        return (rng.standard_normal(shape) * 3 + 0.25).astype(np.float32).astype(ml_dtypes.bfloat16)

    tensors = {"model.embed_tokens.weight": bf(4000, 1536), "model.norm.weight": bf(1536),
               "model.layers.0.input_layernorm.weight": bf(1536),
               "model.layers.0.self_attn.q_proj.weight": bf(1536, 1536),
               "model.layers.0.self_attn.k_proj.weight": bf(768, 1536),
               "model.layers.0.mlp.down_proj.weight": bf(1536, 1100)}
    write_safetensors(str(folder / "model.safetensors"), tensors)
    with open(folder / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": dict.fromkeys(tensors, "model.safetensors")}, f)
    return folder


def _w1(paths, **kw):
    return w1.convert_safetensor_state_dict(dict(lw.load_weights(paths, **kw).items()), huggingface_config=CFG)


def _shards():
    return [f for f in RemoteFile._cache.values() if f.path.endswith(".safetensors")]


def _flush():
    for cache in list(_OPEN):
        assert cache.flush(timeout=60)


def _spy(monkeypatch):
    """Bytes handed to `RemoteFile._receive_through_map`, and the receives made."""
    seen = {"map": 0, "receives": 0}
    through, receive = RemoteFile._receive_through_map, RemoteFile.receive

    def spy_map(self, start, end, ranges, convert, unit):
        seen["map"] += sum(e - s for s, e in ranges)
        return through(self, start, end, ranges, convert, unit)

    def spy_receive(self, *a, **k):
        seen["receives"] += 1
        return receive(self, *a, **k)

    monkeypatch.setattr(RemoteFile, "_receive_through_map", spy_map)
    monkeypatch.setattr(RemoteFile, "receive", spy_receive)
    return seen


def _cache_matches_the_object(cache_dir, local_file) -> int:
    """Every range the cache's log lists holds the object's bytes; returns how many bytes it lists."""
    source = open(local_file, "rb").read()
    stems = [os.path.join(cache_dir, p[:-5]) for p in os.listdir(cache_dir) if p.endswith(".data")]
    stem = max(stems, key=lambda p: os.path.getsize(p + ".data"))  # the shard's (the index is cached too)
    data = open(stem + ".data", "rb").read()
    listed = 0
    for line in open(stem + ".log").read().splitlines():
        s, e = map(int, line.split())
        assert data[s:e] == source[s:e], (s, e)
        listed += e - s
    return listed


def test_a_cached_load_receives_into_the_results_and_fills_the_cache(nginx, wide, tmp_path, monkeypatch):
    RemoteFile._cache.clear()
    cache = str(tmp_path / "cache")
    url = nginx.url("wide/model.safetensors.index.json")
    local = lw.plan(_w1([str(wide)])).materialize()
    seen = _spy(monkeypatch)
    nginx.clear_log()
    got = lw.plan(_w1([url], cache=cache)).materialize()
    _flush()
    for k in local:
        assert np.asarray(got[k]).tobytes() == np.asarray(local[k]).tobytes(), k
    f16 = [k for k, v in local.items() if np.asarray(v).dtype == np.float16]
    assert seen["receives"] == len(f16)  # every cast received straight into its result, q and k too
    # through the map: only the rows a claim chunk's edge cuts (q and k each cross one edge at most)
    assert 0 < seen["map"] <= 4 * 3072, seen["map"]
    (f,) = _shards()
    assert f.held_bytes() <= 64 << 10  # the object's first bytes; nothing received stays in the map
    size = os.path.getsize(wide / "model.safetensors")
    assert nginx.bytes_sent("GET") <= size + 4096, (nginx.bytes_sent("GET"), size)
    assert _cache_matches_the_object(cache, wide / "model.safetensors") >= size - (64 << 10)
    assert cached_receive.WRITE_BUFFERS._out == 0  # every buffer came back from the writer

    # a second process's load: nothing fetched, the same results, from the cache's file
    RemoteFile._cache.clear()
    nginx.clear_log()
    again = lw.plan(_w1([url], cache=cache)).materialize()
    for k in local:
        assert np.asarray(again[k]).tobytes() == np.asarray(local[k]).tobytes(), k
    assert nginx.bytes_sent("GET") == 0, nginx.log()
    (f,) = _shards()
    assert f.bytes_from_cache >= size - (64 << 10)


def test_with_no_pool_buffer_free_the_bytes_go_through_the_map_and_still_reach_the_cache(nginx, wide, tmp_path,
                                                                                       monkeypatch):
    """A writer behind a slow disk holds every buffer: the load does not wait for it, its bytes go through the
    map as before, and the cache still gets them."""
    RemoteFile._cache.clear()
    monkeypatch.setattr(cached_receive, "WRITE_BUFFERS", WriteBuffers(limit=0))
    seen = _spy(monkeypatch)
    cache = str(tmp_path / "cache")
    got = lw.plan(_w1([nginx.url("wide/model.safetensors.index.json")], cache=cache)).materialize()
    _flush()
    local = lw.plan(_w1([str(wide)])).materialize()
    for k in local:
        assert np.asarray(got[k]).tobytes() == np.asarray(local[k]).tobytes(), k
    received = sum(np.asarray(v).nbytes for v in local.values() if np.asarray(v).dtype == np.float16)
    assert seen["map"] >= received
    size = os.path.getsize(wide / "model.safetensors")
    assert _cache_matches_the_object(cache, wide / "model.safetensors") >= size - (64 << 10)


def test_a_receive_of_odd_units_across_chunk_edges_gives_the_bytes_and_caches_them(nginx, tmp_path):
    """`RemoteFile.receive` straight: units of 6 bytes from an odd offset, across three claim chunks; every
    piece handed on is whole units at its offset, and the cache's file gets the bytes."""
    blob = np.random.default_rng(3).integers(0, 256, 3 * CLAIM_CHUNK + 5000, dtype=np.uint8).tobytes()
    with open(nginx.root / "blob.bin", "wb") as fh:
        fh.write(blob)
    RemoteFile._cache.clear()
    f = RemoteFile.open(nginx.url("blob.bin"), None, str(tmp_path / "cache"))
    start, end = 1001, 1001 + 6 * ((2 * CLAIM_CHUNK + 777) // 6)
    out = bytearray(end - start)
    offsets = []

    def convert(piece, offset):
        assert offset % 6 == 0 and len(piece) % 6 == 0, (offset, len(piece))
        offsets.append(offset)
        out[offset:offset + len(piece)] = piece

    f.receive(start, end, memoryview(bytearray(end - start)), convert, 6)
    _flush()
    assert bytes(out) == blob[start:end]
    assert len(offsets) > 3
    cache = HostCache(str(tmp_path / "cache"), f.path, f.size, f.etag)  # as another process would see it
    assert cache.held.missing_many([(start, end)]) == []
    back = bytearray(end - start)
    cache.read_into(memoryview(back), start, end)
    assert bytes(back) == blob[start:end]


@pytest.mark.parametrize("start,unit", [(0, 2), (1, 4), (5, 3072), (CLAIM_CHUNK - 7, 6), (3, 1)])
def test_chunk_pieces_cover_the_ranges_in_whole_units_each_in_one_chunk(start, unit):
    rng = np.random.default_rng(start + unit)
    for _ in range(50):
        cuts = np.sort(rng.choice(np.arange(1, 30_000), 6, replace=False)) * unit  # unit-aligned from start
        ranges = [(start + int(a), start + int(b)) for a, b in zip(cuts[::2], cuts[1::2])]
        ranges = [(s * 1 + (CLAIM_CHUNK // 3) * i, e + (CLAIM_CHUNK // 3) * i) for i, (s, e) in enumerate(ranges)]
        ranges = [(start + (s - start) // unit * unit, start + (e - start) // unit * unit) for s, e in ranges]
        ranges = [(s, e) for s, e in ranges if e > s]
        pieces, rest = chunk_pieces(start, ranges, unit)
        covered = sorted([(s, e) for s, e, _ in pieces] + rest)
        want = np.zeros(ranges[-1][1] + 1, bool)
        for s, e in ranges:
            want[s:e] = True
        have = np.zeros_like(want)
        for s, e in covered:
            assert not have[s:e].any(), "overlap"
            have[s:e] = True
        assert (have == want).all()
        for s, e, c in pieces:
            assert s // CLAIM_CHUNK == c == (e - 1) // CLAIM_CHUNK
            assert (s - start) % unit == 0 and (e - start) % unit == 0
        for s, e in rest:  # a cut unit: one unit, across an edge
            assert e - s == unit and s // CLAIM_CHUNK != (e - 1) // CLAIM_CHUNK


@pytest.mark.parametrize("unit", [1, 2, 6, 3072])
def test_a_kept_converting_body_hands_on_whole_units_and_keeps_every_byte(unit):
    rng = np.random.default_rng(unit)
    body = rng.integers(0, 256, unit * 700, dtype=np.uint8).tobytes()
    sizes = iter(rng.integers(1, 5000, 10_000).tolist())
    pos = [0]

    def read(n):
        k = min(n, next(sizes))
        chunk = body[pos[0]:pos[0] + k]
        pos[0] += len(chunk)
        return chunk

    kept, got = memoryview(bytearray(len(body))), bytearray(len(body))

    def convert(piece, offset):
        assert offset % unit == 0 and len(piece) % unit == 0
        got[offset:offset + len(piece)] = piece

    read_body(read, Converting(convert, len(body), unit, kept))
    assert bytes(kept) == body and bytes(got) == body
    with pytest.raises(ValueError, match="100-byte buffer"):
        Converting(convert, 99, 1, memoryview(bytearray(100)))
    cut = iter([body[:unit * 3 + 1]])
    with pytest.raises(Transient, match=f"truncated body: {unit * 3 + 1} of {len(body)} bytes arrived"):
        read_body(lambda n: next(cut, b""), Converting(convert, len(body), unit, memoryview(bytearray(len(body)))))


def test_the_writer_writes_a_buffer_that_starts_at_another_offset(tmp_path):
    """`publish(..., origin=)`: a pool buffer holds bytes from `origin` on; the cache's file gets them at their
    offsets, the claim is released and `done` runs once written."""
    size = 5 << 20
    data = np.random.default_rng(9).integers(0, 256, size, dtype=np.uint8)
    cache = HostCache(str(tmp_path), "http://example/m", size, '"v"')
    s, e = 123_457, 4_500_001
    buf = cached_receive.WRITE_BUFFERS.take()
    at = s % 4096
    buf[at:at + (e - s)] = data[s:e].tobytes()
    done = []
    assert cache.claim(0)
    cache.publish(buf, [(s, e)], [0], origin=s - at, done=lambda: done.append(True))
    assert cache.flush(timeout=30) and cache.error is None and done == [True]
    cached_receive.WRITE_BUFFERS.give(buf)
    assert open(cache.stem + ".data", "rb").read()[s:e] == data[s:e].tobytes()
    other = HostCache(str(tmp_path), "http://example/m", size, '"v"')
    assert other.held.ranges == [(s, e)] and other.claim(0)  # logged, and the claim was given back


def test_an_object_replaced_before_a_cached_receive_raises_and_leaves_nothing_behind(nginx, tmp_path):
    """The object changes after it was opened: the pool path's request is refused (If-Match), the receive
    raises SourceChangedError naming the URL, every pool buffer comes back, the chunks' claims are released
    and the cache logs none of the new object's bytes as the old one's."""
    from lazyweights.core.errors import SourceChangedError

    old = np.random.default_rng(5).integers(0, 256, 2 * CLAIM_CHUNK, dtype=np.uint8).tobytes()
    path = nginx.root / "replaced.bin"
    path.write_bytes(old)
    RemoteFile._cache.clear()
    f = RemoteFile.open(nginx.url("replaced.bin"), None, str(tmp_path / "cache"))
    time.sleep(1.1)  # nginx's ETag holds the modification time in seconds
    path.write_bytes(old[::-1])
    start, end = 100_000, CLAIM_CHUNK + 500_000
    with pytest.raises(SourceChangedError, match="replaced.bin"):
        f.receive(start, end, memoryview(bytearray(end - start)), lambda piece, offset: None, 2)
    _flush()
    assert cached_receive.WRITE_BUFFERS._out == 0
    other = HostCache(str(tmp_path / "cache"), f.path, f.size, f.etag)  # another process, the old version
    assert other.held.held_many([(start, end)]) == []
    assert other.claim(0) and other.claim(1)  # no claim left behind
