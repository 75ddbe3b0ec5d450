# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whole-file reads of small host files (sysfs attributes, /proc entries, metadata), stdlib only.

A placement view reads about a thousand such files on a big host. ``open()``
costs about twice the system calls of this helper (it also stats the file,
asks whether it is a terminal and seeks to find its position) plus a buffered
reader object per file; here a file costs open, read until end, close.
"""

from __future__ import annotations

import os

_CHUNK = 65536


def read_bytes(path):
    """The whole content of ``path`` as bytes; OSError (with the path) like ``open(path, "rb").read()``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            # procfs hands out one page per read: only an empty read means the end.
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError as err:
        # A directory opens fine and fails at read; name the path as open() would.
        raise OSError(err.errno, err.strerror, path) from err
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
