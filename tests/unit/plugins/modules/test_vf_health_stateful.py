# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vf_health against an independent model of hypeman's store, driven by hypothesis.

Random sequences of vf_health tasks (failed / succeeded / quarantined / absent with
owned_only true or false, on a few VFs and assignments), hypeman restarts at another
threshold (tests/sim/store.py loads the file, re-evaluates and rewrites it) and runs
killed just before or just after the store's rename. The model is the simulator's
store (written from docs/hypeman-interface.md, not from plugins/), fed the same operations at the
same instants. After every step:

* the store is valid and byte-for-byte the model's file;
* the outcomes are the model's;
* ownership (``owned_quarantines`` of the ledger) is exactly the drains the model
  says are ours, killed runs included, and no intent is left once a task completed;
* the same task run again changes nothing.

Bounded for ``make test``; ``HYPOTHESIS_PROFILE=fuzz`` runs the long profile.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _ledger, _store, _store_write
from ansible_collections.hypeman.vgpu.plugins.modules import vf_health
from ansible_collections.hypeman.vgpu.tests.sim import store as sim
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree


def _register(name, **values):
    """Register a profile unless another test module already did (double registration is harmless)."""
    try:
        settings.get_profile(name)
    except InvalidArgument:
        settings.register_profile(name, **values)


_register("fuzz", max_examples=1000, stateful_step_count=40, deadline=None)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
try:
    settings.get_profile(PROFILE)
    settings.load_profile(PROFILE)
except InvalidArgument:
    PROFILE = "default"
LONG = PROFILE != "default"

CARD = "0000:82:00.0"
BASE_NS = 1787411045 * 10 ** 9  # 2026-08-22, far from any real clock
SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Killed(BaseException):
    """Stands in for SIGKILL inside the module: no except clause catches it."""


@contextlib.contextmanager
def killed_at(where):
    if where is None:
        yield
        return
    if where == "before-rename":
        def rename(*args, **kwargs):
            raise Killed()
        with mock.patch.object(os, "rename", rename):
            yield
        return
    real = _store_write.write_store_bytes

    def write(*args, **kwargs):  # the store is replaced; the ledger entries that follow are never written
        real(*args, **kwargs)
        raise Killed()
    with mock.patch.object(_store_write, "write_store_bytes", write):
        yield


_TREE = {}


def sysfs_tree():
    """One read-only host tree (sysfs, proc) for every example; stores and ledgers are per example."""
    if "tree" not in _TREE:
        root = tempfile.mkdtemp(prefix="stateful-host.", dir=SHM)
        tree = HostTree(root)
        _TREE["vfs"] = list(tree.add_card("A100", CARD, numvfs=4).vfs)[:3]
        _TREE["tree"] = tree
    return _TREE["tree"], _TREE["vfs"]


# Few VFs and assignments, so reports collide: tallies cross thresholds, successes rescind.
VF_INDEX = st.integers(min_value=0, max_value=2)
INSTANCE = st.sampled_from(["i1", "i2"])
ASSIGNED = st.sampled_from(["2026-08-20T15:00:00.123456789Z", ""])
THRESHOLD = st.integers(min_value=1, max_value=3)
CRASH = st.sampled_from([None, None, None, "before-rename", "after-rename"])


class StoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super(StoreMachine, self).__init__()
        self.tree, self.vfs = sysfs_tree()
        self.root = tempfile.mkdtemp(prefix="stateful.", dir=SHM)
        self.data_dir = os.path.join(self.root, "data")
        self.state_dir = os.path.join(self.root, "state")
        self.path = os.path.join(self.data_dir, "gpu", "vf-health.json")
        self.model_path = os.path.join(self.root, "model", "gpu", "vf-health.json")
        os.makedirs(os.path.dirname(self.model_path))
        self.threshold = 2
        self.owned = set()
        self.clock = 0

    def teardown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    # -- time and the two worlds ---------------------------------------------------------------

    def tick(self):
        self.clock += 1
        return BASE_NS + self.clock * 1000000007  # nanoseconds vary, so trimming is exercised

    def hypeman(self, path, now_ns):
        """hypeman (the simulator) loading ``path`` at the current threshold: re-evaluates and rewrites."""
        return sim.VFHealthStore(path, self.threshold, now=lambda: sim.GoTime(now_ns, 0))

    def run_module(self, now_ns, crash=None, **args):
        params = dict(data_dir=self.data_dir, state_dir=self.state_dir, sysfs_root=self.tree.sysfs_root,
                      proc_root=self.tree.proc_root, config_path=os.path.join(self.root, "none.yaml"),
                      threshold=self.threshold)
        params.update(args)
        ansible_warnings._global_warnings.clear()
        out = io.StringIO()
        now = _gotime.from_unix_ns(now_ns)
        with mock.patch.object(_gotime, "utc_now", lambda: now), patch_module_args(params), \
                contextlib.redirect_stdout(out), killed_at(crash):
            try:
                vf_health.main()
            except SystemExit:
                pass
            except Killed:
                return None
        return json.loads(out.getvalue())

    def read(self, path):
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    # -- the model of each task (hypeman's semantics via the simulator) -------------------------

    def model(self, state, vf, now_ns, instance=None, assigned=None, owned_only=True):
        """Apply the task to the model file; returns (outcome, owned_after)."""
        store = self.hypeman(self.model_path, now_ns)
        owned = set(self.owned)
        if state == "failed":
            outcome = store.report_failure(vf, instance, assigned)[0]
        elif state == "succeeded":
            cleared, rescinded = store.report_success(vf, instance, assigned)
            outcome = "rescinded" if rescinded else "cleared" if cleared else "unchanged"
            if rescinded:
                owned.discard(vf)
        elif state == "quarantined":
            record = store.records.get(vf)
            if record is not None and record.quarantined_at is not None:
                outcome = "unchanged"
            else:
                if record is None:
                    record = store.records[vf] = sim.Record(vf)
                record.quarantined_at = sim.GoTime(now_ns, 0)
                store._write()
                owned.add(vf)
                outcome = "quarantined"
        else:
            record = store.records.get(vf)
            if record is None:
                outcome = "unchanged"
            elif owned_only and record.quarantined_at is not None and vf not in owned:
                outcome = "skipped_not_owned"
            else:
                del store.records[vf]
                store._write()
                owned.discard(vf)
                outcome = "cleared"
        return outcome, owned

    def task(self, crash, state, vf_index, **args):
        vf = self.vfs[vf_index]
        now_ns = self.tick()
        module_args = dict(state=state, vf_addresses=[vf])
        for key in ("instance", "assigned"):
            if key in args:
                module_args["instance_id" if key == "instance" else "assigned_at"] = args[key]
        if "owned_only" in args:
            module_args["owned_only"] = args["owned_only"]
        result = self.run_module(now_ns, crash, **module_args)
        if result is None and crash == "before-rename":
            return  # killed before the rename: neither the store nor (in effect) the ledger changed
        outcome, owned = self.model(state, vf, now_ns, **args)
        if result is None:
            self.owned = owned  # killed after the rename: the change is there, its intent says whose
            return
        # A run that writes nothing has no rename to be killed around: it simply completed.
        assert not result.get("failed"), result["msg"]
        assert result["outcomes"] == {vf: outcome}, (result, outcome)
        self.owned = owned
        assert _ledger.read_ledger(self.state_dir).pending() == []
        before = self.read(self.path)
        again = self.run_module(self.tick(), **module_args)
        assert again["changed"] is False and again["settled"] == [], again
        assert self.read(self.path) == before

    # -- rules -----------------------------------------------------------------------------------

    @rule(crash=CRASH, vf_index=VF_INDEX, instance=INSTANCE, assigned=ASSIGNED)
    def failed(self, crash, vf_index, instance, assigned):
        self.task(crash, "failed", vf_index, instance=instance, assigned=assigned)

    @rule(crash=CRASH, vf_index=VF_INDEX, instance=INSTANCE, assigned=ASSIGNED)
    def succeeded(self, crash, vf_index, instance, assigned):
        self.task(crash, "succeeded", vf_index, instance=instance, assigned=assigned)

    @rule(crash=CRASH, vf_index=VF_INDEX)
    def quarantined(self, crash, vf_index):
        self.task(crash, "quarantined", vf_index)

    @rule(crash=CRASH, vf_index=VF_INDEX, owned_only=st.booleans())
    def absent(self, crash, vf_index, owned_only):
        self.task(crash, "absent", vf_index, owned_only=owned_only)

    @rule(threshold=THRESHOLD)
    def threshold_changes(self, threshold):
        """The configured threshold changes; the tasks run at it before hypeman restarts (they re-evaluate)."""
        self.threshold = threshold

    @rule(threshold=THRESHOLD)
    def hypeman_restarts(self, threshold):
        """hypeman restarts with another threshold: it loads the file, re-evaluates and rewrites it."""
        self.threshold = threshold
        now_ns = self.tick()
        self.hypeman(self.path, now_ns)
        self.hypeman(self.model_path, now_ns)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def store_is_the_models_and_valid(self):
        data = self.read(self.path)
        assert data == self.read(self.model_path)
        store = _store.load_store(self.path)
        assert store.valid and (data is None or store.to_bytes() == data), store.error

    @invariant()
    def ownership_is_exact(self):
        store = _store.load_store(self.path)
        ledger = _ledger.read_ledger(self.state_dir)
        assert set(_ledger.owned_quarantines(ledger, store)) == self.owned
        assert self.owned <= set(store.quarantined())
        assert ledger.problems == []


TestStoreStateful = StoreMachine.TestCase
TestStoreStateful.settings = settings(
    max_examples=settings().max_examples if LONG else 60,
    stateful_step_count=settings().stateful_step_count if LONG else 20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=settings().database if LONG else None,  # no example database in the tree for make test
)
