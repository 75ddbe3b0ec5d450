# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test equipment: containers.podman's connection with pipelining.

Molecule's podman driver names the connection ``podman`` (short name), so this
file, first on ANSIBLE_CONNECTION_PLUGINS (scripts/molecule_env.sh), is the
one the scenarios use. containers.podman's plugin turns pipelining off because
it runs ``podman exec`` without ``-i`` (the module on stdin never arrives);
with ``-i`` it works. Per module run that saves two podman invocations (a
``podman exec`` to make the remote temporary directory and a ``podman mount``
to copy the module into it) of the three, and the temporary directory itself.
Async tasks and files that ``copy``/``template`` transfer still go through
``put_file`` (the container's file system, mounted when first needed).

Where the container runs the simulator's command runner (tests/sim/exec_agent.py:
a socket in ``$VGPU_SIM_EXEC_DIR/<container>/``; resources/create.yml mounts it and
starts the runner), commands go to it instead of ``podman exec``: about 0.2 s of CPU less
per module run. Where nothing listens there (another image, a container still
booting or restarting), ``podman exec`` runs the command as before.
"""

from __future__ import annotations

DOCUMENTATION = """
    name: podman
    short_description: containers.podman.podman with pipelining (test equipment)
    description:
        - containers.podman.podman, with C(podman exec -i) so modules can be pipelined.
    options:
      remote_addr:
        description: The ID of the container you want to access.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description: User to execute commands as inside the container.
        ini:
          - section: defaults
            key: remote_user
        env:
          - name: ANSIBLE_REMOTE_USER
        vars:
          - name: ansible_user
      podman_extra_args:
        description: Extra arguments to pass to the podman command line.
        default: ''
        ini:
          - section: defaults
            key: podman_extra_args
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description: Executable for podman command.
        default: podman
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
      pipelining:
        description: Send modules on stdin instead of copying them into a temporary directory first.
        type: boolean
        default: true
        env:
          - name: ANSIBLE_PIPELINING
        ini:
          - section: connection
            key: pipelining
        vars:
          - name: ansible_pipelining
"""

import importlib.util
import os
import shlex
import sys

from ansible.errors import AnsibleConnectionFailure
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection


def exec_agent():
    """tests/sim/exec_agent.py (stdlib only), loaded once per process from this checkout."""
    name = "hypeman_vgpu_sim_exec_agent"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "sim", "exec_agent.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


class Connection(PodmanConnection):
    """containers.podman.podman, pipelined; the container is mounted only for file transfers."""

    has_pipelining = True

    def _connect(self):
        # No `podman mount` per task: only put_file/fetch_file need the mount.
        ConnectionBase._connect(self)  # pylint: disable=protected-access
        self._connected = True

    def _mounted(self):
        if self._mount_point is None:
            PodmanConnection._connect(self)  # pylint: disable=protected-access
        return self._mount_point

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        argv = shlex.split(to_native(cmd, errors="surrogate_or_strict"))
        if not self.user:
            try:
                result = exec_agent().run_in_container(self._container_id, argv, in_data)
            except (OSError, exec_agent().ProtocolError) as exc:
                raise AnsibleConnectionFailure("command runner of %s (%s): %s" % (
                    self._container_id, exec_agent().socket_for(self._container_id), exc)) from None
            if result is not None:
                return result
        # No runner listens (yet): podman exec.
        args = ["exec"]
        if in_data is not None:
            args.append("-i")  # the pipelined module arrives on stdin
        if self.user:
            args.extend(("--user", self.user))
        return self._podman(args, argv, in_data)

    def put_file(self, in_path, out_path):
        self._mounted()
        super().put_file(in_path, out_path)

    def fetch_file(self, in_path, out_path):
        self._mounted()
        super().fetch_file(in_path, out_path)
