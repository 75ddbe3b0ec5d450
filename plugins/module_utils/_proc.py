# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Processes on the host, read from a configurable ``proc_root`` (stdlib only)."""

from __future__ import annotations

import errno
import os

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._fileio import read_bytes

# Errors that mean "this process exited while we looked": skip it.
_GONE = (errno.ENOENT, errno.ESRCH)
# The longest number read from /proc (a pid, a start time in ticks, a device minor): 20 digits is 2**64.
_UINT_DIGITS = 20


def read_proc_file(path):
    """A /proc entry's bytes. /proc files are regular: a symlink, FIFO or device is refused, never followed
    or waited on (fd links are read with ``os.readlink`` by their callers, never opened)."""
    return read_bytes(path, follow=False)


_read_proc_file = read_proc_file  # what this file calls: tests replace it to make a process exit mid-scan


def small_uint(text):
    """The value of a decimal number of ASCII digits (at most 20), or None for anything else.

    ``str.isdigit`` accepts superscripts ``int`` refuses, and ``int`` refuses
    numbers of thousands of digits: /proc names and fields go through here.
    """
    if 0 < len(text) <= _UINT_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


def pids(names):
    """The process ids among directory names of /proc, sorted."""
    return sorted(pid for pid in (small_uint(name) for name in names) if pid is not None)


def find_processes(proc_root, names):
    """Processes whose ``comm`` or argv[0] basename is in ``names``.

    Returns ``[{pid, comm, cmdline}]`` sorted by pid (``cmdline`` is the
    arguments joined by spaces). A process that exits during the scan is
    ignored; any other unreadable entry raises VgpuError.
    """
    wanted = set(names)
    try:
        found_pids = pids(os.listdir(proc_root))
    except (IOError, OSError) as err:
        raise VgpuError("cannot list processes in %s: %s" % (proc_root, err.strerror or err))
    found = []
    for pid in found_pids:
        base = os.path.join(proc_root, str(pid))
        try:
            comm = _read_proc_file(os.path.join(base, "comm")).decode("utf-8", "replace").rstrip("\n")
            argv = _read_proc_file(os.path.join(base, "cmdline")).decode("utf-8", "replace").split("\0")
        except (IOError, OSError) as err:
            if err.errno in _GONE:
                continue
            raise VgpuError("cannot read process %s: %s" % (base, err.strerror or err))
        while argv and argv[-1] == "":
            argv.pop()
        argv0 = os.path.basename(argv[0]) if argv else ""
        if comm in wanted or argv0 in wanted:
            found.append({"pid": pid, "comm": comm, "cmdline": " ".join(argv)})
    return found


# --- device holders (who holds GPU device nodes open) ---------------------------
#
# hypeman's in-use check and sriov-manage's "Cannot obtain unbindLock" both come
# down to open file descriptors on /dev/nvidia* and /dev/vfio/*. This scan reads
# every <proc_root>/<pid>/fd link once, like hypeman's openVFIOPaths: a process
# that exits mid-scan holds nothing and is skipped; any other unreadable entry
# fails the scan, because a partial answer could wrongly say "nothing holds it".

_UNIT_SUFFIXES = (".service", ".scope", ".socket", ".mount", ".swap", ".timer")
CARD_NODE_PREFIX = "nvidia"


def is_gpu_node(rel_path):
    """True for a path (relative to dev_root) of an NVIDIA or VFIO device node."""
    return rel_path.startswith(CARD_NODE_PREFIX) or rel_path.startswith("vfio/")


def unit_from_cgroup(text):
    """The systemd unit a process runs in, from ``/proc/<pid>/cgroup`` text, or None.

    Uses the unified (``0::``) or ``name=systemd`` hierarchy and takes the
    deepest path component that names a unit (``.service``, ``.scope``, ...).
    """
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if (hierarchy == "0" and controllers == "") or "name=systemd" in controllers.split(","):
            paths.append(path)
    for path in paths:
        for component in reversed(path.split("/")):
            if component.endswith(_UNIT_SUFFIXES):
                return component
    return None


def optional_text(path):
    """File text, or None when unreadable (identity details are informative only)."""
    try:
        return _read_proc_file(path).decode("utf-8", "replace")
    except (IOError, OSError):
        return None


def scan_device_holders(proc_root, dev_root, details=True):
    """Every process holding an ``nvidia*`` or ``vfio/*`` node under ``dev_root`` open.

    Returns ``[{pid, command, cmdline, unit, paths}]`` sorted by pid, ``paths``
    being the open node paths (as the fd links name them) sorted; without
    ``details`` only ``pid`` and ``paths``. Raises VgpuError naming the entry
    when ``proc_root`` or a live process's fds cannot be read.
    """
    prefix = dev_root.rstrip("/") + "/"
    try:
        entries = os.listdir(proc_root)
    except (IOError, OSError) as err:
        raise VgpuError("cannot list processes in %s: %s" % (proc_root, err.strerror or err))
    holders = []
    for pid in pids(entries):
        name = str(pid)
        fd_dir = "%s/%s/fd" % (proc_root, name)
        try:
            fds = os.listdir(fd_dir)
        except (IOError, OSError) as err:
            if err.errno in _GONE:
                continue
            raise VgpuError("read process %s file descriptors: %s: %s" % (name, fd_dir, err.strerror or err),
                            proc_entry=fd_dir)
        paths = set()
        for fd in fds:
            link = fd_dir + "/" + fd
            try:
                target = os.readlink(link)
            except (IOError, OSError) as err:
                if err.errno in _GONE:
                    continue
                raise VgpuError("read process %s file descriptor %s: %s: %s" % (name, fd, link, err.strerror or err),
                                proc_entry=link)
            if target.startswith(prefix) and is_gpu_node(target[len(prefix):]):
                paths.add(target)
        if not paths:
            continue
        if not details:
            holders.append({"pid": int(name), "paths": sorted(paths)})
            continue
        base = os.path.join(proc_root, name)
        comm = optional_text(os.path.join(base, "comm"))
        cmdline = optional_text(os.path.join(base, "cmdline"))
        cgroup = optional_text(os.path.join(base, "cgroup"))
        holders.append({
            "pid": int(name),
            "command": comm.rstrip("\n") if comm is not None else None,
            "cmdline": " ".join(a for a in cmdline.split("\0") if a) if cmdline is not None else None,
            "unit": unit_from_cgroup(cgroup) if cgroup is not None else None,
            "paths": sorted(paths),
        })
    return holders
