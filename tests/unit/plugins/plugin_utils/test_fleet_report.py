# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""fleet_report: host entries, ordering, summary, policies, repair plans and the renderings."""

from __future__ import annotations

import json
import re

import pytest

from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as fr


def issue(severity, code, subject=None):
    return {"severity": severity, "code": code, "message": "%s happened" % code, "action": "do something",
            "subject": subject}


def audit_result(issues=(), quarantined=(), owned=(), total=32, lost=0, gpus=(), findings=(), unreported=(),
                 valid=True, would=(), running=True):
    return {
        "threshold": 2, "threshold_source": "default", "errors": [],
        "store": {"path": "/s", "exists": True, "format": "v1" if valid else "legacy", "valid": valid,
                  "error": None if valid else "unmarshal VF health state: ...", "symlink": False,
                  "records": len(quarantined), "quarantined": list(quarantined), "owned": list(owned),
                  "by_hypeman": sorted(set(quarantined) - set(owned)), "would_quarantine": list(would),
                  "below_threshold": {}, "stale_records": [], "recoverable": []},
        "placement": {"framework": "vendor-vfio", "placement_disabled_reason": None, "threshold": 2,
                      "slots": {"total": total, "used": 0, "allocatable": total - lost, "quarantined": lost},
                      "pending_quarantine": [], "gpus": list(gpus), "unreadable_vfs": [], "unreadable_metadata": [],
                      "held_open_error": None},
        "capacity": {"total_slots": total, "allocatable_slots": total - lost, "quarantined_slots": lost,
                     "lost_slots": lost, "lost_pct": round(100.0 * lost / total, 2) if total else 0.0},
        "sentinel": {"findings": list(findings), "unreported": list(unreported), "skipped_instances": [],
                     "unattributed": 0, "history": 0, "warnings": []},
        "hypeman": {"running": running, "pids": [1] if running else [], "error": None},
        "api": None, "prerequisites": None, "issues": list(issues),
        "needs_action": any(i["severity"] != "info" for i in issues), "changed": False,
    }


def gpu(address, drained=False, idle=False, overflow=False, quarantined=0):
    return {"address": address, "vf_total": 16, "sriov_numvfs": 16, "sriov_totalvfs": 16, "quarantined": quarantined,
            "allocatable": 16 - quarantined, "allocated": 0, "claimed": 0, "held_open": 0, "overflow_only": overflow,
            "drained": drained, "idle": idle, "idle_blockers": [], "live_instances": []}


def finding(instance_id, vf, ts, verdict="failed", effect="recorded"):
    return {"instance_id": instance_id, "vf_address": vf, "assigned_at": "2026-08-31T12:00:00Z", "verdict": verdict,
            "ts": ts, "nvrm": "NVRM: x RmInitAdapter failed!" if verdict == "failed" else None, "effect": effect}


@pytest.fixture
def entries():
    return [
        fr.host_entry(audit_result(), "healthy"),
        fr.host_entry(audit_result([issue("info", "below_threshold")]), "info-only"),
        fr.host_entry(audit_result([issue("warning", "card_ready_for_cycle", "0000:83:00.0"),
                                    issue("info", "quarantined_vfs")],
                                   quarantined=["a%d" % i for i in range(16)], lost=16,
                                   gpus=[gpu("0000:82:00.0"), gpu("0000:83:00.0", True, True, quarantined=16)]),
                      "drained"),
        fr.host_entry(audit_result([issue("critical", "store_unavailable")], valid=False, lost=32), "broken"),
        fr.host_entry({"unreachable": True, "msg": "ssh: connect to host x port 22: Connection refused\nmore"},
                      "gone"),
        fr.host_entry({"failed": True, "msg": "cannot read /proc"}, "failing"),
        fr.host_entry(audit_result([issue("warning", "sentinel_unreported"), issue("warning", "api_mismatch")],
                                   findings=[finding("i", "v", "2026-08-31T12:00:30Z")],
                                   unreported=[finding("i", "v", "2026-08-31T12:00:30Z")]), "wedged"),
    ]


def test_host_entries(entries):
    by_host = dict((e["host"], e) for e in entries)
    assert by_host["healthy"]["status"] == "ok" and by_host["healthy"]["severity"] == "ok"
    assert by_host["info-only"]["status"] == "ok" and by_host["info-only"]["severity"] == "info"
    assert by_host["gone"]["status"] == "unreachable"
    assert by_host["gone"]["issues"][0]["message"] == ("host unreachable: ssh: connect to host x port 22: "
                                                       "Connection refused")
    assert by_host["gone"]["store"] is None and by_host["gone"]["needs_action"] is True
    assert by_host["failing"]["status"] == "failed"
    assert [i["code"] for i in by_host["failing"]["issues"]] == ["audit_failed"]
    assert by_host["broken"]["severity"] == "critical"
    assert "changed" not in by_host["healthy"] and "invocation" not in by_host["healthy"]


