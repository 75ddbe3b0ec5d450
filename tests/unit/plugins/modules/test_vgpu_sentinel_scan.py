# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_sentinel_scan: the module's required behaviours, end to end on a host tree."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _proc
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.modules import vgpu_sentinel_scan
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module, warning_texts

CLAIMED_NS = 1788177600123456789  # hosttree's default claim time
SEC = 10 ** 9


def _iso(ns):
    return guestlog.rfc3339nano(ns)


class Host(object):
    def __init__(self, root):
        self.tree = HostTree(root)
        self.card = self.tree.add_card("L40S", "0000:82:00.0")
        self.vf = self.card.vfs[0]

    def boot(self, instance_id, claimed_ns, vf_index=0):
        """hypeman starts the instance: archive the old app.log, claim the VF, new log."""
        logs = os.path.join(self.tree.data_dir, "guests", instance_id, "logs")
        if os.path.exists(os.path.join(logs, "app.log")):
            guestlog.archive_previous_boot(os.path.join(logs, "app.log"), claimed_ns - SEC)
        self.tree.add_instance(instance_id, vf=self.card.vfs[vf_index], profile="NVIDIA L40S-2Q",
                               claimed_at=_iso(claimed_ns))
        return os.path.join(logs, "app.log")

    def run(self, capsys, check_mode=False, diff=False, **args):
        params = {"data_dir": self.tree.data_dir, "state_dir": self.tree.state_dir,
                  "proc_root": self.tree.proc_root, "config_path": self.tree.config_path,
                  "_ansible_check_mode": check_mode, "_ansible_diff": diff}
        params.update(args)
        result = run_module(vgpu_sentinel_scan.main, params, capsys)
        result["warning_texts"] = warning_texts(result)
        return result

    def store(self):
        try:
            with open(self.tree.store_path, "rb") as handle:
                return handle.read()
        except IOError:
            return None

    def records(self):
        data = self.store()
        return {} if data is None else {r["vf_address"]: r for r in json.loads(data)["records"]}


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def _outcomes(result):
    return [(o["instance_id"], o["report"], o["outcome"]) for o in result["outcomes"]]


def test_two_failed_assignments_quarantine_the_vf_and_a_rerun_changes_nothing(host, capsys):
    first_claim, second_claim = CLAIMED_NS, CLAIMED_NS + 3600 * SEC
    app = host.boot("inst-a", first_claim)
    guestlog.append(app, guestlog.report("failed", first_claim + 27 * SEC))
    result = host.run(capsys, record=True)
    assert result["changed"] is True
    assert _outcomes(result) == [("inst-a", "failure", "recorded")]
    assert "quarantined_at" not in host.records()[host.vf]

    app = host.boot("inst-a", second_claim)  # a new assignment of the same VF fails again
    guestlog.append(app, guestlog.report("failed", second_claim + 27 * SEC))
    result = host.run(capsys, record=True)
    assert result["changed"] is True
    assert _outcomes(result) == [("inst-a", "failure", "quarantined")]
    record = host.records()[host.vf]
    assert [f["assigned_at"] for f in record["failures"]] == [_iso(first_claim), _iso(second_claim)]
    assert "quarantined_at" in record
    assert [h["verdict"] for h in result["history"]] == ["failed"]  # the first boot, now archived

    before = host.store()
    again = host.run(capsys, record=True)
    assert again["changed"] is False and again["outcomes"] == []
    assert host.store() == before
    assert [f["recorded"] for f in again["findings"]] == [True]


OLDER_FAILURE = {"instance_id": "inst-old", "assigned_at": "2026-08-30T09:00:00Z",
                 "reported_at": "2026-08-30T09:01:00Z"}


@pytest.mark.parametrize("ok_after_s, reports, older_left", [
    # hypeman reads the log every 5 s: a FAILED more than one pass before the OK was
    # reported on its own pass, and the OK then clears it and every older failure.
    (33, [("inst-a", "failure", "recorded"), ("inst-a", "success", "cleared")], False),
    # Within one pass only the last marker counts: a success without a match changes nothing.
    (5, [("inst-a", "success", "unchanged")], True),
])
def test_failed_then_ok_in_one_scan_is_reported_as_hypemans_passes_would(
        host, capsys, ok_after_s, reports, older_left):
    host.tree.write_store([{"vf_address": host.vf, "failures": [OLDER_FAILURE]}])
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC)
                    + guestlog.report("ok", CLAIMED_NS + (27 + ok_after_s) * SEC))
    result = host.run(capsys, record=True, threshold=3)
    assert _outcomes(result) == reports
    assert result["changed"] is not older_left
    assert (host.vf in host.records()) is older_left
    earlier = result["findings"][0]["earlier_failure"]
    assert (earlier is None) is older_left
    if earlier is not None:
        assert earlier == {"ts": _iso(CLAIMED_NS + 27 * SEC), "nvrm": guestlog.DEFAULT_NVRM, "file": app}
    again = host.run(capsys, record=True, threshold=3)
    assert again["changed"] is False and again["outcomes"] == []


