# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_store: hypeman's load/validation rules and texts, report semantics, exact serialization."""

from __future__ import annotations

import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _store, _store_write
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._gotime import parse_rfc3339
from ansible_collections.hypeman.vgpu.plugins.module_utils._store import (
    Failure, HealthStore, Record, load_store, parse_store_bytes,
)

T1 = parse_rfc3339("2026-08-20T15:01:00Z")
T2 = parse_rfc3339("2026-08-21T09:00:30Z")
T3 = parse_rfc3339("2026-08-21T09:00:30.000001Z")

# The example of docs/hypeman-interface.md §1.2, as hypeman itself would write it.
REFERENCE_EXAMPLE = (
    b'{\n'
    b'  "version": 1,\n'
    b'  "records": [\n'
    b'    {\n'
    b'      "vf_address": "0000:82:00.4",\n'
    b'      "failures": [\n'
    b'        {\n'
    b'          "instance_id": "tz4a98xxat96iws9zmbrgj3a",\n'
    b'          "assigned_at": "2026-08-20T15:00:00.123456789Z",\n'
    b'          "reported_at": "2026-08-20T15:00:42.5Z"\n'
    b'        }\n'
    b'      ]\n'
    b'    },\n'
    b'    {\n'
    b'      "vf_address": "0000:e3:00.4",\n'
    b'      "failures": [\n'
    b'        {\n'
    b'          "instance_id": "a1",\n'
    b'          "assigned_at": "2026-08-20T15:00:00Z",\n'
    b'          "reported_at": "2026-08-20T15:01:00Z"\n'
    b'        },\n'
    b'        {\n'
    b'          "instance_id": "b2",\n'
    b'          "assigned_at": "2026-08-21T09:00:00Z",\n'
    b'          "reported_at": "2026-08-21T09:00:30Z"\n'
    b'        }\n'
    b'      ],\n'
    b'      "quarantined_at": "2026-08-21T09:00:30.000001Z"\n'
    b'    },\n'
    b'    {\n'
    b'      "vf_address": "0000:e3:00.5",\n'
    b'      "quarantined_at": "2026-08-22T00:00:00Z"\n'
    b'    }\n'
    b'  ]\n'
    b'}'
)

# The same content as docs/hypeman-interface.md prints it (compact failures, other order).
REFERENCE_AS_PRINTED = b'''{
  "version": 1,
  "records": [
    {"vf_address": "0000:e3:00.5", "quarantined_at": "2026-08-22T00:00:00Z"},
    {
      "vf_address": "0000:82:00.4",
      "failures": [
        {"instance_id": "tz4a98xxat96iws9zmbrgj3a", "assigned_at": "2026-08-20T15:00:00.123456789Z",
         "reported_at": "2026-08-20T15:00:42.500Z"}
      ]
    },
    {
      "vf_address": "0000:e3:00.4",
      "failures": [
        {"instance_id": "a1", "assigned_at": "2026-08-20T15:00:00Z", "reported_at": "2026-08-20T15:01:00Z"},
        {"instance_id": "b2", "assigned_at": "2026-08-21T09:00:00Z", "reported_at": "2026-08-21T09:00:30Z"}
      ],
      "quarantined_at": "2026-08-21T09:00:30.000001Z"
    }
  ]
}
'''


def store_of(data):
    return parse_store_bytes("/x/gpu/vf-health.json", data)


def record_json(address="0000:82:00.4", extra='"quarantined_at":"2026-01-01T00:00:00Z"'):
    return '{"vf_address":"%s",%s}' % (address, extra)


def doc(*records):
    return ('{"version":1,"records":[%s]}' % ",".join(records)).encode("utf-8")


# --- addresses ---------------------------------------------------------------------


# --- loading: valid forms and Go decoding details --------------------------------------


def test_reference_example_loads():
    store = store_of(REFERENCE_AS_PRINTED)
    assert (store.format, store.valid, store.error) == ("v1", True, None)
    assert sorted(store.records) == ["0000:82:00.4", "0000:e3:00.4", "0000:e3:00.5"]
    assert store.quarantined() == ["0000:e3:00.4", "0000:e3:00.5"]
    assert store.records["0000:e3:00.4"].failures == (
        Failure("a1", "2026-08-20T15:00:00Z", T1),
        Failure("b2", "2026-08-21T09:00:00Z", T2),
    )
    assert store.records["0000:e3:00.4"].quarantined_at == T3
    assert store.failure_count("0000:82:00.4") == 1
    assert store.failure_count("0000:00:00.0") == 0


