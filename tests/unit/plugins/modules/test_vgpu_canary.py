# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_canary against the simulator's hypeman API in-process (real VMM stand-ins), and hostile API answers."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _canary
from ansible_collections.hypeman.vgpu.plugins.modules import vgpu_canary
from ansible_collections.hypeman.vgpu.tests.sim import api as simapi
from ansible_collections.hypeman.vgpu.tests.sim.host import ApiLauncher, SimHost
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector, property_settings
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module

PF_A, PF_B = "0000:82:00.0", "0000:e3:00.0"
PROFILE = "NVIDIA L40S-1Q"
IMAGE = "registry.example.com/gpu/canary:cuda12"


def _layout(*cards):
    return {"cards": [{"model": "L40S", "address": pf, "numvfs": 4} for pf in cards], "config": {"threshold": 2}}


class Running(object):
    """A simulated host with its hypeman API served from this process."""

    def __init__(self, root, layout, era="markers"):
        self.host = SimHost(str(root)).build(layout)
        with self.host.open(write=False):
            self.paths = self.host.paths()
        self.api = simapi.HypemanAPI(self.paths["config_path"], sysfs_root=self.paths["sysfs_root"],
                                     proc_root="/proc", data_dir=self.paths["data_dir"])
        self.api.launcher = ApiLauncher(self.host.root, era=era)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), simapi.make_handler(self.api))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.token = simapi.mint_token(simapi.read_config(self.paths["config_path"])["jwt_secret"])

    def params(self, **extra):
        params = {"data_dir": self.paths["data_dir"], "sysfs_root": self.paths["sysfs_root"], "proc_root": "/proc",
                  "dev_root": self.paths["dev_root"], "state_dir": self.paths["state_dir"],
                  "config_path": self.paths["config_path"], "api_url": self.url, "api_token": self.token,
                  "gpu": PF_A, "image": IMAGE, "profile": PROFILE, "timeout": 30, "poll_interval": 1}
        params.update(extra)
        return params

    def guests(self):
        return sorted(os.listdir(os.path.join(self.paths["data_dir"], "guests")))

    def create(self, name, profile=PROFILE):
        return self.api.create_instance({"name": name, "image": IMAGE, "gpu": {"profile": profile},
                                         "tags": {_canary.TAG_KEY: PF_A}})

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.host.teardown()


@pytest.fixture
def running(tmp_path):
    started = []

    def start(layout=None, era="markers"):
        started.append(Running(tmp_path / ("host%d" % len(started)), layout or _layout(PF_A), era))
        return started[-1]

    yield start
    for item in started:
        item.close()


def _run(params, capsys, check=False):
    if check:
        params = dict(params, _ansible_check_mode=True)
    with hang_detector(120, "vgpu_canary"):
        return run_module(vgpu_canary.main, params, capsys)


@pytest.mark.parametrize("era", ["markers", "vsock"])
def test_healthy_card_passes_and_the_canary_is_deleted(running, capsys, era):
    sim = running(era=era)
    result = _run(sim.params(), capsys)
    assert not result.get("failed"), result
    assert result["verdict"] == "passed" and result["sentinel_mode"] == era and result["changed"] is True
    canary = result["canary"]
    assert canary["gpu"] == PF_A and canary["deleted"] is True and canary["name"].startswith("vgpu-canary-0000-82-00-0-")
    assert canary["vf"] in result["placement"]["vfs"]
    expected = "HYPEMAN-GPU-INIT-OK ts=" if era == "markers" else "[guest-agent] GPU driver initialized"
    assert expected in result["evidence"]
    assert sim.guests() == [] and simapi.list_instances(sim.paths["data_dir"]) == []
    # The simulator's own record of the API's creates: this one canary, on that VF, deleted.
    with sim.host.open(write=False):
        boots = sim.host.status()["api_boots"]
    assert [(b["id"], b["name"], b["vf"], b["profile"], b["tags"], b["wedged_boot"]) for b in boots] == [
        (canary["id"], canary["name"], canary["vf"], PROFILE, {_canary.TAG_KEY: PF_A}, False)]
    assert boots[0]["deleted_at"] >= boots[0]["created_at"]


@pytest.mark.parametrize("era", ["markers", "vsock"])
def test_wedged_card_fails_with_evidence_and_the_canary_is_deleted(running, capsys, era):
    sim = running(era=era)
    with sim.host.open():
        for index in range(4):
            sim.host.wedge("%s@%d" % (PF_A, index))
    result = _run(sim.params(), capsys)
    assert not result.get("failed"), result
    assert result["verdict"] == "failed" and result["canary"]["deleted"] is True
    assert ("HYPEMAN-GPU-INIT-FAILED" in result["evidence"]) if era == "markers" else (
        "GPU init failure detected" in result["evidence"] or "hypeman recorded" in result["evidence"])
    assert "RmInitAdapter failed!" in result["evidence"] or "hypeman recorded" in result["evidence"]
    assert sim.guests() == []


