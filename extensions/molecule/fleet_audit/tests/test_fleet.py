# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""fleet_audit verify: the reports converge wrote, and each host after reconcile.

Runs once per host; the report files are on the controller, where pytest runs.
"""

from __future__ import annotations

import json
import os

import pytest

REPORTS = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", ""), "reports")
ROOT = "/srv/vgpu-sim"
EXPECTED = {
    "fleet-store": ["store_unavailable"],
    "fleet-sentinel": ["below_threshold", "sentinel_unreported"],
    # hypeman's own sentinel recorded inst-b's failure (below_threshold); its gauge
    # counts no quarantine, the file one added behind its back (quarantine_count_mismatch).
    "fleet-drift": ["api_mismatch", "below_threshold", "card_overflow_only", "pending_quarantine",
                    "quarantine_count_mismatch", "quarantined_vfs"],
}
# After hypeman hard-killed inst-a's QEMU and the OOM killer inst-c's (fleet-drift only).
EXPECTED_AFTER_TRIGGERS = dict(EXPECTED, **{
    "fleet-drift": sorted(EXPECTED["fleet-drift"] + ["sentinel_coverage_lost", "vf_at_risk"])})
MODE = {"fleet-store": "markers", "fleet-sentinel": "markers", "fleet-drift": "vsock"}
ACTIONS = {
    "fleet-store": [("repair_store", True)],
    "fleet-sentinel": [("sentinel_failed", True)],
    "fleet-drift": [("reevaluate", True)],
}


def load(*parts):
    with open(os.path.join(REPORTS, *parts)) as handle:
        return json.load(handle)


def by_host(report):
    return dict((entry["host"], entry) for entry in report["hosts"])


def codes(entry):
    return sorted(set(issue["code"] for issue in entry["issues"]))


def comparable(report):
    report = json.loads(json.dumps(report))
    for key in ("generated_at", "check_mode", "reports"):
        report.pop(key)
    report["summary"].pop("reports")
    for entry in report["hosts"]:
        entry.pop("audited_at")
        # The wedge-risk look-back starts at the audit's own time, and the
        # journal read grows between the two audits.
        wedge = entry.get("wedge_signals") or {}
        wedge.pop("since", None)
        for source in wedge.get("sources") or []:
            source.pop("lines", None)
        # hypeman's counters and uptime grow between the two audits; which results it counted does not.
        sample = (entry.get("metrics") or {}).get("sample") or {}
        sample.pop("uptime_seconds", None)
        sample.pop("taken_at", None)
        if sample.get("checks"):
            sample["checks"] = sorted(sample["checks"])
    # Each audit keeps its history in its own report directory, stamped with its own time.
    history = report.get("history") or {}
    history.pop("dir", None)
    history.pop("record_file", None)
    for point in history.get("points") or []:
        point.pop("generated_at", None)
    return report


@pytest.fixture(scope="module")
def name(host):
    return host.backend.host


def test_audit_lists_each_problem_class(name):
    entry = by_host(load("audit", "fleet-audit.json"))[name]
    assert codes(entry) == EXPECTED[name]
    assert entry["needs_action"] is True


def test_audit_report_files_and_summary():
    report = load("audit", "fleet-audit.json")
    summary = report["summary"]
    assert summary["hosts_total"] == 3 and summary["hosts_needing_action"] == 3
    assert summary["store_unavailable"] == ["fleet-store"]
    assert summary["sentinel_unreported"] == 1 and summary["pending_quarantine_vfs"] == 1
    # Only fleet-drift: on fleet-store hypeman and the collection give the same legacy-store error, word for word.
    assert summary["hosts_api_mismatch"] == 1
    store_api = by_host(report)["fleet-store"]["api"]
    assert store_api["error"] is None and store_api["mismatches"] == []
    # Critical first: the host whose placement is disabled leads the report.
    assert report["hosts"][0]["host"] == "fleet-store"
    for path in report["reports"].values():
        with open(path) as handle:
            text = handle.read()
        assert all(host in text for host in EXPECTED)


def test_check_mode_audit_reports_the_same():
    assert comparable(load("audit-check", "fleet-audit.json")) == comparable(load("audit", "fleet-audit.json"))
    assert load("audit-check", "fleet-audit.json")["check_mode"] is True


def test_each_host_shows_its_sentinel_mode(name):
    entry = by_host(load("audit", "fleet-audit.json"))[name]
    assert entry["sentinel"]["sentinel_mode"] == MODE[name], entry["sentinel"]
    if MODE[name] == "markers":
        assert entry.get("metrics") is None  # no metrics_url there
        return
    # Current hypeman: the guests' logs cannot show a failure; hypeman's own sentinel is read instead.
    assert entry["sentinel"]["findings"] == [] and entry["sentinel"]["log_evidence"] == "none"
    metrics = entry["metrics"]
    assert metrics["error"] is None and metrics["previous"] is None and metrics["coverage_problems"] == []
    sample = metrics["sample"]
    # inst-a and inst-c answer ok, inst-b (wedged VF) failed: hypeman recorded it, quarantined nothing.
    assert sorted(sample["checks"]) == ["failed", "ok"] and sample["checks"]["ok"] >= sample["checks"]["failed"] >= 1
    assert sample["init_failures"] == 1 and sample["quarantines"] in (0, None)
    # Cross-checked with the store: hypeman counts 0 quarantined VFs, the file holds the hand-added one.
    assert sample["quarantined_vfs"] == 0 and metrics["store_quarantined"] == 1


def test_second_audit_reports_the_wedge_risk_and_lost_coverage(name):
    report = load("audit-2", "fleet-audit.json")
    entry = by_host(report)[name]
    assert codes(entry) == EXPECTED_AFTER_TRIGGERS[name]
    at_risk = sorted((v["vf"], v["reason"], v["instance_id"]) for v in entry["at_risk_vfs"])
    if name != "fleet-drift":
        assert at_risk == []
        return
    assert at_risk == [("0000:82:00.4", "vf_may_wedge", "inst-a"), ("0000:82:01.0", "oom_killed_qemu", "inst-c")]
    evidence = dict((v["vf"], v["evidence"][-1]) for v in entry["at_risk_vfs"])
    assert "device may wedge" in evidence["0000:82:00.4"]["line"]
    assert json.loads(evidence["0000:82:00.4"]["line"])["device_path"] == "/sys/bus/pci/devices/0000:82:00.4"
    assert evidence["0000:82:00.4"]["source"] == "journal (hypeman)"
    assert "Killed process" in evidence["0000:82:01.0"]["line"] and evidence["0000:82:01.0"]["comm"] == "qemu-system-x86"
    # hypeman's sentinel lost sight of inst-c (its QEMU is gone) since the first audit's sample.
    metrics = entry["metrics"]
    assert metrics["previous"] is not None and metrics["sample"]["checks"].get("rpc_error", 0) >= 1
    assert any("rpc_error" in problem for problem in metrics["coverage_problems"]), metrics["coverage_problems"]
    assert report["summary"]["sentinel_coverage_lost"] == ["fleet-drift"]
    assert report["summary"]["hosts_sentinel_vsock"] == 1 and report["summary"]["hosts_sentinel_markers"] == 2
    assert sorted((a["vf"], a["reason"]) for a in report["summary"]["at_risk"]) == [
        ("0000:82:00.4", "vf_may_wedge"), ("0000:82:01.0", "oom_killed_qemu")]
    # The same in the Markdown and HTML reports.
    for path in (report["reports"]["markdown"], report["reports"]["html"]):
        with open(path) as handle:
            text = handle.read()
        for needle in ("sentinel vsock", "rpc_error", "0000:82:00.4", "0000:82:01.0", "sentinel_coverage_lost"):
            assert needle in text, (path, needle)


def prometheus_values(text):
    """``{series: value}`` of a textfile (series with their labels, as written)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            values[series] = float(value)
    return values