def test_missing_file_is_an_empty_valid_store(tmp_path):
    store = load_store(str(tmp_path / "gpu" / "vf-health.json"))
    assert (store.exists, store.format, store.valid, store.error, store.records) == (False, "missing", True, None, {})


def test_empty_records_array_is_valid():
    store = store_of(b'{"version":1,"records":[]}')
    assert (store.format, store.valid, store.records) == ("v1", True, {})


def test_keys_match_case_insensitively_like_go():
    store = store_of(b'{"VERSION":1,"Records":[{"VF_Address":"0000:82:00.4","Quarantined_At":"2026-01-01T00:00:00Z"}]}')
    assert store.valid and store.quarantined() == ["0000:82:00.4"]


def test_go_folds_long_s_and_kelvin_sign_but_not_sharp_s():
    long_s = doc('{"vf_addre\u017fs":"0000:82:00.4","quarantined_at":"2026-01-01T00:00:00Z"}')
    assert store_of(long_s).valid
    # "\u00df" (sharp s) is not Go-equal to "ss": the key is unknown, so the failure has no instance id.
    sharp = doc('{"vf_address":"0000:82:00.4","failures":[{"instance_id":"a",'
                '"a\u00dfigned_at":"x","reported_at":"2026-01-01T00:00:00Z"}]}')
    assert store_of(sharp).records["0000:82:00.4"].failures[0].assigned_at == ""


def test_last_duplicate_key_wins():
    store = store_of(b'{"version":2,"version":1,"records":[' + record_json().encode() + b']}')
    assert store.valid


def test_unknown_keys_are_ignored_and_dropped_on_rewrite():
    data = doc('{"vf_address":"0000:82:00.4","note":{"deep":[1,2,{"x":null}]},'
               '"quarantined_at":"2026-01-01T00:00:00Z"}')[:-1] + b',"extra":true}'
    store = store_of(data)
    assert store.valid
    assert b"note" not in store.to_bytes() and b"extra" not in store.to_bytes()


def test_null_quarantined_at_is_not_quarantined():
    store = store_of(doc(record_json(extra='"failures":[{"reported_at":"2026-01-01T00:00:00Z"}],'
                                           '"quarantined_at":null')))
    assert store.valid and store.quarantined() == []


def test_repeated_records_key_reuses_elements_like_go():
    # Go decodes the second array into the first one's elements (issue 21092):
    # the record keeps the quarantine time the first array gave it.
    data = (b'{"version":1,"records":[' + record_json().encode() + b'],'
            b'"records":[{"vf_address":"0000:82:00.6"}]}')
    store = store_of(data)
    assert store.valid
    assert store.records["0000:82:00.6"].quarantined_at == parse_rfc3339("2026-01-01T00:00:00Z")


def test_escaped_strings_decode_like_go():
    store = store_of(doc('{"vf_address":"0000:82:00.\\u0034","failures":[{"instance_id":"\\ud800\\u00e9\\"",'
                         '"reported_at":"2026-01-01T00:00:00Z"}]}'))
    assert store.valid
    assert store.records["0000:82:00.4"].failures[0].instance_id == "\ufffd\u00e9\""


def test_invalid_utf8_becomes_replacement_characters():
    data = doc('{"vf_address":"0000:82:00.4","failures":[{"instance_id":"AB",'
               '"reported_at":"2026-01-01T00:00:00Z"}]}').replace(b"AB", b"A\xe2\x82B")
    store = store_of(data)
    assert store.records["0000:82:00.4"].failures[0].instance_id == "A\ufffd\ufffdB"


def test_offset_timestamps_load_and_keep_their_offset():
    store = store_of(doc(record_json(extra='"quarantined_at":"2026-01-01T02:00:00+02:00"')))
    assert store.records["0000:82:00.4"].quarantined_at == parse_rfc3339("2026-01-01T00:00:00Z")
    assert b'"quarantined_at": "2026-01-01T02:00:00+02:00"' in store.to_bytes()


# --- loading: every class of invalid store, hypeman's order and words --------------------


