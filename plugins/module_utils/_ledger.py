# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""This collection's append-only ledger of quarantines and clears (stdlib only).

``<state_dir>/ledger.jsonl``: one JSON object per line, appended with
``O_APPEND`` and fsynced, never rewritten (only a torn last line left by a
crash is cut off by the next append). It lives beside our other state, never
inside hypeman's store (hypeman drops unknown keys on its next write).

Entry keys: ``time`` (UTC RFC 3339, nanoseconds), ``action`` (``quarantine``,
``clear``, ``repair``), ``trigger`` (``manual``, ``failure_threshold``,
``reevaluation``, ``success``, ``repair``), ``vf_address``, ``parent_gpu``,
``quarantined_at`` (the exact value written to the store, or null),
``reason``, ``user``, ``job_id``, ``run_id``; ``settled_by`` (the run that
recorded it for a killed run, see below). Their values are text or null; a
line with another type there, or a nested value in any key (an intent's
``entries``, ``expect`` and ``absent`` apart), is a problem line.

Write-ahead intents make ownership survive ``kill -9`` at any instant: before
it replaces the store a run appends (and fsyncs) one ``intent`` line holding
its ``run_id``, the entries it is about to append, the SHA-256 of the store
before and after, and each named VF's ``quarantined_at`` after; once the
store is replaced it appends the entries themselves. An intent is settled
when all its entries follow it, or an ``abort`` line names its run. The next
run that writes settles any other intent under the store lock: when the store
shows the change it appends the missing entries (committing them, ownership
included), otherwise an ``abort`` line. Readers that cannot write decide a
pending intent the same way against the store they read.

Ownership: a VF's quarantine is *owned* when the ledger's latest entry for
that VF is our manual quarantine (``action: quarantine``, ``trigger:
manual``) and the store's ``quarantined_at`` is still the instant we wrote.
Quarantines that follow failure reports are logged too but never owned:
they are evidence of a wedged VF, not a drain.

Ledgers without intents (written before intents existed) read as before.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import HostFileError, read_bytes
from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime

LEDGER_NAME = "ledger.jsonl"

ACTIONS = ("quarantine", "clear", "repair")
INTENT = "intent"
ABORT = "abort"
TRIGGERS = ("manual", "failure_threshold", "reevaluation", "success", "repair")


def ledger_path(state_dir):
    return os.path.join(state_dir, LEDGER_NAME)


def state_dir_error(state_dir, err):
    if isinstance(err, HostFileError) and err.errno == errno.ELOOP:
        return VgpuError("refusing to use state directory %s: it is a symlink (this collection keeps its "
                         "ledger only in a real directory; point state_dir at it)" % state_dir, symlink=state_dir)
    return VgpuError("cannot create state directory %s: %s" % (err.filename or state_dir, err.strerror or err))


def store_digest(store):
    """What an intent records of a store's content: SHA-256 hex of its bytes, ``missing``, or None (unread)."""
    if not store.exists:
        return "missing"
    if store.raw is None:
        return None
    return hashlib.sha256(store.raw).hexdigest()


