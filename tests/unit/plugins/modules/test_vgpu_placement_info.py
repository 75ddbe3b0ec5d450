# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_placement_info: the module end to end on host trees, including its API cross-check."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.modules import vgpu_placement_info
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub, closed_port_url
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module

Q_AT = "2026-08-22T00:00:00Z"


def run(tree, capsys, **args):
    params = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "proc_root": tree.proc_root,
              "dev_root": tree.dev_root, "config_path": tree.config_path, "state_dir": tree.state_dir,
              "_ansible_check_mode": True}
    params.update(args)
    return run_module(vgpu_placement_info.main, params, capsys)


@pytest.fixture
def tree(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.add_instance("vm", vf=card.vfs[0], profile="NVIDIA L40S-2Q")
    tree.write_store([{"vf_address": card.vfs[3], "quarantined_at": Q_AT}])
    return tree


def _api_gpu(result):
    return {"mode": "vgpu", "total_slots": result["slots"]["total"], "used_slots": result["slots"]["used"],
            "allocatable_slots": result["slots"]["allocatable"], "quarantined_slots": result["slots"]["quarantined"],
            "profiles": result["profiles"]}


def test_placement_view(tree, capsys):
    result = run(tree, capsys, profile="NVIDIA L40S-2Q")
    assert result["changed"] is False and "failed" not in result
    assert result["framework"] == "vendor-vfio"
    assert result["slots"] == {"total": 4, "used": 1, "allocatable": 2, "quarantined": 1}
    assert result["profiles"] == [{"name": "NVIDIA L40S-2Q", "framebuffer_mb": 2048, "available": 2}]
    card = result["gpus"][0]
    assert (card["address"], card["overflow_only"], card["idle"], card["rank"]) == ("0000:82:00.0", True, False, 1)
    assert result["candidates"]["vfs"] == ["0000:82:00.5", "0000:82:00.6"]
    assert result["store"] == {"path": tree.store_path, "format": "v1", "valid": True, "error": None}
    assert "api" not in result


def test_default_store_path_and_path_override(tree, capsys):
    other = os.path.join(tree.root, "elsewhere.json")
    with open(other, "w") as handle:
        handle.write('{"version": 1, "records": []}')
    assert run(tree, capsys)["slots"]["quarantined"] == 1
    result = run(tree, capsys, path=other)
    assert result["slots"]["quarantined"] == 0 and result["store"]["path"] == other


def test_discovery_failure_is_a_clear_failure(tree, capsys):
    for vf in tree.cards["0000:82:00.0"].vfs:
        tree.break_path(os.path.relpath(tree.pci_path(vf, "nvidia", "current_vgpu_type"), tree.root), "eisdir")
    result = run(tree, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("vGPU discovery failed, no VF is readable: read current vGPU type for VF")
    assert len(result["unreadable_vfs"]) == 4


def test_bad_config_threshold_fails_naming_the_value(tree, capsys):
    tree.write_config(threshold=0)
    result = run(tree, capsys)
    assert result["failed"] is True and "vf_quarantine_threshold is 0" in result["msg"]


def test_unreadable_metadata_warns(tree, capsys):
    path = os.path.join(tree.data_dir, "guests", "broken", "metadata.json")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write("not json")
    result = run(tree, capsys)
    assert result["unreadable_metadata"][0]["path"] == path
    assert path in json.dumps(result["warnings"])  # 2.19 returns structured warning summaries


def test_api_agrees(tree, capsys):
    local = run(tree, capsys)
    with ApiStub({"/resources": (200, {"gpu": _api_gpu(local), "cpu": {}})}, token="t0ken") as api:
        result = run(tree, capsys, api_url=api.url, api_token="t0ken")
    assert result["api"] == {"url": api.url + "/resources", "reachable": True, "status": 200, "error": None,
                             "gpu": _api_gpu(local), "mismatches": [], "missing_fields": []}


def test_api_lost_edit_shows_as_mismatch(tree, capsys):
    local = run(tree, capsys)
    stale = dict(_api_gpu(local), quarantined_slots=0, allocatable_slots=3)
    with ApiStub({"/resources": (200, {"gpu": stale})}) as api:
        result = run(tree, capsys, api_url=api.url, api_token="tok-placement-1")
    assert {"field": "quarantined_slots", "local": 1, "api": 0} in result["api"]["mismatches"]
    assert {"field": "allocatable_slots", "local": 2, "api": 3} in result["api"]["mismatches"]


def test_api_without_newer_fields(tree, capsys):
    local = run(tree, capsys)
    older = {"mode": "vgpu", "total_slots": 4, "used_slots": 1, "profiles": local["profiles"]}
    with ApiStub({"/resources": (200, {"gpu": older})}) as api:
        result = run(tree, capsys, api_url=api.url, api_token="tok-placement-1")
    assert result["api"]["mismatches"] == []
    assert result["api"]["missing_fields"] == ["allocatable_slots", "quarantined_slots"]


@pytest.mark.parametrize("case", ["down", "401", "slow", "not-json"])
def test_api_faults_are_reported_not_fatal(tree, capsys, case):
    if case == "down":
        result = run(tree, capsys, api_url=closed_port_url(), api_token="tok-placement-1", api_timeout=2)
        expected = "Connection refused"
    else:
        routes = {"/resources": (200, "<html/>" if case == "not-json" else {"gpu": None})}
        with ApiStub(routes, token="tok-right-1" if case == "401" else None, delay=1.0 if case == "slow" else 0) as api:
            result = run(tree, capsys, api_url=api.url, api_token="tok-wrong-1", api_timeout=0.2 if case == "slow" else 5)
        expected = {"401": "HTTP 401", "slow": "no answer within 0.2 seconds", "not-json": "not JSON"}[case]
    assert "failed" not in result
    assert expected in result["api"]["error"] and result["api"]["mismatches"] == []
    assert "hypeman API cross-check failed" in json.dumps(result["warnings"])
    assert result["slots"]["total"] == 4  # the local view is still complete
    assert result["api"]["url"].endswith("/resources")
