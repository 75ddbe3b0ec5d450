#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_canary
short_description: Boot a canary vGPU instance on a card through hypeman's API and report whether its GPU initialised
version_added: 0.2.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - hypeman's recovery runbook ends with "verify by booting a GPU instance". This module does it. It creates
    a small canary instance with a vGPU of O(profile) from O(image) through hypeman's C(POST /instances), waits
    at most O(timeout) seconds for the guest's GPU init verdict, and deletes the canary again, always, also
    when the wait fails or the module is interrupted (SIGTERM, SIGINT, SIGHUP).
  - hypeman's API cannot pin a card or a VF (C(CreateInstanceRequest.gpu) has only C(profile)). So the canary is
    created only when hypeman's placement, as M(hypeman.vgpu.vgpu_placement_info) computes it, puts O(profile)
    on O(gpu). After the create the module reads where the canary landed (C(gpu.device_path) of the answer,
    else C(GPUDevicePath) in its metadata). A canary on another card is deleted and the module fails.
  - The verdict comes from the channel the host's hypeman uses. In the marker era it is the guest agent's last
    C(HYPEMAN-GPU-INIT-OK) or C(HYPEMAN-GPU-INIT-FAILED) console line, matched with hypeman's own patterns. In
    the vsock era it is a failure hypeman's sentinel recorded in the store for the canary's assignment, else the
    vsock-era agent's last C(GPU driver initialized) or C(GPU init failure detected) console line. The canary
    runs the operator's image, so its console is trusted for its own verdict.
  - Every canary is named C(<name_prefix>-<card>-<time>) and tagged C(hypeman.vgpu/canary=<card>). Before
    creating one, and with O(state=absent) alone, every canary of O(gpu) (that name and, when hypeman sends tags,
    that tag) is deleted. That is how a canary left by an interrupted run goes away. Another card's canary may
    belong to a run going on now, so it is deleted only once its name's time is more than 4 hours old (twice the
    longest O(timeout)).
  - The module does not change the store. A failed verdict is returned as RV(verdict=failed) with the evidence.
    The C(hypeman.vgpu.vgpu_canary) role then quarantines the card's VFs through the internal role C(store_edit)
    and fails the run.
extends_documentation_fragment:
  - hypeman.vgpu.host_paths
  - hypeman.vgpu.attributes
attributes:
  check_mode:
    description: Lists leftover canaries and predicts the placement. It creates and deletes nothing.
    support: full
  diff_mode:
    description: Returns no diff; the canary is created and deleted within one run.
    support: none
  idempotent:
    description:
      - Each O(state=verified) run boots and deletes a new canary, so it always reports a change.
      - O(state=absent) is idempotent.
    support: partial
options:
  gpu:
    description:
      - The parent GPU (PCI address) the canary must land on, for example the card just recovered.
    type: str
    required: true
  state:
    description:
      - V(verified) deletes leftover canaries, boots a canary on O(gpu), waits for its verdict and deletes it.
      - V(absent) only deletes leftover canaries.
    type: str
    choices: [verified, absent]
    default: verified
  image:
    description:
      - OCI image of the canary (C(CreateInstanceRequest.image)). hypeman's guest agent in it prints or answers
        the GPU init verdict. The image needs the NVIDIA guest driver and C(nvidia-smi).
      - Required with O(state=verified).
    type: str
  profile:
    description:
      - vGPU profile of the canary, as hypeman names it on the host (the full sysfs name on vendor-VFIO hosts,
        for example C(NVIDIA L40S-1Q)). The smallest profile of the card is a good choice.
      - Required with O(state=verified).
    type: str
  hypervisor:
    description:
      - C(CreateInstanceRequest.hypervisor). QEMU is the only hypervisor with working vGPU.
      - An empty string leaves hypeman's configured default.
    type: str
    default: qemu
  name_prefix:
    description:
      - Start of every canary's name; instances with this prefix are treated as canaries of this collection, and
        leftover ones are deleted (see the notes).
      - Lowercase letters, digits and dashes, at most 36 characters.
    type: str
    default: vgpu-canary
  timeout:
    description:
      - Seconds to wait for the verdict. hypeman's guest agent probes the driver for up to 10 minutes.
      - Between 1 and 7200.
    type: int
    default: 720
  poll_interval:
    description:
      - Seconds between two looks at the canary's console and the store. Between 1 and 60.
    type: int
    default: 5
  sentinel_mode:
    description:
      - Which era's evidence counts. V(auto) accepts either, whichever the canary's agent shows.
    type: str
    choices: [auto, markers, vsock]
    default: auto
notes:
  - O(api_url) is required. The token needs to create, read and delete instances.
  - It accepts every host-path option of the C(group/hypeman.vgpu.host) action group. It reads O(data_dir)
    (store, instance metadata and console), O(sysfs_root), O(proc_root), O(dev_root) and O(config_path) (the
    placement what-if), and ignores O(state_dir).
seealso:
  - module: hypeman.vgpu.vgpu_placement_info
