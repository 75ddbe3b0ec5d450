# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_wedge: a log or journal time that does not render in UTC (year outside 0..9999) is a line without a
usable time, as an unparseable one is; collect() never raises for it (it raised Time.MarshalJSON's ValueError)."""

from __future__ import annotations

import json
import stat

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _wedge
from ansible_collections.hypeman.vgpu.tests.unit.hostile import property_settings

NOW = _gotime.to_unix_ns(_gotime.parse_rfc3339("2026-12-02T03:00:00Z"))
BOOT = NOW - 86400 * 1000000000
VF = "0000:82:00.4"
CARD = "0000:82:00.0"
MSG = "hypervisor with VFIO devices did not exit on SIGTERM; hard-killing, device may wedge"
OOM = "gpu-host kernel: Out of memory: Killed process 41235 (qemu-system-x86) total-vm:1kB"
INSTANCE = {"id": "inst-9", "pid": 41235, "vf_address": VF, "assigned_at": "2026-12-02T02:00:00Z", "boot_id": "",
            "device_path": "/sys/bus/pci/devices/%s" % VF}
FAR = ["9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59.999999999-00:01", "0000-01-01T00:00:00+00:01",
       "0000-01-01T00:00:00+23:59"]


def _json_line(moment):
    return json.dumps({"time": moment, "level": "WARN", "msg": MSG, "instance_id": "inst-1",
                       "device_path": "/sys/bus/pci/devices/%s" % VF})


def _attribute(signals):
    return _wedge.attribute(signals, [INSTANCE], {VF: CARD}, {}, "/nonexistent", "", BOOT, 0)


@pytest.mark.parametrize("moment", FAR)
def test_a_time_outside_the_years_go_renders_is_no_time(moment):
    text_line = "%s WARN %s instance_id=inst-1 device_path=/sys/bus/pci/devices/%s" % (moment, MSG, VF)
    for signal in (_wedge.parse_hypeman_line(_json_line(moment), NOW), _wedge.parse_hypeman_line(text_line, NOW),
                   _wedge.parse_kernel_line("%s %s" % (moment, OOM), NOW, BOOT)):
        assert signal["time_ns"] is None
        at_risk, unattributed, superseded = _attribute([dict(signal, source="x")])
        assert at_risk == [] and superseded == []
        assert unattributed[0]["time"] is None and unattributed[0]["why"] == "the line carries no time" \
            or "pid" in unattributed[0]["why"]
    # As for an unparseable time, the journal's time stands in.
    assert _wedge.parse_hypeman_line(_json_line(moment), NOW, NOW - 10 ** 9)["time_ns"] == NOW - 10 ** 9


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59.999999999Z", "0000-01-01T00:00:00Z",
                                    "9999-12-31T00:00:00-23:59", "0000-01-01T23:59:00+23:59"])
def test_the_edges_of_the_range_still_count(moment):
    signal = _wedge.parse_hypeman_line(_json_line(moment), NOW)
    assert signal["time_ns"] == _gotime.to_unix_ns(_gotime.parse_rfc3339(moment))
    _attribute([signal])


@pytest.mark.parametrize("stamp", ["9999999999999999999", "253402300800000000", "1" * 19])
def test_a_journal_time_past_year_9999_is_no_time(stamp):
    message, realtime = _wedge._journal_message({"MESSAGE": OOM, "__REALTIME_TIMESTAMP": stamp})
    assert message == OOM and realtime is None
    _message, realtime = _wedge._journal_message({"MESSAGE": OOM, "__REALTIME_TIMESTAMP": "253402300799999999"})
    assert realtime == 253402300799999999000  # 9999-12-31T23:59:59.999999Z


def test_collect_from_files_and_the_journal_never_raises(tmp_path):
    hyp, kern = tmp_path / "hypeman.log", tmp_path / "kern.log"
    hyp.write_text("\n".join(_json_line(moment) for moment in FAR) + "\n")
    kern.write_text("\n".join("%s %s" % (moment, OOM) for moment in FAR) + "\n")
    section = _wedge.collect(_wedge.Options(hypeman_log=str(hyp), kernel_log=str(kern)), str(tmp_path),
                             str(tmp_path), [INSTANCE], {VF: CARD}, now_ns=NOW)
    assert section["complete"] and section["at_risk_vfs"] == []
    # Without a time each log's lines are one event: the same instance and device, the same pid.
    assert [entry["reason"] for entry in section["unattributed"]] == ["vf_may_wedge", "oom_killed_qemu"]
    assert all(entry["time"] is None for entry in section["unattributed"])
    journalctl = tmp_path / "journalctl"
    entries = [{"MESSAGE": _json_line(FAR[0]), "__REALTIME_TIMESTAMP": "9999999999999999999"},
               {"MESSAGE": OOM, "__REALTIME_TIMESTAMP": "9999999999999999999"}]
    journalctl.write_text("#!/bin/sh\ncat <<'EOF'\n%s\nEOF\n" % "\n".join(json.dumps(e) for e in entries))
    journalctl.chmod(journalctl.stat().st_mode | stat.S_IXUSR)
    section = _wedge.collect(_wedge.Options(journalctl=str(journalctl)), str(tmp_path), str(tmp_path), [INSTANCE],
                             {VF: CARD}, now_ns=NOW)
    assert section["complete"] and section["at_risk_vfs"] == []
    assert [entry["time"] for entry in section["unattributed"]] == [None, None]
    json.dumps(section)


_YEAR_EDGES = st.sampled_from([(0, 1, 1), (0, 1, 2), (1, 1, 1), (9998, 12, 31), (9999, 12, 31), (9999, 12, 30)])


@property_settings(40)
@given(_YEAR_EDGES, st.integers(0, 86399), st.integers(0, 999999999), st.integers(-1439, 1439),
       st.integers(0, 10 ** 19 - 1))
def test_times_near_and_beyond_the_range_never_raise(date, second, nanos, offset, realtime_us):
    zone = "Z" if offset == 0 else "%s%02d:%02d" % ("+" if offset > 0 else "-", abs(offset) // 60, abs(offset) % 60)
    clock = (second // 3600, second // 60 % 60, second % 60, nanos, zone)
    moment = "%04d-%02d-%02dT%02d:%02d:%02d.%09d%s" % (date + clock)
    _message, realtime = _wedge._journal_message({"MESSAGE": OOM, "__REALTIME_TIMESTAMP": str(realtime_us)})
    signals = [_wedge.parse_hypeman_line(_json_line(moment), NOW, realtime),
               _wedge.parse_hypeman_line("%s WARN %s device_path=/sys/bus/pci/devices/%s" % (moment, MSG, VF), NOW),
               _wedge.parse_kernel_line("%s %s" % (moment, OOM), NOW, BOOT, realtime),
               _wedge.parse_kernel_line(OOM, NOW, BOOT, realtime)]
    for signal in signals:
        if signal["time_ns"] is not None:
            _gotime.format_utc_rfc3339nano(_gotime.from_unix_ns(signal["time_ns"]))  # renders
    json.dumps(_attribute([dict(signal, source="x") for signal in _wedge.dedupe(signals)]))
    # A signal built elsewhere with an unrenderable time is no time either.
    far = dict(signals[0], time_ns=253402300800 * 10 ** 9, source="x")
    assert _attribute([far])[1][0]["time"] is None
