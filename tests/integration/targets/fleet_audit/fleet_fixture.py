# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A simulated fleet for the fleet audit tests, ``recover_gpu_breaker`` and ``bench/fleet.py`` (test equipment).

Each host is its own tree built with ``tests/sim/hosttree.py`` (two A100 cards,
16 VFs each, two running instances on the first card) plus one problem class,
and is reached with the local connection. ``build`` writes the trees, an
inventory and the issue codes each host must get; ``checksum`` prints every
file, link and directory under the trees (setup_tree_fingerprint's
``entries``), to prove the audit changed nothing.

    python fleet_fixture.py build --dir DIR --hosts ok,legacy,sentinel,...
    python fleet_fixture.py build --dir DIR --count 200 --mix
    python fleet_fixture.py checksum --dir DIR
    python fleet_fixture.py root
    python fleet_fixture.py serve --dir DIR --host NAME --port-file FILE   (current hypeman: vsock sentinel, /metrics)
    python fleet_fixture.py agent --dir DIR --host NAME --instance ID --state ok|failed|unsupported|none
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _find_collection_root():
    # The collection under test (with tests/sim) is on ANSIBLE_COLLECTIONS_PATH when
    # ansible-test copied this target away; in the repository it is three levels up.
    for base in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(":"):
        candidate = os.path.join(base, "ansible_collections", "hypeman", "vgpu")
        if base and os.path.isdir(os.path.join(candidate, "tests", "sim")):
            return candidate
    return os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))


sys.path.insert(0, _find_collection_root())

from tests.sim import guestlog  # noqa: E402  pylint: disable=wrong-import-position
from tests.sim import api as sim_api  # noqa: E402  pylint: disable=wrong-import-position
from tests.sim import metrics as sim_metrics  # noqa: E402  pylint: disable=wrong-import-position
from tests.sim import sentinel as sim_sentinel  # noqa: E402  pylint: disable=wrong-import-position
from tests.sim.hosttree import DEFAULT_CLAIMED_AT, HostTree  # noqa: E402  pylint: disable=wrong-import-position

# The one tree fingerprint of the integration tests, beside this target.
sys.path.insert(0, os.path.join(HERE, "..", "setup_tree_fingerprint", "files"))
import tree_fingerprint  # noqa: E402  pylint: disable=wrong-import-position,import-error

CARD_A = "0000:82:00.0"
CARD_B = "0000:83:00.0"
QUARANTINED_AT = "2026-08-22T00:00:00Z"
MARKER_NS = 1788177630000000000  # 2026-08-31T12:00:30Z, after the instances' claim time
STALE_VF = "0000:99:00.4"


def _failure(instance_id, assigned_at="2026-08-20T15:00:00Z", reported_at="2026-08-20T15:00:42.5Z"):
    return {"instance_id": instance_id, "assigned_at": assigned_at, "reported_at": reported_at}


def _sentinel_instance(tree, vf, verdict="failed"):
    tree.add_instance("inst-wedged", vf=vf, profile="NVIDIA A100-4C")
    log = os.path.join(tree.data_dir, "guests", "inst-wedged", "logs", "app.log")
    guestlog.append(log, guestlog.noise(20, seed=3) + guestlog.report(verdict, MARKER_NS))


# Each problem: (what to do to a base host, issue codes the audit must report).
def _ok(tree, a, b):
    return []


def _legacy(tree, a, b):
    tree.write_store(raw=[{"vf_address": a.vfs[5], "wedge_count": 1, "quarantined_at": QUARANTINED_AT}])
    return ["store_unavailable"]


def _invalid(tree, a, b):
    tree.write_store([{"vf_address": a.vfs[5], "quarantined_at": QUARANTINED_AT}], version=2)
    return ["store_unavailable"]


def _drained(tree, a, b):
    tree.write_store([{"vf_address": vf, "quarantined_at": QUARANTINED_AT} for vf in b.vfs])
    return ["card_ready_for_cycle", "quarantined_vfs"]


def _draining(tree, a, b):
    tree.write_store([{"vf_address": vf, "quarantined_at": QUARANTINED_AT} for vf in a.vfs])
    return ["card_draining", "quarantined_vfs"]


def _overflow(tree, a, b):
    tree.write_store([{"vf_address": vf, "quarantined_at": QUARANTINED_AT} for vf in b.vfs[:2]])
    return ["card_overflow_only", "quarantined_vfs"]


def _sentinel(tree, a, b):
    # One earlier failure on the VF: reporting the new verdict would quarantine it.
    tree.write_store([{"vf_address": b.vfs[3], "failures": [_failure("inst-old")]}])
    _sentinel_instance(tree, b.vfs[3])
    return ["sentinel_unreported", "below_threshold"]


def _pending(tree, a, b):
    tree.write_store([{"vf_address": b.vfs[4], "failures": [_failure("inst-1"), _failure("inst-2")]}])
    return ["pending_quarantine", "card_overflow_only"]


