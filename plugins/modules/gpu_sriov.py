#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_sriov
short_description: Enable, disable or cycle SR-IOV on an NVIDIA parent GPU, with safety checks and sysfs verification
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Runs NVIDIA's C(sriov-manage -e) or C(sriov-manage -d) on one parent GPU (physical function) and proves the
    result from sysfs. It never trusts the exit code. C(sriov-manage) exits 0 in cases where it did nothing, for
    example on a card it does not support.
  - O(state=enabled) makes sure the card has all its virtual functions (VFs). It does nothing when
    C(sriov_numvfs) equals C(sriov_totalvfs) and every C(virtfn*) VF is readable (its vGPU files can be read,
    as hypeman reads them).
  - O(state=disabled) removes every VF of the card. It does nothing when the card has 0 VFs.
  - O(state=cycled) disables, then enables again. This is the recovery for a wedged VF, and it always acts.
  - Before any disable, the module refuses, naming every culprit, while any VF of the card is allocated
    (C(current_vgpu_type) is not 0, or an mdev exists), is claimed in instance metadata (any non-empty
    C(GPUDevicePath), even for a stopped instance), or is held open (its C(/dev/vfio) nodes are open in some
    process). It also refuses while any process holds the card's own C(/dev/nvidia<minor>) node, because then
    C(sriov-manage) fails with C(Cannot obtain unbindLock). The processes, commands and systemd units are
    listed, for example C(nv-hostengine) in C(nvidia-dcgm.service). Enabling also needs the unbindLock, so the
    card-node check runs before an enable too.
  - Metadata that cannot be read counts as a claim, so the module fails closed.
  - Success means that, within O(timeout) and polling every O(delay) seconds, sysfs shows the expected state.
    For an enable, that is C(sriov_numvfs) = C(sriov_totalvfs), one readable C(virtfn*) VF per slot, and every
    new VF listing at least one creatable vGPU type. For a disable, that is C(sriov_numvfs) = 0, no
    C(virtfn*) link, and none of the old VF devices left.
  - When an enable does not verify in time, C(sriov-manage -e) is run again, up to O(retries) more times. This
    covers the driver-start race, where the first run leaves no VFs.
  - The module never unbinds a VF from its driver, never writes C(current_vgpu_type), and never stops or touches
    an instance.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.state_module
attributes:
  check_mode:
    description:
      - Runs every safety check and reports the commands that would run (RV(commands) with C(skipped=true)) and
        the predicted state, without running anything.
  diff_mode:
    description:
      - Shows the card's C(sriov_numvfs) and VF list before and after.
options:
  pci_address:
    description:
      - PCI address of the parent GPU (physical function), for example V(0000:82:00.0). Upper case and a missing
        domain are accepted and normalised (V(82:00.0) is V(0000:82:00.0)).
      - The device must be an NVIDIA device that is SR-IOV capable (has C(sriov_totalvfs)). A VF address is
        refused, and the message names its parent.
    type: str
    required: true
  state:
    description:
      - V(enabled) creates the card's VFs unless they are all there and readable.
      - V(disabled) removes them unless there are none. This is refused while any VF is allocated, claimed or
        held open, or while anything holds the card's device node.
      - V(cycled) disables (when the card has VFs) and then enables. It has the same refusals as V(disabled),
        and always reports a change.
      - With V(enabled), if the card already has VFs but fewer than C(sriov_totalvfs), or some are unreadable,
        the module waits O(timeout) for them to settle and then fails. C(sriov-manage -e) does not touch a card
        that has VFs, so only V(cycled) recreates them.
    type: str
    choices: [enabled, disabled, cycled]
    default: enabled
  sriov_manage:
    description:
      - Path of NVIDIA's C(sriov-manage) script. It is run as C(<sriov_manage> -e|-d <pci_address>) with a fixed
        argument list and C(LANG=C). Each run may take up to 10 minutes. It is never killed sooner, because a
        half-finished run can leave the card unbound from its driver.
    type: path
    default: /usr/lib/nvidia/sriov-manage
  allowed_gpus:
    description:
      - Parent GPU addresses this run may act on. When given, any other O(pci_address) is refused, in every
        state and in check mode. An empty list refuses every card.
      - When omitted, any card may be acted on.
    type: list
    elements: str
  force:
    description:
      - Skip only the check for claims in instance metadata, including unreadable metadata. Use it when a stopped
        instance still claims a VF and hypeman's reconcile has not released it. The module warns about each claim
        it ignored.
      - It never skips the allocated, held-open or card device node checks.
    type: bool
    default: false
  retries:
    description:
      - How many more times C(sriov-manage -e) is run when the VFs have not verified within O(timeout) of the
        previous run. V(0) runs it once. At most V(100).
    type: int
    default: 2
  delay:
    description:
      - Seconds between two sysfs checks while waiting for the expected state. Must be more than 0 and at most
        V(3600).
    type: float
    default: 2
  timeout:
    description:
      - Seconds to wait, after each C(sriov-manage) run, for sysfs to show the expected state. The same wait applies
        with O(state=enabled) when the card already has VFs that are not yet all readable.
      - V(0) checks once, without waiting. At most V(86400) (a day).
    type: float
    default: 60
