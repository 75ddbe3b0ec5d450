#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vf_health_info
short_description: Read hypeman's VF health store and this collection's ledger
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Returns hypeman's VF health store (C(<data_dir>/gpu/vf-health.json)) as data, judged by hypeman's own
    load rules - whether hypeman can load it, and if not hypeman's exact error - plus the records,
    the quarantined VFs, per-VF failure counts, the VFs hypeman's next load would quarantine at the
    effective threshold, which quarantines this collection owns, and recent ledger entries.
  - Never writes anything.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.info_module
options:
  threshold:
    description:
      - Threshold for RV(would_quarantine). Defaults to C(gpu.vf_quarantine_threshold) from
        O(config_path), else hypeman's default 2. Must be 1 or more.
    type: int
  ledger_entries:
    description:
      - How many of the most recent ledger entries to return in RV(ledger.entries).
    type: int
    default: 20
notes:
  - It accepts every host-path option of the C(group/hypeman.vgpu.host) action group, so one
    C(module_defaults) entry serves all modules. It ignores the options it does not read,
    O(sysfs_root), O(proc_root), O(dev_root) and the API options.
seealso:
  - module: hypeman.vgpu.vf_health
"""

EXAMPLES = r"""
- name: Read the store
  hypeman.vgpu.vf_health_info:
  register: vf_store

- name: Fail when hypeman cannot load the store (placement is disabled on this host)
  ansible.builtin.assert:
    that: vf_store.valid
    fail_msg: "{{ vf_store.path }} ({{ vf_store.format }}): {{ vf_store.error }}"

- name: List quarantined VFs and the ones this collection drained
  ansible.builtin.debug:
    msg: "quarantined={{ vf_store.quarantined }} owned={{ vf_store.owned }}"
"""

RETURN = r"""
path:
  description: Path of the store.
  returned: always
  type: str
  sample: /var/lib/hypeman/gpu/vf-health.json
exists:
  description: Whether the store file exists.
  returned: always
  type: bool
  sample: true
format:
  description:
    - V(v1) a store hypeman loads; V(legacy) the old bare-array form, which current hypeman cannot load;
      V(invalid) any other content or read error hypeman refuses; V(missing) no file (an empty, valid store).
  returned: always
  type: str
  sample: v1
valid:
  description:
    - Whether hypeman loads the store. When false hypeman disables vGPU placement.
    - Also false when this collection refuses the path itself (a symlink, dangling or not, a FIFO, socket,
      device, directory, a file over 64 MiB, or a store directory that is a symlink). Nothing is read
      through it and RV(error) says what it is.
  returned: always
  type: bool
  sample: true
error:
  description: hypeman's load error text, or null.
  returned: always
  type: str
  sample: "validate VF health state: unsupported version 0"
write_error:
  description:
    - For a store hypeman loads, hypeman's error for writing it back, or null. Go loads a time with a UTC
      offset of V(+24:00) but cannot write one, so hypeman then fails every report (and rolls it back), and
      when its load re-evaluation has something to quarantine (RV(would_quarantine) is not empty) it
      disables vGPU placement with this error.
    - C(state=repaired) of M(hypeman.vgpu.vf_health) rewrites such a store with the same instants in UTC.
  returned: always
  type: str
  sample: null
symlink:
  description: Whether the store file is a symlink (this collection neither reads nor writes through it).
  returned: always
  type: bool
  sample: false
records:
  description: The records, sorted by address (empty when the store is not valid).
  returned: always
  type: list
  elements: dict
  contains:
    vf_address:
      description: VF PCI address.
      type: str
    failures:
      description: Failed assignments, oldest first, as C({instance_id, assigned_at, reported_at}).
      type: list
      elements: dict
    quarantined_at:
      description:
        - When the VF was quarantined, or null. Times read as Go prints them (a time Go cannot marshal keeps
          its written offset, see RV(write_error)).
      type: str
  sample: []
