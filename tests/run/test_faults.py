"""Faults during execution: sources that change under a running plan, kernels that fail mid-plan, writes
that fail (a real, full tmpfs and a patched `os.pwrite`), and a real SIGINT in the middle of a save.

What must hold every time: the process survives (in-process cases) or exits cleanly (subprocess cases:
never SIGBUS/SIGSEGV), the error is a `LazyWeightsError` naming the tensor (and the file), nothing is left
under the final output name, and no temporary is left beside it (on the tmpfs: the space is given back,
so no temporary is even held open).

tests/compiler/test_scheduler.py covers the basics (a failing `take` kernel during a safetensors save, a patched
`pwrite` raising ENOSPC for safetensors, KeyboardInterrupt raised by a patched block, a source changed
before materializing); this file adds the GGUF variants, sources changed *between blocks* and *inside* a
block (the SIGBUS guard of the C casts, EFAULT from a write straight from the map), the real tmpfs and the
real signal.
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

import lazyweights as lw
import lazyweights.run.sinks as save_mod

gguf = pytest.importorskip("gguf")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = np.random.default_rng(5)


def _leftovers(d) -> list[str]:
    return sorted(os.listdir(d))


@pytest.fixture(scope="module")
def st_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    arrays = {f"layers.{i}.w": RNG.standard_normal((64, 48)).astype(np.float32) for i in range(4)}
    save_file(arrays, str(d / "m.safetensors"))
    return str(d / "m.safetensors"), arrays


@pytest.fixture(scope="module")
def gguf_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    path = str(d / "m.gguf")
    w = gguf.GGUFWriter(path, "llama")
    arrays = {}
    for i in range(3):
        x = RNG.standard_normal((32, 64)).astype(np.float32)
        arrays[f"blk.{i}.ffn_up.weight"] = x
        w.add_tensor(f"blk.{i}.ffn_up.weight", x)
        q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.q8.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        arrays[f"blk.{i}.q8.weight"] = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, arrays


def _gguf_plan(path):
    w = lw.load_weights(path)
    out = {}
    for name, acc in w.items():
        d = acc.data()
        out[name] = d.dequantize().astype(lw.DType.float16) if d.quantization_encoding else d.astype(lw.DType.float16)
    return lw.plan(out)


# --- a source truncated or replaced between blocks (subprocess: a SIGBUS would be a crash, not a hang) ---------------
CHANGE_MID_PLAN = r"""
import os, sys, numpy as np
import lazyweights as lw, lazyweights.run.sinks as sinks
fmt, action, mode, d = sys.argv[1:5]
src = os.path.join(d, "src." + fmt)
if fmt == "safetensors":
    from safetensors.numpy import save_file
    save_file({f"t{i}": np.ones((256, 256), np.float32) for i in range(3)}, src)
