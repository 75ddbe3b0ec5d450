# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulator's live wedge-risk triggers and its vsock era, read back by the collection's own helpers.

instance running -> hypeman hard-kills its QEMU after an ignored SIGTERM (or the
OOM killer kills it) -> the log line hypeman (or the kernel) writes -> _wedge
attributes it to the instance's VF.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman, _wedge
from ansible_collections.hypeman.vgpu.tests.sim import api as simapi
from ansible_collections.hypeman.vgpu.tests.sim import host as simhost
from ansible_collections.hypeman.vgpu.tests.sim import metrics as sim_metrics
from ansible_collections.hypeman.vgpu.tests.sim import sentinel as sim_sentinel
from ansible_collections.hypeman.vgpu.tests.sim.host import SimError, SimHost

PF = "0000:82:00.0"
LAYOUT = {"era": "vsock", "cards": [{"model": "L40S", "address": PF, "numvfs": 4}], "config": {"threshold": 2},
          "logs": {}}


@pytest.fixture
def vsock_host(tmp_path):
    host = SimHost(str(tmp_path / "host")).build(dict(LAYOUT, wedged=["%s@1" % PF]))
    yield host
    host.teardown()


def _api(host, grace=0.3):
    with host.open(write=False):
        paths = host.paths()
    return simapi.HypemanAPI(paths["config_path"], sysfs_root=paths["sysfs_root"], proc_root="/proc",
                             data_dir=paths["data_dir"], vfio_term_grace=grace)


def _at_risk(host, hypeman_log, kernel_log):
    """What the collection reports: _wedge over the host's metadata, as vgpu_placement_info reads it."""
    with host.open(write=False):
        paths, vfs = host.paths(), dict((vf, info["card"]) for vf, info in host.tree.vf_info.items())
    instances, _unreadable = _hypeman.list_instances(paths["data_dir"])
    options = _wedge.Options(hypeman_log=hypeman_log, kernel_log=kernel_log)
    return _wedge.collect(options, paths["sysfs_root"], "/proc", instances, vfs)


def test_a_vsock_era_boot_prints_no_marker_and_its_agent_answers(vsock_host):
    with vsock_host.open():
        vsock_host.boot("inst-ok", "%s@0" % PF)
        vsock_host.boot("inst-bad", "%s@1" % PF)
        data_dir = vsock_host.tree.data_dir
        assert vsock_host.status()["era"] == "vsock"
    for instance, line, answer in (("inst-ok", "GPU driver initialized", "ok"),
                                   ("inst-bad", "GPU init failure detected: NVRM", "failed")):
        with open(os.path.join(data_dir, "guests", instance, "logs", "app.log")) as handle:
            console = handle.read()
        assert "HYPEMAN-GPU-INIT" not in console and line in console
        with open(os.path.join(data_dir, "guests", instance, sim_sentinel.AGENT_STATE_FILE)) as handle:
            assert handle.read().strip() == answer
    counters = sim_metrics.SentinelCounters()
    sim_sentinel.VsockSentinel(_api(vsock_host), counters).poll_once()
    assert counters.checks == {"ok": 1, "failed": 1} and counters.init_failures == 1


_VMM_STOPPED_AT_ITS_SOCKET = """
import os, signal, sys
from ansible_collections.hypeman.vgpu.tests.sim import daemons
rename = os.rename
def rename_then_stop(src, dst):
    rename(src, dst)
    os.kill(os.getpid(), signal.SIGSTOP)
os.rename = rename_then_stop
sys.exit(daemons.run_vmm("inst-a", sys.argv[1], []))
"""


def _proc_status(pid, field):
    with open("/proc/%d/status" % pid) as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return line.split()[1]
    return None


def test_a_vmm_ignores_a_sigterm_sent_with_its_sigusr1_as_soon_as_its_socket_exists(tmp_path):
    # hard_kill sends SIGUSR1 once the boot saw the socket, and the hypeman stand-in SIGTERM right
    # after: under load both were pending before the VMM ran again, and it once exited on SIGTERM
    # (its SIGTERM handler came after the socket, SIG_IGN from the SIGUSR1 handler). This VMM stops
    # itself right after the socket appears, the worst moment, and gets both signals there.
    socket_path = str(tmp_path / "qemu.sock")
    vmm = subprocess.Popen([sys.executable, "-c", _VMM_STOPPED_AT_ITS_SOCKET, socket_path],
                           env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and vmm.poll() is None and _proc_status(vmm.pid, "State") != "T":
            time.sleep(0.02)
        assert _proc_status(vmm.pid, "State") == "T" and os.path.exists(socket_path)
        caught = int(_proc_status(vmm.pid, "SigCgt"), 16)
        assert [sig.name for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1) if not caught >> (sig - 1) & 1] == []
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGCONT):
            os.kill(vmm.pid, sig)
        time.sleep(0.5)
        assert vmm.poll() is None, "the stuck VMM exited on SIGTERM"
        os.kill(vmm.pid, signal.SIGINT)  # a stuck VMM still stops on SIGINT
        assert vmm.wait(timeout=10) == 0
    finally:
        if vmm.poll() is None:
            vmm.kill()
            vmm.wait()