@pytest.mark.parametrize("data, fmt, error", [
    (b"", "invalid", "unmarshal VF health state: unexpected end of JSON input"),
    (b"not json", "invalid", "unmarshal VF health state: invalid character 'o' in literal null (expecting 'u')"),
    (b'{"version":1,"records":[]', "invalid", "unmarshal VF health state: unexpected end of JSON input"),
    (b'{"version":1,}', "invalid",
     "unmarshal VF health state: invalid character '}' looking for beginning of object key string"),
    (b'{"version" 1}', "invalid", "unmarshal VF health state: invalid character '1' after object key"),
    (b'{"version":1 "records":[]}', "invalid",
     "unmarshal VF health state: invalid character '\"' after object key:value pair"),
    (b'{"version":1,"records":[1 2]}', "invalid",
     "unmarshal VF health state: invalid character '2' after array element"),
    (b'{"version":1,"records":[,]}', "invalid",
     "unmarshal VF health state: invalid character ',' looking for beginning of value"),
    (b'{"version":1,"records":[]} {}', "invalid",
     "unmarshal VF health state: invalid character '{' after top-level value"),
    (b'{"version":1.}', "invalid",
     "unmarshal VF health state: invalid character '}' after decimal point in numeric literal"),
    (b'{"version":-}', "invalid", "unmarshal VF health state: invalid character '}' in numeric literal"),
    (b'{"version":1e}', "invalid",
     "unmarshal VF health state: invalid character '}' in exponent of numeric literal"),
    (b'{"version":1,"records":[],"x":"a\\q"}', "invalid",
     "unmarshal VF health state: invalid character 'q' in string escape code"),
    (b'{"version":1,"records":[],"x":"\\u12x4"}', "invalid",
     "unmarshal VF health state: invalid character 'x' in \\u hexadecimal character escape"),
    (b'{"version":1,"records":[],"x":"a\tb"}', "invalid",
     "unmarshal VF health state: invalid character '\\t' in string literal"),
    (b'{"version":NaN}', "invalid",
     "unmarshal VF health state: invalid character 'N' looking for beginning of value"),
    (b'{"version":tru}', "invalid",
     "unmarshal VF health state: invalid character '}' in literal true (expecting 'e')"),
    (b"1.", "invalid", "unmarshal VF health state: invalid character ' ' after decimal point in numeric literal"),
    (b"\xef\xbb\xbf{}", "invalid", "unmarshal VF health state: invalid character '\u00ef' looking for beginning of value"),
    (b"[]", "legacy", "unmarshal VF health state: json: cannot unmarshal array into Go value of type devices.vfHealthFile"),
    (b'[{"vf_address":"0000:82:00.4","wedge_count":1,"quarantined_at":"2026-01-01T00:00:00Z"}]', "legacy",
     "unmarshal VF health state: json: cannot unmarshal array into Go value of type devices.vfHealthFile"),
    (b'"x"', "invalid", "unmarshal VF health state: json: cannot unmarshal string into Go value of type devices.vfHealthFile"),
    (b"{}", "invalid", "validate VF health state: unsupported version 0"),
    (b"null", "invalid", "validate VF health state: unsupported version 0"),
    (b'{"version":2,"records":[]}', "invalid", "validate VF health state: unsupported version 2"),
    (b'{"version":null,"records":[]}', "invalid", "validate VF health state: unsupported version 0"),
    (b'{"version":"1","records":[]}', "invalid",
     "unmarshal VF health state: json: cannot unmarshal string into Go struct field vfHealthFile.version of type int"),
    (b'{"version":1.0,"records":[]}', "invalid",
     "unmarshal VF health state: json: cannot unmarshal number 1.0 into Go struct field vfHealthFile.version of type int"),
    (b'{"version":99999999999999999999,"records":[]}', "invalid",
     "unmarshal VF health state: json: cannot unmarshal number 99999999999999999999 into Go struct field "
     "vfHealthFile.version of type int"),
    (b'{"version":1}', "invalid", "validate VF health state: expected a records array"),
    (b'{"version":1,"records":null}', "invalid", "validate VF health state: expected a records array"),
    (b'{"version":1,"records":{}}', "invalid",
     "unmarshal VF health state: json: cannot unmarshal object into Go struct field vfHealthFile.records of type "
     "[]devices.vfHealthRecord"),
    (b'{"version":1,"records":[true]}', "invalid",
     "unmarshal VF health state: json: cannot unmarshal bool into Go struct field vfHealthFile.records of type "
     "devices.vfHealthRecord"),
    (doc('{"vf_address":5,"quarantined_at":"2026-01-01T00:00:00Z"}'), "invalid",
     "unmarshal VF health state: json: cannot unmarshal number into Go struct field "
     "vfHealthRecord.records.vf_address of type string"),
    (doc('{"vf_address":"0000:82:00.4","failures":[{"instance_id":5,"reported_at":"2026-01-01T00:00:00Z"}]}'),
     "invalid", "unmarshal VF health state: json: cannot unmarshal number into Go struct field "
                "vfInitFailure.records.failures.instance_id of type string"),
    (doc('{"vf_address":"0000:82:00.4","failures":{}}'), "invalid",
     "unmarshal VF health state: json: cannot unmarshal object into Go struct field vfHealthRecord.records.failures "
     "of type []devices.vfInitFailure"),
    (doc(record_json(extra='"quarantined_at":5')), "invalid",
     "unmarshal VF health state: Time.UnmarshalJSON: input is not a JSON string"),
    (doc(record_json(extra='"quarantined_at":"2026-13-01T00:00:00Z"')), "invalid",
     'unmarshal VF health state: parsing time "2026-13-01T00:00:00Z": month out of range'),
    (doc(record_json(extra='"quarantined_at":"2026-01-01T00:00:00\\u005a"')), "invalid",
     'unmarshal VF health state: parsing time "2026-01-01T00:00:00\\\\u005a" as "2006-01-02T15:04:05Z07:00": '
     'cannot parse "\\\\u005a" as "Z07:00"'),
    (doc(record_json("0000:82:00.A")), "invalid", 'validate VF health state record 0: invalid VF address "0000:82:00.A"'),
    (doc(record_json("0000:82:00.4\\n")), "invalid",
     'validate VF health state record 0: invalid VF address "0000:82:00.4\\n"'),
    (doc(record_json(), record_json("82:00.5")), "invalid", 'validate VF health state record 1: invalid VF address "82:00.5"'),
    (doc('{"quarantined_at":"2026-01-01T00:00:00Z"}'), "invalid", 'validate VF health state record 0: invalid VF address ""'),
    (doc(record_json(extra='"quarantined_at":"0001-01-01T00:00:00Z"')), "invalid",
     "validate VF health state record 0: missing quarantine timestamp"),
    (doc(record_json(extra='"quarantined_at":"0001-01-01T02:00:00+02:00"')), "invalid",
     "validate VF health state record 0: missing quarantine timestamp"),
    (doc('{"vf_address":"0000:82:00.4"}'), "invalid",
     "validate VF health state record 0: neither quarantined nor any recorded failures"),
    (doc(record_json(extra='"failures":[]')), "invalid",
     "validate VF health state record 0: neither quarantined nor any recorded failures"),
    (doc(record_json(extra='"failures":[{"instance_id":"a"}],"quarantined_at":"2026-01-01T00:00:00Z"')), "invalid",
     "validate VF health state record 0 failure 0: missing report timestamp"),
    (doc(record_json(extra='"failures":[{"instance_id":"a","reported_at":null}]')), "invalid",
     "validate VF health state record 0 failure 0: missing report timestamp"),
    (doc(record_json(extra='"failures":[{"instance_id":"a","assigned_at":"t","reported_at":"2026-01-01T00:00:00Z"},'
                           '{"instance_id":"a","assigned_at":"t","reported_at":"2026-01-02T00:00:00Z"}]')), "invalid",
     'validate VF health state record 0: duplicate failure for instance "a" assigned at "t"'),
    # hypeman's key is instance_id + NUL + assigned_at: these two collide in hypeman too.
    (doc(record_json(extra='"failures":[{"instance_id":"a\\u0000b","assigned_at":"c","reported_at":"2026-01-01T00:00:00Z"},'
                           '{"instance_id":"a","assigned_at":"b\\u0000c","reported_at":"2026-01-02T00:00:00Z"}]')),
     "invalid", 'validate VF health state record 0: duplicate failure for instance "a" assigned at "b\\x00c"'),
    (doc(record_json(), record_json()), "invalid", 'validate VF health state record 1: duplicate VF address "0000:82:00.4"'),
])
def test_invalid_stores(data, fmt, error):
    store = store_of(data)
    assert (store.format, store.valid, store.error, store.records) == (fmt, False, error, {})


