# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""path_access_info: what each path is and what keeps the module's user from it, in one run.

The property test compares the module with what it replaced in the sr_iov_cycle role's preflight:
one ansible.builtin.stat run per path (run here in-process) and the role's Jinja that turned those
results into ``sr_iov_cycle_denied`` (transliterated below), on hostile trees, as root and as nobody.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import tempfile
from contextlib import redirect_stdout

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ansible.module_utils
from ansible.module_utils.testing import patch_module_args

from ansible_collections.hypeman.vgpu.plugins.modules import path_access_info
from ansible_collections.hypeman.vgpu.tests.unit.hostile import property_settings
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module


def _load_builtin_stat():
    """ansible.builtin.stat of the installed ansible-core, loaded from its file.

    ansible-test units gives collection module tests an ``ansible`` package
    holding module_utils only (a link to the real one), so
    ``ansible.modules`` cannot be imported; the file sits beside it.
    """
    lib_root = os.path.dirname(os.path.realpath(ansible.module_utils.__path__[0]))
    spec = importlib.util.spec_from_file_location("_builtin_stat", os.path.join(lib_root, "modules", "stat.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ansible_stat = _load_builtin_stat()

NOBODY = 65534
WRITE_ITEM = {True: dict(type="directory", follow=True, access=["read", "write", "execute"]),
              False: dict(type="file", access=["read", "write"])}


def _call(main, params):
    """Run a module's main() in this process (no pytest capture: also used in a forked child)."""
    out = io.StringIO()
    with patch_module_args(params), redirect_stdout(out):
        try:
            main()
        except SystemExit:
            pass
    return json.loads(out.getvalue())


def old_denied(items):
    """The role's former stat loop and Jinja ``sr_iov_cycle_denied``, for ``[(path, dir)]``."""
    out, bad = [], []
    for path, is_dir in items:
        result = _call(ansible_stat.main, dict(path=path, follow=is_dir, get_checksum=False, get_mime=False,
                                               get_attributes=False))
        if "stat" in result and not result["stat"]["exists"]:
            continue
        if "stat" not in result:
            why = [] if [b for b in bad if b + "/" in path] else ["cannot be looked at: " + result.get("msg", "?")]
        else:
            st_ = result["stat"]
            why = (([] if (st_["isdir"] if is_dir else st_["isreg"]) else
                    ["not a " + ("directory" if is_dir else "regular file")])
                   + ([] if st_["readable"] else ["not readable"]) + ([] if st_["writeable"] else ["not writable"])
                   + (["not searchable"] if is_dir and st_["isdir"] and not st_["executable"] else []))
        if why:
            out.append("%s (%s)" % (path, ", ".join(why)))
            bad.append(path)
    return out


def new_result(items):
    return _call(path_access_info.main, dict(paths=[dict(WRITE_ITEM[is_dir], path=path) for path, is_dir in items]))


def _as_user(uid, func, *args):
    """``func(*args)`` in a forked child running as ``uid``; its JSON-able return value."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            with os.fdopen(write_end, "w") as handle:
                json.dump(func(*args), handle)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as handle:
        text = handle.read()
    _pid, status = os.waitpid(pid, 0)
    assert status == 0 and text, "the child running as uid %d failed" % uid
    return json.loads(text)


KINDS = ("file", "dir", "link_file", "link_dir", "dangling", "loop", "fifo", "file_000", "dir_000", "dir_600",
         "dir_700", "missing")


def _make(path, kind):
    if kind == "missing":
        return
    if kind.startswith("dir"):
        os.mkdir(path)
        for name in ("a", "b"):
            with open(os.path.join(path, name), "w") as handle:
                handle.write("x")
        os.chmod(path, int(kind[4:] or "777", 8))
    elif kind.startswith("file"):
        with open(path, "w") as handle:
            handle.write("x")
        os.chmod(path, int(kind[5:] or "666", 8))
    elif kind == "link_file":
        with open(path + ".target", "w") as handle:
            handle.write("x")
        os.chmod(path + ".target", 0o666)
        os.symlink(path + ".target", path)
    elif kind == "link_dir":
        os.mkdir(path + ".target")
        os.chmod(path + ".target", 0o777)
        os.symlink(path + ".target", path)
    elif kind == "dangling":
        os.symlink(path + ".nowhere", path)
    elif kind == "loop":
        os.symlink(path, path)
    elif kind == "fifo":
        os.mkfifo(path)
        os.chmod(path, 0o666)


@pytest.fixture
def world_dir():
    # Not under pytest's tmp_path: its parents are closed to other users, and nobody must reach the tree.
    root = tempfile.mkdtemp(prefix="path-access-")
    os.chmod(root, 0o755)
    yield root
    for base, dirs, _files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(base, name), 0o755)
    shutil.rmtree(root)


def test_property_matches_the_stat_loop_and_jinja_it_replaced(world_dir):
    counter = [0]

    @property_settings(25)
    @given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4),
           picks=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["", "/a", "/a/b", "/b"]), st.booleans()),
                          min_size=1, max_size=8),
           user=st.sampled_from([0, NOBODY]))
    def check(kinds, picks, user):
        counter[0] += 1
        root = os.path.join(world_dir, str(counter[0]))
        os.mkdir(root)
        os.chmod(root, 0o755)
        for index, kind in enumerate(kinds):
            _make(os.path.join(root, "e%d" % index), kind)
        items = [(os.path.join(root, "e%d" % (index % len(kinds))) + below, is_dir) for index, below, is_dir in picks]
        old = _as_user(user, old_denied, items)
        new = _as_user(user, new_result, items)
        assert new["problems"] == old, (kinds, items)
        assert new["uid"] == user and new["user"] == ("root" if user == 0 else "nobody")
        assert [entry["path"] for entry in new["paths"]] == [path for path, _dir in items]

    # Both sides once in this process first: their lazy imports (ansible's JSON profiles) must
    # happen here; a child running as nobody cannot read ansible-test's private copy of ansible.
    old_denied([(world_dir, True)])
    new_result([(world_dir, True)])
    check()


def test_what_each_path_is(tmp_path, capsys):
    _make(str(tmp_path / "f"), "file")
    _make(str(tmp_path / "d"), "dir")
    _make(str(tmp_path / "l"), "link_file")
    _make(str(tmp_path / "x"), "dangling")
    paths = [dict(path=str(tmp_path / name), follow=follow) for name, follow in
             [("f", False), ("d", False), ("l", False), ("l", True), ("x", True), ("nope", False), ("f/below", False)]]
    result = run_module(path_access_info.main, dict(paths=paths, _ansible_check_mode=True), capsys)
    assert result["changed"] is False and result["problems"] == []
    seen = [(entry["exists"], entry["type"], entry["error"], entry["problems"]) for entry in result["paths"]]
    assert seen == [(True, "file", None, []), (True, "directory", None, []), (True, "link", None, []),
                    (True, "file", None, []), (False, None, None, []), (False, None, None, []),
                    (None, None, "Not a directory", [])]
    assert result["paths"][1]["executable"] is True and result["paths"][0]["executable"] is False


def test_execute_words_and_the_rule_below_a_named_path(tmp_path, capsys):
    _make(str(tmp_path / "f"), "file")
    _make(str(tmp_path / "d"), "dir_600")
    paths = [dict(path=str(tmp_path / "f"), type="any", access=["execute"]),
             dict(path=str(tmp_path / "d"), type="directory", access=["execute"]),
             dict(path=str(tmp_path / "f"), type="directory", access=["execute"]),
             dict(path=str(tmp_path / "f/x"), type="file"),
             dict(path=str(tmp_path / "g/f/x"), type="file")]
    os.makedirs(str(tmp_path / "g"))
    _make(str(tmp_path / "g/f"), "file")
    result = run_module(path_access_info.main, dict(paths=paths), capsys)
    f, d = str(tmp_path / "f"), str(tmp_path / "d")
    # Root searches a directory of any mode; only a file without x bits is not executable to root.
    assert result["problems"] == ["%s (not executable)" % f, "%s (not a directory)" % f,
                                  "%s/x (cannot be looked at: Not a directory)" % str(tmp_path / "g/f")]
    assert result["paths"][1]["problems"] == [] and d


@pytest.mark.parametrize("paths, words", [
    ([{"path": "relative"}], "paths[0].path is a relative path ('relative'); expected an absolute path"),
    ([{"path": "/ok"}, {"path": "/a\x00b"}], "paths[1].path contains a NUL byte at offset 2"),
    ([{"path": "/" + "d/" * 2100}], "paths[0].path is 4201 bytes long"),
    ([{"path": "/var/" + "n" * 256}], "paths[0].path has a name of 256 bytes"),
    ([{"path": "/a", "type": "socket"}], "value of type must be one of: any, file, directory"),
    ([{"path": "/a", "access": ["search"]}], "value of access must be one or more of: read, write, execute"),
    ([{"path": "/a", "mode": 1}], "mode"),
    ([{}], "missing required arguments: path"),
    ("x", "dictionary requested"),
])
def test_bad_arguments_fail_naming_them(paths, words, capsys):
    result = run_module(path_access_info.main, dict(paths=paths), capsys)
    assert result["failed"] is True and words in result["msg"], result
    assert "exception" not in result
