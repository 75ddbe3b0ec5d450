# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_ledger: append-only JSON lines, corrupt-line tolerance, ownership."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _ledger, _ledger_write
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._gotime import parse_rfc3339
from ansible_collections.hypeman.vgpu.plugins.module_utils._store import HealthStore

VF = "0000:82:00.4"
T1 = parse_rfc3339("2026-08-20T15:00:00.123456789Z")
T2 = parse_rfc3339("2026-08-21T00:00:00Z")


def entry(action="quarantine", vf=VF, quarantined_at=T1, trigger="manual", **kwargs):
    return _ledger_write.make_entry(action, vf, quarantined_at, "drain", "alice", "42", "run-1", trigger=trigger,
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
        _ledger_write.make_entry("delete", VF)
    with pytest.raises(ValueError):
        _ledger_write.make_entry("clear", VF, trigger="whim")


@pytest.mark.parametrize("umask", [0, 0o022, 0o077])
def test_append_creates_dir_and_file_with_modes_and_appends(tmp_path, umask):
    state_dir = str(tmp_path / "var" / "lib" / "state")
    old_umask = os.umask(umask)
    try:
        path = _ledger_write.append_entries(state_dir, [entry()])
    finally:
        os.umask(old_umask)
    # Missing parents too: never world-writable, whatever the umask.
    for directory in (state_dir, os.path.dirname(state_dir), str(tmp_path / "var")):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    _ledger_write.append_entries(state_dir, [entry("clear", quarantined_at=None), entry(vf="0000:82:00.5")])
    with open(path) as handle:
        lines = handle.read().splitlines()
    assert [json.loads(line)["action"] for line in lines] == ["quarantine", "clear", "quarantine"]
    ledger = _ledger.read_ledger(state_dir)
    assert [e["line"] for e in ledger.entries] == [1, 2, 3] and ledger.problems == []


def test_append_nothing_creates_nothing(tmp_path):
    _ledger_write.append_entries(str(tmp_path / "state"), [])
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
    assert ledger.problems[-1]["error"].startswith("torn last line (an interrupted append")
    # The next append cuts the torn line off and starts where it began.
    _ledger_write.append_entries(str(state_dir), [entry(vf="0000:82:00.6")])
    ledger = _ledger.read_ledger(str(state_dir))
    assert ledger.entries[-1]["vf_address"] == "0000:82:00.6" and ledger.entries[-1]["line"] == 8
    assert [p["line"] for p in ledger.problems] == [2, 3, 4, 5, 6]
    assert (state_dir / "ledger.jsonl").read_text().endswith("}\n") and "vf_addr\"" not in (
        state_dir / "ledger.jsonl").read_text().splitlines()[-2]


@pytest.mark.parametrize("field", ["reason", "run_id", "time"])
def test_a_lone_surrogate_escape_is_a_problem_line_and_a_pair_is_text(field):
    # Python's json keeps "\udc80"; the task's result could not carry it, and the task failed after its writes.
    lone = json.dumps(entry()).replace('"%s": "' % field, '"%s": "\\udc80' % field, 1)
    pair = json.dumps(dict(entry(), reason="\U0001f600"))  # written as the escaped pair \ud83d\ude00
    assert "\\udc80" in lone and "\\ud83d\\ude00" in pair
    ledger = _ledger.parse_ledger("p", (lone + "\n" + pair + "\n").encode())
    assert [e["line"] for e in ledger.entries] == [2] and ledger.entries[0]["reason"] == "\U0001f600"
    assert ledger.problems == [{"line": 1, "error": 'a lone surrogate escape ("\\udc80"); expected UTF-8 text'}]
    json.dumps(ledger.problems, ensure_ascii=False).encode("utf-8")


def test_whole_but_unterminated_last_line_is_kept(tmp_path):
    (tmp_path / "ledger.jsonl").write_text(json.dumps(entry()))
    _ledger_write.append_entries(str(tmp_path), [entry(vf="0000:82:00.6")])
    ledger = _ledger.read_ledger(str(tmp_path))
    assert [e["vf_address"] for e in ledger.entries] == [VF, "0000:82:00.6"] and ledger.problems == []


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
        _ledger_write.append_entries(str(tmp_path), [entry()])
    assert "symlink" in err.value.msg and not target.exists()


def test_symlinked_state_dir_is_refused_for_reading_and_appending(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "ledger.jsonl").write_text(json.dumps(entry()) + "\n")
    link = tmp_path / "state"
    os.symlink(str(real), str(link))
    for call in (lambda: _ledger.read_ledger(str(link)), lambda: _ledger_write.append_entries(str(link), [entry()])):
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
        _ledger_write.append_entries(str(tmp_path), [entry()])
    assert str(path) in err.value.msg
    assert not (tmp_path / "nowhere").exists()


def test_append_fsyncs(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(_ledger_write.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    _ledger_write.append_entries(str(tmp_path / "s"), [entry()])
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
    _ledger_write.append_entries(str(tmp_path), [entry(quarantined_at=T2), entry("clear", quarantined_at=None), entry()])
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
    assert _ledger_write.default_user() == "bob"
    monkeypatch.delenv("SUDO_USER")
    assert _ledger_write.default_user() == "root"
    monkeypatch.delenv("LOGNAME")
    monkeypatch.setattr(_ledger_write.os, "geteuid", lambda: 0)
    assert _ledger_write.default_user() == "root"


# --- write-ahead intents -----------------------------------------------------------------------

STORE_BEFORE = b'{"version":1,"records":[]}'


def store_bytes(**quarantines):
    return store_with(**quarantines).to_bytes()


def parsed(data):
    from ansible_collections.hypeman.vgpu.plugins.module_utils._store import parse_store_bytes
    return parse_store_bytes("/x/gpu/vf-health.json", data)


def intent_for(run_id="run-1", entries=None, after=None, expect=None):
    entries = [entry()] if entries is None else entries
    after = store_bytes(**{VF: T1}) if after is None else after
    return _ledger_write.make_intent(run_id, entries, _ledger.store_digest(parsed(STORE_BEFORE)),
                                     hashlib.sha256(after).hexdigest(), expect or {VF: T1}, now=T2)


def write_lines(state_dir, *lines):
    os.makedirs(str(state_dir), exist_ok=True)
    with open(os.path.join(str(state_dir), "ledger.jsonl"), "a") as handle:
        for line in lines:
            handle.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


def test_intent_status_from_what_follows_it(tmp_path):
    write_lines(tmp_path, intent_for("a"), intent_for("b"), entry(), intent_for("c"),
                {"action": "abort", "run_id": "c", "time": "2026-08-21T00:00:00Z"})
    ledger = _ledger.read_ledger(str(tmp_path))
    # entry() has run_id "run-1", not a/b/c: all three intents are unsettled or aborted.
    assert [(i.run_id, i.status, i.line) for i in ledger.intents] == [
        ("a", "pending", 1), ("b", "pending", 2), ("c", "aborted", 4)]
    assert [i.run_id for i in ledger.pending()] == ["a", "b"]
    assert [e["line"] for e in ledger.entries] == [3] and ledger.problems == []
    write_lines(tmp_path, dict(entry(), run_id="a"))
    ledger = _ledger.read_ledger(str(tmp_path))
    assert [i.status for i in ledger.intents] == ["committed", "pending", "aborted"]


@pytest.mark.parametrize("store_content, outcome", [
    (store_bytes(**{VF: T1}), "commit"),                          # exactly what the run wrote
    (STORE_BEFORE, "abort"),                                      # exactly what it read
    (store_bytes(**{VF: T1, "0000:82:00.5": T2}), "commit"),      # changed since, our quarantine still there
    (store_bytes(**{VF: T2}), "abort"),                           # changed since, someone else's quarantine
    (b"not json", "abort"),
])
def test_intent_decided_against_the_store(store_content, outcome):
    ledger = _ledger.parse_ledger("p", (json.dumps(intent_for()) + "\n").encode())
    assert ledger.pending()[0].decide(parsed(store_content)) == outcome


def test_a_clear_is_committed_only_while_its_record_is_gone():
    # A clear expects "no quarantined_at", which a record still there without a quarantine also
    # has: a killed clear used to be committed to the ledger though its record was never removed.
    clear = dict(entry(action="clear", quarantined_at=None))
    intent = _ledger_write.make_intent("r", [clear], _ledger.store_digest(parsed(STORE_BEFORE)),
                                       hashlib.sha256(b"{}").hexdigest(), {VF: None}, now=T2, absent=[VF])
    assert intent["absent"] == [VF]
    unquarantined = HealthStore("p")
    unquarantined.report_failure(VF, "i-1", "2026-08-20T00:00:00Z", 3, now=T1)
    unquarantined.quarantine("0000:82:00.5", T2)  # and someone else changed the store since
    gone = store_with(**{"0000:82:00.5": T2})
    pending = _ledger.parse_ledger("p", (json.dumps(intent) + "\n").encode()).pending()[0]
    assert pending.decide(parsed(unquarantined.to_bytes())) == "abort"
    assert pending.decide(parsed(gone.to_bytes())) == "commit"
    # An intent written before "absent" existed is decided as before.
    del intent["absent"]
    pending = _ledger.parse_ledger("p", (json.dumps(intent) + "\n").encode()).pending()[0]
    assert pending.decide(parsed(gone.to_bytes())) == "commit"


def test_intent_with_some_entries_found_is_committed_whatever_the_store(tmp_path):
    entries = [entry(), entry(vf="0000:82:00.5")]
    write_lines(tmp_path, intent_for("r", entries=[dict(e, run_id="r") for e in entries]),
                dict(entries[0], run_id="r"))
    ledger = _ledger.read_ledger(str(tmp_path))
    intent = ledger.pending()[0]
    assert intent.found == 1 and intent.decide(parsed(STORE_BEFORE)) == "commit"
    assert [e["vf_address"] for e in intent.missing_entries()] == ["0000:82:00.5"]


def test_pending_intent_counts_for_ownership_as_settling_would_decide(tmp_path):
    write_lines(tmp_path, dict(intent_for("r", entries=[dict(entry(), run_id="r")])))
    ledger = _ledger.read_ledger(str(tmp_path))
    assert ledger.entries == [] and ledger.latest_by_vf() == {}
    assert _ledger.owned_quarantines(ledger, parsed(store_bytes(**{VF: T1}))) == [VF]
    assert _ledger.owned_quarantines(ledger, parsed(STORE_BEFORE)) == []


def test_settle_appends_missing_entries_or_an_abort_once(tmp_path):
    write_lines(tmp_path, intent_for("r1", entries=[dict(entry(), run_id="r1")]),
                intent_for("r2", entries=[dict(entry(vf="0000:82:00.5", quarantined_at=T2), run_id="r2")],
                           after=store_bytes(**{"0000:82:00.5": T2}), expect={"0000:82:00.5": T2}))
    store = parsed(store_bytes(**{VF: T1}))  # r1's change is there; r2's expectations are not met
    ledger = _ledger.read_ledger(str(tmp_path))
    preview = _ledger_write.settle(ledger, str(tmp_path), store, "settler", check_mode=True)
    assert [(s["run_id"], s["outcome"]) for s in preview] == [("r1", "commit"), ("r2", "abort")]
    assert _ledger.read_ledger(str(tmp_path)).pending() != []  # check mode wrote nothing
    settled = _ledger_write.settle(_ledger.read_ledger(str(tmp_path)), str(tmp_path), store, "settler")
    assert settled == preview
    ledger = _ledger.read_ledger(str(tmp_path))
    assert ledger.pending() == [] and [i.status for i in ledger.intents] == ["committed", "aborted"]
    assert [(e["run_id"], e["settled_by"]) for e in ledger.entries] == [("r1", "settler")]
    assert _ledger.owned_quarantines(ledger, store) == [VF]
    assert _ledger_write.settle(ledger, str(tmp_path), store, "again") == []


@pytest.mark.parametrize("line, error", [
    ({"action": "intent", "run_id": "", "entries": [], "expect": {}}, "intent without a run_id"),
    ({"action": "intent", "run_id": "r", "entries": "x", "expect": {}}, "intent without entries or expect"),
    ({"action": "intent", "run_id": "r", "entries": [{"action": "boom"}], "expect": {}},
     "intent entry: unknown action 'boom'"),
    ({"action": "intent", "run_id": "r", "entries": [], "expect": {VF: "soon"}}, "intent expect 0000:82:00.4"),
    ({"action": "intent", "run_id": "r", "entries": [], "expect": {}, "absent": [5]},
     "intent absent is not a list of VF addresses"),
    ({"action": "abort", "run_id": "nobody"}, "abort of run nobody, which has no intent before it"),
    ({"action": "quarantine", "run_id": ["not", "hashable"]}, "run_id is not a string"),
    ("[" * 100000 + "]" * 100000, "not JSON"),
])
def test_bad_intent_lines_are_problems_not_crashes(tmp_path, line, error):
    write_lines(tmp_path, line, entry())
    ledger = _ledger.read_ledger(str(tmp_path))
    assert ledger.problems[0]["line"] == 1 and error in ledger.problems[0]["error"]
    assert [e["line"] for e in ledger.entries] == [2]


def test_second_intent_of_a_run_is_a_problem(tmp_path):
    write_lines(tmp_path, intent_for("r"), intent_for("r"))
    ledger = _ledger.read_ledger(str(tmp_path))
    assert len(ledger.intents) == 1 and ledger.problems == [{"line": 2, "error": "second intent of run r"}]


def test_old_ledger_without_intents_reads_as_before(tmp_path):
    old = [entry(), entry("clear", quarantined_at=None), entry(vf="0000:82:00.5")]
    write_lines(tmp_path, *old)
    ledger = _ledger.read_ledger(str(tmp_path))
    assert [dict((k, v) for k, v in e.items() if k != "line") for e in ledger.entries] == old
    assert ledger.intents == [] and ledger.problems == []
    assert ledger.latest_by_vf(parsed(STORE_BEFORE)) == ledger.latest_by_vf()


# --- property: any ledger content, torn anywhere, never breaks reading or appending ------------


LINES = st.one_of(
    st.builds(lambda vf: json.dumps(entry(vf=vf)), st.sampled_from([VF, "0000:82:00.5"])),
    st.builds(lambda run: json.dumps(intent_for(run)), st.sampled_from(["r1", "r2"])),
    st.builds(lambda run: json.dumps({"action": "abort", "run_id": run}), st.sampled_from(["r1", "r2"])),
    st.binary(max_size=40).map(lambda raw: raw.replace(b"\n", b" ").decode("latin-1")),
    st.integers(min_value=1, max_value=3000).map(lambda depth: "[" * depth + "]" * depth),
)


@hsettings(max_examples=60, deadline=None, database=None)
@given(lines=st.lists(LINES, max_size=8), cut=st.integers(min_value=0, max_value=400))
def test_any_content_torn_anywhere_reads_and_appends(lines, cut):
    data = "\n".join(lines).encode("latin-1") + b"\n"
    data = data[:len(data) - cut] if cut < len(data) else b""
    state_dir = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        with open(os.path.join(state_dir, "ledger.jsonl"), "wb") as handle:
            handle.write(data)
        before = _ledger.read_ledger(state_dir)  # never raises
        kept = [dict((k, v) for k, v in e.items() if k != "line") for e in before.entries]
        _ledger_write.append_entries(state_dir, [entry(vf="0000:82:00.7")])
        after = _ledger.read_ledger(state_dir)
        assert [dict((k, v) for k, v in e.items() if k != "line") for e in after.entries] == kept + [
            entry(vf="0000:82:00.7")]
        assert [i.run_id for i in after.intents] == [i.run_id for i in before.intents]
        with open(os.path.join(state_dir, "ledger.jsonl"), "rb") as handle:
            assert handle.read().endswith(b"\n")
    finally:
        shutil.rmtree(state_dir)
