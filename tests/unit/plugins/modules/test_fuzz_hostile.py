# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Property-based fuzzing of every module with hostile arguments and hostile host files.

(a) Arguments: for each of the 8 modules, values drawn from its own argument
    spec -- typical ones, values of the wrong type, NUL bytes, relative
    paths, huge strings and lists, lone surrogates, nesting thousands of
    levels deep, wrong enum values, unknown options.
(b) Host files: a small host tree (``tests/sim/hosttree.py``) in which one
    file of one area (config, instance metadata, a sysfs attribute or device
    link, a /proc entry, an API answer, the store, the ledger, a sentinel
    cursor, a guest log) is replaced by a hostile kind (FIFO, dangling
    symlink, symlink to /dev/zero, symlink out of its root, directory,
    garbage, non-UTF-8, deep JSON, JSON of the wrong types, empty, over the
    size cap) before a random module runs on it (in check mode).

Every run must end in a clean JSON result -- success, or a failure whose
message is not the last-resort ``internal error`` -- with no traceback, and
within :data:`HANG_SECONDS` (a SIGALRM timer is the hang detector). Placement
results must also fail closed: unreadable metadata leaves no card idle and no
candidate, an unusable store leaves no VF allocatable.

Example counts come from a hypothesis profile: ``hostile-quick`` (default,
derandomized, a few seconds per test) or ``fuzz`` (``HYPOTHESIS_PROFILE=fuzz``,
``make fuzz``: many random examples).
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import traceback
import uuid
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ansible.module_utils import basic
from ansible.module_utils.common import warnings as ansible_warnings

from ansible_collections.hypeman.vgpu.plugins.module_utils import _fileio, _hypeman, _sysfs
from ansible_collections.hypeman.vgpu.plugins.modules import (
    gpu_holders_info, gpu_sriov, host_audit_info, path_access_info, run_marker, vf_health, vf_health_info,
    vgpu_instance_info, vgpu_placement_info, vgpu_sentinel_scan)
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.api_stub import ApiStub, closed_port_url
from ansible_collections.hypeman.vgpu.tests.unit.hostile import Hang, hang_detector
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import argument_spec

HANG_SECONDS = 20
MEMORY_HEADROOM = 1024 * 1024 * 1024  # per module run, over what the test process already maps
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)  # no shrinking: a hang would cost HANG_SECONDS per step
settings.register_profile("hostile-quick", max_examples=12, deadline=None, derandomize=True, database=None,
                          phases=_PHASES, suppress_health_check=list(HealthCheck))
settings.register_profile("fuzz", max_examples=400, deadline=None, database=None, phases=_PHASES,
                          suppress_health_check=list(HealthCheck))
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or "hostile-quick"
if PROFILE == "fuzz":
    settings.load_profile("fuzz")
SETTINGS = settings(settings.get_profile(PROFILE) if PROFILE in ("fuzz", "hostile-quick") else
                    settings.get_profile("hostile-quick"))

MODULES = {
    "vf_health": vf_health.main, "vf_health_info": vf_health_info.main,
    "vgpu_placement_info": vgpu_placement_info.main, "vgpu_instance_info": vgpu_instance_info.main,
    "gpu_holders_info": gpu_holders_info.main, "vgpu_sentinel_scan": vgpu_sentinel_scan.main,
    "gpu_sriov": gpu_sriov.main, "host_audit_info": host_audit_info.main, "run_marker": run_marker.main,
    "path_access_info": path_access_info.main,
}
CARD = "0000:82:00.0"
PROFILE_NAME = "NVIDIA L40S-2Q"
CLAIMED_AT = "2026-08-31T12:00:00.123456789Z"


# --- running a module -------------------------------------------------------------------------


class Deep(object):
    """An argument value nested ``depth`` levels deep, written into the JSON by hand."""

    def __init__(self, depth, opener):
        self.depth, self.opener = depth, opener

    def json(self):
        if self.opener == "[":
            return "[" * self.depth + "]" * self.depth
        return '{"a": ' * self.depth + "1" + "}" * self.depth

    def __repr__(self):
        return "Deep(%d, %r)" % (self.depth, self.opener)