def test_validation_runs_in_hypemans_order():
    # Record 0 has a zero quarantine time AND no failures: the timestamp check comes first.
    assert store_of(doc(record_json(extra='"quarantined_at":"0001-01-01T00:00:00Z"'))).error.endswith(
        "missing quarantine timestamp")
    # A bad address in record 1 is reported even though record 0 duplicates nothing yet.
    assert store_of(doc(record_json(), record_json("bad"))).error.endswith('record 1: invalid VF address "bad"')
    # A syntax error anywhere beats a type error earlier in the file (Go checks syntax first).
    assert store_of(b'{"version":"1","records":[}').error == (
        "unmarshal VF health state: invalid character '}' looking for beginning of value")
    # A time error is returned at once, even after an earlier (saved) type error.
    assert store_of(b'{"version":"1","records":[' + record_json(extra='"quarantined_at":1').encode() + b']}').error == (
        "unmarshal VF health state: Time.UnmarshalJSON: input is not a JSON string")


def test_unreadable_store_reports_hypemans_read_error(tmp_path):
    path = tmp_path / "vf-health.json"
    path.mkdir()
    store = load_store(str(path))
    assert (store.exists, store.format, store.valid) == (True, "invalid", False)
    assert store.error == "read VF health state: read %s: is a directory" % path


