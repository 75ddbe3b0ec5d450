# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_sysfs: discovery as hypeman does it, on realistic host trees."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree


def _rel(tree, path):
    return os.path.relpath(path, tree.root)


# -- parsing -------------------------------------------------------------------------


def test_parse_creatable_header_padding_and_blank_lines():
    text = "ID    : vGPU Name\n1147  : NVIDIA L40S-1Q\n\n1428 : NVIDIA H200X-141C\n  12   :   NVIDIA X-2B  \n"
    assert _sysfs.parse_creatable(text) == [
        {"id": "1147", "name": "NVIDIA L40S-1Q", "framebuffer_mb": 1024},
        {"id": "1428", "name": "NVIDIA H200X-141C", "framebuffer_mb": 141 * 1024},
        {"id": "12", "name": "NVIDIA X-2B", "framebuffer_mb": 2048},
    ]


def test_parse_creatable_only_header_is_empty():
    assert _sysfs.parse_creatable("ID    : vGPU Name\n") == []
    assert _sysfs.parse_creatable("") == []


@pytest.mark.parametrize("text, message", [
    ("ID    : vGPU Name\ngarbage\n", 'parse creatable vGPU types line 2: "garbage"'),
    ("ID    : vGPU Name\n1147  :   \n", 'parse creatable vGPU types line 2: "1147  :"'),
    ("ID    : vGPU Name\nabc : NVIDIA L40S-1Q\n", 'parse vGPU type ID "abc"'),
    ("ID    : vGPU Name\n1_0 : NVIDIA L40S-1Q\n", 'parse vGPU type ID "1_0"'),  # Python int() would accept it
    ("ID    : vGPU Name\nbad\tline\x7f\n", 'parse creatable vGPU types line 2: "bad\\tline\\x7f"'),  # Go's %q
])
def test_parse_creatable_rejects_garbage_like_hypeman(text, message):
    with pytest.raises(ValueError) as err:
        _sysfs.parse_creatable(text)
    assert message in str(err.value)


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA L40S-12Q", 12288),
    ("NVIDIA L40S-1B", 1024),
    ("NVIDIA L40S-48A", 49152),
    ("NVIDIA A100-1-5C", 5120),
    ("NVIDIA L40S-0Q", 0),
    ("NVIDIA L40S-Q", 0),
    ("GRID", 0),
    ("Q", 0),
    ("NVIDIA-L40S", 0),
])
def test_framebuffer_from_profile_name(name, expected):
    assert _sysfs.framebuffer_from_profile_name(name) == expected


def test_go_atoi():
    assert _sysfs.go_atoi("+7") == 7 and _sysfs.go_atoi("-0") == 0
    for bad in ("", " 1", "1.0", "0x10", "9" * 20, "١"):
        with pytest.raises(ValueError):
            _sysfs.go_atoi(bad)


def test_normalize_card_address():
    assert _sysfs.normalize_card_address("82:00.0") == "0000:82:00.0"
    assert _sysfs.normalize_card_address("0000:E3:00.0") == "0000:e3:00.0"
    with pytest.raises(VgpuError) as err:
        _sysfs.normalize_card_address(4920.0)
    assert "4920.0" in err.value.msg and "quote it" in err.value.msg
    with pytest.raises(VgpuError) as err:
        _sysfs.normalize_card_address("gpu0")
    assert "'gpu0'" in err.value.msg and "0000:82:00.0" in err.value.msg


# -- framework detection -----------------------------------------------------------------


def test_detect_none_on_empty_and_missing_trees(tmp_path):
    tree = HostTree(tmp_path / "empty")
    assert _sysfs.detect_framework(tree.sysfs_root) == ("none", [])
    missing = _sysfs.discover(str(tmp_path / "nothing"))
    assert missing.framework == "none" and missing.vfs == [] and missing.error is None
    assert "does not exist" in missing.warnings[0]


def test_detect_vendor_vfio_and_mdev_first(tmp_path):
    tree = HostTree(tmp_path)
    tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    assert _sysfs.detect_framework(tree.sysfs_root)[0] == "vendor-vfio"
    tree.add_card("L40S", "0000:83:00.0", numvfs=2, framework="mdev")
    assert _sysfs.detect_framework(tree.sysfs_root)[0] == "mdev"


def test_sriov_card_without_vfs_is_not_a_vgpu_host(tmp_path):
    tree = HostTree(tmp_path)
    tree.add_card("L40S", "0000:82:00.0", numvfs=0)
    assert _sysfs.detect_framework(tree.sysfs_root)[0] == "none"
    assert _sysfs.list_sriov_gpus(tree.sysfs_root) == ["0000:82:00.0"]


