# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's host layout: config file, data dir, instances, VMM liveness (stdlib only).

The API client lives in ``_api``: modules import it themselves, inside the
branch that runs when an API URL is given, so that the modules that never
talk to the API do not ship ``ansible.module_utils.urls`` at all.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _proc
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import (
    HostFileError, read_bytes, read_bytes_within, real_escape)
from ansible_collections.hypeman.vgpu.plugins.module_utils._govalues import go_fold
from ansible_collections.hypeman.vgpu.plugins.module_utils._pci import address_or_none

DEFAULT_QUARANTINE_THRESHOLD = 2  # hypeman's defaultVFQuarantineThreshold
# hypeman's config and an instance's metadata are a few KiB; anything past these caps is not theirs.
CONFIG_LIMIT = 1024 * 1024
METADATA_LIMIT = 1024 * 1024
_INT64 = (-(1 << 63), (1 << 63) - 1)
_UINT64 = (0, (1 << 64) - 1)

_KEY_RE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_.-]+)\s*:\s*(?P<value>.*?)\s*$")
_FLOW_RE = re.compile(r"(?:^|[{,])\s*vf_quarantine_threshold\s*:\s*(?P<value>[^,}]*)")


def _strip_comment(line):
    # A '#' starts a comment only at line start or after whitespace (YAML rule).
    for idx, char in enumerate(line):
        if char == "#" and (idx == 0 or line[idx - 1] in " \t"):
            return line[:idx]
    return line


def _scalar(text):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text


def parse_quarantine_threshold(text, source="config"):
    """Return ``gpu.vf_quarantine_threshold`` from hypeman YAML text, or None.

    hypeman's config is plain block YAML; this reads the one key we need
    without a YAML library (modules run on the host with the stdlib only).
    """
    in_gpu = False
    gpu_indent = 0
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        if not line.strip():
            continue
        match = _KEY_RE.match(line)
        if not match:
            continue
        indent = len(match.group("indent").expandtabs())
        key, value = match.group("key"), match.group("value")
        if in_gpu and indent <= gpu_indent:
            in_gpu = False
        if not in_gpu and key == "gpu" and indent == 0:
            if value.startswith("{"):
                flow = _FLOW_RE.search(value)
                return _threshold_value(_scalar(flow.group("value")), source) if flow else None
            in_gpu, gpu_indent = True, indent
            continue
        if in_gpu and key == "vf_quarantine_threshold":
            return _threshold_value(_scalar(value), source)
    return None


def _threshold_value(text, source):
    try:
        value = int(text, 10)
    except ValueError:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise VgpuError(
            "%s: gpu.vf_quarantine_threshold is %r; expected a whole number >= 1" % (source, shown)
        )
    if value < 1:
        raise VgpuError(
            "%s: gpu.vf_quarantine_threshold is %d; expected a whole number >= 1 "
            "(a threshold below 1 would quarantine every VF with a record)" % (source, value)
        )
    return value


def read_quarantine_threshold(config_path):
    """The threshold hypeman uses: the config key, else hypeman's default 2.

    A missing config file means defaults, exactly as for hypeman. Returns
    ``(threshold, source)`` where source says where the value came from.
    A config that is not a regular file, is over :data:`CONFIG_LIMIT` or is
    not UTF-8 (hypeman's YAML parser refuses it too) fails closed: the
    threshold it holds cannot be known.
    """
    try:
        # /etc is root's: a symlinked config is followed, as hypeman does.
        data = read_bytes(config_path, limit=CONFIG_LIMIT)
    except (IOError, OSError) as err:
        if err.errno == errno.ENOENT:
            return DEFAULT_QUARANTINE_THRESHOLD, "default"
        raise VgpuError("cannot read hypeman config %s: %s" % (config_path, err.strerror or err))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise VgpuError("hypeman config %s is not UTF-8 text (byte 0x%02x at offset %d); expected hypeman's YAML "
                        "config, which hypeman cannot parse either" % (config_path, data[err.start], err.start))
    value = parse_quarantine_threshold(text, source=config_path)
    if value is None:
        return DEFAULT_QUARANTINE_THRESHOLD, "default"
    return value, config_path


