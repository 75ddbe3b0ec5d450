# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Directories held open as file descriptors, for writers that must not be
redirected (standard library only).

A path is looked up again by every call that takes it, so a directory swapped
for a symlink between two calls sends the second one elsewhere. The store and
ledger writers therefore open their directory once, without following a
symlink where the policy refuses one, and do every later step (lock, temporary
file, rename, fsync) relative to that descriptor. Directories they create get
exactly the mode asked for, whatever the umask.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import HostFileError, file_kind

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


def open_child(parent_fd, name, parent_path, mode=None, follow=True):
    """fd of the directory ``name`` inside ``parent_fd`` (whose path is ``parent_path``, for errors).

    ``follow=False`` refuses a symlink (:class:`HostFileError`). With
    ``mode`` a missing directory is created with exactly that mode, its
    parent fsynced; without, a missing one raises FileNotFoundError.
    Anything that is not a directory raises NotADirectoryError.
    """
    path = os.path.join(parent_path, name)
    flags = _DIR_FLAGS if follow else _DIR_FLAGS | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=parent_fd)
    except OSError as err:
        if err.errno == errno.ENOENT and mode is not None:
            return _make_child(parent_fd, name, path, mode)
        raise _explain(err, parent_fd, name, path)


def _make_child(parent_fd, name, path, mode):
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)  # narrow first; the exact mode follows on the fd
    except OSError as err:
        if err.errno != errno.EEXIST:
            raise OSError(err.errno, err.strerror, path) from err
    try:
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as err:
        raise _explain(err, parent_fd, name, path)
    try:
        os.fchmod(fd, mode)
        os.fsync(parent_fd)  # the new entry survives a crash
    except OSError as err:
        os.close(fd)
        raise OSError(err.errno, err.strerror, path) from err
    return fd


def _explain(err, parent_fd, name, path):
    """An OSError naming ``path`` and, for a symlink or a non-directory, what it is."""
    if err.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            info = None
        if info is not None and stat.S_ISLNK(info.st_mode):
            return HostFileError(errno.ELOOP, "is a symlink, which is refused here", path)
        if info is not None and not stat.S_ISDIR(info.st_mode):
            return NotADirectoryError(errno.ENOTDIR, "is %s, not a directory" % file_kind(info.st_mode), path)
    return OSError(err.errno, err.strerror, path)


def open_dir(path, mode=None, follow_last=True):
    """fd of the directory ``path`` (made absolute).

    Existing components are followed when they are symlinks (a data dir on
    another disk is normal), except the last one with ``follow_last=False``.
    With ``mode`` every missing component is created with exactly that mode
    (and opened without following, so a component created here and then
    swapped for a symlink is refused). Raises OSError naming the path.
    """
    path = os.path.abspath(path)
    parts = [part for part in path.split("/") if part]
    fd = os.open("/", _DIR_FLAGS)
    current = "/"
    try:
        for index, name in enumerate(parts):
            follow = follow_last or index < len(parts) - 1
            child = open_child(fd, name, current, mode, follow)
            os.close(fd)
            fd = child
            current = os.path.join(current, name)
        return fd
    except BaseException:
        os.close(fd)
        raise


# How long a writer waits for another run of this collection on the same host
# (its lock is held for one store, ledger or cursor write: well under a second).
LOCK_TIMEOUT = 60.0


class LockTimeout(OSError):
    """The lock stayed held by another process for the whole timeout."""


def lock_exclusive(fd, path, timeout=LOCK_TIMEOUT):
    """Take an exclusive ``flock`` on ``fd``, waiting at most ``timeout`` seconds.

    Never blocks for good: a run stuck holding the lock (or a hostile process
    holding it on purpose) makes this one fail with :class:`LockTimeout`
    naming ``path``; other lock errors are raised as OSError.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
        if time.monotonic() >= deadline:
            raise LockTimeout(errno.ETIMEDOUT, "timed out after %ss waiting for the lock (another run of this "
                                               "collection holds it)" % timeout, path)
        time.sleep(0.05)


class OpenFailed(OSError):
    """The file to lock could not be opened (ELOOP: it is a symlink)."""


class NotRegularFile(OSError):
    """The file to lock or write is not a regular file; ``kind`` says what it is."""

    def __init__(self, path, kind):
        super().__init__(errno.EINVAL, "is %s, not a regular file" % kind, path)
        self.kind = kind


def open_locked(dir_fd, name, path, mode, timeout=LOCK_TIMEOUT, append=False, exact_mode=False):
    """Open (creating it with ``mode``) the regular file ``name`` in ``dir_fd`` and take its bounded lock.

    The one way the store's lock file, the sentinel cursors' lock file and the
    ledger itself are locked. Never follows a symlink (:class:`OpenFailed`, ELOOP) and
    never blocks on a FIFO; anything but a regular file raises
    :class:`NotRegularFile`; a lock held for ``timeout`` raises
    :class:`LockTimeout`. ``exact_mode`` sets ``mode`` whatever the umask.
    Returns ``(fd, stat before locking)``; closing ``fd`` releases the lock.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if append:
        flags |= os.O_APPEND
    try:
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as err:
        raise OpenFailed(err.errno, err.strerror, path) from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(path, file_kind(info.st_mode))
        if exact_mode:
            os.fchmod(fd, mode)  # O_CREAT's mode is cut by the umask
        lock_exclusive(fd, path, timeout)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


