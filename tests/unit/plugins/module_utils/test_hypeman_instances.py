# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_hypeman: instance metadata and liveness as hypeman decides it; _api: the API client."""

from __future__ import annotations

import functools
import json
import os
import re

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _api, _hypeman
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.hostile import property_settings
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub, closed_port_url


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path)
    tree.add_card("L40S", "0000:82:00.0", numvfs=8)
    return tree


def _by_id(instances):
    return dict((inst["id"], inst) for inst in instances)


def _write_meta(tree, instance_id, text):
    path = os.path.join(tree.data_dir, "guests", instance_id, "metadata.json")
    if not os.path.isdir(os.path.dirname(path)):
        os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write(text)
    return path


# -- layout and metadata ------------------------------------------------------------------


def test_layout_helpers():
    assert _hypeman.instance_log_dir("/var/lib/hypeman", "abc") == "/var/lib/hypeman/guests/abc/logs"
    assert _hypeman.instance_dir("/d", "abc") == "/d/guests/abc"


def test_both_builds(tree):
    vfs = tree.cards["0000:82:00.0"].vfs
    tree.add_instance("claim", vf=vfs[0], profile="NVIDIA L40S-2Q", claimed_at="2026-08-31T12:00:00.5Z")
    tree.add_instance("assign", vf=vfs[1], profile="NVIDIA L40S-2Q", build="assigned",
                      claimed_at="2026-08-31T14:00:00.123456700+02:00", retained_for_cleanup=True)
    tree.add_instance("plain", liveness="stopped")
    instances, unreadable = _hypeman.list_instances(tree.data_dir)
    assert unreadable == []
    got = _by_id(instances)
    claim, assign, plain = got["claim"], got["assign"], got["plain"]
    assert claim["claim_field"] == "GPUClaimedAt" and claim["assigned_at"] == "2026-08-31T12:00:00.5Z"
    assert claim["vf_address"] == vfs[0] and claim["framework"] == "vendor-vfio"
    assert claim["device_path"] == "/sys/bus/pci/devices/%s" % vfs[0]
    assert claim["retained_for_cleanup"] is False
    # The claim time is rendered in UTC with Go's trimmed nanoseconds, as hypeman writes assigned_at.
    assert assign["claim_field"] == "GPUAssignedAt" and assign["assigned_at"] == "2026-08-31T12:00:00.1234567Z"
    assert assign["retained_for_cleanup"] is True
    assert plain["device_path"] is None and plain["vf_address"] is None and plain["assigned_at"] is None
    assert plain["claim_field"] == "GPUClaimedAt"  # the key is written even when null
    assert "live" not in claim  # no proc_root, no liveness
    assert claim["metadata_path"] == os.path.join(tree.data_dir, "guests", "claim", "metadata.json")
    assert claim["dir"] == os.path.join(tree.data_dir, "guests", "claim")
    assert claim["socket_path"] == os.path.join(tree.data_dir, "guests", "claim", "qemu.sock")


def test_vf_address_is_normalised_and_mdev_paths_are_not_vfs(tree):
    tree.add_instance("upper", liveness="stopped", extra={"GPUDevicePath": "/sys/bus/pci/devices/0000:E3:00.4",
                                                          "GPUFramework": "vendor-vfio"})
    tree.add_instance("mdev", liveness="stopped", extra={
        "GPUDevicePath": "/sys/bus/mdev/devices/6d646576-0000-4000-8000-000000000001",
        "GPUMdevUUID": "6d646576-0000-4000-8000-000000000001", "GPUFramework": "mdev"})
    got = _by_id(_hypeman.list_instances(tree.data_dir)[0])
    assert got["upper"]["vf_address"] == "0000:e3:00.4"
    assert got["mdev"]["vf_address"] is None
    assert got["mdev"]["mdev_uuid"] == "6d646576-0000-4000-8000-000000000001"


