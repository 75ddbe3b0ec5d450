# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vf_health: options, states, outcomes, check mode, diff, ledger, repair, bad input."""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _ledger, _ledger_write, _proc, _store
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.modules import vf_health
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module, warning_texts
from ansible_collections.hypeman.vgpu.tests.unit.hostile import tree_fingerprint

CARD = "0000:82:00.0"
ASSIGNED = "2026-08-20T15:00:00.123456789Z"


class Host(object):
    def __init__(self, root):
        self.tree = HostTree(str(root))
        self.card = self.tree.add_card("A100", CARD, numvfs=4)
        self.vfs = list(self.card.vfs)
        self.path = self.tree.store_path

    def run(self, capsys, check_mode=False, diff=False, **args):
        params = {"data_dir": self.tree.data_dir, "state_dir": self.tree.state_dir,
                  "sysfs_root": self.tree.sysfs_root, "proc_root": self.tree.proc_root,
                  "config_path": self.tree.config_path, "_ansible_check_mode": check_mode,
                  "_ansible_diff": diff}
        params.update(args)
        result = run_module(vf_health.main, params, capsys)
        result["warning_texts"] = warning_texts(result)
        return result

    def raw(self):
        try:
            with open(self.path, "rb") as handle:
                return handle.read()
        except IOError:
            return None

    def put(self, data):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "wb") as handle:
            handle.write(data)

    def store(self):
        return _store.load_store(self.path)

    def ledger(self):
        return _ledger.read_ledger(self.tree.state_dir)

    def snapshot(self):
        return tree_fingerprint(self.tree.root)


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path / "host")


def fail(host, capsys, vf, instance, check_mode=False, **extra):
    return host.run(capsys, check_mode=check_mode, state="failed", vf_addresses=[vf], instance_id=instance,
                    assigned_at=ASSIGNED, **extra)


def cycle(host, capsys, first, **args):
    """check -> apply -> apply again -> check again; returns the four results."""
    results = [host.run(capsys, check_mode=True, diff=True, **args)]
    assert host.raw() == first
    results.append(host.run(capsys, diff=True, **args))
    results.append(host.run(capsys, diff=True, **args))
    results.append(host.run(capsys, check_mode=True, diff=True, **args))
    assert [r["changed"] for r in results] == [True, True, False, False], results
    assert results[0]["outcomes"] == results[1]["outcomes"]
    assert [r["vf_address"] for r in results[0]["records"]] == [r["vf_address"] for r in results[1]["records"]]
    return results


def warnings_of(result):
    return " | ".join(result["warning_texts"])


def write_config(host, text):
    os.makedirs(os.path.dirname(host.tree.config_path), exist_ok=True)
    with open(host.tree.config_path, "w") as handle:
        handle.write(text)


# --- bad input: a clear error naming the value, nothing on disk changes ------------------------


@pytest.mark.parametrize("args, message", [
    (dict(state="quarantined", vf_addresses=["not-a-pci-address"]), "invalid VF address 'not-a-pci-address'"),
    (dict(state="quarantined", vf_addresses=["0000:82:00.4", "0000:82:00.9"]), "invalid VF address '0000:82:00.9'"),
    (dict(state="quarantined", parent_gpu="82:00"), "invalid card address '82:00': expected a PCI function "
                                                    "address like 0000:82:00.0"),
    (dict(state="quarantined", vf_addresses=["0000:82:00.3"]),
     "state=quarantined refused: not a VF on this host: 0000:82:00.3 (no such device under "),
    (dict(state="failed", vf_addresses=["0000:82:00.4", "0000:82:00.0"], instance_id="i", assigned_at="a"),
     "not a VF on this host: 0000:82:00.0 (%(sysfs)s/bus/pci/devices/0000:82:00.0 exists but is not a VF of an "
     "NVIDIA vGPU card)"),
    (dict(state="succeeded", vf_addresses=["0000:e3:00.4"], instance_id="i", assigned_at="a"),
     "not a VF on this host: 0000:e3:00.4"),
    (dict(state="quarantined", vf_addresses=[]), "vf_addresses is empty"),
    (dict(state="failed", vf_addresses=["0000:82:00.4"], instance_id="i", assigned_at="a", threshold=0),
     "threshold is 0; expected a whole number >= 1"),
    (dict(state="failed", vf_addresses=["0000:82:00.4"], instance_id="i", assigned_at="a", threshold=-3),
     "threshold is -3; expected a whole number >= 1"),
    (dict(state="quarantined", vf_addresses=["0000:82:00.4"], parent_gpu=CARD),
     "parameters are mutually exclusive: vf_addresses|parent_gpu"),
    (dict(state="absent"), "one of vf_addresses or parent_gpu is required with state=absent"),
    (dict(state="repaired", vf_addresses=["0000:82:00.4"]), "state=repaired acts on the whole store"),
    (dict(state="failed", vf_addresses=["0000:82:00.4"]), "state is failed but all of the following are missing"),
    (dict(state="succeeded", vf_addresses=["0000:82:00.4"], instance_id="i"), "assigned_at"),
    (dict(state="quarantined", parent_gpu="0000:99:00.0"), "parent_gpu 0000:99:00.0: no VFs found"),
    (dict(state="absent", parent_gpu=CARD, recorded_before="yesterday"),
     "recorded_before 'yesterday' is not an RFC 3339 time like 2026-08-31T12:00:00.5Z"),
    (dict(state="absent", parent_gpu=CARD, recorded_before="2026-08-31T12:00:00.5Z\n"), "is not an RFC 3339 time"),
    (dict(state="quarantined", parent_gpu=CARD, recorded_before="2026-08-31T12:00:00Z"),
     "recorded_before is only used with state=absent, not state=quarantined"),
])
def test_bad_input_fails_and_changes_nothing(host, capsys, args, message):
    host.put(b'{"version":1,"records":[]}')
    before = host.snapshot()
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, **args)
        assert result["failed"] and message % {"sysfs": host.tree.sysfs_root} in result["msg"], result["msg"]
        assert "invalid VF address" not in result["msg"] or "parent_gpu" not in args
    assert host.snapshot() == before


