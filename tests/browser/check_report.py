# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report's HTML page in a real browser (headless Chromium, Debian's ``chromium`` package).

    python tests/browser/check_report.py [--build DIR] [--chromium PATH]

Builds a real report of a simulated fleet (``sim_fleet``: two audit rounds, so
the page has a history, trends and "what changed"), writes it to
``<build>/browser-report/`` as the role would, loads ``fleet-audit.html`` in
Chromium offline (every host name resolves to nothing) and fails when:

- the browser logs any console message (the page has no script: anything there is an error, e.g. a failed load);
- the page refers to anything outside itself (script, stylesheet link, remote image or font);
- the map does not have one cell per card of the JSON report, per host and in total; a cell's state is not the
  one the report classifies for that card; a cell's numbers (VFs, quarantined, allocatable, claimed) differ from
  the JSON; a cell has no text label or no hover title; a cell's link leads nowhere;
- the capacity table's fleet row, the trend table or the "what changed" sentence disagree with the JSON;
- with every stylesheet and style attribute stripped, the map no longer reads as text (host names, card addresses
  and each state's words).

It first proves it can see a console error (a page that logs one must fail). Screenshots for a person:
``<build>/report.png`` and ``<build>/report-nocss.png``. Exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.abspath(os.path.join(HERE, "..", ".."))
CHROMIUM_TIMEOUT = 180  # seconds: a hang detector, not a speed check
_CONSOLE = re.compile(r":CONSOLE[:(]")


def _collections_path():
    # The collection is imported as ansible_collections.hypeman.vgpu: the directory three levels up
    # when this file is reached through .../ansible_collections/hypeman/vgpu, else the repository's .collections.
    if os.path.basename(os.path.dirname(os.path.dirname(COLLECTION))) == "ansible_collections":
        return os.path.abspath(os.path.join(COLLECTION, "..", "..", ".."))
    return os.path.join(COLLECTION, ".collections")


sys.path.insert(0, _collections_path())

# pylint: disable=wrong-import-position
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures, fleet_report  # noqa: E402
from ansible_collections.hypeman.vgpu.tests.browser import sim_fleet  # noqa: E402

FAILURES = []


def fail(message):
    FAILURES.append(message)
    sys.stderr.write("FAIL: %s\n" % message)


def chromium(binary, profile, url, *args):
    """Run headless Chromium on ``url``; returns (stdout, console lines)."""
    argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-extensions", "--no-first-run",
            "--disable-background-networking", "--disable-sync", "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--user-data-dir=%s" % profile,
            "--enable-logging=stderr", "--v=0"] + list(args) + [url]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=CHROMIUM_TIMEOUT,
                          check=False)
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (binary, done.returncode, stderr[-2000:]))
    return done.stdout.decode("utf-8", "replace"), [line for line in stderr.splitlines() if _CONSOLE.search(line)]


