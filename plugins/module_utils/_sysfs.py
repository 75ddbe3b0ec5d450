# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI / SR-IOV / vGPU discovery under a configurable sysfs root (stdlib only).

Reads the files hypeman reads (``lib/devices/vendor_vfio_linux.go``,
``mdev_linux.go``, ``vgpu_linux.go``) the way it reads them, plus the SR-IOV
files of the parent GPUs (``sriov_totalvfs``, ``sriov_numvfs``, ``virtfn*``)
that operators and the SR-IOV cycle need. Nothing here writes to sysfs.

Addresses are normalised (lowercase, 4-digit domain) by ``_pci``, as store
records and inputs are, so they compare equal.
"""

from __future__ import annotations

import errno
import os
import re

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import is_within, read_bytes, real_escape
from ansible_collections.hypeman.vgpu.plugins.module_utils._govalues import go_quote
from ansible_collections.hypeman.vgpu.plugins.module_utils._pci import address_or_none, canonical_address, normalize_address

FRAMEWORK_MDEV = "mdev"
FRAMEWORK_VENDOR_VFIO = "vendor-vfio"
FRAMEWORK_NONE = "none"
NVIDIA_VENDOR_ID = "10de"

_GO_ATOI_RE = re.compile(r"^[+-]?[0-9]+$")
_INT64_MAX = (1 << 63) - 1
_VIRTFN_RE = re.compile(r"^virtfn([0-9]+)$")
_FRAMEBUFFER_RE = re.compile(r"framebuffer=(\d+)M")
# A sysfs attribute is at most a page (4 KiB, 64 KiB on some arm64 kernels); more is not sysfs.
ATTRIBUTE_LIMIT = 1024 * 1024
# How much of a bad attribute value an error message quotes.
_QUOTE_LIMIT = 200


def pci_devices_dir(sysfs_root):
    return os.path.join(sysfs_root, "bus", "pci", "devices")


def normalize_card_address(value, option="parent_gpu"):
    """Normalise a user-given PCI address of a card; VgpuError naming the option otherwise."""
    try:
        return normalize_address(value)
    except VgpuError:
        hint = ""
        if not isinstance(value, str) or value.replace(".", "", 1).isdigit():
            hint = " (unquoted in YAML, an address like 82:00.0 reads as a number: quote it)"
        raise VgpuError("%s %r is not a PCI address; expected one like 0000:82:00.0%s" % (option, value, hint))


def _err_text(err):
    return err.strerror or str(err) if isinstance(err, EnvironmentError) else str(err)


def _is_enoent(err):
    return isinstance(err, EnvironmentError) and err.errno == errno.ENOENT


def read_attribute(path):
    """A sysfs attribute's text. Attributes are regular files: a symlink in the last component, a FIFO
    or a device is refused (HostFileError), a file over :data:`ATTRIBUTE_LIMIT` too."""
    return read_bytes(path, limit=ATTRIBUTE_LIMIT, follow=False).decode("utf-8", "surrogateescape")


def link_escape(sysfs_root, link):
    """Where the symlink ``link`` leads when that is outside ``sysfs_root``, else None (also when it is no link).

    sysfs links are relative (``../../../devices/...``), so the link's own
    target is judged, lexically, without following anything.
    """
    try:
        target = os.readlink(link)
    except (OSError, IOError):
        return None
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    return None if is_within(resolved, sysfs_root) else resolved


def go_atoi(text):
    """Go's ``strconv.Atoi``: optional sign, ASCII digits, int64 range; ValueError otherwise."""
    if not _GO_ATOI_RE.match(text):
        raise ValueError("invalid syntax")
    value = int(text, 10)
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ValueError("value out of range")
    return value