def test_allow_absent_records_a_vf_not_on_the_host_with_a_warning(host, capsys):
    ghost = "0000:e3:00.4"
    result = host.run(capsys, state="quarantined", vf_addresses=[ghost, host.vfs[0]], allow_absent=True,
                      reason="card out for repair")
    assert result["changed"] and result["absent_vfs"] == [ghost]
    assert host.store().quarantined() == sorted([ghost, host.vfs[0]])
    assert "not on this host (allow_absent=true): 0000:e3:00.4 (no such device under" in warnings_of(result)
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert (result["changed"], result["absent_vfs"], result["warning_texts"]) == (False, [], [])


def test_absent_and_ledger_only_vfs_need_no_host_vf(host, capsys):
    ghost = "0000:e3:00.4"
    host.run(capsys, state="quarantined", vf_addresses=[ghost], allow_absent=True)
    # Removing a record never needs the VF on the host.
    assert host.run(capsys, state="absent", vf_addresses=[ghost])["outcomes"] == {ghost: "cleared"}
    # A card whose SR-IOV is off: its VFs are known from the ledger only, and a drain still covers them.
    host.run(capsys, state="quarantined", parent_gpu=CARD)
    host.run(capsys, state="absent", parent_gpu=CARD)
    host.tree.remove_vfs(CARD)
    result = host.run(capsys, state="quarantined", parent_gpu=CARD)
    assert result["changed"] and result["absent_vfs"] == [] and host.store().quarantined() == sorted(host.vfs)


def test_parent_gpu_of_another_vendor_is_refused(host, capsys):
    other = "0000:3b:00.0"
    host.tree.add_device(other, vendor="0x8086", pci_class="0x020000", driver="ice", sriov_totalvfs=4)
    vf = "0000:3b:00.4"
    os.makedirs(os.path.join(host.tree.sysfs_root, "devices", "pci0000:00", vf))
    os.symlink(os.path.join(host.tree.sysfs_root, "devices", "pci0000:00", vf),
               os.path.join(host.tree.sysfs_root, "bus", "pci", "devices", vf))
    os.symlink("../" + vf, os.path.join(host.tree.sysfs_root, "bus", "pci", "devices", other, "virtfn0"))
    before = host.snapshot()
    result = host.run(capsys, state="quarantined", parent_gpu=other)
    assert result["failed"] and "0000:3b:00.4 (%s/bus/pci/devices/0000:3b:00.4 exists but is not a VF of an " \
        "NVIDIA vGPU card)" % host.tree.sysfs_root in result["msg"]
    assert host.snapshot() == before


def test_bad_threshold_in_config_is_named(host, capsys):
    write_config(host, "gpu:\n  vf_quarantine_threshold: 0\n")
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert result["failed"] and "gpu.vf_quarantine_threshold is 0" in result["msg"]
    assert host.raw() is None


# --- failed / succeeded --------------------------------------------------------------------------


def test_failed_cycle_and_threshold_crossing(host, capsys):
    vf = host.vfs[0]
    results = cycle(host, capsys, None, state="failed", vf_addresses=[vf.upper()], instance_id="i1",
                    assigned_at=ASSIGNED)
    assert results[1]["outcomes"] == {vf: "recorded"} and results[2]["outcomes"] == {vf: "unchanged"}
    assert results[1]["vf_addresses"] == [vf]
    assert results[0]["diff"]["before"] == "" and results[1]["diff"]["after"] == host.raw().decode()
    assert results[2]["diff"]["before"] == results[2]["diff"]["after"] == host.raw().decode()
    assert results[1]["ledger_entries"] == [] and not host.ledger().exists  # below threshold: nothing to log
    first = host.raw()
    results = cycle(host, capsys, first, state="failed", vf_addresses=[vf], instance_id="i2", assigned_at=ASSIGNED)
    assert results[0]["outcomes"] == results[1]["outcomes"] == {vf: "quarantined"}
    assert results[1]["quarantined"] == [vf] and host.store().quarantined() == [vf]
    assert [(e["action"], e["trigger"]) for e in host.ledger().entries] == [("quarantine", "failure_threshold")]
    assert host.ledger().entries[0]["quarantined_at"] == results[1]["records"][0]["quarantined_at"]
    # Failure-threshold quarantines are evidence, not owned drains.
    assert _ledger.owned_quarantines(host.ledger(), host.store()) == []


