# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_host verify: the FAKE NVIDIA driver and the FAKE DCGM package (test equipment, see fake_artifacts.py).

Over the whole scenario the driver was installed twice: version 1 by the zip
bundle's host .run (first converge), version 2 by the .deb (the provisioning
run, a reinstall). The check-mode run, the wrong-sha256 runs and molecule's
idempotence run installed nothing.
"""

from __future__ import annotations

ROOT = "/srv/vgpu-sim"
V1, V2 = "550.90.05", "550.127.06"


def test_driver_installed_once_per_version(sh):
    log = sh.file("/root/driver-installs.log").content_string.splitlines()
    assert log == ["run %s --silent --dkms" % V1, "deb %s" % V2]


def test_loaded_module_is_the_wanted_version_and_nvidia_smi_runs(sh):
    assert sh.file(ROOT + "/sys/module/nvidia/version").content_string.strip() == V2
    assert "Driver Version: %s" % V2 in sh.check_output("nvidia-smi")


def test_deb_installed_through_apt(sh):
    assert sh.check_output("dpkg-query -W -f='${db:Status-Abbrev}${Version}' nvidia-vgpu-kvm-fake") == "ii %s" % V2


def test_nothing_left_staged(sh):
    assert not sh.file(ROOT + "/var/lib/hypeman-vgpu/driver-staging").exists


def test_dcgm_installed_from_the_operators_repository(sh):
    repo = sh.file("/etc/apt/sources.list.d/hypeman-vgpu-dcgm.list")
    assert (repo.user, repo.group, repo.mode) == ("root", "root", 0o644)
    assert repo.content_string.splitlines()[1:] == ["deb [trusted=yes] file:/root/fakes/dcgm-repo ./"]
    assert sh.check_output("dpkg-query -W -f='${db:Status-Abbrev}' datacenter-gpu-manager-4-core") == "ii "
    # The unit systemd runs is the package's (prepare removed the image's copy).
    fragment = sh.check_output("systemctl show -p FragmentPath --value nvidia-dcgm.service")
    assert fragment in ("/lib/systemd/system/nvidia-dcgm.service", "/usr/lib/systemd/system/nvidia-dcgm.service")


def test_dcgm_enabled_running_and_answering(sh):
    assert sh.check_output("systemctl is-enabled nvidia-dcgm.service") == "enabled"
    assert sh.service("nvidia-dcgm").is_running
    assert "GPU(s) found" in sh.check_output("dcgmi discovery -l")