def framebuffer_from_profile_name(name):
    """hypeman's ``framebufferFromProfileName``: GiB between the last ``-`` and the series letter.

    ``NVIDIA L40S-12Q`` -> 12288; ``NVIDIA A100-1-5C`` -> 5120; 0 when it
    cannot be parsed (0Q/0B profiles parse as 0 too).
    """
    series = max(name.rfind(letter) for letter in "ABCQ")
    if series <= 0:
        return 0
    dash = name.rfind("-", 0, series)
    if dash < 0:
        return 0
    try:
        return go_atoi(name[dash + 1:series]) * 1024
    except ValueError:
        return 0


def parse_creatable(text):
    """Parse ``nvidia/creatable_vgpu_types`` like hypeman's ``parseCreatableVGPUTypes``.

    Blank lines and the ``ID : vGPU Name`` header are skipped; every other line
    splits at the first ``:`` into a decimal id and a non-empty name (padding
    tolerated). Returns ``[{"id": "1147", "name": ..., "framebuffer_mb": ...}]``
    (empty when only the header remains); raises ``ValueError`` with hypeman's
    message for a bad line.
    """
    profiles = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line:
            continue
        type_id, found, name = line.partition(":")
        type_id, name = type_id.strip(), name.strip()
        if type_id == "ID":
            continue
        if not found or not name:
            raise ValueError("parse creatable vGPU types line %d: %s" % (number, _go_quote(line)))
        try:
            go_atoi(type_id)
        except ValueError as err:
            raise ValueError('parse vGPU type ID %s: strconv.Atoi: parsing %s: %s'
                             % (_go_quote(type_id), _go_quote(type_id), err))
        profiles.append({"id": type_id, "name": name, "framebuffer_mb": framebuffer_from_profile_name(name)})
    return profiles


def _go_quote(text):
    """Go's ``%q`` of a sysfs value, cut to ``_QUOTE_LIMIT`` characters (a bad attribute can be a page of garbage).

    The value was decoded with ``surrogateescape``: a byte that is not UTF-8 is
    quoted as Go quotes it in a Go string read from the file, ``\\xff``.
    """
    if len(text) > _QUOTE_LIMIT:
        text = text[:_QUOTE_LIMIT] + "..."
    out = []
    for piece in _RAW_BYTE_RE.split(text):
        if len(piece) == 1 and _RAW_BYTE_RE.match(piece):
            out.append("\\x%02x" % (ord(piece) - 0xDC00))
        elif piece:
            out.append(go_quote(piece)[1:-1])
    return '"%s"' % "".join(out)


# A byte surrogateescape could not decode (U+DC80..U+DCFF stand for the bytes 0x80..0xff).
_RAW_BYTE_RE = re.compile("([\udc80-\udcff])")


def read_current_type(path):
    """hypeman's ``readCurrentVGPUType``: trimmed text that must be an integer."""
    value = read_attribute(path).strip()
    try:
        go_atoi(value)
    except ValueError:
        raise ValueError("invalid current vGPU type %s" % _go_quote(value))
    return value


def read_link_basename(path):
    """Basename of a symlink's target, or None when it is not a readable link."""
    try:
        return os.path.basename(os.readlink(path))
    except (OSError, IOError):
        return None


def _listdir(path):
    """Sorted entries (Go's ReadDir order); [] when the directory is missing."""
    try:
        return sorted(os.listdir(path))
    except (OSError, IOError) as err:
        if _is_enoent(err):
            return []
        raise


class Discovery(object):
    """What a discovery pass saw.

    ``framework`` is ``vendor-vfio``, ``mdev`` or ``none``; ``vfs`` the readable
    VFs sorted by address; ``unreadable`` the VFs hypeman would skip
    (``{address, path, error}``); ``error`` is set when VFs exist but none can
    be read (hypeman's discovery fails then; placement must not guess);
    ``warnings`` are notes for the operator.
    """

    def __init__(self, framework):
        self.framework = framework
        self.vfs = []
        self.unreadable = []
        self.error = None
        self.warnings = []
        self.mdev_profiles = []

    def vf_map(self):
        return dict((vf["address"], vf) for vf in self.vfs)


