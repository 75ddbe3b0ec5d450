# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet audit benchmark: audit wall time per host against one ping task per host.

Builds a simulated fleet (local connection; every host its own tree of two
A100 cards x 16 VFs with running instances, some quarantines and some sentinel
findings, from tests/integration/targets/fleet_audit/fleet_fixture.py), then,
for a small and a large fleet, runs in this process:

- baseline: a playbook with one ``ansible.builtin.ping`` task per host;
- audit: ``hypeman.vgpu.audit`` (per-host audit plus the fleet report), as an
  hourly audit finds a host: the helpers' bytecode kept from an earlier run;
- cold audit: the same with the bytecode cache off (``HYPEMAN_VGPU_BYTECODE_CACHE=off``),
  as a host's first audit after an install or upgrade finds it.

It prints, for both fleet sizes, wall seconds and CPU seconds (the
ansible-playbook process and everything it started: workers and modules; on
a shared, loaded machine the steadier figure) per host and the ratio
audit/ping per host (issue 16's goal: at most 1.3x), then the marginal cost
of a host -- (large - small) / (large hosts - small hosts), which leaves out
what a run costs once whatever its size (startup, the report play) -- and how
the per-host cost grows from the small to the large fleet (flat is the goal).
Not a test: nothing here asserts on time.

    python bench/fleet.py [--hosts 1000] [--small 200] [--forks 2] [--repeat 2] [--split] [--baseline DIR]

``--split`` then runs ping and the audit once more on the small fleet through
``bench/tools/playbook_cpu.py`` and prints where a host's CPU goes: the
controller's main process, the workers of the per-host task, the modules (and
the shell commands around them) those workers started, and the workers of the
tasks that run once for the play; then the controller's share alone (everything
but the modules, which on a real fleet run on the managed hosts).

``--baseline DIR`` (a collections path holding another hypeman.vgpu, e.g. an
earlier commit unpacked with ``git archive``) also audits with that copy in
the same alternation and prints its per-host cost beside ours: a before/after
measured under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration", "targets", "fleet_audit"))

import fleet_fixture  # noqa: E402  pylint: disable=wrong-import-position

