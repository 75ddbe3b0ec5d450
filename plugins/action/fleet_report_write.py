# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the fleet report and write its files on the controller, without a module run (docs: modules/fleet_report_write.py)."""

from __future__ import annotations

import os

from ansible.errors import AnsibleFilterError
from ansible.plugins.action import ActionBase

from ansible_collections.hypeman.vgpu.plugins.filter.fleet import fleet_render, fleet_report
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as _report

# ``report``: a report built by the fleet_report filter; or ``hosts`` and the
# filter's other arguments: built here from hostvars, so the per-host part of a
# fleet's report never travels as a task argument or a fact (each costs a pass
# over every value of it).
ARGUMENT_SPEC = {
    "report": {"type": "dict"},
    "hosts": {"type": "list", "elements": "str"},
    "kind": {"type": "str", "default": "audit"},
    "generated_at": {"type": "str"},
    "check_mode": {"type": "bool", "default": False},
    "policies": {"type": "raw"},
    "report_dir": {"type": "str"},
    "formats": {"type": "list", "elements": "str", "default": ["json", "markdown", "html"]},
    "fact": {"type": "str", "default": "fleet_reconcile_entry"},
    "result": {"type": "str"},
    "max_age": {"type": "raw"},
    "history_keep": {"type": "raw", "default": 0},
}


class ActionModule(ActionBase):
    """Render each format the report names in ``reports`` and write it where it says."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC,
                                                        mutually_exclusive=[("report", "hosts")],
                                                        required_one_of=[("report", "hosts")])
        if args["hosts"] is not None:
            try:
                report = fleet_report(task_vars["hostvars"], args["hosts"], kind=args["kind"],
                                      generated_at=args["generated_at"], check_mode=args["check_mode"],
                                      policies=args["policies"], report_dir=args["report_dir"],
                                      formats=args["formats"], fact=args["fact"], result=args["result"],
                                      max_age=args["max_age"], history_keep=args["history_keep"])
            except AnsibleFilterError as err:
                return dict(result, failed=True, msg=str(err))
        else:
            report = args["report"]
        reports = report.get("reports") or {}
        if not isinstance(reports, dict):
            return dict(result, failed=True, msg="report.reports is %r; expected a mapping of format to path"
                        % (type(reports).__name__,))
        history = report.get("history") if isinstance(report.get("history"), dict) else {}
        record_file = history.get("record_file")
        try:
            files = dict((str(path), fleet_render(report, fmt)) for fmt, path in reports.items())
            if record_file:
                files[str(record_file)] = fleet_render(report, "history")
        except AnsibleFilterError as err:
            return dict(result, failed=True, msg=str(err))
        # The report directory: a history directory below it is never followed as a symlink.
        root = args["report_dir"] or (os.path.dirname(str(history["dir"])) if history.get("dir") else None)
        warnings = []
        try:
            written, unchanged = _report.write_reports(files, root=root, warnings=warnings)
            # Only records the history reader listed, and only inside the history directory.
            deleted = _report.delete_history_records(history.get("dir"), history.get("expired") or [])
        except OSError as err:
            return dict(result, failed=True, msg="cannot write the fleet report %s: %s"
                        % (err.filename or "", err.strerror or err))
        # The report is this job's output, not a change to a managed host (check mode writes it too).
        if warnings:
            result["warnings"] = list(result.get("warnings") or []) + warnings
        return dict(result, changed=False, written=written, unchanged=unchanged, history_deleted=deleted,
                    report=dict((key, value) for key, value in report.items() if key != "hosts"))