def detect_framework(sysfs_root):
    """hypeman's ``DetectVGPUFramework``: mdev first, then vendor-VFIO, else none.

    Returns ``(framework, warnings)``. mdev when ``class/mdev_bus`` lists any
    entry; vendor-VFIO when any ``bus/pci/devices/*/nvidia/creatable_vgpu_types``
    exists (or cannot be checked: an unreadable VF is still a VF).
    """
    warnings = []
    try:
        if _listdir(os.path.join(sysfs_root, "class", "mdev_bus")):
            return FRAMEWORK_MDEV, warnings
    except (OSError, IOError) as err:
        # hypeman treats an unreadable mdev_bus as "no mdev" and moves on.
        warnings.append("cannot read %s: %s" % (os.path.join(sysfs_root, "class", "mdev_bus"), _err_text(err)))
    for name in _pci_entries(sysfs_root):
        if _creatable_state(sysfs_root, name) != "absent":
            return FRAMEWORK_VENDOR_VFIO, warnings
    return FRAMEWORK_NONE, warnings


def _listed(path, what):
    """:func:`_listdir`, failing as a VgpuError that names ``what`` and the directory."""
    try:
        return _listdir(path)
    except (OSError, IOError) as err:
        raise VgpuError("read %s: cannot list %s: %s" % (what, path, _err_text(err)))


def _pci_entries(sysfs_root):
    return _listed(pci_devices_dir(sysfs_root), "PCI devices")


def _creatable_state(sysfs_root, name):
    try:
        os.stat("%s/bus/pci/devices/%s/nvidia/creatable_vgpu_types" % (sysfs_root, name))
        return "present"
    except (OSError, IOError) as err:
        return "absent" if _is_enoent(err) else err


def discover(sysfs_root, read_creatable=True):
    """Discover the host's VFs as hypeman does; see :class:`Discovery`.

    vendor-VFIO VF dicts: ``address, parent, current_type`` (hypeman's trimmed
    text), ``allocated`` (``current_type != "0"``), ``creatable`` (parsed
    list, or None with ``creatable_error`` when unreadable or garbage).
    mdev VF dicts: ``address, parent, allocated`` (an mdev exists),
    ``mdev_uuids``, ``current_type`` (the mdev type dir name or None) and
    ``creatable`` (types with ``available_instances`` >= 1).
    """
    framework, warnings = detect_framework(sysfs_root)
    result = Discovery(framework)
    result.warnings.extend(warnings)
    if not os.path.isdir(pci_devices_dir(sysfs_root)):
        result.warnings.append("%s does not exist: no PCI devices to discover" % pci_devices_dir(sysfs_root))
    if framework == FRAMEWORK_VENDOR_VFIO:
        _discover_vendor_vfio(sysfs_root, result, read_creatable)
    elif framework == FRAMEWORK_MDEV:
        _discover_mdev(sysfs_root, result)
    return result


