# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_fileio.read_bytes: whole regular files, read to the end; hostile files fail at once with the path."""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import HostFileError, read_bytes


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
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    before = len(os.listdir("/proc/self/fd"))
    for _attempt in range(20):
        for path, limit in ((str(tmp_path), 10), (fifo, 10), (str(big), 10)):
            with pytest.raises(OSError):
                read_bytes(path, limit)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_fifo_is_refused_without_blocking(tmp_path):
    # No writer ever opens it: a blocking open or read would hang the test.
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    with pytest.raises(HostFileError) as err:
        read_bytes(fifo)
    assert err.value.filename == fifo and "a FIFO, not a regular file" in err.value.strerror


def test_an_endless_device_is_refused_before_reading():
    with pytest.raises(HostFileError) as err:
        read_bytes("/dev/zero")
    assert "a character device" in err.value.strerror


@pytest.mark.parametrize("size, ok", [(99, True), (100, True), (101, False), (200000, False)])
def test_the_size_cap_is_exact(tmp_path, size, ok):
    path = tmp_path / "f"
    path.write_bytes(b"y" * size)
    if ok:
        assert len(read_bytes(str(path), limit=100)) == size
    else:
        with pytest.raises(HostFileError) as err:
            read_bytes(str(path), limit=100)
        assert err.value.errno == errno.EFBIG and "larger than 100 bytes" in err.value.strerror


def test_a_symlink_is_followed_unless_refused(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"data")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert read_bytes(str(link)) == b"data"
    with pytest.raises(HostFileError) as err:
        read_bytes(str(link), follow=False)
    assert err.value.errno == errno.ELOOP and "symlink" in err.value.strerror


def test_a_dangling_symlink_reads_as_missing(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):
        read_bytes(str(link))
