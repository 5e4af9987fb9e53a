"""Hosts in network namespaces this test makes (`ip netns`, veth pairs on one bridge), reading a checkpoint
from an nginx on the root side:

- each host runs one tensor-parallel rank that fetches its shard: the ranks together equal the local
  checkpoint, and the server's log shows what each host fetched;
- a dask.distributed cluster with its scheduler on host 0 and one worker on each host converts the remote
  checkpoint: the saved files equal the local save, and each host fetched part of the checkpoint.

Skips where namespaces cannot be made (not root, no iproute2). The addresses are this test's own LAN, inside
namespaces it made: 10.213.0.1 is the root side (the bridge, nginx, the test's client), 10.213.0.(H+2) host H.
"""
from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port
from test_remote import _adapted, _checkpoint, _fresh

import lazyweights as lw

HOSTS = 2


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def host_address(h: int) -> str:
    return f"10.213.0.{h + 2}"


ROOT_ADDRESS = "10.213.0.1"


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    global _made_count
    _made_count += 1
    tag = f"{os.getpid() % 10000}{_made_count}"
    bridge = f"lw{tag}br"
    made = []
    try:
        # One L2 segment: the hosts reach each other and the root side without IP forwarding.
        _sh("ip", "link", "add", bridge, "type", "bridge")
        made.append(("link", bridge))
        _sh("ip", "addr", "add", f"{ROOT_ADDRESS}/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        for h in range(HOSTS):
            ns, a, b = f"lw{tag}h{h}", f"lw{tag}a{h}", f"lw{tag}b{h}"
            _sh("ip", "netns", "add", ns)
            made.append(("netns", ns))
            _sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            made.append(("link", a))  # deleted before its namespace: a namespace goes away asynchronously
            _sh("ip", "link", "set", b, "netns", ns)
            _sh("ip", "link", "set", a, "master", bridge)
            _sh("ip", "link", "set", a, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{host_address(h)}/24", "dev", b)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", b, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        _remove(made)
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip()}")
    yield [f"lw{tag}h{h}" for h in range(HOSTS)]
    _remove(made)


_made_count = 0


def _remove(made) -> None:
    for kind, name in reversed(made):
        subprocess.run(["ip", "netns", "del", name] if kind == "netns" else ["ip", "link", "del", name],
                       capture_output=True)


@pytest.fixture
def nginx_on_hosts(hosts, tmp_path):
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if exe is None:
        pytest.skip("nginx is not installed")
    root = tmp_path / "root"
    root.mkdir()
    port = free_port()
    listen = f"listen {ROOT_ADDRESS}:{port};"
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


def _env() -> dict:
    """os.environ with this checkout first on PYTHONPATH, for the processes started inside the hosts."""
    here = str(Path(lw.__file__).resolve().parents[1])
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([here] + rest))


def _fetched_per_host(log) -> dict[str, int]:
    """Body bytes nginx sent for GETs, by client address."""
    per_host: dict[str, int] = {}
    for line in open(log):
        addr, method, _, _, sent = line.split()
        if method == "GET":
            per_host[addr] = per_host.get(addr, 0) + int(sent)
    return per_host


RANK = textwrap.dedent("""
    import sys, numpy as np, lazyweights as lw
    url, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    weights = lw.load_weights([url], storage_options={"part_cost": 0})  # exactly the slices' bytes: counted
    part = lw.plan(lw.shard({k: v.data() for k, v in weights.items()}, rank, world)).materialize()
    np.savez(out, **{k: np.atleast_1d(np.asarray(v)).view(np.uint8) for k, v in part.items()})
""")


def test_each_host_fetches_and_materializes_its_shard(hosts, nginx_on_hosts, write_safetensors, tmp_path):
    root, port, log = nginx_on_hosts
    _checkpoint(root / "ckpt", write_safetensors)
    env = _env()
    procs = []
    for h, ns in enumerate(hosts):
        url = f"http://{ROOT_ADDRESS}:{port}/ckpt/model.safetensors.index.json"
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
    per_host = _fetched_per_host(log)
    checkpoint = sum(os.path.getsize(p) for p in (root / "ckpt").glob("*.safetensors"))
    assert set(per_host) == {host_address(h) for h in range(HOSTS)}, per_host
    print(f"bytes fetched per host: {per_host} of a {checkpoint}-byte checkpoint")
    opening = 4 * (64 << 10)  # each host opens the four shards with a GET of their first 64 KiB
    for addr, sent in per_host.items():
        assert sent <= 0.6 * checkpoint + opening, (addr, sent, checkpoint)  # about half each, never the whole


def test_dask_cluster_across_hosts_converts_the_remote_checkpoint(hosts, nginx_on_hosts, write_safetensors, tmp_path):
    """`dask scheduler` on host 0, one `dask worker` on each host, the client on the root side: a W1
    conversion saved through the cluster reads the checkpoint from nginx on the workers' hosts and writes the
    same files as a local save."""
    distributed = pytest.importorskip("distributed")
    root, port, log = nginx_on_hosts
    _checkpoint(root / "ckpt", write_safetensors)
    env, sched_port = _env(), free_port()
    scheduler = f"tcp://{host_address(0)}:{sched_port}"
    logs = tmp_path / "dask-logs"
    logs.mkdir()

    def start(ns, name, *args):
        out = open(logs / f"{name}.log", "w")
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT)

    procs = [start(hosts[0], "scheduler", "distributed.cli.dask_scheduler", "--host", host_address(0),
                   "--port", str(sched_port), "--no-dashboard")]
    try:
        for h, ns in enumerate(hosts):
            procs.append(start(ns, f"worker{h}", "distributed.cli.dask_worker", scheduler, "--host", host_address(h),
                               "--nthreads", "1", "--nworkers", "1", "--no-dashboard", "--name", f"host{h}"))
        _fresh()
        url = f"http://{ROOT_ADDRESS}:{port}/ckpt/model.safetensors.index.json"
        with distributed.Client(scheduler, timeout=60) as client:
            client.wait_for_workers(HOSTS, timeout=90)
            workers = {w["host"] for w in client.scheduler_info()["workers"].values()}
            assert workers == {host_address(h) for h in range(HOSTS)}, workers
            remote_plan = lw.plan(_adapted([url]))
            open(log, "w").close()
            files_d = remote_plan.save(tmp_path / "dist", max_shard_size="256KB", scheduler=client)
    except Exception:
        for f in sorted(logs.iterdir()):
            print(f.name, f.read_text()[-2000:])
        raise
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    files_l = lw.plan(_adapted([str(root / "ckpt")])).save(tmp_path / "local", max_shard_size="256KB")
    names = sorted(os.path.basename(f) for f in files_l)
    assert sorted(os.path.basename(f) for f in files_d) == names and len(names) > 4
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "local", tmp_path / "dist", names, shallow=False)
    assert not mismatch and not errors
    per_host = _fetched_per_host(log)
    checkpoint = sum(os.path.getsize(p) for p in (root / "ckpt").glob("*.safetensors"))
    print(f"dask: bytes fetched per host: {per_host} of a {checkpoint}-byte checkpoint")
    assert all(per_host.get(host_address(h), 0) > 0 for h in range(HOSTS)), per_host  # both hosts read
    assert sum(per_host.values()) <= 1.1 * checkpoint, per_host  # and the cluster read it once
