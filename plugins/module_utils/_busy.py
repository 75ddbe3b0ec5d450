# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What holds a card: the one definition of "card busy" (standard library only).

A card is busy while anything uses its VFs or its device nodes: an instance
whose metadata claims one of its VFs (any non-empty ``GPUDevicePath``, live
or stopped: docs/hypeman-interface.md §3), a process holding a VF's VFIO
nodes open, or metadata that cannot be read (it may claim a VF: fail closed).
An SR-IOV change also needs every VF free of a vGPU and the card's own
``/dev/nvidia<minor>`` node unheld (else ``sriov-manage`` fails with
``Cannot obtain unbindLock``).

Two readers word it: :func:`refusal_reasons` here (why ``gpu_sriov``
refuses) and ``_placement.drain_reasons`` (what a drain waits for, per card
in ``vgpu_placement_info``'s ``busy_reasons``, read by the ``gpu_drain``
role; it lives there because every audit words it, and this helper's scans
serve only the modules that change a card). Claims go through
:func:`vf_claims` (``_hypeman.instance_vf``), holders through
:func:`scan_card`, also behind ``gpu_holders_info``: a card's nodes
(:func:`card_nodes`) and which processes of ``_proc.scan_device_holders``
hold them (:func:`holders_of_nodes`).
"""

from __future__ import annotations

import os

from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman, _proc, _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError


def who(holder):
    """``pid 1234 (nv-hostengine, unit nvidia-dcgm.service)``."""
    parts = [holder.get("command") or "?"]
    if holder.get("unit"):
        parts.append("unit %s" % holder["unit"])
    return "pid %d (%s)" % (holder["pid"], ", ".join(parts))


def nvidia_minor(proc_root, address):
    """The ``/dev/nvidia<N>`` minor of a GPU from the driver's ``information`` file, or None."""
    text = _proc.optional_text(os.path.join(proc_root, "driver", "nvidia", "gpus", address, "information"))
    if text is None:
        return None
    for line in text.splitlines():
        key, _sep, value = line.partition(":")
        if key.strip() == "Device Minor":
            return _proc.small_uint(value.strip())
    return None


def card_node_kind(rel_path, minor):
    """How a node (relative to dev_root) relates to one card with ``minor``.

    ``card`` for its own ``nvidia<minor>`` (any ``nvidia<N>`` when the minor
    is unknown), ``shared`` for control nodes every card uses
    (``nvidiactl``, ``nvidia-uvm``, ``nvidia-caps/*``, ...), ``other`` for
    another card's node, ``vfio`` for VFIO nodes (matched per VF by callers).
    """
    if rel_path.startswith("vfio/"):
        return "vfio"
    rest = rel_path[len(_proc.CARD_NODE_PREFIX):]
    number = _proc.small_uint(rest)
    if number is not None:
        return "card" if minor is None or number == minor else "other"
    return "shared"


def card_nodes(sysfs_root, proc_root, dev_root, address):
    """The device nodes that belong to one card.

    Returns ``{minor, card, vfio, errors}``: ``card`` is ``<dev_root>/nvidia<minor>``
    (None when the minor is unknown: then every ``nvidia<N>`` node counts),
    ``vfio`` the VFIO nodes of the card and each of its VFs (``virtfn*``),
    ``errors`` what could not be read.
    """
    minor = nvidia_minor(proc_root, address)
    parent = _sysfs.read_parent(sysfs_root, address)
    errors = list(parent["errors"])
    vfio = set()
    for function in [address] + [v["address"] for v in parent["virtfns"]]:
        paths, probe_errors = _sysfs.vfio_nodes(sysfs_root, dev_root, function)
        vfio.update(paths)
        errors.extend(probe_errors)
    card = os.path.join(dev_root, "%s%d" % (_proc.CARD_NODE_PREFIX, minor)) if minor is not None else None
    return {"minor": minor, "card": card, "vfio": sorted(vfio), "errors": errors, "exists": parent["exists"]}


def holders_of_nodes(holders, nodes, dev_root, include_shared=True):
    """Holders (from ``_proc.scan_device_holders``) of one card's nodes (from :func:`card_nodes`).

    Each kept holder gets ``card_paths`` (its own ``nvidia<minor>`` and VFIO
    nodes) and ``shared_only`` (it holds only control nodes every card uses,
    such as ``nvidiactl``). Holders of other cards' nodes only are dropped.
    """
    prefix = dev_root.rstrip("/") + "/"
    vfio = set(nodes["vfio"])
    kept = []
    for holder in holders:
        own, shared = [], []
        for path in holder["paths"]:
            kind = card_node_kind(path[len(prefix):], nodes["minor"]) if path.startswith(prefix) else "other"
            if kind == "card" or (kind == "vfio" and path in vfio):
                own.append(path)
            elif kind == "shared":
                shared.append(path)
        if own or (shared and include_shared):
            entry = dict(holder)
            entry["paths"] = sorted(own + shared)
            entry["card_paths"] = sorted(own)
            entry["shared_only"] = not own
            kept.append(entry)
    return kept


