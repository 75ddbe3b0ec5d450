# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_audit: one host's audit on simulated trees; read-only; every problem class classified."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import (
    _audit, _gotime, _hypeman, _ledger_write, _prerequisites, _sentinel, _sentinel_write, _store_write)
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub, closed_port_url
from ansible_collections.hypeman.vgpu.tests.unit.hostile import tree_fingerprint

Q_AT = "2026-08-22T00:00:00Z"
MARKER_NS = 1788177630000000000  # after hosttree's default claim time


def failure(instance_id):
    return {"instance_id": instance_id, "assigned_at": "2026-08-20T15:00:00Z", "reported_at": "2026-08-20T15:00:42.5Z"}


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path / "host")
    tree.card_a = tree.add_card("A100", "0000:82:00.0")
    tree.card_b = tree.add_card("A100", "0000:83:00.0")
    tree.write_config(threshold=2)
    tree.add_instance("inst-a", vf=tree.card_a.vfs[0], profile="NVIDIA A100-4C")
    return tree


def paths(tree):
    return _audit.Paths(tree.data_dir, tree.store_path, tree.sysfs_root, tree.proc_root, tree.dev_root,
                        tree.state_dir, tree.config_path)


def audit(tree, **kwargs):
    kwargs.setdefault("hypeman_expected", False)
    result, _warnings = _audit.audit_host(paths(tree), **kwargs)
    return result


def codes(result):
    return sorted(set(issue["code"] for issue in result["issues"]))


def wedge(tree, vf, verdict="failed"):
    tree.add_instance("inst-wedged", vf=vf, profile="NVIDIA A100-4C")
    guestlog.append(os.path.join(tree.data_dir, "guests", "inst-wedged", "logs", "app.log"),
                    guestlog.report(verdict, MARKER_NS))


def test_healthy_host_has_no_issue(tree):
    result = audit(tree)
    assert result["errors"] == []
    assert result["issues"] == []
    assert result["needs_action"] is False
    assert result["store"]["format"] == "missing" and result["store"]["valid"] is True
    assert result["capacity"] == {"total_slots": 32, "allocatable_slots": 31, "quarantined_slots": 0,
                                  "lost_slots": 0, "lost_pct": 0.0}
    assert [g["address"] for g in result["placement"]["gpus"]] == ["0000:82:00.0", "0000:83:00.0"]
    assert result["sentinel"]["findings"] == []
    assert result["hypeman"] == {"running": False, "pids": [], "error": None}


def test_missing_hypeman_is_an_issue_when_expected(tree):
    assert codes(audit(tree, hypeman_expected=True)) == ["hypeman_not_running"]
    tree.add_process(pid=812, comm="hypeman-api", cmdline=["/opt/hypeman/bin/hypeman-api"])
    result = audit(tree, hypeman_expected=True)
    assert result["hypeman"]["running"] is True and result["hypeman"]["pids"] == [812]
    assert codes(result) == []


@pytest.mark.parametrize("store, expected", [
    ({"raw": [{"vf_address": "0000:82:00.5", "wedge_count": 1, "quarantined_at": Q_AT}]}, "legacy"),
    ({"records": [{"vf_address": "0000:82:00.5", "quarantined_at": Q_AT}], "version": 2}, "invalid"),
    ({"raw": "{not json"}, "invalid"),
])
def test_unusable_store_disables_placement(tree, store, expected):
    tree.write_store(**store)
    result = audit(tree)
    assert result["store"]["valid"] is False and result["store"]["format"] == expected
    assert "store_unavailable" in codes(result)
    assert result["issues"][0]["code"] == "store_unavailable" and result["issues"][0]["severity"] == "critical"
    assert result["placement"]["placement_disabled_reason"].startswith("VF health state unavailable: ")
    assert result["capacity"]["lost_slots"] == 32 and result["capacity"]["lost_pct"] == 100.0
    if expected != "invalid" or "records" in store:
        assert result["store"]["recoverable"] == ["0000:82:00.5"]


