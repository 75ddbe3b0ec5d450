# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""recover_happy verify: the card recovered, checked on the host itself."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "recover_common"))

import checks  # noqa: E402


def test_card_healthy_in_sysfs_store_api_and_units(sh):
    checks.assert_healthy_end_state(sh)


def test_other_card_and_its_instances_untouched(sh):
    checks.assert_other_card_untouched(sh)


def test_sriov_cycled_exactly_once(sh):
    # check mode ran nothing; the recovery one disable and one enable; the idempotence run nothing.
    assert checks.sriov_manage_calls(sh) == ["-d %s" % checks.GPU, "-e %s" % checks.GPU]


def test_drain_waited_for_the_tenants(sh):
    entries = checks.ledger(sh)
    quarantines = [e for e in entries if e.get("action") == "quarantine" and e.get("parent_gpu") == checks.GPU
                   and e.get("trigger") == "manual"]
    clears = [e for e in entries if e.get("action") == "clear" and e.get("parent_gpu") == checks.GPU]
    assert len(quarantines) == 31  # the wedged VF was quarantined by hypeman already
    assert len(clears) == 32
    data = checks.status(sh)
    for instance in ("inst-web-c", "inst-wedged-d"):
        assert data["instances"][instance].get("stopped")
    drained_at = max(checks.rfc3339_ns(e["time"]) for e in quarantines)
    stopped_at = min(checks.rfc3339_ns(checks.metadata(sh, i)["StoppedAt"]) for i in ("inst-web-c", "inst-wedged-d"))
    assert drained_at < stopped_at


def test_one_canary_passed_on_the_recovered_card_and_left_nothing(sh):
    # The simulator's record of every instance hypeman's API created: check mode booted none, the
    # recovery one canary after the clear, the idempotence run (nothing to recover) none.
    boots = checks.status(sh)["api_boots"]
    assert len(boots) == 1, boots
    canary = boots[0]
    assert canary["name"].startswith("vgpu-canary-0000-e3-00-0-")
    assert canary["tags"] == {"hypeman.vgpu/canary": checks.GPU}
    assert canary["profile"] == checks.CANARY_PROFILE
    assert canary["vf"] in checks.card(checks.status(sh))["vfs"]
    # It booted on a recreated, healthy VF (its guest printed HYPEMAN-GPU-INIT-OK) after the clear.
    assert canary["wedged_boot"] is False
    clears = [checks.rfc3339_ns(e["time"]) for e in checks.ledger(sh)
              if e.get("action") == "clear" and e.get("parent_gpu") == checks.GPU]
    assert max(clears) < checks.rfc3339_ns(canary["created_at"]) <= checks.rfc3339_ns(canary["deleted_at"])
    # Deleted: hypeman lists only the instances there were before, and only their guest dirs remain.
    before = sorted(checks.before(sh)["instances"])
    assert sorted(item["id"] for item in checks.api_instances(sh)) == before
    assert checks.guest_dirs(sh) == before
    # It passed: nothing quarantined the card again (no record of its VFs, no canary entry in the ledger).
    assert [e for e in checks.ledger(sh) if "canary" in (e.get("reason") or "")] == []
    assert [r for r in checks.store(sh)["records"] if r["vf_address"] in checks.card(checks.status(sh))["vfs"]] == []
    assert checks.api_gpu(sh)["quarantined_slots"] == 1