else:
    import gguf
    w = gguf.GGUFWriter(src, "llama")
    for i in range(3):
        w.add_tensor(f"t{i}", np.ones((256, 256), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
weights = lw.load_weights(src)
plan = lw.plan({n: a.data().astype(lw.DType.float16) for n, a in weights.items()})
n = [0]
def change():
    if mode == "truncate":
        os.truncate(src, os.path.getsize(src) // 2)
    else:
        os.replace(src, src + ".old")
        with open(src, "wb") as fh:
            fh.write(open(src + ".old", "rb").read())
def wrap(real):
    def block(*args):
        n[0] += 1
        if n[0] == 3:
            change()
        return real(*args)
    return block
out_dir = os.path.join(d, "out"); os.makedirs(out_dir)
try:
    if action == "materialize":
        sinks.MemorySink.run_block = wrap(sinks.MemorySink.run_block)
        plan.materialize(scheduler="sync", block_bytes=16384)
    else:
        sinks.write_block = wrap(sinks.write_block)
        plan.save(os.path.join(out_dir, "o." + fmt), scheduler="sync", block_bytes=16384, require_architecture=False)
    print("NO ERROR")
except lw.SourceChangedError as e:
    print("OK", e)
print("LEFT", sorted(os.listdir(out_dir)))
"""


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
@pytest.mark.parametrize("action", ["materialize", "save"])
@pytest.mark.parametrize("mode", ["truncate", "replace"])
def test_source_changed_between_blocks(tmp_path, fmt, action, mode):
    script = tmp_path / "s.py"
    script.write_text(CHANGE_MID_PLAN)
    r = subprocess.run([sys.executable, str(script), fmt, action, mode, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # -7 would be SIGBUS
    assert r.stdout.startswith("OK "), r.stdout + r.stderr[-2000:]
    assert f"src.{fmt}" in r.stdout and "while reading tensor 't" in r.stdout
    assert ("size changed" in r.stdout) if mode == "truncate" else ("replaced" in r.stdout)
    assert "LEFT []" in r.stdout, r.stdout


# --- a source truncated *during* a block, after the check before it (the SIGBUS race) -------------------------------
# The executors check a source before each block; a truncation after that check makes the block's next read of a
# lost page raise SIGBUS. The compiled casts catch it (their guard, kernels/_ccasts.c), and a write() straight from
# the map fails with EFAULT; both must become SourceChangedError naming the tensor and the file, with nothing left
# under the output's name. The truncation happens between a block's view of the map and the read from it (the cast
# kernel, the pwrite), where no check can see it. (numpy's own copies have no guard: with
# LAZYWEIGHTS_CAST_KERNELS=numpy this race still ends the process.)
TRUNCATE_IN_BLOCK = r"""
import os, sys, numpy as np
import lazyweights as lw
from lazyweights.io.atomic import AtomicFile as StreamingFile
from lazyweights.kernels import casts
action, op, d = sys.argv[1:4]
src = os.path.join(d, "src.safetensors")
from safetensors.numpy import save_file
rng = np.random.default_rng(0)
save_file({f"t{i}": rng.standard_normal((512, 512)).astype(np.float32) for i in range(3)}, src)
weights = lw.load_weights(src)
if op == "cast":
    plan = lw.plan({n: a.data().astype(lw.DType.bfloat16) for n, a in weights.items()})
else:
    plan = lw.plan({n: a.data() for n, a in weights.items()})
n = [0]
def truncating(real):
    def inner(*args, **kwargs):
        if any(isinstance(a, np.ndarray) for a in args):
            n[0] += 1
            if n[0] == 3:
                os.truncate(src, 1000)  # the block's source views exist: its checks are behind it
        return real(*args, **kwargs)
    return inner
if op == "cast":
    casts.cast_into = truncating(casts.cast_into)  # between the view of the map and the kernel reading it
else:
    StreamingFile.write = truncating(StreamingFile.write)  # between the view and the pwrite() from it
out_dir = os.path.join(d, "out"); os.makedirs(out_dir)
try:
    if action == "materialize":
        plan.materialize(scheduler="sync", block_bytes=65536)
    else:
        plan.save(os.path.join(out_dir, "o.safetensors"), scheduler="sync", block_bytes=65536)
    print("NO ERROR")
except lw.SourceChangedError as e:
    print("OK", e, "| cause:", repr(e.__cause__))
print("LEFT", sorted(os.listdir(out_dir)))
"""


@pytest.mark.parametrize("action,op", [("materialize", "cast"), ("save", "cast"), ("save", "copy")])
def test_source_truncated_during_a_block(tmp_path, action, op):
    from lazyweights.kernels import casts

    if op == "cast" and casts.kernel_backend() != "c":
        pytest.skip("only the compiled C casts guard against SIGBUS; LAZYWEIGHTS_CAST_KERNELS switched them off")
    script = tmp_path / "s.py"
    script.write_text(TRUNCATE_IN_BLOCK)
    r = subprocess.run([sys.executable, str(script), action, op, str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # -7 would be SIGBUS
    assert r.stdout.startswith("OK "), r.stdout + r.stderr[-2000:]
    assert "src.safetensors" in r.stdout and "while reading tensor 't" in r.stdout, r.stdout
    assert "size changed" in r.stdout and "to 1000 bytes" in r.stdout, r.stdout
    cause = r.stdout.split("| cause:")[1]  # it came from the read (or the write from the map), not a later check
    assert "OSError(14, " in cause if op == "cast" else "WriteError(" in cause and "Bad address" in cause, r.stdout
    assert "LEFT []" in r.stdout, r.stdout


GUARD_SCRIPT = r"""
import faulthandler, mmap, os, sys, numpy as np
from lazyweights.kernels import _ccasts as K
path, mode = sys.argv[1:3]
rng = np.random.default_rng(1)
rng.integers(0, 1 << 16, 1 << 20, dtype=np.uint16).tofile(path)
fd = os.open(path, os.O_RDONLY)
src = np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), np.uint16)
os.close(fd)
out = np.empty(1 << 20, np.uint16)
K.k_bf16_to_f16(src, out, 1024, 1024, 0, 1024)
assert (out.view(np.float16) == src.view(np.uint16).astype(np.uint32).__lshift__(16).view(np.float32)
        .astype(np.float16)).sum() > 0
if mode == "faulthandler":
    faulthandler.enable()  # replaces the kernels' handler; the next kernel call must put it back
os.truncate(path, 4096)
for attempt in range(2):
    try:
        K.k_bf16_to_f16(src, out, 1024, 1024, 0, 1024)
        print("NO ERROR")
    except OSError as e:
        print("caught", e.errno, e)
K.k_bf16_to_f16(src, out, 1, 1024, 0, 1024)  # the first page still exists: still works
print("first page ok", flush=True)
print(int(src[-1]))  # a lost page read by numpy, outside any kernel: the process must still die of SIGBUS
print("NOT REACHED")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGBUS"), reason="no SIGBUS on this platform")
@pytest.mark.parametrize("mode", ["plain", "faulthandler"])
def test_c_kernels_turn_sigbus_into_oserror(tmp_path, mode):
    """The guard catches SIGBUS inside a kernel, every time, even after faulthandler replaced its handler;
    outside the kernels SIGBUS keeps its default action (and faulthandler still prints its traceback)."""
    from lazyweights.kernels import casts

    if not casts.HAVE_C:
        pytest.skip("the C kernels were not built, or LAZYWEIGHTS_CAST_KERNELS turned them off")
    script = tmp_path / "g.py"
    script.write_text(GUARD_SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "f.bin"), mode], capture_output=True,
                       text=True, timeout=60)
    lines = r.stdout.splitlines()
    assert lines[:2] == [f"caught {errno.EFAULT} [Errno {errno.EFAULT}] a page of the source could not be read "
                         "(SIGBUS): a memory-mapped file was truncated while it was being read"] * 2, r.stdout
    assert lines[2:] == ["first page ok"], r.stdout + r.stderr
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr[-2000:])
    assert ("Fatal Python error: Bus error" in r.stderr) == (mode == "faulthandler"), r.stderr


