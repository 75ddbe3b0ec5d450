# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report, built once on the controller from every host's audit.

Pure data in, data or text out, so the filters stay thin and the logic is
unit-tested without a playbook. The issue codes come from
``module_utils/_audit.py`` (host side); this adds the controller-side ones
(``unreachable``, ``audit_failed``, ``no_data``) and the fleet view: hosts
needing action first, the summary AWX publishes through ``set_stats``, the
``audit_fail_on`` policies, and the Markdown, HTML and Prometheus renderings.
"""

from __future__ import annotations

import errno
import html
import json
import math
import os
import re
import shlex
import stat

from ansible_collections.hypeman.vgpu.plugins.module_utils import _fileio, _gotime, _pci, _safedir
from ansible_collections.hypeman.vgpu.plugins.module_utils._audit import issue as _issue

REPORT_SCHEMA = 1
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2, "ok": 3}
REPAIRS = ("store", "sentinel", "reevaluate")


class ReportError(ValueError):
    """Bad input to the report (for example an unknown policy)."""


# --- one host -----------------------------------------------------------------------------------

_ENTRY_KEYS = ("threshold", "threshold_source", "errors", "store", "placement", "capacity", "sentinel", "hypeman",
               "api", "prerequisites", "footprint", "issues", "needs_action", "at_risk_vfs", "wedge_signals",
               "metrics")


def host_entry(result, host, audited_at=None, actions=None):
    """A host's report entry from its registered ``host_audit_info`` result.

    An unreachable host or a failed audit becomes an entry with one critical
    issue; neither stops the fleet report. Nor does a result of the wrong
    shape (another collection version, a modified module, a hostile host):
    it becomes the host's ``audit_failed`` entry naming the bad field. A
    sentinel counter that is not a finite number counts as unreadable
    metrics (``metrics_unreadable``) and the rest of the audit is kept.
    """
    entry = {"host": host, "audited_at": audited_at,
             "actions": list(actions) if isinstance(actions, (list, tuple)) else []}
    for key in _ENTRY_KEYS:
        entry[key] = None
    result = result if isinstance(result, dict) else {}
    problem = _actions_problem(actions or [])
    if problem:
        entry["actions"] = []
        result = {"failed": True, "msg": "the reconcile actions are unusable: %s" % problem}
    elif not result.get("unreachable") and not result.get("failed") and "store" in result:
        try:
            check_sections(result)
        except ReportError as err:
            result = {"failed": True, "msg": "the host's audit result is unusable: %s" % err}
    if result.get("unreachable"):
        entry["status"] = "unreachable"
        entry["issues"] = [_issue("critical", "unreachable", "host unreachable: %s" % _msg(result),
                                  "check the connection to the host (SSH, DNS, credentials)")]
    elif result.get("failed") or "store" not in result:
        entry["status"] = "failed"
        entry["issues"] = [_issue("critical", "audit_failed", "audit failed: %s" % _msg(result),
                                  "run the audit on this host with -vvv and fix what it says")]
    else:
        for key in _ENTRY_KEYS:
            entry[key] = result.get(key)
        entry["issues"] = [_clipped_issue(item) for item in result.get("issues") or []]
        entry["status"] = "needs_action" if result.get("needs_action") else "ok"
        _drop_unusable_metrics(entry)
    failed = [a for a in entry["actions"] if a.get("failed")]
    if failed:
        entry["issues"].insert(0, _issue("critical", "reconcile_failed", "repair failed: %s" % "; ".join(
            "%s %s: %s" % (a.get("kind"), a.get("target") or "", a.get("detail") or "") for a in failed),
            "read the reconcile job's output for this host; the store was left as the failed step left it"))
        if entry["status"] == "ok":
            entry["status"] = "needs_action"
    entry["needs_action"] = entry["status"] != "ok"
    entry["severity"] = _worst(entry["issues"])
    return entry


# --- checking a host's result ---------------------------------------------------------------------
# A module result or a cached entry comes from a host (or an older collection, or an edited fact
# cache): every part the report reads is checked before it is used, so one bad host becomes that
# host's failed entry instead of failing the whole fleet's report. The field checks are
# fleet_inventory's, which reads the same entries back from fleet-audit.json.

_STATUSES = ("ok", "needs_action", "unreachable", "failed", "no_data")
_SHOWN = 80


def _shown(value):
    """A bad value as the error shows it: JSON, cut at _SHOWN characters."""
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        text = "a %s" % type(value).__name__
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def _value_at(where, top, value):
    """The value ``where`` (``top.a[2].b``) names inside ``value`` (the value of ``top``): None for a missing
    key (a check takes it as null), ``value`` itself when ``where`` cannot be followed."""
    if not where.startswith(top):
        return value
    found = value
    for name, index in re.findall(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[([0-9]+)\]", where[len(top):]):
        if not index and isinstance(found, dict):
            found = found.get(name)
        elif index and isinstance(found, list) and int(index) < len(found):
            found = found[int(index)]
        else:
            return value
    return found


def _checked(check, where, value, *args):
    """``check(where, value, *args)`` (a fleet_inventory check); its error as ReportError showing the bad value."""
    from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_inventory  # it imports this module

    try:
        return check(where, value, *args)
    except fleet_inventory.FleetInputError as err:
        text = str(err)
        match = re.match(r"^(\S+) is [^;]*; expected (.*)$", text, re.S)
        if not match:
            raise ReportError("%s, got %s" % (text, _shown(value))) from err
        # The value itself instead of its type's name (a templated string's type is Ansible's own class).
        raise ReportError("%s is %s; expected %s" % (
            match.group(1), _shown(_value_at(match.group(1), where, value)), match.group(2))) from err


def _finite(value):
    """A number the report can print and count: not a bool, not NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (
        isinstance(value, int) or math.isfinite(value))


def _optional(where, value, kind, what):
    """``value`` when it is None or a ``kind``; ReportError naming it otherwise."""
    if value is not None and not isinstance(value, kind):
        raise ReportError("%s is %s; expected %s" % (where, _shown(value), what))
    return value


def _clip(text):
    """A message within the length fleet_inventory reads back (the rest of a huge one is cut)."""
    from ansible_collections.hypeman.vgpu.plugins.plugin_utils.fleet_inventory import _MAX_TEXT

    return text if not isinstance(text, str) or len(text) <= _MAX_TEXT else text[:_MAX_TEXT - 1] + "\u2026"


def _clipped_issue(item):
    return dict(item, message=_clip(item.get("message")), action=_clip(item.get("action")))


def _strings(where, value):
    from ansible_collections.hypeman.vgpu.plugins.plugin_utils.fleet_inventory import _text

    for index, item in enumerate(_optional(where, value, list, "an array of strings") or []):
        _checked(_text, "%s[%d]" % (where, index), item)


def _objects(where, value, what):
    items = _optional(where, value, list, "an array of %s" % what) or []
    for index, item in enumerate(items):
        _optional("%s[%d]" % (where, index), item, dict, what)
    return items


def _actions_problem(actions):
    if not isinstance(actions, (list, tuple)):
        return "actions is %s; expected an array of actions" % _shown(actions)
    for index, action in enumerate(actions):
        if not isinstance(action, dict):
            return "actions[%d] is %s; expected an action object {kind, target, changed, failed, detail}" % (
                index, _shown(action))
    return None