def _stale(tree, a, b):
    tree.write_store([{"vf_address": STALE_VF, "quarantined_at": QUARANTINED_AT}])
    return ["stale_records", "quarantined_vfs"]


def _below(tree, a, b):
    tree.write_store([{"vf_address": b.vfs[6], "failures": [_failure("inst-1")]}])
    return ["below_threshold"]


def _metadata(tree, a, b):
    tree.add_instance("inst-broken", vf=b.vfs[7], profile="NVIDIA A100-4C", liveness="stopped")
    with open(os.path.join(tree.data_dir, "guests", "inst-broken", "metadata.json"), "w") as handle:
        handle.write("{not json")
    return ["unreadable_metadata"]


def _novfs(tree, a, b):
    # SR-IOV left without VFs (an interrupted cycle): the card gives no slots.
    tree.remove_vfs(b.address)
    return ["card_without_vfs"]


def _config(tree, a, b):
    tree.write_config(raw="gpu:\n  vf_quarantine_threshold: zero  # a typo hypeman would refuse\n")
    return ["audit_incomplete"]


def _wrongpaths(tree, a, b):
    # The inventory's sysfs root and data dir point where nothing is (a typo in host_vars).
    tree.inventory_paths = {"hypeman_vgpu_sysfs_root": os.path.join(tree.root, "sys-typo"),
                            "hypeman_vgpu_data_dir": os.path.join(tree.root, "var", "lib", "hypeman-typo")}
    return ["host_not_vgpu"]


def _wedge(tree, a, b):
    # hypeman hard-killed one VM's QEMU after an ignored SIGTERM; the OOM killer killed another's.
    now = time.time_ns()
    tree.add_instance("inst-oom", vf=b.vfs[1], profile="NVIDIA A100-4C", liveness="crashed")
    tree.log_vf_may_wedge("inst-a", now - 600 * 10 ** 9)
    tree.log_oom_kill(tree.instances["inst-oom"]["pid"], now - 300 * 10 ** 9)
    return ["vf_at_risk"]


def _hypeman(tree, a, b):
    # A running hypeman (no unit in the inventory: a store edit must refuse rather than race it).
    tree.add_process(comm="hypeman-api", cmdline=["/opt/hypeman/bin/hypeman-api"])
    return []


def _vsock(tree, a, b):
    # Current hypeman: guests print no markers, its own sentinel polls their agents (serve) and records.
    for instance_id in ("inst-a", "inst-b"):
        guestlog.append(os.path.join(tree.data_dir, "guests", instance_id, "logs", "app.log"),
                        guestlog.noise(5, seed=1) + guestlog.vsock_ok_line(MARKER_NS))
        sim_sentinel.write_agent_state(os.path.join(tree.data_dir, "guests", instance_id), "ok")
    tree.add_instance("inst-wedged", vf=b.vfs[3], profile="NVIDIA A100-4C")
    guestlog.append(os.path.join(tree.data_dir, "guests", "inst-wedged", "logs", "app.log"),
                    guestlog.vsock_failed_line(MARKER_NS))
    sim_sentinel.write_agent_state(os.path.join(tree.data_dir, "guests", "inst-wedged"), "failed")
    return []


PROBLEMS = {
    "ok": _ok, "legacy": _legacy, "invalid": _invalid, "drained": _drained, "draining": _draining,
    "overflow": _overflow, "sentinel": _sentinel, "pending": _pending, "stale": _stale, "below": _below,
    "metadata": _metadata, "config": _config, "novfs": _novfs, "hypeman": _hypeman, "wrongpaths": _wrongpaths,
    "wedge": _wedge, "vsock": _vsock,
}
# The benchmark's mix: mostly healthy hosts, some quarantines, some findings.
MIX = ("ok", "ok", "overflow", "ok", "sentinel", "ok", "below", "drained", "ok", "pending")


def build_host(root, problem):
    """Build one host tree under ``root`` with ``problem``; returns (tree, expected issue codes)."""
    tree = HostTree(root)
    card_a = tree.add_card("A100", CARD_A)
    card_b = tree.add_card("A100", CARD_B)
    tree.write_config(threshold=2)
    # The journal stand-ins, read instead of the journal (an hour-old boot).
    tree.write_host_logs(boot_unix_s=int(time.time()) - 3600)
    tree.add_instance("inst-a", vf=card_a.vfs[0], profile="NVIDIA A100-4C", claimed_at=DEFAULT_CLAIMED_AT)
    tree.add_instance("inst-b", vf=card_a.vfs[1], profile="NVIDIA A100-4C", build="assigned")
    return tree, PROBLEMS[problem](tree, card_a, card_b)