def test_failed_seen_by_an_audit_is_reported_before_a_later_ok(host, capsys):
    # The audit reads the FAILED and leaves it unrecorded; the record run reads only
    # the OK after it. hypeman would have reported both, so both are reported.
    host.tree.write_store([{"vf_address": host.vf, "failures": [OLDER_FAILURE]}])
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    audit = host.run(capsys)
    assert [f["verdict"] for f in audit["findings"]] == ["failed"]
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 60 * SEC))
    result = host.run(capsys, record=True)  # threshold 2: the FAILED quarantines, the OK rescinds
    assert _outcomes(result) == [("inst-a", "failure", "quarantined"), ("inst-a", "success", "rescinded")]
    assert host.records() == {}


def test_failed_crossing_the_threshold_then_ok_is_rescinded_in_one_scan(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC)
                    + guestlog.report("ok", CLAIMED_NS + 90 * SEC))
    result = host.run(capsys, record=True, threshold=1)
    assert _outcomes(result) == [("inst-a", "failure", "quarantined"), ("inst-a", "success", "rescinded")]
    assert host.records() == {}


def test_failed_then_ok_across_two_runs_clears_the_failure(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    assert _outcomes(host.run(capsys, record=True)) == [("inst-a", "failure", "recorded")]
    assert host.vf in host.records()
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 60 * SEC))
    result = host.run(capsys, record=True)
    assert result["changed"] is True
    assert [(o["outcome"], o["cleared"]) for o in result["outcomes"]] == [("cleared", 1)]
    assert host.records() == {}


@pytest.mark.parametrize("threshold", [1, 2])
def test_restart_safety_never_recounts_even_without_cursors(host, capsys, threshold):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    first = host.run(capsys, record=True, threshold=threshold)
    assert _outcomes(first)[0][2] == ("quarantined" if threshold == 1 else "recorded")
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 60 * SEC))
    second = host.run(capsys, record=True, threshold=threshold)
    assert _outcomes(second)[0][2] == ("rescinded" if threshold == 1 else "cleared")
    settled = host.store()
    assert host.records() == {}

    assert host.run(capsys, record=True, threshold=threshold)["changed"] is False
    shutil.rmtree(host.tree.state_dir)  # the cursors are lost: everything is read again
    rerun = host.run(capsys, record=True, threshold=threshold)
    assert rerun["changed"] is False
    # Both reports again, as a fresh hypeman pass pair would make them: the store ends as it was.
    assert [o[1] for o in _outcomes(rerun)] == ["failure", "success"]
    assert host.store() == settled


