# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fake NVIDIA ``sriov-manage`` that edits a fake sysfs tree (test equipment).

It is run through the ``sriov-manage`` shell wrapper beside it, exactly as the
module runs the real one: ``sriov-manage -e|-d <pci-address>``. Its settings
are read from ``sriov-manage.json`` beside it; it appends every invocation to
``sriov-manage.log`` and keeps its own state in ``sriov-manage.state.json``.

What it reproduces from the real script (``/usr/lib/nvidia/sriov-manage``):

- an address that is not an NVIDIA PCI device: exit 1, no output
  (``sanitize_gpu_sbdf``); a device without ``sriov_numvfs``: exit 0, no
  output (``input_sanity_check``);
- ``-e`` on a card that has VFs: "GPU at X already has VFs enabled.", exit 0;
  ``-d`` on a card without VFs: "GPU at X already has VFs disabled.", exit 0;
- both unbind the card from the nvidia driver first, which needs the driver's
  unbindLock: while a process holds the card's ``/dev/nvidia<minor>`` open it
  prints "Cannot obtain unbindLock for X" on stderr and exits 1;
- ``-e`` writes ``sriov_totalvfs`` into ``sriov_numvfs``; the kernel creates
  the VFs (``virtfn<N>``/``physfn`` links, VF addresses from the PF's routing
  id plus ``sriov_offset`` and ``sriov_stride``, new IOMMU groups and VFIO
  nodes) and the nvidia driver probes each (``nvidia/creatable_vgpu_types``,
  ``nvidia/current_vgpu_type`` = 0); ``-d`` removes all of that again.

Faults (``mode`` in the settings):

- ``normal``: as above;
- ``noop``: ``-e`` exits 0 without creating VFs;
- ``flaky``: the first ``flaky_runs`` runs of ``-e`` exit 0 without creating
  VFs, later runs work (the driver-start race);
- ``slow``: ``-e`` exits 0 at once and the VFs appear ``delay`` seconds later;
- ``slow_probe``: the VFs appear at once, their nvidia vGPU files ``delay``
  seconds later (the driver still probing them);
- ``no_types``: ``-e`` creates VFs whose creatable list has only the header;
- ``lock_busy``: ``-e`` and ``-d`` fail with "Cannot obtain unbindLock"
  whoever holds the card (a holder that has gone by the time anyone looks);
- ``disable_noop``: ``-d`` exits 0 without removing the VFs;
- ``exit_error``: ``-e`` and ``-d`` do their work, then exit 2 with a message;
- ``hang``: ``-e`` and ``-d`` sleep ``delay`` seconds before working (a run
  that never returns in time).

Delayed work is done by a detached child when ``spawn`` is true (default), or
by ``sriov-manage --complete-pending`` (tests that keep their own clock).
A VF whose VFIO nodes are open makes ``-d`` fail: the real vfio-pci unbind
would block until the VMM lets go.

Settings keys: ``sysfs_root``, ``proc_root``, ``dev_root`` (required),
``mode``, ``delay`` (seconds, default 2), ``spawn``, ``flaky_runs``
(default 1), ``creatable`` (the ``creatable_vgpu_types`` text of new VFs;
default: a few L40S types), ``noise`` (characters ``-e`` and ``-d`` print on
each stream first, as a very loud tool would; default 0).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = os.path.join(HERE, "sriov-manage.json")
STATE = os.path.join(HERE, "sriov-manage.state.json")
LOG = os.path.join(HERE, "sriov-manage.log")
LOCK = os.path.join(HERE, "sriov-manage.lock")
HEADER = "ID    : vGPU Name"
DEFAULT_CREATABLE = HEADER + "\n" + "".join(
    "%-5d : NVIDIA L40S-%dQ\n" % (1147 + i, size) for i, size in enumerate((1, 2, 3, 4, 6, 8, 12, 16, 24, 48)))
MODES = ("normal", "noop", "flaky", "slow", "slow_probe", "no_types", "lock_busy", "disable_noop", "exit_error",
         "hang")
USAGE = """Usage:
    sriov-manage <-e|-d> <ssss:bb:dd.f>
        Enable/disable Virtual functions on the GPU specified by the PCI_ID=ssss:bb:dd.f.

    sriov-manage -h
        Print this help.
"""


