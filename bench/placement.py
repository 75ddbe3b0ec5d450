# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark vgpu_placement_info against an ansible.builtin.ping task, measured in the same run.

Builds a simulated host of 8 L40S cards x 32 VFs with 200 instances (most
running and holding their VF open, some stopped but still claiming, some
without a GPU), a few quarantines and a DCGM process, under a temporary
directory. Then it runs, on the local host with ``ansible_connection=local``:

* a playbook with no task (the fixed cost of ``ansible-playbook`` itself);
* a playbook with ``--tasks`` ``ansible.builtin.ping`` tasks;
* a playbook with ``--tasks`` ``hypeman.vgpu.vgpu_placement_info`` tasks
  (a what-if profile, against the simulated tree);

and prints the cost of each module's first task and of every further task.
A module's first task in a run also builds its payload on the controller
(ansible-core finds and zips the module's helpers once per run and reuses the
zip for every other task and host), so each module is run as a playbook of
one task and as a playbook of ``1 + --tasks`` tasks: the first task's cost is
the one-task playbook minus the empty one, and a task's steady cost -- what
every further host or task pays -- is the difference between the two
playbooks divided by ``--tasks`` (best of ``--rounds``). The ratio
placement / ping of the steady cost is the goal (< 1.5), in wall-clock time
and in CPU time of ``ansible-playbook`` and everything it ran (the steadier
figure when other work shares the machine). It also prints how long the
placement computation itself takes when called in-process, and the size of
the module's result.

The placement task is written as a real host's task would be: its options
are literal values (the simulated tree's paths stand in for the defaults
``/sys``, ``/proc``, ...). ``--templated-paths`` passes the paths as
``{{ p.* }}`` expressions instead, as this benchmark did before: each worker
then also templates five expressions that a ping task does not have, a
playbook cost that is not the module's.

Run: ``make bench`` or ``PYTHONPATH=.collections .venv/bin/python bench/placement.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils import _placement
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import HostTree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(REPO, ".collections")
Q_AT = "2026-08-22T00:00:00Z"


def build(root, cards=8, vfs=32, instances=200):
    """The benchmark host; returns the HostTree."""
    tree = HostTree(root)
    all_vfs = []
    for index in range(cards):
        card = tree.add_card("L40S", "0000:%02x:00.0" % (0x1b + 0x10 * index), numvfs=vfs)
        all_vfs.extend(card.vfs)
    for index in range(instances):
        instance_id = "bench%03d" % index
        if index % 10 == 9:
            tree.add_instance(instance_id, liveness="stopped")  # no GPU
        elif index % 10 == 8:
            tree.add_instance(instance_id, vf=all_vfs[index], profile="NVIDIA L40S-2Q", liveness="stopped")
        else:
            tree.add_instance(instance_id, vf=all_vfs[index], profile="NVIDIA L40S-2Q",
                              build="assigned" if index % 2 else "claimed")
    tree.add_process(comm="nv-hostengine", unit="nvidia-dcgm.service",
                     fds=["nvidia%d" % n for n in range(cards)] + ["nvidiactl"])
    tree.write_store([{"vf_address": vf, "quarantined_at": Q_AT} for vf in all_vfs[-5:]])
    tree.write_config(threshold=2)
    return tree


def playbook(path, tasks, task):
    with open(path, "w") as handle:
        handle.write("- hosts: localhost\n  gather_facts: false\n  tasks:\n")
        for _index in range(tasks):
            handle.write("    - %s\n" % task)


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_playbook(path, extra_vars):
    """``(wall seconds, CPU seconds)`` of one ansible-playbook run, its workers and modules included."""
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    binary = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    cpu = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.run([binary, "-i", "localhost,", "-c", "local", path, "-e", json.dumps(extra_vars)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    took = time.perf_counter() - start
    cpu = _children_cpu() - cpu
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        raise SystemExit("playbook %s failed" % path)
    return took, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--tasks", type=int, default=10, help="tasks per playbook (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the best is kept (default 3)")
    parser.add_argument("--dir", help="build the tree here instead of a temporary directory")
    parser.add_argument("--templated-paths", action="store_true",
                        help="pass the tree's paths as {{ p.* }} expressions (the benchmark's earlier form)")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="bench-placement-")
    try:
        tree = build(os.path.join(root, "host"))
        paths = {"data_dir": tree.data_dir, "sysfs_root": tree.sysfs_root, "proc_root": tree.proc_root,
                 "dev_root": tree.dev_root, "config_path": tree.config_path}
        if args.templated_paths:
            options = dict((key, "{{ p.%s }}" % key) for key in paths)
        else:
            options = paths
        placement_task = "hypeman.vgpu.vgpu_placement_info: %s" % json.dumps(
            dict(options, profile="NVIDIA L40S-2Q"), sort_keys=True)
        books = {"empty": os.path.join(root, "empty.yml")}
        with open(books["empty"], "w") as handle:
            handle.write("- hosts: localhost\n  gather_facts: false\n  tasks: []\n")
        for name, task in (("ping", "ansible.builtin.ping:"), ("placement", placement_task)):
            for suffix, count in (("first", 1), ("many", 1 + args.tasks)):
                books[name + "_" + suffix] = os.path.join(root, "%s_%s.yml" % (name, suffix))
                playbook(books[name + "_" + suffix], count, task)

        # In-process cost of the computation alone (what the module adds on the host).
        inproc = []
        for _round in range(5):
            start = time.perf_counter()
            result, _warnings = _placement.host_view(tree.sysfs_root, tree.proc_root, tree.dev_root, tree.data_dir,
                                                     tree.store_path, tree.config_path, "NVIDIA L40S-2Q")
            inproc.append(time.perf_counter() - start)
        assert result["slots"]["total"] == 256, result["slots"]
        result_kb = len(json.dumps(result)) / 1024.0

        wall = dict((name, float("inf")) for name in books)
        cpu = dict(wall)
        for _round in range(args.rounds):
            for name in sorted(books):
                took, used = run_playbook(books[name], {"p": paths})
                wall[name], cpu[name] = min(wall[name], took), min(cpu[name], used)
        print("host: 8 cards x 32 VFs = %d VFs, %d instances; load average %.1f"
              % (result["slots"]["total"], len(tree.instances), os.getloadavg()[0]))
        print("task measured: - %s" % placement_task)
        print("in-process placement computation: %.1f ms (best of 5); result %.0f KB of JSON"
              % (min(inproc) * 1000, result_kb))
        for label, best in (("wall", wall), ("cpu", cpu)):
            first = dict((name, best[name + "_first"] - best["empty"]) for name in ("ping", "placement"))
            steady = dict((name, (best[name + "_many"] - best[name + "_first"]) / args.tasks)
                          for name in ("ping", "placement"))
            print("%-4s ansible-playbook fixed cost %.3f s; first task (payload built): ping %.3f s, "
                  "vgpu_placement_info %.3f s; each further task: ping %.3f s, vgpu_placement_info %.3f s; "
                  "ratio %.2fx (goal < 1.5x)" % (label, best["empty"], first["ping"], first["placement"],
                                                 steady["ping"], steady["placement"],
                                                 steady["placement"] / steady["ping"]))
        print("(wall is what a quiet host shows; when other work shares the CPUs, the CPU-time ratio is the "
              "steadier estimate of it)")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
