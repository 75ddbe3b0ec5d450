# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hypeman's VF health store as the API stand-in keeps it (test equipment).

Written from ``docs/hypeman-interface.md`` §1 on purpose without importing the
collection's ``_store.py``: the stand-in plays hypeman, so tests that run the
collection against it compare two independent readings of the same facts.

Facts reproduced:

- §1.3 validation order and texts; a missing file is an empty, valid store;
  the legacy bare array fails to unmarshal;
- §1.4 threshold re-evaluation at load (quarantine VFs already at the
  threshold, rewrite the file);
- §1.5 / §1.6 failure and success reports (dedup per ``(instance_id,
  assigned_at)``, no change on a quarantined VF, success clears the match and
  everything older, rescinds only from the newest failure);
- §1.7 serialization (2-space indent, sorted by address, omitempty, Go's
  RFC 3339 nanosecond form, Go's HTML escaping, no trailing newline) and the
  durable write (fixed ``vf-health.json.tmp``, fsyncs, rename; rollback on a
  failure before the rename);
- §1.8 the store is "unavailable" after a failed load or write; a load error
  is retried on the next access, a write error on the next read.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import time

ADDRESS_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_TS_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$")
DEFAULT_THRESHOLD = 2
TMP_NAME = "vf-health.json.tmp"


class StoreError(Exception):
    """A load or write error, with hypeman's text."""


def _days_from_civil(year, month, day):
    # Days since 1970-01-01 for the proleptic Gregorian calendar (any year).
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


class GoTime(object):
    """A parsed RFC 3339 time: the instant (ns since epoch) and its UTC offset."""

    __slots__ = ("unix_ns", "offset_s")

    def __init__(self, unix_ns, offset_s=0):
        self.unix_ns = unix_ns
        self.offset_s = offset_s

    ZERO_NS = _days_from_civil(1, 1, 1) * 86400 * 10 ** 9

    @classmethod
    def parse(cls, text):
        match = _TS_RE.match(text) if isinstance(text, str) else None
        if not match:
            raise ValueError("parsing time %s as RFC 3339" % json.dumps(text))
        year, month, day, hour, minute, sec = (int(g) for g in match.groups()[:6])
        if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and sec < 60):
            raise ValueError("parsing time %s: value out of range" % json.dumps(text))
        frac = int((match.group(7) or "0").ljust(9, "0"))
        zone = match.group(8)
        offset = 0 if zone in "Zz" else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
        local = (_days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + sec)
        return cls((local - offset) * 10 ** 9 + frac, offset)

    @classmethod
    def now(cls):
        return cls(time.time_ns(), 0)

    def is_zero(self):
        return self.unix_ns == self.ZERO_NS

    def format(self):
        """Go's ``time.Time`` JSON form (RFC3339Nano, zeros trimmed, ``Z`` for UTC)."""
        local_ns = self.unix_ns + self.offset_s * 10 ** 9
        secs, nsec = divmod(local_ns, 10 ** 9)
        days, rem = divmod(secs, 86400)
        # civil_from_days
        z = days + 719468
        era = (z if z >= 0 else z - 146096) // 146097
        doe = z - era * 146097
        yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
        doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
        mp = (5 * doy + 2) // 153
        day = doy - (153 * mp + 2) // 5 + 1
        month = mp + 3 if mp < 10 else mp - 9
        year = yoe + era * 400 + (month <= 2)
        text = "%04d-%02d-%02dT%02d:%02d:%02d" % (year, month, day, rem // 3600, rem % 3600 // 60, rem % 60)
        if nsec:
            text += ("." + "%09d" % nsec).rstrip("0")
        if self.offset_s == 0:
            return text + "Z"
        sign = "+" if self.offset_s > 0 else "-"
        off = abs(self.offset_s)
        return text + "%s%02d:%02d" % (sign, off // 3600, off % 3600 // 60)


def go_json(value):
    """``json.MarshalIndent(v, "", "  ")`` with Go's HTML-safe escaping."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


class Record(object):
    """One VF's record: failures ``[(instance_id, assigned_at, GoTime)]`` and ``quarantined_at``."""

    def __init__(self, vf_address, failures=None, quarantined_at=None):
        self.vf_address = vf_address
        self.failures = list(failures or [])
        self.quarantined_at = quarantined_at

    def to_json(self):
        out = {"vf_address": self.vf_address}
        if self.failures:
            out["failures"] = []
            for instance_id, assigned_at, reported_at in self.failures:
                item = {}
                if instance_id:
                    item["instance_id"] = instance_id
                if assigned_at:
                    item["assigned_at"] = assigned_at
                item["reported_at"] = reported_at.format()
                out["failures"].append(item)
        if self.quarantined_at is not None:
            out["quarantined_at"] = self.quarantined_at.format()
        return out


_PKG = "devices"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class _FloatText(float):
    """A JSON number with a fraction or exponent; keeps its text, which Go's error quotes ("number 1.0")."""

    def __new__(cls, text):
        number = float.__new__(cls, text)
        number.text = text
        return number


def _kind(value):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


def _fields(obj):
    """An object's members in document order, keys folded as Go matches them (ASCII case-insensitive)."""
    return [(key.lower() if key.isascii() else key, value) for key, value in obj.items()]


class _GoUnmarshal(object):
    """Go's ``json.Unmarshal(data, &vfHealthFile{})`` on a parsed document (§1.2 types).

    As in Go: ``null`` leaves a field as it is; the first type mismatch is
    kept and decoding goes on; a ``time.Time`` error stops at once. The error
    names the innermost struct type and the full field path (Go 1.20+).
    """

    def __init__(self):
        self.saved = None

    def type_error(self, kind, go_type, struct=None, path=()):
        if self.saved is not None:
            return
        if struct:
            self.saved = "json: cannot unmarshal %s into Go struct field %s.%s of type %s" % (
                kind, struct, ".".join(path), go_type)
        else:
            self.saved = "json: cannot unmarshal %s into Go value of type %s" % (kind, go_type)

    @staticmethod
    def time(value):
        if not isinstance(value, str):
            raise StoreError("unmarshal VF health state: Time.UnmarshalJSON: input is not a JSON string")
        try:
            return GoTime.parse(value)
        except ValueError as err:
            raise StoreError("unmarshal VF health state: %s" % err)

    def string(self, value, struct, path, default):
        if value is None:
            return default
        if isinstance(value, str):
            return value
        self.type_error(_kind(value), "string", struct, path)
        return default

    def int(self, value, struct, path, default):
        if value is None:
            return default
        if isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value <= _INT64_MAX:
            return value
        if isinstance(value, _FloatText):
            self.type_error("number " + value.text, "int", struct, path)
        elif isinstance(value, int) and not isinstance(value, bool):
            self.type_error("number %d" % value, "int", struct, path)
        else:
            self.type_error(_kind(value), "int", struct, path)
        return default

    def slice(self, value, elem_type, decode_elem, struct, path, default):
        """A list of decoded elements; None for a nil slice."""
        if value is None:
            return None
        if not isinstance(value, list):
            self.type_error(_kind(value), "[]%s.%s" % (_PKG, elem_type), struct, path)
            return default
        out = []
        for item in value:
            if item is not None and not isinstance(item, dict):
                self.type_error(_kind(item), "%s.%s" % (_PKG, elem_type), struct, path)
                item = None
            out.append(decode_elem(item or {}, path))
        return out

    def failure(self, obj, path):
        instance_id, assigned_at, reported_at = "", "", None
        for key, value in _fields(obj):
            if key == "instance_id":
                instance_id = self.string(value, "vfInitFailure", path + (key,), instance_id)
            elif key == "assigned_at":
                assigned_at = self.string(value, "vfInitFailure", path + (key,), assigned_at)
            elif key == "reported_at" and value is not None:
                reported_at = self.time(value)
        return (instance_id, assigned_at, reported_at)

    def record(self, obj, path):
        vf_address, failures, quarantined_at = "", None, None
        for key, value in _fields(obj):
            if key == "vf_address":
                vf_address = self.string(value, "vfHealthRecord", path + (key,), vf_address)
            elif key == "failures":
                failures = self.slice(value, "vfInitFailure", self.failure, "vfHealthRecord", path + (key,), failures)
            elif key == "quarantined_at":
                quarantined_at = None if value is None else self.time(value)
        return Record(vf_address, failures, quarantined_at)

    def file(self, doc):
        """``(version, records)``; records is None when the slice is nil."""
        version, records = 0, None
        if doc is None:
            return version, records
        if not isinstance(doc, dict):
            self.type_error(_kind(doc), "%s.vfHealthFile" % _PKG)
            return version, records
        for key, value in _fields(doc):
            if key == "version":
                version = self.int(value, "vfHealthFile", (key,), version)
            elif key == "records":
                records = self.slice(value, "vfHealthRecord", self.record, "vfHealthFile", (key,), records)
        return version, records


def parse_store(data):
    """Bytes of ``vf-health.json`` -> ``{address: Record}``; raises StoreError (§1.3 order)."""
    try:
        doc = json.loads(data.decode("utf-8") if isinstance(data, bytes) else data, parse_float=_FloatText)
    except ValueError as err:
        raise StoreError("unmarshal VF health state: %s" % err)
    # The legacy L0 file is a bare array: a current build cannot unmarshal it into vfHealthFile.
    decoder = _GoUnmarshal()
    version, records = decoder.file(doc)
    if decoder.saved is not None:
        raise StoreError("unmarshal VF health state: %s" % decoder.saved)
    if version != 1:
        raise StoreError("validate VF health state: unsupported version %d" % version)
    if records is None:
        raise StoreError("validate VF health state: expected a records array")
    out = {}
    for index, record in enumerate(records):
        where = "validate VF health state record %d" % index
        if not ADDRESS_RE.match(record.vf_address):
            raise StoreError("%s: invalid VF address %s" % (where, json.dumps(record.vf_address)))
        if record.quarantined_at is not None and record.quarantined_at.is_zero():
            raise StoreError("%s: missing quarantine timestamp" % where)
        if record.quarantined_at is None and not record.failures:
            raise StoreError("%s: neither quarantined nor any recorded failures" % where)
        seen = set()
        for findex, (instance_id, assigned_at, reported_at) in enumerate(record.failures):
            if reported_at is None or reported_at.is_zero():
                raise StoreError("%s failure %d: missing report timestamp" % (where, findex))
            if (instance_id, assigned_at) in seen:
                raise StoreError("%s: duplicate failure for instance %s assigned at %s"
                                 % (where, json.dumps(instance_id), json.dumps(assigned_at)))
            seen.add((instance_id, assigned_at))
        if record.vf_address in out:
            raise StoreError("%s: duplicate VF address %s" % (where, json.dumps(record.vf_address)))
        out[record.vf_address] = record
    return out


def serialize(records):
    """The file's bytes as hypeman writes them (§1.2, §1.7)."""
    doc = {"version": 1, "records": [records[a].to_json() for a in sorted(records)]}
    return go_json(doc).encode("utf-8")


class VFHealthStore(object):
    """The in-memory store of a running hypeman: loaded once, overwritten from memory."""

    def __init__(self, path, threshold=DEFAULT_THRESHOLD, now=GoTime.now):
        self.path = path
        self.threshold = threshold
        self.now = now
        self.records = {}
        self.load_err = None
        self.persist_err = None
        self.loaded = False
        self.load()

    # -- §1.3 / §1.4 ---------------------------------------------------------
    def load(self):
        """Read the file; on success re-evaluate the threshold (and rewrite when it quarantined)."""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
        except (IOError, OSError) as err:
            if err.errno == errno.ENOENT:
                self.records, self.load_err, self.loaded = {}, None, True
                return
            self.load_err = "read VF health state: %s" % _os_error(err, self.path)
            return
        try:
            records = parse_store(data)
        except StoreError as err:
            self.load_err = str(err)
            return
        self.records, self.load_err, self.loaded = records, None, True
        changed = False
        for record in records.values():
            if record.quarantined_at is None and len(record.failures) >= self.threshold:
                record.quarantined_at = self.now()
                changed = True
        if changed:
            try:
                self._write()
            except StoreError as err:
                # The quarantine stays in memory; placement closes until a write succeeds.
                self.persist_err = str(err)

    def unavailable_reason(self):
        """None when usable, else hypeman's reason (after retrying a failed load/write)."""
        if self.load_err is not None:
            self.load()
        if self.load_err is None and self.persist_err is not None:
            try:
                self._write()
                self.persist_err = None
            except StoreError as err:
                self.persist_err = str(err)
        err = self.load_err or self.persist_err
        return None if err is None else "VF health state unavailable: %s" % err

    def quarantined(self):
        return sorted(a for a, r in self.records.items() if r.quarantined_at is not None)

    # -- §1.5 -----------------------------------------------------------------
    def report_failure(self, vf_address, instance_id, assigned_at):
        """ReportVFInitFailure: returns ``(outcome, failure_count)``; raises StoreError."""
        reason = self.unavailable_reason()
        if reason:
            raise StoreError(reason)
        if not ADDRESS_RE.match(vf_address or ""):
            raise StoreError("invalid VF address %s" % json.dumps(vf_address))
        record = self.records.get(vf_address)
        if record is not None and record.quarantined_at is not None:
            return "unchanged", len(record.failures)
        if record is not None and any(f[0] == instance_id and f[1] == assigned_at for f in record.failures):
            return "unchanged", len(record.failures)
        before = copy.deepcopy(self.records)
        if record is None:
            record = self.records[vf_address] = Record(vf_address)
        now = self.now()
        record.failures.append((instance_id, assigned_at, now))
        outcome = "recorded"
        if len(record.failures) >= self.threshold:
            record.quarantined_at = now
            outcome = "quarantined"
        self._persist(before)
        return outcome, len(record.failures)

    # -- §1.6 -----------------------------------------------------------------
    def report_success(self, vf_address, instance_id, assigned_at):
        """ReportVFInitSuccess: returns ``(cleared, rescinded)``; raises StoreError."""
        reason = self.unavailable_reason()
        if reason:
            raise StoreError(reason)
        record = self.records.get(vf_address)
        if record is None or not record.failures:
            return 0, False
        matches = [i for i, f in enumerate(record.failures) if f[0] == instance_id and f[1] == assigned_at]
        if not matches:
            return 0, False
        index = matches[0]
        quarantined = record.quarantined_at is not None
        if quarantined and index != len(record.failures) - 1:
            return 0, False
        before = copy.deepcopy(self.records)
        record.failures = record.failures[index + 1:]
        rescinded = False
        if not record.failures:
            del self.records[vf_address]
            rescinded = quarantined
        self._persist(before)
        return index + 1, rescinded

    # -- §1.7 -----------------------------------------------------------------
    def _persist(self, before):
        try:
            self._write()
        except _BeforeRename as err:
            self.records = before  # rolled back; the report is counted again next time
            raise StoreError(str(err))
        except StoreError as err:
            self.persist_err = str(err)  # visible on disk already; latched
            raise

    def _write(self):
        data = serialize(self.records)
        gpu_dir = os.path.dirname(self.path)
        tmp = os.path.join(gpu_dir, TMP_NAME)
        try:
            if not os.path.isdir(gpu_dir):
                os.makedirs(gpu_dir, 0o755)
            _fsync_dir(os.path.dirname(gpu_dir))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, self.path)
        except (IOError, OSError) as err:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise _BeforeRename("write VF health state: %s" % _os_error(err, self.path))
        try:
            _fsync_dir(gpu_dir)
        except (IOError, OSError) as err:
            raise StoreError("sync VF health state dir: %s" % _os_error(err, gpu_dir))


class _BeforeRename(StoreError):
    pass


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _os_error(err, path):
    return "open %s: %s" % (getattr(err, "filename", None) or path, (err.strerror or str(err)).lower())
