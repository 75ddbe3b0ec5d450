# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu_host verify: config, directories, modes, store, SR-IOV and hypeman after provisioning."""

from __future__ import annotations

import json

ROOT = "/srv/vgpu-sim"
CONFIG = ROOT + "/etc/hypeman/config.yaml"
GPU_DIR = ROOT + "/var/lib/hypeman/gpu"


def test_threshold_set_and_nothing_else_touched(sh):
    before = sh.file("/root/config.before").content_string.splitlines()
    after = sh.file(CONFIG).content_string.splitlines()
    changed = [(b, a) for b, a in zip(before, after) if b != a]
    assert len(before) == len(after)
    assert changed == [("  vf_quarantine_threshold: 3   # raised during incident INC-7",
                        "  vf_quarantine_threshold: 2   # raised during incident INC-7")]
    config, saved = sh.file(CONFIG), sh.file("/root/config.before")
    assert (config.user, config.group, config.mode) == (saved.user, saved.group, saved.mode)


def test_config_backup_kept(sh):
    backups = sh.check_output("ls %s/etc/hypeman" % ROOT).split()
    assert len([b for b in backups if b.startswith("config.yaml.") and b.endswith("~")]) == 1


def test_hypeman_restarted_after_the_config_changed(sh):
    assert sh.service("hypeman").is_running
    started = int(sh.check_output("systemctl show -p ActiveEnterTimestampMonotonic --value hypeman"))
    # The config's mtime on the monotonic clock: hypeman must have (re)started after it was written.
    written = float(sh.check_output(
        "python3 -c \"import os, time; print(time.clock_gettime(time.CLOCK_MONOTONIC) - time.time()"
        " + os.stat('%s').st_mtime)\"" % CONFIG))
    assert started / 1e6 > written


def test_state_dir_safe(sh):
    state = sh.file(ROOT + "/var/lib/hypeman-vgpu")
    assert state.is_directory and not state.is_symlink
    assert (state.user, state.group, state.mode) == ("root", "root", 0o750)


def test_legacy_store_repaired_with_backup(sh):
    store = json.loads(sh.file(GPU_DIR + "/vf-health.json").content_string)
    assert store["version"] == 1
    assert [(r["vf_address"], "quarantined_at" in r) for r in store["records"]] == [
        ("0000:82:00.6", True), ("0000:82:00.7", True)]
    backups = [n for n in sh.check_output("ls %s" % GPU_DIR).split()
               if n.startswith("vf-health.json.") and n.endswith("~")]
    assert len(backups) == 1
    assert json.loads(sh.file("%s/%s" % (GPU_DIR, backups[0])).content_string)[0]["wedge_count"] == 1


def test_hypeman_loaded_the_repaired_store(sh):
    token = sh.check_output("vgpu-sim token")
    resources = json.loads(sh.check_output(
        "python3 -c \"import urllib.request; r = urllib.request.Request('http://127.0.0.1:8080/resources', "
        "headers={'Authorization': 'Bearer %s'}); print(urllib.request.urlopen(r).read().decode())\"" % token))
    gpu = resources["gpu"]
    assert "placement_disabled_reason" not in gpu
    assert gpu["quarantined_slots"] == 2
    assert gpu["total_slots"] == 64


def test_sriov_enabled_on_the_allowed_card(sh):
    base = ROOT + "/sys/bus/pci/devices/0000:e3:00.0"
    assert sh.file(base + "/sriov_numvfs").content_string.strip() == "32"
    assert len([n for n in sh.check_output("ls %s" % base).split() if n.startswith("virtfn")]) == 32


def test_ledger_records_the_repair(sh):
    entries = [json.loads(line) for line in
               sh.file(ROOT + "/var/lib/hypeman-vgpu/ledger.jsonl").content_string.splitlines()]
    # Each store write is announced by a write-ahead intent (docs/vf_health.md, "Ledger and ownership").
    intents = [entry for entry in entries if entry["action"] == "intent"]
    actions = sorted((entry["action"], entry["vf_address"]) for entry in entries if entry["action"] != "intent")
    assert actions == [("repair", "0000:82:00.6"), ("repair", "0000:82:00.7")]
    assert len(intents) == 1 and not [entry for entry in entries if entry["action"] == "abort"]
