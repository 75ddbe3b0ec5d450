# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_gotime: Go's RFC 3339 JSON decoding and RFC3339Nano formatting, to the nanosecond."""

from __future__ import annotations

import calendar
import datetime
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime
from ansible_collections.hypeman.vgpu.plugins.module_utils._gotime import (
    GoTime, format_rfc3339nano, format_utc_rfc3339nano, is_zero, parse_rfc3339, to_utc, utc_now,
)


def unix(text):
    """Unix seconds of a whole-second UTC time, computed independently with the stdlib."""
    return calendar.timegm(datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timetuple())


@pytest.mark.parametrize("text", [
    "2026-08-20T15:04:05.123456789Z",
    "2026-08-22T00:00:00Z",
    "2026-08-21T09:00:30.000001Z",
    "2026-08-20T15:00:42.5Z",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999Z",
    "2024-02-29T12:00:00Z",
    "2026-08-20T15:04:05+02:00",
    "2026-08-20T15:04:05.1-07:30",
])
def test_canonical_texts_round_trip(text):
    assert format_rfc3339nano(parse_rfc3339(text)) == text


def test_instant_is_exact_to_the_nanosecond():
    parsed = parse_rfc3339("2026-08-20T15:04:05.123456789Z")
    assert (parsed.sec, parsed.nsec, parsed.offset) == (unix("2026-08-20T15:04:05"), 123456789, 0)


def test_offset_is_kept_but_instant_is_utc():
    parsed = parse_rfc3339("2026-08-20T17:04:05.5+02:00")
    assert parsed.offset == 7200
    assert parsed.sec == unix("2026-08-20T15:04:05")
    assert parsed == parse_rfc3339("2026-08-20T15:04:05.5Z")
    assert format_rfc3339nano(to_utc(parsed)) == "2026-08-20T15:04:05.5Z"
    assert format_utc_rfc3339nano(parsed) == "2026-08-20T15:04:05.5Z"


@pytest.mark.parametrize("text, expected", [
    ("2026-08-20T15:04:05.120Z", "2026-08-20T15:04:05.12Z"),     # trailing zeros trimmed
    ("2026-08-20T15:04:05.000000000Z", "2026-08-20T15:04:05Z"),  # no fraction when zero
    ("2026-08-20T15:04:05.1234567891234Z", "2026-08-20T15:04:05.123456789Z"),  # >9 digits truncated
    ("2026-08-20T15:04:05.9999999999Z", "2026-08-20T15:04:05.999999999Z"),     # truncated, not rounded
    ("2026-08-20T15:04:05,5Z", "2026-08-20T15:04:05.5Z"),        # Go accepts a comma
    ("2026-08-20T5:04:05Z", "2026-08-20T05:04:05Z"),             # and a one-digit hour
    ("2026-08-20T15:04:05-00:00", "2026-08-20T15:04:05Z"),       # zero offset prints Z
    ("2026-08-20T15:04:05+00:00", "2026-08-20T15:04:05Z"),
])
def test_go_lenient_forms_and_canonical_output(text, expected):
    assert format_rfc3339nano(parse_rfc3339(text)) == expected


@pytest.mark.parametrize("text, message", [
    ("2026-13-01T00:00:00Z", 'parsing time "2026-13-01T00:00:00Z": month out of range'),
    ("2026-00-01T00:00:00Z", 'parsing time "2026-00-01T00:00:00Z": month out of range'),
    ("2026-02-29T00:00:00Z", 'parsing time "2026-02-29T00:00:00Z": day out of range'),
    ("2026-04-31T00:00:00Z", 'parsing time "2026-04-31T00:00:00Z": day out of range'),
    ("2026-08-20T24:00:00Z", 'parsing time "2026-08-20T24:00:00Z": hour out of range'),
    ("2026-08-20T15:60:00Z", 'parsing time "2026-08-20T15:60:00Z": minute out of range'),
    ("2026-08-20T15:04:60Z", 'parsing time "2026-08-20T15:04:60Z": second out of range'),
    ("2026-08-20T15:04:05+25:00", 'parsing time "2026-08-20T15:04:05+25:00": time zone offset hour out of range'),
    ("2026-08-20T15:04:05+05:61", 'parsing time "2026-08-20T15:04:05+05:61": time zone offset minute out of range'),
    ("2026-08-20T15:04:05", 'parsing time "2026-08-20T15:04:05" as "2006-01-02T15:04:05Z07:00": '
                            'cannot parse "" as "Z07:00"'),
    ("2026-08-20 15:04:05Z", 'parsing time "2026-08-20 15:04:05Z" as "2006-01-02T15:04:05Z07:00": '
                             'cannot parse " 15:04:05Z" as "T"'),
    ("2026-08-20T15:04:05z", 'parsing time "2026-08-20T15:04:05z" as "2006-01-02T15:04:05Z07:00": '
                             'cannot parse "z" as "Z07:00"'),
    ("2026-08-20T15:04:05.Z", 'parsing time "2026-08-20T15:04:05.Z" as "2006-01-02T15:04:05Z07:00": '
                              'cannot parse ".Z" as "Z07:00"'),
    ("2026-08-20T15:04:05Zjunk", 'parsing time "2026-08-20T15:04:05Zjunk": extra text: "junk"'),
    ("26-08-20T15:04:05Z", 'parsing time "26-08-20T15:04:05Z" as "2006-01-02T15:04:05Z07:00": '
                           'cannot parse "26-08-20T15:04:05Z" as "2006"'),
    ("2026-8-20T15:04:05Z", 'parsing time "2026-8-20T15:04:05Z" as "2006-01-02T15:04:05Z07:00": '
                            'cannot parse "8-20T15:04:05Z" as "01"'),
    ("", 'parsing time "" as "2006-01-02T15:04:05Z07:00": cannot parse "" as "2006"'),
    # Go parses the raw JSON bytes: an escape is never unescaped first.
    ("2026-08-20T15:04:05\\u005a", 'parsing time "2026-08-20T15:04:05\\\\u005a" as "2006-01-02T15:04:05Z07:00": '
                                   'cannot parse "\\\\u005a" as "Z07:00"'),
    ("\u00e92026", 'parsing time "\\xc3\\xa92026" as "2006-01-02T15:04:05Z07:00": '
                   'cannot parse "\\xc3\\xa92026" as "2006"'),
])
def test_rejections_carry_go_messages(text, message):
    with pytest.raises(ValueError) as err:
        parse_rfc3339(text)
    assert str(err.value) == message


