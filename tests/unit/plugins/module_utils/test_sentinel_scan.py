# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sentinel scan: attribution, verdicts, cursors, rotation, archives, faults."""

from __future__ import annotations

import fcntl
import json
import os
import time

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman, _sentinel, _sentinel_write
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.sentinel_host import (
    CLAIMED_AT, CLAIMED_NS, SEC, Host, markers_read as _markers_read, ts as _ts, verdicts as _verdicts)


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def test_failed_report_becomes_a_finding_for_the_current_assignment(host):
    app = host.instance("inst-a", vf_index=3)
    guestlog.append(app, guestlog.noise(20) + guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    report = host.scan()
    assert report.findings == [{
        "instance_id": "inst-a", "vf_address": host.card.vfs[3], "assigned_at": CLAIMED_AT, "current": True,
        "verdict": "failed", "ts": _ts(27), "nvrm": guestlog.DEFAULT_NVRM, "file": app, "recorded": False,
        "earlier_failure": None}]
    assert report.skipped == [] and report.warnings == [] and report.unattributed == []


def test_last_marker_wins_and_three_copies_are_one_report(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC)
                    + guestlog.report("failed", CLAIMED_NS + 57 * SEC)
                    + guestlog.report("ok", CLAIMED_NS + 80 * SEC))
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("ok", _ts(80))}
    assert report.findings[0]["nvrm"] is None


def test_standing_verdict_is_returned_by_every_run(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    first = host.scan()
    again = host.scan()
    assert again.findings == first.findings
    assert [s["bytes_read"] for s in again.scanned] == [0]


def test_marker_before_the_assignment_is_not_attributed(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS - 1))  # 1 ns before the claim
    report = host.scan()
    assert report.findings == []
    assert report.unattributed == [{
        "instance_id": "inst-a", "file": app, "verdict": "failed", "ts": guestlog.rfc3339nano(CLAIMED_NS - 1),
        "nvrm": guestlog.DEFAULT_NVRM,
        "reason": "marker ts is earlier than the assignment time %s" % CLAIMED_AT}]


def test_marker_at_the_assignment_instant_is_attributed(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS))
    assert _verdicts(host.scan()) == {"inst-a": ("failed", CLAIMED_AT)}


def test_marker_with_unparseable_ts_is_not_attributed(host):
    app = host.instance("inst-a")
    guestlog.append(app, "2026/08/31 12:00:30 [guest-agent] HYPEMAN-GPU-INIT-OK ts=yesterday\n")
    report = host.scan()
    assert report.findings == []
    assert [u["reason"] for u in report.unattributed] == ["marker ts is not an RFC 3339 time"]


def test_forged_and_malformed_lines_are_ignored_without_error(host):
    app = host.instance("inst-a")
    forged = "".join(guestlog.forged_lines(CLAIMED_NS + 30 * SEC).values())
    guestlog.append(app, forged)
    guestlog.append(app, b"\x00\xff\xfe\x80 HYPEMAN-GPU-INIT-FAILED \x00\x01\n" * 50)
    guestlog.append(app, b"HYPEMAN-GPU-INIT-OK " * (10 * 1024 * 1024 // 20) + b"\n")  # a 10 MB line
    report = host.scan()
    assert report.findings == [] and report.unattributed == [] and report.skipped == []
    assert _markers_read(report) == 0
    # The line after all that still counts.
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 60 * SEC))
    assert _verdicts(host.scan()) == {"inst-a": ("ok", _ts(60))}


def test_unterminated_ten_megabyte_line_is_skipped_across_runs(host):
    app = host.instance("inst-a")
    guestlog.append(app, b"x" * (10 * 1024 * 1024))  # no newline yet
    host.scan()
    state = json.load(open(host.cursor_path("inst-a")))
    assert state["log"]["overlong"] is True and state["log"]["partial"] == ""
    guestlog.append(app, b" " + guestlog.ok_line(CLAIMED_NS + 5 * SEC).encode() + b"\n")  # ends the long line
    guestlog.append(app, guestlog.ok_line(CLAIMED_NS + 6 * SEC))
    assert _verdicts(host.scan()) == {"inst-a": ("ok", _ts(6))}


