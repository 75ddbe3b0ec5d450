# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Simulator self-tests: boot/stop with real VMM stand-ins, markers, sriov-manage, DCGM, faults."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from ansible_collections.hypeman.vgpu.tests.sim import host as simhost
from ansible_collections.hypeman.vgpu.tests.sim.host import SimError, SimHost

# hypeman's newest app.log patterns, copied from docs/hypeman-interface.md (§5.2).
FAILED_RE = re.compile(r'^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} \[guest-agent\] (HYPEMAN-GPU-INIT-FAILED ts=\S+ '
                       r'nvrm="NVRM: [^"\r\n]*RmInitAdapter failed![^"\r\n]*")\r?\n?$')
OK_RE = re.compile(r'^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} \[guest-agent\] (HYPEMAN-GPU-INIT-OK ts=\S+)\r?\n?$')
PF_A, PF_B = "0000:82:00.0", "0000:e3:00.0"
LAYOUT = {"cards": [{"model": "L40S", "address": PF_A, "numvfs": 4},
                    {"model": "L40S", "address": PF_B, "numvfs": 4}],
          "config": {"threshold": 2}}


def run_cli(root, *args):
    env = dict(os.environ, PYTHONPATH=simhost.PACKAGE_PARENT)
    return subprocess.run([sys.executable, "-m", "tests.sim", "--root", str(root)] + list(args),
                          env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def sim(tmp_path):
    root = tmp_path / "host"
    host = SimHost(str(root)).build(LAYOUT)
    host.test_processes = []  # started by a test; stopped here whatever happens
    yield host
    for proc in host.test_processes:
        proc.terminate()
        proc.wait(10)
    host.teardown()


def _meta(host, instance_id):
    with host.open(write=False):
        path = os.path.join(host.tree.data_dir, "guests", instance_id, "metadata.json")
    with open(path) as handle:
        return json.load(handle)


def _fd_targets(pid):
    fd_dir = "/proc/%d/fd" % pid
    return sorted(os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir))


def _markers(path):
    with open(path) as handle:
        lines = handle.readlines()
    return ([FAILED_RE.match(line).group(1) for line in lines if FAILED_RE.match(line)],
            [OK_RE.match(line).group(1) for line in lines if OK_RE.match(line)])


def test_boot_both_builds_with_real_vmm_and_markers(sim):
    host = sim
    with host.open():
        host.wedge("%s@1" % PF_A)
        a = host.boot("inst-a", "%s@0" % PF_A, profile="NVIDIA L40S-2Q", build="claimed")
        b = host.boot("inst-b", "%s@1" % PF_A, profile="NVIDIA L40S-2Q", build="assigned")
        paths = host.paths()
        nodes = dict((vf, host.tree.vf_nodes(vf)) for vf in (a["vf"], b["vf"]))
    meta_a, meta_b = _meta(host, "inst-a"), _meta(host, "inst-b")
    assert meta_a["GPUClaimedAt"] == a["claimed_at"] and "GPUAssignedAt" not in meta_a
    assert meta_b["GPUAssignedAt"] == b["claimed_at"] and meta_b["GPURetainedForCleanup"] is False
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z$", a["claimed_at"])
    assert meta_a["GPUDevicePath"] == "/sys/bus/pci/devices/0000:82:00.4"
    with open(os.path.join(paths["sysfs_root"], "bus/pci/devices/0000:82:00.4/nvidia/current_vgpu_type")) as handle:
        assert handle.read().strip() == "1148"  # L40S-2Q
    for meta, rec in ((meta_a, a), (meta_b, b)):
        # Liveness evidence hypeman reads: PID, /proc/<pid>/stat field 22, boot id, control socket.
        assert meta["HypervisorPID"] == rec["pid"] and simhost.pid_alive(rec["pid"], meta["HypervisorStartTime"])
        with open("/proc/sys/kernel/random/boot_id") as handle:
            assert meta["HypervisorBootID"] == handle.read().strip()
        held = [os.path.join(paths["dev_root"], n) for n in nodes[rec["vf"]]]
        assert set(held) <= set(_fd_targets(rec["pid"]))
        assert os.path.exists(meta["SocketPath"])
        with open("/proc/%d/comm" % rec["pid"]) as handle:
            assert handle.read().strip() == "qemu-system-x86"
    failed_a, ok_a = _markers(os.path.join(paths["data_dir"], "guests/inst-a/logs/app.log"))
    failed_b, ok_b = _markers(os.path.join(paths["data_dir"], "guests/inst-b/logs/app.log"))
    assert failed_a == [] and len(ok_a) == 3 and len(set(ok_a)) == 1  # three copies, same ts
    assert ok_b == [] and len(failed_b) == 3 and len(set(failed_b)) == 1


