# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_safedir.replace_file and open_locked: the one durable write and the one lock-file opener
the store, the ledger and the sentinel cursors share."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _safedir


@pytest.fixture
def dir_fd(tmp_path):
    fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def _trace(monkeypatch, fail=None):
    """Record the syscalls replace_file makes, in order; ``fail`` makes that one raise EIO."""
    calls = []
    for name in ("open", "fchmod", "fchown", "write", "fsync", "close", "rename", "unlink"):
        real = getattr(os, name)

        def traced(*args, _name=name, _real=real, **kwargs):
            calls.append(_name)
            if _name == fail:
                raise OSError(errno.EIO, "injected")
            return _real(*args, **kwargs)
        monkeypatch.setattr(os, name, traced)
    return calls


def test_the_write_order_is_tmp_fsync_rename_then_the_directory(tmp_path, dir_fd, monkeypatch):
    (tmp_path / "state").write_bytes(b"old")
    calls = _trace(monkeypatch)
    _safedir.replace_file(dir_fd, "state", ".state.tmp", b"new", 0o640)
    monkeypatch.undo()
    assert calls == ["open", "fchmod", "write", "fsync", "close", "rename", "fsync"]
    assert (tmp_path / "state").read_bytes() == b"new"
    assert stat.S_IMODE(os.stat(str(tmp_path / "state")).st_mode) == 0o640
    assert sorted(os.listdir(str(tmp_path))) == ["state"]


def test_without_sync_dir_the_caller_syncs_after_its_batch(dir_fd, monkeypatch):
    calls = _trace(monkeypatch)
    _safedir.replace_file(dir_fd, "state", ".state.tmp", b"new", 0o600, sync_dir=False)
    monkeypatch.undo()
    assert calls == ["open", "fchmod", "write", "fsync", "close", "rename"]


@pytest.mark.parametrize("fail, step", [("write", "write"), ("fsync", "sync"), ("rename", "rename")])
def test_a_failed_step_before_the_rename_leaves_the_old_file_and_no_tmp(tmp_path, dir_fd, monkeypatch, fail, step):
    (tmp_path / "state").write_bytes(b"old")
    _trace(monkeypatch, fail=fail)
    with pytest.raises(_safedir.WriteStepError) as err:
        _safedir.replace_file(dir_fd, "state", ".state.tmp", b"new", 0o600)
    monkeypatch.undo()
    assert err.value.step == step and err.value.errno == errno.EIO
    assert (tmp_path / "state").read_bytes() == b"old"
    assert sorted(os.listdir(str(tmp_path))) == ["state"]


def test_an_existing_or_symlinked_tmp_is_never_written_through(tmp_path, dir_fd):
    (tmp_path / "elsewhere").write_bytes(b"keep")
    os.symlink(str(tmp_path / "elsewhere"), str(tmp_path / ".state.tmp"))
    with pytest.raises(_safedir.WriteStepError) as err:
        _safedir.replace_file(dir_fd, "state", ".state.tmp", b"new", 0o600)
    assert err.value.step == "create" and err.value.errno == errno.EEXIST
    assert (tmp_path / "elsewhere").read_bytes() == b"keep" and not (tmp_path / "state").exists()


def test_open_locked_refuses_a_symlink_and_a_fifo(tmp_path, dir_fd):
    os.symlink(str(tmp_path / "target"), str(tmp_path / "link.lock"))
    with pytest.raises(_safedir.OpenFailed) as err:
        _safedir.open_locked(dir_fd, "link.lock", str(tmp_path / "link.lock"), 0o600)
    assert err.value.errno == errno.ELOOP and not (tmp_path / "target").exists()
    os.mkfifo(str(tmp_path / "fifo.lock"))
    with pytest.raises(_safedir.NotRegularFile) as err:
        _safedir.open_locked(dir_fd, "fifo.lock", str(tmp_path / "fifo.lock"), 0o600)
    assert err.value.kind == "a FIFO" or "FIFO" in err.value.strerror


def test_open_locked_creates_with_the_exact_mode_when_asked(tmp_path, dir_fd):
    old = os.umask(0o077)
    try:
        fd, info = _safedir.open_locked(dir_fd, "x.lock", str(tmp_path / "x.lock"), 0o640, exact_mode=True)
    finally:
        os.umask(old)
    os.close(fd)
    assert info.st_size == 0 and stat.S_IMODE(os.stat(str(tmp_path / "x.lock")).st_mode) == 0o640
