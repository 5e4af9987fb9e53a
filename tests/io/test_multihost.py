"""Two hosts, each a network namespace this test makes (`ip netns` + veth), each running one tensor-parallel
rank that fetches its shard from an nginx on the root side: the ranks together equal the local checkpoint, and
the server's log shows what each host fetched. Skips where namespaces cannot be made (not root, no iproute2).

The addresses are this test's own hosts, inside namespaces it made: 10.213.H.1 (root side) and 10.213.H.2 (host H).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lazyweights as lw

from conftest import _wait_for, free_port
from test_remote import _checkpoint

HOSTS = 2


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = f"{os.getpid() % 10000}"
    made = []
    try:
        for h in range(HOSTS):
            ns, a, b = f"lw{tag}h{h}", f"lw{tag}a{h}", f"lw{tag}b{h}"
            _sh("ip", "netns", "add", ns)
            made.append(ns)
            _sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            _sh("ip", "link", "set", b, "netns", ns)
            _sh("ip", "addr", "add", f"10.213.{h}.1/24", "dev", a)
            _sh("ip", "link", "set", a, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.213.{h}.2/24", "dev", b)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", b, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip()}")
    yield [f"lw{tag}h{h}" for h in range(HOSTS)]
    for ns in made:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes its veth pair with it


@pytest.fixture
def nginx_on_hosts(hosts, tmp_path):
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if exe is None:
        pytest.skip("nginx is not installed")
    root = tmp_path / "root"
    root.mkdir()
    port = free_port()
    listen = "\n".join(f"listen 10.213.{h}.1:{port};" for h in range(HOSTS))
    (tmp_path / "nginx.conf").write_text(f"""
user root root; daemon off; worker_processes 1; pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log warn;
events {{ worker_connections 128; }}
http {{ log_format counted '$remote_addr $request_method $uri $status $body_bytes_sent';
  access_log {tmp_path}/access.log counted;
  client_body_temp_path {tmp_path}/b; proxy_temp_path {tmp_path}/p; fastcgi_temp_path {tmp_path}/f;
  uwsgi_temp_path {tmp_path}/u; scgi_temp_path {tmp_path}/s;
  server {{ {listen} root {root}; }} }}
""")
    proc = subprocess.Popen([exe, "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield root, port, tmp_path / "access.log"
    finally:
        proc.terminate()
        proc.wait(10)


RANK = textwrap.dedent("""
    import sys, numpy as np, lazyweights as lw
    url, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    weights = lw.load_weights([url])
    part = lw.plan(lw.shard({k: v.data() for k, v in weights.items()}, rank, world)).materialize()
    np.savez(out, **{k: np.atleast_1d(np.asarray(v)).view(np.uint8) for k, v in part.items()})
""")


def test_each_host_fetches_and_materializes_its_shard(hosts, nginx_on_hosts, write_safetensors, tmp_path):
    root, port, log = nginx_on_hosts
    _checkpoint(root / "ckpt", write_safetensors)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(__import__("pathlib").Path(lw.__file__).parents[1])]
                                                       + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    procs = []
    for h, ns in enumerate(hosts):
        url = f"http://10.213.{h}.1:{port}/ckpt/model.safetensors.index.json"
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", RANK, url, str(h),
                                       str(HOSTS), str(tmp_path / f"rank{h}.npz")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    local = {k: v.data().to_numpy() for k, v in lw.load_weights([str(root / "ckpt")]).items()}
    parts = [dict(np.load(tmp_path / f"rank{h}.npz")) for h in range(HOSTS)]
    for name, value in local.items():
        raw = [p[name] for p in parts]
        if value.ndim == 0 or all(r.nbytes == value.nbytes for r in raw):
            for r in raw:  # replicated
                assert r.tobytes() == value.tobytes(), name
            continue
        axis = 1 if "down_proj" in name else 0
        got = np.concatenate([r.view(value.dtype).reshape(-1, *value.shape[1:]) if axis == 0 else
                              r.view(value.dtype).reshape(value.shape[0], -1) for r in raw], axis=axis)
        assert got.tobytes() == value.tobytes(), name  # the union of the shards is the checkpoint
    per_host = {}
    for line in open(log):
        addr, method, _, _, sent = line.split()
        if method == "GET":
            per_host[addr] = per_host.get(addr, 0) + int(sent)
    checkpoint = sum(os.path.getsize(p) for p in (root / "ckpt").glob("*.safetensors"))
    assert set(per_host) == {f"10.213.{h}.2" for h in range(HOSTS)}, per_host
    print(f"bytes fetched per host: {per_host} of a {checkpoint}-byte checkpoint")
    for addr, sent in per_host.items():
        assert sent <= 0.6 * checkpoint, (addr, sent, checkpoint)  # about half each, never the whole
