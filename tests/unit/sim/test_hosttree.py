# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shared host-tree fixture builder builds what a real host shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.hypeman.vgpu.tests.sim import hosttree
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree


def test_vf_addresses_follow_offset_and_stride_across_device_numbers():
    vfs = hosttree.vf_addresses("0000:82:00.0", 32, 4, 1)
    assert vfs[:5] == ["0000:82:00.4", "0000:82:00.5", "0000:82:00.6", "0000:82:00.7", "0000:82:01.0"]
    assert vfs[-1] == "0000:82:04.3"
    assert len(set(vfs)) == 32
    # A stride of 2 from a non-zero function skips functions.
    assert hosttree.vf_addresses("0001:3b:00.0", 3, 1, 2) == ["0001:3b:00.1", "0001:3b:00.3", "0001:3b:00.5"]


def test_card_layout_links_and_sriov_files(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("A100", "0000:c1:00.0", numvfs=5)
    pf = tree.pci_path("0000:c1:00.0")
    assert os.path.islink(pf)  # bus/pci/devices entries are links into devices/
    assert open(os.path.join(pf, "vendor")).read() == "0x10de\n"
    assert open(os.path.join(pf, "sriov_totalvfs")).read() == "16\n"
    assert open(os.path.join(pf, "sriov_numvfs")).read() == "5\n"
    assert os.path.basename(os.readlink(os.path.join(pf, "virtfn4"))) == card.vfs[4] == "0000:c1:01.0"
    vf = tree.pci_path(card.vfs[0])
    assert os.path.basename(os.readlink(os.path.join(vf, "physfn"))) == "0000:c1:00.0"
    assert os.path.realpath(os.path.join(vf, "physfn")) == os.path.realpath(pf)
    assert os.listdir(os.path.join(vf, "vfio-dev")) == ["vfio0"]
    group = os.path.basename(os.readlink(os.path.join(vf, "iommu_group")))
    assert os.path.exists(os.path.join(tree.dev_root, "vfio", group))
    assert os.path.exists(os.path.join(tree.dev_root, "nvidia0"))
    info = open(os.path.join(tree.proc_root, "driver", "nvidia", "gpus", "0000:c1:00.0", "information")).read()
    assert "Device Minor: \t 0" in info


def test_creatable_list_has_driver_header_and_padding_and_shrinks(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=30)
    text = open(tree.pci_path(card.vfs[0], "nvidia", "creatable_vgpu_types")).read()
    lines = text.splitlines()
    assert lines[0] == "ID    : vGPU Name"
    assert "1147  : NVIDIA L40S-1Q" in lines
    # One active 2Q type: free VFs list only 2Q; the allocated VF lists only the header.
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-2Q")
    assert open(tree.pci_path(card.vfs[1], "nvidia", "creatable_vgpu_types")).read() == \
        "ID    : vGPU Name\n1148  : NVIDIA L40S-2Q\n"
    assert open(tree.pci_path(card.vfs[0], "nvidia", "creatable_vgpu_types")).read() == "ID    : vGPU Name\n"
    assert open(tree.pci_path(card.vfs[0], "nvidia", "current_vgpu_type")).read() == "1148\n"
    # 24 x 2 GB fill the 48 GB card: the list shrinks to the header only.
    for vf in card.vfs[1:24]:
        tree.set_current_type(vf, 1148)
    assert open(tree.pci_path(card.vfs[25], "nvidia", "creatable_vgpu_types")).read() == "ID    : vGPU Name\n"


def test_instances_of_both_builds(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    claimed = tree.add_instance("a", vf=card.vfs[0], profile="NVIDIA L40S-2Q")
    assigned = tree.add_instance("b", vf=card.vfs[1], profile="NVIDIA L40S-2Q", build="assigned",
                                 retained_for_cleanup=True, liveness="stopped")
    on_disk = json.load(open(os.path.join(tree.data_dir, "guests", "a", "metadata.json")))
    assert on_disk == claimed
    assert claimed["GPUClaimedAt"] == hosttree.DEFAULT_CLAIMED_AT and "GPUAssignedAt" not in claimed
    assert claimed["GPUDevicePath"] == "/sys/bus/pci/devices/0000:82:00.4"
    assert assigned["GPUAssignedAt"] and assigned["GPURetainedForCleanup"] is True
    assert assigned["HypervisorPID"] is None
    # The running VMM holds the VF's VFIO nodes and listens on the control socket.
    pid = claimed["HypervisorPID"]
    targets = [os.readlink(os.path.join(tree.proc_root, str(pid), "fd", fd))
               for fd in os.listdir(os.path.join(tree.proc_root, str(pid), "fd"))]
    for node in tree.vf_nodes(card.vfs[0]):
        assert os.path.join(tree.dev_root, node) in targets
    assert claimed["SocketPath"] in open(os.path.join(tree.proc_root, "net", "unix")).read()
    stat = open(os.path.join(tree.proc_root, str(pid), "stat")).read()
    assert stat.split(")")[1].split()[19] == str(claimed["HypervisorStartTime"])


def test_mdev_card(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2, framework="mdev")
    assert os.path.islink(os.path.join(tree.sysfs_root, "class", "mdev_bus", card.vfs[0]))
    assert not os.path.exists(tree.pci_path(card.vfs[0], "nvidia"))
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-2Q")
    uuid = tree.mdev_uuid(card.vfs[0])
    link = os.readlink(os.path.join(tree.sysfs_root, "bus", "mdev", "devices", uuid))
    assert link.split("/")[-2:] == [card.vfs[0], uuid]
    tree.set_current_type(card.vfs[0], 0)
    assert not os.path.lexists(os.path.join(tree.sysfs_root, "bus", "mdev", "devices", uuid))


def test_remove_and_enable_vfs(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3)
    first = list(card.vfs)
    tree.remove_vfs("0000:82:00.0")
    assert not os.path.lexists(tree.pci_path(first[0]))
    assert open(tree.pci_path("0000:82:00.0", "sriov_numvfs")).read() == "0\n"
    assert tree.enable_vfs("0000:82:00.0", 3) == first


@pytest.mark.parametrize("how", ["eisdir", "eloop", "missing", "garbage"])
def test_break_path(tmp_path, how):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=1)
    path = tree.break_path(os.path.relpath(tree.pci_path(card.vfs[0], "nvidia", "current_vgpu_type"), tree.root), how)
    if how == "garbage":
        assert "garbage" in open(path).read()
    else:
        with pytest.raises((IOError, OSError)):
            open(path).read()


def test_cli_builds_from_json_layout(tmp_path):
    layout = {"cards": [{"model": "H100", "address": "0000:41:00.0", "numvfs": 2,
                         "types": {"0000:41:00.0@1": "NVIDIA H100-4C"}}],
              "instances": [{"id": "x", "vf": "0000:41:00.0@1", "profile": "NVIDIA H100-4C", "set_type": False}],
              "processes": [{"comm": "nv-hostengine", "unit": "nvidia-dcgm.service", "fds": ["nvidia0"]}],
              "config": {"threshold": 3}, "store": {"records": []}}
    root = str(tmp_path / "host")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run([sys.executable, "-m", "tests.sim.hosttree", "build", "--root", root,
                          "--layout", json.dumps(layout)], cwd=repo, check=True, capture_output=True, text=True)
    described = json.loads(out.stdout)
    assert described["cards"][0]["vfs"] == ["0000:41:00.4", "0000:41:00.5"]
    assert described["vfs"]["0000:41:00.5"]["type"] == 1057
    assert described["instances"][0]["vf"] == "0000:41:00.5"
    assert described["processes"][-1]["unit"] == "nvidia-dcgm.service"
    assert "vf_quarantine_threshold: 3" in open(described["config_path"]).read()
    # A second build into the same (now non-empty) root is refused.
    again = subprocess.run([sys.executable, "-m", "tests.sim.hosttree", "build", "--root", root],
                           cwd=repo, capture_output=True, text=True, check=False)
    assert again.returncode == 2 and "not empty" in again.stderr
    bad = subprocess.run([sys.executable, "-m", "tests.sim.hosttree", "build", "--root", str(tmp_path / "b"),
                          "--layout", '{"cards": [{"model": "L40S"}]}'], cwd=repo, capture_output=True, text=True,
                         check=False)
    assert bad.returncode == 2 and "bad layout" in bad.stderr


def test_devices_that_are_not_cards(tmp_path):
    layout = {"cards": [{"model": "L40S", "address": "0000:82:00.0", "numvfs": 1}],
              "devices": [{"address": "0000:3b:00.0"},
                          {"address": "0000:3c:00.0", "sriov_totalvfs": 0},
                          {"address": "0000:17:00.0", "vendor": "0x8086", "device": "0x1593", "class": "0x020000",
                           "sriov_totalvfs": 64, "driver": "ice"}]}
    tree = hosttree.build_from_layout(str(tmp_path), layout)
    # An NVIDIA GPU without SR-IOV: vendor files, a driver, no sriov_* files.
    t4 = tree.pci_path("0000:3b:00.0")
    assert os.path.islink(t4)
    assert open(os.path.join(t4, "vendor")).read() == "0x10de\n"
    assert os.path.basename(os.readlink(os.path.join(t4, "driver"))) == "nvidia"
    assert not os.path.exists(os.path.join(t4, "sriov_totalvfs"))
    assert open(tree.pci_path("0000:3c:00.0", "sriov_totalvfs")).read() == "0\n"
    nic = tree.pci_path("0000:17:00.0")
    assert open(os.path.join(nic, "vendor")).read() == "0x8086\n"
    assert open(os.path.join(nic, "class")).read() == "0x020000\n"
    assert open(os.path.join(nic, "sriov_totalvfs")).read() == "64\n"
    assert open(os.path.join(nic, "sriov_numvfs")).read() == "0\n"
    assert os.path.basename(os.readlink(os.path.join(nic, "driver"))) == "ice"
    # None of them is a card or a VF.
    described = tree.describe()
    assert [c["address"] for c in described["cards"]] == ["0000:82:00.0"]
    assert list(described["vfs"]) == ["0000:82:00.4"]
    assert [d["address"] for d in described["devices"]] == ["0000:17:00.0", "0000:3b:00.0", "0000:3c:00.0"]
    assert described["devices"][0]["class"] == "0x020000"
    with pytest.raises(ValueError, match="already exists"):
        tree.add_device("0000:82:00.0")
    with pytest.raises(ValueError, match="already exists"):
        tree.add_card("L40S", "0000:3b:00.0")