def test_rescan_reads_only_new_bytes(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.noise(500))
    first = host.scan()
    size = os.path.getsize(app)
    assert first.scanned[0]["bytes_read"] == size
    mtime = os.stat(host.cursor_path("inst-a")).st_mtime_ns
    second = host.scan()
    assert second.scanned[0]["bytes_read"] == 0
    assert os.stat(host.cursor_path("inst-a")).st_mtime_ns == mtime  # nothing new: cursor not rewritten
    guestlog.append(app, "one more line\n")
    assert host.scan().scanned[0]["bytes_read"] == len("one more line\n")


def test_marker_split_across_two_reads_is_matched_once(host):
    app = host.instance("inst-a")
    line = guestlog.failed_line(CLAIMED_NS + 27 * SEC)
    guestlog.append(app, guestlog.noise(10) + line[:40])
    first = host.scan()
    assert first.findings == [] and _markers_read(first) == 0
    guestlog.append(app, line[40:])
    second = host.scan()
    assert _markers_read(second) == 1
    assert _verdicts(second) == {"inst-a": ("failed", _ts(27))}
    assert _markers_read(host.scan()) == 0


def test_copytruncate_marker_just_before_rotation_is_seen_once(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.noise(100))
    host.scan()
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))  # lands in app.log.1
    guestlog.copytruncate(app)
    guestlog.append(app, guestlog.noise(3))
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert report.findings[0]["file"] == app + ".1"
    assert _markers_read(report) == 3  # the three copies, read once each
    assert report.warnings == []
    again = host.scan()
    assert _markers_read(again) == 0 and _verdicts(again) == _verdicts(report)


def test_copytruncate_with_log_regrown_past_the_cursor_is_detected(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.noise(20))
    host.scan()
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    guestlog.copytruncate(app)
    guestlog.append(app, guestlog.noise(400, seed=9))  # bigger than the old offset
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert _markers_read(report) == 3


def test_marker_cut_by_the_rotation_is_joined_and_matched_once(host):
    app = host.instance("inst-a")
    line = guestlog.ok_line(CLAIMED_NS + 40 * SEC)
    guestlog.append(app, guestlog.noise(10) + line[:25])
    host.scan()  # the partial line is left for later
    guestlog.append(app, line[25:50])
    guestlog.copytruncate(app)  # the line is cut: its head is in app.log.1 ...
    guestlog.append(app, line[50:] + guestlog.noise(2))  # ... and its tail in the new app.log
    report = host.scan()
    assert _markers_read(report) == 1
    assert _verdicts(report) == {"inst-a": ("ok", _ts(40))}


def test_marker_cut_by_the_rotation_is_joined_without_a_cursor_too(host):
    # Losing the cursors must cost only a re-read: the fresh start once missed this marker.
    app = host.instance("inst-a")
    line = guestlog.ok_line(CLAIMED_NS + 40 * SEC)
    guestlog.append(app, guestlog.noise(10) + line[:50])
    guestlog.copytruncate(app)
    guestlog.append(app, line[50:] + guestlog.noise(2))
    report = host.scan()  # no cursor yet: app.log.1 then app.log, one stream
    assert _markers_read(report) == 1
    assert _verdicts(report) == {"inst-a": ("ok", _ts(40))}


def test_two_rotations_between_runs_warn_and_still_read_the_newest_copy(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.noise(10))
    host.scan()
    guestlog.append(app, guestlog.noise(10, seed=1))
    guestlog.copytruncate(app)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    guestlog.copytruncate(app)
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert len(report.warnings) == 1 and "rotated more than once" in report.warnings[0]


