# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``vgpu-sim`` / ``python3 -m tests.sim``: drive a simulated hypeman vGPU host.

Every command takes ``--root`` (default ``$VGPU_SIM_ROOT`` or
``/srv/vgpu-sim``) and prints JSON on stdout; refusals exit 1 with the reason
on stderr. See ``docs/testing.md`` for the commands and the hypeman facts
each one reproduces.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

from . import api as api_mod
from . import metrics as sim_metrics
from . import sentinel as sim_sentinel
from . import daemons, host
from .host import SimError, SimHost

PRESETS = {
    # Two L40S cards (64 VFs), three running instances across both hypeman
    # builds, one wedged VF with an instance that failed init on it.
    "two-card": {
        "cards": [{"model": "L40S", "address": "0000:82:00.0"},
                  {"model": "L40S", "address": "0000:e3:00.0"}],
        "config": {"threshold": 2},
        # A hand-made quarantine (a drain, GPU.md's form) and one failure recorded for an
        # earlier assignment on the VF that is wedged now.
        "store": {"records": [
            {"vf_address": "0000:82:00.7", "quarantined_at": "2026-08-22T00:00:00Z"},
            {"vf_address": "0000:e3:00.5", "failures": [
                {"instance_id": "inst-old-e", "assigned_at": "2026-08-20T15:00:00.123456789Z",
                 "reported_at": "2026-08-20T15:00:42.5Z"}]}]},
        "wedged": ["0000:e3:00.5"],
        "boots": [
            {"id": "inst-ml-a", "vf": "0000:82:00.4", "profile": "NVIDIA L40S-2Q", "build": "claimed"},
            {"id": "inst-ml-b", "vf": "0000:82:00.5", "profile": "NVIDIA L40S-2Q", "build": "assigned"},
            {"id": "inst-web-c", "vf": "0000:e3:00.4", "profile": "NVIDIA L40S-4Q", "build": "claimed"},
            {"id": "inst-wedged-d", "vf": "0000:e3:00.5", "profile": "NVIDIA L40S-4Q", "build": "claimed"},
        ],
    },
    "empty": {"cards": [{"model": "L40S", "address": "0000:82:00.0"}], "config": {}},
}


def _emit(data):
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return 0


def _load_layout(args):
    if args.layout:
        text = args.layout
        if text.startswith("@"):
            with open(text[1:]) as handle:
                text = handle.read()
        try:
            return json.loads(text)
        except ValueError as err:
            raise SimError("layout is not valid JSON: %s" % err)
    if args.preset not in PRESETS:
        raise SimError("unknown preset %r; known: %s" % (args.preset, ", ".join(sorted(PRESETS))))
    return json.loads(json.dumps(PRESETS[args.preset]))


def cmd_build(args):
    sim = SimHost(args.root).build(_load_layout(args), force=args.force)
    with sim.open(write=False):
        return _emit(sim.status())


