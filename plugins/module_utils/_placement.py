# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's vGPU placement arithmetic and card ranking (standard library only).

Given what :mod:`_sysfs` discovered, the instances :mod:`_hypeman` listed,
the VF health store and the open device nodes, this computes what hypeman's
``GET /resources`` reports (docs/hypeman-interface.md §2.3, §2.4) and which card and VFs its
claim-variant selection would choose among for a profile (§2.1), plus per
card and per VF facts an operator needs (drained, overflow-only, idle).

Unknown is never reported as safe: a VF whose open-handle check failed is
``held_open: None`` and keeps its card from being ``idle``.
"""

from __future__ import annotations

from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman, _proc, _store, _sysfs
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

DISABLED_PREFIX = "VF health state unavailable: "


class QuarantineView(object):
    """The quarantine set placement uses.

    ``reason`` is hypeman's ``placement_disabled_reason`` (store unavailable:
    placement fails closed); ``quarantined`` holds VFs with ``quarantined_at``
    plus those hypeman's load would quarantine at ``threshold`` (listed in
    ``pending`` too); ``failures`` counts recorded failures per VF.
    """

    def __init__(self, quarantined=(), failures=None, pending=(), reason=None, threshold=None):
        self.quarantined = set(quarantined)
        self.failures = dict(failures or {})
        self.pending = set(pending)
        self.reason = reason
        self.threshold = threshold

    @property
    def available(self):
        return self.reason is None

    @classmethod
    def from_store(cls, store, threshold):
        """Build from a ``_store.HealthStore`` (an invalid store disables placement)."""
        if not store.valid:
            return cls(reason=DISABLED_PREFIX + store.error, threshold=threshold)
        pending = store.would_quarantine(threshold)
        failures = dict((vf, len(record.failures)) for vf, record in store.records.items())
        return cls(set(store.quarantined()) | set(pending), failures, pending, None, threshold)


def host_view(sysfs_root, proc_root, dev_root, data_dir, store_path, config_path, profile=None, wedge=None):
    """Read the host and compute the placement view: ``(result, warnings)``.

    Reads the threshold from ``config_path``, discovers VFs and their cards,
    lists instances with liveness, loads the store and scans /proc for open
    device nodes, then calls :func:`compute`. Raises VgpuError when VFs
    exist but none can be read, or when a directory every answer depends on
    cannot be read. ``result["store"]`` describes the store used.
    """
    threshold, _source = _hypeman.read_quarantine_threshold(config_path)
    discovery = _sysfs.discover(sysfs_root)
    if discovery.error:
        raise VgpuError(discovery.error, unreadable_vfs=discovery.unreadable)
    cards = set(vf["parent"] for vf in discovery.vfs if vf["parent"])
    cards.update(entry["parent"] for entry in discovery.unreadable if entry.get("parent"))
    cards.update(_sysfs.list_sriov_gpus(sysfs_root))
    parents = dict((card, _sysfs.read_parent(sysfs_root, card)) for card in cards)
    instances, unreadable = _hypeman.list_instances(data_dir)
    checker = _hypeman.LivenessChecker(proc_root)
    for inst in instances:
        # Liveness matters here only for claims; skip the /proc reads for the rest.
        inst["live"], inst["live_reason"] = checker.check(inst) if inst["device_path"] else (None, None)
    store = _store.load_store(store_path)
    quarantine = QuarantineView.from_store(store, threshold)
    vf_nodes = dict((vf["address"], _sysfs.vfio_nodes(sysfs_root, dev_root, vf["address"])) for vf in discovery.vfs)
    try:
        holders = _proc.scan_device_holders(proc_root, dev_root, details=False)
        open_paths, open_error = set(path for holder in holders for path in holder["paths"]), None
    except VgpuError as err:
        open_paths, open_error = None, err.msg
    result = compute(discovery, parents, instances, unreadable, quarantine, vf_nodes, open_paths, open_error, profile)
    result["store"] = {"path": store.path, "format": store.format, "valid": store.valid, "error": store.error}
    if result["framework"] == _sysfs.FRAMEWORK_NONE:
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _passthrough

        result["passthrough"] = _passthrough.discover(sysfs_root)
    if wedge is not None:
        # wedge: (_wedge.Options, state_dir); the signals are attributed with the instances listed here.
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _wedge

        _wedge.add_to_view(result, _wedge.host_section(wedge[0], sysfs_root, proc_root, wedge[1], instances,
                                                       discovery.vfs))
    return result, list(discovery.warnings)


def compute(discovery, parents, instances, unreadable_metadata, quarantine, vf_nodes=None, open_paths=None,
            open_error=None, profile=None):
    """The placement view.

    ``discovery``: :class:`_sysfs.Discovery`; ``parents``: address ->
    :func:`_sysfs.read_parent` dict for every card to report; ``instances`` /
    ``unreadable_metadata``: from :func:`_hypeman.list_instances`;
    ``quarantine``: :class:`QuarantineView`; ``vf_nodes``: VF -> (device
    paths, probe errors) from :func:`_sysfs.vfio_nodes`; ``open_paths``: the
    set of device paths some process holds open (None with ``open_error``
    when the /proc scan failed); ``profile``: what-if profile name.
    Returns the module's result dict (without the ``api`` section).
    """
    return _Placement(discovery, parents, instances, unreadable_metadata, quarantine, vf_nodes or {},
                      open_paths, open_error).result(profile)


def drain_reasons(live_instances, instances, held_open, unreadable_metadata):
    """What a drain of the card waits for, one line each (``vgpu_placement_info``'s ``busy_reasons``).

    ``live_instances`` / ``instances``: ids of instances claiming a VF of the
    card (live ones, all); ``held_open``: how many of its VFs are held open,
    None when that cannot be told; ``unreadable_metadata``: ``{path, ...}`` of
    every metadata file that cannot be read (any may claim a VF of the card).
    """
    reasons = ["live instance %s" % inst for inst in live_instances]
    reasons.extend("claim in the metadata of stopped instance %s" % inst
                   for inst in instances if inst not in live_instances)
    if held_open:
        reasons.append("%d VF(s) held open" % held_open)
    elif held_open is None:
        reasons.append("whether VFs are held open cannot be told")
    reasons.extend("unreadable instance metadata %s" % entry["path"] for entry in unreadable_metadata)
    return reasons


class _Placement(object):
    def __init__(self, discovery, parents, instances, unreadable_metadata, quarantine, vf_nodes, open_paths,
                 open_error):
        self.discovery = discovery
        self.framework = discovery.framework
        self.parents = parents
        self.instances = instances
        self.unreadable_metadata = unreadable_metadata
        # mdev hosts ignore the store entirely (docs/hypeman-interface.md §1.8): never quarantined, never disabled.
        if self.framework != _sysfs.FRAMEWORK_VENDOR_VFIO:
            quarantine = QuarantineView(threshold=quarantine.threshold)
        self.quarantine = quarantine
        self.vfs = discovery.vfs
        self.vf_by_addr = dict((vf["address"], vf) for vf in self.vfs)
        self.vf_nodes = vf_nodes
        self.open_paths = open_paths
        self.open_error = open_error
        self.claims = self._claims()
        self.types_by_id, self.profiles_by_name = self._profile_union()

    # -- inputs ----------------------------------------------------------------------
    def _claims(self):
        """VF -> instance ids whose metadata claims it (any non-empty GPUDevicePath counts)."""
        mdev_owner = {}
        for vf in self.vfs:
            for uuid in vf.get("mdev_uuids") or []:
                mdev_owner[uuid] = vf["address"]
        claims = {}
        for inst in self.instances:
            if not inst.get("device_path"):
                continue
            address = _hypeman.instance_vf(inst, mdev_owner.get)
            if address:
                claims.setdefault(address, []).append(inst)
        return claims

    def _profile_union(self):
        """Type id -> profile and name -> profile over every readable creatable list."""
        by_id, by_name = {}, {}
        if self.framework == _sysfs.FRAMEWORK_MDEV:
            for prof in self.discovery.mdev_profiles:
                by_id[prof["id"]] = prof
                by_name[prof["name"]] = prof
            return by_id, by_name
        for vf in self.vfs:
            for prof in vf.get("creatable") or []:
                by_id[prof["id"]] = prof
                by_name[prof["name"]] = prof
        return by_id, by_name

    # -- per VF ----------------------------------------------------------------------
    def _quarantined(self, address):
        if not self.quarantine.available:
            return None
        return address in self.quarantine.quarantined

    def _held_open(self, address):
        """hypeman's vfioDeviceInUse: open wins; otherwise a probe or scan error is unknown."""
        paths, errors = self.vf_nodes.get(address, ([], []))
        if self.open_paths is not None and any(p in self.open_paths for p in paths):
            return True, None
        if self.open_paths is None:
            return None, self.open_error or "open device scan not run"
        if errors:
            return None, "; ".join(errors)
        return False, None

    def _vf_view(self, vf):
        address = vf["address"]
        claimants = self.claims.get(address, [])
        held, held_error = self._held_open(address)
        quarantined = self._quarantined(address)
        current_profile = None
        if vf["allocated"]:
            known = self.types_by_id.get(vf["current_type"])
            if known:
                current_profile = known["name"]
            elif len(claimants) == 1 and claimants[0].get("profile"):
                current_profile = claimants[0]["profile"]
        current_type = vf["current_type"]
        if self.framework == _sysfs.FRAMEWORK_VENDOR_VFIO:
            current_type = int(current_type)
        view = {
            "address": address,
            "parent": vf["parent"],
            "current_type": current_type,
            "current_profile": current_profile,
            "creatable": None if vf.get("creatable") is None else [p["name"] for p in vf["creatable"]],
            "allocated": vf["allocated"],
            "dirty": vf["allocated"] and not claimants,
            "claimed_by": sorted(inst["id"] for inst in claimants),
            "quarantined": quarantined,
            "failures": self.quarantine.failures.get(address, 0) if self.quarantine.available else None,
            "held_open": held,
            "allocatable": bool(quarantined is False and not vf["allocated"]),
        }
        # Error keys only where something went wrong: the list is long on big hosts.
        if vf.get("creatable_error"):
            view["creatable_error"] = vf["creatable_error"]
        if held_error:
            view["held_open_error"] = held_error
        return view

    # -- slots and profiles (docs/hypeman-interface.md §2.3) -------------------------------
    def _slots(self, vf_views):
        total = len(vf_views)
        used = sum(1 for v in vf_views if v["allocated"])
        if not self.quarantine.available:
            return {"total": total, "used": used, "allocatable": 0, "quarantined": 0}
        return {"total": total, "used": used,
                "allocatable": sum(1 for v in vf_views if v["allocatable"]),
                "quarantined": sum(1 for v in vf_views if v["quarantined"])}

    def _profiles(self):
        if not self.quarantine.available or self.framework == _sysfs.FRAMEWORK_NONE:
            return []
        if self.framework == _sysfs.FRAMEWORK_MDEV:
            out = []
            for prof in self.discovery.mdev_profiles:
                count = 0
                for vf in self.vfs:
                    if vf["allocated"]:
                        continue
                    count += _sysfs.mdev_available(vf, prof["id"])
                out.append({"name": prof["name"], "framebuffer_mb": prof["framebuffer_mb"], "available": count})
            return out
        available = {}
        for vf in self.vfs:
            if vf["allocated"] or vf["address"] in self.quarantine.quarantined:
                continue
            for prof in vf.get("creatable") or []:
                available[prof["id"]] = available.get(prof["id"], 0) + 1
        profiles = sorted(self.types_by_id.values(), key=lambda p: p["name"])
        return [{"name": p["name"], "framebuffer_mb": p["framebuffer_mb"], "available": available.get(p["id"], 0)}
                for p in profiles]

    # -- cards -----------------------------------------------------------------------------
    def usage(self):
        """GPU -> (framebuffer MB in use, usage fully known), as hypeman computes load."""
        usage, unknown = {}, set()
        if self.framework == _sysfs.FRAMEWORK_MDEV:
            for vf in self.vfs:
                if vf["allocated"]:
                    prof = self.types_by_id.get(vf["current_type"])
                    usage[vf["parent"]] = usage.get(vf["parent"], 0) + (prof["framebuffer_mb"] if prof else 0)
            return usage, unknown
        for address, claimants in self.claims.items():
            vf = self.vf_by_addr.get(address)
            if vf is None:
                continue
            for inst in claimants:
                prof = self.profiles_by_name.get(inst.get("profile") or "")
                if prof is None:
                    unknown.add(vf["parent"])
                else:
                    usage[vf["parent"]] = usage.get(vf["parent"], 0) + prof["framebuffer_mb"]
        return usage, unknown

    def rank_key(self, gpu, quarantined_by_gpu, usage, unknown):
        if self.framework == _sysfs.FRAMEWORK_MDEV:
            return (usage.get(gpu, 0), gpu or "")
        return (quarantined_by_gpu.get(gpu, 0), gpu in unknown, usage.get(gpu, 0), gpu or "")

    def _gpus(self, vf_views):
        by_gpu = {}
        for view in vf_views:
            by_gpu.setdefault(view["parent"], []).append(view)
        unreadable_by_gpu = {}
        for entry in self.discovery.unreadable:
            unreadable_by_gpu.setdefault(entry.get("parent"), []).append(entry["address"])
        addresses = set(by_gpu) | set(self.parents) | set(unreadable_by_gpu)
        usage, unknown = self.usage()
        quarantined_by_gpu = dict((gpu, sum(1 for v in views if v["quarantined"])) for gpu, views in by_gpu.items())
        ranked = sorted((g for g in by_gpu), key=lambda g: self.rank_key(g, quarantined_by_gpu, usage, unknown))
        rank = dict((gpu, index + 1) for index, gpu in enumerate(ranked))
        gpus = []
        for gpu in sorted(addresses, key=lambda a: a or ""):
            gpus.append(self._gpu_view(gpu, by_gpu.get(gpu, []), unreadable_by_gpu.get(gpu, []),
                                       usage, unknown, rank.get(gpu)))
        return gpus

    def _gpu_view(self, gpu, views, unreadable_vfs, usage, unknown, rank):
        parent = self.parents.get(gpu) or {}
        total = len(views)
        allocated = sum(1 for v in views if v["allocated"])
        claimed = sum(1 for v in views if v["claimed_by"])
        held_values = [v["held_open"] for v in views]
        held_open = None if None in held_values else sum(1 for h in held_values if h)
        if self.quarantine.available:
            quarantined = sum(1 for v in views if v["quarantined"])
            allocatable = sum(1 for v in views if v["allocatable"])
            drained = total > 0 and quarantined == total
            overflow_only = 0 < quarantined < total
        else:
            quarantined, allocatable, drained, overflow_only = None, 0, None, None
        instances = sorted(set(i for v in views for i in v["claimed_by"]))
        live = []
        for vf in [v["address"] for v in views]:
            for inst in self.claims.get(vf, []):
                if inst.get("live") is not False:
                    live.append(inst["id"])
        # One line per reason, listing the VFs: readable for an operator, small for a fleet.
        allocated_vfs = [v["address"] for v in views if v["allocated"]]
        claims = ["%s (%s)" % (v["address"], ", ".join(v["claimed_by"])) for v in views if v["claimed_by"]]
        held = [v["address"] for v in views if v["held_open"]]
        handles_unknown = [v for v in views if v["held_open"] is None]
        virtfns = set(v["address"] for v in parent.get("virtfns", []))
        claims.extend("%s (%s)" % (address, ", ".join(sorted(i["id"] for i in claimants)))
                      for address, claimants in sorted(self.claims.items())
                      if address not in self.vf_by_addr and address in virtfns)
        blockers = []
        if allocated_vfs:
            blockers.append("allocated VFs: %s" % ", ".join(allocated_vfs))
        if claims:
            blockers.append("claimed VFs: %s" % ", ".join(claims))
        if held:
            blockers.append("VFs held open: %s" % ", ".join(held))
        if handles_unknown:
            blockers.append("open handles unknown for VFs %s: %s"
                            % (", ".join(v["address"] for v in handles_unknown), handles_unknown[0]["held_open_error"]))
        if unreadable_vfs:
            blockers.append("unreadable VFs: %s" % ", ".join(unreadable_vfs))
        if self.unreadable_metadata:
            blockers.append("%d instance metadata file(s) unreadable; any of them may claim a VF of this card"
                            % len(self.unreadable_metadata))
        if gpu is None:
            blockers.append("VFs without a readable physfn link: parent unknown")
        busy_reasons = drain_reasons(sorted(set(live)), instances, held_open, self.unreadable_metadata)
        return {
            "address": gpu,
            "vendor_id": parent.get("vendor_id"),
            "device_id": parent.get("device_id"),
            "vfs": [v["address"] for v in views],
            "vf_total": total,
            "unreadable_vfs": list(unreadable_vfs),
            "sriov_numvfs": parent.get("sriov_numvfs"),
            "sriov_totalvfs": parent.get("sriov_totalvfs"),
            "virtfns": len(parent.get("virtfns", [])),
            "quarantined": quarantined,
            "claimed": claimed,
            "allocated": allocated,
            "dirty": sum(1 for v in views if v["dirty"]),
            "held_open": held_open,
            "allocatable": allocatable,
            "framebuffer_used_mb": usage.get(gpu, 0),
            "usage_known": gpu not in unknown,
            "rank": rank if self.quarantine.available else None,
            "overflow_only": overflow_only,
            "drained": drained,
            "idle": not blockers,
            "idle_blockers": blockers,
            "instances": instances,
            "live_instances": sorted(set(live)),
            "busy": bool(busy_reasons),
            "busy_reasons": busy_reasons,
            "errors": list(parent.get("errors", [])),
        }

    # -- result ------------------------------------------------------------------------------
    def result(self, profile):
        vf_views = [self._vf_view(vf) for vf in self.vfs]
        slots = self._slots(vf_views)
        result = {
            "framework": self.framework,
            "placement_disabled_reason": self.quarantine.reason,
            "threshold": self.quarantine.threshold,
            "slots": slots,
            "profiles": self._profiles(),
            "gpus": self._gpus(vf_views),
            "vfs": vf_views,
            "unreadable_vfs": list(self.discovery.unreadable),
            "unreadable_metadata": list(self.unreadable_metadata),
            "pending_quarantine": sorted(self.quarantine.pending) if self.quarantine.available else [],
            "held_open_error": self.open_error,
            "candidates": None,
            "passthrough": None,
        }
        if profile is not None:
            # Lazy: only a what-if for a profile lists candidates (never the audit).
            from ansible_collections.hypeman.vgpu.plugins.module_utils import _placement_whatif
            result["candidates"] = _placement_whatif.candidates(self, profile, slots)
        return result
