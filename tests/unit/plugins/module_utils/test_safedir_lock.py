# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_safedir.lock_exclusive: the one lock the store, ledger and cursor writers take is bounded."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _safedir, _sentinel, _sentinel_write


def _holder(path):
    """A separate process holding an exclusive flock on ``path`` until killed."""
    code = ("import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"held\n"
    return proc


def test_a_free_lock_is_taken_at_once(tmp_path):
    fd = os.open(str(tmp_path / "l"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _safedir.lock_exclusive(fd, "l", timeout=0)
        with pytest.raises(OSError):  # held now: a second descriptor cannot take it
            other = os.open(str(tmp_path / "l"), os.O_RDWR)
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(other)
    finally:
        os.close(fd)


def test_a_held_lock_times_out_naming_the_path(tmp_path):
    path = str(tmp_path / "l")
    holder = _holder(path)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(_safedir.LockTimeout) as err:
            _safedir.lock_exclusive(fd, path, timeout=0.3)
        assert err.value.errno == errno.ETIMEDOUT and err.value.filename == path
        assert "timed out after 0.3s" in err.value.strerror
    finally:
        os.close(fd)
        holder.kill()
        holder.wait()


def test_the_sentinel_cursor_lock_no_longer_waits_forever(tmp_path, monkeypatch):
    # Before, a stuck run holding <state_dir>/sentinel/.lock hung every later scan.
    monkeypatch.setattr(_safedir, "LOCK_TIMEOUT", 0.3)
    monkeypatch.setattr(_safedir.lock_exclusive, "__defaults__", (0.3,))
    # The cursor store locks through open_locked, whose default was bound to 60 s
    # when it was defined: without this the test waited the full minute.
    monkeypatch.setattr(_safedir.open_locked, "__defaults__", (0.3, False, False))
    cursors = _sentinel_write.CursorWriter(str(tmp_path))
    cursors.lock()
    cursors.unlock()  # creates the directory and its lock file
    holder = _holder(str(tmp_path / "sentinel" / ".lock"))
    try:
        with pytest.raises(_sentinel.CursorDirError) as err:
            _sentinel_write.CursorWriter(str(tmp_path)).lock()
        assert "timed out" in str(err.value) and str(tmp_path / "sentinel") in str(err.value)
    finally:
        holder.kill()
        holder.wait()