def check_sections(data):
    """Raise ReportError naming the first part of a host's result (or entry) the report cannot use.

    Only types are checked, and only of what the report reads; a missing or
    null section or field is what an older audit or a failed section gives.
    """
    from ansible_collections.hypeman.vgpu.plugins.plugin_utils.fleet_inventory import (
        _capacity, _count, _gpu, _issue, _text)

    issues = _optional("issues", data.get("issues"), list, "an array of issues") or []
    for index, item in enumerate(issues):
        if isinstance(item, dict):
            item = _clipped_issue(item)
        _checked(_issue, "issues[%d]" % index, item)
    store = _optional("store", data.get("store"), dict, "the store section (an object)")
    if store is not None:
        _optional("store.valid", store.get("valid"), bool, "true or false")
        for key in ("quarantined", "owned", "by_hypeman", "would_quarantine", "stale_records"):
            _strings("store." + key, store.get(key))
        _optional("store.below_threshold", store.get("below_threshold"), dict, "an object of VF: failures")
    placement = _optional("placement", data.get("placement"), dict, "the placement section (an object)")
    if placement is not None:
        _checked(_text, "placement.placement_disabled_reason", placement.get("placement_disabled_reason"), True)
        for index, gpu in enumerate(_optional("placement.gpus", placement.get("gpus"), list, "an array of cards")
                                    or []):
            where = "placement.gpus[%d]" % index
            _checked(_gpu, where, gpu)
            for key in ("sriov_totalvfs", "below_threshold_vfs"):
                _checked(_count, "%s.%s" % (where, key), gpu.get(key))
            for key in ("drained", "idle", "overflow_only"):
                _optional("%s.%s" % (where, key), gpu.get(key), bool, "true or false")
    capacity = data.get("capacity")
    if capacity is not None:
        _checked(_capacity, "capacity", capacity)
        if not _finite(capacity["lost_pct"]) or not 0 <= capacity["lost_pct"] <= 100:
            raise ReportError("capacity.lost_pct is %s; expected a percentage from 0 to 100"
                              % _shown(capacity["lost_pct"]))
    sentinel = _optional("sentinel", data.get("sentinel"), dict, "the sentinel section (an object)")
    if sentinel is not None:
        for index, finding in enumerate(_objects("sentinel.findings", sentinel.get("findings"), "a finding object")):
            _checked(_text, "sentinel.findings[%d].verdict" % index, finding.get("verdict"), True)
        _optional("sentinel.unreported", sentinel.get("unreported"), list, "an array of findings")
    for index, item in enumerate(_objects("at_risk_vfs", data.get("at_risk_vfs"), "an object {vf, card, reason, "
                                          "time}")):
        for key, optional in (("vf", False), ("card", True), ("reason", False), ("time", True)):
            _checked(_text, "at_risk_vfs[%d].%s" % (index, key), item.get(key), optional)
    for key in ("wedge_signals", "metrics", "footprint", "hypeman", "api"):
        _optional(key, data.get(key), dict, "the %s section (an object)" % key)
    _optional("footprint.not_vgpu", (data.get("footprint") or {}).get("not_vgpu"), bool, "true or false")
    _optional("hypeman.running", (data.get("hypeman") or {}).get("running"), bool, "true or false")
    _optional("api.mismatches", (data.get("api") or {}).get("mismatches"), list, "an array of mismatches")
    return data


_SAMPLE_NUMBERS = ("init_failures", "quarantines", "quarantined_vfs")


def metrics_problem(metrics):
    """Why hypeman's numbers in a host's ``metrics`` section cannot be shown (None when they can).

    A counter that is NaN, infinite or not a number at all (legal Prometheus
    text, or a host older than the check) must not reach the renderers.
    """
    if not isinstance(metrics, dict):
        return None
    sample = metrics.get("sample")
    if sample is not None:
        if not isinstance(sample, dict):
            return "metrics.sample is %s; expected an object" % _shown(sample)
        checks = sample.get("checks")
        if checks is not None and not isinstance(checks, dict):
            return "metrics.sample.checks is %s; expected an object of result: count" % _shown(checks)
        for name, value in sorted((checks or {}).items()):
            if not _finite(value):
                return "hypeman's sentinel check counter for result %s is %s; expected a finite number" % (
                    _shown(name), _shown(value))
        for key in _SAMPLE_NUMBERS:
            if sample.get(key) is not None and not _finite(sample[key]):
                return "metrics.sample.%s is %s; expected a finite number" % (key, _shown(sample[key]))
    stored = metrics.get("store_quarantined")
    if stored is not None and not (isinstance(stored, int) and not isinstance(stored, bool) and stored >= 0):
        return "metrics.store_quarantined is %s; expected a count" % _shown(stored)
    return None


def _drop_unusable_metrics(entry):
    """Unusable hypeman numbers: the host's metrics count as unreadable (an issue), the rest of its audit stays."""
    problem = metrics_problem(entry.get("metrics"))
    if problem is None:
        return
    entry["metrics"] = dict(entry["metrics"], sample=None, error=problem)
    entry["issues"].append(_issue("warning", "metrics_unreadable", "hypeman's /metrics as read on the host: %s"
                                  % problem, "check what hypeman's /metrics exports on this host (metrics_url)"))
    if entry["status"] == "ok":
        entry["status"] = "needs_action"


def _unusable_entry(host, audited_at, why):
    return host_entry({"failed": True, "msg": why}, host, audited_at)


def checked_entry(entry, index=0):
    """``entry`` (a report host entry, e.g. from the fact cache) if the report can use it; else the host's
    failed entry naming the bad field. Unusable hypeman numbers become ``metrics_unreadable``."""
    from ansible_collections.hypeman.vgpu.plugins.plugin_utils.fleet_inventory import _expect, _text

    if not isinstance(entry, dict):
        return _unusable_entry("(entry %d)" % index, None, "the cached audit entry is %s; expected an object"
                               % _shown(entry))
    host = entry.get("host")
    if not isinstance(host, str) or not host:
        return _unusable_entry("(entry %d)" % index, None, "the cached audit entry's host is %s; expected a host "
                               "name" % _shown(host))
    audited_at = entry.get("audited_at") if isinstance(entry.get("audited_at"), str) else None
    try:
        if entry.get("status") not in _STATUSES:
            raise ReportError("status is %s; expected one of %s" % (_shown(entry.get("status")), ", ".join(_STATUSES)))
        if entry.get("severity") not in SEVERITY_ORDER:
            raise ReportError("severity is %s; expected critical, warning, info or ok" % _shown(entry.get("severity")))
        _checked(_expect, "needs_action", entry.get("needs_action"), bool, "true or false")
        _checked(_text, "audited_at", entry.get("audited_at"), True)
        _checked(_expect, "issues", entry.get("issues"), list, "an array of issues")
        actions = _checked(_expect, "actions", entry.get("actions"), list, "an array of actions")
        problem = _actions_problem(actions)
        if problem:
            raise ReportError(problem)
        check_sections(entry)
    except ReportError as err:
        return _unusable_entry(host, audited_at, "the cached audit entry is unusable: %s" % err)
    if metrics_problem(entry.get("metrics")) is not None:
        entry = dict(entry, issues=list(entry["issues"]))
        _drop_unusable_metrics(entry)
        entry["needs_action"] = entry["status"] != "ok"
        entry["severity"] = _worst(entry["issues"])
    return entry


