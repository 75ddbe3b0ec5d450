# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Changing hypeman's VF health store (standard library only).

* :func:`update_store` -- locked, validated, durable read-modify-write
* :func:`write_store_bytes` -- hypeman's ``writeStateLocked``: temp file, fsync, rename
* :func:`recover_records` -- what ``state: repaired`` keeps from a broken file

Loading, validation and serialization are in ``_store``.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import os
import re
import stat
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._store import (
    Failure, GoSyntaxError, JsonNumber, JsonObject, Record, go_fold, json_tree, load_store, normalize_vf_address,
    raw_text,
)

TMP_SUFFIX = ".tmp"  # hypeman: tmp := s.path + ".tmp"
LOCK_SUFFIX = ".lock"

# Anything that looks like a full PCI function address, for repair recovery.
_RECOVER_ADDRESS_RE = re.compile(r"(?<![0-9A-Za-z])([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?![0-9A-Za-z])")

# --- repair ----------------------------------------------------------------------------


def recover_records(raw, now=None):
    """Records a repair keeps from unusable store content: every VF address
    found stays (or becomes) quarantined.

    Structured recovery first (v1 records or legacy array entries with a
    valid, lowercase address; their valid failures and quarantine time are
    kept), then any other PCI function address in the raw text is
    quarantined as of ``now`` -- erring on the side of keeping VFs out of
    placement.
    """
    now = now or _gotime.utc_now()
    records = {}
    tree = None
    if raw:
        try:
            tree = json_tree(raw)
        except GoSyntaxError:
            tree = None
    entries = []
    if isinstance(tree, JsonObject):
        for key, value in tree:
            if go_fold(key) == "RECORDS" and isinstance(value, list) and not isinstance(value, JsonObject):
                entries.extend(value)
    elif isinstance(tree, list):
        entries = list(tree)
    for entry in entries:
        if not isinstance(entry, JsonObject):
            continue
        fields = {}
        for key, value in entry:
            fields[go_fold(key)] = value
        address = fields.get("VF_ADDRESS")
        if not isinstance(address, str) or isinstance(address, JsonNumber):
            continue
        try:
            address = normalize_vf_address(str(address))
        except VgpuError:
            continue
        quarantined_at = _recover_time(fields.get("QUARANTINED_AT"))
        failures = list(records[address].failures) if address in records else []
        seen = set((f.instance_id, f.assigned_at) for f in failures)
        raw_failures = fields.get("FAILURES")
        if isinstance(raw_failures, list) and not isinstance(raw_failures, JsonObject):
            for item in raw_failures:
                failure = _recover_failure(item)
                if failure is not None and (failure.instance_id, failure.assigned_at) not in seen:
                    seen.add((failure.instance_id, failure.assigned_at))
                    failures.append(failure)
        previous = records.get(address)
        if previous is not None and previous.quarantined_at is not None:
            quarantined_at = previous.quarantined_at
        records[address] = Record(address, tuple(failures), quarantined_at or now)
    if raw:
        text = raw.decode("utf-8", "replace")
        for match in _RECOVER_ADDRESS_RE.finditer(text):
            address = normalize_vf_address(match.group(1))
            if address not in records:
                records[address] = Record(address, (), now)
    return records


def _recover_time(value):
    if not isinstance(value, str) or isinstance(value, JsonNumber):
        return None
    try:
        parsed = _gotime.parse_rfc3339(raw_text(value))
        _gotime.format_rfc3339nano(parsed)
    except ValueError:
        return None
    return None if _gotime.is_zero(parsed) else parsed


def _recover_failure(item):
    if not isinstance(item, JsonObject):
        return None
    fields = {}
    for key, value in item:
        fields[go_fold(key)] = value
    reported_at = _recover_time(fields.get("REPORTED_AT"))
    if reported_at is None:
        return None
    strings = []
    for name in ("INSTANCE_ID", "ASSIGNED_AT"):
        value = fields.get(name)
        if value is None:
            value = ""
        if not isinstance(value, str) or isinstance(value, JsonNumber):
            return None
        strings.append(str(value))
    return Failure(strings[0], strings[1], reported_at)


# --- durable, locked writes ---------------------------------------------------------------

