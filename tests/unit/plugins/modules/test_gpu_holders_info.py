# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_holders_info: holders of a card's nodes, or of every GPU node."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.modules import gpu_holders_info
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module


def run(tree, capsys, **args):
    params = {"sysfs_root": tree.sysfs_root, "proc_root": tree.proc_root, "dev_root": tree.dev_root}
    params.update(args)
    return run_module(gpu_holders_info.main, params, capsys)


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path)
    first = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.add_card("L40S", "0000:83:00.0", numvfs=2)
    tree.add_process(pid=2314, comm="nv-hostengine", unit="nvidia-dcgm.service", fds=["nvidia0", "nvidiactl"])
    tree.add_process(pid=2400, comm="dcgm-exporter", unit="nvidia-dcgm-exporter.service", fds=["nvidiactl"])
    tree.add_instance("vm", vf="0000:83:00.0@1", profile="NVIDIA L40S-2Q", pid=5000)
    tree.add_process(pid=6000, comm="sleep", fds=["null"])
    assert first.minor == 0
    return tree


def test_every_holder(tree, capsys):
    result = run(tree, capsys)
    assert [(h["pid"], h["command"], h["unit"]) for h in result["holders"]] == [
        (2314, "nv-hostengine", "nvidia-dcgm.service"),
        (2400, "dcgm-exporter", "nvidia-dcgm-exporter.service"),
        (5000, "qemu-system-x86", "hypeman.service")]
    assert result["units"] == ["hypeman.service", "nvidia-dcgm-exporter.service", "nvidia-dcgm.service"]
    assert "card" not in result and result["changed"] is False


def test_one_card(tree, capsys):
    result = run(tree, capsys, parent_gpu="82:00.0")
    assert result["card"]["address"] == "0000:82:00.0" and result["card"]["minor"] == 0
    assert result["card"]["node"] == os.path.join(tree.dev_root, "nvidia0")
    assert [(h["pid"], h["shared_only"]) for h in result["holders"]] == [(2314, False), (2400, True)]
    assert result["holders"][0]["card_paths"] == [os.path.join(tree.dev_root, "nvidia0")]
    result = run(tree, capsys, parent_gpu="0000:83:00.0", include_shared=False)
    assert [h["pid"] for h in result["holders"]] == [5000]
    assert result["units"] == ["hypeman.service"]


def test_bad_and_absent_card(tree, capsys):
    result = run(tree, capsys, parent_gpu="nvidia0")
    assert result["failed"] is True and "parent_gpu 'nvidia0' is not a PCI address" in result["msg"]
    result = run(tree, capsys, parent_gpu="0000:99:00.0")
    assert result["failed"] is True
    assert result["msg"] == "parent_gpu 0000:99:00.0 is not a PCI device under %s" % tree.sysfs_root


def test_unreadable_proc_entry_fails_closed(tree, capsys):
    tree.break_path(os.path.relpath(os.path.join(tree.proc_root, "6000", "fd"), tree.root), "garbage")
    result = run(tree, capsys, parent_gpu="0000:82:00.0")
    assert result["failed"] is True and "read process 6000 file descriptors" in result["msg"]
