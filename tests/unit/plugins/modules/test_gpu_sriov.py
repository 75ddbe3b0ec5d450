# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_sriov: every branch, on a host tree, through a fake sriov-manage that edits the tree.

The fake is the integration target's ``files/sriov-manage`` (a real
subprocess run through ``_cmd.run``). Waiting uses a simulated clock, so the
slow-creation and timeout cases never depend on wall time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.hypeman.vgpu.plugins.modules import gpu_sriov
from ansible_collections.hypeman.vgpu.tests.sim.hosttree import MODELS, HostTree, vf_addresses
from ansible_collections.hypeman.vgpu.tests.unit.hostile import tree_fingerprint
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import run_module, warning_texts

CARD = "0000:82:00.0"
OTHER_CARD = "0000:c1:00.0"
L40S = MODELS["L40S"]
CARD_VFS = vf_addresses(CARD, L40S.total_vfs, L40S.first_vf_offset, L40S.vf_stride)
FAKE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "integration", "targets",
                        "gpu_sriov", "files")


class Clock(object):
    """A simulated clock: ``sleep`` advances it and may finish the fake's delayed work."""

    def __init__(self, host, due=None):
        self.host = host
        self.now = 0.0
        self.due = due
        self.sleeps = 0

    def time(self):
        return self.now

    def sleep(self, seconds):
        assert seconds > 0
        self.sleeps += 1
        self.now += seconds
        if self.due is not None and self.now >= self.due:
            self.due = None
            self.host.complete_pending()


class Host(object):
    """A host tree with one L40S card (plus an A100 as a neighbour) and a fake sriov-manage."""

    def __init__(self, root, numvfs=None, mode="normal", framework="vendor-vfio", **settings):
        self.root = str(root)
        self.tree = HostTree(os.path.join(self.root, "host"))
        self.card = self.tree.add_card("L40S", CARD, numvfs=numvfs, framework=framework)
        self.other = self.tree.add_card("A100", OTHER_CARD)
        self.tool_dir = os.path.join(self.root, "tool")
        os.makedirs(self.tool_dir)
        for name in ("sriov-manage", "fake_sriov_manage.py"):
            shutil.copy(os.path.join(FAKE_DIR, name), self.tool_dir)
        self.tool = os.path.join(self.tool_dir, "sriov-manage")
        os.chmod(self.tool, 0o755)
        self.configure(mode=mode, **settings)

    def configure(self, **settings):
        data = {"sysfs_root": self.tree.sysfs_root, "proc_root": self.tree.proc_root, "dev_root": self.tree.dev_root,
                "mode": "normal", "spawn": False}
        path = os.path.join(self.tool_dir, "sriov-manage.json")
        if os.path.exists(path):
            with open(path) as handle:
                data.update(json.load(handle))
        data.update(settings)
        with open(path, "w") as handle:
            json.dump(data, handle)

    def run(self, capsys, check_mode=False, diff=False, **args):
        params = {"pci_address": CARD, "sriov_manage": self.tool, "data_dir": self.tree.data_dir,
                  "sysfs_root": self.tree.sysfs_root, "proc_root": self.tree.proc_root,
                  "dev_root": self.tree.dev_root, "delay": 1, "timeout": 10, "retries": 2,
                  "_ansible_check_mode": check_mode, "_ansible_diff": diff}
        params.update(args)
        result = run_module(gpu_sriov.main, params, capsys)
        result["warning_texts"] = warning_texts(result)
        return result

    def calls(self):
        """Every invocation of the fake, as argument strings."""
        try:
            with open(os.path.join(self.tool_dir, "sriov-manage.log")) as handle:
                return [line.strip() for line in handle if line.strip()]
        except IOError:
            return []

    def complete_pending(self):
        subprocess.check_call([self.tool, "--complete-pending"])

    def numvfs(self):
        with open(self.tree.pci_path(CARD, "sriov_numvfs")) as handle:
            return int(handle.read())

    def fingerprint(self):
        return tree_fingerprint(self.tree.root)

    def dcgm(self):
        """nv-hostengine in nvidia-dcgm.service holding the card's node and the shared control node."""
        return self.tree.add_process(comm="nv-hostengine", cmdline=["/usr/bin/nv-hostengine", "-n"],
                                     unit="nvidia-dcgm.service",
                                     fds=["nvidia%d" % self.card.minor, "nvidiactl"])


@pytest.fixture(autouse=True)
def fake_python(monkeypatch):
    # Run the fake with this interpreter, whatever python3 is on PATH.
    monkeypatch.setenv("FAKE_SRIOV_MANAGE_PYTHON", sys.executable)


@pytest.fixture
def clock(monkeypatch):
    holder = {}

    def install(host, due=None):
        holder["clock"] = Clock(host, due)
        monkeypatch.setattr(gpu_sriov, "_now", holder["clock"].time)
        monkeypatch.setattr(gpu_sriov, "_sleep", holder["clock"].sleep)
        return holder["clock"]

    return install


def _summary(numvfs, vfs):
    return {"sriov_numvfs": numvfs, "sriov_totalvfs": 32, "vfs": list(vfs)}


# --------------------------------------------------------------------- enabled