class Intent(object):
    """An ``intent`` line and how far it got: ``found`` of its entries follow it, or an abort line."""

    def __init__(self, line, data):
        self.line = line
        self.data = data
        self.run_id = data["run_id"]
        self.entries = data["entries"]
        self.found = 0
        self.aborted = False

    @property
    def status(self):
        if self.found >= len(self.entries):
            return "committed"
        return "aborted" if self.aborted else "pending"

    def decide(self, store):
        """``commit`` when ``store`` shows this run's change, else ``abort`` (for a pending intent).

        Some entries already follow the intent: the store was replaced (they
        are appended only after the rename). Otherwise the store's bytes are
        the ones the run wrote (commit) or read (abort); when someone changed
        the store since, commit only if every VF it names still has the
        ``quarantined_at`` the run wrote (its nanosecond times are unique) and
        every record it removed (``absent``) is still gone: a record that is
        there without a quarantine also reads as "no ``quarantined_at``".
        """
        if self.found:
            return "commit"
        digest = store_digest(store)
        if digest is not None and digest == self.data.get("after_sha256"):
            return "commit"
        if digest is not None and digest == self.data.get("before_sha256"):
            return "abort"
        if any(vf in store.records for vf in self.data.get("absent") or ()):
            return "abort"
        for vf, expected in self.data["expect"].items():
            record = store.records.get(vf)
            actual = record.quarantined_at if record is not None else None
            wanted = None if expected is None else _gotime.parse_rfc3339(expected)
            if actual != wanted:
                return "abort"
        return "commit"

    def missing_entries(self):
        return self.entries[self.found:]

    def summary(self, outcome=None):
        return {"run_id": self.run_id, "line": self.line, "time": self.data.get("time"),
                "entries": len(self.entries), "found": self.found, "outcome": outcome}