@pytest.mark.parametrize("text, device_path", [
    ('{"Id": "x", "GpuDevicePath": "/sys/bus/pci/devices/0000:82:00.4"}', "/sys/bus/pci/devices/0000:82:00.4"),
    ('{"Id": "x", "GPUDevicePath": "/a", "gpudevicepath": "/sys/bus/pci/devices/0000:82:00.5"}',
     "/sys/bus/pci/devices/0000:82:00.5"),
    ('{"Id": "x", "gpudevicepath": "/a", "GPUDevicePath": "/sys/bus/pci/devices/0000:82:00.6"}',
     "/sys/bus/pci/devices/0000:82:00.6"),
    ('{"Id": "x", "GPUDevice\u017fath": "/sys/bus/pci/devices/0000:82:00.4"}', None),  # long s folds to S, not P
])
def test_metadata_keys_match_fields_as_go_does(text, device_path):
    # json.Unmarshal matches keys case-insensitively, the last one winning: a claim written
    # "GpuDevicePath" is a claim to hypeman, and was none to the collection.
    meta = _hypeman.parse_metadata(text)
    assert meta.get("GPUDevicePath") == device_path and meta["Id"] == "x"


@pytest.mark.parametrize("text, error", [
    ("{not json", "unmarshal metadata:"),
    ("[1, 2]", "metadata is not a JSON object"),
    ('{"Id": "x", "HypervisorPID": "41235"}', "HypervisorPID: cannot unmarshal str"),
    ('{"Id": "x", "HypervisorPID": 1.5}', "HypervisorPID: cannot unmarshal float"),
    ('{"Id": "x", "HypervisorStartTime": -1}', "HypervisorStartTime: cannot unmarshal negative"),
    ('{"Id": "x", "GPUDevicePath": 7}', "GPUDevicePath: cannot unmarshal int"),
    ('{"Id": "x", "GPUClaimedAt": "yesterday"}', 'parsing time "yesterday"'),
    ('{"Id": "x", "GPURetainedForCleanup": "yes"}', "GPURetainedForCleanup"),
    ('{"Id": "x", "HypervisorPID": NaN}', "invalid JSON value NaN"),
    ('{"Id": "x", "hypervisorpid": "41235"}', "HypervisorPID: cannot unmarshal str"),
])
def test_metadata_hypeman_cannot_load_is_reported(tree, text, error):
    path = _write_meta(tree, "bad", text)
    instances, unreadable = _hypeman.list_instances(tree.data_dir)
    assert instances == []
    assert len(unreadable) == 1
    assert unreadable[0]["instance_id"] == "bad" and unreadable[0]["path"] == path
    assert error in unreadable[0]["error"]


def test_unreadable_metadata_file(tree):
    tree.add_instance("ok", liveness="stopped")
    os.makedirs(os.path.join(tree.data_dir, "guests", "dir", "metadata.json"))
    instances, unreadable = _hypeman.list_instances(tree.data_dir)
    assert [i["id"] for i in instances] == ["ok"]
    assert unreadable[0]["instance_id"] == "dir" and "read metadata: Is a directory" in unreadable[0]["error"]


def test_non_instances_are_skipped_like_hypeman(tree):
    os.makedirs(os.path.join(tree.data_dir, "guests", "half-created"))  # no metadata.json yet
    with open(os.path.join(tree.data_dir, "guests", "stray-file"), "w") as handle:
        handle.write("{}")
    assert _hypeman.list_instances(tree.data_dir) == ([], [])


def test_symlinked_instance_dirs_are_skipped(tree):
    tree.add_instance("real", liveness="stopped")
    os.symlink(os.path.join(tree.data_dir, "guests", "real"), os.path.join(tree.data_dir, "guests", "alias"))
    instances, unreadable = _hypeman.list_instances(tree.data_dir)
    assert [i["id"] for i in instances] == ["real"] and unreadable == []


def test_missing_and_unreadable_guests_dir(tmp_path):
    assert _hypeman.list_instances(str(tmp_path / "nowhere")) == ([], [])
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "guests").write_text("not a directory")
    with pytest.raises(VgpuError) as err:
        _hypeman.list_instances(str(data_dir))
    assert "read guests directory %s" % (data_dir / "guests") in err.value.msg


# -- liveness (hypeman's resolveLiveHypervisorPID) ----------------------------------------


@pytest.mark.parametrize("liveness, live, reason", [
    ("running", True, "boot id and start time match"),
    ("running-legacy", True, "owns the control socket"),
    ("stopped", False, "has no listener"),
    ("crashed", False, "is gone or a zombie"),
    ("pid-reused", False, "was reused (start time differs)"),
    ("previous-boot", False, "is from a previous boot"),
    ("zombie", False, "is gone or a zombie"),
    ("ambiguous", None, "multiple owning processes found"),
])
def test_liveness(tree, liveness, live, reason):
    tree.add_instance("i", vf="0000:82:00.0@0", profile="NVIDIA L40S-2Q", liveness=liveness)
    inst = _hypeman.list_instances(tree.data_dir, tree.proc_root)[0][0]
    assert inst["live"] is live
    assert reason in inst["live_reason"]
    if live is None:
        assert "hypeman counts it as live" in inst["live_reason"]