# --- an exception inside a kernel mid-plan ---------------------------------------------------------------------
def test_kernel_failure_mid_materialize_threads(st_ckpt, monkeypatch):
    """A cast kernel raising on its 3rd block: ExecutionError naming the tensor; the process (and dask's pool)
    keeps working: the same plan then materializes correctly."""
    import lazyweights.kernels.casts as casts

    path, arrays = st_ckpt
    w = lw.load_weights(path)
    plan = lw.plan({n: a.data().astype(lw.DType.float16) for n, a in w.items()})
    real, calls = casts.cast_into, [0]

    def failing(src, dst):
        calls[0] += 1
        if calls[0] == 3:
            raise MemoryError("injected")
        return real(src, dst)

    monkeypatch.setattr(casts, "cast_into", failing)
    with pytest.raises(lw.ExecutionError) as ei:
        plan.materialize(scheduler="threads", block_bytes=1024)
    assert ei.value.tensor in arrays and repr(ei.value.tensor) in str(ei.value) and "injected" in str(ei.value)
    monkeypatch.setattr(casts, "cast_into", real)
    got = plan.materialize(scheduler="threads", block_bytes=1024)
    for n, a in arrays.items():
        np.testing.assert_array_equal(got[n], a.astype(np.float16))


def test_kernel_failure_mid_gguf_save(gguf_ckpt, tmp_path, monkeypatch):
    """A failing dequantize kernel during a GGUF save: names the tensor, no file and no temporary left."""
    import lazyweights.quant as quant

    path, _ = gguf_ckpt
    plan = _gguf_plan(path)
    real = quant.dequantize

    def failing(encoding, blocks):
        raise RuntimeError("dequantize blew up")

    monkeypatch.setattr(quant, "dequantize", failing)
    monkeypatch.setattr(quant, "dequantize_into", lambda *a, **k: failing(*a[:2]))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(lw.ExecutionError) as ei:
        plan.save(out / "o.gguf", scheduler="threads", block_bytes=512, require_architecture=False)
    assert ei.value.tensor and ei.value.tensor.endswith("q8.weight") and "blew up" in str(ei.value)
    assert _leftovers(out) == []
    monkeypatch.setattr(quant, "dequantize", real)


