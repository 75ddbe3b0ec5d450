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
