# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_proc: who holds NVIDIA / VFIO device nodes open, and which card's nodes those are."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _busy, _proc
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path)
    tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.add_card("L40S", "0000:83:00.0", numvfs=2)
    return tree


@pytest.mark.parametrize("text, unit", [
    ("0::/system.slice/nvidia-dcgm.service\n", "nvidia-dcgm.service"),
    ("12:cpu,cpuacct:/x\n1:name=systemd:/system.slice/hypeman.service\n", "hypeman.service"),
    ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/dcgm-exporter.service\n", "dcgm-exporter.service"),
    ("0::/system.slice/hypeman.service/vmm\n", "hypeman.service"),
    ("0::/\n", None),
    ("garbage\n", None),
])
def test_unit_from_cgroup(text, unit):
    assert _proc.unit_from_cgroup(text) == unit


def test_scan_finds_nvidia_and_vfio_holders_only(tree):
    vf = tree.cards["0000:82:00.0"].vfs[0]
    dcgm = tree.add_process(comm="nv-hostengine", cmdline=["/usr/bin/nv-hostengine", "-n"],
                            unit="nvidia-dcgm.service", fds=["nvidia0", "nvidia1", "nvidiactl"])
    vmm = tree.add_process(comm="qemu-system-x86", unit="hypeman.service", fds=tree.vf_nodes(vf),
                           sockets=["/run/x.sock"])
    tree.add_process(comm="bash", fds=["null", "/etc/passwd"])
    holders = _proc.scan_device_holders(tree.proc_root, tree.dev_root)
    assert holders == [
        {"pid": dcgm, "command": "nv-hostengine", "cmdline": "/usr/bin/nv-hostengine -n",
         "unit": "nvidia-dcgm.service",
         "paths": sorted(os.path.join(tree.dev_root, n) for n in ("nvidia0", "nvidia1", "nvidiactl"))},
        {"pid": vmm, "command": "qemu-system-x86", "cmdline": "qemu-system-x86", "unit": "hypeman.service",
         "paths": sorted(os.path.join(tree.dev_root, n) for n in tree.vf_nodes(vf))},
    ]


def test_a_process_exiting_mid_scan_is_ignored(tree):
    pid = tree.add_process(comm="gone", fds=["nvidia0"])
    os.rename(os.path.join(tree.proc_root, str(pid), "fd"), os.path.join(tree.proc_root, str(pid), "fd.old"))
    assert _proc.scan_device_holders(tree.proc_root, tree.dev_root) == []


@pytest.mark.parametrize("what", ["fd-dir", "fd-link"])
def test_any_other_unreadable_entry_fails_closed(tree, what):
    pid = tree.add_process(comm="odd", fds=["nvidia0"])
    fd_dir = os.path.join(tree.proc_root, str(pid), "fd")
    if what == "fd-dir":
        tree.break_path(os.path.relpath(fd_dir, tree.root), "garbage")
        expected = "read process %d file descriptors: %s" % (pid, fd_dir)
    else:
        os.unlink(os.path.join(fd_dir, "3"))
        with open(os.path.join(fd_dir, "3"), "w") as handle:  # not a link: readlink fails with EINVAL
            handle.write("")
        expected = "read process %d file descriptor 3" % pid
    with pytest.raises(VgpuError) as err:
        _proc.scan_device_holders(tree.proc_root, tree.dev_root)
    assert expected in err.value.msg


def test_missing_proc_root_fails(tmp_path):
    with pytest.raises(VgpuError) as err:
        _proc.scan_device_holders(str(tmp_path / "proc"), "/dev")
    assert "cannot list processes in %s" % (tmp_path / "proc") in err.value.msg


def test_nvidia_minor(tree):
    assert _busy.nvidia_minor(tree.proc_root, "0000:82:00.0") == 0
    assert _busy.nvidia_minor(tree.proc_root, "0000:83:00.0") == 1
    assert _busy.nvidia_minor(tree.proc_root, "0000:99:00.0") is None


@pytest.mark.parametrize("rel, minor, kind", [
    ("nvidia0", 0, "card"), ("nvidia1", 0, "other"), ("nvidia1", None, "card"),
    ("nvidiactl", 0, "shared"), ("nvidia-uvm", 0, "shared"), ("nvidia-caps/nvidia-cap1", 0, "shared"),
    ("vfio/23", 0, "vfio"),
])
def test_card_node_kind(rel, minor, kind):
    assert _busy.card_node_kind(rel, minor) == kind


def test_card_holders(tree):
    card = tree.cards["0000:83:00.0"]
    other_vf = tree.cards["0000:82:00.0"].vfs[0]
    dcgm = tree.add_process(comm="nv-hostengine", unit="nvidia-dcgm.service",
                            fds=["nvidia0", "nvidia1", "nvidiactl"])
    smi = tree.add_process(comm="nvidia-smi", fds=["nvidiactl"])
    vmm = tree.add_process(comm="qemu-system-x86", unit="hypeman.service", fds=tree.vf_nodes(card.vfs[1]))
    tree.add_process(comm="qemu-other", unit="hypeman.service", fds=tree.vf_nodes(other_vf))
    nodes = _busy.card_nodes(tree.sysfs_root, tree.proc_root, tree.dev_root, card.address)
    assert nodes["minor"] == 1 and nodes["card"] == os.path.join(tree.dev_root, "nvidia1")
    for vf in card.vfs:
        for node in tree.vf_nodes(vf):
            assert os.path.join(tree.dev_root, node) in nodes["vfio"]
    holders = _busy.holders_of_nodes(_proc.scan_device_holders(tree.proc_root, tree.dev_root), nodes, tree.dev_root)
    by_pid = dict((h["pid"], h) for h in holders)
    assert sorted(by_pid) == [dcgm, smi, vmm]
    assert by_pid[dcgm]["card_paths"] == [os.path.join(tree.dev_root, "nvidia1")]
    assert by_pid[dcgm]["paths"] == sorted([os.path.join(tree.dev_root, "nvidia1"),
                                            os.path.join(tree.dev_root, "nvidiactl")])
    assert by_pid[dcgm]["shared_only"] is False
    assert by_pid[smi]["shared_only"] is True and by_pid[smi]["card_paths"] == []
    assert by_pid[vmm]["shared_only"] is False
    without_shared = _busy.holders_of_nodes(_proc.scan_device_holders(tree.proc_root, tree.dev_root), nodes,
                                            tree.dev_root, include_shared=False)
    assert sorted(h["pid"] for h in without_shared) == [dcgm, vmm]


def test_unknown_minor_counts_every_card_node(tree):
    tree.break_path(os.path.relpath(os.path.join(tree.proc_root, "driver"), tree.root), "missing")
    tree.add_process(comm="nv-hostengine", fds=["nvidia0"])
    nodes = _busy.card_nodes(tree.sysfs_root, tree.proc_root, tree.dev_root, "0000:83:00.0")
    assert nodes["minor"] is None and nodes["card"] is None
    holders = _busy.holders_of_nodes(_proc.scan_device_holders(tree.proc_root, tree.dev_root), nodes, tree.dev_root)
    assert [h["command"] for h in holders] == ["nv-hostengine"]
