# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Simulator self-test: the API stand-in's /resources matches vgpu_placement_info on the same tree.

The stand-in and the module compute slots and profiles independently (the
stand-in does not import the collection); for several layouts the module is
run with ``api_url`` pointing at the stand-in and must report no mismatch,
and the raw figures are compared here as well.
"""

from __future__ import annotations

import json

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.hypeman.vgpu.plugins.modules import vgpu_placement_info
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.sim.test_sim_api import Server

Q = "2026-08-22T00:00:00Z"


def _failures(*pairs):
    return [{"instance_id": i, "assigned_at": a, "reported_at": "2026-08-20T15:00:00Z"} for i, a in pairs]


def two_cards_with_instances(tree):
    a = tree.add_card("L40S", "0000:82:00.0", numvfs=8)
    b = tree.add_card("L40S", "0000:e3:00.0", numvfs=8)
    tree.add_instance("inst-a", vf=a.vfs[0], profile="NVIDIA L40S-2Q")
    tree.add_instance("inst-b", vf=a.vfs[1], profile="NVIDIA L40S-2Q", build="assigned", liveness="crashed")
    tree.add_instance("inst-c", vf=b.vfs[0], profile="NVIDIA L40S-8Q")
    tree.write_store([{"vf_address": a.vfs[1], "failures": _failures(("inst-b", "t1"), ("x", "t2")),
                       "quarantined_at": Q},
                      {"vf_address": b.vfs[5], "quarantined_at": Q},
                      {"vf_address": "0000:99:00.4", "quarantined_at": Q},
                      {"vf_address": b.vfs[6], "failures": _failures(("y", "t3"))}])


def empty_card_one_quarantine(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.write_store([{"vf_address": card.vfs[2], "quarantined_at": Q}])


def dirty_vf_and_pinned_creatable(tree):
    card = tree.add_card("A100", "0000:82:00.0", numvfs=6)
    tree.set_current_type(card.vfs[3], "NVIDIA A100-10C")  # allocated, no instance claims it
    tree.set_creatable(card.vfs[4], raw="ID    : vGPU Name\n")  # capacity used up on this one
    tree.set_creatable(card.vfs[5], raw="ID    : vGPU Name\n695   : NVIDIA A100-10C\n")


def lowered_threshold_at_load(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    # Two failures, not yet quarantined: hypeman quarantines at load (threshold 2).
    tree.write_store([{"vf_address": card.vfs[0], "failures": _failures(("a", "t1"), ("b", "t2"))}])


def invalid_store(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-4Q")
    tree.write_store(raw='{"version": 2, "records": []}')


def legacy_store(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-4Q")
    tree.write_store(raw='[{"vf_address": "0000:82:00.4", "wedge_count": 1}]')  # L0: a bare array


def mdev_card(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3, framework="mdev")
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-4Q")
    tree.write_store([{"vf_address": card.vfs[1], "quarantined_at": Q}])


@pytest.mark.parametrize("layout", [two_cards_with_instances, empty_card_one_quarantine,
                                    dirty_vf_and_pinned_creatable, lowered_threshold_at_load, invalid_store,
                                    legacy_store, mdev_card])
def test_resources_match_vgpu_placement_info(tmp_path, capsys, layout):
    tree = HostTree(tmp_path)
    layout(tree)
    server = Server(tree)  # writes the config (threshold 2) and loads the store, as hypeman starts
    try:
        params = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "proc_root": tree.proc_root,
                  "dev_root": tree.dev_root, "state_dir": tree.state_dir, "config_path": tree.config_path,
                  "api_url": server.url, "api_token": server.token}
        with patch_module_args(params):
            with pytest.raises(SystemExit):
                vgpu_placement_info.main()
        result = json.loads(capsys.readouterr().out)
        api_gpu = server.call("/resources")[1]["gpu"]
    finally:
        server.close()
    assert result["api"]["error"] is None and result["api"]["reachable"]
    assert result["api"]["mismatches"] == []
    slots = result["slots"]
    assert (slots["total"], slots["used"], slots["allocatable"], slots["quarantined"]) == (
        api_gpu["total_slots"], api_gpu["used_slots"], api_gpu["allocatable_slots"], api_gpu["quarantined_slots"])
    assert result["placement_disabled_reason"] == api_gpu.get("placement_disabled_reason")
    local = sorted((p["name"], p["framebuffer_mb"], p["available"]) for p in result["profiles"])
    remote = sorted((p["name"], p["framebuffer_mb"], p["available"]) for p in api_gpu.get("profiles", []))
    if api_gpu.get("placement_disabled_reason"):
        assert remote == []  # hypeman leaves profiles out while placement is disabled
    else:
        assert local == remote and remote