def test_quarantines_split_by_owner(tree):
    owned_vf, hypeman_vf = tree.card_b.vfs[0], tree.card_b.vfs[1]
    tree.write_store([{"vf_address": owned_vf, "quarantined_at": Q_AT},
                      {"vf_address": hypeman_vf, "quarantined_at": Q_AT, "failures": [failure("x"), failure("y")]}])
    entry = _ledger_write.make_entry("quarantine", owned_vf, _store_time(Q_AT), "drain", user="ops", trigger="manual",
                                     parent_gpu=tree.card_b.address)
    _ledger_write.append_entries(tree.state_dir, [entry])
    result = audit(tree)
    assert result["store"]["quarantined"] == sorted([owned_vf, hypeman_vf])
    assert result["store"]["owned"] == [owned_vf]
    assert result["store"]["by_hypeman"] == [hypeman_vf]
    assert codes(result) == ["card_overflow_only", "quarantined_vfs"]
    assert result["capacity"]["quarantined_slots"] == 2


def _store_time(text):
    return _gotime.parse_rfc3339(text)


def test_thresholds_pending_and_below(tree):
    pending, below = tree.card_b.vfs[4], tree.card_b.vfs[5]
    tree.write_store([{"vf_address": pending, "failures": [failure("a"), failure("b")]},
                      {"vf_address": below, "failures": [failure("c")]}])
    result = audit(tree)
    assert result["store"]["would_quarantine"] == [pending]
    assert result["store"]["below_threshold"] == {below: 1}
    assert result["placement"]["pending_quarantine"] == [pending]
    assert codes(result) == ["below_threshold", "card_overflow_only", "pending_quarantine"]
    # At a threshold of 3 nothing is pending and both are below it.
    result = audit(tree, threshold=3)
    assert result["store"]["would_quarantine"] == []
    assert result["store"]["below_threshold"] == {below: 1, pending: 2}


def test_drained_cards_idle_or_busy(tree):
    tree.write_store([{"vf_address": vf, "quarantined_at": Q_AT} for vf in tree.card_a.vfs + tree.card_b.vfs])
    result = audit(tree)
    issues = dict((i["subject"], i["code"]) for i in result["issues"] if i["subject"])
    assert issues == {tree.card_a.address: "card_draining", tree.card_b.address: "card_ready_for_cycle"}
    assert result["capacity"]["lost_pct"] == 100.0


def test_card_without_vfs(tree):
    # What an interrupted recovery leaves: SR-IOV disabled on card B, no record of it anywhere.
    tree.remove_vfs(tree.card_b.address)
    result = audit(tree)
    assert codes(result) == ["card_without_vfs"]
    issue = result["issues"][0]
    assert issue["severity"] == "warning" and issue["subject"] == tree.card_b.address
    assert issue["message"] == "card 0000:83:00.0 has no VFs (sriov_numvfs 0 of 16): it gives hypeman no slots"
    assert "recover_gpu.yml -e target_gpu=0000:83:00.0" in issue["action"]
    gpus = dict((gpu["address"], gpu) for gpu in result["placement"]["gpus"])
    assert gpus[tree.card_b.address]["vf_total"] == 0 and gpus[tree.card_a.address]["vf_total"] == 16


def test_stale_records(tree):
    tree.write_store([{"vf_address": "0000:99:00.4", "quarantined_at": Q_AT}])
    result = audit(tree)
    assert result["store"]["stale_records"] == ["0000:99:00.4"]
    assert "stale_records" in codes(result)


def test_sentinel_effect_is_predicted_from_the_store(tree):
    vf = tree.card_b.vfs[3]
    tree.write_store([{"vf_address": vf, "failures": [failure("inst-old")]}])
    wedge(tree, vf)
    result = audit(tree)
    (finding,) = result["sentinel"]["findings"]
    assert (finding["instance_id"], finding["vf_address"], finding["verdict"]) == ("inst-wedged", vf, "failed")
    assert finding["effect"] == "quarantined"
    assert result["sentinel"]["unreported"] == [finding]
    assert "sentinel_unreported" in codes(result)
    # Once the store holds the verdict, nothing is unreported.
    _store_write.update_store(tree.store_path, lambda store: _sentinel.record_verdicts(store, [finding], 2))
    result = audit(tree)
    assert result["sentinel"]["findings"][0]["effect"] == "unchanged"
    assert result["sentinel"]["unreported"] == []
    assert "sentinel_unreported" not in codes(result)


def test_sentinel_effect_unknown_on_an_invalid_store(tree):
    tree.write_store(raw="[]")
    wedge(tree, tree.card_b.vfs[2])
    result = audit(tree)
    assert result["sentinel"]["findings"][0]["effect"] is None
    assert result["sentinel"]["unreported"] == []


