# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Simulator self-tests: the API stand-in's VF health store keeps hypeman's rules."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _store as collection_store
from ansible_collections.hypeman.vgpu.tests.sim import store as simstore
from ansible_collections.hypeman.vgpu.tests.sim.store import GoTime, StoreError, VFHealthStore

# Expected bytes written by hand from the reconstructed example in docs/hypeman-interface.md (§1.2).
EXAMPLE = (
    '{\n  "version": 1,\n  "records": [\n'
    '    {\n      "vf_address": "0000:82:00.4",\n      "failures": [\n'
    '        {\n          "instance_id": "tz4a",\n          "assigned_at": "2026-08-20T15:00:00.123456789Z",\n'
    '          "reported_at": "2026-08-20T15:00:42.5Z"\n        }\n      ]\n    },\n'
    '    {\n      "vf_address": "0000:e3:00.5",\n      "quarantined_at": "2026-08-22T00:00:00Z"\n    }\n'
    '  ]\n}'
)


class Clock(object):
    def __init__(self, start="2026-09-01T10:00:00Z"):
        self.t = GoTime.parse(start)

    def __call__(self):
        self.t = GoTime(self.t.unix_ns + 10 ** 9)
        return GoTime(self.t.unix_ns)


def _store(tmp_path, text=None, threshold=2):
    path = tmp_path / "gpu" / "vf-health.json"
    if text is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return VFHealthStore(str(path), threshold=threshold, now=Clock()), path


def test_example_round_trips_byte_identical():
    records = simstore.parse_store(EXAMPLE)
    assert simstore.serialize(records).decode() == EXAMPLE


@pytest.mark.parametrize("text,expected", [
    ("2026-08-20T15:04:05.120000000Z", "2026-08-20T15:04:05.12Z"),
    ("2026-08-20T17:04:05+02:00", "2026-08-20T17:04:05+02:00"),
    ("2026-08-20T15:04:05+00:00", "2026-08-20T15:04:05Z"),
    ("1999-12-31T23:59:59.000000001Z", "1999-12-31T23:59:59.000000001Z"),
])
def test_go_time_format(text, expected):
    assert GoTime.parse(text).format() == expected


def test_zero_time_and_unix_epoch():
    assert GoTime.parse("0001-01-01T00:00:00Z").is_zero()
    assert GoTime.parse("1970-01-01T00:00:01Z").unix_ns == 10 ** 9


def test_go_html_escaping_and_no_trailing_newline():
    text = simstore.serialize({"0000:82:00.4": simstore.Record(
        "0000:82:00.4", [("a<b>&", "", GoTime.parse("2026-01-01T00:00:00Z"))])}).decode()
    assert "a\\u003cb\\u003e\\u0026" in text and not text.endswith("\n")