def _msg(result):
    text = result.get("msg") or result.get("reason") or "no result"
    return str(text).strip().splitlines()[0] if str(text).strip() else "no result"


def _worst(issues):
    if not issues:
        return "ok"
    return min((issue["severity"] for issue in issues), key=lambda s: SEVERITY_ORDER.get(s, 9))


def no_data_entry(host):
    entry = host_entry({"failed": True}, host)
    entry["status"] = "no_data"
    entry["issues"] = [_issue("critical", "no_data", "no audit result for this host in this run or the fact cache",
                              "check that the per-host audit ran on it (job slices, limits, unreachable hosts)")]
    return entry


# --- the fleet -----------------------------------------------------------------------------------


def _sort_key(entry):
    issues = [i for i in entry["issues"] if i["severity"] != "info"]
    return (0 if entry["needs_action"] else 1, SEVERITY_ORDER.get(entry["severity"], 9), -len(issues),
            entry["host"])


REPORT_EXTENSIONS = {"json": "json", "markdown": "md", "html": "html"}


def report_paths(report_dir, kind, formats):
    """Where each report format is written: ``<dir>/fleet-<kind>.<ext>``; none without a directory."""
    unknown = [f for f in formats or [] if f not in REPORT_EXTENSIONS]
    if unknown:
        raise ReportError("unknown report format(s) %s; expected some of %s"
                          % (", ".join(unknown), ", ".join(sorted(REPORT_EXTENSIONS))))
    if not report_dir:
        return {}
    return dict((fmt, "%s/fleet-%s.%s" % (report_dir.rstrip("/"), kind, REPORT_EXTENSIONS[fmt])) for fmt in formats)


def build_report(entries, kind="audit", generated_at=None, check_mode=False, policies=None, reports=None):
    """The fleet report: hosts needing action first, a summary, and the policy verdict."""
    if kind not in ("audit", "reconcile"):
        raise ReportError("report kind %r; expected audit or reconcile" % (kind,))
    entries = sorted((checked_entry(entry, index) for index, entry in enumerate(entries)), key=_sort_key)
    report = {
        "schema": REPORT_SCHEMA,
        "kind": kind,
        "generated_at": generated_at,
        "check_mode": bool(check_mode),
        "summary": summarize(entries),
        "policy": {"fail_on": [], "violations": []},
        "reports": dict(reports or {}),
        "hosts": entries,
    }
    report["summary"]["reports"] = report["reports"]
    parsed = parse_policies(policies)
    report["policy"]["fail_on"] = [p["text"] for p in parsed]
    report["policy"]["violations"] = evaluate_policies(report, parsed)
    report["summary"]["policy_violations"] = report["policy"]["violations"]
    report["summary"]["failed_policy"] = bool(report["policy"]["violations"])
    return report


def sentinel_mode(entry):
    """The host's hypeman sentinel mode (markers, vsock, unknown) from its audit, or None when not audited."""
    mode = (entry.get("sentinel") or {}).get("sentinel_mode")
    return mode if mode in ("markers", "vsock", "unknown") else None


def sentinel_text(entry):
    """One line about the host's sentinel: mode and, when read, hypeman's own checks by result."""
    mode = sentinel_mode(entry)
    if mode is None:
        return None
    sentinel = entry["sentinel"]
    parts = ["sentinel %s (%s)" % (mode, sentinel.get("sentinel_mode_reason") or "-")]
    sample = (entry.get("metrics") or {}).get("sample")
    if sample:
        checks = sample.get("checks")
        parts.append("hypeman %s checks %s" % (sample.get("version") or "?", ", ".join(
            "%s %d" % (result, count) for result, count in sorted(checks.items())) if checks else "none exported"))
        parts.append("init failures %s, quarantines %s, quarantined VFs %s (store %s)" % tuple(
            "-" if value is None else int(value) for value in (
                sample.get("init_failures"), sample.get("quarantines"), sample.get("quarantined_vfs"),
                entry["metrics"].get("store_quarantined"))))
    return "; ".join(parts)


def summarize(entries):
    """The counts a dashboard or a downstream AWX workflow node needs."""
    summary = {
        "hosts_total": len(entries),
        "hosts_ok": 0, "hosts_needing_action": 0, "hosts_unreachable": 0, "hosts_failed": 0,
        "hosts_store_unavailable": 0, "hosts_api_unreachable": 0, "hosts_api_mismatch": 0,
        "hosts_hypeman_not_running": 0, "hosts_not_vgpu": 0,
        "quarantined_vfs": 0, "quarantined_owned": 0, "quarantined_by_hypeman": 0,
        "pending_quarantine_vfs": 0, "below_threshold_vfs": 0, "stale_records": 0,
        "cards_total": 0, "cards_ready_for_cycle": 0, "cards_overflow_only": 0, "cards_draining": 0,
        "cards_without_vfs": 0,
        "sentinel_failed": 0, "sentinel_unreported": 0, "at_risk_vfs": 0, "hosts_wedge_signals_unread": 0,
        "hosts_sentinel_markers": 0, "hosts_sentinel_vsock": 0, "hosts_sentinel_unknown": 0,
        "hosts_sentinel_coverage_lost": 0, "hosts_metrics_unreadable": 0,
        "slots_total": 0, "slots_allocatable": 0, "slots_quarantined": 0, "slots_lost": 0,
        "capacity_loss_pct": 0.0,
        "actions_taken": 0, "hosts_reconcile_failed": 0,
        "issues_by_code": {},
        "needing_action": [], "unreachable": [], "failed": [], "store_unavailable": [], "not_vgpu": [],
        "ready_for_cycle": [], "reconcile_failed": [], "at_risk": [], "sentinel_coverage_lost": [],
    }
    for entry in entries:
        host = entry["host"]
        status = entry["status"]
        if status == "ok":
            summary["hosts_ok"] += 1
        else:
            summary["hosts_needing_action"] += 1
            summary["needing_action"].append(host)
        if status == "unreachable":
            summary["hosts_unreachable"] += 1
            summary["unreachable"].append(host)
        elif status in ("failed", "no_data"):
            summary["hosts_failed"] += 1
            summary["failed"].append(host)
        codes = set()
        for issue in entry["issues"]:
            codes.add(issue["code"])
        for code in sorted(codes):
            summary["issues_by_code"][code] = summary["issues_by_code"].get(code, 0) + 1
        if "reconcile_failed" in codes:
            summary["hosts_reconcile_failed"] += 1
            summary["reconcile_failed"].append(host)
        if "store_unavailable" in codes:
            summary["hosts_store_unavailable"] += 1
            summary["store_unavailable"].append(host)
        summary["hosts_api_unreachable"] += "api_unreachable" in codes
        summary["hosts_api_mismatch"] += "api_mismatch" in codes
        summary["hosts_hypeman_not_running"] += "hypeman_not_running" in codes
        if "host_not_vgpu" in codes:
            summary["hosts_not_vgpu"] += 1
            summary["not_vgpu"].append(host)
        store = entry.get("store") or {}
        summary["quarantined_vfs"] += len(store.get("quarantined") or [])
        summary["quarantined_owned"] += len(store.get("owned") or [])
        summary["quarantined_by_hypeman"] += len(store.get("by_hypeman") or [])
        summary["pending_quarantine_vfs"] += len(store.get("would_quarantine") or [])
        summary["below_threshold_vfs"] += len(store.get("below_threshold") or {})
        summary["stale_records"] += len(store.get("stale_records") or [])
        for gpu in (entry.get("placement") or {}).get("gpus") or []:
            summary["cards_total"] += 1
            state = card_state(gpu)
            if state == "no_vfs":
                summary["cards_without_vfs"] += 1
            elif state == "ready_for_cycle":
                summary["cards_ready_for_cycle"] += 1
                summary["ready_for_cycle"].append({"host": host, "gpu": gpu["address"]})
            elif state == "draining":
                summary["cards_draining"] += 1
            elif state == "overflow_only":
                summary["cards_overflow_only"] += 1
        sentinel = entry.get("sentinel") or {}
        summary["sentinel_failed"] += len([f for f in sentinel.get("findings") or [] if f.get("verdict") == "failed"])
        summary["sentinel_unreported"] += len(sentinel.get("unreported") or [])
        for vf in entry.get("at_risk_vfs") or []:
            summary["at_risk_vfs"] += 1
            summary["at_risk"].append({"host": host, "vf": vf.get("vf"), "card": vf.get("card"),
                                       "reason": vf.get("reason"), "time": vf.get("time")})
        summary["hosts_wedge_signals_unread"] += "wedge_signals_unread" in codes
        mode = sentinel_mode(entry)
        if mode is not None:
            summary["hosts_sentinel_%s" % mode] += 1
        if "sentinel_coverage_lost" in codes:
            summary["hosts_sentinel_coverage_lost"] += 1
            summary["sentinel_coverage_lost"].append(host)
        summary["hosts_metrics_unreadable"] += "metrics_unreadable" in codes
        capacity = entry.get("capacity") or {}
        summary["slots_total"] += capacity.get("total_slots", 0)
        summary["slots_allocatable"] += capacity.get("allocatable_slots", 0)
        summary["slots_quarantined"] += capacity.get("quarantined_slots", 0)
        summary["slots_lost"] += capacity.get("lost_slots", 0)
        summary["actions_taken"] += len([a for a in entry.get("actions") or [] if a.get("changed")])
    if summary["slots_total"]:
        summary["capacity_loss_pct"] = round(100.0 * summary["slots_lost"] / summary["slots_total"], 2)
    return summary


