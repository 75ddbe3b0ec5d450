#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: run_marker
short_description: Keep the recovery roles' markers in the collection's state directory
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - Writes, removes or reads one of the small JSON markers the roles keep in O(state_dir) while a step is
    unfinished, so that an interrupted run knows what to resume or restore. V(recovery/<gpu>.json) is
    the resume marker of the C(sr_iov_cycle) role, V(dcgm-quiesce.json) the DCGM units C(dcgm_quiesce)
    stopped, and V(store-edit/<unit>.stopped) says that C(store_edit) stopped hypeman's unit.
  - Every write and removal takes one lock (C(<state_dir>/.markers.lock), a bounded wait), then reads
    the marker and writes only when its bytes change. A write goes to a temporary file, which is
    fsynced and renamed over the marker, and then the directory is fsynced, so a kill at any instant
    leaves the old marker or the new one.
  - The state directory and the marker's directory are opened without following a symlink, and missing
    ones are created (the state directory with mode 0700, as the ledger does, and the marker's
    directory with 0755). The module refuses a marker that is a symlink, a FIFO, a socket, a device,
    a directory, larger than 64 KiB, or not a JSON object, and then it changes nothing.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
  - hypeman.vgpu.attributes.state_module
options:
  name:
    description:
      - The marker, relative to O(state_dir). It must be one of V(recovery/<gpu>.json),
        V(dcgm-quiesce.json) or V(store-edit/<unit>.stopped), where C(<gpu>) is a PCI address and
        C(<unit>) a systemd unit name.
    type: str
    required: true
  state:
    description:
      - V(present) makes the marker hold O(content), V(absent) removes it, and V(read) only returns it
        (RV(content)) and never changes or locks anything.
    type: str
    choices: [present, absent, read]
    default: present
  content:
    description:
      - What the marker holds with O(state=present). It is written as JSON with sorted keys and an
        indent of 4, followed by a newline, as Ansible's C(to_nice_json) writes it.
      - Required with O(state=present).
    type: dict
notes:
  - It accepts every host-path option of the C(group/hypeman.vgpu.host) action group and reads only
    O(state_dir).
seealso:
  - module: hypeman.vgpu.gpu_sriov
"""

EXAMPLES = r"""
- name: Record that the drain of the card is done
  hypeman.vgpu.run_marker:
    name: recovery/0000:82:00.0.json
    content:
      gpu: "0000:82:00.0"
      step: drained
  register: marker

- name: What an interrupted recovery left behind
  hypeman.vgpu.run_marker:
    name: recovery/0000:82:00.0.json
    state: read
  register: resume

- name: Forget the marker
  hypeman.vgpu.run_marker:
    name: recovery/0000:82:00.0.json
    state: absent
"""

RETURN = r"""
path:
  description: The marker file.
  returned: always
  type: str
  sample: /var/lib/hypeman-vgpu/recovery/0000:82:00.0.json
exists:
  description: Whether the marker exists after the task (in check mode, whether it would).
  returned: always
  type: bool
  sample: true
content:
  description: What the marker holds after the task (in check mode, what it would hold); null when there is none.
  returned: always
  type: dict
  sample: {gpu: "0000:82:00.0", step: drained}
previous:
  description: What the marker held before the task; null when there was none.
  returned: always
  type: dict
  sample: {gpu: "0000:82:00.0", step: started}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._marker import Marker, decode
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module


def _text(data):
    return "" if data is None else data.decode("ascii", "backslashreplace")


def _body(module):
    params = module.params
    marker = Marker(params["state_dir"], params["name"])
    state = params["state"]
    if state == "read":
        if params["content"] is not None:
            raise VgpuError("content is given with state=read; it is only written with state=present")
        content = marker.read()
        return dict(changed=False, path=marker.path, exists=content is not None, content=content, previous=content)
    if state == "present" and params["content"] is None:
        raise VgpuError("state=present needs content (a dict) for marker %s" % marker.path)
    if state == "absent" and params["content"] is not None:
        raise VgpuError("content is given with state=absent; it is only written with state=present")
    changed, before, after = marker.apply(params["content"] if state == "present" else None, module.check_mode)
    previous = None if before is None else decode(before, marker.path)
    result = dict(changed=changed, path=marker.path, exists=after is not None,
                  content=None if after is None else decode(after, marker.path), previous=previous)
    if module._diff:  # pylint: disable=protected-access  # AnsibleModule's own flag for --diff
        result["diff"] = dict(before=_text(before), after=_text(after),
                              before_header=marker.path, after_header=marker.path)
    return result


def main():
    run_host_module(AnsibleModule, _body, dict(
        name=dict(type="str", required=True),
        state=dict(type="str", default="present", choices=["present", "absent", "read"]),
        content=dict(type="dict"),
    ))


if __name__ == "__main__":
    main()
