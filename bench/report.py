# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark the fleet report at 1,000 hosts x 8 cards: build, history, JSON, Markdown and HTML.

Host entries come from real audits of simulated hosts (``tests/browser/sim_fleet``:
healthy, overflow-only, drained, below-threshold), each widened to 8 cards and
copied to 1,000 host names; the history holds 29 earlier records of the same
fleet (the default keep of 30). Prints the time of each step (best of 3) and
the size of each file. Run: ``make bench`` or
``PYTHONPATH=.collections .venv/bin/python bench/report.py [--hosts N]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures, fleet_report
from ansible_collections.hypeman.vgpu.tests.browser import sim_fleet


def fleet(work, hosts, cards):
    samples = sim_fleet.audit_round(work, ("ok", "overflow", "drained", "below", "ok", "ok"), "2026-12-02T06:00:00Z",
                                    unreachable=())
    entries = []
    for index in range(hosts):
        entry = copy.deepcopy(samples[index % len(samples)])
        entry["host"] = "gpu-%04d.example" % index
        gpus = entry["placement"]["gpus"]
        entry["placement"]["gpus"] = [dict(gpus[n % len(gpus)], address="0000:%02x:00.0" % (0x10 + n))
                                      for n in range(cards)]
        entries.append(entry)
    return entries


def best(func, rounds=3):
    times = []
    result = None
    for _round in range(rounds):
        started = time.perf_counter()
        result = func()
        times.append(time.perf_counter() - started)
    return min(times), result


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--cards", type=int, default=8)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        entries = fleet(os.path.join(work, "trees"), args.hosts, args.cards)
        report_dir = os.path.join(work, "report")
        seconds, report = best(lambda: fleet_report.build_report(entries, "audit", "2026-12-02T06:00:00Z"))
        print("build_report: %.3f s for %d hosts, %d cards" % (seconds, args.hosts, report["summary"]["cards_total"]))
        record = fleet_pictures.to_json(fleet_pictures.history_record(report))
        os.makedirs(os.path.join(report_dir, "history"))
        for day in range(1, 30):
            name = fleet_pictures.history_name("audit", "2026-11-%02dT06:00:00Z" % day)
            with open(os.path.join(report_dir, "history", name), "w") as handle:
                handle.write(record)
        seconds, _report = best(lambda: fleet_pictures.attach_history(report, report_dir, 30))
        print("history: %.3f s to read 29 records of %d bytes each and compute the trends and changes"
              % (seconds, len(record)))
        for name, render in (("json", fleet_report.to_json), ("markdown", fleet_report.render_markdown),
                             ("html", fleet_report.render_html)):
            seconds, text = best(lambda render=render: render(report))
            print("%s: %.3f s, %.1f MB" % (name, seconds, len(text.encode()) / 1e6))


if __name__ == "__main__":
    main()
