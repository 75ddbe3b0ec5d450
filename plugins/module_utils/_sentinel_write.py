# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing the sentinel's per-instance cursors (stdlib only), for ``vgpu_sentinel_scan``.

:func:`run` scans under the cursor directory's lock (:class:`CursorWriter`)
and commits the cursors after the store took the verdicts. ``_sentinel``
holds the scan, the cursor format and reading; the audit scans in check
mode, reads cursors and never compiles this helper or ``_safedir``
(docs/performance.md, "Audit cost per host").
"""

from __future__ import annotations

import errno
import json
import os

from ansible_collections.hypeman.vgpu.plugins.module_utils import _safedir, _sentinel
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError


class CursorWriter(_sentinel.CursorStore):
    """The cursor files of :class:`_sentinel.CursorStore`, locked and written
    (fixed temp name under the lock, fsync, rename, one directory fsync)."""

    def __init__(self, state_dir):
        super(CursorWriter, self).__init__(state_dir)
        self._lock_fd = None

    def lock(self):
        """Create the directory and hold an exclusive lock until :meth:`unlock`."""
        dir_fd = self._open_dir(create=True)
        lock_path = os.path.join(self.directory, ".lock")
        try:
            fd, _info = _safedir.open_locked(dir_fd, ".lock", lock_path, 0o600, exact_mode=True)
        except _safedir.OpenFailed as err:
            raise self._error(err)
        except _safedir.NotRegularFile as err:
            raise _sentinel.CursorDirError("cannot lock sentinel state directory %s: %s %s"
                                           % (self.directory, lock_path, err.strerror), state_dir=self.state_dir)
        except OSError as err:  # another run holds it for the whole (bounded) wait, or flock failed
            raise _sentinel.CursorDirError("cannot lock sentinel state directory %s: %s"
                                           % (self.directory, err.strerror or err), state_dir=self.state_dir)
        self._lock_fd = fd
        for name in os.listdir(dir_fd):
            if name.startswith(".") and name.endswith(".tmp"):  # left by a run killed mid-write
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except OSError:
                    pass

    def unlock(self):
        """Release the lock and close the directory."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.close()

    def save(self, instance_id, state):
        """Replace the cursor atomically: after a crash it is either the old or the new one."""
        self.save_all([(instance_id, state)])

    def save_all(self, items):
        """Replace each ``(instance_id, state)`` cursor atomically (old or new after a crash).

        Every temp file is written first and fsynced before any rename, as
        one cursor alone would be; the fsyncs run in parallel, so one journal
        commit serves many cursors instead of one commit each (a full scan of
        a host writes one cursor per instance).
        """
        dir_fd = self._open_dir(create=True)
        batch = []
        for instance_id, state in items:
            tmp = "." + instance_id + ".tmp"  # fixed name: runs are serialised by the lock
            try:
                os.unlink(tmp, dir_fd=dir_fd)  # left by a killed run
            except FileNotFoundError:
                pass
            except OSError as err:
                raise VgpuError("cannot write sentinel cursor %s: %s"
                                % (self.path(instance_id), err.strerror or err))
            batch.append((instance_id + ".json", tmp,
                          json.dumps(state, sort_keys=True, separators=(",", ":")).encode("utf-8")))
        try:
            # The directory is fsynced once after all cursors of a run (sync()).
            _safedir.replace_files(dir_fd, batch, 0o600, sync_dir=False)
        except _safedir.WriteStepError as err:
            failed = err.name[:-len(".json")] if err.name else batch[0][0][:-len(".json")]
            raise VgpuError("cannot write sentinel cursor %s: %s" % (self.path(failed), err.strerror or err))

    def remove(self, instance_id):
        dir_fd = self._open_dir(create=False)
        if dir_fd is None:
            return
        try:
            os.unlink(instance_id + ".json", dir_fd=dir_fd)
        except OSError as err:
            if err.errno != errno.ENOENT:
                raise VgpuError("cannot remove sentinel cursor %s: %s"
                                % (self.path(instance_id), err.strerror or err))

    def sync(self):
        """fsync the directory so the renames survive a crash."""
        try:
            os.fsync(self._open_dir(create=True))
        except OSError as err:
            raise VgpuError("cannot sync sentinel state directory %s: %s" % (self.directory, err.strerror or err))


def run(instances, unreadable, log_dir_of, state_dir, only=None, check_mode=False,
        recorder=None, block_size=_sentinel.BLOCK_BYTES):
    """Scan under the state lock, let ``recorder(report)`` act, then commit cursors.

    The cursors are written only after ``recorder`` returned, so a failed
    store write leaves them where they were and the verdicts stay unrecorded.
    In check mode nothing is locked, created or written.
    """
    cursors = CursorWriter(state_dir)
    if not check_mode:
        cursors.lock()
    try:
        report = _sentinel.scan(instances, unreadable, log_dir_of, state_dir, only=only,
                                check_mode=check_mode, block_size=block_size, cursors=cursors)
        recorded = recorder(report) if recorder is not None else None
        report.commit()
    finally:
        cursors.unlock()
    return report, recorded
