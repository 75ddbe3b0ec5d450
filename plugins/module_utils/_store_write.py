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
import os
import re
import stat

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _safedir
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import HostFileError, file_kind
from ansible_collections.hypeman.vgpu.plugins.module_utils._pci import normalize_address
from ansible_collections.hypeman.vgpu.plugins.module_utils._store import (
    Failure, GoSyntaxError, JsonNumber, JsonObject, Record, failure_key, go_fold, json_tree, load_store, raw_text,
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
            address = normalize_address(str(address))
        except VgpuError:
            continue
        quarantined_at = _recover_time(fields.get("QUARANTINED_AT"))
        failures = list(records[address].failures) if address in records else []
        seen = set(failure_key(f.instance_id, f.assigned_at) for f in failures)
        raw_failures = fields.get("FAILURES")
        if isinstance(raw_failures, list) and not isinstance(raw_failures, JsonObject):
            for item in raw_failures:
                failure = _recover_failure(item)
                if failure is None:
                    continue
                key = failure_key(failure.instance_id, failure.assigned_at)
                if key not in seen:
                    seen.add(key)
                    failures.append(failure)
        previous = records.get(address)
        if previous is not None and previous.quarantined_at is not None:
            quarantined_at = previous.quarantined_at
        records[address] = Record(address, tuple(failures), quarantined_at or now)
    if raw:
        text = raw.decode("utf-8", "replace")
        for match in _RECOVER_ADDRESS_RE.finditer(text):
            address = normalize_address(match.group(1))
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


DIR_MODE = 0o755  # hypeman: os.MkdirAll(dir, 0755)
FILE_MODE = 0o644  # hypeman: os.OpenFile(tmp, O_WRONLY|O_CREATE|O_TRUNC, 0644)
LOCK_MODE = 0o600


def _write_error(path, step, err):
    return VgpuError("cannot write VF health store %s: %s: %s; the previous file is unchanged"
                     % (path, step, getattr(err, "strerror", None) or err), errno=getattr(err, "errno", None))


def _refused(path, what, err):
    return VgpuError("refusing to write the VF health store %s: %s %s %s (possibly planted); nothing was written. "
                     "Remove it after checking what it is." % (path, what, err.filename, err.strerror),
                     symlink=err.filename)


class StoreDir(object):
    """The store's directory (hypeman's ``<data_dir>/gpu``) held open.

    The data dir may be a symlink (another disk); the gpu dir may not: it is
    opened with ``O_NOFOLLOW`` and every later step (lock, temporary file,
    rename, fsync) goes through that descriptor, so nothing outside it is
    created or changed even if a path component is swapped meanwhile. With
    ``create`` missing directories get exactly 0755, as hypeman creates them.
    """

    def __init__(self, path, create=True):
        self.path = path
        self.gpu_dir = os.path.dirname(os.path.abspath(path))
        self.name = os.path.basename(path)
        self.tmp_name = self.name + TMP_SUFFIX
        self.lock_name = self.name + LOCK_SUFFIX
        mode = DIR_MODE if create else None
        try:
            self.data_fd = _safedir.open_dir(os.path.dirname(self.gpu_dir), mode)
        except HostFileError as err:
            raise _refused(path, "directory", err)
        except OSError as err:
            raise _write_error(path, "create VF health state dir", err)
        try:
            self.gpu_fd = _safedir.open_child(self.data_fd, os.path.basename(self.gpu_dir),
                                              os.path.dirname(self.gpu_dir), mode, follow=False)
        except HostFileError as err:
            os.close(self.data_fd)
            raise _refused(path, "store directory", err)
        except OSError as err:
            os.close(self.data_fd)
            raise _write_error(path, "create VF health state dir", err)

    def close(self):
        os.close(self.gpu_fd)
        os.close(self.data_fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def lstat(self, name):
        """lstat of ``name`` in the gpu dir, or None when missing."""
        try:
            return os.stat(name, dir_fd=self.gpu_fd, follow_symlinks=False)
        except OSError as err:
            if err.errno == errno.ENOENT:
                return None
            raise OSError(err.errno, err.strerror, os.path.join(self.gpu_dir, name)) from err

    def check_regular(self, name, what):
        """Refuse ``name`` when it exists and is a symlink or not a regular file; its lstat or None."""
        full = os.path.join(self.gpu_dir, name)
        try:
            info = self.lstat(name)
        except OSError as err:
            raise VgpuError("cannot inspect %s %s: %s" % (what, full, err.strerror))
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise _refused(self.path, what, HostFileError(
                errno.EINVAL, "is a symlink" if stat.S_ISLNK(info.st_mode) else
                "is %s, not a regular file" % file_kind(info.st_mode), full))
        return info


def write_store_bytes(path, data, owner=None, dirs=None):
    """hypeman's writeStateLocked procedure for ``data``.

    mkdir -p (0755), fsync the gpu dir's parent, create ``<path>.tmp`` (mode
    0644; never through a symlink or an existing file), write, fsync, close,
    rename over ``path``, fsync the gpu dir -- all relative to the gpu dir
    held open (``dirs``, a :class:`StoreDir`; opened here when None). Before
    the rename any failure removes the tmp file and leaves the old store
    untouched. ``owner`` is an optional (uid, gid) to keep the previous
    file's ownership.
    """
    if dirs is None:
        with StoreDir(path) as opened:
            return write_store_bytes(path, data, owner, opened)
    tmp = dirs.tmp_name
    try:
        os.fsync(dirs.data_fd)
    except OSError as err:
        raise _write_error(path, "sync VF health state parent dir", err)
    dirs.check_regular(dirs.name, "store file")
    if dirs.check_regular(tmp, "temporary file") is not None:
        try:
            os.unlink(tmp, dir_fd=dirs.gpu_fd)  # a stale tmp (a killed writer); O_EXCL below creates anew
        except OSError as err:
            if err.errno != errno.ENOENT:
                raise _write_error(path, "remove stale VF health state tmp", err)
    try:
        _safedir.replace_file(dirs.gpu_fd, dirs.name, tmp, data, FILE_MODE, owner)
    except _safedir.WriteStepError as err:
        if err.step == "create" and err.errno in (errno.ELOOP, errno.EEXIST):
            raise VgpuError("refusing to write the VF health store: temporary file %s appeared while writing "
                            "(%s); nothing was written" % (path + TMP_SUFFIX, err.strerror),
                            symlink=path + TMP_SUFFIX)
        if err.step == "sync_dir":
            error = VgpuError("VF health store %s was replaced, but syncing its directory failed: %s; the new "
                              "content is visible but may not survive a power loss" % (path, err.strerror or err),
                              errno=err.errno, changed=True)
            error.renamed = True
            raise error
        raise _write_error(path, _STEP_TEXT[err.step], err)


# What a failed step of the write is called in errors (hypeman's wording).
_STEP_TEXT = {"create": "create VF health state", "write": "write VF health state", "sync": "sync VF health state",
              "close": "close VF health state", "rename": "rename VF health state"}


class _FileLock(object):
    """Exclusive ``flock`` on ``<store>.lock`` in the held-open gpu dir (created 0600, never through a symlink)."""

    def __init__(self, dirs, timeout):
        self.dirs = dirs
        self.path = os.path.join(dirs.gpu_dir, dirs.lock_name)
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        try:
            self.fd, _info = _safedir.open_locked(self.dirs.gpu_fd, self.dirs.lock_name, self.path, LOCK_MODE,
                                                  self.timeout)
        except _safedir.NotRegularFile as err:
            raise VgpuError("refusing to use lock file %s: it %s" % (self.path, err.strerror), symlink=self.path)
        except _safedir.LockTimeout:
            raise VgpuError("timed out after %ss waiting for the lock %s (another run of this "
                            "collection is editing the store)" % (self.timeout, self.path))
        except _safedir.OpenFailed as err:
            if err.errno == errno.ELOOP:
                raise VgpuError("refusing to use lock file %s: it is a symlink" % self.path, symlink=self.path)
            raise VgpuError("cannot open lock file %s: %s" % (self.path, err.strerror or err))
        except OSError as err:
            raise VgpuError("cannot lock %s: %s" % (self.path, err.strerror or err))
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the flock
        return False


def _refuse_path(store):
    """A store path that is not a regular file (or is a symlink) is never read, repaired or replaced."""
    if store.path_error is not None:
        raise VgpuError("VF health store %s cannot be used: %s; nothing was changed (state=repaired does not "
                        "replace it either: remove it after checking what it is)" % (store.path, store.path_error),
                        store_error=store.error, store_format=store.format)


def _run_mutate(path, mutate, allow_invalid):
    store = load_store(path)
    loaded = (store.format, store.valid, store.error)
    _refuse_path(store)
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


def _check_planted(path):
    """Check mode and no-op runs refuse a planted temporary or lock file too, as a write would."""
    for suffix, what in ((TMP_SUFFIX, "temporary file"), (LOCK_SUFFIX, "lock file")):
        try:
            info = os.lstat(path + suffix)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            raise _refused(path, what, HostFileError(
                errno.EINVAL, "is a symlink" if stat.S_ISLNK(info.st_mode) else
                "is %s, not a regular file" % file_kind(info.st_mode), path + suffix))


def update_store(path, mutate, check_mode=False, allow_invalid=False, backup=None, after_write=None,
                 lock_timeout=60.0, before_write=None, under_lock=None, force_lock=False, write_failed=None):
    """Locked read-modify-write of the store at ``path``.

    Under an exclusive flock on ``<path>.lock``: call ``under_lock()`` if
    given; load; fail closed with a :class:`VgpuError` naming the file and
    hypeman's reason when the store is invalid (unless ``allow_invalid``,
    for repair) or its path is not a regular file (always); call
    ``mutate(store)``; when the serialized store changed and not
    ``check_mode``, call ``backup(path)`` if given and the file exists
    (returns the backup path), then ``before_write(result)`` (the ledger's
    write-ahead intent), write durably with :func:`write_store_bytes`, then
    call ``after_write(result)`` still under the lock (the ledger append, so
    that ownership decisions made under the lock see it; also when the
    write failed after its rename, the change being visible) or, when the
    write failed before it, ``write_failed(result)``. ``mutate`` may run
    twice (unlocked, then under the lock), so it must depend on the store
    (and other locked state) only.

    Check mode, a refused store and a mutation that changes nothing take no
    lock and create nothing, unless ``force_lock`` (work to do under the
    lock even when the store stays as it is). Returns an :class:`UpdateResult`.
    """
    _check_planted(path)
    lock_path = path + LOCK_SUFFIX
    if check_mode or not (force_lock or os.path.lexists(lock_path)):
        # An unlocked pass first: check mode, refused stores and no-op
        # mutations end here, so they create nothing (not even the lock file).
        store, loaded, result, changed, after = _run_mutate(path, mutate, allow_invalid)
        if check_mode or not (changed or force_lock):
            return UpdateResult(path, changed, store.raw, after if changed else store.raw, result, store,
                                loaded[0], loaded[1], loaded[2], None)
    with StoreDir(path) as dirs, _FileLock(dirs, lock_timeout):
        if under_lock is not None:
            under_lock()
        # (Again) under the lock: another run may have written in between.
        store, loaded, result, changed, after = _run_mutate(path, mutate, allow_invalid)
        backup_file = None
        outcome = UpdateResult(path, changed, store.raw, after if changed else store.raw, result, store,
                               loaded[0], loaded[1], loaded[2], None)
        if changed:
            owner = None
            info = dirs.check_regular(dirs.name, "store file")
            if info is not None:
                owner = (info.st_uid, info.st_gid)
                if backup is not None:
                    backup_file = backup(path)
                    outcome = outcome._replace(backup_file=backup_file)
            if before_write is not None:
                before_write(outcome)
            try:
                write_store_bytes(path, after, owner, dirs)
            except VgpuError as err:
                if getattr(err, "renamed", False):
                    if after_write is not None:
                        after_write(outcome)
                elif write_failed is not None:
                    write_failed(outcome)
                raise
            if after_write is not None:
                after_write(outcome)
        return outcome