def _encode(args):
    """The module-arguments JSON, with :class:`Deep` values spliced in (no encoder nests that deep)."""
    deep = {}

    def placeholder(value):
        if isinstance(value, Deep):
            key = "deep-%s" % uuid.uuid4().hex
            deep[key] = value
            return key
        if isinstance(value, list):
            return [placeholder(item) for item in value]
        if isinstance(value, dict):
            return dict((k, placeholder(v)) for k, v in value.items())
        return value

    text = json.dumps({"ANSIBLE_MODULE_ARGS": placeholder(args)})
    for key, value in deep.items():
        text = text.replace('"%s"' % key, value.json())
    return text.encode("utf-8", "surrogatepass")


def _address_space():
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def run_module(name, args):
    """Run module ``name`` in this process on ``args``; return its result dict.

    Fails the test on a traceback (any exception out of main(), or
    "Traceback" on stderr), a hang, no JSON on stdout, or a module that
    returns without exit_json/fail_json. Memory is capped for the run: a
    reader that slurps an endless file gets a MemoryError (a failure here)
    instead of taking the machine's memory.
    """
    ansible_warnings._global_warnings.clear()
    out, err = io.StringIO(), io.StringIO()
    limits = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + MEMORY_HEADROOM
    if limits[1] == resource.RLIM_INFINITY or cap < limits[1]:
        resource.setrlimit(resource.RLIMIT_AS, (cap, limits[1]))
    try:
        with hang_detector(HANG_SECONDS, "the module"), mock.patch.object(basic, "_ANSIBLE_ARGS", _encode(args)), \
                mock.patch.object(basic, "_ANSIBLE_PROFILE", "legacy"), redirect_stdout(out), redirect_stderr(err):
            with pytest.raises(SystemExit):
                MODULES[name]()
    except Hang:
        # Reported as a failure (with where it hung), not as an interrupt hypothesis would let through.
        raise AssertionError("%s hung:\n%s" % (name, traceback.format_exc()))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)
    assert "Traceback" not in err.getvalue(), err.getvalue()
    result = json.loads(out.getvalue())
    assert isinstance(result, dict)
    if result.get("failed"):
        assert isinstance(result.get("msg"), str) and result["msg"], result
        # The last-resort guard is a safety net: every hostile class needs its own message.
        assert not result["msg"].startswith("internal error"), result["msg"]
    return result


def check_placement_fails_closed(result):
    """Unknown is never reported as safe (placement results only)."""
    if result.get("failed") or "slots" not in result:
        return
    if result["unreadable_metadata"]:
        assert not any(gpu["idle"] for gpu in result["gpus"]), result["gpus"]
        if result["candidates"] is not None:
            assert result["candidates"]["gpu"] is None, result["candidates"]
    if not result["store"]["valid"] and result["framework"] == "vendor-vfio":
        assert result["slots"]["allocatable"] == 0 and not any(vf["allocatable"] for vf in result["vfs"])


# --- the host tree ------------------------------------------------------------------------------


