# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's VF health store (``<data_dir>/gpu/vf-health.json``), exactly as hypeman
handles it (standard library only).

Source of truth: hypeman ``lib/devices/vf_health.go`` (newest build: load
validation, ``ReportVFInitFailure``/``ReportVFInitSuccess``, threshold
re-evaluation, ``writeStateLocked``) and Go's ``encoding/json`` decoding and
encoding rules. Where this file matches Go behaviour that is easy to miss, a
comment says which.

Public API (other helpers import these names):

* :data:`STORE_RELPATH` (addresses are parsed by ``_pci``)
* :func:`load_store` -> :class:`HealthStore` (never raises for bad content)
* :class:`HealthStore` with :class:`Record` / :class:`Failure` values

Reading is all most modules need, so this file holds only that. Writing,
locking and repair live in ``_store_write``; the byte-exact serialization in
``_store_serialize`` (imported by :meth:`HealthStore.to_bytes` when called);
Go's JSON scanner, needed only for text Python's decoder cannot be trusted
with, in ``_gojson``. Every helper a module imports is shipped as source and
compiled on each run, so read-only modules such as ``vgpu_placement_info``
and the audit stay lighter this way.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import re
import stat

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils import _fileio, _gotime
from ansible_collections.hypeman.vgpu.plugins.module_utils._pci import ADDRESS_RE
# Shared with _gojson (which _store loads lazily): defined there so the two import one way.
from ansible_collections.hypeman.vgpu.plugins.module_utils._govalues import (
    GoSyntaxError, JsonNumber, JsonObject, go_fold, go_quote, raw_text,
)

STORE_RELPATH = "gpu/vf-health.json"
STORE_VERSION = 1

FORMAT_V1 = "v1"
FORMAT_LEGACY = "legacy"
FORMAT_INVALID = "invalid"
FORMAT_MISSING = "missing"


# --- Go text helpers -------------------------------------------------------------


def go_errno_text(err):
    """Go's syscall.Errno text: the C message with a lowercase first letter."""
    text = err.strerror or str(err)
    return text[:1].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text


# --- JSON value tree (both decoding paths build the same shapes) ---------------------


def _reject_constant(name):
    raise ValueError("not JSON: %s" % name)


