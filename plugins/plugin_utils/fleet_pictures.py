# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report's pictures: health map, capacity bars, trends across audits, and what changed.

The figures are computed here as plain data (unit-tested, and what the
browser check compares with the page); the HTML renderer only draws them.
A card's state comes from :func:`fleet_report.card_state` (the one home of
the card rules) and the host's status from the report entry; nothing here
re-derives either.

History: each report run writes a small record (:func:`history_record`) to
``<report_dir>/history/fleet-<kind>-<UTC stamp>.json``; the next run reads
the newest ``keep - 1`` of them (:func:`load_history`), skipping any file
that is not one of ours (wrong kind of file, too large, not UTF-8, not JSON,
too deep, wrong shape) with a warning, and lists the ones beyond ``keep``
for deletion.
"""

from __future__ import annotations

import html
import json
import os
import re
import stat

from ansible_collections.hypeman.vgpu.plugins.module_utils import _fileio
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as _report

HISTORY_SCHEMA = 1
HISTORY_SUBDIR = "history"
# A record is about 60 bytes per host plus its quarantined VFs: 4 MiB is a fleet of tens of thousands.
HISTORY_FILE_LIMIT = 4 * 1024 * 1024
_HISTORY_NAME = re.compile(r"^fleet-(audit|reconcile)-([0-9]{8}T[0-9]{6}Z)\.json$")

# Map states, worst first: (key, short name, label, text code shown in the cell, colour, CSS pattern class).
# The code is the non-colour signal; hatched patterns tell the action states apart in greyscale too.
MAP_STATES = (
    ("unreachable", "unreachable", "unreachable or no audit data", "UNR", "#6b6b6b", "pat-cross"),
    ("store_unavailable", "store unavailable", "store unavailable: placement disabled", "STO", "#c0392b",
     "pat-cross"),
    ("ready_for_cycle", "ready for cycle", "drained and idle: ready for an SR-IOV cycle", "CYC", "#8e44ad",
     "pat-diag"),
    ("draining", "draining", "drained, instances still on it", "DRN", "#d35400", "pat-diag"),
    ("no_vfs", "no VFs", "no VFs (SR-IOV off)", "NOV", "#7f8c8d", "pat-dots"),
    ("overflow_only", "overflow-only", "overflow-only: some VFs quarantined", "OVF", "#e6a100", "pat-dots"),
    ("below_threshold", "below threshold", "failures below the threshold", "BLW", "#f1d54a", "pat-none"),
    ("healthy", "healthy", "healthy", "OK", "#3a9a52", "pat-none"),
)
MAP_STATE_KEYS = _report.MAP_STATE_KEYS
_STATE = dict((s[0], s) for s in MAP_STATES)
_HOST_DOWN = _report.HOST_DOWN


class HistoryError(ValueError):
    """A history file that is not one of ours (the message says why)."""


# --- health map -----------------------------------------------------------------------------------


map_state = _report.card_map_state


def host_anchor(index):
    """The id of a host's section in the HTML report (by position: host names may hold anything)."""
    return "host-%d" % index


def health_map(report):
    """One group per host in report order (hosts needing action first), one cell per card.

    A host without card data (unreachable, failed, no data) gets one
    ``placeholder`` cell so it shows on the map; it is not a card.
    """
    groups = []
    for index, entry in enumerate(report["hosts"]):
        cells = []
        for gpu in (entry.get("placement") or {}).get("gpus") or []:
            cells.append({
                "card": gpu.get("address"), "state": map_state(entry, gpu),
                "vfs": gpu.get("vf_total"), "quarantined": gpu.get("quarantined"),
                "allocatable": gpu.get("allocatable"), "claimed": gpu.get("claimed"),
                "below_threshold": gpu.get("below_threshold_vfs"),
            })
        placeholder = None
        if not cells and entry["status"] in _HOST_DOWN:
            placeholder = "unreachable"
        groups.append({"host": entry["host"], "anchor": host_anchor(index), "status": entry["status"],
                       "needs_action": entry["needs_action"], "severity": entry["severity"], "cells": cells,
                       "placeholder": placeholder})
    return groups


