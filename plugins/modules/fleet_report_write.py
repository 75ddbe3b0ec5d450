#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_report_write
short_description: Write the fleet report's files on the controller
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Renders every format the fleet report names in its C(reports) mapping (format to path, from the
    P(hypeman.vgpu.fleet_report#filter) filter) and writes each file on the Ansible controller.
  - An action that runs entirely on the controller, with no module run on any host; the
    P(hypeman.vgpu.fleet_reconcile#role) role writes its report with it once per run.
  - A missing directory is created (mode C(0755); an existing one is left as it is). A file that already
    holds the same bytes with mode C(0644) is not touched; any other is replaced atomically (temporary file
    in the same directory, then a rename) with mode C(0644).
  - When the report keeps a history (C(history.record_file)), this run's history record is written the
    same way and the records the report lists in C(history.expired) (only files directly inside
    C(history.dir)) are deleted.
  - The report is the job's output, not a change to a managed host, so the result is never C(changed)
    and the files are written in check mode too.
options:
  report:
    description:
      - The fleet report, as built by the P(hypeman.vgpu.fleet_report#filter) filter.
      - Its C(reports) mapping (format to path) says what to write; an empty one writes nothing.
    type: dict
    required: true
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
- name: Write the fleet report (JSON, Markdown, HTML)
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
"""