def test_vsock_store_record_alone_is_a_failure(running, capsys, monkeypatch):
    # The console says nothing; hypeman's vsock sentinel recorded the canary's assignment failure.
    sim = running(era="vsock")
    monkeypatch.setattr(_canary, "console_verdict", lambda data, mode="auto": (None, None, None))
    original = ApiLauncher.boot

    def boot_and_report(self, instance_id, vf, profile, name, extra_meta):
        record = original(self, instance_id, vf, profile, name, extra_meta)
        sim.api.report("failure", {"vf_address": vf, "instance_id": instance_id, "assigned_at": record["claimed_at"]})
        return record

    monkeypatch.setattr(ApiLauncher, "boot", boot_and_report)
    result = _run(sim.params(), capsys)
    assert result["verdict"] == "failed" and result["sentinel_mode"] == "vsock"
    assert result["evidence"].startswith("hypeman recorded a GPU init failure of the canary's assignment on VF ")


def test_markers_mode_ignores_vsock_lines_and_times_out(running, capsys):
    sim = running(era="vsock")
    result = _run(sim.params(sentinel_mode="markers", timeout=2), capsys)
    assert result["verdict"] == "timeout" and result["canary"]["deleted"] is True and sim.guests() == []


def test_leftover_canaries_are_deleted_and_others_left_alone(running, capsys):
    sim = running()
    status, leftover = sim.create("vgpu-canary-0000-82-00-0-leftover")
    assert status == 201
    status, other = sim.create("ml-job")
    assert status == 201
    # A canary of another card, made a minute ago: a run on that card may be watching it.
    status, running_elsewhere = sim.api.create_instance({
        "name": _canary.canary_name("vgpu-canary", PF_B, time.time_ns() - 60 * 10 ** 9), "image": IMAGE,
        "gpu": {"profile": PROFILE}, "tags": {_canary.TAG_KEY: PF_B}})
    assert status == 201
    other = {"id": sorted([other["id"], running_elsewhere["id"]])}
    result = _run(sim.params(state="absent"), capsys, check=True)
    assert result["changed"] is True and [x["id"] for x in result["leftovers_deleted"]] == [leftover["id"]]
    assert sorted(sim.guests()) == sorted([leftover["id"]] + other["id"])  # check mode deleted nothing
    result = _run(sim.params(state="absent"), capsys)
    assert result["changed"] is True and [x["id"] for x in result["leftovers_deleted"]] == [leftover["id"]]
    assert sim.guests() == other["id"]
    again = _run(sim.params(state="absent"), capsys)
    assert again["changed"] is False and again["leftovers_deleted"] == []


def test_check_mode_predicts_and_creates_nothing(running, capsys):
    sim = running()
    result = _run(sim.params(), capsys, check=True)
    assert not result.get("failed"), result
    assert result["changed"] is True and result["verdict"] is None and result["canary"] is None
    assert result["placement"]["gpu"] == PF_A and len(result["placement"]["vfs"]) == 4
    assert sim.guests() == []


def test_refuses_when_placement_would_pick_another_card(running, capsys):
    # Both cards empty: hypeman ranks 0000:82 first (address), so a canary for e3 cannot be pinned.
    sim = running(_layout(PF_A, PF_B))
    result = _run(sim.params(gpu=PF_B), capsys)
    assert result["failed"] is True and result["canary"] is None
    assert "no canary was created" in result["msg"] and "would put profile 'NVIDIA L40S-1Q' on 0000:82:00.0" in result["msg"]
    assert sim.guests() == []


def test_misplaced_canary_is_deleted_and_fails(running, capsys, monkeypatch):
    # Placement changed between the what-if and the create: the canary landed on the other card.
    sim = running(_layout(PF_A, PF_B))
    monkeypatch.setattr(simapi, "choose_vf", lambda vfs, claims, quarantined, profile, rng=None: (
        sorted(vf["address"] for vf in vfs if vf["parent"] == PF_B)[0], None))
    result = _run(sim.params(), capsys)
    assert result["failed"] is True and "landed on VF 0000:e3:00." in result["msg"]
    assert result["canary"]["deleted"] is True and result["verdict"] is None
    assert sim.guests() == []


def test_refused_create_fails_cleanly(running, capsys):
    sim = running()
    result = _run(sim.params(profile="NVIDIA L40S-999Q"), capsys)
    assert result["failed"] is True and "no canary was created" in result["msg"]
    # hypeman itself refuses when our what-if is bypassed: the refusal is quoted.
    answer = sim.api.create_instance({"name": "x", "image": IMAGE, "gpu": {"profile": "NVIDIA L40S-999Q"}})
    assert answer[0] == 409 and "is not creatable on any VF" in answer[1]["message"]


