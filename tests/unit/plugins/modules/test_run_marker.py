# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""run_marker: the roles' markers under state_dir, written under the lock with the durable procedure."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket

import pytest
from hypothesis import given, strategies as st

from ansible_collections.hypeman.vgpu.plugins.module_utils import _marker, _safedir
from ansible_collections.hypeman.vgpu.plugins.modules import run_marker
from ansible_collections.hypeman.vgpu.tests.unit.hostile import (
    hang_detector, property_settings, replace_with, tree_fingerprint)
from ansible.module_utils.testing import patch_module_args

GPU_MARKER = "recovery/0000:82:00.0.json"
NAMES = [GPU_MARKER, "dcgm-quiesce.json", "store-edit/hypeman.stopped"]


def run(state_dir, _capsys, check=False, diff=True, **args):
    """The result of run_marker on ``args`` (stdout captured here: hypothesis reruns share no fixture)."""
    params = {"state_dir": str(state_dir), "_ansible_check_mode": check, "_ansible_diff": diff}
    params.update(args)
    out = io.StringIO()
    with hang_detector(20, "run_marker"), patch_module_args(params), contextlib.redirect_stdout(out):
        with pytest.raises(SystemExit):
            run_marker.main()
    return json.loads(out.getvalue())


def to_nice_json(content):
    """What the roles wrote with ansible.builtin.copy and to_nice_json before this module."""
    return json.dumps(content, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


@pytest.mark.parametrize("name", NAMES)
def test_check_apply_again_check_absent(tmp_path, capsys, name):
    state_dir = tmp_path / "state"
    content = {"gpu": "0000:82:00.0", "step": "started", "sriov_job": None, "units": ["a.service"]}
    path = state_dir / name

    result = run(state_dir, capsys, check=True, name=name, content=content)
    assert result["changed"] is True and result["previous"] is None and result["content"] == content
    assert result["diff"]["before"] == "" and result["diff"]["after"] == to_nice_json(content)
    assert not state_dir.exists(), "check mode created something"

    result = run(state_dir, capsys, name=name, content=content)
    assert result["changed"] is True and result["exists"] is True and result["path"] == str(path)
    assert path.read_text() == to_nice_json(content)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert oct(state_dir.stat().st_mode & 0o777) == oct(0o700)

    for check in (False, True):
        result = run(state_dir, capsys, check=check, name=name, content=content)
        assert result["changed"] is False and result["previous"] == content and result["content"] == content

    result = run(state_dir, capsys, name=name, state="read")
    assert result["changed"] is False and result["content"] == content and result["exists"] is True

    moved = dict(content, step="drained")
    result = run(state_dir, capsys, name=name, content=moved)
    assert result["changed"] is True and result["previous"] == content and result["content"] == moved
    assert json.loads(path.read_text()) == moved

    result = run(state_dir, capsys, check=True, name=name, state="absent")
    assert result["changed"] is True and result["exists"] is False and path.exists()
    assert result["diff"]["after"] == "" and json.loads(result["diff"]["before"]) == moved
    result = run(state_dir, capsys, name=name, state="absent")
    assert result["changed"] is True and result["previous"] == moved and not path.exists()
    for check in (False, True):
        result = run(state_dir, capsys, check=check, name=name, state="absent")
        assert result["changed"] is False and result["previous"] is None
    result = run(state_dir, capsys, name=name, state="read")
    assert result["content"] is None and result["exists"] is False


def test_marker_written_by_copy_is_unchanged(tmp_path, capsys):
    # A marker an older version of the roles wrote (copy + to_nice_json) is the same bytes.
    content = {"service": "hypeman", "store": "/var/lib/hypeman/gpu/vf-health.json"}
    (tmp_path / "store-edit").mkdir()
    (tmp_path / "store-edit" / "hypeman.stopped").write_text(to_nice_json(content))
    result = run(tmp_path, capsys, name="store-edit/hypeman.stopped", content=content)
    assert result["changed"] is False and result["previous"] == content


def test_absent_and_read_without_state_dir_create_nothing(tmp_path, capsys):
    state_dir = tmp_path / "missing"
    for state in ("absent", "read"):
        result = run(state_dir, capsys, name=GPU_MARKER, state=state)
        assert result["changed"] is False and result["content"] is None
    assert not state_dir.exists()


def test_stale_temp_of_a_killed_run_is_replaced(tmp_path, capsys):
    (tmp_path / "recovery").mkdir()
    (tmp_path / "recovery" / ".0000:82:00.0.json.tmp").write_text("{\"half")
    result = run(tmp_path, capsys, name=GPU_MARKER, content={"step": "started"})
    assert result["changed"] is True
    assert sorted(os.listdir(tmp_path / "recovery")) == ["0000:82:00.0.json"]


def test_lock_held_by_another_run_fails_cleanly(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_safedir, "LOCK_TIMEOUT", 0.2)
    dir_fd = os.open(str(tmp_path), os.O_RDONLY)
    try:
        held, _info = _safedir.open_locked(dir_fd, _marker.LOCK_NAME, str(tmp_path / _marker.LOCK_NAME), 0o600)
        try:
            before = tree_fingerprint(tmp_path)
            result = run(tmp_path, capsys, name="dcgm-quiesce.json", content={"units": []})
            assert result["failed"] is True and "cannot lock markers with" in result["msg"]
            assert tree_fingerprint(tmp_path) == before
        finally:
            os.close(held)
    finally:
        os.close(dir_fd)


def test_bad_arguments(tmp_path, capsys):
    result = run(tmp_path, capsys, name=GPU_MARKER)
    assert result["failed"] is True and "state=present needs content" in result["msg"]
    result = run(tmp_path, capsys, name=GPU_MARKER, state="absent", content={"a": 1})
    assert result["failed"] is True and "content is given with state=absent" in result["msg"]
    result = run(tmp_path, capsys, name=GPU_MARKER, state="read", content={"a": 1})
    assert result["failed"] is True and "content is given with state=read" in result["msg"]
    result = run(tmp_path, capsys, name="ledger.jsonl", content={"a": 1})
    assert result["failed"] is True and "'ledger.jsonl' is not a marker name" in result["msg"]
    result = run("relative/dir", capsys, name=GPU_MARKER, content={"a": 1})
    assert result["failed"] is True and "state_dir" in result["msg"] and "relative" in result["msg"]
    assert os.listdir(tmp_path) == []


# Kinds of file a hostile host may put where the marker, its directory or the state dir should be.
HOSTILE = ["fifo", "dir", "symlink", "dangling", "socket", "garbage", "not_object", "non_utf8", "deep", "huge"]


def put_hostile(path, kind, outside):
    if kind == "socket":
        replace_with(str(path), "missing")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "symlink":
        replace_with(str(path), "symlink", str(outside))
    elif kind in ("fifo", "dir", "dangling"):
        replace_with(str(path), kind)
    else:
        data = {"garbage": b"{\"step\": \"drai", "not_object": b"[1, 2]\n", "non_utf8": b"{\"a\": \"\xff\"}",
                "deep": b"[" * 100000 + b"]" * 100000, "huge": b"{\"a\": \"" + b"x" * (70 * 1024) + b"\"}"}[kind]
        replace_with(str(path), "file", data)


@pytest.mark.parametrize("place", ["marker", "marker_dir", "state_dir"])
@pytest.mark.parametrize("state", ["present", "absent", "read"])
@given(kind=st.sampled_from(HOSTILE))
@property_settings(20)
def test_hostile_marker_fails_cleanly_and_changes_nothing(tmp_path_factory, place, state, kind):
    root = tmp_path_factory.mktemp("hostile")
    outside = root / "outside"
    outside.mkdir()
    (outside / "0000:82:00.0.json").write_text("{}\n")
    state_dir = root / "state"
    (state_dir / "recovery").mkdir(parents=True)
    target = {"marker": state_dir / GPU_MARKER, "marker_dir": state_dir / "recovery", "state_dir": state_dir}[place]
    if place != "marker" and kind not in ("fifo", "dir", "symlink", "dangling", "socket", "garbage"):
        kind = "garbage"  # a directory path holding a file of any content is the same case
    if place != "marker" and kind == "dir":
        kind = "dangling"
    put_hostile(target, kind, outside)
    before = tree_fingerprint(root)
    args = {"content": {"step": "drained"}} if state == "present" else {}
    result = run(state_dir, None, name=GPU_MARKER, state=state, **args)
    assert result.get("failed") is True, result
    assert str(state_dir) in result["msg"] and "Traceback" not in result["msg"]
    assert tree_fingerprint(root) == before


NAME_CHARS = st.characters(codec="utf-8", exclude_characters="\x00")


@given(name=st.one_of(
    st.text(NAME_CHARS, max_size=40),
    st.sampled_from(["../ledger.jsonl", "recovery/../x.json", "recovery/..json", "recovery/.json",
                     "store-edit/.stopped", "store-edit/../../etc.stopped", "/etc/passwd", "recovery/a/b.json",
                     "dcgm-quiesce.json/", "recovery/0000:82:00.0.json\n", "sentinel/x.json"]),
    st.builds(lambda a, b: a + "/" + b, st.sampled_from(["recovery", "store-edit", "..", ""]),
              st.text(NAME_CHARS, max_size=30))))
@property_settings(60)
def test_malformed_names_fail_cleanly(tmp_path_factory, name):
    root = tmp_path_factory.mktemp("names")
    before = tree_fingerprint(root)
    result = run(root, None, name=name, content={"a": 1})
    if _marker.name_problem(name) is None:
        assert result.get("changed") is True  # a valid name (say recovery/0.json) is written
        assert os.path.realpath(result["path"]).startswith(str(root) + "/")
        return
    assert result.get("failed") is True and "Traceback" not in result["msg"]
    assert tree_fingerprint(root) == before


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
CONTENT = st.dictionaries(st.text(max_size=10),
                          st.recursive(JSON_LEAF, lambda kids: st.lists(kids, max_size=4)
                                       | st.dictionaries(st.text(max_size=5), kids, max_size=4), max_leaves=20),
                          max_size=6)


@given(content=CONTENT)
@property_settings(60)
def test_any_content_round_trips_or_fails_cleanly(tmp_path_factory, content):
    root = tmp_path_factory.mktemp("content")
    before = tree_fingerprint(root)
    result = run(root, None, name="dcgm-quiesce.json", content=content)
    if result.get("failed"):
        # NaN and infinities are not JSON: refused, naming the file, nothing written.
        assert "cannot be written as JSON" in result["msg"] and str(root) in result["msg"]
        assert tree_fingerprint(root) == before
        return
    written = json.loads((root / "dcgm-quiesce.json").read_text())
    assert written == result["content"]
    again = run(root, None, name="dcgm-quiesce.json", content=content)
    assert again["changed"] is False


def test_huge_and_deep_content_refused(tmp_path, capsys):
    result = run(tmp_path, capsys, name="dcgm-quiesce.json", content={"a": "x" * (70 * 1024)})
    assert result["failed"] is True and "expected at most 65536" in result["msg"]
    assert os.listdir(tmp_path) == []
