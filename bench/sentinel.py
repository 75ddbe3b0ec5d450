# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark the guest-log sentinel scan against grep, measured in the same run.

Builds a simulated host (64 vGPU instances, app.log files from 1 MB up to
50 MB, markers rare) under a temporary directory (or ``--dir``), then prints:

* full scan: time of the sentinel scanner over every log (no cursors yet, the
  cursors committed as a run commits them) vs ``grep -c -F HYPEMAN-GPU-INIT``
  over the same files, as a per-byte ratio (goal: <= 1.2x grep);
* rescan with nothing appended: time for all instances (goal: < 50 ms).

Both are the best of several rounds with the files in the page cache, as an
hourly audit finds them. The generated tree is deleted afterwards unless
``--keep`` is given. Run: ``make bench`` or
``PYTHONPATH=.collections .venv/bin/python bench/sentinel.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils import _hypeman, _sentinel_write
from ansible_collections.hypeman.vgpu.tests.sim import guestlog
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree

MB = 1024 * 1024
CLAIMED_NS = 1788177600123456789  # hosttree's default claim time
SEC = 10 ** 9
FULL_SCAN_GOAL = 1.2  # issue 16: full scan / grep -c -F on the same bytes, warm cache


def sizes_for(count, max_mb):
    """A fleet-like mix: a few logs at the rotation size, most much smaller."""
    out = []
    for index in range(count):
        if index % 16 == 0:
            out.append(max_mb * MB)
        elif index % 4 == 0:
            out.append(max_mb * MB * 2 // 5)
        elif index % 2 == 0:
            out.append(max_mb * MB // 10)
        else:
            out.append(max(MB, max_mb * MB // 50))
    return out


def build(root, count, max_mb):
    tree = HostTree(root)
    cards = [tree.add_card("L40S", "0000:%02x:00.0" % (0x82 + 0x20 * n)) for n in range((count + 31) // 32)]
    paths = []
    for index, size in enumerate(sizes_for(count, max_mb)):
        instance_id = "bench%03d" % index
        tree.add_instance(instance_id, vf=cards[index // 32].vfs[index % 32], profile="NVIDIA L40S-2Q")
        markers = []
        if index % 8 == 3:  # rare: one instance in eight saw a wedged VF, one in eight an OK
            markers = [guestlog.report("failed", CLAIMED_NS + 27 * SEC)]
        elif index % 8 == 5:
            markers = [guestlog.report("ok", CLAIMED_NS + 30 * SEC)]
        path = os.path.join(_hypeman.instance_log_dir(tree.data_dir, instance_id), "app.log")
        guestlog.write_sized_log(path, size, seed=index, markers=markers)
        paths.append(path)
    return tree, paths


def best(runs, func):
    times = []
    result = None
    for _round in range(runs):
        start = time.perf_counter()
        result = func()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--dir", help="parent directory for the generated tree (default: a temp dir)")
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--max-mb", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the generated tree")
    args = parser.parse_args(argv)

    root = tempfile.mkdtemp(prefix="bench-sentinel-", dir=args.dir)
    try:
        started = time.perf_counter()
        tree, paths = build(root, args.instances, args.max_mb)
        total = sum(os.path.getsize(p) for p in paths)
        print("built %d instances, %d logs, %.0f MB in %.1fs under %s"
              % (args.instances, len(paths), total / MB, time.perf_counter() - started, root))

        def grep():
            proc = subprocess.run(["grep", "-c", "-F", "HYPEMAN-GPU-INIT"] + paths,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
            if proc.returncode not in (0, 1):
                raise SystemExit("grep failed: %s" % proc.stderr.decode())
            return sum(int(line.rsplit(b":", 1)[1]) for line in proc.stdout.splitlines())

        def listing():
            return _hypeman.list_instances(tree.data_dir)

        instances, unreadable = listing()

        def log_dir(instance_id):
            return _hypeman.instance_log_dir(tree.data_dir, instance_id)

        state_root = os.path.join(root, "states")
        os.mkdir(state_root)
        fresh_dirs = iter(range(1000))

        def full_scan():
            state_dir = os.path.join(state_root, "s%d" % next(fresh_dirs))  # no cursors: read everything
            report = _sentinel_write.run(instances, unreadable, log_dir, state_dir)[0]
            return state_dir, report

        def rescan(state_dir):
            def run():
                return _sentinel_write.run(instances, unreadable, log_dir, state_dir)[0]
            return run

        def module_rescan(state_dir):
            def run():
                found, bad = listing()
                return _sentinel_write.run(found, bad, log_dir, state_dir)[0]
            return run

        grep()  # warm the page cache for both contenders
        grep_times, scan_times = [], []
        state_dir = report = None
        for _round in range(args.rounds):
            grep_times.append(best(1, grep)[0])
            elapsed, _median, (state_dir, report) = best(1, full_scan)
            scan_times.append(elapsed)
        grep_count = grep()
        found_lines = sum(s["markers"] for s in report.scanned)
        if found_lines != grep_count or report.skipped or report.warnings:
            raise SystemExit("scanner disagrees with grep: %d marker lines vs %d grep hits (%r %r)"
                             % (found_lines, grep_count, report.skipped, report.warnings))
        read = sum(s["bytes_read"] for s in report.scanned)
        if read != total:
            raise SystemExit("the full scan read %d bytes of %d" % (read, total))
        g_best, s_best = min(grep_times), min(scan_times)
        ratio = (s_best / read) / (g_best / total)  # per byte: both read the same files
        print("full scan: sentinel %.3fs (%.0f MB/s, %d findings) vs grep -c -F %.3fs -> ratio %.2fx "
              "(goal <= %.2fx): %s" % (s_best, read / MB / s_best, len(report.findings), g_best, ratio,
                                       FULL_SCAN_GOAL, "OK" if ratio <= FULL_SCAN_GOAL else "MISSED"))

        r_best, r_median, again = best(max(5, args.rounds), rescan(state_dir))
        if sum(s["bytes_read"] for s in again.scanned) != 0 or again.findings != report.findings:
            raise SystemExit("rescan read bytes or changed findings")
        m_best, m_median, _report = best(max(5, args.rounds), module_rescan(state_dir))
        print("rescan, nothing appended, %d instances: scanner %.1f ms (median %.1f), with metadata listing "
              "%.1f ms (median %.1f) (goal < 50 ms): %s"
              % (len(instances), r_best * 1000, r_median * 1000, m_best * 1000, m_median * 1000,
                 "OK" if m_median < 0.05 else "MISSED"))
        return 0
    finally:
        if args.keep:
            print("kept %s" % root)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