def _discover_vendor_vfio(sysfs_root, result, read_creatable):
    base = pci_devices_dir(sysfs_root) + "/"
    parsed = {}  # creatable text -> parsed list: sibling VFs mostly list the same types
    for name in _pci_entries(sysfs_root):
        vf_path = base + name
        state = _creatable_state(sysfs_root, name)
        if state == "absent":
            continue
        address = canonical_address(name)
        parent = read_link_basename(vf_path + "/physfn")
        parent = canonical_address(parent) if parent else None
        escape = link_escape(sysfs_root, vf_path)
        where = vf_path
        if not escape and os.path.islink(vf_path + "/nvidia"):
            # The driver's attribute directory, never a link on a real host; read_attribute
            # refuses a link only in the last component, so one out of the root is refused here.
            where = vf_path + "/nvidia"
            escape = real_escape(where, [sysfs_root])
        if escape:
            result.unreadable.append({"address": address, "parent": parent, "path": where,
                                      "error": "VF %s: %s is a symlink to %s, outside %s; refused" % (
                                          name, where, escape, sysfs_root)})
            continue
        if state != "present":
            result.unreadable.append({"address": address, "parent": parent,
                                      "path": vf_path + "/nvidia/creatable_vgpu_types",
                                      "error": "stat creatable vGPU types for VF %s: %s" % (name, _err_text(state))})
            continue
        current_path = vf_path + "/nvidia/current_vgpu_type"
        try:
            current = read_current_type(current_path)
        except (OSError, IOError, ValueError) as err:
            result.unreadable.append({"address": address, "parent": parent, "path": current_path,
                                      "error": "read current vGPU type for VF %s: %s" % (name, _err_text(err))})
            continue
        vf = {"address": address, "parent": parent, "current_type": current, "allocated": current != "0",
              "creatable": None, "creatable_error": None, "mdev_uuids": []}
        if read_creatable:
            try:
                text = read_attribute(vf_path + "/nvidia/creatable_vgpu_types")
                if text not in parsed:
                    try:
                        parsed[text] = parse_creatable(text)
                    except ValueError as err:
                        parsed[text] = err
                if isinstance(parsed[text], ValueError):
                    raise parsed[text]
                vf["creatable"] = parsed[text]
            except (OSError, IOError, ValueError) as err:
                # hypeman skips such a VF's profiles with a warning; the VF still counts.
                vf["creatable_error"] = "read creatable vGPU types for VF %s: %s" % (name, _err_text(err))
        result.vfs.append(vf)
    result.vfs.sort(key=lambda vf: vf["address"])
    if result.unreadable and not result.vfs:
        result.error = "vGPU discovery failed, no VF is readable: " + "; ".join(
            entry["error"] for entry in result.unreadable)


def list_mdevs(sysfs_root):
    """hypeman's ``ListMdevDevices``: ``[{uuid, vf, type}]`` from ``bus/mdev/devices``."""
    base = os.path.join(sysfs_root, "bus", "mdev", "devices")
    mdevs = []
    for uuid in _listed(base, "mdev devices"):
        mdev_type = read_link_basename(os.path.join(base, uuid, "mdev_type"))
        if mdev_type is None:
            continue
        try:
            target = os.readlink(os.path.join(base, uuid))
        except (OSError, IOError):
            continue
        mdevs.append({"uuid": uuid, "vf": _vf_of_mdev_link(target, uuid), "type": mdev_type})
    return mdevs


def _vf_of_mdev_link(target, uuid):
    """The VF in the target of ``bus/mdev/devices/<uuid>`` (``.../<vf>/<uuid>``), or None.

    Any PCI domain: a VF in domain 0001 holds its mdevs like one in 0000 does.
    """
    parts = target.split("/")
    for index, part in enumerate(parts):
        if index + 1 < len(parts) and parts[index + 1] == uuid and address_or_none(part):
            return canonical_address(part)
    return None


def mdev_vf(sysfs_root, uuid):
    """The VF carrying the mdev ``uuid`` (from its ``bus/mdev/devices`` link), or None when there is none."""
    if not isinstance(uuid, str) or not uuid or "/" in uuid or uuid in (".", ".."):
        return None
    try:
        target = os.readlink(os.path.join(sysfs_root, "bus", "mdev", "devices", uuid))
    except (OSError, ValueError):  # ValueError: a NUL byte (a log line may carry anything)
        return None
    return _vf_of_mdev_link(target, uuid)


