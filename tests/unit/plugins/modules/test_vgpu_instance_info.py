# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_instance_info: instances, card filter, liveness and the API cross-check."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.modules import vgpu_instance_info
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module


def run(tree, capsys, **args):
    params = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "proc_root": tree.proc_root}
    params.update(args)
    return run_module(vgpu_instance_info.main, params, capsys)


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path)
    a = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    b = tree.add_card("A100", "0000:c1:00.0", numvfs=2)
    tree.add_instance("on-a", vf=a.vfs[0], profile="NVIDIA L40S-2Q")
    tree.add_instance("on-b", vf=b.vfs[1], profile="NVIDIA A100-4C", build="assigned", liveness="crashed")
    tree.add_instance("plain", liveness="stopped")
    return tree


def test_all_instances(tree, capsys):
    result = run(tree, capsys)
    assert result["changed"] is False and result["unreadable"] == []
    by_id = dict((i["id"], i) for i in result["instances"])
    assert sorted(by_id) == ["on-a", "on-b", "plain"]
    on_a = by_id["on-a"]
    assert (on_a["vf_address"], on_a["parent_gpu"], on_a["live"], on_a["hypervisor"]) == \
        ("0000:82:00.4", "0000:82:00.0", True, "qemu")
    assert on_a["claim_field"] == "GPUClaimedAt" and on_a["assigned_at"] == "2026-08-31T12:00:00.123456789Z"
    on_b = by_id["on-b"]
    assert (on_b["parent_gpu"], on_b["live"], on_b["claim_field"]) == ("0000:c1:00.0", False, "GPUAssignedAt")
    assert by_id["plain"]["parent_gpu"] is None and by_id["plain"]["live"] is False


@pytest.mark.parametrize("given", ["0000:C1:00.0", "c1:00.0"])
def test_parent_gpu_filter_normalises_input(tree, capsys, given):
    result = run(tree, capsys, parent_gpu=given)
    assert [i["id"] for i in result["instances"]] == ["on-b"]


def test_vgpu_only(tree, capsys):
    assert [i["id"] for i in run(tree, capsys, vgpu_only=True)["instances"]] == ["on-a", "on-b"]


def test_bad_parent_gpu(tree, capsys):
    result = run(tree, capsys, parent_gpu="card0")
    assert result["failed"] is True
    assert result["msg"] == "parent_gpu 'card0' is not a PCI address; expected one like 0000:82:00.0"


def test_unreadable_metadata_is_listed_even_when_filtering(tree, capsys):
    path = os.path.join(tree.data_dir, "guests", "broken", "metadata.json")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write('{"Id": "broken", "GPUClaimedAt": "not a time"}')
    result = run(tree, capsys, parent_gpu="0000:82:00.0")
    assert [i["id"] for i in result["instances"]] == ["on-a"]
    assert result["unreadable"][0]["instance_id"] == "broken"
    assert 'parsing time "not a time"' in result["unreadable"][0]["error"]
    assert result["warnings"]


def test_mdev_instances_resolve_their_vf(tmp_path, capsys):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2, framework="mdev")
    tree.add_instance("m", vf=card.vfs[1], profile="NVIDIA L40S-2Q")
    inst = run(tree, capsys)["instances"][0]
    assert inst["framework"] == "mdev" and inst["mdev_uuid"] == tree.mdev_uuid(card.vfs[1])
    assert inst["vf_address"] == card.vfs[1] and inst["parent_gpu"] == "0000:82:00.0"


def test_mdev_claim_without_gpumdevuuid_resolves_through_the_device_path(tmp_path, capsys):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2, framework="mdev")
    tree.add_instance("m", vf=card.vfs[1], profile="NVIDIA L40S-2Q", extra={"GPUMdevUUID": ""})
    inst = run(tree, capsys)["instances"][0]
    assert inst["mdev_uuid"] is None
    assert inst["vf_address"] == card.vfs[1] and inst["parent_gpu"] == "0000:82:00.0"


def test_api_cross_check(tree, capsys):
    listed = [
        {"id": "on-a", "gpu": {"profile": "NVIDIA L40S-2Q", "device_path": "/sys/bus/pci/devices/0000:82:00.4"}},
        {"id": "on-b", "gpu": {"profile": "NVIDIA A100-4C", "device_path": ""}},
        {"id": "ghost", "gpu": None},
    ]
    with ApiStub({"/instances": (200, listed)}, token="tok-instances-1") as api:
        result = run(tree, capsys, api_url=api.url, api_token="tok-instances-1")
    assert result["api"]["count"] == 3 and result["api"]["error"] is None
    assert result["api"]["mismatches"] == [
        {"instance_id": "ghost", "field": "instance", "local": None, "api": "listed"},
        {"instance_id": "on-b", "field": "device_path", "local": "/sys/bus/pci/devices/0000:c1:00.5", "api": None},
        {"instance_id": "plain", "field": "instance", "local": "listed", "api": None},
    ]
    assert result["api"]["missing_fields"] == []


def test_api_without_device_path(tree, capsys):
    listed = [{"id": "on-a", "gpu": {"profile": "NVIDIA L40S-2Q"}}, {"id": "on-b", "gpu": {"profile": "NVIDIA A100-4C"}},
              {"id": "plain"}]
    with ApiStub({"/instances": (200, listed)}) as api:
        result = run(tree, capsys, api_url=api.url, api_token="tok-instances-1")
    assert result["api"]["mismatches"] == [] and result["api"]["missing_fields"] == ["gpu.device_path"]


def test_api_wrong_shape(tree, capsys):
    with ApiStub({"/instances": (200, {"unexpected": True})}) as api:
        result = run(tree, capsys, api_url=api.url, api_token="tok-instances-1")
    assert "expected a JSON list of instances" in result["api"]["error"]