def resolve_threshold(explicit, config_path):
    """An explicit module threshold wins; it must be >= 1 like the config's."""
    if explicit is not None:
        if explicit < 1:
            raise VgpuError("threshold is %d; expected a whole number >= 1" % explicit)
        return explicit, "option"
    return read_quarantine_threshold(config_path)


# --- the running hypeman ---------------------------------------------------------
#
# hypeman loads the VF health store only at start and rewrites it from memory at
# its next report (docs/hypeman-interface.md §1.8), so an external edit made while it runs is lost
# unless hypeman is restarted.

HYPEMAN_PROCESS_NAMES = ("hypeman-api", "hypeman")


def hypeman_processes(proc_root):
    """``(processes, None)`` with the running hypeman processes (``[{pid, comm, cmdline}]``),
    or ``(None, error)`` when ``proc_root`` could not be read."""
    try:
        return _proc.find_processes(proc_root, HYPEMAN_PROCESS_NAMES), None
    except VgpuError as err:
        return None, err.msg


def warn_if_store_edited_while_running(module, proc_root, changed):
    """Warn when this task changed the store (or, in check mode, would) while hypeman runs,
    or when that cannot be told. Returns the hypeman processes, None when that cannot be told."""
    processes, error = hypeman_processes(proc_root)
    if error:
        module.warn("could not tell whether hypeman is running: %s" % error)
    elif processes and changed:
        pids = ", ".join(str(p["pid"]) for p in processes)
        if module.check_mode:
            module.warn("hypeman is running (pid %s): it keeps the store in memory and overwrites the "
                        "file on its next report. Stop hypeman before this edit and start it after." % pids)
        else:
            module.warn("hypeman is running (pid %s): restart it now (systemctl restart hypeman) so it "
                        "loads this edit; its next report would otherwise overwrite the file from memory." % pids)
    return processes


# --- data dir layout -----------------------------------------------------------
#
# Instances live in <data_dir>/guests/<id>/metadata.json (docs/hypeman-interface.md §3). The
# metadata is hypeman's StoredMetadata marshalled without JSON tags, so keys
# are Go field names. Two builds differ in the claim-time key: GPUClaimedAt
# (claim variant) or GPUAssignedAt plus GPURetainedForCleanup (assignment
# variant); both are read.

CLAIM_FIELDS = ("GPUClaimedAt", "GPUAssignedAt")
_STRING_FIELDS = ("Id", "Name", "HypervisorType", "GPUProfile", "GPUFramework", "GPUDevicePath",
                  "GPUMdevUUID", "SocketPath", "HypervisorBootID")
# The StoredMetadata fields this collection reads, by Go's folded key: json.Unmarshal matches
# a key to a field case-insensitively ("GpuDevicePath" is GPUDevicePath), the last one winning.
_FIELDS_BY_FOLD = dict((go_fold(name), name) for name in _STRING_FIELDS + CLAIM_FIELDS + (
    "HypervisorPID", "HypervisorStartTime", "GPURetainedForCleanup"))


def guests_dir(data_dir):
    return os.path.join(data_dir, "guests")


def instance_dir(data_dir, instance_id):
    return os.path.join(guests_dir(data_dir), instance_id)


def instance_log_dir(data_dir, instance_id):
    """``<data_dir>/guests/<id>/logs`` (app.log, vmm.log, hypeman.log)."""
    return os.path.join(instance_dir(data_dir, instance_id), "logs")


@functools.lru_cache(maxsize=4096)
def render_claim_time(text):
    """A claim time as hypeman writes ``assigned_at``: parsed like Go, shown in UTC RFC3339Nano.

    Raises ValueError (Go's "parsing time ..." text) when Go could not parse it.
    """
    return _gotime.format_utc_rfc3339nano(_gotime.parse_rfc3339(text))


def _reject_constant(name):
    raise ValueError("invalid JSON value %s" % name)


def _go_int(meta, key, unsigned=False):
    """A Go int / uint64 field: JSON null keeps the zero value; fractions and overflow fail like Go."""
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("%s: cannot unmarshal %s into an integer" % (key, type(value).__name__))
    if unsigned and value < 0:
        raise ValueError("%s: cannot unmarshal negative number into uint64" % key)
    low, high = _UINT64 if unsigned else _INT64
    if not low <= value <= high:
        raise ValueError("%s: number %d overflows %s" % (key, value, "uint64" if unsigned else "int64"))
    return value


