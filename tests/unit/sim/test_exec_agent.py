# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated host's command runner (tests/sim/exec_agent.py): what podman exec would return.

The molecule scenarios' modules run through it, so it must hand back exactly
the command's exit status, stdout and stderr, feed stdin byte for byte, and
survive any request. The container side (environment, limits, namespaces) is
compared with podman exec in the sim_smoke scenario.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.hypeman.vgpu.tests.sim import exec_agent

ENV = {b"PATH": b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", b"MARK": b"agent"}


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("agent") / exec_agent.SOCKET_NAME)
    server = exec_agent.make_server(path, ENV)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


def sh(agent, script, stdin=None):
    return exec_agent.run(agent, ["/bin/sh", "-c", script], stdin, timeout=30)


def test_exit_status_stdout_and_stderr_come_back_apart(agent):
    assert sh(agent, "printf out; printf err >&2; exit 3") == (3, b"out", b"err")


def test_stdin_arrives_byte_for_byte_and_none_means_dev_null(agent):
    payload = os.urandom(3 << 20) + b"\0\n\xff"
    rc, stdout, stderr = sh(agent, "sha256sum", payload)
    assert (rc, stdout.split()[0], stderr) == (0, hashlib.sha256(payload).hexdigest().encode(), b"")
    # Without data the command reads end of file at once, as under podman exec without -i.
    assert sh(agent, "cat; readlink /proc/self/fd/0") == (0, b"/dev/null\n", b"")
    assert sh(agent, "wc -c", b"") == (0, b"0\n", b"")


def test_a_signal_gives_128_plus_its_number_and_a_missing_program_127(agent):
    assert sh(agent, "kill -TERM $$")[0] == 128 + signal.SIGTERM
    rc, stdout, stderr = exec_agent.run(agent, ["/nonexistent/program"], timeout=30)
    assert (rc, stdout) == (127, b"") and b"/nonexistent/program" in stderr


def test_the_command_gets_the_given_environment_root_directory_and_its_own_session(agent):
    rc, stdout, stderr = sh(agent, "env; pwd; umask; ps -o sid= -o pgid= -p $$; echo $$")
    lines = stdout.decode().split("\n")
    assert (rc, stderr) == (0, b"")
    assert "MARK=agent" in lines and "/" in lines
    sid, pgid = lines[-3].split()
    assert sid == pgid == lines[-2]  # session leader, as podman exec's process is


def test_commands_run_side_by_side(agent):
    results = []
    threads = [threading.Thread(target=lambda: results.append(sh(agent, "sleep 1; echo done"))) for _count in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [(0, b"done\n", b"")] * 3


def test_nothing_listening_is_unavailable_and_nothing_is_sent(tmp_path):
    with pytest.raises(exec_agent.Unavailable):
        exec_agent.run(str(tmp_path / "absent.sock"), ["true"])
    stale = str(tmp_path / "stale.sock")  # a socket file whose agent has gone, as after a restart
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(stale)
    listener.close()
    with pytest.raises(exec_agent.Unavailable):
        exec_agent.run(stale, ["true"])


def test_the_commands_environment_is_the_one_the_agent_was_given_not_pythons_coerced_one():
    # No LANG or LC_*, as in the container: Python sets LC_CTYPE=C.UTF-8 in os.environ (PEP 538).
    given = {"PATH": os.environ["PATH"], "HOME": "/root", "container": "podman"}
    probe = ("import importlib.util, json, os, sys\n"
             "spec = importlib.util.spec_from_file_location('agent', sys.argv[1])\n"
             "agent = importlib.util.module_from_spec(spec); spec.loader.exec_module(agent)\n"
             "print(json.dumps([sorted(os.environ), sorted(k.decode() for k in agent.exec_environment())]))")
    proc = subprocess.run([sys.executable, "-c", probe, exec_agent.__file__], env=given, capture_output=True,
                          check=True, timeout=60)
    python_sees, commands_get = json.loads(proc.stdout)
    assert "LC_CTYPE" in python_sees  # the trap is real here
    assert commands_get == sorted(given)


def test_socket_for_follows_vgpu_sim_exec_dir():
    assert exec_agent.socket_for("c1", {"VGPU_SIM_EXEC_DIR": "/run/x"}) == "/run/x/c1/exec.sock"
    assert exec_agent.socket_for("c1", {"VGPU_SIM_EXEC_DIR": ""}) is None
    assert exec_agent.socket_for("c1", {}) is None


def test_run_in_uses_the_containers_agent_else_podman_exec(tmp_path, monkeypatch, capfdbinary):
    container_dir = tmp_path / "box"
    container_dir.mkdir()
    server = exec_agent.make_server(str(container_dir / exec_agent.SOCKET_NAME), ENV)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    podman_calls = []
    monkeypatch.setattr(exec_agent.subprocess, "call", lambda argv: podman_calls.append(argv) or 9)
    monkeypatch.setenv("VGPU_SIM_EXEC_DIR", str(tmp_path))
    try:
        assert exec_agent.main(["run", "box", "sh", "-c", "echo out; echo err >&2; exit 4"]) == 4
        assert capfdbinary.readouterr() == (b"out\n", b"err\n")
        assert podman_calls == []
    finally:
        server.shutdown()
        server.server_close()
    # Its agent gone (a stale socket) or no directory: podman exec, with the same arguments.
    assert exec_agent.main(["run", "box", "test", "-e", "/x"]) == 9
    monkeypatch.delenv("VGPU_SIM_EXEC_DIR")
    assert exec_agent.main(["run", "box", "true"]) == 9
    assert podman_calls == [["podman", "exec", "box", "test", "-e", "/x"], ["podman", "exec", "box", "true"]]
    assert exec_agent.main(["run", "box"]) == 2 and podman_calls[2:] == []


def _raw(agent, data):
    """What the agent answers to DATA (b"" when it just hangs up, unread data or not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(agent)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            return sock.recv(1 << 16)
        except (BrokenPipeError, ConnectionResetError):
            return b""


def _framed(header):
    return struct.pack(">I", len(header)) + header


@settings(max_examples=60, deadline=None)
@given(garbage=st.one_of(
    st.binary(max_size=64),
    st.builds(_framed, st.binary(max_size=64)),
    st.builds(lambda obj: _framed(repr(obj).encode()), st.dictionaries(st.text(max_size=8), st.integers())),
    st.sampled_from([
        _framed(b'{"argv": []}'), _framed(b'{"argv": "true"}'), _framed(b'{"argv": [1]}'),
        _framed(b'{"argv": ["true"], "stdin": -1}'), _framed(b'{"argv": ["true"], "stdin": true}'),
        _framed(b'{"argv": ["true"], "stdin": 10}') + b"short", struct.pack(">I", 1 << 30), _framed(b"[]"),
    ]),
))
def test_any_malformed_request_runs_nothing_and_the_agent_goes_on(agent, garbage):
    # The agent answers only after running a command: no answer, nothing ran.
    assert _raw(agent, garbage) == b""
    assert sh(agent, "echo alive") == (0, b"alive\n", b"")
