#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_sentinel_scan
short_description: Scan guest serial logs for hypeman's GPU init markers and optionally report them
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - >-
    Reads each vGPU instance's serial console log (C(<data_dir>/guests/<id>/logs/app.log)) for the
    strict marker lines hypeman's guest agent prints when NVIDIA driver init fails
    (C(HYPEMAN-GPU-INIT-FAILED ts=... nvrm="NVRM: ... RmInitAdapter failed! ...")) or succeeds
    (C(HYPEMAN-GPU-INIT-OK ts=...)).
  - Only a complete, standalone guest-agent line counts, matched with hypeman's anchored patterns.
    A raw C(NVRM) line, a bare marker, a marker inside another line, an echoed command, trailing
    text, or an C(nvrm) without C(RmInitAdapter failed!) never counts. Lines over 64 KiB are skipped.
  - Markers in the current C(app.log) belong to the instance's current assignment (the VF of
    C(GPUDevicePath) and the claim time C(GPUClaimedAt) or C(GPUAssignedAt)). Host-side facts decide
    which bytes were written during the assignment, never the guest clock alone. A log file whose
    modification time is before the assignment or before the current boot (the newest
    C(app.log.prev.<ns>)) is not evidence, so a previous boot's C(app.log.1) is never replayed, and
    bytes read under a previous assignment stay with it. A marker whose C(ts) is earlier than the
    assignment is not attributed either. Within the evidence of one assignment the last marker wins
    (C(FAILED) then C(OK) is a resolved C(ok)), and the three copies the agent prints count once.
  - C(app.log.prev.<ns>) archives belong to earlier boots and are returned as RV(history) only, never
    reported to the store. Instances without a vendor-VFIO claim and retention stubs are skipped
    with a reason.
  - Logs are read only from real directories and regular files inside C(<data_dir>/guests/<id>/). A
    symlinked instance directory, C(logs/) or log file, or a log with other hard links, skips that
    instance with a reason in RV(skipped_instances) and a warning.
  - A durable cursor per instance in O(state_dir) (keyed by instance, assignment and file identity)
    makes a later run read only new bytes. It survives hypeman's copytruncate rotation (the unread
    tail of C(app.log.1) is read first) and a corrupt cursor file is rebuilt with a warning.
  - Evidence is never consumed by looking at it. A findings-only run (an audit) moves the cursors,
    and a later O(record=true) run still reports every standing verdict that was not reported yet.
    Every run returns the standing verdict of each current assignment, not only what is new.
  - With O(record=true) each unreported verdict becomes hypeman's failure report (C(failed)) or
    success report (C(ok)) for that assignment in the VF health store, with hypeman's semantics. The
    store deduplicates per assignment, so running again never counts twice.
  - The cursors are internal bookkeeping. The module reports C(changed) only when the store changed.
  - See C(docs/sentinel.md) in the collection for what this scan can and cannot prove.
  - "Newer hypeman no longer prints markers: its guest agent keeps the GPU init state and hypeman's own sentinel
    polls it over vsock and records into the store itself. The scan says which era it sees as RV(sentinel_mode)
    (per guest in RV(instance_modes)) and how far the logs can show a failure as RV(log_evidence). With
    C(log_evidence) other than C(complete) an empty RV(findings) does not mean healthy, and the module warns. See
    C(docs/hypeman-versions.md)."
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.state_module
options:
  record:
    description:
      - Report every standing verdict that is not yet in the store, as hypeman's sentinel would.
      - The default V(false) only returns findings. A guest can print marker-shaped lines on its
        own console, so turn this on only where that risk is acceptable (see C(docs/sentinel.md)).
    type: bool
    default: false
  threshold:
    description:
      - Failures (distinct assignments) that quarantine a VF when O(record=true).
      - Defaults to C(gpu.vf_quarantine_threshold) from O(config_path), else hypeman's default 2.
      - Must be at least 1. Used only when O(record=true).
    type: int
  instances:
    description:
      - Scan only these instance IDs. An ID that does not exist is returned in RV(skipped_instances).
      - Without it every instance is scanned, and cursors of instances that no longer exist are removed.
    type: list
    elements: str
  sentinel_mode:
    description:
      - Which hypeman sentinel watches this host.
      - V(auto) decides from the guests' console lines (RV(instance_modes)); V(markers) or V(vsock) states it,
        for a host whose guests have not shown either era yet.
      - In V(vsock) mode (stated or detected) O(record=true) records nothing, because hypeman records every guest
        itself, and RV(record_skipped) says so.
    type: str
    choices: [auto, markers, vsock]
    default: auto
