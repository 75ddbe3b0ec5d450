# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report against one hostile or broken host, hostile text and a hostile report directory:
the report still renders for every other host, the files are written whole or not at all, and no
host's data leaves its line (Markdown, Prometheus) or its command."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import stat

import pytest
from hypothesis import example, given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _metrics
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures as fp
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as fr
from ansible_collections.hypeman.vgpu.tests.unit.hostile import (
    hang_detector, property_settings, replace_with, tree_fingerprint)
from ansible_collections.hypeman.vgpu.tests.unit.plugins.inventory import fleet_reports

NOW = "2026-09-01T10:00:00Z"


@pytest.fixture(scope="module")
def real_result(tmp_path_factory):
    """A real host_audit_info result (overflow-only card), with the optional sections a host may add."""
    result = fleet_reports.audit_result(str(tmp_path_factory.mktemp("host")), "overflow")
    result["metrics"] = {"url": "http://127.0.0.1:9464/metrics", "error": None, "previous": None,
                         "previous_error": None, "coverage_problems": [], "store_quarantined": 0,
                         "sample": {"taken_at": 1.0, "version": "0.9", "uptime_seconds": 60.0,
                                    "checks": {"ok": 12.0, "rpc_error": 0.0}, "init_failures": 1.0,
                                    "quarantines": 0.0, "quarantined_vfs": 0.0, "store_unavailable": 0.0}}
    result["api"] = {"url": "http://127.0.0.1:8080", "reachable": True, "error": None, "mismatches": []}
    result["wedge_signals"] = {"complete": True, "sources": []}
    result["at_risk_vfs"] = [{"vf": "0000:82:00.4", "card": "0000:82:00.0", "reason": "vf_may_wedge",
                              "reasons": ["vf_may_wedge"], "time": NOW, "instance_id": "inst-a"}]
    assert fr.host_entry(result, "x")["status"] == "needs_action"
    return result


def render_all(report):
    """Every file the report task writes, and each host's textfile."""
    out = {"json": fr.to_json(report), "markdown": fr.render_markdown(report), "html": fr.render_html(report),
           "history": fp.to_json(fp.history_record(report))}
    for entry in report["hosts"]:
        out["prometheus " + entry["host"]] = fr.render_prometheus(entry)
    json.loads(out["json"])
    return out


