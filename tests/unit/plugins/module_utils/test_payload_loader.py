# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_payload_loader: this collection's helpers, imported from a zip file the way
an AnsiballZ payload ships them, are compiled once each, kept as bytecode for
later processes, and behave like zipimport's (file name, tracebacks, a missing
helper, names outside the package); outside a zip file it installs nothing.
The bytecode cache uses only a private directory and private regular files of
the process's user; anything else in its place is compiled around, never run.

The payload cases run in a fresh interpreter, so the zip file's modules are
the only ones of the package that exist there.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import zipfile

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader
from ansible_collections.hypeman.vgpu.tests.unit.compile_probe import COUNTING_COMPILE
from ansible_collections.hypeman.vgpu.tests.unit.hostile import hang_detector, replace_with

PACKAGE = "ansible_collections.hypeman.vgpu.plugins.module_utils"
PACKAGE_DIR = PACKAGE.replace(".", "/")

HELPER_A = '''
from ansible_collections.hypeman.vgpu.plugins.module_utils import _helper_b

VALUE = _helper_b.VALUE + 1


def fail():
    raise ValueError("from helper a")  # the line a traceback shows
'''
HELPER_B = "VALUE = 41\n"

# Runs inside the payload's interpreter, counting compiles, then reports what it saw as JSON.
PROBE = COUNTING_COMPILE + r'''
sys.path.insert(0, sys.argv[1])
use_loader = sys.argv[2] == "loader"
report = {}
if use_loader:
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader
    report["installed"] = [type(f).__name__ for f in sys.meta_path].count("PayloadHelperFinder")
from ansible_collections.hypeman.vgpu.plugins.module_utils import _helper_a
report["value"] = _helper_a.VALUE
report["file_a"] = _helper_a.__file__
report["code_file_a"] = _helper_a.fail.__code__.co_filename
try:
    _helper_a.fail()
except ValueError:
    report["traceback"] = traceback.format_exc()
try:
    from ansible_collections.hypeman.vgpu.plugins.module_utils import _not_shipped
except ImportError as err:
    report["missing"] = type(err).__name__
import json as json_again  # a standard-library name: not the finder's
report["stdlib"] = json_again.__name__
report["compiled"] = dict(compiled)
print(json.dumps(report))
'''


