# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one wrapper for external commands (sriov-manage, systemctl, nvidia-smi).

Fixed argv (never a shell), C locale so messages we match on are English,
a timeout on every call, and a check-mode switch that reports the command
without running it.
"""

from __future__ import annotations

import os
import subprocess

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError


class CommandResult:
    """What one command did (or would do, when skipped for check mode)."""

    __slots__ = ("argv", "rc", "stdout", "stderr", "skipped", "timed_out")

    def __init__(self, argv, rc=None, stdout="", stderr="", skipped=False, timed_out=False):
        self.argv = list(argv)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.skipped = skipped
        self.timed_out = timed_out

    @property
    def ok(self):
        return self.rc == 0 and not self.timed_out

    def output(self):
        """stdout and stderr joined, for error messages and pattern checks."""
        return "\n".join(part for part in (self.stdout.strip(), self.stderr.strip()) if part)

    def to_data(self):
        return {"argv": self.argv, "rc": self.rc, "stdout": self.stdout, "stderr": self.stderr,
                "skipped": self.skipped, "timed_out": self.timed_out}


def run(argv, timeout=60, check_mode=False, env_extra=None):
    """Run ``argv`` (a list, never a shell string) and capture its output.

    A missing or non-executable program is a VgpuError naming it; a timeout
    kills the process and returns ``timed_out=True`` for the caller to judge.
    """
    if isinstance(argv, str) or not argv:
        raise VgpuError("internal: command must be a non-empty argv list, got %r" % (argv,))
    argv = [str(a) for a in argv]
    if check_mode:
        return CommandResult(argv, skipped=True)
    env = dict(os.environ)
    env.update({"LANG": "C", "LC_ALL": "C", "LANGUAGE": "C"})
    if env_extra:
        env.update(env_extra)
    try:
        # module_utils here must stay usable without an AnsibleModule (helpers
        # and tests call it directly), so run_command is not available.
        proc = subprocess.run(  # pylint: disable=ansible-bad-function  # noqa: S603 - fixed argv, no shell
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, timeout=timeout, check=False,
        )
    except FileNotFoundError:
        raise VgpuError("%s: command not found; expected an executable at that path" % argv[0])
    except PermissionError:
        raise VgpuError("%s: permission denied; expected an executable file" % argv[0])
    except subprocess.TimeoutExpired as err:
        return CommandResult(argv, rc=None, stdout=_text(err.stdout), stderr=_text(err.stderr),
                             timed_out=True)
    return CommandResult(argv, rc=proc.returncode, stdout=_text(proc.stdout), stderr=_text(proc.stderr))


def _text(data):
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data
