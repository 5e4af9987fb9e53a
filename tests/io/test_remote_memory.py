"""Remote bytes go to memory, not disk; they are released once read; every load revalidates; processes that
share a `cache=` directory fetch each byte once. Judged by nginx's byte count and by local reads."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import types

import ml_dtypes
import numpy as np
import pytest
from test_remote import _checkpoint, _watch_held_peak  # tests/io is on sys.path (pytest's rootdir insertion)

import lazyweights as lw
from lazyweights.core.errors import WriteError
from lazyweights.io import remote
from lazyweights.io.host_cache import HostCache
from lazyweights.io.ranges import RangeSet, plan_requests
from lazyweights.io.remote import RemoteFile
from lazyweights.run import fetch
from lazyweights.run.sinks import MemorySink
from lazyweights.tools import demo as w1

CFG = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=512)


@pytest.fixture(scope="module")
def big(nginx, write_safetensors):
    """A checkpoint whose tensors are larger than what opening a shard fetches (64 KiB)."""
    folder = nginx.root / "big"
    _checkpoint(folder, write_safetensors, layers=2, hidden=512, vocab=2000)
    return folder


def _fresh():
    RemoteFile._cache.clear()


def _w1(paths, **kw):
    return w1.convert_safetensor_state_dict(dict(lw.load_weights(paths, **kw).items()), huggingface_config=CFG)


def _files():
    return list(RemoteFile._cache.values())


# --- memory, not disk --------------------------------------------------------------------------------------
def test_no_disk_file_without_cache_and_casts_receive_into_the_result(nginx, big, monkeypatch):
    """Without cache= nothing is written to disk: a remote object's map is anonymous memory. A cast between
    dtypes of one width (W1's bf16 -> f16) receives its bytes straight into the result and casts there."""
    _fresh()
    received = []
    real = RemoteFile.receive
    monkeypatch.setattr(RemoteFile, "receive",
                        lambda self, s, e, out, *a: (received.append(e - s), real(self, s, e, out, *a)))
    sd = _w1([nginx.url("big/model.safetensors.index.json")])
    got = lw.plan(sd).materialize()
    local = lw.plan(_w1([str(big)])).materialize()
    for k in local:
        assert np.asarray(got[k]).tobytes() == np.asarray(local[k]).tobytes(), k
    f16 = [k for k, v in local.items() if np.asarray(v).dtype == np.float16]
    assert len(received) == len(f16)  # every cast took the direct path, the RoPE-permuted q/k too
    assert _files()
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [p for p in fds if "lazyweights-remote" in p], fds  # no scratch file behind the maps


def test_a_save_releases_what_it_read_and_stays_within_the_budget(nginx, big, tmp_path, monkeypatch):
    """A conversion from a URL holds at most the budget (plus the step in hand) of fetched bytes at any time,
    and nothing once it is done: a remote checkpoint larger than RAM streams through."""
    _fresh()
    sd = _w1([nginx.url("big/model.safetensors.index.json")])
    peak = _watch_held_peak(monkeypatch)
    budget = 1 << 20
    files = lw.plan(sd).save(tmp_path / "out", max_shard_size="1MB", budget=budget)
    largest = 2000 * 512 * 2  # the embedding, the biggest single step
    assert 0 < peak[0] <= budget + largest + 4 * (64 << 10), peak[0]
    assert all(f.held_bytes() <= 64 << 10 for f in _files()), [f.held_bytes() for f in _files()]
    local = lw.plan(_w1([str(big)])).save(tmp_path / "local", max_shard_size="1MB")
    assert [open(a, "rb").read() == open(b, "rb").read() for a, b in zip(sorted(files), sorted(local))] == [True] * len(
        local)


def test_an_array_handed_out_is_never_released(nginx, big):
    """`data().to_numpy()` returns a view of the map: a later run that reads the same tensor must not release
    (zero) the caller's array."""
    _fresh()
    weights = lw.load_weights([nginx.url("big/model.safetensors.index.json")])
    q = weights.model.layers[0].self_attn.q_proj.weight.data().to_numpy()
    before = q.copy()
    lw.plan(_w1([nginx.url("big/model.safetensors.index.json")])).materialize()
    assert q.tobytes() == before.tobytes()
    assert np.count_nonzero(q.view(np.uint16)) > 0.9 * q.size


def _bf16_bits(n: int, seed: int) -> np.ndarray:
    """n bf16 bit patterns: random, with every special value (NaNs of both signs, infinities, zeros,
    subnormals, values f16 cannot hold)."""
    bits = np.random.default_rng(seed).integers(0, 1 << 16, n, dtype=np.uint16)
    bits[:8] = [0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x4780]
    return bits


def test_a_cast_received_in_pieces_equals_astype_from_any_start(nginx):
    """`receive` with `convert`: the bytes of a bf16 run go from the socket through a small buffer, cut
    wherever the socket cuts them, and are cast into the result. The run starts at an odd byte, so the 64 KiB
    the open fetched ends inside an element: that element is fetched again, never cast from half its bytes.
    Judged against ml_dtypes' astype of the same bits, and the bytes served against the run's length."""
    import ml_dtypes

    _fresh()
    n = 300_000  # 600 KB: several pieces of the 1 MiB buffer's worth across the socket
    bits = _bf16_bits(n, 1)
    (nginx.root / "odd.bin").write_bytes(b"\x07" + bits.tobytes() + b"\x09")
    f = RemoteFile(nginx.url("odd.bin"))
    assert f.held_bytes() == 64 << 10  # the open's first bytes: [0, 65536), ending inside element 32767
    nginx.clear_log()
    out = np.empty(n, np.float16)
    convert = fetch._cast_from_pieces(np.dtype(ml_dtypes.bfloat16), out)
    f.receive(1, 1 + 2 * n, out.view(np.uint8).data, convert, 2)
    want = bits.view(ml_dtypes.bfloat16).astype(np.float16)
    assert out.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()
    assert nginx.bytes_sent() == 1 + 2 * n - 65535  # [65535, end): the split element's byte again, nothing else
    # a body that arrives in odd-sized chunks (a stream without readinto): each cut element waits for its rest
    from lazyweights.io.transport import Converting, read_body

    body, sizes = bits.tobytes(), np.random.default_rng(3).integers(1, 50_001, 200)
    chunks = iter([body[a:b] for a, b in zip(np.r_[0, np.cumsum(sizes)], np.cumsum(sizes)) if a < len(body)]
                  + [body[int(np.sum(sizes)):]])
    out2 = np.empty(n, np.float16)
    read_body(lambda k: next(chunks, b""), Converting(fetch._cast_from_pieces(np.dtype(ml_dtypes.bfloat16), out2),
                                                      2 * n, 2))
    assert out2.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()


def test_rows_in_another_order_are_received_into_their_places(nginx, monkeypatch):
    """A cast of a whole tensor whose rows are reordered (W1's RoPE q/k permutation: a take along a leading
    axis) is received straight into the result, each row cast into its place as it arrives: nothing is held
    in the map, each byte is served once, and the result equals numpy's. The 64 KiB the open fetched ends
    inside a row: that row is fetched again, never cast from part of it.
    A transpose (elements move within a row) is not a row order: it goes through the map, equal as well."""
    import ml_dtypes
    from safetensors.numpy import save_file

    _fresh()
    rng = np.random.default_rng(5)
    heads, dim, width = 6, 16, 1000  # rows of 2000 bytes: pieces of the 1 MiB buffer end inside rows
    w = rng.standard_normal((heads * dim, width)).astype(ml_dtypes.bfloat16)
    save_file({"w": w}, str(nginx.root / "rows_order.safetensors"))
    weights = lw.load_weights([nginx.url("rows_order.safetensors")])
    f = _files()[0]
    start = weights.w.data().node.arg.offset
    row = width * 2
    assert start < 64 << 10 < start + w.nbytes and (65536 - start) % row

    def permuted(x):  # interleaved -> half-split rows within each head, as the W1 adapter does
        return x.reshape(heads, dim // 2, 2, width).transpose(0, 2, 1, 3).reshape(heads * dim, width)

    lazy = weights.w.data()
    perm = np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])
    sd = {"q": lazy.reshape(heads, dim, width)[:, perm].reshape(heads * dim, width).astype(lw.DType.float16),
          "t": lazy.transpose(1, 0).astype(lw.DType.float16)}
    held = []
    real = RemoteFile.ensure_ranges
    monkeypatch.setattr(RemoteFile, "ensure_ranges",
                        lambda self, r, within=None: (held.append(list(r)), real(self, r, within)))
    nginx.clear_log()
    got = lw.plan({"q": sd["q"]}).materialize()["q"]
    assert got.tobytes() == permuted(w).astype(np.float16).tobytes()
    assert not held  # received, never fetched into the map
    assert f.held_bytes() == 64 << 10  # still only what the open fetched
    first_missing_row = start + (65536 - start) // row * row  # the row the open's bytes end inside, again
    assert nginx.bytes_sent() == start + w.nbytes - first_missing_row
    got_t = lw.plan({"t": sd["t"]}).materialize()["t"]
    assert got_t.tobytes() == w.T.astype(np.float16).tobytes()
    assert held  # the transpose read its bytes through the map