def test_failed_with_empty_instance_and_assignment(host, capsys):
    vf = host.vfs[0]
    result = host.run(capsys, state="failed", vf_addresses=[vf], instance_id="", assigned_at="")
    assert result["outcomes"] == {vf: "recorded"}
    assert b"instance_id" not in host.raw() and b"assigned_at" not in host.raw()


def test_succeeded_clears_and_rescinds(host, capsys):
    vf = host.vfs[0]
    fail(host, capsys, vf, "i1")
    fail(host, capsys, vf, "i2")
    before = host.raw()
    # The older assignment's success changes nothing on a quarantined VF.
    result = host.run(capsys, state="succeeded", vf_addresses=[vf], instance_id="i1", assigned_at=ASSIGNED)
    assert (result["changed"], result["outcomes"], result["cleared"]) == (False, {vf: "unchanged"}, {vf: 0})
    assert host.raw() == before
    results = cycle(host, capsys, before, state="succeeded", vf_addresses=[vf], instance_id="i2",
                    assigned_at=ASSIGNED)
    assert results[1]["outcomes"] == {vf: "rescinded"} and results[1]["cleared"] == {vf: 2}
    assert results[2]["outcomes"] == {vf: "unchanged"}
    assert host.store().records == {} and host.store().format == "v1"
    assert [(e["action"], e["trigger"]) for e in host.ledger().entries][-1] == ("clear", "success")


def test_succeeded_below_threshold_clears(host, capsys):
    vf = host.vfs[1]
    fail(host, capsys, vf, "i1")
    result = host.run(capsys, state="succeeded", vf_addresses=[vf], instance_id="i1", assigned_at=ASSIGNED)
    assert (result["changed"], result["outcomes"], result["cleared"]) == (True, {vf: "cleared"}, {vf: 1})
    assert not host.ledger().exists  # no quarantine was involved


def test_threshold_option_and_config(host, capsys):
    vf = host.vfs[0]
    write_config(host, "gpu:\n  vf_quarantine_threshold: 3\n")
    fail(host, capsys, vf, "i1")
    result = fail(host, capsys, vf, "i2")
    assert result["outcomes"] == {vf: "recorded"} and result["threshold"] == 3
    assert result["threshold_source"] == host.tree.config_path
    result = fail(host, capsys, vf, "i3", threshold=5)
    assert result["outcomes"] == {vf: "recorded"} and result["threshold_source"] == "option"


def test_lowered_threshold_reevaluation_is_persisted_by_any_run(host, capsys):
    vf, other = host.vfs[0], host.vfs[1]
    for instance in ("i1", "i2"):
        fail(host, capsys, vf, instance, threshold=5)
    before = host.raw()
    # The requested change is a no-op, but hypeman at threshold 2 would quarantine vf at load: so do we.
    result = host.run(capsys, check_mode=True, state="absent", vf_addresses=[other], threshold=2)
    assert (result["changed"], result["reevaluated"], result["outcomes"]) == (True, [vf], {other: "unchanged"})
    assert host.raw() == before
    result = host.run(capsys, state="absent", vf_addresses=[other], threshold=2)
    assert (result["changed"], result["reevaluated"], result["outcomes"]) == (True, [vf], {other: "unchanged"})
    assert host.store().quarantined() == [vf]
    assert [(e["vf_address"], e["trigger"]) for e in host.ledger().entries] == [(vf, "reevaluation")]
    # Idempotent: nothing is left to re-evaluate.
    result = host.run(capsys, state="absent", vf_addresses=[other], threshold=2)
    assert (result["changed"], result["reevaluated"]) == (False, [])
    # hypeman's order: re-evaluate first, so a further failure on vf is "unchanged" (already quarantined).
    result = fail(host, capsys, vf, "i3", threshold=2)
    assert (result["changed"], result["outcomes"]) == (False, {vf: "unchanged"})


def test_reevaluation_survives_a_later_threshold_change(host, capsys):
    """Issue 12: t=2 fail X(A); t=1 fail X(B); t=2 fail Y leaves X quarantined, as in hypeman."""
    x, y = host.vfs[0], host.vfs[1]
    assert fail(host, capsys, x, "A", threshold=2)["outcomes"] == {x: "recorded"}
    result = fail(host, capsys, x, "B", threshold=1)
    # hypeman at threshold 1 quarantines X at load; B's report then finds it quarantined.
    assert (result["changed"], result["outcomes"], result["reevaluated"]) == (True, {x: "unchanged"}, [x])
    assert fail(host, capsys, x, "B", threshold=1)["changed"] is False
    result = fail(host, capsys, y, "C", threshold=2)
    assert result["outcomes"] == {y: "recorded"}
    assert host.store().quarantined() == [x] and host.store().failure_count(x) == 1


