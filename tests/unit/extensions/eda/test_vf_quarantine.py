# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The EDA source hypeman.vgpu.vf_quarantine, run as ansible-rulebook runs it (an asyncio coroutine fed
a queue), against a fake host that changes between polls: a store file, a sysfs tree, and a stand-in for
hypeman's API and metrics endpoint."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.tests.sim import metrics as sim_metrics
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector, property_settings, replace_with
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub

PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..",
                      "extensions", "eda", "plugins", "event_source", "vf_quarantine.py")
VF, VF2, CARD = "0000:82:00.4", "0000:82:00.5", "0000:82:00.0"
KINDS = {"vf_quarantined", "vf_failure_below_threshold", "store_unavailable", "sentinel_coverage_lost",
         "source_error"}


def load_plugin():
    # ansible-rulebook loads the file by path (runpy.run_path), not as a package module: do the same.
    spec = importlib.util.spec_from_file_location("vf_quarantine_under_test", os.path.normpath(PLUGIN))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = load_plugin()


@pytest.fixture
def plugin(monkeypatch):
    module = SOURCE
    clock = {"now": 1000.0}
    monkeypatch.setattr(module, "_now", lambda: clock["now"])
    monkeypatch.setattr(module, "test_clock", clock, raising=False)
    return module


class FakeHost(object):
    """A host's data dir and sysfs: two VFs of card 0000:82:00.0."""

    def __init__(self, root):
        self.store = os.path.join(root, "data", "gpu", "vf-health.json")
        self.sysfs = os.path.join(root, "sys")
        os.makedirs(os.path.dirname(self.store))
        devices = os.path.join(self.sysfs, "bus", "pci", "devices")
        os.makedirs(os.path.join(devices, CARD))
        for vf in (VF, VF2):
            os.makedirs(os.path.join(devices, vf))
            os.symlink("../%s" % CARD, os.path.join(devices, vf, "physfn"))

    def write(self, records):
        with open(self.store, "w") as handle:
            json.dump({"version": 1, "records": records}, handle, indent=2)

    def write_bytes(self, data):
        with open(self.store, "wb") as handle:
            handle.write(data)


def failure(instance, when="2026-08-20T15:00:00Z"):
    return {"instance_id": instance, "assigned_at": when, "reported_at": "2026-08-20T15:00:42.5Z"}


QUARANTINED = [{"vf_address": VF, "failures": [failure("a1"), failure("b2", "2026-08-21T09:00:00Z")],
                "quarantined_at": "2026-08-21T09:00:30Z"}]


def run(plugin, args, steps, clock_step=0.0):
    """Run the source for ``len(steps)`` polls; ``steps[i]()`` changes the host before poll i.

    Returns the events put on the queue. The source runs to its end (max_polls): a hang fails the test.
    """
    queue = asyncio.Queue()
    real_poll = plugin.poll_once
    calls = {"n": 0}

    async def poll_with_changes(settings, hosts_state):
        if calls["n"]:
            plugin.test_clock["now"] += clock_step
        steps[calls["n"]]()
        calls["n"] += 1
        return await real_poll(settings, hosts_state)

    plugin.poll_once = poll_with_changes
    args = dict(args, max_polls=len(steps), interval=0.01)
    with hang_detector(60, "the source"):
        asyncio.run(plugin.main(queue, args))
    plugin.poll_once = real_poll
    assert calls["n"] == len(steps)
    events = []
    while not queue.empty():
        events.append(queue.get_nowait()["vf_quarantine"])
    return events


def nothing():
    pass


@pytest.fixture
def host(tmp_path):
    return FakeHost(str(tmp_path))


def store_args(tmp_path, host, **extra):
    return dict({"hosts": [{"name": "gpu-07", "store_path": host.store, "sysfs_root": host.sysfs}],
                 "state_path": str(tmp_path / "state" / "cursor.json"), "debounce": 0}, **extra)


def test_a_new_quarantine_gives_one_event_with_host_card_vf_reason_and_evidence(plugin, host, tmp_path):
    host.write([])
    events = run(plugin, store_args(tmp_path, host), [nothing, lambda: host.write(QUARANTINED), nothing, nothing])
    assert len(events) == 1
    event = events[0]
    assert (event["kind"], event["host"], event["card"], event["vf"], event["source"]) == (
        "vf_quarantined", "gpu-07", CARD, VF, "store")
    assert "quarantined since 2026-08-21T09:00:30Z after 2 recorded failure(s)" in event["reason"]
    assert event["evidence"]["record"]["failures"][1]["instance_id"] == "b2"
    assert event["evidence"]["store_path"] == host.store
    assert event["host_card"] == "gpu-07/" + CARD