UpdateResult = collections.namedtuple(
    "UpdateResult",
    "path changed before after result store loaded_format loaded_valid loaded_error backup_file",
)
UpdateResult.__doc__ = """Outcome of :func:`update_store`.

``before``: the file's bytes before (None when missing/unreadable);
``after``: the bytes now on disk, or that would be in check mode (None when
the store stays missing); ``changed``; ``result``: what ``mutate`` returned;
``store``: the store after ``mutate``; ``loaded_*``: the load result before
``mutate``; ``backup_file``: path of the backup made, or None.
"""


def _refuse_symlink(path, what):
    try:
        info = os.lstat(path)
    except (IOError, OSError) as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return
        raise VgpuError("cannot inspect %s %s: %s" % (what, path, err.strerror or err))
    if stat.S_ISLNK(info.st_mode):
        raise VgpuError("refusing to write the VF health store: %s %s is a symlink (possibly planted); "
                        "nothing was written. Remove it after checking where it points." % (what, path),
                        symlink=path)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_error(path, step, err):
    return VgpuError("cannot write VF health store %s: %s: %s; the previous file is unchanged"
                     % (path, step, getattr(err, "strerror", None) or err), errno=getattr(err, "errno", None))


def _make_dirs(directory):
    """``os.MkdirAll(dir, 0755)``; a new directory gets exactly 0755."""
    missing = []
    current = directory
    while current and not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for created in missing:
        os.chmod(created, 0o755)


def write_store_bytes(path, data, owner=None):
    """hypeman's writeStateLocked procedure for ``data``.

    mkdir -p (0755), fsync the gpu dir's parent, create ``<path>.tmp`` (mode
    0644; never through a symlink or an existing file), write, fsync, close,
    rename over ``path``, fsync the gpu dir. Before the rename any failure
    removes the tmp file and leaves the old store untouched. ``owner`` is an
    optional (uid, gid) to keep the previous file's ownership.
    """
    directory = os.path.dirname(path) or "."
    tmp = path + TMP_SUFFIX
    try:
        _make_dirs(directory)
    except (IOError, OSError) as err:
        raise _write_error(path, "create VF health state dir", err)
    try:
        _fsync_dir(os.path.dirname(directory) or ".")
    except (IOError, OSError) as err:
        raise _write_error(path, "sync VF health state parent dir", err)
    _refuse_symlink(path, "store file")
    _refuse_symlink(tmp, "temporary file")
    try:
        os.unlink(tmp)  # a stale tmp (e.g. left by a killed writer); O_EXCL below must create anew
    except (IOError, OSError) as err:
        if err.errno != errno.ENOENT:
            raise _write_error(path, "remove stale VF health state tmp", err)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
    except (IOError, OSError) as err:
        if err.errno in (errno.ELOOP, errno.EEXIST):
            raise VgpuError("refusing to write the VF health store: temporary file %s appeared while writing "
                            "(%s); nothing was written" % (tmp, err.strerror), symlink=tmp)
        raise _write_error(path, "create VF health state", err)
    try:
        try:
            os.fchmod(fd, 0o644)
            if owner is not None:
                os.fchown(fd, owner[0], owner[1])
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except (IOError, OSError) as err:
            raise _write_error(path, "write VF health state", err)
        try:
            os.fsync(fd)
        except (IOError, OSError) as err:
            raise _write_error(path, "sync VF health state", err)
    except VgpuError:
        os.close(fd)
        _remove_quietly(tmp)
        raise
    try:
        os.close(fd)
    except (IOError, OSError) as err:
        _remove_quietly(tmp)
        raise _write_error(path, "close VF health state", err)
    try:
        os.rename(tmp, path)
    except (IOError, OSError) as err:
        _remove_quietly(tmp)
        raise _write_error(path, "rename VF health state", err)
    try:
        _fsync_dir(directory)
    except (IOError, OSError) as err:
        raise VgpuError("VF health store %s was replaced, but syncing its directory failed: %s; the new "
                        "content is visible but may not survive a power loss" % (path, err.strerror or err),
                        errno=err.errno)


def _remove_quietly(path):
    try:
        os.unlink(path)
    except (IOError, OSError):
        pass


