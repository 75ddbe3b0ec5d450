# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vgpu_fleet inventory plugin: groups and host vars from real fleet reports, AWX artifacts and
hypeman's API (the simulator's stand-in), constructed options, caching, and hostile input."""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
import yaml

from ansible.errors import AnsibleParserError
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import inventory_loader

from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as fr
from ansible_collections.hypeman.vgpu.tests.sim import api as sim_api
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector, property_settings, replace_with
from ansible_collections.hypeman.vgpu.tests.unit.plugins.inventory import fleet_reports

PROBLEMS = ["ok", "legacy", "drained", "overflow", "draining", "novfs", "below", "stale"]
GROUPS = ("vgpu_needs_recovery", "vgpu_ready_for_cycle", "vgpu_overflow_only", "vgpu_store_unavailable",
          "vgpu_sentinel_coverage_lost", "vgpu_ok", "vgpu_needs_action")
CARD_B = "0000:83:00.0"


def now_text(offset=0):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A real fleet report over simulated hosts, one per problem class, and one unreachable host."""
    return fleet_reports.build_report(str(tmp_path_factory.mktemp("fleet")), PROBLEMS, ["gone-000"],
                                      generated_at=now_text(-60))


def parse(tmp_path, config, cache=True, name="fleet.vgpu_fleet.yml"):
    """Run the plugin on ``config`` as ansible-inventory does; returns the InventoryData."""
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as handle:
        yaml.safe_dump(dict({"plugin": "hypeman.vgpu.vgpu_fleet"}, **config), handle)
    plugin = inventory_loader.get("hypeman.vgpu.vgpu_fleet")
    assert plugin.verify_file(path)
    inventory = InventoryData()
    plugin.parse(inventory, DataLoader(), path, cache=cache)
    if config.get("cache"):
        plugin.update_cache_if_changed()  # as InventoryManager does after a parse (a plugin cache exists only then)
    return inventory


def members(inventory, group):
    return sorted(h.name for h in inventory.groups[group].get_hosts()) if group in inventory.groups else []


def host_vars(inventory, host):
    return inventory.get_host(host).get_vars()


def test_verify_file_wants_the_file_name(tmp_path):
    plugin = inventory_loader.get("hypeman.vgpu.vgpu_fleet")
    for name, wanted in (("a.vgpu_fleet.yml", True), ("vgpu_fleet.yaml", True), ("fleet.yml", False),
                         ("vgpu_fleet.json", False)):
        path = tmp_path / name
        path.write_text("plugin: hypeman.vgpu.vgpu_fleet\n")
        assert plugin.verify_file(str(path)) is wanted, name
    assert not plugin.verify_file(str(tmp_path / "missing.vgpu_fleet.yml"))


def test_groups_follow_the_reports_own_classification(tmp_path, report):
    path = fleet_reports.write_report(str(tmp_path / "fleet-audit.json"), report)
    inventory = parse(tmp_path, {"report": path})
    summary = report["summary"]
    statuses = dict((e["host"], e["status"]) for e in report["hosts"])
    # The report's summary (computed from the card flags) and the plugin (from the issue codes) agree.
    assert members(inventory, "vgpu_ready_for_cycle") == sorted(set(i["host"] for i in summary["ready_for_cycle"]))
    assert members(inventory, "vgpu_store_unavailable") == sorted(summary["store_unavailable"])
    assert members(inventory, "vgpu_needs_action") == sorted(summary["needing_action"])
    assert members(inventory, "vgpu_ok") == sorted(h for h, s in statuses.items() if s == "ok")
    # And each problem class lands where the fleet_audit target's codes say.
    assert members(inventory, "vgpu_ready_for_cycle") == ["drained-002"]
    assert members(inventory, "vgpu_overflow_only") == ["overflow-003"]
    assert members(inventory, "vgpu_store_unavailable") == ["legacy-001"]
    assert members(inventory, "vgpu_needs_recovery") == ["drained-002", "draining-004", "novfs-005", "overflow-003"]
    assert members(inventory, "vgpu_sentinel_coverage_lost") == []
    assert "ok-000" in members(inventory, "vgpu_ok") and "gone-000" in members(inventory, "vgpu_needs_action")
    assert set(GROUPS) <= set(inventory.groups)


