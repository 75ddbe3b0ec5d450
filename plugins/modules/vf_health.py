#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vf_health
short_description: Record VF failures and successes, quarantine, clear or repair hypeman's VF health store
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Edits hypeman's VF health store (C(<data_dir>/gpu/vf-health.json)) with hypeman's own rules, so the
    file stays one hypeman loads. The store decides which SR-IOV virtual functions (VFs) hypeman keeps
    out of vGPU placement (quarantined).
  - O(state=failed) and O(state=succeeded) are hypeman's failure and success reports for one assignment
    (O(instance_id), O(assigned_at)), with hypeman's de-duplication, threshold and rescind rules.
  - O(state=quarantined) drains VFs by hand, O(state=absent) removes their records, O(state=repaired)
    rewrites an unreadable, invalid or legacy store while keeping every VF it can find quarantined.
  - Every run re-evaluates the quarantine threshold as hypeman does at load and writes that re-evaluation
    even when the requested change is a no-op, so the file is the one hypeman holds at this threshold.
    Every write takes an exclusive lock beside the store and replaces the file atomically and durably
    with hypeman's procedure. An invalid store is never changed except by O(state=repaired).
  - Quarantines and clears are appended to this collection's ledger in O(state_dir), which is how
    O(owned_only) knows which quarantines this collection made. Before it replaces the store a run logs a
    write-ahead intent, so a run killed at any instant loses no ownership; the next run settles it
    (RV(settled)).
  - hypeman keeps the store in memory and overwrites the file on its next report. Edit with hypeman
    stopped, or restart it right after the edit; the module warns when a hypeman process is running.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.state_module
