# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""This collection's append-only ledger of quarantines and clears (stdlib only).

``<state_dir>/ledger.jsonl``: one JSON object per line, appended with
``O_APPEND`` and fsynced, never rewritten. It lives beside our other state,
never inside hypeman's store (hypeman drops unknown keys on its next write).

Entry keys: ``time`` (UTC RFC 3339, nanoseconds), ``action`` (``quarantine``,
``clear``, ``repair``), ``trigger`` (``manual``, ``failure_threshold``,
``reevaluation``, ``success``, ``repair``), ``vf_address``, ``parent_gpu``,
``quarantined_at`` (the exact value written to the store, or null),
``reason``, ``user``, ``job_id``, ``run_id``.

Ownership: a VF's quarantine is *owned* when the ledger's latest entry for
that VF is our manual quarantine (``action: quarantine``, ``trigger:
manual``) and the store's ``quarantined_at`` is still the instant we wrote.
Quarantines that follow failure reports are logged too but never owned:
they are evidence of a wedged VF, not a drain.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import stat
import uuid

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import HostFileError, file_kind, read_bytes
from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _safedir

LEDGER_NAME = "ledger.jsonl"
STATE_DIR_MODE = 0o700  # missing state dirs (and missing parents) get exactly this, whatever the umask
LEDGER_MODE = 0o600

ACTIONS = ("quarantine", "clear", "repair")
TRIGGERS = ("manual", "failure_threshold", "reevaluation", "success", "repair")


def ledger_path(state_dir):
    return os.path.join(state_dir, LEDGER_NAME)


def default_user():
    """Who runs this on the host: SUDO_USER, else LOGNAME, else the effective user."""
    for name in ("SUDO_USER", "LOGNAME"):
        value = os.environ.get(name)
        if value:
            return value
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return "uid:%d" % os.geteuid()


def new_run_id():
    """An id shared by every entry one module run writes."""
    return uuid.uuid4().hex


def make_entry(action, vf_address, quarantined_at=None, reason=None, user=None, job_id=None, run_id=None,
               trigger="manual", parent_gpu=None, now=None):
    """A ledger entry dict; ``quarantined_at`` and ``now`` are GoTime values (or None)."""
    if action not in ACTIONS:
        raise ValueError("unknown ledger action %r" % (action,))
    if trigger not in TRIGGERS:
        raise ValueError("unknown ledger trigger %r" % (trigger,))
    return {
        "time": _gotime.format_rfc3339nano(now or _gotime.utc_now()),
        "action": action,
        "trigger": trigger,
        "vf_address": vf_address,
        "parent_gpu": parent_gpu,
        "quarantined_at": _gotime.format_rfc3339nano(quarantined_at) if quarantined_at is not None else None,
        "reason": reason,
        "user": user,
        "job_id": job_id,
        "run_id": run_id,
    }


def _state_dir_error(state_dir, err):
    if isinstance(err, HostFileError) and err.errno == errno.ELOOP:
        return VgpuError("refusing to use state directory %s: it is a symlink (this collection keeps its "
                         "ledger only in a real directory; point state_dir at it)" % state_dir, symlink=state_dir)
    return VgpuError("cannot create state directory %s: %s" % (err.filename or state_dir, err.strerror or err))


def open_state_dir(state_dir):
    """fd of ``state_dir``, created (with any missing parent) with exactly 0700; never a symlink."""
    try:
        return _safedir.open_dir(state_dir, STATE_DIR_MODE, follow_last=False)
    except OSError as err:
        raise _state_dir_error(state_dir, err)


def append_entries(state_dir, entries):
    """Append ``entries`` durably (one line each). Creates ``state_dir`` (0700)
    and the ledger (0600) when missing; never follows a symlinked state dir
    or ledger, and appends only to a regular file. Returns the ledger path."""
    path = ledger_path(state_dir)
    if not entries:
        return path
    dir_fd = open_state_dir(state_dir)
    try:
        _append(dir_fd, path, entries)
    finally:
        os.close(dir_fd)
    return path