def test_host_vars_carry_cards_codes_and_age(tmp_path, report):
    path = fleet_reports.write_report(str(tmp_path / "fleet-audit.json"), report)
    inventory = parse(tmp_path, {"report": path})
    by_host = dict((e["host"], e) for e in report["hosts"])
    drained = host_vars(inventory, "drained-002")
    gpus = dict((g["address"], g) for g in by_host["drained-002"]["placement"]["gpus"])
    assert [c["address"] for c in drained["vgpu_cards"]] == sorted(gpus)
    for card in drained["vgpu_cards"]:
        for key in ("vf_total", "quarantined", "allocatable", "claimed"):
            assert card[key] == gpus[card["address"]][key]
    states = dict((c["address"], c["state"]) for c in drained["vgpu_cards"])
    assert states == {"0000:82:00.0": "healthy", CARD_B: "ready_for_cycle"}
    assert drained["vgpu_ready_cards"] == [CARD_B]
    assert drained["vgpu_issue_codes"] == sorted(set(i["code"] for i in by_host["drained-002"]["issues"]))
    assert drained["vgpu_quarantined_vfs"] == 16
    assert drained["vgpu_slots"] == by_host["drained-002"]["capacity"]
    assert drained["vgpu_report_time"] == report["generated_at"]
    assert 60 <= drained["vgpu_report_age"] < 600
    assert drained["vgpu_source"] == "report" and drained["vgpu_origin"] == path and drained["vgpu_complete"]
    legacy = host_vars(inventory, "legacy-001")
    assert set(c["state"] for c in legacy["vgpu_cards"]) == {"placement_disabled"}
    gone = host_vars(inventory, "gone-000")
    assert gone["vgpu_status"] == "unreachable" and gone["vgpu_cards"] == [] and gone["vgpu_slots"] is None


def test_constructed_options(tmp_path, report):
    path = fleet_reports.write_report(str(tmp_path / "fleet-audit.json"), report)
    inventory = parse(tmp_path, {
        "report": path,
        "compose": {"target_gpu": "vgpu_ready_cards | first | default(omit)", "lost": "vgpu_slots.lost_pct"},
        "groups": {"heavy_loss": "(vgpu_slots.lost_pct | default(0)) > 60"},
        "keyed_groups": [{"key": "vgpu_status", "prefix": "status"}]})
    assert host_vars(inventory, "drained-002")["target_gpu"] == CARD_B
    assert "target_gpu" not in host_vars(inventory, "ok-000")
    assert members(inventory, "heavy_loss") == ["legacy-001"]
    assert members(inventory, "status_unreachable") == ["gone-000"]
    assert "ok-000" in members(inventory, "status_ok")
    # strict: a compose expression that fails is an error, not a silently missing var.
    with pytest.raises(Exception, match="Could not set broken"):
        parse(tmp_path, {"report": path, "strict": True, "compose": {"broken": "vgpu_slots.lost_pct"}})


def test_the_newest_of_several_reports_wins_and_a_directory_means_its_fleet_audit(tmp_path, report):
    older = copy.deepcopy(report)
    older["generated_at"] = now_text(-7200)
    older["hosts"] = [e for e in older["hosts"] if e["host"] == "ok-000"]
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    fleet_reports.write_report(str(tmp_path / "old" / "fleet-audit.json"), older)
    fleet_reports.write_report(str(tmp_path / "new" / "fleet-audit.json"), report)
    for order in ([str(tmp_path / "old"), str(tmp_path / "new")], [str(tmp_path / "new"), str(tmp_path / "old")]):
        inventory = parse(tmp_path, {"report": order})
        assert members(inventory, "vgpu_ready_for_cycle") == ["drained-002"], order


def artifacts_of(report):
    return {"hypeman_vgpu_audit": json.loads(json.dumps(report["summary"]))}