def test_failing_block_waits_for_blocks_in_flight(tmp_path, monkeypatch):
    """Regression: when one block failed, dask returned at once while other blocks were still running; they
    then wrote to a closed descriptor, or, once the number was reused, into an unrelated file."""
    plan = lw.plan({f"t{i}": lw.WeightData.from_numpy(np.ones((64, 64), np.float32), f"t{i}") for i in range(2)})
    real = save_mod.write_block
    finished = []

    def block(task):
        step, rows = task[0], task[1]
        if step.outputs[0] == "t0" and rows.start == 0:
            raise RuntimeError("first block fails")
        time.sleep(0.2)
        real(task)
        finished.append(time.monotonic())
        return 0

    monkeypatch.setattr(save_mod, "write_block", block)
    with pytest.raises(lw.ExecutionError):
        plan.save(tmp_path / "o.safetensors", scheduler="threads", workers=2, block_bytes=4096)
    returned = time.monotonic()
    # A file opened now may get the descriptor the failed save closed; nothing may write into it.
    victim = tmp_path / "victim.bin"
    with open(victim, "wb") as fh:
        fh.write(b"x" * 16)
        time.sleep(0.5)
    assert victim.read_bytes() == b"x" * 16
    assert all(t <= returned for t in finished)
    assert _leftovers(tmp_path) == ["victim.bin"]


# --- failing writes: a patched pwrite (GGUF) and a real, full tmpfs -----------------------------------------------
def test_gguf_save_pwrite_enospc(gguf_ckpt, tmp_path, monkeypatch):
    path, _ = gguf_ckpt
    plan = _gguf_plan(path)
    real, count = os.pwrite, [0]

    def flaky(fd, data, offset):
        count[0] += 1
        if count[0] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", flaky)
    with pytest.raises(lw.WriteError) as ei:
        plan.save(tmp_path / "o.gguf", scheduler="threads", require_architecture=False)
    assert "o.gguf" in str(ei.value) and "No space left" in str(ei.value) and ei.value.tensor
    assert _leftovers(tmp_path) == []


def test_index_write_failure_removes_shards_from_existing_directory(st_ckpt, tmp_path, monkeypatch):
    """Regression: shards already renamed into an existing directory stayed there, without their index."""
    path, _ = st_ckpt
    plan = lw.plan({n: a.data() for n, a in lw.load_weights(path).items()})
    (tmp_path / "README").write_text("keep")

    def no_space(directory, doc):
        raise lw.WriteError(f"{directory}: index: No space left on device", path=directory)

    import lazyweights.lazy.save as api_save

    monkeypatch.setattr(api_save, "_write_index", no_space)
    with pytest.raises(lw.WriteError):
        plan.save(tmp_path, max_shard_size="20kB")
    assert _leftovers(tmp_path) == ["README"]


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 1 MiB tmpfs (needs root and mount permission; skipped otherwise)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _free(mnt) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def _big_plan(tmp_path):
    """~2 MiB of output (more than the tmpfs holds) from a small source."""
    src = tmp_path / "src.safetensors"
    save_file({f"w{i}": RNG.standard_normal((256, 256)).astype(np.float16) for i in range(4)}, str(src))
    w = lw.load_weights(src)
    return lw.plan({n: a.data().astype(lw.DType.float32) for n, a in w.items()})