def test_failed_repair_becomes_a_critical_issue():
    entry = fr.host_entry(audit_result(), "h", actions=[
        {"kind": "repair_store", "target": "/s", "changed": False, "failed": True, "detail": "store_edit: boom"}])
    assert entry["status"] == "needs_action"
    assert entry["issues"][0]["code"] == "reconcile_failed" and "store_edit: boom" in entry["issues"][0]["message"]


def test_hosts_needing_action_come_first(entries):
    report = fr.build_report(entries, generated_at="2026-09-01T00:00:00Z")
    order = [e["host"] for e in report["hosts"]]
    # Critical (by name), then warnings (most issues first), then hosts with notes, then the rest.
    assert order == ["broken", "failing", "gone", "wedged", "drained", "info-only", "healthy"]


def test_summary(entries):
    summary = fr.build_report(entries)["summary"]
    assert summary["hosts_total"] == 7
    assert summary["hosts_ok"] == 2 and summary["hosts_needing_action"] == 5
    assert summary["needing_action"] == ["broken", "failing", "gone", "wedged", "drained"]
    assert summary["hosts_unreachable"] == 1 and summary["unreachable"] == ["gone"]
    assert summary["hosts_failed"] == 1 and summary["failed"] == ["failing"]
    assert summary["hosts_store_unavailable"] == 1 and summary["store_unavailable"] == ["broken"]
    assert summary["cards_ready_for_cycle"] == 1
    assert summary["ready_for_cycle"] == [{"host": "drained", "gpu": "0000:83:00.0"}]
    assert summary["quarantined_vfs"] == 16 and summary["quarantined_by_hypeman"] == 16
    assert summary["sentinel_failed"] == 1 and summary["sentinel_unreported"] == 1
    assert summary["hosts_api_mismatch"] == 1
    assert summary["slots_total"] == 5 * 32 and summary["slots_lost"] == 16 + 32
    assert summary["capacity_loss_pct"] == 30.0
    assert summary["issues_by_code"]["unreachable"] == 1 and summary["issues_by_code"]["quarantined_vfs"] == 1
    json.dumps(summary)


def test_card_without_vfs_is_counted_and_shown():
    no_vfs = dict(gpu("0000:83:00.0"), vf_total=0, sriov_numvfs=0, allocatable=0)
    entry = fr.host_entry(audit_result([issue("warning", "card_without_vfs", "0000:83:00.0")],
                                       gpus=[gpu("0000:82:00.0"), no_vfs]), "half")
    report = fr.build_report([entry], policies=["card_without_vfs"])
    assert report["summary"]["cards_without_vfs"] == 1 and report["summary"]["cards_ready_for_cycle"] == 0
    assert [v["policy"] for v in report["policy"]["violations"]] == ["card_without_vfs"]
    assert "| 0000:83:00.0 | 0 | 0 | 0 | 0 | no VFs (SR-IOV off) |" in fr.render_markdown(report)


def test_host_not_vgpu_is_counted_shown_and_exported():
    footprint = {"sysfs_devices": "/wrong/sys/bus/pci/devices", "sysfs_devices_exist": False,
                 "nvidia_sriov_cards": 0, "data_dir": "/wrong/hypeman", "data_dir_exists": False,
                 "config_path": "/etc/hypeman/config.yaml", "config_exists": False, "not_vgpu": True}
    nothing = dict(audit_result([issue("warning", "host_not_vgpu")], total=0), footprint=footprint)
    entries = [fr.host_entry(nothing, "typo-host"), fr.host_entry(audit_result(), "healthy")]
    assert entries[0]["footprint"] == footprint and entries[0]["status"] == "needs_action"
    report = fr.build_report(entries, policies=["host_not_vgpu", "hosts_not_vgpu>=1"])
    assert report["summary"]["hosts_not_vgpu"] == 1 and report["summary"]["not_vgpu"] == ["typo-host"]
    assert [v["policy"] for v in report["policy"]["violations"]] == ["host_not_vgpu", "hosts_not_vgpu>=1"]
    assert report["hosts"][0]["host"] == "typo-host"
    assert "| Hosts where no hypeman vGPU host was found (check their paths) | 1 |" in fr.render_markdown(report)
    assert "<th>Hosts where no hypeman vGPU host was found (check their paths)</th><td>1</td>" in fr.render_html(report)
    assert "hypeman_vgpu_host_not_vgpu 1\n" in fr.render_prometheus(report["hosts"][0])
    # An entry without the section (an older audit result in AWX's fact cache) exports no such line.
    assert "host_not_vgpu" not in fr.render_prometheus(report["hosts"][1])