def test_audit_writes_nothing(tree):
    vf = tree.card_b.vfs[3]
    wedge(tree, vf)
    # Cursors from an earlier recording scan exist; the audit reads them but never moves them.
    instances, unreadable = _hypeman.list_instances(tree.data_dir)
    _sentinel_write.run(instances, unreadable, lambda i: _hypeman.instance_log_dir(tree.data_dir, i), tree.state_dir)
    guestlog.append(os.path.join(tree.data_dir, "guests", "inst-wedged", "logs", "app.log"),
                    guestlog.report("ok", MARKER_NS + 10 ** 9))
    tree.write_store([{"vf_address": vf, "failures": [failure("inst-old")]}])
    before = tree_fingerprint(tree.root)
    first = audit(tree)
    second = audit(tree)
    assert tree_fingerprint(tree.root) == before
    assert first == second
    assert first["sentinel"]["findings"][0]["verdict"] == "ok"


def test_unreadable_parts_are_reported_not_fatal(tree):
    tree.write_config(raw="gpu:\n  vf_quarantine_threshold: zero\n")
    result = audit(tree)
    assert [e["section"] for e in result["errors"]] == ["config", "placement"]
    assert result["placement"] is None and result["capacity"] is None
    assert result["store"]["valid"] is True
    assert codes(result) == ["audit_incomplete"]
    assert result["needs_action"] is True


def test_unreadable_metadata(tree):
    tree.add_instance("inst-broken", vf=tree.card_b.vfs[7], profile="NVIDIA A100-4C", liveness="stopped")
    with open(os.path.join(tree.data_dir, "guests", "inst-broken", "metadata.json"), "w") as handle:
        handle.write("{")
    assert "unreadable_metadata" in codes(audit(tree))


def test_bad_explicit_threshold_is_an_error(tree):
    with pytest.raises(VgpuError, match="threshold is 0"):
        _audit.audit_host(paths(tree), threshold=0)


def test_api_agrees_disagrees_or_is_down(tree):
    tree.write_store([{"vf_address": tree.card_b.vfs[0], "quarantined_at": Q_AT}])
    local = audit(tree)
    gpu = {"mode": "vgpu", "total_slots": 32, "used_slots": 1, "allocatable_slots": 30, "quarantined_slots": 1,
           "profiles": []}
    placement_profiles = _audit._placement.host_view(tree.sysfs_root, tree.proc_root, tree.dev_root, tree.data_dir,
                                                     tree.store_path, tree.config_path)[0]["profiles"]
    gpu["profiles"] = [dict((k, p[k]) for k in ("name", "framebuffer_mb", "available")) for p in placement_profiles]
    assert local["capacity"]["allocatable_slots"] == 30
    with ApiStub({"/resources": (200, {"gpu": gpu})}, token="t") as api:
        result = audit(tree, api={"url": api.url, "token": "t"})
    assert result["api"]["error"] is None and result["api"]["mismatches"] == []
    assert "api_mismatch" not in codes(result)
    stale = dict(gpu, quarantined_slots=0, allocatable_slots=31)
    with ApiStub({"/resources": (200, {"gpu": stale})}, token="t") as api:
        result = audit(tree, api={"url": api.url, "token": "t"})
    assert result["api"]["mismatches"] == [{"field": "allocatable_slots", "local": 30, "api": 31},
                                           {"field": "quarantined_slots", "local": 1, "api": 0}]
    assert "api_mismatch" in codes(result)
    result = audit(tree, api={"url": closed_port_url(), "timeout": 2})
    assert result["api"]["reachable"] is False
    assert result["issues"][0]["code"] == "api_unreachable" and result["issues"][0]["severity"] == "critical"


