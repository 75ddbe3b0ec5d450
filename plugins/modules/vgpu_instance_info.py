#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_instance_info
short_description: hypeman instances, their vGPU assignments and whether their VMM is live
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Reads every instance's C(metadata.json) under C(<data_dir>/guests/) (hypeman's untagged Go field
    names, both the C(GPUClaimedAt) and the C(GPUAssignedAt) builds) and returns each instance's vGPU
    assignment, the parent GPU of its VF from sysfs, and whether its VMM is live.
  - Liveness is decided as hypeman decides it from O(proc_root). The recorded PID must exist and not be a
    zombie, and its boot id and start time must match (proof). Otherwise a process must own the
    instance's control socket. A PID from an earlier boot or a reused PID is not the VMM. When socket
    ownership cannot be confirmed the answer is null, and hypeman counts that as live.
  - Metadata hypeman could not load (unreadable, not JSON, a field of the wrong type) is listed in
    RV(unreadable), never skipped silently. hypeman's reconcile stops on such files, so drains do too.
  - With O(api_url) the instance list of hypeman's C(GET /instances) is compared with the files.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.info_module
options:
  parent_gpu:
    description:
      - Return only instances whose vGPU sits on this parent GPU (PCI address, any case, domain optional).
      - RV(unreadable) is never filtered, since its card cannot be known.
    type: str
  vgpu_only:
    description:
      - Return only instances with a vGPU claim (a non-empty C(GPUDevicePath)).
    type: bool
    default: false
notes:
  - It accepts every host-path option of the C(group/hypeman.vgpu.host) action group, so one
    C(module_defaults) entry serves all modules. It ignores the ones it does not read
    (O(path), O(dev_root), O(state_dir), O(config_path)).
seealso:
  - module: hypeman.vgpu.vgpu_placement_info
  - module: hypeman.vgpu.gpu_holders_info
"""

EXAMPLES = r"""
- name: Instances on the card being drained
  hypeman.vgpu.vgpu_instance_info:
    parent_gpu: "0000:82:00.0"
  register: on_card

- name: Wait until nothing live claims the card (unknown liveness counts as live)
  hypeman.vgpu.vgpu_instance_info:
    parent_gpu: "0000:82:00.0"
    vgpu_only: true
  register: claims
  until: >-
    claims.unreadable | length == 0 and
    claims.instances | rejectattr('live', 'equalto', false) | list | length == 0
  retries: 30
  delay: 20

- name: Cross-check with hypeman's API
  hypeman.vgpu.vgpu_instance_info:
    api_url: http://127.0.0.1:8080
    api_token: "{{ hypeman_api_token }}"
  register: cross
"""

RETURN = r"""
instances:
  description: Readable instances, sorted by directory name.
  returned: always
  type: list
  elements: dict
  contains:
    id:
      description: Instance ID (C(Id)).
      type: str
      sample: tz4a98xxat96iws9zmbrgj3a
    name:
      description: Instance name.
      type: str
      sample: ml-job
    hypervisor:
      description: C(HypervisorType) (C(qemu), C(cloud-hypervisor), ...).
      type: str
      sample: qemu
    profile:
      description: C(GPUProfile); kept after stop for the next start, so it does not mean a claim.
      type: str
      sample: NVIDIA L40S-2Q
    framework:
      description: C(GPUFramework) (C(vendor-vfio), C(mdev)), null when none.
      type: str
      sample: vendor-vfio
    device_path:
      description: C(GPUDevicePath); a non-empty value is a claim, even for a stopped instance.
      type: str
      sample: /sys/bus/pci/devices/0000:82:00.4
    vf_address:
      description: The claimed VF (normalised basename of C(device_path); resolved from sysfs on mdev hosts).
      type: str
      sample: "0000:82:00.4"
    mdev_uuid:
      description: C(GPUMdevUUID) on mdev hosts.
      type: str
      sample: null
    parent_gpu:
      description: Parent GPU of the VF from its C(physfn) link; null when the VF is not in sysfs.
      type: str
      sample: "0000:82:00.0"
    assigned_at:
      description: The claim time in UTC RFC 3339 with nanoseconds, as hypeman writes it into the VF health store.
      type: str
      sample: "2026-08-31T12:00:00.123456789Z"
    claim_field:
      description: Which key this hypeman build writes (C(GPUClaimedAt) or C(GPUAssignedAt)), null when neither.
      type: str
      sample: GPUClaimedAt
    retained_for_cleanup:
      description: C(GPURetainedForCleanup), a delete-only retention stub.
      type: bool
      sample: false
    pid:
      description: C(HypervisorPID).
      type: int
      sample: 41235
    live:
      description: VMM live (true), dead (false) or not provable either way (null; hypeman treats it as live).
      type: bool
      sample: true
    live_reason:
      description: The evidence behind RV(instances[].live).
      type: str
      sample: hypervisor pid 41235 is alive (boot id and start time match)
    metadata_path:
      description: The metadata file.
      type: str
      sample: /var/lib/hypeman/guests/tz4a98xxat96iws9zmbrgj3a/metadata.json
unreadable:
  description: Metadata hypeman could not load either.
  returned: always
  type: list
  elements: dict
  contains:
    instance_id:
      description: Directory name.
      type: str
    path:
      description: The file.
      type: str
    error:
      description: Why it cannot be loaded.
      type: str