def map_counts(groups):
    """Cards per map state (placeholders apart), for the legend and the one-line summary."""
    counts = dict((key, 0) for key in MAP_STATE_KEYS)
    for group in groups:
        for cell in group["cells"]:
            counts[cell["state"]] += 1
    return counts


def map_line(report):
    """One line saying what the map shows, e.g. for ``make demo``."""
    groups = health_map(report)
    counts = map_counts(groups)
    cards = sum(counts.values())
    parts = ["%d %s" % (counts[key], _STATE[key][1]) for key in MAP_STATE_KEYS if counts[key]]
    down = len([g for g in groups if g["placeholder"]])
    text = "health map: %d card(s) on %d host(s) (%d need action)%s%s" % (
        cards, len(groups), len([g for g in groups if g["needs_action"]]), ": " if parts else "", ", ".join(parts))
    if down:
        text += "; %d host(s) without card data" % down
    return text


# --- capacity ---------------------------------------------------------------------------------------

CAPACITY_SEGMENTS = (
    ("allocatable", "allocatable", "#3a9a52"),
    ("used", "in use", "#2f6fb0"),
    ("quarantined", "quarantined", "#e6a100"),
    ("unavailable", "unavailable (placement disabled)", "#c0392b"),
)


def _host_capacity(entry):
    capacity = entry.get("capacity") or {}
    total = int(capacity.get("total_slots") or 0)
    if (entry.get("placement") or {}).get("placement_disabled_reason"):
        return {"total": total, "allocatable": 0, "used": 0, "quarantined": 0, "unavailable": total}
    allocatable = int(capacity.get("allocatable_slots") or 0)
    quarantined = int(capacity.get("quarantined_slots") or 0)
    # Allocated and unquarantined: hypeman counts a quarantined VF as quarantined whether allocated or not.
    used = max(0, total - allocatable - quarantined)
    return {"total": total, "allocatable": allocatable, "used": used, "quarantined": quarantined,
            "unavailable": max(0, total - allocatable - quarantined - used)}


def capacity_view(report):
    """Slots per host (allocatable, in use, quarantined, unavailable; they add up to the total) and the fleet."""
    hosts = []
    fleet = dict((key, 0) for key in ("total", "allocatable", "used", "quarantined", "unavailable"))
    for index, entry in enumerate(report["hosts"]):
        row = _host_capacity(entry)
        row.update({"host": entry["host"], "anchor": host_anchor(index), "audited": entry.get("capacity") is not None})
        hosts.append(row)
        for key in fleet:
            fleet[key] += row[key]
    return {"hosts": hosts, "fleet": fleet}


# --- history and changes ----------------------------------------------------------------------------

_TOTALS = ("hosts_total", "hosts_needing_action", "hosts_unreachable", "quarantined_vfs", "slots_total",
           "slots_lost", "capacity_loss_pct", "cards_total")


def history_record(report):
    """The small record of one report kept in the history: fleet totals and, per host, what changes track."""
    hosts = {}
    for entry in report["hosts"]:
        cards = {}
        for gpu in (entry.get("placement") or {}).get("gpus") or []:
            state = map_state(entry, gpu)
            if state != "healthy":
                cards[str(gpu.get("address"))] = state
        hosts[entry["host"]] = {
            "status": entry["status"],
            "quarantined": sorted((entry.get("store") or {}).get("quarantined") or []),
            "cards": cards,
            "card_count": len((entry.get("placement") or {}).get("gpus") or []),
        }
    summary = report["summary"]
    return {"schema": HISTORY_SCHEMA, "kind": report["kind"], "generated_at": report["generated_at"],
            "totals": dict((key, summary[key]) for key in _TOTALS), "hosts": hosts}


def history_name(kind, generated_at):
    """``fleet-<kind>-<YYYYmmddTHHMMSSZ>.json`` from the report's RFC 3339 time (sortable by name)."""
    digits = re.sub(r"[^0-9]", "", str(generated_at or ""))[:14]
    if len(digits) != 14:
        raise HistoryError("report time %r is not an RFC 3339 UTC time" % (generated_at,))
    return "fleet-%s-%sT%sZ.json" % (kind, digits[:8], digits[8:])


