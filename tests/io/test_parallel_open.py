"""Opening a remote checkpoint: every shard in one round of concurrent requests, each header in one request
(issue 35; `formats/open.py` `_open_remote`, `_header_guesses`; `io/remote.RemoteFile.open(readahead=)`).

Two real servers on 127.0.0.1: nginx (conftest.py; its access log counts the requests) and, here, a small
HTTP server that serves a folder with single-range GETs and holds each reply for a set delay, recording how
many requests were in flight at once, so a sequential open (N delays) and a concurrent one (about one) tell
apart by the clock as well as by the count. The records are checked against the safetensors package's own
reader (`safe_open`) and against the local open of the same files.
"""
from __future__ import annotations

import http.server
import json
import os
import re
import threading
import time

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import lazyweights as lw
from lazyweights.core.errors import FormatError, RemoteError
from lazyweights.formats.safetensors import read_safetensors
from lazyweights.io.remote import FIRST_READAHEAD, RemoteFile, remote_options


def _fresh():
    """Forget every remote file opened so far, as a new process would."""
    RemoteFile._cache.clear()


def _write_checkpoint(folder, shards: int, tensors_per_shard: int, name_len: int = 20, index: bool = True,
                      metadata: dict | None = None) -> list[str]:
    """`shards` safetensors files (written by the safetensors package) and their index; the shard names."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(shards * 1000 + tensors_per_shard)
    weight_map, names = {}, []
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for t in range(tensors_per_shard):
            name = f"model.layers.{s}.block_{t:05d}.".ljust(name_len, "x") + ".weight"
            tensors[name] = rng.standard_normal((2, 3)).astype(np.float32)
            weight_map[name] = fname
        save_file(tensors, os.path.join(folder, fname), metadata=metadata)
        names.append(fname)
    if index:
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return names


def _header_len(path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


# --- a server that delays each reply and counts what overlaps -------------------------------------------------
class DelayServer:
    """Serves `root` on 127.0.0.1 (GET with one `Range`, HEAD, ETag); each reply waits `delay(path)` seconds
    first. Records every request (method, path, headers) and the most requests in flight at once."""

    def __init__(self, root, delay=lambda path: 0.0):
        self.root, self.delay = str(root), delay
        self.requests: list[tuple[str, str, dict]] = []
        self.inflight = self.max_inflight = 0
        self.started: list[tuple[str, str, int]] = []  # (method, path, requests in flight as it arrived)
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _serve(self, body: bool):
                path = self.path.split("?", 1)[0]
                with owner._lock:
                    owner.requests.append((self.command, path, dict(self.headers)))
                    owner.inflight += 1
                    owner.max_inflight = max(owner.max_inflight, owner.inflight)
                    owner.started.append((self.command, path, owner.inflight))
                try:
                    time.sleep(owner.delay(path))
                    file = os.path.join(owner.root, path.lstrip("/"))
                    if not os.path.isfile(file):
                        self.send_response(404)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    with open(file, "rb") as f:
                        data = f.read()
                    start, end, status = 0, len(data), 200
                    m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                    if m:
                        start = int(m.group(1))
                        end = min(len(data), int(m.group(2)) + 1) if m.group(2) else len(data)
                        status = 206
                        if start >= len(data):
                            self.send_response(416)
                            self.send_header("Content-Range", f"bytes */{len(data)}")
                            self.send_header("Content-Length", "0")
                            self.end_headers()
                            return
                    self.send_response(status)
                    self.send_header("ETag", f'"{os.stat(file).st_mtime_ns}-{len(data)}"')
                    self.send_header("Accept-Ranges", "bytes")
                    if status == 206:
                        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                    self.send_header("Content-Length", str(end - start))
                    self.end_headers()
                    if body:
                        self.wfile.write(data[start:end])
                finally:
                    with owner._lock:
                        owner.inflight -= 1

        server_class = type("Server", (http.server.ThreadingHTTPServer,), {
            "request_queue_size": 64,  # 16 connections at once: socketserver's backlog of 5 could drop a SYN
            "daemon_threads": True})
        self.httpd = server_class(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}/{name}"

    def gets(self, suffix: str = ".safetensors") -> list[str]:
        return [p for m, p, _ in self.requests if m == "GET" and p.endswith(suffix)]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.max_inflight = self.inflight

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def delay_server(tmp_path):
    servers = []

    def start(root, delay=lambda path: 0.0):
        servers.append(DelayServer(root, delay))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


# --- concurrency ----------------------------------------------------------------------------------------------
def test_shards_open_in_one_concurrent_round(tmp_path, delay_server):
    """12 shards, each reply held 0.4 s: one GET per shard, all 12 in flight together, and the open takes
    about three delays (index, the shards, config.json), where one shard after another took 14."""
    names = _write_checkpoint(tmp_path / "ckpt", shards=12, tensors_per_shard=30)
    delay = 0.4
    server = delay_server(tmp_path, lambda path: delay)
    _fresh()
    t = time.perf_counter()
    weights = lw.load_weights(server.url("ckpt/model.safetensors.index.json"))
    elapsed = time.perf_counter() - t
    assert sorted(server.gets()) == sorted(f"/ckpt/{n}" for n in names)  # one request per shard
    assert server.max_inflight >= 12, server.max_inflight
    assert elapsed < 6 * delay, f"open took {elapsed:.2f} s; one delay is {delay} s, sequential would be 14"
    local = lw.load_weights(str(tmp_path / "ckpt"))
    assert list(weights.records) == list(local.records)  # the records' order: shards in index order
    for n in names:
        with safe_open(str(tmp_path / "ckpt" / n), "np") as f:
            for key in f.keys():
                rec, sl = weights.records[key], f.get_slice(key)
                assert (rec.shape, rec.dtype.name, rec.file.path) == (
                    tuple(sl.get_shape()), {"F32": "float32"}[sl.get_dtype()], server.url(f"ckpt/{n}"))
    key = next(iter(local.records))
    np.testing.assert_array_equal(weights[key].data().to_numpy(), local[key].data().to_numpy())


def test_storage_options_reach_every_shard_request(tmp_path, delay_server):
    """The shards are opened on a pool's threads: the `storage_options` of the load (here an HTTP header)
    still go with every request, and the next load revalidates each shard once (a HEAD), fetching nothing."""
    names = _write_checkpoint(tmp_path / "ckpt", shards=5, tensors_per_shard=4)
    server = delay_server(tmp_path)
    _fresh()
    options = {"headers": {"X-Lazyweights-Test": "shard-token"}}
    lw.load_weights(server.url("ckpt/model.safetensors.index.json"), storage_options=options)
    shard_requests = [h for m, p, h in server.requests if p.endswith(".safetensors")]
    assert len(shard_requests) == len(names)
    assert all(h.get("X-Lazyweights-Test") == "shard-token" for h in shard_requests)
    server.clear()
    lw.load_weights(server.url("ckpt/model.safetensors.index.json"), storage_options=options)
    shard_requests = [(m, p) for m, p, _ in server.requests if p.endswith(".safetensors")]
    assert sorted(shard_requests) == sorted(("HEAD", f"/ckpt/{n}") for n in names)


# --- errors: the same as when the shards were opened one after another --------------------------------------
def _sequential_error(url: str) -> BaseException:
    """What opening this one shard alone raises (the sequential open's error for it)."""
    _fresh()
    with remote_options():
        with pytest.raises(Exception) as info:
            read_safetensors(url)
    return info.value


def test_a_missing_shard_is_the_first_error_in_index_order(tmp_path, delay_server):
    """Shards 3 and 7 are missing; shard 3's 404 comes back last (its reply is held), shard 7's at once: the
    error is still shard 3's, the very error opening shard 3 alone raises."""
    names = _write_checkpoint(tmp_path / "ckpt", shards=9, tensors_per_shard=3)
    for i in (2, 6):
        os.remove(tmp_path / "ckpt" / names[i])
    server = delay_server(tmp_path, lambda path: 0.5 if path.endswith(names[2]) else 0.0)
    _fresh()
    with pytest.raises(RemoteError) as info:
        lw.load_weights(server.url("ckpt/model.safetensors.index.json"))
    expected = _sequential_error(server.url(f"ckpt/{names[2]}"))
    assert type(info.value) is type(expected) and str(info.value) == str(expected)
    assert info.value.status == 404 and names[2] in str(info.value)


def test_a_truncated_header_is_named_before_a_later_missing_shard(tmp_path, delay_server):
    """Shard 2's header length runs past the end of the file (cut inside its header) and shard 5 is missing:
    the FormatError names shard 2, word for word what reading shard 2 alone says."""
    names = _write_checkpoint(tmp_path / "ckpt", shards=6, tensors_per_shard=50)
    cut = tmp_path / "ckpt" / names[1]
    n = _header_len(cut)
    with open(cut, "r+b") as f:
        f.truncate(n // 2)
    os.remove(tmp_path / "ckpt" / names[4])
    server = delay_server(tmp_path)
    _fresh()
    with pytest.raises(FormatError) as info:
        lw.load_weights(server.url("ckpt/model.safetensors.index.json"))
    expected = _sequential_error(server.url(f"ckpt/{names[1]}"))
    assert type(expected) is FormatError and str(info.value) == str(expected)
    assert "runs past the end of the file" in str(info.value) and names[1] in str(info.value)


def test_an_unreachable_server_fails_at_once(tmp_path):
    """Eight shard URLs on a port where nothing listens: a RemoteError naming the first, in well under a
    second (a refused connection is not retried, and no shard waits for another)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    urls = [f"http://127.0.0.1:{port}/m-{i}.safetensors" for i in range(8)]
    _fresh()
    t = time.perf_counter()
    with pytest.raises(RemoteError) as info:
        lw.load_weights(urls)
    assert time.perf_counter() - t < 2.0
    assert str(info.value).startswith(f"{urls[0]}: connection refused")


def test_duplicate_tensor_across_remote_shards_is_refused(tmp_path, nginx):
    """The checks after the open are unchanged: a tensor in two shards is named with both shards."""
    folder = nginx.root / "dup_open"
    folder.mkdir(exist_ok=True)
    save_file({"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32)}, str(folder / "one.safetensors"))
    save_file({"b": np.ones(2, np.float32)}, str(folder / "two.safetensors"))
    _fresh()
    urls = [nginx.url("dup_open/one.safetensors"), nginx.url("dup_open/two.safetensors")]
    with pytest.raises(FormatError, match=r"tensor 'b' appears in two shards: .*one\.safetensors and "
                                          r".*two\.safetensors"):
        lw.load_weights(urls)


# --- the header guess -----------------------------------------------------------------------------------------
def test_a_header_longer_than_64k_comes_in_the_first_request(tmp_path, nginx):
    """Shards whose headers are ~100 KB (over the 64 KiB first read): with the index, the read-ahead is sized
    from the names it lists and each shard costs one GET; the same files named without an index cost two."""
    folder = nginx.root / "long_headers"
    names = _write_checkpoint(folder, shards=3, tensors_per_shard=800, name_len=60)
    assert all(_header_len(folder / n) > FIRST_READAHEAD for n in names)
    _fresh()
    nginx.clear_log()
    weights = lw.load_weights(nginx.url("long_headers/model.safetensors.index.json"))
    shard_gets = [uri for m, uri, _, _ in nginx.log() if m == "GET" and uri.endswith(".safetensors")]
    assert sorted(shard_gets) == sorted(f"/long_headers/{n}" for n in names)
    assert len(weights.records) == 3 * 800

    _fresh()
    nginx.clear_log()
    lw.load_weights([nginx.url(f"long_headers/{n}") for n in names])
    shard_gets = [uri for m, uri, _, _ in nginx.log() if m == "GET" and uri.endswith(".safetensors")]
    assert sorted(shard_gets) == sorted(f"/long_headers/{n}" for n in names for _ in range(2))


def test_a_guess_too_small_costs_a_second_request(tmp_path, nginx):
    """A header the index cannot foresee (200 KB of `__metadata__`): the guess falls short, the rest of the
    header comes in a second GET, and the records and metadata are the ones the safetensors package reads."""
    folder = nginx.root / "big_metadata"
    meta = {"notes": "x" * 200_000}
    names = _write_checkpoint(folder, shards=2, tensors_per_shard=10, metadata=meta)
    _fresh()
    nginx.clear_log()
    weights = lw.load_weights(nginx.url("big_metadata/model.safetensors.index.json"))
    shard_gets = [uri for m, uri, _, _ in nginx.log() if m == "GET" and uri.endswith(".safetensors")]
    assert sorted(shard_gets) == sorted(f"/big_metadata/{n}" for n in names for _ in range(2))
    assert weights.metadata["notes"] == meta["notes"]
    for n in names:
        with safe_open(str(folder / n), "np") as f:
            assert f.metadata() == meta
            for key in f.keys():
                assert weights.records[key].shape == tuple(f.get_slice(key).get_shape())
                np.testing.assert_array_equal(weights[key].data().to_numpy(), f.get_tensor(key))


def test_an_s3_prefix_opens_its_shards_together(tmp_path, s3, monkeypatch):
    """The same over S3 (moto's server): an `s3://` prefix with an index, its shards opened on the pool (each
    with its own boto3 session: clients made on many threads at once), records and bytes as the local open's;
    every shard object is asked for its first bytes once, with the read-ahead its index guess gives."""
    from lazyweights.io import transport

    names = _write_checkpoint(tmp_path / "ckpt", shards=6, tensors_per_shard=700, name_len=60)
    assert all(_header_len(tmp_path / "ckpt" / n) > FIRST_READAHEAD for n in names)
    s3.client.create_bucket(Bucket="parallel-open")
    for f in os.listdir(tmp_path / "ckpt"):
        s3.client.upload_file(str(tmp_path / "ckpt" / f), "parallel-open", f"m/{f}")
    firsts: list[tuple[str, int, str]] = []
    real_first = transport.S3Backend.first_bytes

    def first_bytes(self, length):
        firsts.append((self.key, length, threading.current_thread().name))
        return real_first(self, length)

    monkeypatch.setattr(transport.S3Backend, "first_bytes", first_bytes)
    _fresh()
    weights = lw.load_weights("s3://parallel-open/m", storage_options=s3.options)
    local = lw.load_weights(str(tmp_path / "ckpt"))
    assert list(weights.records) == list(local.records)
    shard_opens = sorted((k, n) for k, n, _ in firsts if k.endswith(".safetensors"))
    assert [k for k, _ in shard_opens] == sorted(f"m/{n}" for n in names)  # each once
    assert all(n >= _header_len(tmp_path / "ckpt" / k[2:]) for k, n in shard_opens)  # the header fits the guess
    assert {t for k, _, t in firsts if k.endswith(".safetensors")} != {threading.current_thread().name}
    key = list(local.records)[-1]
    np.testing.assert_array_equal(weights[key].data().to_numpy(), local[key].data().to_numpy())


# --- the vLLM loader's config files ---------------------------------------------------------------------------
def test_vllm_config_files_are_fetched_in_one_round(tmp_path, delay_server):
    """`tools/vllm.prepare_config_folder` fetches the config and tokenizer files beside a remote folder
    together: with each reply held 0.3 s, the ten requests (most of them 404s) overlap, and the folder holds
    exactly the files that exist, byte for byte. A missing config.json is still the error, named."""
    from lazyweights.tools.vllm import CONFIG_FILES, prepare_config_folder

    folder = tmp_path / "llama"
    folder.mkdir()
    present = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b'{"version": "1.0"}',
               "generation_config.json": b'{"do_sample": false}'}
    for name, data in present.items():
        (folder / name).write_bytes(data)
    delay = 0.3
    server = delay_server(tmp_path, lambda path: delay)
    _fresh()
    t = time.perf_counter()
    out = prepare_config_folder(server.url("llama/model.safetensors.index.json"), folder=str(tmp_path / "out"))
    elapsed = time.perf_counter() - t
    assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == present
    assert sorted(p for m, p, _ in server.requests if m == "GET") == sorted(f"/llama/{n}" for n in CONFIG_FILES)
    assert server.max_inflight >= len(CONFIG_FILES) // 2, server.max_inflight
    assert elapsed < 4 * delay, f"took {elapsed:.2f} s; one delay is {delay} s, one after another would be 3"

    (folder / "config.json").unlink()
    _fresh()
    with pytest.raises(RemoteError, match=r"config\.json.*404"):
        prepare_config_folder(server.url("llama/"), folder=str(tmp_path / "out2"))


def _write_split_gguf(folder, parts: int) -> list[str]:
    """A split GGUF (gguf-py's writer, llama.cpp's naming: m-0000k-of-0000n.gguf), one tensor per part."""
    import gguf

    folder.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(folder / "m.gguf"), "llama", split_max_tensors=1)
    w.add_block_count(1)
    for i in range(parts):
        w.add_tensor(f"t{i}", np.arange(i, i + 24, dtype=np.float32).reshape(4, 6))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    names = sorted(p.name for p in folder.glob("m-*-of-*.gguf"))
    assert len(names) == parts
    return names


def test_split_gguf_parts_open_in_one_concurrent_round(tmp_path, delay_server):
    """A split GGUF over HTTP, given by its first part: the other parts are opened together (one GET each,
    all in flight at once), so the open takes a few delays where one part after another took one or more
    each. The records and values equal the local files' (read_gguf_checkpoint)."""
    names = _write_split_gguf(tmp_path / "split", parts=6)
    delay = 0.4
    server = delay_server(tmp_path, lambda path: delay if path.endswith(".gguf") else 0.0)
    _fresh()
    t = time.perf_counter()
    weights = lw.load_weights(server.url(f"split/{names[0]}"))
    elapsed = time.perf_counter() - t
    assert server.max_inflight >= len(names) - 1, server.max_inflight
    assert sorted(set(server.gets(".gguf"))) == sorted(f"/split/{n}" for n in names)
    assert len(server.gets(".gguf")) == len(names)  # one request a part: the metadata came with its identity
    assert elapsed < 4 * delay, f"open took {elapsed:.2f} s; one delay is {delay} s, sequential would be {len(names)}"
    local = lw.load_weights(str(tmp_path / "split" / names[0]))
    assert list(weights.records) == list(local.records) == [f"t{i}" for i in range(len(names))]
    for key in local.records:
        np.testing.assert_array_equal(weights[key].data().to_numpy(), local[key].data().to_numpy())


def test_a_missing_split_gguf_part_is_named(tmp_path, delay_server):
    """A part of the split that the server does not have: the same FormatError as when parts were opened one
    after another, naming the missing part and its number."""
    names = _write_split_gguf(tmp_path / "split_gap", parts=4)
    os.remove(tmp_path / "split_gap" / names[2])
    server = delay_server(tmp_path)
    _fresh()
    with pytest.raises(FormatError, match=rf"{names[2]}: missing part 3 of 4 of the split GGUF"):
        lw.load_weights(server.url(f"split_gap/{names[0]}"))


def test_config_json_comes_in_the_round_of_the_shards(tmp_path, delay_server):
    """The config.json beside the shards (which the compressed-tensors check reads right after the open) is
    fetched in the same round as the shards, with them in flight, and read once: one GET, no HEAD. The open
    is two rounds (the index, then the shards and config.json), where it was three."""
    _write_checkpoint(tmp_path / "cfg", shards=3, tensors_per_shard=4)
    (tmp_path / "cfg" / "config.json").write_text('{"model_type": "llama"}')
    delay = 0.4
    server = delay_server(tmp_path, lambda path: delay)
    _fresh()
    t = time.perf_counter()
    lw.load_weights(server.url("cfg/model.safetensors.index.json"))
    elapsed = time.perf_counter() - t
    config = [(m, n) for m, p, n in server.started if p == "/cfg/config.json"]
    assert [m for m, _ in config] == ["GET"], server.started
    assert config[0][1] >= 2, server.started  # the shards' requests were in flight beside it
    assert elapsed < 2.75 * delay, f"open took {elapsed:.2f} s: more than two rounds of {delay} s"


def test_every_split_gguf_part_given_as_a_url(tmp_path, delay_server):
    """All parts named (URLs, in any order): each is parsed once, none is opened twice, and the records equal
    the local files' (the second part's turn finds every sibling parsed already: nothing left to open)."""
    names = _write_split_gguf(tmp_path / "split_all", parts=3)
    server = delay_server(tmp_path)
    _fresh()
    weights = lw.load_weights([server.url(f"split_all/{n}") for n in reversed(names)])
    local = lw.load_weights(str(tmp_path / "split_all" / names[0]))
    assert list(weights.records) == list(local.records)
    assert len(server.gets(".gguf")) == len(names)