def test_enabled_is_a_no_op_on_a_complete_card(tmp_path, capsys):
    host = Host(tmp_path)
    before = host.fingerprint()
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, state="enabled")
        assert result["changed"] is False
        assert result["commands"] == []
        assert result["before"] == result["after"] == _summary(32, CARD_VFS)
        assert [vf["address"] for vf in result["vfs"]] == CARD_VFS
        assert all(vf["readable"] and vf["error"] is None for vf in result["vfs"])
        assert "holders" not in result
    assert host.calls() == []
    assert host.fingerprint() == before


def test_enabled_no_op_does_not_require_creatable_types_on_allocated_vfs(tmp_path, capsys):
    host = Host(tmp_path)
    host.tree.set_current_type(CARD_VFS[0], "NVIDIA L40S-48Q")  # the card is full: every list is header-only
    result = host.run(capsys, state="enabled")
    assert result["changed"] is False
    assert result["vfs"][0]["current_type"] == "1156"
    assert all(vf["creatable_types"] == [] for vf in result["vfs"])


def test_enabled_check_apply_apply_check(tmp_path, capsys):
    host = Host(tmp_path, numvfs=0)
    untouched = host.fingerprint()

    check = host.run(capsys, check_mode=True, diff=True, state="enabled")
    assert check["changed"] is True
    assert [c["argv"] for c in check["commands"]] == [[host.tool, "-e", CARD]]
    assert check["commands"][0]["skipped"] is True and check["commands"][0]["rc"] is None
    assert check["attempts"] == 1
    assert check["before"] == _summary(0, [])
    assert check["after"] == _summary(32, CARD_VFS)  # predicted from sriov_offset / sriov_stride
    assert check["holders"] == []
    assert check["diff"]["before"] == "sriov_numvfs: 0\nsriov_totalvfs: 32\nvfs:\n"
    assert check["diff"]["after"].startswith("sriov_numvfs: 32\nsriov_totalvfs: 32\nvfs:\n  - 0000:82:00.4\n")
    assert host.calls() == [] and host.fingerprint() == untouched

    apply = host.run(capsys, diff=True, state="enabled")
    assert apply["changed"] is True
    assert [(c["argv"], c["rc"], c["skipped"]) for c in apply["commands"]] == [([host.tool, "-e", CARD], 0, False)]
    assert apply["commands"][0]["stdout"] == "Enabling VFs on %s\n" % CARD
    assert apply["after"] == _summary(32, CARD_VFS)
    assert [vf["address"] for vf in apply["vfs"]] == CARD_VFS
    assert all(vf["readable"] and "NVIDIA L40S-2Q" in vf["creatable_types"] for vf in apply["vfs"])
    assert apply["diff"]["after"] == check["diff"]["after"]
    assert apply["warning_texts"] == []
    assert host.numvfs() == 32
    assert host.calls() == ["-e %s" % CARD]

    again = host.run(capsys, state="enabled")
    assert again["changed"] is False and again["commands"] == []
    check_again = host.run(capsys, check_mode=True, state="enabled")
    assert check_again["changed"] is False and check_again["commands"] == []
    assert host.calls() == ["-e %s" % CARD]


def test_enabled_refuses_while_the_card_node_is_held(tmp_path, capsys):
    host = Host(tmp_path, numvfs=0)
    pid = host.dcgm()
    before = host.fingerprint()
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, state="enabled")
        assert result["failed"] is True
        assert "refusing to enable SR-IOV on %s" % CARD in result["msg"]
        assert "Cannot obtain unbindLock" in result["msg"]
        assert "pid %d (nv-hostengine, unit nvidia-dcgm.service)" % pid in result["msg"]
        assert [h["pid"] for h in result["culprits"]["card_holders"]] == [pid]
        assert result["culprits"]["card_holders"][0]["paths"] == [os.path.join(host.tree.dev_root, "nvidia0")]
    assert host.calls() == [] and host.fingerprint() == before


def test_enabled_waits_for_a_card_that_already_has_vfs_and_never_reruns_sriov_manage(tmp_path, capsys, clock):
    host = Host(tmp_path)
    broken = host.tree.break_path(os.path.relpath(host.tree.pci_path(CARD_VFS[3], "nvidia", "current_vgpu_type"),
                                                  host.tree.root))
    tick = clock(host)
    result = host.run(capsys, state="enabled", timeout=6, delay=2)
    assert result["failed"] is True
    assert "has SR-IOV enabled but its VFs are not all usable after 6.0 s" in result["msg"]
    assert CARD_VFS[3] in result["msg"] and "use state=cycled" in result["msg"]
    assert result["commands"] == [] and result["changed"] is False
    assert [vf["readable"] for vf in result["vfs"]].count(False) == 1
    assert tick.now == 6 and tick.sleeps == 3
    assert host.calls() == []
    assert os.path.isdir(broken)


