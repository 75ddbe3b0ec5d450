# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_wedge's journal sources against the fake journalctl (tests/unit/fake_journalctl.py), never the machine's.

What we ask journalctl for (unit, boot, since, output format, order, bound) and
how we read what it says, including hostile answers: garbage, non-UTF-8,
endless output, a journalctl that hangs or fails. Always bounded, never a
traceback, and a source that could not be read says so.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _wedge
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector, property_settings

NOW = _gotime.to_unix_ns(_gotime.parse_rfc3339("2026-12-02T03:00:00Z"))
VF = "0000:82:00.4"
CARD = "0000:82:00.0"
WEDGE_MSG = json.dumps({
    "time": "2026-12-02T02:40:00.5Z", "level": "WARN",
    "msg": "hypervisor with VFIO devices did not exit on SIGTERM; hard-killing, device may wedge if the guest "
           "driver was initializing", "instance_id": "inst-1", "device_path": "/sys/bus/pci/devices/%s" % VF,
    "subsystem": "INSTANCES"}, separators=(",", ":"))
# The kernel's journal entry has no syslog prefix: its time is the entry's.
OOM_MSG = ("Out of memory: Killed process 41235 (qemu-system-x86) total-vm:67108864kB, anon-rss:33554432kB, "
           "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:65536kB oom_score_adj:0")
OOM_AT = _gotime.to_unix_ns(_gotime.parse_rfc3339("2026-12-02T02:50:00.25Z"))
INSTANCE = {"id": "inst-9", "pid": 41235, "vf_address": "0000:82:00.5", "assigned_at": "2026-12-02T02:00:00Z",
            "boot_id": "", "device_path": "/sys/bus/pci/devices/0000:82:00.5"}


