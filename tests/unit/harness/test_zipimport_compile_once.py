# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The integration phases' zipimport patch (tests/harness): fewer compiles, the same behaviour.

Each case runs a fresh interpreter without site-packages (``-S``: no ``.pth``
of the test venvs) that loads the patch by path or not, imports from a zip
file laid out like an AnsiballZ payload and reports what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from ansible_collections.hypeman.vgpu.tests.unit.compile_probe import COUNTING_COMPILE

HARNESS = os.path.join(os.path.dirname(__file__), "..", "..", "harness", "zipimport_compile_once.py")
DOUBLE_COMPILE = sys.version_info < (3, 13)  # what the patch removes; its own unit of the control below

PROBE = COUNTING_COMPILE + r'''
import runpy
report = {}
if sys.argv[2]:
    namespace = {"__name__": "zipimport_compile_once", "__file__": sys.argv[2]}
    exec(real_compile(open(sys.argv[2]).read(), sys.argv[2], "exec"), namespace)
    cache = sys.argv[3] or None
    report["installed"] = [namespace["install"](cache_dir=cache), namespace["install"](cache_dir=cache)]
sys.path.insert(0, sys.argv[1])
from pkg import a
report["value"] = a.VALUE
report["file_a"] = a.__file__
report["code_file_a"] = a.fail.__code__.co_filename
report["package"] = sys.modules["pkg"].__path__[0]
try:
    a.fail()
except ValueError:
    report["traceback"] = traceback.format_exc()
try:
    from pkg import missing
except ImportError as err:
    report["missing"] = type(err).__name__
# As AnsiballZ starts a module: runpy finds it (get_filename) and loads it (get_code).
report["main"] = runpy.run_module("pkg.main", run_name="__main__")["RESULT"]
# The payload's files (not the collection's cache helper the patch loads from the file system).
report["compiled"] = {name: count for name, count in compiled.items()
                      if name.endswith(".py") and name != "_payload_loader.py"}
print(json.dumps(report))
'''
SOURCES = {
    "pkg/__init__.py": "PACKAGE = True\n",
    "pkg/a.py": "from pkg import b\nVALUE = b.VALUE + 1\n\n\ndef fail():\n"
                "    raise ValueError('from a')  # the line a traceback shows\n",
    "pkg/b.py": "VALUE = 41\n",
    "pkg/main.py": "from pkg import b\nRESULT = [__name__, b.VALUE]\n",
}
EVERY_FILE = {"__init__.py", "a.py", "b.py", "main.py"}


def _run(tmp_path, harness, cache="", payload_name="payload.zip"):
    payload = str(tmp_path / payload_name)
    with zipfile.ZipFile(payload, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, source in SOURCES.items():
            archive.writestr(name, source)
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, payload, harness, str(cache)], capture_output=True,
                          text=True, check=False, timeout=60,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr
    return payload, json.loads(proc.stdout)


def _same_behaviour(report, plain, payload):
    for key in ("value", "missing", "main"):
        assert report[key] == plain[key], key
    assert report["value"] == 42
    assert report["package"] == os.path.join(payload, "pkg")
    assert report["file_a"] == report["code_file_a"] == os.path.join(payload, "pkg", "a.py")
    assert report["main"] == ["__main__", 41]
    assert report["missing"] == "ImportError"
    assert 'File "%s", line 6, in fail' % os.path.join(payload, "pkg", "a.py") in report["traceback"]
    assert "raise ValueError('from a')  # the line a traceback shows" in report["traceback"]


def test_each_module_is_compiled_once_and_behaves_as_before(tmp_path):
    payload, plain = _run(tmp_path, "")
    _payload, patched = _run(tmp_path, HARNESS)
    if DOUBLE_COMPILE:
        # The control: the double compile this removes. Then the patch, installed once.
        assert plain["compiled"] == {name: 2 for name in EVERY_FILE}
        assert patched["installed"] == [True, False]
        assert patched["compiled"] == {name: 1 for name in EVERY_FILE}
    _same_behaviour(plain, plain, payload)
    _same_behaviour(patched, plain, payload)


@pytest.mark.skipif(not DOUBLE_COMPILE, reason="the patch installs nothing where zipimport compiles once")
def test_a_later_process_loads_the_cached_code_under_its_own_file_names(tmp_path):
    cache = tmp_path / "cache"
    payload, plain = _run(tmp_path, "")
    _first, first = _run(tmp_path, HARNESS, cache, "first.zip")
    assert first["compiled"] == {name: 1 for name in EVERY_FILE}
    assert len(os.listdir(cache)) == 4 and oct(os.stat(cache).st_mode & 0o777) == "0o700"
    # Another payload (another file name, as every AnsiballZ file has), the same sources: no compile.
    later_payload, later = _run(tmp_path, HARNESS, cache, "later.zip")
    assert later["compiled"] == {}
    _same_behaviour(later, plain, later_payload)
    assert payload != later_payload
    # Entries that are not code (cut short, garbage): compiled again and rewritten, never loaded.
    for entry in os.listdir(cache):
        with open(cache / entry, "wb") as handle:
            handle.write(b"\xe3garbage")
    broken_payload, broken = _run(tmp_path, HARNESS, cache, "broken.zip")
    assert broken["compiled"] == {name: 1 for name in EVERY_FILE}
    _same_behaviour(broken, plain, broken_payload)
    assert _run(tmp_path, HARNESS, cache, "again.zip")[1]["compiled"] == {}


@pytest.mark.skipif(not DOUBLE_COMPILE, reason="the patch installs nothing where zipimport compiles once")
@pytest.mark.parametrize("kind", ["others_can_write", "symlink", "file"])
def test_a_cache_directory_others_could_fill_is_not_used(tmp_path, kind):
    cache = tmp_path / "cache"
    if kind == "others_can_write":
        cache.mkdir()
        os.chmod(cache, 0o777)
    elif kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        os.symlink(tmp_path / "elsewhere", cache)
    else:
        cache.write_text("not a directory")
    payload, plain = _run(tmp_path, "")
    for name in ("one.zip", "two.zip"):
        later_payload, report = _run(tmp_path, HARNESS, cache, name)
        assert report["compiled"] == {name: 1 for name in EVERY_FILE}
        _same_behaviour(report, plain, later_payload)
    if kind == "symlink":
        assert os.listdir(tmp_path / "elsewhere") == []
    elif kind == "others_can_write":
        assert os.listdir(cache) == []


def test_the_markers_live_in_the_private_tmp_of_a_test_phase():
    # scripts/bootstrap.sh's .pth and scripts/test.sh name the same file; the cache is beside it.
    namespace = {}
    with open(HARNESS, encoding="utf-8") as handle:
        exec(compile(handle.read(), HARNESS, "exec"), namespace)  # pylint: disable=exec-used
    assert os.path.dirname(namespace["MARKER"]) == os.path.dirname(namespace["CODE_CACHE"]) == "/tmp"
    repo = os.path.join(os.path.dirname(HARNESS), "..", "..")
    for script in ("scripts/bootstrap_lib.sh", "scripts/test.sh"):
        with open(os.path.join(repo, script), encoding="utf-8") as handle:
            assert namespace["MARKER"] in handle.read(), script
