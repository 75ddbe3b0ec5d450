# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sim_smoke verify: the simulated host's state, and what the collection's modules say about it.

Ground truth comes from the simulator itself (``vgpu-sim status``: the
processes it started, the VFs it built) and from files on the host (``sh``,
podman exec); the modules are run again here through Ansible (``host``) and
compared with it.
"""

from __future__ import annotations

import json
import re

import pytest

ROOT = "/srv/vgpu-sim"
PATHS = ("data_dir=%(r)s/var/lib/hypeman sysfs_root=%(r)s/sys proc_root=/proc dev_root=%(r)s/dev "
         "state_dir=%(r)s/var/lib/hypeman-vgpu config_path=%(r)s/etc/hypeman/config.yaml" % {"r": ROOT})
OK_RE = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[guest-agent\] HYPEMAN-GPU-INIT-OK ts=\S+$")
FAILED_RE = re.compile(r'^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[guest-agent\] HYPEMAN-GPU-INIT-FAILED ts=\S+ '
                       r'nvrm="NVRM: [^"]*RmInitAdapter failed![^"]*"$')
CARD = "0000:82:00.0"


@pytest.fixture(scope="module")
def status(sh):
    return json.loads(sh.check_output("vgpu-sim status"))


@pytest.fixture(scope="module")
def token(sh):
    return sh.check_output("vgpu-sim token")


def module(host, name, args=""):
    result = host.ansible(name, ("%s %s" % (PATHS, args)).strip(), check=False)
    assert not result.get("failed"), result
    return result


def test_units_run_with_hypemans_kill_mode(sh):
    for unit in ("hypeman", "nvidia-dcgm", "nvidia-dcgm-exporter"):
        service = sh.service(unit)
        assert service.is_running and service.is_enabled
    assert sh.check_output("systemctl show -p KillMode --value hypeman") == "process"


def test_api_requires_a_token_except_health(sh):
    probe = ("python3 -c \"import urllib.request, urllib.error\n"
             "for p in ('/health', '/resources'):\n"
             "    try: print(urllib.request.urlopen('http://127.0.0.1:8080' + p).status)\n"
             "    except urllib.error.HTTPError as e: print(e.code)\"")
    assert sh.check_output(probe).split() == ["200", "401"]


def test_markers_three_copies_and_rotation(sh, status):
    rotated = sh.file("%s/var/lib/hypeman/guests/inst-ml-a/logs/app.log.1" % ROOT).content_string.splitlines()
    current = sh.file("%s/var/lib/hypeman/guests/inst-ml-a/logs/app.log" % ROOT).content_string.splitlines()
    assert len([line for line in rotated if OK_RE.match(line)]) == 3 and current == []
    wedged = sh.file("%s/var/lib/hypeman/guests/inst-wedged-d/logs/app.log" % ROOT).content_string.splitlines()
    failed = [line for line in wedged if FAILED_RE.match(line)]
    assert len(failed) == 3 and len(set(failed)) == 1
    assert status["wedged"] == ["0000:e3:00.5"] and status["instances"]["inst-wedged-d"]["wedged_boot"]


def test_placement_matches_the_simulated_host(host, sh, status, token):
    store = json.loads(sh.file("%s/var/lib/hypeman/gpu/vf-health.json" % ROOT).content_string)
    quarantined = [r["vf_address"] for r in store["records"] if r.get("quarantined_at")]
    vfs = [vf for card in status["cards"] for vf in card["vfs"]]
    running = [i["vf"] for i in status["instances"].values() if i["running"]]
    result = module(host, "hypeman.vgpu.vgpu_placement_info", "api_url=http://127.0.0.1:8080 api_token=%s" % token)
    assert result["slots"] == {"total": len(vfs), "used": len(running), "quarantined": len(quarantined),
                               "allocatable": len(set(vfs) - set(running) - set(quarantined))}
    assert result["api"]["mismatches"] == [] and result["api"]["reachable"]
    card = [g for g in result["gpus"] if g["address"] == CARD][0]
    assert card["overflow_only"] and card["quarantined"] == 1  # the hand-made quarantine on 82:00.7


def test_instances_and_liveness_match_the_vmm_processes(host, status):
    result = module(host, "hypeman.vgpu.vgpu_instance_info")
    seen = dict((i["id"], (i["vf_address"], i["pid"], i["live"])) for i in result["instances"])
    expected = dict((iid, (i["vf"], i["pid"], True)) for iid, i in status["instances"].items())
    assert seen == expected
    builds = dict((i["id"], i["claim_field"]) for i in result["instances"])
    assert builds["inst-ml-a"] == "GPUClaimedAt" and builds["inst-ml-b"] == "GPUAssignedAt"


def test_holders_are_dcgm_and_the_cards_vmms(host, sh, status):
    result = module(host, "hypeman.vgpu.gpu_holders_info", "parent_gpu=%s" % CARD)
    dcgm = set(int(sh.check_output("systemctl show -p MainPID --value %s" % u))
               for u in ("nvidia-dcgm", "nvidia-dcgm-exporter"))
    vmms = set(i["pid"] for i in status["instances"].values() if i["vf"].startswith("0000:82:"))
    assert set(h["pid"] for h in result["holders"]) == dcgm | vmms
    assert result["units"] == ["nvidia-dcgm-exporter.service", "nvidia-dcgm.service"]


def test_sentinel_finds_only_the_wedged_vf(host, status):
    result = host.ansible("hypeman.vgpu.vgpu_sentinel_scan",
                          "data_dir=%s/var/lib/hypeman state_dir=%s/var/lib/hypeman-vgpu "
                          "config_path=%s/etc/hypeman/config.yaml" % (ROOT, ROOT, ROOT), check=False)
    verdicts = dict((f["instance_id"], (f["vf_address"], f["verdict"])) for f in result["findings"])
    assert verdicts == dict((iid, (i["vf"], "failed" if i["wedged_boot"] else "ok"))
                            for iid, i in status["instances"].items())
    assert not result["changed"]


def test_sriov_manage_refuses_while_dcgm_holds_the_card(sh):
    cmd = sh.run("%s/usr/lib/nvidia/sriov-manage -d %s" % (ROOT, CARD))
    assert cmd.rc == 1 and "Cannot obtain unbindLock" in cmd.stderr
    assert sh.file("%s/sys/bus/pci/devices/%s/sriov_numvfs" % (ROOT, CARD)).content_string.strip() == "32"
