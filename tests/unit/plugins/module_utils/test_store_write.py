# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_store_write.update_store: hypeman's durable write procedure, fail-closed loads, faults, symlinks."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _store_write
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._gotime import parse_rfc3339
from ansible_collections.hypeman.vgpu.plugins.module_utils._store import load_store
from ansible_collections.hypeman.vgpu.plugins.module_utils._store_write import update_store

VF = "0000:82:00.4"
NOW = parse_rfc3339("2026-08-20T15:00:00.5Z")
VALID = (b'{\n  "version": 1,\n  "records": [\n    {\n      "vf_address": "0000:82:00.5",\n'
         b'      "quarantined_at": "2026-08-22T00:00:00Z"\n    }\n  ]\n}')


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "data")


def store_path(data_dir):
    return os.path.join(data_dir, "gpu", "vf-health.json")


def put(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


def quarantine(store):
    return store.quarantine(VF, NOW)


def test_first_write_creates_dirs_and_file_with_hypemans_modes(data_dir):
    path = store_path(data_dir)
    old_umask = os.umask(0o077)
    try:
        result = update_store(path, quarantine)
    finally:
        os.umask(old_umask)
    assert result.changed and result.result == "quarantined"
    assert result.before is None
    assert read(path) == result.after == (
        b'{\n  "version": 1,\n  "records": [\n    {\n      "vf_address": "0000:82:00.4",\n'
        b'      "quarantined_at": "2026-08-20T15:00:00.5Z"\n    }\n  ]\n}')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o755
    assert not os.path.exists(path + ".tmp")
    assert load_store(path).quarantined() == [VF]


def test_check_mode_predicts_and_touches_nothing(data_dir):
    path = store_path(data_dir)
    result = update_store(path, quarantine, check_mode=True)
    assert result.changed and result.after.startswith(b'{\n  "version": 1')
    assert not os.path.exists(data_dir)
    put(path, VALID)
    result = update_store(path, quarantine, check_mode=True)
    assert result.changed and result.before == VALID
    assert read(path) == VALID
    assert os.listdir(os.path.dirname(path)) == ["vf-health.json"]  # no tmp, no lock file


def test_unchanged_mutation_writes_nothing(data_dir):
    path = store_path(data_dir)
    put(path, VALID)
    mtime = os.stat(path).st_mtime_ns
    result = update_store(path, lambda store: store.quarantine("0000:82:00.5", NOW))
    assert (result.changed, result.result, result.before, result.after) == (False, "unchanged", VALID, VALID)
    assert os.stat(path).st_mtime_ns == mtime


def test_missing_store_left_missing_when_nothing_changes(data_dir):
    path = store_path(data_dir)
    result = update_store(path, lambda store: store.remove(VF))
    assert (result.changed, result.after) == (False, None)
    assert not os.path.exists(data_dir)


def test_non_canonical_but_valid_file_is_not_rewritten_for_nothing(data_dir):
    path = store_path(data_dir)
    compact = b'{"version":1,"records":[{"vf_address":"0000:82:00.5","quarantined_at":"2026-08-22T00:00:00.000Z"}]}'
    put(path, compact)
    assert not update_store(path, lambda store: store.remove(VF)).changed
    assert read(path) == compact
    assert update_store(path, quarantine).changed
    assert read(path).startswith(b'{\n  "version": 1,')


@pytest.mark.parametrize("content, reason", [
    (b"not json", "invalid character 'o' in literal null (expecting 'u')"),
    (b"[]", "json: cannot unmarshal array into Go value of type devices.vfHealthFile"),
    (b'{"version":0,"records":[]}', "unsupported version 0"),
])
def test_invalid_store_fails_closed_and_stays_byte_identical(data_dir, content, reason):
    path = store_path(data_dir)
    put(path, content)
    for check_mode in (True, False):
        with pytest.raises(VgpuError) as err:
            update_store(path, quarantine, check_mode=check_mode)
        assert path in err.value.msg and reason in err.value.msg
        assert read(path) == content
    assert sorted(os.listdir(os.path.dirname(path))) in (["vf-health.json"], ["vf-health.json", "vf-health.json.lock"])


def test_allow_invalid_lets_a_repair_rewrite(data_dir):
    path = store_path(data_dir)
    put(path, b"[]")
    backups = []

    def repair(store):
        store.replace_records(_store_write.recover_records(store.raw, NOW))
        return "repaired"

    def backup(target):
        backups.append(target + ".bak")
        os.link(target, backups[-1])
        return backups[-1]

    result = update_store(path, repair, allow_invalid=True, backup=backup)
    assert result.changed and (result.loaded_format, result.loaded_valid) == ("legacy", False)
    assert result.backup_file == backups[0] and read(backups[0]) == b"[]"
    assert load_store(path).valid


def test_after_write_runs_under_the_lock_only_on_change(data_dir):
    path = store_path(data_dir)
    calls = []

    def after_write(result):
        fd = os.open(path + ".lock", os.O_RDWR)
        try:
            import fcntl
            with pytest.raises(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        calls.append(result.changed)

    update_store(path, quarantine, after_write=after_write)
    update_store(path, quarantine, after_write=after_write)
    assert calls == [True]


def test_write_follows_hypemans_order(data_dir, monkeypatch):
    path = store_path(data_dir)
    put(path, VALID)
    trace = []
    real_open, real_fsync, real_rename, real_write = os.open, os.fsync, os.rename, os.write
    names = {}

    def fake_open(name, flags, mode=0o777, **kwargs):
        fd = real_open(name, flags, mode, **kwargs)
        names[fd] = name
        if name.endswith(".tmp"):
            trace.append(("open", os.path.basename(name), flags & os.O_CREAT != 0, mode,
                          kwargs.get("dir_fd") is not None))
        return fd

    def fake_fsync(fd):
        trace.append(("fsync", names.get(fd)))
        return real_fsync(fd)

    def fake_write(fd, data):
        if names.get(fd, "").endswith(".tmp"):
            trace.append(("write", len(data)))
        return real_write(fd, data)

    def fake_rename(src, dst, **kwargs):
        trace.append(("rename", os.path.basename(src), os.path.basename(dst), sorted(kwargs)))
        return real_rename(src, dst, **kwargs)

    monkeypatch.setattr(_store_write.os, "open", fake_open)
    monkeypatch.setattr(_store_write.os, "fsync", fake_fsync)
    monkeypatch.setattr(_store_write.os, "write", fake_write)
    monkeypatch.setattr(_store_write.os, "rename", fake_rename)
    result = update_store(path, quarantine)
    monkeypatch.undo()
    # Every step goes through the directories held open (names are relative to their fds).
    assert trace == [
        ("fsync", os.path.basename(data_dir)),    # the gpu dir's parent
        ("open", "vf-health.json.tmp", True, 0o644, True),
        ("write", len(result.after)),
        ("fsync", "vf-health.json.tmp"),
        ("rename", "vf-health.json.tmp", "vf-health.json", ["dst_dir_fd", "src_dir_fd"]),
        ("fsync", "gpu"),                         # the gpu dir
    ]


def test_owner_of_previous_file_is_kept(data_dir):
    path = store_path(data_dir)
    put(path, VALID)
    os.chown(path, 4321, 4322)
    update_store(path, quarantine)
    info = os.stat(path)
    assert (info.st_uid, info.st_gid) == (4321, 4322)


# --- faults: the old file stays intact and valid ---------------------------------------------


def _fail_on(monkeypatch, name, err_no, when=lambda *args: True):
    real = getattr(os, name)

    def failing(*args, **kwargs):
        if when(*args):
            raise OSError(err_no, os.strerror(err_no))
        return real(*args, **kwargs)

    monkeypatch.setattr(_store_write.os, name, failing)


def _is_tmp(name, *rest):
    return isinstance(name, str) and name.endswith(".tmp")


@pytest.mark.parametrize("name, err_no, when, step", [
    ("open", errno.EACCES, _is_tmp, "create VF health state: Permission denied"),        # unwritable dir
    ("open", errno.EROFS, _is_tmp, "create VF health state: Read-only file system"),
    ("write", errno.ENOSPC, lambda *a: True, "write VF health state: No space left on device"),  # disk full
    ("fsync", errno.EIO, lambda fd: not stat.S_ISDIR(os.fstat(fd).st_mode), "sync VF health state: Input/output error"),
    ("fsync", errno.EIO, lambda fd: stat.S_ISDIR(os.fstat(fd).st_mode), "sync VF health state parent dir"),
    ("rename", errno.EXDEV, lambda *a: True, "rename VF health state: Invalid cross-device link"),
])
def test_faults_before_rename_leave_old_file(data_dir, monkeypatch, name, err_no, when, step):
    path = store_path(data_dir)
    put(path, VALID)
    _fail_on(monkeypatch, name, err_no, when)
    with pytest.raises(VgpuError) as err:
        update_store(path, quarantine)
    monkeypatch.undo()
    assert step in err.value.msg and path in err.value.msg and "previous file is unchanged" in err.value.msg
    assert read(path) == VALID and load_store(path).valid
    assert not os.path.exists(path + ".tmp")


def test_unwritable_parent_for_missing_gpu_dir(data_dir, monkeypatch):
    path = store_path(data_dir)
    _fail_on(monkeypatch, "mkdir", errno.EACCES)
    with pytest.raises(VgpuError) as err:
        update_store(path, quarantine)
    assert "create VF health state dir: Permission denied" in err.value.msg
    assert not os.path.exists(path)


def test_gpu_dir_blocked_by_a_file(data_dir):
    # hypeman's own test: a file where the directory should be.
    os.makedirs(data_dir)
    put(os.path.join(data_dir, "gpu"), b"blocker")
    path = store_path(data_dir)
    with pytest.raises(VgpuError) as err:
        update_store(path, quarantine)
    assert "not a directory" in err.value.msg.lower()
    assert read(os.path.join(data_dir, "gpu")) == b"blocker"


def test_dir_fsync_failure_after_rename_is_reported_but_new_state_is_visible(data_dir, monkeypatch):
    path = store_path(data_dir)
    put(path, VALID)
    gpu = os.stat(os.path.dirname(path))
    real_fsync = os.fsync

    def failing(fd):
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) == (gpu.st_dev, gpu.st_ino):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    monkeypatch.setattr(_store_write.os, "fsync", failing)
    with pytest.raises(VgpuError) as err:
        update_store(path, quarantine)
    assert "was replaced, but syncing its directory failed" in err.value.msg
    monkeypatch.undo()
    assert load_store(path).quarantined() == ["0000:82:00.4", "0000:82:00.5"]


# --- symlinks ------------------------------------------------------------------------------


def test_symlinked_store_is_refused(tmp_path, data_dir):
    path = store_path(data_dir)
    target = tmp_path / "elsewhere.json"
    target.write_bytes(VALID)
    os.makedirs(os.path.dirname(path))
    os.symlink(str(target), path)
    for check_mode in (True, False):
        with pytest.raises(VgpuError) as err:
            update_store(path, quarantine, check_mode=check_mode)
        assert "is a symlink" in err.value.msg and path in err.value.msg
    assert target.read_bytes() == VALID and os.path.islink(path)
    assert load_store(path).is_symlink  # hypeman would read through it; we report it


def test_symlinked_tmp_is_refused(tmp_path, data_dir):
    path = store_path(data_dir)
    put(path, VALID)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(str(victim), path + ".tmp")
    with pytest.raises(VgpuError) as err:
        update_store(path, quarantine)
    assert "temporary file" in err.value.msg and "symlink" in err.value.msg
    assert victim.read_bytes() == b"precious" and read(path) == VALID


def test_dangling_symlinked_tmp_creates_nothing(tmp_path, data_dir):
    path = store_path(data_dir)
    put(path, VALID)
    os.symlink(str(tmp_path / "would-be-created"), path + ".tmp")
    with pytest.raises(VgpuError):
        update_store(path, quarantine)
    assert not (tmp_path / "would-be-created").exists()


def test_hard_linked_stale_tmp_is_replaced_not_truncated(tmp_path, data_dir):
    path = store_path(data_dir)
    put(path, VALID)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.link(str(victim), path + ".tmp")
    update_store(path, quarantine)
    assert victim.read_bytes() == b"precious"
    assert load_store(path).quarantined() == ["0000:82:00.4", "0000:82:00.5"]


def test_stale_regular_tmp_from_a_killed_writer_is_replaced(data_dir):
    path = store_path(data_dir)
    put(path, VALID)
    put(path + ".tmp", b'{"half": ')
    update_store(path, quarantine)
    assert not os.path.exists(path + ".tmp") and load_store(path).valid


def test_symlinked_lock_file_is_refused(tmp_path, data_dir):
    path = store_path(data_dir)
    put(path, VALID)
    os.symlink(str(tmp_path / "lock-target"), path + ".lock")
    with pytest.raises(VgpuError) as err:
        update_store(path, quarantine)
    assert "symlink" in err.value.msg
    assert read(path) == VALID and not (tmp_path / "lock-target").exists()


def test_data_dir_symlink_to_another_disk_works(tmp_path):
    real = tmp_path / "other-disk" / "hypeman"
    real.mkdir(parents=True)
    link = tmp_path / "var-lib-hypeman"
    os.symlink(str(real), str(link))
    path = store_path(str(link))
    assert update_store(path, quarantine).changed
    assert load_store(str(real / "gpu" / "vf-health.json")).quarantined() == [VF]
    assert os.path.islink(str(link))


def test_lock_timeout_is_a_clear_error(data_dir):
    import fcntl
    path = store_path(data_dir)
    put(path, VALID)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(VgpuError) as err:
            update_store(path, quarantine, lock_timeout=0.2)
        assert "timed out" in err.value.msg and path + ".lock" in err.value.msg
    finally:
        os.close(fd)
    assert read(path) == VALID


def test_gpu_dir_swapped_for_a_symlink_mid_run_cannot_redirect_the_write(tmp_path, data_dir):
    path = store_path(data_dir)
    put(path, VALID)
    put(path + ".lock", b"")  # straight to the locked pass, which holds the gpu dir open
    gpu = os.path.dirname(path)
    outside = tmp_path / "outside"
    outside.mkdir()

    def swap_then_quarantine(store):
        os.rename(gpu, gpu + ".moved")
        os.symlink(str(outside), gpu)
        return quarantine(store)

    update_store(path, swap_then_quarantine)
    assert os.listdir(str(outside)) == []  # no lock, tmp or store written through the new symlink
    assert load_store(os.path.join(gpu + ".moved", "vf-health.json")).quarantined() == [VF, "0000:82:00.5"]


def test_missing_store_dirs_get_hypemans_modes_whatever_the_umask(tmp_path):
    path = os.path.join(str(tmp_path), "a", "b", "data", "gpu", "vf-health.json")
    old_umask = os.umask(0)
    try:
        update_store(path, quarantine)
    finally:
        os.umask(old_umask)
    for directory in ("a", "a/b", "a/b/data", "a/b/data/gpu"):
        assert stat.S_IMODE(os.stat(os.path.join(str(tmp_path), directory)).st_mode) == 0o755, directory
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(path + ".lock").st_mode) == 0o600
