# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_cmd: argv-only execution, C locale, timeouts, check mode."""

from __future__ import annotations

import os
import sys

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
