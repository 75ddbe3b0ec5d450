# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kill -9 at any instant of a recording sentinel scan loses nothing and counts nothing twice.

The module itself (vgpu_sentinel_scan with record=true: scan, store update,
then cursor commit) runs in a subprocess that is SIGKILLed at a random
instant of its run, 30 times, while guest consoles keep getting failure
reports, rotations and reboots (new assignments, some on the same VF).
After every kill:

* each cursor file is the old one byte for byte or a complete, valid new one
  (atomic replace), and no cursor disappeared;
* the store is valid, and no failure recorded earlier vanished or was recorded
  again (its reported_at never changes).

After each phase a run that is not killed must leave the store with exactly
one failure per failed assignment (none lost, none twice), every finding
marked recorded, and no temp file behind; a further run changes nothing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sentinel, _store
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.unit.plugins.module_utils.sentinel_host import SEC, MiniHost

INSTANCES = ["inst-%d" % index for index in range(6)]
PHASES = 3
KILLS_PER_PHASE = 10
CHILD_TIMEOUT = 120  # a hang detector, not a time assertion

# The module, run as Ansible runs it. With a kill point N > 0 the child SIGKILLs itself
# just before or just after its N-th file-system change (write, fsync, rename, unlink,
# mkdir): every instant at which what is on disk can differ. It reports how many
# changes a complete run made, to aim the next kill points.
_CHILD = r"""
import atexit, json, os, signal, sys
from ansible.module_utils.testing import patch_module_args
from ansible_collections.hypeman.vgpu.plugins.modules import vgpu_sentinel_scan
params, kill_at = json.loads(sys.argv[1]), int(sys.argv[2])
events = [0]

def tick():
    events[0] += 1
    if events[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

def counted(call):
    def wrapper(*args, **kwargs):
        tick()
        result = call(*args, **kwargs)
        tick()
        return result
    return wrapper

for name in ("write", "fsync", "rename", "replace", "unlink", "mkdir"):
    setattr(os, name, counted(getattr(os, name)))
atexit.register(lambda: sys.stderr.write("events=%d\n" % events[0]))
sys.stdout.write("ready\n")
sys.stdout.flush()
with patch_module_args(params):
    vgpu_sentinel_scan.main()
"""


class Rig(object):
    def __init__(self, root):
        self.host = MiniHost(root)
        self.proc_root = os.path.join(str(root), "proc")
        os.makedirs(self.proc_root)
        self.store_path = os.path.join(self.host.data_dir, "gpu", "vf-health.json")
        self.params = {"data_dir": self.host.data_dir, "state_dir": self.host.state_dir,
                       "proc_root": self.proc_root, "config_path": os.path.join(str(root), "config.yaml"),
                       "record": True, "threshold": 100}
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.now_s = time.time_ns() // SEC - 10 * 3600
        self.current = {}  # instance -> (vf, assigned_at)
        self.expected = set()  # (vf, instance, assigned_at) of every failed assignment seen by a clean run
        self.failed_now = set()  # instances whose current assignment printed a failure
        self.reported_at = {}  # (vf, instance, assigned_at) -> reported_at, once recorded
        for index, instance_id in enumerate(INSTANCES):
            self.boot(instance_id, index)

    def boot(self, instance_id, vf_index):
        """hypeman starts the instance: archive its app.log, claim a VF, a new console."""
        self.now_s += 60
        app = self.host.app(instance_id)
        if os.path.exists(app):
            guestlog.archive_previous_boot(app, self.now_s * SEC - SEC)
        claimed = guestlog.rfc3339nano(self.now_s * SEC)
        self.host.instance(instance_id, vf_index=vf_index, claimed_at=claimed)
        self.current[instance_id] = (MiniHost.VFS[vf_index], claimed)
        self.failed_now.discard(instance_id)

    def spawn(self, kill_at=0):
        child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(self.params), str(kill_at)], env=self.env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = b""
        while not line.endswith(b"\n"):  # unbuffered: communicate() must get the rest of stdout
            byte = os.read(child.stdout.fileno(), 1)
            assert byte, child.communicate(timeout=CHILD_TIMEOUT)
            line += byte
        assert line == b"ready\n", line
        return child

    def run_clean(self):
        child = self.spawn()
        out, err = child.communicate(timeout=CHILD_TIMEOUT)
        result = json.loads(out)
        assert child.returncode == 0 and not result.get("failed"), (result, err)
        result["events"] = int(err.decode().rsplit("events=", 1)[1])
        return result

    def cursors(self):
        directory = os.path.join(self.host.state_dir, "sentinel")
        found = {}
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                if name.endswith(".json") and not name.startswith("."):
                    with open(os.path.join(directory, name), "rb") as handle:
                        found[name[:-5]] = handle.read()
        return found

    def failures(self):
        store = _store.load_store(self.store_path)
        assert store.valid, store.error
        raw = json.loads(store.raw) if store.raw else {"records": []}
        found = {}
        for record in raw["records"]:
            for failure in record.get("failures", []):
                key = (record["vf_address"], failure["instance_id"], failure["assigned_at"])
                assert key not in found
                found[key] = failure["reported_at"]
        return found

    def check_recorded_flags(self, cursors, failures):
        """A cursor that says its failed verdict is recorded is backed by the store."""
        for instance_id, data in cursors.items():
            state = json.loads(data)
            verdict = state.get("verdict")
            if verdict and verdict["verdict"] == "failed" and verdict["recorded"]:
                key = (state["assignment"]["vf_address"], instance_id, state["assignment"]["assigned_at"])
                assert key in failures, key

    def check_store_kept(self):
        """No failure recorded earlier vanished or was re-recorded as new."""
        failures = self.failures()
        for key, reported_at in self.reported_at.items():
            assert failures.get(key) == reported_at, key
        self.reported_at.update(failures)
        return failures


