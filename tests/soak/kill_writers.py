# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Soak: SIGKILL vf_health at random instants, then check that nothing was lost.

On a simulated host (tests/sim/hosttree.py) it runs a cycle of vf_health tasks
-- drain VFs (owned quarantines), failure reports that cross the threshold,
undrain with ``owned_only``, a success that rescinds -- and kills every run
with SIGKILL after a random delay drawn uniformly from 0 to 1.1 times the
task's measured normal run time (so kills land all over the run, from the
interpreter start to after the exit). After each kill a settle step re-runs
the same task to completion, as an operator re-running the task would, and
checks (each count is of incidents: a problem still there at the next check
is not counted again):

* ``corrupt``: the store is not a valid store in hypeman's exact bytes;
* ``lost_ownership``: a quarantine in the store with no ledger entry that
  recorded it (or, for a drain, that the ledger does not own), or a latest
  ledger quarantine whose change is not in the store;
* ``leftover_tmp``: ``vf-health.json.tmp`` is still there;
* ``unsettled``: a write-ahead intent is still pending;
* ``wrong_result``: the task's effect is not in the store (e.g. an undrain
  that skipped a drain it no longer recognised as its own).

It prints the counts (plus how many kills landed mid-run and how many intents
the settle steps committed or aborted) and exits 1 when any of the five is
non-zero. Run from the repository root::

    PYTHONPATH=.collections .venv/bin/python tests/soak/kill_writers.py --kills 500

``--mode exec`` (default) starts a fresh interpreter per run, like Ansible;
``--mode fork`` forks a process that calls the module's ``main`` (faster, and
a larger share of each run is the store write; not from a multi-threaded
process such as a pytest-xdist worker).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _ledger, _store
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree

CARD = "0000:82:00.0"
ASSIGNED = "2026-08-20T15:00:00.123456789Z"
FAILURE_CHECKS = ("corrupt", "lost_ownership", "leftover_tmp", "unsettled", "wrong_result")
MODULE = "ansible_collections.hypeman.vgpu.plugins.modules.vf_health"
# The directory holding "ansible_collections", so child interpreters import the same code.
IMPORT_ROOT = os.path.abspath(os.path.join(os.path.dirname(_store.__file__), *([os.pardir] * 5)))