def _append(dir_fd, path, entries):
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(LEDGER_NAME, flags, LEDGER_MODE, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise VgpuError("refusing to append to ledger %s: it is a symlink" % path, symlink=path)
        raise VgpuError("cannot open ledger %s: %s" % (path, err.strerror or err))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise VgpuError("refusing to append to ledger %s: it is %s, not a regular file"
                            % (path, file_kind(info.st_mode)), symlink=path)
        created = info.st_size == 0
        fcntl.flock(fd, fcntl.LOCK_EX)
        prefix = b""
        size = os.fstat(fd).st_size
        if size:
            # A torn last line (crash mid-append) must not swallow our first entry.
            if os.pread(fd, 1, size - 1) != b"\n":
                prefix = b"\n"
        for index, entry in enumerate(entries):
            line = json.dumps(entry, sort_keys=True, ensure_ascii=True).encode("ascii") + b"\n"
            if index == 0:
                line = prefix + line
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
        if created:
            os.fsync(dir_fd)  # a new ledger's directory entry must survive a crash too
    except OSError as err:
        raise VgpuError("cannot append to ledger %s: %s" % (path, err.strerror or err))
    finally:
        os.close(fd)


class Ledger(object):
    """What :func:`read_ledger` found: ``path``, ``exists``, ``entries`` (valid
    entries in file order, each with its ``line`` number) and ``problems``
    (``[{line, error}]`` for lines that are not valid entries)."""

    def __init__(self, path, exists, entries, problems):
        self.path = path
        self.exists = exists
        self.entries = entries
        self.problems = problems

    def latest_by_vf(self):
        latest = {}
        for entry in self.entries:
            if entry.get("vf_address"):
                latest[entry["vf_address"]] = entry
        return latest

    def vfs_for_parent(self, parent_gpu):
        """Sorted VF addresses any entry recorded for ``parent_gpu``."""
        return sorted(set(entry["vf_address"] for entry in self.entries
                          if entry.get("vf_address") and entry.get("parent_gpu") == parent_gpu))

    def recent(self, count):
        return self.entries[-count:] if count > 0 else []


# About 200,000 entries; a ledger that big should be rotated, not read into memory.
LEDGER_READ_LIMIT = 64 * 1024 * 1024


def read_ledger(state_dir):
    """Read the ledger; a missing file is empty. A corrupt line is reported in
    ``problems`` and skipped; an unreadable ledger raises VgpuError (ownership
    cannot be decided without it), and so does a symlinked state dir or
    ledger, or one that is not a regular file."""
    path = ledger_path(state_dir)
    try:
        is_link = stat.S_ISLNK(os.lstat(state_dir).st_mode)
    except OSError:
        is_link = False  # missing: an empty ledger, as below
    if is_link:
        raise _state_dir_error(state_dir, HostFileError(errno.ELOOP, "is a symlink", state_dir))
    try:
        data = read_bytes(path, LEDGER_READ_LIMIT, follow=False)
    except OSError as err:
        if err.errno == errno.ENOENT and not isinstance(err, HostFileError):
            return Ledger(path, False, [], [])
        raise VgpuError("cannot read ledger %s: %s" % (path, err.strerror or err))
    entries, problems = [], []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            problems.append({"line": number, "error": "not JSON: %s" % err})
            continue
        error = _entry_error(entry)
        if error:
            problems.append({"line": number, "error": error})
            continue
        entry["line"] = number
        entries.append(entry)
    return Ledger(path, True, entries, problems)


def _entry_error(entry):
    if not isinstance(entry, dict):
        return "not a JSON object"
    if entry.get("action") not in ACTIONS:
        return "unknown action %r" % (entry.get("action"),)
    for key in ("vf_address", "quarantined_at", "parent_gpu"):
        if entry.get(key) is not None and not isinstance(entry.get(key), str):
            return "%s is not a string" % key
    if entry.get("quarantined_at") is not None:
        try:
            _gotime.parse_rfc3339(entry["quarantined_at"])
        except ValueError as err:
            return "bad quarantined_at: %s" % err
    return None


def is_owned(entry, record):
    """Whether ``entry`` (the VF's latest) owns ``record``'s quarantine."""
    if entry is None or record is None or record.quarantined_at is None:
        return False
    if entry.get("action") != "quarantine" or entry.get("trigger", "manual") != "manual":
        return False
    if not entry.get("quarantined_at"):
        return False
    return _gotime.parse_rfc3339(entry["quarantined_at"]) == record.quarantined_at


def owned_quarantines(entries, store):
    """Sorted VFs whose quarantine in ``store`` this collection owns (see module doc).

    ``entries`` is a :class:`Ledger` or a list of entries in file order.
    """
    if isinstance(entries, Ledger):
        entries = entries.entries
    latest = {}
    for entry in entries:
        if entry.get("vf_address"):
            latest[entry["vf_address"]] = entry
    return sorted(vf for vf in store.quarantined() if is_owned(latest.get(vf), store.records.get(vf)))
