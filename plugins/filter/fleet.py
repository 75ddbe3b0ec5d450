# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the fleet audit, reconcile and vgpu_host roles (docs in the sidecar .yml files)."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.utils.display import Display

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures as _pictures
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as _report
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import hypeman_config as _config


def _plain(value):
    """Ansible's lazy containers as plain dicts and lists."""
    if isinstance(value, Mapping):
        return dict((k, _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def fleet_host_entry(result, host, audited_at=None, actions=None):
    return _report.host_entry(_plain(result), str(host), audited_at, _plain(actions))


def _age_seconds(audited_at, generated_at):
    try:
        return _gotime.parse_rfc3339(generated_at).sec - _gotime.parse_rfc3339(audited_at).sec
    except (TypeError, ValueError):
        return None


def fleet_report(hostvars, hosts, kind="audit", generated_at=None, check_mode=False, policies=None,
                 report_dir=None, formats=("json", "markdown", "html"), fact="fleet_reconcile_entry", result=None,
                 max_age=None, history_keep=0):
    entries = []
    for host in hosts:
        try:
            host_vars = hostvars[host] if host in hostvars else {}
            fresh = _plain(host_vars.get(result)) if result else None
            # A fact from AWX's fact cache may only be under ansible_facts.
            entry = _plain(host_vars.get(fact) or (host_vars.get("ansible_facts") or {}).get(fact))
        except Exception as err:  # pylint: disable=broad-except  # a host var that fails to template
            raise AnsibleFilterError("fleet_report: cannot read the audit result of %s: %s" % (host, err))
        if isinstance(fresh, dict) and fresh:
            # This run's own result wins over anything cached.
            entries.append(_report.host_entry(fresh, str(host), generated_at))
            continue
        if not isinstance(entry, dict) or "issues" not in entry:
            entries.append(_report.no_data_entry(str(host)))
            continue
        if max_age not in (None, "") and generated_at:
            age = _age_seconds(entry.get("audited_at"), generated_at)
            if age is None or age > int(max_age):
                stale = _report.no_data_entry(str(host))
                stale["issues"][0]["message"] = "the last audit result (%s) is older than %s seconds" % (
                    entry.get("audited_at") or "no time", max_age)
                entries.append(stale)
                continue
        entries.append(entry)
    try:
        reports = _report.report_paths(report_dir, kind, _plain(formats))
        report = _report.build_report(entries, kind, generated_at, check_mode, _plain(policies), reports)
    except _report.ReportError as err:
        raise AnsibleFilterError(str(err))
    try:
        keep = int(history_keep or 0)
    except (TypeError, ValueError):
        raise AnsibleFilterError("fleet_report: history_keep %r; expected a whole number of reports" % (history_keep,))
    if keep > 0 and report_dir:
        try:
            _pictures.attach_history(report, str(report_dir), keep)
        except _pictures.HistoryError as err:
            raise AnsibleFilterError("fleet_report: %s" % err)
        for warning in report["history"]["warnings"]:
            Display().warning(warning)
    return report


def _history_record(report):
    return _pictures.to_json(_pictures.history_record(report))


_RENDERERS = {"json": _report.to_json, "markdown": _report.render_markdown, "html": _report.render_html,
              "prometheus": _report.render_prometheus, "history": _history_record}


def fleet_render(data, fmt="markdown"):
    if fmt not in _RENDERERS:
        raise AnsibleFilterError("fleet_render: format %r; expected one of %s" % (fmt, ", ".join(sorted(_RENDERERS))))
    return _RENDERERS[fmt](_plain(data))


def fleet_policy_check(policies):
    try:
        return [p["text"] for p in _report.parse_policies(_plain(policies))]
    except _report.ReportError as err:
        raise AnsibleFilterError(str(err))


def fleet_hosts_overriding(hostvars, hosts, expected):
    """The hosts whose own variables give any name in ``expected`` another value than ``expected`` does.

    A host whose variables cannot be read counts as overriding: the caller then
    evaluates that host in its own context, where the error shows.
    """
    if not isinstance(expected, Mapping):
        raise AnsibleFilterError("fleet_hosts_overriding: expected %r; expected a mapping of variable names to values"
                                 % (expected,))
    wanted = [(name, _plain(value)) for name, value in expected.items()]
    overriding = []
    for host in hosts:
        try:
            host_vars = hostvars[host] if host in hostvars else {}
            differs = any(name in host_vars and _plain(host_vars[name]) != value for name, value in wanted)
        except Exception:  # pylint: disable=broad-except  # a host var that fails to template
            differs = True
        if differs:
            overriding.append(str(host))
    return overriding


def _names(value):
    """A list, or a comma- or newline-separated string (AWX multiselect surveys send one)."""
    if isinstance(value, str):
        return [part.strip() for part in value.replace("\n", ",").split(",") if part.strip()]
    return list(_plain(value))


def fleet_repair_plan(result, repairs=_report.REPAIRS):
    try:
        return _report.repair_plan(_plain(result), _names(repairs))
    except _report.ReportError as err:
        raise AnsibleFilterError(str(err))


def hypeman_config_threshold(text, threshold, where="hypeman config"):
    try:
        return _config.set_threshold(str(text), threshold if isinstance(threshold, bool) else int(threshold),
                                     str(where))
    except (ValueError, TypeError) as err:
        raise AnsibleFilterError("hypeman_config_threshold: %s" % err)


class FilterModule(object):
    def filters(self):
        return {
            "fleet_host_entry": fleet_host_entry,
            "fleet_hosts_overriding": fleet_hosts_overriding,
            "fleet_report": fleet_report,
            "fleet_render": fleet_render,
            "fleet_policy_check": fleet_policy_check,
            "fleet_repair_plan": fleet_repair_plan,
            "hypeman_config_threshold": hypeman_config_threshold,
        }