@pytest.mark.parametrize("args, outcome, clear_trigger", [
    (dict(state="succeeded", instance_id="i-a", assigned_at="T1"), "rescinded", "success"),
    (dict(state="absent", owned_only=False), "cleared", "manual"),
])
def test_vf_reevaluated_and_removed_by_the_same_run_is_logged(host, capsys, args, outcome, clear_trigger):
    """Issue 12: the run that re-evaluates a VF into quarantine and removes it again logs both, no crash."""
    vf = host.vfs[0]
    host.run(capsys, state="failed", vf_addresses=[vf], instance_id="i-a", assigned_at="T1", threshold=2)
    result = host.run(capsys, vf_addresses=[vf], threshold=1, **args)
    assert not result.get("failed"), result.get("msg")
    assert (result["changed"], result["outcomes"], result["reevaluated"]) == (True, {vf: outcome}, [vf])
    assert host.raw() == b'{\n  "version": 1,\n  "records": []\n}'
    entries = host.ledger().entries
    assert [(e["action"], e["trigger"], e["vf_address"]) for e in entries] == [
        ("quarantine", "reevaluation", vf), ("clear", clear_trigger, vf)]
    assert entries[0]["quarantined_at"] is not None and result["ledger_entries"] == [
        dict((k, v) for k, v in e.items() if k != "line") for e in entries]
    again = host.run(capsys, vf_addresses=[vf], threshold=1, **args)
    assert (again["changed"], again["outcomes"]) == (False, {vf: "unchanged"})


PLUS_24 = ('{"version":1,"records":[{"vf_address":"%s","failures":[{"instance_id":"a",'
           '"reported_at":"2026-08-20T15:00:00Z"}],"quarantined_at":"2025-01-01T00:00:00+24:00"}]}')


def test_store_go_loads_but_cannot_marshal(host, capsys):
    """Issue 12: a time Go loads but cannot marshal: no traceback, hypeman's answers."""
    vf, other = host.vfs[0], host.vfs[1]
    content = (PLUS_24 % vf).encode()
    host.put(content)
    # A run that changes nothing reports the store as hypeman holds it.
    result = host.run(capsys, state="quarantined", vf_addresses=[vf])
    assert (result["changed"], result["outcomes"]) == (False, {vf: "unchanged"})
    assert result["records"][0]["quarantined_at"] == "2025-01-01T00:00:00+24:00"
    # A change fails as hypeman's own write would, and nothing changes.
    before = host.snapshot()
    result = fail(host, capsys, other, "i1")
    assert result["failed"] and host.path in result["msg"]
    assert result["store_error"] == ("marshal VF health state: json: error calling MarshalJSON for type "
                                     "*time.Time: Time.MarshalJSON: timezone hour outside of range [0,23]")
    assert host.snapshot() == before
    # state=repaired rewrites the same instants in UTC, keeping the backup; ownership of nothing changes.
    result = host.run(capsys, check_mode=True, state="repaired")
    assert result["changed"] and host.raw() == content
    result = host.run(capsys, state="repaired")
    assert result["changed"] and result["outcomes"] == {}
    assert result["records"][0]["quarantined_at"] == "2024-12-31T00:00:00Z"
    with open(result["backup_file"], "rb") as handle:
        assert handle.read() == content
    assert [(e["action"], e["vf_address"]) for e in host.ledger().entries] == [("repair", None)]
    assert host.run(capsys, state="repaired")["changed"] is False
    assert fail(host, capsys, other, "i1")["outcomes"] == {other: "recorded"}


# --- quarantined / absent / ownership --------------------------------------------------------------


def test_quarantined_whole_card_cycle_and_owned_clear(host, capsys):
    results = cycle(host, capsys, None, state="quarantined", parent_gpu=CARD.upper(), reason="drain for cycle",
                    job_id="77", requested_by="alice")
    assert results[1]["vf_addresses"] == host.vfs
    assert results[1]["outcomes"] == dict((vf, "quarantined") for vf in host.vfs)
    assert results[2]["outcomes"] == dict((vf, "unchanged") for vf in host.vfs)
    assert host.store().quarantined() == sorted(host.vfs)
    entries = host.ledger().entries
    assert [(e["vf_address"], e["parent_gpu"], e["reason"], e["user"], e["job_id"]) for e in entries] == [
        (vf, CARD, "drain for cycle", "alice", "77") for vf in host.vfs]
    assert len(set(e["run_id"] for e in entries)) == 1
    assert _ledger.owned_quarantines(host.ledger(), host.store()) == sorted(host.vfs)
    results = cycle(host, capsys, host.raw(), state="absent", parent_gpu=CARD)
    assert results[1]["outcomes"] == dict((vf, "cleared") for vf in host.vfs)
    assert host.store().records == {}
    assert [e["action"] for e in host.ledger().entries][-4:] == ["clear"] * 4


def test_absent_owned_only_skips_foreign_quarantines(host, capsys):
    ours, theirs, failed = host.vfs[0], host.vfs[1], host.vfs[2]
    host.run(capsys, state="quarantined", vf_addresses=[ours], reason="drain")
    store = host.store()
    store.quarantine(theirs)  # hand-made by an operator, unknown to the ledger
    store.report_failure(failed, "i", "a", 5)  # below threshold: not a quarantine
    host.put(store.to_bytes())
    before = host.raw()
    result = host.run(capsys, check_mode=True, state="absent", vf_addresses=[ours, theirs, failed])
    assert result["outcomes"] == {ours: "cleared", theirs: "skipped_not_owned", failed: "cleared"}
    assert "latest ledger entry: none" in result["not_owned"][theirs]
    assert host.raw() == before
    result = host.run(capsys, state="absent", vf_addresses=[ours, theirs, failed])
    assert result["changed"] and host.store().quarantined() == [theirs]
    result = host.run(capsys, state="absent", vf_addresses=[theirs])
    assert (result["changed"], result["outcomes"]) == (False, {theirs: "skipped_not_owned"})
    result = host.run(capsys, state="absent", vf_addresses=[theirs], owned_only=False, reason="after cycle")
    assert result["outcomes"] == {theirs: "cleared"} and host.store().records == {}