def parse_metadata(text):
    """Decode metadata JSON the way Go's ``json.Unmarshal`` into StoredMetadata would.

    Returns the dict; raises ValueError when hypeman could not load the file
    either (not JSON, not an object, a field of the wrong type, an
    unparseable claim time, JSON nested deeper than Python's parser goes).
    """
    objects = []

    def keep_pairs(pairs):
        objects.append(pairs)  # the outermost object comes last
        return dict(pairs)

    try:
        meta = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=keep_pairs)
    except RecursionError:
        raise ValueError("JSON nested too deeply")
    if not isinstance(meta, dict):
        raise ValueError("metadata is not a JSON object")
    meta = {}
    for key, value in objects[-1]:
        meta[_FIELDS_BY_FOLD.get(go_fold(key), key)] = value
    for key in _STRING_FIELDS:
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise ValueError("%s: cannot unmarshal %s into a string" % (key, type(meta[key]).__name__))
    _go_int(meta, "HypervisorPID")
    _go_int(meta, "HypervisorStartTime", unsigned=True)
    if meta.get("GPURetainedForCleanup") is not None and not isinstance(meta["GPURetainedForCleanup"], bool):
        raise ValueError("GPURetainedForCleanup: cannot unmarshal into a bool")
    for key in CLAIM_FIELDS:
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValueError("%s: cannot unmarshal %s into a time" % (key, type(value).__name__))
        render_claim_time(value)  # ValueError carries Go's "parsing time ..." text
    return meta


def _pci_basename(device_path):
    """Normalised VF address from a ``GPUDevicePath`` basename, or None when it is not one."""
    if not device_path:
        return None
    return address_or_none(os.path.basename(device_path.rstrip("/")))


def device_path_vf(device_path, vf_of_mdev):
    """The VF a hypeman device path names, or None: the one rule for metadata and log lines.

    vendor-VFIO: the path's basename is the VF's PCI address
    (``/sys/bus/pci/devices/<vf>``). mdev: the basename is the mdev's UUID
    (``/sys/bus/mdev/devices/<uuid>``, docs/hypeman-interface.md §3.2) and the
    VF is the one carrying it. ``vf_of_mdev``: mdev UUID -> VF address or None
    (e.g. ``dict.get``, or :func:`_sysfs.mdev_vf` for one UUID).
    """
    vf = _pci_basename(device_path)
    if vf or not device_path:
        return vf
    uuid = os.path.basename(device_path.rstrip("/"))
    return (vf_of_mdev(uuid) or None) if uuid else None


def instance_vf(inst, vf_of_mdev):
    """The VF an instance's metadata names, or None: the one rule every module uses.

    The VF carrying the mdev named by ``GPUMdevUUID`` when there is one, else
    what ``GPUDevicePath`` names (:func:`device_path_vf`), so mdev metadata with
    an empty ``GPUMdevUUID`` still names its VF.
    ``vf_of_mdev``: mdev UUID -> VF address or None (e.g. ``dict.get``).
    """
    if inst.get("vf_address"):
        return inst["vf_address"]
    vf = vf_of_mdev(inst["mdev_uuid"]) if inst.get("mdev_uuid") else None
    return vf or device_path_vf(inst.get("device_path"), vf_of_mdev)


def instance_from_metadata(meta, metadata_path):
    """The instance dict other helpers rely on (see :func:`list_instances`)."""
    claim_field = None
    claim_value = None
    for key in CLAIM_FIELDS:
        if key in meta:
            if claim_field is None or (claim_value is None and meta[key] is not None):
                claim_field, claim_value = key, meta[key]
    assigned_at = None
    if claim_value is not None:
        assigned_at = render_claim_time(claim_value)
    device_path = meta.get("GPUDevicePath") or ""
    return {
        "id": meta.get("Id") or "",
        "name": meta.get("Name") or "",
        "hypervisor_type": meta.get("HypervisorType") or None,
        "profile": meta.get("GPUProfile") or None,
        "framework": meta.get("GPUFramework") or None,
        "device_path": device_path or None,
        "vf_address": _pci_basename(device_path),
        "mdev_uuid": meta.get("GPUMdevUUID") or None,
        "assigned_at": assigned_at,
        "claim_field": claim_field,
        "retained_for_cleanup": bool(meta.get("GPURetainedForCleanup")),
        "metadata_path": metadata_path,
        "dir": os.path.dirname(metadata_path),
        "pid": meta.get("HypervisorPID"),
        "start_time": meta.get("HypervisorStartTime") or 0,
        "boot_id": meta.get("HypervisorBootID") or "",
        "socket_path": meta.get("SocketPath") or None,
    }


