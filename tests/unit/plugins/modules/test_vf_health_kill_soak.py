# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A bounded run of the kill -9 soak (tests/soak/kill_writers.py): vf_health killed with SIGKILL
at random instants loses no ownership, never leaves a corrupt store, a temporary file or an
unsettled intent, and every task re-run afterwards has its effect."""

from __future__ import annotations

import importlib.util
import io
import os

SOAK = os.path.join(os.path.dirname(__file__), *([os.pardir] * 3), "soak", "kill_writers.py")


def load_soak():
    spec = importlib.util.spec_from_file_location("kill_writers", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_thirty_random_kills_lose_nothing(tmp_path):
    # exec mode: a fresh interpreter per run, as Ansible runs modules (forking a pytest worker,
    # which may have threads, could deadlock the child).
    soak = load_soak()
    out = io.StringIO()
    counts, failures = soak.soak(30, mode="exec", seed=20260820, workdir=str(tmp_path), out=out)
    assert counts["kills"] == 30 and counts["killed_mid_run"] > 0, (counts, out.getvalue())
    assert [name for name in soak.FAILURE_CHECKS if counts[name]] == [], failures


def test_the_checks_catch_a_lost_ledger_entry(tmp_path):
    """The soak's own checks fail when ownership is lost (here: a drain's ledger entries removed)."""
    soak = load_soak()
    runner = soak.Soak(str(tmp_path / "host"), "exec", None, io.StringIO())
    name, args = runner.task(0)
    assert runner.complete(name, args)["changed"] is True
    runner.check(0, name)
    assert runner.failures == []
    os.unlink(os.path.join(runner.tree.state_dir, "ledger.jsonl"))
    runner.check(0, name)
    assert runner.counts["lost_ownership"] == 2 and "quarantined, latest ledger entry None" in runner.failures[0]