def test_recorded_before_keeps_what_was_recorded_after_it(host, capsys):
    # A clear resumed after a kill: the drain's quarantines predate the cut, hypeman's new
    # evidence (a failure, a quarantine) came after it and stays.
    old, failed_after, quarantined_after, untouched = host.vfs
    store = _store.HealthStore(host.path)
    cut = _gotime.parse_rfc3339("2026-08-31T12:00:00Z")
    store.quarantine(old, now=_gotime.parse_rfc3339("2026-08-31T11:00:00Z"))
    store.report_failure(failed_after, "i-early", ASSIGNED, 5, now=_gotime.parse_rfc3339("2026-08-31T11:30:00Z"))
    store.report_failure(failed_after, "i-late", ASSIGNED, 5, now=_gotime.parse_rfc3339("2026-08-31T12:00:00.000000001Z"))
    store.quarantine(quarantined_after, now=_gotime.parse_rfc3339("2026-08-31T12:30:00Z"))
    host.put(store.to_bytes())
    args = dict(state="absent", parent_gpu=CARD, owned_only=False, threshold=5,
                recorded_before="2026-08-31T14:00:00+02:00")
    results = cycle(host, capsys, host.raw(), **args)
    assert results[1]["outcomes"] == {old: "cleared", failed_after: "kept_newer", quarantined_after: "kept_newer",
                                      untouched: "unchanged"}
    assert results[1]["newer"] == {failed_after: "2026-08-31T12:00:00.000000001Z",
                                   quarantined_after: "2026-08-31T12:30:00Z"}
    assert sorted(host.store().records) == [failed_after, quarantined_after]
    assert cut == _gotime.parse_rfc3339(args["recorded_before"])
    assert [e["vf_address"] for e in host.ledger().entries if e["action"] == "clear"] == [old]


def test_recorded_before_keeps_a_record_exactly_when_one_of_its_times_is_later(host, capsys):
    from hypothesis import example, given, strategies as st

    from ansible_collections.hypeman.vgpu.tests.unit.hostile import property_settings

    base = 1788177600
    offsets = st.integers(-3, 3)  # seconds around the cut

    @property_settings(25)
    @given(failures=st.lists(offsets, max_size=3), quarantine=st.one_of(st.none(), offsets),
           nanos=st.integers(0, 999999999))
    # Two failures reach the threshold: this run's own re-evaluation quarantines the VF now,
    # which is not evidence newer than the cut.
    @example(failures=[0, 0], quarantine=None, nanos=0)
    def check(failures, quarantine, nanos):
        vf = host.vfs[0]
        store = _store.HealthStore(host.path)
        times = []
        for index, offset in enumerate(failures):
            when = _gotime.GoTime(base + offset, nanos)
            times.append(when)
            store.report_failure(vf, "i-%d" % index, ASSIGNED, 10, now=when)
        if quarantine is not None or not failures:
            when = _gotime.GoTime(base + (quarantine or 0), nanos)
            times.append(when)
            store.quarantine(vf, now=when)
        host.put(store.to_bytes())
        cut = _gotime.GoTime(base, 0)
        result = host.run(capsys, state="absent", vf_addresses=[vf], owned_only=False,
                          recorded_before=_gotime.format_rfc3339nano(cut))
        kept = any(when > cut for when in times)
        assert result["outcomes"] == {vf: "kept_newer" if kept else "cleared"}
        assert (vf in host.store().records) is kept

    check()


def test_requarantined_by_someone_else_is_no_longer_owned(host, capsys):
    vf = host.vfs[0]
    host.run(capsys, state="quarantined", vf_addresses=[vf])
    store = host.store()
    store.remove(vf)
    store.quarantine(vf)  # someone else's quarantine, a new timestamp
    host.put(store.to_bytes())
    result = host.run(capsys, state="absent", vf_addresses=[vf])
    assert result["outcomes"] == {vf: "skipped_not_owned"}
    assert "quarantine/manual" in result["not_owned"][vf]


def test_manual_quarantine_keeps_failures(host, capsys):
    vf = host.vfs[0]
    fail(host, capsys, vf, "i1")
    host.run(capsys, state="quarantined", vf_addresses=[vf])
    record = host.store().records[vf]
    assert len(record.failures) == 1 and record.quarantined_at is not None


def test_parent_gpu_includes_vfs_only_the_ledger_remembers(host, capsys):
    host.run(capsys, state="quarantined", parent_gpu=CARD)
    host.tree.remove_vfs(CARD)  # SR-IOV disabled: the virtfn links are gone
    result = host.run(capsys, state="absent", parent_gpu=CARD)
    assert sorted(result["vf_addresses"]) == sorted(host.vfs)
    assert result["outcomes"] == dict((vf, "cleared") for vf in host.vfs)


# --- invalid stores fail closed; repaired ------------------------------------------------------------

INVALID = [
    (b"not json", "invalid"),
    (b"[]", "legacy"),
    (b'{"version":2,"records":[]}', "invalid"),
    (b'{"version":1}', "invalid"),
    (b'{"version":1,"records":[{"vf_address":"0000:82:00.4","quarantined_at":"0001-01-01T00:00:00Z"}]}', "invalid"),
]


