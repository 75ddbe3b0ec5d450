# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""fleet_pictures: the health map, capacity view, history and "what changed" over random fleets and hostile
history files."""

from __future__ import annotations

import html.parser
import json
import os

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures as fp
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as fr
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector, property_settings, replace_with

VFS = 16


def card(address, kind, below=0):
    """A card's placement figures as the host audit reports them, in one of the states."""
    quarantined = {"healthy": 0, "below_threshold": 0, "overflow_only": 3, "draining": VFS, "ready_for_cycle": VFS,
                   "no_vfs": 0, "placement_disabled": None}[kind]
    total = 0 if kind == "no_vfs" else VFS
    return {"address": address, "vf_total": total, "sriov_numvfs": total, "sriov_totalvfs": VFS,
            "quarantined": quarantined, "allocatable": 0 if quarantined is None else total - quarantined,
            "allocated": 0, "claimed": 1 if kind == "draining" else 0, "held_open": 0,
            "overflow_only": None if quarantined is None else 0 < quarantined < total,
            "drained": None if quarantined is None else total > 0 and quarantined == total,
            "idle": kind != "draining", "idle_blockers": [], "live_instances": [],
            "below_threshold_vfs": below if kind == "below_threshold" else 0}


def host_result(cards, quarantined=(), used=0, valid=True):
    total = sum(c["vf_total"] for c in cards)
    q_slots = sum(c["quarantined"] or 0 for c in cards)
    allocatable = 0 if not valid else max(0, total - q_slots - used)
    lost = total if not valid else q_slots
    codes = [] if valid else [fr._issue("critical", "store_unavailable", "legacy store", "repair")]
    codes += [fr._issue("warning", "card_overflow_only", "x", "y", c["address"]) for c in cards
              if c["overflow_only"]]
    return {
        "store": {"valid": valid, "quarantined": list(quarantined), "owned": [], "by_hypeman": list(quarantined),
                  "would_quarantine": [], "below_threshold": {}, "stale_records": []},
        "placement": {"placement_disabled_reason": None if valid else "store unavailable", "threshold": 2,
                      "slots": {"total": total, "used": used, "allocatable": allocatable, "quarantined": q_slots},
                      "gpus": cards},
        "capacity": {"total_slots": total, "allocatable_slots": allocatable, "quarantined_slots": 0 if not valid
                     else q_slots, "lost_slots": lost, "lost_pct": round(100.0 * lost / total, 2) if total else 0.0},
        "issues": codes, "needs_action": bool(codes),
    }


CARD_KINDS = ("healthy", "below_threshold", "overflow_only", "draining", "ready_for_cycle", "no_vfs")


@st.composite
def fleets(draw, max_hosts=12):
    entries = []
    for index in range(draw(st.integers(0, max_hosts))):
        host = "h%02d-%s" % (index, draw(st.text("ab<&\"' é", max_size=3)))
        kind = draw(st.sampled_from(("audited", "audited", "audited", "unreachable", "failed", "broken")))
        if kind == "unreachable":
            entries.append(fr.host_entry({"unreachable": True, "msg": "no route"}, host))
            continue
        if kind == "failed":
            entries.append(fr.host_entry({"failed": True, "msg": "boom"}, host))
            continue
        kinds = draw(st.lists(st.sampled_from(CARD_KINDS), max_size=8))
        cards = [card("0000:%02x:00.0" % (0x80 + i), k, draw(st.integers(1, 3))) for i, k in enumerate(kinds)]
        if kind == "broken":
            cards = [card(c["address"], "placement_disabled") for c in cards]
        quarantined = ["%s.%d" % (c["address"], n) for c in cards for n in range(c["quarantined"] or 0)]
        free = sum(c["vf_total"] - (c["quarantined"] or 0) for c in cards)
        used = draw(st.integers(0, free)) if kind != "broken" else 0
        entries.append(fr.host_entry(host_result(cards, quarantined, used, kind != "broken"), host))
    return fr.build_report(entries, generated_at="2026-12-02T06:00:00Z")


