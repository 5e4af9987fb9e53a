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
    from lazyweights.adapters.hf_export import save_converted

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