@pytest.mark.parametrize("text,reason", [
    ("{", "unmarshal VF health state: "),
    ('[{"vf_address": "0000:82:00.4", "wedge_count": 1}]', "unmarshal VF health state: "),
    ('{"records": []}', "validate VF health state: unsupported version 0"),
    ('{"version": 2, "records": []}', "unsupported version 2"),
    ('{"version": 1}', "expected a records array"),
    ('{"version": 1, "records": null}', "expected a records array"),
    ('{"version": 1, "records": [{"vf_address": "0000:82:00.8", "quarantined_at": "2026-01-01T00:00:00Z"}]}',
     "invalid VF address"),
    ('{"version": 1, "records": [{"vf_address": "0000:82:0A.4", "quarantined_at": "2026-01-01T00:00:00Z"}]}',
     "invalid VF address"),
    ('{"version": 1, "records": [{"vf_address": "0000:82:00.4", "quarantined_at": "0001-01-01T00:00:00Z"}]}',
     "missing quarantine timestamp"),
    ('{"version": 1, "records": [{"vf_address": "0000:82:00.4"}]}', "neither quarantined nor any recorded failures"),
    ('{"version": 1, "records": [{"vf_address": "0000:82:00.4", "failures": [{"instance_id": "a"}]}]}',
     "missing report timestamp"),
    ('{"version": 1, "records": [{"vf_address": "0000:82:00.4", "failures": ['
     '{"instance_id": "a", "reported_at": "2026-01-01T00:00:00Z"},'
     '{"instance_id": "a", "reported_at": "2026-01-02T00:00:00Z"}]}]}', "duplicate failure"),
    ('{"version": 1, "records": [{"vf_address": "0000:82:00.4", "quarantined_at": "2026-01-01T00:00:00Z"},'
     '{"vf_address": "0000:82:00.4", "quarantined_at": "2026-01-01T00:00:00Z"}]}', "duplicate VF address"),
])
def test_invalid_store_fails_closed(tmp_path, text, reason):
    store, path = _store(tmp_path, text)
    unavailable = store.unavailable_reason()
    assert unavailable.startswith("VF health state unavailable: ")
    assert reason in unavailable
    with pytest.raises(StoreError):
        store.report_failure("0000:82:00.4", "i", "t")
    assert path.read_text() == text  # never rewritten


def test_missing_file_is_empty_and_valid(tmp_path):
    store, path = _store(tmp_path)
    assert store.unavailable_reason() is None and store.records == {}
    assert not path.exists()


def test_null_quarantined_at_is_not_quarantined(tmp_path):
    store = _store(tmp_path, '{"version": 1, "records": [{"vf_address": "0000:82:00.4", "quarantined_at": null,'
                             ' "failures": [{"reported_at": "2026-01-01T00:00:00Z"}]}]}')[0]
    assert store.unavailable_reason() is None and store.quarantined() == []


def test_load_error_is_retried_and_recovers(tmp_path):
    store, path = _store(tmp_path, "{broken")
    assert store.unavailable_reason()
    path.write_text('{"version": 1, "records": []}')
    assert store.unavailable_reason() is None


def test_lowered_threshold_quarantines_at_load_and_rewrites(tmp_path):
    text = ('{"version": 1, "records": [{"vf_address": "0000:82:00.4", "failures": ['
            '{"instance_id": "a", "assigned_at": "t1", "reported_at": "2026-01-01T00:00:00Z"}]}]}')
    store, path = _store(tmp_path, text, threshold=1)
    assert store.quarantined() == ["0000:82:00.4"]
    assert json.loads(path.read_text())["records"][0]["quarantined_at"] == "2026-09-01T10:00:01Z"


def test_failure_reports_dedup_quarantine_and_unchanged(tmp_path):
    store, path = _store(tmp_path)
    assert store.report_failure("0000:82:00.4", "a", "t1") == ("recorded", 1)
    assert store.report_failure("0000:82:00.4", "a", "t1") == ("unchanged", 1)
    assert store.report_failure("0000:82:00.4", "b", "t2") == ("quarantined", 2)
    assert store.report_failure("0000:82:00.4", "c", "t3") == ("unchanged", 2)
    doc = json.loads(path.read_text())
    assert doc["records"][0]["quarantined_at"] == doc["records"][0]["failures"][1]["reported_at"]
    assert oct(os.stat(str(path)).st_mode & 0o777) == "0o644"
    assert not os.path.exists(str(path) + ".tmp")


def test_success_clears_older_and_rescinds_only_from_newest(tmp_path):
    store, path = _store(tmp_path)
    store.report_failure("0000:82:00.4", "a", "t1")
    store.report_failure("0000:82:00.4", "b", "t2")
    assert store.report_success("0000:82:00.4", "a", "t1") == (0, False)  # not the newest: no change
    assert store.report_success("0000:82:00.4", "b", "t2") == (2, True)
    assert json.loads(path.read_text())["records"] == []
    store.threshold = 5
    for instance_id in ("a", "b", "c"):
        store.report_failure("0000:82:00.5", instance_id, "t-" + instance_id)
    assert store.report_success("0000:82:00.5", "b", "t-b") == (2, False)
    assert [f[0] for f in store.records["0000:82:00.5"].failures] == ["c"]


