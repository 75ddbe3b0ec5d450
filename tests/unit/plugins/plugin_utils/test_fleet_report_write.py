# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""fleet_report.write_reports: the report files the fleet_report_write action writes on the controller."""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_report as fr


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_missing_directory_is_made_and_every_file_written(tmp_path):
    out = tmp_path / "a" / "reports"
    files = {str(out / "fleet-audit.json"): "{}\n", str(out / "fleet-audit.md"): "# Fleet ünïcode\n"}
    written, unchanged = fr.write_reports(files)
    assert written == sorted(files) and unchanged == []
    for path, text in files.items():
        assert open(path, encoding="utf-8").read() == text and mode(path) == 0o644
    assert mode(str(out)) == 0o755 and mode(str(out.parent)) == 0o755  # exactly, whatever the umask
    assert sorted(os.listdir(str(out))) == ["fleet-audit.json", "fleet-audit.md"]  # no temporary file left


def test_same_bytes_are_not_rewritten_and_different_ones_are(tmp_path):
    same, other = str(tmp_path / "same.json"), str(tmp_path / "other.json")
    fr.write_reports({same: "x\n", other: "old\n"})
    inode = os.stat(same).st_ino
    written, unchanged = fr.write_reports({same: "x\n", other: "new\n"})
    assert (written, unchanged) == ([other], [same])
    assert os.stat(same).st_ino == inode and open(other).read() == "new\n"
    # A longer file that starts with the same bytes is different.
    written, _unchanged = fr.write_reports({other: "ne"})
    assert written == [other] and open(other).read() == "ne"


def test_an_operators_mode_is_kept(tmp_path):
    path = str(tmp_path / "r.html")
    fr.write_reports({path: "<p>\n"})
    os.chmod(path, 0o600)
    assert fr.write_reports({path: "<p>\n"}) == ([], [path])
    assert fr.write_reports({path: "<p>new\n"}) == ([path], [])
    assert mode(path) == 0o600 and open(path).read() == "<p>new\n"


def test_an_existing_directory_keeps_its_mode(tmp_path):
    os.chmod(str(tmp_path), 0o1777)
    fr.write_reports({str(tmp_path / "r.json"): "{}"})
    assert mode(str(tmp_path)) == 0o1777


def test_an_unwritable_place_raises_naming_the_path_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError) as err:
        fr.write_reports({str(blocker / "r.json"): "{}"})
    assert str(blocker) in str(err.value)
    target = tmp_path / "dir-in-the-way"
    target.mkdir()
    with pytest.raises(OSError):
        fr.write_reports({str(target): "{}"})
    assert target.is_dir() and sorted(os.listdir(str(tmp_path))) == ["dir-in-the-way", "file"]  # no temporary file


def test_expired_history_records_are_deleted_only_inside_the_history_directory(tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    old, gone = history / "fleet-audit-20261101T000000Z.json", history / "fleet-audit-20261102T000000Z.json"
    old.write_text("{}")
    assert fr.delete_history_records(str(history), [str(old), str(gone)]) == [str(old)]
    assert not old.exists()
    outside = tmp_path / "fleet-audit.json"
    outside.write_text("{}")
    with pytest.raises(OSError) as err:
        fr.delete_history_records(str(history), [str(history / ".." / "fleet-audit.json")])
    assert "not inside the history directory" in str(err.value) and outside.exists()
    assert fr.delete_history_records(None, [str(outside)]) == [] and outside.exists()
