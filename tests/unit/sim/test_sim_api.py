# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Simulator self-tests: the hypeman-api stand-in's /resources, /instances, auth, lost edits."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from ansible_collections.hypeman.vgpu.tests.sim import api as simapi
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree

L40S_TYPES = 22  # B, Q and A series of the L40S model hosttree builds
QUARANTINE = "2026-08-22T00:00:00Z"


def _quarantine(*vfs):
    return [{"vf_address": vf, "quarantined_at": QUARANTINE} for vf in vfs]


def _resources(tree):
    tree.write_config(threshold=2)
    return simapi.HypemanAPI(tree.config_path, sysfs_root=tree.sysfs_root, proc_root=tree.proc_root,
                             data_dir=tree.data_dir).resources()["gpu"]


def test_allocated_and_free_quarantined_vfs(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0")
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-2Q")
    tree.set_current_type(card.vfs[1], "NVIDIA L40S-2Q")
    tree.write_store(_quarantine(card.vfs[1], card.vfs[5]))
    # By hand: 32 VFs, 2 allocated; allocatable = 32 - 2 allocated - 1 free quarantined; the card
    # runs 2Q, so free VFs list only 2Q: 30 free minus the quarantined free one.
    assert _resources(tree) == {
        "mode": "vgpu", "total_slots": 32, "used_slots": 2, "allocatable_slots": 29, "quarantined_slots": 2,
        "profiles": [{"name": "NVIDIA L40S-2Q", "framebuffer_mb": 2048, "available": 29}]}


def test_empty_card_lists_every_profile_sorted_by_name(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.write_store(_quarantine(card.vfs[0]))
    gpu = _resources(tree)
    names = [p["name"] for p in gpu["profiles"]]
    assert len(names) == L40S_TYPES and names == sorted(names)
    by_name = dict((p["name"], p) for p in gpu["profiles"])
    assert by_name["NVIDIA L40S-48Q"] == {"name": "NVIDIA L40S-48Q", "framebuffer_mb": 49152, "available": 3}
    assert by_name["NVIDIA L40S-1B"]["framebuffer_mb"] == 1024
    assert (gpu["total_slots"], gpu["used_slots"], gpu["allocatable_slots"], gpu["quarantined_slots"]) == (4, 0, 3, 1)


def test_two_cards_and_records_for_vfs_that_do_not_exist(tmp_path):
    tree = HostTree(tmp_path)
    a = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    b = tree.add_card("A100", "0000:e3:00.0", numvfs=2)
    tree.set_current_type(b.vfs[0], "NVIDIA A100-10C")
    # A record for a VF that is not discovered does not count as a slot.
    tree.write_store(_quarantine(a.vfs[3], "0000:99:00.4"))
    gpu = _resources(tree)
    assert (gpu["total_slots"], gpu["used_slots"], gpu["allocatable_slots"], gpu["quarantined_slots"]) == (6, 1, 4, 1)
    by_name = dict((p["name"], p["available"]) for p in gpu["profiles"])
    assert by_name["NVIDIA A100-10C"] == 1 and by_name["NVIDIA L40S-1Q"] == 3 and "NVIDIA A100-40C" not in by_name


@pytest.mark.parametrize("raw", ["{broken", "[]", '{"version": 1, "records": [{"vf_address": "0000:82:00.4"}]}'])
def test_invalid_store_disables_placement(tmp_path, raw):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-2Q")
    tree.write_store(raw=raw)
    gpu = _resources(tree)
    assert gpu["placement_disabled_reason"].startswith("VF health state unavailable: ")
    assert "profiles" not in gpu
    assert (gpu["total_slots"], gpu["used_slots"], gpu["allocatable_slots"], gpu["quarantined_slots"]) == (4, 1, 0, 0)


def test_mdev_ignores_the_store(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3, framework="mdev")
    tree.set_current_type(card.vfs[0], "NVIDIA L40S-4Q")
    tree.write_store(_quarantine(card.vfs[1]))
    gpu = _resources(tree)
    assert (gpu["total_slots"], gpu["used_slots"], gpu["allocatable_slots"], gpu["quarantined_slots"]) == (3, 1, 2, 0)


def test_unreadable_vf_is_skipped_and_no_vf_means_null(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=3)
    tree.break_path(tree.pci_path(card.vfs[1], "nvidia", "current_vgpu_type"))
    assert _resources(tree)["total_slots"] == 2
    for vf in (card.vfs[0], card.vfs[2]):
        tree.break_path(tree.pci_path(vf, "nvidia", "current_vgpu_type"))
    assert _resources(tree) is None  # discovery error: no fallback to passthrough


def test_sriov_disabled_card_is_passthrough_and_no_gpu_is_null(tmp_path):
    tree = HostTree(tmp_path / "a")
    tree.add_card("L40S", "0000:82:00.0", numvfs=0)
    assert _resources(tree) == {"mode": "passthrough", "total_slots": 1, "used_slots": 0, "allocatable_slots": 1,
                                "quarantined_slots": 0, "devices": [{"name": "L40S", "available": True}]}
    assert _resources(HostTree(tmp_path / "b")) is None


def test_creatable_parsing_matches_the_driver_format():
    text = "ID    : vGPU Name\n1147  : NVIDIA L40S-1Q\n  1428 :  NVIDIA H200X-141C \nbad line\nx : y\n12 :\n"
    assert simapi.parse_creatable(text) == [(1147, "NVIDIA L40S-1Q"), (1428, "NVIDIA H200X-141C")]
    assert simapi.parse_creatable("ID    : vGPU Name\n") == []
    assert simapi.profile_framebuffer_mb("NVIDIA H200X-141C") == 141 * 1024
    assert simapi.profile_framebuffer_mb("NVIDIA A100-3-20C") == 20 * 1024
    assert simapi.profile_framebuffer_mb("NVIDIA L40S-0Q") == 0


def test_token_signature_and_expiry():
    token = simapi.mint_token("s3cret", duration=60, now=1000)
    assert simapi.check_token("s3cret", token, now=1030) is None
    assert simapi.check_token("s3cret", token, now=1061) == "token expired"
    assert simapi.check_token("other", token, now=1030) == "invalid signature"
    assert simapi.check_token("s3cret", "abc", now=1030) == "malformed token"


# ------------------------------------------------------------------ HTTP server
class Server(object):
    def __init__(self, tree):
        tree.write_config(threshold=2)
        self.api = simapi.HypemanAPI(tree.config_path, sysfs_root=tree.sysfs_root, proc_root=tree.proc_root,
                                     data_dir=tree.data_dir)
        self.token = simapi.mint_token(self.api.config["jwt_secret"])
        ready = threading.Event()
        self.httpd = None

        def on_ready(server):
            self.httpd = server
            ready.set()

        self.thread = threading.Thread(target=simapi.serve, args=(self.api, "127.0.0.1", 0, on_ready))
        self.thread.daemon = True
        self.thread.start()
        assert ready.wait(10)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def call(self, path, body=None, token=True):
        headers = {"Authorization": "Bearer %s" % self.token} if token else {}
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers,
                                     method="POST" if data is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def close(self):
        self.httpd.shutdown()
        self.thread.join(10)


@pytest.fixture
def server_tree(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0", numvfs=4)
    tree.add_instance("inst-a", vf=card.vfs[0], profile="NVIDIA L40S-2Q", build="assigned")
    tree.add_instance("inst-b", vf=card.vfs[1], profile="NVIDIA L40S-2Q", liveness="crashed")
    tree.add_instance("inst-c")
    tree.break_path("var/lib/hypeman/guests/inst-c/metadata.json", "garbage")
    servers = []

    def start():
        servers.append(Server(tree))
        return servers[-1]

    yield tree, card, start
    for server in servers:
        server.close()


def test_auth_health_and_instances(server_tree):
    tree, card, start = server_tree
    srv = start()
    assert srv.call("/health", token=False) == (200, {"status": "ok"})
    assert srv.call("/resources", token=False)[0] == 401
    srv.token = simapi.mint_token("wrong-secret")
    assert srv.call("/instances")[0] == 401
    srv.token = simapi.mint_token(srv.api.config["jwt_secret"])
    status, instances = srv.call("/instances")
    assert status == 200
    # inst-c's metadata is unreadable: the API skips it. Liveness from the tree's /proc.
    assert [(i["id"], i["state"], i["gpu"]["device_path"]) for i in instances] == [
        ("inst-a", "Running", "/sys/bus/pci/devices/%s" % card.vfs[0]),
        ("inst-b", "Stopped", "/sys/bus/pci/devices/%s" % card.vfs[1])]


def test_edit_while_running_is_lost_and_restart_keeps_it(server_tree):
    tree, card, start = server_tree
    srv = start()
    body = {"vf_address": card.vfs[2], "instance_id": "inst-x", "assigned_at": "2026-09-01T00:00:00Z"}
    assert srv.call("/_sim/vf-health/failure", body)[1]["outcome"] == "recorded"
    # An operator quarantines VF 3 by hand while hypeman runs...
    doc = json.loads(open(tree.store_path).read())
    doc["records"].append({"vf_address": card.vfs[3], "quarantined_at": QUARANTINE})
    tree.write_store(doc["records"])
    assert srv.call("/resources")[1]["gpu"]["quarantined_slots"] == 0  # read only at start
    # ...and the next report rewrites the file from memory: the edit is gone.
    body = dict(body, instance_id="inst-y")
    assert srv.call("/_sim/vf-health/failure", body)[1]["outcome"] == "quarantined"
    on_disk = json.loads(open(tree.store_path).read())["records"]
    assert [r["vf_address"] for r in on_disk] == [card.vfs[2]]
    # The discipline that works: edit with hypeman stopped, then start it.
    srv.close()
    on_disk.append({"vf_address": card.vfs[3], "quarantined_at": QUARANTINE})
    tree.write_store(on_disk)
    srv2 = start()
    assert srv2.call("/resources")[1]["gpu"]["quarantined_slots"] == 2
    srv2.call("/_sim/vf-health/failure", dict(body, vf_address=card.vfs[0], instance_id="inst-z"))
    kept = [r["vf_address"] for r in json.loads(open(tree.store_path).read())["records"]]
    assert kept == [card.vfs[0], card.vfs[2], card.vfs[3]]


def test_invalid_store_at_start_fails_closed_then_recovers_without_restart(server_tree):
    tree, card, start = server_tree
    tree.write_store(raw=[{"vf_address": card.vfs[0], "wedge_count": 1}])  # legacy L0 array
    srv = start()
    gpu = srv.call("/resources")[1]["gpu"]
    assert gpu["allocatable_slots"] == 0 and "unmarshal VF health state" in gpu["placement_disabled_reason"]
    status, body = srv.call("/_sim/vf-health/failure", {"vf_address": card.vfs[0], "instance_id": "a"})
    assert status == 409 and "unavailable" in body["message"]
    tree.write_store(_quarantine(card.vfs[3]))  # fixed on disk: retried on the next access
    gpu = srv.call("/resources")[1]["gpu"]
    assert "placement_disabled_reason" not in gpu and gpu["quarantined_slots"] == 1


def test_choose_vf_follows_hypemans_ranking():
    # docs/hypeman-interface.md §2.1: fewest quarantined VFs first, then known usage, least framebuffer,
    # address; within the card clean VFs before dirty ones.
    l1q = [(1, "NVIDIA L40S-1Q"), (2, "NVIDIA L40S-2Q")]

    def vf(address, parent, current=0):
        return {"address": address, "parent": parent, "type": current, "creatable": l1q}

    a = [vf("0000:82:00.%d" % f, "0000:82:00.0") for f in (4, 5)]
    b = [vf("0000:e3:00.%d" % f, "0000:e3:00.0") for f in (4, 5)]
    pick = simapi.choose_vf
    # Both empty: the lower address wins.
    assert pick(a + b, {}, set(), "NVIDIA L40S-1Q")[0].startswith("0000:82:00.")
    # A quarantined VF makes card a overflow-only.
    assert pick(a + b, {}, {"0000:82:00.5"}, "NVIDIA L40S-1Q")[0].startswith("0000:e3:00.")
    # Framebuffer in use: card a runs a 2Q, card b is empty.
    assert pick(a + b, {"0000:82:00.4": "NVIDIA L40S-2Q"}, set(), "NVIDIA L40S-1Q")[0].startswith("0000:e3:00.")
    # Clean VFs before a dirty (allocated, unclaimed) one on the winning card.
    dirty = [vf("0000:82:00.4", "0000:82:00.0", current=1), vf("0000:82:00.5", "0000:82:00.0")]
    assert all(pick(dirty, {}, set(), "NVIDIA L40S-1Q")[0] == "0000:82:00.5" for _index in range(10))
    assert pick(a, {}, set(), "NVIDIA L40S-9Q") == (
        None, 'profile "NVIDIA L40S-9Q" is not creatable on any VF (unknown profile or insufficient capacity)')
    assert pick(a, {}, {"0000:82:00.4", "0000:82:00.5"}, "NVIDIA L40S-1Q") == (
        None, 'no available VF for profile "NVIDIA L40S-1Q"')


def test_create_request_problems():
    assert simapi.create_request_problem({"name": "ok-1", "image": "x", "gpu": {"profile": "p"}}) is None
    assert "name" in simapi.create_request_problem({"name": "Bad_Name", "image": "x"})
    assert simapi.create_request_problem({"name": "a"}) == "Missing required field: image"
    assert "tag" in simapi.create_request_problem({"name": "a", "image": "x", "tags": {"k": "bad\nvalue"}})