notes:
  - Stop whatever holds the card first (DCGM, C(nvidia-dcgm-exporter)); the C(hypeman.vgpu.dcgm_quiesce) role does that
    and restores them after.
  - Drain the card first (C(hypeman.vgpu.gpu_drain)). A cycle destroys and recreates every VF of the card, and
    afterwards hypeman's quarantine records for them must be cleared with hypeman stopped.
  - In a play that sets C(module_defaults) for C(group/hypeman.vgpu.host), every option set there must be one this
    module accepts.
seealso:
  - module: hypeman.vgpu.gpu_holders_info
  - module: hypeman.vgpu.vgpu_placement_info
  - module: hypeman.vgpu.vf_health
"""

EXAMPLES = r"""
- name: Make sure a card has all its VFs
  hypeman.vgpu.gpu_sriov:
    pci_address: "0000:82:00.0"
    state: enabled

- name: See what a cycle would do and whether anything blocks it
  hypeman.vgpu.gpu_sriov:
    pci_address: "0000:82:00.0"
    state: cycled
    allowed_gpus: ["0000:82:00.0"]
  check_mode: true
  register: plan

- name: Cycle SR-IOV on a drained, quiesced card (recreates every VF)
  hypeman.vgpu.gpu_sriov:
    pci_address: "0000:82:00.0"
    state: cycled
    allowed_gpus: "{{ recovery_allowed_gpus }}"
    retries: 2
    delay: 2
    timeout: 90
  register: cycle

- name: Show the new VFs and their creatable types
  ansible.builtin.debug:
    msg: "{{ cycle.vfs | map(attribute='address') | list }} / {{ cycle.vfs[0].creatable_types }}"

- name: Disable SR-IOV although a stopped instance still claims a VF in its metadata
  hypeman.vgpu.gpu_sriov:
    pci_address: "0000:82:00.0"
    state: disabled
    force: true
"""

RETURN = r"""
pci_address:
  description: The normalised parent GPU address acted on.
  returned: always
  type: str
  sample: "0000:82:00.0"
state:
  description: The requested state.
  returned: always
  type: str
  sample: cycled
before:
  description: The card's SR-IOV state before the run, from sysfs.
  returned: always
  type: dict
  contains:
    sriov_numvfs:
      description: C(sriov_numvfs).
      type: int
    sriov_totalvfs:
      description: C(sriov_totalvfs).
      type: int
    vfs:
      description: VF addresses from the C(virtfn*) links, in C(virtfn) index order.
      type: list
      elements: str
  sample: {"sriov_numvfs": 0, "sriov_totalvfs": 32, "vfs": []}
after:
  description:
    - The card's SR-IOV state after the run, as read from sysfs; in check mode, as predicted. The predicted VF
      addresses come from the card's C(sriov_offset) and C(sriov_stride), and are empty when those cannot be read.
  returned: always
  type: dict
  contains:
    sriov_numvfs:
      description: C(sriov_numvfs).
      type: int
    sriov_totalvfs:
      description: C(sriov_totalvfs).
      type: int
    vfs:
      description: VF addresses, in C(virtfn) index order.
      type: list
      elements: str
  sample: {"sriov_numvfs": 32, "sriov_totalvfs": 32, "vfs": ["0000:82:00.4", "0000:82:00.5"]}
vfs:
  description: The card's VFs after the run, as read from sysfs (the state before the run in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The C(virtfn) index.
      type: int
    address:
      description: VF PCI address.
      type: str
    readable:
      description: Whether its vGPU files can be read (the VF would be usable by hypeman).
      type: bool
    current_type:
      description: C(current_vgpu_type) (V(0) = free), the mdev type on mdev hosts, or null.
      type: str
    creatable_types:
      description: Names of the vGPU types the VF can create now, or null when unreadable.
      type: list
      elements: str
    error:
      description: Why the VF is not readable, or null.
      type: str
  sample:
    - index: 0
      address: "0000:82:00.4"
      readable: true
      current_type: "0"
      creatable_types: ["NVIDIA L40S-1Q", "NVIDIA L40S-2Q"]
      error: null
