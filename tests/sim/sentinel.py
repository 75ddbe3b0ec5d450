# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Current hypeman's vsock sentinel, for the ``hypeman-api`` stand-in (test equipment).

docs/hypeman-interface.md §5.3, §5.4, §5.6 (``lib/instances/vgpu_sentinel.go``,
vsock era): every ``interval`` seconds it lists the instances whose metadata
holds a vendor-VFIO VF (not a retention stub), asks each guest agent for its
GPU init state, counts one check per answer by result, and reports FAILED and
OK to the VF health store itself (deduplicated per assignment), counting init
failures and quarantines.

The guest agent's vsock answer is simulated by a file in the instance
directory, ``sim-agent-gpu-init`` (one word: ``ok``, ``failed``, ``unknown``,
``unsupported`` for an agent without ``GetGPUInitStatus``); no file means the
agent does not answer (``rpc_error``), and neither does the agent of a guest
whose recorded hypervisor is gone (its QEMU was killed: the vsock dial fails).
Nothing here reads ``app.log``: a current hypeman never trusts the console.
Standard library only.
"""

from __future__ import annotations

import json
import os
import threading

from .api import process_alive
from .store import StoreError

AGENT_STATE_FILE = "sim-agent-gpu-init"
AGENT_ANSWERS = ("ok", "failed", "unknown", "unsupported")
DEFAULT_NVRM = "NVRM: GPU 0000:00:03.0: RmInitAdapter failed! (0x22:0x65:884)"


def write_agent_state(instance_dir, state):
    """Set what the simulated guest agent answers over vsock (None: the agent does not answer)."""
    path = os.path.join(instance_dir, AGENT_STATE_FILE)
    if state is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    if state not in AGENT_ANSWERS:
        raise ValueError("agent state %r; expected one of %s" % (state, ", ".join(AGENT_ANSWERS)))
    with open(path + ".tmp", "w") as handle:
        handle.write(state + "\n")
    os.rename(path + ".tmp", path)


def _assigned_at(meta):
    # hypeman renders the claim time in UTC RFC3339Nano; the simulator writes it that way already.
    return meta.get("GPUAssignedAt") or meta.get("GPUClaimedAt") or ""


def _hypervisor(meta):
    """``(pid, start_time)`` metadata records for the guest's hypervisor (``pid`` None when none is recorded)."""
    pid = meta.get("HypervisorPID")
    return (pid if isinstance(pid, int) and pid > 0 else None), meta.get("HypervisorStartTime") or 0


def targets(data_dir):
    """``[(instance_id, instance_dir, vf_address, assigned_at, hypervisor)]`` the sentinel polls."""
    guests = os.path.join(data_dir, "guests")
    out = []
    for name in sorted(os.listdir(guests)) if os.path.isdir(guests) else []:
        instance_dir = os.path.join(guests, name)
        try:
            with open(os.path.join(instance_dir, "metadata.json")) as handle:
                meta = json.load(handle)
        except (OSError, ValueError):
            continue  # hypeman logs and skips unreadable metadata
        if meta.get("GPURetainedForCleanup") or meta.get("GPUFramework") != "vendor-vfio" \
                or not meta.get("GPUDevicePath"):
            continue
        out.append((name, instance_dir, os.path.basename(meta["GPUDevicePath"]), _assigned_at(meta),
                    _hypervisor(meta) if "HypervisorPID" in meta else None))
    return out


class VsockSentinel(object):
    """The polling loop; ``counters`` is a :class:`tests.sim.metrics.SentinelCounters`."""

    def __init__(self, api, counters, interval=5.0):
        self.api = api
        self.counters = counters
        self.interval = interval
        self.stopped = threading.Event()

    def poll_once(self):
        try:
            polled = targets(self.api.data_dir)
        except OSError:
            self.counters.check("list_error")
            return
        for instance_id, instance_dir, vf, assigned_at, hypervisor in polled:
            if hypervisor is not None and not (hypervisor[0] and process_alive(self.api.proc_root, *hypervisor)):
                self.counters.check("rpc_error")  # no QEMU, no vsock: the dial fails
                continue
            try:
                with open(os.path.join(instance_dir, AGENT_STATE_FILE)) as handle:
                    answer = handle.read().strip()
            except OSError:
                self.counters.check("rpc_error")
                continue
            if answer == "unsupported":
                self.counters.check("unsupported_agent")
            elif answer == "failed":
                self.counters.check("failed")
                try:
                    result = self.api.report("failure", {"vf_address": vf, "instance_id": instance_id,
                                                         "assigned_at": assigned_at})
                except StoreError:
                    continue  # hypeman logs it and retries on the next tick
                if result["outcome"] in ("recorded", "quarantined"):
                    self.counters.failure(result["outcome"] == "quarantined")
            elif answer == "ok":
                self.counters.check("ok")
                try:
                    self.api.report("success", {"vf_address": vf, "instance_id": instance_id,
                                                "assigned_at": assigned_at})
                except StoreError:
                    pass
            else:
                self.counters.check("unknown")

    def run(self):
        while not self.stopped.wait(self.interval):
            self.poll_once()

    def start(self):
        thread = threading.Thread(target=self.run, name="vgpu-sentinel", daemon=True)
        thread.start()
        return thread