@pytest.mark.parametrize("form", ["artifacts", "awx_job", "runner_event"])
def test_awx_artifact_files(tmp_path, report, form):
    finished = now_text(-120)
    document = {
        "artifacts": artifacts_of(report),
        # GET /api/v2/jobs/N/ (awx jobs get N -f json): the job with its artifacts
        "awx_job": {"id": 42, "type": "job", "status": "successful", "finished": finished,
                    "artifacts": artifacts_of(report)},
        # ansible-runner's artifacts/<ident>/job_events/*-playbook_on_stats.json
        "runner_event": {"event": "playbook_on_stats", "created": finished,
                         "event_data": {"artifact_data": artifacts_of(report)}},
    }[form]
    path = fleet_reports.write_json(str(tmp_path / "job.json"), document)
    inventory = parse(tmp_path, {"report": path})
    summary = report["summary"]
    assert members(inventory, "vgpu_ready_for_cycle") == ["drained-002"]
    assert members(inventory, "vgpu_store_unavailable") == sorted(summary["store_unavailable"])
    assert members(inventory, "vgpu_needs_action") == sorted(summary["needing_action"])
    # The summary names no healthy host and no overflow-only card: those groups stay empty.
    assert members(inventory, "vgpu_ok") == [] and members(inventory, "vgpu_overflow_only") == []
    drained = host_vars(inventory, "drained-002")
    assert drained["vgpu_ready_cards"] == [CARD_B] and drained["vgpu_complete"] is False
    assert drained["vgpu_source"] == "artifact"
    assert host_vars(inventory, "gone-000")["vgpu_status"] == "unreachable"
    if form != "artifacts":
        assert drained["vgpu_report_time"] == finished
    else:  # no time of its own: the file's modification time
        assert drained["vgpu_report_age"] < 600


def test_stale_report(tmp_path, report):
    old = copy.deepcopy(report)
    old["generated_at"] = now_text(-10000)
    path = fleet_reports.write_report(str(tmp_path / "fleet-audit.json"), old)
    with pytest.raises(AnsibleParserError, match=r"is 1000\d seconds old; expected at most max_age=7200"):
        parse(tmp_path, {"report": path, "max_age": 7200})
    inventory = parse(tmp_path, {"report": path, "max_age": 7200, "on_stale": "warn"})
    assert host_vars(inventory, "ok-000")["vgpu_report_age"] >= 10000
    assert parse(tmp_path, {"report": path, "max_age": 20000}).get_host("ok-000") is not None


# --- bad input --------------------------------------------------------------------------------------


def _bad(tmp_path, content=None, how="file", **config):
    path = str(tmp_path / "fleet-audit.json")
    if content is not None and not isinstance(content, bytes):
        content = json.dumps(content).encode()
    replace_with(path, how, content or b"")
    with hang_detector(20, "the plugin on a hostile report"):
        with pytest.raises(AnsibleParserError) as caught:
            parse(tmp_path, dict({"report": path}, **config))
    return str(caught.value)


def test_missing_and_unusable_files(tmp_path):
    assert "No such file" in _bad(tmp_path, how="missing") and "fleet-audit.json" in _bad(tmp_path, how="missing")
    assert "is a FIFO" in _bad(tmp_path, how="fifo")
    # A directory means its fleet-audit.json, which this one does not hold.
    assert "fleet-audit.json/fleet-audit.json: No such file" in _bad(tmp_path, how="dir")
    assert "No such file" in _bad(tmp_path, how="dangling")
    assert "is larger than 100 bytes" in _bad(tmp_path, b" " * 101, max_report_size=100)
    with pytest.raises(AnsibleParserError, match="is a character device"):
        parse(tmp_path, {"report": "/dev/zero"})
    with pytest.raises(AnsibleParserError, match="option report is not set"):
        parse(tmp_path, {})