def test_fresh_start_reads_a_rotated_copy_of_this_boot(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    guestlog.copytruncate(app)
    guestlog.append(app, guestlog.noise(5))
    report = host.scan()  # no cursor yet: app.log.1 then app.log
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert [os.path.basename(s["file"]) for s in report.scanned] == ["app.log.1", "app.log"]


def test_new_boot_starts_fresh_and_archives_are_history_only(host):
    app = host.instance("inst-a", claimed_at=_ts(0))
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    assert _verdicts(host.scan()) == {"inst-a": ("failed", _ts(27))}
    # hypeman restarts the instance: app.log is archived, a new claim is made.
    archive = guestlog.archive_previous_boot(app, CLAIMED_NS + 3600 * SEC)
    host.instance("inst-a", claimed_at=_ts(3600))
    guestlog.append(app, guestlog.noise(5))
    report = host.scan()
    assert report.findings == []
    assert report.history == [{"instance_id": "inst-a", "file": archive, "verdict": "failed", "ts": _ts(27),
                               "nvrm": guestlog.DEFAULT_NVRM, "markers": 1}]
    again = host.scan()
    assert again.history == report.history
    assert all(not s["file"].startswith(archive) for s in again.scanned)  # each archive is read once


def _set_mtime(path, unix_ns):
    os.utime(path, ns=(unix_ns, unix_ns))


@pytest.mark.parametrize("cursor_before_rotation", [False, True])
def test_previous_boot_rotated_log_with_guest_clock_ahead_is_not_replayed(host, cursor_before_rotation):
    # Issue 12: after a restart, boot 1's app.log.1 (rotated before the restart) still
    # sits beside the new app.log. Its guest ran ahead of the host, so its markers'
    # ts are later than the new claim: only host facts can tell they are old.
    now = time.time_ns()
    first_claim, second_claim = now - 3 * 3600 * SEC, now - 3600 * SEC
    app = host.instance("inst-a", vf_index=0, claimed_at=guestlog.rfc3339nano(first_claim))
    guestlog.append(app, guestlog.noise(20))
    if cursor_before_rotation:
        assert host.scan().findings == []  # the cursor knows no app.log.1 yet
    ahead = second_claim + 1800 * SEC  # the guest clock, 2.5 h ahead of the host
    guestlog.append(app, guestlog.report("failed", ahead))
    guestlog.copytruncate(app)
    _set_mtime(app + ".1", first_claim + 1800 * SEC)  # hypeman rotated it during boot 1
    guestlog.append(app, guestlog.noise(3, seed=1))
    archive = guestlog.archive_previous_boot(app, second_claim - SEC)  # hypeman starts boot 2
    host.instance("inst-a", vf_index=1, claimed_at=guestlog.rfc3339nano(second_claim))
    guestlog.append(app, guestlog.noise(5, seed=2))

    report = host.scan()
    assert report.findings == []
    assert report.skipped == [] and report.warnings == []
    # hypeman reads app.log.1 only to finish a stream it followed: boot 1's copy is not read at all.
    assert report.unattributed == []
    assert app + ".1" not in [s["file"] for s in report.scanned]
    assert report.history == []  # boot 1 archive: its markers were rotated into app.log.1
    assert os.path.exists(archive)
    again = host.scan()
    assert again.findings == [] and again.unattributed == [] and _markers_read(again) == 0

    # A rotation during boot 2 is this assignment's evidence and still counts.
    guestlog.append(app, guestlog.report("failed", ahead + 60 * SEC))
    guestlog.copytruncate(app)
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("failed", guestlog.rfc3339nano(ahead + 60 * SEC))}
    assert report.findings[0]["file"] == app + ".1"


def test_rotated_log_older_than_the_current_boot_is_not_attributed(host):
    # The claim time alone is not enough when a claim predates the boot: the newest
    # app.log.prev.<ns> (host clock) marks when the current app.log began.
    now = time.time_ns()
    claim = now - 3 * 3600 * SEC
    app = host.instance("inst-a", claimed_at=guestlog.rfc3339nano(claim))
    guestlog.append(app, guestlog.report("failed", claim + 60 * SEC))
    guestlog.copytruncate(app)
    _set_mtime(app + ".1", claim + 120 * SEC)
    boot = now - 3600 * SEC
    guestlog.archive_previous_boot(app, boot)
    guestlog.append(app, guestlog.noise(3))
    report = host.scan()
    assert report.findings == [] and report.unattributed == []
    assert app + ".1" not in [s["file"] for s in report.scanned]  # not this boot's stream: not read


