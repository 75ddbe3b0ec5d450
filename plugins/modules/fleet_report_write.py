#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_report_write
short_description: Build the fleet report and write its files on the controller
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Renders every format the fleet report names in its C(reports) mapping (format to path, from the
    P(hypeman.vgpu.fleet_report#filter) filter) and writes each file on the Ansible controller.
  - Given O(hosts) instead of O(report), it builds the report itself from C(hostvars) first, exactly as the
    P(hypeman.vgpu.fleet_report#filter) filter does with the same arguments, and returns its fleet-wide part
    (RV(report)), so the per-host entries of a large fleet never pass through a task argument or a fact.
  - An action that runs entirely on the controller, with no module run on any host; the
    P(hypeman.vgpu.fleet_reconcile#role) role writes its report with it once per run.
  - A missing directory is created (mode C(0755); an existing one is left as it is). A file that already
    holds the same bytes is not touched. The others are replaced together and atomically - each new version
    is written to a temporary file in the same directory, keeping the old file's owner, group and mode
    (C(0644) for a new file), and fsynced; only when all are ready are they renamed into place, so a failure
    changes none of them.
  - Anything but a regular file where a report goes (a FIFO, a directory, a symlink) fails the task naming
    it; it is never opened for reading. The report directory may be a symlink; a directory below it may not.
  - When the report keeps a history (C(history.record_file)), this run's history record is written the
    same way and the records the report lists in C(history.expired) (only files directly inside
    C(history.dir)) are deleted. A C(history) that is not a real directory gets no record.
  - One host's result of the wrong shape becomes that host's C(audit_failed) entry naming the field; the
    report is written for every host.
  - The report is the job's output, not a change to a managed host, so the result is never C(changed)
    and the files are written in check mode too.
options:
  report:
    description:
      - The fleet report, as built by the P(hypeman.vgpu.fleet_report#filter) filter.
      - Its C(reports) mapping (format to path) says what to write; an empty one writes nothing.
      - Exactly one of O(report) and O(hosts) is required.
    type: dict
  hosts:
    description:
      - Build the report from these hosts' results in C(hostvars), for example C(ansible_play_hosts_all).
      - The options below are the P(hypeman.vgpu.fleet_report#filter) filter's arguments of the same names and
        apply only with O(hosts).
    type: list
    elements: str
  kind:
    description: V(audit) or V(reconcile).
    type: str
    default: audit
  generated_at:
    description: The report's time, RFC 3339 in UTC.
    type: str
  check_mode:
    description: Whether the run is a check-mode run (said in the report).
    type: bool
    default: false
  policies:
    description: The C(audit_fail_on) policies.
    type: raw
  report_dir:
    description: Where the report files go (none are written without it).
    type: str
  formats:
    description: The report formats to write.
    type: list
    elements: str
    default: [json, markdown, html]
  fact:
    description: The (cacheable) fact a host's entry may be kept in.
    type: str
    default: fleet_reconcile_entry
  result:
    description: The registered variable of this run's audit, which wins over the fact.
    type: str
  max_age:
    description: Entries older than this many seconds count as missing.
    type: raw
  history_keep:
    description: How many reports the history keeps (0 for none).
    type: raw
    default: 0
attributes:
  action:
    description: Runs on the controller only.
    support: full
  async:
    description: Not supported.
    support: none
  check_mode:
    description: Writes the report in check mode too (it is the job's output).
    support: full
  diff_mode:
    description: Returns no diff.
    support: none
  platform:
    description: The controller.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Build the fleet report from this play's hosts and write it (JSON, Markdown, HTML)
  hypeman.vgpu.fleet_report_write:
    hosts: "{{ ansible_play_hosts_all }}"
    result: fleet_reconcile_audit_run
    generated_at: "{{ now(utc=true, fmt='%Y-%m-%dT%H:%M:%SZ') }}"
    report_dir: /srv/reports
  register: fleet_report
  run_once: true

- name: Write a fleet report built by the filter
  hypeman.vgpu.fleet_report_write:
    report: "{{ hostvars | hypeman.vgpu.fleet_report(ansible_play_hosts_all, report_dir='/srv/reports') }}"
  run_once: true
"""

RETURN = r"""
written:
  description: The files written (missing or different before).
  returned: success
  type: list
  elements: str
  sample: [/srv/reports/fleet-audit.json]
unchanged:
  description: The files that already held the report's bytes.
  returned: success
  type: list
  elements: str
  sample: [/srv/reports/fleet-audit.md]
history_deleted:
  description: The expired history records deleted.
  returned: success
  type: list
  elements: str
  sample: [/srv/reports/history/fleet-audit-20261101T000000Z.json]
report:
  description:
    - The report without its per-host entries (C(hosts)) - C(summary), C(policy), C(reports), C(history) and the
      rest as the P(hypeman.vgpu.fleet_report#filter) filter returns them (docs/audit-report.md).
  returned: success
  type: dict
  sample: {"kind": "audit", "summary": {"hosts_total": 1, "hosts_needing_action": 0}, "policy": {"violations": []}}
"""