# --- policies -------------------------------------------------------------------------------------

_POLICY_RE = re.compile(r"^\s*([a-z_]+)\s*(?:(>=|>)\s*([0-9]+(?:\.[0-9]+)?))?\s*$")
ISSUE_CODES = ("unreachable", "audit_failed", "no_data", "reconcile_failed", "audit_incomplete", "store_unavailable", "api_unreachable",
               "host_not_vgpu",
               "pending_quarantine", "stale_records", "sentinel_unreported", "card_ready_for_cycle",
               "card_without_vfs",
               "card_overflow_only", "unreadable_metadata", "unreadable_vfs", "api_mismatch", "hypeman_not_running",
               "prerequisite_failed", "quarantined_vfs", "below_threshold", "card_draining", "vf_at_risk",
               "wedge_signals_unread", "sentinel_coverage_lost", "metrics_unreadable", "quarantine_count_mismatch",
               "sentinel_evidence_incomplete")
_HOST_MEASURES = ("host_capacity_loss_pct",)


def _numeric_summary_keys():
    return sorted(k for k, v in summarize([]).items() if isinstance(v, (int, float)) and not isinstance(v, bool))


def parse_policies(policies):
    """``audit_fail_on`` as a list (or comma-separated string) of policies; raises ReportError on a bad one.

    A policy is an issue code (fails when any host has it), ``needs_action``
    (any host needs action), or ``<measure> > N`` / ``<measure> >= N`` with a
    numeric summary key (``capacity_loss_pct``, ``hosts_unreachable``, ...) or
    ``host_capacity_loss_pct`` (any single host).
    """
    if policies is None or policies == "":
        return []
    if isinstance(policies, str):
        policies = [p for p in policies.split(",") if p.strip()]
    if not isinstance(policies, (list, tuple)):
        raise ReportError("audit_fail_on must be a list of policies, got %s" % type(policies).__name__)
    parsed = []
    numeric = _numeric_summary_keys()
    for text in policies:
        match = _POLICY_RE.match(str(text))
        if not match:
            raise ReportError("audit_fail_on: cannot parse %r; expected an issue code, needs_action, or "
                              "'<measure> > N' such as 'capacity_loss_pct>10'" % (text,))
        name, op, value = match.groups()
        if op is None:
            if name != "needs_action" and name not in ISSUE_CODES:
                raise ReportError("audit_fail_on: unknown policy %r; known issue codes: %s; or needs_action"
                                  % (name, ", ".join(ISSUE_CODES)))
        elif name not in numeric and name not in _HOST_MEASURES:
            raise ReportError("audit_fail_on: unknown measure %r in %r; known: %s"
                              % (name, text, ", ".join(numeric + list(_HOST_MEASURES))))
        parsed.append({"text": str(text).strip(), "name": name, "op": op,
                       "value": float(value) if value is not None else None})
    return parsed


def _exceeds(measured, op, limit):
    return measured > limit if op == ">" else measured >= limit


def evaluate_policies(report, parsed):
    """Violations as ``{policy, message, hosts}``."""
    violations = []
    summary = report["summary"]
    for policy in parsed:
        name, op, limit = policy["name"], policy["op"], policy["value"]
        if op is None:
            if name == "needs_action":
                hosts = [e["host"] for e in report["hosts"] if e["needs_action"]]
            else:
                hosts = [e["host"] for e in report["hosts"] if any(i["code"] == name for i in e["issues"])]
            if hosts:
                violations.append({"policy": policy["text"], "hosts": hosts,
                                   "message": "%s on %d host(s): %s" % (name, len(hosts), ", ".join(hosts))})
        elif name == "host_capacity_loss_pct":
            hosts = [e["host"] for e in report["hosts"]
                     if e.get("capacity") and _exceeds(e["capacity"]["lost_pct"], op, limit)]
            if hosts:
                violations.append({"policy": policy["text"], "hosts": hosts,
                                   "message": "capacity loss %s %g%% on %s" % (op, limit, ", ".join(hosts))})
        elif _exceeds(summary[name], op, limit):
            violations.append({"policy": policy["text"], "hosts": [],
                               "message": "%s is %s (limit %s %g)" % (name, summary[name], op, limit)})
    return violations


# --- reconcile plan ------------------------------------------------------------------------------


def _ts_key(finding):
    try:
        when = _gotime.parse_rfc3339(finding.get("ts") or "")
        return (0, when.sec, when.nsec, finding["instance_id"])
    except ValueError:
        return (1, 0, 0, finding["instance_id"])


