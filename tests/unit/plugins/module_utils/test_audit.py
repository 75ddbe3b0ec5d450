# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_audit: one host's audit on simulated trees; read-only; every problem class classified."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _audit, _gotime, _hypeman, _ledger, _sentinel, _store_write
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub, closed_port_url

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


def fingerprint(root):
    out = {}
    for base, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                out[path] = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    out[path] = (info.st_mode, hashlib.sha256(handle.read()).hexdigest())
            else:
                out[path] = info.st_mode
    return out


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
    entry = _ledger.make_entry("quarantine", owned_vf, _store_time(Q_AT), "drain", user="ops", trigger="manual",
                               parent_gpu=tree.card_b.address)
    _ledger.append_entries(tree.state_dir, [entry])
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
    _sentinel.run(instances, unreadable, lambda i: _hypeman.instance_log_dir(tree.data_dir, i), tree.state_dir)
    guestlog.append(os.path.join(tree.data_dir, "guests", "inst-wedged", "logs", "app.log"),
                    guestlog.report("ok", MARKER_NS + 10 ** 9))
    tree.write_store([{"vf_address": vf, "failures": [failure("inst-old")]}])
    before = fingerprint(tree.root)
    first = audit(tree)
    second = audit(tree)
    assert fingerprint(tree.root) == before
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
    checks = dict((c["name"], c) for c in _audit.prerequisites(tree.sysfs_root, tree.proc_root, str(sriov),
                                                               unit_dirs=(str(units),)))
    assert sorted(checks) == ["dcgm_units", "iommu", "nvidia_vgpu_driver", "sriov_manage", "vendor_vfio", "vfio_modules"]
    # hosttree has IOMMU groups and vendor-VFIO VFs, and nothing else.
    assert [n for n, c in sorted(checks.items()) if c["status"] == "pass"] == ["iommu", "vendor_vfio"]
    assert all(c["fix"] for c in checks.values() if c["status"] == "fail")
    for module in _audit.VFIO_MODULES + _audit.NVIDIA_VGPU_MODULES:
        os.makedirs(os.path.join(tree.sysfs_root, "module", module))
    sriov.write_text("#!/bin/sh\n")
    sriov.chmod(0o755)
    units.mkdir()
    for unit in _audit.DEFAULT_DCGM_UNITS:
        (units / unit).write_text("[Unit]\n")
    with open(os.path.join(tree.proc_root, "cmdline"), "w") as handle:
        handle.write("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt\n")
    checks = _audit.prerequisites(tree.sysfs_root, tree.proc_root, str(sriov), unit_dirs=(str(units),))
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
