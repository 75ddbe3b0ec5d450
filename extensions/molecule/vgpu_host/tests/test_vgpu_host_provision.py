# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_host verify: the boot-time provisioning (SR-IOV units, kernel, huge pages) on real systemd."""

from __future__ import annotations

ROOT = "/srv/vgpu-sim"
CARD = "0000:e3:00.0"
UNIT = "hypeman-vgpu-sriov-0000-e3-00.0.service"
UNIT_PATH = "/etc/systemd/system/" + UNIT
STALE = "hypeman-vgpu-sriov-0000-82-00.0.service"
MARKER = "# Managed by hypeman.vgpu.vgpu_host"


def unit_lines(sh, path):
    return [line for line in sh.file(path).content_string.splitlines() if line and not line.startswith("#")]


def test_one_sriov_unit_for_the_allowed_card(sh):
    unit = sh.file(UNIT_PATH)
    assert (unit.user, unit.group, unit.mode) == ("root", "root", 0o644)
    assert unit.content_string.startswith(MARKER)
    # systemd names the card's device unit after its real sysfs path (systemd-escape --path).
    real = sh.check_output("readlink -f %s/sys/bus/pci/devices/%s" % (ROOT, CARD))
    assert real.startswith(ROOT + "/sys/devices/")
    device_unit = sh.check_output("systemd-escape --path --suffix=device %s" % ("/sys" + real[len(ROOT + "/sys"):]))
    lines = unit_lines(sh, UNIT_PATH)
    for expected in ("Type=oneshot", "RemainAfterExit=yes", "Wants=" + device_unit,
                     "Before=hypeman.service nvidia-dcgm.service nvidia-dcgm-exporter.service",
                     "After=%s systemd-modules-load.service" % device_unit,
                     "ExecStart=%s/usr/lib/nvidia/sriov-manage -e %s" % (ROOT, CARD),
                     "ConditionPathExists=!%s/sys/bus/pci/devices/%s/virtfn0" % (ROOT, CARD),
                     "WantedBy=multi-user.target"):
        assert expected in lines
    assert sh.check_output("systemctl is-enabled %s" % UNIT) == "enabled"


def test_units_pass_systemd_analyze_verify(sh):
    result = sh.run("systemd-analyze verify %s" % UNIT_PATH)
    assert result.rc == 0, result.stderr


def test_hypeman_starts_after_the_sriov_unit(sh):
    dropin = sh.file("/etc/systemd/system/hypeman.service.d/50-hypeman-vgpu-sriov.conf")
    assert (dropin.user, dropin.group, dropin.mode) == ("root", "root", 0o644)
    assert unit_lines(sh, dropin.path) == ["[Unit]", "After=" + UNIT]
    after = sh.check_output("systemctl list-dependencies --after --plain --no-pager hypeman.service").split()
    assert UNIT in after
    assert STALE not in after
    assert sh.check_output("systemctl show -p KillMode --value hypeman.service") == "process"


def test_unit_of_a_card_no_longer_allowed_is_gone(sh):
    assert not sh.file("/etc/systemd/system/" + STALE).exists
    assert not sh.file("/etc/systemd/system/multi-user.target.wants/" + STALE).exists
    # Not ours (no marker): left alone.
    assert sh.file("/etc/systemd/system/hypeman-vgpu-sriov-operator.service").exists


def test_udev_tags_the_allowed_card_for_systemd(sh):
    rule = sh.file("/etc/udev/rules.d/70-hypeman-vgpu-nvidia-systemd.rules")
    assert rule.mode == 0o644
    assert unit_lines(sh, rule.path) == [
        'ACTION!="remove", SUBSYSTEM=="pci", KERNEL=="%s", DRIVER=="nvidia", TAG+="systemd"' % CARD]


def test_iommu_arguments_for_this_cpu_in_a_grub_dropin(sh):
    vendor = sh.check_output("grep -m1 ^vendor_id /proc/cpuinfo").split(":")[-1].strip()
    args = {"GenuineIntel": "intel_iommu=on iommu=pt", "AuthenticAMD": "amd_iommu=on iommu=pt"}[vendor]
    dropin = sh.file("/etc/default/grub.d/90-hypeman-vgpu.cfg")
    assert dropin.mode == 0o644
    assert unit_lines(sh, dropin.path) == ['GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} %s"' % args]


def test_vfio_modules_at_boot_and_nouveau_blacklisted(sh):
    assert unit_lines(sh, "/etc/modules-load.d/hypeman-vgpu.conf") == ["vfio", "vfio_pci", "vfio_iommu_type1"]
    assert unit_lines(sh, "/etc/modprobe.d/hypeman-vgpu-nouveau.conf") == [
        "blacklist nouveau", "options nouveau modeset=0"]


def test_grub_and_initramfs_regenerated_once(sh):
    # Once by converge; the idempotence run changed nothing, so called nothing.
    calls = sh.file("/root/boot-tool-calls.log").content_string.splitlines()
    assert calls == ["update-grub ", "update-initramfs -u -k all"]


def test_hugepages_persisted(sh):
    conf = sh.file("/etc/sysctl.d/90-hypeman-vgpu-hugepages.conf")
    assert conf.mode == 0o644
    assert unit_lines(sh, conf.path) == ["vm.nr_hugepages = 16"]
