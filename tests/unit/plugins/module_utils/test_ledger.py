# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_ledger: append-only JSON lines, corrupt-line tolerance, ownership."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _ledger
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._gotime import parse_rfc3339
from ansible_collections.hypeman.vgpu.plugins.module_utils._store import HealthStore

VF = "0000:82:00.4"
T1 = parse_rfc3339("2026-08-20T15:00:00.123456789Z")
T2 = parse_rfc3339("2026-08-21T00:00:00Z")


def entry(action="quarantine", vf=VF, quarantined_at=T1, trigger="manual", **kwargs):
    return _ledger.make_entry(action, vf, quarantined_at, "drain", "alice", "42", "run-1", trigger=trigger,
                              now=T2, **kwargs)


def store_with(**quarantines):
    store = HealthStore("p")
    for vf, moment in quarantines.items():
        store.quarantine(vf, moment)
    return store


def test_make_entry_fields():
    assert entry(parent_gpu="0000:82:00.0") == {
        "time": "2026-08-21T00:00:00Z", "action": "quarantine", "trigger": "manual", "vf_address": VF,
        "parent_gpu": "0000:82:00.0", "quarantined_at": "2026-08-20T15:00:00.123456789Z", "reason": "drain",
        "user": "alice", "job_id": "42", "run_id": "run-1"}
    with pytest.raises(ValueError):
        _ledger.make_entry("delete", VF)
    with pytest.raises(ValueError):
        _ledger.make_entry("clear", VF, trigger="whim")


@pytest.mark.parametrize("umask", [0, 0o022, 0o077])
def test_append_creates_dir_and_file_with_modes_and_appends(tmp_path, umask):
    state_dir = str(tmp_path / "var" / "lib" / "state")
    old_umask = os.umask(umask)
    try:
        path = _ledger.append_entries(state_dir, [entry()])
    finally:
        os.umask(old_umask)
    # Missing parents too: never world-writable, whatever the umask.
    for directory in (state_dir, os.path.dirname(state_dir), str(tmp_path / "var")):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    _ledger.append_entries(state_dir, [entry("clear", quarantined_at=None), entry(vf="0000:82:00.5")])
    with open(path) as handle:
        lines = handle.read().splitlines()
    assert [json.loads(line)["action"] for line in lines] == ["quarantine", "clear", "quarantine"]
    ledger = _ledger.read_ledger(state_dir)
    assert [e["line"] for e in ledger.entries] == [1, 2, 3] and ledger.problems == []


def test_append_nothing_creates_nothing(tmp_path):
    _ledger.append_entries(str(tmp_path / "state"), [])
    assert not (tmp_path / "state").exists()