@pytest.mark.parametrize("content, fmt", INVALID)
@pytest.mark.parametrize("args", [
    dict(state="failed", instance_id="i", assigned_at="a"), dict(state="succeeded", instance_id="i", assigned_at="a"),
    dict(state="quarantined"), dict(state="absent"), dict(state="absent", owned_only=False),
])
def test_invalid_store_fails_closed_for_every_state(host, capsys, content, fmt, args):
    host.put(content)
    before = host.snapshot()
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, vf_addresses=[host.vfs[0]], **args)
        assert result["failed"] and host.path in result["msg"] and "(%s)" % fmt in result["msg"]
        assert result["store_error"] == _store.parse_store_bytes(host.path, content).error
    assert host.snapshot() == before


def test_repaired_legacy_store(host, capsys):
    legacy = ('[{"vf_address":"%s","instance_id":"x","wedge_count":1,"quarantined_at":"2026-01-01T00:00:00Z"},'
              '{"vf_address":"%s","wedge_count":2}]' % (host.vfs[0], host.vfs[1].upper())).encode()
    host.put(legacy)
    result = host.run(capsys, check_mode=True, diff=True, state="repaired")
    assert result["changed"] and result["backup_file"] is None and host.raw() == legacy
    assert result["diff"]["before"] == legacy.decode()
    result = host.run(capsys, state="repaired", job_id="9")
    assert result["changed"] and (result["previous_format"], result["previous_error"]) == (
        "legacy", "unmarshal VF health state: json: cannot unmarshal array into Go value of type "
                  "devices.vfHealthFile")
    assert result["outcomes"] == {host.vfs[0]: "quarantined", host.vfs[1]: "quarantined"}
    with open(result["backup_file"], "rb") as handle:
        assert handle.read() == legacy
    store = host.store()
    assert store.valid and store.quarantined() == sorted(host.vfs[:2])
    assert store.records[host.vfs[0]].quarantined_at == _store.parse_store_bytes(
        "p", b'{"version":1,"records":[{"vf_address":"0000:00:00.0","quarantined_at":"2026-01-01T00:00:00Z"}]}'
    ).records["0000:00:00.0"].quarantined_at
    assert [(e["action"], e["job_id"]) for e in host.ledger().entries] == [("repair", "9")] * 2
    # Repaired quarantines are not owned drains.
    assert _ledger.owned_quarantines(host.ledger(), store) == []
    again = host.run(capsys, state="repaired")
    assert (again["changed"], again["outcomes"], again["backup_file"]) == (False, {}, None)
    assert host.run(capsys, check_mode=True, state="repaired")["changed"] is False


def test_repaired_garbage_keeps_every_address_found(host, capsys):
    garbage = ('{"version":1,"records":[{"vf_address":"%s"' % host.vfs[2]).encode()
    host.put(garbage)
    result = host.run(capsys, state="repaired")
    assert result["changed"] and host.store().quarantined() == [host.vfs[2]]
    assert result["previous_error"] == "unmarshal VF health state: unexpected end of JSON input"


def test_repaired_empty_invalid_store_logs_once(host, capsys):
    host.put(b"{}")
    result = host.run(capsys, state="repaired")
    assert result["changed"] and host.store().records == {} and host.store().format == "v1"
    assert [(e["action"], e["vf_address"]) for e in host.ledger().entries] == [("repair", None)]


def test_repaired_on_valid_or_missing_store_changes_nothing(host, capsys):
    assert host.run(capsys, state="repaired")["changed"] is False
    assert host.raw() is None
    host.put(b'{"version":1,"records":[]}')
    before = host.snapshot()
    assert host.run(capsys, state="repaired")["changed"] is False
    assert host.snapshot() == before


def test_backup_option(host, capsys):
    vf = host.vfs[0]
    fail(host, capsys, vf, "i1")
    before = host.raw()
    result = fail(host, capsys, vf, "i2", backup=True)
    with open(result["backup_file"], "rb") as handle:
        assert handle.read() == before
    assert fail(host, capsys, vf, "i2", backup=True)["backup_file"] is None


# --- hypeman running ------------------------------------------------------------------------------


def test_warns_when_hypeman_runs(host, capsys):
    pid = host.tree.add_process(comm="hypeman-api", cmdline=["/opt/hypeman/bin/hypeman-api"])
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert result["hypeman_running"] is True
    assert result["hypeman_processes"] == [{"pid": pid, "comm": "hypeman-api", "cmdline": "/opt/hypeman/bin/hypeman-api"}]
    assert "restart it now" in warnings_of(result)
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert result["hypeman_running"] is True and not result["warning_texts"]  # nothing changed


def test_caller_that_stops_hypeman_gets_no_running_warning(host, capsys):
    # The store_edit role stops hypeman around the edit itself: the module must not tell the operator to.
    host.tree.add_process(comm="hypeman-api", cmdline=["/opt/hypeman/bin/hypeman-api"])
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, state="quarantined", vf_addresses=[host.vfs[0]],
                          warn_hypeman_running=False)
        assert result["changed"] is True and result["hypeman_running"] is True
        assert not result["warning_texts"]
        host.run(capsys, state="absent", vf_addresses=[host.vfs[0]], owned_only=False)