def _discover_mdev(sysfs_root, result):
    bus = os.path.join(sysfs_root, "class", "mdev_bus")
    mdevs = list_mdevs(sysfs_root)
    by_vf = {}
    for mdev in mdevs:
        by_vf.setdefault(mdev["vf"], []).append(mdev)
    names = []
    for name in _listed(bus, "mdev VFs"):
        escape = link_escape(sysfs_root, os.path.join(bus, name))
        if escape:
            result.warnings.append("skipping mdev VF %s: %s is a symlink to %s, outside %s" % (
                name, os.path.join(bus, name), escape, sysfs_root))
        else:
            names.append(name)
    for name in names:
        address = canonical_address(name)
        parent = read_link_basename(os.path.join(pci_devices_dir(sysfs_root), name, "physfn"))
        held = by_vf.get(address, [])
        creatable = []
        types_dir = os.path.join(bus, name, "mdev_supported_types")
        for type_name in _safe_listdir(types_dir):
            try:
                available = go_atoi(read_attribute(os.path.join(types_dir, type_name, "available_instances")).strip())
                profile = read_attribute(os.path.join(types_dir, type_name, "name")).strip()
            except (OSError, IOError, ValueError):
                continue
            if available >= 1:
                creatable.append({"id": type_name, "name": profile, "available": available,
                                  "framebuffer_mb": _mdev_framebuffer(os.path.join(types_dir, type_name))})
        result.vfs.append({"address": address, "parent": canonical_address(parent) if parent else None,
                           "current_type": held[0]["type"] if held else None, "allocated": bool(held),
                           "mdev_uuids": [m["uuid"] for m in held], "creatable": creatable,
                           "creatable_error": None})
    # Profiles come from the first VF's supported types (hypeman's loadProfileMetadata).
    if names:
        types_dir = os.path.join(bus, names[0], "mdev_supported_types")
        for type_name in _safe_listdir(types_dir):
            if not os.path.isdir(os.path.join(types_dir, type_name)):
                continue
            try:
                profile = read_attribute(os.path.join(types_dir, type_name, "name")).strip()
            except (OSError, IOError):
                continue
            result.mdev_profiles.append({"id": type_name, "name": profile,
                                         "framebuffer_mb": _mdev_framebuffer(os.path.join(types_dir, type_name))})


def mdev_available(vf, type_name):
    """An mdev VF's ``available_instances`` for a type (0 when it cannot create it), from a
    :func:`discover` VF entry (its ``creatable`` list)."""
    for prof in vf.get("creatable") or []:
        if prof["id"] == type_name:
            return prof.get("available", 1)
    return 0


def _safe_listdir(path):
    try:
        return _listdir(path)
    except (OSError, IOError):
        return []


def _mdev_framebuffer(type_dir):
    """hypeman's ``parseFramebufferFromDescription``: ``framebuffer=<N>M`` in MB, else 0."""
    try:
        desc = read_attribute(os.path.join(type_dir, "description"))
    except (OSError, IOError):
        return 0
    match = _FRAMEBUFFER_RE.search(desc)
    if match:
        try:
            return go_atoi(match.group(1))
        except ValueError:
            return 0
    return 0


def _read_field(path, errors, parse):
    try:
        return parse(read_attribute(path).strip())
    except (OSError, IOError) as err:
        if not _is_enoent(err):
            errors.append("%s: %s" % (path, _err_text(err)))
        return None
    except ValueError as err:
        errors.append("%s: %s" % (path, err))
        return None


def _hex_id(text):
    text = text.lower()
    text = text[2:] if text.startswith("0x") else text
    if not text or any(c not in "0123456789abcdef" for c in text):
        raise ValueError("not a hex id: %s" % _go_quote(text))
    return text