class _Cells(html.parser.HTMLParser):
    """The map cells of a rendered page: state, attributes and the text inside each."""

    def __init__(self):
        super().__init__()
        self.cells, self._depth, self._in_map = [], 0, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and attrs.get("id") == "health-map":
            self._in_map = True
        if self._in_map and tag == "li" and "data-state" in attrs:
            self.cells.append({"attrs": attrs, "text": ""})
            self._depth = 1
        elif self._depth and tag == "li":
            self._depth += 1

    def handle_endtag(self, tag):
        if tag == "section":
            self._in_map = False
        if self._depth and tag == "li":
            self._depth -= 1

    def handle_data(self, data):
        if self._depth:
            self.cells[-1]["text"] += data


@property_settings(40)
@given(fleets())
def test_map_and_capacity_agree_with_the_report(report):
    groups = fp.health_map(report)
    summary = report["summary"]
    assert [g["host"] for g in groups] == [e["host"] for e in report["hosts"]]
    flags = [g["needs_action"] for g in groups]
    assert flags == sorted(flags, reverse=True)
    for group, entry in zip(groups, report["hosts"]):
        assert len(group["cells"]) == len((entry.get("placement") or {}).get("gpus") or [])
        assert (group["placeholder"] is not None) == (not group["cells"] and entry["status"] != "ok"
                                                      and entry["status"] != "needs_action")
    counts = fp.map_counts(groups)
    assert sum(counts.values()) == summary["cards_total"]
    assert counts["ready_for_cycle"] == summary["cards_ready_for_cycle"]
    assert counts["no_vfs"] + counts["store_unavailable"] >= summary["cards_without_vfs"]
    # Cards of a host whose store is unavailable show that, whatever their own figures say.
    assert counts["store_unavailable"] == sum(len(e["placement"]["gpus"]) for e in report["hosts"]
                                              if e["store"] and not e["store"]["valid"])
    capacity = fp.capacity_view(report)
    for row in capacity["hosts"]:
        assert row["allocatable"] + row["used"] + row["quarantined"] + row["unavailable"] == row["total"]
        assert min(row[k] for k in ("allocatable", "used", "quarantined", "unavailable")) >= 0
    fleet = capacity["fleet"]
    assert fleet["total"] == summary["slots_total"] and fleet["allocatable"] == summary["slots_allocatable"]
    assert fleet["quarantined"] == summary["slots_quarantined"]
    assert fleet["quarantined"] + fleet["unavailable"] == summary["slots_lost"]
    page = fr.render_html(report)
    cells = _Cells()
    cells.feed(page)
    card_cells = [c for c in cells.cells if "data-card" in c["attrs"]]
    assert len(card_cells) == summary["cards_total"]
    assert len(cells.cells) - len(card_cells) == len([g for g in groups if g["placeholder"]])
    for cell in cells.cells:
        label = dict((s[0], s) for s in fp.MAP_STATES)[cell["attrs"]["data-state"]]
        # Colour is never the only signal: the cell's text has its code and its label.
        assert label[3] in cell["text"] and label[2] in cell["text"]
        if "data-card" in cell["attrs"]:
            assert "%s: %s" % (cell["attrs"]["data-card"], label[2]) in cell["text"]
        assert cell["attrs"]["title"]
    for group in groups:
        assert 'id="%s"' % group["anchor"] in page


@property_settings(40)
@given(fleets(), fleets())
def test_changes_between_random_audits(first, second):
    a, b = fp.history_record(first), fp.history_record(second)
    same = fp.changes(a, a)
    assert same["text"] == "no change since the previous audit"
    forward, backward = fp.changes(a, b), fp.changes(b, a)
    assert sorted(forward["hosts_added"]) == sorted(backward["hosts_gone"])
    common = set(a["hosts"]) & set(b["hosts"])
    assert forward["new_quarantines"] == sum(
        len(set(b["hosts"][h]["quarantined"]) - set(a["hosts"][h]["quarantined"])) for h in common)
    assert set(forward["new_quarantine_hosts"]) <= common
    assert forward["text"]
    # A record survives its file: written, read back, validated.
    assert fp.validate_record(json.loads(fp.to_json(b)), "audit") == b


def _report(hosts, at="2026-12-02T06:00:00Z"):
    """hosts: {name: (quarantined VF list, [card kinds])} or None for an unreachable host."""
    entries = []
    for name, spec in sorted(hosts.items()):
        if spec is None:
            entries.append(fr.host_entry({"unreachable": True}, name))
            continue
        quarantined, kinds = spec
        cards = [card("0000:%02x:00.0" % (0x80 + i), k) for i, k in enumerate(kinds)]
        entries.append(fr.host_entry(host_result(cards, quarantined), name))
    return fr.build_report(entries, generated_at=at)