def test_prerequisites(tree, tmp_path):
    sriov = tmp_path / "sriov-manage"
    units = tmp_path / "units"
    checks = dict((c["name"], c) for c in _prerequisites.prerequisites(
        tree.sysfs_root, tree.proc_root, str(sriov), _audit.DEFAULT_DCGM_UNITS, (str(units),)))
    assert sorted(checks) == ["dcgm_units", "iommu", "nvidia_vgpu_driver", "sriov_manage", "vendor_vfio", "vfio_modules"]
    # hosttree has IOMMU groups and vendor-VFIO VFs, and nothing else.
    assert [n for n, c in sorted(checks.items()) if c["status"] == "pass"] == ["iommu", "vendor_vfio"]
    assert all(c["fix"] for c in checks.values() if c["status"] == "fail")
    for module in _prerequisites.VFIO_MODULES + _prerequisites.NVIDIA_VGPU_MODULES:
        os.makedirs(os.path.join(tree.sysfs_root, "module", module))
    sriov.write_text("#!/bin/sh\n")
    sriov.chmod(0o755)
    units.mkdir()
    for unit in _audit.DEFAULT_DCGM_UNITS:
        (units / unit).write_text("[Unit]\n")
    with open(os.path.join(tree.proc_root, "cmdline"), "w") as handle:
        handle.write("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt\n")
    checks = _prerequisites.prerequisites(tree.sysfs_root, tree.proc_root, str(sriov), _audit.DEFAULT_DCGM_UNITS,
                                          (str(units),))
    assert [c["status"] for c in checks] == ["pass"] * 6
    assert checks[0]["detail"] == "kernel command line has intel_iommu=on"
    result = audit(tree, prereq={"sriov_manage": str(sriov), "unit_dirs": [str(units)]})
    assert "prerequisite_failed" not in codes(result)
    sriov.chmod(0o644)
    result = audit(tree, prereq={"sriov_manage": str(sriov), "unit_dirs": [str(units)]})
    failed = [i for i in result["issues"] if i["code"] == "prerequisite_failed"]
    assert [i["subject"] for i in failed] == ["sriov_manage"]
    assert "not executable" in failed[0]["message"]


def test_result_is_json_serialisable(tree):
    tree.write_store([{"vf_address": tree.card_b.vfs[0], "quarantined_at": Q_AT}])
    json.dumps(audit(tree))


# --- host_not_vgpu: nothing of a hypeman vGPU host at the audited paths ---------------------------

def test_nothing_at_the_paths_is_host_not_vgpu(tmp_path):
    # An inventory whose host paths point nowhere: without the flag this audit would say "ok".
    os.makedirs(str(tmp_path / "proc"))  # (no process: hypeman_expected is off, as on a fleet without it)
    nowhere = _audit.Paths(str(tmp_path / "data"), str(tmp_path / "data" / "gpu" / "vf-health.json"),
                           str(tmp_path / "sys"), str(tmp_path / "proc"), str(tmp_path / "dev"),
                           str(tmp_path / "state"), str(tmp_path / "config.yaml"))
    result, _warnings = _audit.audit_host(nowhere, hypeman_expected=False)
    assert codes(result) == ["host_not_vgpu"]
    assert result["needs_action"] is True
    issue = result["issues"][0]
    assert issue["severity"] == "warning"
    assert issue["message"] == (
        "nothing of a hypeman vGPU host found: no NVIDIA SR-IOV GPU in %s (no such directory), no hypeman data "
        "directory %s, no config %s" % (tmp_path / "sys" / "bus" / "pci" / "devices", tmp_path / "data",
                                        tmp_path / "config.yaml"))
    assert "hypeman_vgpu_sysfs_root, hypeman_vgpu_data_dir" in issue["action"]
    assert result["footprint"] == {
        "sysfs_devices": str(tmp_path / "sys" / "bus" / "pci" / "devices"), "sysfs_devices_exist": False,
        "nvidia_sriov_cards": 0, "data_dir": str(tmp_path / "data"), "data_dir_exists": False,
        "config_path": str(tmp_path / "config.yaml"), "config_exists": False, "not_vgpu": True}


def test_host_not_vgpu_comes_first_among_warnings(tmp_path):
    tree = HostTree(tmp_path / "host")
    tree.add_device("0000:3b:00.0")  # an NVIDIA GPU without SR-IOV
    shutil.rmtree(tree.data_dir)
    result = audit(tree, hypeman_expected=True)
    assert [i["code"] for i in result["issues"]] == ["host_not_vgpu", "hypeman_not_running"]
    assert "(it has other devices)" in result["issues"][0]["message"]


def test_gpu_less_hypeman_host_is_not_flagged(tmp_path):
    # hypeman's data dir is there, no GPU: a hypeman host without vGPUs, nothing to do.
    tree = HostTree(tmp_path / "host")
    tree.write_config(threshold=2)
    assert os.path.isdir(tree.data_dir)
    result = audit(tree)
    assert result["footprint"]["nvidia_sriov_cards"] == 0 and result["footprint"]["data_dir_exists"] is True
    assert codes(result) == []


