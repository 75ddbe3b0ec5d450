# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a hypeman vGPU host needs before SR-IOV and vGPUs work (stdlib only).

IOMMU, the vfio and NVIDIA vGPU kernel modules, ``sriov-manage``,
hypeman's vendor-specific VFIO framework and DCGM's unit files, for
``host_audit_info`` with ``prerequisites: true`` (the ``vgpu_host`` role's
check). A fleet audit does not ask, so ``_audit`` imports this helper only
when it does (docs/performance.md, "Audit cost per host").
"""

from __future__ import annotations

import errno
import os

from ansible_collections.hypeman.vgpu.plugins.module_utils import _proc, _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

VFIO_MODULES = ("vfio", "vfio_pci", "vfio_iommu_type1")
NVIDIA_VGPU_MODULES = ("nvidia", "nvidia_vgpu_vfio")
IOMMU_ARGS = ("intel_iommu=on", "amd_iommu=on", "amd_iommu=force_isolation")


def _check(name, ok, detail, fix):
    return {"name": name, "status": "pass" if ok else "fail", "detail": detail, "fix": None if ok else fix}


def prerequisites(sysfs_root, proc_root, sriov_manage, dcgm_units, unit_dirs):
    """What a vGPU host needs, each as ``{name, status: pass|fail, detail, fix}``.

    ``dcgm_units``: unit file names that must exist in one of ``unit_dirs``
    (``host_audit_info``'s defaults are ``_audit.DEFAULT_DCGM_UNITS`` and
    ``_audit.DEFAULT_UNIT_DIRS``).
    """
    checks = []
    try:
        cmdline = _proc.read_proc_file(os.path.join(proc_root, "cmdline")).decode("utf-8", "replace").split()
    except (IOError, OSError) as err:
        cmdline, cmdline_error = [], "cannot read %s: %s" % (os.path.join(proc_root, "cmdline"), err.strerror or err)
    else:
        cmdline_error = None
    groups_dir = os.path.join(sysfs_root, "kernel", "iommu_groups")
    try:
        groups = os.listdir(groups_dir)
    except (IOError, OSError) as err:
        groups = []
        if err.errno not in (errno.ENOENT, errno.ENOTDIR):
            cmdline_error = "%scannot list %s: %s" % (cmdline_error + "; " if cmdline_error else "", groups_dir,
                                                      err.strerror or err)
    on = [arg for arg in cmdline if arg in IOMMU_ARGS]
    if on:
        detail = "kernel command line has %s" % " ".join(on)
    elif groups:
        detail = "no IOMMU switch on the kernel command line, but the IOMMU is active (%d groups in %s)" % (
            len(groups), groups_dir)
    else:
        detail = cmdline_error or "IOMMU not enabled: no intel_iommu=on/amd_iommu=on and no groups in %s" % groups_dir
    checks.append(_check("iommu", bool(on or groups), detail,
                         "add intel_iommu=on iommu=pt (Intel) or amd_iommu=on iommu=pt (AMD) to GRUB_CMDLINE_LINUX "
                         "in /etc/default/grub, run update-grub and reboot"))

    def modules_check(name, modules, fix):
        missing = [m for m in modules if not os.path.isdir(os.path.join(sysfs_root, "module", m))]
        detail = ("loaded: %s" % ", ".join(modules)) if not missing else (
            "not loaded (no %s): %s" % (os.path.join(sysfs_root, "module", "<name>"), ", ".join(missing)))
        checks.append(_check(name, not missing, detail, fix))

    modules_check("vfio_modules", VFIO_MODULES,
                  "modprobe vfio vfio_pci vfio_iommu_type1 and list them in /etc/modules-load.d/vfio.conf")
    modules_check("nvidia_vgpu_driver", NVIDIA_VGPU_MODULES,
                  "install the NVIDIA vGPU host driver (vGPU Manager) package for this kernel and load "
                  "nvidia and nvidia_vgpu_vfio")
    executable = os.path.isfile(sriov_manage) and os.access(sriov_manage, os.X_OK)
    checks.append(_check("sriov_manage", executable,
                         "%s is %s" % (sriov_manage, "executable" if executable else
                                       ("not executable" if os.path.exists(sriov_manage) else "missing")),
                         "install the NVIDIA vGPU host driver package, which ships %s" % sriov_manage))
    try:
        framework, _warnings = _sysfs.detect_framework(sysfs_root)
    except VgpuError as err:
        framework, detail = None, err.msg
    else:
        detail = "hypeman detects the %s framework" % framework
    checks.append(_check("vendor_vfio", framework == _sysfs.FRAMEWORK_VENDOR_VFIO, detail,
                         "enable SR-IOV on the cards (sriov-manage -e <card>, or vgpu_host_sriov_enable) on a "
                         "driver with vendor-specific VFIO; on mdev hosts hypeman ignores the VF health store"))
    missing_units = []
    for unit in dcgm_units:
        if not any(os.path.exists(os.path.join(d, unit)) for d in unit_dirs):
            missing_units.append(unit)
    checks.append(_check("dcgm_units", not missing_units,
                         ("unit files found: %s" % ", ".join(dcgm_units)) if not missing_units
                         else "no unit file in %s for: %s" % (", ".join(unit_dirs), ", ".join(missing_units)),
                         "install DCGM (datacenter-gpu-manager, dcgm-exporter) or set the recovery roles' unit "
                         "lists to the units this host runs"))
    return checks
