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
import selectors
import signal
import subprocess
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError


# At most this much of each output stream is kept (a runaway command may print without end).
OUTPUT_LIMIT = 1024 * 1024
# How much of a command's output an error message or warning quotes.
MESSAGE_OUTPUT_LIMIT = 2000


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
        """stdout and stderr joined, for pattern checks."""
        return "\n".join(part for part in (self.stdout.strip(), self.stderr.strip()) if part)

    def brief(self, limit=MESSAGE_OUTPUT_LIMIT):
        """:meth:`output` for a message: its last ``limit`` characters (a message may repeat many runs)."""
        return clip(self.output(), limit)

    def to_data(self, limit=None):
        """The command for a module result; ``limit`` keeps the last characters of each stream."""
        return {"argv": self.argv, "rc": self.rc, "stdout": clip(self.stdout, limit),
                "stderr": clip(self.stderr, limit), "skipped": self.skipped, "timed_out": self.timed_out}


def clip(text, limit):
    """The last ``limit`` characters of ``text``, saying how many came before (all of it when None)."""
    if limit is None or len(text) <= limit:
        return text
    return "[... %d earlier characters not shown]\n%s" % (len(text) - limit, text[len(text) - limit:])


def run(argv, timeout=60, check_mode=False, env_extra=None):
    """Run ``argv`` (a list, never a shell string) and capture its output.

    A missing or non-executable program is a VgpuError naming it. The run
    ends within ``timeout`` seconds (plus a few seconds to reap): at the
    deadline the command's whole process group is killed (a script's
    children too, which would otherwise keep the pipes open and the wait
    going) and ``timed_out=True`` is returned for the caller to judge. A
    child left running in the background after the command exited is not
    waited for. At most :data:`OUTPUT_LIMIT` bytes of each stream are kept.
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
        proc = subprocess.Popen(  # pylint: disable=ansible-bad-function  # noqa: S603 - fixed argv, no shell
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            start_new_session=True)
    except FileNotFoundError:
        raise VgpuError("%s: command not found; expected an executable at that path" % argv[0])
    except PermissionError:
        raise VgpuError("%s: permission denied; expected an executable file" % argv[0])
    except OSError as err:
        raise VgpuError("%s: cannot run it: %s; expected an executable file" % (argv[0], err.strerror or err))
    deadline = time.monotonic() + timeout
    capture = _Capture(proc)
    try:
        timed_out = not capture.collect(proc, deadline)
        if not timed_out:
            try:
                proc.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                timed_out = True  # it closed its output but runs on
        if timed_out:
            _kill_group(proc)
            capture.collect(proc, time.monotonic() + _REAP_SECONDS)
    finally:
        capture.close()
    try:
        rc = proc.wait(_REAP_SECONDS)
    except subprocess.TimeoutExpired:
        rc = None  # unkillable (uninterruptible sleep): reported as a timeout
        timed_out = True
    return CommandResult(argv, rc=None if timed_out else rc, stdout=capture.text(proc.stdout),
                         stderr=capture.text(proc.stderr), timed_out=timed_out)


# After the command exits, how long a background child may keep its pipes before reading stops;
# after a kill, how long the killed processes get to go.
_EXIT_GRACE = 1.0
_REAP_SECONDS = 5.0
_POLL = 0.5


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass


class _Capture(object):
    """Both output streams of a process, read without blocking, each capped at :data:`OUTPUT_LIMIT`."""

    def __init__(self, proc):
        self.selector = selectors.DefaultSelector()
        self.data = {}
        self.dropped = {}
        for stream in (proc.stdout, proc.stderr):
            self.data[stream] = []
            self.dropped[stream] = 0
            self.selector.register(stream, selectors.EVENT_READ)

    def collect(self, proc, deadline):
        """Read until both streams end (True) or ``deadline`` passes (False)."""
        exited_at = None
        while self.selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                return False
            if proc.poll() is not None:
                exited_at = now if exited_at is None else exited_at
                if now - exited_at > _EXIT_GRACE:
                    return True  # a background child holds the pipes: its output is not the command's
            for key, _events in self.selector.select(min(deadline - now, _POLL)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    self.selector.unregister(key.fileobj)
                    continue
                room = OUTPUT_LIMIT - sum(len(part) for part in self.data[key.fileobj])
                self.data[key.fileobj].append(chunk[:max(room, 0)])
                self.dropped[key.fileobj] += max(len(chunk) - max(room, 0), 0)
        return True

    def text(self, stream):
        text = _text(b"".join(self.data[stream]))
        if self.dropped[stream]:
            text += "\n[... %d more bytes not kept]" % self.dropped[stream]
        return text

    def close(self):
        self.selector.close()
        for stream in self.data:
            stream.close()


def _text(data):
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data
