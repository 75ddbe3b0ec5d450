# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A simulated hypeman vGPU host that lives across commands (test equipment).

The tree itself (sysfs, dev nodes, metadata, config) is built by
:mod:`tests.sim.hosttree`; this module keeps that :class:`HostTree` in a state
file under the root so separate commands (``build``, ``boot``, ``stop``,
``sriov-manage``...) act on the same host, and adds what a running host has:
real processes (VMM stand-ins holding a VF's vfio nodes and listening on the
control socket, DCGM stand-ins holding the cards' ``dev/nvidia*`` nodes), the
guest console (``app.log``), wedged VFs and fault switches.

Layout under the root (default ``/srv/vgpu-sim``): the hosttree layout plus
``usr/lib/nvidia/sriov-manage`` and ``.vgpu-sim/`` (``state.json``,
``faults.json``, ``lock``). Processes are real, so the host's proc root is
the kernel's ``/proc``, not the tree's ``proc/`` (which only keeps the
driver's ``driver/nvidia/gpus/*/information`` files hosttree writes).

Facts reproduced (``docs/hypeman-interface.md``):

- boot (§3.2, §4.2, §5.1): hypeman renames the previous ``app.log`` to
  ``app.log.prev.<unix-ns>`` on every create/start, writes the claim into
  metadata (``GPUClaimedAt`` or ``GPUAssignedAt`` build, UTC RFC3339Nano),
  sets ``current_vgpu_type``, records ``HypervisorPID``, field 22 of
  ``/proc/<pid>/stat`` and the boot id; the guest agent prints each GPU
  report three times with the same ``ts`` (OK on a healthy VF, FAILED with
  the NVRM ``RmInitAdapter failed!`` line on a wedged one);
- claim refusal (§1.8): a quarantined VF is refused ("vendor VFIO vGPU on VF
  X is quarantined"), as is a VF another instance's metadata claims (§9);
- stop (§3.2, §9): the VMM exits, the vGPU is released (``current_vgpu_type``
  0, ``GPUDevicePath`` and the claim time cleared, ``GPUProfile`` kept);
  ``--keep-claim`` leaves the claim as a failed release does;
- wedge (§8): a VF wedged by a SIGKILL mid-init keeps failing init on later
  boots until its card's SR-IOV is cycled;
- eras (§5.3, docs/hypeman-versions.md): layout key ``era`` (``markers``, the
  default, or ``vsock``). In the vsock era a guest prints no markers, only the
  agent's ``GPU driver initialized`` / ``GPU init failure detected`` line, and
  its agent answers ``GetGPUInitStatus`` (``sentinel.AGENT_STATE_FILE``);
  ``vgpu-sim api`` then runs hypeman's vsock sentinel and ``/metrics``;
- wedge-risk triggers (§8.1): ``hard_kill`` makes a VMM ignore SIGTERM and
  has the running hypeman stand-in stop it (SIGTERM, ``VFIOTermGrace``,
  SIGKILL, its ``device may wedge`` WARN line on stdout, i.e. hypeman's
  journal), then releases the claim; ``oom_kill`` SIGKILLs a VMM as the OOM
  killer does and writes the kernel's two lines to the kern.log stand-in,
  leaving the metadata as hypeman has it until it notices;
- rotation (§4.1): copytruncate to ``app.log.1`` at any moment;
- ``sriov-manage`` (§8): ``-d`` fails with "Cannot obtain unbindLock" while
  any process holds the card's ``dev/nvidia<minor>`` node (DCGM), removes the
  VFs otherwise; ``-e`` recreates them; fault switches make it misbehave.

Not hypeman's: ``status`` lists under ``api_boots`` every instance the API
stand-in created (id, name, VF, profile, tags, whether it booted on a wedged
VF, created and deleted times), so a test can count boots that left no trace.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

from . import guestlog, hosttree
from . import sentinel as sim_sentinel

DEFAULT_ROOT = "/srv/vgpu-sim"
STATE_DIR = ".vgpu-sim"
ERAS = ("markers", "vsock")
FAULTS = {
    "enable_noop": "sriov-manage -e exits 0 without creating VFs",
    "enable_slow": "sriov-manage -e exits 0 at once; the VFs appear VALUE seconds later (default 5)",
    "enable_no_types": "sriov-manage -e creates VFs whose creatable_vgpu_types has only the header",
    "disable_fails": "sriov-manage -d fails (exit 1) without touching the card",
}
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SimError(Exception):
    """An expected refusal, printed without a traceback."""


def sim_root(root=None):
    return os.path.abspath(root or os.environ.get("VGPU_SIM_ROOT") or DEFAULT_ROOT)


def now_ns():
    return time.time_ns()


def real_boot_id():
    with open("/proc/sys/kernel/random/boot_id") as handle:
        return handle.read().strip()


def proc_start_time(pid):
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot)."""
    with open("/proc/%d/stat" % pid) as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[19])


def pid_alive(pid, start_time=None):
    if not pid:
        return False
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (IOError, OSError):
        return False
    if fields[0] == "Z":
        return False
    return start_time is None or int(fields[19]) == int(start_time)


def holders(paths):
    """``{pid: [paths]}`` of live processes that have any of ``paths`` open (real /proc)."""
    wanted = set(os.path.realpath(p) for p in paths)
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        fd_dir = "/proc/%s/fd" % name
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted:
                found.setdefault(int(name), []).append(target)
    return found


def process_name(pid):
    try:
        with open("/proc/%d/comm" % pid) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return "?"


# ----------------------------------------------------------- tree persistence
def _encode_tree(tree):
    data = {}
    for key, value in tree.__dict__.items():
        if key == "cards":
            value = {addr: dict(card.__dict__, model=card.model.name) for addr, card in value.items()}
        data[key] = value
    return data


def _decode_tree(data):
    tree = hosttree.HostTree.__new__(hosttree.HostTree)
    data = dict(data)
    cards = {}
    for addr, raw in data.pop("cards").items():
        card = hosttree.Card.__new__(hosttree.Card)
        card.__dict__.update(raw)
        card.model = hosttree.MODELS[raw["model"]]
        cards[addr] = card
    data["cards"] = cards
    data["processes"] = dict((int(k), v) for k, v in data.get("processes", {}).items())
    data["_sockets"] = [tuple(s) for s in data.get("_sockets", [])]
    tree.__dict__.update(data)
    return tree


class SimHost(object):
    """One simulated host under ``root``. Use :meth:`open` for a locked session."""

    def __init__(self, root=None):
        self.root = sim_root(root)
        self.meta_dir = os.path.join(self.root, STATE_DIR)
        self.state_path = os.path.join(self.meta_dir, "state.json")
        self.faults_path = os.path.join(self.meta_dir, "faults.json")
        self.sriov_manage = os.path.join(self.root, "usr", "lib", "nvidia", "sriov-manage")
        self.tree = None
        self.state = None
        self._depth = 0

    # ------------------------------------------------------------ sessions
    @contextlib.contextmanager
    def open(self, write=True):
        """Lock the host, load its state, save it back when ``write``."""
        if not os.path.isfile(self.state_path):
            raise SimError("no simulated host at %s (run: vgpu-sim build)" % self.root)
        if self._depth:  # nested: the outer session holds the lock and saves
            yield self
            return
        with open(os.path.join(self.meta_dir, "lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with open(self.state_path) as handle:
                self.state = json.load(handle)
            self.tree = _decode_tree(self.state["tree"])
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
            if write:
                self._save()

    def _save(self):
        self.state["tree"] = _encode_tree(self.tree)
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(self.state, handle, indent=1, sort_keys=True)
        os.rename(tmp, self.state_path)

    def paths(self):
        """Host paths to point the collection's modules at (module_defaults)."""
        tree = self.tree
        return {"root": self.root, "sysfs_root": tree.sysfs_root, "proc_root": "/proc",
                "dev_root": tree.dev_root, "data_dir": tree.data_dir, "state_dir": tree.state_dir,
                "config_path": tree.config_path, "store_path": tree.store_path,
                "sriov_manage": self.sriov_manage}

    # --------------------------------------------------------------- build
    def build(self, layout, force=False):
        """Build a new host from a hosttree layout plus ``boots`` and ``wedged``."""
        if os.path.exists(self.state_path):
            if not force:
                raise SimError("a simulated host already exists at %s (use --force to rebuild)" % self.root)
            self.teardown(remove=True)
        if os.path.isdir(self.root) and os.listdir(self.root):
            raise SimError("root %s is not empty" % self.root)
        layout = dict(layout)
        boots = layout.pop("boots", [])
        wedged = layout.pop("wedged", [])
        era = layout.pop("era", "markers")
        if era not in ERAS:
            raise SimError("layout era %r; expected one of %s" % (era, ", ".join(ERAS)))
        if "instances" in layout:
            raise SimError("layout key 'instances' makes static instances; use 'boots' for running ones")
        layout.setdefault("config", {})
        layout.setdefault("boot_id", real_boot_id())
        try:
            tree = hosttree.build_from_layout(self.root, layout)
        except (KeyError, ValueError, TypeError) as err:
            raise SimError("bad layout: %s" % err)
        os.makedirs(self.meta_dir)
        os.makedirs(tree.state_dir)
        self._write_sriov_manage()
        self.tree = tree
        self.state = {"version": 1, "era": era, "wedged": [], "instances": {}, "spawned": {}}
        with open(os.path.join(self.meta_dir, "lock"), "a"):
            pass
        self._save()
        with self.open():
            for vf in wedged:
                self.wedge(vf)
            for spec in boots:
                spec = dict(spec)
                self.boot(spec.pop("id"), **spec)
        return self

    def _write_sriov_manage(self):
        # An executable where the real one lives, relative to the root.
        path = self.sriov_manage
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as handle:
            handle.write("#!/bin/sh\n# vgpu-sim stand-in for NVIDIA's sriov-manage (tests/sim)\n"
                         "PYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s -m tests.sim --root %s sriov-manage \"$@\"\n"
                         % (PACKAGE_PARENT, sys.executable, self.root))
        os.chmod(path, 0o755)

    # --------------------------------------------------------------- faults
    def faults(self):
        try:
            with open(self.faults_path) as handle:
                return json.load(handle)
        except (IOError, OSError, ValueError):
            return {}

    def set_fault(self, name, value=True):
        if name not in FAULTS:
            raise SimError("unknown fault %r; known: %s" % (name, ", ".join(sorted(FAULTS))))
        faults = self.faults()
        faults[name] = value
        self._write_faults(faults)

    def clear_faults(self, name=None):
        faults = self.faults()
        if name is None:
            faults = {}
        else:
            faults.pop(name, None)
        self._write_faults(faults)

    def _write_faults(self, faults):
        tmp = self.faults_path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(faults, handle, indent=1, sort_keys=True)
        os.rename(tmp, self.faults_path)

    # ---------------------------------------------------------------- wedge
    def wedge(self, vf, wedged=True):
        vf = self._vf(vf)
        current = set(self.state["wedged"])
        if wedged:
            current.add(vf)
        else:
            current.discard(vf)
        self.state["wedged"] = sorted(current)
        return vf

    def _vf(self, ref):
        try:
            vf = self.tree.resolve_vf(ref)
        except (KeyError, IndexError, ValueError):
            raise SimError("no VF %r on this host" % (ref,))
        if vf not in self.tree.vf_info:
            raise SimError("no VF %r on this host" % (ref,))
        return vf

    # ----------------------------------------------------------------- boot
    def _store_quarantined(self):
        try:
            with open(self.tree.store_path) as handle:
                doc = json.load(handle)
            return set(r["vf_address"] for r in doc.get("records", []) if r.get("quarantined_at"))
        except (IOError, OSError, ValueError, AttributeError, KeyError, TypeError):
            return set()

    def _claims(self):
        claims = {}
        guests = os.path.join(self.tree.data_dir, "guests")
        for name in sorted(os.listdir(guests)) if os.path.isdir(guests) else []:
            try:
                with open(os.path.join(guests, name, "metadata.json")) as handle:
                    path = json.load(handle).get("GPUDevicePath") or ""
            except (IOError, OSError, ValueError):
                continue
            if path:
                claims[os.path.basename(path)] = name
        return claims

    def boot(self, instance_id, vf, profile=None, build="claimed", name=None, force=False, era=None,
             extra_meta=None):
        """Create/start an instance on ``vf`` with a running VMM stand-in; returns its record.

        ``era``: which guest agent boots (§5.5): ``markers`` prints the
        HYPEMAN-GPU-INIT markers, ``vsock`` prints its own lines and answers
        the vsock sentinel (``sim-agent-gpu-init``); default: the host's era. ``extra_meta``: more
        metadata keys (``Image``, ``Tags``) as hypeman's create writes them.
        """
        era = era or self.era
        if era not in ("markers", "vsock"):
            raise SimError("era %r; expected markers or vsock" % (era,))
        vf = self._vf(vf)
        card = self.tree.cards[self.tree.vf_info[vf]["card"]]
        if card.framework != "vendor-vfio":
            raise SimError("boot simulates vendor-VFIO instances; card %s is %s" % (card.address, card.framework))
        profile = profile or card.model.types[0][1]
        card.model.type_id(profile)  # unknown profile -> ValueError
        old = self.state["instances"].get(instance_id)
        if old and pid_alive(old["pid"], old["start_time"]):
            raise SimError("instance %s is running; stop it first" % instance_id)
        claimed = self._claims()
        if claimed.get(vf) not in (None, instance_id):
            raise SimError("VF %s is claimed by instance %s" % (vf, claimed[vf]))
        if not force and vf in self._store_quarantined():
            raise SimError("vendor VFIO vGPU on VF %s is quarantined" % vf)
        idir = os.path.join(self.tree.data_dir, "guests", instance_id)
        app_log = os.path.join(idir, "logs", "app.log")
        if os.path.exists(app_log):
            guestlog.archive_previous_boot(app_log)
        boot_ns = now_ns()
        claimed_at = guestlog.rfc3339nano(boot_ns)
        # hosttree writes the metadata of the chosen build; liveness comes from the real VMM below.
        self.tree.add_instance(instance_id, vf=vf, profile=profile, name=name, build=build,
                               claimed_at=claimed_at, liveness="stopped", hypervisor="qemu")
        meta_path = os.path.join(idir, "metadata.json")
        with open(meta_path) as handle:
            meta = json.load(handle)
        pid = self._spawn_vmm(instance_id, vf, meta["SocketPath"], os.path.join(idir, "logs", "vmm.log"))
        start_time = proc_start_time(pid)
        meta.update(HypervisorPID=pid, HypervisorStartTime=start_time, HypervisorBootID=real_boot_id(),
                    StartedAt=claimed_at, StoppedAt=None)
        meta.update(extra_meta or {})
        _write_json_atomic(meta_path, meta)
        wedged = vf in self.state["wedged"]
        report_ns = boot_ns + 27 * 10 ** 9  # the guest's driver gives up ~27 s after spawn (§8)
        console = guestlog.noise(12, seed=len(instance_id), unix_ns=boot_ns)
        console += "%s[guest-agent] HYPEMAN-AGENT-READY ts=%s\n" % (
            guestlog.log_prefix(boot_ns), guestlog.rfc3339nano(boot_ns + 2 * 10 ** 9))
        nvrm = "NVRM: GPU 0000:00:03.0: RmInitAdapter failed! (0x22:0x65:884)"
        if era == "vsock":
            # The vsock-era agent keeps its state for GetGPUInitStatus and prints one plain line.
            console += guestlog.vsock_failed_line(report_ns, nvrm) if wedged else guestlog.vsock_ok_line(report_ns)
            sim_sentinel.write_agent_state(idir, "failed" if wedged else "ok")
        elif wedged:
            console += guestlog.report("failed", report_ns, nvrm=nvrm)
        else:
            console += guestlog.report("ok", report_ns)
        guestlog.append(app_log, console)
        record = {"id": instance_id, "vf": vf, "profile": profile, "build": build, "pid": pid,
                  "start_time": start_time, "claimed_at": claimed_at, "wedged_boot": wedged,
                  "socket": meta["SocketPath"]}
        self.state["instances"][instance_id] = record
        self.state["spawned"][str(pid)] = {"role": "vmm", "start_time": start_time, "instance": instance_id}
        return record

    @property
    def era(self):
        return self.state.get("era", "markers")

    def _spawn_vmm(self, instance_id, vf, socket_path, log_path):
        nodes = [os.path.join(self.tree.dev_root, n) for n in self.tree.vf_nodes(vf)]
        return spawn_daemon(["vmm", "--instance", instance_id, "--socket", socket_path] + nodes,
                            self.root, log_path, wait_for=socket_path)

    # ----------------------------------------------------------------- stop
    def stop(self, instance_id, keep_claim=False):
        record = self.state["instances"].get(instance_id)
        if record is None:
            raise SimError("no instance %s started by the simulator" % instance_id)
        terminate(record["pid"], record["start_time"])
        self.state["spawned"].pop(str(record["pid"]), None)
        meta_path = os.path.join(self.tree.data_dir, "guests", instance_id, "metadata.json")
        with open(meta_path) as handle:
            meta = json.load(handle)
        meta.update(HypervisorPID=None, HypervisorStartTime=0, HypervisorBootID="",
                    StoppedAt=guestlog.rfc3339nano(now_ns()))
        if not keep_claim:
            meta["GPUDevicePath"] = ""
            for key in ("GPUClaimedAt", "GPUAssignedAt"):
                if key in meta:
                    meta[key] = None
            if record["vf"] in self.tree.vf_info:
                self.tree.set_current_type(record["vf"], 0)
        _write_json_atomic(meta_path, meta)
        if os.path.exists(record["socket"]):
            os.unlink(record["socket"])
        record.update(pid=None, start_time=None, stopped=True, claim_kept=keep_claim)
        return record

    def delete(self, instance_id):
        """hypeman's delete: stop the VMM, release the vGPU, remove the instance's data. False when absent."""
        idir = os.path.join(self.tree.data_dir, "guests", instance_id)
        record = self.state["instances"].get(instance_id)
        if record is not None and record.get("pid"):
            self.stop(instance_id)
        elif os.path.isfile(os.path.join(idir, "metadata.json")):
            try:
                with open(os.path.join(idir, "metadata.json")) as handle:
                    vf = os.path.basename(json.load(handle).get("GPUDevicePath") or "")
            except (IOError, OSError, ValueError, AttributeError):
                vf = ""
            if vf in self.tree.vf_info:
                self.tree.set_current_type(vf, 0)
        existed = os.path.isdir(idir) or record is not None
        if os.path.isdir(idir):
            hosttree._rmtree(idir)  # pylint: disable=protected-access
        self.state["instances"].pop(instance_id, None)
        self.tree.instances.pop(instance_id, None)
        return existed

    # ----------------------------------------------- wedge-risk triggers
    def _running(self, instance_id):
        record = self.state["instances"].get(instance_id)
        if record is None:
            raise SimError("no instance %s started by the simulator" % instance_id)
        if not pid_alive(record.get("pid"), record.get("start_time")):
            raise SimError("instance %s is not running" % instance_id)
        return record

    def hard_kill(self, instance_id, terminate_via):
        """hypeman stops an instance whose QEMU ignores SIGTERM (§8.1); ``terminate_via(id)`` asks the stand-in.

        The VMM stand-in ignores SIGTERM from SIGUSR1 on (its guest is stuck in
        driver init); the running hypeman stand-in sends SIGTERM, waits its
        grace, logs its WARN line and SIGKILLs. The claim is then released as
        :meth:`stop` does.
        """
        record = self._running(instance_id)
        os.kill(record["pid"], signal.SIGUSR1)
        answer = terminate_via(instance_id)
        if not answer.get("hard_killed"):
            raise SimError("hypeman did not hard-kill instance %s: %s" % (instance_id, answer))
        pid = record["pid"]
        self.stop(instance_id)
        return dict(answer, instance=instance_id, pid=pid, vf=record["vf"])

    def oom_kill(self, instance_id, comm="qemu-system-x86"):
        """The OOM killer kills an instance's QEMU (§8.1): SIGKILL, the kernel's lines in kern.log, metadata kept."""
        record = self._running(instance_id)
        pid = record["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while pid_alive(pid, record["start_time"]) and time.time() < deadline:
            _reap(pid)
            time.sleep(0.02)
        lines = self.tree.log_oom_kill(pid, now_ns(), comm=comm)
        self.state["spawned"].pop(str(pid), None)
        record.update(killed="oom")
        return {"instance": instance_id, "pid": pid, "vf": record["vf"], "kernel_log": self.tree.kernel_log_path,
                "lines": lines}

    # ------------------------------------------------------------ logs
    def app_log(self, instance_id):
        path = os.path.join(self.tree.data_dir, "guests", instance_id, "logs", "app.log")
        if not os.path.exists(path):
            raise SimError("instance %s has no app.log" % instance_id)
        return path

    def rotate(self, instance_id):
        path = self.app_log(instance_id)
        guestlog.copytruncate(path, max_files=1)
        return path

    def forge(self, instance_id, kinds=None):
        path = self.app_log(instance_id)
        lines = guestlog.forged_lines(now_ns())
        chosen = sorted(lines) if not kinds else kinds
        unknown = [k for k in chosen if k not in lines]
        if unknown:
            raise SimError("unknown forged line kind(s) %s; known: %s" % (", ".join(unknown), ", ".join(sorted(lines))))
        guestlog.append(path, "".join(lines[k] for k in chosen))
        return chosen

    # ---------------------------------------------------------- sriov-manage
    def card_nodes(self, pf):
        card = self.tree.cards.get(pf)
        if card is None:
            raise SimError("%s: no such GPU" % pf)
        return [os.path.join(self.tree.dev_root, "nvidia%d" % card.minor)]

    def sriov_disable(self, pf):
        nodes = self.card_nodes(pf)
        if self.faults().get("disable_fails"):
            raise SimError("Failed to disable SR-IOV on %s (simulated fault disable_fails)" % pf)
        held = holders(nodes)
        if held:
            who = ", ".join("%d (%s)" % (pid, process_name(pid)) for pid in sorted(held))
            raise SimError("Cannot obtain unbindLock for %s (held by %s)" % (pf, who))
        vf_nodes = [os.path.join(self.tree.dev_root, n) for vf in self.tree.cards[pf].vfs for n in self.tree.vf_nodes(vf)]
        busy = holders(vf_nodes)
        if busy:
            who = ", ".join("%d (%s)" % (pid, process_name(pid)) for pid in sorted(busy))
            raise SimError("Cannot obtain unbindLock for %s (VFs in use by %s)" % (pf, who))
        vfs = list(self.tree.cards[pf].vfs)
        self.tree.remove_vfs(pf)
        # A cycle recreates the VFs: whatever wedged them is gone.
        self.state["wedged"] = [vf for vf in self.state["wedged"] if vf not in vfs]
        return vfs

    def sriov_enable(self, pf, delayed=False):
        card = self.tree.cards.get(pf)
        if card is None:
            raise SimError("%s: no such GPU" % pf)
        faults = self.faults()
        if faults.get("enable_noop") and not delayed:
            return []
        if faults.get("enable_slow") and not delayed:
            delay = faults["enable_slow"]
            delay = 5 if delay is True else float(delay)
            spawn_daemon(["sriov-manage", "--delayed-enable", str(delay), pf], self.root, os.devnull)
            return []
        if card.vfs:
            return list(card.vfs)
        vfs = self.tree.enable_vfs(pf, card.model.total_vfs)
        if faults.get("enable_no_types"):
            for vf in vfs:
                self.tree.set_creatable(vf, types=[])
        elif not card.realistic:
            card.realistic = True
            self.tree.refresh_creatable(pf)
        return vfs

    # ------------------------------------------------------------- daemons
    def register_spawned(self, pid, role, **extra):
        self.state["spawned"][str(pid)] = dict(extra, role=role, start_time=proc_start_time(pid))

    def status(self):
        instances = {}
        for iid, rec in sorted(self.state["instances"].items()):
            instances[iid] = dict(rec, running=bool(rec.get("pid")) and pid_alive(rec["pid"], rec["start_time"]))
        cards = []
        for addr in sorted(self.tree.cards):
            card = self.tree.cards[addr]
            held = holders(self.card_nodes(addr))
            cards.append(dict(card.describe(), holders=[{"pid": p, "comm": process_name(p)} for p in sorted(held)]))
        return {"paths": self.paths(), "era": self.era, "cards": cards, "wedged": self.state["wedged"],
                "instances": instances, "faults": self.faults(), "api_boots": self.state.get("api_boots", []),
                "spawned": dict((k, v) for k, v in self.state["spawned"].items()
                                if pid_alive(int(k), v["start_time"]))}

    def expose_driver(self, proc="/proc"):
        """Bind-mount the tree's ``proc/driver`` over the kernel's ``/proc/driver``.

        The collection maps a card to its ``dev/nvidia<minor>`` node through
        ``<proc_root>/driver/nvidia/gpus/<pf>/information`` (written by
        hosttree). The simulated host's processes are real, so its proc root
        is the kernel's ``/proc``; inside a container with CAP_SYS_ADMIN this
        makes the driver's files appear there too. Idempotent.
        """
        target = os.path.join(proc, "driver")
        if os.path.isdir(os.path.join(target, "nvidia", "gpus")):
            return False
        source = os.path.join(self.tree.proc_root, "driver")
        result = subprocess.run(["mount", "--bind", source, target], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SimError("cannot expose %s at %s: %s" % (source, target, result.stderr.strip()))
        return True

    # ------------------------------------------------------------ teardown
    def teardown(self, remove=False):
        """Stop every process the simulator spawned; with ``remove`` delete the root."""
        stopped = []
        if os.path.isfile(self.state_path):
            with open(self.state_path) as handle:
                state = json.load(handle)
            for pid, info in sorted(state.get("spawned", {}).items()):
                if terminate(int(pid), info.get("start_time")):
                    stopped.append(int(pid))
        if remove and os.path.isdir(self.root):
            hosttree._rmtree(self.root)
        return stopped


class ApiLauncher(object):
    """What the ``hypeman-api`` stand-in calls to boot and delete instances on this simulated host."""

    def __init__(self, root, era=None):
        import threading

        self.root, self.era, self.lock = root, era, threading.Lock()

    def boot(self, instance_id, vf, profile, name, extra_meta):
        if vf is None:
            raise SimError("the simulator boots only vGPU instances")
        with self.lock:
            sim = SimHost(self.root)
            with sim.open():
                record = sim.boot(instance_id, vf, profile=profile, name=name, era=self.era, extra_meta=extra_meta)
                # Test equipment's own history of the API's creates (status "api_boots"): a deleted
                # instance leaves no other trace, and a test must count the boots (one canary, not two).
                sim.state.setdefault("api_boots", []).append({
                    "id": instance_id, "name": name, "vf": vf, "profile": record["profile"],
                    "tags": dict((extra_meta or {}).get("Tags") or {}), "wedged_boot": record["wedged_boot"],
                    "created_at": record["claimed_at"], "deleted_at": None})
                return record

    def delete(self, instance_id):
        with self.lock:
            sim = SimHost(self.root)
            with sim.open():
                existed = sim.delete(instance_id)
                for boot in sim.state.get("api_boots", []):
                    if boot["id"] == instance_id and boot["deleted_at"] is None:
                        boot["deleted_at"] = guestlog.rfc3339nano(now_ns())
                return existed


def terminate(pid, start_time=None, timeout=5.0):
    """SIGTERM then SIGKILL a process we started (checked by start time). True if it was alive."""
    if not pid or not pid_alive(pid, start_time):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError as err:
        if err.errno == errno.ESRCH:
            return False
        raise
    deadline = time.time() + timeout
    while time.time() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    _reap(pid)
    return True


def _reap(pid):
    try:
        os.waitpid(pid, os.WNOHANG)
    except OSError:
        pass  # not our child


def spawn_daemon(args, root, log_path, wait_for=None, timeout=10.0):
    """Start ``python3 -m tests.sim --root ROOT ARGS`` detached; returns its pid.

    The child runs in its own session and outlives the command that started
    it (like a VMM outlives an API call). ``wait_for`` is a path the child
    creates when ready.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_path, "ab") as log, open(os.devnull, "rb") as null:
        proc = subprocess.Popen([sys.executable, "-m", "tests.sim", "--root", root] + list(args),
                                stdin=null, stdout=log, stderr=log, env=env, cwd="/",
                                start_new_session=True, close_fds=True)
    if wait_for:
        deadline = time.time() + timeout
        while not os.path.exists(wait_for):
            if proc.poll() is not None:
                raise SimError("%s exited with %s before it was ready (see %s)" % (args[0], proc.returncode, log_path))
            if time.time() > deadline:
                terminate(proc.pid)
                raise SimError("%s not ready after %ss (see %s)" % (args[0], timeout, log_path))
            time.sleep(0.01)
    # Popen would reap it on garbage collection; forget it so it is reparented instead.
    proc.returncode = 0
    return proc.pid


def _write_json_atomic(path, data):
    # hypeman's newer builds: temp file in the instance dir, 0644, rename, no fsync (§3.1).
    tmp = os.path.join(os.path.dirname(path), ".metadata-sim.tmp")
    with open(tmp, "w") as handle:
        handle.write(json.dumps(data, indent=2))
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