commands:
  description:
    - Every C(sriov-manage) run, in order. In check mode, each command that would run, with C(skipped=true).
  returned: always
  type: list
  elements: dict
  contains:
    argv:
      description: The argument list.
      type: list
      elements: str
    rc:
      description: Exit code, or null when skipped or timed out.
      type: int
    stdout:
      description:
        - Standard output, at most 1 MiB. For every run but the last, only its last 8192 characters,
          after a line saying how many came before.
      type: str
    stderr:
      description: Standard error, kept as stdout is.
      type: str
    skipped:
      description: True in check mode, where nothing ran.
      type: bool
    timed_out:
      description: True when the run was killed after 10 minutes.
      type: bool
  sample:
    - argv: ["/usr/lib/nvidia/sriov-manage", "-d", "0000:82:00.0"]
      rc: 0
      stdout: "Disabling VFs on 0000:82:00.0\n"
      stderr: ""
      skipped: false
      timed_out: false
attempts:
  description: How many times C(sriov-manage -e) ran (or would run in check mode).
  returned: always
  type: int
  sample: 1
holders:
  description:
    - Processes holding the card's device nodes or its VFs' VFIO nodes open, from the scan made before
      C(sriov-manage) ran (or would run). After a C(Cannot obtain unbindLock) failure, the scan is repeated and
      also lists holders of the shared nodes (C(nvidiactl), C(nvidia-uvm), ...).
  returned: >-
    when the card was scanned for holders, that is before C(sriov-manage) runs (or would run) and in a
    refusal of a busy card
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
    command:
      description: The process name (C(comm)).
      type: str
    cmdline:
      description: The command line.
      type: str
    unit:
      description: The systemd unit the process runs in, or null.
      type: str
    paths:
      description: The device nodes it holds open.
      type: list
      elements: str
  sample:
    - pid: 1234
      command: nv-hostengine
      cmdline: /usr/bin/nv-hostengine -n
      unit: nvidia-dcgm.service
      paths: ["/dev/nvidia0", "/dev/nvidiactl"]
culprits:
  description:
    - Only in a failed result that refused to disable. Each list names what blocked the disable.
  returned: on refusal
  type: dict
  contains:
    allocated:
      description: VFs with a vGPU, as C({vf, current_type}).
      type: list
      elements: dict
    unreadable_vfs:
      description:
        - VFs whose vGPU state or VFIO nodes could not be read, as C({vf, error}). C(vf) is null for a
          card-level read error (the error text names the path).
      type: list
      elements: dict
    claimed:
      description: Instances whose metadata claims a VF, as C({vf, instance_id, name, claim_field, metadata_path}).
      type: list
      elements: dict
    unreadable_metadata:
      description: Metadata files that could not be read, as C({instance_id, path, error}).
      type: list
      elements: dict
    held_open:
      description: Processes holding a VF's VFIO nodes, as C({vf, pid, command, unit, paths}).
      type: list
      elements: dict
    card_holders:
      description: Processes holding the card's C(/dev/nvidia<minor>) node, as C({pid, command, cmdline, unit, paths}).
      type: list
      elements: dict
  sample:
    allocated: [{"vf": "0000:82:00.4", "current_type": "1149"}]
    unreadable_vfs: []
    claimed: []
    unreadable_metadata: []
    held_open: []
    card_holders: []