PING_PLAYBOOK = """---
- name: Baseline - one ping per host
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def ansible_env(forks):
    env = dict(os.environ)
    # As on a managed host, where it is seldom set: with it, no bytecode is kept between runs.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(REPO, ".collections"))
    env.update({"ANSIBLE_FORKS": str(forks), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_HOST_KEY_CHECKING": "False",
                "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_LOCALHOST_WARNING": "False"})
    return env


def playbook_bin():
    found = shutil.which("ansible-playbook", path=os.path.dirname(sys.executable) + os.pathsep
                         + os.environ.get("PATH", ""))
    if not found:
        sys.exit("ansible-playbook not found next to %s or on PATH" % sys.executable)
    return found


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(argv, env, log):
    """(wall seconds, CPU seconds of the run and every process it started) of one playbook run."""
    start, cpu = time.monotonic(), _children_cpu()
    with open(log, "w") as handle:
        proc = subprocess.run(argv, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit("%s failed (exit %d); see %s" % (" ".join(argv[:3]), proc.returncode, log))
    return elapsed, _children_cpu() - cpu


def subset_inventory(work, count):
    with open(os.path.join(work, "inventory.json")) as handle:
        inventory = json.load(handle)
    # The first hosts in build order, so a subset keeps the fleet's mix of problems.
    names = sorted(inventory["all"]["hosts"], key=lambda name: int(name.rsplit("-", 1)[1]))[:count]
    inventory["all"]["hosts"] = dict((n, inventory["all"]["hosts"][n]) for n in names)
    path = os.path.join(work, "inventory-%d.json" % count)
    with open(path, "w") as handle:
        json.dump(inventory, handle)
    return path


def measure(work, count, forks, repeat, baseline=None):
    env = ansible_env(forks)
    inventory = subset_inventory(work, count)
    ping_yml = os.path.join(work, "ping.yml")
    best = {}
    audit = [playbook_bin(), "-i", inventory, "hypeman.vgpu.audit"]
    # The audit as hourly runs find a host: its helpers' bytecode kept from an earlier run (the
    # simulated hosts share one machine, so one cache, filled by the first host of the first run);
    # "cold" is a host's first run after an install or upgrade, every helper compiled.
    runs = [("ping", [playbook_bin(), "-i", inventory, ping_yml], env),
            ("audit", audit + ["-e", "audit_report_dir=%s" % os.path.join(work, "report-%d" % count)],
             dict(env, HYPEMAN_VGPU_BYTECODE_CACHE=os.path.join(work, "bytecode"))),
            ("cold", audit + ["-e", "audit_report_dir=%s" % os.path.join(work, "cold-%d" % count)],
             dict(env, HYPEMAN_VGPU_BYTECODE_CACHE="off"))]
    if baseline:
        runs.append(("baseline", [playbook_bin(), "-i", inventory, "hypeman.vgpu.audit",
                                  "-e", "audit_report_dir=%s" % os.path.join(work, "baseline-%d" % count)],
                     dict(env, ANSIBLE_COLLECTIONS_PATH=baseline)))
    # Ping and audit alternate, and the fastest of each counts, so both see the same machine load.
    for attempt in range(repeat):
        for name, argv, run_env in runs:
            elapsed, cpu = timed_run(argv, run_env, os.path.join(work, "%s-%d-%d.log" % (name, count, attempt)))
            # Progress on stderr: a 1,000-host round takes minutes per run.
            sys.stderr.write("  [%s, %d hosts, run %d: %.1f s wall, %.1f s CPU]\n" % (name, count, attempt + 1, elapsed, cpu))
            best[name] = min(best.get(name, elapsed), elapsed)
            best[name + "_cpu"] = min(best.get(name + "_cpu", cpu), cpu)
            best.setdefault(name + "_cpu_runs", []).append(cpu)
    with open(os.path.join(work, "report-%d" % count, "fleet-audit.json")) as handle:
        summary = json.load(handle)["summary"]
    if summary["hosts_total"] != count or summary["hosts_failed"] or summary["hosts_unreachable"]:
        sys.exit("the audit of %d hosts did not audit them all: %s" % (count, summary))
    return best, summary


def cpu_split(work, count, forks):
    """Per-host CPU seconds of ping and the audit on ``count`` hosts, by process kind (one run each)."""
    inventory = subset_inventory(work, count)
    tool = [sys.executable, os.path.join(REPO, "bench", "tools", "playbook_cpu.py")]
    rows = {}
    for name, playbook_args in (("ping", [os.path.join(work, "ping.yml")]),
                                ("audit", ["hypeman.vgpu.audit", "-e",
                                           "audit_report_dir=%s" % os.path.join(work, "split-%d" % count)])):
        out = os.path.join(work, "split-%s-%d.jsonl" % (name, count))
        if os.path.exists(out):
            os.unlink(out)
        timed_run(tool + [out, "-i", inventory] + playbook_args,
                  dict(ansible_env(forks), HYPEMAN_VGPU_BYTECODE_CACHE=os.path.join(work, "bytecode")),
                  os.path.join(work, "split-%s-%d.log" % (name, count)))
        with open(out) as handle:
            records = [json.loads(line) for line in handle]
        per_task = {}
        for record in records:
            if record["process"] == "worker":
                per_task.setdefault(record["task"], []).append(record)
        row = {"main": 0.0, "workers": 0.0, "modules": 0.0, "once": 0.0}
        for record in records:
            if record["process"] == "main":
                row["main"] += record["cpu"]
            elif len(per_task[record["task"]]) >= count and not record["run_once"]:
                row["workers"] += record["cpu"]
                row["modules"] += record["children_cpu"]
            else:
                row["once"] += record["cpu"] + record["children_cpu"]
        rows[name] = dict((key, value / count) for key, value in row.items())
    print("where a host's CPU goes, %d hosts, one run each (s/host): controller main process, per-host task's "
          "workers, their modules (with the shell commands around them), tasks run once" % count)
    for name in ("ping", "audit"):
        row = rows[name]
        print("  %-6s main %.4f  workers %.4f  modules %.4f  run-once %.4f  total %.4f" % (
            name, row["main"], row["workers"], row["modules"], row["once"], sum(row.values())))
    print("  %-6s main %+.4f  workers %+.4f  modules %+.4f  run-once %+.4f  total %+.4f" % tuple(
        ["+audit"] + [rows["audit"][key] - rows["ping"][key] for key in ("main", "workers", "modules", "once")]
        + [sum(rows["audit"].values()) - sum(rows["ping"].values())]))
    # On a real fleet the modules run on the managed hosts; the rest is what the controller pays per host.
    controller = dict((name, rows[name]["main"] + rows[name]["workers"] + rows[name]["once"]) for name in rows)
    print("  controller only (without the modules, which run on the hosts of a real fleet): ping %.4f, audit %.4f, "
          "audit/ping %.2fx" % (controller["ping"], controller["audit"], controller["audit"] / controller["ping"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000, help="the large fleet (default 1000)")
    parser.add_argument("--small", type=int, default=200, help="the small fleet (default 200)")
    parser.add_argument("--forks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2,
                        help="rounds per fleet size: the fastest run counts, and each round's ratio is printed")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--work", metavar="DIR", help="reuse the fleet built in DIR (kept by --keep) instead of building one")
    parser.add_argument("--baseline", metavar="DIR", help="a collections path with another hypeman.vgpu to audit with too")
    parser.add_argument("--split", action="store_true", help="then print where a host's CPU goes, on the small fleet")
    args = parser.parse_args(argv)
    if not 0 < args.small < args.hosts:
        parser.error("--small must be above 0 and below --hosts")
    work = args.work or tempfile.mkdtemp(prefix="fleet-bench-")
    try:
        start = time.monotonic()
        if args.work:
            with open(os.path.join(work, "inventory.json")) as handle:
                if len(json.load(handle)["all"]["hosts"]) < args.hosts:
                    parser.error("the fleet in %s has fewer than %d hosts" % (work, args.hosts))
        else:
            problems = [fleet_fixture.MIX[i % len(fleet_fixture.MIX)] for i in range(args.hosts)]
            fleet_fixture.build_fleet(work, problems, python=sys.executable)
        with open(os.path.join(work, "ping.yml"), "w") as handle:
            handle.write(PING_PLAYBOOK)
        print("fleet: %d hosts (2 cards x 16 VFs each; mix %s), built in %.1f s; forks=%d; load average %s"
              % (args.hosts, "/".join(sorted(set(fleet_fixture.MIX))), time.monotonic() - start, args.forks,
                 " ".join("%.1f" % value for value in os.getloadavg())))
        rows = {}
        names = ("audit", "cold", "baseline") if args.baseline else ("audit", "cold")
        for count in (args.small, args.hosts):
            rows[count], summary = measure(work, count, args.forks, args.repeat, args.baseline)
            row = rows[count]
            print("  %4d hosts: ping %6.1f s wall (%.3f s/host), %6.1f s CPU (%.3f s/host)" % (
                count, row["ping"], row["ping"] / count, row["ping_cpu"], row["ping_cpu"] / count))
            print("       cold audit %6.1f s wall (%.3f s/host), %6.1f s CPU (%.3f s/host)   "
                  "cold/ping per host: %.2fx wall, %.2fx CPU   [no bytecode cache: every helper compiled]" % (
                      row["cold"], row["cold"] / count, row["cold_cpu"], row["cold_cpu"] / count,
                      row["cold"] / row["ping"], row["cold_cpu"] / row["ping_cpu"]))
            print("              audit %6.1f s wall (%.3f s/host), %6.1f s CPU (%.3f s/host)   "
                  "audit/ping per host: %.2fx wall, %.2fx CPU   [%d need action, %d quarantined VFs, "
                  "%d sentinel verdicts]" % (
                      row["audit"], row["audit"] / count, row["audit_cpu"], row["audit_cpu"] / count,
                      row["audit"] / row["ping"], row["audit_cpu"] / row["ping_cpu"],
                      summary["hosts_needing_action"], summary["quarantined_vfs"], summary["sentinel_failed"]))
            # Each round's audit against the ping run just before it: the machine's speed drifts over
            # minutes, so the median of these pairs is steadier than the ratio of the two fastest runs.
            for name in names:
                pairs = [cpu / ping for cpu, ping in zip(row[name + "_cpu_runs"], row["ping_cpu_runs"])]
                print("              %s/ping CPU round by round: %s; median %.2fx" % (
                    name, " ".join("%.2fx" % pair for pair in pairs), statistics.median(pairs)))
            if args.baseline:
                print("           baseline %6.1f s wall (%.3f s/host), %6.1f s CPU (%.3f s/host)   "
                      "baseline/ping per host: %.2fx wall, %.2fx CPU" % (
                          row["baseline"], row["baseline"] / count, row["baseline_cpu"], row["baseline_cpu"] / count,
                          row["baseline"] / row["ping"], row["baseline_cpu"] / row["ping_cpu"]))
        small, large = rows[args.small], rows[args.hosts]
        extra = float(args.hosts - args.small)
        for unit, suffix in (("wall", ""), ("CPU", "_cpu")):
            marginal_ping = (large["ping" + suffix] - small["ping" + suffix]) / extra
            print("%s: ping per host %.3f s at %d hosts, %.3f s at %d (x%.2f); marginal ping host (%d -> %d) %.3f s"
                  % (unit, small["ping" + suffix] / args.small, args.small, large["ping" + suffix] / args.hosts,
                     args.hosts, (large["ping" + suffix] / args.hosts) / (small["ping" + suffix] / args.small),
                     args.small, args.hosts, marginal_ping))
            for name in names:
                marginal = (large[name + suffix] - small[name + suffix]) / extra
                print("  %-8s /ping per host %.2fx at %d hosts, %.2fx at %d (goal <= 1.3x); marginal host %.3f s, "
                      "%.2fx ping's; per-host %s %.3f -> %.3f s (x%.2f; flat = 1)"
                      % (name, small[name + suffix] / small["ping" + suffix], args.small,
                         large[name + suffix] / large["ping" + suffix], args.hosts, marginal,
                         marginal / marginal_ping if marginal_ping > 0 else float("nan"), name,
                         small[name + suffix] / args.small, large[name + suffix] / args.hosts,
                         (large[name + suffix] / args.hosts) / (small[name + suffix] / args.small)))
        if args.split:
            cpu_split(work, args.small, args.forks)
    finally:
        if args.keep or args.work:
            print("work directory kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