options:
  state:
    description:
      - V(failed) records a driver init failure of the assignment O(instance_id)/O(assigned_at) on each VF
        (hypeman's C(ReportVFInitFailure)); nothing changes on a quarantined VF or for an assignment
        already recorded; the VF is quarantined when its failures reach the threshold.
      - V(succeeded) reports a successful driver init of that assignment (hypeman's C(ReportVFInitSuccess)).
        The matching failure and every older one are cleared; a quarantine is rescinded only when the match
        is the VF's newest failure. A hand-made quarantine without failures is never rescinded.
      - V(quarantined) quarantines each VF by hand (drain), keeping its failures, and records the
        quarantine as owned in the ledger with O(reason).
      - V(absent) removes each VF's whole record. With O(owned_only=true) quarantines the ledger does not
        own are skipped, reported as C(skipped_not_owned) and named in a warning.
      - V(repaired) acts only on an unreadable, invalid or legacy store. It keeps the old file as a
        timestamped backup and writes a valid store in which every VF address found in the old file is
        quarantined. A store hypeman loads but cannot write back (a time with a UTC offset of V(+24:00)) is
        rewritten with the same instants in UTC. On any other valid or missing store it changes nothing.
    type: str
    required: true
    choices: [failed, succeeded, quarantined, absent, repaired]
  vf_addresses:
    description:
      - VF PCI addresses to act on, for example V(0000:82:00.4). Upper case and a missing domain are
        accepted and normalised (V(82:00.4) is V(0000:82:00.4)).
      - Mutually exclusive with O(parent_gpu); one of them is required unless O(state=repaired).
    type: list
    elements: str
    aliases: [vf_address]
  parent_gpu:
    description:
      - Act on every VF of this parent GPU (physical function) PCI address, found through the
        C(<sysfs_root>/bus/pci/devices/<parent_gpu>/virtfn*) links, plus every VF the ledger recorded for
        this card (VFs may be gone from sysfs while their records remain).
    type: str
  instance_id:
    description:
      - The hypeman instance ID of the assignment. Required for O(state=failed) and O(state=succeeded).
      - May be empty, as in hypeman; an empty value is omitted from the file.
    type: str
  assigned_at:
    description:
      - The assignment's claim time exactly as hypeman renders it (UTC RFC 3339 with nanoseconds, for
        example V(2026-08-20T15:00:00.123456789Z)). It is compared as an exact string, never parsed.
      - Required for O(state=failed) and O(state=succeeded); may be empty.
    type: str
  threshold:
    description:
      - Failures (distinct assignments) that quarantine a VF. Defaults to C(gpu.vf_quarantine_threshold)
        from O(config_path), else hypeman's default 2. Must be 1 or more.
      - Used for O(state=failed) and for the re-evaluation hypeman applies at load, which this module
        applies and writes on every run except O(state=repaired).
    type: int
  reason:
    description:
      - Why, recorded in the ledger (for example a ticket or "drain for SR-IOV cycle").
    type: str
  owned_only:
    description:
      - With O(state=absent), remove a quarantined VF's record only when this collection owns the
        quarantine (the ledger's latest entry for the VF is our manual quarantine and the store still holds
        the same C(quarantined_at)). Records without a quarantine are removed either way.
      - Set to V(false) only when every record of the VFs must go, for example after a verified SR-IOV
        cycle recreated them.
    type: bool
    default: true
  recorded_before:
    description:
      - With O(state=absent), remove a record only when every time in it (each failure's C(reported_at) and the
        C(quarantined_at)) is at or before this instant, an RFC 3339 time such as V(2026-08-31T12:00:00.5Z). A record
        with a later time is kept, with the outcome V(kept_newer), and named in RV(newer). The times are those in
        the store as loaded; a quarantine this run's re-evaluation sets does not count.
      - For a clear that may run again after an interruption. What hypeman recorded after the first attempt is new
        evidence and stays. The C(hypeman.vgpu.sr_iov_cycle) role passes the host's time read just before its
        clear.
    type: str
  warn_hypeman_running:
    description:
      - Warn when a hypeman process runs while this task changes the store (in check mode, would change it),
        since hypeman overwrites the file from memory on its next report.
      - Set V(false) when the caller stops hypeman around the edit and starts it after, as the
        C(hypeman.vgpu.store_edit) role does (it refuses to edit under a hypeman it cannot stop). The warning that
        whether hypeman runs cannot be told is given either way.
    type: bool
    default: true
  backup:
    description:
      - Keep a timestamped copy of the store before changing it. O(state=repaired) always keeps one.
    type: bool
    default: false
  requested_by:
    description:
      - Who asked for the change, for the ledger. Defaults to C(SUDO_USER), else C(LOGNAME), else the
        effective user on the host.
    type: str
  job_id:
    description:
      - Job identifier for the ledger, for example AWX's C(awx_job_id) passed by a role.
    type: str
  allow_absent:
    description:
      - With O(state=failed), O(state=succeeded) and O(state=quarantined), every VF must be on the host, that is a VF
        hypeman's discovery sees under O(sysfs_root) (an entry of C(bus/pci/devices) with
        C(nvidia/creatable_vgpu_types), or one in C(class/mdev_bus)). Otherwise the run fails and changes
        nothing, so a mistyped address never becomes a record.
      - V(true) records such VFs anyway, with a warning.
      - VFs that only the ledger remembers for O(parent_gpu) (SR-IOV may be disabled) are always accepted, and
        O(state=absent) and O(state=repaired) never check.
    type: bool
    default: false