def paths(value, prefix=()):
    """Every path (keys and indexes) inside a result."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key in sorted(value):
            found += paths(value[key], prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, prefix + (index,))
    return found


def replaced(value, path, new):
    value = copy.deepcopy(value)
    target = value
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return value


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)


# --- one host's malformed result or cached entry ------------------------------------------------


MALFORMED = {
    "store is a string": (("store",), "garbage", 'store is "garbage"; expected the store section'),
    "issue without code": (("issues",), [{"severity": "warning", "message": "x"}], "issues[0].code is null"),
    "issues a dict": (("issues",), {"a": 1}, 'issues is {"a": 1}; expected an array of issues'),
    "total_slots a string": (("capacity", "total_slots"), "32", 'capacity.total_slots is "32"; expected a whole'),
    "gpu without address": (("placement", "gpus", 0, "address"), None, "placement.gpus[0].address is null"),
    "gpus [null]": (("placement", "gpus"), [None], "placement.gpus[0] is null; expected a card object"),
    "finding a string": (("sentinel", "findings"), ["x"], 'sentinel.findings[0] is "x"; expected a finding'),
    "at-risk VF without reason": (("at_risk_vfs",), [{"vf": "0000:82:00.4"}], "at_risk_vfs[0].reason is null"),
    "lost_pct NaN": (("capacity", "lost_pct"), math.nan, "capacity.lost_pct is NaN; expected a percentage"),
    "running a string": (("hypeman", "running"), "yes", 'hypeman.running is "yes"; expected true or false'),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_result_is_that_hosts_failed_entry_naming_the_field(real_result, case):
    path, value, message = MALFORMED[case]
    report = fr.build_report([fr.host_entry(replaced(real_result, path, value), "bad", NOW),
                              fr.host_entry(real_result, "good", NOW)], generated_at=NOW)
    bad, good = sorted(report["hosts"], key=lambda e: e["host"])
    assert bad["status"] == "failed" and [i["code"] for i in bad["issues"]] == ["audit_failed"]
    assert message in bad["issues"][0]["message"]
    assert good == fr.host_entry(real_result, "good", NOW)
    rendered = render_all(report)
    assert "### good (needs action)" in rendered["markdown"]


@property_settings(40)
@given(st.data(), JSON_VALUES)
def test_any_field_of_a_result_set_to_any_json_leaves_the_other_hosts_report(real_result, data, value):
    path = data.draw(st.sampled_from(paths(real_result)))
    good = fr.host_entry(real_result, "good", NOW)
    for entry in (fr.host_entry(replaced(real_result, path, value), "bad", NOW),
                  # The same from the fact cache: an entry the report did not build in this run.
                  replaced(fr.host_entry(real_result, "bad", NOW), path, value)):
        report = fr.build_report([entry, copy.deepcopy(good)], generated_at=NOW, policies=["needs_action"])
        render_all(report)
        assert [e for e in report["hosts"] if e["host"] == "good"] == [good]
        bad = [e for e in report["hosts"] if e["host"] != "good"]
        assert len(bad) == 1 and bad[0]["status"] in ("ok", "needs_action", "failed")


def test_a_malformed_cached_entry_is_that_hosts_failed_entry(real_result):
    cached = fr.host_entry(real_result, "cached", NOW)
    cached["status"] = "fine"
    report = fr.build_report([cached, fr.host_entry(real_result, "good", NOW), "junk"], generated_at=NOW)
    by_host = dict((e["host"], e) for e in report["hosts"])
    assert by_host["cached"]["status"] == "failed" and by_host["cached"]["audited_at"] == NOW
    assert 'status is "fine"; expected one of ok, needs_action' in by_host["cached"]["issues"][0]["message"]
    assert by_host["(entry 2)"]["status"] == "failed"
    render_all(report)


# --- hypeman's numbers that are not numbers -------------------------------------------------------


@pytest.mark.parametrize("where", ["checks", "init_failures", "quarantined_vfs"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "3", [], True])
def test_a_non_finite_sentinel_counter_is_unreadable_metrics_on_that_host(real_result, where, value):
    result = copy.deepcopy(real_result)
    if where == "checks":
        result["metrics"]["sample"]["checks"]["ok"] = value
    else:
        result["metrics"]["sample"][where] = value
    report = fr.build_report([fr.host_entry(result, "bad", NOW), fr.host_entry(real_result, "good", NOW)],
                             generated_at=NOW)
    bad = [e for e in report["hosts"] if e["host"] == "bad"][0]
    assert bad["status"] == "needs_action" and bad["metrics"]["sample"] is None
    unreadable = [i for i in bad["issues"] if i["code"] == "metrics_unreadable"]
    assert len(unreadable) == 1 and "expected a finite number" in unreadable[0]["message"]
    assert bad["store"] == real_result["store"]  # the rest of the audit is kept
    assert report["summary"]["hosts_metrics_unreadable"] == 1
    rendered = render_all(report)
    assert "hypeman_vgpu_hypeman_metrics_readable 0" in rendered["prometheus bad"]


# --- Prometheus text ----------------------------------------------------------------------------------


LABEL_TEXT = st.text(st.sampled_from('\\"\n\r{}=, a0:.\u2028') | st.characters(), max_size=40)


@property_settings(40)
@given(LABEL_TEXT)
@example('0000:82:00.0"} 0\nhypeman_vgpu_audit_needs_action{x="')
@example("ok\\nhypeman_vgpu_audit_needs_action 0\n")
def test_any_label_value_round_trips_through_the_textfile(real_result, address):
    result = copy.deepcopy(real_result)
    result["placement"]["gpus"][0]["address"] = address
    entry = fr.host_entry(result, "h", NOW)
    text = fr.render_prometheus(entry)
    # One line per sample, each parses; the card's label comes back as it was.
    samples = [line for line in text.split("\n") if line and not line.startswith("#")]
    families = _metrics.parse(text, wanted=("hypeman_vgpu_card_health", "hypeman_vgpu_audit_needs_action"))
    assert len(samples) == len(set(samples))
    assert [labels["card"] for labels, _value in families["hypeman_vgpu_card_health"]] == [
        gpu["address"] for gpu in result["placement"]["gpus"]]
    assert [value for _labels, value in families["hypeman_vgpu_audit_needs_action"]] == [1.0]


# --- Markdown ----------------------------------------------------------------------------------------


@property_settings(40)
@given(LABEL_TEXT | st.text())
@example("fine\r\r# ALL HOSTS HEALTHY\u2028[click](https://evil.example/x) <img src=x> _em_ `code`")
def test_markdown_text_is_one_inert_line(text):
    shown = fr._md(text)
    assert len(shown.splitlines()) <= 1 and "\r" not in shown and "\n" not in shown
    # Take every escape away: no Markdown special character and no backslash is left unescaped.
    bare = re.sub(r"\\.", "", shown)
    assert not set(bare) & set("\\`*[]<>|~&")
    assert not re.search(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", bare)


def test_host_data_cannot_add_markdown_lines_links_or_arguments(real_result):
    result = copy.deepcopy(real_result)
    result["issues"][0]["message"] = "card is fine\r\r# ALL HOSTS HEALTHY\u2028[click](https://evil.example/x)"
    result["placement"]["gpus"][0]["address"] = "0000:82:00.0 | x |\n\n## Injected\n\n<img src=x onerror=alert(1)>"
    text = fr.render_markdown(fr.build_report([fr.host_entry(result, "gpu-01", NOW)], generated_at=NOW))
    assert "\r" not in text and "\u2028" not in text
    assert not [line for line in text.splitlines() if "ALL HOSTS" in line and line.startswith("#")]
    assert not [line for line in text.splitlines() if line.startswith("## Injected")]
    assert "\\[click\\](https://evil.example/x)" in text and "\\<img src=x onerror=alert(1)\\>" in text


@pytest.mark.parametrize("host, gpu, command", [
    ("gpu-02", "0000:83:00.0", "ansible-playbook hypeman.vgpu.recover_gpu -e target_hosts=gpu-02 "
                               "-e target_gpu=0000:83:00.0"),
    ("gpu;reboot", "0000:83:00.0", "ansible-playbook hypeman.vgpu.recover_gpu -e 'target_hosts=gpu;reboot' "
                                   "-e target_gpu=0000:83:00.0"),
    ("gpu-02", "0000:83:00.0 -e target_hosts=all", None),
    ("gpu-02", "0000:83:00.0\n", None),
    ("gpu 02", "0000:83:00.0", None),
    ("a`b", "0000:83:00.0", None),
    ("{{ lookup('pipe','id') }}", "0000:83:00.0", None),
])
def test_a_recovery_command_only_for_plain_names_and_shell_quoted(host, gpu, command):
    assert fr.recover_command(host, gpu) == command
    entry = fr.host_entry({"store": {}, "issues": [], "placement": {"gpus": [
        {"address": gpu, "vf_total": 16, "quarantined": 16, "allocatable": 0, "claimed": 0, "drained": True,
         "idle": True}]}}, host, NOW)
    lines = [line for line in fr.render_markdown(fr.build_report([entry])).splitlines() if line.startswith("- ")]
    assert len(lines) == 1
    if command:
        assert "`%s`" % command in lines[0]
    else:
        assert "no command shown" in lines[0] and "`" not in re.sub(r"\\.", "", lines[0])  # no code span


# --- history records -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1" + "0" * 400, "-1", "1e400"])
def test_a_history_record_with_an_impossible_number_is_skipped_and_ages_out(tmp_path, bad):
    history = tmp_path / "history"
    history.mkdir()
    record = fp.history_record(fr.build_report([], generated_at="2026-09-01T09:00:00Z"))
    text = fp.to_json(record).replace('"quarantined_vfs":0', '"quarantined_vfs":%s' % bad)
    assert text != fp.to_json(record)
    (history / "fleet-audit-20260901T090000Z.json").write_text(text)
    report = fp.attach_history(fr.build_report([], generated_at=NOW), str(tmp_path), 3)
    assert len(report["history"]["warnings"]) == 1 and "totals must hold numbers" in report["history"]["warnings"][0]
    render_all(report)
    # Still counted as one of ours: it expires like any other record.
    report = fp.attach_history(fr.build_report([], generated_at=NOW), str(tmp_path), 1)
    assert report["history"]["expired"] == [str(history / "fleet-audit-20260901T090000Z.json")]


@property_settings(40)
@given(st.dictionaries(st.sampled_from(fp._TOTALS), st.floats() | st.integers(-10 ** 30, 10 ** 30)))
@example({"quarantined_vfs": math.nan})
@example({"capacity_loss_pct": math.inf})
@example({"slots_total": 10 ** 400})
def test_any_numbers_in_a_history_record_are_read_and_drawn_or_skipped(numbers):
    record = fp.history_record(fr.build_report([], generated_at="2026-09-01T09:00:00Z"))
    record["totals"].update(numbers)
    try:
        fp.validate_record(json.loads(json.dumps(record)), "audit")
    except fp.HistoryError:
        return
    report = fr.build_report([], generated_at=NOW)
    report["history"] = {"changes": fp.changes(record, fp.history_record(report)), "warnings": [],
                         "points": fp.trends(report, {"records": [record]})["points"]}
    fp.render_trends_html(report)


# --- the report directory ------------------------------------------------------------------------------


def _report_files(directory):
    return dict((str(directory / name), "new %s\n" % name) for name in
                ("fleet-audit.html", "fleet-audit.json", "fleet-audit.md"))


@pytest.mark.parametrize("how", ["fifo", "dir", "symlink", "dangling"])
@pytest.mark.parametrize("name", ["fleet-audit.html", "fleet-audit.md"])
def test_a_report_path_that_is_not_a_regular_file_is_refused_and_nothing_changes(tmp_path, how, name):
    out = tmp_path / "out"
    out.mkdir()
    for other in ("fleet-audit.html", "fleet-audit.json", "fleet-audit.md"):
        (out / other).write_text("old\n")
    (tmp_path / "target").write_text("secret\n")
    replace_with(str(out / name), how, str(tmp_path / "target"))
    before = tree_fingerprint(str(tmp_path))
    with hang_detector(20, "write_reports"):
        with pytest.raises(OSError) as err:
            fr.write_reports(_report_files(out))
    assert err.value.filename == str(out / name) and "expected a regular file" in str(err.value)
    assert tree_fingerprint(str(tmp_path)) == before  # no file replaced, no temporary file left


def test_a_symlinked_history_directory_gets_no_record_and_is_never_written_through(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    os.symlink(str(elsewhere), str(out / "history"))
    report = fp.attach_history(fr.build_report([], generated_at=NOW), str(out), 5)
    assert report["history"]["record_file"] is None and "no history record" in report["history"]["warnings"][0]
    # A report whose record file still points there (swapped after the check, or a hand-made report).
    files = _report_files(out)
    files[str(out / "history" / "fleet-audit-20260901T100000Z.json")] = "{}\n"
    with pytest.raises(OSError) as err:
        fr.write_reports(files, root=str(out))
    assert err.value.filename == str(out / "history") and "symlink" in str(err.value)
    assert os.listdir(str(elsewhere)) == [] and sorted(os.listdir(str(out))) == ["history"]


def test_a_symlinked_report_directory_is_the_operators_choice(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(str(real), str(tmp_path / "reports"))
    files = _report_files(tmp_path / "reports")
    files[str(tmp_path / "reports" / "history" / "fleet-audit-20260901T100000Z.json")] = "{}\n"
    written, unchanged = fr.write_reports(files, root=str(tmp_path / "reports"))
    assert written == sorted(files) and unchanged == []
    assert sorted(os.listdir(str(real))) == ["fleet-audit.html", "fleet-audit.json", "fleet-audit.md", "history"]
    assert stat.S_IMODE(os.stat(str(real / "history")).st_mode) == 0o755


def test_owner_group_and_mode_are_kept_and_new_files_get_the_default_mode(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    html = out / "fleet-audit.html"
    html.write_text("old\n")
    os.chmod(str(html), 0o640)
    owner = (65534, 65534) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(str(html), *owner)
    umask = os.umask(0o077)
    try:
        written, _unchanged = fr.write_reports(_report_files(out))
    finally:
        os.umask(umask)
    assert written == sorted(_report_files(out))
    info = os.stat(str(html))
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == owner + (0o640,)
    assert html.read_text() == "new fleet-audit.html\n"
    assert stat.S_IMODE(os.stat(str(out / "fleet-audit.json")).st_mode) == 0o644


def test_an_owner_that_cannot_be_kept_is_a_warning(tmp_path, monkeypatch):
    path = tmp_path / "fleet-audit.md"
    path.write_text("old\n")
    mine = os.stat(str(path))
    old = os.stat_result((mine.st_mode, 0, 0, 1, mine.st_uid + 1, mine.st_gid + 1, 0, 0, 0, 0))

    def refuse(_fd, _uid, _gid):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchown", refuse)
    warnings = []
    fd = os.open(str(path), os.O_RDONLY)
    try:
        fr._keep_owner(fd, old, str(path), warnings)
    finally:
        os.close(fd)
    assert warnings == ["fleet report %s: not permitted to keep its owner; it is now owned by %d:%d instead of "
                        "%d:%d" % (path, mine.st_uid, mine.st_gid, mine.st_uid + 1, mine.st_gid + 1)]


def test_a_failure_leaves_every_file_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("fleet-audit.html", "fleet-audit.json"):
        (out / name).write_text("old\n")
    before = tree_fingerprint(str(tmp_path))
    real_fsync = os.fsync
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 3:  # the third temporary file
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError) as err:
        fr.write_reports(_report_files(out))
    assert err.value.filename == str(out / "fleet-audit.md")
    monkeypatch.undo()
    assert tree_fingerprint(str(tmp_path)) == before


def test_text_that_is_not_utf8_encodable_is_written_escaped(tmp_path):
    path = str(tmp_path / "fleet-audit.md")
    assert fr.write_reports({path: "host \udcff\n"}) == ([path], [])
    assert open(path, encoding="utf-8").read() == "host \\udcff\n"


@pytest.mark.parametrize("actions, message", [
    ([1], "actions[0] is 1; expected an action object"), (5, "actions is 5; expected an array of actions")])
def test_unusable_reconcile_actions_are_that_hosts_failure(real_result, actions, message):
    entry = fr.host_entry(real_result, "h", NOW, actions)
    assert entry["status"] == "failed" and entry["actions"] == [] and message in entry["issues"][0]["message"]
    render_all(fr.build_report([entry]))
