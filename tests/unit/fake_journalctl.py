# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fake ``journalctl`` first on PATH, so no unit test reads the machine's journal.

The fake is a small script: it appends its arguments to ``calls.jsonl`` and
answers from ``journalctl.json`` next to it, per source (``unit`` for
``--unit=...``, ``dmesg`` for ``--dmesg``): raw output bytes, stderr, exit
code, or a behaviour (``hang``: sleeps; ``endless``: prints without end).
By default it prints nothing and exits 0: an empty journal.
"""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

_SCRIPT = '''#!%(python)s
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.jsonl"), "a") as handle:
    handle.write(json.dumps(sys.argv[1:]) + "\\n")
with open(os.path.join(here, "journalctl.json")) as handle:
    spec = json.load(handle).get("dmesg" if "--dmesg" in sys.argv[1:] else "unit") or {}
if spec.get("behaviour") == "hang":
    time.sleep(3600)
if spec.get("behaviour") == "endless":
    chunk = (b'{"MESSAGE":"' + b"x" * 4000 + b'"}\\n') * 16
    while True:
        sys.stdout.buffer.write(chunk)
sys.stdout.buffer.write(bytes.fromhex(spec.get("stdout", "")))
sys.stdout.buffer.flush()
sys.stderr.write(spec.get("stderr", ""))
sys.exit(spec.get("rc", 0))
'''


class FakeJournalctl(object):
    """The fake's directory, what it answers and the calls it recorded."""

    def __init__(self, directory):
        self.directory = str(directory)
        self.path = os.path.join(self.directory, "journalctl")
        self.spec = {}
        with open(self.path, "w") as handle:
            handle.write(_SCRIPT % {"python": sys.executable})
        os.chmod(self.path, os.stat(self.path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self._save()

    def _save(self):
        with open(os.path.join(self.directory, "journalctl.json"), "w") as handle:
            json.dump(self.spec, handle)

    def answer(self, source, entries=None, raw=None, stderr="", rc=0, behaviour=None):
        """What the fake prints for ``source`` (``unit`` or ``dmesg``).

        ``entries``: journal entries (dicts, or anything JSON), one JSON line each,
        as ``--output=json`` prints them; ``raw``: the exact bytes instead.
        """
        if raw is None:
            raw = "".join(json.dumps(entry) + "\n" for entry in entries or []).encode("utf-8")
        self.spec[source] = {"stdout": raw.hex(), "stderr": stderr, "rc": rc, "behaviour": behaviour}
        self._save()

    def calls(self):
        try:
            with open(os.path.join(self.directory, "calls.jsonl")) as handle:
                return [json.loads(line) for line in handle]
        except FileNotFoundError:
            return []


@pytest.fixture(autouse=True)
def fake_journalctl(tmp_path_factory, monkeypatch):
    """Every unit test gets an empty fake journal first on PATH; tests that read it set its answers."""
    fake = FakeJournalctl(tmp_path_factory.mktemp("fake-journalctl"))
    monkeypatch.setenv("PATH", fake.directory + os.pathsep + os.environ.get("PATH", ""))
    return fake
