# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_fileio.read_bytes: whole files, read to the end, errors like open() gives them."""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import read_bytes


@pytest.mark.parametrize("content", [b"", b"0\n", bytes(range(256)) * 1000])  # the last spans several reads
def test_reads_the_whole_file(tmp_path, content):
    path = tmp_path / "f"
    path.write_bytes(content)
    assert read_bytes(str(path)) == content


def test_a_directory_fails_at_read_naming_the_path(tmp_path):
    with pytest.raises(IsADirectoryError) as err:
        read_bytes(str(tmp_path))
    assert err.value.errno == errno.EISDIR and err.value.filename == str(tmp_path)
    assert err.value.strerror == "Is a directory"


def test_a_missing_file_fails_like_open(tmp_path):
    path = str(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError) as err:
        read_bytes(path)
    assert err.value.filename == path


def test_the_descriptor_is_closed_on_failure(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    for _attempt in range(20):
        with pytest.raises(OSError):
            read_bytes(str(tmp_path))
    assert len(os.listdir("/proc/self/fd")) == before
