# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Go ``time.Time`` semantics for hypeman's timestamps (standard library only).

hypeman writes timestamps with Go's ``time.Time`` JSON encoding (RFC 3339 with
nanoseconds) and reads them with Go's RFC 3339 JSON decoding. Python's
``datetime`` only has microseconds and parses differently, so this module
reimplements the parts we need with nanosecond precision:

* :func:`parse_rfc3339` accepts exactly what ``time.Time.UnmarshalJSON`` accepts
  (Go's ``time.Parse(time.RFC3339, ...)``, which is more lenient than RFC 3339:
  a one-digit hour, a comma before the fraction, more than nine fraction
  digits (truncated), offsets up to ``+24:00``) and raises ``ValueError`` with
  Go's message for everything else.
* :func:`format_rfc3339nano` is Go's ``time.RFC3339Nano`` layout.
* A parsed time keeps the UTC offset it was written with, as Go does, so a
  re-marshalled value keeps its text (modulo Go's canonical form).
"""

from __future__ import annotations

import re
import time

RFC3339_LAYOUT = "2006-01-02T15:04:05Z07:00"

_SECONDS_PER_DAY = 86400
# Seconds from 0001-01-01T00:00:00Z (Go's zero instant) to the Unix epoch.
_ZERO_UNIX = -62135596800


def _is_leap(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in(month, year):
    if month == 2:
        return 29 if _is_leap(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year, month, day):
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, incl. 0)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    mp = (month + 9) % 12
    doy = (153 * mp + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(days):
    days += 719468
    era = days // 146097
    doe = days - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    year = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return year + (month <= 2), month, day


class GoTime(object):
    """An instant with nanosecond precision plus the UTC offset it is shown in.

    ``sec`` is Unix seconds, ``nsec`` is 0..999999999, ``offset`` is seconds
    east of UTC. Comparison and hashing use the instant only (Go's
    ``Time.Equal``/``Before``), so a value written as ``+02:00`` equals the same
    instant written as ``Z``.
    """

    __slots__ = ("_sec", "_nsec", "_offset", "_text")

    def __init__(self, sec, nsec=0, offset=0, _text=None):
        sec += nsec // 1000000000
        nsec %= 1000000000
        object.__setattr__(self, "_sec", int(sec))
        object.__setattr__(self, "_nsec", int(nsec))
        object.__setattr__(self, "_offset", int(offset))
        # Cached RFC3339Nano text; only ever set to the exact canonical form.
        object.__setattr__(self, "_text", _text)

    def __setattr__(self, name, value):
        raise AttributeError("GoTime is immutable")

    @property
    def sec(self):
        """Unix seconds of the instant."""
        return self._sec

    @property
    def nsec(self):
        """Nanoseconds within the second, 0..999999999."""
        return self._nsec

    @property
    def offset(self):
        """UTC offset (seconds east) the time is written with."""
        return self._offset

    def _key(self):
        return (self._sec, self._nsec)

    def __eq__(self, other):
        if not isinstance(other, GoTime):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other):
        if not isinstance(other, GoTime):
            return NotImplemented
        return self._key() != other._key()

    def __lt__(self, other):
        if not isinstance(other, GoTime):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other):
        if not isinstance(other, GoTime):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other):
        if not isinstance(other, GoTime):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other):
        if not isinstance(other, GoTime):
            return NotImplemented
        return self._key() >= other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        try:
            text = format_rfc3339nano(self)
        except ValueError:
            text = "sec=%d nsec=%d offset=%d" % (self._sec, self._nsec, self._offset)
        return "GoTime(%s)" % text

    def __str__(self):
        return format_rfc3339nano(self)


ZERO = GoTime(_ZERO_UNIX, 0, 0)


def is_zero(value):
    """True for Go's zero instant 0001-01-01T00:00:00Z, whatever the offset."""
    return value.sec == _ZERO_UNIX and value.nsec == 0


def to_utc(value):
    """The same instant shown in UTC (Go's ``t.UTC()``)."""
    return GoTime(value.sec, value.nsec, 0)


def utc_now():
    """The current time in UTC with nanoseconds (Go's ``time.Now().UTC()``)."""
    now = time.time_ns()
    return GoTime(now // 1000000000, now % 1000000000, 0)


def from_unix_ns(nanoseconds, offset=0):
    """A time from Unix nanoseconds (e.g. ``os.stat().st_mtime_ns``)."""
    return GoTime(nanoseconds // 1000000000, nanoseconds % 1000000000, offset)


def to_unix_ns(value):
    """Unix nanoseconds of the instant."""
    return value.sec * 1000000000 + value.nsec


# --- parsing -----------------------------------------------------------------


def _go_quote(text):
    """Go's ``time.quote``: non-ASCII and control bytes as ``\\xNN``."""
    out = ['"']
    for byte in text.encode("utf-8", "surrogateescape"):
        if byte >= 0x80 or byte < 0x20:
            out.append("\\x%02x" % byte)
        else:
            char = chr(byte)
            if char in '"\\':
                out.append("\\")
            out.append(char)
    out.append('"')
    return "".join(out)


class _ParseFailure(Exception):
    pass


def _parse_error(value, layout_elem, value_elem, message=""):
    if message:
        return ValueError("parsing time %s%s" % (_go_quote(value), message))
    return ValueError(
        "parsing time %s as %s: cannot parse %s as %s"
        % (_go_quote(value), _go_quote(RFC3339_LAYOUT), _go_quote(value_elem), _go_quote(layout_elem))
    )


def _isdigit(text, idx):
    return idx < len(text) and "0" <= text[idx] <= "9"


def _getnum(text, fixed):
    """Go's ``getnum``: one or two leading digits (exactly two when fixed)."""
    if not _isdigit(text, 0):
        raise _ParseFailure()
    if not _isdigit(text, 1):
        if fixed:
            raise _ParseFailure()
        return int(text[0]), text[1:]
    return int(text[0:2]), text[2:]


# The canonical UTC form hypeman writes: decoded without the general parser. The
# fields' ranges are in the pattern; anything else (also a day past its month's
# end) goes to the general parser, which words Go's error.
_FAST_RE = re.compile(r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                      r"(?:\.([0-9]{1,9}))?Z\Z")
_DAYS_CACHE = {}  # "YYYY-MM-DD" -> days since the epoch, or None past the month's end
_NSEC_SCALE = (1, 100000000, 10000000, 1000000, 100000, 10000, 1000, 100, 10, 1)
_new_object = object.__new__
_set_sec = GoTime.__dict__["_sec"].__set__
_set_nsec = GoTime.__dict__["_nsec"].__set__
_set_offset = GoTime.__dict__["_offset"].__set__
_set_text = GoTime.__dict__["_text"].__set__


def parse_canonical(text):
    """``text`` (a str) in the UTC form hypeman writes, parsed as :func:`parse_rfc3339`
    does; None for any other text, valid or not (then that decides)."""
    match = _FAST_RE.match(text)
    if match is None:
        return None
    date = text[:10]
    days = _DAYS_CACHE.get(date, False)
    if days is False:
        year, month, day = int(text[0:4]), int(text[5:7]), int(text[8:10])
        days = _days_from_civil(year, month, day) if day <= _days_in(month, year) else None
        if len(_DAYS_CACHE) < 4096:  # a store's times share few days; hostile ones must not grow it
            _DAYS_CACHE[date] = days
    if days is None:
        return None  # let the general parser produce Go's message
    fraction = match.group(1)
    value = _new_object(GoTime)  # GoTime's fields set directly: this runs for every time in a store
    _set_sec(value, days * _SECONDS_PER_DAY + int(text[11:13]) * 3600 + int(text[14:16]) * 60 + int(text[17:19]))
    _set_offset(value, 0)
    if fraction is None:
        _set_nsec(value, 0)
        _set_text(value, text)
    else:
        _set_nsec(value, int(fraction) * _NSEC_SCALE[len(fraction)])
        _set_text(value, None if fraction[-1] == "0" else text)  # only the canonical text is cached
    return value


def parse_rfc3339(text):
    """Parse ``text`` exactly as Go's ``time.Time.UnmarshalJSON`` does.

    ``text`` is the content of the JSON string *as written in the file*
    (Go does not unescape it, so any backslash makes it invalid). Returns a
    :class:`GoTime` keeping the written offset; raises ``ValueError`` with
    Go's ``parsing time ...`` message on anything Go rejects.
    """
    if not isinstance(text, str):
        raise ValueError("Time.UnmarshalJSON: input is not a JSON string")
    fast = parse_canonical(text)
    if fast is not None:
        return fast
    return _parse_general(text)


def _parse_general(text):
    """Go's RFC 3339 parsing, step by step, for any text (the canonical form too)."""
    original = text
    value = text

    def literal(value, char):
        if not value or value[0] != char:
            raise _parse_error(original, char, value)
        return value[1:]

    # Year: exactly four digits.
    if len(value) < 4 or not _isdigit(value, 0) or not value[:4].isdigit() or not value[:4].isascii():
        raise _parse_error(original, "2006", value)
    year = int(value[:4])
    value = value[4:]
    value = literal(value, "-")

    def number(value, elem, fixed, low, high, name):
        try:
            num, rest = _getnum(value, fixed)
        except _ParseFailure:
            raise _parse_error(original, elem, value)
        if not low <= num <= high:
            raise _parse_error(original, elem, rest, ": %s out of range" % name)
        return num, rest

    month, value = number(value, "01", True, 1, 12, "month")
    value = literal(value, "-")
    try:
        day, value = _getnum(value, True)
    except _ParseFailure:
        raise _parse_error(original, "02", value)
    value = literal(value, "T")
    hour, value = number(value, "15", False, 0, 23, "hour")
    value = literal(value, ":")
    minute, value = number(value, "04", True, 0, 59, "minute")
    value = literal(value, ":")
    second, value = number(value, "05", True, 0, 59, "second")

    nsec = 0
    # Go accepts a fraction after the seconds even though the layout has none.
    if len(value) >= 2 and value[0] in ".," and _isdigit(value, 1):
        end = 2
        while _isdigit(value, end):
            end += 1
        digits = value[1:min(end, 10)]
        nsec = int(digits) * 10 ** (9 - len(digits))
        value = value[end:]

    # Zone: "Z" or "±hh:mm" (Go's lenient range allows hh <= 24, mm <= 60).
    if value[:1] == "Z":
        offset = 0
        value = value[1:]
    else:
        if len(value) < 6 or value[3] != ":":
            raise _parse_error(original, "Z07:00", value)
        sign, zhour, zmin, rest = value[0], value[1:3], value[4:6], value[6:]
        try:
            zone_hours = _getnum(zhour, True)[0]
            zone_minutes = _getnum(zmin, True)[0]
        except _ParseFailure:
            raise _parse_error(original, "Z07:00", value)
        if zone_minutes > 60:
            raise _parse_error(original, "Z07:00", rest, ": time zone offset minute out of range")
        if zone_hours > 24:
            raise _parse_error(original, "Z07:00", rest, ": time zone offset hour out of range")
        offset = (zone_hours * 60 + zone_minutes) * 60
        if sign == "-":
            offset = -offset
        elif sign != "+":
            raise _parse_error(original, "Z07:00", value)
        value = rest
    if value:
        raise _parse_error(original, "", value, ": extra text: %s" % _go_quote(value))
    if day < 1 or day > _days_in(month, year):
        raise _parse_error(original, "", value, ": day out of range")

    days = _days_from_civil(year, month, day)
    sec = days * _SECONDS_PER_DAY + hour * 3600 + minute * 60 + second - offset
    return GoTime(sec, nsec, offset)


# --- formatting ----------------------------------------------------------------


def _fields(value):
    local = value.sec + value.offset
    days, secs = divmod(local, _SECONDS_PER_DAY)
    year, month, day = _civil_from_days(days)
    hour, rem = divmod(secs, 3600)
    minute, second = divmod(rem, 60)
    return year, month, day, hour, minute, second


def format_rfc3339nano(value, strict=True):
    """Go's ``t.Format(time.RFC3339Nano)`` as used by ``MarshalJSON``.

    Fraction digits with trailing zeros trimmed (none when zero), ``Z`` when
    the offset is 0, else ``±hh:mm``. Raises ``ValueError`` where Go's
    ``MarshalJSON`` fails (year outside 0..9999, offset hour >= 24).
    ``strict=False`` is plain ``t.Format``, which never fails: how a time Go
    loads but cannot marshal (``+24:00``) reads, for reports.
    """
    if value._text is not None:
        return value._text
    year, month, day, hour, minute, second = _fields(value)
    if strict and not 0 <= year <= 9999:
        raise ValueError("Time.MarshalJSON: year outside of range [0,9999]")
    year_text = "-%04d" % -year if year < 0 else "%04d" % year
    parts = ["%s-%02d-%02dT%02d:%02d:%02d" % (year_text, month, day, hour, minute, second)]
    if value.nsec:
        parts.append(("." + "%09d" % value.nsec).rstrip("0"))
    if value.offset == 0:
        parts.append("Z")
    else:
        zone = value.offset // 60 if value.offset > 0 else -((-value.offset) // 60)
        sign = "+"
        if zone < 0:
            sign, zone = "-", -zone
        if strict and zone // 60 >= 24:
            raise ValueError("Time.MarshalJSON: timezone hour outside of range [0,23]")
        parts.append("%s%02d:%02d" % (sign, zone // 60, zone % 60))
    return "".join(parts)


def format_utc_rfc3339nano(value):
    """The instant in UTC, RFC3339Nano: how hypeman renders ``assigned_at``."""
    return format_rfc3339nano(to_utc(value))
