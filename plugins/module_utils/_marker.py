# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roles' own markers in ``state_dir`` (standard library only).

A marker is a small JSON object the roles keep while a step is unfinished, so
an interrupted run knows what to resume or restore:

- ``recovery/<gpu>.json``: sr_iov_cycle's resume marker;
- ``dcgm-quiesce.json``: the DCGM units dcgm_quiesce stopped;
- ``store-edit/<unit>.stopped``: store_edit stopped hypeman's unit.

Only these names are accepted. Every write and removal is made under one
bounded lock (``<state_dir>/.markers.lock``) with the crash-safe procedure of
:mod:`_safedir` (temp file, fsync, rename, directory fsync); the state
directory and the marker's directory are opened without following a symlink,
and a marker that is not a regular file, is too large or is not a JSON object
is refused, naming the file, before anything changes.
"""

from __future__ import annotations

import errno
import json
import os
import re

from ansible_collections.hypeman.vgpu.plugins.module_utils import _safedir
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import HostFileError, open_regular, read_fd

# The accepted marker names: a directory (or none) and a file name pattern.
_UNIT = r"[A-Za-z0-9_@:\\-][A-Za-z0-9_.@:\\-]{0,199}"
NAME_FORMS = (
    ("recovery/<gpu>.json", re.compile(r"recovery/([0-9A-Fa-f][0-9A-Fa-f:.]{0,63})\.json\Z")),
    ("dcgm-quiesce.json", re.compile(r"dcgm-quiesce\.json\Z")),
    ("store-edit/<unit>.stopped", re.compile(r"store-edit/(%s)\.stopped\Z" % _UNIT)),
)
_FORMS_TEXT = ", ".join(form for form, _pattern in NAME_FORMS)
LOCK_NAME = ".markers.lock"
# A marker holds a few fields; anything bigger is not one of ours.
MARKER_MAX = 64 * 1024
MARKER_MODE = 0o644
SUBDIR_MODE = 0o755
STATE_DIR_MODE = 0o700  # as the ledger creates a missing state dir


def name_problem(name):
    """Why ``name`` is not a marker name (words to follow it), or None."""
    if not isinstance(name, str):
        return "is %s; expected one of %s" % (type(name).__name__, _FORMS_TEXT)
    if any(pattern.match(name) for _form, pattern in NAME_FORMS) and ".." not in name:
        return None
    return "%r is not a marker name; expected one of %s" % (name[:80], _FORMS_TEXT)


def check_name(name):
    problem = name_problem(name)
    if problem:
        raise VgpuError("name %s" % problem)
    return name


def encode(content, path):
    """The bytes a marker with ``content`` (a dict) holds: JSON as Ansible's ``to_nice_json`` writes it, then a newline."""
    if not isinstance(content, dict):
        raise VgpuError("content for marker %s is %s; expected a dict" % (path, type(content).__name__))
    try:
        text = json.dumps(content, indent=4, sort_keys=True, separators=(",", ": "), allow_nan=False,
                          ensure_ascii=True)
    except (TypeError, ValueError, RecursionError) as err:
        raise VgpuError("content for marker %s cannot be written as JSON: %s" % (path, str(err)[:200]))
    data = (text + "\n").encode("ascii")
    if len(data) > MARKER_MAX:
        raise VgpuError("content for marker %s is %d bytes as JSON; expected at most %d"
                        % (path, len(data), MARKER_MAX))
    return data


