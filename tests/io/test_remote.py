"""Checkpoints read over HTTP (nginx) and S3 (moto) give the bytes a local read gives, fetch only what a plan
needs (counted by the server), reuse a cache, and fail with a named error that names the URL."""
from __future__ import annotations

import filecmp
import http.server
import json
import os
import threading
import time
import types

import ml_dtypes
import numpy as np
import pytest

import lazyweights as lw
from lazyweights.io.remote import RemoteFile
from lazyweights.tools import demo as w1

CFG = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=256)


def _checkpoint(folder, write_safetensors, layers=3, hidden=256, vocab=1000):
    """A sharded bf16 Llama-named checkpoint with an index: random values, never zeros, about 3 MB."""
    rng = np.random.default_rng(7)

    def bf(*shape):
        return (rng.standard_normal(shape) + 0.5).astype(np.float32).astype(ml_dtypes.bfloat16)

    os.makedirs(folder, exist_ok=True)
    shards = [{"model.embed_tokens.weight": bf(vocab, hidden), "model.norm.weight": bf(hidden)}]
    for i in range(layers):
        p = f"model.layers.{i}."
        shards.append({p + "input_layernorm.weight": bf(hidden),
                       p + "self_attn.q_proj.weight": bf(hidden, hidden),
                       p + "self_attn.k_proj.weight": bf(hidden // 2, hidden),
                       p + "self_attn.k_scale": np.full((), 0.5, np.float32),
                       p + "mlp.down_proj.weight": bf(hidden, 2 * hidden)})
    weight_map = {}
    for n, tensors in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(folder, name), tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return weight_map


@pytest.fixture(scope="module")
def served(nginx, write_safetensors):
    """The checkpoint in nginx's root (folder `ckpt`) and its local path."""
    folder = nginx.root / "ckpt"
    _checkpoint(folder, write_safetensors)
    return folder


def _watch_held_peak(monkeypatch) -> list[int]:
    """[peak]: the most bytes the remote files held together after any fetch, updated as the run goes."""
    peak = [0]
    real = RemoteFile.ensure_ranges

    def watched(self, ranges, within=None):
        real(self, ranges, within)
        peak[0] = max(peak[0], sum(f.held_bytes() for f in RemoteFile._cache.values()))

    monkeypatch.setattr(RemoteFile, "ensure_ranges", watched)
    return peak


def _fresh():
    """Forget every remote file opened so far, as a new process would."""
    RemoteFile._cache.clear()


def _adapted(paths, **kw):
    weights = lw.load_weights(paths, **kw)
    return w1.convert_safetensor_state_dict(dict(weights.items()), huggingface_config=CFG)


def test_remote_materialize_equals_local_and_fetches_only_the_tensors(nginx, served):
    _fresh()
    local = lw.plan(_adapted([str(served)])).materialize()
    nginx.clear_log()
    remote_sd = _adapted([nginx.url("ckpt/model.safetensors.index.json")], storage_options={"part_size": 1 << 18})
    opened = sum(b for m, uri, _, b in nginx.log() if m == "GET" and uri.endswith(".safetensors"))
    assert not [uri for m, uri, *_ in nginx.log() if m == "HEAD" and uri.endswith(".safetensors")]
    got = lw.plan(remote_sd).materialize()
    assert set(got) == set(local)
    for k in local:
        np.testing.assert_array_equal(np.asarray(got[k]).view(np.uint8), np.asarray(local[k]).view(np.uint8), err_msg=k)
    needed = sum(os.path.getsize(p) for p in served.glob("*.safetensors"))
    fetched = nginx.bytes_sent()
    assert fetched <= 1.05 * needed, (fetched, needed)  # each byte fetched once
    # opening costs one request per object: a ranged GET of its first 64 KiB gives the length, the ETag and
    # the header (a shard is opened with no HEAD)...
    assert opened <= 4 * (64 << 10), opened
    gets = [r for r in nginx.log() if r[0] == "GET" and r[1].endswith(".safetensors")]
    assert all(status == 206 for _, _, status, _ in gets)  # ...and every read is a range request


def test_remote_save_is_byte_identical_to_local_save(nginx, served, tmp_path):
    _fresh()
    lw.plan(_adapted([str(served)])).save(tmp_path / "local", max_shard_size="1MB")
    lw.plan(_adapted([nginx.url("ckpt/model.safetensors.index.json")])).save(tmp_path / "remote", max_shard_size="1MB")
    names = sorted(os.listdir(tmp_path / "local"))
    assert names == sorted(os.listdir(tmp_path / "remote")) and len(names) > 2
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "local", tmp_path / "remote", names, shallow=False)
    assert not mismatch and not errors


