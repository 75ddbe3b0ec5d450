# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet_report_write action as the fleet_reconcile role runs it: one bad host or a hostile report
directory gives a clean result (the report for the others, or a message naming the path), never a
traceback, a hang or a file written elsewhere."""

from __future__ import annotations

import os
from unittest import mock

from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.template import Templar

from ansible_collections.hypeman.vgpu.plugins.action.fleet_report_write import ActionModule
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector, tree_fingerprint

NOW = "2026-09-01T10:00:00Z"
GOOD = {"store": {"valid": True, "quarantined": []}, "issues": [], "needs_action": False}


def run(args, hostvars=None):
    task = Task()
    task.args = args
    task.action = "hypeman.vgpu.fleet_report_write"
    loader = DataLoader()
    action = ActionModule(task, mock.MagicMock(), PlayContext(), loader, Templar(loader), None)
    return action.run(task_vars={"hostvars": hostvars or {}})


def role_args(report_dir):
    return {"hosts": ["bad", "good"], "result": "run", "generated_at": NOW, "report_dir": str(report_dir),
            "history_keep": 3}


def test_a_malformed_host_result_is_that_hosts_failure_in_the_written_report(tmp_path):
    result = run(role_args(tmp_path), {"bad": {"run": {"store": "garbage", "issues": []}}, "good": {"run": GOOD}})
    assert not result.get("failed") and len(result["written"]) == 4
    assert result["report"]["summary"]["failed"] == ["bad"] and result["report"]["summary"]["hosts_ok"] == 1
    text = (tmp_path / "fleet-audit.md").read_text()
    assert 'store is "garbage"; expected the store section (an object)' in text


def test_a_fifo_where_a_report_goes_fails_the_task_naming_it(tmp_path):
    os.mkfifo(str(tmp_path / "fleet-audit.html"))
    before = tree_fingerprint(str(tmp_path))
    with hang_detector(20, "fleet_report_write"):
        result = run(role_args(tmp_path), {"bad": {"run": GOOD}, "good": {"run": GOOD}})
    assert result["failed"] and result["msg"] == (
        "cannot write the fleet report %s: is a FIFO, not a regular file; expected a regular file (or none) where "
        "the report goes" % (tmp_path / "fleet-audit.html"))
    assert tree_fingerprint(str(tmp_path)) == before


def test_a_record_file_through_a_symlinked_history_directory_is_refused(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    os.symlink(str(elsewhere), str(out / "history"))
    built = run(role_args(out), {"bad": {"run": GOOD}, "good": {"run": GOOD}})
    assert built["report"]["history"]["record_file"] is None and len(built["written"]) == 3
    # A report (task argument) that still names a record there.
    report = dict(built["report"], hosts=[])
    report["history"] = dict(report["history"], record_file=str(out / "history" / "fleet-audit-x.json"))
    result = run({"report": report})
    assert result["failed"] and "history: is a symlink" in result["msg"]
    assert os.listdir(str(elsewhere)) == []
