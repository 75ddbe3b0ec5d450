# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print one hash of everything under a directory: paths, link targets, file contents (test equipment)."""

from __future__ import annotations

import hashlib
import os
import sys


def fingerprint(root):
    digest = hashlib.sha256()
    for base, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            digest.update(path.encode("utf-8", "surrogateescape"))
            if os.path.islink(path):
                digest.update(b"->" + os.readlink(path).encode("utf-8", "surrogateescape"))
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


if __name__ == "__main__":
    sys.stdout.write(fingerprint(sys.argv[1]) + "\n")