def test_read_error_other_than_missing(tmp_path):
    blocker = tmp_path / "gpu"
    blocker.write_text("a file where the directory should be")
    path = str(blocker / "vf-health.json")
    store = load_store(path)
    assert store.error == "read VF health state: open %s: not a directory" % path


# --- serialization: byte-exact -----------------------------------------------------------


def test_reference_example_serializes_exactly_as_hypeman():
    assert store_of(REFERENCE_AS_PRINTED).to_bytes() == REFERENCE_EXAMPLE
    assert store_of(REFERENCE_EXAMPLE).to_bytes() == REFERENCE_EXAMPLE


def test_empty_store_bytes():
    assert HealthStore("p").to_bytes() == b'{\n  "version": 1,\n  "records": []\n}'


def test_omitempty_fields():
    store = HealthStore("p", records={
        "0000:82:00.4": Record("0000:82:00.4", (Failure("", "", T1), Failure("i", "", T2), Failure("", "a", T3)), None)})
    assert store.to_bytes() == (
        b'{\n  "version": 1,\n  "records": [\n    {\n      "vf_address": "0000:82:00.4",\n      "failures": [\n'
        b'        {\n          "reported_at": "2026-08-20T15:01:00Z"\n        },\n'
        b'        {\n          "instance_id": "i",\n          "reported_at": "2026-08-21T09:00:30Z"\n        },\n'
        b'        {\n          "assigned_at": "a",\n          "reported_at": "2026-08-21T09:00:30.000001Z"\n        }\n'
        b'      ]\n    }\n  ]\n}'
    )


def test_go_string_escaping():
    text = "<a&b>\"\\\b\f\n\r\t\x01\x7f\u2028\u2029\u00e9\U0001f600\ud800"
    store = HealthStore("p", records={"0000:82:00.4": Record("0000:82:00.4", (Failure(text, "", T1),), None)})
    expected = ('"instance_id": "\\u003ca\\u0026b\\u003e\\"\\\\\\b\\f\\n\\r\\t\\u0001\x7f\\u2028\\u2029'
                '\u00e9\U0001f600\\ufffd"').encode("utf-8")
    assert expected in store.to_bytes()


def test_records_sorted_by_address_and_no_trailing_newline():
    records = {}
    for address in ("0000:e3:00.5", "0000:82:00.4", "0000:e3:00.4"):
        records[address] = Record(address, (), T1)
    data = HealthStore("p", records=records).to_bytes()
    assert [line.strip() for line in data.decode().splitlines() if "vf_address" in line] == [
        '"vf_address": "0000:82:00.4",', '"vf_address": "0000:e3:00.4",', '"vf_address": "0000:e3:00.5",']
    assert not data.endswith(b"\n")


def test_to_data_has_every_key():
    store = store_of(REFERENCE_EXAMPLE)
    assert store.to_data()[2] == {"vf_address": "0000:e3:00.5", "failures": [], "quarantined_at": "2026-08-22T00:00:00Z"}
    assert store.to_data()[0]["failures"] == [{"instance_id": "tz4a98xxat96iws9zmbrgj3a",
                                               "assigned_at": "2026-08-20T15:00:00.123456789Z",
                                               "reported_at": "2026-08-20T15:00:42.5Z"}]