def host_vars(tree, python):
    host = {"ansible_connection": "local", "ansible_python_interpreter": python,
            "hypeman_vgpu_data_dir": tree.data_dir, "hypeman_vgpu_sysfs_root": tree.sysfs_root,
            "hypeman_vgpu_proc_root": tree.proc_root, "hypeman_vgpu_dev_root": tree.dev_root,
            "hypeman_vgpu_state_dir": tree.state_dir, "hypeman_vgpu_config_path": tree.config_path,
            "hypeman_vgpu_hypeman_log_path": tree.hypeman_log_path, "hypeman_vgpu_kernel_log_path": tree.kernel_log_path}
    host.update(getattr(tree, "inventory_paths", {}))
    return host


def build_fleet(directory, problems, unreachable=0, python=None):
    """Trees under ``<directory>/hosts/<name>``, ``inventory.json`` and ``expected.json``; returns expected."""
    python = python or sys.executable
    hosts, expected = {}, {}
    for index, problem in enumerate(problems):
        name = "%s-%03d" % (problem, index)
        tree, codes = build_host(os.path.join(directory, "hosts", name), problem)
        hosts[name] = host_vars(tree, python)
        expected[name] = codes
    for index in range(unreachable):
        name = "unreachable-%03d" % index
        # Nothing listens on port 1 of the loopback: the connection is refused at once.
        hosts[name] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
        expected[name] = ["unreachable"]
    inventory = {"all": {"hosts": hosts, "vars": {
        # The trees have no hypeman process and no systemd unit, and need no privilege.
        "hypeman_vgpu_become": False, "hypeman_vgpu_service": "", "fleet_reconcile_hypeman_expected": False}}}
    with open(os.path.join(directory, "inventory.json"), "w") as handle:
        json.dump(inventory, handle, indent=2, sort_keys=True)
    with open(os.path.join(directory, "expected.json"), "w") as handle:
        json.dump(expected, handle, indent=2, sort_keys=True)
    return expected


def serve_host(root, port_file, interval):
    """hypeman's sentinel loop and /metrics for the tree at ``root`` until SIGTERM; the port goes to ``port_file``."""
    import signal
    import time
    # HostTree's layout, without constructing one (that would rewrite parts of the tree).
    api = sim_api.HypemanAPI(os.path.join(root, "etc", "hypeman", "config.yaml"), sysfs_root=os.path.join(root, "sys"),
                             proc_root=os.path.join(root, "proc"), data_dir=os.path.join(root, "var", "lib", "hypeman"))
    counters = sim_metrics.SentinelCounters()
    sentinel = sim_sentinel.VsockSentinel(api, counters, interval=interval)
    sentinel.poll_once()  # the first poll before anyone reads the metrics
    server = sim_api.serve_metrics(api, counters, port=0)
    sentinel.start()
    with open(port_file + ".tmp", "w") as handle:
        handle.write("%d\n" % server.server_address[1])
    os.rename(port_file + ".tmp", port_file)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_args: stop.append(True))
    while not stop:
        time.sleep(0.1)
    server.shutdown()
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build")
    build.add_argument("--dir", required=True)
    build.add_argument("--hosts", help="comma-separated problem classes, one host each")
    build.add_argument("--count", type=int, help="number of hosts from the benchmark mix")
    build.add_argument("--unreachable", type=int, default=0)
    check = sub.add_parser("checksum")
    check.add_argument("--dir", required=True)
    sub.add_parser("root", help="print the root of the collection under test")
    serve = sub.add_parser("serve", help="run current hypeman's sentinel and /metrics for one host tree")
    serve.add_argument("--dir", required=True)
    serve.add_argument("--host", required=True)
    serve.add_argument("--port-file", required=True)
    serve.add_argument("--interval", type=float, default=0.2)
    agent = sub.add_parser("agent", help="set what a simulated guest agent answers over vsock")
    agent.add_argument("--dir", required=True)
    agent.add_argument("--host", required=True)
    agent.add_argument("--instance", required=True)
    agent.add_argument("--state", required=True, choices=sim_sentinel.AGENT_ANSWERS + ("none",))
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve_host(os.path.join(args.dir, "hosts", args.host), args.port_file, args.interval)
    if args.command == "agent":
        sim_sentinel.write_agent_state(os.path.join(args.dir, "hosts", args.host, "var", "lib", "hypeman", "guests",
                                                    args.instance), None if args.state == "none" else args.state)
        return 0
    if args.command == "root":
        print(_find_collection_root())
        return 0
    if args.command == "build":
        if args.hosts:
            problems = args.hosts.split(",")
        else:
            problems = [MIX[i % len(MIX)] for i in range(args.count or 0)]
        unknown = [p for p in problems if p not in PROBLEMS]
        if unknown:
            parser.error("unknown problem(s) %s; known: %s" % (", ".join(unknown), ", ".join(sorted(PROBLEMS))))
        os.makedirs(args.dir, exist_ok=True)
        json.dump(build_fleet(args.dir, problems, args.unreachable), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        json.dump(tree_fingerprint.entries(os.path.join(args.dir, "hosts")), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
