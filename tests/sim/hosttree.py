# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build realistic hypeman vGPU host trees under a root directory.

Test equipment shared by unit tests, integration targets and the simulator
(standard library only; nothing in ``plugins/`` imports it). A tree looks
like the real host, rooted at ``root``::

    sys/    bus/pci/devices/<addr> -> ../../../devices/pci<dom>:<bus>/<addr>
            PF: vendor device class sriov_totalvfs sriov_numvfs virtfn<N>
            other devices: vendor device class [sriov_totalvfs sriov_numvfs]
            VF: physfn iommu_group vfio-dev/vfio<N> nvidia/creatable_vgpu_types
                nvidia/current_vgpu_type          (vendor-VFIO cards)
            class/mdev_bus/<vf>, <vf>/mdev_supported_types/*, bus/mdev/devices/*
                                                  (mdev cards)
    proc/   <pid>/{stat,status,comm,cmdline,cgroup,fd/*}, net/unix,
            sys/kernel/random/boot_id, driver/nvidia/gpus/<addr>/information
    dev/    nvidia<minor> nvidiactl nvidia-uvm vfio/vfio vfio/<group>
            vfio/devices/vfio<N>              (regular files: tests open them)
    var/lib/hypeman/   guests/<id>/metadata.json, gpu/vf-health.json
    etc/hypeman/config.yaml

Python use::

    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0")        # 32 VFs, 0000:82:00.4 ...
    tree.add_instance("inst-a", vf=card.vfs[0], profile="NVIDIA L40S-2Q")
    tree.write_store([{"vf_address": card.vfs[1], "quarantined_at": "2026-08-22T00:00:00Z"}])
    tree.describe()   # paths and what was built, JSON-ready

CLI (integration targets, the simulator)::

    python3 -m tests.sim.hosttree build --root DIR --layout '{"cards": [...]}'
    python3 -m tests.sim.hosttree build --root DIR --layout @layout.json

prints :meth:`HostTree.describe` as JSON. See :func:`build_from_layout` for
the layout keys.

Facts reproduced (``docs/hypeman-interface.md``): VF
addresses follow the PF's routing id plus the SR-IOV first-VF offset and
stride, so 32 VFs span device numbers (00.4 ... 04.3); creatable lists use
the driver's ``ID    : vGPU Name`` header and ``%-5d : %s`` lines and shrink
as a card's framebuffer is used (§6.2); metadata uses hypeman's untagged Go
field names in both the ``GPUClaimedAt`` and ``GPUAssignedAt`` builds (§3.2);
liveness evidence is what hypeman reads: ``/proc/<pid>/stat`` field 22, the
``State:`` line, boot id and control-socket ownership via ``/proc/net/unix``
(§3.3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

DEFAULT_BOOT_ID = "3f0c1c1e-5d6b-4b7a-9d51-7b2a9f1c0e11"
OTHER_BOOT_ID = "9b8a7c6d-0000-4e5f-8a9b-0c1d2e3f4a5b"
CREATABLE_HEADER = "ID    : vGPU Name"
NVIDIA_VENDOR = "0x10de"
GPU_CLASS = "0x030200"  # 3D controller
DEFAULT_CLAIMED_AT = "2026-08-31T12:00:00.123456789Z"


def _series(first_id, model, sizes, letter):
    return [(first_id + i, "NVIDIA %s-%s%s" % (model, size, letter)) for i, size in enumerate(sizes)]


class Model(object):
    """A GPU model: PCI ids, SR-IOV geometry and the vGPU types its driver offers."""

    def __init__(self, name, device_id, framebuffer_gb, total_vfs, first_vf_offset, vf_stride, types):
        self.name = name
        self.device_id = device_id
        self.framebuffer_mb = framebuffer_gb * 1024
        self.total_vfs = total_vfs
        self.first_vf_offset = first_vf_offset
        self.vf_stride = vf_stride
        self.types = list(types)  # [(type_id, name)] in driver order

    def type_id(self, profile):
        """Type id for a profile name or id (int or digit string)."""
        if isinstance(profile, int) or str(profile).isdigit():
            return int(profile)
        for type_id, name in self.types:
            if name == profile:
                return type_id
        raise ValueError("model %s has no vGPU type %r" % (self.name, profile))

    def type_name(self, type_id):
        for tid, name in self.types:
            if tid == int(type_id):
                return name
        return None


def framebuffer_mb(name):
    """Framebuffer of a profile name, parsed the way hypeman parses it (§2.3)."""
    series = max(name.rfind(c) for c in "ABCQ")
    if series <= 0:
        return 0
    dash = name.rfind("-", 0, series)
    if dash < 0:
        return 0
    digits = name[dash + 1:series]
    return int(digits) * 1024 if digits.isdigit() else 0


MODELS = {
    # L40S: 48 GB, 32 VFs from function 4 (00.4 ... 04.3).
    "L40S": Model("L40S", "0x26b9", 48, 32, 4, 1,
                  _series(1143, "L40S", [1, 2], "B")
                  + _series(1147, "L40S", [1, 2, 3, 4, 6, 8, 12, 16, 24, 48], "Q")
                  + _series(1157, "L40S", [1, 2, 3, 4, 6, 8, 12, 16, 24, 48], "A")),
    # A100 40 GB PCIe: 16 VFs (00.4 ... 02.3), C-series and MIG-backed types.
    "A100": Model("A100", "0x20f1", 40, 16, 4, 1,
                  _series(692, "A100", [4, 5, 8, 10, 20, 40], "C")
                  + [(699, "NVIDIA A100-1-5C"), (700, "NVIDIA A100-2-10C"),
                     (701, "NVIDIA A100-3-20C"), (702, "NVIDIA A100-7-40C")]),
    # H100 80 GB PCIe: 32 VFs (00.4 ... 04.3), C-series and MIG-backed types.
    "H100": Model("H100", "0x2331", 80, 32, 4, 1,
                  _series(1057, "H100", [4, 5, 8, 10, 16, 20, 40, 80], "C")
                  + [(1065, "NVIDIA H100-1-10C"), (1066, "NVIDIA H100-2-20C"),
                     (1067, "NVIDIA H100-3-40C"), (1068, "NVIDIA H100-7-80C")]),
}


def parse_pci(address):
    """(domain, bus, device, function) of ``dddd:bb:dd.f``; raises ValueError."""
    try:
        domain, bus, rest = address.split(":")
        dev, func = rest.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(func, 16)
    except (ValueError, AttributeError):
        raise ValueError("not a PCI address: %r" % (address,))


def format_pci(domain, bus, dev, func):
    return "%04x:%02x:%02x.%x" % (domain, bus, dev, func)


def vf_addresses(pf_address, count, offset, stride):
    """VF addresses as the PCI core assigns them: PF routing id + offset + k*stride."""
    domain, bus, dev, func = parse_pci(pf_address)
    rid = (bus << 8) | (dev << 3) | func
    out = []
    for k in range(count):
        vf_rid = rid + offset + k * stride
        out.append(format_pci(domain, vf_rid >> 8, (vf_rid >> 3) & 0x1F, vf_rid & 0x7))
    return out


def creatable_text(types):
    """``creatable_vgpu_types`` content: the driver's header, then ``%-5d : %s``."""
    lines = [CREATABLE_HEADER] + ["%-5d : %s" % (tid, name) for tid, name in types]
    return "\n".join(lines) + "\n"


class Card(object):
    """A parent GPU the tree built: address, model, VF addresses, minor number."""

    def __init__(self, address, model, vfs, minor, framework, iommu_group):
        self.address = address
        self.model = model
        self.vfs = vfs
        self.minor = minor
        self.framework = framework
        self.iommu_group = iommu_group
        self.realistic = True

    def describe(self):
        return {"address": self.address, "model": self.model.name, "vfs": list(self.vfs),
                "minor": self.minor, "framework": self.framework,
                "sriov_totalvfs": self.model.total_vfs}


def vf_may_wedge_line(instance_id, device_path, unix_ns):
    """hypeman's warning after hard-killing a hypervisor that ignored SIGTERM, as its slog JSON handler writes it.

    ``lib/instances`` (terminateThenKill): level WARN, attributes ``instance_id`` and
    ``device_path`` (the instance's ``GPUDevicePath``), then the subsystem the logger adds.
    """
    return json.dumps({
        "time": _rfc3339nano(unix_ns), "level": "WARN",
        "msg": "hypervisor with VFIO devices did not exit on SIGTERM; hard-killing, device may wedge if the "
               "guest driver was initializing",
        "instance_id": instance_id, "device_path": device_path, "subsystem": "INSTANCES"}, separators=(",", ":"))


class HostTree(object):
    """A simulated hypeman vGPU host under ``root`` (created if missing)."""

    def __init__(self, root, boot_id=DEFAULT_BOOT_ID):
        self.root = os.path.abspath(str(root))
        self.sysfs_root = os.path.join(self.root, "sys")
        self.proc_root = os.path.join(self.root, "proc")
        self.dev_root = os.path.join(self.root, "dev")
        self.data_dir = os.path.join(self.root, "var", "lib", "hypeman")
        self.state_dir = os.path.join(self.root, "var", "lib", "hypeman-vgpu")
        self.config_path = os.path.join(self.root, "etc", "hypeman", "config.yaml")
        self.store_path = os.path.join(self.data_dir, "gpu", "vf-health.json")
        # Stand-ins for hypeman's journal (its JSON log lines) and the kernel log (rsyslog's kern.log).
        self.hypeman_log_path = os.path.join(self.root, "var", "log", "hypeman.log")
        self.kernel_log_path = os.path.join(self.root, "var", "log", "kern.log")
        self.boot_id = boot_id
        self.cards = {}          # pf address -> Card
        self.devices = {}        # address -> description, PCI devices that are not cards (add_device)
        self.vf_info = {}        # vf address -> dict(card, iommu_group, vfio, index)
        self.instances = {}      # id -> description
        self.processes = {}      # pid -> description
        self._next_group = 20
        self._next_vfio = 0
        self._next_pid = 40000
        self._next_inode = 700000
        self._sockets = []       # (inode, path) listeners for /proc/net/unix
        for path in (os.path.join(self.sysfs_root, "bus", "pci", "devices"),
                     os.path.join(self.sysfs_root, "bus", "pci", "drivers", "nvidia"),
                     os.path.join(self.sysfs_root, "kernel", "iommu_groups"),
                     os.path.join(self.dev_root, "vfio", "devices"),
                     os.path.join(self.data_dir, "guests"),
                     os.path.join(self.proc_root, "net")):
            _mkdir(path)
        self._write(os.path.join(self.proc_root, "sys", "kernel", "random", "boot_id"), boot_id + "\n")
        for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "vfio/vfio", "null"):
            self._write(os.path.join(self.dev_root, node), "")
        self._write_net_unix()

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def _write(path, text):
        _mkdir(os.path.dirname(path))
        with open(path, "w") as handle:
            handle.write(text)

    @staticmethod
    def _link(target, path):
        _mkdir(os.path.dirname(path))
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(target, path)

    def device_dir(self, address):
        """Real (non-symlink) sysfs directory of a PCI device."""
        domain, bus, _dev, _func = parse_pci(address)
        return os.path.join(self.sysfs_root, "devices", "pci%04x:%02x" % (domain, bus), address)

    def pci_path(self, address, *parts):
        return os.path.join(self.sysfs_root, "bus", "pci", "devices", address, *parts)

    def vf_address(self, pf_address, index):
        return self.cards[pf_address].vfs[index]

    def resolve_vf(self, ref):
        """``0000:82:00.4`` or ``<pf>@<index>`` (e.g. ``0000:82:00.0@3``) -> VF address."""
        if "@" in ref:
            pf, index = ref.split("@", 1)
            return self.vf_address(pf, int(index))
        return ref

    def _add_pci_device(self, address, device_id, extra_files, vendor=NVIDIA_VENDOR, pci_class=GPU_CLASS,
                        driver="nvidia"):
        real = self.device_dir(address)
        _mkdir(real)
        files = {"vendor": vendor, "device": device_id, "class": pci_class,
                 "subsystem_vendor": vendor, "numa_node": "0"}
        files.update(extra_files)
        for name, value in files.items():
            self._write(os.path.join(real, name), "%s\n" % value)
        group = self._next_group
        self._next_group += 1
        _mkdir(os.path.join(self.sysfs_root, "kernel", "iommu_groups", str(group), "devices"))
        self._link(os.path.relpath(real, os.path.join(self.sysfs_root, "kernel", "iommu_groups", str(group), "devices")),
                   os.path.join(self.sysfs_root, "kernel", "iommu_groups", str(group), "devices", address))
        self._link(os.path.relpath(os.path.join(self.sysfs_root, "kernel", "iommu_groups", str(group)), real),
                   os.path.join(real, "iommu_group"))
        _mkdir(os.path.join(self.sysfs_root, "bus", "pci", "drivers", driver))
        self._link(os.path.relpath(os.path.join(self.sysfs_root, "bus", "pci", "drivers", driver), real),
                   os.path.join(real, "driver"))
        self._link(os.path.relpath(real, os.path.join(self.sysfs_root, "bus", "pci", "devices")),
                   self.pci_path(address))
        return real, group

    # ------------------------------------------------------------ other devices
    def add_device(self, address, vendor=NVIDIA_VENDOR, device="0x1eb8", pci_class=GPU_CLASS, sriov_totalvfs=None,
                   driver="nvidia"):
        """Add a PCI device that is not a vGPU card, to be refused as one.

        The defaults make an NVIDIA GPU without SR-IOV (a T4: no ``sriov_*``
        files). ``sriov_totalvfs`` (an int, 0 included) adds ``sriov_totalvfs``
        and ``sriov_numvfs`` (0); another ``vendor`` (e.g. ``0x8086`` with
        ``pci_class`` ``0x020000`` and ``driver`` ``ice``) makes another
        vendor's SR-IOV device. Returns the device's sysfs directory.
        """
        if address in self.cards or address in self.devices or address in self.vf_info:
            raise ValueError("PCI device %s already exists" % address)
        extra = {}
        if sriov_totalvfs is not None:
            extra = {"sriov_totalvfs": int(sriov_totalvfs), "sriov_numvfs": 0}
        real, _group = self._add_pci_device(address, device, extra, vendor=vendor, pci_class=pci_class, driver=driver)
        self.devices[address] = {"address": address, "vendor": vendor, "device": device, "class": pci_class,
                                 "sriov_totalvfs": sriov_totalvfs, "driver": driver}
        return real

    # ------------------------------------------------------------------ cards
    def add_card(self, model, address, numvfs=None, minor=None, framework="vendor-vfio", realistic=True):
        """Add a parent GPU and its VFs.

        ``model`` is a key of :data:`MODELS` (``L40S``, ``A100``, ``H100``) or a
        :class:`Model`; ``numvfs`` defaults to the model's ``sriov_totalvfs``
        (0 = SR-IOV disabled); ``framework`` is ``vendor-vfio`` (VFs carry
        ``nvidia/creatable_vgpu_types``) or ``mdev`` (VFs under
        ``class/mdev_bus``). With ``realistic`` the creatable lists follow the
        card's framebuffer as types are set (see :meth:`refresh_creatable`).
        Returns the :class:`Card`.
        """
        model = MODELS[model] if not isinstance(model, Model) else model
        if framework not in ("vendor-vfio", "mdev"):
            raise ValueError("framework must be vendor-vfio or mdev, not %r" % (framework,))
        if address in self.cards or address in self.devices:
            raise ValueError("card %s already exists" % address)
        numvfs = model.total_vfs if numvfs is None else int(numvfs)
        if not 0 <= numvfs <= model.total_vfs:
            raise ValueError("numvfs %d outside 0..%d for %s" % (numvfs, model.total_vfs, model.name))
        minor = len(self.cards) if minor is None else int(minor)
        pf_real, group = self._add_pci_device(address, model.device_id, {
            "sriov_totalvfs": model.total_vfs, "sriov_numvfs": numvfs,
            "sriov_offset": model.first_vf_offset, "sriov_stride": model.vf_stride,
            "sriov_vf_device": model.device_id[2:]})
        card = Card(address, model, [], minor, framework, group)
        card.realistic = realistic
        self.cards[address] = card
        self._write(os.path.join(self.dev_root, "nvidia%d" % minor), "")
        self._write(os.path.join(self.proc_root, "driver", "nvidia", "gpus", address, "information"),
                    "Model: \t\t NVIDIA %s\nIRQ:   \t\t 0\nGPU UUID: \t GPU-%08x-0000-0000-0000-000000000000\n"
                    "Video BIOS: \t 95.02.5d.00.01\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
                    "DMA Mask: \t 0x7fffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\n"
                    "GPU Excluded:\t No\n" % (model.name, minor, address, minor))
        self.enable_vfs(address, numvfs)
        return card

    def enable_vfs(self, pf_address, numvfs):
        """Create the card's first ``numvfs`` VFs (what ``sriov-manage -e`` leaves behind)."""
        card = self.cards[pf_address]
        model = card.model
        pf_real = self.device_dir(pf_address)
        for index, vf in enumerate(vf_addresses(pf_address, numvfs, model.first_vf_offset, model.vf_stride)):
            vf_real, group = self._add_pci_device(vf, model.device_id, {})
            self._link(os.path.relpath(pf_real, vf_real), os.path.join(vf_real, "physfn"))
            self._link(os.path.relpath(vf_real, pf_real), os.path.join(pf_real, "virtfn%d" % index))
            vfio = self._next_vfio
            self._next_vfio += 1
            _mkdir(os.path.join(vf_real, "vfio-dev", "vfio%d" % vfio))
            self._write(os.path.join(self.dev_root, "vfio", "devices", "vfio%d" % vfio), "")
            self._write(os.path.join(self.dev_root, "vfio", str(group)), "")
            self.vf_info[vf] = {"card": pf_address, "iommu_group": group, "vfio": vfio, "index": index}
            card.vfs.append(vf)
            if card.framework == "vendor-vfio":
                self._write(os.path.join(vf_real, "nvidia", "current_vgpu_type"), "0\n")
            else:
                mdev_bus = os.path.join(self.sysfs_root, "class", "mdev_bus")
                self._link(os.path.relpath(vf_real, mdev_bus), os.path.join(mdev_bus, vf))
                for type_id, name in model.types:
                    tdir = os.path.join(vf_real, "mdev_supported_types", "nvidia-%d" % type_id)
                    fb = framebuffer_mb(name)
                    self._write(os.path.join(tdir, "name"), name + "\n")
                    self._write(os.path.join(tdir, "description"),
                                "num_heads=4, frl_config=60, framebuffer=%dM, max_resolution=7680x4320, "
                                "max_instance=%d\n" % (fb, model.framebuffer_mb // max(fb, 1)))
                    self._write(os.path.join(tdir, "device_api"), "vfio-pci\n")
                    self._write(os.path.join(tdir, "create"), "")
        self._write(os.path.join(pf_real, "sriov_numvfs"), "%d\n" % len(card.vfs))
        self.refresh_creatable(pf_address)
        return list(card.vfs)

    def set_current_type(self, vf, profile):
        """Set a VF's vGPU type (0 / None frees it) and refresh the card's creatable lists.

        vendor-VFIO: writes ``nvidia/current_vgpu_type``; mdev: creates or
        removes an mdev device on the VF. ``profile`` is a name or a type id.
        """
        vf = self.resolve_vf(vf)
        info = self.vf_info[vf]
        card = self.cards[info["card"]]
        type_id = 0 if profile in (None, 0, "0") else card.model.type_id(profile)
        vf_real = self.device_dir(vf)
        if card.framework == "vendor-vfio":
            self._write(os.path.join(vf_real, "nvidia", "current_vgpu_type"), "%d\n" % type_id)
        else:
            self._set_mdev(vf, vf_real, type_id)
        info["type"] = type_id
        self.refresh_creatable(card.address)
        return type_id

    def _set_mdev(self, vf, vf_real, type_id):
        uuid = "%08x-0000-4000-8000-%012x" % (0x6d646576, int(vf.replace(":", "").replace(".", ""), 16))
        bus_link = os.path.join(self.sysfs_root, "bus", "mdev", "devices", uuid)
        mdev_dir = os.path.join(vf_real, uuid)
        if type_id == 0:
            if os.path.lexists(bus_link):
                os.unlink(bus_link)
            if os.path.isdir(mdev_dir):
                os.unlink(os.path.join(mdev_dir, "mdev_type"))
                os.rmdir(mdev_dir)
            self.vf_info[vf].pop("mdev_uuid", None)
            return
        _mkdir(mdev_dir)
        self._link(os.path.join("..", "mdev_supported_types", "nvidia-%d" % type_id), os.path.join(mdev_dir, "mdev_type"))
        self._link(os.path.relpath(mdev_dir, os.path.dirname(bus_link)), bus_link)
        self.vf_info[vf]["mdev_uuid"] = uuid

    def mdev_uuid(self, vf):
        return self.vf_info[self.resolve_vf(vf)].get("mdev_uuid")

    def refresh_creatable(self, pf_address):
        """Recompute a realistic card's creatable lists from its framebuffer.

        A free VF lists every type while the card is empty; once a type is
        active, free VFs list only that type while framebuffer remains, and
        only the header when it is used up; an allocated VF lists only the
        header. mdev cards get the same rule through ``available_instances``.
        """
        card = self.cards[pf_address]
        if not card.realistic:
            return
        model = card.model
        active = [self.vf_info[vf].get("type", 0) for vf in card.vfs if self.vf_info[vf].get("type", 0)]
        used = sum(framebuffer_mb(model.type_name(t) or "") for t in active)
        if active:
            active_type = active[0]
            fits = used + framebuffer_mb(model.type_name(active_type) or "") <= model.framebuffer_mb
            free_types = [(active_type, model.type_name(active_type))] if fits else []
        else:
            free_types = [(tid, name) for tid, name in model.types if framebuffer_mb(name) <= model.framebuffer_mb]
        for vf in card.vfs:
            allocated = bool(self.vf_info[vf].get("type", 0))
            types = [] if allocated else free_types
            if card.framework == "vendor-vfio":
                self._write(self.pci_path(vf, "nvidia", "creatable_vgpu_types"), creatable_text(types))
            else:
                listed = set(pair[0] for pair in types)
                for type_id, _name in model.types:
                    self._write(self.pci_path(vf, "mdev_supported_types", "nvidia-%d" % type_id, "available_instances"),
                                "%d\n" % (1 if type_id in listed else 0))

    def set_creatable(self, vf, types=None, raw=None):
        """Pin a VF's creatable list: ``types`` ([(id, name)] or names) or ``raw`` text.

        The card stops being refreshed automatically (``realistic`` off).
        """
        vf = self.resolve_vf(vf)
        card = self.cards[self.vf_info[vf]["card"]]
        card.realistic = False
        if raw is None:
            pairs = [(t if isinstance(t, (list, tuple)) else (card.model.type_id(t), t)) for t in (types or [])]
            raw = creatable_text(pairs)
        self._write(self.pci_path(vf, "nvidia", "creatable_vgpu_types"), raw)

    def remove_vfs(self, pf_address):
        """Remove every VF of a card (what ``sriov-manage -d`` leaves behind)."""
        card = self.cards[pf_address]
        pf_real = self.device_dir(pf_address)
        for index, vf in enumerate(card.vfs):
            for path in (self.pci_path(vf), os.path.join(pf_real, "virtfn%d" % index),
                         os.path.join(self.sysfs_root, "class", "mdev_bus", vf)):
                if os.path.lexists(path):
                    os.unlink(path)
            _rmtree(self.device_dir(vf))
            self.vf_info.pop(vf, None)
        card.vfs = []
        self._write(os.path.join(pf_real, "sriov_numvfs"), "0\n")

    # -------------------------------------------------------------- processes
    def add_process(self, pid=None, comm="sleep", cmdline=None, unit=None, fds=(), state="S",
                    start_time=None, sockets=()):
        """Add a fake ``/proc/<pid>`` entry.

        ``fds`` are paths the process holds open: relative ones are under
        ``dev_root`` (``nvidia0``, ``vfio/23``); absolute ones are used as is.
        ``sockets`` are Unix socket paths it listens on (listed in
        ``/proc/net/unix``). ``unit`` (e.g. ``nvidia-dcgm.service``) goes into
        ``/proc/<pid>/cgroup``; ``state`` ``Z`` makes a zombie. Returns the pid.
        """
        if pid is None:
            pid = self._next_pid
            self._next_pid += 1
        pid = int(pid)
        start_time = 880000 + pid if start_time is None else int(start_time)
        pdir = os.path.join(self.proc_root, str(pid))
        if os.path.isdir(pdir):
            _rmtree(pdir)
        cmdline = list(cmdline or [comm])
        state_names = {"R": "R (running)", "S": "S (sleeping)", "D": "D (disk sleep)", "Z": "Z (zombie)"}
        self._write(os.path.join(pdir, "comm"), comm[:15] + "\n")
        self._write(os.path.join(pdir, "cmdline"), "\0".join(cmdline) + "\0")
        self._write(os.path.join(pdir, "status"), "Name:\t%s\nUmask:\t0022\nState:\t%s\nTgid:\t%d\nNgid:\t0\n"
                    "Pid:\t%d\nPPid:\t1\n" % (comm[:15], state_names.get(state, state), pid, pid))
        # Field 22 (index 19 after the ')') is the start time in clock ticks.
        self._write(os.path.join(pdir, "stat"), "%d (%s) %s 1 %d %d 0 -1 4194560 100 0 0 0 10 5 0 0 20 0 4 0 %d "
                    "123456789 4096 18446744073709551615\n" % (pid, comm[:15], state, pid, pid, start_time))
        cgroup = "/system.slice/%s" % unit if unit else "/user.slice/user-0.slice/session-1.scope"
        self._write(os.path.join(pdir, "cgroup"), "0::%s\n" % cgroup)
        fd_dir = os.path.join(pdir, "fd")
        _mkdir(fd_dir)
        targets = [os.path.join(self.dev_root, "null")] * 3
        for path in fds:
            targets.append(path if os.path.isabs(path) else os.path.join(self.dev_root, path))
        for sock in sockets:
            inode = self._next_inode
            self._next_inode += 1
            self._sockets.append((inode, sock))
            targets.append("socket:[%d]" % inode)
        for num, target in enumerate(targets):
            os.symlink(target, os.path.join(fd_dir, str(num)))
        self._write_net_unix()
        self.processes[pid] = {"pid": pid, "comm": comm, "unit": unit, "state": state,
                               "start_time": start_time, "fds": list(targets[3:])}
        return pid

    def share_socket(self, pid, socket_path):
        """Give ``pid`` an fd on the listener already bound at ``socket_path``."""
        inode = [i for i, path in self._sockets if path == socket_path][0]
        fd_dir = os.path.join(self.proc_root, str(pid), "fd")
        os.symlink("socket:[%d]" % inode, os.path.join(fd_dir, str(len(os.listdir(fd_dir)))))

    def remove_process(self, pid):
        _rmtree(os.path.join(self.proc_root, str(pid)))
        self.processes.pop(int(pid), None)

    def _write_net_unix(self):
        lines = ["Num       RefCount Protocol Flags    Type St Inode Path"]
        for inode, path in self._sockets:
            lines.append("%016x: 00000002 00000000 00010000 0001 01 %d %s" % (inode, inode, path))
        self._write(os.path.join(self.proc_root, "net", "unix"), "\n".join(lines) + "\n")

    def vf_nodes(self, vf):
        """Device nodes (relative to dev_root) a VMM holds for a VF."""
        info = self.vf_info[self.resolve_vf(vf)]
        return ["vfio/devices/vfio%d" % info["vfio"], "vfio/%d" % info["iommu_group"]]

    # -------------------------------------------------------------- instances
    def add_instance(self, instance_id, vf=None, profile=None, name=None, build="claimed",
                     claimed_at=DEFAULT_CLAIMED_AT, liveness="running", pid=None, hypervisor="qemu",
                     retained_for_cleanup=False, set_type=True, framework=None, extra=None):
        """Write ``guests/<id>/metadata.json`` as hypeman does, plus the VMM's evidence.

        ``build`` ``claimed`` writes ``GPUClaimedAt``; ``assigned`` writes
        ``GPUAssignedAt`` and ``GPURetainedForCleanup``. ``vf`` (address or
        ``<pf>@<index>``) makes a vGPU claim (``GPUDevicePath``); with
        ``set_type`` the VF's current type is set to ``profile``.
        ``liveness`` decides the /proc evidence:

        - ``running``: VMM alive, boot id and start time recorded (proof), holds
          the VF's vfio nodes and listens on the control socket;
        - ``running-legacy``: alive, no start time / boot id recorded: socket proves it;
        - ``stopped``: no PID recorded, no process (a stopped instance keeps its claim
          until released);
        - ``crashed``: PID recorded, process gone;
        - ``pid-reused``: the recorded PID now belongs to another process (other
          start time, no socket);
        - ``previous-boot``: the recorded boot id is not the current one;
        - ``zombie``: the PID is a zombie;
        - ``ambiguous``: no PID recorded and two processes hold the listener
          (hypeman cannot tell, so it counts the instance as live).

        ``extra`` adds or overrides metadata keys. Returns the metadata dict.
        """
        if build not in ("claimed", "assigned"):
            raise ValueError("build must be claimed or assigned")
        idir = os.path.join(self.data_dir, "guests", instance_id)
        sock = os.path.join(idir, "%s.sock" % ("ch" if hypervisor == "cloud-hypervisor" else hypervisor))
        device_path = ""
        mdev_uuid = ""
        gpu_framework = ""
        vf_addr = self.resolve_vf(vf) if vf else None
        if vf_addr:
            card = self.cards[self.vf_info[vf_addr]["card"]]
            gpu_framework = framework or card.framework
            if set_type and profile:
                self.set_current_type(vf_addr, profile)
            if gpu_framework == "mdev":
                mdev_uuid = self.mdev_uuid(vf_addr) or ""
                device_path = "/sys/bus/mdev/devices/%s" % mdev_uuid
            else:
                device_path = "/sys/bus/pci/devices/%s" % vf_addr
        proc_pid = None
        meta_pid, start_time, boot_id = None, 0, ""
        fds = self.vf_nodes(vf_addr) if vf_addr else []
        if liveness in ("running", "running-legacy", "pid-reused", "zombie", "ambiguous", "crashed", "previous-boot"):
            meta_pid = int(pid) if pid is not None else self._next_pid
            self._next_pid = max(self._next_pid, meta_pid + 1)
            start_time = 880000 + meta_pid
            boot_id = self.boot_id
        if liveness == "running":
            proc_pid = self.add_process(meta_pid, comm="qemu-system-x86", unit="hypeman.service",
                                        cmdline=["qemu-system-x86_64", "-name", instance_id], fds=fds,
                                        sockets=[sock], start_time=start_time)
        elif liveness == "running-legacy":
            start_time, boot_id = 0, ""
            proc_pid = self.add_process(meta_pid, comm="qemu-system-x86", unit="hypeman.service",
                                        cmdline=["qemu-system-x86_64", "-name", instance_id], fds=fds,
                                        sockets=[sock])
        elif liveness == "pid-reused":
            self.add_process(meta_pid, comm="bash", start_time=start_time + 5000)
        elif liveness == "previous-boot":
            boot_id = OTHER_BOOT_ID
            self.add_process(meta_pid, comm="kworker/3:1", start_time=start_time)
        elif liveness == "zombie":
            self.add_process(meta_pid, comm="qemu-system-x86", state="Z", start_time=start_time)
        elif liveness == "ambiguous":
            # No PID recorded, and two processes hold the listener: hypeman
            # cannot pick the owner, fails the check, and counts it as live.
            proc_pid, meta_pid, start_time, boot_id = meta_pid, None, 0, ""
            self.add_process(proc_pid, comm="qemu-system-x86", unit="hypeman.service", fds=fds, sockets=[sock])
            helper = self.add_process(comm="qemu-helper", unit="hypeman.service")
            self.share_socket(helper, sock)
        elif liveness not in ("stopped", "crashed"):
            raise ValueError("unknown liveness %r" % (liveness,))
        meta = _metadata(instance_id, name or instance_id, hypervisor, idir, sock, meta_pid, start_time, boot_id,
                         profile or "", gpu_framework, device_path, mdev_uuid,
                         claimed_at if vf_addr else None, build, retained_for_cleanup)
        if extra:
            meta.update(extra)
        _mkdir(os.path.join(idir, "logs"))
        self._write(os.path.join(idir, "metadata.json"), json.dumps(meta, indent=2))
        self._write(os.path.join(idir, "logs", "app.log"), "")
        self.instances[instance_id] = {"id": instance_id, "vf": vf_addr, "profile": profile, "build": build,
                                       "liveness": liveness, "pid": meta_pid, "proc_pid": proc_pid,
                                       "socket_path": sock, "claimed_at": claimed_at if vf_addr else None}
        return meta

    # -------------------------------------------------------- config and store
    def write_config(self, threshold=None, raw=None):
        """hypeman's ``config.yaml``; ``threshold`` sets ``gpu.vf_quarantine_threshold``."""
        if raw is None:
            raw = ('port: "8080"\ndata_dir: %s\njwt_secret: "0123456789abcdef"\nlogging:\n  max_size: 50MB\n'
                   '  max_files: 1\ngpu:\n  profile_cache_ttl: 30m\n' % self.data_dir)
            if threshold is not None:
                raw += "  vf_quarantine_threshold: %s\n" % threshold
        self._write(self.config_path, raw)
        return self.config_path

    def write_store(self, records=None, raw=None, version=1):
        """Write ``gpu/vf-health.json``: ``records`` in the v1 envelope, or ``raw`` text/list."""
        if raw is None:
            raw = json.dumps({"version": version, "records": list(records or [])}, indent=2)
        elif not isinstance(raw, str):
            raw = json.dumps(raw, indent=2)
        self._write(self.store_path, raw)
        return self.store_path

    # ------------------------------------------------------------------ faults
    def break_path(self, rel_path, how="eisdir"):
        """Make a file unreadable even for root.

        ``eisdir`` replaces it with a directory, ``eloop`` with a symlink
        loop, ``dirlink`` with a symlink to a real directory beside it
        (``<name>.real``), ``missing`` removes it, ``garbage`` fills it with
        bytes that are not what the reader expects.
        """
        path = rel_path if os.path.isabs(rel_path) else os.path.join(self.root, rel_path)
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                _rmtree(path)
            else:
                os.unlink(path)
        if how == "eisdir":
            _mkdir(path)
        elif how == "eloop":
            os.symlink(os.path.basename(path), path)
        elif how == "dirlink":
            _mkdir(path + ".real")
            os.symlink(os.path.basename(path) + ".real", path)
        elif how == "garbage":
            self._write(path, "\x00\xff garbage \x01\n")
        elif how != "missing":
            raise ValueError("unknown fault %r" % (how,))
        return path

    # ------------------------------------------------------------ host logs
    def write_host_logs(self, boot_unix_s=None):
        """Create the two log stand-ins (empty) and, with ``boot_unix_s``, ``proc/stat``'s ``btime``."""
        for path in (self.hypeman_log_path, self.kernel_log_path):
            if not os.path.exists(path):
                self._write(path, "")
        if boot_unix_s is not None:
            self._write(os.path.join(self.proc_root, "stat"),
                        "cpu  10 0 10 1000 0 0 0 0 0 0\nctxt 1000\nbtime %d\nprocesses 100\n" % boot_unix_s)

    @staticmethod
    def _append(path, text):
        _mkdir(os.path.dirname(path))
        with open(path, "a") as handle:
            handle.write(text)

    def log_vf_may_wedge(self, instance_id, unix_ns, device_path=None):
        """hypeman's warning after hard-killing a hypervisor that ignored SIGTERM, appended to the log stand-in."""
        if device_path is None:
            vf = self.instances.get(instance_id, {}).get("vf")
            device_path = "/sys/bus/pci/devices/%s" % vf if vf else ""
        line = vf_may_wedge_line(instance_id, device_path, unix_ns)
        self._append(self.hypeman_log_path, line + "\n")
        return line

    def log_oom_kill(self, pid, unix_ns, comm="qemu-system-x86", host="gpu-host"):
        """The kernel's two lines for an OOM kill (Linux 5.x and later), as rsyslog writes them to kern.log."""
        stamp = _rfc3339micro(unix_ns)
        lines = [
            "%s %s kernel: oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
            "task_memcg=/system.slice/hypeman.service,task=%s,pid=%d,uid=0" % (stamp, host, comm, pid),
            "%s %s kernel: Out of memory: Killed process %d (%s) total-vm:67108864kB, anon-rss:33554432kB, "
            "file-rss:4096kB, shmem-rss:0kB, UID:0 pgtables:66000kB oom_score_adj:0" % (stamp, host, pid, comm),
        ]
        self._append(self.kernel_log_path, "\n".join(lines) + "\n")
        return lines

    def describe(self):
        """JSON-ready description of the tree: paths, cards, instances, processes."""
        return {
            "root": self.root, "hypeman_log_path": self.hypeman_log_path, "kernel_log_path": self.kernel_log_path,
            "sysfs_root": self.sysfs_root, "proc_root": self.proc_root,
            "dev_root": self.dev_root, "data_dir": self.data_dir, "state_dir": self.state_dir,
            "config_path": self.config_path, "store_path": self.store_path, "boot_id": self.boot_id,
            "cards": [self.cards[a].describe() for a in sorted(self.cards)],
            "devices": [self.devices[a] for a in sorted(self.devices)],
            "vfs": {vf: {"card": i["card"], "index": i["index"], "iommu_group": i["iommu_group"],
                         "vfio": i["vfio"], "type": i.get("type", 0), "nodes": self.vf_nodes(vf)}
                    for vf, i in sorted(self.vf_info.items())},
            "instances": [self.instances[k] for k in sorted(self.instances)],
            "processes": [self.processes[k] for k in sorted(self.processes)],
        }


def _metadata(instance_id, name, hypervisor, idir, sock, pid, start_time, boot_id, profile, framework,
              device_path, mdev_uuid, claimed_at, build, retained):
    # Untagged Go field names in struct order; every field is written (§3.2).
    meta = {
        "Id": instance_id, "Name": name, "Image": "docker.io/library/ubuntu:24.04",
        "Size": 10737418240, "HotplugSize": 0, "OverlaySize": 10737418240, "Vcpus": 4,
        "CreatedAt": "2026-08-31T11:59:58.5Z", "StartedAt": "2026-08-31T12:00:01Z", "StoppedAt": None,
        "KernelVersion": "ch-6.12.8-kernel-1", "HypervisorType": hypervisor, "HypervisorVersion": "9.2.0",
        "HypervisorPID": pid, "HypervisorStartTime": start_time, "HypervisorBootID": boot_id,
        "SocketPath": sock, "DataDir": idir, "VsockCID": 42, "VsockSocket": os.path.join(idir, "vsock.sock"),
        "Devices": [], "GPUProfile": profile, "GPUFramework": framework, "GPUDevicePath": device_path,
        "GPUMdevUUID": mdev_uuid,
    }
    if build == "claimed":
        meta["GPUClaimedAt"] = claimed_at
    else:
        meta["GPUAssignedAt"] = claimed_at
        meta["GPURetainedForCleanup"] = bool(retained)
    return meta


def _rfc3339nano(unix_ns):
    """Go's RFC3339Nano in UTC (trailing zeros of the fraction dropped)."""
    sec, nsec = divmod(unix_ns, 10 ** 9)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    frac = ("%09d" % nsec).rstrip("0")
    return text + ("." + frac if frac else "") + "Z"


def _rfc3339micro(unix_ns):
    """rsyslog's RFC 3339 timestamp with microseconds and a numeric offset (UTC here)."""
    sec, nsec = divmod(unix_ns, 10 ** 9)
    return "%s.%06d+00:00" % (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)), nsec // 1000)


def _mkdir(path):
    if not os.path.isdir(path):
        os.makedirs(path)


def _rmtree(path):
    for base, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(base, name))
        for name in dirs:
            full = os.path.join(base, name)
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        os.rmdir(path)


def build_from_layout(root, layout):
    """Build a tree from a layout dict (the CLI's ``--layout``). Keys, all optional:

    - ``boot_id``: the host's boot id;
    - ``cards``: ``[{model, address, numvfs, minor, framework, realistic,
      types: {vf: profile}, creatable: {vf: [names]}, creatable_raw: {vf: text}}]``
      (``vf`` is an address or ``<pf>@<index>``);
    - ``devices``: ``[{address, vendor, device, class, sriov_totalvfs, driver}]``,
      PCI devices that are not cards (see :meth:`HostTree.add_device`);
    - ``instances``: ``[{id, vf, profile, name, build, claimed_at, liveness, pid,
      hypervisor, retained_for_cleanup, set_type, framework, extra}]``
      (see :meth:`HostTree.add_instance`);
    - ``processes``: ``[{pid, comm, cmdline, unit, fds, state, start_time, sockets}]``;
    - ``config``: ``{threshold}`` or ``{raw}``;
    - ``store``: ``{records}`` / ``{raw}`` (text, or a JSON value written as is);
    - ``logs``: ``{boot_ago_s, hypeman: [{instance, ago_s, device_path}], oom: [{pid | instance,
      ago_s, comm}]}``: the log stand-ins (``var/log/hypeman.log``, ``var/log/kern.log``) with
      hypeman's "device may wedge" warnings and kernel OOM kills, ``ago_s`` seconds before now;
      ``boot_ago_s`` writes ``proc/stat``'s ``btime``;
    - ``faults``: ``[{path, how}]`` applied last (paths relative to the root).
    """
    tree = HostTree(root, boot_id=layout.get("boot_id", DEFAULT_BOOT_ID))
    for spec in layout.get("cards", []):
        tree.add_card(spec.get("model", "L40S"), spec["address"], numvfs=spec.get("numvfs"),
                      minor=spec.get("minor"), framework=spec.get("framework", "vendor-vfio"),
                      realistic=spec.get("realistic", True))
        for vf, profile in sorted(spec.get("types", {}).items()):
            tree.set_current_type(vf, profile)
        for vf, names in sorted(spec.get("creatable", {}).items()):
            tree.set_creatable(vf, types=names)
        for vf, raw in sorted(spec.get("creatable_raw", {}).items()):
            tree.set_creatable(vf, raw=raw)
    for spec in layout.get("devices", []):
        spec = dict(spec)
        if "class" in spec:
            spec["pci_class"] = spec.pop("class")
        tree.add_device(**spec)
    for spec in layout.get("instances", []):
        spec = dict(spec)
        instance_id = spec.pop("id")
        tree.add_instance(instance_id, **spec)
    for spec in layout.get("processes", []):
        tree.add_process(**spec)
    if "config" in layout:
        tree.write_config(**layout["config"])
    if "store" in layout:
        tree.write_store(**layout["store"])
    if "logs" in layout:
        logs = layout["logs"]
        now = time.time_ns()
        boot_ago = logs.get("boot_ago_s")
        tree.write_host_logs(None if boot_ago is None else now // 10 ** 9 - int(boot_ago))
        for spec in logs.get("hypeman", []):
            tree.log_vf_may_wedge(spec["instance"], now - int(spec.get("ago_s", 600)) * 10 ** 9,
                                  spec.get("device_path"))
        for spec in logs.get("oom", []):
            pid = spec["pid"] if "pid" in spec else tree.instances[spec["instance"]]["pid"]
            tree.log_oom_kill(pid, now - int(spec.get("ago_s", 300)) * 10 ** 9, spec.get("comm", "qemu-system-x86"))
    for fault in layout.get("faults", []):
        tree.break_path(fault["path"], fault.get("how", "eisdir"))
    return tree


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m tests.sim.hosttree",
                                     description="Build a simulated hypeman vGPU host tree.")
    sub = parser.add_subparsers(dest="command")
    build = sub.add_parser("build", help="build a tree and print what was built as JSON")
    build.add_argument("--root", required=True, help="directory to build in (must be empty or absent)")
    build.add_argument("--layout", default="{}", help="layout as JSON, or @FILE holding JSON")
    args = parser.parse_args(argv)
    if args.command != "build":
        parser.print_help()
        return 2
    text = args.layout
    if text.startswith("@"):
        with open(text[1:]) as handle:
            text = handle.read()
    try:
        layout = json.loads(text)
    except ValueError as err:
        sys.stderr.write("layout is not valid JSON: %s\n" % err)
        return 2
    if os.path.isdir(args.root) and os.listdir(args.root):
        sys.stderr.write("root %s is not empty\n" % args.root)
        return 2
    try:
        tree = build_from_layout(args.root, layout)
    except (KeyError, ValueError, TypeError) as err:
        sys.stderr.write("bad layout: %s\n" % err)
        return 2
    sys.stdout.write(json.dumps(tree.describe(), indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
