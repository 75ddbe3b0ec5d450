# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading host files safely and cheaply, stdlib only.

Every host file may be hostile: a FIFO (an open blocks, a read waits forever),
a device (``/dev/zero`` never ends), a directory, a symlink out of its root, or
a regular file that keeps growing. :func:`read_bytes` therefore opens without
blocking, reads only regular files and stops at a size cap, raising
:class:`OSError` (with the path) for anything else, so callers keep one
``except OSError`` and their own wording.

It is also the cheap path: a placement view reads about a thousand sysfs and
/proc files. ``open()`` costs about twice the system calls (it also asks
whether the file is a terminal and seeks to find its position) plus a buffered
reader object per file; here a file costs open, fstat, read until end, close.
"""

from __future__ import annotations

import errno
import os
import stat

_CHUNK = 65536
# No host file this collection reads is legitimately larger: sysfs attributes
# and /proc entries are a page, metadata and config a few KiB, the store about
# 2 MiB at 10,000 records. Callers that read bigger files pass their own cap.
DEFAULT_LIMIT = 16 * 1024 * 1024
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink"))


class HostFileError(OSError):
    """A host file that is not what a reader may read (not a regular file, too large, a refused symlink)."""


def file_kind(mode):
    """What a non-regular file is, in words ("a FIFO", "a directory", ...)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    for test, words in _KINDS:
        if test(mode):
            return words
    return "not a regular file"


def open_regular(path, follow=True, dir_fd=None):
    """``(fd, stat)`` of the regular file ``path``, opened without blocking.

    ``follow=False`` refuses a symlink in the last component (O_NOFOLLOW).
    ``dir_fd`` opens ``path`` relative to that open directory, as ``os.open`` does.
    Raises FileNotFoundError like ``open()``, IsADirectoryError for a
    directory and :class:`HostFileError` for any other kind of file.
    """
    flags = _OPEN_FLAGS if follow else _OPEN_FLAGS | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise HostFileError(errno.ELOOP, "is a symlink, which is refused here", path) from err
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        raise HostFileError(errno.EINVAL, "is %s, not a regular file" % file_kind(st.st_mode), path)
    return fd, st


def read_fd(fd, path, limit=DEFAULT_LIMIT):
    """Read an open descriptor to its end, refusing more than ``limit`` bytes."""
    chunks = []
    total = 0
    try:
        while True:
            # procfs hands out one page per read: only an empty read means the end.
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise HostFileError(errno.EFBIG, "is larger than %d bytes" % limit, path)
            chunks.append(chunk)
    except HostFileError:
        raise
    except OSError as err:
        raise OSError(err.errno, err.strerror, path) from err
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_bytes(path, limit=DEFAULT_LIMIT, follow=True):
    """The whole content of the regular file ``path`` (at most ``limit`` bytes).

    OSError with the path otherwise: as ``open(path, "rb").read()`` gives it
    for a missing file or a directory, :class:`HostFileError` for a FIFO,
    socket, device, a file over the cap, or (``follow=False``) a symlink.
    """
    fd, _st = open_regular(path, follow)
    try:
        return read_fd(fd, path, limit)
    finally:
        os.close(fd)


def is_within(path, root):
    """Whether ``path`` is ``root`` or below it, comparing normalised strings.

    No symlink is resolved here: callers pass real paths
    (``os.path.realpath``) when a symlink may lead elsewhere, or a link's
    lexical target when the link itself is what is judged.
    """
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def real_escape(path, roots):
    """Where ``path`` really leads (every symlink resolved) when that is outside all ``roots``, else None."""
    real = os.path.realpath(path)
    return None if any(is_within(real, os.path.realpath(root)) for root in roots) else real


def read_bytes_within(path, roots, limit=DEFAULT_LIMIT):
    """:func:`read_bytes` of ``path``, following a symlink only when its real target is inside ``roots``.

    For files under a directory this collection trusts as a whole (an
    instance's metadata under hypeman's data dir): a symlink that stays
    inside is read like the file, one that leads out raises
    :class:`HostFileError` naming where it leads.
    """
    try:
        return read_bytes(path, limit, follow=False)
    except HostFileError as err:
        if err.errno != errno.ELOOP:
            raise
    escape = real_escape(path, roots)
    if escape:
        raise HostFileError(errno.ELOOP, "is a symlink to %s, outside %s; refused" % (escape, " and ".join(roots)),
                            path)
    # Read the resolved path: a link swapped after the check cannot redirect the read.
    return read_bytes(os.path.realpath(path), limit)
