# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hostile host files, one class at a time: every reader answers at once, with the path, never hangs.

A FIFO no writer ever opens would block an ``open()`` forever, so each FIFO
case is itself a hang detector. The fuzz test (``test_fuzz_hostile.py``)
explores the same classes at random; these are the fixed regressions.
"""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import (
    _api, _audit, _busy, _hypeman, _placement, _prerequisites, _proc, _store, _sysfs)
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import is_within
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.hostile import replace_with
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub

CARD = "0000:82:00.0"


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path / "host")
    card = tree.add_card("L40S", CARD, numvfs=4)
    tree.add_instance("vm", vf=card.vfs[0], profile="NVIDIA L40S-2Q")
    tree.write_config(threshold=3)
    tree.write_store([])
    return tree


def _view(tree):
    return _placement.host_view(tree.sysfs_root, tree.proc_root, tree.dev_root, tree.data_dir, tree.store_path,
                                tree.config_path)[0]


# -- _fileio ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path, root, inside", [
    ("/a/b", "/a", True), ("/a", "/a", True), ("/a/../b", "/a", False), ("/ab", "/a", False),
    ("/a/b/", "/a/", True), ("/", "/", True), ("/x", "/", True),
])
def test_is_within_compares_normalised_paths(path, root, inside):
    assert is_within(path, root) is inside


# -- hypeman config --------------------------------------------------------------------------


@pytest.mark.parametrize("how, content, words", [
    ("fifo", b"", "is a FIFO, not a regular file"),
    ("dir", b"", "Is a directory"),
    ("symlink", "/dev/zero", "is a character device, not a regular file"),
    ("file", b"gpu:\n  vf_quarantine_threshold: 3\n" + b"#" * (_hypeman.CONFIG_LIMIT + 1), "is larger than 1048576"),
])
def test_an_unreadable_config_fails_closed_naming_it(tree, how, content, words):
    replace_with(tree.config_path, how, content)
    with pytest.raises(VgpuError) as err:
        _hypeman.read_quarantine_threshold(tree.config_path)
    assert err.value.msg.startswith("cannot read hypeman config %s: " % tree.config_path) and words in err.value.msg


def test_a_config_that_is_not_utf8_fails_naming_the_byte(tree):
    replace_with(tree.config_path, "file", b"gpu:\n  vf_quarantine_threshold: 3 \xff\n")
    with pytest.raises(VgpuError) as err:
        _hypeman.read_quarantine_threshold(tree.config_path)
    assert err.value.msg == ("hypeman config %s is not UTF-8 text (byte 0xff at offset 34); expected hypeman's YAML "
                             "config, which hypeman cannot parse either" % tree.config_path)


def test_a_symlinked_config_is_followed(tree, tmp_path):
    real = tmp_path / "elsewhere.yaml"
    real.write_text("gpu:\n  vf_quarantine_threshold: 5\n")
    replace_with(tree.config_path, "symlink", str(real))
    assert _hypeman.read_quarantine_threshold(tree.config_path) == (5, tree.config_path)


def test_a_huge_threshold_value_is_quoted_short(tree):
    replace_with(tree.config_path, "file", b"gpu:\n  vf_quarantine_threshold: " + b"9x" * 5000 + b"\n")
    with pytest.raises(VgpuError) as err:
        _hypeman.read_quarantine_threshold(tree.config_path)
    assert "is '9x9x9x9x9x9x9x9x9x9x9x9x9x9x9x9x9x9x9x9x...'; expected a whole number >= 1" in err.value.msg


# -- instance metadata -----------------------------------------------------------------------


def _meta_path(tree, instance_id="vm"):
    return os.path.join(tree.data_dir, "guests", instance_id, "metadata.json")


def _listed(tree):
    instances, unreadable = _hypeman.list_instances(tree.data_dir)
    return [i["id"] for i in instances], dict((u["instance_id"], u["error"]) for u in unreadable)


@pytest.mark.parametrize("how, content, words", [
    ("fifo", b"", "read metadata: is a FIFO, not a regular file"),
    ("symlink", "/dev/zero", "read metadata: is a symlink to /dev/zero, outside "),
    ("file", b"[" * 100000 + b"]" * 100000, "unmarshal metadata: JSON nested too deeply"),
    ("file", b"[1, 2]", "unmarshal metadata: metadata is not a JSON object"),
    ("file", b'{"GPUDevicePath": 7}', "unmarshal metadata: GPUDevicePath: cannot unmarshal int into a string"),
    ("file", b'{"HypervisorPID": %d}' % (1 << 63), "HypervisorPID: number 9223372036854775808 overflows int64"),
    ("file", b'{"HypervisorStartTime": %d}' % (1 << 64), "overflows uint64"),
    ("file", b'{"HypervisorPID": 1%s}' % (b"0" * 5000), "unmarshal metadata: "),
    ("file", b'{"Id": "vm", "Name": "' + b"x" * _hypeman.METADATA_LIMIT + b'"}', "is larger than 1048576 bytes"),
    ("file", b"\xff\xfe{", "unmarshal metadata: "),
])
def test_hostile_metadata_is_unreadable_not_a_crash(tree, how, content, words):
    replace_with(_meta_path(tree), how, content)
    listed, unreadable = _listed(tree)
    assert listed == [] and words in unreadable["vm"], unreadable


def test_non_utf8_strings_in_metadata_are_replaced_like_go(tree):
    meta = json.loads(open(_meta_path(tree)).read())
    data = json.dumps(meta).encode().replace(b'"Name": "vm"', b'"Name": "v\xffm"')
    replace_with(_meta_path(tree), "file", data)
    instances, unreadable = _hypeman.list_instances(tree.data_dir)
    assert unreadable == [] and instances[0]["name"] == "v\ufffdm"


def test_a_metadata_symlink_inside_data_dir_is_followed(tree):
    kept = os.path.join(tree.data_dir, "kept-metadata.json")
    os.rename(_meta_path(tree), kept)
    replace_with(_meta_path(tree), "symlink", "../../kept-metadata.json")
    listed, unreadable = _listed(tree)
    assert listed == ["vm"] and unreadable == {}


def test_a_metadata_symlink_out_of_data_dir_is_refused(tree, tmp_path):
    outside = tmp_path / "outside.json"
    os.rename(_meta_path(tree), str(outside))
    replace_with(_meta_path(tree), "symlink", str(outside))
    listed, unreadable = _listed(tree)
    assert listed == [] and unreadable["vm"] == "read metadata: is a symlink to %s, outside %s and %s; refused" % (
        outside, tree.data_dir, os.path.join(tree.data_dir, "guests"))


def test_a_guest_dir_symlink_out_of_data_dir_is_refused_and_fails_placement_closed(tree, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    os.rename(os.path.join(tree.data_dir, "guests", "vm"), str(elsewhere))
    os.symlink(str(elsewhere), os.path.join(tree.data_dir, "guests", "vm"))
    listed, unreadable = _listed(tree)
    assert listed == [] and unreadable["vm"] == "guest directory is a symlink to %s, outside %s; refused" % (
        elsewhere, tree.data_dir)
    view = _view(tree)
    assert view["gpus"][0]["idle"] is False and len(view["unreadable_metadata"]) == 1


def test_a_guests_dir_on_another_disk_is_followed(tree, tmp_path):
    disk = tmp_path / "disk-guests"
    os.rename(os.path.join(tree.data_dir, "guests"), str(disk))
    os.symlink(str(disk), os.path.join(tree.data_dir, "guests"))
    assert _listed(tree) == (["vm"], {})


# -- /proc -----------------------------------------------------------------------------------


def test_proc_names_that_are_not_ascii_pids_are_ignored(tree):
    for name in ("\u00b2", "\u0661\u0662", "9" * 30):  # superscript two, Arabic-Indic digits, absurdly long
        os.makedirs(os.path.join(tree.proc_root, name, "fd"))
        os.symlink(os.path.join(tree.dev_root, "nvidia0"), os.path.join(tree.proc_root, name, "fd", "3"))
    assert _proc.scan_device_holders(tree.proc_root, tree.dev_root, details=False) == [
        {"pid": tree.instances["vm"]["proc_pid"], "paths": sorted(os.path.join(tree.dev_root, n)
                                                                  for n in tree.vf_nodes(tree.instances["vm"]["vf"]))}]
    assert [p["pid"] for p in _proc.find_processes(tree.proc_root, ["qemu-system-x86"])] == [
        tree.instances["vm"]["proc_pid"]]


@pytest.mark.parametrize("minor", ["\u00b2", "9" * 5000, "-1", ""])
def test_a_device_minor_that_is_not_a_number_is_unknown(tree, minor):
    path = os.path.join(tree.proc_root, "driver", "nvidia", "gpus", CARD, "information")
    replace_with(path, "file", ("Device Minor: \t %s\n" % minor).encode())
    assert _busy.nvidia_minor(tree.proc_root, CARD) is None


def test_a_node_name_with_unicode_digits_is_not_a_card_node():
    assert _busy.card_node_kind("nvidia\u00b2", 2) == "shared"


@pytest.mark.parametrize("how, content", [("fifo", b""), ("symlink", "/dev/zero"), ("file", b"1 (x) S " + b"9" * 5000)])
def test_hostile_proc_stat_and_status_leave_liveness_undecided_or_false(tree, how, content):
    pid = tree.instances["vm"]["proc_pid"]
    for name in ("stat", "status"):
        replace_with(os.path.join(tree.proc_root, str(pid), name), how, content)
    instances, _unreadable = _hypeman.list_instances(tree.data_dir, tree.proc_root)
    assert instances[0]["live"] in (True, None)  # the control socket is still owned: never "dead" by mistake


@pytest.mark.parametrize("how", ["fifo", "dir"])
def test_a_hostile_proc_comm_fails_the_process_scan_naming_it(tree, how):
    pid = tree.instances["vm"]["proc_pid"]
    replace_with(os.path.join(tree.proc_root, str(pid), "comm"), how)
    with pytest.raises(VgpuError) as err:
        _proc.find_processes(tree.proc_root, ["hypeman"])
    assert err.value.msg.startswith("cannot read process %s: " % os.path.join(tree.proc_root, str(pid)))


# -- sysfs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how, content, words", [
    ("fifo", b"", "is a FIFO, not a regular file"),
    ("symlink", "/dev/zero", "is a symlink, which is refused here"),
    ("dir", b"", "Is a directory"),
    ("file", b"0" * (_sysfs.ATTRIBUTE_LIMIT + 1), "is larger than 1048576 bytes"),
    ("file", b"\xff\xfe", r'invalid current vGPU type "\xff\xfe"'),  # Go's %q of bytes that are not UTF-8
])
def test_a_hostile_current_type_makes_the_vf_unreadable(tree, how, content, words):
    vf = tree.cards[CARD].vfs[1]
    replace_with(tree.pci_path(vf, "nvidia", "current_vgpu_type"), how, content)
    discovery = _sysfs.discover(tree.sysfs_root)
    assert [e["address"] for e in discovery.unreadable] == [vf] and words in discovery.unreadable[0]["error"]
    assert vf not in discovery.vf_map()


def test_a_huge_bad_attribute_is_quoted_short(tree):
    vf = tree.cards[CARD].vfs[1]
    replace_with(tree.pci_path(vf, "nvidia", "current_vgpu_type"), "file", b"x" * 100000)
    error = _sysfs.discover(tree.sysfs_root).unreadable[0]["error"]
    assert error.endswith('invalid current vGPU type "%s..."' % ("x" * 200))


def test_a_device_link_out_of_sysfs_root_is_refused(tree, tmp_path):
    vf = tree.cards[CARD].vfs[2]
    link = tree.pci_path(vf)
    copy = tmp_path / "evil-device"
    os.rename(os.path.realpath(link), str(copy))
    replace_with(link, "symlink", str(copy))
    discovery = _sysfs.discover(tree.sysfs_root)
    assert discovery.unreadable[0]["error"] == "VF %s: %s is a symlink to %s, outside %s; refused" % (
        vf, link, copy, tree.sysfs_root)
    view = _view(tree)
    assert vf not in [v["address"] for v in view["vfs"] if v["allocatable"]]
    assert view["gpus"][0]["unreadable_vfs"] == [vf]


def test_a_card_link_out_of_sysfs_root_is_an_error(tree, tmp_path):
    link = tree.pci_path(CARD)
    copy = tmp_path / "evil-card"
    os.rename(os.path.realpath(link), str(copy))
    replace_with(link, "symlink", str(copy))
    info = _sysfs.read_parent(tree.sysfs_root, CARD)
    assert info["errors"] == ["%s is a symlink to %s, outside %s; refused" % (link, copy, tree.sysfs_root)]
    assert info["virtfns"] == [] and info["sriov_totalvfs"] is None


# -- store and placement -----------------------------------------------------------------------


@pytest.mark.parametrize("how, content", [("fifo", b""), ("symlink", "/dev/zero"), ("dir", b""),
                                          ("file", b"[" * 100000)])
def test_a_hostile_store_disables_placement(tree, how, content):
    replace_with(tree.store_path, how, content)
    store = _store.load_store(tree.store_path)
    assert store.valid is False
    view = _view(tree)
    assert view["placement_disabled_reason"].startswith("VF health state unavailable: ")
    assert view["slots"]["allocatable"] == 0 and not any(v["allocatable"] for v in view["vfs"])


def test_hostile_metadata_keeps_placement_from_choosing(tree):
    replace_with(_meta_path(tree), "fifo")
    view = _placement.host_view(tree.sysfs_root, tree.proc_root, tree.dev_root, tree.data_dir, tree.store_path,
                                tree.config_path, profile="NVIDIA L40S-2Q")[0]
    assert view["candidates"]["gpu"] is None and "is a FIFO" in view["candidates"]["reason"]
    assert all(not gpu["idle"] for gpu in view["gpus"])


# -- audit -----------------------------------------------------------------------------------


def test_audit_prerequisites_survive_hostile_proc_and_sysfs(tree):
    replace_with(os.path.join(tree.proc_root, "cmdline"), "fifo")
    groups = os.path.join(tree.sysfs_root, "kernel", "iommu_groups")
    os.rename(groups, groups + ".moved")
    replace_with(groups, "fifo")
    checks = dict((c["name"], c) for c in _prerequisites.prerequisites(
        tree.sysfs_root, tree.proc_root, "/nonexistent", _audit.DEFAULT_DCGM_UNITS, _audit.DEFAULT_UNIT_DIRS))
    assert checks["iommu"]["status"] == "fail"
    assert checks["iommu"]["detail"] == "cannot read %s: is a FIFO, not a regular file" % os.path.join(
        tree.proc_root, "cmdline")


# -- hypeman's API -----------------------------------------------------------------------------


class RawServer(object):
    """A TCP server on 127.0.0.1 that answers each connection with ``answer(connection)``."""

    def __init__(self, answer):
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _addr = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                conn.recv(65536)
                self.answer(conn, self.stop)
            except OSError:
                pass
            finally:
                conn.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


HEADERS = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n"


def _drip(conn, stop):
    """Headers, then one byte of an endless JSON array every 50 ms: each read is on time, the answer never ends."""
    conn.sendall(HEADERS + b"[")
    while not stop.wait(0.05):
        conn.sendall(b"0,")


def _endless(conn, stop):
    conn.sendall(HEADERS + b"[")
    chunk = b"0," * 32768
    while not stop.is_set():
        conn.sendall(chunk)


def _slow_headers(conn, stop):
    for byte in HEADERS:
        if stop.wait(0.05):
            return
        conn.sendall(bytes([byte]))


@pytest.mark.parametrize("answer, words", [
    (_drip, "no answer within 0.5 seconds"),
    (_slow_headers, "no answer within 0.5 seconds"),
])
def test_an_answer_that_never_completes_is_cut_off_at_the_timeout(answer, words):
    with RawServer(answer) as server:
        result = _api.api_get(server.url, "/resources", timeout=0.5)
    assert result["error"] == "GET %s/resources: %s" % (server.url, words) and result["data"] is None


def test_an_endless_answer_is_refused_at_the_size_cap(monkeypatch):
    monkeypatch.setattr(_api, "RESPONSE_LIMIT", 200000)
    with RawServer(_endless) as server:
        result = _api.api_get(server.url, "/resources", timeout=30)
    assert result["error"] == ("GET %s/resources: the answer is larger than 200000 bytes; expected hypeman's JSON"
                               % server.url)


@pytest.mark.parametrize("body, words", [
    ("[" * 100000 + "]" * 100000, "response is JSON nested too deeply to decode"),
    ("[" * 40 + "]" * 40, "response is JSON nested deeper than 32 levels"),
    ('{"gpu": 1, "x": "\\udc80"', "response is not JSON"),
])
def test_answers_too_deep_or_broken_are_errors(body, words):
    with ApiStub({"/resources": (200, body)}) as api:
        result = _api.api_get(api.url, "/resources", timeout=10)
    assert words in result["error"] and result["data"] is None


@pytest.mark.parametrize("gpu", [
    {"mode": "vgpu", "profiles": 5}, {"mode": "vgpu", "profiles": "abc"}, {"mode": "vgpu", "profiles": {"a": 1}},
    {"mode": "vgpu", "profiles": [{"name": ["x"]}, {"name": {"y": 1}}, 7, None]}, {"mode": [1], "total_slots": {}},
    [], "vgpu", 3,
])
def test_resources_of_unexpected_types_are_mismatches(tree, gpu):
    view = _view(tree)
    with ApiStub({"/resources": (200, {"gpu": gpu})}) as api:
        section = _api.resources_check(view, api.url, timeout=10)
    assert section["error"] is None and section["mismatches"]
    json.dumps(section)


@pytest.mark.parametrize("answer", [[], 5, "x", None, {"gpu": []}])
def test_a_resources_answer_that_is_no_object_is_an_error_or_missing(tree, answer):
    with ApiStub({"/resources": (200, answer)}) as api:
        section = _api.resources_check(_view(tree), api.url, timeout=10)
    assert section["error"] or section["mismatches"] or section["missing_fields"]