def test_unmarshallable_loaded_offset_fails_like_hypemans_marshal():
    store = store_of(doc(record_json(extra='"quarantined_at":"2026-01-01T00:00:00+24:00"')))
    assert store.valid
    with pytest.raises(VgpuError) as err:
        store.to_bytes()
    expected = ("marshal VF health state: json: error calling MarshalJSON for type *time.Time: "
                "Time.MarshalJSON: timezone hour outside of range [0,23]")
    assert expected in err.value.msg and err.value.details["store_error"] == expected
    assert store.marshal_error() == expected


PLUS_24 = ('"failures":[{"instance_id":"a","reported_at":"2026-08-20T17:00:42.5+02:00"}],'
           '"quarantined_at":"2025-01-01T00:00:00+24:00"')


def test_unmarshallable_time_reads_as_go_formats_it():
    store = store_of(doc(record_json(extra=PLUS_24)))
    assert store.valid and store.to_data()[0]["quarantined_at"] == "2025-01-01T00:00:00+24:00"
    assert store.to_data()[0]["failures"][0]["reported_at"] == "2026-08-20T17:00:42.5+02:00"


def test_unmarshallable_failure_time_names_go_value_type():
    bad = ('{"version":1,"records":[{"vf_address":"0000:82:00.4","failures":[{"instance_id":"a",'
           '"reported_at":"2026-08-20T15:00:00-23:60"}]}]}').encode()
    store = store_of(bad)
    assert store.valid and store.marshal_error() == (
        "marshal VF health state: json: error calling MarshalJSON for type time.Time: "
        "Time.MarshalJSON: timezone hour outside of range [0,23]")
    assert store.to_data()[0]["failures"][0]["reported_at"] == "2026-08-20T15:00:00-24:00"


def test_rewrite_in_utc_keeps_instants_and_only_touches_bad_times():
    store = store_of(doc(record_json(extra=PLUS_24)))
    before = dict(store.records)
    store.rewrite_in_utc()
    assert store.rewrite and store.records == before  # same instants
    assert store.marshal_error() is None
    data = store.to_data()[0]
    assert data["quarantined_at"] == "2024-12-31T00:00:00Z"
    assert data["failures"][0]["reported_at"] == "2026-08-20T17:00:42.5+02:00"  # Go can write it: kept
    assert store_of(store.to_bytes()).records == before


def test_marshal_error_is_none_for_writable_and_invalid_stores():
    assert store_of(doc(record_json())).marshal_error() is None
    assert store_of(b"[]").marshal_error() is None


# --- semantics: hypeman's own scenarios (vf_health_test.go) -----------------------------------

VF = "0000:e3:00.4"


def fresh():
    return HealthStore("p")


def test_failure_quarantines_at_threshold():
    store = fresh()
    assert store.report_failure(VF, "instance-1", "2026-08-20T15:00:00Z", 2, T1) == "recorded"
    assert store.quarantined() == []
    assert store.report_failure(VF, "instance-2", "2026-08-20T16:00:00Z", 2, T2) == "quarantined"
    assert store.quarantined() == [VF]
    assert store.records[VF].quarantined_at == T2
    assert [f.instance_id for f in store.records[VF].failures] == ["instance-1", "instance-2"]
    # A quarantined VF takes no more failures.
    assert store.report_failure(VF, "instance-3", "", 2, T3) == "unchanged"
    assert store.failure_count(VF) == 2
    # And the result survives a reload byte for byte.
    assert store_of(store.to_bytes()).to_bytes() == store.to_bytes()


def test_failure_dedups_assignments():
    store = fresh()
    assert store.report_failure(VF, "instance-1", "2026-08-20T15:00:00Z", 2, T1) == "recorded"
    before = store.to_bytes()
    assert store.report_failure(VF, "instance-1", "2026-08-20T15:00:00Z", 2, T2) == "unchanged"
    assert store.to_bytes() == before and store.failure_count(VF) == 1
    # Same instance, new assignment: a distinct failure.
    assert store.report_failure(VF, "instance-1", "2026-08-20T16:00:00Z", 3, T2) == "recorded"


def test_empty_instance_and_assignment_are_a_valid_key():
    store = fresh()
    assert store.report_failure(VF, "", "", 2, T1) == "recorded"
    assert store.report_failure(VF, "", "", 2, T2) == "unchanged"
    assert b"instance_id" not in store.to_bytes() and b"assigned_at" not in store.to_bytes()