def test_each_unusable_vf_says_why(tmp_path, capsys):
    host = Host(tmp_path)
    tree = host.tree
    # VF 0's physfn points at the other card; VF 1 lost its nvidia vGPU files; VF 2's virtfn link dangles.
    os.unlink(os.path.join(tree.device_dir(CARD_VFS[0]), "physfn"))
    os.symlink(os.path.relpath(tree.device_dir(OTHER_CARD), tree.device_dir(CARD_VFS[0])),
               os.path.join(tree.device_dir(CARD_VFS[0]), "physfn"))
    shutil.rmtree(os.path.join(tree.device_dir(CARD_VFS[1]), "nvidia"))
    os.unlink(tree.pci_path(CARD_VFS[2]))
    shutil.rmtree(tree.device_dir(CARD_VFS[2]))
    result = host.run(capsys, state="enabled", timeout=0)
    assert result["failed"] is True and result["commands"] == []
    errors = dict((vf["address"], vf["error"]) for vf in result["vfs"] if not vf["readable"])
    assert errors == {
        CARD_VFS[0]: "physfn of VF %s points at %s, not at %s" % (CARD_VFS[0], OTHER_CARD, CARD),
        CARD_VFS[1]: "VF %s has no vGPU files (no nvidia/creatable_vgpu_types): the nvidia driver has not probed it"
                     % CARD_VFS[1],
        CARD_VFS[2]: "virtfn2 points at %s, which is not a device in sysfs" % CARD_VFS[2],
    }
    assert all(error in result["msg"] for error in errors.values())


def test_enabled_accepts_vfs_that_settle_while_it_waits(tmp_path, capsys, clock):
    host = Host(tmp_path, numvfs=0, mode="slow_probe")
    host.run(capsys, state="enabled", timeout=0, retries=0)  # VFs appear, their vGPU files do not yet
    assert host.numvfs() == 32
    tick = clock(host, due=3)
    result = host.run(capsys, state="enabled", timeout=10, delay=1)
    assert result["changed"] is False and result["commands"] == []
    assert all(vf["readable"] for vf in result["vfs"])
    assert tick.now == 3
    assert host.calls() == ["-e %s" % CARD, "--complete-pending"]


# -------------------------------------------------------------------- disabled


def test_disabled_check_apply_apply_check(tmp_path, capsys):
    host = Host(tmp_path)
    untouched = host.fingerprint()

    check = host.run(capsys, check_mode=True, diff=True, state="disabled")
    assert check["changed"] is True
    assert [c["argv"] for c in check["commands"]] == [[host.tool, "-d", CARD]]
    assert check["commands"][0]["skipped"] is True
    assert check["after"] == _summary(0, [])
    assert check["diff"]["after"] == "sriov_numvfs: 0\nsriov_totalvfs: 32\nvfs:\n"
    assert host.calls() == [] and host.fingerprint() == untouched

    apply = host.run(capsys, state="disabled")
    assert apply["changed"] is True
    assert [(c["argv"], c["rc"]) for c in apply["commands"]] == [([host.tool, "-d", CARD], 0)]
    assert apply["before"] == _summary(32, CARD_VFS)
    assert apply["after"] == _summary(0, [])
    assert apply["vfs"] == [] and apply["attempts"] == 0
    assert host.numvfs() == 0
    assert not any(os.path.lexists(host.tree.pci_path(vf)) for vf in CARD_VFS)

    again = host.run(capsys, state="disabled")
    assert again["changed"] is False and again["commands"] == []
    check_again = host.run(capsys, check_mode=True, state="disabled")
    assert check_again["changed"] is False and check_again["commands"] == []
    assert host.calls() == ["-d %s" % CARD]


def test_disabled_fails_when_sriov_manage_exits_0_but_the_vfs_stay(tmp_path, capsys, clock):
    host = Host(tmp_path, mode="disable_noop")
    clock(host)
    result = host.run(capsys, state="disabled", timeout=4)
    assert result["failed"] is True
    assert result["changed"] is True
    assert "sriov-manage -d %s exited 0 but SR-IOV is not disabled after 4.0 s" % CARD in result["msg"]
    assert "sriov_numvfs is 32, expected 0" in result["msg"]
    assert "VF devices still in sysfs: 0000:82:00.4" in result["msg"]
    assert result["after"] == _summary(32, CARD_VFS)


# ---------------------------------------------------------------------- cycled


def test_cycled_in_check_mode_reports_both_commands_and_changes_nothing(tmp_path, capsys):
    host = Host(tmp_path)
    before = host.fingerprint()
    result = host.run(capsys, check_mode=True, diff=True, state="cycled")
    assert result["changed"] is True
    assert [c["argv"] for c in result["commands"]] == [[host.tool, "-d", CARD], [host.tool, "-e", CARD]]
    assert all(c["skipped"] for c in result["commands"])
    assert result["before"] == result["after"] == _summary(32, CARD_VFS)
    assert host.calls() == [] and host.fingerprint() == before


def test_cycled_disables_then_enables_and_always_acts(tmp_path, capsys):
    host = Host(tmp_path)
    mark = host.tree.pci_path(CARD_VFS[0], "test-mark")
    for _round in (1, 2):
        with open(mark, "w") as handle:
            handle.write("old VF\n")
        result = host.run(capsys, state="cycled")
        assert result["changed"] is True
        assert [(c["argv"][1], c["rc"]) for c in result["commands"]] == [("-d", 0), ("-e", 0)]
        assert result["before"] == result["after"] == _summary(32, CARD_VFS)
        assert result["attempts"] == 1
        assert all(vf["readable"] and vf["creatable_types"] for vf in result["vfs"])
        assert host.calls()[-2:] == ["-d %s" % CARD, "-e %s" % CARD]
        assert not os.path.exists(mark)  # the VF was really recreated
    assert len(host.calls()) == 4