def repair_plan(result, repairs=REPAIRS):
    """The safe repairs for one host's audit result.

    ``repair_store``: the store is legacy or invalid (vf_health
    ``state=repaired`` keeps a backup and every recoverable VF quarantined);
    ``sentinel``: the verdicts whose report would change the store, in
    marker-time order, each as ``{effect, params}`` (vf_health parameters); ``reevaluate``: VFs
    hypeman's next load quarantines (applied by restarting a running hypeman).
    """
    unknown = [r for r in repairs if r not in REPAIRS]
    if unknown:
        raise ReportError("unknown repair(s) %s; expected some of %s" % (", ".join(unknown), ", ".join(REPAIRS)))
    plan = {"repair_store": False, "sentinel": [], "reevaluate": [], "hypeman_running": False, "skipped": []}
    if not isinstance(result, dict) or result.get("failed") or result.get("unreachable") or "store" not in result:
        plan["skipped"].append("no audit result: nothing is repaired on this host")
        return plan
    store = result["store"]
    plan["hypeman_running"] = bool((result.get("hypeman") or {}).get("running"))
    if not store["valid"]:
        if "store" in repairs:
            plan["repair_store"] = True
        else:
            plan["skipped"].append("store repair not allowed (repairs: %s)" % ", ".join(repairs))
    sentinel = result.get("sentinel") or {}
    pending = sorted(sentinel.get("unreported") or [], key=_ts_key)
    if pending and "sentinel" not in repairs:
        plan["skipped"].append("%d sentinel verdict(s) not reported: not allowed" % len(pending))
    elif pending:
        for finding in pending:
            plan["sentinel"].append({"effect": finding["effect"], "params": {
                "state": "failed" if finding["verdict"] == "failed" else "succeeded",
                "vf_addresses": [finding["vf_address"]], "instance_id": finding["instance_id"],
                "assigned_at": finding["assigned_at"],
                "reason": "sentinel verdict %s of instance %s (marker ts=%s)" % (
                    finding["verdict"], finding["instance_id"], finding["ts"]),
            }})
    if store.get("would_quarantine"):
        if "reevaluate" not in repairs:
            plan["skipped"].append("re-evaluation not allowed")
        else:
            plan["reevaluate"] = list(store["would_quarantine"])
    return plan


# --- rendering -----------------------------------------------------------------------------------

_SUMMARY_ROWS = (
    ("hosts_total", "Hosts"), ("hosts_needing_action", "Hosts needing action"),
    ("hosts_unreachable", "Unreachable hosts"), ("hosts_failed", "Hosts whose audit failed"),
    ("hosts_store_unavailable", "Hosts with placement disabled (store unavailable)"),
    ("hosts_not_vgpu", "Hosts where no hypeman vGPU host was found (check their paths)"),
    ("quarantined_vfs", "Quarantined VFs"), ("quarantined_owned", "  of which by this collection"),
    ("quarantined_by_hypeman", "  of which by hypeman"), ("pending_quarantine_vfs", "VFs pending quarantine"),
    ("below_threshold_vfs", "VFs with failures below the threshold"), ("stale_records", "Records for vanished VFs"),
    ("cards_ready_for_cycle", "Cards ready for an SR-IOV cycle"), ("cards_overflow_only", "Overflow-only cards"),
    ("cards_draining", "Cards draining"),
    ("cards_without_vfs", "Cards without VFs"), ("sentinel_failed", "Sentinel failure verdicts"),
    ("sentinel_unreported", "Sentinel verdicts not in the store"), ("at_risk_vfs", "VFs at risk of being wedged"),
    ("hosts_wedge_signals_unread", "Hosts whose wedge-risk signals could not be read"),
    ("hosts_sentinel_markers", "Hosts whose hypeman reads console markers"),
    ("hosts_sentinel_vsock", "Hosts whose hypeman polls guests over vsock"),
    ("hosts_sentinel_unknown", "Hosts whose sentinel mode is unknown"),
    ("hosts_sentinel_coverage_lost", "Hosts whose hypeman sentinel lost coverage"),
    ("hosts_metrics_unreadable", "Hosts whose hypeman metrics are unreadable"),
    ("hosts_api_mismatch", "Hosts where the API disagrees"),
    ("hosts_api_unreachable", "Hosts whose API is unreachable"), ("slots_total", "vGPU slots"),
    ("slots_lost", "Slots lost to quarantine"), ("capacity_loss_pct", "Capacity lost (%)"),
    ("actions_taken", "Repairs made"),
)


# Anything a Markdown renderer (or a terminal) takes as a line break: one table row or heading stays one line.
_MD_BREAKS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# Inline Markdown that host data could use (links, images, HTML, code, emphasis, table cells); an underscore
# only where it could open or close emphasis, so snake_case names stay readable.
_MD_SPECIAL = re.compile(r"[\\`*\[\]<>|~&]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def _md(text):
    """Host data as one line of inert Markdown text (a table cell, a heading, a list item)."""
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), _MD_BREAKS.sub(" ", str(text)))


def recover_command(host, gpu):
    """The copy-paste ``recover_gpu`` command for a card, shell-quoted; None unless ``gpu`` is a PCI address
    and ``host`` an inventory host name (fleet_inventory's rule) that a Markdown code span can show."""
    from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_inventory  # it imports this module

    if not isinstance(gpu, str) or not _pci.ADDRESS_RE.match(gpu):
        return None
    try:
        fleet_inventory.host_name("host", host)
    except fleet_inventory.FleetInputError:
        return None
    if set(host) & set("`{}"):  # a code span's end; a Jinja2 template in an extra var
        return None
    return "ansible-playbook hypeman.vgpu.recover_gpu -e %s -e %s" % (
        shlex.quote("target_hosts=" + host), shlex.quote("target_gpu=" + gpu))


def render_markdown(report):
    title = "hypeman vGPU fleet %s" % report["kind"]
    lines = ["# %s" % title, ""]
    lines.append("Generated %s%s. Hosts needing action come first." % (
        _md(report["generated_at"] or "-"), " (check mode: nothing was changed)" if report["check_mode"] else ""))
    lines.append("")
    summary = report["summary"]
    lines += ["## Summary", "", "| | |", "|---|---:|"]
    for key, label in _SUMMARY_ROWS:
        lines.append("| %s | %s |" % (label, summary[key]))
    lines.append("")
    policy = report["policy"]
    lines += ["## Policy", ""]
    if not policy["fail_on"]:
        lines.append("No `audit_fail_on` policy set.")
    elif not policy["violations"]:
        lines.append("Passed: %s." % ", ".join("`%s`" % p for p in policy["fail_on"]))
    else:
        lines.append("**Failed:**")
        lines.append("")
        lines += ["- `%s`: %s" % (v["policy"], _md(v["message"])) for v in policy["violations"]]
    lines.append("")
    history = report.get("history")
    if history:
        changes = history["changes"]
        lines += ["## Since the previous audit", "", "%s%s." % (
            "(%s) " % _md(changes["previous_at"]) if changes["previous_at"] else "", _md(changes["text"]))]
        for warning in history["warnings"]:
            lines += ["", "Warning: %s" % _md(warning)]
        lines.append("")
    if summary["ready_for_cycle"]:
        lines += ["## Cards ready for an SR-IOV cycle", ""]
        for item in summary["ready_for_cycle"]:
            command = recover_command(item["host"], item["gpu"])
            lines.append("- %s %s: %s" % (_md(item["host"]), _md(item["gpu"]), "`%s`" % command if command else
                                          "no command shown: the host name or card address is not a plain one"))
        lines.append("")
    attention = [e for e in report["hosts"] if e["needs_action"]]
    lines += ["## Hosts needing action (%d)" % len(attention), ""]
    if not attention:
        lines += ["None.", ""]
    for entry in attention:
        lines += _markdown_host(entry)
    fine = [e for e in report["hosts"] if not e["needs_action"]]
    lines += ["## Hosts without action needed (%d)" % len(fine), ""]
    if fine:
        lines += ["| Host | Quarantined VFs | Slots | Capacity lost | Sentinel | Notes |", "|---|---:|---:|---:|---|---|"]
        for entry in fine:
            store = entry.get("store") or {}
            capacity = entry.get("capacity") or {}
            lines.append("| %s | %d | %s | %s%% | %s | %s |" % (
                _md(entry["host"]), len(store.get("quarantined") or []), capacity.get("total_slots", "-"),
                capacity.get("lost_pct", "-"), _md(sentinel_text(entry) or "-"),
                _md("; ".join(i["message"] for i in entry["issues"])) or "-"))
    else:
        lines.append("None.")
    lines.append("")
    return "\n".join(lines)