def test_threshold_one_quarantines_on_first_failure():
    assert fresh().report_failure(VF, "i", "a", 1, T1) == "quarantined"


def test_success_clears_failure_tally():
    store = fresh()
    store.report_failure(VF, "instance-1", "2026-08-20T15:00:00Z", 2, T1)
    assert store.report_success(VF, "instance-1", "2026-08-20T15:00:00Z") == ("cleared", 1)
    assert store.records == {}
    assert store.report_success(VF, "instance-1", "2026-08-20T15:00:00Z") == ("unchanged", 0)
    assert store.report_failure(VF, "instance-3", "", 2, T2) == "recorded"
    assert store.failure_count(VF) == 1


def test_success_clears_match_and_older_failures_only():
    store = fresh()
    for index, moment in enumerate((T1, T2, T3)):
        store.report_failure(VF, "i%d" % index, "a", 5, moment)
    assert store.report_success(VF, "i1", "a") == ("cleared", 2)
    assert store.records[VF].failures == (Failure("i2", "a", T3),)


def test_success_rescinds_quarantine_triggered_by_assignment():
    store = fresh()
    store.report_failure(VF, "instance-1", "2026-08-20T14:00:00Z", 2, T1)
    assert store.report_failure(VF, "instance-2", "2026-08-20T15:00:00Z", 2, T2) == "quarantined"
    assert store.report_success(VF, "instance-2", "2026-08-20T15:00:00Z") == ("rescinded", 2)
    assert store.quarantined() == [] and store.records == {}


def test_success_of_older_assignment_never_rescinds():
    store = fresh()
    store.report_failure(VF, "instance-1", "a", 2, T1)
    store.report_failure(VF, "instance-2", "b", 2, T2)
    before = store.to_bytes()
    assert store.report_success(VF, "instance-1", "a") == ("unchanged", 0)
    assert store.to_bytes() == before


def test_success_without_matching_failure_clears_nothing():
    store = fresh()
    store.report_failure(VF, "instance-1", "2026-08-20T15:00:00Z", 2, T1)
    assert store.report_success(VF, "instance-2", "2026-08-20T16:00:00Z") == ("unchanged", 0)
    # assigned_at is compared as an exact string: the same instant written differently does not match.
    assert store.report_success(VF, "instance-1", "2026-08-20T15:00:00.000Z") == ("unchanged", 0)
    assert store.failure_count(VF) == 1


def test_success_never_clears_hand_made_quarantine():
    store = fresh()
    assert store.quarantine(VF, T1) == "quarantined"
    assert store.report_success(VF, "another-instance", "") == ("unchanged", 0)
    assert store.report_success(VF, "", "") == ("unchanged", 0)
    assert store.quarantined() == [VF]


def test_lowered_threshold_reevaluates_recorded_failures():
    store = fresh()
    for instance in ("instance-1", "instance-2"):
        assert store.report_failure(VF, instance, "", 3, T1) == "recorded"
    assert store.would_quarantine(3) == [] and store.would_quarantine(2) == [VF]
    assert store.reevaluate(2, T2) == [VF]
    assert store.records[VF].quarantined_at == T2
    # The success of the newest tally then rescinds it, as hypeman documents.
    assert store.report_success(VF, "instance-2", "") == ("rescinded", 2)


def test_raised_threshold_never_unquarantines():
    store = fresh()
    store.report_failure(VF, "i", "a", 1, T1)
    assert store.reevaluate(5, T2) == []
    assert store.quarantined() == [VF]


def test_reevaluation_after_load_matches_hypeman():
    data = doc(record_json(extra='"failures":[{"instance_id":"a","reported_at":"2026-01-01T00:00:00Z"},'
                                 '{"instance_id":"b","reported_at":"2026-01-02T00:00:00Z"}]'))
    store = store_of(data)
    assert store.quarantined() == []
    assert store.reevaluate(2, T1) == ["0000:82:00.4"]
    assert store.quarantined() == ["0000:82:00.4"]


def test_manual_quarantine_keeps_failures():
    store = fresh()
    store.report_failure(VF, "i", "a", 3, T1)
    assert store.quarantine(VF, T2) == "quarantined"
    assert store.records[VF] == Record(VF, (Failure("i", "a", T1),), T2)
    assert store.quarantine(VF, T3) == "unchanged"
    assert store.records[VF].quarantined_at == T2


