# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet as inventory: report documents in, host entries out, groups and host vars from each entry.

Pure data, used by the ``hypeman.vgpu.vgpu_fleet`` inventory plugin (which
reads the files, calls the API and talks to Ansible). Three kinds of input
become the same list of report host entries (``fleet_report.host_entry``'s
shape), so one function decides the groups for all of them:

* a fleet report (``fleet-audit.json``/``fleet-reconcile.json``): its entries
  as the report classified them (validated, never trusted blindly);
* an AWX job artifact (``hypeman_vgpu_audit``, the report's summary published
  with ``set_stats``): only the hosts its lists name, with the issue codes
  those lists stand for (``complete`` is False);
* hypeman's ``GET /resources`` per host (live): what the API can tell, with
  the audit's own wording for an unreachable API (``_audit.classify``).

Every error is :class:`FleetInputError` naming where in the document the bad
value is and what is expected.
"""

from __future__ import annotations

import re

from ansible_collections.hypeman.vgpu.plugins.module_utils import _audit
from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as _report

# The groups, in the order the docs list them.
GROUPS = ("vgpu_needs_recovery", "vgpu_ready_for_cycle", "vgpu_overflow_only", "vgpu_store_unavailable",
          "vgpu_sentinel_coverage_lost", "vgpu_ok", "vgpu_needs_action")
# Card issue codes (the audit's per-card classification, subject = the card's address) and the
# state name a card gets in the host vars for each.
CARD_STATES = {"card_ready_for_cycle": "ready_for_cycle", "card_draining": "draining",
               "card_overflow_only": "overflow_only", "card_without_vfs": "without_vfs"}
# Issue codes that put a host in a group of the same idea.
_GROUP_CODES = (("vgpu_ready_for_cycle", "card_ready_for_cycle"), ("vgpu_overflow_only", "card_overflow_only"),
                ("vgpu_store_unavailable", "store_unavailable"),
                ("vgpu_sentinel_coverage_lost", "sentinel_coverage_lost"))
ARTIFACT_KEYS = ("hypeman_vgpu_audit", "hypeman_vgpu_reconcile")
# Live mode only: hypeman counts quarantined slots, but which cards they are on only the audit can tell.
LIVE_QUARANTINED = "quarantined_slots"
_HOST_RE = re.compile(r"^[^\s,\x00-\x1f\x7f]{1,253}$")
# Ansible takes a name that is also a group for the group (add_child, patterns, --limit): a host named
# like one would put the group's hosts where the host belongs.
RESERVED_NAMES = frozenset(GROUPS + ("all", "ungrouped"))
_MAX_TEXT = 4096


class FleetInputError(ValueError):
    """A report, artifact or API answer of the wrong shape; the message says where and what is expected."""


# --- checking shapes -------------------------------------------------------------------------------


def _type_name(value):
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def _expect(where, value, kind, what):
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise FleetInputError("%s is %s; expected %s" % (where, _type_name(value), what))
    return value


def _text(where, value, optional=False):
    if value is None and optional:
        return None
    _expect(where, value, str, "a string")
    if len(value) > _MAX_TEXT:
        raise FleetInputError("%s is a string of %d characters; expected at most %d" % (where, len(value), _MAX_TEXT))
    return value


def host_name(where, value):
    _expect(where, value, str, "a host name (a string)")
    if not _HOST_RE.match(value):
        raise FleetInputError("%s is %r; expected a host name (1 to 253 characters, no spaces, commas or control "
                              "characters)" % (where, value[:80]))
    if value in RESERVED_NAMES:
        raise FleetInputError("%s is %r, a group name; expected a host name that is not all, ungrouped or one of "
                              "the groups the inventory makes (%s)" % (where, value, ", ".join(GROUPS)))
    return value


def _count(where, value, optional=True):
    if value is None and optional:
        return None
    _expect(where, value, int, "a whole number")
    if value < 0:
        raise FleetInputError("%s is %d; expected a count, 0 or more" % (where, value))
    return value


def _issue(where, value):
    _expect(where, value, dict, "an issue object {severity, code, message, action, subject}")
    severity = _text(where + ".severity", value.get("severity"))
    if severity not in _report.SEVERITY_ORDER or severity == "ok":
        raise FleetInputError("%s.severity is %r; expected critical, warning or info" % (where, severity))
    code = _text(where + ".code", value.get("code"))
    if not re.match(r"^[a-z][a-z0-9_]{0,63}$", code):
        raise FleetInputError("%s.code is %r; expected an issue code such as store_unavailable" % (where, code[:80]))
    subject = value.get("subject")
    return {"severity": severity, "code": code, "message": _text(where + ".message", value.get("message")),
            "action": _text(where + ".action", value.get("action"), optional=True),
            "subject": None if subject is None else str(_text(where + ".subject", subject))}


def _gpu(where, value):
    _expect(where, value, dict, "a card object {address, vf_total, quarantined, allocatable, ...}")
    card = {"address": _text(where + ".address", value.get("address"))}
    for key in ("vf_total", "quarantined", "allocatable", "claimed"):
        card[key] = _count("%s.%s" % (where, key), value.get(key))
    return card


def _capacity(where, value):
    if value is None:
        return None
    _expect(where, value, dict, "an object {total_slots, allocatable_slots, quarantined_slots, lost_slots, lost_pct}")
    capacity = {}
    for key in ("total_slots", "allocatable_slots", "quarantined_slots", "lost_slots"):
        capacity[key] = _count("%s.%s" % (where, key), value.get(key), optional=False)
    capacity["lost_pct"] = _expect(where + ".lost_pct", value.get("lost_pct"), float, "a percentage (a number)")
    return capacity


def _entry(where, value):
    """The parts of a report host entry the inventory uses, checked."""
    _expect(where, value, dict, "a host entry object {host, status, issues, ...}")
    host = host_name(where + ".host", value.get("host"))
    status = _text(where + ".status", value.get("status"))
    if status not in ("ok", "needs_action", "unreachable", "failed", "no_data"):
        raise FleetInputError("%s.status is %r; expected ok, needs_action, unreachable, failed or no_data"
                              % (where, status[:80]))
    issues = _expect(where + ".issues", value.get("issues"), list, "an array of issues")
    entry = {"host": host, "status": status,
             "severity": _text(where + ".severity", value.get("severity"), optional=True),
             "audited_at": _text(where + ".audited_at", value.get("audited_at"), optional=True),
             "issues": [_issue("%s.issues[%d]" % (where, i), item) for i, item in enumerate(issues)],
             "capacity": _capacity(where + ".capacity", value.get("capacity")),
             "placement": None, "store": None}
    placement = value.get("placement")
    if placement is not None:
        _expect(where + ".placement", placement, dict, "an object with gpus")
        gpus = _expect(where + ".placement.gpus", placement.get("gpus"), list, "an array of cards")
        entry["placement"] = {
            "placement_disabled_reason": _text(where + ".placement.placement_disabled_reason",
                                               placement.get("placement_disabled_reason"), optional=True),
            "gpus": [_gpu("%s.placement.gpus[%d]" % (where, i), gpu) for i, gpu in enumerate(gpus)]}
    store = value.get("store")
    if store is not None:
        _expect(where + ".store", store, dict, "an object with quarantined")
        quarantined = _expect(where + ".store.quarantined", store.get("quarantined"), list, "an array of VFs")
        entry["store"] = {"quarantined": [_text("%s.store.quarantined[%d]" % (where, i), vf)
                                          for i, vf in enumerate(quarantined)]}
    return entry


def _entries(where, hosts):
    entries, seen = [], set()
    for index, value in enumerate(hosts):
        entry = _entry("%s[%d]" % (where, index), value)
        if entry["host"] in seen:
            raise FleetInputError("%s[%d].host %r is listed twice; expected each host once" % (
                where, index, entry["host"]))
        seen.add(entry["host"])
        entries.append(entry)
    return entries


# --- documents -------------------------------------------------------------------------------------


def parse_time(text):
    """Unix seconds of an RFC 3339 time, or None when ``text`` is not one."""
    if not isinstance(text, str):
        return None
    try:
        return _gotime.parse_rfc3339(text).sec
    except ValueError:
        return None


def fleet_state(document):
    """The hosts of a report or artifact document: ``{source, kind, time, complete, entries}``.

    ``time`` is the document's own time (a report's ``generated_at``, an AWX
    job's ``finished``, an ansible-runner event's ``created``) or None.
    Raises :class:`FleetInputError` for anything else.
    """
    if not isinstance(document, dict):
        raise FleetInputError("the document is %s; expected a fleet report (an object with schema, kind and hosts) "
                              "or an AWX job artifact (an object with %s)" % (
                                  _type_name(document), " or ".join(ARTIFACT_KEYS)))
    if "hosts" in document and "schema" in document:
        return _from_report(document)
    time_text, artifacts, where = None, document, ""
    if isinstance(document.get("artifacts"), dict):
        # An AWX job as its API shows it (GET /api/v2/jobs/N/): the artifacts and when the job finished.
        time_text, artifacts, where = document.get("finished"), document["artifacts"], "artifacts."
    elif isinstance(document.get("event_data"), dict) and isinstance(document["event_data"].get("artifact_data"),
                                                                     dict):
        # ansible-runner's playbook_on_stats event (artifacts/<ident>/job_events/*.json).
        time_text, artifacts, where = document.get("created"), document["event_data"]["artifact_data"], \
            "event_data.artifact_data."
    for key in ARTIFACT_KEYS:
        if key in artifacts:
            return _from_artifact(where + key, artifacts[key], key.rsplit("_", 1)[1], time_text)
    raise FleetInputError("the document has neither a fleet report's schema and hosts nor an artifact %s (keys: %s); "
                          "expected fleet-audit.json or an AWX job's artifacts" % (
                              " or ".join(where + k for k in ARTIFACT_KEYS),
                              ", ".join(sorted(str(k) for k in artifacts)[:20]) or "none"))


def _from_report(report):
    if report.get("schema") != _report.REPORT_SCHEMA:
        raise FleetInputError("schema is %r; expected %d (the fleet report this collection writes)" % (
            report.get("schema"), _report.REPORT_SCHEMA))
    kind = report.get("kind")
    if kind not in ("audit", "reconcile"):
        raise FleetInputError("kind is %r; expected audit or reconcile" % (kind,))
    generated_at = _text("generated_at", report.get("generated_at"), optional=True)
    hosts = _expect("hosts", report.get("hosts"), list, "an array of host entries")
    return {"source": "report", "kind": kind, "time": generated_at, "complete": True,
            "entries": _entries("hosts", hosts)}


def _host_list(where, summary, key):
    value = summary.get(key)
    if value is None:
        return []
    _expect(where + "." + key, value, list, "an array of host names")
    return [host_name("%s.%s[%d]" % (where, key, i), host) for i, host in enumerate(value)]


def _from_artifact(where, summary, kind, time_text):
    """Host entries from the summary: the hosts its lists name, each with the codes those lists stand for."""
    _expect(where, summary, dict, "the fleet summary (an object)")
    by_host = {}

    def add(host, code, severity="warning", subject=None, message=None):
        entry = by_host.setdefault(host, {"host": host, "status": "needs_action", "severity": None,
                                          "audited_at": None, "issues": [], "capacity": None, "placement": None,
                                          "store": None})
        entry["issues"].append(_audit.issue(severity, code, message or "%s (from the job artifact)" % code,
                                            None, subject))
        return entry

    for host in _host_list(where, summary, "needing_action"):
        by_host.setdefault(host, {"host": host, "status": "needs_action", "severity": None, "audited_at": None,
                                  "issues": [], "capacity": None, "placement": None, "store": None})
    for key, code, status in (("unreachable", "unreachable", "unreachable"), ("failed", "audit_failed", "failed"),
                              ("store_unavailable", "store_unavailable", None),
                              ("not_vgpu", "host_not_vgpu", None),
                              ("reconcile_failed", "reconcile_failed", None),
                              ("sentinel_coverage_lost", "sentinel_coverage_lost", None)):
        for host in _host_list(where, summary, key):
            entry = add(host, code, "warning" if code in ("host_not_vgpu", "sentinel_coverage_lost") else "critical")
            if status:
                entry["status"] = status
    for name, code in (("ready_for_cycle", "card_ready_for_cycle"), ("at_risk", "vf_at_risk")):
        items = summary.get(name)
        if items is None:
            continue
        _expect(where + "." + name, items, list, "an array of objects")
        for index, item in enumerate(items):
            spot = "%s.%s[%d]" % (where, name, index)
            _expect(spot, item, dict, "an object {host, %s}" % ("gpu" if name == "ready_for_cycle" else "vf, card"))
            host = host_name(spot + ".host", item.get("host"))
            subject = _text(spot + (".gpu" if name == "ready_for_cycle" else ".vf"),
                            item.get("gpu" if name == "ready_for_cycle" else "vf"))
            add(host, code, subject=subject)
    for entry in by_host.values():
        entry["severity"] = min([i["severity"] for i in entry["issues"]] or ["warning"],
                                key=lambda s: _report.SEVERITY_ORDER.get(s, 9))
    return {"source": "artifact", "kind": kind, "time": _text("time", time_text, optional=True), "complete": False,
            "entries": [by_host[host] for host in sorted(by_host)]}


# --- live: hypeman's /resources --------------------------------------------------------------------


def live_entry(host, section, checked_at=None):
    """A host entry from ``_api.resources_check(None, ...)``: what ``/resources`` can tell.

    An unreachable or refusing API is the audit's ``api_unreachable`` (the
    audit's own rule and words). A ``gpu`` with ``placement_disabled_reason``
    is ``store_unavailable`` (hypeman sets it exactly when it cannot load the
    store); quarantined slots are :data:`LIVE_QUARANTINED`; no vGPU at all is
    ``host_not_vgpu``. Card states, sentinel and store details are unknown.
    """
    api = dict(section)
    api.setdefault("mismatches", [])
    gpu = api.pop("gpu", None)
    result = {"errors": [], "store": None, "placement": None, "sentinel": None, "metrics": None, "api": api,
              "hypeman": {"running": None}, "capacity": None}
    issues = _audit.classify(result, hypeman_expected=False)
    if not api.get("error"):
        if not isinstance(gpu, dict) or gpu.get("mode") != "vgpu":
            issues.append(_audit.issue(
                "warning", "host_not_vgpu", "hypeman's /resources shows no vGPU (gpu is %s)" % (
                    "null" if gpu is None else "mode %r" % (gpu.get("mode") if isinstance(gpu, dict) else gpu,)),
                "check that this host is a hypeman vGPU host and that its GPU discovery works"))
        else:
            slots = {}
            for field, key in (("total_slots", "total"), ("allocatable_slots", "allocatable"),
                               ("quarantined_slots", "quarantined")):
                value = gpu.get(field, 0)  # an older hypeman does not send the last two: none known
                slots[key] = value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
            reason = gpu.get("placement_disabled_reason") or None
            reason = str(reason)[:_MAX_TEXT] if reason else None
            result["capacity"] = _audit.capacity_section({"slots": slots, "placement_disabled_reason": reason})
            if reason:
                issues.append(_audit.issue(
                    "critical", "store_unavailable", "hypeman's /resources: vGPU placement is disabled: %s" % reason,
                    "run playbooks/reconcile.yml: it repairs the store with a backup"))
            elif slots["quarantined"]:
                issues.append(_audit.issue(
                    "warning", LIVE_QUARANTINED, "hypeman counts %d quarantined slot(s) of %d" % (
                        slots["quarantined"], slots["total"]),
                    "run the fleet audit to see which cards are overflow-only or ready for an SR-IOV cycle"))
    result["issues"] = issues
    result["needs_action"] = any(item["severity"] != "info" for item in issues)
    entry = _report.host_entry(result, host, checked_at)
    entry["store"] = None
    return entry


# --- groups and host vars --------------------------------------------------------------------------


def issue_codes(entry):
    return sorted(set(issue["code"] for issue in entry["issues"]))


def host_groups(entry):
    """The groups of :data:`GROUPS` a host entry belongs to, from the report's own classification.

    ``vgpu_needs_recovery``: a card the audit classified as ready for a
    cycle, draining, overflow-only or without VFs, or quarantined slots
    (live mode, where cards are unknown); ``vgpu_ok``/``vgpu_needs_action``:
    the entry's status.
    """
    codes = set(issue_codes(entry))
    groups = []
    quarantined_slots = (entry.get("capacity") or {}).get("quarantined_slots") or 0
    if codes & set(CARD_STATES) or quarantined_slots > 0:
        groups.append("vgpu_needs_recovery")
    for group, code in _GROUP_CODES:
        if code in codes:
            groups.append(group)
    groups.append("vgpu_ok" if entry["status"] == "ok" else "vgpu_needs_action")
    return groups


def cards(entry):
    """Each card: address, VFs, quarantined, allocatable, claimed and its state from the audit's card issues."""
    states = {}
    for issue in entry["issues"]:
        if issue["code"] in CARD_STATES and issue.get("subject"):
            states[issue["subject"]] = CARD_STATES[issue["code"]]
    placement = entry.get("placement")
    found = []
    if placement is not None:
        disabled = bool(placement.get("placement_disabled_reason"))
        for gpu in placement["gpus"]:
            card = dict(gpu)
            card["state"] = states.pop(gpu["address"], "placement_disabled" if disabled else "healthy")
            found.append(card)
    # An artifact names ready cards without their counts.
    for address, state in sorted(states.items()):
        found.append({"address": address, "vf_total": None, "quarantined": None, "allocatable": None,
                      "claimed": None, "state": state})
    return found