def test_process_exists_from_proc(tree):
    checker = _hypeman.LivenessChecker(tree.proc_root)
    os.makedirs(os.path.join(tree.proc_root, "4242"))
    assert checker.process_exists(4242) is True  # a process whose status cannot be read counts as live
    with open(os.path.join(tree.proc_root, "4242", "status"), "w") as handle:
        handle.write("Name:\tqemu\nState:\tS (sleeping)\n")
    assert checker.process_exists(4242) is True
    with open(os.path.join(tree.proc_root, "4242", "status"), "w") as handle:
        handle.write("Name:\tqemu\nState:\tZ (zombie)\n")
    assert checker.process_exists(4242) is False
    assert checker.process_exists(4243) is False  # no /proc entry
    assert checker.process_exists(0) is False and checker.process_exists(None) is False


def test_unreadable_net_unix_is_ambiguous(tree):
    tree.add_instance("i", liveness="stopped")
    tree.break_path(os.path.relpath(os.path.join(tree.proc_root, "net", "unix"), tree.root), "eisdir")
    inst = _hypeman.list_instances(tree.data_dir, tree.proc_root)[0][0]
    assert inst["live"] is None and "open /proc/net/unix" in inst["live_reason"]


def test_unreadable_process_fds_make_socket_ownership_ambiguous(tree):
    tree.add_instance("i", liveness="running-legacy")
    owner = tree.instances["i"]["proc_pid"]
    # The only owner's fd table cannot be read (not "gone"): the scan cannot prove anything.
    tree.break_path(os.path.relpath(os.path.join(tree.proc_root, str(owner), "fd"), tree.root), "garbage")
    meta_path = os.path.join(tree.data_dir, "guests", "i", "metadata.json")
    meta = json.load(open(meta_path))
    meta["HypervisorPID"] = None
    _write_meta(tree, "i", json.dumps(meta))
    inst = _hypeman.list_instances(tree.data_dir, tree.proc_root)[0][0]
    assert inst["live"] is None and "inspect process fds" in inst["live_reason"]


def test_live_pid_without_socket_path_is_ambiguous(tree):
    tree.add_instance("i", liveness="running-legacy", extra={"SocketPath": ""})
    inst = _hypeman.list_instances(tree.data_dir, tree.proc_root)[0][0]
    assert inst["live"] is None and "without a socket path" in inst["live_reason"]


def test_other_boot_id_file_makes_every_recorded_pid_stale(tmp_path):
    tree = HostTree(tmp_path, boot_id="11111111-2222-3333-4444-555555555555")
    tree.add_card("L40S", "0000:82:00.0", numvfs=1)
    tree.add_instance("i", vf="0000:82:00.0@0", profile="NVIDIA L40S-2Q")
    with open(os.path.join(tree.proc_root, "sys", "kernel", "random", "boot_id"), "w") as handle:
        handle.write("99999999-2222-3333-4444-555555555555\n")
    inst = _hypeman.list_instances(tree.data_dir, tree.proc_root)[0][0]
    # Still live: the process owns the control socket (hypeman falls back to socket ownership).
    assert inst["live"] is True and "owns the control socket" in inst["live_reason"]


# -- API client ------------------------------------------------------------------------------


def test_api_get_sends_bearer_token_and_decodes_json():
    with ApiStub({"/resources": (200, {"gpu": {"mode": "vgpu"}})}, token="s3cret") as api:
        answer = _api.api_get(api.url + "/", "/resources", token="s3cret", timeout=5)
    assert answer == {"url": api.url + "/resources", "reachable": True, "status": 200, "error": None,
                      "data": {"gpu": {"mode": "vgpu"}}}
    assert api.requests == [("/resources", "Bearer s3cret")]


def test_api_get_401_names_the_token_without_leaking_it():
    with ApiStub({"/resources": (200, {})}, token="right") as api:
        answer = _api.api_get(api.url, "/resources", token="wrong-token", timeout=5)
    assert answer["reachable"] is True and answer["status"] == 401
    assert "HTTP 401" in answer["error"] and "check api_token" in answer["error"]
    assert "wrong-token" not in json.dumps(answer)


