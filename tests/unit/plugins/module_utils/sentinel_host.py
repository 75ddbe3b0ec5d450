# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test helpers shared by the sentinel tests: a host tree and the scan as the module runs it."""

from __future__ import annotations

import json
import os

from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman, _sentinel_write
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree

CLAIMED_NS = 1788177600123456789  # 2026-08-31T12:00:00.123456789Z, hosttree's default claim time
CLAIMED_AT = "2026-08-31T12:00:00.123456789Z"
SEC = 10 ** 9


class Host(object):
    """A host tree with vGPU instances, and the scan as the module runs it."""

    def __init__(self, root):
        self.tree = HostTree(root)
        self.card = self.tree.add_card("L40S", "0000:82:00.0")
        self.state_dir = self.tree.state_dir

    def instance(self, instance_id, vf_index=0, claimed_at=CLAIMED_AT, **kwargs):
        self.tree.add_instance(instance_id, vf=self.card.vfs[vf_index], profile="NVIDIA L40S-2Q",
                               claimed_at=claimed_at, **kwargs)
        return self.app(instance_id)

    def reassign(self, instance_id, vf_index, claimed_at):
        """hypeman moves the instance to another VF without a new boot (same app.log)."""
        path = os.path.join(self.tree.data_dir, "guests", instance_id, "metadata.json")
        with open(path) as handle:
            meta = json.load(handle)
        meta["GPUDevicePath"] = "/sys/bus/pci/devices/%s" % self.card.vfs[vf_index]
        meta["GPUClaimedAt"] = claimed_at
        with open(path, "w") as handle:
            json.dump(meta, handle)

    def logs(self, instance_id):
        return _hypeman.instance_log_dir(self.tree.data_dir, instance_id)

    def app(self, instance_id):
        return os.path.join(self.logs(instance_id), "app.log")

    def scan(self, check_mode=False, only=None, recorder=None):
        instances, unreadable = _hypeman.list_instances(self.tree.data_dir)
        return _sentinel_write.run(instances, unreadable, self.logs, self.state_dir, only=only,
                                   check_mode=check_mode, recorder=recorder)[0]

    def cursor_path(self, instance_id):
        return os.path.join(self.state_dir, "sentinel", instance_id + ".json")


class MiniHost(object):
    """Only what the sentinel reads: ``guests/<id>/{metadata.json,logs/}`` and a state dir.

    Much cheaper than a full :class:`HostTree` (no sysfs, /proc or store), for
    tests that build many hosts (property tests, crash loops).
    """

    VFS = ["0000:82:%02x.%d" % (device, function) for device in (0, 1) for function in range(4)]

    def __init__(self, root):
        self.data_dir = os.path.join(str(root), "var", "lib", "hypeman")
        self.state_dir = os.path.join(str(root), "var", "lib", "hypeman-vgpu")
        os.makedirs(os.path.join(self.data_dir, "guests"))

    def metadata_path(self, instance_id):
        return os.path.join(self.data_dir, "guests", instance_id, "metadata.json")

    def instance(self, instance_id, vf_index=0, claimed_at=CLAIMED_AT):
        """A running vendor-VFIO instance (claim variant) with an empty app.log."""
        os.makedirs(self.logs(instance_id), exist_ok=True)
        self.reassign(instance_id, vf_index, claimed_at)
        with open(self.app(instance_id), "wb"):
            pass
        return self.app(instance_id)

    def reassign(self, instance_id, vf_index, claimed_at):
        meta = {"Id": instance_id, "Name": instance_id, "HypervisorType": "qemu",
                "GPUProfile": "NVIDIA L40S-2Q", "GPUFramework": "vendor-vfio",
                "GPUDevicePath": "/sys/bus/pci/devices/%s" % self.VFS[vf_index], "GPUMdevUUID": "",
                "GPUClaimedAt": claimed_at}
        with open(self.metadata_path(instance_id), "w") as handle:
            json.dump(meta, handle)

    def logs(self, instance_id):
        return _hypeman.instance_log_dir(self.data_dir, instance_id)

    def app(self, instance_id):
        return os.path.join(self.logs(instance_id), "app.log")

    def scan(self, check_mode=False, only=None, recorder=None):
        instances, unreadable = _hypeman.list_instances(self.data_dir)
        return _sentinel_write.run(instances, unreadable, self.logs, self.state_dir, only=only,
                                   check_mode=check_mode, recorder=recorder)[0]

    def cursor_path(self, instance_id):
        return os.path.join(self.state_dir, "sentinel", instance_id + ".json")


def verdicts(report):
    return {f["instance_id"]: (f["verdict"], f["ts"]) for f in report.findings}


def markers_read(report, instance_id=None):
    return sum(s["markers"] for s in report.scanned if instance_id in (None, s["instance_id"]))


def ts(offset_s):
    return guestlog.rfc3339nano(CLAIMED_NS + offset_s * SEC)
