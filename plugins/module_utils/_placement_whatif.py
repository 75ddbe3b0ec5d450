# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's placement what-if: the card and VFs it would choose for a profile (stdlib only).

docs/hypeman-interface.md §2.1: the claim-variant selection of the
vendor-VFIO framework and mdev's ``CreateMdev``. ``_placement`` computes the
view (slots, ranking, usage) and imports this helper only when a profile is
asked for (``vgpu_placement_info`` with ``profile``, ``vgpu_canary``); the
audit never asks (docs/performance.md, "Audit cost per host").
"""

from __future__ import annotations

from ansible_collections.hypeman.vgpu.plugins.module_utils import _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._govalues import go_quote


def candidates(placement, profile, slots):
    """What hypeman's claim-variant selection chooses among for ``profile``, from a ``_placement`` view
    (``result()["candidates"]``), or why nothing can be placed."""
    out = {"profile": profile, "type_id": None, "framebuffer_mb": None, "gpu": None, "vfs": [],
           "clean": None, "ranking": [], "reason": None}
    if placement.framework == _sysfs.FRAMEWORK_NONE:
        out["reason"] = "vGPU framework not available"
        return out
    if not placement.quarantine.available:
        out["reason"] = "vGPU placement is disabled: %s" % placement.quarantine.reason
        return out
    if slots["allocatable"] == 0:
        out["reason"] = "no allocatable vgpu slots"
        return out
    if placement.framework == _sysfs.FRAMEWORK_MDEV:
        return _mdev_candidates(placement, profile, out)
    if placement.unreadable_metadata:
        first = placement.unreadable_metadata[0]
        out["reason"] = "list instances for vGPU allocation: %s: %s" % (first["path"], first["error"])
        return out
    requested = placement.profiles_by_name.get(profile)
    if requested is None:
        if not placement.profiles_by_name and placement.vfs:
            out["reason"] = ("no creatable vGPU profiles on any VF (GPUs at capacity or dirty VFs consuming "
                             "framebuffer): profile %s" % go_quote(profile))
        else:
            out["reason"] = ("profile %s is not creatable on any VF (unknown profile or insufficient capacity)"
                             % go_quote(profile))
        return _with_dirty_note(placement, out)
    out["type_id"] = int(requested["id"])
    out["framebuffer_mb"] = requested["framebuffer_mb"]
    usage, unknown = placement.usage()
    type_id = requested["id"]
    advertises = dict((vf["address"], set(p["id"] for p in vf.get("creatable") or [])) for vf in placement.vfs)
    parent_advertises = set(vf["parent"] for vf in placement.vfs if type_id in advertises[vf["address"]])
    quarantined_by_gpu, free_by_gpu = {}, {}
    for vf in placement.vfs:
        if vf["address"] in placement.quarantine.quarantined:
            quarantined_by_gpu[vf["parent"]] = quarantined_by_gpu.get(vf["parent"], 0) + 1
            continue
        if vf["address"] in placement.claims:
            continue
        direct = type_id in advertises[vf["address"]]
        repairable = vf["allocated"] and (vf["current_type"] == type_id or vf["parent"] in parent_advertises)
        if direct or repairable:
            free_by_gpu.setdefault(vf["parent"], []).append(vf)
    for gpu in free_by_gpu:
        free_by_gpu[gpu].sort(key=lambda v: (v["allocated"], v["address"]))
    order = sorted(free_by_gpu, key=lambda g: placement.rank_key(g, quarantined_by_gpu, usage, unknown))
    out["ranking"] = [{"gpu": gpu, "quarantined": quarantined_by_gpu.get(gpu, 0), "usage_known": gpu not in unknown,
                       "framebuffer_used_mb": usage.get(gpu, 0), "candidates": len(free_by_gpu[gpu])}
                      for gpu in order]
    if not order:
        out["reason"] = "no available VF for profile %s" % go_quote(profile)
        return _with_dirty_note(placement, out)
    winners = free_by_gpu[order[0]]
    leading = [v for v in winners if v["allocated"] == winners[0]["allocated"]]
    out["gpu"] = order[0]
    out["vfs"] = [v["address"] for v in leading]
    out["clean"] = not leading[0]["allocated"]
    return out


def _with_dirty_note(placement, out):
    dirty = [vf["address"] for vf in placement.vfs if vf["allocated"] and vf["address"] not in placement.claims]
    if dirty:
        out["reason"] += ("; hypeman first resets %d dirty unclaimed VF(s) (%s) when nothing holds them open, "
                          "then retries" % (len(dirty), ", ".join(dirty)))
    return out


def _mdev_candidates(placement, profile, out):
    """hypeman's mdev CreateMdev: least framebuffer in use first, the first free VF that can create it."""
    if not placement.vfs:
        out["reason"] = "no VFs available"
        return out
    first = placement.vfs[0]["address"]
    prof = None
    for candidate in placement.discovery.mdev_profiles:
        if candidate["name"] == profile:
            prof = candidate
            break
    if prof is None:
        out["reason"] = "profile %s not found (on VF %s)" % (go_quote(profile), first)
        return out
    out["type_id"] = prof["id"]
    out["framebuffer_mb"] = prof["framebuffer_mb"]
    usage, _unknown = placement.usage()
    gpus = sorted(set(vf["parent"] for vf in placement.vfs), key=lambda g: (usage.get(g, 0), g or ""))
    for gpu in gpus:
        free = [vf for vf in placement.vfs if vf["parent"] == gpu and not vf["allocated"]
                and _sysfs.mdev_available(vf, prof["id"]) >= 1]
        out["ranking"].append({"gpu": gpu, "quarantined": 0, "usage_known": True,
                               "framebuffer_used_mb": usage.get(gpu, 0), "candidates": len(free)})
    for entry in out["ranking"]:
        if entry["candidates"]:
            gpu = entry["gpu"]
            vf = [v for v in placement.vfs if v["parent"] == gpu and not v["allocated"]
                  and _sysfs.mdev_available(v, prof["id"]) >= 1][0]
            out["gpu"], out["vfs"], out["clean"] = gpu, [vf["address"]], True
            return out
    out["reason"] = "no available VF for profile %s" % go_quote(profile)
    return out
