# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vf_health and vf_health_info against hostile store, temporary, lock, state and ledger paths:
every call fails closed with an error naming the path (or, for a read-only call, reports the
store unusable), never blocks, and changes nothing anywhere."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _store
from ansible_collections.hypeman.vgpu.plugins.modules import vf_health_info
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.test_vf_health import ASSIGNED, Host
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector

VALID = b'{"version":1,"records":[{"vf_address":"0000:82:00.4","quarantined_at":"2026-08-22T00:00:00Z"}]}'


def make_socket(path):
    directory, name = os.path.split(path)
    cwd = os.getcwd()
    os.chdir(directory)  # AF_UNIX paths are limited to 108 bytes; bind a relative name
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(name)
    finally:
        os.chdir(cwd)
    return sock


def plant(host, kind, outside):
    """Make the named path hostile; returns the path the error must name."""
    store, gpu = host.path, os.path.dirname(host.path)
    os.makedirs(gpu, exist_ok=True)
    if kind.startswith("store-"):
        what = kind[len("store-"):]
        if what == "fifo":
            os.mkfifo(store)
        elif what == "socket":
            host.socket = make_socket(store)
        elif what == "device":
            try:
                os.mknod(store, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
            except OSError as err:
                pytest.skip("cannot create a device node here: %s" % err)
        elif what == "directory":
            os.mkdir(store)
        elif what == "symlink-to-device":
            os.symlink("/dev/zero", store)
        elif what == "dangling-symlink":
            os.symlink(os.path.join(outside, "nowhere.json"), store)
        elif what == "symlink-to-valid-store":
            with open(os.path.join(outside, "valid.json"), "wb") as handle:
                handle.write(VALID)
            os.symlink(os.path.join(outside, "valid.json"), store)
        elif what == "too-large":
            with open(store, "wb") as handle:
                handle.write(VALID + b" " * 4096)
        return store
    if kind == "gpu-dir-symlink":
        os.rmdir(gpu)
        with open(os.path.join(outside, "vf-health.json"), "wb") as handle:
            handle.write(VALID)
        os.symlink(outside, gpu)
        return gpu
    with open(store, "wb") as handle:
        handle.write(VALID)
    if kind == "tmp-fifo":
        os.mkfifo(store + ".tmp")
        return store + ".tmp"
    if kind == "tmp-symlink":
        os.symlink(os.path.join(outside, "victim"), store + ".tmp")
        return store + ".tmp"
    if kind == "lock-symlink":
        os.symlink(os.path.join(outside, "lock"), store + ".lock")
        return store + ".lock"
    if kind == "lock-fifo":
        os.mkfifo(store + ".lock")
        return store + ".lock"
    state_dir = host.tree.state_dir
    if kind == "state-dir-symlink":
        os.makedirs(os.path.dirname(state_dir), exist_ok=True)
        os.symlink(outside, state_dir)
        return state_dir
    os.makedirs(state_dir, exist_ok=True)
    ledger = os.path.join(state_dir, "ledger.jsonl")
    if kind == "ledger-fifo":
        os.mkfifo(ledger)
    elif kind == "ledger-symlink":
        os.symlink("/dev/zero", ledger)
    return ledger


STORE_KINDS = ["store-fifo", "store-socket", "store-device", "store-directory", "store-symlink-to-device",
               "store-dangling-symlink", "store-symlink-to-valid-store", "store-too-large", "gpu-dir-symlink"]
OTHER_KINDS = ["tmp-fifo", "tmp-symlink", "lock-symlink", "lock-fifo", "state-dir-symlink", "ledger-fifo",
               "ledger-symlink"]

CALLS = [
    dict(state="failed", instance_id="i", assigned_at=ASSIGNED),
    dict(state="succeeded", instance_id="i", assigned_at=ASSIGNED),
    dict(state="quarantined", reason="drain"),
    dict(state="absent"),
    dict(state="absent", owned_only=False),
]


def outside_digest(outside):
    found = {}
    for name in sorted(os.listdir(outside)):
        full = os.path.join(outside, name)
        found[name] = os.path.islink(full) or (open(full, "rb").read() if os.path.isfile(full) else "other")
    return found


@pytest.mark.parametrize("kind", STORE_KINDS + OTHER_KINDS)
def test_hostile_path_fails_closed_everywhere(tmp_path, capsys, monkeypatch, kind):
    host = Host(tmp_path / "host")
    outside = str(tmp_path / "outside")
    os.mkdir(outside)
    if kind == "store-too-large":
        monkeypatch.setattr(_store, "STORE_READ_LIMIT", 1024)
    named = plant(host, kind, outside)
    before, before_outside = host.snapshot(), outside_digest(outside)
    vf = host.vfs[0]
    with hang_detector(20):
        for call in CALLS + [dict(state="repaired")]:
            for check_mode in (True, False):
                args = dict(call)
                if call["state"] != "repaired":
                    args["vf_addresses"] = [vf]
                result = host.run(capsys, check_mode=check_mode, **args)
                assert result.get("failed"), (kind, args, check_mode, result)
                assert named in result["msg"], (kind, args, result["msg"])
                assert "Traceback" not in result["msg"] and not result.get("changed")
                assert host.snapshot() == before and outside_digest(outside) == before_outside
        params = {"data_dir": host.tree.data_dir, "state_dir": host.tree.state_dir,
                  "config_path": host.tree.config_path}
        info = run_module(vf_health_info.main, params, capsys)
    if kind in STORE_KINDS:
        assert info["valid"] is False and named in info["error"], info
        assert info["records"] == [] and info["recoverable"] == []
    elif kind.startswith(("state-dir", "ledger")):
        assert info["failed"] and named in info["msg"]
    else:
        assert info["valid"] is True and info["quarantined"] == [vf]
    assert host.snapshot() == before and outside_digest(outside) == before_outside


@pytest.mark.parametrize("kind, words", [
    ("store-fifo", "is a FIFO, not a regular file"),
    ("store-socket", "is a socket, not a regular file"),
    ("store-directory", "read VF health state: read %(path)s: is a directory"),
    ("store-symlink-to-device", 'is a symlink to "/dev/zero"'),
    ("store-dangling-symlink", "that points nowhere"),
    ("store-too-large", "is larger than 1024 bytes"),
    ("gpu-dir-symlink", "the store's directory %(gpu)s is a symlink"),
])
def test_hostile_store_is_named_with_what_it_is(tmp_path, capsys, monkeypatch, kind, words):
    host = Host(tmp_path / "host")
    outside = str(tmp_path / "outside")
    os.mkdir(outside)
    monkeypatch.setattr(_store, "STORE_READ_LIMIT", 1024)
    plant(host, kind, outside)
    store = _store.load_store(host.path)
    assert (store.valid, store.format, store.records) == (False, "invalid", {})
    assert words % {"path": host.path, "gpu": os.path.dirname(host.path)} in store.error
    assert store.path_error is not None


def test_dangling_symlink_is_not_a_missing_store(tmp_path, capsys):
    host = Host(tmp_path / "host")
    os.makedirs(os.path.dirname(host.path))
    os.symlink(str(tmp_path / "nowhere.json"), host.path)
    store = _store.load_store(host.path)
    assert (store.exists, store.valid, store.is_symlink) == (True, False, True)
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert result["failed"] and "points nowhere" in result["msg"]
    assert not (tmp_path / "nowhere.json").exists()