def test_cards_without_a_data_dir_are_not_flagged(tree):
    # A vGPU host on which hypeman has not run yet (no data dir): the cards show what it is.
    shutil.rmtree(tree.data_dir)
    result = audit(tree)
    assert result["footprint"]["nvidia_sriov_cards"] == 2 and "host_not_vgpu" not in codes(result)


def test_a_card_left_without_vfs_still_counts_as_a_card(tmp_path):
    tree = HostTree(tmp_path / "host")
    card = tree.add_card("A100", "0000:82:00.0")
    tree.remove_vfs(card.address)
    result = audit(tree)
    assert result["footprint"]["nvidia_sriov_cards"] == 1
    assert codes(result) == ["card_without_vfs"]


def test_unknown_cards_are_not_flagged(tree):
    # Placement could not be read: whether there are cards is unknown, audit_incomplete says so.
    tree.write_config(raw="gpu:\n  vf_quarantine_threshold: zero\n")
    shutil.rmtree(tree.data_dir, ignore_errors=True)
    result = audit(tree)
    assert result["footprint"]["nvidia_sriov_cards"] is None and result["footprint"]["not_vgpu"] is False
    assert "host_not_vgpu" not in codes(result)


settings.register_profile("fuzz", max_examples=2000, deadline=None)
settings.register_profile("default", max_examples=40, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

_PATH_KINDS = ("missing", "directory", "file", "symlink_to_dir", "dangling_symlink", "fifo", "symlink_loop")
# The config as a FIFO or non-UTF-8 bytes is left out: reading hypeman's config is not this flag's
# business (the config reader blocks on a FIFO and raises on such bytes; reported to its owners).
_CONFIG_KINDS = tuple(kind for kind in _PATH_KINDS if kind != "fifo")


def _make(path, kind, target_dir, content=b"\x00\xff garbage"):
    if kind == "directory":
        os.makedirs(path)
    elif kind == "file":
        with open(path, "wb") as handle:
            handle.write(content)
    elif kind == "symlink_to_dir":
        os.symlink(target_dir, path)
    elif kind == "dangling_symlink":
        os.symlink(path + ".nowhere", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink_loop":
        os.symlink(os.path.basename(path), path)


@given(data_dir=st.sampled_from(_PATH_KINDS), config=st.sampled_from(_CONFIG_KINDS),
       devices=st.sampled_from(("missing", "empty", "other_gpu", "sriov_card", "card_without_vfs")))
def test_host_not_vgpu_is_exactly_no_card_and_no_data_dir(tmp_path_factory, data_dir, config, devices):
    # Whatever sits at the data dir and config paths (hostile kinds included), the audit answers
    # without an error about them, and flags the host exactly when it finds no card and no data dir.
    root = str(tmp_path_factory.mktemp("host"))
    tree = HostTree(root)
    if devices == "empty":
        os.makedirs(os.path.join(tree.sysfs_root, "bus", "pci", "devices"), exist_ok=True)
    elif devices == "other_gpu":
        tree.add_device("0000:3b:00.0")
    elif devices in ("sriov_card", "card_without_vfs"):
        card = tree.add_card("A100", "0000:82:00.0")
        if devices == "card_without_vfs":
            tree.remove_vfs(card.address)
    shutil.rmtree(tree.data_dir)
    os.makedirs(os.path.dirname(tree.config_path), exist_ok=True)
    spare = os.path.join(root, "spare-dir")
    os.makedirs(spare)
    _make(tree.data_dir, data_dir, spare)
    _make(tree.config_path, config, spare, content=b"gpu:\n  vf_quarantine_threshold: 2\n")
    result, _warnings = _audit.audit_host(paths(tree), hypeman_expected=False, sentinel=False)
    footprint = result["footprint"]
    if result["placement"] is None:
        assert footprint["not_vgpu"] is False and "host_not_vgpu" not in codes(result)
        return
    has_card = devices in ("sriov_card", "card_without_vfs")
    has_data_dir = data_dir in ("directory", "symlink_to_dir")
    assert footprint["nvidia_sriov_cards"] == (1 if has_card else 0)
    assert footprint["data_dir_exists"] is has_data_dir
    assert footprint["not_vgpu"] is (not has_card and not has_data_dir)
    assert ("host_not_vgpu" in codes(result)) is footprint["not_vgpu"]
    json.dumps(result)
