# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A parent GPU's SR-IOV state as sysfs shows it, and what counts as enabled or disabled (standard library only).

:class:`Snapshot` reads the card's ``sriov_numvfs``/``sriov_totalvfs``, its
``virtfn*`` VFs and whether hypeman could use each of them; ``gpu_sriov``
verifies every ``sriov-manage`` run against it instead of trusting the exit
code (docs/hypeman-interface.md §6, §8).
"""

from __future__ import annotations

import os

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sysfs

# How many addresses a message lists before it says "and N more".
LIST_LIMIT = 8


def shorten(items):
    """``a, b, c`` for up to :data:`LIST_LIMIT` items, then ``and N more``."""
    items = list(items)
    if len(items) <= LIST_LIMIT:
        return ", ".join(items)
    return "%s and %d more" % (", ".join(items[:LIST_LIMIT]), len(items) - LIST_LIMIT)


def _read_int(path):
    return _sysfs.go_atoi(_sysfs.read_attribute(path).strip())


def expected_vf_addresses(sysfs_root, address, total):
    """VF addresses the kernel will create: the PF's routing id + ``sriov_offset`` + k * ``sriov_stride``.

    None when the card does not say (no readable offset/stride).
    """
    base = os.path.join(_sysfs.pci_devices_dir(sysfs_root), address)
    try:
        offset = _read_int(os.path.join(base, "sriov_offset"))
        stride = _read_int(os.path.join(base, "sriov_stride"))
    except (IOError, OSError, ValueError):
        return None
    domain, bus, rest = address.split(":")
    dev, func = rest.split(".")
    rid = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(func, 16)
    out = []
    for k in range(total or 0):
        vf_rid = rid + offset + k * stride
        out.append("%s:%02x:%02x.%x" % (domain, (vf_rid >> 8) & 0xFF, (vf_rid >> 3) & 0x1F, vf_rid & 0x7))
    return out


class Snapshot(object):
    """The card's SR-IOV state as sysfs shows it at one moment."""

    def __init__(self, sysfs_root, address):
        parent = _sysfs.read_parent(sysfs_root, address)
        self.address = address
        self.exists = parent["exists"]
        self.errors = list(parent["errors"])
        self.vendor_id = parent["vendor_id"]
        self.numvfs = parent["sriov_numvfs"]
        self.totalvfs = parent["sriov_totalvfs"]
        self.virtfns = parent["virtfns"]
        self.discovery = _sysfs.discover(sysfs_root) if self.virtfns or self.numvfs else None
        self._found = self.discovery.vf_map() if self.discovery is not None else {}
        self._unreadable = {}
        for entry in self.discovery.unreadable if self.discovery is not None else []:
            self._unreadable.setdefault(entry["address"], entry)
        self.vfs = [self._vf_view(sysfs_root, fn) for fn in self.virtfns]
        # Every VF of the card: virtfn links plus anything whose physfn still points here.
        addresses = set(fn["address"] for fn in self.virtfns)
        if self.discovery is not None:
            addresses.update(vf["address"] for vf in self.discovery.vfs if vf["parent"] == address)
            addresses.update(entry["address"] for entry in self.discovery.unreadable if entry["parent"] == address)
        self.all_vf_addresses = sorted(addresses)

    def _vf_view(self, sysfs_root, fn):
        view = {"index": fn["index"], "address": fn["address"], "readable": False, "current_type": None,
                "creatable_types": None, "error": None}
        found = self._found.get(fn["address"])
        unreadable = self._unreadable.get(fn["address"])
        if found is not None:
            view["current_type"] = found["current_type"]
            if found["parent"] != self.address:
                view["error"] = "physfn of VF %s points at %s, not at %s" % (
                    fn["address"], found["parent"], self.address)
            elif found["creatable"] is None:
                view["error"] = found["creatable_error"]
            else:
                view["readable"] = True
                view["creatable_types"] = [p["name"] for p in found["creatable"]]
        elif unreadable:
            view["error"] = unreadable["error"]
        elif not os.path.isdir(os.path.join(_sysfs.pci_devices_dir(sysfs_root), fn["address"])):
            view["error"] = "virtfn%d points at %s, which is not a device in sysfs" % (fn["index"], fn["address"])
        else:
            view["error"] = ("VF %s has no vGPU files (no nvidia/creatable_vgpu_types): the nvidia driver has not "
                             "probed it" % fn["address"])
        return view

    def allocated(self):
        """``(allocated, unreadable)`` VFs of the card from hypeman's discovery."""
        if self.discovery is None:
            return [], []
        allocated = [{"vf": vf["address"], "current_type": vf["current_type"]}
                     for vf in self.discovery.vfs if vf["address"] in self.all_vf_addresses and vf["allocated"]]
        unreadable = [{"vf": e["address"], "error": e["error"]}
                      for e in self.discovery.unreadable if e["address"] in self.all_vf_addresses]
        return allocated, unreadable

    def summary(self):
        return {"sriov_numvfs": self.numvfs, "sriov_totalvfs": self.totalvfs,
                "vfs": [fn["address"] for fn in self.virtfns]}

    def enabled_problems(self, need_types):
        """What keeps the card from counting as enabled; [] when it does."""
        problems = []
        if self.numvfs != self.totalvfs:
            problems.append("sriov_numvfs is %s, expected sriov_totalvfs %s" % (self.numvfs, self.totalvfs))
        if len(self.virtfns) != (self.totalvfs or 0):
            problems.append("%d virtfn link(s), expected %s" % (len(self.virtfns), self.totalvfs))
        unreadable = [vf for vf in self.vfs if not vf["readable"]]
        if unreadable:
            problems.append("unreadable VF(s): %s" % "; ".join(vf["error"] for vf in unreadable[:LIST_LIMIT]))
            if len(unreadable) > LIST_LIMIT:
                problems[-1] += "; and %d more" % (len(unreadable) - LIST_LIMIT)
        if need_types:
            empty = [vf["address"] for vf in self.vfs if vf["readable"] and not vf["creatable_types"]]
            if empty:
                problems.append("VF(s) without creatable vGPU types: %s" % shorten(empty))
        return problems

    def disabled_problems(self, sysfs_root, old_vfs):
        problems = []
        if self.numvfs != 0:
            problems.append("sriov_numvfs is %s, expected 0" % self.numvfs)
        if self.virtfns:
            problems.append("virtfn links remain for %s" % shorten(fn["address"] for fn in self.virtfns))
        left = [vf for vf in old_vfs if os.path.lexists(os.path.join(_sysfs.pci_devices_dir(sysfs_root), vf))]
        if left:
            problems.append("VF devices still in sysfs: %s" % shorten(left))
        return problems
