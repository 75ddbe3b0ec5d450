# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_wedge: hypeman's "device may wedge" lines and kernel OOM kills, attributed to VFs; hostile logs never crash."""

from __future__ import annotations

import json
import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _wedge
from ansible_collections.hypeman.vgpu.plugins.module_utils._ledger import Ledger

settings.register_profile("fuzz", max_examples=3000, deadline=None)
settings.register_profile("default", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

NOW = _gotime.to_unix_ns(_gotime.parse_rfc3339("2026-12-02T03:00:00Z"))
BOOT = NOW - 86400 * 1000000000
VF = "0000:82:00.4"
CARD = "0000:82:00.0"
HYPEMAN_JSON = ('{"time":"2026-12-02T02:40:00.123456789Z","level":"WARN","msg":"hypervisor with VFIO devices did not '
                'exit on SIGTERM; hard-killing, device may wedge if the guest driver was initializing",'
                '"instance_id":"inst-1","device_path":"/sys/bus/pci/devices/0000:82:00.4","subsystem":"INSTANCES"}')
OOM_LINE = ("2026-12-02T02:50:00.000000+00:00 gpu-host kernel: Out of memory: Killed process 41235 (qemu-system-x86) "
            "total-vm:67108864kB, anon-rss:33554432kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:65536kB "
            "oom_score_adj:0")
OOM_SUMMARY = ("2026-12-02T02:50:00.000000+00:00 gpu-host kernel: oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),"
               "cpuset=/,mems_allowed=0,global_oom,task_memcg=/system.slice/hypeman.service,task=qemu-system-x86,"
               "pid=41235,uid=0")


def _instance(pid=41235, vf=VF, assigned_at="2026-12-02T02:00:00Z", boot_id="boot-a", instance_id="inst-9"):
    return {"id": instance_id, "pid": pid, "vf_address": vf, "assigned_at": assigned_at, "boot_id": boot_id,
            "device_path": "/sys/bus/pci/devices/%s" % vf if vf else None}


def _attribute(signals, instances=(), cleared=None, since=NOW - 7 * 86400 * 1000000000):
    return _wedge.attribute(_wedge.dedupe(signals), list(instances), {VF: CARD}, cleared or {}, "/nonexistent",
                            "boot-a", BOOT, since)


def test_hypeman_json_line_names_vf_instance_and_time():
    signal = _wedge.parse_hypeman_line(HYPEMAN_JSON, NOW)
    assert signal["instance_id"] == "inst-1"
    assert signal["device_path"] == "/sys/bus/pci/devices/0000:82:00.4"
    at_risk, unattributed, _superseded = _attribute([signal])
    assert unattributed == []
    assert at_risk[0]["vf"] == VF and at_risk[0]["card"] == CARD and at_risk[0]["reason"] == "vf_may_wedge"
    assert at_risk[0]["time"] == "2026-12-02T02:40:00.123456789Z"
    assert at_risk[0]["evidence"][0]["line"] == HYPEMAN_JSON


def test_text_line_and_gpu_md_wording_count_too():
    line = ('2026-12-02T02:41:00Z WARN VF may wedge after a hard kill instance_id=inst-2 '
            'device_path=/sys/bus/pci/devices/0000:82:00.4')
    signal = _wedge.parse_hypeman_line(line, NOW)
    assert (signal["instance_id"], signal["time_ns"]) == ("inst-2", NOW - 19 * 60 * 1000000000)


def test_other_hypeman_lines_are_no_signal():
    assert _wedge.parse_hypeman_line('{"msg":"quarantined wedged vGPU VF","vf":"0000:82:00.4"}', NOW) is None
    # The marker only inside another attribute of a JSON line is not hypeman's warning.
    line = '{"msg":"instance created","name":"device may wedge"}'
    signal = _wedge.parse_hypeman_line(line, NOW, fallback_ns=NOW)
    assert signal is None or signal["device_path"] is None


def test_oom_kill_is_attributed_through_the_recorded_hypervisor_pid():
    signals = [_wedge.parse_kernel_line(OOM_SUMMARY, NOW, BOOT), _wedge.parse_kernel_line(OOM_LINE, NOW, BOOT)]
    at_risk, unattributed, _superseded = _attribute(signals, [_instance()])
    assert unattributed == []
    assert len(at_risk) == 1 and at_risk[0]["signals"] == 1, "the two kernel lines of one kill are one signal"
    assert at_risk[0]["reason"] == "oom_killed_qemu" and at_risk[0]["instance_id"] == "inst-9"
    assert "Killed process 41235" in at_risk[0]["evidence"][0]["line"]


@pytest.mark.parametrize("instance, why", [
    (_instance(pid=1), "pid 41235 is no instance"),
    (_instance(assigned_at="2026-12-02T02:55:00Z"), "pid 41235 is no instance"),  # claimed after the kill
    (_instance(boot_id="boot-old"), "pid 41235 is no instance"),  # that pid was another boot's
    (_instance(vf=None), "pid 41235 is no instance"),  # no VF claimed
])
def test_an_oom_kill_no_instance_explains_is_unattributed(instance, why):
    at_risk, unattributed, _superseded = _attribute([_wedge.parse_kernel_line(OOM_LINE, NOW, BOOT)], [instance])
    assert at_risk == []
    assert unattributed[0]["why"].startswith(why) and unattributed[0]["pid"] == 41235


def test_older_kernel_formats_and_times():
    dmesg = "[ 3600.500000] Memory cgroup out of memory: Killed process 777 (qemu-system-x86) total-vm:1kB"
    signal = _wedge.parse_kernel_line(dmesg, NOW, BOOT)
    assert (signal["pid"], signal["time_ns"]) == (777, BOOT + 3600500000000)
    old = "Dec  2 02:50:00 host kernel: [ 1.0] Killed process 778 (qemu-system-x86) total-vm:1kB, anon-rss:1kB"
    assert _wedge.parse_kernel_line(old, NOW, BOOT)["pid"] == 778
    assert _wedge.parse_kernel_line("oom_reaper: reaped process 778 (qemu-system-x86), now anon-rss:0kB", NOW) is None


def test_signals_before_boot_window_or_ledger_clear_do_not_count():
    signal = _wedge.parse_hypeman_line(HYPEMAN_JSON, NOW)
    stamp = signal["time_ns"]
    at_risk, _unattributed, superseded = _attribute([signal], cleared={VF: stamp + 1})
    assert at_risk == [] and superseded[0]["why"].startswith("the ledger clears the VF after it")
    at_risk, _unattributed, superseded = _attribute([dict(signal, time_ns=BOOT - 1)])
    assert at_risk == [] and superseded[0]["why"] == "before this boot"
    at_risk, _unattributed, superseded = _attribute([signal], since=stamp + 1)
    assert at_risk == [] and superseded[0]["why"] == "older than the look-back window"
    at_risk, _unattributed, _superseded = _attribute([signal], cleared={VF: stamp - 1})
    assert at_risk[0]["vf"] == VF, "a clear before the signal does not supersede it"


def test_ledger_clears_take_each_vfs_latest_clear_or_repair():
    entries = [{"time": "2026-12-01T00:00:00Z", "action": "clear", "vf_address": VF},
               {"time": "2026-12-02T00:00:00Z", "action": "repair", "vf_address": VF},
               {"time": "2026-12-03T00:00:00Z", "action": "quarantine", "vf_address": VF}]
    cleared = _wedge.ledger_clears(Ledger("/x", True, entries, []))
    assert cleared == {VF: _gotime.to_unix_ns(_gotime.parse_rfc3339("2026-12-02T00:00:00Z"))}


def test_sources_from_files_and_their_absence(tmp_path):
    hyp, kern, proc = tmp_path / "hypeman.log", tmp_path / "kern.log", tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu 1 2 3\nbtime %d\n" % (BOOT // 1000000000))
    hyp.write_text("garbage\n" + HYPEMAN_JSON + "\n")
    kern.write_bytes(b"\xff\xfe not utf-8\n" + OOM_LINE.encode() + b"\n")
    options = _wedge.Options(hypeman_log=str(hyp), kernel_log=str(kern))
    section = _wedge.collect(options, str(tmp_path), str(proc), [_instance()], {VF: CARD}, now_ns=NOW)
    assert section["complete"] and section["boot_time"] is not None
    assert [s["signals"] for s in section["sources"]] == [1, 1]
    assert [v["vf"] for v in section["at_risk_vfs"]] == [VF]
    assert sorted(section["at_risk_vfs"][0]["reasons"]) == ["oom_killed_qemu", "vf_may_wedge"]
    os.unlink(str(kern))
    os.mkfifo(str(kern))
    section = _wedge.collect(options, str(tmp_path), str(proc), [], {}, now_ns=NOW)
    assert not section["complete"] and "FIFO" in section["sources"][1]["error"]
    assert str(kern) in section["sources"][1]["error"]


def test_a_missing_journalctl_is_a_source_error_not_a_failure(tmp_path):
    options = _wedge.Options(journalctl=str(tmp_path / "no-journalctl"))
    section = _wedge.collect(options, str(tmp_path), str(tmp_path), [], {}, now_ns=NOW)
    assert not section["complete"]
    assert all("command not found" in s["error"] for s in section["sources"])


def test_journal_json_is_read_newest_first_with_binary_messages(tmp_path):
    fake = tmp_path / "journalctl"
    entries = [{"MESSAGE": HYPEMAN_JSON, "__REALTIME_TIMESTAMP": str(NOW // 1000)},
               {"MESSAGE": list(OOM_LINE.encode()), "__REALTIME_TIMESTAMP": str(NOW // 1000)},
               {"MESSAGE": None}, "not an object"]
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n%s\nEOF\n" % "\n".join(json.dumps(e) for e in entries))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    messages, truncated = _wedge.read_journal(str(fake), ["--unit=hypeman.service"], 0)
    assert not truncated
    assert [m for m, _stamp in messages] == [HYPEMAN_JSON, OOM_LINE]


def test_a_failing_journalctl_names_the_command(tmp_path):
    fake = tmp_path / "journalctl"
    fake.write_text("#!/bin/sh\necho 'No journal files were found.' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    section = _wedge.collect(_wedge.Options(journalctl=str(fake)), str(tmp_path), str(tmp_path), [], {}, now_ns=NOW)
    assert "No journal files were found." in section["sources"][0]["error"]
    assert "--unit=hypeman.service" in section["sources"][0]["error"]


def test_a_huge_log_is_read_from_its_end(tmp_path):
    path = tmp_path / "hypeman.log"
    with open(str(path), "wb") as handle:
        handle.truncate(3 * 1024 * 1024)  # sparse zeros, no newline
        handle.seek(0, 2)
        handle.write(b"\n" + HYPEMAN_JSON.encode() + b"\n")
    lines, truncated = _wedge.read_tail(str(path), limit=1024 * 1024)
    assert truncated and HYPEMAN_JSON in lines


_LINE_PIECES = st.sampled_from([
    "device may wedge", "VF may wedge", "Killed process ", "oom-kill:", "task=", ",pid=", "instance_id=",
    "device_path=", "time=", "{", "}", "\"", "(", ")", "[", "]", " ", "0", "4294967296", "-1", "\\",
    "2026-12-02T02:40:00Z ", "Dec  2 02:50:00 ", "[ 12.5] ", "\x00", "\udcff", "/sys/bus/mdev/devices/x/",
    '{"msg":"device may wedge","time":', '"instance_id":[1]', '"device_path":{"a":1}', "é"])


@given(st.lists(st.one_of(_LINE_PIECES, st.text(max_size=40)), max_size=30).map("".join))
def test_hostile_lines_never_raise(line):
    for signal in (_wedge.parse_hypeman_line(line, NOW, NOW), _wedge.parse_kernel_line(line, NOW, BOOT, NOW)):
        if signal is not None:
            at_risk, unattributed, superseded = _attribute([signal], [_instance(pid=signal["pid"] or 1)])
            json.dumps([at_risk, unattributed, superseded])  # every result is plain data


@given(st.binary(max_size=2000))
def test_hostile_log_bytes_never_raise(tmp_path_factory, data):
    base = tmp_path_factory.mktemp("logs")
    for name in ("hypeman.log", "kern.log"):
        (base / name).write_bytes(data)
    options = _wedge.Options(hypeman_log=str(base / "hypeman.log"), kernel_log=str(base / "kern.log"))
    section = _wedge.collect(options, str(base), str(base), [_instance()], {VF: CARD}, now_ns=NOW)
    assert section["complete"]
    json.dumps(section)