def read_parent(sysfs_root, address):
    """SR-IOV facts of a parent GPU.

    ``{address, exists, vendor_id, device_id, class_id, sriov_totalvfs,
    sriov_numvfs, virtfns: [{index, address}], errors}``. A missing file
    gives None (the device may not be SR-IOV capable); an unreadable one
    gives None plus an ``errors`` entry.
    """
    path = os.path.join(pci_devices_dir(sysfs_root), address)
    info = {"address": address, "exists": os.path.isdir(path), "vendor_id": None, "device_id": None,
            "class_id": None, "sriov_totalvfs": None, "sriov_numvfs": None, "virtfns": [], "errors": []}
    escape = link_escape(sysfs_root, path)
    if escape:
        info["errors"].append("%s is a symlink to %s, outside %s; refused" % (path, escape, sysfs_root))
        return info
    if not info["exists"]:
        if os.path.lexists(path):
            info["errors"].append("%s: link target missing" % path)
        else:
            info["errors"].append("%s: no such device" % path)
        return info
    errors = info["errors"]
    info["vendor_id"] = _read_field(os.path.join(path, "vendor"), errors, _hex_id)
    info["device_id"] = _read_field(os.path.join(path, "device"), errors, _hex_id)
    info["class_id"] = _read_field(os.path.join(path, "class"), errors, _hex_id)
    info["sriov_totalvfs"] = _read_field(os.path.join(path, "sriov_totalvfs"), errors, go_atoi)
    info["sriov_numvfs"] = _read_field(os.path.join(path, "sriov_numvfs"), errors, go_atoi)
    try:
        names = _listdir(path)
    except (OSError, IOError) as err:
        errors.append("%s: %s" % (path, _err_text(err)))
        names = []
    virtfns = []
    for name in names:
        match = _VIRTFN_RE.match(name)
        if not match:
            continue
        target = read_link_basename(os.path.join(path, name))
        if target is None:
            errors.append("%s: not a readable link" % os.path.join(path, name))
            continue
        virtfns.append({"index": int(match.group(1)), "address": canonical_address(target)})
    info["virtfns"] = sorted(virtfns, key=lambda v: v["index"])
    return info


def list_sriov_gpus(sysfs_root):
    """Addresses of NVIDIA devices that are SR-IOV physical functions (have ``sriov_totalvfs``)."""
    gpus = []
    base = pci_devices_dir(sysfs_root)
    for name in _pci_entries(sysfs_root):
        path = os.path.join(base, name)
        if not os.path.exists(os.path.join(path, "sriov_totalvfs")):
            continue
        try:
            vendor = _hex_id(read_attribute(os.path.join(path, "vendor")).strip())
        except (OSError, IOError, ValueError):
            vendor = None  # unreadable: keep it, an operator must see it
        if vendor in (None, NVIDIA_VENDOR_ID):
            gpus.append(canonical_address(name))
    return gpus


def vfio_nodes(sysfs_root, dev_root, vf):
    """Device nodes a VMM holds open for a VF, as hypeman's in-use check derives them.

    ``<dev_root>/vfio/devices/<vfioN>`` for each ``vfio-dev`` entry and
    ``<dev_root>/vfio/<iommu group>``. Returns ``(paths, errors)``; a missing
    entry is not an error, an unreadable one is.
    """
    paths, errors = [], []
    vf_path = "%s/bus/pci/devices/%s/" % (sysfs_root, vf)
    vfio = dev_root.rstrip("/") + "/vfio/"
    try:
        for name in _listdir(vf_path + "vfio-dev"):
            paths.append(vfio + "devices/" + name)
    except (OSError, IOError) as err:
        errors.append("read VFIO devices for VF %s: %s" % (vf, _err_text(err)))
    try:
        group = os.readlink(vf_path + "iommu_group").rsplit("/", 1)[-1]
        paths.append(vfio + group)
    except (OSError, IOError) as err:
        if not _is_enoent(err):
            errors.append("read IOMMU group for VF %s: %s" % (vf, _err_text(err)))
    return paths, errors


def parent_of(sysfs_root, vf):
    """Parent GPU of a VF via its ``physfn`` link (normalised), or None."""
    parent = read_link_basename(os.path.join(pci_devices_dir(sysfs_root), vf, "physfn"))
    return canonical_address(parent) if parent else None


def mdev_vfs(sysfs_root):
    """mdev UUID -> the VF address that carries it (None when unknown), from ``bus/mdev/devices``."""
    return dict((mdev["uuid"], mdev["vf"]) for mdev in list_mdevs(sysfs_root))