api:
  description: With O(api_url), hypeman's instance list compared with the files; absent otherwise.
  returned: when O(api_url) is set
  type: dict
  contains:
    url:
      description: The URL asked.
      type: str
      sample: http://127.0.0.1:8080/instances
    reachable:
      description: hypeman answered (any HTTP status).
      type: bool
    status:
      description: HTTP status.
      type: int
    error:
      description: What went wrong; null on success.
      type: str
    count:
      description: Instances hypeman listed.
      type: int
    mismatches:
      description:
        - "C({instance_id, field, local, api}) for every difference: C(instance) (listed on one side only),
          C(device_path), C(profile). Instances with unreadable metadata are expected to be missing from the API."
      type: list
      elements: dict
    missing_fields:
      description: Newer fields this hypeman does not send (C(gpu.device_path)).
      type: list
      elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman, _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module

_OUTPUT_KEYS = ("id", "name", "profile", "framework", "device_path", "vf_address", "mdev_uuid", "parent_gpu",
                "assigned_at", "claim_field", "retained_for_cleanup", "pid", "live", "live_reason",
                "metadata_path")


def _view(inst, sysfs_root, mdev_vf):
    view = dict((key, inst.get(key)) for key in _OUTPUT_KEYS if key != "parent_gpu")
    view["hypervisor"] = inst.get("hypervisor_type")
    vf = view["vf_address"] = _hypeman.instance_vf(inst, mdev_vf.get)
    view["parent_gpu"] = _sysfs.parent_of(sysfs_root, vf) if vf else None
    return view


def _compare(instances, unreadable, api_list):
    mismatches, missing = [], set()
    local = dict((inst["id"], inst) for inst in instances)
    unreadable_ids = set(entry["instance_id"] for entry in unreadable)
    remote = {}
    for item in api_list:
        # An id that is not text is no instance hypeman lists (and could not key a lookup).
        if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]:
            remote[item["id"]] = item
    for instance_id in sorted(set(local) | set(remote)):
        mine, theirs = local.get(instance_id), remote.get(instance_id)
        if mine is None:
            if instance_id not in unreadable_ids:
                mismatches.append({"instance_id": instance_id, "field": "instance", "local": None, "api": "listed"})
            continue
        if theirs is None:
            mismatches.append({"instance_id": instance_id, "field": "instance", "local": "listed", "api": None})
            continue
        gpu = theirs.get("gpu") if isinstance(theirs.get("gpu"), dict) else {}
        # Older servers send ``gpu`` only when GPUProfile is set, so a missing one means no profile.
        if (gpu.get("profile") or None) != mine["profile"]:
            mismatches.append({"instance_id": instance_id, "field": "profile", "local": mine["profile"],
                               "api": gpu.get("profile")})
        if "device_path" in gpu:
            if (gpu.get("device_path") or None) != mine["device_path"]:
                mismatches.append({"instance_id": instance_id, "field": "device_path",
                                   "local": mine["device_path"], "api": gpu.get("device_path") or None})
        elif mine["device_path"]:
            missing.add("gpu.device_path")
    return mismatches, sorted(missing)


def _body(module):
    params = module.params
    parent_filter = None
    if params["parent_gpu"] is not None:
        parent_filter = _sysfs.normalize_card_address(params["parent_gpu"])
    instances, unreadable = _hypeman.list_instances(params["data_dir"], params["proc_root"])
    result = {"changed": False, "unreadable": unreadable}
    if unreadable:
        module.warn("%d instance metadata file(s) cannot be read: %s"
                    % (len(unreadable), ", ".join(entry["path"] for entry in unreadable)))
    mdev_vf = {}
    if any(not inst["vf_address"] and (inst["mdev_uuid"] or inst["device_path"]) for inst in instances):
        mdev_vf = _sysfs.mdev_vfs(params["sysfs_root"])
    views = [_view(inst, params["sysfs_root"], mdev_vf) for inst in instances]
    if params["api_url"]:
        # Only runs that cross-check load the HTTP stack.
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _api

        answer = _api.api_get(params["api_url"], "/instances", params["api_token"],
                              params["validate_certs"], params["api_timeout"])
        api = {"url": answer["url"], "reachable": answer["reachable"], "status": answer["status"],
               "error": answer["error"], "count": None, "mismatches": [], "missing_fields": []}
        if answer["error"] is None:
            listed = _api.api_instances(answer["data"])
            if listed is None:
                api["error"] = "GET %s: expected a JSON list of instances" % answer["url"]
            else:
                api["count"] = len(listed)
                api["mismatches"], api["missing_fields"] = _compare(views, unreadable, listed)
        if api["error"]:
            module.warn("hypeman API cross-check failed: %s" % api["error"])
        result["api"] = api
    if parent_filter is not None:
        views = [v for v in views if v["parent_gpu"] == parent_filter]
    if params["vgpu_only"]:
        views = [v for v in views if v["device_path"]]
    result["instances"] = views
    return result


def main():
    run_host_module(AnsibleModule, _body, dict(
        parent_gpu=dict(type="str"),
        vgpu_only=dict(type="bool", default=False),
    ))


if __name__ == "__main__":
    main()