class _FileLock(object):
    """Exclusive ``flock`` on ``<store>.lock`` (created 0600, never through a symlink)."""

    def __init__(self, path, timeout):
        self.path = path
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            self.fd = os.open(self.path, flags, 0o600)
        except (IOError, OSError) as err:
            if err.errno == errno.ELOOP:
                raise VgpuError("refusing to use lock file %s: it is a symlink" % self.path, symlink=self.path)
            raise VgpuError("cannot open lock file %s: %s" % (self.path, err.strerror or err))
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except (IOError, OSError) as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(self.fd)
                    raise VgpuError("cannot lock %s: %s" % (self.path, err.strerror or err))
            if time.monotonic() >= deadline:
                os.close(self.fd)
                raise VgpuError("timed out after %ss waiting for the lock %s (another run of this "
                                "collection is editing the store)" % (self.timeout, self.path))
            time.sleep(0.05)

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the flock
        return False


def _run_mutate(path, mutate, allow_invalid):
    store = load_store(path)
    loaded = (store.format, store.valid, store.error)
    if not store.valid and not allow_invalid:
        raise VgpuError("VF health store %s is unusable (%s): %s; nothing was changed "
                        "(state=repaired rewrites it, keeping a backup)" % (path, store.format, store.error),
                        store_error=store.error, store_format=store.format)
    before = dict(store.records)
    result = mutate(store)
    # Records are immutable values, so comparing them says whether the
    # serialized store changed (mutations never re-express a time in another offset).
    changed = store.valid and (not loaded[1] or store.records != before or store.rewrite)
    after = store.to_bytes() if changed else None
    return store, loaded, result, changed, after


def update_store(path, mutate, check_mode=False, allow_invalid=False, backup=None, after_write=None,
                 lock_timeout=60.0):
    """Locked read-modify-write of the store at ``path``.

    Under an exclusive flock on ``<path>.lock``: load; fail closed with a
    :class:`VgpuError` naming the file and hypeman's reason when the store is
    invalid (unless ``allow_invalid``, for repair); call ``mutate(store)``;
    when the serialized store changed and not ``check_mode``, call
    ``backup(path)`` if given and the file exists (returns the backup path),
    write durably with :func:`write_store_bytes`, then call
    ``after_write(result)`` still under the lock (the ledger append, so that
    ownership decisions made under the lock see it). ``mutate`` runs twice
    when it changes something (unlocked, then under the lock), so it must
    depend on the store (and other locked state) only.

    Check mode, a refused (invalid) store and a mutation that changes nothing
    take no lock and create nothing. Returns an :class:`UpdateResult`.
    """
    _refuse_symlink(path, "store file")
    _refuse_symlink(path + TMP_SUFFIX, "temporary file")
    directory = os.path.dirname(path) or "."
    lock_path = path + LOCK_SUFFIX
    if check_mode or not os.path.exists(lock_path):
        # An unlocked pass first: check mode, refused stores and no-op
        # mutations end here, so they create nothing (not even the lock file).
        store, loaded, result, changed, after = _run_mutate(path, mutate, allow_invalid)
        if check_mode or not changed:
            return UpdateResult(path, changed, store.raw, after if changed else store.raw, result, store,
                                loaded[0], loaded[1], loaded[2], None)
        try:
            _make_dirs(directory)
        except (IOError, OSError) as err:
            raise _write_error(path, "create VF health state dir", err)
    with _FileLock(lock_path, lock_timeout):
        # (Again) under the lock: another run may have written in between.
        store, loaded, result, changed, after = _run_mutate(path, mutate, allow_invalid)
        backup_file = None
        if changed:
            owner = None
            try:
                info = os.stat(path)
                owner = (info.st_uid, info.st_gid)
            except (IOError, OSError):
                pass
            if backup is not None and os.path.lexists(path):
                backup_file = backup(path)
            write_store_bytes(path, after, owner)
        outcome = UpdateResult(path, changed, store.raw, after if changed else store.raw, result, store,
                               loaded[0], loaded[1], loaded[2], backup_file)
        if changed and after_write is not None:
            after_write(outcome)
        return outcome