quarantined:
  description: Sorted addresses of quarantined VFs.
  returned: always
  type: list
  elements: str
  sample: ["0000:e3:00.4"]
failure_counts:
  description: Per VF with a record, its number of recorded failures (distinct assignments).
  returned: always
  type: dict
  sample: {"0000:82:00.4": 1}
would_quarantine:
  description: VFs not yet quarantined whose failures reach RV(threshold); hypeman quarantines them at its next load.
  returned: always
  type: list
  elements: str
  sample: []
threshold:
  description: The threshold used.
  returned: always
  type: int
  sample: 2
threshold_source:
  description: Where the threshold came from (V(option), V(default) or the config file path).
  returned: always
  type: str
  sample: default
owned:
  description: Quarantined VFs whose quarantine this collection owns (see the ledger in RV(ledger)).
  returned: always
  type: list
  elements: str
  sample: []
recoverable:
  description:
    - For a store that is not valid, the VF addresses C(state=repaired) of M(hypeman.vgpu.vf_health) would keep
      quarantined. Empty otherwise.
  returned: always
  type: list
  elements: str
  sample: []
ledger:
  description: This collection's ledger.
  returned: always
  type: dict
  contains:
    path:
      description: Ledger path.
      type: str
    exists:
      description: Whether the ledger exists.
      type: bool
    total:
      description: Number of valid entries.
      type: int
    entries:
      description: The most recent entries (see O(ledger_entries)), oldest first, each with its C(line) number.
      type: list
      elements: dict
    problems:
      description: Lines that are not valid entries, as C({line, error}); they are skipped.
      type: list
      elements: dict
    pending:
      description:
        - Write-ahead intents of M(hypeman.vgpu.vf_health) runs killed before they finished, not yet settled, as
          C({run_id, line, time, entries, found, outcome}). C(outcome) is what the next
          M(hypeman.vgpu.vf_health) run will do with it (V(commit) when the store shows the change, else V(abort));
          RV(owned) already counts it that way.
      type: list
      elements: dict
  sample: {"path": "/var/lib/hypeman-vgpu/ledger.jsonl", "exists": false, "total": 0, "entries": [], "problems": [],
           "pending": []}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module, store_path
from ansible_collections.hypeman.vgpu.plugins.module_utils._hypeman import resolve_threshold
from ansible_collections.hypeman.vgpu.plugins.module_utils import _ledger, _store, _store_write


def _body(module):
    params = module.params
    if params["ledger_entries"] < 0:
        raise VgpuError("ledger_entries is %d; expected 0 or more" % params["ledger_entries"])
    threshold, source = resolve_threshold(params["threshold"], params["config_path"])
    path = store_path(params)
    store = _store.load_store(path)
    ledger = _ledger.read_ledger(params["state_dir"])
    recoverable = [] if store.valid else sorted(_store_write.recover_records(store.raw))
    return dict(
        changed=False,
        path=path,
        exists=store.exists,
        format=store.format,
        valid=store.valid,
        error=store.error,
        write_error=store.marshal_error(),
        symlink=store.is_symlink,
        records=store.to_data(),
        quarantined=store.quarantined(),
        failure_counts=dict((vf, len(record.failures)) for vf, record in store.records.items()),
        would_quarantine=store.would_quarantine(threshold),
        threshold=threshold,
        threshold_source=source,
        owned=_ledger.owned_quarantines(ledger, store),
        recoverable=recoverable,
        ledger=dict(path=ledger.path, exists=ledger.exists, total=len(ledger.entries),
                    entries=ledger.recent(params["ledger_entries"]), problems=ledger.problems,
                    pending=[intent.summary(intent.decide(store)) for intent in ledger.pending()]),
    )


def main():
    run_host_module(AnsibleModule, _body, dict(
        threshold=dict(type="int"),
        ledger_entries=dict(type="int", default=20),
    ))


if __name__ == "__main__":
    main()
