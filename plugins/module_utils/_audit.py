# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One host's audit in one pass: store, placement, sentinel evidence, hypeman (stdlib only).

Composes the other helpers; it never writes anything. The sentinel scan runs
in its check mode (cursors read, never moved) so an audit leaves every file
on the host as it was. Each section that cannot be read is reported in
``errors`` and the rest of the audit still answers: a fleet audit must say
what it knows about a half-broken host, not stop at the first unreadable file.
"""

from __future__ import annotations

import os

from ansible_collections.hypeman.vgpu.plugins.module_utils import (
    _fileio, _hypeman, _ledger, _placement, _sentinel, _sentinel_mode, _store)
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

SEVERITIES = ("critical", "warning", "info")
DEFAULT_DCGM_UNITS = ("nvidia-dcgm.service", "nvidia-dcgm-exporter.service")
DEFAULT_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                     "/usr/lib/systemd/system", "/lib/systemd/system")


class Paths(object):
    """The host paths an audit reads."""

    def __init__(self, data_dir, store_path, sysfs_root, proc_root, dev_root, state_dir, config_path):
        self.data_dir = data_dir
        self.store_path = store_path
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.dev_root = dev_root
        self.state_dir = state_dir
        self.config_path = config_path


def issue(severity, code, message, action=None, subject=None):
    """One finding of an audit, as the host audit and the fleet report both list them."""
    return {"severity": severity, "code": code, "message": message, "action": action, "subject": subject}


# --- sections ---------------------------------------------------------------------------------


def store_section(store, threshold, ledger, discovered):
    """The store as the fleet report needs it (``discovered``: VF addresses sysfs shows, or None)."""
    recoverable = []
    if not store.valid:
        # Loaded only for a broken store: every host's audit would compile it otherwise.
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _store_write
        recoverable = sorted(_store_write.recover_records(store.raw))
    section = {
        "path": store.path, "exists": store.exists, "format": store.format, "valid": store.valid,
        "error": store.error, "symlink": store.is_symlink, "records": len(store.records),
        "quarantined": store.quarantined(), "owned": None, "by_hypeman": None,
        "would_quarantine": store.would_quarantine(threshold) if store.valid else [],
        "below_threshold": {}, "stale_records": [],
        "recoverable": recoverable,
    }
    for vf in sorted(store.records):
        count = len(store.records[vf].failures)
        if store.records[vf].quarantined_at is None and 0 < count < threshold:
            section["below_threshold"][vf] = count
    if ledger is not None:
        section["owned"] = _ledger.owned_quarantines(ledger, store)
        section["by_hypeman"] = sorted(set(section["quarantined"]) - set(section["owned"]))
    if discovered is not None:
        section["stale_records"] = sorted(vf for vf in store.records if vf not in discovered)
    return section


_GPU_KEYS = ("address", "vf_total", "sriov_numvfs", "sriov_totalvfs", "quarantined", "allocatable", "allocated",
             "claimed", "held_open", "overflow_only", "drained", "idle", "idle_blockers", "live_instances")


def placement_section(view):
    """The parts of ``_placement.host_view`` a fleet report shows (the full view is large).

    Each card also gets ``below_threshold_vfs``: its unquarantined VFs with failures below the
    threshold (the fleet report's health map shows them per card; the store section only by VF).
    """
    threshold = view["threshold"]
    below = {}
    for vf in view["vfs"]:
        failures = vf.get("failures") or 0
        if not vf.get("quarantined") and 0 < failures and (threshold is None or failures < threshold):
            below[vf.get("parent")] = below.get(vf.get("parent"), 0) + 1
    gpus = []
    for gpu in view["gpus"]:
        section = dict((key, gpu.get(key)) for key in _GPU_KEYS)
        section["below_threshold_vfs"] = below.get(gpu.get("address"), 0)
        gpus.append(section)
    return {
        "framework": view["framework"],
        "placement_disabled_reason": view["placement_disabled_reason"],
        "threshold": threshold,
        "slots": dict(view["slots"]),
        "pending_quarantine": list(view["pending_quarantine"]),
        "gpus": gpus,
        "unreadable_vfs": [entry.get("address") for entry in view["unreadable_vfs"]],
        "unreadable_metadata": [entry.get("path") for entry in view["unreadable_metadata"]],
        "held_open_error": view["held_open_error"],
    }


def sentinel_section(data_dir, state_dir, store, threshold, mode_option="auto", metrics_sample=None,
                     metrics_read=False):
    """Standing sentinel verdicts (read-only scan) and what reporting each would do to the store.

    ``effect`` is the store outcome a report of the finding would have now
    (``unchanged`` when the store already holds it); None when the store is
    not valid (nothing can be reported to it until it is repaired). The
    section also says which hypeman sentinel watches the host and how far
    the logs can show a failure (docs/hypeman-versions.md).
    """
    instances, unreadable = _hypeman.list_instances(data_dir)
    report = _sentinel.scan(instances, unreadable, lambda iid: _hypeman.instance_log_dir(data_dir, iid),
                            state_dir, check_mode=True)
    effects = {}
    if store.valid:
        for outcome in _sentinel.record_verdicts(store.copy(), report.findings, threshold):
            effects[(outcome["instance_id"], outcome["vf_address"], outcome["assigned_at"])] = outcome["outcome"]
    findings = []
    for finding in report.findings:
        key = (finding["instance_id"], finding["vf_address"], finding["assigned_at"])
        findings.append({
            "instance_id": finding["instance_id"], "vf_address": finding["vf_address"],
            "assigned_at": finding["assigned_at"], "verdict": finding["verdict"], "ts": finding["ts"],
            "nvrm": finding["nvrm"], "effect": effects.get(key) if store.valid else None,
        })
    findings.sort(key=lambda f: (f["vf_address"] or "", f["instance_id"]))
    instance_modes = _sentinel_mode.scanned_modes(report, instances,
                                                  lambda iid: _hypeman.instance_log_dir(data_dir, iid))
    mode, mode_reason = _sentinel_mode.host_mode(mode_option, instance_modes,
                                                 metrics_sample if metrics_read else None)
    coverage, coverage_reason = _sentinel_mode.log_evidence(mode, instance_modes)
    return {
        "findings": findings,
        "unreported": [f for f in findings if f["effect"] not in (None, "unchanged")
                       and mode != _sentinel_mode.VSOCK],
        "skipped_instances": report.skipped,
        "unattributed": len(report.unattributed),
        "history": len(report.history),
        "warnings": list(report.warnings),
        "sentinel_mode": mode, "sentinel_mode_reason": mode_reason, "instance_modes": instance_modes,
        "log_evidence": coverage, "log_evidence_reason": coverage_reason,
        # Instances hypeman's sentinel polls or reads (vendor-VFIO claims): the "checks stopped" rule needs them.
        "watched_instances": len(instance_modes),
    }


def read_previous_sample(state_dir):
    """``(sample, error)`` of the previous metrics sample the fleet_reconcile role kept in ``state_dir``."""
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _metrics  # lazy: only with metrics_url
    path = os.path.join(state_dir, _metrics.SAMPLE_FILE)
    try:
        data = _fileio.read_bytes(path, limit=_metrics.SAMPLE_LIMIT, follow=False)
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, "cannot read %s: %s" % (path, err.strerror or err)
    sample, error = _metrics.decode_sample(data)
    return sample, (None if error is None else "ignored %s: %s" % (path, error))


def metrics_section(url, timeout, state_dir):
    """hypeman's own sentinel numbers from its Prometheus endpoint, and the previous sample to compare."""
    # Loaded only with metrics_url: it brings http.client, and every host's audit would compile it.
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _metrics
    read = _metrics.read_sentinel_metrics(url, timeout)
    previous, previous_error = read_previous_sample(state_dir)
    return {"url": url, "error": read["error"], "sample": read["sample"], "previous": previous,
            "previous_error": previous_error, "coverage_problems": [], "store_quarantined": None}


def finish_metrics_section(section, sentinel, store):
    """Cross-checks that need the other sections: coverage lost, quarantined VFs against the store."""
    sample = section["sample"]
    if sample is None:
        return
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _metrics  # lazy: only with metrics_url
    targets = sentinel["watched_instances"] if sentinel is not None else None
    section["coverage_problems"] = _metrics.coverage_problems(section["previous"], sample, targets)
    if store is not None and store["valid"]:
        section["store_quarantined"] = len(store["quarantined"])


def hypeman_section(proc_root):
    processes, error = _hypeman.hypeman_processes(proc_root)
    if error:
        return {"running": None, "pids": [], "error": error}
    return {"running": bool(processes), "pids": [p["pid"] for p in processes], "error": None}


def api_section(view, api_url, api_token, validate_certs, timeout):
    """The ``/resources`` cross-check, without hypeman's raw ``gpu`` object."""
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _api

    section = _api.resources_check(view, api_url, api_token, validate_certs, timeout)
    del section["gpu"]
    return section


def footprint_section(paths, placement):
    """What of a hypeman vGPU host the audit found at its paths: NVIDIA SR-IOV cards in sysfs, hypeman's
    data dir and config. ``not_vgpu`` when neither a card nor the data dir is there: not a hypeman vGPU
    host, or host paths that point elsewhere (an audit of them would otherwise look healthy). Unknown
    (False) when placement could not be read: ``audit_incomplete`` says so then."""
    devices = os.path.join(paths.sysfs_root, "bus", "pci", "devices")
    cards = None if placement is None else len(
        [gpu for gpu in placement["gpus"] if (gpu.get("sriov_totalvfs") or 0) > 0 or gpu.get("vf_total")])
    data_dir_exists = os.path.isdir(paths.data_dir)
    return {"sysfs_devices": devices, "sysfs_devices_exist": os.path.isdir(devices), "nvidia_sriov_cards": cards,
            "data_dir": paths.data_dir, "data_dir_exists": data_dir_exists,
            "config_path": paths.config_path, "config_exists": os.path.exists(paths.config_path),
            "not_vgpu": cards == 0 and not data_dir_exists}


def capacity_section(placement):
    """Slots lost to quarantine; every slot is lost while placement is disabled."""
    slots = placement["slots"]
    total = slots["total"]
    lost = total if placement["placement_disabled_reason"] else slots["quarantined"]
    return {"total_slots": total, "allocatable_slots": slots["allocatable"],
            "quarantined_slots": slots["quarantined"], "lost_slots": lost,
            "lost_pct": round(100.0 * lost / total, 2) if total else 0.0}


# --- classification ---------------------------------------------------------------------------


def classify(result, hypeman_expected=True):
    """The issues an operator must see, most severe first (codes are documented in docs/audit-report.md)."""
    issues = []
    footprint = result.get("footprint")
    if footprint and footprint["not_vgpu"]:
        issues.append(issue(
            "warning", "host_not_vgpu",
            "nothing of a hypeman vGPU host found: no NVIDIA SR-IOV GPU in %s (%s), no hypeman data directory %s, "
            "%s config %s" % (footprint["sysfs_devices"],
                              "it has other devices" if footprint["sysfs_devices_exist"] else "no such directory",
                              footprint["data_dir"], "a" if footprint["config_exists"] else "no",
                              footprint["config_path"]),
            "check this host's paths in the inventory (hypeman_vgpu_sysfs_root, hypeman_vgpu_data_dir, "
            "hypeman_vgpu_config_path); if it is not a hypeman vGPU host, leave it out of the audit's hosts"))
    for error in result["errors"]:
        issues.append(issue("critical", "audit_incomplete", "%s: %s" % (error["section"], error["error"]),
                            "fix the unreadable path; the rest of this host's audit may be incomplete"))
    store = result["store"]
    placement = result["placement"]
    if store is not None:
        if not store["valid"]:
            issues.append(issue(
                "critical", "store_unavailable",
                "VF health store %s is %s: %s; hypeman disables vGPU placement" % (
                    store["path"], store["format"], store["error"]),
                "run playbooks/reconcile.yml: it repairs the store with a backup, keeping %d recoverable VF(s) "
                "quarantined" % len(store["recoverable"]), store["path"]))
        if store["would_quarantine"]:
            issues.append(issue(
                "warning", "pending_quarantine",
                "%d VF(s) have failures at the threshold %d but no quarantine mark: %s" % (
                    len(store["would_quarantine"]), result["threshold"], ", ".join(store["would_quarantine"])),
                "hypeman quarantines them at its next start; reconcile restarts hypeman to apply it now"))
        if store["stale_records"]:
            issues.append(issue(
                "warning", "stale_records",
                "%d record(s) for VFs sysfs does not show: %s" % (
                    len(store["stale_records"]), ", ".join(store["stale_records"])),
                "if the VFs are gone for good, remove the records with the clear_quarantine role "
                "(owned_only: false)"))
        if store["quarantined"]:
            owned = store["owned"]
            issues.append(issue(
                "info", "quarantined_vfs",
                "%d VF(s) quarantined (%s): %s" % (
                    len(store["quarantined"]),
                    "ownership unknown" if owned is None else "%d by this collection, %d by hypeman" % (
                        len(owned), len(store["by_hypeman"])),
                    ", ".join(store["quarantined"]))))
        if store["below_threshold"]:
            issues.append(issue(
                "info", "below_threshold",
                "%d VF(s) with failures below the threshold %d: %s" % (
                    len(store["below_threshold"]), result["threshold"],
                    ", ".join("%s (%d)" % item for item in sorted(store["below_threshold"].items())))))
    sentinel = result["sentinel"]
    if sentinel is not None and sentinel["unreported"]:
        issues.append(issue(
            "warning", "sentinel_unreported",
            "%d sentinel verdict(s) not in the store: %s" % (len(sentinel["unreported"]), ", ".join(
                "%s %s on %s (would be %s)" % (f["instance_id"], f["verdict"], f["vf_address"], f["effect"])
                for f in sentinel["unreported"])),
            "reconcile reports them to the store (hypeman stopped around the edit)"))
    metrics = result.get("metrics")
    metrics_ok = metrics is not None and metrics["error"] is None
    if metrics is not None and metrics["error"]:
        issues.append(issue("warning", "metrics_unreadable", metrics["error"],
                            "check metrics_url (hypeman serves /metrics on metrics.listen_address:metrics.port, "
                            "default 127.0.0.1:9464)"))
    if metrics_ok and metrics["coverage_problems"]:
        issues.append(issue(
            "warning", "sentinel_coverage_lost",
            "hypeman's sentinel lost sight of guests: %s" % "; ".join(metrics["coverage_problems"]),
            "check the guest agents (rpc_error, unsupported_agent: guests booted with an agent that does not "
            "answer GetGPUInitStatus) and hypeman's instance listing (list_error); restart the affected instances "
            "to give them the current agent"))
    if metrics_ok and metrics["store_quarantined"] is not None and metrics["sample"]["quarantined_vfs"] is not None \
            and int(metrics["sample"]["quarantined_vfs"]) != metrics["store_quarantined"]:
        issues.append(issue(
            "warning", "quarantine_count_mismatch",
            "hypeman reports %d quarantined VF(s) (hypeman_instances_vgpu_quarantined_vfs), the store file holds %d"
            % (int(metrics["sample"]["quarantined_vfs"]), metrics["store_quarantined"]),
            "hypeman reads the store only at start: restart hypeman if the store was edited while it ran"))
    # An unknown mode (no guest past GPU init yet, no metrics) is shown in the sentinel section and the
    # fleet report, not raised: it is what every healthy host looks like before its guests boot.
    if sentinel is not None and sentinel["watched_instances"] and (
            sentinel["log_evidence"] == "partial" and sentinel["sentinel_mode"] == "markers"
            or sentinel["sentinel_mode"] == "vsock" and not metrics_ok):
        issues.append(issue(
            "warning", "sentinel_evidence_incomplete",
            "sentinel mode %s (%s); guest-log evidence is %s: %s" % (
                sentinel["sentinel_mode"], sentinel["sentinel_mode_reason"], sentinel["log_evidence"],
                sentinel["log_evidence_reason"]),
            "set metrics_url (hypeman_vgpu_metrics_url) so the audit reads hypeman's own sentinel checks"
            if sentinel["sentinel_mode"] == "vsock" else
            "restart the listed guests on a hypeman whose sentinel reads their agent, or upgrade hypeman"))
    if placement is not None:
        for gpu in placement["gpus"]:
            if gpu["vf_total"] == 0 and (gpu["sriov_totalvfs"] or 0) > 0:
                # SR-IOV off on a capable card (an interrupted recovery, a manual sriov-manage -d):
                # no VF, no slot, and no quarantine that would make any other issue show it.
                issues.append(issue(
                    "warning", "card_without_vfs",
                    "card %s has no VFs (sriov_numvfs %s of %s): it gives hypeman no slots" % (
                        gpu["address"], gpu["sriov_numvfs"], gpu["sriov_totalvfs"]),
                    "if a recovery was interrupted, run playbooks/recover_gpu.yml -e target_gpu=%s again (it "
                    "resumes); otherwise enable SR-IOV (hypeman.vgpu.gpu_sriov state=enabled)" % gpu["address"],
                    gpu["address"]))
            elif gpu["drained"] and gpu["idle"]:
                issues.append(issue(
                    "warning", "card_ready_for_cycle",
                    "card %s is drained (all %d VFs quarantined) and idle" % (gpu["address"], gpu["vf_total"]),
                    "recover it: playbooks/recover_gpu.yml -e target_gpu=%s" % gpu["address"], gpu["address"]))
            elif gpu["drained"]:
                issues.append(issue(
                    "info", "card_draining",
                    "card %s is drained but not idle: %s" % (gpu["address"], "; ".join(gpu["idle_blockers"] or [])),
                    "wait for its instances to stop, then recover it", gpu["address"]))
            elif gpu["overflow_only"]:
                issues.append(issue(
                    "warning", "card_overflow_only",
                    "card %s has %d of %d VFs quarantined; hypeman places on it only as overflow" % (
                        gpu["address"], gpu["quarantined"], gpu["vf_total"]),
                    "drain and recover the card when capacity allows (playbooks/recover_gpu.yml)", gpu["address"]))
        if placement["unreadable_metadata"]:
            issues.append(issue(
                "warning", "unreadable_metadata",
                "%d instance metadata file(s) cannot be read; hypeman's reconcile fails closed: %s" % (
                    len(placement["unreadable_metadata"]), ", ".join(placement["unreadable_metadata"])),
                "inspect and fix or remove the files"))
        if placement["unreadable_vfs"]:
            issues.append(issue(
                "warning", "unreadable_vfs",
                "%d VF(s) cannot be read and are skipped by hypeman: %s" % (
                    len(placement["unreadable_vfs"]), ", ".join(str(a) for a in placement["unreadable_vfs"])),
                "check the driver state of these VFs; an SR-IOV cycle recreates them"))
    for entry in result.get("at_risk_vfs") or []:
        issues.append(issue(
            "warning", "vf_at_risk",
            "VF %s (card %s) may be wedged: %s at %s (%d signal(s)); evidence: %s" % (
                entry["vf"], entry["card"], entry["reason"], entry["time"], entry["signals"],
                entry["evidence"][-1]["line"][:300]),
            "confirm before the next guest lands on it: assign the same profile on another VF of the card "
            "(docs/runbook.md, 'Confirm an at-risk VF'); a wedged VF needs an SR-IOV cycle of its card",
            entry["vf"]))
    wedge = result.get("wedge_signals")
    if wedge is not None and not wedge["complete"]:
        issues.append(issue(
            "info", "wedge_signals_unread",
            "wedge-risk signals not read from: %s" % "; ".join(
                "%s (%s)" % (s["from"], s["error"]) for s in wedge["sources"] if s["error"]),
            "give hypeman_log_path/kernel_log_path, or make journalctl readable; until then no at-risk VF "
            "means nothing was looked at"))
    api = result["api"]
    if api is not None:
        if api["error"]:
            issues.append(issue("critical", "api_unreachable", api["error"],
                                "check that hypeman runs and the API token is valid"))
        elif api["mismatches"]:
            issues.append(issue(
                "warning", "api_mismatch",
                "hypeman's /resources differs from the files: %s" % ", ".join(
                    "%s local=%s api=%s" % (m["field"], m["local"], m["api"]) for m in api["mismatches"]),
                "hypeman reads the store only at start: restart hypeman if the store was edited while it ran"))
    hypeman = result["hypeman"]
    if hypeman_expected and hypeman["running"] is False:
        issues.append(issue("warning", "hypeman_not_running", "no hypeman process is running",
                            "start hypeman (systemctl start hypeman)"))
    for check in result.get("prerequisites") or []:
        if check["status"] != "pass":
            issues.append(issue("warning", "prerequisite_failed", "%s: %s" % (check["name"], check["detail"]),
                                check["fix"], check["name"]))
    order = dict((severity, index) for index, severity in enumerate(SEVERITIES))
    issues.sort(key=lambda item: order[item["severity"]])
    return issues


# --- the audit ----------------------------------------------------------------------------------


def audit_host(paths, threshold=None, api=None, sentinel=True, prereq=None, hypeman_expected=True, wedge=None,
               metrics=None, sentinel_mode="auto"):
    """Audit one host; returns ``(result, warnings)``.

    ``api``: None or ``{url, token, validate_certs, timeout}``; ``metrics``:
    None or ``{url, timeout}`` of hypeman's Prometheus endpoint; ``prereq``:
    None or ``{sriov_manage, dcgm_units, unit_dirs}`` to check prerequisites;
    ``wedge``: None or a ``_wedge.Options`` to read the wedge-risk signals.
    Only a bad explicit ``threshold`` raises; every other failure is kept in
    ``result["errors"]`` as ``{section, error}``.
    """
    errors, warnings = [], []
    threshold, threshold_source = _hypeman.resolve_threshold(threshold, paths.config_path) \
        if threshold is not None else _config_threshold(paths.config_path, errors)
    result = {"threshold": threshold, "threshold_source": threshold_source, "errors": errors,
              "store": None, "placement": None, "sentinel": None, "api": None, "capacity": None,
              "hypeman": hypeman_section(paths.proc_root), "prerequisites": None, "footprint": None,
              "wedge_signals": None, "at_risk_vfs": [], "metrics": None}
    if result["hypeman"]["error"]:
        errors.append({"section": "hypeman", "error": result["hypeman"]["error"]})
    view = None
    try:
        view, view_warnings = _placement.host_view(
            paths.sysfs_root, paths.proc_root, paths.dev_root, paths.data_dir, paths.store_path, paths.config_path,
            wedge=(wedge, paths.state_dir) if wedge is not None and wedge.enabled else None)
        warnings.extend(view_warnings)
        if view.get("wedge_signals") is not None:
            from ansible_collections.hypeman.vgpu.plugins.module_utils import _wedge

            result["wedge_signals"] = view["wedge_signals"]
            result["at_risk_vfs"] = view["at_risk_vfs"]
            warnings.extend(_wedge.warnings(view["wedge_signals"]))
        result["placement"] = placement_section(view)
        result["capacity"] = capacity_section(result["placement"])
    except VgpuError as err:
        errors.append({"section": "placement", "error": err.msg})
    store = _store.load_store(paths.store_path)
    try:
        ledger = _ledger.read_ledger(paths.state_dir)
    except VgpuError as err:
        ledger = None
        errors.append({"section": "ledger", "error": err.msg})
    discovered = None
    if view is not None:
        discovered = set(vf["address"] for vf in view["vfs"])
        discovered.update(entry.get("address") for entry in view["unreadable_vfs"])
    result["store"] = store_section(store, threshold, ledger, discovered)
    result["footprint"] = footprint_section(paths, result["placement"])
    if metrics is not None and metrics.get("url"):
        result["metrics"] = metrics_section(metrics["url"], metrics.get("timeout", 10), paths.state_dir)
        if result["metrics"]["previous_error"]:
            warnings.append(result["metrics"]["previous_error"])
    if sentinel:
        try:
            sample = result["metrics"]["sample"] if result["metrics"] else None
            result["sentinel"] = sentinel_section(paths.data_dir, paths.state_dir, store, threshold, sentinel_mode,
                                                  sample, sample is not None)
            warnings.extend(result["sentinel"]["warnings"])
        except VgpuError as err:
            errors.append({"section": "sentinel", "error": err.msg})
    if result["metrics"] is not None:
        finish_metrics_section(result["metrics"], result["sentinel"], result["store"])
    if api is not None and api.get("url"):
        result["api"] = api_section(view, api["url"], api.get("token"), api.get("validate_certs", True),
                                    api.get("timeout", 10))
    if prereq is not None:
        # Loaded only when asked (vgpu_host's check): a fleet audit does not check prerequisites.
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _prerequisites
        result["prerequisites"] = _prerequisites.prerequisites(
            paths.sysfs_root, paths.proc_root, prereq["sriov_manage"], prereq.get("dcgm_units") or DEFAULT_DCGM_UNITS,
            prereq.get("unit_dirs") or DEFAULT_UNIT_DIRS)
    result["issues"] = classify(result, hypeman_expected)
    result["needs_action"] = any(item["severity"] != "info" for item in result["issues"])
    return result, warnings


def _config_threshold(config_path, errors):
    try:
        return _hypeman.read_quarantine_threshold(config_path)
    except VgpuError as err:
        errors.append({"section": "config", "error": err.msg})
        return _hypeman.DEFAULT_QUARANTINE_THRESHOLD, "default (config unreadable)"