def _markdown_host(entry):
    lines = ["### %s (%s)" % (_md(entry["host"]), entry["status"].replace("_", " ")), ""]
    lines += ["| Severity | Issue | What | Do |", "|---|---|---|---|"]
    for issue in entry["issues"]:
        lines.append("| %s | `%s` | %s | %s |" % (issue["severity"], issue["code"], _md(issue["message"]),
                                                  _md(issue["action"] or "-")))
    lines.append("")
    capacity = entry.get("capacity")
    if capacity:
        lines.append("Slots: %d total, %d allocatable, %d quarantined, %s%% lost." % (
            capacity["total_slots"], capacity["allocatable_slots"], capacity["quarantined_slots"], capacity["lost_pct"]))
        lines.append("")
    if sentinel_text(entry):
        lines += ["Sentinel: %s." % _md(sentinel_text(entry)), ""]
    gpus = (entry.get("placement") or {}).get("gpus") or []
    if gpus:
        lines += ["| Card | VFs | Quarantined | Allocatable | Claimed | State |", "|---|---:|---:|---:|---:|---|"]
        for gpu in gpus:
            cells = (gpu["address"], gpu["vf_total"], gpu["quarantined"], gpu["allocatable"], gpu["claimed"],
                     _card_state(gpu))
            lines.append("| %s | %s | %s | %s | %s | %s |" % tuple(_md(cell) for cell in cells))
        lines.append("")
    if entry.get("actions"):
        lines += ["Actions:", ""]
        lines += ["- %s" % _md(_action_text(a)) for a in entry["actions"]]
        lines.append("")
    return lines


def _without_vfs(gpu):
    return gpu.get("vf_total") == 0 and (gpu.get("sriov_totalvfs") or 0) > 0


# The one home of the card classification: the summary counts, the host tables and the
# health map (plugin_utils/fleet_pictures.py) all read it. Worst first where they overlap.
CARD_STATE_TEXT = {
    "no_vfs": "no VFs (SR-IOV off)",
    "placement_disabled": "placement disabled",
    "ready_for_cycle": "drained, idle: ready for cycle",
    "draining": "drained, busy",
    "overflow_only": "overflow-only",
    "below_threshold": "healthy",
    "healthy": "healthy",
}


def card_state(gpu):
    """A card's state from its placement figures (a key of :data:`CARD_STATE_TEXT`).

    ``below_threshold``: some unquarantined VFs carry failures below the
    threshold (``below_threshold_vfs``, absent from audits before it existed);
    hypeman still places on the card normally, so its table row says healthy.
    """
    if _without_vfs(gpu):
        return "no_vfs"
    if gpu.get("quarantined") is None:
        return "placement_disabled"
    if gpu.get("drained"):
        return "ready_for_cycle" if gpu.get("idle") else "draining"
    if gpu.get("overflow_only"):
        return "overflow_only"
    if gpu.get("below_threshold_vfs"):
        return "below_threshold"
    return "healthy"


def _card_state(gpu):
    return CARD_STATE_TEXT[card_state(gpu)]


HOST_DOWN = ("unreachable", "failed", "no_data")
# The health map's card states, worst first; the textfile's card_health gauge counts them from the end
# (healthy 0 ... store_unavailable 6; an unreachable host writes no textfile).
MAP_STATE_KEYS = ("unreachable", "store_unavailable", "ready_for_cycle", "draining", "no_vfs", "overflow_only",
                  "below_threshold", "healthy")
CARD_HEALTH_CODES = dict((key, len(MAP_STATE_KEYS) - 1 - index) for index, key in enumerate(MAP_STATE_KEYS))


def card_map_state(entry, gpu):
    """A card's state on the health map: its host's status first (unreachable, store unavailable), then its own."""
    if entry["status"] in HOST_DOWN:
        return "unreachable"
    state = card_state(gpu)
    if state == "placement_disabled" or any(i["code"] == "store_unavailable" for i in entry["issues"]):
        return "store_unavailable"
    return state


def _action_text(action):
    if action.get("failed"):
        state = "failed"
    elif action.get("changed"):
        state = "would do" if action.get("check_mode") else "done"
    else:
        state = "no change"
    return "%s %s: %s (%s)" % (action.get("kind"), action.get("target") or "", action.get("detail") or "", state)


_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1em}"
        "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}"
        ".critical{background:#fdd}.warning{background:#ffe9c6}.info{background:#eef4ff}.ok{background:#e5f6e5}"
        "h3{margin-bottom:.2em}code{background:#f4f4f4;padding:0 .2em}")


