#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_holders_info
short_description: Processes and systemd units holding NVIDIA or VFIO device nodes open
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Scans every C(<proc_root>/<pid>/fd) link for open device nodes under O(dev_root) whose name starts
    with C(nvidia) or lies in C(vfio/). It returns each holder's PID, command, systemd unit (from
    C(<proc_root>/<pid>/cgroup)) and the nodes it holds.
  - With O(parent_gpu) only that card's holders are returned. Those are the holders of its
    C(nvidia<minor>) node (minor from C(<proc_root>/driver/nvidia/gpus/<address>/information); every
    C(nvidia<N>) node counts when it is unknown), of the VFIO nodes of the card and its VFs, and with
    O(include_shared) of control nodes every card uses (C(nvidiactl), C(nvidia-uvm), ...).
  - This is the evidence behind C(sriov-manage)'s C(Cannot obtain unbindLock) (for example DCGM's
    C(nv-hostengine)) and behind hypeman's "still in use" check of a VF.
  - A process that exits during the scan is ignored. Any other unreadable C(/proc) entry fails the
    module, because a partial scan could wrongly say nothing holds the card.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.info_module
options:
  parent_gpu:
    description:
      - Only holders of this card's nodes (PCI address of the parent GPU, any case, domain optional).
      - Without it, every holder of any C(nvidia*) or C(vfio/*) node is returned.
    type: str
  include_shared:
    description:
      - With O(parent_gpu), also return processes that hold only the shared control nodes
        (RV(holders[].shared_only=true)).
    type: bool
    default: true
notes:
  - It accepts every host-path option of the C(group/hypeman.vgpu.host) action group, so one
    C(module_defaults) entry serves all modules. It ignores the ones it does not read
    (O(data_dir), O(path), O(state_dir), O(config_path), and the API options).
  - Reading other processes' file descriptors needs root (or CAP_SYS_PTRACE); without it the module fails
    rather than miss a holder.
seealso:
  - module: hypeman.vgpu.vgpu_placement_info
  - module: hypeman.vgpu.vgpu_instance_info
"""

EXAMPLES = r"""
- name: Who holds card 0000:82:00.0?
  hypeman.vgpu.gpu_holders_info:
    parent_gpu: "0000:82:00.0"
  register: holders

- name: Refuse to cycle SR-IOV while anything holds the card
  ansible.builtin.assert:
    that: holders.holders | rejectattr('shared_only') | list | length == 0
    fail_msg: "card held by {{ holders.holders | map(attribute='command') | list }} (units {{ holders.units }})"

- name: Every process holding any GPU or VFIO node
  hypeman.vgpu.gpu_holders_info:
  register: all_holders
"""

RETURN = r"""
holders:
  description: Processes holding matching nodes, by PID.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
      sample: 2314
    command:
      description: C(comm) of the process (null if unreadable).
      type: str
      sample: nv-hostengine
    cmdline:
      description: Its arguments joined by spaces.
      type: str
      sample: /usr/bin/nv-hostengine -n --service-account nvidia-dcgm
    unit:
      description: The systemd unit it runs in, null when none (for example a login session's process).
      type: str
      sample: nvidia-dcgm.service
    paths:
      description: The matching nodes it holds open.
      type: list
      elements: str
      sample: [/dev/nvidia0, /dev/nvidiactl]
    card_paths:
      description: With O(parent_gpu), the nodes specific to that card.
      type: list
      elements: str
      returned: when O(parent_gpu) is set
    shared_only:
      description: With O(parent_gpu), true when it holds only shared control nodes.
      type: bool
      returned: when O(parent_gpu) is set
units:
  description: The distinct systemd units of the holders, sorted.
  returned: always
  type: list
  elements: str
  sample: [nvidia-dcgm.service]
card:
  description: With O(parent_gpu), the nodes considered that card's.
  returned: when O(parent_gpu) is set
  type: dict
  contains:
    address:
      description: The card.
      type: str
      sample: "0000:82:00.0"
    minor:
      description: Its C(/dev/nvidia<minor>) number; null when unknown.
      type: int
      sample: 0
    node:
      description: Its C(nvidia<minor>) node; null when the minor is unknown.
      type: str
      sample: /dev/nvidia0
    vfio:
      description: VFIO nodes of the card and its VFs.
      type: list
      elements: str
    errors:
      description: Card attributes or VF links that could not be read.
      type: list
      elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils import _busy, _proc, _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module


def _body(module):
    params = module.params
    result = {"changed": False}
    if params["parent_gpu"] is None:
        holders = _proc.scan_device_holders(params["proc_root"], params["dev_root"])
    else:
        address = _sysfs.normalize_card_address(params["parent_gpu"])
        nodes, holders, _vf_of_node, _unreadable = _busy.card_holders(
            params["sysfs_root"], params["proc_root"], params["dev_root"], address,
            include_shared=params["include_shared"])
        if not nodes["exists"]:
            raise VgpuError("parent_gpu %s is not a PCI device under %s" % (address, params["sysfs_root"]))
        result["card"] = {"address": address, "minor": nodes["minor"], "node": nodes["card"],
                          "vfio": nodes["vfio"], "errors": nodes["errors"]}
        if nodes["minor"] is None:
            module.warn("the /dev/nvidia minor of %s is unknown; every nvidia<N> node counts as its own" % address)
    result["holders"] = holders
    result["units"] = sorted(set(h["unit"] for h in holders if h["unit"]))
    return result


def main():
    run_host_module(AnsibleModule, _body, dict(
        parent_gpu=dict(type="str"),
        include_shared=dict(type="bool", default=True),
    ))


if __name__ == "__main__":
    main()