def test_a_rank_slice_fetches_only_its_tensors(nginx, served):
    _fresh()
    nginx.clear_log()
    weights = lw.load_weights([nginx.url("ckpt/model.safetensors.index.json")])
    nginx.clear_log()
    q = weights.model.layers[1].self_attn.q_proj.weight.data()
    got = q.to_numpy()
    local = lw.load_weights([str(served)]).model.layers[1].self_attn.q_proj.weight.data().to_numpy()
    np.testing.assert_array_equal(got.view(np.uint16), local.view(np.uint16))
    # exactly the tensor's bytes, less those that came with the shard's first 64 KiB when it was opened
    (record,) = [n.arg for n in q.node.toposort() if n.op.name == "SOURCE"]
    came_with_open = max(0, min(record.offset + record.nbytes, 64 << 10) - record.offset)
    assert nginx.bytes_sent() == got.nbytes - came_with_open
    assert came_with_open < got.nbytes


def test_cache_serves_a_second_run_without_fetching(nginx, served, tmp_path):
    cache = str(tmp_path / "cache")
    url = nginx.url("ckpt/model.safetensors.index.json")
    _fresh()
    weights = lw.load_weights([url], cache=cache)
    first_layer = weights.model.layers[0].self_attn.q_proj.weight.data().to_numpy()  # a partial run
    _fresh()
    nginx.clear_log()
    sd = _adapted([url], cache=cache)
    lw.plan(sd).materialize()
    partial = nginx.bytes_sent()
    assert 0 < partial <= sum(os.path.getsize(p) for p in served.glob("*.safetensors")) - first_layer.nbytes
    _fresh()
    nginx.clear_log()
    got = lw.plan(_adapted([url], cache=cache)).materialize()
    assert nginx.bytes_sent() == 0  # HEADs only: the second run fetches nothing
    local = lw.plan(_adapted([str(served)])).materialize()
    for k in local:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(local[k]))


def test_cache_never_serves_stale_bytes(nginx, write_safetensors, tmp_path):
    folder = nginx.root / "stale"
    folder.mkdir()
    path = folder / "m.safetensors"
    write_safetensors(path, {"w": np.arange(64, dtype=np.float32)})
    cache = str(tmp_path / "cache")
    _fresh()
    assert lw.load_weights([nginx.url("stale/m.safetensors")], cache=cache).w.data().to_numpy()[5] == 5
    time.sleep(1.1)  # nginx's ETag is mtime-size: make the mtime differ
    write_safetensors(path, {"w": np.arange(64, dtype=np.float32) * 2})
    _fresh()
    assert lw.load_weights([nginx.url("stale/m.safetensors")], cache=cache).w.data().to_numpy()[5] == 10