def _fast_tree(data):
    """Python's C decoder, used only when it provably sees what Go sees:
    valid UTF-8, no escapes at all (so decoded == raw), no NaN/Infinity."""
    if b"\\" in data:
        return None
    try:
        text = data.decode("utf-8")
        return json.loads(text, object_pairs_hook=JsonObject, parse_int=JsonNumber, parse_float=JsonNumber,
                          parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None


def json_tree(data):
    """Go's syntax check plus a value tree; raises GoSyntaxError with Go's text."""
    tree = _fast_tree(data)
    if tree is not None:
        return tree
    # Escapes, invalid UTF-8 or invalid JSON: Go's own scanner decides (loaded only then).
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _gojson
    _gojson.check_valid(data)
    return _gojson.slow_tree(data)


# --- Go encoding/json: decoding into hypeman's structs (decode.go) ------------------

_PKG = "devices"


class _GoAbort(Exception):
    """An error Go returns immediately (Time.UnmarshalJSON), not saved."""


class _GoSlice(object):
    """A Go slice of structs: decoding reuses elements between len and cap
    (Go issue 21092), which matters when a key is repeated."""

    __slots__ = ("nil", "backing", "length")

    def __init__(self):
        self.nil = True
        self.backing = []
        self.length = 0

    def items(self):
        return self.backing[:self.length]


class _GoFailure(object):
    __slots__ = ("instance_id", "assigned_at", "reported_at")
    GO_NAME = "vfInitFailure"

    def __init__(self):
        self.instance_id = ""
        self.assigned_at = ""
        self.reported_at = _gotime.ZERO


class _GoRecord(object):
    __slots__ = ("vf_address", "failures", "quarantined_at")
    GO_NAME = "vfHealthRecord"

    def __init__(self):
        self.vf_address = ""
        self.failures = _GoSlice()
        self.quarantined_at = None


class _GoFile(object):
    __slots__ = ("version", "records")
    GO_NAME = "vfHealthFile"

    def __init__(self):
        self.version = 0
        self.records = _GoSlice()


_FIELDS = {
    _GoFile: {"VERSION": ("version", "int"), "RECORDS": ("records", _GoRecord)},
    _GoRecord: {"VF_ADDRESS": ("vf_address", "string"), "FAILURES": ("failures", _GoFailure),
                "QUARANTINED_AT": ("quarantined_at", "*time"), },
    _GoFailure: {"INSTANCE_ID": ("instance_id", "string"), "ASSIGNED_AT": ("assigned_at", "string"),
                 "REPORTED_AT": ("reported_at", "time")},
}

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INT_RE = re.compile(r"^-?[0-9]+$")


def _kind(node):
    if isinstance(node, JsonObject):
        return "object"
    if isinstance(node, list):
        return "array"
    if isinstance(node, JsonNumber):
        return "number"
    if isinstance(node, bool):
        return "bool"
    return "string"


class _GoDecoder(object):
    def __init__(self):
        self.saved = None

    def type_error(self, value, type_name, context):
        if self.saved is not None:
            return
        if context:
            struct, fields = context
            self.saved = "json: cannot unmarshal %s into Go struct field %s.%s of type %s" % (
                value, struct, ".".join(fields), type_name)
        else:
            self.saved = "json: cannot unmarshal %s into Go value of type %s" % (value, type_name)

    def struct(self, target, node, context):
        cls = type(target)
        if node is None:
            return
        if not isinstance(node, JsonObject):
            self.type_error(_kind(node), "%s.%s" % (_PKG, cls.GO_NAME), context)
            return
        fields = _FIELDS[cls]
        stack = context[1] if context else []
        for key, value in node:
            field = fields.get(go_fold(key))
            if field is None:
                continue  # unknown keys are ignored (and dropped on rewrite)
            name, kind = field
            sub_context = (cls.GO_NAME, stack + [name])
            if kind == "int":
                self.int_field(target, name, value, sub_context)
            elif kind == "string":
                if value is None:
                    continue
                if isinstance(value, str) and not isinstance(value, JsonNumber):
                    setattr(target, name, str(value))
                else:
                    self.type_error(_kind(value), "string", sub_context)
            elif kind == "time":
                parsed = self.time_value(value)
                if parsed is not None:
                    setattr(target, name, parsed)
            elif kind == "*time":
                if value is None:
                    setattr(target, name, None)
                else:
                    setattr(target, name, self.time_value(value))
            else:
                self.slice(getattr(target, name), kind, value, sub_context)

    def int_field(self, target, name, value, context):
        if value is None:
            return
        if isinstance(value, JsonNumber):
            if _INT_RE.match(value):
                number = int(value)
                if _INT64_MIN <= number <= _INT64_MAX:
                    setattr(target, name, number)
                    return
            self.type_error("number " + value, "int", context)
            return
        self.type_error(_kind(value), "int", context)

    @staticmethod
    def time_value(value):
        """Go's Time.UnmarshalJSON: null is a no-op (None), a non-string fails."""
        if value is None:
            return None
        if isinstance(value, JsonNumber) or not isinstance(value, str):
            raise _GoAbort("Time.UnmarshalJSON: input is not a JSON string")
        try:
            return _gotime.parse_rfc3339(raw_text(value))
        except ValueError as err:
            raise _GoAbort(str(err))

    def slice(self, target, elem_cls, node, context):
        if node is None:
            target.nil, target.backing, target.length = True, [], 0
            return
        if isinstance(node, JsonObject) or not isinstance(node, list):
            self.type_error(_kind(node), "[]%s.%s" % (_PKG, elem_cls.GO_NAME), context)
            return
        if not node:
            target.nil, target.backing, target.length = False, [], 0
            return
        for index, item in enumerate(node):
            if index >= len(target.backing):
                target.backing.append(elem_cls())
            if index >= target.length:
                target.length = index + 1
            self.struct(target.backing[index], item, context)
        target.length = len(node)
        target.nil = False


def _go_unmarshal(data):
    """``json.Unmarshal(data, &vfHealthFile{})``: returns ``(go_file, tree)``;
    raises ``_UnmarshalError`` with Go's text (and the tree when it parsed)."""
    try:
        tree = json_tree(data)
    except GoSyntaxError as err:
        raise _UnmarshalError(str(err), None)
    decoder = _GoDecoder()
    result = _GoFile()
    try:
        decoder.struct(result, tree, None)
    except _GoAbort as err:
        raise _UnmarshalError(str(err), tree)
    if decoder.saved is not None:
        raise _UnmarshalError(decoder.saved, tree)
    return result, tree


class _UnmarshalError(ValueError):
    def __init__(self, msg, tree):
        super(_UnmarshalError, self).__init__(msg)
        self.tree = tree


# --- the store ---------------------------------------------------------------------

Failure = collections.namedtuple("Failure", "instance_id assigned_at reported_at")
Failure.__doc__ = "One failed assignment: (instance_id, assigned_at) is the dedup key; reported_at a GoTime."


def failure_key(instance_id, assigned_at):
    """hypeman's key for "the same assignment" when it validates a store: the two joined by a NUL byte.

    Collisions included (``a\\0b`` + ``c`` is ``a`` + ``b\\0c``): a store with two such
    failures is invalid to hypeman, so whatever writes one (a repair) must keep only the first.
    """
    return instance_id + "\x00" + assigned_at


Record = collections.namedtuple("Record", "vf_address failures quarantined_at")
Record.__doc__ = "A VF's record: failures is a tuple of Failure (oldest first); quarantined_at a GoTime or None."


def _validate(go_file):
    """hypeman's loadLocked checks, in hypeman's order and words."""
    if go_file.version != STORE_VERSION:
        raise ValueError("validate VF health state: unsupported version %d" % go_file.version)
    if go_file.records.nil:
        raise ValueError("validate VF health state: expected a records array")
    loaded = {}
    for index, raw in enumerate(go_file.records.items()):
        if not ADDRESS_RE.match(raw.vf_address):
            raise ValueError("validate VF health state record %d: invalid VF address %s"
                             % (index, go_quote(raw.vf_address)))
        if raw.quarantined_at is not None and _gotime.is_zero(raw.quarantined_at):
            raise ValueError("validate VF health state record %d: missing quarantine timestamp" % index)
        failures = raw.failures.items()
        if raw.quarantined_at is None and not failures:
            raise ValueError("validate VF health state record %d: neither quarantined nor any recorded failures"
                             % index)
        seen = set()
        kept = []
        for findex, failure in enumerate(failures):
            if _gotime.is_zero(failure.reported_at):
                raise ValueError("validate VF health state record %d failure %d: missing report timestamp"
                                 % (index, findex))
            key = failure_key(failure.instance_id, failure.assigned_at)
            if key in seen:
                raise ValueError("validate VF health state record %d: duplicate failure for instance %s assigned at %s"
                                 % (index, go_quote(failure.instance_id), go_quote(failure.assigned_at)))
            seen.add(key)
            kept.append(Failure(failure.instance_id, failure.assigned_at, failure.reported_at))
        if raw.vf_address in loaded:
            raise ValueError("validate VF health state record %d: duplicate VF address %s"
                             % (index, go_quote(raw.vf_address)))
        loaded[raw.vf_address] = Record(raw.vf_address, tuple(kept), raw.quarantined_at)
    return loaded


# --- fast path: the common, well-formed store in one pass ---------------------------

_TOP_KEYS = frozenset(("version", "records"))
_RECORD_KEYS = frozenset(("vf_address", "failures", "quarantined_at"))
_FAILURE_KEYS = frozenset(("instance_id", "assigned_at", "reported_at"))


def _fast_records(data):
    """The records of a store that is plainly valid, decoded in one pass; None when in doubt.

    Taken only when Python's C decoder provably sees what Go sees (valid
    UTF-8, no escapes, no NaN/Infinity: as :func:`_fast_tree`) and the file
    holds nothing Go's field matching or hypeman's validation treats
    specially: exact lowercase keys, none repeated, none unknown, no null
    where a value belongs, the version the integer 1, every time valid and
    non-zero, no duplicate failure or address. Then the records equal what
    :func:`_go_unmarshal` plus :func:`_validate` return (a property test
    checks this); anything else (every error included) goes that exact way.

    Repeated keys, which a plain ``dict`` would hide, are counted instead:
    without escapes no string holds a quote, so every ``:`` outside strings
    separates one key from its value. The colons in the file minus those in
    the strings still in the tree equal the keys in the tree exactly when no
    key was repeated (a repeated key drops a key and the colons of its value).
    """
    if b"\\" in data:
        return None
    try:
        top = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    if type(top) is not dict or top.keys() != _TOP_KEYS:  # pylint: disable=unidiomatic-typecheck
        return None
    version, entries = top["version"], top["records"]
    if type(version) is not int or version != STORE_VERSION or type(entries) is not list:  # pylint: disable=unidiomatic-typecheck
        return None
    keys = 2
    colons = 0  # inside strings
    parse_canonical, parse_time, address_ok = _gotime.parse_canonical, _gotime.parse_rfc3339, ADDRESS_RE.match
    new_tuple = tuple.__new__
    records = {}
    try:
        for record in entries:
            if type(record) is not dict or not record.keys() <= _RECORD_KEYS:  # pylint: disable=unidiomatic-typecheck
                return None
            keys += len(record)
            address = record["vf_address"]
            if type(address) is not str or not address_ok(address) or address in records:  # pylint: disable=unidiomatic-typecheck
                return None
            colons += 2  # dddd:bb:dd.f
            quarantined_text = record.get("quarantined_at")
            quarantined_at = None
            if quarantined_text is not None:
                if type(quarantined_text) is not str:  # pylint: disable=unidiomatic-typecheck
                    return None
                colons += quarantined_text.count(":")
                quarantined_at = parse_canonical(quarantined_text) or parse_time(quarantined_text)
                # Only a text before year 0002 can be Go's zero instant (offsets stay within a day).
                if quarantined_text < "0002" and _gotime.is_zero(quarantined_at):
                    return None
            raw_failures = record.get("failures", ())
            if type(raw_failures) is not list and raw_failures != ():  # pylint: disable=unidiomatic-typecheck
                return None
            failures = []
            seen = set()
            for failure in raw_failures:
                if type(failure) is not dict or not failure.keys() <= _FAILURE_KEYS:  # pylint: disable=unidiomatic-typecheck
                    return None
                keys += len(failure)
                instance_id = failure.get("instance_id", "")
                assigned_at = failure.get("assigned_at", "")
                reported_text = failure["reported_at"]
                if type(instance_id) is not str or type(assigned_at) is not str or type(reported_text) is not str:  # pylint: disable=unidiomatic-typecheck
                    return None
                colons += instance_id.count(":") + assigned_at.count(":") + reported_text.count(":")
                reported_at = parse_canonical(reported_text) or parse_time(reported_text)
                key = failure_key(instance_id, assigned_at)
                if key in seen or (reported_text < "0002" and _gotime.is_zero(reported_at)):
                    return None
                seen.add(key)
                failures.append(new_tuple(Failure, (instance_id, assigned_at, reported_at)))
            if quarantined_at is None and not failures:
                return None
            records[address] = new_tuple(Record, (address, tuple(failures), quarantined_at))
    except (KeyError, ValueError):
        return None
    if data.count(b":") - colons != keys:
        return None  # a repeated key
    return records


class HealthStore(object):
    """One load of the store.

    Attributes: ``path``; ``exists`` (the path exists); ``is_symlink`` (the
    store file itself is a symlink); ``path_error`` (why the path itself is
    refused, or None); ``format`` (``v1``, ``legacy``,
    ``invalid``, ``missing``); ``valid``; ``error`` (hypeman's load error text,
    None when valid); ``raw`` (the bytes read, None when missing or
    unreadable); ``records`` (dict address -> :class:`Record`; empty when invalid).

    Mutators follow hypeman's semantics and change only ``records``; they
    refuse to act on an invalid store (fail closed).
    """

    def __init__(self, path, exists=False, fmt=FORMAT_MISSING, valid=True, error=None, raw=None,
                 records=None, is_symlink=False):
        self.path = path
        self.exists = exists
        self.format = fmt
        self.valid = valid
        self.error = error
        self.raw = raw
        self.records = dict(records or {})
        self.is_symlink = is_symlink
        self.path_error = None  # why the path itself is refused (not a regular file, a symlink)
        self.rewrite = False  # write even though the records compare equal (same instants, new text)

    # -- queries ------------------------------------------------------------------

    def quarantined(self):
        """Sorted addresses of quarantined VFs."""
        return sorted(address for address, record in self.records.items() if record.quarantined_at is not None)

    def failure_count(self, vf):
        """Recorded failures (distinct assignments) for ``vf``; 0 without a record."""
        record = self.records.get(vf)
        return len(record.failures) if record else 0

    def would_quarantine(self, threshold):
        """Sorted addresses hypeman's load re-evaluation would quarantine at ``threshold``."""
        return sorted(address for address, record in self.records.items()
                      if record.quarantined_at is None and len(record.failures) >= threshold)

    def copy(self):
        other = HealthStore(self.path, self.exists, self.format, self.valid, self.error, self.raw,
                            self.records, self.is_symlink)
        other.path_error = self.path_error
        return other

    # -- mutations (hypeman's semantics) --------------------------------------------

    def _require_valid(self):
        if not self.valid:
            raise VgpuError("VF health store %s is unusable (%s): %s; refusing to change it "
                            "(use state=repaired to rewrite it)" % (self.path, self.format, self.error),
                            store_error=self.error, store_format=self.format)

    @staticmethod
    def _check_address(vf):
        if not isinstance(vf, str) or not ADDRESS_RE.match(vf):
            raise VgpuError("invalid VF address %s" % go_quote(str(vf)))

    def report_failure(self, vf, instance_id, assigned_at, threshold, now=None):
        """hypeman's ReportVFInitFailure.

        Returns ``'unchanged'`` when the VF is already quarantined or this
        (instance_id, assigned_at) is already recorded; else appends the
        failure and returns ``'quarantined'`` when the count reaches
        ``threshold``, ``'recorded'`` otherwise.
        """
        self._require_valid()
        self._check_address(vf)
        previous = self.records.get(vf)
        failures = previous.failures if previous else ()
        if previous is not None and previous.quarantined_at is not None:
            return "unchanged"
        for failure in failures:
            if failure.instance_id == instance_id and failure.assigned_at == assigned_at:
                return "unchanged"
        failures = failures + (Failure(instance_id, assigned_at, now or _gotime.utc_now()),)
        quarantined_at = None
        outcome = "recorded"
        if len(failures) >= threshold:
            quarantined_at = now or _gotime.utc_now()
            outcome = "quarantined"
        self.records[vf] = Record(vf, failures, quarantined_at)
        return outcome

    def report_success(self, vf, instance_id, assigned_at):
        """hypeman's ReportVFInitSuccess.

        Clears the exactly matching failure and every older one; a record left
        without failures is deleted. A quarantined VF changes only when the
        match is its newest failure (so its record goes away and the
        quarantine is rescinded); a hand-made quarantine without failures
        never changes. Returns ``(outcome, cleared)`` with outcome
        ``'rescinded'`` (it was quarantined), ``'cleared'`` or ``'unchanged'``.
        """
        self._require_valid()
        self._check_address(vf)
        previous = self.records.get(vf)
        if previous is None or not previous.failures:
            return "unchanged", 0
        match = -1
        for index, failure in enumerate(previous.failures):
            if failure.instance_id == instance_id and failure.assigned_at == assigned_at:
                match = index
                break
        if match < 0 or (previous.quarantined_at is not None and match != len(previous.failures) - 1):
            return "unchanged", 0
        remaining = previous.failures[match + 1:]
        cleared = len(previous.failures) - len(remaining)
        if remaining:
            self.records[vf] = previous._replace(failures=remaining)
        else:
            del self.records[vf]
        return ("rescinded" if previous.quarantined_at is not None else "cleared"), cleared

    def quarantine(self, vf, now=None):
        """Manual quarantine (drain): keep failures, set quarantined_at if missing."""
        self._require_valid()
        self._check_address(vf)
        previous = self.records.get(vf)
        if previous is not None and previous.quarantined_at is not None:
            return "unchanged"
        failures = previous.failures if previous else ()
        self.records[vf] = Record(vf, failures, now or _gotime.utc_now())
        return "quarantined"

    def remove(self, vf):
        """Remove the VF's whole record: ``'cleared'`` or ``'unchanged'`` (no record)."""
        self._require_valid()
        self._check_address(vf)
        if vf in self.records:
            del self.records[vf]
            return "cleared"
        return "unchanged"

    def reevaluate(self, threshold, now=None):
        """hypeman's requarantineLocked: quarantine every unquarantined record
        with failures >= threshold; returns the sorted newly quarantined VFs."""
        self._require_valid()
        newly = self.would_quarantine(threshold)
        for address in newly:
            self.records[address] = self.records[address]._replace(quarantined_at=now or _gotime.utc_now())
        return newly

    def replace_records(self, records):
        """Make this a valid v1 store holding ``records`` (used by repair)."""
        self.records = dict(records)
        self.valid = True
        self.format = FORMAT_V1
        self.error = None

    # -- output -------------------------------------------------------------------------

    def sorted_records(self):
        return [self.records[address] for address in sorted(self.records)]

    def to_bytes(self):
        """hypeman's ``json.MarshalIndent(..., "", "  ")`` output, byte for byte."""
        self._require_valid()
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _store_serialize  # lazy: writers only
        try:
            return _store_serialize.serialize_records(self.sorted_records())
        except ValueError as err:  # a loaded time Go cannot marshal either (e.g. +24:00)
            raise VgpuError("cannot write VF health store %s: marshal VF health state: %s; nothing was changed "
                            "(hypeman's own next write of this file fails the same way; state=repaired rewrites "
                            "its times in UTC)" % (self.path, err), store_error="marshal VF health state: %s" % err)

    def marshal_error(self):
        """hypeman's error for writing this (loadable) store back, or None.

        Go loads offsets up to ``+24:00`` but cannot marshal an offset hour of
        24: hypeman then fails every report (rolled back) and, when its load
        re-evaluation has something to quarantine, disables placement.
        """
        if not self.valid:
            return None
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _store_serialize  # lazy: not the audit's
        try:
            _store_serialize.serialize_records(self.sorted_records())
        except ValueError as err:
            return "marshal VF health state: %s" % err
        return None

    def rewrite_in_utc(self):
        """Show each time Go cannot marshal in UTC (the same instant); marks the store for writing."""
        self._require_valid()

        def utc(value):
            try:
                _gotime.format_rfc3339nano(value)
                return value
            except ValueError:
                return _gotime.to_utc(value)

        self.records = dict(
            (vf, Record(vf, tuple(f._replace(reported_at=utc(f.reported_at)) for f in record.failures),
                        None if record.quarantined_at is None else utc(record.quarantined_at)))
            for vf, record in self.records.items())
        self.rewrite = True

    def to_data(self):
        """JSON-able records for module results: every key present, sorted by address.

        Times read as Go's ``Format`` prints them, which never fails (a time Go
        cannot marshal keeps its written offset, e.g. ``+24:00``).
        """
        data = []
        for record in self.sorted_records():
            data.append({
                "vf_address": record.vf_address,
                "failures": [{"instance_id": f.instance_id, "assigned_at": f.assigned_at,
                              "reported_at": _gotime.format_rfc3339nano(f.reported_at, strict=False)}
                             for f in record.failures],
                "quarantined_at": (_gotime.format_rfc3339nano(record.quarantined_at, strict=False)
                                   if record.quarantined_at is not None else None),
            })
        return data


# --- loading -------------------------------------------------------------------------


def _read_error(path, err):
    if err.errno == errno.EISDIR:
        return "read VF health state: read %s: %s" % (path, go_errno_text(err))
    return "read VF health state: open %s: %s" % (path, go_errno_text(err))


# No real store comes near this (about 2 MiB at 10,000 records); beyond it, refuse rather than read on.
STORE_READ_LIMIT = 64 * 1024 * 1024


def _path_problem(path, err):
    """Why the store path itself is refused (not a regular file, a symlink, too big), or None."""
    if isinstance(err, _fileio.HostFileError):
        if err.errno == errno.ELOOP:
            try:
                target = os.readlink(path)
            except OSError:
                target = None
            dangling = target is not None and not os.path.exists(path)
            shown = "" if target is None else " to %s" % go_quote(target)
            return ("%s is a symlink%s%s; this collection reads and writes only the file itself, never "
                    "through a symlink" % (path, shown, " that points nowhere" if dangling else ""))
        return "%s %s" % (path, err.strerror)
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISREG(info.st_mode):
        return None
    return "%s is %s, not a regular file" % (path, _fileio.file_kind(info.st_mode))


def _refused_store(path, problem, is_symlink=False, error=None):
    store = HealthStore(path, True, FORMAT_INVALID, False, error or "read VF health state: %s" % problem, None,
                        {}, is_symlink)
    store.path_error = problem
    return store


def parse_store_bytes(path, data):
    """A :class:`HealthStore` for file content ``data`` (hypeman's load steps 3-6)."""
    records = _fast_records(data)
    if records is not None:
        return HealthStore(path, True, FORMAT_V1, True, None, data, records)
    try:
        go_file, _tree = _go_unmarshal(data)
    except _UnmarshalError as err:
        # The legacy L0 file is a bare JSON array: valid JSON hypeman cannot load.
        legacy = isinstance(err.tree, list) and not isinstance(err.tree, JsonObject)
        return HealthStore(path, True, FORMAT_LEGACY if legacy else FORMAT_INVALID, False,
                           "unmarshal VF health state: %s" % err, data)
    try:
        records = _validate(go_file)
    except ValueError as err:
        return HealthStore(path, True, FORMAT_INVALID, False, str(err), data)
    return HealthStore(path, True, FORMAT_V1, True, None, data, records)


def load_store(path):
    """Load and validate the store like hypeman's loadLocked. Never raises for
    bad content: a missing file is an empty valid store (format ``missing``);
    anything hypeman would refuse gives ``valid=False`` with hypeman's error.
    Re-evaluation against a threshold is separate (:meth:`HealthStore.reevaluate`).

    Stricter than hypeman about the path (``path_error`` says why): the
    store must be a regular file read without following a symlink, in a
    directory that is not a symlink. A symlink (dangling ones included:
    not a missing store), FIFO, socket, device, directory or a file over
    :data:`STORE_READ_LIMIT` gives an invalid store, never a read of it.
    """
    directory = os.path.dirname(path) or "."
    try:
        dir_is_link = stat.S_ISLNK(os.lstat(directory).st_mode)
    except OSError:
        dir_is_link = False
    if dir_is_link:
        return _refused_store(path, "the store's directory %s is a symlink; this collection does not use a "
                                    "store directory through a symlink (point data_dir or path at the real "
                                    "directory)" % directory)
    try:
        data = _fileio.read_bytes(path, STORE_READ_LIMIT, follow=False)
    except OSError as err:
        if err.errno == errno.ENOENT and not isinstance(err, _fileio.HostFileError):
            # hypeman: os.IsNotExist -> empty store, not an error
            return HealthStore(path, False, FORMAT_MISSING, True, None, None, {}, False)
        problem = _path_problem(path, err)
        if problem is not None:
            is_link = isinstance(err, _fileio.HostFileError) and err.errno == errno.ELOOP
            go_error = _read_error(path, err) if err.errno == errno.EISDIR else None
            return _refused_store(path, problem, is_link, go_error)
        return HealthStore(path, os.path.lexists(path), FORMAT_INVALID, False, _read_error(path, err), None, {})
    return parse_store_bytes(path, data)
