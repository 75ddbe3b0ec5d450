# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sim_smoke verify: the container's command runner (tests/sim/exec_agent.py) stands in for podman exec.

Every scenario's module runs and ``sh`` commands go through it when it listens
(connection_plugins/podman.py, conftest.py). Here it must listen, and a
command must see the same process context as under ``podman exec``: user,
capabilities, seccomp, no-new-privileges, namespaces, cgroups, resource
limits, environment, umask, working directory, a session of its own.
"""

from __future__ import annotations

import os
import subprocess

PROBE = r"""
id; umask; pwd
grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status
for ns in /proc/self/ns/*; do echo "$ns $(readlink "$ns")"; done
cat /proc/self/cgroup
sed 1d /proc/self/limits
env | grep -v '^_=' | LC_ALL=C sort
ps -o sid= -o pgid= -p $$ | awk -v pid=$$ '{print ($1 == pid && $2 == pid) ? "session leader" : "not session leader"}'
"""


def test_the_command_runner_listens_and_gives_what_podman_exec_gives(sh, command_runner):
    agent_socket = command_runner.socket_for(sh.backend.name)
    assert agent_socket and os.path.exists(agent_socket), "VGPU_SIM_EXEC_DIR unset or no socket"
    rc, through_agent, stderr = command_runner.run(agent_socket, ["/bin/sh", "-c", PROBE], timeout=60)
    assert (rc, stderr) == (0, b"")
    podman = subprocess.run(["podman", "exec", sh.backend.name, "/bin/sh", "-c", PROBE],
                            capture_output=True, check=True, timeout=60)
    assert through_agent.decode().splitlines() == podman.stdout.decode().splitlines()
    # And it is the runner that ran it: the command's parent is the runner's python3.
    rc, parent, stderr = command_runner.run(agent_socket, ["/bin/sh", "-c", "cat /proc/$PPID/cmdline | tr '\\0' ' '"])
    assert (rc, stderr) == (0, b"")
    assert parent.decode().startswith("python3 -m tests.sim.exec_agent serve"), parent