def test_remove_whole_record():
    store = store_of(REFERENCE_EXAMPLE)
    assert store.remove("0000:e3:00.4") == "cleared"
    assert store.remove("0000:e3:00.4") == "unchanged"
    assert sorted(store.records) == ["0000:82:00.4", "0000:e3:00.5"]


@pytest.mark.parametrize("call", [
    lambda s: s.report_failure("not-a-pci-address", "", "", 2),
    lambda s: s.report_success("0000:E3:00.4", "", ""),
    lambda s: s.quarantine("0000:e3:00.8"),
    lambda s: s.remove("e3:00.4"),
])
def test_mutations_reject_non_canonical_addresses(call):
    store = fresh()
    with pytest.raises(VgpuError) as err:
        call(store)
    assert err.value.msg.startswith("invalid VF address ")
    assert store.records == {}


def test_mutations_fail_closed_on_invalid_store():
    store = store_of(b"[]")
    for call in (lambda: store.report_failure(VF, "", "", 2), lambda: store.report_success(VF, "", ""),
                 lambda: store.quarantine(VF), lambda: store.remove(VF), lambda: store.reevaluate(2),
                 store.to_bytes):
        with pytest.raises(VgpuError) as err:
            call()
        assert "json: cannot unmarshal array" in err.value.msg


# --- repair recovery -------------------------------------------------------------------------


def test_recover_from_legacy_array():
    raw = (b'[{"vf_address":"0000:82:00.4","instance_id":"x","wedge_count":2,"quarantined_at":"2026-01-01T00:00:00Z"},'
           b'{"vf_address":"0000:E3:00.5","wedge_count":1}]')
    records = _store_write.recover_records(raw, T2)
    assert records == {
        "0000:82:00.4": Record("0000:82:00.4", (), parse_rfc3339("2026-01-01T00:00:00Z")),
        "0000:e3:00.5": Record("0000:e3:00.5", (), T2),
    }


def test_recover_from_invalid_v1_keeps_valid_failures_and_quarantines_all():
    raw = doc(record_json(extra='"failures":[{"instance_id":"a","reported_at":"2026-01-01T00:00:00Z"},'
                                '{"instance_id":"a","reported_at":"2026-01-02T00:00:00Z"},'
                                '{"instance_id":"b","reported_at":"0001-01-01T00:00:00Z"}]'))
    assert not store_of(raw).valid
    records = _store_write.recover_records(raw, T2)
    assert records == {"0000:82:00.4": Record(
        "0000:82:00.4", (Failure("a", "", parse_rfc3339("2026-01-01T00:00:00Z")),), T2)}
    assert HealthStore("p", records=records).to_bytes()  # a store hypeman loads


def test_recover_keeps_one_of_two_failures_hypeman_takes_for_one_assignment():
    # "a\0b" + "c" and "a" + "b\0c" are one key to hypeman's validation: a repair that kept both
    # wrote a store placement refuses, again on every run.
    raw = doc(record_json(extra='"failures":[{"instance_id":"a\\u0000b","assigned_at":"c","reported_at":"2026-01-01T00:00:00Z"},'
                                '{"instance_id":"a","assigned_at":"b\\u0000c","reported_at":"2026-01-02T00:00:00Z"}]'))
    assert "duplicate failure" in store_of(raw).error
    records = _store_write.recover_records(raw, T2)
    assert records["0000:82:00.4"].failures == (Failure("a\x00b", "c", parse_rfc3339("2026-01-01T00:00:00Z")),)
    repaired = HealthStore("p", records=records).to_bytes()
    assert store_of(repaired).valid
    assert _store_write.recover_records(repaired, T2) == records


def test_recover_from_garbage_finds_every_address():
    raw = b'{"version":1,"records":[{"vf_address":"0000:82:00.4" ... broken 0000:E3:00.5 and 1234:ab:cd.7x'
    assert sorted(_store_write.recover_records(raw, T1)) == ["0000:82:00.4", "0000:e3:00.5"]


def test_recover_nothing_from_nothing():
    assert _store_write.recover_records(None, T1) == {} and _store_write.recover_records(b"", T1) == {}


def test_store_relpath_matches_module_glue():
    from ansible_collections.hypeman.vgpu.plugins.module_utils._module import store_path
    assert store_path({"data_dir": "/d", "path": None}) == os.path.join("/d", _store.STORE_RELPATH)
