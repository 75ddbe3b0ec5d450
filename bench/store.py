# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark the VF health store against plain ``json``, measured in the same run.

For stores of 10, 1,000 and 10,000 records (a fleet-like mix: most VFs with
one or two failures, a quarter quarantined, some hand-made quarantines) it
times, best of several rounds:

* ours: ``update_store`` with a one-record change -- load with Go's decoding
  rules, validate with hypeman's rules, mutate, serialize byte-exact, and the
  durable write (tmp file, fsync, rename, directory fsyncs, flock);
* ours without durability: load + validate + serialize only;
* baseline: ``json.load`` + ``json.dump(indent=2)`` of the same file.

and prints the ratios. Run: ``make bench`` or
``PYTHONPATH=.collections .venv/bin/python bench/store.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils import _gotime, _store, _store_write

BASE_NS = 1788177600123456789


def build_store(count):
    """A HealthStore with ``count`` records of realistic shape."""
    records = {}
    for index in range(count):
        address = "%04x:%02x:%02x.%d" % (index // 8192, index // 64 % 256, index // 8 % 32, index % 8)
        failures = []
        for number in range(1 + index % 2):
            reported = _gotime.from_unix_ns(BASE_NS + (index * 10 + number) * 1000000007)
            failures.append(_store.Failure("inst-%06d-%d" % (index, number),
                                           _gotime.format_rfc3339nano(_gotime.from_unix_ns(BASE_NS + index)),
                                           reported))
        quarantined = None
        if index % 4 == 0:
            quarantined = _gotime.from_unix_ns(BASE_NS + index * 999983)
        if index % 16 == 3:
            failures = []
            quarantined = _gotime.from_unix_ns(BASE_NS)
        records[address] = _store.Record(address, tuple(failures), quarantined)
    return _store.HealthStore("bench", records=records)


def best_of(rounds, func):
    best = None
    for _round in range(rounds):
        start = time.perf_counter()
        func()
        took = time.perf_counter() - start
        best = took if best is None or took < best else best
    return best


def bench(count, workdir, rounds):
    path = os.path.join(workdir, "gpu", "vf-health.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = build_store(count).to_bytes()
    with open(path, "wb") as handle:
        handle.write(data)
    toggle = [0]

    def ours():
        toggle[0] ^= 1
        vf = "ffff:ff:1f.7"

        def mutate(store):
            return store.quarantine(vf) if toggle[0] else store.remove(vf)
        result = _store_write.update_store(path, mutate)
        assert result.changed

    def ours_in_memory():
        store = _store.load_store(path)
        assert store.valid
        store.to_bytes()

    plain_out = os.path.join(workdir, "plain.json")

    def plain():
        with open(path, "rb") as handle:
            parsed = json.load(handle)
        with open(plain_out, "w") as handle:
            json.dump(parsed, handle, indent=2)

    plain_time = best_of(rounds, plain)
    ours_time = best_of(rounds, ours)
    memory_time = best_of(rounds, ours_in_memory)
    return len(data), ours_time, memory_time, plain_time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument("--dir", help="work directory (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per measurement (default: by size)")
    args = parser.parse_args()
    workdir = args.dir or tempfile.mkdtemp(prefix="bench-store-")
    try:
        print("%8s %10s %12s %12s %12s %9s %9s" % ("records", "bytes", "ours ms", "no-fsync ms", "json ms",
                                                   "ratio", "no-fsync"))
        for count in (10, 1000, 10000):
            rounds = args.rounds or (30 if count <= 1000 else 7)
            size, ours_time, memory_time, plain_time = bench(count, os.path.join(workdir, str(count)), rounds)
            print("%8d %10d %12.2f %12.2f %12.2f %8.1fx %8.1fx" % (
                count, size, ours_time * 1000, memory_time * 1000, plain_time * 1000,
                ours_time / plain_time, memory_time / plain_time))
        print("ours = update_store (load, Go-exact decode, hypeman validation, serialize, durable write);")
        print("no-fsync = load + validate + serialize only; json = json.load + json.dump(indent=2).")
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