def test_a_restart_fires_nothing_already_fired(plugin, host, tmp_path):
    host.write([])
    args = store_args(tmp_path, host)
    assert len(run(plugin, args, [nothing, lambda: host.write(QUARANTINED)])) == 1
    assert run(plugin, args, [nothing, nothing]) == []
    # The cursor is a private file, replaced whole.
    state = tmp_path / "state" / "cursor.json"
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    assert json.loads(state.read_text())["version"] == 1
    # A second, different quarantine after the restart still fires.
    later = QUARANTINED + [{"vf_address": VF2, "quarantined_at": "2026-08-22T00:00:00Z"}]
    events = run(plugin, args, [lambda: host.write(later)])
    assert [(e["kind"], e["vf"]) for e in events] == [("vf_quarantined", VF2)]


def test_quarantines_present_before_the_first_read_are_a_baseline_unless_fire_existing(plugin, host, tmp_path):
    host.write(QUARANTINED)
    assert run(plugin, store_args(tmp_path, host), [nothing, nothing]) == []
    events = run(plugin, store_args(tmp_path / "other", host, fire_existing=True), [nothing])
    assert [(e["kind"], e["vf"]) for e in events] == [("vf_quarantined", VF)]


def test_debounce_waits_for_a_condition_to_last(plugin, host, tmp_path):
    host.write([])
    args = store_args(tmp_path, host, debounce=60)
    # Polls 30 s apart: seen at 1030, 1060 (30 s: too early), 1090 (60 s: fires once), 1120.
    events = run(plugin, args, [nothing, lambda: host.write(QUARANTINED), nothing, nothing, nothing],
                 clock_step=30)
    assert len(events) == 1 and events[0]["kind"] == "vf_quarantined"
    assert events[0]["fired_at"] - events[0]["first_seen"] == 60


def test_debounce_drops_a_condition_that_went_away(plugin, host, tmp_path):
    host.write([])
    args = store_args(tmp_path, host, debounce=60)
    flap = [nothing, lambda: host.write(QUARANTINED), lambda: host.write([]), lambda: host.write(QUARANTINED),
            lambda: host.write([])]
    assert run(plugin, args, flap, clock_step=30) == []


def test_a_failure_below_the_threshold(plugin, host, tmp_path):
    host.write([])
    records = [{"vf_address": VF2, "failures": [failure("c3")]}]
    events = run(plugin, store_args(tmp_path, host), [nothing, lambda: host.write(records), nothing])
    assert len(events) == 1
    event = events[0]
    assert (event["kind"], event["vf"], event["card"]) == ("vf_failure_below_threshold", VF2, CARD)
    assert "instance c3 (1 of 2 failures that quarantine it)" in event["reason"]
    assert event["evidence"]["failure"]["instance_id"] == "c3" and event["evidence"]["threshold"] == 2


def test_a_store_hypeman_cannot_load_fires_once_per_episode(plugin, host, tmp_path):
    host.write([])

    def broken():
        host.write_bytes(b'{"version": 2, "records": []}')

    def fixed():
        host.write([])

    events = run(plugin, store_args(tmp_path, host), [nothing, broken, broken, fixed, broken])
    assert [e["kind"] for e in events] == ["store_unavailable", "store_unavailable"]
    assert events[0]["evidence"]["error"] == "validate VF health state: unsupported version 2"


def test_an_unloadable_store_forgets_no_quarantine(plugin, host, tmp_path):
    host.write(QUARANTINED)
    args = store_args(tmp_path, host)
    events = run(plugin, args, [nothing, lambda: host.write_bytes(b"garbage"), lambda: host.write(QUARANTINED)])
    # The store came back with the same quarantine: not new.
    assert [e["kind"] for e in events] == ["store_unavailable"]