def test_remote_gguf_quantized_equals_local(nginx, tmp_path):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(3)
    values = {"a": (rng.standard_normal((64, 256)) + 0.1).astype(np.float32),
              "b": (rng.standard_normal((32, 32)) + 0.1).astype(np.float32)}
    path = nginx.root / "q.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("a", gguf.quants.quantize(values["a"], gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("b", values["b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _fresh()
    local = lw.load_weights([str(path)])
    remote = lw.load_weights([nginx.url("q.gguf")])
    for name in ("a", "b"):
        want = local[name].data().dequantize().to_numpy() if name == "a" else local[name].data().to_numpy()
        got = remote[name].data().dequantize().to_numpy() if name == "a" else remote[name].data().to_numpy()
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(remote["a"].data().dequantize().to_numpy(),
                               gguf.quants.dequantize(gguf.quants.quantize(values["a"], gguf.GGMLQuantizationType.Q8_0),
                                                      gguf.GGMLQuantizationType.Q8_0))


def test_s3_prefix_equals_local(s3, served):
    s3.client.create_bucket(Bucket="models")
    for p in served.iterdir():
        s3.client.upload_file(str(p), "models", f"llama/{p.name}")
    _fresh()
    got = lw.plan(_adapted(["s3://models/llama"], storage_options=s3.options)).materialize()
    local = lw.plan(_adapted([str(served)])).materialize()
    assert set(got) == set(local)
    for k in local:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(local[k]), err_msg=k)


def test_s3_object_replaced_during_a_read_is_source_changed(s3, write_safetensors, tmp_path):
    s3.client.create_bucket(Bucket="changing")
    # larger than what opening fetches (64 KiB), so reading the tensor must fetch
    write_safetensors(tmp_path / "m.safetensors", {"w": np.arange(1 << 15, dtype=np.float32)})
    s3.client.upload_file(str(tmp_path / "m.safetensors"), "changing", "m.safetensors")
    _fresh()
    weights = lw.load_weights(["s3://changing/m.safetensors"], storage_options=s3.options)
    write_safetensors(tmp_path / "m.safetensors", {"w": np.arange(1 << 15, dtype=np.float32) + 1})
    s3.client.upload_file(str(tmp_path / "m.safetensors"), "changing", "m.safetensors")
    with pytest.raises(lw.SourceChangedError, match="s3://changing/m.safetensors"):
        weights.w.data().to_numpy()


# --- bad input --------------------------------------------------------------------------------------------
def test_404_and_403_name_the_url(nginx):
    _fresh()
    with pytest.raises(lw.RemoteError, match=r"ckpt/nothing.safetensors: cannot open: HTTP 404") as e:
        lw.load_weights([nginx.url("ckpt/nothing.safetensors")])
    assert e.value.status == 404 and isinstance(e.value, OSError)
    with pytest.raises(lw.RemoteError, match=r"forbidden/m.safetensors: cannot open: HTTP 403"):
        lw.load_weights([nginx.url("forbidden/m.safetensors")])


