# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_placement: hypeman's counting, ranking and candidate selection on hypeman-like cases."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _api, _placement
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree

Q_AT = "2026-08-22T00:00:00Z"


def _failure(instance, when="2026-08-20T15:00:00Z"):
    return {"instance_id": instance, "assigned_at": when, "reported_at": when}


def view(tree, profile=None):
    result, _warnings = _placement.host_view(tree.sysfs_root, tree.proc_root, tree.dev_root, tree.data_dir,
                                             tree.store_path, tree.config_path, profile)
    return result


def gpu(result, address):
    return [g for g in result["gpus"] if g["address"] == address][0]


def vf(result, address):
    return [v for v in result["vfs"] if v["address"] == address][0]


@pytest.fixture
def tree(tmp_path):
    return HostTree(tmp_path)


# -- slots (docs/hypeman-interface.md §2.3) ---------------------------------------------------


def test_allocated_and_quarantined_overlap(tree):
    # hypeman's TestGetVGPUStatusReportsQuarantinedSlots, plus a VF both allocated and quarantined.
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.set_current_type(card.vfs[1], "NVIDIA L40S-2Q")
    tree.set_current_type(card.vfs[3], "NVIDIA L40S-2Q")
    tree.write_store([{"vf_address": card.vfs[0], "failures": [_failure("i1"), _failure("i2")], "quarantined_at": Q_AT},
                      {"vf_address": card.vfs[3], "quarantined_at": Q_AT}])
    result = view(tree)
    assert result["slots"] == {"total": 4, "used": 2, "allocatable": 1, "quarantined": 2}
    assert vf(result, card.vfs[3])["allocated"] and vf(result, card.vfs[3])["quarantined"]
    assert [v["address"] for v in result["vfs"] if v["allocatable"]] == [card.vfs[2]]
    assert result["placement_disabled_reason"] is None