def test_changes_in_words():
    before = _report({"a": ([], ["healthy", "overflow_only"]), "b": ([], ["healthy"]), "c": (["x"], ["healthy"]),
                      "d": ([], ["ready_for_cycle"])}, "2026-12-01T06:00:00Z")
    after = _report({"a": (["1", "2"], ["healthy", "overflow_only"]), "b": (["3"], ["healthy"]),
                     "c": (["x"], ["healthy"]), "d": ([], ["healthy"])})
    changes = fp.changes(fp.history_record(before), fp.history_record(after))
    assert changes["text"] == "3 new quarantines on 2 hosts; 1 card recovered"
    assert changes["new_quarantine_hosts"] == ["a", "b"] and changes["previous_at"] == "2026-12-01T06:00:00Z"
    assert fp.changes(None, fp.history_record(after))["text"] == "first audit in the history: nothing to compare with"
    gone = _report({"a": None, "b": ([], ["healthy"]), "e": ([], [])})
    text = fp.changes(fp.history_record(after), fp.history_record(gone))["text"]
    # An unreachable host's quarantines are not "released"; its cards are not compared.
    assert text == ("1 quarantine released on 1 host; 1 host unreachable or without audit data; 1 host new in the "
                    "audit; 2 hosts no longer in the audit")


def _write(directory, name, data):
    path = os.path.join(directory, name)
    with open(path, "w" if isinstance(data, str) else "wb") as handle:
        handle.write(data)
    return path