def _metrics_text(checks, failures=0, quarantines=0, uptime=100.0, unavailable=False):
    counters = sim_metrics.SentinelCounters()
    counters.checks.update(checks)
    counters.init_failures, counters.quarantines = failures, quarantines
    return sim_metrics.render(counters, "v0.9.1", uptime, quarantines, unavailable)


def _resources(quarantined=0, reason=None):
    gpu = {"mode": "vgpu", "total_slots": 8, "used_slots": 2, "allocatable_slots": 6 - quarantined,
           "quarantined_slots": quarantined, "profiles": []}
    if reason:
        gpu["placement_disabled_reason"] = reason
    return {"cpu": {}, "gpu": gpu}


def api_args(tmp_path, stub, **extra):
    return dict({"hosts": [{"name": "gpu-08", "api_url": stub.url, "api_token": "secret",
                            "metrics_url": stub.url + "/metrics"}],
                 "state_path": str(tmp_path / "cursor.json"), "debounce": 0, "timeout": 5}, **extra)


def test_sentinel_coverage_lost_from_hypemans_metrics(plugin, tmp_path):
    routes = {"/resources": (200, _resources()), "/metrics": (200, _metrics_text({"ok": 10}))}

    def blind():
        routes["/metrics"] = (200, _metrics_text({"ok": 10, "rpc_error": 3}, uptime=130.0))

    def still_blind():
        routes["/metrics"] = (200, _metrics_text({"ok": 10, "rpc_error": 9}, uptime=160.0))

    with ApiStub(routes) as stub:
        events = run(plugin, api_args(tmp_path, stub), [nothing, blind, still_blind], clock_step=30)
        assert stub.requests[0] == ("/resources", "Bearer secret")
    assert [e["kind"] for e in events] == ["sentinel_coverage_lost"]
    assert "3 rpc_error check(s) since the previous sample" in events[0]["reason"]
    assert events[0]["card"] is None and events[0]["vf"] is None


def test_the_api_and_metrics_without_the_store(plugin, tmp_path):
    """Without the store file only host-level facts: a rise of quarantined_slots, a failure that
    quarantined nothing, placement disabled by an unloadable store."""
    routes = {"/resources": (200, _resources()), "/metrics": (200, _metrics_text({"ok": 10}))}

    def quarantine():
        routes["/resources"] = (200, _resources(quarantined=1))
        routes["/metrics"] = (200, _metrics_text({"ok": 11}, failures=2, quarantines=1, uptime=130.0))

    def failure_only():
        routes["/metrics"] = (200, _metrics_text({"ok": 12}, failures=3, quarantines=1, uptime=160.0))

    def unavailable():
        routes["/resources"] = (200, _resources(1, "VF health state unavailable: unmarshal VF health state: x"))
        routes["/metrics"] = (200, _metrics_text({"ok": 13}, 3, 1, 190.0, unavailable=True))

    with ApiStub(routes) as stub:
        events = run(plugin, api_args(tmp_path, stub), [nothing, quarantine, failure_only, unavailable, nothing])
    kinds = [(e["kind"], e["source"]) for e in events]
    # Two failures and one quarantine since the previous sample: one of them quarantined nothing.
    assert kinds == [("vf_quarantined", "api"), ("vf_failure_below_threshold", "metrics"),
                     ("vf_failure_below_threshold", "metrics"), ("store_unavailable", "api")]
    assert events[0]["evidence"]["quarantined_slots"] == 1 and events[0]["card"] is None
    assert "recorded 1 VF init failure(s)" in events[1]["reason"]
    assert "unmarshal VF health state: x" in events[3]["reason"]


def _closed_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_a_bad_host_gives_an_error_event_and_the_others_go_on(plugin, host, tmp_path):
    host.write([])
    args = store_args(tmp_path, host)
    args["hosts"].append({"name": "gone", "api_url": "http://127.0.0.1:%d" % _closed_port()})
    with ApiStub({}, delay=3) as slow:
        args["hosts"].append({"name": "slow", "metrics_url": slow.url + "/metrics"})
        events = run(plugin, dict(args, timeout=0.5), [nothing, lambda: host.write(QUARANTINED), nothing])
    by_host = sorted((e["host"], e["kind"]) for e in events)
    assert by_host == [("gone", "source_error"), ("gpu-07", "vf_quarantined"), ("slow", "source_error")]
    slow_reason = [e for e in events if e["host"] == "slow"][0]["reason"]
    assert "timed out" in slow_reason or "no complete answer within 0.5 seconds" in slow_reason