def test_corrupt_lines_are_reported_not_fatal(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    good = json.dumps(entry())
    (state_dir / "ledger.jsonl").write_text("\n".join([
        good, "{not json", "[1,2]", json.dumps({"action": "explode"}),
        json.dumps(dict(entry(), quarantined_at="yesterday")), json.dumps(dict(entry(), vf_address=5)), "",
    ]) + '\n{"action": "quarantine", "vf_addr')  # torn last line from a crash
    ledger = _ledger.read_ledger(str(state_dir))
    assert [e["line"] for e in ledger.entries] == [1]
    assert [p["line"] for p in ledger.problems] == [2, 3, 4, 5, 6, 8]
    assert ledger.problems[1]["error"] == "not a JSON object"
    assert ledger.problems[2]["error"] == "unknown action 'explode'"
    assert ledger.problems[4]["error"] == "vf_address is not a string"
    # The next append starts on its own line after the torn one.
    _ledger.append_entries(str(state_dir), [entry(vf="0000:82:00.6")])
    ledger = _ledger.read_ledger(str(state_dir))
    assert ledger.entries[-1]["vf_address"] == "0000:82:00.6" and ledger.entries[-1]["line"] == 9


def test_missing_ledger_is_empty(tmp_path):
    ledger = _ledger.read_ledger(str(tmp_path))
    assert (ledger.exists, ledger.entries, ledger.problems) == (False, [], [])


def test_unreadable_ledger_fails_closed(tmp_path):
    (tmp_path / "ledger.jsonl").mkdir()
    with pytest.raises(VgpuError) as err:
        _ledger.read_ledger(str(tmp_path))
    assert "cannot read ledger" in err.value.msg


def test_symlinked_ledger_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    os.symlink(str(target), str(tmp_path / "ledger.jsonl"))
    with pytest.raises(VgpuError) as err:
        _ledger.append_entries(str(tmp_path), [entry()])
    assert "symlink" in err.value.msg and not target.exists()


def test_symlinked_state_dir_is_refused_for_reading_and_appending(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "ledger.jsonl").write_text(json.dumps(entry()) + "\n")
    link = tmp_path / "state"
    os.symlink(str(real), str(link))
    for call in (lambda: _ledger.read_ledger(str(link)), lambda: _ledger.append_entries(str(link), [entry()])):
        with pytest.raises(VgpuError) as err:
            call()
        assert "state directory %s: it is a symlink" % link in err.value.msg
    assert len((real / "ledger.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink-to-device", "dangling-symlink"])
def test_hostile_ledger_is_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "ledger.jsonl"
    if kind == "fifo":
        os.mkfifo(str(path))
    elif kind == "dir":
        path.mkdir()
    elif kind == "symlink-to-device":
        os.symlink("/dev/zero", str(path))
    else:
        os.symlink(str(tmp_path / "nowhere"), str(path))
    with pytest.raises(VgpuError) as err:
        _ledger.read_ledger(str(tmp_path))
    assert str(path) in err.value.msg
    with pytest.raises(VgpuError) as err:
        _ledger.append_entries(str(tmp_path), [entry()])
    assert str(path) in err.value.msg
    assert not (tmp_path / "nowhere").exists()


def test_append_fsyncs(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(_ledger.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    _ledger.append_entries(str(tmp_path / "s"), [entry()])
    assert synced


# --- ownership ---------------------------------------------------------------------------------


def test_owned_when_latest_entry_is_our_manual_quarantine_with_same_time():
    assert _ledger.owned_quarantines([entry()], store_with(**{VF: T1})) == [VF]


def test_same_instant_in_another_offset_still_owned():
    offset = dict(entry(), quarantined_at="2026-08-20T17:00:00.123456789+02:00")
    assert _ledger.owned_quarantines([offset], store_with(**{VF: T1})) == [VF]


@pytest.mark.parametrize("entries, reason", [
    ([], "no ledger entry"),
    ([entry(quarantined_at=T2)], "hypeman (or someone) re-quarantined it since"),
    ([entry(), entry("clear", quarantined_at=None)], "latest entry is a clear"),
    ([entry(trigger="failure_threshold")], "a failure-threshold quarantine is evidence, not a drain"),
    ([entry(trigger="reevaluation")], "a re-evaluation quarantine is evidence, not a drain"),
    ([entry(), entry("repair", trigger="repair")], "latest entry is a repair"),
    ([entry(vf="0000:82:00.5")], "entry for another VF"),
])
def test_not_owned(entries, reason):
    assert _ledger.owned_quarantines(entries, store_with(**{VF: T1})) == [], reason


def test_unquarantined_records_are_never_owned():
    store = HealthStore("p")
    store.report_failure(VF, "i", "a", 5, T1)
    assert _ledger.owned_quarantines([entry()], store) == []


def test_owned_accepts_a_ledger_object_and_latest_wins(tmp_path):
    _ledger.append_entries(str(tmp_path), [entry(quarantined_at=T2), entry("clear", quarantined_at=None), entry()])
    ledger = _ledger.read_ledger(str(tmp_path))
    assert _ledger.owned_quarantines(ledger, store_with(**{VF: T1})) == [VF]
    assert ledger.latest_by_vf()[VF]["line"] == 3


def test_vfs_for_parent():
    entries = [entry(parent_gpu="0000:82:00.0"), entry(vf="0000:82:00.5", parent_gpu="0000:82:00.0"),
               entry(vf="0000:e3:00.4", parent_gpu="0000:e3:00.0")]
    ledger = _ledger.Ledger("p", True, entries, [])
    assert ledger.vfs_for_parent("0000:82:00.0") == ["0000:82:00.4", "0000:82:00.5"]
    assert ledger.recent(2) == entries[1:] and ledger.recent(0) == []


def test_default_user(monkeypatch):
    monkeypatch.setenv("SUDO_USER", "bob")
    monkeypatch.setenv("LOGNAME", "root")
    assert _ledger.default_user() == "bob"
    monkeypatch.delenv("SUDO_USER")
    assert _ledger.default_user() == "root"
    monkeypatch.delenv("LOGNAME")
    monkeypatch.setattr(_ledger.os, "geteuid", lambda: 0)
    assert _ledger.default_user() == "root"