notes:
  - It accepts every host-path option of the C(group/hypeman.vgpu.host) action group, so one
    C(module_defaults) entry serves all modules. It ignores the options it does not read,
    O(dev_root) and the API options.
  - The store's temporary file is C(<store>.tmp), as for hypeman, and the lock file is C(<store>.lock).
    A store, temporary or lock file that is a symlink or not a regular file, a store directory
    (C(<data_dir>/gpu)) or O(state_dir) that is a symlink, and a ledger that is a symlink or not a regular
    file are refused with an error naming the path, and nothing is written; a O(data_dir) that is a
    symlink is fine. Missing directories are created 0755 (the store's, as hypeman does) and 0700
    (O(state_dir)), whatever the umask; the ledger is created 0600.
seealso:
  - module: hypeman.vgpu.vf_health_info
"""

EXAMPLES = r"""
- name: Record a driver init failure reported by a guest
  hypeman.vgpu.vf_health:
    state: failed
    vf_address: "0000:82:00.4"
    instance_id: tz4a98xxat96iws9zmbrgj3a
    assigned_at: "2026-08-20T15:00:00.123456789Z"

- name: The same assignment later initialised fine
  hypeman.vgpu.vf_health:
    state: succeeded
    vf_address: "0000:82:00.4"
    instance_id: tz4a98xxat96iws9zmbrgj3a
    assigned_at: "2026-08-20T15:00:00.123456789Z"

- name: Drain a whole card (hypeman must be stopped around the edit; the gpu_drain role does that)
  hypeman.vgpu.vf_health:
    state: quarantined
    parent_gpu: "0000:82:00.0"
    reason: drain for SR-IOV cycle
    job_id: "{{ awx_job_id | default(omit) }}"
  register: drain

- name: Undo only the quarantines this collection made
  hypeman.vgpu.vf_health:
    state: absent
    parent_gpu: "0000:82:00.0"
    owned_only: true

- name: Convert a legacy or broken store, keeping every VF it names quarantined
  hypeman.vgpu.vf_health:
    state: repaired
  register: repair

- name: Show where the old file went
  ansible.builtin.debug:
    msg: "backup: {{ repair.backup_file }}"
  when: repair.changed
"""

RETURN = r"""
outcomes:
  description:
    - Per VF address, what happened (or would happen in check mode).
    - V(recorded) failure tallied below the threshold; V(quarantined) the VF is now quarantined;
      V(unchanged) nothing to do; V(cleared) failures or the record were removed without rescinding a
      quarantine; V(rescinded) a success removed the record and its quarantine;
      V(skipped_not_owned) O(owned_only) kept a quarantine this collection does not own;
      V(kept_newer) O(recorded_before) kept a record with a later time.
  returned: always
  type: dict
  sample: {"0000:82:00.4": "recorded"}
cleared:
  description: Per VF, how many failures a success cleared (O(state=succeeded) only).
  returned: when O(state=succeeded)
  type: dict
  sample: {"0000:82:00.4": 2}
newer:
  description: Per VF kept by O(recorded_before), its latest time.
  returned: always
  type: dict
  sample: {"0000:82:00.6": "2026-08-31T12:05:00.25Z"}
not_owned:
  description: Per VF skipped by O(owned_only), why.
  returned: always
  type: dict
  sample: {"0000:82:00.5": "quarantine is not owned by this collection (latest ledger entry: none)"}
reevaluated:
  description:
    - VFs this run quarantined because their failures already reach the threshold, as hypeman does at load.
      The run writes them even when the requested change itself is a no-op (then it reports changed).
      Empty when nothing was written.
  returned: always
  type: list
  elements: str
  sample: []
records:
  description: The store's records after the change (in check mode, as they would be), sorted by address.
  returned: always
  type: list
  elements: dict
  contains:
    vf_address:
      description: VF PCI address.
      type: str
    failures:
      description: Failed assignments, oldest first.
      type: list
      elements: dict
      contains:
        instance_id:
          description: Instance ID (may be empty).
          type: str
        assigned_at:
          description: Assignment time string (may be empty).
          type: str
        reported_at:
          description: When the failure was recorded (UTC RFC 3339).
          type: str
    quarantined_at:
      description: When the VF was quarantined, or null.
      type: str
  sample:
    - vf_address: "0000:82:00.4"
      failures:
        - instance_id: tz4a98xxat96iws9zmbrgj3a
          assigned_at: "2026-08-20T15:00:00.123456789Z"
          reported_at: "2026-08-20T15:00:42.5Z"
      quarantined_at: null
quarantined:
  description: Sorted VF addresses quarantined after the change.
  returned: always
  type: list
  elements: str
  sample: ["0000:e3:00.4"]
vf_addresses:
  description: The normalised VF addresses acted on (from O(vf_addresses) or O(parent_gpu)).
  returned: always
  type: list
  elements: str
  sample: ["0000:82:00.4"]
absent_vfs:
  description:
    - VFs of RV(vf_addresses) that are not on the host, acted on because of O(allow_absent=true) (with a
      warning). Empty otherwise; without O(allow_absent) such VFs fail the run.
  returned: always
  type: list
  elements: str
  sample: []
store_path:
  description: Path of the store.
  returned: always
  type: str
  sample: /var/lib/hypeman/gpu/vf-health.json
backup_file:
  description: Path of the backup taken before the change, or null.
  returned: always
  type: str
  sample: /var/lib/hypeman/gpu/vf-health.json.4242.2026-08-20@15:00:00~
threshold:
  description: The quarantine threshold used.
  returned: always
  type: int
  sample: 2
threshold_source:
  description: Where the threshold came from (V(option), V(default) or the config file path).
  returned: always
  type: str
  sample: default
previous_format:
  description: The store's format before the run (V(v1), V(legacy), V(invalid), V(missing)).
  returned: always
  type: str
  sample: v1
previous_error:
  description: hypeman's load error for the store before the run, or null.
  returned: always
  type: str
  sample: null
ledger_path:
  description: The ledger file this run appends to.
  returned: always
  type: str
  sample: /var/lib/hypeman-vgpu/ledger.jsonl
ledger_entries:
  description: Entries appended to the ledger (none in check mode).
  returned: always
  type: list
  elements: dict
  sample: []
settled:
  description:
    - Write-ahead intents that runs killed before they finished left in the ledger, settled by this run before
      its own change (in check mode, how they would be settled), as C({run_id, line, time, entries, found,
      outcome}). V(commit) when the store shows the killed run's change (its missing ledger entries were
      appended, so ownership is kept), V(abort) when it does not.
    - Settling writes only the ledger; it does not make the run V(changed).
  returned: always
  type: list
  elements: dict
  sample: []