def render_html(report):
    # Imported here: fleet_pictures reads this module's card rules.
    from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures

    esc = html.escape
    summary = report["summary"]
    pictures_css, pictures = fleet_pictures.render_html_sections(report)
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           "<meta name=\"viewport\" content=\"width=device-width\">",
           "<title>hypeman vGPU fleet %s</title><style>%s%s</style></head><body>" % (
               esc(report["kind"]), _CSS, pictures_css),
           "<h1>hypeman vGPU fleet %s</h1>" % esc(report["kind"]),
           "<p>Generated %s%s. Hosts needing action come first.</p>" % (
               esc(str(report["generated_at"] or "-")),
               " (check mode: nothing was changed)" if report["check_mode"] else ""),
           pictures, "<h2>Summary</h2><table>"]
    for key, label in _SUMMARY_ROWS:
        out.append("<tr><th>%s</th><td>%s</td></tr>" % (esc(label.strip()), esc(str(summary[key]))))
    out.append("</table><h2>Policy</h2>")
    policy = report["policy"]
    if not policy["fail_on"]:
        out.append("<p>No <code>audit_fail_on</code> policy set.</p>")
    elif not policy["violations"]:
        out.append("<p class=\"ok\">Passed: %s</p>" % esc(", ".join(policy["fail_on"])))
    else:
        out.append("<ul class=\"critical\">%s</ul>" % "".join(
            "<li><code>%s</code>: %s</li>" % (esc(v["policy"]), esc(v["message"])) for v in policy["violations"]))
    out.append("<h2>Hosts</h2>")
    for index, entry in enumerate(report["hosts"]):
        heading = (fleet_pictures.host_anchor(index), esc(entry["severity"]), esc(entry["host"]),
                   esc(entry["status"].replace("_", " ")))
        out.append("<h3 id=\"%s\" class=\"%s\">%s &mdash; %s</h3>" % heading)
        if entry["issues"]:
            out.append("<table><tr><th>Severity</th><th>Issue</th><th>What</th><th>Do</th></tr>")
            for issue in entry["issues"]:
                out.append("<tr class=\"%s\"><td>%s</td><td><code>%s</code></td><td>%s</td><td>%s</td></tr>" % (
                    esc(issue["severity"]), esc(issue["severity"]), esc(issue["code"]), esc(issue["message"]),
                    esc(issue["action"] or "-")))
            out.append("</table>")
        if sentinel_text(entry):
            out.append("<p>Sentinel: %s</p>" % esc(sentinel_text(entry)))
        gpus = (entry.get("placement") or {}).get("gpus") or []
        if gpus:
            out.append("<table><tr><th>Card</th><th>VFs</th><th>Quarantined</th><th>Allocatable</th>"
                       "<th>Claimed</th><th>State</th></tr>")
            for gpu in gpus:
                out.append("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % tuple(
                    esc(str(v)) for v in (gpu["address"], gpu["vf_total"], gpu["quarantined"], gpu["allocatable"],
                                          gpu["claimed"], _card_state(gpu))))
            out.append("</table>")
        if entry.get("actions"):
            out.append("<ul>%s</ul>" % "".join("<li>%s</li>" % esc(_action_text(a)) for a in entry["actions"]))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _prom_line(out, name, help_text, samples):
    out.append("# HELP hypeman_vgpu_%s %s" % (name, help_text))
    out.append("# TYPE hypeman_vgpu_%s gauge" % name)
    for labels, value in samples:
        label_text = ",".join('%s="%s"' % (k, _prom_label_value(v)) for k, v in labels)
        out.append("hypeman_vgpu_%s%s %s" % (name, "{%s}" % label_text if label_text else "", _num(value)))


