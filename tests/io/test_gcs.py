"""gs:// sources (`io/gcs_backend.py`) against fake-gcs-server, the GCS emulator (the `gcs` fixture).

The judge of the bytes is the safetensors package reading the same file from disk; what the emulator cannot
show (credentials, a 403) is checked against google-auth's own credentials class and a local stub server."""
from __future__ import annotations

import datetime
import http.server
import json
import threading

import numpy as np
import pytest
from conftest import free_port
from safetensors.numpy import load_file, save

import lazyweights as lw
from lazyweights.io import gcs_backend
from lazyweights.io.gcs_backend import GCSBackend
from lazyweights.io.remote import RemoteFile, list_prefix


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Each test opens its objects anew, as a new process would, and sees no emulator setting of its own."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    RemoteFile._cache.clear()
    yield
    RemoteFile._cache.clear()


def _safetensors(tensors: dict) -> bytes:
    return save(tensors)


def test_a_checkpoint_prefix_on_gcs_loads_as_its_files_do(gcs, minilm_dir):
    """A real checkpoint (all-MiniLM-L6-v2) under a gs:// prefix: listed, opened, every tensor equal to the
    safetensors package's reading of the same file, and no byte fetched twice."""
    local = minilm_dir / "model.safetensors"
    gcs.upload("minilm/model.safetensors", local.read_bytes())
    gcs.upload("minilm/config.json", (minilm_dir / "config.json").read_bytes())
    weights = lw.load_weights([gcs.url("minilm/")], storage_options=gcs.options)
    reference = load_file(local)
    assert set(weights.keys()) == set(reference)
    got = lw.plan({k: weights[k].data() for k in reference}).materialize()
    for k, v in reference.items():
        np.testing.assert_array_equal(np.asarray(got[k]), v, err_msg=k)
    (f,) = [f for f in RemoteFile._cache.values() if f.path.endswith("model.safetensors")]
    assert f.path == gcs.url("minilm/model.safetensors")
    assert f.bytes_fetched <= local.stat().st_size * 1.02
    assert f.etag.isdigit()  # the version a GCS object is pinned to is its generation


def test_a_rank_slice_from_gcs_equals_the_same_slice_of_the_file(gcs, tmp_path):
    """GCS takes no multi-range GETs: a row-parallel slice's rows come one range per request, or through the
    gaps, and still equal numpy's slice."""
    rng = np.random.default_rng(3)
    tensors = {"a.weight": rng.standard_normal((64, 96)).astype(np.float32),
               "b.weight": rng.standard_normal((96, 64)).astype(np.float32)}
    gcs.upload("rank/model.safetensors", _safetensors(tensors))
    weights = lw.load_weights([gcs.url("rank/model.safetensors")], storage_options={**gcs.options, "part_cost": 0})
    got = lw.plan({k: weights[k].data()[:, 16:40] for k in tensors}).materialize()
    for k, v in tensors.items():
        np.testing.assert_array_equal(np.asarray(got[k]), v[:, 16:40], err_msg=k)


def test_a_replaced_object_is_read_anew_and_an_old_handle_never_mixes(gcs):
    """The generation pin: after the object is replaced, a handle opened before raises SourceChangedError
    when it must fetch (the emulator keeps no old generations); a new load gets the new bytes."""
    first = {"w": np.arange(1 << 15, dtype=np.float32)}  # more than opening fetches (64 KiB)
    second = {"w": np.arange(1 << 15, dtype=np.float32) * -1}
    before = gcs.upload("replaced/m.safetensors", _safetensors(first))
    weights = lw.load_weights([gcs.url("replaced/m.safetensors")], storage_options=gcs.options)
    after = gcs.upload("replaced/m.safetensors", _safetensors(second))
    assert after["generation"] != before["generation"]
    with pytest.raises(lw.SourceChangedError, match=rf"gs://bkt/replaced/m.safetensors: .*generation "
                                                   rf"{before['generation']} is no longer there"):
        weights.w.data().to_numpy()
    again = lw.load_weights([gcs.url("replaced/m.safetensors")], storage_options=gcs.options)
    np.testing.assert_array_equal(again.w.data().to_numpy(), second["w"])


