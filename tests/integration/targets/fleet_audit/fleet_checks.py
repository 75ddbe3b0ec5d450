# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Assertions of the fleet_audit target (runme.sh calls one subcommand per step).

Each subcommand exits non-zero with a message naming what differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

VOLATILE = ("generated_at", "check_mode", "reports", "history")


def _load(path):
    with open(path) as handle:
        return json.load(handle)


def fail(message):
    sys.stderr.write("FAIL: %s\n" % message)
    sys.exit(1)


def codes_of(entry):
    return sorted(set(issue["code"] for issue in entry["issues"]))


def comparable(report):
    """The report without what differs between two runs of the same audit (times, file paths)."""
    report = json.loads(json.dumps(report))
    for key in VOLATILE:
        report.pop(key, None)
    report["summary"].pop("reports", None)
    for entry in report["hosts"]:
        entry.pop("audited_at", None)
        # The look-back window starts a fixed time before each run.
        (entry.get("wedge_signals") or {}).pop("since", None)
    return report


def check_report(args):
    report = _load(args.report)
    expected = _load(args.expected)
    if report["kind"] != args.kind:
        fail("report kind %r, expected %r" % (report["kind"], args.kind))
    hosts = dict((entry["host"], entry) for entry in report["hosts"])
    if sorted(hosts) != sorted(expected):
        fail("report lists %s, inventory has %s" % (sorted(hosts), sorted(expected)))
    for host, codes in sorted(expected.items()):
        if codes_of(hosts[host]) != sorted(codes):
            fail("%s: issues %s, expected %s" % (host, codes_of(hosts[host]), sorted(codes)))
        warned = [i for i in hosts[host]["issues"] if i["severity"] != "info"]
        if hosts[host]["needs_action"] != bool(warned):
            fail("%s: needs_action %s with issues %s" % (host, hosts[host]["needs_action"], hosts[host]["issues"]))
    flags = [entry["needs_action"] for entry in report["hosts"]]
    if flags != sorted(flags, reverse=True):
        fail("hosts needing action are not listed first: %s" % [(e["host"], e["needs_action"]) for e in report["hosts"]])
    summary = report["summary"]
    counts = {
        "hosts_total": len(expected),
        "hosts_needing_action": len([h for h in hosts.values() if h["needs_action"]]),
        "hosts_unreachable": len([c for c in expected.values() if "unreachable" in c]),
        "hosts_store_unavailable": len([c for c in expected.values() if "store_unavailable" in c]),
        "cards_ready_for_cycle": len([c for c in expected.values() if "card_ready_for_cycle" in c]),
        "cards_draining": len([c for c in expected.values() if "card_draining" in c]),
        "cards_without_vfs": len([c for c in expected.values() if "card_without_vfs" in c]),
        "hosts_not_vgpu": len([c for c in expected.values() if "host_not_vgpu" in c]),
        # The wedge host: one VF hard-killed by hypeman, one whose QEMU the OOM killer killed.
        "at_risk_vfs": 2 * len([c for c in expected.values() if "vf_at_risk" in c]),
        "hosts_wedge_signals_unread": 0,
    }
    for key, value in sorted(counts.items()):
        if summary[key] != value:
            fail("summary %s is %s, expected %s" % (key, summary[key], value))
    if summary["slots_total"] != sum((e.get("capacity") or {}).get("total_slots", 0) for e in hosts.values()):
        fail("summary slots_total does not add up")
    for fmt, path in sorted(report["reports"].items()):
        if not os.path.isfile(path):
            fail("report file %s (%s) was not written" % (path, fmt))
        with open(path) as handle:
            text = handle.read()
        if fmt != "json":
            missing = [host for host in expected if host not in text]
            if missing:
                fail("%s does not mention %s" % (path, missing))
    print("report ok: %d hosts, %d need action" % (len(hosts), counts["hosts_needing_action"]))


def same_report(args):
    first, second = comparable(_load(args.first)), comparable(_load(args.second))
    if first != second:
        for a, b in zip(first["hosts"], second["hosts"]):
            if a != b:
                fail("reports differ for host %s:\n%s\n%s" % (a["host"], json.dumps(a, sort_keys=True),
                                                              json.dumps(b, sort_keys=True)))
        fail("reports differ: %s vs %s" % (json.dumps(first["summary"]), json.dumps(second["summary"])))
    print("reports identical apart from times and paths")


def same_tree(args):
    first, second = _load(args.first), _load(args.second)
    changed = sorted(k for k in set(first) | set(second) if first.get(k) != second.get(k))
    if changed:
        fail("%d path(s) under the simulated roots changed: %s" % (len(changed), changed[:20]))
    print("tree unchanged: %d entries" % len(first))