def _entry(message, realtime_ns=None):
    entry = {"MESSAGE": message}
    if realtime_ns is not None:
        entry["__REALTIME_TIMESTAMP"] = str(realtime_ns // 1000)
    return entry


def _collect(tmp_path, options=None, instances=()):
    return _wedge.collect(options or _wedge.Options(), str(tmp_path), str(tmp_path), list(instances),
                          {VF: CARD, "0000:82:00.5": CARD}, now_ns=NOW)


def _expected_argv(selector, hours=_wedge.DEFAULT_WINDOW_HOURS):
    return [selector, "--boot=0", "--since=@%d" % ((NOW - hours * 3600 * 10 ** 9) // 10 ** 9), "--output=json",
            "--reverse", "--lines=%d" % _wedge.JOURNAL_ENTRIES, "--no-pager", "--quiet",
            "--output-fields=MESSAGE,__REALTIME_TIMESTAMP"]


def test_journalctl_is_found_on_path_and_asked_for_the_unit_and_the_kernel(tmp_path, fake_journalctl):
    assert _wedge.Options().journalctl == fake_journalctl.path
    section = _collect(tmp_path)
    assert fake_journalctl.calls() == [_expected_argv("--unit=hypeman.service"), _expected_argv("--dmesg")]
    sources = [s["from"] for s in section["sources"]]
    assert section["complete"] and sources == ["journal (hypeman.service)", "journal (kernel)"]
    assert section["at_risk_vfs"] == [] and [s["lines"] for s in section["sources"]] == [0, 0]


def test_the_unit_and_window_options_reach_journalctl(tmp_path, fake_journalctl):
    _collect(tmp_path, _wedge.Options(unit="hypeman-edge.service", window_hours=2))
    assert fake_journalctl.calls() == [_expected_argv("--unit=hypeman-edge.service", 2), _expected_argv("--dmesg", 2)]


def test_journal_entries_become_at_risk_vfs_with_the_journal_time(tmp_path, fake_journalctl):
    fake_journalctl.answer("unit", [_entry("hypeman-api listening"), _entry(WEDGE_MSG, NOW - 1200 * 10 ** 9)])
    fake_journalctl.answer("dmesg", [_entry(OOM_MSG, OOM_AT), _entry("usb 1-1: new device", OOM_AT)])
    section = _collect(tmp_path, instances=[INSTANCE])
    assert section["complete"] and [s["signals"] for s in section["sources"]] == [1, 1]
    at_risk = dict((v["vf"], v) for v in section["at_risk_vfs"])
    assert sorted(at_risk) == [VF, "0000:82:00.5"]
    # hypeman's own time wins over the journal's; the kernel line has none, so the journal's counts.
    assert at_risk[VF]["time"] == "2026-12-02T02:40:00.5Z" and at_risk[VF]["instance_id"] == "inst-1"
    assert at_risk["0000:82:00.5"]["time"] == "2026-12-02T02:50:00.25Z"
    assert at_risk["0000:82:00.5"]["instance_id"] == "inst-9" and at_risk["0000:82:00.5"]["reason"] == "oom_killed_qemu"


def test_garbage_and_non_utf8_output_is_skipped_line_by_line(tmp_path, fake_journalctl):
    raw = b"\n".join([b"not json", b"\xff\xfe\x00 binary", b"[1, 2]", b'{"MESSAGE": 7}', b"{" * 5000,
                      json.dumps(_entry(WEDGE_MSG)).encode(), b'{"MESSAGE": [256, -1]}',
                      json.dumps({"MESSAGE": list(b"\xffdevice may wedge \xfe")}).encode(), b""])
    fake_journalctl.answer("unit", raw=raw)
    section = _collect(tmp_path)
    assert section["sources"][0]["error"] is None and section["sources"][0]["signals"] == 2
    assert [v["vf"] for v in section["at_risk_vfs"]] == [VF]
    assert [u["why"] for u in section["unattributed"]] == ["no VF in the line's device_path null"]


def test_a_failing_journalctl_is_a_source_error_naming_the_command(tmp_path, fake_journalctl):
    fake_journalctl.answer("dmesg", stderr="Failed to get boot ID: No data available\n", rc=1)
    fake_journalctl.answer("unit", [_entry(WEDGE_MSG)])
    section = _collect(tmp_path)
    error = section["sources"][1]["error"]
    assert not section["complete"] and section["sources"][0]["error"] is None
    assert error.startswith(fake_journalctl.path + " --dmesg ") and "exit 1: Failed to get boot ID" in error
    assert [v["vf"] for v in section["at_risk_vfs"]] == [VF]  # the other source still counts
    assert any("not read from journal (kernel)" in line for line in _wedge.warnings(section))


@pytest.mark.parametrize("behaviour", ["hang", "endless"])
def test_a_hanging_or_endless_journalctl_is_cut_off(tmp_path, fake_journalctl, monkeypatch, behaviour):
    # Only the hanging source gets the short timeout: the kernel source's fake (a Python
    # script) can take more than 1 s to start on a loaded machine, and must still be read.
    read_journal = _wedge.read_journal

    def read_journal_unit_cut_short(journalctl, selector, since_ns, timeout=None, **kwargs):
        return read_journal(journalctl, selector, since_ns, timeout=None if "--dmesg" in selector else 1, **kwargs)

    monkeypatch.setattr(_wedge, "read_journal", read_journal_unit_cut_short)
    fake_journalctl.answer("unit", behaviour=behaviour)
    with hang_detector(60, "collect with a %s journalctl" % behaviour):
        section = _collect(tmp_path)
    assert not section["complete"]
    assert "timed out after 1s" in section["sources"][0]["error"]
    assert section["sources"][1]["error"] is None


def test_output_beyond_the_capture_limit_is_marked_truncated(tmp_path, fake_journalctl, monkeypatch):
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _cmd

    monkeypatch.setattr(_cmd, "OUTPUT_LIMIT", 4096)
    entries = [_entry(WEDGE_MSG)] + [_entry("filler %d" % n) for n in range(200)]
    fake_journalctl.answer("unit", entries)
    section = _collect(tmp_path)
    source = section["sources"][0]
    # --reverse: the newest entries come first and are kept; what was cut is the oldest.
    assert source["error"] is None and source["truncated"] and source["signals"] == 1


@property_settings(15)
@given(st.binary(max_size=3000))
def test_any_journal_output_gives_a_clean_section(tmp_path_factory, data):
    from ansible_collections.hypeman.vgpu.tests.unit.fake_journalctl import FakeJournalctl

    # hypothesis runs the examples inside one test call: a fake of its own, passed explicitly.
    fake = FakeJournalctl(tmp_path_factory.mktemp("fuzz-journalctl"))
    fake.answer("unit", raw=data)
    fake.answer("dmesg", raw=data)
    section = _collect(tmp_path_factory.getbasetemp(), _wedge.Options(journalctl=fake.path))
    assert section["complete"] and all(s["read"] for s in section["sources"])
    json.dumps(section)