def test_a_cached_gcs_load_fetches_nothing_the_second_time(gcs, tmp_path):
    tensors = {"w": np.random.default_rng(5).standard_normal((256, 256)).astype(np.float32)}
    gcs.upload("cached/m.safetensors", _safetensors(tensors))
    cache = str(tmp_path / "cache")
    for fetched in ("some", "none"):
        RemoteFile._cache.clear()
        weights = lw.load_weights([gcs.url("cached/m.safetensors")], storage_options=gcs.options, cache=cache)
        np.testing.assert_array_equal(weights.w.data().to_numpy(), tensors["w"])
        (f,) = RemoteFile._cache.values()
        for opened in RemoteFile._cache.values():
            if opened._host is not None:
                opened._host.flush()
        assert (f.bytes_fetched > 0) == (fetched == "some"), (fetched, f.bytes_fetched)


def test_listing_a_prefix_follows_every_page(gcs, monkeypatch):
    for name in ("pages/c.safetensors", "pages/a.safetensors", "pages/b.safetensors", "pages/sub/d.json"):
        gcs.upload(name, b"x")
    monkeypatch.setattr(gcs_backend, "LIST_PAGE", 2)
    assert list_prefix(gcs.url("pages"), gcs.options) == [
        gcs.url("pages/a.safetensors"), gcs.url("pages/b.safetensors"), gcs.url("pages/c.safetensors"),
        gcs.url("pages/sub/d.json")]


# --- bad input --------------------------------------------------------------------------------------------
def test_a_missing_object_or_bucket_names_the_gs_url(gcs):
    with pytest.raises(lw.RemoteError, match=r"gs://bkt/nothing.safetensors: cannot open: HTTP 404") as e:
        lw.load_weights([gcs.url("nothing.safetensors")], storage_options=gcs.options)
    assert e.value.status == 404
    with pytest.raises(lw.RemoteError, match=r"gs://no-such-bucket/m.safetensors: cannot open: HTTP 404"):
        lw.load_weights(["gs://no-such-bucket/m.safetensors"], storage_options=gcs.options)


def test_an_endpoint_where_nothing_listens_names_the_object_and_the_endpoint():
    port = free_port()
    with pytest.raises(lw.RemoteError, match=rf"gs://bkt/m.safetensors: .*connection refused: nothing listens on "
                                             rf"127.0.0.1:{port}"):
        lw.load_weights(["gs://bkt/m.safetensors"], storage_options={"endpoint_url": f"http://127.0.0.1:{port}"})


def test_a_prefix_without_weights_is_a_format_error(gcs):
    gcs.upload("empty/readme.txt", b"no weights here")
    with pytest.raises(lw.FormatError, match=r"gs://bkt/empty/: the prefix holds no .safetensors"):
        lw.load_weights([gcs.url("empty/")], storage_options=gcs.options)


def test_a_url_without_a_bucket_is_a_usage_error():
    with pytest.raises(lw.UsageError, match=r"gs:///m.safetensors: a gs:// URL names a bucket"):
        GCSBackend("gs:///m.safetensors", {"token": "anon"})


def test_an_unreadable_token_file_is_named(tmp_path):
    with pytest.raises(lw.UsageError, match=r"storage_options\['token'\] '.*nope.json' is not 'anon'"):
        GCSBackend("gs://b/m.safetensors", {"token": str(tmp_path / "nope.json")})
    (tmp_path / "odd.json").write_text('{"type": "external_account_weird"}')
    with pytest.raises(lw.UsageError, match=r"credentials of type 'external_account_weird'"):
        GCSBackend("gs://b/m.safetensors", {"token": str(tmp_path / "odd.json")})