def test_a_host_whose_read_never_ends_is_reported_once_and_not_read_again(plugin, host, tmp_path, monkeypatch):
    """A read stuck in the kernel (a hung mount) past the deadline: one error event, no second read
    piled on the first, and the host is read again once the stuck read ends."""
    import threading
    host.write([])
    release, reads, seen_before_release = threading.Event(), [], []
    real_observe = plugin.observe_host

    def stuck_second(host_args, settings, state):
        reads.append(1)
        if len(reads) == 2:
            release.wait(30)
        return real_observe(host_args, settings, state)

    def let_go():
        seen_before_release.append(len(reads))
        release.set()

    monkeypatch.setattr(plugin, "observe_host", stuck_second)
    # Poll 0 reads (the baseline), poll 1 sticks past the deadline, poll 2 must not read again.
    events = run(plugin, store_args(tmp_path, host, timeout=0.1),
                 [nothing, nothing, nothing, let_go, nothing, lambda: host.write(QUARANTINED), nothing])
    assert seen_before_release == [2]
    assert [(e["kind"], e["source"]) for e in events] == [("source_error", "poll"), ("vf_quarantined", "store")]
    assert "no complete poll within" in events[0]["reason"]


def test_two_sources_on_one_cursor_are_refused(plugin, host, tmp_path):
    args = store_args(tmp_path, host)
    os.makedirs(str(tmp_path / "state"))
    held = plugin.lock_state(args["state_path"])
    try:
        with pytest.raises(plugin.SourceArgumentError, match="another source holds the cursor"):
            asyncio.run(plugin.main(asyncio.Queue(), dict(args, max_polls=1)))
    finally:
        os.close(held)


@pytest.mark.parametrize("how", ["fifo", "dir", "dangling", "garbage"])
def test_a_hostile_cursor_is_reported_and_nothing_is_lost(plugin, host, tmp_path, how):
    host.write(QUARANTINED)
    args = store_args(tmp_path, host)
    os.makedirs(str(tmp_path / "state"))
    if how == "garbage":
        replace_with(args["state_path"], "file", b"\xff{not json")
    else:
        replace_with(args["state_path"], how)
    events = run(plugin, args, [nothing])
    kinds = [(e["kind"], e["source"]) for e in events]
    assert kinds[0] == ("source_error", "state")
    if how in ("garbage", "dangling"):
        # Unreadable cursor: every current condition fires again rather than one being lost.
        assert ("vf_quarantined", "store") in kinds


@pytest.mark.parametrize("args, words", [
    ({}, "hosts must be a list"),
    ({"hosts": [{"name": "a"}]}, "give at least one of api_url"),
    ({"hosts": [{"name": "a", "store_path": "relative"}]}, "store_path='relative' is not an absolute path"),
    ({"hosts": [{"name": "a", "api_url": "ftp://x"}]}, "api_url='ftp://x' is not an http"),
    ({"hosts": [{"name": "a", "api_url": "http://x", "colour": 1}]}, "unknown key(s) colour"),
    ({"hosts": [{"name": "a", "api_url": "http://x"}] * 2}, "listed twice"),
    ({"hosts": [{"name": "a", "api_url": "http://x"}], "debounce": -1}, "debounce=-1 is not a number"),
    ({"hosts": [{"name": "a", "api_url": "http://x"}], "state_path": "a\x00b"}, "state_path="),
])
def test_bad_arguments_are_named(plugin, args, words):
    with pytest.raises(plugin.SourceArgumentError) as err:
        plugin.parse_args(args)
    assert words in str(err.value)


# --- hostile inputs (property-based, bounded) --------------------------------------------------------

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                       max_size=4), max_leaves=20)
store_like = st.fixed_dictionaries({"version": st.sampled_from([1, 1, 2, "1", None]), "records": st.lists(
    st.fixed_dictionaries({"vf_address": st.sampled_from([VF, VF2, "0000:82:00.8", "x", 5])}, optional={
        "failures": st.lists(st.fixed_dictionaries({}, optional={
            "instance_id": st.text(max_size=8), "assigned_at": st.sampled_from(["2026-08-20T15:00:00Z", "", 7]),
            "reported_at": st.sampled_from(["2026-08-20T15:00:42.5Z", "0001-01-01T00:00:00Z", "x", None])}),
            max_size=3),
        "quarantined_at": st.sampled_from(["2026-08-21T09:00:30Z", None, "0001-01-01T00:00:00Z", 3])}),
    max_size=4)})