@pytest.mark.parametrize("policies, violated", [
    ([], []),
    (["store_unavailable"], ["store_unavailable"]),
    ("store_unavailable, unreachable", ["store_unavailable", "unreachable"]),
    (["needs_action"], ["needs_action"]),
    (["capacity_loss_pct>30"], []),
    (["capacity_loss_pct>=30"], ["capacity_loss_pct>=30"]),
    (["capacity_loss_pct>29.5"], ["capacity_loss_pct>29.5"]),
    (["host_capacity_loss_pct>99"], ["host_capacity_loss_pct>99"]),
    (["host_capacity_loss_pct>100"], []),
    (["hosts_unreachable>0", "pending_quarantine"], ["hosts_unreachable>0"]),
])
def test_policies(entries, policies, violated):
    report = fr.build_report(entries, policies=policies)
    assert [v["policy"] for v in report["policy"]["violations"]] == violated
    assert report["summary"]["failed_policy"] is bool(violated)


def test_policy_violation_names_the_hosts(entries):
    (violation,) = fr.build_report(entries, policies=["host_capacity_loss_pct>=50"])["policy"]["violations"]
    assert violation["hosts"] == ["broken", "drained"]


@pytest.mark.parametrize("policy, message", [
    ("store_unavalable", "unknown policy 'store_unavalable'"),
    ("capacity_loss>5", "unknown measure 'capacity_loss'"),
    ("capacity_loss_pct>", "cannot parse"),
    ("capacity_loss_pct<5", "cannot parse"),
])
def test_bad_policies_are_refused(policy, message):
    with pytest.raises(fr.ReportError, match=message):
        fr.parse_policies([policy])


def test_bad_kind_and_format():
    with pytest.raises(fr.ReportError, match="report kind"):
        fr.build_report([], kind="other")
    with pytest.raises(fr.ReportError, match="unknown report format"):
        fr.report_paths("/r", "audit", ["pdf"])
    assert fr.report_paths("", "audit", ["json"]) == {}
    assert fr.report_paths("/r/", "reconcile", ["json", "markdown", "html"]) == {
        "json": "/r/fleet-reconcile.json", "markdown": "/r/fleet-reconcile.md", "html": "/r/fleet-reconcile.html"}


def test_repair_plan():
    pending = [finding("b", "0000:83:00.5", "2026-08-31T12:01:00Z", "ok", "cleared"),
               finding("a", "0000:83:00.4", "2026-08-31T12:00:30.5Z", "failed", "quarantined")]
    result = audit_result(valid=False, unreported=pending, would=["0000:83:00.6"])
    plan = fr.repair_plan(result)
    assert plan["repair_store"] is True and plan["hypeman_running"] is True
    assert [(p["params"]["state"], p["params"]["instance_id"], p["effect"]) for p in plan["sentinel"]] == [
        ("failed", "a", "quarantined"), ("succeeded", "b", "cleared")]
    assert plan["sentinel"][0]["params"] == {
        "state": "failed", "vf_addresses": ["0000:83:00.4"], "instance_id": "a", "assigned_at": "2026-08-31T12:00:00Z",
        "reason": "sentinel verdict failed of instance a (marker ts=2026-08-31T12:00:30.5Z)"}
    assert plan["reevaluate"] == ["0000:83:00.6"]
    limited = fr.repair_plan(result, ["sentinel"])
    assert limited["repair_store"] is False and limited["reevaluate"] == [] and len(limited["sentinel"]) == 2
    assert len(limited["skipped"]) == 2
    for broken in ({"unreachable": True}, {"failed": True, "msg": "x"}, None):
        assert fr.repair_plan(broken) == {"repair_store": False, "sentinel": [], "reevaluate": [],
                                          "hypeman_running": False,
                                          "skipped": ["no audit result: nothing is repaired on this host"]}
    with pytest.raises(fr.ReportError, match="unknown repair"):
        fr.repair_plan(result, ["store", "everything"])


def test_markdown(entries):
    report = fr.build_report(entries, generated_at="2026-09-01T00:00:00Z", policies=["store_unavailable"])
    text = fr.render_markdown(report)
    assert text.startswith("# hypeman vGPU fleet audit\n")
    assert "**Failed:**" in text and "`store_unavailable`: store_unavailable on 1 host(s): broken" in text
    positions = [text.index("### %s " % host) for host in ("broken", "failing", "gone", "wedged", "drained")]
    assert positions == sorted(positions)
    assert "ansible-playbook hypeman.vgpu.recover_gpu -e target_hosts=drained -e target_gpu=0000:83:00.0" in text
    assert "| healthy | 0 | 32 | 0.0% | - |" in text


def test_html_escapes_everything(entries):
    evil = fr.host_entry({"failed": True, "msg": "<script>alert(1)</script>"}, "<b>host</b>")
    text = fr.render_html(fr.build_report(entries + [evil]))
    assert "<script>" not in text and "&lt;script&gt;" in text and "&lt;b&gt;host&lt;/b&gt;" in text
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")