def test_hand_made_quarantine_is_never_rescinded(tmp_path):
    store = _store(tmp_path, '{"version": 1, "records": [{"vf_address": "0000:82:00.4",'
                             ' "quarantined_at": "2026-01-01T00:00:00Z"}]}')[0]
    assert store.report_success("0000:82:00.4", "", "") == (0, False)
    assert store.quarantined() == ["0000:82:00.4"]


def test_write_failure_before_rename_rolls_back(tmp_path):
    store, path = _store(tmp_path, '{"version": 1, "records": []}')
    os.mkdir(str(path.parent / simstore.TMP_NAME))  # the fixed temp name cannot be opened
    with pytest.raises(StoreError):
        store.report_failure("0000:82:00.4", "a", "t1")
    assert store.records == {} and path.read_text() == '{"version": 1, "records": []}'


LEGACY_ERROR = ("unmarshal VF health state: json: cannot unmarshal array into Go value of type "
                "devices.vfHealthFile")


@pytest.mark.parametrize("text", ["[]", '[{"vf_address": "0000:82:00.4", "wedge_count": 1}]'])
def test_legacy_store_error_names_hypemans_go_type(tmp_path, text):
    # hypeman decodes into lib/devices/vf_health.go's vfHealthFile; its API reports this text.
    with pytest.raises(StoreError) as err:
        simstore.parse_store(text)
    assert str(err.value) == LEGACY_ERROR
    store, _path = _store(tmp_path, text)
    assert store.unavailable_reason() == "VF health state unavailable: " + LEGACY_ERROR


def _record(extra):
    return '{"version":1,"records":[%s]}' % extra


@pytest.mark.parametrize("text", [
    "[]", '"x"', "5", "true", "null", "{}",
    '{"version":"1","records":[]}', '{"version":1.0,"records":[]}', '{"version":1e0,"records":[]}',
    '{"version":99999999999999999999,"records":[]}', '{"version":null,"records":[]}', '{"VERSION":"1","records":[]}',
    '{"version":1,"records":{}}', '{"version":1,"records":"x"}', '{"version":1,"records":[true]}',
    '{"version":1,"records":[null]}', '{"version":"x","records":{}}', '{"records":{},"version":"x"}',
    _record('{"vf_address":5,"quarantined_at":"2026-01-01T00:00:00Z"}'),
    _record('{"vf_address":[],"quarantined_at":"2026-01-01T00:00:00Z"}'),
    _record('{"vf_address":"0000:82:00.4","failures":{}}'),
    _record('{"vf_address":"0000:82:00.4","failures":[1]}'),
    _record('{"vf_address":"0000:82:00.4","failures":[null]}'),
    _record('{"vf_address":"0000:82:00.4","failures":[{"instance_id":5,"reported_at":"2026-01-01T00:00:00Z"}]}'),
    _record('{"vf_address":"0000:82:00.4","failures":[{"assigned_at":{},"reported_at":"2026-01-01T00:00:00Z"}]}'),
    _record('{"vf_address":"0000:82:00.4","quarantined_at":5}'),
    _record('{"vf_address":5,"quarantined_at":5}'),
    _record('{"vf_address":"0000:82:00.4","failures":[{"reported_at":true}]}'),
    _record('{"vf_address":"0000:82:00.4","quarantined_at":null}'),
])
def test_unmarshal_errors_match_the_collection(text):
    # Two independent readings of hypeman's decoder: the stand-in and the collection's store must agree.
    expected = collection_store.parse_store_bytes("/x/gpu/vf-health.json", text.encode("utf-8")).error
    assert expected is not None
    with pytest.raises(StoreError) as err:
        simstore.parse_store(text)
    assert str(err.value) == expected
