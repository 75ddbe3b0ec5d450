# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sentinel scan against hostile host files, one class at a time.

Cursors (files under state_dir) and guest logs may be FIFOs, sockets,
devices, directories, symlinks, garbage, non-UTF-8, deeply nested JSON,
huge or endless. Each gives a clean per-instance result (skip with a reason,
cursor rebuilt with a warning) or a clean module failure (VgpuError): never a
traceback, never a hang, never unbounded memory. A SIGALRM guards every test
against a hang (the assertion is "it returned", never how fast).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sentinel
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.sentinel_host import (
    CLAIMED_NS, SEC, MiniHost, ts, verdicts)
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector

HANG_SECONDS = 60


@pytest.fixture(autouse=True)
def hang_guard():
    with hang_detector(HANG_SECONDS, "the scan"):
        yield


@pytest.fixture
def host(tmp_path):
    return MiniHost(tmp_path)


@pytest.fixture
def failed(host):
    """inst-a with a failed report, scanned once (so it has a cursor)."""
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.noise(5) + guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    assert verdicts(host.scan()) == {"inst-a": ("failed", ts(27))}
    return app


def _bind_socket(path):
    # AF_UNIX paths are short (108 bytes): bind in a short directory, then move it in place.
    short = tempfile.mkdtemp(prefix="sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(short, "s"))
    os.rename(os.path.join(short, "s"), path)
    os.rmdir(short)
    return sock


def _make(path, kind):
    """Replace ``path`` with a hostile file of ``kind``; returns what must be kept open."""
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        return _bind_socket(path)
    elif kind == "chardev":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: endless
        except PermissionError:
            pytest.skip("creating a device node needs CAP_MKNOD")
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "dangling":
        os.symlink("/nonexistent/target", path)
    else:
        raise ValueError(kind)
    return None


def _assert_cursor_rebuilt(host, report):
    assert verdicts(report) == {"inst-a": ("failed", ts(27))}
    assert any("rebuilding it from scratch" in w for w in report.warnings), report.warnings
    path = host.cursor_path("inst-a")
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    with open(path, "rb") as handle:
        assert _sentinel.valid_state(json.load(handle), "inst-a")
    again = host.scan()
    assert again.warnings == [] and [s["bytes_read"] for s in again.scanned] == [0]


# --- cursor files -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "socket", "chardev", "dangling"])
def test_cursor_of_another_kind_is_replaced_with_a_warning(host, failed, kind):
    keep = _make(host.cursor_path("inst-a"), kind)
    try:
        _assert_cursor_rebuilt(host, host.scan())
    finally:
        if keep is not None:
            keep.close()


def test_cursor_symlinked_elsewhere_is_refused_and_its_target_untouched(host, failed, tmp_path):
    target = tmp_path / "elsewhere.json"
    with open(host.cursor_path("inst-a"), "rb") as handle:
        target.write_bytes(handle.read())  # even a valid cursor: the link is refused
    before = target.read_bytes()
    os.unlink(host.cursor_path("inst-a"))
    os.symlink(str(target), host.cursor_path("inst-a"))
    report = host.scan()
    assert any("symlink" in w for w in report.warnings)
    _assert_cursor_rebuilt(host, report)
    assert target.read_bytes() == before


def test_cursor_that_is_a_directory_skips_the_instance(host, failed):
    os.unlink(host.cursor_path("inst-a"))
    os.mkdir(host.cursor_path("inst-a"))
    host.instance("inst-b", vf_index=1)
    report = host.scan()
    assert report.skipped == [{"instance_id": "inst-a", "reason": "sentinel cursor %s is a directory, not a "
                               "file; remove it" % host.cursor_path("inst-a")}]
    assert [s["instance_id"] for s in report.scanned] == ["inst-b"]
    os.rmdir(host.cursor_path("inst-a"))
    assert verdicts(host.scan()) == {"inst-a": ("failed", ts(27))}


@pytest.mark.parametrize("content", [
    pytest.param(b"\x00\xff\xfe garbage \x01", id="garbage"),
    pytest.param(b"\xff\xfe{\"version\": 1}", id="non-utf8"),
    pytest.param(b"[" * 200000 + b"]" * 200000, id="deep-array"),
    pytest.param(b'{"a":' * 100000 + b"1" + b"}" * 100000, id="deep-object"),
    pytest.param(b'{"version": NaN}', id="nan"),
    pytest.param(b'{"version": 1, "instance_id": "inst-a", "assignment": {"vf_address": "\\ud800", '
                 b'"assigned_at": "x"}, "log": null, "archives": {}}', id="lone-surrogate"),
    pytest.param(b"", id="empty"),
])
def test_cursor_with_hostile_content_is_rebuilt(host, failed, content):
    with open(host.cursor_path("inst-a"), "wb") as handle:
        handle.write(content)
    _assert_cursor_rebuilt(host, host.scan())


def test_huge_cursor_is_refused_unread(host, failed):
    with open(host.cursor_path("inst-a"), "wb") as handle:
        handle.truncate(_sentinel.CURSOR_LIMIT + 1)  # sparse: costs no disk
    report = host.scan()
    assert any("larger than %d bytes" % _sentinel.CURSOR_LIMIT in w for w in report.warnings)
    _assert_cursor_rebuilt(host, report)


def _valid_cursor(host):
    with open(host.cursor_path("inst-a")) as handle:
        return json.load(handle)


@pytest.mark.parametrize("path, value", [
    (("log", "offset"), "12"), (("log", "offset"), -1), (("log", "offset"), 1.5), (("log", "offset"), True),
    (("log", "ident"), [1, 2, 3]), (("log", "partial"), "not base64!"), (("log", "partial"), 12),
    (("log", "partial"), "Cgo="),  # a newline: never a line in progress
    (("log", "overlong"), "false"), (("log",), []), (("rotated",), {"a": 1}), (("verdict",), "failed"),
    (("verdict", "recorded"), "yes"), (("verdict", "nvrm"), 1), (("archives",), []),
    (("archives", "app.log.1"), {}), (("assignment",), None), (("assignment", "vf_address"), 4),
    (("version",), "1"), (("instance_id",), None),
])
def test_cursor_with_wrong_json_types_is_rebuilt(host, failed, path, value):
    state = _valid_cursor(host)
    if state.get("verdict") is None:
        state["verdict"] = {}
    node = state
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with open(host.cursor_path("inst-a"), "w") as handle:
        json.dump(state, handle)
    _assert_cursor_rebuilt(host, host.scan())


def test_cursor_files_and_directory_have_fixed_modes_whatever_the_umask(host):
    host.instance("inst-a")
    old = os.umask(0o777)  # would leave every file unreadable to its owner
    try:
        host.scan()
    finally:
        os.umask(old)
    directory = os.path.join(host.state_dir, "sentinel")
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(host.cursor_path("inst-a")).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.join(directory, ".lock")).st_mode) == 0o600