def test_cycled_on_a_card_without_vfs_only_enables(tmp_path, capsys):
    host = Host(tmp_path, numvfs=0)
    result = host.run(capsys, state="cycled")
    assert result["changed"] is True
    assert [c["argv"][1] for c in result["commands"]] == ["-e"]
    assert result["after"] == _summary(32, CARD_VFS)


# -------------------------------------------------------------------- refusals


@pytest.mark.parametrize("state", ["disabled", "cycled"])
def test_refuses_while_a_vf_is_allocated_even_with_force(tmp_path, capsys, state):
    host = Host(tmp_path)
    host.tree.set_current_type(CARD_VFS[2], "NVIDIA L40S-4Q")
    before = host.fingerprint()
    for force in (False, True):
        result = host.run(capsys, state=state, force=force)
        assert result["failed"] is True
        assert result["msg"].startswith("refusing to disable SR-IOV on %s: allocated VF(s)" % CARD)
        assert "%s (type 1150)" % CARD_VFS[2] in result["msg"]
        assert result["culprits"]["allocated"] == [{"vf": CARD_VFS[2], "current_type": "1150"}]
        assert result["changed"] is False and result["commands"] == []
    assert host.calls() == [] and host.fingerprint() == before


@pytest.mark.parametrize("mdev_uuid_written", [True, False])
def test_an_mdev_claim_is_found_with_or_without_gpumdevuuid(tmp_path, capsys, mdev_uuid_written):
    # GPUDevicePath is /sys/bus/mdev/devices/<uuid>; gpu_sriov used to miss the claim when GPUMdevUUID was empty.
    host = Host(tmp_path, framework="mdev")
    host.tree.add_instance("inst-mdev", vf=CARD_VFS[3], profile="NVIDIA L40S-2Q", liveness="stopped",
                           extra=None if mdev_uuid_written else {"GPUMdevUUID": ""})
    result = host.run(capsys, check_mode=True, state="disabled")
    assert result["failed"] is True
    assert "%s by instance inst-mdev" % CARD_VFS[3] in result["msg"]
    assert [c["vf"] for c in result["culprits"]["claimed"]] == [CARD_VFS[3]]


@pytest.mark.parametrize("state", ["disabled", "cycled"])
def test_refuses_a_claim_in_metadata_of_a_stopped_instance_unless_forced(tmp_path, capsys, state):
    host = Host(tmp_path)
    host.tree.add_instance("inst-stopped", vf=CARD_VFS[5], profile="NVIDIA L40S-2Q", liveness="stopped",
                           set_type=False, name="ml-job")
    host.tree.add_instance("inst-other", vf=host.other.vfs[0], profile="NVIDIA A100-4C", liveness="stopped",
                           set_type=False)
    before = host.fingerprint()
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, state=state)
        assert result["failed"] is True
        assert "claimed in instance metadata" in result["msg"]
        assert "%s by instance inst-stopped (ml-job)" % CARD_VFS[5] in result["msg"]
        assert "inst-other" not in result["msg"]
        assert result["culprits"]["claimed"] == [{
            "vf": CARD_VFS[5], "instance_id": "inst-stopped", "name": "ml-job", "claim_field": "GPUClaimedAt",
            "metadata_path": os.path.join(host.tree.data_dir, "guests", "inst-stopped", "metadata.json")}]
    assert host.calls() == [] and host.fingerprint() == before

    forced = host.run(capsys, state=state, force=True)
    assert forced["changed"] is True
    assert forced["after"]["sriov_numvfs"] == (0 if state == "disabled" else 32)
    assert forced["warning_texts"] == [
        "force: ignoring the claim of instance inst-stopped (ml-job) on VF %s in %s"
        % (CARD_VFS[5], os.path.join(host.tree.data_dir, "guests", "inst-stopped", "metadata.json"))]


def test_unreadable_metadata_fails_closed_unless_forced(tmp_path, capsys):
    host = Host(tmp_path)
    host.tree.add_instance("inst-broken", liveness="stopped")
    path = os.path.join(host.tree.data_dir, "guests", "inst-broken", "metadata.json")
    with open(path, "w") as handle:
        handle.write("{not json")
    result = host.run(capsys, state="disabled")
    assert result["failed"] is True
    assert "instance metadata that cannot be read, so claims cannot be ruled out: %s" % path in result["msg"]
    assert [e["instance_id"] for e in result["culprits"]["unreadable_metadata"]] == ["inst-broken"]
    assert host.calls() == []

    forced = host.run(capsys, state="disabled", force=True)
    assert forced["changed"] is True
    assert len(forced["warning_texts"]) == 1 and forced["warning_texts"][0].startswith(
        "force: ignoring unreadable metadata %s: unmarshal metadata:" % path)