def _is_real_dir(entry):
    """A directory that is not a symlink (what ``isdir(p) and not islink(p)`` says, from a DirEntry)."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _escaping_link(entry, roots):
    """Where a symlinked guest directory really leads when that is outside ``roots``, else None."""
    try:
        if not entry.is_symlink():
            return None
    except OSError:
        return None
    return real_escape(entry.path, roots)


def read_metadata_bytes(data_dir, path):
    """The bytes of an instance's ``metadata.json`` under ``data_dir``, as :func:`list_instances` reads them.

    Never waits on a FIFO, reads at most :data:`METADATA_LIMIT`, and follows a
    symlink only when it stays inside ``data_dir``; OSError otherwise.
    """
    return read_bytes_within(path, (data_dir, guests_dir(data_dir)), METADATA_LIMIT)


def read_instance_metadata(data_dir, instance_id):
    """``(metadata, path)`` of one instance by id; OSError when unreadable, ValueError when hypeman could not load it.

    A guest directory that is a symlink is refused, as hypeman does not list it.
    """
    directory = instance_dir(data_dir, instance_id)
    if os.path.islink(directory):
        raise HostFileError(errno.ELOOP, "is a symlink, which hypeman does not list as an instance", directory)
    path = os.path.join(directory, "metadata.json")
    return parse_metadata(read_metadata_bytes(data_dir, path).decode("utf-8", "replace")), path


def list_instances(data_dir, proc_root=None):
    """Every instance under ``<data_dir>/guests``, plus what could not be read.

    Returns ``(instances, unreadable)``. Like hypeman's listing, entries that
    are not directories and directories without ``metadata.json`` are not
    instances. Metadata hypeman could not load (unreadable, not JSON, wrong
    field types) goes to ``unreadable`` as ``{instance_id, path, error}`` --
    never silently skipped: hypeman's reconcile fails closed on it.

    Symlinks: a guest directory that is a symlink is not an instance (as
    for hypeman), but one leading out of ``data_dir`` is listed in
    ``unreadable``; a ``metadata.json`` symlink is read only when its real
    target is inside ``data_dir`` (or the guests directory), else it is
    refused in ``unreadable``. Metadata over :data:`METADATA_LIMIT`, a FIFO
    or a device there is unreadable too, never waited on.

    Each instance: ``id, name, hypervisor_type, profile, framework,
    device_path, vf_address`` (normalised basename of ``GPUDevicePath``, None
    when it is not a PCI address), ``mdev_uuid, assigned_at`` (claim time in
    UTC RFC3339Nano as hypeman writes it into the store, or None),
    ``claim_field`` (``GPUClaimedAt``, ``GPUAssignedAt`` or None),
    ``retained_for_cleanup, metadata_path, dir, pid, start_time, boot_id,
    socket_path``; with ``proc_root`` also ``live`` (True, False, or None
    when ambiguous -- hypeman counts that as live) and ``live_reason``.
    A missing guests directory means no instances; an unreadable one fails.
    """
    base = guests_dir(data_dir)
    try:
        # scandir knows each entry's type from the directory listing: no stat per instance.
        entries = sorted(os.scandir(base), key=lambda entry: entry.name)
    except (IOError, OSError) as err:
        if err.errno == errno.ENOENT:
            return [], []
        raise VgpuError("read guests directory %s: %s" % (base, err.strerror or err))
    instances, unreadable = [], []
    roots = (data_dir, base)
    for entry in entries:
        name = entry.name
        if not _is_real_dir(entry):
            escape = _escaping_link(entry, roots)
            if escape:
                unreadable.append({"instance_id": name, "path": entry.path,
                                   "error": "guest directory is a symlink to %s, outside %s; refused" % (
                                       escape, data_dir)})
            continue
        path = os.path.join(base, name, "metadata.json")
        try:
            data = read_metadata_bytes(data_dir, path)
        except (IOError, OSError) as err:
            if err.errno == errno.ENOENT:
                continue
            unreadable.append({"instance_id": name, "path": path, "error": "read metadata: %s" % (err.strerror or err)})
            continue
        try:
            meta = parse_metadata(data.decode("utf-8", "replace"))
        except ValueError as err:
            unreadable.append({"instance_id": name, "path": path, "error": "unmarshal metadata: %s" % err})
            continue
        instances.append(instance_from_metadata(meta, path))
    if proc_root is not None:
        checker = LivenessChecker(proc_root)
        for inst in instances:
            inst["live"], inst["live_reason"] = checker.check(inst)
    return instances, unreadable


# --- liveness (docs/hypeman-interface.md §3.3; hypeman's resolveLiveHypervisorPID) ---


class _Ambiguous(Exception):
    """Socket ownership could not be confirmed: hypeman then counts the VMM as live."""


class _NoOwner(Exception):
    """Nobody holds the control-socket listener: proof the VMM is gone."""


_SO_ACCEPTCON = 0x10000


def _read_text(path):
    return _proc.read_proc_file(path).decode("utf-8", "replace")


class LivenessChecker(object):
    """Decides VMM liveness from ``proc_root`` exactly as hypeman does.

    Live when the recorded PID exists and is not a zombie and either its
    boot id and start time match (proof) or it, or another process, owns the
    instance's control-socket listener. A recorded boot id from another boot
    means the PID is stale. No listener means dead. An ownership check that
    cannot finish (unreadable /proc entries, several owners) is ambiguous:
    ``live`` None, which hypeman treats as live. /proc is read once per
    checker and cached.
    """

    def __init__(self, proc_root):
        self.proc_root = proc_root
        self._boot_id = None
        self._unix = None
        self._owners = None

    def boot_id(self):
        if self._boot_id is None:
            try:
                self._boot_id = _read_text(os.path.join(self.proc_root, "sys", "kernel", "random", "boot_id")).strip()
            except (IOError, OSError):
                self._boot_id = ""
        return self._boot_id

    def process_exists(self, pid):
        """hypeman's ProcessExists: a live, non-zombie process (unreadable state counts as live)."""
        if pid is None or pid <= 0:
            return False
        try:
            status = _read_text("%s/%d/status" % (self.proc_root, pid))
        except (IOError, OSError):
            # Read first, stat only when that fails: a process without a directory does not exist.
            return os.path.isdir("%s/%d" % (self.proc_root, pid))
        for line in status.splitlines():
            if line.startswith("State:"):
                fields = line.split()
                return len(fields) < 2 or fields[1] != "Z"
        return True

    def start_time(self, pid):
        """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot), 0 when unreadable."""
        try:
            data = _read_text("%s/%d/stat" % (self.proc_root, pid))
        except (IOError, OSError):
            return 0
        paren = data.rfind(")")
        if paren < 0:
            return 0
        fields = data[paren + 1:].split()
        if len(fields) <= 19:
            return 0
        return _proc.small_uint(fields[19]) or 0

    def _socket_ref(self, socket_path):
        if self._unix is None:
            self._unix = {}
            try:
                lines = _read_text(os.path.join(self.proc_root, "net", "unix")).splitlines()
            except (IOError, OSError) as err:
                self._unix = err
                lines = []
            for line in lines:
                fields = line.split()
                if len(fields) < 7 or fields[0] == "Num":
                    continue
                try:
                    flags = int(fields[3], 16)
                except ValueError:
                    continue
                if not flags & _SO_ACCEPTCON:
                    continue
                self._unix.setdefault(fields[-1], []).append(fields[6])
        if not isinstance(self._unix, dict):
            raise _Ambiguous("open /proc/net/unix: %s" % (self._unix.strerror or self._unix))
        inodes = self._unix.get(socket_path, [])
        if len(inodes) > 1:
            raise _Ambiguous("resolve process pid for socket %s: multiple socket inodes found" % socket_path)
        if not inodes:
            raise _NoOwner("socket %s has no listener in /proc/net/unix" % socket_path)
        return "socket:[%s]" % inodes[0]

    def _holds(self, pid, ref):
        fd_dir = os.path.join(self.proc_root, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except (IOError, OSError):
            return False
        for name in names:
            try:
                if os.readlink(os.path.join(fd_dir, name)).strip() == ref:
                    return True
            except (IOError, OSError):
                continue
        return False

    def _scan_owners(self):
        # One pass over every process's fds: socket ref -> pids, plus the
        # first scan error (an unreadable process hides a possible owner).
        if self._owners is None:
            owners, scan_error = {}, None
            try:
                entries = os.listdir(self.proc_root)
            except (IOError, OSError) as err:
                raise _Ambiguous("read /proc: %s" % (err.strerror or err))
            for entry in entries:
                if _proc.small_uint(entry) is None or not os.path.isdir(os.path.join(self.proc_root, entry)):
                    continue
                fd_dir = os.path.join(self.proc_root, entry, "fd")
                try:
                    fds = os.listdir(fd_dir)
                except (IOError, OSError) as err:
                    if err.errno not in (errno.ENOENT, errno.ESRCH):
                        scan_error = scan_error or "inspect process fds: %s: %s" % (fd_dir, err.strerror or err)
                    continue
                seen = set()
                for fd in fds:
                    try:
                        target = os.readlink(os.path.join(fd_dir, fd)).strip()
                    except (IOError, OSError) as err:
                        if err.errno not in (errno.ENOENT, errno.ESRCH):
                            scan_error = scan_error or "inspect process fds: %s: %s" % (fd_dir, err.strerror or err)
                        continue
                    if target.startswith("socket:[") and target not in seen:
                        seen.add(target)
                        owners.setdefault(target, []).append(int(entry))
            self._owners = (owners, scan_error)
        return self._owners

    def _resolve_socket(self, socket_path, owner_pid):
        ref = self._socket_ref(socket_path)
        if owner_pid and self._holds(owner_pid, ref):
            return owner_pid
        owners_by_ref, scan_error = self._scan_owners()
        owners = sorted(owners_by_ref.get(ref, []))
        if owner_pid and owner_pid in owners:
            return owner_pid
        if len(owners) == 1:
            return owners[0]
        if len(owners) > 1:
            raise _Ambiguous("resolve process pid for %s: multiple owning processes found: %s" % (ref, owners))
        if scan_error:
            raise _Ambiguous("resolve process pid for %s: %s" % (ref, scan_error))
        raise _NoOwner("no process holds the listener of %s" % socket_path)

    def check(self, inst):
        """``(live, reason)`` for an instance dict (``pid``, ``start_time``, ``boot_id``, ``socket_path``)."""
        pid, start_time, rec_boot, socket_path = inst.get("pid"), inst.get("start_time") or 0, \
            inst.get("boot_id") or "", inst.get("socket_path") or ""
        notes = []
        stored = 0
        if pid is not None:
            if self.process_exists(pid):
                stored = pid
            else:
                notes.append("recorded pid %d is gone or a zombie" % pid)
        boot = self.boot_id()
        if stored and rec_boot and boot and rec_boot != boot:
            notes.append("recorded pid %d is from a previous boot" % stored)
            stored = 0
        if stored and start_time and rec_boot and boot and rec_boot == boot:
            if self.start_time(stored) == start_time:
                return True, "hypervisor pid %d is alive (boot id and start time match)" % stored
            notes.append("pid %d was reused (start time differs)" % stored)
            stored = 0
        if not socket_path:
            if stored:
                return None, ("cannot confirm stored hypervisor pid %d without a socket path; "
                              "hypeman counts it as live" % stored)
            notes.append("no control socket recorded")
            return False, "; ".join(notes) if notes else "no hypervisor pid or socket recorded"
        try:
            owner = self._resolve_socket(socket_path, stored if (stored and not start_time) else 0)
        except _NoOwner as err:
            notes.append(str(err))
            return False, "; ".join(notes)
        except _Ambiguous as err:
            return None, "cannot confirm socket ownership (%s); hypeman counts it as live" % err
        if self.process_exists(owner):
            return True, "pid %d owns the control socket %s" % (owner, socket_path)
        notes.append("socket owner %d has exited" % owner)
        return False, "; ".join(notes)
