# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test equipment for hostile-input tests: a hang detector, hostile file kinds in place of a file,
and the one tree fingerprint that proves a run changed nothing."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import stat


class Hang(BaseException):
    """Raised by the SIGALRM timer in code that did not return.

    A BaseException so no ``except Exception`` guard in the code under test
    swallows it: the test fails with "did not return" (never "too slow").
    """


@contextlib.contextmanager
def hang_detector(seconds, what="the call"):
    """Fail with :class:`Hang` when the body runs longer than ``seconds`` (a hang, not a speed check)."""
    def expired(_signum, _frame):
        raise Hang("%s did not return within %s seconds" % (what, seconds))

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def replace_with(path, how, content=b""):
    """Put a hostile ``how`` at ``path`` (whatever was there goes): ``fifo``, ``dir``,
    ``symlink`` (to ``content``, a path), ``dangling`` (a symlink to nothing),
    ``missing``, or ``file`` (holding ``content``). Returns ``path``."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dir":
        os.mkdir(path)
    elif how == "symlink":
        os.symlink(content, path)
    elif how == "dangling":
        os.symlink("/nonexistent/hypeman-vgpu-test", path)
    elif how == "file":
        with open(path, "wb") as handle:
            handle.write(content)
    elif how != "missing":
        raise ValueError("unknown hostile kind %r" % how)
    return path


def tree_fingerprint(root):
    """``{path: description}`` of everything under ``root``, links not followed: compare two to prove
    a run changed nothing. Regular files by mode and content hash, links by target, anything else
    (directories, FIFOs, sockets, devices) by mode only, so a hostile tree is never opened."""
    found = {}
    for base, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                found[path] = "link " + os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    found[path] = "file %o %s" % (info.st_mode, hashlib.sha256(handle.read()).hexdigest())
            else:
                found[path] = "mode %o" % info.st_mode
    return found


def property_settings(max_examples):
    """hypothesis settings for a property test: ``max_examples`` for ``make test``;
    ``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) runs 5000 examples without health checks."""
    from hypothesis import HealthCheck, settings

    if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz":
        return settings(max_examples=5000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    return settings(max_examples=max_examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