def card_holders(sysfs_root, proc_root, dev_root, address, vf_addresses=(), include_shared=True):
    """Processes holding one card's nodes: ``(nodes, holders, vf_of_node, unreadable)``.

    ``nodes`` is :func:`card_nodes` with the VFIO nodes of
    ``vf_addresses`` added (VFs that lost their ``virtfn`` link still count);
    ``holders`` are :func:`holders_of_nodes` entries; ``vf_of_node`` maps a
    VF's VFIO node to the VF; ``unreadable`` lists ``{vf, error}`` for what
    could not be read (fail closed). ``nodes["exists"]`` is false when there
    is no such PCI device (then nothing is scanned).
    """
    nodes = card_nodes(sysfs_root, proc_root, dev_root, address)
    if not nodes["exists"]:
        return nodes, [], {}, []  # no such device: nothing to scan /proc for
    unreadable = [{"vf": None, "error": err} for err in nodes["errors"]]
    vf_of_node = {}
    for vf in vf_addresses:
        paths, errors = _sysfs.vfio_nodes(sysfs_root, dev_root, vf)
        unreadable.extend({"vf": vf, "error": err} for err in errors if err not in nodes["errors"])
        vf_of_node.update((path, vf) for path in paths)
    nodes["vfio"] = sorted(set(nodes["vfio"]) | set(vf_of_node))
    scanned = _proc.scan_device_holders(proc_root, dev_root)
    return nodes, holders_of_nodes(scanned, nodes, dev_root, include_shared), vf_of_node, unreadable


def scan_card(sysfs_root, proc_root, dev_root, address, vf_addresses, shared=False):
    """Holders of the card's nodes split per VF: ``(holders, card_holders, held_open, unreadable)``.

    ``card_holders`` hold the card's own ``nvidia<minor>`` (or the PF's VFIO)
    node, ``held_open`` are ``{vf, pid, command, unit, paths}`` for each VF
    whose VFIO nodes a process holds; ``shared`` also lists holders of the
    control nodes every card uses.
    """
    dev_root = os.path.normpath(dev_root)
    _nodes, entries, vf_of_node, unreadable = card_holders(sysfs_root, proc_root, dev_root, address,
                                                           vf_addresses, include_shared=shared)
    holders, card_only, held_open = [], [], []
    for entry in entries:
        holder = {"pid": entry["pid"], "command": entry["command"], "cmdline": entry["cmdline"],
                  "unit": entry["unit"], "paths": entry["paths"]}
        holders.append(holder)
        own = [path for path in entry["card_paths"] if path not in vf_of_node]
        if own:
            card_only.append(dict(holder, paths=own))
        by_vf = {}
        for path in entry["card_paths"]:
            if path in vf_of_node:
                by_vf.setdefault(vf_of_node[path], []).append(path)
        for vf in sorted(by_vf):
            held_open.append({"vf": vf, "pid": entry["pid"], "command": entry["command"], "unit": entry["unit"],
                              "paths": by_vf[vf]})
    return holders, card_only, held_open, unreadable


def vf_claims(sysfs_root, data_dir, card_vfs):
    """``(claimed, unreadable_metadata)``: instances whose metadata claims one of ``card_vfs``.

    A claim is any non-empty ``GPUDevicePath``, whether the instance runs or
    not; a ``guests`` directory that cannot be listed is one unreadable entry.
    """
    try:
        instances, unreadable = _hypeman.list_instances(data_dir)
    except VgpuError as err:
        return [], [{"instance_id": None, "path": _hypeman.guests_dir(data_dir), "error": err.msg}]
    mdev_vf = {}
    if any(inst["device_path"] and not inst["vf_address"] for inst in instances):
        mdev_vf = _sysfs.mdev_vfs(sysfs_root)
    card_vfs = set(card_vfs)
    claimed = []
    for inst in instances:
        vf = _hypeman.instance_vf(inst, mdev_vf.get) if inst["device_path"] else None
        if vf in card_vfs:
            claimed.append({"vf": vf, "instance_id": inst["id"], "name": inst["name"],
                            "claim_field": inst["claim_field"], "metadata_path": inst["metadata_path"]})
    return claimed, unreadable


def refusal_reasons(culprits):
    """Why an SR-IOV change must not run, one clause per kind of culprit (``gpu_sriov``'s refusal).

    ``culprits``: ``{allocated, unreadable_vfs, claimed, unreadable_metadata,
    held_open, card_holders}`` as ``gpu_sriov`` returns them.
    """
    # Lazy: the audit's placement uses drain_reasons only and need not compile _sriov.
    from ansible_collections.hypeman.vgpu.plugins.module_utils._sriov import shorten
    reasons = []
    if culprits["allocated"]:
        reasons.append("allocated VF(s) (current_vgpu_type is not 0): %s" % shorten(
            "%s (type %s)" % (c["vf"], c["current_type"]) for c in culprits["allocated"]))
    if culprits["unreadable_vfs"]:
        reasons.append("VF(s) whose state cannot be read, so they cannot be proven free: %s" % shorten(
            c["error"] for c in culprits["unreadable_vfs"]))
    if culprits["claimed"]:
        reasons.append("VF(s) claimed in instance metadata (GPUDevicePath, counts even for a stopped instance; "
                       "force skips only this check): %s" % shorten(
                           "%s by instance %s (%s)" % (c["vf"], c["instance_id"], c["name"])
                           for c in culprits["claimed"]))
    if culprits["unreadable_metadata"]:
        reasons.append("instance metadata that cannot be read, so claims cannot be ruled out: %s" % shorten(
            "%s: %s" % (c["path"], c["error"]) for c in culprits["unreadable_metadata"]))
    if culprits["held_open"]:
        reasons.append("VF(s) held open: %s" % shorten(
            "%s by %s" % (c["vf"], who(c)) for c in culprits["held_open"]))
    if culprits["card_holders"]:
        reasons.append("the card's device node is held open, so sriov-manage would fail with "
                       "'Cannot obtain unbindLock': %s" % shorten(
                           "%s holds %s" % (who(c), ", ".join(c["paths"])) for c in culprits["card_holders"]))
    return reasons