class Host(object):
    """A small host: one L40S card with 4 VFs, a running instance with a guest log, a quarantine
    with its ledger entry, sentinel cursors, a config, and an API stub (answers set per example)."""

    def __init__(self, root):
        self.root = str(root)
        self.tree = tree = HostTree(os.path.join(self.root, "host"))
        self.stash = os.path.join(self.root, "stash")
        os.makedirs(self.stash)
        card = tree.add_card("L40S", CARD, numvfs=4)
        self.vfs = list(card.vfs)
        tree.add_instance("vm", vf=self.vfs[0], profile=PROFILE_NAME, claimed_at=CLAIMED_AT)
        log = os.path.join(tree.data_dir, "guests", "vm", "logs", "app.log")
        with open(log, "w") as handle:
            handle.write(guestlog.report("failed", 1788177601 * 10 ** 9))
        tree.write_config(threshold=2)
        tree.write_store([])
        with open(os.path.join(tree.proc_root, "cmdline"), "w") as handle:
            handle.write("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt\n")
        self.api = ApiStub({"/resources": (200, {}), "/instances": (200, [])})
        self.api.__enter__()
        self.paths = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "proc_root": tree.proc_root,
                      "dev_root": tree.dev_root, "state_dir": tree.state_dir, "config_path": tree.config_path}
        quarantine = run_module("vf_health", dict(self.paths, state="quarantined", vf_addresses=[self.vfs[3]],
                                                  reason="fuzz base"))
        assert quarantine.get("changed") is True, quarantine
        scan = run_module("vgpu_sentinel_scan", dict(self.paths))
        assert "failed" not in scan, scan
        self.pid = tree.instances["vm"]["proc_pid"]
        missing = [p for paths in _targets(self).values() for p in paths if not os.path.lexists(p)]
        assert not missing, missing

    def close(self):
        self.api.__exit__(None, None, None)

    def module_args(self, name, draw_state):
        """Arguments that make module ``name`` read everything it can (always in check mode)."""
        args = dict(self.paths, _ansible_check_mode=True)
        if name == "vf_health":
            state = draw_state(["failed", "succeeded", "quarantined", "absent", "repaired"])
            args.update(state=state)
            if state != "repaired":
                args["vf_addresses"] = [self.vfs[1]]
            if state in ("failed", "succeeded"):
                args.update(instance_id="vm", assigned_at=CLAIMED_AT)
        elif name == "gpu_sriov":
            args.update(pci_address=CARD, state=draw_state(["enabled", "disabled", "cycled"]), timeout=0,
                        sriov_manage="/bin/true")
        elif name in ("gpu_holders_info", "vgpu_instance_info"):
            args["parent_gpu"] = CARD
        elif name == "vgpu_placement_info":
            args["profile"] = PROFILE_NAME
        elif name == "host_audit_info":
            args["prerequisites"] = True
        elif name == "vgpu_sentinel_scan":
            args["record"] = draw_state([True, False])
        elif name == "run_marker":
            args.update(name="recovery/%s.json" % CARD, state=draw_state(["present", "absent", "read"]))
            if args["state"] == "present":
                args["content"] = {"gpu": CARD, "step": "drained"}
        if name in ("vgpu_placement_info", "vgpu_instance_info", "host_audit_info"):
            args.update(api_url=self.api.url, api_timeout=5)
        if name == "path_access_info":
            # Not in the host-path action group: it takes only the paths it looks at.
            args = dict(_ansible_check_mode=True, paths=[
                dict(path=path, type=draw_state(["any", "file", "directory"]), follow=draw_state([True, False]),
                     access=["read", "write", "execute"]) for paths in _targets(self).values() for path in paths])
        return args


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    built = Host(tmp_path_factory.mktemp("fuzz-host"))
    yield built
    built.close()


# --- (a) hostile module arguments -------------------------------------------------------------


def _typical(name, spec, host):
    """A value a user could mean for option ``name`` (so that a run reads the host)."""
    kind, choices = spec.get("type", "str"), spec.get("choices")
    if choices:
        return st.sampled_from(choices)
    if kind == "path":
        # Only paths inside the test's own directory: a run must never touch the machine's files.
        missing = os.path.join(host.root, "missing")
        return st.sampled_from([host.paths.get(name, os.path.join(missing, name)), missing])
    if kind == "bool":
        return st.booleans()
    if kind == "int":
        return st.integers(-2, 5)
    if kind == "float":
        return st.floats(0.01, 0.2) if name in ("timeout", "delay") else st.floats(0.1, 3)
    if kind == "list" and spec.get("elements") == "dict":  # path_access_info's paths: hostile values inside too
        def either(typical):
            return st.one_of(typical, typical, HOSTILE_VALUES)
        return st.lists(st.fixed_dictionaries(
            {"path": either(st.sampled_from(sorted(set(host.paths.values()))))},
            optional={"type": either(st.sampled_from(["any", "file", "directory"])), "follow": either(st.booleans()),
                      "access": either(st.lists(st.sampled_from(["read", "write", "execute"]), max_size=3))}),
            max_size=4)
    if kind == "list":
        element = "path" if spec.get("elements") == "path" else "str"
        return st.lists(_typical(name, {"type": element}, host), max_size=3)
    if name == "api_url":
        return st.sampled_from([host.api.url, closed_port_url()])
    return st.sampled_from([CARD, host.vfs[1], "vm", PROFILE_NAME, CLAIMED_AT, "x"])