class Ledger(object):
    """What :func:`read_ledger` found: ``path``, ``exists``, ``entries`` (valid
    entries in file order, each with its ``line`` number), ``intents``
    (:class:`Intent` in file order) and ``problems`` (``[{line, error}]`` for
    lines that are not valid entries)."""

    def __init__(self, path, exists, entries, problems, intents=None):
        self.path = path
        self.exists = exists
        self.entries = entries
        self.problems = problems
        self.intents = intents or []

    def pending(self):
        """Intents a killed run left unsettled."""
        return [intent for intent in self.intents if intent.status == "pending"]

    def effective(self, store=None):
        """The entries, plus those of pending intents that ``store`` shows (as settling would append them)."""
        entries = self.entries
        if store is not None:
            extra = []
            for intent in self.pending():
                if intent.decide(store) == "commit":
                    extra.extend(intent.missing_entries())
            if extra:
                entries = entries + extra
        return entries

    def latest_by_vf(self, store=None):
        """Each VF's latest entry; with ``store``, pending intents count as settling would decide them."""
        latest = {}
        for entry in self.effective(store):
            if entry.get("vf_address"):
                latest[entry["vf_address"]] = entry
        return latest

    def vfs_for_parent(self, parent_gpu):
        """Sorted VF addresses any entry (or intent, settled or not) recorded for ``parent_gpu``."""
        entries = list(self.entries)
        for intent in self.intents:
            entries.extend(intent.entries)
        return sorted(set(entry["vf_address"] for entry in entries
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
        raise state_dir_error(state_dir, HostFileError(errno.ELOOP, "is a symlink", state_dir))
    try:
        data = read_bytes(path, LEDGER_READ_LIMIT, follow=False)
    except OSError as err:
        if err.errno == errno.ENOENT and not isinstance(err, HostFileError):
            return Ledger(path, False, [], [])
        raise VgpuError("cannot read ledger %s: %s" % (path, err.strerror or err))
    return parse_ledger(path, data)


def parse_ledger(path, data):
    """A :class:`Ledger` from the ledger's bytes."""
    entries, problems, intents, by_run = [], [], [], {}
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        torn = number == len(lines)  # no newline after it: an interrupted append
        try:
            entry = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            problems.append({"line": number, "error": ("torn last line (an interrupted append; the next append "
                                                       "cuts it off): %s" if torn else "not JSON: %s") % err})
            continue
        # Shape first: only a line of this collection's shape is flat enough to encode again.
        error = _line_error(entry) or _surrogate_error(raw, entry)
        if error is None and entry["action"] in (INTENT, ABORT):
            error = _add_intent_line(entry, number, intents, by_run)
        if error:
            problems.append({"line": number, "error": error})
            continue
        if entry["action"] in (INTENT, ABORT):
            continue
        entry["line"] = number
        intent = by_run.get(entry.get("run_id"))
        if intent is not None:
            intent.found += 1
        entries.append(entry)
    return Ledger(path, True, entries, problems, intents)


def _surrogate_error(raw, entry):
    """Why a line that escapes a lone surrogate (``\\udc80``) is refused, or None.

    Python's decoder keeps one; no result can carry it (Ansible refuses the text),
    so such a line would fail the task after its writes. This collection never writes one.
    """
    if b"\\ud" not in raw.lower():
        return None
    try:
        json.dumps(entry, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        return "a lone surrogate escape (%s); expected UTF-8 text" % json.dumps(err.object[err.start:err.end])
    return None


def _add_intent_line(entry, number, intents, by_run):
    run_id = entry["run_id"]
    if entry["action"] == INTENT:
        if run_id in by_run:
            return "second intent of run %s" % run_id
        by_run[run_id] = Intent(number, entry)
        intents.append(by_run[run_id])
        return None
    if run_id not in by_run:
        return "abort of run %s, which has no intent before it" % run_id
    by_run[run_id].aborted = True
    return None


# The keys _ledger_write writes as text (or null); an intent's entries, expect and absent are checked apart.
_TEXT_KEYS = ("time", "trigger", "vf_address", "parent_gpu", "quarantined_at", "reason", "user", "job_id", "run_id",
              "settled_by", "before_sha256", "after_sha256")
_STRUCTURED_KEYS = ("entries", "expect", "absent")


def _value_error(entry, structured=()):
    """Why a line's values are not what this collection writes: text or null in its text keys, a JSON
    scalar in any other key (the writer nests nothing else; a nested value could not even be returned)."""
    for key in _TEXT_KEYS:
        if entry.get(key) is not None and not isinstance(entry[key], str):
            return "%s is not a string" % key
    for key, value in entry.items():
        if key not in structured and isinstance(value, (dict, list)):
            return "%s is a JSON %s; expected text, a number, true, false or null" % (
                json.dumps(key)[:80], "object" if isinstance(value, dict) else "array")
    return None


def _line_error(entry):
    """Why a parsed line is not a valid entry, intent or abort line (None when it is)."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    if entry.get("action") in (INTENT, ABORT):
        if not isinstance(entry.get("run_id"), str) or not entry["run_id"]:
            return "%s without a run_id" % entry["action"]
        error = _value_error(entry, _STRUCTURED_KEYS if entry["action"] == INTENT else ())
        if error:
            return "%s %s" % (entry["action"], error)
        if entry["action"] == ABORT:
            return None
        if not isinstance(entry.get("entries"), list) or not isinstance(entry.get("expect"), dict):
            return "intent without entries or expect"
        for planned in entry["entries"]:
            error = _entry_error(planned)
            if error:
                return "intent entry: %s" % error
        absent = entry.get("absent", [])
        if not isinstance(absent, list) or not all(isinstance(vf, str) for vf in absent):
            return "intent absent is not a list of VF addresses"
        for vf, moment in entry["expect"].items():
            if moment is not None:
                try:
                    _gotime.parse_rfc3339(moment)
                except ValueError as err:
                    return "intent expect %s: %s" % (vf, err)
        return None
    return _entry_error(entry)


def _entry_error(entry):
    if not isinstance(entry, dict):
        return "not a JSON object"
    action = entry.get("action")
    if action not in ACTIONS:
        # Shown bounded: a line's action may be any JSON value, as long or as deep as the line.
        return "unknown action %s" % (repr(action[:80]) if isinstance(action, str) else
                                      "(a JSON %s)" % ("object" if isinstance(action, dict) else "array")
                                      if isinstance(action, (dict, list)) else repr(action))
    error = _value_error(entry)
    if error:
        return error
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

    ``entries`` is a :class:`Ledger` (pending intents count as settling would
    decide them against ``store``) or a list of entries in file order.
    """
    if isinstance(entries, Ledger):
        latest = entries.latest_by_vf(store)
    else:
        latest = {}
        for entry in entries:
            if entry.get("vf_address"):
                latest[entry["vf_address"]] = entry
    return sorted(vf for vf in store.quarantined() if is_owned(latest.get(vf), store.records.get(vf)))