notes:
  - Check mode reads the logs and reports, and with O(record=true) predicts the store outcomes, but
    moves no cursor and writes nothing.
  - hypeman reads its store only at startup and overwrites it from memory on its next report. When
    hypeman is running, prefer its own sentinel, or stop it before a O(record=true) run and start
    it right after. With O(record=true) the module warns when it changed the store (in check mode,
    would change it) while a C(hypeman-api)/C(hypeman) process runs, and when it cannot tell from
    O(proc_root) whether one runs, as M(hypeman.vgpu.vf_health) does.
seealso:
  - module: hypeman.vgpu.vf_health
  - module: hypeman.vgpu.vf_health_info
"""

EXAMPLES = r"""
- name: Audit the guest logs (findings only, never writes the store)
  hypeman.vgpu.vgpu_sentinel_scan:
  register: sentinel

- name: Show wedged assignments
  ansible.builtin.debug:
    msg: "{{ sentinel.findings | selectattr('verdict', 'equalto', 'failed') | list }}"

- name: Report the standing verdicts to the VF health store (hypeman stopped)
  hypeman.vgpu.vgpu_sentinel_scan:
    record: true
    threshold: 2
  register: recorded

- name: Scan two instances in a simulated tree
  hypeman.vgpu.vgpu_sentinel_scan:
    data_dir: /srv/vgpu-sim/var/lib/hypeman
    state_dir: /srv/vgpu-sim/var/lib/hypeman-vgpu
    config_path: /srv/vgpu-sim/etc/hypeman/config.yaml
    instances:
      - tz4a98xxat96iws9zmbrgj3a
      - qk2b77yyat96iws9zmbrgj3b