class Fake(object):
    def __init__(self):
        with open(SETTINGS) as handle:
            self.settings = json.load(handle)
        self.sysfs = self.settings["sysfs_root"]
        self.proc = self.settings["proc_root"]
        self.dev = self.settings["dev_root"]
        self.mode = self.settings.get("mode", "normal")
        if self.mode not in MODES:
            raise SystemExit("fake sriov-manage: unknown mode %r; known: %s" % (self.mode, ", ".join(MODES)))
        self.devices = os.path.join(self.sysfs, "bus", "pci", "devices")

    # ------------------------------------------------------------ state
    @staticmethod
    def load_state():
        try:
            with open(STATE) as handle:
                return json.load(handle)
        except (IOError, OSError, ValueError):
            return {"enable_runs": 0, "disable_runs": 0, "pending": {}}

    @staticmethod
    def save_state(state):
        tmp = STATE + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(state, handle, indent=2, sort_keys=True)
        os.rename(tmp, STATE)

    # ------------------------------------------------------------ sysfs
    def pf_dir(self, pf):
        return os.path.join(self.devices, pf)

    def read(self, pf, name):
        with open(os.path.join(self.pf_dir(pf), name)) as handle:
            return handle.read().strip()

    def write(self, path, text):
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            os.makedirs(parent)
        with open(path, "w") as handle:
            handle.write(text)

    def link(self, target, path):
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            os.makedirs(parent)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(os.path.relpath(target, parent), path)

    def virtfns(self, pf):
        out = []
        for name in os.listdir(self.pf_dir(pf)):
            match = re.match(r"^virtfn(\d+)$", name)
            if match:
                out.append((int(match.group(1)), os.path.basename(os.readlink(os.path.join(self.pf_dir(pf), name)))))
        return sorted(out)

    def vf_addresses(self, pf):
        total = int(self.read(pf, "sriov_totalvfs"))
        offset = int(self.read(pf, "sriov_offset"))
        stride = int(self.read(pf, "sriov_stride"))
        domain, bus, rest = pf.split(":")
        dev, func = rest.split(".")
        rid = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(func, 16)
        out = []
        for k in range(total):
            vf_rid = rid + offset + k * stride
            out.append("%s:%02x:%02x.%x" % (domain, vf_rid >> 8, (vf_rid >> 3) & 0x1F, vf_rid & 0x7))
        return out

    def _next_number(self, directory, prefix=""):
        numbers = [-1]
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                if name.startswith(prefix) and name[len(prefix):].isdigit():
                    numbers.append(int(name[len(prefix):]))
        return max(numbers) + 1

    def create_vfs(self, pf, probe=True, creatable=None):
        pf_real = os.path.realpath(self.pf_dir(pf))
        groups = os.path.join(self.sysfs, "kernel", "iommu_groups")
        vf_device = self.read(pf, "sriov_vf_device") if os.path.exists(os.path.join(pf_real, "sriov_vf_device")) \
            else self.read(pf, "device")[2:]
        addresses = self.vf_addresses(pf)
        for index, vf in enumerate(addresses):
            vf_real = os.path.join(os.path.dirname(pf_real), vf)
            for name, value in (("vendor", "0x10de"), ("device", "0x" + vf_device), ("class", "0x030200")):
                self.write(os.path.join(vf_real, name), value + "\n")
            group = self._next_number(groups)
            self.link(vf_real, os.path.join(groups, str(group), "devices", vf))
            self.link(os.path.join(groups, str(group)), os.path.join(vf_real, "iommu_group"))
            self.link(os.path.join(self.sysfs, "bus", "pci", "drivers", "nvidia"), os.path.join(vf_real, "driver"))
            vfio = self._next_number(os.path.join(self.dev, "vfio", "devices"), "vfio")
            os.makedirs(os.path.join(vf_real, "vfio-dev", "vfio%d" % vfio))
            self.write(os.path.join(self.dev, "vfio", "devices", "vfio%d" % vfio), "")
            self.write(os.path.join(self.dev, "vfio", str(group)), "")
            self.link(pf_real, os.path.join(vf_real, "physfn"))
            self.link(vf_real, os.path.join(pf_real, "virtfn%d" % index))
            self.link(vf_real, os.path.join(self.devices, vf))
            if probe:
                self.probe(vf, creatable)
        self.write(os.path.join(pf_real, "sriov_numvfs"), "%d\n" % len(addresses))

    def probe(self, vf, creatable=None):
        """What the nvidia vGPU driver adds when it binds a new VF."""
        if creatable is None:
            creatable = self.settings.get("creatable", DEFAULT_CREATABLE)
        vf_real = os.path.realpath(os.path.join(self.devices, vf))
        self.write(os.path.join(vf_real, "nvidia", "current_vgpu_type"), "0\n")
        self.write(os.path.join(vf_real, "nvidia", "creatable_vgpu_types"), creatable)

    def remove_vfs(self, pf):
        pf_real = os.path.realpath(self.pf_dir(pf))
        for index, vf in self.virtfns(pf):
            vf_real = os.path.realpath(os.path.join(pf_real, "virtfn%d" % index))
            group_link = os.path.join(vf_real, "iommu_group")
            if os.path.islink(group_link):
                group = os.path.basename(os.readlink(group_link))
                _rmtree(os.path.join(self.sysfs, "kernel", "iommu_groups", group))
                _unlink(os.path.join(self.dev, "vfio", group))
            vfio_dev = os.path.join(vf_real, "vfio-dev")
            if os.path.isdir(vfio_dev):
                for name in os.listdir(vfio_dev):
                    _unlink(os.path.join(self.dev, "vfio", "devices", name))
            _unlink(os.path.join(self.sysfs, "class", "mdev_bus", vf))
            _unlink(os.path.join(self.devices, vf))
            _unlink(os.path.join(pf_real, "virtfn%d" % index))
            _rmtree(vf_real)
        self.write(os.path.join(pf_real, "sriov_numvfs"), "0\n")

    # ------------------------------------------------------------ holders
    def minor(self, pf):
        try:
            with open(os.path.join(self.proc, "driver", "nvidia", "gpus", pf, "information")) as handle:
                for line in handle:
                    key, _sep, value = line.partition(":")
                    if key.strip() == "Device Minor":
                        return int(value.strip())
        except (IOError, OSError, ValueError):
            pass
        return None

    def holders(self, paths):
        """``{pid: comm}`` of processes under proc_root holding any of ``paths`` open."""
        wanted = set(os.path.normpath(p) for p in paths)
        found = {}
        for name in os.listdir(self.proc):
            fd_dir = os.path.join(self.proc, name, "fd")
            if not name.isdigit() or not os.path.isdir(fd_dir):
                continue
            for fd in os.listdir(fd_dir):
                try:
                    target = os.readlink(os.path.join(fd_dir, fd))
                except OSError:
                    continue
                if os.path.normpath(target) in wanted:
                    try:
                        with open(os.path.join(self.proc, name, "comm")) as handle:
                            found[int(name)] = handle.read().strip()
                    except (IOError, OSError):
                        found[int(name)] = "?"
        return found

    def card_nodes(self, pf):
        minor = self.minor(pf)
        if minor is not None:
            return [os.path.join(self.dev, "nvidia%d" % minor)]
        return [os.path.join(self.dev, name) for name in os.listdir(self.dev) if re.match(r"^nvidia\d+$", name)]

    def vf_nodes(self, pf):
        nodes = []
        for _index, vf in self.virtfns(pf):
            vf_real = os.path.realpath(os.path.join(self.devices, vf))
            if os.path.isdir(os.path.join(vf_real, "vfio-dev")):
                nodes.extend(os.path.join(self.dev, "vfio", "devices", n) for n in os.listdir(os.path.join(vf_real, "vfio-dev")))
            if os.path.islink(os.path.join(vf_real, "iommu_group")):
                nodes.append(os.path.join(self.dev, "vfio", os.path.basename(os.readlink(os.path.join(vf_real, "iommu_group")))))
        return nodes

    def unbind_lock(self, pf):
        """The driver's unbindLock: refused while anything holds the card open."""
        if self.mode == "lock_busy" or self.holders(self.card_nodes(pf)):
            sys.stderr.write("Cannot obtain unbindLock for %s\n" % pf)
            return False
        return True

    # ------------------------------------------------------------ commands
    def sanitize(self, pf):
        pf = pf.lower()
        try:
            if self.read(pf, "vendor").lower() != "0x10de":
                raise SystemExit(1)
        except (IOError, OSError):
            raise SystemExit(1)
        if not os.path.exists(os.path.join(self.pf_dir(pf), "sriov_numvfs")):
            raise SystemExit(0)
        return pf

    def enable(self, pf):
        pf = self.sanitize(pf)
        with Locked():
            state = self.load_state()
            state["enable_runs"] += 1
            self.save_state(state)
        if self.read(pf, "sriov_numvfs") != "0":
            print("GPU at %s already has VFs enabled." % pf)
            return 0
        if not self.unbind_lock(pf):
            return 1
        print("Enabling VFs on %s" % pf)
        sys.stdout.flush()
        if self.mode == "noop" or (self.mode == "flaky" and state["enable_runs"] <= self.settings.get("flaky_runs", 1)):
            return 0
        if self.mode in ("slow", "slow_probe"):
            with Locked():
                state = self.load_state()
                if pf in state["pending"]:
                    return 0  # the first run's VFs are still on their way
                if self.mode == "slow_probe":
                    self.create_vfs(pf, probe=False)
                state["pending"][pf] = "probe" if self.mode == "slow_probe" else "all"
                self.save_state(state)
            if self.settings.get("spawn", True):
                self.spawn_completion(float(self.settings.get("delay", 2)))
            return 0
        self.create_vfs(pf, creatable=HEADER + "\n" if self.mode == "no_types" else None)
        return 0

    def disable(self, pf):
        pf = self.sanitize(pf)
        with Locked():
            state = self.load_state()
            state["disable_runs"] += 1
            self.save_state(state)
        if self.read(pf, "sriov_numvfs") == "0":
            print("GPU at %s already has VFs disabled." % pf)
            return 0
        if not self.unbind_lock(pf):
            return 1
        print("Disabling VFs on %s" % pf)
        busy = self.holders(self.vf_nodes(pf))
        if busy:
            sys.stderr.write("VFs of %s are in use by %s: vfio-pci unbind would block\n"
                             % (pf, ", ".join("%d (%s)" % item for item in sorted(busy.items()))))
            return 1
        if self.mode == "disable_noop":
            return 0
        self.remove_vfs(pf)
        return 0

    def complete_pending(self):
        with Locked():
            state = self.load_state()
            for pf, stage in sorted(state["pending"].items()):
                if stage == "probe":
                    for _index, vf in self.virtfns(pf):
                        self.probe(vf)
                else:
                    self.create_vfs(pf)
            state["pending"] = {}
            self.save_state(state)

    def spawn_completion(self, delay):
        """Finish the pending work ``delay`` seconds from now in a detached child."""
        if os.fork():
            return
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)  # the caller waits for EOF on its pipes: do not keep them open
            time.sleep(delay)
            if os.path.exists(SETTINGS):
                self.complete_pending()
        finally:
            os._exit(0)  # pylint: disable=protected-access