def test_non_string_is_rejected_like_time_unmarshal_json():
    with pytest.raises(ValueError) as err:
        parse_rfc3339(5)
    assert str(err.value) == "Time.UnmarshalJSON: input is not a JSON string"


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00Z", "0001-01-01T01:00:00+01:00", "0000-12-31T23:00:00-01:00"])
def test_zero_instant_whatever_the_offset(text):
    assert is_zero(parse_rfc3339(text))


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00.000000001Z", "0001-01-01T00:00:00+01:00", "2026-01-01T00:00:00Z"])
def test_not_zero(text):
    assert not is_zero(parse_rfc3339(text))


def test_comparison_is_by_instant():
    early = parse_rfc3339("2026-08-20T15:04:05.000000001Z")
    late = parse_rfc3339("2026-08-20T15:04:05.000000002Z")
    assert early < late and late > early and early <= late and early != late
    assert parse_rfc3339("2026-08-20T16:04:05+01:00") == parse_rfc3339("2026-08-20T15:04:05Z")
    assert len({parse_rfc3339("2026-08-20T16:04:05+01:00"), parse_rfc3339("2026-08-20T15:04:05Z")}) == 1


def test_values_are_immutable():
    value = parse_rfc3339("2026-08-20T15:04:05Z")
    with pytest.raises(AttributeError):
        value.sec = 0


def test_utc_now_has_nanoseconds_and_utc(monkeypatch):
    monkeypatch.setattr(_gotime.time, "time_ns", lambda: 1788177600123456789)
    now = utc_now()
    assert (now.sec, now.nsec, now.offset) == (1788177600, 123456789, 0)
    assert format_rfc3339nano(now) == "2026-08-31T12:00:00.123456789Z"


def test_year_zero_and_far_dates_format():
    assert format_rfc3339nano(parse_rfc3339("0000-01-01T00:00:00Z")) == "0000-01-01T00:00:00Z"
    assert format_rfc3339nano(GoTime(unix("2000-03-01T00:00:00") - 1)) == "2000-02-29T23:59:59Z"


def test_marshal_failures_like_go():
    # Go parses offsets up to 24:00 but MarshalJSON refuses them, so hypeman's write would fail.
    with pytest.raises(ValueError):
        format_rfc3339nano(parse_rfc3339("2026-08-20T15:04:05+24:00"))
    with pytest.raises(ValueError):
        format_rfc3339nano(to_utc(parse_rfc3339("0000-01-01T00:00:00+01:00")))  # year -1 in UTC


def test_non_strict_format_is_gos_format_which_never_fails():
    assert format_rfc3339nano(parse_rfc3339("2026-08-20T15:04:05.5+24:00"), strict=False) == "2026-08-20T15:04:05.5+24:00"
    assert format_rfc3339nano(parse_rfc3339("2026-08-20T15:04:05-23:60"), strict=False) == "2026-08-20T15:04:05-24:00"
    assert format_rfc3339nano(to_utc(parse_rfc3339("0000-01-01T00:00:00+01:00")), strict=False) == (
        "-0001-12-31T23:00:00Z")
    assert format_rfc3339nano(parse_rfc3339("2026-08-20T15:04:05Z"), strict=False) == "2026-08-20T15:04:05Z"


# --- the canonical-form shortcut against the general parser ---------------------------

_FUZZ = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"


def _time_like():
    """Texts near the canonical form: every field's edges, leap days, fractions, other zones."""
    digits = st.integers(0, 99).map("%02d".format)
    year = st.one_of(st.sampled_from(["0000", "0001", "1900", "2000", "2024", "2026", "9999"]),
                     st.integers(0, 9999).map("%04d".format))
    fraction = st.one_of(st.just(""), st.text(alphabet="0123456789", min_size=1, max_size=11).map(lambda d: "." + d))
    zone = st.sampled_from(["Z", "Z", "Z", "z", "+00:00", "+02:00", ""])
    return st.builds(lambda y, mo, d, h, mi, s, f, z: "%s-%s-%sT%s:%s:%s%s%s" % (y, mo, d, h, mi, s, f, z),
                     year, digits, digits, digits, digits, digits, fraction, zone)


@settings(max_examples=3000 if _FUZZ else 300, deadline=None, derandomize=not _FUZZ, database=None)
@given(_time_like())
def test_canonical_shortcut_parses_as_go_parses(text):
    fast = _gotime.parse_canonical(text)
    try:
        general = _gotime._parse_general(text)  # pylint: disable=protected-access
    except ValueError:
        assert fast is None
        return
    if fast is not None:
        assert (fast.sec, fast.nsec, fast.offset) == (general.sec, general.nsec, general.offset)
        assert _gotime.format_rfc3339nano(fast, strict=False) == _gotime.format_rfc3339nano(general, strict=False)
    else:
        # only other zones and fractions past nanoseconds (Go truncates them) take the long way
        assert not text.endswith("Z") or ("." in text and len(text.rsplit(".", 1)[1]) > 10)