class WriteStepError(OSError):
    """An OSError of :func:`replace_file`; ``step`` names the step that failed
    (``create``, ``write``, ``sync``, ``close``, ``rename`` or ``sync_dir``),
    ``name`` the file being replaced."""

    def __init__(self, step, err, name=None):
        super().__init__(err.errno, err.strerror or str(err), getattr(err, "filename", None))
        self.step = step
        self.name = name


def replace_file(dir_fd, name, tmp, data, mode, owner=None, sync_dir=True):
    """Durably replace ``name`` in ``dir_fd`` by ``data``: the one crash-safe write procedure.

    In this order: create ``tmp`` (``O_EXCL``, never through a symlink), set
    ``mode`` exactly (and ``owner``, a (uid, gid)), write, fsync, close,
    rename over ``name``, fsync the directory (``sync_dir=False`` leaves that
    to the caller, after a batch of renames). A kill at any instant leaves the
    old file or the new one. A failure after creating ``tmp`` and before the
    rename removes ``tmp`` and leaves ``name`` untouched. Raises
    :class:`WriteStepError`; after a ``sync_dir`` failure the new file is in place.
    """
    replace_files(dir_fd, [(name, tmp, data)], mode, owner=owner, sync_dir=sync_dir)


# Parallel fsyncs of a batch: one journal commit then serves many files.
FSYNC_THREADS = 16


def replace_files(dir_fd, items, mode, owner=None, sync_dir=True):
    """:func:`replace_file` for a batch of ``(name, tmp, data)``, with the same guarantee per file.

    Every ``tmp`` is created and written first, then all are fsynced (in
    parallel when there are several), then renamed in order, then the
    directory is fsynced once: after a kill each file is its old or its new
    version. On a failure the temps not yet renamed are removed; the error's
    ``name`` says which file failed.
    """
    written = []  # (name, tmp, fd or None once closed) created and not yet renamed
    step, current = "create", None
    try:
        for name, tmp, data in items:
            step, current = "create", name
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                         mode, dir_fd=dir_fd)
            written.append([name, tmp, fd])
            step = "write"
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, owner[0], owner[1])
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if len(items) > 1:  # fsynced below, all at once; keep few descriptors open
                step = "close"
                written[-1][2] = None
                os.close(fd)
        step = "sync"
        if len(written) == 1:
            os.fsync(written[0][2])
            step = "close"
            closing, written[0][2] = written[0][2], None
            os.close(closing)
        else:
            current = _fsync_all(dir_fd, written)
        step = "rename"
        while written:
            current, tmp, _fd = written[0]
            os.rename(tmp, current, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            written.pop(0)
    except OSError as err:
        for _name, tmp, fd in written:
            if fd is not None:
                os.close(fd)
            _unlink_quietly(dir_fd, tmp)
        raise WriteStepError(step, err, getattr(err, "vgpu_name", current)) from err
    if sync_dir:
        try:
            os.fsync(dir_fd)
        except OSError as err:
            raise WriteStepError("sync_dir", err, current) from err


def _fsync_named(dir_fd, name):
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_all(dir_fd, written):
    """fsync every written temp of a batch in parallel; raises the first OSError, tagged with its file."""
    import concurrent.futures  # only batches need threads: keep single writes' import cost down

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(FSYNC_THREADS, len(written))) as pool:
        futures = [(name, pool.submit(_fsync_named, dir_fd, tmp)) for name, tmp, _fd in written]
    for name, future in futures:
        err = future.exception()
        if err is not None:
            if isinstance(err, OSError):
                err.vgpu_name = name
            raise err
    return None


def _unlink_quietly(dir_fd, name):
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