def _check(events):
    for event in events:
        assert event["kind"] in KINDS and isinstance(event["reason"], str) and event["reason"]
        json.dumps(event)  # every event crosses into the rule engine as JSON


@property_settings(40)
@given(content=st.one_of(st.binary(max_size=300), store_like.map(lambda v: json.dumps(v).encode()),
                         json_values.map(lambda v: json.dumps(v).encode())))
def test_any_store_content_gives_events_never_an_exception(content):
    import tempfile
    plugin = SOURCE
    with tempfile.TemporaryDirectory() as root:
        host = FakeHost(root)
        settings = plugin.parse_args({"hosts": [{"name": "h", "store_path": host.store, "sysfs_root": host.sysfs}],
                                      "debounce": 0, "fire_existing": True})
        host.write_bytes(content)
        with hang_detector(20, "observe_host"):
            seen = plugin.observe_host(settings["hosts"][0], settings, {})
        _check(plugin.decide(seen, {}, 1.0, 0, True))
        parsed = plugin._store.parse_store_bytes(host.store, content)
        # The source says "unavailable" exactly when the collection's own reader (hypeman's rules) refuses it.
        assert ("store_unavailable" in seen.conditions) == (not parsed.valid)


@pytest.mark.parametrize("how", ["fifo", "dir", "dangling"])
def test_hostile_store_paths_are_an_unavailable_store_not_a_hang(plugin, host, tmp_path, how):
    replace_with(host.store, how)
    events = run(plugin, store_args(tmp_path, host), [nothing])
    assert [e["kind"] for e in events] == ["store_unavailable"]


@property_settings(15)
@given(answer=json_values, metrics=st.text(max_size=200))
def test_any_api_and_metrics_answer_gives_events_never_an_exception(answer, metrics):
    plugin = SOURCE
    routes = {"/resources": (200, answer if not isinstance(answer, str) else json.dumps(answer)),
              "/metrics": (200, metrics)}
    with ApiStub(routes) as stub:
        settings = plugin.parse_args({"hosts": [{"name": "h", "api_url": stub.url,
                                                 "metrics_url": stub.url + "/metrics"}], "timeout": 5})
        state = {}
        for _poll in range(2):
            with hang_detector(30, "observe_host"):
                seen = plugin.observe_host(settings["hosts"][0], settings, state)
            _check(plugin.decide(seen, state, 1.0, 0, True))
    json.dumps(state)


@property_settings(40)
@given(content=st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                         st.builds(lambda hosts: json.dumps({"version": 1, "hosts": hosts}).encode(),
                                   st.dictionaries(st.text(max_size=5), json_values, max_size=3))))
def test_any_cursor_content_is_used_or_refused_never_an_exception(content):
    import tempfile
    plugin = SOURCE
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "cursor.json")
        replace_with(path, "file", content)
        hosts, problem, dropped = plugin.load_state(path)
        # Refused whole (no hosts), or each host's entry used or dropped, named.
        assert (problem is not None) == (hosts is None or bool(dropped))
        if hosts is not None:  # a usable cursor: a poll with it works
            json.dumps(hosts, allow_nan=False)  # what is kept can be written back
            for name, state in hosts.items():
                seen = plugin.Observation(name)
                _check(plugin.decide(seen, state, 1.0, 0, False))


@property_settings(60)
@given(args=st.dictionaries(st.sampled_from(["hosts", "interval", "debounce", "timeout", "threshold", "max_polls",
                                             "fire_existing", "state_path"]), json_values, max_size=5))
def test_any_arguments_are_accepted_or_named(args):
    plugin = SOURCE
    try:
        plugin.parse_args(args)
    except plugin.SourceArgumentError as err:
        assert str(err).startswith("vf_quarantine: ")


# --- the API's high-water mark and non-finite metrics (red-team repros) ---------------------------------