def test_not_a_checkpoint_names_the_url(nginx):
    (nginx.root / "notes.txt").write_text("hello, these are not weights\n")
    _fresh()
    with pytest.raises(lw.FormatError, match=r"notes.txt: not a recognised checkpoint"):
        lw.load_weights([nginx.url("notes.txt")])
    (nginx.root / "fake.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(lw.FormatError, match=r"fake.safetensors: header length"):
        lw.load_weights([nginx.url("fake.safetensors")])


def test_object_replaced_during_a_read_is_source_changed(nginx, write_safetensors):
    path = nginx.root / "replaced.safetensors"
    write_safetensors(path, {"w": np.arange(1 << 15, dtype=np.float32)})  # more than opening fetches (64 KiB)
    _fresh()
    weights = lw.load_weights([nginx.url("replaced.safetensors")])
    time.sleep(1.1)
    write_safetensors(path, {"w": np.arange(1 << 15, dtype=np.float32) + 1})
    with pytest.raises(lw.SourceChangedError, match="replaced.safetensors: the object changed"):
        weights.w.data().to_numpy()


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """A server with one fault: 'ignore-range' (200 + whole body), 'truncate' (a short body), 'slow'."""

    body = b""
    fault = ""

    def log_message(self, *a):
        pass

    def _head(self, status, length, extra=()):
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", '"v1"')
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()

    def _elsewhere(self) -> bool:  # a real server has nothing else (e.g. no config.json beside the file)
        if self.path.split("?", 1)[0] == "/m.safetensors":
            return False
        self._head(404, 0)
        return True

    def do_HEAD(self):
        if not self._elsewhere():
            self._head(200, len(self.body))

    def do_GET(self):
        if self._elsewhere():
            return
        if self.fault == "slow":
            time.sleep(2)
        start, end = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
        if self.fault == "ignore-range":
            self._head(200, len(self.body))
            self.wfile.write(self.body)
            return
        part = self.body[start:end + 1]
        self._head(206, len(part), [("Content-Range", f"bytes {start}-{end}/{len(self.body)}")])
        self.wfile.write(part[: len(part) // 2] if self.fault == "truncate" and start > 0 else part)
        if self.fault == "truncate":
            self.close_connection = True


@pytest.fixture
def misbehaving(write_safetensors, tmp_path):
    # 128 KiB: more than opening fetches (64 KiB), so the tensor's bytes take a read of their own
    write_safetensors(tmp_path / "m.safetensors", {"w": np.arange(1 << 15, dtype=np.float32)})
    body = (tmp_path / "m.safetensors").read_bytes()
    servers = []

    def start(fault):
        handler = type("H", (_Misbehaving,), {"body": body, "fault": fault})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.handle_error = lambda request, address: None  # the client hanging up on a slow reply is expected
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_port}/m.safetensors"

    yield start
    for s in servers:
        s.shutdown()


def test_server_ignoring_range_is_refused(misbehaving):
    _fresh()
    url = misbehaving("ignore-range")
    with pytest.raises(lw.RemoteError, match="ignored the Range header") as e:
        lw.load_weights([url])
    assert url in str(e.value)


def test_truncated_body_is_retried_then_named(misbehaving, tmp_path):
    _fresh()
    url = misbehaving("truncate")
    weights = lw.load_weights([url], storage_options={"retries": 2})
    with pytest.raises(lw.RemoteError) as e:
        lw.plan({"w": weights.w.data()}).save(tmp_path / "out")
    assert "truncated body" in str(e.value) and url in str(e.value) and "after 3 attempts" in str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing partial


def test_slow_server_times_out_and_says_so(misbehaving):
    _fresh()
    url = misbehaving("slow")
    t = time.monotonic()
    with pytest.raises(lw.RemoteError, match=r"timed out after 0.3 s"):
        lw.load_weights([url], storage_options={"timeout": 0.3, "retries": 1})
    assert time.monotonic() - t < 10


@pytest.mark.parametrize("world", [2, 4])
def test_a_tensor_parallel_rank_fetches_only_its_slices(nginx, served, world):
    """Rank 0's slices over HTTP equal the same slices of the local checkpoint, and the server sends little
    more than those bytes: column/vocab splits are one range per tensor, the row-parallel down_proj one run
    per row (multi-range requests)."""
    _fresh()
    url = nginx.url("ckpt/model.safetensors.index.json")
    weights = lw.load_weights([url], storage_options={"part_cost": 0})  # fetch exactly the slices' bytes
    nginx.clear_log()
    part = lw.shard({k: v.data() for k, v in weights.items()}, 0, world)
    got = lw.plan(part).materialize()
    local = {k: v.data().to_numpy() for k, v in lw.load_weights([str(served)]).items()}
    for name, value in got.items():
        want = local[name]
        if "down_proj" in name:
            want = want[:, : want.shape[1] // world]
        elif value.shape != want.shape:
            want = want[: want.shape[0] // world]
        np.testing.assert_array_equal(np.atleast_1d(value).view(np.uint8), np.atleast_1d(want).view(np.uint8),
                                      err_msg=name)
    needed = sum(np.asarray(v).nbytes for v in got.values())
    checkpoint = sum(os.path.getsize(p) for p in served.glob("*.safetensors"))
    runs = 3 * 256  # down_proj's rows: each a part of a multipart/byteranges reply, ~110 bytes of framing
    assert nginx.bytes_sent() <= needed + 128 * runs, (nginx.bytes_sent(), needed)
    assert nginx.bytes_sent() <= (0.3 if world == 4 else 0.55) * checkpoint
    multi = [r for r in nginx.log() if r[0] == "GET"]
    assert len(multi) < 40  # runs batched into multi-range requests, not one request per row
    # With the default cost model a part costs more than these rows' gaps (384 or 256 bytes): the row-parallel
    # down_proj is fetched through its gaps, whole, in a few plain requests, and everything else is the share.
    _fresh()
    weights = lw.load_weights([url])
    nginx.clear_log()
    again = lw.plan(lw.shard({k: v.data() for k, v in weights.items()}, 0, world)).materialize()
    assert all(np.asarray(again[k]).tobytes() == np.asarray(got[k]).tobytes() for k in got)
    down = sum(local[k].nbytes for k in local if "down_proj" in k)
    assert nginx.bytes_sent() <= needed - down // world + down + 4 * (64 << 10), (nginx.bytes_sent(), needed)
    assert len([r for r in nginx.log() if r[0] == "GET"]) < len(multi) + 8


def test_cli_inspects_and_converts_a_url(nginx, served, tmp_path, capsys):
    from lazyweights.io.source import ByteSource, SourceRecord
    from lazyweights.tools.cli import main

    _fresh()
    url = nginx.url("ckpt/model.safetensors.index.json")
    weights = lw.load_weights([url])
    record = weights.model.layers[0].self_attn.q_proj.weight.data().node.arg  # what a SOURCE node holds
    assert isinstance(record, SourceRecord) and isinstance(record.file, ByteSource)
    assert main(["inspect", url]) == 0
    out = capsys.readouterr().out
    assert "model.layers.2.mlp.down_proj.weight" in out and "bfloat16" in out
    (served / "config.json").write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2,
                                                    "hidden_size": 256}))
    try:
        adapter = "lazyweights.tools.demo:convert_safetensor_state_dict"
        assert main(["convert", adapter, url, "-o", str(tmp_path / "remote"), "--no-progress",
                     "--cache", str(tmp_path / "cache")]) == 0
        assert main(["convert", adapter, str(served), "-o", str(tmp_path / "local"), "--no-progress"]) == 0
    finally:
        (served / "config.json").unlink()
    names = sorted(os.listdir(tmp_path / "local"))
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "local", tmp_path / "remote", names, shallow=False)
    assert not mismatch and not errors