def test_history_keeps_the_newest_and_skips_what_is_not_ours(tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    for day in range(1, 6):
        report = _report({"a": ([], ["healthy"] * day)}, "2026-12-%02dT06:00:00Z" % day)
        _write(str(history), fp.history_name("audit", report["generated_at"]), fp.to_json(fp.history_record(report)))
    _write(str(history), "notes.txt", "not ours, never touched")
    _write(str(history), "fleet-reconcile-20261203T060000Z.json", "{}")
    report = fp.attach_history(_report({"a": (["v"], ["healthy"] * 6)}, "2026-12-06T06:00:00Z"), str(tmp_path), 4)
    history_view = report["history"]
    assert [p["generated_at"][:10] for p in history_view["points"]] == [
        "2026-12-03", "2026-12-04", "2026-12-05", "2026-12-06"]
    assert [p["cards_total"] for p in history_view["points"]] == [3, 4, 5, 6]
    assert [os.path.basename(p) for p in history_view["expired"]] == [
        "fleet-audit-20261201T060000Z.json", "fleet-audit-20261202T060000Z.json"]
    assert history_view["record_file"] == str(history / "fleet-audit-20261206T060000Z.json")
    assert history_view["changes"]["text"] == "1 new quarantine on 1 host"
    assert history_view["warnings"] == []
    assert "Since the previous audit (2026-12-05T06:00:00Z): 1 new quarantine on 1 host." in fr.render_html(report)
    assert fp.attach_history(_report({}), str(tmp_path), 0)["history"]["points"][-1]["hosts_total"] == 0
    assert fp.load_history(str(tmp_path), "audit", 0) == {"records": [], "warnings": [], "expired": []}


def test_a_record_dated_after_this_run_is_skipped_kept_and_not_counted(tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    for day in ("01", "02", "03"):
        record = fp.history_record(_report({"a": ([], ["healthy"] * int(day))}, "2026-12-%sT06:00:00Z" % day))
        _write(str(history), "fleet-audit-202612%sT060000Z.json" % day, fp.to_json(record))
    future = fp.history_record(_report({"a": (["v"], ["healthy"] * 9)}, "2099-01-01T00:00:00Z"))
    _write(str(history), "fleet-audit-20990101T000000Z.json", fp.to_json(future))
    report = fp.attach_history(_report({"a": ([], ["healthy"] * 4)}, "2026-12-04T06:00:00Z"), str(tmp_path), 3)
    view = report["history"]
    # Compared with the 3rd (not the future record), the 1st expires, the future one is neither.
    assert [p["generated_at"][:10] for p in view["points"]] == ["2026-12-02", "2026-12-03", "2026-12-04"]
    assert [os.path.basename(p) for p in view["expired"]] == ["fleet-audit-20261201T060000Z.json"]
    assert view["warnings"] == ["skipped fleet report history file %s: dated after this run "
                                "(fleet-audit-20261204T060000Z.json); a clock was ahead when it was written. "
                                "It is kept: delete it if it is wrong" % (history / "fleet-audit-20990101T000000Z.json")]


HOSTILE = {
    "garbage": b"\x00\xff\xfe not json",
    "not-utf8": b'{"schema": 1, "kind": "audit\xff"}',
    "deep": b"[" * 100000 + b"]" * 100000,
    "wrong-shape": b'{"schema": 1, "kind": "audit", "generated_at": "x", "totals": {}, "hosts": {}}',
    "bad-host": json.dumps({"schema": 1, "kind": "audit", "generated_at": "x",
                            "totals": dict((k, 1) for k in fp._TOTALS),
                            "hosts": {"a": {"status": "ok", "quarantined": [1], "cards": {}, "card_count": 1}}}).encode(),
    "huge": b" " * (fp.HISTORY_FILE_LIMIT + 1),
}


@pytest.mark.parametrize("how", sorted(HOSTILE) + ["fifo", "dir", "symlink", "dangling"])
def test_hostile_history_files_are_skipped_with_a_warning(tmp_path, how):
    history = tmp_path / "history"
    history.mkdir()
    good = _report({"a": ([], ["healthy"])}, "2026-12-01T06:00:00Z")
    _write(str(history), "fleet-audit-20261201T060000Z.json", fp.to_json(fp.history_record(good)))
    target = str(history / "fleet-audit-20261202T060000Z.json")
    if how in HOSTILE:
        replace_with(target, "file", HOSTILE[how])
    else:
        replace_with(target, how, str(history / "fleet-audit-20261201T060000Z.json"))
    with hang_detector(20, "load_history"):
        loaded = fp.load_history(str(tmp_path), "audit", 5)
    assert len(loaded["records"]) == 1 and len(loaded["warnings"]) == 1
    assert loaded["warnings"][0].startswith("skipped fleet report history file %s: " % target)


@pytest.mark.parametrize("how", ["file", "fifo", "symlink"])
def test_history_directory_that_is_not_one(tmp_path, how):
    replace_with(str(tmp_path / "history"), how, str(tmp_path) if how == "symlink" else b"x")
    with hang_detector(20, "load_history"):
        loaded = fp.load_history(str(tmp_path), "audit", 5)
    assert loaded["records"] == [] and "not a directory" in loaded["warnings"][0]


@property_settings(60)
@given(st.binary(max_size=2000) | st.builds(lambda v: json.dumps(v).encode(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)))
def test_any_history_file_content_is_read_or_skipped(content):
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        os.mkdir(os.path.join(work, "history"))
        _write(os.path.join(work, "history"), "fleet-audit-20261202T060000Z.json", content)
        loaded = fp.load_history(work, "audit", 3)
        assert len(loaded["records"]) + len(loaded["warnings"]) == 1


def test_map_line_and_markdown():
    report = _report({"a": (["q"], ["overflow_only", "healthy"]), "b": None})
    assert fp.map_line(report) == ("health map: 2 card(s) on 2 host(s) (2 need action): 1 overflow-only, 1 healthy; "
                                   "1 host(s) without card data")
    assert "## Since the previous audit" not in fr.render_markdown(report)
    text = fr.render_markdown(fp.attach_history(report, "/nonexistent/hypeman-vgpu-test", 3))
    assert "## Since the previous audit\n\nfirst audit in the history: nothing to compare with." in text


def test_one_state_list():
    # The colours and labels are drawn for exactly the states fleet_report classifies, in its order.
    assert tuple(s[0] for s in fp.MAP_STATES) == fr.MAP_STATE_KEYS
    assert sorted(fr.CARD_HEALTH_CODES.values()) == list(range(len(fr.MAP_STATE_KEYS)))
    assert fr.CARD_HEALTH_CODES["healthy"] == 0 and fr.CARD_HEALTH_CODES["store_unavailable"] == 6