def _slot_events(plugin, tmp_path, counts, **extra):
    """The quarantined_slots of the vf_quarantined events for /resources answering ``counts`` poll by poll."""
    routes = {"/resources": (200, _resources(counts[0]))}

    def answer(count):
        def step():
            routes["/resources"] = (200, _resources(count))
        return step

    with ApiStub(routes) as stub:
        args = api_args(tmp_path, stub, **extra)
        args["hosts"][0].pop("metrics_url")
        events = run(plugin, args, [answer(count) for count in counts], clock_step=30)
    assert set(e["kind"] for e in events) <= {"vf_quarantined"}, events
    return [e["evidence"]["quarantined_slots"] for e in events]


def test_quarantined_slots_fire_once_per_rise_and_never_for_a_fall(plugin, tmp_path):
    # 0 -> 2 -> 2 -> 3 -> 2: two rises; the fall back to 2 is no new quarantine.
    assert _slot_events(plugin, tmp_path / "a", [0, 2, 2, 3, 2]) == [2, 3]
    # A fall below a fired rise: the mark follows it, a later rise fires.
    assert _slot_events(plugin, tmp_path / "b", [0, 2, 1, 1, 2]) == [2, 2]
    # Debounced: the rise fires once it has lasted 60 s (the mark holds meanwhile); a flap fires nothing.
    assert _slot_events(plugin, tmp_path / "c", [0, 2, 2, 2, 2], debounce=60) == [2]
    assert _slot_events(plugin, tmp_path / "d", [0, 2, 0, 0], debounce=60) == []
    # Counted at the first read: a baseline, unless fire_existing.
    assert _slot_events(plugin, tmp_path / "e", [3, 3, 4]) == [4]
    assert _slot_events(plugin, tmp_path / "f", [3, 3, 4], fire_existing=True) == [3, 4]


@property_settings(15)
@given(counts=st.lists(st.integers(0, 4), min_size=2, max_size=6))
def test_quarantined_slots_events_are_exactly_the_rises_property(counts):
    """Any sequence of counts (no debounce): one event per rise from one poll to the next, none else."""
    plugin = SOURCE
    expected = [new for old, new in zip(counts, counts[1:]) if new > old]
    routes = {"/resources": (200, _resources(counts[0]))}
    with ApiStub(routes) as stub:
        settings = plugin.parse_args({"hosts": [{"name": "h", "api_url": stub.url}], "timeout": 5, "debounce": 0})
        state, found = {}, []
        for count in counts:
            routes["/resources"] = (200, _resources(count))
            with hang_detector(30, "observe_host"):
                seen = plugin.observe_host(settings["hosts"][0], settings, state)
            found.extend(e["evidence"]["quarantined_slots"] for e in plugin.decide(seen, state, 1.0, 0, False))
    assert found == expected


def _strict_json(data):
    def refuse(constant):
        raise ValueError("%s in the cursor" % constant)
    return json.loads(data, parse_constant=refuse)


@pytest.mark.parametrize("field, value", [("uptime_seconds", float("inf")), ("checks", {"ok": float("-inf")}),
                                          ("quarantines", float("nan")), ("taken_at", float("inf"))])
def test_a_non_finite_metric_is_an_error_of_its_host_and_the_cursor_survives(plugin, tmp_path, monkeypatch, field,
                                                                             value):
    """A sample with a number that is not finite, whatever _metrics lets through: a source_error of that
    host, its previous sample kept, a cursor every reader takes, and a restart fires nothing again."""
    host = FakeHost(str(tmp_path / "h"))
    host.write(QUARANTINED)
    routes = {"/metrics": (200, _metrics_text({"ok": 10}))}
    real_read, poisoned = plugin._metrics.read_sentinel_metrics, {"on": False}

    def read(url, timeout=10):
        answer = real_read(url, timeout)
        if poisoned["on"]:
            answer["sample"][field] = value
        return answer

    monkeypatch.setattr(plugin._metrics, "read_sentinel_metrics", read)
    state_path = tmp_path / "cursor.json"
    with ApiStub(routes) as stub:
        args = {"hosts": [{"name": "gpu-07", "store_path": host.store, "sysfs_root": host.sysfs},
                          {"name": "gpu-08", "metrics_url": stub.url + "/metrics"}],
                "state_path": str(state_path), "debounce": 0, "timeout": 5, "fire_existing": True}
        first = run(plugin, args, [nothing, lambda: poisoned.update(on=True)])
        kept = _strict_json(state_path.read_text())["hosts"]["gpu-08"]["metrics"]
        second = run(plugin, dict(args, fire_existing=False), [nothing])  # a restart, nothing changed
    assert [(e["kind"], e["host"]) for e in first] == [("vf_quarantined", "gpu-07"), ("source_error", "gpu-08")]
    assert "has %s" % field in first[1]["reason"] and "expected finite numbers" in first[1]["reason"]
    assert kept["uptime_seconds"] == 100.0 and kept["checks"] == {"ok": 10.0}  # the sample before the bad one
    assert second == []