def check_policy(args):
    report = _load(args.report)
    violated = sorted(v["policy"] for v in report["policy"]["violations"])
    if violated != sorted(args.violated):
        fail("policy violations %s, expected %s" % (violated, sorted(args.violated)))
    if report["summary"]["policy_violations"] != report["policy"]["violations"]:
        fail("summary policy_violations differ from the report's")
    print("policy verdict ok: %s" % violated)


def check_reconcile(args):
    report = _load(args.report)
    expected = _load(args.expected)
    hosts = dict((entry["host"], entry) for entry in report["hosts"])
    done = dict((host, sorted((a["kind"], bool(a["changed"])) for a in hosts[host]["actions"])) for host in hosts)
    want = {}
    for host, codes in expected.items():
        actions = []
        if "store_unavailable" in codes:
            actions.append(("repair_store", not args.second_run))
        if "sentinel_unreported" in codes and not args.second_run:
            actions.append(("sentinel_failed", True))
        if "pending_quarantine" in codes:
            # No hypeman unit here: the re-evaluation is deferred to hypeman's next start.
            actions.append(("reevaluate", False))
        want[host] = sorted(actions)
    if args.second_run:
        want = dict((h, [a for a in acts if a[0] != "repair_store"]) for h, acts in want.items())
    for host in sorted(expected):
        if done[host] != want[host]:
            fail("%s: actions %s, expected %s" % (host, done[host], want[host]))
    failed = [(h, a) for h, e in hosts.items() for a in e["actions"] if a.get("failed")]
    if failed:
        fail("failed repairs: %s" % failed)
    print("reconcile actions ok: %d change(s)" % report["summary"]["actions_taken"])


def check_repaired(args):
    """After reconcile: the repaired stores are v1 with a backup, the sentinel verdict is in the store."""
    expected = _load(args.expected)
    report = _load(args.report)
    hosts = dict((entry["host"], entry) for entry in report["hosts"])
    for host, codes in sorted(expected.items()):
        gpu_dir = os.path.join(args.dir, "hosts", host, "var", "lib", "hypeman", "gpu")
        if "store_unavailable" in codes:
            with open(os.path.join(gpu_dir, "vf-health.json")) as handle:
                data = json.load(handle)
            if data.get("version") != 1 or not data.get("records"):
                fail("%s: store not repaired: %s" % (host, data))
            backups = [n for n in os.listdir(gpu_dir) if n.startswith("vf-health.json.") and n.endswith("~")]
            if len(backups) != 1:
                fail("%s: expected one backup of the old store, found %s" % (host, backups))
            if "store_unavailable" in codes_of(hosts[host]):
                fail("%s: still store_unavailable after reconcile" % host)
        if "sentinel_unreported" in codes:
            if "sentinel_unreported" in codes_of(hosts[host]):
                fail("%s: sentinel verdict still unreported after reconcile" % host)
            with open(os.path.join(gpu_dir, "vf-health.json")) as handle:
                records = json.load(handle)["records"]
            wedged = [r for r in records if any(f.get("instance_id") == "inst-wedged" for f in r.get("failures", []))]
            if len(wedged) != 1 or not wedged[0].get("quarantined_at"):
                fail("%s: the sentinel failure did not quarantine its VF: %s" % (host, records))
    print("repairs verified on disk")


def check_runner(args):
    """Run the audit through ansible-runner (AWX's engine) and check the set_stats artifact."""
    try:
        import ansible_runner  # pylint: disable=import-outside-toplevel
    except ImportError:
        fail("ansible_runner is not installed: pip install -r requirements-fleet.txt")
    expected = _load(args.expected)
    run = ansible_runner.run(private_data_dir=args.private_dir, playbook=args.playbook, inventory=args.inventory,
                             extravars={"audit_report_dir": os.path.join(args.private_dir, "reports")},
                             quiet=True)
    if run.status != "successful" or run.rc != 0:
        fail("ansible-runner: status %s rc %s" % (run.status, run.rc))
    stats = [e for e in run.events if e.get("event") == "playbook_on_stats"]
    if len(stats) != 1:
        fail("expected one playbook_on_stats event, got %d" % len(stats))
    artifacts = stats[0]["event_data"].get("artifact_data") or {}
    summary = artifacts.get("hypeman_vgpu_audit")
    if not isinstance(summary, dict):
        fail("no hypeman_vgpu_audit in the set_stats artifact: %s" % sorted(artifacts))
    unreachable = sorted(h for h, c in expected.items() if "unreachable" in c)
    wanted = {"hosts_total": len(expected), "hosts_unreachable": len(unreachable), "unreachable": unreachable,
              "hosts_store_unavailable": len([c for c in expected.values() if "store_unavailable" in c])}
    for key, value in sorted(wanted.items()):
        if summary.get(key) != value:
            fail("artifact %s is %r, expected %r" % (key, summary.get(key), value))
    print("ansible-runner: set_stats artifact hypeman_vgpu_audit arrived (%d hosts)" % summary["hosts_total"])


