# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_host verify, last: a simulated reboot brings the VFs back before hypeman starts.

The simulated sysfs survives a container restart, so the allowed card's
SR-IOV is disabled first (as a real reboot leaves it); the restart then boots
the container's systemd, whose SR-IOV unit must enable it before hypeman.
"""

from __future__ import annotations

import subprocess
import time

ROOT = "/srv/vgpu-sim"
CARD = "0000:e3:00.0"
UNIT = "hypeman-vgpu-sriov-0000-e3-00.0.service"
CARD_DIR = ROOT + "/sys/bus/pci/devices/" + CARD


def virtfns(sh):
    return [name for name in sh.check_output("ls %s" % CARD_DIR).split() if name.startswith("virtfn")]


def show(sh, unit, prop):
    return sh.check_output("systemctl show -p %s --value %s" % (prop, unit))


def test_vfs_exist_before_hypeman_starts_after_a_reboot(sh):
    # As the runbook does: DCGM holds the GPU (it starts at boot) and blocks sriov-manage.
    sh.check_output("systemctl stop nvidia-dcgm-exporter.service nvidia-dcgm.service")
    sh.check_output("%s/usr/lib/nvidia/sriov-manage -d %s" % (ROOT, CARD))
    assert virtfns(sh) == []

    subprocess.run(["podman", "restart", sh.backend.name], check=True, timeout=300,
                   stdout=subprocess.DEVNULL)
    # Right after the restart, exec can run before systemd answers: ask again (hang detector: 240 s).
    deadline = time.monotonic() + 240
    state = ""
    while state not in ("running", "degraded"):
        assert time.monotonic() < deadline, "systemd did not finish booting (%r)" % state
        time.sleep(1)
        state = sh.run("systemctl is-system-running --wait").stdout.strip()

    assert len(virtfns(sh)) == 32
    # The unit ran (its condition held: no VFs at boot) and succeeded ...
    assert show(sh, UNIT, "ConditionResult") == "yes"
    assert show(sh, UNIT, "Result") == "success"
    assert show(sh, UNIT, "ActiveState") == "active"
    # ... and finished before hypeman's (and DCGM's) process started.
    sriov_done = int(show(sh, UNIT, "ActiveEnterTimestampMonotonic"))
    for unit in ("hypeman.service", "nvidia-dcgm.service"):
        assert 0 < sriov_done <= int(show(sh, unit, "ExecMainStartTimestampMonotonic")), unit
    assert show(sh, "hypeman.service", "ActiveState") == "active"