def _prom_label_value(value):
    """A label value escaped as the text format requires (backslash, double quote, line feed): one line per sample."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(int(value))


def render_prometheus(entry):
    """node_exporter textfile-collector text for one host's entry (no timestamps: the file's mtime says when)."""
    out = []
    store = entry.get("store") or {}
    placement = entry.get("placement") or {}
    capacity = entry.get("capacity") or {}
    sentinel = entry.get("sentinel") or {}
    api = entry.get("api")
    issues = entry.get("issues") or []
    _prom_line(out, "audit_needs_action", "1 when the audit found a warning or critical issue.",
               [((), entry["needs_action"])])
    _prom_line(out, "audit_issues", "Issues found by the last audit, by severity.",
               [((("severity", s),), len([i for i in issues if i["severity"] == s]))
                for s in ("critical", "warning", "info")])
    if entry.get("store") is not None:
        _prom_line(out, "store_valid", "1 when hypeman can load the VF health store.", [((), bool(store.get("valid")))])
        _prom_line(out, "vfs", "VFs by health state in the VF health store.", [
            ((("state", state),), len(store.get(key) or [])) for state, key in (
                ("quarantined", "quarantined"), ("quarantined_owned", "owned"),
                ("quarantined_by_hypeman", "by_hypeman"), ("pending_quarantine", "would_quarantine"),
                ("below_threshold", "below_threshold"), ("stale_record", "stale_records"))])
    if capacity:
        _prom_line(out, "slots", "vGPU slots as hypeman counts them.", [
            ((("kind", "total"),), capacity["total_slots"]), ((("kind", "allocatable"),), capacity["allocatable_slots"]),
            ((("kind", "quarantined"),), capacity["quarantined_slots"]), ((("kind", "lost"),), capacity["lost_slots"])])
        _prom_line(out, "capacity_loss_ratio", "Share of slots lost to quarantine (1 while placement is disabled).",
                   [((), round(capacity["lost_pct"] / 100.0, 4))])
    if placement:
        _prom_line(out, "placement_disabled", "1 while hypeman refuses every vGPU placement.",
                   [((), bool(placement.get("placement_disabled_reason")))])
        gpus = placement.get("gpus") or []
        _prom_line(out, "cards", "Cards by state.", [
            ((("state", "ready_for_cycle"),), len([g for g in gpus if g.get("drained") and g.get("idle")])),
            ((("state", "draining"),), len([g for g in gpus if g.get("drained") and not g.get("idle")])),
            ((("state", "overflow_only"),), len([g for g in gpus if g.get("overflow_only") and not g.get("drained")])),
            ((("state", "total"),), len(gpus))])
        if gpus:
            _prom_line(out, "card_health", "Each card's state on the report's health map: 0 healthy, 1 failures below "
                       "the threshold, 2 overflow-only, 3 no VFs, 4 draining, 5 ready for cycle, 6 store unavailable.",
                       [((("card", gpu.get("address")),), CARD_HEALTH_CODES[card_map_state(entry, gpu)])
                        for gpu in gpus])
    if entry.get("sentinel") is not None:
        findings = sentinel.get("findings") or []
        _prom_line(out, "sentinel_verdicts", "Standing sentinel verdicts, by verdict.", [
            ((("verdict", v),), len([f for f in findings if f.get("verdict") == v])) for v in ("failed", "ok")])
        _prom_line(out, "sentinel_unreported", "Sentinel verdicts whose report would change the store.",
                   [((), len(sentinel.get("unreported") or []))])
        if sentinel_mode(entry) is not None:
            _prom_line(out, "sentinel_mode", "1 for hypeman's sentinel mode on this host (markers, vsock, unknown).",
                       [((("mode", m),), sentinel_mode(entry) == m) for m in ("markers", "vsock", "unknown")])
    wedge = entry.get("wedge_signals")
    if wedge is not None:
        at_risk = entry.get("at_risk_vfs") or []
        _prom_line(out, "at_risk_vfs", "VFs a wedge-risk signal concerns (hard kill, OOM kill), by latest reason.", [
            ((("reason", r),), len([v for v in at_risk if v.get("reason") == r]))
            for r in ("vf_may_wedge", "oom_killed_qemu")])
        _prom_line(out, "wedge_signals_read", "1 when every wedge-risk signal source could be read.",
                   [((), bool(wedge.get("complete")))])
    metrics = entry.get("metrics")
    if metrics is not None:
        sample = metrics.get("sample")
        _prom_line(out, "hypeman_metrics_readable", "1 when hypeman's /metrics answered the audit.",
                   [((), sample is not None)])
        if sample is not None:
            _prom_line(out, "hypeman_sentinel_checks", "hypeman's own sentinel checks by result (its counter).",
                       [((("result", r),), v) for r, v in sorted((sample.get("checks") or {}).items())])
            for name, key, help_text in (
                    ("hypeman_sentinel_init_failures", "init_failures", "Init failures hypeman's sentinel recorded."),
                    ("hypeman_sentinel_quarantines", "quarantines", "VFs hypeman's sentinel quarantined."),
                    ("hypeman_quarantined_vfs", "quarantined_vfs", "Quarantined VFs as hypeman counts them (gauge).")):
                if sample.get(key) is not None:
                    _prom_line(out, name, help_text, [((), sample[key])])
            _prom_line(out, "sentinel_coverage_lost", "1 when hypeman's sentinel lost sight of guests since the "
                       "previous sample.", [((), bool(metrics.get("coverage_problems")))])
    if entry.get("footprint") is not None:
        _prom_line(out, "host_not_vgpu", "1 when neither an NVIDIA SR-IOV GPU nor hypeman's data dir was found "
                   "at the audited paths.", [((), bool(entry["footprint"].get("not_vgpu")))])
    if entry.get("hypeman") is not None and entry["hypeman"].get("running") is not None:
        _prom_line(out, "hypeman_running", "1 when a hypeman process runs.", [((), entry["hypeman"]["running"])])
    if api is not None:
        _prom_line(out, "api_reachable", "1 when hypeman's API answered the audit.",
                   [((), bool(api.get("reachable")) and not api.get("error"))])
        _prom_line(out, "api_mismatches", "Fields where hypeman's /resources differs from the files.",
                   [((), len(api.get("mismatches") or []))])
    return "\n".join(out) + "\n"


def to_json(report):
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


# --- writing the report files -------------------------------------------------------------------

def write_reports(files, dir_mode=0o755, file_mode=0o644, root=None, warnings=None):
    """Write ``files`` (path -> text) on the controller; returns ``(written, unchanged)`` paths.

    The fleet report is the job's output: a missing directory is created with
    exactly ``dir_mode`` (an existing one is left as it is), a file whose
    bytes are already there is not touched. The others are replaced together:
    each new version goes to a temporary file in its directory (keeping the
    old file's owner, group and mode; a new file gets ``file_mode``) and is
    fsynced, and only when every one is ready are they renamed into place, so
    a reader never sees half a report and a failure before the renames
    removes the temporary files and changes nothing. A path must hold a
    regular file or nothing: a FIFO, device, directory or symlink there is
    refused, never opened for reading. ``root`` (the report directory) is
    opened following symlinks, as the operator wrote it; a directory below
    it (``history``) is never a symlink. Raises ``OSError`` naming the path;
    ``warnings`` (a list) gets a line per file whose owner could not be kept.
    """
    written, unchanged, pending = [], [], []
    opened = {}
    try:
        for path in sorted(files):
            data = files[path].encode("utf-8", "backslashreplace")
            directory, name = os.path.split(path)
            if not name:
                raise IsADirectoryError(errno.EISDIR, "names a directory, not a report file", path)
            dir_fd = _report_dir(opened, directory or ".", root, dir_mode)
            old = _old_report(dir_fd, name, path, data)
            if old is True:
                unchanged.append(path)
                continue
            pending.append({"path": path, "dir_fd": dir_fd, "name": name, "data": data, "old": old, "tmp": None})
        for item in pending:
            _write_temp(item, file_mode, warnings)
        for item in pending:
            try:
                os.rename(item["tmp"], item["name"], src_dir_fd=item["dir_fd"], dst_dir_fd=item["dir_fd"])
            except OSError as err:
                raise OSError(err.errno, err.strerror, item["path"]) from err
            item["tmp"] = None
            written.append(item["path"])
        for dir_fd in set(item["dir_fd"] for item in pending):
            os.fsync(dir_fd)
    finally:
        for item in pending:
            if item["tmp"]:
                try:
                    os.unlink(item["tmp"], dir_fd=item["dir_fd"])
                except OSError:
                    pass
        for dir_fd in opened.values():
            os.close(dir_fd)
    return written, unchanged


def _report_dir(opened, directory, root, dir_mode):
    """fd of ``directory`` (cached in ``opened``): ``root`` and directories outside it as their path says, one
    below ``root`` component by component without following a symlink; missing ones made with ``dir_mode``."""
    if directory in opened:
        return opened[directory]
    below = None
    if root:
        below = os.path.relpath(os.path.abspath(directory), os.path.abspath(root))
        if below == "." or below.split(os.sep)[0] == "..":
            below = None
    if below is None:
        opened[directory] = _safedir.open_dir(directory, dir_mode, follow_last=True)
        return opened[directory]
    fd = _report_dir(opened, root, root, dir_mode)
    path = root
    try:
        for part in below.split(os.sep):
            child = _safedir.open_child(fd, part, path, dir_mode, follow=False)
            if path != root:
                os.close(fd)
            fd, path = child, os.path.join(path, part)
    except BaseException:
        if path != root:
            os.close(fd)
        raise
    opened[directory] = fd
    return fd


def _old_report(dir_fd, name, path, data):
    """True when ``name`` holds ``data``; else its stat, or None when there is none. Never blocks (a FIFO)."""
    try:
        fd, info = _fileio.open_regular(name, follow=False, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        why = "is a directory" if isinstance(err, IsADirectoryError) else err.strerror
        raise _fileio.HostFileError(err.errno, "%s; expected a regular file (or none) where the report goes" % why,
                                    path) from err
    try:
        if info.st_size != len(data):
            return info
        try:
            return True if _fileio.read_fd(fd, path, len(data)) == data else info
        except _fileio.HostFileError:  # it grew while read
            return info
    finally:
        os.close(fd)


def _write_temp(item, file_mode, warnings):
    """The new version of ``item`` in a temporary file beside it, with the old file's owner and mode, fsynced."""
    tmp = ".%s.%s" % (item["name"], os.urandom(6).hex())
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=item["dir_fd"])
    except OSError as err:
        raise OSError(err.errno, err.strerror, item["path"]) from err
    item["tmp"] = tmp
    old = item["old"]
    try:
        if old is not None:
            _keep_owner(fd, old, item["path"], warnings)
        # After the chown, which may clear set-id bits; exact, whatever the umask.
        os.fchmod(fd, stat.S_IMODE(old.st_mode) if old is not None else file_mode)
        view = memoryview(item["data"])
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as err:
        raise OSError(err.errno, err.strerror, item["path"]) from err
    finally:
        os.close(fd)


def _keep_owner(fd, old, path, warnings):
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) == (old.st_uid, old.st_gid):
        return
    try:
        os.fchown(fd, old.st_uid, old.st_gid)
        return
    except PermissionError:
        pass
    try:
        os.fchown(fd, -1, old.st_gid)
        kept = "its group is kept, its owner %d is now %d" % (old.st_uid, mine.st_uid)
    except PermissionError:
        kept = "it is now owned by %d:%d instead of %d:%d" % (mine.st_uid, mine.st_gid, old.st_uid, old.st_gid)
    if warnings is not None:
        warnings.append("fleet report %s: not permitted to keep its owner; %s" % (path, kept))


def delete_history_records(history_dir, expired):
    """Delete the expired history records (paths directly inside ``history_dir``); returns those deleted.

    A path elsewhere is refused (``OSError``): the list comes from the report,
    and the report is a task argument a playbook could change.
    """
    deleted = []
    if not history_dir:
        return deleted
    root = os.path.realpath(history_dir)
    for path in expired:
        path = str(path)
        if os.path.realpath(os.path.dirname(path)) != root:
            raise OSError(errno.EPERM, "not inside the history directory %s" % history_dir, path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        deleted.append(path)
    return deleted