NOW_NS = 1788177600123456789


@pytest.mark.parametrize("name, tags, leftover", [
    (_canary.canary_name("vgpu-canary", PF_A, NOW_NS - 10 ** 9), {_canary.TAG_KEY: PF_A}, True),
    (_canary.canary_name("vgpu-canary", PF_A, NOW_NS - 10 ** 9), None, True),  # hypeman without tags
    (_canary.canary_name("vgpu-canary", PF_A, NOW_NS - 10 ** 9), {_canary.TAG_KEY: PF_B}, False),
    (_canary.canary_name("vgpu-canary", PF_A, NOW_NS - 10 ** 9), {"other": "x"}, False),
    # another card's canary: a leftover only once older than any run lasts
    (_canary.canary_name("vgpu-canary", PF_B, NOW_NS - 3600 * 10 ** 9), {_canary.TAG_KEY: PF_B}, False),
    (_canary.canary_name("vgpu-canary", PF_B, NOW_NS - _canary.STALE_AFTER_NS - 1), {_canary.TAG_KEY: PF_B}, True),
    (_canary.canary_name("vgpu-canary", PF_B, NOW_NS - _canary.STALE_AFTER_NS - 1), {"other": "x"}, False),
    ("vgpu-canary-0000-e3-00-0-notbase36!", None, False),
    ("vgpu-canary-ml-job", None, False),
    ("vgpu-canaryx-0000-82-00-0-1", None, False),
    ("ml-job", {_canary.TAG_KEY: PF_A}, False),
])
def test_a_leftover_is_this_cards_canary_or_a_stale_one_of_any_card(name, tags, leftover):
    item = {"id": "x", "name": name}
    if tags is not None:
        item["tags"] = tags
    assert _canary.is_leftover(item, "vgpu-canary", PF_A, now_ns=NOW_NS) is leftover


@pytest.mark.parametrize("kind", ["fifo", "guest_dir_link", "metadata_link"])
def test_unreadable_landing_metadata_fails_promptly_and_deletes_the_canary(stub, tmp_path, capsys, kind):
    # hypeman's answer has no gpu.device_path, so the landing is read from the canary's metadata,
    # which is hostile: the run must neither wait on it nor read outside the data dir.
    tree = HostTree(str(tmp_path / "host"))
    tree.add_card("L40S", PF_A, numvfs=2)
    tree.write_config(threshold=2)
    guest = os.path.join(tree.data_dir, "guests", "canary1")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "metadata.json").write_text(json.dumps({"GPUDevicePath": "/sys/bus/pci/devices/%s" % PF_A}))

    def make_hostile():
        if kind == "guest_dir_link":
            os.symlink(str(outside), guest)
            return
        os.makedirs(guest)
        if kind == "fifo":
            os.mkfifo(os.path.join(guest, "metadata.json"))
        else:
            os.symlink(str(outside / "metadata.json"), os.path.join(guest, "metadata.json"))

    stub.answers = {("GET", "instances"): (200, b"[]"),
                    ("POST", "instances"): (201, json.dumps({"id": "canary1", "name": "vgpu-canary-x"}).encode()),
                    ("DELETE", "instance"): (204, b"")}
    stub.hooks = {("POST", "instances"): make_hostile}
    stub.calls = []
    params = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "proc_root": "/proc",
              "dev_root": tree.dev_root, "config_path": tree.config_path, "api_url": stub.url, "api_timeout": 5,
              "gpu": PF_A, "image": IMAGE, "profile": PROFILE, "timeout": 5, "poll_interval": 1}
    try:
        with hang_detector(30, "vgpu_canary landing"):
            result = run_module(vgpu_canary.main, params, capsys)
    finally:
        stub.hooks = {}
    assert result["failed"] is True and "cannot tell where canary canary1 landed" in result["msg"], result
    assert {"fifo": "FIFO", "guest_dir_link": "symlink", "metadata_link": "outside"}[kind] in result["msg"]
    assert result["canary"]["deleted"] is True and ("DELETE", "/instances/canary1") in stub.calls


