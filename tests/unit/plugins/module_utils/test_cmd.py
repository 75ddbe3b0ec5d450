# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_cmd: argv-only execution, C locale, timeouts, check mode."""

from __future__ import annotations

import os
import sys
import time

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _cmd
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError


def test_runs_argv_and_captures_output():
    res = _cmd.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (res.rc, res.stdout, res.stderr, res.ok) == (3, "out\n", "err\n", False)
    assert res.output() == "out\nerr"


def test_sets_c_locale():
    res = _cmd.run([sys.executable, "-c", "import os; print(os.environ['LANG'], os.environ['LC_ALL'])"])
    assert res.stdout.strip() == "C C"


def test_check_mode_does_not_run(tmp_path):
    marker = tmp_path / "ran"
    res = _cmd.run(["touch", str(marker)], check_mode=True)
    assert res.skipped and res.rc is None
    assert not marker.exists()


def test_timeout_kills_and_reports():
    res = _cmd.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert res.timed_out and not res.ok


def test_missing_program_is_clear_error(tmp_path):
    with pytest.raises(VgpuError, match="command not found"):
        _cmd.run([str(tmp_path / "sriov-manage"), "-d", "0000:82:00.0"])


def test_not_executable_is_clear_error(tmp_path):
    prog = tmp_path / "tool"
    prog.write_text("#!/bin/sh\n")
    os.chmod(str(prog), 0o644)
    with pytest.raises(VgpuError, match="permission denied"):
        _cmd.run([str(prog)])


def test_rejects_shell_strings():
    with pytest.raises(VgpuError, match="argv list"):
        _cmd.run("echo hi")


def test_a_timed_out_command_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = "sleep 30 & echo $! > %s; wait" % pidfile
    res = _cmd.run(["/bin/sh", "-c", script], timeout=0.5)
    assert res.timed_out and res.rc is None
    child = int(pidfile.read_text())
    # The background child was in the killed process group: it is gone (or a zombie of init).
    # SIGKILL is delivered at once but a loaded machine may take a moment to run the exit.
    state = None
    for _attempt in range(200):
        try:
            with open("/proc/%d/stat" % child) as handle:
                state = handle.read().split(")")[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        if state in ("Z", "gone"):
            break
        time.sleep(0.05)
    assert state in ("Z", "gone"), "child %d still in state %s 10 s after the kill" % (child, state)


def test_a_background_child_holding_the_pipes_is_not_waited_for():
    # Without the exit grace the run would wait for the child's 30 s, holding stdout open.
    res = _cmd.run(["/bin/sh", "-c", "sleep 30 & echo started; exit 4"], timeout=20)
    assert (res.rc, res.timed_out, res.stdout) == (4, False, "started\n")


def test_endless_output_is_capped(monkeypatch):
    monkeypatch.setattr(_cmd, "OUTPUT_LIMIT", 1000)
    res = _cmd.run([sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('y' * 4096)"], timeout=1)
    assert res.timed_out
    kept, _sep, note = res.stdout.partition("\n")
    assert kept == "y" * 1000 and note.startswith("[... ") and note.endswith(" more bytes not kept]")


def test_a_file_that_is_no_program_is_a_clear_error(tmp_path):
    prog = tmp_path / "tool"
    prog.write_bytes(b"\x00\x01\x02 not a program")
    os.chmod(str(prog), 0o755)
    with pytest.raises(VgpuError, match="cannot run it: Exec format error"):
        _cmd.run([str(prog)])