def test_an_unreadable_vf_still_makes_a_vendor_vfio_host(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=1)
    tree.break_path(_rel(tree, tree.pci_path(card.vfs[0], "nvidia")), "eloop")
    assert _sysfs.detect_framework(tree.sysfs_root)[0] == "vendor-vfio"


# -- vendor-VFIO discovery -----------------------------------------------------------------


def test_discover_vendor_vfio(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=32)
    tree.set_current_type(card.vfs[5], "NVIDIA L40S-4Q")
    found = _sysfs.discover(tree.sysfs_root)
    assert found.framework == "vendor-vfio" and found.error is None and found.unreadable == []
    assert [vf["address"] for vf in found.vfs] == sorted(card.vfs)
    vf = found.vf_map()[card.vfs[5]]
    assert vf["parent"] == "0000:82:00.0"
    assert vf["current_type"] == "1150" and vf["allocated"] is True
    assert vf["creatable"] == []
    free = found.vf_map()[card.vfs[0]]
    assert free["allocated"] is False
    assert [p["name"] for p in free["creatable"]] == ["NVIDIA L40S-4Q"]


def test_one_unreadable_vf_is_reported_and_skipped(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3)
    tree.break_path(_rel(tree, tree.pci_path(card.vfs[1], "nvidia", "current_vgpu_type")), "eisdir")
    found = _sysfs.discover(tree.sysfs_root)
    assert [vf["address"] for vf in found.vfs] == [card.vfs[0], card.vfs[2]]
    assert found.error is None
    assert found.unreadable == [{
        "address": card.vfs[1], "parent": "0000:82:00.0",
        "path": tree.pci_path(card.vfs[1], "nvidia", "current_vgpu_type"),
        "error": "read current vGPU type for VF %s: Is a directory" % card.vfs[1]}]


@pytest.mark.parametrize("inside", [False, True])
def test_a_vfs_nvidia_directory_linked_out_of_the_root_is_refused(tmp_path, inside):
    tree = HostTree(tmp_path / "host")
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    nvidia = tree.pci_path(card.vfs[1], "nvidia")
    elsewhere = os.path.join(tree.sysfs_root, "moved") if inside else str(tmp_path / "outside")
    os.rename(nvidia, elsewhere)
    os.symlink(elsewhere, nvidia)
    found = _sysfs.discover(tree.sysfs_root)
    if inside:  # a link that stays in the root is read like any other
        assert [vf["address"] for vf in found.vfs] == card.vfs[:2] and found.unreadable == []
        return
    assert [vf["address"] for vf in found.vfs] == [card.vfs[0]]
    assert found.unreadable == [{
        "address": card.vfs[1], "parent": "0000:82:00.0", "path": nvidia,
        "error": "VF %s: %s is a symlink to %s, outside %s; refused" % (card.vfs[1], nvidia, elsewhere,
                                                                        tree.sysfs_root)}]


