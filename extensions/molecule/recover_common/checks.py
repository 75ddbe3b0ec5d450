# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ground-truth reads of the simulated host for the recover_* verify tests.

Everything here reads the host directly (files, systemd, the simulator's own
record, hypeman's API stand-in), never through the collection, so the tests
check the roles against the host rather than against themselves.
"""

from __future__ import annotations

import calendar
import json
import time

ROOT = "/srv/vgpu-sim"
GPU = "0000:e3:00.0"
OTHER_GPU = "0000:82:00.0"
STORE = ROOT + "/var/lib/hypeman/gpu/vf-health.json"
STATE_DIR = ROOT + "/var/lib/hypeman-vgpu"
UNITS = ("hypeman", "nvidia-dcgm", "nvidia-dcgm-exporter")
# The canary recover_happy boots after the recovery (its converge sets the same).
CANARY_PROFILE = "NVIDIA L40S-1Q"

_API = ("python3 -c \"import json, sys, urllib.request\n"
        "req = urllib.request.Request('http://127.0.0.1:8080' + sys.argv[2],"
        " headers={'Authorization': 'Bearer ' + sys.argv[1]})\n"
        "print(json.dumps(json.load(urllib.request.urlopen(req, timeout=10))))\" %s %s")


def status(sh):
    return json.loads(sh.check_output("vgpu-sim status"))


def store(sh):
    return json.loads(sh.file(STORE).content_string)


def quarantined(sh):
    return sorted(r["vf_address"] for r in store(sh)["records"] if r.get("quarantined_at"))


def card(status_data, address=GPU):
    return [c for c in status_data["cards"] if c["address"] == address][0]


def sysfs_numvfs(sh, address=GPU):
    return int(sh.file("%s/sys/bus/pci/devices/%s/sriov_numvfs" % (ROOT, address)).content_string)


def creatable_counts(sh, vfs):
    """Per VF, how many vGPU types its creatable_vgpu_types lists (header skipped)."""
    counts = {}
    for vf in vfs:
        text = sh.file("%s/sys/bus/pci/devices/%s/nvidia/creatable_vgpu_types" % (ROOT, vf)).content_string
        counts[vf] = len([line for line in text.splitlines()[1:] if line.strip()])
    return counts


def _api_get(sh, path):
    return json.loads(sh.check_output(_API % (sh.check_output("vgpu-sim token"), path)))


def api_gpu(sh):
    return _api_get(sh, "/resources")["gpu"]


def api_instances(sh):
    """hypeman's ``GET /instances``: every instance the API lists."""
    return _api_get(sh, "/instances")


def guest_dirs(sh):
    """Instance directories under hypeman's data dir (one per instance hypeman knows)."""
    return sorted(sh.check_output("ls -A %s/var/lib/hypeman/guests" % ROOT).split())


def ledger(sh):
    path = STATE_DIR + "/ledger.jsonl"
    if not sh.file(path).exists:
        return []
    return [json.loads(line) for line in sh.file(path).content_string.splitlines() if line.strip()]


def sriov_manage_calls(sh):
    log = sh.file("/run/recover-test/sriov-manage.log")
    return [line.split(None, 1)[1] for line in log.content_string.splitlines()] if log.exists else []


def unit_active(sh, unit):
    return sh.check_output("systemctl show -p ActiveState --value %s" % unit) == "active"


def markers(sh):
    """Recovery state files this collection leaves only while a recovery is unfinished."""
    paths = ["%s/recovery/%s.json" % (STATE_DIR, GPU), STATE_DIR + "/dcgm-quiesce.json",
             STATE_DIR + "/store-edit/hypeman.stopped"]
    return [p for p in paths if sh.file(p).exists]


def before(sh):
    return json.loads(sh.file("/srv/recover-test-before.json").content_string)


def assert_healthy_end_state(sh):
    """The card recovered: VFs back with types, no record of it, API agrees, units up, nothing left over."""
    data = status(sh)
    vfs = card(data)["vfs"]
    assert sysfs_numvfs(sh) == card(data)["sriov_totalvfs"] == len(vfs) == 32
    assert all(count > 0 for count in creatable_counts(sh, vfs).values())
    assert data["wedged"] == []
    records = store(sh)["records"]
    assert [r["vf_address"] for r in records if r["vf_address"] in vfs] == []
    # The hand-made quarantine on the other card is not this recovery's business.
    assert quarantined(sh) == ["0000:82:00.7"]
    gpu = api_gpu(sh)
    allocated = [i["vf"] for i in data["instances"].values() if i["running"]]
    assert gpu["quarantined_slots"] == 1
    assert gpu["allocatable_slots"] == gpu["total_slots"] - len(allocated) - 1 == 64 - len(allocated) - 1
    assert "placement_disabled_reason" not in gpu
    for unit in UNITS:
        assert unit_active(sh, unit), unit
    assert markers(sh) == []


def assert_other_card_untouched(sh):
    """Instances on the other card kept running in the same VMM processes."""
    data = status(sh)
    for instance in ("inst-ml-a", "inst-ml-b"):
        now, then = data["instances"][instance], before(sh)["instances"][instance]
        assert now["running"] and now["pid"] == then["pid"], instance


def metadata(sh, instance):
    return json.loads(sh.file("%s/var/lib/hypeman/guests/%s/metadata.json" % (ROOT, instance)).content_string)


def rfc3339_ns(text):
    """UTC RFC 3339 (Go's trimmed nanoseconds) as integer nanoseconds, for ordering."""
    seconds = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    fraction = text[19:].rstrip("Z").lstrip(".")
    return seconds * 10 ** 9 + int((fraction + "000000000")[:9])
