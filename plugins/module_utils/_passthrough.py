# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's passthrough mode: whole NVIDIA GPUs, no vGPU framework (stdlib only).

When hypeman finds no vGPU framework (no mdev VF, no vendor-VFIO
``creatable_vgpu_types``) it reports NVIDIA PCI devices for whole-GPU VFIO
passthrough (``lib/devices/discovery.go``, ``lib/resources/gpu.go``;
docs/hypeman-interface.md §2.4):

* every ``/sys/bus/pci/devices`` entry named like a PCI address whose
  ``vendor`` and ``device`` files and ``iommu_group`` link can be read is a
  device (others are skipped);
* a candidate has a ``class`` starting with ``0300`` (VGA) or ``0302`` (3D
  controller) or vendor ``10de``; an unreadable ``class`` makes none;
* hypeman lists the candidates with vendor ``10de`` (``0x`` stripped,
  compared as written), in directory order, each ``available`` unless bound
  to ``vfio-pci``; ``used_slots`` counts those bound, ``allocatable_slots`` is
  total - used and ``quarantined_slots`` 0 (the store is a vGPU matter);
* the name comes from hypeman's table of NVIDIA device ids, else the class
  ("VGA Controller", "3D Controller", "Audio Device", "PCI Device"): an NVIDIA
  GPU's HDMI audio function is listed too.
"""

from __future__ import annotations

import os
import re

from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import read_bytes

_PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")
NVIDIA = "10de"
# hypeman's getDeviceName table (lib/devices/discovery.go).
DEVICE_NAMES = {
    "2321": "H100 NVL", "2330": "H100 SXM5 80GB", "2331": "H100 PCIe", "2339": "H100", "2335": "H200",
    "27b8": "L4", "26b5": "L40", "26b9": "L40S", "20b0": "A100 SXM4 40GB", "20b2": "A100 SXM4 80GB",
    "20b5": "A100 PCIe 40GB", "20f1": "A100 PCIe 80GB", "20b7": "A30", "2235": "A40", "2684": "RTX 4090",
    "27b0": "RTX 4090 D", "1db4": "V100 PCIe 16GB", "1db5": "V100 SXM2 16GB", "1db6": "V100 PCIe 32GB",
}
_CLASS_NAMES = {"0300": "VGA Controller", "0302": "3D Controller", "0403": "Audio Device"}


def _read(path):
    """A sysfs attribute, trimmed like Go's strings.TrimSpace (None when unreadable)."""
    try:
        return read_bytes(path, limit=65536).decode("utf-8", "replace").strip()
    except OSError:
        return None


def _strip_0x(text):
    return text[2:] if text.startswith("0x") else text


def device_name(vendor, device, pci_class):
    if vendor == NVIDIA and device in DEVICE_NAMES:
        return DEVICE_NAMES[device]
    return _CLASS_NAMES.get(_strip_0x(pci_class or "")[:4], "PCI Device")


def _device(devices_dir, address):
    base = os.path.join(devices_dir, address)
    vendor, device = _read(os.path.join(base, "vendor")), _read(os.path.join(base, "device"))
    if vendor is None or device is None:
        return None
    try:
        int(os.path.basename(os.readlink(os.path.join(base, "iommu_group"))))
    except (OSError, ValueError):
        return None
    try:
        driver = os.path.basename(os.readlink(os.path.join(base, "driver")))
    except OSError:
        driver = None
    pci_class = _read(os.path.join(base, "class"))
    vendor, device = _strip_0x(vendor), _strip_0x(device)
    if pci_class is None:
        return None  # isPassthroughCandidate reads the class again and refuses on an error
    if _strip_0x(pci_class)[:4] not in ("0300", "0302") and vendor != NVIDIA:
        return None
    return {"address": address, "vendor": vendor, "name": device_name(vendor, device, pci_class),
            "driver": driver, "available": driver != "vfio-pci"}


def discover(sysfs_root):
    """hypeman's passthrough ``gpu`` view, or None when it would report none (no NVIDIA device)."""
    devices_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(devices_dir))  # Go's os.ReadDir returns names sorted
    except OSError:
        return None
    devices = []
    for address in names:
        if not _PCI_ADDRESS.match(address):
            continue
        device = _device(devices_dir, address)
        if device is not None and device.pop("vendor") == NVIDIA:
            devices.append(device)
    if not devices:
        return None
    used = sum(1 for device in devices if not device["available"])
    return {"mode": "passthrough", "total_slots": len(devices), "used_slots": used,
            "allocatable_slots": len(devices) - used, "quarantined_slots": 0, "devices": devices}


def compare(local, api_gpu, newer_fields):
    """Mismatches ``[{field, local, api}]`` and newer fields not sent, between :func:`discover` and ``api_gpu``."""
    mismatches, missing = [], []
    if local is None:
        if api_gpu is not None:
            mismatches.append({"field": "mode", "local": None, "api": api_gpu.get("mode")})
        return mismatches, missing
    if api_gpu is None:
        return [{"field": "gpu", "local": "passthrough", "api": None}], missing
    if api_gpu.get("mode") != "passthrough":
        mismatches.append({"field": "mode", "local": "passthrough", "api": api_gpu.get("mode")})
    for field in ("total_slots", "used_slots", "allocatable_slots", "quarantined_slots"):
        if field not in api_gpu:
            if field in newer_fields:
                missing.append(field)
            else:
                mismatches.append({"field": field, "local": local[field], "api": None})
        elif api_gpu[field] != local[field]:
            mismatches.append({"field": field, "local": local[field], "api": api_gpu[field]})
    listed = api_gpu.get("devices")
    local_devices = [{"name": d["name"], "available": d["available"]} for d in local["devices"]]
    api_devices = None
    if isinstance(listed, list):
        api_devices = [{"name": d.get("name"), "available": d.get("available")} if isinstance(d, dict) else d
                       for d in listed]
    if api_devices != local_devices:
        mismatches.append({"field": "devices", "local": local_devices,
                           "api": api_devices if api_devices is not None else listed})
    return mismatches, missing
