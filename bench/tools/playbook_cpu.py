# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run ansible-playbook in this process and record where its CPU goes.

    python bench/tools/playbook_cpu.py OUT [ansible-playbook arguments]

Appends one JSON line per worker process to OUT -- the task's name, whether it
ran once for the play, the worker's own CPU seconds and those of the processes
it started and waited for (the module and the shell commands around it) -- and
one line for this process, the controller's main process. Used by
``bench/fleet.py --split``. It wraps ansible-core's WorkerProcess._run, an
internal that can change between ansible-core releases; it is test equipment,
never shipped to a host.
"""

from __future__ import annotations

import atexit
import json
import resource
import sys


def _cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _append(out, record):
    # One short write per process in append mode: lines from concurrent workers do not interleave.
    with open(out, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def main(argv):
    out, playbook_args = argv[0], argv[1:]
    from ansible.executor.process import worker  # pylint: disable=import-outside-toplevel
    from ansible.cli.playbook import main as playbook_main  # pylint: disable=import-outside-toplevel

    original_run = worker.WorkerProcess._run  # pylint: disable=protected-access

    def recorded_run(self):
        try:
            return original_run(self)
        finally:
            task = self._task  # pylint: disable=protected-access
            _append(out, {"process": "worker", "task": str(task.name), "run_once": bool(task.run_once),
                          "cpu": _cpu(resource.RUSAGE_SELF), "children_cpu": _cpu(resource.RUSAGE_CHILDREN)})

    worker.WorkerProcess._run = recorded_run  # pylint: disable=protected-access
    atexit.register(lambda: _append(out, {"process": "main", "cpu": _cpu(resource.RUSAGE_SELF)}))
    sys.argv = ["ansible-playbook"] + playbook_args
    return playbook_main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
