# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing the ledger (stdlib only): entries, write-ahead intents, the durable append, settling.

The ledger's format, intents and ownership rules are described in
:mod:`_ledger`, which reads it. The writers (``vf_health``) import this
helper; the audit only reads the ledger and never compiles it
(docs/performance.md, "Audit cost per host").
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import uuid

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _ledger, _safedir

STATE_DIR_MODE = 0o700  # missing state dirs (and missing parents) get exactly this, whatever the umask
LEDGER_MODE = 0o600


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
    if action not in _ledger.ACTIONS:
        raise ValueError("unknown ledger action %r" % (action,))
    if trigger not in _ledger.TRIGGERS:
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


def open_state_dir(state_dir):
    """fd of ``state_dir``, created (with any missing parent) with exactly 0700; never a symlink."""
    try:
        return _safedir.open_dir(state_dir, STATE_DIR_MODE, follow_last=False)
    except OSError as err:
        raise _ledger.state_dir_error(state_dir, err)


def append_entries(state_dir, entries):
    """Append ``entries`` durably (one line each). Creates ``state_dir`` (0700)
    and the ledger (0600) when missing; never follows a symlinked state dir
    or ledger, and appends only to a regular file. Returns the ledger path."""
    path = _ledger.ledger_path(state_dir)
    if not entries:
        return path
    dir_fd = open_state_dir(state_dir)
    try:
        _append(dir_fd, path, entries)
    finally:
        os.close(dir_fd)
    return path


def _append(dir_fd, path, entries):
    try:
        fd, info = _safedir.open_locked(dir_fd, _ledger.LEDGER_NAME, path, LEDGER_MODE, append=True)
    except _safedir.OpenFailed as err:
        if err.errno == errno.ELOOP:
            raise VgpuError("refusing to append to ledger %s: it is a symlink" % path, symlink=path)
        raise VgpuError("cannot open ledger %s: %s" % (path, err.strerror or err))
    except _safedir.NotRegularFile as err:
        raise VgpuError("refusing to append to ledger %s: it %s" % (path, err.strerror), symlink=path)
    except OSError as err:
        raise VgpuError("cannot append to ledger %s: %s" % (path, err.strerror or err))
    try:
        created = info.st_size == 0
        prefix = _repair_tail(fd)
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


def _repair_tail(fd):
    """Under the ledger's flock: cut off a torn last line (a crash mid-append
    left part of a line, not JSON). Returns the bytes to write first: a
    newline when the last line is whole but unterminated."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return b""
    start, end = 0, size
    while end > 0:
        begin = max(0, end - 65536)
        newline = os.pread(fd, end - begin, begin).rfind(b"\n")
        if newline >= 0:
            start = begin + newline + 1
            break
        end = begin
    try:
        json.loads(os.pread(fd, size - start, start).decode("utf-8"))
        return b"\n"
    except (ValueError, UnicodeDecodeError, RecursionError):
        os.ftruncate(fd, start)
        return b""


def make_intent(run_id, entries, before, after, expect, now=None, absent=()):
    """The write-ahead line of a run about to replace the store.

    ``before``/``after``: :func:`store_digest` values; ``expect``: VF ->
    its ``quarantined_at`` (GoTime or None) in the store the run writes;
    ``absent``: the VFs of ``expect`` that store has no record of.
    """
    return {
        "time": _gotime.format_rfc3339nano(now or _gotime.utc_now()),
        "action": _ledger.INTENT,
        "run_id": run_id,
        "before_sha256": before,
        "after_sha256": after,
        "expect": dict((vf, None if moment is None else _gotime.format_rfc3339nano(moment))
                       for vf, moment in expect.items()),
        "absent": sorted(absent),
        "entries": list(entries),
    }


def settle(ledger, state_dir, store, run_id, check_mode=False, now=None):
    """Settle the intents killed runs left in ``ledger`` (read under the store lock) against ``store``.

    Appends each committed intent's missing entries (with ``settled_by``) and
    an ``abort`` line for the others, unless ``check_mode``. Returns
    ``[{run_id, line, time, entries, found, outcome}]``.
    """
    settled, lines = [], []
    for intent in ledger.pending():
        outcome = intent.decide(store)
        settled.append(intent.summary(outcome))
        if outcome == "commit":
            lines.extend(dict(entry, settled_by=run_id) for entry in intent.missing_entries())
        else:
            lines.append({"time": _gotime.format_rfc3339nano(now or _gotime.utc_now()), "action": _ledger.ABORT,
                          "run_id": intent.run_id, "settled_by": run_id,
                          "reason": "the store does not show the change of the interrupted run"})
    if lines and not check_mode:
        append_entries(state_dir, lines)
    return settled