def test_an_unreadable_guests_directory_fails_closed(tmp_path, capsys):
    host = Host(tmp_path)
    guests = os.path.join(host.tree.data_dir, "guests")
    shutil.rmtree(guests)
    os.symlink("guests", guests)  # a symlink loop: listing it fails
    result = host.run(capsys, state="disabled")
    assert result["failed"] is True
    assert "instance metadata that cannot be read" in result["msg"] and guests in result["msg"]
    assert host.calls() == []


@pytest.mark.parametrize("state", ["disabled", "cycled"])
def test_refuses_a_vf_held_open_even_with_force(tmp_path, capsys, state):
    host = Host(tmp_path)
    nodes = host.tree.vf_nodes(CARD_VFS[7])
    pid = host.tree.add_process(comm="qemu-system-x86", cmdline=["qemu-system-x86_64"], unit="hypeman.service",
                                fds=nodes[:1])
    before = host.fingerprint()
    for force in (False, True):
        result = host.run(capsys, state=state, force=force)
        assert result["failed"] is True
        assert "VF(s) held open: %s by pid %d (qemu-system-x86, unit hypeman.service)" % (CARD_VFS[7], pid) \
            in result["msg"]
        assert result["culprits"]["held_open"] == [{
            "vf": CARD_VFS[7], "pid": pid, "command": "qemu-system-x86", "unit": "hypeman.service",
            "paths": [os.path.join(host.tree.dev_root, nodes[0])]}]
        assert [h["pid"] for h in result["holders"]] == [pid]
    assert host.calls() == [] and host.fingerprint() == before


@pytest.mark.parametrize("state", ["disabled", "cycled"])
def test_refuses_while_dcgm_holds_the_card_even_with_force(tmp_path, capsys, state):
    host = Host(tmp_path)
    pid = host.dcgm()
    before = host.fingerprint()
    for force in (False, True):
        result = host.run(capsys, state=state, force=force)
        assert result["failed"] is True
        assert "sriov-manage would fail with 'Cannot obtain unbindLock'" in result["msg"]
        assert "pid %d (nv-hostengine, unit nvidia-dcgm.service) holds %s" % (
            pid, os.path.join(host.tree.dev_root, "nvidia0")) in result["msg"]
        holder = result["culprits"]["card_holders"][0]
        assert (holder["pid"], holder["unit"]) == (pid, "nvidia-dcgm.service")
        assert holder["cmdline"] == "/usr/bin/nv-hostengine -n"
    assert host.calls() == [] and host.fingerprint() == before


def test_a_running_instance_is_named_as_allocated_claimed_and_held_open(tmp_path, capsys):
    host = Host(tmp_path)
    host.tree.add_instance("inst-live", vf=CARD_VFS[1], profile="NVIDIA L40S-2Q")
    pid = host.tree.instances["inst-live"]["proc_pid"]
    result = host.run(capsys, state="cycled", check_mode=True)
    culprits = result["culprits"]
    assert culprits["allocated"] == [{"vf": CARD_VFS[1], "current_type": "1148"}]
    assert [c["instance_id"] for c in culprits["claimed"]] == ["inst-live"]
    assert [(c["vf"], c["pid"], c["unit"]) for c in culprits["held_open"]] == [(CARD_VFS[1], pid, "hypeman.service")]
    assert sorted(culprits["held_open"][0]["paths"]) == sorted(
        os.path.join(host.tree.dev_root, n) for n in host.tree.vf_nodes(CARD_VFS[1]))
    assert culprits["card_holders"] == [] and culprits["unreadable_vfs"] == []


def test_holders_of_other_cards_and_shared_nodes_do_not_block(tmp_path, capsys):
    host = Host(tmp_path)
    host.tree.add_process(comm="nvidia-smi", fds=["nvidia%d" % host.other.minor, "nvidiactl"])
    host.tree.add_process(comm="cuda-app", fds=["nvidia-uvm", "nvidiactl"])
    host.tree.add_process(comm="qemu-system-x86", fds=host.tree.vf_nodes(host.other.vfs[0]))
    result = host.run(capsys, state="disabled")
    assert result["changed"] is True
    assert result["holders"] == []
    assert host.numvfs() == 0


def test_without_the_driver_minor_any_nvidia_card_node_counts(tmp_path, capsys):
    host = Host(tmp_path)
    os.unlink(os.path.join(host.tree.proc_root, "driver", "nvidia", "gpus", CARD, "information"))
    pid = host.tree.add_process(comm="nvidia-smi", fds=["nvidia%d" % host.other.minor])
    result = host.run(capsys, state="disabled")
    assert result["failed"] is True
    assert [h["pid"] for h in result["culprits"]["card_holders"]] == [pid]


def test_a_vf_with_unreadable_state_cannot_be_proven_free(tmp_path, capsys):
    host = Host(tmp_path)
    host.tree.break_path(os.path.relpath(host.tree.pci_path(CARD_VFS[4], "nvidia", "current_vgpu_type"),
                                         host.tree.root))
    result = host.run(capsys, state="disabled", force=True)
    assert result["failed"] is True
    assert "cannot be proven free" in result["msg"]
    assert [c["vf"] for c in result["culprits"]["unreadable_vfs"]] == [CARD_VFS[4]]
    assert host.calls() == []