class Locked(object):
    def __enter__(self):
        self.handle = open(LOCK, "a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.handle.close()


def _unlink(path):
    if os.path.lexists(path):
        os.unlink(path)


def _rmtree(path):
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    for name in os.listdir(path):
        _rmtree(os.path.join(path, name))
    os.rmdir(path)


def main(argv):
    with open(LOG, "a") as handle:
        handle.write(" ".join(argv) + "\n")
    if argv[:1] in (["-e"], ["-d"]) and len(argv) == 2:
        fake = Fake()
        noise = int(fake.settings.get("noise", 0))
        if noise:
            sys.stdout.write("o" * noise + "\n")
            sys.stderr.write("e" * noise + "\n")
        if fake.mode == "hang":
            time.sleep(float(fake.settings.get("delay", 2)))
        rc = fake.enable(argv[1]) if argv[0] == "-e" else fake.disable(argv[1])
        if rc == 0 and fake.mode == "exit_error":
            sys.stderr.write("sriov-manage: failed to set persistence mode on %s\n" % argv[1])
            return 2
        return rc
    if argv == ["--complete-pending"]:
        Fake().complete_pending()
        return 0
    if argv == ["-h"]:
        sys.stdout.write(USAGE)
        return 0
    sys.stderr.write(USAGE)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