@pytest.mark.parametrize("dst", ["copy", "f16", "f32-as-u32"])
def test_a_copy_or_a_cast_of_one_width_is_received_in_its_place(nginx, monkeypatch, dst):
    """A copy, or a bf16 -> f16 cast where the kernel may cast onto its own input (`casts_in_place`), is
    received straight into the result and converted there, a piece at a time: the receiving thread's buffer is
    not used. Any other convert (one not marked `in_place`: the raw bytes into a uint32 array here) goes
    through that buffer. Every result equals numpy's."""
    from lazyweights.io import transport
    from lazyweights.kernels.casts import casts_in_place

    _fresh()
    n, start = 400_000, 64 << 10  # past what the open fetched: every received byte comes from the socket
    bits = _bf16_bits(n, 5)
    (nginx.root / "place.bin").write_bytes(bits.tobytes())
    f = RemoteFile(nginx.url("place.bin"))
    rest = bits[start // 2:]
    kept = []
    real_kept = transport._read_converting_kept

    def spy_kept(read, fp, dest):
        kept.append(np.frombuffer(dest.keep, np.uint8).ctypes.data)
        return real_kept(read, fp, dest)

    monkeypatch.setattr(transport, "_read_converting_kept", spy_kept)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    if dst == "copy":
        out = np.empty(rest.size, bf16)
        convert, want, in_place = fetch._copy_from_pieces(out), rest, True
    elif dst == "f16":
        out = np.empty(rest.size, np.float16)
        convert, want = fetch._cast_from_pieces(bf16, out), rest.view(bf16).astype(np.float16)
        in_place = casts_in_place(bf16, np.float16)
    else:
        out = np.empty(rest.size // 2, np.uint32)
        flat = out.view(np.uint8)

        def convert(piece, offset):
            flat[offset:offset + len(piece)] = np.frombuffer(piece, np.uint8)

        want, in_place = rest, False
    view = out.view(np.uint8)
    f.receive(start, 2 * n, view.data, convert, 2)
    assert view.tobytes() == want.tobytes()
    assert f.held_bytes() == 64 << 10  # nothing went through the map
    if in_place:
        assert kept and all(view.ctypes.data <= a < view.ctypes.data + view.nbytes for a in kept), kept
    else:
        assert not kept


def test_a_copy_into_the_callers_buffers_is_received_there(nginx, big, monkeypatch):
    """`materialize(out=...)` of untransformed remote tensors: each is a plain copy received through the warm
    buffer into the caller's array (no map bytes held for it), byte-identical to the local file."""
    _fresh()
    received = []
    real = RemoteFile.receive
    monkeypatch.setattr(RemoteFile, "receive",
                        lambda self, s, e, out, *a: (received.append(e - s), real(self, s, e, out, *a)))
    weights = lw.load_weights([nginx.url("big/model.safetensors.index.json")])
    sd = {k: v.data() for k, v in weights.items()}
    local = lw.plan({k: v.data() for k, v in lw.load_weights([str(big)]).items()}).materialize()
    out = {k: np.full(np.asarray(v).shape, 7, np.asarray(v).dtype) for k, v in local.items()}
    got = lw.plan(sd).materialize(out=out)
    for k in local:
        assert got[k] is out[k] and out[k].tobytes() == np.asarray(local[k]).tobytes(), k
    big_ones = [k for k, v in local.items() if np.asarray(v).nbytes > 64 << 10]
    assert len(received) >= len(big_ones) > 0


class _CutOnce(__import__("http.server").server.BaseHTTPRequestHandler):
    """Serves `body` with ranges; the first ranged GET past the header sends half its bytes and hangs up."""

    body = b""
    cuts: list = []

    def log_message(self, *a):
        pass

    def _missing(self) -> bool:  # nothing beside the file (no config.json)
        if self.path == "/m.safetensors":
            return False
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def do_HEAD(self):
        if not self._missing():
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.send_header("ETag", '"v1"')
            self.end_headers()

    def do_GET(self):
        if self._missing():
            return
        start, end = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
        end = min(end, len(self.body) - 1)
        part = self.body[start:end + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(part)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(self.body)}")
        self.send_header("ETag", '"v1"')
        self.end_headers()
        if start > 0 and not self.cuts:
            self.cuts.append(start)
            self.wfile.write(part[: len(part) // 2 + 1])  # an odd cut: half an element arrived
            self.close_connection = True
            return
        self.wfile.write(part)


def test_a_cast_received_after_a_cut_and_a_retry_is_exact(write_safetensors, tmp_path):
    """A reply cut short mid-element is retried; the retry's bytes start over at the range's first byte and
    are cast again, so the result equals the local cast (no element cast twice, none left raw)."""
    import http.server

    import ml_dtypes

    _fresh()
    bits = _bf16_bits(1 << 16, 2)  # 128 KiB: more than the open fetches
    write_safetensors(tmp_path / "m.safetensors", {"w": bits.view(ml_dtypes.bfloat16)})
    handler = type("H", (_CutOnce,), {"body": (tmp_path / "m.safetensors").read_bytes(), "cuts": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        weights = lw.load_weights([f"http://127.0.0.1:{srv.server_port}/m.safetensors"])
        got = lw.plan({"w": weights.w.data().astype(lw.DType.float16)}).materialize()["w"]
    finally:
        srv.shutdown()
    assert handler.cuts  # the cut happened
    want = bits.view(ml_dtypes.bfloat16).astype(np.float16)
    assert np.asarray(got).view(np.uint16).tobytes() == want.view(np.uint16).tobytes()


# --- runs that share a file ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared(nginx, write_safetensors):
    """One 256 KiB float16 tensor (more than opening fetches) and its URL."""
    folder = nginx.root / "shared"
    folder.mkdir(exist_ok=True)
    t = ((np.arange(1 << 17) % 997) + 1).astype(np.float16)  # no zero anywhere: released pages read as zeros
    write_safetensors(folder / "m.safetensors", {"t": t})
    return nginx.url("shared/m.safetensors"), t


@pytest.mark.parametrize("reader", ["materialize", "data", "record"])
def test_a_run_never_reads_bytes_another_run_released(shared, monkeypatch, reader):
    """Issue 35, one interleaving forced with events: run A fetches the tensor; run B (another thread, the same
    URL, so the same process-wide map) finds it held and fetches nothing; A finishes and releases what it read;
    only then does B read. B must get the tensor's bytes, not the zeros of pages A handed back. B is a run
    (`materialize`), a single-tensor read (`data().to_numpy()`: a zero-copy view, fetched and pinned by
    `fetch_views`) or a record's `array()` (`RemoteFile.view`). The old code (release without leases) fails
    all three."""
    url, t = shared
    _fresh()
    monkeypatch.setattr(fetch.RemoteReads, "start_prefetch", lambda self, threads=4: None)  # fetches by the runs
    a_fetched, b_found, a_finished = threading.Event(), threading.Event(), threading.Event()
    fetched_by_b: list[int] = []
    real_ensure, real_done = RemoteFile.ensure_ranges, fetch.RemoteReads.task_done

    def ensure_ranges(self, ranges, within=None):
        who = threading.current_thread().name
        before = self.bytes_fetched
        real_ensure(self, ranges, within)
        if who == "run-a":
            a_fetched.set()
        elif who != "MainThread" and not who.startswith("lazyweights-open"):  # run B, or a thread it started
            # (`fetch_views`); the open's own threads (`io/remote.open_all`: the shard and its config.json)
            fetched_by_b.append(self.bytes_fetched - before)
            b_found.set()
            assert a_finished.wait(20)  # A releases now, before B reads

    def task_done(self, task):
        if threading.current_thread().name == "run-a":
            assert b_found.wait(20)
        real_done(self, task)

    monkeypatch.setattr(RemoteFile, "ensure_ranges", ensure_ranges)
    monkeypatch.setattr(fetch.RemoteReads, "task_done", task_done)
    wa, wb = lw.load_weights([url]), lw.load_weights([url])
    assert _files() == [RemoteFile.open(url)]  # one map for both
    got, errors = {}, []

    def run_a():
        try:
            got["a"] = lw.plan({"t": wa.t.data().astype(lw.DType.float32)}).materialize(scheduler="sync")["t"]
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            a_finished.set()

    def run_b():
        try:
            if reader == "data":
                got["b"] = wb.t.data().to_numpy().astype(np.float32)
            elif reader == "record":
                got["b"] = wb.t.data().node.arg.array().astype(np.float32)
            else:
                got["b"] = lw.plan({"t": wb.t.data().astype(lw.DType.float32)}).materialize(scheduler="sync")["t"]
        except BaseException as e:  # reported below
            errors.append(e)

    a = threading.Thread(target=run_a, name="run-a")
    a.start()
    assert a_fetched.wait(20)
    b = threading.Thread(target=run_b, name="run-b")
    b.start()
    a.join(30)
    b.join(30)
    assert not errors, errors
    assert fetched_by_b and fetched_by_b[0] == 0  # B found every byte held: the interleaving happened
    want = t.astype(np.float32)
    assert np.asarray(got["a"]).tobytes() == want.tobytes()
    assert np.count_nonzero(np.asarray(got["b"])) == want.size, "run B read bytes run A released"
    assert np.asarray(got["b"]).tobytes() == want.tobytes()


def _only_headers_held(files) -> list:
    """Files that hold a byte outside what opening fetched (the first 64 KiB) and what is pinned, or a lease."""
    return [(f.path, f._have.ranges, f.leased_bytes()) for f in files
            if f.leased_bytes() or RangeSet(f._pinned.ranges + [(0, remote.FIRST_READAHEAD)]).missing_many(
                f._have.ranges)]


def test_concurrent_runs_over_one_url_give_the_local_bytes(nginx, big):
    """Three threads, four rounds each: materializations of overlapping tensor sets over the same URLs, small
    budgets (so every run releases as it goes while the others read), one thread through W1's adapter (its
    casts received into the result, its untouched tensors zero-copy views). Every result is byte-identical to
    the local file's, and afterwards no lease is left and nothing is held but headers and pinned views."""
    _fresh()
    url = nginx.url("big/model.safetensors.index.json")
    local = {k: np.asarray(v.data().to_numpy()).astype(np.float32) for k, v in lw.load_weights([str(big)]).items()}
    local_w1 = {k: np.asarray(v).tobytes() for k, v in lw.plan(_w1([str(big)])).materialize().items()}
    names = sorted(local)
    errors: list = []
    checked = [0]

    def worker(k: int) -> None:
        try:
            for r in range(4):
                if k == 2:
                    got = lw.plan(_w1([url])).materialize(budget=512 << 10)
                    assert {n: np.asarray(v).tobytes() for n, v in got.items()} == local_w1
                else:
                    w = lw.load_weights([url])
                    pick = names[(k + r) % 3::2] + names[:3]  # overlapping subsets, shifting every round
                    sd = {n: w[n].data().astype(lw.DType.float32) for n in pick}
                    got = lw.plan(sd).materialize(budget=(256 << 10) * (k + 2))
                    for n in pick:
                        assert np.asarray(got[n]).tobytes() == local[n].tobytes(), (k, r, n)
                checked[0] += 1
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,), name=f"stress-{k}") for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a run hung"
    assert not errors, errors
    assert checked[0] == 12 and time.monotonic() - start < 120
    assert not _only_headers_held(_files())


@pytest.mark.parametrize("how", ["materialize", "save"])
def test_a_failed_run_leaves_nothing_held_but_headers(nginx, big, tmp_path, monkeypatch, how):
    """A run that fails while its prefetchers have fetched steps ahead (a worker's fetch of the fourth step
    fails, as a dropped connection would after its retries): the error reaches the caller, and the bytes the
    run fetched for steps it never finished are released with its leases (`RemoteReads.stop`). The old code
    kept them in the process-wide map until exit."""
    _fresh()
    url = nginx.url("big/model.safetensors.index.json")
    sd = {n: v.data().astype(lw.DType.float32) for n, v in lw.load_weights([url]).items()}
    real = RemoteFile.ensure_ranges
    calls = [0]

    def ensure_ranges(self, ranges, within=None):
        if threading.current_thread().name.startswith("lazyweights-prefetch"):
            return real(self, ranges, within)
        calls[0] += 1
        if calls[0] == 4:
            deadline = time.monotonic() + 10  # let the prefetchers fetch ahead first
            while sum(f.held_bytes() for f in _files()) < (1 << 20) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sum(f.held_bytes() for f in _files()) >= 1 << 20
            raise lw.RemoteError(f"{self.path}: bytes {ranges[0]}: connection reset (injected)", url=self.path)
        return real(self, ranges, within)

    monkeypatch.setattr(RemoteFile, "ensure_ranges", ensure_ranges)
    with pytest.raises(lw.RemoteError, match="connection reset"):
        if how == "save":
            lw.plan(sd).save(tmp_path / "out", budget=4 << 20, scheduler="sync")
        else:
            lw.plan(sd).materialize(budget=4 << 20, scheduler="sync")
    assert not _only_headers_held(_files())
    assert all(f.held_bytes() <= remote.FIRST_READAHEAD for f in _files()), [f.held_bytes() for f in _files()]


# --- ranges by cost -------------------------------------------------------------------------------------
def test_plan_requests_merges_by_cost_and_packs_multi_range():
    rows = [(i * 4096, i * 4096 + 1024) for i in range(1000)]  # a rank's quarter of each 4 KiB row
    multi = plan_requests(rows, gap=1 << 20, multi_range=True)
    assert sum(e - s for r in multi for s, e in r) == 1000 * 1024  # no gap fetched through: 3 KiB > framing
    assert len(multi) < 10 and all(len(",".join(f"{s}-{e}" for s, e in r)) < 8000 for r in multi)
    single = plan_requests(rows, gap=1 << 20, multi_range=False)  # no multi-range (S3): one request is dearer
    assert single == [[(0, 999 * 4096 + 1024)]]
    assert plan_requests(rows, gap=1024, multi_range=False) == [[r] for r in rows]
    big = plan_requests([(0, 20 << 20)], gap=0, multi_range=True, part_size=8 << 20)
    assert big == [[(0, 8 << 20)], [(8 << 20, 16 << 20)], [(16 << 20, 20 << 20)]]


def test_the_kept_union_of_leases_follows_every_lease_that_comes_and_goes():
    """`_lease_union` is kept between calls and dropped when a lease comes or goes: after any sequence of
    acquires and releases it equals a byte mask of the leases held (counted: a range leased twice stays
    until given back twice)."""
    f = RemoteFile.__new__(RemoteFile)
    f._lock, f._leases, f._union = threading.Lock(), {}, None
    rng = np.random.default_rng(35)
    pool = [(int(s), int(s) + int(n)) for s, n in zip(rng.integers(0, 900, 40), rng.integers(1, 120, 40))]
    held: list = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            r = held.pop(int(rng.integers(len(held))))
            with f._lock:
                f._unlease([r])
        else:
            r = pool[int(rng.integers(len(pool)))]
            f.acquire([r])
            held.append(r)
        mask = np.zeros(1100, bool)
        for s, e in held:
            mask[s:e] = True
        got = np.zeros(1100, bool)
        with f._lock:
            for s, e in f._lease_union().ranges:
                got[s:e] = True
        assert (got == mask).all()


def test_rangeset_remove_and_held():
    r = RangeSet([(0, 100), (200, 300)])
    r.remove(50, 250)
    assert r.ranges == [(0, 50), (250, 300)]
    assert r.held_many([(0, 10), (40, 260)]) == [(0, 10), (40, 50), (250, 260)]
    assert r.missing_many([(0, 10), (40, 260)]) == [(50, 250)]


def test_rangeset_remove_and_remove_many_equal_a_byte_mask():
    """`remove` (one range, touching only its neighbours) and `remove_many` (one sweep) against a numpy byte
    mask, on random held and released ranges (overlapping, adjacent, empty, past the ends)."""
    rng = np.random.default_rng(5)
    for trial in range(200):
        held = [tuple(sorted(rng.integers(0, 500, 2))) for _ in range(rng.integers(0, 30))]
        gone = [tuple(sorted(rng.integers(-20, 520, 2))) for _ in range(rng.integers(0, 30))]
        mask = np.zeros(540, bool)
        for s, e in held:
            mask[s:e] = True
        for s, e in gone:
            mask[max(s, 0):max(e, 0)] = False
        want = RangeSet([(int(i), int(i) + 1) for i in np.flatnonzero(mask)]).ranges
        one, many = RangeSet(held), RangeSet(held)
        for s, e in gone:
            one.remove(int(s), int(e))
        many.remove_many([(int(s), int(e)) for s, e in gone])
        assert one.ranges == want and many.ranges == want, (trial, held, gone)


# --- never a stale model ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cached", [False, True])
def test_a_reload_after_the_object_changed_gets_the_new_bytes(nginx, write_safetensors, tmp_path, cached):
    """Two loads in one process, the object replaced between them: the second load gets the new bytes
    (revalidated with a request), with or without cache=; the first load's handle keeps what it holds and
    raises SourceChangedError where it must fetch."""
    folder = nginx.root / f"reload{int(cached)}"
    folder.mkdir()
    path = folder / "m.safetensors"
    n = 1 << 16  # 256 KiB of float32: more than opening fetches
    write_safetensors(path, {"a": np.arange(n, dtype=np.float32), "b": np.arange(n, dtype=np.float32) * 3})
    kw = {"cache": str(tmp_path / "cache")} if cached else {}
    url = nginx.url(f"reload{int(cached)}/m.safetensors")
    first = lw.load_weights([url], **kw)
    assert first.a.data().to_numpy()[7] == 7
    time.sleep(1.1)  # nginx's ETag is mtime-size
    write_safetensors(path, {"a": np.arange(n, dtype=np.float32) + 1, "b": np.arange(n, dtype=np.float32) - 1})
    nginx.clear_log()
    second = lw.load_weights([url], **kw)  # no _fresh(): the same process, the same cached RemoteFile key
    assert second.a.data().to_numpy()[7] == 8 and second.b.data().to_numpy()[7] == 6
    assert ("HEAD", f"/reload{int(cached)}/m.safetensors", 200, 0) in nginx.log() or cached is False
    assert first.a.data().to_numpy()[7] == 7  # the old handle's snapshot, never mixed
    with pytest.raises(lw.SourceChangedError, match="m.safetensors: the object changed"):
        lw.plan({"b": first.b.data()}).materialize()


def test_a_reload_of_an_unchanged_object_refetches_nothing(nginx, big):
    _fresh()
    url = nginx.url("big/model.safetensors.index.json")
    first = lw.load_weights([url])
    q = first.model.layers[1].self_attn.q_proj.weight.data().to_numpy()
    nginx.clear_log()
    again = lw.load_weights([url])
    q2 = again.model.layers[1].self_attn.q_proj.weight.data().to_numpy()
    assert q2.tobytes() == q.tobytes()
    assert nginx.bytes_sent("GET") <= 2000  # the index only; each shard: one HEAD, and the tensor is held
    assert sum(1 for m, *_ in nginx.log() if m == "HEAD") >= 2


# --- one fetch per host ------------------------------------------------------------------------------------
PROCESS = textwrap.dedent("""
    import sys, json, hashlib, numpy as np, lazyweights as lw, types
    from lazyweights.tools import demo as w1
    url, cache = sys.argv[1], sys.argv[2]
    cfg = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=512)
    sd = w1.convert_safetensor_state_dict(dict(lw.load_weights([url], cache=cache).items()), huggingface_config=cfg)
    out = lw.plan(sd).materialize()
    print(json.dumps({k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in out.items()}))
""")


def _digests(plan_out):
    import hashlib

    return {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in plan_out.items()}


def test_four_processes_sharing_a_cache_fetch_the_checkpoint_once(nginx, big, tmp_path):
    cache = str(tmp_path / "cache")
    url = nginx.url("big/model.safetensors.index.json")
    local = _digests(lw.plan(_w1([str(big)])).materialize())
    nginx.clear_log()
    procs = [subprocess.Popen([sys.executable, "-c", PROCESS, url, cache], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1]) == local
    checkpoint = sum(os.path.getsize(p) for p in big.glob("*.safetensors"))
    assert nginx.bytes_sent("GET") <= 1.05 * checkpoint + 4 * 2000, (nginx.bytes_sent("GET"), checkpoint,
                                                                      nginx.overfetched())


def test_a_claim_of_a_dead_process_or_an_expired_one_is_broken(tmp_path):
    cache = HostCache(str(tmp_path), "http://x/m", 100 << 20, '"e"', claim_ttl=0.5)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.makedirs(cache._claims, exist_ok=True)
    with open(os.path.join(cache._claims, "0"), "w") as f:  # a process killed while it held chunk 0
        f.write(f"{os.uname().nodename} {dead.pid} {time.time():.3f}\n")
    with open(os.path.join(cache._claims, "1"), "w") as f:  # another host's claim, not yet expired
        f.write(f"elsewhere 1 {time.time():.3f}\n")
    assert cache.claim(0)
    assert not cache.claim(1)
    time.sleep(0.6)
    assert cache.claim(1)  # expired


def test_the_cache_writer_stops_when_idle_and_the_files_close_with_the_cache(tmp_path):
    """The writer thread ends once it has nothing to write (a publish starts another), so a cache nobody
    uses any more is collected and its two descriptors closed: a process that loads many URLs keeps
    neither threads nor files for them."""
    from lazyweights.io import host_cache

    def writers():
        return [t for t in threading.enumerate() if t.name == "lazyweights-cache"]

    before = len(writers())
    cache = HostCache(str(tmp_path), "http://x/m", 1 << 20, '"e"')
    payload = memoryview(bytes(range(256)) * 4096)
    for rnd in range(2):  # the second publish comes after the first writer stopped: it must start a new one
        assert cache.claim(0)
        cache.publish(payload, [(rnd * 1000, rnd * 1000 + 500)], [0])
        cache.flush()
        deadline = time.monotonic() + 10 * host_cache.WRITER_LINGER + 5
        while len(writers()) > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(writers()) == before, writers()
    assert cache.held.ranges == [(0, 500), (1000, 1500)]
    with open(cache.stem + ".data", "rb") as f:
        data = f.read()
    assert data[1000:1500] == payload[1000:1500] and data[:500] == payload[:500]
    fds = (cache._data, cache._log)
    assert all(os.fstat(fd) for fd in fds)
    del cache
    gc.collect()
    for fd in fds:  # (nothing in between opens a file: the numbers cannot have been reused)
        with pytest.raises(OSError):
            os.fstat(fd)


def test_threads_of_one_process_share_its_claims_and_the_last_release_frees_the_chunk(tmp_path):
    """A chunk this process claimed is claimed again at once by its other threads (they fetch other bytes of
    it side by side; waiting made a first cached load wait for the cache's disk writes: 5.7 s against 4.3 s
    for W1). Another process sees the chunk claimed until the last hold is given back. A broken cache, which
    claims nothing, releases nothing: it never removes another process's claim."""
    ours = HostCache(str(tmp_path), "http://x/m", 100 << 20, '"e"')
    other = HostCache(str(tmp_path), "http://x/m", 100 << 20, '"e"')  # as another process would see it
    assert ours.claim(3) and ours.claim(3)
    assert not other.claim(3)
    ours.unclaim([3])
    assert not other.claim(3)  # one hold is left
    ours.unclaim([3])
    assert other.claim(3)
    broken = HostCache(str(tmp_path), "http://x/m", 100 << 20, '"e"')
    broken.error = WriteError("full disk", path=str(tmp_path))
    assert broken.claim(3)  # fetches for itself...
    broken.unclaim([3])
    assert not ours.claim(3)  # ...and leaves the other's claim in place


def test_a_process_that_exits_after_its_load_still_completes_the_cache(tmp_path):
    """The writer is a daemon thread: a process that ends right after its load would stop it mid-queue, and
    the next process would fetch those bytes again. At exit, what is queued is written (and the claims go)."""
    script = textwrap.dedent("""
        import sys, time
        from lazyweights.io.host_cache import HostCache
        cache = HostCache(sys.argv[1], "http://x/m", 1 << 20, '"e"')
        assert cache.claim(0)
        cache.after_writes(lambda: time.sleep(0.5))  # the writer is busy when the process ends
        cache.publish(memoryview(bytes(range(256)) * 4096), [(0, 4096)], [0])
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    after = HostCache(str(tmp_path), "http://x/m", 1 << 20, '"e"')
    assert after.held.ranges == [(0, 4096)]
    assert after.claim(0)  # released


def test_a_stuck_cache_writer_does_not_hang_the_exit(tmp_path):
    """The wait at exit is bounded (`EXIT_FLUSH_SECONDS`): a disk that never answers (here, a writer busy for
    60 s) costs the next process a fetch, never a process that cannot end."""
    script = textwrap.dedent("""
        import sys, time
        from lazyweights.io import host_cache
        host_cache.EXIT_FLUSH_SECONDS = 0.3
        cache = host_cache.HostCache(sys.argv[1], "http://x/m", 1 << 20, '"e"')
        cache.after_writes(lambda: time.sleep(60))
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - started < 30
    assert "exiting with writes still queued" in done.stderr


def _blob(nginx, name: str, size: int) -> tuple[str, bytes]:
    data = np.random.default_rng(11).integers(1, 255, size, dtype=np.uint8).tobytes()  # no zero: a lost page shows
    (nginx.root / name).write_bytes(data)
    return nginx.url(name), data


def test_the_gaps_a_fetch_goes_through_reach_the_shared_cache(nginx, tmp_path):
    """A fetch through a gap publishes the gap too (another process may wait for exactly those bytes), and the
    gap's pages, held by no one, go back once the writer has written them."""
    _fresh()
    url, data = _blob(nginx, "gapped.bin", 1 << 20)
    f = RemoteFile(url, cache=str(tmp_path))
    pieces = [(0, 1000), (5000, 6000), (15_000, 16_000)]  # gaps under a multi-range part's break-even
    f.ensure_ranges(pieces)
    assert f.bytes_fetched == 16_000  # one range, through both gaps
    f._host.flush()
    other = HostCache(str(tmp_path), url, f.size, f.etag)  # what another process on the host sees
    assert other.held.ranges == [(0, 16_000)]
    out = bytearray(16_000)
    other.read_into(memoryview(out), 0, 16_000)
    assert bytes(out) == data[:16_000]
    assert f._have.ranges == pieces and not f._unwritten  # the gaps are no one's here...
    assert _resident(f) == 3 * remote.PAGE  # ...and their page (8-12 KB) went back: the pieces' 3 stay


def test_a_fetch_never_goes_through_a_chunk_another_process_claimed(nginx, tmp_path, monkeypatch):
    """Pieces in chunks 0 and 2, with chunk 1 claimed by another process: two requests, none through chunk 1
    (its bytes are that process's to fetch; through it, the host would fetch them twice)."""
    _fresh()
    monkeypatch.setattr(remote, "CLAIM_CHUNK", 4096)
    url, data = _blob(nginx, "fenced.bin", 1 << 20)
    f = RemoteFile(url, cache=str(tmp_path))
    elsewhere = HostCache(str(tmp_path), url, f.size, f.etag)
    assert elsewhere.claim(1)
    pieces = [(1000, 2000), (9000, 10_000)]  # chunks 0 and 2: a 7 KB gap, which the plan would take
    nginx.clear_log()
    f.ensure_ranges(pieces)
    assert f.bytes_fetched == 2000, f.bytes_fetched
    assert bytes(f._buffer[1000:2000]) == data[1000:2000] and bytes(f._buffer[9000:10_000]) == data[9000:10_000]
    f._host.flush()
    assert HostCache(str(tmp_path), url, f.size, f.etag).held.ranges == pieces


def test_a_fetch_never_goes_through_bytes_the_cache_holds(nginx, tmp_path, monkeypatch):
    """Pieces on both sides of bytes another process has written to the cache: two requests, not one through
    them (the host would fetch those bytes twice)."""
    _fresh()
    url, data = _blob(nginx, "cached-gap.bin", 1 << 20)
    f = RemoteFile(url, cache=str(tmp_path))
    elsewhere = HostCache(str(tmp_path), url, f.size, f.etag)
    elsewhere.publish(memoryview(data), [(3000, 8000)], [])
    assert elsewhere.flush(timeout=30)
    pieces = [(1000, 2000), (9000, 10_000)]  # a 7 KB gap, which the plan would take, holding cached bytes
    f.ensure_ranges(pieces)
    assert f.bytes_fetched == 2000, f.bytes_fetched
    assert bytes(f._buffer[1000:2000]) == data[1000:2000] and bytes(f._buffer[9000:10_000]) == data[9000:10_000]


def test_a_process_killed_mid_range_does_not_stall_the_others(nginx, big, tmp_path):
    """A process that claimed chunks and was killed before writing them: another process with the same cache
    breaks its claims and completes, byte-identical."""
    cache = str(tmp_path / "cache")
    url = nginx.url("big/model.safetensors.index.json")
    hold = textwrap.dedent("""
        import sys, time, lazyweights as lw
        from lazyweights.io.remote import RemoteFile
        from lazyweights.io.host_cache import CLAIM_CHUNK, HostCache
        lw.load_weights([sys.argv[1]])  # (no cache: only to learn each object's length and ETag)
        for f in list(RemoteFile._cache.values()):  # claim every chunk of every object, fetch none of them
            held = HostCache(sys.argv[2], f.path, f.size, f.etag)
            assert all(held.claim(c) for c in range(f.size // CLAIM_CHUNK + 1))
        print("claimed", flush=True)
        time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", hold, url, cache], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "claimed"
    holder.kill()
    holder.wait()
    done = subprocess.run([sys.executable, "-c", PROCESS, url, cache], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == _digests(lw.plan(_w1([str(big)])).materialize())


def test_a_full_disk_under_the_cache_warns_and_the_load_completes(nginx, big, tmp_path):
    """RLIMIT_FSIZE makes every write past 4 KiB fail (EFBIG), as a full disk would: the run warns with a
    CacheWriteWarning naming the cache and still gives the right bytes, from memory."""
    cache = str(tmp_path / "cache")
    url = nginx.url("big/model.safetensors.index.json")
    script = textwrap.dedent("""
        import resource, signal, sys, warnings
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        warnings.simplefilter("always")
    """) + PROCESS.replace("out = lw.plan(sd).materialize()", """with warnings.catch_warnings(record=True) as caught:
    out = lw.plan(sd).materialize()
print("WARNED", [str(w.message) for w in caught if w.category.__name__ == "CacheWriteWarning"], file=sys.stderr)""")
    done = subprocess.run([sys.executable, "-c", script, url, cache], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == _digests(lw.plan(_w1([str(big)])).materialize())
    warned = [line for line in done.stderr.splitlines() if line.startswith("WARNED")]
    assert warned and f"cache {cache}: cannot write" in warned[0], done.stderr[-2000:]


def test_remote_reads_prefetch_waits_for_the_window():
    """The prefetcher never holds more than the window (plus one step) of map bytes: a unit test of the
    bookkeeping with fake files."""

    class File:  # holds ranges the way RemoteFile does: a held range is not fetched again
        def __init__(self):
            self.have, self.released, self.peak = RangeSet(), [], 0

        @property
        def held(self):
            return self.have.total()

        def ensure_ranges(self, ranges, within=None):
            self.have.add_many(ranges)
            self.peak = max(self.peak, self.held)

        def acquire(self, ranges):  # leases: counted by the real RemoteFile; here only their order matters
            pass

        def release(self, ranges):
            for s, e in ranges:
                self.have.remove(s, e)
            self.released += ranges

    f = File()

    class Rec:
        def __init__(self, i):
            self.file, self.offset, self.nbytes, self.name = f, i * 100, 100, f"t{i}"

    class Step:
        def __init__(self, i):
            self.sources, self.node = [Rec(i)], i

    steps = [Step(i) for i in range(10)]
    tasks = [(s, range(1), None, {}) for s in steps]
    orig_ranges, orig_remote = fetch.remote_ranges, fetch.is_remote_record
    fetch.remote_ranges = lambda node: {f: [(node * 100, node * 100 + 100)]}
    fetch.is_remote_record = lambda r: True
    try:
        reads = fetch.RemoteReads(tasks, window=250)
        reads.attach(tasks)
        reads.start_prefetch()
        time.sleep(0.3)
        assert f.held <= 300  # two or three steps ahead, then it waits
        for t in tasks:
            fetch.fetch_step_sources(t[0], t[3])
            reads.task_done(t)
        reads.stop()
        assert f.held == 0 and f.peak <= 350
        assert sorted(f.released) == [(i * 100, i * 100 + 100) for i in range(10)]
    finally:
        fetch.remote_ranges, fetch.is_remote_record = orig_ranges, orig_remote


def test_remote_reads_admit_drains_the_blocks_in_flight_when_the_window_is_full():
    """`admit` (the GPU executor's call before a block's step is read): a step no prefetcher reserved is
    reserved in the window; when it does not fit, `drain` is called once first (it finishes the blocks in
    flight, whose `task_done` releases their bytes), so at most the window plus one step is ever held. Fake
    files, no prefetch threads: the bookkeeping alone."""

    class File:
        def __init__(self):
            self.have, self.peak = RangeSet(), 0

        def ensure_ranges(self, ranges, within=None):
            self.have.add_many(ranges)
            self.peak = max(self.peak, self.have.total())

        def acquire(self, ranges):
            pass

        def release(self, ranges):
            for s, e in ranges:
                self.have.remove(s, e)

    f = File()

    class Rec:
        def __init__(self, i):
            self.file, self.offset, self.nbytes, self.name = f, i * 100, 100, f"t{i}"

    class Step:
        def __init__(self, i):
            self.sources, self.node = [Rec(i)], i

    tasks = [(Step(i), range(1), None, {}) for i in range(8)]
    orig_ranges, orig_remote = fetch.remote_ranges, fetch.is_remote_record
    fetch.remote_ranges = lambda node: {f: [(node * 100, node * 100 + 100)]}
    fetch.is_remote_record = lambda r: True
    try:
        reads = fetch.RemoteReads(tasks, window=250)
        reads.attach(tasks)
        in_flight, drains = [], []

        def drain():
            drains.append(len(in_flight))
            while in_flight:
                reads.task_done(in_flight.pop(0))

        for t in tasks:  # the GPU loop: admit, read (fetch), and the block completes later
            reads.admit(t[0], drain)
            fetch.fetch_step_sources(t[0], t[3])
            in_flight.append(t)
            assert f.have.total() <= 250 + 100
        reads.admit(tasks[-1][0], drain)  # already admitted: nothing happens
        drain()
        reads.stop()
        assert drains[:-1] == [2, 2, 2], drains  # two steps fit the window; the third drains them
        assert f.peak <= 250 and f.have.total() == 0  # here the window is never passed: 100-byte steps
    finally:
        fetch.remote_ranges, fetch.is_remote_record = orig_ranges, orig_remote


def test_options_reach_the_files_and_no_etag_means_no_shared_cache():
    assert remote.current_options() == ({}, None)
    with remote.remote_options({"timeout": 3}, "~/x"):
        opts, cache = remote.current_options()
        assert opts == {"timeout": 3} and cache == os.path.expanduser("~/x")


# --- pages: strided slices go back whole, big fetches may take huge pages ------------------------------------
def _resident_pages(f) -> np.ndarray:
    """One bool per page of `f`'s map: whether the kernel holds it in memory (mincore), whatever `f` believes."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    pages = -(-f.size // mmap.PAGESIZE)
    vec = np.zeros(pages, np.uint8)
    assert libc.mincore(f._buffer.ctypes.data, f.size, vec.ctypes.data) == 0, ctypes.get_errno()
    return (vec & 1).astype(bool)


def _resident(f) -> int:
    """Bytes of `f`'s map the kernel holds in memory (mincore, page by page), whatever `f` believes it holds."""
    return int(_resident_pages(f).sum()) * remote.PAGE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore over an anonymous map")
def test_a_release_gives_its_runs_pages_back_in_one_span_and_keeps_every_held_byte(nginx, big, monkeypatch):
    """A rank's exact row runs, one in each page: released, their pages go back as one span (one madvise, not
    one per run; they were thousands, under the file's lock). Runs another reader still leases, on the pages
    in between, keep their pages and their bytes."""
    _fresh()
    shard = sorted(big.glob("*.safetensors"))[1]
    local = shard.read_bytes()
    f = RemoteFile.open(nginx.url(f"big/{shard.name}"), {"part_cost": 0}, None)
    P, first = remote.PAGE, remote.FIRST_READAHEAD // remote.PAGE + 4
    assert (first + 64) * P < len(local)
    runs = [((first + k) * P + 100, (first + k) * P + 1100) for k in range(64)]
    mine, other = runs[0::2], runs[1::2]
    f.acquire(runs)
    f.ensure_ranges(runs)
    assert _resident_pages(f)[first:first + 64].all()
    spans = []
    real = RemoteFile._unneeded_pages
    monkeypatch.setattr(RemoteFile, "_unneeded_pages", lambda self, *a: spans.append(real(self, *a)) or spans[-1])

    f.release(mine)
    resident = _resident_pages(f)[first:first + 64]
    assert not resident[0::2].any() and resident[1::2].all()
    assert all(f.read(s, e - s) == local[s:e] for s, e in other)  # (a view would pin them for good)
    assert f._have.held_many(other) == other and f._have.held_many(mine) == []

    spans.clear()
    f.release(other)  # nothing in between is held any more: every page of the runs goes back in one span
    assert spans == [[((first + 1) * P, (first + 64) * P)]], spans
    assert not _resident_pages(f)[first:first + 64].any()


def _vmas(f) -> list[tuple[int, int, list[str]]]:
    """[(first offset, end offset, VmFlags), ...]: the VMAs of /proc/self/smaps over `f`'s map (clipped to it;
    the kernel may merge a map with its neighbours, so flags, not sizes, are what to read here)."""
    base = f._buffer.ctypes.data
    end = base + f.size
    vmas, cur = [], None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and ":" not in head[0]:  # a VMA's first line: "lo-hi perms offset ..."
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                cur = (max(lo, base) - base, min(hi, end) - base) if lo < end and hi > base else None
            elif cur is not None and head[0] == "VmFlags:":
                vmas.append((cur[0], cur[1], head[1:]))
    return vmas


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore over an anonymous map")
@pytest.mark.parametrize("plan_by", ["gaps", "exact"])
def test_a_rank_slice_gives_its_pages_back(nginx, big, plan_by):
    """Rank 0 of 4 of a row-parallel matrix is a short run per row, none of them a whole page.
    - On loopback the cost model fetches the gaps between them too ("gaps"). Those gaps lie inside the record
      the run leases, so they are held with it and released with it. (Before, only the runs counted as held:
      no page lay inside one, so no page was ever given back.)
    - Priced for a slow link (`part_cost=0` here: "exact") only the runs are fetched. Released, each leaves
      its pages holding nothing anyone needs, and they go back although no run covers a page.
    Afterwards the maps keep only the opens' first bytes and a page or two per tensor."""
    _fresh()
    url = nginx.url("big/model.safetensors.index.json")
    options = {"part_cost": 0} if plan_by == "exact" else {}
    got = lw.plan(lw.shard(_w1([url], storage_options=options), 0, 4)).materialize()
    local = lw.plan(lw.shard(_w1([str(big)]), 0, 4)).materialize()
    assert {k: np.asarray(v).tobytes() for k, v in got.items()} == {k: np.asarray(v).tobytes()
                                                                     for k, v in local.items()}
    files = _files()
    gaps = sum(f.bytes_fetched for f in files) - sum(np.asarray(v).nbytes for v in got.values())
    if plan_by == "gaps":
        assert gaps > 1 << 20  # the down_proj slices' gaps were fetched (what this case is about)
    else:
        assert gaps < 1 << 20  # only the runs (and the headers, and the replicated tensors' exact bytes)
    assert not _only_headers_held(files)
    rss = sum(_resident(f) for f in files)
    tensors = len(dict(lw.load_weights([url]).items()))
    assert rss <= len(files) * remote.FIRST_READAHEAD + tensors * 2 * remote.PAGE, (rss, gaps)


@pytest.mark.skipif(getattr(__import__("mmap"), "MADV_HUGEPAGE", None) is None or not sys.platform.startswith("linux"),
                    reason="MADV_HUGEPAGE and /proc/self/smaps")
def test_a_big_fetch_into_the_map_may_take_huge_pages_a_small_one_never(nginx, write_safetensors):
    """The whole 2 MB pages inside a fetch of at least 4 MB are advised for huge pages (one fault per 2 MB);
    the open's first bytes and a small tensor are not, so a small read never takes 2 MB of memory."""
    folder = nginx.root / "hugepages"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(3)
    write_safetensors(str(folder / "model.safetensors"),
                      {"a.small": rng.standard_normal(3000).astype(np.float32),
                       "b.big": rng.standard_normal((1536, 2048)).astype(np.float32)})  # 12 MB
    _fresh()
    w = lw.load_weights([nginx.url("hugepages/model.safetensors")])
    (f,) = _files()
    small, big_ = w["a.small"].data().node.arg, w["b.big"].data().node.arg
    f.ensure_ranges([(small.offset, small.offset + small.nbytes)])
    f.ensure_ranges([(big_.offset, big_.offset + big_.nbytes)])
    assert f.held_bytes() >= big_.nbytes
    vmas = _vmas(f)
    advised = [(lo, hi) for lo, hi, flags in vmas if "hg" in flags]
    assert advised, vmas
    assert all(big_.offset <= lo and hi <= big_.offset + big_.nbytes for lo, hi in advised), (advised, vmas)
    assert sum(hi - lo for lo, hi in advised) >= big_.nbytes - 2 * remote.HUGE_PAGE
    assert np.frombuffer(f._mem[big_.offset:big_.offset + big_.nbytes], np.float32).tobytes() == \
        np.asarray(w["b.big"].data().to_numpy()).tobytes()


def test_a_record_released_while_another_run_receives_from_it_goes_when_the_receive_ends(nginx, big):
    """Run A fetched a record into the map and releases it while run B is receiving from it (a cast straight
    into B's result, copying what the map holds). B's lease keeps the bytes while B reads; when B's receive
    ends they go. Before, they stayed held for good with no lease (found with 3 prefetch threads: the
    concurrent-runs test above failed 2 times in 30)."""
    _fresh()
    w = lw.load_weights([nginx.url("big/model.safetensors.index.json")])
    rec = w["model.embed_tokens.weight"].data().node.arg
    f, span = rec.file, [(rec.offset, rec.offset + rec.nbytes)]
    f.acquire(span)  # run A: lease, fetch into the map
    f.ensure_ranges(span, within=span)
    assert f.held_bytes() >= rec.nbytes
    out = np.empty(rec.nbytes, np.uint8)
    during = []

    def convert(piece, offset):  # run B copies from the map; run A releases meanwhile
        if not during:
            f.release(span)
            during.append(f.held_bytes())
        out[offset:offset + len(piece)] = np.frombuffer(piece, np.uint8)

    f.receive(span[0][0], span[0][1], memoryview(out), convert, 1)
    assert during[0] >= rec.nbytes  # kept while B read
    local = lw.load_weights([str(big)])["model.embed_tokens.weight"].data().to_numpy()
    assert out.tobytes() == np.asarray(local).tobytes()
    assert f.held_bytes() <= remote.FIRST_READAHEAD and not f.leased_bytes(), f._have.ranges


def test_the_prefetchers_take_the_largest_received_tensor_first(nginx, write_safetensors, monkeypatch):
    """Tensors received straight into their outputs (casts here) are prefetched largest first, whatever the
    step order: the largest one, last in the file, no longer ends the load as the only request in flight.
    The results are the casts numpy makes."""
    folder = nginx.root / "largest-first"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    tensors = {f"{name}.weight": (rng.standard_normal(shape) + 0.5).astype(np.float32).astype(ml_dtypes.bfloat16)
               for name, shape in [("a", (64, 64)), ("b", (256, 256)), ("c", (128, 64)), ("z", (512, 512))]}
    write_safetensors(str(folder / "model.safetensors"), tensors)
    _fresh()
    taken: list[str] = []  # the steps in the order the prefetcher takes them (one prefetch thread: no race)
    real_start, real_prefetch = fetch.RemoteReads.start_prefetch, fetch.RemoteReads._prefetch

    def prefetch(self, order):
        def tap():
            for step in order:
                taken.append(step.outputs[0])
                yield step
        return real_prefetch(self, tap())

    monkeypatch.setattr(fetch.RemoteReads, "start_prefetch", lambda self: real_start(self, 1))
    monkeypatch.setattr(fetch.RemoteReads, "_prefetch", prefetch)
    w = lw.load_weights([nginx.url("largest-first/model.safetensors")])
    got = lw.plan({k: w[k].data().astype(lw.DType.float16) for k in tensors}).materialize()
    for k, v in tensors.items():
        assert np.asarray(got[k]).tobytes() == v.astype(np.float32).astype(np.float16).tobytes(), k
    # (the run may end, and stop the prefetcher, before it takes the last)
    assert taken and taken == ["z.weight", "b.weight", "c.weight", "a.weight"][:len(taken)], taken


@pytest.fixture(scope="module")
def deep(nginx, write_safetensors):
    """`big` with 6 layers: six 1 MB down_proj matrices, each a row-parallel slice for a rank."""
    folder = nginx.root / "deep"
    _checkpoint(folder, write_safetensors, layers=6, hidden=512, vocab=2000)
    return folder


def test_a_rank_fetched_through_its_gaps_stays_within_the_budget(nginx, deep, monkeypatch):
    """A row-parallel slice fetched through its gaps holds its whole matrix in the map until released, so the
    window counts what the fetch brings in (the slice's runs and the gaps between them), not the runs alone:
    rank 0 of 4 with a 1 MiB budget, one worker and prefetchers running ahead of it, never holds more than the
    budget plus the step in hand. (Counting the runs, the window let four 1 MB matrices in at once.)"""
    _fresh()
    sd = lw.shard(_w1([nginx.url("deep/model.safetensors.index.json")]), 0, 4)
    peak = _watch_held_peak(monkeypatch)
    real_block = MemorySink.run_block
    # a slow worker, so the prefetchers run as far ahead as the window lets them
    monkeypatch.setattr(MemorySink, "run_block", lambda self, task: (time.sleep(0.03), real_block(self, task))[1])
    budget = 1 << 20
    got = lw.plan(sd).materialize(budget=budget, workers=1)
    largest = 512 * 1024 * 2  # a down_proj, fetched whole through its gaps: the biggest step's bytes
    assert 0 < peak[0] <= budget + largest + 4 * remote.FIRST_READAHEAD, peak[0]
    local = lw.plan(lw.shard(_w1([str(deep)]), 0, 4)).materialize()
    assert {k: np.asarray(v).tobytes() for k, v in got.items()} == {k: np.asarray(v).tobytes()
                                                                     for k, v in local.items()}


def test_results_of_a_remote_load_are_faulted_in_at_once_a_local_loads_are_not(nginx, big, monkeypatch):
    """A remote load writes its results over seconds, as bytes arrive: they are faulted in up front, from another
    thread (`run/prefault.py`). A local load writes them at memory speed, and is left alone."""
    from lazyweights.run import sinks

    seen: list[list[int]] = []
    real = sinks.prefault_in_background
    monkeypatch.setattr(sinks, "prefault_in_background",
                        lambda arrays: seen.append([a.nbytes for a in arrays]) or real(arrays))
    _fresh()
    url = nginx.url("big/model.safetensors.index.json")
    got = lw.plan(_w1([url])).materialize()
    local = lw.plan(_w1([str(big)])).materialize()
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in local.items()}
    remote_sizes, local_sizes = seen
    assert local_sizes == []
    # every result the remote load computed (not the zero-copy views of the map) was handed over
    assert sorted(remote_sizes) == sorted(v.nbytes for v in got.values() if v.flags.owndata)
