"""lazyweights.io.atomic: the one way files and folders are written, and the writers that use it.

A folder swap keeps the old folder whole through any failure and leaves no backup or staging folder behind;
temporaries have unique names (a foreign file at `path + ".tmp"` is never touched); a file another program
wrote is fsynced and renamed into place."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import lazyweights as lw
from lazyweights.io import atomic


def _folder(path, text: str) -> str:
    os.makedirs(path)
    with open(os.path.join(path, "f.txt"), "w") as f:
        f.write(text)
    return path


def _fail_second_rename(monkeypatch):
    """os.rename inside io.atomic fails on its second call (the swap's 'staging -> target')."""
    real = os.rename
    calls = []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError(28, "No space left on device (simulated)")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)
    return calls


def test_swap_replaces_a_folder_and_leaves_nothing_beside_it(tmp_path):
    _folder(tmp_path / "out", "old")
    _folder(tmp_path / "new", "fresh")
    atomic.swap_directory(str(tmp_path / "new"), str(tmp_path / "out"))
    assert (tmp_path / "out" / "f.txt").read_text() == "fresh"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_swap_into_a_new_name(tmp_path):
    _folder(tmp_path / "new", "fresh")
    atomic.swap_directory(str(tmp_path / "new"), str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_swap_keeps_the_old_folder_when_the_second_rename_fails(tmp_path, monkeypatch):
    _folder(tmp_path / "out", "old")
    _folder(tmp_path / "new", "fresh")
    calls = _fail_second_rename(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        atomic.swap_directory(str(tmp_path / "new"), str(tmp_path / "out"))
    assert len(calls) == 3  # target -> backup, staging -> target (failed), backup -> target
    assert (tmp_path / "out" / "f.txt").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["new", "out"]  # no .out.old-* backup; staging is the caller's


def test_swap_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "out").write_text("a file")
    _folder(tmp_path / "new", "fresh")
    with pytest.raises(lw.WriteError, match="not a folder"):
        atomic.swap_directory(str(tmp_path / "new"), str(tmp_path / "out"))
    assert (tmp_path / "out").read_text() == "a file"


def test_staging_names_are_unique_hidden_siblings(tmp_path):
    names = {atomic.staging_name(str(tmp_path / "plan.svg")) for _ in range(50)}
    assert len(names) == 50
    assert all(os.path.dirname(n) == str(tmp_path) and os.path.basename(n).startswith(".plan.svg.tmp-")
               for n in names)


def test_commit_file_renames_into_place(tmp_path):
    path = str(tmp_path / "x.bin")
    tmp = atomic.staging_name(path)
    with open(tmp, "wb") as f:
        f.write(b"abc")
    assert atomic.commit_file(tmp, path) == path
    assert open(path, "rb").read() == b"abc" and sorted(os.listdir(tmp_path)) == ["x.bin"]


def _hf_like(values: np.ndarray):
    """An adapter output with `extra_files()`, as GGUF -> HF conversions return (save_converted's folder path)."""
    adapted = {"w": lw.from_numpy(values, "w")}

    class Adapted(dict):
        pass

    out = Adapted(adapted)
    out.extra_files = lambda: {"config.json": b'{"model_type": "llama"}\n'}
    return out


def test_save_converted_keeps_the_old_folder_through_a_failed_swap(tmp_path, monkeypatch):
    # Before io.atomic, save_converted renamed the old folder to .out.old-* and, when the second rename failed,
    # left it there with nothing under the final name: the old folder did not survive, as its docstring said.
    from lazyweights.convert.result import save_converted

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = str(tmp_path / "out")
    save_converted(_hf_like(x), out)
    before = {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)}
    assert set(before) == {"model.safetensors", "config.json"}
    _fail_second_rename(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        save_converted(_hf_like(x * 2), out)
    assert {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no backup, no staging folder
    monkeypatch.undo()
    save_converted(_hf_like(x * 2), out)
    got = lw.load_weights(out)["w"].data().to_numpy()
    assert np.array_equal(got, x * 2) and sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_pictures_use_a_unique_temporary(tmp_path):
    # The dot renderer wrote to the fixed name path + ".tmp" and then deleted it: a foreign file there was lost,
    # and two renders of one path shared the temporary.
    path = tmp_path / "plan.svg"
    foreign = tmp_path / "plan.svg.tmp"
    foreign.write_text("someone else's file")
    p = lw.plan({"w": lw.from_numpy(np.ones((2, 2), np.float32), "w").astype(lw.DType.float16)})
    p.visualize(str(path))
    assert path.read_text().lstrip().startswith(("<?xml", "<svg"))
    assert foreign.read_text() == "someone else's file"
    assert sorted(os.listdir(tmp_path)) == ["plan.svg", "plan.svg.tmp"]


# --- files: a failure leaves the old file and no temporary; temporaries are never shared -------------------------
def _old_file(tmp_path, name="x.bin", data=b"old file"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = _old_file(tmp_path)
    with pytest.raises(RuntimeError, match="mid-write"):
        with atomic.AtomicFile(path, 8) as f:
            f.write(0, b"new!")
            assert os.path.exists(f.tmp_path)
            raise RuntimeError("mid-write")
    assert open(path, "rb").read() == b"old file" and os.listdir(tmp_path) == ["x.bin"]


def test_a_failed_write_is_a_write_error_and_leaves_the_old_file(tmp_path, monkeypatch):
    path = _old_file(tmp_path)

    def full(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "pwrite", full)
    with pytest.raises(lw.WriteError, match="No space left") as ei:
        atomic.write_file_atomically(path, b"a new manifest")
    assert ei.value.path == path
    assert open(path, "rb").read() == b"old file" and os.listdir(tmp_path) == ["x.bin"]


def test_a_failed_rename_is_a_write_error_and_leaves_the_old_file(tmp_path, monkeypatch):
    path = _old_file(tmp_path)

    def refuse(src, dst):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(atomic.os, "replace", refuse)
    with pytest.raises(lw.WriteError, match="Permission denied"):
        atomic.write_file_atomically(path, b"new")
    assert open(path, "rb").read() == b"old file" and os.listdir(tmp_path) == ["x.bin"]


def test_two_writers_at_once_have_their_own_temporaries(tmp_path):
    path = _old_file(tmp_path)
    a, b = atomic.AtomicFile(path, 3), atomic.AtomicFile(path, 3)
    assert a.tmp_path != b.tmp_path
    assert {os.path.dirname(a.tmp_path), os.path.dirname(b.tmp_path)} == {str(tmp_path)}
    assert all(os.path.basename(t).startswith(".x.bin.tmp-") for t in (a.tmp_path, b.tmp_path))
    a.write(0, b"aaa")
    b.write(0, b"bbb")
    assert open(path, "rb").read() == b"old file"  # nothing under the final name until a commit
    a.commit()
    assert open(path, "rb").read() == b"aaa"
    b.commit()
    assert open(path, "rb").read() == b"bbb" and os.listdir(tmp_path) == ["x.bin"]


def test_a_taken_temporary_name_is_never_reused(tmp_path, monkeypatch):
    # mkstemp's rule: the temporary is created with O_EXCL, so a name someone else holds is skipped, not shared
    path = str(tmp_path / "x.bin")
    taken = tmp_path / ".x.bin.tmp-taken"
    taken.write_text("someone else's temporary")
    names = iter([str(taken), str(tmp_path / ".x.bin.tmp-free")])
    monkeypatch.setattr(atomic, "staging_name", lambda p, kind="tmp": next(names))
    atomic.write_file_atomically(path, b"mine")
    assert open(path, "rb").read() == b"mine" and taken.read_text() == "someone else's temporary"
    assert sorted(os.listdir(tmp_path)) == [".x.bin.tmp-taken", "x.bin"]


# --- folders: every failure of the swap is a WriteError, and the old folder is always somewhere whole -----------
def _fail_renames(monkeypatch, failing: set[int]):
    real = os.rename
    calls = []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) in failing:
            raise OSError(28, f"No space left on device (simulated, call {len(calls)})")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)
    return calls


def test_a_failed_swap_is_a_write_error_naming_the_folder(tmp_path, monkeypatch):
    _folder(tmp_path / "out", "old")
    _folder(tmp_path / "new", "fresh")
    _fail_renames(monkeypatch, {2})
    with pytest.raises(lw.WriteError) as ei:
        atomic.swap_directory(str(tmp_path / "new"), str(tmp_path / "out"))
    assert ei.value.path == str(tmp_path / "out")
    assert (tmp_path / "out" / "f.txt").read_text() == "old"
    assert not [n for n in os.listdir(tmp_path) if ".old-" in n]


def test_a_swap_that_cannot_move_the_old_folder_aside_changes_nothing(tmp_path, monkeypatch):
    _folder(tmp_path / "out", "old")
    _folder(tmp_path / "new", "fresh")
    calls = _fail_renames(monkeypatch, {1})
    with pytest.raises(lw.WriteError, match="old folder aside"):
        atomic.swap_directory(str(tmp_path / "new"), str(tmp_path / "out"))
    assert len(calls) == 1 and (tmp_path / "out" / "f.txt").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["new", "out"]


def test_a_swap_that_cannot_put_the_old_folder_back_says_where_it_is(tmp_path, monkeypatch):
    # the last resort: both renames after the first fail; the old folder is whole under the backup name, and
    # the error says so instead of leaving the caller to find it
    _folder(tmp_path / "out", "old")
    _folder(tmp_path / "new", "fresh")
    calls = _fail_renames(monkeypatch, {2, 3})
    with pytest.raises(lw.WriteError, match="the old folder is whole at") as ei:
        atomic.swap_directory(str(tmp_path / "new"), str(tmp_path / "out"))
    backup = calls[0][1]
    assert backup in str(ei.value) and os.path.basename(backup).startswith(".out.old-")
    assert open(os.path.join(backup, "f.txt")).read() == "old"


def test_no_backup_is_left_after_swaps(tmp_path):
    for i in range(3):
        _folder(tmp_path / f"new{i}", f"v{i}")
        atomic.swap_directory(str(tmp_path / f"new{i}"), str(tmp_path / "out"))
        assert sorted(os.listdir(tmp_path)) == ["out"] and (tmp_path / "out" / "f.txt").read_text() == f"v{i}"


def test_save_converted_failing_swap_is_a_write_error(tmp_path, monkeypatch):
    from lazyweights.convert.result import save_converted

    x = np.ones((2, 2), np.float32)
    out = str(tmp_path / "out")
    save_converted(_hf_like(x), out)
    _fail_renames(monkeypatch, {2})
    with pytest.raises(lw.WriteError):
        save_converted(_hf_like(x * 3), out)
    monkeypatch.undo()
    assert np.array_equal(lw.load_weights(out)["w"].data().to_numpy(), x)
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_new_sharded_folder_is_staged_under_a_unique_name_and_swapped_in(tmp_path, monkeypatch):
    # lazy/save.py: a new folder is built under a staging_name sibling; a failed swap removes it
    p = lw.plan({f"w{i}": lw.from_numpy(np.full((64, 64), i, np.float32), f"w{i}") for i in range(3)})
    _fail_renames(monkeypatch, {1})
    with pytest.raises(lw.WriteError):
        p.save(tmp_path / "sharded", max_shard_size="20KB")
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    files = p.save(tmp_path / "sharded", max_shard_size="20KB")
    assert len(files) == 4 and sorted(os.listdir(tmp_path)) == ["sharded"]


# --- pictures: text and dot output both go through the helper ---------------------------------------------------
def _picture_plan():
    return lw.plan({"w": lw.from_numpy(np.ones((2, 2), np.float32), "w").astype(lw.DType.float16)})


def test_a_failed_text_picture_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "plan.html"
    _picture_plan().visualize(str(path))
    good = path.read_text()

    def full(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "pwrite", full)
    with pytest.raises(lw.WriteError):
        _picture_plan().visualize(str(path))
    assert path.read_text() == good and os.listdir(tmp_path) == ["plan.html"]


def test_a_failed_dot_render_keeps_the_old_picture_and_no_temporary(tmp_path, monkeypatch):
    # a stand-in for Graphviz that writes half a picture to its -o file and fails
    from lazyweights.render import visualize as vis

    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nfor a; do out="$a"; done\nprintf "<svg half" > "$out"\necho "dot: boom" >&2\nexit 1\n')
    fake.chmod(0o755)
    pics = tmp_path / "pics"
    pics.mkdir()
    (pics / "plan.svg").write_text("<svg>old</svg>")
    monkeypatch.setattr(vis.shutil, "which", lambda name: str(fake))
    with pytest.raises(lw.ExecutionError, match="boom"):
        _picture_plan().visualize(str(pics / "plan.svg"))
    assert (pics / "plan.svg").read_text() == "<svg>old</svg>" and os.listdir(pics) == ["plan.svg"]