hypeman_running:
  description: Whether a C(hypeman-api)/C(hypeman) process is running (null when it could not be told).
  returned: always
  type: bool
  sample: false
hypeman_processes:
  description: The hypeman processes found, as C({pid, comm, cmdline}).
  returned: always
  type: list
  elements: dict
  sample: []
"""

import hashlib
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module, store_path
from ansible_collections.hypeman.vgpu.plugins.module_utils._hypeman import (
    resolve_threshold, warn_if_store_edited_while_running)
from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _ledger, _ledger_write, _pci, _store, _store_write, _sysfs


# States that record something about a VF: the VF must exist (a typo would become a record).
STATES_NEEDING_HOST_VFS = ("failed", "succeeded", "quarantined")


def card_address(params):
    return _pci.normalize_address(params["parent_gpu"], "card", "0000:82:00.0")


def target_vfs(params, ledger):
    """``(vfs, ledger_only)``: the normalised VFs to act on, in input order (card
    order for parent_gpu), and those only the ledger remembers for the card."""
    if params["vf_addresses"] is not None:
        seen, result = set(), []
        for text in params["vf_addresses"]:
            address = _pci.normalize_address(text)
            if address not in seen:
                seen.add(address)
                result.append(address)
        return result, set()
    parent = card_address(params)
    info = _sysfs.read_parent(params["sysfs_root"], parent)
    vfs = [vf["address"] for vf in info["virtfns"]]
    ledger_only = set()
    for address in ledger.vfs_for_parent(parent):
        if address not in vfs:
            vfs.append(address)
            ledger_only.add(address)
    if not vfs:
        card_dir = os.path.join(_sysfs.pci_devices_dir(params["sysfs_root"]), parent)
        raise VgpuError("parent_gpu %s: no VFs found (no virtfn* links under %s and none recorded for it in "
                        "the ledger %s)" % (parent, card_dir, ledger.path))
    return vfs, ledger_only


def vfs_not_on_host(sysfs_root, vfs):
    """Per VF of ``vfs`` that hypeman's VF discovery does not see, why (``{}`` when all are there).

    The same discovery as placement (``_sysfs.discover``): a VF is an entry of
    ``bus/pci/devices`` with ``nvidia/creatable_vgpu_types`` (vendor-VFIO) or
    one listed in ``class/mdev_bus`` (mdev); one hypeman would skip as
    unreadable is still on the host.
    """
    found = _sysfs.discover(sysfs_root, read_creatable=False)
    present = set(vf["address"] for vf in found.vfs) | set(vf["address"] for vf in found.unreadable)
    devices = _sysfs.pci_devices_dir(sysfs_root)
    missing = {}
    for vf in vfs:
        if vf in present:
            continue
        if os.path.lexists(os.path.join(devices, vf)):
            missing[vf] = "%s exists but is not a VF of an NVIDIA vGPU card" % os.path.join(devices, vf)
        else:
            missing[vf] = "no such device under %s" % devices
    return missing


def make_backup(module, path):
    """A timestamped backup beside the store (Ansible's naming); an unreadable
    file is hard-linked instead of copied so even it is kept."""
    if os.access(path, os.R_OK) and os.path.isfile(path):
        return module.backup_local(path)
    name = "%s.%s.%s" % (path, os.getpid(), time.strftime("%Y-%m-%d@%H:%M:%S~", time.localtime()))
    try:
        os.link(path, name)
    except (IOError, OSError) as err:
        raise VgpuError("cannot keep a backup of %s: %s; nothing was changed" % (path, err.strerror or err))
    return name


def recorded_before(params):
    """O(recorded_before) as a GoTime, or None; VgpuError naming a bad value."""
    text = params["recorded_before"]
    if text is None:
        return None
    if params["state"] != "absent":
        raise VgpuError("recorded_before is only used with state=absent, not state=%s" % params["state"])
    try:
        return _gotime.parse_rfc3339(text)
    except ValueError as err:
        raise VgpuError("recorded_before %r is not an RFC 3339 time like 2026-08-31T12:00:00.5Z: %s" % (text, err))


def record_latest_time(record):
    """The latest of a record's failure report times and quarantine time; None without a record or times."""
    if record is None:
        return None
    times = [failure.reported_at for failure in record.failures]
    if record.quarantined_at is not None:
        times.append(record.quarantined_at)
    return max(times) if times else None


class StoreEdit(object):
    """One vf_health run: options resolved, then a store mutation."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.state = self.params["state"]
        self.path = store_path(self.params)
        self.now = _gotime.utc_now()
        self.threshold, self.threshold_source = resolve_threshold(self.params["threshold"],
                                                                  self.params["config_path"])
        self.recorded_before = recorded_before(self.params)
        self.ledger = _ledger.read_ledger(self.params["state_dir"])
        self.vfs, ledger_only = [], set()
        if self.state != "repaired":
            self.vfs, ledger_only = target_vfs(self.params, self.ledger)
        self.absent_vfs = {}
        if self.state in STATES_NEEDING_HOST_VFS:
            # VFs only the ledger remembers for parent_gpu were this card's (SR-IOV may be off now).
            self.absent_vfs = vfs_not_on_host(self.params["sysfs_root"],
                                              [vf for vf in self.vfs if vf not in ledger_only])
            self.check_absent_vfs()
        self.parents = {}
        for vf in self.vfs:
            self.parents[vf] = (card_address(self.params)
                                if self.params["parent_gpu"] else _sysfs.parent_of(self.params["sysfs_root"], vf))

    def check_absent_vfs(self):
        if not self.absent_vfs:
            return
        listing = "; ".join("%s (%s)" % (vf, why) for vf, why in sorted(self.absent_vfs.items()))
        if not self.params["allow_absent"]:
            raise VgpuError("state=%s refused: not a VF on this host: %s. A mistyped address would become a "
                            "record in hypeman's store; set allow_absent=true to record VFs that are not "
                            "present" % (self.state, listing), absent_vfs=sorted(self.absent_vfs))
        self.module.warn("state=%s on VFs that are not on this host (allow_absent=true): %s"
                         % (self.state, listing))

    # The mutation runs under the store lock; it must depend only on the store and the ledger.
    def mutate(self, store):
        if self.state == "repaired":
            return self._repair(store)
        # Ownership as the ledger says, intents of killed runs decided against this store.
        latest = _ledger.read_ledger(self.params["state_dir"]).latest_by_vf(store)
        # recorded_before judges the evidence as it was, not this run's own re-evaluation.
        loaded = dict(store.records)
        # hypeman's load re-evaluation comes first and is persisted with the run
        # (idempotent: the next run finds nothing left to quarantine).
        reevaluated = store.reevaluate(self.threshold, self.now)
        outcomes, cleared, skipped, previous, newer = {}, {}, {}, {}, {}
        for vf in self.vfs:
            previous[vf] = store.records.get(vf)
            if self.state == "failed":
                outcomes[vf] = store.report_failure(vf, self.params["instance_id"], self.params["assigned_at"],
                                                    self.threshold, self.now)
            elif self.state == "succeeded":
                outcomes[vf], cleared[vf] = store.report_success(vf, self.params["instance_id"],
                                                                 self.params["assigned_at"])
            elif self.state == "quarantined":
                outcomes[vf] = store.quarantine(vf, self.now)
            else:
                record = store.records.get(vf)
                latest_time = record_latest_time(loaded.get(vf))
                if latest_time is not None and self.recorded_before is not None and latest_time > self.recorded_before:
                    outcomes[vf] = "kept_newer"
                    newer[vf] = _gotime.format_rfc3339nano(latest_time)
                elif (self.params["owned_only"] and record is not None and record.quarantined_at is not None
                        and not _ledger.is_owned(latest.get(vf), record)):
                    outcomes[vf] = "skipped_not_owned"
                    entry = latest.get(vf)
                    skipped[vf] = ("quarantine is not owned by this collection (latest ledger entry: %s)"
                                   % ("none" if entry is None else "%s/%s at line %d" % (
                                       entry.get("action"), entry.get("trigger"), entry["line"])))
                else:
                    outcomes[vf] = store.remove(vf)
        return {"outcomes": outcomes, "cleared": cleared, "skipped": skipped, "reevaluated": reevaluated,
                "previous": previous, "newer": newer}

    def _repair(self, store):
        result = {"outcomes": {}, "cleared": {}, "skipped": {}, "reevaluated": [], "previous": {}}
        if store.valid:
            result["marshal_error"] = store.marshal_error()
            if result["marshal_error"] is not None:
                # Loadable, but Go cannot write it back (an offset like +24:00): same instants in UTC.
                store.rewrite_in_utc()
            return result
        records = _store_write.recover_records(store.raw, self.now)
        store.replace_records(records)
        result["outcomes"] = dict((vf, "quarantined") for vf in sorted(records))
        return result

    def ledger_entries(self, update):
        """What to append for a write, from the store as written."""
        result, store = update.result, update.store
        common = dict(user=self.params["requested_by"] or _ledger_write.default_user(), job_id=self.params["job_id"],
                      run_id=self.run_id, now=self.now)
        entries = []
        if self.state == "repaired" and update.loaded_valid:
            # Times re-expressed in UTC: no quarantine changed, so nothing per VF (ownership stays).
            return [_ledger_write.make_entry("repair", None, None, self.params["reason"] or (
                "rewrote the times of a store Go cannot marshal in UTC (%s)" % result["marshal_error"]),
                trigger="repair", **common)]
        if self.state == "repaired":
            reason = self.params["reason"] or "repaired unusable store (%s): %s" % (
                update.loaded_format, update.loaded_error)
            for vf in sorted(store.records):
                entries.append(_ledger_write.make_entry("repair", vf, store.records[vf].quarantined_at, reason,
                                                        trigger="repair", **common))
            if not entries:
                entries.append(_ledger_write.make_entry("repair", None, None, reason, trigger="repair", **common))
            return entries
        for vf in result["reevaluated"]:
            # self.now, not the final record: the same run may have removed it again (a success, absent).
            entries.append(_ledger_write.make_entry(
                "quarantine", vf, self.now,
                "failures reached the threshold %d on re-evaluation" % self.threshold,
                trigger="reevaluation", parent_gpu=self.parents.get(vf), **common))
        for vf in self.vfs:
            outcome = result["outcomes"][vf]
            previous = result["previous"].get(vf)
            parent = self.parents.get(vf)
            if outcome == "quarantined":
                trigger = "manual" if self.state == "quarantined" else "failure_threshold"
                reason = self.params["reason"]
                if trigger == "failure_threshold" and not reason:
                    reason = "failure of instance %r assigned at %r reached the threshold %d" % (
                        self.params["instance_id"], self.params["assigned_at"], self.threshold)
                entries.append(_ledger_write.make_entry("quarantine", vf, store.records[vf].quarantined_at, reason,
                                                        trigger=trigger, parent_gpu=parent, **common))
            elif outcome == "rescinded":
                entries.append(_ledger_write.make_entry(
                    "clear", vf, None, self.params["reason"] or "successful init of instance %r assigned at %r"
                    % (self.params["instance_id"], self.params["assigned_at"]),
                    trigger="success", parent_gpu=parent, **common))
            elif outcome == "cleared" and self.state == "absent":
                entries.append(_ledger_write.make_entry(
                    "clear", vf, None, self.params["reason"], trigger="manual", parent_gpu=parent, **common))
            elif outcome == "cleared" and previous is not None and previous.quarantined_at is not None:
                entries.append(_ledger_write.make_entry("clear", vf, None, self.params["reason"], trigger="success",
                                                        parent_gpu=parent, **common))
        return entries

    def run(self):
        params = self.params
        check_mode = self.module.check_mode
        state_dir = params["state_dir"]
        self.run_id = _ledger_write.new_run_id()
        written, planned, settled = [], [], []

        def under_lock():
            # Intents of killed runs are settled first, against the store as it is now.
            ledger = _ledger.read_ledger(state_dir)
            if ledger.pending():
                settled.extend(_ledger_write.settle(ledger, state_dir, _store.load_store(self.path), self.run_id,
                                                    now=self.now))

        def before_write(update):
            # Write-ahead: what this run will log, durable before the store changes (see _ledger).
            planned.extend(self.ledger_entries(update))
            if not planned:
                return
            records = update.store.records
            expect = dict((entry["vf_address"], records[entry["vf_address"]].quarantined_at
                           if entry["vf_address"] in records else None)
                          for entry in planned if entry["vf_address"])
            intent = _ledger_write.make_intent(self.run_id, planned, _ledger.store_digest(update.store),
                                               hashlib.sha256(update.after).hexdigest(), expect, self.now,
                                               absent=[vf for vf in expect if vf not in records])
            try:
                _ledger_write.append_entries(state_dir, [intent])
            except VgpuError as err:
                raise VgpuError("nothing was changed: the ledger's write-ahead intent could not be written: %s"
                                % err.msg)

        def after_write(update):
            try:
                _ledger_write.append_entries(state_dir, planned)
            except VgpuError as err:
                raise VgpuError("the VF health store %s was changed, but the ledger append failed: %s; its "
                                "write-ahead intent is in the ledger, so the next vf_health run records it"
                                % (self.path, err.msg), changed=True)
            written.extend(planned)

        def write_failed(update):
            if planned:
                try:  # the store is unchanged; else the next run finds that out and aborts the intent
                    _ledger_write.append_entries(state_dir, [{
                        "time": _gotime.format_rfc3339nano(self.now), "action": _ledger.ABORT,
                        "run_id": self.run_id, "reason": "the store write failed"}])
                except VgpuError:
                    pass

        update = _store_write.update_store(
            self.path, self.mutate, check_mode=check_mode, allow_invalid=(self.state == "repaired"),
            backup=(lambda path: make_backup(self.module, path))
            if (params["backup"] or self.state == "repaired") else None,
            before_write=before_write, after_write=after_write, write_failed=write_failed,
            under_lock=under_lock, force_lock=bool(self.ledger.pending()))
        if check_mode and self.ledger.pending():
            settled = _ledger_write.settle(self.ledger, state_dir, _store.load_store(self.path), self.run_id,
                                           check_mode=True)
        result = update.result
        processes = warn_if_store_edited_while_running(self.module, params["proc_root"],
                                                       update.changed and params["warn_hypeman_running"])
        if result["skipped"]:
            # The same text in check mode and for a repeated call: Ansible shows a repeated warning once.
            self.module.warn("kept the quarantine of %s: this collection did not make it (owned_only; hypeman's "
                             "sentinel or a hand edit did). If it must go anyway, for example after an SR-IOV cycle "
                             "recreated the VF, clear it with owned_only=false (role clear_quarantine: "
                             "clear_quarantine_owned_only: false)" % ", ".join(sorted(result["skipped"])))
        output = dict(
            changed=update.changed,
            outcomes=result["outcomes"],
            newer=result.get("newer", {}),
            not_owned=result["skipped"],
            reevaluated=result["reevaluated"] if update.changed else [],
            records=update.store.to_data() if update.store.valid else [],
            quarantined=update.store.quarantined() if update.store.valid else [],
            vf_addresses=self.vfs,
            absent_vfs=sorted(self.absent_vfs),
            store_path=self.path,
            backup_file=update.backup_file,
            threshold=self.threshold,
            threshold_source=self.threshold_source,
            previous_format=update.loaded_format,
            previous_error=update.loaded_error,
            ledger_path=_ledger.ledger_path(params["state_dir"]),
            ledger_entries=written,
            settled=settled,
            hypeman_running=None if processes is None else bool(processes),
            hypeman_processes=processes or [],
        )
        if self.state == "succeeded":
            output["cleared"] = result["cleared"]
        if self.module._diff:
            output["diff"] = dict(
                before_header=self.path, after_header=self.path,
                before=update.before.decode("utf-8", "replace") if update.before is not None else "",
                after=update.after.decode("utf-8", "replace") if update.after is not None else "",
            )
        return output


def check_inputs(module):
    """Bad input fails before anything is read or written."""
    params = module.params
    has_vfs = params["vf_addresses"] is not None
    has_parent = params["parent_gpu"] is not None
    if params["state"] == "repaired":
        if has_vfs or has_parent:
            raise VgpuError("state=repaired acts on the whole store; vf_addresses and parent_gpu are not used "
                            "with it")
    elif not has_vfs and not has_parent:
        raise VgpuError("one of vf_addresses or parent_gpu is required with state=%s" % params["state"])
    if has_vfs:
        if not params["vf_addresses"]:
            raise VgpuError("vf_addresses is empty; expected at least one VF PCI address like 0000:82:00.4")
        for text in params["vf_addresses"]:
            _pci.normalize_address(text)
    if has_parent:
        card_address(params)
    recorded_before(params)


def _body(module):
    check_inputs(module)
    return StoreEdit(module).run()


def main():
    run_host_module(AnsibleModule, _body, dict(
        state=dict(type="str", required=True, choices=["failed", "succeeded", "quarantined", "absent",
                                                       "repaired"]),
        vf_addresses=dict(type="list", elements="str", aliases=["vf_address"]),
        parent_gpu=dict(type="str"),
        instance_id=dict(type="str"),
        assigned_at=dict(type="str"),
        threshold=dict(type="int"),
        reason=dict(type="str"),
        owned_only=dict(type="bool", default=True),
        warn_hypeman_running=dict(type="bool", default=True),
        backup=dict(type="bool", default=False),
        requested_by=dict(type="str"),
        job_id=dict(type="str"),
        allow_absent=dict(type="bool", default=False),
        recorded_before=dict(type="str"),
    ), mutually_exclusive=[("vf_addresses", "parent_gpu")],
        required_if=[("state", "failed", ("instance_id", "assigned_at")),
                     ("state", "succeeded", ("instance_id", "assigned_at"))])


if __name__ == "__main__":
    main()