"""

RETURN = r"""
findings:
  description:
    - The standing verdict of each current assignment that has one, whether it is new in this run or not.
    - Also, with RV(findings[].current=false), a previous assignment's C(ok) verdict that no run has recorded yet
      (the instance was reassigned since); it stays here until a O(record=true) run reports it, as hypeman retries
      a pending success for the old assignment.
  returned: always
  type: list
  elements: dict
  contains:
    instance_id:
      description: Instance ID.
      type: str
      sample: tz4a98xxat96iws9zmbrgj3a
    vf_address:
      description: VF of the assignment (basename of C(GPUDevicePath)).
      type: str
      sample: "0000:82:00.4"
    assigned_at:
      description:
        - Assignment (claim) time, UTC RFC 3339 with nanoseconds, as hypeman writes it to the store.
        - Empty when the metadata has no assignment time (hypeman reports such an assignment with an empty time too).
      type: str
      sample: "2026-08-31T12:00:00.123456789Z"
    current:
      description: Whether this is the instance's current assignment (V(false) for a previous assignment's pending C(ok)).
      type: bool
      sample: true
    verdict:
      description: C(failed) or C(ok), from the last attributed marker.
      type: str
      sample: failed
    ts:
      description: The marker's C(ts) as the guest wrote it.
      type: str
      sample: "2026-08-31T12:00:27.5Z"
    nvrm:
      description: The driver message of a C(failed) marker; null for C(ok).
      type: str
      sample: "NVRM: GPU 0000:00:03.0: RmInitAdapter failed! (0x22:0x65:884)"
    file:
      description: The log file the marker was read from.
      type: str
      sample: /var/lib/hypeman/guests/tz4a98xxat96iws9zmbrgj3a/logs/app.log
    recorded:
      description: Whether this verdict has been reported to the store (by this run or an earlier one).
      type: bool
      sample: false
    earlier_failure:
      description:
        - For an C(ok) verdict, the first C(failed) marker since the previous C(ok) when its C(ts) is more than
          5 s (one pass of hypeman's sentinel) before the OK's; null otherwise.
        - hypeman reported that failure on a pass of its own before the success, so a O(record=true) run reports it
          first, and the success then also clears the VF's older failures, as in hypeman.
      type: dict
      sample: {"ts": "2026-08-31T12:00:27.5Z", "nvrm": "NVRM: GPU 0000:00:03.0: RmInitAdapter failed! (0x22:0x65:884)",
               "file": /var/lib/hypeman/guests/tz4a98xxat96iws9zmbrgj3a/logs/app.log}
history:
  description:
    - Per C(app.log.prev.<ns>) archive (an earlier boot) that holds markers, its last marker. Never reported.
  returned: always
  type: list
  elements: dict
  contains:
    instance_id:
      description: Instance ID.
      type: str
    file:
      description: Path of the archive.
      type: str
    verdict:
      description: C(failed) or C(ok).
      type: str
    ts:
      description: The marker's C(ts).
      type: str
    nvrm:
      description: Driver message of a C(failed) marker, else null.
      type: str
    markers:
      description: Distinct reports (the agent's three copies count once) in the archive.
      type: int
scanned:
  description: Every file read in this run, with the bytes read (0 when nothing was appended).
  returned: always
  type: list
  elements: dict
  contains:
    instance_id:
      description: Instance ID.
      type: str
    file:
      description: Path of the log file.
      type: str
    bytes_read:
      description: Bytes read from it in this run.
      type: int
    markers:
      description: Marker lines found in those bytes (copies included).
      type: int
skipped_instances:
  description:
    - Instances not scanned, with the reason (no vendor-VFIO claim, retention stub, unreadable
      metadata or log, unknown ID given in O(instances)). The other instances are still scanned.
    - Not named C(skipped) because Ansible reads a true C(skipped) key as "the task was skipped".
  returned: always
  type: list
  elements: dict
  contains:
    instance_id:
      description: Instance ID.
      type: str
    reason:
      description: Why it was skipped.
      type: str
      sample: no vendor-VFIO vGPU claim
unattributed:
  description:
    - Markers read in this run that belong to no current assignment (in a file last written before
      the assignment or the current boot, C(ts) earlier than the assignment, or not a time). They are
      never reported.
  returned: always
  type: list
  elements: dict
  contains:
    instance_id:
      description: Instance ID.
      type: str
    file:
      description: Log file.
      type: str
    verdict:
      description: C(failed) or C(ok).
      type: str
    ts:
      description: The marker's C(ts).
      type: str
    nvrm:
      description: Driver message, or null.
      type: str
    reason:
      description: Why it was not attributed.
      type: str
outcomes:
  description:
    - With O(record=true), one entry per verdict reported in this run, in marker-time order.
  returned: when O(record=true)
  type: list
  elements: dict
  contains:
    instance_id:
      description: Instance ID.
      type: str
    vf_address:
      description: VF address.
      type: str
    assigned_at:
      description: Assignment time.
      type: str
    verdict:
      description: C(failed) or C(ok).
      type: str
    report:
      description: C(failure) or C(success), the hypeman report made.
      type: str
    outcome:
      description:
        - The store's outcome, as in hypeman. C(recorded), C(quarantined) or C(unchanged) for a failure,
          C(cleared), C(rescinded) or C(unchanged) for a success.
      type: str
      sample: quarantined
    cleared:
      description: Failures a success report removed (0 for a failure report).
      type: int
store_path:
  description: The VF health store used.
  returned: when O(record=true)
  type: str
  sample: /var/lib/hypeman/gpu/vf-health.json
threshold:
  description: The quarantine threshold used, and RV(threshold_source) says where it came from.
  returned: when O(record=true)
  type: int
  sample: 2
threshold_source:
  description: C(option), C(default), or the config file the threshold was read from.
  returned: when O(record=true)
  type: str
  sample: default
record_skipped:
  description: Why nothing was recorded although O(record=true) (a vsock-era host); null when recording ran.
  returned: when O(record=true)
  type: str
  sample: "not recorded: hypeman's vsock sentinel records GPU init results itself (set by the sentinel_mode option)"
sentinel_mode:
  description:
    - C(markers) (hypeman reads GPU init markers from the guest console), C(vsock) (hypeman polls the guest agent
      over vsock and records by itself) or C(unknown); RV(sentinel_mode_reason) says why.
  returned: always
  type: str
  sample: vsock
sentinel_mode_reason:
  description: The evidence RV(sentinel_mode) was decided from, or why it is unknown.
  returned: always
  type: str
  sample: "2 guest(s) show vsock-era GPU init lines: tz4a98xxat96iws9zmbrgj3a, qk2b77yyat96iws9zmbrgj3b"
instance_modes:
  description: The era each scanned guest's console shows (hypeman builds the agent into the guest it boots).
  returned: always
  type: list
  elements: dict
  contains:
    instance_id:
      description: Instance ID.
      type: str
    sentinel_mode:
      description: C(markers), C(vsock) or C(unknown).
      type: str
    sentinel_mode_reason:
      description: Why.
      type: str
log_evidence:
  description:
    - How far the guest logs can show GPU init failures on this host. C(complete) (marker-era host),
      C(partial) (some guests cannot be seen) or C(none) (vsock-era or unknown host). Anything but C(complete)
      means an empty RV(findings) is not a health statement.
  returned: always
  type: str
  sample: none
log_evidence_reason:
  description: What RV(log_evidence) means here and where to look instead.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman, _sentinel, _sentinel_mode, _sentinel_write, _store_write
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module, store_path


def _text(data):
    return "" if data is None else data.decode("utf-8", "replace")


def _body(module):
    params = module.params
    check_mode = module.check_mode
    data_dir = params["data_dir"]
    path = store_path(params)
    threshold = source = None
    if params["record"] or params["threshold"] is not None:  # a bad explicit value is an error either way
        threshold, source = _hypeman.resolve_threshold(params["threshold"], params["config_path"])
    instances, unreadable = _hypeman.list_instances(data_dir)
    store_result = {}
    mode = {}

    def log_dir_of(instance_id):
        return _hypeman.instance_log_dir(data_dir, instance_id)

    def recorder(report):
        mode["instances"] = _sentinel_mode.scanned_modes(report, instances, log_dir_of)
        mode["host"], mode["reason"] = _sentinel_mode.host_mode(params["sentinel_mode"], mode["instances"])
        pending = report.unrecorded()
        if not params["record"] or not pending:
            return []
        if mode["host"] == _sentinel_mode.VSOCK:
            # hypeman's vsock sentinel records every guest itself; a second reporter only races it.
            mode["record_skipped"] = ("not recorded: hypeman's vsock sentinel records GPU init results "
                                      "itself (%s)" % mode["reason"])
            return []
        result = _store_write.update_store(
            path, lambda store: _sentinel.record_verdicts(store, pending, threshold), check_mode=check_mode)
        store_result["update"] = result
        if not check_mode:
            report.mark_recorded(pending)
        return result.result

    report, outcomes = _sentinel_write.run(
        instances, unreadable, log_dir_of,
        params["state_dir"], only=params["instances"], check_mode=check_mode, recorder=recorder)
    for warning in report.warnings:
        module.warn(warning)
    coverage, coverage_reason = _sentinel_mode.log_evidence(mode["host"], mode["instances"])
    if coverage != "complete":
        module.warn("sentinel evidence in the guest logs is %s: %s" % (coverage, coverage_reason))
    if mode.get("record_skipped"):
        module.warn(mode["record_skipped"])

    update = store_result.get("update")
    changed = bool(update and update.changed)
    if params["record"]:
        # The same check as vf_health: a store edit while hypeman runs is lost at its next report.
        _hypeman.warn_if_store_edited_while_running(module, params["proc_root"], changed)
    result = {
        "changed": changed,
        "findings": report.findings,
        "history": report.history,
        "scanned": report.scanned,
        # "skipped" is a reserved result key (a non-empty list would mark the task skipped).
        "skipped_instances": report.skipped,
        "unattributed": report.unattributed,
        "sentinel_mode": mode["host"],
        "sentinel_mode_reason": mode["reason"],
        "instance_modes": mode["instances"],
        "log_evidence": coverage,
        "log_evidence_reason": coverage_reason,
    }
    if params["record"]:
        result.update(outcomes=outcomes or [], store_path=path, threshold=threshold, threshold_source=source,
                      record_skipped=mode.get("record_skipped"))
        if module._diff and update is not None and update.changed:
            result["diff"] = {"before": _text(update.before), "after": _text(update.after),
                              "before_header": path, "after_header": path}
    return result


def main():
    run_host_module(AnsibleModule, _body, dict(
        record=dict(type="bool", default=False),
        threshold=dict(type="int"),
        instances=dict(type="list", elements="str"),
        sentinel_mode=dict(type="str", default="auto", choices=list(_sentinel_mode.OPTION_CHOICES)),
    ))


if __name__ == "__main__":
    main()
