# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_host verify, last: a simulated reboot brings the VFs back before hypeman starts.

The simulated sysfs survives a container restart, so the allowed card's
SR-IOV is disabled first (as a real reboot leaves it); the restart then boots
the container's systemd, whose SR-IOV unit must enable it before hypeman.
"""

from __future__ import annotations

import subprocess

ROOT = "/srv/vgpu-sim"
CARD = "0000:e3:00.0"
UNIT = "hypeman-vgpu-sriov-0000-e3-00.0.service"
CARD_DIR = ROOT + "/sys/bus/pci/devices/" + CARD


def virtfns(sh):
    return [name for name in sh.check_output("ls %s" % CARD_DIR).split() if name.startswith("virtfn")]


def show(sh, unit, prop):
    return sh.check_output("systemctl show -p %s --value %s" % (prop, unit))


def test_vfs_exist_before_hypeman_starts_after_a_reboot(sh):
    sh.check_output("%s/usr/lib/nvidia/sriov-manage -d %s" % (ROOT, CARD))
    assert virtfns(sh) == []

    subprocess.run(["podman", "restart", sh.backend.name], check=True, timeout=300,
                   stdout=subprocess.DEVNULL)
    state = sh.run("timeout 240 systemctl is-system-running --wait").stdout.strip()
    assert state in ("running", "degraded"), sh.run("systemctl --failed --no-pager").stdout

    assert len(virtfns(sh)) == 32
    # The unit ran (its condition held: no VFs at boot) and succeeded ...
    assert show(sh, UNIT, "ConditionResult") == "yes"
    assert show(sh, UNIT, "Result") == "success"
    assert show(sh, UNIT, "ActiveState") == "active"
    # ... and finished before hypeman's process started.
    sriov_done = int(show(sh, UNIT, "ActiveEnterTimestampMonotonic"))
    hypeman_started = int(show(sh, "hypeman.service", "ExecMainStartTimestampMonotonic"))
    assert 0 < sriov_done <= hypeman_started
    assert show(sh, "hypeman.service", "ActiveState") == "active"