def _payload(tmp_path, name="payload.zip", helper_b=HELPER_B):
    path = str(tmp_path / name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in ("ansible_collections", "ansible_collections/hypeman", "ansible_collections/hypeman/vgpu",
                        "ansible_collections/hypeman/vgpu/plugins", PACKAGE_DIR):
            archive.writestr(package + "/__init__.py", b"")
        with open(_payload_loader.__file__, "rb") as handle:
            archive.writestr(PACKAGE_DIR + "/_payload_loader.py", handle.read())
        archive.writestr(PACKAGE_DIR + "/_helper_a.py", HELPER_A)
        archive.writestr(PACKAGE_DIR + "/_helper_b.py", helper_b)
    return path


def _run(tmp_path, mode, cache="off", name="payload.zip", helper_b=HELPER_B, dont_write=False):
    payload = _payload(tmp_path, name, helper_b)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home"), _payload_loader.CACHE_ENV: str(cache)}
    if dont_write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run([sys.executable, "-c", PROBE, payload, mode], capture_output=True, text=True,
                          check=False, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return payload, json.loads(proc.stdout)


def _helpers_compiled(report):
    return dict((name, count) for name, count in report["compiled"].items() if name.startswith("_helper_"))


def _behaves_as_zipimport(payload, report):
    assert report["value"] == 42
    # The file name zipimport gives, so tracebacks and coverage name the same file.
    assert report["file_a"] == report["code_file_a"] == os.path.join(payload, PACKAGE_DIR, "_helper_a.py")
    assert 'File "%s", line 8, in fail' % os.path.join(payload, PACKAGE_DIR, "_helper_a.py") in report["traceback"]
    assert 'raise ValueError("from helper a")  # the line a traceback shows' in report["traceback"]
    assert report["missing"] == "ImportError"
    assert report["stdlib"] == "json"


def test_helpers_from_a_payload_are_compiled_once_and_behave_as_zipimport_would(tmp_path):
    payload, report = _run(tmp_path, "loader")
    assert report["installed"] == 1
    assert report["value"] == 42
    assert report["compiled"]["_helper_a.py"] == 1
    assert report["compiled"]["_helper_b.py"] == 1
    # The file name zipimport gives, so tracebacks and coverage name the same file.
    assert report["file_a"] == os.path.join(payload, PACKAGE_DIR, "_helper_a.py")
    assert 'raise ValueError("from helper a")  # the line a traceback shows' in report["traceback"]
    assert report["missing"] == "ImportError"
    assert report["stdlib"] == "json"


def test_without_the_loader_zipimport_is_what_the_helpers_get(tmp_path):
    # The control: the same payload without the loader still works, compiled by
    # zipimport (twice per helper on Python 3.11 and 3.12, the reason for the loader).
    payload, report = _run(tmp_path, "plain")
    assert report["value"] == 42
    assert report["compiled"]["_helper_a.py"] >= 1
    if sys.version_info < (3, 13):
        assert report["compiled"]["_helper_a.py"] == 2
    assert report["file_a"] == os.path.join(payload, PACKAGE_DIR, "_helper_a.py")
    assert 'raise ValueError("from helper a")' in report["traceback"]
    assert report["missing"] == "ImportError"


def test_outside_a_payload_nothing_is_installed():
    # Loaded from the file system here (unit tests, the controller): no finder.
    assert _payload_loader.install() is False
    assert not any(isinstance(finder, _payload_loader.PayloadHelperFinder) for finder in sys.meta_path)


def test_the_finder_serves_only_this_package():
    finder = _payload_loader.PayloadHelperFinder()
    assert finder.find_spec("json", None) is None
    assert finder.find_spec("ansible.module_utils.basic", ["/nonexistent.zip/ansible/module_utils"]) is None
    assert finder.find_spec(PACKAGE + "._errors", None) is None
    # A path entry that is no zip file: left to the standard finders.
    assert finder.find_spec(PACKAGE + "._errors", [os.path.dirname(_payload_loader.__file__)]) is None


# The bytecode cache: later processes load what the first compiled.

def _entries(cache):
    return sorted(os.listdir(cache)) if os.path.isdir(cache) else []


def test_a_later_payload_loads_the_kept_bytecode_under_its_own_file_names(tmp_path):
    cache = tmp_path / "cache"
    first_payload, first = _run(tmp_path, "loader", cache, "first.zip")
    assert _helpers_compiled(first) == {"_helper_a.py": 1, "_helper_b.py": 1}
    _behaves_as_zipimport(first_payload, first)
    entries = _entries(cache)
    assert [entry.split(".")[0] for entry in entries] == ["_helper_a", "_helper_b"]
    assert oct(os.stat(cache).st_mode & 0o777) == "0o700"
    assert all(oct(os.stat(cache / entry).st_mode & 0o777) == "0o600" for entry in entries)
    # Another payload file (every AnsiballZ run has its own), the same sources: nothing compiled.
    later_payload, later = _run(tmp_path, "loader", cache, "later.zip")
    assert _helpers_compiled(later) == {}
    _behaves_as_zipimport(later_payload, later)
    assert _entries(cache) == entries


def test_a_new_source_replaces_the_helpers_old_entry(tmp_path):
    cache = tmp_path / "cache"
    _run(tmp_path, "loader", cache, "old.zip")
    old = _entries(cache)
    # Another collection version: _helper_b changed, _helper_a did not.
    payload, report = _run(tmp_path, "loader", cache, "new.zip", helper_b="VALUE = 40\n")
    assert _helpers_compiled(report) == {"_helper_b.py": 1}
    assert report["value"] == 41
    new = _entries(cache)
    assert len(new) == 2 and new[0] == old[0] and new[1] != old[1]  # one entry per helper
    assert _run(tmp_path, "loader", cache, "again.zip", helper_b="VALUE = 40\n")[1]["value"] == 41


@pytest.mark.parametrize("setting", ["off", "relative/dir", "dont_write"])
def test_a_cache_turned_off_or_read_only_writes_nothing(tmp_path, setting):
    cache = tmp_path / "cache"
    for name in ("one.zip", "two.zip"):
        payload, report = _run(tmp_path, "loader", cache if setting == "dont_write" else setting, name,
                               dont_write=setting == "dont_write")
        assert _helpers_compiled(report) == {"_helper_a.py": 1, "_helper_b.py": 1}
        _behaves_as_zipimport(payload, report)
    assert not os.path.exists(cache) and not os.path.exists(tmp_path / "home")


def test_pythondontwritebytecode_still_reads_what_is_kept(tmp_path):
    cache = tmp_path / "cache"
    _run(tmp_path, "loader", cache, "first.zip")
    payload, report = _run(tmp_path, "loader", cache, "later.zip", dont_write=True)
    assert _helpers_compiled(report) == {}
    _behaves_as_zipimport(payload, report)


def test_the_default_cache_is_in_the_users_own_home_not_home_from_the_environment(monkeypatch):
    import pwd  # pylint: disable=import-outside-toplevel
    monkeypatch.delenv(_payload_loader.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent/kept-by-sudo")
    expected = os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "hypeman-vgpu", "bytecode")
    assert _payload_loader.default_cache_dir() == expected
    monkeypatch.setenv(_payload_loader.CACHE_ENV, "/srv/cache")
    assert _payload_loader.default_cache_dir() == "/srv/cache"
    for value in ("off", "", "cache", "./cache"):
        monkeypatch.setenv(_payload_loader.CACHE_ENV, value)
        assert _payload_loader.default_cache_dir() is None, value


# A cache someone else could fill: never used, never written through.

SOURCE = b"VALUE = 7\n\n\ndef where():\n    raise KeyError('here')\n"


def _load(cache_dir, filename="/payload.zip/pkg/_helper.py"):
    """What a helper gets through the cache: its namespace after running the code, and whether it compiled."""
    compiled = []

    def compile_counted(name, source):
        compiled.append(name)
        return _payload_loader.compile_helper(name, source)

    with hang_detector(10, "loading through the cache"):
        cache = _payload_loader.BytecodeCache(str(cache_dir), write=True)
        code = cache.code("_helper", SOURCE, filename, compile_counted)
    namespace = {}
    exec(code, namespace)  # pylint: disable=exec-used
    assert namespace["VALUE"] == 7 and namespace["where"].__code__.co_filename == filename
    return bool(compiled)


def _entry(cache_dir):
    return os.path.join(str(cache_dir), _payload_loader.BytecodeCache.entry_name("_helper", SOURCE))


OTHER_CODE = marshal.dumps(compile("VALUE = 666\n", "/elsewhere.py", "exec"))


@pytest.mark.parametrize("kind", ["others_can_write", "symlink", "file", "fifo", "other_owner"])
def test_a_cache_directory_others_could_fill_is_not_used(tmp_path, kind):
    cache = tmp_path / "cache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    # Each holds what would be a valid entry with other code: it must never run.
    with open(_entry(elsewhere), "wb") as handle:
        handle.write(OTHER_CODE)
    if kind == "others_can_write":
        cache.mkdir()
        os.chmod(cache, 0o777)
        with open(_entry(cache), "wb") as handle:
            handle.write(OTHER_CODE)
    elif kind == "symlink":
        os.symlink(elsewhere, cache)
    elif kind == "other_owner":
        if os.geteuid() != 0:
            pytest.skip("making a directory of another user needs root (CI runs as root)")
        os.chown(elsewhere, 1, 1)
        cache = elsewhere
    else:
        replace_with(str(cache), kind)
    before = _entries(elsewhere)
    assert _load(cache) and _load(cache)  # compiled each time: the cache is not used
    assert _entries(elsewhere) == before
    if kind == "others_can_write":
        assert _entries(cache) == [os.path.basename(_entry(cache))]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dir", "others_can_write", "other_owner", "huge"])
def test_an_entry_that_is_not_a_private_regular_file_is_compiled_around(tmp_path, kind):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    entry = _entry(cache)
    target = tmp_path / "code"
    target.write_bytes(OTHER_CODE)
    if kind == "symlink":
        os.symlink(target, entry)
    elif kind in ("fifo", "dir"):
        replace_with(entry, kind)
    else:
        with open(entry, "wb") as handle:
            handle.write(OTHER_CODE)
        if kind == "others_can_write":
            os.chmod(entry, 0o666)
        elif kind == "other_owner":
            if os.geteuid() != 0:
                pytest.skip("making a file of another user needs root (CI runs as root)")
            os.chown(entry, 1, 1)
        else:
            with open(entry, "ab") as handle:
                handle.truncate(_payload_loader.ENTRY_MAX_BYTES + 1)
    assert _load(cache)
    if kind != "dir":
        # Replaced by what the source compiles to (a rename over the entry, never a write through it).
        assert not os.path.islink(entry) and os.stat(entry).st_uid == os.geteuid()
        assert not _load(cache)
    assert target.read_bytes() == OTHER_CODE


@settings(max_examples=150, deadline=None)
@given(garbage=st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: OTHER_CODE[:len(b)] + b),
                         st.sampled_from([marshal.dumps(42), marshal.dumps([OTHER_CODE]), b"\xe3" * 40])))