def _mutate(rig, rng):
    """Guest consoles move on: failure reports, noise, a rotation now and then."""
    for instance_id in rng.sample(INSTANCES, 3):
        app = rig.host.app(instance_id)
        if rng.random() < 0.5:
            guestlog.append(app, guestlog.report("failed", (rig.now_s + rng.randint(10, 50)) * SEC)
                            + guestlog.noise(rng.randint(0, 30), seed=rng.randint(0, 99)))
            rig.failed_now.add(instance_id)
        else:
            guestlog.append(app, guestlog.noise(rng.randint(1, 40), seed=rng.randint(0, 99)))
        if rng.random() < 0.15:
            guestlog.copytruncate(app)


def test_sigkill_during_recording_scans_loses_nothing_and_counts_nothing_twice(tmp_path):
    rng = random.Random(20261201)
    rig = Rig(tmp_path)
    # Calibrate on a run that records and moves every cursor: how many file-system
    # changes and how much time it takes once imported.
    rig.run_clean()
    for instance_id in INSTANCES:
        guestlog.append(rig.host.app(instance_id), guestlog.report("failed", (rig.now_s + 5) * SEC))
        rig.failed_now.add(instance_id)
    started = time.monotonic()
    events = rig.run_clean()["events"]
    window = max(time.monotonic() - started, 0.02)
    kills = 0
    for phase in range(PHASES):
        for index in range(KILLS_PER_PHASE):
            _mutate(rig, rng)
            before = rig.cursors()
            if index % 3 == 2:
                # A kill from outside at a random time of the run (the child's clock, not ours).
                child = rig.spawn()
                time.sleep(rng.uniform(0, window))
                child.send_signal(signal.SIGKILL)
            else:
                # The child kills itself at a random file-system change of its run.
                child = rig.spawn(kill_at=rng.randint(1, events))
            _out, err = child.communicate(timeout=CHILD_TIMEOUT)
            if child.returncode == -signal.SIGKILL:
                kills += 1
            else:  # it finished first: aim the next kill points at a run of this size
                events = int(err.decode().rsplit("events=", 1)[1])
            after = rig.cursors()
            assert set(before) <= set(after)
            for instance_id, data in after.items():
                if data != before.get(instance_id):
                    assert _sentinel.valid_state(json.loads(data), instance_id), instance_id
            rig.check_recorded_flags(after, rig.check_store_kept())
        # A run nobody kills settles everything.
        result = rig.run_clean()
        for instance_id in rig.failed_now:
            vf, assigned_at = rig.current[instance_id]
            rig.expected.add((vf, instance_id, assigned_at))
        failures = rig.check_store_kept()
        assert set(failures) == rig.expected
        assert all(f["recorded"] for f in result["findings"])
        assert sorted(f["instance_id"] for f in result["findings"]) == sorted(rig.failed_now)
        leftovers = [n for n in os.listdir(os.path.join(rig.host.state_dir, "sentinel")) if n.endswith(".tmp")]
        assert leftovers == []
        again = rig.run_clean()
        assert again["changed"] is False and again["outcomes"] == []
        # Reboots: new assignments, two of them on a VF that already has a failure.
        for instance_id in rng.sample(INSTANCES, 3):
            rig.boot(instance_id, rng.randrange(len(MiniHost.VFS)))
    assert 2 * kills >= PHASES * KILLS_PER_PHASE  # most children died mid-run, not after they finished