_TEXT = st.text(max_size=40)
HOSTILE_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10 ** 30),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT.filter(lambda t: not t.lower().startswith(("http:", "https:"))),  # never a real host to resolve
    _TEXT.map(lambda t: "/var/lib/\x00" + t),
    st.sampled_from(["relative/dir", ".", "..", "", " ", "~", "$HOME", "http://", "ftp://x", "http://h\r\nX: y",
                     "http://127.0.0.1:1/\x00", "/" + "n" * 256, "0000:82:00.0\x00", "82:00.0", "-1"]),
    st.integers(4097, 100000).map(lambda n: "/" + "x" * n),
    st.integers(1000, 200000).map(lambda n: "a" * n),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.lists(_TEXT, max_size=5), st.lists(st.integers(), max_size=3),
    st.integers(1000, 50000).map(lambda n: ["/x"] * n),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.builds(Deep, st.sampled_from([30, 300, 900, 3000, 100000]), st.sampled_from(["[", "{"])),
)


# Modules that write unless in check mode: a drawn absolute path ("/x") must never be written to.
WRITERS = ("vf_health", "gpu_sriov", "vgpu_sentinel_scan", "run_marker")


@st.composite
def hostile_arguments(draw, name, host):
    spec = argument_spec(MODULES[name])
    args = {"_ansible_check_mode": True if name in WRITERS else draw(st.booleans())}
    for option in sorted(spec):
        required = spec[option].get("required")
        how = draw(st.sampled_from(["typical", "typical", "hostile", "omit"] if not required else
                                   ["typical", "typical", "hostile"]))
        if how == "typical":
            args[option] = draw(_typical(option, spec[option], host))
        elif how == "hostile":
            args[option] = draw(HOSTILE_VALUES)
    if draw(st.integers(0, 9)) == 0:
        args["not_an_option"] = draw(HOSTILE_VALUES)
    return args


@pytest.mark.parametrize("name", sorted(MODULES))
def test_hostile_arguments_end_cleanly(name, host):
    @SETTINGS
    @given(args=hostile_arguments(name, host))
    def check(args):
        result = run_module(name, args)
        if name == "vgpu_placement_info":
            check_placement_fails_closed(result)

    check()


# --- (b) hostile host files -------------------------------------------------------------------


def _targets(host):
    """Area -> the files (and links) of that area a module reads."""
    tree = host.tree
    proc = os.path.join(tree.proc_root, str(host.pid))
    vf = host.vfs[1]
    return {
        "config": [tree.config_path],
        "metadata": [os.path.join(tree.data_dir, "guests", "vm", "metadata.json"),
                     os.path.join(tree.data_dir, "guests", "vm")],
        "sysfs": [tree.pci_path(vf, "nvidia", "current_vgpu_type"), tree.pci_path(vf, "nvidia", "creatable_vgpu_types"),
                  tree.pci_path(CARD, "sriov_numvfs"), tree.pci_path(CARD, "sriov_totalvfs"),
                  tree.pci_path(CARD, "vendor"), tree.pci_path(CARD, "sriov_offset"), tree.pci_path(vf),
                  tree.pci_path(vf, "physfn"), tree.pci_path(vf, "iommu_group")],
        "proc": [os.path.join(proc, "stat"), os.path.join(proc, "status"), os.path.join(proc, "comm"),
                 os.path.join(proc, "cmdline"), os.path.join(proc, "cgroup"), os.path.join(proc, "fd", "3"),
                 os.path.join(tree.proc_root, "net", "unix"),
                 os.path.join(tree.proc_root, "sys", "kernel", "random", "boot_id"),
                 os.path.join(tree.proc_root, "driver", "nvidia", "gpus", CARD, "information"),
                 os.path.join(tree.proc_root, "cmdline")],
        "store": [tree.store_path],
        "ledger": [os.path.join(tree.state_dir, "ledger.jsonl")],
        "cursor": [os.path.join(tree.state_dir, "sentinel", "vm.json")],
        "guest_log": [os.path.join(tree.data_dir, "guests", "vm", "logs", "app.log")],
    }


# Over every cap this collection sets (sysfs, config and metadata 1 MiB; /proc, store and API 16 MiB).
LARGE = max(_fileio.DEFAULT_LIMIT, _sysfs.ATTRIBUTE_LIMIT, _hypeman.CONFIG_LIMIT) + 1
KINDS = ("fifo", "dangling", "devzero", "outside", "dir", "garbage", "non_utf8", "deep_json", "wrong_json",
         "empty", "large")
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                           max_leaves=8)