@pytest.mark.parametrize("value", ["+Inf", "-Inf"])
def test_an_infinite_metric_from_hypeman_leaves_a_cursor_that_restarts_clean(plugin, tmp_path, value):
    """The red-team repro end to end: hypeman_uptime_seconds +Inf (legal Prometheus text) on one host."""
    host = FakeHost(str(tmp_path / "h"))
    host.write(QUARANTINED)
    text = _metrics_text({"ok": 10}).replace('otel_scope_version=""} 100.0', 'otel_scope_version=""} %s' % value)
    assert value in text
    with ApiStub({"/metrics": (200, text)}) as stub:
        args = {"hosts": [{"name": "gpu-07", "store_path": host.store, "sysfs_root": host.sysfs},
                          {"name": "gpu-08", "metrics_url": stub.url + "/metrics"}],
                "state_path": str(tmp_path / "cursor.json"), "debounce": 0, "timeout": 5, "fire_existing": True}
        first = run(plugin, args, [nothing])
        _strict_json((tmp_path / "cursor.json").read_text())
        second = run(plugin, dict(args, fire_existing=False), [nothing])
    assert sorted((e["kind"], e["host"]) for e in first) == [("source_error", "gpu-08"), ("vf_quarantined", "gpu-07")]
    assert "inf" in first[0]["reason"].lower() or "inf" in first[1]["reason"].lower()
    assert second == []


def test_an_unusable_cursor_entry_costs_only_its_host(plugin, tmp_path):
    """A cursor an older version wrote (Infinity in one host's sample): that host starts afresh and
    fires again, the other host's quarantine does not."""
    store_host = FakeHost(str(tmp_path / "h"))
    store_host.write(QUARANTINED)
    other = FakeHost(str(tmp_path / "h2"))
    other.write(QUARANTINED)
    args = {"hosts": [{"name": "gpu-07", "store_path": store_host.store, "sysfs_root": store_host.sysfs},
                      {"name": "gpu-09", "store_path": other.store, "sysfs_root": other.sysfs}],
            "state_path": str(tmp_path / "cursor.json"), "debounce": 0, "fire_existing": True}
    assert len(run(plugin, args, [nothing])) == 2
    cursor = json.loads((tmp_path / "cursor.json").read_text())
    cursor["hosts"]["gpu-09"]["metrics"] = {"taken_at": float("inf")}
    (tmp_path / "cursor.json").write_text(json.dumps(cursor))  # writes Infinity, as the old cursor did
    events = run(plugin, dict(args, fire_existing=False), [nothing, nothing])
    assert [(e["kind"], e["host"], e["source"]) for e in events] == [
        ("source_error", "gpu-09", "state"), ("vf_quarantined", "gpu-09", "store")]
    assert "unusable entry for host gpu-09 (metrics is not a sentinel sample" in events[0]["reason"]
    # The rewritten cursor is valid JSON again and a further restart fires nothing.
    _strict_json((tmp_path / "cursor.json").read_text())
    assert run(plugin, dict(args, fire_existing=False), [nothing]) == []


def test_a_cursor_entry_that_cannot_be_written_back_is_dropped(plugin, tmp_path):
    path = tmp_path / "cursor.json"
    path.write_text('{"version": 1, "hosts": {"a": {"fired": {"k": 1.0}}, "b": {"fired": {"k": Infinity}}, '
                    '"c": {"extra": NaN}, "d": {"pending": {"k": %d}}}}' % 10 ** 400)
    hosts, problem, dropped = plugin.load_state(str(path))
    assert list(hosts) == ["a"] and sorted(dropped) == ["b", "c", "d"]
    assert "unusable entry for host(s) b (fired is not a table" in problem
    assert dropped["c"] == "it holds a number that is not finite"