def test_whatever_bytes_an_entry_holds_the_helper_gets_its_own_code(tmp_path_factory, garbage):
    cache = tmp_path_factory.mktemp("cache")
    os.chmod(cache, 0o700)
    with open(_entry(cache), "wb") as handle:
        handle.write(garbage)
    # A cut-short or garbled entry (a killed writer, a bad disk) is compiled again and rewritten whole.
    assert _load(cache)
    assert not _load(cache)


def test_a_killed_writers_partial_file_is_never_loaded_and_is_cleared(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    partial = _entry(cache) + ".99999.partial"
    with open(partial, "wb") as handle:
        handle.write(OTHER_CODE[:20])
    assert _load(cache)
    assert _entries(cache) == [os.path.basename(_entry(cache))]


def test_concurrent_first_runs_all_get_their_code_and_leave_one_entry_each(tmp_path):
    cache = tmp_path / "cache"
    payloads = [_payload(tmp_path, "run%d.zip" % index) for index in range(6)]
    env = {"PATH": os.environ.get("PATH", ""), _payload_loader.CACHE_ENV: str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", PROBE, payload, "loader"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for payload in payloads]
    for payload, proc in zip(payloads, procs):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        _behaves_as_zipimport(payload, json.loads(out))
    assert [entry.split(".")[0] for entry in _entries(cache)] == ["_helper_a", "_helper_b"]
    payload, report = _run(tmp_path, "loader", cache, "after.zip")
    assert _helpers_compiled(report) == {}