def host_vars(entry, state, now, origin):
    """The ``vgpu_*`` host vars of one entry; ``state`` is :func:`fleet_state`'s (or live's) document state."""
    report_time = parse_time(state.get("time"))
    found = cards(entry)
    capacity = entry.get("capacity")
    return {
        "vgpu_source": state["source"],
        "vgpu_origin": origin,
        "vgpu_complete": state["complete"],
        "vgpu_report_kind": state.get("kind"),
        "vgpu_report_time": state.get("time"),
        "vgpu_report_age": None if report_time is None else max(0, int(now - report_time)),
        "vgpu_audited_at": entry.get("audited_at"),
        "vgpu_status": entry["status"],
        "vgpu_severity": entry.get("severity"),
        "vgpu_issue_codes": issue_codes(entry),
        "vgpu_issues": [dict((k, issue.get(k)) for k in ("severity", "code", "message", "subject"))
                        for issue in entry["issues"]],
        "vgpu_cards": found,
        "vgpu_ready_cards": [card["address"] for card in found if card["state"] == "ready_for_cycle"],
        "vgpu_quarantined_vfs": None if entry.get("store") is None else len(entry["store"]["quarantined"]),
        "vgpu_slots": None if capacity is None else dict(capacity),
        "vgpu_groups": host_groups(entry),
    }
