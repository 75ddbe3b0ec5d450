# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vf_health_info: the store as data, never writing."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _ledger_write
from ansible_collections.hypeman.vgpu.plugins.module_utils._gotime import parse_rfc3339
from ansible_collections.hypeman.vgpu.plugins.modules import vf_health_info
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module
from ansible_collections.hypeman.vgpu.tests.unit.hostile import tree_fingerprint

STORE = b'''{"version":1,"records":[
 {"vf_address":"0000:82:00.4","failures":[{"instance_id":"a","reported_at":"2026-08-20T15:00:00Z"},
                                           {"instance_id":"b","reported_at":"2026-08-20T16:00:00Z"}]},
 {"vf_address":"0000:82:00.5","failures":[{"instance_id":"c","reported_at":"2026-08-20T15:00:00Z"}]},
 {"vf_address":"0000:e3:00.4","quarantined_at":"2026-08-21T00:00:00Z"},
 {"vf_address":"0000:e3:00.5","quarantined_at":"2026-08-22T00:00:00Z"}]}'''


class Info(object):
    def __init__(self, root):
        self.root = str(root)
        self.data_dir = os.path.join(self.root, "data")
        self.state_dir = os.path.join(self.root, "state")
        self.config_path = os.path.join(self.root, "config.yaml")
        self.path = os.path.join(self.data_dir, "gpu", "vf-health.json")

    def put(self, data):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "wb") as handle:
            handle.write(data)

    def run(self, capsys, check_mode=False, **args):
        params = {"data_dir": self.data_dir, "state_dir": self.state_dir, "config_path": self.config_path,
                  "_ansible_check_mode": check_mode}
        params.update(args)
        return run_module(vf_health_info.main, params, capsys)

    def digest(self):
        return tree_fingerprint(self.root)


@pytest.fixture
def info(tmp_path):
    return Info(tmp_path)


def test_missing_store(info, capsys):
    result = info.run(capsys)
    assert {k: result[k] for k in ("changed", "exists", "format", "valid", "error", "records", "quarantined",
                                   "failure_counts", "would_quarantine", "owned", "recoverable", "threshold",
                                   "threshold_source", "symlink")} == {
        "changed": False, "exists": False, "format": "missing", "valid": True, "error": None, "records": [],
        "quarantined": [], "failure_counts": {}, "would_quarantine": [], "owned": [], "recoverable": [],
        "threshold": 2, "threshold_source": "default", "symlink": False}
    assert result["ledger"] == {"path": os.path.join(info.state_dir, "ledger.jsonl"), "exists": False, "total": 0,
                                "entries": [], "problems": [], "pending": []}
    assert not os.path.exists(info.data_dir) and not os.path.exists(info.state_dir)


def test_valid_store_with_ledger(info, capsys):
    info.put(STORE)
    _ledger_write.append_entries(info.state_dir, [
        _ledger_write.make_entry("quarantine", "0000:e3:00.4", parse_rfc3339("2026-08-21T00:00:00Z"), "drain", "alice"),
        _ledger_write.make_entry("quarantine", "0000:e3:00.5", parse_rfc3339("2026-08-01T00:00:00Z"), "drain", "alice"),
    ])
    with open(os.path.join(info.state_dir, "ledger.jsonl"), "a") as handle:
        handle.write("garbage\n")
    before = info.digest()
    result = info.run(capsys, ledger_entries=1)
    assert (result["exists"], result["format"], result["valid"], result["error"]) == (True, "v1", True, None)
    assert result["quarantined"] == ["0000:e3:00.4", "0000:e3:00.5"]
    assert result["failure_counts"] == {"0000:82:00.4": 2, "0000:82:00.5": 1, "0000:e3:00.4": 0, "0000:e3:00.5": 0}
    assert result["would_quarantine"] == ["0000:82:00.4"]
    assert result["owned"] == ["0000:e3:00.4"]  # e3:00.5's time no longer matches what we wrote
    assert result["records"][2] == {"vf_address": "0000:e3:00.4", "failures": [],
                                    "quarantined_at": "2026-08-21T00:00:00Z"}
    assert result["ledger"]["total"] == 2 and [e["vf_address"] for e in result["ledger"]["entries"]] == ["0000:e3:00.5"]
    assert result["ledger"]["problems"] == [{"line": 3, "error": result["ledger"]["problems"][0]["error"]}]
    assert result["recoverable"] == []
    assert info.digest() == before


def test_threshold_from_config_and_option(info, capsys):
    info.put(STORE)
    with open(info.config_path, "w") as handle:
        handle.write("port: 8080\ngpu:\n  vf_quarantine_threshold: 1  # strict\n")
    result = info.run(capsys)
    assert (result["threshold"], result["threshold_source"]) == (1, info.config_path)
    assert result["would_quarantine"] == ["0000:82:00.4", "0000:82:00.5"]
    result = info.run(capsys, threshold=3)
    assert (result["threshold"], result["threshold_source"], result["would_quarantine"]) == (3, "option", [])