@pytest.mark.parametrize("params, words", [
    ({"api_url": None}, "api_url is required"),
    ({"image": ""}, "image is empty"),
    ({"profile": None}, "profile is empty"),
    ({"profile": "NVIDIA\nL40S"}, "contains a control character"),
    ({"name_prefix": "Bad_Prefix"}, "name_prefix 'Bad_Prefix' is not usable"),
    ({"name_prefix": "x" * 37}, "is not usable; expected 1 to 36"),
    ({"timeout": 0}, "timeout 0 is out of range"),
    ({"poll_interval": 61}, "poll_interval 61 is out of range"),
    ({"gpu": "82:00"}, "gpu '82:00' is not a PCI address"),
])
def test_bad_options_fail_naming_the_value(tmp_path, capsys, params, words):
    tree = HostTree(tmp_path)
    tree.add_card("L40S", PF_A, numvfs=2)
    base = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "api_url": "http://127.0.0.1:9",
            "gpu": PF_A, "image": IMAGE, "profile": PROFILE}
    base.update(params)
    result = _run(base, capsys)
    assert result["failed"] is True and words in result["msg"], result["msg"]


# ------------------------------------------------------------------ hostile API answers
class _Stub(object):
    """A stub hypeman answering each route with a fixed (status, raw bytes)."""

    def __init__(self):
        self.answers, self.calls, self.hooks = {}, [], {}
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                stub.calls.append((self.command, self.path))
                key = (self.command, self.path.split("/")[1] if self.path.count("/") == 1 else "instance")
                if key in stub.hooks:
                    stub.hooks[key]()
                status, raw = stub.answers.get(key, (404, b'{"code": "not_found", "message": "x"}'))
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]


@pytest.fixture(scope="module")
def stub():
    server = _Stub()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(scope="module")
def stub_tree(tmp_path_factory):
    tree = HostTree(str(tmp_path_factory.mktemp("canary-tree")))
    tree.add_card("L40S", PF_A, numvfs=2)
    tree.write_config(threshold=2)
    return tree


def _json_values():
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["id", "name", "gpu", "device_path", "tags", "state", "instances", "x"]), inner,
        max_size=4), max_leaves=12)


def _answers():
    from hypothesis import strategies as st

    raw = st.one_of(_json_values().map(lambda v: json.dumps(v).encode()), st.binary(max_size=40),
                    st.just(b"[" * 5000), st.just(b""))
    return st.tuples(st.sampled_from([200, 201, 204, 400, 404, 409, 500]), raw)


def test_hostile_answers_never_crash_or_leave_a_traceback(stub, stub_tree, capsys):
    from hypothesis import given, strategies as st

    @property_settings(25)
    @given(listing=_answers(), create=_answers(), get=_answers(), delete=_answers(), absent=st.booleans())
    def check(listing, create, get, delete, absent):
        stub.answers = {("GET", "instances"): listing, ("POST", "instances"): create,
                        ("GET", "instance"): get, ("DELETE", "instance"): delete}
        params = {"data_dir": stub_tree.data_dir, "sysfs_root": stub_tree.sysfs_root, "proc_root": "/proc",
                  "dev_root": stub_tree.dev_root, "config_path": stub_tree.config_path, "api_url": stub.url,
                  "api_timeout": 5, "gpu": PF_A, "image": IMAGE, "profile": PROFILE, "timeout": 1,
                  "poll_interval": 1, "state": "absent" if absent else "verified"}
        result = _run(params, capsys)
        assert "internal error" not in result.get("msg", ""), result
        assert "exception" not in result
        if not result.get("failed"):
            # Only a real answer gets this far: a listing we could read and, for a canary, a verdict and a delete.
            assert absent or result["verdict"] in _canary.VERDICTS
            if result.get("canary"):
                assert result["canary"]["deleted"] is True

    check()


@pytest.mark.parametrize("data, mode, verdict", [
    (b"2026/08/20 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=2026-08-20T15:04:05Z\n", "auto", "passed"),
    (b"2026/08/20 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=2026-08-20T15:04:05Z trailing\n", "auto", None),
    (b"[guest-agent] HYPEMAN-GPU-INIT-OK ts=2026-08-20T15:04:05Z\n", "auto", None),
    (b"2026/08/20 15:04:05 [guest-agent] GPU driver initialized\r\n", "auto", "passed"),
    (b"2026/08/20 15:04:05 [guest-agent] GPU driver initialized\n", "markers", None),
    (b"2026/08/20 15:04:05 [guest-agent] GPU init failure detected: NVRM: x\n"
     b"2026/08/20 15:04:35 [guest-agent] GPU driver initialized\n", "vsock", "passed"),
    (b'2026/08/20 15:04:05 [guest-agent] HYPEMAN-GPU-INIT-OK ts=2026-08-20T15:04:05Z\n'
     b'2026/08/20 15:04:35 [guest-agent] HYPEMAN-GPU-INIT-FAILED ts=2026-08-20T15:04:35Z '
     b'nvrm="NVRM: GPU 0000:00:03.0: RmInitAdapter failed! (0x22:0x65:884)"\n', "markers", "failed"),
])
def test_console_verdict(data, mode, verdict):
    assert _canary.console_verdict(data, mode)[0] == verdict