class Page(html.parser.HTMLParser):
    """What the checks need of a DOM: ids, map cells with their text, tables by id, external references."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.cells, self.external, self.tables = set(), [], [], {}
        self.sections = {}
        self._cell_depth, self._table, self._row, self._section = 0, None, None, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "section":
            self._section.append(attrs.get("id"))
            self.sections.setdefault(attrs.get("id"), "")
        if tag in ("script", "link", "iframe", "object", "embed") or tag == "img" and attrs.get("src"):
            self.external.append("<%s %s>" % (tag, attrs))
        for name in ("src", "href", "xlink:href"):
            if re.match(r"^\s*(https?:|//|file:|data:)", attrs.get(name) or ""):
                self.external.append("%s=%s" % (name, attrs[name]))
        if tag == "li" and "data-state" in attrs:
            self.cells.append({"attrs": attrs, "text": "", "href": None})
            self._cell_depth = 1
        elif self._cell_depth and tag == "li":
            self._cell_depth += 1
        if self._cell_depth and tag == "a":
            self.cells[-1]["href"] = attrs.get("href")
        if tag == "table":
            self._table = attrs.get("id")
            if self._table:
                self.tables[self._table] = []
        if tag == "tr" and self._table:
            self._row = []
            self.tables[self._table].append(self._row)
        if tag in ("td", "th") and self._row is not None:
            self._row.append("")

    def handle_endtag(self, tag):
        if tag == "section" and self._section:
            self._section.pop()
        if self._cell_depth and tag == "li":
            self._cell_depth -= 1
        if tag == "table":
            self._table, self._row = None, None

    def handle_data(self, data):
        if self._cell_depth:
            self.cells[-1]["text"] += data
        if self._row is not None and self._row:
            self._row[-1] += data
        for section in self._section:
            self.sections[section] += data


def parse(text):
    page = Page()
    page.feed(text)
    return page


def _numbers(title):
    found = re.search(r": [^;]+; (\S+) VFs, (\S+) quarantined, (\S+) allocatable, (\S+) claimed", title)
    return tuple(found.groups()) if found else None


def check_page(page, report, where):
    """The DOM of the report page against the JSON report."""
    if page.external:
        fail("%s: the page refers outside itself: %s" % (where, page.external[:5]))
    cards = [c for c in page.cells if "data-card" in c["attrs"]]
    if len(cards) != report["summary"]["cards_total"]:
        fail("%s: %d map cells for cards, the JSON report has %d cards" % (
            where, len(cards), report["summary"]["cards_total"]))
    states = dict((s[0], s) for s in fleet_pictures.MAP_STATES)
    position = 0
    for entry in report["hosts"]:
        gpus = (entry.get("placement") or {}).get("gpus") or []
        mine = cards[position:position + len(gpus)]
        position += len(gpus)
        if len(mine) != len(gpus):
            fail("%s: host %s has %d cells, %d cards" % (where, entry["host"], len(mine), len(gpus)))
            continue
        for cell, gpu in zip(mine, gpus):
            attrs = cell["attrs"]
            expected = fleet_report.card_map_state(entry, gpu)
            if attrs.get("data-card") != gpu["address"] or attrs.get("data-state") != expected:
                fail("%s: %s %s shows %s/%s, the report says %s" % (where, entry["host"], gpu["address"],
                                                                    attrs.get("data-card"), attrs.get("data-state"),
                                                                    expected))
            numbers = _numbers(attrs.get("title", ""))
            want = tuple("-" if gpu[k] is None else str(gpu[k]) for k in ("vf_total", "quarantined", "allocatable",
                                                                          "claimed"))
            if numbers != want:
                fail("%s: %s %s hover numbers %s, the JSON has %s" % (
                    where, entry["host"], gpu["address"], numbers, want))
    for cell in page.cells:
        state = states.get(cell["attrs"].get("data-state"))
        if state is None:
            fail("%s: a cell with unknown state %r" % (where, cell["attrs"].get("data-state")))
            continue
        text = " ".join(cell["text"].split())
        if state[3] not in text or state[2] not in text:
            fail("%s: cell %s has text %r: no code %r or label %r beside its colour" % (
                where, cell["attrs"].get("title"), text, state[3], state[2]))
        if not cell["attrs"].get("title"):
            fail("%s: cell without hover numbers: %r" % (where, cell["attrs"]))
        if not cell["href"] or cell["href"][1:] not in page.ids:
            fail("%s: cell %s links to %r, which is no section of the page" % (
                where, cell["attrs"].get("title"), cell["href"]))
    capacity = page.tables.get("capacity-table") or []
    fleet_row = [row for row in capacity if row and row[0].strip() == "Fleet"]
    summary = report["summary"]
    if not fleet_row:
        fail("%s: no Fleet row in the capacity table" % where)
    else:
        total, allocatable, _used, quarantined = (int(v) for v in fleet_row[0][1:5])
        if (total, allocatable, quarantined) != (summary["slots_total"], summary["slots_allocatable"],
                                                 summary["slots_quarantined"]):
            fail("%s: capacity fleet row %s, the JSON summary has total %d allocatable %d quarantined %d" % (
                where, fleet_row[0], summary["slots_total"], summary["slots_allocatable"],
                summary["slots_quarantined"]))
    if len(capacity) != len(report["hosts"]) + 2:
        fail("%s: the capacity table has %d rows for %d hosts" % (where, len(capacity) - 2, len(report["hosts"])))
    history = report.get("history")
    if history:
        trend = page.tables.get("trend-table") or []
        if len(trend) - 1 != len(history["points"]):
            fail("%s: %d trend rows, the JSON history has %d points" % (where, len(trend) - 1, len(history["points"])))
        for row, point in zip(trend[1:], history["points"]):
            if row[0].strip() != point["generated_at"] or int(row[1]) != point["quarantined_vfs"]:
                fail("%s: trend row %s, the JSON has %s" % (where, row, point))
        trends_text = " ".join(page.sections.get("trends", "").split())
        if history["changes"]["text"] not in trends_text:
            fail("%s: the page does not say what changed (%r)" % (where, history["changes"]["text"]))


def check_without_css(page, report, where):
    """With no CSS the map must still read as text: every host, card and state in words."""
    text = " ".join(page.sections.get("health-map", "").split())
    for entry in report["hosts"]:
        if entry["host"] not in text:
            fail("%s: host %s is not in the map's text" % (where, entry["host"]))
        for gpu in (entry.get("placement") or {}).get("gpus") or []:
            label = dict((s[0], s[2]) for s in fleet_pictures.MAP_STATES)[fleet_report.card_map_state(entry, gpu)]
            if "%s: %s" % (gpu["address"], label) not in text:
                fail("%s: card %s of %s is not in the map's text with its state %r" % (
                    where, gpu["address"], entry["host"], label))


def strip_css(text):
    text = re.sub(r"<style[^>]*>.*?</style>", "", text, flags=re.S | re.I)
    return re.sub(r'\sstyle="[^"]*"', "", text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(os.getcwd(), "build"),
                        help="where the report and screenshots go (default ./build)")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", "chromium"))
    args = parser.parse_args(argv)
    binary = shutil.which(args.chromium)
    if not binary:
        sys.exit("FAIL: %s not found; install Debian's chromium: apt-get install -y chromium" % args.chromium)
    started = time.time()
    build = os.path.abspath(args.build)
    report_dir = os.path.join(build, "browser-report")
    shutil.rmtree(report_dir, ignore_errors=True)
    os.makedirs(report_dir)
    with tempfile.TemporaryDirectory(prefix="hypeman-vgpu-browser-") as work:
        profile = os.path.join(work, "profile")
        # The console check must see an error before its silence means anything.
        probe = os.path.join(work, "probe.html")
        with open(probe, "w") as handle:
            handle.write("<!DOCTYPE html><title>probe</title><script>console.error('probe-error')</script>")
        _dom, console = chromium(binary, profile, "file://" + probe, "--dump-dom")
        if not any("probe-error" in line for line in console):
            sys.exit("FAIL: the console check is blind: a page logging an error showed no console line")

        _first, report = sim_fleet.two_rounds(os.path.join(work, "fleet"), report_dir)
        for fmt, path in sorted(report["reports"].items()):
            with open(path, "w") as handle:
                handle.write({"json": fleet_report.to_json, "markdown": fleet_report.render_markdown,
                              "html": fleet_report.render_html}[fmt](report))
        sim_fleet.write_history(report)
        page_path = report["reports"]["html"]
        with open(report["reports"]["json"]) as handle:
            from_json = json.load(handle)

        dom, console = chromium(binary, profile, "file://" + page_path, "--dump-dom")
        for line in console:
            fail("console: %s" % line)
        check_page(parse(dom), from_json, "page")
        _out, console = chromium(binary, profile, "file://" + page_path, "--screenshot=%s" % os.path.join(
            build, "report.png"), "--window-size=1280,2400")
        for line in console:
            fail("console (screenshot): %s" % line)

        bare_path = os.path.join(report_dir, "fleet-audit-nocss.html")
        with open(page_path) as handle:
            bare = strip_css(handle.read())
        with open(bare_path, "w") as handle:
            handle.write(bare)
        dom, console = chromium(binary, profile, "file://" + bare_path, "--dump-dom")
        for line in console:
            fail("console (no CSS): %s" % line)
        if "<style" in dom:
            fail("no-CSS page still has a stylesheet")
        check_without_css(parse(dom), from_json, "page without CSS")
        chromium(binary, profile, "file://" + bare_path, "--screenshot=%s" % os.path.join(build, "report-nocss.png"),
                 "--window-size=1280,2400")
    for name in ("report.png", "report-nocss.png"):
        if not os.path.getsize(os.path.join(build, name)):
            fail("empty screenshot %s" % name)
    line = fleet_pictures.map_line(from_json)
    if FAILURES:
        sys.stderr.write("browser check: %d failure(s)\n" % len(FAILURES))
        return 1
    print("browser check ok in %.0f s: %s; what changed: %s; report %s, screenshots %s/report.png, "
          "report-nocss.png" % (time.time() - started, line, from_json["history"]["changes"]["text"], page_path,
                                build))
    return 0


if __name__ == "__main__":
    sys.exit(main())
