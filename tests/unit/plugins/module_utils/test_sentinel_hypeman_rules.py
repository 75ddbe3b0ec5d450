# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The marker-era rules of hypeman's L1 sentinel the scan follows (docs/sentinel.md).

Each test names the hypeman behaviour it holds the scan to (lib/instances/vgpu_sentinel.go
and its tests, L1 app.log sentinel of kernel/hypeman PR #435), or the documented
place where the scan differs on purpose.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sentinel
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.sentinel_host import (
    CLAIMED_AT, CLAIMED_NS, SEC, Host, markers_read as _markers_read, ts as _ts, verdicts as _verdicts)


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


class FakeStore(object):
    """Records the reports as hypeman's store would receive them."""

    def __init__(self):
        self.reports = []

    def report_failure(self, vf, instance_id, assigned_at, threshold):
        self.reports.append(("failure", vf, instance_id, assigned_at))
        return "recorded"

    def report_success(self, vf, instance_id, assigned_at):
        self.reports.append(("success", vf, instance_id, assigned_at))
        return "cleared", 1


def _recorder(store):
    def record(report):
        findings = report.unrecorded()
        outcomes = _sentinel.record_verdicts(store, findings, 2)
        report.mark_recorded(findings)
        return outcomes
    return record


# --- a pending OK of the previous assignment (hypeman: retryPendingSuccess before the tail is replaced) ---


def test_unrecorded_ok_of_the_previous_assignment_is_still_reported_after_reassignment(host):
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 30 * SEC))
    audit = host.scan()  # findings only: the OK is not recorded yet
    assert _verdicts(audit) == {"inst-a": ("ok", _ts(30))} and audit.findings[0]["recorded"] is False
    host.reassign("inst-a", vf_index=1, claimed_at=_ts(100))

    report = host.scan()
    assert [(f["vf_address"], f["assigned_at"], f["current"], f["verdict"], f["recorded"])
            for f in report.findings] == [(host.card.vfs[0], CLAIMED_AT, False, "ok", False)]
    assert _markers_read(report) == 0  # nothing new read: the verdict is the cursor's

    store = FakeStore()
    recorded = host.scan(recorder=_recorder(store))
    assert store.reports == [("success", host.card.vfs[0], "inst-a", CLAIMED_AT)]  # the OLD assignment
    assert recorded.findings[0]["recorded"] is True
    after = host.scan(recorder=_recorder(store))
    assert after.findings == [] and len(store.reports) == 1  # reported once, then dropped


def test_previous_ok_and_the_new_assignments_verdict_are_both_reported(host):
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 30 * SEC))
    host.scan()
    host.reassign("inst-a", vf_index=1, claimed_at=_ts(100))
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 130 * SEC))
    store = FakeStore()
    report = host.scan(recorder=_recorder(store))
    assert sorted((f["current"], f["vf_address"], f["verdict"]) for f in report.findings) == [
        (False, host.card.vfs[0], "ok"), (True, host.card.vfs[1], "failed")]
    assert store.reports == [("success", host.card.vfs[0], "inst-a", CLAIMED_AT),
                             ("failure", host.card.vfs[1], "inst-a", _ts(100))]  # marker-time order


@pytest.mark.parametrize("verdict, recorded", [("ok", True), ("failed", False)])
def test_recorded_ok_or_failed_verdict_is_not_carried_to_the_next_assignment(host, verdict, recorded):
    # A recorded OK is done; a FAILED is never reported after the assignment changed
    # (hypeman: "assignment changed during scan"), recorded or not.
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report(verdict, CLAIMED_NS + 30 * SEC))
    if recorded:
        host.scan(recorder=_recorder(FakeStore()))
    else:
        host.scan()
    host.reassign("inst-a", vf_index=1, claimed_at=_ts(100))
    assert host.scan().findings == []


def test_pending_previous_ok_survives_a_failed_store_write_and_a_crash_before_the_cursor(host):
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 30 * SEC))
    host.scan()
    host.reassign("inst-a", vf_index=1, claimed_at=_ts(100))

    def failing(_report):
        raise RuntimeError("store write failed")

    with pytest.raises(RuntimeError):
        host.scan(recorder=failing)
    store = FakeStore()
    host.scan(recorder=_recorder(store))
    assert store.reports == [("success", host.card.vfs[0], "inst-a", CLAIMED_AT)]


def test_cursor_with_a_malformed_previous_entry_is_rebuilt(host):
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 30 * SEC))
    host.scan()
    host.reassign("inst-a", vf_index=1, claimed_at=_ts(100))
    host.scan()
    path = host.cursor_path("inst-a")
    with open(path) as handle:
        state = json.load(handle)
    assert state["previous"]["assignment"] == {"vf_address": host.card.vfs[0], "assigned_at": CLAIMED_AT}
    for bad in ({"assignment": {}, "verdict": state["previous"]["verdict"]},
                {"assignment": state["previous"]["assignment"], "verdict": dict(state["previous"]["verdict"],
                                                                                verdict="failed")},
                "x"):
        assert not _sentinel.valid_state(dict(state, previous=bad), "inst-a")
    assert _sentinel.valid_state(state, "inst-a")


