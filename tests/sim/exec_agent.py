# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Command runner inside the simulated host's container (test equipment).

``podman exec`` costs about 0.2 s of CPU per call (the podman client, conmon and
``runc exec``), about what the module it starts costs, and a molecule scenario
makes hundreds (``recover_happy``: 228). The molecule create step
(``extensions/molecule/resources/create.yml``) starts this agent once with
``podman exec --detach``, listening on a unix socket in a directory it
bind-mounted into the container; the agent starts each
command as its own child. The agent being a ``podman exec`` process itself,
its commands get what ``podman exec`` would give them: the container's
namespaces, capabilities, seccomp filter, cgroup (the container's, outside
every systemd unit), environment, resource limits and umask. The agent adds
``/`` as working directory, a session of its own and stdin ``/dev/null`` unless
data is sent, as ``podman exec`` does; the exit status is the command's,
128+N when signal N ended it.

One request per connection: a 4-byte big-endian length and a JSON header
``{"argv": [...], "stdin": N or null}``, then N bytes of stdin. The answer: a
4-byte length, ``{"rc": R, "stdout": A, "stderr": B}``, then A and B bytes.

``run`` is the controller's side, ``run_in_container`` its one entry for the
molecule connection plugin, the testinfra backend and ``run`` on the command
line (None: no agent, use ``podman exec``). ``run`` raises ``Unavailable`` only when nothing listens (no
socket, connection refused), before anything was sent, so the caller may use
``podman exec`` instead; any later failure is an error, since the command may
have run.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import subprocess
import sys

HEADER = struct.Struct(">I")
MAX_HEADER = 1 << 20  # argv of a module run is a few hundred bytes
MAX_STDIN = 1 << 30
SOCKET_NAME = "exec.sock"


class Unavailable(Exception):
    """No agent listens at the socket: nothing was sent."""


class ProtocolError(Exception):
    """A malformed or cut-off message."""


def _recv_exactly(sock, size):
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed with %d bytes still expected" % size)
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _send_message(sock, header, *payloads):
    data = json.dumps(header).encode()
    sock.sendall(HEADER.pack(len(data)) + data)
    for payload in payloads:
        sock.sendall(payload)


def _recv_header(sock):
    (size,) = HEADER.unpack(_recv_exactly(sock, HEADER.size))
    if size > MAX_HEADER:
        raise ProtocolError("header of %d bytes; at most %d expected" % (size, MAX_HEADER))
    try:
        header = json.loads(_recv_exactly(sock, size))
    except ValueError as exc:
        raise ProtocolError("header is not JSON: %s" % exc) from None
    if not isinstance(header, dict):
        raise ProtocolError("header is %r; a JSON object expected" % type(header).__name__)
    return header


def _length(header, key, limit):
    value = header.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit):
        return value
    raise ProtocolError("%s is %r; a byte count from 0 to %d expected" % (key, value, limit))


# --- controller side -----------------------------------------------------------------


def socket_for(container, environ=None):
    """Where CONTAINER's agent listens ($VGPU_SIM_EXEC_DIR/<container>/exec.sock), or None
    when VGPU_SIM_EXEC_DIR is unset or empty: every command goes through podman exec."""
    base = (os.environ if environ is None else environ).get("VGPU_SIM_EXEC_DIR")
    return os.path.join(base, container, SOCKET_NAME) if base else None


def run(socket_path, argv, stdin=None, timeout=None):
    """Run argv (a list of str) in the container: (rc, stdout bytes, stderr bytes)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(socket_path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
            raise Unavailable("%s: %s" % (socket_path, exc.strerror)) from None
        sock.settimeout(timeout)
        _send_message(sock, {"argv": list(argv), "stdin": None if stdin is None else len(stdin)},
                      *([stdin] if stdin else []))
        answer = _recv_header(sock)
        rc = answer.get("rc")
        if not isinstance(rc, int) or isinstance(rc, bool):
            raise ProtocolError("rc is %r; an exit status expected" % (rc,))
        stdout = _recv_exactly(sock, _length(answer, "stdout", MAX_STDIN) or 0)
        stderr = _recv_exactly(sock, _length(answer, "stderr", MAX_STDIN) or 0)
        return rc, stdout, stderr
    finally:
        sock.close()


def run_in_container(container, argv, stdin=None, timeout=None):
    """run() through CONTAINER's agent: (rc, stdout, stderr), or None when no agent is configured
    or listens there (the caller uses podman exec)."""
    agent_socket = socket_for(container)
    if agent_socket:
        try:
            return run(agent_socket, argv, stdin, timeout)
        except Unavailable:
            pass
    return None


# --- container side ------------------------------------------------------------------


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        try:
            header = _recv_header(self.request)
            argv = header.get("argv")
            if not (isinstance(argv, list) and argv and all(isinstance(arg, str) for arg in argv)):
                raise ProtocolError("argv is %r; a non-empty list of strings expected" % (argv,))
            size = _length(header, "stdin", MAX_STDIN)
            stdin = None if size is None else _recv_exactly(self.request, size)
        except (ProtocolError, OSError) as exc:
            print("vgpu-sim-exec: bad request: %s" % exc, file=sys.stderr)
            return
        rc, stdout, stderr = self._run(argv, stdin)
        try:
            _send_message(self.request, {"rc": rc, "stdout": len(stdout), "stderr": len(stderr)}, stdout, stderr)
        except OSError:
            pass  # the controller went away; the command has run, as with podman exec

    def _run(self, argv, stdin):
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.server.command_env, cwd="/",
                start_new_session=True)
        except OSError as exc:
            return (127 if isinstance(exc, FileNotFoundError) else 126), b"", (
                "vgpu-sim-exec: %s: %s\n" % (argv[0], exc.strerror)).encode()
        stdout, stderr = proc.communicate(stdin)
        return (128 - proc.returncode if proc.returncode < 0 else proc.returncode), stdout, stderr


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def make_server(path, command_env=None):
    """A server listening on PATH (any file there replaced); its commands get COMMAND_ENV,
    by default the agent's own environment."""
    try:
        os.unlink(path)  # a previous agent's; the directory is this container's
    except FileNotFoundError:
        pass
    server = _Server(path, _Handler)
    os.chmod(path, 0o600)
    server.command_env = command_env
    return server


def exec_environment():
    """The environment podman exec gave this process, as the kernel keeps it: not os.environ,
    where Python's locale coercion (PEP 538) adds LC_CTYPE=C.UTF-8 in a container without LANG."""
    with open("/proc/self/environ", "rb") as stream:
        return dict(item.partition(b"=")[::2] for item in stream.read().split(b"\0") if b"=" in item)


def serve(directory):
    """Listen on DIRECTORY/exec.sock until the container stops."""
    make_server(os.path.join(directory, SOCKET_NAME), exec_environment()).serve_forever()


def run_in(container, argv):
    """``exec_agent.py run CONTAINER ARGV...`` on the controller (scripts that poll the container):
    ARGV through CONTAINER's agent, or ``podman exec`` where none listens; its output and status."""
    result = run_in_container(container, argv)
    if result is None:
        return subprocess.call(["podman", "exec", container] + list(argv))
    rc, stdout, stderr = result
    sys.stdout.buffer.write(stdout)
    sys.stderr.buffer.write(stderr)
    return rc


USAGE = """usage: python3 -m tests.sim.exec_agent serve DIRECTORY   (in the container)
       python3 exec_agent.py run CONTAINER ARGV...         (on the controller)"""


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "serve":
        serve(args[1])
        return 0
    if len(args) >= 3 and args[0] == "run":
        return run_in(args[1], args[2:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