@pytest.mark.parametrize("case", ["safetensors", "safetensors-no-fallocate", "sharded-dir", "gguf"])
def test_real_full_tmpfs(tiny_tmpfs, tmp_path, monkeypatch, case):
    plan = _big_plan(tmp_path)
    empty = _free(tiny_tmpfs)
    if case == "safetensors-no-fallocate":  # a filesystem without fallocate: ENOSPC comes from pwrite itself
        def no_fallocate(fd, offset, length):
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")

        monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    target = {"gguf": tiny_tmpfs / "o.gguf", "sharded-dir": tiny_tmpfs / "out"}.get(case, tiny_tmpfs / "o.safetensors")
    with pytest.raises(lw.WriteError) as ei:
        plan.save(target, max_shard_size="600kB" if case == "sharded-dir" else None, scheduler="threads",
                  require_architecture=False)
    msg = str(ei.value)
    assert str(tiny_tmpfs) in msg and ("No space left" in msg or "not enough disk space" in msg), msg
    if case in ("safetensors-no-fallocate", "gguf"):
        assert ei.value.tensor and repr(ei.value.tensor) in msg  # failed mid-write: names the tensor
    assert _leftovers(tiny_tmpfs) == []
    assert _free(tiny_tmpfs) == empty, "a temporary is still held open"
    # The file system is usable again: a plan that fits is saved, complete.
    small = lw.plan({"w": lw.WeightData.from_numpy(np.arange(1000, dtype=np.float32), "w")})
    small.save(tiny_tmpfs / "small.safetensors")
    assert lw.load_weights(tiny_tmpfs / "small.safetensors")["w"].data().to_numpy()[999] == 999


# --- a real SIGINT in the middle of a ~200 MB save --------------------------------------------------------------------
SIGINT_SAVE = r"""
import os, sys, time
import numpy as np
import lazyweights as lw, lazyweights.run.sinks as sinks
from safetensors.numpy import save_file
src_dir, out, fmt, sched = sys.argv[1:5]
src = os.path.join(src_dir, "src.safetensors")
save_file({"a": np.ones((6400, 4096), np.float16), "b": np.full((6400, 4096), 2, np.float16)}, src)  # 100 MB
import faulthandler, signal, threading
faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack before it gives up on us
# The signal is real (sent by the test to this process); the default handler raises KeyboardInterrupt in the
# main thread. We also note it, so that blocks stalled below (to make sure it lands mid-save on any number of
# cores) go on at full speed once it arrived. The note is a plain list item, polled: the handler runs in the
# main thread between any two bytecodes, so it must take no lock. (It once called threading.Event.set(),
# whose lock the main thread could hold inside Event.wait() right then: a self-deadlock, a 120 s hang in CI.)
arrived = [False]
def on_sigint(signum, frame):
    arrived[0] = True
    signal.default_int_handler(signum, frame)
signal.signal(signal.SIGINT, on_sigint)
def wait_for_sigint(limit):
    deadline = time.monotonic() + limit
    while not arrived[0] and time.monotonic() < deadline:
        time.sleep(0.002)
real = sinks.write_block
count = [0]
lock = threading.Lock()
def block(task):
    with lock:
        count[0] += 1
        n = count[0]
    if n == 4:
        print("SAVING", flush=True)  # three blocks are written: we are mid-save
    if n >= 4:
        wait_for_sigint(5.0)
    return real(task)
sinks.write_block = block
if fmt == "cli":
    adapter = os.path.join(src_dir, "adapter.py")
    with open(adapter, "w") as fh:
        fh.write("import lazyweights as lw\n"
                 "def convert(sd, **kw):\n"
                 "    return {k: v.data().astype(lw.DType.float32) for k, v in sd.items()}\n")
    from lazyweights.tools.cli import main
    rc = main(["convert", adapter + ":convert", src, "-o", out, "--no-progress", "--max-shard-size", "64MB"])
    print("EXIT", rc, flush=True)
    sys.exit(rc)
w = lw.load_weights(src)
plan = lw.plan({n: a.data().astype(lw.DType.float32) for n, a in w.items()})  # 200 MB out
try:
    plan.save(out, format=fmt, scheduler=sched, block_bytes=1 << 20, require_architecture=False,
              max_shard_size="64MB" if not out.endswith((".safetensors", ".gguf")) else None)
    print("FINISHED", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    sys.exit(130)
"""