"""

EXAMPLES = r"""
- name: Boot a canary on the recovered card
  hypeman.vgpu.vgpu_canary:
    gpu: "0000:82:00.0"
    image: registry.example.com/gpu/canary:cuda12
    profile: NVIDIA L40S-1Q
    api_url: http://127.0.0.1:8080
    api_token: "{{ vault_hypeman_token }}"
  register: canary

- name: Delete canaries an interrupted run left behind
  hypeman.vgpu.vgpu_canary:
    gpu: "0000:82:00.0"
    state: absent
    api_url: http://127.0.0.1:8080
    api_token: "{{ vault_hypeman_token }}"
"""

RETURN = r"""
gpu:
  description: The card, normalised.
  returned: always
  type: str
  sample: "0000:82:00.0"
verdict:
  description:
    - V(passed) (GPU init succeeded), V(failed) (GPU init failed on the card) or V(timeout) (no verdict in time).
    - Null when no canary ran (check mode, O(state=absent)).
  returned: always
  type: str
  sample: passed
evidence:
  description: The console line or store record the verdict rests on, or why there is none.
  returned: always
  type: str
  sample: "2026/08/20 15:04:32 [guest-agent] HYPEMAN-GPU-INIT-OK ts=2026-08-20T15:04:32Z"
sentinel_mode:
  description: The era of the evidence (V(markers) or V(vsock)); null without a verdict line.
  returned: always
  type: str
canary:
  description: The canary that ran; null when none was created.
  returned: always
  type: dict
  contains:
    id:
      description: hypeman's instance id.
      type: str
    name:
      description: Its name.
      type: str
    vf:
      description: The VF it landed on.
      type: str
    gpu:
      description: The card of that VF.
      type: str
    profile:
      description: Its vGPU profile.
      type: str
    deleted:
      description: Whether it was deleted (always true when the module returns without failing).
      type: bool
placement:
  description: hypeman's placement of O(profile) as computed before the create.
  returned: with O(state=verified)
  type: dict
  contains:
    gpu:
      description: The card hypeman picks.
      type: str
    vfs:
      description: The VFs it picks among.
      type: list
      elements: str
leftovers_deleted:
  description: Leftover canaries deleted (in check mode, the ones that would be).
  returned: always
  type: list
  elements: dict