def test_api_get_down_slow_and_not_json():
    down = _api.api_get(closed_port_url(), "/resources", timeout=2)
    assert down["reachable"] is False and "Connection refused" in down["error"]
    with ApiStub({"/resources": (200, {})}, delay=1.0) as api:
        slow = _api.api_get(api.url, "/resources", timeout=0.2)
    assert slow["reachable"] is False and "no answer within 0.2 seconds" in slow["error"]
    with ApiStub({"/resources": (200, "<html>gateway</html>")}) as api:
        html = _api.api_get(api.url, "/resources", timeout=5)
    assert html["reachable"] is True and "response is not JSON" in html["error"] and html["data"] is None


def test_api_instances_shapes():
    assert _api.api_instances([{"id": "a"}]) == [{"id": "a"}]
    assert _api.api_instances({"instances": [{"id": "a"}]}) == [{"id": "a"}]
    assert _api.api_instances({"gpu": None}) is None


@pytest.mark.parametrize("inst, expected", [
    ({"vf_address": "0000:82:00.4", "mdev_uuid": None, "device_path": "/sys/bus/pci/devices/0000:82:00.4"},
     "0000:82:00.4"),
    ({"vf_address": None, "mdev_uuid": "u-1", "device_path": "/sys/bus/mdev/devices/u-1"}, "0000:82:00.5"),
    # GPUMdevUUID empty: the UUID is the basename of GPUDevicePath (the copies used to disagree here).
    ({"vf_address": None, "mdev_uuid": None, "device_path": "/sys/bus/mdev/devices/u-1/"}, "0000:82:00.5"),
    # GPUMdevUUID names no mdev on the host: GPUDevicePath still may.
    ({"vf_address": None, "mdev_uuid": "gone", "device_path": "/sys/bus/mdev/devices/u-1"}, "0000:82:00.5"),
    ({"vf_address": None, "mdev_uuid": "gone", "device_path": None}, None),
    ({"vf_address": None, "mdev_uuid": None, "device_path": None}, None),
])
def test_instance_vf_is_one_rule_for_pci_and_mdev_claims(inst, expected):
    assert _hypeman.instance_vf(inst, {"u-1": "0000:82:00.5"}.get) == expected


# --- device path -> VF: the one rule for instance metadata and hypeman's log lines -------------


def _mdev_tree(tmp_path, uuid="9a8b7c6d-0000-4000-8000-000000000001", vf="0000:82:00.4"):
    devices = tmp_path / "sys" / "bus" / "mdev" / "devices"
    devices.mkdir(parents=True)
    os.symlink("../../../devices/pci0000:80/0000:80:01.0/%s/%s" % (vf, uuid), str(devices / uuid))
    return str(tmp_path / "sys"), uuid


def test_device_path_vf_pci_and_mdev(tmp_path):
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _sysfs

    sysfs_root, uuid = _mdev_tree(tmp_path)
    of_mdev = functools.partial(_sysfs.mdev_vf, sysfs_root)
    assert _hypeman.device_path_vf("/sys/bus/pci/devices/0000:82:00.5", of_mdev) == "0000:82:00.5"
    assert _hypeman.device_path_vf("/sys/bus/pci/devices/82:00.5/", of_mdev) == "0000:82:00.5"
    assert _hypeman.device_path_vf("/sys/bus/mdev/devices/" + uuid, of_mdev) == "0000:82:00.4"
    assert _hypeman.device_path_vf("/sys/bus/mdev/devices/unknown-uuid", of_mdev) is None
    assert _hypeman.device_path_vf(None, of_mdev) is None
    # instance_vf: the mdev UUID first, then the same device path rule.
    inst = {"vf_address": None, "mdev_uuid": None, "device_path": "/sys/bus/mdev/devices/" + uuid}
    assert _hypeman.instance_vf(inst, of_mdev) == "0000:82:00.4"


@given(device_path=st.one_of(st.none(), st.text(max_size=80),
                             st.builds(lambda s: "/sys/bus/mdev/devices/" + s, st.text(max_size=40))))
@property_settings(80)
def test_device_path_vf_never_raises(tmp_path_factory, device_path):
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _sysfs

    sysfs_root, _uuid = _mdev_tree(tmp_path_factory.mktemp("mdev"))
    vf = _hypeman.device_path_vf(device_path, functools.partial(_sysfs.mdev_vf, sysfs_root))
    assert vf is None or re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", vf)
