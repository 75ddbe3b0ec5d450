# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_ledger: a line's values must be what _ledger_write writes (text or null; no nested value outside an
intent's entries, expect and absent), else it is a problem line: a deeply nested reason made vf_health_info
fail with RecursionError when it returned the entry."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _ledger, _ledger_write
from ansible_collections.hypeman.vgpu.plugins.module_utils._gotime import parse_rfc3339
from ansible_collections.hypeman.vgpu.plugins.modules import vf_health_info
from ansible_collections.hypeman.vgpu.tests.unit.hostile import property_settings
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module

VF = "0000:82:00.4"
T1 = parse_rfc3339("2026-08-20T15:00:00.123456789Z")


def entry(**changes):
    written = _ledger_write.make_entry("quarantine", VF, T1, "drain", "alice", "42", "run-1", now=T1,
                                       parent_gpu="0000:82:00.0")
    written.update(changes)
    return written


def parse(*lines):
    return _ledger.parse_ledger("p", "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                                             for line in lines).encode())


def _nested_text(depth):
    return "[" * depth + "]" * depth


def nested(depth):
    return json.loads(_nested_text(depth))


def test_what_the_writer_writes_is_kept():
    written = [entry(), entry(action="clear", quarantined_at=None, reason=None, job_id=None, parent_gpu=None),
               dict(entry(), settled_by="run-2")]
    ledger = parse(*written)
    assert ledger.problems == [] and [dict((k, v) for k, v in e.items() if k != "line") for e in ledger.entries] \
        == written


@pytest.mark.parametrize("key", ["reason", "user", "job_id", "time", "trigger", "settled_by", "run_id",
                                 "vf_address", "parent_gpu", "quarantined_at"])
@pytest.mark.parametrize("value", [5, True, [], {"a": "b"}, nested(900)])
def test_a_text_key_holding_anything_but_text_or_null_is_a_problem_line(key, value):
    ledger = parse(entry(**{key: value}), entry())
    assert ledger.problems == [{"line": 1, "error": "%s is not a string" % key}]
    assert [e["line"] for e in ledger.entries] == [2]
    json.dumps([ledger.entries, ledger.problems])


def test_another_key_may_hold_a_scalar_but_no_nested_value():
    ledger = parse(entry(note="kept", count=3, flag=False, nothing=None), entry(extra=nested(400)),
                   entry(extra={"a": 1}))
    assert [e["line"] for e in ledger.entries] == [1]
    assert ledger.problems == [
        {"line": 2, "error": '"extra" is a JSON array; expected text, a number, true, false or null'},
        {"line": 3, "error": '"extra" is a JSON object; expected text, a number, true, false or null'}]


def test_an_action_of_any_json_value_is_named_briefly():
    ledger = parse({"action": nested(900)}, {"action": {"a": 1}}, {"action": "x" * 5000}, {"action": 5})
    assert [p["error"] for p in ledger.problems] == [
        "unknown action (a JSON array)", "unknown action (a JSON object)", "unknown action %r" % ("x" * 80),
        "unknown action 5"]


@pytest.mark.parametrize("line, error", [
    ({"action": "intent", "run_id": "r", "entries": [entry(reason=nested(900))], "expect": {}},
     "intent entry: reason is not a string"),
    ({"action": "intent", "run_id": "r", "entries": [], "expect": {}, "time": ["x"]}, "intent time is not a string"),
    ({"action": "intent", "run_id": "r", "entries": [], "expect": {}, "extra": nested(900)},
     'intent "extra" is a JSON array; expected text, a number, true, false or null'),
    ({"action": "abort", "run_id": "r", "reason": nested(400)}, "abort reason is not a string"),
    ({"action": "abort", "run_id": "r", "entries": []},
     'abort "entries" is a JSON array; expected text, a number, true, false or null'),
])
def test_intent_and_abort_lines_follow_the_same_rule(line, error):
    intent = {"action": "intent", "run_id": "r", "entries": [], "expect": {}}
    ledger = parse(intent, line)
    assert ledger.problems == [{"line": 2, "error": error}]


@pytest.mark.parametrize("depth", [400, 900])
def test_vf_health_info_returns_a_deeply_nested_reason_as_a_problem_line(tmp_path, capsys, depth):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    (state_dir / "ledger.jsonl").write_text(json.dumps({"action": "clear", "vf_address": VF}).replace(
        "}", ', "reason": %s}' % _nested_text(depth)) + "\n" + json.dumps(entry()) + "\n")
    result = run_module(vf_health_info.main, {"data_dir": str(tmp_path / "data"), "state_dir": str(state_dir),
                                              "config_path": str(tmp_path / "config.yaml")}, capsys)
    assert not result.get("failed"), result.get("msg")
    assert result["ledger"]["problems"] == [{"line": 1, "error": "reason is not a string"}]
    assert [e["line"] for e in result["ledger"]["entries"]] == [2]


def _containers(inner):
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5), _containers, max_leaves=8)


@property_settings(40)
@given(st.sampled_from(sorted(entry()) + ["extra"]),
       st.one_of(_JSON.map(json.dumps), st.integers(1, 3000).map(_nested_text)))
def test_any_value_in_any_key_gives_a_flat_entry_or_a_problem(key, value):
    ledger = parse(json.dumps(dict(entry(), **{key: "VALUE"})).replace('"VALUE"', value))
    if ledger.entries:
        (kept,) = ledger.entries
        assert not any(isinstance(v, (dict, list)) for v in kept.values())
        json.dumps(kept)
    else:
        assert len(ledger.problems) == 1 and ledger.problems[0]["line"] == 1


def test_no_file_written_by_the_reader(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    (state_dir / "ledger.jsonl").write_text(json.dumps(entry(reason=nested(900))) + "\n")
    before = (state_dir / "ledger.jsonl").read_bytes()
    _ledger.read_ledger(str(state_dir))
    assert (state_dir / "ledger.jsonl").read_bytes() == before and os.listdir(str(state_dir)) == ["ledger.jsonl"]
