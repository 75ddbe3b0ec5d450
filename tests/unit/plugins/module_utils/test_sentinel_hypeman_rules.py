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
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sentinel, _store
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.unit.hostile import property_settings
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.sentinel_host import (
    CLAIMED_AT, CLAIMED_NS, SEC, Host, MiniHost, markers_read as _markers_read, ts as _ts, verdicts as _verdicts)


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


def _drop_assignment_time(host, instance_id):
    """Metadata of a claim without an assignment time (neither build's field)."""
    meta_path = os.path.join(host.tree.data_dir, "guests", instance_id, "metadata.json")
    with open(meta_path) as handle:
        meta = json.load(handle)
    meta.pop("GPUClaimedAt", None)
    meta.pop("GPUAssignedAt", None)
    with open(meta_path, "w") as handle:
        json.dump(meta, handle)


def test_claim_without_an_assignment_time_is_reported_with_an_empty_time(host):
    now = time.time_ns()
    app = host.instance("inst-a", vf_index=1)
    _drop_assignment_time(host, "inst-a")
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
    _drop_assignment_time(host, "inst-a")
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


# --- the 64 KiB line rule, as properties (hypeman: bufio.Reader.ReadSlice('\n') on a 64 KiB buffer) ---

READER_SIZE = 64 * 1024  # hypeman's vgpuSentinelMaxLineBytes


def hypeman_lines(data, size=READER_SIZE):
    """The lines hypeman's readSentinelLines hands to the matcher, modelled on Go's bufio.

    ReadSlice('\\n') returns a line once its "\\n" is in the buffer; a buffer
    filled without one is ErrBufferFull, and the reader skips to the next
    "\\n"; at EOF an unfinished line is left unread.
    """
    lines, pos, skipping = [], 0, False
    while True:
        newline = data.find(b"\n", pos, pos + size)
        if newline >= 0:
            line, pos = data[pos:newline + 1], newline + 1
            if skipping:
                skipping = False
            else:
                lines.append(line)
        elif len(data) - pos >= size:
            pos, skipping = pos + size, True
        else:
            return lines


def _marker_line(verdict, length):
    """A marker line (no terminator) of exactly ``length`` bytes: a FAILED nvrm or an OK ts is padded."""
    if verdict == "failed":
        head = b"2026/08/22 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-FAILED ts=2026-08-22T15:04:05Z nvrm=\"NVRM: "
        tail = b" RmInitAdapter failed!\""
        return head + b"x" * (length - len(head) - len(tail)) + tail
    head = b"2026/08/22 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=2026-08-22T15:04:05."
    return head + b"1" * (length - len(head) - 1) + b"Z"


_near_limit = st.integers(READER_SIZE - 4, READER_SIZE + 2)
_line = st.tuples(st.sampled_from(["failed", "ok"]), st.one_of(_near_limit, st.integers(120, 400)),
                  st.sampled_from([b"\n", b"\r\n", b""]))
_filler = st.one_of(st.just(b""), st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"") + b"\n"),
                    _near_limit.map(lambda n: b"y" * n + b"\n"))


def _stream(parts):
    data = b""
    for filler, (verdict, length, end) in parts:
        data += filler + _marker_line(verdict, length) + end
    return data


def _expected(data):
    return [line for line in hypeman_lines(data) if _sentinel.match_marker(line[:-1]) is not None]


@property_settings(40)
@given(st.lists(st.tuples(_filler, _line), min_size=1, max_size=4),
       st.lists(st.integers(1, 3 * READER_SIZE), min_size=1, max_size=6))
def test_reader_counts_exactly_the_lines_hypemans_64_kib_reader_matches(parts, blocks):
    data = _stream(parts)
    reader = _sentinel.MarkerReader()
    pos, index = 0, 0
    while pos < len(data):  # read boundaries anywhere, also inside the line and its CR/LF
        size = blocks[index % len(blocks)]
        index += 1
        chunk = bytearray(data[pos:pos + size])
        reader.feed(chunk, len(chunk))
        pos += size
    assert len(reader.markers) == len(_expected(data))
    assert len(reader.partial) < READER_SIZE  # never more than a line that could still count


@property_settings(12)
@given(st.lists(st.tuples(_filler, _line), min_size=1, max_size=3), st.lists(st.integers(0, 4 * READER_SIZE),
                                                                             max_size=3))
def test_scan_across_runs_counts_what_hypeman_counts(tmp_path_factory, parts, cuts):
    # The same stream written in pieces, scanned after each: cursor, carried partial line
    # and the overlong flag must give hypeman's count, whatever the cut points.
    host = MiniHost(tmp_path_factory.mktemp("rule64k"))
    app = host.instance("inst-a", claimed_at=guestlog.rfc3339nano(time.time_ns() - 3600 * SEC))
    data = _stream(parts)
    counted, last = 0, 0
    for cut in sorted(set(c for c in cuts if c < len(data))) + [len(data)]:
        with open(app, "ab") as handle:
            handle.write(data[last:cut])
        last = cut
        report = host.scan()
        counted += sum(s["markers"] for s in report.scanned)
    assert counted == len(_expected(data))