def test_symlinked_cursor_directory_is_a_clean_failure(host, tmp_path):
    host.instance("inst-a")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.makedirs(host.state_dir)
    os.symlink(str(elsewhere), os.path.join(host.state_dir, "sentinel"))
    for check_mode in (False, True):
        with pytest.raises(VgpuError) as caught:
            host.scan(check_mode=check_mode)
        assert "refused sentinel state directory" in str(caught.value) and "symlink" in str(caught.value)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling"])
def test_hostile_lock_file_is_a_clean_failure(host, kind):
    host.instance("inst-a")
    os.makedirs(os.path.join(host.state_dir, "sentinel"))
    _make(os.path.join(host.state_dir, "sentinel", ".lock"), kind)
    with pytest.raises(VgpuError) as caught:
        host.scan()
    assert "sentinel state directory" in str(caught.value)


@pytest.mark.parametrize("kind", ["fifo", "directory-empty", "file"])
def test_leftover_temp_files_are_cleaned_on_the_next_run(host, kind):
    host.instance("inst-a")
    host.scan()
    leftover = os.path.join(host.state_dir, "sentinel", ".inst-a.tmp")
    if kind == "fifo":
        os.mkfifo(leftover)
    elif kind == "file":
        with open(leftover, "w") as handle:
            handle.write("{")
    guestlog.append(host.app("inst-a"), guestlog.report("ok", CLAIMED_NS + 30 * SEC))
    if kind == "directory-empty":
        os.mkdir(leftover)
        with pytest.raises(VgpuError):  # never written through: a clean failure naming the cursor
            host.scan()
        os.rmdir(leftover)
    report = host.scan()
    assert verdicts(report) == {"inst-a": ("ok", ts(30))}
    assert not os.path.lexists(leftover)