@pytest.mark.parametrize("fmt,sched,name", [
    ("safetensors", "threads", "out_dir"),        # sharded: a staging directory
    ("safetensors", "sync", "o.safetensors"),
    ("gguf", "threads", "o.gguf"),
    ("cli", "threads", "cli_out"),                # `lazyweights convert`: exit 130, 'interrupted'
])
def test_real_sigint_mid_save(tmp_path, fmt, sched, name):
    src_dir, out_parent = tmp_path / "src", tmp_path / "out"
    src_dir.mkdir()
    out_parent.mkdir()
    script = tmp_path / "s.py"
    script.write_text(SIGINT_SAVE)
    p = subprocess.Popen([sys.executable, str(script), str(src_dir), str(out_parent / name), fmt, sched],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert line.strip() == "SAVING", line + p.stderr.read()
        assert p.poll() is None
        partial = [f for f in os.listdir(out_parent)]
        assert partial, "mid-save, the temporary output exists"
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGUSR1)  # faulthandler: where every thread is stuck, for the failure
            time.sleep(1)
            p.kill()
            out, err = p.communicate()
            pytest.fail(f"no exit 120 s after SIGINT; stdout {out!r}; the threads' stacks:\n{err[-6000:]}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, (p.returncode, out, err[-3000:])
    if fmt == "cli":
        assert "EXIT 130" in out and "lazyweights: interrupted" in err, (out, err)
    else:
        assert "INTERRUPTED" in out and "FINISHED" not in out
    assert "Traceback" not in err, err[-3000:]
    assert _leftovers(out_parent) == [], "no output and no temporary after the interrupt"


def test_source_fault_error_translation(tmp_path):
    """EFAULT (bare, or as a WriteError's cause) becomes SourceChangedError naming the changed file; with every
    source unchanged it still names the sources; any other error is left alone."""
    from lazyweights.compiler.steps import compile_steps
    from lazyweights.core.errors import WriteError
    from lazyweights.run.driver import source_fault_error

    path = tmp_path / "a.safetensors"
    save_file({"w": np.arange(64, dtype=np.float32)}, str(path))
    weights = lw.load_weights(str(path))
    step = compile_steps(lw.plan({"w": weights["w"].data().astype(lw.DType.float16)}))[0]
    fault = OSError(errno.EFAULT, "Bad address")
    assert source_fault_error(OSError(errno.ENOSPC, "full"), step) is None
    assert source_fault_error(ValueError("x"), step) is None
    unchanged = source_fault_error(fault, step)
    assert isinstance(unchanged, lw.SourceChangedError)
    assert str(path) in str(unchanged) and "'w'" in str(unchanged) and "could not be read" in str(unchanged)
    os.truncate(path, 100)
    wrapped = WriteError("out.safetensors: write failed (tensor 'w'): Bad address", path="out.safetensors", tensor="w")
    wrapped.__cause__ = fault
    for e in (fault, wrapped):
        changed = source_fault_error(e, step)
        assert isinstance(changed, lw.SourceChangedError)
        assert str(path) in str(changed) and "while reading tensor 'w'" in str(changed)
        assert "to 100 bytes" in str(changed)
