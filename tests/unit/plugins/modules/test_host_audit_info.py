# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_audit_info: the module end to end on a host tree."""

from __future__ import annotations


import pytest

from ansible_collections.hypeman.vgpu.plugins.modules import host_audit_info
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module

Q_AT = "2026-08-22T00:00:00Z"


def run(tree, capsys, **args):
    params = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "proc_root": tree.proc_root,
              "dev_root": tree.dev_root, "config_path": tree.config_path, "state_dir": tree.state_dir}
    params.update(args)
    return run_module(host_audit_info.main, params, capsys)


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("A100", "0000:82:00.0")
    tree.add_card("A100", "0000:83:00.0")
    tree.add_instance("vm", vf=card.vfs[0], profile="NVIDIA A100-4C")
    tree.write_store([{"vf_address": vf, "quarantined_at": Q_AT} for vf in tree.cards["0000:83:00.0"].vfs])
    return tree


def test_audit(tree, capsys):
    result = run(tree, capsys)
    assert result["changed"] is False
    assert [i["code"] for i in result["issues"]] == ["card_ready_for_cycle", "hypeman_not_running", "quarantined_vfs"]
    assert result["needs_action"] is True
    assert result["capacity"]["lost_pct"] == 50.0
    assert result["prerequisites"] is None and result["api"] is None
    assert result["sentinel"] == {"findings": [], "unreported": [], "skipped_instances": [], "unattributed": 0,
                                  "history": 0, "warnings": []}


def test_options(tree, capsys):
    result = run(tree, capsys, sentinel=False, hypeman_expected=False, prerequisites=True,
                 sriov_manage="/nonexistent/sriov-manage", _ansible_check_mode=True)
    assert result["sentinel"] is None
    assert "hypeman_not_running" not in [i["code"] for i in result["issues"]]
    assert [c["name"] for c in result["prerequisites"]] == [
        "iommu", "vfio_modules", "nvidia_vgpu_driver", "sriov_manage", "vendor_vfio", "dcgm_units"]


def test_bad_threshold_fails_cleanly(tree, capsys):
    result = run(tree, capsys, threshold=0)
    assert result["failed"] is True
    assert result["msg"] == "threshold is 0; expected a whole number >= 1"


def test_host_paths_that_point_nowhere_are_flagged(tmp_path, capsys):
    # A first inventory with wrong paths: the audit must not call the host "ok".
    (tmp_path / "proc").mkdir()
    result = run_module(host_audit_info.main, {
        "data_dir": str(tmp_path / "hypeman"), "sysfs_root": str(tmp_path / "sys"), "proc_root": str(tmp_path / "proc"),
        "dev_root": str(tmp_path / "dev"), "config_path": str(tmp_path / "config.yaml"),
        "state_dir": str(tmp_path / "state"), "hypeman_expected": False}, capsys)
    assert [i["code"] for i in result["issues"]] == ["host_not_vgpu"]
    assert result["needs_action"] is True
    assert result["footprint"]["not_vgpu"] is True
    assert str(tmp_path / "hypeman") in result["issues"][0]["message"]


def test_footprint_of_a_vgpu_host(tree, capsys):
    footprint = run(tree, capsys)["footprint"]
    assert footprint["nvidia_sriov_cards"] == 2 and footprint["data_dir_exists"] is True
    assert footprint["not_vgpu"] is False