def check_prometheus(args):
    expected = _load(args.expected)
    for host, codes in sorted(expected.items()):
        if "unreachable" in codes:
            continue
        path = os.path.join(args.dir, "hosts", host, "prom", "hypeman_vgpu.prom")
        with open(path) as handle:
            lines = handle.read().splitlines()
        values = dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
        needs = values.get("hypeman_vgpu_audit_needs_action")
        warned = [c for c in codes if c not in ("below_threshold", "quarantined_vfs", "card_draining")]
        if needs != ("1" if warned else "0"):
            fail("%s: hypeman_vgpu_audit_needs_action %s with issues %s" % (host, needs, codes))
        if "store_unavailable" in codes and values.get("hypeman_vgpu_store_valid") != "0":
            fail("%s: hypeman_vgpu_store_valid should be 0" % host)
        if values.get("hypeman_vgpu_host_not_vgpu") != ("1" if "host_not_vgpu" in codes else "0"):
            fail("%s: hypeman_vgpu_host_not_vgpu %s with issues %s" % (host, values.get("hypeman_vgpu_host_not_vgpu"),
                                                                       codes))
        at_risk = ("1" if "vf_at_risk" in codes else "0")
        for reason in ("vf_may_wedge", "oom_killed_qemu"):
            if "host_not_vgpu" not in codes and "audit_incomplete" not in codes and \
                    values.get('hypeman_vgpu_at_risk_vfs{reason="%s"}' % reason) != at_risk:
                fail("%s: hypeman_vgpu_at_risk_vfs{reason=%s} is %s with issues %s" % (
                    host, reason, values.get('hypeman_vgpu_at_risk_vfs{reason="%s"}' % reason), codes))
        health = [v for k, v in values.items() if k.startswith("hypeman_vgpu_card_health{")]
        if "card_ready_for_cycle" in codes and "5" not in health:
            fail("%s: no card with hypeman_vgpu_card_health 5 (ready for cycle): %s" % (host, health))
        if "store_unavailable" in codes and set(health) != {"6"}:
            fail("%s: cards of a host with its store unavailable must all be 6: %s" % (host, health))
        if "audit_incomplete" not in codes and 'hypeman_vgpu_slots{kind="total"}' not in values:
            fail("%s: no slots metric in %s" % (host, path))
    print("prometheus textfiles ok")


def check_history(args):
    """The second audit into one report directory: trends over both, nothing changed, a garbage history file
    skipped with a warning, the files beyond the keep deleted, and the HTML map with one cell per card."""
    report = _load(args.report)
    history = report.get("history")
    if not history:
        fail("the report has no history")
    if len(history["points"]) != args.points:
        fail("%d trend points, expected %d: %s" % (len(history["points"]), args.points, history["points"]))
    if history["changes"]["text"] != "no change since the previous audit":
        fail("changes between two audits of the same fleet: %r" % history["changes"]["text"])
    if [os.path.basename(w.split(": ")[0].split()[-1]) for w in history["warnings"]] != args.skipped:
        fail("history warnings %s, expected files %s skipped" % (history["warnings"], args.skipped))
    directory = history["dir"]
    left = sorted(os.listdir(directory))
    for name in args.deleted:
        if name in left:
            fail("history file %s beyond the keep was not deleted: %s" % (name, left))
    if os.path.basename(history["record_file"]) not in left:
        fail("this report's record %s was not written: %s" % (history["record_file"], left))
    with open(report["reports"]["html"]) as handle:
        page = handle.read()
    cells = page.count(" data-card=")
    if cells != report["summary"]["cards_total"]:
        fail("the HTML map has %d card cells, the report %d cards" % (cells, report["summary"]["cards_total"]))
    print("history ok: %d points, %s" % (len(history["points"]), history["changes"]["text"]))


