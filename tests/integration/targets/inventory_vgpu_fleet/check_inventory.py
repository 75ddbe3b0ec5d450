# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks for the inventory_vgpu_fleet target (test equipment).

    check_inventory.py report --report R --expected E --graph G --list L
    check_inventory.py awx-job --report R --out F
    check_inventory.py artifact --expected E --list L
    check_inventory.py example --expected E --list L

The groups each host must be in come from the fleet fixture's expected issue
codes (what each simulated problem class must be reported as), not from the
plugin's own rules.
"""

from __future__ import annotations

import argparse
import json
import sys

CARD_STATES = ("card_ready_for_cycle", "card_draining", "card_overflow_only", "card_without_vfs")


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def plain(value):
    """ansible-inventory --list marks strings from a source as unsafe ({"__ansible_unsafe": text}): unwrapped."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return dict((k, plain(v)) for k, v in value.items())
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def load(path):
    with open(path) as handle:
        return plain(json.load(handle))


def expected_groups(expected, artifact=False):
    """Group -> hosts from the fixture's expected codes (an artifact names only hosts needing action)."""
    groups = dict((g, set()) for g in ("vgpu_needs_recovery", "vgpu_ready_for_cycle", "vgpu_overflow_only",
                                       "vgpu_store_unavailable", "vgpu_sentinel_coverage_lost", "vgpu_ok",
                                       "vgpu_needs_action"))
    for host, codes in expected.items():
        needs_action = any(c not in ("quarantined_vfs", "below_threshold", "card_draining") for c in codes)
        if "card_ready_for_cycle" in codes:
            groups["vgpu_ready_for_cycle"].add(host)
        if "store_unavailable" in codes:
            groups["vgpu_store_unavailable"].add(host)
        if artifact:
            if "card_ready_for_cycle" in codes:
                groups["vgpu_needs_recovery"].add(host)
            if needs_action:
                groups["vgpu_needs_action"].add(host)
            continue
        if set(codes) & set(CARD_STATES):
            groups["vgpu_needs_recovery"].add(host)
        if "card_overflow_only" in codes:
            groups["vgpu_overflow_only"].add(host)
        groups["vgpu_needs_action" if needs_action else "vgpu_ok"].add(host)
    return groups


def graph_groups(path):
    """ansible-inventory --graph text -> group -> hosts (direct members)."""
    groups, stack = {}, []
    with open(path) as handle:
        for line in handle:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            depth = line.find("|--") if "|--" in line else -1
            name = line[depth + 3:] if depth >= 0 else line
            del stack[max(0, (depth + 1) // 3):]
            if name.startswith("@") and name.endswith(":"):
                group = name[1:-1]
                groups.setdefault(group, set())
                stack.append(group)
            elif stack:
                groups[stack[-1]].add(name)
    return groups


def list_groups(listing):
    return dict((name, set(value.get("hosts") or [])) for name, value in listing.items()
                if isinstance(value, dict) and name != "_meta")


def compare(wanted, found, where):
    for group, hosts in sorted(wanted.items()):
        if found.get(group, set()) != hosts:
            fail("%s: group %s is %s, expected %s" % (where, group, sorted(found.get(group, set())), sorted(hosts)))


def check_report(args):
    expected, report, listing = load(args.expected), load(args.report), load(args.list)
    wanted = expected_groups(expected)
    compare(wanted, graph_groups(args.graph), "--graph")
    compare(wanted, list_groups(listing), "--list")
    hostvars = listing["_meta"]["hostvars"]
    if set(hostvars) != set(expected):
        fail("hosts %s, expected %s" % (sorted(hostvars), sorted(expected)))
    by_host = dict((e["host"], e) for e in report["hosts"])
    for host, codes in expected.items():
        found = hostvars[host]
        if not set(codes) <= set(found["vgpu_issue_codes"]):
            fail("%s: issue codes %s, expected at least %s" % (host, found["vgpu_issue_codes"], codes))
        if found["vgpu_report_time"] != report["generated_at"] or not 0 <= found["vgpu_report_age"] < 3600:
            fail("%s: report time %s age %s" % (host, found["vgpu_report_time"], found["vgpu_report_age"]))
        gpus = dict((g["address"], g) for g in (by_host[host].get("placement") or {}).get("gpus") or [])
        for card in found["vgpu_cards"]:
            gpu = gpus[card["address"]]
            if (card["quarantined"], card["allocatable"]) != (gpu["quarantined"], gpu["allocatable"]):
                fail("%s card %s: quarantined/allocatable %s/%s, the report says %s/%s" % (
                    host, card["address"], card["quarantined"], card["allocatable"], gpu["quarantined"],
                    gpu["allocatable"]))
        ready = [c["address"] for c in found["vgpu_cards"] if c["state"] == "ready_for_cycle"]
        if ("card_ready_for_cycle" in codes) != bool(ready) or found.get("target_gpu") != (ready[0] if ready else None):
            fail("%s: ready cards %s, target_gpu %s" % (host, ready, found.get("target_gpu")))
    if not list_groups(listing).get("status_unreachable"):
        fail("keyed_groups: no status_unreachable group")
    print("report: every host in its groups, cards and codes as the report says")


def write_awx_job(args):
    report = load(args.report)
    job = {"id": 7, "type": "job", "status": "successful", "finished": report["generated_at"],
           "artifacts": {"hypeman_vgpu_audit": report["summary"]}}
    with open(args.out, "w") as handle:
        json.dump(job, handle)


def check_artifact(args):
    expected, listing = load(args.expected), load(args.list)
    compare(expected_groups(expected, artifact=True), list_groups(listing), "artifact --list")
    for host, found in listing["_meta"]["hostvars"].items():
        if found["vgpu_complete"] is not False or found["vgpu_source"] != "artifact":
            fail("%s: vgpu_complete %s, vgpu_source %s" % (host, found["vgpu_complete"], found["vgpu_source"]))
    print("artifact: the hosts the summary names, in their groups")


def check_example(args):
    expected, listing = load(args.expected), load(args.list)
    compare(dict((g, h) for g, h in expected_groups(expected).items() if g == "vgpu_ready_for_cycle"),
            list_groups(listing), "example --list")
    for host in list_groups(listing)["vgpu_ready_for_cycle"]:
        found = listing["_meta"]["hostvars"][host]
        if found.get("target_gpu") != found["vgpu_ready_cards"][0]:
            fail("%s: target_gpu %s, ready cards %s" % (host, found.get("target_gpu"), found["vgpu_ready_cards"]))
    print("example: the AWX example source groups the ready cards and names each host's target_gpu")


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report")
    for flag in ("--report", "--expected", "--graph", "--list"):
        report.add_argument(flag, required=True)
    job = sub.add_parser("awx-job")
    job.add_argument("--report", required=True)
    job.add_argument("--out", required=True)
    artifact = sub.add_parser("artifact")
    artifact.add_argument("--expected", required=True)
    artifact.add_argument("--list", required=True)
    example = sub.add_parser("example")
    example.add_argument("--expected", required=True)
    example.add_argument("--list", required=True)
    args = parser.parse_args()
    {"report": check_report, "awx-job": write_awx_job, "artifact": check_artifact,
     "example": check_example}[args.command](args)


if __name__ == "__main__":
    main()