def test_log_last_written_before_the_assignment_is_not_attributed(host):
    now = time.time_ns()
    claim = now - 3600 * SEC
    app = host.instance("inst-a", claimed_at=guestlog.rfc3339nano(claim))
    guestlog.append(app, guestlog.report("failed", claim + 600 * SEC))  # guest clock ahead
    _set_mtime(app, claim - 60 * SEC)  # the host says: written before the claim
    report = host.scan()
    assert report.findings == []
    assert [u["ts"] for u in report.unattributed] == [guestlog.rfc3339nano(claim + 600 * SEC)]


def test_reassigned_instance_keeps_earlier_bytes_with_the_earlier_assignment(host):
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    assert _verdicts(host.scan()) == {"inst-a": ("failed", _ts(27))}
    host.reassign("inst-a", vf_index=1, claimed_at=_ts(100))  # same log file, new assignment
    report = host.scan()
    assert report.findings == []
    assert report.unattributed == [] and _markers_read(report) == 0  # read under the old one
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 130 * SEC))
    report = host.scan()
    assert report.findings[0]["vf_address"] == host.card.vfs[1]
    assert _verdicts(report) == {"inst-a": ("ok", _ts(130))}


def test_reassignment_skips_the_rest_of_a_line_begun_before_it(host):
    app = host.instance("inst-a", vf_index=0)
    line = guestlog.failed_line(CLAIMED_NS + 200 * SEC)
    guestlog.append(app, guestlog.noise(3) + line[:30])
    host.scan()
    host.reassign("inst-a", vf_index=1, claimed_at=_ts(100))
    guestlog.append(app, line[30:] + guestlog.ok_line(CLAIMED_NS + 150 * SEC))
    report = host.scan()
    assert _markers_read(report) == 1
    assert _verdicts(report) == {"inst-a": ("ok", _ts(150))}


def test_reassigned_instance_without_a_cursor_falls_back_on_the_guest_ts(host):
    # No host fact separates the two assignments' bytes in one file when no cursor
    # saw the first one: the ts then still keeps the older marker out.
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    host.reassign("inst-a", vf_index=1, claimed_at=_ts(100))
    report = host.scan()
    assert report.findings == []
    assert [u["ts"] for u in report.unattributed] == [_ts(27)]
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 130 * SEC))
    report = host.scan()
    assert report.findings[0]["vf_address"] == host.card.vfs[1]
    assert _verdicts(report) == {"inst-a": ("ok", _ts(130))}


