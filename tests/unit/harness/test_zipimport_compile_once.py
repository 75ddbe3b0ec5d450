# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The integration phases' zipimport patch (tests/harness): one compile per module, same behaviour.

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

HARNESS = os.path.join(os.path.dirname(__file__), "..", "..", "harness", "zipimport_compile_once.py")

PROBE = r'''
import builtins, collections, json, runpy, sys, traceback
compiled = collections.Counter()
real_compile = builtins.compile
def counting_compile(source, filename, *args, **kwargs):
    compiled[str(filename).rsplit("/", 1)[-1]] += 1
    return real_compile(source, filename, *args, **kwargs)
builtins.compile = counting_compile
report = {}
if sys.argv[2]:
    namespace = {"__name__": "zipimport_compile_once"}
    exec(real_compile(open(sys.argv[2]).read(), sys.argv[2], "exec"), namespace)
    report["installed"] = [namespace["install"](), namespace["install"]()]
sys.path.insert(0, sys.argv[1])
from pkg import a
report["value"] = a.VALUE
report["file_a"] = a.__file__
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
report["compiled"] = {name: count for name, count in compiled.items() if name.endswith(".py")}
print(json.dumps(report))
'''


def _run(tmp_path, harness):
    payload = str(tmp_path / "payload.zip")
    with zipfile.ZipFile(payload, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/__init__.py", "PACKAGE = True\n")
        archive.writestr("pkg/a.py", "from pkg import b\nVALUE = b.VALUE + 1\n\n\ndef fail():\n"
                                     "    raise ValueError('from a')  # the line a traceback shows\n")
        archive.writestr("pkg/b.py", "VALUE = 41\n")
        archive.writestr("pkg/main.py", "from pkg import b\nRESULT = [__name__, b.VALUE]\n")
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, payload, harness], capture_output=True, text=True,
                          check=False, env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"},
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return payload, json.loads(proc.stdout)


def test_each_module_is_compiled_once_and_behaves_as_before(tmp_path):
    payload, patched = _run(tmp_path, HARNESS)
    _payload, plain = _run(tmp_path, "")
    if sys.version_info < (3, 13):
        # The double compile this removes (the control), then the patch installed once.
        assert plain["compiled"] == {"__init__.py": 2, "a.py": 2, "b.py": 2, "main.py": 2}
        assert patched["installed"] == [True, False]
        assert patched["compiled"] == {"__init__.py": 1, "a.py": 1, "b.py": 1, "main.py": 1}
    # Whatever the Python: what the modules do and are is unchanged.
    for key in ("value", "file_a", "package", "missing", "main"):
        assert patched[key] == plain[key], key
    assert patched["value"] == 42
    assert patched["file_a"] == os.path.join(payload, "pkg", "a.py")
    assert patched["main"] == ["__main__", 41]
    assert patched["missing"] == "ImportError"
    assert "raise ValueError('from a')  # the line a traceback shows" in patched["traceback"]


def test_the_marker_lives_in_the_private_tmp_of_a_test_phase():
    # scripts/bootstrap.sh's .pth and scripts/test.sh name the same file.
    namespace = {}
    with open(HARNESS, encoding="utf-8") as handle:
        exec(compile(handle.read(), HARNESS, "exec"), namespace)  # pylint: disable=exec-used
    repo = os.path.join(os.path.dirname(HARNESS), "..", "..")
    for script in ("scripts/bootstrap_lib.sh", "scripts/test.sh"):
        with open(os.path.join(repo, script), encoding="utf-8") as handle:
            assert namespace["MARKER"] in handle.read(), script
