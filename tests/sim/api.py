# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``hypeman-api`` stand-in: the parts of hypeman's API the collection talks to.

Facts reproduced (``docs/hypeman-interface.md``):

- §1.8 / §9: the VF health store is read **only at start** (once loaded) and
  every report rewrites the file from memory, so an edit made while this
  process runs is lost at the next report (``POST /_sim/vf-health/failure``
  is the test-only way to make it report); an invalid store fails closed:
  ``allocatable_slots`` and ``quarantined_slots`` 0, ``profiles`` left out,
  ``placement_disabled_reason`` set; a load error is retried on every access;
- §2.3 / §2.4: ``GET /resources`` ``gpu`` object with hypeman's fields and
  arithmetic, computed from sysfs on each request (§6.1 discovery: mdev first,
  then vendor-VFIO, else passthrough; one unreadable VF is skipped; ``gpu`` is
  null when discovery fails or there is no GPU);
- §2.5: every path but ``/health`` needs ``Authorization: Bearer <JWT>``
  (HS256 with ``jwt_secret`` from the config, ``exp`` checked);
- §3.3 / §3.4: ``GET /instances`` lists readable metadata (unreadable ones are
  skipped, as hypeman's API does), ``gpu.device_path`` from ``GPUDevicePath``,
  ``state`` from liveness (PID alive, not a zombie, start time and boot id
  match when recorded);
- §12: ``POST /instances`` (``CreateInstanceRequest``: ``name`` and ``image``
  required, ``gpu.profile``, ``tags``, ``hypervisor``) places the vGPU as
  hypeman's claim variant does (§2.1: the profile resolved through the union
  of creatable types, quarantined VFs counted against their card, cards
  ranked by fewest quarantined VFs, known usage, least framebuffer in use,
  address; clean VFs first, a random one of the leading group) and answers
  201 with the ``Instance``; ``DELETE /instances/{id}`` stops the VMM,
  releases the vGPU, removes the instance's data and answers 204. The boot
  itself (VMM, metadata, console, guest agent) is the simulated host's
  (``host.ApiLauncher``); without a launcher both answer 501.