def test_reboot_archives_app_log_and_stop_releases(sim):
    host = sim
    with host.open():
        first = dict(host.boot("inst-a", "%s@0" % PF_A))
        with pytest.raises(SimError, match="is running"):
            host.boot("inst-a", "%s@0" % PF_A)
        with pytest.raises(SimError, match="claimed by instance inst-a"):
            host.boot("inst-z", "%s@0" % PF_A)
        stopped = host.stop("inst-a")
        logs = os.path.join(host.tree.data_dir, "guests/inst-a/logs")
        assert not simhost.pid_alive(first["pid"], first["start_time"]) and stopped["pid"] is None
        meta = _meta(host, "inst-a")
        assert meta["GPUDevicePath"] == "" and meta["GPUClaimedAt"] is None and meta["GPUProfile"]
        with open(host.tree.pci_path(first["vf"], "nvidia", "current_vgpu_type")) as handle:
            assert handle.read().strip() == "0"
        before = time.time_ns()
        second = host.boot("inst-a", "%s@0" % PF_A)
    archives = [n for n in os.listdir(logs) if n.startswith("app.log.prev.")]
    assert len(archives) == 1 and int(archives[0].rsplit(".", 1)[1]) >= before
    assert second["claimed_at"] != first["claimed_at"]
    assert len(_markers(os.path.join(logs, archives[0]))[1]) == 3  # the first boot's markers moved


def test_stop_keep_claim_and_quarantined_vf_is_refused(sim):
    host = sim
    with host.open():
        host.boot("inst-a", "%s@0" % PF_A)
        host.stop("inst-a", keep_claim=True)
        assert _meta(host, "inst-a")["GPUDevicePath"].endswith(host.tree.cards[PF_A].vfs[0])
        host.tree.write_store([{"vf_address": host.tree.cards[PF_A].vfs[2], "quarantined_at": "2026-08-22T00:00:00Z"}])
        with pytest.raises(SimError, match="is quarantined"):
            host.boot("inst-b", "%s@2" % PF_A)


def test_rotate_and_forge(sim):
    host = sim
    with host.open():
        host.boot("inst-a", "%s@0" % PF_A)
        log = host.rotate("inst-a")
        forged = host.forge("inst-a")
    assert os.path.getsize(log) > 0 and len(_markers(log + ".1")[1]) == 3
    assert _markers(log) == ([], []) and len(forged) >= 10  # none of the forgeries match