def test_kept_foreign_quarantine_is_a_warning(host, capsys):
    theirs = host.vfs[1]
    store = host.store()
    store.quarantine(theirs)  # hypeman's or an operator's, unknown to the ledger
    host.put(store.to_bytes())
    texts = []
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, state="absent", vf_addresses=[host.vfs[0], theirs])
        assert result["outcomes"][theirs] == "skipped_not_owned"
        texts.append(result["warning_texts"])
    # Identical in check mode and for real, so Ansible shows it once when a role plans and then edits.
    assert texts[0] == texts[1] == [
        "kept the quarantine of %s: this collection did not make it (owned_only; hypeman's sentinel or a hand edit "
        "did). If it must go anyway, for example after an SR-IOV cycle recreated the VF, clear it with "
        "owned_only=false (role clear_quarantine: clear_quarantine_owned_only: false)" % theirs]
    result = host.run(capsys, state="absent", vf_addresses=[theirs], owned_only=False, reason="after cycle")
    assert result["outcomes"] == {theirs: "cleared"} and not result["warning_texts"]


def test_no_hypeman_no_warning(host, capsys):
    host.tree.add_process(comm="sleep")
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert result["hypeman_running"] is False and not result["warning_texts"]


def test_find_processes_matches_comm_or_argv0(tmp_path):
    tree = HostTree(str(tmp_path))
    a = tree.add_process(comm="hypeman-api", cmdline=["/opt/hypeman/bin/hypeman-api", "--x"])
    b = tree.add_process(comm="python3", cmdline=["/usr/local/bin/hypeman", "serve"])
    tree.add_process(comm="bash", cmdline=["bash", "-c", "hypeman-api"])
    found = _proc.find_processes(tree.proc_root, ("hypeman-api", "hypeman"))
    assert [(p["pid"], p["comm"]) for p in found] == [(a, "hypeman-api"), (b, "python3")]
    assert found[1]["cmdline"] == "/usr/local/bin/hypeman serve"


def test_find_processes_ignores_processes_that_exit(tmp_path, monkeypatch):
    tree = HostTree(str(tmp_path))
    gone = tree.add_process(comm="hypeman-api")
    kept = tree.add_process(comm="hypeman-api")
    real = _proc._read_proc_file

    def reading(path):
        if "/%d/" % gone in path:
            raise IOError(errno.ENOENT, "No such file or directory")
        return real(path)

    monkeypatch.setattr(_proc, "_read_proc_file", reading)
    assert [p["pid"] for p in _proc.find_processes(tree.proc_root, ["hypeman-api"])] == [kept]

    def unreadable(path):
        raise IOError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_proc, "_read_proc_file", unreadable)
    with pytest.raises(VgpuError) as err:
        _proc.find_processes(tree.proc_root, ["hypeman-api"])
    assert "Permission denied" in err.value.msg


def test_unreadable_proc_is_a_warning_not_a_failure(host, capsys, monkeypatch):
    def broken(proc_root, names):
        raise VgpuError("cannot list processes in %s: boom" % proc_root)

    monkeypatch.setattr(_proc, "find_processes", broken)
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert result["changed"] and result["hypeman_running"] is None
    assert "could not tell whether hypeman is running" in warnings_of(result)


# --- symlinks and the ledger --------------------------------------------------------------------


def test_symlinked_store_is_refused_by_the_module(host, capsys, tmp_path):
    target = tmp_path / "planted.json"
    target.write_bytes(b'{"version":1,"records":[]}')
    os.makedirs(os.path.dirname(host.path), exist_ok=True)
    os.symlink(str(target), host.path)
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert result["failed"] and "is a symlink" in result["msg"]
    assert target.read_bytes() == b'{"version":1,"records":[]}'


def test_ledger_append_failure_after_the_write_is_reported_and_settled_next_run(host, capsys, monkeypatch):
    real = _ledger_write.append_entries
    calls = []

    def second_fails(state_dir, entries):
        calls.append([e["action"] for e in entries])
        if len(calls) == 2:
            raise VgpuError("cannot append to ledger x: disk full")
        return real(state_dir, entries)

    monkeypatch.setattr(_ledger_write, "append_entries", second_fails)
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    monkeypatch.undo()
    assert calls == [["intent"], ["quarantine"]]
    assert result["failed"] and result["changed"] is True
    assert "was changed, but the ledger append failed" in result["msg"] and "next vf_health run" in result["msg"]
    assert host.store().quarantined() == [host.vfs[0]]
    # The write-ahead intent already decides ownership; the next run writes the missing entry.
    assert _ledger.owned_quarantines(host.ledger(), host.store()) == [host.vfs[0]]
    again = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert again["changed"] is False and [s["outcome"] for s in again["settled"]] == ["commit"]
    ledger = host.ledger()
    assert ledger.pending() == [] and len(ledger.entries) == 1
    entry = ledger.entries[0]
    assert entry["run_id"] == again["settled"][0]["run_id"] and entry["settled_by"] not in (None, entry["run_id"])
    assert host.run(capsys, state="absent", vf_addresses=[host.vfs[0]])["outcomes"] == {host.vfs[0]: "cleared"}


