# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fingerprint everything under a directory, to prove a run changed nothing (test equipment).

    python tree_fingerprint.py ROOT            one hash of the whole tree
    python tree_fingerprint.py --entries ROOT  every entry as JSON (diff two to see what changed)

Each entry (links not followed) is its type and mode, plus a file's size and
content hash or a link's target, keyed by its path relative to ROOT.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys


def entries(root):
    """``{relative path: description}`` of every file, link and directory under ``root``."""
    result = {}
    for base, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                result[rel] = "link %s" % os.readlink(path)
            elif stat.S_ISDIR(info.st_mode):
                result[rel] = "dir %o" % stat.S_IMODE(info.st_mode)
            else:
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
                result[rel] = "file %o %d %s" % (stat.S_IMODE(info.st_mode), info.st_size, digest)
    return result


def fingerprint(root):
    """One hash of :func:`entries`."""
    return hashlib.sha256(json.dumps(entries(root), sort_keys=True).encode("utf-8", "surrogateescape")).hexdigest()


def main(argv):
    if argv[:1] == ["--entries"] and len(argv) == 2:
        json.dump(entries(argv[1]), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    elif len(argv) == 1:
        sys.stdout.write(fingerprint(argv[0]) + "\n")
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
