# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_payload_loader: this collection's helpers, imported from a zip file the way
an AnsiballZ payload ships them, are compiled once each and behave like
zipimport's (file name, tracebacks, a missing helper, names outside the
package); outside a zip file it installs nothing.

Each case runs in a fresh interpreter, so the zip file's modules are the only
ones of the package that exist there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader
from ansible_collections.hypeman.vgpu.tests.unit.compile_probe import COUNTING_COMPILE

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


def _payload(tmp_path):
    path = str(tmp_path / "payload.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in ("ansible_collections", "ansible_collections/hypeman", "ansible_collections/hypeman/vgpu",
                        "ansible_collections/hypeman/vgpu/plugins", PACKAGE_DIR):
            archive.writestr(package + "/__init__.py", b"")
        with open(_payload_loader.__file__, "rb") as handle:
            archive.writestr(PACKAGE_DIR + "/_payload_loader.py", handle.read())
        archive.writestr(PACKAGE_DIR + "/_helper_a.py", HELPER_A)
        archive.writestr(PACKAGE_DIR + "/_helper_b.py", HELPER_B)
    return path


def _run(tmp_path, mode):
    payload = _payload(tmp_path)
    proc = subprocess.run([sys.executable, "-c", PROBE, payload, mode], capture_output=True, text=True, check=False,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return payload, json.loads(proc.stdout)


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
