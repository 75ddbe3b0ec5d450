#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: host_audit_info
short_description: Audit one hypeman vGPU host in a single read-only pass
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Everything a fleet audit needs from one host, in one module call, so an hourly audit of hundreds of
    hosts stays cheap. It composes what M(hypeman.vgpu.vf_health_info), M(hypeman.vgpu.vgpu_placement_info)
    and M(hypeman.vgpu.vgpu_sentinel_scan) read, with the same helpers.
  - The VF health store as hypeman judges it (valid, legacy or invalid, in which case placement is disabled),
    quarantined VFs split into those this collection owns (ledger) and those hypeman made, VFs with failures
    below the threshold, VFs hypeman's next load would quarantine, and records for VFs sysfs no longer shows.
  - Per card hypeman's placement facts (drained, idle and ready for an SR-IOV cycle, overflow-only) and the
    slots lost to quarantine.
  - The standing sentinel verdicts of the guest logs and, for each, what reporting it would change in the
    store. The scan runs read-only - sentinel cursors are read, never moved - so the audit writes nothing.
  - Whether a hypeman process runs and, with O(api_url), whether hypeman's C(GET /resources) agrees with
    the files.
  - The wedge-risk signals (O(wedge_signals)) - VFs hypeman hard-killed a hypervisor of, or whose QEMU the
    kernel's OOM killer killed, as RV(at_risk_vfs) and one C(vf_at_risk) warning each, with evidence. They never
    quarantine. A source that cannot be read gives the info issue C(wedge_signals_unread).
  - Optionally the host prerequisites (O(prerequisites)) - IOMMU, vfio and NVIDIA vGPU modules,
    C(sriov-manage), vendor-VFIO framework, DCGM units - each with a fix.
  - What of a hypeman vGPU host was found at the given paths (RV(footprint)). A host with neither an NVIDIA SR-IOV
    GPU under O(sysfs_root) nor hypeman's O(data_dir) gets the issue C(host_not_vgpu), so an inventory with wrong
    host paths (or a host that is not a hypeman vGPU host) never looks healthy.
  - RV(issues) classifies all of it for an operator; RV(needs_action) is true when any issue is a warning or
    critical. A section that cannot be read is reported in RV(errors) and the rest is still returned.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.info_module
  - hypeman.vgpu.wedge_signals