def check_vsock(args):
    """Current hypeman (vsock sentinel): the audit names the mode and reads hypeman's own sentinel."""
    report = _load(args.report)
    entry = report["hosts"][0]
    sentinel, metrics, codes = entry["sentinel"], entry.get("metrics"), codes_of(entry)
    if sentinel["sentinel_mode"] != "vsock":
        fail("%s: sentinel mode %s (%s), expected vsock"
             % (entry["host"], sentinel["sentinel_mode"], sentinel["sentinel_mode_reason"]))
    if sentinel["findings"] or sentinel["log_evidence"] != "none":
        fail("vsock host: findings %s, log evidence %s" % (sentinel["findings"], sentinel["log_evidence"]))
    if args.stage == "no-metrics":
        if metrics is not None or "sentinel_evidence_incomplete" not in codes:
            fail("without metrics_url: metrics %s, issues %s; expected sentinel_evidence_incomplete" % (metrics, codes))
    else:
        if metrics is None or metrics["error"] or not metrics["sample"]["checks"]:
            fail("metrics not read: %s" % metrics)
        if "checks_total" not in sentinel["sentinel_mode_reason"]:
            fail("mode not decided from hypeman's counter: %s" % sentinel["sentinel_mode_reason"])
        checks = metrics["sample"]["checks"]
        if not (checks.get("ok") and checks.get("failed")) or metrics["sample"]["init_failures"] != 1:
            fail("hypeman's sentinel should have polled ok and failed guests and recorded one failure: %s"
                 % metrics["sample"])
        if metrics["store_quarantined"] != int(metrics["sample"]["quarantined_vfs"]):
            fail("quarantined VFs: hypeman %s, store %s"
                 % (metrics["sample"]["quarantined_vfs"], metrics["store_quarantined"]))
        if "sentinel_evidence_incomplete" in codes:
            fail("hypeman's metrics cover a vsock host, yet: %s" % codes)
        lost = "sentinel_coverage_lost" in codes
        if lost != (args.stage == "lost"):
            fail("stage %s: issues %s, coverage problems %s" % (args.stage, codes, metrics["coverage_problems"]))
        if args.stage == "covered" and metrics["previous"] is not None:
            fail("first audit with metrics found a previous sample: %s" % metrics["previous"])
        if args.stage == "lost" and not any("unsupported_agent" in p for p in metrics["coverage_problems"]):
            fail("coverage lost without naming unsupported_agent: %s" % metrics["coverage_problems"])
        if args.sample and not os.path.isfile(args.sample):
            fail("the audit kept no metrics sample at %s" % args.sample)
    summary = report["summary"]
    if summary["hosts_sentinel_vsock"] != 1:
        fail("summary counts %s vsock hosts" % summary["hosts_sentinel_vsock"])
    if args.prom:
        with open(args.prom) as handle:
            text = handle.read()
        for line in ('hypeman_vgpu_sentinel_mode{mode="vsock"} 1', "hypeman_vgpu_hypeman_metrics_readable 1"):
            if line not in text:
                fail("textfile %s lacks %r" % (args.prom, line))
    print("vsock host (%s) ok: %s" % (args.stage, codes))


def main(argv=None):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("report")
    p.add_argument("--report", required=True)
    p.add_argument("--expected", required=True)
    p.add_argument("--kind", default="audit")
    p.set_defaults(func=check_report)
    p = sub.add_parser("history")
    p.add_argument("--report", required=True)
    p.add_argument("--points", type=int, required=True)
    p.add_argument("--skipped", nargs="*", default=[])
    p.add_argument("--deleted", nargs="*", default=[])
    p.set_defaults(func=check_history)
    p = sub.add_parser("same-report")
    p.add_argument("first")
    p.add_argument("second")
    p.set_defaults(func=same_report)
    p = sub.add_parser("same-tree")
    p.add_argument("first")
    p.add_argument("second")
    p.set_defaults(func=same_tree)
    p = sub.add_parser("policy")
    p.add_argument("--report", required=True)
    p.add_argument("--violated", nargs="*", default=[])
    p.set_defaults(func=check_policy)
    p = sub.add_parser("reconcile")
    p.add_argument("--report", required=True)
    p.add_argument("--expected", required=True)
    p.add_argument("--second-run", action="store_true")
    p.set_defaults(func=check_reconcile)
    p = sub.add_parser("repaired")
    p.add_argument("--report", required=True)
    p.add_argument("--expected", required=True)
    p.add_argument("--dir", required=True)
    p.set_defaults(func=check_repaired)
    p = sub.add_parser("runner")
    p.add_argument("--private-dir", required=True)
    p.add_argument("--playbook", required=True)
    p.add_argument("--inventory", required=True)
    p.add_argument("--expected", required=True)
    p.set_defaults(func=check_runner)
    p = sub.add_parser("prometheus")
    p.add_argument("--dir", required=True)
    p.add_argument("--expected", required=True)
    p.set_defaults(func=check_prometheus)
    p = sub.add_parser("vsock")
    p.add_argument("--report", required=True)
    p.add_argument("--stage", required=True, choices=("no-metrics", "covered", "lost"))
    p.add_argument("--sample")
    p.add_argument("--prom")
    p.set_defaults(func=check_vsock)
    args = parser.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