def test_every_culprit_is_listed_in_one_refusal(tmp_path, capsys):
    host = Host(tmp_path)
    host.tree.set_current_type(CARD_VFS[0], "NVIDIA L40S-8Q")
    host.tree.add_instance("inst-a", vf=CARD_VFS[1], liveness="stopped", set_type=False)
    host.tree.add_process(comm="qemu-system-x86", fds=host.tree.vf_nodes(CARD_VFS[2]))
    host.dcgm()
    result = host.run(capsys, state="cycled")
    assert result["failed"] is True
    for part in ("allocated VF(s)", "claimed in instance metadata", "VF(s) held open", "Cannot obtain unbindLock"):
        assert part in result["msg"]
    culprits = result["culprits"]
    assert [len(culprits[k]) for k in ("allocated", "claimed", "held_open", "card_holders")] == [1, 1, 1, 1]


# ------------------------------------------------------------------- allowlist


@pytest.mark.parametrize("state", ["enabled", "disabled", "cycled"])
def test_a_card_outside_allowed_gpus_is_refused_in_every_state(tmp_path, capsys, state):
    host = Host(tmp_path)
    before = host.fingerprint()
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, state=state, allowed_gpus=[OTHER_CARD])
        assert result["failed"] is True
        assert result["msg"] == "%s is not in allowed_gpus (%s): refusing to change SR-IOV on it" % (CARD, OTHER_CARD)
    empty = host.run(capsys, state=state, allowed_gpus=[])
    assert "empty: no card may be changed" in empty["msg"]
    assert host.calls() == [] and host.fingerprint() == before


def test_allowed_gpus_and_pci_address_are_normalised(tmp_path, capsys):
    host = Host(tmp_path)
    result = host.run(capsys, pci_address="82:00.0", state="disabled", allowed_gpus=["0000:C1:00.0", "82:00.0"])
    assert result["changed"] is True
    assert result["pci_address"] == CARD


def test_a_bad_allowed_gpus_entry_is_named(tmp_path, capsys):
    host = Host(tmp_path)
    result = host.run(capsys, state="enabled", allowed_gpus=[CARD, "gpu0"])
    assert result["failed"] is True
    assert result["msg"].startswith("allowed_gpus entry 'gpu0' is not a PCI address")


# ------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, message", [
    ({"pci_address": "card0"}, "pci_address 'card0' is not a PCI address; expected one like 0000:82:00.0"),
    ({"pci_address": "0000:83:00.0"}, "0000:83:00.0: no such PCI device under "),
    ({"pci_address": CARD_VFS[0]}, "%s is a VF of %s; pci_address must be the parent GPU" % (CARD_VFS[0], CARD)),
    ({"retries": -1}, "retries is -1; expected 0 to 100"),
    ({"delay": 0}, "delay is 0.0; expected a number of seconds more than 0"),
    ({"timeout": -2}, "timeout is -2.0; expected a number of seconds from 0 to 86400"),
])
def test_bad_input_is_named_and_nothing_runs(tmp_path, capsys, args, message):
    host = Host(tmp_path)
    before = host.fingerprint()
    result = host.run(capsys, state="cycled", **args)
    assert result["failed"] is True
    assert message in result["msg"]
    assert host.calls() == [] and host.fingerprint() == before


def test_a_device_that_is_not_nvidia_or_not_sriov_is_refused(tmp_path, capsys):
    host = Host(tmp_path)
    with open(host.tree.pci_path(CARD, "vendor"), "w") as handle:
        handle.write("0x8086\n")
    result = host.run(capsys, state="disabled")
    assert result["msg"] == "%s is not an NVIDIA device (vendor 0x8086)" % CARD
    with open(host.tree.pci_path(CARD, "vendor"), "w") as handle:
        handle.write("0x10de\n")
    os.unlink(host.tree.pci_path(CARD, "sriov_totalvfs"))
    result = host.run(capsys, state="enabled")
    assert result["msg"] == "%s is not SR-IOV capable: it has no sriov_totalvfs/sriov_numvfs" % CARD
    with open(host.tree.pci_path(CARD, "sriov_totalvfs"), "w") as handle:
        handle.write("0\n")
    result = host.run(capsys, state="enabled")
    assert result["msg"].startswith("%s reports sriov_totalvfs=0" % CARD)
    with open(host.tree.pci_path(CARD, "sriov_totalvfs"), "w") as handle:
        handle.write("lots\n")
    result = host.run(capsys, state="enabled")
    assert result["msg"].startswith("cannot read the SR-IOV state of %s:" % CARD)
    assert host.calls() == []


@pytest.mark.parametrize("name, value, message", [
    ("sriov_totalvfs", "4000000000", "reports sriov_totalvfs=4000000000: not a VF count (expected 1 to 65535)"),
    ("sriov_totalvfs", "65536", "reports sriov_totalvfs=65536: not a VF count (expected 1 to 65535)"),
    ("sriov_numvfs", "-1", "reports sriov_numvfs=-1: not a VF count (expected 0 to its sriov_totalvfs, 32)"),
    ("sriov_numvfs", "33", "reports sriov_numvfs=33: not a VF count (expected 0 to its sriov_totalvfs, 32)"),
])
@pytest.mark.parametrize("state", ["enabled", "disabled", "cycled"])
def test_a_vf_count_the_kernel_cannot_report_is_refused_before_anything_runs(
        tmp_path, capsys, name, value, message, state):
    # A huge totalvfs once built one address per VF (MemoryError, no result); a negative
    # numvfs read as "the card has VFs" and ran sriov-manage -d.
    host = Host(tmp_path, numvfs=0)
    with open(host.tree.pci_path(CARD, name), "w") as handle:
        handle.write(value + "\n")
    before = host.fingerprint()
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, state=state)
        assert result["failed"] is True and result["msg"] == "%s %s" % (CARD, message), result["msg"]
    assert host.calls() == [] and host.fingerprint() == before