def test_dask_distributed_conversion_reads_from_the_object_store(nginx, served, tmp_path):
    """Worker processes re-open each remote file themselves (RemoteFile pickles as its URL and options) and
    fetch what their blocks need; the saved checkpoint equals the local save."""
    distributed = pytest.importorskip("distributed")
    _fresh()
    url = nginx.url("ckpt/model.safetensors.index.json")
    remote_plan = lw.plan(_adapted([url]))
    # (the cluster has a `with` of its own: closing a Client does not close a cluster it was handed)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        nginx.clear_log()
        files_d = remote_plan.save(tmp_path / "dist", max_shard_size="1MB", scheduler=client)
        served_bytes = nginx.bytes_sent()
    files_l = lw.plan(_adapted([str(served)])).save(tmp_path / "local", max_shard_size="1MB")
    assert [os.path.basename(f) for f in files_d] == [os.path.basename(f) for f in files_l] and len(files_l) > 2
    for a, b in zip(files_d, files_l):
        assert open(a, "rb").read() == open(b, "rb").read(), a
    checkpoint = sum(os.path.getsize(p) for p in served.glob("*.safetensors"))
    # the workers fetched it all, once
    assert 0.99 * checkpoint <= served_bytes <= 1.1 * checkpoint, (served_bytes, checkpoint)