"""

import math
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module
from ansible_collections.hypeman.vgpu.plugins.module_utils import _busy, _cmd, _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._sriov import Snapshot, expected_vf_addresses, shorten

# A run of sriov-manage is never killed sooner: a half-done run can leave the card unbound.
COMMAND_TIMEOUT = 600
# NVIDIA's script prints "Cannot obtain unbindLock for <gpu>"; other tools use lower case.
UNBIND_LOCK_RE = re.compile(r"cannot obtain unbindlock", re.IGNORECASE)
# Bounds of the waiting options: every wait of a run must end.
RETRIES_MAX = 100
MAX_VFS = 0xFFFF  # sriov_totalvfs and sriov_numvfs are u16 in the kernel
# Characters of each output stream kept for every run but the last in the result.
EARLIER_RUN_OUTPUT = 8192
DELAY_MAX = 3600
TIMEOUT_MAX = 86400
# The clock and the pause between checks (tests replace them with a simulated clock).
_now = time.monotonic
_sleep = time.sleep


class SriovChange(object):
    """One gpu_sriov run: inputs checked, safety checks, then sriov-manage driven to the requested state."""

    def __init__(self, module):
        self.module = module
        params = module.params
        self.params = params
        self.state = params["state"]
        self.check_mode = module.check_mode
        self.sysfs_root = params["sysfs_root"]
        self.commands = []
        self.attempts = 0
        self.holders = None
        self.address = self._validate()

    # ------------------------------------------------------------ inputs
    def _validate(self):
        params = self.params
        address = _sysfs.normalize_card_address(params["pci_address"], "pci_address")
        if params["allowed_gpus"] is not None:
            allowed = [_sysfs.normalize_card_address(text, "allowed_gpus entry") for text in params["allowed_gpus"]]
            if address not in allowed:
                raise VgpuError("%s is not in allowed_gpus (%s): refusing to change SR-IOV on it"
                                % (address, ", ".join(allowed) or "empty: no card may be changed"),
                                pci_address=address)
        if not 0 <= params["retries"] <= RETRIES_MAX:
            raise VgpuError("retries is %d; expected 0 to %d" % (params["retries"], RETRIES_MAX))
        # NaN compares false and infinity would wait forever: both are refused.
        if not (math.isfinite(params["delay"]) and 0 < params["delay"] <= DELAY_MAX):
            raise VgpuError("delay is %s; expected a number of seconds more than 0 and at most %d"
                            % (params["delay"], DELAY_MAX))
        if not (math.isfinite(params["timeout"]) and 0 <= params["timeout"] <= TIMEOUT_MAX):
            raise VgpuError("timeout is %s; expected a number of seconds from 0 to %d"
                            % (params["timeout"], TIMEOUT_MAX))
        return address

    def _check_card(self, snap):
        """The device must be an NVIDIA SR-IOV parent GPU whose SR-IOV files read cleanly."""
        address = self.address
        if not snap.exists:
            raise VgpuError("%s: no such PCI device under %s" % (address, _sysfs.pci_devices_dir(self.sysfs_root)),
                            pci_address=address)
        parent = _sysfs.parent_of(self.sysfs_root, address)
        if parent:
            raise VgpuError("%s is a VF of %s; pci_address must be the parent GPU" % (address, parent),
                            pci_address=address)
        if snap.errors:
            raise VgpuError("cannot read the SR-IOV state of %s: %s" % (address, "; ".join(snap.errors)),
                            pci_address=address)
        if snap.vendor_id != _sysfs.NVIDIA_VENDOR_ID:
            raise VgpuError("%s is not an NVIDIA device (vendor 0x%s)" % (address, snap.vendor_id),
                            pci_address=address)
        if snap.totalvfs is None or snap.numvfs is None:
            raise VgpuError("%s is not SR-IOV capable: it has no sriov_totalvfs/sriov_numvfs" % address,
                            pci_address=address)
        if snap.totalvfs < 1:
            raise VgpuError("%s reports sriov_totalvfs=%d: SR-IOV is not available on it (is the vGPU host driver "
                            "loaded with SR-IOV enabled?)" % (address, snap.totalvfs), pci_address=address)
        # The kernel's counts are 16-bit and numvfs never exceeds totalvfs: anything else is
        # not a card's SR-IOV state, and acting on it could disable a card with VFs.
        if snap.totalvfs > MAX_VFS:
            raise VgpuError("%s reports sriov_totalvfs=%d: not a VF count (expected 1 to %d)"
                            % (address, snap.totalvfs, MAX_VFS), pci_address=address)
        if not 0 <= snap.numvfs <= snap.totalvfs:
            raise VgpuError("%s reports sriov_numvfs=%d: not a VF count (expected 0 to its sriov_totalvfs, %d)"
                            % (address, snap.numvfs, snap.totalvfs), pci_address=address)

    def _check_tool(self):
        path = self.params["sriov_manage"]
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise VgpuError("sriov_manage %s is not an executable file; install the NVIDIA vGPU host driver or set "
                            "sriov_manage to the script's path" % path, pci_address=self.address)

    # ------------------------------------------------------------ safety
    def _scan_holders(self, snap, shared=False):
        return _busy.scan_card(self.sysfs_root, self.params["proc_root"], self.params["dev_root"], self.address,
                               snap.all_vf_addresses, shared)

    def _refuse_if_busy(self, snap, disabling):
        """Refuse before sriov-manage runs: the card's VFs (when disabling) and its device node."""
        holders, card_holders, held_open, unreadable_nodes = self._scan_holders(snap)
        self.holders = holders
        culprits = {"allocated": [], "unreadable_vfs": [], "claimed": [], "unreadable_metadata": [],
                    "held_open": [], "card_holders": card_holders}
        if disabling:
            culprits["allocated"], culprits["unreadable_vfs"] = snap.allocated()
            culprits["unreadable_vfs"].extend(unreadable_nodes)
            culprits["held_open"] = held_open
            claimed, unreadable_meta = _busy.vf_claims(self.sysfs_root, self.params["data_dir"],
                                                       snap.all_vf_addresses)
            if self.params["force"]:
                for claim in claimed:
                    self.module.warn("force: ignoring the claim of instance %s (%s) on VF %s in %s"
                                     % (claim["instance_id"], claim["name"], claim["vf"], claim["metadata_path"]))
                for entry in unreadable_meta:
                    self.module.warn("force: ignoring unreadable metadata %s: %s" % (entry["path"], entry["error"]))
            else:
                culprits["claimed"], culprits["unreadable_metadata"] = claimed, unreadable_meta
        reasons = _busy.refusal_reasons(culprits)
        if reasons:
            action = "disable" if disabling else "enable"
            raise VgpuError("refusing to %s SR-IOV on %s: %s" % (action, self.address, "; ".join(reasons)),
                            **self._details(snap, culprits=culprits, holders=holders))

    # ------------------------------------------------------------ acting
    def _commands_data(self):
        # The last run in full (each stream up to _cmd.OUTPUT_LIMIT); with up to 100 retries,
        # earlier runs keep their last EARLIER_RUN_OUTPUT characters, so the result stays bounded.
        return [c.to_data(None if n == len(self.commands) - 1 else EARLIER_RUN_OUTPUT)
                for n, c in enumerate(self.commands)]

    def _details(self, before, after=None, **extra):
        details = {"pci_address": self.address, "state": self.state, "before": before.summary(),
                   "after": (after or before).summary(), "commands": self._commands_data(),
                   "attempts": self.attempts, "changed": any(not c.skipped for c in self.commands)}
        if self.holders is not None:
            details["holders"] = self.holders
        details.update(extra)
        return details

    def _run(self, flag, before):
        result = _cmd.run([self.params["sriov_manage"], flag, self.address], timeout=COMMAND_TIMEOUT,
                          check_mode=self.check_mode)
        self.commands.append(result)
        if not result.skipped and UNBIND_LOCK_RE.search(result.output()):
            snap = Snapshot(self.sysfs_root, self.address)
            self.holders = self._scan_holders(snap, shared=True)[0]
            who = "; ".join("%s holds %s" % (_busy.who(h), ", ".join(h["paths"])) for h in self.holders)
            raise VgpuError("sriov-manage %s %s: Cannot obtain unbindLock: %s" % (
                flag, self.address, ("processes hold the card's device nodes now: %s. Stop them (for example with "
                                     "the hypeman.vgpu.dcgm_quiesce role) and run again" % who) if who else
                "no process holds the card's device nodes now (the holder may have exited); run again"),
                **self._details(before, snap))
        return result

    def _wait(self, problems_of):
        """Poll sysfs every ``delay`` seconds for up to ``timeout``; ``(snapshot, problems)``."""
        deadline = _now() + self.params["timeout"]
        while True:
            snap = Snapshot(self.sysfs_root, self.address)
            problems = problems_of(snap)
            remaining = deadline - _now()
            if not problems or remaining <= 0:
                return snap, problems
            _sleep(min(self.params["delay"], remaining))

    def _note_exit(self, result):
        if result.timed_out:
            self.module.warn("%s timed out after %d s and was killed; sysfs was checked anyway"
                             % (" ".join(result.argv), COMMAND_TIMEOUT))
        elif result.rc != 0:
            self.module.warn("%s exited %s (%s); the result was judged from sysfs"
                             % (" ".join(result.argv), result.rc, result.brief() or "no output"))

    def disable(self, before):
        self._check_tool()
        self._refuse_if_busy(before, disabling=True)
        result = self._run("-d", before)
        if self.check_mode:
            return {"sriov_numvfs": 0, "sriov_totalvfs": before.totalvfs, "vfs": []}
        old_vfs = before.all_vf_addresses
        snap, problems = self._wait(lambda s: s.disabled_problems(self.sysfs_root, old_vfs))
        if problems:
            raise VgpuError("sriov-manage -d %s %s but SR-IOV is not disabled after %s s: %s. Output: %s" % (
                self.address, "timed out" if result.timed_out else "exited %s" % result.rc, self.params["timeout"],
                "; ".join(problems), result.brief() or "(none)"), **self._details(before, snap))
        self._note_exit(result)
        return snap

    def enable(self, before):
        self._check_tool()
        snap = Snapshot(self.sysfs_root, self.address) if not self.check_mode else before
        self._refuse_if_busy(snap, disabling=False)
        expected = expected_vf_addresses(self.sysfs_root, self.address, before.totalvfs)
        while True:
            self.attempts += 1
            result = self._run("-e", before)
            if self.check_mode:
                return {"sriov_numvfs": before.totalvfs, "sriov_totalvfs": before.totalvfs, "vfs": expected or []}
            snap, problems = self._wait(lambda s: s.enabled_problems(need_types=True))
            if not problems:
                self._note_exit(result)
                return snap
            if self.attempts > self.params["retries"]:
                break
        missing = []
        if expected:
            present = set(fn["address"] for fn in snap.virtfns)
            missing = [vf for vf in expected if vf not in present]
        outputs = " | ".join("run %d: rc=%s %s" % (n + 1, c.rc, c.brief() or "(no output)")
                             for n, c in enumerate(c for c in self.commands if c.argv[1] == "-e"))
        raise VgpuError("sriov-manage -e %s did not produce working VFs: after %d run(s), waiting up to %s s after "
                        "each, sysfs shows %s%s. sriov-manage output: %s" % (
                            self.address, self.attempts, self.params["timeout"], "; ".join(problems),
                            ("; missing VF(s): %s" % shorten(missing)) if missing else "", outputs),
                        missing=missing, vfs=snap.vfs, **self._details(before, snap))

    def run(self):
        before = Snapshot(self.sysfs_root, self.address)
        self._check_card(before)
        after = before
        if self.state == "enabled":
            problems = before.enabled_problems(need_types=False)
            if problems and before.numvfs:
                # sriov-manage -e leaves a card with VFs alone: wait for a previous enable to settle, never re-run.
                after, problems = self._wait(lambda s: s.enabled_problems(need_types=False))
                if problems:
                    raise VgpuError("%s has SR-IOV enabled but its VFs are not all usable after %s s: %s. sriov-manage "
                                    "-e does not touch a card that has VFs; use state=cycled to recreate them"
                                    % (self.address, self.params["timeout"], "; ".join(problems)),
                                    vfs=after.vfs, **self._details(before, after))
            elif problems:
                after = self.enable(before)
        elif self.state == "disabled":
            if before.numvfs:
                after = self.disable(before)
        else:
            if before.numvfs:
                self.disable(before)
            after = self.enable(before)
        return self._result(before, after)

    def _result(self, before, after):
        after_summary = after if isinstance(after, dict) else after.summary()
        result = {"changed": bool(self.commands), "pci_address": self.address, "state": self.state,
                  "before": before.summary(), "after": after_summary,
                  "vfs": (after if not isinstance(after, dict) else before).vfs,
                  "commands": self._commands_data(), "attempts": self.attempts}
        if self.holders is not None:
            result["holders"] = self.holders
        if self.module._diff:
            result["diff"] = {"before_header": "%s (sysfs)" % self.address, "after_header": "%s (sysfs)" % self.address,
                              "before": _diff_text(result["before"]), "after": _diff_text(after_summary)}
        return result


def _diff_text(summary):
    lines = ["sriov_numvfs: %s" % summary["sriov_numvfs"], "sriov_totalvfs: %s" % summary["sriov_totalvfs"], "vfs:"]
    lines.extend("  - %s" % vf for vf in summary["vfs"])
    return "\n".join(lines) + "\n"


def _body(module):
    return SriovChange(module).run()


def main():
    run_host_module(AnsibleModule, _body, dict(
        pci_address=dict(type="str", required=True),
        state=dict(type="str", default="enabled", choices=["enabled", "disabled", "cycled"]),
        sriov_manage=dict(type="path", default="/usr/lib/nvidia/sriov-manage"),
        allowed_gpus=dict(type="list", elements="str"),
        force=dict(type="bool", default=False),
        retries=dict(type="int", default=2),
        delay=dict(type="float", default=2),
        timeout=dict(type="float", default=60),
    ))


if __name__ == "__main__":
    main()