# --- released assignments and assignments without a time (hypeman: confirmAssignment, getVGPUSentinelTarget) ---


def _release_during_scan(host, monkeypatch, instance_id, release):
    real_current = _sentinel._InstanceScan.current

    def racing_current(self, same_assignment, sink):
        result = real_current(self, same_assignment, sink)
        release()
        return result

    monkeypatch.setattr(_sentinel._InstanceScan, "current", racing_current)
    try:
        return host.scan()
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("how", ["metadata_gone", "claim_cleared", "retention_stub"])
def test_assignment_released_during_the_scan_keeps_its_markers(host, monkeypatch, how):
    app = host.instance("inst-a", vf_index=2)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    meta_path = os.path.join(host.tree.data_dir, "guests", "inst-a", "metadata.json")

    def release():
        if how == "metadata_gone":
            os.unlink(meta_path)
            return
        with open(meta_path) as handle:
            meta = json.load(handle)
        if how == "claim_cleared":
            meta["GPUDevicePath"] = ""
        else:
            meta["GPURetainedForCleanup"] = True
        with open(meta_path, "w") as handle:
            json.dump(meta, handle)

    report = _release_during_scan(host, monkeypatch, "inst-a", release)
    assert report.skipped == []
    assert [(f["vf_address"], f["assigned_at"], f["verdict"]) for f in report.findings] == [
        (host.card.vfs[2], CLAIMED_AT, "failed")]


def test_assignment_replaced_during_the_scan_still_rejects_its_markers(host, monkeypatch):
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    report = _release_during_scan(host, monkeypatch, "inst-a",
                                  lambda: host.reassign("inst-a", vf_index=1, claimed_at=_ts(10)))
    assert report.findings == []
    assert report.skipped[0]["reason"] == "vGPU assignment changed during the scan; scan again"


def test_instance_released_before_the_scan_is_not_scanned(host):
    host.instance("inst-a", vf_index=0, build="assigned", retained_for_cleanup=True)
    report = host.scan()
    assert report.findings == [] and report.skipped[0]["instance_id"] == "inst-a"


def test_claim_without_an_assignment_time_is_reported_with_an_empty_time(host):
    now = time.time_ns()
    app = host.instance("inst-a", vf_index=1)
    meta_path = os.path.join(host.tree.data_dir, "guests", "inst-a", "metadata.json")
    with open(meta_path) as handle:
        meta = json.load(handle)
    meta.pop("GPUClaimedAt", None)
    meta.pop("GPUAssignedAt", None)
    with open(meta_path, "w") as handle:
        json.dump(meta, handle)
    guestlog.append(app, guestlog.report("failed", now - 7 * 24 * 3600 * SEC))  # any guest ts: no time to compare
    store = FakeStore()
    report = host.scan(recorder=_recorder(store))
    assert report.skipped == []
    assert [(f["vf_address"], f["assigned_at"], f["verdict"]) for f in report.findings] == [
        (host.card.vfs[1], "", "failed")]
    assert store.reports == [("failure", host.card.vfs[1], "inst-a", "")]


def test_claim_without_an_assignment_time_still_ignores_earlier_boots(host):
    now = time.time_ns()
    app = host.instance("inst-a", vf_index=1)
    guestlog.append(app, guestlog.report("failed", now))
    guestlog.copytruncate(app)
    os.utime(app + ".1", ns=(now - 7200 * SEC, now - 7200 * SEC))
    guestlog.archive_previous_boot(app, now - 3600 * SEC)
    guestlog.append(app, guestlog.noise(3))
    meta_path = os.path.join(host.tree.data_dir, "guests", "inst-a", "metadata.json")
    with open(meta_path) as handle:
        meta = json.load(handle)
    meta.pop("GPUClaimedAt", None)
    meta.pop("GPUAssignedAt", None)
    with open(meta_path, "w") as handle:
        json.dump(meta, handle)
    report = host.scan()
    assert report.findings == [] and report.skipped == []


# --- app.log.1 on a fresh cursor (hypeman reads it only to finish a stream it followed) ---


def test_fresh_cursor_does_not_read_a_previous_boots_rotated_log(host):
    now = time.time_ns()
    claim = now - 3600 * SEC
    app = host.instance("inst-a", claimed_at=guestlog.rfc3339nano(claim))
    guestlog.append(app, guestlog.report("failed", now))  # guest clock far ahead
    guestlog.copytruncate(app)
    os.utime(app + ".1", ns=(claim - 600 * SEC, claim - 600 * SEC))  # rotated before this assignment
    guestlog.append(app, guestlog.noise(3))
    report = host.scan()
    assert report.findings == [] and report.unattributed == []
    assert [os.path.basename(s["file"]) for s in report.scanned] == ["app.log"]  # app.log.1 not read


def test_fresh_cursor_reads_a_rotated_log_of_this_assignment(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    guestlog.copytruncate(app)  # now: after the claim
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert [os.path.basename(s["file"]) for s in report.scanned] == ["app.log.1", "app.log"]
