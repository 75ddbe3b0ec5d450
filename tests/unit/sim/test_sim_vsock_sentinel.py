# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulator's current-hypeman mode: the vsock sentinel records by itself, /metrics shows its counters."""

from __future__ import annotations

import json
import os
import urllib.request

from ansible_collections.hypeman.vgpu.plugins.module_utils import _metrics
from ansible_collections.hypeman.vgpu.tests.sim import api as simapi
from ansible_collections.hypeman.vgpu.tests.sim import metrics as sim_metrics
from ansible_collections.hypeman.vgpu.tests.sim import sentinel as sim_sentinel
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree


def _host(tmp_path):
    tree = HostTree(tmp_path)
    card = tree.add_card("L40S", "0000:82:00.0")
    for index, name in enumerate(("wedged", "healthy", "old-agent", "silent")):
        tree.add_instance(name, vf=card.vfs[index], profile="NVIDIA L40S-2Q")
    tree.add_instance("no-gpu")
    guests = os.path.join(tree.data_dir, "guests")
    sim_sentinel.write_agent_state(os.path.join(guests, "wedged"), "failed")
    sim_sentinel.write_agent_state(os.path.join(guests, "healthy"), "ok")
    sim_sentinel.write_agent_state(os.path.join(guests, "old-agent"), "unsupported")
    api = simapi.HypemanAPI(tree.config_path, sysfs_root=tree.sysfs_root, proc_root=tree.proc_root,
                            data_dir=tree.data_dir)
    return tree, card, api


def test_the_vsock_sentinel_polls_every_vgpu_guest_and_records_failures_itself(tmp_path):
    tree, card, api = _host(tmp_path)
    counters = sim_metrics.SentinelCounters()
    sentinel = sim_sentinel.VsockSentinel(api, counters)
    sentinel.poll_once()
    sentinel.poll_once()  # the store deduplicates per assignment: counted once
    assert counters.checks == {"failed": 2, "ok": 2, "unsupported_agent": 2, "rpc_error": 2}
    assert counters.init_failures == 1 and counters.quarantines == 0
    with open(tree.store_path) as handle:
        records = json.load(handle)["records"]
    assert [r["vf_address"] for r in records] == [card.vfs[0]]
    assert records[0]["failures"][0]["instance_id"] == "wedged"


def test_metrics_are_served_as_hypeman_serves_them_and_read_by_the_collection(tmp_path):
    _tree, _card, api = _host(tmp_path)
    counters = sim_metrics.SentinelCounters()
    sim_sentinel.VsockSentinel(api, counters).poll_once()
    server = simapi.serve_metrics(api, counters, port=0)
    try:
        url = "http://127.0.0.1:%d/metrics" % server.server_address[1]
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        read = _metrics.read_sentinel_metrics(url, 10)
    finally:
        server.shutdown()
        server.server_close()
    assert read["error"] is None
    assert read["sample"]["checks"] == {"failed": 1.0, "ok": 1.0, "unsupported_agent": 1.0, "rpc_error": 1.0}
    assert read["sample"]["init_failures"] == 1.0 and read["sample"]["version"] == "v0.0.0-sim"
    assert read["sample"]["quarantined_vfs"] == 0.0 and read["sample"]["store_unavailable"] == 0.0