def test_failure_reread_without_cursors_is_not_counted_twice(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    host.run(capsys, record=True)
    recorded = host.store()
    shutil.rmtree(host.tree.state_dir)
    rerun = host.run(capsys, record=True)
    assert _outcomes(rerun) == [("inst-a", "failure", "unchanged")]
    assert rerun["changed"] is False and host.store() == recorded


def test_marker_written_just_before_copytruncate_is_recorded_once(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.noise(200))
    assert host.run(capsys, record=True)["findings"] == []
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    guestlog.copytruncate(app)
    guestlog.append(app, guestlog.noise(20, seed=1))
    result = host.run(capsys, record=True)
    assert _outcomes(result) == [("inst-a", "failure", "recorded")]
    assert result["findings"][0]["file"] == app + ".1"
    assert sum(s["markers"] for s in result["scanned"]) == 3
    again = host.run(capsys, record=True)
    assert again["changed"] is False and sum(s["markers"] for s in again["scanned"]) == 0
    assert len(host.records()[host.vf]["failures"]) == 1


def test_forged_lines_and_garbage_are_ignored_without_error(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, "".join(guestlog.forged_lines(CLAIMED_NS + 30 * SEC).values()))
    guestlog.append(app, b"\x00\xff\xfeHYPEMAN-GPU-INIT-FAILED\x00\n" + b"Z" * (10 * 1024 * 1024) + b"\n")
    result = host.run(capsys, record=True)
    assert result["changed"] is False
    assert result["findings"] == [] and result["outcomes"] == [] and result["skipped_instances"] == []
    assert host.store() is None


def test_unreadable_log_and_metadata_are_reported_and_the_others_still_recorded(host, capsys):
    bad_log = host.boot("bad-log", CLAIMED_NS, vf_index=1)
    host.boot("bad-meta", CLAIMED_NS, vf_index=2)
    good = host.boot("good", CLAIMED_NS, vf_index=3)
    guestlog.append(good, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    host.tree.break_path(bad_log, "eisdir")
    host.tree.break_path(os.path.join(host.tree.data_dir, "guests", "bad-meta", "metadata.json"), "garbage")
    result = host.run(capsys, record=True)
    assert sorted(s["instance_id"] for s in result["skipped_instances"]) == ["bad-log", "bad-meta"]
    assert "skipped" not in result  # Ansible would report the whole task as skipped
    assert _outcomes(result) == [("good", "failure", "recorded")]
    assert list(host.records()) == [host.card.vfs[3]]


def test_audit_then_record_reports_what_the_audit_already_read(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    audit = host.run(capsys)
    assert audit["changed"] is False and "outcomes" not in audit
    assert [f["recorded"] for f in audit["findings"]] == [False]
    assert host.store() is None
    assert host.run(capsys)["findings"] == audit["findings"]  # evidence still standing
    recorded = host.run(capsys, record=True)
    assert _outcomes(recorded) == [("inst-a", "failure", "recorded")]


def test_check_mode_predicts_and_writes_nothing(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    result = host.run(capsys, check_mode=True, diff=True, record=True, threshold=1)
    assert result["changed"] is True
    assert _outcomes(result) == [("inst-a", "failure", "quarantined")]
    assert result["diff"]["before"] == "" and host.vf in result["diff"]["after"]
    assert host.store() is None and not os.path.exists(host.tree.state_dir)
    applied = host.run(capsys, record=True, threshold=1)
    assert applied["changed"] is True and _outcomes(applied) == _outcomes(result)
    cursor = os.path.join(host.tree.state_dir, "sentinel", "inst-a.json")
    before = open(cursor, "rb").read()
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 60 * SEC))
    check = host.run(capsys, check_mode=True, record=True, threshold=1)
    assert check["changed"] is True and _outcomes(check) == [("inst-a", "success", "rescinded")]
    assert open(cursor, "rb").read() == before
    assert host.vf in host.records()


def test_threshold_from_config_is_used(host, capsys):
    host.tree.write_config(threshold=1)
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    result = host.run(capsys, record=True)
    assert (result["threshold"], result["threshold_source"]) == (1, host.tree.config_path)
    assert _outcomes(result) == [("inst-a", "failure", "quarantined")]


def test_bad_threshold_fails_naming_the_value_and_writes_nothing(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    result = host.run(capsys, record=True, threshold=0)
    assert result["failed"] is True and "threshold is 0" in result["msg"]
    assert host.store() is None and not os.path.exists(host.tree.state_dir)


def test_invalid_store_fails_closed_and_keeps_the_evidence(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    host.tree.write_store(raw="[]")  # legacy bare array: hypeman refuses it
    result = host.run(capsys, record=True)
    assert result["failed"] is True and host.tree.store_path in result["msg"]
    assert host.store() == b"[]"
    assert not os.path.exists(os.path.join(host.tree.state_dir, "sentinel", "inst-a.json"))
    audit = host.run(capsys)  # findings still work on a broken store
    assert [f["verdict"] for f in audit["findings"]] == ["failed"]
    host.tree.write_store(records=[])
    assert _outcomes(host.run(capsys, record=True)) == [("inst-a", "failure", "recorded")]


def test_corrupt_cursor_warns_and_rebuilds(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    host.run(capsys, record=True)
    with open(os.path.join(host.tree.state_dir, "sentinel", "inst-a.json"), "w") as handle:
        handle.write("{oops")
    result = host.run(capsys, record=True)
    assert result["changed"] is False
    # ansible-core 2.19 returns warnings as structured summaries: look at their text.
    assert "rebuilding it from scratch" in json.dumps(result["warnings"])
    assert _outcomes(result) == [("inst-a", "failure", "unchanged")]


def test_instance_filter(host, capsys):
    host.boot("inst-a", CLAIMED_NS, vf_index=0)
    host.boot("inst-b", CLAIMED_NS, vf_index=1)
    result = host.run(capsys, instances=["inst-b", "nope"])
    assert [s["instance_id"] for s in result["scanned"]] == ["inst-b"]
    assert result["skipped_instances"] == [{"instance_id": "nope", "reason": "no such instance"}]


def test_unusable_state_dir_fails_cleanly_and_records_nothing(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    with open(host.tree.state_dir, "w") as handle:
        handle.write("not a directory")
    result = host.run(capsys, record=True)
    assert result["failed"] is True
    assert result["msg"].startswith("cannot use sentinel state directory %s/sentinel" % host.tree.state_dir)
    assert host.store() is None


# --- hypeman running: it would overwrite a recorded edit from memory ------------------------------


def test_recording_while_hypeman_runs_warns_to_restart_it(host, capsys):
    pid = host.tree.add_process(comm="hypeman-api", cmdline=["/opt/hypeman/bin/hypeman-api"])
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    assert host.run(capsys)["warning_texts"] == []  # findings only: the store is not touched
    check = host.run(capsys, check_mode=True, record=True)
    assert check["changed"] is True
    assert check["warning_texts"] == [
        "hypeman is running (pid %d): it keeps the store in memory and overwrites the file on its next report. "
        "Stop hypeman before this edit and start it after." % pid]
    result = host.run(capsys, record=True)
    assert result["changed"] is True and host.vf in host.records()
    assert result["warning_texts"] == [
        "hypeman is running (pid %d): restart it now (systemctl restart hypeman) so it loads this edit; "
        "its next report would otherwise overwrite the file from memory." % pid]
    again = host.run(capsys, record=True)
    assert again["changed"] is False and again["warning_texts"] == []  # no edit, nothing to lose


def test_recording_without_hypeman_does_not_warn(host, capsys):
    host.tree.add_process(comm="sleep", cmdline=["sleep", "60"])
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    result = host.run(capsys, record=True)
    assert result["changed"] is True and result["warning_texts"] == []


def test_recording_warns_when_it_cannot_tell_whether_hypeman_runs(host, capsys, monkeypatch):
    def unreadable(proc_root, names):
        raise VgpuError("cannot list processes in %s: Permission denied" % proc_root)

    monkeypatch.setattr(_proc, "find_processes", unreadable)
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    result = host.run(capsys, record=True)
    assert result["changed"] is True and host.vf in host.records()
    assert result["warning_texts"] == ["could not tell whether hypeman is running: cannot list processes in %s: "
                                       "Permission denied" % host.tree.proc_root]


# --- sentinel mode: marker era or vsock era (docs/hypeman-versions.md) ---------------------------


def test_marker_era_guest_makes_a_marker_host_with_complete_evidence(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 27 * SEC))
    result = host.run(capsys)
    assert result["sentinel_mode"] == "markers"
    assert result["instance_modes"] == [{"instance_id": "inst-a", "sentinel_mode": "markers",
                                         "sentinel_mode_reason": result["instance_modes"][0]["sentinel_mode_reason"]}]
    assert result["log_evidence"] == "complete"
    assert not any("evidence" in text for text in result["warning_texts"])


def test_vsock_era_guests_are_not_silence_and_are_never_recorded(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.noise(5) + guestlog.vsock_failed_line(CLAIMED_NS + 27 * SEC))
    result = host.run(capsys, record=True)
    assert result["findings"] == [] and result["changed"] is False
    assert result["sentinel_mode"] == "vsock"
    assert result["instance_modes"][0]["sentinel_mode"] == "vsock"
    assert result["log_evidence"] == "none"
    assert any("does not mean healthy" in text for text in result["warning_texts"])
    assert host.store() is None


def test_stated_vsock_mode_skips_recording_markers_hypeman_records_itself(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    result = host.run(capsys, record=True, sentinel_mode="vsock")
    assert result["sentinel_mode"] == "vsock" and "option" in result["sentinel_mode_reason"]
    assert result["outcomes"] == [] and result["changed"] is False
    assert result["record_skipped"].startswith("not recorded")
    assert any(text.startswith("not recorded") for text in result["warning_texts"])
    assert host.store() is None
    # The verdict stays standing: a later run in marker mode still reports it.
    again = host.run(capsys, record=True, sentinel_mode="markers")
    assert _outcomes(again) == [("inst-a", "failure", "recorded")] and again["record_skipped"] is None


def test_a_guest_without_lines_of_either_era_leaves_the_mode_unknown(host, capsys):
    app = host.boot("inst-a", CLAIMED_NS)
    guestlog.append(app, guestlog.noise(3))
    result = host.run(capsys)
    assert result["sentinel_mode"] == "unknown" and result["log_evidence"] == "none"
    assert "metrics_url" in result["sentinel_mode_reason"]
    assert any("does not mean healthy" in text for text in result["warning_texts"])


def test_mixed_guests_leave_the_host_unknown_but_keep_the_marker_guests_judged(host, capsys):
    old = host.boot("inst-old", CLAIMED_NS)
    guestlog.append(old, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    new = host.boot("inst-new", CLAIMED_NS, vf_index=1)
    guestlog.append(new, guestlog.vsock_ok_line(CLAIMED_NS + 27 * SEC))
    result = host.run(capsys)
    modes = dict((e["instance_id"], e["sentinel_mode"]) for e in result["instance_modes"])
    assert modes == {"inst-old": "markers", "inst-new": "vsock"}
    assert result["sentinel_mode"] == "unknown" and "disagree" in result["sentinel_mode_reason"]
    assert result["log_evidence"] == "partial"
    assert [f["instance_id"] for f in result["findings"]] == ["inst-old"]