def test_copies_split_across_runs_keep_the_recorded_flag(host):
    app = host.instance("inst-a")
    text = guestlog.report("failed", CLAIMED_NS + 27 * SEC)
    guestlog.append(app, text[:len(text) // 3])

    def record_all(report):
        report.mark_recorded(report.unrecorded())

    assert host.scan(recorder=record_all).findings[0]["recorded"] is True
    guestlog.append(app, text[len(text) // 3:])
    report = host.scan()
    assert _markers_read(report) == 2
    assert report.findings[0]["recorded"] is True and report.unrecorded() == []


def test_a_findings_only_run_never_consumes_evidence(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    audit = host.scan()
    assert audit.unrecorded() == audit.findings != []
    later = host.scan()  # the bytes were read by the audit; the verdict still waits
    assert later.unrecorded() == audit.findings


@pytest.mark.parametrize("content", [
    b"", b"{not json", b"[]", b"\xff\xfe", b'{"version": 2}',
    b'{"version": 1, "instance_id": "other", "assignment": {}, "log": null, "archives": {}}',
])
def test_corrupt_cursor_is_rebuilt_with_a_warning(host, content):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    host.scan()
    with open(host.cursor_path("inst-a"), "wb") as handle:
        handle.write(content)
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert len(report.warnings) == 1 and "rebuilding it from scratch" in report.warnings[0]
    assert _sentinel.valid_state(json.load(open(host.cursor_path("inst-a"))), "inst-a")
    assert host.scan().warnings == []


def test_corrupt_cursor_field_types_are_rebuilt(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.noise(3))
    host.scan()
    state = json.load(open(host.cursor_path("inst-a")))
    state["log"]["offset"] = "12"
    json.dump(state, open(host.cursor_path("inst-a"), "w"))
    report = host.scan()
    assert len(report.warnings) == 1
    assert report.scanned[0]["bytes_read"] == os.path.getsize(app)


def test_check_mode_reads_and_reports_but_writes_nothing(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    report = host.scan(check_mode=True)
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert not os.path.exists(host.state_dir)
    host.scan()
    before = open(host.cursor_path("inst-a"), "rb").read()
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 60 * SEC))
    assert _verdicts(host.scan(check_mode=True)) == {"inst-a": ("ok", _ts(60))}
    assert open(host.cursor_path("inst-a"), "rb").read() == before


def test_instances_without_a_vendor_vfio_claim_are_skipped_with_a_reason(host):
    host.tree.add_instance("no-gpu", liveness="stopped")
    host.tree.add_instance("stub", vf=host.card.vfs[2], profile="NVIDIA L40S-2Q", build="assigned",
                           retained_for_cleanup=True)
    host.instance("good", vf_index=4, build="assigned")
    report = host.scan()
    assert {s["instance_id"]: s["reason"] for s in report.skipped} == {
        "no-gpu": "no vendor-VFIO vGPU claim",
        "stub": "retention stub (GPURetainedForCleanup): hypeman's sentinel skips it"}
    assert [s["instance_id"] for s in report.scanned] == ["good"]


@pytest.mark.parametrize("how", ["eisdir", "eloop"])
def test_unreadable_log_is_reported_and_the_others_are_scanned(host, how):
    host.instance("bad", vf_index=0)
    good = host.instance("good", vf_index=1)
    guestlog.append(good, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    host.tree.break_path(host.app("bad"), how)
    report = host.scan()
    assert [s["instance_id"] for s in report.skipped] == ["bad"]
    assert host.app("bad") in report.skipped[0]["reason"]
    assert _verdicts(report) == {"good": ("failed", _ts(27))}


def test_fifo_log_does_not_block_the_scan(host):
    host.instance("bad", vf_index=0)
    os.unlink(host.app("bad"))
    os.mkfifo(host.app("bad"))
    report = host.scan()
    assert report.skipped == [{"instance_id": "bad",
                               "reason": "cannot read %s: it is a FIFO, not a regular file" % host.app("bad")}]


def test_unreadable_metadata_is_reported_and_the_others_are_scanned(host):
    host.instance("bad", vf_index=0)
    good = host.instance("good", vf_index=1)
    guestlog.append(good, guestlog.report("ok", CLAIMED_NS + 27 * SEC))
    host.tree.break_path(os.path.join(host.tree.data_dir, "guests", "bad", "metadata.json"), "garbage")
    report = host.scan()
    assert [s["instance_id"] for s in report.skipped] == ["bad"]
    assert report.skipped[0]["reason"].startswith("metadata unreadable: ")
    assert _verdicts(report) == {"good": ("ok", _ts(27))}


def test_instance_filter_scans_only_those_and_names_unknown_ones(host):
    host.instance("inst-a", vf_index=0)
    host.instance("inst-b", vf_index=1)
    report = host.scan(only=["inst-b", "ghost"])
    assert [s["instance_id"] for s in report.scanned] == ["inst-b"]
    assert report.skipped == [{"instance_id": "ghost", "reason": "no such instance"}]


def test_cursors_of_vanished_instances_are_pruned_only_on_a_full_scan(host):
    host.instance("inst-a", vf_index=0)
    host.instance("inst-b", vf_index=1)
    host.scan()
    import shutil
    shutil.rmtree(os.path.join(host.tree.data_dir, "guests", "inst-a"))
    host.scan(only=["inst-b"])
    assert os.path.exists(host.cursor_path("inst-a"))
    host.scan()
    assert not os.path.exists(host.cursor_path("inst-a"))
    assert os.path.exists(host.cursor_path("inst-b"))


def test_runs_are_serialised_by_the_state_lock(host):
    host.instance("inst-a")
    held = []

    def probe(report):
        fd = os.open(os.path.join(host.state_dir, "sentinel", ".lock"), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(True)
        finally:
            os.close(fd)

    host.scan(recorder=probe)
    assert held == [True]


def test_cursor_is_not_written_when_the_recorder_fails(host):
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))

    def failing(report):
        raise RuntimeError("store write failed")

    with pytest.raises(RuntimeError):
        host.scan(recorder=failing)
    assert not os.path.exists(host.cursor_path("inst-a"))
    assert host.scan().findings[0]["recorded"] is False


def test_rotation_is_detected_by_a_new_rotated_copy_even_when_bytes_look_the_same(host):
    # A repetitive console: after the rotation app.log regrows to the very bytes
    # the cursor saw, so only the new app.log.1 tells that a rotation happened.
    app = host.instance("inst-a")
    guestlog.append(app, "tick\n" * 2000)
    host.scan()
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    guestlog.copytruncate(app)
    guestlog.append(app, "tick\n" * 2100)
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert report.warnings == []


def test_log_rewritten_in_place_past_the_cursor_is_read_from_the_start(host):
    # No rotated copy, no shrink visible: only the bytes before the cursor changed.
    app = host.instance("inst-a")
    guestlog.append(app, guestlog.noise(50))
    host.scan()
    with open(app, "r+b") as handle:
        handle.truncate(0)
    guestlog.append(app, guestlog.report("ok", CLAIMED_NS + 30 * SEC) + guestlog.noise(200, seed=5))
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("ok", _ts(30))}
    assert len(report.warnings) == 1 and "truncated" in report.warnings[0]


def test_assignment_changed_during_the_scan_is_not_attributed(host, monkeypatch):
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    real_current = _sentinel._InstanceScan.current

    def racing_current(self, same_assignment, sink):
        result = real_current(self, same_assignment, sink)
        host.reassign("inst-a", vf_index=1, claimed_at=_ts(10))  # hypeman moved it meanwhile
        return result

    monkeypatch.setattr(_sentinel._InstanceScan, "current", racing_current)
    report = host.scan()
    assert report.findings == []
    assert report.skipped == [{"instance_id": "inst-a",
                               "reason": "vGPU assignment changed during the scan; scan again"}]
    assert not os.path.exists(host.cursor_path("inst-a"))
    monkeypatch.undo()
    report = host.scan()  # the new assignment is read fresh; the marker is after its claim
    assert report.findings[0]["vf_address"] == host.card.vfs[1]
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}


def test_metadata_id_must_match_its_directory(host):
    host.instance("inst-a")
    path = os.path.join(host.tree.data_dir, "guests", "inst-a", "metadata.json")
    meta = json.load(open(path))
    meta["Id"] = "inst-z"
    json.dump(meta, open(path, "w"))
    report = host.scan()
    assert [s["instance_id"] for s in report.skipped] == ["inst-z"]
    assert report.skipped[0]["reason"].startswith("metadata Id does not match its directory")


def test_temp_files_of_a_killed_run_are_removed(host):
    host.instance("inst-a")
    host.scan()
    leftover = os.path.join(host.state_dir, "sentinel", ".inst-a.abc123.tmp")
    with open(leftover, "w") as handle:
        handle.write("{")
    host.scan()
    assert not os.path.exists(leftover)
    assert os.path.exists(host.cursor_path("inst-a"))


# --- symlink policy: only real directories and files inside <data_dir>/guests/<id>/ --------


def _refused(report, instance_id):
    reasons = [s["reason"] for s in report.skipped if s["instance_id"] == instance_id]
    warned = [w for w in report.warnings if ("instance %s:" % instance_id) in w]
    return reasons, warned


def test_logs_dir_symlinked_to_another_instance_is_refused(host):
    # Issue 12: inst-b's logs/ pointed at inst-a's, so inst-a's marker counted against inst-b's VF.
    app_a = host.instance("inst-a", vf_index=0)
    host.instance("inst-b", vf_index=1)
    guestlog.append(app_a, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    logs_b = host.logs("inst-b")
    host.tree.break_path(logs_b, "missing")
    os.symlink(host.logs("inst-a"), logs_b)
    report = host.scan()
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}
    assert [f["vf_address"] for f in report.findings] == [host.card.vfs[0]]
    reasons, warned = _refused(report, "inst-b")
    assert reasons == ["refused %s: it is a symlink; the sentinel reads only real directories inside "
                       "the instance directory" % logs_b]
    assert len(warned) == 1 and reasons[0] in warned[0]
    assert not os.path.exists(host.cursor_path("inst-b"))


def test_instance_dir_swapped_for_a_symlink_after_listing_is_refused(host):
    app_a = host.instance("inst-a", vf_index=0)
    host.instance("inst-b", vf_index=1)
    guestlog.append(app_a, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    instances, unreadable = _hypeman.list_instances(host.tree.data_dir)
    guest_b = os.path.dirname(host.logs("inst-b"))
    os.rename(guest_b, guest_b + ".old")
    os.symlink(os.path.dirname(host.logs("inst-a")), guest_b)
    report = _sentinel_write.run(instances, unreadable, host.logs, host.state_dir)[0]
    reasons, warned = _refused(report, "inst-b")
    assert reasons == ["refused %s: it is a symlink; the sentinel reads only real directories inside "
                       "the instance directory" % guest_b]
    assert warned and _verdicts(report) == {"inst-a": ("failed", _ts(27))}


@pytest.mark.parametrize("name", ["app.log", "app.log.1", "app.log.prev.1788177000000000000"])
def test_symlinked_log_file_is_refused_for_that_instance(host, name):
    app_a = host.instance("inst-a", vf_index=0)
    host.instance("inst-b", vf_index=1)
    guestlog.append(app_a, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    link = os.path.join(host.logs("inst-b"), name)
    if os.path.exists(link):
        os.unlink(link)
    os.symlink(app_a, link)
    report = host.scan()
    reasons, warned = _refused(report, "inst-b")
    assert reasons == ["refused %s: it is a symlink; the sentinel reads only regular files inside the "
                       "instance's logs directory" % link]
    assert warned
    assert _verdicts(report) == {"inst-a": ("failed", _ts(27))}


def test_dangling_symlinked_log_is_refused(host):
    host.instance("inst-a")
    os.unlink(host.app("inst-a"))
    os.symlink("/nonexistent/app.log", host.app("inst-a"))
    reasons, warned = _refused(host.scan(), "inst-a")
    assert reasons and "it is a symlink" in reasons[0] and warned


def test_hard_linked_log_is_refused(host):
    app_a = host.instance("inst-a", vf_index=0)
    host.instance("inst-b", vf_index=1)
    guestlog.append(app_a, guestlog.report("failed", CLAIMED_NS + 27 * SEC))
    os.unlink(host.app("inst-b"))
    os.link(app_a, host.app("inst-b"))
    report = host.scan()
    for instance_id in ("inst-a", "inst-b"):  # neither copy can tell whose it is
        reasons, warned = _refused(report, instance_id)
        assert reasons == ["refused %s: it has 2 hard links; a log shared with another file is not this "
                           "instance's own" % host.app(instance_id)]
        assert warned
    assert report.findings == []