options:
  threshold:
    description:
      - Quarantine threshold for RV(store.would_quarantine) and RV(store.below_threshold), for example a
        threshold about to be configured. Defaults to C(gpu.vf_quarantine_threshold) from O(config_path),
        else hypeman's default 2. Must be 1 or more.
    type: int
  sentinel:
    description:
      - Scan the guest logs for sentinel verdicts (read-only).
    type: bool
    default: true
  hypeman_expected:
    description:
      - Whether hypeman should be running here; when true a host without a hypeman process gets the issue
        C(hypeman_not_running).
    type: bool
    default: true
  prerequisites:
    description:
      - Also check the host prerequisites and return them in RV(prerequisites).
    type: bool
    default: false
  sriov_manage:
    description:
      - Path of NVIDIA's C(sriov-manage), checked with O(prerequisites).
    type: path
    default: /usr/lib/nvidia/sriov-manage
  dcgm_units:
    description:
      - DCGM systemd units whose unit files must exist, checked with O(prerequisites). Each is a unit file name
        (no C(/)).
    type: list
    elements: str
    default: [nvidia-dcgm.service, nvidia-dcgm-exporter.service]
  unit_dirs:
    description:
      - Directories searched for the O(dcgm_units) unit files.
    type: list
    elements: path
    default: [/etc/systemd/system, /run/systemd/system, /usr/local/lib/systemd/system, /usr/lib/systemd/system,
              /lib/systemd/system]
  metrics_url:
    description:
      - hypeman's Prometheus endpoint, for example V(http://127.0.0.1:9464/metrics) (hypeman serves it on
        C(metrics.listen_address):C(metrics.port), default 127.0.0.1:9464).
      - The audit reads hypeman's own sentinel counters from it (RV(metrics)), decides the sentinel mode from
        them, compares them with the previous sample in O(state_dir) (C(sentinel-metrics.json), written by the
        C(fleet_reconcile) role) for the issue C(sentinel_coverage_lost), and cross-checks the quarantined-VF
        gauge with the store. Not read when omitted.
    type: str
  metrics_timeout:
    description:
      - Seconds the whole metrics request may take; a slower or endless answer is an error in RV(metrics.error).
    type: int
    default: 10
  sentinel_mode:
    description:
      - Which hypeman sentinel watches this host, as for M(hypeman.vgpu.vgpu_sentinel_scan). V(auto) decides
        from hypeman's metrics (with O(metrics_url)) and the guests' console lines.
    type: str
    choices: [auto, markers, vsock]
    default: auto
  prometheus_textfile:
    description:
      - A node_exporter textfile (for example C(/var/lib/node_exporter/textfile/hypeman_vgpu.prom)) to read back
        as RV(prometheus_textfile), so a caller that rewrites it after the audit can skip an unchanged one
        without another module run. Read only; the P(hypeman.vgpu.fleet_reconcile#role) role passes its
        C(fleet_reconcile_prometheus_dir) file.
      - A symlink is not followed, nor read.
    type: path
notes:
  - It accepts every host-path option of the C(group/hypeman.vgpu.host) action group.
  - The placement view and the store section are two reads of the store; a write by hypeman between them
    shows as a difference once.
  - C(docs/audit-report.md) in the collection documents every issue code.
seealso:
  - module: hypeman.vgpu.vf_health_info
  - module: hypeman.vgpu.vgpu_placement_info
  - module: hypeman.vgpu.vgpu_sentinel_scan
"""

EXAMPLES = r"""
- name: Audit this host
  hypeman.vgpu.host_audit_info:
  register: audit

- name: Show what needs doing
  ansible.builtin.debug:
    msg: "{{ audit.issues | rejectattr('severity', 'equalto', 'info') | map(attribute='message') | list }}"
  when: audit.needs_action

- name: Audit with the API cross-check and the prerequisites
  hypeman.vgpu.host_audit_info:
    api_url: http://127.0.0.1:8080
    api_token: "{{ hypeman_vgpu_api_token }}"
    prerequisites: true
  register: audit

- name: What would a threshold of 1 quarantine?
  hypeman.vgpu.host_audit_info:
    threshold: 1
    sentinel: false
  register: what_if
"""

RETURN = r"""
threshold:
  description: The threshold used.
  returned: always
  type: int
  sample: 2
threshold_source:
  description: Where it came from (V(option), V(default) or the config file path).
  returned: always
  type: str
  sample: /etc/hypeman/config.yaml
errors:
  description: Sections that could not be read, as C({section, error}); the rest of the audit still answers.
  returned: always
  type: list
  elements: dict
  sample: []
store:
  description: The VF health store.
  returned: always
  type: dict
  contains:
    path:
      description: Store path.
      type: str
    exists:
      description: Whether the file exists.
      type: bool
    format:
      description: V(v1), V(legacy), V(invalid) or V(missing).
      type: str
    valid:
      description: Whether hypeman loads it; when false hypeman disables placement.
      type: bool
    error:
      description: hypeman's load error, or null.
      type: str
    symlink:
      description: Whether the store file is a symlink.
      type: bool
    records:
      description: Number of records.
      type: int
    quarantined:
      description: Quarantined VFs.
      type: list
      elements: str
    owned:
      description: Quarantined VFs this collection owns (null when the ledger cannot be read).
      type: list
      elements: str
    by_hypeman:
      description: Quarantined VFs this collection does not own (null when the ledger cannot be read).
      type: list
      elements: str
    would_quarantine:
      description: VFs hypeman's next load quarantines at RV(threshold).
      type: list
      elements: str
    below_threshold:
      description: Unquarantined VFs with failures below RV(threshold), with their failure count.
      type: dict
    stale_records:
      description: VFs with a record that sysfs does not show.
      type: list
      elements: str
    recoverable:
      description: For a store that is not valid, the VFs a repair keeps quarantined.
      type: list
      elements: str
  sample: {"path": "/var/lib/hypeman/gpu/vf-health.json", "format": "v1", "valid": true, "quarantined": []}
placement:
  description: hypeman's placement view (null when it cannot be computed, see RV(errors)).
  returned: always
  type: dict
  contains:
    framework:
      description: V(vendor-vfio), V(mdev) or V(none).
      type: str
    placement_disabled_reason:
      description: Why hypeman refuses every placement, or null.
      type: str
    threshold:
      description: The configured threshold placement used.
      type: int
    slots:
      description: C(total), C(used), C(allocatable), C(quarantined) as hypeman's C(/resources).
      type: dict
    pending_quarantine:
      description: VFs counted as quarantined because hypeman's next load quarantines them.
      type: list
      elements: str
    gpus:
      description:
        - Per card C(address), C(vf_total), C(sriov_numvfs), C(sriov_totalvfs), C(quarantined), C(allocatable),
          C(allocated), C(claimed), C(held_open), C(overflow_only), C(drained), C(idle), C(idle_blockers),
          C(live_instances) as M(hypeman.vgpu.vgpu_placement_info) returns them, and C(below_threshold_vfs),
          the card's unquarantined VFs with failures below the threshold.
      type: list
      elements: dict
    unreadable_vfs:
      description: VFs hypeman skips.
      type: list
      elements: str
    unreadable_metadata:
      description: Instance metadata files hypeman cannot load.
      type: list
      elements: str
    held_open_error:
      description: Why open handles are unknown, or null.
      type: str
capacity:
  description: Slots lost to quarantine (all slots while placement is disabled); null without placement.
  returned: always
  type: dict
  contains:
    total_slots:
      description: Discovered VFs.
      type: int
    allocatable_slots:
      description: Allocatable VFs.
      type: int
    quarantined_slots:
      description: Quarantined VFs.
      type: int
    lost_slots:
      description: Slots lost.
      type: int
    lost_pct:
      description: Lost slots in percent of the total.
      type: float
  sample: {"total_slots": 32, "allocatable_slots": 29, "quarantined_slots": 1, "lost_slots": 1, "lost_pct": 3.12}
sentinel:
  description: Sentinel verdicts (null with O(sentinel=false) or when the scan failed).
  returned: always
  type: dict
  contains:
    findings:
      description:
        - Standing verdict per current assignment, as C({instance_id, vf_address, assigned_at, verdict, ts,
          nvrm, effect}); C(effect) is the store outcome a report would have now (C(unchanged) when the store
          holds it already; null while the store is not valid).
      type: list
      elements: dict
    unreported:
      description: The findings whose report would change the store.
      type: list
      elements: dict
    skipped_instances:
      description: Instances not scanned, with the reason.
      type: list
      elements: dict
    unattributed:
      description: Number of markers that belong to no current assignment.
      type: int
    history:
      description: Number of previous-boot archives with markers.
      type: int
    warnings:
      description: Scan warnings.
      type: list
      elements: str
    sentinel_mode:
      description: C(markers), C(vsock) or C(unknown), as RV(hypeman.vgpu.vgpu_sentinel_scan#module:sentinel_mode).
      type: str
    sentinel_mode_reason:
      description: The evidence the mode was decided from, or why it is unknown.
      type: str
    instance_modes:
      description: C({instance_id, sentinel_mode, sentinel_mode_reason}) per scanned guest.
      type: list
      elements: dict
    log_evidence:
      description:
        - C(complete), C(partial) or C(none); anything but C(complete) means empty RV(sentinel.findings) is not a
          health statement (issue C(sentinel_evidence_incomplete) unless hypeman's metrics cover the host).
      type: str
    log_evidence_reason:
      description: What RV(sentinel.log_evidence) means here.
      type: str
    watched_instances:
      description: Instances with a vendor-VFIO vGPU claim, which hypeman's sentinel polls.
      type: int
metrics:
  description:
    - hypeman's own sentinel numbers from O(metrics_url); null without it.
  returned: always
  type: dict
  contains:
    url:
      description: The URL read.
      type: str
    error:
      description: Why the metrics could not be read (unreachable, HTTP error, too large, too slow, not Prometheus
        text); null when read.
      type: str
    sample:
      description:
        - C({taken_at, version, uptime_seconds, checks, init_failures, quarantines, quarantined_vfs,
          store_unavailable}); C(checks) maps each C(result) (C(ok), C(failed), C(unknown), C(rpc_error),
          C(list_error), C(unsupported_agent)) to its count and is null when hypeman exports no sentinel check
          counter. The fleet_reconcile role keeps it as the next run's previous sample.
      type: dict
    previous:
      description: The previous sample read from O(state_dir), or null.
      type: dict
    previous_error:
      description: Why a previous sample file was ignored, or null.
      type: str
    coverage_problems:
      description: Why hypeman's sentinel lost sight of guests since the previous sample (issue C(sentinel_coverage_lost)).
      type: list
      elements: str
    store_quarantined:
      description: Quarantined VFs in the store file, to compare with C(sample.quarantined_vfs); null when the
        store is not valid.
      type: int
hypeman:
  description: Whether a C(hypeman-api)/C(hypeman) process runs (C(running) null when it cannot be told).
  returned: always
  type: dict
  sample: {"running": true, "pids": [812], "error": null}
api:
  description: With O(api_url), hypeman's C(GET /resources) compared with the files; null otherwise.
  returned: always
  type: dict
  contains:
    url:
      description: URL asked.
      type: str
    reachable:
      description: hypeman answered.
      type: bool
    status:
      description: HTTP status.
      type: int
    error:
      description: What went wrong, or null.
      type: str
    mismatches:
      description: Fields where hypeman and the files differ, as C({field, local, api}).
      type: list
      elements: dict
    missing_fields:
      description: Newer fields this hypeman does not send.
      type: list
      elements: str
prerequisites:
  description: With O(prerequisites), each check as C({name, status, detail, fix}); null otherwise.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "iommu", "status": "pass", "detail": "kernel command line has intel_iommu=on", "fix": null}]
footprint:
  description:
    - What of a hypeman vGPU host the audit found at its paths. C(not_vgpu) is true when there is neither an NVIDIA
      SR-IOV GPU nor hypeman's data directory (issue C(host_not_vgpu)); false while the cards cannot be read.
  returned: always
  type: dict
  contains:
    sysfs_devices:
      description: The PCI devices directory looked at (C(<sysfs_root>/bus/pci/devices)).
      type: str
    sysfs_devices_exist:
      description: Whether that directory exists.
      type: bool
    nvidia_sriov_cards:
      description: NVIDIA SR-IOV capable GPUs found there (null when placement could not be read).
      type: int
    data_dir:
      description: hypeman's data directory looked at.
      type: str
    data_dir_exists:
      description: Whether it is a directory.
      type: bool
    config_path:
      description: hypeman's config file looked at.
      type: str
    config_exists:
      description: Whether it exists.
      type: bool
    not_vgpu:
      description: Neither a card nor the data directory was found.
      type: bool
  sample: {"sysfs_devices": "/sys/bus/pci/devices", "sysfs_devices_exist": true, "nvidia_sriov_cards": 2,
           "data_dir": "/var/lib/hypeman", "data_dir_exists": true, "config_path": "/etc/hypeman/config.yaml",
           "config_exists": true, "not_vgpu": false}
issues:
  description:
    - What an operator should know, most severe first, as C({severity, code, message, action, subject}).
    - C(severity) is V(critical), V(warning) or V(info).
  returned: always
  type: list
  elements: dict
  sample: [{"severity": "warning", "code": "card_ready_for_cycle", "message": "card 0000:82:00.0 is drained",
            "action": "recover it", "subject": "0000:82:00.0"}]
at_risk_vfs:
  description:
    - VFs a wedge-risk signal concerns, as in M(hypeman.vgpu.vgpu_placement_info)'s RV(at_risk_vfs)
      (C({vf, card, reason, reasons, time, instance_id, signals, evidence})); empty when not read.
  returned: always
  type: list
  elements: dict
wedge_signals:
  description:
    - What was read for RV(at_risk_vfs) (C({enabled, since, boot_time, sources, complete, unattributed, superseded,
      ledger_error})), as in M(hypeman.vgpu.vgpu_placement_info); null when O(wedge_signals) is false or the
      placement view failed.
  returned: always
  type: dict
prometheus_textfile:
  description:
    - With O(prometheus_textfile), that file as found; null otherwise.
    - C(content) is its text when it is a regular file (not a symlink) of valid UTF-8 no larger than 4 MiB, else
      null; C(mode) its permission bits as four octal digits (null when there is no such file); C(error) why it
      could not be read, null when it was read or does not exist.
  returned: always
  type: dict
  sample: {"path": "/var/lib/node_exporter/textfile/hypeman_vgpu.prom", "content": "# HELP ...", "mode": "0644",
           "error": null}
needs_action:
  description: Whether any issue is a warning or critical.
  returned: always
  type: bool
  sample: false
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils import _audit, _fileio, _wedge
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import (
    run_host_module, shown, store_path)


# node_exporter's textfiles are a few KiB; a bigger file is read as unknown (and rewritten by the caller).
TEXTFILE_LIMIT = 4 * 1024 * 1024


def read_textfile(path):
    """``{path, content, mode, error}`` of a node_exporter textfile, for the caller's "unchanged?" test."""
    found = {"path": path, "content": None, "mode": None, "error": None}
    try:
        fd, st = _fileio.open_regular(path, follow=False)
        try:
            found["mode"] = "%04o" % (st.st_mode & 0o7777)
            data = _fileio.read_fd(fd, path, TEXTFILE_LIMIT)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return found
    except OSError as err:
        found["error"] = "%s: %s" % (path, err.strerror or err)
        return found
    try:
        found["content"] = data.decode("utf-8")
    except UnicodeDecodeError as err:
        found["error"] = "%s: not UTF-8 text (%s)" % (path, err.reason)
    return found


def _body(module):
    params = module.params
    paths = _audit.Paths(params["data_dir"], store_path(params), params["sysfs_root"], params["proc_root"],
                         params["dev_root"], params["state_dir"], params["config_path"])
    api = None
    if params["api_url"]:
        api = {"url": params["api_url"], "token": params["api_token"],
               "validate_certs": params["validate_certs"], "timeout": params["api_timeout"]}
    for unit in params["dcgm_units"] or []:
        if not unit or "/" in unit or "\0" in unit or unit in (".", "..") \
                or len(unit.encode("utf-8", "surrogateescape")) > 255:
            raise VgpuError("dcgm_units entry %s is not a systemd unit name; expected a name such as "
                            "nvidia-dcgm.service" % shown(unit))
    if params["metrics_url"] is not None:
        # Lazy: an audit without metrics_url need not compile it (nor load http.client).
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _metrics
        problem = _metrics.url_problem(params["metrics_url"])
        if problem:
            raise VgpuError(problem)
        if not 0 < params["metrics_timeout"] <= 3600:
            raise VgpuError("metrics_timeout is %d; expected seconds between 1 and 3600" % params["metrics_timeout"])
    prereq = None
    if params["prerequisites"]:
        prereq = {"sriov_manage": params["sriov_manage"], "dcgm_units": params["dcgm_units"],
                  "unit_dirs": params["unit_dirs"]}
    result, warnings = _audit.audit_host(paths, threshold=params["threshold"], api=api,
                                         sentinel=params["sentinel"], prereq=prereq,
                                         hypeman_expected=params["hypeman_expected"],
                                         wedge=_wedge.Options.from_params(params),
                                         metrics={"url": params["metrics_url"], "timeout": params["metrics_timeout"]}
                                         if params["metrics_url"] else None,
                                         sentinel_mode=params["sentinel_mode"])
    for warning in warnings:
        module.warn(warning)
    textfile = params["prometheus_textfile"]
    result["prometheus_textfile"] = read_textfile(textfile) if textfile else None
    result["changed"] = False
    return result


def main():
    run_host_module(AnsibleModule, _body, dict(
        threshold=dict(type="int"),
        sentinel=dict(type="bool", default=True),
        hypeman_expected=dict(type="bool", default=True),
        prerequisites=dict(type="bool", default=False),
        sriov_manage=dict(type="path", default="/usr/lib/nvidia/sriov-manage"),
        dcgm_units=dict(type="list", elements="str",
                        default=list(_audit.DEFAULT_DCGM_UNITS)),
        unit_dirs=dict(type="list", elements="path", default=list(_audit.DEFAULT_UNIT_DIRS)),
        metrics_url=dict(type="str"),
        metrics_timeout=dict(type="int", default=10),
        sentinel_mode=dict(type="str", default="auto", choices=["auto", "markers", "vsock"]),
        prometheus_textfile=dict(type="path"),
        **_wedge.argument_spec()
    ))


if __name__ == "__main__":
    main()