# --- logs -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind, words", [
    ("fifo", "it is a FIFO, not a regular file"),
    ("socket", "it is a socket, not a regular file"),
    ("chardev", "it is a character device, not a regular file"),
    ("directory", "it is a directory, not a regular file"),
])
@pytest.mark.parametrize("name", ["app.log", "app.log.1", "app.log.prev.1788177000000000000"])
def test_log_of_another_kind_skips_only_that_instance(host, kind, words, name):
    host.instance("bad", vf_index=0)
    good = host.instance("good", vf_index=1)
    guestlog.append(good, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    path = os.path.join(host.logs("bad"), name)
    keep = _make(path, kind)
    try:
        report = host.scan()
    finally:
        if keep is not None:
            keep.close()
    assert report.skipped == [{"instance_id": "bad", "reason": "cannot read %s: %s" % (path, words)}]
    assert verdicts(report) == {"good": ("failed", ts(27))}
    assert not os.path.exists(host.cursor_path("bad"))


@pytest.mark.parametrize("kind, words", [
    ("file", "cannot read {path}: not a directory"),
    ("missing", "{path} does not exist (the instance has not booted yet)"),
])
def test_logs_dir_of_another_kind_skips_only_that_instance(host, kind, words):
    host.instance("bad", vf_index=0)
    logs = host.logs("bad")
    os.unlink(host.app("bad"))
    os.rmdir(logs)
    if kind == "file":
        with open(logs, "w") as handle:
            handle.write("x")
    report = host.scan()
    assert report.skipped == [{"instance_id": "bad", "reason": words.format(path=logs)}]


@pytest.mark.parametrize("name", ["app.log", "app.log.1", "app.log.prev.1788177000000000000"])
def test_a_log_past_the_size_limit_skips_only_that_instance_unread(host, name, monkeypatch):
    # A sparse or runaway log took hours to read (16 TiB sparse: about 9 h).
    monkeypatch.setattr(_sentinel, "LOG_LIMIT", 4096)
    host.instance("big", vf_index=0)
    good = host.instance("good", vf_index=1)
    guestlog.append(good, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    path = os.path.join(host.logs("big"), name)
    with open(path, "ab") as handle:
        handle.truncate(4097)  # sparse, as a hostile file would be
    report = host.scan()
    assert report.skipped == [{"instance_id": "big", "reason": (
        "refused %s: it is 4097 bytes, more than 4096; hypeman rotates app.log at logging.max_size "
        "(default 50MB), so check its log rotation" % path)}]
    assert any("sentinel skipped instance big: refused %s" % path in w for w in report.warnings)
    assert verdicts(report) == {"good": ("failed", ts(27))}
    assert not os.path.exists(host.cursor_path("big"))


def test_endless_log_is_read_only_up_to_its_size_at_open(host):
    # A log that grows while it is read: the scan stops where the file ended when it
    # was opened, and the rest is for the next run.
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.noise(50))
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            guestlog.append(app, b"x" * 65536 + b"\n")

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        report = host.scan()
    finally:
        stop.set()
        thread.join()
    assert report.skipped == []
    assert report.scanned[0]["bytes_read"] <= os.path.getsize(app)


def test_non_utf8_and_crlf_markers_are_matched_without_error(host):
    app = host.instance("inst-a")
    line = guestlog.failed_line(CLAIMED_NS + 27 * SEC, nvrm="NVRM: GPU \xff\xfe RmInitAdapter failed!")
    data = b"\xff\xfe\x00 junk\r\n" + line.encode("latin-1")[:-1] + b"\r\n" + b"\x80\x81\r\r\n"
    guestlog.append(app, data)
    report = host.scan()
    assert report.findings[0]["verdict"] == "failed"
    assert report.findings[0]["nvrm"] == "NVRM: GPU \ufffd\ufffd RmInitAdapter failed!"
    json.dumps(report.findings)  # goes out as module JSON


def test_unattributed_markers_are_capped_with_a_warning(host):
    app = host.instance("inst-a")
    lines = [guestlog.ok_line(CLAIMED_NS - (i + 1) * SEC) for i in range(_sentinel.MAX_UNATTRIBUTED + 50)]
    guestlog.append(app, "".join(lines))
    report = host.scan()
    assert len(report.unattributed) == _sentinel.MAX_UNATTRIBUTED
    assert any("50 more unattributed markers" in w for w in report.warnings)


def test_metadata_swapped_for_a_fifo_during_the_scan_does_not_hang(host, monkeypatch):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    real_current = _sentinel._InstanceScan.current

    def swapping_current(self, same_assignment, sink):
        result = real_current(self, same_assignment, sink)
        os.unlink(host.metadata_path("inst-a"))
        os.mkfifo(host.metadata_path("inst-a"))
        return result

    monkeypatch.setattr(_sentinel._InstanceScan, "current", swapping_current)
    instances_report = host.scan()
    assert instances_report.skipped == [{"instance_id": "inst-a",
                                         "reason": "vGPU assignment changed during the scan; scan again"}]