def test_intent_append_failure_changes_nothing(host, capsys, monkeypatch):
    def broken(state_dir, entries):
        raise VgpuError("cannot append to ledger x: disk full")

    monkeypatch.setattr(_ledger_write, "append_entries", broken)
    before = host.snapshot()
    result = host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert result["failed"] and not result.get("changed")
    assert "nothing was changed: the ledger's write-ahead intent could not be written" in result["msg"]
    after = host.snapshot()
    # Only what taking the store lock needs was created: no store, no temporary file, no ledger.
    assert set(after) - set(before) <= {host.tree.data_dir, os.path.dirname(host.path), host.path + ".lock"}
    assert dict((k, v) for k, v in after.items() if k in before) == before and host.raw() is None


def test_requested_by_defaults_to_the_host_user(host, capsys, monkeypatch):
    monkeypatch.setenv("SUDO_USER", "carol")
    host.run(capsys, state="quarantined", vf_addresses=[host.vfs[0]])
    assert host.ledger().entries[0]["user"] == "carol"


# --- crash consistency: a run killed at any instant loses no ownership -------------------------

class Killed(BaseException):
    """Stands in for SIGKILL: no except clause of the module catches it (finally blocks still run)."""


def killed_run(host, capsys, monkeypatch, where, **args):
    """Run vf_health, "killed" at ``where``: ``before-rename`` or ``after-rename`` (before the entries)."""
    if where == "before-rename":
        real = os.rename

        def rename(*a, **kw):
            raise Killed()
        monkeypatch.setattr(os, "rename", rename)
    else:
        real = _ledger_write.append_entries
        calls = []

        def append(state_dir, entries):
            calls.append(entries)
            if len(calls) == 2:
                raise Killed()
            return real(state_dir, entries)
        monkeypatch.setattr(_ledger_write, "append_entries", append)
    with pytest.raises(Killed):
        host.run(capsys, **args)
    monkeypatch.undo()
    capsys.readouterr()


@pytest.mark.parametrize("where", ["before-rename", "after-rename"])
def test_killed_drain_keeps_exact_ownership(host, capsys, monkeypatch, where):
    vf = host.vfs[0]
    killed_run(host, capsys, monkeypatch, where, state="quarantined", vf_addresses=[vf], reason="drain")
    ledger = host.ledger()
    assert len(ledger.pending()) == 1 and ledger.entries == []
    written = where == "after-rename"
    assert host.store().quarantined() == ([vf] if written else [])
    assert os.path.exists(host.path + ".tmp") is (not written)  # a killed writer's leftover
    # Before anything is settled on disk, readers already decide the intent against the store.
    assert _ledger.owned_quarantines(host.ledger(), host.store()) == ([vf] if written else [])
    # Re-running the task settles the intent first, then does (or finds done) the drain.
    result = host.run(capsys, state="quarantined", vf_addresses=[vf], reason="drain")
    assert [s["outcome"] for s in result["settled"]] == ["commit" if written else "abort"]
    assert result["changed"] is (not written) and host.store().quarantined() == [vf]
    assert not os.path.exists(host.path + ".tmp")
    ledger = host.ledger()
    assert ledger.pending() == [] and _ledger.owned_quarantines(ledger, host.store()) == [vf]
    assert [(e["action"], e["trigger"]) for e in ledger.entries] == [("quarantine", "manual")]
    assert ledger.entries[0]["quarantined_at"] == host.store().to_data()[0]["quarantined_at"]
    again = host.run(capsys, state="quarantined", vf_addresses=[vf], reason="drain")
    assert (again["changed"], again["settled"]) == (False, [])
    # owned_only treats the drain as ours.
    assert host.run(capsys, state="absent", vf_addresses=[vf])["outcomes"] == {vf: "cleared"}


@pytest.mark.parametrize("where", ["before-rename", "after-rename"])
def test_killed_undrain_keeps_exact_ownership(host, capsys, monkeypatch, where):
    vf = host.vfs[0]
    host.run(capsys, state="quarantined", vf_addresses=[vf], reason="drain")
    killed_run(host, capsys, monkeypatch, where, state="absent", vf_addresses=[vf])
    written = where == "after-rename"
    assert host.store().quarantined() == ([] if written else [vf])
    assert _ledger.owned_quarantines(host.ledger(), host.store()) == ([] if written else [vf])
    check = host.run(capsys, check_mode=True, state="absent", vf_addresses=[vf])
    assert [s["outcome"] for s in check["settled"]] == ["commit" if written else "abort"]
    assert len(host.ledger().pending()) == 1  # check mode settles nothing on disk
    result = host.run(capsys, state="absent", vf_addresses=[vf])
    assert result["outcomes"] == {vf: "unchanged" if written else "cleared"}
    assert host.store().records == {} and host.ledger().pending() == []
    assert [e["action"] for e in host.ledger().entries] == ["quarantine", "clear"]


def test_write_failure_before_rename_aborts_its_own_intent(host, capsys, monkeypatch):
    vf = host.vfs[0]
    real = os.rename

    def failing(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "rename", failing)
    result = host.run(capsys, state="quarantined", vf_addresses=[vf])
    monkeypatch.setattr(os, "rename", real)
    assert result["failed"] and "previous file is unchanged" in result["msg"]
    ledger = host.ledger()
    assert ledger.pending() == [] and [i.status for i in ledger.intents] == ["aborted"] and ledger.entries == []
