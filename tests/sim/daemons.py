# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Long-running stand-in processes of the simulated host (test equipment).

Each holds real file descriptors, so anything that scans ``/proc/*/fd`` (the
collection's holder and liveness checks, the simulated ``sriov-manage``) sees
exactly what it would see on a real host:

- ``vmm``: the VMM of one instance (QEMU, docs/hypeman-interface.md §3.3, §6.2): holds the VF's
  ``dev/vfio/devices/vfioN`` and ``dev/vfio/<group>`` nodes and listens on the
  instance's control socket (``qemu.sock``); after SIGUSR1 it ignores SIGTERM,
  as a QEMU whose guest is stuck in vGPU driver init can (§8.1), so only a
  SIGKILL ends it;
- ``dcgm``: ``nv-hostengine`` / ``dcgm-exporter`` (§8): hold ``nvidiactl`` and
  every card's ``dev/nvidia<minor>`` node, which is what makes
  ``sriov-manage -d`` fail with "Cannot obtain unbindLock";
- ``hold``: any other process holding one card's node (a stray tool).

Each sets its process name (``/proc/<pid>/comm``) to the real program's, exits
cleanly on SIGTERM and SIGINT.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import signal
import socket
import time

PR_SET_NAME = 15


def set_process_name(name):
    """What ``/proc/self/comm`` shows (15 bytes max), as the real daemon's would."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # cosmetic only


def _stop_signals(term_ignored=None):
    """SIGTERM and SIGINT handlers that ask the main loop to stop; returns the list they append to.

    ``term_ignored()`` true makes SIGTERM do nothing (a stuck guest's QEMU).
    """
    stop = []

    def handler(signum, _frame):
        if signum == signal.SIGTERM and term_ignored is not None and term_ignored():
            return
        stop.append(True)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _until_signalled(cleanup=None, stop=None):
    if stop is None:
        stop = _stop_signals()
    try:
        while not stop:
            time.sleep(0.2)
    finally:
        if cleanup:
            cleanup()
    return 0


def hold_open(paths):
    """Open each path read-only and keep the descriptors."""
    return [os.open(path, os.O_RDONLY) for path in paths]


def run_vmm(instance_id, socket_path, nodes):
    """The VMM stand-in: hold the VF's vfio nodes, own the control socket."""
    set_process_name("qemu-system-x86")
    stuck = []

    def on_stuck(_signum, _frame):
        stuck.append(True)
        print("vmm %s: guest stuck in GPU driver init, SIGTERM ignored from now on" % instance_id, flush=True)

    # Every handler is in place before the socket appears (what a boot waits for), and SIGTERM
    # asks the flag instead of being set to SIG_IGN by the SIGUSR1 handler: a SIGTERM sent right
    # after SIGUSR1, before this process ran, once found the default action (or the stop handler
    # installed later) and the "stuck" QEMU exited on SIGTERM. Python runs pending handlers in
    # signal-number order, so SIGUSR1's runs first.
    signal.signal(signal.SIGUSR1, on_stuck)
    stop = _stop_signals(term_ignored=lambda: bool(stuck))
    fds = hold_open(nodes)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = socket_path + ".binding"
    if os.path.exists(tmp):
        os.unlink(tmp)
    if len(tmp.encode()) < 100:
        listener.bind(tmp)
    else:
        # AF_UNIX paths are limited to 108 bytes; deep test dirs exceed it.
        os.chdir(os.path.dirname(tmp))
        listener.bind(os.path.basename(tmp))
    listener.listen(4)
    os.rename(tmp, socket_path)  # the socket appears only once it is listening
    print("vmm %s: pid %d holds %s, listens on %s" % (instance_id, os.getpid(), " ".join(nodes), socket_path),
          flush=True)

    def cleanup():
        listener.close()
        for fd in fds:
            os.close(fd)

    return _until_signalled(cleanup, stop)


def card_nodes(dev_root, minors=None):
    """``nvidiactl`` plus the cards' ``nvidia<minor>`` nodes (all cards by default)."""
    if minors is None:
        paths = sorted(p for p in glob.glob(os.path.join(dev_root, "nvidia[0-9]*"))
                       if os.path.basename(p)[6:].isdigit())
    else:
        paths = [os.path.join(dev_root, "nvidia%d" % m) for m in minors]
    return [os.path.join(dev_root, "nvidiactl")] + paths


def run_dcgm(dev_root, name="nv-hostengine"):
    """DCGM stand-in: hold every card's device nodes while running."""
    set_process_name(name)
    nodes = card_nodes(dev_root)
    fds = hold_open(nodes)
    print("%s: pid %d holds %s" % (name, os.getpid(), " ".join(nodes)), flush=True)

    def cleanup():
        for fd in fds:
            os.close(fd)

    return _until_signalled(cleanup)


def run_hold(paths, name="nvidia-smi", ready_path=None):
    """A stray process holding ``paths`` (e.g. one card's node) until signalled."""
    set_process_name(name)
    fds = hold_open(paths)
    if ready_path:
        with open(ready_path, "w") as handle:
            handle.write("%d\n" % os.getpid())
    print("%s: pid %d holds %s" % (name, os.getpid(), " ".join(paths)), flush=True)

    def cleanup():
        for fd in fds:
            os.close(fd)
        if ready_path and os.path.exists(ready_path):
            os.unlink(ready_path)

    return _until_signalled(cleanup)
