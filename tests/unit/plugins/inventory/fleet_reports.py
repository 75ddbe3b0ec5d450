# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real fleet reports for the inventory tests (test equipment).

The hosts are the fleet_audit target's simulated trees (its ``build_host``: two
A100 cards, one problem class per host); each is audited with the host audit
the ``host_audit_info`` module runs, and the report is built and rendered with
the code the audit playbook's filters call. No shape here is typed by hand, so
the tests follow the report when it changes.
"""

from __future__ import annotations

import importlib.util
import json
import os

from ansible_collections.hypeman.vgpu.plugins.module_utils import _audit
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as _report

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
FIXTURE = os.path.join(ROOT, "tests", "integration", "targets", "fleet_audit", "fleet_fixture.py")
_fixture = None


def fixture():
    """The fleet_audit target's fleet_fixture module."""
    global _fixture  # pylint: disable=global-statement  # loaded once per process
    if _fixture is None:
        spec = importlib.util.spec_from_file_location("fleet_fixture", FIXTURE)
        _fixture = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_fixture)
    return _fixture


def audit_result(root, problem):
    """``host_audit_info``'s result for a simulated host with ``problem`` under ``root``."""
    tree, _codes = fixture().build_host(root, problem)
    paths = getattr(tree, "inventory_paths", {})
    data_dir = paths.get("hypeman_vgpu_data_dir", tree.data_dir)
    audit_paths = _audit.Paths(data_dir, os.path.join(data_dir, "gpu", "vf-health.json"),
                               paths.get("hypeman_vgpu_sysfs_root", tree.sysfs_root), tree.proc_root,
                               tree.dev_root, tree.state_dir, tree.config_path)
    result, _warnings = _audit.audit_host(audit_paths, hypeman_expected=False)
    return result


def build_report(directory, problems, unreachable=(), generated_at="2026-08-31T12:00:00Z", kind="audit"):
    """The fleet report over hosts ``<problem>-<index>`` (one per problem) and unreachable hosts."""
    entries = []
    for index, problem in enumerate(problems):
        name = "%s-%03d" % (problem, index)
        entries.append(_report.host_entry(audit_result(os.path.join(directory, "hosts", name), problem), name,
                                          generated_at))
    for name in unreachable:
        entries.append(_report.host_entry({"unreachable": True, "msg": "ssh: connect to host %s port 22: "
                                           "Connection refused" % name}, name))
    return _report.build_report(entries, kind, generated_at)


def write_report(path, report):
    with open(path, "w") as handle:
        handle.write(_report.to_json(report))
    return path


def write_json(path, document):
    with open(path, "w") as handle:
        json.dump(document, handle)
    return path