Standard library only. Independent of the collection's module_utils on
purpose (see ``store.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import random
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import metrics as sim_metrics
from .hosttree import vf_may_wedge_line
from .store import DEFAULT_THRESHOLD, StoreError, VFHealthStore

_TYPE_LINE = re.compile(r"^\s*(\S[^:]*?)\s*:\s*(.*?)\s*$")


# --------------------------------------------------------------------- config
def read_config(path):
    """The few keys the stand-in needs from hypeman's block YAML config."""
    conf = {"port": "8080", "data_dir": "/var/lib/hypeman", "jwt_secret": "",
            "threshold": DEFAULT_THRESHOLD}
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except (IOError, OSError):
        return conf
    section = None
    for raw in lines:
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key, _sep, value = line.strip().partition(":")
        value = value.strip().strip("'\"")
        if indent == 0:
            section = key if not value else None
            if key in ("port", "data_dir", "jwt_secret"):
                conf[key] = value
        elif section == "gpu" and key == "vf_quarantine_threshold":
            conf["threshold"] = int(value)
    return conf


# --------------------------------------------------------------------- sysfs
def _read(path):
    with open(path) as handle:
        return handle.read()


def parse_creatable(text):
    """``creatable_vgpu_types``: header skipped, ``<id> : <name>`` lines (§6.2)."""
    types = []
    for line in text.splitlines()[1:]:
        match = _TYPE_LINE.match(line)
        if not match:
            continue
        type_id, name = match.group(1), match.group(2)
        if type_id.isdigit() and name:
            types.append((int(type_id), name))
    return types


def profile_framebuffer_mb(name):
    """Digits between the last ``-`` and the last series letter, times 1024 (§2.3)."""
    last = max(name.rfind(c) for c in "ABCQ")
    dash = name.rfind("-", 0, last) if last > 0 else -1
    digits = name[dash + 1:last] if dash >= 0 else ""
    return int(digits) * 1024 if digits.isdigit() else 0


def discover(sysfs_root):
    """``(framework, vfs, error)``; ``vfs`` is a list of dicts (address, parent, type, creatable)."""
    mdev_bus = os.path.join(sysfs_root, "class", "mdev_bus")
    devices = os.path.join(sysfs_root, "bus", "pci", "devices")
    if os.path.isdir(mdev_bus) and os.listdir(mdev_bus):
        return _discover_mdev(sysfs_root, sorted(os.listdir(mdev_bus)))
    try:
        entries = sorted(os.listdir(devices))
    except OSError:
        entries = []
    candidates = [e for e in entries if os.path.exists(os.path.join(devices, e, "nvidia", "creatable_vgpu_types"))]
    if not candidates:
        return "none", [], None
    vfs = []
    for address in candidates:
        base = os.path.join(devices, address)
        try:
            creatable = parse_creatable(_read(os.path.join(base, "nvidia", "creatable_vgpu_types")))
            current = int(_read(os.path.join(base, "nvidia", "current_vgpu_type")).strip())
            parent = os.path.basename(os.readlink(os.path.join(base, "physfn")))
        except (IOError, OSError, ValueError):
            continue  # "skipping unreadable vendor VFIO VFs"
        vfs.append({"address": address, "parent": parent, "type": current, "creatable": creatable})
    if not vfs:
        return "vendor-vfio", [], "discover vendor VFIO VFs: no readable VF"
    return "vendor-vfio", vfs, None


def _discover_mdev(sysfs_root, parents):
    vfs = []
    for address in parents:
        base = os.path.join(sysfs_root, "class", "mdev_bus", address)
        types_dir = os.path.join(base, "mdev_supported_types")
        try:
            creatable, instances = [], {}
            for type_dir in sorted(os.listdir(types_dir)):
                name = _read(os.path.join(types_dir, type_dir, "name")).strip()
                instances[name] = int(_read(os.path.join(types_dir, type_dir, "available_instances")).strip())
                creatable.append((int(type_dir.rsplit("-", 1)[-1]), name))
            in_use = any(os.path.islink(os.path.join(base, e, "mdev_type")) for e in os.listdir(base))
            parent = os.path.basename(os.readlink(os.path.join(base, "physfn")))
        except (IOError, OSError, ValueError):
            continue
        vfs.append({"address": address, "parent": parent, "type": 1 if in_use else 0, "creatable": creatable,
                    "available_instances": instances})
    if not vfs:
        return "mdev", [], "discover mdev VFs: no readable VF"
    return "mdev", vfs, None


# hypeman's device-name table (lib/devices/discovery.go getDeviceName), then the class fallback.
_PT_NAMES = {"2321": "H100 NVL", "2330": "H100 SXM5 80GB", "2331": "H100 PCIe", "2339": "H100", "2335": "H200",
             "27b8": "L4", "26b5": "L40", "26b9": "L40S", "20b0": "A100 SXM4 40GB", "20b2": "A100 SXM4 80GB",
             "20b5": "A100 PCIe 40GB", "20f1": "A100 PCIe 80GB", "20b7": "A30", "2235": "A40", "2684": "RTX 4090",
             "27b0": "RTX 4090 D", "1db4": "V100 PCIe 16GB", "1db5": "V100 SXM2 16GB", "1db6": "V100 PCIe 32GB"}
_PT_CLASSES = {"0300": "VGA Controller", "0302": "3D Controller", "0403": "Audio Device"}
_PCI_NAME = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")


def passthrough_devices(sysfs_root):
    """hypeman's passthrough list (lib/resources/gpu.go): NVIDIA candidates, one entry each, in name order."""
    devices = os.path.join(sysfs_root, "bus", "pci", "devices")
    found = []
    for address in sorted(os.listdir(devices)) if os.path.isdir(devices) else []:
        if not _PCI_NAME.match(address):
            continue
        base = os.path.join(devices, address)
        try:
            vendor = _read(os.path.join(base, "vendor")).strip()
            device = _read(os.path.join(base, "device")).strip()
            int(os.path.basename(os.readlink(os.path.join(base, "iommu_group"))))
            klass = _read(os.path.join(base, "class")).strip()
        except (IOError, OSError, ValueError):
            continue
        vendor = vendor[2:] if vendor.startswith("0x") else vendor
        device = device[2:] if device.startswith("0x") else device
        klass = klass[2:] if klass.startswith("0x") else klass
        if vendor != "10de":
            continue  # a VGA/3D candidate of another vendor is not listed
        try:
            driver = os.path.basename(os.readlink(os.path.join(base, "driver")))
        except OSError:
            driver = None
        found.append({"address": address, "name": _PT_NAMES.get(device) or _PT_CLASSES.get(klass[:4], "PCI Device"),
                      "available": driver != "vfio-pci"})
    return found


def gpu_resources(sysfs_root, quarantined, unavailable_reason):
    """The ``gpu`` object of ``GET /resources`` (§2.3, §2.4); None when there is none."""
    framework, vfs, error = discover(sysfs_root)
    if error:
        return None  # hypeman does not fall back to passthrough when discovery errors
    if framework == "none":
        devices = passthrough_devices(sysfs_root)
        if not devices:
            return None
        used = sum(1 for dev in devices if not dev["available"])
        return {"mode": "passthrough", "total_slots": len(devices), "used_slots": used,
                "allocatable_slots": len(devices) - used, "quarantined_slots": 0,
                "devices": [{"name": dev["name"], "available": dev["available"]} for dev in devices]}
    if framework == "mdev":
        quarantined, unavailable_reason = set(), None  # mdev ignores the store (§1.8)
    quarantined = set(quarantined)
    gpu = {"mode": "vgpu", "total_slots": len(vfs),
           "used_slots": sum(1 for vf in vfs if vf["type"] != 0)}
    if unavailable_reason:
        gpu.update(allocatable_slots=0, quarantined_slots=0, placement_disabled_reason=unavailable_reason)
        return gpu
    gpu["allocatable_slots"] = sum(1 for vf in vfs if vf["type"] == 0 and vf["address"] not in quarantined)
    gpu["quarantined_slots"] = sum(1 for vf in vfs if vf["address"] in quarantined)
    names = sorted(set(name for vf in vfs for _tid, name in vf["creatable"]))
    free = [vf for vf in vfs if vf["type"] == 0 and vf["address"] not in quarantined]
    if framework == "mdev":
        # Every supported type is listed; a free VF offers its available_instances of it.
        available = dict((n, sum(vf["available_instances"].get(n, 0) for vf in free)) for n in names)
    else:
        available = dict((n, sum(1 for vf in free if n in [m for _t, m in vf["creatable"]])) for n in names)
    gpu["profiles"] = [{"name": name, "framebuffer_mb": profile_framebuffer_mb(name), "available": available[name]}
                       for name in names]
    return gpu


def other_resources():
    # Present so clients see hypeman's top-level shape; values are not simulated.
    return {"cpu": {"capacity": 64, "allocated": 0, "available": 64, "oversub_ratio": 1},
            "memory": {"capacity": 549755813888, "allocated": 0, "available": 549755813888, "oversub_ratio": 1},
            "disk": {"capacity": 3840755982336, "allocated": 0, "available": 3840755982336},
            "network": {"capacity": 25000000000, "allocated": 0, "available": 25000000000},
            "disk_breakdown": {}, "allocations": []}


# ------------------------------------------------------------------ instances
def process_alive(proc_root, pid, start_time=0):
    """hypeman's liveness core: the PID exists, is not a zombie, and started when recorded."""
    try:
        status = _read(os.path.join(proc_root, str(pid), "status"))
        stat = _read(os.path.join(proc_root, str(pid), "stat"))
    except (IOError, OSError):
        return False
    state = [line for line in status.splitlines() if line.startswith("State:")]
    if state and state[0].split()[1] == "Z":
        return False
    if start_time:
        fields = stat.rsplit(")", 1)[1].split()
        return int(fields[19]) == int(start_time)
    return True


def list_instances(data_dir, proc_root="/proc"):
    """``GET /instances``: readable metadata only (the API skips unreadable ones, §3.4)."""
    guests = os.path.join(data_dir, "guests")
    try:
        names = sorted(os.listdir(guests))
    except OSError:
        return []
    try:
        boot_id = _read(os.path.join(proc_root, "sys", "kernel", "random", "boot_id")).strip()
    except (IOError, OSError):
        boot_id = ""
    out = []
    for name in names:
        try:
            meta = json.loads(_read(os.path.join(guests, name, "metadata.json")))
        except (IOError, OSError, ValueError):
            continue
        pid = meta.get("HypervisorPID")
        live = bool(pid) and process_alive(proc_root, pid, meta.get("HypervisorStartTime") or 0)
        if live and meta.get("HypervisorBootID") and boot_id and meta["HypervisorBootID"] != boot_id:
            live = False
        item = {"id": meta.get("Id", name), "name": meta.get("Name", name),
                "state": "Running" if live else "Stopped", "hypervisor": meta.get("HypervisorType")}
        if meta.get("Image"):
            item["image"] = meta["Image"]
        if isinstance(meta.get("Tags"), dict):
            item["tags"] = meta["Tags"]
        if meta.get("GPUProfile"):
            gpu = {"profile": meta["GPUProfile"]}
            if meta.get("GPUDevicePath"):
                gpu["device_path"] = meta["GPUDevicePath"]
            if meta.get("GPUMdevUUID"):
                gpu["mdev_uuid"] = meta["GPUMdevUUID"]
            item["gpu"] = gpu
        out.append(item)
    return out


# ------------------------------------------------------------------ placement
def claimed_profiles(data_dir):
    """VF address -> claimed profile name, from every metadata with a ``GPUDevicePath`` (§2.1, §9)."""
    guests = os.path.join(data_dir, "guests")
    claims = {}
    for name in sorted(os.listdir(guests)) if os.path.isdir(guests) else []:
        try:
            meta = json.loads(_read(os.path.join(guests, name, "metadata.json")))
        except (IOError, OSError, ValueError):
            return None  # hypeman's listing fails closed on unreadable metadata
        if meta.get("GPUDevicePath"):
            claims[os.path.basename(meta["GPUDevicePath"])] = meta.get("GPUProfile") or ""
    return claims


def choose_vf(vfs, claims, quarantined, profile, rng=random):
    """hypeman's claim-variant VF selection (§2.1): ``(vf_address, None)`` or ``(None, refusal)``."""
    union = {}
    for vf in vfs:
        for type_id, name in vf["creatable"]:
            union.setdefault(name, type_id)
    if not union:
        return None, "no creatable vGPU profiles on any VF (GPUs at capacity or dirty VFs consuming framebuffer)"
    if profile not in union:
        return None, "profile %s is not creatable on any VF (unknown profile or insufficient capacity)" % (
            json.dumps(profile))
    type_id = union[profile]
    usage, unknown, quarantined_by = {}, set(), {}
    for vf in vfs:
        if vf["address"] in claims:
            claimed = claims[vf["address"]]
            if claimed in union:
                usage[vf["parent"]] = usage.get(vf["parent"], 0) + profile_framebuffer_mb(claimed)
            else:
                unknown.add(vf["parent"])
    advertised_by = set(vf["parent"] for vf in vfs if type_id in [t for t, _n in vf["creatable"]])
    free = {}
    for vf in vfs:
        if vf["address"] in quarantined:
            quarantined_by[vf["parent"]] = quarantined_by.get(vf["parent"], 0) + 1
            continue
        if vf["address"] in claims:
            continue
        direct = type_id in [t for t, _n in vf["creatable"]]
        dirty = vf["type"] != 0 and (vf["type"] == type_id or vf["parent"] in advertised_by)
        if direct or dirty:
            free.setdefault(vf["parent"], []).append(vf)
    if not free:
        return None, "no available VF for profile %s" % json.dumps(profile)
    best = min(free, key=lambda gpu: (quarantined_by.get(gpu, 0), gpu in unknown, usage.get(gpu, 0), gpu))
    ordered = sorted(free[best], key=lambda vf: (vf["type"] != 0, vf["address"]))
    leading = [vf for vf in ordered if (vf["type"] != 0) == (ordered[0]["type"] != 0)]
    return rng.choice(leading)["address"], None


_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_TAG_RE = re.compile(r"^[A-Za-z0-9 _.:/=+@-]*$")


def new_instance_id(rng=random):
    """A CUID2-shaped id: 24 lowercase letters and digits, starting with a letter."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return rng.choice(alphabet[:26]) + "".join(rng.choice(alphabet) for _index in range(23))


def create_request_problem(body):
    """hypeman's 400 answer for a ``CreateInstanceRequest`` it would refuse, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    name, image = body.get("name"), body.get("image")
    if not isinstance(name, str) or not name:
        return "Missing required field: name"
    if len(name) > 63 or not _NAME_RE.match(name):
        return "name must be lowercase letters, digits and dashes, not starting or ending with a dash (max 63)"
    if not isinstance(image, str) or not image:
        return "Missing required field: image"
    gpu = body.get("gpu")
    if gpu is not None and (not isinstance(gpu, dict) or not isinstance(gpu.get("profile", ""), str)):
        return "gpu must be an object with a string profile"
    tags = body.get("tags")
    if tags is not None:
        if not isinstance(tags, dict) or len(tags) > 50:
            return "tags must be an object of at most 50 entries"
        for key, value in tags.items():
            if not (1 <= len(key) <= 128 and _TAG_RE.match(key)) or not isinstance(value, str) \
                    or len(value) > 256 or not _TAG_RE.match(value):
                return "invalid tag %s" % json.dumps(key)
    if body.get("hypervisor") not in (None, "cloud-hypervisor", "firecracker", "qemu", "qemu-microvm", "vz"):
        return "invalid hypervisor %s" % json.dumps(body.get("hypervisor"))
    return None


# ------------------------------------------------------------------------ JWT
def _b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint_token(secret, user_id="vgpu-sim", duration=8760 * 3600, now=None):
    """An HS256 JWT like ``hypeman-token -user-id X -duration D`` mints."""
    now = int(time.time() if now is None else now)
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = _b64(json.dumps({"sub": user_id, "iat": now, "exp": now + int(duration)},
                             separators=(",", ":")).encode())
    signing = ("%s.%s" % (header, claims)).encode("ascii")
    return "%s.%s" % (signing.decode("ascii"), _b64(hmac.new(secret.encode(), signing, hashlib.sha256).digest()))


def check_token(secret, token, now=None):
    """None when valid, else the reason it is refused."""
    parts = token.split(".")
    if len(parts) != 3 or not secret:
        return "malformed token"
    signing = ("%s.%s" % (parts[0], parts[1])).encode("ascii")
    expected = _b64(hmac.new(secret.encode(), signing, hashlib.sha256).digest())
    if not hmac.compare_digest(expected, parts[2]):
        return "invalid signature"
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except (ValueError, TypeError):
        return "malformed token"
    if header.get("alg") != "HS256":
        return "unexpected signing method"
    if int(claims.get("exp", 0)) < int(time.time() if now is None else now):
        return "token expired"
    return None


# --------------------------------------------------------------------- server
class HypemanAPI(object):
    """State of one running stand-in: config, the in-memory store, paths."""

    def __init__(self, config_path, sysfs_root="/sys", proc_root="/proc", data_dir=None, vfio_term_grace=5.0):
        self.config = read_config(config_path)
        self.vfio_term_grace = vfio_term_grace  # lib/hypervisor VFIOTermGrace (§8.1)
        self.data_dir = data_dir or self.config["data_dir"]
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.lock = threading.Lock()  # hypeman's VF-health mutex
        self.started_at = time.time()
        self.version = "v0.0.0-sim"  # hypeman_info's service_version
        # Loaded now, and never again once loaded: hypeman's startup read.
        self.store = VFHealthStore(os.path.join(self.data_dir, "gpu", "vf-health.json"),
                                   threshold=self.config["threshold"])
        # Boots and deletes instances (tests/sim/host.py ApiLauncher); None: the two routes answer 501.
        self.launcher = None
        self.instances_lock = threading.Lock()  # hypeman's devices lock around placement and claim

    def create_instance(self, body):
        """``POST /instances``: ``(status, body)`` as hypeman answers."""
        if self.launcher is None:
            return 501, {"code": "not_implemented", "message": "this stand-in cannot boot instances"}
        problem = create_request_problem(body)
        if problem:
            return 400, {"code": "bad_request", "message": problem}
        profile = (body.get("gpu") or {}).get("profile") or None
        with self.instances_lock:
            if any(item["name"] == body["name"] for item in list_instances(self.data_dir, self.proc_root)):
                return 409, {"code": "already_exists", "message": "instance name %s already exists" % body["name"]}
            vf = None
            if profile:
                with self.lock:
                    reason = self.store.unavailable_reason()
                    quarantined = set(self.store.quarantined()) if reason is None else set()
                if reason:
                    return 409, {"code": "gpu_unavailable",
                                 "message": "vGPU placement is disabled: VF health state unavailable: %s" % reason}
                framework, vfs, error = discover(self.sysfs_root)
                claims = claimed_profiles(self.data_dir)
                if error or framework != "vendor-vfio":
                    return 409, {"code": "gpu_unavailable", "message": error or "no vendor VFIO vGPU on this host"}
                if claims is None:
                    return 500, {"code": "internal_error", "message": "list instances for vGPU allocation failed"}
                vf, refusal = choose_vf(vfs, claims, quarantined, profile)
                if refusal:
                    return 409, {"code": "gpu_unavailable", "message": refusal}
            instance_id = new_instance_id()
            extra = {"Image": body["image"], "Tags": dict(body.get("tags") or {})}
            try:
                self.launcher.boot(instance_id, vf, profile, body["name"], extra)
            except Exception as err:  # pylint: disable=broad-except  # the stand-in reports, never dies
                return 500, {"code": "internal_error", "message": "create instance: %s" % err}
        for item in list_instances(self.data_dir, self.proc_root):
            if item["id"] == instance_id:
                item["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                return 201, item
        return 500, {"code": "internal_error", "message": "instance %s vanished after create" % instance_id}

    def delete_instance(self, instance_id):
        """``DELETE /instances/{id}``: ``(status, body or None)``."""
        if self.launcher is None:
            return 501, {"code": "not_implemented", "message": "this stand-in cannot delete instances"}
        with self.instances_lock:
            if not any(item["id"] == instance_id for item in list_instances(self.data_dir, self.proc_root)):
                return 404, {"code": "not_found", "message": "instance not found"}
            self.launcher.delete(instance_id)
        return 204, None

    def resources(self):
        with self.lock:
            reason = self.store.unavailable_reason()
            quarantined = self.store.quarantined() if reason is None else []
        body = other_resources()
        body["gpu"] = gpu_resources(self.sysfs_root, quarantined, reason)
        return body

    def report(self, kind, body):
        vf = body.get("vf_address", "")
        instance_id = body.get("instance_id", "")
        assigned_at = body.get("assigned_at", "")
        with self.lock:
            if kind == "failure":
                outcome, count = self.store.report_failure(vf, instance_id, assigned_at)
                return {"outcome": outcome, "failures": count, "threshold": self.store.threshold}
            cleared, rescinded = self.store.report_success(vf, instance_id, assigned_at)
            return {"cleared": cleared, "rescinded": rescinded}

    def terminate_then_kill(self, instance_id, out=None):
        """hypeman's stop of a VFIO instance's hypervisor (§8.1 ``terminateThenKill``), for real processes.

        SIGTERM, up to ``vfio_term_grace`` seconds for it to go, then the WARN
        line (slog JSON on stdout: the journal of hypeman.service) and SIGKILL.
        """
        out = sys.stdout if out is None else out
        with open(os.path.join(self.data_dir, "guests", instance_id, "metadata.json")) as handle:
            meta = json.load(handle)
        pid, start = meta.get("HypervisorPID"), meta.get("HypervisorStartTime") or 0
        if not (isinstance(pid, int) and pid > 0 and process_alive(self.proc_root, pid, start)):
            return {"hard_killed": False, "reason": "no running hypervisor"}
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + self.vfio_term_grace
        while time.time() < deadline:
            if not process_alive(self.proc_root, pid, start):
                return {"hard_killed": False, "reason": "exited on SIGTERM"}
            time.sleep(0.05)
        out.write(vf_may_wedge_line(instance_id, meta.get("GPUDevicePath") or "", time.time_ns()) + "\n")
        out.flush()
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while process_alive(self.proc_root, pid, start) and time.time() < deadline:
            time.sleep(0.02)
        return {"hard_killed": True, "grace_s": self.vfio_term_grace}


def make_handler(api):
    class Handler(BaseHTTPRequestHandler):
        server_version = "hypeman-api-sim"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # to the journal under systemd
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

        def _send(self, code, body):
            data = b"" if body is None else json.dumps(body).encode("utf-8")
            self.send_response(code)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self):
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer "):
                self._send(401, {"code": "unauthorized", "message": "authorization header required"})
                return False
            reason = check_token(api.config["jwt_secret"], auth[len("Bearer "):].strip())
            if reason:
                self._send(401, {"code": "unauthorized", "message": reason})
                return False
            return True

        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            if path == "/health":
                return self._send(200, {"status": "ok"})
            if not self._authorized():
                return None
            if path == "/resources":
                return self._send(200, api.resources())
            if path == "/instances":
                return self._send(200, list_instances(api.data_dir, api.proc_root))
            if path.startswith("/instances/"):
                wanted = path.split("/", 2)[2]
                for item in list_instances(api.data_dir, api.proc_root):
                    if item["id"] == wanted:
                        return self._send(200, item)
                return self._send(404, {"code": "not_found", "message": "instance not found"})
            return self._send(404, {"code": "not_found", "message": "no route"})

        def do_POST(self):  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/")
            if not self._authorized():
                return None
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self._send(400, {"code": "bad_request", "message": "body is not JSON"})
            # Test-only: make the stand-in report as its sentinel would, from memory.
            if path in ("/_sim/vf-health/failure", "/_sim/vf-health/success"):
                try:
                    return self._send(200, api.report(path.rsplit("/", 1)[1], body))
                except StoreError as err:
                    return self._send(409, {"code": "vf_health_unavailable", "message": str(err)})
            if path == "/instances":
                return self._send(*api.create_instance(body))
            # Test-only: hypeman's stop path for one instance's hypervisor (the hard kill and its log line).
            match = re.match(r"^/_sim/instances/([A-Za-z0-9_.-]{1,128})/terminate$", path)
            if match:
                try:
                    return self._send(200, api.terminate_then_kill(match.group(1)))
                except (OSError, ValueError) as err:
                    return self._send(404, {"code": "not_found", "message": str(err)})
            return self._send(404, {"code": "not_found", "message": "no route"})

        def do_DELETE(self):  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/")
            if not self._authorized():
                return None
            if path.startswith("/instances/") and path.count("/") == 2:
                return self._send(*api.delete_instance(path.split("/", 2)[2]))
            return self._send(404, {"code": "not_found", "message": "no route"})

    return Handler


def metrics_text(api, counters, vsock=True):
    """hypeman's ``/metrics`` now (§5.4, §5.6): its build info, uptime and the sentinel's instruments."""
    with api.lock:
        reason = api.store.unavailable_reason()
        quarantined = len(api.store.quarantined()) if reason is None else 0
    return sim_metrics.render(counters, api.version, time.time() - api.started_at, quarantined, reason is not None,
                              vsock)


def serve_metrics(api, counters, listen="127.0.0.1", port=9464, vsock=True):
    """Serve ``GET /metrics`` in a background thread (hypeman's metrics listener); returns the server."""
    class MetricsHandler(BaseHTTPRequestHandler):
        server_version = "hypeman-metrics-sim"

        def log_message(self, fmt, *args):
            sys.stderr.write("metrics %s %s\n" % (self.address_string(), fmt % args))

        def do_GET(self):  # noqa: N802
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = metrics_text(api, counters, vsock).encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((listen, port), MetricsHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="hypeman-metrics", daemon=True).start()
    return server


def serve(api, listen="0.0.0.0", port=None, ready=None):
    """Serve until interrupted; ``ready(server)`` is called once listening."""
    port = int(api.config["port"] if port is None else port)
    server = ThreadingHTTPServer((listen, port), make_handler(api))
    server.daemon_threads = True
    if ready:
        ready(server)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