@pytest.mark.parametrize("content, words", [
    (b"", "is not JSON"),
    (b"\xff\xfe garbage", "is not UTF-8"),
    (b"{not json", "is not JSON"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    ([], "the document is an array; expected a fleet report"),
    ({"hello": 1}, "neither a fleet report's schema and hosts nor an artifact"),
    ({"schema": 2, "kind": "audit", "hosts": []}, "schema is 2; expected 1"),
    ({"schema": 1, "kind": "nope", "hosts": []}, "kind is 'nope'; expected audit or reconcile"),
    ({"schema": 1, "kind": "audit", "hosts": {}}, "hosts is an object; expected an array of host entries"),
    ({"schema": 1, "kind": "audit", "hosts": [{"host": "a b", "status": "ok", "issues": []}]},
     r"hosts\[0\].host is 'a b'; expected a host name"),
    ({"schema": 1, "kind": "audit", "hosts": [{"host": "a", "status": "ok", "issues": []}] * 2},
     r"hosts\[1\].host 'a' is listed twice"),
    ({"schema": 1, "kind": "audit", "hosts": [{"host": "a", "status": "ok", "issues": [{"code": 1}]}]},
     r"hosts\[0\].issues\[0\].severity is null; expected a string"),
    ({"schema": 1, "kind": "audit", "hosts": [{"host": "a", "status": "ok", "issues": [],
                                               "placement": {"gpus": [{"address": "x", "quarantined": -1}]}}]},
     r"hosts\[0\].placement.gpus\[0\].quarantined is -1; expected a count"),
    ({"hypeman_vgpu_audit": {"ready_for_cycle": [{"host": 3}]}},
     r"hypeman_vgpu_audit.ready_for_cycle\[0\].host is a number; expected a host name"),
    ({"artifacts": {"hypeman_vgpu_audit": {"needing_action": "h1"}}},
     r"artifacts.hypeman_vgpu_audit.needing_action is a string; expected an array of host names"),
])
def test_wrong_shapes_name_the_file_and_field(tmp_path, content, words):
    message = _bad(tmp_path, content)
    assert "fleet-audit.json" in message and ".vgpu_fleet.yml" in message
    assert pytest.importorskip("re").search(words, message), message


def test_hostile_reports_property(tmp_path_factory, report):
    """Any subtree of a real report replaced by any JSON value: an inventory or a clear parser error."""
    from hypothesis import given, strategies as st

    base = json.loads(fr.to_json(report))
    json_values = st.recursive(st.none() | st.booleans() | st.integers(-2, 2 ** 40) | st.floats(allow_nan=False)
                               | st.text(max_size=20), lambda inner: st.lists(inner, max_size=3)
                               | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)

    def paths(value, prefix=()):
        yield prefix
        if isinstance(value, dict):
            for key, child in value.items():
                yield from paths(child, prefix + (key,))
        elif isinstance(value, list):
            for index, child in enumerate(value):
                yield from paths(child, prefix + (index,))

    all_paths = [p for p in paths(base) if p]

    @property_settings(25)
    @given(st.sampled_from(all_paths), json_values)
    def check(where, value):
        document = copy.deepcopy(base)
        node = document
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
        directory = tmp_path_factory.mktemp("hostile")
        path = fleet_reports.write_json(str(directory / "fleet-audit.json"), document)
        try:
            with hang_detector(20, "the plugin on a mutated report"):
                inventory = parse(directory, {"report": path})
        except AnsibleParserError as err:
            assert "fleet-audit.json" in str(err)
            return
        for group in GROUPS:
            for host in members(inventory, group):
                assert isinstance(host_vars(inventory, host)["vgpu_issue_codes"], list)

    check()


def test_random_bytes_property(tmp_path_factory):
    from hypothesis import given, strategies as st

    @property_settings(40)
    @given(st.binary(max_size=200))
    def check(data):
        directory = tmp_path_factory.mktemp("bytes")
        path = str(directory / "fleet-audit.json")
        with open(path, "wb") as handle:
            handle.write(data)
        with pytest.raises(AnsibleParserError, match="fleet-audit.json"):
            parse(directory, {"report": path})

    check()


# --- live: hypeman's API ------------------------------------------------------------------------------


class SimFleet(object):
    """One simulator API server per host tree, each with its own token."""

    def __init__(self, root):
        self.root = root
        self.servers, self.tokens, self.urls = [], {}, {}

    def add(self, name, quarantine=(), legacy=False):
        tree = HostTree(os.path.join(self.root, name))
        card = tree.add_card("A100", "0000:82:00.0")
        tree.write_config(threshold=2)
        if legacy:
            tree.write_store(raw=[{"vf_address": card.vfs[0], "wedge_count": 1,
                                   "quarantined_at": "2026-08-22T00:00:00Z"}])
        elif quarantine:
            tree.write_store([{"vf_address": card.vfs[i], "quarantined_at": "2026-08-22T00:00:00Z"}
                              for i in quarantine])
        api = sim_api.HypemanAPI(tree.config_path, sysfs_root=tree.sysfs_root, proc_root=tree.proc_root,
                                 data_dir=tree.data_dir)
        server = ThreadingHTTPServer(("127.0.0.1", 0), sim_api.make_handler(api))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        self.tokens[name] = sim_api.mint_token(api.config["jwt_secret"])
        self.urls[name] = "http://127.0.0.1:%d" % server.server_address[1]
        token_file = os.path.join(self.root, name + ".jwt")
        with open(token_file, "w") as handle:
            handle.write(self.tokens[name] + "\n")
        return token_file

    def close(self):
        for server in self.servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def sim_fleet(tmp_path):
    fleet = SimFleet(str(tmp_path / "sim"))
    os.makedirs(fleet.root)
    yield fleet
    fleet.close()


def test_live_groups_from_the_api(tmp_path, sim_fleet):
    hosts = {}
    for name, kwargs in (("ok-1", {}), ("overflow-1", {"quarantine": (1, 2)}), ("legacy-1", {"legacy": True})):
        token_file = sim_fleet.add(name, **kwargs)
        hosts[name] = {"api_url": sim_fleet.urls[name], "api_token_file": token_file}
    inventory = parse(tmp_path, {"source": "live", "hosts": hosts})
    assert members(inventory, "vgpu_ok") == ["ok-1"]
    assert members(inventory, "vgpu_store_unavailable") == ["legacy-1"]
    assert members(inventory, "vgpu_needs_recovery") == ["overflow-1"]
    assert members(inventory, "vgpu_needs_action") == ["legacy-1", "overflow-1"]
    # What /resources cannot tell stays empty.
    for group in ("vgpu_ready_for_cycle", "vgpu_overflow_only", "vgpu_sentinel_coverage_lost"):
        assert members(inventory, group) == []
    overflow = host_vars(inventory, "overflow-1")
    assert overflow["vgpu_slots"]["quarantined_slots"] == 2 and overflow["vgpu_issue_codes"] == ["quarantined_slots"]
    assert overflow["vgpu_source"] == "live" and overflow["vgpu_origin"] == sim_fleet.urls["overflow-1"]
    assert host_vars(inventory, "legacy-1")["vgpu_slots"]["lost_pct"] == 100.0
    for name in hosts:
        assert sim_fleet.tokens[name] not in json.dumps(host_vars(inventory, name), default=str)


def test_live_url_template_and_token_from_env(tmp_path, sim_fleet, monkeypatch):
    sim_fleet.add("only-1")
    port = sim_fleet.urls["only-1"].rsplit(":", 1)[1]
    monkeypatch.setenv("MY_HYPEMAN_TOKEN", sim_fleet.tokens["only-1"])
    inventory = parse(tmp_path, {"source": "live", "hosts": ["only-1"], "api_token_env": "MY_HYPEMAN_TOKEN",
                                 "api_url": "http://127.0.0.1:%s/{{ inventory_hostname | regex_replace('.*', '') }}"
                                 % port})
    assert members(inventory, "vgpu_ok") == ["only-1"]


def test_live_api_errors_name_the_host_never_the_token(tmp_path, sim_fleet):
    token_file = sim_fleet.add("ok-1")
    wrong = tmp_path / "wrong.jwt"
    wrong.write_text("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.secret-signature-123\n")
    hosts = {"ok-1": {"api_url": sim_fleet.urls["ok-1"], "api_token_file": str(wrong)}}
    with pytest.raises(AnsibleParserError) as caught:
        parse(tmp_path, {"source": "live", "hosts": hosts})
    message = str(caught.value)
    assert "host ok-1" in message and "HTTP 401" in message and "secret-signature-123" not in message
    # Nothing listens: the same, naming the URL.
    with pytest.raises(AnsibleParserError, match="host down-1 did not answer.*127.0.0.1:1/resources"):
        parse(tmp_path, {"source": "live", "hosts": {"down-1": {"api_url": "http://127.0.0.1:1",
                                                                "api_token_file": token_file}}})
    # api_error: host keeps the host, with the audit's code for it.
    inventory = parse(tmp_path, {"source": "live", "api_error": "host", "hosts": dict(hosts, **{
        "down-1": {"api_url": "http://127.0.0.1:1", "api_token_file": token_file}})})
    assert members(inventory, "vgpu_needs_action") == ["down-1", "ok-1"]
    assert host_vars(inventory, "down-1")["vgpu_issue_codes"] == ["api_unreachable"]
    # A token file that is not there: named, with no content to leak.
    with pytest.raises(AnsibleParserError, match="cannot read the API token file .*missing.jwt for host ok-1"):
        parse(tmp_path, {"source": "live", "hosts": {"ok-1": {"api_url": sim_fleet.urls["ok-1"],
                                                              "api_token_file": str(tmp_path / "missing.jwt")}}})
    with pytest.raises(AnsibleParserError, match="option hosts is not set"):
        parse(tmp_path, {"source": "live"})
    with pytest.raises(AnsibleParserError, match="api_url for host ok-1 is 'ftp://x'"):
        parse(tmp_path, {"source": "live", "hosts": {"ok-1": {"api_url": "ftp://x"}}})


# --- caching ------------------------------------------------------------------------------------------


def test_cache_keeps_the_documents_and_refresh_rereads(tmp_path, report):
    path = fleet_reports.write_report(str(tmp_path / "fleet-audit.json"), report)
    config = {"report": path, "cache": True, "cache_plugin": "ansible.builtin.jsonfile",
              "cache_connection": str(tmp_path / "cache"), "cache_timeout": 3600}
    first = parse(tmp_path, config, cache=False)
    assert members(first, "vgpu_ready_for_cycle") == ["drained-002"]
    assert os.listdir(str(tmp_path / "cache"))
    changed = copy.deepcopy(report)
    changed["hosts"] = [e for e in changed["hosts"] if e["host"] == "ok-000"]
    fleet_reports.write_report(path, changed)
    cached = parse(tmp_path, config, cache=True)
    assert members(cached, "vgpu_ready_for_cycle") == ["drained-002"]  # from the cache
    fresh = parse(tmp_path, config, cache=False)  # ansible-inventory --flush-cache, meta: refresh_inventory
    assert members(fresh, "vgpu_ready_for_cycle") == [] and members(fresh, "vgpu_ok") == ["ok-000"]


class _StubAPI(object):
    """An HTTP server answering GET /resources with whatever body the test sets."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler

        stub = self
        self.body = b"{}"

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):
                pass

            def do_GET(self):  # noqa: N802 (http.server's naming)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(stub.body)))
                self.end_headers()
                self.wfile.write(stub.body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]


def test_hostile_api_answers_property(tmp_path_factory):
    """Any /resources answer: a host in vgpu_ok or vgpu_needs_action (api_error: host), or a clear error."""
    from hypothesis import given, strategies as st

    stub = _StubAPI()
    scalars = st.none() | st.booleans() | st.integers(-5, 2 ** 70) | st.floats(allow_nan=False) | st.text(max_size=12)
    gpu = st.fixed_dictionaries({}, optional={
        "mode": st.sampled_from(["vgpu", "passthrough"]) | scalars, "total_slots": st.integers(-2, 64) | scalars,
        "allocatable_slots": st.integers(-2, 64) | scalars, "quarantined_slots": st.integers(-2, 64) | scalars,
        "placement_disabled_reason": scalars, "profiles": st.lists(scalars, max_size=2) | scalars})
    bodies = st.one_of(
        st.builds(lambda g: json.dumps({"gpu": g}).encode(), gpu | scalars),
        st.builds(lambda v: json.dumps(v).encode(), st.lists(scalars, max_size=3) | scalars),
        st.binary(max_size=40))
    try:
        # Each example is an HTTP round trip through the plugin: fewer examples than the file properties.
        @property_settings(12)
        @given(bodies, st.sampled_from(["fail", "host"]))
        def check(body, api_error):
            stub.body = body
            directory = tmp_path_factory.mktemp("live")
            try:
                with hang_detector(20, "the plugin on a hostile API answer"):
                    inventory = parse(directory, {"source": "live", "api_error": api_error,
                                                  "hosts": {"h-1": {"api_url": stub.url}}})
            except AnsibleParserError as err:
                assert api_error == "fail" and "host h-1" in str(err)
                return
            groups = host_vars(inventory, "h-1")["vgpu_groups"]
            assert ("vgpu_ok" in groups) != ("vgpu_needs_action" in groups)

        check()
    finally:
        stub.server.shutdown()
        stub.server.server_close()


# --- host names that are group names, future-dated reports, option values (red-team repros) ------------


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    """hosts[0] drained-001 (ready for a cycle), hosts[1] overflow-002, hosts[2] ok-000 (worst first)."""
    return fleet_reports.build_report(str(tmp_path_factory.mktemp("small")), ["ok", "drained", "overflow"],
                                      generated_at=now_text(-60))


def _renamed(report, index, name):
    document = json.loads(fr.to_json(report))
    document["hosts"][index]["host"] = name
    return document


@pytest.mark.parametrize("name", ["all", "ungrouped", "vgpu_ok", "vgpu_needs_recovery", "vgpu_needs_action"])
def test_a_host_named_like_a_group_is_refused(tmp_path, small_report, name):
    """Ansible takes such a name for the group: vgpu_ok as a member of vgpu_needs_recovery would put the
    healthy hosts there; all makes a dependency loop naming nothing."""
    message = _bad(tmp_path, _renamed(small_report, 1, name))
    assert "hosts[1].host is %r, a group name" % name in message and "fleet-audit.json" in message
    # Everywhere a host name comes from: an artifact's lists, live mode's hosts.
    artifact = {"hypeman_vgpu_audit": {"ready_for_cycle": [{"host": name, "gpu": CARD_B}]}}
    assert "ready_for_cycle[0].host is %r, a group name" % name in _bad(tmp_path, artifact)
    with pytest.raises(AnsibleParserError, match="option hosts is %r, a group name" % name):
        parse(tmp_path, {"source": "live", "hosts": [name]})


def test_localhost_is_a_host_like_any_other(tmp_path, small_report):
    path = fleet_reports.write_report(str(tmp_path / "fleet-audit.json"), _renamed(small_report, 2, "localhost"))
    inventory = parse(tmp_path, {"report": path})
    assert members(inventory, "vgpu_ok") == ["localhost"]
    assert members(inventory, "vgpu_needs_recovery") == ["drained-001", "overflow-002"]


def test_a_host_named_like_a_group_of_another_source_is_refused_before_anything_is_added(tmp_path, small_report):
    path = fleet_reports.write_report(str(tmp_path / "fleet-audit.json"), small_report)
    config = tmp_path / "fleet.vgpu_fleet.yml"
    config.write_text("plugin: hypeman.vgpu.vgpu_fleet\nreport: %s\n" % path)
    inventory = InventoryData()
    inventory.add_group("drained-001")  # e.g. a group of the hosts.yml given with another -i
    inventory.add_host("gpu-99", group="drained-001")
    plugin = inventory_loader.get("hypeman.vgpu.vgpu_fleet")
    with pytest.raises(AnsibleParserError, match=r"names host 'drained-001' \(hosts\[0\].host\), which is also "
                                                 r"a group of the inventory"):
        plugin.parse(inventory, DataLoader(), str(config))
    assert sorted(inventory.hosts) == ["gpu-99"] and not set(GROUPS) & set(inventory.groups)


def test_a_composed_group_named_like_a_host_is_refused(tmp_path, small_report):
    # ok-000 makes the group "drained_001", before or after the host of that name is added to its groups.
    for order in ([0, 1, 2], [2, 1, 0]):
        document = _renamed(small_report, 0, "drained_001")
        document["hosts"] = [document["hosts"][i] for i in order]
        index = order.index(0)
        path = fleet_reports.write_json(str(tmp_path / "fleet-audit.json"), document)
        with pytest.raises(AnsibleParserError, match=r"names host 'drained_001' \(hosts\[%d\].host\), which is "
                                                     r"also a group" % index):
            parse(tmp_path, {"report": path, "groups": {"drained_001": "vgpu_status == 'ok'"}})


def test_any_host_name_is_grouped_as_the_report_says_or_refused_property(tmp_path_factory, small_report):
    """Any host name in the report: each group holds exactly the hosts the report puts there, or the
    inventory fails naming the entry."""
    from hypothesis import given, strategies as st

    fixed = sorted(GROUPS) + ["all", "ungrouped", "localhost", "gpu[01:03]", "ok-000x", "*", "~gpu", "!x", "a:b",
                              "a&b", "vgpu_ok2"]
    names = st.sampled_from(fixed) | st.text(min_size=1, max_size=12)

    @property_settings(30)
    @given(st.integers(0, 2), names)
    def check(index, name):
        document = _renamed(small_report, index, name)
        directory = tmp_path_factory.mktemp("names")
        path = fleet_reports.write_json(str(directory / "fleet-audit.json"), document)
        try:
            inventory = parse(directory, {"report": path})
        except AnsibleParserError as err:
            assert "hosts[%d].host" % index in str(err) or "listed twice" in str(err), str(err)
            return
        expected = dict((group, []) for group in GROUPS)
        for entry in document["hosts"]:
            for group in host_vars(inventory, entry["host"])["vgpu_groups"]:
                expected[group].append(entry["host"])
        for group in GROUPS:
            assert members(inventory, group) == sorted(expected[group]), group
        assert host_vars(inventory, name)["vgpu_status"] == document["hosts"][index]["status"]

    check()


def test_a_report_from_the_future_is_stale_and_never_the_newest(tmp_path, report):
    future = copy.deepcopy(report)
    future["generated_at"] = "2099-01-01T00:00:00Z"
    future["hosts"] = [e for e in future["hosts"] if e["host"] == "ok-000"]
    (tmp_path / "future").mkdir()
    (tmp_path / "now").mkdir()
    future_path = fleet_reports.write_report(str(tmp_path / "future" / "fleet-audit.json"), future)
    fleet_reports.write_report(str(tmp_path / "now" / "fleet-audit.json"), report)
    # Alone: stale, max_age or not, naming the file and the time; on_stale: warn builds it.
    for config in ({}, {"max_age": 7200}):
        with pytest.raises(AnsibleParserError, match=r"the fleet report %s is dated 2099-01-01T00:00:00Z, \d+ "
                                                     r"seconds after this controller's clock; expected a time no "
                                                     r"later than now \(300 seconds" % future_path):
            parse(tmp_path, dict({"report": future_path}, **config))
    assert parse(tmp_path, {"report": future_path, "on_stale": "warn"}).get_host("ok-000") is not None
    # With another report: the other one, whichever order.
    for order in ([str(tmp_path / "future"), str(tmp_path / "now")], [str(tmp_path / "now"), str(tmp_path / "future")]):
        inventory = parse(tmp_path, {"report": order, "max_age": 7200})
        assert members(inventory, "vgpu_ready_for_cycle") == ["drained-002"], order
    # Within the clock skew allowed: fine, age 0.
    near = copy.deepcopy(report)
    near["generated_at"] = now_text(120)
    path = fleet_reports.write_report(str(tmp_path / "near.json"), near)
    assert host_vars(parse(tmp_path, {"report": path, "max_age": 60}), "ok-000")["vgpu_report_age"] == 0


@pytest.mark.parametrize("config, words", [
    ({"source": "live", "hosts": ["h-1"], "timeout": -5}, "option timeout is -5; expected seconds, 1 or more"),
    ({"source": "live", "hosts": ["h-1"], "timeout": 0}, "option timeout is 0; expected seconds, 1 or more"),
    ({"source": "live", "hosts": ["h-1"], "workers": 0}, "option workers is 0; expected a number of hosts, 1 or more"),
    ({"source": "live", "hosts": {"h-1": {"api_token_env": ["A", "B"]}}},
     "option hosts.h-1.api_token_env is a list (['A', 'B']); expected the name of an environment variable"),
    ({"source": "live", "hosts": {"h-1": {"api_url": {"a": 1}}}},
     "option hosts.h-1.api_url is a mapping ({'a': 1}); expected hypeman's API base URL (a string)"),
    ({"source": "live", "hosts": {"h-1": {"api_token_file": ""}}},
     "option hosts.h-1.api_token_file is a string (''); expected the path of a file"),
    ({"report": "/nonexistent", "max_report_size": 0}, "option max_report_size is 0; expected a size in bytes"),
    ({"source": "live", "hosts": ["h-1"], "max_age": -1}, "option max_age is -1; expected seconds, 0 or more"),
])
def test_option_values_are_checked_and_named(tmp_path, monkeypatch, config, words):
    monkeypatch.setenv("HYPEMAN_VGPU_API_TOKEN", "x")
    config = dict({"api_url": "http://127.0.0.1:1", "api_error": "host"}, **config)
    with hang_detector(20, "the plugin on a bad option"):
        with pytest.raises(AnsibleParserError) as caught:
            parse(tmp_path, config)
    assert words in str(caught.value) and ".vgpu_fleet.yml" in str(caught.value), str(caught.value)