def test_a_missing_sriov_manage_is_reported_even_in_check_mode(tmp_path, capsys):
    host = Host(tmp_path, numvfs=0)
    for check_mode in (True, False):
        result = host.run(capsys, check_mode=check_mode, state="enabled", sriov_manage="/nonexistent/sriov-manage")
        assert result["failed"] is True
        assert result["msg"].startswith("sriov_manage /nonexistent/sriov-manage is not an executable file")
    # ... but a no-op never needs it.
    host.run(capsys, state="enabled")
    assert host.run(capsys, state="enabled", sriov_manage="/nonexistent/sriov-manage")["changed"] is False


# ------------------------------------------------------------ sriov-manage faults


@pytest.mark.parametrize("state, flag", [("disabled", "-d"), ("cycled", "-d"), ("enabled", "-e")])
def test_cannot_obtain_unbindlock_is_reported_with_the_current_holders(tmp_path, capsys, state, flag):
    host = Host(tmp_path, numvfs=0 if state == "enabled" else None, mode="lock_busy")
    pid = host.tree.add_process(comm="nvidia-persiste", unit="nvidia-persistenced.service", fds=["nvidiactl"])
    before = host.fingerprint()
    result = host.run(capsys, state=state)
    assert result["failed"] is True
    assert result["msg"].startswith("sriov-manage %s %s: Cannot obtain unbindLock: processes hold the card's device "
                                    "nodes now: pid %d (nvidia-persiste, unit nvidia-persistenced.service) holds %s"
                                    % (flag, CARD, pid, os.path.join(host.tree.dev_root, "nvidiactl")))
    assert [h["pid"] for h in result["holders"]] == [pid]
    assert [(c["argv"][1], c["rc"]) for c in result["commands"]] == [(flag, 1)]
    assert result["commands"][0]["stderr"] == "Cannot obtain unbindLock for %s\n" % CARD
    assert host.fingerprint() == before


def test_cannot_obtain_unbindlock_without_a_holder_says_so(tmp_path, capsys):
    host = Host(tmp_path, mode="lock_busy")
    result = host.run(capsys, state="disabled")
    assert result["msg"] == ("sriov-manage -d %s: Cannot obtain unbindLock: no process holds the card's device nodes "
                             "now (the holder may have exited); run again" % CARD)
    assert result["holders"] == []


def test_enable_that_exits_0_without_vfs_fails_naming_what_is_missing(tmp_path, capsys, clock):
    host = Host(tmp_path, numvfs=0, mode="noop")
    tick = clock(host)
    result = host.run(capsys, state="enabled", retries=2, timeout=5, delay=1)
    assert result["failed"] is True
    assert result["msg"].startswith(
        "sriov-manage -e %s did not produce working VFs: after 3 run(s), waiting up to 5.0 s after each, sysfs shows "
        "sriov_numvfs is 0, expected sriov_totalvfs 32; 0 virtfn link(s), expected 32; missing VF(s): %s"
        % (CARD, ", ".join(CARD_VFS[:8])))
    assert "and 24 more" in result["msg"]
    assert "run 1: rc=0 Enabling VFs on %s" % CARD in result["msg"]
    assert result["missing"] == CARD_VFS
    assert result["attempts"] == 3 and result["changed"] is True
    assert [c["argv"][1] for c in result["commands"]] == ["-e", "-e", "-e"]
    assert host.calls() == ["-e %s" % CARD] * 3
    assert tick.now == 15


def test_cycle_whose_enable_does_nothing_fails_after_the_disable(tmp_path, capsys, clock):
    host = Host(tmp_path, mode="noop")
    clock(host)
    result = host.run(capsys, state="cycled", retries=0, timeout=2)
    assert result["failed"] is True and result["changed"] is True
    assert [(c["argv"][1], c["rc"]) for c in result["commands"]] == [("-d", 0), ("-e", 0)]
    assert result["before"] == _summary(32, CARD_VFS)
    assert result["after"] == _summary(0, [])
    assert host.numvfs() == 0


def test_slow_creation_within_the_timeout_succeeds(tmp_path, capsys, clock):
    host = Host(tmp_path, numvfs=0, mode="slow")
    tick = clock(host, due=7)
    result = host.run(capsys, state="enabled", retries=0, timeout=10, delay=1)
    assert result["changed"] is True
    assert result["attempts"] == 1
    assert result["after"] == _summary(32, CARD_VFS)
    assert tick.now == 7 and tick.sleeps == 7
    assert host.calls() == ["-e %s" % CARD, "--complete-pending"]