def _wrong_json(original, draw):
    """The original JSON with one value (or the whole document) of another type."""
    try:
        doc = json.loads(original.decode("utf-8"))
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(doc)))
        doc[key] = draw(JSON_VALUES)
        return json.dumps(doc).encode()
    if isinstance(doc, list) and doc and draw(st.booleans()):
        doc[draw(st.integers(0, len(doc) - 1))] = draw(JSON_VALUES)
        return json.dumps(doc).encode()
    return json.dumps(draw(JSON_VALUES)).encode()


def _payload(kind, original, draw):
    """The bytes of a hostile regular file of ``kind`` (None for kinds that are no regular file)."""
    if kind == "garbage":
        return draw(st.binary(max_size=300))
    if kind == "non_utf8":
        cut = draw(st.integers(0, len(original)))
        return original[:cut] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"])) + original[cut:]
    if kind == "deep_json":
        depth = draw(st.sampled_from([40, 1000, 100000]))
        return draw(st.sampled_from([b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth,
                                     b"[" * depth]))
    if kind == "wrong_json":
        return _wrong_json(original, draw)
    if kind == "empty":
        return b""
    return None


class Swap(object):
    """Replace ``path`` by a hostile ``kind`` for the duration of a ``with`` block; restore it after.

    Everything is drawn before the tree is touched: a draw that stops the
    example must never leave the tree half-swapped for the next one.
    """

    def __init__(self, host, path, kind, draw):
        self.path, self.kind = path, kind
        self.saved = os.path.join(host.stash, uuid.uuid4().hex)
        original = b""
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as handle:
                original = handle.read()
        self.payload = _payload(kind, original, draw)

    def __enter__(self):
        path, kind = self.path, self.kind
        os.rename(path, self.saved)  # the original leaves the tree: no listing sees it
        try:
            if kind == "fifo":
                os.mkfifo(path)
            elif kind == "dangling":
                os.symlink(path + ".nowhere", path)
            elif kind == "devzero":
                os.symlink("/dev/zero", path)
            elif kind == "outside":
                os.symlink(self.saved, path)  # the original, reached through a link out of the tree
            elif kind == "dir":
                os.mkdir(path)
            else:
                with open(path, "wb") as handle:
                    if kind == "large":
                        handle.truncate(LARGE)  # sparse: over every cap without writing it
                    else:
                        handle.write(self.payload)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            shutil.rmtree(self.path)
        elif os.path.lexists(self.path):
            os.unlink(self.path)
        os.rename(self.saved, self.path)


HOSTILE_ANSWERS = st.one_of(
    JSON_VALUES.map(json.dumps),
    st.builds(lambda d: "[" * d + "]" * d, st.sampled_from([40, 1000, 100000])),
    st.sampled_from(["", "not json", '{"gpu": {"mode": "vgpu", "profiles": 7}}',
                     '{"gpu": {"profiles": [{"name": ["x"]}], "total_slots": {}}}',
                     '{"gpu": {"mode": "vgpu", "profiles": [{"name": "NVIDIA L40S-2Q", "available": "x"}]}}',
                     '[{"id": ["x"], "gpu": 1}, {"id": "vm", "gpu": {"profile": {}, "device_path": 7}}]',
                     '{"instances": [1, null, {"id": "vm"}]}']),
)

AREAS = ("config", "metadata", "sysfs", "proc", "api", "store", "ledger", "cursor", "guest_log")


@pytest.mark.parametrize("area", AREAS)
def test_hostile_host_files_end_cleanly(area, host):
    targets = _targets(host).get(area)

    @SETTINGS
    @given(data=st.data())
    def check(data):
        name = data.draw(st.sampled_from(sorted(MODULES)), label="module")
        args = host.module_args(name, lambda options: data.draw(st.sampled_from(options), label="state"))
        if area == "api":
            host.api.routes["/resources"] = (200, data.draw(HOSTILE_ANSWERS, label="/resources"))
            host.api.routes["/instances"] = (200, data.draw(HOSTILE_ANSWERS, label="/instances"))
            result = run_module(name, args)
        else:
            path = data.draw(st.sampled_from(targets), label="file")
            kind = data.draw(st.sampled_from(KINDS), label="kind")
            with Swap(host, path, kind, data.draw):
                result = run_module(name, args)
        if name == "vgpu_placement_info":
            check_placement_fails_closed(result)

    try:
        check()
    finally:
        host.api.routes.update({"/resources": (200, {}), "/instances": (200, [])})