def test_below_threshold_failures_stay_allocatable(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.write_store([{"vf_address": card.vfs[0], "failures": [_failure("i1")]}])
    result = view(tree)
    assert result["slots"] == {"total": 2, "used": 0, "allocatable": 2, "quarantined": 0}
    assert vf(result, card.vfs[0])["failures"] == 1 and vf(result, card.vfs[0])["quarantined"] is False


def test_failures_at_threshold_are_quarantined_on_hypemans_next_load(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.write_store([{"vf_address": card.vfs[0], "failures": [_failure("i1"), _failure("i2")]}])
    tree.write_config(threshold=3)
    assert view(tree)["slots"]["quarantined"] == 0
    tree.write_config(threshold=2)
    result = view(tree)
    assert result["slots"]["quarantined"] == 1 and result["pending_quarantine"] == [card.vfs[0]]
    assert vf(result, card.vfs[0])["quarantined"] is True and vf(result, card.vfs[0])["failures"] == 2
    assert result["threshold"] == 2


@pytest.mark.parametrize("raw, reason", [
    ("not json", "VF health state unavailable: unmarshal VF health state: invalid character 'o' in literal null"),
    ('{"version": 2, "records": []}', "VF health state unavailable: validate VF health state: unsupported version 2"),
    ('[{"vf_address": "0000:82:00.4", "wedge_count": 1}]', "VF health state unavailable: unmarshal VF health state"),
])
def test_store_unavailable_fails_closed(tree, raw, reason):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3)
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-2Q")
    tree.write_store(raw=raw)
    result = view(tree, profile="NVIDIA L40S-2Q")
    assert result["placement_disabled_reason"].startswith(reason)
    assert result["slots"] == {"total": 3, "used": 1, "allocatable": 0, "quarantined": 0}
    assert result["profiles"] == []
    assert all(v["quarantined"] is None and v["allocatable"] is False for v in result["vfs"])
    card_view = gpu(result, "0000:82:00.0")
    assert card_view["quarantined"] is None and card_view["drained"] is None and card_view["rank"] is None
    assert card_view["allocatable"] == 0
    assert result["candidates"]["reason"] == "vGPU placement is disabled: " + result["placement_disabled_reason"]
    assert result["store"]["valid"] is False


def test_mdev_hosts_are_never_quarantined(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3, framework="mdev")
    tree.set_current_type(card.vfs[2], "NVIDIA L40S-2Q")
    tree.write_store([{"vf_address": card.vfs[0], "quarantined_at": Q_AT}])
    result = view(tree)
    assert result["framework"] == "mdev"
    assert result["slots"] == {"total": 3, "used": 1, "allocatable": 2, "quarantined": 0}
    assert vf(result, card.vfs[0])["quarantined"] is False
    # Even an invalid store does not disable mdev placement.
    tree.write_store(raw="not json")
    result = view(tree, profile="NVIDIA L40S-2Q")
    assert result["placement_disabled_reason"] is None and result["slots"]["allocatable"] == 2
    profile = [p for p in result["profiles"] if p["name"] == "NVIDIA L40S-2Q"][0]
    assert profile == {"name": "NVIDIA L40S-2Q", "framebuffer_mb": 2048, "available": 2}
    assert result["candidates"]["gpu"] == "0000:82:00.0" and result["candidates"]["vfs"] == [card.vfs[0]]


def test_profiles_are_the_union_of_creatable_lists_sorted_by_name(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3)
    tree.set_creatable(card.vfs[0], ["NVIDIA L40S-1Q", "NVIDIA L40S-2Q"])
    tree.set_creatable(card.vfs[1], ["NVIDIA L40S-2Q", "NVIDIA L40S-12Q"])
    tree.set_creatable(card.vfs[2], [])
    tree.write_store([{"vf_address": card.vfs[1], "quarantined_at": Q_AT}])
    result = view(tree)
    # Quarantined VFs add their types to the list, not to availability; names sort as strings.
    assert result["profiles"] == [
        {"name": "NVIDIA L40S-12Q", "framebuffer_mb": 12288, "available": 0},
        {"name": "NVIDIA L40S-1Q", "framebuffer_mb": 1024, "available": 1},
        {"name": "NVIDIA L40S-2Q", "framebuffer_mb": 2048, "available": 1},
    ]


def test_allocated_vfs_add_profiles_but_no_availability(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.set_creatable(card.vfs[0], ["NVIDIA L40S-4Q"])
    tree.set_creatable(card.vfs[1], ["NVIDIA L40S-8Q"])
    tree.set_current_type(card.vfs[1], "NVIDIA L40S-8Q")
    assert view(tree)["profiles"] == [{"name": "NVIDIA L40S-4Q", "framebuffer_mb": 4096, "available": 1},
                                      {"name": "NVIDIA L40S-8Q", "framebuffer_mb": 8192, "available": 0}]


def test_garbage_creatable_list_counts_the_vf_but_not_its_profiles(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.set_creatable(card.vfs[0], raw="garbage\n")
    tree.set_creatable(card.vfs[1], ["NVIDIA L40S-2Q"])
    result = view(tree)
    assert result["slots"]["allocatable"] == 2
    assert result["profiles"] == [{"name": "NVIDIA L40S-2Q", "framebuffer_mb": 2048, "available": 1}]
    assert vf(result, card.vfs[0])["creatable"] is None and "line 1" in vf(result, card.vfs[0])["creatable_error"]


# -- cards ----------------------------------------------------------------------------------------


def test_card_states_drained_overflow_idle(tree):
    drained = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    overflow = tree.add_card("L40S", "0000:83:00.0", numvfs=2)
    busy = tree.add_card("L40S", "0000:84:00.0", numvfs=2)
    tree.add_card("L40S", "0000:85:00.0", numvfs=0)
    tree.write_store([{"vf_address": a, "quarantined_at": Q_AT} for a in drained.vfs + overflow.vfs[:1]])
    tree.add_instance("vm", vf=busy.vfs[0], profile="NVIDIA L40S-2Q")
    result = view(tree)
    d, o, b, empty = (gpu(result, a) for a in ("0000:82:00.0", "0000:83:00.0", "0000:84:00.0", "0000:85:00.0"))
    assert (d["drained"], d["overflow_only"], d["idle"], d["allocatable"]) == (True, False, True, 0)
    assert (o["drained"], o["overflow_only"], o["idle"], o["allocatable"]) == (False, True, True, 1)
    assert (b["drained"], b["overflow_only"], b["idle"]) == (False, False, False)
    assert b["instances"] == ["vm"] and b["live_instances"] == ["vm"]
    assert (b["claimed"], b["allocated"], b["held_open"]) == (1, 1, 1)
    assert b["idle_blockers"] == ["allocated VFs: %s" % busy.vfs[0],
                                  "claimed VFs: %s (vm)" % busy.vfs[0],
                                  "VFs held open: %s" % busy.vfs[0]]
    assert empty["vf_total"] == 0 and empty["sriov_numvfs"] == 0 and empty["rank"] is None
    assert empty["drained"] is False and empty["idle"] is True
    # busy: what a drain waits for (claims and open VFs); an allocated VF alone keeps a card from idle, not busy.
    assert (b["busy"], b["busy_reasons"]) == (True, ["live instance vm", "1 VF(s) held open"])
    assert all((g["busy"], g["busy_reasons"]) == (False, []) for g in (d, o, empty))


def test_busy_reasons_word_every_holder_as_the_drain_role_did(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.add_instance("on", vf=card.vfs[0], profile="NVIDIA L40S-2Q")
    tree.add_instance("off", vf=card.vfs[1], profile="NVIDIA L40S-2Q", liveness="stopped", set_type=False)
    tree.add_process(comm="qemu-system-x86", fds=tree.vf_nodes(card.vfs[2]))
    os.makedirs(os.path.join(tree.data_dir, "guests", "broken"))
    broken = os.path.join(tree.data_dir, "guests", "broken", "metadata.json")
    with open(broken, "w") as handle:
        handle.write("{")
    card_view = gpu(view(tree), card.address)
    assert card_view["busy"] is True
    assert card_view["busy_reasons"] == ["live instance on", "claim in the metadata of stopped instance off",
                                         "2 VF(s) held open", "unreadable instance metadata %s" % broken]


def test_a_stopped_instance_still_claims_its_vf(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.add_instance("stopped", vf=card.vfs[0], profile="NVIDIA L40S-2Q", liveness="stopped", set_type=False)
    card_view = gpu(view(tree), "0000:82:00.0")
    assert card_view["idle"] is False and card_view["claimed"] == 1 and card_view["live_instances"] == []
    assert card_view["idle_blockers"] == ["claimed VFs: %s (stopped)" % card.vfs[0]]


def test_unknown_is_never_idle(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    other = tree.add_card("L40S", "0000:83:00.0", numvfs=2)
    tree.break_path(os.path.relpath(tree.pci_path(other.vfs[1], "nvidia", "current_vgpu_type"), tree.root), "eisdir")
    result = view(tree)
    assert gpu(result, card.address)["idle"] is True
    assert gpu(result, other.address)["idle"] is False
    assert gpu(result, other.address)["unreadable_vfs"] == [other.vfs[1]]
    assert gpu(result, other.address)["idle_blockers"] == ["unreadable VFs: %s" % other.vfs[1]]
    # Metadata that cannot be read may claim any card.
    os.makedirs(os.path.join(tree.data_dir, "guests", "broken"))
    with open(os.path.join(tree.data_dir, "guests", "broken", "metadata.json"), "w") as handle:
        handle.write("{")
    result = view(tree)
    assert gpu(result, card.address)["idle"] is False
    assert "1 instance metadata file(s) unreadable" in gpu(result, card.address)["idle_blockers"][0]


def test_open_handle_scan_failure_is_unknown_not_free(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    pid = tree.add_process(comm="odd", fds=["null"])
    tree.break_path(os.path.relpath(os.path.join(tree.proc_root, str(pid), "fd"), tree.root), "garbage")
    result = view(tree)
    assert "read process %d file descriptors" % pid in result["held_open_error"]
    assert all(v["held_open"] is None and v["held_open_error"] == result["held_open_error"] for v in result["vfs"])
    card_view = gpu(result, card.address)
    assert card_view["held_open"] is None and card_view["idle"] is False
    expected = "open handles unknown for VFs %s: %s" % (", ".join(card.vfs), result["held_open_error"])
    assert card_view["idle_blockers"] == [expected]
    assert card_view["busy"] is True and card_view["busy_reasons"] == ["whether VFs are held open cannot be told"]


def test_a_dirty_vf_held_open_without_claim(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    tree.set_current_type(card.vfs[1], "NVIDIA L40S-2Q")
    tree.add_process(comm="qemu-system-x86", fds=tree.vf_nodes(card.vfs[1]))
    result = view(tree)
    dirty = vf(result, card.vfs[1])
    assert dirty["dirty"] is True and dirty["held_open"] is True and dirty["claimed_by"] == []
    # The allocated VF no longer lists its own type; its free sibling does, so the name is known.
    assert dirty["current_profile"] == "NVIDIA L40S-2Q" and dirty["current_type"] == 1148
    assert gpu(result, card.address)["dirty"] == 1


def test_ranking_follows_hypemans_order(tree):
    # a: 1 quarantined; b: usage unknown; c: 4 GB in use; d: 2 GB in use; e: 2 GB in use (address breaks the tie)
    cards = dict((name, tree.add_card("L40S", "0000:%s:00.0" % bus, numvfs=4, realistic=False))
                 for name, bus in (("a", "81"), ("b", "82"), ("c", "83"), ("d", "84"), ("e", "85")))
    for card in cards.values():
        for address in card.vfs:
            tree.set_creatable(address, ["NVIDIA L40S-2Q", "NVIDIA L40S-4Q"])
    tree.write_store([{"vf_address": cards["a"].vfs[3], "quarantined_at": Q_AT}])
    tree.add_instance("b1", vf=cards["b"].vfs[0], profile="NVIDIA L40S-96Q", liveness="stopped", set_type=False)
    tree.add_instance("c1", vf=cards["c"].vfs[0], profile="NVIDIA L40S-4Q", liveness="stopped", set_type=False)
    tree.add_instance("d1", vf=cards["d"].vfs[0], profile="NVIDIA L40S-2Q", liveness="stopped", set_type=False)
    tree.add_instance("e1", vf=cards["e"].vfs[0], profile="NVIDIA L40S-2Q", liveness="stopped", set_type=False)
    result = view(tree, profile="NVIDIA L40S-2Q")
    ranks = dict((name, gpu(result, card.address)["rank"]) for name, card in cards.items())
    assert ranks == {"d": 1, "e": 2, "c": 3, "b": 4, "a": 5}
    assert gpu(result, cards["b"].address)["usage_known"] is False
    assert gpu(result, cards["c"].address)["framebuffer_used_mb"] == 4096
    candidates = result["candidates"]
    assert [r["gpu"] for r in candidates["ranking"]] == [cards[n].address for n in "decba"]
    assert candidates["gpu"] == cards["d"].address
    assert candidates["vfs"] == cards["d"].vfs[1:]  # the claimed VF is not a candidate
    assert candidates["clean"] is True and candidates["reason"] is None
    assert candidates["type_id"] == 1148 and candidates["framebuffer_mb"] == 2048


def test_candidates_prefer_clean_then_dirty_vfs(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3, realistic=False)
    for address in card.vfs:
        tree.set_creatable(address, ["NVIDIA L40S-2Q"])
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-2Q")  # dirty: allocated, unclaimed, repairable
    result = view(tree, profile="NVIDIA L40S-2Q")
    assert result["candidates"]["vfs"] == card.vfs[1:] and result["candidates"]["clean"] is True
    tree.set_current_type(card.vfs[1], "NVIDIA L40S-2Q")
    tree.set_current_type(card.vfs[2], "NVIDIA L40S-2Q")
    tree.set_creatable(card.vfs[0], [])
    tree.set_creatable(card.vfs[1], [])
    tree.set_creatable(card.vfs[2], ["NVIDIA L40S-2Q"])
    # Every VF is allocated (no allocatable slot): hypeman refuses at admission.
    result = view(tree, profile="NVIDIA L40S-2Q")
    assert result["candidates"]["reason"] == "no allocatable vgpu slots"


def test_dirty_vfs_are_candidates_when_the_parent_advertises_the_type(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3, realistic=False)
    tree.set_creatable(card.vfs[0], [])
    tree.set_creatable(card.vfs[1], [])
    tree.set_creatable(card.vfs[2], ["NVIDIA L40S-2Q"])
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-4Q")
    tree.set_current_type(card.vfs[2], "NVIDIA L40S-2Q")
    tree.add_instance("vm", vf=card.vfs[2], profile="NVIDIA L40S-2Q", set_type=False)
    result = view(tree, profile="NVIDIA L40S-2Q")
    # .5 is free but lists nothing; .4 is dirty and the card advertises 2Q (on .6): repairable.
    assert result["candidates"]["vfs"] == [card.vfs[0]] and result["candidates"]["clean"] is False


@pytest.mark.parametrize("setup, profile, reason", [
    ("none", "NVIDIA L40S-2Q", 'no creatable vGPU profiles on any VF (GPUs at capacity or dirty VFs consuming '
                               'framebuffer): profile "NVIDIA L40S-2Q"'),
    ("some", "NVIDIA L40S-48Q", 'profile "NVIDIA L40S-48Q" is not creatable on any VF (unknown profile or '
                                'insufficient capacity)'),
    ("quarantined", "NVIDIA L40S-2Q", 'no available VF for profile "NVIDIA L40S-2Q"'),
])
def test_no_candidate_reasons(tree, setup, profile, reason):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2, realistic=False)
    names = [] if setup == "none" else ["NVIDIA L40S-2Q"]
    tree.set_creatable(card.vfs[0], names)
    tree.set_creatable(card.vfs[1], [])
    if setup == "quarantined":
        tree.write_store([{"vf_address": card.vfs[0], "quarantined_at": Q_AT}])
    candidates = view(tree, profile=profile)["candidates"]
    assert candidates["reason"] == reason and candidates["gpu"] is None and candidates["vfs"] == []


@pytest.mark.parametrize("profile, quoted", [
    ("L40S-2Q \u00e9", '"L40S-2Q \u00e9"'),        # Go prints printable non-ASCII as it is (JSON would escape it)
    ("a\x01b", '"a\\x01b"'),                        # a control character is \x01, not JSON's \u0001
    ("a\u2028b", '"a\\u2028b"'),                    # a non-printable rune is \u2028
])
def test_no_candidate_reasons_quote_the_profile_like_gos_q(tree, profile, quoted):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=2, realistic=False)
    tree.set_creatable(card.vfs[0], ["NVIDIA L40S-2Q"])
    candidates = view(tree, profile=profile)["candidates"]
    assert candidates["reason"] == ("profile %s is not creatable on any VF (unknown profile or insufficient capacity)"
                                    % quoted)


def test_unreadable_metadata_stops_hypemans_claim(tree):
    tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    path = os.path.join(tree.data_dir, "guests", "broken", "metadata.json")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write("{")
    reason = view(tree, profile="NVIDIA L40S-2Q")["candidates"]["reason"]
    assert reason.startswith("list instances for vGPU allocation: %s: unmarshal metadata" % path)


def test_no_framework(tree):
    result = view(tree, profile="NVIDIA L40S-2Q")
    assert result["framework"] == "none" and result["slots"]["total"] == 0
    assert result["candidates"]["reason"] == "vGPU framework not available"


def test_discovery_failure_raises(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=1)
    tree.break_path(os.path.relpath(tree.pci_path(card.vfs[0], "nvidia", "current_vgpu_type"), tree.root), "eisdir")
    with pytest.raises(VgpuError) as err:
        view(tree)
    assert err.value.msg.startswith("vGPU discovery failed, no VF is readable")
    assert err.value.details["unreadable_vfs"][0]["address"] == card.vfs[0]


# -- API cross-check --------------------------------------------------------------------------------


def _api_gpu(result):
    gpu_obj = {"mode": "vgpu", "total_slots": result["slots"]["total"], "used_slots": result["slots"]["used"],
               "allocatable_slots": result["slots"]["allocatable"],
               "quarantined_slots": result["slots"]["quarantined"], "profiles": [dict(p) for p in result["profiles"]]}
    return gpu_obj


def test_compare_with_api(tree):
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.write_store([{"vf_address": card.vfs[0], "quarantined_at": Q_AT}])
    result = view(tree)
    assert _api.compare_with_api(result, _api_gpu(result)) == ([], [])
    api = _api_gpu(result)
    api["quarantined_slots"], api["allocatable_slots"] = 0, 4  # hypeman started before the edit
    api["profiles"][0]["available"] = 4
    api["profiles"].append({"name": "NVIDIA L40S-99Q", "framebuffer_mb": 0, "available": 1})
    mismatches, missing = _api.compare_with_api(result, api)
    assert missing == []
    assert {"field": "quarantined_slots", "local": 1, "api": 0} in mismatches
    assert {"field": "allocatable_slots", "local": 3, "api": 4} in mismatches
    assert {"field": "profiles[%s].available" % result["profiles"][0]["name"], "local": 3, "api": 4} in mismatches
    assert {"field": "profiles[NVIDIA L40S-99Q].available", "local": None, "api": 1} in mismatches


def test_compare_with_an_older_api_and_a_null_gpu(tree):
    tree.add_card("L40S", "0000:82:00.0", numvfs=2)
    result = view(tree)
    older = _api_gpu(result)
    del older["allocatable_slots"], older["quarantined_slots"]
    assert _api.compare_with_api(result, older) == ([], ["allocatable_slots", "quarantined_slots"])
    assert _api.compare_with_api(result, None) == ([{"field": "gpu", "local": "vgpu", "api": None}], [])
    disabled = dict(_api_gpu(result), placement_disabled_reason="VF health state unavailable: x")
    assert {"field": "placement_disabled_reason", "local": None, "api": "VF health state unavailable: x"} in \
        _api.compare_with_api(result, disabled)[0]


# -- passthrough mode (docs/hypeman-interface.md §2.4, lib/resources/gpu.go) -----------------------


def test_passthrough_matches_the_simulators_independent_model(tree):
    from ansible_collections.hypeman.vgpu.tests.sim import api as simapi

    tree.add_device("0000:17:00.0", device="0x26b9", driver="vfio-pci")
    tree.add_device("0000:18:00.0", device="0x20b5")
    tree.add_device("0000:18:00.1", device="0x1aef", pci_class="0x040300")  # the GPU's HDMI audio: listed too
    tree.add_device("0000:19:00.0", vendor="0x8086", device="0x56c0")  # a VGA candidate of another vendor
    tree.add_device("0000:1a:00.0", device="0x2331", driver="nouveau")
    result = view(tree)
    local = result["passthrough"]
    assert [(d["name"], d["available"]) for d in local["devices"]] == [
        ("L40S", False), ("A100 PCIe 40GB", True), ("Audio Device", True), ("H100 PCIe", True)]
    assert (local["total_slots"], local["used_slots"], local["allocatable_slots"]) == (4, 1, 3)
    api_gpu = simapi.gpu_resources(tree.sysfs_root, set(), None)
    assert _api.compare_with_api(result, api_gpu) == ([], [])
    older = dict(api_gpu)
    del older["allocatable_slots"], older["quarantined_slots"]
    assert _api.compare_with_api(result, older) == ([], ["allocatable_slots", "quarantined_slots"])
    api_gpu["devices"][0]["available"] = True
    assert [m["field"] for m in _api.compare_with_api(result, api_gpu)[0]] == ["devices"]
    assert _api.compare_with_api(result, None)[0] == [{"field": "gpu", "local": "passthrough", "api": None}]


def test_no_nvidia_device_is_no_passthrough(tree):
    tree.add_device("0000:19:00.0", vendor="0x8086", device="0x56c0")
    result = view(tree)
    assert result["passthrough"] is None
    assert _api.compare_with_api(result, None) == ([], [])
    assert _api.compare_with_api(result, {"mode": "passthrough"})[0] == [
        {"field": "mode", "local": None, "api": "passthrough"}]
