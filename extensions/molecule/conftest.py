# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared testinfra fixtures for the molecule scenarios (loaded through --rootdir).

molecule's podman driver connects with Ansible's podman connection, which
testinfra can only drive through Ansible: one ad-hoc Ansible run per command.
``sh`` talks to the same container through testinfra's own podman backend for
plain commands and files; ``host`` stays for module runs. Like the connection
plugin (connection_plugins/podman.py), ``sh`` sends each command to the
container's command runner (tests/sim/exec_agent.py) where one listens, and
runs ``podman exec`` where none does.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import testinfra.host
from testinfra.backend.podman import PodmanBackend

_AGENT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "sim", "exec_agent.py")
_spec = importlib.util.spec_from_file_location("hypeman_vgpu_sim_exec_agent", _AGENT_PATH)
exec_agent = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(exec_agent)


class ExecAgentBackend(PodmanBackend):
    """testinfra's podman:// backend, through the container's command runner where it listens."""

    def run(self, command, *args, **kwargs):
        if self.user is None:
            cmd = self.get_command(command, *args)
            result = exec_agent.run_in_container(self.name, ["/bin/sh", "-c", cmd])
            if result is not None:
                return self.result(result[0], self.encode(cmd), result[1], result[2])
        return super().run(command, *args, **kwargs)  # no runner listens (yet): podman exec


@pytest.fixture(scope="module")
def sh(host):
    return testinfra.host.Host(ExecAgentBackend(host.backend.host))


@pytest.fixture(scope="session")
def command_runner():
    """tests/sim/exec_agent.py, for tests of the runner itself."""
    return exec_agent
