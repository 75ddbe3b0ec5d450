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
    "fleet-drift": ["api_mismatch", "card_overflow_only", "pending_quarantine", "quarantined_vfs"],
}
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