def test_prometheus_textfile_of_the_second_audit(name, sh):
    # Written by the third audit; the reconcile writes none (no audit_prometheus_dir there).
    values = prometheus_values(sh.file("/tmp/hypeman_vgpu.prom").content_string)
    assert values['hypeman_vgpu_sentinel_mode{mode="%s"}' % MODE[name]] == 1
    if MODE[name] == "markers":
        assert "hypeman_vgpu_hypeman_metrics_readable" not in values
        return
    assert values["hypeman_vgpu_hypeman_metrics_readable"] == 1
    assert values["hypeman_vgpu_hypeman_sentinel_init_failures"] == 1
    assert values["hypeman_vgpu_hypeman_quarantined_vfs"] == 0
    assert values["hypeman_vgpu_sentinel_coverage_lost"] == 1
    assert values['hypeman_vgpu_at_risk_vfs{reason="vf_may_wedge"}'] == 1
    assert values['hypeman_vgpu_at_risk_vfs{reason="oom_killed_qemu"}'] == 1
    for result in ("ok", "failed", "rpc_error"):
        assert values['hypeman_vgpu_hypeman_sentinel_checks{result="%s"}' % result] >= 1


def test_reconcile_made_the_safe_repairs(name):
    entry = by_host(load("reconcile-1", "fleet-reconcile.json"))[name]
    assert sorted((a["kind"], a["changed"]) for a in entry["actions"]) == ACTIONS[name]
    assert not any(a["failed"] for a in entry["actions"])
    # The audit after the repairs: the problem class is gone, and hypeman agrees with the files.
    remaining = codes(entry)
    for code in ("store_unavailable", "sentinel_unreported", "pending_quarantine", "api_mismatch"):
        assert code not in remaining, entry["issues"]
    assert entry["api"]["error"] is None and entry["api"]["mismatches"] == []


def test_second_reconcile_found_nothing_to_do(name):
    entry = by_host(load("reconcile-2", "fleet-reconcile.json"))[name]
    assert [a for a in entry["actions"] if a["changed"]] == []


def test_host_state_after_reconcile(name, sh):
    store = json.loads(sh.file(ROOT + "/var/lib/hypeman/gpu/vf-health.json").content_string)
    assert store["version"] == 1
    quarantined = sorted(r["vf_address"] for r in store["records"] if r.get("quarantined_at"))
    assert quarantined == {"fleet-store": ["0000:82:01.1"], "fleet-sentinel": ["0000:82:00.5"],
                           "fleet-drift": ["0000:82:00.6", "0000:82:00.7"]}[name]
    assert sh.service("hypeman").is_running
    if name == "fleet-sentinel":
        (record,) = [r for r in store["records"] if r["vf_address"] == "0000:82:00.5"]
        assert [f["instance_id"] for f in record["failures"]] == ["inst-old", "inst-wedged"]