# No count or percentage of a real fleet comes near it; a larger one (or NaN, an infinity) is not ours.
_NUMBER_LIMIT = 10 ** 12


def _is_number(value):
    """A count or percentage a record may hold: finite, 0 to _NUMBER_LIMIT (NaN fails every comparison)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= _NUMBER_LIMIT


def validate_record(data, kind):
    """``data`` if it is a history record of ``kind``; HistoryError naming what is wrong otherwise."""
    if not isinstance(data, dict) or data.get("schema") != HISTORY_SCHEMA:
        raise HistoryError("not a history record (schema %d expected)" % HISTORY_SCHEMA)
    if data.get("kind") != kind:
        raise HistoryError("kind %r, expected %r" % (data.get("kind"), kind))
    if not isinstance(data.get("generated_at"), str):
        raise HistoryError("generated_at is not a string")
    totals = data.get("totals")
    if not isinstance(totals, dict) or not all(_is_number(totals.get(key)) for key in _TOTALS):
        raise HistoryError("totals must hold numbers from 0 to %d for %s" % (_NUMBER_LIMIT, ", ".join(_TOTALS)))
    hosts = data.get("hosts")
    if not isinstance(hosts, dict):
        raise HistoryError("hosts is not a mapping")
    for host, item in hosts.items():
        if not (isinstance(item, dict) and isinstance(item.get("status"), str)
                and isinstance(item.get("quarantined"), list)
                and all(isinstance(vf, str) for vf in item["quarantined"])
                and isinstance(item.get("cards"), dict)
                and all(isinstance(k, str) and v in MAP_STATE_KEYS for k, v in item["cards"].items())
                and _is_number(item.get("card_count"))):
            raise HistoryError("host %r: expected {status, quarantined: [VF], cards: {card: state}, card_count}"
                               % (host,))
    return data


def read_record(path, kind):
    """One history file: a regular file (no symlink, FIFO, device), at most HISTORY_FILE_LIMIT, UTF-8 JSON."""
    try:
        raw = _fileio.read_bytes(path, HISTORY_FILE_LIMIT, follow=False)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise HistoryError(str(err) or type(err).__name__)
    return validate_record(data, kind)


def load_history(report_dir, kind, keep, this_run=None):
    """``{records, warnings, expired}``: the newest ``keep - 1`` readable records of ``kind`` (oldest first),
    one warning per skipped file, and the paths beyond the ``keep`` newest (this run's record counts as one).

    ``this_run``, this run's record name (:func:`history_name`): a record named
    after it is dated after this run, written under a clock that was ahead or
    copied in from elsewhere. It is skipped with a warning, neither compared
    with nor counted nor deleted (our clock may be the wrong one); left in,
    it would stay "the previous audit" of every run until its date passed."""
    out = {"records": [], "warnings": [], "expired": []}
    if not report_dir or keep < 1:
        return out
    directory = os.path.join(report_dir, HISTORY_SUBDIR)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return out
    except OSError as err:
        out["warnings"].append("fleet report history %s: %s; no trends this time" % (directory, err))
        return out
    if not stat.S_ISDIR(info.st_mode):
        out["warnings"].append("fleet report history %s is %s, not a directory; no trends and no history record "
                               "this time" % (directory, _fileio.file_kind(info.st_mode)))
        return out
    try:
        names = sorted(name for name in os.listdir(directory)
                       if _HISTORY_NAME.match(name) and _HISTORY_NAME.match(name).group(1) == kind)
    except OSError as err:
        out["warnings"].append("fleet report history %s cannot be listed: %s" % (directory, err))
        return out
    if this_run:
        for name in [name for name in names if name > this_run]:
            out["warnings"].append("skipped fleet report history file %s: dated after this run (%s); "
                                   "a clock was ahead when it was written. It is kept: delete it if it is wrong"
                                   % (os.path.join(directory, name), this_run))
        names = [name for name in names if name <= this_run]
    # The newest keep - 1 files (this run's record makes keep); every older file of ours is expired.
    for position, name in enumerate(reversed(names)):
        path = os.path.join(directory, name)
        if position >= keep - 1:
            out["expired"].append(path)
            continue
        try:
            out["records"].append(read_record(path, kind))
        except HistoryError as err:
            out["warnings"].append("skipped fleet report history file %s: %s" % (path, err))
    out["records"].reverse()
    out["expired"].reverse()
    return out


def _plural(count, word, plural=None):
    return "%d %s" % (count, word if count == 1 else (plural or word + "s"))


def changes(previous, current):
    """What changed from the ``previous`` history record to ``current`` (both :func:`history_record`).

    Counts and host lists, plus ``text``: one sentence such as "3 new quarantines on 2 hosts;
    1 card recovered". Cards are compared only on hosts audited both times.
    """
    out = {"previous_at": previous["generated_at"] if previous else None, "new_quarantines": 0,
           "new_quarantine_hosts": [], "released_quarantines": 0, "released_quarantine_hosts": [],
           "cards_recovered": 0, "cards_worse": 0, "hosts_newly_needing_action": [], "hosts_recovered": [],
           "hosts_newly_down": [], "hosts_added": [], "hosts_gone": [], "text": ""}
    if previous is None:
        out["text"] = "first audit in the history: nothing to compare with"
        return out
    before, after = previous["hosts"], current["hosts"]
    for host in sorted(after):
        now = after[host]
        if host not in before:
            out["hosts_added"].append(host)
            continue
        then = before[host]
        added = set(now["quarantined"]) - set(then["quarantined"])
        removed = set(then["quarantined"]) - set(now["quarantined"])
        if added:
            out["new_quarantines"] += len(added)
            out["new_quarantine_hosts"].append(host)
        if removed and now["status"] not in _HOST_DOWN:
            out["released_quarantines"] += len(removed)
            out["released_quarantine_hosts"].append(host)
        if (then["status"] == "ok") != (now["status"] == "ok"):
            (out["hosts_recovered"] if now["status"] == "ok" else out["hosts_newly_needing_action"]).append(host)
        if now["status"] in _HOST_DOWN and then["status"] not in _HOST_DOWN:
            out["hosts_newly_down"].append(host)
        if now["status"] in _HOST_DOWN or then["status"] in _HOST_DOWN:
            continue
        rank = dict((key, index) for index, key in enumerate(MAP_STATE_KEYS))
        for card in set(then["cards"]) | set(now["cards"]):
            old, new = then["cards"].get(card, "healthy"), now["cards"].get(card, "healthy")
            if old != "healthy" and new == "healthy":
                out["cards_recovered"] += 1
            elif rank[new] < rank[old]:
                out["cards_worse"] += 1
    out["hosts_gone"] = sorted(set(before) - set(after))
    parts = []
    if out["new_quarantines"]:
        parts.append("%s on %s" % (_plural(out["new_quarantines"], "new quarantine"),
                                   _plural(len(out["new_quarantine_hosts"]), "host")))
    if out["released_quarantines"]:
        parts.append("%s released on %s" % (_plural(out["released_quarantines"], "quarantine"),
                                            _plural(len(out["released_quarantine_hosts"]), "host")))
    if out["cards_recovered"]:
        parts.append("%s recovered" % _plural(out["cards_recovered"], "card"))
    if out["cards_worse"]:
        parts.append("%s in a worse state" % _plural(out["cards_worse"], "card"))
    if out["hosts_newly_needing_action"]:
        parts.append("%s newly needing action" % _plural(len(out["hosts_newly_needing_action"]), "host"))
    if out["hosts_newly_down"]:
        parts.append("%s unreachable or without audit data" % _plural(len(out["hosts_newly_down"]), "host"))
    if out["hosts_recovered"]:
        parts.append("%s no longer needing action" % _plural(len(out["hosts_recovered"]), "host"))
    if out["hosts_added"]:
        parts.append("%s new in the audit" % _plural(len(out["hosts_added"]), "host"))
    if out["hosts_gone"]:
        parts.append("%s no longer in the audit" % _plural(len(out["hosts_gone"]), "host"))
    out["text"] = "; ".join(parts) if parts else "no change since the previous audit"
    return out


def trends(report, history):
    """The points of the trend charts (history records oldest first, then this report) and the changes."""
    current = history_record(report)
    records = list(history.get("records") or []) + [current]
    points = [dict([("generated_at", r["generated_at"])] + [(key, r["totals"][key]) for key in _TOTALS])
              for r in records]
    previous = history["records"][-1] if history.get("records") else None
    return {"points": points, "changes": changes(previous, current)}


def attach_history(report, report_dir, keep):
    """Add ``report["history"]``: the trend points, the changes, warnings, this run's record file and the
    files to delete. Nothing is written here (the role writes the record and deletes the expired files)."""
    keep = int(keep or 0)
    this_run = history_name(report["kind"], report["generated_at"]) if report_dir and keep > 0 else None
    loaded = load_history(report_dir, report["kind"], keep, this_run)
    view = trends(report, loaded)
    record_file = None
    if this_run and _record_dir_ok(os.path.join(report_dir, HISTORY_SUBDIR)):
        record_file = os.path.join(report_dir, HISTORY_SUBDIR, this_run)
    report["history"] = {"keep": keep, "dir": os.path.join(report_dir, HISTORY_SUBDIR) if report_dir else None,
                         "record_file": record_file, "points": view["points"], "changes": view["changes"],
                         "warnings": loaded["warnings"], "expired": loaded["expired"]}
    return report


def _record_dir_ok(directory):
    """Whether this run's record may go to ``directory``: a real directory, or none yet (it is made then).
    A symlink (or anything else) there gets no record: load_history has warned about it."""
    try:
        return stat.S_ISDIR(os.lstat(directory).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def to_json(record):
    """A history record as written to its file (compact: a fleet's record is read back on every run)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"


# --- HTML -------------------------------------------------------------------------------------------

_esc = html.escape

CSS = (
    ".hmap{list-style:none;padding:0;margin:.5em 0}.hmap>li{margin:0 0 .3em;display:flex;align-items:center;gap:.5em}"
    ".hmap .hname{min-width:12em;font-size:.85em}.cells{list-style:none;padding:0;margin:0;display:flex;"
    "flex-wrap:wrap;gap:2px}.cell{display:inline-block;width:2.6em;height:1.6em;border:1px solid #333;"
    "font:bold .65em/1.6em monospace;text-align:center}.cell a{color:#000;text-decoration:none;display:block}"
    ".vh{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}"
    ".pat-diag{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.55) 0 3px,transparent 3px 7px)}"
    ".pat-cross{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.5) 0 2px,transparent 2px 6px),"
    "repeating-linear-gradient(-45deg,rgba(255,255,255,.5) 0 2px,transparent 2px 6px)}"
    ".pat-dots{background-image:radial-gradient(rgba(255,255,255,.7) 1px,transparent 1.5px);background-size:5px 5px}"
    ".legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:.4em 1em}.legend .cell{margin-right:.3em}"
    ".changes{font-size:1.1em;font-weight:bold}svg text{font:11px system-ui,sans-serif}"
    ".charts{display:flex;flex-wrap:wrap;gap:1em}"
    "@media print{body{margin:0;color:#000}.cell,.legend .cell,svg{-webkit-print-color-adjust:exact;"
    "print-color-adjust:exact}h2{break-after:avoid}.hmap>li,tr,figure{break-inside:avoid}a{color:#000}}"
)


def _state_css():
    return "".join(".st-%s{background-color:%s}" % (state[0], state[4]) for state in MAP_STATES)


def _cell_title(group, cell):
    return "%s %s: %s; %s VFs, %s quarantined, %s allocatable, %s claimed, %s with failures below the threshold" % (
        group["host"], cell["card"], _STATE[cell["state"]][2], _dash(cell["vfs"]), _dash(cell["quarantined"]),
        _dash(cell["allocatable"]), _dash(cell["claimed"]), _dash(cell["below_threshold"]))


def _dash(value):
    return "-" if value is None else value


def _cell_html(key, what, title, href, extra_attrs=""):
    """One map cell: the code shows in the cell; what it is and its state are text too (read without CSS)."""
    _key, _short, label, code, _colour, pattern = _STATE[key]
    values = (key, pattern, key, extra_attrs, _esc(title), href, code, _esc(str(what)), _esc(label))
    return ("<li class=\"cell st-%s %s\" data-state=\"%s\"%s title=\"%s\"><a href=\"#%s\">%s"
            "<span class=\"vh\"> %s: %s</span></a></li>" % values)


def render_map_html(report):
    groups = health_map(report)
    counts = map_counts(groups)
    out = ["<section id=\"health-map\" aria-labelledby=\"health-map-h\"><h2 id=\"health-map-h\">Health map</h2>",
           "<p id=\"map-line\">%s. One cell per card, hosts needing action first; hover a cell for its "
           "numbers, follow it to the host.</p>" % _esc(map_line(report)),
           "<ul class=\"legend\" aria-label=\"legend\">"]
    down = len([g for g in groups if g["placeholder"]])
    for key, _short, label, code, _colour, pattern in MAP_STATES:
        # Cards of an unreachable host are unknown: the legend counts its hosts instead.
        count = "%d host(s)" % down if key == "unreachable" else "%d" % counts[key]
        out.append("<li><span class=\"cell st-%s %s\" data-legend=\"%s\">%s</span> %s (%s)</li>" % (
            key, pattern, key, code, _esc(label), count))
    out.append("</ul><ol class=\"hmap\">")
    for group in groups:
        status = group["status"].replace("_", " ")
        out.append("<li data-host=\"%s\"><a class=\"hname\" href=\"#%s\">%s</a> <span class=\"vh\">(%s)</span>"
                   "<ul class=\"cells\">" % (_esc(group["host"]), group["anchor"], _esc(group["host"]), _esc(status)))
        for cell in group["cells"]:
            out.append(_cell_html(cell["state"], cell["card"], _cell_title(group, cell), group["anchor"],
                                  " data-card=\"%s\"" % _esc(str(cell["card"]))))
        if group["placeholder"]:
            out.append(_cell_html(group["placeholder"], "host", "%s: %s; no card data" % (group["host"], status),
                                  group["anchor"], " data-placeholder=\"1\""))
        if not group["cells"] and not group["placeholder"]:
            out.append("<li>no cards</li>")
        out.append("</ul></li>")
    out.append("</ol></section>")
    return "\n".join(out)


def _bar_svg(row, width=320, height=16):
    total = row["total"]
    parts = ["<svg role=\"img\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" aria-label=\"%s\">" % (
        width, height, width, height, _esc(_capacity_words(row)))]
    x = 0.0
    for key, label, colour in CAPACITY_SEGMENTS:
        if not total or not row[key]:
            continue
        w = width * row[key] / float(total)
        values = (x, w, height, colour, key, _esc(label), row[key], total)
        parts.append("<rect x=\"%.1f\" y=\"0\" width=\"%.1f\" height=\"%d\" fill=\"%s\" data-segment=\"%s\">"
                     "<title>%s: %d of %d slots</title></rect>" % values)
        x += w
    if not total:
        parts.append("<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>" % (width, height))
    parts.append("</svg>")
    return "".join(parts)


def _capacity_words(row):
    parts = ["%d %s" % (row[key], label) for key, label, _c in CAPACITY_SEGMENTS]
    return "%d slots: %s" % (row["total"], ", ".join(parts))


def render_capacity_html(report):
    view = capacity_view(report)
    out = ["<section id=\"capacity\" aria-labelledby=\"capacity-h\"><h2 id=\"capacity-h\">Capacity</h2>",
           "<p>Legend: %s.</p>" % ", ".join("<span style=\"color:%s\">&#9632;</span> %s" % (c, _esc(label))
                                            for _k, label, c in CAPACITY_SEGMENTS),
           "<table id=\"capacity-table\"><tr><th>Host</th><th>Slots</th>%s<th>Bar</th></tr>" % "".join(
               "<th>%s</th>" % _esc(label.split(" (", maxsplit=1)[0].capitalize()) for _k, label, _c in CAPACITY_SEGMENTS)]

    def row_html(name, row, cls):
        return "<tr class=\"%s\"><th>%s</th><td>%d</td>%s<td>%s</td></tr>" % (
            cls, name, row["total"], "".join("<td data-segment=\"%s\">%d</td>" % (key, row[key])
                                             for key, _l, _c in CAPACITY_SEGMENTS), _bar_svg(row))
    out.append(row_html("Fleet", view["fleet"], "fleet"))
    for row in view["hosts"]:
        out.append(row_html("<a href=\"#%s\">%s</a>" % (row["anchor"], _esc(row["host"])), row, "host"))
    out.append("</table></section>")
    return "\n".join(out)


_SERIES = (("quarantined_vfs", "Quarantined VFs"), ("capacity_loss_pct", "Capacity lost (%)"),
           ("hosts_needing_action", "Hosts needing action"))


def _chart_svg(points, key, label, width=300, height=120):
    values = [float(p[key]) for p in points]
    top = max(values + [1.0])
    pad = 24
    step = (width - 2 * pad) / float(max(len(values) - 1, 1))
    coords = [(pad + i * step, height - pad - (height - 2 * pad) * v / top) for i, v in enumerate(values)]
    head = (width, height, width, height, _esc(label), len(values), ", ".join(_num(v) for v in values), key)
    axis = (pad, height - pad, width - pad, height - pad)
    out = ["<figure><svg role=\"img\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" aria-label=\"%s over the "
           "last %d audits: %s\" data-series=\"%s\">" % head,
           "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>" % axis,
           "<text x=\"2\" y=\"%d\">%s</text><text x=\"2\" y=\"%d\">0</text>" % (pad - 6, _num(top), height - pad + 4)]
    if len(coords) > 1:
        out.append("<polyline fill=\"none\" stroke=\"#2f6fb0\" stroke-width=\"2\" points=\"%s\"/>" % " ".join(
            "%.1f,%.1f" % c for c in coords))
    for (x, y), point, value in zip(coords, points, values):
        out.append("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#2f6fb0\"><title>%s: %s</title></circle>" % (
            x, y, _esc(str(point["generated_at"])), _num(value)))
    out.append("</svg><figcaption>%s: %s now</figcaption></figure>" % (_esc(label), _num(values[-1])))
    return "".join(out)


def _num(value):
    value = float(value)
    return "%d" % value if value == int(value) else "%.2f" % value


def render_trends_html(report):
    history = report.get("history")
    out = ["<section id=\"trends\" aria-labelledby=\"trends-h\"><h2 id=\"trends-h\">Trends</h2>"]
    if not history:
        out.append("<p>No history kept (fleet_reconcile_history_keep is 0 or no report directory).</p></section>")
        return "\n".join(out)
    out.append("<p class=\"changes\" id=\"changes\">Since the previous audit%s: %s.</p>" % (
        " (%s)" % _esc(history["changes"]["previous_at"]) if history["changes"]["previous_at"] else "",
        _esc(history["changes"]["text"])))
    for warning in history["warnings"]:
        out.append("<p class=\"warning\">%s</p>" % _esc(warning))
    points = history["points"]
    out.append("<div class=\"charts\">%s</div>" % "".join(_chart_svg(points, key, label) for key, label in _SERIES))
    out.append("<table id=\"trend-table\"><tr><th>Audit</th>%s</tr>" % "".join(
        "<th>%s</th>" % _esc(label) for _k, label in _SERIES))
    for point in points:
        out.append("<tr><td>%s</td>%s</tr>" % (_esc(str(point["generated_at"])), "".join(
            "<td>%s</td>" % _num(point[key]) for key, _l in _SERIES)))
    out.append("</table></section>")
    return "\n".join(out)


def render_html_sections(report):
    """The map, capacity and trend sections of the HTML report, and their CSS."""
    return CSS + _state_css(), "\n".join((render_map_html(report), render_capacity_html(report),
                                         render_trends_html(report)))
