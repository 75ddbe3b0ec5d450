# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_store_write under real processes: SIGKILL at any point never leaves a partial store,
and parallel writers lose no update."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _store, _store_write

# The directory holding "ansible_collections", so child processes import the same code.
IMPORT_ROOT = os.path.abspath(os.path.join(os.path.dirname(_store.__file__), *([os.pardir] * 5)))

WORKER = r'''
import os, signal, sys
from ansible_collections.hypeman.vgpu.plugins.module_utils import _store_write

path, mode, arg = sys.argv[1], sys.argv[2], sys.argv[3]

def add_failure(tag):
    def mutate(store):
        vf = "0000:82:%02x.%d" % (len(store.records) // 8 % 256, len(store.records) % 8)
        return store.report_failure(vf, tag, "2026-08-20T15:00:00Z", 1000)
    return mutate

if mode == "loop":
    # Write forever, growing the store; the parent kills us at a random moment.
    sys.stdout.write("ready\n"); sys.stdout.flush()
    n = 0
    while True:
        n += 1
        _store_write.update_store(path, add_failure("%s-%d" % (arg, n)))
elif mode == "die-at":
    # Die by SIGKILL at one named step of the write procedure on the tmp file
    # ("write" = before writing, "write-after" = right after, and so on).
    step = arg
    real = {name: getattr(os, name) for name in ("open", "write", "fsync", "close", "rename")}
    tmp_fds = set()
    def hook(name):
        def wrapped(*args, **kwargs):
            target = args[0]
            ours = (name == "rename" or (name == "open" and str(target).endswith(".tmp"))
                    or (name != "open" and target in tmp_fds))
            if ours and name == step:
                os.kill(os.getpid(), signal.SIGKILL)
            result = real[name](*args, **kwargs)
            if name == "open" and ours:
                tmp_fds.add(result)
            if ours and name + "-after" == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        return wrapped
    for name in real:
        setattr(_store_write.os, name, hook(name))
    _store_write.write_store_bytes(path, open(sys.argv[4], "rb").read())
    sys.exit(3)  # not reached
elif mode == "race":
    # Wait for the starting gun, then record our failures one by one.
    gun = sys.argv[4]
    while not os.path.exists(gun):
        pass
    for n in range(int(sys.argv[5])):
        def mutate(store, n=n):
            return store.report_failure("0000:e3:00.4", "%s-%d" % (arg, n), "", 1000)
        assert _store_write.update_store(path, mutate).result == "recorded"
'''


@pytest.fixture
def worker(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = IMPORT_ROOT + os.pathsep + env.get("PYTHONPATH", "")

    def start(*args, **kwargs):
        return subprocess.Popen([sys.executable, str(script)] + [str(a) for a in args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    return start


def assert_whole_store(path):
    """The file is a complete store hypeman loads, in hypeman's exact form."""
    with open(path, "rb") as handle:
        data = handle.read()
    store = _store.parse_store_bytes(path, data)
    assert store.valid, (store.error, data[-200:])
    assert store.to_bytes() == data
    return store


def test_sigkill_at_random_moments_never_leaves_a_partial_store(tmp_path, worker):
    path = str(tmp_path / "data" / "gpu" / "vf-health.json")
    rng = random.Random(20260820)
    previous = -1
    kills = 0
    for round_number in range(30):
        proc = worker(path, "loop", "r%d" % round_number)
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
        kills += 1
        if not os.path.exists(path):
            assert previous == -1  # killed before its very first rename
            continue
        count = len(assert_whole_store(path).records)
        assert count >= previous  # old or new, never older, never partial
        previous = count
    assert kills == 30 and previous > 0


@pytest.mark.parametrize("step", ["open", "open-after", "write", "write-after", "fsync", "fsync-after",
                                  "close-after", "rename", "rename-after"])
def test_sigkill_at_each_write_step_leaves_old_or_new(tmp_path, worker, step):
    path = str(tmp_path / "gpu" / "vf-health.json")
    old = _store.HealthStore(path)
    old.quarantine("0000:82:00.5")
    new = old.copy()
    new.quarantine("0000:82:00.4")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as handle:
        handle.write(old.to_bytes())
    new_file = tmp_path / "new.json"
    new_file.write_bytes(new.to_bytes())
    proc = worker(path, "die-at", step, str(new_file))
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    with open(path, "rb") as handle:
        data = handle.read()
    expected = new.to_bytes() if step == "rename-after" else old.to_bytes()
    assert data == expected
    assert_whole_store(path)
    # A later writer copes with whatever tmp file the killed one left behind.
    assert _store_write.update_store(path, lambda store: store.quarantine("0000:82:00.6")).changed
    assert "0000:82:00.6" in assert_whole_store(path).quarantined()


def test_parallel_writers_lose_no_failure(tmp_path, worker):
    path = str(tmp_path / "data" / "gpu" / "vf-health.json")
    gun = str(tmp_path / "go")
    writers, reports = 6, 8
    procs = [worker(path, "race", "w%d" % index, gun, reports) for index in range(writers)]
    time.sleep(0.5)  # let every process reach the starting line
    open(gun, "w").close()
    for proc in procs:
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    store = assert_whole_store(path)
    got = sorted(f.instance_id for f in store.records["0000:e3:00.4"].failures)
    assert got == sorted("w%d-%d" % (w, n) for w in range(writers) for n in range(reports))
    assert not os.path.exists(path + ".tmp")