def cmd_status(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        return _emit(sim.status())


def cmd_paths(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        return _emit(sim.paths())


def cmd_boot(args):
    sim = SimHost(args.root)
    with sim.open():
        try:
            return _emit(sim.boot(args.instance, args.vf, profile=args.profile, build=args.build,
                                  name=args.name, force=args.force))
        except ValueError as err:
            raise SimError(str(err))


def cmd_stop(args):
    sim = SimHost(args.root)
    with sim.open():
        return _emit(sim.stop(args.instance, keep_claim=args.keep_claim))


def cmd_wedge(args, wedged=True):
    sim = SimHost(args.root)
    with sim.open():
        vfs = [sim.wedge(vf, wedged) for vf in args.vf]
        return _emit({"changed": vfs, "wedged": sim.state["wedged"]})


def cmd_rotate(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        return _emit({"rotated": sim.rotate(args.instance)})


def cmd_forge(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        return _emit({"forged": sim.forge(args.instance, args.kind)})


def cmd_fault(args):
    sim = SimHost(args.root)
    if args.action == "set":
        value = True if args.value is None else _scalar(args.value)
        sim.set_fault(args.name, value)
    elif args.action == "clear":
        sim.clear_faults(args.name)
    return _emit({"faults": sim.faults(), "known": host.FAULTS})


def _scalar(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_sriov_manage(args):
    """Mimics ``/usr/lib/nvidia/sriov-manage -d|-e <pf>``: plain text, exit codes."""
    sim = SimHost(args.root)
    if args.delayed_enable is not None:
        time.sleep(float(args.delayed_enable))
        with sim.open():
            sim.sriov_enable(args.pf, delayed=True)
        return 0
    try:
        with sim.open():
            if args.disable:
                vfs = sim.sriov_disable(args.pf)
                print("Disabled %d VFs on %s" % (len(vfs), args.pf))
            else:
                vfs = sim.sriov_enable(args.pf)
                print("Enabling VFs on %s" % args.pf)
    except SimError as err:
        sys.stderr.write("%s\n" % err)
        return 1
    return 0


def cmd_hold(args):
    sim = SimHost(args.root)
    with sim.open():
        unknown = [pf for pf in args.pf if pf not in sim.tree.cards]
        if unknown:
            raise SimError("no such GPU: %s" % ", ".join(unknown))
        paths = [os.path.join(sim.tree.dev_root, "nvidia%d" % sim.tree.cards[pf].minor) for pf in args.pf]
        ready = os.path.join(sim.meta_dir, "hold-%d.ready" % time.time_ns())
        pid = host.spawn_daemon(["_hold", "--name", args.name, "--ready", ready] + paths,
                                sim.root, os.devnull, wait_for=ready)
        sim.register_spawned(pid, "hold", cards=args.pf, name=args.name)
        return _emit({"pid": pid, "holds": paths})


def cmd_expose_driver(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        return _emit({"changed": sim.expose_driver()})


def cmd_teardown(args):
    sim = SimHost(args.root)
    return _emit({"stopped": sim.teardown(remove=args.remove)})


def cmd_api(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        paths = sim.paths()
        era = args.era or sim.era  # the host's era unless told
    daemons.set_process_name("hypeman-api")
    server_api = api_mod.HypemanAPI(paths["config_path"], sysfs_root=paths["sysfs_root"],
                                    proc_root="/proc", data_dir=paths["data_dir"],
                                    vfio_term_grace=args.vfio_term_grace)
    server_api.launcher = host.ApiLauncher(sim.root, era=era)
    info_path = os.path.join(sim.meta_dir, "api.json")
    metrics_server = None
    if era == "vsock" or args.metrics_port is not None:
        # Current hypeman: /metrics always served; the vsock sentinel polls guests and records itself.
        counters = sim_metrics.SentinelCounters()
        metrics_server = api_mod.serve_metrics(server_api, counters, listen="127.0.0.1",
                                               port=9464 if args.metrics_port is None else args.metrics_port,
                                               vsock=era == "vsock")
        if era == "vsock":
            sim_sentinel.VsockSentinel(server_api, counters, interval=args.sentinel_interval).start()

    def ready(server):
        port = server.server_address[1]
        with open(info_path + ".tmp", "w") as handle:
            json.dump({"pid": os.getpid(), "port": port, "listen": args.listen, "era": era,
                       "metrics_port": metrics_server.server_address[1] if metrics_server else None}, handle)
        os.rename(info_path + ".tmp", info_path)
        reason = server_api.store.unavailable_reason()
        print("hypeman-api (vgpu-sim): listening on %s:%d; VF health store %s" % (
            args.listen, port, "unavailable: " + reason if reason else "loaded (%d records)" % len(server_api.store.records)),
            flush=True)

    import signal

    def stop(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        api_mod.serve(server_api, listen=args.listen, port=args.port, ready=ready)
    except KeyboardInterrupt:
        pass
    return 0


def api_url(sim):
    with open(os.path.join(sim.meta_dir, "api.json")) as handle:
        info = json.load(handle)
    host_part = "127.0.0.1" if info["listen"] in ("0.0.0.0", "") else info["listen"]
    return "http://%s:%d" % (host_part, info["port"])


def token_for(sim):
    with sim.open(write=False):
        conf = api_mod.read_config(sim.tree.config_path)
    return api_mod.mint_token(conf["jwt_secret"], user_id="vgpu-sim")


def cmd_token(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        conf = api_mod.read_config(sim.tree.config_path)
    sys.stdout.write(api_mod.mint_token(conf["jwt_secret"], user_id=args.user_id, duration=args.duration) + "\n")
    return 0


def cmd_api_report(args):
    """Make the running stand-in record a sentinel verdict from its in-memory store."""
    sim = SimHost(args.root)
    body = json.dumps({"vf_address": args.vf, "instance_id": args.instance, "assigned_at": args.assigned_at})
    req = urllib.request.Request("%s/_sim/vf-health/%s" % (api_url(sim), args.kind), data=body.encode(),
                                 headers={"Authorization": "Bearer %s" % token_for(sim),
                                          "Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return _emit(json.loads(resp.read()))
    except urllib.error.HTTPError as err:
        raise SimError("hypeman-api refused: %s" % err.read().decode(errors="replace"))


def _api_post(sim, path, body=None, timeout=60):
    req = urllib.request.Request(api_url(sim) + path, data=json.dumps(body or {}).encode(),
                                 headers={"Authorization": "Bearer %s" % token_for(sim),
                                          "Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raise SimError("hypeman-api refused: %s" % err.read().decode(errors="replace"))
    except (OSError, ValueError) as err:
        raise SimError("hypeman-api at %s: %s" % (api_url(sim), err))


def cmd_hard_kill(args):
    """hypeman hard-kills an instance's QEMU that ignores SIGTERM (its WARN line goes to hypeman's journal)."""
    sim = SimHost(args.root)
    with sim.open():
        return _emit(sim.hard_kill(args.instance,
                                   lambda instance: _api_post(sim, "/_sim/instances/%s/terminate" % instance)))


def cmd_oom_kill(args):
    sim = SimHost(args.root)
    with sim.open():
        return _emit(sim.oom_kill(args.instance))


def cmd_agent(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        idir = os.path.join(sim.tree.data_dir, "guests", args.instance)
        if not os.path.isdir(idir):
            raise SimError("no instance %s" % args.instance)
        sim_sentinel.write_agent_state(idir, None if args.state == "none" else args.state)
    return _emit({"instance": args.instance, "agent": args.state})


def cmd_dcgm(args):
    sim = SimHost(args.root)
    with sim.open(write=False):
        dev_root = sim.tree.dev_root
    return daemons.run_dcgm(dev_root, name=args.name)


def cmd_vmm(args):
    return daemons.run_vmm(args.instance, args.socket, args.nodes)


def cmd_hold_child(args):
    return daemons.run_hold(args.nodes, name=args.name, ready_path=args.ready)


def build_parser():
    parser = argparse.ArgumentParser(prog="vgpu-sim", description="Simulated hypeman vGPU host (test equipment).")
    parser.add_argument("--root", default=None, help="simulated host root (default $VGPU_SIM_ROOT or %s)"
                        % host.DEFAULT_ROOT)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build a new simulated host")
    p.add_argument("--preset", default="two-card", help="named layout: %s" % ", ".join(sorted(PRESETS)))
    p.add_argument("--layout", help="layout JSON (hosttree keys plus boots, wedged) or @FILE")
    p.add_argument("--force", action="store_true", help="tear down and replace an existing host")
    p.set_defaults(func=cmd_build)

    for name, func, help_text in (("status", cmd_status, "what the host looks like now"),
                                  ("paths", cmd_paths, "host paths for the collection's modules")):
        sub.add_parser(name, help=help_text).set_defaults(func=func)

    p = sub.add_parser("boot", help="create/start an instance on a VF with a running VMM stand-in")
    p.add_argument("instance")
    p.add_argument("--vf", required=True, help="VF address or <pf>@<index>")
    p.add_argument("--profile", help="vGPU profile name (default: the model's first type)")
    p.add_argument("--build", choices=("claimed", "assigned"), default="claimed",
                   help="hypeman build: GPUClaimedAt or GPUAssignedAt metadata")
    p.add_argument("--name")
    p.add_argument("--force", action="store_true", help="boot even on a quarantined VF")
    p.set_defaults(func=cmd_boot)

    p = sub.add_parser("stop", help="stop an instance (VMM exits, vGPU released)")
    p.add_argument("instance")
    p.add_argument("--keep-claim", action="store_true", help="leave the claim in metadata (failed release)")
    p.set_defaults(func=cmd_stop)

    for name, wedged in (("wedge", True), ("unwedge", False)):
        p = sub.add_parser(name, help="%s VFs (later boots on a wedged VF fail GPU init)" % name)
        p.add_argument("vf", nargs="+")
        p.set_defaults(func=lambda a, w=wedged: cmd_wedge(a, w))

    p = sub.add_parser("rotate", help="copytruncate an instance's app.log to app.log.1")
    p.add_argument("instance")
    p.set_defaults(func=cmd_rotate)

    p = sub.add_parser("forge", help="append marker-shaped lines hypeman's patterns reject")
    p.add_argument("instance")
    p.add_argument("--kind", action="append", help="forged line kind (default: all)")
    p.set_defaults(func=cmd_forge)

    p = sub.add_parser("fault", help="show, set or clear fault switches")
    p.add_argument("action", choices=("show", "set", "clear"))
    p.add_argument("name", nargs="?")
    p.add_argument("value", nargs="?")
    p.set_defaults(func=cmd_fault)

    p = sub.add_parser("sriov-manage", help="the simulated /usr/lib/nvidia/sriov-manage")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("-d", dest="disable", action="store_true", help="disable SR-IOV (remove the VFs)")
    mode.add_argument("-e", dest="enable", action="store_true", help="enable SR-IOV (create the VFs)")
    mode.add_argument("--delayed-enable", metavar="SECONDS", help=argparse.SUPPRESS)
    p.add_argument("pf")
    p.set_defaults(func=cmd_sriov_manage)

    p = sub.add_parser("hold", help="start a stray process holding cards' dev/nvidia* nodes")
    p.add_argument("pf", nargs="+")
    p.add_argument("--name", default="nvidia-smi")
    p.set_defaults(func=cmd_hold)

    sub.add_parser("expose-driver", help="bind-mount the tree's proc/driver over /proc/driver (containers)"
                   ).set_defaults(func=cmd_expose_driver)

    p = sub.add_parser("teardown", help="stop every process the simulator started")
    p.add_argument("--remove", action="store_true", help="also delete the root")
    p.set_defaults(func=cmd_teardown)

    p = sub.add_parser("api", help="run the hypeman-api stand-in in the foreground")
    p.add_argument("--listen", default="0.0.0.0")
    p.add_argument("--port", type=int, help="default: port from the config (hypeman's default 8080)")
    p.add_argument("--era", choices=host.ERAS, default=None,
                   help="vsock: current hypeman (guests print no markers, its sentinel polls and records itself); "
                        "default: the host's era (layout key era)")
    p.add_argument("--vfio-term-grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL of a VFIO instance's hypervisor (hypeman: 5)")
    p.add_argument("--metrics-port", type=int, help="serve /metrics on 127.0.0.1 (vsock era: default 9464)")
    p.add_argument("--sentinel-interval", type=float, default=5.0, help="vsock sentinel poll interval, seconds")
    p.set_defaults(func=cmd_api)

    p = sub.add_parser("api-report", help="make the running stand-in report a sentinel verdict")
    p.add_argument("kind", choices=("failure", "success"))
    p.add_argument("--vf", required=True)
    p.add_argument("--instance", default="")
    p.add_argument("--assigned-at", default="")
    p.set_defaults(func=cmd_api_report)

    p = sub.add_parser("hard-kill", help="hypeman stops an instance whose QEMU ignores SIGTERM: hard kill, "
                       "'device may wedge' in hypeman's log, claim released (needs the running api)")
    p.add_argument("instance")
    p.set_defaults(func=cmd_hard_kill)

    p = sub.add_parser("oom-kill", help="the OOM killer kills an instance's QEMU (kernel lines in var/log/kern.log)")
    p.add_argument("instance")
    p.set_defaults(func=cmd_oom_kill)

    p = sub.add_parser("agent", help="set what an instance's guest agent answers over vsock (vsock era)")
    p.add_argument("instance")
    p.add_argument("--state", required=True, choices=sim_sentinel.AGENT_ANSWERS + ("none",))
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("token", help="mint a bearer token for the stand-in (like hypeman-token)")
    p.add_argument("--user-id", default="vgpu-sim")
    p.add_argument("--duration", type=int, default=8760 * 3600, help="seconds")
    p.set_defaults(func=cmd_token)

    p = sub.add_parser("dcgm", help="run a DCGM stand-in in the foreground")
    p.add_argument("--name", default="nv-hostengine")
    p.set_defaults(func=cmd_dcgm)

    p = sub.add_parser("vmm", help=argparse.SUPPRESS)
    p.add_argument("--instance", required=True)
    p.add_argument("--socket", required=True)
    p.add_argument("nodes", nargs="+")
    p.set_defaults(func=cmd_vmm)

    p = sub.add_parser("_hold", help=argparse.SUPPRESS)
    p.add_argument("--name", default="nvidia-smi")
    p.add_argument("--ready")
    p.add_argument("nodes", nargs="+")
    p.set_defaults(func=cmd_hold_child)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SimError as err:
        sys.stderr.write("vgpu-sim: %s\n" % err)
        return 1