"""

import signal
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils import _canary, _hypeman, _placement, _store, _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import run_host_module, store_path

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Interrupted(Exception):
    def __init__(self, signum):
        Exception.__init__(self, signum)
        self.signum = signum


def _on_signal(signum, _frame):
    raise _Interrupted(signum)


def _check_options(params):
    if not params["api_url"]:
        raise VgpuError("api_url is required: the canary is created, watched and deleted through hypeman's API")
    problem = _canary.prefix_problem(params["name_prefix"])
    if problem:
        raise VgpuError(problem)
    if params["state"] == "verified":
        for option in ("image", "profile"):
            problem = _canary.text_problem(option, params[option])
            if problem:
                raise VgpuError("%s (required with state=verified)" % problem)
        if params["hypervisor"]:
            problem = _canary.text_problem("hypervisor", params["hypervisor"], limit=64)
            if problem:
                raise VgpuError(problem)
        if not 1 <= params["timeout"] <= _canary.TIMEOUT_MAX:
            raise VgpuError("timeout %d is out of range; expected 1 to %d seconds" % (params["timeout"],
                                                                                      _canary.TIMEOUT_MAX))
        if not 1 <= params["poll_interval"] <= 60:
            raise VgpuError("poll_interval %d is out of range; expected 1 to 60 seconds" % params["poll_interval"])


def _landing(client, params, inst):
    """``(vf, card)`` the canary's vGPU sits on: the API's ``gpu.device_path``, else its metadata."""
    device_path = inst["device_path"]
    if not device_path:
        try:
            meta, meta_path = _hypeman.read_instance_metadata(params["data_dir"], inst["id"])
        except (OSError, ValueError) as err:
            raise VgpuError("cannot tell where canary %s landed: hypeman's answer has no gpu.device_path and its "
                            "metadata cannot be read: %s" % (inst["id"], err))
        device_path = _hypeman.instance_from_metadata(meta, meta_path)["device_path"]
    view = _hypeman.instance_from_metadata({"GPUDevicePath": device_path or ""}, "")
    vf = view["vf_address"]
    if vf is None:
        raise VgpuError("cannot tell where canary %s landed: its GPU device path is %r, not a VF's sysfs path "
                        "(an mdev host, or no vGPU assigned)" % (inst["id"], device_path))
    return vf, _sysfs.parent_of(params["sysfs_root"], vf)


def _wait(params, inst_id, vf, client, deadline):
    """``(verdict, evidence, era)`` once the canary shows one, or ``timeout`` at the deadline."""
    log_dir = _hypeman.instance_log_dir(params["data_dir"], inst_id)
    mode = params["sentinel_mode"]
    while True:
        if mode in ("auto", "vsock"):
            failure = _canary.store_failure(_store.load_store(store_path(params)), vf, inst_id)
            if failure is not None:
                return ("failed", "hypeman recorded a GPU init failure of the canary's assignment on VF %s (reported "
                        "at %s)" % (vf, failure.reported_at), "vsock")
        verdict, evidence, era = _canary.console_verdict(_canary.read_console(log_dir), mode)
        if verdict:
            return verdict, evidence, era
        if client.get(inst_id) is None:
            raise VgpuError("canary %s disappeared from hypeman before it showed a GPU init verdict" % inst_id)
        if time.monotonic() >= deadline:
            return ("timeout", "no GPU init verdict in the canary's console%s within %d s" % (
                " or the store" if mode != "markers" else "", params["timeout"]), None)
        time.sleep(min(params["poll_interval"], max(0.0, deadline - time.monotonic())))


def _run_canary(module, client, result, gpu):
    params = module.params
    name = _canary.canary_name(params["name_prefix"], gpu)
    body = _canary.create_body(name, params["image"], params["profile"], gpu, params["hypervisor"] or None)
    created, answer = client.create(body)
    if created is None:
        # A lost or garbled answer may still have made one: find it by name and delete it.
        leftovers = client.find_by_name(name)
        for inst in leftovers:
            client.delete(inst["id"])
        raise VgpuError("hypeman did not create the canary: %s%s" % (
            answer["error"], "; the instance it made anyway was deleted" if leftovers else ""))
    result["changed"] = True
    canary = {"id": created["id"], "name": name, "vf": None, "gpu": None, "profile": params["profile"],
              "deleted": False}
    result["canary"] = canary
    try:
        canary["vf"], canary["gpu"] = _landing(client, params, created)
        if canary["gpu"] != gpu:
            raise VgpuError("canary %s landed on VF %s of card %s, not on %s: hypeman's placement changed between "
                            "the what-if and the create; no verdict about %s" % (
                                created["id"], canary["vf"], canary["gpu"], gpu, gpu))
        deadline = time.monotonic() + params["timeout"]
        result["verdict"], result["evidence"], result["sentinel_mode"] = _wait(
            params, created["id"], canary["vf"], client, deadline)
    finally:
        # Always, whatever happened above; an interruption here still reaches the next run's leftover sweep.
        client.delete(created["id"])
        canary["deleted"] = True


def _body(module):
    params = module.params
    gpu = _sysfs.normalize_card_address(params["gpu"], "gpu")
    _check_options(params)
    client = _canary.Client(params["api_url"], params["api_token"], params["validate_certs"], params["api_timeout"])
    result = {"changed": False, "gpu": gpu, "verdict": None, "evidence": None, "sentinel_mode": None,
              "canary": None, "leftovers_deleted": []}
    previous = dict((signum, signal.getsignal(signum)) for signum in _SIGNALS)
    for signum in _SIGNALS:
        signal.signal(signum, _on_signal)
    try:
        for item in client.list_instances():
            if _canary.is_leftover(item, params["name_prefix"], gpu):
                leftover = _canary.instance_view(item, "GET /instances")
                if not module.check_mode:
                    client.delete(leftover["id"])
                result["leftovers_deleted"].append({"id": leftover["id"], "name": leftover["name"]})
                result["changed"] = True
        if params["state"] == "absent":
            return result
        view, _warnings = _placement.host_view(params["sysfs_root"], params["proc_root"], params["dev_root"],
                                               params["data_dir"], store_path(params), params["config_path"],
                                               profile=params["profile"])
        candidates = view["candidates"]
        result["placement"] = {"gpu": candidates["gpu"], "vfs": candidates["vfs"]}
        if candidates["gpu"] != gpu:
            raise VgpuError(
                "no canary was created: hypeman cannot be told which card to use, and its placement would put "
                "profile %r on %s, not on %s. Choose a profile only %s offers, or run the canary when %s ranks first "
                "(no quarantined VF and the least framebuffer in use)" % (
                    params["profile"], candidates["gpu"] or "no card (%s)" % candidates["reason"], gpu, gpu, gpu),
                **result)
        if module.check_mode:
            result["changed"] = True
            result["evidence"] = "check mode: a canary would boot on one of %s and be deleted" % ", ".join(
                candidates["vfs"])
            return result
        _run_canary(module, client, result, gpu)
        return result
    except _Interrupted as err:
        canary = result.get("canary")
        raise VgpuError("interrupted by signal %d%s" % (err.signum, (
            "; canary %s was deleted" % canary["id"] if canary and canary["deleted"] else
            "; canary %s may be left: the next run deletes it" % canary["id"] if canary else "")), **result)
    except VgpuError as err:
        details = dict(result)
        details.update(err.details)
        raise VgpuError(err.msg, **details)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main():
    run_host_module(AnsibleModule, _body, dict(
        gpu=dict(type="str", required=True),
        state=dict(type="str", choices=["verified", "absent"], default="verified"),
        image=dict(type="str"),
        profile=dict(type="str"),
        hypervisor=dict(type="str", default="qemu"),
        name_prefix=dict(type="str", default="vgpu-canary"),
        timeout=dict(type="int", default=720),
        poll_interval=dict(type="int", default=5),
        sentinel_mode=dict(type="str", choices=["auto", "markers", "vsock"], default="auto"),
    ))


if __name__ == "__main__":
    main()