def test_hard_kill_after_an_ignored_sigterm_logs_device_may_wedge_and_the_vf_is_at_risk(vsock_host, tmp_path):
    api, journal = _api(vsock_host), io.StringIO()
    with vsock_host.open():
        record = dict(vsock_host.boot("inst-a", "%s@0" % PF))
        result = vsock_host.hard_kill("inst-a", lambda instance: api.terminate_then_kill(instance, out=journal))
        kernel_log = vsock_host.tree.kernel_log_path
    assert result["hard_killed"] and result["vf"] == record["vf"]
    assert not simhost.pid_alive(record["pid"], record["start_time"])
    (line,) = journal.getvalue().splitlines()
    entry = json.loads(line)  # hypeman's slog JSON, docs/hypeman-interface.md §8.1
    assert entry["level"] == "WARN" and entry["instance_id"] == "inst-a" and entry["subsystem"] == "INSTANCES"
    assert entry["device_path"] == "/sys/bus/pci/devices/%s" % record["vf"]
    assert entry["msg"] == ("hypervisor with VFIO devices did not exit on SIGTERM; hard-killing, device may wedge "
                            "if the guest driver was initializing")
    hypeman_log = tmp_path / "journal.log"
    hypeman_log.write_text(journal.getvalue())
    section = _at_risk(vsock_host, str(hypeman_log), kernel_log)
    assert section["complete"], section["sources"]
    assert [(v["vf"], v["reason"], v["instance_id"]) for v in section["at_risk_vfs"]] == [
        (record["vf"], "vf_may_wedge", "inst-a")]
    # hypeman released the claim after the stop.
    with open(os.path.join(vsock_host.root, "var/lib/hypeman/guests/inst-a/metadata.json")) as handle:
        assert json.load(handle)["GPUDevicePath"] == ""


def test_a_qemu_that_exits_on_sigterm_is_no_hard_kill(vsock_host):
    api, journal = _api(vsock_host, grace=5.0), io.StringIO()
    with vsock_host.open():
        vsock_host.boot("inst-a", "%s@0" % PF)
        answer = api.terminate_then_kill("inst-a", out=journal)
        with pytest.raises(SimError, match="not running"):
            vsock_host.hard_kill("inst-a", api.terminate_then_kill)
    assert answer == {"hard_killed": False, "reason": "exited on SIGTERM"} and journal.getvalue() == ""


def test_an_oom_kill_writes_the_kernel_lines_and_the_agent_stops_answering(vsock_host):
    with vsock_host.open():
        record = dict(vsock_host.boot("inst-a", "%s@0" % PF))
        result = vsock_host.oom_kill("inst-a")
        kernel_log, hypeman_log = vsock_host.tree.kernel_log_path, vsock_host.tree.hypeman_log_path
    assert not simhost.pid_alive(record["pid"], record["start_time"])
    with open(kernel_log) as handle:
        lines = handle.read().splitlines()
    assert lines == result["lines"] and len(lines) == 2
    assert "Out of memory: Killed process %d (qemu-system-x86)" % record["pid"] in lines[1]
    section = _at_risk(vsock_host, hypeman_log, kernel_log)
    assert [(v["vf"], v["reason"], v["instance_id"]) for v in section["at_risk_vfs"]] == [
        (record["vf"], "oom_killed_qemu", "inst-a")]
    # hypeman's sentinel still polls the instance (its metadata claims the VF); the dial fails.
    counters = sim_metrics.SentinelCounters()
    sim_sentinel.VsockSentinel(_api(vsock_host), counters).poll_once()
    assert counters.checks == {"rpc_error": 1}


def test_the_cli_drives_a_live_hard_kill_through_the_running_api(vsock_host, tmp_path):
    env = dict(os.environ, PYTHONPATH=simhost.PACKAGE_PARENT)
    base = [sys.executable, "-m", "tests.sim", "--root", vsock_host.root]
    with vsock_host.open():
        record = dict(vsock_host.boot("inst-a", "%s@0" % PF))
    out = tmp_path / "hypeman.out"
    with open(str(out), "w") as handle:
        api = subprocess.Popen(base + ["api", "--listen", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                                       "--vfio-term-grace", "0.3"], stdout=handle, stderr=subprocess.DEVNULL, env=env)
    try:
        info = os.path.join(vsock_host.meta_dir, "api.json")
        deadline = time.time() + 30
        while not os.path.exists(info) and time.time() < deadline and api.poll() is None:
            time.sleep(0.05)
        with open(info) as handle:
            assert json.load(handle)["era"] == "vsock"  # the host's era, untold
        agent_file = os.path.join(vsock_host.root, "var/lib/hypeman/guests/inst-a", sim_sentinel.AGENT_STATE_FILE)
        done = subprocess.run(base + ["agent", "inst-a", "--state", "unsupported"], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        with open(agent_file) as handle:
            assert handle.read().strip() == "unsupported"
        missing = subprocess.run(base + ["agent", "inst-zz", "--state", "ok"], env=env, capture_output=True,
                                 text=True, timeout=60, check=False)
        assert missing.returncode == 1 and "no instance inst-zz" in missing.stderr
        done = subprocess.run(base + ["hard-kill", "inst-a"], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["hard_killed"] is True
        refused = subprocess.run(base + ["hard-kill", "inst-a"], env=env, capture_output=True, text=True,
                                 timeout=60, check=False)
        assert refused.returncode == 1 and "inst-a is not running" in refused.stderr
    finally:
        api.terminate()
        api.wait(10)
    wedge_lines = [line for line in out.read_text().splitlines() if "device may wedge" in line]
    assert len(wedge_lines) == 1 and json.loads(wedge_lines[0])["instance_id"] == "inst-a"
    assert not simhost.pid_alive(record["pid"], record["start_time"])