def test_slow_creation_past_the_timeout_fails(tmp_path, capsys, clock):
    host = Host(tmp_path, numvfs=0, mode="slow")
    tick = clock(host, due=100)
    result = host.run(capsys, state="enabled", retries=0, timeout=10, delay=3)
    assert result["failed"] is True
    assert "after 1 run(s), waiting up to 10.0 s after each" in result["msg"]
    assert tick.now == 10  # the last wait is cut to the deadline
    assert host.numvfs() == 0


def test_slow_creation_is_caught_by_a_retry(tmp_path, capsys, clock):
    host = Host(tmp_path, numvfs=0, mode="slow")
    tick = clock(host, due=15)
    result = host.run(capsys, state="enabled", retries=1, timeout=10, delay=1)
    assert result["changed"] is True
    assert result["attempts"] == 2
    assert [c["argv"][1] for c in result["commands"]] == ["-e", "-e"]
    assert tick.now == 15
    assert result["after"] == _summary(32, CARD_VFS)


def test_vfs_still_being_probed_are_waited_for(tmp_path, capsys, clock):
    host = Host(tmp_path, numvfs=0, mode="slow_probe")
    tick = clock(host, due=4)
    result = host.run(capsys, state="enabled", retries=0, timeout=10, delay=1)
    assert result["changed"] is True and result["attempts"] == 1
    assert tick.now == 4
    assert all(vf["creatable_types"] for vf in result["vfs"])


@pytest.mark.parametrize("retries, ok", [(0, False), (1, True)])
def test_the_driver_start_race_is_retried(tmp_path, capsys, clock, retries, ok):
    host = Host(tmp_path, numvfs=0, mode="flaky", flaky_runs=1)
    clock(host)
    result = host.run(capsys, state="enabled", retries=retries, timeout=3, delay=1)
    assert result.get("failed", False) is not ok
    assert result["attempts"] == retries + 1
    assert host.calls() == ["-e %s" % CARD] * (retries + 1)
    assert host.numvfs() == (32 if ok else 0)


def test_vfs_without_creatable_types_fail_verification(tmp_path, capsys, clock):
    host = Host(tmp_path, numvfs=0, mode="no_types")
    clock(host)
    result = host.run(capsys, state="enabled", retries=1, timeout=2, delay=1)
    assert result["failed"] is True
    assert "VF(s) without creatable vGPU types: %s" % ", ".join(CARD_VFS[:8]) in result["msg"]
    assert result["missing"] == []
    assert all(vf["readable"] and vf["creatable_types"] == [] for vf in result["vfs"])
    # The second run found VFs and left them alone, like the real script.
    assert result["commands"][1]["stdout"] == "GPU at %s already has VFs enabled.\n" % CARD


def test_a_nonzero_exit_with_good_sysfs_succeeds_with_a_warning(tmp_path, capsys):
    host = Host(tmp_path, mode="exit_error")
    result = host.run(capsys, state="cycled")
    assert result["changed"] is True
    assert [c["rc"] for c in result["commands"]] == [2, 2]
    assert result["warning_texts"] == [
        "%s %s %s exited 2 (Disabling VFs on %s\nsriov-manage: failed to set persistence mode on %s); the result "
        "was judged from sysfs" % (host.tool, "-d", CARD, CARD, CARD),
        "%s %s %s exited 2 (Enabling VFs on %s\nsriov-manage: failed to set persistence mode on %s); the result "
        "was judged from sysfs" % (host.tool, "-e", CARD, CARD, CARD)]


def test_a_run_that_hangs_is_killed_and_judged_from_sysfs(tmp_path, capsys, monkeypatch, clock):
    host = Host(tmp_path, numvfs=0, mode="hang", delay=60)
    monkeypatch.setattr(gpu_sriov, "COMMAND_TIMEOUT", 1)
    clock(host)
    result = host.run(capsys, state="enabled", retries=0, timeout=1)
    assert result["failed"] is True
    assert result["commands"][0]["timed_out"] is True and result["commands"][0]["rc"] is None
    assert "run 1: rc=None" in result["msg"]
    assert host.numvfs() == 0


def test_a_loud_tool_run_many_times_gives_a_bounded_result(tmp_path, capsys):
    # Each run keeps up to 1 MiB per stream; the message once quoted every run whole and the result kept
    # every run whole, so 100 retries of a loud tool made a result of about 0.85 GB.
    host = Host(tmp_path, numvfs=0, mode="noop", noise=50000)
    result = host.run(capsys, state="enabled", retries=4, delay=0.1, timeout=0.2)
    assert result["failed"] is True and result["attempts"] == 5
    runs = result["commands"]
    assert len(runs) == 5 and runs[-1]["stdout"].startswith("o" * 50000) and runs[-1]["stderr"].startswith("e" * 50000)
    for run in runs[:-1]:
        for stream, text in (("stdout", run["stdout"]), ("stderr", run["stderr"])):
            kept = text.split("\n", 1)[1]
            assert text == "[... %d earlier characters not shown]\n%s" % (len(runs[-1][stream]) - 8192, kept)
            assert len(kept) == 8192
    assert len(result["msg"]) < 5 * 2100 + 1000
    assert result["msg"].count("earlier characters not shown") == 5