@pytest.mark.parametrize("content, fmt, error", [
    (b"[]", "legacy", "unmarshal VF health state: json: cannot unmarshal array into Go value of type devices.vfHealthFile"),
    (b"{", "invalid", "unmarshal VF health state: unexpected end of JSON input"),
    (b'{"version":1,"records":[{"vf_address":"0000:82:00.4"}]}', "invalid",
     "validate VF health state record 0: neither quarantined nor any recorded failures"),
])
def test_invalid_store_reported_with_hypemans_error(info, capsys, content, fmt, error):
    info.put(content)
    result = info.run(capsys)
    assert not result.get("failed")
    assert (result["format"], result["valid"], result["error"], result["records"], result["quarantined"]) == (
        fmt, False, error, [], [])
    with open(info.path, "rb") as handle:
        assert handle.read() == content


def test_recoverable_lists_what_repair_would_keep(info, capsys):
    info.put(b'[{"vf_address":"0000:82:00.4","wedge_count":1},{"vf_address":"0000:E3:00.5","wedge_count":1}]')
    assert info.run(capsys)["recoverable"] == ["0000:82:00.4", "0000:e3:00.5"]


def test_check_mode_is_the_same(info, capsys):
    info.put(STORE)
    normal = info.run(capsys)
    checked = info.run(capsys, check_mode=True)
    for key in ("records", "quarantined", "would_quarantine", "owned", "format", "valid"):
        assert normal[key] == checked[key]


@pytest.mark.parametrize("args, message", [
    (dict(threshold=0), "threshold is 0; expected a whole number >= 1"),
    (dict(ledger_entries=-1), "ledger_entries is -1; expected 0 or more"),
])
def test_bad_input(info, capsys, args, message):
    result = info.run(capsys, **args)
    assert result["failed"] and message in result["msg"]


def test_symlinked_store_is_refused_and_nothing_of_its_target_shown(info, capsys, tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_bytes(b'{"version":1,"records":[{"vf_address":"0000:82:00.4","quarantined_at":"x"}]} secret')
    os.makedirs(os.path.dirname(info.path))
    os.symlink(str(target), info.path)
    result = info.run(capsys)
    assert result["symlink"] is True and result["valid"] is False and result["exists"] is True
    assert result["error"] == ("read VF health state: %s is a symlink to \"%s\"; this collection reads and writes "
                               "only the file itself, never through a symlink" % (info.path, target))
    assert (result["records"], result["recoverable"], result["quarantined"]) == ([], [], [])
    assert "secret" not in str(result) and "0000:82:00.4" not in str(result)


def test_store_go_loads_but_cannot_marshal(info, capsys):
    """Issue 12: no traceback; valid (hypeman loads it), the time as Go prints it, and the write error."""
    info.put(b'{"version":1,"records":[{"vf_address":"0000:e3:00.4","failures":[{"instance_id":"a",'
             b'"reported_at":"2026-08-20T15:00:00Z"}],"quarantined_at":"2025-01-01T00:00:00+24:00"},'
             b'{"vf_address":"0000:e3:00.5","failures":[{"instance_id":"a","reported_at":"2026-08-20T15:00:00Z"}]}]}')
    result = info.run(capsys, threshold=1)
    assert result["valid"] is True and result["error"] is None
    assert result["records"][0]["quarantined_at"] == "2025-01-01T00:00:00+24:00"
    assert result["write_error"] == ("marshal VF health state: json: error calling MarshalJSON for type "
                                     "*time.Time: Time.MarshalJSON: timezone hour outside of range [0,23]")
    assert result["would_quarantine"] == ["0000:e3:00.5"] and result["quarantined"] == ["0000:e3:00.4"]
    info.put(STORE)
    assert info.run(capsys)["write_error"] is None


def test_pending_intent_of_a_killed_run_is_shown_and_counted(info, capsys):
    info.put(STORE)
    entry = _ledger_write.make_entry("quarantine", "0000:e3:00.4", parse_rfc3339("2026-08-21T00:00:00Z"), "drain",
                                     run_id="killed")
    intent = _ledger_write.make_intent("killed", [entry], "missing", "0" * 64,
                                       {"0000:e3:00.4": parse_rfc3339("2026-08-21T00:00:00Z")})
    os.makedirs(info.state_dir)
    with open(os.path.join(info.state_dir, "ledger.jsonl"), "w") as handle:
        handle.write(json.dumps(intent) + "\n")
    before = info.digest()
    result = info.run(capsys)
    assert result["owned"] == ["0000:e3:00.4"] and result["ledger"]["total"] == 0
    assert [(p["run_id"], p["outcome"], p["entries"]) for p in result["ledger"]["pending"]] == [
        ("killed", "commit", 1)]
    assert info.digest() == before  # settling is vf_health's job