def test_model_agrees_with_hypemans_own_oversized_line_test():
    # hypeman's TestScanForSentinelDiscardsOversizedLines: 64 KiB of "x" then a marker line.
    marker = _marker_line("failed", 200) + b"\n"
    assert _expected(b"x" * READER_SIZE + marker) == []
    assert _expected(b"x" * READER_SIZE + marker + marker) == [marker]
    assert len(_expected(_marker_line("ok", READER_SIZE - 1) + b"\n")) == 1  # 65,536 bytes with its "\n"
    assert _expected(_marker_line("ok", READER_SIZE) + b"\n") == []  # 65,537
    assert _expected(_marker_line("ok", READER_SIZE - 2) + b"\r\n") != []
    assert _expected(_marker_line("ok", READER_SIZE - 1) + b"\r\n") == []
    assert _expected(_marker_line("ok", 300)) == []  # no newline yet: not a line


# --- FAILED, then OK on a later pass (hypeman reads the log every 5 s) ---


def test_an_earlier_failure_is_kept_in_the_cursor_and_checked_there(host):
    app = host.instance("inst-a", vf_index=0)
    guestlog.append(app, guestlog.report("failed", CLAIMED_NS + 30 * SEC) + guestlog.report("ok", CLAIMED_NS + 40 * SEC))
    host.scan()
    with open(host.cursor_path("inst-a")) as handle:
        state = json.load(handle)
    verdict = state["verdict"]
    assert verdict["verdict"] == "ok" and verdict["earlier_failure"] == {
        "ts": _ts(30), "nvrm": guestlog.DEFAULT_NVRM, "file": app}
    assert _sentinel.valid_state(state, "inst-a")
    older = dict(verdict)
    del older["earlier_failure"]  # a cursor of an earlier version has no such key
    assert _sentinel.valid_state(dict(state, verdict=older), "inst-a")
    for bad in (5, "x", {"ts": _ts(30), "nvrm": None, "file": app}, {"ts": _ts(30), "file": app}):
        assert not _sentinel.valid_state(dict(state, verdict=dict(verdict, earlier_failure=bad)), "inst-a")


_OLDER = _store.Failure("inst-old", "2026-08-30T09:00:00Z", "2026-08-30T09:01:00Z")


def _store_with_older_failure(vf):
    """An earlier assignment's failure on the VF: an OK whose failure was reported clears it too."""
    store = _store.HealthStore("/nonexistent/vf-health.json")
    store.records[vf] = _store.Record(vf, (_OLDER,), None)
    return store


def _records(store):
    return {vf: ([(f.instance_id, f.assigned_at) for f in record.failures], record.quarantined_at is not None)
            for vf, record in store.records.items()}


@property_settings(25)
@given(failed_gaps=st.lists(st.integers(6, 90), max_size=3), ok_gap=st.one_of(st.none(), st.integers(6, 90)),
       runs=st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=4),
       threshold=st.integers(2, 3))
def test_agent_reports_more_than_a_pass_apart_end_as_hypemans_passes_do(
        tmp_path_factory, failed_gaps, ok_gap, runs, threshold):
    # The agent prints FAILED reports (at most one per 30 s in reality) and at most one
    # OK after them (success is terminal). With every report more than one 5 s pass after
    # the one before, hypeman reports each on a pass of its own. Whatever runs (audits or
    # record runs) read the log in pieces, the store must end as hypeman's would.
    host = MiniHost(tmp_path_factory.mktemp("passes"))
    claimed_ns = time.time_ns() - 3600 * SEC
    claimed_at = guestlog.rfc3339nano(claimed_ns)
    app = host.instance("inst-a", claimed_at=claimed_at)
    vf = host.VFS[0]
    reports, at = [], claimed_ns + 10 * SEC
    for gap in failed_gaps:
        at += gap * SEC
        reports.append(("failed", at))
    if ok_gap is not None:
        reports.append(("ok", at + ok_gap * SEC))

    model = _store_with_older_failure(vf)
    for verdict, _at in reports:  # one pass each, in order
        if verdict == "failed":
            model.report_failure(vf, "inst-a", claimed_at, threshold)
        else:
            model.report_success(vf, "inst-a", claimed_at)

    store = _store_with_older_failure(vf)

    def record(report):
        findings = report.unrecorded()
        outcomes = _sentinel.record_verdicts(store, findings, threshold)
        report.mark_recorded(findings)
        return outcomes

    written = 0
    for count, recording in runs + [(len(reports), True)]:  # the last run records everything read
        for verdict, unix_ns in reports[written:written + count]:
            guestlog.append(app, guestlog.report(verdict, unix_ns))
        written = min(len(reports), written + count)
        host.scan(recorder=record if recording else None)
    assert _records(store) == _records(model)