_SAMPLE = re.compile(r'^hypeman_vgpu_[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+-]+$')


def test_prometheus_textfile(entries):
    by_host = dict((e["host"], e) for e in entries)
    text = fr.render_prometheus(by_host["drained"])
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) hypeman_vgpu_[a-z_]+ ", line)
            continue
        assert _SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        samples[name] = value
    assert samples["hypeman_vgpu_audit_needs_action"] == "1"
    assert samples['hypeman_vgpu_audit_issues{severity="warning"}'] == "1"
    assert samples['hypeman_vgpu_vfs{state="quarantined"}'] == "16"
    assert samples['hypeman_vgpu_cards{state="ready_for_cycle"}'] == "1"
    assert samples["hypeman_vgpu_capacity_loss_ratio"] == "0.5"
    assert samples["hypeman_vgpu_store_valid"] == "1"
    gone = fr.render_prometheus(by_host["gone"])
    assert "hypeman_vgpu_audit_needs_action 1" in gone and "hypeman_vgpu_slots" not in gone


def test_json_round_trip(entries):
    report = fr.build_report(entries)
    assert json.loads(fr.to_json(report)) == report


# --- hypeman's sentinel: mode and its own metrics (docs/hypeman-versions.md) ----------------------


def _with_sentinel(result, mode, sample=None, problems=(), store_quarantined=None):
    result["sentinel"].update(sentinel_mode=mode, sentinel_mode_reason="because", instance_modes=[],
                              log_evidence="none" if mode != "markers" else "complete", log_evidence_reason="r",
                              watched_instances=1)
    if sample is not None:
        result["metrics"] = {"url": "http://127.0.0.1:9464/metrics", "error": None, "sample": sample,
                             "previous": None, "previous_error": None, "coverage_problems": list(problems),
                             "store_quarantined": store_quarantined}
    return result


def _sample(checks):
    return {"taken_at": 1.0, "version": "v0.9.0", "uptime_seconds": 60.0, "checks": checks, "init_failures": 2.0,
            "quarantines": 1.0, "quarantined_vfs": 1.0, "store_unavailable": 0.0}


def test_sentinel_modes_and_coverage_lost_are_counted_rendered_and_usable_as_policies():
    lost = _with_sentinel(audit_result([issue("warning", "sentinel_coverage_lost")]), "vsock",
                          _sample({"ok": 10.0, "rpc_error": 3.0}), ["3 rpc_error check(s) since the previous sample"], 1)
    entries = [fr.host_entry(lost, "vsock-host"),
               fr.host_entry(_with_sentinel(audit_result(), "markers"), "marker-host"),
               fr.host_entry(_with_sentinel(audit_result(), "unknown"), "unknown-host"),
               fr.host_entry(audit_result(), "old-audit")]
    report = fr.build_report(entries, policies=["sentinel_coverage_lost"])
    summary = report["summary"]
    assert (summary["hosts_sentinel_markers"], summary["hosts_sentinel_vsock"], summary["hosts_sentinel_unknown"]) \
        == (1, 1, 1)
    assert summary["hosts_sentinel_coverage_lost"] == 1 and summary["sentinel_coverage_lost"] == ["vsock-host"]
    assert [v["policy"] for v in report["policy"]["violations"]] == ["sentinel_coverage_lost"]
    assert fr.build_report(entries, policies=["hosts_sentinel_unknown > 0"])["summary"]["failed_policy"]
    markdown = fr.render_markdown(report)
    assert "Sentinel: sentinel vsock (because); hypeman v0.9.0 checks ok 10, rpc_error 3" in markdown
    assert "quarantined VFs 1 (store 1)" in markdown
    assert "sentinel markers (because)" in markdown
    assert "hypeman v0.9.0 checks ok 10" in fr.render_html(report)
    by_host = dict((e["host"], e) for e in report["hosts"])
    text = fr.render_prometheus(by_host["vsock-host"])
    for line in ('hypeman_vgpu_sentinel_mode{mode="vsock"} 1', 'hypeman_vgpu_sentinel_mode{mode="markers"} 0',
                 'hypeman_vgpu_hypeman_sentinel_checks{result="rpc_error"} 3.0', "hypeman_vgpu_hypeman_quarantined_vfs 1.0",
                 "hypeman_vgpu_hypeman_sentinel_init_failures 2.0", "hypeman_vgpu_sentinel_coverage_lost 1",
                 "hypeman_vgpu_hypeman_metrics_readable 1"):
        assert line + "\n" in text, line
    assert "hypeman_metrics_readable" not in fr.render_prometheus(by_host["marker-host"])
    assert "sentinel_mode" not in fr.render_prometheus(by_host["old-audit"])