def decode(data, path):
    """The JSON object a marker file holds; VgpuError naming ``path`` for anything else."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise VgpuError("marker %s is not valid JSON (%s); check it and remove it by hand"
                        % (path, str(err)[:200]), path=path)
    if not isinstance(value, dict):
        raise VgpuError("marker %s holds a JSON %s; expected an object; check it and remove it by hand"
                        % (path, type(value).__name__), path=path)
    return value


class Marker(object):
    """One marker ``name`` (already checked) under ``state_dir``."""

    def __init__(self, state_dir, name):
        self.state_dir = state_dir
        self.name = check_name(name)
        self.subdir, self.filename = os.path.split(name)
        self.path = os.path.join(state_dir, name)

    def _refuse(self, err, what):
        where = err.filename or self.path
        if isinstance(err, HostFileError) or err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
            return VgpuError("refusing marker %s: %s %s" % (self.path, where, err.strerror), path=self.path)
        return VgpuError("cannot %s marker %s: %s: %s" % (what, self.path, where, err.strerror or err),
                         path=self.path)

    def _open_dirs(self, create):
        """``(state_dir fd, marker dir fd)``; ``(None, None)`` when missing and not ``create``."""
        try:
            state_fd = _safedir.open_dir(self.state_dir, STATE_DIR_MODE if create else None, follow_last=False)
        except FileNotFoundError:
            return None, None
        except OSError as err:
            raise self._refuse(err, "open the state directory of")
        if not self.subdir:
            return state_fd, os.dup(state_fd)
        try:
            sub_fd = _safedir.open_child(state_fd, self.subdir, self.state_dir, SUBDIR_MODE if create else None,
                                         follow=False)
        except FileNotFoundError:
            os.close(state_fd)
            return None, None
        except OSError as err:
            os.close(state_fd)
            raise self._refuse(err, "open the directory of")
        return state_fd, sub_fd

    def _read(self, dir_fd):
        """``(bytes, content)`` of the marker in ``dir_fd``, ``(None, None)`` when there is none."""
        if dir_fd is None:
            return None, None
        try:
            fd, _st = open_regular(self.filename, follow=False, dir_fd=dir_fd)
        except FileNotFoundError:
            return None, None
        except OSError as err:
            raise self._refuse(type(err)(err.errno, err.strerror, self.path), "read")
        try:
            data = read_fd(fd, self.path, MARKER_MAX)
        except OSError as err:
            raise self._refuse(err, "read")
        finally:
            os.close(fd)
        return data, decode(data, self.path)

    def read(self):
        """The marker's content (a dict), or None when there is none. Creates and locks nothing."""
        data = self._peek()
        return None if data is None else decode(data, self.path)

    def _peek(self):
        """The marker's bytes (None when there is none), read without creating or locking anything."""
        state_fd, dir_fd = self._open_dirs(create=False)
        try:
            return self._read(dir_fd)[0]
        finally:
            for fd in (state_fd, dir_fd):
                if fd is not None:
                    os.close(fd)

    def apply(self, content, check_mode):
        """Make the marker hold ``content`` (a dict), or remove it (``content`` None).

        Returns ``(changed, previous bytes or None, new bytes or None)``. A
        first read creates and locks nothing, so check mode, an unchanged
        marker and a refused one (wrong kind of file, not JSON) leave the
        disk as it was. A change is then made under the marker lock, after
        reading the marker again, so two runs never interleave.
        """
        data = None if content is None else encode(content, self.path)
        before = self._peek()
        if check_mode or before == data:
            return before != data, before, data
        state_fd, dir_fd = self._open_dirs(create=data is not None)
        if state_fd is None:
            return False, None, None  # removed meanwhile, with its directory
        lock_fd = None
        try:
            lock_fd = self._lock(state_fd)
            before = self._read(dir_fd)[0]
            if before == data:
                return False, before, data
            if data is None:
                self._remove(dir_fd)
            else:
                self._write(dir_fd, data)
            return True, before, data
        finally:
            for fd in (lock_fd, dir_fd, state_fd):
                if fd is not None:
                    os.close(fd)

    def _lock(self, state_fd):
        lock_path = os.path.join(self.state_dir, LOCK_NAME)
        try:
            return _safedir.open_locked(state_fd, LOCK_NAME, lock_path, 0o600, timeout=_safedir.LOCK_TIMEOUT,
                                        exact_mode=True)[0]
        except _safedir.NotRegularFile as err:
            raise VgpuError("refusing marker lock %s: it %s" % (lock_path, err.strerror), path=lock_path)
        except OSError as err:
            raise VgpuError("cannot lock markers with %s: %s" % (lock_path, err.strerror or err), path=lock_path)

    def _write(self, dir_fd, data):
        tmp = "." + self.filename + ".tmp"
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # left by a run killed mid-write; we hold the lock
        except FileNotFoundError:
            pass
        except OSError as err:
            raise self._refuse(OSError(err.errno, err.strerror, os.path.join(os.path.dirname(self.path), tmp)),
                               "write")
        try:
            _safedir.replace_file(dir_fd, self.filename, tmp, data, MARKER_MODE)
        except _safedir.WriteStepError as err:
            raise VgpuError("cannot write marker %s (%s): %s" % (self.path, err.step, err.strerror or err),
                            path=self.path)

    def _remove(self, dir_fd):
        try:
            os.unlink(self.filename, dir_fd=dir_fd)
            os.fsync(dir_fd)  # the removal survives a crash
        except OSError as err:
            raise VgpuError("cannot remove marker %s: %s" % (self.path, err.strerror or err), path=self.path)