class _Forbidden(http.server.BaseHTTPRequestHandler):
    """GCS's answer to a request its credentials do not allow: 403 to everything."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = b'{"error": {"code": 403, "message": "Access denied."}}'
        self.send_response(403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_403_says_no_credentials_were_found_when_none_were():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(lw.RemoteError, match=r"gs://private/m.safetensors: cannot open: HTTP 403 .*no Google "
                                                 r"credentials were found") as e:
            lw.load_weights(["gs://private/m.safetensors"],
                            storage_options={"endpoint_url": f"http://127.0.0.1:{server.server_port}", "retries": 0})
        assert e.value.status == 403
    finally:
        server.shutdown()


# --- credentials ------------------------------------------------------------------------------------------
def _counting_credentials():
    from google.auth.credentials import Credentials

    class Counting(Credentials):
        """google-auth's credentials, issuing token-1, token-2, ... (each valid for an hour)."""

        refreshes = 0

        def refresh(self, request):
            type(self).refreshes += 1
            self.token = f"token-{self.refreshes}"
            self.expiry = datetime.datetime.utcnow() + datetime.timedelta(hours=1)

    return Counting()


def test_credentials_give_a_bearer_token_refreshed_once_expired():
    pytest.importorskip("google.auth")
    credentials = _counting_credentials()
    backend = GCSBackend("gs://b/m.safetensors", {"token": credentials, "endpoint_url": "http://127.0.0.1:9"})
    assert backend._authorization() == {"Authorization": "Bearer token-1"}
    assert backend._authorization() == {"Authorization": "Bearer token-1"}  # still valid: no refresh
    credentials.expiry = datetime.datetime.utcnow() - datetime.timedelta(seconds=1)
    assert backend._authorization() == {"Authorization": "Bearer token-2"}
    assert type(credentials).refreshes == 2


def test_anonymous_and_emulated_requests_carry_no_authorization(monkeypatch):
    assert GCSBackend("gs://b/m", {"token": "anon"})._authorization() == {}
    assert GCSBackend("gs://b/m", {"anon": True})._authorization() == {}
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    backend = GCSBackend("gs://b/dir/m.safetensors", {})
    assert backend._authorization() == {}
    assert backend.url == "http://127.0.0.1:4443/download/storage/v1/b/b/o/dir%2Fm.safetensors?alt=media"


def test_a_service_account_file_is_read_with_google_auth(tmp_path):
    """A service-account JSON (a throwaway RSA key made here) becomes google-auth service-account credentials
    with the read-only scope; nothing is requested until the first read."""
    pytest.importorskip("google.oauth2")
    rsa = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.rsa")
    from cryptography.hazmat.primitives import serialization

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    info = {"type": "service_account", "project_id": "p", "private_key_id": "k", "private_key": pem,
            "client_email": "reader@p.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token"}
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(info))
    for token in (str(path), info):
        credentials = GCSBackend("gs://b/m", {"token": token})._credentials
        assert credentials.service_account_email == "reader@p.iam.gserviceaccount.com"
        assert credentials.scopes == [gcs_backend.READ_SCOPE]


def test_default_credentials_are_looked_up_once_a_process(monkeypatch):
    """Application Default Credentials may probe a metadata server: one lookup serves every shard's backend."""
    google_auth = pytest.importorskip("google.auth")
    calls = []

    def default(scopes=None):
        calls.append(scopes)
        return _counting_credentials(), "project"

    monkeypatch.setattr(google_auth, "default", default)
    monkeypatch.setattr(gcs_backend, "_DEFAULT_CREDENTIALS", {})
    backends = [GCSBackend(f"gs://b/model-{i:05d}.safetensors", {}) for i in range(5)]
    assert calls == [[gcs_backend.READ_SCOPE]]
    assert len({id(b._credentials) for b in backends}) == 1