class Soak(object):
    def __init__(self, root, mode, rng, out=sys.stdout):
        self.tree = HostTree(root)
        self.vfs = list(self.tree.add_card("A100", CARD, numvfs=4).vfs)
        self.manual = [self.vfs[0], self.vfs[1], self.vfs[3]]  # only drains touch these
        self.failing = self.vfs[2]  # only failure and success reports touch this one
        self.mode = mode
        self.rng = rng
        self.out = out
        self.args_dir = os.path.join(root, "args")
        os.makedirs(self.args_dir)
        self.durations = {}
        self.counts = dict((name, 0) for name in FAILURE_CHECKS)
        self.counts.update(kills=0, killed_mid_run=0, settled_commit=0, settled_abort=0, ledger_problems=0)
        self.failures = []
        self.open_incidents, self.seen_now = set(), set()
        if mode == "fork":
            from ansible_collections.hypeman.vgpu.plugins.modules import vf_health  # imported once, forked often
            self.main = vf_health.main

    # -- the tasks ---------------------------------------------------------------------------

    def task(self, step):
        """The ``step``-th task of the cycle: (name, module args, expected check)."""
        cycle, index = divmod(step, 6)
        vf0, vf1, vf3 = self.manual
        failed = dict(state="failed", vf_addresses=[self.failing], assigned_at=ASSIGNED, threshold=2)
        return [
            ("drain", dict(state="quarantined", vf_addresses=[vf0, vf1], reason="soak drain")),
            ("fail-a", dict(failed, instance_id="a-%d" % cycle)),
            ("drain-one", dict(state="quarantined", vf_addresses=[vf3], reason="soak drain")),
            ("fail-b", dict(failed, instance_id="b-%d" % cycle)),
            ("undrain", dict(state="absent", vf_addresses=[vf0, vf1, vf3])),
            ("succeed-b", dict(state="succeeded", vf_addresses=[self.failing], instance_id="b-%d" % cycle,
                               assigned_at=ASSIGNED)),
        ][index]

    def expected(self, name, store):
        """Why the store does not show the completed task ``name`` (None when it does)."""
        vf0, vf1, vf3 = self.manual
        quarantined = set(store.quarantined())
        record = store.records.get(self.failing)
        if name == "drain" and not {vf0, vf1} <= quarantined:
            return "drain: %s not quarantined" % sorted({vf0, vf1} - quarantined)
        if name == "drain-one" and vf3 not in quarantined:
            return "drain-one: not quarantined"
        if name == "undrain" and any(vf in store.records for vf in self.manual):
            return "undrain left records of %s" % sorted(vf for vf in self.manual if vf in store.records)
        if name == "fail-a" and (record is None or len(record.failures) != 1 or record.quarantined_at):
            return "fail-a: %r" % (record,)
        if name == "fail-b" and (record is None or record.quarantined_at is None):
            return "fail-b: not quarantined: %r" % (record,)
        if name == "succeed-b" and record is not None:
            return "succeed-b left %r" % (record,)
        return None

    # -- running the module ----------------------------------------------------------------------

    def module_args(self, args):
        full = dict(data_dir=self.tree.data_dir, state_dir=self.tree.state_dir, sysfs_root=self.tree.sysfs_root,
                    proc_root=self.tree.proc_root, config_path=self.tree.config_path)
        full.update(args)
        return full

    def start(self, args, capture):
        if self.mode == "exec":
            path = os.path.join(self.args_dir, "args.json")
            with open(path, "w") as handle:
                json.dump({"ANSIBLE_MODULE_ARGS": self.module_args(args)}, handle)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [IMPORT_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
            return _Exec(subprocess.Popen([sys.executable, "-m", MODULE, path], env=env,
                                          stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        return _Fork(self.main, self.module_args(args), capture)

    def complete(self, name, args):
        """Run the task to its end; returns its result."""
        began = time.monotonic()
        child = self.start(args, capture=True)
        output = child.output()
        returncode = child.wait()
        self.durations.setdefault(name, []).append(time.monotonic() - began)
        try:
            result = json.loads(output)
        except ValueError:
            result = {"failed": True, "msg": "no JSON result (exit %s): %r" % (returncode, output[-500:])}
        return result

    def typical(self, name, args):
        times = self.durations.get(name) or []
        while len(times) < 3:
            self.complete(name, args)  # warm-up runs measure the task (and are checked like the others)
            times = self.durations[name]
        return statistics.median(times[-15:])

    # -- one kill ------------------------------------------------------------------------------------

    def kill_once(self, step):
        name, args = self.task(step)
        delay = self.rng.uniform(0.0, 1.1 * self.typical(name, args))
        child = self.start(args, capture=False)
        time.sleep(delay)
        if child.alive():
            self.counts["killed_mid_run"] += 1
        child.kill()
        child.wait()
        self.counts["kills"] += 1
        result = self.complete(name, args)
        if result.get("failed"):
            self.fail("wrong_result", step, name, "settle run failed: %s" % result.get("msg"))
        for settled in result.get("settled", []):
            self.counts["settled_" + settled["outcome"]] += 1
        self.check(step, name)

    def fail(self, check, step, name, why, key=None):
        """Count an incident once: the same problem seen again at the next check is the same incident."""
        key = (check, key if key is not None else step)
        self.seen_now.add(key)
        if key not in self.open_incidents:
            self.counts[check] += 1
            self.failures.append("step %d (%s) %s: %s" % (step, name, check, why))

    def check(self, step, name):
        self.seen_now = set()
        try:
            self._check(step, name)
        finally:
            self.open_incidents = self.seen_now

    def _check(self, step, name):
        path = self.tree.store_path
        store = _store.load_store(path)
        if not store.valid or (store.exists and store.to_bytes() != store.raw):
            self.fail("corrupt", step, name, store.error or "not in hypeman's exact bytes", "store")
            return
        if os.path.lexists(path + ".tmp"):
            self.fail("leftover_tmp", step, name, path + ".tmp", "tmp")
        ledger = _ledger.read_ledger(self.tree.state_dir)
        self.counts["ledger_problems"] = len(ledger.problems)
        if ledger.pending():
            runs = [intent.run_id for intent in ledger.pending()]
            self.fail("unsettled", step, name, runs, tuple(runs))
        latest = ledger.latest_by_vf()
        owned = set(_ledger.owned_quarantines(ledger, store))
        for vf in self.vfs:
            record, entry = store.records.get(vf), latest.get(vf)
            logged = entry is not None and entry["action"] == "quarantine"
            if record is not None and record.quarantined_at is not None:
                if not logged or _gotime.parse_rfc3339(entry["quarantined_at"]) != record.quarantined_at:
                    self.fail("lost_ownership", step, name, "%s quarantined, latest ledger entry %r" % (vf, entry),
                              (vf, "unlogged", str(record.quarantined_at)))
                elif vf in self.manual and vf not in owned:
                    self.fail("lost_ownership", step, name, "%s drained but not owned" % vf,
                              (vf, "not owned", str(record.quarantined_at)))
            elif logged:
                self.fail("lost_ownership", step, name, "%s: ledger says quarantined, store does not" % vf,
                          (vf, "not in store", entry["quarantined_at"]))
        why = self.expected(name, store)
        if why:
            self.fail("wrong_result", step, name, why)

    def run(self, kills):
        for step in range(kills):
            self.kill_once(step)
        return self.counts


class _Exec(object):
    def __init__(self, proc):
        self.proc = proc

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

    def output(self):
        return self.proc.stdout.read().decode("utf-8", "replace")

    def wait(self):
        return self.proc.wait()


class _Fork(object):
    """A forked child calling the module's main() with its arguments."""

    def __init__(self, main, args, capture):
        read_end, write_end = os.pipe() if capture else (None, None)
        pid = os.fork()
        if pid == 0:  # the child: run the module and leave without touching the parent's state
            code = 0
            try:
                target = write_end if capture else os.open(os.devnull, os.O_WRONLY)
                os.dup2(target, 1)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 2)
                sys.stdout = os.fdopen(1, "w")
                from ansible.module_utils.testing import patch_module_args
                with patch_module_args(args):
                    main()
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 1
            except BaseException:
                code = 3
            finally:
                try:
                    sys.stdout.flush()
                finally:
                    os._exit(code)
        self.pid = pid
        self.status = None
        self.read_end = read_end
        if capture:
            os.close(write_end)

    def alive(self):
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
        return self.status is None

    def kill(self):
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)

    def output(self):
        chunks = []
        while True:
            chunk = os.read(self.read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(self.read_end)
        return b"".join(chunks).decode("utf-8", "replace")

    def wait(self):
        if self.status is None:
            self.status = os.waitpid(self.pid, 0)[1]
        return os.waitstatus_to_exitcode(self.status)


def soak(kills, mode="exec", seed=None, workdir=None, keep=False, out=sys.stdout):
    """Run the soak; returns ``(counts, failures)``."""
    seed = random.randrange(1 << 30) if seed is None else seed
    root = tempfile.mkdtemp(prefix="kill_writers.", dir=workdir)
    out.write("kill_writers: %d kills, mode %s, seed %d, host tree %s\n" % (kills, mode, seed, root))
    try:
        runner = Soak(os.path.join(root, "host"), mode, random.Random(seed), out)
        counts = runner.run(kills)
        typical = dict((name, round(statistics.median(times) * 1000, 1)) for name, times in runner.durations.items())
        out.write("median run time per task (ms): %s\n" % json.dumps(typical, sort_keys=True))
        return counts, runner.failures
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--kills", type=int, default=500, help="number of SIGKILLs (default 500)")
    parser.add_argument("--mode", choices=("exec", "fork"), default="exec")
    parser.add_argument("--seed", type=int, help="random seed (printed; default random)")
    parser.add_argument("--workdir", help="where to make the host tree (default: the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the host tree for inspection")
    options = parser.parse_args(argv)
    counts, failures = soak(options.kills, options.mode, options.seed, options.workdir, options.keep)
    for line in failures[:20]:
        print("  " + line)
    print(" ".join("%s=%d" % (name, counts[name]) for name in
                   ("kills", "killed_mid_run", "settled_commit", "settled_abort", "ledger_problems")
                   + FAILURE_CHECKS))
    return 1 if any(counts[name] for name in FAILURE_CHECKS) else 0


if __name__ == "__main__":
    sys.exit(main())
