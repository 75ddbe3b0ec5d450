#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_placement_info
short_description: What hypeman sees for vGPU placement, per host, card and VF
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Discovers the host's vGPU VFs in sysfs the way hypeman does (mdev first via C(class/mdev_bus),
    then vendor-VFIO via C(bus/pci/devices/*/nvidia/creatable_vgpu_types)), reads every instance's
    claim from hypeman's metadata, the VF health store's quarantine set, and which VFs a process
    holds open, and returns hypeman's placement arithmetic from them.
  - RV(slots) and RV(profiles) are what hypeman's C(GET /resources) reports. A VF counts as
    quarantined when the store says so, or when hypeman's next load would quarantine it at the
    configured threshold (RV(pending_quarantine)).
  - RV(gpus) ranks the cards as hypeman's claim-variant selection does (fewest quarantined VFs,
    known usage first, least framebuffer in use, address) and says which are drained,
    overflow-only, or idle enough to cycle.
  - With O(profile) it answers where hypeman would place that profile now. RV(candidates) names the
    card and the set of equally eligible VFs hypeman picks one of at random, or gives hypeman's reason
    why none would be chosen.
  - With O(api_url) it also asks hypeman's C(GET /resources) and lists every field where hypeman's
    answer differs from the files (RV(api)). hypeman reads the store only at startup, so a mismatch
    often means the store was edited while hypeman ran.
  - When the store is unreadable or invalid, placement is disabled exactly as in hypeman
    (RV(placement_disabled_reason) set, no allocatable slot, no profile). mdev hosts ignore the store.
  - Unknown is never reported as safe. A VF whose open-handle check failed has RV(vfs[].held_open=null)
    and its card is not RV(gpus[].idle). Unreadable metadata keeps every card from being idle.
  - With O(wedge_signals) it reads hypeman's C(device may wedge) warnings and the kernel's OOM kills of a VF's
    QEMU and lists the VFs they concern in RV(at_risk_vfs), each with its evidence. Such a VF is not quarantined
    by this; confirm it as C(docs/runbook.md) says. A source that cannot be read is named in
    RV(wedge_signals.sources) and a warning; no signal then does not mean no risk.
  - On a host without a vGPU framework but with NVIDIA GPUs, hypeman runs in passthrough mode; RV(passthrough)
    models its C(/resources) answer for that mode, and the API cross-check compares it.
  - It fails only when VFs exist but none can be read (hypeman's discovery fails then too), or when
    the PCI device list, the guests directory or the config file cannot be read.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.info_module
  - hypeman.vgpu.wedge_signals
options:
  profile:
    description:
      - A vGPU profile name as hypeman's API takes it, for example V(NVIDIA L40S-2Q). Returns where
        hypeman would place it now in RV(candidates).
    type: str
notes:
  - It accepts every host-path option of the C(group/hypeman.vgpu.host) action group, so one
    C(module_defaults) entry serves all modules. It ignores the ones it does not read
    (O(state_dir)).
  - Addresses from sysfs, metadata and inputs are normalised (lowercase, 4-digit domain).
  - The local view and hypeman's API answer are two snapshots; an instance starting or stopping
    between them shows as a mismatch once.
seealso:
  - module: hypeman.vgpu.vgpu_instance_info
  - module: hypeman.vgpu.gpu_holders_info
  - module: hypeman.vgpu.vf_health_info
"""

EXAMPLES = r"""
- name: Read the placement view
  hypeman.vgpu.vgpu_placement_info:
  register: placement

- name: Fail when hypeman's placement is disabled
  ansible.builtin.assert:
    that: placement.placement_disabled_reason is none
    fail_msg: "{{ placement.placement_disabled_reason }}"

- name: Show one card's state
  vars:
    card: "{{ placement.gpus | selectattr('address', 'equalto', '0000:82:00.0') | first }}"
  ansible.builtin.debug:
    msg: >-
      {{ card.address }}: {{ card.allocatable }}/{{ card.vf_total }} allocatable,
      {{ card.quarantined }} quarantined, drained={{ card.drained }}, idle={{ card.idle }}
      {{ card.idle_blockers }}

- name: Where would a 2Q vGPU land, and does hypeman agree with the files?
  hypeman.vgpu.vgpu_placement_info:
    profile: NVIDIA L40S-2Q
    api_url: http://127.0.0.1:8080
    api_token: "{{ hypeman_api_token }}"
  register: what_if

- name: Point every host module at a simulated host
  module_defaults:
    group/hypeman.vgpu.host:
      data_dir: /srv/vgpu-sim/var/lib/hypeman
      sysfs_root: /srv/vgpu-sim/sys
      proc_root: /srv/vgpu-sim/proc
      dev_root: /srv/vgpu-sim/dev
      config_path: /srv/vgpu-sim/etc/hypeman/config.yaml
  block:
    - name: Placement on the simulated host
      hypeman.vgpu.vgpu_placement_info:
"""

RETURN = r"""
framework:
  description: The vGPU framework hypeman detects on this host.
  returned: always
  type: str
  choices: [vendor-vfio, mdev, none]
  sample: vendor-vfio
placement_disabled_reason:
  description:
    - Why hypeman refuses every vGPU placement, as its C(/resources) says it; null when placement works.
    - Set when the VF health store cannot be loaded (C(VF health state unavailable ...)).
  returned: always
  type: str
  sample: "VF health state unavailable: validate VF health state: unsupported version 2"
threshold:
  description: The quarantine threshold used for RV(pending_quarantine) (config or hypeman's default 2).
  returned: always
  type: int
  sample: 2
store:
  description: The VF health store this view used.
  returned: always
  type: dict
  contains:
    path:
      description: Store path.
      type: str
      sample: /var/lib/hypeman/gpu/vf-health.json
    format:
      description: C(v1), C(legacy), C(invalid) or C(missing).
      type: str
      sample: v1
    valid:
      description: Whether hypeman can load it.
      type: bool
      sample: true
    error:
      description: hypeman's load error, null when valid.
      type: str
      sample: null
slots:
  description: hypeman's slot counts (C(/resources) C(gpu.*_slots)).
  returned: always
  type: dict
  contains:
    total:
      description: Discovered readable VFs.
      type: int
      sample: 64
    used:
      description: VFs with a vGPU present (type set or mdev), quarantined ones included.
      type: int
      sample: 5
    allocatable:
      description: VFs neither allocated nor quarantined; 0 while placement is disabled.
      type: int
      sample: 57
    quarantined:
      description: Discovered VFs in the quarantine set, allocated or not; 0 while placement is disabled.
      type: int
      sample: 2
profiles:
  description:
    - Every profile in the union of the VFs' creatable lists (quarantined VFs included), sorted by name;
      empty while placement is disabled.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Full profile name from sysfs.
      type: str
      sample: NVIDIA L40S-2Q
    framebuffer_mb:
      description: Framebuffer parsed from the name as hypeman does (GiB before the series letter x 1024).
      type: int
      sample: 2048
    available:
      description: Free, not quarantined VFs that list the profile.
      type: int
      sample: 30
gpus:
  description: One entry per parent GPU (cards with VFs, and NVIDIA SR-IOV cards without any), by address.
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: Parent GPU PCI address (null for VFs whose C(physfn) link is unreadable).
      type: str
      sample: "0000:82:00.0"
    vendor_id:
      description: PCI vendor id without C(0x).
      type: str
      sample: 10de
    device_id:
      description: PCI device id without C(0x).
      type: str
      sample: 26b9
    vfs:
      description: Addresses of the card's discovered VFs.
      type: list
      elements: str
    vf_total:
      description: Number of discovered VFs (the card's slots).
      type: int
      sample: 32
    unreadable_vfs:
      description: VFs of this card hypeman skips because they cannot be read.
      type: list
      elements: str
    sriov_numvfs:
      description: C(sriov_numvfs) (null when absent or unreadable).
      type: int
      sample: 32
    sriov_totalvfs:
      description: C(sriov_totalvfs) (null when absent or unreadable).
      type: int
      sample: 32
    virtfns:
      description: Number of C(virtfn*) links.
      type: int
      sample: 32
    quarantined:
      description: Quarantined VFs; null while placement is disabled.
      type: int
      sample: 1
    claimed:
      description: VFs some instance's metadata claims (C(GPUDevicePath)), running or not.
      type: int
      sample: 3
    allocated:
      description: VFs with a vGPU type set.
      type: int
      sample: 3
    dirty:
      description: Allocated VFs no instance claims (hypeman resets them before reuse).
      type: int
      sample: 0
    held_open:
      description: VFs whose VFIO nodes a process holds open; null when that cannot be told.
      type: int
      sample: 2
    allocatable:
      description: VFs neither allocated nor quarantined.
      type: int
      sample: 28
    framebuffer_used_mb:
      description: Framebuffer of the profiles claimed on the card (hypeman's load measure).
      type: int
      sample: 6144
    usage_known:
      description: False when a claimed profile is missing from every creatable list (hypeman ranks such cards last).
      type: bool
      sample: true
    rank:
      description: Position in hypeman's card order (1 = preferred); null without VFs or while placement is disabled.
      type: int
      sample: 1
    overflow_only:
      description: Some but not all VFs quarantined; hypeman deprioritises the card.
      type: bool
      sample: false
    drained:
      description: Every VF quarantined; no new placement lands here.
      type: bool
      sample: false
    idle:
      description: No VF allocated, claimed or held open and nothing unknown; safe to cycle SR-IOV.
      type: bool
      sample: false
    idle_blockers:
      description: Why the card is not idle, one line per reason listing the VFs concerned.
      type: list
      elements: str
      sample: ["allocated VFs: 0000:82:00.4", "claimed VFs: 0000:82:00.4 (tz4a98xxat96iws9zmbrgj3a)"]
    instances:
      description: IDs of instances claiming VFs of the card.
      type: list
      elements: str
    live_instances:
      description: Those whose VMM is live or might be (liveness ambiguous).
      type: list
      elements: str
    busy:
      description:
        - Whether anything still holds the card, so that a drain must wait. That is an instance claiming one of
          its VFs in its metadata (live or stopped), a VF held open or one whose open handles cannot be told, or
          instance metadata that cannot be read. True exactly when RV(gpus[].busy_reasons) is not empty.
      type: bool
      sample: true
    busy_reasons:
      description:
        - What holds the card, one line each, in this order. C(live instance <id>) and C(claim in the metadata of
          stopped instance <id>) for each claiming instance; C(<N> VF(s) held open), or C(whether VFs are held
          open cannot be told); C(unreadable instance metadata <path>) for each metadata file that cannot be read.
        - This is what the C(hypeman.vgpu.gpu_drain) role waits for. C(hypeman.vgpu.gpu_sriov) applies the same
          claims and held-open checks, and also refuses on allocated VFs and on holders of the card's device node.
      type: list
      elements: str
      sample: ["live instance tz4a98xxat96iws9zmbrgj3a", "1 VF(s) held open"]
    errors:
      description: Unreadable card attributes.
      type: list
      elements: str
vfs:
  description: One entry per discovered readable VF, by address.
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: VF address.
      type: str
      sample: "0000:82:00.4"
    parent:
      description: Parent GPU from C(physfn).
      type: str
      sample: "0000:82:00.0"
    current_type:
      description: C(current_vgpu_type) (0 = free) on vendor-VFIO; the mdev type directory on mdev hosts.
      type: raw
      sample: 1148
    current_profile:
      description: Name of the current type when known.
      type: str
      sample: NVIDIA L40S-2Q
    creatable:
      description: Profile names the VF can create now; null when the list is unreadable or garbage.
      type: list
      elements: str
    creatable_error:
      description: Why RV(vfs[].creatable) is null.
      type: str
      returned: when the creatable list cannot be read or parsed
      sample: 'read creatable vGPU types for VF 0000:82:00.5: parse creatable vGPU types line 2: "garbage"'
    allocated:
      description: A vGPU is present (hypeman's C(current_vgpu_type != "0")).
      type: bool
      sample: true
    dirty:
      description: Allocated but claimed by no instance.
      type: bool
      sample: false
    claimed_by:
      description: Instances whose metadata claims this VF.
      type: list
      elements: str
    quarantined:
      description:
        - In the quarantine set (or in RV(pending_quarantine)); null while placement is disabled.
      type: bool
      sample: false
    failures:
      description: Failures recorded in the store; null while the store is unavailable.
      type: int
      sample: 1
    held_open:
      description: A process holds the VF's VFIO nodes open; null when that cannot be told.
      type: bool
      sample: true
    held_open_error:
      description: Why RV(vfs[].held_open) is null.
      type: str
      returned: when RV(vfs[].held_open) is null
      sample: "read process 4242 file descriptors: /proc/4242/fd: Permission denied"
    allocatable:
      description: Not allocated and not quarantined.
      type: bool
      sample: false
    at_risk:
      description: Listed in RV(at_risk_vfs).
      type: bool
      returned: when O(wedge_signals) is true
      sample: false
at_risk_vfs:
  description:
    - VFs a wedge-risk signal concerns, by address, each a warning with evidence (never a quarantine).
    - C(reason) is the latest signal's, V(vf_may_wedge) (hypeman hard-killed its hypervisor after an ignored
      SIGTERM) or V(oom_killed_qemu) (the kernel's OOM killer killed the instance's recorded hypervisor).
  returned: when O(wedge_signals) is true
  type: list
  elements: dict
  contains:
    vf:
      description: VF address.
      type: str
      sample: "0000:82:00.4"
    card:
      description: Its parent GPU (null when the VF is not discovered now).
      type: str
      sample: "0000:82:00.0"
    reason:
      description: The latest signal's reason.
      type: str
      sample: oom_killed_qemu
    reasons:
      description: Every reason seen.
      type: list
      elements: str
    time:
      description: The latest signal's time (UTC, RFC 3339).
      type: str
      sample: "2026-12-02T02:50:00Z"
    instance_id:
      description: The instance the latest signal names or was attributed to.
      type: str
      sample: inst-9
    signals:
      description: How many signals count.
      type: int
      sample: 1
    evidence:
      description: The newest signals (at most 5), C({reason, time, line, source, instance_id, device_path, pid, comm}).
      type: list
      elements: dict
wedge_signals:
  description: What was read for RV(at_risk_vfs).
  returned: when O(wedge_signals) is true
  type: dict
  contains:
    sources:
      description:
        - One per source, C({source, from, read, error, truncated, lines, signals}); C(source) is V(hypeman) or
          V(kernel); C(truncated) says only the newest part was read.
      type: list
      elements: dict
    complete:
      description: Every source was read.
      type: bool
    since:
      description: The start of the look-back window (UTC).
      type: str
    boot_time:
      description: This boot's start (null when C(<proc_root>/stat) cannot be read).
      type: str
    unattributed:
      description: Signals no VF could be named for, each with C(why) (for example an OOM-killed pid no instance recorded).
      type: list
      elements: dict
    superseded:
      description: Signals for a VF that do not count, each with C(why) (before the boot, the window or the VF's last clear).
      type: list
      elements: dict
    ledger_error:
      description: Why the ledger could not be read (then no clear supersedes a signal); null otherwise.
      type: str
passthrough:
  description:
    - On a host without a vGPU framework, hypeman's passthrough view; null otherwise.
    - Candidates are PCI devices whose class is VGA or 3D controller or whose vendor is NVIDIA; hypeman lists
      the NVIDIA ones, each available unless bound to C(vfio-pci).
  returned: always
  type: dict
  contains:
    total_slots:
      description: NVIDIA devices.
      type: int
      sample: 2
    used_slots:
      description: Those bound to C(vfio-pci).
      type: int
      sample: 1
    allocatable_slots:
      description: total - used.
      type: int
      sample: 1
    devices:
      description:
        - C({address, name, driver, available}) in address order, as hypeman lists them.
        - C(name) comes from hypeman's table of NVIDIA device ids, else from the PCI class.
      type: list
      elements: dict
pending_quarantine:
  description: VFs with failures >= threshold but no quarantine mark yet (counted as quarantined).
  returned: always
  type: list
  elements: str
unreadable_vfs:
  description: VFs hypeman skips because their files cannot be read.
  returned: always
  type: list
  elements: dict
  sample: [{"address": "0000:82:00.5", "parent": "0000:82:00.0", "path": "/sys/...", "error": "..."}]
unreadable_metadata:
  description: Instance metadata hypeman cannot load (its reconcile and claims fail closed on these).
  returned: always
  type: list
  elements: dict
  sample: [{"instance_id": "x", "path": "/var/lib/hypeman/guests/x/metadata.json", "error": "..."}]
held_open_error:
  description: Why open handles are unknown for every VF (the /proc scan failed); null otherwise.
  returned: always
  type: str
  sample: null
candidates:
  description: With O(profile), where hypeman would place it now; null without O(profile).
  returned: always
  type: dict
  contains:
    profile:
      description: The requested profile.
      type: str
      sample: NVIDIA L40S-2Q
    type_id:
      description: The vGPU type the profile resolves to.
      type: raw
      sample: 1148
    framebuffer_mb:
      description: Its framebuffer.
      type: int
      sample: 2048
    gpu:
      description: The card hypeman would choose; null when none.
      type: str
      sample: "0000:82:00.0"
    vfs:
      description: The equally eligible VFs on that card; hypeman picks one of them at random.
      type: list
      elements: str
    clean:
      description: False when only dirty VFs remain (hypeman resets the chosen one first).
      type: bool
      sample: true
    ranking:
      description: Every card with a candidate, in hypeman's order.
      type: list
      elements: dict
    reason:
      description: hypeman's error text when no VF would be chosen; null otherwise.
      type: str
      sample: null
api:
  description: With O(api_url), hypeman's own answer and where it differs; absent otherwise.
  returned: when O(api_url) is set
  type: dict
  contains:
    url:
      description: The URL asked.
      type: str
      sample: http://127.0.0.1:8080/resources
    reachable:
      description: hypeman answered (any HTTP status).
      type: bool
      sample: true
    status:
      description: HTTP status.
      type: int
      sample: 200
    error:
      description: What went wrong (unreachable, timeout, 401, not JSON); null on success.
      type: str
      sample: null
    gpu:
      description: hypeman's raw C(gpu) object (null when it has none).
      type: dict
    mismatches:
      description: Every field where the API and this view differ.
      type: list
      elements: dict
      sample: [{"field": "quarantined_slots", "local": 2, "api": 1}]
    missing_fields:
      description: Newer C(gpu) fields this hypeman does not send (not counted as mismatches).
      type: list
      elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils import _placement, _wedge
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module, store_path


def _body(module):
    params = module.params
    options = _wedge.Options.from_params(params)
    wedge = (options, params["state_dir"]) if options.enabled else None
    result, warnings = _placement.host_view(params["sysfs_root"], params["proc_root"], params["dev_root"],
                                            params["data_dir"], store_path(params), params["config_path"],
                                            params["profile"], wedge=wedge)
    if result.get("wedge_signals") is not None:
        warnings = list(warnings) + _wedge.warnings(result["wedge_signals"])
    for warning in warnings:
        module.warn(warning)
    if result["unreadable_metadata"]:
        module.warn("%d instance metadata file(s) cannot be read; hypeman's reconcile and claims fail closed "
                    "on them: %s" % (len(result["unreadable_metadata"]),
                                     ", ".join(e["path"] for e in result["unreadable_metadata"])))
    if params["api_url"]:
        # Only runs that cross-check load the HTTP stack.
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _api

        api = _api.resources_check(result, params["api_url"], params["api_token"], params["validate_certs"],
                                   params["api_timeout"])
        if api["error"]:
            module.warn("hypeman API cross-check failed: %s" % api["error"])
        result["api"] = api
    result["changed"] = False
    return result


def main():
    run_host_module(AnsibleModule, _body, dict(
        profile=dict(type="str"), **_wedge.argument_spec()
    ))


if __name__ == "__main__":
    main()