def test_garbage_current_type_is_unreadable(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.break_path(_rel(tree, tree.pci_path(card.vfs[0], "nvidia", "current_vgpu_type")), "garbage")
    found = _sysfs.discover(tree.sysfs_root)
    assert found.unreadable[0]["address"] == card.vfs[0]
    assert "invalid current vGPU type" in found.unreadable[0]["error"]


def test_discovery_fails_only_when_no_vf_is_readable(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    for vf in card.vfs:
        tree.break_path(_rel(tree, tree.pci_path(vf, "nvidia", "current_vgpu_type")), "missing")
    found = _sysfs.discover(tree.sysfs_root)
    assert found.vfs == [] and len(found.unreadable) == 2
    assert found.error.startswith("vGPU discovery failed, no VF is readable: read current vGPU type for VF")


def test_garbage_creatable_list_keeps_the_vf_without_profiles(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.set_creatable(card.vfs[0], raw="ID    : vGPU Name\nnot a type line\n")
    found = _sysfs.discover(tree.sysfs_root)
    vf = found.vf_map()[card.vfs[0]]
    assert vf["creatable"] is None
    assert vf["creatable_error"] == ('read creatable vGPU types for VF %s: parse creatable vGPU types line 2: '
                                     '"not a type line"' % card.vfs[0])
    assert found.unreadable == []


def test_physfn_pointing_nowhere(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    physfn = tree.pci_path(card.vfs[0], "physfn")
    os.unlink(physfn)
    os.symlink("../0000:99:00.0", physfn)
    os.unlink(tree.pci_path(card.vfs[1], "physfn"))
    found = _sysfs.discover(tree.sysfs_root)
    # hypeman takes the link's basename, dangling or not; no link means no parent.
    assert found.vf_map()[card.vfs[0]]["parent"] == "0000:99:00.0"
    assert found.vf_map()[card.vfs[1]]["parent"] is None
    missing = _sysfs.read_parent(tree.sysfs_root, "0000:99:00.0")
    assert missing["exists"] is False and "no such device" in missing["errors"][0]


def test_uppercase_sysfs_names_are_normalised(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=1)
    upper = tree.pci_path("0000:E3:00.4")
    os.symlink(os.readlink(tree.pci_path(card.vfs[0])), upper)
    os.unlink(tree.pci_path(card.vfs[0]))
    found = _sysfs.discover(tree.sysfs_root)
    assert [vf["address"] for vf in found.vfs] == ["0000:e3:00.4"]


# -- parents and nodes ---------------------------------------------------------------------


def test_read_parent(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=12)
    info = _sysfs.read_parent(tree.sysfs_root, "0000:82:00.0")
    assert info["exists"] and info["errors"] == []
    assert (info["vendor_id"], info["device_id"], info["class_id"]) == ("10de", "26b9", "030200")
    assert (info["sriov_totalvfs"], info["sriov_numvfs"]) == (32, 12)
    assert [v["index"] for v in info["virtfns"]] == list(range(12))  # virtfn10 sorts after virtfn9
    assert [v["address"] for v in info["virtfns"]] == card.vfs


def test_read_parent_unreadable_and_absent_fields(tmp_path):
    tree = HostTree(tmp_path)
    tree.add_card("L40S", "0000:82:00.0", numvfs=1)
    tree.break_path(_rel(tree, tree.pci_path("0000:82:00.0", "sriov_numvfs")), "eisdir")
    tree.break_path(_rel(tree, tree.pci_path("0000:82:00.0", "sriov_totalvfs")), "missing")
    info = _sysfs.read_parent(tree.sysfs_root, "0000:82:00.0")
    assert info["sriov_numvfs"] is None and info["sriov_totalvfs"] is None
    assert len(info["errors"]) == 1 and "sriov_numvfs" in info["errors"][0]


def test_vfio_nodes(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=1)
    paths, errors = _sysfs.vfio_nodes(tree.sysfs_root, "/dev", card.vfs[0])
    group = tree.vf_info[card.vfs[0]]["iommu_group"]
    assert paths == ["/dev/vfio/devices/vfio0", "/dev/vfio/%d" % group] and errors == []
    tree.break_path(_rel(tree, tree.pci_path(card.vfs[0], "vfio-dev")), "garbage")
    paths, errors = _sysfs.vfio_nodes(tree.sysfs_root, "/dev", card.vfs[0])
    assert paths == ["/dev/vfio/%d" % group] and "read VFIO devices for VF" in errors[0]


# -- mdev --------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", ["0000", "0001", "00ff"])
def test_discover_mdev(tmp_path, domain):
    # A VF outside domain 0000 holds its mdevs like any other (they were once unseen there,
    # so gpu_sriov took such a card for free).
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", domain + ":82:00.0", numvfs=3, framework="mdev")
    tree.set_current_type(card.vfs[1], "NVIDIA L40S-2Q")
    found = _sysfs.discover(tree.sysfs_root)
    assert found.framework == "mdev"
    vf = found.vf_map()[card.vfs[1]]
    assert vf["allocated"] and vf["current_type"] == "nvidia-1148" and vf["mdev_uuids"] == [tree.mdev_uuid(card.vfs[1])]
    assert vf["parent"] == domain + ":82:00.0"
    free = found.vf_map()[card.vfs[0]]
    assert [p["name"] for p in free["creatable"]] == ["NVIDIA L40S-2Q"]
    assert free["creatable"][0]["available"] == 1
    assert {"id": "nvidia-1148", "name": "NVIDIA L40S-2Q", "framebuffer_mb": 2048} in found.mdev_profiles
    assert _sysfs.mdev_vfs(tree.sysfs_root)[tree.mdev_uuid(card.vfs[1])] == card.vfs[1]


def test_an_unlistable_mdev_directory_fails_naming_it(tmp_path):
    tree = HostTree(tmp_path)
    tree.add_card("L40S", "0000:82:00.0", numvfs=2, framework="mdev")
    path = os.path.join(tree.sysfs_root, "bus", "mdev", "devices")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write("not a directory")
    for read in (_sysfs.list_mdevs, _sysfs.discover):
        with pytest.raises(VgpuError, match="read mdev devices: cannot list .*bus/mdev/devices: Not a directory"):
            read(tree.sysfs_root)