def _start_dcgm(root):
    env = dict(os.environ, PYTHONPATH=simhost.PACKAGE_PARENT)
    proc = subprocess.Popen([sys.executable, "-m", "tests.sim", "--root", str(root), "dcgm"], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert "holds" in proc.stdout.readline()
    return proc


def test_sriov_manage_refuses_while_dcgm_runs_and_succeeds_after(sim):
    host = sim
    sriov = os.path.join(host.root, "usr/lib/nvidia/sriov-manage")
    dcgm = _start_dcgm(host.root)
    host.test_processes.append(dcgm)
    result = subprocess.run([sriov, "-d", PF_A], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "Cannot obtain unbindLock" in result.stderr and "nv-hostengine" in result.stderr
    assert len(os.listdir(os.path.join(host.root, "sys/devices/pci0000:82"))) == 5  # PF + 4 VFs untouched
    dcgm.terminate()
    dcgm.wait(10)
    result = subprocess.run([sriov, "-d", PF_A], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    pf_dir = os.path.join(host.root, "sys/bus/pci/devices", PF_A)
    with open(os.path.join(pf_dir, "sriov_numvfs")) as handle:
        assert handle.read().strip() == "0"
    assert not [n for n in os.listdir(pf_dir) if n.startswith("virtfn")]
    assert subprocess.run([sriov, "-e", PF_A], check=False).returncode == 0
    with open(os.path.join(pf_dir, "sriov_numvfs")) as handle:
        assert handle.read().strip() == "32"
    vf = os.path.basename(os.readlink(os.path.join(pf_dir, "virtfn0")))
    with open(os.path.join(host.root, "sys/bus/pci/devices", vf, "nvidia/creatable_vgpu_types")) as handle:
        assert len(handle.read().splitlines()) == 23  # header + 22 types


def test_sriov_disable_refuses_a_stray_holder_and_a_running_vmm(sim):
    host = sim
    held = run_cli(host.root, "hold", PF_B)
    assert held.returncode == 0, held.stderr
    result = run_cli(host.root, "sriov-manage", "-d", PF_B)
    assert result.returncode == 1 and "nvidia-smi" in result.stderr
    assert run_cli(host.root, "sriov-manage", "-d", PF_A).returncode == 0  # only PF_B is held
    with host.open():
        host.sriov_enable(PF_A)
        host.boot("inst-a", "%s@0" % PF_A)
    result = run_cli(host.root, "sriov-manage", "-d", PF_A)
    assert result.returncode == 1 and "VFs in use" in result.stderr
    assert json.loads(run_cli(host.root, "teardown").stdout)["stopped"]


def test_sriov_fault_switches(sim):
    host = sim
    assert run_cli(host.root, "sriov-manage", "-d", PF_A).returncode == 0
    assert run_cli(host.root, "fault", "set", "disable_fails").returncode == 0
    assert run_cli(host.root, "sriov-manage", "-d", PF_B).returncode == 1
    run_cli(host.root, "fault", "set", "enable_noop")
    assert run_cli(host.root, "sriov-manage", "-e", PF_A).returncode == 0
    pf_dir = os.path.join(host.root, "sys/bus/pci/devices", PF_A)
    with open(os.path.join(pf_dir, "sriov_numvfs")) as handle:
        assert handle.read().strip() == "0"  # exit 0, no VFs: callers must check sysfs
    run_cli(host.root, "fault", "clear")
    run_cli(host.root, "fault", "set", "enable_no_types")
    assert run_cli(host.root, "sriov-manage", "-e", PF_A).returncode == 0
    vf = os.path.basename(os.readlink(os.path.join(pf_dir, "virtfn0")))
    with open(os.path.join(host.root, "sys/bus/pci/devices", vf, "nvidia/creatable_vgpu_types")) as handle:
        assert handle.read() == "ID    : vGPU Name\n"
    run_cli(host.root, "fault", "clear")
    assert run_cli(host.root, "sriov-manage", "-d", PF_A).returncode == 0
    run_cli(host.root, "fault", "set", "enable_slow", "0.5")
    assert run_cli(host.root, "sriov-manage", "-e", PF_A).returncode == 0
    with open(os.path.join(pf_dir, "sriov_numvfs")) as handle:
        assert handle.read().strip() == "0"  # not yet
    deadline = time.time() + 20
    while time.time() < deadline and not os.path.exists(os.path.join(pf_dir, "virtfn31")):
        time.sleep(0.1)
    assert os.path.exists(os.path.join(pf_dir, "virtfn31"))
    unknown = run_cli(host.root, "fault", "set", "no_such")
    assert unknown.returncode == 1 and "unknown fault" in unknown.stderr


def test_sriov_cycle_clears_the_wedge(sim):
    host = sim
    with host.open():
        host.wedge("%s@0" % PF_A)
        host.sriov_disable(PF_A)
        host.sriov_enable(PF_A)
        assert host.state["wedged"] == []
        rec = host.boot("inst-a", "%s@0" % PF_A)
    assert not rec["wedged_boot"]


def test_teardown_stops_every_spawned_process(sim):
    host = sim
    with host.open():
        pids = [host.boot("inst-%d" % i, "%s@%d" % (PF_A, i))["pid"] for i in range(2)]
    holder = json.loads(run_cli(host.root, "hold", PF_B).stdout)["pid"]
    assert all(simhost.pid_alive(p) for p in pids + [holder])
    stopped = json.loads(run_cli(host.root, "teardown", "--remove").stdout)["stopped"]
    assert sorted(stopped) == sorted(pids + [holder])
    deadline = time.time() + 5
    while time.time() < deadline and any(simhost.pid_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(simhost.pid_alive(p) for p in pids + [holder]) and not os.path.exists(host.root)


def test_cli_status_paths_and_refusals(sim):
    host = sim
    status = json.loads(run_cli(host.root, "status").stdout)
    assert [c["address"] for c in status["cards"]] == [PF_A, PF_B] and status["paths"]["proc_root"] == "/proc"
    assert run_cli(host.root, "build", "--preset", "empty").returncode == 1  # exists; needs --force
    result = run_cli(host.root, "boot", "x", "--vf", "0000:99:00.4")
    assert result.returncode == 1 and "no VF" in result.stderr and "Traceback" not in result.stderr
    result = run_cli(host.root, "boot", "x", "--vf", "%s@0" % PF_A, "--profile", "NVIDIA L40S-999Q")
    assert result.returncode == 1 and "Traceback" not in result.stderr
